//! Test support for the router's integration tests: a real etcd (testkit), a
//! real registry and real HTTP test agents, each agent and the registry on its
//! own runtime so a test can kill it outright (every socket and task dropped,
//! like `kill -9`), and the router in-process on the test's runtime.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_router::Router;
use agent_reach_testkit::Etcd;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::Notify;

pub const SECRET: &[u8] = b"router-tests-0123456789abcdef-0123456789";
pub const CALLER: &str = "tester";
pub const CAPABILITY: &str = "order.query";

/// Everyone may provide anything; `tester` may call anything; `ops` is an operator.
pub const ACL: &str = r#"version: 1
operators: [ops]
permissions:
  - caller: tester
    allow: ["*"]
providers:
  - agent: "*"
    provides: ["*"]
"#;

pub fn order_schema() -> Value {
    json!({
        "type": "object",
        "required": ["order_id"],
        "properties": { "order_id": { "type": "string" }, "count": { "type": "integer", "minimum": 1 } }
    })
}

pub fn token(name: &str) -> String {
    agent_reach_testkit::hs256_token(name, SECRET)
}

/// A token for `name` with a `tenant` claim (`None`: no claim, the `default` tenant).
pub fn tenant_token(name: &str, tenant: Option<&str>) -> String {
    agent_reach_access::token::issue_hs256_for(name, tenant, SECRET, Duration::from_secs(3600)).expect("token")
}

pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

pub use agent_reach_testkit::{eventually, Isolated as Process};

// === Registry ===

#[derive(clap::Parser)]
struct RegistryCli {
    #[command(flatten)]
    args: agent_reach_registry::RegistryArgs,
}

/// The real registry, isolated (killable like a process).
pub type Registry = agent_reach_testkit::RegistryProcess;

/// Starts the registry on `etcd` with the tests' secret and ACL files (on `addr`, or a free port).
pub fn start_registry(etcd: &str, secret: &Path, acl: &Path, addr: Option<SocketAddr>) -> Registry {
    let listen = addr
        .map(|addr| addr.to_string())
        .unwrap_or_else(|| "127.0.0.1:0".to_string());
    start_registry_with(etcd, secret, acl, &["--listen", &listen])
}

/// Starts a registry serving `tenant` (its `--tenant`) on a free port.
pub fn start_tenant_registry(etcd: &str, secret: &Path, acl: &Path, tenant: &str) -> Registry {
    start_registry_with(etcd, secret, acl, &["--listen", "127.0.0.1:0", "--tenant", tenant])
}

/// A registry serving every tenant of the tenant map at `map` (home: `default`).
pub fn start_mapped_registry(etcd: &str, secret: &Path, acl: &Path, map: &Path) -> Registry {
    let map = map.to_str().expect("utf-8 path");
    start_registry_with(etcd, secret, acl, &["--listen", "127.0.0.1:0", "--tenant-map", map])
}

pub fn start_registry_with(etcd: &str, secret: &Path, acl: &Path, extra: &[&str]) -> Registry {
    use clap::Parser;
    let mut args = vec![
        "registry",
        "--etcd",
        etcd,
        "--acl",
        acl.to_str().expect("utf-8 path"),
        "--auth-hs256-secret-file",
        secret.to_str().expect("utf-8 path"),
        "--min-ttl-s",
        "2",
    ];
    args.extend_from_slice(extra);
    let cli = RegistryCli::parse_from(args);
    Registry::start(cli.args.validate().expect("registry settings"))
}

// === Test agents ===

#[derive(Clone)]
pub enum Behaviour {
    /// `200 {"output": {"agent_id", "echo": payload}}`.
    Echo,
    /// A business error: `422 {"error": {"code": "ORDER_NOT_FOUND"}}`.
    BusinessError,
    /// Never answers until released (or 60 s).
    Hang,
    /// Answers 503 (instance unavailable).
    Unavailable,
    /// Answers 429 (overloaded: try another instance).
    TooMany,
    /// Refuses the router's assertion: `401 UNAUTHENTICATED` (as an SDK agent
    /// does when the assertion expired in transit), without running the call.
    RefuseAssertion,
    /// Echoes after working for a while.
    Slow(Duration),
    /// Streams server-sent events: `event: token` `{"n": 1}`, then holds the
    /// stream open until released, then `{"n": 2}` and ends.
    StreamHeld,
    /// Asked for events, streams `{"n": 1}` and `{"n": 2}`, then ends;
    /// otherwise answers as [`Behaviour::Echo`].
    Stream,
    /// Streams `{"n": 1}`, then `event: error` with the agent's code.
    StreamThenError,
    /// Streams `{"n": 1}`, then (once released) cuts the connection inside the answer.
    StreamThenBreak,
    /// Streams `event: token` events without a pause and never ends (until the router cuts it).
    StreamFlood,
    /// `202 Accepted`, empty body: the test reports the result as the agent.
    Accept,
}

pub struct AgentSpec {
    pub agent_id: String,
    pub weight: u32,
    pub version: String,
    pub status: String,
    pub ttl_s: u32,
    pub behaviour: Behaviour,
    pub tags: Value,
    /// The capability's `output_schema` (none: answers are not described).
    pub output_schema: Option<Value>,
    /// The registration's `check_output` (none: left to the default, checked).
    pub check_output: Option<bool>,
    /// Serve `https://` with this certificate (none: plain `http://`).
    pub tls: Option<AgentTls>,
    /// Trust this CA for an `https://` registry (none: the system's roots).
    pub registry_ca: Option<PathBuf>,
    /// The tenant claim of the agent's registry token (none: `default`).
    pub tenant: Option<String>,
}

/// An agent's TLS: its certificate, and the CA its clients' certificates
/// must chain to (mutual TLS) when set.
#[derive(Clone)]
pub struct AgentTls {
    pub cert: agent_reach_testkit::pki::CertFiles,
    pub client_ca: Option<PathBuf>,
}

impl AgentSpec {
    pub fn new(agent_id: &str, weight: u32, behaviour: Behaviour) -> Self {
        Self {
            agent_id: agent_id.to_string(),
            weight,
            version: "1.0.0".to_string(),
            status: "ready".to_string(),
            // Long enough that a loaded CI machine never loses a healthy agent's lease.
            ttl_s: 10,
            behaviour,
            tags: json!({}),
            output_schema: None,
            check_output: None,
            tls: None,
            registry_ca: None,
            tenant: None,
        }
    }
}

/// What an agent saw.
#[derive(Default)]
pub struct Seen {
    pub hits: AtomicUsize,
    /// Deliveries per request id (tests of "each task ran once").
    pub by_request: Mutex<std::collections::HashMap<String, usize>>,
    pub last_envelope: Mutex<Option<Value>>,
    pub last_traceparent: Mutex<Option<String>>,
    /// The `Accept` header of the last delivery.
    pub last_accept: Mutex<Option<String>>,
    /// The `Authorization` header (the router's assertion) of the last delivery.
    pub last_authorization: Mutex<Option<String>>,
    /// Streams whose answer was dropped before it ended (the router cut the connection).
    pub streams_cancelled: AtomicUsize,
    /// Streams that ran to their end.
    pub streams_finished: AtomicUsize,
    /// `Slow` calls working now, and the most at once.
    pub working: AtomicUsize,
    pub most_working: AtomicUsize,
}

/// Marks a streamed answer cancelled when dropped before it finished.
struct StreamWatch {
    seen: Arc<Seen>,
    finished: bool,
}

impl StreamWatch {
    /// The answer ran to its end (counted when dropped here).
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        let counter = if self.finished {
            &self.seen.streams_finished
        } else {
            &self.seen.streams_cancelled
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// A streamed answer: `first`, then (after `release`, when given) `then`, each an SSE event.
fn stream_answer(seen: Arc<Seen>, release: Option<Arc<Notify>>, then: Option<Result<String, ()>>) -> Response {
    let watch = StreamWatch { seen, finished: false };
    let events = futures::stream::unfold((0u8, watch, release, then), |(step, watch, release, then)| async move {
        match step {
            0 => Some((
                Ok::<_, std::io::Error>(axum::body::Bytes::from("event: token\ndata: {\"n\":1}\n\n")),
                (1, watch, release, then),
            )),
            1 => {
                if let Some(release) = &release {
                    release.notified().await;
                }
                match then.clone() {
                    Some(Ok(event)) => Some((Ok(axum::body::Bytes::from(event)), (2, watch, release, then))),
                    Some(Err(())) => Some((Err(std::io::Error::other("cut")), (3, watch, release, then))),
                    None => {
                        watch.finish();
                        None
                    }
                }
            }
            2 => {
                watch.finish();
                None
            }
            _ => None,
        }
    });
    (
        [(http::header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(events),
    )
        .into_response()
}

fn accepts_events(headers: &HeaderMap) -> bool {
    headers
        .get("accept")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"))
}

struct AgentState {
    agent_id: String,
    behaviour: Behaviour,
    seen: Arc<Seen>,
    release: Arc<Notify>,
}

pub struct Agent {
    process: Process,
    pub agent_id: String,
    pub addr: SocketAddr,
    pub lease: i64,
    pub seen: Arc<Seen>,
    pub release: Arc<Notify>,
}

async fn handle(State(state): State<Arc<AgentState>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    state.seen.hits.fetch_add(1, Ordering::SeqCst);
    let envelope: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Some(request_id) = envelope["request_id"].as_str() {
        *state
            .seen
            .by_request
            .lock()
            .unwrap()
            .entry(request_id.to_string())
            .or_default() += 1;
    }
    *state.seen.last_envelope.lock().unwrap() = Some(envelope.clone());
    *state.seen.last_traceparent.lock().unwrap() = headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    *state.seen.last_accept.lock().unwrap() = headers
        .get("accept")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    *state.seen.last_authorization.lock().unwrap() = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    match state.behaviour {
        Behaviour::StreamHeld => stream_answer(
            state.seen.clone(),
            Some(state.release.clone()),
            Some(Ok("event: token\ndata: {\"n\":2}\n\n".to_string())),
        ),
        Behaviour::Stream if accepts_events(&headers) => stream_answer(
            state.seen.clone(),
            None,
            Some(Ok("event: token\ndata: {\"n\":2}\n\n".to_string())),
        ),
        Behaviour::StreamThenError => stream_answer(
            state.seen.clone(),
            None,
            Some(Ok(
                "event: error\ndata: {\"code\":\"MODEL_OVERLOADED\",\"message\":\"the model gave up\"}\n\n".to_string(),
            )),
        ),
        Behaviour::StreamThenBreak => stream_answer(state.seen.clone(), Some(state.release.clone()), Some(Err(()))),
        Behaviour::StreamFlood => {
            let watch = StreamWatch {
                seen: state.seen.clone(),
                finished: false,
            };
            let events = futures::stream::unfold((0u64, watch), |(n, watch)| async move {
                let event = format!("event: token\ndata: {{\"n\":{n}}}\n\n");
                Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(event)), (n + 1, watch)))
            });
            (
                [(http::header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(events),
            )
                .into_response()
        }
        Behaviour::Echo | Behaviour::Stream => axum::Json(json!({
            "output": { "agent_id": state.agent_id, "echo": envelope["payload"] }
        }))
        .into_response(),
        Behaviour::BusinessError => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({ "error": { "code": "ORDER_NOT_FOUND", "message": "no such order" } })),
        )
            .into_response(),
        Behaviour::Hang => {
            tokio::select! {
                _ = state.release.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            }
            axum::Json(json!({ "output": { "agent_id": state.agent_id } })).into_response()
        }
        Behaviour::Slow(work) => {
            let now = state.seen.working.fetch_add(1, Ordering::SeqCst) + 1;
            state.seen.most_working.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(work).await;
            state.seen.working.fetch_sub(1, Ordering::SeqCst);
            axum::Json(json!({ "output": { "agent_id": state.agent_id, "echo": envelope["payload"] } })).into_response()
        }
        Behaviour::Accept => StatusCode::ACCEPTED.into_response(),
        Behaviour::RefuseAssertion => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({ "error": { "code": "UNAUTHENTICATED", "message": "the assertion has expired" } })),
        )
            .into_response(),
        Behaviour::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "error": { "code": "BUSY", "message": "not now" } })),
        )
            .into_response(),
        Behaviour::TooMany => (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({ "error": { "code": "SLOW_DOWN", "message": "too many" } })),
        )
            .into_response(),
    }
}

impl Agent {
    /// Starts the agent's HTTP server, registers it and keeps its lease alive.
    pub fn start(registry: &str, spec: AgentSpec) -> Self {
        let seen = Arc::new(Seen::default());
        let release = Arc::new(Notify::new());
        let registry = registry.to_string();
        let agent_id = spec.agent_id.clone();
        let (state_seen, state_release) = (seen.clone(), release.clone());
        let (process, (addr, lease)) = Process::spawn(move || async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("agent bind");
            let addr = listener.local_addr().expect("addr");
            let state = Arc::new(AgentState {
                agent_id: spec.agent_id.clone(),
                behaviour: spec.behaviour.clone(),
                seen: state_seen,
                release: state_release,
            });
            let app = axum::Router::new()
                .route("/invoke", axum::routing::post(handle))
                .with_state(state);
            match &spec.tls {
                None => {
                    tokio::spawn(async move { axum::serve(listener, app).await });
                }
                Some(tls) => {
                    // The services' own TLS front door, with no hot routes.
                    let tls = agent_reach_serving::tls::ServerTls::load(agent_reach_serving::tls::ServerFiles {
                        cert: tls.cert.cert.clone(),
                        key: tls.cert.key.clone(),
                        client_ca: tls.client_ca.clone(),
                    })
                    .expect("agent TLS");
                    let door = agent_reach_serving::front::Door {
                        hot: agent_reach_serving::front::NoHotRoutes,
                        app,
                        body_limit: 1 << 20,
                        tls: Some(tls),
                    };
                    tokio::spawn(door.serve(listener, std::future::pending()));
                }
            }
            let client = registry_client(spec.registry_ca.as_deref());
            let lease = register(&client, &registry, &spec, addr).await;
            tokio::spawn(heartbeat(
                client,
                registry,
                spec.agent_id.clone(),
                lease,
                (spec.ttl_s, spec.tenant.clone()),
            ));
            (addr, lease)
        });
        Self {
            process,
            agent_id,
            addr,
            lease,
            seen,
            release,
        }
    }

    pub fn hits(&self) -> usize {
        self.seen.hits.load(Ordering::SeqCst)
    }

    /// Drops the agent's server, connections and heartbeats at once (as `kill -9` would).
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// The agent's name (its tokens' subject): `echo-1` → `echo`.
pub fn agent_name(agent_id: &str) -> String {
    agent_id.split('-').next().unwrap_or(agent_id).to_string()
}

/// A client for the registry, trusting `ca` (PEM) when given.
pub fn registry_client(ca: Option<&Path>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).expect("read CA");
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("CA PEM"));
    }
    builder.build().expect("client")
}

async fn register(client: &reqwest::Client, registry: &str, spec: &AgentSpec, addr: SocketAddr) -> i64 {
    let mut body = json!({
        "agent_id": spec.agent_id,
        "name": agent_name(&spec.agent_id),
        "endpoint": format!("{}://{addr}/invoke", if spec.tls.is_some() { "https" } else { "http" }),
        "weight": spec.weight,
        "ttl_s": spec.ttl_s,
        "status": spec.status,
        "tags": spec.tags,
        "capabilities": [{
            "name": CAPABILITY,
            "version": spec.version,
            "input_schema": order_schema(),
            "timeout_ms": 10_000
        }]
    });
    if let Some(schema) = &spec.output_schema {
        body["capabilities"][0]["output_schema"] = schema.clone();
    }
    if let Some(check) = spec.check_output {
        body["capabilities"][0]["check_output"] = json!(check);
    }
    let response = client
        .post(format!("{registry}/v1/agents"))
        .bearer_auth(tenant_token(&agent_name(&spec.agent_id), spec.tenant.as_deref()))
        .json(&body)
        .send()
        .await
        .expect("register request");
    let status = response.status();
    let answer: Value = response.json().await.expect("register answer");
    assert_eq!(status, reqwest::StatusCode::CREATED, "registration refused: {answer}");
    answer["lease_id"].as_i64().expect("lease_id")
}

async fn heartbeat(
    client: reqwest::Client,
    registry: String,
    agent_id: String,
    lease: i64,
    (ttl_s, tenant): (u32, Option<String>),
) {
    let every = Duration::from_millis(u64::from(ttl_s) * 1000 / 3);
    loop {
        tokio::time::sleep(every).await;
        // Failures (registry down) are tolerated: the lease outlives short outages.
        let _ = client
            .put(format!("{registry}/v1/agents/{agent_id}/heartbeat"))
            .bearer_auth(tenant_token(&agent_name(&agent_id), tenant.as_deref()))
            .json(&json!({ "lease_id": lease }))
            .send()
            .await;
    }
}

/// Reports a new status with a heartbeat, as an agent does when it gets busy or drains.
pub async fn set_status(registry: &str, agent: &Agent, status: &str) {
    let response = reqwest::Client::new()
        .put(format!("{registry}/v1/agents/{}/heartbeat", agent.agent_id))
        .bearer_auth(token(&agent_name(&agent.agent_id)))
        .json(&json!({ "lease_id": agent.lease, "status": status }))
        .send()
        .await
        .expect("heartbeat");
    assert!(response.status().is_success(), "status change: {}", response.status());
}

/// Graceful deregistration through the registry.
pub async fn deregister(registry: &str, agent_id: &str) {
    let response = reqwest::Client::new()
        .delete(format!("{registry}/v1/agents/{agent_id}"))
        .bearer_auth(token(&agent_name(agent_id)))
        .send()
        .await
        .expect("deregister");
    assert!(response.status().is_success(), "deregister: {}", response.status());
}

// === The whole cluster ===

pub struct Cluster {
    pub etcd: Etcd,
    pub registry: Registry,
    pub router: Router,
    pub router_addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub acl_path: PathBuf,
    pub secret_path: PathBuf,
    pub client: reqwest::Client,
}

impl Cluster {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts etcd, the registry and the router; `tune` adjusts router settings.
    pub async fn start_with(tune: impl FnOnce(&mut agent_reach_router::Settings)) -> Self {
        Self::start_with_acl(ACL, tune).await
    }

    /// [`Cluster::start_with`], the registry and router following `acl` as their `acl.yaml`.
    pub async fn start_with_acl(acl: &str, tune: impl FnOnce(&mut agent_reach_router::Settings)) -> Self {
        let etcd = Etcd::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let secret_path = dir.path().join("hs256.secret");
        std::fs::write(&secret_path, SECRET).expect("secret");
        let acl_path = dir.path().join("acl.yaml");
        std::fs::write(&acl_path, acl).expect("acl");
        let registry = start_registry(&etcd.endpoint(), &secret_path, &acl_path, None);
        let mut settings = agent_reach_router::Settings::new(
            "127.0.0.1:0".parse().expect("addr"),
            registry.url(),
            AuthConfig::Hs256SecretFile(secret_path.clone()),
            acl_path.clone(),
        );
        settings.tuning.breaker_open = Duration::from_millis(300);
        tune(&mut settings);
        let router = agent_reach_router::build(&settings).await.expect("router build");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("router bind");
        let router_addr = listener.local_addr().expect("addr");
        tokio::spawn(agent_reach_router::serve(
            listener,
            router.clone(),
            std::future::pending(),
        ));
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .expect("client");
        Self {
            etcd,
            registry,
            router,
            router_addr,
            dir,
            acl_path,
            secret_path,
            client,
        }
    }

    pub fn agent(&self, spec: AgentSpec) -> Agent {
        Agent::start(&self.registry.url(), spec)
    }

    /// Another router on this cluster's registry, ACL and secret, with
    /// `tune` applied to its settings; answers it and its address.
    pub async fn another_router(&self, tune: impl FnOnce(&mut agent_reach_router::Settings)) -> (Router, SocketAddr) {
        let mut settings = agent_reach_router::Settings::new(
            "127.0.0.1:0".parse().expect("addr"),
            self.registry.url(),
            AuthConfig::Hs256SecretFile(self.secret_path.clone()),
            self.acl_path.clone(),
        );
        tune(&mut settings);
        let router = agent_reach_router::build(&settings).await.expect("router build");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("router bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(agent_reach_router::serve(
            listener,
            router.clone(),
            std::future::pending(),
        ));
        (router, addr)
    }

    /// Waits until the router's snapshot holds exactly `ids`.
    pub async fn wait_for_instances(&self, ids: &[&str]) {
        let mut expected: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        expected.sort();
        let router = self.router.clone();
        let ok = eventually(Duration::from_secs(20), || {
            let router = router.clone();
            let expected = expected.clone();
            async move { router.routed_agent_ids() == expected }
        })
        .await;
        assert!(
            ok,
            "router snapshot never became {expected:?}; it is {:?}",
            self.router.routed_agent_ids()
        );
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.router_addr)
    }

    /// POSTs an envelope as `CALLER`; returns (status, body).
    pub async fn invoke(&self, envelope: Value) -> (u16, Value) {
        self.invoke_as(Some(&token(CALLER)), envelope).await
    }

    pub async fn invoke_as(&self, token: Option<&str>, envelope: Value) -> (u16, Value) {
        invoke_at(&self.client, self.router_addr, token, &envelope).await
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }
}

/// POSTs `body` to `path` as `CALLER`; returns (status, JSON answer).
/// `POST /v1/invoke` on the router at `router` (this cluster's or another).
pub async fn invoke_at(
    client: &reqwest::Client,
    router: SocketAddr,
    token: Option<&str>,
    envelope: &Value,
) -> (u16, Value) {
    let mut request = client.post(format!("http://{router}/v1/invoke")).json(envelope);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("invoke request");
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON result envelope");
    (status, body)
}

pub async fn post(cluster: &Cluster, path: &str, body: Value) -> (u16, Value) {
    let response = cluster
        .client
        .post(cluster.url(path))
        .bearer_auth(token(CALLER))
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// GETs `path` as `CALLER`; returns (status, JSON answer).
pub async fn get(cluster: &Cluster, path: &str) -> (u16, Value) {
    let response = cluster
        .client
        .get(cluster.url(path))
        .bearer_auth(token(CALLER))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Every key in `redis`, as `redis-cli --scan` lists them (tests check where state landed).
pub fn redis_keys(redis: &agent_reach_testkit::Redis) -> Vec<String> {
    let output = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "--scan"])
        .output()
        .expect("redis-cli");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

pub const CALLBACK_SECRET: &[u8] = b"callback-secret-0123456789abcdef-0123";

/// A cluster whose router takes tasks (`/v1/tasks`) on `redis`, with fast
/// callback retries and loopback callback targets allowed.
pub async fn cluster_with_tasks(redis: &agent_reach_testkit::Redis) -> Cluster {
    let url = redis.url();
    Cluster::start_with(move |settings| settings.tasks = Some(tasks_settings(url))).await
}

/// The slow path on the Redis at `url`, with fast callback retries and
/// loopback callback targets allowed.
pub fn tasks_settings(url: String) -> agent_reach_router::TasksSettings {
    let mut callbacks = agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec());
    callbacks.allow_private_targets = true; // receivers run on loopback
    callbacks.schedule = [100, 200, 400, 800].map(Duration::from_millis).to_vec();
    agent_reach_router::TasksSettings {
        redis: url,
        store: agent_reach_task_store::StoreConfig::default(),
        callbacks,
        workers: 16,
        reclaim_after: Duration::from_secs(30),
        max_task_attempts: 3,
        quota_share: Some(std::time::Duration::from_millis(100)),
        trail: None,
        tag_limits: Vec::new(),
    }
}

pub fn order(payload_id: &str) -> Value {
    json!({ "capability": CAPABILITY, "payload": { "order_id": payload_id } })
}
