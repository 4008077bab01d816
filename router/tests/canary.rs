//! Canary releases (issue 21, point 2) against a real etcd, a real registry
//! and real HTTP agents: an operator's traffic split reaches the router
//! through the registry's Watch and splits unpinned calls by weight; a canary
//! that cannot take calls never blackholes them; pinned calls ignore the
//! split; clearing it returns to highest-version routing; a live weight
//! change shifts traffic without the agent registering again.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn ops() -> String {
    token("ops")
}

fn version_of(body: &Value) -> String {
    body["capability_version"].as_str().unwrap_or_default().to_string()
}

fn spec(agent_id: &str, version: &str, status: &str) -> AgentSpec {
    let mut spec = AgentSpec::new(agent_id, 1, Behaviour::Echo);
    spec.version = version.to_string();
    spec.status = status.to_string();
    spec
}

/// `PUT /v1/capabilities/{CAPABILITY}/split` as the operator; the registry's answer.
async fn set_split(cluster: &Cluster, weights: Value) -> Value {
    let response = reqwest::Client::new()
        .put(format!("{}/v1/capabilities/{CAPABILITY}/split", cluster.registry.url()))
        .bearer_auth(ops())
        .json(&json!({ "weights": weights }))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "split refused: {body}");
    body
}

async fn clear_split(cluster: &Cluster) {
    let response = reqwest::Client::new()
        .delete(format!("{}/v1/capabilities/{CAPABILITY}/split", cluster.registry.url()))
        .bearer_auth(ops())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
}

/// Waits until the router's snapshot applies `expected` as the split.
async fn wait_for_split(cluster: &Cluster, expected: Option<Vec<(&str, u32)>>) {
    let expected: Option<Vec<(String, u32)>> = expected.map(|shares| {
        shares
            .into_iter()
            .map(|(version, weight)| (version.to_string(), weight))
            .collect()
    });
    let router = cluster.router.clone();
    let applied = eventually(Duration::from_secs(10), || {
        let (router, expected) = (router.clone(), expected.clone());
        async move { router.routed_split(CAPABILITY) == expected }
    })
    .await;
    assert!(
        applied,
        "the router's split never became {expected:?}; it is {:?}",
        cluster.router.routed_split(CAPABILITY)
    );
}

/// `calls` unpinned invocations from 16 concurrent callers; every one must
/// succeed. Answers per version (or per agent with `by_agent`).
async fn spread(cluster: &Cluster, calls: usize, by_agent: bool) -> BTreeMap<String, usize> {
    let counts = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..16 {
        let (client, url, bearer) = (cluster.client.clone(), cluster.url("/v1/invoke"), token(CALLER));
        let (counts, next) = (counts.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < calls {
                let response = client
                    .post(&url)
                    .bearer_auth(&bearer)
                    .json(&order("SO-c"))
                    .send()
                    .await
                    .unwrap();
                let status = response.status();
                let body: Value = response.json().await.unwrap();
                assert_eq!(status, 200, "{body}");
                let key = if by_agent {
                    body["agent_id"].as_str().unwrap_or_default().to_string()
                } else {
                    version_of(&body)
                };
                *counts.lock().unwrap().entry(key).or_insert(0) += 1;
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let counts = counts.lock().unwrap().clone();
    counts
}

/// The value of `agent_reach_router_version_selections_total` for `version`.
fn selections(metrics: &str, version: &str) -> u64 {
    let series =
        format!("agent_reach_router_version_selections_total{{capability=\"{CAPABILITY}\",version=\"{version}\"}}");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_divides_unpinned_calls_by_weight_and_clearing_it_restores_the_highest_version() {
    let cluster = Cluster::start().await;
    let _stable = cluster.agent(spec("cs-1", "1.4.2", "ready"));
    let _canary = cluster.agent(spec("cs-2", "2.0.0", "ready"));
    cluster.wait_for_instances(&["cs-1", "cs-2"]).await;
    // Without a split, unpinned calls go to the highest version.
    assert_eq!(spread(&cluster, 20, false).await.get("2.0.0"), Some(&20));

    set_split(&cluster, json!({ "2.0.0": 5, "1.4.2": 95 })).await;
    wait_for_split(&cluster, Some(vec![("2.0.0", 5), ("1.4.2", 95)])).await;
    let before = cluster.metrics().await;
    let counts = spread(&cluster, 2000, false).await;
    let canary = counts.get("2.0.0").copied().unwrap_or(0);
    let stable = counts.get("1.4.2").copied().unwrap_or(0);
    assert_eq!(canary + stable, 2000, "{counts:?}");
    // Binomial(2,000, 0.05): mean 100, sd ≈ 9.7; a ±5 sd bound fails once in millions of runs.
    assert!(
        (52..=148).contains(&canary),
        "5 % of 2,000 calls to the canary: {counts:?}"
    );
    // One selection counted per call, per version.
    let after = cluster.metrics().await;
    assert_eq!(
        selections(&after, "2.0.0") - selections(&before, "2.0.0"),
        canary as u64,
        "version selections of 2.0.0"
    );
    assert_eq!(
        selections(&after, "1.4.2") - selections(&before, "1.4.2"),
        stable as u64,
        "version selections of 1.4.2"
    );

    // Pinned calls ignore the split.
    for (requirement, expected) in [("=2.0.0", "2.0.0"), ("^1", "1.4.2"), ("^2", "2.0.0")] {
        for n in 0..10 {
            let (status, body) = cluster
                .invoke(json!({ "capability": CAPABILITY, "capability_version": requirement, "payload": { "order_id": format!("SO-{n}") } }))
                .await;
            assert_eq!(
                (status, version_of(&body)),
                (200, expected.to_string()),
                "{requirement}: {body}"
            );
        }
    }

    // Cleared: back to the highest version for every unpinned call.
    clear_split(&cluster).await;
    wait_for_split(&cluster, None).await;
    assert_eq!(spread(&cluster, 100, false).await.get("2.0.0"), Some(&100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_cannot_take_calls_never_blackholes_them() {
    let cluster = Cluster::start().await;
    let _stable = cluster.agent(spec("cb-1", "1.4.2", "ready"));
    let canary = cluster.agent(spec("cb-2", "2.0.0", "starting"));
    cluster.wait_for_instances(&["cb-1", "cb-2"]).await;

    // Half the calls are meant for 2.0.0, which is still starting: all go to 1.4.2.
    set_split(&cluster, json!({ "2.0.0": 50, "1.4.2": 50 })).await;
    wait_for_split(&cluster, Some(vec![("2.0.0", 50), ("1.4.2", 50)])).await;
    assert_eq!(spread(&cluster, 200, false).await.get("1.4.2"), Some(&200));

    // Ready: it takes its share.
    set_status(&cluster.registry.url(), &canary, "ready").await;
    let shared = eventually(Duration::from_secs(10), || {
        let cluster = &cluster;
        async move { version_of(&cluster.invoke(order("SO-r")).await.1) == "2.0.0" }
    })
    .await;
    assert!(shared, "a ready canary takes its share of the split");

    // Draining: everything to the other version again, not one call failed.
    set_status(&cluster.registry.url(), &canary, "draining").await;
    let all_stable = eventually(Duration::from_secs(10), || {
        let cluster = &cluster;
        async move { spread(cluster, 50, false).await.get("1.4.2") == Some(&50) }
    })
    .await;
    assert!(all_stable, "a draining canary's share goes to the other version");

    // A split naming only the canary still never blackholes: the highest version that can take the call.
    set_split(&cluster, json!({ "2.0.0": 1 })).await;
    wait_for_split(&cluster, Some(vec![("2.0.0", 1)])).await;
    assert_eq!(spread(&cluster, 50, false).await.get("1.4.2"), Some(&50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_weight_change_shifts_traffic_without_re_registration() {
    let cluster = Cluster::start().await;
    let light = cluster.agent(AgentSpec::new("cw-1", 1, Behaviour::Echo));
    let _other = cluster.agent(AgentSpec::new("cw-2", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["cw-1", "cw-2"]).await;
    let even = spread(&cluster, 400, true).await;
    let light_share = even.get("cw-1").copied().unwrap_or(0);
    assert!((195..=205).contains(&light_share), "1:1 before: {even:?}");

    let registry = cluster.registry.url();
    let agent = |registry: String| async move {
        let body: Value = reqwest::Client::new()
            .get(format!("{registry}/v1/agents/cw-1"))
            .bearer_auth(token(CALLER))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body
    };
    let before = agent(registry.clone()).await;
    let response = reqwest::Client::new()
        .put(format!("{registry}/v1/agents/cw-1/weight"))
        .bearer_auth(ops())
        .json(&json!({ "weight": 3 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let router = cluster.router.clone();
    let applied = eventually(Duration::from_secs(10), || {
        let router = router.clone();
        async move { router.routed_weight("cw-1") == Some(3) }
    })
    .await;
    assert!(applied, "the router never saw the new weight");
    // Smooth WRR at 3:1: exact over whole cycles, give or take a cycle under concurrency.
    let shifted = spread(&cluster, 400, true).await;
    let heavy = shifted.get("cw-1").copied().unwrap_or(0);
    assert!((292..=308).contains(&heavy), "3:1 after the change: {shifted:?}");

    // The same registration: same lease, same registration time.
    let after = agent(registry.clone()).await;
    assert_eq!(after["lease_id"], json!(light.lease));
    assert_eq!(after["registered_at_ms"], before["registered_at_ms"]);
    assert_eq!(after["weight"], 3);
    // The agent's next heartbeat (here one that changes its status) keeps it.
    set_status(&registry, &light, "busy").await;
    let body = agent(registry.clone()).await;
    assert_eq!(
        (body["weight"].clone(), body["status"].clone()),
        (json!(3), json!("busy"))
    );
    assert_eq!(cluster.router.routed_weight("cw-1"), Some(3));
}

/// One call through each streaming door: `/v1/invoke` asking for events, an
/// A2A `SendStreamingMessage` (JSON-RPC, and REST's `message:stream`), an
/// MCP `tools/call` with progress (a handshake revision, and the stateless
/// 2026-07-28 with its headers); each read to its end.
async fn stream_once(cluster: &Cluster, door: &str, n: usize) {
    let client = &cluster.client;
    let request = match door {
        "invoke" => client
            .post(cluster.url("/v1/invoke"))
            .header("accept", "text/event-stream")
            .json(&order(&format!("SO-s{n}"))),
        "a2a" => client
            .post(cluster.url(&format!("/a2a/{CAPABILITY}")))
            .header("a2a-version", "1.0")
            .json(&json!({
                "jsonrpc": "2.0", "id": n, "method": "SendStreamingMessage",
                "params": {"message": {"messageId": format!("m-{n}"), "role": "ROLE_USER",
                                       "parts": [{"data": {"order_id": format!("SO-a{n}")}}]}}
            })),
        "a2a-rest" => client
            .post(cluster.url(&format!("/a2a/{CAPABILITY}/v1/message:stream")))
            .json(&json!({
                "message": {"messageId": format!("m-r{n}"), "role": "ROLE_USER",
                            "parts": [{"data": {"order_id": format!("SO-r{n}")}}]}
            })),
        "mcp-2026" => client
            .post(cluster.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", CAPABILITY)
            .json(&json!({
                "jsonrpc": "2.0", "id": n, "method": "tools/call",
                "params": {"name": CAPABILITY, "arguments": {"order_id": format!("SO-n{n}")},
                           "_meta": {"progressToken": format!("p-{n}"),
                                     "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                     "io.modelcontextprotocol/clientCapabilities": {}}}
            })),
        _ => client
            .post(cluster.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .json(&json!({
                "jsonrpc": "2.0", "id": n, "method": "tools/call",
                "params": {"name": CAPABILITY, "arguments": {"order_id": format!("SO-m{n}")},
                           "_meta": {"progressToken": format!("p-{n}")}}
            })),
    };
    let response = request.bearer_auth(token(CALLER)).send().await.unwrap();
    assert_eq!(response.status(), 200, "{door}");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response.text().await.unwrap();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{door}: {content_type} {body}"
    );
    // The agent's two events reached the caller, and the call ended well.
    assert!(
        body.contains("\\\"n\\\":2") || body.contains("\"n\":2"),
        "{door}: {body}"
    );
    assert!(
        !body.contains("event: error") && !body.contains("\"isError\":true"),
        "{door}: {body}"
    );
}

// Issue 33: every door that sends a call to one instance follows the split,
// the streamed ones too (a streamed call used to ignore it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_through_every_door_follow_the_split() {
    let cluster = Cluster::start().await;
    let mut v1 = spec("sv1-1", "1.0.0", "ready");
    v1.behaviour = Behaviour::Stream;
    let mut v2 = spec("sv2-1", "2.0.0", "ready");
    v2.behaviour = Behaviour::Stream;
    let (v1, v2) = (cluster.agent(v1), cluster.agent(v2));
    cluster.wait_for_instances(&["sv1-1", "sv2-1"]).await;
    for (weights, expected) in [
        (json!({"2.0.0": 0, "1.0.0": 100}), vec![("2.0.0", 0), ("1.0.0", 100)]),
        (json!({"2.0.0": 100, "1.0.0": 0}), vec![("2.0.0", 100), ("1.0.0", 0)]),
    ] {
        set_split(&cluster, weights).await;
        let applied: Vec<(&str, u32)> = expected.iter().copied().filter(|(_, weight)| *weight > 0).collect();
        wait_for_split(&cluster, Some(applied)).await;
        let canary_gets_all = expected[0].1 == 100;
        for door in ["invoke", "a2a", "a2a-rest", "mcp", "mcp-2026"] {
            let (before_v1, before_v2) = (v1.hits(), v2.hits());
            for n in 0..20 {
                stream_once(&cluster, door, n).await;
            }
            let (to_v1, to_v2) = (v1.hits() - before_v1, v2.hits() - before_v2);
            let expected = if canary_gets_all { (0, 20) } else { (20, 0) };
            assert_eq!(
                (to_v1, to_v2),
                expected,
                "{door} at {:?}",
                cluster.router.routed_split(CAPABILITY)
            );
        }
    }
}
