//! The registry's acceptance tests (issue 2), against a real etcd spawned by
//! testkit and registries served in-process on loopback ports.

use crate::support;

use std::time::{Duration, Instant};

use agent_reach_proto::registry as pb;
use agent_reach_registry::store::{EtcdStore, Store};
use agent_reach_registry::StoreChoice;
use agent_reach_testkit::Etcd;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{authed, registration, wait_for, TestRegistry};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn on(etcd: &Etcd) -> StoreChoice {
    StoreChoice::Etcd(vec![etcd.endpoint()])
}

fn order_token() -> String {
    TestRegistry::token("order_query")
}

/// Heartbeats `agent_id` every `every` over HTTP until aborted (a running agent).
fn heartbeat_loop(base: String, agent_id: String, lease_id: i64, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        loop {
            let _ = client
                .put(format!("{base}/v1/agents/{agent_id}/heartbeat"))
                .bearer_auth(order_token())
                .json(&json!({"lease_id": lease_id}))
                .send()
                .await;
            tokio::time::sleep(every).await;
        }
    })
}

// Acceptance 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_over_http_and_grpc_is_visible_at_once() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;

    let (status, body) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-http", 15))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["ttl_s"], 15);
    assert_eq!(body["heartbeat_interval_s"], 5);
    let http_registered = Instant::now();
    assert!(
        wait_for(Duration::from_millis(100), || async {
            registry.resolved("order.query").await == ["oq-http"]
        })
        .await,
        "HTTP registration not visible within 100 ms of {http_registered:?}"
    );

    let mut grpc = registry.grpc().await;
    let request = pb::RegisterRequest {
        agent_id: "oq-grpc".into(),
        name: "order_query".into(),
        endpoint: "http://127.0.0.1:9102/invoke".into(),
        weight: 2,
        ttl_s: 15,
        status: "ready".into(),
        capabilities: vec![pb::CapabilityDescriptor {
            name: "order.query".into(),
            version: "1.2.0".into(),
            input_schema_json: r#"{"type":"object"}"#.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let registered = grpc
        .register(authed(request, &order_token()))
        .await
        .unwrap()
        .into_inner();
    assert!(registered.lease_id != 0);
    let resolved = |version: &'static str| {
        let mut grpc = grpc.clone();
        async move {
            grpc.resolve_capability(authed(
                pb::ResolveCapabilityRequest {
                    name: "order.query".into(),
                    version_req: version.into(),
                },
                &order_token(),
            ))
            .await
        }
    };
    assert!(
        wait_for(Duration::from_millis(100), || async {
            resolved("^1.2")
                .await
                .is_ok_and(|answer| answer.into_inner().instances.len() == 2)
        })
        .await,
        "gRPC registration not visible within 100 ms"
    );
    let answer = resolved("").await.unwrap().into_inner();
    assert_eq!(answer.version, "1.2.0");
    let descriptor = answer.instances[0].capability.as_ref().unwrap();
    assert_eq!(descriptor.name, "order.query");

    // Unmatched version → VERSION_NOT_FOUND with the available versions.
    let (status, body) = registry
        .get("/v1/capabilities/order.query?version=%5E2", &order_token())
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("VERSION_NOT_FOUND"))
    );
    assert_eq!(body["error"]["details"]["available_versions"], json!(["1.2.0"]));
    let status = resolved("^2").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_eq!(
        status.metadata().get("x-agent-reach-code").unwrap(),
        "VERSION_NOT_FOUND"
    );
    let (status, body) = registry.get("/v1/capabilities/nothing.here", &order_token()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("CAPABILITY_NOT_FOUND"))
    );

    let (status, list) = registry.get("/v1/agents", &order_token()).await;
    assert_eq!(status, 200);
    assert_eq!(list["agents"].as_array().unwrap().len(), 2);
    let (status, summary) = registry.get("/v1/capabilities", &order_token()).await;
    assert_eq!(status, 200);
    assert_eq!(summary["capabilities"][0]["routable_instances"], 2);
}

// Acceptance 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_leaves_within_ttl_and_deregistered_agent_at_once() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let ttl_s = 2;
    let (_, a) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-a", ttl_s))
        .await;
    let (_, b) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-b", ttl_s))
        .await;
    let agent_a = heartbeat_loop(
        registry.url(""),
        "oq-a".into(),
        a["lease_id"].as_i64().unwrap(),
        Duration::from_millis(500),
    );
    let _agent_b = heartbeat_loop(
        registry.url(""),
        "oq-b".into(),
        b["lease_id"].as_i64().unwrap(),
        Duration::from_millis(500),
    );

    // Both stay alive well past their TTL while heartbeating.
    let alive_until = Instant::now() + Duration::from_secs(u64::from(ttl_s) * 2);
    while Instant::now() < alive_until {
        assert_eq!(registry.resolved("order.query").await.len(), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    agent_a.abort(); // the agent process dies: no more heartbeats
    let killed = Instant::now();
    assert!(
        wait_for(Duration::from_secs(u64::from(ttl_s) + 1), || async {
            registry.resolved("order.query").await == ["oq-b"]
        })
        .await,
        "killed instance still resolvable {:?} after the kill",
        killed.elapsed()
    );

    let (status, _) = registry.delete("/v1/agents/oq-b", &order_token()).await;
    assert_eq!(status, 204);
    assert!(
        registry.resolved("order.query").await.is_empty(),
        "deregistered instance gone at once"
    );
    let (status, body) = registry.delete("/v1/agents/oq-b", &order_token()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("AGENT_NOT_FOUND")));
    let metrics = reqwest::get(registry.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("agent_reach_registry_lease_expiries_total 1"),
        "{metrics}"
    );
}

// Acceptance 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_after_expiry_is_lease_expired_and_reregistration_works() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let (_, first) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-1", 1))
        .await;
    let lease = first["lease_id"].as_i64().unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || async {
            registry.resolved("order.query").await.is_empty()
        })
        .await
    );

    let (status, body) = registry
        .put("/v1/agents/oq-1/heartbeat", &order_token(), &json!({"lease_id": lease}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("LEASE_EXPIRED")),
        "{body}"
    );

    // Over the gRPC keep-alive stream too; the stream stays usable.
    let mut grpc = registry.grpc().await;
    let (sender, receiver) = mpsc::channel(4);
    let mut answers = grpc
        .keep_alive(authed(ReceiverStream::new(receiver), &order_token()))
        .await
        .unwrap()
        .into_inner();
    sender
        .send(pb::KeepAliveRequest {
            agent_id: "oq-1".into(),
            lease_id: lease,
            ..Default::default()
        })
        .await
        .unwrap();
    let answer = answers.next().await.unwrap().unwrap();
    assert_eq!(answer.error.unwrap().code, "LEASE_EXPIRED");

    let (status, second) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-1", 15))
        .await;
    assert_eq!(status, 201);
    let new_lease = second["lease_id"].as_i64().unwrap();
    assert_ne!(new_lease, lease);
    sender
        .send(pb::KeepAliveRequest {
            agent_id: "oq-1".into(),
            lease_id: new_lease,
            status: "busy".into(),
            inflight: Some(3),
        })
        .await
        .unwrap();
    let answer = answers.next().await.unwrap().unwrap();
    assert!(answer.error.is_none(), "{answer:?}");
    assert_eq!(answer.ttl_s, 15);
    let (_, agent) = registry.get("/v1/agents/oq-1", &order_token()).await;
    assert_eq!(agent["status"], "busy");
    // An old lease of a replaced registration is refused.
    let (status, body) = registry
        .put("/v1/agents/oq-1/heartbeat", &order_token(), &json!({"lease_id": lease}))
        .await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("LEASE_EXPIRED")));
}

/// Status is written only when it changes: heartbeats without a change write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_status_is_not_rewritten() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let (_, registered) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-s", 15))
        .await;
    let lease = registered["lease_id"].as_i64().unwrap();
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let before = store
        .get("/agent-reach/v1/default/agents/oq-s")
        .await
        .unwrap()
        .unwrap()
        .mod_revision;
    for _ in 0..20 {
        let (status, _) = registry
            .put(
                "/v1/agents/oq-s/heartbeat",
                &order_token(),
                &json!({"lease_id": lease, "status": "ready"}),
            )
            .await;
        assert_eq!(status, 200);
    }
    let after = store
        .get("/agent-reach/v1/default/agents/oq-s")
        .await
        .unwrap()
        .unwrap()
        .mod_revision;
    assert_eq!(before, after, "a heartbeat with an unchanged status wrote to etcd");
    let (status, _) = registry
        .put(
            "/v1/agents/oq-s/heartbeat",
            &order_token(),
            &json!({"lease_id": lease, "status": "overloaded"}),
        )
        .await;
    assert_eq!(status, 200);
    let changed = store
        .get("/agent-reach/v1/default/agents/oq-s")
        .await
        .unwrap()
        .unwrap()
        .mod_revision;
    assert!(changed > after);
    // Overloaded is not routable; draining is final.
    assert!(registry.resolved("order.query").await.is_empty());
    let (status, _) = registry
        .put(
            "/v1/agents/oq-s/heartbeat",
            &order_token(),
            &json!({"lease_id": lease, "status": "draining"}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = registry
        .put(
            "/v1/agents/oq-s/heartbeat",
            &order_token(),
            &json!({"lease_id": lease, "status": "ready"}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("INVALID_STATUS_TRANSITION"))
    );
}

async fn next_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no watch event within 10 s")
        .expect("watch ended")
        .expect("watch failed")
}

fn describe(event: &pb::WatchEvent) -> String {
    match event.kind.as_ref().unwrap() {
        pb::watch_event::Kind::Snapshot(snapshot) => format!("snapshot({})", snapshot.instances.len()),
        pb::watch_event::Kind::Added(instance) => format!("added {} {}", instance.agent_id, instance.status),
        pb::watch_event::Kind::Updated(instance) => format!("updated {} {}", instance.agent_id, instance.status),
        pb::watch_event::Kind::Removed(removed) => format!("removed {}", removed.agent_id),
        pb::watch_event::Kind::SplitSet(split) => format!("split {}", split.capability),
        pb::watch_event::Kind::SplitCleared(cleared) => format!("split cleared {}", cleared.capability),
        pb::watch_event::Kind::GrantSet(grant) => format!("grant {}", grant.id),
        pb::watch_event::Kind::GrantRemoved(removed) => format!("grant removed {}", removed.id),
        pb::watch_event::Kind::PolicySet(policy) => format!("policy {} {}", policy.capability, policy.policy),
        pb::watch_event::Kind::PolicyCleared(cleared) => format!("policy cleared {}", cleared.capability),
        pb::watch_event::Kind::WorkflowSet(workflow) => format!("workflow {}", workflow.name),
        pb::watch_event::Kind::WorkflowRemoved(removed) => format!("workflow removed {}", removed.name),
    }
}

// Acceptance 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_ordered_deltas_and_resumes_without_gaps() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let mut grpc = registry.grpc().await;
    let mut watch = grpc
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &order_token(),
        ))
        .await
        .unwrap()
        .into_inner();
    let snapshot = next_event(&mut watch).await;
    assert_eq!(describe(&snapshot), "snapshot(0)");

    let mut body = registration("oq-w", 1);
    body["status"] = json!("starting");
    let (_, registered) = registry.post("/v1/agents", Some(&order_token()), &body).await;
    let lease = registered["lease_id"].as_i64().unwrap();
    registry
        .put(
            "/v1/agents/oq-w/heartbeat",
            &order_token(),
            &json!({"lease_id": lease, "status": "ready"}),
        )
        .await;
    // Then the agent dies: the lease expires after 1 s.
    let expected = ["added oq-w starting", "updated oq-w ready", "removed oq-w"];
    let mut live = Vec::new();
    for _ in 0..3 {
        live.push(next_event(&mut watch).await);
    }
    assert_eq!(live.iter().map(describe).collect::<Vec<_>>(), expected);
    assert!(
        live.windows(2).all(|pair| pair[0].revision < pair[1].revision),
        "ordered revisions"
    );
    assert!(live[0].revision > snapshot.revision);

    // A watcher that reconnects from the snapshot's revision misses nothing.
    let mut resumed = grpc
        .watch(authed(
            pb::WatchRequest {
                start_revision: snapshot.revision,
                paged: false,
            },
            &order_token(),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut replayed = Vec::new();
    for _ in 0..3 {
        replayed.push(next_event(&mut resumed).await);
    }
    assert_eq!(replayed, live);

    // Once that history is compacted, a resume gets a fresh snapshot, flagged.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let (_, registered) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-x", 15))
        .await;
    assert_eq!(registered["agent_id"], "oq-x");
    let (_, now) = store.list("/agent-reach/").await.unwrap();
    store.compact(now).await.unwrap();
    let mut after_compaction = grpc
        .watch(authed(
            pb::WatchRequest {
                start_revision: snapshot.revision,
                paged: false,
            },
            &order_token(),
        ))
        .await
        .unwrap()
        .into_inner();
    let event = next_event(&mut after_compaction).await;
    match event.kind.unwrap() {
        pb::watch_event::Kind::Snapshot(snapshot) => {
            assert!(snapshot.reset, "a snapshot replacing a resume must say so");
            assert_eq!(snapshot.instances.len(), 1);
            assert_eq!(snapshot.instances[0].agent_id, "oq-x");
        }
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

// Acceptance 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_registries_loses_no_registration() {
    let etcd = Etcd::start();
    let first = TestRegistry::start(on(&etcd)).await;
    let second = first.sibling(on(&etcd)).await;
    let ttl_s = 2;
    let mut leases = Vec::new();
    for index in 0..6 {
        // Alternate registries: each must see the other's registrations.
        let via = if index % 2 == 0 { &first } else { &second };
        let agent_id = format!("oq-{index}");
        let (status, body) = via
            .post("/v1/agents", Some(&order_token()), &registration(&agent_id, ttl_s))
            .await;
        assert_eq!(status, 201, "{body}");
        leases.push((agent_id, body["lease_id"].as_i64().unwrap()));
    }
    assert!(
        wait_for(Duration::from_secs(2), || async {
            second.resolved("order.query").await.len() == 6
        })
        .await
    );

    // Agents heartbeat to whichever registry answers, as behind a load balancer.
    let bases = [first.url(""), second.url("")];
    let rounds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let completed = rounds.clone();
    let heartbeats = tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let mut round = 0usize;
        loop {
            for (agent_id, lease) in &leases {
                let mut delivered = false;
                for offset in 0..2 {
                    let base = &bases[(round + offset) % 2];
                    let sent = client
                        .put(format!("{base}/v1/agents/{agent_id}/heartbeat"))
                        .bearer_auth(order_token())
                        .json(&json!({"lease_id": lease}))
                        .send()
                        .await;
                    if sent.is_ok_and(|response| response.status() == 200) {
                        delivered = true;
                        break;
                    }
                }
                assert!(delivered, "heartbeat for {agent_id} reached no registry");
            }
            round += 1;
            completed.store(round, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    // Both registries have served heartbeats before one of them dies.
    assert!(
        wait_for(Duration::from_secs(5), || async {
            rounds.load(std::sync::atomic::Ordering::SeqCst) >= 2
        })
        .await,
        "heartbeats never got going"
    );
    first.kill();
    // Well past the TTL, every agent is still registered and heartbeating via the survivor.
    let until = Instant::now() + Duration::from_secs(u64::from(ttl_s) * 3);
    while Instant::now() < until {
        assert_eq!(second.resolved("order.query").await.len(), 6);
        assert!(!heartbeats.is_finished(), "heartbeat loop failed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    heartbeats.abort();
}

// Acceptance 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invalid_input_has_its_code_and_writes_nothing() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let token = order_token();
    let with = |mutate: &dyn Fn(&mut serde_json::Value)| {
        let mut body = registration("oq-bad", 15);
        mutate(&mut body);
        body
    };
    let cases: Vec<(&str, serde_json::Value, u16, &str, Option<&str>)> = vec![
        (
            "bad name",
            with(&|b| b["capabilities"][0]["name"] = json!("Order Query")),
            400,
            "INVALID_CAPABILITY_NAME",
            Some("capabilities[0].name"),
        ),
        (
            "bad semver",
            with(&|b| b["capabilities"][0]["version"] = json!("v1")),
            400,
            "INVALID_VERSION",
            Some("capabilities[0].version"),
        ),
        (
            "bad schema",
            with(&|b| b["capabilities"][0]["input_schema"] = json!({"type": 12})),
            400,
            "INVALID_SCHEMA",
            Some("capabilities[0].input_schema"),
        ),
        (
            "bad output schema",
            with(&|b| b["capabilities"][0]["output_schema"] = json!({"minimum": "x"})),
            400,
            "INVALID_SCHEMA",
            Some("capabilities[0].output_schema"),
        ),
        (
            "weight 0",
            with(&|b| b["weight"] = json!(0)),
            400,
            "INVALID_WEIGHT",
            Some("weight"),
        ),
        (
            "weight 5000",
            with(&|b| b["weight"] = json!(5000)),
            400,
            "INVALID_WEIGHT",
            Some("weight"),
        ),
        (
            "no scheme",
            with(&|b| b["endpoint"] = json!("127.0.0.1:9000")),
            400,
            "INVALID_ENDPOINT",
            Some("endpoint"),
        ),
        (
            "ftp",
            with(&|b| b["endpoint"] = json!("ftp://host/x")),
            400,
            "INVALID_ENDPOINT",
            Some("endpoint"),
        ),
        (
            "ttl 0",
            with(&|b| b["ttl_s"] = json!(0)),
            400,
            "INVALID_TTL",
            Some("ttl_s"),
        ),
        (
            "ttl huge",
            with(&|b| b["ttl_s"] = json!(100_000)),
            400,
            "INVALID_TTL",
            Some("ttl_s"),
        ),
        (
            "duplicate",
            with(&|b| {
                let c = b["capabilities"][0].clone();
                b["capabilities"].as_array_mut().unwrap().push(c);
            }),
            400,
            "DUPLICATE_CAPABILITY",
            Some("capabilities[1].name"),
        ),
        (
            "unknown field",
            with(&|b| b["colour"] = json!("red")),
            400,
            "UNKNOWN_FIELD",
            Some("colour"),
        ),
        (
            "unknown nested field",
            with(&|b| b["capabilities"][0]["schema"] = json!({})),
            400,
            "UNKNOWN_FIELD",
            Some("capabilities[0].schema"),
        ),
        (
            "missing field",
            with(&|b| {
                b.as_object_mut().unwrap().remove("endpoint");
            }),
            400,
            "MISSING_FIELD",
            Some("endpoint"),
        ),
        (
            "wrong type",
            with(&|b| b["weight"] = json!("heavy")),
            400,
            "INVALID_FIELD_TYPE",
            Some("weight"),
        ),
        (
            "bad status",
            with(&|b| b["status"] = json!("zombie")),
            400,
            "INVALID_STATUS",
            Some("status"),
        ),
        (
            "no capabilities",
            with(&|b| b["capabilities"] = json!([])),
            400,
            "NO_CAPABILITIES",
            Some("capabilities"),
        ),
        (
            "bad agent id",
            with(&|b| b["agent_id"] = json!("a/../b")),
            400,
            "INVALID_AGENT_ID",
            Some("agent_id"),
        ),
    ];
    for (what, body, status, code, field) in cases {
        let (got, answer) = registry.post("/v1/agents", Some(&token), &body).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{what}: {answer}"
        );
        assert_eq!(answer["error"]["field"].as_str(), field, "{what}: {answer}");
        assert!(!answer["error"]["message"].as_str().unwrap().is_empty());
    }
    let (status, answer) = registry
        .post_raw("/v1/agents", &token, b"{\"agent_id\": ".to_vec())
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("MALFORMED_JSON"))
    );
    let mut huge = registration("oq-bad", 15);
    huge["capabilities"][0]["description"] = json!("x".repeat(2 * 1024 * 1024));
    let (status, answer) = registry
        .post_raw("/v1/agents", &token, serde_json::to_vec(&huge).unwrap())
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (413, Some("PAYLOAD_TOO_LARGE"))
    );

    // gRPC: the same checks, InvalidArgument with the code in metadata.
    let mut grpc = registry.grpc().await;
    let status = grpc
        .register(authed(
            pb::RegisterRequest {
                agent_id: "oq-bad".into(),
                name: "order_query".into(),
                endpoint: "http://127.0.0.1:1/".into(),
                capabilities: vec![pb::CapabilityDescriptor {
                    name: "order.query".into(),
                    version: "1.0.0".into(),
                    input_schema_json: "{not json".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.metadata().get("x-agent-reach-code").unwrap(), "INVALID_SCHEMA");
    assert_eq!(
        status.metadata().get("x-agent-reach-field").unwrap(),
        "capabilities[0].input_schema"
    );

    // Nothing was written, and the registry still serves.
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    assert!(
        store.list("/agent-reach/").await.unwrap().0.is_empty(),
        "a failed registration left keys behind"
    );
    let (status, _) = registry
        .post("/v1/agents", Some(&token), &registration("oq-good", 15))
        .await;
    assert_eq!(status, 201);
}

// Acceptance 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_providers_acl_are_enforced_and_hot_reloaded() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let nothing_written = || async { store.list("/agent-reach/").await.unwrap().0.is_empty() };

    let (status, body) = registry.post("/v1/agents", None, &registration("oq-1", 15)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("UNAUTHENTICATED")));
    let forged = agent_reach_access::token::issue_hs256(
        "order_query",
        b"another-secret-another-secret-xx",
        Duration::from_secs(60),
    )
    .unwrap();
    let (status, _) = registry
        .post("/v1/agents", Some(&forged), &registration("oq-1", 15))
        .await;
    assert_eq!(status, 401);
    let expired =
        agent_reach_access::token::issue_hs256_at("order_query", support::SECRET.as_bytes(), 1_000, 2_000).unwrap();
    let (status, _) = registry
        .post("/v1/agents", Some(&expired), &registration("oq-1", 15))
        .await;
    assert_eq!(status, 401);

    // A token for another agent cannot register as order_query.
    let (status, body) = registry
        .post(
            "/v1/agents",
            Some(&TestRegistry::token("shipping_rules")),
            &registration("oq-1", 15),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{body}"
    );
    // An agent not allowed to provide the capability.
    let mut intruder = registration("intruder-1", 15);
    intruder["name"] = json!("intruder");
    let (status, body) = registry
        .post("/v1/agents", Some(&TestRegistry::token("intruder")), &intruder)
        .await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("FORBIDDEN")));
    assert!(body["error"]["message"].as_str().unwrap().contains("order.query"));
    assert!(nothing_written().await);

    // An ACL edit on disk takes effect within 2 s, without a restart.
    let policy = format!("{}  - agent: intruder\n    provides: [order.query]\n", support::ACL);
    std::fs::write(&registry.acl_path, policy).unwrap();
    let applied = wait_for(Duration::from_secs(2), || async {
        registry
            .post("/v1/agents", Some(&TestRegistry::token("intruder")), &intruder)
            .await
            .0
            == 201
    })
    .await;
    assert!(applied, "ACL edit not applied within 2 s");

    // A broken edit keeps the last good policy and is reported.
    std::fs::write(&registry.acl_path, "version: 1\nproviders: [oops").unwrap();
    let reported = wait_for(Duration::from_secs(2), || async {
        reqwest::get(registry.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .contains("agent_reach_acl_file_valid 0")
    })
    .await;
    assert!(reported, "broken ACL edit not reported");
    let mut again = intruder.clone();
    again["agent_id"] = json!("intruder-2");
    let (status, _) = registry
        .post("/v1/agents", Some(&TestRegistry::token("intruder")), &again)
        .await;
    assert_eq!(status, 201, "the last good policy still applies");

    // An agent_id belongs to its agent: another agent cannot take it over.
    let mut hijack = registration("intruder-1", 15);
    hijack["name"] = json!("order_query");
    let (status, body) = registry.post("/v1/agents", Some(&order_token()), &hijack).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("AGENT_ID_TAKEN")));
}

// Acceptance 9 (API level; the store contract suite covers the store itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_serves_the_same_api() {
    let registry = TestRegistry::start(StoreChoice::Embedded).await;
    let (status, first) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-m", 1))
        .await;
    assert_eq!(status, 201);
    assert_eq!(registry.resolved("order.query").await, ["oq-m"]);
    assert!(
        wait_for(Duration::from_secs(3), || async {
            registry.resolved("order.query").await.is_empty()
        })
        .await
    );
    let (status, body) = registry
        .put(
            "/v1/agents/oq-m/heartbeat",
            &order_token(),
            &json!({"lease_id": first["lease_id"]}),
        )
        .await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("LEASE_EXPIRED")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operational_endpoints_answer() {
    let mut etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    assert_eq!(reqwest::get(registry.url("/healthz")).await.unwrap().status(), 200);
    let metrics = reqwest::get(registry.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "agent_reach_registry_instances",
        "agent_reach_registry_watch_subscribers",
        "agent_reach_acl_file_valid",
    ] {
        assert!(metrics.contains(name), "missing {name}");
    }
    let (status, body) = registry.get("/v1/nope", &order_token()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("NOT_FOUND")));
    // A route asked with a method it does not take names the method, with a stable code.
    for (method, path) in [
        (reqwest::Method::PATCH, "/v1/agents"),
        (reqwest::Method::POST, "/v1/agents/oq-1/heartbeat"),
        (reqwest::Method::DELETE, "/v1/capabilities/order.query"),
        (reqwest::Method::POST, "/healthz"),
    ] {
        let response = reqwest::Client::new()
            .request(method.clone(), registry.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "METHOD_NOT_ALLOWED", "{method} {path}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(path), "{body}");
    }
    // etcd down → not ready, and writes answer STORE_UNAVAILABLE; back → ready again.
    etcd.kill();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            reqwest::get(registry.url("/readyz")).await.unwrap().status() == 503
        })
        .await
    );
    let (status, body) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-d", 15))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("STORE_UNAVAILABLE")),
        "{body}"
    );
    etcd.restart();
    assert!(
        wait_for(Duration::from_secs(15), || async {
            reqwest::get(registry.url("/readyz")).await.unwrap().status() == 200
        })
        .await
    );
    let (status, _) = registry
        .post("/v1/agents", Some(&order_token()), &registration("oq-d", 15))
        .await;
    assert_eq!(status, 201);
}

// Listings come in pages (issue 35): gRPC always, HTTP with `limit`; every
// instance once, in agent id order, the revision of the listing on each page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_come_in_pages() {
    let etcd = Etcd::start();
    let registry = TestRegistry::start(on(&etcd)).await;
    for n in 0..25 {
        let (status, body) = registry
            .post(
                "/v1/agents",
                Some(&order_token()),
                &registration(&format!("oq-{n:02}"), 60),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let expected: Vec<String> = (0..25).map(|n| format!("oq-{n:02}")).collect();

    let mut grpc = registry.grpc().await;
    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = grpc
            .list_agents(authed(
                pb::ListAgentsRequest {
                    page_size: 10,
                    page_token: token,
                },
                &order_token(),
            ))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.agents.len() <= 10);
        seen.extend(page.agents.into_iter().map(|agent| agent.agent_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!((seen, pages), (expected.clone(), 3));
    // No page size: the default page holds them all.
    let all = grpc
        .list_agents(authed(pb::ListAgentsRequest::default(), &order_token()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((all.agents.len(), all.next_page_token.as_str()), (25, ""));

    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let path = match &cursor {
            None => "/v1/agents?limit=7".to_string(),
            Some(cursor) => format!("/v1/agents?limit=7&cursor={cursor}"),
        };
        let (status, body) = registry.get(&path, &order_token()).await;
        assert_eq!(status, 200, "{body}");
        seen.extend(
            body["agents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|agent| agent["agent_id"].as_str().unwrap().to_string()),
        );
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    let (status, body) = registry.get("/v1/agents", &order_token()).await;
    assert_eq!((status, body["agents"].as_array().unwrap().len()), (200, 25));
    assert!(body.get("next_cursor").is_none(), "{body}");
    let (status, body) = registry.get("/v1/agents?limit=0", &order_token()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_FIELD_TYPE"))
    );
    let (status, body) = registry.get("/v1/agents?page=2", &order_token()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("UNKNOWN_FIELD")));
}
