//! Workflow runs' records against a real Redis, on one server and on a Redis
//! Cluster (issue 36): a run is created once, its entries only move forward
//! (a later attempt or an end wins whichever router writes last), it ends
//! once with its result and retention, and due runs are leased to one router.

use agent_reach_task_store::{
    Callback, EntryOrder, FirstAdvance, HeldTask, NewTask, Priority, RunEntry, RunStarted, State, StoreConfig,
    Submitted, TaskStore, TaskStoreError,
};
use agent_reach_testkit::{Redis, RedisCluster};
use serde_json::json;

/// A run's held task (workflow `order.ship_today`) under `request_id`.
fn held_task(request_id: &str) -> NewTask {
    NewTask {
        request_id: request_id.to_string(),
        caller: "tester".to_string(),
        capability: "order.ship_today".to_string(),
        envelope: json!({"capability": "order.ship_today", "payload": {}}),
        hold: true,
        ..NewTask::default()
    }
}

/// A call of run `run_id`'s steps (`order.lookup`) under `request_id`.
fn step_call(run_id: &str, request_id: &str) -> NewTask {
    NewTask {
        request_id: request_id.to_string(),
        caller: "tester".to_string(),
        capability: "order.lookup".to_string(),
        envelope: json!({"capability": "order.lookup", "payload": {}}),
        run: Some(run_id.to_string()),
        ..NewTask::default()
    }
}

/// An entry of a run to write: `field` at `order`, its record `json`.
fn run_entry(field: &str, order: EntryOrder, json: &str) -> RunEntry {
    RunEntry {
        field: field.to_string(),
        order,
        json: json.to_string(),
    }
}

async fn a_run(store: &TaskStore, request_id: &str) -> String {
    let submitted = store.submit(held_task(request_id)).await.unwrap();
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

    // One write of several entries: each by its own order, a field given
    // twice seeing the first as stored, and hundreds at once (an advance of
    // a wide fan-out).
    let mut many = vec![
        run_entry("i:a:0", at(1, 1), r#"{"s":"failed"}"#),
        run_entry("i:d:0", at(1, 1), r#"{"s":"succeeded"}"#),
        run_entry("i:d:0", at(1, 0), r#"{"s":"started"}"#),
        run_entry("i:e:0", at(1, 0), r#"{"s":"started"}"#),
        run_entry("i:e:0", at(1, 1), r#"{"s":"failed"}"#),
    ];
    many.extend((0..600).map(|item| run_entry(&format!("i:f:{item}"), at(1, 0), &format!(r#"{{"item":{item}}}"#))));
    assert_eq!(
        store.put_run_entries(&run_id, &many, None).await.unwrap(),
        3 + 600,
        "the one behind the stored entry and the one behind the given one are not written"
    );
    let stored = store.run(&run_id).await.unwrap();
    let entry_of = |name: &str| stored.entries.get(name).map(String::as_str);
    assert_eq!(
        [
            entry_of("i:a:0"),
            entry_of("i:d:0"),
            entry_of("i:e:0"),
            entry_of("i:f:599")
        ],
        [
            Some(r#"{"s":"retried"}"#),
            Some(r#"{"s":"succeeded"}"#),
            Some(r#"{"s":"failed"}"#),
            Some(r#"{"item":599}"#)
        ]
    );
    assert_eq!(stored.entries.len(), 3 + 600);

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
    let ended = store
        .move_run_with(
            &run_id,
            State::Succeeded,
            &[State::Pending, State::Running],
            Some(r#"{"output":1}"#),
            &[
                run_entry("i:b:0", at(1, 1), r#"{"s":"succeeded"}"#),
                run_entry("i:a:0", at(1, 1), r#"{"s":"failed"}"#),
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
                run_entry("i:c:0", at(1, 1), r#"{"s":"canceled"}"#),
                run_entry("i:b:0", at(1, 0), r#"{"s":"started"}"#),
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
                &[run_entry("x", at(1, 0), "{}")]
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

/// A run's start, first advance and end, each one script with its held task
/// (docs/design.md §3.14.4): the same outcome as the scripts one by one.
async fn the_combined_scripts(store: TaskStore, cluster: bool) {
    let held_task = |request_id: &str| NewTask {
        callback: Some(Callback {
            url: "http://127.0.0.1:9/hook".to_string(),
            secret_ref: None,
            a2a: None,
        }),
        ..held_task(request_id)
    };
    // Started: the held task and the run, once; the same request id finds both.
    let (submitted, created) = store
        .submit_run(held_task("start-1"), r#"{"n":1}"#, 60_000)
        .await
        .unwrap();
    assert!(matches!(submitted, Submitted::Created(_)) && created);
    let run_id = submitted.task_id().to_string();
    let (again, created) = store
        .submit_run(held_task("start-1"), r#"{"n":2}"#, 60_000)
        .await
        .unwrap();
    assert_eq!((again, created), (Submitted::Existing(run_id.clone()), false));
    assert_eq!(store.get(&run_id).await.unwrap().state, State::Pending);
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!((stored.state, stored.spec.as_str()), (State::Pending, r#"{"n":1}"#));
    assert_eq!(store.recent_runs(10).await.unwrap(), std::slice::from_ref(&run_id));

    // The first advance: both running, its entries written, due later.
    let at = |attempt, rank| EntryOrder { attempt, rank };
    store
        .start_running(
            &run_id,
            &[run_entry("s:a", at(0, 0), r#"{"s":"started"}"#)],
            u64::MAX / 2,
        )
        .await
        .unwrap();
    // Again (another router's): no error, nothing moved back.
    store
        .start_running(&run_id, &[run_entry("s:a", at(0, 0), r#"{"s":"again"}"#)], u64::MAX / 2)
        .await
        .unwrap();
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!(stored.state, State::Running);
    assert_eq!(stored.entries.get("s:a").map(String::as_str), Some(r#"{"s":"again"}"#));
    let task = store.get(&run_id).await.unwrap();
    assert_eq!((task.state, task.attempts), (State::Running, 1));
    assert!(matches!(
        store.start_running("t_0000000000000000000000ff", &[], 0).await,
        Err(TaskStoreError::NotFound(_))
    ));

    // An advance: its calls submitted and what it decided written, one
    // script on one server; on a cluster (the calls in other slots) it is
    // left to the long way, nothing written.
    let call = |request_id: &str| step_call(&run_id, request_id);
    let first_call = store.task_id_for("order.lookup");
    let done = store
        .advance_run(
            &run_id,
            &[(call("call-1"), first_call.clone())],
            &[run_entry("i:b:0", at(1, 0), r#"{"s":"submitted"}"#)],
            u64::MAX / 2,
            false,
        )
        .await
        .unwrap();
    let written = |stored: &agent_reach_task_store::StoredRun, field: &str| stored.entries.contains_key(field);
    assert_eq!(done, !cluster);
    assert_eq!(written(&store.run(&run_id).await.unwrap(), "i:b:0"), !cluster);
    if !cluster {
        let task = store.get(&first_call).await.unwrap();
        assert_eq!(
            (task.state, task.run.as_deref()),
            (State::Pending, Some(run_id.as_str()))
        );
        // The same call under another id (a plan made twice): its request id
        // names the first task, so nothing of the run is written.
        let second = store.task_id_for("order.lookup");
        let done = store
            .advance_run(
                &run_id,
                &[(call("call-1"), second.clone())],
                &[run_entry("i:c:0", at(1, 0), r#"{"s":"submitted"}"#)],
                u64::MAX / 2,
                false,
            )
            .await
            .unwrap();
        assert!(!done);
        assert!(!written(&store.run(&run_id).await.unwrap(), "i:c:0"));
        assert!(matches!(store.get(&second).await, Err(TaskStoreError::NotFound(_))));
    }
    assert!(matches!(
        store
            .advance_run("t_0000000000000000000000ff", &[], &[], 0, false)
            .await,
        Err(TaskStoreError::NotFound(_))
    ));

    // The end: the run with its last entries, then its held task, without reading it.
    let held = HeldTask {
        caller: "tester",
        request_id: "start-1",
        session_id: None,
        capability: "order.ship_today",
        priority: Priority::Normal,
        has_callback: true,
    };
    let envelope = json!({"status": "succeeded", "output": 1});
    let (moved, held_ended) = store
        .end_run(
            &run_id,
            (State::Succeeded, &[State::Pending, State::Running]),
            r#"{"output":1}"#,
            &[run_entry("i:a:0", at(1, 1), r#"{"s":"succeeded"}"#)],
            (&held, &envelope),
        )
        .await
        .unwrap();
    assert_eq!((moved, held_ended.unwrap()), (State::Running, State::Running));
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!(
        (
            stored.state,
            stored.result.as_deref(),
            stored.entries.get("i:a:0").map(String::as_str)
        ),
        (State::Succeeded, Some(r#"{"output":1}"#), Some(r#"{"s":"succeeded"}"#))
    );
    let task = store.get(&run_id).await.unwrap();
    assert_eq!((task.state, task.result), (State::Succeeded, Some(envelope.clone())));
    // Its callback scheduled with the end, as any task's (the spec said it has one).
    let due = store.claim_due_callbacks(u64::MAX / 2, 100).await.unwrap();
    assert!(
        due.iter()
            .any(|member| agent_reach_task_store::store::schedule_member(member).0 == run_id),
        "{due:?}"
    );
    // One end: the run's second is refused and leaves the held task be.
    let refused = store
        .end_run(
            &run_id,
            (State::Failed, &[State::Pending, State::Running]),
            "{}",
            &[],
            (&held, &json!({"status": "failed"})),
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, TaskStoreError::Refused { ref current, .. } if current == "succeeded"));
    assert_eq!(store.get(&run_id).await.unwrap().result, Some(envelope));

    // A run whose held task's move to running was lost: the run ends, the
    // task's end is refused (pending), for the caller to move it first.
    let (submitted, _) = store.submit_run(held_task("start-2"), "{}", 60_000).await.unwrap();
    let lost = submitted.task_id().to_string();
    let (moved, held_ended) = store
        .end_run(
            &lost,
            (State::Failed, &[State::Pending, State::Running]),
            "{}",
            &[],
            (
                &HeldTask {
                    request_id: "start-2",
                    ..held
                },
                &json!({"status": "failed"}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(moved, State::Pending);
    assert!(matches!(held_ended, Err(TaskStoreError::Refused { ref current, .. }) if current == "pending"));
    assert_eq!(store.run(&lost).await.unwrap().state, State::Failed);
}

/// A step's end carried by the advance it starts (`advance_run_after_step`,
/// `end_run_after_step`): on one server its `FINISH` is the script's first
/// part, and a step that ended elsewhere stops the script before anything of
/// the run is written; on a cluster the step ends on its own first, with the
/// same answers.
async fn a_steps_end_carried_by_its_runs_advance(store: TaskStore, cluster: bool) {
    assert_eq!(store.folds_steps(), !cluster);
    let held = HeldTask {
        caller: "tester",
        request_id: "start-step",
        session_id: None,
        capability: "order.ship_today",
        priority: Priority::Normal,
        has_callback: false,
    };
    let (submitted, _) = store.submit_run(held_task("start-step"), "{}", 60_000).await.unwrap();
    let run_id = submitted.task_id().to_string();
    store.start_running(&run_id, &[], u64::MAX / 2).await.unwrap();
    let order = |attempt, rank| EntryOrder { attempt, rank };
    let entry = |field: &str, json: &str| run_entry(field, order(1, 1), json);
    // Three steps of the run, submitted, claimed and running.
    for request_id in ["step-a", "step-b", "step-c"] {
        store.submit(step_call(&run_id, request_id)).await.unwrap();
    }
    let mut claimed = Vec::new();
    while claimed.len() < 3 {
        claimed.extend(store.claim("worker-steps", 10, 0).await.unwrap());
    }
    claimed.sort_by(|a, b| a.task.request_id.cmp(&b.task.request_id));
    for step in &claimed {
        store.transition(&step.task.task_id, State::Running).await.unwrap();
    }
    let result = json!({"status": "succeeded", "output": {"ok": true}});
    let step = |index: usize| agent_reach_task_store::StepEnd {
        claimed: &claimed[index],
        state: State::Succeeded,
        result: &result,
    };

    // The first step's end and the advance it starts.
    let after = store
        .advance_run_after_step(
            &run_id,
            (&[], &[entry("i:a:0", r#"{"s":"succeeded"}"#)]),
            (u64::MAX / 2, false),
            step(0),
        )
        .await
        .unwrap();
    assert_eq!(after.step.unwrap(), State::Running);
    assert!(after.run.unwrap());
    let ended = store.get(&claimed[0].task.task_id).await.unwrap();
    assert_eq!((ended.state, ended.result), (State::Succeeded, Some(result.clone())));
    assert!(store.run(&run_id).await.unwrap().entries.contains_key("i:a:0"));

    // A step that ended elsewhere (canceled): its end refused, and nothing
    // of the run written.
    store.cancel(&claimed[1].task.task_id, &json!(null)).await.unwrap();
    let after = store
        .advance_run_after_step(
            &run_id,
            (&[], &[entry("i:b:0", r#"{"s":"succeeded"}"#)]),
            (u64::MAX / 2, false),
            step(1),
        )
        .await
        .unwrap();
    assert!(matches!(after.step, Err(TaskStoreError::Refused { ref current, .. }) if current == "canceled"));
    assert!(!after.run.unwrap());
    assert!(!store.run(&run_id).await.unwrap().entries.contains_key("i:b:0"));
    assert_eq!(
        store.get(&claimed[1].task.task_id).await.unwrap().state,
        State::Canceled
    );

    // The last step's end and the run's end, with its held task's.
    let envelope = json!({"status": "succeeded", "output": 3});
    let after = store
        .end_run_after_step(
            &run_id,
            (State::Succeeded, &[State::Pending, State::Running]),
            (r#"{"output":3}"#, &[entry("i:c:0", r#"{"s":"succeeded"}"#)]),
            (&held, &envelope),
            step(2),
        )
        .await
        .unwrap();
    assert_eq!(after.step.unwrap(), State::Running);
    let (moved, held_ended) = after.run.unwrap();
    assert_eq!((moved, held_ended.unwrap()), (State::Running, State::Running));
    assert_eq!(
        store.get(&claimed[2].task.task_id).await.unwrap().state,
        State::Succeeded
    );
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!(stored.state, State::Succeeded);
    assert!(stored.entries.contains_key("i:c:0"));
    assert_eq!(store.get(&run_id).await.unwrap().result, Some(envelope));
    // Ended once: a repeat of that step's end with the run ends nothing more.
    let again = store
        .end_run_after_step(
            &run_id,
            (State::Failed, &[State::Pending, State::Running]),
            ("{}", &[]),
            (&held, &json!({"status": "failed"})),
            agent_reach_task_store::StepEnd {
                claimed: &claimed[2],
                state: State::Failed,
                result: &json!({"status": "failed"}),
            },
        )
        .await
        .unwrap();
    assert!(matches!(again.step, Err(TaskStoreError::Refused { .. })));
    assert!(again.run.is_err());
    assert_eq!(store.run(&run_id).await.unwrap().state, State::Succeeded);
}

/// A run's first advance written in the script that starts it (one server,
/// docs/design.md §3.14.4): its calls submitted and queued, its entries
/// written, the run and its held task `running`; a repeat advances nothing;
/// a call whose request id names another task stops the advance, the run
/// left `pending` for its router to advance; a cluster never folds it.
async fn a_runs_first_advance_written_with_its_start(store: TaskStore, cluster: bool) {
    let entry = |field: &str, attempt, json: String| run_entry(field, EntryOrder { attempt, rank: 0 }, &json);
    let planned = |run_id: &str, request_id: &str| {
        let call_id = store.task_id_for("order.lookup");
        let entries = vec![
            entry("s:a", 0, r#"{"s":"started"}"#.to_string()),
            entry("i:a:0", 1, format!(r#"{{"task":"{call_id}"}}"#)),
        ];
        (vec![(step_call(run_id, request_id), call_id)], entries)
    };

    let run_id = store.task_id_for("order.ship_today");
    let first = planned(&run_id, "first-call");
    let started = start_planned(&store, held_task("first-1"), &run_id, &first).await;
    assert_eq!(started, run_started(Submitted::Created(run_id.clone()), true, !cluster));
    let stored = store.run(&run_id).await.unwrap();
    let call_id = &first.0[0].1;
    if cluster {
        // Left for the router to advance: nothing of the advance written.
        assert_eq!(stored.state, State::Pending);
        assert!(stored.entries.is_empty());
        assert_eq!(store.get(&run_id).await.unwrap().state, State::Pending);
        assert!(matches!(store.get(call_id).await, Err(TaskStoreError::NotFound(_))));
        return;
    }
    assert_eq!(stored.state, State::Running);
    assert_eq!(
        stored.entries.get("i:a:0").map(String::as_str),
        Some(format!(r#"{{"task":"{call_id}"}}"#).as_str())
    );
    assert_eq!(
        stored.entries.get("s:a").map(String::as_str),
        Some(r#"{"s":"started"}"#)
    );
    let task = store.get(&run_id).await.unwrap();
    assert_eq!((task.state, task.attempts), (State::Running, 1));
    // The call is queued: a worker claims it.
    let claimed = store.claim("worker", 10, 1).await.unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|claimed| claimed.task.task_id.as_str())
            .collect::<Vec<_>>(),
        [call_id.as_str()]
    );
    assert_eq!(claimed[0].task.run.as_deref(), Some(run_id.as_str()));

    // The same request id again: the run found, no advance planned for
    // another id written.
    let other = store.task_id_for("order.ship_today");
    let again = planned(&other, "first-call-again");
    let started = start_planned(&store, held_task("first-1"), &other, &again).await;
    assert_eq!(started, run_started(Submitted::Existing(run_id.clone()), false, false));
    assert!(matches!(
        store.get(&again.0[0].1).await,
        Err(TaskStoreError::NotFound(_))
    ));
    assert!(matches!(store.run(&other).await, Err(TaskStoreError::NotFound(_))));

    // A call whose request id names another task: the advance stops, the
    // run is created and left pending.
    let taken = store.submit(step_call("t_elsewhere", "taken")).await.unwrap();
    let run_id = store.task_id_for("order.ship_today");
    let stopped = planned(&run_id, "taken");
    let started = start_planned(&store, held_task("first-2"), &run_id, &stopped).await;
    assert_eq!(started, run_started(Submitted::Created(run_id.clone()), true, false));
    let stored = store.run(&run_id).await.unwrap();
    assert_eq!((stored.state, stored.entries.len()), (State::Pending, 0));
    assert_eq!(store.get(&run_id).await.unwrap().state, State::Pending);
    assert!(matches!(
        store.get(&stopped.0[0].1).await,
        Err(TaskStoreError::NotFound(_))
    ));
    assert_ne!(taken.task_id(), &stopped.0[0].1);
}

/// A first advance's calls and entries, as the engine plans them.
type Planned = (Vec<(NewTask, String)>, Vec<RunEntry>);

/// [`TaskStore::start_run`] of `held` as `run_id` with `planned` as its first advance.
async fn start_planned(store: &TaskStore, held: NewTask, run_id: &str, (calls, entries): &Planned) -> RunStarted {
    let first = FirstAdvance {
        calls,
        entries,
        due_at_ms: u64::MAX / 2,
    };
    store
        .start_run(held, run_id, ("{}", 60_000), Some(first))
        .await
        .unwrap()
}

fn run_started(submitted: Submitted, created: bool, advanced: bool) -> RunStarted {
    RunStarted {
        submitted,
        created,
        advanced,
    }
}

#[tokio::test]
async fn on_redis() {
    let redis = Redis::start();
    the_contract(TaskStore::new(&redis.url(), &StoreConfig::default()).unwrap()).await;
    let other = StoreConfig {
        tenant: "combined".to_string(),
        ..StoreConfig::default()
    };
    the_combined_scripts(TaskStore::new(&redis.url(), &other).unwrap(), false).await;
    let steps = StoreConfig {
        tenant: "steps".to_string(),
        ..StoreConfig::default()
    };
    a_steps_end_carried_by_its_runs_advance(TaskStore::new(&redis.url(), &steps).unwrap(), false).await;
    let first = StoreConfig {
        tenant: "first".to_string(),
        ..StoreConfig::default()
    };
    a_runs_first_advance_written_with_its_start(TaskStore::new(&redis.url(), &first).unwrap(), false).await;
}

#[tokio::test]
async fn on_cluster() {
    let cluster = RedisCluster::start();
    let url = format!("redis+cluster://127.0.0.1:{}", cluster.ports()[0]);
    let store = TaskStore::new(&url, &StoreConfig::default()).unwrap();
    the_contract(store).await;
    let other = StoreConfig {
        tenant: "combined".to_string(),
        ..StoreConfig::default()
    };
    the_combined_scripts(TaskStore::new(&url, &other).unwrap(), true).await;
    let steps = StoreConfig {
        tenant: "steps".to_string(),
        ..StoreConfig::default()
    };
    a_steps_end_carried_by_its_runs_advance(TaskStore::new(&url, &steps).unwrap(), true).await;
    let first = StoreConfig {
        tenant: "first".to_string(),
        ..StoreConfig::default()
    };
    a_runs_first_advance_written_with_its_start(TaskStore::new(&url, &first).unwrap(), true).await;
}
