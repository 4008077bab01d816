//! The slow path on the router (issue 6, first part): `POST /v1/tasks`,
//! `GET /v1/tasks/{id}`, `POST /v1/tasks/{id}/cancel`,
//! `GET /v1/sessions/{id}/results?after=CURSOR`, and the worker that delivers
//! queued tasks through the same pipeline as `/v1/invoke` (ACL, schema,
//! selection, retries, breakers) and sends signed callbacks.
//!
//! Durability lives in `agent_reach_tasks`: a task is answered `202` only
//! once stored; its queue entry is acknowledged only when its outcome is
//! recorded; entries of a router that died are reclaimed by another.
//! Enabled by `--redis`; without it these routes answer 501 `TASKS_DISABLED`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_access::Caller;
use agent_reach_proto::envelope::{Priority as EnvelopePriority, ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_tasks::{
    Callback, CallbackConfig, Claimed, Deliverer, NewTask, Priority, State, StoreConfig, Submitted, TaskStore,
    TaskStoreError,
};
use axum::body::Body;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::clock;
use crate::envelope;
use crate::error::{Code, RouterError};
use crate::service::RouterService;
use crate::trace::{self, TraceContext};

/// How the slow path runs.
#[derive(Debug, Clone)]
pub struct TasksSettings {
    pub redis: String,
    pub store: StoreConfig,
    pub callbacks: CallbackConfig,
    /// Tasks delivered at once by this router.
    pub workers: usize,
    /// A claimed task not finished after this long is taken over (its router died).
    pub reclaim_after: Duration,
    /// Deliveries of one task when the capability is unavailable (503-like outcomes).
    pub max_task_attempts: u32,
    /// At most `limit` tasks at once for capabilities whose instances all carry
    /// tag `key: value` (e.g. `class: bulk` → 5); the rest wait, high priority first.
    pub tag_limits: Vec<TagLimit>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagLimit {
    pub key: String,
    pub value: String,
    pub limit: usize,
}

impl TagLimit {
    /// Parses `KEY=VALUE:LIMIT`, e.g. `class=bulk:5`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = || format!("`{text}` is not KEY=VALUE:LIMIT (e.g. class=bulk:5)");
        let (tag, limit) = text.rsplit_once(':').ok_or_else(invalid)?;
        let (key, value) = tag.split_once('=').ok_or_else(invalid)?;
        let limit: usize = limit.parse().map_err(|_| invalid())?;
        if key.is_empty() || value.is_empty() || limit == 0 {
            return Err(invalid());
        }
        Ok(Self {
            key: key.to_string(),
            value: value.to_string(),
            limit,
        })
    }
}

// === Per-tag gates ===

/// Bounds concurrent deliveries for one tag; waiters are served high
/// priority first, then in arrival order, so queued low-priority work is
/// overtaken but still runs.
struct TagGate {
    limit: usize,
    state: std::sync::Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    in_use: usize,
    sequence: u64,
    waiting: std::collections::BinaryHeap<Waiter>,
}

struct Waiter {
    rank: (u8, std::cmp::Reverse<u64>),
    wake: tokio::sync::oneshot::Sender<()>,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

fn urgency(priority: Priority) -> u8 {
    match priority {
        Priority::High => 2,
        Priority::Normal => 1,
        Priority::Low => 0,
    }
}

/// Holds one of a gate's places; gives it to the next waiter when dropped.
struct GatePass(Arc<TagGate>);

impl Drop for GatePass {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl TagGate {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            state: std::sync::Mutex::new(GateState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Every update completes before the guard drops; a poisoned lock holds consistent counts.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn enter(self: &Arc<Self>, priority: Priority) -> GatePass {
        let waiting = {
            let mut state = self.lock();
            if state.in_use < self.limit {
                state.in_use += 1;
                None
            } else {
                let (wake, woken) = tokio::sync::oneshot::channel();
                state.sequence += 1;
                let rank = (urgency(priority), std::cmp::Reverse(state.sequence));
                state.waiting.push(Waiter { rank, wake });
                Some(woken)
            }
        };
        if let Some(woken) = waiting {
            // The place is handed over by `release`; the sender is never dropped unsent
            // while the gate lives, and the gate outlives its passes.
            let _ = woken.await;
        }
        GatePass(self.clone())
    }

    fn release(&self) {
        let mut state = self.lock();
        while let Some(next) = state.waiting.pop() {
            // Hand the place over directly; a waiter that went away passes it on.
            if next.wake.send(()).is_ok() {
                return;
            }
        }
        state.in_use = state.in_use.saturating_sub(1);
    }
}

pub struct Tasks {
    store: TaskStore,
    deliverer: Deliverer,
    settings: TasksSettings,
    metrics: TaskMetrics,
    gates: Vec<(TagLimit, Arc<TagGate>)>,
    /// Claimed tasks waiting at a tag gate; claiming pauses when too many are held in memory.
    gated: std::sync::atomic::AtomicUsize,
}

/// `agent_reach_tasks_*`, registered only on routers with the slow path on.
struct TaskMetrics {
    submitted: prometheus::IntCounterVec,
    finished: prometheus::IntCounterVec,
    backlog: prometheus::IntGaugeVec,
    dead_letters: prometheus::IntGauge,
    callback_failures: prometheus::IntCounter,
    state_seconds: prometheus::HistogramVec,
}

impl TaskMetrics {
    fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
        let submitted = IntCounterVec::new(
            Opts::new(
                "agent_reach_tasks_submitted_total",
                "Tasks accepted (stored), by priority.",
            ),
            &["priority"],
        )?;
        let finished = IntCounterVec::new(
            Opts::new(
                "agent_reach_tasks_finished_total",
                "Tasks ended by this router, by outcome.",
            ),
            &["outcome"],
        )?;
        let backlog = IntGaugeVec::new(
            Opts::new(
                "agent_reach_tasks_backlog",
                "Tasks waiting to be delivered, by capability and priority (the earliest sign of a slowing agent).",
            ),
            &["capability", "priority"],
        )?;
        let dead_letters = IntGauge::new(
            "agent_reach_tasks_dead_letters",
            "Callbacks parked in the dead-letter stream.",
        )?;
        let callback_failures = IntCounter::new(
            "agent_reach_tasks_callback_failures_total",
            "Callback attempts that failed (each is retried on the schedule, then dead-lettered).",
        )?;
        let state_seconds = HistogramVec::new(
            HistogramOpts::new(
                "agent_reach_tasks_state_seconds",
                "Time tasks spent in a state before leaving it.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0]),
            &["state"],
        )?;
        registry.register(Box::new(submitted.clone()))?;
        registry.register(Box::new(finished.clone()))?;
        registry.register(Box::new(backlog.clone()))?;
        registry.register(Box::new(dead_letters.clone()))?;
        registry.register(Box::new(callback_failures.clone()))?;
        registry.register(Box::new(state_seconds.clone()))?;
        Ok(Self {
            submitted,
            finished,
            backlog,
            dead_letters,
            callback_failures,
            state_seconds,
        })
    }
}

impl Tasks {
    pub fn new(settings: &TasksSettings, registry: &prometheus::Registry) -> Result<Self, String> {
        Ok(Self {
            store: TaskStore::new(&settings.redis, &settings.store)?,
            deliverer: Deliverer::new(settings.callbacks.clone())?,
            settings: settings.clone(),
            metrics: TaskMetrics::register(registry).map_err(|error| format!("task metrics: {error}"))?,
            gates: settings
                .tag_limits
                .iter()
                .map(|limit| (limit.clone(), Arc::new(TagGate::new(limit.limit))))
                .collect(),
            gated: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The gate for a capability whose routable instances all carry a limited tag.
    fn gate_for(&self, service: &RouterService, capability: &str) -> Option<Arc<TagGate>> {
        if self.gates.is_empty() {
            return None;
        }
        let snapshot = service.snapshot().load_full();
        let capability = crate::service::resolve_capability(&snapshot, capability).ok()?;
        let instances: Vec<_> = capability
            .versions
            .iter()
            .flat_map(|group| group.instances.iter())
            .collect();
        self.gates.iter().find_map(|(limit, gate)| {
            let tagged = !instances.is_empty()
                && instances
                    .iter()
                    .all(|instance| instance.tags.get(&limit.key).is_some_and(|value| value == &limit.value));
            tagged.then(|| gate.clone())
        })
    }

    /// Refreshes the gauges read from the store (backlog, dead letters).
    async fn refresh_gauges(&self) {
        if let Ok(backlog) = self.store.backlog().await {
            for ((capability, priority), count) in backlog {
                self.metrics
                    .backlog
                    .with_label_values(&[&capability, priority.as_str()])
                    .set(count);
            }
        }
        if let Ok(count) = self.store.dead_letter_count().await {
            self.metrics.dead_letters.set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    pub fn store(&self) -> &TaskStore {
        &self.store
    }
}

fn store_error(error: TaskStoreError) -> RouterError {
    match error {
        TaskStoreError::NotFound(id) => RouterError::new(Code::TaskNotFound, format!("no task `{id}` (or it expired)")),
        TaskStoreError::Refused { current, wanted } => RouterError::new(
            Code::TaskConflict,
            format!("the task is `{current}` and cannot become `{wanted}`"),
        ),
        TaskStoreError::Unavailable(why) => RouterError::new(
            Code::TaskStoreUnavailable,
            format!("the task store (Redis) is unreachable: {why}; retry shortly"),
        ),
        TaskStoreError::Corrupt(why) => {
            RouterError::new(Code::TaskStoreUnavailable, format!("corrupt task record: {why}"))
        }
    }
}

fn error_response(error: RouterError) -> Response {
    (error.status(), Json(json!({ "error": error.to_envelope_error() }))).into_response()
}

fn enabled(service: &RouterService) -> Result<&Arc<Tasks>, RouterError> {
    service.tasks().ok_or_else(|| {
        RouterError::new(
            Code::TasksDisabled,
            "asynchronous tasks are not enabled on this router (start it with --redis URL)",
        )
    })
}

pub fn routes() -> Router<Arc<RouterService>> {
    Router::new()
        .route("/v1/tasks", post(submit))
        .route("/v1/tasks/:task_id", get(status))
        .route("/v1/tasks/:task_id/cancel", post(cancel))
        .route("/v1/tasks/:task_id/events", get(events))
        .route("/v1/sessions/:session_id/results", get(session_results))
}

/// Public view of a task.
fn view(task: &agent_reach_tasks::Task) -> Value {
    json!({
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
    })
}

/// The task `task_id` of an authenticated caller allowed to see it: the common
/// start of the status, cancel and events handlers.
async fn owned_task<'a>(
    service: &'a RouterService,
    headers: &HeaderMap,
    task_id: &str,
) -> Result<(&'a Arc<Tasks>, agent_reach_tasks::Task), RouterError> {
    let tasks = enabled(service)?;
    let caller = service.authenticate(headers)?;
    let task = tasks.store.get(task_id).await.map_err(store_error)?;
    owner_check(&caller, &task)?;
    Ok((tasks, task))
}

fn owner_check(caller: &Caller, task: &agent_reach_tasks::Task) -> Result<(), RouterError> {
    match caller {
        Caller::Agent(name) if **name != *task.caller => Err(RouterError::new(
            Code::TaskNotFound,
            format!("no task `{}` for caller `{name}`", task.task_id),
        )),
        _ => Ok(()),
    }
}

#[tracing::instrument(name = "tasks.submit", skip_all)]
async fn submit(AxumState(service): AxumState<Arc<RouterService>>, headers: HeaderMap, body: Body) -> Response {
    match try_submit(&service, &headers, body).await {
        Ok(response) => response,
        Err(error) => error_response(error),
    }
}

/// A parsed and checked task request: the invoke envelope plus `callback`.
struct TaskRequest {
    caller: Caller,
    checked: envelope::CheckedRequest,
    callback: Option<Callback>,
    request_id: String,
    priority: Priority,
    envelope: Value,
}

impl TaskRequest {
    fn new_task(&self) -> NewTask {
        NewTask {
            request_id: self.request_id.clone(),
            session_id: self.checked.request.session_id.clone(),
            caller: self.caller.name().unwrap_or("anonymous").to_string(),
            capability: self.checked.request.capability.clone(),
            priority: self.priority,
            envelope: self.envelope.clone(),
            callback: self.callback.clone(),
            ..NewTask::default()
        }
    }
}

async fn read_task_request(
    service: &RouterService,
    tasks: &Tasks,
    headers: &HeaderMap,
    body: Body,
) -> Result<TaskRequest, RouterError> {
    let caller = service.authenticate(headers)?;
    let bytes = envelope::read_body(headers, body, service.tuning().max_body_bytes).await?;
    // The task request is the invoke envelope plus `callback`.
    let mut value: Value = serde_json::from_slice(&bytes)
        .map_err(|error| RouterError::new(Code::InvalidEnvelope, format!("the body is not JSON: {error}")))?;
    let callback = match value.as_object_mut().and_then(|object| object.remove("callback")) {
        None | Some(Value::Null) => None,
        Some(raw) => Some(serde_json::from_value::<Callback>(raw).map_err(|error| {
            RouterError::new(
                Code::InvalidCallback,
                format!("`callback`: {error} (expected {{url, secret_ref?}})"),
            )
            .with_details(json!({ "field": "callback" }))
        })?),
    };
    let mut request = envelope::parse(value.to_string().as_bytes())?;
    let request_id = request
        .request_id
        .clone()
        .filter(|id| !id.is_empty() && id.len() <= 128)
        .unwrap_or_else(trace::new_request_id);
    request.request_id = Some(request_id.clone());
    let checked = envelope::check(request)?;
    if let Caller::Agent(name) = &caller {
        if !service.acl_allows(name, &checked.request.capability) {
            return Err(RouterError::new(
                Code::Forbidden,
                format!(
                    "caller `{name}` may not call `{}` (acl.yaml permissions)",
                    checked.request.capability
                ),
            ));
        }
    }
    if let Some(callback) = &callback {
        tasks.deliverer.check(callback).await.map_err(|error| {
            RouterError::new(Code::InvalidCallback, error.to_string()).with_details(json!({ "reason": error.code() }))
        })?;
    }
    let priority = match checked.request.priority.unwrap_or_default() {
        EnvelopePriority::High => Priority::High,
        EnvelopePriority::Normal => Priority::Normal,
        EnvelopePriority::Low => Priority::Low,
    };
    let envelope = serde_json::to_value(&checked.request)
        .map_err(|error| RouterError::new(Code::InvalidEnvelope, error.to_string()))?;
    Ok(TaskRequest {
        caller,
        checked,
        callback,
        request_id,
        priority,
        envelope,
    })
}

async fn try_submit(service: &RouterService, headers: &HeaderMap, body: Body) -> Result<Response, RouterError> {
    let tasks = enabled(service)?;
    let request = read_task_request(service, tasks, headers, body).await?;
    let priority = request.priority;
    let submitted = tasks.store.submit(request.new_task()).await.map_err(store_error)?;
    if matches!(submitted, Submitted::Created(_)) {
        tasks.metrics.submitted.with_label_values(&[priority.as_str()]).inc();
    }
    Ok(match submitted {
        Submitted::Created(task_id) => (
            StatusCode::ACCEPTED,
            Json(json!({ "task_id": task_id, "status": "pending" })),
        )
            .into_response(),
        Submitted::Existing(task_id) => {
            let task = tasks.store.get(&task_id).await.map_err(store_error)?;
            (
                StatusCode::OK,
                Json(json!({ "task_id": task_id, "status": task.state.as_str(), "duplicate": true })),
            )
                .into_response()
        }
    })
}

/// `POST /v1/broadcast?async=true`: a parent task (stored, not queued) and a
/// child task per routable instance, each delivered to its instance only;
/// the parent ends when every child has, with every outcome as its output.
#[tracing::instrument(name = "tasks.broadcast", skip_all)]
pub async fn submit_broadcast(service: &RouterService, headers: &HeaderMap, body: Body) -> Response {
    match try_submit_broadcast(service, headers, body).await {
        Ok(response) => response,
        Err(error) => error_response(error),
    }
}

async fn try_submit_broadcast(
    service: &RouterService,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, RouterError> {
    let tasks = enabled(service)?;
    let request = read_task_request(service, tasks, headers, body).await?;
    let snapshot = service.snapshot().load_full();
    let capability = crate::service::resolve_capability(&snapshot, &request.checked.request.capability)?;
    let group = crate::service::resolve_version(capability, request.checked.version_req.as_ref())?;
    let targets: Vec<String> = group
        .instances
        .iter()
        .filter(|instance| {
            matches!(
                instance.status,
                crate::snapshot::Status::Ready | crate::snapshot::Status::Busy
            )
        })
        .map(|instance| instance.agent_id.clone())
        .collect();
    if targets.is_empty() {
        return Err(RouterError::new(
            Code::NoAvailableInstance,
            format!("no routable instance of `{}` to broadcast to", capability.name),
        ));
    }
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
        let child_request_id = format!("{}@{agent_id}", request.request_id);
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
async fn complete_parent(tasks: &Tasks, parent_id: &str) {
    let Ok(parent) = tasks.store.get(parent_id).await else {
        return;
    };
    if parent.state.is_terminal() {
        return;
    }
    let mut outcomes = Vec::new();
    for agent_id in &parent.children {
        let request_id = format!("{}@{agent_id}", parent.request_id);
        let Ok(Some(child_id)) = tasks.store.find(&parent.caller, &request_id).await else {
            return;
        };
        let Ok(child) = tasks.store.get(&child_id).await else {
            return;
        };
        if !child.state.is_terminal() {
            return; // not all done yet; the last child to end completes the parent
        }
        outcomes.push(json!({
            "agent_id": agent_id, "task_id": child.task_id, "status": child.state.as_str(), "result": child.result
        }));
    }
    let result = json!({
        "version": ENVELOPE_VERSION,
        "request_id": parent.request_id,
        "status": "succeeded",
        "capability": parent.capability,
        "attempts": 1,
        "duration_ms": agent_reach_tasks::store::now_ms().saturating_sub(parent.created_at_ms),
        "output": { "outcomes": outcomes },
    });
    // Two children ending at once may both get here: the second is refused, harmlessly.
    if tasks.store.complete(parent_id, State::Succeeded, &result).await.is_ok() {
        tasks
            .metrics
            .finished
            .with_label_values(&[State::Succeeded.as_str()])
            .inc();
    }
}

#[tracing::instrument(name = "tasks.status", skip_all)]
async fn status(
    AxumState(service): AxumState<Arc<RouterService>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let (_, task) = owned_task(&service, &headers, &task_id).await?;
        Ok::<_, RouterError>(Json(view(&task)).into_response())
    }
    .await;
    outcome.unwrap_or_else(error_response)
}

#[tracing::instrument(name = "tasks.cancel", skip_all)]
async fn cancel(
    AxumState(service): AxumState<Arc<RouterService>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let (tasks, task) = owned_task(&service, &headers, &task_id).await?;
        let result = failed_envelope(
            &task,
            &RouterError::new(Code::Canceled, "the caller canceled the task"),
            task.attempts,
        );
        tasks.store.cancel(&task_id, &result).await.map_err(store_error)?;
        let task = tasks.store.get(&task_id).await.map_err(store_error)?;
        Ok::<_, RouterError>(Json(view(&task)).into_response())
    }
    .await;
    outcome.unwrap_or_else(error_response)
}

/// How often an events stream looks for a state change.
const EVENTS_POLL: Duration = Duration::from_millis(100);

/// `GET /v1/tasks/{id}/events`: server-sent events, one `state` event per
/// state the task enters (with its time), the last carrying the result; the
/// stream ends when the task does.
#[tracing::instrument(name = "tasks.events", skip_all)]
async fn events(
    AxumState(service): AxumState<Arc<RouterService>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let outcome = async {
        let (tasks, _) = owned_task(&service, &headers, &task_id).await?;
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
    outcome.unwrap_or_else(error_response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultsQuery {
    after: Option<String>,
    limit: Option<usize>,
}

#[tracing::instrument(name = "tasks.session_results", skip_all)]
async fn session_results(
    AxumState(service): AxumState<Arc<RouterService>>,
    Path(session_id): Path<String>,
    query: Result<Query<ResultsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let tasks = enabled(&service)?;
        let caller = service.authenticate(&headers)?;
        let Query(query) = query.map_err(|rejection| {
            RouterError::new(
                Code::InvalidEnvelope,
                format!("invalid query: {}", rejection.body_text()),
            )
        })?;
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
            if let (Caller::Agent(name), Ok(task)) = (&caller, tasks.store.get(&entry.task_id).await) {
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
    outcome.unwrap_or_else(error_response)
}

// === Delivery ===

fn failed_envelope(task: &agent_reach_tasks::Task, error: &RouterError, attempts: u32) -> Value {
    let envelope = ResultEnvelope {
        version: ENVELOPE_VERSION.to_string(),
        request_id: task.request_id.clone(),
        status: ResultStatus::Failed,
        capability: Some(task.capability.clone()),
        capability_version: None,
        agent_id: None,
        attempts,
        duration_ms: 0,
        output: None,
        error: Some(error.to_envelope_error()),
    };
    serde_json::to_value(envelope).unwrap_or(Value::Null)
}

/// Claims queued tasks and delivers them, `workers` at a time, until the
/// router is dropped; reclaims tasks of routers that died.
pub async fn run_worker(service: std::sync::Weak<RouterService>, tasks: Arc<Tasks>) {
    let consumer = format!("router-{:016x}", rand::random::<u64>());
    let slots = Arc::new(Semaphore::new(tasks.settings.workers.max(1)));
    let mut round = 0u64;
    let mut last_reclaim = Instant::now();
    let mut last_gauges = Instant::now();
    let mut prepared = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(service) = service.upgrade() else { return };
        // No delivery before the first routing snapshot: a router that just
        // started would otherwise fail tasks for capabilities it cannot see yet.
        if !service.snapshot().is_synced() {
            drop(service);
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if !prepared {
            match tasks.store.prepare().await {
                Ok(()) => prepared = true,
                Err(error) => {
                    tracing::warn!(message = "Task store unavailable; retrying.", %error);
                    drop(service);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        if last_gauges.elapsed() >= Duration::from_secs(2) {
            last_gauges = Instant::now();
            tasks.refresh_gauges().await;
        }
        // Bound what waits in memory at tag gates (it stays durable in Redis meanwhile).
        if tasks.gated.load(std::sync::atomic::Ordering::Acquire) >= tasks.settings.workers.max(1) * 4 {
            drop(service);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let free = slots.available_permits();
        if free == 0 {
            drop(service);
            // Wait for a delivery to finish.
            if let Ok(permit) = slots.clone().acquire_owned().await {
                drop(permit);
            }
            continue;
        }
        let claimed = if last_reclaim.elapsed() >= tasks.settings.reclaim_after / 2 {
            last_reclaim = Instant::now();
            tasks.store.reclaim(&consumer, tasks.settings.reclaim_after, free).await
        } else {
            round += 1;
            tasks.store.claim(&consumer, free, round).await
        };
        match claimed {
            Ok(claimed) if claimed.is_empty() => {
                drop(service);
                // Idle: poll again shortly.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(claimed) => {
                backoff = Duration::from_millis(100);
                for task in claimed {
                    if let Some(gate) = tasks.gate_for(&service, &task.task.capability) {
                        // Limited by its tag's gate, not by the general slots: it waits
                        // (still pending, still in the stream's pending list) without
                        // holding back other capabilities.
                        let (service, tasks) = (service.clone(), tasks.clone());
                        tasks.gated.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                        tokio::spawn(async move {
                            let pass = gate.enter(task.task.priority).await;
                            deliver(&service, &tasks, task).await;
                            drop(pass);
                            tasks.gated.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                        });
                        continue;
                    }
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (service, tasks) = (service.clone(), tasks.clone());
                    tokio::spawn(async move {
                        deliver(&service, &tasks, task).await;
                        drop(permit);
                    });
                }
            }
            Err(error) => {
                tracing::warn!(message = "Claiming tasks failed; retrying.", %error);
                // A Redis that restarted empty has lost the consumer groups too.
                prepared = false;
                drop(service);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// How long a router holds a due callback before another may take it over.
const CALLBACK_LEASE: Duration = Duration::from_secs(60);

/// Sends due callbacks from the durable schedule until the router is dropped:
/// one attempt each, then the next attempt is scheduled (2, 4, 8, 16 s by
/// default) or, after the last, the result goes to the dead-letter stream.
/// Any router may send any callback, so a restart loses none.
pub async fn run_callbacks(tasks: std::sync::Weak<Tasks>) {
    loop {
        let Some(tasks) = tasks.upgrade() else { return };
        let lease_until = agent_reach_tasks::store::now_ms() + CALLBACK_LEASE.as_millis() as u64;
        let due = match tasks.store.claim_due_callbacks(lease_until, 64).await {
            Ok(due) => due,
            Err(error) => {
                tracing::debug!(message = "Cannot read the callback schedule; retrying.", %error);
                drop(tasks);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if due.is_empty() {
            drop(tasks);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let sends = due.into_iter().map(|task_id| {
            let tasks = tasks.clone();
            async move { send_callback(&tasks, &task_id).await }
        });
        futures::future::join_all(sends).await;
    }
}

async fn send_callback(tasks: &Tasks, task_id: &str) {
    match tasks.deliverer.send_due(&tasks.store, task_id).await {
        Ok(
            agent_reach_tasks::CallbackOutcome::Retrying { .. }
            | agent_reach_tasks::CallbackOutcome::DeadLettered { .. },
        ) => {
            tasks.metrics.callback_failures.inc();
        }
        Ok(_) => {}
        // The callback stays scheduled; its lease brings it back.
        Err(error) => tracing::warn!(message = "Callback not sent; it stays scheduled.", task_id, %error),
    }
}

#[tracing::instrument(name = "tasks.deliver", skip_all, fields(task_id = %claimed.task.task_id))]
async fn deliver(service: &RouterService, tasks: &Tasks, claimed: Claimed) {
    let task = &claimed.task;
    let caller = match task.caller.as_str() {
        "anonymous" => Caller::Unauthenticated,
        name => Caller::Agent(name.into()),
    };
    let mut attempts = 0u32;
    let mut running_since_ms;
    let result = loop {
        // A reclaimed task (its router died) or a retried one passes through `retrying`.
        if attempts > 0 || claimed.task.state != State::Pending {
            let _ = tasks.store.transition(&task.task_id, State::Retrying).await;
        }
        running_since_ms = agent_reach_tasks::store::now_ms();
        if let Err(error) = tasks.store.transition(&task.task_id, State::Running).await {
            // Canceled meanwhile: record nothing new, release the queue entry.
            tracing::info!(message = "Task not delivered.", task_id = %task.task_id, %error);
            let _ = tasks.store.finish(&claimed, State::Canceled, &Value::Null).await;
            return;
        }
        attempts += 1;
        let started = Instant::now();
        let outcome = match envelope::parse(task.envelope.to_string().as_bytes()).and_then(envelope::check) {
            Ok(checked) => {
                let trace = TraceContext::from_header(None);
                match &task.target_agent {
                    // A broadcast child: its one instance, or nothing.
                    Some(agent_id) => match service
                        .broadcast(&caller, checked, &task.request_id, &trace, Some(agent_id))
                        .await
                    {
                        Ok(mut outcomes) => outcomes.pop().map(|(_, outcome)| outcome).unwrap_or_else(|| {
                            Err(RouterError::new(Code::NoAvailableInstance, format!("`{agent_id}` is gone")).into())
                        }),
                        Err(failure) => Err(failure),
                    },
                    None => {
                        service
                            .invoke(&caller, &checked, &task.request_id, &trace, clock::Now::read())
                            .await
                    }
                }
            }
            Err(error) => Err(error.into()),
        };
        // Task results are stored as JSON values (rare outputs a value cannot hold fail the task).
        let outcome = outcome.and_then(|success| match success.output_value() {
            Ok(output) => Ok((success, output)),
            Err(error) => Err(crate::service::Failure {
                error,
                capability_version: Some(success.capability_version),
                agent_id: Some(success.agent_id),
                attempts: success.attempts,
            }),
        });
        match outcome {
            Ok((success, output)) => {
                break ResultEnvelope {
                    version: ENVELOPE_VERSION.to_string(),
                    request_id: task.request_id.clone(),
                    status: ResultStatus::Succeeded,
                    capability: Some(task.capability.clone()),
                    capability_version: Some(success.capability_version),
                    agent_id: Some(success.agent_id),
                    attempts: success.attempts,
                    duration_ms: started.elapsed().as_millis() as u64,
                    output: Some(output),
                    error: None,
                }
            }
            Err(failure) => {
                let retry = failure.error.code.is_retryable()
                    && failure.error.code != Code::DeadlineExceeded
                    && attempts < tasks.settings.max_task_attempts;
                if retry {
                    tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempts))).await;
                    continue;
                }
                break ResultEnvelope {
                    version: ENVELOPE_VERSION.to_string(),
                    request_id: task.request_id.clone(),
                    status: ResultStatus::Failed,
                    capability: Some(task.capability.clone()),
                    capability_version: failure.capability_version,
                    agent_id: failure.agent_id,
                    attempts: failure.attempts,
                    duration_ms: started.elapsed().as_millis() as u64,
                    output: None,
                    error: Some(failure.error.to_envelope_error()),
                };
            }
        }
    };
    let state = match result.status {
        ResultStatus::Succeeded => State::Succeeded,
        ResultStatus::Failed => State::Failed,
    };
    let result = serde_json::to_value(&result).unwrap_or(Value::Null);
    match tasks.store.finish(&claimed, state, &result).await {
        Ok(_) => {
            tasks.metrics.finished.with_label_values(&[state.as_str()]).inc();
            if let Some(parent) = &task.parent {
                complete_parent(tasks, parent).await;
            }
        }
        Err(TaskStoreError::Refused { current, .. }) => {
            tracing::info!(message = "Task ended elsewhere; result dropped.", task_id = %task.task_id, state = %current);
            return;
        }
        Err(error) => {
            // Not acknowledged: another router reclaims and delivers it again
            // (agents dedup by request_id).
            tracing::warn!(message = "Recording a task outcome failed; it will be reclaimed.", task_id = %task.task_id, %error);
            return;
        }
    }
    // Time in each state, from what this delivery saw (no extra read).
    let ended_ms = agent_reach_tasks::store::now_ms();
    if let Some(queued) = task.transitions.last() {
        let waited = running_since_ms.saturating_sub(queued.at_ms) as f64 / 1000.0;
        tasks
            .metrics
            .state_seconds
            .with_label_values(&[queued.state.as_str()])
            .observe(waited);
    }
    let ran = ended_ms.saturating_sub(running_since_ms) as f64 / 1000.0;
    tasks
        .metrics
        .state_seconds
        .with_label_values(&[State::Running.as_str()])
        .observe(ran);
    // A callback, if any, was scheduled durably with the outcome; `run_callbacks` sends it.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_limits_parse() {
        assert_eq!(
            TagLimit::parse("class=bulk:5"),
            Ok(TagLimit {
                key: "class".into(),
                value: "bulk".into(),
                limit: 5
            })
        );
        for bad in ["class=bulk", "bulk:5", "class=bulk:0", "=x:1", "class=:2"] {
            assert!(TagLimit::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn gate_admits_up_to_its_limit_then_high_priority_first() {
        let gate = Arc::new(TagGate::new(1));
        let held = gate.enter(Priority::Normal).await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (name, priority) in [
            ("low", Priority::Low),
            ("high", Priority::High),
            ("normal", Priority::Normal),
        ] {
            let (entering, order) = (gate.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _pass = entering.enter(priority).await;
                order.lock().unwrap().push(name);
            }));
            // Let each waiter queue up before the next arrives.
            while gate.lock().waiting.len() < waiting.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for task in waiting {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high", "normal", "low"]);
        assert_eq!(gate.lock().in_use, 0);
    }
}
