//! The SDK over TLS on every link (issue 20): an SDK agent served over
//! `https://`, registered with a registry over gRPC with TLS, fetching the
//! router's keys and calling through it over `https://`, writing its session
//! context over gRPC with TLS, which keeps it in Redis over TLS; the router
//! verifies the agent's certificate.
//! Everything trusts one throwaway CA (`agent_reach_testkit::pki`); real etcd
//! and Redis.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{handler, Agent, Ctx, HandlerError, StartError};
use agent_reach_serving::tls::{ServerFiles, ServerTls};
use agent_reach_testkit::pki::{CertFiles, Pki};
use agent_reach_testkit::{eventually, Etcd, Redis};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

const SECRET: &str = "sdk-tls-secret-sdk-tls-secret-0123456789";
const ACL: &str = r#"
version: 1
permissions:
  - caller: tester
    allow: [tls.*]
  - caller: tls_agent
    allow: [tls.*]
providers:
  - agent: tls_agent
    provides: [tls.*]
context:
  - agent: tls_agent
    write: [seen]
  - agent: tester
    read: [seen]
"#;

fn token(name: &str) -> String {
    agent_reach_access::token::issue_hs256(name, SECRET.as_bytes(), Duration::from_secs(3600)).unwrap()
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Text {
    text: String,
}

/// Echo the text back.
#[handler(capability = "tls.echo", version = "1.0.0")]
async fn echo(_ctx: Ctx, input: Text) -> Result<Value, HandlerError> {
    Ok(json!({ "text": input.text }))
}

/// Calls `tls.echo` through the router and writes what came back to the session context.
#[handler(capability = "tls.relay", version = "1.0.0")]
async fn relay(ctx: Ctx, input: Text) -> Result<Value, HandlerError> {
    let echoed: Value = ctx.call("tls.echo", json!({ "text": input.text })).await?;
    ctx.context().patch().set("seen", &echoed["text"]).send().await?;
    Ok(json!({ "echoed": echoed }))
}

fn files(cert: &CertFiles) -> ServerFiles {
    ServerFiles {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_ca: None,
    }
}

async fn bind() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

fn client_trusting(ca: &Path) -> reqwest::Client {
    let pem = std::fs::read(ca).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_agent_works_with_tls_on_every_link() {
    let pki = Pki::new("sdk");
    let etcd = Etcd::start();
    let redis = Redis::start_tls(&pki);
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();
    let auth = AuthConfig::Hs256SecretFile(secret.clone());

    // Registry over TLS.
    let registry = agent_reach_registry::build(&agent_reach_registry::Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: agent_reach_registry::StoreChoice::Etcd(vec![etcd.endpoint()]),
        acl: acl.clone(),
        auth: auth.clone(),
        listener_tls: None,
        service: agent_reach_registry::RegistryConfig::default(),
    })
    .await
    .unwrap();
    let (listener, registry_addr) = bind().await;
    let tls = ServerTls::load(files(&pki.server("registry"))).unwrap();
    tokio::spawn(agent_reach_registry::serve_tls(
        listener,
        registry,
        Some(tls),
        std::future::pending(),
    ));
    let registry_url = format!("https://localhost:{}", registry_addr.port());

    // Context service over TLS, on Redis over TLS (with a client certificate).
    let redis_client = pki.client("context");
    let mut problems = Vec::new();
    let redis_tls = agent_reach_stores::TlsFiles::read(
        "--redis",
        Some(&pki.ca_file),
        Some(&redis_client.cert),
        Some(&redis_client.key),
        &mut problems,
    );
    assert!(problems.is_empty(), "{problems:?}");
    let context = agent_reach_context::build(&agent_reach_context::Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 1,
        store: agent_reach_context::StoreChoice::Redis {
            link: Box::new(
                agent_reach_stores::RedisLink::parse(&redis.url())
                    .unwrap()
                    .with_tls(redis_tls),
            ),
            namespace: agent_reach_context::store::Namespace {
                prefix: "agent-reach".to_string(),
                tenant: "default".to_string(),
            },
            timeout: Duration::from_secs(2),
        },
        acl: acl.clone(),
        auth: auth.clone(),
        listener_tls: None,
        service: agent_reach_context::ContextConfig::default(),
    })
    .await
    .unwrap();
    let (listener, context_addr) = bind().await;
    let tls = ServerTls::load(files(&pki.server("context"))).unwrap();
    tokio::spawn(agent_reach_context::serve_tls(
        listener,
        context,
        Some(tls),
        std::future::pending(),
    ));
    let context_url = format!("https://localhost:{}", context_addr.port());

    // Router over TLS, watching the registry over TLS, reaching agents over TLS.
    let mut settings =
        agent_reach_router::Settings::new("127.0.0.1:0".parse().unwrap(), registry_url.clone(), auth, acl);
    settings.listener_tls = Some(files(&pki.server("router")));
    settings.registry_tls.ca = Some(pki.ca_file.clone());
    settings.agent_tls.ca = Some(pki.ca_file.clone());
    let router = agent_reach_router::build(&settings).await.unwrap();
    let (listener, router_addr) = bind().await;
    tokio::spawn(agent_reach_router::serve(
        listener,
        router.clone(),
        std::future::pending(),
    ));
    let router_url = format!("https://localhost:{}", router_addr.port());

    // The agent: served over https, every service URL https, one CA trusted.
    let cert = pki.server("tls_agent-1");
    let agent = Agent::builder("tls_agent", "tls_agent-1")
        .registry(&registry_url)
        .router(&router_url)
        .context_service(&context_url)
        .ca_file(&pki.ca_file)
        .tls(&cert.cert, &cert.key)
        .token(token("tls_agent"))
        .handler(echo)
        .handler(relay)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    let routable = eventually(Duration::from_secs(20), || {
        let router = router.clone();
        async move { router.routed_agent_ids() == ["tls_agent-1"] }
    })
    .await;
    assert!(routable, "the agent never became routable over TLS");

    let client = client_trusting(&pki.ca_file);
    let created: Value = client
        .post(format!("{context_url}/v1/contexts"))
        .bearer_auth(token("tester"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let context_id = created["context_id"].as_str().expect("context_id").to_string();
    let answer = client
        .post(format!("{router_url}/v1/invoke"))
        .bearer_auth(token("tester"))
        .json(&json!({
            "capability": "tls.relay", "context_id": context_id, "session_id": "s-tls",
            "payload": { "text": "over tls" }, "timeout_ms": 10_000
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["output"]["echoed"]["text"], "over tls", "{body}");
    let read: Value = client
        .get(format!("{context_url}/v1/contexts/{context_id}"))
        .bearer_auth(token("tester"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["fields"]["seen"], "over tls", "{read}");

    // The SDK's Client over the same https links, trusting the same CA.
    let sdk_client = agent_reach_sdk::Client::new(&router_url, token("tester"))
        .unwrap()
        .ca_file(&pki.ca_file)
        .unwrap()
        .context_service(&context_url)
        .unwrap();
    let echoed: Value = sdk_client
        .invoke("tls.echo", json!({ "text": "client" }))
        .await
        .unwrap();
    assert_eq!(echoed, json!({ "text": "client" }));
    let seen = sdk_client.context(&context_id).get(&["seen"]).await.unwrap();
    assert_eq!(seen.fields["seen"], "over tls");
    // Without the CA the router's certificate is not trusted: refused, never sent in the clear.
    let untrusting = agent_reach_sdk::Client::new(&router_url, token("tester")).unwrap();
    let refused = untrusting
        .invoke::<Value>("tls.echo", json!({ "text": "x" }))
        .await
        .unwrap_err();
    assert_eq!(refused.code, "ROUTER_UNREACHABLE", "{refused}");
    agent.shutdown().await;
}

#[tokio::test]
async fn a_ca_file_that_is_not_pem_certificates_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let started = Agent::builder("tls_agent", "tls_agent-bad")
        .registry("https://localhost:1")
        .router("https://localhost:1")
        .ca_file(&bad)
        .token(token("tls_agent"))
        .handler(echo)
        .start()
        .await;
    match started {
        Err(StartError::Config(message)) => assert!(message.contains("ca.pem"), "{message}"),
        Err(other) => panic!("expected a configuration error, got {other}"),
        Ok(_) => panic!("an agent started with an unusable CA file"),
    }
    // A missing certificate file for the agent's own TLS too.
    let started = Agent::builder("tls_agent", "tls_agent-bad")
        .registry("https://localhost:1")
        .router("https://localhost:1")
        .tls(dir.path().join("missing.crt"), dir.path().join("missing.key"))
        .token(token("tls_agent"))
        .handler(echo)
        .start()
        .await;
    match started {
        Err(StartError::Config(message)) => assert!(message.contains("missing.crt"), "{message}"),
        Err(other) => panic!("expected a configuration error, got {other}"),
        Ok(_) => panic!("an agent started without its certificate"),
    }
}
