//! A task's moves and its end: transitions, a worker's outcome, an agent's
//! `202` and its report, a cancel, each one script on the task's lane.

use serde_json::Value;

use super::scripts::state_args;
use super::{lane_of, now_ms, unavailable, Claimed, Reported, TaskStore, TaskStoreError, GROUP};
use crate::model::{Accepted, State, Task};

impl TaskStore {
    /// Moves a task to `next` if the transition table allows it from its current state.
    pub async fn transition(&self, task_id: &str, next: State) -> Result<State, TaskStoreError> {
        let attempts = if next == State::Running { 1 } else { 0 };
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .transition
            .key(self.task_key(task_id))
            .key(self.backlog_key(lane_of(task_id)))
            .arg(next.as_str())
            .arg(now_ms())
            .arg(attempts)
            .arg(state_args(next))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        script_answer(answer, task_id, next)
    }

    /// Records a terminal outcome (and acknowledges the queue entry when
    /// given); `report` (agent name, fingerprint) makes it an agent's report.
    /// The idempotency key's retention starts again with it (on a cluster
    /// beside it, the key being in its own slot: a failure there leaves it
    /// the retention from the submission); once the outcome is recorded, a
    /// session's task is appended to its results.
    async fn record_end(
        &self,
        task: &Task,
        state: State,
        result: &Value,
        entry: Option<(&str, &str)>,
        report: Option<(&str, &str)>,
    ) -> Result<Vec<String>, TaskStoreError> {
        let lane = lane_of(&task.task_id);
        let queue_key = self.queue_of(task);
        let (queue, entry_id) = entry.unwrap_or((&queue_key, ""));
        let (reporter, fingerprint) = report.unwrap_or(("", ""));
        let connection = self.connection().await?;
        let one_server = !self.is_cluster();
        let request_key = self.request_key(&task.caller, &task.request_id);
        let record = async {
            let mut connection = connection.clone();
            let mut invocation = self.scripts.finish.key(self.task_key(&task.task_id));
            invocation
                .key(queue)
                .key(self.backlog_key(lane))
                .key(self.callbacks_key(lane))
                .key(self.followups_key(lane));
            if one_server {
                invocation.key(&request_key);
            }
            invocation
                .arg(state.as_str())
                .arg(now_ms())
                .arg(result.to_string())
                .arg(entry_id)
                .arg(GROUP)
                .arg(self.retention_s)
                .arg(&task.task_id)
                // A callback is scheduled with the outcome, durably: any router delivers it.
                .arg(if task.callback.is_some() && state != State::Canceled {
                    "1"
                } else {
                    "0"
                })
                .arg(reporter)
                .arg(fingerprint)
                .arg(if task.session_id.is_some() { "1" } else { "0" })
                .arg(if one_server { "1" } else { "0" })
                .arg(state_args(state))
                .invoke_async::<Vec<String>>(&mut connection)
                .await
                .map_err(unavailable)
        };
        let retain = async {
            if one_server {
                return Ok(());
            }
            self.retain_request(&connection, task).await
        };
        let (answer, retained) = tokio::join!(record, retain);
        let answer = answer?;
        if let Err(error) = retained {
            tracing::warn!(
                message = "An ended task's idempotency key keeps the retention from its submission.",
                task_id = %task.task_id, %error
            );
        }
        if answer.first().map(String::as_str) == Some("ok") && task.session_id.is_some() {
            // The outcome is durable; a worker applies this if it fails here.
            if let Err(error) = self.publish_result(&connection, task, state).await {
                tracing::warn!(
                    message = "An ended task's session result is not appended yet; a worker retries it.",
                    task_id = %task.task_id, %error
                );
            }
        }
        Ok(answer)
    }

    /// A worker's task ended: record it and acknowledge its queue entry.
    /// A task canceled meanwhile stays canceled (`Refused`), and its entry is
    /// acknowledged all the same.
    pub async fn finish(&self, claimed: &Claimed, state: State, result: &Value) -> Result<State, TaskStoreError> {
        let answer = self
            .record_end(
                &claimed.task,
                state,
                result,
                Some((&claimed.queue, &claimed.entry_id)),
                None,
            )
            .await?;
        script_answer(answer, &claimed.task.task_id, state)
    }

    /// The agent answered the delivery `202`: records who reports, until when.
    pub async fn accept(&self, claimed: &Claimed, accepted: &Accepted) -> Result<(), TaskStoreError> {
        let record = serde_json::to_string(accepted).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .accept
            .key(self.task_key(&claimed.task.task_id))
            .arg(record)
            .arg(&accepted.agent_name)
            .arg(&claimed.entry_id)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        script_answer(answer, &claimed.task.task_id, State::Running).map(|_| ())
    }

    /// An agent's report (`report`, as it sent it) of an accepted delivery's
    /// outcome (`state`, `result`), by `agent_name` (its token's subject):
    /// ends the task once; the same report again changes nothing.
    pub async fn report(
        &self,
        task: &Task,
        agent_name: &str,
        (state, result): (State, &Value),
        report: &Value,
    ) -> Result<Reported, TaskStoreError> {
        use sha2::Digest as _;
        let task_id = &task.task_id;
        // Compared, not kept: a digest of the report stands for it.
        let fingerprint = hex::encode(sha2::Sha256::digest(report.to_string().as_bytes()));
        let answer = self
            .record_end(task, state, result, None, Some((agent_name, &fingerprint)))
            .await?;
        let current = || answer.get(1).cloned().unwrap_or_default();
        let parsed = || {
            State::parse(&current())
                .ok_or_else(|| TaskStoreError::Corrupt(format!("task {task_id} has an unknown state")))
        };
        match answer.first().map(String::as_str) {
            Some("ok") => Ok(Reported::Recorded(state)),
            Some("repeat") => Ok(Reported::Repeated(parsed()?)),
            Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
            Some("not_accepted") => Err(TaskStoreError::NotAwaitingResult { current: current() }),
            Some("wrong_agent") => Err(TaskStoreError::NotTheAgent {
                expected: answer.get(2).cloned().unwrap_or_default(),
                reporter: agent_name.to_string(),
            }),
            Some("conflict") => Err(TaskStoreError::ResultConflict { current: current() }),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
    }

    /// Cancels a task that has not ended; a pending one is never delivered.
    pub async fn cancel(&self, task_id: &str, result: &Value) -> Result<State, TaskStoreError> {
        self.complete(task_id, State::Canceled, result).await
    }

    /// Ends a task that has no queue entry of its own (a broadcast parent).
    pub async fn complete(&self, task_id: &str, state: State, result: &Value) -> Result<State, TaskStoreError> {
        let task = self.get(task_id).await?;
        let answer = self.record_end(&task, state, result, None, None).await?;
        script_answer(answer, task_id, state)
    }
}

fn script_answer(answer: Vec<String>, task_id: &str, wanted: State) -> Result<State, TaskStoreError> {
    let previous = |text: Option<&String>| {
        text.and_then(|text| State::parse(text))
            .ok_or_else(|| TaskStoreError::Corrupt(format!("task {task_id} has an unknown state")))
    };
    match answer.first().map(String::as_str) {
        Some("ok") => previous(answer.get(1)),
        Some("refused") => Err(TaskStoreError::Refused {
            current: answer.get(1).cloned().unwrap_or_default(),
            wanted: wanted.as_str().to_string(),
        }),
        Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
        other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
    }
}
