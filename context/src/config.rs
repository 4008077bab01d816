//! Command-line flags of `agent-reach context` (DESIGN §7), each also read
//! from an `AGENT_REACH_*` environment variable, validated into [`Settings`]
//! with every problem reported at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::{AuthArgs, AuthConfig};

use crate::model::StorePolicy;
use crate::service::ContextConfig;
use crate::store::Namespace;
use crate::validate::CredentialFields;

#[derive(Debug, Clone, clap::Args)]
pub struct ContextArgs {
    /// Address serving gRPC and HTTP/JSON on one port.
    #[arg(long, env = "AGENT_REACH_CONTEXT_LISTEN", default_value = "127.0.0.1:7600")]
    pub listen: SocketAddr,
    /// Redis URL: redis://HOST:PORT[/DB], redis+sentinel://HOST:PORT,HOST:PORT,.../SERVICE[/DB]
    /// (the Sentinels name the primary; failovers are followed without a restart) or
    /// redis+cluster://HOST:PORT,HOST:PORT,... (a Redis Cluster: any reachable node, the rest
    /// discovered); rediss://, rediss+sentinel://, rediss+cluster:// for TLS, certificates verified.
    #[arg(long, env = "AGENT_REACH_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// TLS files, and `WAIT` for writes that must survive a failover.
    #[command(flatten)]
    pub redis_link: agent_reach_stores::RedisLinkArgs,
    /// DEVELOPMENT ONLY: keep contexts in memory instead of Redis (lost on exit, not shared).
    #[arg(long, env = "AGENT_REACH_EMBEDDED_STORE", conflicts_with = "redis")]
    pub embedded_store: bool,
    /// The access policy (its `context:` section); reloaded when it changes.
    #[arg(long, env = "AGENT_REACH_ACL", default_value = "acl.yaml")]
    pub acl: PathBuf,
    /// Tenant whose contexts this service serves (`{prefix}:{tenant}:ctx:{id}`); with
    /// --tenant-map, the home tenant (answers requests without a token) and must be in the map.
    #[arg(long, env = "AGENT_REACH_TENANT", default_value = "default")]
    pub tenant: String,
    /// Serve every tenant this tenant map names (YAML, DESIGN §8 "Tenants"), each on its
    /// placement (its `redis`, else --redis, under `{prefix}:{tenant}`) with its `acl`
    /// (else --acl), picked by the token's `tenant` claim; reloaded when it changes.
    /// Default: --tenant alone.
    #[arg(long, env = "AGENT_REACH_TENANT_MAP", value_name = "PATH")]
    pub tenant_map: Option<PathBuf>,
    /// First part of every Redis key this service writes.
    #[arg(long, env = "AGENT_REACH_CONTEXT_KEY_PREFIX", default_value = "agent-reach")]
    pub key_prefix: String,
    /// Lifetime of a `default`-tier context after its last write (e.g. 30m, 90s, 500ms).
    #[arg(long, env = "AGENT_REACH_CONTEXT_DEFAULT_TTL", default_value = "30m", value_parser = parse_duration)]
    pub default_ttl: Duration,
    /// Lifetime of a `one_shot`-tier context after its last write.
    #[arg(long, env = "AGENT_REACH_CONTEXT_ONE_SHOT_TTL", default_value = "5m", value_parser = parse_duration)]
    pub one_shot_ttl: Duration,
    /// A context nobody read or wrote for this long is removed by the sweeper.
    #[arg(long, env = "AGENT_REACH_CONTEXT_IDLE_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How often this replica sweeps idle contexts (safe with several replicas).
    #[arg(long, env = "AGENT_REACH_CONTEXT_SWEEP_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// Most fields one context may hold.
    #[arg(long, env = "AGENT_REACH_CONTEXT_MAX_FIELDS", default_value_t = 64)]
    pub max_fields: usize,
    /// Largest JSON value of one field, in bytes.
    #[arg(long, env = "AGENT_REACH_CONTEXT_MAX_FIELD_BYTES", default_value_t = 16 * 1024)]
    pub max_field_bytes: usize,
    /// Largest context (names plus JSON values of all fields), in bytes.
    #[arg(long, env = "AGENT_REACH_CONTEXT_MAX_CONTEXT_BYTES", default_value_t = 256 * 1024)]
    pub max_context_bytes: usize,
    /// Largest accepted request body (HTTP) or message (gRPC), in bytes.
    #[arg(long, env = "AGENT_REACH_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Bound on every Redis call; past it the request answers 503 CONTEXT_STORE_UNAVAILABLE.
    #[arg(long, env = "AGENT_REACH_CONTEXT_REDIS_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub redis_timeout: Duration,
    /// Request-serving threads (one single-threaded runtime each, with its own
    /// Redis connection); 0 means one per CPU core.
    #[arg(long, env = "AGENT_REACH_CONTEXT_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Field names refused as credentials (CREDENTIAL_FIELD): a name whose last words are one
    /// of these (`user.password`, `github_token`); comma separated; `none` refuses nothing.
    #[arg(
        long = "credential-fields",
        env = "AGENT_REACH_CONTEXT_CREDENTIAL_FIELDS",
        value_delimiter = ',',
        default_value = "password,secret,token,api_key,authorization"
    )]
    pub credential_fields: Vec<String>,
    #[command(flatten)]
    pub tls: agent_reach_serving::tls::ListenerArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
}

/// Where contexts live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    Redis {
        /// The URL and, for `rediss://`, the CA bundle and client identity.
        link: Box<agent_reach_stores::RedisLink>,
        namespace: Namespace,
        /// Bound on every Redis call.
        timeout: Duration,
    },
    /// In memory, for `agent-reach dev` and tests. Not shared, lost on exit.
    Embedded,
}

impl StoreChoice {
    /// Redis at `url`, without TLS files (a `rediss://` URL then trusts the
    /// system's roots).
    pub fn redis(url: &str, namespace: Namespace, timeout: Duration) -> Result<Self, String> {
        Ok(StoreChoice::Redis {
            link: Box::new(agent_reach_stores::RedisLink::parse(url)?),
            namespace,
            timeout,
        })
    }
}

/// Everything [`crate::build`] needs. `agent-reach dev` builds one directly:
/// `Settings { listen, threads: 1, store: StoreChoice::Embedded, acl, auth, listener_tls: None, service: ContextConfig::default() }`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    /// Request-serving threads of [`crate::run`] (0: one per core).
    pub threads: usize,
    pub store: StoreChoice,
    pub acl: PathBuf,
    pub auth: AuthConfig,
    /// TLS on the listener; `None`: plain TCP.
    pub listener_tls: Option<agent_reach_serving::tls::ServerFiles>,
    pub service: ContextConfig,
}

/// Parses `500ms`, `90s`, `15m`, `2h` (or plain seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 500ms, 30s, 15m or 2h"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "" | "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        _ => return Err(format!("unknown unit `{unit}` in `{text}`; use ms, s, m or h")),
    };
    Ok(duration)
}

impl ContextArgs {
    pub fn validate(&self) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let patterns: Vec<&String> = self
            .credential_fields
            .iter()
            .filter(|pattern| pattern.as_str() != "none")
            .collect();
        let credential_fields = CredentialFields::new(&patterns).unwrap_or_else(|why| {
            problems.push(format!("--credential-fields: {why}"));
            CredentialFields::default()
        });
        let namespace = Namespace {
            prefix: self.key_prefix.clone(),
            tenant: self.tenant.clone(),
        };
        let store = match (&self.redis, self.embedded_store) {
            (Some(url), _) => match self.redis_link.link(url, &mut problems) {
                Some(link) => StoreChoice::Redis {
                    link: Box::new(link),
                    namespace,
                    timeout: self.redis_timeout,
                },
                // The problem is reported; validation fails below.
                None => StoreChoice::Embedded,
            },
            (None, true) => StoreChoice::Embedded,
            (None, false) => {
                problems.push("no store: pass --redis URL (or --embedded-store for development)".to_string());
                StoreChoice::Embedded
            }
        };
        if let Err(why) = agent_reach_access::token::check_tenant_name(&self.tenant) {
            problems.push(format!("--tenant: {why}"));
        }
        if let Some(path) = &self.tenant_map {
            if self.embedded_store {
                problems.push(
                    "--tenant-map needs --redis: the embedded store serves one tenant (development only)".to_string(),
                );
            }
            problems.extend(agent_reach_tenancy::check_at_start(path, &self.tenant));
        }
        if self.key_prefix.is_empty()
            || !self
                .key_prefix
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b':'))
        {
            problems.push(format!(
                "--key-prefix `{}` must be non-empty A-Z a-z 0-9 - _ . :",
                self.key_prefix
            ));
        }
        for (flag, value) in [
            ("--default-ttl", self.default_ttl),
            ("--one-shot-ttl", self.one_shot_ttl),
            ("--idle-timeout", self.idle_timeout),
            ("--sweep-interval", self.sweep_interval),
            ("--redis-timeout", self.redis_timeout),
        ] {
            if value < Duration::from_millis(10) {
                problems.push(format!("{flag} must be at least 10ms"));
            }
        }
        if self.max_fields == 0 {
            problems.push("--max-fields must be at least 1".to_string());
        }
        if self.max_field_bytes == 0 || self.max_field_bytes > self.max_context_bytes {
            problems.push(format!(
                "--max-field-bytes {} must be at least 1 and not above --max-context-bytes {}",
                self.max_field_bytes, self.max_context_bytes
            ));
        }
        if self.max_body_bytes < 1024 {
            problems.push("--max-body-bytes must be at least 1024".to_string());
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
            threads: self.threads,
            store,
            acl: self.acl.clone(),
            auth,
            listener_tls,
            service: ContextConfig {
                policy: StorePolicy {
                    default_ttl: self.default_ttl,
                    one_shot_ttl: self.one_shot_ttl,
                    idle_timeout: self.idle_timeout,
                    max_fields: self.max_fields,
                    max_context_bytes: self.max_context_bytes,
                },
                max_field_bytes: self.max_field_bytes,
                max_body_bytes: self.max_body_bytes,
                sweep_interval: self.sweep_interval,
                credential_fields,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ContextArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("3y").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn defaults_match_the_design() {
        let cli = Cli::try_parse_from(["context", "--redis", "redis://127.0.0.1:6379", "--insecure-no-auth"]).unwrap();
        let settings = cli.args.validate().unwrap();
        assert_eq!(settings.listen.to_string(), "127.0.0.1:7600");
        assert_eq!(settings.service, ContextConfig::default());
        assert!(matches!(settings.store, StoreChoice::Redis { .. }));
    }

    #[test]
    fn writes_can_wait_for_replicas() {
        let cli = Cli::try_parse_from([
            "context",
            "--redis",
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
            "--redis-wait-replicas",
            "1",
            "--redis-wait-timeout-ms",
            "250",
            "--insecure-no-auth",
        ])
        .unwrap();
        let settings = cli.args.validate().unwrap();
        let StoreChoice::Redis { link, .. } = settings.store else {
            panic!("a Redis store");
        };
        assert!(link.url.is_cluster());
        assert_eq!(
            link.wait,
            Some(agent_reach_stores::Wait {
                replicas: 1,
                timeout: Duration::from_millis(250)
            })
        );
    }

    #[test]
    fn redis_tls_files_are_checked_with_the_url() {
        let cli = Cli::try_parse_from([
            "context",
            "--redis",
            "rediss://127.0.0.1:6380",
            "--redis-ca-file",
            "/nonexistent/ca.pem",
            "--insecure-no-auth",
        ])
        .unwrap();
        let problems = cli.args.validate().unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("cannot read the --redis-ca-file /nonexistent/ca.pem"));

        let pki = agent_reach_testkit::pki::Pki::new("context-config");
        let ca = pki.ca_file.clone();
        let plain = Cli::try_parse_from([
            "context",
            "--redis",
            "redis://127.0.0.1:6379",
            "--redis-ca-file",
            ca.to_str().unwrap(),
            "--insecure-no-auth",
        ])
        .unwrap();
        let problems = plain.args.validate().unwrap_err();
        assert!(problems[0].contains("need a TLS URL (rediss://"), "{problems:?}");

        let tls = Cli::try_parse_from([
            "context",
            "--redis",
            "rediss://127.0.0.1:6380",
            "--redis-ca-file",
            ca.to_str().unwrap(),
            "--insecure-no-auth",
        ])
        .unwrap();
        let settings = tls.args.validate().unwrap();
        let StoreChoice::Redis { link, .. } = settings.store else {
            panic!("not Redis")
        };
        assert!(link.url.tls && link.tls.ca.is_some());
    }

    #[test]
    fn the_tenant_map_is_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("tenants.yaml");
        let args = |extra: &[&str]| {
            let mut argv = vec!["context", "--insecure-no-auth", "--tenant-map", map.to_str().unwrap()];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap().args
        };
        let redis = ["--redis", "redis://127.0.0.1:6379"];

        let problems = args(&redis).validate().unwrap_err();
        assert!(problems[0].contains("cannot read the tenant map"), "{problems:?}");

        std::fs::write(
            &map,
            "version: 1\ntenants:\n  team-a:\n    redis: http://x\n    quota: {}\n",
        )
        .unwrap();
        let problems = args(&redis).validate().unwrap_err();
        assert!(problems[0].contains("unknown field `quota`"), "{problems:?}");

        std::fs::write(
            &map,
            "version: 1\ntenants:\n  team-a:\n    redis: http://x\n  team-b:\n    redis: redis://127.0.0.1:nope\n",
        )
        .unwrap();
        let problems = args(&redis).validate().unwrap_err().join("\n");
        assert!(
            problems.contains("tenants.team-a.redis: invalid Redis URL"),
            "{problems}"
        );
        assert!(
            problems.contains("tenants.team-b.redis: invalid Redis URL"),
            "{problems}"
        );

        std::fs::write(
            &map,
            "version: 1\ntenants:\n  team-a:\n    acl: /nonexistent/acl-a.yaml\n",
        )
        .unwrap();
        let problems = args(&redis).validate().unwrap_err().join("\n");
        for expected in [
            "--tenant `default` (the home tenant) is not in the tenant map",
            "tenants.team-a.acl: ",
        ] {
            assert!(problems.contains(expected), "{expected} missing from:\n{problems}");
        }

        std::fs::write(
            &map,
            "version: 1\ntenants:\n  default: {}\n  team-a:\n    redis: redis://127.0.0.1:6380\n",
        )
        .unwrap();
        assert!(args(&redis).validate().is_ok());
        assert!(args(&["--redis", "redis://127.0.0.1:6379", "--tenant", "team-a"])
            .validate()
            .is_ok());
        let problems = args(&["--embedded-store"]).validate().unwrap_err();
        assert!(problems[0].contains("--tenant-map needs --redis"), "{problems:?}");
    }

    #[test]
    fn every_problem_is_reported() {
        let cli = Cli::try_parse_from([
            "context",
            "--redis",
            "http://x",
            "--tenant",
            "Bad Tenant",
            "--max-fields",
            "0",
            "--idle-timeout",
            "0s",
        ])
        .unwrap();
        let problems = cli.args.validate().unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        let none = Cli::try_parse_from(["context", "--insecure-no-auth"]).unwrap();
        assert!(none.args.validate().unwrap_err()[0].contains("no store"));
    }
}
