//! The context store on a real Redis primary, its replica and three
//! Sentinels (issue 23, point 4): it finds the primary through the
//! Sentinels and keeps serving after a failover (SIGKILL of the primary)
//! without a restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_context::model::{Fields, NewContext, Selection, StorePolicy, Tier};
use agent_reach_context::store::{ContextStore, Namespace, RedisStore};
use agent_reach_stores::RedisLink;
use agent_reach_testkit::RedisSentinels;

fn new_context() -> NewContext {
    let mut fields = Fields::new();
    fields.insert("step".to_string(), "1".to_string());
    NewContext {
        tier: Tier::Default,
        owner: "tester".to_string(),
        fields,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_keep_being_served_across_a_sentinel_failover() {
    let mut redis = RedisSentinels::start();
    let namespace = Namespace {
        prefix: "test".into(),
        tenant: "sentinel".into(),
    };
    let store: Arc<dyn ContextStore> = Arc::new(
        RedisStore::new(
            &RedisLink::parse(&redis.url()).unwrap(),
            &namespace,
            StorePolicy::default(),
            Duration::from_secs(1),
        )
        .unwrap(),
    );
    let [first_primary, replica] = redis.server_ports();
    store.create("before", &new_context()).await.unwrap();
    assert!(store.get("before", &Selection::All).await.unwrap().is_some());
    // Replication is asynchronous: only a write the replica has can survive the kill.
    assert!(
        redis.wait_replicated(first_primary, replica),
        "the replica never caught up"
    );

    redis.kill_server(first_primary);
    let killed = Instant::now();
    let mut attempt = 0;
    let recovered = loop {
        attempt += 1;
        if store.create(&format!("after-{attempt}"), &new_context()).await.is_ok() {
            break killed.elapsed();
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(redis.primary_port(), Some(replica));
    eprintln!("context writes resumed {recovered:?} after the primary's kill");
    // The promoted replica serves what was written before the failover, and
    // what is written now, through the same store.
    assert!(
        store.get("before", &Selection::All).await.unwrap().is_some(),
        "a context written before the failover"
    );
    assert!(store
        .get(&format!("after-{attempt}"), &Selection::All)
        .await
        .unwrap()
        .is_some());
}
