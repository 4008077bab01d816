//! The operator API (issue 21, point 2) against a real etcd: traffic splits
//! stored under `/agent-reach/v1/{tenant}/splits/{capability}` and capability
//! policies under `…/policies/{capability}` (issue 38), both published on the
//! `Watch` stream, live weights written on the instance's record under its
//! lease; who may call them; and a stable code for every bad body.

use crate::support;

use std::time::Duration;

use agent_reach_proto::registry as pb;
use agent_reach_registry::store::{EtcdStore, Store};
use agent_reach_registry::StoreChoice;
use agent_reach_testkit::Etcd;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{authed, registration, wait_for, TestRegistry};

fn on(etcd: &Etcd) -> StoreChoice {
    StoreChoice::Etcd(vec![etcd.endpoint()])
}

fn ops() -> String {
    TestRegistry::token("ops")
}

const SPLIT: &str = "/v1/capabilities/order.query/split";

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

fn weights(split: &pb::CapabilitySplit) -> Vec<(String, u32)> {
    split
        .weights
        .iter()
        .map(|share| (share.version.clone(), share.weight))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splits_are_stored_in_etcd_watched_and_cleared_by_operators() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let mut grpc = registry.grpc().await;
    let mut watch = grpc
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &ops(),
        ))
        .await
        .unwrap()
        .into_inner();
    let first = next_event(&mut watch).await;
    let Some(pb::watch_event::Kind::Snapshot(snapshot)) = first.kind else {
        panic!("a watch starts with a snapshot: {first:?}");
    };
    assert!(snapshot.splits.is_empty());

    // No split yet: a clear 404 for any reader.
    let (status, body) = registry.get(SPLIT, &TestRegistry::token("reader")).await;
    assert_eq!((status, code(&body)), (404, "SPLIT_NOT_FOUND"), "{body}");

    // Only operators may set one (an agent is not one, even for its own capability).
    let canary = json!({ "weights": { "2.0.0": 5, "1.4.2": 95 } });
    for caller in ["order_query", "reader"] {
        let (status, body) = registry.put(SPLIT, &TestRegistry::token(caller), &canary).await;
        assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{caller}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("operators"),
            "{body}"
        );
    }
    let (status, body) = registry.put(SPLIT, &ops(), &canary).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["capability"], "order.query");
    assert_eq!(body["weights"], json!({ "1.4.2": 95, "2.0.0": 5 }));
    assert_eq!(body["updated_by"], "ops");
    assert!(body["revision"].as_i64().unwrap() > first.revision);

    // Published on the Watch, highest version first, and readable at once.
    let event = next_event(&mut watch).await;
    let Some(pb::watch_event::Kind::SplitSet(split)) = &event.kind else {
        panic!("expected a split_set event, got {event:?}");
    };
    assert_eq!(weights(split), [("2.0.0".to_string(), 5), ("1.4.2".to_string(), 95)]);
    assert_eq!(split.updated_by, "ops");
    let (status, body) = registry.get(SPLIT, &TestRegistry::token("reader")).await;
    assert_eq!(
        (status, body["weights"].clone()),
        (200, json!({ "1.4.2": 95, "2.0.0": 5 }))
    );

    // Stored in etcd under the tenant's key layout, without a lease.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let stored = store
        .get("/agent-reach/v1/default/splits/order.query")
        .await
        .unwrap()
        .expect("the split's key");
    assert_eq!(stored.lease, 0);
    let record: Value = serde_json::from_slice(&stored.value).unwrap();
    assert_eq!(record["weights"], json!({ "1.4.2": 95, "2.0.0": 5 }));

    // Another registry (a fresh catalog) serves it from etcd, in its snapshot too.
    let sibling = registry.sibling(on(&etcd)).await;
    let loaded = wait_for(Duration::from_secs(5), || async {
        sibling.get(SPLIT, &ops()).await.0 == 200
    })
    .await;
    assert!(loaded, "a fresh registry loads the split from etcd");
    let (_, body) = sibling.get(SPLIT, &ops()).await;
    assert_eq!(body["weights"]["2.0.0"], json!(5), "{body}");
    let mut sibling_watch = sibling
        .grpc()
        .await
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &ops(),
        ))
        .await
        .unwrap()
        .into_inner();
    match next_event(&mut sibling_watch).await.kind {
        Some(pb::watch_event::Kind::Snapshot(snapshot)) => {
            assert_eq!(snapshot.splits.len(), 1);
            assert_eq!(snapshot.splits[0].capability, "order.query");
        }
        other => panic!("expected a snapshot, got {other:?}"),
    }

    // Replacing is a new split_set; clearing is split_cleared, then 404; clearing again is fine.
    let (status, _) = registry
        .put(SPLIT, &ops(), &json!({ "weights": { "2.0.0": 50, "1.4.2": 50 } }))
        .await;
    assert_eq!(status, 200);
    match next_event(&mut watch).await.kind {
        Some(pb::watch_event::Kind::SplitSet(split)) => assert_eq!(split.weights[0].weight, 50),
        other => panic!("expected split_set, got {other:?}"),
    }
    let (status, body) = registry.delete(SPLIT, &TestRegistry::token("order_query")).await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");
    let (status, _) = registry.delete(SPLIT, &ops()).await;
    assert_eq!(status, 204);
    match next_event(&mut watch).await.kind {
        Some(pb::watch_event::Kind::SplitCleared(cleared)) => assert_eq!(cleared.capability, "order.query"),
        other => panic!("expected split_cleared, got {other:?}"),
    }
    let (status, body) = registry.get(SPLIT, &ops()).await;
    assert_eq!((status, code(&body)), (404, "SPLIT_NOT_FOUND"));
    let (status, _) = registry.delete(SPLIT, &ops()).await;
    assert_eq!(status, 204, "clearing a split that is not there reaches the goal");
    assert!(store
        .get("/agent-reach/v1/default/splits/order.query")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_split_requests_get_stable_codes() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let cases: Vec<(Value, u16, &str, Option<&str>)> = vec![
        (json!({}), 400, "MISSING_FIELD", Some("weights")),
        (json!({ "weights": {} }), 400, "INVALID_SPLIT", Some("weights")),
        (
            json!({ "weights": { "2.0.0": 0, "1.0.0": 0 } }),
            400,
            "INVALID_SPLIT",
            Some("weights"),
        ),
        (
            json!({ "weights": { "2.0": 5 } }),
            400,
            "INVALID_VERSION",
            Some("weights.2.0"),
        ),
        (
            json!({ "weights": { "v2.0.0": 5 } }),
            400,
            "INVALID_VERSION",
            Some("weights.v2.0.0"),
        ),
        (
            json!({ "weights": { "2.0.0": -1 } }),
            400,
            "INVALID_SPLIT",
            Some("weights.2.0.0"),
        ),
        (
            json!({ "weights": { "2.0.0": 2.5 } }),
            400,
            "INVALID_SPLIT",
            Some("weights.2.0.0"),
        ),
        (
            json!({ "weights": { "2.0.0": "5" } }),
            400,
            "INVALID_SPLIT",
            Some("weights.2.0.0"),
        ),
        (
            json!({ "weights": { "2.0.0": 10_001 } }),
            400,
            "INVALID_SPLIT",
            Some("weights.2.0.0"),
        ),
        (json!({ "weights": [5, 95] }), 400, "INVALID_FIELD_TYPE", None),
        (
            json!({ "weights": { "2.0.0": 5 }, "ratio": 1 }),
            400,
            "UNKNOWN_FIELD",
            None,
        ),
    ];
    for (body, status, expected, field) in cases {
        let (got, answer) = registry.put(SPLIT, &ops(), &body).await;
        assert_eq!((got, code(&answer)), (status, expected), "{body} → {answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], field, "{body} → {answer}");
        }
        assert!(!answer["error"]["message"].as_str().unwrap_or_default().is_empty());
    }
    let too_many: serde_json::Map<String, Value> = (0..65).map(|minor| (format!("1.{minor}.0"), json!(1))).collect();
    let (status, body) = registry.put(SPLIT, &ops(), &json!({ "weights": too_many })).await;
    assert_eq!((status, code(&body)), (400, "INVALID_SPLIT"), "{body}");

    let (status, body) = registry
        .put(
            "/v1/capabilities/Order.Query/split",
            &ops(),
            &json!({ "weights": { "1.0.0": 1 } }),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_CAPABILITY_NAME"), "{body}");
    let (status, body) = registry.get("/v1/capabilities/Order.Query/split", &ops()).await;
    assert_eq!((status, code(&body)), (400, "INVALID_CAPABILITY_NAME"), "{body}");
    let response = reqwest::Client::new()
        .put(registry.url(SPLIT))
        .bearer_auth(ops())
        .header("content-type", "application/json")
        .body("{\"weights\": {")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(code(&body), "MALFORMED_JSON");
    let response = reqwest::Client::new()
        .put(registry.url(SPLIT))
        .json(&json!({ "weights": { "1.0.0": 1 } }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let response = reqwest::Client::new()
        .post(registry.url(SPLIT))
        .bearer_auth(ops())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    let body: Value = response.json().await.unwrap();
    assert_eq!(code(&body), "METHOD_NOT_ALLOWED");
    // Nothing was written by any of it.
    let (status, body) = registry.get(SPLIT, &ops()).await;
    assert_eq!((status, code(&body)), (404, "SPLIT_NOT_FOUND"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_weight_changes_under_the_lease_and_survives_heartbeats() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let agent = TestRegistry::token("order_query");
    let (status, registered) = registry
        .post("/v1/agents", Some(&agent), &registration("oq-w1", 15))
        .await;
    assert_eq!(status, 201, "{registered}");
    let lease = registered["lease_id"].as_i64().unwrap();
    let (_, before) = registry.get("/v1/agents/oq-w1", &agent).await;
    assert_eq!(before["weight"], 3);
    let mut watch = registry
        .grpc()
        .await
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &ops(),
        ))
        .await
        .unwrap()
        .into_inner();
    next_event(&mut watch).await; // the snapshot

    // Not an operator and not the agent: refused, nothing written.
    let (status, body) = registry
        .put(
            "/v1/agents/oq-w1/weight",
            &TestRegistry::token("reader"),
            &json!({ "weight": 9 }),
        )
        .await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");

    // An operator: the record changes in place, same lease, same registration.
    let (status, body) = registry
        .put("/v1/agents/oq-w1/weight", &ops(), &json!({ "weight": 8 }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["weight"].clone(), body["lease_id"].clone()),
        (json!(8), json!(lease))
    );
    assert_eq!(body["registered_at_ms"], before["registered_at_ms"]);
    assert_eq!(
        body["operator_weight"],
        json!(true),
        "an operator's weight is marked: {body}"
    );
    match next_event(&mut watch).await.kind {
        Some(pb::watch_event::Kind::Updated(instance)) => {
            assert_eq!((instance.agent_id.as_str(), instance.weight), ("oq-w1", 8));
            assert!(
                instance.operator_weight,
                "routers learn that adaptive must leave it alone"
            );
        }
        other => panic!("expected an update, got {other:?}"),
    }
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let stored = store
        .get("/agent-reach/v1/default/agents/oq-w1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.lease, lease, "the record stays on the agent's lease");

    // Heartbeats (plain, and one that changes the status) keep the weight.
    let (status, _) = registry
        .put("/v1/agents/oq-w1/heartbeat", &agent, &json!({ "lease_id": lease }))
        .await;
    assert_eq!(status, 200);
    let (status, _) = registry
        .put(
            "/v1/agents/oq-w1/heartbeat",
            &agent,
            &json!({ "lease_id": lease, "status": "busy" }),
        )
        .await;
    assert_eq!(status, 200);
    let (_, after) = registry.get("/v1/agents/oq-w1", &agent).await;
    assert_eq!(
        (after["weight"].clone(), after["status"].clone()),
        (json!(8), json!("busy"))
    );

    // The agent itself may change its own weight.
    let (status, body) = registry
        .put("/v1/agents/oq-w1/weight", &agent, &json!({ "weight": 2 }))
        .await;
    assert_eq!((status, body["weight"].clone()), (200, json!(2)), "{body}");
    assert_eq!(
        body.get("operator_weight"),
        None,
        "the agent's own weight is not an operator's"
    );

    // Bad input: stable codes.
    for (body, expected) in [
        (json!({ "weight": 0 }), "INVALID_WEIGHT"),
        (json!({ "weight": 1001 }), "INVALID_WEIGHT"),
        (json!({ "weight": -1 }), "INVALID_FIELD_TYPE"),
        (json!({ "weight": "8" }), "INVALID_FIELD_TYPE"),
        (json!({}), "MISSING_FIELD"),
        (json!({ "weight": 4, "lease_id": lease }), "UNKNOWN_FIELD"),
    ] {
        let (status, answer) = registry.put("/v1/agents/oq-w1/weight", &ops(), &body).await;
        assert_eq!((status, code(&answer)), (400, expected), "{body} → {answer}");
    }
    let (status, body) = registry
        .put("/v1/agents/nobody-1/weight", &ops(), &json!({ "weight": 4 }))
        .await;
    assert_eq!((status, code(&body)), (404, "AGENT_NOT_FOUND"), "{body}");
    let (status, body) = registry
        .put("/v1/agents/bad id/weight", &ops(), &json!({ "weight": 4 }))
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_AGENT_ID"), "{body}");

    // A re-registration by the agent sets its own weight again.
    let (status, _) = registry
        .post("/v1/agents", Some(&agent), &registration("oq-w1", 15))
        .await;
    assert_eq!(status, 201);
    let (_, again) = registry.get("/v1/agents/oq-w1", &agent).await;
    assert_eq!(again["weight"], 3);
}

/// An operator's drain: the instance becomes `draining` in place, on its
/// lease; its heartbeats keep the lease but cannot undo the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drains_an_instance_and_heartbeats_cannot_undo_it() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let agent = TestRegistry::token("order_query");
    let (status, registered) = registry
        .post("/v1/agents", Some(&agent), &registration("oq-d1", 15))
        .await;
    assert_eq!(status, 201, "{registered}");
    let lease = registered["lease_id"].as_i64().unwrap();

    // Only operators; not even the agent itself (it drains by its own heartbeat).
    for caller in ["reader", "order_query"] {
        let (status, body) = registry
            .post("/v1/agents/oq-d1/drain", Some(&TestRegistry::token(caller)), &json!({}))
            .await;
        assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{caller}: {body}");
    }
    let (status, body) = registry
        .post("/v1/agents/nobody-1/drain", Some(&ops()), &json!({}))
        .await;
    assert_eq!((status, code(&body)), (404, "AGENT_NOT_FOUND"), "{body}");

    let (status, body) = registry.post("/v1/agents/oq-d1/drain", Some(&ops()), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["status"].clone(), body["lease_id"].clone()),
        (json!("draining"), json!(lease))
    );
    let (status, again) = registry.post("/v1/agents/oq-d1/drain", Some(&ops()), &json!({})).await;
    assert_eq!((status, again["status"].clone()), (200, json!("draining")));

    // A heartbeat still renews the lease; one asking for `ready` is refused.
    let (status, _) = registry
        .put("/v1/agents/oq-d1/heartbeat", &agent, &json!({ "lease_id": lease }))
        .await;
    assert_eq!(status, 200);
    let (status, body) = registry
        .put(
            "/v1/agents/oq-d1/heartbeat",
            &agent,
            &json!({ "lease_id": lease, "status": "ready" }),
        )
        .await;
    assert_eq!((status, code(&body)), (409, "INVALID_STATUS_TRANSITION"), "{body}");
    let (_, after) = registry.get("/v1/agents/oq-d1", &agent).await;
    assert_eq!(after["status"], "draining");
}

/// `GET /v1/heartbeats`, polled until `agent_id`'s age satisfies `ok`
/// (bounded); the matching entry.
async fn heartbeat_of(registry: &TestRegistry, agent_id: &str, ok: impl Fn(i64) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = registry.get("/v1/heartbeats", &ops()).await;
        assert_eq!(status, 200, "{body}");
        let entry = body["heartbeats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["agent_id"] == agent_id)
            .cloned();
        if let Some(entry) = entry.filter(|entry| ok(entry["age_s"].as_i64().unwrap())) {
            return entry;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "`{agent_id}` never matched in {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The console's "last heartbeat" column: every live instance's lease age,
/// read from the store, so a heartbeat sent to one registry replica shows
/// on every other. `writer` takes the heartbeats, `reader` answers the ages.
async fn heartbeat_ages_follow_the_lease(writer: &TestRegistry, reader: &TestRegistry) {
    let agent = TestRegistry::token("order_query");
    let mut leases = Vec::new();
    for agent_id in ["oq-h1", "oq-h2"] {
        let (status, registered) = writer
            .post("/v1/agents", Some(&agent), &registration(agent_id, 10))
            .await;
        assert_eq!(status, 201, "{registered}");
        leases.push(registered["lease_id"].as_i64().unwrap());
    }
    assert!(
        wait_for(Duration::from_secs(5), || async {
            reader.resolved("order.query").await.len() == 2
        })
        .await,
        "the reader's catalog never saw both instances"
    );

    let fresh = heartbeat_of(reader, "oq-h1", |age| age <= 1).await;
    assert_eq!(
        (fresh["lease_id"].as_i64(), fresh["ttl_s"].as_i64()),
        (Some(leases[0]), Some(10)),
        "{fresh}"
    );
    let sum = fresh["age_s"].as_i64().unwrap() + fresh["remaining_s"].as_i64().unwrap();
    assert_eq!(sum, 10, "age + remaining = granted TTL: {fresh}");

    // No heartbeat: the age grows; one heartbeat (to the writer) resets it on the reader.
    heartbeat_of(reader, "oq-h1", |age| age >= 2).await;
    let (status, body) = writer
        .put("/v1/agents/oq-h1/heartbeat", &agent, &json!({ "lease_id": leases[0] }))
        .await;
    assert_eq!(status, 200, "{body}");
    heartbeat_of(reader, "oq-h1", |age| age <= 1).await;

    // A deregistered instance is no longer listed.
    let (status, _) = writer.delete("/v1/agents/oq-h2", &agent).await;
    assert_eq!(status, 204);
    assert!(
        wait_for(Duration::from_secs(5), || async {
            let (_, body) = reader.get("/v1/heartbeats", &ops()).await;
            body["heartbeats"]
                .as_array()
                .is_some_and(|all| all.iter().all(|entry| entry["agent_id"] != "oq-h2"))
        })
        .await,
        "oq-h2 outlived its deregistration"
    );

    // Operators only, with the stable codes of the operator API.
    for caller in ["reader", "order_query"] {
        let (status, body) = reader.get("/v1/heartbeats", &TestRegistry::token(caller)).await;
        assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{caller}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("operators"),
            "{body}"
        );
    }
    let anonymous = reqwest::get(reader.url("/v1/heartbeats")).await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let body: Value = anonymous.json().await.unwrap();
    assert_eq!(code(&body), "UNAUTHENTICATED", "{body}");
    let (status, body) = reader.post("/v1/heartbeats", Some(&ops()), &json!({})).await;
    assert_eq!((status, code(&body)), (405, "METHOD_NOT_ALLOWED"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_ages_come_from_etcd_and_agree_across_replicas() {
    let etcd = Etcd::start();
    let first = TestRegistry::start(on(&etcd)).await;
    let second = first.sibling(on(&etcd)).await;
    heartbeat_ages_follow_the_lease(&first, &second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_ages_on_the_embedded_store() {
    let registry = TestRegistry::start(StoreChoice::Embedded).await;
    heartbeat_ages_follow_the_lease(&registry, &registry).await;
}

const POLICY: &str = "/v1/capabilities/order.query/policy";

/// A capability's default policy (DESIGN §9): set by operators, stored in
/// etcd without a lease, in the Watch's snapshot and deltas, cleared; bad
/// policies and callers get stable codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capability_policies_are_stored_in_etcd_watched_and_cleared_by_operators() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let mut watch = registry
        .grpc()
        .await
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &ops(),
        ))
        .await
        .unwrap()
        .into_inner();
    next_event(&mut watch).await; // the snapshot

    let (status, body) = registry.get(POLICY, &ops()).await;
    assert_eq!((status, code(&body)), (404, "POLICY_NOT_FOUND"), "{body}");
    for (request, status_code, expected) in [
        (json!({ "policy": "random" }), 400, "INVALID_POLICY"),
        (json!({ "policy": "plugin:Bad-Name" }), 400, "INVALID_POLICY"),
        (json!({ "policy": 3 }), 400, "INVALID_FIELD_TYPE"),
        (json!({}), 400, "MISSING_FIELD"),
        (json!({ "policy": "adaptive", "why": "x" }), 400, "UNKNOWN_FIELD"),
    ] {
        let (status, answer) = registry.put(POLICY, &ops(), &request).await;
        assert_eq!((status, code(&answer)), (status_code, expected), "{request} → {answer}");
    }
    let (status, body) = registry
        .put(
            POLICY,
            &TestRegistry::token("order_query"),
            &json!({ "policy": "adaptive" }),
        )
        .await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");
    let (status, body) = registry
        .put("/v1/capabilities/Bad/policy", &ops(), &json!({ "policy": "adaptive" }))
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_CAPABILITY_NAME"), "{body}");

    let (status, body) = registry
        .put(POLICY, &ops(), &json!({ "policy": "plugin:cheapest" }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["policy"].clone(), body["updated_by"].clone()),
        (json!("plugin:cheapest"), json!("ops"))
    );
    match next_event(&mut watch).await.kind {
        Some(pb::watch_event::Kind::PolicySet(policy)) => {
            assert_eq!(
                (policy.capability.as_str(), policy.policy.as_str()),
                ("order.query", "plugin:cheapest")
            );
        }
        other => panic!("expected policy_set, got {other:?}"),
    }
    // The seeds' word is stored as the policy it names.
    let (_, body) = registry
        .put(POLICY, &ops(), &json!({ "policy": "weighted_random" }))
        .await;
    assert_eq!(body["policy"], json!("weighted_round_robin"));
    next_event(&mut watch).await;
    let (_, body) = registry.put(POLICY, &ops(), &json!({ "policy": "adaptive" })).await;
    assert_eq!(body["policy"], json!("adaptive"));
    next_event(&mut watch).await;

    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let stored = store
        .get("/agent-reach/v1/default/policies/order.query")
        .await
        .unwrap()
        .expect("the policy's key");
    assert_eq!(stored.lease, 0, "a policy outlives every instance");

    // A fresh registry's Watch carries it in its snapshot.
    let sibling = registry.sibling(on(&etcd)).await;
    let mut sibling_watch = sibling
        .grpc()
        .await
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: true,
            },
            &ops(),
        ))
        .await
        .unwrap()
        .into_inner();
    match next_event(&mut sibling_watch).await.kind {
        Some(pb::watch_event::Kind::Snapshot(snapshot)) => {
            assert_eq!(snapshot.policies.len(), 1);
            assert_eq!(snapshot.policies[0].policy, "adaptive");
        }
        other => panic!("expected a snapshot, got {other:?}"),
    }

    let (status, _) = registry.delete(POLICY, &ops()).await;
    assert_eq!(status, 204);
    match next_event(&mut watch).await.kind {
        Some(pb::watch_event::Kind::PolicyCleared(cleared)) => assert_eq!(cleared.capability, "order.query"),
        other => panic!("expected policy_cleared, got {other:?}"),
    }
    let (status, body) = registry.get(POLICY, &ops()).await;
    assert_eq!((status, code(&body)), (404, "POLICY_NOT_FOUND"), "{body}");
    let (status, _) = registry.delete(POLICY, &ops()).await;
    assert_eq!(status, 204, "clearing a policy that is not there reaches the goal");
}
