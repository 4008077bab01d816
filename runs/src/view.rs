//! A run as `GET /v1/runs/{run_id}` shows it (DESIGN §9): `{run_id,
//! workflow, version, status, steps: [{id, status, attempts, agent_id?,
//! capability_version?, started_at_ms?, finished_at_ms?, output?, error?}],
//! output?, error?}`, and beside DESIGN's fields what the console draws
//! (each step's capability and `depends_on`, a `for_each` step's calls, a
//! compensation). A step's calls still in flight show their task's own state
//! (`pending`, `running`, `paused`).

use std::collections::HashMap;

use agent_reach_task_store::{State, StoredRun, Task};
use agent_reach_workflows::{OnFailure, Workflow};
use serde_json::{json, Map, Value};

use crate::model::{item_field, ItemRecord, RunSpec};
use crate::plan::{self, Records, Standing};

/// A task's state as a step's (or a call's) status.
fn live_status(state: State) -> &'static str {
    match state.as_str() {
        "retrying" => "running",
        // A multi-turn task waiting for its caller is still the step's work in progress.
        "input_required" => "running",
        other => other,
    }
}

/// A call's status: its task's while in flight, its recorded outcome after.
fn call_status(record: &ItemRecord, live: &HashMap<String, Task>) -> String {
    if record.is_ended() {
        return serde_json::to_value(record.status)
            .ok()
            .and_then(|value| value.as_str().map(str::to_string))
            .unwrap_or_default();
    }
    live.get(&record.task_id)
        .map_or("pending", |task| live_status(task.state))
        .to_string()
}

fn call_view(index: Option<usize>, record: &ItemRecord, live: &HashMap<String, Task>) -> Value {
    let mut view = Map::new();
    if let Some(index) = index {
        view.insert("index".to_string(), json!(index));
    }
    view.insert("status".to_string(), json!(call_status(record, live)));
    view.insert("attempts".to_string(), json!(record.attempt));
    view.insert("task_id".to_string(), json!(record.task_id));
    for (field, value) in [
        ("agent_id", record.agent_id.as_ref().map(|id| json!(id))),
        (
            "capability_version",
            record.capability_version.as_ref().map(|version| json!(version)),
        ),
        ("started_at_ms", Some(json!(record.submitted_at_ms))),
        ("finished_at_ms", record.finished_at_ms.map(|at| json!(at))),
        ("output", record.output.clone()),
        ("error", record.error.clone()),
    ] {
        if let Some(value) = value {
            view.insert(field.to_string(), value);
        }
    }
    Value::Object(view)
}

/// The tasks a view needs live: the calls still in flight.
pub fn in_flight_tasks(records: &Records) -> Vec<String> {
    records
        .in_flight()
        .into_iter()
        .map(|(_, record)| record.task_id.clone())
        .filter(|task_id| !task_id.is_empty())
        .collect()
}

/// The whole view of a run.
pub fn run_view(
    stored: &StoredRun,
    spec: &RunSpec,
    workflow: &Workflow,
    records: &Records,
    live: &HashMap<String, Task>,
) -> Value {
    let ended = stored.state.is_terminal();
    let steps: Vec<Value> = workflow
        .steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let standing = plan::standing(workflow, records, index);
            let record = records.steps.get(&step.id);
            let count = record.and_then(|record| record.items);
            let calls: Vec<&ItemRecord> = (0..count.unwrap_or(1))
                .filter_map(|item| records.items.get(&item_field(&step.id, item)))
                .collect();
            let statuses: Vec<String> = calls.iter().map(|call| call_status(call, live)).collect();
            let status = match standing {
                Standing::Waiting | Standing::Running if ended => "canceled",
                Standing::Waiting => "pending",
                Standing::Skipped => "canceled",
                Standing::Succeeded => "succeeded",
                Standing::Failed => "failed",
                Standing::Running if statuses.iter().any(|status| status == "running" || status == "failed") => {
                    "running"
                }
                Standing::Running if statuses.iter().any(|status| status == "paused") => "paused",
                Standing::Running if statuses.iter().any(|status| status == "succeeded") => "running",
                Standing::Running => "pending",
            };
            let mut view = Map::new();
            view.insert("id".to_string(), json!(step.id));
            view.insert("capability".to_string(), json!(step.capability));
            view.insert("status".to_string(), json!(status));
            view.insert(
                "attempts".to_string(),
                json!(calls.iter().map(|call| call.attempt).sum::<u32>()),
            );
            view.insert(
                "depends_on".to_string(),
                json!(step
                    .depends_on
                    .iter()
                    .map(|dependency| &workflow.steps[*dependency].id)
                    .collect::<Vec<_>>()),
            );
            if let Some(record) = record {
                view.insert("started_at_ms".to_string(), json!(record.started_at_ms));
            }
            if standing == Standing::Skipped {
                view.insert("skipped".to_string(), json!(true));
            }
            if standing.is_settled() {
                let settled = plan::step_value(workflow, records, index, standing);
                if let Some(finished) = calls.iter().filter_map(|call| call.finished_at_ms).max() {
                    view.insert("finished_at_ms".to_string(), json!(finished));
                }
                if standing != Standing::Failed || !settled["output"].is_null() {
                    view.insert("output".to_string(), settled["output"].clone());
                }
                if !settled["error"].is_null() {
                    view.insert("error".to_string(), settled["error"].clone());
                }
            }
            match count {
                Some(_) => {
                    let items: Vec<Value> = (0..count.unwrap_or(0))
                        .filter_map(|item| {
                            records
                                .items
                                .get(&item_field(&step.id, item))
                                .map(|call| call_view(Some(item), call, live))
                        })
                        .collect();
                    view.insert("items".to_string(), json!(items));
                }
                None => {
                    if let Some(call) = calls.first() {
                        for field in ["agent_id", "capability_version", "task_id"] {
                            if let Some(value) = call_view(None, call, live).get(field) {
                                view.insert(field.to_string(), value.clone());
                            }
                        }
                    }
                }
            }
            if let (OnFailure::Compensate(compensation), Some(call)) =
                (&step.on_failure, records.compensations.get(&step.id))
            {
                let mut compensated = call_view(None, call, live);
                compensated["capability"] = json!(compensation.capability);
                view.insert("compensation".to_string(), compensated);
            }
            Value::Object(view)
        })
        .collect();
    let mut view = json!({
        "run_id": stored.run_id,
        "workflow": spec.workflow,
        "version": spec.version,
        "status": stored.state.as_str(),
        "request_id": spec.request_id,
        "created_at_ms": spec.created_at_ms,
        "updated_at_ms": stored.updated_at_ms,
        "steps": steps,
    });
    if let Some(session_id) = &spec.session_id {
        view["session_id"] = json!(session_id);
    }
    if let Some(result) = stored
        .result
        .as_deref()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
    {
        for field in ["output", "error"] {
            if let Some(value) = result.get(field) {
                view[field] = value.clone();
            }
        }
    }
    view
}
