//! Durable tasks (the slow path): a message answered by a task, and the task
//! operations (get, cancel, subscribe, list, push configs) over `agent_reach_tasks`.

use super::*;

// === Durable tasks (the slow path) ===

/// What a `SendMessage`'s `configuration` asks beyond a plain call.
pub(crate) struct Asked {
    /// Answer with the task at once (v1.0 `returnImmediately`, v0.3 `blocking: false`).
    pub(crate) task: bool,
    /// A push config: the task's callback.
    pub(crate) push: Option<agent_reach_task_store::Callback>,
    /// The history the answering Task shows (`configuration.historyLength`).
    pub(crate) history: Option<usize>,
}

impl Asked {
    pub(crate) fn of(params: &Value, wire: Wire) -> Result<Self, Refusal> {
        let configuration = params.get("configuration").filter(|value| !value.is_null());
        let Some(configuration) = configuration else {
            return Ok(Self {
                task: false,
                push: None,
                history: None,
            });
        };
        if !configuration.is_object() {
            return Err(invalid("`params.configuration` must be an object"));
        }
        let task = match wire {
            Wire::V1 => field(configuration, "returnImmediately").and_then(Value::as_bool) == Some(true),
            Wire::V03 => configuration.get("blocking").and_then(Value::as_bool) == Some(false),
        };
        let name = match wire {
            Wire::V1 => "taskPushNotificationConfig",
            Wire::V03 => "pushNotificationConfig",
        };
        let push = match field(configuration, name).filter(|value| !value.is_null()) {
            Some(config) => Some(push_config_of(config)?),
            None => None,
        };
        let history = history_length(field(configuration, "historyLength"), "configuration.historyLength")?;
        Ok(Self { task, push, history })
    }
}

/// A field of a request by its ProtoJSON name or, as ProtoJSON parsers must
/// also accept, its proto (snake_case) name.
pub(crate) fn field<'a>(object: &'a Value, camel: &str) -> Option<&'a Value> {
    object.get(camel).or_else(|| {
        let snake: String = camel
            .chars()
            .flat_map(|c| {
                let lower = c.to_ascii_lowercase();
                (c.is_ascii_uppercase().then_some('_').into_iter()).chain(std::iter::once(lower))
            })
            .collect();
        object.get(snake)
    })
}

/// Whether `text` may travel as an HTTP header value (visible ASCII and spaces, not at the ends).
fn header_safe(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 4096
        && text.trim() == text
        && text.bytes().all(|byte| byte == b' ' || byte.is_ascii_graphic())
}

/// A push config (A2A spec §4.3.1) as the task's callback: its `url`, its
/// `id` (the client's, or `default`), and the `token` and `authentication`
/// the receiver asked to be sent back (`X-A2A-Notification-Token`,
/// `Authorization: <scheme> <credentials>`). Every notification is also
/// signed with `X-Agent-Reach-Signature` (design §3.10.6). ProtoJSON's
/// snake_case names are read too.
pub(crate) fn push_config_of(config: &Value) -> Result<agent_reach_task_store::Callback, Refusal> {
    let config = field(config, "pushNotificationConfig")
        .filter(|inner| inner.is_object())
        .unwrap_or(config);
    let Some(url) = config.get("url").and_then(Value::as_str).filter(|url| !url.is_empty()) else {
        return Err(invalid(
            "a push notification config needs a `url` (where the task's outcome is POSTed)",
        ));
    };
    let text = |name: &str| -> Result<Option<String>, Refusal> {
        match field(config, name).filter(|value| !value.is_null()) {
            None => Ok(None),
            Some(Value::String(text)) if text.is_empty() => Ok(None),
            Some(Value::String(text)) if header_safe(text) => Ok(Some(text.clone())),
            Some(other) => Err(invalid(format!(
                "the push config's `{name}` must be printable ASCII without surrounding spaces (it travels as a header), not {other}"
            ))),
        }
    };
    let id = text("id")?.unwrap_or_else(|| PUSH_CONFIG_ID.to_string());
    if id.len() > 128 {
        return Err(invalid("a push config's `id` holds at most 128 characters"));
    }
    let token = text("token")?;
    let authentication = match field(config, "authentication").filter(|value| !value.is_null() && *value != &json!({}))
    {
        None => None,
        Some(authentication) => {
            // v1.0 names one `scheme`; v0.3 a list, `schemes`, of which the first is used.
            let scheme = authentication
                .get("scheme")
                .or_else(|| authentication.pointer("/schemes/0"))
                .and_then(Value::as_str)
                .filter(|scheme| {
                    !scheme.is_empty()
                        && scheme
                            .bytes()
                            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
                });
            let Some(scheme) = scheme else {
                return Err(invalid(
                    "the push config's `authentication` needs a `scheme`: an HTTP authentication scheme such as `Bearer`",
                ));
            };
            let credentials = match authentication.get("credentials").filter(|value| !value.is_null()) {
                None => None,
                Some(Value::String(credentials)) if header_safe(credentials) => Some(credentials.clone()),
                Some(_) => {
                    return Err(invalid(
                        "the push config's `authentication.credentials` must be printable ASCII (they travel in the Authorization header)",
                    ))
                }
            };
            Some(agent_reach_task_store::PushAuthentication {
                scheme: scheme.to_string(),
                credentials,
            })
        }
    };
    Ok(agent_reach_task_store::Callback {
        url: url.to_string(),
        secret_ref: None,
        a2a: Some(agent_reach_task_store::PushConfig {
            id,
            token,
            authentication,
        }),
    })
}

/// The id of a task's push config (`default` for a callback set by `POST /v1/tasks`).
pub(crate) fn config_id_of(callback: &agent_reach_task_store::Callback) -> &str {
    callback.a2a.as_ref().map_or(PUSH_CONFIG_ID, |push| push.id.as_str())
}

/// One JSON-RPC call on the task methods.
pub(crate) struct Rpc<'a> {
    pub(crate) api: &'a TaskApi,
    pub(crate) caller: &'a Caller,
    pub(crate) capability: &'a str,
    pub(crate) params: &'a Value,
    pub(crate) id: &'a Value,
    pub(crate) wire: Wire,
    /// Answering on the REST binding: streams carry bare `StreamResponse`s.
    pub(crate) rest: bool,
}

/// A2A's name for a durable task's state.
pub(crate) fn task_state(state: agent_reach_task_store::State) -> &'static str {
    use agent_reach_task_store::State;
    match state {
        State::Pending => "submitted",
        // A paused task (DESIGN §9) is still being worked on, from its caller's view.
        State::Running | State::Retrying | State::Paused => "working",
        State::Succeeded => "completed",
        State::Failed => "failed",
        State::Canceled => "canceled",
    }
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
    match wire {
        Wire::V1 => json!({ "messageId": trace::new_request_id(), "role": "ROLE_AGENT",
                "parts": [{ "text": text }], "metadata": { "error": error } }),
        Wire::V03 => json!({ "kind": "message", "messageId": trace::new_request_id(), "role": "agent",
                "parts": [{ "kind": "text", "text": text }], "metadata": { "error": error } }),
    }
}

/// A durable task's status: its state, when it entered it, and the error of a failed or canceled one.
pub(crate) fn task_status(task: &agent_reach_task_store::Task, wire: Wire) -> Value {
    let mut value = status(task_state(task.state), wire);
    value["timestamp"] = json!(rfc3339(task.updated_at_ms));
    if let Some(error) = task.result.as_ref().and_then(|result| result.get("error")) {
        if !error.is_null() {
            value["message"] = error_message(error, wire);
        }
    }
    value
}

/// The output artifact of a task that succeeded.
pub(crate) fn output_artifact(task: &agent_reach_task_store::Task, wire: Wire) -> Option<Value> {
    let output = task.result.as_ref()?.get("output")?.clone();
    Some(json!({ "artifactId": format!("{}-output", task.task_id), "parts": [data_part(output, wire)] }))
}

/// A task's history (spec §3.2.4): the message that started it, the only
/// message a task here has (its output is the artifact, an error the status
/// message). Its id is the task's request id (the sender's `messageId`).
pub(crate) fn history(task: &agent_reach_task_store::Task, wire: Wire) -> Vec<Value> {
    let payload = task.envelope.get("payload").cloned().unwrap_or(Value::Null);
    let context_id = task.session_id.clone().unwrap_or_default();
    let mut message = match wire {
        Wire::V1 => json!({ "messageId": task.request_id, "role": "ROLE_USER" }),
        Wire::V03 => json!({ "kind": "message", "messageId": task.request_id, "role": "user" }),
    };
    message["contextId"] = json!(context_id);
    message["taskId"] = json!(task.task_id);
    message["parts"] = json!([data_part(payload, wire)]);
    vec![message]
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
pub(crate) fn task_value(task: &agent_reach_task_store::Task, wire: Wire, shown: Shown) -> Value {
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
    let mut value = json!({ "id": task_id, "contextId": "", "status": status("submitted", wire) });
    if wire == Wire::V03 {
        value["kind"] = json!("task");
    }
    value
}

/// A status update for `task`.
pub(crate) fn status_update(task: &agent_reach_task_store::Task, wire: Wire) -> Value {
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
            update["final"] = json!(task.state.is_terminal());
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

/// A router error on a task method: A2A's code for it, else [`failed`]'s.
pub(crate) fn task_refusal(error: RouterError, operation: Operation) -> Refusal {
    let code = match (error.code, operation) {
        (Code::TaskNotFound, _) => TASK_NOT_FOUND,
        (Code::TaskConflict, Operation::Cancel) => TASK_NOT_CANCELABLE,
        (Code::TaskConflict, _) => UNSUPPORTED_OPERATION,
        (
            Code::TasksDisabled,
            Operation::PushSet | Operation::PushGet | Operation::PushList | Operation::PushDelete,
        ) => PUSH_NOT_SUPPORTED,
        (Code::TasksDisabled, Operation::Get | Operation::Cancel | Operation::Subscribe) => TASK_NOT_FOUND,
        (Code::TasksDisabled, _) => UNSUPPORTED_OPERATION,
        (Code::InvalidCallback, _) => INVALID_PARAMS,
        _ => 0,
    };
    Refusal {
        code,
        message: error.message.clone(),
        error: Some(error),
    }
}

impl Rpc<'_> {
    pub(crate) fn answer(&self, result: Value) -> Response {
        reply(
            StatusCode::OK,
            json!({ "jsonrpc": "2.0", "id": self.id, "result": result }),
        )
    }

    /// A required string parameter (`names`: its name in each wire, v1.0 first).
    pub(crate) fn string(&self, v1: &str, v03: &str) -> Result<String, Refusal> {
        let name = if self.wire == Wire::V1 { v1 } else { v03 };
        field(self.params, name)
            .and_then(Value::as_str)
            .filter(|value| !value.is_empty())
            .map(str::to_string)
            .ok_or_else(|| invalid(format!("`params.{name}` (the task's id) is required")))
    }

    /// The caller's task `task_id` of this capability.
    pub(crate) async fn owned(&self, task_id: &str, operation: Operation) -> Result<Owned, Refusal> {
        let owned = self
            .api
            .owned(self.caller, task_id)
            .await
            .map_err(|error| task_refusal(error, operation))?;
        match owned {
            Owned::Stored(task) if task.capability != self.capability => Err(task_refusal(
                RouterError::new(
                    Code::TaskNotFound,
                    format!(
                        "no task `{task_id}` of `{}` (it is a task of another capability)",
                        self.capability
                    ),
                ),
                operation,
            )),
            owned => Ok(owned),
        }
    }

    /// The caller's stored task `task_id` (a buffered one has no callback and cannot be canceled yet).
    pub(crate) async fn stored(
        &self,
        task_id: &str,
        operation: Operation,
    ) -> Result<agent_reach_task_store::Task, Refusal> {
        match self.owned(task_id, operation).await? {
            Owned::Stored(task) => Ok(*task),
            Owned::Buffered(_) => Err(task_refusal(
                RouterError::new(
                    Code::TaskStoreUnavailable,
                    format!(
                        "task `{task_id}` waits in the router's local buffer while Redis is unreachable; retry shortly"
                    ),
                ),
                operation,
            )),
        }
    }

    /// `SendMessage` / `SendStreamingMessage` as a durable task: submitted,
    /// then answered at once (`returnImmediately`), once it ended (a push
    /// config without it, within the call's deadline), or streamed.
    pub(crate) async fn submit(&self, message: MessageCall, asked: Asked, streamed: bool) -> Result<Response, Refusal> {
        let operation = if asked.push.is_some() {
            Operation::PushSet
        } else {
            Operation::Send
        };
        let shown = Shown {
            history: asked.history,
            ..Shown::WHOLE
        };
        let task_id = self
            .api
            .submit_call(self.caller, &message.checked, asked.push)
            .await
            .map_err(|error| task_refusal(error, operation))?;
        if streamed {
            let task = self.stored(&task_id, Operation::Subscribe).await?;
            return Ok(self.subscription(task));
        }
        if !asked.task {
            // Blocking with a push config: wait for the outcome, within the call's deadline.
            let timeout = message.checked.request.timeout_ms.map_or(
                self.api.service().tuning().default_timeout,
                std::time::Duration::from_millis,
            );
            let until = tokio::time::Instant::now() + timeout;
            loop {
                let task = self.stored(&task_id, Operation::Get).await?;
                if task.state.is_terminal() || tokio::time::Instant::now() >= until {
                    return Ok(self.answer(task_result(task_value(&task, self.wire, shown), self.wire, true)));
                }
                tokio::time::sleep(agent_reach_tasks::POLL).await;
            }
        }
        let task = match self.owned(&task_id, Operation::Get).await? {
            Owned::Stored(task) => task_value(&task, self.wire, shown),
            Owned::Buffered(task_id) => buffered_value(&task_id, self.wire),
        };
        Ok(self.answer(task_result(task, self.wire, true)))
    }

    /// A message naming a task (`message.taskId`) continues it (spec §3.4.2).
    /// The task must be the caller's, of this capability: any other is
    /// `-32001`. One that ended takes no more messages (`-32004`, §3.1.1);
    /// a running one takes none either, since no capability here asks for
    /// more input (`input-required`), so it is refused `-32004` too. `Ok`
    /// only when the message names no task.
    pub(crate) async fn continued(&self, message: &Value) -> Result<(), Refusal> {
        let Some(named) = field(message, "taskId").filter(|id| !id.is_null()) else {
            return Ok(());
        };
        let Some(task_id) = named.as_str().filter(|id| !id.is_empty()) else {
            return Err(invalid(
                "`params.message.taskId` must be a task id (a non-empty string), or absent to start a task",
            ));
        };
        let task = match self.owned(task_id, Operation::Get).await? {
            Owned::Stored(task) => task,
            Owned::Buffered(task_id) => {
                return Err(Refusal {
                    code: UNSUPPORTED_OPERATION,
                    message: format!("task `{task_id}` waits in the router's local buffer and takes no messages yet"),
                    error: None,
                })
            }
        };
        if let Some(context) = field(message, "contextId").and_then(Value::as_str) {
            if task.session_id.as_deref().is_some_and(|session| session != context) {
                return Err(invalid(format!(
                    "`params.message.contextId` `{context}` is not the context of task `{task_id}`; omit it or send the task's"
                )));
            }
        }
        let why = if task.state.is_terminal() {
            format!(
                "task `{task_id}` is {} and accepts no further messages; send one without `taskId` to start a task",
                task_state(task.state)
            )
        } else {
            format!(
                "task `{task_id}` is {} and has not asked for input: it accepts no message until it ends",
                task_state(task.state)
            )
        };
        Err(Refusal {
            code: UNSUPPORTED_OPERATION,
            message: why,
            error: None,
        })
    }

    pub(crate) async fn on_task(&self, operation: Operation) -> Result<Response, Refusal> {
        let wire = self.wire;
        match operation {
            Operation::Get => {
                let task_id = self.string("id", "id")?;
                let shown = Shown {
                    history: history_length(self.params.get("historyLength"), "historyLength")?,
                    ..Shown::WHOLE
                };
                Ok(self.answer(match self.owned(&task_id, operation).await? {
                    Owned::Stored(task) => task_value(&task, wire, shown),
                    Owned::Buffered(task_id) => buffered_value(&task_id, wire),
                }))
            }
            Operation::Cancel => {
                let task_id = self.string("id", "id")?;
                let task = self.stored(&task_id, operation).await?;
                let canceled = self.api.cancel(&task).await.map_err(|error| {
                    let mut refusal = task_refusal(error, operation);
                    if refusal.code == TASK_NOT_CANCELABLE {
                        refusal.message = format!(
                            "task `{task_id}` is {} and can no longer be canceled",
                            task_state(task.state)
                        );
                    }
                    refusal
                })?;
                Ok(self.answer(task_value(&canceled, wire, Shown::WHOLE)))
            }
            Operation::Subscribe => {
                let task_id = self.string("id", "id")?;
                let task = self.stored(&task_id, operation).await?;
                if task.state.is_terminal() {
                    return Err(Refusal {
                        code: UNSUPPORTED_OPERATION,
                        message: format!(
                            "task `{task_id}` is {}: a task that ended has no updates to subscribe to; read it with GetTask",
                            task_state(task.state)
                        ),
                        error: None,
                    });
                }
                Ok(self.subscription(task))
            }
            Operation::List => self.list().await,
            Operation::PushSet => {
                let task_id = self.string("taskId", "taskId")?;
                let callback = push_config_of(self.params)?;
                let task = self.stored(&task_id, operation).await?;
                if task.state.is_terminal() {
                    return Err(Refusal {
                        code: UNSUPPORTED_OPERATION,
                        message: format!(
                            "task `{task_id}` is {}: it sends no more notifications, so it takes no push config \
                             (read its outcome with GetTask)",
                            task_state(task.state)
                        ),
                        error: None,
                    });
                }
                // One config per task (it is the task's callback): a second id is
                // refused, not put in the first's place.
                if let Some(held) = task
                    .callback
                    .as_ref()
                    .filter(|held| config_id_of(held) != config_id_of(&callback))
                {
                    return Err(Refusal {
                        code: UNSUPPORTED_OPERATION,
                        message: format!(
                            "task `{task_id}` has push notification config `{}`; a task here has one: delete it first, or create `{}` again to replace it",
                            config_id_of(held),
                            config_id_of(held)
                        ),
                        error: None,
                    });
                }
                let task = self
                    .api
                    .set_callback(&task, Some(&callback))
                    .await
                    .map_err(|error| task_refusal(error, operation))?;
                Ok(self.answer(push_config_value(&task, wire).unwrap_or(Value::Null)))
            }
            Operation::PushGet => {
                let task_id = self.string("taskId", "id")?;
                let task = self.stored(&task_id, operation).await?;
                self.config_id(&task)?;
                Ok(self.answer(push_config_value(&task, wire).unwrap_or(Value::Null)))
            }
            Operation::PushList => {
                let task_id = self.string("taskId", "id")?;
                let task = self.stored(&task_id, operation).await?;
                let configs: Vec<Value> = push_config_value(&task, wire).into_iter().collect();
                Ok(self.answer(match wire {
                    Wire::V1 => json!({ "configs": configs, "nextPageToken": "" }),
                    Wire::V03 => json!(configs),
                }))
            }
            Operation::PushDelete => {
                let task_id = self.string("taskId", "id")?;
                let task = self.stored(&task_id, operation).await?;
                self.config_id(&task)?;
                self.api
                    .set_callback(&task, None)
                    .await
                    .map_err(|error| task_refusal(error, operation))?;
                Ok(self.answer(Value::Null))
            }
            Operation::Send | Operation::Stream | Operation::ExtendedCard => {
                Err(invalid(format!("{operation:?} is not a task method")))
            }
        }
    }

    /// The push config a get or delete names (`id`; v0.3
    /// `pushNotificationConfigId`) is `task`'s: else `-32001` (spec §3.1.8:
    /// a config that does not exist is TaskNotFound). Absent names the one there is.
    pub(crate) fn config_id(&self, task: &agent_reach_task_store::Task) -> Result<(), Refusal> {
        let name = if self.wire == Wire::V1 {
            "id"
        } else {
            "pushNotificationConfigId"
        };
        let named = field(self.params, name)
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        match (&task.callback, named) {
            (Some(_), None) => Ok(()),
            (Some(held), Some(named)) if config_id_of(held) == named => Ok(()),
            (held, named) => Err(Refusal {
                code: TASK_NOT_FOUND,
                message: match (held, named) {
                    (None, _) => format!(
                        "task `{}` has no push notification config (set one with CreateTaskPushNotificationConfig)",
                        task.task_id
                    ),
                    (Some(held), named) => format!(
                        "task `{}` has no push notification config `{}` (its one config is `{}`)",
                        task.task_id,
                        named.unwrap_or_default(),
                        config_id_of(held)
                    ),
                },
                error: None,
            }),
        }
    }

    /// `ListTasks`: the caller's tasks of this capability, newest first,
    /// filtered by `contextId` and `status`, paged by an offset token.
    pub(crate) async fn list(&self) -> Result<Response, Refusal> {
        let params = self.params;
        let after = match params.get("statusTimestampAfter").filter(|value| !value.is_null()) {
            None => None,
            Some(value) => Some(value.as_str().and_then(parse_rfc3339).ok_or_else(|| {
                invalid(format!(
                    "`statusTimestampAfter` {value} is not an RFC 3339 timestamp (e.g. \"2026-12-01T10:00:00Z\")"
                ))
            })?),
        };
        let page_size = match params.get("pageSize").filter(|value| !value.is_null()) {
            None => LIST_PAGE,
            Some(value) => match value.as_u64() {
                Some(size @ 1..=100) => size as usize,
                _ => {
                    return Err(invalid(format!(
                        "`pageSize` must be an integer within 1..=100 (default {LIST_PAGE}), not {value}"
                    )))
                }
            },
        };
        let offset = match params.get("pageToken").filter(|value| !value.is_null()) {
            None => 0,
            Some(Value::String(token)) if token.is_empty() => 0,
            Some(token) => token
                .as_str()
                .and_then(|token| token.parse::<usize>().ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "`pageToken` {token} is not one this agent handed out (pass `nextPageToken`)"
                    ))
                })?,
        };
        let context = match params.get("contextId").filter(|value| !value.is_null()) {
            None => None,
            Some(Value::String(id)) => Some(id.as_str()).filter(|id| !id.is_empty()),
            Some(other) => return Err(invalid(format!("`contextId` must be a string, not {other}"))),
        };
        let wanted = status_filter(params.get("status"))?;
        let artifacts = match params.get("includeArtifacts").filter(|value| !value.is_null()) {
            None => false,
            Some(Value::Bool(include)) => *include,
            Some(other) => {
                return Err(invalid(format!(
                    "`includeArtifacts` must be true or false, not {other}"
                )))
            }
        };
        // A list shows no history unless asked (the spec leaves the default to the agent).
        let history = history_length(params.get("historyLength"), "historyLength")?.unwrap_or(0);
        let tasks = if self.api.tasks_enabled() {
            self.api
                .list(self.caller)
                .await
                .map_err(|error| task_refusal(error, Operation::List))?
        } else {
            Vec::new()
        };
        let mut matching: Vec<_> = tasks
            .iter()
            .filter(|task| task.capability == self.capability)
            .filter(|task| context.is_none_or(|context| task.session_id.as_deref() == Some(context)))
            .filter(|task| after.is_none_or(|after| task.updated_at_ms >= after))
            .filter(|task| {
                wanted.is_none_or(|wanted| {
                    wanted == format!("TASK_STATE_{}", task_state(task.state).to_ascii_uppercase())
                })
            })
            .collect();
        // Most recently updated first (spec §3.1.4); ties newest submitted first.
        matching.sort_by_key(|task| std::cmp::Reverse(task.updated_at_ms));
        let shown = Shown {
            artifacts,
            history: Some(history),
        };
        let page: Vec<Value> = matching
            .iter()
            .skip(offset)
            .take(page_size)
            .map(|task| task_value(task, self.wire, shown))
            .collect();
        let next = if offset + page.len() < matching.len() {
            (offset + page.len()).to_string()
        } else {
            String::new()
        };
        Ok(self.answer(json!({
            "tasks": page,
            "nextPageToken": next,
            "pageSize": page_size,
            "totalSize": matching.len(),
        })))
    }

    /// SSE of the task's updates: the Task now, a status update per state it
    /// enters, its output artifact when it succeeded, ending with it.
    pub(crate) fn subscription(&self, task: agent_reach_task_store::Task) -> Response {
        let (api, wire) = (self.api.clone(), self.wire);
        let id = (!self.rest).then(|| self.id.clone());
        let opening = sse_result(
            id.as_ref(),
            task_result(task_value(&task, wire, Shown::WHOLE), wire, true),
        );
        // (the last task seen, events still to send, done)
        let start = (task, vec![opening], false);
        let body = futures::stream::unfold(start, move |(last, mut queued, done)| {
            let (api, id) = (api.clone(), id.clone());
            async move {
                if !queued.is_empty() {
                    let event = queued.remove(0);
                    return Some((Ok::<_, std::convert::Infallible>(event), (last, queued, done)));
                }
                if done || last.state.is_terminal() {
                    return None;
                }
                loop {
                    tokio::time::sleep(agent_reach_tasks::POLL).await;
                    let task = match api.current(&last.task_id).await {
                        Ok(task) => task,
                        Err(error) => {
                            let failure = match &id {
                                Some(id) => rpc_error(id, INTERNAL_ERROR, &error.message, Some(&error)),
                                None => {
                                    rest_error(
                                        &rpc_error(&Value::Null, INTERNAL_ERROR, &error.message, Some(&error)),
                                        StatusCode::OK,
                                    )
                                    .1
                                }
                            };
                            let event = agent_reach_serving::sse::data(&failure.to_string());
                            return Some((Ok(event), (last, queued, true)));
                        }
                    };
                    if task.state == last.state && task.transitions.len() == last.transitions.len() {
                        continue;
                    }
                    if task.state == agent_reach_task_store::State::Succeeded {
                        if let Some(artifact) = output_artifact(&task, wire) {
                            let update = json!({
                                "taskId": task.task_id, "contextId": task.session_id.clone().unwrap_or_default(),
                                "artifact": artifact, "append": false, "lastChunk": true,
                            });
                            queued.push(sse_result(id.as_ref(), artifact_update(update, wire)));
                        }
                    }
                    queued.push(sse_result(id.as_ref(), status_update(&task, wire)));
                    let event = queued.remove(0);
                    return Some((Ok(event), (task, queued, false)));
                }
            }
        });
        event_stream(Body::from_stream(body))
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

/// A task's push config (its callback), or `None` without one. The token
/// is the client's own and shown; the credentials are write-only.
pub(crate) fn push_config_value(task: &agent_reach_task_store::Task, wire: Wire) -> Option<Value> {
    let callback = task.callback.as_ref()?;
    let mut config = json!({ "id": config_id_of(callback), "url": callback.url });
    if let Some(push) = &callback.a2a {
        if let Some(token) = &push.token {
            config["token"] = json!(token);
        }
        if let Some(authentication) = &push.authentication {
            config["authentication"] = match wire {
                Wire::V1 => json!({ "scheme": authentication.scheme }),
                Wire::V03 => json!({ "schemes": [authentication.scheme] }),
            };
        }
    }
    Some(match wire {
        Wire::V1 => {
            config["taskId"] = json!(task.task_id);
            config
        }
        Wire::V03 => json!({ "taskId": task.task_id, "pushNotificationConfig": config }),
    })
}
