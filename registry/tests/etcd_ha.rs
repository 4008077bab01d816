//! The registry on a real 3-member etcd cluster (issue 23, point 5): it uses
//! every member, and neither the loss of one member nor of the leader
//! (SIGKILL) while 50 agents heartbeat over HTTP loses a registration or
//! keeps new registrations out.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_registry::StoreChoice;
use agent_reach_testkit::EtcdCluster;
use serde_json::json;
use support::{registration, wait_for, TestRegistry};

const AGENTS: usize = 50;
const TTL_S: u32 = 4;

#[derive(Default)]
struct Outcomes {
    ok: AtomicUsize,
    /// 503 or no answer: the registry could not reach etcd in time.
    failed: AtomicUsize,
    /// 404 LEASE_EXPIRED: the registration is gone (what must never happen).
    lost: AtomicUsize,
}

fn order_token() -> String {
    TestRegistry::token("order_query")
}

/// One agent: heartbeats every TTL/3, again after 200 ms when one fails, as
/// the SDK does.
fn agent(
    base: String,
    agent_id: String,
    lease_id: i64,
    outcomes: Arc<Outcomes>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(8))
            .build()
            .unwrap();
        let every = Duration::from_millis(u64::from(TTL_S) * 1000 / 3);
        while !stop.load(Ordering::SeqCst) {
            let answer = client
                .put(format!("{base}/v1/agents/{agent_id}/heartbeat"))
                .bearer_auth(order_token())
                .json(&json!({"lease_id": lease_id}))
                .send()
                .await;
            let pause = match answer.map(|answer| answer.status().as_u16()) {
                Ok(200) => {
                    outcomes.ok.fetch_add(1, Ordering::SeqCst);
                    every
                }
                Ok(404) => {
                    outcomes.lost.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                _ => {
                    outcomes.failed.fetch_add(1, Ordering::SeqCst);
                    Duration::from_millis(200)
                }
            };
            tokio::time::sleep(pause).await;
        }
    })
}

/// Registers `agent_id` until it is accepted; returns its lease and how long that took.
async fn register_until_accepted(registry: &TestRegistry, agent_id: &str) -> (i64, Duration) {
    let started = Instant::now();
    loop {
        let (status, body) = registry
            .post("/v1/agents", Some(&order_token()), &registration(agent_id, TTL_S))
            .await;
        if status == 201 {
            return (body["lease_id"].as_i64().unwrap(), started.elapsed());
        }
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "STORE_UNAVAILABLE", "{body}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no registration accepted for 15 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks for 3 TTLs that all `expected` instances stay resolvable.
async fn hold(registry: &TestRegistry, expected: usize, outcomes: &Outcomes, phase: &str) {
    let until = Instant::now() + Duration::from_secs(u64::from(TTL_S) * 3);
    while Instant::now() < until {
        let resolved = registry.resolved("order.query").await.len();
        assert_eq!(resolved, expected, "{phase}: instances resolvable");
        assert_eq!(
            outcomes.lost.load(Ordering::SeqCst),
            0,
            "{phase}: a heartbeat found its registration gone"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_member_and_the_leader_loses_no_registration() {
    let mut cluster = EtcdCluster::start();
    let registry = TestRegistry::start(StoreChoice::Etcd(cluster.endpoints())).await;
    let outcomes = Arc::new(Outcomes::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut agents = Vec::new();
    for index in 0..AGENTS {
        let agent_id = format!("oq-{index}");
        let (status, body) = registry
            .post("/v1/agents", Some(&order_token()), &registration(&agent_id, TTL_S))
            .await;
        assert_eq!(status, 201, "{body}");
        let lease = body["lease_id"].as_i64().unwrap();
        agents.push(agent(registry.url(""), agent_id, lease, outcomes.clone(), stop.clone()));
    }
    assert!(
        wait_for(Duration::from_secs(10), || async {
            outcomes.ok.load(Ordering::SeqCst) >= AGENTS
        })
        .await,
        "heartbeats never got going"
    );

    // The registry starts on member 0: lose it first when it is a follower,
    // so that one of the two kills is the member the registry talks to.
    let leader = cluster.leader().expect("the cluster has a leader");
    let follower = if leader == 0 { 1 } else { 0 };
    cluster.kill(follower);
    let (lease, took) = register_until_accepted(&registry, "oq-after-follower").await;
    agents.push(agent(
        registry.url(""),
        "oq-after-follower".into(),
        lease,
        outcomes.clone(),
        stop.clone(),
    ));
    hold(&registry, AGENTS + 1, &outcomes, "member lost").await;
    let after_follower = (
        outcomes.ok.load(Ordering::SeqCst),
        outcomes.failed.load(Ordering::SeqCst),
    );
    eprintln!("follower {follower} killed: a new registration took {took:?}; heartbeats ok/failed {after_follower:?}");
    cluster.restart(follower);

    let leader = cluster.leader().expect("the cluster has a leader again");
    cluster.kill(leader);
    let (lease, took) = register_until_accepted(&registry, "oq-after-leader").await;
    agents.push(agent(
        registry.url(""),
        "oq-after-leader".into(),
        lease,
        outcomes.clone(),
        stop.clone(),
    ));
    hold(&registry, AGENTS + 2, &outcomes, "leader lost").await;
    stop.store(true, Ordering::SeqCst);
    for agent in agents {
        agent.await.unwrap();
    }
    let ok = outcomes.ok.load(Ordering::SeqCst);
    let failed = outcomes.failed.load(Ordering::SeqCst);
    eprintln!("leader {leader} killed: a new registration took {took:?}; heartbeats ok {ok}, failed {failed}, lost 0");
    assert_eq!(outcomes.lost.load(Ordering::SeqCst), 0);
}
