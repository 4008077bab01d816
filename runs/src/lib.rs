//! Workflow runs (issue 36, DESIGN §9, docs/design.md §3.14): a registered
//! workflow (the `workflows` crate's language) run durably by the router,
//! each step a task of the slow path (`tasks`, `task-store`), delivered
//! through the one admission and attempt loop as the caller who started
//! the run; and a workflow callable by its name as a capability.
//!
//! - [`plan`]: from a run's records, what comes next (pure);
//! - `engine`: starts runs, records steps' outcomes, advances and ends runs,
//!   sweeps for runs a router left;
//! - `hook`: the pipeline's [`agent_reach_pipeline::Runner`] — a workflow's call;
//! - `api`: the runs' routes; `view`: a run as they show it;
//! - `model`: what a run keeps.
//!
//! The pipeline knows none of this: it finds a workflow by name in its
//! snapshot and hands the call to the runner installed here.

mod api;
mod engine;
mod hook;
mod metrics;
mod model;
pub mod openapi;
pub mod plan;
mod view;

use std::sync::Arc;
use std::time::Duration;

use agent_reach_pipeline::answer::method_not_allowed;
use agent_reach_pipeline::RouterService;
use agent_reach_tasks::{StepEnded, TaskApi, TaskService};

pub use engine::{run_error, Engine, RunSettings, Start, Started};
pub use model::RunSpec;

/// How often a waiter reads a run advanced on another router.
pub const POLL: Duration = Duration::from_millis(250);

/// One router part's runs: the engine over its slow path (none without `--redis`).
#[derive(Clone, Default)]
pub struct Runs {
    engine: Option<Arc<Engine>>,
}

/// The slow path's step hook, holding the engine weakly.
struct Steps(std::sync::Weak<Engine>);

impl StepEnded for Steps {
    fn step_ended(
        &self,
        task: &agent_reach_task_store::Task,
        state: agent_reach_task_store::State,
        result: &serde_json::Value,
    ) {
        if let Some(engine) = self.0.upgrade() {
            engine.step_ended(task, state, result);
        }
    }

    fn end_step<'a>(
        &'a self,
        claimed: &'a agent_reach_task_store::Claimed,
        state: agent_reach_task_store::State,
        result: &'a serde_json::Value,
    ) -> Option<agent_reach_tasks::StepEnding<'a>> {
        self.0.upgrade()?.end_step(claimed, state, result)
    }
}

impl Runs {
    /// The engine over `tasks`, installed as `service`'s workflow runner and
    /// `tasks`' step hook, its sweep started; without a slow path, nothing
    /// (a workflow's call answers `TASKS_DISABLED`).
    pub fn start(
        service: &Arc<RouterService>,
        tasks: Option<&Arc<TaskService>>,
        settings: RunSettings,
        registry: &prometheus::Registry,
    ) -> Result<Self, String> {
        let Some(tasks) = tasks else {
            return Ok(Self::default());
        };
        let engine = Engine::new(tasks.clone(), Arc::downgrade(service), settings, registry)?;
        service.serve_workflows(Arc::new(hook::WorkflowRunner {
            engine: Arc::downgrade(&engine),
        }));
        tasks.on_step_end(Arc::new(Steps(Arc::downgrade(&engine))));
        engine.spawn_sweep();
        Ok(Self { engine: Some(engine) })
    }

    pub fn engine(&self) -> Option<&Arc<Engine>> {
        self.engine.as_ref()
    }
}

/// The runs' routes (every one answers a method it does not take with 405).
pub fn routes(service: Arc<RouterService>, runs: &Runs, tasks: TaskApi) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route(
            "/v1/workflows/{name}/runs",
            post(api::start).fallback(method_not_allowed),
        )
        .route("/v1/runs", get(api::list).fallback(method_not_allowed))
        .route("/v1/runs/{run_id}", get(api::status).fallback(method_not_allowed))
        .route(
            "/v1/runs/{run_id}/events",
            get(api::events).fallback(method_not_allowed),
        )
        .route(
            "/v1/runs/{run_id}/cancel",
            post(api::cancel).fallback(method_not_allowed),
        )
        .with_state(api::RunApi {
            service,
            engine: runs.engine.clone(),
            tasks,
        })
}
