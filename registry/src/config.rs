//! Command-line flags of `agent-reach registry` (DESIGN §7), each also read
//! from an `AGENT_REACH_*` environment variable, validated into a typed
//! config with every problem reported at once.

use std::net::SocketAddr;
use std::path::PathBuf;

use agent_reach_access::{AuthArgs, AuthConfig};

use crate::service::RegistryConfig;
use crate::validate::TtlBounds;

#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Address serving gRPC and HTTP/JSON on one port.
    #[arg(long, env = "AGENT_REACH_REGISTRY_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// etcd endpoints, comma separated (e.g. http://127.0.0.1:2379).
    #[arg(long, env = "AGENT_REACH_ETCD", value_delimiter = ',', value_name = "URL,...")]
    pub etcd: Vec<String>,
    /// CA certificates (PEM) trusted for https:// etcd endpoints instead of the system's roots.
    #[arg(long, env = "AGENT_REACH_ETCD_CA_FILE", value_name = "PATH")]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd (`--client-cert-auth`).
    #[arg(long, env = "AGENT_REACH_ETCD_CLIENT_CERT", value_name = "PATH")]
    pub etcd_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "AGENT_REACH_ETCD_CLIENT_KEY", value_name = "PATH")]
    pub etcd_client_key: Option<PathBuf>,
    /// DEVELOPMENT ONLY: keep registrations in memory instead of etcd (lost on exit).
    #[arg(long, env = "AGENT_REACH_EMBEDDED_STORE", conflicts_with = "etcd")]
    pub embedded_store: bool,
    /// The access policy; reloaded when it changes.
    #[arg(long, env = "AGENT_REACH_ACL", default_value = "acl.yaml")]
    pub acl: PathBuf,
    /// Tenant whose keys this registry serves (`/agent-reach/v1/{tenant}/...`).
    #[arg(long, env = "AGENT_REACH_TENANT", default_value = "default")]
    pub tenant: String,
    /// Serve every tenant this tenant map names (YAML, polled every second;
    /// DESIGN §8), `--tenant` being the home tenant; without it, `--tenant` alone.
    #[arg(long, env = "AGENT_REACH_TENANT_MAP", value_name = "PATH")]
    pub tenant_map: Option<PathBuf>,
    /// Lease TTL for registrations that do not ask for one, in seconds.
    #[arg(long, env = "AGENT_REACH_DEFAULT_TTL_S", default_value_t = 15)]
    pub default_ttl_s: u32,
    /// Smallest `ttl_s` a registration may ask for.
    #[arg(long, env = "AGENT_REACH_MIN_TTL_S", default_value_t = 3)]
    pub min_ttl_s: u32,
    /// Largest `ttl_s` a registration may ask for.
    #[arg(long, env = "AGENT_REACH_MAX_TTL_S", default_value_t = 300)]
    pub max_ttl_s: u32,
    /// Largest accepted request body (HTTP) or message (gRPC), in bytes; so
    /// also the largest registration (at most 8 MiB: every router decodes one
    /// instance in one Watch message of at most 16 MiB; etcd's own default
    /// request limit is 1.5 MiB).
    #[arg(long, env = "AGENT_REACH_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Largest input or output schema of one capability, as compact JSON, in bytes
    /// (larger: 413 `SCHEMA_TOO_LARGE`).
    #[arg(long, env = "AGENT_REACH_MAX_SCHEMA_BYTES", default_value_t = crate::validate::DEFAULT_MAX_SCHEMA_BYTES)]
    pub max_schema_bytes: usize,
    /// Deepest nesting of objects and arrays in one schema (deeper: 400 `SCHEMA_TOO_DEEP`).
    #[arg(long, env = "AGENT_REACH_MAX_SCHEMA_DEPTH", default_value_t = crate::validate::DEFAULT_MAX_SCHEMA_DEPTH)]
    pub max_schema_depth: usize,
    #[command(flatten)]
    pub tls: agent_reach_serving::tls::ListenerArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
}

/// Where registrations live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    Etcd(Vec<String>),
    /// etcd with TLS material for its https:// endpoints.
    EtcdTls {
        endpoints: Vec<String>,
        tls: agent_reach_stores::TlsFiles,
    },
    Embedded,
}

/// The largest `--max-body-bytes`: half the 16 MiB a router decodes in one
/// Watch message, which one instance must fit.
const MAX_REGISTRATION_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub store: StoreChoice,
    pub acl: PathBuf,
    pub auth: AuthConfig,
    /// TLS on the listener; `None`: plain TCP.
    pub listener_tls: Option<agent_reach_serving::tls::ServerFiles>,
    pub service: RegistryConfig,
}

impl RegistryArgs {
    pub fn validate(&self) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let tls = agent_reach_stores::TlsFiles::read(
            "--etcd",
            self.etcd_ca_file.as_deref(),
            self.etcd_client_cert.as_deref(),
            self.etcd_client_key.as_deref(),
            &mut problems,
        );
        if !tls.is_empty() && !self.etcd.iter().any(|url| url.starts_with("https://")) {
            problems.push("--etcd-ca-file / --etcd-client-cert need an https:// etcd endpoint".to_string());
        }
        let store = match (self.etcd.is_empty(), self.embedded_store) {
            (false, _) if tls.is_empty() => StoreChoice::Etcd(self.etcd.clone()),
            (false, _) => StoreChoice::EtcdTls {
                endpoints: self.etcd.clone(),
                tls,
            },
            (true, true) => StoreChoice::Embedded,
            (true, false) => {
                problems.push("no store: pass --etcd URL[,URL...] (or --embedded-store for development)".to_string());
                StoreChoice::Embedded
            }
        };
        for url in &self.etcd {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!("--etcd `{url}` must start with http:// or https://"));
            }
        }
        if let Err(why) = agent_reach_access::token::check_tenant_name(&self.tenant) {
            problems.push(format!("--tenant: {why}"));
        }
        if let Some(path) = &self.tenant_map {
            problems.extend(agent_reach_tenancy::check_at_start(path, &self.tenant));
        }
        if self.min_ttl_s == 0 || self.min_ttl_s > self.max_ttl_s {
            problems.push(format!(
                "--min-ttl-s {} must be at least 1 and not above --max-ttl-s {}",
                self.min_ttl_s, self.max_ttl_s
            ));
        }
        if !(self.min_ttl_s..=self.max_ttl_s).contains(&self.default_ttl_s) {
            problems.push(format!(
                "--default-ttl-s {} is outside {}..={}",
                self.default_ttl_s, self.min_ttl_s, self.max_ttl_s
            ));
        }
        if !(1024..=MAX_REGISTRATION_BYTES).contains(&self.max_body_bytes) {
            problems.push(format!(
                "--max-body-bytes must be 1024..={MAX_REGISTRATION_BYTES}: a larger registration could exceed \
                 what a router decodes in one Watch message"
            ));
        }
        if self.max_schema_bytes < 1024 || self.max_schema_bytes > self.max_body_bytes {
            problems.push(format!(
                "--max-schema-bytes {} must be at least 1024 and not above --max-body-bytes {}",
                self.max_schema_bytes, self.max_body_bytes
            ));
        }
        if !(4..=1024).contains(&self.max_schema_depth) {
            problems.push(format!("--max-schema-depth {} must be 4..=1024", self.max_schema_depth));
        }
        let auth = self.auth.config().unwrap_or_else(|why| {
            problems.push(why);
            AuthConfig::InsecureNoAuth
        });
        let listener_tls = self.tls.files(&mut problems);
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Settings {
            listen: self.listen,
            store,
            acl: self.acl.clone(),
            auth,
            listener_tls,
            service: RegistryConfig {
                tenant: self.tenant.clone(),
                tenant_map: self.tenant_map.clone(),
                ttl: TtlBounds {
                    min_s: self.min_ttl_s,
                    max_s: self.max_ttl_s,
                    default_s: self.default_ttl_s,
                },
                schema: crate::validate::SchemaBounds {
                    max_bytes: self.max_schema_bytes,
                    max_depth: self.max_schema_depth,
                },
                max_body_bytes: self.max_body_bytes,
            },
        })
    }
}
