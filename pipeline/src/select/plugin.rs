//! Selection policies a team plugs into the router (issue 38, point 4;
//! DESIGN §3.4): implement [`SelectionPolicy`] in your own crate, register
//! it under a name in [`Plugins`] where the router binary is assembled
//! (`cli/src/plugins.rs` for `agent-reach router`), and name it
//! `plugin:NAME` in a call's `target_policy` or as a capability's policy
//! (`PUT /v1/capabilities/{name}/policy`).
//!
//! A policy sees the candidates selection already filtered (routable:
//! status, breaker, in-flight bound; not tried by this call yet while others
//! remain) with what the router knows of each: weights, health, requests in
//! flight, latencies and what the outcome history predicts for now
//! ([`CandidateView`]); it answers the position of its choice. It runs on
//! the request path, once per attempt: it must not block, do I/O, or take a
//! lock that other requests hold for long; reading the views is a few
//! atomic loads each. An answer of `None`, or a position out of range,
//! leaves the choice to weighted round-robin.
//!
//! Policies run in the router's process, as Rust: neither out-of-process
//! nor WASM policies are supported (why, with the measured cost per call:
//! `docs/design.md` §3.4.1).
//!
//! ```
//! use agent_reach_pipeline::policy::{CallView, Candidates, Plugins, SelectionPolicy};
//!
//! /// The candidate with the fewest requests in flight, ignoring weights.
//! struct Idlest;
//!
//! impl SelectionPolicy for Idlest {
//!     fn choose(&self, _call: &CallView<'_>, candidates: &Candidates<'_>) -> Option<usize> {
//!         candidates.iter().enumerate().min_by_key(|(_, c)| c.inflight()).map(|(at, _)| at)
//!     }
//! }
//!
//! let plugins = Plugins::new().with("idlest", Idlest).unwrap();
//! assert!(plugins.get("idlest").is_some());
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agent_reach_proto::Status;

use super::Candidate;
use crate::history::History;
use crate::snapshot::{Instance, VersionGroup};

/// A selection policy: picks one of the candidates for one attempt.
pub trait SelectionPolicy: Send + Sync + 'static {
    /// The position in `candidates` (`0..candidates.len()`) of the instance
    /// this attempt goes to; `None` leaves it to weighted round-robin.
    /// `candidates` is never empty.
    fn choose(&self, call: &CallView<'_>, candidates: &Candidates<'_>) -> Option<usize>;
}

/// The call an attempt is for.
#[derive(Debug, Clone, Copy)]
pub struct CallView<'a> {
    pub capability: &'a str,
    /// The version the call was admitted to (the split, if any, drew it).
    pub version: &'a str,
    pub session_id: Option<&'a str>,
    /// 1 for the first attempt, 2 for the first retry, ...
    pub attempt: u32,
}

/// The candidates of one attempt, in a fixed order.
pub struct Candidates<'a> {
    group: &'a VersionGroup,
    list: &'a [Candidate],
}

impl<'a> Candidates<'a> {
    pub(crate) fn new(group: &'a VersionGroup, list: &'a [Candidate]) -> Self {
        Self { group, list }
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The candidate at `position`.
    pub fn get(&self, position: usize) -> Option<CandidateView<'a>> {
        let candidate = self.list.get(position)?;
        Some(CandidateView {
            instance: self.group.instances.get(candidate.index)?,
            history: self.group.histories.get(candidate.index)?,
            effective_weight: candidate.weight,
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = CandidateView<'a>> + '_ {
        (0..self.list.len()).filter_map(|position| self.get(position))
    }
}

/// What the router knows of one candidate (each read is an atomic load or a field).
#[derive(Clone, Copy)]
pub struct CandidateView<'a> {
    instance: &'a Instance,
    history: &'a History,
    effective_weight: i64,
}

impl<'a> CandidateView<'a> {
    pub fn agent_id(&self) -> &'a str {
        &self.instance.agent_id
    }

    /// The agent's name (its tokens' subject).
    pub fn name(&self) -> &'a str {
        &self.instance.name
    }

    pub fn tags(&self) -> &'a BTreeMap<String, String> {
        &self.instance.tags
    }

    pub fn status(&self) -> Status {
        self.instance.status
    }

    /// The weight registered (or set by an operator), 1..=1000.
    pub fn weight(&self) -> u32 {
        self.instance.weight
    }

    /// Whether an operator set [`CandidateView::weight`].
    pub fn operator_weight(&self) -> bool {
        self.instance.operator_weight
    }

    /// Static weight × health × latency factors, in thousandths of a weight
    /// unit (DESIGN §3.4): what weighted round-robin divides calls by.
    pub fn effective_weight(&self) -> i64 {
        self.effective_weight
    }

    /// The passive health factor, permille (halved per failure, +100 per success).
    pub fn health_permille(&self) -> u32 {
        self.instance.state.health_permille()
    }

    /// This router's requests in flight to the instance.
    pub fn inflight(&self) -> u32 {
        self.instance.state.inflight()
    }

    /// What the agent last reported in flight (every router's and direct calls).
    pub fn reported_inflight(&self) -> u32 {
        self.instance.state.reported_inflight()
    }

    /// The smoothed latency of its answers (α = 1/8), once it answered.
    pub fn latency_ewma(&self) -> Option<Duration> {
        Some(self.instance.state.ewma_us())
            .filter(|us| *us > 0)
            .map(Duration::from_micros)
    }

    /// Its peak-EWMA latency now (what `p2c_ewma` weighs), once it answered.
    pub fn peak_ewma(&self) -> Option<Duration> {
        Some(self.instance.state.peak_ewma_us())
            .filter(|us| *us > 0.0)
            .map(|us| Duration::from_micros(us as u64))
    }

    /// `adaptive`'s learned multiplier of the effective weight, permille.
    pub fn learned_permille(&self) -> u32 {
        self.history.learned_permille()
    }

    /// The failure rate its history predicts for now (this hour on past
    /// days and the last minute), permille; `None` when nothing is known.
    pub fn predicted_failure_permille(&self) -> Option<u32> {
        self.history.predicted_failure_permille()
    }

    /// The p50 latency its history predicts for now.
    pub fn predicted_p50(&self) -> Option<Duration> {
        self.history.predicted_p50()
    }
}

impl std::fmt::Debug for CandidateView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandidateView")
            .field("agent_id", &self.agent_id())
            .field("effective_weight", &self.effective_weight)
            .field("learned_permille", &self.learned_permille())
            .finish()
    }
}

/// The policies plugged into a router, by name (`plugin:NAME`).
#[derive(Clone, Default)]
pub struct Plugins {
    by_name: Arc<BTreeMap<String, Arc<dyn SelectionPolicy>>>,
}

impl Plugins {
    pub fn new() -> Self {
        Self::default()
    }

    /// These plugins and `policy` under `name` (`[a-z][a-z0-9_]*`, at most
    /// 64 characters, not registered yet).
    pub fn with(self, name: &str, policy: impl SelectionPolicy) -> Result<Self, String> {
        agent_reach_proto::envelope::check_plugin_name(name)?;
        if self.by_name.contains_key(name) {
            return Err(format!("a policy plugin named `{name}` is already registered"));
        }
        let mut by_name = BTreeMap::clone(&self.by_name);
        by_name.insert(name.to_string(), Arc::new(policy));
        Ok(Self {
            by_name: Arc::new(by_name),
        })
    }

    pub fn get(&self, name: &str) -> Option<&dyn SelectionPolicy> {
        self.by_name.get(name).map(|policy| policy.as_ref())
    }

    /// The registered names (without `plugin:`), in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// `policy`'s choice among `candidates` (an instance index of the group), if it made a valid one.
pub(crate) fn pick(
    policy: &dyn SelectionPolicy,
    group: &VersionGroup,
    candidates: &[Candidate],
    call: &CallView<'_>,
) -> Option<usize> {
    let view = Candidates::new(group, candidates);
    let position = policy.choose(call, &view)?;
    candidates.get(position).map(|candidate| candidate.index)
}
