//! The slow path, beside the fast path (issue 6): durable asynchronous tasks
//! on Redis (`--redis`). [`api`] serves `POST /v1/tasks`, a task's status,
//! cancel and events, a session's results and the asynchronous broadcast;
//! [`worker`] claims queued tasks and delivers each through the router's one
//! admission and attempt loop (`RouterService::invoke` / `broadcast`),
//! bounded by per-tag gates ([`gate`]); [`report`] takes the results of
//! deliveries agents answered `202`; [`callbacks`] sends the signed
//! callbacks the store schedules, and [`dead_letters`] lets operators list
//! and replay the ones that could not be sent; [`protocol`] is what A2A's
//! tasks use of it. It uses the fast path; the fast path never uses it.
//!
//! Durability lives in `agent_reach_task_store`: a task is answered `202` only
//! once stored; its queue entry is acknowledged only when its outcome is
//! recorded; entries of a router that died are reclaimed by another.
//! Without `--redis` the routes answer 501 `TASKS_DISABLED`.

mod api;
mod buffer;
mod callbacks;
mod dead_letters;
mod gate;
mod history;
mod metrics;
mod preempt;
mod protocol;
mod quota;
mod report;
mod settings;
mod timestamps;
mod trail;
mod worker;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use agent_reach_proto::envelope::{ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_task_store::{Deliverer, State, TaskStore, TaskStoreError};
use serde_json::{json, Value};

pub use api::view as task_view;
pub use api::{submit_broadcast, TaskApi};
pub use protocol::{Owned, POLL};
pub use settings::{Switch, TagLimit, TaskArgs, TasksSettings, TrailConfig, TrailOtlp};
pub use timestamps::{parse_rfc3339, rfc3339};
pub use trail::new_chain_id;

use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use gate::TagGate;
use metrics::TaskMetrics;

/// The task routes (every one answers a method it does not take with 405
/// `METHOD_NOT_ALLOWED`; `app` adds the router-wide fallback).
pub fn routes(api: TaskApi) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/tasks",
            axum::routing::post(api::submit).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/tasks/{task_id}",
            axum::routing::get(api::status).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/tasks/{task_id}/cancel",
            axum::routing::post(api::cancel).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/tasks/{task_id}/events",
            axum::routing::get(api::events).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/tasks/{task_id}/result",
            axum::routing::post(report::report).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/dead-letters",
            axum::routing::get(dead_letters::list).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/dead-letters/{id}",
            axum::routing::get(dead_letters::show).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/dead-letters/{id}/replay",
            axum::routing::post(dead_letters::replay).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .route(
            "/v1/sessions/{session_id}/results",
            axum::routing::get(api::session_results).fallback(agent_reach_pipeline::answer::method_not_allowed),
        )
        .with_state(api)
}

/// Accepted tasks awaiting a report, per delivery slot, before they hold slots.
const AWAITING_PER_WORKER: usize = 16;

/// A step's end as [`StepEnded::end_step`] writes it: the step's end, as
/// [`agent_reach_task_store::TaskStore::finish`] answers it.
pub type StepEnding<'a> = futures::future::BoxFuture<'a, Result<State, agent_reach_task_store::TaskStoreError>>;

/// Told when a workflow step's task ended (its outcome recorded), on the
/// router that recorded it, so its run advances at once (the runs crate;
/// a run whose router died is advanced by any router's sweep instead).
pub trait StepEnded: Send + Sync {
    /// `task` (as it was claimed) ended as `state` with the result envelope `result`.
    fn step_ended(&self, task: &agent_reach_task_store::Task, state: State, result: &Value);

    /// Ends `claimed` (a step) as `state` with `result` together with the
    /// advance of its run that its end starts (one script where the store
    /// allows it), answering the step's end as [`agent_reach_task_store::TaskStore::finish`]
    /// does; `None`: not taken here (its run is being advanced on this
    /// router already): the worker ends the task and tells [`Self::step_ended`].
    fn end_step<'a>(
        &'a self,
        _claimed: &'a agent_reach_task_store::Claimed,
        _state: State,
        _result: &'a Value,
    ) -> Option<StepEnding<'a>> {
        None
    }
}

/// The slow path's own state: the store, the callback sender, its settings,
/// metrics and gates. The router's fast path holds none of it.
pub struct TaskService {
    store: TaskStore,
    deliverer: Deliverer,
    settings: TasksSettings,
    metrics: TaskMetrics,
    gates: Vec<(TagLimit, Arc<TagGate>)>,
    /// Claimed tasks waiting at a tag gate; claiming pauses when too many are held in memory.
    gated: AtomicUsize,
    /// Submissions kept locally while Redis is unreachable (`--task-buffer-dir`).
    buffer: Option<Arc<buffer::TaskBuffer>>,
    /// Places for accepted (`202`) tasks awaiting their report outside the
    /// delivery slots; beyond them a task waits in its slot.
    awaiting: Arc<tokio::sync::Semaphore>,
    /// Told of every step of a workflow run that ended here.
    step_ended: std::sync::OnceLock<Arc<dyn StepEnded>>,
    /// The deliveries running here, for preemption (`preempt`).
    deliveries: preempt::Deliveries,
    /// Wakes an idle worker loop: a task was just submitted here (a run's
    /// next step), so claim now rather than at the next idle poll.
    submitted: tokio::sync::Notify,
    /// The trail's series, when the trail is on.
    trail_metrics: Option<agent_reach_trail::TrailMetrics>,
    /// This slow path's trail chain (`trail::new_chain_id`).
    chain: String,
}

impl TaskService {
    /// Says a task was just submitted through this router's store: an idle
    /// worker loop claims at once instead of at its next poll (a run's steps
    /// follow one another without the idle poll's wait between them).
    pub fn submitted(&self) {
        self.submitted.notify_one();
    }

    /// The store (the console's slow-path summary and task lookup read it).
    pub fn store(&self) -> &TaskStore {
        &self.store
    }

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
            gated: AtomicUsize::new(0),
            submitted: tokio::sync::Notify::new(),
            buffer: match &settings.store.local_buffer {
                Some(local) => Some(buffer::TaskBuffer::open(&local.dir, local.limit, registry)?),
                None => None,
            },
            awaiting: Arc::new(tokio::sync::Semaphore::new(
                settings.workers.max(1) * AWAITING_PER_WORKER,
            )),
            step_ended: std::sync::OnceLock::new(),
            deliveries: preempt::Deliveries::default(),
            trail_metrics: match &settings.trail {
                Some(_) => Some(
                    agent_reach_trail::TrailMetrics::new(registry)
                        .map_err(|error| format!("trail metrics: {error}"))?,
                ),
                None => None,
            },
            chain: trail::new_chain_id(),
        })
    }

    /// Installs what is told of workflow steps that ended (once).
    pub fn on_step_end(&self, hook: Arc<dyn StepEnded>) {
        if self.step_ended.set(hook).is_err() {
            tracing::warn!(message = "A step hook was installed twice; the first one stays.");
        }
    }

    /// Ends `claimed`, a workflow's step, with its run's advance (see
    /// [`StepEnded::end_step`]); `None`: the worker ends it alone.
    fn end_step<'a>(
        &'a self,
        claimed: &'a agent_reach_task_store::Claimed,
        state: State,
        result: &'a Value,
    ) -> Option<StepEnding<'a>> {
        claimed.task.run.as_ref()?;
        self.step_ended.get()?.end_step(claimed, state, result)
    }

    /// `task` ended here as `state` with `result`: if it is a workflow's step, its run hears of it.
    fn ended(&self, task: &agent_reach_task_store::Task, state: State, result: &Value) {
        if task.run.is_some() {
            if let Some(hook) = self.step_ended.get() {
                hook.step_ended(task, state, result);
            }
        }
    }

    /// Starts the worker and the callback sender. The worker holds `service`
    /// weakly and both stop once the router is dropped.
    pub fn start(self: &Arc<Self>, service: &Arc<RouterService>) {
        tokio::spawn(callbacks::run(Arc::downgrade(self)));
        buffer::TaskBuffer::spawn_replay(Arc::downgrade(self));
        tokio::spawn(worker::run(Arc::downgrade(service), self.clone()));
        if let Some(every) = self.settings.quota_share {
            service.share_limits(Arc::new(quota::StoreLedger(self.clone())), every);
        }
        // Routers on one Redis learn from each other's calls (issue 38).
        service.share_history(Arc::new(history::StoreHistory(self.clone())));
        if let (Some(trail), Some(metrics)) = (&self.settings.trail, &self.trail_metrics) {
            let logs = trail.otlp.as_ref().and_then(|otlp| {
                trail::TrailLogs::start(otlp, &self.chain, self.store.tenant(), metrics)
                    .map_err(|error| {
                        tracing::error!(message = "Cannot export the trail as OTLP logs; records are kept in Redis only.", %error)
                    })
                    .ok()
            });
            let recorder = agent_reach_trail::Recorder::start(
                Arc::new(trail::StoreTrail {
                    service: self.clone(),
                    logs,
                }),
                Arc::new(agent_reach_trail::AssertionSigner(service.assertions().clone())),
                &self.chain,
                self.store.tenant(),
                trail.settings,
                metrics.clone(),
            );
            service.record_trail(agent_reach_pipeline::trail::TrailHook {
                recorder,
                credentials: trail.credentials.clone(),
            });
        }
    }

    /// The trail's store (this tenant's Redis), when the trail is on.
    pub fn trail_store(self: &Arc<Self>) -> Option<Arc<dyn agent_reach_trail::TrailStore>> {
        self.settings.trail.as_ref().map(|_| {
            Arc::new(trail::StoreTrail {
                service: self.clone(),
                logs: None,
            }) as Arc<dyn agent_reach_trail::TrailStore>
        })
    }

    /// The gate for a capability whose instances all carry a limited tag.
    fn gate_for(&self, service: &RouterService, capability: &str) -> Option<Arc<TagGate>> {
        self.gates.iter().find_map(|(limit, gate)| {
            service
                .all_instances_tagged(capability, (&limit.key, &limit.value))
                .then(|| gate.clone())
        })
    }

    /// Tasks waiting to be delivered, every capability and priority (`GET /v1/tenants`).
    pub async fn backlog_total(&self) -> Result<u64, String> {
        let backlog = self.store.backlog().await.map_err(|error| error.to_string())?;
        Ok(backlog
            .into_iter()
            .map(|(_, count)| u64::try_from(count).unwrap_or(0))
            .sum())
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
}

/// A task store failure as the router answers it (the runs of workflows share it).
pub fn store_error(error: TaskStoreError) -> RouterError {
    match error {
        TaskStoreError::BacklogFull { waiting, bound } => RouterError::new(
            Code::RateLimited,
            format!("{waiting} tasks are waiting, the task backlog quota is {bound}; retry shortly"),
        )
        .with_details(json!({ "limit": "task_backlog", "waiting": waiting, "bound": bound, "retry_after_s": 1 })),
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
        TaskStoreError::NotAwaitingResult { current } => RouterError::new(
            Code::TaskConflict,
            format!(
                "the task is `{current}` and awaits no reported result: only a delivery the agent answered \
                 202 Accepted is reported this way"
            ),
        )
        .with_details(json!({ "reason": "not_accepted", "status": current })),
        TaskStoreError::NotTheAgent { expected, reporter } => RouterError::new(
            Code::Forbidden,
            format!("the task was delivered to agent `{expected}`; `{reporter}` may not report its result"),
        )
        .with_details(json!({ "reason": "not_the_delivery_agent", "caller": reporter })),
        TaskStoreError::ResultConflict { current } => RouterError::new(
            Code::TaskConflict,
            format!(
                "the task is `{current}`: a different result was already reported, or it ended otherwise \
                 (deadline, cancel); a result is accepted once"
            ),
        )
        .with_details(json!({ "reason": "result_conflict", "status": current })),
        TaskStoreError::DeadLetterNotFound(id) => RouterError::new(
            Code::DeadLetterNotFound,
            format!("no dead letter `{id}` (replayed already, or never parked); list them with GET /v1/dead-letters"),
        ),
    }
}

fn failed_envelope(task: &agent_reach_task_store::Task, error: &RouterError, attempts: u32) -> Value {
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
        error: Some(error.envelope_error()),
        budget: None,
    };
    serde_json::to_value(envelope).unwrap_or(Value::Null)
}
