//! The operator API over dead-lettered callbacks (DESIGN §8, `operators:` in
//! `acl.yaml`): `GET /v1/dead-letters?after=ID&limit=N` lists them oldest
//! first, `GET /v1/dead-letters/{id}` shows one with its result, and
//! `POST /v1/dead-letters/{id}/replay` sends its callback again from the
//! first attempt (a failure parks a new dead letter).

use agent_reach_task_store::DeadLetter;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{is_cursor, TaskApi};
use super::{store_error, TaskService};
use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::error::{Code, RouterError};

fn view(letter: &DeadLetter, with_result: bool) -> Value {
    let parked_at = letter.id.split_once('-').and_then(|(ms, _)| ms.parse::<u64>().ok());
    let mut view = json!({
        "id": letter.id,
        "task_id": letter.task_id,
        "url": letter.url,
        "error": letter.error,
        "parked_at": parked_at,
    });
    // An A2A push config's notification names its config.
    if let Some(config) = &letter.push_config {
        view["push_config"] = json!(config);
    }
    if with_result {
        view["result"] = letter.result.clone().unwrap_or(Value::Null);
    }
    view
}

/// The slow path, for an operator.
fn operator<'a>(
    api: &'a TaskApi,
    identified: &Identified,
    headers: &HeaderMap,
) -> Result<&'a std::sync::Arc<TaskService>, RouterError> {
    let tasks = api.enabled()?;
    // A bearer token or the console's session (its cookie, read by the one way in).
    agent_reach_pipeline::call::identify::operator(api.service.admission(), identified, headers)?;
    Ok(tasks)
}

/// A dead letter's id as the router hands them out (`MS-SEQ`); anything else names none.
fn checked_id(id: &str) -> Result<&str, RouterError> {
    if is_cursor(id) {
        Ok(id)
    } else {
        Err(store_error(agent_reach_task_store::TaskStoreError::DeadLetterNotFound(
            id.to_string(),
        )))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

#[tracing::instrument(name = "tasks.dead_letters.list", skip_all)]
pub(super) async fn list(
    AxumState(api): AxumState<TaskApi>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let tasks = operator(&api, &identified, &headers)?;
        let Query(query) = query.map_err(|rejection| {
            RouterError::new(Code::InvalidQuery, format!("invalid query: {}", rejection.body_text()))
        })?;
        if let Some(after) = query.after.as_deref().filter(|after| !is_cursor(after)) {
            return Err(RouterError::new(
                Code::InvalidQuery,
                format!("invalid query: `after` is `{after}`; pass the `next_after` (or an `id`) of an earlier answer"),
            ));
        }
        let limit = query.limit.unwrap_or(100).clamp(1, 1000);
        let letters = tasks
            .store
            .list_dead_letters(query.after.as_deref(), limit)
            .await
            .map_err(store_error)?;
        let total = tasks.store.dead_letter_count().await.map_err(store_error)?;
        let next_after = letters.last().map(|letter| letter.id.clone()).or(query.after);
        Ok::<_, RouterError>(
            Json(json!({
                "dead_letters": letters.iter().map(|letter| view(letter, false)).collect::<Vec<_>>(),
                "total": total,
                "next_after": next_after,
            }))
            .into_response(),
        )
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[tracing::instrument(name = "tasks.dead_letters.show", skip_all)]
pub(super) async fn show(
    AxumState(api): AxumState<TaskApi>,
    Path(id): Path<String>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let tasks = operator(&api, &identified, &headers)?;
        let letter = tasks
            .store
            .dead_letter_entry(checked_id(&id)?)
            .await
            .map_err(store_error)?;
        Ok::<_, RouterError>(Json(view(&letter, true)).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}

#[tracing::instrument(name = "tasks.dead_letters.replay", skip_all)]
pub(super) async fn replay(
    AxumState(api): AxumState<TaskApi>,
    Path(id): Path<String>,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    let outcome = async {
        let tasks = api.enabled()?;
        let operator = agent_reach_pipeline::call::identify::operator(api.service.admission(), &identified, &headers)?;
        let task_id = tasks
            .store
            .replay_dead_letter(checked_id(&id)?)
            .await
            .map_err(|error| match error {
                agent_reach_task_store::TaskStoreError::NotFound(task_id) => RouterError::new(
                    Code::TaskNotFound,
                    format!(
                        "task `{task_id}` of dead letter `{id}` is past its retention; its result is in the dead letter"
                    ),
                ),
                other => store_error(other),
            })?;
        tracing::info!(message = "Dead letter replayed.", dead_letter = %id, %task_id, operator = %operator.name());
        Ok::<_, RouterError>(Json(json!({ "id": id, "task_id": task_id, "status": "scheduled" })).into_response())
    }
    .await;
    outcome.unwrap_or_else(refused)
}
