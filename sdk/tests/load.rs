//! Load reporting against the real thing (issue 21, point 5): SDK agents report
//! `busy`/`overloaded` by themselves and on the program's word, their
//! heartbeats' in-flight count reaches the routers through the registry, and
//! routers steer by both. etcd, Redis, the registry and routers are real.

use crate::support;

use std::time::Duration;

use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError, Load, LoadThresholds, StartError, Status};
use agent_reach_testkit::eventually;
use serde_json::{json, Value};
use support::Stack;
use tokio::sync::watch;

/// `demo.hold`: answers once the gate opens, so a test controls what is in flight.
fn hold(gate: watch::Receiver<bool>) -> Handler {
    Handler::new("demo.hold", "1.0.0", move |_ctx: Ctx, _input: Value| {
        let mut gate = gate.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok::<_, HandlerError>(json!("released"))
        }
    })
}

fn echo() -> Handler {
    Handler::new("demo.echo", "1.0.0", |_ctx: Ctx, input: Value| async move {
        Ok::<_, HandlerError>(input)
    })
}

/// Holds one `demo.hold` call open through `router` until the gate opens.
fn hold_call(router: &str) -> tokio::task::JoinHandle<(u16, Value)> {
    let router = router.to_string();
    tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(format!("{router}/v1/invoke"))
            .bearer_auth(support::token("tester"))
            .json(&json!({"capability": "demo.hold", "payload": {}, "timeout_ms": 30_000}))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    })
}

/// Whether `count` calls in a row of `demo.echo` through `router` (with
/// `policy`) were each served by `agent_id` at the first attempt.
async fn all_go_to(stack: &Stack, router: &str, policy: &str, agent_id: &str, count: usize) -> bool {
    for _ in 0..count {
        let (status, result) = stack
            .invoke_on(
                router,
                json!({"capability": "demo.echo", "payload": 1, "target_policy": policy, "timeout_ms": 10_000}),
            )
            .await;
        if status != 200 || result["agent_id"] != agent_id || result["attempts"] != 1 {
            return false;
        }
    }
    true
}

/// Whether four `least_connections` calls of `demo.echo` through `router` reached two instances.
async fn spreads_over_both(stack: &Stack, router: &str) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (_, result) = stack
            .invoke_on(
                router,
                json!({"capability": "demo.echo", "payload": 1, "target_policy": "least_connections"}),
            )
            .await;
        if result["status"] != "succeeded" {
            return false;
        }
        seen.insert(result["agent_id"].as_str().unwrap_or("").to_string());
    }
    seen.len() == 2
}

async fn status_of(stack: &Stack, agent_id: &str) -> (String, u64) {
    let instance = stack.instance(agent_id).await;
    (
        instance["status"].as_str().unwrap_or("").to_string(),
        instance["inflight"].as_u64().unwrap_or(0),
    )
}

/// An SDK agent at its concurrency limit reports `overloaded` by itself (and
/// `busy` on the way up); routers then send it nothing while another instance
/// can take the call: every call lands on the other one at its first attempt
/// (an agent left `ready` would take half of them and refuse each with 503, a
/// second attempt). The program's own report works the same, and an
/// overloaded instance is still the last resort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_at_its_limit_reports_overloaded_and_routers_avoid_it() {
    let stack = Stack::start(1).await;
    let (open, gate) = watch::channel(false);
    let busy = stack
        .agent("busy-a")
        .max_concurrency(2)
        .load_thresholds(LoadThresholds {
            busy: 0.5,
            overloaded: 1.0,
        })
        .handler(hold(gate))
        .handler(echo())
        .start()
        .await
        .unwrap();
    busy.mark_ready();
    let idle = stack.agent("idle-b").handler(echo()).start().await.unwrap();
    idle.mark_ready();
    assert!(
        eventually(Duration::from_secs(10), || async {
            stack.resolvable("demo.echo").await == ["busy-a", "idle-b"]
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            stack.resolvable("demo.hold").await == ["busy-a"]
        })
        .await
    );
    // The router's watch caught up: it routes to both.
    assert!(eventually(Duration::from_secs(10), || spreads_over_both(&stack, stack.router())).await);

    // One of two in flight: busy (at 50 %), still routable.
    let first = hold_call(stack.router());
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "busy-a").await == ("busy".to_string(), 1)
        })
        .await,
        "busy was not reported: {:?}",
        status_of(&stack, "busy-a").await
    );
    assert_eq!(busy.status(), Status::Busy);
    // Two of two: overloaded, with the in-flight count beside it.
    let second = hold_call(stack.router());
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "busy-a").await == ("overloaded".to_string(), 2)
        })
        .await,
        "overloaded was not reported: {:?}",
        status_of(&stack, "busy-a").await
    );
    assert_eq!(busy.status(), Status::Overloaded);
    // The router stops choosing it once its watch shows the status; then never.
    assert!(
        eventually(Duration::from_secs(10), || all_go_to(
            &stack,
            stack.router(),
            "weighted_round_robin",
            "idle-b",
            4
        ))
        .await
    );
    assert!(all_go_to(&stack, stack.router(), "weighted_round_robin", "idle-b", 20).await);

    // The work ends: ready again.
    open.send(true).unwrap();
    for held in [first, second] {
        let (status, result) = held.await.unwrap();
        assert_eq!((status, &result["output"]), (200, &json!("released")), "{result}");
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "busy-a").await == ("ready".to_string(), 0)
        })
        .await
    );

    // Load the SDK cannot see, reported by the program: the same effect.
    let reporter = busy.load_reporter();
    reporter.report(Load::Overloaded);
    assert_eq!(busy.status(), Status::Overloaded);
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "busy-a").await.0 == "overloaded"
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(10), || all_go_to(
            &stack,
            stack.router(),
            "least_connections",
            "idle-b",
            4
        ))
        .await
    );
    // With the other instance gone, the overloaded one is the last resort: served, not refused.
    idle.shutdown().await;
    assert!(
        eventually(Duration::from_secs(10), || all_go_to(
            &stack,
            stack.router(),
            "weighted_round_robin",
            "busy-a",
            3
        ))
        .await,
        "the overloaded instance was not used as the last resort"
    );
    busy.clear_load();
    assert_eq!(busy.status(), Status::Ready);
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "busy-a").await.0 == "ready"
        })
        .await
    );
    // The program's `busy` stays even when the SDK sees no load; the heavier wins.
    busy.report_load(Load::Busy);
    assert_eq!(busy.status(), Status::Busy);
    busy.shutdown().await;
}

/// Two routers share an agent. Calls held through router 1 load instance A;
/// router 0 has nothing in flight there itself, so only A's own report (its
/// heartbeat's in-flight count, stored by the registry, watched by the
/// router) can tell router 0 to send its `least_connections` calls to B.
/// Without it, router 0's tie between two idle-looking instances rotates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_inflight_steers_least_connections_away_from_another_routers_load() {
    let stack = Stack::start(2).await;
    let (open, gate) = watch::channel(false);
    let loaded = stack
        .agent("loaded-a")
        .handler(hold(gate))
        .handler(echo())
        .start()
        .await
        .unwrap();
    loaded.mark_ready();
    let other = stack.agent("other-b").handler(echo()).start().await.unwrap();
    other.mark_ready();
    assert!(
        eventually(Duration::from_secs(10), || async {
            stack.resolvable("demo.echo").await == ["loaded-a", "other-b"]
        })
        .await
    );
    let (router_0, router_1) = (stack.routers[0].clone(), stack.routers[1].clone());
    // Both routers' watches caught up (ties rotate on router 0).
    assert!(eventually(Duration::from_secs(10), || spreads_over_both(&stack, &router_0)).await);
    assert!(eventually(Duration::from_secs(10), || spreads_over_both(&stack, &router_1)).await);

    let held: Vec<_> = (0..3).map(|_| hold_call(&router_1)).collect();
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "loaded-a").await == ("ready".to_string(), 3)
        })
        .await,
        "the heartbeat's in-flight count was not stored: {:?}",
        status_of(&stack, "loaded-a").await
    );
    assert!(
        eventually(Duration::from_secs(10), || all_go_to(
            &stack,
            &router_0,
            "least_connections",
            "other-b",
            5
        ))
        .await,
        "router 0 did not see the load router 1 put on loaded-a"
    );
    assert!(all_go_to(&stack, &router_0, "least_connections", "other-b", 20).await);

    open.send(true).unwrap();
    for call in held {
        assert_eq!(call.await.unwrap().0, 200);
    }
    // Idle again: reported 0, and router 0 spreads its calls over both once more.
    assert!(
        eventually(Duration::from_secs(10), || async {
            status_of(&stack, "loaded-a").await == ("ready".to_string(), 0)
        })
        .await
    );
    assert!(eventually(Duration::from_secs(10), || spreads_over_both(&stack, &router_0)).await);
    loaded.shutdown().await;
    other.shutdown().await;
}

#[tokio::test]
async fn nonsensical_load_thresholds_are_refused_at_start() {
    let refused = Agent::builder("echo_agent", "bad-1")
        .registry("http://127.0.0.1:9")
        .token("token".into())
        .insecure_accept_unverified_calls()
        .load_thresholds(LoadThresholds {
            busy: 0.9,
            overloaded: 0.5,
        })
        .handler(echo())
        .start()
        .await;
    match refused {
        Err(StartError::Config(problem)) => {
            assert!(
                problem.contains("load thresholds need 0 < busy (0.9) <= overloaded (0.5) <= 1"),
                "{problem}"
            )
        }
        other => panic!(
            "expected a configuration error, got {:?}",
            other.map(|agent| agent.agent_id().to_string())
        ),
    }
}
