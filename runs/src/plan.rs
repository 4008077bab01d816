//! The planner (docs/design.md §3.14.3): from a run's records, what comes
//! next — steps to start or skip, calls to submit (first attempts, retries
//! whose backoff has passed), when to look again, calls to cancel, and the
//! run's end. Pure: the same records give the same plan on any router, so
//! two routers advancing one run at once submit the same calls (one task
//! each, by request id) and record the same outcomes.
//!
//! One pass over the steps in dependency order, each decision applied to the
//! records at once (a skipped step's dependents start in the same pass).

use std::collections::HashMap;

use agent_reach_workflows::{expr, OnFailure, Scope, Step, Workflow};
use serde_json::{json, Value};

use crate::model::{compensation_field, item_field, ItemRecord, ItemStatus, RunSpec, StepRecord};

/// The longest `for_each` array: more is the step's failure (`FOR_EACH_TOO_LARGE`).
pub const MAX_FOR_EACH_ITEMS: usize = 1000;

/// A run's records, read from its entries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Records {
    /// By step id.
    pub steps: HashMap<String, StepRecord>,
    /// By entry field (`i:{step}:{k}`).
    pub items: HashMap<String, ItemRecord>,
    /// By step id.
    pub compensations: HashMap<String, ItemRecord>,
}

impl Records {
    /// From the run hash's entries; one that does not read is left out (and said).
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        let mut records = Records::default();
        for (field, json) in entries {
            let read = match field.split_once(':') {
                Some(("s", step)) => serde_json::from_str(json).map(|record| {
                    records.steps.insert(step.to_string(), record);
                }),
                Some(("i", _)) => serde_json::from_str(json).map(|record| {
                    records.items.insert(field.clone(), record);
                }),
                Some(("c", step)) => serde_json::from_str(json).map(|record| {
                    records.compensations.insert(step.to_string(), record);
                }),
                _ => Ok(()),
            };
            if let Err(error) = read {
                tracing::warn!(message = "A run entry does not read; it is ignored.", %field, %error);
            }
        }
        records
    }

    /// The record behind `field` (`i:…` or `c:…`).
    pub fn entry(&self, field: &str) -> Option<&ItemRecord> {
        match field.strip_prefix("c:") {
            Some(step) => self.compensations.get(step),
            None => self.items.get(field),
        }
    }

    pub fn set_entry(&mut self, field: &str, record: ItemRecord) {
        match field.strip_prefix("c:") {
            Some(step) => self.compensations.insert(step.to_string(), record),
            None => self.items.insert(field.to_string(), record),
        };
    }

    /// Tasks still in flight (their outcome not recorded), steps' and compensations'.
    pub fn in_flight(&self) -> Vec<(&str, &ItemRecord)> {
        self.items
            .iter()
            .map(|(field, record)| (field.as_str(), record))
            .chain(self.compensations.iter().map(|(step, record)| (step.as_str(), record)))
            .filter(|(_, record)| !record.is_ended())
            .collect()
    }
}

/// How a step stands, for planning and for the run's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not started: its dependencies have not settled.
    Waiting,
    Skipped,
    /// Started, some call not settled.
    Running,
    Succeeded,
    Failed,
}

impl Standing {
    pub fn is_settled(self) -> bool {
        matches!(self, Standing::Skipped | Standing::Succeeded | Standing::Failed)
    }
}

/// A call to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub field: String,
    pub step: usize,
    /// The call's position in the step (`None`: the step's compensation).
    pub item: Option<usize>,
    pub attempt: u32,
    pub payload: Value,
}

/// How a run ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    Succeeded(Value),
    /// The error of the result envelope (`{code, message, retryable, details}`).
    Failed(Value),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record a step's start (or its skip, or its failure before any call).
    Start {
        step: usize,
        record: StepRecord,
    },
    Call(Call),
    /// A retry waits until then.
    WakeAt(u64),
    /// Tasks of a failing run that are no longer wanted.
    Cancel(Vec<String>),
    Finish(End),
}

/// What the steps' expressions read: the input, settled steps, the call's item.
struct RunScope<'a> {
    input: &'a Value,
    steps: &'a HashMap<String, Value>,
    item: Option<&'a Value>,
    index: Option<Value>,
}

impl Scope for RunScope<'_> {
    fn input(&self) -> &Value {
        self.input
    }
    fn step(&self, id: &str) -> Option<&Value> {
        self.steps.get(id)
    }
    fn item(&self) -> Option<&Value> {
        self.item
    }
    fn index(&self) -> Option<&Value> {
        self.index.as_ref()
    }
}

/// How step `index` stands in `records`.
pub fn standing(workflow: &Workflow, records: &Records, index: usize) -> Standing {
    let step = &workflow.steps[index];
    let Some(record) = records.steps.get(&step.id) else {
        return Standing::Waiting;
    };
    if record.skipped {
        return Standing::Skipped;
    }
    if record.error.is_some() {
        return Standing::Failed;
    }
    let mut all_succeeded = true;
    for item in 0..record.items.unwrap_or(1) {
        match records.items.get(&item_field(&step.id, item)) {
            Some(call) if is_settled(step, call) => all_succeeded &= call.status == ItemStatus::Succeeded,
            _ => return Standing::Running,
        }
    }
    if all_succeeded {
        Standing::Succeeded
    } else {
        Standing::Failed
    }
}

/// A call that will not be tried again: it succeeded, was canceled, or failed past its retries.
fn is_settled(step: &Step, call: &ItemRecord) -> bool {
    match call.status {
        ItemStatus::Submitted => false,
        ItemStatus::Succeeded | ItemStatus::Canceled => true,
        ItemStatus::Failed => !step.retry.retries(call.attempt, &call.codes()),
    }
}

/// What `steps.ID` reads of a settled step: `{status, output, error}`.
pub fn step_value(workflow: &Workflow, records: &Records, index: usize, standing: Standing) -> Value {
    let step = &workflow.steps[index];
    let record = records.steps.get(&step.id);
    let calls: Vec<Option<&ItemRecord>> = (0..record.and_then(|record| record.items).unwrap_or(1))
        .map(|item| records.items.get(&item_field(&step.id, item)))
        .collect();
    let output = |call: Option<&ItemRecord>| call.and_then(|call| call.output.clone()).unwrap_or(Value::Null);
    let output = match record.and_then(|record| record.items) {
        Some(_) => Value::Array(calls.iter().map(|call| output(*call)).collect()),
        None => output(calls.first().copied().flatten()),
    };
    match standing {
        Standing::Skipped => json!({
            "status": "canceled", "output": null,
            "error": {"code": "SKIPPED", "message": "the step's `when` was not true"},
        }),
        Standing::Succeeded => json!({"status": "succeeded", "output": output, "error": null}),
        Standing::Failed => {
            let error = record.and_then(|record| record.error.clone()).or_else(|| {
                calls.iter().enumerate().find_map(|(item, call)| {
                    let mut error = call
                        .filter(|call| call.status != ItemStatus::Succeeded)?
                        .error
                        .clone()?;
                    if record.and_then(|record| record.items).is_some() {
                        error["details"]["item"] = json!(item);
                    }
                    Some(error)
                })
            });
            json!({"status": "failed", "output": output, "error": error})
        }
        Standing::Waiting | Standing::Running => json!({"status": "pending", "output": null, "error": null}),
    }
}

/// The next actions for a run of `workflow` started as `spec`, its records
/// `records` (updated with every decision), at `now`.
pub fn plan(workflow: &Workflow, spec: &RunSpec, records: &mut Records, now: u64) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut settled: HashMap<String, Value> = HashMap::new();
    let mut standings = vec![Standing::Waiting; workflow.steps.len()];
    for &index in &workflow.order {
        standings[index] = standing(workflow, records, index);
        let step = &workflow.steps[index];
        if standings[index] == Standing::Waiting {
            let ready = step.depends_on.iter().all(|dependency| {
                matches!(standings[*dependency], Standing::Skipped | Standing::Succeeded)
                    || (standings[*dependency] == Standing::Failed
                        && matches!(workflow.steps[*dependency].on_failure, OnFailure::Continue))
            });
            if !ready {
                continue;
            }
            let scope = RunScope {
                input: &spec.input,
                steps: &settled,
                item: None,
                index: None,
            };
            let record = start(step, &scope, now);
            records.steps.insert(step.id.clone(), record.clone());
            actions.push(Action::Start { step: index, record });
            standings[index] = standing(workflow, records, index);
        }
        if standings[index] == Standing::Running {
            calls(workflow, spec, records, (index, &settled), now, &mut actions);
            standings[index] = standing(workflow, records, index);
        }
        if standings[index].is_settled() {
            settled.insert(step.id.clone(), step_value(workflow, records, index, standings[index]));
        }
    }
    let failing: Vec<usize> = (0..workflow.steps.len())
        .filter(|index| {
            standings[*index] == Standing::Failed && !matches!(workflow.steps[*index].on_failure, OnFailure::Continue)
        })
        .collect();
    if !failing.is_empty() {
        fail(workflow, spec, records, (&failing, &settled), now, &mut actions);
        return actions;
    }
    if standings.iter().all(|standing| standing.is_settled()) {
        actions.push(Action::Finish(finish(workflow, spec, &settled)));
    }
    actions
}

/// A ready step's start: skipped (`when`), failed (a `for_each` that is not
/// an array, or too long), or started with its number of calls.
fn start(step: &Step, scope: &RunScope<'_>, now: u64) -> StepRecord {
    let mut record = StepRecord {
        started_at_ms: now,
        items: None,
        skipped: false,
        error: None,
    };
    if let Some(when) = &step.when {
        if !expr::is_true(&when.eval(scope)) {
            record.skipped = true;
            return record;
        }
    }
    if let Some(for_each) = &step.for_each {
        match for_each.eval(scope).as_ref() {
            Value::Array(items) if items.len() <= MAX_FOR_EACH_ITEMS => record.items = Some(items.len()),
            Value::Array(items) => {
                record.error = Some(json!({
                    "code": "FOR_EACH_TOO_LARGE",
                    "message": format!("for_each gave {} elements; at most {MAX_FOR_EACH_ITEMS}", items.len()),
                }))
            }
            other => {
                record.error = Some(json!({
                    "code": "INVALID_FOR_EACH",
                    "message": format!("for_each gave {} where an array was expected", kind(other)),
                }))
            }
        }
    }
    record
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A running step's calls: first attempts up to `max_parallel` at once,
/// retries once their backoff has passed.
fn calls(
    workflow: &Workflow,
    spec: &RunSpec,
    records: &mut Records,
    (index, settled): (usize, &HashMap<String, Value>),
    now: u64,
    actions: &mut Vec<Action>,
) {
    let step = &workflow.steps[index];
    let record = records.steps.get(&step.id).cloned();
    let count = record.as_ref().and_then(|record| record.items);
    let items: Option<Vec<Value>> = count.and(step.for_each.as_ref()).map(|for_each| {
        let scope = RunScope {
            input: &spec.input,
            steps: settled,
            item: None,
            index: None,
        };
        match for_each.eval(&scope).into_owned() {
            Value::Array(items) => items,
            _ => Vec::new(),
        }
    });
    let total = count.unwrap_or(1);
    let mut in_flight = (0..total)
        .filter(|item| {
            records
                .items
                .get(&item_field(&step.id, *item))
                .is_some_and(|call| !is_settled(step, call))
        })
        .count();
    for item in 0..total {
        let field = item_field(&step.id, item);
        let attempt = match records.items.get(&field) {
            None if in_flight < step.max_parallel => {
                in_flight += 1;
                1
            }
            Some(call) if call.status == ItemStatus::Failed && !is_settled(step, call) => {
                let due = call.finished_at_ms.unwrap_or(now) + step.retry.delay_ms(call.attempt + 1);
                if now < due {
                    actions.push(Action::WakeAt(due));
                    continue;
                }
                call.attempt + 1
            }
            _ => continue,
        };
        let scope = RunScope {
            input: &spec.input,
            steps: settled,
            item: items.as_ref().and_then(|items| items.get(item)),
            index: count.map(|_| json!(item)),
        };
        let payload = step.input.eval(&scope);
        records.items.insert(field.clone(), placeholder(attempt, now));
        actions.push(Action::Call(Call {
            field,
            step: index,
            item: Some(item),
            attempt,
            payload,
        }));
    }
}

/// A submitted call's record until its task id is known.
fn placeholder(attempt: u32, now: u64) -> ItemRecord {
    ItemRecord {
        attempt,
        status: ItemStatus::Submitted,
        task_id: String::new(),
        submitted_at_ms: now,
        finished_at_ms: None,
        agent_id: None,
        capability_version: None,
        output: None,
        error: None,
    }
}

/// A failing run: compensations run, calls still in flight are canceled, and
/// once every compensation ended the run fails with the first failed step's error.
fn fail(
    workflow: &Workflow,
    spec: &RunSpec,
    records: &mut Records,
    (failing, settled): (&[usize], &HashMap<String, Value>),
    now: u64,
    actions: &mut Vec<Action>,
) {
    let mut compensated = true;
    for &index in failing {
        let step = &workflow.steps[index];
        let OnFailure::Compensate(compensation) = &step.on_failure else {
            continue;
        };
        match records.compensations.get(&step.id) {
            None => {
                let scope = RunScope {
                    input: &spec.input,
                    steps: settled,
                    item: None,
                    index: None,
                };
                let payload = compensation.input.eval(&scope);
                records.compensations.insert(step.id.clone(), placeholder(1, now));
                actions.push(Action::Call(Call {
                    field: compensation_field(&step.id),
                    step: index,
                    item: None,
                    attempt: 1,
                    payload,
                }));
                compensated = false;
            }
            Some(call) if !call.is_ended() => compensated = false,
            Some(_) => {}
        }
    }
    let canceled: Vec<String> = records
        .items
        .values()
        .filter(|call| !call.is_ended() && !call.task_id.is_empty())
        .map(|call| call.task_id.clone())
        .collect();
    if !canceled.is_empty() {
        actions.push(Action::Cancel(canceled));
    }
    if !compensated {
        return;
    }
    let first = &workflow.steps[failing[0]];
    let failed = settled.get(&first.id).cloned().unwrap_or(Value::Null);
    let error = failed.get("error").cloned().unwrap_or(Value::Null);
    let mut details = json!({"step": first.id, "error": error});
    if let Some(compensation) = records.compensations.get(&first.id) {
        details["compensation"] = json!({
            "status": compensation.status,
            "task_id": compensation.task_id,
            "output": compensation.output,
            "error": compensation.error,
        });
    }
    let code = error.get("code").and_then(Value::as_str).unwrap_or("UNKNOWN");
    let message = error.get("message").and_then(Value::as_str).unwrap_or("");
    actions.push(Action::Finish(End::Failed(json!({
        "code": "STEP_FAILED",
        "message": format!("step `{}` failed: {code}: {message}", first.id),
        "retryable": false,
        "details": details,
    }))));
}

/// Every step settled: the output, checked against the output schema.
fn finish(workflow: &Workflow, spec: &RunSpec, settled: &HashMap<String, Value>) -> End {
    let scope = RunScope {
        input: &spec.input,
        steps: settled,
        item: None,
        index: None,
    };
    let output = workflow.output.eval(&scope);
    if let Some(validator) = &workflow.output_validator {
        let errors: Vec<Value> = validator
            .iter_errors(&output)
            .take(20)
            .map(|error| json!({"pointer": error.instance_path().to_string(), "message": error.to_string()}))
            .collect();
        if !errors.is_empty() {
            return End::Failed(json!({
                "code": "OUTPUT_SCHEMA_MISMATCH",
                "message": format!("the run's output does not match workflow {}'s output schema", workflow.name),
                "retryable": false,
                "details": {"errors": errors},
            }));
        }
    }
    End::Succeeded(output)
}

#[cfg(test)]
mod tests;
