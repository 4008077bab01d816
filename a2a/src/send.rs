//! A message answered now: `SendMessage` through `RouterService::invoke`,
//! `SendStreamingMessage` through `RouterService::stream`, in the request's wire shape.

use super::*;

pub(crate) async fn send(
    api: &TaskApi,
    caller: &Caller,
    headers: &impl HeaderLookup,
    call: MessageCall,
    received: clock::Now,
    id: &Value,
    wire: Wire,
) -> Answer {
    let service = api.service();
    let call = Call::begin(Door::A2a, caller.clone(), call.checked, headers, received);
    let result = service.invoke(&call).await;
    let success = match result {
        Ok(success) => success,
        Err(failure) => {
            return match input_required(&failure.error) {
                Some(question) => {
                    let task = paused_task(api, caller, &call.checked.request, None, question, wire).await;
                    json_reply(
                        StatusCode::OK,
                        json!({ "jsonrpc": "2.0", "id": id, "result": task_result(task, wire, true) }),
                    )
                }
                None => failed(id, &failure.error).into(),
            }
        }
    };
    let sent = Sent {
        id,
        wire,
        message_id: &trace::new_request_id(),
        context_id: call.checked.request.session_id.as_deref().unwrap_or_default(),
        output: success.output.as_deref().map_or("null", |raw| raw.get()),
        agent_id: &success.agent_id,
        capability_version: &success.capability_version,
        attempts: success.attempts,
        request_id: call.request_id(),
    };
    match sent.to_vec() {
        Ok(body) => Answer::Json {
            status: StatusCode::OK,
            body,
        },
        // Writing cannot fail (an id is a string or a number, checked on
        // reading); if it did, the caller gets JSON-RPC's internal error.
        Err(error) => json_reply(
            StatusCode::OK,
            rpc_error(
                id,
                INTERNAL_ERROR,
                &format!("the answer cannot be written: {error}"),
                None,
            ),
        ),
    }
}

/// REST `message:send` answered now (the common call, read without a
/// JSON tree): the bare `{"message": …}` (`application/a2a+json`); an agent
/// asking for input answers `{"task": …}` ([`paused_task`]); a failure is
/// the binding's `google.rpc.Status`.
pub(crate) async fn send_rest(
    api: &TaskApi,
    caller: &Caller,
    headers: &impl HeaderLookup,
    call: MessageCall,
    received: clock::Now,
) -> Answer {
    let service = api.service();
    let call = Call::begin(Door::A2a, caller.clone(), call.checked, headers, received);
    let success = match service.invoke(&call).await {
        Ok(success) => success,
        Err(failure) => {
            return match input_required(&failure.error) {
                Some(question) => {
                    let task = paused_task(api, caller, &call.checked.request, None, question, Wire::V1).await;
                    Answer::Typed {
                        status: StatusCode::OK,
                        content_type: A2A_JSON,
                        body: json!({ "task": task }).to_string().into_bytes(),
                    }
                }
                None => translate(failed(&Value::Null, &failure.error).into()).await.into(),
            }
        }
    };
    let sent = Sent {
        id: &Value::Null,
        wire: Wire::V1,
        message_id: &trace::new_request_id(),
        context_id: call.checked.request.session_id.as_deref().unwrap_or_default(),
        output: success.output.as_deref().map_or("null", |raw| raw.get()),
        agent_id: &success.agent_id,
        capability_version: &success.capability_version,
        attempts: success.attempts,
        request_id: call.request_id(),
    };
    Answer::Typed {
        status: StatusCode::OK,
        content_type: A2A_JSON,
        body: sent.to_rest_vec(),
    }
}

/// `SendMessage`'s answer: a Message whose one DataPart is the agent's
/// output, written field by field ([`agent_reach_pipeline::json::Object`]) in the request's
/// wire shape, equal to the `json!` shapes of [`data_part`] and the task
/// answers (a test holds them equal).
pub(crate) struct Sent<'a> {
    pub(crate) id: &'a Value,
    pub(crate) wire: Wire,
    pub(crate) message_id: &'a str,
    pub(crate) context_id: &'a str,
    /// The output as the agent wrote it (JSON).
    pub(crate) output: &'a str,
    pub(crate) agent_id: &'a str,
    pub(crate) capability_version: &'a str,
    pub(crate) attempts: u32,
    pub(crate) request_id: &'a str,
}

impl Sent<'_> {
    pub(crate) fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256 + self.output.len());
        let mut answer = agent_reach_pipeline::json::Object::start(&mut out);
        answer.str("jsonrpc", "2.0");
        answer.value("id", self.id)?;
        let mut result = answer.object("result");
        match self.wire {
            // v1.0 wraps the Message (`{"message": …}`); v0.3's result is it.
            Wire::V1 => {
                let mut message = result.object("message");
                self.message(&mut message);
                message.end();
            }
            Wire::V03 => self.message(&mut result),
        }
        result.end();
        answer.end();
        Ok(out)
    }

    /// The REST binding's answer (spec §11): the bare `SendMessageResponse`, `{"message": …}`.
    pub(crate) fn to_rest_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(224 + self.output.len());
        let mut answer = agent_reach_pipeline::json::Object::start(&mut out);
        let mut message = answer.object("message");
        self.message(&mut message);
        message.end();
        answer.end();
        out
    }

    /// The Message's fields, into `message`.
    pub(crate) fn message(&self, message: &mut agent_reach_pipeline::json::Object<'_>) {
        let v03 = self.wire == Wire::V03;
        if v03 {
            message.str("kind", "message");
        }
        message.str("messageId", self.message_id);
        message.str("contextId", self.context_id);
        message.str("role", if v03 { "agent" } else { "ROLE_AGENT" });
        let mut part = message.array_of_one("parts");
        if v03 {
            part.str("kind", "data");
        }
        // v0.3's DataPart holds an object: anything else is `{"result": …}`.
        if v03 && !self.output.starts_with('{') {
            let mut wrapped = part.object("data");
            wrapped.raw("result", Some(self.output));
            wrapped.end();
        } else {
            part.raw("data", Some(self.output));
        }
        part.end();
        let mut metadata = message.object("metadata");
        metadata.str("agent_id", self.agent_id);
        metadata.str("capability_version", self.capability_version);
        metadata.u64("attempts", u64::from(self.attempts));
        metadata.str("request_id", self.request_id);
        metadata.end();
    }
}

/// One SSE event of a stream answer: a JSON-RPC result to the request's
/// `id`, or, on the REST binding (`None`), the bare `StreamResponse`.
pub(crate) fn sse_result(id: Option<&Value>, result: Value) -> bytes::Bytes {
    match id {
        Some(id) => {
            agent_reach_serving::sse::data(&json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string())
        }
        None => agent_reach_serving::sse::data(&result.to_string()),
    }
}

/// A call answered at once whose agent asked for more input (`question`):
/// a Task in `input-required`, its status message the question. With the
/// slow path it is kept as a durable task (`task_id`, or a fresh id) that a
/// message naming it continues; without it (or with its store unreachable)
/// it is answered all the same, its metadata saying it cannot be continued.
pub(crate) async fn paused_task(
    api: &TaskApi,
    caller: &Caller,
    request: &agent_reach_proto::envelope::InvokeRequest,
    task_id: Option<String>,
    question: &str,
    wire: Wire,
) -> Value {
    let task_id = task_id.unwrap_or_else(|| api.fresh_task_id(&request.capability));
    let why = if api.tasks_enabled() {
        let kept = match api.record_paused(caller, request, &task_id, question).await {
            Ok(stored) => api.current(&stored).await,
            Err(error) => Err(error),
        };
        match kept {
            Ok(task) => return task_value(&task, wire, Shown::WHOLE),
            Err(error) => {
                tracing::warn!(message = "A task asking for input could not be kept; answered as one that cannot be continued.", %task_id, %error);
                format!(
                    "the task store could not keep it ({}): send the whole input again in a new message",
                    error.message
                )
            }
        }
    } else {
        "this router keeps no tasks (it runs without --redis): send the whole input again in a new message".to_string()
    };
    let context_id = request.session_id.clone().unwrap_or_default();
    let message_id = request.request_id.clone().unwrap_or_default();
    let mut question = agent_text(&trace::new_request_id(), question, wire);
    let mut first = user_data(&message_id, request.payload.clone(), wire);
    for message in [&mut question, &mut first] {
        message["taskId"] = json!(task_id);
        message["contextId"] = json!(context_id);
    }
    let mut state = status(A2aState::InputRequired, wire);
    state["message"] = question;
    state["timestamp"] = json!(rfc3339(clock::epoch_ms()));
    let mut value = json!({
        "id": task_id,
        "contextId": context_id,
        "status": state,
        "history": [first],
        "artifacts": [],
        "metadata": { "capability": request.capability, "request_id": message_id, "continuable": false, "note": why },
    });
    if wire == Wire::V03 {
        value["kind"] = json!("task");
    }
    value
}

/// `SendStreamingMessage` answered now: the agent's events relayed as a
/// task's artifact chunks; an agent asking for input instead answers the
/// task in `input-required` ([`paused_task`]), and the stream ends.
pub(crate) async fn send_streaming(
    api: &TaskApi,
    caller: &Caller,
    headers: &impl HeaderLookup,
    call: MessageCall,
    received: clock::Now,
    id: Option<Value>,
    wire: Wire,
) -> Response {
    // Kept for a task asking for input (the call is the stream's).
    let request = call.checked.request.clone();
    let call = Call::begin(Door::A2a, caller.clone(), call.checked, headers, received);
    // The server's id for the task (spec §3.4.2), not the sender's `messageId`
    // (which stays the call's request id): a task id of the slow path, under
    // which it is kept if the agent asks for input.
    let task_id = api.fresh_task_id(&request.capability);
    let context_id = call.checked.request.session_id.clone().unwrap_or_default();
    let opened = match api.service().stream(call).await {
        Ok(opened) => opened,
        Err(failure) => match input_required(&failure.error) {
            Some(question) => {
                let task = paused_task(api, caller, &request, Some(task_id), question, wire).await;
                let event = sse_result(id.as_ref(), task_result(task, wire, true));
                let body = futures::stream::iter([Ok::<_, std::convert::Infallible>(event)]);
                return event_stream(Body::from_stream(body));
            }
            None => return refused_stream(id.as_ref(), &failure.error),
        },
    };
    let working = status(A2aState::Working, wire);
    let first = match wire {
        Wire::V1 => json!({ "task": { "id": task_id, "contextId": context_id, "status": working } }),
        Wire::V03 => json!({ "kind": "task", "id": task_id, "contextId": context_id, "status": working }),
    };
    let opening = sse_result(id.as_ref(), first);
    let state = Relay {
        id,
        task_id,
        context_id,
        wire,
        stream: Some(opened),
        held: None,
        chunks: 0,
        queued: std::collections::VecDeque::from([opening]),
    };
    let body = futures::stream::unfold(state, |mut relay| async move {
        let event = relay.step().await?;
        Some((Ok::<_, std::convert::Infallible>(event), relay))
    });
    event_stream(Body::from_stream(body))
}

/// How long a streamed artifact chunk waits for the agent's next event or
/// end, so that the stream's last chunk says `lastChunk: true` (spec
/// §4.2.2): an agent ending within this of its last event (every SDK's
/// does) has it marked; one pausing longer leaves that chunk `false`, and
/// the `completed` status update that follows closes the artifact.
pub(crate) const LAST_CHUNK_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// A streamed message's relay: the agent's events as artifact chunks of
/// one artifact, each held until the next item shows whether it is the last.
pub(crate) struct Relay {
    /// The JSON-RPC request's id; `None` on the REST binding.
    id: Option<Value>,
    task_id: String,
    context_id: String,
    wire: Wire,
    /// `None` once the agent's stream ended.
    stream: Option<agent_reach_pipeline::stream::EventStream>,
    /// The latest chunk, not yet sent: whether it is the last is not known yet.
    held: Option<Value>,
    chunks: u64,
    queued: std::collections::VecDeque<bytes::Bytes>,
}

impl Relay {
    /// The next SSE event to write; `None` after the status update that ends the task.
    async fn step(&mut self) -> Option<bytes::Bytes> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            let mut stream = self.stream.take()?;
            let item = if self.held.is_some() {
                // Dropping a pending `next` loses nothing (it waits on a read
                // that takes no bytes until they come).
                match futures::FutureExt::now_or_never(stream.next()) {
                    Some(item) => item,
                    None => match tokio::time::timeout(LAST_CHUNK_WAIT, stream.next()).await {
                        Ok(item) => item,
                        Err(_) => {
                            // The agent is still at work: the held chunk is not the last.
                            self.release(false);
                            self.stream = Some(stream);
                            continue;
                        }
                    },
                }
            } else {
                stream.next().await
            };
            match item {
                Some(Item::Event(event)) => {
                    self.release(false);
                    let data = event.data();
                    let value = serde_json::from_str(&data).unwrap_or_else(|_| Value::String(data.into_owned()));
                    self.held = Some(json!({
                        "taskId": self.task_id, "contextId": self.context_id,
                        "artifact": { "artifactId": format!("{}-output", self.task_id), "parts": [data_part(value, self.wire)] },
                        "append": self.chunks > 0,
                    }));
                    self.chunks += 1;
                    self.stream = Some(stream);
                }
                Some(Item::End(end)) => {
                    self.release(true);
                    let wire = self.wire;
                    let ended = if end.is_ok() {
                        A2aState::Completed
                    } else {
                        A2aState::Failed
                    };
                    let mut state = status(ended, wire);
                    if let Err(error) = &end {
                        let envelope = serde_json::to_value(error.envelope_error()).unwrap_or(Value::Null);
                        state["message"] = error_message(&envelope, wire);
                    }
                    let update = json!({ "taskId": self.task_id, "contextId": self.context_id, "status": state });
                    let result = match wire {
                        Wire::V1 => json!({ "statusUpdate": update }),
                        Wire::V03 => {
                            let mut update = update;
                            update["kind"] = json!("status-update");
                            update["final"] = json!(true);
                            update
                        }
                    };
                    self.queued.push_back(sse_result(self.id.as_ref(), result));
                }
                // An ended stream yields its end first: nothing follows it.
                None => self.release(true),
            }
        }
    }

    /// Queues the held chunk, if any, saying whether it is the last.
    fn release(&mut self, last: bool) {
        if let Some(mut update) = self.held.take() {
            update["lastChunk"] = json!(last);
            self.queued
                .push_back(sse_result(self.id.as_ref(), artifact_update(update, self.wire)));
        }
    }
}

/// A stream refused before it opened: JSON-RPC's error to `id`, or (REST,
/// `None`) the JSON-RPC error the REST binding translates.
pub(crate) fn refused_stream(id: Option<&Value>, error: &RouterError) -> Response {
    failed(id.unwrap_or(&Value::Null), error)
}
