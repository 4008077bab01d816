//! The runs' routes (DESIGN §9): `POST /v1/workflows/{name}/runs`, `GET
//! /v1/runs` (the newest runs the caller may see), `GET /v1/runs/{run_id}`,
//! `GET /v1/runs/{run_id}/events` (server-sent events) and `POST
//! /v1/runs/{run_id}/cancel`. A run is seen by the caller that started it,
//! and by operators; for anyone else it is `RUN_NOT_FOUND`. Every refusal is
//! the failed result envelope with its stable code.

use std::collections::HashMap;
use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::call::{Call, Door};
use agent_reach_pipeline::envelope;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use agent_reach_proto::Priority;
use agent_reach_task_store::{Callback, StoredRun};
use agent_reach_tasks::{store_error, TaskApi};
use axum::body::Body;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::{run_error, Engine, Start};
use crate::model::RunSpec;
use crate::plan::Records;

/// The runs' routes' state.
#[derive(Clone)]
pub struct RunApi {
    pub(crate) service: Arc<RouterService>,
    pub(crate) engine: Option<Arc<Engine>>,
    pub(crate) tasks: TaskApi,
}

impl RunApi {
    fn engine(&self) -> Result<&Arc<Engine>, RouterError> {
        self.engine.as_ref().ok_or_else(|| {
            RouterError::new(
                Code::TasksDisabled,
                "workflow runs are not enabled on this router: they run on the slow path (start it with --redis URL)",
            )
        })
    }
}

/// `POST /v1/workflows/{name}/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    #[serde(default)]
    payload: Value,
    request_id: Option<String>,
    session_id: Option<String>,
    context_id: Option<String>,
    priority: Option<Priority>,
    callback: Option<CallbackRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallbackRequest {
    url: String,
    secret_ref: Option<String>,
}

#[tracing::instrument(name = "runs.start", skip_all, fields(workflow = %name))]
pub(crate) async fn start(
    AxumState(api): AxumState<RunApi>,
    Path(name): Path<String>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    try_start(&api, &name, identified, &headers, body)
        .await
        .unwrap_or_else(refused)
}

async fn try_start(
    api: &RunApi,
    name: &str,
    identified: Identified,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, RouterError> {
    let engine = api.engine()?;
    let caller = identified.caller?;
    let bytes = envelope::read_body(headers, body, api.service.tuning().max_body_bytes).await?;
    let request: RunRequest = agent_reach_serving::parse_json(&bytes)?;
    let workflow = api.service.workflow(name).ok_or_else(|| {
        RouterError::new(
            Code::WorkflowNotFound,
            format!("no workflow `{name}` (agent-reach workflows ls)"),
        )
        .with_details(json!({ "workflow": name }))
    })?;
    // The run's call as any door builds one: the envelope's rules (request
    // id, priority), then the workflow's admission (ACL, limits, input schema).
    let invoke = json!({
        "capability": name, "payload": request.payload, "request_id": request.request_id,
        "session_id": request.session_id, "context_id": request.context_id, "priority": request.priority,
    });
    let checked = envelope::check(envelope::parse(invoke.to_string().as_bytes())?)?;
    let call = Call::begin(Door::Tasks, caller.clone(), checked, headers, identified.received);
    api.service.admission().admit_workflow(&call, &workflow)?;
    let callback = match request.callback {
        Some(callback) => {
            let callback = Callback {
                url: callback.url,
                secret_ref: callback.secret_ref,
                a2a: None,
            };
            api.tasks.check_callback(&callback).await?;
            Some(callback)
        }
        None => None,
    };
    let request = &call.checked.request;
    let started = engine
        .start(Start {
            workflow: &workflow,
            caller: &caller,
            input: request.payload.clone(),
            request_id: call.request_id().to_string(),
            session_id: request.session_id.clone(),
            context_id: request.context_id.clone(),
            priority: request.priority.unwrap_or_default(),
            callback,
            trace_id: Some(call.trace.trace_id.to_string()),
        })
        .await?;
    Ok(if started.duplicate {
        (
            StatusCode::OK,
            Json(json!({ "run_id": started.run_id, "status": started.state.as_str(), "duplicate": true })),
        )
            .into_response()
    } else {
        (
            StatusCode::ACCEPTED,
            Json(json!({ "run_id": started.run_id, "status": started.state.as_str() })),
        )
            .into_response()
    })
}

/// Who reads runs: the bearer token's caller, or an operator's console
/// session (the console's runs page, DESIGN §3.12).
fn reader(api: &RunApi, identified: &Identified, headers: &HeaderMap) -> Result<Caller, RouterError> {
    match (&identified.caller, &identified.session) {
        (Err(_), Some(_)) => {
            Ok(agent_reach_pipeline::call::identify::operator(api.service.admission(), identified, headers)?.caller)
        }
        (caller, _) => caller.clone(),
    }
}

/// The run `run_id` if `caller` started it or is an operator; `RUN_NOT_FOUND` otherwise.
async fn owned_run(api: &RunApi, caller: &Caller, run_id: &str) -> Result<(StoredRun, RunSpec), RouterError> {
    let engine = api.engine()?;
    let stored = engine.store().run(run_id).await.map_err(run_error)?;
    let spec: RunSpec = serde_json::from_str(&stored.spec)
        .map_err(|error| RouterError::new(Code::Internal, format!("corrupt run record: {error}")))?;
    if may_see(api, caller, &spec) {
        return Ok((stored, spec));
    }
    Err(RouterError::new(
        Code::RunNotFound,
        format!("no run `{run_id}` for caller `{}`", caller.name().unwrap_or("")),
    ))
}

fn may_see(api: &RunApi, caller: &Caller, spec: &RunSpec) -> bool {
    match caller {
        Caller::Agent { name, .. } => {
            **name == *spec.caller || api.service.admission().authorize_operator(caller).is_ok()
        }
        Caller::Unauthenticated => true,
    }
}

/// A run's whole view, its calls in flight read live.
pub(crate) async fn view_of(engine: &Engine, stored: &StoredRun, spec: &RunSpec) -> Result<Value, RouterError> {
    let workflow = engine.workflow(spec).map_err(|problem| {
        RouterError::new(
            Code::Internal,
            format!("the run's definition does not check: {problem}"),
        )
    })?;
    let records = Records::from_entries(&stored.entries);
    let in_flight = crate::view::in_flight_tasks(&records);
    let live: HashMap<String, agent_reach_task_store::Task> = if in_flight.is_empty() {
        HashMap::new()
    } else {
        engine
            .store()
            .get_many(&in_flight)
            .await
            .map_err(store_error)?
            .into_iter()
            .flatten()
            .map(|task| (task.task_id.clone(), task))
            .collect()
    };
    Ok(crate::view::run_view(stored, spec, &workflow, &records, &live))
}

#[tracing::instrument(name = "runs.status", skip_all, fields(run_id = %run_id))]
pub(crate) async fn status(
    AxumState(api): AxumState<RunApi>,
    Path(run_id): Path<String>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let caller = reader(&api, &identified, &headers)?;
        current_view(&api, &caller, &run_id).await
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// The run's view as stored now, when `caller` may read it.
async fn current_view(api: &RunApi, caller: &Caller, run_id: &str) -> Result<Response, RouterError> {
    let (stored, spec) = owned_run(api, caller, run_id).await?;
    let view = view_of(api.engine()?, &stored, &spec).await?;
    Ok(Json(view).into_response())
}

#[tracing::instrument(name = "runs.cancel", skip_all, fields(run_id = %run_id))]
pub(crate) async fn cancel(
    AxumState(api): AxumState<RunApi>,
    Path(run_id): Path<String>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let caller = reader(&api, &identified, &headers)?;
        owned_run(&api, &caller, &run_id).await?;
        api.engine()?.cancel(&run_id).await?;
        current_view(&api, &caller, &run_id).await
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// `GET /v1/runs/{run_id}/events`: `event: run` with the whole view each time
/// it changes (the first at once), the last when the run ended; then the
/// stream ends. A store failure sends `event: error` with the message.
#[tracing::instrument(name = "runs.events", skip_all, fields(run_id = %run_id))]
pub(crate) async fn events(
    AxumState(api): AxumState<RunApi>,
    Path(run_id): Path<String>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let outcome = async {
        let caller = reader(&api, &identified, &headers)?;
        owned_run(&api, &caller, &run_id).await?;
        let engine = api.engine()?.clone();
        // (engine, run id, the last view sent, ended)
        let stream = futures::stream::unfold(
            (engine, run_id, Value::Null, false),
            |(engine, run_id, last, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let notify = engine.waiter(&run_id);
                    let news = {
                        // Listening before reading: news between the two is not lost.
                        let notified = notify.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        let read = async {
                            let stored = engine.store().run(&run_id).await.map_err(run_error)?;
                            let spec: RunSpec = serde_json::from_str(&stored.spec)
                                .map_err(|error| RouterError::new(Code::Internal, error.to_string()))?;
                            let view = view_of(&engine, &stored, &spec).await?;
                            Ok::<_, RouterError>((stored.state.is_terminal(), view))
                        };
                        match read.await {
                            Ok((_, view)) if view == last => {
                                let _ = tokio::time::timeout(crate::POLL, notified).await;
                                None
                            }
                            other => Some(other),
                        }
                    };
                    engine.release_waiter(&run_id, notify);
                    match news {
                        None => continue,
                        Some(Err(error)) => {
                            let event = Event::default().event("error").data(error.message);
                            return Some((Ok::<_, std::convert::Infallible>(event), (engine, run_id, last, true)));
                        }
                        Some(Ok((ended, view))) => {
                            let event = Event::default().event("run").data(view.to_string());
                            return Some((Ok(event), (engine, run_id, view, ended)));
                        }
                    }
                }
            },
        );
        Ok::<_, RouterError>(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    workflow: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/runs?workflow=&limit=`: the newest runs (of the last
/// [`agent_reach_task_store::store::RECENT_RUNS`] started) the caller may
/// see, newest first, each `{run_id, workflow, version, status, created_at_ms, updated_at_ms}`.
#[tracing::instrument(name = "runs.list", skip_all)]
pub(crate) async fn list(
    AxumState(api): AxumState<RunApi>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let Query(query) = query.map_err(|rejection| {
            RouterError::new(Code::InvalidQuery, format!("invalid query: {}", rejection.body_text()))
        })?;
        let caller = reader(&api, &identified, &headers)?;
        let engine = api.engine()?;
        let limit = query.limit.unwrap_or(50).clamp(1, 200);
        let ids = engine
            .store()
            .recent_runs(agent_reach_task_store::store::RECENT_RUNS as usize)
            .await
            .map_err(store_error)?;
        let mut runs = Vec::new();
        for run_id in ids {
            if runs.len() >= limit {
                break;
            }
            let Ok(stored) = engine.store().run(&run_id).await else {
                continue;
            };
            let Ok(spec) = serde_json::from_str::<RunSpec>(&stored.spec) else {
                continue;
            };
            if !may_see(&api, &caller, &spec) || query.workflow.as_ref().is_some_and(|name| *name != spec.workflow) {
                continue;
            }
            runs.push(json!({
                "run_id": run_id, "workflow": spec.workflow, "version": spec.version, "status": stored.state.as_str(),
                "caller": spec.caller, "created_at_ms": spec.created_at_ms, "updated_at_ms": stored.updated_at_ms,
            }));
        }
        Ok::<_, RouterError>(Json(json!({ "runs": runs })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}
