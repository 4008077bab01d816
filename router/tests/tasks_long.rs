//! Long work through the slow path (issue 21, point 3): a delivery keeps its
//! claim while it runs, so a task far longer than the reclaim window runs
//! once; agents may answer `202 Accepted` and report later with `POST
//! /v1/tasks/{id}/result`, once, as themselves, within the task's deadline.
//! Real Redis, etcd, registry, routers and HTTP agents (router test support).

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{agent_name, eventually, get, post, token, AgentSpec, Behaviour, Cluster, CALLBACK_SECRET, CALLER};

fn tasks_settings(redis: &str, reclaim_after: Duration) -> agent_reach_router::TasksSettings {
    let mut callbacks = agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec());
    callbacks.allow_private_targets = true;
    agent_reach_router::TasksSettings {
        redis: redis.to_string(),
        store: agent_reach_task_store::StoreConfig::default(),
        callbacks,
        workers: 8,
        reclaim_after,
        max_task_attempts: 3,
        quota_share: Some(std::time::Duration::from_millis(100)),
        trail: None,
        tag_limits: Vec::new(),
    }
}

async fn cluster(redis: &agent_reach_testkit::Redis, reclaim_after: Duration) -> Cluster {
    let url = redis.url();
    Cluster::start_with(move |settings| settings.tasks = Some(tasks_settings(&url, reclaim_after))).await
}

/// A second router with the slow path on its own runtime (killable outright).
fn router(cluster: &Cluster, redis: &str, reclaim_after: Duration) -> (support::Process, String) {
    let mut settings = agent_reach_router::Settings::new(
        "127.0.0.1:0".parse().unwrap(),
        cluster.registry.url(),
        agent_reach_access::AuthConfig::Hs256SecretFile(cluster.secret_path.clone()),
        cluster.acl_path.clone(),
    );
    settings.tasks = Some(tasks_settings(redis, reclaim_after));
    support::Process::spawn(move || async move {
        let router = agent_reach_router::build(&settings).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(agent_reach_router::serve(listener, router, std::future::pending()));
        url
    })
}

async fn task(base: &str, task_id: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{base}/v1/tasks/{task_id}"))
        .bearer_auth(token(CALLER))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn wait_terminal(base: &str, task_id: &str, within: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let task = task(base, task_id).await;
        if matches!(task["status"].as_str(), Some("succeeded" | "failed" | "canceled")) {
            return task;
        }
        assert!(tokio::time::Instant::now() < deadline, "task never ended: {task}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn states(task: &Value) -> Vec<String> {
    task["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|transition| transition["status"].as_str().unwrap().to_string())
        .collect()
}

/// POSTs a raw report body to `base` as `as_agent` (none: no token).
async fn report(base: &str, task_id: &str, as_agent: Option<&str>, body: &str) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/tasks/{task_id}/result"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(name) = as_agent {
        request = request.bearer_auth(token(name));
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// Issue 21's failure: a task three times longer than the reclaim window,
/// with two routers claiming from the same queues, is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_three_times_the_reclaim_window_is_delivered_once() {
    let redis = agent_reach_testkit::Redis::start();
    let window = Duration::from_millis(400);
    let cluster = cluster(&redis, window).await;
    let (_second, second_url) = router(&cluster, &redis.url(), window);
    let agent = cluster.agent(AgentSpec::new("slow-1", 1, Behaviour::Slow(window * 4)));
    cluster.wait_for_instances(&["slow-1"]).await;

    let (status, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "request_id": "long-1", "payload": {"order_id": "SO-1"}}),
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    let task_id = submitted["task_id"].as_str().unwrap();
    let done = wait_terminal(&second_url, task_id, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        states(&done),
        ["pending", "running", "succeeded"],
        "never retried or reclaimed"
    );
    assert_eq!(agent.hits(), 1, "delivered exactly once");
    assert_eq!(done["attempts"], 1);
}

/// The 202 flow end to end, and every bad report with its stable code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_answers_202_and_reports_once() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster(&redis, Duration::from_secs(30)).await;
    let agent = cluster.agent(AgentSpec::new("later-1", 1, Behaviour::Accept));
    cluster.wait_for_instances(&["later-1"]).await;
    let base = cluster.url("");
    let me = agent_name("later-1");

    let (_, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({"capability": "order.query", "session_id": "s-202", "payload": {"order_id": "SO-1"}}),
    )
    .await;
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    assert!(eventually(Duration::from_secs(10), || async { agent.hits() == 1 }).await);
    let envelope = agent.seen.last_envelope.lock().unwrap().clone().unwrap();
    assert_eq!(envelope["task_id"], task_id, "the delivery carries the task id");
    // The agent released the connection with its 202; the task waits for the report.
    let (_, running) = get(&cluster, &format!("/v1/tasks/{task_id}")).await;
    assert_eq!(running["status"], "running", "{running}");

    // Bad reports, each refused with its stable code and nothing recorded.
    let good = r#"{"output": {"order_id": "SO-1", "shipped": true}}"#;
    let (status, body) = report(&base, &task_id, None, good).await;
    assert_eq!((status, code(&body)), (401, "UNAUTHENTICATED"), "{body}");
    let (status, body) = report(&base, &task_id, Some("intruder"), good).await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "not_the_delivery_agent");
    let (status, body) = report(&base, "t_000000000000000000000000", Some(&me), good).await;
    assert_eq!((status, code(&body)), (404, "TASK_NOT_FOUND"), "{body}");
    for malformed in [
        "not json",
        "[]",
        "{}",
        r#"{"output": 1, "error": {"code": "E"}}"#,
        r#"{"result": 1}"#,
        r#"{"error": {"message": "no code"}}"#,
    ] {
        let (status, body) = report(&base, &task_id, Some(&me), malformed).await;
        assert_eq!(
            (status, code(&body)),
            (400, "INVALID_TASK_RESULT"),
            "{malformed}: {body}"
        );
    }
    let (_, still) = get(&cluster, &format!("/v1/tasks/{task_id}")).await;
    assert_eq!(still["status"], "running", "bad reports change nothing: {still}");

    // The report: accepted once; the same again is a harmless repeat; another is a conflict.
    let (status, body) = report(&base, &task_id, Some(&me), good).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["status"].as_str(), body["duplicate"].as_bool()),
        (Some("succeeded"), Some(false))
    );
    let (status, body) = report(&base, &task_id, Some(&me), good).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duplicate"], true);
    let (status, body) = report(&base, &task_id, Some(&me), r#"{"output": {"shipped": false}}"#).await;
    assert_eq!((status, code(&body)), (409, "TASK_CONFLICT"), "{body}");
    assert_eq!(body["error"]["details"]["reason"], "result_conflict");

    let done = wait_terminal(&base, &task_id, Duration::from_secs(5)).await;
    assert_eq!(states(&done), ["pending", "running", "succeeded"]);
    assert_eq!(done["result"]["status"], "succeeded");
    assert_eq!(done["result"]["agent_id"], "later-1");
    assert_eq!(done["result"]["output"], json!({"order_id": "SO-1", "shipped": true}));
    let (_, results) = get(&cluster, "/v1/sessions/s-202/results").await;
    assert_eq!(
        results["results"][0]["task_id"], task_id,
        "reported results reach the session"
    );
    assert_eq!(agent.hits(), 1, "delivered once");

    // An error report fails the task as the agent's own error.
    let (_, submitted) = post(&cluster, "/v1/tasks", support::order("SO-2")).await;
    let failing = submitted["task_id"].as_str().unwrap().to_string();
    assert!(eventually(Duration::from_secs(10), || async { agent.hits() == 2 }).await);
    let (status, body) = report(
        &base,
        &failing,
        Some(&me),
        r#"{"error": {"code": "ORDER_NOT_FOUND", "message": "no such order"}}"#,
    )
    .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("failed")), "{body}");
    let failed = wait_terminal(&base, &failing, Duration::from_secs(5)).await;
    assert_eq!(failed["result"]["error"]["code"], "AGENT_ERROR");
    assert_eq!(failed["result"]["error"]["details"]["agent_code"], "ORDER_NOT_FOUND");

    // Once ended, a different report is a conflict.
    let (status, body) = report(&base, &failing, Some(&me), good).await;
    assert_eq!((status, code(&body)), (409, "TASK_CONFLICT"), "{body}");

    // A 202 to a synchronous call is the agent's mistake: nothing could report it.
    let (status, body) = cluster.invoke(support::order("SO-3")).await;
    assert_eq!((status, code(&body)), (502, "AGENT_ERROR"), "{body}");
    assert_eq!(body["error"]["details"]["agent_status"], 202);
}

/// The deadline still bounds an accepted task: no report by then fails it
/// with `DEADLINE_EXCEEDED` (reason `result_not_reported`), even when the
/// router that delivered it died meanwhile and another took it over,
/// without delivering it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreported_task_fails_at_its_deadline_even_after_its_router_died() {
    let redis = agent_reach_testkit::Redis::start();
    let window = Duration::from_millis(400);
    let cluster = Cluster::start().await; // its router has no slow path
    let agent = cluster.agent(AgentSpec::new("later-1", 1, Behaviour::Accept));
    cluster.wait_for_instances(&["later-1"]).await;
    let (mut first, first_url) = router(&cluster, &redis.url(), window);

    let response = reqwest::Client::new()
        .post(format!("{first_url}/v1/tasks"))
        .bearer_auth(token(CALLER))
        .json(&json!({"capability": "order.query", "timeout_ms": 3000, "payload": {"order_id": "SO-1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let task_id = response.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(eventually(Duration::from_secs(10), || async { agent.hits() == 1 }).await);
    let store =
        agent_reach_task_store::TaskStore::new(&redis.url(), &agent_reach_task_store::StoreConfig::default()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            store.get(&task_id).await.is_ok_and(|task| task.accepted.is_some())
        })
        .await,
        "the 202 was never recorded"
    );
    first.kill();

    let (_second, second_url) = router(&cluster, &redis.url(), window);
    let done = wait_terminal(&second_url, &task_id, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "DEADLINE_EXCEEDED", "{done}");
    assert_eq!(done["result"]["error"]["details"]["reason"], "result_not_reported");
    assert_eq!(done["result"]["agent_id"], "later-1");
    assert_eq!(agent.hits(), 1, "taken over, not delivered again");
    // Too late now: the deadline decided.
    let (status, body) = report(&second_url, &task_id, Some(&agent_name("later-1")), r#"{"output": {}}"#).await;
    assert_eq!((status, code(&body)), (409, "TASK_CONFLICT"), "{body}");
}
