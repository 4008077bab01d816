//! Multi-turn tasks and A2A push configs in the task store, against a real
//! Redis (one server, `on_redis::`) and a Redis Cluster (`on_cluster::`): a
//! task that asks for input waits (its entry acknowledged, on the retention
//! clock), a message continues it (queued again, kept), and each of a
//! task's push configs is notified on its own when the task ends or asks;
//! a preempted (`paused`) task is not one waiting for input.

use std::time::{Duration, Instant};

use agent_reach_task_store::{
    Callback, CallbackOutcome, Deliverer, NewTask, Priority, PushConfig, Role, State, Submitted, TaskStore,
    TaskStoreError, Turn, MOST_PUSH_CONFIGS,
};
use serde_json::{json, Value};

use crate::support;
use support::{deliverer, receiver, task, task_key, Backend};

fn push(id: &str, url: &str) -> Callback {
    Callback {
        url: url.to_string(),
        secret_ref: None,
        a2a: Some(PushConfig {
            id: id.to_string(),
            token: Some(format!("token-{id}")),
            authentication: None,
        }),
    }
}

/// Claims the one entry queued, moves its task to running.
async fn claim_one(store: &TaskStore) -> agent_reach_task_store::Claimed {
    let mut claimed = store.claim("worker", 10, 0).await.unwrap();
    assert_eq!(claimed.len(), 1, "one queue entry");
    let claimed = claimed.remove(0);
    store.transition(&claimed.task.task_id, State::Running).await.unwrap();
    claimed
}

async fn a_task_asking_for_input_waits_and_a_message_continues_it(backend: Backend) {
    let store = backend.store();
    store.prepare().await.unwrap();
    let task_id = store
        .submit(task("turns-1", Priority::Normal, Some("s-turns")))
        .await
        .unwrap()
        .task_id()
        .to_string();
    let claimed = claim_one(&store).await;
    let question = Turn::agent("q-1", "Which size?");
    assert_eq!(store.ask_for_input(&claimed, &question).await.unwrap(), State::Running);
    // Run again (a retried write): done, nothing added.
    store.ask_for_input(&claimed, &question).await.unwrap();
    let waiting = store.get(&task_id).await.unwrap();
    assert_eq!(waiting.state, State::InputRequired);
    assert_eq!(waiting.turns, std::slice::from_ref(&question));
    assert_eq!(waiting.question(), Some(&question));
    // Acknowledged (nothing to reclaim), on the retention clock while it waits.
    assert!(store.reclaim("worker-b", Duration::ZERO, 10).await.unwrap().is_empty());
    let ttl: i64 = backend.query(redis::cmd("TTL").arg(task_key(&task_id)));
    assert!(ttl > 0, "ttl {ttl}");

    let answer = Turn::user("m-2", json!({"size": "L"}));
    assert_eq!(
        store.continue_task(&task_id, &answer).await.unwrap(),
        State::InputRequired
    );
    // Run again: done, not queued twice.
    store.continue_task(&task_id, &answer).await.unwrap();
    let queued = store.get(&task_id).await.unwrap();
    assert_eq!(queued.state, State::Pending);
    assert_eq!(queued.turns, [question.clone(), answer.clone()]);
    assert_eq!(queued.turns[1].role, Role::User);
    assert_eq!(queued.question(), None);
    let ttl: i64 = backend.query(redis::cmd("TTL").arg(task_key(&task_id)));
    assert_eq!(ttl, -1, "kept while it runs again");
    // A task that does not wait for input takes no message.
    assert!(matches!(
        store.continue_task(&task_id, &Turn::user("m-3", json!({}))).await,
        Err(TaskStoreError::Refused { current, .. }) if current == "pending"
    ));

    let again = claim_one(&store).await;
    assert_eq!(again.task.turns.len(), 2, "the delivery sees the conversation");
    store
        .finish(
            &again,
            State::Succeeded,
            &json!({"status": "succeeded", "output": {"ok": true}}),
        )
        .await
        .unwrap();
    let done = store.get(&task_id).await.unwrap();
    let states: Vec<State> = done.transitions.iter().map(|transition| transition.state).collect();
    assert_eq!(
        states,
        [
            State::Pending,
            State::Running,
            State::InputRequired,
            State::Pending,
            State::Running,
            State::Succeeded
        ]
    );
    assert_eq!(done.attempts, 2);
    assert!(matches!(
        store.continue_task(&task_id, &Turn::user("m-4", json!({}))).await,
        Err(TaskStoreError::Refused { current, .. }) if current == "succeeded"
    ));
    assert!(matches!(
        store
            .continue_task("t_000000000000000000000000", &Turn::user("m-5", json!({})))
            .await,
        Err(TaskStoreError::NotFound(_))
    ));

    // A task waiting for input can be canceled; the worker's late question is refused.
    let other = store
        .submit(task("turns-2", Priority::Normal, None))
        .await
        .unwrap()
        .task_id()
        .to_string();
    let claimed = claim_one(&store).await;
    store
        .ask_for_input(&claimed, &Turn::agent("q-2", "Sure?"))
        .await
        .unwrap();
    store
        .cancel(&other, &json!({"status": "failed", "error": {"code": "CANCELED"}}))
        .await
        .unwrap();
    assert_eq!(store.get(&other).await.unwrap().state, State::Canceled);
    assert!(matches!(
        store.ask_for_input(&claimed, &Turn::agent("q-3", "Still there?")).await,
        Err(TaskStoreError::Refused { .. })
    ));
}

async fn a_call_answered_at_once_that_asked_for_input_is_kept_waiting(backend: Backend) {
    let store = backend.store();
    store.prepare().await.unwrap();
    let task_id = store.task_id_for("demo.echo");
    let question = Turn::agent("q-1", "Which order?");
    let kept = store
        .record_input_required(task("paused-1", Priority::High, Some("s-p")), &task_id, &question)
        .await
        .unwrap();
    assert_eq!(kept, Submitted::Created(task_id.clone()));
    // Run again (a retried write): done.
    let rerun = store
        .record_input_required(task("paused-1", Priority::High, Some("s-p")), &task_id, &question)
        .await
        .unwrap();
    assert_eq!(rerun, Submitted::Created(task_id.clone()));
    // The same request under another id names the task kept then.
    let again = store
        .record_input_required(
            task("paused-1", Priority::High, Some("s-p")),
            &store.task_id_for("demo.echo"),
            &question,
        )
        .await
        .unwrap();
    assert_eq!(again, Submitted::Existing(task_id.clone()));
    let waiting = store.get(&task_id).await.unwrap();
    assert_eq!((waiting.state, waiting.turns.len()), (State::InputRequired, 1));
    assert!(
        store.claim("worker", 10, 0).await.unwrap().is_empty(),
        "never queued for its first turn"
    );
    store
        .continue_task(&task_id, &Turn::user("m-1", json!({"order_id": "SO-1"})))
        .await
        .unwrap();
    let claimed = claim_one(&store).await;
    assert_eq!(claimed.task.task_id, task_id);
}

/// Works the callback schedule until nothing is due for a while; returns (member, outcome) in order.
async fn send_due(store: &TaskStore, deliverer: &Deliverer) -> Vec<(String, CallbackOutcome)> {
    let mut sent = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut quiet_since = Instant::now();
    // The test schedule's longest wait is 1.6 s: quiet for longer, nothing is left.
    while quiet_since.elapsed() < Duration::from_millis(2500) {
        assert!(Instant::now() < deadline, "the schedule never emptied: {sent:?}");
        let due = store
            .claim_due_callbacks(agent_reach_task_store::store::now_ms() + 60_000, 10)
            .await
            .unwrap();
        if !due.is_empty() {
            quiet_since = Instant::now();
        }
        for member in due {
            let outcome = deliverer.send_due(store, &member).await.unwrap();
            sent.push((member, outcome));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sent
}

async fn each_push_config_is_kept_and_notified_on_its_own(backend: Backend) {
    let store = backend.store();
    store.prepare().await.unwrap();
    let (up, up_calls) = receiver(0).await;
    let (flaky, flaky_calls) = receiver(1).await;
    let (down, _) = receiver(usize::MAX).await;
    // The first config comes with the submission.
    let task_id = store
        .submit(NewTask {
            push_config: Some(push("a", &up)),
            ..task("push-1", Priority::Normal, None)
        })
        .await
        .unwrap()
        .task_id()
        .to_string();
    store.put_push_config(&task_id, &push("b", &flaky)).await.unwrap();
    store.put_push_config(&task_id, &push("c", &down)).await.unwrap();
    // The same id replaces.
    store.put_push_config(&task_id, &push("c", &up)).await.unwrap();
    store.put_push_config(&task_id, &push("c", &down)).await.unwrap();
    let listed = store.get(&task_id).await.unwrap();
    let ids: Vec<&str> = listed
        .push_configs
        .iter()
        .map(|config| config.a2a.as_ref().unwrap().id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(listed.push_config("c").unwrap().url, down);
    assert!(store.delete_push_config(&task_id, "c").await.unwrap());
    assert!(
        !store.delete_push_config(&task_id, "c").await.unwrap(),
        "deleted already"
    );
    store.put_push_config(&task_id, &push("c", &down)).await.unwrap();
    assert!(matches!(
        store
            .put_push_config("t_000000000000000000000000", &push("x", &up))
            .await,
        Err(TaskStoreError::NotFound(_))
    ));

    // Asking for input notifies every config; so does the end.
    let claimed = claim_one(&store).await;
    store.ask_for_input(&claimed, &Turn::agent("q", "More?")).await.unwrap();
    let config_attempts = |sent: &[(String, CallbackOutcome)], member: &str| {
        sent.iter()
            .filter(|(due, _)| due == member)
            .map(|(_, outcome)| *outcome)
            .collect::<Vec<_>>()
    };
    let sent = send_due(&store, &deliverer()).await;
    let member = |id: &str| format!("{task_id}#{id}");
    assert_eq!(
        config_attempts(&sent, &member("a")),
        [CallbackOutcome::Delivered { attempt: 1 }]
    );
    let flaky_outcomes = config_attempts(&sent, &member("b"));
    assert!(
        matches!(
            flaky_outcomes.as_slice(),
            [
                CallbackOutcome::Retrying { attempt: 1, .. },
                CallbackOutcome::Delivered { attempt: 2 }
            ]
        ),
        "{flaky_outcomes:?}"
    );
    assert_eq!(
        config_attempts(&sent, &member("c")).last(),
        Some(&CallbackOutcome::DeadLettered { attempts: 5 })
    );
    assert_eq!(up_calls.lock().unwrap().len(), 1);
    assert_eq!(flaky_calls.lock().unwrap().len(), 2);
    let letters = store.list_dead_letters(None, 10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (
            letters[0].task_id.as_str(),
            letters[0].push_config.as_deref(),
            letters[0].url.as_str()
        ),
        (task_id.as_str(), Some("c"), down.as_str())
    );

    // The end notifies again, each config's attempts counted afresh; a config
    // deleted before its notification is sent is dropped.
    store
        .continue_task(&task_id, &Turn::user("m", json!({})))
        .await
        .unwrap();
    let claimed = claim_one(&store).await;
    store
        .finish(
            &claimed,
            State::Succeeded,
            &json!({"status": "succeeded", "output": {}}),
        )
        .await
        .unwrap();
    store.delete_push_config(&task_id, "c").await.unwrap();
    let sent = send_due(&store, &deliverer()).await;
    assert_eq!(
        config_attempts(&sent, &member("a")),
        [CallbackOutcome::Delivered { attempt: 1 }]
    );
    assert_eq!(
        config_attempts(&sent, &member("b")),
        [CallbackOutcome::Delivered { attempt: 1 }],
        "its receiver answers now, and this notification's attempts start at 1"
    );
    assert_eq!(config_attempts(&sent, &member("c")), [CallbackOutcome::Dropped]);
    // (The body is the protocol's, written by the A2A door; without it, the result envelope.)
    let bodies: Vec<Vec<u8>> = up_calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, body)| body.clone())
        .collect();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        serde_json::from_slice::<Value>(&bodies[1]).unwrap()["status"],
        "succeeded"
    );

    // The dead letter replays to its config's own schedule member.
    store.put_push_config(&task_id, &push("c", &up)).await.unwrap();
    assert_eq!(store.replay_dead_letter(&letters[0].id).await.unwrap(), task_id);
    let sent = send_due(&store, &deliverer()).await;
    assert_eq!(sent, [(member("c"), CallbackOutcome::Delivered { attempt: 1 })]);
}

async fn a_task_holds_a_bounded_number_of_push_configs(backend: Backend) {
    let store = backend.store();
    store.prepare().await.unwrap();
    let task_id = store
        .submit(task("push-many", Priority::Normal, None))
        .await
        .unwrap()
        .task_id()
        .to_string();
    for index in 0..MOST_PUSH_CONFIGS {
        store
            .put_push_config(&task_id, &push(&format!("p{index:02}"), "https://example.com/hook"))
            .await
            .unwrap();
    }
    assert!(matches!(
        store
            .put_push_config(&task_id, &push("one-more", "https://example.com/hook"))
            .await,
        Err(TaskStoreError::Refused { .. })
    ));
    // Replacing one that is there is not one more.
    store
        .put_push_config(&task_id, &push("p00", "https://example.com/other"))
        .await
        .unwrap();
    assert_eq!(store.get(&task_id).await.unwrap().push_configs.len(), MOST_PUSH_CONFIGS);
}

/// The two interruptions are told apart: a preempted task (`pause`, the
/// `paused:{L}` set, its checkpoint) is not one waiting for input
/// (`ask_for_input`), and a turn that asks for input drops the checkpoint
/// of an earlier preemption, so the next turn starts afresh.
async fn a_preempted_task_and_one_asking_for_input_are_told_apart(backend: Backend) {
    let store = backend.store();
    store.prepare().await.unwrap();
    let task_id = store
        .submit(task("both-1", Priority::Low, None))
        .await
        .unwrap()
        .task_id()
        .to_string();
    let claimed = claim_one(&store).await;
    store
        .pause(&claimed, r#"{"pages_done":3}"#, agent_reach_task_store::store::now_ms())
        .await
        .unwrap();
    let paused = store.get(&task_id).await.unwrap();
    assert_eq!(
        (paused.state, paused.checkpoint.clone()),
        (State::Paused, Some(json!({"pages_done": 3})))
    );
    assert!(paused.question().is_none() && paused.turns.is_empty());
    assert_eq!(store.paused().await.unwrap(), vec![task_id.clone()]);
    assert!(
        matches!(
            store.continue_task(&task_id, &Turn::user("m-1", json!({}))).await,
            Err(TaskStoreError::Refused { current, .. }) if current == "paused"
        ),
        "a message continues only a task waiting for input"
    );

    // Resumed from its checkpoint, it asks for input: no longer paused, the checkpoint dropped.
    assert_eq!(store.resume_due(10).await.unwrap(), 1);
    let claimed = claim_one(&store).await;
    assert_eq!(claimed.task.checkpoint, Some(json!({"pages_done": 3})));
    store
        .ask_for_input(&claimed, &Turn::agent("q-1", "Which pages next?"))
        .await
        .unwrap();
    let waiting = store.get(&task_id).await.unwrap();
    assert_eq!(
        (waiting.state, waiting.checkpoint.clone()),
        (State::InputRequired, None)
    );
    assert!(store.paused().await.unwrap().is_empty());
    assert!(
        matches!(
            store.pause(&claimed, "null", agent_reach_task_store::store::now_ms()).await,
            Err(TaskStoreError::Refused { current, .. }) if current == "input_required"
        ),
        "a task waiting for input is not preempted"
    );

    // The caller's answer queues the next turn, which carries no checkpoint.
    store
        .continue_task(&task_id, &Turn::user("m-2", json!({"pages": [4, 5]})))
        .await
        .unwrap();
    let claimed = claim_one(&store).await;
    assert_eq!(
        (claimed.task.task_id.as_str(), claimed.task.checkpoint.clone()),
        (task_id.as_str(), None)
    );
    let states: Vec<State> = store
        .get(&task_id)
        .await
        .unwrap()
        .transitions
        .iter()
        .map(|transition| transition.state)
        .collect();
    assert_eq!(
        states,
        [
            State::Pending,
            State::Running,
            State::Paused,
            State::Pending,
            State::Running,
            State::InputRequired,
            State::Pending,
            State::Running
        ]
    );
}

// === Running it against one server and a cluster ===

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(Backend::single()).await })*
        }
        mod on_cluster {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(Backend::cluster()).await })*
        }
    };
}

contract! {
    a_task_asking_for_input_waits_and_a_message_continues_it,
    a_call_answered_at_once_that_asked_for_input_is_kept_waiting,
    each_push_config_is_kept_and_notified_on_its_own,
    a_task_holds_a_bounded_number_of_push_configs,
    a_preempted_task_and_one_asking_for_input_are_told_apart,
}
