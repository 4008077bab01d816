//! The callback sender: claims due callbacks from the durable schedule and
//! sends each once (`Deliverer::send_due`), which reschedules or dead-letters it.

use std::sync::Weak;
use std::time::Duration;

use super::TaskService;

const CALLBACK_LEASE: Duration = Duration::from_secs(60);

/// Sends due callbacks from the durable schedule until the router is dropped:
/// one attempt each, then the next attempt is scheduled (2, 4, 8, 16 s by
/// default) or, after the last, the result goes to the dead-letter stream.
/// Any router may send any callback, so a restart loses none.
pub(super) async fn run(tasks: Weak<TaskService>) {
    loop {
        let Some(tasks) = tasks.upgrade() else { return };
        let lease_until = agent_reach_task_store::store::now_ms() + CALLBACK_LEASE.as_millis() as u64;
        let due = match tasks.store.claim_due_callbacks(lease_until, 64).await {
            Ok(due) => due,
            Err(error) => {
                tracing::debug!(message = "Cannot read the callback schedule; retrying.", %error);
                drop(tasks);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if due.is_empty() {
            drop(tasks);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let sends = due.into_iter().map(|task_id| {
            let tasks = tasks.clone();
            async move { send_callback(&tasks, &task_id).await }
        });
        futures::future::join_all(sends).await;
    }
}

async fn send_callback(tasks: &TaskService, task_id: &str) {
    match tasks.deliverer.send_due(&tasks.store, task_id).await {
        Ok(
            agent_reach_task_store::CallbackOutcome::Retrying { .. }
            | agent_reach_task_store::CallbackOutcome::DeadLettered { .. },
        ) => {
            tasks.metrics.callback_failures.inc();
        }
        Ok(_) => {}
        // The callback stays scheduled; its lease brings it back.
        Err(error) => tracing::warn!(message = "Callback not sent; it stays scheduled.", task_id, %error),
    }
}
