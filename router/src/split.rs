//! A capability's traffic split between versions (DESIGN §2.9, §3.2): an
//! operator's "5 % of unpinned calls to 2.0.0, 95 % to 1.4.2" for canaries.
//!
//! Built into the snapshot from the registry's `Watch` (never looked up per
//! request), and applied only to calls that go to one instance and name no
//! version: a pinned call (`capability_version`) and a broadcast (every
//! instance of one version) ignore it. A version of the split with no
//! instance able to take the call drops out of the draw, so its share goes
//! to the other versions by their weights; when none of them can, resolution
//! falls back to the highest version that can ([`resolve_version`]): a split
//! never blackholes traffic.

use std::sync::Arc;

use agent_reach_proto::registry as pb;
use rand::Rng;

use crate::admission::resolve_version;
use crate::error::RouterError;
use crate::select::{self, Routable, SelectionLimits};
use crate::snapshot::{Capability, VersionGroup};

/// One capability's split, resolved against its version groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// `(index into Capability::versions, weight)`, weights above 0, highest version first.
    shares: Vec<(usize, u32)>,
}

/// Shares inline up to four versions (no allocation per call).
type Shares = smallvec::SmallVec<[(usize, u32); 4]>;

impl Split {
    /// The split over the versions present in `groups` (highest first, as the
    /// snapshot keeps them). Versions it names that no instance offers, and
    /// zero weights, take no part; `None` when nothing is left.
    pub fn build(record: &pb::CapabilitySplit, groups: &[Arc<VersionGroup>]) -> Option<Self> {
        let shares: Vec<(usize, u32)> = groups
            .iter()
            .enumerate()
            .filter_map(|(index, group)| {
                record
                    .weights
                    .iter()
                    .find(|share| semver::Version::parse(&share.version).is_ok_and(|version| version == group.version))
                    .filter(|share| share.weight > 0)
                    .map(|share| (index, share.weight))
            })
            .collect();
        (!shares.is_empty()).then_some(Self { shares })
    }

    /// Draws a version by weight among the split's versions that have an
    /// instance able to take a call now; `None` when none has.
    pub fn choose<'a>(
        &self,
        groups: &'a [Arc<VersionGroup>],
        limits: &SelectionLimits<'_>,
    ) -> Option<&'a Arc<VersionGroup>> {
        let live: Shares = self
            .shares
            .iter()
            .copied()
            .filter(|(index, _)| {
                groups.get(*index).is_some_and(|group| {
                    group
                        .instances
                        .iter()
                        .any(|instance| select::routable(instance, limits) == Some(Routable::Yes))
                })
            })
            .collect();
        let total: u64 = live.iter().map(|(_, weight)| u64::from(*weight)).sum();
        if total == 0 {
            return None;
        }
        // The thread's own generator: no lock shared between serving threads.
        let mut draw = rand::thread_rng().gen_range(0..total);
        for (index, weight) in live {
            let weight = u64::from(weight);
            if draw < weight {
                return groups.get(index);
            }
            draw -= weight;
        }
        None
    }

    /// `(version, weight)` of each share, highest version first (tests, diagnostics).
    pub fn shares<'a>(&'a self, groups: &'a [Arc<VersionGroup>]) -> impl Iterator<Item = (&'a str, u32)> + 'a {
        self.shares
            .iter()
            .filter_map(|(index, weight)| groups.get(*index).map(|group| (group.version_text.as_str(), *weight)))
    }
}

/// The version a call to one instance goes to: drawn from the capability's
/// split when the call names no version and a version of the split can take
/// it, else [`resolve_version`]'s highest version that can.
pub(crate) fn resolve<'a>(
    capability: &'a Capability,
    requirement: Option<&semver::VersionReq>,
    limits: &SelectionLimits<'_>,
) -> Result<&'a Arc<VersionGroup>, RouterError> {
    if requirement.is_none() {
        if let Some(group) = capability
            .split
            .as_ref()
            .and_then(|split| split.choose(&capability.versions, limits))
        {
            return Ok(group);
        }
    }
    resolve_version(capability, requirement, limits)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::breaker::BreakerConfig;
    use crate::metrics::Metrics;
    use crate::snapshot::SnapshotBuilder;

    fn instance(id: &str, version: &str, status: &str) -> pb::AgentInstance {
        pb::AgentInstance {
            agent_id: id.to_string(),
            name: "a".to_string(),
            endpoint: format!("http://127.0.0.1:1/{id}"),
            protocol: "http".to_string(),
            weight: 1,
            status: status.to_string(),
            capabilities: vec![pb::CapabilityDescriptor {
                name: "order.query".to_string(),
                version: version.to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn split(weights: &[(&str, u32)]) -> pb::CapabilitySplit {
        pb::CapabilitySplit {
            capability: "order.query".to_string(),
            weights: weights
                .iter()
                .map(|(version, weight)| pb::VersionWeight {
                    version: version.to_string(),
                    weight: *weight,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn builder(instances: Vec<pb::AgentInstance>, splits: Vec<pb::CapabilitySplit>) -> SnapshotBuilder {
        let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
        builder.apply(pb::WatchEvent {
            revision: 1,
            kind: Some(pb::watch_event::Kind::Snapshot(pb::Snapshot {
                instances,
                reset: false,
                splits,
            })),
        });
        builder
    }

    fn draws(capability: &Capability, calls: usize) -> std::collections::BTreeMap<String, usize> {
        let breaker = BreakerConfig {
            failures: 5,
            open_for: Duration::from_secs(30),
        };
        let limits = SelectionLimits {
            breaker: &breaker,
            max_inflight: 1024,
        };
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..calls {
            let group = resolve(capability, None, &limits).unwrap();
            *counts.entry(group.version_text.clone()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn unpinned_calls_follow_the_weights_and_unroutable_versions_drop_out() {
        let ready = vec![instance("a1", "1.4.2", "ready"), instance("a2", "2.0.0", "ready")];
        let mut builder = builder(ready, vec![split(&[("2.0.0", 5), ("1.4.2", 95), ("9.0.0", 50)])]);
        let snapshot = builder.build();
        let capability = &snapshot.capabilities["order.query"];
        // A version nobody offers takes no part; highest first.
        let shares: Vec<_> = capability
            .split
            .as_ref()
            .unwrap()
            .shares(&capability.versions)
            .collect();
        assert_eq!(shares, [("2.0.0", 5), ("1.4.2", 95)]);
        let counts = draws(capability, 20_000);
        let canary = counts.get("2.0.0").copied().unwrap_or(0) as f64;
        // Binomial(20,000, 0.05): mean 1,000, sd ≈ 31; ±6 sd.
        assert!((canary - 1000.0).abs() < 190.0, "{counts:?}");

        // The canary still starting: everything goes to the other version.
        builder.apply(pb::WatchEvent {
            revision: 2,
            kind: Some(pb::watch_event::Kind::Updated(instance("a2", "2.0.0", "starting"))),
        });
        let snapshot = builder.build();
        assert_eq!(
            draws(&snapshot.capabilities["order.query"], 500).get("1.4.2"),
            Some(&500)
        );

        // A split none of whose versions can take the call falls back to the highest that can.
        builder.apply(pb::WatchEvent {
            revision: 3,
            kind: Some(pb::watch_event::Kind::SplitSet(split(&[("2.0.0", 1)]))),
        });
        let snapshot = builder.build();
        assert_eq!(draws(&snapshot.capabilities["order.query"], 50).get("1.4.2"), Some(&50));

        // Cleared: no split in the snapshot.
        builder.apply(pb::WatchEvent {
            revision: 4,
            kind: Some(pb::watch_event::Kind::SplitCleared(pb::SplitCleared {
                capability: "order.query".to_string(),
            })),
        });
        assert!(builder.build().capabilities["order.query"].split.is_none());
    }

    #[test]
    fn zero_weights_and_unknown_versions_leave_no_split() {
        let ready = vec![instance("a1", "1.0.0", "ready")];
        let mut builder = builder(ready, vec![split(&[("1.0.0", 0), ("2.0.0", 7)])]);
        assert!(builder.build().capabilities["order.query"].split.is_none());
    }
}
