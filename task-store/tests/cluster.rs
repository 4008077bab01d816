//! The task store on a real Redis Cluster (three primaries, three replicas)
//! while it changes under load (issue 35): a shard's primary killed -9 and
//! its replica promoted, then a slot migrated to another primary key by key.
//! Submissions and the workers' deliveries run throughout; every task the
//! store acknowledged is afterwards stored, delivered and ended exactly once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach_stores::slot::{key_slot, spread_tag};
use agent_reach_stores::Wait;
use agent_reach_task_store::store::{lane_of, LANES};
use agent_reach_task_store::{NewTask, Priority, State, StoreConfig, Submitted, TaskStore, TaskStoreError};
use agent_reach_testkit::RedisCluster;

/// One cluster at a time: two six-node clusters under load at once on a
/// two-core machine let a replica's sync or a failover outrun the tests'
/// bounds.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
use serde_json::json;

fn task(capability: &str, request_id: &str) -> NewTask {
    NewTask {
        request_id: request_id.to_string(),
        session_id: Some(format!("session-{}", request_id.len() % 3)),
        caller: "tester".to_string(),
        capability: capability.to_string(),
        priority: Priority::Normal,
        envelope: json!({"capability": capability, "request_id": request_id, "payload": {}}),
        ..NewTask::default()
    }
}

/// The slot of a lane (every key of the lane is in it).
fn lane_slot(lane: usize) -> u16 {
    key_slot(spread_tag("q", lane, LANES).as_bytes())
}

/// Polls `condition` every 20 ms (without blocking the runtime) until it
/// holds or `timeout` passes.
async fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    acknowledged: Mutex<Vec<String>>,
    ended: Mutex<Vec<String>>,
    refused: AtomicUsize,
    errors: Mutex<Vec<String>>,
}

/// Submits to `capabilities` in turn, `in_flight` at once, until `stop`.
fn submit_load(
    store: Arc<TaskStore>,
    capabilities: Vec<String>,
    in_flight: usize,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    prefix: &'static str,
) -> Vec<tokio::task::JoinHandle<()>> {
    let next = Arc::new(AtomicUsize::new(0));
    (0..in_flight)
        .map(|_| {
            let (store, capabilities, stop, tally, next) = (
                store.clone(),
                capabilities.clone(),
                stop.clone(),
                tally.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let index = next.fetch_add(1, Ordering::AcqRel);
                    let capability = &capabilities[index % capabilities.len()];
                    match store.submit(task(capability, &format!("{prefix}-{index}"))).await {
                        Ok(Submitted::Created(id)) => tally.acknowledged.lock().unwrap().push(id),
                        Ok(Submitted::Existing(id)) => tally
                            .errors
                            .lock()
                            .unwrap()
                            .push(format!("new request {index} answered existing {id}")),
                        Err(TaskStoreError::Unavailable(why)) => {
                            tally.refused.fetch_add(1, Ordering::AcqRel);
                            if why.contains("CROSSSLOT") {
                                tally.errors.lock().unwrap().push(why);
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(other) => tally.errors.lock().unwrap().push(other.to_string()),
                    }
                }
            })
        })
        .collect()
}

/// A worker: claims, runs and ends tasks until `stop`, as a router's would
/// (what it fails to end stays pending, for the final reclaim).
fn work_load(store: Arc<TaskStore>, stop: Arc<AtomicBool>, tally: Arc<Tally>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut round = 0;
        while !stop.load(Ordering::Acquire) {
            round += 1;
            let claimed = match store.claim("worker-under-load", 16, round).await {
                Ok(claimed) => claimed,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            if claimed.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            for taken in claimed {
                if store.transition(&taken.task.task_id, State::Running).await.is_err() {
                    continue;
                }
                let result = json!({"status": "succeeded", "output": {"id": taken.task.task_id}});
                if store.finish(&taken, State::Succeeded, &result).await.is_ok() {
                    tally.ended.lock().unwrap().push(taken.task.task_id.clone());
                }
            }
        }
    })
}

/// After the load: every acknowledged task is stored, and claiming (and
/// reclaiming what a failed finish left) delivers each of them; none ends twice.
async fn every_acknowledged_task_is_stored_and_delivered(store: &TaskStore, tally: &Tally) {
    let acknowledged: BTreeSet<String> = tally.acknowledged.lock().unwrap().iter().cloned().collect();
    for id in &acknowledged {
        let found = store.get(id).await;
        assert!(found.is_ok(), "acknowledged task {id} lost: {found:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut taken = store.claim("worker-after", 64, 0).await.unwrap();
        // Reclaiming with no idle time takes what this claim just took as well: once each.
        for reclaimed in store.reclaim("worker-after", Duration::ZERO, 64).await.unwrap() {
            if !taken
                .iter()
                .any(|claimed| claimed.task.task_id == reclaimed.task.task_id)
            {
                taken.push(reclaimed);
            }
        }
        for claimed in &taken {
            let _ = store.transition(&claimed.task.task_id, State::Running).await;
            let result = json!({"status": "succeeded"});
            if store.finish(claimed, State::Succeeded, &result).await.is_ok() {
                tally.ended.lock().unwrap().push(claimed.task.task_id.clone());
            }
        }
        let ended: BTreeSet<String> = tally.ended.lock().unwrap().iter().cloned().collect();
        if acknowledged.is_subset(&ended) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} acknowledged tasks never delivered",
            acknowledged.difference(&ended).count()
        );
        if taken.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let ended = tally.ended.lock().unwrap().clone();
    let distinct: BTreeSet<&String> = ended.iter().collect();
    assert_eq!(distinct.len(), ended.len(), "a task ended twice");
    for id in &acknowledged {
        assert_eq!(store.get(id).await.unwrap().state, State::Succeeded, "{id}");
    }
}

/// Capabilities of this tenant whose lanes are on at least two different
/// primaries, the first on `shard`'s: found by name.
fn capabilities_across(cluster: &RedisCluster, store: &TaskStore, shard: u16, count: usize) -> Vec<String> {
    let owner_of = |capability: &str| {
        let lane = lane_of(&store.task_id_for(capability));
        cluster.owner_of(lane_slot(lane))
    };
    let mut chosen: Vec<String> = Vec::new();
    let mut owners = BTreeSet::new();
    for index in 0.. {
        let capability = format!("load.cap{index}");
        let owner = owner_of(&capability);
        if chosen.is_empty() && owner != Some(shard) {
            continue;
        }
        owners.extend(owner);
        chosen.push(capability);
        if chosen.len() >= count && owners.len() >= 2 {
            break;
        }
    }
    chosen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_primary_killed_under_load_loses_no_accepted_task() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start();
    let config = StoreConfig {
        wait: Some(Wait {
            replicas: 1,
            timeout: Duration::from_millis(500),
        }),
        ..StoreConfig::default()
    };
    let store = Arc::new(TaskStore::new(&cluster.url(), &config).unwrap());
    store.prepare().await.unwrap();
    let victim = cluster.primaries()[0];
    let capabilities = capabilities_across(&cluster, &store, victim, 6);
    let victim_slot = lane_slot(lane_of(&store.task_id_for(&capabilities[0])));

    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let mut load = submit_load(
        store.clone(),
        capabilities.clone(),
        8,
        stop.clone(),
        tally.clone(),
        "kill",
    );
    load.push(work_load(store.clone(), stop.clone(), tally.clone()));
    let acknowledged = || tally.acknowledged.lock().unwrap().len();
    assert!(
        eventually(Duration::from_secs(20), || acknowledged() >= 200).await,
        "the load never got going"
    );

    // Kill the primary serving the first capability's lane; its replica is promoted.
    let before_kill = acknowledged();
    let killed_at = Instant::now();
    let (cluster, (killed, promoted)) = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let nodes = cluster.kill_primary_of(victim_slot);
        (cluster, nodes)
    })
    .await
    .unwrap();
    let promotion = killed_at.elapsed();
    assert_eq!(killed, victim);
    // The promoted primary has no replica: with WAIT 1 its shard acknowledges
    // nothing (answers 503) until the old primary is back as its replica.
    let during = acknowledged();
    let cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        cluster.restart(killed);
        cluster
    })
    .await
    .unwrap();
    assert_eq!(
        cluster.replica_of(promoted),
        Some(killed),
        "the old primary rejoined as a replica"
    );
    let restarted = acknowledged();
    assert!(
        eventually(Duration::from_secs(20), || acknowledged() >= restarted + 200).await,
        "submissions did not resume"
    );
    stop.store(true, Ordering::Release);
    for handle in load {
        handle.await.unwrap();
    }
    let errors = tally.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    eprintln!(
        "{} acknowledged ({before_kill} before the kill, {during} by the promotion {promotion:?} later, \
         {restarted} once the old primary was back), {} refused with 503 meanwhile",
        acknowledged(),
        tally.refused.load(Ordering::Acquire)
    );
    every_acknowledged_task_is_stored_and_delivered(&store, &tally).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_load_loses_no_task() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start();
    let store = Arc::new(TaskStore::new(&cluster.url(), &StoreConfig::default()).unwrap());
    store.prepare().await.unwrap();
    let primaries = cluster.primaries();
    let capabilities = capabilities_across(&cluster, &store, primaries[0], 6);
    let moving = lane_slot(lane_of(&store.task_id_for(&capabilities[0])));
    let target = primaries
        .iter()
        .copied()
        .find(|port| Some(*port) != cluster.owner_of(moving))
        .unwrap();
    // A lane with some weight to it, so the migration takes a while: its
    // keys move ten at a time while the load goes on.
    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    for index in 0..600 {
        if let Submitted::Created(id) = store
            .submit(task(&capabilities[0], &format!("before-{index}")))
            .await
            .unwrap()
        {
            tally.acknowledged.lock().unwrap().push(id);
        }
    }
    let mut load = submit_load(
        store.clone(),
        capabilities.clone(),
        8,
        stop.clone(),
        tally.clone(),
        "move",
    );
    load.push(work_load(store.clone(), stop.clone(), tally.clone()));
    let keys_before = cluster.keys_in_slot(moving);
    let started = Instant::now();
    let (cluster, moved) = tokio::task::spawn_blocking(move || {
        let moved = cluster.migrate_slot(moving, target, 10);
        (cluster, moved)
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert_eq!(cluster.owner_of(moving), Some(target));
    let after = tally.acknowledged.lock().unwrap().len();
    assert!(
        eventually(Duration::from_secs(20), || tally.acknowledged.lock().unwrap().len()
            >= after + 200)
        .await,
        "submissions did not go on after the migration"
    );
    stop.store(true, Ordering::Release);
    for handle in load {
        handle.await.unwrap();
    }
    let errors = tally.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    eprintln!(
        "slot {moving}: {moved} keys ({keys_before} before) moved to {target} in {took:?} under load; \
         {} acknowledged, {} refused",
        tally.acknowledged.lock().unwrap().len(),
        tally.refused.load(Ordering::Acquire)
    );
    every_acknowledged_task_is_stored_and_delivered(&store, &tally).await;
    drop(cluster);
}
