//! The dead-letter stream: callbacks that could not be delivered, parked
//! with their result, read, and replayed from their first attempt.

use redis::Value as RedisValue;
use serde_json::Value;

use super::record::entry_fields;
use super::{lane_of, now_ms, unavailable, DeadLetter, TaskStore, TaskStoreError};
use crate::model::Task;

impl TaskStore {
    /// Parks an undeliverable callback with its result; nothing is lost.
    /// `push_config`: the A2A push config it was for (`None`: the task's callback).
    pub async fn dead_letter(
        &self,
        task: &Task,
        push_config: Option<&str>,
        url: &str,
        error: &str,
    ) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        let result = task.result.as_ref().map(Value::to_string).unwrap_or_default();
        let mut add = redis::cmd("XADD");
        add.arg(self.dead_letter_key())
            .arg("*")
            .arg("task_id")
            .arg(&task.task_id);
        if let Some(id) = push_config {
            add.arg("push_config").arg(id);
        }
        let _: String = add
            .arg("url")
            .arg(url)
            .arg("error")
            .arg(error)
            .arg("result")
            .arg(result)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Entries in the dead-letter stream.
    pub async fn dead_letter_count(&self) -> Result<u64, TaskStoreError> {
        let mut connection = self.connection().await?;
        redis::cmd("XLEN")
            .arg(self.dead_letter_key())
            .query_async(&mut connection)
            .await
            .map_err(unavailable)
    }

    /// Dead-lettered callbacks as (task id, result JSON), oldest first.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<(String, String)>, TaskStoreError> {
        Ok(self
            .list_dead_letters(None, limit)
            .await?
            .into_iter()
            .map(|letter| {
                let result = letter.result.as_ref().map(Value::to_string).unwrap_or_default();
                (letter.task_id, result)
            })
            .collect())
    }

    /// Dead letters after `after` (exclusive; `None`: from the oldest), at most `limit`.
    pub async fn list_dead_letters(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, TaskStoreError> {
        let start = after.map_or_else(|| "-".to_string(), |id| format!("({id}"));
        self.read_dead_letters(&start, "+", limit.max(1)).await
    }

    /// One dead letter by id.
    pub async fn dead_letter_entry(&self, id: &str) -> Result<DeadLetter, TaskStoreError> {
        self.read_dead_letters(id, id, 1)
            .await?
            .pop()
            .ok_or_else(|| TaskStoreError::DeadLetterNotFound(id.to_string()))
    }

    async fn read_dead_letters(&self, start: &str, end: &str, limit: usize) -> Result<Vec<DeadLetter>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let reply: RedisValue = redis::cmd("XRANGE")
            .arg(self.dead_letter_key())
            .arg(start)
            .arg(end)
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(entry_fields(&reply)
            .into_iter()
            .map(|(id, fields)| {
                let field = |name: &str| fields.get(name).cloned().unwrap_or_default();
                DeadLetter {
                    result: fields.get("result").and_then(|text| serde_json::from_str(text).ok()),
                    task_id: field("task_id"),
                    push_config: fields.get("push_config").cloned(),
                    url: field("url"),
                    error: field("error"),
                    id,
                }
            })
            .collect())
    }

    /// Sends a dead letter's callback again, from its first attempt (the
    /// usual schedule follows; a last failure parks a new dead letter).
    /// Returns the task id. A task past its retention cannot be replayed.
    /// The callback is scheduled (in the task's lane) before the dead letter
    /// is removed (in the tenant's stream): a failure between the two leaves
    /// the dead letter to replay again, never a callback lost.
    pub async fn replay_dead_letter(&self, id: &str) -> Result<String, TaskStoreError> {
        let letter = self.dead_letter_entry(id).await?;
        let member = match &letter.push_config {
            Some(config_id) => format!("{}#{config_id}", letter.task_id),
            None => letter.task_id.clone(),
        };
        let mut connection = self.connection().await?;
        let answer: String = self
            .scripts
            .replay
            .key(self.task_key(&letter.task_id))
            .key(self.callbacks_key(lane_of(&letter.task_id)))
            .arg(&member)
            .arg(now_ms())
            .arg(super::callbacks::attempts_field(&member))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        match answer.as_str() {
            "ok" => {}
            "expired" => return Err(TaskStoreError::NotFound(letter.task_id)),
            other => return Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
        let _: i64 = redis::cmd("XDEL")
            .arg(self.dead_letter_key())
            .arg(id)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(letter.task_id)
    }
}
