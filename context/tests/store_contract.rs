//! One contract for every context store (acceptance point 7): the embedded
//! store must behave like the Redis store for versions, limits, atomicity,
//! tiers, idle sweeping and ownership. Each test runs against a real Redis
//! (spawned by testkit), a real Redis Cluster of three primaries and three
//! replicas (the same key layout), and the embedded store.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach_context::model::{CloseAs, Fields, NewContext, Patch, Selection, Snapshot, StorePolicy, Tier};
use agent_reach_context::store::{ContextStore, MemoryStore, Namespace, RedisStore, StoreError};
use agent_reach_stores::RedisLink;
use agent_reach_testkit::{eventually, Redis, RedisCluster};

/// A store under test, keeping its backing processes (a `Redis`, a
/// `RedisCluster`, or nothing) alive until the test ends.
struct Subject {
    store: Arc<dyn ContextStore>,
    _servers: Box<dyn std::any::Any>,
}

fn redis_store(url: &str, policy: StorePolicy) -> Arc<dyn ContextStore> {
    let namespace = Namespace {
        prefix: "test".into(),
        tenant: "contract".into(),
    };
    Arc::new(
        RedisStore::new(
            &RedisLink::parse(url).unwrap(),
            &namespace,
            policy,
            Duration::from_secs(2),
        )
        .unwrap(),
    )
}

fn redis(policy: StorePolicy) -> Subject {
    let redis = Redis::start();
    Subject {
        store: redis_store(&redis.url(), policy),
        _servers: Box::new(redis),
    }
}

/// The cluster reached through a seed that does not answer and one node
/// that does: any reachable node is enough, the rest is discovered.
fn cluster(policy: StorePolicy) -> Subject {
    let cluster = RedisCluster::start();
    let url = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
        agent_reach_testkit::free_port(),
        cluster.ports()[1]
    );
    Subject {
        store: redis_store(&url, policy),
        _servers: Box::new(cluster),
    }
}

fn memory(policy: StorePolicy) -> Subject {
    Subject {
        store: Arc::new(MemoryStore::new(policy)),
        _servers: Box::new(()),
    }
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn new_context(tier: Tier, pairs: &[(&str, &str)]) -> NewContext {
    NewContext {
        tier,
        owner: "writer".into(),
        fields: fields(pairs),
    }
}

fn set(pairs: &[(&str, &str)], if_version: Option<u64>) -> Patch {
    Patch {
        set: fields(pairs),
        delete: vec![],
        if_version,
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Same content, and an expiry that did not move (reads compute it to the ms).
fn assert_unchanged(after: &Snapshot, before: &Snapshot) {
    assert_eq!(
        (after.version, after.tier, &after.owner, &after.fields),
        (before.version, before.tier, &before.owner, &before.fields)
    );
    let drift = after.expires_at_ms - before.expires_at_ms;
    assert!(drift.abs() < 50, "expiry moved by {drift} ms");
}

async fn exists(store: &dyn ContextStore, id: &str) -> bool {
    store.get(id, &Selection::Only(vec![])).await.unwrap().is_some()
}

// === The contract ===

async fn create_and_read(subject: Subject) {
    let store = subject.store;
    let before = now_ms();
    let written = store
        .create(
            "c1",
            &new_context(Tier::Default, &[("user_id", "\"u1\""), ("intent", "{\"k\":1}")]),
        )
        .await
        .unwrap();
    assert_eq!(written.version, 1);
    let ttl = StorePolicy::default().default_ttl.as_millis() as i64;
    assert!(written.expires_at_ms >= before + ttl - 2_000 && written.expires_at_ms <= now_ms() + ttl + 2_000);

    let all = store.get("c1", &Selection::All).await.unwrap().unwrap();
    assert_eq!(all.version, 1);
    assert_eq!(all.tier, Tier::Default);
    assert_eq!(all.owner, "writer");
    assert_eq!(all.fields, fields(&[("user_id", "\"u1\""), ("intent", "{\"k\":1}")]));

    let some = store
        .get("c1", &Selection::Only(vec!["intent".into(), "missing".into()]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(some.fields, fields(&[("intent", "{\"k\":1}")]));
    let meta = store.get("c1", &Selection::Only(vec![])).await.unwrap().unwrap();
    assert!(meta.fields.is_empty());
    assert_eq!(meta.version, 1);

    assert_eq!(
        store.create("c1", &new_context(Tier::OneShot, &[])).await,
        Err(StoreError::Exists)
    );
    assert_eq!(
        store.get("c1", &Selection::All).await.unwrap().unwrap().fields,
        all.fields
    );
    assert_eq!(store.get("nope", &Selection::All).await.unwrap(), None);
}

async fn patches_are_versioned(subject: Subject) {
    let store = subject.store;
    store
        .create("p", &new_context(Tier::Default, &[("a", "1"), ("b", "2")]))
        .await
        .unwrap();
    let written = store
        .patch(
            "p",
            &Patch {
                set: fields(&[("a", "10"), ("c", "3")]),
                delete: vec!["b".into(), "never_there".into()],
                if_version: Some(1),
            },
        )
        .await
        .unwrap();
    assert_eq!(written.version, 2);
    let snapshot = store.get("p", &Selection::All).await.unwrap().unwrap();
    assert_eq!(snapshot.fields, fields(&[("a", "10"), ("c", "3")]));
    assert_eq!(snapshot.version, 2);

    // A stale version changes nothing and reports the current one.
    assert_eq!(
        store.patch("p", &set(&[("a", "99"), ("d", "4")], Some(1))).await,
        Err(StoreError::VersionConflict { current: 2 })
    );
    assert_unchanged(&store.get("p", &Selection::All).await.unwrap().unwrap(), &snapshot);
    // The same for a one-field patch (a script of its own in Redis).
    assert_eq!(
        store.patch("p", &set(&[("a", "99")], Some(1))).await,
        Err(StoreError::VersionConflict { current: 2 })
    );
    assert_unchanged(&store.get("p", &Selection::All).await.unwrap().unwrap(), &snapshot);
    // Unconditional patches always apply.
    assert_eq!(store.patch("p", &set(&[("a", "5")], None)).await.unwrap().version, 3);
    // One field set and one deleted in the same patch.
    let mixed = Patch {
        set: fields(&[("a", "6")]),
        delete: vec!["c".into()],
        if_version: Some(3),
    };
    assert_eq!(store.patch("p", &mixed).await.unwrap().version, 4);
    let snapshot = store.get("p", &Selection::All).await.unwrap().unwrap();
    assert_eq!(snapshot.fields, fields(&[("a", "6")]));
    assert_eq!(
        store.patch("missing", &set(&[("a", "1")], None)).await,
        Err(StoreError::NotFound)
    );
}

/// Writes close together share one TTL refresh (`StorePolicy::refresh_granularity`:
/// a hundredth of the tier's TTL, at most 1 s; both sides of that rule are
/// checked); a later write moves the expiry again.
async fn writes_refresh_the_ttl_within_the_granularity(subject: Subject) {
    let store = subject.store;
    let policy = fifty_second_one_shot();
    for (id, tier, expected) in [("r", Tier::Default, 1_000), ("s", Tier::OneShot, 500)] {
        let ttl = policy.ttl(tier).as_millis() as i64;
        let granularity = policy.refresh_granularity(tier).as_millis() as i64;
        assert_eq!(granularity, expected);
        let created = store.create(id, &new_context(tier, &[])).await.unwrap();
        let refreshed_at = created.expires_at_ms - ttl;

        // A few ms later (so an exact refresh would show), well within the granularity.
        assert!(eventually(Duration::from_secs(1), || async { now_ms() > refreshed_at + 20 }).await);
        let before = now_ms();
        let burst = store.patch(id, &set(&[("a", "1")], None)).await.unwrap();
        assert!(before + ttl - granularity <= burst.expires_at_ms);
        assert_eq!(
            burst.expires_at_ms, created.expires_at_ms,
            "{tier:?}: a write right after the last refresh shares it"
        );
        // So does a patch of several fields (in Redis, the general script).
        let wide = store.patch(id, &set(&[("a", "1"), ("b", "1")], None)).await.unwrap();
        assert_eq!((wide.version, wide.expires_at_ms), (3, created.expires_at_ms));

        // Past the granularity: the write refreshes again.
        assert!(
            eventually(Duration::from_secs(3), || async {
                now_ms() > refreshed_at + granularity + 20
            })
            .await
        );
        let before = now_ms();
        let later = store.patch(id, &set(&[("a", "2")], None)).await.unwrap();
        assert!(later.expires_at_ms >= before + ttl && later.expires_at_ms > burst.expires_at_ms);
        let snapshot = store.get(id, &Selection::Only(vec![])).await.unwrap().unwrap();
        assert_eq!((snapshot.version, snapshot.expires_at_ms), (4, later.expires_at_ms));
        // And the general script refreshes past the granularity too.
        assert!(
            eventually(Duration::from_secs(3), || async {
                now_ms() > later.expires_at_ms - ttl + granularity + 20
            })
            .await
        );
        let before = now_ms();
        let wide = store.patch(id, &set(&[("a", "3"), ("b", "3")], None)).await.unwrap();
        assert!(wide.expires_at_ms >= before + ttl && wide.expires_at_ms > later.expires_at_ms);
    }
}

async fn limits_are_atomic(subject: Subject) {
    let store = subject.store;
    // max_fields 3, max_context_bytes 20 (names + values).
    let too_many = store
        .create(
            "l",
            &new_context(Tier::Default, &[("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")]),
        )
        .await;
    assert_eq!(
        too_many,
        Err(StoreError::TooManyFields {
            limit: 3,
            would_have: 4
        })
    );
    assert!(!exists(store.as_ref(), "l").await, "a refused create writes nothing");
    let too_large = store
        .create("l", &new_context(Tier::Default, &[("a", "12345678901234567890")]))
        .await;
    assert_eq!(
        too_large,
        Err(StoreError::TooLarge {
            limit: 20,
            would_have: 21
        })
    );

    store
        .create("l", &new_context(Tier::Default, &[("a", "1"), ("b", "22")]))
        .await
        .unwrap(); // 2 + 3 = 5 bytes, 2 fields
    let before = store.get("l", &Selection::All).await.unwrap().unwrap();
    assert_eq!(
        store.patch("l", &set(&[("c", "1"), ("d", "1")], None)).await,
        Err(StoreError::TooManyFields {
            limit: 3,
            would_have: 4
        })
    );
    assert_eq!(
        store.patch("l", &set(&[("a", "12345678901234567")], None)).await,
        Err(StoreError::TooLarge {
            limit: 20,
            would_have: 21
        })
    );
    // Refused patches write nothing, not even the version or the TTL.
    assert_unchanged(&store.get("l", &Selection::All).await.unwrap().unwrap(), &before);
    // Deleting and shrinking free room within the same patch.
    let written = store
        .patch(
            "l",
            &Patch {
                set: fields(&[("c", "1"), ("d", "1")]),
                delete: vec!["b".into()],
                if_version: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(written.version, 2);
    // a=1, c=1, d=1 -> 6 bytes; growing `a` to 15 bytes of value gives 20: allowed.
    store.patch("l", &set(&[("a", "123456789012345")], None)).await.unwrap();
    assert!(matches!(
        store.patch("l", &set(&[("a", "1234567890123456")], None)).await,
        Err(StoreError::TooLarge { would_have: 21, .. })
    ));
    // One field at a time meets the same checks (Redis runs a script of its own
    // for a one-field patch): a fourth field is refused before its size is...
    let full = store.get("l", &Selection::All).await.unwrap().unwrap();
    assert_eq!(
        store.patch("l", &set(&[("e", "")], None)).await,
        Err(StoreError::TooManyFields {
            limit: 3,
            would_have: 4
        })
    );
    // ...and a same-size overwrite (which leaves the byte count as it was) keeps it exact.
    store.patch("l", &set(&[("a", "abcdefghijklmno")], None)).await.unwrap();
    assert!(matches!(
        store.patch("l", &set(&[("c", "12")], None)).await,
        Err(StoreError::TooLarge { would_have: 21, .. })
    ));
    store.patch("l", &set(&[("c", "")], None)).await.unwrap();
    store.patch("l", &set(&[("d", "12")], None)).await.unwrap();
    let after = store.get("l", &Selection::All).await.unwrap().unwrap();
    assert_eq!(after.version, full.version + 3);
    assert_eq!(
        after.fields,
        fields(&[("a", "abcdefghijklmno"), ("c", ""), ("d", "12")])
    );
}

async fn close_respects_ownership(subject: Subject) {
    let store = subject.store;
    store
        .create("o", &new_context(Tier::Default, &[("a", "1")]))
        .await
        .unwrap();
    assert_eq!(
        store.close("o", &CloseAs::Owner("intruder".into())).await,
        Err(StoreError::NotOwner)
    );
    assert!(exists(store.as_ref(), "o").await);
    store.close("o", &CloseAs::Owner("writer".into())).await.unwrap();
    assert!(!exists(store.as_ref(), "o").await);
    assert_eq!(store.close("o", &CloseAs::Anyone).await, Err(StoreError::NotFound));
    store.create("o", &new_context(Tier::Default, &[])).await.unwrap();
    store.close("o", &CloseAs::Anyone).await.unwrap();
    assert_eq!(
        store.patch("o", &set(&[("a", "1")], None)).await,
        Err(StoreError::NotFound)
    );
    // Reading a closed context does not bring it back, not even in the idle index.
    assert!(!exists(store.as_ref(), "o").await);
    assert_eq!(store.live_contexts().await.unwrap(), 0);
}

async fn tiers_expire_and_writes_extend_life(subject: Subject) {
    let store = subject.store;
    store.create("short", &new_context(Tier::OneShot, &[])).await.unwrap();
    store.create("long", &new_context(Tier::Default, &[])).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !exists(store.as_ref(), "short").await
        })
        .await,
        "one_shot context outlived its 1 s TTL"
    );
    assert!(exists(store.as_ref(), "long").await, "default tier (3 s) still alive");
    assert!(
        eventually(Duration::from_secs(8), || async {
            !exists(store.as_ref(), "long").await
        })
        .await,
        "default context outlived its 3 s TTL"
    );

    // Reads do not extend life; writes do: patch every 150 ms for 3x the TTL.
    store.create("kept", &new_context(Tier::OneShot, &[])).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        store.patch("kept", &set(&[("tick", "1")], None)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(exists(store.as_ref(), "kept").await);
}

async fn sweeper_removes_idle_keeps_active(subject: Subject) {
    let store = subject.store;
    store.create("idle", &new_context(Tier::Default, &[])).await.unwrap();
    store.create("busy", &new_context(Tier::Default, &[])).await.unwrap();
    assert_eq!(store.live_contexts().await.unwrap(), 2);
    let mut idle_removed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let gone = loop {
        // Reads count as activity for the sweeper.
        assert!(exists(store.as_ref(), "busy").await);
        idle_removed += store.sweep().await.unwrap().idle;
        // Not a read of "idle": a read would count as activity and keep it.
        if idle_removed > 0 {
            break true;
        }
        if tokio::time::Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(gone, "idle context not swept");
    assert_eq!(idle_removed, 1);
    assert!(!exists(store.as_ref(), "idle").await);
    assert!(exists(store.as_ref(), "busy").await);
    assert_eq!(store.live_contexts().await.unwrap(), 1);
}

async fn concurrent_sweeps_remove_each_context_once(subject: Subject) {
    let store = subject.store;
    for index in 0..40 {
        store
            .create(&format!("s{index}"), &new_context(Tier::Default, &[]))
            .await
            .unwrap();
    }
    // Wait until all are idle (idle timeout 1 s) without touching them.
    let all_idle = eventually(Duration::from_secs(5), || async {
        store.live_contexts().await.unwrap() == 0
    })
    .await;
    assert!(all_idle);
    let sweeps = (0..4).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.sweep().await.unwrap().idle })
    });
    let total: u64 = futures::future::join_all(sweeps)
        .await
        .into_iter()
        .map(Result::unwrap)
        .sum();
    assert_eq!(total, 40, "each idle context is removed by exactly one sweeper");
    assert!(!exists(store.as_ref(), "s0").await);
}

async fn conditional_writers_lose_no_update(subject: Subject) {
    let store = subject.store;
    store
        .create("counter", &new_context(Tier::Default, &[("n", "0")]))
        .await
        .unwrap();
    let writers = (0..20).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut conflicts = 0u64;
            loop {
                let snapshot = store.get("counter", &Selection::All).await.unwrap().unwrap();
                let n: u64 = snapshot.fields["n"].parse().unwrap();
                let patch = set(&[("n", &(n + 1).to_string())], Some(snapshot.version));
                match store.patch("counter", &patch).await {
                    Ok(_) => return conflicts,
                    Err(StoreError::VersionConflict { .. }) => conflicts += 1,
                    Err(other) => panic!("{other}"),
                }
            }
        })
    });
    futures::future::join_all(writers).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    let last = store.get("counter", &Selection::All).await.unwrap().unwrap();
    assert_eq!(last.fields["n"], "20");
    assert_eq!(last.version, 21);
}

// === Running it against both stores ===

fn general() -> StorePolicy {
    StorePolicy {
        max_fields: 3,
        max_context_bytes: 20,
        ..StorePolicy::default()
    }
}

/// Short, but each far above a pause of the test thread between two writes
/// or reads on a loaded machine (a context must not die of one).
fn short_tiers() -> StorePolicy {
    StorePolicy {
        default_ttl: Duration::from_secs(3),
        one_shot_ttl: Duration::from_secs(1),
        ..StorePolicy::default()
    }
}

/// A one_shot TTL whose refresh granularity (a hundredth: 500 ms) is under the 1 s cap.
fn fifty_second_one_shot() -> StorePolicy {
    StorePolicy {
        one_shot_ttl: Duration::from_secs(50),
        ..StorePolicy::default()
    }
}

fn short_idle() -> StorePolicy {
    StorePolicy {
        idle_timeout: Duration::from_secs(1),
        ..StorePolicy::default()
    }
}

macro_rules! contract {
    ($($name:ident => $policy:expr),* $(,)?) => {
        mod on_redis {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(redis($policy)).await })*
        }
        mod on_cluster {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(cluster($policy)).await })*
        }
        mod on_memory {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(memory($policy)).await })*
        }
    };
}

contract! {
    create_and_read => StorePolicy::default(),
    patches_are_versioned => StorePolicy::default(),
    limits_are_atomic => general(),
    close_respects_ownership => StorePolicy::default(),
    tiers_expire_and_writes_extend_life => short_tiers(),
    writes_refresh_the_ttl_within_the_granularity => fifty_second_one_shot(),
    sweeper_removes_idle_keeps_active => short_idle(),
    concurrent_sweeps_remove_each_context_once => short_idle(),
    conditional_writers_lose_no_update => StorePolicy::default(),
}
