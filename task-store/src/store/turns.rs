//! Multi-turn tasks: the agent asks for more input (`pause`), a message
//! continues the task (`resume`); and a task's A2A push configs, each a
//! field of the task's hash (`push:{id}`), notified when the task ends or
//! asks for input. Each change is one script on the task's lane.

use redis::AsyncCommands;

use super::record::PUSH_FIELD;
use super::scripts::state_args;
use super::{lane_of, now_ms, unavailable, Claimed, NewTask, Submitted, TaskStore, TaskStoreError, GROUP};
use crate::model::{Callback, State, Turn};

/// The most push configs one task holds.
pub const MOST_PUSH_CONFIGS: usize = 16;

impl TaskStore {
    /// The agent answered a delivery by asking for more input (`question`,
    /// the agent's turn): the task waits in `input_required`, its queue
    /// entry acknowledged, its push configs notified. A task canceled
    /// meanwhile stays canceled (`Refused`).
    pub async fn pause(&self, claimed: &Claimed, question: &Turn) -> Result<State, TaskStoreError> {
        let queue = claimed.queue.clone();
        self.pause_in(&claimed.task.task_id, &queue, &claimed.entry_id, question)
            .await
    }

    async fn pause_in(
        &self,
        task_id: &str,
        queue: &str,
        entry_id: &str,
        question: &Turn,
    ) -> Result<State, TaskStoreError> {
        let line = serde_json::to_string(question).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .pause
            .key(self.task_key(task_id))
            .key(queue)
            .key(self.callbacks_key(lane_of(task_id)))
            .arg(now_ms())
            .arg(line)
            .arg(entry_id)
            .arg(GROUP)
            .arg(self.retention_s)
            .arg(task_id)
            .arg(state_args(State::InputRequired))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        turn_answer(answer, task_id, State::InputRequired)
    }

    /// A call answered at once whose agent asked for more input: stored as a
    /// task under `task_id` that ran once and now waits in `input_required`
    /// (never queued for that first turn), so that a message can continue it.
    /// A repeated request id names the task stored then.
    pub async fn record_paused(
        &self,
        task: NewTask,
        task_id: &str,
        question: &Turn,
    ) -> Result<Submitted, TaskStoreError> {
        let queue = self.queue_key(lane_of(task_id), &task.capability, task.priority);
        let held = NewTask { hold: true, ..task };
        let submitted = self.submit_within(held, task_id, None).await?;
        if let Submitted::Created(id) = &submitted {
            match self.transition(id, State::Running).await {
                Ok(_) => {
                    self.pause_in(id, &queue, "", question).await?;
                }
                // Kept already: this very call run again (a retried write).
                Err(TaskStoreError::Refused { current, .. }) if current == State::InputRequired.as_str() => {}
                Err(error) => return Err(error),
            }
        }
        Ok(submitted)
    }

    /// A message continues a task waiting for input: `answer` (the caller's
    /// turn) recorded, the task queued again for its next delivery. One that
    /// does not wait for input is `Refused` with its state.
    pub async fn resume(&self, task_id: &str, answer: &Turn) -> Result<State, TaskStoreError> {
        let task = self.get(task_id).await?;
        // The task's own id: `task_id` may be an alias of it.
        let task_id = task.task_id.as_str();
        let line = serde_json::to_string(answer).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let lane = lane_of(task_id);
        let field = format!("{}|{}", task.capability, task.priority.as_str());
        let mut connection = self.connection().await?;
        let reply: Vec<String> = self
            .scripts
            .resume
            .key(self.task_key(task_id))
            .key(self.queue_of(&task))
            .key(self.queues_key(lane))
            .key(self.backlog_key(lane))
            .arg(now_ms())
            .arg(line)
            .arg(&field)
            .arg(GROUP)
            .arg(task_id)
            .arg(state_args(State::Pending))
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let previous = turn_answer(reply, task_id, State::Pending)?;
        self.note_queued(lane, &field);
        Ok(previous)
    }

    /// Creates or replaces the A2A push config `config` (its id in
    /// `config.a2a`) of task `task_id`, whatever its state; a task holds at
    /// most [`MOST_PUSH_CONFIGS`] (`Refused` beyond).
    pub async fn put_push_config(&self, task_id: &str, config: &Callback) -> Result<(), TaskStoreError> {
        let id = config.a2a.as_ref().map(|push| push.id.as_str()).unwrap_or_default();
        let record = serde_json::to_string(config).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let mut connection = self.connection().await?;
        let answer: Vec<String> = self
            .scripts
            .put_push
            .key(self.task_key(task_id))
            .arg(format!("{PUSH_FIELD}{id}"))
            .arg(record)
            .arg(MOST_PUSH_CONFIGS)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        match answer.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
            Some("full") => Err(TaskStoreError::Refused {
                current: format!("holding {MOST_PUSH_CONFIGS} push configs"),
                wanted: "given another".to_string(),
            }),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
    }

    /// Deletes task `task_id`'s push config `id`; `false` when it had none of that id.
    pub async fn delete_push_config(&self, task_id: &str, id: &str) -> Result<bool, TaskStoreError> {
        let mut connection = self.connection().await?;
        let deleted: i64 = connection
            .hdel(self.task_key(task_id), format!("{PUSH_FIELD}{id}"))
            .await
            .map_err(unavailable)?;
        Ok(deleted > 0)
    }
}

fn turn_answer(answer: Vec<String>, task_id: &str, wanted: State) -> Result<State, TaskStoreError> {
    match answer.first().map(String::as_str) {
        Some("ok") => answer
            .get(1)
            .and_then(|state| State::parse(state))
            .ok_or_else(|| TaskStoreError::Corrupt(format!("task {task_id} has an unknown state"))),
        Some("refused") => Err(TaskStoreError::Refused {
            current: answer.get(1).cloned().unwrap_or_default(),
            wanted: wanted.as_str().to_string(),
        }),
        Some("missing") => Err(TaskStoreError::NotFound(task_id.to_string())),
        other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
    }
}
