//! Preemption (DESIGN §9): when a task's delivery finds no room — every
//! instance at its concurrency limit — and this router is delivering a
//! task of lower priority to the same capability, whose capability is
//! declared `preemptible`, the agent running that one is asked to pause it.
//! Its handler returns a checkpoint at its next check; the task becomes
//! `paused`, gives up its place, and is queued again shortly after (any
//! router's worker does it), its next delivery carrying the checkpoint. A
//! resumed task that finds no room is paused again, with its checkpoint, not
//! failed. Non-preemptible work is never asked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_access::Caller;
use agent_reach_pipeline::error::Code;
use agent_reach_pipeline::RouterService;
use agent_reach_proto::Priority;
use agent_reach_task_store::Task;

/// How long after its pause a task is queued again (the waiting work takes the place first).
pub(super) const RESUME_AFTER: Duration = Duration::from_millis(200);
/// The longest wait between a resumed task's tries while there is still no room.
pub(super) const RESUME_AT_MOST_AFTER: Duration = Duration::from_secs(2);
/// How long a delivery that asked for room waits for the paused one to give it up.
const ROOM_WAIT: Duration = Duration::from_secs(3);
/// Room asked for at most this often per delivery.
pub(super) const MAX_PREEMPTIONS: u32 = 3;

/// A failure that says the capability had no room (its instances full), not that the call failed.
pub(super) fn is_no_room(code: Code) -> bool {
    matches!(
        code,
        Code::NoAvailableInstance | Code::Overloaded | Code::AllRetriesExhausted
    )
}

/// A delivery this router is running.
struct Running {
    capability: String,
    priority: Priority,
    request_id: String,
    caller: Caller,
    /// Asked to pause already.
    asked: AtomicBool,
}

/// The deliveries this router is running, by task id.
#[derive(Default)]
pub(super) struct Deliveries {
    running: Mutex<HashMap<String, Arc<Running>>>,
}

/// Keeps a delivery listed while it runs.
pub(super) struct Listed<'a> {
    deliveries: &'a Deliveries,
    task_id: String,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.deliveries.lock().remove(&self.task_id);
    }
}

impl Deliveries {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Running>>> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lists `task`'s delivery (as `caller`'s) until the guard is dropped.
    pub(super) fn enter(&self, task: &Task, caller: &Caller) -> Listed<'_> {
        self.lock().insert(
            task.task_id.clone(),
            Arc::new(Running {
                capability: task.capability.clone(),
                priority: task.priority,
                request_id: task.request_id.clone(),
                caller: caller.clone(),
                asked: AtomicBool::new(false),
            }),
        );
        Listed {
            deliveries: self,
            task_id: task.task_id.clone(),
        }
    }

    /// Makes room for `task` if this router runs less urgent preemptible
    /// work of its capability: asks the least urgent one's agent to pause
    /// it, and waits (bounded) until it gave its place up. Whether it did.
    pub(super) async fn make_room(&self, service: &RouterService, task: &Task) -> bool {
        if !service.is_preemptible(&task.capability) {
            return false;
        }
        let victim = {
            let running = self.lock();
            running
                .iter()
                .filter(|(id, running)| {
                    **id != task.task_id
                        && running.capability == task.capability
                        && running.priority > task.priority
                        && !running.asked.load(Ordering::Acquire)
                })
                .max_by_key(|(_, running)| running.priority)
                .map(|(id, running)| (id.clone(), running.clone()))
        };
        let Some((victim_id, victim)) = victim else {
            return false;
        };
        victim.asked.store(true, Ordering::Release);
        if service
            .pause(&victim.caller, &victim.capability, &victim.request_id)
            .await
            == 0
        {
            return false;
        }
        tracing::info!(
            message = "Asked a lower-priority delivery to pause for this one.",
            task_id = %task.task_id, priority = task.priority.as_str(),
            paused = %victim_id, paused_priority = victim.priority.as_str()
        );
        let left = tokio::time::Instant::now() + ROOM_WAIT;
        while self.lock().contains_key(&victim_id) && tokio::time::Instant::now() < left {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

/// The wait before a resumed task that found no room is queued again: its
/// pauses so far doubling [`RESUME_AFTER`], at most [`RESUME_AT_MOST_AFTER`].
pub(super) fn resume_after(task: &Task) -> Duration {
    let pauses = task
        .transitions
        .iter()
        .filter(|transition| transition.state == agent_reach_task_store::State::Paused)
        .count() as u32;
    RESUME_AFTER
        .saturating_mul(1 << pauses.min(8))
        .min(RESUME_AT_MOST_AFTER)
}
