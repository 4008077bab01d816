//! The task store on a real Redis primary, its replica and three Sentinels
//! (issue 23, point 4): it finds the primary through the Sentinels, follows
//! a failover (SIGKILL of the primary) without a restart, and with `WAIT 1`
//! no acknowledged task is lost.

use std::time::{Duration, Instant};

use agent_reach_stores::Wait;
use agent_reach_task_store::{NewTask, Priority, StoreConfig, Submitted, TaskStore};
use agent_reach_testkit::RedisSentinels;
use serde_json::json;

fn task(request_id: &str) -> NewTask {
    NewTask {
        request_id: request_id.to_string(),
        caller: "tester".to_string(),
        capability: "demo.echo".to_string(),
        priority: Priority::Normal,
        envelope: json!({"capability": "demo.echo", "request_id": request_id, "payload": {}}),
        ..NewTask::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_tasks_survive_a_sentinel_failover_with_wait() {
    let mut redis = RedisSentinels::start();
    let config = StoreConfig {
        wait: Some(Wait {
            replicas: 1,
            timeout: Duration::from_millis(500),
        }),
        ..StoreConfig::default()
    };
    let store = TaskStore::new(&redis.url(), &config).unwrap();
    store.prepare().await.unwrap();
    let [first_primary, replica] = redis.server_ports();
    assert_eq!(redis.primary_port(), Some(first_primary));

    // Submissions go on before, during and after the failover; every one
    // answered Ok is an acknowledged task.
    let mut acknowledged = Vec::new();
    let mut refused = 0usize;
    let index = std::sync::atomic::AtomicUsize::new(0);
    let next = || index.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    let submit_some = async |count: usize, acknowledged: &mut Vec<String>, refused: &mut usize| {
        for _ in 0..count {
            let index = next();
            match store.submit(task(&format!("req-{index}"))).await {
                Ok(Submitted::Created(id)) => acknowledged.push(id),
                Ok(Submitted::Existing(id)) => panic!("request {index} was new, got existing {id}"),
                Err(_) => *refused += 1,
            }
        }
    };
    submit_some(50, &mut acknowledged, &mut refused).await;
    assert_eq!(refused, 0, "all submissions succeed while both servers are up");

    redis.kill_server(first_primary);
    let killed = Instant::now();
    // The store follows the failover: the promoted replica takes the writes,
    // but with WAIT 1 and no replica left it refuses to acknowledge them
    // (503 at the router) rather than acknowledge a task held once.
    let followed = loop {
        match store.submit(task(&format!("req-{}", next()))).await {
            Ok(submitted) => panic!("acknowledged without a replica: {submitted:?}"),
            Err(error) if error.to_string().contains("of 1 replicas") => break killed.elapsed(),
            Err(_) => {}
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(redis.primary_port(), Some(replica));

    // The old primary returns as a replica: acknowledgements resume.
    redis.restart_server_as_replica(first_primary, replica);
    let resumed = Instant::now();
    loop {
        let before = acknowledged.len();
        submit_some(1, &mut acknowledged, &mut refused).await;
        if acknowledged.len() > before {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(30),
            "no acknowledgement with the replica back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    submit_some(20, &mut acknowledged, &mut refused).await;
    eprintln!(
        "failover followed {followed:?} after the kill; {} acknowledged in all, {refused} refused meanwhile",
        acknowledged.len()
    );

    // Every acknowledged task is on the new primary, read through the same store (no restart).
    for id in &acknowledged {
        let found = store.get(id).await;
        assert!(found.is_ok(), "acknowledged task {id} lost: {found:?}");
    }
    assert_eq!(redis.role(replica).as_deref(), Some("master"));
}
