//! Durable tasks (the slow path): a message answered by a task, a message
//! continuing a task that asked for input, and the task operations (get,
//! cancel, subscribe, list) over `agent_reach_tasks`; push configs are in
//! `push.rs`, how a task shows in `view.rs`.

use super::*;
use agent_reach_task_store::{State, Task};

/// What a `SendMessage`'s `configuration` asks beyond a plain call.
pub(crate) struct Asked {
    /// Answer with the task at once (v1.0 `returnImmediately`, v0.3 `blocking: false`).
    pub(crate) task: bool,
    /// A push config, kept with the task (`push.rs`).
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
    /// then answered as [`Rpc::answer_task`] says.
    pub(crate) async fn submit(&self, message: MessageCall, asked: Asked, streamed: bool) -> Result<Response, Refusal> {
        let operation = if asked.push.is_some() {
            Operation::PushSet
        } else {
            Operation::Send
        };
        let task_id = self
            .api
            .submit_call(self.caller, &message.checked, asked.push.clone())
            .await
            .map_err(|error| task_refusal(error, operation))?;
        self.answer_task(&task_id, &asked, streamed, &message).await
    }

    /// A message's answer once it made or continued durable task `task_id`:
    /// streamed (the Task, then its updates until it settles), at once
    /// (`returnImmediately`), or (a blocking send, spec §3.2.2) once it
    /// ended or asks for input, within the call's deadline.
    async fn answer_task(
        &self,
        task_id: &str,
        asked: &Asked,
        streamed: bool,
        message: &MessageCall,
    ) -> Result<Response, Refusal> {
        let shown = Shown {
            history: asked.history,
            ..Shown::WHOLE
        };
        if streamed {
            let task = self.stored(task_id, Operation::Subscribe).await?;
            return Ok(self.subscription(task));
        }
        if !asked.task {
            let timeout = message.checked.request.timeout_ms.map_or(
                self.api.service().tuning().default_timeout,
                std::time::Duration::from_millis,
            );
            let until = tokio::time::Instant::now() + timeout;
            loop {
                let task = self.stored(task_id, Operation::Get).await?;
                if task.state.is_settled() || tokio::time::Instant::now() >= until {
                    return Ok(self.answer(task_result(task_value(&task, self.wire, shown), self.wire, true)));
                }
                tokio::time::sleep(agent_reach_tasks::POLL).await;
            }
        }
        let task = match self.owned(task_id, Operation::Get).await? {
            Owned::Stored(task) => task_value(&task, self.wire, shown),
            Owned::Buffered(task_id) => buffered_value(&task_id, self.wire),
        };
        Ok(self.answer(task_result(task, self.wire, true)))
    }

    /// The task a message names (`message.taskId`, spec §3.4.2), which it
    /// continues: `None` when it names none (the message starts a task). The
    /// task must be the caller's, of this capability: any other is `-32001`;
    /// a `contextId` other than the task's is refused (§3.4.3). Only a task
    /// waiting for input takes a message: one that ended is `-32004`
    /// (§3.1.1), one still working `-32004` too.
    pub(crate) async fn continued(&self, message: &Value) -> Result<Option<Task>, Refusal> {
        let Some(named) = field(message, "taskId").filter(|id| !id.is_null()) else {
            return Ok(None);
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
        if let Some(context) = field(message, "contextId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
        {
            if task.session_id.as_deref().is_some_and(|session| session != context) {
                return Err(invalid(format!(
                    "`params.message.contextId` `{context}` is not the context of task `{task_id}`; omit it or send the task's"
                )));
            }
        }
        let why = match task.state {
            State::InputRequired => return Ok(Some(*task)),
            state if state.is_terminal() => format!(
                "task `{task_id}` is {} and accepts no further messages; send one without `taskId` to start a task",
                task_state(state)
            ),
            state => format!(
                "task `{task_id}` is {} and has not asked for input: it takes a message once it does",
                task_state(state)
            ),
        };
        Err(Refusal {
            code: UNSUPPORTED_OPERATION,
            message: why,
            error: None,
        })
    }

    /// A message continuing `task` (waiting for input): its payload checked
    /// against the capability's input schema now (a mismatch is the
    /// caller's, and leaves the task waiting), a push config it carries
    /// added, then the task queued again with it; answered as a send is.
    pub(crate) async fn resume(
        &self,
        task: Task,
        message: MessageCall,
        asked: Asked,
        streamed: bool,
    ) -> Result<Response, Refusal> {
        let request = &message.checked.request;
        self.api
            .service()
            .check_payload(&task.capability, &request.payload)
            .map_err(Refusal::stable)?;
        if let Some(config) = &asked.push {
            self.api
                .put_push_config(&task, config)
                .await
                .map_err(|error| task_refusal(error, Operation::PushSet))?;
        }
        let message_id = request.request_id.clone().unwrap_or_else(trace::new_request_id);
        self.api
            .continue_task(self.caller, &task, &message_id, request.payload.clone())
            .await
            .map_err(|error| {
                let mut refusal = task_refusal(error, Operation::Send);
                if refusal.code == UNSUPPORTED_OPERATION {
                    // Another message continued it first: it is no longer waiting.
                    refusal.message = format!(
                        "task `{}` no longer waits for input (another message continued it): {}",
                        task.task_id, refusal.message
                    );
                }
                refusal
            })?;
        self.answer_task(&task.task_id, &asked, streamed, &message).await
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
            Operation::PushSet => self.push_set().await,
            Operation::PushGet => self.push_get().await,
            Operation::PushList => self.push_list().await,
            Operation::PushDelete => self.push_delete().await,
            Operation::Send | Operation::Stream | Operation::ExtendedCard => {
                Err(invalid(format!("{operation:?} is not a task method")))
            }
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

    /// SSE of the task's updates: the Task now, then a status update per
    /// state it enters (its output artifact first when it succeeded), ending
    /// once it ends or asks for input after the subscription began (a task
    /// already waiting for input is followed until its next settling).
    pub(crate) fn subscription(&self, task: Task) -> Response {
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
                    if task.state == State::Succeeded {
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
                    let settled = task.state.is_settled();
                    return Some((Ok(event), (task, queued, settled)));
                }
            }
        });
        event_stream(Body::from_stream(body))
    }
}
