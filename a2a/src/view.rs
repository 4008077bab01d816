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

/// Epoch milliseconds as RFC 3339 in UTC (`2026-12-01T21:43:21.123Z`).
pub(crate) fn rfc3339(epoch_ms: u64) -> String {
    let (days, ms_of_day) = (epoch_ms / 86_400_000, epoch_ms % 86_400_000);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (hours, minutes) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (seconds, millis) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hours:02}:{minutes:02}:{seconds:02}.{millis:03}Z")
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

/// An RFC 3339 timestamp (ProtoJSON's `Timestamp`: `2026-12-01T21:43:21.123Z`,
/// fractional seconds and a `±hh:mm` offset optional) as epoch
/// milliseconds; one before 1970 is 0. `None` when it is not one.
pub(crate) fn parse_rfc3339(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|byte| byte.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || !matches!(bytes[10], b'T' | b't') {
        return None;
    }
    if bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hours, minutes, seconds) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let mut at = 19;
    let mut millis = 0i64;
    if bytes[at] == b'.' {
        let start = at + 1;
        let end = start + bytes[start..].iter().take_while(|byte| byte.is_ascii_digit()).count();
        if end == start {
            return None;
        }
        // Milliseconds: the first three digits, padded.
        let fraction: String = text[start..end].chars().chain("00".chars()).take(3).collect();
        millis = fraction.parse().ok()?;
        at = end;
    }
    let offset_minutes = match &text[at..] {
        "Z" | "z" => 0,
        zone if zone.len() == 6 && matches!(zone.as_bytes()[0], b'+' | b'-') && zone.as_bytes()[3] == b':' => {
            let (hours, minutes) = (digits(at + 1..at + 3)?, digits(at + 4..at + 6)?);
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            sign * (hours * 60 + minutes)
        }
        _ => return None,
    };
    let leap = |year: i64| (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let valid = (1..=12).contains(&month)
        && day >= 1
        && day <= month_days[usize::try_from(month - 1).ok()?]
        && hours < 24
        && minutes < 60
        && seconds < 61;
    if !valid {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms = ((days * 24 + hours) * 60 + minutes - offset_minutes) * 60_000 + seconds * 1000 + millis;
    Some(u64::try_from(ms).unwrap_or(0))
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
