//! Shared test support: a registry served in-process on a free loopback port,
//! with a real HS256 secret, an ACL file on disk, and HTTP/gRPC clients.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use agent_reach_access::AuthConfig;
use agent_reach_proto::registry::registry_client::RegistryClient;
use agent_reach_registry::RegistryConfig;
use agent_reach_registry::TtlBounds;
use agent_reach_registry::{Settings, StoreChoice};
use agent_reach_testkit::RegistryProcess;
use serde_json::{json, Value};
use tonic::transport::Channel;

pub const SECRET: &str = "test-secret-test-secret-test-secret-0123456789";

pub const ACL: &str = r#"
version: 1
operators: [ops]
providers:
  - agent: order_query
    provides: [order.*]
  - agent: shipping_rules
    provides: [shipping.rules]
"#;

/// A registry on its own runtime thread ([`RegistryProcess`]), so that
/// [`TestRegistry::kill`] ends it the way a killed process ends: every task
/// and connection dies.
pub struct TestRegistry {
    pub addr: SocketAddr,
    pub acl_path: PathBuf,
    process: std::sync::Mutex<RegistryProcess>,
    _dir: Arc<tempfile::TempDir>,
    http: reqwest::Client,
}

impl TestRegistry {
    pub async fn start(store: StoreChoice) -> Self {
        Self::start_with_acl(store, ACL).await
    }

    /// A registry whose `acl.yaml` is `acl`.
    pub async fn start_with_acl(store: StoreChoice, acl: &str) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let acl_path = dir.path().join("acl.yaml");
        std::fs::write(&acl_path, acl).unwrap();
        Self::start_in(store, dir, acl_path).await
    }

    /// A second registry sharing this one's secret and ACL file.
    pub async fn sibling(&self, store: StoreChoice) -> Self {
        Self::start_in(store, self._dir.clone(), self.acl_path.clone()).await
    }

    async fn start_in(store: StoreChoice, dir: Arc<tempfile::TempDir>, acl_path: PathBuf) -> Self {
        let secret_path = dir.path().join("secret");
        std::fs::write(&secret_path, SECRET).unwrap();
        let settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            store,
            acl: acl_path.clone(),
            auth: AuthConfig::Hs256SecretFile(secret_path),
            listener_tls: None,
            service: RegistryConfig {
                tenant: "default".into(),
                tenant_map: None,
                ttl: TtlBounds {
                    min_s: 1,
                    max_s: 300,
                    default_s: 15,
                },
                max_body_bytes: 1024 * 1024,
                ..Default::default()
            },
        };
        let process = RegistryProcess::start(settings);
        Self {
            addr: process.addr,
            acl_path,
            process: std::sync::Mutex::new(process),
            _dir: dir,
            http: reqwest::Client::new(),
        }
    }

    /// Stops abruptly, as a killed process would: every connection drops.
    pub fn kill(&self) {
        self.process
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .kill();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn token(name: &str) -> String {
        agent_reach_testkit::hs256_token(name, SECRET.as_bytes())
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
        let mut request = self.http.post(self.url(path)).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        into_parts(request.send().await.unwrap()).await
    }

    pub async fn post_raw(&self, path: &str, token: &str, body: Vec<u8>) -> (u16, Value) {
        let request = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body);
        into_parts(request.send().await.unwrap()).await
    }

    pub async fn put(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        into_parts(
            self.http
                .put(self.url(path))
                .bearer_auth(token)
                .json(body)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        into_parts(self.http.get(self.url(path)).bearer_auth(token).send().await.unwrap()).await
    }

    pub async fn delete(&self, path: &str, token: &str) -> (u16, Value) {
        into_parts(
            self.http
                .delete(self.url(path))
                .bearer_auth(token)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn grpc(&self) -> RegistryClient<Channel> {
        RegistryClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    /// Agent ids of routable instances of `capability`, via HTTP.
    pub async fn resolved(&self, capability: &str) -> Vec<String> {
        let (status, body) = self
            .get(&format!("/v1/capabilities/{capability}"), &Self::token("reader"))
            .await;
        if status != 200 {
            return Vec::new();
        }
        body["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|instance| instance["agent_id"].as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn into_parts(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[allow(unused_imports)] // each test binary uses a different subset
pub use agent_reach_testkit::eventually as wait_for;

/// A registration body for `order_query` offering `order.query` 1.2.0.
pub fn registration(agent_id: &str, ttl_s: u32) -> Value {
    json!({
        "agent_id": agent_id,
        "name": "order_query",
        "endpoint": "http://127.0.0.1:9101/invoke",
        "weight": 3,
        "ttl_s": ttl_s,
        "status": "ready",
        "tags": {"team": "orders"},
        "capabilities": [{
            "name": "order.query",
            "version": "1.2.0",
            "description": "Look up an order",
            "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
            "timeout_ms": 2000
        }]
    })
}

pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}
