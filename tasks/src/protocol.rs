//! The slow path as the protocol front doors use it: A2A's durable tasks
//! (`SendMessage` that returns at once, `GetTask`, `ListTasks`, `CancelTask`,
//! `SubscribeToTask`) and its push-notification configs, which are the
//! task's signed callback (`agent_reach_a2a`). The same store, owner rule and
//! callback checks as `/v1/tasks`; the protocol's shapes stay in its module.

use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_task_store::{Callback, NewTask, Submitted, Task, TaskStoreError, Turn};
use serde_json::{json, Value};

use super::api::{self, Put};
use super::{store_error, TaskApi};
use agent_reach_pipeline::envelope::CheckedRequest;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use agent_reach_proto::envelope::InvokeRequest;

/// A task the caller may see.
pub enum Owned {
    Stored(Box<Task>),
    /// Still in the router's local buffer (Redis unreachable): pending.
    Buffered(String),
}

impl TaskApi {
    pub fn service(&self) -> &Arc<RouterService> {
        &self.service
    }

    /// Whether this router has the slow path (`--redis`).
    pub fn tasks_enabled(&self) -> bool {
        self.enabled().is_ok()
    }

    /// How long a task is kept once it ended (`--task-retention-s`); `None` without the slow path.
    pub fn retention(&self) -> Option<std::time::Duration> {
        self.enabled().ok().map(|tasks| tasks.settings.store.retention)
    }

    /// How the notifications of push configs set through A2A are written
    /// (the protocol's `StreamResponse`); nothing without the slow path.
    pub fn set_a2a_notifications(&self, body: agent_reach_task_store::NotificationBody) {
        if let Ok(tasks) = self.enabled() {
            // Set once per task service (every tenant's door asks; the first holds).
            let _ = tasks.deliverer.set_a2a_body(body);
        }
    }

    /// Submits an admitted call (its caller already authorised for the
    /// capability) as a durable task, as `POST /v1/tasks` does: the
    /// submission rate limit, the push config's checks, then the store (or
    /// the local buffer). A repeated request id returns the task submitted then.
    pub async fn submit_call(
        &self,
        caller: &Caller,
        checked: &CheckedRequest,
        push_config: Option<Callback>,
    ) -> Result<String, RouterError> {
        let tasks = self.enabled()?;
        self.service.admission().limit_submission(caller)?;
        if let Some(config) = &push_config {
            self.check_callback(config).await?;
        }
        let task = NewTask {
            push_config,
            ..new_task(caller, &checked.request)?
        };
        let priority = task.priority;
        let bound = self.service.admission().quota().and_then(|quota| quota.task_backlog());
        Ok(match api::put(tasks, task, priority, bound).await? {
            Put::Created(task_id) | Put::Existing(task_id) | Put::BufferedExisting(task_id) => task_id,
        })
    }

    /// A fresh task id for `capability`, in its lane (a router without the
    /// slow path gives a request id: such a task is never stored).
    pub fn fresh_task_id(&self, capability: &str) -> String {
        match self.enabled() {
            Ok(tasks) => tasks.store.task_id_for(capability),
            Err(_) => agent_reach_pipeline::trace::new_request_id(),
        }
    }

    /// A call answered at once whose agent asked for more input
    /// (`question`): kept as the task `task_id` waiting in `input_required`,
    /// so that a message can continue it (the slow path delivers the next
    /// turn). Returns the task's id (a repeated request id: the task then).
    pub async fn record_paused(
        &self,
        caller: &Caller,
        request: &InvokeRequest,
        task_id: &str,
        question: &str,
    ) -> Result<String, RouterError> {
        let tasks = self.enabled()?;
        let question = Turn::agent(agent_reach_pipeline::trace::new_request_id(), question);
        let submitted = tasks
            .store
            .record_paused(new_task(caller, request)?, task_id, &question)
            .await
            .map_err(store_error)?;
        Ok(match submitted {
            Submitted::Created(id) | Submitted::Existing(id) => id,
        })
    }

    /// Continues the owned task `task`, waiting for input, with the caller's
    /// next message (`message_id`, its `payload`): recorded as a turn, the
    /// task queued again (the submission rate limit applies, as to a new
    /// task). A task that does not wait for input is `TASK_CONFLICT`.
    pub async fn continue_task(
        &self,
        caller: &Caller,
        task: &Task,
        message_id: &str,
        payload: Value,
    ) -> Result<Task, RouterError> {
        let tasks = self.enabled()?;
        self.service.admission().limit_submission(caller)?;
        let answer = Turn::user(message_id, payload);
        tasks
            .store
            .resume(&task.task_id, &answer)
            .await
            .map_err(|error| match error {
                TaskStoreError::Refused { current, .. } => RouterError::new(
                    Code::TaskConflict,
                    format!(
                        "task `{}` is `{current}`: only a task waiting for input takes another message",
                        task.task_id
                    ),
                ),
                other => store_error(other),
            })?;
        tasks.store.get(&task.task_id).await.map_err(store_error)
    }

    /// A callback's target checked as at submission (an http(s) URL to public
    /// addresses unless `--allow-private-callbacks`).
    pub async fn check_callback(&self, callback: &Callback) -> Result<(), RouterError> {
        let tasks = self.enabled()?;
        tasks.deliverer.check(callback).await.map_err(|error| {
            RouterError::new(Code::InvalidCallback, error.to_string()).with_details(json!({ "reason": error.code() }))
        })
    }

    /// The task `task_id` if `caller` submitted it; `TASK_NOT_FOUND` otherwise.
    pub async fn owned(&self, caller: &Caller, task_id: &str) -> Result<Owned, RouterError> {
        let tasks = self.enabled()?;
        if let Some(owner) = tasks.buffer.as_ref().and_then(|buffer| buffer.caller_of(task_id)) {
            return match caller {
                Caller::Agent { name, .. } if **name != *owner => Err(RouterError::new(
                    Code::TaskNotFound,
                    format!("no task `{task_id}` for caller `{name}`"),
                )),
                _ => Ok(Owned::Buffered(task_id.to_string())),
            };
        }
        let task = tasks.store.get(task_id).await.map_err(store_error)?;
        api::owner_check(caller, &task)?;
        Ok(Owned::Stored(Box::new(task)))
    }

    /// The task as stored now (after [`TaskApi::owned`] checked the caller).
    pub async fn current(&self, task_id: &str) -> Result<Task, RouterError> {
        self.enabled()?.store.get(task_id).await.map_err(store_error)
    }

    /// Cancels an owned task; one that already ended is `TASK_CONFLICT`.
    pub async fn cancel(&self, task: &Task) -> Result<Task, RouterError> {
        api::cancel_task(self.enabled()?, task).await
    }

    /// `caller`'s tasks still kept, newest first (the newest
    /// [`agent_reach_task_store::store::CALLER_INDEX_MAX`] submitted).
    pub async fn list(&self, caller: &Caller) -> Result<Vec<Task>, RouterError> {
        let tasks = self.enabled()?;
        let name = caller.name().unwrap_or("anonymous");
        let ids = tasks.store.caller_tasks(name).await.map_err(store_error)?;
        let found = tasks.store.get_many(&ids).await.map_err(store_error)?;
        Ok(found.into_iter().flatten().collect())
    }

    /// Creates or replaces an owned task's A2A push config (`config.a2a`
    /// names its id), whatever its state; a task holds at most
    /// [`agent_reach_task_store::MOST_PUSH_CONFIGS`] (`TASK_CONFLICT` beyond).
    pub async fn put_push_config(&self, task: &Task, config: &Callback) -> Result<Task, RouterError> {
        let tasks = self.enabled()?;
        self.check_callback(config).await?;
        tasks
            .store
            .put_push_config(&task.task_id, config)
            .await
            .map_err(|error| match error {
                TaskStoreError::Refused { .. } => RouterError::new(
                    Code::TaskConflict,
                    format!(
                        "task `{}` holds {} push notification configs, the most a task may: delete one first",
                        task.task_id,
                        agent_reach_task_store::MOST_PUSH_CONFIGS
                    ),
                ),
                other => store_error(other),
            })?;
        tasks.store.get(&task.task_id).await.map_err(store_error)
    }

    /// Deletes an owned task's push config `id`; `false` when it has none of that id.
    pub async fn delete_push_config(&self, task: &Task, id: &str) -> Result<bool, RouterError> {
        self.enabled()?
            .store
            .delete_push_config(&task.task_id, id)
            .await
            .map_err(store_error)
    }
}

/// The task an admitted call becomes (its envelope as stored, its ids and priority).
fn new_task(caller: &Caller, request: &InvokeRequest) -> Result<NewTask, RouterError> {
    let envelope =
        serde_json::to_value(request).map_err(|error| RouterError::new(Code::InvalidEnvelope, error.to_string()))?;
    Ok(NewTask {
        request_id: request.request_id.clone().unwrap_or_default(),
        session_id: request.session_id.clone(),
        caller: caller.name().unwrap_or("anonymous").to_string(),
        capability: request.capability.clone(),
        priority: request.priority.unwrap_or_default(),
        envelope,
        ..NewTask::default()
    })
}

/// How often a subscription looks for a change of state.
pub const POLL: std::time::Duration = api::EVENTS_POLL;
