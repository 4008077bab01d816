//! The routers' history ledger (issue 38, point 1) on a real Redis and a
//! real Redis Cluster: each router's counts add to every router's totals per
//! slot and bucket, a first exchange reads the whole week back, later ones
//! the buckets asked for, buckets older than a week are dropped, and
//! routers with another bucket length never mix with them.

use std::time::Duration;

use agent_reach_task_store::{HistorySlot, StoreConfig, TaskStore};

fn slot(adds: Vec<(u64, Vec<u32>)>, read_all: bool, read: Vec<u64>) -> HistorySlot {
    HistorySlot {
        name: "order.query@1.0.0:oq-1".to_string(),
        adds,
        read_all,
        read,
    }
}

async fn totals_merge(url: &str) {
    let store = TaskStore::new(url, &StoreConfig::default()).expect("store");
    let ttl = Duration::from_secs(60);
    // Router a adds to buckets 100 and 101; router b to 101.
    let answer = store
        .exchange_history(
            3_600_000,
            0,
            ttl,
            &[slot(
                vec![(100, vec![5, 1, 0, 2]), (101, vec![1, 0, 0, 0])],
                false,
                vec![100, 101],
            )],
        )
        .await
        .unwrap();
    assert_eq!(answer, vec![vec![(100, vec![5, 1, 0, 2]), (101, vec![1, 0, 0, 0])]]);
    let answer = store
        .exchange_history(
            3_600_000,
            0,
            ttl,
            &[slot(vec![(101, vec![3, 0, 1, 1])], false, vec![101, 102])],
        )
        .await
        .unwrap();
    assert_eq!(
        answer,
        vec![vec![(101, vec![4, 0, 1, 1])]],
        "every router's total; bucket 102 holds nothing"
    );
    // A router seeing the slot for the first time reads the whole week.
    let mut all = store
        .exchange_history(3_600_000, 0, ttl, &[slot(Vec::new(), true, Vec::new())])
        .await
        .unwrap()
        .remove(0);
    all.sort();
    assert_eq!(all, vec![(100, vec![5, 1, 0, 2]), (101, vec![4, 0, 1, 1])]);
    // A new bucket past a week drops the old ones.
    let mut all = store
        .exchange_history(
            3_600_000,
            101,
            ttl,
            &[slot(vec![(268, vec![1, 0, 0, 0])], true, Vec::new())],
        )
        .await
        .unwrap()
        .remove(0);
    all.sort();
    assert_eq!(all, vec![(101, vec![4, 0, 1, 1]), (268, vec![1, 0, 0, 0])]);
    // Another bucket length is another history.
    let other = store
        .exchange_history(3_000, 0, ttl, &[slot(Vec::new(), true, Vec::new())])
        .await
        .unwrap();
    assert_eq!(other, vec![Vec::new()]);
    // Many slots go in several script calls, answered in order.
    let many: Vec<HistorySlot> = (0..250)
        .map(|n| HistorySlot {
            name: format!("many@1.0.0:a-{n}"),
            adds: vec![(7, vec![n, 0])],
            read_all: false,
            read: vec![7],
        })
        .collect();
    let answer = store.exchange_history(3_600_000, 0, ttl, &many).await.unwrap();
    assert_eq!(answer.len(), 250);
    assert!(answer
        .iter()
        .enumerate()
        .all(|(n, totals)| totals == &vec![(7, vec![n as u32, 0])]));
}

#[tokio::test]
async fn history_totals_merge_on_one_redis() {
    let redis = agent_reach_testkit::Redis::start();
    totals_merge(&redis.url()).await;
}

#[tokio::test]
async fn history_totals_merge_on_a_redis_cluster() {
    let cluster = agent_reach_testkit::RedisCluster::start();
    totals_merge(&cluster.url()).await;
}

#[tokio::test]
async fn the_ledger_down_is_unavailable_not_a_panic() {
    let store = TaskStore::new("redis://127.0.0.1:1", &StoreConfig::default()).expect("store");
    let error = store
        .exchange_history(
            3_600_000,
            0,
            Duration::from_secs(1),
            &[slot(Vec::new(), true, Vec::new())],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, agent_reach_task_store::TaskStoreError::Unavailable(_)),
        "{error}"
    );
}
