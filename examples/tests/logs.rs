//! Acceptance 4 of issue 7: the JSON log lines of a failed request carry
//! `trace_id`, `request_id` and `session_id` — the line reporting the failure
//! and the lines logged while serving it (through the router's request span).
//!
//! One test in its own binary: it installs the process-wide subscriber.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_examples::stack::{Stack, StackOptions};
use serde_json::{json, Value};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Log lines captured in memory.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn lines(&self) -> Vec<Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}")))
            .collect()
    }
}

/// Only `ghost.echo`, served by an instance nobody listens for: every call fails.
const ACL: &str = "version: 1
permissions:
  - caller: demo_user
    allow: [ghost.echo]
providers:
  - agent: ghost
    provides: [ghost.echo]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_logs_trace_request_and_session_ids_on_every_line() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new(
            "warn,agent_reach_router=debug,agent_reach_pipeline=debug",
        ))
        .with(agent_reach_telemetry::logs::json_layer(move || writer.clone()))
        .init();

    let workdir = tempfile::tempdir().unwrap();
    let acl = workdir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start(StackOptions {
        registry_listen: any,
        router_listen: any,
        context_listen: any,
        etcd: Vec::new(),
        redis: None,
        acl: Some(acl),
        agents: Vec::new(),
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let registered = client
        .post(format!("{}/v1/agents", stack.registry))
        .bearer_auth(stack.token("ghost", Duration::from_secs(600)).unwrap())
        .json(&json!({
            "agent_id": "ghost-1", "name": "ghost", "endpoint": format!("http://{closed}"),
            "ttl_s": 60, "status": "ready", "capabilities": [{"name": "ghost.echo", "version": "1.0.0"}]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status().as_u16(), 201);
    stack
        .wait_until_routable(&["ghost.echo"], Duration::from_secs(20))
        .await
        .unwrap();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let answer: Value = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(stack.token("demo_user", Duration::from_secs(60)).unwrap())
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .json(
            &json!({"capability": "ghost.echo", "request_id": "req-logs-1", "session_id": "sess-logs-1",
                      "timeout_ms": 5_000, "payload": {}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "failed", "{answer}");

    let lines: Vec<Value> = buffer
        .lines()
        .into_iter()
        .filter(|line| line["request_id"] == "req-logs-1")
        .collect();
    let message = |text: &str| {
        lines
            .iter()
            .find(|line| line["message"] == text)
            .unwrap_or_else(|| panic!("no `{text}` line among {lines:#?}"))
    };
    // The failure itself, and a line logged inside the request span while retrying.
    let failed = message("Invocation failed.");
    assert_eq!(failed["code"], answer["error"]["code"]);
    message("Attempt failed; may retry.");
    for line in &lines {
        assert_eq!(line["trace_id"], trace_id, "{line}");
        assert_eq!(line["session_id"], "sess-logs-1", "{line}");
    }

    // Refused before the body is read: still all three keys (a fresh request id, no session).
    let refused = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth("not-a-token")
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .json(&json!({"capability": "ghost.echo", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let lines = buffer.lines();
    let line = lines
        .iter()
        .find(|line| line["message"] == "Unauthenticated call refused.")
        .unwrap_or_else(|| panic!("no refusal line among {lines:#?}"));
    assert_eq!(line["trace_id"], trace_id);
    assert!(line["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{line}");
    assert_eq!(line["session_id"], "");
    stack.shutdown().await;
}
