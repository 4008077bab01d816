//! The README's first command: `agent-reach dev` starts, prints a working URL
//! and token, and the printed registry accepts a registration.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_prints_a_working_registry_and_token() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(["dev", "--registry-listen", "127.0.0.1:0"])
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
    let mut registry = None;
    let mut token = None;
    while registry.is_none() || token.is_none() {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("dev printed no URL and token within 60 s");
        if let Some(url) = line.trim().strip_prefix("registry") {
            registry = url.split_whitespace().next().map(str::to_string);
        }
        if let Some(value) = line.trim().strip_prefix("export TOKEN=") {
            token = Some(value.to_string());
        }
    }
    let (registry, token) = (registry.unwrap(), token.unwrap());
    let client = reqwest::Client::new();
    let registered = client
        .post(format!("{registry}/v1/agents"))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "agent_id": "order_query-1", "name": "order_query", "endpoint": "http://127.0.0.1:9101/invoke",
            "status": "ready", "capabilities": [{"name": "order.query", "version": "1.2.0"}]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 201);
    let resolved: serde_json::Value = client
        .get(format!("{registry}/v1/capabilities/order.query"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resolved["instances"][0]["agent_id"], "order_query-1");
    // Authentication is on in development too.
    let anonymous = client.get(format!("{registry}/v1/agents")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
}
