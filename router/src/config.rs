//! Command-line flags of `agent-reach router` (DESIGN §7), each also read from
//! an `AGENT_REACH_*` environment variable, validated into [`Settings`] with
//! every problem reported at once (the slow path's flags are its own,
//! [`TaskArgs`]). `Settings::new` builds the same thing in code (tests,
//! `agent-reach dev`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::{AuthArgs, AuthConfig};
use agent_reach_serving::tls::{ClientFiles, ListenerArgs, ServerFiles};

use agent_reach_access::{AssertionSettings, SigningKey};
use agent_reach_pipeline::policy::Plugins;
use agent_reach_pipeline::watch::RegistryCredential;
use agent_reach_pipeline::Tuning;
use agent_reach_tasks::{TaskArgs, TasksSettings};

#[derive(Debug, Clone, clap::Args)]
pub struct RouterArgs {
    /// Address serving the HTTP/JSON API (`POST /v1/invoke`, `/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "AGENT_REACH_ROUTER_LISTEN", default_value = "127.0.0.1:7500")]
    pub listen: SocketAddr,
    /// The registries whose Watch stream feeds the routing snapshot, comma separated:
    /// one is watched at a time; when it fails the next one is, from the same revision.
    #[arg(
        long,
        env = "AGENT_REACH_REGISTRY",
        default_value = "http://127.0.0.1:7400",
        value_delimiter = ',',
        value_name = "URL,..."
    )]
    pub registry: Vec<String>,
    /// File holding the bearer token the router presents to the registry (`{tenant}` in
    /// the path is replaced by each tenant's name, for a tenant map). Without it,
    /// the router signs its own short-lived token (sub `router`) with the HS256 secret
    /// given by --auth-hs256-secret-file; with --insecure-no-auth it sends none.
    #[arg(long, env = "AGENT_REACH_REGISTRY_TOKEN_FILE", value_name = "PATH")]
    pub registry_token_file: Option<PathBuf>,
    /// The access policy (`permissions` is enforced here); reloaded when it changes.
    #[arg(long, env = "AGENT_REACH_ACL", default_value = "acl.yaml")]
    pub acl: PathBuf,
    /// The tenant this router serves (DESIGN §8): callers' tokens must carry it (no
    /// `tenant` claim means `default`); its tasks live under `{prefix}:{tenant}`.
    #[arg(long, env = "AGENT_REACH_TENANT", default_value = "default")]
    pub tenant: String,
    /// The tenant map (DESIGN §8): serve every tenant it names (--tenant, the home
    /// tenant, among them), each with its own snapshot, policy, quotas and slow
    /// path on its placement; reloaded when it changes.
    #[arg(long, env = "AGENT_REACH_TENANT_MAP", value_name = "PATH")]
    pub tenant_map: Option<PathBuf>,
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
    /// Transparent huge pages for this process: `off` (the default) turns them
    /// off for the router alone (`PR_SET_THP_DISABLE` on Linux, as Redis does),
    /// whatever the system's setting; `on` leaves the system's setting. With
    /// them on, the allocator's arenas are huge-page backed and memory it
    /// takes back and reuses is faulted in 2 MB at a time: on `router-bench
    /// --trail` zeroing those pages was the trail's largest cost at one
    /// connection (docs/benchmarks.md).
    #[arg(long, env = "AGENT_REACH_TRANSPARENT_HUGE_PAGES", value_enum, default_value_t = agent_reach_tasks::Switch::Off)]
    pub transparent_huge_pages: agent_reach_tasks::Switch,
    /// Snapshot age without a registry connection after which `/readyz` fails, in seconds.
    #[arg(long, env = "AGENT_REACH_MAX_STALENESS_S", default_value_t = 60)]
    pub max_staleness_s: u64,
    /// Hops a delegation chain may have (an agent calling onwards within a call
    /// adds one); deeper is refused 403 DEPTH_EXCEEDED (DESIGN §9).
    #[arg(long, env = "AGENT_REACH_MAX_DEPTH", default_value_t = 16)]
    pub max_depth: u32,
    /// How long past its expiry an agent's upstream assertion still carries the
    /// chain it was given (an agent may call onwards late in a long call), in seconds.
    #[arg(long, env = "AGENT_REACH_UPSTREAM_GRACE_S", default_value_t = 300)]
    pub upstream_grace_s: u64,
    /// The Ed25519 private key (PKCS#8 PEM) that signs the assertion every forwarded call
    /// carries (`agent-reach keys generate --out PATH` makes one). Reloaded when it changes;
    /// every router replica must hold the same keys.
    #[arg(long, env = "AGENT_REACH_ASSERTION_KEY", value_name = "PATH")]
    pub assertion_key: Option<PathBuf>,
    /// A key published beside the signing key in `/.well-known/jwks.json` (the next key
    /// before a rotation, the previous one after); repeatable.
    #[arg(
        long = "assertion-published-key",
        env = "AGENT_REACH_ASSERTION_PUBLISHED_KEYS",
        value_delimiter = ',',
        value_name = "PATH"
    )]
    pub assertion_published_keys: Vec<PathBuf>,
    /// The `iss` claim of the router's assertions (agents expect it).
    #[arg(long, env = "AGENT_REACH_ASSERTION_ISSUER", default_value = agent_reach_access::assertion::DEFAULT_ISSUER)]
    pub assertion_issuer: String,
    /// The longest life of an assertion, in seconds (never past the call's deadline).
    #[arg(long, env = "AGENT_REACH_ASSERTION_TTL_S", default_value_t = 10)]
    pub assertion_ttl_s: u64,
    /// Trust only these CAs (PEM) for `https://` agents; default: the system's roots.
    /// A self-signed agent is reached by putting its certificate here.
    #[arg(long, env = "AGENT_REACH_AGENT_CA_FILE", value_name = "PATH")]
    pub agent_ca_file: Option<PathBuf>,
    /// The client certificate (PEM) the router presents to `https://` agents that
    /// require mutual TLS; needs --agent-client-key-file.
    #[arg(long, env = "AGENT_REACH_AGENT_CLIENT_CERT_FILE", value_name = "PATH")]
    pub agent_client_cert_file: Option<PathBuf>,
    /// The private key of --agent-client-cert-file (PEM).
    #[arg(long, env = "AGENT_REACH_AGENT_CLIENT_KEY_FILE", value_name = "PATH")]
    pub agent_client_key_file: Option<PathBuf>,
    /// Trust only these CAs (PEM) for an `https://` --registry; default: the system's roots.
    #[arg(long, env = "AGENT_REACH_REGISTRY_CA_FILE", value_name = "PATH")]
    pub registry_ca_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: ListenerArgs,
    /// Also serve this capability's A2A agent card at the host root,
    /// `/.well-known/agent-card.json` (its interface stays `/a2a/NAME`).
    #[arg(long, env = "AGENT_REACH_A2A_ROOT_CAPABILITY", value_name = "NAME")]
    pub a2a_root_capability: Option<String>,
    /// When an A2A message becomes a durable task: `when-asked` (a return-at-once
    /// or push-config send; a plain send is answered with a Message) or `always`
    /// (every send and stream is a task GetTask and ListTasks find; needs --redis).
    #[arg(
        long,
        env = "AGENT_REACH_A2A_TASKS",
        value_name = "WHEN",
        default_value = "when-asked"
    )]
    pub a2a_tasks: A2aTasks,
    /// A browser origin (`scheme://host[:port]`) allowed to call `/mcp`, besides loopback
    /// origins; repeatable. Requests with another `Origin` are refused 403 (DNS rebinding
    /// guard; requests without `Origin`, from non-browser clients, always pass). `*` allows
    /// any origin and turns the guard off.
    #[arg(
        long = "mcp-allowed-origin",
        env = "AGENT_REACH_MCP_ALLOWED_ORIGINS",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    pub mcp_allowed_origins: Vec<String>,
    /// The outcome history's bucket, in milliseconds (DESIGN §3.4.1): `adaptive` learns
    /// per bucket, 24 buckets make its day and 168 its week. Keep the default (an
    /// hour) in production; a shorter bucket compresses time for tests and benches.
    #[arg(
        long,
        env = "AGENT_REACH_ROUTING_HISTORY_BUCKET_MS",
        default_value_t = 3_600_000,
        value_name = "MS"
    )]
    pub routing_history_bucket_ms: u64,
    #[command(flatten)]
    pub tasks: TaskArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
}

/// When an A2A message becomes a durable task (`--a2a-tasks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum A2aTasks {
    /// A send that returns at once or carries a push config (the spec's asks).
    WhenAsked,
    /// Every send and stream.
    Always,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    /// Registry URLs, watched one at a time in this order (failover).
    pub registry: Vec<String>,
    pub registry_credential: RegistryCredential,
    pub acl: PathBuf,
    pub auth: AuthConfig,
    /// The tenant served (the home tenant, with a map): callers of tenants not
    /// served are refused 401 (`other_tenant`).
    pub tenant: String,
    /// The tenant map, when the router serves several tenants.
    pub tenant_map: Option<PathBuf>,
    pub tuning: Tuning,
    /// How forwarded calls are vouched for.
    pub assertion: AssertionSettings,
    /// The slow path (`/v1/tasks`), when configured.
    pub tasks: Option<TasksSettings>,
    /// How workflow runs pace themselves (on the slow path; docs/design.md §3.14.4).
    pub runs: agent_reach_runs::RunSettings,
    /// TLS on the listener; `None`: plain TCP.
    pub listener_tls: Option<ServerFiles>,
    /// How `https://` agents are verified (and the router's client certificate).
    pub agent_tls: ClientFiles,
    /// How an `https://` registry is verified.
    pub registry_tls: ClientFiles,
    /// Selection policies plugged into this router (`plugin:NAME`; the
    /// `agent-reach` binary registers its own in `cli/src/plugins.rs`).
    pub plugins: Plugins,
}

impl Settings {
    /// Settings with default tuning; the registry credential follows `auth`
    /// (self-signed with the HS256 secret, or none without authentication).
    pub fn new(listen: SocketAddr, registry: impl Into<String>, auth: AuthConfig, acl: PathBuf) -> Self {
        let registry_credential = match auth.hs256_secret_file() {
            Some(path) => RegistryCredential::SignWithSecret(path.to_path_buf()),
            None => RegistryCredential::None,
        };
        Self {
            listen,
            registry: vec![registry.into()],
            registry_credential,
            acl,
            auth,
            tenant: agent_reach_access::token::DEFAULT_TENANT.to_string(),
            tenant_map: None,
            tuning: Tuning::default(),
            assertion: AssertionSettings::default(),
            tasks: None,
            runs: agent_reach_runs::RunSettings::default(),
            listener_tls: None,
            agent_tls: ClientFiles::default(),
            registry_tls: ClientFiles::default(),
            plugins: Plugins::new(),
        }
    }
}

impl RouterArgs {
    pub fn validate(&self) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        if self.registry.is_empty() {
            problems.push("--registry needs at least one URL".to_string());
        }
        for url in &self.registry {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!("--registry `{url}` must start with http:// or https://"));
            }
        }
        if let Err(why) = agent_reach_access::token::check_tenant_name(&self.tenant) {
            problems.push(format!("--tenant: {why}"));
        }
        if let Some(path) = &self.tenant_map {
            problems.extend(agent_reach_tenancy::check_at_start(path, &self.tenant));
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
        if !(1..=64).contains(&self.max_depth) {
            problems.push(format!("--max-depth {} must be 1..=64", self.max_depth));
        }
        if self.upstream_grace_s > 86_400 {
            problems.push(format!(
                "--upstream-grace-s {} must be at most 86400",
                self.upstream_grace_s
            ));
        }
        if self.breaker_failures == 0 {
            problems.push("--breaker-failures must be at least 1".to_string());
        }
        if self.breaker_open_ms == 0 {
            problems.push("--breaker-open-ms must be above 0".to_string());
        }
        if !(100..=86_400_000).contains(&self.routing_history_bucket_ms) {
            problems.push(format!(
                "--routing-history-bucket-ms {} must be within 100..=86400000 (an hour, 3600000, outside tests and benches)",
                self.routing_history_bucket_ms
            ));
        } else if self.routing_history_bucket_ms != 3_600_000 {
            tracing::warn!(
                message = "Outcome history buckets are not an hour: time is compressed for adaptive routing (a test or bench setting).",
                bucket_ms = self.routing_history_bucket_ms
            );
        }
        if self.max_inflight_per_instance == 0 {
            problems.push("--max-inflight-per-instance must be at least 1".to_string());
        }
        let auth = self.auth.config().unwrap_or_else(|why| {
            problems.push(why);
            AuthConfig::InsecureNoAuth
        });
        let registry_credential = match (&self.registry_token_file, auth.hs256_secret_file()) {
            (Some(path), _) => RegistryCredential::TokenFile(path.clone()),
            (None, Some(secret)) => RegistryCredential::SignWithSecret(secret.to_path_buf()),
            (None, None) if auth.is_insecure() => RegistryCredential::None,
            (None, None) => {
                problems.push(
                    "without --auth-hs256-secret-file the router cannot sign its own registry token \
                     (--auth-public-key and --auth-oidc-issuer only verify tokens): pass --registry-token-file PATH"
                        .to_string(),
                );
                RegistryCredential::None
            }
        };
        let assertion = match &self.assertion_key {
            Some(path) => AssertionSettings {
                signing: SigningKey::File(path.clone()),
                published: self.assertion_published_keys.clone(),
                issuer: self.assertion_issuer.clone(),
                ttl: Duration::from_secs(self.assertion_ttl_s),
            },
            None => {
                problems.push(
                    "--assertion-key PATH is required: the Ed25519 key that signs forwarded calls \
                     (make one with `agent-reach keys generate --out PATH`)"
                        .to_string(),
                );
                AssertionSettings::default()
            }
        };
        if !(1..=300).contains(&self.assertion_ttl_s) {
            problems.push(format!(
                "--assertion-ttl-s {} must be within 1..=300",
                self.assertion_ttl_s
            ));
        }
        if self.assertion_issuer.trim().is_empty() {
            problems.push("--assertion-issuer must not be empty".to_string());
        }
        let tasks = self.tasks.settings(&mut problems);
        let listener_tls = self.tls.files(&mut problems);
        let identity = match (&self.agent_client_cert_file, &self.agent_client_key_file) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => {
                problems.push("--agent-client-cert-file and --agent-client-key-file go together".to_string());
                None
            }
        };
        for origin in &self.mcp_allowed_origins {
            let valid = origin == "*"
                || origin == "null"
                || origin
                    .trim_end_matches('/')
                    .split_once("://")
                    .is_some_and(|(scheme, rest)| !scheme.is_empty() && !rest.is_empty() && !rest.contains('/'));
            if !valid {
                problems.push(format!(
                    "--mcp-allowed-origin `{origin}` must be scheme://host[:port] (e.g. https://app.example.com), `null` or `*`"
                ));
            }
        }
        if self.a2a_tasks == A2aTasks::Always && tasks.is_none() {
            problems.push(
                "--a2a-tasks always makes every A2A message a durable task: it needs the task store (--redis URL)"
                    .to_string(),
            );
        }
        if self.mcp_allowed_origins.iter().any(|origin| origin == "*") {
            tracing::warn!(message = "--mcp-allowed-origin '*': any web page may call /mcp (no DNS rebinding guard).");
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Settings {
            tasks,
            runs: agent_reach_runs::RunSettings::default(),
            assertion,
            listener_tls,
            agent_tls: ClientFiles {
                ca: self.agent_ca_file.clone(),
                identity,
            },
            registry_tls: ClientFiles {
                ca: self.registry_ca_file.clone(),
                identity: None,
            },
            plugins: Plugins::new(),
            listen: self.listen,
            registry: self.registry.clone(),
            registry_credential,
            acl: self.acl.clone(),
            auth,
            tenant: self.tenant.clone(),
            tenant_map: self.tenant_map.clone(),
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
                a2a_root_capability: self.a2a_root_capability.clone(),
                a2a_tasks_always: self.a2a_tasks == A2aTasks::Always,
                mcp_allowed_origins: self.mcp_allowed_origins.clone(),
                serves_tls: false,
                chains: agent_reach_pipeline::delegation::ChainRules {
                    max_depth: self.max_depth,
                    upstream_grace: Duration::from_secs(self.upstream_grace_s),
                },
                history_bucket: Duration::from_millis(self.routing_history_bucket_ms),
            },
        })
    }
}
