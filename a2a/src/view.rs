//! A durable task as A2A shows it (spec §4.1): its state, status (with the
//! agent's question or the error), history, artifacts, the updates that
//! stream it, in each wire generation; and the parameters choosing how much
//! of it an answer shows.

use super::*;
use agent_reach_task_store::{Role, State, Task};

/// The A2A task states (spec §4.1.3) a task here takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum A2aState {
    Submitted,
    Working,
    Completed,
    Failed,
    Canceled,
    InputRequired,
}

impl A2aState {
    /// A durable task's state as A2A's.
    pub(crate) fn of(state: State) -> Self {
        match state {
            State::Pending => Self::Submitted,
            State::Running | State::Retrying => Self::Working,
            State::Succeeded => Self::Completed,
            State::Failed => Self::Failed,
            State::Canceled => Self::Canceled,
            State::InputRequired => Self::InputRequired,
        }
    }

    /// v1.0's name (the enum `TaskState`'s).
    pub(crate) fn v1(self) -> &'static str {
        match self {
            Self::Submitted => "TASK_STATE_SUBMITTED",
            Self::Working => "TASK_STATE_WORKING",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
            Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
        }
    }

    /// v0.3's name, also the word messages use.
    pub(crate) fn v03(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::InputRequired => "input-required",
        }
    }

    pub(crate) fn name(self, wire: Wire) -> &'static str {
        match wire {
            Wire::V1 => self.v1(),
            Wire::V03 => self.v03(),
        }
    }

    /// Terminal (§3.1.2: the stream closes) or interrupted (a send's stream
    /// and a blocking send end there too: the client must answer).
    pub(crate) fn settles(self) -> bool {
        !matches!(self, Self::Submitted | Self::Working)
    }
}

/// How a message refers to a durable task's state (`completed`, `input-required`).
pub(crate) fn task_state(state: State) -> &'static str {
    A2aState::of(state).v03()
}

/// A status in the request's wire shape.
pub(crate) fn status(state: A2aState, wire: Wire) -> Value {
    json!({ "state": state.name(wire) })
}

/// A status message carrying an error envelope (`metadata.error`) and its text.
pub(crate) fn error_message(error: &Value, wire: Wire) -> Value {
    let text = format!(
        "{}: {}",
        error.get("code").and_then(Value::as_str).unwrap_or("ERROR"),
        error.get("message").and_then(Value::as_str).unwrap_or("")
    );
    let mut message = agent_text(&trace::new_request_id(), &text, wire);
    message["metadata"] = json!({ "error": error });
    message
}

/// A message of the agent holding one TextPart.
pub(crate) fn agent_text(message_id: &str, text: &str, wire: Wire) -> Value {
    match wire {
        Wire::V1 => json!({ "messageId": message_id, "role": "ROLE_AGENT", "parts": [{ "text": text }] }),
        Wire::V03 => json!({ "kind": "message", "messageId": message_id, "role": "agent",
                "parts": [{ "kind": "text", "text": text }] }),
    }
}

/// A message of `task`'s conversation, with the task's ids.
pub(crate) fn in_task(mut message: Value, task: &Task) -> Value {
    message["contextId"] = json!(task.session_id.clone().unwrap_or_default());
    message["taskId"] = json!(task.task_id);
    message
}

/// The caller's message carrying `payload` as one DataPart.
pub(crate) fn user_data(message_id: &str, payload: Value, wire: Wire) -> Value {
    let mut message = match wire {
        Wire::V1 => json!({ "messageId": message_id, "role": "ROLE_USER" }),
        Wire::V03 => json!({ "kind": "message", "messageId": message_id, "role": "user" }),
    };
    message["parts"] = json!([data_part(payload, wire)]);
    message
}

/// A durable task's status: its state, when it entered it, the agent's
/// question while it waits for input, and the error of a failed or canceled one.
pub(crate) fn task_status(task: &Task, wire: Wire) -> Value {
    let mut value = status(A2aState::of(task.state), wire);
    value["timestamp"] = json!(rfc3339(task.updated_at_ms));
    if let Some(question) = task.question() {
        let text = question.message.as_deref().unwrap_or_default();
        value["message"] = in_task(agent_text(&question.message_id, text, wire), task);
    } else if let Some(error) = task.result.as_ref().and_then(|result| result.get("error")) {
        if !error.is_null() {
            value["message"] = error_message(error, wire);
        }
    }
    value
}

/// The output artifact of a task that succeeded.
pub(crate) fn output_artifact(task: &Task, wire: Wire) -> Option<Value> {
    let output = task.result.as_ref()?.get("output")?.clone();
    Some(json!({ "artifactId": format!("{}-output", task.task_id), "parts": [data_part(output, wire)] }))
}

/// A task's history (spec §3.2.4), oldest first: the message that started it
/// (its id the task's request id, the sender's `messageId`), then each time
/// the agent asked for input (a TextPart) and each message that answered it
/// (its payload as a DataPart, as every message is kept). The output is the
/// task's artifact, an error its status message.
pub(crate) fn history(task: &Task, wire: Wire) -> Vec<Value> {
    let payload = task.envelope.get("payload").cloned().unwrap_or(Value::Null);
    let first = in_task(user_data(&task.request_id, payload, wire), task);
    std::iter::once(first)
        .chain(task.turns.iter().map(|turn| {
            let message = match turn.role {
                Role::User => user_data(&turn.message_id, turn.payload.clone().unwrap_or(Value::Null), wire),
                Role::Agent => agent_text(&turn.message_id, turn.message.as_deref().unwrap_or_default(), wire),
            };
            in_task(message, task)
        }))
        .collect()
}

/// How much of a task an answer shows.
#[derive(Clone, Copy)]
pub(crate) struct Shown {
    /// The `artifacts` field (`[]` when there is none yet); omitted when false.
    pub(crate) artifacts: bool,
    /// The most recent messages of its history to show (`None`: all of it;
    /// `Some(0)`: no `history` field).
    pub(crate) history: Option<usize>,
}

impl Shown {
    /// A task answered whole: its artifacts and all its history.
    pub(crate) const WHOLE: Self = Self {
        artifacts: true,
        history: None,
    };
}

/// A durable task as an A2A Task.
pub(crate) fn task_value(task: &Task, wire: Wire, shown: Shown) -> Value {
    let result = task.result.as_ref();
    let mut metadata = json!({
        "capability": task.capability,
        "request_id": task.request_id,
        "attempts": task.attempts,
    });
    for field in ["agent_id", "capability_version"] {
        if let Some(value) = result
            .and_then(|result| result.get(field))
            .filter(|value| !value.is_null())
        {
            metadata[field] = value.clone();
        }
    }
    let mut value = json!({
        "id": task.task_id,
        "contextId": task.session_id.clone().unwrap_or_default(),
        "status": task_status(task, wire),
        "metadata": metadata,
    });
    if shown.artifacts {
        value["artifacts"] = json!(output_artifact(task, wire).into_iter().collect::<Vec<_>>());
    }
    if shown.history != Some(0) {
        let mut messages = history(task, wire);
        let keep = shown.history.unwrap_or(usize::MAX).min(messages.len());
        value["history"] = json!(messages.split_off(messages.len() - keep));
    }
    if wire == Wire::V03 {
        value["kind"] = json!("task");
    }
    value
}

/// A `historyLength` parameter (spec §3.2.4): absent or `null` is `None`
/// (no limit), else a count of at least 0.
pub(crate) fn history_length(value: Option<&Value>, name: &str) -> Result<Option<usize>, Refusal> {
    match value.filter(|value| !value.is_null()) {
        None => Ok(None),
        Some(value) => match value.as_u64() {
            Some(length) => Ok(Some(usize::try_from(length).unwrap_or(usize::MAX))),
            None => Err(invalid(format!(
                "`{name}` must be an integer of at least 0 (the most recent messages to return; 0 returns none), not {value}"
            ))),
        },
    }
}

/// A `ListTasks` `status` filter: `None` for none (absent, unspecified),
/// else the A2A state name a task must be in.
pub(crate) fn status_filter(value: Option<&Value>) -> Result<Option<&'static str>, Refusal> {
    const STATES: [&str; 9] = [
        "TASK_STATE_UNSPECIFIED",
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
        "TASK_STATE_FAILED",
        "TASK_STATE_CANCELED",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_REJECTED",
        "TASK_STATE_AUTH_REQUIRED",
    ];
    let state = match value.filter(|value| !value.is_null()) {
        None => return Ok(None),
        // ProtoJSON takes an enum by name or by number.
        Some(Value::String(name)) => STATES.iter().find(|state| **state == name.as_str()).copied(),
        Some(Value::Number(number)) => number
            .as_u64()
            .and_then(|index| STATES.get(usize::try_from(index).ok()?))
            .copied(),
        Some(_) => None,
    };
    match state {
        Some("TASK_STATE_UNSPECIFIED") => Ok(None),
        Some(state) => Ok(Some(state)),
        None => Err(invalid(format!(
            "`status` {} is not a task state: one of {}",
            value.map(Value::to_string).unwrap_or_default(),
            STATES[1..].join(", ")
        ))),
    }
}

/// A task still in the router's local buffer (Redis unreachable): submitted.
pub(crate) fn buffered_value(task_id: &str, wire: Wire) -> Value {
    let mut value = json!({ "id": task_id, "contextId": "", "status": status(A2aState::Submitted, wire) });
    if wire == Wire::V03 {
        value["kind"] = json!("task");
    }
    value
}

/// A status update for `task`.
pub(crate) fn status_update(task: &Task, wire: Wire) -> Value {
    let update = json!({
        "taskId": task.task_id,
        "contextId": task.session_id.clone().unwrap_or_default(),
        "status": task_status(task, wire),
    });
    match wire {
        Wire::V1 => json!({ "statusUpdate": update }),
        Wire::V03 => {
            let mut update = update;
            update["kind"] = json!("status-update");
            update["final"] = json!(A2aState::of(task.state).settles());
            update
        }
    }
}

/// A Task as a result of its wire (v1.0 wraps it as `{"task": …}` where a Message could be).
pub(crate) fn task_result(task: Value, wire: Wire, wrapped: bool) -> Value {
    match wire {
        Wire::V1 if wrapped => json!({ "task": task }),
        _ => task,
    }
}

/// An artifact update in the request's wire shape.
pub(crate) fn artifact_update(update: Value, wire: Wire) -> Value {
    match wire {
        Wire::V1 => json!({ "artifactUpdate": update }),
        Wire::V03 => {
            let mut update = update;
            update["kind"] = json!("artifact-update");
            update
        }
    }
}

/// An SSE answer, unbuffered by proxies.
pub(crate) fn event_stream(body: Body) -> Response {
    (
        [
            (http::header::CONTENT_TYPE, "text/event-stream"),
            (http::header::CACHE_CONTROL, "no-cache"),
            (http::header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        body,
    )
        .into_response()
}
