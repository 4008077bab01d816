//! The task store over `rediss://` (issue 20): a real redis-server speaking
//! TLS only, client certificates required, the server verified against the
//! given CA; without that CA the error names the certificate problem.

use agent_reach_stores::TlsFiles;
use agent_reach_task_store::{NewTask, StoreConfig, TaskStore};
use agent_reach_testkit::pki::Pki;
use agent_reach_testkit::Redis;
use serde_json::json;

fn tls(pki: &Pki, ca: bool) -> TlsFiles {
    let mut problems = Vec::new();
    let client = pki.client("tester");
    let files = TlsFiles::read(
        "--redis",
        ca.then_some(pki.ca_file.as_path()),
        Some(&client.cert),
        Some(&client.key),
        &mut problems,
    );
    assert!(problems.is_empty(), "{problems:?}");
    files
}

#[tokio::test]
async fn tasks_go_to_redis_over_verified_tls() {
    let pki = Pki::new("stores");
    let redis = Redis::start_tls(&pki);
    assert!(redis.url().starts_with("rediss://"));
    let config = StoreConfig {
        tls: tls(&pki, true),
        ..StoreConfig::default()
    };
    let store = TaskStore::new(&redis.url(), &config).unwrap();
    store.prepare().await.unwrap();
    let submitted = store
        .submit(NewTask {
            request_id: "tls-1".into(),
            caller: "tester".into(),
            capability: "demo.echo".into(),
            envelope: json!({"capability": "demo.echo", "payload": {}}),
            ..NewTask::default()
        })
        .await
        .unwrap();
    assert_eq!(
        store.get(submitted.task_id()).await.unwrap().task_id,
        submitted.task_id()
    );

    // The system's roots do not include the test CA: refused, and said why.
    let untrusting = TaskStore::new(
        &redis.url(),
        &StoreConfig {
            tls: tls(&pki, false),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let error = untrusting.prepare().await.unwrap_err().to_string().to_lowercase();
    assert!(
        error.contains("certificate") || error.contains("unknownissuer"),
        "{error}"
    );
}
