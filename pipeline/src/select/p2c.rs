//! `p2c_ewma`, Finagle's and Linkerd's balancer: draw two distinct
//! candidates at random and take the cheaper, the cost being the
//! instance's peak-EWMA latency × (its requests in flight + 1) per unit of
//! weight, the weight being the static one × the health factor with
//! failures forgiven over time (`InstanceState::forgiven_health_permille`;
//! a failure answered fast must not make an instance look cheap, and one
//! that failed must not stay expensive once it stops failing). Peak-EWMA
//! believes a slow answer at once and forgets it with time (τ = 10 s), so a
//! slow or failed instance is left alone until its cost decays, then probed
//! again; two random choices avoid the herd that "always the cheapest"
//! sends to one instance between updates. (The latency factor of the other
//! policies' effective weight is left out: peak-EWMA is this policy's
//! measure of latency.)
//!
//! Load is `max(own, reported)` as for `least_connections`. An instance
//! with no answer yet costs least, so a newcomer is tried at once.

use std::cell::Cell;

use super::least_conn::load;
use super::Candidate;
use crate::snapshot::VersionGroup;

pub fn pick(group: &VersionGroup, candidates: &[Candidate]) -> usize {
    let count = candidates.len();
    if count == 1 {
        return candidates[0].index;
    }
    let first = random_below(count);
    // A second, distinct one: an offset of 1..count from the first.
    let second = (first + 1 + random_below(count - 1)) % count;
    let cost = |candidate: &Candidate| cost(group, candidate);
    let (a, b) = (&candidates[first], &candidates[second]);
    if cost(b) < cost(a) {
        b.index
    } else {
        a.index
    }
}

/// `(peak-EWMA µs + 1) × (load + 1) / (static weight × forgiven health)`.
fn cost(group: &VersionGroup, candidate: &Candidate) -> f64 {
    let instance = &group.instances[candidate.index];
    let state = &instance.state;
    let weight = f64::from(instance.weight.max(1)) * f64::from(state.forgiven_health_permille().max(1));
    (state.peak_ewma_us() + 1.0) * (load(state) as f64 + 1.0) / weight
}

thread_local! {
    /// xorshift64* per thread: no lock, no shared cache line, no allocation.
    static STATE: Cell<u64> = Cell::new(rand::random::<u64>() | 1);
}

/// A number in `0..bound` (`bound` > 0), uniform enough for load balancing.
fn random_below(bound: usize) -> usize {
    let next = STATE.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    });
    // Lemire's multiply-shift: no modulo bias worth speaking of for small bounds.
    ((u128::from(next >> 32) * bound as u128) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_cover_every_candidate_and_two_are_distinct() {
        let mut seen = [0u32; 3];
        for _ in 0..3000 {
            seen[random_below(3)] += 1;
        }
        assert!(seen.iter().all(|count| *count > 800), "{seen:?}");
        for _ in 0..1000 {
            let first = random_below(2);
            let second = (first + 1 + random_below(1)) % 2;
            assert_ne!(first, second);
        }
    }
}
