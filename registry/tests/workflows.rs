//! Workflows in the registry (issue 36, DESIGN §9) against a real etcd:
//! checked against the registered capabilities, stored under
//! `/agent-reach/v1/{tenant}/workflows/{name}` and published on the `Watch`;
//! every bad definition refused with its code, reason, step and JSON
//! pointer, and nothing stored; the name space shared with capabilities;
//! who may register.

use crate::support;

use std::time::Duration;

use agent_reach_proto::registry as pb;
use agent_reach_registry::store::{EtcdStore, Store};
use agent_reach_registry::StoreChoice;
use agent_reach_testkit::Etcd;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{authed, TestRegistry};

const PATH: &str = "/v1/workflows/order.ship_today";
const KEY: &str = "/agent-reach/v1/default/workflows/order.ship_today";

fn ops() -> String {
    TestRegistry::token("ops")
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

/// `order_query` offering `order.query` 1.2.0 (input `{order_id}`, output
/// `{status, ships_today}`) and `order.release`.
fn agent() -> Value {
    json!({
        "agent_id": "order_query-1", "name": "order_query", "endpoint": "http://127.0.0.1:9101/invoke",
        "ttl_s": 30, "status": "ready",
        "capabilities": [
            {"name": "order.query", "version": "1.2.0",
             "input_schema": {"type": "object", "required": ["order_id"], "additionalProperties": false,
                              "properties": {"order_id": {"type": "string"}}},
             "output_schema": {"type": "object", "properties": {"status": {"type": "string"}, "ships_today": {"type": "boolean"}}}},
            {"name": "order.release", "version": "1.0.0", "input_schema": {"type": "object"}}
        ]
    })
}

fn definition() -> Value {
    json!({
        "version": "1.0.0",
        "description": "Can my order ship today?",
        "input_schema": {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}},
        "steps": [
            {"id": "order", "capability": "order.query", "version": "^1", "input": {"order_id": "${input.order_id}"}},
            {"id": "recheck", "capability": "order.query", "when": "${steps.order.output.ships_today == false}",
             "input": {"order_id": "${input.order_id}"}}
        ],
        "output": {"ships_today": "${steps.order.output.ships_today}"}
    })
}

const YAML: &str = r#"
name: order.ship_today
version: 1.1.0
input_schema:
  type: object
  required: [order_id]
  properties:
    order_id: {type: string}
steps:
  - id: order
    capability: order.query
    input:
      order_id: "${input.order_id}"
    on_failure:
      compensate:
        capability: order.release
        input: {order_id: "${input.order_id}", why: "${steps.order.error.code}"}
output: "${steps.order.output}"
"#;

async fn next_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no watch event within 10 s")
        .expect("watch ended")
        .expect("watch failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_are_checked_stored_in_etcd_and_watched() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(StoreChoice::Etcd(vec![etcd.endpoint()])).await;
    let (status, body) = registry
        .post("/v1/agents", Some(&TestRegistry::token("order_query")), &agent())
        .await;
    assert_eq!(status, 201, "{body}");
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
    assert!(snapshot.workflows.is_empty());

    // An operator registers it (JSON).
    let (status, body) = registry.put(PATH, &ops(), &definition()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["name"].as_str(), body["version"].as_str()),
        (Some("order.ship_today"), Some("1.0.0"))
    );
    assert_eq!(body["updated_by"], "ops");
    assert_eq!(body["definition"]["steps"][1]["id"], "recheck");
    let event = next_event(&mut watch).await;
    let Some(pb::watch_event::Kind::WorkflowSet(set)) = &event.kind else {
        panic!("expected workflow_set, got {event:?}");
    };
    assert_eq!((set.name.as_str(), set.version.as_str()), ("order.ship_today", "1.0.0"));
    let sent: Value = serde_json::from_str(&set.definition_json).unwrap();
    assert_eq!(sent["steps"][0]["capability"], "order.query");

    // Stored in etcd without a lease.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let stored = store.get(KEY).await.unwrap().expect("the workflow's key");
    assert_eq!(stored.lease, 0);

    // A provider of its name replaces it with YAML; any token reads it.
    let (status, body) = registry
        .put_raw(
            PATH,
            &TestRegistry::token("order_query"),
            "application/yaml",
            YAML.as_bytes().to_vec(),
        )
        .await;
    assert_eq!((status, body["version"].as_str()), (200, Some("1.1.0")), "{body}");
    assert_eq!(body["updated_by"], "order_query");
    let (status, body) = registry.get(PATH, &TestRegistry::token("reader")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["definition"]["steps"][0]["on_failure"]["compensate"]["capability"],
        "order.release"
    );
    let (status, body) = registry.get("/v1/workflows", &TestRegistry::token("reader")).await;
    assert_eq!(
        (status, body["workflows"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{body}"
    );
    let event = next_event(&mut watch).await;
    assert!(
        matches!(event.kind, Some(pb::watch_event::Kind::WorkflowSet(_))),
        "{event:?}"
    );

    // A new watcher's snapshot carries it; a sibling registry serves it from etcd.
    let mut late = grpc
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
    let Some(pb::watch_event::Kind::Snapshot(snapshot)) = next_event(&mut late).await.kind else {
        panic!("a snapshot first");
    };
    assert_eq!(snapshot.workflows.len(), 1);
    let sibling = registry.sibling(StoreChoice::Etcd(vec![etcd.endpoint()])).await;
    let (status, _) = sibling.get(PATH, &ops()).await;
    assert_eq!(status, 200);

    // Removed by an operator: gone from etcd, the Watch says so, reading is 404.
    let (status, _) = registry.delete(PATH, &ops()).await;
    assert_eq!(status, 204);
    let event = next_event(&mut watch).await;
    let Some(pb::watch_event::Kind::WorkflowRemoved(removed)) = &event.kind else {
        panic!("expected workflow_removed, got {event:?}");
    };
    assert_eq!(removed.name, "order.ship_today");
    assert!(store.get(KEY).await.unwrap().is_none());
    let (status, body) = registry.get(PATH, &ops()).await;
    assert_eq!((status, code(&body)), (404, "WORKFLOW_NOT_FOUND"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_definitions_get_their_reason_and_pointer_and_store_nothing() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(StoreChoice::Etcd(vec![etcd.endpoint()])).await;
    let (status, body) = registry
        .post("/v1/agents", Some(&TestRegistry::token("order_query")), &agent())
        .await;
    assert_eq!(status, 201, "{body}");
    type Change = fn(&mut Value);
    let cases: Vec<(&str, Change, &str, Option<&str>, &str)> = vec![
        (
            "a cycle",
            |d| d["steps"][0]["depends_on"] = json!(["recheck"]),
            "cycle",
            Some("order"),
            "/steps/0/depends_on",
        ),
        (
            "an unknown step reference",
            |d| d["steps"][1]["input"]["order_id"] = json!("${steps.nope.output.id}"),
            "unknown_step",
            Some("recheck"),
            "/steps/1/input/order_id",
        ),
        (
            "an expression that does not parse",
            |d| d["steps"][1]["when"] = json!("${steps.order.output.ships_today ==}"),
            "bad_expression",
            Some("recheck"),
            "/steps/1/when",
        ),
        (
            "an unknown capability",
            |d| d["steps"][1]["capability"] = json!("order.nobody"),
            "unknown_capability",
            Some("recheck"),
            "/steps/1/capability",
        ),
        (
            "a mapping that never fits",
            |d| d["steps"][1]["input"]["order_id"] = json!("${steps.order.output.ships_today}"),
            "mapping",
            Some("recheck"),
            "/steps/1/input/order_id",
        ),
        (
            "a field the schema forbids",
            |d| d["steps"][0]["input"]["note"] = json!("x"),
            "mapping",
            Some("order"),
            "/steps/0/input/note",
        ),
        (
            "too many steps",
            |d| {
                d["steps"] = Value::Array(
                    (0..65)
                        .map(
                            |i| json!({"id": format!("s{i}"), "capability": "order.query", "input": {"order_id": "x"}}),
                        )
                        .collect(),
                );
            },
            "too_large",
            None,
            "/steps",
        ),
        (
            "not a definition",
            |d| *d = json!({"steps": 1}),
            "malformed",
            None,
            "/steps",
        ),
    ];
    for (what, change, reason, step, pointer) in cases {
        let mut definition = definition();
        change(&mut definition);
        let (status, body) = registry.put(PATH, &ops(), &definition).await;
        assert_eq!((status, code(&body)), (400, "INVALID_WORKFLOW"), "{what}: {body}");
        let details = &body["error"]["details"];
        assert_eq!(
            (
                details["reason"].as_str(),
                details["step"].as_str(),
                details["pointer"].as_str()
            ),
            (Some(reason), step, Some(pointer)),
            "{what}: {body}"
        );
    }
    // Over the size limit: 413 before anything is parsed.
    let huge = json!({"version": "1.0.0", "input_schema": {}, "steps": [], "output": "x".repeat(300 * 1024)});
    let (status, body) = registry.put(PATH, &ops(), &huge).await;
    assert_eq!((status, code(&body)), (413, "PAYLOAD_TOO_LARGE"), "{body}");
    // YAML that is not YAML.
    let (status, body) = registry
        .put_raw(PATH, &ops(), "application/yaml", b"steps: [unclosed".to_vec())
        .await;
    assert_eq!(
        (status, body["error"]["details"]["reason"].as_str()),
        (400, Some("malformed")),
        "{body}"
    );
    // A name that is not a name.
    let (status, body) = registry.put("/v1/workflows/Ship%20Today", &ops(), &definition()).await;
    assert_eq!(
        (status, body["error"]["details"]["reason"].as_str()),
        (400, Some("invalid_name")),
        "{body}"
    );

    // Nothing was stored: not in etcd, not in the catalog.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let (stored, _) = store.list("/agent-reach/v1/default/workflows/").await.unwrap();
    assert!(stored.is_empty(), "{stored:?}");
    let (_, body) = registry.get("/v1/workflows", &ops()).await;
    assert_eq!(body["workflows"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_and_workflows_share_one_name_space_and_registering_needs_a_right() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(StoreChoice::Etcd(vec![etcd.endpoint()])).await;
    let (status, _) = registry
        .post("/v1/agents", Some(&TestRegistry::token("order_query")), &agent())
        .await;
    assert_eq!(status, 201);

    // A workflow named like a capability: 409.
    let (status, body) = registry.put("/v1/workflows/order.release", &ops(), &definition()).await;
    assert_eq!((status, code(&body)), (409, "NAME_TAKEN"), "{body}");

    // Who may register: operators, or a provider of the name; nobody else.
    for caller in ["reader", "shipping_rules"] {
        let (status, body) = registry.put(PATH, &TestRegistry::token(caller), &definition()).await;
        assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{caller}: {body}");
    }
    let (status, body) = registry
        .put(PATH, &TestRegistry::token("order_query"), &definition())
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = registry.delete(PATH, &TestRegistry::token("reader")).await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");

    // An agent registering a capability named like a workflow: 409, nothing written.
    let mut clash = agent();
    clash["agent_id"] = json!("order_query-2");
    clash["capabilities"][1]["name"] = json!("order.ship_today");
    let (status, body) = registry
        .post("/v1/agents", Some(&TestRegistry::token("order_query")), &clash)
        .await;
    assert_eq!((status, code(&body)), (409, "NAME_TAKEN"), "{body}");
    assert_eq!(body["error"]["field"], "capabilities[1].name");
    let (status, _) = registry.get("/v1/agents/order_query-2", &ops()).await;
    assert_eq!(status, 404);
}
