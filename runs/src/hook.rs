//! A workflow called like a capability (DESIGN §9): whatever door the call
//! came through (`/v1/invoke`, whole or streamed, A2A, MCP, a `/v1/tasks`
//! delivery), the pipeline admits it and hands it here; a run starts
//! (idempotent by the caller's request id) and the call is answered with the
//! run's result when it ends by the call's deadline. Otherwise the answer
//! says which run goes on (`/v1/invoke` answers it `202 {run_id, status}`).
//! A task's delivery waits for the run's end whatever its deadline: the
//! task is the run (its held task), ended by the run.

use std::sync::{Arc, Weak};
use std::time::Duration;

use agent_reach_pipeline::call::{Call, Entry};
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::outcome::{Accepted, Failure, Success};
use agent_reach_pipeline::Runner;
use agent_reach_task_store::{State, StoredRun};
use agent_reach_workflows::Workflow;
use serde_json::{json, Value};

use crate::engine::{Engine, Start};

/// The slow path's [`Runner`], installed in the router's pipeline.
pub struct WorkflowRunner {
    pub(crate) engine: Weak<Engine>,
}

impl Runner for WorkflowRunner {
    fn run<'a>(
        &'a self,
        call: &'a Call,
        workflow: Arc<Workflow>,
        deadline_ms: u64,
    ) -> futures::future::BoxFuture<'a, Result<Success, Failure>> {
        Box::pin(async move {
            let version = workflow.version.to_string();
            let failed = |error: RouterError, run_id: Option<&str>| Failure {
                error,
                capability_version: Some(version.clone()),
                agent_id: run_id.map(str::to_string),
                attempts: 0,
            };
            let Some(engine) = self.engine.upgrade() else {
                return Err(failed(
                    RouterError::new(Code::TasksDisabled, "the router is stopping"),
                    None,
                ));
            };
            let request = &call.checked.request;
            let started = engine
                .start(Start {
                    workflow: &workflow,
                    caller: &call.caller,
                    input: request.payload.clone(),
                    request_id: call.request_id().to_string(),
                    session_id: request.session_id.clone(),
                    context_id: request.context_id.clone(),
                    priority: request.priority.unwrap_or_default(),
                    callback: None,
                    trace_id: Some(call.trace.trace_id.to_string()),
                })
                .await
                .map_err(|error| failed(error, None))?;
            let until = match call.entry {
                // The delivery is the run: it ends with it.
                Entry::Delivery => tokio::time::Instant::now() + Duration::from_secs(24 * 3600),
                Entry::Call => tokio::time::Instant::from_std(call.received.instant_for(deadline_ms)),
            };
            let stored = engine
                .wait(&started.run_id, until)
                .await
                .map_err(|error| failed(error, Some(&started.run_id)))?;
            answer(&stored, version.clone(), deadline_ms)
        })
    }
}

/// The call's answer from its run: the output, the run's error, or which run goes on.
fn answer(stored: &StoredRun, version: String, deadline_ms: u64) -> Result<Success, Failure> {
    let result: Value = stored
        .result
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null);
    let run_id = stored.run_id.clone();
    match stored.state {
        State::Succeeded => Ok(Success {
            capability_version: version,
            agent_id: run_id.clone(),
            attempts: 1,
            output: serde_json::value::to_raw_value(&result["output"]).ok(),
            accepted: None,
            run: Some(run_id),
            paused: None,
            budget: None,
        }),
        State::Failed | State::Canceled => {
            let error = &result["error"];
            let code = error["code"].as_str().and_then(Code::parse).unwrap_or(Code::StepFailed);
            let mut failure = RouterError::new(code, error["message"].as_str().unwrap_or("the run failed"));
            if let Some(details) = error.get("details").filter(|details| !details.is_null()) {
                failure = failure.with_details(details.clone());
            }
            Err(Failure {
                error: failure,
                capability_version: Some(version),
                agent_id: Some(run_id),
                attempts: 1,
            })
        }
        // Still going at the call's deadline: the run's id, to follow it.
        other => Ok(Success {
            capability_version: version,
            agent_id: run_id.clone(),
            attempts: 0,
            output: serde_json::value::to_raw_value(&json!({ "run_id": run_id, "status": other.as_str() })).ok(),
            accepted: Some(Accepted {
                agent_name: String::new(),
                deadline_ms,
            }),
            run: Some(run_id),
            paused: None,
            budget: None,
        }),
    }
}
