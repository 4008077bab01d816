//! Every service in one process — registry, router, context service and the
//! example agents — on embedded stores (or real etcd/Redis when given), with
//! a freshly generated HS256 secret. Used by `agent-reach dev` and `demo`,
//! and by the example's tests.
//!
//! Authentication stays on: callers and agents get tokens signed with the
//! generated secret.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{start_instance, InstanceSpec, Services, EXAMPLE_ACL};
use agent_reach_access::AuthConfig;
use agent_reach_sdk::Agent;
use anyhow::Context;
use rand::RngCore;

/// Where each service listens and which stores back them.
#[derive(Debug, Clone)]
pub struct StackOptions {
    pub registry_listen: SocketAddr,
    pub router_listen: SocketAddr,
    pub context_listen: SocketAddr,
    /// Real etcd for the registry; embedded store when empty.
    pub etcd: Vec<String>,
    /// Real Redis for the context service and the router's slow path
    /// (durable tasks, workflow runs); embedded context store and no slow
    /// path when `None`.
    pub redis: Option<String>,
    /// Access policy; the example's policy when `None`.
    pub acl: Option<PathBuf>,
    /// Example agent instances to start in-process (see [`crate::scenario_instances`]).
    pub agents: Vec<InstanceSpec>,
}

pub struct Stack {
    pub registry: String,
    pub router: String,
    pub context: String,
    pub acl: PathBuf,
    pub secret_file: PathBuf,
    /// The router's assertion key (every router of this stack must sign with it).
    pub assertion_key_file: PathBuf,
    secret: Vec<u8>,
    servers: Vec<tokio::task::JoinHandle<()>>,
    pub agents: Vec<Agent>,
    _workdir: tempfile::TempDir,
}

async fn bind(address: SocketAddr, flag: &str) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address} (choose another with {flag})"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

impl Stack {
    pub async fn start(options: StackOptions) -> anyhow::Result<Self> {
        Self::start_with(options, |_| {}).await
    }

    /// [`Stack::start`], with `tune` adjusting the router's settings (its slow
    /// path and trail on a Redis, say) before it is built.
    pub async fn start_with(
        options: StackOptions,
        tune: impl FnOnce(&mut agent_reach_router::Settings),
    ) -> anyhow::Result<Self> {
        let workdir = tempfile::Builder::new()
            .prefix("agent-reach-dev-")
            .tempdir()
            .context("creating a temp dir for the dev secret")?;
        let mut raw = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut raw);
        let secret: Vec<u8> = raw
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
            .into_bytes();
        let secret_file = workdir.path().join("hs256.secret");
        std::fs::write(&secret_file, &secret).context("writing the dev secret")?;
        let assertion_key_file = workdir.path().join("assertion.pem");
        let (_, assertion_pem) = agent_reach_access::AssertionKey::generate().map_err(anyhow::Error::msg)?;
        std::fs::write(&assertion_key_file, assertion_pem).context("writing the dev assertion key")?;
        let acl = match &options.acl {
            Some(path) => path.clone(),
            None => {
                let path = workdir.path().join("acl.yaml");
                std::fs::write(&path, EXAMPLE_ACL).context("writing the example ACL")?;
                path
            }
        };
        let auth = AuthConfig::Hs256SecretFile(secret_file.clone());
        let mut servers = Vec::new();

        // Registry.
        let registry_settings = agent_reach_registry::Settings {
            listen: options.registry_listen,
            store: if options.etcd.is_empty() {
                agent_reach_registry::StoreChoice::Embedded
            } else {
                agent_reach_registry::StoreChoice::Etcd(options.etcd.clone())
            },
            acl: acl.clone(),
            auth: auth.clone(),
            service: agent_reach_registry::RegistryConfig::default(),
            listener_tls: None,
        };
        let registry = agent_reach_registry::build(&registry_settings).await?;
        let (listener, registry_addr) = bind(options.registry_listen, "--registry-listen").await?;
        servers.push(tokio::spawn(async move {
            if let Err(error) = agent_reach_registry::serve(listener, registry, std::future::pending()).await {
                tracing::error!(message = "Registry stopped.", %error);
            }
        }));
        let registry_url = format!("http://{registry_addr}");

        // Context service.
        let context_settings = agent_reach_context::Settings {
            listen: options.context_listen,
            // `serve` below runs on this runtime; `threads` is for `run` only.
            threads: 1,
            store: match &options.redis {
                None => agent_reach_context::StoreChoice::Embedded,
                Some(url) => agent_reach_context::StoreChoice::redis(
                    url,
                    agent_reach_context::store::Namespace {
                        prefix: "agent-reach".to_string(),
                        tenant: "default".to_string(),
                    },
                    Duration::from_secs(2),
                )
                .map_err(anyhow::Error::msg)?,
            },
            acl: acl.clone(),
            auth: auth.clone(),
            service: agent_reach_context::ContextConfig::default(),
            listener_tls: None,
        };
        let context = agent_reach_context::build(&context_settings).await?;
        let (listener, context_addr) = bind(options.context_listen, "--context-listen").await?;
        servers.push(tokio::spawn(async move {
            if let Err(error) = agent_reach_context::serve(listener, context, std::future::pending()).await {
                tracing::error!(message = "Context service stopped.", %error);
            }
        }));
        let context_url = format!("http://{context_addr}");

        // Router.
        let mut router_settings =
            agent_reach_router::Settings::new(options.router_listen, registry_url.clone(), auth, acl.clone());
        router_settings.assertion.signing = agent_reach_router::SigningKey::File(assertion_key_file.clone());
        if let Some(url) = &options.redis {
            // The slow path: durable tasks and workflow runs (their callbacks signed
            // with a secret of this stack's own).
            let mut callback_secret = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut callback_secret);
            let mut callbacks = agent_reach_task_store::CallbackConfig::new(callback_secret.to_vec());
            callbacks.allow_private_targets = true;
            router_settings.tasks = Some(agent_reach_router::TasksSettings {
                redis: url.clone(),
                store: agent_reach_task_store::StoreConfig::default(),
                callbacks,
                workers: 64,
                reclaim_after: Duration::from_secs(120),
                max_task_attempts: 3,
                tag_limits: Vec::new(),
                quota_share: None,
                trail: None,
            });
        }
        tune(&mut router_settings);
        let router = agent_reach_router::build(&router_settings).await?;
        let (listener, router_addr) = bind(options.router_listen, "--router-listen").await?;
        servers.push(tokio::spawn(async move {
            if let Err(error) = agent_reach_router::serve(listener, router, std::future::pending()).await {
                tracing::error!(message = "Router stopped.", %error);
            }
        }));
        let router_url = format!("http://{router_addr}");

        let mut stack = Self {
            registry: registry_url,
            router: router_url,
            context: context_url,
            acl,
            secret_file,
            assertion_key_file,
            secret,
            servers,
            agents: Vec::new(),
            _workdir: workdir,
        };
        if !options.agents.is_empty() {
            let services = stack.services();
            for spec in &options.agents {
                let token = stack.token(spec.name, Duration::from_secs(7 * 86_400))?;
                let agent = start_instance(spec, &services, token)
                    .await
                    .with_context(|| format!("starting example agent {}", spec.agent_id))?;
                stack.agents.push(agent);
            }
        }
        Ok(stack)
    }

    /// Where agents find this stack's services.
    pub fn services(&self) -> Services {
        Services {
            registry: self.registry.clone(),
            router: self.router.clone(),
            context: self.context.clone(),
        }
    }

    /// A token for `name`, signed with this stack's secret.
    pub fn token(&self, name: &str, ttl: Duration) -> anyhow::Result<String> {
        agent_reach_access::token::issue_hs256(name, &self.secret, ttl).map_err(anyhow::Error::msg)
    }

    /// Waits until every capability has a routable instance in the registry
    /// and the router's snapshot has caught up with those instances.
    pub async fn wait_until_routable(&self, capabilities: &[&str], timeout: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let token = self.token("demo_user", Duration::from_secs(60))?;
        let deadline = tokio::time::Instant::now() + timeout;
        for capability in capabilities {
            loop {
                let resolved: serde_json::Value = client
                    .get(format!("{}/v1/capabilities/{capability}", self.registry))
                    .bearer_auth(&token)
                    .send()
                    .await?
                    .json()
                    .await?;
                if resolved["instances"].as_array().is_some_and(|found| !found.is_empty()) {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    anyhow::bail!("`{capability}` did not become routable within {timeout:?}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // The router learns of them through its registry watch, a moment later:
        // wait until its snapshot reflects the registry's current revision.
        let gauge = |text: &str, name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
                .and_then(|value| value.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let registry_metrics = client
            .get(format!("{}/metrics", self.registry))
            .send()
            .await?
            .text()
            .await?;
        let revision = gauge(&registry_metrics, "agent_reach_registry_catalog_revision");
        loop {
            let metrics = client
                .get(format!("{}/metrics", self.router))
                .send()
                .await?
                .text()
                .await?;
            if gauge(&metrics, "agent_reach_router_snapshot_revision") >= revision {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("the router's snapshot did not catch up within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drains and deregisters the agents, then stops the services.
    pub async fn shutdown(self) {
        for agent in self.agents {
            agent.shutdown().await;
        }
        for server in self.servers {
            server.abort();
        }
    }
}
