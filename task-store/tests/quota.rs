//! The routers' quota ledger (issue 35, point 2) on a real Redis and a real
//! Redis Cluster: places granted never add up to more than the limit, a
//! router holds what it has in flight, every live router's report comes
//! back, and a silent router's report expires so the others take its places.

use std::time::{Duration, Instant};

use agent_reach_task_store::{QuotaAsk, StoreConfig, TaskStore};

fn ask(target: u32, holding: u32) -> QuotaAsk {
    QuotaAsk {
        name: "caller:bulk".to_string(),
        rate: 12.5,
        wanted: target,
        limit: 4,
        target,
        holding,
    }
}

async fn granted(store: &TaskStore, router: &str, target: u32, holding: u32, ttl: Duration) -> u32 {
    let answer = store
        .exchange_quotas(router, &[ask(target, holding)], ttl)
        .await
        .expect("exchange");
    answer.limits[0].granted
}

/// The contract, on whichever Redis `url` names.
async fn grants_hold_the_limit(url: &str) {
    let store = TaskStore::new(url, &StoreConfig::default()).expect("store");
    let ttl = Duration::from_secs(30);
    // `a` asks for everything and gets it; `b` then gets nothing.
    assert_eq!(granted(&store, "a", 4, 0, ttl).await, 4);
    assert_eq!(granted(&store, "b", 2, 0, ttl).await, 0);
    // `a` lowers its share but still has 3 in flight: `b` gets one place.
    assert_eq!(granted(&store, "a", 1, 3, ttl).await, 1);
    assert_eq!(granted(&store, "b", 2, 0, ttl).await, 1);
    // Once `a`'s calls end, `b` gets its whole share.
    assert_eq!(granted(&store, "a", 1, 0, ttl).await, 1);
    assert_eq!(granted(&store, "b", 2, 1, ttl).await, 2);
    assert_eq!(granted(&store, "c", 4, 0, ttl).await, 1, "4 - a's 1 - b's 2");

    // Every live router's report comes back, and the routers are counted.
    let answer = store.exchange_quotas("c", &[ask(1, 1)], ttl).await.unwrap();
    assert_eq!(answer.routers, 3);
    let mut routers: Vec<&str> = answer.limits[0]
        .reports
        .iter()
        .map(|report| report.router.as_str())
        .collect();
    routers.sort_unstable();
    assert_eq!(routers, ["a", "b", "c"]);
    assert!(answer.limits[0].reports.iter().all(|report| report.rate == 12.5));

    // An exchange with no limit counts the router in and answers no limit.
    let answer = store.exchange_quotas("d", &[], ttl).await.unwrap();
    assert_eq!(answer.routers, 4);
    assert!(answer.limits.is_empty());
}

#[tokio::test]
async fn grants_never_add_up_to_more_than_the_limit_on_one_redis() {
    let redis = agent_reach_testkit::Redis::start();
    grants_hold_the_limit(&redis.url()).await;
}

#[tokio::test]
async fn grants_never_add_up_to_more_than_the_limit_on_a_redis_cluster() {
    let cluster = agent_reach_testkit::RedisCluster::start();
    grants_hold_the_limit(&cluster.url()).await;
}

#[tokio::test]
async fn a_silent_routers_places_return_once_its_report_expires() {
    let redis = agent_reach_testkit::Redis::start();
    let store = TaskStore::new(&redis.url(), &StoreConfig::default()).expect("store");
    let short = Duration::from_millis(300);
    assert_eq!(granted(&store, "gone", 4, 4, short).await, 4);
    assert_eq!(granted(&store, "here", 4, 0, short).await, 0);
    let started = Instant::now();
    loop {
        if granted(&store, "here", 4, 0, short).await == 4 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the silent router's places never came back"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn the_ledger_down_is_unavailable_not_a_panic() {
    let store = TaskStore::new("redis://127.0.0.1:1", &StoreConfig::default()).expect("store");
    let error = store
        .exchange_quotas("a", &[ask(1, 0)], Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(error, agent_reach_task_store::TaskStoreError::Unavailable(_)),
        "{error}"
    );
}
