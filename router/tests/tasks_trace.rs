//! A delivered task is traced like a call: the worker's `tasks.deliver` span
//! is the parent of the router's `select` and `attempt` spans for that
//! delivery, exported over OTLP/gRPC (the services' own exporter) to a real
//! receiver, with the task on real Redis, the registry on real etcd and a real
//! HTTP agent.
//!
//! One test in its own binary: it installs the process-wide subscriber and
//! span recorder.

mod support;

use std::time::Duration;

use agent_reach_telemetry::otlp;
use agent_reach_testkit::otlp::{Received, Receiver};
use serde_json::json;
use support::{cluster_with_tasks, post, AgentSpec, Behaviour};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_delivery_is_the_parent_of_its_selection_and_attempt_spans() {
    let receiver = Receiver::start().await;
    // What `agent-reach router` does when OTEL_EXPORTER_OTLP_ENDPOINT is set
    // (no sampler variable: every trace is kept).
    let provider = otlp::tracer_provider(&otlp::Settings::new(receiver.endpoint().to_string(), "router-test")).unwrap();
    tracing_subscriber::registry().with(otlp::layer(&provider)).init();

    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let _agent = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;

    let envelope = json!({"capability": "order.query", "request_id": "traced-task-1", "session_id": "sess-t",
                          "payload": {"order_id": "SO-1"}});
    let (_, submitted) = post(&cluster, "/v1/tasks", envelope).await;
    let task_id = submitted["task_id"].as_str().unwrap().to_string();

    // Flush until the delivery's span and its children have arrived (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (deliver, spans) = loop {
        let flushing = provider.clone();
        // A flush that fails (the receiver not ready yet) is retried by the loop.
        let _ = tokio::task::spawn_blocking(move || flushing.force_flush())
            .await
            .unwrap();
        let spans = receiver.spans();
        let deliver = spans
            .iter()
            .find(|span| span.name == "tasks.deliver" && span.attributes.get("task_id") == Some(&task_id))
            .cloned();
        if let Some(deliver) = deliver {
            let children = |name: &str| {
                spans
                    .iter()
                    .any(|span| span.name == name && span.parent == deliver.span_id)
            };
            if children("select") && children("attempt") {
                break (deliver, spans);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tasks.deliver span with select and attempt children for {task_id}; got {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let under_deliver: Vec<&Received> = spans.iter().filter(|span| span.parent == deliver.span_id).collect();
    for span in &under_deliver {
        assert_eq!(span.trace_id, deliver.trace_id, "one trace per delivery: {span:?}");
    }
    let attempt = under_deliver.iter().find(|span| span.name == "attempt").unwrap();
    assert_eq!(attempt.attributes["agent_id"], "echo-1");
    assert_eq!(attempt.attributes["outcome"], "succeeded");
    assert_eq!(attempt.attributes["attempt"], "1");
    assert!(
        receiver.services().iter().all(|name| name == "router-test"),
        "{:?}",
        receiver.services()
    );
}
