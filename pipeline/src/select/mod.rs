//! Instance selection: which instances may take a request now ([`routable`]:
//! status, breaker, in-flight bound), which of those a retry prefers (not
//! tried yet), then a policy picks among them: one of the five built in
//! (`wrr`, `least_conn`, `hash`, `p2c`, `adaptive`) or one plugged in
//! ([`plugin`]). Policies see candidates (indices and effective weights)
//! and the group's per-instance state, so they are small pure-ish
//! functions tested on their own.

pub mod adaptive;
pub mod hash;
pub mod least_conn;
pub mod p2c;
pub mod plugin;
pub mod wrr;

use agent_reach_proto::envelope::TargetPolicy;

use agent_reach_proto::Status;

use plugin::{CallView, Plugins, SelectionPolicy};

use crate::breaker::BreakerConfig;
use crate::snapshot::{Instance, VersionGroup};

/// What the selector needs to know besides the group.
pub struct SelectionLimits<'a> {
    pub breaker: &'a BreakerConfig,
    pub max_inflight: u32,
}

/// How readily an instance takes a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routable {
    /// `ready` or `busy`: ordinary traffic.
    Yes,
    /// `overloaded`: only when no instance is [`Routable::Yes`].
    LastResort,
}

/// The one definition of "routable" (DESIGN §2, §3), used by selection,
/// broadcast and task fan-out alike: the instance's reported status (`ready`
/// and `busy` take traffic, `overloaded` only as a last resort, `starting` and
/// `draining` never), its circuit breaker (closed, or open long enough for a
/// probe) and its in-flight bound. `None`: it takes nothing now.
pub fn routable(instance: &Instance, limits: &SelectionLimits<'_>) -> Option<Routable> {
    let by_status = match instance.status {
        Status::Ready | Status::Busy => Routable::Yes,
        Status::Overloaded => Routable::LastResort,
        Status::Starting | Status::Draining => return None,
    };
    let can_take =
        instance.state.breaker.is_available(limits.breaker) && instance.state.inflight() < limits.max_inflight;
    can_take.then_some(by_status)
}

/// A candidate the policies choose among: its index in the group and effective weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub index: usize,
    pub weight: i64,
}

/// A call's policy, resolved: built in, or a plug-in found by its name.
#[derive(Clone, Copy)]
pub enum Policy<'p> {
    WeightedRoundRobin,
    LeastConnections,
    ConsistentHash,
    P2cEwma,
    Adaptive,
    Plugin(&'p dyn SelectionPolicy),
}

impl<'p> Policy<'p> {
    /// `policy` as this router runs it; a plug-in this router does not have is `Err` (its name).
    pub fn resolve<'n>(policy: &'n TargetPolicy, plugins: &'p Plugins) -> Result<Self, &'n str> {
        Ok(match policy {
            TargetPolicy::WeightedRoundRobin => Policy::WeightedRoundRobin,
            TargetPolicy::LeastConnections => Policy::LeastConnections,
            TargetPolicy::ConsistentHash => Policy::ConsistentHash,
            TargetPolicy::P2cEwma => Policy::P2cEwma,
            TargetPolicy::Adaptive => Policy::Adaptive,
            TargetPolicy::Plugin(name) => Policy::Plugin(plugins.get(name).ok_or(name.as_str())?),
        })
    }
}

/// Picks an instance for one attempt of `call` by `policy`, skipping
/// `tried` (indices of earlier attempts) when any other instance can take
/// it. Claims the half-open probe of a breaker when it picks an instance
/// whose breaker just expired.
pub fn pick<'a>(
    group: &'a VersionGroup,
    policy: Policy<'_>,
    call: &CallView<'_>,
    tried: &[usize],
    limits: &SelectionLimits<'_>,
) -> Option<(usize, &'a Instance)> {
    let mut refused: Vec<usize> = Vec::new();
    // Each loop refuses one more instance; the group is finite.
    for _ in 0..=group.instances.len() {
        let candidates = candidates(group, tried, &refused, limits);
        if candidates.is_empty() {
            return None;
        }
        let chosen = match (policy, call.session_id) {
            (Policy::ConsistentHash, Some(key)) => hash::pick(group, &candidates, key),
            (Policy::LeastConnections, _) => least_conn::pick(group, &candidates),
            (Policy::P2cEwma, _) => p2c::pick(group, &candidates),
            (Policy::Adaptive, _) => adaptive::pick(group, &candidates),
            (Policy::Plugin(policy), _) => {
                plugin::pick(policy, group, &candidates, call).unwrap_or_else(|| wrr::pick(group, &candidates))
            }
            _ => wrr::pick(group, &candidates),
        };
        let instance = &group.instances[chosen];
        if instance.state.breaker.try_acquire(limits.breaker) {
            instance.state.sync_breaker_metric();
            return Some((chosen, instance));
        }
        // Another request claimed this instance's half-open probe first.
        refused.push(chosen);
    }
    None
}

/// Candidates, inline up to a group of 8 instances (no allocation per pick).
type Candidates = smallvec::SmallVec<[Candidate; 8]>;

/// The default policy: a call that names none, of a capability without a policy of its own.
pub const DEFAULT: TargetPolicy = TargetPolicy::WeightedRoundRobin;

/// Routable instances in the best available tier, with effective weights.
fn candidates(group: &VersionGroup, tried: &[usize], refused: &[usize], limits: &SelectionLimits<'_>) -> Candidates {
    let fastest = group.fastest_ewma_us();
    let tier = |wanted: Routable, skip_tried: bool| -> Candidates {
        group
            .instances
            .iter()
            .enumerate()
            .filter(|(index, instance)| {
                routable(instance, limits) == Some(wanted)
                    && !refused.contains(index)
                    && !(skip_tried && tried.contains(index))
            })
            .map(|(index, instance)| Candidate {
                index,
                weight: instance.state.effective_weight(instance.weight, fastest),
            })
            .collect()
    };
    // Prefer untried routable instances, then overloaded ones, then (a retry with
    // nothing else left) the tried ones again.
    for skip_tried in [true, false] {
        for wanted in [Routable::Yes, Routable::LastResort] {
            let found = tier(wanted, skip_tried);
            if !found.is_empty() {
                return found;
            }
        }
        if tried.is_empty() {
            break;
        }
    }
    Candidates::new()
}
