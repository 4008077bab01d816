//! Workflow runs end to end (issue 36): real etcd, Redis, registry, routers
//! and Rust SDK agents. A fan-out/fan-in DAG, a `when` branch, a failing
//! step retried then compensated, a cancel mid-run, each step called as the
//! caller who started the run, and bad input refused with its stable code.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::{step, Stack};

#[derive(Deserialize, JsonSchema)]
struct OrderQuery {
    order_id: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone)]
struct Line {
    sku: String,
}

#[derive(Serialize, JsonSchema)]
struct Order {
    order_id: String,
    paid: bool,
    express: bool,
    items: Vec<Line>,
}

#[derive(Serialize, JsonSchema)]
struct Stock {
    sku: String,
    in_stock: bool,
}

#[derive(Deserialize, JsonSchema)]
struct ReplyInput {
    order_id: String,
    mode: String,
    #[serde(default)]
    lines: Vec<Value>,
}

#[derive(Serialize, JsonSchema)]
struct Reply {
    text: String,
}

/// What the agents saw.
#[derive(Default)]
struct Seen {
    /// Executions of each request id (the SDK's memory answers repeats).
    runs: Mutex<HashMap<String, usize>>,
    stock_in_flight: AtomicUsize,
    stock_most: AtomicUsize,
    refunds: Mutex<Vec<Value>>,
    slow_started: AtomicUsize,
    release: tokio::sync::Notify,
}

impl Seen {
    fn ran(&self, ctx: &Ctx) {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(ctx.request_id().to_string())
            .or_default() += 1;
    }
}

/// One SDK agent `shop` with every capability the workflows call.
async fn shop(stack: &Stack, seen: &Arc<Seen>) -> Agent {
    let lines = {
        let seen = seen.clone();
        Handler::new("shop.lines", "1.0.0", move |ctx: Ctx, input: OrderQuery| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                let count = input
                    .order_id
                    .trim_start_matches("SO-")
                    .trim_end_matches('X')
                    .parse()
                    .unwrap_or(1);
                Ok::<_, HandlerError>(Order {
                    express: input.order_id.ends_with('X'),
                    paid: true,
                    items: (0..count)
                        .map(|index| Line {
                            sku: format!("sku-{index}"),
                        })
                        .collect(),
                    order_id: input.order_id,
                })
            }
        })
    };
    let stock = {
        let seen = seen.clone();
        Handler::new("stock.check", "1.0.0", move |ctx: Ctx, line: Line| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                let now = seen.stock_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                seen.stock_most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(60)).await;
                seen.stock_in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(Stock {
                    in_stock: !line.sku.ends_with('3'),
                    sku: line.sku,
                })
            }
        })
    };
    let reply = |capability: &str| {
        let seen = seen.clone();
        Handler::new(capability, "1.0.0", move |ctx: Ctx, input: ReplyInput| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                Ok::<_, HandlerError>(Reply {
                    text: format!("{} by {}: {} line(s)", input.order_id, input.mode, input.lines.len()),
                })
            }
        })
    };
    let charge = {
        let seen = seen.clone();
        Handler::new("shop.charge", "1.0.0", move |ctx: Ctx, _: OrderQuery| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                Err::<Reply, _>(HandlerError::new("CARD_DECLINED", "the card was declined"))
            }
        })
    };
    let refund = {
        let seen = seen.clone();
        Handler::new("shop.refund", "1.0.0", move |ctx: Ctx, input: Value| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                seen.refunds.lock().unwrap().push(input);
                Ok::<_, HandlerError>(json!({"refunded": true}))
            }
        })
    };
    let slow = {
        let seen = seen.clone();
        Handler::new("shop.slow", "1.0.0", move |ctx: Ctx, input: OrderQuery| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                seen.slow_started.fetch_add(1, Ordering::SeqCst);
                let _ = tokio::time::timeout(Duration::from_secs(20), seen.release.notified()).await;
                Ok::<_, HandlerError>(Reply { text: input.order_id })
            }
        })
    };
    let ask = {
        let seen = seen.clone();
        Handler::new("shop.ask", "1.0.0", move |ctx: Ctx, _: OrderQuery| {
            let seen = seen.clone();
            async move {
                seen.ran(&ctx);
                Err::<Reply, _>(HandlerError::input_required("which warehouse should ship it?"))
            }
        })
    };
    let agent = stack
        .agent("shop", "shop-1")
        .handler(ask)
        .handler(lines)
        .handler(stock)
        .handler(reply("shop.reply"))
        .handler(reply("shop.express"))
        .handler(reply("shop.standard"))
        .handler(charge)
        .handler(refund)
        .handler(slow)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    stack.wait_for_agent("shop-1").await;
    agent
}

fn order_schema() -> Value {
    json!({"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fan_out_fan_in_dag_runs_each_element_within_max_parallel_and_gathers_in_order() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    let definition = json!({
        "version": "1.0.0",
        "input_schema": order_schema(),
        "steps": [
            {"id": "lines", "capability": "shop.lines", "input": {"order_id": "${input.order_id}"}},
            {"id": "stock", "capability": "stock.check", "for_each": "${steps.lines.output.items}", "max_parallel": 2,
             "input": {"sku": "${item.sku}"}},
            {"id": "reply", "capability": "shop.reply",
             "input": {"order_id": "${input.order_id}", "mode": "stock", "lines": "${steps.stock.output}"}}
        ],
        "output": {"reply": "${steps.reply.output.text}", "stock": "${steps.stock.output}"}
    });
    let (status, body) = stack.put_workflow("shop.fanout", &definition).await;
    assert_eq!(status, 200, "{body}");
    stack.wait_for_offer("shop.fanout").await;

    let run_id = stack
        .start_run(
            "shop.fanout",
            json!({"payload": {"order_id": "SO-5"}, "request_id": "fan-1"}),
        )
        .await;
    let run = stack.ended(stack.router(), &run_id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["output"]["reply"], "SO-5 by stock: 5 line(s)");
    let stock: Vec<Value> = serde_json::from_value(run["output"]["stock"].clone()).unwrap();
    let skus: Vec<&str> = stock.iter().map(|line| line["sku"].as_str().unwrap()).collect();
    assert_eq!(skus, ["sku-0", "sku-1", "sku-2", "sku-3", "sku-4"], "gathered in order");
    assert_eq!(stock[3]["in_stock"], false);
    assert!(seen.stock_most.load(Ordering::SeqCst) <= 2, "max_parallel 2 held");
    let fan_out = step(&run, "stock");
    assert_eq!(
        (fan_out["status"].as_str(), fan_out["attempts"].as_u64()),
        (Some("succeeded"), Some(5))
    );
    assert_eq!(fan_out["items"].as_array().unwrap().len(), 5);
    assert_eq!(fan_out["depends_on"], json!(["lines"]));
    assert_eq!(step(&run, "reply")["agent_id"], "shop-1");
    assert!(step(&run, "lines")["finished_at_ms"].as_u64() <= step(&run, "stock")["started_at_ms"].as_u64());
    // Counted (docs/metrics.md): the run, its end, and its 7 calls (1 + 5 + 1).
    let router = stack.router();
    let workflow = "workflow=\"shop.fanout\"";
    assert_eq!(
        stack
            .metric(router, "agent_reach_runs_started_total", &[workflow])
            .await,
        1.0
    );
    assert_eq!(
        stack
            .metric(
                router,
                "agent_reach_runs_ended_total",
                &[workflow, "state=\"succeeded\""]
            )
            .await,
        1.0
    );
    assert_eq!(
        stack.metric(router, "agent_reach_run_calls_total", &[workflow]).await,
        7.0
    );
    // The trail finds the run's calls by its id.
    let trail_url = format!("/v1/trail?run_id={run_id}");
    let (found, trail) = support::poll(
        Duration::from_secs(10),
        || async { stack.call(router, "ops", "GET", &trail_url, None).await.1 },
        |trail: &Value| trail["records"].as_array().is_some_and(|records| records.len() >= 7),
    )
    .await;
    assert!(found, "{trail}");
    let records = trail["records"].as_array().unwrap();
    assert!(
        records.iter().all(|record| record["run_id"] == run_id.as_str()),
        "{trail}"
    );
    assert_eq!(
        records
            .iter()
            .filter(|record| record["capability"] == "stock.check")
            .count(),
        5
    );

    // The request id makes the start idempotent: the same run again.
    let (status, again) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            "/v1/workflows/shop.fanout/runs",
            Some(json!({"payload": {"order_id": "SO-5"}, "request_id": "fan-1"})),
        )
        .await;
    assert_eq!(
        (status, again["run_id"].as_str(), again["duplicate"].as_bool()),
        (200, Some(run_id.as_str()), Some(true))
    );
    // Another caller does not see it.
    let (status, body) = stack
        .call(stack.router(), "limited", "GET", &format!("/v1/runs/{run_id}"), None)
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("RUN_NOT_FOUND")),
        "{body}"
    );
    // Listed for its caller and for operators.
    let (_, listed) = stack
        .call(stack.router(), "ops", "GET", "/v1/runs?workflow=shop.fanout", None)
        .await;
    assert_eq!(listed["runs"][0]["run_id"], run_id.as_str(), "{listed}");
    // Its result is its task's too.
    let (status, task) = stack
        .call(stack.router(), "tester", "GET", &format!("/v1/tasks/{run_id}"), None)
        .await;
    assert_eq!((status, task["status"].as_str()), (200, Some("succeeded")), "{task}");
    assert_eq!(task["result"]["output"]["reply"], "SO-5 by stock: 5 line(s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_when_branch_runs_one_side_and_skips_the_other() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    let definition = json!({
        "version": "1.0.0",
        "input_schema": order_schema(),
        "steps": [
            {"id": "lines", "capability": "shop.lines", "input": {"order_id": "${input.order_id}"}},
            {"id": "express", "capability": "shop.express", "when": "${steps.lines.output.express}",
             "input": {"order_id": "${input.order_id}", "mode": "express"}},
            {"id": "standard", "capability": "shop.standard", "when": "${!steps.lines.output.express}",
             "input": {"order_id": "${input.order_id}", "mode": "standard"}}
        ],
        "output": {"express": "${steps.express.output.text}", "standard": "${steps.standard.output.text}",
                   "skipped": "${steps.standard.error.code}"}
    });
    assert_eq!(stack.put_workflow("shop.branch", &definition).await.0, 200);
    stack.wait_for_offer("shop.branch").await;
    let express = stack
        .start_run("shop.branch", json!({"payload": {"order_id": "SO-2X"}}))
        .await;
    let standard = stack
        .start_run("shop.branch", json!({"payload": {"order_id": "SO-2"}}))
        .await;
    let express = stack.ended(stack.router(), &express, Duration::from_secs(30)).await;
    assert_eq!(
        express["output"],
        json!({"express": "SO-2X by express: 0 line(s)", "standard": null, "skipped": "SKIPPED"}),
        "{express}"
    );
    assert_eq!(step(&express, "standard")["status"], "canceled");
    assert_eq!(step(&express, "standard")["skipped"], true);
    assert_eq!(step(&express, "express")["status"], "succeeded");
    let standard = stack.ended(stack.router(), &standard, Duration::from_secs(30)).await;
    assert_eq!(standard["output"]["standard"], "SO-2 by standard: 0 line(s)");
    assert_eq!(step(&standard, "express")["skipped"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_step_is_retried_then_compensated_and_the_run_fails_with_the_step() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    let definition = json!({
        "version": "1.0.0",
        "input_schema": order_schema(),
        "steps": [
            {"id": "charge", "capability": "shop.charge", "input": {"order_id": "${input.order_id}"},
             "retry": {"max_attempts": 3, "backoff_ms": 50, "codes": ["CARD_DECLINED"]},
             "on_failure": {"compensate": {"capability": "shop.refund",
                            "input": {"order_id": "${input.order_id}", "because": "${steps.charge.error.details.agent_code}"}}}},
            {"id": "reply", "capability": "shop.reply", "depends_on": ["charge"],
             "input": {"order_id": "${input.order_id}", "mode": "paid"}}
        ],
        "output": "${steps.reply.output}"
    });
    assert_eq!(stack.put_workflow("shop.pay", &definition).await.0, 200);
    stack.wait_for_offer("shop.pay").await;
    let run_id = stack
        .start_run("shop.pay", json!({"payload": {"order_id": "SO-9"}}))
        .await;
    let run = stack.ended(stack.router(), &run_id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "STEP_FAILED");
    assert_eq!(run["error"]["details"]["step"], "charge");
    assert_eq!(run["error"]["details"]["error"]["code"], "AGENT_ERROR");
    assert_eq!(run["error"]["details"]["compensation"]["status"], "succeeded");
    let charge = step(&run, "charge");
    assert_eq!(
        (charge["status"].as_str(), charge["attempts"].as_u64()),
        (Some("failed"), Some(3)),
        "{charge}"
    );
    assert_eq!(charge["compensation"]["capability"], "shop.refund");
    assert_eq!(
        step(&run, "reply")["status"],
        "canceled",
        "nothing after the failed step ran"
    );
    assert_eq!(
        *seen.refunds.lock().unwrap(),
        [json!({"order_id": "SO-9", "because": "CARD_DECLINED"})]
    );
    let charges = seen
        .runs
        .lock()
        .unwrap()
        .keys()
        .filter(|id| id.contains("/charge/0/"))
        .count();
    assert_eq!(charges, 3, "three attempts, each its own request id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_whose_agent_asks_for_input_fails_with_input_required_instead_of_waiting() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    let definition = json!({
        "version": "1.0.0",
        "input_schema": order_schema(),
        "steps": [
            {"id": "ask", "capability": "shop.ask", "input": {"order_id": "${input.order_id}"},
             "on_failure": "continue"},
            {"id": "reply", "capability": "shop.reply", "depends_on": ["ask"],
             "input": {"order_id": "${input.order_id}", "mode": "${steps.ask.error.details.agent_code}"}}
        ],
        "output": {"reply": "${steps.reply.output.text}", "question": "${steps.ask.error.message}"}
    });
    assert_eq!(stack.put_workflow("shop.asking", &definition).await.0, 200);
    stack.wait_for_offer("shop.asking").await;
    let run_id = stack
        .start_run("shop.asking", json!({"payload": {"order_id": "SO-4"}}))
        .await;
    // Ends (a step waiting for an answer nobody can give would leave it running).
    let run = stack.ended(stack.router(), &run_id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let ask = step(&run, "ask");
    assert_eq!(ask["status"], "failed", "{ask}");
    assert_eq!(ask["error"]["code"], "AGENT_ERROR", "{ask}");
    assert_eq!(ask["error"]["details"]["agent_code"], "INPUT_REQUIRED", "{ask}");
    assert_eq!(
        run["output"],
        json!({"reply": "SO-4 by INPUT_REQUIRED: 0 line(s)", "question": "which warehouse should ship it?"}),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_canceled_mid_run_cancels_its_call_and_starts_nothing_more() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    let definition = json!({
        "version": "1.0.0",
        "input_schema": order_schema(),
        "steps": [
            {"id": "slow", "capability": "shop.slow", "input": {"order_id": "${input.order_id}"}},
            {"id": "reply", "capability": "shop.reply", "input": {"order_id": "${steps.slow.output.text}", "mode": "late"}}
        ],
        "output": "${steps.reply.output}"
    });
    assert_eq!(stack.put_workflow("shop.slowflow", &definition).await.0, 200);
    stack.wait_for_offer("shop.slowflow").await;
    let run_id = stack
        .start_run("shop.slowflow", json!({"payload": {"order_id": "SO-1"}}))
        .await;
    assert!(
        support::eventually(Duration::from_secs(10), || async {
            seen.slow_started.load(Ordering::SeqCst) == 1
        })
        .await
    );
    let running = stack.run(&run_id).await;
    assert_eq!(
        (running["status"].as_str(), step(&running, "slow")["status"].as_str()),
        (Some("running"), Some("running")),
        "{running}"
    );

    let (status, canceled) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            &format!("/v1/runs/{run_id}/cancel"),
            None,
        )
        .await;
    assert_eq!(
        (status, canceled["status"].as_str()),
        (200, Some("canceled")),
        "{canceled}"
    );
    assert_eq!(canceled["error"]["code"], "CANCELED");
    // The call in flight is canceled; its late answer changes nothing, and nothing more starts.
    let task_id = step(&canceled, "slow")["task_id"].as_str().unwrap().to_string();
    let (_, task) = stack
        .call(stack.router(), "tester", "GET", &format!("/v1/tasks/{task_id}"), None)
        .await;
    assert_eq!(task["status"], "canceled", "{task}");
    seen.release.notify_waiters();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = stack.run(&run_id).await;
    assert_eq!(after["status"], "canceled");
    assert_eq!(step(&after, "reply")["status"], "canceled");
    assert!(
        !seen.runs.lock().unwrap().keys().any(|id| id.contains("/reply/")),
        "reply never ran"
    );
    // A second cancel is too late.
    let (status, body) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            &format!("/v1/runs/{run_id}/cancel"),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("RUN_CONFLICT")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn steps_are_called_as_the_runs_caller_and_bad_input_gets_its_code_and_stores_nothing() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    // `limited` may start shop.* workflows but may not call stock.check itself.
    let definition = json!({
        "version": "1.0.0",
        "input_schema": order_schema(),
        "steps": [{"id": "stock", "capability": "stock.check", "input": {"sku": "${input.order_id}"}}],
        "output": "${steps.stock.output}"
    });
    assert_eq!(stack.put_workflow("shop.guarded", &definition).await.0, 200);
    stack.wait_for_offer("shop.guarded").await;
    let (status, started) = stack
        .call(
            stack.router(),
            "limited",
            "POST",
            "/v1/workflows/shop.guarded/runs",
            Some(json!({"payload": {"order_id": "x"}})),
        )
        .await;
    assert_eq!(status, 202, "{started}");
    let run_id = started["run_id"].as_str().unwrap();
    let path = format!("/v1/runs/{run_id}");
    let (failed, (_, run)) = support::poll(
        Duration::from_secs(20),
        || stack.call(stack.router(), "limited", "GET", &path, None),
        |(_, view)| view["status"] == "failed",
    )
    .await;
    assert!(failed, "{run}");
    assert_eq!(run["error"]["details"]["error"]["code"], "FORBIDDEN", "{run}");
    assert!(seen.runs.lock().unwrap().is_empty(), "the agent was never called");

    // A mapping the SDK agent's derived schema can never take: refused at registration with its pointer.
    let bad = json!({
        "version": "1.0.0", "input_schema": order_schema(),
        "steps": [{"id": "stock", "capability": "stock.check", "input": {"sku": 42}}],
        "output": {}
    });
    let (status, body) = stack.put_workflow("shop.bad", &bad).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_WORKFLOW")),
        "{body}"
    );
    assert_eq!(body["error"]["details"]["pointer"], "/steps/0/input/sku");
    assert_eq!(body["error"]["details"]["step"], "stock");
    assert_eq!(body["error"]["details"]["reason"], "mapping");

    // A run's input failing the schema, an unknown workflow, a bad body: nothing started.
    let (_, before) = stack.call(stack.router(), "ops", "GET", "/v1/runs", None).await;
    for (path, body, status, code) in [
        (
            "/v1/workflows/shop.guarded/runs",
            json!({"payload": {"order": 1}}),
            422,
            "SCHEMA_MISMATCH",
        ),
        (
            "/v1/workflows/shop.nothing/runs",
            json!({"payload": {}}),
            404,
            "WORKFLOW_NOT_FOUND",
        ),
        (
            "/v1/workflows/shop.guarded/runs",
            json!({"payload": {"order_id": "x"}, "extra": 1}),
            400,
            "INVALID_ENVELOPE",
        ),
        (
            "/v1/workflows/shop.guarded/runs",
            json!({"payload": {"order_id": "x"}, "request_id": "has space"}),
            400,
            "INVALID_ENVELOPE",
        ),
    ] {
        let (got, answer) = stack.call(stack.router(), "tester", "POST", path, Some(body)).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{path}: {answer}"
        );
    }
    let (status, answer) = stack
        .call(
            stack.router(),
            "tester",
            "GET",
            "/v1/runs/t_000000000000000000000000",
            None,
        )
        .await;
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("RUN_NOT_FOUND")));
    let (_, after) = stack.call(stack.router(), "ops", "GET", "/v1/runs", None).await;
    assert_eq!(before["runs"], after["runs"], "no run was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workflow_is_called_like_a_capability_through_invoke_streams_and_tasks() {
    let stack = Stack::start(1).await;
    let seen = Arc::new(Seen::default());
    let _agent = shop(&stack, &seen).await;
    let definition = json!({
        "version": "2.1.0",
        "input_schema": order_schema(),
        "steps": [
            {"id": "lines", "capability": "shop.lines", "input": {"order_id": "${input.order_id}"}},
            {"id": "reply", "capability": "shop.reply",
             "input": {"order_id": "${input.order_id}", "mode": "invoke", "lines": "${steps.lines.output.items}"}}
        ],
        "output": "${steps.reply.output}"
    });
    assert_eq!(stack.put_workflow("shop.quote", &definition).await.0, 200);
    stack.wait_for_offer("shop.quote").await;

    // Whole: the run's output in a result envelope.
    let (status, envelope) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            "/v1/invoke",
            Some(json!({"capability": "shop.quote", "payload": {"order_id": "SO-2"}, "request_id": "quote-1"})),
        )
        .await;
    assert_eq!(status, 200, "{envelope}");
    assert_eq!(envelope["status"], "succeeded");
    assert_eq!(envelope["capability_version"], "2.1.0");
    assert_eq!(envelope["output"]["text"], "SO-2 by invoke: 2 line(s)");
    let run_id = envelope["agent_id"].as_str().unwrap();
    assert_eq!(
        stack.run(run_id).await["status"],
        "succeeded",
        "the envelope names its run"
    );
    // A payload the workflow's input schema refuses: 422 before any run.
    let (status, envelope) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            "/v1/invoke",
            Some(json!({"capability": "shop.quote", "payload": {}})),
        )
        .await;
    assert_eq!(
        (status, envelope["error"]["code"].as_str()),
        (422, Some("SCHEMA_MISMATCH")),
        "{envelope}"
    );
    // A caller the ACL does not let call it.
    let (status, envelope) = stack
        .call(
            stack.router(),
            "nobody",
            "POST",
            "/v1/invoke",
            Some(json!({"capability": "shop.quote", "payload": {"order_id": "x"}})),
        )
        .await;
    assert_eq!(
        (status, envelope["error"]["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{envelope}"
    );

    // Not done by the deadline: 202 with the run to follow.
    let slow = json!({
        "version": "1.0.0", "input_schema": order_schema(),
        "steps": [{"id": "slow", "capability": "shop.slow", "input": {"order_id": "${input.order_id}"}}],
        "output": "${steps.slow.output}"
    });
    assert_eq!(stack.put_workflow("shop.later", &slow).await.0, 200);
    stack.wait_for_offer("shop.later").await;
    let (status, accepted) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            "/v1/invoke",
            Some(json!({"capability": "shop.later", "payload": {"order_id": "SO-L"}, "timeout_ms": 300})),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let later = accepted["run_id"].as_str().unwrap().to_string();
    seen.release.notify_waiters();
    assert!(
        support::eventually(Duration::from_secs(5), || async {
            seen.release.notify_waiters();
            stack.run(&later).await["status"] == "succeeded"
        })
        .await
    );

    // Streamed: the run's output is the one event, then the result.
    let response = stack
        .http
        .post(format!("{}/v1/invoke", stack.router()))
        .bearer_auth(support::token("tester"))
        .header("accept", "text/event-stream")
        .json(&json!({"capability": "shop.quote", "payload": {"order_id": "SO-3"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains("SO-3 by invoke: 3 line(s)"), "{text}");
    assert!(text.contains("event: result"), "{text}");

    // As a task: the task is the run; its result the run's.
    let (status, submitted) = stack
        .call(
            stack.router(),
            "tester",
            "POST",
            "/v1/tasks",
            Some(json!({"capability": "shop.quote", "payload": {"order_id": "SO-4"}, "request_id": "quote-task"})),
        )
        .await;
    assert_eq!(status, 202, "{submitted}");
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    let path = format!("/v1/tasks/{task_id}");
    let (succeeded, (_, task)) = support::poll(
        Duration::from_secs(20),
        || stack.call(stack.router(), "tester", "GET", &path, None),
        |(_, task)| task["status"] == "succeeded",
    )
    .await;
    assert!(succeeded, "{task}");
    assert_eq!(task["result"]["output"]["text"], "SO-4 by invoke: 4 line(s)");
    assert_eq!(
        stack.run(&task_id).await["status"],
        "succeeded",
        "the task's id is its run's"
    );
}
