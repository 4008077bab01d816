//! How the slow path runs: its flags (`--redis`, callback secrets, workers,
//! retention, tag limits, reclaim), validated into [`TasksSettings`] with every
//! problem reported at once.

use std::path::PathBuf;
use std::time::Duration;

use agent_reach_task_store::{CallbackConfig, StoreConfig};

/// The slow path's flags, part of `agent-reach router` (each also read from an
/// `AGENT_REACH_*` environment variable).
#[derive(Debug, Clone, clap::Args)]
pub struct TaskArgs {
    /// Redis for durable asynchronous tasks (`/v1/tasks`); without it the slow path is off.
    /// redis://, rediss:// (TLS), redis+sentinel://HOST:PORT,.../SERVICE or rediss+sentinel://.
    #[arg(long, env = "AGENT_REACH_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// TLS files and `WAIT` for the task store's Redis.
    #[command(flatten)]
    pub redis_link: agent_reach_stores::RedisLinkArgs,
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
    /// Keep task submissions in this directory (fsynced) while Redis is unreachable, answer
    /// 202 and replay them in order when it is back; without it such submissions answer 503.
    #[arg(long, env = "AGENT_REACH_TASK_BUFFER_DIR", value_name = "PATH")]
    pub task_buffer_dir: Option<PathBuf>,
    /// Most submissions the local buffer holds; beyond it, 503 TASK_BUFFER_FULL.
    #[arg(long, env = "AGENT_REACH_TASK_BUFFER_MAX", default_value_t = 10_000)]
    pub task_buffer_max: usize,
    /// A task claimed by a router that has not finished it after this many seconds is taken over.
    #[arg(long, env = "AGENT_REACH_TASK_RECLAIM_AFTER_S", default_value_t = 120)]
    pub task_reclaim_after_s: u64,
    /// How often, in milliseconds, this router exchanges what its callers and
    /// tenants asked for with the other routers on the same --redis, so that
    /// tenants' quotas and acl.yaml's limits hold across all replicas (each
    /// router enforces its share locally). 0: each replica counts its own.
    #[arg(long, env = "AGENT_REACH_QUOTA_SHARE_MS", default_value_t = 100)]
    pub quota_share_ms: u64,
    /// The trail (DESIGN §9): every call this router admits recorded in --redis, in
    /// tamper-evident chains, off the request path; `off` records nothing.
    #[arg(long, env = "AGENT_REACH_TRAIL", value_enum, default_value_t = Switch::On)]
    pub trail: Switch,
    /// How long trail records are kept, in seconds.
    #[arg(long, env = "AGENT_REACH_TRAIL_RETENTION_S", default_value_t = 7 * 24 * 3600)]
    pub trail_retention_s: u64,
    /// Trail records the buffers hold at most, and the writer besides (the batch
    /// being written and those taken since); beyond it (Redis down or slower
    /// than the calls) records are dropped and counted, and calls never wait.
    #[arg(long, env = "AGENT_REACH_TRAIL_BUFFER", default_value_t = 65_536)]
    pub trail_buffer: usize,
    /// What CPU sealing and writing the trail's records gets: `idle`, only
    /// what the calls leave (a SCHED_IDLE thread on Linux; the calls'
    /// priority for a batch that thread has not started within 0.5 s or fell
    /// behind on); `normal`, the calls' own priority always.
    #[arg(long, env = "AGENT_REACH_TRAIL_WRITER_PRIORITY", value_enum, default_value_t = TrailPriority::Idle)]
    pub trail_writer_priority: TrailPriority,
    /// Also export every written trail record as an OTLP log record to this
    /// OTLP/gRPC collector (`http://host:4317`); headers from
    /// `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_LOGS_HEADERS`.
    #[arg(long, env = "AGENT_REACH_TRAIL_OTLP_ENDPOINT")]
    pub trail_otlp_endpoint: Option<String>,
    /// Members redacted from the payloads the trail records (`trail.payloads` in
    /// acl.yaml): a name whose last words are one of these; comma separated; `none`.
    #[arg(
        long = "credential-fields",
        env = "AGENT_REACH_CREDENTIAL_FIELDS",
        value_delimiter = ',',
        default_value = "password,secret,token,api_key,authorization"
    )]
    pub credential_fields: Vec<String>,
}

/// A feature on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// What CPU sealing and writing the trail's records gets (`--trail-writer-priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TrailPriority {
    Idle,
    Normal,
}

/// How the trail is kept, when it is on.
#[derive(Debug, Clone)]
pub struct TrailConfig {
    pub settings: agent_reach_trail::TrailSettings,
    pub credentials: agent_reach_access::credentials::CredentialFields,
    /// Where written records are also exported as OTLP logs (`--trail-otlp-endpoint`).
    pub otlp: Option<TrailOtlp>,
}

/// An OTLP/gRPC collector the trail's records are copied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrailOtlp {
    pub endpoint: String,
    pub headers: Vec<(String, String)>,
}

impl TrailOtlp {
    /// `endpoint` (an `http://` or `https://` URL) with the headers of the
    /// `OTEL_EXPORTER_OTLP_*HEADERS` variables.
    pub fn new(endpoint: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(endpoint)
            .map_err(|error| format!("--trail-otlp-endpoint `{endpoint}` is not a URL: {error}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(format!(
                "--trail-otlp-endpoint `{endpoint}` must be an http:// or https:// URL of an OTLP/gRPC collector, e.g. http://127.0.0.1:4317"
            ));
        }
        let headers = agent_reach_telemetry::otlp_logs::headers_from_env().map_err(|error| error.to_string())?;
        Ok(Self {
            endpoint: endpoint.to_string(),
            headers,
        })
    }
}

impl TaskArgs {
    /// The slow path's settings (`None` without `--redis`); problems are added to `problems`.
    pub fn settings(&self, problems: &mut Vec<String>) -> Option<TasksSettings> {
        let redis = self.redis.clone()?;
        let link = self.redis_link.link(&redis, problems);
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
        let mut callbacks = CallbackConfig::new(default_secret);
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
        if self.task_buffer_dir.is_some() && self.task_buffer_max == 0 {
            problems.push("--task-buffer-max must be at least 1".to_string());
        }
        if self.task_workers == 0 {
            problems.push("--task-workers must be at least 1".to_string());
        }
        if self.quota_share_ms > 10_000 {
            problems.push(format!(
                "--quota-share-ms {} must be within 0..=10000 (0: each replica counts its own)",
                self.quota_share_ms
            ));
        }
        if self.trail_buffer == 0 {
            problems.push("--trail-buffer must be at least 1".to_string());
        }
        let patterns: Vec<&str> = self
            .credential_fields
            .iter()
            .map(String::as_str)
            .filter(|pattern| *pattern != "none")
            .collect();
        let credentials = agent_reach_access::credentials::CredentialFields::new(&patterns).unwrap_or_else(|why| {
            problems.push(format!("--credential-fields: {why}"));
            agent_reach_access::credentials::CredentialFields::default()
        });
        let otlp = match (&self.trail_otlp_endpoint, self.trail) {
            (Some(endpoint), Switch::On) => TrailOtlp::new(endpoint).map_err(|why| problems.push(why)).ok(),
            (Some(_), Switch::Off) => {
                problems.push("--trail-otlp-endpoint needs the trail on (it exports the trail's records)".to_string());
                None
            }
            (None, _) => None,
        };
        let trail = (self.trail == Switch::On).then(|| TrailConfig {
            settings: agent_reach_trail::TrailSettings {
                buffer: self.trail_buffer.max(1),
                retention: Duration::from_secs(self.trail_retention_s.max(60)),
                priority: match self.trail_writer_priority {
                    TrailPriority::Idle => agent_reach_trail::WriterPriority::Idle,
                    TrailPriority::Normal => agent_reach_trail::WriterPriority::Normal,
                },
                ..Default::default()
            },
            credentials,
            otlp,
        });
        Some(TasksSettings {
            trail,
            redis,
            store: StoreConfig {
                retention: Duration::from_secs(self.task_retention_s.max(60)),
                tls: link.as_ref().map(|link| link.tls.clone()).unwrap_or_default(),
                wait: link.as_ref().and_then(|link| link.wait),
                local_buffer: self
                    .task_buffer_dir
                    .clone()
                    .map(|dir| agent_reach_task_store::LocalBuffer {
                        dir,
                        limit: self.task_buffer_max,
                    }),
                ..Default::default()
            },
            callbacks,
            workers: self.task_workers,
            reclaim_after: Duration::from_secs(self.task_reclaim_after_s.max(1)),
            max_task_attempts: 3,
            quota_share: (self.quota_share_ms > 0).then(|| Duration::from_millis(self.quota_share_ms)),
            tag_limits: self
                .task_tag_limits
                .iter()
                .filter_map(|text| {
                    TagLimit::parse(text)
                        .map_err(|why| problems.push(format!("--task-tag-limit: {why}")))
                        .ok()
                })
                .collect(),
        })
    }
}

#[derive(Debug, Clone)]
pub struct TasksSettings {
    pub redis: String,
    pub store: StoreConfig,
    pub callbacks: CallbackConfig,
    /// Tasks delivered at once by this router.
    pub workers: usize,
    /// A claimed task not finished after this long is taken over (its router died).
    pub reclaim_after: Duration,
    /// Deliveries of one task when the capability is unavailable (503-like outcomes).
    pub max_task_attempts: u32,
    /// At most `limit` tasks at once for capabilities whose instances all carry
    /// tag `key: value` (e.g. `class: bulk` → 5); the rest wait, high priority first.
    pub tag_limits: Vec<TagLimit>,
    /// How often limits are shared with the other routers on this Redis
    /// (`--quota-share-ms`); `None`: each replica counts its own.
    pub quota_share: Option<Duration>,
    /// The trail, kept in this Redis (`--trail`); `None`: off.
    pub trail: Option<TrailConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagLimit {
    pub key: String,
    pub value: String,
    pub limit: usize,
}

impl TagLimit {
    /// Parses `KEY=VALUE:LIMIT`, e.g. `class=bulk:5`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = || format!("`{text}` is not KEY=VALUE:LIMIT (e.g. class=bulk:5)");
        let (tag, limit) = text.rsplit_once(':').ok_or_else(invalid)?;
        let (key, value) = tag.split_once('=').ok_or_else(invalid)?;
        let limit: usize = limit.parse().map_err(|_| invalid())?;
        if key.is_empty() || value.is_empty() || limit == 0 {
            return Err(invalid());
        }
        Ok(Self {
            key: key.to_string(),
            value: value.to_string(),
            limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_limits_parse() {
        assert_eq!(
            TagLimit::parse("class=bulk:5"),
            Ok(TagLimit {
                key: "class".into(),
                value: "bulk".into(),
                limit: 5
            })
        );
        for bad in ["class=bulk", "bulk:5", "class=bulk:0", "=x:1", "class=:2"] {
            assert!(TagLimit::parse(bad).is_err(), "{bad}");
        }
    }

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        tasks: TaskArgs,
    }

    fn settings_with(share_ms: &str) -> (Option<TasksSettings>, Vec<String>) {
        settings_from(&["--quota-share-ms", share_ms])
    }

    fn settings_from(extra: &[&str]) -> (Option<TasksSettings>, Vec<String>) {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("callbacks.secret");
        std::fs::write(&secret, [b'k'; 40]).unwrap();
        let mut args = vec![
            "router",
            "--redis",
            "redis://127.0.0.1:6379",
            "--callback-secret-file",
            secret.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let flags = Flags::parse_from(args);
        let mut problems = Vec::new();
        (flags.tasks.settings(&mut problems), problems)
    }

    #[test]
    fn the_trails_otlp_endpoint_is_a_collectors_url_and_needs_the_trail() {
        let (settings, problems) = settings_from(&["--trail-otlp-endpoint", "http://127.0.0.1:4317"]);
        assert!(problems.is_empty(), "{problems:?}");
        let otlp = settings.unwrap().trail.unwrap().otlp.unwrap();
        assert_eq!(otlp.endpoint, "http://127.0.0.1:4317");
        for bad in ["127.0.0.1:4317", "ftp://collector:4317", "http://"] {
            let (_, problems) = settings_from(&["--trail-otlp-endpoint", bad]);
            assert!(
                problems.iter().any(|problem| problem.contains("--trail-otlp-endpoint")),
                "{bad}: {problems:?}"
            );
        }
        let (_, problems) = settings_from(&["--trail", "off", "--trail-otlp-endpoint", "http://127.0.0.1:4317"]);
        assert!(
            problems.iter().any(|problem| problem.contains("needs the trail on")),
            "{problems:?}"
        );
    }

    #[test]
    fn the_trail_seals_at_idle_priority_unless_told_otherwise() {
        let priority = |extra: &[&str]| settings_from(extra).0.unwrap().trail.unwrap().settings.priority;
        assert_eq!(priority(&[]), agent_reach_trail::WriterPriority::Idle);
        assert_eq!(
            priority(&["--trail-writer-priority", "normal"]),
            agent_reach_trail::WriterPriority::Normal
        );
        use clap::Parser;
        let refused = Flags::try_parse_from(["router", "--trail-writer-priority", "high"]);
        assert!(refused.is_err_and(|error| error.to_string().contains("idle, normal")));
    }

    #[test]
    fn the_quota_share_interval_is_bounded_and_zero_turns_sharing_off() {
        let (_, problems) = settings_with("60000");
        assert!(
            problems
                .iter()
                .any(|problem| problem.contains("--quota-share-ms 60000")),
            "{problems:?}"
        );
        let (settings, problems) = settings_with("0");
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings.unwrap().quota_share, None);
        let (settings, _) = settings_with("100");
        assert_eq!(settings.unwrap().quota_share, Some(Duration::from_millis(100)));
    }
}
