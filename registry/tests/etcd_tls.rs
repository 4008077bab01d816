//! The registry on etcd over https with client certificates (issue 20):
//! verification on, a CA bundle and a client identity from files, and a
//! clear STORE_UNAVAILABLE naming the certificate problem without them.

use crate::support;

use agent_reach_registry::store::etcd::EtcdTls;
use agent_reach_registry::store::{EtcdStore, Store};
use agent_reach_registry::StoreChoice;
use agent_reach_stores::TlsFiles;
use agent_reach_testkit::pki::Pki;
use agent_reach_testkit::Etcd;
use support::{registration, TestRegistry};

fn files(pki: &Pki, ca: bool) -> TlsFiles {
    let mut problems = Vec::new();
    let client = pki.client("tester");
    let files = TlsFiles::read(
        "--etcd",
        ca.then_some(pki.ca_file.as_path()),
        Some(&client.cert),
        Some(&client.key),
        &mut problems,
    );
    assert!(problems.is_empty(), "{problems:?}");
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_go_to_etcd_over_verified_tls() {
    let pki = Pki::new("stores");
    let etcd = Etcd::start_tls(&pki);
    assert!(etcd.endpoint().starts_with("https://"));
    let registry = TestRegistry::start(StoreChoice::EtcdTls {
        endpoints: vec![etcd.endpoint()],
        tls: files(&pki, true),
    })
    .await;
    let token = TestRegistry::token("order_query");
    let (status, body) = registry
        .post("/v1/agents", Some(&token), &registration("oq-tls", 15))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(registry.resolved("order.query").await, ["oq-tls"]);

    // The same etcd with the system's roots only: the test CA is not
    // trusted, and the error says so.
    let untrusting = EtcdStore::connect_with(&[etcd.endpoint()], &EtcdTls::from_files(&files(&pki, false))).unwrap();
    let error = untrusting.ping().await.unwrap_err().to_string();
    let lowered = error.to_lowercase();
    assert!(
        lowered.contains("certificate") || lowered.contains("unknownissuer"),
        "{error}"
    );
}
