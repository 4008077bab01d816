//! The context store on a real Redis Cluster (three primaries, three
//! replicas) while it changes under load (issue 35): a shard's primary
//! killed -9 and its replica promoted (with `WAIT 1`), and a bucket's slot
//! migrated to another primary key by key. Writers patch their contexts
//! throughout; afterwards every context holds at least its last acknowledged
//! version and value: no acknowledged patch is lost.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach_context::model::{Fields, NewContext, Patch, Selection, StorePolicy, Tier};
use agent_reach_context::store::redis::bucket_of;
use agent_reach_context::store::{ContextStore, Namespace, RedisStore, StoreError};
use agent_reach_stores::slot::key_slot;
use agent_reach_stores::{RedisLink, Wait};
use agent_reach_testkit::RedisCluster;

/// One cluster at a time: two six-node clusters under load at once on a
/// two-core machine let a replica's sync or a failover outrun the tests'
/// bounds (seen once in a full run: a create's `WAIT 1` timed out, and a
/// failover took over 30 s).
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn store(cluster: &RedisCluster, wait: Option<Wait>) -> Arc<dyn ContextStore> {
    let namespace = Namespace {
        prefix: "test".into(),
        tenant: "cluster".into(),
    };
    let link = RedisLink::parse(&cluster.url()).unwrap().with_wait(wait);
    Arc::new(RedisStore::new(&link, &namespace, StorePolicy::default(), Duration::from_secs(1)).unwrap())
}

/// The slot a context's keys are in.
fn slot_of(id: &str) -> u16 {
    // Any key of the context's bucket: its deadline set.
    let namespace_key = format!("test:cluster:deadlines:{{{}}}", bucket_tag(bucket_of(id)));
    key_slot(namespace_key.as_bytes())
}

fn bucket_tag(bucket: usize) -> String {
    agent_reach_stores::slot::spread_tag("c", bucket, agent_reach_context::store::redis::BUCKETS)
}

fn counter(n: u64) -> Fields {
    let mut fields = Fields::new();
    fields.insert("n".to_string(), n.to_string());
    fields
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

/// Per context: the last patch acknowledged (its value and the version it made).
#[derive(Default)]
struct Acknowledged {
    last: Mutex<Vec<(u64, u64)>>,
    refused: Mutex<u64>,
    errors: Mutex<Vec<String>>,
}

impl Acknowledged {
    fn total(&self) -> u64 {
        self.last.lock().unwrap().iter().map(|(n, _)| n).sum()
    }
}

/// One writer per context, each setting `n` to 1, 2, 3 … without `if_version`
/// until `stop`; a refused patch (503) is tried again with the next value.
fn writers(
    store: &Arc<dyn ContextStore>,
    ids: &[String],
    stop: &Arc<AtomicBool>,
    seen: &Arc<Acknowledged>,
) -> Vec<tokio::task::JoinHandle<()>> {
    ids.iter()
        .enumerate()
        .map(|(index, id)| {
            let (store, id, stop, seen) = (store.clone(), id.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    n += 1;
                    let patch = Patch {
                        set: counter(n),
                        delete: vec![],
                        if_version: None,
                    };
                    match store.patch(&id, &patch).await {
                        Ok(written) => seen.last.lock().unwrap()[index] = (n, written.version),
                        Err(StoreError::Unavailable(_)) => {
                            *seen.refused.lock().unwrap() += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(other) => seen.errors.lock().unwrap().push(format!("{id}: {other}")),
                    }
                }
            })
        })
        .collect()
}

/// Every context holds at least what its last acknowledged patch wrote.
async fn nothing_acknowledged_is_lost(store: &Arc<dyn ContextStore>, ids: &[String], seen: &Acknowledged) {
    let last = seen.last.lock().unwrap().clone();
    for (id, (n, version)) in ids.iter().zip(last) {
        let snapshot = store.get(id, &Selection::All).await.unwrap();
        let Some(snapshot) = snapshot else {
            panic!("context {id} lost");
        };
        let held: u64 = snapshot.fields["n"].parse().unwrap();
        assert!(
            held >= n && snapshot.version >= version,
            "{id}: holds n={held} v{}, the last acknowledged patch wrote n={n} v{version}",
            snapshot.version
        );
    }
}

/// Creates every context before the load. A create whose `WAIT` fell short
/// (a replica still catching up on a loaded box) may or may not have landed,
/// as the error says: it is written again until acknowledged, and an id the
/// first write took counts as created (bounded: 20 s per id).
async fn create_all(store: &Arc<dyn ContextStore>, ids: &[String]) {
    for id in ids {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let created = store
                .create(
                    id,
                    &NewContext {
                        tier: Tier::Default,
                        owner: "writer".into(),
                        fields: counter(0),
                    },
                )
                .await;
            match created {
                Ok(_) | Err(StoreError::Exists) => break,
                Err(StoreError::Unavailable(why)) if Instant::now() < deadline => {
                    eprintln!("create {id}: {why}; writing again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("create {id}: {error}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_primary_killed_under_load_loses_no_acknowledged_patch() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    // Bounded: one run in three on 2026-12-06 hung here (every task parked,
    // a patch or read through the cluster client never answering after the
    // failover); a hang must fail the test, not the whole suite. The cause
    // is not found yet.
    tokio::time::timeout(Duration::from_secs(180), a_shard_primary_killed())
        .await
        .expect("the shard primary kill test did not finish within 180 s: a store call never answered");
}

async fn a_shard_primary_killed() {
    let cluster = RedisCluster::start();
    let wait = Wait {
        replicas: 1,
        timeout: Duration::from_millis(500),
    };
    let store = store(&cluster, Some(wait));
    let ids: Vec<String> = (0..24).map(|index| format!("ctx-{index}")).collect();
    let owners: BTreeSet<u16> = ids.iter().filter_map(|id| cluster.owner_of(slot_of(id))).collect();
    assert_eq!(owners.len(), 3, "the contexts spread over the three shards");
    create_all(&store, &ids).await;
    let victim_slot = slot_of(&ids[0]);

    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Acknowledged::default()));
    seen.last.lock().unwrap().resize(ids.len(), (0, 1));
    let load = writers(&store, &ids, &stop, &seen);
    assert!(eventually(Duration::from_secs(20), || seen.total() >= 2_000).await);

    let killed_at = Instant::now();
    let (cluster, (killed, promoted)) = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let nodes = cluster.kill_primary_of(victim_slot);
        (cluster, nodes)
    })
    .await
    .unwrap();
    let promotion = killed_at.elapsed();
    // The other shards kept acknowledging meanwhile; this one answers 503
    // under WAIT 1 until its old primary is back as the new one's replica.
    let cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        cluster.restart(killed);
        cluster
    })
    .await
    .unwrap();
    assert_eq!(cluster.replica_of(promoted), Some(killed));
    let resumed = seen.total();
    let victim_acknowledges = || seen.last.lock().unwrap()[0].0;
    let victim_before = victim_acknowledges();
    assert!(
        eventually(Duration::from_secs(20), || victim_acknowledges() > victim_before + 50).await,
        "the failed-over shard did not acknowledge again"
    );
    stop.store(true, Ordering::Release);
    for handle in load {
        handle.await.unwrap();
    }
    let errors = seen.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    eprintln!(
        "promotion {promotion:?} after the kill; {} patches acknowledged ({resumed} when the old primary \
         was back), {} refused with 503 meanwhile",
        seen.total(),
        seen.refused.lock().unwrap()
    );
    nothing_acknowledged_is_lost(&store, &ids, &seen).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_load_loses_no_patch_and_sweeps_on() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start();
    let store = store(&cluster, None);
    // Writers on contexts across the shards, a few of them in the bucket that moves.
    let moving_bucket = bucket_of("ctx-0");
    let moving = slot_of("ctx-0");
    let ids: Vec<String> = (0..24).map(|index| format!("ctx-{index}")).collect();
    // Weight in the moving bucket, so its keys take a while to move ten at a time.
    let ballast: Vec<String> = (0..)
        .map(|index| format!("ballast-{index}"))
        .filter(|id| bucket_of(id) == moving_bucket)
        .take(400)
        .collect();
    create_all(&store, &ids).await;
    create_all(&store, &ballast).await;
    let target = cluster
        .primaries()
        .into_iter()
        .find(|port| Some(*port) != cluster.owner_of(moving))
        .unwrap();

    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Acknowledged::default()));
    seen.last.lock().unwrap().resize(ids.len(), (0, 1));
    let load = writers(&store, &ids, &stop, &seen);
    assert!(eventually(Duration::from_secs(20), || seen.total() >= 1_000).await);
    let started = Instant::now();
    let (cluster, moved) = tokio::task::spawn_blocking(move || {
        let moved = cluster.migrate_slot(moving, target, 10);
        (cluster, moved)
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert_eq!(cluster.owner_of(moving), Some(target));
    let after = seen.last.lock().unwrap()[0].0;
    assert!(
        eventually(Duration::from_secs(20), || seen.last.lock().unwrap()[0].0 > after + 50).await,
        "the moved bucket's context is not written after the migration"
    );
    stop.store(true, Ordering::Release);
    for handle in load {
        handle.await.unwrap();
    }
    let errors = seen.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    eprintln!(
        "slot {moving}: {moved} keys moved to {target} in {took:?} under load; {} patches acknowledged, \
         {} refused",
        seen.total(),
        seen.refused.lock().unwrap()
    );
    nothing_acknowledged_is_lost(&store, &ids, &seen).await;
    // The moved bucket is read, counted and swept on its new primary like any other.
    for id in &ballast {
        assert!(store.get(id, &Selection::Only(vec![])).await.unwrap().is_some(), "{id}");
    }
    assert_eq!(store.live_contexts().await.unwrap(), (ids.len() + ballast.len()) as u64);
    assert_eq!(store.sweep().await.unwrap().idle, 0, "nothing idle yet");
    drop(cluster);
}
