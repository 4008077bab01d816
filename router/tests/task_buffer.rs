//! Redis unreachable on the slow path (issue 23, point 6): the router keeps
//! task submissions in its local buffer (fsynced), answers 202 as before,
//! and replays them in order when Redis is back; beyond the bound, 503
//! TASK_BUFFER_FULL. Against a real Redis, killed and started again.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{get, post, AgentSpec, Behaviour, Cluster};

async fn wait_status(cluster: &Cluster, task_id: &str, wanted: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, task) = get(cluster, &format!("/v1/tasks/{task_id}")).await;
        if task["status"] == wanted {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {task_id} never became {wanted}: {task}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The slow path on `url` with a local buffer of `limit` entries in `dir`
/// (and `WAIT` when given); four workers.
fn buffered_tasks(
    url: String,
    dir: std::path::PathBuf,
    limit: usize,
    wait: Option<agent_reach_stores::Wait>,
) -> agent_reach_router::TasksSettings {
    let mut tasks = support::tasks_settings(url);
    tasks.workers = 4;
    tasks.store.wait = wait;
    tasks.store.local_buffer = Some(agent_reach_task_store::LocalBuffer { dir, limit });
    tasks
}

fn envelope(request_id: &str) -> Value {
    json!({"capability": "order.query", "request_id": request_id, "payload": {"order_id": request_id}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_wait_in_the_local_buffer_while_redis_is_down() {
    let mut redis = agent_reach_testkit::Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let buffer_dir = dir.path().to_path_buf();
    let cluster = Cluster::start_with(move |settings| {
        settings.tasks = Some(buffered_tasks(url, buffer_dir, 3, None));
    })
    .await;
    let _agent = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;
    let (status, first) = post(&cluster, "/v1/tasks", envelope("before")).await;
    assert_eq!(status, 202, "{first}");
    wait_status(&cluster, first["task_id"].as_str().unwrap(), "succeeded").await;

    redis.kill();
    let mut ids = Vec::new();
    for request_id in ["during-1", "during-2", "during-3"] {
        let (status, body) = post(&cluster, "/v1/tasks", envelope(request_id)).await;
        assert_eq!((status, body["status"].as_str()), (202, Some("pending")), "{body}");
        ids.push(body["task_id"].as_str().unwrap().to_string());
    }
    // A buffered task answers as pending; the same request id finds it.
    let (status, view) = get(&cluster, &format!("/v1/tasks/{}", ids[0])).await;
    assert_eq!(
        (status, view["status"].as_str(), view["buffered"].as_bool()),
        (200, Some("pending"), Some(true)),
        "{view}"
    );
    let (status, again) = post(&cluster, "/v1/tasks", envelope("during-1")).await;
    assert_eq!(
        (status, again["task_id"].as_str()),
        (200, Some(ids[0].as_str())),
        "{again}"
    );
    // Beyond the bound: 503 with its stable code.
    let (status, full) = post(&cluster, "/v1/tasks", envelope("during-4")).await;
    assert_eq!(status, 503, "{full}");
    assert_eq!(full["error"]["code"], "TASK_BUFFER_FULL", "{full}");
    let metrics = cluster.metrics().await;
    assert!(metrics.contains("agent_reach_task_buffer_depth 3"), "{metrics}");
    assert!(
        metrics.contains("agent_reach_task_buffer_total{outcome=\"refused\"} 1"),
        "{metrics}"
    );

    // Redis is back (empty: no persistence in this test): every buffered
    // task is replayed under the id it was given, in order, and delivered.
    redis.restart();
    let mut created = Vec::new();
    for id in &ids {
        let task = wait_status(&cluster, id, "succeeded").await;
        created.push(task["created_at"].as_u64().unwrap_or_default());
    }
    assert!(
        created.windows(2).all(|pair| pair[0] <= pair[1]),
        "replayed out of order: {created:?}"
    );
    let metrics = cluster.metrics().await;
    assert!(metrics.contains("agent_reach_task_buffer_depth 0"), "{metrics}");
    assert!(
        metrics.contains("agent_reach_task_buffer_total{outcome=\"replayed\"} 3"),
        "{metrics}"
    );
}

/// Found by the chaos run (docs/chaos.md: `redis-outage` lost 200 of 793
/// accepted tasks, `redis-replica` is this case): a submission Redis stored
/// but no replica acknowledged in time (`WAIT`), or whose answer timed out, is
/// kept in the buffer, and must be kept under the id Redis may already hold it
/// by. Under a fresh id the replay found the request id taken (by the first
/// write) and dropped the buffered copy, so the caller's task id answered 404
/// for ever while the task ran under another id: accepted, then lost to its
/// caller. (The chaos run's frozen Redis reproduces the timed-out case; a test
/// this size did not, so this one pins the shared cause through WAIT.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_no_replica_acknowledged_keeps_its_task_id() {
    let mut redis = agent_reach_testkit::RedisSentinels::start();
    let [primary, replica] = redis.server_ports();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let buffer_dir = dir.path().to_path_buf();
    let wait = agent_reach_stores::Wait {
        replicas: 1,
        timeout: Duration::from_millis(200),
    };
    let cluster = Cluster::start_with(move |settings| {
        settings.tasks = Some(buffered_tasks(url, buffer_dir, 10, Some(wait)));
    })
    .await;
    let _agent = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;

    // The replica is gone: the primary stores the submission, WAIT 1 falls short.
    redis.kill_server(replica);
    let (status, body) = post(&cluster, "/v1/tasks", envelope("unacknowledged")).await;
    assert_eq!((status, body["status"].as_str()), (202, Some("pending")), "{body}");
    let task_id = body["task_id"].as_str().unwrap().to_string();

    // The replica is back: the replay finds the stored task under the same id,
    // and the caller's id reaches the outcome.
    redis.restart_server_as_replica(replica, primary);
    let task = wait_status(&cluster, &task_id, "succeeded").await;
    assert_eq!(task["task_id"], task_id.as_str(), "{task}");
    // Submitted again with the same request id: the same task, not a second one.
    let (status, again) = post(&cluster, "/v1/tasks", envelope("unacknowledged")).await;
    assert_eq!(
        (status, again["task_id"].as_str()),
        (200, Some(task_id.as_str())),
        "{again}"
    );
}

/// A request submitted again while Redis is unreachable is buffered under a
/// new id (the router cannot see that Redis holds it already); on replay
/// the request is found under its first id, and the new id becomes an alias
/// of it, so neither id the caller was given answers 404 (found by the chaos
/// run, docs/chaos.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_resubmitted_during_an_outage_leads_to_its_first_task() {
    let redis = agent_reach_testkit::Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let buffer_dir = dir.path().to_path_buf();
    let cluster = Cluster::start_with(move |settings| {
        settings.tasks = Some(buffered_tasks(url, buffer_dir, 10, None));
    })
    .await;
    let _agent = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;
    let (status, first) = post(&cluster, "/v1/tasks", envelope("twice")).await;
    assert_eq!(status, 202, "{first}");
    let first_id = first["task_id"].as_str().unwrap().to_string();
    wait_status(&cluster, &first_id, "succeeded").await;

    // Redis stops answering (its data kept): the same request goes to the buffer.
    redis.freeze();
    let (status, again) = post(&cluster, "/v1/tasks", envelope("twice")).await;
    assert_eq!((status, again["status"].as_str()), (202, Some("pending")), "{again}");
    let second_id = again["task_id"].as_str().unwrap().to_string();
    assert_ne!(second_id, first_id, "the router could not know the first id");
    redis.thaw();

    // Replayed: the second id leads to the first task, which ran once.
    let task = wait_status(&cluster, &second_id, "succeeded").await;
    assert_eq!(task["task_id"], first_id.as_str(), "{task}");
    let (status, same) = get(&cluster, &format!("/v1/tasks/{first_id}")).await;
    assert_eq!((status, same["status"].as_str()), (200, Some("succeeded")), "{same}");
}
