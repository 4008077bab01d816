//! The engine on a real Redis, without a router (docs/design.md §3.14.4),
//! on one thread: the store is read as soon as a call returns, before
//! anything it spawned has run.
//!
//! - On one server a run's first advance is written by the script that
//!   starts it.
//! - A step's end handed to its run (`Engine::end_step`, as the worker
//!   hands it) takes the run's advancing slot; a hand-over dropped before
//!   it ran gives the slot back; one that runs ends the step and starts the
//!   next.

use std::sync::{Arc, Weak};
use std::time::Duration;

use agent_reach_access::Caller;
use agent_reach_proto::Priority;
use agent_reach_runs::{Engine, RunSettings, Start, Started};
use agent_reach_task_store::{CallbackConfig, State, StoreConfig};
use agent_reach_tasks::{TaskService, TasksSettings};
use agent_reach_workflows::Workflow;
use serde_json::{json, Value};

/// An engine on `redis` (no router: its runs' steps are claimed by hand).
fn engine_on(redis: &agent_reach_testkit::Redis) -> Arc<Engine> {
    let registry = prometheus::Registry::new();
    let settings = TasksSettings {
        redis: redis.url(),
        store: StoreConfig::default(),
        callbacks: CallbackConfig::new(b"engine-test-secret".to_vec()),
        workers: 1,
        reclaim_after: Duration::from_secs(30),
        max_task_attempts: 3,
        tag_limits: Vec::new(),
        quota_share: None,
        trail: None,
    };
    let tasks = Arc::new(TaskService::new(&settings, &registry).unwrap());
    assert!(tasks.store().folds_steps());
    Engine::new(tasks, Weak::new(), RunSettings::default(), &registry).unwrap()
}

/// `test.flow`: step `a` (`x.a`), then step `b` (`x.b`).
fn two_steps() -> Arc<Workflow> {
    Arc::new(
        Workflow::from_stored(
            "test.flow",
            json!({
                "version": "1.0.0", "input_schema": {"type": "object"},
                "steps": [
                    {"id": "a", "capability": "x.a", "input": {"q": "${input.q}"}},
                    {"id": "b", "capability": "x.b", "input": {"n": "${steps.a.output.n}"}}
                ],
                "output": {"b": "${steps.b.output}"}
            }),
        )
        .unwrap(),
    )
}

async fn start(engine: &Arc<Engine>, request_id: &str) -> Started {
    engine
        .start(Start {
            workflow: &two_steps(),
            caller: &Caller::agent("tester"),
            input: json!({"q": "go"}),
            request_id: request_id.to_string(),
            session_id: None,
            context_id: None,
            priority: Priority::Normal,
            callback: None,
            trace_id: None,
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_runs_first_advance_is_written_by_its_start() {
    let redis = agent_reach_testkit::Redis::start();
    let engine = engine_on(&redis);
    let started = start(&engine, "run-1").await;
    // The run as accepted (the 202's `pending`), though already advanced.
    assert_eq!((started.state, started.duplicate), (State::Pending, false));

    let store = engine.store();
    let stored = store.run(&started.run_id).await.unwrap();
    assert_eq!(stored.state, State::Running);
    assert_eq!(store.get(&started.run_id).await.unwrap().state, State::Running);
    let call: Value = serde_json::from_str(&stored.entries["i:a:0"]).unwrap();
    let task = store.get(call["task_id"].as_str().unwrap()).await.unwrap();
    assert_eq!(
        (task.state, task.capability.as_str(), task.run.as_deref()),
        (State::Pending, "x.a", Some(started.run_id.as_str()))
    );
    assert_eq!(task.envelope["payload"], json!({"q": "go"}));
    assert!(!stored.entries.contains_key("i:b:0"), "step b waits for a");
}

#[tokio::test(flavor = "current_thread")]
async fn a_steps_end_handed_to_its_run() {
    let redis = agent_reach_testkit::Redis::start();
    let engine = engine_on(&redis);
    let started = start(&engine, "run-2").await;
    let store = engine.store();
    // Step a's call, claimed and running as a worker's delivery has it.
    let claimed = store.claim("worker", 10, 1).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let claimed = &claimed[0];
    assert_eq!(claimed.task.run.as_deref(), Some(started.run_id.as_str()));
    store.transition(&claimed.task.task_id, State::Running).await.unwrap();
    let result = json!({
        "version": "1.0", "request_id": claimed.task.request_id, "status": "succeeded", "output": {"n": 7},
    });

    // Handed over, then dropped before it ran: the run's slot is given
    // back (a hand-over that kept it would leave every later end of the
    // run's steps to the worker alone: `None`).
    let dropped = engine.end_step(claimed, State::Succeeded, &result);
    assert!(dropped.is_some());
    assert!(
        engine.end_step(claimed, State::Succeeded, &result).is_none(),
        "the slot is taken while a hand-over holds it"
    );
    drop(dropped);
    let handed = engine
        .end_step(claimed, State::Succeeded, &result)
        .expect("the dropped hand-over gave the slot back");

    // Run: the step ends (from `running`, as the store's FINISH answers)
    // and step b's call is queued.
    assert_eq!(handed.await.unwrap(), State::Running);
    assert_eq!(store.get(&claimed.task.task_id).await.unwrap().state, State::Succeeded);
    let stored = store.run(&started.run_id).await.unwrap();
    let b: Value = serde_json::from_str(&stored.entries["i:b:0"]).unwrap();
    let task = store.get(b["task_id"].as_str().unwrap()).await.unwrap();
    assert_eq!(
        (task.state, task.capability.as_str(), &task.envelope["payload"]),
        (State::Pending, "x.b", &json!({"n": 7}))
    );
}
