//! One contract for every registry store: the embedded store must behave like
//! etcd for leases, transactions, listings and watches. Each test runs against
//! a real etcd (spawned by testkit) and against the embedded store.

use std::sync::Arc;
use std::time::Duration;

use agent_reach_registry::store::{Condition, EtcdStore, Event, MemoryStore, Put, Store, StoreError, WatchStream};
use agent_reach_testkit::Etcd;
use futures::StreamExt;

/// A store under test, keeping its backing process alive.
struct Subject {
    store: Arc<dyn Store>,
    _etcd: Option<Etcd>,
}

fn etcd() -> Subject {
    let etcd = Etcd::start();
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    Subject {
        store: Arc::new(store),
        _etcd: Some(etcd),
    }
}

fn memory() -> Subject {
    Subject {
        store: Arc::new(MemoryStore::new()),
        _etcd: None,
    }
}

fn put(key: &str, value: &str, lease: i64) -> Put {
    Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        lease,
    }
}

async fn next_events(stream: &mut WatchStream) -> Vec<Event> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("watch produced nothing within 10 s")
        .expect("watch ended")
        .expect("watch failed")
        .events
}

async fn wait_gone(store: &dyn Store, key: &str, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if store.get(key).await.unwrap().is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn lease_keeps_keys_until_revoked(subject: Subject) {
    let store = subject.store;
    let lease = store.grant_lease(30).await.unwrap();
    store
        .txn(vec![], vec![put("/t/a", "1", lease), put("/t/b", "2", lease)], vec![])
        .await
        .unwrap();
    assert_eq!(store.keep_alive(lease).await.unwrap(), 30);
    let (kvs, revision) = store.list("/t/").await.unwrap();
    assert_eq!(kvs.len(), 2);
    assert!(kvs.iter().all(|kv| kv.lease == lease));
    let revoked_at = store.revoke_lease(lease).await.unwrap();
    assert!(revoked_at > revision);
    assert!(
        store.list("/t/").await.unwrap().0.is_empty(),
        "revoke deletes every key of the lease"
    );
    assert!(matches!(
        store.keep_alive(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
    assert!(matches!(
        store.revoke_lease(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

async fn expired_lease_removes_keys(subject: Subject) {
    let store = subject.store;
    let lease = store.grant_lease(1).await.unwrap();
    store.txn(vec![], vec![put("/t/x", "1", lease)], vec![]).await.unwrap();
    assert!(
        wait_gone(store.as_ref(), "/t/x", Duration::from_secs(5)).await,
        "key outlived its lease"
    );
    assert!(matches!(
        store.keep_alive(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

async fn keep_alive_extends_life(subject: Subject) {
    let store = subject.store;
    let lease = store.grant_lease(2).await.unwrap();
    store.txn(vec![], vec![put("/t/k", "1", lease)], vec![]).await.unwrap();
    // Renew every 500 ms for 4 s: twice the TTL, the key must survive.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        store.keep_alive(lease).await.unwrap();
        assert!(store.get("/t/k").await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `lease_ttl` (the console's heartbeat age): the granted TTL, the whole
/// seconds left, counting down until a renewal resets them; nothing for a
/// lease that is gone.
async fn lease_ttl_counts_down_until_renewed(subject: Subject) {
    let store = subject.store;
    let lease = store.grant_lease(10).await.unwrap();
    let fresh = store.lease_ttl(lease).await.unwrap().expect("a live lease");
    assert_eq!(fresh.granted_s, 10, "{fresh:?}");
    // Whole seconds, rounded down: a lease granted a moment ago has 9 left.
    assert!((9..=10).contains(&fresh.remaining_s), "{fresh:?}");
    assert!(fresh.age_s() <= 1, "{fresh:?}");

    // No renewal: the age grows past a second (polled, bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let aged = loop {
        let now = store.lease_ttl(lease).await.unwrap().expect("still live");
        if now.age_s() >= 2 {
            break now;
        }
        assert!(tokio::time::Instant::now() < deadline, "the age stayed at {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(aged.granted_s, 10);
    assert!(aged.remaining_s <= 8, "{aged:?}");

    // A renewal starts it again.
    assert_eq!(store.keep_alive(lease).await.unwrap(), 10);
    let renewed = store.lease_ttl(lease).await.unwrap().expect("still live");
    assert!(renewed.age_s() <= 1, "renewed, yet {renewed:?}");

    // Gone: revoked, expired or never granted.
    store.revoke_lease(lease).await.unwrap();
    assert_eq!(store.lease_ttl(lease).await.unwrap(), None);
    assert_eq!(store.lease_ttl(0x7a11_0000_0001).await.unwrap(), None);
    let short = store.grant_lease(1).await.unwrap();
    store
        .txn(vec![], vec![put("/t/short", "1", short)], vec![])
        .await
        .unwrap();
    assert!(wait_gone(store.as_ref(), "/t/short", Duration::from_secs(5)).await);
    assert_eq!(store.lease_ttl(short).await.unwrap(), None);
}

async fn transactions_are_conditional_and_atomic(subject: Subject) {
    let store = subject.store;
    let created = store
        .txn(
            vec![Condition::ModRevision {
                key: "/t/c".into(),
                revision: 0,
            }],
            vec![put("/t/c", "v1", 0)],
            vec![],
        )
        .await
        .unwrap();
    let kv = store.get("/t/c").await.unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (created, created));
    // A stale condition changes nothing.
    let stale = store
        .txn(
            vec![Condition::ModRevision {
                key: "/t/c".into(),
                revision: 0,
            }],
            vec![put("/t/c", "v2", 0), put("/t/d", "x", 0)],
            vec![],
        )
        .await;
    assert_eq!(stale, Err(StoreError::Conflict));
    assert!(store.get("/t/d").await.unwrap().is_none());
    // A put on a vanished lease writes nothing at all.
    let lease = store.grant_lease(30).await.unwrap();
    store.revoke_lease(lease).await.unwrap();
    let orphan = store
        .txn(vec![], vec![put("/t/e", "x", 0), put("/t/f", "y", lease)], vec![])
        .await;
    assert!(matches!(orphan, Err(StoreError::LeaseNotFound(_))), "{orphan:?}");
    assert!(store.get("/t/e").await.unwrap().is_none());
    // Moving a key to a new lease: revoking the old lease leaves it alone.
    let old = store.grant_lease(30).await.unwrap();
    let new = store.grant_lease(30).await.unwrap();
    store.txn(vec![], vec![put("/t/m", "1", old)], vec![]).await.unwrap();
    store.txn(vec![], vec![put("/t/m", "2", new)], vec![]).await.unwrap();
    store.revoke_lease(old).await.unwrap();
    let moved = store.get("/t/m").await.unwrap().unwrap();
    assert_eq!((moved.value.as_slice(), moved.lease), (b"2".as_slice(), new));
}

async fn watch_replays_from_a_revision(subject: Subject) {
    let store = subject.store;
    let lease = store.grant_lease(30).await.unwrap();
    let first = store.txn(vec![], vec![put("/w/a", "1", lease)], vec![]).await.unwrap();
    store.txn(vec![], vec![put("/w/a", "2", lease)], vec![]).await.unwrap();
    store.txn(vec![], vec![put("/other/z", "x", 0)], vec![]).await.unwrap();
    store.revoke_lease(lease).await.unwrap();

    let mut stream = store.watch("/w/", first).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.extend(next_events(&mut stream).await);
    }
    assert!(matches!(&seen[0], Event::Put(kv) if kv.value == b"1" && kv.create_revision == kv.mod_revision));
    assert!(matches!(&seen[1], Event::Put(kv) if kv.value == b"2" && kv.create_revision < kv.mod_revision));
    assert!(matches!(&seen[2], Event::Delete { key, .. } if key == "/w/a"));
    let revisions: Vec<_> = seen.iter().map(Event::revision).collect();
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "ordered: {revisions:?}"
    );

    // Live events follow the replay.
    store.txn(vec![], vec![put("/w/b", "3", 0)], vec![]).await.unwrap();
    assert!(matches!(&next_events(&mut stream).await[0], Event::Put(kv) if kv.key == "/w/b"));
}

async fn compacted_history_is_reported(subject: Subject) {
    let store = subject.store;
    let early = store.txn(vec![], vec![put("/h/a", "1", 0)], vec![]).await.unwrap();
    store.txn(vec![], vec![put("/h/a", "2", 0)], vec![]).await.unwrap();
    let last = store.txn(vec![], vec![put("/h/a", "3", 0)], vec![]).await.unwrap();
    store.compact(last).await.unwrap();
    match store.watch("/h/", early).await {
        Err(StoreError::Compacted { .. }) => {}
        Ok(mut stream) => {
            // etcd may accept the watch and cancel it on the first answer.
            let item = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .unwrap();
            assert!(matches!(item, Some(Err(StoreError::Compacted { .. }))), "{item:?}");
        }
        Err(other) => panic!("expected Compacted, got {other}"),
    }
    // Watching from the current revision on works.
    let _live = store.watch("/h/", last + 1).await.unwrap();
}

/// A listing holds every key of its prefix at one revision, however many
/// (etcd's answers come in pages; more than one here) and however large
/// (one answer of them all would be over the 4 MiB a gRPC client decodes).
async fn listings_are_whole_at_any_size(subject: Subject) {
    let store = subject.store;
    let large = "x".repeat(300 * 1024);
    for chunk in 0..25 {
        let puts = (0..100)
            .map(|n| put(&format!("/many/{:05}", chunk * 100 + n), "v", 0))
            .collect();
        store.txn(vec![], puts, vec![]).await.unwrap();
    }
    for n in 0..20 {
        store
            .txn(vec![], vec![put(&format!("/large/{n:02}"), &large, 0)], vec![])
            .await
            .unwrap();
    }
    // A key just outside the prefix is not listed.
    store.txn(vec![], vec![put("/many0", "v", 0)], vec![]).await.unwrap();
    let (kvs, revision) = store.list("/many/").await.unwrap();
    assert_eq!(kvs.len(), 2500);
    let keys: Vec<&str> = kvs.iter().map(|kv| kv.key.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted, "in key order, each once");
    assert!(kvs.iter().all(|kv| kv.mod_revision <= revision));
    let (kvs, _) = store.list("/large/").await.unwrap();
    assert_eq!(kvs.len(), 20);
    assert!(kvs.iter().all(|kv| kv.value.len() == large.len()));
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod on_etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::etcd()).await }
            )*
        }
        mod on_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::memory()).await }
            )*
        }
    };
}

contract!(
    lease_keeps_keys_until_revoked,
    expired_lease_removes_keys,
    keep_alive_extends_life,
    lease_ttl_counts_down_until_renewed,
    transactions_are_conditional_and_atomic,
    watch_replays_from_a_revision,
    compacted_history_is_reported,
    listings_are_whole_at_any_size,
);
