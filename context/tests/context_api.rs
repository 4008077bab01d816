//! The context service end to end over HTTP and gRPC against a real Redis
//! (issue 4, acceptance points 1-6; 7 is `store_contract.rs`, 8 the bench).

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_context::ContextConfig;
use agent_reach_proto::context as pb;
use reqwest::Method;
use serde_json::{json, Value};
use support::{eventually, grpc_code, grpc_request, test_config, token, Harness};

// === 1. Round trips ===

#[tokio::test]
async fn round_trip_over_http() {
    let h = Harness::redis(test_config()).await;
    let (status, created) = h
        .create(
            "intent_parser",
            json!({"context_id": "ctx_42", "fields": {"user_id": "u-7", "intent": {"kind": "order_status"}}}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["context_id"], "ctx_42");
    assert_eq!(created["version"], 1);
    assert_eq!(created["tier"], "default");
    let now = chrono_ms();
    let expires_at = created["expires_at"].as_i64().unwrap();
    assert!(
        (now + 29 * 60_000..=now + 31 * 60_000).contains(&expires_at),
        "default tier is 30 min"
    );

    let (status, view) = h.get("intent_parser", "ctx_42").await;
    assert_eq!(status, 200);
    assert_eq!(view["version"], 1);
    assert_eq!(
        view["fields"],
        json!({"user_id": "u-7", "intent": {"kind": "order_status"}})
    );

    let (status, patched) = h
        .patch(
            "intent_parser",
            "ctx_42",
            json!({"set": {"order_status": "paid"}, "delete": ["intent"], "if_version": 1}),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["version"], 2);
    let (_, view) = h
        .call(
            "intent_parser",
            Method::GET,
            "/v1/contexts/ctx_42?fields=order_status,user_id",
            None,
        )
        .await;
    assert_eq!(view["fields"], json!({"user_id": "u-7", "order_status": "paid"}));
    assert_eq!(view["version"], 2);

    let (status, _) = h.close("intent_parser", "ctx_42").await;
    assert_eq!(status, 204);
    let (status, error) = h.get("intent_parser", "ctx_42").await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (404, Some("CONTEXT_NOT_FOUND"))
    );

    // Generated ids, the one_shot tier, and the operational endpoints.
    let (status, created) = h.create("intent_parser", json!({"tier": "one_shot"})).await;
    assert_eq!(status, 201);
    assert!(created["context_id"].as_str().unwrap().starts_with("ctx_"));
    let expires_at = created["expires_at"].as_i64().unwrap();
    assert!(
        (now + 4 * 60_000..=now + 6 * 60_000).contains(&expires_at),
        "one_shot tier is 5 min"
    );
    for path in ["/healthz", "/readyz"] {
        assert_eq!(h.http.get(h.url(path)).send().await.unwrap().status(), 200, "{path}");
    }
    let metrics = h.metrics().await;
    assert!(metrics.contains(r#"agent_reach_context_operations_total{op="patch",outcome="ok"} 1"#));
    assert!(metrics.contains("agent_reach_context_operation_seconds_bucket"));

    // The front door's own answers (plain GET and PATCH) carry the JSON content type.
    let id = created["context_id"].as_str().unwrap();
    let bearer = format!("Bearer {}", token("intent_parser"));
    for request in [
        h.http.get(h.url(&format!("/v1/contexts/{id}"))),
        h.http
            .patch(h.url(&format!("/v1/contexts/{id}")))
            .header("content-type", "application/json")
            .body(r#"{"set":{"n":1}}"#),
    ] {
        let answer = request.header("authorization", &bearer).send().await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()["content-type"], "application/json");
    }
}

#[tokio::test]
async fn round_trip_over_grpc() {
    let h = Harness::redis(test_config()).await;
    let mut client = h.grpc().await;
    let created = client
        .create(grpc_request(
            "intent_parser",
            pb::CreateRequest {
                context_id: "g1".into(),
                tier: String::new(),
                fields_json: HashMap::from([("user_id".into(), r#""u-1""#.into())]),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (created.context_id.as_str(), created.version, created.tier.as_str()),
        ("g1", 1, "default")
    );

    let patched = client
        .patch(grpc_request(
            "intent_parser",
            pb::PatchRequest {
                context_id: "g1".into(),
                set_json: HashMap::from([("intent".into(), r#"{"k":[1,2]}"#.into())]),
                delete: vec![],
                if_version: Some(1),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(patched.version, 2);
    let stale = client
        .patch(grpc_request(
            "intent_parser",
            pb::PatchRequest {
                context_id: "g1".into(),
                set_json: HashMap::from([("intent".into(), "1".into())]),
                delete: vec![],
                if_version: Some(1),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
    assert_eq!(grpc_code(&stale), "VERSION_CONFLICT");

    let got = client
        .get(grpc_request(
            "intent_parser",
            pb::GetRequest {
                context_id: "g1".into(),
                fields: vec![],
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.version, 2);
    assert_eq!(
        got.fields_json.get("intent").map(String::as_str),
        Some(r#"{"k":[1,2]}"#)
    );
    assert_eq!(got.fields_json.get("user_id").map(String::as_str), Some(r#""u-1""#));
    // What gRPC wrote, HTTP reads.
    let (_, view) = h.get("intent_parser", "g1").await;
    assert_eq!(view["fields"]["intent"], json!({"k": [1, 2]}));

    client
        .close(grpc_request(
            "intent_parser",
            pb::CloseRequest {
                context_id: "g1".into(),
            },
        ))
        .await
        .unwrap();
    let gone = client
        .get(grpc_request(
            "intent_parser",
            pb::GetRequest {
                context_id: "g1".into(),
                fields: vec![],
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (gone.code(), grpc_code(&gone).as_str()),
        (tonic::Code::NotFound, "CONTEXT_NOT_FOUND")
    );
    let anonymous = client
        .get(tonic::Request::new(pb::GetRequest {
            context_id: "g1".into(),
            fields: vec![],
        }))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);
}

#[tokio::test]
async fn round_trip_on_the_embedded_store() {
    let h = Harness::embedded(test_config()).await;
    let (status, _) = h
        .create("intent_parser", json!({"context_id": "e1", "fields": {"n": 1}}))
        .await;
    assert_eq!(status, 201);
    let (status, patched) = h.patch("intent_parser", "e1", json!({"set": {"n": 2}})).await;
    assert_eq!((status, patched["version"].as_u64()), (200, Some(2)));
    let (_, view) = h.get("intent_parser", "e1").await;
    assert_eq!(view["fields"], json!({"n": 2}));
    assert_eq!(h.close("intent_parser", "e1").await.0, 204);
}

// === 2. Concurrent conditional writers ===

#[tokio::test]
async fn fifty_conditional_writers_lose_no_update() {
    let h = Arc::new(Harness::redis(test_config()).await);
    let (status, _) = h
        .create("intent_parser", json!({"context_id": "race", "fields": {"log": []}}))
        .await;
    assert_eq!(status, 201);
    let conflicts = Arc::new(AtomicU64::new(0));
    let writers = (0..50).map(|writer| {
        let h = h.clone();
        let conflicts = conflicts.clone();
        tokio::spawn(async move {
            // Read-modify-write: append my id to `log`, conditional on the version I read.
            loop {
                let (status, view) = h.get("intent_parser", "race").await;
                assert_eq!(status, 200);
                let mut log = view["fields"]["log"].as_array().unwrap().clone();
                log.push(json!(writer));
                let (status, answer) = h
                    .patch(
                        "intent_parser",
                        "race",
                        json!({"set": {"log": log}, "if_version": view["version"]}),
                    )
                    .await;
                match status {
                    200 => return (writer, answer["version"].as_u64().unwrap()),
                    409 => {
                        assert_eq!(answer["error"]["code"], "VERSION_CONFLICT");
                        assert!(answer["error"]["details"]["current_version"].as_u64().unwrap() > 0);
                        conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("unexpected {other}: {answer}"),
                }
            }
        })
    });
    let mut outcomes: Vec<(u64, u64)> = futures::future::join_all(writers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let (_, view) = h.get("intent_parser", "race").await;
    let log: Vec<u64> = view["fields"]["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|value| value.as_u64().unwrap())
        .collect();
    assert_eq!(view["version"], 51, "one version per successful write");
    // The final state is the serial order of the successful writes, by version.
    outcomes.sort_by_key(|(_, version)| *version);
    let versions: Vec<u64> = outcomes.iter().map(|(_, version)| *version).collect();
    assert_eq!(versions, (2..=51).collect::<Vec<_>>(), "every version granted once");
    let serial: Vec<u64> = outcomes.iter().map(|(writer, _)| *writer).collect();
    assert_eq!(log, serial, "no lost update: the log is the serial order of the writes");
    // Conflicts were reported to the writers and counted, not swallowed.
    let seen = conflicts.load(Ordering::Relaxed);
    assert!(seen > 0, "50 racing writers must conflict");
    assert_eq!(
        h.metric("agent_reach_context_version_conflicts_total").await as u64,
        seen
    );
}

// === 3. Tiers, write extension, sweeper ===

fn short_lived() -> ContextConfig {
    let mut config = test_config();
    config.policy.default_ttl = Duration::from_millis(2500);
    config.policy.one_shot_ttl = Duration::from_millis(600);
    // Idle well above a pause of the test thread between two reads.
    config.policy.idle_timeout = Duration::from_millis(1500);
    config.sweep_interval = Duration::from_millis(100);
    config
}

#[tokio::test]
async fn tiers_expire_as_configured() {
    let h = Harness::redis(short_lived()).await;
    let started = Instant::now();
    assert_eq!(
        h.create("intent_parser", json!({"context_id": "short", "tier": "one_shot"}))
            .await
            .0,
        201
    );
    assert_eq!(h.create("intent_parser", json!({"context_id": "long"})).await.0, 201);
    // Reads keep both away from the idle sweeper but do not extend their TTL.
    let short_gone = eventually(Duration::from_secs(5), || async {
        assert_eq!(h.get("intent_parser", "long").await.0, 200);
        h.get("intent_parser", "short").await.0 == 404
    })
    .await;
    assert!(short_gone);
    let short_life = started.elapsed();
    assert!(
        short_life >= Duration::from_millis(550),
        "one_shot died early: {short_life:?}"
    );
    let long_gone = eventually(Duration::from_secs(6), || async {
        h.get("intent_parser", "long").await.0 == 404
    })
    .await;
    assert!(long_gone);
    let long_life = started.elapsed();
    assert!(
        long_life >= Duration::from_millis(2400),
        "default died early: {long_life:?}"
    );
}

#[tokio::test]
async fn a_write_extends_life() {
    // Its own times, wider than `short_lived`'s: the context must outlive three
    // TTLs on writes alone, and a loaded test machine can pause this thread for
    // a few hundred milliseconds between two writes. A failure reports the gap.
    let mut config = test_config();
    config.policy.one_shot_ttl = Duration::from_millis(1500);
    config.policy.idle_timeout = Duration::from_secs(3);
    config.sweep_interval = Duration::from_millis(100);
    let h = Harness::redis(config).await;
    assert_eq!(
        h.create("intent_parser", json!({"context_id": "kept", "tier": "one_shot"}))
            .await
            .0,
        201
    );
    // Patch every 200 ms for 5 s, more than three one_shot TTLs: it must stay alive.
    let started = Instant::now();
    let mut last_write = started;
    while started.elapsed() < Duration::from_secs(5) {
        let (status, answer) = h.patch("intent_parser", "kept", json!({"set": {"tick": 1}})).await;
        let gap = last_write.elapsed();
        assert_eq!(status, 200, "{gap:?} after the last write: {answer}");
        last_write = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(h.get("intent_parser", "kept").await.0, 200);
}

#[tokio::test]
async fn sweeper_removes_idle_contexts_and_keeps_active_ones() {
    let h = Harness::redis(short_lived()).await;
    assert_eq!(h.create("intent_parser", json!({"context_id": "idle"})).await.0, 201);
    assert_eq!(h.create("intent_parser", json!({"context_id": "busy"})).await.0, 201);
    let idle_metric = r#"agent_reach_context_sweeper_removals_total{reason="idle"}"#;
    // Only `busy` is read; `idle` is not touched (a read would count as activity).
    let swept = eventually(Duration::from_secs(4), || async {
        assert_eq!(h.get("intent_parser", "busy").await.0, 200);
        h.metric(idle_metric).await >= 1.0
    })
    .await;
    assert!(swept, "the sweeper did not remove the idle context");
    assert_eq!(h.get("intent_parser", "idle").await.0, 404);
    assert_eq!(h.get("intent_parser", "busy").await.0, 200);
    assert_eq!(h.metric(idle_metric).await, 1.0);
    assert!(
        eventually(Duration::from_secs(1), || async {
            h.metric("agent_reach_context_live_contexts").await == 1.0
        })
        .await
    );
}

// === 4. Read whitelist ===

async fn seed(h: &Harness, id: &str) {
    let (status, body) = h
        .create(
            "intent_parser",
            json!({"context_id": id, "fields": {"user_id": "u-1", "intent": "track", "order_status": "paid", "internal": "staff only"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn readers_see_only_their_whitelisted_fields() {
    let h = Harness::redis(test_config()).await;
    seed(&h, "w").await;

    let (status, view) = h.get("reply_writer", "w").await;
    assert_eq!(status, 200);
    assert_eq!(
        view["fields"],
        json!({"user_id": "u-1", "intent": "track", "order_status": "paid"})
    );
    let (status, error) = h
        .call("reply_writer", Method::GET, "/v1/contexts/w?fields=internal", None)
        .await;
    assert_eq!((status, error["error"]["code"].as_str()), (403, Some("FORBIDDEN")));
    assert_eq!(error["error"]["field"], "fields[0]");
    let (_, narrowed) = h
        .call("reply_writer", Method::GET, "/v1/contexts/w?fields=intent", None)
        .await;
    assert_eq!(narrowed["fields"], json!({"intent": "track"}));

    // Secure default: no entry, no fields (version still visible for conditional writes).
    let (status, view) = h.get("stranger", "w").await;
    assert_eq!((status, view["version"].as_u64()), (200, Some(1)));
    assert_eq!(view["fields"], json!({}));

    // The same over gRPC.
    let mut client = h.grpc().await;
    for (agent, expected) in [
        ("reply_writer", vec!["intent", "order_status", "user_id"]),
        ("stranger", vec![]),
        ("intent_parser", vec!["intent", "internal", "order_status", "user_id"]),
    ] {
        let got = client
            .get(grpc_request(
                agent,
                pb::GetRequest {
                    context_id: "w".into(),
                    fields: vec![],
                },
            ))
            .await
            .unwrap()
            .into_inner();
        let mut names: Vec<&str> = got.fields_json.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, expected, "{agent}");
    }
    let denied = client
        .get(grpc_request(
            "reply_writer",
            pb::GetRequest {
                context_id: "w".into(),
                fields: vec!["internal".into()],
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (denied.code(), grpc_code(&denied).as_str()),
        (tonic::Code::PermissionDenied, "FORBIDDEN")
    );

    // The whitelist is hot-reloaded.
    let widened = format!("{}  - agent: stranger\n    read: [intent]\n", support::ACL);
    std::fs::write(&h.acl_path, widened).unwrap();
    let applied = eventually(Duration::from_secs(5), || async {
        h.get("stranger", "w").await.1["fields"] == json!({"intent": "track"})
    })
    .await;
    assert!(applied, "ACL edit not applied");
}

#[tokio::test]
async fn writes_and_closes_need_permission() {
    let h = Harness::redis(test_config()).await;
    seed(&h, "p").await;
    for agent in ["reply_writer", "stranger"] {
        let (status, error) = h.patch(agent, "p", json!({"set": {"intent": "hijack"}})).await;
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (403, Some("FORBIDDEN")),
            "{agent}"
        );
        assert_eq!(error["error"]["field"], "set.intent");
    }
    // One forbidden field spoils the whole patch.
    let (status, _) = h
        .patch("intent_parser", "p", json!({"set": {"intent": "x", "unlisted": 1}}))
        .await;
    assert_eq!(status, 403);
    let (status, _) = h.patch("intent_parser", "p", json!({"delete": ["unlisted"]})).await;
    assert_eq!(status, 403);
    let (_, view) = h.get("intent_parser", "p").await;
    assert_eq!(
        (view["version"].as_u64(), view["fields"]["intent"].as_str()),
        (Some(1), Some("track"))
    );

    // Creating with fields needs write permission too; creating empty does not.
    assert_eq!(h.create("stranger", json!({"fields": {"intent": "x"}})).await.0, 403);
    assert_eq!(h.create("stranger", json!({"context_id": "mine"})).await.0, 201);
    // Only the creator or a `write: ["*"]` agent may close.
    assert_eq!(h.close("reply_writer", "p").await.0, 403);
    assert_eq!(h.close("stranger", "mine").await.0, 204);
    assert_eq!(h.close("admin", "p").await.0, 204);

    let response = h.http.get(h.url("/v1/contexts/p")).send().await.unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    let forged = h
        .http
        .get(h.url("/v1/contexts/p"))
        .bearer_auth(format!("{}x", token("admin")))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    // A valid token of another tenant (issue 25): this service serves `default` only.
    let other_tenant = agent_reach_access::token::issue_hs256_for(
        "admin",
        Some("acme"),
        support::SECRET.as_bytes(),
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    let response = h
        .http
        .get(h.url("/v1/contexts/p"))
        .bearer_auth(other_tenant)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("tenant `acme`"),
        "{body}"
    );
}

// === 5. Redis outage and recovery ===

#[tokio::test]
async fn redis_outage_answers_503_and_recovers_without_restart() {
    let mut h = Harness::redis(test_config()).await;
    assert_eq!(h.create("intent_parser", json!({"context_id": "before"})).await.0, 201);
    h.redis.as_mut().unwrap().kill();

    let started = Instant::now();
    let (status, error) = h.get("intent_parser", "before").await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (503, Some("CONTEXT_STORE_UNAVAILABLE"))
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "503 must come fast, not hang"
    );
    let (status, error) = h.create("intent_parser", json!({"context_id": "during"})).await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (503, Some("CONTEXT_STORE_UNAVAILABLE"))
    );
    assert_eq!(h.http.get(h.url("/readyz")).send().await.unwrap().status(), 503);
    let mut client = h.grpc().await;
    let unavailable = client
        .patch(grpc_request(
            "intent_parser",
            pb::PatchRequest {
                context_id: "before".into(),
                set_json: HashMap::from([("n".into(), "1".into())]),
                delete: vec![],
                if_version: None,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (unavailable.code(), grpc_code(&unavailable).as_str()),
        (tonic::Code::Unavailable, "CONTEXT_STORE_UNAVAILABLE")
    );

    // Redis comes back (empty: the test server has no persistence); the same service recovers.
    h.redis.as_mut().unwrap().restart();
    let recovered = eventually(Duration::from_secs(15), || async {
        h.create("intent_parser", json!({"context_id": "after"})).await.0 == 201
    })
    .await;
    assert!(recovered, "the service did not recover after Redis came back");
    let (status, view) = h.get("intent_parser", "after").await;
    assert_eq!((status, view["version"].as_u64()), (200, Some(1)));
    let (status, _) = h.patch("intent_parser", "after", json!({"set": {"n": 1}})).await;
    assert_eq!(status, 200);
    assert_eq!(h.http.get(h.url("/readyz")).send().await.unwrap().status(), 200);
    assert!(
        h.metric(r#"agent_reach_context_operations_total{op="get",outcome="unavailable"}"#)
            .await
            >= 1.0
    );
}

#[tokio::test]
async fn a_redis_that_stops_answering_gives_503_at_the_timeout_and_recovers() {
    // The harness bounds Redis calls at 500 ms; the connection checks every 50 ms.
    let h = Harness::redis(test_config()).await;
    assert_eq!(h.create("intent_parser", json!({"context_id": "kept"})).await.0, 201);
    h.redis.as_ref().unwrap().freeze();

    // Several calls wait on the silent connection at once: each gets its 503, none hangs.
    let started = Instant::now();
    let calls = futures::future::join_all((0..4).map(|_| h.get("intent_parser", "kept")));
    let answers = tokio::time::timeout(Duration::from_secs(10), calls)
        .await
        .expect("calls to a silent Redis hung past the timeout");
    let waited = started.elapsed();
    for (status, error) in answers {
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (503, Some("CONTEXT_STORE_UNAVAILABLE")),
            "{error}"
        );
    }
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(3),
        "503 must come at the Redis timeout (500 ms), came after {waited:?}"
    );
    assert!(
        h.metric(r#"agent_reach_context_operations_total{op="get",outcome="unavailable"}"#)
            .await
            >= 4.0
    );

    // Redis answers again (nothing was lost: it was only frozen); the same service recovers.
    h.redis.as_ref().unwrap().thaw();
    let recovered = eventually(Duration::from_secs(15), || async {
        h.get("intent_parser", "kept").await.0 == 200
    })
    .await;
    assert!(recovered, "the service did not recover after Redis answered again");
    let (status, view) = h.patch("intent_parser", "kept", json!({"set": {"n": 1}})).await;
    assert_eq!((status, view["version"].as_u64()), (200, Some(2)), "{view}");
}

#[tokio::test]
async fn starts_while_redis_is_down_and_connects_when_it_comes_up() {
    let mut redis = agent_reach_testkit::Redis::start();
    redis.kill();
    let mut h = Harness::on_redis(redis, test_config()).await;
    assert_eq!(h.http.get(h.url("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(h.http.get(h.url("/readyz")).send().await.unwrap().status(), 503);
    let (status, error) = h.create("intent_parser", json!({"context_id": "early"})).await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (503, Some("CONTEXT_STORE_UNAVAILABLE"))
    );

    h.redis.as_mut().unwrap().restart();
    let up = eventually(Duration::from_secs(15), || async {
        h.create("intent_parser", json!({"context_id": "early"})).await.0 == 201
    })
    .await;
    assert!(up, "the service never connected to Redis");
    assert_eq!(h.http.get(h.url("/readyz")).send().await.unwrap().status(), 200);
}

// === 6. Oversized and malformed input ===

async fn raw(h: &Harness, method: Method, path: &str, body: &str) -> (u16, Value) {
    let response = h
        .http
        .request(method, h.url(path))
        .bearer_auth(token("intent_parser"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn bad_input_gets_its_code_and_writes_nothing() {
    let h = Harness::redis(test_config()).await;
    seed(&h, "b").await;
    let first = h.get("intent_parser", "b").await.1;
    let before_expiry = first["expires_at"].as_i64().unwrap();
    let before = unchanged(first);

    let big = "x".repeat(2000);
    let huge = "y".repeat(70 * 1024);
    let seven_fields: BTreeMap<String, Value> = (0..7).map(|i| (format!("f{i}"), json!(i))).collect();
    let nine_fields: BTreeMap<String, Value> = (0..9).map(|i| (format!("f{i}"), json!(i))).collect();
    let patch_cases: Vec<(String, u16, &str, Option<&str>)> = vec![
        ("{not json".into(), 400, "MALFORMED_JSON", None),
        (r#"{"set": {"n": 1}} trailing"#.into(), 400, "MALFORMED_JSON", None),
        (
            r#"{"set": {"api_key": "sk-live-123"}}"#.into(),
            400,
            "CREDENTIAL_FIELD",
            Some("set.api_key"),
        ),
        (
            r#"{"set": {"n": 1}, "if_verison": 1}"#.into(),
            400,
            "UNKNOWN_FIELD",
            Some("if_verison"),
        ),
        (
            r#"{"set": {"n": 1}, "if_version": "one"}"#.into(),
            400,
            "INVALID_FIELD_TYPE",
            Some("if_version"),
        ),
        (r#"{"set": [1, 2]}"#.into(), 400, "INVALID_FIELD_TYPE", Some("set")),
        (r#"{"delete": "n"}"#.into(), 400, "INVALID_FIELD_TYPE", Some("delete")),
        (
            r#"{"set": {"n": 1, "Bad Name": 2}}"#.into(),
            400,
            "INVALID_FIELD_NAME",
            Some("set.Bad Name"),
        ),
        (
            r#"{"set": {"_version": 99}}"#.into(),
            400,
            "INVALID_FIELD_NAME",
            Some("set._version"),
        ),
        (
            r#"{"delete": ["n", "N!"]}"#.into(),
            400,
            "INVALID_FIELD_NAME",
            Some("delete[1]"),
        ),
        (r#"{}"#.into(), 400, "EMPTY_PATCH", None),
        (
            r#"{"set": {"n": 1}, "delete": ["n"]}"#.into(),
            400,
            "CONFLICTING_PATCH",
            Some("delete[0]"),
        ),
        (
            format!(r#"{{"set": {{"n": 1, "big": "{big}"}}}}"#),
            413,
            "FIELD_TOO_LARGE",
            Some("set.big"),
        ),
        (
            format!(r#"{{"set": {{"big": "{huge}"}}}}"#),
            413,
            "PAYLOAD_TOO_LARGE",
            None,
        ),
        (
            json!({"set": nine_fields}).to_string(),
            413,
            "TOO_MANY_FIELDS",
            Some("set"),
        ),
        // 4 fields exist; 7 more would make 11 > 8: refused atomically by the store.
        (json!({"set": seven_fields}).to_string(), 413, "TOO_MANY_FIELDS", None),
        (
            r#"{"set": {"n": 1}, "if_version": 7}"#.into(),
            409,
            "VERSION_CONFLICT",
            Some("if_version"),
        ),
    ];
    for (body, status, code, field) in &patch_cases {
        let (got, error) = raw(&h, Method::PATCH, "/v1/contexts/b", body).await;
        let label = &body[..body.len().min(60)];
        assert_eq!(got, *status, "{label}: {error}");
        assert_eq!(error["error"]["code"], *code, "{label}");
        assert_eq!(error["error"]["field"].as_str(), *field, "{label}");
    }
    // Bytes per context: 4 fields of 1022 bytes each fit the 1024-byte field limit, not the 4096 context limit.
    let near_limit = "z".repeat(1020);
    let (status, error) = h
        .patch(
            "intent_parser",
            "b",
            json!({"set": {"f0": near_limit, "f1": near_limit, "f2": near_limit, "f3": near_limit}}),
        )
        .await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (413, Some("CONTEXT_TOO_LARGE"))
    );
    let after = unchanged(h.get("intent_parser", "b").await.1);
    assert_eq!(after, before, "no refused patch wrote anything, not even the version");

    // Creates and paths.
    let create_cases: Vec<(String, u16, &str, Option<&str>)> = vec![
        (
            r#"{"context_id": "b"}"#.into(),
            409,
            "CONTEXT_EXISTS",
            Some("context_id"),
        ),
        (
            r#"{"context_id": "has space"}"#.into(),
            400,
            "INVALID_CONTEXT_ID",
            Some("context_id"),
        ),
        (r#"{"tier": "forever"}"#.into(), 400, "INVALID_TIER", Some("tier")),
        (
            r#"{"fields": {"ok": 1, "Nope": 2}, "context_id": "c2"}"#.into(),
            400,
            "INVALID_FIELD_NAME",
            Some("fields.Nope"),
        ),
        (
            r#"{"context_id": 5}"#.into(),
            400,
            "INVALID_FIELD_TYPE",
            Some("context_id"),
        ),
        (r#"{"ttl": 5}"#.into(), 400, "UNKNOWN_FIELD", Some("ttl")),
        (
            r#"{"fields": {"db.admin_password": "hunter2"}}"#.into(),
            400,
            "CREDENTIAL_FIELD",
            Some("fields.db.admin_password"),
        ),
    ];
    for (body, status, code, field) in &create_cases {
        let (got, error) = raw(&h, Method::POST, "/v1/contexts", body).await;
        assert_eq!(got, *status, "{body}: {error}");
        assert_eq!(error["error"]["code"], *code, "{body}");
        assert_eq!(error["error"]["field"].as_str(), *field, "{body}");
    }
    assert_eq!(
        h.get("intent_parser", "c2").await.0,
        404,
        "a refused create writes nothing"
    );
    assert_eq!(unchanged(h.get("intent_parser", "b").await.1), before);
    let (status, error) = h.get("intent_parser", "bad%20id").await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (400, Some("INVALID_CONTEXT_ID"))
    );
    let (status, error) = h
        .call("intent_parser", Method::GET, "/v1/contexts/b?colour=red", None)
        .await;
    assert_eq!((status, error["error"]["code"].as_str()), (400, Some("INVALID_QUERY")));
    let (status, error) = h.call("intent_parser", Method::GET, "/v2/nothing", None).await;
    assert_eq!((status, error["error"]["code"].as_str()), (404, Some("NOT_FOUND")));
    for (method, path) in [
        (Method::PUT, "/v1/contexts/b"),
        (Method::GET, "/v1/contexts"),
        (Method::DELETE, "/metrics"),
    ] {
        let (status, error) = h.call("intent_parser", method.clone(), path, None).await;
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (405, Some("METHOD_NOT_ALLOWED")),
            "{method} {path}: {error}"
        );
    }
    assert_eq!(unchanged(h.get("intent_parser", "b").await.1), before);

    // gRPC: a value that is not JSON text.
    let mut client = h.grpc().await;
    let invalid = client
        .patch(grpc_request(
            "intent_parser",
            pb::PatchRequest {
                context_id: "b".into(),
                set_json: HashMap::from([("n".into(), "{oops".into())]),
                delete: vec![],
                if_version: None,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (invalid.code(), grpc_code(&invalid).as_str()),
        (tonic::Code::InvalidArgument, "INVALID_FIELD_VALUE")
    );
    let last = h.get("intent_parser", "b").await.1;
    let drift = last["expires_at"].as_i64().unwrap() - before_expiry;
    assert!(
        drift.abs() < 50,
        "a refused write refreshed the TTL (expiry moved {drift} ms)"
    );
    assert_eq!(unchanged(last), before);
}

/// A context view without `expires_at`, which a read computes to the millisecond
/// (two reads of an untouched context may differ by rounding).
fn unchanged(mut view: Value) -> Value {
    view.as_object_mut().unwrap().remove("expires_at");
    view
}

fn chrono_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
