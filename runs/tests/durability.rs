//! A router killed (as `kill -9` would) in the middle of workflow runs loses
//! none (issue 36): a second router finishes every run; every step ran;
//! the steps the dead router had in flight were delivered again (counted
//! here, from their tasks' deliveries), and the SDK's request-id memory
//! answered those redeliveries, so no handler ran twice. Each step's call
//! carried a hop assertion naming its run.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_sdk::{Ctx, Handler, HandlerError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::{Stack, Tune};

#[derive(Serialize, Deserialize, JsonSchema)]
struct Count {
    n: i64,
}

const RUNS: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_killed_mid_run_loses_no_run_and_no_step_runs_twice_in_its_handler() {
    let tune = Tune {
        reclaim_after: Duration::from_millis(1500),
        ..Tune::default()
    };
    let mut stack = Stack::start_tuned(2, tune).await;
    let executions: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let add = |capability: &str| {
        let executions = executions.clone();
        Handler::new(capability, "1.0.0", move |ctx: Ctx, count: Count| {
            let executions = executions.clone();
            async move {
                *executions
                    .lock()
                    .unwrap()
                    .entry(ctx.request_id().to_string())
                    .or_default() += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
                Ok::<_, HandlerError>(Count { n: count.n + 1 })
            }
        })
    };
    let agent = stack
        .agent("chain", "chain-1")
        .handler(add("chain.a"))
        .handler(add("chain.b"))
        .handler(add("chain.c"))
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    stack.wait_for_agent("chain-1").await;
    let definition = json!({
        "version": "1.0.0",
        "input_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
        "steps": [
            {"id": "a", "capability": "chain.a", "input": {"n": "${input.n}"}},
            {"id": "b", "capability": "chain.b", "input": {"n": "${steps.a.output.n}"}},
            {"id": "c", "capability": "chain.c", "input": {"n": "${steps.b.output.n}"}}
        ],
        "output": "${steps.c.output}"
    });
    assert_eq!(stack.put_workflow("chain.flow", &definition).await.0, 200);
    stack.wait_for_offer("chain.flow").await;

    let mut run_ids = Vec::new();
    for index in 0..RUNS {
        let run_id = stack
            .start_run(
                "chain.flow",
                json!({"payload": {"n": index}, "request_id": format!("durable-{index}")}),
            )
            .await;
        run_ids.push(run_id);
    }
    // Kill the first router once some steps ran, well before all could.
    let progressed = support::eventually(Duration::from_secs(20), || async {
        executions.lock().unwrap().len() >= RUNS
    })
    .await;
    assert!(progressed);
    stack.routers[0].kill();
    let done_at_kill = executions.lock().unwrap().len();
    assert!(done_at_kill < RUNS * 3, "the kill came too late to mean anything");

    // What was in flight at the kill: the step tasks `running` or `retrying`.
    let store =
        agent_reach_task_store::TaskStore::new(&stack.redis.url(), &agent_reach_task_store::StoreConfig::default())
            .unwrap();
    let survivor = stack.routers[1].url.clone();
    let mut finished = Vec::new();
    for run_id in &run_ids {
        let run = stack.ended(&survivor, run_id, Duration::from_secs(60)).await;
        finished.push(run);
    }
    for (index, run) in finished.iter().enumerate() {
        assert_eq!(run["status"], "succeeded", "{run}");
        assert_eq!(run["output"], json!({"n": index + 3}));
    }
    // Every step ran, and each handler once: the SDK's memory answered any redelivery.
    let executions = executions.lock().unwrap().clone();
    assert_eq!(executions.len(), RUNS * 3, "every step's call reached the agent");
    assert!(
        executions.values().all(|count| *count == 1),
        "a handler ran twice: {executions:?}"
    );
    // Deliveries: a step's task delivered more than once was one the dead router had.
    let mut delivered_twice = 0;
    for run in &finished {
        for step in run["steps"].as_array().unwrap() {
            let task = store.get(step["task_id"].as_str().unwrap()).await.unwrap();
            if task.attempts > 1 {
                delivered_twice += 1;
                let reclaimed = task
                    .transitions
                    .iter()
                    .any(|transition| transition.state == agent_reach_task_store::State::Retrying);
                assert!(reclaimed, "{task:?} was delivered twice without being reclaimed");
            }
        }
    }
    eprintln!(
        "killed with {done_at_kill} of {} steps run; {delivered_twice} step(s) delivered twice, each answered from the SDK's memory",
        RUNS * 3
    );
}

/// Each step's call carries a hop assertion whose `run` claim names its run
/// (and the forwarded envelope its `run_id`): a plain HTTP agent reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_steps_hop_assertion_names_its_run() {
    use axum::routing::post;
    let stack = Stack::start(1).await;
    let seen: Arc<Mutex<Vec<(Value, Value)>>> = Arc::default();
    let app = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/invoke",
            post(move |headers: axum::http::HeaderMap, body: axum::Json<Value>| {
                let seen = seen.clone();
                async move {
                    let token = headers["authorization"]
                        .to_str()
                        .unwrap()
                        .trim_start_matches("Bearer ")
                        .to_string();
                    let claims = token.split('.').nth(1).unwrap().to_string();
                    use base64::Engine as _;
                    let claims: Value = serde_json::from_slice(
                        &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(claims).unwrap(),
                    )
                    .unwrap();
                    seen.lock().unwrap().push((claims, body.0.clone()));
                    axum::Json(json!({"output": {"ok": true}}))
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/invoke", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let registration = json!({
        "agent_id": "plain-1", "name": "plain", "endpoint": endpoint, "ttl_s": 30, "status": "ready",
        "capabilities": [{"name": "plain.check", "version": "1.0.0"}]
    });
    let response = stack
        .http
        .post(format!("{}/v1/agents", stack.registry()))
        .bearer_auth(support::token("plain"))
        .json(&registration)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let definition = json!({
        "version": "1.0.0", "input_schema": {},
        "steps": [{"id": "check", "capability": "plain.check", "input": {"x": 1}}],
        "output": "${steps.check.output}"
    });
    assert_eq!(stack.put_workflow("plain.flow", &definition).await.0, 200);
    stack.wait_for_offer("plain.flow").await;
    let run_id = stack.start_run("plain.flow", json!({"payload": {}})).await;
    let run = stack.ended(stack.router(), &run_id, Duration::from_secs(20)).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let seen = seen.lock().unwrap();
    let (claims, envelope) = &seen[0];
    assert_eq!(claims["run"], run_id.as_str(), "{claims}");
    assert_eq!(claims["sub"], "tester", "called as the run's caller");
    assert_eq!(claims["cap"], "plain.check");
    assert_eq!(envelope["run_id"], run_id.as_str(), "{envelope}");
}
