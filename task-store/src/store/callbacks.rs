//! A task's callback set or deleted after submission, and the callback
//! schedule: due callbacks leased to a router, attempts counted, rescheduled.

use std::sync::atomic::Ordering;

use redis::AsyncCommands;

use super::{lane_of, now_ms, unavailable, TaskStore, TaskStoreError, LANES};
use crate::model::{Callback, State};

impl TaskStore {
    /// Sets (`Some`) or deletes (`None`) the callback of a task that has not
    /// ended; the outcome's callback is sent to the one set last.
    pub async fn set_callback(&self, task_id: &str, callback: Option<&Callback>) -> Result<(), TaskStoreError> {
        let record = match callback {
            Some(callback) => {
                serde_json::to_string(callback).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?
            }
            None => "null".to_string(),
        };
        let open: Vec<&str> = State::ALL
            .into_iter()
            .filter(|state| !state.is_terminal())
            .map(State::as_str)
            .collect();
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .set_callback
            .key(self.task_key(task_id))
            .arg(record)
            .arg(open)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        match answer.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
            Some("refused") => Err(TaskStoreError::Refused {
                current: answer.get(1).cloned().unwrap_or_default(),
                wanted: "given a callback".to_string(),
            }),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
    }

    /// Callbacks due now (at most `limit`), each leased to the caller until
    /// `lease_until_ms`; the lanes are asked in turn, from a different one each call.
    pub async fn claim_due_callbacks(&self, lease_until_ms: u64, limit: usize) -> Result<Vec<String>, TaskStoreError> {
        let connection = self.connection().await?;
        let first = self.next_callback_lane.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let mut due = Vec::new();
        for offset in 0..LANES {
            let left = limit.max(1).saturating_sub(due.len());
            if left == 0 {
                break;
            }
            let mut connection = connection.clone();
            let lane = (first + offset) % LANES;
            let taken: Vec<String> = self
                .scripts
                .lease_due
                .key(self.callbacks_key(lane))
                .arg(now)
                .arg(lease_until_ms)
                .arg(left)
                .invoke_async(&mut connection)
                .await
                .map_err(unavailable)?;
            due.extend(taken);
        }
        Ok(due)
    }

    /// Counts one more attempt of the scheduled callback `member` (see
    /// [`schedule_member`]); returns the count.
    pub async fn count_callback_attempt(&self, member: &str) -> Result<u32, TaskStoreError> {
        let (task_id, _) = schedule_member(member);
        let mut connection = self.connection().await?;
        let count: i64 = connection
            .hincr(self.task_key(task_id), attempts_field(member), 1)
            .await
            .map_err(unavailable)?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// Schedules the next attempt of callback `member`, or (`None`) drops it: delivered or dead-lettered.
    pub async fn reschedule_callback(&self, member: &str, due_ms: Option<u64>) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        let schedule = self.callbacks_key(lane_of(schedule_member(member).0));
        match due_ms {
            Some(due) => connection.zadd(schedule, member, due).await.map_err(unavailable),
            None => connection.zrem(schedule, member).await.map_err(unavailable),
        }
    }
}

/// A member of the callback schedule: `{task id}` for the task's callback,
/// `{task id}#{config id}` for one of its A2A push configs (task ids hold no `#`).
pub fn schedule_member(member: &str) -> (&str, Option<&str>) {
    match member.split_once('#') {
        Some((task_id, config_id)) => (task_id, Some(config_id)),
        None => (member, None),
    }
}

/// The task's field counting the attempts of callback `member`.
pub(super) fn attempts_field(member: &str) -> String {
    match schedule_member(member).1 {
        Some(config_id) => format!("callback_attempts#{config_id}"),
        None => "callback_attempts".to_string(),
    }
}
