//! `POST /a2a/{capability}`: one JSON-RPC request read (the common `SendMessage` without a
//! JSON tree, anything else by the general reading) and handed to its operation.

use super::*;

pub(crate) async fn rpc(
    State(api): State<TaskApi>,
    Path(capability): Path<String>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer_rpc(&api, identified, &capability, &headers, RequestBody::Unread(body))
        .await
        .into_response()
}

/// The most requests one JSON-RPC batch may hold.
pub(crate) const MOST_BATCHED: usize = 100;

/// `POST /a2a/{capability}`, for the axum route and the front door's hot
/// route alike (the door takes only capability names needing no decoding).
/// A body is one request, answered with its response, or a batch (an
/// array), answered with an array of responses; a notification (a request
/// without `id`) is performed and answered with nothing (204, or no element
/// of the batch), as JSON-RPC 2.0 says.
pub async fn answer_rpc(
    api: &TaskApi,
    identified: Identified,
    capability: &str,
    headers: &impl HeaderLookup,
    body: RequestBody,
) -> Answer {
    let service = api.service();
    let received = identified.received;
    let caller = match identified.caller {
        Ok(caller) => caller,
        Err(error) => return failed(&Value::Null, &error).into(),
    };
    // v0.3 names are served when the client names no version or 0.3 (the spec's rule).
    let version = match headers.value("a2a-version").map(<[u8]>::trim_ascii) {
        None | Some(b"") | Some(b"0.3") | Some(b"0.3.0") => Ok(true),
        Some(b"1.0") | Some(b"1.0.0") => Ok(false),
        Some(other) => Err(String::from_utf8_lossy(other).into_owned()),
    };
    let read = match body {
        RequestBody::Unread(body) => envelope::read_body(headers, body, service.tuning().max_body_bytes).await,
        RequestBody::Read(bytes) => Ok(bytes),
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(error) => return failed(&Value::Null, &error).into(),
    };
    let legacy_allowed = match version {
        Ok(legacy_allowed) => legacy_allowed,
        Err(other) => {
            // Answered to the request's id when it can be read.
            let id = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|request| request.get("id").cloned())
                .filter(|id| matches!(id, Value::String(_) | Value::Number(_)))
                .unwrap_or(Value::Null);
            return json_reply(
                StatusCode::OK,
                rpc_error(
                    &id,
                    VERSION_NOT_SUPPORTED,
                    &format!("A2A-Version `{other}` is not supported; this agent speaks 1.0 and 0.3"),
                    None,
                ),
            );
        }
    };
    // The common call, read without a JSON tree; anything else (and every
    // refusal of the request's shape) takes the general reading below.
    let always = service.tuning().a2a_tasks_always && api.tasks_enabled();
    if let Some(plain) = PlainSend::read(&bytes, legacy_allowed).filter(|_| !always) {
        let id = plain.id;
        let message = match plain_call(
            service,
            &caller,
            capability,
            plain.payload,
            plain.message_id,
            plain.context_id,
        ) {
            Ok(message) => message,
            Err(refusal) => return refusal.into_response(&id).into(),
        };
        return send(api, &caller, headers, message, received, &id, plain.wire).await;
    }
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => {
            return json_reply(
                StatusCode::OK,
                rpc_error(
                    &Value::Null,
                    PARSE_ERROR,
                    &format!("the body is not JSON: {error}"),
                    None,
                ),
            )
        }
    };
    let one = One {
        api,
        caller: &caller,
        capability,
        headers,
        received,
        legacy_allowed,
        rest: false,
    };
    let Value::Array(batch) = request else {
        return one.answer(&request, false).await.unwrap_or_else(nothing);
    };
    if batch.is_empty() || batch.len() > MOST_BATCHED {
        return json_reply(
            StatusCode::OK,
            rpc_error(
                &Value::Null,
                INVALID_REQUEST,
                &format!(
                    "a batch holds 1 to {MOST_BATCHED} requests; this one holds {}",
                    batch.len()
                ),
                None,
            ),
        );
    }
    // The batch's requests run together; their responses come in their order.
    let answers = futures::future::join_all(batch.iter().map(|request| one.answer(request, true))).await;
    let mut written = b"[".to_vec();
    for answer in answers.into_iter().flatten() {
        if written.len() > 1 {
            written.push(b',');
        }
        written.extend_from_slice(&answer_bytes(answer).await);
    }
    if written.len() == 1 {
        return nothing();
    }
    written.push(b']');
    Answer::Json {
        status: StatusCode::OK,
        body: written,
    }
}

/// The answer to a request that gets no response: notifications only.
fn nothing() -> Answer {
    StatusCode::NO_CONTENT.into_response().into()
}

/// A JSON answer's body (a batch's element); a response that is not JSON
/// (none is: streams are refused in batches) as JSON-RPC's internal error.
async fn answer_bytes(answer: Answer) -> Vec<u8> {
    let body = match answer {
        Answer::Json { body, .. } | Answer::Typed { body, .. } => return body,
        Answer::Response(response) => axum::body::to_bytes(response.into_body(), usize::MAX).await,
        Answer::Stream { .. } => {
            return rpc_error(&Value::Null, INTERNAL_ERROR, "a stream cannot be batched", None)
                .to_string()
                .into_bytes()
        }
    };
    body.map(|bytes| bytes.to_vec()).unwrap_or_else(|error| {
        rpc_error(
            &Value::Null,
            INTERNAL_ERROR,
            &format!("the answer cannot be read: {error}"),
            None,
        )
        .to_string()
        .into_bytes()
    })
}

/// What every request of one HTTP request shares.
pub(crate) struct One<'a, H> {
    pub(crate) api: &'a TaskApi,
    pub(crate) caller: &'a Caller,
    pub(crate) capability: &'a str,
    pub(crate) headers: &'a H,
    pub(crate) received: clock::Now,
    pub(crate) legacy_allowed: bool,
    /// The REST binding asks (streams then carry bare `StreamResponse`s).
    pub(crate) rest: bool,
}

impl<H: HeaderLookup> One<'_, H> {
    /// One request's answer; `None` for a notification (performed, unanswered).
    pub(crate) async fn answer(&self, request: &Value, batched: bool) -> Option<Answer> {
        // A request without `id`; one that is not a request at all is answered (id null).
        let notification = request.get("id").is_none()
            && request.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
            && request.get("method").is_some_and(Value::is_string);
        let answer = self.request(request, batched, notification).await;
        (!notification).then_some(answer)
    }

    async fn request(&self, request: &Value, batched: bool, notification: bool) -> Answer {
        let (api, caller, capability, headers, received, legacy_allowed) = (
            self.api,
            self.caller,
            self.capability,
            self.headers,
            self.received,
            self.legacy_allowed,
        );
        let service = api.service();
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let valid = request.is_object()
            && request.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
            && (notification || matches!(id, Value::String(_) | Value::Number(_)));
        let method = request.get("method").and_then(Value::as_str);
        let (Some(method), true) = (method, valid) else {
            let id = if matches!(id, Value::String(_) | Value::Number(_)) {
                id
            } else {
                Value::Null
            };
            return json_reply(
                StatusCode::OK,
                rpc_error(
                    &id,
                    INVALID_REQUEST,
                    "not a JSON-RPC 2.0 request: one object with `jsonrpc: \"2.0\"`, a string `method` and a string or number `id` (none in a notification)",
                    None,
                ),
            );
        };
        let params = request.get("params").unwrap_or(&Value::Null);
        let (operation, wire) = match method {
            "SendMessage" => (Operation::Send, Wire::V1),
            "SendStreamingMessage" => (Operation::Stream, Wire::V1),
            "GetTask" => (Operation::Get, Wire::V1),
            "CancelTask" => (Operation::Cancel, Wire::V1),
            "SubscribeToTask" => (Operation::Subscribe, Wire::V1),
            "ListTasks" => (Operation::List, Wire::V1),
            "CreateTaskPushNotificationConfig" => (Operation::PushSet, Wire::V1),
            "GetTaskPushNotificationConfig" => (Operation::PushGet, Wire::V1),
            "ListTaskPushNotificationConfigs" => (Operation::PushList, Wire::V1),
            "DeleteTaskPushNotificationConfig" => (Operation::PushDelete, Wire::V1),
            "GetExtendedAgentCard" => (Operation::ExtendedCard, Wire::V1),
            "message/send" if legacy_allowed => (Operation::Send, Wire::V03),
            "message/stream" if legacy_allowed => (Operation::Stream, Wire::V03),
            "tasks/get" if legacy_allowed => (Operation::Get, Wire::V03),
            "tasks/cancel" if legacy_allowed => (Operation::Cancel, Wire::V03),
            "tasks/resubscribe" if legacy_allowed => (Operation::Subscribe, Wire::V03),
            "tasks/pushNotificationConfig/set" if legacy_allowed => (Operation::PushSet, Wire::V03),
            "tasks/pushNotificationConfig/get" if legacy_allowed => (Operation::PushGet, Wire::V03),
            "tasks/pushNotificationConfig/list" if legacy_allowed => (Operation::PushList, Wire::V03),
            "tasks/pushNotificationConfig/delete" if legacy_allowed => (Operation::PushDelete, Wire::V03),
            "agent/getAuthenticatedExtendedCard" if legacy_allowed => (Operation::ExtendedCard, Wire::V03),
            other => {
                let hint = if legacy_allowed {
                    ""
                } else {
                    " (v0.3 names are served only when A2A-Version is absent or 0.3)"
                };
                return json_reply(
                    StatusCode::OK,
                    rpc_error(
                        &id,
                        METHOD_NOT_FOUND,
                        &format!("method `{other}` is not served here{hint}"),
                        None,
                    ),
                );
            }
        };
        if matches!(operation, Operation::Stream | Operation::Subscribe) && (batched || notification) {
            // A stream is its request's whole answer: it has no place in a
            // batch, and a notification would read it for no one.
            return json_reply(
                StatusCode::OK,
                rpc_error(
                    &id,
                    INVALID_REQUEST,
                    &format!("`{method}` answers with a stream: send it alone, with an `id`, not in a batch or as a notification"),
                    None,
                ),
            );
        }
        if !params.is_object() {
            return json_reply(
                StatusCode::OK,
                rpc_error(&id, INVALID_PARAMS, "`params` must be an object", None),
            );
        }
        let call = Rpc {
            api,
            caller,
            capability,
            params,
            id: &id,
            wire,
            rest: self.rest,
        };
        match operation {
            Operation::Send | Operation::Stream => {
                let message = match message_call(service, caller, capability, params, wire) {
                    Ok(message) => message,
                    Err(refusal) => return refusal.into_response(&id).into(),
                };
                let continued = match call.continued(&params["message"]).await {
                    Ok(continued) => continued,
                    Err(refusal) => return refusal.into_response(&id).into(),
                };
                let asked = match Asked::of(params, wire) {
                    Ok(asked) => asked,
                    Err(refusal) => return refusal.into_response(&id).into(),
                };
                // A message continuing a task that asked for input.
                if let Some(task) = continued {
                    return call
                        .resume(task, message, asked, operation == Operation::Stream)
                        .await
                        .unwrap_or_else(|refusal| refusal.into_response(&id))
                        .into();
                }
                // `--a2a-tasks always`: every message a durable task, answered as one.
                let always = service.tuning().a2a_tasks_always && api.tasks_enabled();
                match (operation, asked) {
                    (
                        Operation::Send,
                        Asked {
                            task: false,
                            push: None,
                            ..
                        },
                    ) if !always => send(api, caller, headers, message, received, &id, wire).await,
                    (Operation::Stream, Asked { push: None, .. }) if !always => {
                        send_streaming(api, caller, headers, message, received, (!self.rest).then(|| id.clone()), wire)
                            .await
                            .into()
                    }
                    (operation, asked) => call
                        .submit(message, asked, operation == Operation::Stream)
                        .await
                        .unwrap_or_else(|refusal| refusal.into_response(&id))
                        .into(),
                }
            }
            Operation::Get
            | Operation::Cancel
            | Operation::Subscribe
            | Operation::List
            | Operation::PushSet
            | Operation::PushGet
            | Operation::PushList
            | Operation::PushDelete => call
                .on_task(operation)
                .await
                .unwrap_or_else(|refusal| refusal.into_response(&id))
                .into(),
            // The card does not declare `extendedAgentCard`: the spec's answer is
            // UnsupportedOperation (§3.3.4), not ExtendedAgentCardNotConfigured.
            Operation::ExtendedCard => json_reply(
                StatusCode::OK,
                rpc_error(
                    &id,
                    UNSUPPORTED_OPERATION,
                    "this agent has no extended card: its card is the whole card (capabilities.extendedAgentCard is false)",
                    None,
                ),
            ),
        }
    }
}
