//! Integration tests of the router against a real etcd, a real registry and
//! real HTTP test agents on loopback (acceptance points 1–10 of the router
//! issue). Waiting is always polling a condition with a bound.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn agent_of(body: &Value) -> String {
    body["agent_id"].as_str().unwrap_or_default().to_string()
}

fn code_of(body: &Value) -> String {
    body["error"]["code"].as_str().unwrap_or_default().to_string()
}

// 1. Smooth weighted round-robin: 3:2:1 over 6,000 requests, interleaved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_round_robin_is_exact_and_smooth() {
    let cluster = Cluster::start().await;
    let _a = cluster.agent(AgentSpec::new("wa-1", 3, Behaviour::Echo));
    let _b = cluster.agent(AgentSpec::new("wb-1", 2, Behaviour::Echo));
    let _c = cluster.agent(AgentSpec::new("wc-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["wa-1", "wb-1", "wc-1"]).await;

    // Sequential calls show the order: never a burst of one instance.
    let mut sequence = Vec::new();
    for n in 0..60 {
        let (status, body) = cluster.invoke(order(&format!("SO-{n}"))).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "succeeded");
        assert_eq!(body["output"]["echo"]["order_id"], format!("SO-{n}"));
        sequence.push(agent_of(&body));
    }
    let longest_run = sequence.chunk_by(|a, b| a == b).map(|run| run.len()).max().unwrap_or(0);
    assert!(longest_run <= 2, "smooth WRR never sends a burst; got {sequence:?}");
    for window in sequence.chunks(6) {
        let mut counts = HashMap::new();
        for id in window {
            *counts.entry(id.as_str()).or_insert(0) += 1;
        }
        assert_eq!(counts.get("wa-1"), Some(&3), "each cycle of 6 is 3:2:1: {window:?}");
        assert_eq!(counts.get("wb-1"), Some(&2), "{window:?}");
        assert_eq!(counts.get("wc-1"), Some(&1), "{window:?}");
    }

    // The rest concurrently: totals over 6,000 within ±2 %.
    let counts = Arc::new(std::sync::Mutex::new(HashMap::<String, usize>::new()));
    for id in &sequence {
        *counts.lock().unwrap().entry(id.clone()).or_insert(0) += 1;
    }
    let next = Arc::new(AtomicUsize::new(sequence.len()));
    let mut workers = Vec::new();
    for _ in 0..16 {
        let client = cluster.client.clone();
        let url = cluster.url("/v1/invoke");
        let (counts, next) = (counts.clone(), next.clone());
        let bearer = token(CALLER);
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < 6000 {
                let response = client
                    .post(&url)
                    .bearer_auth(&bearer)
                    .json(&order("SO-1"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                let body: Value = response.json().await.unwrap();
                *counts.lock().unwrap().entry(agent_of(&body)).or_insert(0) += 1;
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let counts = counts.lock().unwrap().clone();
    for (id, expected) in [("wa-1", 3000.0), ("wb-1", 2000.0), ("wc-1", 1000.0)] {
        let got = counts.get(id).copied().unwrap_or(0) as f64;
        assert!(
            (got - expected).abs() <= expected * 0.02,
            "{id}: {got} requests, expected {expected} ±2 % ({counts:?})"
        );
    }
}

// 2. Consistent hash: a session sticks; removing another instance does not move it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_keeps_a_session_on_one_instance() {
    let cluster = Cluster::start().await;
    let ids = ["ha-1", "hb-1", "hc-1", "hd-1"];
    let agents: Vec<Agent> = ids
        .iter()
        .map(|id| cluster.agent(AgentSpec::new(id, 1, Behaviour::Echo)))
        .collect();
    cluster.wait_for_instances(&ids).await;
    let call = |n: usize| {
        json!({
            "capability": CAPABILITY, "target_policy": "consistent_hash", "session_id": "session_001",
            "payload": { "order_id": format!("SO-{n}") }
        })
    };
    let mut owner = None;
    for n in 0..1000 {
        let (status, body) = cluster.invoke(call(n)).await;
        assert_eq!(status, 200, "{body}");
        let agent = agent_of(&body);
        assert_eq!(owner.get_or_insert(agent.clone()), &agent, "call {n} moved");
    }
    let owner = owner.unwrap();
    // Other sessions spread over the instances (the hash is not constant).
    let mut spread = std::collections::HashSet::new();
    for n in 0..40 {
        let mut envelope = call(n);
        envelope["session_id"] = json!(format!("other-{n}"));
        spread.insert(agent_of(&cluster.invoke(envelope).await.1));
    }
    assert!(spread.len() >= 3, "sessions spread: {spread:?}");

    let other = ids.iter().find(|id| **id != owner).unwrap();
    deregister(&cluster.registry.url(), other).await;
    let remaining: Vec<&str> = ids.iter().copied().filter(|id| id != other).collect();
    cluster.wait_for_instances(&remaining).await;
    for n in 0..200 {
        let (status, body) = cluster.invoke(call(n)).await;
        assert_eq!(status, 200);
        assert_eq!(agent_of(&body), owner, "removing {other} moved the session");
    }
    drop(agents);
}

// 3. Least connections: with one slow instance, new requests go to idle ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_avoids_the_busy_instance() {
    let cluster = Cluster::start().await;
    let slow = cluster.agent(AgentSpec::new("slow-1", 1, Behaviour::Hang));
    let _a = cluster.agent(AgentSpec::new("fast-1", 1, Behaviour::Echo));
    let _b = cluster.agent(AgentSpec::new("fast-2", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["fast-1", "fast-2", "slow-1"]).await;
    let envelope = json!({
        "capability": CAPABILITY, "target_policy": "least_connections", "timeout_ms": 10_000,
        "payload": { "order_id": "SO-1" }
    });
    let mut pending = Vec::new();
    let mut answered = Vec::new();
    for _ in 0..30 {
        let client = cluster.client.clone();
        let url = cluster.url("/v1/invoke");
        let envelope = envelope.clone();
        let bearer = token(CALLER);
        let mut call = tokio::spawn(async move {
            let response = client
                .post(&url)
                .bearer_auth(&bearer)
                .json(&envelope)
                .send()
                .await
                .unwrap();
            response.json::<Value>().await.unwrap()
        });
        // An idle instance answers well within this bound; the busy one holds the call.
        match tokio::time::timeout(Duration::from_secs(2), &mut call).await {
            Ok(body) => answered.push(body.unwrap()),
            Err(_) => pending.push(call),
        }
    }
    assert!(slow.hits() <= 1, "the busy instance got {} requests", slow.hits());
    // The in-flight gauge (set when scraped) shows the held call.
    let held = slow.hits();
    let metrics = cluster.metrics().await;
    let gauge = format!("agent_reach_router_inflight{{agent_id=\"slow-1\"}} {held}");
    assert!(metrics.contains(&gauge), "{gauge} missing:\n{metrics}");
    slow.release.notify_waiters();
    for call in pending {
        answered.push(call.await.unwrap());
    }
    assert_eq!(answered.len(), 30);
    let metrics = cluster.metrics().await;
    for agent in ["slow-1", "fast-1", "fast-2"] {
        let gauge = format!("agent_reach_router_inflight{{agent_id=\"{agent}\"}} 0");
        assert!(metrics.contains(&gauge), "{gauge} missing:\n{metrics}");
    }
    assert!(
        answered.iter().all(|body| body["status"] == "succeeded"),
        "{answered:?}"
    );
    let on_slow = answered.iter().filter(|body| agent_of(body) == "slow-1").count();
    assert_eq!(on_slow, slow.hits());
    assert!(on_slow <= 1, "new requests went to the idle instances");
}

// 4. kill -9 of one of three instances under steady load: no failed request,
//    its breaker opens, and it leaves the snapshot after its lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_instance_costs_no_request() {
    let cluster = Cluster::start().await;
    let _a = cluster.agent(AgentSpec::new("ka-1", 1, Behaviour::Echo));
    let _b = cluster.agent(AgentSpec::new("kb-1", 1, Behaviour::Echo));
    // Only the victim has a short lease, so only it leaves when its heartbeats stop.
    let mut victim_spec = AgentSpec::new("kc-1", 1, Behaviour::Echo);
    victim_spec.ttl_s = 3;
    let mut victim = cluster.agent(victim_spec);
    cluster.wait_for_instances(&["ka-1", "kb-1", "kc-1"]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let client = cluster.client.clone();
        let url = cluster.url("/v1/invoke");
        let (stop, done) = (stop.clone(), done.clone());
        let bearer = token(CALLER);
        workers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let response = client
                    .post(&url)
                    .bearer_auth(&bearer)
                    .json(&order("SO-9"))
                    .send()
                    .await
                    .unwrap();
                let status = response.status();
                let body: Value = response.json().await.unwrap();
                if status != 200 {
                    failures.push(body);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            failures
        }));
    }
    let before = done.load(Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(10), || async {
            done.load(Ordering::SeqCst) > before + 200
        })
        .await
    );
    victim.kill();

    let breaker_opened = Arc::new(AtomicBool::new(false));
    let gone = eventually(Duration::from_secs(20), || {
        let cluster = &cluster;
        let breaker_opened = breaker_opened.clone();
        async move {
            let metrics = cluster.metrics().await;
            if metrics.contains("agent_reach_router_breaker_state{agent_id=\"kc-1\"} 2") {
                breaker_opened.store(true, Ordering::SeqCst);
            }
            !cluster.router.routed_agent_ids().contains(&"kc-1".to_string())
        }
    })
    .await;
    assert!(gone, "kc-1 never left the snapshot");
    assert!(
        breaker_opened.load(Ordering::SeqCst),
        "kc-1's breaker never showed open"
    );
    let after = done.load(Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(10), || async {
            done.load(Ordering::SeqCst) > after + 100
        })
        .await
    );
    stop.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for worker in workers {
        failures.extend(worker.await.unwrap());
    }
    assert!(failures.is_empty(), "failed client requests: {failures:?}");
    let metrics = cluster.metrics().await;
    assert!(
        metrics.contains("agent_reach_router_retries_total{reason="),
        "retries were counted"
    );
}

// 5. A business error is passed through as AGENT_ERROR after exactly one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_errors_pass_through_without_retry() {
    let cluster = Cluster::start().await;
    let a = cluster.agent(AgentSpec::new("ea-1", 1, Behaviour::BusinessError));
    let b = cluster.agent(AgentSpec::new("eb-1", 1, Behaviour::BusinessError));
    cluster.wait_for_instances(&["ea-1", "eb-1"]).await;
    let (status, body) = cluster.invoke(order("SO-404")).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["status"], "failed");
    assert_eq!(code_of(&body), "AGENT_ERROR");
    assert_eq!(body["error"]["details"]["agent_code"], "ORDER_NOT_FOUND");
    assert_eq!(body["error"]["details"]["agent_status"], 422);
    assert_eq!(body["error"]["retryable"], false);
    assert_eq!(body["attempts"], 1);
    assert_eq!(a.hits() + b.hits(), 1, "exactly one attempt reached an agent");
}

// 503 is retried on a different instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_instances_are_retried_elsewhere() {
    let cluster = Cluster::start().await;
    let sick = cluster.agent(AgentSpec::new("ua-1", 1000, Behaviour::Unavailable));
    let healthy = cluster.agent(AgentSpec::new("ub-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["ua-1", "ub-1"]).await;
    let (status, body) = cluster.invoke(order("SO-1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent_of(&body), "ub-1");
    assert_eq!(body["attempts"], 2);
    assert_eq!((sick.hits(), healthy.hits()), (1, 1));
}

// An agent that refused the router's assertion (401 UNAUTHENTICATED: expired in
// transit after a partition, found by the chaos run) did not run the call: it
// is retried elsewhere, with its own assertion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_assertion_is_retried_elsewhere() {
    let cluster = Cluster::start().await;
    let refusing = cluster.agent(AgentSpec::new("ra-1", 1000, Behaviour::RefuseAssertion));
    let healthy = cluster.agent(AgentSpec::new("rb-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["ra-1", "rb-1"]).await;
    let (status, body) = cluster.invoke(order("SO-1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent_of(&body), "rb-1");
    assert_eq!(body["attempts"], 2);
    assert_eq!((refusing.hits(), healthy.hits()), (1, 1));
    let metrics = cluster.metrics().await;
    assert!(
        metrics.contains("agent_reach_router_retries_total{reason=\"refused_401\"} 1"),
        "{metrics}"
    );
}

// Retries are bounded (3 attempts, each on a different instance) and end in a stable code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_bounded_and_spread() {
    let cluster = Cluster::start().await;
    let ids = ["xa-1", "xb-1", "xc-1", "xd-1"];
    let agents: Vec<Agent> = ids
        .iter()
        .map(|id| cluster.agent(AgentSpec::new(id, 1, Behaviour::Unavailable)))
        .collect();
    let mut busy_spec = AgentSpec::new("za-1", 1, Behaviour::TooMany);
    busy_spec.version = "2.0.0".into();
    let busy = cluster.agent(busy_spec);
    cluster
        .wait_for_instances(&["xa-1", "xb-1", "xc-1", "xd-1", "za-1"])
        .await;

    let mut pinned = order("SO-1");
    pinned["capability_version"] = json!("^1");
    let (status, body) = cluster.invoke(pinned).await;
    assert_eq!(
        (status, code_of(&body)),
        (502, "ALL_RETRIES_EXHAUSTED".to_string()),
        "{body}"
    );
    assert_eq!(body["attempts"], 3);
    assert_eq!(body["error"]["retryable"], true);
    let tried: std::collections::HashSet<&str> = body["error"]["details"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| attempt["agent_id"].as_str().unwrap())
        .collect();
    assert_eq!(tried.len(), 3, "every retry went to a different instance: {body}");
    assert_eq!(agents.iter().map(Agent::hits).sum::<usize>(), 3);

    // Only one instance, answering 429: retried on it (nothing else exists), then OVERLOADED.
    let mut latest = order("SO-1");
    latest["capability_version"] = json!("^2");
    let (status, body) = cluster.invoke(latest).await;
    assert_eq!((status, code_of(&body)), (429, "OVERLOADED".to_string()), "{body}");
    assert!(busy.hits() <= 3);
}

// Routable statuses: `overloaded` only when nothing else is left, `draining` never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_decide_who_gets_traffic() {
    let cluster = Cluster::start().await;
    let ready = cluster.agent(AgentSpec::new("sr-1", 1, Behaviour::Echo));
    let mut spec = AgentSpec::new("so-1", 1000, Behaviour::Echo);
    spec.status = "overloaded".into();
    let overloaded = cluster.agent(spec);
    cluster.wait_for_instances(&["so-1", "sr-1"]).await;
    for n in 0..20 {
        let (status, body) = cluster.invoke(order(&format!("SO-{n}"))).await;
        assert_eq!((status, agent_of(&body)), (200, "sr-1".to_string()), "{body}");
    }
    assert_eq!(
        overloaded.hits(),
        0,
        "overloaded gets nothing while a ready instance exists"
    );

    // The ready one drains: the overloaded one is all that is left, so it gets the traffic.
    set_status(&cluster.registry.url(), &ready, "draining").await;
    let drained = eventually(Duration::from_secs(10), || {
        let cluster = &cluster;
        async move { agent_of(&cluster.invoke(order("SO-1")).await.1) == "so-1" }
    })
    .await;
    assert!(drained, "traffic never moved off the draining instance");
    let before = ready.hits();
    for n in 0..20 {
        let (status, body) = cluster.invoke(order(&format!("SO-{n}"))).await;
        assert_eq!((status, agent_of(&body)), (200, "so-1".to_string()), "{body}");
    }
    assert_eq!(ready.hits(), before, "a draining instance gets no new request");

    // Draining too: nothing routable.
    set_status(&cluster.registry.url(), &overloaded, "draining").await;
    let none = eventually(Duration::from_secs(10), || {
        let cluster = &cluster;
        async move { code_of(&cluster.invoke(order("SO-1")).await.1) == "NO_AVAILABLE_INSTANCE" }
    })
    .await;
    assert!(none, "with every instance draining the answer is NO_AVAILABLE_INSTANCE");
}

// 6. A hanging agent: DEADLINE_EXCEEDED at the deadline, and the agent got the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_agent_meets_the_deadline() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("hang-1", 1, Behaviour::Hang));
    cluster.wait_for_instances(&["hang-1"]).await;
    let deadline = epoch_ms() + 400;
    let envelope = json!({
        "capability": CAPABILITY, "deadline": deadline, "timeout_ms": 60_000, "request_id": "req-deadline",
        "payload": { "order_id": "SO-1" }
    });
    let (status, body) = cluster.invoke(envelope).await;
    let answered = epoch_ms();
    assert_eq!(status, 504, "{body}");
    assert_eq!(code_of(&body), "DEADLINE_EXCEEDED");
    assert_eq!(body["request_id"], "req-deadline");
    assert!(
        answered >= deadline,
        "answered {} ms before the deadline",
        deadline - answered
    );
    assert!(
        answered <= deadline + 50,
        "answered {} ms after the deadline",
        answered - deadline
    );
    let forwarded = agent
        .seen
        .last_envelope
        .lock()
        .unwrap()
        .clone()
        .expect("the agent got the call");
    assert_eq!(
        forwarded["deadline"], deadline,
        "deadline wins over timeout_ms and is propagated"
    );
    assert_eq!(forwarded["source"], CALLER);
    assert_eq!(forwarded["attempt"], 1);
    assert_eq!(forwarded["request_id"], "req-deadline");
    assert_eq!(forwarded["capability_version"], "1.0.0");
    let traceparent = agent
        .seen
        .last_traceparent
        .lock()
        .unwrap()
        .clone()
        .expect("traceparent");
    assert!(
        traceparent.starts_with("00-") && traceparent.len() == 55,
        "{traceparent}"
    );
    agent.release.notify_waiters();

    // A deadline already past fails at once, without reaching the agent.
    let hits = agent.hits();
    let envelope = json!({ "capability": CAPABILITY, "deadline": epoch_ms() - 1, "payload": { "order_id": "SO-1" } });
    let (status, body) = cluster.invoke(envelope).await;
    assert_eq!((status, code_of(&body)), (504, "DEADLINE_EXCEEDED".to_string()));
    assert_eq!(agent.hits(), hits);
}

// 7. No instance, unknown capability, unmatched version; plus version resolve and schema checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_errors_have_stable_codes() {
    let cluster = Cluster::start().await;
    let mut old = AgentSpec::new("va-1", 1, Behaviour::Echo);
    old.version = "1.0.0".into();
    let mut new = AgentSpec::new("vb-1", 1, Behaviour::Echo);
    new.version = "1.2.0".into();
    let _old = cluster.agent(old);
    let _new = cluster.agent(new);
    cluster.wait_for_instances(&["va-1", "vb-1"]).await;

    let (status, body) = cluster.invoke(order("SO-1")).await;
    assert_eq!(
        (status, body["capability_version"].clone()),
        (200, json!("1.2.0")),
        "highest by default"
    );
    let mut forever = order("SO-1");
    forever["timeout_ms"] = json!(u64::MAX);
    assert_eq!(
        cluster.invoke(forever).await.0,
        200,
        "a huge timeout is clamped, not an overflow"
    );
    let mut pinned = order("SO-1");
    pinned["capability_version"] = json!("~1.0");
    let (status, body) = cluster.invoke(pinned).await;
    assert_eq!((status, agent_of(&body)), (200, "va-1".to_string()));

    let mut missing = order("SO-1");
    missing["capability_version"] = json!("^2");
    let (status, body) = cluster.invoke(missing).await;
    assert_eq!(status, 404);
    assert_eq!(code_of(&body), "VERSION_NOT_FOUND");
    assert_eq!(body["error"]["details"]["available"], json!(["1.2.0", "1.0.0"]));

    let (status, body) = cluster
        .invoke(json!({ "capability": "payment.check", "payload": {} }))
        .await;
    assert_eq!((status, code_of(&body)), (404, "CAPABILITY_NOT_FOUND".to_string()));

    let (status, body) = cluster
        .invoke(json!({ "capability": CAPABILITY, "payload": { "order_id": 42, "count": 0 } }))
        .await;
    assert_eq!((status, code_of(&body)), (422, "SCHEMA_MISMATCH".to_string()), "{body}");
    let pointers: Vec<&str> = body["error"]["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|error| error["pointer"].as_str().unwrap())
        .collect();
    assert!(
        pointers.contains(&"/order_id") && pointers.contains(&"/count"),
        "{pointers:?}"
    );

    // Only a starting (not yet ready) instance: nothing routable.
    let mut starting = AgentSpec::new("sa-1", 1, Behaviour::Echo);
    starting.version = "3.0.0".into();
    starting.status = "starting".into();
    let _starting = cluster.agent(starting);
    cluster.wait_for_instances(&["sa-1", "va-1", "vb-1"]).await;
    let mut three = order("SO-1");
    three["capability_version"] = json!("^3");
    let (status, body) = cluster.invoke(three).await;
    assert_eq!(
        (status, code_of(&body)),
        (503, "NO_AVAILABLE_INSTANCE".to_string()),
        "{body}"
    );
    assert_eq!(body["error"]["retryable"], true);
}

// 8. Bad envelopes: each its stable code, and the router keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_envelopes_get_stable_codes() {
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("ba-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["ba-1"]).await;
    let send_raw = |body: Vec<u8>| {
        let request = cluster
            .client
            .post(cluster.url("/v1/invoke"))
            .bearer_auth(token(CALLER))
            .header("content-type", "application/json")
            .body(body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let cases: Vec<(Vec<u8>, u16, &str, Option<&str>)> = vec![
        (b"{not json".to_vec(), 400, "INVALID_ENVELOPE", None),
        (
            br#"{"capability":"order.query","timeout_ms":"soon"}"#.to_vec(),
            400,
            "INVALID_ENVELOPE",
            Some("timeout_ms"),
        ),
        (
            br#"{"payload":{"order_id":"SO-1"}}"#.to_vec(),
            400,
            "INVALID_ENVELOPE",
            Some("capability"),
        ),
        (
            br#"{"capability":"order.query","target_policy":"random","payload":{}}"#.to_vec(),
            400,
            "INVALID_ENVELOPE",
            Some("target_policy"),
        ),
        (
            format!(
                r#"{{"capability":"order.query","payload":{{"blob":"{}"}}}}"#,
                "x".repeat(2 * 1024 * 1024)
            )
            .into_bytes(),
            413,
            "PAYLOAD_TOO_LARGE",
            None,
        ),
    ];
    for (body, status, code, field) in cases {
        let (got_status, answer) = send_raw(body).await;
        assert_eq!(got_status, status, "{answer}");
        assert_eq!(answer["status"], "failed");
        assert_eq!(code_of(&answer), code, "{answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["details"]["field"], field, "{answer}");
        }
        let (ok, answer) = cluster.invoke(order("SO-1")).await;
        assert_eq!(ok, 200, "the router keeps serving: {answer}");
    }
    let (status, body) = cluster.invoke(json!({ "capability": CAPABILITY, "nope": 1 })).await;
    assert_eq!(
        (status, body["error"]["details"]["field"].clone()),
        (400, json!("nope"))
    );
    let response = cluster.client.get(cluster.url("/v1/invoke")).send().await.unwrap();
    assert_eq!(response.status(), 405);
    let body: Value = response.json().await.unwrap();
    assert_eq!(code_of(&body), "METHOD_NOT_ALLOWED");
    let response = cluster.client.get(cluster.url("/v1/elsewhere")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(code_of(&body), "NOT_FOUND");
}

// 9. Authentication and ACL, with hot reload and last-good fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_acl() {
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("aa-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["aa-1"]).await;

    let (status, body) = cluster.invoke_as(None, order("SO-1")).await;
    assert_eq!((status, code_of(&body)), (401, "UNAUTHENTICATED".to_string()));
    let forged = agent_reach_access::token::issue_hs256(
        CALLER,
        b"another-secret-0123456789abcdef-0123456789",
        Duration::from_secs(60),
    )
    .unwrap();
    let (status, body) = cluster.invoke_as(Some(&forged), order("SO-1")).await;
    assert_eq!((status, code_of(&body)), (401, "UNAUTHENTICATED".to_string()));
    let past = epoch_ms() / 1000 - 3600;
    let expired = agent_reach_access::token::issue_hs256_at(CALLER, SECRET, past - 60, past).unwrap();
    let (status, body) = cluster.invoke_as(Some(&expired), order("SO-1")).await;
    assert_eq!((status, code_of(&body)), (401, "UNAUTHENTICATED".to_string()));
    let (status, body) = cluster.invoke_as(Some("not-a-jwt"), order("SO-1")).await;
    assert_eq!((status, code_of(&body)), (401, "UNAUTHENTICATED".to_string()));

    let stranger = token("stranger");
    let (status, body) = cluster.invoke_as(Some(&stranger), order("SO-1")).await;
    assert_eq!((status, code_of(&body)), (403, "FORBIDDEN".to_string()));
    assert_eq!(body["error"]["details"]["caller"], "stranger");
    assert_eq!(body["error"]["details"]["capability"], CAPABILITY);
    assert!(body["error"]["message"].as_str().unwrap().contains("stranger"));

    // An edit applies within 2 s, without restart.
    let granted = ACL.replace(
        "permissions:\n",
        "permissions:\n  - caller: stranger\n    allow: [\"order.*\"]\n",
    );
    std::fs::write(&cluster.acl_path, granted).unwrap();
    let edited = Instant::now();
    let applied = eventually(Duration::from_secs(2), || {
        let cluster = &cluster;
        let stranger = stranger.clone();
        async move { cluster.invoke_as(Some(&stranger), order("SO-1")).await.0 == 200 }
    })
    .await;
    assert!(applied, "ACL edit not applied within 2 s");
    assert!(edited.elapsed() <= Duration::from_secs(2));

    // A broken edit keeps the last good policy (and says so in the metrics).
    std::fs::write(&cluster.acl_path, "version: 1\npermissions: [[[\n").unwrap();
    let reported = eventually(Duration::from_secs(5), || {
        let cluster = &cluster;
        async move { cluster.metrics().await.contains("agent_reach_acl_file_valid 0") }
    })
    .await;
    assert!(reported, "broken ACL not reported");
    let (status, _) = cluster.invoke_as(Some(&stranger), order("SO-1")).await;
    assert_eq!(status, 200, "the last good policy still applies");
    let (status, _) = cluster.invoke(order("SO-1")).await;
    assert_eq!(status, 200);
}

// Issue 20: a caller over its limits gets 429 RATE_LIMITED with Retry-After;
// other callers are unaffected; the limits follow edits of acl.yaml.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_callers_are_limited_and_others_are_not() {
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("rl-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["rl-1"]).await;
    let limited = ACL.replace(
        "permissions:\n",
        "limits:\n  - caller: tester\n    rate_per_s: 0.5\n    burst: 3\npermissions:\n  - caller: calm\n    allow: [\"*\"]\n",
    );
    std::fs::write(&cluster.acl_path, limited).unwrap();
    // The edit is in force once the burst runs out.
    let statuses = std::sync::Mutex::new(Vec::new());
    let applied = eventually(Duration::from_secs(5), || {
        let (cluster, statuses) = (&cluster, &statuses);
        async move {
            let (status, body) = cluster.invoke(order("SO-1")).await;
            statuses.lock().unwrap().push(status);
            status == 429 && code_of(&body) == "RATE_LIMITED"
        }
    })
    .await;
    assert!(applied, "no 429 after the limits were written: {statuses:?}");
    let response = cluster
        .client
        .post(cluster.url("/v1/invoke"))
        .bearer_auth(token(CALLER))
        .json(&order("SO-2"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["limit"], "rate", "{body}");
    assert_eq!(body["error"]["details"]["caller"], CALLER);
    assert_eq!(body["error"]["retryable"], true);
    // Another caller is not limited by tester's bucket.
    for n in 0..10 {
        let (status, body) = cluster.invoke_as(Some(&token("calm")), order(&format!("SO-{n}"))).await;
        assert_eq!(status, 200, "{body}");
    }
    let metrics = cluster.metrics().await;
    assert!(
        metrics.contains("agent_reach_router_rate_limited_total{caller=\"tester\",limit=\"rate\"}"),
        "{metrics}"
    );
    // A concurrency limit: the second call while one hangs is refused.
    let hang = ACL.replace(
        "permissions:\n",
        "limits:\n  - caller: tester\n    concurrency: 1\npermissions:\n",
    );
    std::fs::write(&cluster.acl_path, hang).unwrap();
    let _slow = cluster.agent(AgentSpec::new("rl-2", 1, Behaviour::Slow(Duration::from_millis(1500))));
    cluster.wait_for_instances(&["rl-1", "rl-2"]).await;
    let unlimited_again = eventually(Duration::from_secs(5), || {
        let cluster = &cluster;
        async move { cluster.invoke(order("SO-3")).await.0 == 200 }
    })
    .await;
    assert!(unlimited_again, "the rate limit was lifted by the edit");
    let slow_calls = (0..4).map(|n| {
        let cluster = &cluster;
        async move { cluster.invoke(order(&format!("SO-c{n}"))).await }
    });
    let answers = futures::future::join_all(slow_calls).await;
    let refused = answers
        .iter()
        .filter(|(status, body)| *status == 429 && body["error"]["details"]["limit"] == "concurrency")
        .count();
    assert!(refused >= 1, "four concurrent calls under concurrency 1: {answers:?}");
    assert!(answers.iter().any(|(status, _)| *status == 200), "{answers:?}");
}

// Issue 21, point 1: a rolling upgrade never blackholes traffic. A v2 that is
// still `starting`, is draining, or has an open breaker leaves unpinned calls
// on the ready v1; the registry's resolution agrees; with no version able to
// take a call the answer names the versions and their instances' states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpinned_calls_go_to_the_highest_version_that_can_take_them() {
    let cluster = Cluster::start_with(|settings| {
        settings.tuning.breaker_failures = 2;
        settings.tuning.breaker_open = Duration::from_secs(3600);
        settings.tuning.max_attempts = 1;
    })
    .await;
    let _v1 = cluster.agent(AgentSpec::new("ru-1", 1, Behaviour::Echo));
    let mut spec = AgentSpec::new("ru-2", 1, Behaviour::Echo);
    spec.version = "2.0.0".into();
    spec.status = "starting".into();
    let v2 = cluster.agent(spec);
    cluster.wait_for_instances(&["ru-1", "ru-2"]).await;
    let version_of = |answer: &Value| answer["capability_version"].as_str().unwrap_or("").to_string();
    let resolved = |registry: String| async move {
        let body: Value = reqwest::Client::new()
            .get(format!("{registry}/v1/capabilities/{CAPABILITY}"))
            .bearer_auth(token(CALLER))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["version"].as_str().unwrap_or("").to_string()
    };
    // v2 starting: v1 serves, and the registry resolves v1 too.
    for n in 0..5 {
        let (status, body) = cluster.invoke(order(&format!("SO-{n}"))).await;
        assert_eq!((status, version_of(&body)), (200, "1.0.0".to_string()), "{body}");
    }
    assert_eq!(resolved(cluster.registry.url()).await, "1.0.0");
    // v2 ready: it takes the unpinned calls.
    set_status(&cluster.registry.url(), &v2, "ready").await;
    let upgraded = eventually(Duration::from_secs(5), || {
        let cluster = &cluster;
        async move { version_of(&cluster.invoke(order("SO-u")).await.1) == "2.0.0" }
    })
    .await;
    assert!(upgraded, "a ready v2 takes unpinned calls");
    assert_eq!(resolved(cluster.registry.url()).await, "2.0.0");
    // v2 draining: back to v1 at once, no failed call.
    set_status(&cluster.registry.url(), &v2, "draining").await;
    let drained = eventually(Duration::from_secs(5), || {
        let cluster = &cluster;
        async move { version_of(&cluster.invoke(order("SO-d")).await.1) == "1.0.0" }
    })
    .await;
    assert!(drained, "a draining v2 leaves unpinned calls to v1");
    for n in 0..5 {
        let (status, body) = cluster.invoke(order(&format!("SO-d{n}"))).await;
        assert_eq!((status, version_of(&body)), (200, "1.0.0".to_string()), "{body}");
    }
    // A v2 whose breaker is open: v1 again.
    let mut broken = AgentSpec::new("ru-3", 1, Behaviour::Unavailable);
    broken.version = "3.0.0".into();
    let _v3 = cluster.agent(broken);
    cluster.wait_for_instances(&["ru-1", "ru-2", "ru-3"]).await;
    let failed = AtomicUsize::new(0);
    let opened = eventually(Duration::from_secs(10), || {
        let (cluster, failed) = (&cluster, &failed);
        async move {
            let (status, body) = cluster.invoke(order("SO-b")).await;
            if status != 200 {
                failed.fetch_add(1, Ordering::SeqCst);
            }
            status == 200 && version_of(&body) == "1.0.0"
        }
    })
    .await;
    assert!(opened, "once v3's breaker opens, v1 serves");
    let failed = failed.load(Ordering::SeqCst);
    assert!(failed <= 2, "only the calls that opened the breaker failed: {failed}");
    // Pinned to a version nothing can serve: NO_AVAILABLE_INSTANCE naming the versions and states.
    let (status, body) = cluster
        .invoke(json!({ "capability": CAPABILITY, "capability_version": ">=2", "payload": { "order_id": "SO-p" } }))
        .await;
    assert_eq!(
        (status, code_of(&body)),
        (503, "NO_AVAILABLE_INSTANCE".to_string()),
        "{body}"
    );
    let versions = body["error"]["details"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{body}");
    assert_eq!(versions[0]["version"], "3.0.0");
    assert_eq!(versions[0]["instances"][0]["breaker"], "open");
    assert_eq!(versions[1]["version"], "2.0.0");
    assert_eq!(versions[1]["instances"][0]["status"], "draining");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("ru-2 draining"),
        "{body}"
    );
    // Pinned to a version that does not exist at all: VERSION_NOT_FOUND, as before.
    let (status, body) = cluster
        .invoke(json!({ "capability": CAPABILITY, "capability_version": "^9", "payload": { "order_id": "SO-9" } }))
        .await;
    assert_eq!(
        (status, code_of(&body)),
        (404, "VERSION_NOT_FOUND".to_string()),
        "{body}"
    );
}

// Issue 21, point 4: an answer that does not match the capability's output
// schema is a failed result naming the pointer, counted per instance, never
// retried; an agent that asks for its answers to go unchecked is not checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_break_the_output_schema_are_refused() {
    let cluster = Cluster::start().await;
    // Echo answers {"agent_id": .., "echo": payload}.
    let wants_total = json!({
        "type": "object",
        "required": ["total"],
        "properties": { "total": { "type": "number" } }
    });
    let mut changed = AgentSpec::new("os-1", 1, Behaviour::Echo);
    changed.output_schema = Some(wants_total.clone());
    let changed = cluster.agent(changed);
    let mut unchecked = AgentSpec::new("os-2", 1, Behaviour::Echo);
    unchecked.version = "2.0.0".into();
    unchecked.output_schema = Some(wants_total);
    unchecked.check_output = Some(false);
    let _unchecked = cluster.agent(unchecked);
    let mut faithful = AgentSpec::new("os-3", 1, Behaviour::Echo);
    faithful.version = "3.0.0".into();
    faithful.output_schema = Some(json!({
        "type": "object",
        "required": ["agent_id", "echo"],
        "properties": { "agent_id": { "type": "string" }, "echo": { "type": "object" } },
        "additionalProperties": false
    }));
    let _faithful = cluster.agent(faithful);
    cluster.wait_for_instances(&["os-1", "os-2", "os-3"]).await;
    let pinned = |version: &str, id: &str| json!({ "capability": CAPABILITY, "capability_version": version, "payload": { "order_id": id } });

    let (status, body) = cluster.invoke(pinned("=1.0.0", "OS-1")).await;
    assert_eq!(
        (status, code_of(&body)),
        (502, "OUTPUT_SCHEMA_MISMATCH".to_string()),
        "{body}"
    );
    let details = &body["error"]["details"];
    assert_eq!(details["agent_id"], "os-1", "{body}");
    assert_eq!(details["total"], 1, "{body}");
    assert_eq!(details["errors"][0]["pointer"], "", "{body}");
    assert!(
        details["errors"][0]["message"].as_str().unwrap().contains("total"),
        "{body}"
    );
    assert!(!body["error"]["retryable"].as_bool().unwrap(), "{body}");
    assert_eq!(body["attempts"], 1, "not retried: {body}");
    assert_eq!(changed.hits(), 1);
    // The agent asked for no check: its answer passes as it is.
    let (status, body) = cluster.invoke(pinned("=2.0.0", "OS-2")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["agent_id"], "os-2");
    // A faithful answer passes the check.
    let (status, body) = cluster.invoke(pinned("=3.0.0", "OS-3")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"]["echo"]["order_id"], "OS-3");
    // Counted per instance.
    let metrics = cluster.metrics().await;
    assert!(
        metrics.contains("agent_reach_router_output_schema_mismatches_total{agent_id=\"os-1\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("agent_reach_router_output_schema_mismatches_total{agent_id=\"os-3\"} 0"),
        "{metrics}"
    );
}

// Issue 21, point 6: a client written to the seeds' envelope is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_envelope_is_accepted_as_an_alias_form() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("se-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["se-1"]).await;
    let seeds = json!({
        "version": "1.0", "msg_id": "msg_8a7f3c92", "session_id": "session_001", "trace_id": "trace_6e2b1d",
        "agent_capability": format!("cap:{CAPABILITY}"), "source": "someone_else",
        "target_policy": "weighted_random", "timeout": { "value": 15, "unit": "s" },
        "payload": { "order_id": "SO-1" }
    });
    let (status, body) = cluster.invoke(seeds.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["request_id"], "msg_8a7f3c92");
    assert_eq!(body["capability"], CAPABILITY);
    let forwarded = agent.seen.last_envelope.lock().unwrap().clone().unwrap();
    assert_eq!(forwarded["request_id"], "msg_8a7f3c92");
    assert_eq!(
        forwarded["source"], CALLER,
        "the caller is who its token says, never its `source`"
    );
    let deadline = forwarded["deadline"].as_u64().unwrap();
    let remaining = deadline.saturating_sub(epoch_ms());
    assert!(
        (10_000..=15_000).contains(&remaining),
        "timeout {{15 s}} became the deadline: {remaining} ms left"
    );
    // The seeds' trace id continues one trace across calls (no traceparent sent).
    let first = agent.seen.last_traceparent.lock().unwrap().clone().unwrap();
    let mut again = seeds.clone();
    again["msg_id"] = json!("msg-2");
    let (status, _) = cluster.invoke(again).await;
    assert_eq!(status, 200);
    let second = agent.seen.last_traceparent.lock().unwrap().clone().unwrap();
    assert_eq!(first.split('-').nth(1), second.split('-').nth(1), "{first} / {second}");
    // Outside the aliases, unknown fields are still refused.
    let (status, body) = cluster
        .invoke(json!({ "capability": CAPABILITY, "callback_url": "x" }))
        .await;
    assert_eq!(
        (status, body["error"]["details"]["field"].clone()),
        (400, json!("callback_url"))
    );
}

// 10. Registry loss: routing continues from the snapshot; when it is back, new
//     registrations appear (the watch resumes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_survives_registry_loss() {
    let mut cluster = Cluster::start().await;
    let mut spec = AgentSpec::new("ra-1", 1, Behaviour::Echo);
    spec.ttl_s = 30;
    let _a = cluster.agent(spec);
    cluster.wait_for_instances(&["ra-1"]).await;
    let registry_addr = cluster.registry.addr;

    cluster.registry.kill();
    let lost = eventually(Duration::from_secs(10), || {
        let cluster = &cluster;
        async move {
            cluster
                .metrics()
                .await
                .contains("agent_reach_router_registry_connected 0")
        }
    })
    .await;
    assert!(lost, "the router did not notice the registry loss");
    for n in 0..50 {
        let (status, body) = cluster.invoke(order(&format!("SO-{n}"))).await;
        assert_eq!(status, 200, "routing from the last snapshot: {body}");
    }
    let ready = cluster.client.get(cluster.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "a fresh-enough snapshot keeps the router ready");

    cluster.registry = start_registry(
        &cluster.etcd.endpoint(),
        &cluster.secret_path,
        &cluster.acl_path,
        Some(registry_addr),
    );
    let mut spec = AgentSpec::new("rb-1", 1, Behaviour::Echo);
    spec.ttl_s = 30;
    let _b = cluster.agent(spec);
    cluster.wait_for_instances(&["ra-1", "rb-1"]).await;
    let mut seen = std::collections::HashSet::new();
    for n in 0..10 {
        seen.insert(agent_of(&cluster.invoke(order(&format!("SO-{n}"))).await.1));
    }
    assert_eq!(seen.len(), 2, "both instances take traffic: {seen:?}");
}

// The OpenAPI document matches the routes and the envelope types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_is_true() {
    let cluster = Cluster::start().await;
    let response = cluster
        .client
        .get(cluster.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let document: Value = response.json().await.unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let paths = document["paths"].as_object().unwrap();
    let documented: std::collections::HashSet<&str> = agent_reach_router::openapi_paths()
        .iter()
        .map(|(path, _)| *path)
        .collect();
    assert_eq!(paths.len(), documented.len());
    for &(path, method) in agent_reach_router::openapi_paths() {
        assert!(paths[path].get(method).is_some(), "{method} {path} documented");
        let request = match method {
            "get" => cluster.client.get(cluster.url(path)),
            "put" => cluster.client.put(cluster.url(path)).json(&json!({})),
            "delete" => cluster.client.delete(cluster.url(path)),
            _ => cluster.client.post(cluster.url(path)).json(&json!({})),
        };
        let status = request.send().await.unwrap().status().as_u16();
        if path == "/.well-known/oauth-protected-resource" {
            // Served only with an OIDC issuer (tests/oidc.rs); this router has none.
            assert_eq!(status, 404);
            continue;
        }
        assert_ne!(status, 404, "{method} {path} is served");
        assert_ne!(status, 405, "{method} {path} is served");
    }
    // Every envelope field is documented, and nothing else.
    let full = agent_reach_proto::envelope::InvokeRequest {
        version: Some("1.0".into()),
        request_id: Some("r".into()),
        session_id: Some("s".into()),
        context_id: Some("c".into()),
        capability: "a".into(),
        capability_version: Some("1".into()),
        target_policy: Some(Default::default()),
        priority: Some(Default::default()),
        timeout_ms: Some(1),
        deadline: Some(1),
        timeout: Some(agent_reach_proto::envelope::Timeout {
            value: 1,
            unit: Some("s".into()),
        }),
        trace_id: Some("t".into()),
        source: Some("ignored".into()),
        replay_of: Some("r0".into()),
        payload: json!({}),
        budget: Some(agent_reach_proto::envelope::BudgetGiven {
            calls: Some(1),
            cost: None,
        }),
    };
    let fields: std::collections::BTreeSet<String> = serde_json::to_value(&full)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let documented: std::collections::BTreeSet<String> = document["components"]["schemas"]["InvokeRequest"]
        ["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(fields, documented);
    let codes: Vec<&str> = document["components"]["schemas"]["EnvelopeError"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|code| code.as_str().unwrap())
        .collect();
    for code in [
        "INVALID_ENVELOPE",
        "UNAUTHENTICATED",
        "FORBIDDEN",
        "CAPABILITY_NOT_FOUND",
        "VERSION_NOT_FOUND",
        "PAYLOAD_TOO_LARGE",
        "SCHEMA_MISMATCH",
        "OVERLOADED",
        "AGENT_ERROR",
        "ALL_RETRIES_EXHAUSTED",
        "NO_AVAILABLE_INSTANCE",
        "DEADLINE_EXCEEDED",
    ] {
        assert!(codes.contains(&code), "{code} documented");
    }
    let result_fields = document["components"]["schemas"]["ResultEnvelope"]["properties"]
        .as_object()
        .unwrap();
    for field in [
        "version",
        "request_id",
        "status",
        "capability",
        "capability_version",
        "agent_id",
        "attempts",
        "duration_ms",
        "output",
        "error",
    ] {
        assert!(result_fields.contains_key(field), "{field} documented");
    }
}

// The binary's server (one single-threaded runtime per core on SO_REUSEPORT
// listeners) serves the same API and stops on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_server_serves_and_stops() {
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("pa-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["pa-1"]).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", agent_reach_testkit::free_port())
        .parse()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(agent_reach_router::serve_per_core(
        addr,
        2,
        cluster.router.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let url = format!("http://{addr}/v1/invoke");
    let up = eventually(Duration::from_secs(5), || {
        let client = cluster.client.clone();
        let url = url.clone();
        async move {
            let response = client
                .post(&url)
                .bearer_auth(token(CALLER))
                .json(&order("SO-1"))
                .send()
                .await;
            response.is_ok_and(|response| response.status() == 200)
        }
    })
    .await;
    assert!(up, "per-core server did not answer");
    for n in 0..20 {
        let response = cluster
            .client
            .post(&url)
            .bearer_auth(token(CALLER))
            .json(&order(&format!("SO-{n}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    // A second server on the same port is refused, not silently sharing it.
    let second = agent_reach_router::serve_per_core(addr, 1, cluster.router.clone(), async {}).await;
    assert!(second.is_err(), "a second router bound the same port");
    stop.send(()).unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(
        matches!(finished, Ok(Ok(Ok(())))),
        "server did not stop cleanly: {finished:?}"
    );
}

// A caller's own too-short deadline says nothing about the instance: timeouts
// within a budget shorter than twice the instance's smoothed latency (plus
// 10 ms) leave its breaker closed (found by the OpenAPI fuzzer: a burst of
// `timeout_ms: 1` calls opened the only instance's breaker for everyone);
// within a fair budget they open it, as DESIGN §3.4 says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_deadlines_an_instance_should_have_met_count_against_it() {
    let cluster = Cluster::start_with(|settings| {
        settings.tuning.breaker_failures = 2;
        settings.tuning.breaker_open = Duration::from_secs(3600);
        settings.tuning.max_attempts = 1;
    })
    .await;
    let breaker = |metrics: &str, agent_id: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(&format!("agent_reach_router_breaker_state{{agent_id=\"{agent_id}\"}}")))
            .and_then(|line| line.rsplit(' ').next())
            .map(str::to_string)
    };
    // Two versions, each call pinned to one: the slow instance and the hanging one.
    let _slow = cluster.agent(AgentSpec::new(
        "fd-slow",
        1,
        Behaviour::Slow(Duration::from_millis(100)),
    ));
    let mut spec = AgentSpec::new("fd-hang", 1, Behaviour::Hang);
    spec.version = "2.0.0".into();
    let hang = cluster.agent(spec);
    cluster.wait_for_instances(&["fd-slow", "fd-hang"]).await;
    let pinned = |request: &str, version: &str, timeout_ms: Option<u64>| {
        let mut call = order(request);
        call["capability_version"] = json!(format!("={version}"));
        if let Some(timeout_ms) = timeout_ms {
            call["timeout_ms"] = json!(timeout_ms);
        }
        call
    };
    // One answer teaches the router the slow instance's latency (about 100 ms).
    let (status, body) = cluster.invoke(pinned("SO-1", "1.0.0", None)).await;
    assert_eq!(status, 200, "{body}");
    for n in 0..5 {
        let call = pinned(&format!("SO-short-{n}"), "1.0.0", Some(40));
        let (status, body) = cluster.invoke(call).await;
        assert_eq!(
            (status, code_of(&body)),
            (504, "DEADLINE_EXCEEDED".to_string()),
            "{body}"
        );
    }
    assert_eq!(
        breaker(&cluster.metrics().await, "fd-slow").as_deref(),
        Some("0"),
        "closed"
    );
    let (status, body) = cluster.invoke(pinned("SO-2", "1.0.0", None)).await;
    assert_eq!(status, 200, "the instance still serves: {body}");

    // The hanging instance, given budgets it should have met: two timeouts open it.
    for n in 0..2 {
        let call = pinned(&format!("SO-fair-{n}"), "2.0.0", Some(300));
        let (status, body) = cluster.invoke(call).await;
        assert_eq!(
            (status, code_of(&body)),
            (504, "DEADLINE_EXCEEDED".to_string()),
            "{body}"
        );
    }
    assert_eq!(
        breaker(&cluster.metrics().await, "fd-hang").as_deref(),
        Some("2"),
        "open"
    );
    hang.release.notify_waiters();
}

/// `agent_reach_router_routable_instances` (the alert on a capability left
/// with one instance reads it) follows status changes, counted per capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routable_instances_are_counted_per_capability_at_scrape_time() {
    let cluster = Cluster::start().await;
    let _one = cluster.agent(AgentSpec::new("count-1", 1, Behaviour::Echo));
    let two = cluster.agent(AgentSpec::new("count-2", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["count-1", "count-2"]).await;
    let gauge = |count: usize| format!("agent_reach_router_routable_instances{{capability=\"{CAPABILITY}\"}} {count}");
    assert!(
        cluster.metrics().await.contains(&gauge(2)),
        "{}",
        cluster.metrics().await
    );
    set_status(&cluster.registry.url(), &two, "draining").await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            cluster.metrics().await.contains(&gauge(1))
        })
        .await,
        "a draining instance still counted: {}",
        cluster.metrics().await
    );
}

/// A valid input schema of about `bytes` bytes: an object of many described
/// string properties.
fn large_schema(bytes: usize) -> Value {
    let property = json!({"type": "string", "description": "x".repeat(80)});
    let one = serde_json::to_vec(&property).unwrap().len() + 20;
    let properties: serde_json::Map<String, Value> = (0..bytes / one)
        .map(|index| (format!("field_{index:06}"), property.clone()))
        .collect();
    json!({"type": "object", "properties": properties})
}

// The size cliff (issue 35): a router that starts beside registrations whose
// schemas total ~7 MB (more than one gRPC message may carry by default) gets
// the whole snapshot, is ready and routes; a registration over the schema
// bound is refused with its code and breaks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_starts_beside_registrations_of_any_total_size() {
    let cluster = Cluster::start().await;
    let _echo = cluster.agent(AgentSpec::new("small-1", 1, Behaviour::Echo));
    let client = reqwest::Client::new();
    let schema = large_schema(700_000);
    let schema_bytes = serde_json::to_vec(&schema).unwrap().len();
    assert!((650_000..=786_432).contains(&schema_bytes), "{schema_bytes}");
    for n in 0..10 {
        let response = client
            .post(format!("{}/v1/agents", cluster.registry.url()))
            .bearer_auth(token("large"))
            .json(&json!({
                "agent_id": format!("large-{n}"), "name": "large", "status": "ready", "ttl_s": 60,
                "endpoint": "http://127.0.0.1:9/invoke",
                "capabilities": [{"name": format!("large.cap{n}"), "version": "1.0.0", "input_schema": schema}],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap());
    }
    // Over the bound: 413 SCHEMA_TOO_LARGE, naming the schema.
    let response = client
        .post(format!("{}/v1/agents", cluster.registry.url()))
        .bearer_auth(token("large"))
        .json(&json!({
            "agent_id": "large-over", "name": "large", "status": "ready",
            "endpoint": "http://127.0.0.1:9/invoke",
            "capabilities": [{"name": "large.over", "version": "1.0.0", "input_schema": large_schema(900_000)}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "SCHEMA_TOO_LARGE", "{body}");
    assert_eq!(body["error"]["field"], "capabilities[0].input_schema", "{body}");

    // A router started now reads the ~7 MB snapshot in pages.
    let (router, addr) = cluster.another_router(|_| {}).await;
    let mut expected: Vec<String> = (0..10).map(|n| format!("large-{n}")).collect();
    expected.push("small-1".to_string());
    expected.sort();
    let ready = eventually(Duration::from_secs(30), || {
        let (router, expected, client) = (router.clone(), expected.clone(), client.clone());
        async move {
            let ready = client
                .get(format!("http://{addr}/readyz"))
                .send()
                .await
                .is_ok_and(|response| response.status() == 200);
            ready && router.routed_agent_ids() == expected
        }
    })
    .await;
    assert!(
        ready,
        "the router never held the snapshot: {:?}",
        router.routed_agent_ids()
    );
    let (status, body) = invoke_at(&cluster.client, addr, Some(&token(CALLER)), &order("SO-7")).await;
    assert_eq!((status, agent_of(&body)), (200, "small-1".to_string()), "{body}");
    // The large capabilities are routed and checked against their schemas too.
    let (status, body) = invoke_at(
        &cluster.client,
        addr,
        Some(&token(CALLER)),
        &json!({"capability": "large.cap3", "payload": {"field_000001": 7}}),
    )
    .await;
    assert_eq!((status, code_of(&body)), (422, "SCHEMA_MISMATCH".to_string()), "{body}");
}
