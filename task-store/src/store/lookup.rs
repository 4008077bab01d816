//! Reading tasks: by id (or an alias a router's buffer gave out), several at
//! once, a caller's, by request id; and a session's results.

use std::collections::HashMap;

use redis::{AsyncCommands, Value as RedisValue};

use super::record::{assemble, entry_fields};
use super::{unavailable, SessionResult, TaskStore, TaskStoreError};
use crate::model::{State, Task};

impl TaskStore {
    /// The task `task_id` names: its own, or the one its alias points to.
    pub async fn get(&self, task_id: &str) -> Result<Task, TaskStoreError> {
        let mut connection = self.connection().await?;
        let mut fields: HashMap<String, String> =
            connection.hgetall(self.task_key(task_id)).await.map_err(unavailable)?;
        if fields.is_empty() {
            // Only on a miss: an id the buffer gave out for a request Redis already had.
            let alias: Option<String> = connection.get(self.alias_key(task_id)).await.map_err(unavailable)?;
            if let Some(target) = alias {
                fields = connection.hgetall(self.task_key(&target)).await.map_err(unavailable)?;
            }
        }
        if fields.is_empty() {
            return Err(TaskStoreError::NotFound(task_id.to_string()));
        }
        assemble(fields)
    }

    /// The ids of `caller`'s tasks, newest first (at most [`CALLER_INDEX_MAX`](super::CALLER_INDEX_MAX);
    /// some may have expired since).
    pub async fn caller_tasks(&self, caller: &str) -> Result<Vec<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        connection
            .zrevrange(self.caller_index_key(caller), 0, -1)
            .await
            .map_err(unavailable)
    }

    /// Records that `from` names the task `to`, for the retention: a router
    /// that accepted a submission into its local buffer while Redis was away
    /// answered it with `from`, and on replay found its `request_id` already
    /// held by `to` (the caller had submitted it before, and that write had
    /// reached Redis). Without the alias, `from` would answer 404 forever.
    pub async fn alias(&self, from: &str, to: &str) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        connection
            .set_ex::<_, _, ()>(self.alias_key(from), to, self.retention_s)
            .await
            .map_err(unavailable)
    }

    /// Several tasks at once (their lanes may be on different shards), in
    /// order; `None` for those that are gone.
    pub async fn get_many(&self, task_ids: &[String]) -> Result<Vec<Option<Task>>, TaskStoreError> {
        if task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let connection = self.connection().await?;
        let reads = task_ids.iter().map(|task_id| {
            let mut connection = connection.clone();
            async move {
                connection
                    .hgetall::<_, HashMap<String, String>>(self.task_key(task_id))
                    .await
                    .map_err(unavailable)
            }
        });
        futures::future::join_all(reads)
            .await
            .into_iter()
            .map(|fields| {
                let fields = fields?;
                (!fields.is_empty()).then(|| assemble(fields)).transpose()
            })
            .collect()
    }

    /// The task a caller submitted under `request_id`, if it is still kept.
    pub async fn find(&self, caller: &str, request_id: &str) -> Result<Option<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        connection
            .get(self.request_key(caller, request_id))
            .await
            .map_err(unavailable)
    }

    /// Finished tasks of a session after `after` (exclusive; `None` = from the start).
    pub async fn session_results(
        &self,
        session_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionResult>, TaskStoreError> {
        let start = after.map_or_else(|| "-".to_string(), |cursor| format!("({cursor}"));
        let mut connection = self.connection().await?;
        let reply: RedisValue = redis::cmd("XRANGE")
            .arg(self.results_keys(session_id).0)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let entries = entry_fields(&reply);
        let ids: Vec<String> = entries
            .iter()
            .map(|(_, fields)| fields.get("task_id").cloned().unwrap_or_default())
            .collect();
        let tasks = self.get_many(&ids).await?;
        let mut out = Vec::new();
        for ((cursor, fields), (task_id, task)) in entries.into_iter().zip(ids.into_iter().zip(tasks)) {
            let state = fields
                .get("state")
                .and_then(|state| State::parse(state))
                .ok_or_else(|| TaskStoreError::Corrupt(format!("session result {cursor} has no state")))?;
            out.push(SessionResult {
                cursor,
                task_id,
                state,
                result: task.and_then(|task| task.result),
            });
        }
        Ok(out)
    }
}
