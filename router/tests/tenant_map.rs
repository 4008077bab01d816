//! One router and one registry serving a tenant map (issue 25, DESIGN §8
//! "Tenants"): two tenants with the same agent id, agent name and
//! capability, each call reaching its own tenant's agent only, a name of the
//! other tenant `CAPABILITY_NOT_FOUND` (never a 403), tasks on each tenant's
//! placement (team-a on its own Redis, nothing of it on the shared one), a
//! tenant over its quota refused alone, the map followed live.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// A mapped stack on a cluster's etcd, ACL and secret: a registry and a
/// router serving the tenant map `map` (written to the cluster's dir), the
/// router's slow path on `shared` when given.
struct Mapped {
    _cluster: Cluster,
    map_path: std::path::PathBuf,
    registry: Registry,
    _router: agent_reach_router::Router,
    router: std::net::SocketAddr,
}

async fn mapped(map: &str, shared: Option<&agent_reach_testkit::Redis>) -> Mapped {
    let cluster = Cluster::start().await;
    let map_path = cluster.dir.path().join("tenants.yaml");
    std::fs::write(&map_path, map).expect("map");
    let registry = start_mapped_registry(
        &cluster.etcd.endpoint(),
        &cluster.secret_path,
        &cluster.acl_path,
        &map_path,
    );
    let shared = shared.map(agent_reach_testkit::Redis::url);
    let (router_handle, router) = cluster
        .another_router(|settings| {
            settings.registry = vec![registry.url()];
            settings.tenant_map = Some(map_path.clone());
            settings.tasks = shared.map(tasks_settings);
        })
        .await;
    Mapped {
        _cluster: cluster,
        map_path,
        registry,
        _router: router_handle,
        router,
    }
}

async fn task_of(
    client: &reqwest::Client,
    router: std::net::SocketAddr,
    token: &str,
    request_id: &str,
) -> (u16, Value) {
    let response = client
        .post(format!("http://{router}/v1/tasks"))
        .bearer_auth(token)
        .json(
            &json!({"capability": CAPABILITY, "request_id": request_id, "session_id": "same-session",
                      "payload": {"order_id": "SO-9"}}),
        )
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_router_serves_each_tenant_its_own_agents_and_placement() {
    let shared = agent_reach_testkit::Redis::start();
    let own = agent_reach_testkit::Redis::start();
    let map = format!(
        "version: 1\ntenants:\n  default: {{}}\n  team-a:\n    redis: {}\n  team-b: {{}}\n",
        own.url()
    );
    let stack = mapped(&map, Some(&shared)).await;
    let (registry, router, map_path) = (&stack.registry, stack.router, &stack.map_path);
    let client = reqwest::Client::new();
    let a = tenant_token(CALLER, Some("team-a"));
    let b = tenant_token(CALLER, Some("team-b"));
    let call = order("SO-1");

    // Only team-b has an agent: team-a's call for the same name finds nothing (no 403, no leak).
    let theirs = Agent::start(
        &registry.url(),
        AgentSpec {
            tenant: Some("team-b".to_string()),
            ..AgentSpec::new("order-1", 1, Behaviour::Echo)
        },
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            invoke_at(&client, router, Some(&b), &call).await.0 == 200
        })
        .await,
        "team-b's agent was never routed to"
    );
    let (status, body) = invoke_at(&client, router, Some(&a), &call).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "CAPABILITY_NOT_FOUND", "{body}");

    // team-a's agent: the same id, name and capability.
    let ours = Agent::start(
        &registry.url(),
        AgentSpec {
            tenant: Some("team-a".to_string()),
            ..AgentSpec::new("order-1", 1, Behaviour::Echo)
        },
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            invoke_at(&client, router, Some(&a), &call).await.0 == 200
        })
        .await,
        "team-a's agent was never routed to"
    );
    let before = (ours.hits(), theirs.hits());
    for _ in 0..3 {
        assert_eq!(invoke_at(&client, router, Some(&a), &call).await.0, 200);
    }
    assert_eq!(invoke_at(&client, router, Some(&b), &call).await.0, 200);
    assert_eq!((ours.hits(), theirs.hits()), (before.0 + 3, before.1 + 1));

    // A tenant not in the map, and a forged claim: refused before any lookup.
    let (status, body) = invoke_at(&client, router, Some(&tenant_token(CALLER, Some("team-z"))), &call).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "other_tenant", "{body}");
    let forged = agent_reach_access::token::issue_hs256_for(
        CALLER,
        Some("team-a"),
        b"not-the-secret-not-the-secret-not-the",
        Duration::from_secs(60),
    )
    .unwrap();
    let (status, body) = invoke_at(&client, router, Some(&forged), &call).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "bad_signature", "{body}");

    // Tasks: each tenant's on its placement; team-a's never on the shared Redis.
    let (status, body) = task_of(&client, router, &a, "same-request").await;
    assert_eq!(status, 202, "{body}");
    let a_task = body["task_id"].as_str().unwrap().to_string();
    let (status, body) = task_of(&client, router, &b, "same-request").await;
    assert_eq!(status, 202, "{body}");
    let b_task = body["task_id"].as_str().unwrap().to_string();
    assert_ne!(a_task, b_task);
    for (token, task) in [(&a, &a_task), (&b, &b_task)] {
        assert!(
            eventually(Duration::from_secs(20), || async {
                let response = client
                    .get(format!("http://{router}/v1/tasks/{task}"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .unwrap();
                response.json::<Value>().await.unwrap()["status"] == "succeeded"
            })
            .await,
            "task {task} never succeeded"
        );
    }
    // Neither tenant finds the other's task.
    for (token, task) in [(&a, &b_task), (&b, &a_task)] {
        let response = client
            .get(format!("http://{router}/v1/tasks/{task}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 404);
    }
    // A session's results: each tenant sees its own task only, the same session id in both.
    for (token, own, other) in [(&a, &a_task, &b_task), (&b, &b_task, &a_task)] {
        let results: Value = client
            .get(format!("http://{router}/v1/sessions/same-session/results"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<&str> = results["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|result| result["task_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [own.as_str()], "{results}");
        assert!(!ids.contains(&other.as_str()));
    }
    let on_shared = redis_keys(&shared);
    let on_own = redis_keys(&own);
    assert!(
        on_shared.iter().all(|key| !key.contains("team-a")),
        "team-a wrote to the shared Redis: {on_shared:?}"
    );
    assert!(
        on_shared.iter().any(|key| key.starts_with("agent-reach:team-b:")),
        "{on_shared:?}"
    );
    assert!(
        on_own.iter().any(|key| key.starts_with("agent-reach:team-a:")),
        "{on_own:?}"
    );
    assert!(
        on_own.iter().all(|key| key.starts_with("agent-reach:team-a:")),
        "{on_own:?}"
    );

    // Every tenant's series, labelled, in one exposition.
    let metrics = client
        .get(format!("http://{router}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metrics
            .matches("# TYPE agent_reach_router_requests_total counter")
            .count(),
        1
    );
    for tenant in ["team-a", "team-b"] {
        assert!(
            metrics.contains(&format!("tenant=\"{tenant}\"")),
            "no series of {tenant}:\n{metrics}"
        );
    }
    // The operators' view (operators of the home tenant).
    let response = client
        .get(format!("http://{router}/v1/tenants"))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let tenants: Value = response.json().await.unwrap();
    assert_eq!(tenants["home"], "default");
    let names: Vec<&str> = tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tenant| tenant["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "team-a", "team-b"]);
    let team_a = &tenants["tenants"][1];
    assert!(
        team_a["placement"].as_str().unwrap().starts_with("own Redis"),
        "{team_a}"
    );
    assert!(team_a["usage"]["requests_total"].as_u64().unwrap() >= 4, "{team_a}");
    let response = client
        .get(format!("http://{router}/v1/tenants"))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        401,
        "a team-a caller is not the home tenant's operator"
    );

    // The map is followed: a tenant added is served, a broken edit changes nothing.
    std::fs::write(map_path, format!("{map}  team-c: {{}}\n")).unwrap();
    let c = tenant_token(CALLER, Some("team-c"));
    assert!(
        eventually(Duration::from_secs(20), || async {
            invoke_at(&client, router, Some(&c), &call).await.0 == 404
        })
        .await,
        "team-c was never served (its calls should find no capability, not be refused)"
    );
    std::fs::write(map_path, "version: 1\ntenants:\n  Not-A-Name: {}\n").unwrap();
    let (status, _) = invoke_at(&client, router, Some(&a), &call).await;
    assert_eq!(status, 200, "a broken edit must leave team-a served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_is_refused_and_the_other_is_not() {
    let map = "version: 1\ntenants:\n  default: {}\n  team-a:\n    quotas: {rate_per_s: 0.5, burst: 2}\n  team-b: {}\n";
    let stack = mapped(map, None).await;
    let (registry, router, map_path) = (&stack.registry, stack.router, &stack.map_path);
    let _agents: Vec<Agent> = ["team-a", "team-b"]
        .into_iter()
        .map(|tenant| {
            Agent::start(
                &registry.url(),
                AgentSpec {
                    tenant: Some(tenant.to_string()),
                    ..AgentSpec::new("order-1", 1, Behaviour::Echo)
                },
            )
        })
        .collect();
    let client = reqwest::Client::new();
    let a = tenant_token(CALLER, Some("team-a"));
    let b = tenant_token(CALLER, Some("team-b"));
    let call = order("SO-1");
    assert!(
        eventually(Duration::from_secs(20), || async {
            invoke_at(&client, router, Some(&b), &call).await.0 == 200
        })
        .await,
        "team-b's agent was never routed to"
    );
    // team-a's bucket: 2 calls, then 429 naming the tenant and its quota (a
    // call before its agent was routable spends a token too, so count refusals).
    let mut refused = None;
    for _ in 0..6 {
        let response = client
            .post(format!("http://{router}/v1/invoke"))
            .bearer_auth(&a)
            .json(&call)
            .send()
            .await
            .unwrap();
        if response.status().as_u16() == 429 {
            let retry_after = response.headers().get("retry-after").cloned();
            refused = Some((retry_after, response.json::<Value>().await.unwrap()));
            break;
        }
    }
    let (retry_after, body) = refused.expect("team-a was never refused over its quota");
    assert_eq!(body["error"]["code"], "RATE_LIMITED", "{body}");
    assert_eq!(body["error"]["details"]["tenant"], "team-a", "{body}");
    assert_eq!(body["error"]["details"]["limit"], "tenant_rate", "{body}");
    assert!(retry_after.is_some(), "a 429 says when to come back");
    // team-b is not limited by team-a's quota.
    for _ in 0..10 {
        let (status, body) = invoke_at(&client, router, Some(&b), &call).await;
        assert_eq!(status, 200, "{body}");
    }
    let metrics = client
        .get(format!("http://{router}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"agent_reach_router_rate_limited_total{caller="*",limit="tenant_rate",tenant="team-a"}"#),
        "{metrics}"
    );

    // Quotas apply live: a generous one lets team-a through again.
    std::fs::write(
        map_path,
        "version: 1\ntenants:\n  default: {}\n  team-a:\n    quotas: {rate_per_s: 1000}\n  team-b: {}\n",
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            invoke_at(&client, router, Some(&a), &call).await.0 == 200
        })
        .await,
        "the raised quota never applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_without_a_map_lists_its_one_tenant() {
    let cluster = Cluster::start().await;
    let response = cluster
        .client
        .get(cluster.url("/v1/tenants"))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["home"], "default", "{answer}");
    assert_eq!(answer["tenants"].as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(answer["tenants"][0]["placement"], "shared", "{answer}");
    assert_eq!(
        answer["tenants"][0]["usage"]["task_backlog"],
        Value::Null,
        "no slow path: {answer}"
    );
    // Operators only.
    let response = cluster
        .client
        .get(cluster.url("/v1/tenants"))
        .bearer_auth(token(CALLER))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "FORBIDDEN", "{body}");
}
