//! The slow path through the router: real Redis (tasks), real etcd and
//! registry, real HTTP agents (router test support).

use crate::support;

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use std::time::Duration;

use agent_reach_task_store::callback::{verify, SIGNATURE_HEADER};
use serde_json::{json, Value};
use support::{
    cluster_with_tasks, eventually, get, post, token, AgentSpec, Behaviour, Cluster, CALLBACK_SECRET, CALLER,
};

/// Callbacks a receiver got: signature header and body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

async fn wait_terminal(cluster: &Cluster, task_id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (_, task) = get(cluster, &format!("/v1/tasks/{task_id}")).await;
        if matches!(task["status"].as_str(), Some("succeeded" | "failed" | "canceled")) {
            return task;
        }
        assert!(tokio::time::Instant::now() < deadline, "task never ended: {task}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_stored_delivered_once_and_idempotent() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let agent = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;

    let envelope = json!({"capability": "order.query", "request_id": "task-req-1", "session_id": "sess-1",
                          "payload": {"order_id": "SO-1"}});
    let (status, submitted) = post(&cluster, "/v1/tasks", envelope.clone()).await;
    assert_eq!(
        (status, submitted["status"].as_str()),
        (202, Some("pending")),
        "{submitted}"
    );
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    // The same request id again: the same task, not a second one.
    let (status, again) = post(&cluster, "/v1/tasks", envelope).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["task_id"], task_id);

    let task = wait_terminal(&cluster, &task_id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["result"]["status"], "succeeded");
    assert_eq!(task["result"]["agent_id"], "echo-1");
    let states: Vec<&str> = task["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|transition| transition["status"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "running", "succeeded"]);
    assert_eq!(agent.hits(), 1, "delivered exactly once");

    // A caller that reconnects pulls the session's results after its cursor.
    let (_, pulled) = get(&cluster, "/v1/sessions/sess-1/results").await;
    let results = pulled["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["task_id"], task_id);
    let cursor = results[0]["cursor"].as_str().unwrap();
    let (_, rest) = get(&cluster, &format!("/v1/sessions/sess-1/results?after={cursor}")).await;
    assert!(rest["results"].as_array().unwrap().is_empty(), "each result once");

    // The slow path's metrics count what happened.
    let metrics = cluster.metrics().await;
    for expected in [
        "agent_reach_tasks_submitted_total{priority=\"normal\"} 1",
        "agent_reach_tasks_finished_total{outcome=\"succeeded\"} 1",
        "agent_reach_tasks_state_seconds_count{state=\"pending\"} 1",
        "agent_reach_tasks_state_seconds_count{state=\"running\"} 1",
    ] {
        assert!(metrics.contains(expected), "missing `{expected}` in\n{metrics}");
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            cluster
                .metrics()
                .await
                .contains("agent_reach_tasks_backlog{capability=\"order.query\",priority=\"normal\"} 0")
        })
        .await,
        "backlog gauge not refreshed"
    );

    // Another caller cannot see the task.
    let foreign = cluster
        .client
        .get(cluster.url(&format!("/v1/tasks/{task_id}")))
        .bearer_auth(token("someone_else"))
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_get_stable_codes() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    // Every failure of every task route is the failed result envelope, with its code.
    let (status, body) = get(&cluster, "/v1/sessions/s-1/results?limit=0&x=1").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_QUERY")),
        "{body}"
    );
    assert_eq!(body["status"], "failed", "{body}");
    // Regression (found by the OpenAPI fuzzer): a cursor that is not a stream id
    // reached Redis and was answered 503 TASK_STORE_UNAVAILABLE.
    for bad in [
        "",
        "0",
        "x-1",
        "1-",
        "-1",
        "+1-0",
        "18446744073709551616-0",
        "18446744073709551615-18446744073709551615",
    ] {
        let (status, body) = get(&cluster, &format!("/v1/sessions/s-1/results?after={bad}")).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("INVALID_QUERY")),
            "after={bad}: {body}"
        );
    }
    let (status, body) = get(&cluster, "/v1/sessions/s-1/results?after=0-0&limit=5").await;
    assert_eq!(
        (status, body["results"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{body}"
    );
    let (status, body) = get(&cluster, "/v1/tasks/no-such-task").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("TASK_NOT_FOUND")),
        "{body}"
    );
    assert_eq!(body["status"], "failed", "{body}");
    for (method, path) in [
        (reqwest::Method::GET, "/v1/tasks"),
        (reqwest::Method::DELETE, "/v1/tasks/t-1"),
        (reqwest::Method::GET, "/v1/tasks/t-1/cancel"),
        (reqwest::Method::POST, "/v1/sessions/s-1/results"),
        (reqwest::Method::GET, "/v1/broadcast"),
        (reqwest::Method::PUT, "/metrics"),
    ] {
        let response = cluster
            .client
            .request(method.clone(), cluster.url(path))
            .bearer_auth(token(CALLER))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "METHOD_NOT_ALLOWED", "{method} {path}: {body}");
        assert_eq!(body["status"], "failed", "{body}");
    }
    let (status, body) = post(&cluster, "/v1/tasks", json!({"payload": {}})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_ENVELOPE")),
        "{body}"
    );
    let (status, body) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {}, "callback": {"url": "ftp://x"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_CALLBACK")),
        "{body}"
    );
    let (status, body) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {}, "callback": {"url": "http://127.0.0.1:1/", "secret_ref": "nope"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_CALLBACK")),
        "{body}"
    );
    let (status, body) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {}, "callback": {"type": "sms", "url": "http://127.0.0.1:1/"}}),
    )
    .await;
    assert_eq!(
        (
            status,
            body["error"]["code"].as_str(),
            body["error"]["details"]["field"].as_str()
        ),
        (400, Some("INVALID_CALLBACK"), Some("callback.type")),
        "{body}"
    );
    let (status, body) = get(&cluster, "/v1/tasks/t_unknown").await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("TASK_NOT_FOUND")));
    let unauthenticated = cluster
        .client
        .post(cluster.url("/v1/tasks"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_running_task_and_callbacks_are_signed() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;

    // Cancel while the agent is working on it: the task ends `canceled`.
    let hanging = cluster.agent(AgentSpec::new("slow-1", 1, Behaviour::Hang));
    cluster.wait_for_instances(&["slow-1"]).await;
    let (_, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "timeout_ms": 20_000, "payload": {"order_id": "SO-2"}}),
    )
    .await;
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&cluster, &format!("/v1/tasks/{task_id}")).await.1["status"] == "running"
        })
        .await
    );
    let (status, canceled) = post(&cluster, &format!("/v1/tasks/{task_id}/cancel"), json!({})).await;
    assert_eq!(
        (status, canceled["status"].as_str()),
        (200, Some("canceled")),
        "{canceled}"
    );
    hanging.release.notify_waiters();
    let (status, again) = post(&cluster, &format!("/v1/tasks/{task_id}/cancel"), json!({})).await;
    assert_eq!((status, again["error"]["code"].as_str()), (409, Some("TASK_CONFLICT")));
    support::deregister(&cluster.registry.url(), "slow-1").await;

    // A finished task's result is POSTed to its callback, signed.
    let _echo = cluster.agent(AgentSpec::new("echo-2", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-2"]).await;
    let received: Received = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let signature = headers
                    .get(SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                sink.lock().unwrap().push((signature.to_string(), body.to_vec()));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (_, submitted) = post(
        &cluster,
        "/v1/tasks",
        // The seeds' callback form, `{type: "http", url}`.
        json!({"capability": "order.query", "payload": {"order_id": "SO-3"}, "callback": {"type": "http", "url": hook}}),
    )
    .await;
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    assert!(
        eventually(Duration::from_secs(15), || async {
            !received.lock().unwrap().is_empty()
        })
        .await
    );
    let (signature, body) = received.lock().unwrap()[0].clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(verify(
        CALLBACK_SECRET,
        &signature,
        &body,
        now,
        Duration::from_secs(300)
    ));
    let delivered: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(delivered["status"], "succeeded");
    assert_eq!(wait_terminal(&cluster, &task_id).await["result"], delivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_the_task_routes_say_so() {
    let cluster = Cluster::start().await;
    let (status, body) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (501, Some("TASKS_DISABLED")),
        "{body}"
    );
}

/// A router with the slow path on its own runtime, so the test can kill it
/// outright (every task, connection and delivery in flight dropped).
fn killable_router(cluster: &Cluster, redis: &str, reclaim_after: Duration) -> (support::Process, String) {
    let mut settings = agent_reach_router::Settings::new(
        "127.0.0.1:0".parse().unwrap(),
        cluster.registry.url(),
        agent_reach_access::AuthConfig::Hs256SecretFile(cluster.secret_path.clone()),
        cluster.acl_path.clone(),
    );
    let mut callbacks = agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec());
    callbacks.allow_private_targets = true;
    settings.tasks = Some(agent_reach_router::TasksSettings {
        redis: redis.to_string(),
        store: agent_reach_task_store::StoreConfig::default(),
        callbacks,
        workers: 16,
        reclaim_after,
        max_task_attempts: 3,
        quota_share: Some(std::time::Duration::from_millis(100)),
        trail: None,
        tag_limits: Vec::new(),
    });
    support::Process::spawn(move || async move {
        let router = agent_reach_router::build(&settings).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(agent_reach_router::serve(listener, router, std::future::pending()));
        url
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_router_loses_no_task() {
    const TASKS: usize = 1000;
    let redis = agent_reach_testkit::Redis::start();
    let cluster = Cluster::start().await;
    let agents = [
        cluster.agent(AgentSpec::new("echo-a", 1, Behaviour::Slow(Duration::from_millis(20)))),
        cluster.agent(AgentSpec::new("echo-b", 1, Behaviour::Slow(Duration::from_millis(20)))),
    ];
    cluster.wait_for_instances(&["echo-a", "echo-b"]).await;
    let store =
        agent_reach_task_store::TaskStore::new(&redis.url(), &agent_reach_task_store::StoreConfig::default()).unwrap();
    let finished = || async {
        store
            .session_results("durable", None, TASKS + 10)
            .await
            .map_or(0, |r| r.len())
    };

    let (mut first, first_url) = killable_router(&cluster, &redis.url(), Duration::from_secs(30));
    let client = reqwest::Client::new();
    // Submitted through the API, 32 at a time: far faster than 16 workers on 20 ms tasks drain them.
    let submissions = futures::stream::iter(0..TASKS)
        .map(|index| {
            let (client, url) = (client.clone(), first_url.clone());
            async move {
                let response = client
                    .post(format!("{url}/v1/tasks"))
                    .bearer_auth(token(CALLER))
                    .json(
                        &json!({"capability": "order.query", "request_id": format!("durable-{index}"),
                                  "session_id": "durable", "payload": {"order_id": format!("SO-{index}")}}),
                    )
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 202);
                let body: Value = response.json().await.unwrap();
                body["task_id"].as_str().unwrap().to_string()
            }
        })
        .buffer_unordered(32);
    let task_ids: Vec<String> = submissions.collect().await;
    assert!(eventually(Duration::from_secs(30), || async { finished().await >= TASKS / 5 }).await);
    first.kill(); // kill -9: deliveries in flight vanish, nothing is acknowledged for them

    // The tasks a dying router was delivering are the only ones that may run twice.
    let mut in_flight = std::collections::HashSet::new();
    for task_id in &task_ids {
        let task = store.get(task_id).await.unwrap();
        if matches!(
            task.state,
            agent_reach_task_store::State::Running | agent_reach_task_store::State::Retrying
        ) {
            in_flight.insert(task.request_id.clone());
        }
    }
    let before_restart = finished().await;
    assert!(before_restart < TASKS, "the kill came too late to mean anything");
    eprintln!(
        "router killed with {before_restart} of {TASKS} tasks finished, {} in flight",
        in_flight.len()
    );

    let (_second, _second_url) = killable_router(&cluster, &redis.url(), Duration::from_millis(500));
    assert!(
        eventually(Duration::from_secs(60), || async { finished().await >= TASKS }).await,
        "only {} of {TASKS} tasks ended after the restart",
        finished().await
    );
    for task_id in &task_ids {
        let task = store.get(task_id).await.unwrap();
        assert_eq!(task.state, agent_reach_task_store::State::Succeeded, "{task:?}");
    }
    let mut deliveries = std::collections::HashMap::<String, usize>::new();
    for agent in &agents {
        for (request_id, count) in agent.seen.by_request.lock().unwrap().iter() {
            *deliveries.entry(request_id.clone()).or_default() += count;
        }
    }
    for index in 0..TASKS {
        let request_id = format!("durable-{index}");
        let count = deliveries.get(&request_id).copied().unwrap_or(0);
        assert!(count >= 1, "{request_id} never reached an agent");
        assert!(
            count == 1 || in_flight.contains(&request_id),
            "{request_id} ran {count} times but was not in flight at the kill"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_reaches_every_instance() {
    let cluster = Cluster::start().await;
    let agents = [
        cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo)),
        cluster.agent(AgentSpec::new("echo-2", 2, Behaviour::Echo)),
        cluster.agent(AgentSpec::new("broken-3", 1, Behaviour::BusinessError)),
    ];
    cluster.wait_for_instances(&["broken-3", "echo-1", "echo-2"]).await;
    let (status, body) = post(
        &cluster,
        "/v1/broadcast",
        json!({"capability": "order.query", "request_id": "fan-1", "payload": {"order_id": "SO-9"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_two_succeeded_one_failed(&body["outcomes"]);
    assert!(
        agents.iter().all(|agent| agent.hits() == 1),
        "each instance got it exactly once"
    );
    // The same checks as invoke: a schema violation refuses the whole broadcast.
    let (status, body) = post(
        &cluster,
        "/v1/broadcast",
        json!({"capability": "order.query", "payload": {}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("SCHEMA_MISMATCH")),
        "{body}"
    );
    let (status, body) = post(
        &cluster,
        "/v1/broadcast",
        json!({"capability": "nothing.here", "payload": {}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("CAPABILITY_NOT_FOUND")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_events_stream_every_state_until_the_end() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let _agent = cluster.agent(AgentSpec::new("slow-1", 1, Behaviour::Slow(Duration::from_millis(300))));
    cluster.wait_for_instances(&["slow-1"]).await;
    let (_, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {"order_id": "SO-7"}}),
    )
    .await;
    let task_id = submitted["task_id"].as_str().unwrap();
    let response = cluster
        .client
        .get(cluster.url(&format!("/v1/tasks/{task_id}/events")))
        .bearer_auth(token(CALLER))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // The stream ends by itself once the task has ended.
    let text = tokio::time::timeout(Duration::from_secs(15), response.text())
        .await
        .unwrap()
        .unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| serde_json::from_str(data.trim()).unwrap())
        .collect();
    let states: Vec<&str> = events.iter().map(|event| event["status"].as_str().unwrap()).collect();
    assert_eq!(states, ["pending", "running", "succeeded"], "{text}");
    assert_eq!(events[2]["result"]["status"], "succeeded");
}

/// A callback receiver answering 503 to its first `failures` calls; records when each call came.
async fn flaky_receiver(failures: usize) -> (String, Arc<Mutex<Vec<std::time::Instant>>>) {
    let calls: Arc<Mutex<Vec<std::time::Instant>>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let seen = seen.clone();
            async move {
                let mut seen = seen.lock().unwrap();
                seen.push(std::time::Instant::now());
                if seen.len() <= failures {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, calls)
}

/// The production schedule, end to end: retries after about 2, 4 and 8 s;
/// after five failures the result is dead-lettered, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_follow_the_2_4_8_16_schedule_then_dead_letter() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let cluster = Cluster::start_with(move |settings| {
        let mut callbacks = agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec());
        callbacks.allow_private_targets = true; // receivers run on loopback
        settings.tasks = Some(agent_reach_router::TasksSettings {
            redis: url,
            store: agent_reach_task_store::StoreConfig::default(),
            callbacks, // the default schedule: 2, 4, 8, 16 s
            workers: 16,
            reclaim_after: Duration::from_secs(120),
            max_task_attempts: 3,
            quota_share: Some(std::time::Duration::from_millis(100)),
            trail: None,
            tag_limits: Vec::new(),
        });
    })
    .await;
    let _echo = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;

    let (down_three, calls_three) = flaky_receiver(3).await;
    let (down_always, calls_always) = flaky_receiver(usize::MAX).await;
    let (_, recovering) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {"order_id": "SO-1"}, "callback": {"url": down_three}}),
    )
    .await;
    let (_, doomed) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {"order_id": "SO-2"}, "callback": {"url": down_always}}),
    )
    .await;

    assert!(
        eventually(Duration::from_secs(25), || async {
            calls_three.lock().unwrap().len() >= 4
        })
        .await
    );
    let at = calls_three.lock().unwrap().clone();
    assert_eq!(at.len(), 4, "delivered on the fourth attempt, then no more");
    let gaps: Vec<f64> = at.windows(2).map(|pair| (pair[1] - pair[0]).as_secs_f64()).collect();
    for (gap, expected) in gaps.iter().zip([2.0, 4.0, 8.0]) {
        assert!((expected..expected + 1.0).contains(gap), "gaps {gaps:?}");
    }

    let store =
        agent_reach_task_store::TaskStore::new(&redis.url(), &agent_reach_task_store::StoreConfig::default()).unwrap();
    assert!(
        eventually(Duration::from_secs(40), || async {
            store.dead_letters(10).await.is_ok_and(|dead| !dead.is_empty())
        })
        .await,
        "no dead letter after five failed attempts"
    );
    assert_eq!(calls_always.lock().unwrap().len(), 5);
    let dead = store.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1, "one dead letter, for the doomed task only");
    assert_eq!(dead[0].0, doomed["task_id"].as_str().unwrap());
    let held: Value = serde_json::from_str(&dead[0].1).unwrap();
    assert_eq!(held["status"], "succeeded", "the dead letter holds the result");
    assert_eq!(
        wait_terminal(&cluster, recovering["task_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    assert!(cluster
        .metrics()
        .await
        .contains("agent_reach_tasks_callback_failures_total 8"));
}

/// Issue 6, acceptance 5: a capability served only by `class: bulk`
/// instances runs at most its limit at once; queued work waits, high
/// priority overtakes low, and low still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_tagged_work_is_limited_and_high_priority_overtakes() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let cluster = Cluster::start_with(move |settings| {
        settings.tasks = Some(agent_reach_router::TasksSettings {
            redis: url,
            store: agent_reach_task_store::StoreConfig::default(),
            callbacks: agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec()),
            workers: 16,
            reclaim_after: Duration::from_secs(120),
            max_task_attempts: 3,
            quota_share: Some(std::time::Duration::from_millis(100)),
            trail: None,
            tag_limits: vec![agent_reach_router::TagLimit::parse("class=bulk:2").unwrap()],
        });
    })
    .await;
    let mut specs = Vec::new();
    for id in ["bulk-1", "bulk-2"] {
        let mut spec = AgentSpec::new(id, 1, Behaviour::Slow(Duration::from_millis(150)));
        spec.tags = json!({"class": "bulk"});
        specs.push(spec);
    }
    let agents: Vec<_> = specs.into_iter().map(|spec| cluster.agent(spec)).collect();
    cluster.wait_for_instances(&["bulk-1", "bulk-2"]).await;

    let submit = |priority: &'static str, index: usize| {
        let cluster = &cluster;
        async move {
            let (status, body) = post(
                cluster,
                "/v1/tasks",
                json!({"capability": "order.query", "priority": priority, "session_id": "bulk",
                       "request_id": format!("{priority}-{index}"), "payload": {"order_id": format!("SO-{index}")}}),
            )
            .await;
            assert_eq!(status, 202, "{body}");
        }
    };
    for index in 0..12 {
        submit("low", index).await;
    }
    // The low tasks are queued behind the limit of 2; now the urgent ones arrive.
    for index in 0..3 {
        submit("high", index).await;
    }
    let store =
        agent_reach_task_store::TaskStore::new(&redis.url(), &agent_reach_task_store::StoreConfig::default()).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || async {
            store
                .session_results("bulk", None, 100)
                .await
                .is_ok_and(|results| results.len() == 15)
        })
        .await,
        "not every task completed"
    );
    let order: Vec<String> = store
        .session_results("bulk", None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|result| {
            assert_eq!(result.state, agent_reach_task_store::State::Succeeded);
            result.result.unwrap()["request_id"].as_str().unwrap().to_string()
        })
        .collect();
    let last_high = order.iter().rposition(|id| id.starts_with("high")).unwrap();
    let lows_after = order[last_high + 1..].iter().filter(|id| id.starts_with("low")).count();
    assert!(
        lows_after >= 5,
        "high priority did not overtake queued low work: {order:?}"
    );
    assert_eq!(
        agents.iter().map(|agent| agent.hits()).sum::<usize>(),
        15,
        "each delivered once"
    );
    // Never more than the limit running at once, from the recorded transitions.
    let mut edges = Vec::new();
    for result in store.session_results("bulk", None, 100).await.unwrap() {
        let task = store.get(&result.task_id).await.unwrap();
        let at = |state: agent_reach_task_store::State| {
            task.transitions
                .iter()
                .find(|t| t.state == state)
                .map(|t| t.at_ms)
                .unwrap()
        };
        edges.push((at(agent_reach_task_store::State::Running), 1i32));
        edges.push((at(agent_reach_task_store::State::Succeeded), -1i32));
    }
    edges.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, change) in edges {
        running += change;
        most = most.max(running);
    }
    assert!(most <= 2, "{most} bulk tasks ran at once; the limit is 2");
}

/// Issue 6: asynchronous broadcast, a parent task with a child per instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_broadcast_is_a_parent_with_a_child_per_instance() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let agents = [
        cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo)),
        cluster.agent(AgentSpec::new("echo-2", 1, Behaviour::Echo)),
        cluster.agent(AgentSpec::new("broken-3", 1, Behaviour::BusinessError)),
    ];
    cluster.wait_for_instances(&["broken-3", "echo-1", "echo-2"]).await;
    let envelope = json!({"capability": "order.query", "request_id": "fan-async", "payload": {"order_id": "SO-5"}});
    let (status, parent) = post(&cluster, "/v1/broadcast?async=true", envelope.clone()).await;
    assert_eq!(status, 202, "{parent}");
    assert_eq!(parent["children"].as_array().unwrap().len(), 3);
    let (status, again) = post(&cluster, "/v1/broadcast?async=true", envelope).await;
    assert_eq!(status, 200, "a resubmission returns the same parent: {again}");
    assert_eq!(again["task_id"], parent["task_id"]);

    let done = wait_terminal(&cluster, parent["task_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_two_succeeded_one_failed(&done["result"]["output"]["outcomes"]);
    assert!(
        agents.iter().all(|agent| agent.hits() == 1),
        "each instance exactly once"
    );
    let (status, body) = post(&cluster, "/v1/broadcast?async=maybe", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("INVALID_QUERY")));
}

/// Callbacks are scheduled in Redis, not in a router's memory: a router that
/// dies between attempts leaves the next one to another router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_survives_its_router() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = Cluster::start().await;
    let _echo = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;
    let (hook, calls) = flaky_receiver(1).await;

    let (mut first, first_url) = killable_router(&cluster, &redis.url(), Duration::from_secs(30));
    let response = cluster
        .client
        .post(format!("{first_url}/v1/tasks"))
        .bearer_auth(token(CALLER))
        .json(&json!({"capability": "order.query", "payload": {"order_id": "SO-8"}, "callback": {"url": hook}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    // The first attempt fails; the next is due 2 s later. The router dies meanwhile.
    assert!(eventually(Duration::from_secs(15), || async { calls.lock().unwrap().len() == 1 }).await);
    first.kill();

    let (_second, _) = killable_router(&cluster, &redis.url(), Duration::from_secs(30));
    assert!(
        eventually(Duration::from_secs(15), || async { calls.lock().unwrap().len() >= 2 }).await,
        "the new router never sent the scheduled callback"
    );
    let at = calls.lock().unwrap().clone();
    let gap = (at[1] - at[0]).as_secs_f64();
    assert!(
        (2.0..4.0).contains(&gap),
        "second attempt after {gap} s, not on the 2 s schedule"
    );
    // Delivered: nothing more is sent.
    let settled = eventually(Duration::from_secs(5), || async { calls.lock().unwrap().len() > 2 }).await;
    assert!(!settled, "a delivered callback was sent again");
}

/// Issue 6, acceptance 4 through the router: a task canceled while still
/// pending (queued behind a busy bulk limit) never reaches an agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_pending_task_is_never_delivered() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let cluster = Cluster::start_with(move |settings| {
        settings.tasks = Some(agent_reach_router::TasksSettings {
            redis: url,
            store: agent_reach_task_store::StoreConfig::default(),
            callbacks: agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec()),
            workers: 16,
            reclaim_after: Duration::from_secs(120),
            max_task_attempts: 3,
            quota_share: Some(std::time::Duration::from_millis(100)),
            trail: None,
            tag_limits: vec![agent_reach_router::TagLimit::parse("class=bulk:1").unwrap()],
        });
    })
    .await;
    let mut spec = AgentSpec::new("bulk-1", 1, Behaviour::Hang);
    spec.tags = json!({"class": "bulk"});
    let agent = cluster.agent(spec);
    cluster.wait_for_instances(&["bulk-1"]).await;

    let submit = |request_id: &'static str| {
        let cluster = &cluster;
        async move {
            let (status, body) = post(
                cluster,
                "/v1/tasks",
                json!({"capability": "order.query", "request_id": request_id, "timeout_ms": 20_000,
                       "payload": {"order_id": "SO-1"}}),
            )
            .await;
            assert_eq!(status, 202, "{body}");
            body["task_id"].as_str().unwrap().to_string()
        }
    };
    let busy = submit("first").await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(&cluster, &format!("/v1/tasks/{busy}")).await.1["status"] == "running"
        })
        .await
    );
    // The second waits behind the limit of 1, still pending.
    let waiting = submit("second").await;
    let (status, canceled) = post(&cluster, &format!("/v1/tasks/{waiting}/cancel"), json!({})).await;
    assert_eq!(
        (status, canceled["status"].as_str()),
        (200, Some("canceled")),
        "{canceled}"
    );
    let transitions: Vec<&str> = canceled["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|transition| transition["status"].as_str().unwrap())
        .collect();
    assert_eq!(transitions, ["pending", "canceled"], "it never ran");

    // The first finishes; the gate opens; the canceled task is released unrun.
    agent.release.notify_waiters();
    assert_eq!(wait_terminal(&cluster, &busy).await["status"], "succeeded");
    let third = submit("third").await;
    agent.release.notify_waiters();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while get(&cluster, &format!("/v1/tasks/{third}")).await.1["status"] != "succeeded" {
        agent.release.notify_waiters();
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gate never admitted the next task"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered = agent.seen.by_request.lock().unwrap().clone();
    assert!(
        !delivered.contains_key("second"),
        "a canceled pending task reached the agent: {delivered:?}"
    );
    assert_eq!(delivered.get("first"), Some(&1));
    assert_eq!(
        get(&cluster, &format!("/v1/tasks/{waiting}")).await.1["status"],
        "canceled"
    );
}

/// The broadcast outcomes of the two echo agents and the broken one, by instance.
fn assert_two_succeeded_one_failed(outcomes: &Value) {
    let mut outcomes: Vec<(&str, &str)> = outcomes
        .as_array()
        .unwrap()
        .iter()
        .map(|outcome| {
            (
                outcome["agent_id"].as_str().unwrap(),
                outcome["status"].as_str().unwrap(),
            )
        })
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [("broken-3", "failed"), ("echo-1", "succeeded"), ("echo-2", "succeeded")]
    );
}

/// GETs `path` as `caller`; returns (status, JSON answer).
async fn get_as(cluster: &Cluster, caller: &str, path: &str) -> (u16, Value) {
    let response = cluster
        .client
        .get(cluster.url(path))
        .bearer_auth(token(caller))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// POSTs nothing to `path` as `caller`; returns (status, JSON answer).
async fn post_as(cluster: &Cluster, caller: &str, path: &str) -> (u16, Value) {
    let response = cluster
        .client
        .post(cluster.url(path))
        .bearer_auth(token(caller))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Issue 21, point 7: operators list and inspect dead letters and replay
/// one, which sends its callback again from the first attempt; everyone
/// else, and every bad id or query, gets a stable code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_inspect_and_replay_dead_letters() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await; // five callback attempts within about 1.5 s
    let _echo = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;
    // Fails the five scheduled attempts, takes the replay.
    let (hook, calls) = flaky_receiver(5).await;
    let (_, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "payload": {"order_id": "SO-1"}, "callback": {"url": hook}}),
    )
    .await;
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    let listed = || async { get_as(&cluster, "ops", "/v1/dead-letters").await.1 };
    assert!(
        eventually(Duration::from_secs(15), || async { listed().await["total"] == 1 }).await,
        "no dead letter: {}",
        listed().await
    );
    let list = listed().await;
    let letter = &list["dead_letters"][0];
    assert_eq!(letter["task_id"], task_id.as_str());
    assert_eq!(letter["url"], hook.as_str());
    assert!(letter["error"].as_str().unwrap().contains("503"), "{letter}");
    assert!(letter["parked_at"].as_u64().is_some());
    let id = letter["id"].as_str().unwrap().to_string();
    assert_eq!(list["next_after"], id.as_str());
    let (_, rest) = get_as(&cluster, "ops", &format!("/v1/dead-letters?after={id}")).await;
    assert_eq!(rest["dead_letters"], json!([]), "paged after the last one");

    let (status, shown) = get_as(&cluster, "ops", &format!("/v1/dead-letters/{id}")).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        shown["result"]["status"], "succeeded",
        "the dead letter holds the result"
    );

    // Only operators; unknown or malformed ids and bad queries have their codes.
    for (caller, path, expected) in [
        (CALLER, "/v1/dead-letters".to_string(), (403, "FORBIDDEN")),
        (CALLER, format!("/v1/dead-letters/{id}"), (403, "FORBIDDEN")),
        (
            "ops",
            "/v1/dead-letters/1-0".to_string(),
            (404, "DEAD_LETTER_NOT_FOUND"),
        ),
        (
            "ops",
            "/v1/dead-letters/nonsense".to_string(),
            (404, "DEAD_LETTER_NOT_FOUND"),
        ),
        ("ops", "/v1/dead-letters?after=x".to_string(), (400, "INVALID_QUERY")),
        ("ops", "/v1/dead-letters?limit=x".to_string(), (400, "INVALID_QUERY")),
        ("ops", "/v1/dead-letters?colour=red".to_string(), (400, "INVALID_QUERY")),
    ] {
        let (status, body) = get_as(&cluster, caller, &path).await;
        assert_eq!(
            (status, body["error"]["code"].as_str().unwrap_or("")),
            expected,
            "{path}: {body}"
        );
    }
    let (status, body) = post_as(&cluster, CALLER, &format!("/v1/dead-letters/{id}/replay")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{body}"
    );

    // The replay: delivered (the receiver takes the sixth call), the dead letter gone.
    let (status, replayed) = post_as(&cluster, "ops", &format!("/v1/dead-letters/{id}/replay")).await;
    assert_eq!(status, 200, "{replayed}");
    assert_eq!(replayed["task_id"], task_id.as_str());
    assert!(eventually(Duration::from_secs(10), || async { calls.lock().unwrap().len() == 6 }).await);
    assert_eq!(listed().await["total"], 0);
    let (status, body) = post_as(&cluster, "ops", &format!("/v1/dead-letters/{id}/replay")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("DEAD_LETTER_NOT_FOUND")),
        "replayed once: {body}"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            cluster.metrics().await.contains("agent_reach_tasks_dead_letters 0")
        })
        .await
    );
    assert_eq!(calls.lock().unwrap().len(), 6, "sent once after the replay");
}
