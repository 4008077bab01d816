//! Per-tag gates: at most N deliveries at once for capabilities whose
//! instances all carry a tag (`--task-tag-limit class=bulk:5`); waiters are
//! served high priority first, then in arrival order.

use std::sync::Arc;

use agent_reach_task_store::Priority;

/// Bounds concurrent deliveries for one tag; waiters are served high
/// priority first, then in arrival order, so queued low-priority work is
/// overtaken but still runs.
pub(crate) struct TagGate {
    limit: usize,
    state: std::sync::Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    in_use: usize,
    sequence: u64,
    waiting: std::collections::BinaryHeap<Waiter>,
}

struct Waiter {
    rank: (u8, std::cmp::Reverse<u64>),
    wake: tokio::sync::oneshot::Sender<()>,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

/// Holds one of a gate's places; gives it to the next waiter when dropped.
pub(crate) struct GatePass(Arc<TagGate>);

impl Drop for GatePass {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl TagGate {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            state: std::sync::Mutex::new(GateState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Every update completes before the guard drops; a poisoned lock holds consistent counts.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) async fn enter(self: &Arc<Self>, priority: Priority) -> GatePass {
        let waiting = {
            let mut state = self.lock();
            if state.in_use < self.limit {
                state.in_use += 1;
                None
            } else {
                let (wake, woken) = tokio::sync::oneshot::channel();
                state.sequence += 1;
                let rank = (priority.urgency(), std::cmp::Reverse(state.sequence));
                state.waiting.push(Waiter { rank, wake });
                Some(woken)
            }
        };
        if let Some(woken) = waiting {
            // The place is handed over by `release`; the sender is never dropped unsent
            // while the gate lives, and the gate outlives its passes.
            let _ = woken.await;
        }
        GatePass(self.clone())
    }

    fn release(&self) {
        let mut state = self.lock();
        while let Some(next) = state.waiting.pop() {
            // Hand the place over directly; a waiter that went away passes it on.
            if next.wake.send(()).is_ok() {
                return;
            }
        }
        state.in_use = state.in_use.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gate_admits_up_to_its_limit_then_high_priority_first() {
        let gate = Arc::new(TagGate::new(1));
        let held = gate.enter(Priority::Normal).await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (name, priority) in [
            ("low", Priority::Low),
            ("high", Priority::High),
            ("normal", Priority::Normal),
        ] {
            let (entering, order) = (gate.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _pass = entering.enter(priority).await;
                order.lock().unwrap().push(name);
            }));
            // Let each waiter queue up before the next arrives.
            while gate.lock().waiting.len() < waiting.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for task in waiting {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high", "normal", "low"]);
        assert_eq!(gate.lock().in_use, 0);
    }
}
