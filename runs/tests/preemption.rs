//! Preemption (issue 36, DESIGN §9): a high-priority task waiting for an
//! agent whose concurrency is full of low-priority preemptible work makes
//! the router ask that agent to pause it; the low one becomes `paused`, the
//! high one runs, and the low one resumes from its checkpoint. Work of a
//! capability not declared preemptible is never asked to pause.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_sdk::{Ctx, Handler, HandlerError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::Stack;

#[derive(Deserialize, JsonSchema)]
struct Job {
    id: String,
    steps: u32,
}

#[derive(Serialize, Deserialize, JsonSchema)]
struct Done {
    id: String,
    resumed_from: u32,
    done: u32,
}

/// Every start of a handler: (job id, the step it started from, whether it was ever asked to pause).
type Starts = Arc<Mutex<Vec<(String, u32)>>>;

fn job(capability: &str, starts: &Starts, asked: &Arc<Mutex<Vec<String>>>) -> Handler {
    let (starts, asked) = (starts.clone(), asked.clone());
    Handler::new(capability, "1.0.0", move |ctx: Ctx, job: Job| {
        let (starts, asked) = (starts.clone(), asked.clone());
        async move {
            let from = ctx
                .checkpoint()
                .and_then(|checkpoint| checkpoint["done"].as_u64())
                .unwrap_or(0) as u32;
            starts.lock().unwrap().push((job.id.clone(), from));
            for step in from..job.steps {
                // A checkpoint: pause when asked (only ever asked if preemptible).
                if ctx.pause_requested() {
                    asked.lock().unwrap().push(job.id.clone());
                    return Err(HandlerError::paused(json!({ "done": step })));
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Ok::<_, HandlerError>(Done {
                id: job.id,
                resumed_from: from,
                done: job.steps,
            })
        }
    })
}

async fn submit(stack: &Stack, capability: &str, priority: &str, id: &str, steps: u32) -> String {
    let (status, body) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            "/v1/tasks",
            Some(json!({"capability": capability, "priority": priority, "request_id": id,
                        "payload": {"id": id, "steps": steps}, "timeout_ms": 30_000})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body["task_id"].as_str().unwrap().to_string()
}

async fn ended(stack: &Stack, task_id: &str) -> Value {
    let path = format!("/v1/tasks/{task_id}");
    let (done, (_, task)) = support::poll(
        Duration::from_secs(30),
        || stack.call(stack.router(), "tester", "GET", &path, None),
        |(_, task)| matches!(task["status"].as_str(), Some("succeeded" | "failed" | "canceled")),
    )
    .await;
    assert!(done, "{task}");
    task
}

fn states(task: &Value) -> Vec<String> {
    task["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|transition| transition["status"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_high_priority_task_pauses_preemptible_low_priority_work_which_resumes_from_its_checkpoint() {
    let stack = Stack::start(1).await;
    let starts: Starts = Arc::default();
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    // One place each: the second delivery finds the agent full.
    let preemptible = stack
        .agent("worker", "worker-long")
        .max_concurrency(1)
        .handler(job("work.long", &starts, &asked).preemptible())
        .start()
        .await
        .unwrap();
    preemptible.mark_ready();
    let fixed = stack
        .agent("worker", "worker-fixed")
        .max_concurrency(1)
        .handler(job("work.fixed", &starts, &asked))
        .start()
        .await
        .unwrap();
    fixed.mark_ready();
    stack.wait_for_agent("worker-long").await;
    stack.wait_for_agent("worker-fixed").await;
    let registered: Value = stack
        .http
        .get(format!("{}/v1/agents/worker-long", stack.registry()))
        .bearer_auth(support::token("ops"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(registered["capabilities"][0]["preemptible"], true, "{registered}");

    // Preemptible: low starts, high arrives, low pauses, high runs, low resumes.
    let low = submit(&stack, "work.long", "low", "low-1", 60).await;
    assert!(support::eventually(Duration::from_secs(10), || async { !starts.lock().unwrap().is_empty() }).await);
    let high = submit(&stack, "work.long", "high", "high-1", 4).await;
    let high = ended(&stack, &high).await;
    let low = ended(&stack, &low).await;
    assert_eq!(high["status"], "succeeded", "{high}");
    assert_eq!(low["status"], "succeeded", "{low}");
    assert!(states(&low).contains(&"paused".to_string()), "{:?}", states(&low));
    // Counted (docs/metrics.md).
    assert!(
        stack
            .metric(
                stack.router(),
                "agent_reach_tasks_paused_total",
                &["capability=\"work.long\"", "reason=\"preempted\""]
            )
            .await
            >= 1.0
    );
    assert!(!states(&high).contains(&"paused".to_string()));
    let resumed_from = low["result"]["output"]["resumed_from"].as_u64().unwrap();
    assert!(
        resumed_from > 0,
        "resumed from its checkpoint, not from the start: {low}"
    );
    assert_eq!(low["result"]["output"]["done"], 60);
    assert!(
        high["updated_at"].as_u64() < low["updated_at"].as_u64(),
        "the urgent task ended first"
    );
    let low_starts: Vec<u32> = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _)| id == "low-1")
        .map(|(_, from)| *from)
        .collect();
    assert_eq!(low_starts.first(), Some(&0));
    assert_eq!(low_starts.last().copied(), Some(resumed_from as u32), "{low_starts:?}");
    assert_eq!(*asked.lock().unwrap(), ["low-1"]);

    // Not preemptible: the low task runs to its end, never asked; the high one waits for room.
    let low = submit(&stack, "work.fixed", "low", "fixed-low", 24).await;
    assert!(
        support::eventually(Duration::from_secs(10), || async {
            starts.lock().unwrap().iter().any(|(id, _)| id == "fixed-low")
        })
        .await
    );
    let high = submit(&stack, "work.fixed", "high", "fixed-high", 2).await;
    let low = ended(&stack, &low).await;
    let high = ended(&stack, &high).await;
    assert_eq!(low["status"], "succeeded", "{low}");
    assert!(!states(&low).contains(&"paused".to_string()), "{:?}", states(&low));
    assert_eq!(low["result"]["output"]["resumed_from"], 0);
    assert_eq!(
        starts
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| id == "fixed-low")
            .count(),
        1,
        "started once, never interrupted"
    );
    assert_eq!(*asked.lock().unwrap(), ["low-1"], "nothing else was asked to pause");
    eprintln!("the non-preemptible case's urgent task ended {}", high["status"]);
}
