//! Instance selection: which instances may take a request now ([`routable`]:
//! status, breaker, in-flight bound), which of those a retry prefers (not
//! tried yet), then one of three policies picks among them. Policies only see
//! indices and effective weights, so they are small pure-ish functions tested
//! on their own.

pub mod hash;
pub mod least_conn;
pub mod wrr;

use agent_reach_proto::envelope::TargetPolicy;

use agent_reach_proto::Status;

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

/// Picks an instance for one attempt, skipping `tried` (indices of earlier
/// attempts) when any other instance can take it. Claims the half-open probe
/// of a breaker when it picks an instance whose breaker just expired.
pub fn pick<'a>(
    group: &'a VersionGroup,
    policy: TargetPolicy,
    session_id: Option<&str>,
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
        let chosen = match (policy, session_id) {
            (TargetPolicy::ConsistentHash, Some(key)) => hash::pick(group, &candidates, key),
            (TargetPolicy::LeastConnections, _) => least_conn::pick(group, &candidates),
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
