//! A capability's traffic split between versions (DESIGN §2.9, §3.2): an
//! operator's "5 % of unpinned calls to 2.0.0, 95 % to 1.4.2" for canaries.
//!
//! Built into the snapshot from the registry's `Watch` (never looked up per
//! request), and applied by admission ([`crate::admission::resolve`]) only to
//! calls that go to one instance and name no version: a pinned call
//! (`capability_version`) and a broadcast (every instance of one version)
//! ignore it. A version of the split with no instance able to take the call
//! drops out of the draw, so its share goes to the other versions by their
//! weights; when none of them can, resolution falls back to the highest
//! version that can: a split never blackholes traffic.
//!
//! A leaf: versions are positions in the capability's version list, so the
//! split knows nothing of snapshots or selection.

use agent_reach_proto::registry as pb;
use rand::Rng;

/// One capability's split, resolved against its versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// `(index into Capability::versions, weight)`, weights above 0, highest version first.
    shares: Vec<(usize, u32)>,
}

/// Shares inline up to four versions (no allocation per call).
type Shares = smallvec::SmallVec<[(usize, u32); 4]>;

impl Split {
    /// The split over `versions` (highest first, as the snapshot keeps them).
    /// Versions it names that no instance offers, and zero weights, take no
    /// part; `None` when nothing is left.
    pub fn build<'v>(
        record: &pb::CapabilitySplit,
        versions: impl IntoIterator<Item = &'v semver::Version>,
    ) -> Option<Self> {
        let shares: Vec<(usize, u32)> = versions
            .into_iter()
            .enumerate()
            .filter_map(|(index, version)| {
                record
                    .weights
                    .iter()
                    .find(|share| semver::Version::parse(&share.version).is_ok_and(|named| named == *version))
                    .filter(|share| share.weight > 0)
                    .map(|share| (index, share.weight))
            })
            .collect();
        (!shares.is_empty()).then_some(Self { shares })
    }

    /// Draws a version's index by weight among the split's versions that
    /// `can_take` a call now; `None` when none can.
    pub fn choose(&self, can_take: impl Fn(usize) -> bool) -> Option<usize> {
        let live: Shares = self
            .shares
            .iter()
            .copied()
            .filter(|(index, _)| can_take(*index))
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
                return Some(index);
            }
            draw -= weight;
        }
        None
    }

    /// `(index into the versions, weight)` of each share, highest version first.
    pub fn shares(&self) -> &[(usize, u32)] {
        &self.shares
    }
}
