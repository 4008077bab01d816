//! The real stack for the SDK's load and client suites: etcd and Redis from
//! `testkit`, the registry, one or more routers (tasks on, over Redis) and the
//! context service, served in-process on free loopback ports; and SDK agents
//! started against it.

#![allow(dead_code)] // each suite uses part of it

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{Agent, AgentBuilder};
use agent_reach_testkit::{Etcd, Redis};
use serde_json::{json, Value};

pub const SECRET: &str = "sdk-test-secret-sdk-test-secret-0123456789";
pub const CALLBACK_SECRET: &[u8] = b"sdk-callback-secret-sdk-callback-secret-01";
pub const ACL: &str = r#"
version: 1
permissions:
  - caller: tester
    allow: [demo.*]
  - caller: echo_agent
    allow: [demo.*]
providers:
  - agent: echo_agent
    provides: [demo.*, audit.*]
owners:
  - capability: audit.*
    approvers: [owner]
context:
  - agent: tester
    read: ["*"]
    write: [topic]
  - agent: echo_agent
    read: ["*"]
    write: ["*"]
"#;

pub fn token(name: &str) -> String {
    agent_reach_testkit::hs256_token(name, SECRET.as_bytes())
}

pub struct Stack {
    _etcd: Etcd,
    _redis: Redis,
    dir: tempfile::TempDir,
    pub registry: String,
    pub routers: Vec<String>,
    pub context: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve_on_free_port<F, Fut>(serve: F) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, tokio::spawn(serve(listener)))
}

impl Stack {
    /// etcd, Redis, a registry, `routers` routers (each with tasks on) and a context service.
    pub async fn start(routers: usize) -> Self {
        Self::start_with(routers, ACL, |_, _| {}).await
    }

    /// [`Stack::start`] with the policy `acl`, each router's settings
    /// adjusted by `configure(index, settings)` before it is built.
    pub async fn start_with(
        routers: usize,
        acl_text: &str,
        configure: impl Fn(usize, &mut agent_reach_router::Settings),
    ) -> Self {
        let etcd = Etcd::start();
        let redis = Redis::start();
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, SECRET).unwrap();
        let acl = dir.path().join("acl.yaml");
        std::fs::write(&acl, acl_text).unwrap();
        let auth = AuthConfig::Hs256SecretFile(secret.clone());
        let mut tasks = Vec::new();

        let registry_settings = agent_reach_registry::Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            store: agent_reach_registry::StoreChoice::Etcd(vec![etcd.endpoint()]),
            acl: acl.clone(),
            auth: auth.clone(),
            listener_tls: None,
            service: agent_reach_registry::RegistryConfig {
                ttl: agent_reach_registry::TtlBounds {
                    min_s: 1,
                    max_s: 300,
                    default_s: 15,
                },
                ..Default::default()
            },
        };
        let registry = agent_reach_registry::build(&registry_settings).await.unwrap();
        let (registry_addr, task) = serve_on_free_port(|listener| async move {
            let _ = agent_reach_registry::serve(listener, registry, std::future::pending()).await;
        })
        .await;
        tasks.push(task);
        let registry_url = format!("http://{registry_addr}");

        let mut router_urls = Vec::new();
        // Replicas share one signing key: agents verify every router's assertions with router 0's keys.
        let signing = std::sync::Arc::new(agent_reach_access::assertion::AssertionKey::generate().unwrap().0);
        for index in 0..routers {
            let mut settings = agent_reach_router::Settings::new(
                "127.0.0.1:0".parse().unwrap(),
                registry_url.clone(),
                auth.clone(),
                acl.clone(),
            );
            settings.assertion.signing = agent_reach_router::SigningKey::Key(signing.clone());
            let mut callbacks = agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec());
            callbacks.allow_private_targets = true;
            settings.tasks = Some(agent_reach_router::TasksSettings {
                redis: redis.url(),
                store: agent_reach_task_store::StoreConfig::default(),
                callbacks,
                workers: 8,
                reclaim_after: Duration::from_secs(120),
                max_task_attempts: 3,
                quota_share: Some(std::time::Duration::from_millis(100)),
                trail: None,
                tag_limits: Vec::new(),
            });
            configure(index, &mut settings);
            let router = agent_reach_router::build(&settings).await.unwrap();
            let (addr, task) = serve_on_free_port(|listener| async move {
                let _ = agent_reach_router::serve(listener, router, std::future::pending()).await;
            })
            .await;
            tasks.push(task);
            router_urls.push(format!("http://{addr}"));
        }

        let context_settings = agent_reach_context::Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: 1,
            store: agent_reach_context::StoreChoice::redis(
                &redis.url(),
                agent_reach_context::store::Namespace {
                    prefix: "agent-reach".to_string(),
                    tenant: "default".to_string(),
                },
                Duration::from_secs(2),
            )
            .unwrap(),
            acl,
            auth,
            listener_tls: None,
            service: agent_reach_context::ContextConfig::default(),
        };
        let context = agent_reach_context::build(&context_settings).await.unwrap();
        let (context_addr, task) = serve_on_free_port(|listener| async move {
            let _ = agent_reach_context::serve(listener, context, std::future::pending()).await;
        })
        .await;
        tasks.push(task);

        Self {
            _etcd: etcd,
            _redis: redis,
            dir,
            registry: registry_url,
            routers: router_urls,
            context: format!("http://{context_addr}"),
            tasks,
        }
    }

    pub fn router(&self) -> &str {
        &self.routers[0]
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An `echo_agent` instance wired to the stack (router 0, context service), TTL 3 s.
    pub fn agent(&self, agent_id: &str) -> AgentBuilder {
        Agent::builder("echo_agent", agent_id)
            .registry(&self.registry)
            .router(self.router())
            .context_service(&self.context)
            .token(token("echo_agent"))
            .ttl_s(3)
    }

    /// `GET /v1/agents/{agent_id}` on the registry (`Null` when absent).
    pub async fn instance(&self, agent_id: &str) -> Value {
        let response = reqwest::Client::new()
            .get(format!("{}/v1/agents/{agent_id}", self.registry))
            .bearer_auth(token("tester"))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            response.json().await.unwrap()
        } else {
            Value::Null
        }
    }

    /// The ids the registry resolves `capability` to (routable instances).
    pub async fn resolvable(&self, capability: &str) -> Vec<String> {
        let response = reqwest::Client::new()
            .get(format!("{}/v1/capabilities/{capability}", self.registry))
            .bearer_auth(token("tester"))
            .send()
            .await
            .unwrap();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let mut ids: Vec<String> = body["instances"]
            .as_array()
            .map(|instances| {
                instances
                    .iter()
                    .filter_map(|instance| instance["agent_id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// `POST /v1/invoke` on `router` as `tester`: (HTTP status, result envelope).
    pub async fn invoke_on(&self, router: &str, body: Value) -> (u16, Value) {
        self.invoke_as(router, "tester", &[], body).await
    }

    /// `POST /v1/invoke` on `router` as `caller`, with `headers`: (HTTP status, result envelope).
    pub async fn invoke_as(&self, router: &str, caller: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
        let mut request = reqwest::Client::new()
            .post(format!("{router}/v1/invoke"))
            .bearer_auth(token(caller))
            .json(&body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    pub async fn invoke(&self, capability: &str, payload: Value) -> (u16, Value) {
        self.invoke_on(
            self.router(),
            json!({"capability": capability, "payload": payload, "timeout_ms": 10_000}),
        )
        .await
    }
}
