//! `adaptive`: smooth weighted round-robin on weights learned from each
//! instance's recorded outcomes. Each candidate's effective weight (static
//! × health × latency, as every policy sees it) is scaled by what the
//! learning task set for the instance in this version
//! (`crate::history::learn`: the prediction for this hour, bounded change
//! per tick, a 5 % floor, 100 % for a weight an operator set). The pick
//! itself is one atomic load per candidate and a WRR step: nothing is
//! computed from the history here.
//!
//! A traffic split is never overridden: it chose the version before this
//! runs, and the learned weights only divide that version's calls.

use super::{wrr, Candidate, Candidates};
use crate::history::FULL;
use crate::snapshot::VersionGroup;

pub fn pick(group: &VersionGroup, candidates: &[Candidate]) -> usize {
    let learned: Candidates = candidates
        .iter()
        .map(|candidate| Candidate {
            index: candidate.index,
            weight: scaled(
                candidate.weight,
                group
                    .histories
                    .get(candidate.index)
                    .map_or(FULL, |history| history.learned_permille()),
            ),
        })
        .collect();
    wrr::pick(group, &learned)
}

/// `weight × learned / 1000`, at least 1.
pub fn scaled(weight: i64, learned_permille: u32) -> i64 {
    (weight.saturating_mul(i64::from(learned_permille)) / i64::from(FULL)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_keeps_a_share_and_full_changes_nothing() {
        assert_eq!(scaled(3000, FULL), 3000);
        assert_eq!(scaled(1000, 50), 50);
        assert_eq!(
            scaled(1, 50),
            1,
            "never zero: an instance at the floor still gets probes"
        );
        // Three equal instances, one at the floor: it gets 50 / 2050 of the calls.
        let candidates = [
            Candidate {
                index: 0,
                weight: scaled(1000, 50),
            },
            Candidate { index: 1, weight: 1000 },
            Candidate { index: 2, weight: 1000 },
        ];
        let mut current = vec![0; 3];
        let mut counts = [0; 3];
        for _ in 0..2050 {
            counts[wrr::step(&mut current, &candidates)] += 1;
        }
        assert_eq!(counts, [50, 1000, 1000]);
    }
}
