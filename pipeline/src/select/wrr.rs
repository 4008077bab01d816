//! Smooth weighted round-robin, nginx's algorithm: every pick adds each
//! candidate's effective weight to its current weight, takes the largest, and
//! subtracts the total from the winner. Weights 3:2:1 give a a b a c b, never
//! a burst of one instance.

use super::Candidate;
use crate::snapshot::VersionGroup;

pub fn pick(group: &VersionGroup, candidates: &[Candidate]) -> usize {
    // A poisoned lock only means another request panicked mid-pick; the
    // weights are still numbers, so keep using them.
    let mut current = group
        .wrr_current
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    step(&mut current, candidates)
}

/// One smooth-WRR step over `current` (indexed like the group's instances).
/// `candidates` must not be empty.
pub fn step(current: &mut [i64], candidates: &[Candidate]) -> usize {
    let mut total = 0i64;
    let mut best: Option<(usize, i64)> = None;
    for candidate in candidates {
        let Some(slot) = current.get_mut(candidate.index) else {
            continue;
        };
        *slot += candidate.weight;
        total += candidate.weight;
        if best.is_none_or(|(_, value)| *slot > value) {
            best = Some((candidate.index, *slot));
        }
    }
    let chosen = best.map_or(candidates[0].index, |(index, _)| index);
    if let Some(slot) = current.get_mut(chosen) {
        *slot -= total;
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_two_one_is_smooth_and_exact() {
        let candidates = [
            Candidate { index: 0, weight: 3 },
            Candidate { index: 1, weight: 2 },
            Candidate { index: 2, weight: 1 },
        ];
        let mut current = vec![0; 3];
        let picks: Vec<usize> = (0..6).map(|_| step(&mut current, &candidates)).collect();
        assert_eq!(picks, vec![0, 1, 0, 2, 1, 0]);
        let mut counts = [0; 3];
        for _ in 0..6000 {
            counts[step(&mut current, &candidates)] += 1;
        }
        assert_eq!(counts, [3000, 2000, 1000]);
    }
}
