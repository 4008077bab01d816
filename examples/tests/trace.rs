//! Acceptance 1 of issue 7: a real OTLP/gRPC trace receiver in-process, and a
//! two-hop call — caller → router → agent A (`intent.parse`) → router → agent
//! B (`order.query`) — exported by the same code the services use
//! (`agent_reach_telemetry::otlp`). One trace, correct parent links, and the
//! issue's attributes on the router's and the SDK's spans.
//!
//! One test in its own binary: it installs the process-wide subscriber.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use agent_reach_examples::stack::{Stack, StackOptions};
use agent_reach_examples::{scenario_instances, InstanceSpec, REPLY_MODEL};
use agent_reach_telemetry::otlp;
use agent_reach_testkit::otlp::{Received, Receiver};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::{json, Value};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Which end of a call a span is from (see `find`).
const ROUTER: &str = "router";
const AGENT: &str = "agent";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_hop_call_is_one_trace_with_correct_parents_and_attributes() {
    // The receiver: a real OTLP/gRPC server on loopback.
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint().to_string();

    // Half of the traces that start at the router are kept; a caller's decision is followed.
    // (The SDK reads these when the provider is built; this is the only test in this process.)
    std::env::set_var("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
    std::env::set_var("OTEL_TRACES_SAMPLER_ARG", "0.5");
    // What `agent-reach` does when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    let settings = otlp::Settings::new(endpoint, "agent-reach-test");
    let provider = otlp::tracer_provider(&settings).unwrap();
    tracing_subscriber::registry().with(otlp::layer(&provider)).init();

    // Agent A (intent_parser) calls agent B (order_query), which calls on; the
    // first two hops are what this test checks.
    let agents: Vec<InstanceSpec> = scenario_instances();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start(StackOptions {
        registry_listen: any,
        router_listen: any,
        context_listen: any,
        etcd: Vec::new(),
        redis: None,
        acl: None,
        agents,
    })
    .await
    .unwrap();
    stack
        .wait_until_routable(
            &["intent.parse", "order.query", "shipping.rules", "reply.write"],
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let user = stack.token("demo_user", Duration::from_secs(600)).unwrap();
    let created: Value = client
        .post(format!("{}/v1/contexts", stack.context))
        .bearer_auth(&user)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let context_id = created["context_id"].as_str().unwrap();

    // The caller's own span: the trace starts outside Agent-Reach.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let answer: Value = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(&user)
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(
            &json!({"capability": "intent.parse", "request_id": "req-trace-1", "session_id": "sess-trace-1",
                      "context_id": context_id, "timeout_ms": 10_000,
                      "payload": {"user_id": "u_42", "text": "Can my order SO-2024001 ship today?"}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "succeeded", "{answer}");

    // Spans end as each hop answers; flush until both hops' spans arrived.
    // Router and agent both name a call's span `invoke_agent {capability}`
    // (OpenTelemetry GenAI conventions): the router's names its door.
    let find = |spans: &[Received], side: &str, capability: &str| {
        spans
            .iter()
            .find(|span| {
                span.name == format!("invoke_agent {capability}")
                    && span.attributes.get("capability").map(String::as_str) == Some(capability)
                    && span.attributes.contains_key("door") == (side == ROUTER)
            })
            .cloned()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let flushing = provider.clone();
        // A flush that fails (the receiver not ready yet) is retried by the loop.
        let _ = tokio::task::spawn_blocking(move || flushing.force_flush())
            .await
            .unwrap();
        let spans = receiver.spans();
        let complete = [ROUTER, AGENT]
            .into_iter()
            .flat_map(|side| ["intent.parse", "order.query", "reply.write"].map(|capability| (side, capability)))
            .all(|(side, capability)| find(&spans, side, capability).is_some());
        if complete {
            break spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans did not arrive; got {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by_id: HashMap<&str, &Received> = spans.iter().map(|span| (span.span_id.as_str(), span)).collect();
    let parent_of = |span: &Received| {
        *by_id
            .get(span.parent.as_str())
            .unwrap_or_else(|| panic!("parent of {span:?} was not exported"))
    };

    // Hop 1: caller → router → agent A.
    let router_a = find(&spans, ROUTER, "intent.parse").unwrap();
    assert_eq!(router_a.trace_id, trace_id, "the router continues the caller's trace");
    assert_eq!(
        router_a.parent, caller_span,
        "the router's span is a child of the caller's"
    );
    assert_eq!(router_a.kind, SpanKind::Server as i32);
    for (key, value) in [
        ("request_id", "req-trace-1"),
        ("session_id", "sess-trace-1"),
        ("caller", "demo_user"),
        ("capability.version", "1.0.0"),
        ("policy", "weighted_round_robin"),
        ("trace_id", trace_id),
        // The GenAI conventions' attributes, beside ours.
        ("gen_ai.operation.name", "invoke_agent"),
        ("gen_ai.provider.name", "agent_reach"),
        ("gen_ai.agent.name", "intent.parse"),
        ("gen_ai.agent.id", "intent_parser-1"),
        ("gen_ai.conversation.id", "sess-trace-1"),
    ] {
        assert_eq!(
            router_a.attributes.get(key).map(String::as_str),
            Some(value),
            "{key} on {router_a:?}"
        );
    }
    let agent_a = find(&spans, AGENT, "intent.parse").unwrap();
    for (key, value) in [
        ("gen_ai.operation.name", "invoke_agent"),
        ("gen_ai.agent.name", "intent.parse"),
        ("gen_ai.agent.id", "intent_parser-1"),
        ("gen_ai.conversation.id", "sess-trace-1"),
    ] {
        assert_eq!(
            agent_a.attributes.get(key).map(String::as_str),
            Some(value),
            "{key} on {agent_a:?}"
        );
    }
    // The model usage `reply.write` reports is on its spans at both ends, under the GenAI names.
    let router_reply = find(&spans, ROUTER, "reply.write").unwrap();
    let agent_reply = find(&spans, AGENT, "reply.write").unwrap();
    for span in [&router_reply, &agent_reply] {
        assert_eq!(span.attributes["gen_ai.request.model"], REPLY_MODEL, "{span:?}");
        for key in ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"] {
            assert!(span.attributes[key].parse::<u64>().unwrap() > 0, "{key} on {span:?}");
        }
    }
    assert!(
        !agent_a.attributes.contains_key("gen_ai.usage.input_tokens"),
        "no usage where none was reported"
    );
    let attempt_a = parent_of(&agent_a);
    assert_eq!(
        attempt_a.name, "attempt",
        "agent A's span is a child of the router's attempt"
    );
    assert_eq!(attempt_a.kind, SpanKind::Client as i32);
    assert_eq!(
        attempt_a.parent, router_a.span_id,
        "the attempt is a child of the router's invoke"
    );
    assert_eq!(attempt_a.attributes["agent_id"], "intent_parser-1");
    assert_eq!(attempt_a.attributes["outcome"], "succeeded");
    assert_eq!(attempt_a.attributes["attempt"], "1");
    assert!(attempt_a.attributes["server.address"].starts_with("http://127.0.0.1:"));
    assert_eq!(agent_a.attributes["request_id"], "req-trace-1");
    assert_eq!(agent_a.attributes["agent_id"], "intent_parser-1");
    assert_eq!(agent_a.attributes["http.response.status_code"], "200");
    assert_eq!(agent_a.kind, SpanKind::Server as i32);
    assert!(
        spans
            .iter()
            .any(|span| span.name == "select" && span.parent == router_a.span_id),
        "instance selection is a span under the router's invoke"
    );

    // Agent A's context write (gRPC metadata) joins the trace under its span.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = receiver.spans();
        if spans
            .iter()
            .any(|span| span.name == "grpc.Patch" && span.parent == agent_a.span_id)
        {
            break spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no context span under agent A; got {spans:#?}"
        );
        let flushing = provider.clone();
        // A flush that fails (the receiver not ready yet) is retried by the loop.
        let _ = tokio::task::spawn_blocking(move || flushing.force_flush())
            .await
            .unwrap();
    };
    let by_id: HashMap<&str, &Received> = spans.iter().map(|span| (span.span_id.as_str(), span)).collect();
    let parent_of = |span: &Received| {
        *by_id
            .get(span.parent.as_str())
            .unwrap_or_else(|| panic!("parent of {span:?} was not exported"))
    };
    let patch = spans
        .iter()
        .find(|span| span.name == "grpc.Patch" && span.parent == agent_a.span_id)
        .unwrap();
    assert!(
        spans
            .iter()
            .any(|span| span.name == "context.patch" && span.parent == patch.span_id),
        "the context operation is a span under the gRPC call"
    );

    // Hop 2: agent A → router → agent B, in the same trace.
    let router_b = find(&spans, ROUTER, "order.query").unwrap();
    assert_eq!(
        router_b.parent, agent_a.span_id,
        "agent A's call is the parent of the router's second span"
    );
    assert_eq!(router_b.attributes["caller"], "intent_parser");
    assert_eq!(
        router_b.attributes["session_id"], "sess-trace-1",
        "the session travels with the call"
    );
    assert_eq!(router_b.attributes["capability.version"], "1.2.0");
    let agent_b = find(&spans, AGENT, "order.query").unwrap();
    let attempt_b = parent_of(&agent_b);
    assert_eq!(attempt_b.parent, router_b.span_id);
    assert!(attempt_b.attributes["agent_id"].starts_with("order_query-"));
    assert_eq!(agent_b.attributes["agent_id"], attempt_b.attributes["agent_id"]);

    // Registration: the SDK's span is the parent of the registry's, over gRPC metadata.
    // Each registration is a trace of its own, kept or dropped whole by the 50 %
    // sampler set above (all of them dropped in ~2 % of runs): every kept one has
    // both spans, linked.
    let registrations: Vec<&Received> = spans.iter().filter(|span| span.name == "grpc.Register").collect();
    for register in &registrations {
        assert!(
            by_id
                .get(register.parent.as_str())
                .is_some_and(|parent| parent.name == "agent.register" && parent.trace_id == register.trace_id),
            "a registry span is a child of the SDK's agent.register span: {register:?}"
        );
    }
    for sdk in spans.iter().filter(|span| span.name == "agent.register") {
        assert!(
            registrations.iter().any(|register| register.parent == sdk.span_id),
            "a kept registration reaches the registry in the same trace: {sdk:?}"
        );
    }

    for span in [&router_a, attempt_a, &agent_a, &router_b, attempt_b, &agent_b] {
        assert_eq!(span.trace_id, trace_id, "one trace: {span:?}");
    }
    assert!(receiver.services().iter().all(|name| name == "agent-reach-test"));

    // An MCP `tools/call` is the GenAI conventions' `execute_tool {tool}`.
    let tool_trace = "7af7651916cd43dd8448eb211c80319c";
    let called: Value = client
        .post(format!("{}/mcp", stack.router))
        .bearer_auth(&user)
        .header("accept", "application/json, text/event-stream")
        .header("traceparent", format!("00-{tool_trace}-{caller_span}-01"))
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "intent.parse",
                                 "arguments": {"user_id": "u_42", "text": "Can my order SO-2024001 ship today?"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(called["result"].is_object(), "{called}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let tool = loop {
        let flushing = provider.clone();
        // A flush that fails is retried by the loop.
        let _ = tokio::task::spawn_blocking(move || flushing.force_flush())
            .await
            .unwrap();
        if let Some(span) = receiver
            .spans()
            .into_iter()
            .find(|span| span.trace_id == tool_trace && span.parent == caller_span)
        {
            break span;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no MCP request span for {called}; got {:#?}",
            receiver
                .spans()
                .iter()
                .filter(|span| span.trace_id == tool_trace)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(tool.name, "execute_tool intent.parse", "{tool:?}");
    for (key, value) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "intent.parse"),
        ("door", "mcp"),
    ] {
        assert_eq!(
            tool.attributes.get(key).map(String::as_str),
            Some(value),
            "{key} on {tool:?}"
        );
    }

    // Head sampling. A caller's unsampled trace stays unsampled at every hop; a
    // trace starting at the router is kept or dropped as a whole, decided once on
    // its trace id before any span is built.
    let call = |request_id: String, traceparent: Option<String>| {
        let mut request = client
            .post(format!("{}/v1/invoke", stack.router))
            .bearer_auth(&user)
            .json(&json!({"capability": "intent.parse", "request_id": request_id, "context_id": context_id,
                          "timeout_ms": 10_000, "payload": {"user_id": "u_42", "text": "Can my order SO-2024001 ship today?"}}));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        async move {
            let answer: Value = request.send().await.unwrap().json().await.unwrap();
            assert_eq!(answer["status"], "succeeded", "{answer}");
        }
    };
    let unsampled_trace = "5bf92f3577b34da6a3ce929d0e0e4736";
    call(
        "req-unsampled".to_string(),
        Some(format!("00-{unsampled_trace}-{caller_span}-00")),
    )
    .await;
    const ROOTS: usize = 16;
    for index in 0..ROOTS {
        call(format!("req-root-{index}"), None).await;
    }
    // Every span of those calls ended before its answer was sent; export them all.
    let flushing = provider.clone();
    // What arrived is checked below, whatever the flush answers.
    let _ = tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .unwrap();
    let spans = receiver.spans();
    assert!(
        spans.iter().all(|span| span.trace_id != unsampled_trace),
        "a trace the caller did not sample was exported"
    );
    let with_request = |side: &str, request_id: &str| {
        spans
            .iter()
            .find(|span| {
                span.name == "invoke_agent intent.parse"
                    && span.attributes.contains_key("door") == (side == ROUTER)
                    && span.attributes.get("request_id").map(String::as_str) == Some(request_id)
            })
            .cloned()
    };
    let mut kept = 0;
    for index in 0..ROOTS {
        let request_id = format!("req-root-{index}");
        match (with_request(ROUTER, &request_id), with_request(AGENT, &request_id)) {
            (Some(router), Some(agent)) => {
                kept += 1;
                assert_eq!(router.parent, "", "a trace started by the router has it as root");
                assert_eq!(
                    router.attributes["trace_id"], router.trace_id,
                    "the span has the trace id the router decided on"
                );
                assert_eq!(agent.trace_id, router.trace_id, "one trace for {request_id}");
            }
            (None, None) => {}
            (router, agent) => panic!("{request_id} was half sampled: router {router:?}, agent {agent:?}"),
        }
    }
    // 16 fair coin flips: all alike has a 1 in 32,768 chance.
    assert!(
        0 < kept && kept < ROOTS,
        "{kept} of {ROOTS} root traces kept at ratio 0.5"
    );
    stack.shutdown().await;
}
