//! The README's commands: `agent-reach demo` runs the worked example end to
//! end, and `agent-reach dev` prints working URLs and a token.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn demo_prints_every_hop_and_the_answer() {
    let output = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(["demo", "--spread", "12"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for hop in ["intent.parse", "order.query", "shipping.rules", "reply.write"] {
        assert!(stdout.contains(hop), "hop {hop} missing:\n{stdout}");
    }
    assert!(
        stdout.contains("A: Hi u_123, good news: order SO-2024001 ships today"),
        "{stdout}"
    );
    // One trace id across the whole chain.
    let trace = stdout
        .lines()
        .find_map(|line| line.strip_prefix("trace "))
        .expect("trace line")
        .trim()
        .to_string();
    assert_eq!(stdout.matches(trace.as_str()).count(), 5, "{stdout}");
    // 12 questions over weights 3:2:1 → 6/4/2 with smooth weighted round-robin.
    assert!(stdout.contains("order_query-1      6"), "{stdout}");
    assert!(stdout.contains("order_query-3      2"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_prints_working_urls_and_token() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args([
            "dev",
            "--registry-listen",
            "127.0.0.1:0",
            "--router-listen",
            "127.0.0.1:0",
        ])
        .args(["--context-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = KillOnDrop(child);
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let (mut registry, mut router, mut context, mut token) = (None, None, None, None);
    while token.is_none() {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("dev printed no URLs and token within 60 s");
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("registry"), Some(url)) => registry = Some(url.to_string()),
            (Some("router"), Some(url)) => router = Some(url.to_string()),
            (Some("context"), Some(url)) => context = Some(url.to_string()),
            _ => {}
        }
        if let Some(value) = line.trim().strip_prefix("export TOKEN=") {
            token = Some(value.to_string());
        }
    }
    let (registry, router, context, token) = (registry.unwrap(), router.unwrap(), context.unwrap(), token.unwrap());
    let client = reqwest::Client::new();
    // The example agents are registered and routable.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let resolved: Value = client
            .get(format!("{registry}/v1/capabilities/reply.write"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if resolved["instances"]
            .as_array()
            .is_some_and(|instances| !instances.is_empty())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "example agents never became routable"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the printed curl commands do: create a context, then ask.
    let created: Value = client
        .post(format!("{context}/v1/contexts"))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let answer: Value = client
        .post(format!("{router}/v1/invoke"))
        .bearer_auth(&token)
        .json(
            &json!({"capability": "intent.parse", "context_id": created["context_id"],
                      "payload": {"user_id": "u_9", "text": "Can my order SO-2024002 ship today?"}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "succeeded", "{answer}");
    assert!(
        answer["output"]["reply"]
            .as_str()
            .unwrap()
            .contains("does not ship today"),
        "{answer}"
    );
    // Authentication is on in development too.
    let anonymous = client.get(format!("{registry}/v1/agents")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
}
