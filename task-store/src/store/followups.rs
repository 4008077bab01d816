//! An ended task's follow-ups beyond its lane (its idempotency key's
//! retention, its session result) and the sweep for those a router left.

use std::sync::atomic::Ordering;

use redis::AsyncCommands;

use super::connection::Connection;
use super::{lane_of, now_ms, unavailable, TaskStore, TaskStoreError, FOLLOWUP_GRACE, LANES};
use crate::model::State;

/// How long a router that took over follow-ups holds them before another may.
const FOLLOWUP_LEASE_MS: u64 = 30_000;

/// How often a worker looks for follow-ups a dead router left.
const FOLLOWUP_SWEEP_EVERY_MS: u64 = 1_000;

impl TaskStore {
    /// Starts the retention of a task's idempotency key again (from its end).
    pub(super) async fn retain_request(
        &self,
        connection: &Connection,
        caller: &str,
        request_id: &str,
    ) -> Result<(), TaskStoreError> {
        let mut connection = connection.clone();
        connection
            .expire::<_, i64>(
                self.request_key(caller, request_id),
                i64::try_from(self.retention_s).unwrap_or(i64::MAX),
            )
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Appends an ended task of a session to its results (once), then drops
    /// its follow-up entry.
    pub(super) async fn publish_result(
        &self,
        connection: &Connection,
        task_id: &str,
        session_id: Option<&str>,
        state: State,
    ) -> Result<(), TaskStoreError> {
        let mut connection = connection.clone();
        if let Some(session) = session_id {
            let (results, seen) = self.results_keys(session);
            self.scripts
                .publish
                .key(results)
                .key(seen)
                .arg(task_id)
                .arg(state.as_str())
                .arg(self.retention_s)
                .invoke_async::<i64>(&mut connection)
                .await
                .map_err(unavailable)?;
        }
        connection
            .zrem::<_, _, i64>(self.followups_key(lane_of(task_id)), task_id)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Applies the follow-ups of tasks whose router ended them more than
    /// [`FOLLOWUP_GRACE`] ago and did not get to it (it died, or Redis
    /// failed it): each is leased to this store for a while, so routers
    /// sweeping at once share the work. At most once a second per store.
    pub(super) async fn sweep_followups(&self) {
        let now = now_ms();
        let last = self.last_followup_sweep_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < FOLLOWUP_SWEEP_EVERY_MS
            || self
                .last_followup_sweep_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Ok(connection) = self.connection().await else {
            return;
        };
        let due_before = now.saturating_sub(u64::try_from(FOLLOWUP_GRACE.as_millis()).unwrap_or(u64::MAX));
        let leases = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .lease_due
                    .key(self.followups_key(lane))
                    .arg(due_before)
                    .arg(now + FOLLOWUP_LEASE_MS)
                    .arg(100)
                    .invoke_async::<Vec<String>>(&mut connection)
                    .await
            }
        });
        let due: Vec<String> = futures::future::join_all(leases)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .flatten()
            .collect();
        for task_id in due {
            let outcome = match self.get(&task_id).await {
                Ok(task) if task.state.is_terminal() => {
                    let (retained, published) = tokio::join!(
                        self.retain_request(&connection, &task.caller, &task.request_id),
                        self.publish_result(&connection, &task.task_id, task.session_id.as_deref(), task.state)
                    );
                    retained.and(published)
                }
                // Expired (or not ended after all): nothing is left to apply.
                Ok(_) | Err(TaskStoreError::NotFound(_)) => {
                    let mut connection = connection.clone();
                    connection
                        .zrem::<_, _, i64>(self.followups_key(lane_of(&task_id)), &task_id)
                        .await
                        .map(drop)
                        .map_err(unavailable)
                }
                Err(error) => Err(error),
            };
            if let Err(error) = outcome {
                tracing::warn!(message = "A left follow-up is not applied yet; retrying later.", %task_id, %error);
            }
        }
    }
}
