//! The lanes' backlog counts: read for the metric and for claims (a view
//! kept a moment, counting what this store queues and claims meanwhile).

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::{unavailable, TaskStore, TaskStoreError, LANES};
use crate::model::Priority;

/// How long a worker plans its claims on the lanes' backlog counts it read
/// last (less what it claimed since, plus what its own router queued)
/// before reading them again: a busy worker claims every few milliseconds,
/// and 16 reads per claim cost Redis more than the claims. A task another
/// router queued meanwhile waits at most this long.
pub(super) const BACKLOG_VIEW_FOR: Duration = Duration::from_millis(20);

/// The lanes' backlog counts (`capability|priority` → waiting), in lane order.
pub(super) type Backlogs = Vec<HashMap<String, i64>>;

impl TaskStore {
    /// Tasks waiting per lane (the backlog counts), in lane order.
    pub(super) async fn waiting_per_lane(&self) -> Result<Vec<i64>, TaskStoreError> {
        Ok(self
            .lane_backlogs()
            .await?
            .into_iter()
            .map(|counts| counts.values().map(|count| (*count).max(0)).sum())
            .collect())
    }

    /// Every lane's backlog hash (`capability|priority` → waiting), in lane order.
    async fn lane_backlogs(&self) -> Result<Backlogs, TaskStoreError> {
        let connection = self.connection().await?;
        let reads = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                connection
                    .hgetall::<_, HashMap<String, i64>>(self.backlog_key(lane))
                    .await
                    .map_err(unavailable)
            }
        });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// The backlog counts to plan a claim on: the last ones read, unless
    /// they are older than [`BACKLOG_VIEW_FOR`].
    pub(super) async fn backlog_view(&self) -> Result<Backlogs, TaskStoreError> {
        if let Some((read, backlogs)) = self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
        {
            if read.elapsed() < BACKLOG_VIEW_FOR {
                return Ok(backlogs.clone());
            }
        }
        let backlogs = self.lane_backlogs().await?;
        *self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((std::time::Instant::now(), backlogs.clone()));
        Ok(backlogs)
    }

    /// Counts a task this store just queued in the backlog view, so this
    /// router's next claim sees it without reading the backlogs again.
    pub(super) fn note_queued(&self, lane: usize, field: &str) {
        let mut view = self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(counts) = view.as_mut().and_then(|(_, backlogs)| backlogs.get_mut(lane)) {
            *counts.entry(field.to_string()).or_default() += 1;
        }
    }

    /// Takes what a claim asks for off the backlog view, so the next claim
    /// within the view's life asks for what is left.
    pub(super) fn note_planned(&self, plan: &[Vec<(String, usize)>]) {
        let mut view = self
            .backlog_view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some((_, backlogs)) = view.as_mut() else { return };
        for (lane, queues) in plan.iter().enumerate() {
            let Some(counts) = backlogs.get_mut(lane) else { continue };
            let prefix = format!("{}:", self.lane_key("queue", lane));
            for (queue, taken) in queues {
                // `queue:{L}:<capability>:<priority>` counts under `<capability>|<priority>`.
                let Some((capability, priority)) = queue.strip_prefix(&prefix).and_then(|rest| rest.rsplit_once(':'))
                else {
                    continue;
                };
                if let Some(waiting) = counts.get_mut(&format!("{capability}|{priority}")) {
                    *waiting -= i64::try_from(*taken).unwrap_or(i64::MAX);
                }
            }
        }
    }

    /// Tasks waiting to be delivered, as ((capability, priority), count),
    /// summed over the lanes.
    pub async fn backlog(&self) -> Result<Vec<((String, Priority), i64)>, TaskStoreError> {
        let mut totals: HashMap<(String, Priority), i64> = HashMap::new();
        for counts in self.lane_backlogs().await? {
            for (field, count) in counts {
                let Some((capability, priority)) = field.rsplit_once('|') else {
                    continue;
                };
                let Some(priority) = Priority::ALL.into_iter().find(|known| known.as_str() == priority) else {
                    continue;
                };
                *totals.entry((capability.to_string(), priority)).or_default() += count.max(0);
            }
        }
        let mut out: Vec<_> = totals.into_iter().collect();
        out.sort();
        Ok(out)
    }
}
