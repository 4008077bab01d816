//! Workflow runs' records against a real Redis, on one server and on a Redis
//! Cluster (issue 36): a run is created once, its entries only move forward
//! (a later attempt or an end wins whichever router writes last), it ends
//! once with its result and retention, and due runs are leased to one router.

use agent_reach_task_store::{EntryOrder, NewTask, RunEntry, State, StoreConfig, TaskStore, TaskStoreError};
use agent_reach_testkit::{Redis, RedisCluster};
use serde_json::json;

async fn a_run(store: &TaskStore, request_id: &str) -> String {
    let submitted = store
        .submit(NewTask {
            request_id: request_id.to_string(),
            caller: "tester".to_string(),
            capability: "order.ship_today".to_string(),
            envelope: json!({"capability": "order.ship_today", "payload": {}}),
            hold: true,
            ..NewTask::default()
        })
        .await
        .unwrap();
    submitted.task_id().to_string()
}

async fn the_contract(store: TaskStore) {
    let run_id = a_run(&store, "run-1").await;
    assert!(store
        .create_run(&run_id, r#"{"workflow":"order.ship_today"}"#, 60_000)
        .await
        .unwrap());
    assert!(
        !store.create_run(&run_id, r#"{"other":true}"#, 60_000).await.unwrap(),
        "a run is created once"
    );
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!(
        (stored.state, stored.spec.as_str()),
        (State::Pending, r#"{"workflow":"order.ship_today"}"#)
    );

    // Entries move forward only: an end beats a start, a later attempt beats both.
    let at = |attempt, rank| EntryOrder { attempt, rank };
    assert!(store
        .put_run_entry(&run_id, "i:a:0", at(1, 0), r#"{"s":"started"}"#)
        .await
        .unwrap());
    assert!(store
        .put_run_entry(&run_id, "i:a:0", at(1, 1), r#"{"s":"failed"}"#)
        .await
        .unwrap());
    assert!(!store
        .put_run_entry(&run_id, "i:a:0", at(1, 0), r#"{"s":"started"}"#)
        .await
        .unwrap());
    assert!(
        store
            .put_run_entry(&run_id, "i:a:0", at(1, 1), r#"{"s":"failed"}"#)
            .await
            .unwrap(),
        "the same again"
    );
    assert!(store
        .put_run_entry(&run_id, "i:a:0", at(2, 0), r#"{"s":"retried"}"#)
        .await
        .unwrap());
    assert!(!store
        .put_run_entry(&run_id, "i:a:0", at(1, 1), r#"{"s":"failed"}"#)
        .await
        .unwrap());
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!(
        stored.entries.get("i:a:0").map(String::as_str),
        Some(r#"{"s":"retried"}"#)
    );

    // Due now (grace 0), leased to one router at a time.
    let due_now = a_run(&store, "run-2").await;
    assert!(store.create_run(&due_now, "{}", 0).await.unwrap());
    let leased = store.lease_due_runs(30_000, 100).await.unwrap();
    assert_eq!(leased, std::slice::from_ref(&due_now));
    assert!(
        store.lease_due_runs(30_000, 100).await.unwrap().is_empty(),
        "leased away"
    );
    store.schedule_run(&due_now, 0).await.unwrap();
    assert_eq!(
        store.lease_due_runs(30_000, 100).await.unwrap(),
        std::slice::from_ref(&due_now)
    );

    // Running, then ended once: its result kept, its due entry gone.
    assert_eq!(
        store
            .move_run(&run_id, State::Running, &[State::Pending], None)
            .await
            .unwrap(),
        State::Pending
    );
    // The end writes the last outcomes with it, by the entries' order.
    let entry = |field: &str, order, json: &str| RunEntry {
        field: field.to_string(),
        order,
        json: json.to_string(),
    };
    let ended = store
        .move_run_with(
            &run_id,
            State::Succeeded,
            &[State::Pending, State::Running],
            Some(r#"{"output":1}"#),
            &[
                entry("i:b:0", at(1, 1), r#"{"s":"succeeded"}"#),
                entry("i:a:0", at(1, 1), r#"{"s":"failed"}"#),
            ],
        )
        .await
        .unwrap();
    assert_eq!(ended, State::Running);
    // A refused move (one end) still records a step's outcome, never an earlier one.
    let refused = store
        .move_run_with(
            &run_id,
            State::Canceled,
            &[State::Pending, State::Running],
            None,
            &[
                entry("i:c:0", at(1, 1), r#"{"s":"canceled"}"#),
                entry("i:b:0", at(1, 0), r#"{"s":"started"}"#),
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, TaskStoreError::Refused { ref current, .. } if current == "succeeded"),
        "{refused:?}"
    );
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!(
        (stored.state, stored.result.as_deref()),
        (State::Succeeded, Some(r#"{"output":1}"#))
    );
    let entries = |names: &[&str]| {
        names
            .iter()
            .map(|name| stored.entries.get(*name).map(String::as_str))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        entries(&["i:a:0", "i:b:0", "i:c:0"]),
        [
            Some(r#"{"s":"retried"}"#),
            Some(r#"{"s":"succeeded"}"#),
            Some(r#"{"s":"canceled"}"#)
        ]
    );
    assert!(matches!(
        store
            .move_run_with(
                "t_0000000000000000000000ff",
                State::Running,
                &[State::Pending],
                None,
                &[entry("x", at(1, 0), "{}")]
            )
            .await,
        Err(TaskStoreError::NotFound(_))
    ));
    store.schedule_run(&run_id, 0).await.unwrap();
    assert!(
        !store.lease_due_runs(30_000, 100).await.unwrap().contains(&run_id),
        "an ended run is never due again"
    );

    // The newest first; an unknown run is NotFound.
    let recent = store.recent_runs(10).await.unwrap();
    assert_eq!(recent.len(), 2);
    assert!(matches!(
        store.run("t_0000000000000000000000ff").await,
        Err(TaskStoreError::NotFound(_))
    ));
    assert!(matches!(
        store
            .put_run_entry("t_0000000000000000000000ff", "x", at(1, 0), "{}")
            .await,
        Err(TaskStoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn on_redis() {
    let redis = Redis::start();
    the_contract(TaskStore::new(&redis.url(), &StoreConfig::default()).unwrap()).await;
}

#[tokio::test]
async fn on_cluster() {
    let cluster = RedisCluster::start();
    let url = format!("redis+cluster://127.0.0.1:{}", cluster.ports()[0]);
    let store = TaskStore::new(&url, &StoreConfig::default()).unwrap();
    the_contract(store).await;
}
