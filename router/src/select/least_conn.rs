//! Least connections, weighted: the candidate with the fewest in-flight
//! requests per unit of effective weight. Ties rotate, so idle instances
//! share the load instead of the first one taking all of it.

use std::sync::atomic::Ordering;

use super::Candidate;
use crate::snapshot::VersionGroup;

pub fn pick(group: &VersionGroup, candidates: &[Candidate]) -> usize {
    let start = group.rotation.fetch_add(1, Ordering::Relaxed);
    let loads: Vec<u64> = candidates
        .iter()
        .map(|candidate| u64::from(group.instances[candidate.index].state.inflight()))
        .collect();
    choose(candidates, &loads, start)
}

/// The index of the least loaded candidate, ties broken from `start` onwards.
pub fn choose(candidates: &[Candidate], inflight: &[u64], start: usize) -> usize {
    let count = candidates.len();
    let mut best = start % count;
    for offset in 1..count {
        let index = (start + offset) % count;
        // inflight_a / weight_a < inflight_b / weight_b without division.
        let (a, b) = (&candidates[index], &candidates[best]);
        let lhs = u128::from(inflight[index]) * b.weight.max(1) as u128;
        let rhs = u128::from(inflight[best]) * a.weight.max(1) as u128;
        if lhs < rhs {
            best = index;
        }
    }
    candidates[best].index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_instances_are_avoided_and_ties_rotate() {
        let candidates = [
            Candidate { index: 0, weight: 1 },
            Candidate { index: 1, weight: 1 },
            Candidate { index: 2, weight: 1 },
        ];
        assert_eq!(choose(&candidates, &[5, 0, 0], 0), 1);
        assert_eq!(choose(&candidates, &[5, 0, 0], 2), 2);
        assert_eq!(choose(&candidates, &[0, 0, 0], 1), 1);
        let weighted = [Candidate { index: 0, weight: 4 }, Candidate { index: 1, weight: 1 }];
        assert_eq!(choose(&weighted, &[3, 1], 1), 0, "3/4 < 1/1");
    }
}
