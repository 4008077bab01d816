//! Delegation chains and budgets (issue 39, points 1 and 2) with real SDK
//! agents, etcd, Redis, the registry and the router: a three-agent chain
//! knows whom it acts for; a forged or borrowed upstream is not believed;
//! `via:` and `subjects:` rules; the trail records the chain; a loop and a
//! chain too deep stop with their codes; a budget of calls admits exactly
//! that many calls across a fan-out tree; reported cost is subtracted and
//! the rest is visible to handlers, in the result envelope and the metrics.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_sdk::{Agent, CallError, Ctx, Handler, HandlerError, ResultEnvelope, Usage};
use agent_reach_testkit::eventually;
use serde_json::{json, Value};
use support::{token, Stack};

const ACL: &str = r#"
version: 1
permissions:
  - caller: alice
    allow: [intent.parse, spy.*, loop.*, hop.*, fan.*, cost.*]
  - caller: bob
    allow: [intent.parse]
  - caller: carol
    allow: [intent.parse]
  - caller: intent_parser
    allow: [order.query]
    subjects: [alice, "group:staff"]
  - caller: order_query
    allow: [payment.check]
    via: [intent_parser]
  - caller: spy
    allow: [spy.*]
  - caller: relay
    allow: [loop.*, hop.*, fan.*, cost.*]
providers:
  - agent: intent_parser
    provides: [intent.parse]
  - agent: order_query
    provides: [order.query]
  - agent: payment
    provides: [payment.check]
  - agent: spy
    provides: [spy.*]
  - agent: relay
    provides: [loop.*, hop.*, fan.*, cost.*]
operators: [ops]
chains:
  - capability: hop.deep.*
    max_depth: 5
"#;

/// A call's outcome as JSON: the output and what was left of the budget, or the error.
fn outcome(result: Result<ResultEnvelope, CallError>) -> Value {
    match result {
        Ok(envelope) => json!({"output": envelope.output, "budget": envelope.budget}),
        Err(error) => json!({"code": error.code, "status": error.status, "details": error.details}),
    }
}

/// What a handler knows of its place in the chain.
fn seen(ctx: &Ctx) -> Value {
    json!({"chain": ctx.chain(), "on_behalf_of": ctx.on_behalf_of(), "budget": ctx.budget()})
}

/// A handler of `capability` that calls `next` (if any) and answers what it
/// saw and what the call answered.
fn step(capability: &str, next: Option<&'static str>) -> Handler {
    Handler::new(capability, "1.0.0", move |ctx: Ctx, _input: Value| async move {
        let mut answer = seen(&ctx);
        if let Some(next) = next {
            answer["next"] = outcome(ctx.call_envelope(next, json!({})).await);
        }
        Ok::<_, HandlerError>(answer)
    })
}

async fn ready(builder: agent_reach_sdk::AgentBuilder) -> Agent {
    let agent = builder.start().await.unwrap();
    agent.mark_ready();
    agent
}

/// An SDK agent named `name` on `stack`'s router 0.
fn agent(stack: &Stack, name: &str, agent_id: &str) -> agent_reach_sdk::AgentBuilder {
    Agent::builder(name, agent_id)
        .registry(&stack.registry)
        .router(stack.router())
        .token(token(name))
        .ttl_s(5)
}

/// Invokes `capability` as `caller` (with `extra` fields in the envelope) once the router routes it.
async fn call(stack: &Stack, caller: &str, capability: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"capability": capability, "payload": {}, "timeout_ms": 10_000});
    for (key, value) in extra.as_object().into_iter().flatten() {
        body[key] = value.clone();
    }
    stack.invoke_as(stack.router(), caller, &[], body).await
}

/// Waits until the registry lists `capability` (callers then poll the router for it).
async fn registered(stack: &Stack, capability: &str) {
    assert!(
        eventually(Duration::from_secs(10), || async {
            reqwest::Client::new()
                .get(format!("{}/v1/capabilities/{capability}", stack.registry))
                .bearer_auth(token("ops"))
                .send()
                .await
                .is_ok_and(|response| response.status() == 200)
        })
        .await,
        "{capability} never registered"
    );
}

/// Polls `attempt` until it answers `Ok` (bounded: 10 s), then that value;
/// the last `Err` names what was seen when it never did.
async fn until<T, Fut: std::future::Future<Output = Result<T, Value>>>(
    what: &str,
    mut attempt: impl FnMut() -> Fut,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(last) => assert!(tokio::time::Instant::now() < deadline, "{what}: {last}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The router's `/metrics` text.
async fn metrics(stack: &Stack) -> String {
    reqwest::get(format!("{}/metrics", stack.router()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the series `name{labels}` in `text` (0 when absent).
fn series(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix('{')?;
            let (found, value) = rest.split_once("} ")?;
            let mut found: Vec<&str> = found.split(',').collect();
            let mut wanted: Vec<&str> = labels.split(',').collect();
            found.sort_unstable();
            wanted.sort_unstable();
            (found == wanted).then(|| value.trim().parse().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
}

// === A raw HTTP agent that keeps the assertions it is given ===

/// An agent without the SDK: answers `{}` and keeps each `Authorization` it receives.
struct Spy {
    tokens: Arc<Mutex<Vec<String>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl Spy {
    async fn start(stack: &Stack) -> Self {
        let tokens = Arc::new(Mutex::new(Vec::new()));
        let kept = tokens.clone();
        let app = axum::Router::new().route(
            "/invoke",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let kept = kept.clone();
                async move {
                    if let Some(value) = headers.get("authorization").and_then(|value| value.to_str().ok()) {
                        kept.lock()
                            .unwrap()
                            .push(value.trim_start_matches("Bearer ").to_string());
                    }
                    axum::Json(json!({"output": {}}))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let response = reqwest::Client::new()
            .post(format!("{}/v1/agents", stack.registry))
            .bearer_auth(token("spy"))
            .json(&json!({
                "agent_id": "spy-1", "name": "spy", "endpoint": format!("http://{addr}/invoke"),
                "ttl_s": 60, "status": "ready",
                "capabilities": [{"name": "spy.leak", "version": "1.0.0"}],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap());
        Self {
            tokens,
            _server: server,
        }
    }

    fn last(&self) -> String {
        self.tokens.lock().unwrap().last().cloned().expect("the spy was called")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_agent_chain_knows_whom_it_acts_for_and_a_forged_one_is_not_believed() {
    let stack = Stack::start_with(1, ACL, |_, settings| {
        if let Some(tasks) = settings.tasks.as_mut() {
            tasks.trail = Some(agent_reach_router::TrailConfig {
                settings: agent_reach_router::TrailSettings {
                    flush_every: Duration::from_millis(20),
                    ..Default::default()
                },
                credentials: Default::default(),
                otlp: None,
            });
        }
    })
    .await;
    let _intent =
        ready(agent(&stack, "intent_parser", "ip-1").handler(step("intent.parse", Some("order.query")))).await;
    let _order = ready(agent(&stack, "order_query", "oq-1").handler(step("order.query", Some("payment.check")))).await;
    let _payment = ready(agent(&stack, "payment", "pay-1").handler(step("payment.check", None))).await;
    let spy = Spy::start(&stack).await;
    for capability in ["intent.parse", "order.query", "payment.check", "spy.leak"] {
        registered(&stack, capability).await;
    }

    // alice → intent_parser → order_query → payment: each hop sees the chain so far.
    let answer = until("the chain never answered", || async {
        let (status, body) = call(&stack, "alice", "intent.parse", json!({"session_id": "s-chain"})).await;
        let whole = status == 200 && body["output"]["next"]["output"]["next"]["output"].is_object();
        if whole {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await;
    let intent = &answer["output"];
    let order = &intent["next"]["output"];
    let payment = &order["next"]["output"];
    assert_eq!(intent["chain"], json!(["alice"]), "{answer}");
    assert_eq!(order["chain"], json!(["alice", "intent_parser"]), "{answer}");
    assert_eq!(
        payment["chain"],
        json!(["alice", "intent_parser", "order_query"]),
        "{answer}"
    );
    for hop in [intent, order, payment] {
        assert_eq!(hop["on_behalf_of"], "alice", "{answer}");
        assert!(hop["budget"].is_null(), "no budget was given: {answer}");
    }

    // `via: [intent_parser]`: order_query may not call payment.check on its own.
    let (status, direct) = call(&stack, "order_query", "payment.check", json!({})).await;
    assert_eq!(
        (status, &direct["error"]["code"]),
        (403, &json!("FORBIDDEN")),
        "{direct}"
    );

    // `subjects: [alice]`: a chain begun by bob stops at intent_parser's onward call.
    let (status, by_bob) = call(&stack, "bob", "intent.parse", json!({})).await;
    assert_eq!(status, 200, "{by_bob}");
    let refused = &by_bob["output"]["next"];
    assert_eq!(
        (&refused["code"], &refused["status"]),
        (&json!("FORBIDDEN"), &json!(403)),
        "{by_bob}"
    );
    assert_eq!(refused["details"]["chain"], json!(["bob", "intent_parser"]), "{by_bob}");

    // `group:staff`: carol, whose token lists the group, may begin the chain; bob's lists another.
    for (caller, group, refused) in [("carol", "staff", false), ("bob", "guests", true)] {
        let grouped = agent_reach_access::token::issue_hs256_groups(
            caller,
            None,
            &[group],
            support::SECRET.as_bytes(),
            Duration::from_secs(600),
        )
        .unwrap();
        let response = reqwest::Client::new()
            .post(format!("{}/v1/invoke", stack.router()))
            .bearer_auth(grouped)
            .json(&json!({"capability": "intent.parse", "payload": {}, "timeout_ms": 10_000}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let answer: Value = response.json().await.unwrap();
        let onward = &answer["output"]["next"];
        if refused {
            assert_eq!(onward["code"], "FORBIDDEN", "{caller} in {group}: {answer}");
        } else {
            let at_payment = &onward["output"]["next"]["output"];
            assert_eq!(at_payment["on_behalf_of"], caller, "{caller} in {group}: {answer}");
        }
    }

    // Forged upstreams: made up, re-signed with another key, edited, or another agent's.
    assert!(
        eventually(Duration::from_secs(10), || async {
            call(&stack, "alice", "spy.leak", json!({})).await.0 == 200
        })
        .await
    );
    let given_to_spy = spy.last();
    let (other_key, _) = agent_reach_access::assertion::AssertionKey::generate().unwrap();
    let claims = agent_reach_access::AssertionClaims {
        iss: agent_reach_access::assertion::DEFAULT_ISSUER.into(),
        sub: "alice".into(),
        aud: "oq-1".into(),
        cap: "order.query".into(),
        tenant: "default".into(),
        iat: 1,
        exp: u64::MAX / 2000,
        ..Default::default()
    };
    let resigned = other_key.sign(&claims).unwrap();
    let mut parts: Vec<String> = given_to_spy.split('.').map(str::to_string).collect();
    parts[1] = parts[1].chars().rev().collect();
    let edited = parts.join(".");
    for (caller, upstream, reason) in [
        ("order_query", "not-a-jwt", "upstream_invalid"),
        ("order_query", resigned.as_str(), "upstream_invalid"),
        ("spy", edited.as_str(), "upstream_invalid"),
        ("order_query", given_to_spy.as_str(), "upstream_not_yours"),
    ] {
        let (status, body) = stack
            .invoke_as(
                stack.router(),
                caller,
                &[("agent-reach-upstream", upstream)],
                json!({"capability": "payment.check", "payload": {}}),
            )
            .await;
        assert_eq!(
            (status, &body["error"]["code"], &body["error"]["details"]["reason"]),
            (401, &json!("UNAUTHENTICATED"), &json!(reason)),
            "{caller} presenting {upstream}: {body}"
        );
    }
    // The spy's own assertion is believed: calling back into the same
    // capability and instance within its chain is a loop.
    let (status, looped) = stack
        .invoke_as(
            stack.router(),
            "spy",
            &[("agent-reach-upstream", &given_to_spy)],
            json!({"capability": "spy.leak", "payload": {}}),
        )
        .await;
    assert_eq!(
        (status, &looped["error"]["code"]),
        (403, &json!("LOOP_DETECTED")),
        "{looped}"
    );
    assert_eq!(looped["error"]["details"]["chain"], json!(["alice", "spy"]), "{looped}");

    // The trail records each hop's chain and the call it was made within.
    let records = until("the trail never held the chain's three records", || async {
        let page: Value = reqwest::Client::new()
            .get(format!("{}/v1/trail?session_id=s-chain", stack.router()))
            .bearer_auth(token("ops"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let records = page["records"].as_array().cloned().unwrap_or_default();
        if ["intent.parse", "order.query", "payment.check"]
            .iter()
            .all(|capability| records.iter().any(|record| record["capability"] == *capability))
        {
            Ok(records)
        } else {
            Err(page)
        }
    })
    .await;
    let record = |capability: &str| {
        records
            .iter()
            .rev()
            .find(|record| record["capability"] == capability)
            .cloned()
            .unwrap_or_else(|| panic!("no record of {capability}: {records:?}"))
    };
    let (first, second, third) = (record("intent.parse"), record("order.query"), record("payment.check"));
    assert!(
        first.get("chain").is_none_or(Value::is_null),
        "a direct call has no chain: {first}"
    );
    assert_eq!(second["chain"], json!(["alice", "intent_parser"]), "{second}");
    assert_eq!(
        third["chain"],
        json!(["alice", "intent_parser", "order_query"]),
        "{third}"
    );
    assert_eq!(third["caller"], "order_query");
    assert_eq!(third["parent_request_id"], second["request_id"], "{third}");
    assert_eq!(second["parent_request_id"], first["request_id"], "{second}");
}

/// `loop.ping` and `loop.pong` call each other; `hop.*` call along `input.path`.
fn relay(runs: Arc<AtomicUsize>) -> Vec<Handler> {
    let mut handlers = Vec::new();
    for (name, next) in [("loop.ping", "loop.pong"), ("loop.pong", "loop.ping")] {
        let runs = runs.clone();
        handlers.push(Handler::new(name, "1.0.0", move |ctx: Ctx, _input: Value| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(json!({"next": outcome(ctx.call_envelope(next, json!({})).await)}))
            }
        }));
    }
    for name in [
        "hop.a",
        "hop.b",
        "hop.c",
        "hop.d",
        "hop.deep.a",
        "hop.deep.b",
        "hop.deep.c",
        "hop.deep.d",
        "hop.deep.e",
        "hop.deep.f",
    ] {
        let runs = runs.clone();
        handlers.push(Handler::new(name, "1.0.0", move |ctx: Ctx, input: Value| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let path: Vec<Value> = input["path"].as_array().cloned().unwrap_or_default();
                let Some((next, rest)) = path.split_first() else {
                    return Ok::<_, HandlerError>(json!({"depth_reached": ctx.chain().len()}));
                };
                let next = next.as_str().unwrap_or_default().to_string();
                Ok(json!({"next": outcome(ctx.call_envelope(&next, json!({"path": rest})).await)}))
            }
        }));
    }
    handlers
}

/// The innermost `next` of nested outcomes.
fn deepest(value: &Value) -> &Value {
    let mut at = value;
    while let Some(next) = at
        .get("next")
        .or_else(|| at.get("output").and_then(|output| output.get("next")))
    {
        at = next;
    }
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_and_a_chain_too_deep_stop_at_their_limit() {
    // --max-depth 3 on this router; acl.yaml gives hop.deep.* 5.
    let stack = Stack::start_with(1, ACL, |_, settings| settings.tuning.chains.max_depth = 3).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let mut builder = agent(&stack, "relay", "relay-1");
    for handler in relay(runs.clone()) {
        builder = builder.handler(handler);
    }
    let _relay = ready(builder).await;
    for capability in ["loop.ping", "hop.a", "hop.deep.f"] {
        registered(&stack, capability).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            call(&stack, "alice", "hop.d", json!({"payload": {"path": []}})).await.0 == 200
        })
        .await
    );

    // ping → pong → ping again on the same instance: a loop, after two hops.
    runs.store(0, Ordering::SeqCst);
    let (status, looped) = call(&stack, "alice", "loop.ping", json!({})).await;
    assert_eq!(status, 200, "{looped}");
    let refusal = deepest(&looped);
    assert_eq!(
        (&refusal["code"], &refusal["status"]),
        (&json!("LOOP_DETECTED"), &json!(403)),
        "{looped}"
    );
    assert_eq!(
        refusal["details"]["chain"],
        json!(["alice", "relay", "relay"]),
        "{looped}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "handler runs before the loop stopped");

    // A chain of distinct hops: the fourth hop is refused under --max-depth 3, three ran.
    runs.store(0, Ordering::SeqCst);
    let path = json!({"payload": {"path": ["hop.b", "hop.c", "hop.d"]}});
    let (status, deep) = call(&stack, "alice", "hop.a", path).await;
    assert_eq!(status, 200, "{deep}");
    let refusal = deepest(&deep);
    assert_eq!(
        (&refusal["code"], &refusal["status"]),
        (&json!("DEPTH_EXCEEDED"), &json!(403)),
        "{deep}"
    );
    assert_eq!(
        (&refusal["details"]["depth"], &refusal["details"]["max_depth"]),
        (&json!(4), &json!(3)),
        "{deep}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3, "no more than max_depth hops were made");

    // acl.yaml's `chains:` lets hop.deep.* go to 5.
    runs.store(0, Ordering::SeqCst);
    let path = json!({"payload": {"path": ["hop.deep.b", "hop.deep.c", "hop.deep.d", "hop.deep.e", "hop.deep.f"]}});
    let (status, deeper) = call(&stack, "alice", "hop.deep.a", path).await;
    assert_eq!(status, 200, "{deeper}");
    let refusal = deepest(&deeper);
    assert_eq!(
        (&refusal["code"], &refusal["details"]["max_depth"]),
        (&json!("DEPTH_EXCEEDED"), &json!(5)),
        "{deeper}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// `fan.root` calls `fan.mid` three times in turn; each `fan.mid` calls
/// `fan.leaf` three times at once. `cost.a` reports 30 and calls `cost.b`
/// (which reports 60) three times. Every run is counted.
fn spenders(runs: Arc<AtomicUsize>, refused: Arc<Mutex<Vec<String>>>) -> Vec<Handler> {
    let counted = move |name: &'static str, children: usize, next: Option<&'static str>, fan_at_once: bool| {
        let (runs, refused) = (runs.clone(), refused.clone());
        Handler::new(name, "1.0.0", move |ctx: Ctx, _input: Value| {
            let (runs, refused) = (runs.clone(), refused.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let mut outcomes = Vec::new();
                if let Some(next) = next {
                    if fan_at_once {
                        let calls = (0..children).map(|_| ctx.call_envelope(next, json!({})));
                        outcomes = futures::future::join_all(calls)
                            .await
                            .into_iter()
                            .map(outcome)
                            .collect();
                    } else {
                        for _ in 0..children {
                            outcomes.push(outcome(ctx.call_envelope(next, json!({})).await));
                        }
                    }
                }
                for failed in outcomes.iter().filter_map(|outcome| outcome["code"].as_str()) {
                    refused.lock().unwrap().push(failed.to_string());
                }
                match name {
                    "cost.a" => ctx.report_usage(Usage {
                        cost: 30.0,
                        ..Default::default()
                    }),
                    "cost.b" => ctx.report_usage(Usage {
                        cost: 60.0,
                        ..Default::default()
                    }),
                    _ => {}
                }
                Ok::<_, HandlerError>(json!({"seen": seen(&ctx), "calls": outcomes}))
            }
        })
    };
    vec![
        counted("fan.root", 3, Some("fan.mid"), false),
        counted("fan.mid", 3, Some("fan.leaf"), true),
        counted("fan.leaf", 0, None, false),
        counted("cost.a", 3, Some("cost.b"), false),
        counted("cost.b", 0, None, false),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_is_shared_down_the_chain_and_its_spend_is_visible() {
    let stack = Stack::start_with(1, ACL, |_, _| {}).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let mut builder = agent(&stack, "relay", "relay-1");
    for handler in spenders(runs.clone(), refused.clone()) {
        builder = builder.handler(handler);
    }
    let _relay = ready(builder).await;
    for capability in ["fan.root", "fan.leaf", "cost.b"] {
        registered(&stack, capability).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            call(&stack, "alice", "fan.leaf", json!({})).await.0 == 200
        })
        .await
    );

    // 13 calls would be made without a budget; 5 are admitted.
    runs.store(0, Ordering::SeqCst);
    let (status, fanned) = call(&stack, "alice", "fan.root", json!({"budget": {"calls": 5}})).await;
    assert_eq!(status, 200, "{fanned}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        5,
        "handler runs under a budget of 5 calls: {fanned}"
    );
    let refusals = refused.lock().unwrap().clone();
    assert!(!refusals.is_empty(), "{fanned}");
    assert!(refusals.iter().all(|code| code == "BUDGET_EXHAUSTED"), "{refusals:?}");
    assert_eq!(fanned["output"]["seen"]["budget"], json!({"calls_left": 4}), "{fanned}");
    assert_eq!(
        fanned["budget"],
        json!({"calls_left": 0}),
        "the result envelope: {fanned}"
    );

    // Cost: 100 given. cost.b reports 60 twice (100 → 40 → -20), so its third
    // call is refused; cost.a's own 30 comes last. Calls: 10 → 9 (a) → 8, 7 (b, b).
    let before = metrics(&stack).await;
    // Given from a `Client` (a program that is not an agent), as `CallOptions::budget`.
    let client = agent_reach_sdk::Client::new(stack.router(), token("alice")).unwrap();
    let options = agent_reach_sdk::CallOptions::new()
        .budget(Some(10), Some(100.0))
        .timeout(Duration::from_secs(10));
    let envelope = client.invoke_envelope("cost.a", json!({}), &options).await.unwrap();
    let spent = serde_json::to_value(&envelope).unwrap();
    let calls = spent["output"]["calls"].as_array().unwrap();
    assert_eq!(
        spent["output"]["seen"]["budget"],
        json!({"calls_left": 9, "cost_left": 100.0}),
        "{spent}"
    );
    assert_eq!(
        calls[0]["output"]["seen"]["budget"],
        json!({"calls_left": 8, "cost_left": 100.0}),
        "{spent}"
    );
    assert_eq!(
        calls[1]["output"]["seen"]["budget"],
        json!({"calls_left": 7, "cost_left": 40.0}),
        "{spent}"
    );
    assert_eq!(
        calls[0]["budget"],
        json!({"calls_left": 8, "cost_left": 40.0}),
        "after the first: {spent}"
    );
    assert_eq!(
        (&calls[2]["code"], &calls[2]["status"]),
        (&json!("BUDGET_EXHAUSTED"), &json!(402)),
        "{spent}"
    );
    assert_eq!(
        spent["budget"],
        json!({"calls_left": 7, "cost_left": 0.0}),
        "the result envelope: {spent}"
    );
    let after = metrics(&stack).await;
    let spent_on = |text: &str, capability: &str| {
        series(
            text,
            "agent_reach_budget_cost_spent_total",
            &format!("capability=\"{capability}\""),
        )
    };
    assert_eq!(
        spent_on(&after, "cost.b") - spent_on(&before, "cost.b"),
        120.0,
        "{after}"
    );
    assert_eq!(
        spent_on(&after, "cost.a") - spent_on(&before, "cost.a"),
        30.0,
        "{after}"
    );
    let exhausted = |text: &str| {
        series(
            text,
            "agent_reach_router_requests_total",
            "capability=\"cost.b\",outcome=\"BUDGET_EXHAUSTED\"",
        )
    };
    assert_eq!(exhausted(&after) - exhausted(&before), 1.0, "{after}");

    // A budget that names nothing is refused with the field at fault.
    let (status, bad) = call(&stack, "alice", "fan.leaf", json!({"budget": {}})).await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (400, &json!("INVALID_ENVELOPE")),
        "{bad}"
    );
}
