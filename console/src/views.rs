//! The console's reads, for operators: this router's routing view
//! (`GET /v1/routing/instances`, `GET /v1/routing/capabilities`, what
//! `adaptive` learned: `GET /v1/routing/changes` and
//! `GET /v1/routing/history`), its recent
//! calls (`GET /v1/requests`, `GET /v1/requests/{request_id}`) and the slow
//! path (`GET /v1/backlog`). Each reads the snapshot, the recent-calls ring
//! or the task store when asked; nothing here runs on the request path.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{operator, ConsoleState};
use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::recent::Call;

fn invalid_query(rejection: axum::extract::rejection::QueryRejection) -> RouterError {
    RouterError::new(Code::InvalidQuery, format!("invalid query: {}", rejection.body_text()))
}

/// `GET /v1/routing/instances`: every instance in this router's snapshot,
/// by capability and version, with its live state.
pub async fn instances(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    if let Err(error) = operator(state.service.admission(), &identified, &headers) {
        return refused(error);
    }
    Json(agent_reach_pipeline::views::instances(&state.service)).into_response()
}

/// `GET /v1/routing/capabilities`: every capability's versions, split and recent statistics.
pub async fn capabilities(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    if let Err(error) = operator(state.service.admission(), &identified, &headers) {
        return refused(error);
    }
    Json(agent_reach_pipeline::views::capabilities(&state.service)).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangesQuery {
    limit: Option<usize>,
    capability: Option<String>,
}

/// `GET /v1/routing/changes?capability=C&limit=N`: `adaptive`'s recent
/// weight changes with their reasons, newest first.
pub async fn weight_changes(
    State(state): State<ConsoleState>,
    query: Result<Query<ChangesQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = (|| {
        operator(state.service.admission(), &identified, &headers)?;
        let Query(query) = query.map_err(invalid_query)?;
        let limit = query.limit.unwrap_or(50).clamp(1, 1000);
        Ok::<_, RouterError>(
            Json(agent_reach_pipeline::views::weight_changes(
                &state.service,
                query.capability.as_deref(),
                limit,
            ))
            .into_response(),
        )
    })();
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    capability: Option<String>,
}

/// `GET /v1/routing/history?capability=C`: each instance's outcome history
/// (hourly buckets of the last week) and what it predicts now.
pub async fn history(
    State(state): State<ConsoleState>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = (|| {
        operator(state.service.admission(), &identified, &headers)?;
        let Query(query) = query.map_err(invalid_query)?;
        let Some(capability) = query.capability else {
            return Err(RouterError::field(
                Code::InvalidQuery,
                "capability",
                "name the capability: GET /v1/routing/history?capability=NAME",
            ));
        };
        let view = agent_reach_pipeline::views::history(&state.service, &capability).ok_or_else(|| {
            RouterError::new(
                Code::CapabilityNotFound,
                format!("no instance of `{capability}` is in this router's snapshot"),
            )
        })?;
        Ok::<_, RouterError>(Json(view).into_response())
    })();
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecentQuery {
    limit: Option<usize>,
    /// `failed`: failed calls only.
    outcome: Option<String>,
    capability: Option<String>,
}

/// `GET /v1/requests?limit=N&outcome=failed&capability=C`: this router's
/// recent calls, newest first.
pub async fn recent(
    State(state): State<ConsoleState>,
    query: Result<Query<RecentQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = (|| {
        operator(state.service.admission(), &identified, &headers)?;
        let Query(query) = query.map_err(invalid_query)?;
        let failed_only = match query.outcome.as_deref() {
            None | Some("any") => false,
            Some("failed") => true,
            Some(other) => {
                return Err(RouterError::new(
                    Code::InvalidQuery,
                    format!("invalid query: `outcome` is `{other}`; use `failed` or `any`"),
                ))
            }
        };
        let limit = query.limit.unwrap_or(50).clamp(1, 1000);
        let mut calls = state.service.recent().find(
            |call| {
                !call.request_id.is_empty()
                    && (!failed_only || call.code.is_some())
                    && query
                        .capability
                        .as_deref()
                        .is_none_or(|wanted| wanted == call.capability)
            },
            Call::view,
        );
        calls.truncate(limit);
        Ok::<_, RouterError>(
            Json(json!({
                "calls": calls.into_iter().map(|(_, view)| view).collect::<Vec<_>>(),
                "ring_capacity": state.service.recent().capacity(),
            }))
            .into_response(),
        )
    })();
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestQuery {
    /// The caller that submitted it: finds its task even when the ring holds no call yet.
    caller: Option<String>,
}

/// `GET /v1/requests/{request_id}`: every call with that id this router
/// still holds (a task's deliveries are several), and the task record when
/// the call was a task's.
pub async fn request(
    State(state): State<ConsoleState>,
    Path(request_id): Path<String>,
    query: Result<Query<RequestQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        operator(state.service.admission(), &identified, &headers)?;
        let Query(query) = query.map_err(invalid_query)?;
        if request_id.is_empty() || request_id.len() > 128 {
            return Err(RouterError::field(
                Code::InvalidQuery,
                "request_id",
                "a request id is 1 to 128 characters",
            ));
        }
        let mut task_ids = Vec::new();
        let mut callers: Vec<String> = query.caller.into_iter().collect();
        let calls: Vec<Value> = state
            .service
            .recent()
            .find(|call| call.request_id == request_id, Call::view)
            .into_iter()
            .map(|(_, view)| view)
            .collect();
        for call in &calls {
            if let Some(task_id) = call["task_id"].as_str() {
                if !task_ids.iter().any(|known: &String| known == task_id) {
                    task_ids.push(task_id.to_string());
                }
            }
            if let Some(caller) = call["caller"].as_str() {
                callers.push(caller.to_string());
            }
        }
        let mut task = Value::Null;
        if let Some(tasks) = &state.tasks {
            // A task submitted here but not yet delivered (or delivered by another router) is
            // found by its caller and request id when the ring knows the caller.
            if task_ids.is_empty() {
                for caller in &callers {
                    if let Ok(Some(task_id)) = tasks.store().find(caller, &request_id).await {
                        task_ids.push(task_id);
                        break;
                    }
                }
            }
            if let Some(task_id) = task_ids.first() {
                task = match tasks.store().get(task_id).await {
                    Ok(found) => agent_reach_tasks::task_view(&found),
                    Err(error) => json!({ "task_id": task_id, "error": error.to_string() }),
                };
            }
        }
        if calls.is_empty() && task.is_null() {
            return Err(RouterError::new(
                Code::NotFound,
                format!(
                    "no call with request id `{request_id}` among this router's last {} calls; it may be older, or answered by another router replica",
                    state.service.recent().capacity()
                ),
            )
            .with_details(json!({ "reason": "request_not_found", "request_id": request_id })));
        }
        Ok::<_, RouterError>(Json(json!({ "request_id": request_id, "calls": calls, "task": task })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

/// `GET /v1/backlog`: the slow path at a glance: tasks waiting by
/// capability and priority, tasks running (claimed, not yet finished) by
/// priority, and the dead letters' count.
pub async fn backlog(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    let outcome = async {
        operator(state.service.admission(), &identified, &headers)?;
        let Some(tasks) = &state.tasks else {
            return Err(RouterError::new(
                Code::TasksDisabled,
                "this router runs without the slow path (start it with --redis)",
            ));
        };
        let store = tasks.store();
        let unavailable = |error: agent_reach_task_store::TaskStoreError| {
            RouterError::new(Code::TaskStoreUnavailable, format!("the task store: {error}"))
        };
        let waiting = store.backlog().await.map_err(unavailable)?;
        let running = store.running().await.map_err(unavailable)?;
        let dead_letters = store.dead_letter_count().await.map_err(unavailable)?;
        Ok::<_, RouterError>(
            Json(json!({
                "waiting": waiting.iter().map(|((capability, priority), count)| json!({
                    "capability": capability, "priority": priority.as_str(), "count": count
                })).collect::<Vec<_>>(),
                "running": running.iter().map(|(priority, count)| json!({
                    "priority": priority.as_str(), "count": count
                })).collect::<Vec<_>>(),
                "dead_letters": dead_letters,
            }))
            .into_response(),
        )
    }
    .await;
    outcome.unwrap_or_else(refused)
}
