//! `POST /v1/tasks/{task_id}/result` (DESIGN §8): an agent that answered a
//! task's delivery `202 Accepted` reports its outcome here, on any router,
//! authenticated as itself. Body `{"output": …}` or `{"error": {"code",
//! "message"}}`; accepted once, the same report again is answered 200 and
//! changes nothing, a different one is 409, another agent's is 403.

use std::time::Duration;

use agent_reach_access::Caller;
use agent_reach_proto::envelope::{ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_task_store::{Accepted, Reported, State, Task};
use axum::body::Body;
use axum::extract::{Path, State as AxumState};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::api::TaskApi;
use super::worker::complete_parent;
use super::{store_error, TaskService};
use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::envelope;
use agent_reach_pipeline::error::{Code, RouterError};

/// How long a report waits for its delivery's `202` to be recorded: an agent
/// may report before the router that delivered it has read the `202`.
const ACCEPT_GRACE: Duration = Duration::from_secs(2);
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// An agent's report, as checked.
enum Report {
    Output(Value),
    Error { code: String, message: String },
}

fn invalid(message: impl Into<String>) -> RouterError {
    RouterError::new(Code::InvalidTaskResult, message)
}

/// Exactly one of `output` (any JSON, `null` included) or `error: {code, message?}`.
fn parse_report(body: &Value) -> Result<Report, RouterError> {
    let expected = "expected {\"output\": ...} or {\"error\": {\"code\": \"...\", \"message\": \"...\"}}";
    let Some(object) = body.as_object() else {
        return Err(invalid(format!("the result is not a JSON object; {expected}")));
    };
    if let Some(unknown) = object.keys().find(|key| !matches!(key.as_str(), "output" | "error")) {
        return Err(RouterError::field(
            Code::InvalidTaskResult,
            unknown,
            format!("unknown field `{unknown}` in the result; {expected}"),
        ));
    }
    match (object.get("output"), object.get("error")) {
        (Some(output), None) => Ok(Report::Output(output.clone())),
        (None, Some(error)) => {
            let code = error
                .get("code")
                .and_then(Value::as_str)
                .filter(|code| !code.is_empty());
            let message = error.get("message").map(|message| message.as_str());
            match (error.as_object(), code, message) {
                (Some(fields), Some(code), None | Some(Some(_)))
                    if fields.keys().all(|key| matches!(key.as_str(), "code" | "message")) =>
                {
                    Ok(Report::Error {
                        code: code.to_string(),
                        message: message.flatten().unwrap_or_default().to_string(),
                    })
                }
                _ => Err(RouterError::field(
                    Code::InvalidTaskResult,
                    "error",
                    format!("`error` must be {{\"code\": non-empty string, \"message\": string}}; {expected}"),
                )),
            }
        }
        (Some(_), Some(_)) => Err(invalid(format!("give `output` or `error`, not both; {expected}"))),
        (None, None) => Err(invalid(format!("the result is empty; {expected}"))),
    }
}

#[tracing::instrument(name = "tasks.report", skip_all, fields(task_id = %task_id))]
pub(super) async fn report(
    AxumState(api): AxumState<TaskApi>,
    Path(task_id): Path<String>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    try_report(&api, &task_id, (identified, &headers), body)
        .await
        .unwrap_or_else(refused)
}

async fn try_report(
    api: &TaskApi,
    task_id: &str,
    (identified, headers): (Identified, &HeaderMap),
    body: Body,
) -> Result<Response, RouterError> {
    let tasks = api.enabled()?;
    let caller = identified.caller?;
    let bytes = envelope::read_body(headers, body, api.service.tuning().max_body_bytes).await?;
    let body: Value =
        serde_json::from_slice(&bytes).map_err(|error| invalid(format!("the result is not JSON: {error}")))?;
    let report = parse_report(&body)?;
    let (task, accepted) = accepted_task(tasks, task_id).await?;
    // Authentication off (development only): whoever reports speaks for the agent.
    let reporter = match &caller {
        Caller::Agent { name, .. } => name.to_string(),
        Caller::Unauthenticated => accepted.agent_name.clone(),
    };
    let (state, result) = result_envelope(api, &task, &accepted, report);
    let reported = tasks
        .store
        .report(&task, &reporter, (state, &result), &body)
        .await
        .map_err(store_error)?;
    let (status, duplicate) = match reported {
        Reported::Recorded(state) => {
            tasks.metrics.finished.with_label_values(&[state.as_str()]).inc();
            if let Some(parent) = &task.parent {
                complete_parent(tasks, parent).await;
            }
            tasks.ended(&task, state, &result);
            (state, false)
        }
        Reported::Repeated(state) => (state, true),
    };
    Ok(Json(json!({ "task_id": task_id, "status": status.as_str(), "duplicate": duplicate })).into_response())
}

/// The task and its `202` record; a running task whose `202` is not recorded
/// yet is given [`ACCEPT_GRACE`] (polled) for it.
async fn accepted_task(tasks: &TaskService, task_id: &str) -> Result<(Task, Accepted), RouterError> {
    let give_up = tokio::time::Instant::now() + ACCEPT_GRACE;
    loop {
        let task = tasks.store.get(task_id).await.map_err(store_error)?;
        if let Some(accepted) = task.accepted.clone() {
            return Ok((task, accepted));
        }
        if task.state != State::Running || tokio::time::Instant::now() >= give_up {
            return Err(store_error(agent_reach_task_store::TaskStoreError::NotAwaitingResult {
                current: task.state.as_str().to_string(),
            }));
        }
        tokio::time::sleep(ACCEPT_POLL).await;
    }
}

/// The task's result envelope from the report: the agent's output (checked
/// against the version's `output_schema`, as a synchronous answer is) or its
/// error as `AGENT_ERROR`, as a synchronous business error is.
fn result_envelope(api: &TaskApi, task: &Task, accepted: &Accepted, report: Report) -> (State, Value) {
    let failure = |error: RouterError| (State::Failed, None, Some(error.envelope_error()));
    let (state, output, error) = match report {
        Report::Output(output) => match check_output(api, task, accepted, &output) {
            Ok(()) => (State::Succeeded, Some(output), None),
            Err(error) => failure(error),
        },
        Report::Error { code, message } => failure(
            RouterError::new(Code::AgentError, message).with_details(json!({ "agent_code": code, "reported": true })),
        ),
    };
    let envelope = ResultEnvelope {
        version: ENVELOPE_VERSION.to_string(),
        request_id: task.request_id.clone(),
        status: if state == State::Succeeded {
            ResultStatus::Succeeded
        } else {
            ResultStatus::Failed
        },
        capability: Some(task.capability.clone()),
        capability_version: Some(accepted.capability_version.clone()),
        agent_id: Some(accepted.agent_id.clone()),
        attempts: task.attempts.max(1),
        duration_ms: agent_reach_task_store::store::now_ms().saturating_sub(accepted.at_ms),
        output,
        error,
        budget: None,
    };
    (state, serde_json::to_value(envelope).unwrap_or(Value::Null))
}

/// The version's output schema, when this router still routes it (an
/// instance gone since its `202` is checked by none).
fn check_output(api: &TaskApi, task: &Task, accepted: &Accepted, output: &Value) -> Result<(), RouterError> {
    api.service.check_reported_output(
        (&task.capability, &accepted.capability_version),
        &accepted.agent_id,
        output,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_output_or_error_and_nothing_else() {
        assert!(matches!(
            parse_report(&json!({"output": null})),
            Ok(Report::Output(Value::Null))
        ));
        assert!(matches!(
            parse_report(&json!({"error": {"code": "E", "message": "m"}})),
            Ok(Report::Error { .. })
        ));
        assert!(matches!(
            parse_report(&json!({"error": {"code": "E"}})),
            Ok(Report::Error { .. })
        ));
        for bad in [
            json!([]),
            json!({}),
            json!({"output": 1, "error": {"code": "E"}}),
            json!({"result": 1}),
            json!({"error": "E"}),
            json!({"error": {"code": ""}}),
            json!({"error": {"code": "E", "message": 3}}),
            json!({"error": {"code": "E", "extra": 1}}),
        ] {
            let error = parse_report(&bad).err().unwrap_or_else(|| panic!("{bad} was taken"));
            assert_eq!(error.code, Code::InvalidTaskResult, "{bad}");
        }
    }
}
