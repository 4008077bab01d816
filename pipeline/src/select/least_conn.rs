//! Least connections, weighted: the candidate with the fewest requests in
//! flight per unit of effective weight. Ties rotate, so idle instances share
//! the load instead of the first one taking all of it.
//!
//! An instance's load is `max(own, reported)` (DESIGN §3.4): `own` is this
//! router's count, exact and current; `reported` is what the agent last said
//! in a heartbeat, counting every router's calls and direct ones, but up to a
//! heartbeat old. With several routers sharing an agent, each router's own
//! calls are already inside `reported` (from when it was sent), so adding the
//! two would count them twice and summing "reported minus our share" needs
//! our count at the agent's reporting instant, which no router knows. The
//! maximum never counts a call twice, sees another router's load as soon as
//! the agent reported it, and this router's own burst at once.

use std::sync::atomic::Ordering;

use super::Candidate;
use crate::health::InstanceState;
use crate::snapshot::VersionGroup;

/// The load least-connections compares: the larger of this router's count and the agent's report.
pub fn load(state: &InstanceState) -> u64 {
    u64::from(state.inflight().max(state.reported_inflight()))
}

pub fn pick(group: &VersionGroup, candidates: &[Candidate]) -> usize {
    let start = group.rotation.fetch_add(1, Ordering::Relaxed);
    // Read per comparison, not collected: nothing is allocated per pick.
    choose(candidates, |index| load(&group.instances[index].state), start)
}

/// The index of the least loaded candidate, ties broken from `start` onwards;
/// `load` maps an instance index (a candidate's `index`) to its load.
pub fn choose(candidates: &[Candidate], load: impl Fn(usize) -> u64, start: usize) -> usize {
    let count = candidates.len();
    let mut best = start % count;
    let mut best_load = load(candidates[best].index);
    for offset in 1..count {
        let index = (start + offset) % count;
        let candidate = &candidates[index];
        let candidate_load = load(candidate.index);
        // load_a / weight_a < load_b / weight_b without division.
        let lhs = u128::from(candidate_load) * candidates[best].weight.max(1) as u128;
        let rhs = u128::from(best_load) * candidate.weight.max(1) as u128;
        if lhs < rhs {
            best = index;
            best_load = candidate_load;
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
        let loads = |values: [u64; 3]| move |index: usize| values[index];
        assert_eq!(choose(&candidates, loads([5, 0, 0]), 0), 1);
        assert_eq!(choose(&candidates, loads([5, 0, 0]), 2), 2);
        assert_eq!(choose(&candidates, loads([0, 0, 0]), 1), 1);
        let weighted = [Candidate { index: 0, weight: 4 }, Candidate { index: 1, weight: 1 }];
        assert_eq!(choose(&weighted, |index| [3, 1][index], 1), 0, "3/4 < 1/1");
    }

    #[test]
    fn the_load_is_the_larger_of_own_and_reported() {
        let metrics = crate::metrics::Metrics::new().unwrap();
        let state = InstanceState::new(metrics.instance("a"));
        assert_eq!(load(&state), 0);
        // Another router's calls, reported by the agent.
        state.set_reported_inflight(4);
        assert_eq!(load(&state), 4);
        // Our own calls are inside the report: not added to it.
        let _first = state.start_request();
        let _second = state.start_request();
        assert_eq!(load(&state), 4);
        // Our own burst, newer than the report, counts at once.
        let _burst: Vec<_> = (0..4).map(|_| state.start_request()).collect();
        assert_eq!(load(&state), 6);
    }
}
