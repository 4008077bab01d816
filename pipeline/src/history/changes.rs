//! The learned weight changes operators are shown (the console's
//! capability page, `GET /v1/routing/changes`): every change of an
//! instance's `adaptive` weight by more than [`LOGGED_FRACTION`] since the
//! last one shown, with its reason. The last [`CAPACITY`] per tenant part,
//! behind a lock only the learning task (once per tick) and operators' reads take.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// A change is shown once the weight moved by this fraction of the larger
/// of the two values since the last change shown.
pub const LOGGED_FRACTION: f64 = 0.25;
/// Changes kept.
pub const CAPACITY: usize = 512;

/// One change of an instance's learned weight.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightChange {
    pub at_ms: u64,
    pub capability: String,
    pub version: String,
    pub agent_id: String,
    /// The learned multiplier before and after (permille of the instance's weight).
    pub from_permille: u32,
    pub to_permille: u32,
    /// What it moves towards (it moves at most ×2 per tick).
    pub target_permille: u32,
    pub reason: String,
}

/// Whether a move from `logged` to `now` is worth showing.
pub fn worth_showing(logged: u32, now: u32) -> bool {
    let larger = f64::from(logged.max(now).max(1));
    f64::from(logged.abs_diff(now)) / larger > LOGGED_FRACTION
}

/// The last changes, newest last.
#[derive(Debug, Default)]
pub struct Changes {
    ring: Mutex<VecDeque<WeightChange>>,
}

impl Changes {
    pub fn push(&self, change: WeightChange) {
        let mut ring = self.ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if ring.len() == CAPACITY {
            ring.pop_front();
        }
        ring.push_back(change);
    }

    /// The newest `limit` changes (of `capability`, when given), newest first.
    pub fn newest(&self, capability: Option<&str>, limit: usize) -> Vec<WeightChange> {
        let ring = self.ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        ring.iter()
            .rev()
            .filter(|change| capability.is_none_or(|wanted| change.capability == wanted))
            .take(limit)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_moves_beyond_the_fraction_are_shown_and_the_ring_is_bounded() {
        assert!(!worth_showing(1000, 800));
        assert!(worth_showing(1000, 500));
        assert!(worth_showing(50, 100));
        assert!(!worth_showing(1000, 1000));
        let changes = Changes::default();
        for n in 0..CAPACITY + 10 {
            changes.push(WeightChange {
                at_ms: n as u64,
                capability: if n % 2 == 0 { "a" } else { "b" }.to_string(),
                version: "1.0.0".to_string(),
                agent_id: "x".to_string(),
                from_permille: 1000,
                to_permille: 500,
                target_permille: 50,
                reason: String::new(),
            });
        }
        let all = changes.newest(None, usize::MAX);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(all[0].at_ms, (CAPACITY + 9) as u64, "newest first");
        assert!(changes
            .newest(Some("a"), 3)
            .iter()
            .all(|change| change.capability == "a"));
    }
}
