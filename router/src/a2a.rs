//! A2A at `/a2a/{capability}` (DESIGN §8, "A2A"): every capability is an A2A
//! agent, with its agent card at `/a2a/{capability}/.well-known/agent-card.json`
//! and the JSON-RPC binding at `POST /a2a/{capability}`.
//!
//! Methods: `SendMessage` and `SendStreamingMessage` (v1.0 names; v0.3's
//! `message/send` and `message/stream` when `A2A-Version` is absent or
//! `0.3`, answered in v0.3's shapes). A message's one part is the payload: a
//! DataPart's `data`, or a TextPart as `{"text": …}` when the capability's
//! input schema takes a string `text` (otherwise A2A's content-type error
//! names what it accepts). The call goes through [`RouterService::invoke`]
//! (the one admission: ACL, limits, schema, deadline; then selection,
//! retries) or, streamed, [`crate::stream::open`]; the answer is a Message
//! (its one DataPart the output), a stream is a Task whose artifact grows
//! event by event and ends `completed` or `failed`.
//!
//! Work is synchronous here, so no task outlives its call: `GetTask`,
//! `CancelTask` and `SubscribeToTask` answer `TaskNotFound`, `ListTasks` an
//! empty list, push-notification configs `PushNotificationNotSupported`
//! (the card says `pushNotifications: false`).

use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_edge::HeaderLookup;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};

use crate::clock;
use crate::envelope;
use crate::error::{Code, RouterError};
use crate::service::RouterService;
use crate::stream::{self, Item};
use crate::trace::{self, TraceContext};

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// Where A2A errors say which stable code they carry (`google.rpc.ErrorInfo`).
const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// `/a2a/{capability}`, its card, and the root card.
pub fn routes(service: Arc<RouterService>) -> axum::Router {
    axum::Router::new()
        .route("/a2a/{capability}", post(rpc))
        .route("/a2a/{capability}/.well-known/agent-card.json", get(card))
        .route("/.well-known/agent-card.json", get(root_card))
        .with_state(service)
}

/// The wire generation a request speaks (its method's name decides).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    V1,
    V03,
}

fn not_found(what: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": { "code": "CAPABILITY_NOT_FOUND", "message": what } })),
    )
        .into_response()
}

async fn card(
    State(service): State<Arc<RouterService>>,
    Path(capability): Path<String>,
    headers: HeaderMap,
) -> Response {
    match card_of(&service, &capability, &headers) {
        Some(card) => axum::Json(card).into_response(),
        None => not_found(format!("no agent offers capability `{capability}`")),
    }
}

async fn root_card(State(service): State<Arc<RouterService>>, headers: HeaderMap) -> Response {
    let Some(capability) = service.tuning().a2a_root_capability.clone() else {
        return not_found("no root agent card (start the router with --a2a-root-capability NAME)".to_string());
    };
    match card_of(&service, &capability, &headers) {
        Some(card) => axum::Json(card).into_response(),
        None => not_found(format!(
            "the root agent card is `{capability}`'s (--a2a-root-capability), and no agent offers it now"
        )),
    }
}

/// The agent card of `capability` at its highest version, its interface URL on the
/// host the client reached (`Host`).
fn card_of(service: &RouterService, capability: &str, headers: &HeaderMap) -> Option<Value> {
    let snapshot = service.snapshot().load_full();
    let found = snapshot.capabilities.get(capability)?;
    let group = found.versions.first()?;
    let host = headers
        .value("host")
        .and_then(|host| std::str::from_utf8(host).ok())
        .unwrap_or("localhost");
    let input_schema = schema_value(&group.described.input_schema);
    let input_modes = if takes_text(&input_schema) {
        json!(["application/json", "text/plain"])
    } else {
        json!(["application/json"])
    };
    let description = if group.described.description.is_empty() {
        format!("Agent-Reach capability `{capability}`")
    } else {
        group.described.description.clone()
    };
    Some(json!({
        "name": capability,
        "description": description,
        "version": group.version_text,
        "supportedInterfaces": [{
            "url": format!("http://{host}/a2a/{capability}"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }],
        "provider": { "organization": "Agent-Reach", "url": format!("http://{host}") },
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extensions": [{
                "uri": "https://agent-reach.dev/a2a/schemas/v1",
                "description": "The capability's JSON Schemas (draft 2020-12): a DataPart's data must match input_schema.",
                "required": false,
                "params": {
                    "input_schema": input_schema,
                    "output_schema": schema_value(&group.described.output_schema),
                },
            }],
        },
        "securitySchemes": {
            "bearer": { "httpAuthSecurityScheme": { "scheme": "Bearer", "bearerFormat": "JWT",
                "description": "The caller's Agent-Reach token; acl.yaml decides what it may call." } }
        },
        "securityRequirements": [{ "schemes": { "bearer": { "list": [] } } }],
        "defaultInputModes": input_modes,
        "defaultOutputModes": ["application/json"],
        "skills": [{
            "id": capability,
            "name": capability,
            "description": description,
            "tags": ["agent-reach", format!("version:{}", group.version_text)],
            "inputModes": input_modes,
            "outputModes": ["application/json"],
        }],
    }))
}

fn schema_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Bool(true))
}

/// Whether an input schema takes `{"text": "…"}` (a TextPart maps to it).
fn takes_text(schema: &Value) -> bool {
    schema.pointer("/properties/text/type").and_then(Value::as_str) == Some("string")
}

/// A JSON-RPC error, `data` naming the stable code as A2A's ErrorInfo does.
fn rpc_error(id: &Value, code: i64, message: &str, stable: Option<&RouterError>) -> Value {
    let mut error = json!({ "code": code, "message": message });
    if let Some(stable) = stable {
        let envelope = stable.envelope_error();
        error["data"] = json!([{
            "@type": ERROR_INFO,
            "reason": envelope.code,
            "domain": "agent-reach",
            "metadata": { "code": envelope.code, "retryable": envelope.retryable.to_string() },
        }]);
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// A router error as A2A's: its status and JSON-RPC code.
fn failed(id: &Value, error: &RouterError) -> Response {
    let (status, code) = match error.code {
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, INVALID_REQUEST),
        Code::Forbidden => (StatusCode::FORBIDDEN, INVALID_REQUEST),
        Code::CapabilityNotFound | Code::VersionNotFound => (StatusCode::NOT_FOUND, INVALID_REQUEST),
        Code::SchemaMismatch | Code::InvalidEnvelope | Code::PayloadTooLarge => (StatusCode::OK, INVALID_PARAMS),
        _ => (StatusCode::OK, INTERNAL_ERROR),
    };
    let mut response = reply(status, rpc_error(id, code, &error.message, Some(error)));
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
    }
    response
}

async fn rpc(
    State(service): State<Arc<RouterService>>,
    Path(capability): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let received = clock::Now::read();
    let caller = match service.authenticate_at(&headers, received.epoch_ms) {
        Ok(caller) => caller,
        Err(error) => return failed(&Value::Null, &error),
    };
    // v0.3 names are served when the client names no version or 0.3 (the spec's rule).
    let version = headers
        .value("a2a-version")
        .map(|value| String::from_utf8_lossy(value).trim().to_string());
    let legacy_allowed = match version.as_deref() {
        None | Some("") | Some("0.3") | Some("0.3.0") => true,
        Some("1.0") | Some("1.0.0") => false,
        Some(other) => {
            return reply(
                StatusCode::OK,
                rpc_error(
                    &Value::Null,
                    VERSION_NOT_SUPPORTED,
                    &format!("A2A-Version `{other}` is not supported; this agent speaks 1.0 and 0.3"),
                    None,
                ),
            )
        }
    };
    let bytes = match envelope::read_body(&headers, body, service.tuning().max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => return failed(&Value::Null, &error),
    };
    let request: Value = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => {
            return reply(
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
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let valid = request.is_object()
        && request.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && matches!(id, Value::String(_) | Value::Number(_));
    let method = request.get("method").and_then(Value::as_str);
    let (Some(method), true) = (method, valid) else {
        let id = if matches!(id, Value::String(_) | Value::Number(_)) {
            id
        } else {
            Value::Null
        };
        return reply(
            StatusCode::OK,
            rpc_error(
                &id,
                INVALID_REQUEST,
                "not a JSON-RPC 2.0 request: one object with `jsonrpc: \"2.0\"`, a string `method` and a string or number `id`",
                None,
            ),
        );
    };
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    let (operation, wire) = match method {
        "SendMessage" => ("send", Wire::V1),
        "SendStreamingMessage" => ("stream", Wire::V1),
        "GetTask" | "CancelTask" | "SubscribeToTask" => ("task", Wire::V1),
        "ListTasks" => ("list", Wire::V1),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => ("push", Wire::V1),
        "GetExtendedAgentCard" => ("card", Wire::V1),
        "message/send" if legacy_allowed => ("send", Wire::V03),
        "message/stream" if legacy_allowed => ("stream", Wire::V03),
        "tasks/get" | "tasks/cancel" | "tasks/resubscribe" if legacy_allowed => ("task", Wire::V03),
        other if legacy_allowed && other.starts_with("tasks/pushNotificationConfig/") => ("push", Wire::V03),
        "agent/getAuthenticatedExtendedCard" if legacy_allowed => ("card", Wire::V03),
        other => {
            let hint = if legacy_allowed {
                ""
            } else {
                " (v0.3 names are served only when A2A-Version is absent or 0.3)"
            };
            return reply(
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
    if !params.is_object() {
        return reply(
            StatusCode::OK,
            rpc_error(&id, INVALID_PARAMS, "`params` must be an object", None),
        );
    }
    match operation {
        "send" | "stream" => {
            let call = match message_call(&service, &caller, &capability, &params, wire) {
                Ok(call) => call,
                Err(refusal) => return refusal.into_response(&id),
            };
            if operation == "send" {
                send(&service, &caller, &headers, call, received, &id, wire).await
            } else {
                send_streaming(&service, &caller, &headers, call, received, id, wire).await
            }
        }
        "task" => {
            let Some(task_id) = params.get("id").and_then(Value::as_str) else {
                return reply(
                    StatusCode::OK,
                    rpc_error(&id, INVALID_PARAMS, "`params.id` (the task's id) is required", None),
                );
            };
            reply(
                StatusCode::OK,
                rpc_error(
                    &id,
                    TASK_NOT_FOUND,
                    &format!("no task `{task_id}`: this agent answers synchronously, and a streamed task lives only as long as its stream"),
                    None,
                ),
            )
        }
        "list" => reply(
            StatusCode::OK,
            json!({ "jsonrpc": "2.0", "id": id, "result": { "tasks": [], "nextPageToken": "", "pageSize": 0, "totalSize": 0 } }),
        ),
        "push" => reply(
            StatusCode::OK,
            rpc_error(
                &id,
                PUSH_NOT_SUPPORTED,
                "push notifications are not supported by this agent (its card says so)",
                None,
            ),
        ),
        _ => reply(
            StatusCode::OK,
            rpc_error(
                &id,
                EXTENDED_CARD_NOT_CONFIGURED,
                "this agent has no extended card",
                None,
            ),
        ),
    }
}

/// What a message asks: the checked call and the ids to answer with.
struct MessageCall {
    checked: envelope::CheckedRequest,
    request_id: String,
    context_id: String,
}

/// A refusal before the call: JSON-RPC's code and message, with the stable error when there is one.
struct Refusal {
    code: i64,
    message: String,
    error: Option<RouterError>,
}

impl Refusal {
    fn into_response(self, id: &Value) -> Response {
        match self.error {
            Some(error) if self.code == 0 => failed(id, &error),
            error => reply(StatusCode::OK, rpc_error(id, self.code, &self.message, error.as_ref())),
        }
    }
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal {
        code: INVALID_PARAMS,
        message: message.into(),
        error: None,
    }
}

/// The message's one part as the payload (a DataPart's data, or a TextPart as `{"text"}`).
fn message_call(
    service: &RouterService,
    caller: &Caller,
    capability: &str,
    params: &Value,
    wire: Wire,
) -> Result<MessageCall, Refusal> {
    // Authorised first, as on `/v1/invoke`: a caller learns nothing of capabilities it may not call.
    service
        .admission()
        .authorize(caller, capability)
        .map_err(|error| Refusal {
            code: 0,
            message: String::new(),
            error: Some(error),
        })?;
    let Some(message) = params.get("message").filter(|message| message.is_object()) else {
        return Err(invalid("`params.message` (the Message to send) is required"));
    };
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let [part] = parts else {
        return Err(invalid(format!(
            "the message must carry exactly one part (the payload); it has {}",
            parts.len()
        )));
    };
    let kind = part.get("kind").and_then(Value::as_str);
    let snapshot = service.snapshot().load_full();
    let Some(found) = snapshot.capabilities.get(capability) else {
        return Err(Refusal {
            code: 0,
            message: String::new(),
            error: Some(
                RouterError::new(
                    Code::CapabilityNotFound,
                    format!("no agent offers capability `{capability}`"),
                )
                .with_details(json!({ "capability": capability })),
            ),
        });
    };
    let input_schema = found
        .versions
        .first()
        .map_or(Value::Bool(true), |group| schema_value(&group.described.input_schema));
    let payload = if let Some(data) = part.get("data").filter(|_| wire == Wire::V1 || kind == Some("data")) {
        data.clone()
    } else if let Some(text) = part
        .get("text")
        .and_then(Value::as_str)
        .filter(|_| wire == Wire::V1 || kind == Some("text"))
    {
        if !takes_text(&input_schema) {
            return Err(Refusal {
                code: CONTENT_TYPE_NOT_SUPPORTED,
                message: format!(
                    "`{capability}` does not take text: send a DataPart whose data matches its input schema \
                     (on its agent card); a TextPart maps to {{\"text\": …}} only for capabilities whose input has a string `text`"
                ),
                error: None,
            });
        }
        json!({ "text": text })
    } else {
        return Err(Refusal {
            code: CONTENT_TYPE_NOT_SUPPORTED,
            message: format!("`{capability}` takes one DataPart (application/json) or, when its input has a string `text`, one TextPart"),
            error: None,
        });
    };
    drop(snapshot);
    let request_id = message
        .get("messageId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty() && id.len() <= 128)
        .map_or_else(trace::new_request_id, str::to_string);
    let context_id = message
        .get("contextId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty() && id.len() <= 128)
        .map_or_else(trace::new_request_id, str::to_string);
    // The context keeps a conversation on one instance (consistent_hash keys on session_id).
    let envelope_value = json!({
        "capability": capability,
        "payload": payload,
        "request_id": request_id,
        "session_id": context_id,
    });
    let checked = serde_json::to_vec(&envelope_value)
        .map_err(|error| RouterError::new(Code::InvalidEnvelope, error.to_string()))
        .and_then(|bytes| envelope::parse(&bytes))
        .and_then(envelope::check)
        .map_err(|error| Refusal {
            code: INVALID_PARAMS,
            message: error.message.clone(),
            error: Some(error),
        })?;
    Ok(MessageCall {
        checked,
        request_id,
        context_id,
    })
}

/// A part carrying `value`, in the request's wire shape.
fn data_part(value: Value, wire: Wire) -> Value {
    match wire {
        Wire::V1 => json!({ "data": value }),
        // v0.3's DataPart holds an object.
        Wire::V03 => {
            let data = if value.is_object() {
                value
            } else {
                json!({ "result": value })
            };
            json!({ "kind": "data", "data": data })
        }
    }
}

async fn send(
    service: &RouterService,
    caller: &Caller,
    headers: &HeaderMap,
    call: MessageCall,
    received: clock::Now,
    id: &Value,
    wire: Wire,
) -> Response {
    let trace = TraceContext::from_header(headers.value("traceparent"));
    let result = service
        .invoke(
            caller,
            crate::admission::Entry::Call,
            &call.checked,
            &call.request_id,
            &trace,
            received,
        )
        .await;
    let success = match result {
        Ok(success) => success,
        Err(failure) => return failed(id, &failure.error),
    };
    let output = match success.output_value() {
        Ok(output) => output,
        Err(error) => return failed(id, &error),
    };
    let metadata = json!({
        "agent_id": success.agent_id,
        "capability_version": success.capability_version,
        "attempts": success.attempts,
        "request_id": call.request_id,
    });
    let message_id = trace::new_request_id();
    let result = match wire {
        Wire::V1 => json!({ "message": {
            "messageId": message_id, "contextId": call.context_id, "role": "ROLE_AGENT",
            "parts": [data_part(output, wire)], "metadata": metadata,
        } }),
        Wire::V03 => json!({
            "kind": "message", "messageId": message_id, "contextId": call.context_id, "role": "agent",
            "parts": [data_part(output, wire)], "metadata": metadata,
        }),
    };
    reply(StatusCode::OK, json!({ "jsonrpc": "2.0", "id": id, "result": result }))
}

/// One SSE event carrying a JSON-RPC result.
fn sse_result(id: &Value, result: Value) -> bytes::Bytes {
    crate::sse::data(&json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string())
}

fn status(state: &str, wire: Wire) -> Value {
    match wire {
        Wire::V1 => json!({ "state": format!("TASK_STATE_{}", state.to_ascii_uppercase()) }),
        Wire::V03 => json!({ "state": state }),
    }
}

async fn send_streaming(
    service: &RouterService,
    caller: &Caller,
    headers: &HeaderMap,
    call: MessageCall,
    received: clock::Now,
    id: Value,
    wire: Wire,
) -> Response {
    let trace = TraceContext::from_header(headers.value("traceparent"));
    let opened = match stream::open(service, caller, &call.checked, &call.request_id, &trace, received).await {
        Ok(opened) => opened,
        Err(failure) => return failed(&id, &failure.error),
    };
    let task_id = call.request_id.clone();
    let context_id = call.context_id.clone();
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
                    let value = serde_json::from_str(&event.data).unwrap_or(Value::String(event.data.clone()));
                    let update = json!({
                        "taskId": task_id, "contextId": context_id,
                        "artifact": { "artifactId": artifact_id, "parts": [data_part(value, wire)] },
                        "append": count > 0, "lastChunk": false,
                    });
                    let result = match wire {
                        Wire::V1 => json!({ "artifactUpdate": update }),
                        Wire::V03 => {
                            let mut update = update;
                            update["kind"] = json!("artifact-update");
                            update
                        }
                    };
                    (sse_result(&id, result), Some(stream))
                }
                Item::End(end) => {
                    let mut state = status(if end.is_ok() { "completed" } else { "failed" }, wire);
                    if let Err(error) = &end {
                        let envelope = error.envelope_error();
                        let text = format!("{}: {}", envelope.code, envelope.message);
                        state["message"] = match wire {
                            Wire::V1 => json!({ "messageId": trace::new_request_id(), "role": "ROLE_AGENT",
                                    "parts": [{ "text": text }], "metadata": { "error": envelope } }),
                            Wire::V03 => {
                                json!({ "kind": "message", "messageId": trace::new_request_id(), "role": "agent",
                                    "parts": [{ "kind": "text", "text": text }], "metadata": { "error": envelope } })
                            }
                        };
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
    (
        [
            (http::header::CONTENT_TYPE, "text/event-stream"),
            (http::header::CACHE_CONTROL, "no-cache"),
            (http::header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
