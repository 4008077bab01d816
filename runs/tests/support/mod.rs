//! The whole stack for the runs' suites: etcd and Redis (testkit), the real
//! registry, routers with the slow path on (each on its own runtime, so a
//! test can kill one as `kill -9` would), and Rust SDK agents; workflows
//! registered through the registry as an operator would.

#![allow(dead_code)] // each suite uses part of it

use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{Agent, AgentBuilder};
use agent_reach_testkit::{Etcd, Isolated, Redis};
use serde_json::{json, Value};

pub const SECRET: &str = "runs-test-secret-runs-test-secret-0123456789";
pub const CALLBACK_SECRET: &[u8] = b"runs-callback-secret-runs-callback-secret-01";
pub const ACL: &str = r#"
version: 1
operators: [ops]
permissions:
  - caller: tester
    allow: ["*"]
  - caller: limited
    allow: [shop.*]
providers:
  - agent: "*"
    provides: ["*"]
"#;

pub fn token(name: &str) -> String {
    agent_reach_testkit::hs256_token(name, SECRET.as_bytes())
}

pub use agent_reach_testkit::eventually;

/// A router on its own runtime: killed, its deliveries and connections vanish at once.
pub struct RouterProcess {
    pub url: String,
    process: Isolated,
}

impl RouterProcess {
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

pub struct Stack {
    _etcd: Etcd,
    pub redis: Redis,
    dir: tempfile::TempDir,
    registry: agent_reach_testkit::RegistryProcess,
    pub routers: Vec<RouterProcess>,
    signing: Arc<agent_reach_access::assertion::AssertionKey>,
    pub http: reqwest::Client,
}

/// How a test's routers are tuned.
#[derive(Clone)]
pub struct Tune {
    pub reclaim_after: Duration,
    pub runs: agent_reach_runs::RunSettings,
    pub workers: usize,
}

impl Default for Tune {
    fn default() -> Self {
        Self {
            reclaim_after: Duration::from_secs(30),
            runs: agent_reach_runs::RunSettings {
                check_after: Duration::from_secs(2),
                sweep_every: Duration::from_millis(200),
                lease: Duration::from_secs(5),
            },
            workers: 16,
        }
    }
}

impl Stack {
    pub async fn start(routers: usize) -> Self {
        Self::start_tuned(routers, Tune::default()).await
    }

    pub async fn start_tuned(routers: usize, tune: Tune) -> Self {
        let etcd = Etcd::start();
        let redis = Redis::start();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        std::fs::write(dir.path().join("acl.yaml"), ACL).unwrap();
        let registry = agent_reach_testkit::RegistryProcess::start(agent_reach_registry::Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            store: agent_reach_registry::StoreChoice::Etcd(vec![etcd.endpoint()]),
            acl: dir.path().join("acl.yaml"),
            auth: AuthConfig::Hs256SecretFile(dir.path().join("secret")),
            listener_tls: None,
            service: agent_reach_registry::RegistryConfig {
                ttl: agent_reach_registry::TtlBounds {
                    min_s: 1,
                    max_s: 300,
                    default_s: 15,
                },
                ..Default::default()
            },
        });
        let mut stack = Self {
            _etcd: etcd,
            redis,
            dir,
            registry,
            routers: Vec::new(),
            signing: Arc::new(agent_reach_access::assertion::AssertionKey::generate().unwrap().0),
            http: reqwest::Client::new(),
        };
        for _ in 0..routers {
            let router = stack.router_process(&tune);
            stack.routers.push(router);
        }
        stack
    }

    /// Another router on the same stores (replicas share one signing key).
    pub fn router_process(&self, tune: &Tune) -> RouterProcess {
        let mut settings = agent_reach_router::Settings::new(
            "127.0.0.1:0".parse().unwrap(),
            self.registry.url(),
            AuthConfig::Hs256SecretFile(self.dir.path().join("secret")),
            self.dir.path().join("acl.yaml"),
        );
        settings.assertion.signing = agent_reach_router::SigningKey::Key(self.signing.clone());
        let mut callbacks = agent_reach_task_store::CallbackConfig::new(CALLBACK_SECRET.to_vec());
        callbacks.allow_private_targets = true;
        settings.tasks = Some(agent_reach_router::TasksSettings {
            redis: self.redis.url(),
            store: agent_reach_task_store::StoreConfig::default(),
            callbacks,
            workers: tune.workers,
            reclaim_after: tune.reclaim_after,
            max_task_attempts: 3,
            quota_share: None,
            // The trail on (as by default), written every 20 ms: steps' records name their run.
            trail: Some(agent_reach_router::TrailConfig {
                settings: agent_reach_router::TrailSettings {
                    flush_every: Duration::from_millis(20),
                    ..Default::default()
                },
                credentials: Default::default(),
                otlp: None,
            }),
            tag_limits: Vec::new(),
        });
        settings.runs = tune.runs.clone();
        let (process, url) = Isolated::spawn(move || async move {
            let router = agent_reach_router::build(&settings).await.unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(agent_reach_router::serve(listener, router, std::future::pending()));
            url
        });
        RouterProcess { url, process }
    }

    pub fn router(&self) -> &str {
        &self.routers[0].url
    }

    pub fn registry(&self) -> String {
        self.registry.url()
    }

    /// An SDK agent named `name` on this stack (router 0), TTL 3 s.
    pub fn agent(&self, name: &str, agent_id: &str) -> AgentBuilder {
        Agent::builder(name, agent_id)
            .registry(&self.registry())
            .router(self.router())
            .token(token(name))
            .ttl_s(3)
    }

    /// Waits until the registry has `agent_id` registered and ready.
    pub async fn wait_for_agent(&self, agent_id: &str) {
        let url = format!("{}/v1/agents/{agent_id}", self.registry());
        let ready = eventually(Duration::from_secs(10), || async {
            match self.http.get(&url).bearer_auth(token("ops")).send().await {
                Ok(response) if response.status() == 200 => response
                    .json::<Value>()
                    .await
                    .is_ok_and(|instance| instance["status"] == "ready"),
                _ => false,
            }
        })
        .await;
        assert!(ready, "{agent_id} is not registered and ready");
    }

    /// Registers workflow `name` as the operator `ops`: (status, body).
    pub async fn put_workflow(&self, name: &str, definition: &Value) -> (u16, Value) {
        let response = self
            .http
            .put(format!("{}/v1/workflows/{name}", self.registry()))
            .bearer_auth(token("ops"))
            .json(definition)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    /// The sum of `name`'s series on `router` whose labels hold every one of `labels`.
    pub async fn metric(&self, router: &str, name: &str, labels: &[&str]) -> f64 {
        let text = self
            .http
            .get(format!("{router}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .filter_map(|line| line.rsplit_once(' ').and_then(|(_, value)| value.parse::<f64>().ok()))
            .sum()
    }

    /// Waits until every router offers `name` (its A2A card is served).
    pub async fn wait_for_offer(&self, name: &str) {
        for router in &self.routers {
            let url = format!("{}/a2a/{name}/.well-known/agent-card.json", router.url);
            let offered = eventually(Duration::from_secs(10), || async {
                self.http
                    .get(&url)
                    .bearer_auth(token("tester"))
                    .send()
                    .await
                    .is_ok_and(|response| response.status() == 200)
            })
            .await;
            assert!(offered, "{name} is not offered by {}", router.url);
        }
    }

    /// `method path` on `router` as `caller` with `body`: (status, JSON body).
    pub async fn call(
        &self,
        router: &str,
        caller: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{router}{path}");
        let request = match method {
            "GET" => self.http.get(url),
            _ => self.http.post(url).json(&body.unwrap_or(json!({}))),
        };
        let response = request.bearer_auth(token(caller)).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Starts a run of `workflow` with `payload` as `tester`: its id.
    pub async fn start_run(&self, workflow: &str, body: Value) -> String {
        let (status, answer) = self
            .call(
                self.router(),
                "tester",
                "POST",
                &format!("/v1/workflows/{workflow}/runs"),
                Some(body),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(answer["status"], "pending");
        answer["run_id"].as_str().unwrap().to_string()
    }

    pub async fn run(&self, run_id: &str) -> Value {
        let (status, view) = self
            .call(self.router(), "tester", "GET", &format!("/v1/runs/{run_id}"), None)
            .await;
        assert_eq!(status, 200, "{view}");
        view
    }

    /// The run once it ended (panics after `within`).
    pub async fn ended(&self, router: &str, run_id: &str, within: Duration) -> Value {
        let path = format!("/v1/runs/{run_id}");
        let (ended, last) = poll(
            within,
            || self.call(router, "tester", "GET", &path, None),
            |(status, view)| {
                *status == 200 && matches!(view["status"].as_str(), Some("succeeded" | "failed" | "canceled"))
            },
        )
        .await;
        assert!(ended, "run {run_id} did not end within {within:?}: {last:?}");
        last.1
    }
}

/// Reads with `read` every 20 ms until `done` holds for what it read, or
/// `within` passed: whether it held, and the last thing read.
pub async fn poll<T, F, Fut>(within: Duration, mut read: F, done: impl Fn(&T) -> bool) -> (bool, T)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = read().await;
        if done(&last) {
            return (true, last);
        }
        if tokio::time::Instant::now() >= deadline {
            return (false, last);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Step `id` of a run's view.
pub fn step<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|step| step["id"] == id))
        .unwrap_or_else(|| panic!("no step {id} in {run}"))
}
