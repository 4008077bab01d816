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
}

impl Asked {
    pub(crate) fn of(params: &Value, wire: Wire) -> Result<Self, Refusal> {
        let configuration = params.get("configuration").filter(|value| !value.is_null());
        let Some(configuration) = configuration else {
            return Ok(Self {
                task: false,
                push: None,
            });
        };
        if !configuration.is_object() {
            return Err(invalid("`params.configuration` must be an object"));
        }
        let task = match wire {
            Wire::V1 => configuration.get("returnImmediately").and_then(Value::as_bool) == Some(true),
            Wire::V03 => configuration.get("blocking").and_then(Value::as_bool) == Some(false),
        };
        let field = match wire {
            Wire::V1 => "taskPushNotificationConfig",
            Wire::V03 => "pushNotificationConfig",
        };
        let push = match configuration.get(field).filter(|value| !value.is_null()) {
            Some(config) => Some(push_config_of(config)?),
            None => None,
        };
        Ok(Self { task, push })
    }
}

/// A push config as a callback: its `url`. A `token` or `authentication` is
/// refused rather than ignored: the callback proves itself with the router's
/// HMAC signature instead (`X-Agent-Reach-Signature`, design §3.10.6).
pub(crate) fn push_config_of(config: &Value) -> Result<agent_reach_task_store::Callback, Refusal> {
    let config = config.get("pushNotificationConfig").unwrap_or(config);
    let Some(url) = config.get("url").and_then(Value::as_str).filter(|url| !url.is_empty()) else {
        return Err(invalid(
            "a push notification config needs a `url` (where the task's outcome is POSTed)",
        ));
    };
    let present = |name: &str| {
        config
            .get(name)
            .is_some_and(|value| !value.is_null() && value != "" && value != &json!({}))
    };
    if present("token") || present("authentication") {
        return Err(invalid(
            "push notifications here carry no token and use no authentication scheme: each is signed with \
             `X-Agent-Reach-Signature: t=<unix s>,v1=<HMAC-SHA256 of \"<t>.<body>\">` under the router's callback \
             secret; drop `token` and `authentication` and verify the signature",
        ));
    }
    Ok(agent_reach_task_store::Callback {
        url: url.to_string(),
        secret_ref: None,
    })
}

/// One JSON-RPC call on the task methods.
pub(crate) struct Rpc<'a> {
    pub(crate) api: &'a TaskApi,
    pub(crate) caller: &'a Caller,
    pub(crate) capability: &'a str,
    pub(crate) params: &'a Value,
    pub(crate) id: &'a Value,
    pub(crate) wire: Wire,
}

/// A2A's name for a durable task's state.
pub(crate) fn task_state(state: agent_reach_task_store::State) -> &'static str {
    use agent_reach_task_store::State;
    match state {
        State::Pending => "submitted",
        State::Running | State::Retrying => "working",
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

/// A durable task as an A2A Task.
pub(crate) fn task_value(task: &agent_reach_task_store::Task, wire: Wire, artifacts: bool) -> Value {
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
    if artifacts {
        if let Some(artifact) = output_artifact(task, wire) {
            value["artifacts"] = json!([artifact]);
        }
    }
    if wire == Wire::V03 {
        value["kind"] = json!("task");
    }
    value
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
        self.params
            .get(name)
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
                    return Ok(self.answer(task_result(task_value(&task, self.wire, true), self.wire, true)));
                }
                tokio::time::sleep(agent_reach_tasks::POLL).await;
            }
        }
        let task = match self.owned(&task_id, Operation::Get).await? {
            Owned::Stored(task) => task_value(&task, self.wire, true),
            Owned::Buffered(task_id) => buffered_value(&task_id, self.wire),
        };
        Ok(self.answer(task_result(task, self.wire, true)))
    }

    pub(crate) async fn on_task(&self, operation: Operation) -> Result<Response, Refusal> {
        let wire = self.wire;
        match operation {
            Operation::Get => {
                let task_id = self.string("id", "id")?;
                Ok(self.answer(match self.owned(&task_id, operation).await? {
                    Owned::Stored(task) => task_value(&task, wire, true),
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
                Ok(self.answer(task_value(&canceled, wire, true)))
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
                self.config_id()?;
                match push_config_value(&task, wire) {
                    Some(config) => Ok(self.answer(config)),
                    None => Err(invalid(format!(
                        "task `{task_id}` has no push notification config (set one with CreateTaskPushNotificationConfig)"
                    ))),
                }
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
                self.config_id()?;
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

    /// The push config id a get or delete names: absent or [`PUSH_CONFIG_ID`].
    pub(crate) fn config_id(&self) -> Result<(), Refusal> {
        let name = if self.wire == Wire::V1 {
            "id"
        } else {
            "pushNotificationConfigId"
        };
        match self.params.get(name).and_then(Value::as_str) {
            None | Some("") | Some(PUSH_CONFIG_ID) => Ok(()),
            Some(other) => Err(invalid(format!(
                "no push notification config `{other}`: a task has one, `{PUSH_CONFIG_ID}`"
            ))),
        }
    }

    /// `ListTasks`: the caller's tasks of this capability, newest first,
    /// filtered by `contextId` and `status`, paged by an offset token.
    pub(crate) async fn list(&self) -> Result<Response, Refusal> {
        let params = self.params;
        if params.get("statusTimestampAfter").is_some_and(|value| !value.is_null()) {
            return Err(invalid(
                "`statusTimestampAfter` is not supported here; filter by `status` or `contextId`",
            ));
        }
        let page_size = match params.get("pageSize").filter(|value| !value.is_null()) {
            None => LIST_PAGE,
            Some(value) => match value.as_u64() {
                Some(0) => LIST_PAGE,
                Some(size @ 1..=100) => size as usize,
                _ => return Err(invalid("`pageSize` must be an integer within 1..=100")),
            },
        };
        let offset = match params.get("pageToken").and_then(Value::as_str) {
            None | Some("") => 0,
            Some(token) => token.parse::<usize>().map_err(|_| {
                invalid(format!(
                    "`pageToken` `{token}` is not one this agent handed out (pass `nextPageToken`)"
                ))
            })?,
        };
        let context = params
            .get("contextId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let wanted = match params.get("status").and_then(Value::as_str) {
            None | Some("TASK_STATE_UNSPECIFIED") | Some("") => None,
            Some(state) => Some(state.to_string()),
        };
        let artifacts = params.get("includeArtifacts").and_then(Value::as_bool) == Some(true);
        let tasks = if self.api.tasks_enabled() {
            self.api
                .list(self.caller)
                .await
                .map_err(|error| task_refusal(error, Operation::List))?
        } else {
            Vec::new()
        };
        let matching: Vec<_> = tasks
            .iter()
            .filter(|task| task.capability == self.capability)
            .filter(|task| context.is_none_or(|context| task.session_id.as_deref() == Some(context)))
            .filter(|task| {
                wanted.as_deref().is_none_or(|wanted| {
                    wanted == format!("TASK_STATE_{}", task_state(task.state).to_ascii_uppercase())
                })
            })
            .collect();
        let page: Vec<Value> = matching
            .iter()
            .skip(offset)
            .take(page_size)
            .map(|task| task_value(task, self.wire, artifacts))
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
        let (api, id, wire) = (self.api.clone(), self.id.clone(), self.wire);
        let opening = sse_result(&id, task_result(task_value(&task, wire, true), wire, true));
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
                            let event = agent_reach_serving::sse::data(
                                &rpc_error(&id, INTERNAL_ERROR, &error.message, Some(&error)).to_string(),
                            );
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
                            queued.push(sse_result(&id, artifact_update(update, wire)));
                        }
                    }
                    queued.push(sse_result(&id, status_update(&task, wire)));
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

/// A task's push config (its callback), or `None` without one.
pub(crate) fn push_config_value(task: &agent_reach_task_store::Task, wire: Wire) -> Option<Value> {
    let callback = task.callback.as_ref()?;
    Some(match wire {
        Wire::V1 => json!({ "taskId": task.task_id, "id": PUSH_CONFIG_ID, "url": callback.url }),
        Wire::V03 => json!({ "taskId": task.task_id,
            "pushNotificationConfig": { "id": PUSH_CONFIG_ID, "url": callback.url } }),
    })
}
