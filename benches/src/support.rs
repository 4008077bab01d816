//! What the benches share: child processes (this binary re-executed as a
//! registry or router), bounded waits, a JSON agent, registration with
//! heartbeats. Included by `#[path]` from each bench binary that uses it
//! (router-bench still carries its own copies).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

/// A child process killed on drop.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server stopped with SIGTERM on drop, then killed if it has not exited
/// within five seconds: a server with children of its own (nginx's workers)
/// stops them on SIGTERM, while SIGKILL would leave them running.
pub struct TerminatedGuard(pub Child);

impl Drop for TerminatedGuard {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) with the pid of a child this process spawned and has not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if matches!(self.0.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], agent_reach_testkit::free_port()))
}

/// This binary again, in `mode` (its `main` dispatches on it).
pub fn spawn_self(mode: &str, args: &[String]) -> anyhow::Result<ChildGuard> {
    let child = Command::new(std::env::current_exe()?)
        .arg(mode)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {mode}"))?;
    Ok(ChildGuard(child))
}

/// Polls `ok` until it holds, at most `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut ok: impl AsyncFnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what} not ready within {timeout:?}")
}

/// A listener with Nagle's algorithm off, as proxies have it.
pub fn nodelay(listener: tokio::net::TcpListener) -> impl axum::serve::Listener<Addr = SocketAddr> {
    use axum::serve::ListenerExt as _;
    listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

async fn json_agent(body: axum::body::Bytes) -> impl axum::response::IntoResponse {
    let _ = body.len();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        r#"{"output":{"status":"paid","ships_today":true}}"#,
    )
}

/// An agent answering every call at once with a small JSON output.
pub async fn start_json_agent() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().route("/invoke", axum::routing::post(json_agent));
    tokio::spawn(async move { axum::serve(nodelay(listener), app).await });
    Ok(addr)
}

/// Registers `id` (agent `name`, one capability taking `{order_id}`) with
/// `token` and keeps its lease alive for the rest of the run.
pub async fn register(
    client: &reqwest::Client,
    registry: &str,
    token: &str,
    (id, name): (&str, &str),
    endpoint: String,
    capability: &str,
) -> anyhow::Result<()> {
    let body = json!({
        "agent_id": id, "name": name, "endpoint": endpoint,
        "weight": 1, "ttl_s": 30, "status": "ready",
        "capabilities": [{
            "name": capability, "version": "1.0.0",
            "input_schema": { "type": "object", "required": ["order_id"], "properties": { "order_id": { "type": "string" } } }
        }]
    });
    let response = client
        .post(format!("{registry}/v1/agents"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("registration of {id} failed: {}", response.text().await?);
    }
    let answer: serde_json::Value = response.json().await?;
    let lease = answer["lease_id"].as_i64().context("lease_id")?;
    let (client, registry, id, token) = (client.clone(), registry.to_string(), id.to_string(), token.to_string());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let _ = client
                .put(format!("{registry}/v1/agents/{id}/heartbeat"))
                .bearer_auth(&token)
                .json(&json!({ "lease_id": lease }))
                .send()
                .await;
        }
    });
    Ok(())
}

/// The `q` quantile (0..=1) of `sorted`, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
