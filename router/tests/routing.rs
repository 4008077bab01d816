//! Routing that learns (issue 38) through the real router, against a real
//! etcd, a real registry, real HTTP agents and (for the exchange) a real
//! Redis: a capability's policy set by an operator reaches the router over
//! the Watch; a policy from an outside crate is selected by its name;
//! `adaptive` never scales an operator's weight nor overrides a traffic
//! split, moves by bounded steps and keeps a floor, and explains its
//! changes; `p2c_ewma` keeps away from a slow instance; two routers on one
//! Redis merge their outcome histories.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// The learning task's bucket in these tests: a tick is 83 ms, "the last minute" 500 ms.
const BUCKET: Duration = Duration::from_secs(3);

fn ops() -> String {
    token("ops")
}

fn with_plugins_and_fast_history(settings: &mut agent_reach_router::Settings) {
    settings.tuning.history_bucket = BUCKET;
    settings.plugins = agent_reach_router::Plugins::new()
        .with(agent_reach_policy_example::NAME, agent_reach_policy_example::Cheapest)
        .unwrap();
}

fn tagged(agent_id: &str, cost: &str) -> AgentSpec {
    let mut spec = AgentSpec::new(agent_id, 1, Behaviour::Echo);
    spec.tags = json!({ "cost": cost });
    spec
}

fn answered_by(body: &Value) -> String {
    body["agent_id"].as_str().unwrap_or_default().to_string()
}

/// `PUT`, `GET` or `DELETE` on the registry as `who`; (status, body or null).
async fn registry_call(
    cluster: &Cluster,
    method: reqwest::Method,
    path: &str,
    who: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", cluster.registry.url()))
        .bearer_auth(token(who));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `GET path` on a router as the operator.
async fn operator_get(router: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!("http://{router}{path}"))
        .bearer_auth(ops())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// `calls` invocations of `envelope`, 8 at a time; every one must succeed. Answers per agent.
async fn spread(cluster: &Cluster, envelope: Value, calls: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..calls.div_ceil(8) {
        let rounds = (0..8).map(|_| cluster.invoke(envelope.clone()));
        for (status, body) in futures::future::join_all(rounds).await {
            assert_eq!(status, 200, "{body}");
            *counts.entry(answered_by(&body)).or_insert(0) += 1;
        }
    }
    counts
}

/// An instance's row of `GET /v1/routing/instances` (in `version`).
async fn instance_row(router: std::net::SocketAddr, agent_id: &str, version: &str) -> Value {
    let (status, body) = operator_get(router, "/v1/routing/instances").await;
    assert_eq!(status, 200, "{body}");
    body["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["agent_id"] == agent_id && row["version"] == version)
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_crates_policy_is_selected_by_name_by_a_call_and_by_a_capabilitys_policy() {
    let cluster = Cluster::start_with(with_plugins_and_fast_history).await;
    let _agents = [
        cluster.agent(tagged("small-1", "1")),
        cluster.agent(tagged("medium-1", "5")),
        cluster.agent(tagged("large-1", "20")),
    ];
    cluster.wait_for_instances(&["large-1", "medium-1", "small-1"]).await;

    // A call names the plug-in: the cheapest healthy instance takes every call.
    let named = json!({ "capability": CAPABILITY, "target_policy": "plugin:cheapest", "payload": { "order_id": "1" } });
    assert_eq!(
        spread(&cluster, named, 24).await,
        BTreeMap::from([("small-1".to_string(), 24)])
    );
    // A plug-in this router does not have is the caller's mistake, named.
    let (status, body) = cluster
        .invoke(json!({ "capability": CAPABILITY, "target_policy": "plugin:nope", "payload": { "order_id": "1" } }))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "INVALID_ENVELOPE");
    assert_eq!(body["error"]["details"]["field"], "target_policy");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("plugin:cheapest"),
        "{body}"
    );
    let (status, body) = cluster
        .invoke(
            json!({ "capability": CAPABILITY, "target_policy": "plugin:Not-A-Name", "payload": { "order_id": "1" } }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["details"]["field"].clone()),
        (400, json!("target_policy")),
        "{body}"
    );

    // Without a policy of its own, the capability's calls go round-robin.
    let plain = json!({ "capability": CAPABILITY, "payload": { "order_id": "1" } });
    let counts = spread(&cluster, plain.clone(), 24).await;
    assert_eq!(counts.len(), 3, "{counts:?}");

    // An operator makes the plug-in the capability's policy, through the router's console relay.
    let response = reqwest::Client::new()
        .put(cluster.url(&format!("/v1/capabilities/{CAPABILITY}/policy")))
        .bearer_auth(ops())
        .json(&json!({ "policy": "plugin:cheapest" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let router = cluster.router_addr;
    let applied = eventually(Duration::from_secs(10), || async move {
        let (_, body) = operator_get(router, "/v1/routing/capabilities").await;
        body["capabilities"][0]["policy"] == "plugin:cheapest"
    })
    .await;
    assert!(applied, "the router never applied the capability's policy");
    assert_eq!(
        spread(&cluster, plain.clone(), 24).await,
        BTreeMap::from([("small-1".to_string(), 24)])
    );
    // A call's own policy still wins over the capability's.
    let counts = spread(
        &cluster,
        json!({ "capability": CAPABILITY, "target_policy": "weighted_round_robin", "payload": { "order_id": "1" } }),
        24,
    )
    .await;
    assert_eq!(counts.len(), 3, "{counts:?}");

    // Cleared: back to the router's default.
    let (status, _) = registry_call(
        &cluster,
        reqwest::Method::DELETE,
        &format!("/v1/capabilities/{CAPABILITY}/policy"),
        "ops",
        None,
    )
    .await;
    assert_eq!(status, 204);
    let cleared = eventually(Duration::from_secs(10), || async move {
        let (_, body) = operator_get(router, "/v1/routing/capabilities").await;
        body["capabilities"][0]["policy"].is_null()
    })
    .await;
    assert!(cleared);
    assert_eq!(spread(&cluster, plain, 24).await.len(), 3);
}

/// A version with one failing instance whose weight an operator set, one
/// failing instance whose weight is its own, and a healthy one; a second
/// version beside it, the two split 50/50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_never_scales_an_operators_weight_nor_overrides_a_split_and_explains_its_changes() {
    let cluster = Cluster::start_with(with_plugins_and_fast_history).await;
    let v2 = |id: &str, behaviour: Behaviour| {
        let mut spec = AgentSpec::new(id, 1, behaviour);
        spec.version = "2.0.0".to_string();
        spec
    };
    let _agents = [
        cluster.agent(AgentSpec::new("pinned-1", 1, Behaviour::Unavailable)),
        cluster.agent(AgentSpec::new("failing-1", 1, Behaviour::Unavailable)),
        cluster.agent(AgentSpec::new("healthy-1", 1, Behaviour::Echo)),
        cluster.agent(v2("failing-2", Behaviour::Unavailable)),
        cluster.agent(v2("healthy-2", Behaviour::Echo)),
    ];
    cluster
        .wait_for_instances(&["failing-1", "failing-2", "healthy-1", "healthy-2", "pinned-1"])
        .await;
    let (status, body) = registry_call(
        &cluster,
        reqwest::Method::PUT,
        "/v1/agents/pinned-1/weight",
        "ops",
        Some(json!({ "weight": 1 })),
    )
    .await;
    assert_eq!((status, body["operator_weight"].clone()), (200, json!(true)), "{body}");
    let (status, body) = registry_call(
        &cluster,
        reqwest::Method::PUT,
        &format!("/v1/capabilities/{CAPABILITY}/split"),
        "ops",
        Some(json!({ "weights": { "1.0.0": 50, "2.0.0": 50 } })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let router = cluster.router_addr;
    let pinned = eventually(Duration::from_secs(10), || async move {
        instance_row(router, "pinned-1", "1.0.0").await["operator_weight"] == true
            && cluster_split_applied(router).await
    })
    .await;
    assert!(pinned, "the router never saw the operator's weight and the split");

    // Adaptive calls until it has learned: the failing instances reach the floor.
    let adaptive = json!({ "capability": CAPABILITY, "target_policy": "adaptive", "payload": { "order_id": "1" } });
    let mut versions: BTreeMap<String, usize> = BTreeMap::new();
    let mut learned = false;
    for _ in 0..60 {
        let rounds = (0..8).map(|_| cluster.invoke(adaptive.clone()));
        for (status, body) in futures::future::join_all(rounds).await {
            assert_eq!(status, 200, "every call succeeds, on a retry when it must: {body}");
            *versions
                .entry(body["capability_version"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
        let failing = instance_row(router, "failing-1", "1.0.0").await;
        let failing_2 = instance_row(router, "failing-2", "2.0.0").await;
        // The pinned instance's prediction too: its breaker may keep it out
        // of most calls, and a prediction needs a few attempts (on a loaded
        // box the failing ones could reach the floor before it had them).
        let pinned_known = instance_row(router, "pinned-1", "1.0.0").await["predicted_failure_permille"].is_u64();
        if failing["learned_permille"] == 50 && failing_2["learned_permille"] == 50 && pinned_known {
            learned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        learned,
        "the failing instances never reached the floor, or the pinned one's failures were never predicted"
    );
    let pinned = instance_row(router, "pinned-1", "1.0.0").await;
    assert_eq!(
        pinned["learned_permille"], 1000,
        "an operator's weight is never scaled: {pinned}"
    );
    assert!(
        pinned["predicted_failure_permille"].as_u64().unwrap() > 500,
        "yet its failures are known: {pinned}"
    );
    assert_eq!(
        instance_row(router, "healthy-1", "1.0.0").await["learned_permille"],
        1000
    );

    // The split held: each version took about half of the calls, whatever adaptive learned.
    let total: usize = versions.values().sum();
    for version in ["1.0.0", "2.0.0"] {
        let share = *versions.get(version).unwrap_or(&0) as f64 / total as f64;
        assert!((0.35..=0.65).contains(&share), "{version}: {versions:?}");
    }

    // Every change is shown with its reason, in steps of at most ×2, never below the floor.
    let (status, body) = operator_get(router, &format!("/v1/routing/changes?capability={CAPABILITY}")).await;
    assert_eq!(status, 200, "{body}");
    let changes = body["changes"].as_array().unwrap();
    assert!(changes.len() >= 4, "{body}");
    for change in changes {
        assert_ne!(change["agent_id"], "pinned-1", "{change}");
        let (from, to) = (
            change["from_permille"].as_u64().unwrap(),
            change["to_permille"].as_u64().unwrap(),
        );
        assert!(to >= from / 2 && to <= from * 2 && to >= 50, "{change}");
        assert!(
            change["reason"].as_str().unwrap().starts_with("failure rate "),
            "{change}"
        );
    }
    let (_, capabilities) = operator_get(router, "/v1/routing/capabilities").await;
    assert!(!capabilities["capabilities"][0]["changes"]
        .as_array()
        .unwrap()
        .is_empty());

    // The history behind it, per instance and version.
    let (status, history) = operator_get(router, &format!("/v1/routing/history?capability={CAPABILITY}")).await;
    assert_eq!(status, 200, "{history}");
    let failing = history["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["agent_id"] == "failing-1")
        .unwrap();
    let server_errors: u64 = failing["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bucket| bucket["server_error"].as_u64().unwrap())
        .sum();
    assert!(server_errors > 0, "{failing}");
    let (status, body) = operator_get(router, "/v1/routing/history").await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (400, json!("INVALID_QUERY")),
        "{body}"
    );
    let (status, body) = operator_get(router, "/v1/routing/history?capability=no.such").await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!("CAPABILITY_NOT_FOUND")),
        "{body}"
    );
    let response = reqwest::Client::new()
        .get(cluster.url("/v1/routing/changes"))
        .bearer_auth(token(CALLER))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403, "operators only");
}

async fn cluster_split_applied(router: std::net::SocketAddr) -> bool {
    let (_, body) = operator_get(router, "/v1/routing/capabilities").await;
    body["capabilities"][0]["split"]
        .as_array()
        .is_some_and(|split| split.len() == 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_ewma_keeps_away_from_a_slow_instance() {
    let cluster = Cluster::start_with(with_plugins_and_fast_history).await;
    let slow = cluster.agent(AgentSpec::new("slow-1", 1, Behaviour::Slow(Duration::from_millis(150))));
    let _fast = [
        cluster.agent(AgentSpec::new("fast-1", 1, Behaviour::Echo)),
        cluster.agent(AgentSpec::new("fast-2", 1, Behaviour::Echo)),
    ];
    cluster.wait_for_instances(&["fast-1", "fast-2", "slow-1"]).await;
    let envelope = json!({ "capability": CAPABILITY, "target_policy": "p2c_ewma", "payload": { "order_id": "1" } });
    for _ in 0..60 {
        let (status, body) = cluster.invoke(envelope.clone()).await;
        assert_eq!(status, 200, "{body}");
    }
    // Round-robin would have sent it 20; once its peak latency is known it costs 100× a fast one.
    assert!(slow.hits() <= 6, "the slow instance took {} of 60 calls", slow.hits());
}

/// Two routers on one Redis: each one's outcome history holds the other's calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_on_one_redis_merge_their_outcome_histories() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let cluster = Cluster::start_with(|settings| {
        with_plugins_and_fast_history(settings);
        settings.tasks = Some(tasks_settings(url.clone()));
    })
    .await;
    let url = redis.url();
    let (_other, other_addr) = cluster
        .another_router(|settings| {
            with_plugins_and_fast_history(settings);
            settings.tasks = Some(tasks_settings(url));
        })
        .await;
    let _agent = cluster.agent(AgentSpec::new("merged-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["merged-1"]).await;
    let calls = |router: std::net::SocketAddr| async move {
        let (status, body) = operator_get(router, &format!("/v1/routing/history?capability={CAPABILITY}")).await;
        if status != 200 {
            return 0;
        }
        body["instances"][0]["buckets"].as_array().map_or(0, |buckets| {
            buckets.iter().map(|bucket| bucket["calls"].as_u64().unwrap()).sum()
        })
    };

    // 30 calls through the first router only.
    for _ in 0..30 {
        let (status, body) = cluster.invoke(order("1")).await;
        assert_eq!(status, 200, "{body}");
    }
    let merged = eventually(Duration::from_secs(15), || async move { calls(other_addr).await == 30 }).await;
    assert!(
        merged,
        "the second router never saw the first one's calls: {}",
        calls(other_addr).await
    );

    // 10 through the second: both hold all 40.
    let client = reqwest::Client::new();
    for _ in 0..10 {
        let (status, body) = invoke_at(&client, other_addr, Some(&token(CALLER)), &order("2")).await;
        assert_eq!(status, 200, "{body}");
    }
    let router = cluster.router_addr;
    let merged = eventually(Duration::from_secs(15), || async move {
        calls(router).await == 40 && calls(other_addr).await == 40
    })
    .await;
    assert!(
        merged,
        "the routers hold {} and {} calls, not 40 each",
        calls(router).await,
        calls(other_addr).await
    );
    // What they merged is in Redis, under the tenant's history tag.
    assert!(redis_keys(&redis)
        .iter()
        .any(|key| key.contains(":history:{h:default}:3000:order.query@1.0.0:merged-1")));
}
