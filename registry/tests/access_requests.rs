//! Access requests (issue 39, point 3; DESIGN §2.11) against a real etcd: a
//! caller files a request, an approver `owners:` names approves it into a
//! grant stored under `/agent-reach/v1/{tenant}/grants/` and published on
//! the `Watch`, revokes it; a grant with `ttl_s` goes with its lease; who
//! may do what; a stable code for every bad input, and nothing written then;
//! another tenant's requests and grants are not found.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_proto::registry as pb;
use agent_reach_registry::store::{EtcdStore, Store};
use agent_reach_registry::{RegistryConfig, Settings, StoreChoice};
use agent_reach_testkit::Etcd;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{authed, registration, wait_for, TestRegistry, SECRET};

/// `order_owner` approves access to `order.*`; `reader` may already call
/// `order.query`; nobody owns `shipping.*`.
const ACL: &str = r#"
version: 1
operators: [ops]
permissions:
  - caller: reader
    allow: [order.query]
providers:
  - agent: order_query
    provides: [order.*]
  - agent: shipping_rules
    provides: [shipping.rules]
owners:
  - capability: order.*
    approvers: [order_owner]
"#;

const REQUESTS: &str = "/v1/access-requests";

fn on(etcd: &Etcd) -> StoreChoice {
    StoreChoice::Etcd(vec![etcd.endpoint()])
}

fn token(name: &str) -> String {
    TestRegistry::token(name)
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

async fn next_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no watch event within 10 s")
        .expect("watch ended")
        .expect("watch failed")
}

/// A registry with [`ACL`] and `order_query-1` offering `order.query`.
async fn registry_with_order_query(etcd: &Etcd) -> TestRegistry {
    let registry = TestRegistry::start_with_acl(on(etcd), ACL).await;
    let (status, body) = registry
        .post(
            "/v1/agents",
            Some(&token("order_query")),
            &registration("order_query-1", 30),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    registry
}

async fn watch(registry: &TestRegistry) -> tonic::Streaming<pb::WatchEvent> {
    let request = pb::WatchRequest {
        start_revision: 0,
        paged: false,
    };
    registry
        .grpc()
        .await
        .watch(authed(request, &token("router")))
        .await
        .unwrap()
        .into_inner()
}

fn ids(list: &Value) -> Vec<&str> {
    list["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|request| request["id"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_approved_into_a_grant_on_the_watch_and_revoked() {
    let etcd = Etcd::start();
    let registry = registry_with_order_query(&etcd).await;
    let mut stream = watch(&registry).await;
    match next_event(&mut stream).await.kind {
        Some(pb::watch_event::Kind::Snapshot(snapshot)) => assert!(snapshot.grants.is_empty()),
        other => panic!("a watch starts with a snapshot: {other:?}"),
    }

    // Filed by the caller itself: pending, naming who may decide.
    let ask = json!({ "capability": "order.query", "reason": "intents need order status", "ttl_s": 3600 });
    let (status, filed) = registry.post(REQUESTS, Some(&token("intent_parser")), &ask).await;
    assert_eq!(status, 201, "{filed}");
    assert_eq!(filed["status"], "pending");
    assert_eq!(filed["caller"], "intent_parser");
    assert_eq!(filed["requested_by"], "intent_parser");
    assert_eq!(filed["approvers"], json!(["order_owner"]));
    let id = filed["id"].as_str().unwrap().to_string();
    // Asking again (an agent at every start-up) answers the same pending request.
    let (status, again) = registry.post(REQUESTS, Some(&token("intent_parser")), &ask).await;
    assert_eq!((status, again["id"].as_str()), (200, Some(id.as_str())), "{again}");

    // Who sees it: the caller, the approvers and operators; nobody else.
    for (reader, sees) in [
        ("intent_parser", true),
        ("order_owner", true),
        ("ops", true),
        ("stranger", false),
    ] {
        let (status, list) = registry
            .get(&format!("{REQUESTS}?status=pending"), &token(reader))
            .await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(ids(&list) == [id.as_str()], sees, "{reader}: {list}");
    }
    let (status, body) = registry.get(&format!("{REQUESTS}/{id}"), &token("stranger")).await;
    assert_eq!((status, code(&body)), (404, "ACCESS_REQUEST_NOT_FOUND"), "{body}");
    let (status, shown) = registry.get(&format!("{REQUESTS}/{id}"), &token("intent_parser")).await;
    assert_eq!((status, shown["status"].as_str()), (200, Some("pending")), "{shown}");

    // Only an approver of the capability decides: an operator is not one.
    for outsider in ["stranger", "ops", "intent_parser"] {
        let (status, body) = registry
            .post(&format!("{REQUESTS}/{id}/approve"), Some(&token(outsider)), &json!({}))
            .await;
        assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{outsider}: {body}");
        assert_eq!(body["error"]["details"]["reason"], "not_an_owner");
        assert_eq!(body["error"]["details"]["approvers"], json!(["order_owner"]));
    }
    let (status, approved) = registry
        .post(
            &format!("{REQUESTS}/{id}/approve"),
            Some(&token("order_owner")),
            &json!({ "note": "for the Q3 launch" }),
        )
        .await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["id"], id.as_str());
    assert_eq!(approved["status"], "approved");
    assert_eq!(approved["decided_by"], "order_owner");
    assert_eq!(approved["note"], "for the Q3 launch");
    assert!(approved["decided_at_ms"].as_u64().is_some());
    let grant_id = approved["grant_id"].as_str().unwrap().to_string();
    let expires = approved["expires_at_ms"].as_u64().unwrap();
    assert!(expires > approved["decided_at_ms"].as_u64().unwrap() + 3_500_000);

    // Published on the Watch.
    let event = next_event(&mut stream).await;
    let Some(pb::watch_event::Kind::GrantSet(grant)) = &event.kind else {
        panic!("expected grant_set, got {event:?}");
    };
    assert_eq!(
        (grant.id.as_str(), grant.caller.as_str(), grant.capability.as_str()),
        (grant_id.as_str(), "intent_parser", "order.query")
    );
    assert_eq!(
        (grant.expires_at_ms, grant.granted_by.as_str()),
        (expires, "order_owner")
    );
    assert_eq!(grant.request_id, id);

    // Stored in etcd under the tenant's layout: the grant on a lease, the decision on the request.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let stored = store
        .get(&format!("/agent-reach/v1/default/grants/{grant_id}"))
        .await
        .unwrap()
        .expect("the grant's key");
    assert_ne!(stored.lease, 0, "a grant with ttl_s lives on a lease");
    let record = store
        .get(&format!("/agent-reach/v1/default/access-requests/{id}"))
        .await
        .unwrap()
        .expect("the request's key");
    let record: Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(
        (record["status"].as_str(), record["decided_by"].as_str()),
        (Some("approved"), Some("order_owner"))
    );

    // Decided once; asking again is already allowed.
    for verb in ["approve", "deny"] {
        let (status, body) = registry
            .post(
                &format!("{REQUESTS}/{id}/{verb}"),
                Some(&token("order_owner")),
                &json!({}),
            )
            .await;
        assert_eq!((status, code(&body)), (409, "ALREADY_DECIDED"), "{verb}: {body}");
        assert_eq!(body["error"]["details"]["decided_by"], "order_owner");
    }
    let (status, body) = registry.post(REQUESTS, Some(&token("intent_parser")), &ask).await;
    assert_eq!((status, code(&body)), (409, "ALREADY_ALLOWED"), "{body}");
    assert_eq!(body["error"]["details"]["grant_id"], grant_id.as_str());

    // Grants: the grantee, approvers and operators see it; a sibling registry serves it from etcd.
    let (_, grants) = registry.get("/v1/grants", &token("intent_parser")).await;
    assert_eq!(grants["grants"][0]["id"], grant_id.as_str(), "{grants}");
    let (_, grants) = registry
        .get("/v1/grants?capability=order.query", &token("stranger"))
        .await;
    assert_eq!(grants["grants"], json!([]), "{grants}");
    let sibling = registry.sibling(on(&etcd)).await;
    let seen = wait_for(Duration::from_secs(5), || async {
        sibling.get("/v1/grants?caller=intent_parser", &token("ops")).await.1["grants"][0]["id"] == grant_id.as_str()
    })
    .await;
    assert!(seen, "a fresh registry loads the grant from etcd");

    // Revoked by an approver (not by others): removed on the Watch, the request says who.
    let path = format!("/v1/grants/{grant_id}");
    let (status, body) = registry.delete(&path, &token("intent_parser")).await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");
    let (status, body) = registry.delete(&path, &token("order_owner")).await;
    assert_eq!(status, 204, "{body}");
    let event = next_event(&mut stream).await;
    let Some(pb::watch_event::Kind::GrantRemoved(removed)) = &event.kind else {
        panic!("expected grant_removed, got {event:?}");
    };
    assert_eq!(removed.id, grant_id);
    let (_, shown) = registry.get(&format!("{REQUESTS}/{id}"), &token("ops")).await;
    assert_eq!(
        (shown["status"].as_str(), shown["revoked_by"].as_str()),
        (Some("revoked"), Some("order_owner"))
    );
    let (status, body) = registry.delete(&path, &token("order_owner")).await;
    assert_eq!((status, code(&body)), (404, "GRANT_NOT_FOUND"), "{body}");
    assert!(store
        .get(&format!("/agent-reach/v1/default/grants/{grant_id}"))
        .await
        .unwrap()
        .is_none());

    // Denied: no grant, the decision kept; an operator may file for another caller.
    let for_billing = json!({ "caller": "billing", "capability": "order.query", "reason": "invoices" });
    let (status, filed) = registry.post(REQUESTS, Some(&token("ops")), &for_billing).await;
    assert_eq!(
        (status, filed["caller"].as_str(), filed["requested_by"].as_str()),
        (201, Some("billing"), Some("ops"))
    );
    let denied_id = filed["id"].as_str().unwrap();
    let (status, denied) = registry
        .post(
            &format!("{REQUESTS}/{denied_id}/deny"),
            Some(&token("order_owner")),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "{denied}");
    assert_eq!(
        (denied["status"].as_str(), denied["grant_id"].as_str()),
        (Some("denied"), None)
    );
    let (_, list) = registry.get(&format!("{REQUESTS}?status=denied"), &token("ops")).await;
    assert_eq!(ids(&list), [denied_id]);
    let (_, list) = registry.get(&format!("{REQUESTS}?status=revoked"), &token("ops")).await;
    assert_eq!(ids(&list), [id.as_str()]);
    let metrics = registry.get("/metrics", &token("ops")).await.1;
    let metrics = metrics.as_str().unwrap();
    for decision in ["requested\"} 2", "approved\"} 1", "denied\"} 1", "revoked\"} 1"] {
        assert!(
            metrics.contains(&format!(
                "agent_reach_registry_access_decisions_total{{decision=\"{decision}"
            )),
            "{decision}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_with_ttl_expires_at_once_and_leaves_with_its_lease() {
    let etcd = Etcd::start();
    let registry = registry_with_order_query(&etcd).await;
    let ask = json!({ "capability": "order.query", "reason": "a short test", "ttl_s": 2 });
    let (_, filed) = registry.post(REQUESTS, Some(&token("intent_parser")), &ask).await;
    let id = filed["id"].as_str().unwrap();
    let (status, approved) = registry
        .post(
            &format!("{REQUESTS}/{id}/approve"),
            Some(&token("order_owner")),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "{approved}");
    let grant_id = approved["grant_id"].as_str().unwrap().to_string();
    let mut stream = watch(&registry).await;
    match next_event(&mut stream).await.kind {
        Some(pb::watch_event::Kind::Snapshot(snapshot)) => {
            assert_eq!(snapshot.grants.len(), 1);
            assert_eq!(snapshot.grants[0].id, grant_id);
        }
        other => panic!("a watch starts with a snapshot: {other:?}"),
    }
    // Past its expiry it is no longer listed and the request reads `expired`,
    // whenever etcd gets round to ending the lease; then the Watch removes it.
    let expired = wait_for(Duration::from_secs(5), || async {
        let (_, shown) = registry.get(&format!("{REQUESTS}/{id}"), &token("intent_parser")).await;
        shown["status"] == "expired"
    })
    .await;
    assert!(expired, "the request reads expired after its ttl");
    let (_, grants) = registry.get("/v1/grants", &token("ops")).await;
    assert_eq!(grants["grants"], json!([]), "an expired grant is not live: {grants}");
    let event = next_event(&mut stream).await;
    let Some(pb::watch_event::Kind::GrantRemoved(removed)) = &event.kind else {
        panic!("expected grant_removed, got {event:?}");
    };
    assert_eq!(removed.id, grant_id);
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    assert!(store
        .get(&format!("/agent-reach/v1/default/grants/{grant_id}"))
        .await
        .unwrap()
        .is_none());
    // The caller may ask again.
    let (status, again) = registry.post(REQUESTS, Some(&token("intent_parser")), &ask).await;
    assert_eq!((status, again["status"].as_str()), (201, Some("pending")), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_code_and_writes_nothing() {
    let etcd = Etcd::start();
    let registry = registry_with_order_query(&etcd).await;
    let (status, body) = registry
        .post("/v1/agents", Some(&token("shipping_rules")), &{
            let mut body = registration("shipping_rules-1", 30);
            body["name"] = json!("shipping_rules");
            body["capabilities"][0]["name"] = json!("shipping.rules");
            body
        })
        .await;
    assert_eq!(status, 201, "{body}");
    let me = token("intent_parser");
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            json!({ "capability": "order.nothing", "reason": "r" }),
            404,
            "CAPABILITY_NOT_FOUND",
            "capability",
        ),
        (
            json!({ "capability": "Order.Query", "reason": "r" }),
            400,
            "INVALID_CAPABILITY_NAME",
            "capability",
        ),
        (
            json!({ "capability": "order.query", "reason": " " }),
            400,
            "INVALID_ACCESS_REQUEST",
            "reason",
        ),
        (
            json!({ "capability": "order.query", "reason": "x".repeat(1001) }),
            400,
            "INVALID_ACCESS_REQUEST",
            "reason",
        ),
        (
            json!({ "capability": "order.query", "reason": "r", "ttl_s": 0 }),
            400,
            "INVALID_TTL",
            "ttl_s",
        ),
        (
            json!({ "capability": "order.query", "reason": "r", "ttl_s": 40_000_000 }),
            400,
            "INVALID_TTL",
            "ttl_s",
        ),
        (
            json!({ "capability": "order.query", "reason": "r", "ttl_s": -1 }),
            400,
            "INVALID_FIELD_TYPE",
            "ttl_s",
        ),
        (json!({ "capability": "order.query" }), 400, "MISSING_FIELD", "reason"),
        (
            json!({ "capability": "order.query", "reason": "r", "why": 1 }),
            400,
            "UNKNOWN_FIELD",
            "why",
        ),
        (
            json!({ "caller": "Bad Name", "capability": "order.query", "reason": "r" }),
            400,
            "INVALID_NAME",
            "caller",
        ),
        (
            json!({ "caller": "billing", "capability": "order.query", "reason": "r" }),
            403,
            "FORBIDDEN",
            "caller",
        ),
        (
            json!({ "capability": "shipping.rules", "reason": "r" }),
            409,
            "NO_OWNER",
            "capability",
        ),
    ];
    for (body, status, expected, field) in cases {
        let (got, answer) = registry.post(REQUESTS, Some(&me), &body).await;
        assert_eq!((got, code(&answer)), (status, expected), "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
    }
    // A caller the file already lets call it.
    let (status, body) = registry
        .post(
            REQUESTS,
            Some(&token("reader")),
            &json!({ "capability": "order.query", "reason": "r" }),
        )
        .await;
    assert_eq!((status, code(&body)), (409, "ALREADY_ALLOWED"), "{body}");
    assert_eq!(body["error"]["details"]["by"], "acl");
    let (status, body) = registry
        .post(REQUESTS, None, &json!({ "capability": "order.query", "reason": "r" }))
        .await;
    assert_eq!((status, code(&body)), (401, "UNAUTHENTICATED"), "{body}");
    let (status, body) = registry.post_raw(REQUESTS, &me, b"{oops".to_vec()).await;
    assert_eq!((status, code(&body)), (400, "MALFORMED_JSON"), "{body}");

    // Unknown ids, filters and decisions.
    for verb in ["approve", "deny"] {
        let (status, body) = registry
            .post(
                &format!("{REQUESTS}/ar-0000000000000000/{verb}"),
                Some(&token("order_owner")),
                &json!({}),
            )
            .await;
        assert_eq!((status, code(&body)), (404, "ACCESS_REQUEST_NOT_FOUND"), "{body}");
    }
    let (status, body) = registry.get(&format!("{REQUESTS}/ar-nope"), &me).await;
    assert_eq!((status, code(&body)), (404, "ACCESS_REQUEST_NOT_FOUND"), "{body}");
    let (status, body) = registry.delete("/v1/grants/gr-0000000000000000", &token("ops")).await;
    assert_eq!((status, code(&body)), (404, "GRANT_NOT_FOUND"), "{body}");
    let (status, body) = registry.get(&format!("{REQUESTS}?status=sleeping"), &me).await;
    assert_eq!(
        (status, code(&body), body["error"]["field"].as_str()),
        (400, "INVALID_STATUS", Some("status"))
    );
    let (status, body) = registry.get(&format!("{REQUESTS}?owner=x"), &me).await;
    assert_eq!((status, code(&body)), (400, "UNKNOWN_FIELD"), "{body}");
    let (status, body) = registry.get("/v1/grants?who=x", &me).await;
    assert_eq!((status, code(&body)), (400, "UNKNOWN_FIELD"), "{body}");
    let (status, body) = registry.put(REQUESTS, &me, &json!({})).await;
    assert_eq!((status, code(&body)), (405, "METHOD_NOT_ALLOWED"), "{body}");

    // None of it was written; a note too long refuses the decision and keeps it pending.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let (kvs, _) = store.list("/agent-reach/v1/default/access-requests/").await.unwrap();
    assert!(kvs.is_empty(), "{kvs:?}");
    let (_, filed) = registry
        .post(
            REQUESTS,
            Some(&me),
            &json!({ "capability": "order.query", "reason": "r" }),
        )
        .await;
    let id = filed["id"].as_str().unwrap();
    let (status, body) = registry
        .post(
            &format!("{REQUESTS}/{id}/approve"),
            Some(&token("order_owner")),
            &json!({ "note": "n".repeat(1001) }),
        )
        .await;
    assert_eq!(
        (status, code(&body), body["error"]["field"].as_str()),
        (400, "INVALID_ACCESS_REQUEST", Some("note"))
    );
    let (status, body) = registry
        .post(
            &format!("{REQUESTS}/{id}/approve"),
            Some(&token("order_owner")),
            &json!({ "grant": 1 }),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "UNKNOWN_FIELD"), "{body}");
    let (_, shown) = registry.get(&format!("{REQUESTS}/{id}"), &me).await;
    assert_eq!(shown["status"], "pending");
    let (kvs, _) = store.list("/agent-reach/v1/default/grants/").await.unwrap();
    assert!(kvs.is_empty(), "{kvs:?}");
}

/// Another tenant's requests and grants are not found, even for an
/// approver of the same name, and its keys stay under its own prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_requests_and_grants_are_not_found() {
    let etcd = Etcd::start();
    let dir = Arc::new(tempfile::tempdir().unwrap());
    std::fs::write(dir.path().join("acl.yaml"), ACL).unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    std::fs::write(
        dir.path().join("tenants.yaml"),
        "version: 1\ntenants:\n  team-a: {}\n  team-b: {}\n",
    )
    .unwrap();
    let settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: on(&etcd),
        acl: dir.path().join("acl.yaml"),
        auth: AuthConfig::Hs256SecretFile(dir.path().join("secret")),
        listener_tls: None,
        service: RegistryConfig {
            tenant: "team-a".into(),
            tenant_map: Some(dir.path().join("tenants.yaml")),
            ..Default::default()
        },
    };
    let process = agent_reach_testkit::RegistryProcess::start(settings);
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", process.addr);
    let of = |name: &str, tenant: &str| {
        agent_reach_access::token::issue_hs256_for(name, Some(tenant), SECRET.as_bytes(), Duration::from_secs(600))
            .unwrap()
    };
    let send = |request: reqwest::RequestBuilder, token: String| async move {
        let response = request.bearer_auth(token).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
        )
    };
    for tenant in ["team-a", "team-b"] {
        let registered = wait_for(Duration::from_secs(10), || async {
            let request = http.post(url("/v1/agents")).json(&registration("order_query-1", 30));
            send(request, of("order_query", tenant)).await.0 == 201
        })
        .await;
        assert!(registered, "{tenant}");
    }
    let ask = json!({ "capability": "order.query", "reason": "team a's own need" });
    let (status, filed) = send(http.post(url(REQUESTS)).json(&ask), of("intent_parser", "team-a")).await;
    assert_eq!(status, 201, "{filed}");
    let id = filed["id"].as_str().unwrap().to_string();

    // team-b's approver of the same name cannot see or decide team-a's request.
    let owner_b = of("order_owner", "team-b");
    let (status, body) = send(http.post(url(&format!("{REQUESTS}/{id}/approve"))), owner_b.clone()).await;
    assert_eq!((status, code(&body)), (404, "ACCESS_REQUEST_NOT_FOUND"), "{body}");
    let (_, list) = send(http.get(url(REQUESTS)), owner_b.clone()).await;
    assert_eq!(list["requests"], json!([]), "{list}");

    let (status, approved) = send(
        http.post(url(&format!("{REQUESTS}/{id}/approve"))),
        of("order_owner", "team-a"),
    )
    .await;
    assert_eq!(status, 200, "{approved}");
    let grant_id = approved["grant_id"].as_str().unwrap();
    let (status, body) = send(http.delete(url(&format!("/v1/grants/{grant_id}"))), owner_b.clone()).await;
    assert_eq!((status, code(&body)), (404, "GRANT_NOT_FOUND"), "{body}");
    let (_, grants) = send(http.get(url("/v1/grants")), of("ops", "team-b")).await;
    assert_eq!(grants["grants"], json!([]), "{grants}");
    let (_, grants) = send(http.get(url("/v1/grants")), of("ops", "team-a")).await;
    assert_eq!(grants["grants"][0]["id"], grant_id, "{grants}");

    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let (keys, _) = store.list("/agent-reach/v1/").await.unwrap();
    let access_keys: Vec<&str> = keys
        .iter()
        .map(|kv| kv.key.as_str())
        .filter(|key| key.contains("/grants/") || key.contains("/access-requests/"))
        .collect();
    assert_eq!(access_keys.len(), 2, "{access_keys:?}");
    assert!(
        access_keys.iter().all(|key| key.starts_with("/agent-reach/v1/team-a/")),
        "{access_keys:?}"
    );
}
