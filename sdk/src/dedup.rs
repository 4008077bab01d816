//! Request deduplication by `request_id`: a repeat gets the first result, a
//! concurrent repeat waits for it. Bounded in size and age.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

/// A finished answer: HTTP status and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

pub(crate) type Slot = Arc<OnceCell<Answer>>;

pub(crate) struct Dedup {
    capacity: usize,
    ttl: Duration,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    slots: HashMap<String, Slot>,
    order: VecDeque<(Instant, String)>,
}

impl Dedup {
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            ttl,
            entries: Mutex::new(Entries::default()),
        }
    }

    /// Forgets `request_id`'s answer (a pause: its resumed delivery runs the handler again).
    pub(crate) fn forget(&self, request_id: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.slots.remove(request_id);
    }

    /// The slot for `request_id`, shared by every delivery of that request.
    pub(crate) fn slot(&self, request_id: &str) -> Slot {
        // The map is only ever left consistent (no fallible step mid-update).
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        while let Some((inserted, _)) = entries.order.front() {
            if now.duration_since(*inserted) < self.ttl && entries.order.len() < self.capacity {
                break;
            }
            if let Some((_, old)) = entries.order.pop_front() {
                entries.slots.remove(&old);
            }
        }
        if let Some(slot) = entries.slots.get(request_id) {
            return slot.clone();
        }
        let slot = Slot::default();
        entries.slots.insert(request_id.to_string(), slot.clone());
        entries.order.push_back((now, request_id.to_string()));
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_id_same_slot_and_bounded() {
        let dedup = Dedup::new(2, Duration::from_secs(60));
        let a = dedup.slot("a");
        assert!(Arc::ptr_eq(&a, &dedup.slot("a")));
        dedup.slot("b");
        dedup.slot("c"); // evicts "a"
        assert!(!Arc::ptr_eq(&a, &dedup.slot("a")));
    }

    #[test]
    fn entries_expire() {
        let dedup = Dedup::new(10, Duration::ZERO);
        let a = dedup.slot("a");
        assert!(!Arc::ptr_eq(&a, &dedup.slot("a")));
    }
}
