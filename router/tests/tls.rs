//! TLS on every link the router has (issue 20): `https://` agents reached
//! with their certificate verified against the configured CA; an agent whose
//! certificate no trusted CA signed is never called, the caller gets a clear
//! failure and the breaker counts it; mutual TLS to agents that require a
//! client certificate; the router's own listener over TLS, its certificate
//! reloaded when the files change; the registry served over TLS and watched
//! by the router over gRPC with TLS. Real etcd, registry, router and agents;
//! certificates from a throwaway CA (`agent_reach_testkit::pki`).

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agent_reach_router::Router;
use agent_reach_serving::tls::{ClientFiles, ServerFiles};
use agent_reach_testkit::pki::{CertFiles, Pki};
use serde_json::Value;
use support::*;

fn client_trusting(ca: &Path) -> reqwest::Client {
    registry_client(Some(ca))
}

fn tls_agent(agent_id: &str, cert: CertFiles, client_ca: Option<&Path>) -> AgentSpec {
    let mut spec = AgentSpec::new(agent_id, 1, Behaviour::Echo);
    spec.tls = Some(AgentTls {
        cert,
        client_ca: client_ca.map(Path::to_path_buf),
    });
    spec
}

async fn invoke_at(client: &reqwest::Client, base: &str, request: &str) -> Result<(u16, Value), reqwest::Error> {
    let response = client
        .post(format!("{base}/v1/invoke"))
        .bearer_auth(token(CALLER))
        .json(&order(request))
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

async fn wait_routable(router: &Router, agent_id: &str) {
    let seen = eventually(Duration::from_secs(20), || {
        let router = router.clone();
        async move { router.routed_agent_ids().iter().any(|id| id == agent_id) }
    })
    .await;
    assert!(seen, "{agent_id} never reached the router's snapshot");
}

fn code_of(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

/// The detail of a call whose only attempt failed for TLS: 502
/// `ALL_RETRIES_EXHAUSTED`, the attempt's `reason` as given (`connect` when
/// the router refused the agent's certificate; `reset` when a TLS 1.3 agent
/// refused the router's, which the router learns on its first read).
fn refused_by_tls<'a>(status: u16, body: &'a Value, reason: &str) -> &'a str {
    assert_eq!((status, code_of(body)), (502, "ALL_RETRIES_EXHAUSTED"), "{body}");
    let attempt = &body["error"]["details"]["attempts"][0];
    assert_eq!(attempt["reason"], reason, "{body}");
    attempt["detail"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_agents_are_called_with_their_certificate_verified() {
    let pki = Pki::new("agents");
    let cluster = Cluster::start().await;
    let agent = cluster.agent(tls_agent("tls-1", pki.server("tls-1"), None));
    let (router, addr) = cluster
        .another_router(|settings| settings.agent_tls.ca = Some(pki.ca_file.clone()))
        .await;
    wait_routable(&router, "tls-1").await;
    let (status, body) = invoke_at(&reqwest::Client::new(), &format!("http://{addr}"), "SO-1")
        .await
        .expect("router answers");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["agent_id"], "tls-1");
    assert_eq!(body["output"]["echo"]["order_id"], "SO-1");
    assert_eq!(agent.hits(), 1);
    // Pooled: the next calls reuse the TLS connection and still succeed.
    for n in 0..20 {
        let (status, body) = invoke_at(&reqwest::Client::new(), &format!("http://{addr}"), &format!("SO-{n}"))
            .await
            .expect("router answers");
        assert_eq!(status, 200, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_certificate_no_trusted_ca_signed_is_never_called() {
    let pki = Pki::new("agents");
    let cluster = Cluster::start().await;
    let rogue = cluster.agent(tls_agent("rogue-1", pki.self_signed("rogue-1"), None));
    let (router, addr) = cluster
        .another_router(|settings| {
            settings.agent_tls.ca = Some(pki.ca_file.clone());
            settings.tuning.max_attempts = 1;
            settings.tuning.breaker_failures = 2;
            settings.tuning.breaker_open = Duration::from_secs(3600);
        })
        .await;
    wait_routable(&router, "rogue-1").await;
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    for n in 0..2 {
        let (status, body) = invoke_at(&client, &base, &format!("SO-{n}"))
            .await
            .expect("router answers");
        let detail = refused_by_tls(status, &body, "connect");
        assert!(
            detail.contains("TLS handshake") && detail.contains("certificate"),
            "the failure says the certificate was refused: {detail}"
        );
    }
    // Nothing reached the agent's handler, and its breaker counted the failures.
    assert_eq!(rogue.hits(), 0);
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("agent_reach_router_breaker_state{agent_id=\"rogue-1\"} 2"),
        "the breaker opened"
    );
    let (status, body) = invoke_at(&client, &base, "SO-after").await.expect("router answers");
    assert_eq!((status, code_of(&body)), (503, "NO_AVAILABLE_INSTANCE"), "{body}");
    assert_eq!(rogue.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_an_expired_certificate_is_never_called() {
    let pki = Pki::new("agents");
    let cluster = Cluster::start().await;
    let stale = cluster.agent(tls_agent("stale-1", pki.expired_server("stale-1"), None));
    let (router, addr) = cluster
        .another_router(|settings| {
            settings.agent_tls.ca = Some(pki.ca_file.clone());
            settings.tuning.max_attempts = 1;
        })
        .await;
    wait_routable(&router, "stale-1").await;
    let (status, body) = invoke_at(&reqwest::Client::new(), &format!("http://{addr}"), "SO-1")
        .await
        .expect("router answers");
    let detail = refused_by_tls(status, &body, "connect");
    assert!(
        detail.contains("certificate expired"),
        "the failure says the certificate expired: {detail}"
    );
    assert_eq!(stale.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_that_require_a_client_certificate_get_the_routers() {
    let pki = Pki::new("mesh");
    let cluster = Cluster::start().await;
    let agent = cluster.agent(tls_agent("mtls-1", pki.server("mtls-1"), Some(&pki.ca_file)));
    // Without a client certificate the agent refuses the handshake.
    let (anonymous, anonymous_addr) = cluster
        .another_router(|settings| {
            settings.agent_tls.ca = Some(pki.ca_file.clone());
            settings.tuning.max_attempts = 1;
        })
        .await;
    wait_routable(&anonymous, "mtls-1").await;
    let (status, body) = invoke_at(&reqwest::Client::new(), &format!("http://{anonymous_addr}"), "SO-anon")
        .await
        .expect("router answers");
    let detail = refused_by_tls(status, &body, "reset");
    assert!(
        detail.contains("CertificateRequired"),
        "the failure names the missing certificate: {detail}"
    );
    assert_eq!(agent.hits(), 0);
    // With the router's certificate it is served.
    let identity = pki.client("router");
    let (router, addr) = cluster
        .another_router(|settings| {
            settings.agent_tls = ClientFiles {
                ca: Some(pki.ca_file.clone()),
                identity: Some((identity.cert.clone(), identity.key.clone())),
            };
        })
        .await;
    wait_routable(&router, "mtls-1").await;
    let (status, body) = invoke_at(&reqwest::Client::new(), &format!("http://{addr}"), "SO-mtls")
        .await
        .expect("router answers");
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent.hits(), 1);
}

/// Replaces `to`'s files with `from`'s (rename over: readers never see half a file).
fn install(from: &CertFiles, to: &CertFiles) {
    for (source, target) in [(&from.cert, &to.cert), (&from.key, &to.key)] {
        let staging = target.with_extension("new");
        std::fs::copy(source, &staging).expect("copy");
        std::fs::rename(&staging, target).expect("rename");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_https_and_picks_up_a_new_certificate() {
    let (old_ca, new_ca) = (Pki::new("old"), Pki::new("new"));
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("plain-1", 1, Behaviour::Echo));
    let live = CertFiles {
        cert: cluster.dir.path().join("router.crt"),
        key: cluster.dir.path().join("router.key"),
    };
    install(&old_ca.server("router"), &live);
    let (router, addr) = cluster
        .another_router(|settings| {
            settings.listener_tls = Some(ServerFiles {
                cert: live.cert.clone(),
                key: live.key.clone(),
                client_ca: None,
            })
        })
        .await;
    wait_routable(&router, "plain-1").await;
    let https = format!("https://localhost:{}", addr.port());
    let (status, body) = invoke_at(&client_trusting(&old_ca.ca_file), &https, "SO-1")
        .await
        .expect("https answers");
    assert_eq!(status, 200, "{body}");
    // An A2A card served over TLS names its interface with https://.
    let card: Value = client_trusting(&old_ca.ca_file)
        .get(format!("{https}/a2a/{CAPABILITY}/.well-known/agent-card.json"))
        .send()
        .await
        .expect("the card over https")
        .json()
        .await
        .expect("a JSON card");
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        format!("{https}/a2a/{CAPABILITY}"),
        "{card}"
    );
    // Plain HTTP on the TLS port is refused, not served.
    assert!(
        invoke_at(&reqwest::Client::new(), &format!("http://{addr}"), "SO-plain")
            .await
            .is_err()
    );
    // A client that trusts another CA refuses the router.
    assert!(invoke_at(&client_trusting(&new_ca.ca_file), &https, "SO-2")
        .await
        .is_err());

    // New files: new connections get the new certificate, without a restart.
    install(&new_ca.server("router"), &live);
    let switched = eventually(Duration::from_secs(30), || {
        let https = https.clone();
        let ca = new_ca.ca_file.clone();
        async move { matches!(invoke_at(&client_trusting(&ca), &https, "SO-3").await, Ok((200, _))) }
    })
    .await;
    assert!(switched, "the router never served the new certificate");
    assert!(invoke_at(&client_trusting(&old_ca.ca_file), &https, "SO-4")
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_over_tls_is_watched_over_grpc_with_tls() {
    let pki = Pki::new("control");
    let cluster = Cluster::start().await;
    // A second registry on the same etcd, serving TLS.
    let cert = pki.server("registry");
    let mut settings = agent_reach_registry::Settings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        store: agent_reach_registry::StoreChoice::Etcd(vec![cluster.etcd.endpoint()]),
        acl: cluster.acl_path.clone(),
        auth: agent_reach_access::AuthConfig::Hs256SecretFile(cluster.secret_path.clone()),
        listener_tls: None,
        service: agent_reach_registry::RegistryConfig::default(),
    };
    settings.service.ttl.min_s = 2;
    let files = ServerFiles {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_ca: None,
    };
    let (_registry, registry_addr): (Process, SocketAddr) = Process::spawn(move || async move {
        let service = agent_reach_registry::build(&settings).await.expect("registry build");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let tls = agent_reach_serving::tls::ServerTls::load(files).expect("registry TLS");
        tokio::spawn(agent_reach_registry::serve_tls(
            listener,
            service,
            Some(tls),
            std::future::pending(),
        ));
        addr
    });
    let registry = format!("https://localhost:{}", registry_addr.port());
    let client = client_trusting(&pki.ca_file);
    let ready = eventually(Duration::from_secs(10), || {
        let (client, url) = (client.clone(), format!("{registry}/readyz"));
        async move { matches!(client.get(url).send().await, Ok(response) if response.status().is_success()) }
    })
    .await;
    assert!(ready, "the TLS registry never answered /readyz over https");
    // An agent registers over https; a router watches the registry over gRPC with TLS.
    let mut spec = AgentSpec::new("via-tls-1", 1, Behaviour::Echo);
    spec.registry_ca = Some(pki.ca_file.clone());
    let _agent = Agent::start(&registry, spec);
    let (router, addr) = cluster
        .another_router(|settings| {
            settings.registry = vec![registry.clone()];
            settings.registry_tls.ca = Some(pki.ca_file.clone());
        })
        .await;
    wait_routable(&router, "via-tls-1").await;
    let (status, body) = invoke_at(&reqwest::Client::new(), &format!("http://{addr}"), "SO-1")
        .await
        .expect("router answers");
    assert_eq!(status, 200, "{body}");
    // The same registry URL without the CA: the router refuses to trust it,
    // keeps retrying (loudly) and never learns the instance.
    let (untrusting, untrusting_addr) = cluster
        .another_router(|settings| settings.registry = vec![registry.clone()])
        .await;
    let metrics_url = format!("http://{untrusting_addr}/metrics");
    let retried = eventually(Duration::from_secs(20), || {
        let url = metrics_url.clone();
        async move {
            let Ok(response) = reqwest::get(url).await else {
                return false;
            };
            let text = response.text().await.unwrap_or_default();
            text.lines()
                .find_map(|line| line.strip_prefix("agent_reach_router_watch_reconnects_total "))
                .and_then(|count| count.trim().parse::<u64>().ok())
                .is_some_and(|attempts| attempts >= 2)
        }
    })
    .await;
    assert!(retried, "the untrusting router never retried its watch");
    assert!(
        untrusting.routed_agent_ids().is_empty(),
        "it learnt instances from an untrusted registry"
    );
    // Not ready: it never had a snapshot.
    let readyz = reqwest::get(format!("http://{untrusting_addr}/readyz"))
        .await
        .expect("readyz");
    assert_eq!(readyz.status().as_u16(), 503);
}
