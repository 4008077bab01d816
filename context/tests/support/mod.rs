//! Test support: the real context service on a loopback port, backed by a real
//! Redis (testkit) or the embedded store, with an HS256 secret, an ACL file and
//! HTTP and gRPC clients.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_context::store::Namespace;
use agent_reach_context::ContextConfig;
use agent_reach_context::{Settings, StoreChoice};
use agent_reach_proto::context::contexts_client::ContextsClient;
use agent_reach_testkit::Redis;
use serde_json::Value;

pub const SECRET: &str = "0123456789abcdef0123456789abcdef-context-tests";

/// The policy the tests run under: `intent_parser` writes and reads everything it
/// names, `reply_writer` reads three fields, `admin` may write (and close) anything,
/// `stranger` has no entry.
pub const ACL: &str = r#"
version: 1
context:
  - agent: intent_parser
    read: ["*"]
    write: [user_id, intent, order_status, internal, api_key, log, n, big, counter.*, f0, f1, f2, f3, f4, f5, f6, f7, f8, tick]
  - agent: reply_writer
    read: [user_id, intent, order_status]
  - agent: admin
    write: ["*"]
"#;

pub struct Harness {
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub redis: Option<Redis>,
    pub acl_path: PathBuf,
    _dir: tempfile::TempDir,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

pub fn token(name: &str) -> String {
    agent_reach_testkit::hs256_token(name, SECRET.as_bytes())
}

/// Limits small enough to hit in tests.
pub fn test_config() -> ContextConfig {
    let mut config = ContextConfig::default();
    config.policy.max_fields = 8;
    config.policy.max_context_bytes = 4096;
    config.max_field_bytes = 1024;
    config.max_body_bytes = 64 * 1024;
    config
}

impl Harness {
    pub async fn redis(config: ContextConfig) -> Self {
        Self::on_redis(Redis::start(), config).await
    }

    /// The service on a given (possibly stopped) Redis.
    pub async fn on_redis(redis: Redis, config: ContextConfig) -> Self {
        let store = StoreChoice::redis(
            &redis.url(),
            Namespace {
                prefix: "agent-reach-test".into(),
                tenant: "default".into(),
            },
            Duration::from_millis(500),
        )
        .unwrap();
        Self::start(config, store, Some(redis)).await
    }

    pub async fn embedded(config: ContextConfig) -> Self {
        Self::start(config, StoreChoice::Embedded, None).await
    }

    async fn start(config: ContextConfig, store: StoreChoice, redis: Option<Redis>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let secret_path = dir.path().join("secret");
        std::fs::write(&secret_path, SECRET).unwrap();
        let acl_path = dir.path().join("acl.yaml");
        std::fs::write(&acl_path, ACL).unwrap();
        let settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: 1,
            store,
            acl: acl_path.clone(),
            auth: AuthConfig::Hs256SecretFile(secret_path),
            listener_tls: None,
            service: config,
        };
        let service = agent_reach_context::build(&settings).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(agent_reach_context::serve(listener, service, async {
            let _ = stop.await;
        }));
        Self {
            addr,
            http: reqwest::Client::new(),
            redis,
            acl_path,
            _dir: dir,
            _shutdown: shutdown,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn grpc(&self) -> ContextsClient<tonic::transport::Channel> {
        ContextsClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    /// Sends `method path` as `agent` with an optional JSON body; returns status and JSON body.
    pub async fn call(&self, agent: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, self.url(path)).bearer_auth(token(agent));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn create(&self, agent: &str, body: Value) -> (u16, Value) {
        self.call(agent, reqwest::Method::POST, "/v1/contexts", Some(body))
            .await
    }

    pub async fn get(&self, agent: &str, id: &str) -> (u16, Value) {
        self.call(agent, reqwest::Method::GET, &format!("/v1/contexts/{id}"), None)
            .await
    }

    pub async fn patch(&self, agent: &str, id: &str, body: Value) -> (u16, Value) {
        self.call(agent, reqwest::Method::PATCH, &format!("/v1/contexts/{id}"), Some(body))
            .await
    }

    pub async fn close(&self, agent: &str, id: &str) -> (u16, Value) {
        self.call(agent, reqwest::Method::DELETE, &format!("/v1/contexts/{id}"), None)
            .await
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of one metric sample line (`name{labels}`), 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(sample).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or(0.0)
    }
}

/// A gRPC request carrying `agent`'s token.
pub fn grpc_request<T>(agent: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {}", token(agent)).parse().unwrap());
    request
}

/// The stable code a gRPC error carries.
pub fn grpc_code(status: &tonic::Status) -> String {
    status
        .metadata()
        .get("x-agent-reach-code")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

pub use agent_reach_testkit::eventually;
