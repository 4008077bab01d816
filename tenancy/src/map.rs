//! The tenant map (DESIGN §8 "Tenants"): which tenants a process serves,
//! where each one's state lives and what each may use.
//!
//! ```yaml
//! version: 1
//! tenants:
//!   default: {}
//!   team-a:
//!     redis: rediss://redis-a:6380        # its own Redis; absent: the shared --redis
//!     acl: /etc/agent-reach/acl-team-a.yaml  # its policy; absent: the process's --acl
//!     quotas: {rate_per_s: 500, burst: 1000, concurrency: 64, task_backlog: 10000}
//! ```
//!
//! The registry, the router and the context service each read the same file
//! (`--tenant-map`). It is polled every second like `acl.yaml`: a valid edit
//! is published to the [`TenantMapHandle`]'s subscribers, a broken one is
//! logged and the last good map kept. Parsing is strict (unknown fields are
//! errors, so a misspelt `quota:` is never ignored) and every problem is
//! reported at once, each naming its tenant.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use agent_reach_stores::redis_url::{redact, RedisUrl};

/// How often the file is looked at.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The tenants in the map, by name.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantMap {
    tenants: BTreeMap<String, TenantEntry>,
}

/// One tenant's placement and quotas.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TenantEntry {
    /// Its own Redis (a URL as `--redis` takes); `None`: the shared one, under
    /// its `{prefix}:{tenant}` keys like every tenant.
    pub redis: Option<String>,
    /// Its own `acl.yaml`; `None`: the process's `--acl`.
    pub acl: Option<PathBuf>,
    pub quotas: Quotas,
}

/// What a tenant may use: of all the routers sharing a `--redis` (they
/// exchange their shares, design §3.10.11), else of one router, as the
/// `limits:` of `acl.yaml`. `None`: unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Quotas {
    /// Requests a second, synchronous calls and task submissions together.
    pub rate_per_s: Option<f64>,
    /// The bucket's depth (default: one second's worth, at least 1).
    pub burst: Option<u32>,
    /// Synchronous calls in flight at once.
    pub concurrency: Option<u32>,
    /// Tasks accepted and not yet ended (pending, running, retrying).
    pub task_backlog: Option<u64>,
}

impl Quotas {
    /// Whether any quota is set.
    pub fn any(&self) -> bool {
        self.rate_per_s.is_some() || self.concurrency.is_some() || self.task_backlog.is_some()
    }

    /// The bucket's depth for `rate_per_s`.
    pub fn burst_for(&self, rate_per_s: f64) -> u32 {
        // A rate is at most a few million a second: the cast saturates anyway.
        self.burst.unwrap_or_else(|| (rate_per_s.ceil() as u32).max(1))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    version: u32,
    tenants: BTreeMap<String, EntryForm>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EntryForm {
    redis: Option<String>,
    acl: Option<PathBuf>,
    #[serde(default)]
    quotas: QuotasForm,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct QuotasForm {
    rate_per_s: Option<f64>,
    burst: Option<u32>,
    concurrency: Option<u32>,
    task_backlog: Option<u64>,
}

impl TenantMap {
    /// A map of one tenant with no quotas and the shared stores (a process
    /// without `--tenant-map` serves its `--tenant` alone).
    pub fn single(tenant: &str) -> Self {
        Self {
            tenants: BTreeMap::from([(tenant.to_string(), TenantEntry::default())]),
        }
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read the tenant map {}: {error}", path.display()))?;
        Self::parse(&text).map_err(|problems| {
            format!(
                "invalid tenant map {}:\n  - {}",
                path.display(),
                problems.join("\n  - ")
            )
        })
    }

    /// Parses the file's text; every problem found, each naming its place.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let form: FileForm = serde_yaml::from_str(text).map_err(|error| vec![error.to_string()])?;
        let mut problems = Vec::new();
        if form.version != 1 {
            problems.push(format!("version {} is not supported (expected 1)", form.version));
        }
        if form.tenants.is_empty() {
            problems.push("`tenants` is empty: name at least one tenant".to_string());
        }
        let mut tenants = BTreeMap::new();
        for (name, entry) in form.tenants {
            if let Err(why) = agent_reach_access::token::check_tenant_name(&name) {
                problems.push(why);
                continue;
            }
            let at = |field: &str| format!("tenants.{name}.{field}");
            if let Some(url) = &entry.redis {
                if let Err(why) = RedisUrl::parse(url) {
                    problems.push(format!("{}: {why}", at("redis")));
                }
            }
            if let Some(acl) = &entry.acl {
                if acl.as_os_str().is_empty() {
                    problems.push(format!("{}: empty path", at("acl")));
                }
            }
            let quotas = entry.quotas;
            if let Some(rate) = quotas.rate_per_s {
                if !(rate.is_finite() && rate > 0.0) {
                    problems.push(format!("{}: {rate} is not a positive number", at("quotas.rate_per_s")));
                }
            }
            if quotas.burst == Some(0) {
                problems.push(format!("{}: must be at least 1", at("quotas.burst")));
            }
            if quotas.burst.is_some() && quotas.rate_per_s.is_none() {
                problems.push(format!("{}: needs quotas.rate_per_s", at("quotas.burst")));
            }
            if quotas.concurrency == Some(0) {
                problems.push(format!(
                    "{}: must be at least 1 (remove the tenant to stop serving it)",
                    at("quotas.concurrency")
                ));
            }
            if quotas.task_backlog == Some(0) {
                problems.push(format!("{}: must be at least 1", at("quotas.task_backlog")));
            }
            tenants.insert(
                name,
                TenantEntry {
                    redis: entry.redis,
                    acl: entry.acl,
                    quotas: Quotas {
                        rate_per_s: quotas.rate_per_s,
                        burst: quotas.burst,
                        concurrency: quotas.concurrency,
                        task_backlog: quotas.task_backlog,
                    },
                },
            );
        }
        if problems.is_empty() {
            Ok(Self { tenants })
        } else {
            Err(problems)
        }
    }

    /// The tenants, by name.
    pub fn tenants(&self) -> impl Iterator<Item = (&str, &TenantEntry)> {
        self.tenants.iter().map(|(name, entry)| (name.as_str(), entry))
    }

    pub fn get(&self, tenant: &str) -> Option<&TenantEntry> {
        self.tenants.get(tenant)
    }

    pub fn contains(&self, tenant: &str) -> bool {
        self.tenants.contains_key(tenant)
    }

    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

impl TenantEntry {
    /// Where its Redis state lives, for logs and the `tenants` verbs (no secrets).
    pub fn placement(&self) -> String {
        match &self.redis {
            Some(url) => format!("own Redis {}", redact(url)),
            None => "shared".to_string(),
        }
    }

    /// Whether `other` differs from this entry in more than its quotas (a
    /// placement or policy change rebuilds the tenant's part; quotas apply live).
    pub fn same_placement(&self, other: &TenantEntry) -> bool {
        self.redis == other.redis && self.acl == other.acl
    }
}

/// The start-up check every service makes of its `--tenant-map`: the file
/// parses, the home tenant (`--tenant`) is in it, every tenant's `acl` file
/// loads. Every problem, for the service's own list of them.
pub fn check_at_start(path: &Path, home: &str) -> Vec<String> {
    let map = match TenantMap::load(path) {
        Ok(map) => map,
        Err(why) => return vec![format!("--tenant-map: {why}")],
    };
    let mut problems = Vec::new();
    if !map.contains(home) {
        problems.push(format!(
            "--tenant `{home}` (the home tenant) is not in the tenant map {}: add it, or pass one it names",
            path.display()
        ));
    }
    for (tenant, entry) in map.tenants() {
        if let Some(acl) = &entry.acl {
            if let Err(error) = agent_reach_access::Acl::load(acl) {
                problems.push(format!("--tenant-map: tenants.{tenant}.acl: {error}"));
            }
        }
    }
    problems
}

/// The live map: the last good one, and a channel that tells subscribers of
/// every valid edit.
#[derive(Clone)]
pub struct TenantMapHandle {
    live: Arc<Live>,
}

struct Live {
    current: tokio::sync::watch::Sender<Arc<TenantMap>>,
    /// Edits refused since start (tests and diagnostics poll it).
    rejected: std::sync::atomic::AtomicU64,
}

impl agent_reach_reload::Follow for Live {
    type Value = TenantMap;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<TenantMap, String> {
        std::str::from_utf8(&contents[0])
            .map_err(|error| vec![format!("not UTF-8: {error}")])
            .and_then(TenantMap::parse)
            .map_err(|problems| problems.join("; "))
    }

    fn apply(&self, map: TenantMap) -> bool {
        if **self.current.borrow() == map {
            return false;
        }
        tracing::info!(message = "Tenant map reloaded.", tenants = map.len());
        self.current.send_replace(Arc::new(map));
        true
    }

    fn observe(&self, outcome: agent_reach_reload::Outcome) {
        if outcome != agent_reach_reload::Outcome::Applied {
            self.rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl TenantMapHandle {
    /// A map that never changes (a process without `--tenant-map`, tests).
    pub fn fixed(map: TenantMap) -> Self {
        let (current, _) = tokio::sync::watch::channel(Arc::new(map));
        Self {
            live: Arc::new(Live {
                current,
                rejected: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// Loads `path` now (start-up fails on a broken file) and polls it every
    /// [`RELOAD_INTERVAL`] while any clone of the handle is alive
    /// ([`agent_reach_reload`]: a broken edit keeps the last good map).
    pub fn load_and_watch(path: &Path) -> Result<Self, String> {
        let reload = agent_reach_reload::Reload {
            what: "tenant map",
            paths: vec![path.to_path_buf()],
            every: RELOAD_INTERVAL,
        };
        let map = TenantMap::load(path)?;
        // What was read now (a change after the load is seen at the first look).
        let initial = reload.read().unwrap_or_default();
        let handle = Self::fixed(map);
        reload.spawn(Arc::downgrade(&handle.live), agent_reach_reload::Seen::applied(initial));
        Ok(handle)
    }

    /// The map in force now.
    pub fn current(&self) -> Arc<TenantMap> {
        self.live.current.borrow().clone()
    }

    /// A receiver that sees every valid edit (`changed()` resolves on each).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<TenantMap>> {
        self.live.current.subscribe()
    }

    /// Edits of the file refused since start (unreadable or invalid).
    pub fn rejected_edits(&self) -> u64 {
        self.live.rejected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Publishes `map` (tests).
    pub fn replace(&self, map: TenantMap) {
        self.live.current.send_replace(Arc::new(map));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
version: 1
tenants:
  default: {}
  team-a:
    redis: redis://:secret@10.0.0.5:6379/0
    acl: /etc/agent-reach/acl-a.yaml
    quotas: {rate_per_s: 500, burst: 1000, concurrency: 64, task_backlog: 10000}
  team-b:
    quotas: {rate_per_s: 2.5}
"#;

    #[test]
    fn parses_every_field() {
        let map = TenantMap::parse(SAMPLE).unwrap();
        assert_eq!(map.len(), 3);
        let a = map.get("team-a").unwrap();
        assert_eq!(a.redis.as_deref(), Some("redis://:secret@10.0.0.5:6379/0"));
        assert_eq!(a.acl.as_deref(), Some(Path::new("/etc/agent-reach/acl-a.yaml")));
        assert_eq!(a.quotas.concurrency, Some(64));
        assert_eq!(a.quotas.task_backlog, Some(10000));
        assert_eq!(a.placement(), "own Redis redis://:***@10.0.0.5:6379/0");
        let b = map.get("team-b").unwrap();
        assert_eq!(b.quotas.burst_for(2.5), 3);
        assert_eq!(map.get("default").unwrap(), &TenantEntry::default());
        assert!(!map.contains("team-c"));
    }

    #[test]
    fn every_problem_is_named() {
        let problems = TenantMap::parse(
            r#"
version: 2
tenants:
  Bad: {}
  a:
    redis: http://x
    quotas: {rate_per_s: -1, concurrency: 0, task_backlog: 0}
  b:
    quotas: {burst: 5}
"#,
        )
        .unwrap_err();
        let all = problems.join("\n");
        for expected in [
            "version 2",
            "tenant `Bad` is not a tenant name",
            "tenants.a.redis",
            "tenants.a.quotas.rate_per_s",
            "tenants.a.quotas.concurrency",
            "tenants.a.quotas.task_backlog",
            "tenants.b.quotas.burst: needs quotas.rate_per_s",
        ] {
            assert!(all.contains(expected), "{expected} missing from:\n{all}");
        }
    }

    #[test]
    fn unknown_fields_and_empty_maps_are_refused() {
        let problems = TenantMap::parse("version: 1\ntenants:\n  a:\n    quota: {rate_per_s: 1}\n").unwrap_err();
        assert!(problems[0].contains("unknown field `quota`"), "{problems:?}");
        let problems = TenantMap::parse("version: 1\ntenants: {}\n").unwrap_err();
        assert!(problems[0].contains("empty"), "{problems:?}");
        assert!(TenantMap::parse("not: [valid").is_err());
    }

    #[test]
    fn the_start_up_check_names_the_home_tenant_and_every_acl_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, "version: 1\ntenants:\n  a:\n    acl: /nonexistent/acl-a.yaml\n").unwrap();
        let problems = check_at_start(&path, "default").join("\n");
        assert!(
            problems.contains("--tenant `default` (the home tenant) is not in"),
            "{problems}"
        );
        assert!(problems.contains("tenants.a.acl"), "{problems}");
        std::fs::write(&path, "version: 1\ntenants:\n  default: {}\n").unwrap();
        assert!(check_at_start(&path, "default").is_empty());
        assert!(check_at_start(&dir.path().join("missing.yaml"), "default")[0].starts_with("--tenant-map: cannot read"));
    }

    #[tokio::test]
    async fn valid_edits_are_published_and_broken_ones_kept_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, "version: 1\ntenants:\n  a: {}\n").unwrap();
        let handle = TenantMapHandle::load_and_watch(&path).unwrap();
        let mut changes = handle.subscribe();
        std::fs::write(&path, "version: 1\ntenants:\n  a: {}\n  b: {}\n").unwrap();
        tokio::time::timeout(Duration::from_secs(10), changes.changed())
            .await
            .unwrap()
            .unwrap();
        assert!(handle.current().contains("b"));
        std::fs::write(&path, "version: 1\ntenants:\n  B: {}\n  c: {}\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while handle.rejected_edits() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the broken edit was never refused"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(handle.current().contains("b"));
        assert!(!handle.current().contains("c"));
    }
}
