//! What a run keeps (docs/design.md §3.14.4): its immutable [`RunSpec`], and
//! per step a [`StepRecord`] (started: how many calls, or skipped) and per
//! call an [`ItemRecord`] (submitted as a task, then its outcome), stored as
//! the run hash's entries (`task_store::store::runs`), each written so that
//! an end beats a start and a later attempt beats both.

use agent_reach_proto::Priority;
use agent_reach_task_store::EntryOrder;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// What a run was started with; never changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub workflow: String,
    pub version: String,
    /// The definition the run started with (a later registration does not change a run).
    pub definition: Value,
    pub input: Value,
    /// Who started it: every step is called as this caller (`anonymous` without authentication).
    pub caller: String,
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    pub priority: Priority,
    /// The trace the steps' calls join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    pub created_at_ms: u64,
    /// Whether the run's held task was submitted with a callback, so the
    /// run's end ends it without reading it (`None`: a run stored before
    /// this field; its end reads the task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_callback: Option<bool>,
}

/// A step that started (its `when` held, its `for_each` evaluated) or was skipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub started_at_ms: u64,
    /// A `for_each` step's number of calls; `None`: one call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<usize>,
    /// Its `when` was not `true`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// Why it failed before any call (its `for_each` is not an array, or too long).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// Where one call stands in the run's own record. While `submitted`, the
/// task's own state (pending, running, paused) is what the run's view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    Submitted,
    Succeeded,
    Failed,
    Canceled,
}

/// One call of a step (or a compensation): its latest attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemRecord {
    pub attempt: u32,
    pub status: ItemStatus,
    pub task_id: String,
    pub submitted_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

impl ItemRecord {
    pub fn is_ended(&self) -> bool {
        self.status != ItemStatus::Submitted
    }

    /// Its place in the entry order: a later attempt, and an end after a start.
    pub fn order(&self) -> EntryOrder {
        EntryOrder {
            attempt: self.attempt,
            rank: u8::from(self.is_ended()),
        }
    }

    /// The codes a retry policy matches: the router's, and an agent's own.
    pub fn codes(&self) -> Vec<&str> {
        let Some(error) = &self.error else {
            return Vec::new();
        };
        [error.get("code"), error.pointer("/details/agent_code")]
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    }

    /// The outcome of the task behind this record, from its result envelope.
    pub fn ended(&self, state: agent_reach_task_store::State, result: Option<&Value>, at_ms: u64) -> Self {
        use agent_reach_task_store::State;
        let status = match state {
            State::Succeeded => ItemStatus::Succeeded,
            State::Canceled => ItemStatus::Canceled,
            _ => ItemStatus::Failed,
        };
        let text = |field: &str| {
            result
                .and_then(|result| result.get(field))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let error = match status {
            ItemStatus::Succeeded => None,
            ItemStatus::Canceled => Some(json!({"code": "CANCELED", "message": "the call was canceled"})),
            _ => Some(
                result
                    .and_then(|result| result.get("error"))
                    .cloned()
                    .unwrap_or_else(|| json!({"code": "INTERNAL", "message": "the call failed without an error"})),
            ),
        };
        Self {
            attempt: self.attempt,
            status,
            task_id: self.task_id.clone(),
            submitted_at_ms: self.submitted_at_ms,
            finished_at_ms: Some(at_ms),
            agent_id: text("agent_id"),
            capability_version: text("capability_version"),
            output: match status {
                ItemStatus::Succeeded => Some(
                    result
                        .and_then(|result| result.get("output"))
                        .cloned()
                        .unwrap_or(Value::Null),
                ),
                _ => None,
            },
            error,
        }
    }
}

/// The run hash's entry names: `s:{step}`, `i:{step}:{k}`, `c:{step}`.
pub fn step_field(step: &str) -> String {
    format!("s:{step}")
}

pub fn item_field(step: &str, item: usize) -> String {
    format!("i:{step}:{item}")
}

pub fn compensation_field(step: &str) -> String {
    format!("c:{step}")
}

/// The request id of one call's task: `{run}/{step}/{k}/{attempt}`, or
/// `{run}/{step}/compensate` — the same whichever router submits it, so a
/// call submitted twice (two routers, or a retry after a lost answer) is one task.
pub fn call_request_id(run_id: &str, step: &str, item: Option<usize>, attempt: u32) -> String {
    match item {
        Some(item) => format!("{run_id}/{step}/{item}/{attempt}"),
        None => format!("{run_id}/{step}/compensate"),
    }
}

/// Which entry a step task's request id names, and its attempt.
pub fn entry_of_request(run_id: &str, request_id: &str) -> Option<(String, u32)> {
    let rest = request_id.strip_prefix(run_id)?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    let step = parts.next()?;
    match (parts.next()?, parts.next(), parts.next()) {
        ("compensate", None, None) => Some((compensation_field(step), 1)),
        (item, Some(attempt), None) => Some((item_field(step, item.parse().ok()?), attempt.parse().ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_name_their_entry() {
        let id = call_request_id("t_1", "stock", Some(3), 2);
        assert_eq!(id, "t_1/stock/3/2");
        assert_eq!(entry_of_request("t_1", &id), Some(("i:stock:3".to_string(), 2)));
        let compensation = call_request_id("t_1", "order", None, 1);
        assert_eq!(entry_of_request("t_1", &compensation), Some(("c:order".to_string(), 1)));
        assert_eq!(entry_of_request("t_2", &id), None);
        assert_eq!(entry_of_request("t_1", "t_1/x"), None);
    }

    #[test]
    fn an_outcome_keeps_the_agent_and_the_codes_a_retry_matches() {
        let submitted = ItemRecord {
            attempt: 2,
            status: ItemStatus::Submitted,
            task_id: "t_1".to_string(),
            submitted_at_ms: 1,
            finished_at_ms: None,
            agent_id: None,
            capability_version: None,
            output: None,
            error: None,
        };
        let failed = submitted.ended(
            agent_reach_task_store::State::Failed,
            Some(&json!({"agent_id": "a-1", "error": {"code": "AGENT_ERROR", "details": {"agent_code": "ORDER_LOCKED"}}})),
            9,
        );
        assert_eq!(failed.codes(), ["AGENT_ERROR", "ORDER_LOCKED"]);
        assert_eq!(
            (failed.agent_id.as_deref(), failed.order()),
            (Some("a-1"), EntryOrder { attempt: 2, rank: 1 })
        );
        assert!(submitted.order() < failed.order());
        let done = submitted.ended(
            agent_reach_task_store::State::Succeeded,
            Some(&json!({"output": {"ok": true}})),
            9,
        );
        assert_eq!(done.output, Some(json!({"ok": true})));
    }
}
