//! The task API: `POST /v1/tasks` (the invoke envelope plus `callback`),
//! `GET /v1/tasks/{id}`, `POST /v1/tasks/{id}/cancel`,
//! `GET /v1/tasks/{id}/events` (server-sent events),
//! `GET /v1/sessions/{id}/results?after=CURSOR&limit=N`, and the asynchronous
//! `/v1/broadcast?async=true` (a parent task and a child per routable
//! instance). Failures answer the router's one shape, the failed result
//! envelope ([`agent_reach_pipeline::answer`]).

use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::Caller;
use agent_reach_task_store::{Callback, NewTask, Priority, State, Submitted, TaskStoreError};
use axum::body::Body;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::buffer::{Buffered, TaskBuffer};
use super::{failed_envelope, store_error, TaskService};
use agent_reach_serving::RequestBody;

use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::call::prelude::{self, Refusal};
use agent_reach_pipeline::call::{Call, Door};
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;

/// What the task routes share: the router (authentication, admission, the
/// snapshot) and the slow path, when this router has one.
#[derive(Clone)]
pub struct TaskApi {
    pub(super) service: Arc<RouterService>,
    tasks: Option<Arc<TaskService>>,
}

impl TaskApi {
    pub fn new(service: Arc<RouterService>, tasks: Option<Arc<TaskService>>) -> Self {
        Self { service, tasks }
    }

    pub(super) fn enabled(&self) -> Result<&Arc<TaskService>, RouterError> {
        self.tasks.as_ref().ok_or_else(|| {
            RouterError::new(
                Code::TasksDisabled,
                "asynchronous tasks are not enabled on this router (start it with --redis URL)",
            )
        })
    }
}

/// Public view of a task; a multi-turn task's conversation after its first
/// message as `turns` (the agent's questions and the caller's answers).
pub fn view(task: &agent_reach_task_store::Task) -> Value {
    let mut view = json!({
        "task_id": task.task_id,
        "request_id": task.request_id,
        "session_id": task.session_id,
        "capability": task.capability,
        "priority": task.priority.as_str(),
        "status": task.state.as_str(),
        "attempts": task.attempts,
        "created_at": task.created_at_ms,
        "updated_at": task.updated_at_ms,
        "transitions": task.transitions.iter().map(|transition| json!({
            "status": transition.state.as_str(), "at": transition.at_ms
        })).collect::<Vec<_>>(),
        "result": task.result,
    });
    if !task.turns.is_empty() {
        view["turns"] = json!(task.turns);
    }
    view
}

/// The task `task_id` of an authenticated caller allowed to see it: the common
/// start of the status, cancel and events handlers.
async fn owned_task<'a>(
    api: &'a TaskApi,
    identified: Identified,
    task_id: &str,
) -> Result<(&'a Arc<TaskService>, agent_reach_task_store::Task), RouterError> {
    let tasks = api.enabled()?;
    let caller = identified.caller?;
    let task = tasks.store.get(task_id).await.map_err(store_error)?;
    owner_check(&caller, &task)?;
    Ok((tasks, task))
}

pub(super) fn owner_check(caller: &Caller, task: &agent_reach_task_store::Task) -> Result<(), RouterError> {
    match caller {
        Caller::Agent { name, .. } if **name != *task.caller => Err(RouterError::new(
            Code::TaskNotFound,
            format!("no task `{}` for caller `{name}`", task.task_id),
        )),
        _ => Ok(()),
    }
}

#[tracing::instrument(name = "tasks.submit", skip_all)]
pub(super) async fn submit(
    AxumState(api): AxumState<TaskApi>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match try_submit(&api, identified, &headers, body).await {
        Ok(response) => response,
        Err(refusal) => refusal.answer().into_response(),
    }
}

/// A parsed and checked task request: the invoke envelope plus `callback`.
struct TaskRequest {
    call: Call,
    callback: Option<Callback>,
    priority: Priority,
    envelope: Value,
}

impl TaskRequest {
    fn new_task(&self) -> NewTask {
        NewTask {
            request_id: self.call.request_id().to_string(),
            session_id: self.call.checked.request.session_id.clone(),
            caller: self.call.caller.name().unwrap_or("anonymous").to_string(),
            capability: self.call.checked.request.capability.clone(),
            priority: self.priority,
            envelope: self.envelope.clone(),
            callback: self.callback.clone(),
            ..NewTask::default()
        }
    }

    /// A refusal of this request after its envelope was read.
    fn refusal(&self, error: RouterError) -> Refusal {
        Refusal {
            known: self.call.known(),
            failure: error.into(),
        }
    }
}

/// The callback of a submission, in the router's form (`{url, secret_ref?}`,
/// or the seeds' `{type: "http", url}`).
fn callback_of(raw: Value) -> Result<Callback, RouterError> {
    let mut raw = raw;
    // A2A's push config fields are set through A2A only.
    if raw.get("a2a").is_some() {
        return Err(RouterError::field(
            Code::InvalidCallback,
            "callback.a2a",
            "`callback`: unknown field `a2a` (expected {url, secret_ref?})",
        ));
    }
    // The seeds' form `{type: "http", url}`: `http` is the only kind there is.
    if let Some(kind) = raw.as_object_mut().and_then(|object| object.remove("type")) {
        if kind != json!("http") {
            return Err(RouterError::field(
                Code::InvalidCallback,
                "callback.type",
                format!("callback type {kind} is not supported (only \"http\")"),
            ));
        }
    }
    serde_json::from_value::<Callback>(raw).map_err(|error| {
        RouterError::field(
            Code::InvalidCallback,
            "callback",
            format!("`callback`: {error} (expected {{url, secret_ref?}})"),
        )
    })
}

/// The envelope doors' prelude, then what a submission adds: its callback,
/// and the checks made when it is submitted (the caller may call the
/// capability; its limits); the rest of admission (capability, version,
/// schema, deadline) runs when the task is delivered.
async fn read_task_request(
    service: &RouterService,
    tasks: &TaskService,
    (identified, headers): (Identified, &HeaderMap),
    body: Body,
) -> Result<TaskRequest, Refusal> {
    let prelude::Envelope { mut call, callback } =
        prelude::envelope(service, identified, headers, RequestBody::Unread(body), Door::Tasks).await?;
    // The stored envelope carries the id the task is known by.
    let request_id = call.request_id().to_string();
    call.checked.request.request_id = Some(request_id);
    let mut request = TaskRequest {
        call,
        callback: None,
        priority: Priority::default(),
        envelope: Value::Null,
    };
    let checks = async {
        request.callback = callback.map(callback_of).transpose()?;
        let call = &request.call;
        service
            .admission()
            .authorize(&call.caller, &call.checked.request.capability)?;
        service.admission().limit_submission(&call.caller)?;
        if let Some(callback) = &request.callback {
            tasks.deliverer.check(callback).await.map_err(|error| {
                RouterError::new(Code::InvalidCallback, error.to_string())
                    .with_details(json!({ "reason": error.code() }))
            })?;
        }
        request.priority = call.checked.request.priority.unwrap_or_default();
        request.envelope = serde_json::to_value(&call.checked.request)
            .map_err(|error| RouterError::new(Code::InvalidEnvelope, error.to_string()))?;
        Ok::<_, RouterError>(())
    };
    match checks.await {
        Ok(()) => Ok(request),
        Err(error) => Err(request.refusal(error)),
    }
}

async fn try_submit(
    api: &TaskApi,
    identified: Identified,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let tasks = api.enabled().map_err(|error| Refusal::fresh(error, &identified))?;
    let request = read_task_request(&api.service, tasks, (identified, headers), body).await?;
    let bound = api.service.admission().quota().and_then(|quota| quota.task_backlog());
    let put = put(tasks, request.new_task(), request.priority, bound)
        .await
        .map_err(|error| request.refusal(error))?;
    Ok(match put {
        Put::Created(task_id) => (
            StatusCode::ACCEPTED,
            Json(json!({ "task_id": task_id, "status": "pending" })),
        )
            .into_response(),
        Put::Existing(task_id) => {
            let task = tasks
                .store
                .get(&task_id)
                .await
                .map_err(|error| request.refusal(store_error(error)))?;
            (
                StatusCode::OK,
                Json(json!({ "task_id": task_id, "status": task.state.as_str(), "duplicate": true })),
            )
                .into_response()
        }
        Put::BufferedExisting(task_id) => (
            StatusCode::OK,
            Json(json!({ "task_id": task_id, "status": "pending", "duplicate": true })),
        )
            .into_response(),
    })
}

/// Where a submission went.
pub(super) enum Put {
    /// Stored (in Redis, or in the local buffer while Redis is unreachable).
    Created(String),
    /// The caller's request id was seen before: the task submitted then.
    Existing(String),
    /// The same, still in the local buffer (pending).
    BufferedExisting(String),
}

/// Stores a submission in Redis, or in the local buffer while Redis is
/// unreachable (`--task-buffer-dir`), and counts it.
/// `backlog_bound`: the tenant's task backlog quota (checked in Redis; not
/// while Redis is unreachable and the buffer takes the submission).
pub(super) async fn put(
    tasks: &TaskService,
    task: NewTask,
    priority: Priority,
    backlog_bound: Option<u64>,
) -> Result<Put, RouterError> {
    // One id whichever way the submission goes. A write that timed out, or that no
    // replica acknowledged (WAIT), may be in Redis already under this id: the
    // buffer's replay must find it there under the same one. Under a fresh id the
    // replay found the request id taken and dropped its copy, and the id the caller
    // was given answered 404 for ever (docs/chaos.md, router/tests/task_buffer.rs).
    // In its capability's lane: a capability's tasks share a Redis Cluster slot (§3.10.9).
    let task_id = tasks.store.task_id_for(&task.capability);
    let submitted = match &tasks.buffer {
        // Behind what waits in the buffer: order holds, a resubmission finds its first copy.
        Some(buffer) if !buffer.is_empty() => return buffered(tasks, buffer, task_id, task, priority).await,
        Some(buffer) => match tasks.store.submit_within(task.clone(), &task_id, backlog_bound).await {
            Err(TaskStoreError::Unavailable(why)) => {
                tracing::warn!(message = "Task store unreachable; keeping the submission in the local buffer.", error = %why);
                return buffered(tasks, buffer, task_id, task, priority).await;
            }
            other => other.map_err(|error| submit_error(tasks, error))?,
        },
        None => tasks
            .store
            .submit_within(task, &task_id, backlog_bound)
            .await
            .map_err(|error| submit_error(tasks, error))?,
    };
    Ok(match submitted {
        Submitted::Created(task_id) => {
            tasks.metrics.submitted.with_label_values(&[priority.as_str()]).inc();
            Put::Created(task_id)
        }
        Submitted::Existing(task_id) => Put::Existing(task_id),
    })
}

/// A submission's store error; over the tenant's backlog quota, 429 naming the tenant.
fn submit_error(tasks: &TaskService, error: TaskStoreError) -> RouterError {
    match error {
        TaskStoreError::BacklogFull { waiting, bound } => RouterError::new(
            Code::RateLimited,
            format!(
                "tenant `{}` has {waiting} tasks waiting, its task backlog quota is {bound} (the tenant map); \
                 retry once some have been delivered",
                tasks.store.tenant()
            ),
        )
        .with_details(json!({
            "tenant": tasks.store.tenant(),
            "limit": "task_backlog",
            "waiting": waiting,
            "bound": bound,
            "retry_after_s": 1,
        })),
        other => store_error(other),
    }
}

/// Keeps a submission in the local buffer, or refuses it with 503
/// `TASK_BUFFER_FULL`.
async fn buffered(
    tasks: &TaskService,
    buffer: &Arc<TaskBuffer>,
    task_id: String,
    task: NewTask,
    priority: Priority,
) -> Result<Put, RouterError> {
    match buffer.push(task_id, task).await {
        Ok(Buffered::Created(task_id)) => {
            tasks.metrics.submitted.with_label_values(&[priority.as_str()]).inc();
            Ok(Put::Created(task_id))
        }
        Ok(Buffered::Existing(task_id)) => Ok(Put::BufferedExisting(task_id)),
        Err(error) => Err(RouterError::new(
            Code::TaskBufferFull,
            format!("the task store (Redis) is unreachable and {error}; retry shortly"),
        )),
    }
}

/// `POST /v1/broadcast?async=true`: a parent task (stored, not queued) and a
/// child task per routable instance, each delivered to its instance only;
/// the parent ends when every child has, with every outcome as its output.
#[tracing::instrument(name = "tasks.broadcast", skip_all)]
pub async fn submit_broadcast(api: &TaskApi, identified: Identified, headers: &HeaderMap, body: Body) -> Response {
    match try_submit_broadcast(api, identified, headers, body).await {
        Ok(response) => response,
        Err(refusal) => refusal.answer().into_response(),
    }
}

async fn try_submit_broadcast(
    api: &TaskApi,
    identified: Identified,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let tasks = api.enabled().map_err(|error| Refusal::fresh(error, &identified))?;
    let service = &api.service;
    let request = read_task_request(service, tasks, (identified, headers), body).await?;
    broadcast_children(api, tasks, &request)
        .await
        .map_err(|error| request.refusal(error))
}

/// The parent and its children of an admitted asynchronous broadcast.
async fn broadcast_children(
    api: &TaskApi,
    tasks: &TaskService,
    request: &TaskRequest,
) -> Result<Response, RouterError> {
    let (capability, targets) = api.service.broadcast_targets(&request.call)?;
    if targets.is_empty() {
        return Err(RouterError::new(
            Code::NoAvailableInstance,
            format!("no routable instance of `{capability}` to broadcast to"),
        ));
    }
    let call = &request.call;
    let parent = tasks
        .store
        .submit(NewTask {
            children: targets.clone(),
            hold: true,
            ..request.new_task()
        })
        .await
        .map_err(store_error)?;
    let parent_id = parent.task_id().to_string();
    // The parent runs while its children do, from before the first child can end
    // (a resubmission finds it running or ended: the refusal is expected).
    let _ = tasks.store.transition(&parent_id, State::Running).await;
    // Children are idempotent too: a resubmission after a crash completes the set.
    let parent_task = tasks.store.get(&parent_id).await.map_err(store_error)?;
    let mut children = Vec::new();
    for agent_id in &parent_task.children {
        let child_request_id = format!("{}@{agent_id}", call.request_id());
        let mut envelope = request.envelope.clone();
        envelope["request_id"] = json!(child_request_id);
        let child = tasks
            .store
            .submit(NewTask {
                request_id: child_request_id,
                envelope,
                callback: None,
                target_agent: Some(agent_id.clone()),
                parent: Some(parent_id.clone()),
                ..request.new_task()
            })
            .await
            .map_err(store_error)?;
        children.push(json!({ "agent_id": agent_id, "task_id": child.task_id() }));
    }
    let parent_task = tasks.store.get(&parent_id).await.map_err(store_error)?;
    let status = if matches!(parent, Submitted::Created(_)) {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(json!({ "task_id": parent_id, "status": parent_task.state.as_str(), "children": children })),
    )
        .into_response())
}

/// Ends a broadcast parent once all its children have ended.
#[tracing::instrument(name = "tasks.status", skip_all)]
pub(super) async fn status(
    AxumState(api): AxumState<TaskApi>,
    Path(task_id): Path<String>,
    identified: Identified,
) -> Response {
    let outcome = async {
        // Still in the local buffer (Redis unreachable): pending, as far as anyone can tell.
        let buffered_for = api
            .enabled()?
            .buffer
            .as_ref()
            .and_then(|buffer| buffer.caller_of(&task_id));
        if let Some(owner) = buffered_for {
            let caller = identified.caller.clone()?;
            if !matches!(&caller, Caller::Agent { name, .. } if **name != *owner) {
                let view = json!({ "task_id": task_id, "status": "pending", "buffered": true });
                return Ok(Json(view).into_response());
            }
        }
        let (_, task) = owned_task(&api, identified, &task_id).await?;
        Ok::<_, RouterError>(Json(view(&task)).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[tracing::instrument(name = "tasks.cancel", skip_all)]
pub(super) async fn cancel(
    AxumState(api): AxumState<TaskApi>,
    Path(task_id): Path<String>,
    identified: Identified,
) -> Response {
    let outcome = async {
        let (tasks, task) = owned_task(&api, identified, &task_id).await?;
        // The task's own id: `task_id` may be an alias of it (a buffered submission's).
        let task = cancel_task(tasks, &task).await?;
        Ok::<_, RouterError>(Json(view(&task)).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// Cancels `task` (its result a failed envelope, code `CANCELED`) and reads it back.
pub(super) async fn cancel_task(
    tasks: &TaskService,
    task: &agent_reach_task_store::Task,
) -> Result<agent_reach_task_store::Task, RouterError> {
    let result = failed_envelope(
        task,
        &RouterError::new(Code::Canceled, "the caller canceled the task"),
        task.attempts,
    );
    tasks.store.cancel(&task.task_id, &result).await.map_err(store_error)?;
    tasks.store.get(&task.task_id).await.map_err(store_error)
}

/// How often an events stream looks for a state change.
pub(super) const EVENTS_POLL: Duration = Duration::from_millis(100);

/// `GET /v1/tasks/{id}/events`: server-sent events, one `state` event per
/// state the task enters (with its time), the last carrying the result; the
/// stream ends when the task does.
#[tracing::instrument(name = "tasks.events", skip_all)]
pub(super) async fn events(
    AxumState(api): AxumState<TaskApi>,
    Path(task_id): Path<String>,
    identified: Identified,
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let outcome = async {
        let (tasks, _) = owned_task(&api, identified, &task_id).await?;
        let tasks = tasks.clone();
        // (tasks, id, transitions already sent, finished)
        let stream = futures::stream::unfold((tasks, task_id, 0usize, false), |(tasks, task_id, sent, done)| async move {
            if done {
                return None;
            }
            loop {
                let task = match tasks.store.get(&task_id).await {
                    Ok(task) => task,
                    Err(error) => {
                        let event = Event::default().event("error").data(store_error(error).message);
                        return Some((Ok::<_, std::convert::Infallible>(event), (tasks, task_id, sent, true)));
                    }
                };
                if let Some(transition) = task.transitions.get(sent) {
                    let last = sent + 1 == task.transitions.len() && task.state.is_terminal();
                    let mut data = json!({ "task_id": task.task_id, "status": transition.state.as_str(), "at": transition.at_ms });
                    if last {
                        data["result"] = task.result.clone().unwrap_or(Value::Null);
                    }
                    let event = Event::default().event("state").data(data.to_string());
                    return Some((Ok(event), (tasks, task_id, sent + 1, last)));
                }
                tokio::time::sleep(EVENTS_POLL).await;
            }
        });
        Ok::<_, RouterError>(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// Whether `after` is a session cursor as the router hands them out: a Redis
/// stream id `MS-SEQ`, both decimal u64, and not the last possible one. Checked
/// here because anything else reaches Redis as a malformed `XRANGE` (once
/// answered 503 `TASK_STORE_UNAVAILABLE` for `?after=`).
pub(super) fn is_cursor(after: &str) -> bool {
    let decimal = |part: &str| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit());
    let Some((ms, seq)) = after.split_once('-') else {
        return false;
    };
    if !decimal(ms) || !decimal(seq) {
        return false;
    }
    // An exclusive start past the last id is a Redis error too.
    matches!((ms.parse::<u64>(), seq.parse::<u64>()), (Ok(ms), Ok(seq)) if (ms, seq) != (u64::MAX, u64::MAX))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResultsQuery {
    after: Option<String>,
    limit: Option<usize>,
}

#[tracing::instrument(name = "tasks.session_results", skip_all)]
pub(super) async fn session_results(
    AxumState(api): AxumState<TaskApi>,
    Path(session_id): Path<String>,
    query: Result<Query<ResultsQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
) -> Response {
    let outcome = async {
        let tasks = api.enabled()?;
        let caller = identified.caller?;
        let Query(query) = query.map_err(|rejection| {
            RouterError::new(Code::InvalidQuery, format!("invalid query: {}", rejection.body_text()))
        })?;
        if let Some(after) = query.after.as_deref().filter(|after| !is_cursor(after)) {
            return Err(RouterError::new(
                Code::InvalidQuery,
                format!("invalid query: `after` is `{after}`; pass the `next_after` (or a result's `cursor`) of an earlier answer, e.g. `1700000000000-0`"),
            ));
        }
        let limit = query.limit.unwrap_or(100).clamp(1, 1000);
        let mut results = Vec::new();
        let mut cursor = query.after.clone();
        for entry in tasks
            .store
            .session_results(&session_id, query.after.as_deref(), limit)
            .await
            .map_err(store_error)?
        {
            cursor = Some(entry.cursor.clone());
            // A session's results belong to the callers that submitted them.
            if let (Caller::Agent { name, .. }, Ok(task)) = (&caller, tasks.store.get(&entry.task_id).await) {
                if *task.caller != **name {
                    continue;
                }
            }
            results.push(json!({
                "cursor": entry.cursor, "task_id": entry.task_id, "status": entry.state.as_str(), "result": entry.result
            }));
        }
        Ok::<_, RouterError>(
            Json(json!({ "session_id": session_id, "results": results, "next_after": cursor })).into_response(),
        )
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[cfg(test)]
mod tests {
    use super::is_cursor;

    #[test]
    fn only_stream_ids_are_cursors() {
        for good in [
            "0-0",
            "1700000000000-0",
            "1700000000000-17",
            "18446744073709551615-18446744073709551614",
        ] {
            assert!(is_cursor(good), "{good}");
        }
        for bad in [
            "",
            "0",
            "-",
            "1-",
            "-1",
            "x-1",
            "1-x",
            "+1-0",
            "1-0-0",
            " 1-0",
            "18446744073709551616-0",
            "18446744073709551615-18446744073709551615",
        ] {
            assert!(!is_cursor(bad), "{bad:?}");
        }
    }
}
