//! The Redis link flags the context service and the router share (DESIGN
//! §7.8), validated with the `--redis` URL into a [`RedisLink`], every
//! problem reported at once.

use std::path::PathBuf;
use std::time::Duration;

use crate::redis_url::RedisUrl;
use crate::tls::TlsFiles;

/// How to trust Redis over `rediss://`, and who we are to it. The context
/// service takes these alone; the router takes them within [`RedisLinkArgs`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RedisTlsArgs {
    /// CA certificates (PEM) trusted for `rediss://` instead of the system's roots.
    #[arg(long, env = "AGENT_REACH_REDIS_CA_FILE", value_name = "PATH")]
    pub redis_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) presented over `rediss://` (Redis' `tls-auth-clients`).
    #[arg(
        long,
        env = "AGENT_REACH_REDIS_CLIENT_CERT",
        value_name = "PATH",
        requires = "redis_client_key"
    )]
    pub redis_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "AGENT_REACH_REDIS_CLIENT_KEY",
        value_name = "PATH",
        requires = "redis_client_cert"
    )]
    pub redis_client_key: Option<PathBuf>,
}

/// How to reach Redis beyond its URL: trust, identity, and `WAIT`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RedisLinkArgs {
    #[command(flatten)]
    pub tls: RedisTlsArgs,
    /// Acknowledge a write only once this many replicas have it (Redis `WAIT`), so it
    /// survives a failover; 0 = off. Costs one replication round trip per write.
    #[arg(long, env = "AGENT_REACH_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// How long a write waits for those replicas before it answers 503.
    #[arg(long, env = "AGENT_REACH_REDIS_WAIT_TIMEOUT_MS", default_value_t = 1000)]
    pub redis_wait_timeout_ms: u64,
}

/// `WAIT replicas timeout` after each write that must survive a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub replicas: u32,
    pub timeout: Duration,
}

impl Wait {
    pub fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A validated link to Redis: where, how to trust it, and whether writes wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisLink {
    pub url: RedisUrl,
    pub tls: TlsFiles,
    pub wait: Option<Wait>,
}

impl RedisLink {
    /// A link with no TLS files and no `WAIT` (tests, embedded uses).
    pub fn parse(url: &str) -> Result<Self, String> {
        Ok(Self {
            url: RedisUrl::parse(url)?,
            tls: TlsFiles::default(),
            wait: None,
        })
    }

    pub fn with_wait(mut self, wait: Option<Wait>) -> Self {
        self.wait = wait;
        self
    }

    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = tls;
        self
    }
}

impl RedisLinkArgs {
    /// The link for `url` (the `--redis` flag); problems are added to `problems`.
    pub fn link(&self, url: &str, problems: &mut Vec<String>) -> Option<RedisLink> {
        let link = self.tls.link(url, problems);
        let wait = (self.redis_wait_replicas > 0).then(|| Wait {
            replicas: self.redis_wait_replicas,
            timeout: Duration::from_millis(self.redis_wait_timeout_ms),
        });
        if wait.is_some() && self.redis_wait_timeout_ms == 0 {
            // WAIT with timeout 0 blocks forever: a lost replica would hang every write.
            problems.push("--redis-wait-timeout-ms must be above 0 (WAIT 0 waits forever)".to_string());
        }
        Some(link?.with_wait(wait))
    }
}

impl RedisTlsArgs {
    /// The link for `url` (the `--redis` flag), without `WAIT`; problems are
    /// added to `problems`.
    pub fn link(&self, url: &str, problems: &mut Vec<String>) -> Option<RedisLink> {
        let tls = TlsFiles::read(
            "--redis",
            self.redis_ca_file.as_deref(),
            self.redis_client_cert.as_deref(),
            self.redis_client_key.as_deref(),
            problems,
        );
        match RedisUrl::parse(url) {
            Ok(url) => {
                if !url.tls && !tls.is_empty() {
                    problems.push(format!(
                        "--redis-ca-file / --redis-client-cert need a TLS URL (rediss://, rediss+sentinel:// or rediss+cluster://), not `{url}`"
                    ));
                }
                Some(RedisLink { url, tls, wait: None })
            }
            Err(why) => {
                problems.push(format!("--redis: {why}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_reported_together() {
        let args = RedisLinkArgs {
            tls: RedisTlsArgs {
                redis_ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
                ..Default::default()
            },
            redis_wait_replicas: 1,
            redis_wait_timeout_ms: 0,
        };
        let mut problems = Vec::new();
        let link = args.link("redis://127.0.0.1:6379", &mut problems);
        assert!(link.is_some());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("cannot read the --redis-ca-file /nonexistent/ca.pem"));
        assert!(problems[1].contains("WAIT 0 waits forever"));

        let mut problems = Vec::new();
        assert!(RedisLinkArgs::default()
            .link("redis://a:1,b:2", &mut problems)
            .is_none());
        assert!(problems[0].starts_with("--redis: invalid Redis URL"), "{problems:?}");
    }
}
