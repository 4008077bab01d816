//! The console's API without a browser (issue 26): sign-in links and
//! sessions, the operator reads (instances, capabilities, recent calls, the
//! slow path) and the relayed registry actions, each refusal with its
//! stable code. `console_browser.rs` drives the page itself.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// The console's page header, sent with a session cookie.
const PAGE: (&str, &str) = ("x-agent-reach-console", "1");

async fn answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn get_as(cluster: &Cluster, caller: &str, path: &str) -> (u16, Value) {
    answer(
        cluster
            .client
            .get(cluster.url(path))
            .bearer_auth(token(caller))
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A sign-in link's code for `caller`, living `ttl_s`.
async fn link(cluster: &Cluster, caller: &str, ttl_s: u64) -> (u16, Value) {
    answer(
        cluster
            .client
            .post(cluster.url("/v1/console/links"))
            .bearer_auth(token(caller))
            .json(&json!({ "ttl_s": ttl_s }))
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn open_session(cluster: &Cluster, code: &str) -> (u16, Value, Option<String>) {
    let response = cluster
        .client
        .post(cluster.url("/v1/console/session"))
        .header("x-agent-reach-console", "1")
        .json(&json!({ "code": code }))
        .send()
        .await
        .unwrap();
    let cookie = response
        .headers()
        .get("set-cookie")
        .map(|value| value.to_str().unwrap().to_string());
    let (status, body) = answer(response).await;
    (status, body, cookie)
}

fn code_of(status: u16, body: &Value) -> (u16, &str) {
    (status, body["error"]["code"].as_str().unwrap_or(""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_links_sessions_and_their_refusals() {
    let cluster = Cluster::start().await;

    // The page and its assets are embedded, and never framed or sniffed.
    let page = cluster.client.get(cluster.url("/console")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(page.text().await.unwrap().contains("/console/console.js"));
    for asset in ["/console/console.js", "/console/console.css"] {
        let response = cluster.client.get(cluster.url(asset)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{asset}");
    }

    // Only operators get a link; without a token, none.
    let (status, body) = link(&cluster, CALLER, 60).await;
    assert_eq!(code_of(status, &body), (403, "FORBIDDEN"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "not_an_operator");
    let (status, body) = answer(
        cluster
            .client
            .post(cluster.url("/v1/console/links"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (401, "UNAUTHENTICATED"), "{body}");
    let (status, body) = link(&cluster, "ops", 0).await;
    assert_eq!(code_of(status, &body), (400, "INVALID_ENVELOPE"), "{body}");
    assert_eq!(body["error"]["details"]["field"], "ttl_s");

    let (status, made) = link(&cluster, "ops", 60).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["operator"], "ops");
    let code = made["code"].as_str().unwrap().to_string();
    assert_eq!(made["path"], format!("/console#code={code}"));

    // The code opens a session: an HttpOnly, SameSite=Strict cookie.
    let (status, session, cookie) = open_session(&cluster, &code).await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["operator"], "ops");
    let cookie = cookie.expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let (status, who) = answer(
        cluster
            .client
            .get(cluster.url("/v1/console/session"))
            .header("cookie", &pair)
            .header(PAGE.0, PAGE.1)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, who["operator"].as_str()), (200, Some("ops")), "{who}");

    // A cookie alone (another site's form or script) is refused.
    let (status, body) = answer(
        cluster
            .client
            .get(cluster.url("/v1/routing/instances"))
            .header("cookie", &pair)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (403, "FORBIDDEN"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "console_header_missing");

    // A forged cookie, a mistyped link and an expired link each say so.
    let (status, body) = answer(
        cluster
            .client
            .get(cluster.url("/v1/console/session"))
            .header("cookie", "agent_reach_console=00ff00ff00ff00ff00ff00ff00ff00ff00ff")
            .header(PAGE.0, PAGE.1)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (401, "UNAUTHENTICATED"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "session_invalid");
    // Only the console's page signs in (another site cannot send its header).
    let (status, body) = answer(
        cluster
            .client
            .post(cluster.url("/v1/console/session"))
            .json(&json!({ "code": code }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (403, "FORBIDDEN"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "console_header_missing");
    let (status, body, _) = open_session(&cluster, "not-a-code").await;
    assert_eq!(code_of(status, &body), (401, "UNAUTHENTICATED"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "link_invalid");
    // A session cookie is not a link's code.
    let sealed_session = pair.split_once('=').unwrap().1.to_string();
    let (status, body, _) = open_session(&cluster, &sealed_session).await;
    assert_eq!(body["error"]["details"]["reason"], "link_invalid", "{status} {body}");
    let (status, body) = answer(
        cluster
            .client
            .post(cluster.url("/v1/console/session"))
            .header("x-agent-reach-console", "1")
            .json(&json!({ "token": "x" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (400, "INVALID_ENVELOPE"), "{body}");

    let (_, short) = link(&cluster, "ops", 1).await;
    let short = short["code"].as_str().unwrap().to_string();
    let expired = eventually(Duration::from_secs(10), || async {
        open_session(&cluster, &short).await.1["error"]["details"]["reason"] == "link_expired"
    })
    .await;
    assert!(expired, "a 1 s link never expired");
    let (status, body, cookie) = open_session(&cluster, &short).await;
    assert_eq!(code_of(status, &body), (401, "UNAUTHENTICATED"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent-reach console"),
        "{body}"
    );
    assert!(cookie.is_none(), "no cookie for an expired link");

    // Signing out clears the cookie.
    let response = cluster
        .client
        .delete(cluster.url("/v1/console/session"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    assert!(response.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_read_instances_capabilities_and_recent_calls() {
    let cluster = Cluster::start().await;
    let _agents: Vec<Agent> = ["echo-1", "echo-2", "echo-3"]
        .into_iter()
        .map(|id| cluster.agent(AgentSpec::new(id, 10, Behaviour::Echo)))
        .collect();
    cluster.wait_for_instances(&["echo-1", "echo-2", "echo-3"]).await;

    let (status, view) = get_as(&cluster, "ops", "/v1/routing/instances").await;
    assert_eq!(status, 200, "{view}");
    let instances = view["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 3, "{view}");
    for instance in instances {
        assert_eq!(instance["capability"], CAPABILITY);
        assert_eq!(instance["version"], "1.0.0");
        assert_eq!(instance["status"], "ready");
        assert_eq!(instance["breaker"], "closed");
        assert_eq!(instance["health"], 100, "{instance}");
        assert_eq!(instance["routable"], true);
    }
    assert_eq!(view["snapshot"]["registry_connected"], true);

    // Each instance's last heartbeat, from its lease (relayed to the registry).
    let (status, beats) = get_as(&cluster, "ops", "/v1/heartbeats").await;
    assert_eq!(status, 200, "{beats}");
    let beats = beats["heartbeats"].as_array().unwrap();
    let ids: Vec<&str> = beats.iter().map(|beat| beat["agent_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["echo-1", "echo-2", "echo-3"], "{beats:?}");
    for beat in beats {
        let (ttl, age, remaining) = (
            beat["ttl_s"].as_i64().unwrap(),
            beat["age_s"].as_i64().unwrap(),
            beat["remaining_s"].as_i64().unwrap(),
        );
        assert!(
            ttl >= 10 && (0..=ttl).contains(&age) && age + remaining == ttl,
            "{beat}"
        );
        assert!(beat["lease_id"].as_i64().unwrap() != 0, "{beat}");
    }

    // A success, an agent-side refusal of the schema, and their records.
    let (status, _) = cluster
        .invoke(json!({ "capability": CAPABILITY, "request_id": "console-ok-1", "payload": { "order_id": "SO-1" } }))
        .await;
    assert_eq!(status, 200);
    let (status, _) = cluster
        .invoke(json!({ "capability": CAPABILITY, "request_id": "console-bad-1", "payload": { "order_id": 7 } }))
        .await;
    assert_eq!(status, 422);

    let (status, found) = get_as(&cluster, "ops", "/v1/requests/console-ok-1").await;
    assert_eq!(status, 200, "{found}");
    let call = &found["calls"][0];
    assert_eq!(call["outcome"], "succeeded");
    assert_eq!(call["capability"], CAPABILITY);
    assert_eq!(call["capability_version"], "1.0.0");
    assert_eq!(call["caller"], CALLER);
    assert_eq!(call["trace_id"].as_str().unwrap().len(), 32);
    assert_eq!(call["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(call["attempts"][0]["outcome"], "succeeded");
    assert!(call["attempts"][0]["agent_id"].as_str().unwrap().starts_with("echo-"));
    assert_eq!(found["task"], Value::Null);

    let (_, failed) = get_as(&cluster, "ops", "/v1/requests/console-bad-1").await;
    assert_eq!(failed["calls"][0]["outcome"], "failed");
    assert_eq!(failed["calls"][0]["error"]["code"], "SCHEMA_MISMATCH");
    assert_eq!(failed["calls"][0]["attempts"], json!([]));

    let (status, listed) = get_as(&cluster, "ops", "/v1/requests?outcome=failed").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|call| call["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["console-bad-1"], "{listed}");

    let (status, capabilities) = get_as(&cluster, "ops", "/v1/routing/capabilities").await;
    assert_eq!(status, 200);
    let order = &capabilities["capabilities"][0];
    assert_eq!(order["name"], CAPABILITY);
    assert_eq!(order["versions"][0]["routable"], 3);
    assert_eq!(order["split"], Value::Null);
    assert_eq!(order["stats"]["calls"], 2, "{order}");
    assert_eq!(order["stats"]["failures"], 1);
    assert!(order["stats"]["p99_ms"].as_f64().is_some());

    // Bad input and strangers, each with its code.
    for (caller, path, expected) in [
        ("ops", "/v1/requests/no-such-request", (404, "NOT_FOUND")),
        ("ops", "/v1/requests?outcome=maybe", (400, "INVALID_QUERY")),
        ("ops", "/v1/requests?colour=red", (400, "INVALID_QUERY")),
        ("ops", "/v1/backlog", (501, "TASKS_DISABLED")),
        (CALLER, "/v1/routing/instances", (403, "FORBIDDEN")),
        (CALLER, "/v1/routing/capabilities", (403, "FORBIDDEN")),
        (CALLER, "/v1/requests/console-ok-1", (403, "FORBIDDEN")),
        (CALLER, "/v1/requests", (403, "FORBIDDEN")),
        (CALLER, "/v1/heartbeats", (403, "FORBIDDEN")),
    ] {
        let (status, body) = get_as(&cluster, caller, path).await;
        assert_eq!(code_of(status, &body), expected, "{caller} {path}: {body}");
    }
    let long = "x".repeat(129);
    let (status, body) = get_as(&cluster, "ops", &format!("/v1/requests/{long}")).await;
    assert_eq!(code_of(status, &body), (400, "INVALID_QUERY"), "{body}");
    let (_, body) = get_as(&cluster, "ops", "/v1/requests/no-such-request").await;
    assert_eq!(body["error"]["details"]["reason"], "request_not_found");
    let (status, body) = answer(
        cluster
            .client
            .get(cluster.url("/v1/routing/instances"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (401, "UNAUTHENTICATED"), "{body}");
    let (status, body) = answer(cluster.client.get(cluster.url("/v1/heartbeats")).send().await.unwrap()).await;
    assert_eq!(code_of(status, &body), (401, "UNAUTHENTICATED"), "{body}");
    let (status, body) = answer(
        cluster
            .client
            .delete(cluster.url("/v1/heartbeats"))
            .bearer_auth(token("ops"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (405, "METHOD_NOT_ALLOWED"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_weights_and_splits_are_relayed_to_the_registry_as_the_operator() {
    let cluster = Cluster::start().await;
    let _one = cluster.agent(AgentSpec::new("echo-1", 10, Behaviour::Echo));
    let mut two = AgentSpec::new("echo-2", 10, Behaviour::Echo);
    two.version = "2.0.0".to_string();
    let _two = cluster.agent(two);
    cluster.wait_for_instances(&["echo-1", "echo-2"]).await;

    let put = |caller: &'static str, path: &'static str, body: Value| {
        let request = cluster
            .client
            .put(cluster.url(path))
            .bearer_auth(token(caller))
            .json(&body);
        async move { answer(request.send().await.unwrap()).await }
    };
    let (status, body) = put(CALLER, "/v1/agents/echo-1/weight", json!({ "weight": 7 })).await;
    assert_eq!(code_of(status, &body), (403, "FORBIDDEN"), "{body}");
    let (status, body) = put("ops", "/v1/agents/echo-1/weight", json!({ "weight": 7 })).await;
    assert_eq!(status, 200, "{body}");
    let router = cluster.router.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let router = router.clone();
            async move { router.routed_weight("echo-1") == Some(7) }
        })
        .await,
        "the weight never reached the snapshot"
    );
    // The registry's own codes pass through.
    let (status, body) = put("ops", "/v1/agents/echo-1/weight", json!({ "weight": 0 })).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");

    // Drain: the registry makes the instance `draining`, the router stops routing to it.
    let drain = |caller: &'static str| {
        let request = cluster
            .client
            .post(cluster.url("/v1/agents/echo-2/drain"))
            .bearer_auth(token(caller));
        async move { answer(request.send().await.unwrap()).await }
    };
    let (status, body) = drain(CALLER).await;
    assert_eq!(code_of(status, &body), (403, "FORBIDDEN"), "{body}");
    let (status, body) = drain("ops").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("draining")), "{body}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            let (_, view) = get_as(&cluster, "ops", "/v1/routing/instances").await;
            view["instances"].as_array().unwrap().iter().any(|instance| {
                instance["agent_id"] == "echo-2" && instance["status"] == "draining" && instance["routable"] == false
            })
        })
        .await,
        "the drain never reached the router"
    );
    let (status, again) = drain("ops").await;
    assert_eq!(
        (status, again["status"].as_str()),
        (200, Some("draining")),
        "a drain is idempotent: {again}"
    );
    let (status, body) = answer(
        cluster
            .client
            .post(cluster.url("/v1/agents/nobody-1/drain"))
            .bearer_auth(token("ops"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code_of(status, &body), (404, "AGENT_NOT_FOUND"), "{body}");

    let (status, body) = put(
        "ops",
        "/v1/capabilities/order.query/split",
        json!({ "weights": { "2.0.0": 5, "1.0.0": 95 } }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["updated_by"], "ops", "the registry records the operator: {body}");
    let (status, shown) = get_as(&cluster, "ops", "/v1/capabilities/order.query/split").await;
    assert_eq!((status, &shown["weights"]["2.0.0"]), (200, &json!(5)), "{shown}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            get_as(&cluster, "ops", "/v1/routing/capabilities").await.1["capabilities"][0]["split"] != Value::Null
        })
        .await
    );
    let response = cluster
        .client
        .delete(cluster.url("/v1/capabilities/order.query/split"))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let (status, body) = get_as(&cluster, "ops", "/v1/capabilities/order.query/split").await;
    assert_eq!(code_of(status, &body), (404, "SPLIT_NOT_FOUND"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slow_path_summary_counts_waiting_running_and_dead_letters() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let _held = cluster.agent(AgentSpec::new("hang-1", 1, Behaviour::Hang));
    cluster.wait_for_instances(&["hang-1"]).await;
    let (status, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({ "capability": CAPABILITY, "request_id": "console-task-1", "payload": { "order_id": "SO-1" } }),
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    // Claimed and held by the hanging agent: running, not waiting.
    assert!(
        eventually(Duration::from_secs(15), || async {
            let (_, summary) = get_as(&cluster, "ops", "/v1/backlog").await;
            summary["running"]
                .as_array()
                .is_some_and(|running| running.iter().any(|entry| entry["count"] == 1))
        })
        .await,
        "the task never showed as running: {}",
        get_as(&cluster, "ops", "/v1/backlog").await.1
    );
    let (_, summary) = get_as(&cluster, "ops", "/v1/backlog").await;
    assert_eq!(summary["dead_letters"], 0, "{summary}");
    // Still running, its record is found by its caller and request id.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let (status, found) = get_as(&cluster, "ops", "/v1/requests/console-task-1?caller=tester").await;
            status == 200 && found["task"]["status"] == "running"
        })
        .await
    );
    let (status, body) = get_as(&cluster, CALLER, "/v1/backlog").await;
    assert_eq!(code_of(status, &body), (403, "FORBIDDEN"), "{body}");
}
