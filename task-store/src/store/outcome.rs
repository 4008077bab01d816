//! A task's moves and its end: transitions, a worker's outcome, an agent's
//! `202` and its report, a cancel, each one script on the task's lane.

use serde_json::Value;

use super::connection::Connection;
use super::parts::{invoke, Part};
use super::scripts::state_args;
use super::{lane_of, now_ms, unavailable, Claimed, Reported, TaskStore, TaskStoreError, GROUP};
use crate::model::{Accepted, State, Task};

impl TaskStore {
    /// Moves a task to `next` if the transition table allows it from its current state.
    pub async fn transition(&self, task_id: &str, next: State) -> Result<State, TaskStoreError> {
        let mut connection = self.connection().await?;
        let answer: Vec<String> = invoke(
            &self.scripts.transition,
            &[&self.transition_part(task_id, next)],
            &mut connection,
        )
        .await?;
        script_answer(answer, task_id, next)
    }

    /// `TRANSITION`'s keys and arguments: task `task_id` to `next`.
    pub(super) fn transition_part(&self, task_id: &str, next: State) -> Part {
        let attempts = if next == State::Running { 1 } else { 0 };
        let mut part = Part::default();
        part.key(self.task_key(task_id))
            .key(self.backlog_key(lane_of(task_id)))
            .arg(next.as_str())
            .arg(now_ms())
            .arg(attempts)
            .arg(state_args(next));
        part
    }

    /// Records a terminal outcome (and acknowledges the queue entry when
    /// given); `report` (agent name, fingerprint) makes it an agent's report.
    /// The idempotency key's retention starts again with it (on a cluster
    /// beside it, the key being in its own slot: a failure there leaves it
    /// the retention from the submission); once the outcome is recorded,
    /// a session's task is appended to its results.
    async fn record_end(
        &self,
        task: &Task,
        state: State,
        result: &Value,
        entry: Option<(&str, &str)>,
        report: Option<(&str, &str)>,
    ) -> Result<Vec<String>, TaskStoreError> {
        let ending = Ending::of(self, task);
        let connection = self.connection().await?;
        let record = async {
            let mut connection = connection.clone();
            let part = self.finish_part(&ending, state, result, entry, report);
            invoke::<Vec<String>>(&self.scripts.finish, &[&part], &mut connection).await
        };
        let retain = async {
            if !self.is_cluster() {
                return Ok(());
            }
            self.retain_request(&connection, ending.caller, ending.request_id).await
        };
        let (answer, retained) = tokio::join!(record, retain);
        let answer = answer?;
        if let Err(error) = retained {
            tracing::warn!(
                message = "An ended task's idempotency key keeps the retention from its submission.",
                task_id = %task.task_id, %error
            );
        }
        self.publish_recorded(&connection, &ending, state, &answer).await;
        Ok(answer)
    }

    /// `FINISH`'s keys and arguments for `ending` (`entry`: its queue and
    /// entry id; `report`: an agent's report, by whom, its fingerprint).
    pub(super) fn finish_part(
        &self,
        ending: &Ending<'_>,
        state: State,
        result: &Value,
        entry: Option<(&str, &str)>,
        report: Option<(&str, &str)>,
    ) -> Part {
        let lane = lane_of(ending.task_id);
        let (queue, entry_id) = entry.unwrap_or((&ending.queue, ""));
        let (reporter, fingerprint) = report.unwrap_or(("", ""));
        let one_server = !self.is_cluster();
        let mut part = Part::default();
        part.key(self.task_key(ending.task_id))
            .key(queue)
            .key(self.backlog_key(lane))
            .key(self.callbacks_key(lane))
            .key(self.followups_key(lane));
        if one_server {
            part.key(self.request_key(ending.caller, ending.request_id));
        }
        part.arg(state.as_str())
            .arg(now_ms())
            .arg(result.to_string())
            .arg(entry_id)
            .arg(GROUP)
            .arg(self.retention_s)
            .arg(ending.task_id)
            // A callback is scheduled with the outcome, durably: any router delivers it.
            .arg(if ending.has_callback && state != State::Canceled {
                "1"
            } else {
                "0"
            })
            .arg(reporter)
            .arg(fingerprint)
            .arg(if ending.session_id.is_some() { "1" } else { "0" })
            .arg(if one_server { "1" } else { "0" })
            .arg(state_args(state));
        part
    }

    /// Once `FINISH` answered `answer` for `ending`: a session's task is
    /// appended to its results (a worker does it later when this fails).
    pub(super) async fn publish_recorded(
        &self,
        connection: &Connection,
        ending: &Ending<'_>,
        state: State,
        answer: &[String],
    ) {
        if answer.first().map(String::as_str) == Some("ok") && ending.session_id.is_some() {
            // The outcome is durable; a worker applies this if it fails here.
            if let Err(error) = self
                .publish_result(connection, ending.task_id, ending.session_id, state)
                .await
            {
                tracing::warn!(
                    message = "An ended task's session result is not appended yet; a worker retries it.",
                    task_id = %ending.task_id, %error
                );
            }
        }
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

/// What ending a task needs to know of it (a run knows it of its held
/// task without reading it).
pub(super) struct Ending<'a> {
    pub(super) task_id: &'a str,
    pub(super) caller: &'a str,
    pub(super) request_id: &'a str,
    pub(super) session_id: Option<&'a str>,
    /// Its queue's key (acknowledged with an entry id; a held task has none).
    pub(super) queue: String,
    pub(super) has_callback: bool,
}

impl<'a> Ending<'a> {
    pub(super) fn of(store: &TaskStore, task: &'a Task) -> Self {
        Self {
            task_id: &task.task_id,
            caller: &task.caller,
            request_id: &task.request_id,
            session_id: task.session_id.as_deref(),
            queue: store.queue_of(task),
            has_callback: task.callback.is_some(),
        }
    }
}

/// A move's answer (a task's or, by its held task's id, a run's): the state
/// it was in; `Refused` when it is in another, `NotFound` when it is gone.
pub(super) fn script_answer(answer: Vec<String>, task_id: &str, wanted: State) -> Result<State, TaskStoreError> {
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
