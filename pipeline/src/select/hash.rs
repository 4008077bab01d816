//! Consistent hashing on `session_id` by weighted rendezvous hashing: every
//! instance scores the key and the highest score wins. Adding or removing an
//! instance moves only the keys that instance wins or won, so a conversation
//! stays put when unrelated instances join or leave.
//!
//! Scores use the *static* weight: health changes must not reshuffle sessions.
//! An unhealthy owner is skipped (it is not a candidate) and the key falls to
//! the runner-up until the owner recovers.

use std::hash::{Hash, Hasher};

use super::Candidate;
use crate::snapshot::VersionGroup;

pub fn pick(group: &VersionGroup, candidates: &[Candidate], key: &str) -> usize {
    let mut best = candidates[0].index;
    let mut best_score = f64::NEG_INFINITY;
    for candidate in candidates {
        let instance = &group.instances[candidate.index];
        let score = score(key, &instance.agent_id, instance.weight);
        if score > best_score {
            best_score = score;
            best = candidate.index;
        }
    }
    best
}

/// `-weight / ln(u)` with `u` uniform in (0, 1) from the hash of (key, instance).
pub fn score(key: &str, agent_id: &str, weight: u32) -> f64 {
    // SipHash with fixed keys: the same score in every router replica and run.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    agent_id.hash(&mut hasher);
    let bits = hasher.finish() >> 11; // 53 bits: exact in an f64
    let unit = (bits as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight.max(1)) / unit.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(key: &str, instances: &[&str]) -> String {
        instances
            .iter()
            .max_by(|a, b| score(key, a, 1).total_cmp(&score(key, b, 1)))
            .unwrap()
            .to_string()
    }

    #[test]
    fn keys_move_only_when_their_owner_leaves() {
        let all = ["a", "b", "c", "d"];
        for key in (0..200).map(|n| format!("session_{n}")) {
            let before = owner(&key, &all);
            for gone in all.iter().filter(|id| **id != before) {
                let rest: Vec<&str> = all.iter().copied().filter(|id| id != gone).collect();
                assert_eq!(owner(&key, &rest), before, "{key} moved when {gone} left");
            }
        }
    }

    #[test]
    fn spreads_keys() {
        let all = ["a", "b", "c"];
        let mut counts = std::collections::HashMap::new();
        for n in 0..3000 {
            *counts.entry(owner(&format!("s{n}"), &all)).or_insert(0) += 1;
        }
        assert!(counts.values().all(|count| *count > 800), "{counts:?}");
    }
}
