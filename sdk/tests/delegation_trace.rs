//! The traces record the delegation chain (issue 39, point 1): each chained
//! call's request span on the router carries `agent_reach.chain`,
//! `agent_reach.on_behalf_of` and `agent_reach.depth`, exported over
//! OTLP/gRPC to a real receiver; the agents are SDK agents, the registry on
//! real etcd.
//!
//! One test in its own binary: it installs the process-wide subscriber and
//! span recorder.

mod support;

use std::time::Duration;

use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError};
use agent_reach_telemetry::otlp;
use agent_reach_testkit::otlp::Receiver;
use serde_json::{json, Value};
use support::{token, Stack};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const ACL: &str = r#"
version: 1
permissions:
  - caller: alice
    allow: [intent.parse]
  - caller: intent_parser
    allow: [order.query]
  - caller: order_query
    allow: [payment.check]
    via: [intent_parser]
providers:
  - agent: intent_parser
    provides: [intent.parse]
  - agent: order_query
    provides: [order.query]
  - agent: payment
    provides: [payment.check]
"#;

/// `capability`, calling `next` (if any) and answering its output.
fn step(capability: &str, next: Option<&'static str>) -> Handler {
    Handler::new(capability, "1.0.0", move |ctx: Ctx, _input: Value| async move {
        match next {
            Some(next) => ctx.call::<Value>(next, json!({})).await.map_err(HandlerError::from),
            None => Ok(json!({"chain": ctx.chain()})),
        }
    })
}

async fn start(stack: &Stack, name: &str, agent_id: &str, handler: Handler) -> Agent {
    let agent = Agent::builder(name, agent_id)
        .registry(&stack.registry)
        .router(stack.router())
        .token(token(name))
        .ttl_s(5)
        .handler(handler)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_chained_calls_span_names_the_chain_and_whom_it_acts_for() {
    let receiver = Receiver::start().await;
    let provider = otlp::tracer_provider(&otlp::Settings::new(receiver.endpoint().to_string(), "router-test")).unwrap();
    tracing_subscriber::registry().with(otlp::layer(&provider)).init();

    let stack = Stack::start_with(1, ACL, |_, _| {}).await;
    let _intent = start(
        &stack,
        "intent_parser",
        "ip-1",
        step("intent.parse", Some("order.query")),
    )
    .await;
    let _order = start(
        &stack,
        "order_query",
        "oq-1",
        step("order.query", Some("payment.check")),
    )
    .await;
    let _payment = start(&stack, "payment", "pay-1", step("payment.check", None)).await;

    let body = json!({"capability": "intent.parse", "payload": {}, "timeout_ms": 10_000});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, answer) = stack.invoke_as(stack.router(), "alice", &[], body.clone()).await;
        if status == 200 {
            assert_eq!(
                answer["output"]["chain"],
                json!(["alice", "intent_parser", "order_query"]),
                "{answer}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the chain never answered: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Flush until the router's spans of the chained calls have arrived (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let flushing = provider.clone();
        // A flush that fails (the receiver not ready yet) is retried by the loop.
        let _ = tokio::task::spawn_blocking(move || flushing.force_flush())
            .await
            .unwrap();
        let spans = receiver.spans();
        let chained = |chain: &str| {
            spans
                .iter()
                .find(|span| span.attributes.get("agent_reach.chain").map(String::as_str) == Some(chain))
                .cloned()
        };
        if let (Some(second), Some(third)) = (
            chained("alice > intent_parser"),
            chained("alice > intent_parser > order_query"),
        ) {
            assert!(second.name.ends_with("order.query"), "{second:?}");
            assert!(third.name.ends_with("payment.check"), "{third:?}");
            for (span, depth) in [(&second, "2"), (&third, "3")] {
                assert_eq!(span.attributes["agent_reach.on_behalf_of"], "alice", "{span:?}");
                assert_eq!(span.attributes["agent_reach.depth"], depth, "{span:?}");
            }
            // The first call is the chain's start: a direct call carries no chain attribute.
            assert!(
                spans
                    .iter()
                    .filter(|span| span.name.ends_with("intent.parse"))
                    .all(|span| !span.attributes.contains_key("agent_reach.chain")),
                "{spans:#?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request spans with the chain; got {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
