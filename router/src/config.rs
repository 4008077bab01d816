//! Command-line flags of `agent-reach router` (DESIGN §7), each also read from
//! an `AGENT_REACH_*` environment variable, validated into [`Settings`] with
//! every problem reported at once. `Settings::new` builds the same thing in
//! code (tests, `agent-reach dev`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::{AuthArgs, AuthConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct RouterArgs {
    /// Address serving the HTTP/JSON API (`POST /v1/invoke`, `/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "AGENT_REACH_ROUTER_LISTEN", default_value = "127.0.0.1:7500")]
    pub listen: SocketAddr,
    /// The registry whose Watch stream feeds the routing snapshot.
    #[arg(long, env = "AGENT_REACH_REGISTRY", default_value = "http://127.0.0.1:7400")]
    pub registry: String,
    /// File holding the bearer token the router presents to the registry. Without it,
    /// the router signs its own short-lived token (sub `router`) with the HS256 secret
    /// given by --auth-hs256-secret-file; with --insecure-no-auth it sends none.
    #[arg(long, env = "AGENT_REACH_REGISTRY_TOKEN_FILE", value_name = "PATH")]
    pub registry_token_file: Option<PathBuf>,
    /// The access policy (`permissions` is enforced here); reloaded when it changes.
    #[arg(long, env = "AGENT_REACH_ACL", default_value = "acl.yaml")]
    pub acl: PathBuf,
    /// Largest accepted invoke body, in bytes (larger → 413 PAYLOAD_TOO_LARGE).
    #[arg(long, env = "AGENT_REACH_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Deadline for calls whose envelope and capability set none, in milliseconds.
    #[arg(long, env = "AGENT_REACH_DEFAULT_TIMEOUT_MS", default_value_t = 30_000)]
    pub default_timeout_ms: u64,
    /// Attempts per request, the first one included (retries go to other instances).
    #[arg(long, env = "AGENT_REACH_MAX_ATTEMPTS", default_value_t = 3)]
    pub max_attempts: u32,
    /// Retries allowed as a percentage of requests (the retry budget).
    #[arg(long, env = "AGENT_REACH_RETRY_BUDGET_PERCENT", default_value_t = 20)]
    pub retry_budget_percent: u32,
    /// Retries per second always allowed, whatever the budget (the floor).
    #[arg(long, env = "AGENT_REACH_RETRY_BUDGET_FLOOR", default_value_t = 10)]
    pub retry_budget_floor: u32,
    /// Consecutive failures that open an instance's circuit breaker.
    #[arg(long, env = "AGENT_REACH_BREAKER_FAILURES", default_value_t = 5)]
    pub breaker_failures: u32,
    /// How long an open breaker waits before letting one probe through, in milliseconds.
    #[arg(long, env = "AGENT_REACH_BREAKER_OPEN_MS", default_value_t = 30_000)]
    pub breaker_open_ms: u64,
    /// In-flight requests per instance above which it is skipped (bounds each instance's pool).
    #[arg(long, env = "AGENT_REACH_MAX_INFLIGHT_PER_INSTANCE", default_value_t = 1024)]
    pub max_inflight_per_instance: u32,
    /// Idle keep-alive connections kept per instance.
    #[arg(long, env = "AGENT_REACH_POOL_IDLE_PER_INSTANCE", default_value_t = 64)]
    pub pool_idle_per_instance: usize,
    /// Request-serving threads (one single-threaded runtime each); 0 means one per CPU core.
    #[arg(long, env = "AGENT_REACH_ROUTER_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Snapshot age without a registry connection after which `/readyz` fails, in seconds.
    #[arg(long, env = "AGENT_REACH_MAX_STALENESS_S", default_value_t = 60)]
    pub max_staleness_s: u64,
    /// Redis for durable asynchronous tasks (`/v1/tasks`); without it the slow path is off.
    #[arg(long, env = "AGENT_REACH_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// File with the default secret that signs task callbacks (required with --redis).
    #[arg(long, env = "AGENT_REACH_CALLBACK_SECRET_FILE", value_name = "PATH")]
    pub callback_secret_file: Option<PathBuf>,
    /// A named callback signing secret, `NAME=PATH` (a callback's `secret_ref`); repeatable.
    #[arg(
        long = "callback-secret",
        env = "AGENT_REACH_CALLBACK_SECRETS",
        value_delimiter = ',',
        value_name = "NAME=PATH"
    )]
    pub callback_secrets: Vec<String>,
    /// DEVELOPMENT ONLY: allow callbacks to loopback and private addresses.
    #[arg(long, env = "AGENT_REACH_ALLOW_PRIVATE_CALLBACKS")]
    pub allow_private_callbacks: bool,
    /// Tasks this router delivers at once.
    #[arg(long, env = "AGENT_REACH_TASK_WORKERS", default_value_t = 64)]
    pub task_workers: usize,
    /// How long finished tasks and their results are kept, in seconds.
    #[arg(long, env = "AGENT_REACH_TASK_RETENTION_S", default_value_t = 24 * 3600)]
    pub task_retention_s: u64,
    /// Limit concurrent tasks for capabilities served only by instances with a tag,
    /// `KEY=VALUE:LIMIT` (e.g. class=bulk:5); the rest wait, high priority first. Repeatable.
    #[arg(
        long = "task-tag-limit",
        env = "AGENT_REACH_TASK_TAG_LIMITS",
        value_delimiter = ',',
        value_name = "KEY=VALUE:N"
    )]
    pub task_tag_limits: Vec<String>,
    /// A task claimed by a router that has not finished it after this many seconds is taken over.
    #[arg(long, env = "AGENT_REACH_TASK_RECLAIM_AFTER_S", default_value_t = 120)]
    pub task_reclaim_after_s: u64,
    #[command(flatten)]
    pub auth: AuthArgs,
}

/// How the router proves itself to the registry's Watch.
#[derive(Debug, Clone)]
pub enum RegistryCredential {
    /// A token read from this file at every (re)connect.
    TokenFile(PathBuf),
    /// Sign a short-lived token with the shared HS256 secret in this file.
    SignWithSecret(PathBuf),
    /// Send nothing (the registry runs with `--insecure-no-auth`).
    None,
}

/// Retry, breaker and pool tuning; [`Default`] gives the documented defaults.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub max_body_bytes: usize,
    pub default_timeout: Duration,
    pub max_attempts: u32,
    pub retry_budget_percent: u32,
    pub retry_budget_floor: u32,
    pub breaker_failures: u32,
    pub breaker_open: Duration,
    pub max_inflight_per_instance: u32,
    pub pool_idle_per_instance: usize,
    pub max_staleness: Duration,
    /// Request-serving threads of `run` (0: one per core).
    pub threads: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            default_timeout: Duration::from_secs(30),
            max_attempts: 3,
            retry_budget_percent: 20,
            retry_budget_floor: 10,
            breaker_failures: 5,
            breaker_open: Duration::from_secs(30),
            max_inflight_per_instance: 1024,
            pool_idle_per_instance: 64,
            max_staleness: Duration::from_secs(60),
            threads: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub registry: String,
    pub registry_credential: RegistryCredential,
    pub acl: PathBuf,
    pub auth: AuthConfig,
    pub tuning: Tuning,
    /// The slow path (`/v1/tasks`), when configured.
    pub tasks: Option<crate::tasks::TasksSettings>,
}

impl Settings {
    /// Settings with default tuning; the registry credential follows `auth`
    /// (self-signed with the HS256 secret, or none without authentication).
    pub fn new(listen: SocketAddr, registry: impl Into<String>, auth: AuthConfig, acl: PathBuf) -> Self {
        let registry_credential = match &auth {
            AuthConfig::Hs256SecretFile(path) => RegistryCredential::SignWithSecret(path.clone()),
            _ => RegistryCredential::None,
        };
        Self {
            listen,
            registry: registry.into(),
            registry_credential,
            acl,
            auth,
            tuning: Tuning::default(),
            tasks: None,
        }
    }
}

impl RouterArgs {
    fn tasks_settings(&self, problems: &mut Vec<String>) -> Option<crate::tasks::TasksSettings> {
        let redis = self.redis.clone()?;
        if !(redis.starts_with("redis://") || redis.starts_with("rediss://")) {
            problems.push(format!("--redis `{redis}` must start with redis:// or rediss://"));
        }
        let read_secret = |path: &std::path::Path, problems: &mut Vec<String>| match std::fs::read(path) {
            Ok(secret) if secret.trim_ascii().len() >= 32 => Some(secret.trim_ascii().to_vec()),
            Ok(_) => {
                problems.push(format!(
                    "callback secret {} must hold at least 32 bytes",
                    path.display()
                ));
                None
            }
            Err(error) => {
                problems.push(format!("cannot read callback secret {}: {error}", path.display()));
                None
            }
        };
        let default_secret = match &self.callback_secret_file {
            Some(path) => read_secret(path, problems).unwrap_or_default(),
            None => {
                problems.push("--redis needs --callback-secret-file PATH (signs task callbacks)".to_string());
                Vec::new()
            }
        };
        let mut callbacks = agent_reach_tasks::CallbackConfig::new(default_secret);
        for entry in &self.callback_secrets {
            match entry.split_once('=') {
                Some((name, path)) if !name.is_empty() => {
                    if let Some(secret) = read_secret(std::path::Path::new(path), problems) {
                        callbacks.secrets.insert(name.to_string(), secret);
                    }
                }
                _ => problems.push(format!("--callback-secret `{entry}` must be NAME=PATH")),
            }
        }
        callbacks.allow_private_targets = self.allow_private_callbacks;
        if self.allow_private_callbacks {
            tracing::warn!(message = "Task callbacks to loopback and private addresses are ALLOWED. Development only.");
        }
        if self.task_workers == 0 {
            problems.push("--task-workers must be at least 1".to_string());
        }
        Some(crate::tasks::TasksSettings {
            redis,
            store: agent_reach_tasks::StoreConfig {
                retention: Duration::from_secs(self.task_retention_s.max(60)),
                ..Default::default()
            },
            callbacks,
            workers: self.task_workers,
            reclaim_after: Duration::from_secs(self.task_reclaim_after_s.max(1)),
            max_task_attempts: 3,
            tag_limits: self
                .task_tag_limits
                .iter()
                .filter_map(|text| {
                    crate::tasks::TagLimit::parse(text)
                        .map_err(|why| problems.push(format!("--task-tag-limit: {why}")))
                        .ok()
                })
                .collect(),
        })
    }

    pub fn validate(&self) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        if !(self.registry.starts_with("http://") || self.registry.starts_with("https://")) {
            problems.push(format!(
                "--registry `{}` must start with http:// or https://",
                self.registry
            ));
        }
        if self.max_body_bytes < 1024 {
            problems.push("--max-body-bytes must be at least 1024".to_string());
        }
        if self.default_timeout_ms == 0 {
            problems.push("--default-timeout-ms must be above 0".to_string());
        }
        if !(1..=10).contains(&self.max_attempts) {
            problems.push(format!("--max-attempts {} must be within 1..=10", self.max_attempts));
        }
        if self.retry_budget_percent > 100 {
            problems.push("--retry-budget-percent must be within 0..=100".to_string());
        }
        if self.breaker_failures == 0 {
            problems.push("--breaker-failures must be at least 1".to_string());
        }
        if self.breaker_open_ms == 0 {
            problems.push("--breaker-open-ms must be above 0".to_string());
        }
        if self.max_inflight_per_instance == 0 {
            problems.push("--max-inflight-per-instance must be at least 1".to_string());
        }
        let auth = self.auth.config().unwrap_or_else(|why| {
            problems.push(why);
            AuthConfig::InsecureNoAuth
        });
        let registry_credential = match (&self.registry_token_file, &auth) {
            (Some(path), _) => RegistryCredential::TokenFile(path.clone()),
            (None, AuthConfig::Hs256SecretFile(path)) => RegistryCredential::SignWithSecret(path.clone()),
            (None, AuthConfig::InsecureNoAuth) => RegistryCredential::None,
            (None, AuthConfig::PublicKeyFile(_)) => {
                problems.push(
                    "with --auth-public-key the router cannot sign its own registry token: \
                     pass --registry-token-file PATH"
                        .to_string(),
                );
                RegistryCredential::None
            }
        };
        let tasks = self.tasks_settings(&mut problems);
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Settings {
            tasks,
            listen: self.listen,
            registry: self.registry.clone(),
            registry_credential,
            acl: self.acl.clone(),
            auth,
            tuning: Tuning {
                max_body_bytes: self.max_body_bytes,
                default_timeout: Duration::from_millis(self.default_timeout_ms),
                max_attempts: self.max_attempts,
                retry_budget_percent: self.retry_budget_percent,
                retry_budget_floor: self.retry_budget_floor,
                breaker_failures: self.breaker_failures,
                breaker_open: Duration::from_millis(self.breaker_open_ms),
                max_inflight_per_instance: self.max_inflight_per_instance,
                pool_idle_per_instance: self.pool_idle_per_instance,
                max_staleness: Duration::from_secs(self.max_staleness_s),
                threads: self.threads,
            },
        })
    }
}
