//! The `acl.yaml` policy (DESIGN §5): who may call what (router), who may
//! provide what (registry), who may read which context fields (context).
//!
//! Default deny everywhere. Patterns are `*`, `prefix.*` or an exact name.
//! [`AclHandle`] holds the current policy behind an `ArcSwap` (readers take no
//! lock) and [`AclHandle::spawn_reloader`] hot-reloads it: a broken edit keeps
//! the last good policy and is reported by a log line and a metric.

// aHash: the permissions maps are looked up on every routed request.
use ahash::AHashMap as HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Deserialize;

mod chain;

use chain::{parse_chain_rules, Permission, RawChainRule};
pub use chain::{Subject, MAX_DEPTH_LIMIT};

/// How often the file is checked for changes; edits apply within this bound.
pub const RELOAD_INTERVAL: Duration = Duration::from_millis(500);

// === Raw file format ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAcl {
    version: u32,
    #[serde(default)]
    permissions: Vec<RawPermission>,
    #[serde(default)]
    providers: Vec<RawProvider>,
    #[serde(default)]
    context: Vec<RawContext>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    /// Callers who may use the console and the operator API.
    #[serde(default)]
    operators: Vec<String>,
    /// Callers who may read (and replay) the trail, beside the operators.
    #[serde(default)]
    auditors: Vec<String>,
    /// What the trail records beyond who called what (DESIGN §9).
    #[serde(default)]
    trail: RawTrail,
    /// Per-capability `max_depth` of delegation chains (docs/design.md §3.15).
    #[serde(default)]
    chains: Vec<RawChainRule>,
    /// Who approves access requests for which capabilities (DESIGN §2.11).
    #[serde(default)]
    owners: Vec<RawOwner>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOwner {
    capability: String,
    approvers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrail {
    /// Capabilities whose calls' input and output are recorded (credential fields redacted).
    #[serde(default)]
    payloads: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    caller: String,
    #[serde(default)]
    rate_per_s: Option<f64>,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default)]
    concurrency: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPermission {
    caller: String,
    #[serde(default)]
    allow: Vec<String>,
    /// Only when the call's delegation chain passed through one of these callers.
    #[serde(default)]
    via: Vec<String>,
    /// Only on behalf of these original subjects (names, or `group:NAME`).
    #[serde(default)]
    subjects: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    agent: String,
    #[serde(default)]
    provides: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContext {
    agent: String,
    #[serde(default)]
    read: Vec<String>,
    /// Fields the agent may set or delete; absent means it writes nothing.
    #[serde(default)]
    write: Vec<String>,
}

// === Patterns ===

/// `*`, `prefix.*` or an exact dotted name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    Any,
    /// `order.*` is stored as `order.` and matches `order.query`, `order.detail.v2`.
    Prefix(String),
    Exact(String),
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Pattern::Any);
        }
        if let Some(prefix) = text.strip_suffix(".*") {
            check_dotted(prefix).map_err(|why| format!("pattern `{text}`: {why}"))?;
            return Ok(Pattern::Prefix(format!("{prefix}.")));
        }
        check_dotted(text).map_err(|why| format!("pattern `{text}`: {why}"))?;
        Ok(Pattern::Exact(text.to_string()))
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Prefix(prefix) => name.starts_with(prefix.as_str()),
            Pattern::Exact(exact) => exact == name,
        }
    }
}

/// Names are lowercase dotted words: `[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*`.
/// Shared with the registry's validation of capability names.
pub fn check_dotted(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("empty name".to_string());
    }
    for word in text.split('.') {
        let mut chars = word.chars();
        match chars.next() {
            Some(first) if first.is_ascii_lowercase() => {}
            Some(_) => return Err(format!("`{word}` must start with a lowercase letter")),
            None => return Err("empty segment between dots".to_string()),
        }
        if let Some(bad) = chars.find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')) {
            return Err(format!("character `{bad}` is not allowed (use a-z, 0-9, _ and dots)"));
        }
    }
    Ok(())
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Any => f.write_str("*"),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
            Pattern::Exact(exact) => f.write_str(exact),
        }
    }
}

fn any_matches(patterns: &[Pattern], name: &str) -> bool {
    patterns.iter().any(|pattern| pattern.matches(name))
}

// === Limits ===

/// How much one caller may ask of one router (DESIGN §8): a token bucket of
/// `burst` requests refilled at `rate_per_s`, and at most `concurrency` calls
/// in flight. Each caller has its own bucket; an absent field is no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub rate_per_s: Option<f64>,
    pub burst: u32,
    pub concurrency: Option<u32>,
}

// === Policy ===

/// A validated policy. Rules keyed by agent name; `*` as a name applies to every agent.
#[derive(Debug, Default, Clone)]
pub struct Acl {
    permissions: HashMap<String, Vec<Permission>>,
    providers: HashMap<String, Vec<Pattern>>,
    context_read: HashMap<String, Vec<Pattern>>,
    context_write: HashMap<String, Vec<Pattern>>,
    limits: HashMap<String, Limit>,
    operators: Vec<String>,
    auditors: Vec<String>,
    trail_payloads: Vec<Pattern>,
    /// `chains:`: (capability pattern, max_depth), first match wins.
    chain_depths: Vec<(Pattern, u32)>,
    /// `owners:` in file order: who may approve access to what.
    owners: Vec<Owner>,
}

/// One `owners:` entry: the callers who approve (or deny) access requests
/// for the capabilities `capability` matches, and revoke their grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub capability: Pattern,
    pub approvers: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path} is not a valid ACL: {}", problems.join("; "))]
    Invalid { path: PathBuf, problems: Vec<String> },
}

impl Acl {
    /// A policy that denies everything.
    pub fn deny_all() -> Self {
        Self::default()
    }

    pub fn load(path: &Path) -> Result<Self, AclError> {
        let text = std::fs::read_to_string(path).map_err(|error| AclError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Self::parse(&text).map_err(|problems| AclError::Invalid {
            path: path.to_path_buf(),
            problems,
        })
    }

    /// Parses and validates; every problem is reported, not just the first.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let raw: RawAcl = serde_yaml::from_str(text).map_err(|error| vec![error.to_string()])?;
        let mut problems = Vec::new();
        if raw.version != 1 {
            problems.push(format!("version {} is not supported (expected 1)", raw.version));
        }
        let mut acl = Acl::default();
        // Problems with `via:` and `subjects:`, reported after the patterns'.
        let mut conditions = Vec::new();
        let mut add = |section: &str, who: &str, items: &[String], into: &mut HashMap<String, Vec<Pattern>>| {
            if who != "*" {
                if let Err(why) = check_agent_name(who) {
                    problems.push(format!("{section}: agent `{who}`: {why}"));
                }
            }
            let entry = into.entry(who.to_string()).or_default();
            for item in items {
                match Pattern::parse(item) {
                    Ok(pattern) => entry.push(pattern),
                    Err(why) => problems.push(format!("{section} of `{who}`: {why}")),
                }
            }
        };
        for rule in &raw.permissions {
            let mut allow = HashMap::new();
            add("permissions", &rule.caller, &rule.allow, &mut allow);
            let allow = allow.remove(&rule.caller).unwrap_or_default();
            let permission = Permission::parse(&rule.caller, allow, &rule.via, &rule.subjects, &mut conditions);
            acl.permissions.entry(rule.caller.clone()).or_default().push(permission);
        }
        for rule in &raw.providers {
            add("providers", &rule.agent, &rule.provides, &mut acl.providers);
        }
        for rule in &raw.context {
            add("context", &rule.agent, &rule.read, &mut acl.context_read);
            add("context", &rule.agent, &rule.write, &mut acl.context_write);
        }
        for rule in &raw.limits {
            let who = rule.caller.as_str();
            if who != "*" {
                if let Err(why) = check_agent_name(who) {
                    problems.push(format!("limits: caller `{who}`: {why}"));
                }
            }
            if let Some(rate) = rule.rate_per_s {
                if !(rate.is_finite() && rate > 0.0) {
                    problems.push(format!(
                        "limits of `{who}`: rate_per_s must be a positive number, not {rate}"
                    ));
                }
            }
            if rule.burst == Some(0) {
                problems.push(format!("limits of `{who}`: burst must be at least 1"));
            }
            if rule.burst.is_some() && rule.rate_per_s.is_none() {
                problems.push(format!("limits of `{who}`: burst needs rate_per_s"));
            }
            if rule.concurrency == Some(0) {
                problems.push(format!("limits of `{who}`: concurrency must be at least 1"));
            }
            if rule.rate_per_s.is_none() && rule.concurrency.is_none() {
                problems.push(format!("limits of `{who}`: give rate_per_s, concurrency or both"));
            }
            let limit = Limit {
                rate_per_s: rule.rate_per_s,
                // A burst of one second's worth unless told otherwise.
                burst: rule
                    .burst
                    .unwrap_or_else(|| rule.rate_per_s.map_or(1, |rate| rate.ceil().max(1.0) as u32)),
                concurrency: rule.concurrency,
            };
            if acl.limits.insert(who.to_string(), limit).is_some() {
                problems.push(format!("limits: caller `{who}` is listed twice"));
            }
        }
        for operator in &raw.operators {
            if let Err(why) = check_agent_name(operator) {
                problems.push(format!("operators: `{operator}`: {why}"));
            }
            acl.operators.push(operator.clone());
        }
        problems.append(&mut conditions);
        acl.chain_depths = parse_chain_rules(&raw.chains, &mut problems);
        for auditor in &raw.auditors {
            if let Err(why) = check_agent_name(auditor) {
                problems.push(format!("auditors: `{auditor}`: {why}"));
            }
            acl.auditors.push(auditor.clone());
        }
        for pattern in &raw.trail.payloads {
            match Pattern::parse(pattern) {
                Ok(pattern) => acl.trail_payloads.push(pattern),
                Err(why) => problems.push(format!("trail.payloads: {why}")),
            }
        }
        for owner in &raw.owners {
            let pattern = match Pattern::parse(&owner.capability) {
                Ok(pattern) => pattern,
                Err(why) => {
                    problems.push(format!("owners: {why}"));
                    continue;
                }
            };
            if owner.approvers.is_empty() {
                problems.push(format!("owners of `{}`: name at least one approver", owner.capability));
            }
            for approver in &owner.approvers {
                if let Err(why) = check_agent_name(approver) {
                    problems.push(format!(
                        "owners of `{}`: approver `{approver}`: {why}",
                        owner.capability
                    ));
                }
            }
            acl.owners.push(Owner {
                capability: pattern,
                approvers: owner.approvers.clone(),
            });
        }
        if problems.is_empty() {
            Ok(acl)
        } else {
            Err(problems)
        }
    }

    fn allowed(rules: &HashMap<String, Vec<Pattern>>, who: &str, what: &str) -> bool {
        rules.get(who).is_some_and(|patterns| any_matches(patterns, what))
            || rules.get("*").is_some_and(|patterns| any_matches(patterns, what))
    }

    /// May `agent` register `capability` (registry)?
    pub fn may_provide(&self, agent: &str, capability: &str) -> bool {
        Self::allowed(&self.providers, agent, capability)
    }

    /// May `agent` read context field `field` (context service)?
    pub fn may_read_field(&self, agent: &str, field: &str) -> bool {
        Self::allowed(&self.context_read, agent, field)
    }

    /// May `agent` set or delete context field `field` (context service)?
    /// A `write: ["*"]` entry also lets the agent close contexts it did not create.
    pub fn may_write_field(&self, agent: &str, field: &str) -> bool {
        Self::allowed(&self.context_write, agent, field)
    }

    /// The limits that apply to `caller`: its own entry, else the `*` entry.
    pub fn limit_for(&self, caller: &str) -> Option<&Limit> {
        self.limits.get(caller).or_else(|| self.limits.get("*"))
    }

    /// Whether any limit is configured (the request path skips the lookups otherwise).
    pub fn has_limits(&self) -> bool {
        !self.limits.is_empty()
    }

    /// May `caller` use the console and the operator API?
    pub fn is_operator(&self, caller: &str) -> bool {
        self.operators.iter().any(|operator| operator == caller)
    }

    /// May `caller` read and replay the trail (`operators` and `auditors`)?
    pub fn may_read_trail(&self, caller: &str) -> bool {
        self.is_operator(caller) || self.auditors.iter().any(|auditor| auditor == caller)
    }

    /// Does the trail record the input and output of `capability`'s calls (`trail.payloads`)?
    pub fn records_payloads(&self, capability: &str) -> bool {
        any_matches(&self.trail_payloads, capability)
    }

    /// Who may approve access to `capability`: every approver of every
    /// `owners:` entry matching it, in file order, each once.
    pub fn approvers_of(&self, capability: &str) -> Vec<&str> {
        let mut approvers: Vec<&str> = Vec::new();
        for owner in self.owners.iter().filter(|owner| owner.capability.matches(capability)) {
            for approver in &owner.approvers {
                if !approvers.contains(&approver.as_str()) {
                    approvers.push(approver);
                }
            }
        }
        approvers
    }

    /// May `caller` approve, deny and revoke access to `capability` (`owners:`)?
    pub fn is_approver(&self, caller: &str, capability: &str) -> bool {
        self.owners.iter().any(|owner| {
            owner.capability.matches(capability) && owner.approvers.iter().any(|approver| approver == caller)
        })
    }

    /// The `owners:` entries, in file order.
    pub fn owners(&self) -> &[Owner] {
        &self.owners
    }

    /// The `permissions:` rules as written (patterns as text), by caller:
    /// what operators see beside the live grants.
    pub fn permission_rules(&self) -> Vec<(String, Vec<String>)> {
        let mut rules: Vec<(String, Vec<String>)> = self
            .permissions
            .iter()
            .map(|(caller, permissions)| {
                let patterns = permissions.iter().flat_map(Permission::rule_texts).collect();
                (caller.clone(), patterns)
            })
            .collect();
        rules.sort();
        rules
    }

    /// Whether the policy names `agent` in its context whitelist at all.
    pub fn has_context_entry(&self, agent: &str) -> bool {
        self.context_read.contains_key(agent) || self.context_read.contains_key("*")
    }
}

/// Agent names follow the capability-name rules without dots being required.
pub fn check_agent_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 128 {
        return Err("must be 1..=128 characters".to_string());
    }
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' || c == '.') {
        return Err("use lowercase letters, digits, `_`, `-` and `.`, starting with a letter".to_string());
    }
    Ok(())
}

// === Hot reload ===

/// The live policy. Cloning shares it.
#[derive(Clone)]
pub struct AclHandle {
    current: Arc<Live>,
}

impl std::fmt::Debug for AclHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclHandle").field("current", &self.current.acl).finish()
    }
}

/// The policy in force, and its reload outcomes in the owning service's metrics.
struct Live {
    acl: ArcSwap<Acl>,
    metrics: Option<ReloadMetrics>,
}

/// Reload outcomes, registered into the owning service's metrics registry.
#[derive(Clone)]
struct ReloadMetrics {
    reloads: prometheus::IntCounterVec,
    healthy: prometheus::IntGauge,
}

impl ReloadMetrics {
    fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let reloads = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "agent_reach_acl_reloads_total",
                "ACL file reloads by outcome (ok, error).",
            ),
            &["outcome"],
        )?;
        let healthy = prometheus::IntGauge::new(
            "agent_reach_acl_file_valid",
            "1 when the ACL file on disk is valid and applied, 0 when a broken edit is being ignored.",
        )?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(healthy.clone()))?;
        healthy.set(1);
        Ok(Self { reloads, healthy })
    }
}

impl agent_reach_reload::Follow for Live {
    type Value = Acl;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<Acl, String> {
        std::str::from_utf8(&contents[0])
            .map_err(|error| vec![format!("not UTF-8: {error}")])
            .and_then(Acl::parse)
            .map_err(|problems| problems.join("; "))
    }

    fn apply(&self, acl: Acl) -> bool {
        self.acl.store(Arc::new(acl));
        true
    }

    fn observe(&self, outcome: agent_reach_reload::Outcome) {
        let Some(metrics) = &self.metrics else { return };
        let ok = outcome == agent_reach_reload::Outcome::Applied;
        metrics
            .reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
        metrics.healthy.set(i64::from(ok));
    }
}

impl AclHandle {
    pub fn new(acl: Acl) -> Self {
        Self {
            current: Arc::new(Live {
                acl: ArcSwap::from_pointee(acl),
                metrics: None,
            }),
        }
    }

    /// The policy in force now. Lock-free.
    pub fn current(&self) -> arc_swap::Guard<Arc<Acl>> {
        self.current.acl.load()
    }

    pub fn replace(&self, acl: Acl) {
        self.current.acl.store(Arc::new(acl));
    }

    /// Loads `path` now (start-up fails on a broken file) and polls it every
    /// [`RELOAD_INTERVAL`] while any clone of the handle is alive: valid
    /// edits apply, broken ones are reported and ignored
    /// ([`agent_reach_reload`]).
    pub fn load_and_watch(path: &Path, metrics: &prometheus::Registry) -> Result<Self, AclError> {
        let reload = agent_reach_reload::Reload {
            what: "ACL",
            paths: vec![path.to_path_buf()],
            every: RELOAD_INTERVAL,
        };
        let initial = reload.read().map_err(|error| AclError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let acl = std::str::from_utf8(&initial[0])
            .map_err(|error| vec![format!("not UTF-8: {error}")])
            .and_then(Acl::parse)
            .map_err(|problems| AclError::Invalid {
                path: path.to_path_buf(),
                problems,
            })?;
        let metrics = ReloadMetrics::register(metrics).map_err(|error| AclError::Invalid {
            path: path.to_path_buf(),
            problems: vec![format!("metrics registration failed: {error}")],
        })?;
        let live = Arc::new(Live {
            acl: ArcSwap::from_pointee(acl),
            metrics: Some(metrics),
        });
        reload.spawn(Arc::downgrade(&live), agent_reach_reload::Seen::applied(initial));
        Ok(Self { current: live })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
version: 1
permissions:
  - caller: intent_parser
    allow: [order.query, order.detail]
  - caller: ops
    allow: ["*"]
  - caller: "*"
    allow: [health.*]
providers:
  - agent: order_query
    provides: [order.*]
context:
  - agent: reply_writer
    read: [user_id, intent]
  - agent: intent_parser
    write: [user_id, intent, order.*]
"#;

    #[test]
    fn default_deny_and_patterns() {
        let acl = Acl::parse(SAMPLE).unwrap();
        assert!(acl.may_call("intent_parser", "order.query"));
        assert!(!acl.may_call("intent_parser", "payment.check"));
        assert!(acl.may_call("ops", "anything.at_all"));
        assert!(acl.may_call("stranger", "health.ping"));
        assert!(!acl.may_call("stranger", "order.query"));
        assert!(acl.may_provide("order_query", "order.detail"));
        assert!(
            !acl.may_provide("order_query", "orders.detail"),
            "prefix is per segment"
        );
        assert!(!acl.may_provide("intent_parser", "order.query"));
        assert!(acl.may_read_field("reply_writer", "intent"));
        assert!(!acl.may_read_field("reply_writer", "secret"));
        assert!(
            !acl.may_write_field("reply_writer", "intent"),
            "read does not imply write"
        );
        assert!(acl.may_write_field("intent_parser", "order.status"));
        assert!(!acl.may_write_field("intent_parser", "secret"));
        assert!(
            !acl.may_read_field("intent_parser", "intent"),
            "write does not imply read"
        );
        assert!(!Acl::deny_all().may_call("a", "b"));
    }

    #[test]
    fn every_problem_is_reported() {
        let problems =
            Acl::parse("version: 2\npermissions:\n  - caller: Bad Name\n    allow: [Order.Query, ok.*]\n").unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(Acl::parse("version: 1\nunknown: []\n").is_err());
        assert!(Acl::parse("not: [valid").is_err());
    }

    #[test]
    fn auditors_and_trail_payloads_parse_and_refuse_nonsense() {
        let acl = Acl::parse(
            "version: 1\noperators: [ops]\nauditors: [audit_bot]\ntrail:\n  payloads: [order.*, reply.write]\n",
        )
        .unwrap();
        assert!(acl.may_read_trail("ops") && acl.may_read_trail("audit_bot") && !acl.may_read_trail("order_query"));
        assert!(
            !acl.is_operator("audit_bot"),
            "an auditor reads the trail, nothing more"
        );
        assert!(acl.records_payloads("order.query") && acl.records_payloads("reply.write"));
        assert!(!acl.records_payloads("payment.check"));
        assert!(
            !Acl::parse(SAMPLE).unwrap().records_payloads("order.query"),
            "off by default"
        );
        let problems = Acl::parse("version: 1\nauditors: [\"Not OK\"]\ntrail:\n  payloads: [\"Bad*\"]\n").unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            Acl::parse("version: 1\ntrail:\n  inputs: [a]\n").is_err(),
            "unknown fields are refused"
        );
    }

    #[test]
    fn limits_and_operators_parse_and_refuse_nonsense() {
        let acl = Acl::parse(
            "version: 1\nlimits:\n  - caller: \"*\"\n    rate_per_s: 2.5\n  - caller: bulk\n    rate_per_s: 100\n    burst: 10\n    concurrency: 4\n  - caller: chatty\n    concurrency: 2\noperators: [alice]\n",
        )
        .unwrap();
        assert_eq!(
            acl.limit_for("bulk"),
            Some(&Limit {
                rate_per_s: Some(100.0),
                burst: 10,
                concurrency: Some(4)
            })
        );
        assert_eq!(
            acl.limit_for("anyone"),
            Some(&Limit {
                rate_per_s: Some(2.5),
                burst: 3,
                concurrency: None
            }),
            "the `*` entry, a burst of one second's worth"
        );
        assert_eq!(acl.limit_for("chatty").unwrap().rate_per_s, None);
        assert!(acl.has_limits());
        assert!(acl.is_operator("alice") && !acl.is_operator("bob"));
        assert!(!Acl::parse(SAMPLE).unwrap().has_limits());
        let problems = Acl::parse(
            "version: 1\nlimits:\n  - caller: a\n    rate_per_s: -1\n  - caller: b\n    burst: 5\n  - caller: c\n    concurrency: 0\n  - caller: d\n  - caller: Bad Name\n    concurrency: 1\noperators: [\"Not OK\"]\n",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 7, "{problems:?}");
        assert!(
            Acl::parse("version: 1\nlimits:\n  - caller: a\n    rate: 3\n").is_err(),
            "unknown field"
        );
    }

    #[test]
    fn owners_parse_name_approvers_and_refuse_nonsense() {
        let acl = Acl::parse(
            "version: 1\nowners:\n  - capability: order.*\n    approvers: [alice, bob]\n  - capability: order.query\n    approvers: [carol, alice]\n  - capability: \"*\"\n    approvers: [root]\n",
        )
        .unwrap();
        assert_eq!(acl.approvers_of("order.query"), ["alice", "bob", "carol", "root"]);
        assert_eq!(acl.approvers_of("payment.check"), ["root"]);
        assert!(acl.is_approver("carol", "order.query") && !acl.is_approver("carol", "order.detail"));
        assert!(!acl.is_approver("dave", "order.query"));
        assert_eq!(acl.owners()[0].capability.to_string(), "order.*");
        assert!(
            Acl::parse(SAMPLE).unwrap().approvers_of("order.query").is_empty(),
            "none by default"
        );
        let problems = Acl::parse(
            "version: 1\nowners:\n  - capability: Bad*\n    approvers: [a]\n  - capability: x\n    approvers: []\n  - capability: y\n    approvers: [\"Not OK\"]\n",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            Acl::parse("version: 1\nowners:\n  - capability: x\n").is_err(),
            "approvers are required"
        );
        let rules = Acl::parse(SAMPLE).unwrap().permission_rules();
        assert_eq!(rules[0], ("*".to_string(), vec!["health.*".to_string()]));
    }

    #[tokio::test]
    async fn hot_reload_keeps_last_good_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.yaml");
        std::fs::write(&path, SAMPLE).unwrap();
        let metrics = prometheus::Registry::new();
        let handle = AclHandle::load_and_watch(&path, &metrics).unwrap();
        assert!(!handle.current().may_call("newbie", "order.query"));

        std::fs::write(
            &path,
            "version: 1\npermissions:\n  - caller: newbie\n    allow: [order.query]\n",
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while !handle.current().may_call("newbie", "order.query") {
            assert!(tokio::time::Instant::now() < deadline, "edit not applied within 2 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        std::fs::write(&path, "version: 1\npermissions: {broken").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let text = prometheus::TextEncoder::new()
                .encode_to_string(&metrics.gather())
                .unwrap();
            if text.contains("agent_reach_acl_file_valid 0") {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "broken edit not reported");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            handle.current().may_call("newbie", "order.query"),
            "last good policy kept"
        );
    }
}
