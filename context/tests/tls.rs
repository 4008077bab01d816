//! The context store over `rediss://` (issue 20): a real redis-server that
//! speaks TLS only and requires client certificates; the server is verified
//! against the given CA, and without that CA nothing is sent and the error
//! names the certificate problem.

use std::time::Duration;

use agent_reach_context::model::{Fields, NewContext, Patch, Selection, StorePolicy, Tier};
use agent_reach_context::store::{ContextStore, Namespace, RedisStore, StoreError};
use agent_reach_stores::{RedisLink, TlsFiles};
use agent_reach_testkit::pki::Pki;
use agent_reach_testkit::Redis;

fn link(redis: &Redis, pki: &Pki, ca: bool) -> RedisLink {
    let mut problems = Vec::new();
    let client = pki.client("context");
    let files = TlsFiles::read(
        "--redis",
        ca.then_some(pki.ca_file.as_path()),
        Some(&client.cert),
        Some(&client.key),
        &mut problems,
    );
    assert!(problems.is_empty(), "{problems:?}");
    RedisLink::parse(&redis.url()).unwrap().with_tls(files)
}

fn namespace() -> Namespace {
    Namespace {
        prefix: "test".into(),
        tenant: "tls".into(),
    }
}

#[tokio::test]
async fn contexts_go_to_redis_over_verified_tls() {
    let pki = Pki::new("context-store");
    let redis = Redis::start_tls(&pki);
    assert!(redis.url().starts_with("rediss://"));
    let store = RedisStore::new(
        &link(&redis, &pki, true),
        &namespace(),
        StorePolicy::default(),
        Duration::from_secs(2),
    )
    .unwrap();
    store.ping().await.unwrap();
    let mut fields = Fields::new();
    fields.insert("step".to_string(), "1".to_string());
    let created = store
        .create(
            "over-tls",
            &NewContext {
                tier: Tier::Default,
                owner: "tester".to_string(),
                fields,
            },
        )
        .await
        .unwrap();
    // Enough commands to need more than one TLS record each way.
    for step in 2..200 {
        let mut set = Fields::new();
        set.insert("step".to_string(), step.to_string());
        set.insert("blob".to_string(), format!("\"{}\"", "x".repeat(2000)));
        store
            .patch(
                "over-tls",
                &Patch {
                    set,
                    delete: Vec::new(),
                    if_version: None,
                },
            )
            .await
            .unwrap();
    }
    let snapshot = store.get("over-tls", &Selection::All).await.unwrap().unwrap();
    assert_eq!(snapshot.fields["step"], "199");
    assert!(snapshot.version > created.version);
}

#[tokio::test]
async fn a_redis_whose_certificate_is_not_trusted_is_never_used() {
    let pki = Pki::new("context-store");
    let redis = Redis::start_tls(&pki);
    // The system's roots do not include the test CA.
    let store = RedisStore::new(
        &link(&redis, &pki, false),
        &namespace(),
        StorePolicy::default(),
        Duration::from_secs(2),
    )
    .unwrap();
    let error = store.ping().await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("TLS with Redis at 127.0.0.1:"), "{text}");
    assert!(text.contains("UnknownIssuer") || text.contains("certificate"), "{text}");
}
