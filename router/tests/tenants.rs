//! Tenants, first step (issue 25, DESIGN §8): the tenant of a request is the
//! verified token's `tenant` claim (none: `default`), and each service serves
//! one tenant. Two tenants share etcd and Redis and use the same agent id,
//! agent name and capability: each tenant's calls reach only its own agent,
//! its tasks live under its own keys, and a token of the other tenant is
//! refused by the router and the registry alike (401, reason `other_tenant`).

use crate::support;

use base64::Engine;
use serde_json::{json, Value};
use support::*;

/// The claims of a `Bearer <jwt>` value, unverified (the test reads what the router sent).
fn claims(authorization: &str) -> Value {
    let token = authorization.strip_prefix("Bearer ").expect("bearer");
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_the_same_names_never_see_each_other() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let ours = cluster.agent(AgentSpec::new("order-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["order-1"]).await;

    // Tenant `acme`: its own registry and router on the same etcd and Redis,
    // and an agent with the same id, name and capability.
    let acme_registry = start_tenant_registry(
        &cluster.etcd.endpoint(),
        &cluster.secret_path,
        &cluster.acl_path,
        "acme",
    );
    let acme_registry_url = acme_registry.url();
    let redis_url = redis.url();
    let (_acme_router, acme) = cluster
        .another_router(move |settings| {
            settings.registry = vec![acme_registry_url];
            settings.tenant = "acme".to_string();
            settings.tasks = Some(tasks_settings(redis_url));
        })
        .await;
    let theirs = Agent::start(
        &acme_registry.url(),
        AgentSpec {
            tenant: Some("acme".to_string()),
            ..AgentSpec::new("order-1", 1, Behaviour::Echo)
        },
    );
    let acme_token = tenant_token(CALLER, Some("acme"));
    let default_token = token(CALLER);
    let client = reqwest::Client::new();
    let call = order("SO-1");
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            invoke_at(&client, acme, Some(&acme_token), &call).await.0 == 200
        })
        .await,
        "the acme router never routed to the acme agent"
    );
    let before = (ours.hits(), theirs.hits());

    // Each tenant's call reaches its own agent only.
    let (status, body) = invoke_at(&client, cluster.router_addr, Some(&default_token), &call).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = invoke_at(&client, acme, Some(&acme_token), &call).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((ours.hits(), theirs.hits()), (before.0 + 1, before.1 + 1));
    // The router vouches for the tenant too.
    let sent = theirs
        .seen
        .last_authorization
        .lock()
        .unwrap()
        .clone()
        .expect("an assertion");
    assert_eq!(claims(&sent)["tenant"], "acme");
    let sent = ours
        .seen
        .last_authorization
        .lock()
        .unwrap()
        .clone()
        .expect("an assertion");
    assert_eq!(claims(&sent)["tenant"], "default");

    // A token of the other tenant is refused, at each router and registry.
    for (router, token, tenant) in [
        (cluster.router_addr, &acme_token, "acme"),
        (acme, &default_token, "default"),
    ] {
        let (status, body) = invoke_at(&client, router, Some(token), &call).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"]["code"], "UNAUTHENTICATED", "{body}");
        assert_eq!(body["error"]["details"]["reason"], "other_tenant", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("tenant `{tenant}`")), "{message}");
    }
    let registered = client
        .post(format!("{}/v1/agents", cluster.registry.url()))
        .bearer_auth(tenant_token(&agent_name("order-2"), Some("acme")))
        .json(&json!({"agent_id": "order-2", "name": agent_name("order-2"),
                      "endpoint": "http://127.0.0.1:9/invoke", "capabilities": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        registered.status().as_u16(),
        401,
        "an acme agent registered into default"
    );
    assert_eq!(
        ours.hits() + theirs.hits(),
        before.0 + before.1 + 2,
        "a refused call reached an agent"
    );

    // Tasks: each tenant's under its own keys, invisible to the other's router.
    let submit = |router: std::net::SocketAddr, token: String| {
        let client = client.clone();
        async move {
            let response = client
                .post(format!("http://{router}/v1/tasks"))
                .bearer_auth(token)
                .json(&json!({"capability": "order.query", "request_id": "same-request", "payload": {"order_id": "SO-2"}}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            assert_eq!(status, 202, "{body}");
            body["task_id"].as_str().unwrap().to_string()
        }
    };
    // Counted before the submission: the task may be delivered before it is looked up.
    let delivered = theirs.hits();
    let acme_task = submit(acme, acme_token.clone()).await;
    // The same request id in the other tenant is another task, not a duplicate.
    let default_task = submit(cluster.router_addr, default_token.clone()).await;
    assert_ne!(acme_task, default_task);
    let response = client
        .get(format!("http://{}/v1/tasks/{acme_task}", cluster.router_addr))
        .bearer_auth(&default_token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "TASK_NOT_FOUND", "{body}");
    // The acme task is delivered on behalf of an acme caller: its assertion says so.
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            let response = client
                .get(format!("http://{acme}/v1/tasks/{acme_task}"))
                .bearer_auth(&acme_token)
                .send()
                .await
                .unwrap();
            let task: Value = response.json().await.unwrap();
            task["status"] == "succeeded"
        })
        .await,
        "the acme task never succeeded"
    );
    assert!(theirs.hits() > delivered);
    let sent = theirs
        .seen
        .last_authorization
        .lock()
        .unwrap()
        .clone()
        .expect("an assertion");
    assert_eq!(claims(&sent)["tenant"], "acme");
    let keys = redis_keys(&redis);
    assert!(keys.iter().any(|key| key.starts_with("agent-reach:acme:")), "{keys:?}");
    assert!(
        keys.iter().any(|key| key.starts_with("agent-reach:default:")),
        "{keys:?}"
    );
    assert!(
        keys.iter()
            .all(|key| key.starts_with("agent-reach:acme:") || key.starts_with("agent-reach:default:")),
        "{keys:?}"
    );
}
