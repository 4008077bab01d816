//! What the task store's contract tests share: a store on one Redis server
//! or on a Redis Cluster, the keys they check, the tasks they submit.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach_task_store::callback::SIGNATURE_HEADER;
use agent_reach_task_store::{CallbackConfig, Deliverer, NewTask, Priority, StoreConfig, TaskStore};
use agent_reach_testkit::{Redis, RedisCluster};
use serde_json::json;

/// Where a test's store keeps its tasks; its servers live as long as it.
pub enum Backend {
    Single(Redis),
    Cluster(RedisCluster),
}

impl Backend {
    pub fn single() -> Self {
        Backend::Single(Redis::start())
    }

    pub fn cluster() -> Self {
        Backend::Cluster(RedisCluster::start())
    }

    /// A cluster is reached through a seed that does not answer and one
    /// node that does: any reachable node is enough, the rest is discovered.
    pub fn url(&self) -> String {
        match self {
            Backend::Single(redis) => redis.url(),
            Backend::Cluster(cluster) => format!(
                "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
                agent_reach_testkit::free_port(),
                cluster.ports()[2]
            ),
        }
    }

    pub fn store(&self) -> TaskStore {
        TaskStore::new(&self.url(), &StoreConfig::default()).unwrap()
    }

    /// A plain command on the node holding `key` (a cluster connection routes it).
    pub fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> T {
        match self {
            Backend::Single(redis) => {
                let mut connection = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
                command.query(&mut connection).unwrap()
            }
            Backend::Cluster(cluster) => {
                let seeds: Vec<String> = cluster
                    .ports()
                    .iter()
                    .map(|port| format!("redis://127.0.0.1:{port}"))
                    .collect();
                let mut connection = redis::cluster::ClusterClient::new(seeds)
                    .unwrap()
                    .get_connection()
                    .unwrap();
                command.query(&mut connection).unwrap()
            }
        }
    }
}

/// The key of a task's hash (DESIGN §3.10.9): in its lane, under the lane's tag.
pub fn task_key(task_id: &str) -> String {
    let lane = agent_reach_task_store::store::lane_of(task_id);
    let tag = agent_reach_stores::slot::spread_tag("q", lane, agent_reach_task_store::store::LANES);
    format!("agent-reach:default:task:{{{tag}}}:{task_id}")
}

pub fn task(request_id: &str, priority: Priority, session: Option<&str>) -> NewTask {
    NewTask {
        request_id: request_id.to_string(),
        session_id: session.map(str::to_string),
        caller: "tester".to_string(),
        capability: "demo.echo".to_string(),
        priority,
        envelope: json!({"capability": "demo.echo", "request_id": request_id, "payload": {"list": [], "map": {}}}),
        ..NewTask::default()
    }
}

/// What a callback receiver saw: when, the signature header, the body.
pub type Calls = Arc<Mutex<Vec<(Instant, String, Vec<u8>)>>>;

/// A callback receiver that fails its first `failures` calls.
pub async fn receiver(failures: usize) -> (String, Calls) {
    let seen: Calls = Arc::default();
    let calls = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let calls = calls.clone();
            async move {
                let signature = headers
                    .get(SIGNATURE_HEADER)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let mut calls = calls.lock().unwrap();
                calls.push((Instant::now(), signature, body.to_vec()));
                if calls.len() <= failures {
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
    (url, seen)
}

pub fn deliverer() -> Deliverer {
    let mut config = CallbackConfig::new(b"callback-secret".to_vec());
    // The receiver is on loopback.
    config.allow_private_targets = true;
    // The production schedule is 2, 4, 8, 16 s; the same doubling, scaled down.
    config.schedule = [200, 400, 800, 1600].map(Duration::from_millis).to_vec();
    Deliverer::new(config).unwrap()
}
