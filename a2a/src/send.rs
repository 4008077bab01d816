//! A message answered now: `SendMessage` through `RouterService::invoke`,
//! `SendStreamingMessage` through `RouterService::stream`, in the request's wire shape.

use super::*;

pub(crate) async fn send(
    service: &RouterService,
    caller: &Caller,
    headers: &impl HeaderLookup,
    call: MessageCall,
    received: clock::Now,
    id: &Value,
    wire: Wire,
) -> Answer {
    let call = Call::begin(Door::A2a, caller.clone(), call.checked, headers, received);
    let result = service.invoke(&call).await;
    let success = match result {
        Ok(success) => success,
        Err(failure) => return failed(id, &failure.error).into(),
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

/// One SSE event carrying a JSON-RPC result.
pub(crate) fn sse_result(id: &Value, result: Value) -> bytes::Bytes {
    agent_reach_serving::sse::data(&json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string())
}

pub(crate) fn status(state: &str, wire: Wire) -> Value {
    match wire {
        Wire::V1 => json!({ "state": format!("TASK_STATE_{}", state.to_ascii_uppercase()) }),
        Wire::V03 => json!({ "state": state }),
    }
}

pub(crate) async fn send_streaming(
    service: &RouterService,
    caller: &Caller,
    headers: &impl HeaderLookup,
    call: MessageCall,
    received: clock::Now,
    id: Value,
    wire: Wire,
) -> Response {
    let call = Call::begin(Door::A2a, caller.clone(), call.checked, headers, received);
    let task_id = call.request_id().to_string();
    let context_id = call.checked.request.session_id.clone().unwrap_or_default();
    let opened = match service.stream(call).await {
        Ok(opened) => opened,
        Err(failure) => return failed(&id, &failure.error),
    };
    let first = match wire {
        Wire::V1 => json!({ "task": { "id": task_id, "contextId": context_id, "status": status("working", wire) } }),
        Wire::V03 => {
            json!({ "kind": "task", "id": task_id, "contextId": context_id, "status": status("working", wire) })
        }
    };
    let opening = sse_result(&id, first);
    let artifact_id = format!("{task_id}-output");
    let body = futures::stream::unfold((Some(opening), Some(opened), 0u64), move |(opening, stream, count)| {
        let (id, task_id, context_id, artifact_id) =
            (id.clone(), task_id.clone(), context_id.clone(), artifact_id.clone());
        async move {
            if let Some(opening) = opening {
                return Some((Ok::<_, std::convert::Infallible>(opening), (None, stream, count)));
            }
            let mut stream = stream?;
            let item = stream.next().await?;
            let (event, rest) = match item {
                Item::Event(event) => {
                    let data = event.data();
                    let value = serde_json::from_str(&data).unwrap_or_else(|_| Value::String(data.into_owned()));
                    let update = json!({
                        "taskId": task_id, "contextId": context_id,
                        "artifact": { "artifactId": artifact_id, "parts": [data_part(value, wire)] },
                        "append": count > 0, "lastChunk": false,
                    });
                    (sse_result(&id, artifact_update(update, wire)), Some(stream))
                }
                Item::End(end) => {
                    let mut state = status(if end.is_ok() { "completed" } else { "failed" }, wire);
                    if let Err(error) = &end {
                        let envelope = serde_json::to_value(error.envelope_error()).unwrap_or(Value::Null);
                        state["message"] = error_message(&envelope, wire);
                    }
                    let update = json!({ "taskId": task_id, "contextId": context_id, "status": state });
                    let result = match wire {
                        Wire::V1 => json!({ "statusUpdate": update }),
                        Wire::V03 => {
                            let mut update = update;
                            update["kind"] = json!("status-update");
                            update["final"] = json!(true);
                            update
                        }
                    };
                    (sse_result(&id, result), None)
                }
            };
            Some((Ok(event), (None, rest, count + 1)))
        }
    });
    event_stream(Body::from_stream(body))
}
