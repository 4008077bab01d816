//! A streamed call runs through the same attempt loop as a call answered
//! whole (issue 33): the same request span with a `select` and an `attempt`
//! span per attempt (exported over OTLP to a real receiver), the same retry
//! metrics, and the same record under `GET /v1/requests/{id}`, with real
//! etcd, a real registry and real HTTP agents, one of which always answers
//! 503 so that some calls are retried.
//!
//! One test in its own binary: it installs the process-wide subscriber and
//! span recorder.

mod support;

use std::time::Duration;

use agent_reach_telemetry::otlp;
use agent_reach_testkit::otlp::{Received, Receiver};
use serde_json::{json, Value};
use support::*;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// `agent_reach_router_retries_total{reason="unavailable_503"}`.
fn unavailable_retries(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|line| line.starts_with("agent_reach_router_retries_total{reason=\"unavailable_503\"}"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

/// One call with `request_id` to `version`, streamed or not, read to its
/// end; its record in the recent calls, once it is there.
async fn call(cluster: &Cluster, request_id: &str, (version, streamed): (&str, bool)) -> Value {
    let mut envelope = order("SO-t");
    envelope["request_id"] = json!(request_id);
    envelope["capability_version"] = json!(format!("={version}"));
    let mut request = cluster.client.post(cluster.url("/v1/invoke")).json(&envelope);
    if streamed {
        request = request.header("accept", "text/event-stream");
    }
    let response = request.bearer_auth(token(CALLER)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    assert!(!body.contains("event: error") && !body.contains("\"failed\""), "{body}");
    // A stream is recorded once it ended: a moment after its last byte.
    let url = cluster.url(&format!("/v1/requests/{request_id}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let response = cluster.client.get(&url).bearer_auth(token("ops")).send().await.unwrap();
        if response.status() == 200 {
            let found: Value = response.json().await.unwrap();
            return found["calls"][0].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no record of {request_id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The request span of `request_id` and its children, once exported.
async fn spans_of(
    flush: impl Fn() + Clone + Send + 'static,
    receiver: &Receiver,
    request_id: &str,
) -> (Received, Vec<Received>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        tokio::task::spawn_blocking(flush.clone()).await.unwrap();
        let spans = receiver.spans();
        let request = spans
            .iter()
            .find(|span| {
                span.name.starts_with("invoke_agent ")
                    && span.attributes.get("request_id").map(String::as_str) == Some(request_id)
            })
            .cloned();
        if let Some(request) = request {
            let children: Vec<Received> = spans
                .iter()
                .filter(|span| span.parent == request.span_id)
                .cloned()
                .collect();
            if children.iter().filter(|span| span.name == "attempt").count() >= 2 {
                return (request, children);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request span with two attempts for {request_id}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a call's spans say, in order: (name, outcome, retry reason) of each child.
fn shape(children: &[Received]) -> Vec<(String, String, String)> {
    let mut shape: Vec<(String, String, String)> = children
        .iter()
        .map(|span| {
            let attribute = |key: &str| span.attributes.get(key).cloned().unwrap_or_default();
            (
                format!("{} #{}", span.name, attribute("attempt")),
                attribute("outcome"),
                attribute("retry.reason"),
            )
        })
        .collect();
    shape.sort();
    shape
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_are_traced_retried_and_recorded_as_calls_answered_whole() {
    let receiver = Receiver::start().await;
    let provider = otlp::tracer_provider(&otlp::Settings::new(receiver.endpoint().to_string(), "router-test")).unwrap();
    tracing_subscriber::registry().with(otlp::layer(&provider)).init();

    // A pair of instances per way of answering (each pinned to its version),
    // one of each always unavailable: a first call that picks it is retried
    // on the other (the breaker never opens here).
    let cluster = Cluster::start_with(|settings| settings.tuning.breaker_failures = 1000).await;
    let mut agents = Vec::new();
    for (version, pair) in [("1.0.0", "a"), ("2.0.0", "b")] {
        for (id, behaviour) in [
            (format!("down{pair}-1"), Behaviour::Unavailable),
            (format!("up{pair}-1"), Behaviour::Stream),
        ] {
            let mut spec = AgentSpec::new(&id, 1, behaviour);
            spec.version = version.to_string();
            agents.push(cluster.agent(spec));
        }
    }
    cluster
        .wait_for_instances(&["downa-1", "downb-1", "upa-1", "upb-1"])
        .await;

    let before = unavailable_retries(&cluster.metrics().await);
    // Before any outcome both instances weigh the same: the first pick takes
    // the unavailable one (later ones avoid it: passive health).
    let mut retried = Vec::new();
    for (version, streamed) in [("1.0.0", false), ("2.0.0", true)] {
        let mut found = None;
        for n in 0..4 {
            let request_id = format!("{}-{n}", if streamed { "streamed" } else { "whole" });
            let record = call(&cluster, &request_id, (version, streamed)).await;
            if record["attempts"].as_array().map_or(0, Vec::len) == 2 {
                found = Some((request_id, record));
                break;
            }
        }
        retried.push(found.expect("one of four calls was retried"));
    }
    let after = unavailable_retries(&cluster.metrics().await);
    assert!(
        after - before >= 2.0,
        "retries counted for both calls: {before} -> {after}"
    );

    // The same record: two attempts, the 503 then the success, the call succeeded.
    let summary = |record: &Value| {
        let attempts: Vec<(String, String)> = record["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|attempt| {
                (
                    attempt["agent_id"].as_str().unwrap().to_string(),
                    attempt["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        // The two pairs differ only in their versions and instance names.
        let attempts: Vec<(String, String)> = attempts
            .into_iter()
            .map(|(agent, outcome)| (agent.replace(['a', 'b'], ""), outcome))
            .collect();
        json!({
            "capability": record["capability"], "caller": record["caller"], "entry": record["entry"],
            "outcome": record["outcome"], "attempts": attempts,
        })
    };
    let (whole, streamed) = (&retried[0], &retried[1]);
    assert_eq!(summary(&whole.1), summary(&streamed.1));
    assert_eq!(
        summary(&streamed.1)["attempts"],
        json!([["down-1", "unavailable_503"], ["up-1", "succeeded"]])
    );
    assert_eq!(streamed.1["capability_version"], "2.0.0");

    // The same spans: under the request's span, a select and an attempt per attempt.
    let flush = move || {
        // A flush that fails (the receiver not ready yet) is retried by the polling.
        let _ = provider.force_flush();
    };
    let (whole_span, whole_children) = spans_of(flush.clone(), &receiver, &whole.0).await;
    let (streamed_span, streamed_children) = spans_of(flush, &receiver, &streamed.0).await;
    assert_eq!(shape(&whole_children), shape(&streamed_children));
    assert_eq!(
        shape(&streamed_children),
        [
            (
                "attempt #1".to_string(),
                "retryable".to_string(),
                "unavailable_503".to_string()
            ),
            ("attempt #2".to_string(), "succeeded".to_string(), String::new()),
            ("select #1".to_string(), String::new(), String::new()),
            ("select #2".to_string(), String::new(), String::new()),
        ]
    );
    assert_eq!(whole_span.attributes["door"], "invoke");
    assert_eq!(streamed_span.attributes["door"], "stream");
    assert_eq!(streamed_span.attributes["capability.version"], "2.0.0");
    // Both doors' request spans are the GenAI conventions' `invoke_agent {capability}`.
    for span in [&whole_span, &streamed_span] {
        assert_eq!(span.name, format!("invoke_agent {}", span.attributes["capability"]));
        assert_eq!(span.attributes["gen_ai.operation.name"], "invoke_agent");
        assert_eq!(span.attributes["gen_ai.agent.name"], span.attributes["capability"]);
        // The instance that answered (`upa-1` or `upb-1`, one per way of answering).
        assert!(span.attributes["gen_ai.agent.id"].starts_with("up"), "{span:?}");
    }
}
