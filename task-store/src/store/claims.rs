//! Workers taking queue entries: claims planned on the lanes' backlogs, a
//! running delivery's claim kept fresh, reclaim from dead workers, the
//! running count.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value as RedisValue;

use super::record::{assemble, text};
use super::scripts::terminal_states;
use super::{unavailable, Claimed, TaskStore, TaskStoreError, GROUP, LANES};
use crate::model::Priority;

impl TaskStore {
    /// Takes up to `count` new entries, high priority first. Every fourth call
    /// looks at the low priority first, so a steady stream of high-priority
    /// work cannot starve it. Within a priority the capabilities with tasks
    /// waiting take turns, one task each. Canceled tasks are acknowledged and
    /// skipped. Also applies follow-ups a dead router left (at most once a second).
    ///
    /// The claim is planned on the lanes' backlog counts (read at once from
    /// every lane, at most [`BACKLOG_VIEW_FOR`](super::backlog::BACKLOG_VIEW_FOR) ago, less what this store
    /// claimed since), then each lane with work is asked for its share in one
    /// script: never more than `count` entries are taken.
    pub async fn claim(&self, consumer: &str, count: usize, round: u64) -> Result<Vec<Claimed>, TaskStoreError> {
        self.sweep_followups().await;
        let order = if round % 4 == 3 {
            [Priority::Low, Priority::High, Priority::Normal]
        } else {
            [Priority::High, Priority::Normal, Priority::Low]
        };
        let backlogs = self.backlog_view().await?;
        let mut plan: Vec<Vec<(String, usize)>> = vec![Vec::new(); LANES];
        let mut left = count;
        for priority in order {
            // (lane, capability, waiting) at this priority, in a stable order turned by the round.
            let mut waiting: Vec<(usize, String, usize)> = backlogs
                .iter()
                .enumerate()
                .flat_map(|(lane, counts)| {
                    counts.iter().filter_map(move |(field, waiting)| {
                        let (capability, named) = field.rsplit_once('|')?;
                        (named == priority.as_str() && *waiting > 0)
                            .then(|| (lane, capability.to_string(), usize::try_from(*waiting).unwrap_or(0)))
                    })
                })
                .collect();
            waiting.sort();
            if waiting.is_empty() {
                continue;
            }
            let turn = usize::try_from(round % waiting.len() as u64).unwrap_or(0);
            waiting.rotate_left(turn);
            let mut taken = vec![0usize; waiting.len()];
            while left > 0 {
                let mut progressed = false;
                for (at, (_, _, wanted)) in waiting.iter().enumerate() {
                    if left > 0 && taken[at] < *wanted {
                        taken[at] += 1;
                        left -= 1;
                        progressed = true;
                    }
                }
                if !progressed {
                    break;
                }
            }
            for ((lane, capability, _), taken) in waiting.into_iter().zip(taken) {
                if taken > 0 {
                    plan[lane].push((self.queue_key(lane, &capability, priority), taken));
                }
            }
        }
        self.note_planned(&plan);
        let connection = self.connection().await?;
        let terminal = terminal_states();
        let claims = plan
            .into_iter()
            .enumerate()
            .filter(|(_, queues)| !queues.is_empty())
            .map(|(lane, queues)| {
                let mut connection = connection.clone();
                let terminal = &terminal;
                async move {
                    let mut invocation = self.scripts.claim.key(self.queues_key(lane));
                    invocation
                        .arg(GROUP)
                        .arg(consumer)
                        .arg(self.task_prefix(lane))
                        .arg(terminal);
                    for (queue, taken) in &queues {
                        invocation.arg(queue).arg(*taken);
                    }
                    invocation
                        .invoke_async::<RedisValue>(&mut connection)
                        .await
                        .map_err(unavailable)
                }
            });
        let mut claimed = Vec::new();
        for reply in futures::future::join_all(claims).await {
            claimed.extend(taken_entries(&reply?, consumer)?);
        }
        // High priority first (as planned), whatever lane answered first.
        claimed.sort_by_key(|claimed| order.iter().position(|priority| *priority == claimed.task.priority));
        Ok(claimed)
    }

    /// Keeps a running delivery's claim fresh so no router reclaims it; `false`
    /// when this worker no longer holds the entry (another took it over).
    pub async fn extend_claim(&self, claimed: &Claimed) -> Result<bool, TaskStoreError> {
        let mut connection = self.connection().await?;
        let held: i64 = self
            .scripts
            .extend
            .key(&claimed.queue)
            .arg(GROUP)
            .arg(&claimed.consumer)
            .arg(&claimed.entry_id)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(held == 1)
    }

    /// Takes over entries another worker took more than `min_idle` ago and
    /// never acknowledged (it died): the work is not lost.
    pub async fn reclaim(
        &self,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Claimed>, TaskStoreError> {
        let connection = self.connection().await?;
        let terminal = terminal_states();
        let mut claimed = Vec::new();
        for lane in 0..LANES {
            let left = count.saturating_sub(claimed.len());
            if left == 0 {
                break;
            }
            let mut connection = connection.clone();
            let reply: RedisValue = self
                .scripts
                .reclaim
                .key(self.queues_key(lane))
                .arg(GROUP)
                .arg(consumer)
                .arg(self.task_prefix(lane))
                .arg(&terminal)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg(left)
                .invoke_async(&mut connection)
                .await
                .map_err(unavailable)?;
            claimed.extend(taken_entries(&reply, consumer)?);
        }
        Ok(claimed)
    }

    /// Tasks claimed by a worker and not yet acknowledged (running or being
    /// retried), per priority: the queues' consumer-group pending counts.
    pub async fn running(&self) -> Result<Vec<(Priority, u64)>, TaskStoreError> {
        let connection = self.connection().await?;
        let counts = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .running
                    .key(self.queues_key(lane))
                    .arg(GROUP)
                    .invoke_async::<Vec<(String, u64)>>(&mut connection)
                    .await
                    .map_err(unavailable)
            }
        });
        let mut totals: Vec<(Priority, u64)> = Priority::ALL.into_iter().map(|priority| (priority, 0)).collect();
        for lane in futures::future::join_all(counts).await {
            for (queue, count) in lane? {
                if let Some((_, total)) = totals
                    .iter_mut()
                    .find(|(priority, _)| queue.ends_with(&format!(":{}", priority.as_str())))
                {
                    *total += count;
                }
            }
        }
        Ok(totals)
    }
}

/// The claim and reclaim scripts' answer, `[[queue, entry id, [field, value, …]], …]`.
fn taken_entries(reply: &RedisValue, consumer: &str) -> Result<Vec<Claimed>, TaskStoreError> {
    let RedisValue::Array(entries) = reply else {
        return Ok(Vec::new());
    };
    let mut claimed = Vec::with_capacity(entries.len());
    for entry in entries {
        let RedisValue::Array(parts) = entry else {
            return Err(TaskStoreError::Corrupt("a claimed entry is not an array".to_string()));
        };
        let (Some(queue), Some(entry_id), Some(RedisValue::Array(record))) =
            (parts.first().and_then(text), parts.get(1).and_then(text), parts.get(2))
        else {
            return Err(TaskStoreError::Corrupt("a claimed entry lacks its parts".to_string()));
        };
        let mut fields = HashMap::new();
        for pair in record.chunks(2) {
            if let (Some(name), Some(value)) = (pair.first().and_then(text), pair.get(1).and_then(text)) {
                fields.insert(name, value);
            }
        }
        claimed.push(Claimed {
            task: assemble(fields)?,
            queue,
            entry_id,
            consumer: consumer.to_string(),
        });
    }
    Ok(claimed)
}
