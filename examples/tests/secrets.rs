//! Issue 20, point 5: tokens and assertions never appear in logs. The whole
//! stack (registry, router, context service, the four example agents, which
//! verify the router's assertions) runs with every crate logging at `debug`
//! into memory; the test makes successful calls, context writes, and every
//! kind of refused call (bad, expired and forged tokens, a forged envelope
//! posted straight to an agent, a credential field written to context), then
//! greps everything logged for the tokens it sent, for any JWT at all, and for
//! the HS256 secret and the assertion key.
//!
//! One test in its own binary: it installs the process-wide subscriber.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_examples::scenario_instances;
use agent_reach_examples::stack::{Stack, StackOptions};
use serde_json::{json, Value};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

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

/// Every JWT starts with a base64url `{"` header: `eyJ`, then more base64url, a dot.
fn jwt_like(text: &str) -> Option<&str> {
    text.match_indices("eyJ").find_map(|(at, _)| {
        let rest = &text[at..];
        let header: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        (header.len() >= 12 && rest[header.len()..].starts_with('.')).then(|| &rest[..header.len().min(40)])
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_assertion_is_ever_logged() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("debug"))
        .with(agent_reach_telemetry::logs::json_layer(move || writer.clone()))
        .init();

    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start(StackOptions {
        registry_listen: any,
        router_listen: any,
        context_listen: any,
        etcd: Vec::new(),
        redis: None,
        acl: None,
        agents: scenario_instances(),
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
    let caller = stack.token("demo_user", Duration::from_secs(600)).unwrap();
    let mut sent = vec![caller.clone()];

    // A context and the whole chain: every hop carries a token or an assertion.
    let created: Value = client
        .post(format!("{}/v1/contexts", stack.context))
        .bearer_auth(&caller)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let context_id = created["context_id"].as_str().unwrap().to_string();
    for question in ["Can my order SO-2024001 ship today?", "Where is SO-2024002?"] {
        let answer: Value = client
            .post(format!("{}/v1/invoke", stack.router))
            .bearer_auth(&caller)
            .json(
                &json!({"capability": "intent.parse", "context_id": context_id, "timeout_ms": 10_000,
                          "payload": {"user_id": "u_42", "text": question}}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "succeeded", "{answer}");
    }

    // Refused: a forged token, an expired one, a token in the wrong place.
    let forged = agent_reach_access::token::issue_hs256(
        "demo_user",
        b"not-the-secret-not-the-secret-0123456789",
        Duration::from_secs(60),
    )
    .unwrap();
    let secret = std::fs::read_to_string(&stack.secret_file).unwrap();
    let an_hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    let expired =
        agent_reach_access::token::issue_hs256_at("demo_user", secret.trim().as_bytes(), an_hour_ago - 60, an_hour_ago)
            .unwrap();
    sent.extend([forged.clone(), expired.clone()]);
    for token in [&forged, &expired] {
        let status = client
            .post(format!("{}/v1/invoke", stack.router))
            .bearer_auth(token)
            .json(&json!({"capability": "intent.parse", "payload": {}}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 401);
        let status = client
            .post(format!("{}/v1/agents", stack.registry))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 401);
    }
    let status = client
        .post(format!("{}/v1/invoke", stack.router))
        .header("authorization", format!("Token {caller}"))
        .json(&json!({"capability": "intent.parse", "payload": {}}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401);

    // A forged envelope straight to an agent, with a caller's token as its "assertion".
    let endpoint = stack.agents[0].local_addr();
    let status = client
        .post(format!("http://{endpoint}/invoke"))
        .bearer_auth(&caller)
        .json(
            &json!({"version": "1.0", "request_id": "forged-1", "capability": "intent.parse",
                      "capability_version": "1.0.0", "source": "demo_user", "priority": "normal",
                      "deadline": 9_999_999_999_999u64, "attempt": 1, "payload": {}}),
        )
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401);

    // A credential written to context is refused, and its value not echoed.
    let refused: Value = client
        .patch(format!("{}/v1/contexts/{context_id}", stack.context))
        .bearer_auth(stack.token("intent_parser", Duration::from_secs(60)).unwrap())
        .json(&json!({"set": {"github_token": "ghp_do_not_log_me"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refused["error"]["code"], "CREDENTIAL_FIELD", "{refused}");
    assert!(!refused.to_string().contains("ghp_do_not_log_me"), "{refused}");

    let key = std::fs::read_to_string(&stack.assertion_key_file).unwrap();
    stack.shutdown().await;
    let logged = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.lines().count() > 50,
        "the stack logged at debug: {} lines",
        logged.lines().count()
    );
    for token in &sent {
        assert!(!logged.contains(token.as_str()), "a token was logged");
        // Not even its signature part.
        let signature = token.rsplit('.').next().unwrap();
        assert!(!logged.contains(signature), "a token's signature was logged");
    }
    if let Some(found) = jwt_like(&logged) {
        let line = logged.lines().find(|line| line.contains(found)).unwrap_or_default();
        panic!("a JWT (a token or an assertion) was logged: {line}");
    }
    assert!(!logged.contains(secret.trim()), "the HS256 secret was logged");
    let key_body: String = key.lines().filter(|line| !line.starts_with("-----")).collect();
    assert!(!logged.contains(&key_body), "the assertion key was logged");
    assert!(
        !logged.contains("ghp_do_not_log_me"),
        "a refused credential value was logged"
    );
}
