//! The engine on a real Redis, without a router (docs/design.md §3.14.4):
//! on one server a run's first advance is written by the script that starts
//! it. The test runs on one thread and looks at the store as soon as
//! `Engine::start` returns, before anything it spawned has run: what the
//! store holds then is what the start's own script wrote.

use std::sync::{Arc, Weak};
use std::time::Duration;

use agent_reach_access::Caller;
use agent_reach_proto::Priority;
use agent_reach_runs::{Engine, RunSettings, Start};
use agent_reach_task_store::{CallbackConfig, State, StoreConfig};
use agent_reach_tasks::{TaskService, TasksSettings};
use agent_reach_workflows::Workflow;
use serde_json::{json, Value};

#[tokio::test(flavor = "current_thread")]
async fn a_runs_first_advance_is_written_by_its_start() {
    let redis = agent_reach_testkit::Redis::start();
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
    let engine = Engine::new(tasks, Weak::new(), RunSettings::default(), &registry).unwrap();
    let workflow = Arc::new(
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
    );
    let caller = Caller::agent("tester");
    let started = engine
        .start(Start {
            workflow: &workflow,
            caller: &caller,
            input: json!({"q": "go"}),
            request_id: "run-1".to_string(),
            session_id: None,
            context_id: None,
            priority: Priority::Normal,
            callback: None,
            trace_id: None,
        })
        .await
        .unwrap();
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
