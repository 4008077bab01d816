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
//! retries) or, streamed, `RouterService::stream`; the answer is a Message
//! (its one DataPart the output), a stream is a Task whose artifact grows
//! event by event and ends `completed` or `failed`.
//!
//! Slow work is the slow path's durable task ([`agent_reach_tasks`], with
//! `--redis`): a `SendMessage` asking to return at once (v1.0
//! `returnImmediately`, v0.3 `blocking: false`) or carrying a push config is
//! submitted as a task and answered as an A2A Task whose state is the
//! durable task's; `GetTask`, `ListTasks`, `CancelTask` and
//! `SubscribeToTask` (SSE) read and cancel it, for the caller that submitted
//! it only; a push-notification config is the task's signed callback (one per
//! task, id `default`). Without `--redis` the card says
//! `pushNotifications: false` and those methods answer A2A's errors.

use std::borrow::Cow;

use agent_reach_access::Caller;
use agent_reach_serving::front::Answer;
use agent_reach_serving::{HeaderLookup, RequestBody};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};

use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::call::{Call, Door};
use agent_reach_pipeline::clock;
use agent_reach_pipeline::envelope;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::stream::Item;
use agent_reach_pipeline::trace;
use agent_reach_pipeline::RouterService;
use agent_reach_tasks::{Owned, TaskApi};

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED_OPERATION: i64 = -32004;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// Where A2A errors say which stable code they carry (`google.rpc.ErrorInfo`).
const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// The id of a task's one push-notification config (its callback).
const PUSH_CONFIG_ID: &str = "default";

/// How many tasks a `ListTasks` page holds unless `pageSize` says (at most 100).
const LIST_PAGE: usize = 50;

/// `/a2a/{capability}`, its card, and the root card.
pub fn routes(api: TaskApi) -> axum::Router {
    axum::Router::new()
        .route("/a2a/{capability}", post(rpc))
        .route("/a2a/{capability}/.well-known/agent-card.json", get(card))
        .route("/.well-known/agent-card.json", get(root_card))
        .with_state(api)
}

/// The wire generation a request speaks (its method's name decides).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    V1,
    V03,
}

/// What a method asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Operation {
    Send,
    Stream,
    Get,
    Cancel,
    Subscribe,
    List,
    PushSet,
    PushGet,
    PushList,
    PushDelete,
    ExtendedCard,
}

fn not_found(what: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": { "code": "CAPABILITY_NOT_FOUND", "message": what } })),
    )
        .into_response()
}

async fn card(
    State(api): State<TaskApi>,
    Path(capability): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    match card_of(&api, &capability, &reached(&uri, &headers)) {
        Some(card) => axum::Json(card).into_response(),
        None => not_found(format!("no agent offers capability `{capability}`")),
    }
}

async fn root_card(State(api): State<TaskApi>, uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let Some(capability) = api.service().tuning().a2a_root_capability.clone() else {
        return not_found("no root agent card (start the router with --a2a-root-capability NAME)".to_string());
    };
    match card_of(&api, &capability, &reached(&uri, &headers)) {
        Some(card) => axum::Json(card).into_response(),
        None => not_found(format!(
            "the root agent card is `{capability}`'s (--a2a-root-capability), and no agent offers it now"
        )),
    }
}

/// The host (and port) the client reached: HTTP/1.1's `Host`, or HTTP/2's
/// `:authority` (which arrives as the URI's authority, with no `Host` header).
fn reached(uri: &axum::http::Uri, headers: &HeaderMap) -> String {
    headers
        .value("host")
        .and_then(|host| std::str::from_utf8(host).ok())
        .map(str::to_string)
        .or_else(|| uri.authority().map(|authority| authority.as_str().to_string()))
        .unwrap_or_else(|| "localhost".to_string())
}

/// The agent card of `capability` at its highest version, its interface URL on the
/// host the client reached, `https://` when the listener serves TLS.
fn card_of(api: &TaskApi, capability: &str, host: &str) -> Option<Value> {
    let service = api.service();
    let scheme = if service.tuning().serves_tls { "https" } else { "http" };
    let offered = service.offered(capability)?;
    let input_schema = schema_value(&offered.described.input_schema);
    let input_modes = if takes_text(&input_schema) {
        json!(["application/json", "text/plain"])
    } else {
        json!(["application/json"])
    };
    let description = if offered.described.description.is_empty() {
        format!("Agent-Reach capability `{capability}`")
    } else {
        offered.described.description.clone()
    };
    Some(json!({
        "name": capability,
        "description": description,
        "version": offered.version,
        "supportedInterfaces": [{
            "url": format!("{scheme}://{host}/a2a/{capability}"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }],
        "provider": { "organization": "Agent-Reach", "url": format!("{scheme}://{host}") },
        "capabilities": {
            "streaming": true,
            // Push configs are the slow path's signed callbacks.
            "pushNotifications": api.tasks_enabled(),
            "extensions": [{
                "uri": "https://agent-reach.dev/a2a/schemas/v1",
                "description": "The capability's JSON Schemas (draft 2020-12): a DataPart's data must match input_schema.",
                "required": false,
                "params": {
                    "input_schema": input_schema,
                    "output_schema": schema_value(&offered.described.output_schema),
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
            "tags": ["agent-reach", format!("version:{}", offered.version)],
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

/// [`reply`] as the front door writes it (no response object built).
fn json_reply(status: StatusCode, body: Value) -> Answer {
    Answer::json(status, &body).unwrap_or_else(|_| reply(status, body).into())
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

/// `POST /a2a/{capability}`, for the axum route and the front door's hot
/// route alike (the door takes only capability names needing no decoding).
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
    let legacy_allowed = match headers.value("a2a-version").map(<[u8]>::trim_ascii) {
        None | Some(b"") | Some(b"0.3") | Some(b"0.3.0") => true,
        Some(b"1.0") | Some(b"1.0.0") => false,
        Some(other) => {
            let other = String::from_utf8_lossy(other);
            return json_reply(
                StatusCode::OK,
                rpc_error(
                    &Value::Null,
                    VERSION_NOT_SUPPORTED,
                    &format!("A2A-Version `{other}` is not supported; this agent speaks 1.0 and 0.3"),
                    None,
                ),
            );
        }
    };
    let read = match body {
        RequestBody::Unread(body) => envelope::read_body(headers, body, service.tuning().max_body_bytes).await,
        RequestBody::Read(bytes) => Ok(bytes),
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(error) => return failed(&Value::Null, &error).into(),
    };
    // The common call, read without a JSON tree; anything else (and every
    // refusal of the request's shape) takes the general reading below.
    if let Some(plain) = PlainSend::read(&bytes, legacy_allowed) {
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
        return send(service, &caller, headers, message, received, &id, plain.wire).await;
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
        return json_reply(
            StatusCode::OK,
            rpc_error(
                &id,
                INVALID_REQUEST,
                "not a JSON-RPC 2.0 request: one object with `jsonrpc: \"2.0\"`, a string `method` and a string or number `id`",
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
    if !params.is_object() {
        return json_reply(
            StatusCode::OK,
            rpc_error(&id, INVALID_PARAMS, "`params` must be an object", None),
        );
    }
    let call = Rpc {
        api,
        caller: &caller,
        capability,
        params,
        id: &id,
        wire,
    };
    match operation {
        Operation::Send | Operation::Stream => {
            let message = match message_call(service, &caller, capability, params, wire) {
                Ok(message) => message,
                Err(refusal) => return refusal.into_response(&id).into(),
            };
            let asked = match Asked::of(params, wire) {
                Ok(asked) => asked,
                Err(refusal) => return refusal.into_response(&id).into(),
            };
            match (operation, asked) {
                (
                    Operation::Send,
                    Asked {
                        task: false,
                        push: None,
                    },
                ) => send(service, &caller, headers, message, received, &id, wire).await,
                (Operation::Stream, Asked { push: None, .. }) => {
                    send_streaming(service, &caller, headers, message, received, id.clone(), wire)
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
        Operation::ExtendedCard => json_reply(
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

/// What a message asks: the checked call; its request and session ids are
/// the ids to answer with ([`call_of`] always sets both).
struct MessageCall {
    checked: envelope::CheckedRequest,
}

/// A refusal before the call: JSON-RPC's code and message, with the stable error when there is one.
struct Refusal {
    code: i64,
    message: String,
    error: Option<RouterError>,
}

impl Refusal {
    /// A refusal answered as the stable error's A2A error (`code` 0: by [`failed`]).
    fn stable(error: RouterError) -> Self {
        Self {
            code: 0,
            message: String::new(),
            error: Some(error),
        }
    }

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
        .map_err(Refusal::stable)?;
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
    let Some(offered) = service.offered(capability) else {
        return Err(not_offered(capability));
    };
    let text_payload;
    let payload = if let Some(data) = part.get("data").filter(|_| wire == Wire::V1 || kind == Some("data")) {
        data
    } else if let Some(text) = part
        .get("text")
        .and_then(Value::as_str)
        .filter(|_| wire == Wire::V1 || kind == Some("text"))
    {
        // Parsed only for a TextPart: a DataPart (the common call) needs no schema here.
        let input_schema = schema_value(&offered.described.input_schema);
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
        text_payload = json!({ "text": text });
        &text_payload
    } else {
        return Err(Refusal {
            code: CONTENT_TYPE_NOT_SUPPORTED,
            message: format!("`{capability}` takes one DataPart (application/json) or, when its input has a string `text`, one TextPart"),
            error: None,
        });
    };
    let message_id = message.get("messageId").and_then(Value::as_str);
    let context_id = message.get("contextId").and_then(Value::as_str);
    call_of(capability, payload.clone(), message_id, context_id)
}

/// The checked `/v1/invoke` call a message's payload becomes (its ids, when
/// usable, as the request and session ids; fresh ones otherwise).
fn call_of(
    capability: &str,
    payload: Value,
    message_id: Option<&str>,
    context_id: Option<&str>,
) -> Result<MessageCall, Refusal> {
    let usable = |id: &&str| !id.is_empty() && id.len() <= 128;
    let request_id = message_id
        .filter(usable)
        .map_or_else(trace::new_request_id, str::to_string);
    let context_id = context_id
        .filter(usable)
        .map_or_else(trace::new_request_id, str::to_string);
    // The context keeps a conversation on one instance (consistent_hash keys on session_id).
    let checked = envelope::call(capability, payload, request_id, Some(context_id)).map_err(|error| Refusal {
        code: INVALID_PARAMS,
        message: error.message.clone(),
        error: Some(error),
    })?;
    Ok(MessageCall { checked })
}

/// A `SendMessage` (v0.3: `message/send`) of the common shape, read without
/// a JSON tree: a JSON-RPC 2.0 object, no `configuration`, a message object
/// with one DataPart. `None` for anything else, whatever is wrong with it:
/// the general reading then answers it, so both readings agree on every request.
struct PlainSend<'a> {
    id: Value,
    wire: Wire,
    payload: Value,
    message_id: Option<Cow<'a, str>>,
    context_id: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct PlainRequest<'a> {
    #[serde(borrow)]
    jsonrpc: Cow<'a, str>,
    id: Value,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: FromObject<PlainParams<'a>>,
}

#[derive(serde::Deserialize)]
struct PlainParams<'a> {
    #[serde(borrow)]
    message: FromObject<PlainMessage<'a>>,
    /// Anything but `null` asks more than a plain call.
    #[serde(default)]
    configuration: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct PlainMessage<'a> {
    #[serde(default, borrow, rename = "messageId")]
    message_id: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "contextId")]
    context_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    parts: [FromObject<PlainPart<'a>>; 1],
}

#[derive(serde::Deserialize)]
struct PlainPart<'a> {
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    /// Present (`null` too), or absent.
    #[serde(default, deserialize_with = "present")]
    data: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    <Value as serde::Deserialize>::deserialize(deserializer).map(Some)
}

/// A struct read from a JSON object only: serde_json would also read one
/// from an array, field by field, which the general reading refuses.
struct FromObject<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for FromObject<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(MapOnly(deserializer)).map(FromObject)
    }
}

/// A deserializer that takes a struct from a map only (see [`FromObject`]).
struct MapOnly<D>(D);

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

impl<'a> PlainSend<'a> {
    fn read(bytes: &'a [u8], legacy_allowed: bool) -> Option<Self> {
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let FromObject(request) =
            <FromObject<PlainRequest<'a>> as serde::Deserialize>::deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        let wire = match request.method.as_ref() {
            "SendMessage" => Wire::V1,
            "message/send" if legacy_allowed => Wire::V03,
            _ => return None,
        };
        let plain = request.jsonrpc == "2.0"
            && matches!(request.id, Value::String(_) | Value::Number(_))
            && request.params.0.configuration.is_none();
        let PlainMessage {
            message_id,
            context_id,
            parts: [FromObject(part)],
        } = request.params.0.message.0;
        // v1.0 takes `data` whatever `kind` says; v0.3 a part of kind `data`.
        let data = part
            .data
            .filter(|_| wire == Wire::V1 || part.kind.as_deref() == Some("data"));
        Some(Self {
            id: request.id,
            wire,
            payload: data.filter(|_| plain)?,
            message_id,
            context_id,
        })
    }
}

/// [`message_call`] for a [`PlainSend`]: authorised, then the capability
/// looked up, in the order the general reading refuses them.
fn plain_call(
    service: &RouterService,
    caller: &Caller,
    capability: &str,
    payload: Value,
    message_id: Option<Cow<'_, str>>,
    context_id: Option<Cow<'_, str>>,
) -> Result<MessageCall, Refusal> {
    service
        .admission()
        .authorize(caller, capability)
        .map_err(Refusal::stable)?;
    if !service.is_offered(capability) {
        return Err(not_offered(capability));
    }
    call_of(capability, payload, message_id.as_deref(), context_id.as_deref())
}

/// The refusal of a capability no agent offers.
fn not_offered(capability: &str) -> Refusal {
    Refusal::stable(
        RouterError::new(
            Code::CapabilityNotFound,
            format!("no agent offers capability `{capability}`"),
        )
        .with_details(json!({ "capability": capability })),
    )
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
struct Sent<'a> {
    id: &'a Value,
    wire: Wire,
    message_id: &'a str,
    context_id: &'a str,
    /// The output as the agent wrote it (JSON).
    output: &'a str,
    agent_id: &'a str,
    capability_version: &'a str,
    attempts: u32,
    request_id: &'a str,
}

impl Sent<'_> {
    fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
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
    fn message(&self, message: &mut agent_reach_pipeline::json::Object<'_>) {
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
fn sse_result(id: &Value, result: Value) -> bytes::Bytes {
    agent_reach_serving::sse::data(&json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string())
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

// === Durable tasks (the slow path) ===

/// What a `SendMessage`'s `configuration` asks beyond a plain call.
struct Asked {
    /// Answer with the task at once (v1.0 `returnImmediately`, v0.3 `blocking: false`).
    task: bool,
    /// A push config: the task's callback.
    push: Option<agent_reach_task_store::Callback>,
}

impl Asked {
    fn of(params: &Value, wire: Wire) -> Result<Self, Refusal> {
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
fn push_config_of(config: &Value) -> Result<agent_reach_task_store::Callback, Refusal> {
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
struct Rpc<'a> {
    api: &'a TaskApi,
    caller: &'a Caller,
    capability: &'a str,
    params: &'a Value,
    id: &'a Value,
    wire: Wire,
}

/// A2A's name for a durable task's state.
fn task_state(state: agent_reach_task_store::State) -> &'static str {
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
fn rfc3339(epoch_ms: u64) -> String {
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
fn error_message(error: &Value, wire: Wire) -> Value {
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
fn task_status(task: &agent_reach_task_store::Task, wire: Wire) -> Value {
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
fn output_artifact(task: &agent_reach_task_store::Task, wire: Wire) -> Option<Value> {
    let output = task.result.as_ref()?.get("output")?.clone();
    Some(json!({ "artifactId": format!("{}-output", task.task_id), "parts": [data_part(output, wire)] }))
}

/// A durable task as an A2A Task.
fn task_value(task: &agent_reach_task_store::Task, wire: Wire, artifacts: bool) -> Value {
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
fn buffered_value(task_id: &str, wire: Wire) -> Value {
    let mut value = json!({ "id": task_id, "contextId": "", "status": status("submitted", wire) });
    if wire == Wire::V03 {
        value["kind"] = json!("task");
    }
    value
}

/// A status update for `task`.
fn status_update(task: &agent_reach_task_store::Task, wire: Wire) -> Value {
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
fn task_result(task: Value, wire: Wire, wrapped: bool) -> Value {
    match wire {
        Wire::V1 if wrapped => json!({ "task": task }),
        _ => task,
    }
}

/// A router error on a task method: A2A's code for it, else [`failed`]'s.
fn task_refusal(error: RouterError, operation: Operation) -> Refusal {
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
    fn answer(&self, result: Value) -> Response {
        reply(
            StatusCode::OK,
            json!({ "jsonrpc": "2.0", "id": self.id, "result": result }),
        )
    }

    /// A required string parameter (`names`: its name in each wire, v1.0 first).
    fn string(&self, v1: &str, v03: &str) -> Result<String, Refusal> {
        let name = if self.wire == Wire::V1 { v1 } else { v03 };
        self.params
            .get(name)
            .and_then(Value::as_str)
            .filter(|value| !value.is_empty())
            .map(str::to_string)
            .ok_or_else(|| invalid(format!("`params.{name}` (the task's id) is required")))
    }

    /// The caller's task `task_id` of this capability.
    async fn owned(&self, task_id: &str, operation: Operation) -> Result<Owned, Refusal> {
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
    async fn stored(&self, task_id: &str, operation: Operation) -> Result<agent_reach_task_store::Task, Refusal> {
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
    async fn submit(&self, message: MessageCall, asked: Asked, streamed: bool) -> Result<Response, Refusal> {
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

    async fn on_task(&self, operation: Operation) -> Result<Response, Refusal> {
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
    fn config_id(&self) -> Result<(), Refusal> {
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
    async fn list(&self) -> Result<Response, Refusal> {
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
    fn subscription(&self, task: agent_reach_task_store::Task) -> Response {
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
fn artifact_update(update: Value, wire: Wire) -> Value {
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
fn event_stream(body: Body) -> Response {
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
fn push_config_value(task: &agent_reach_task_store::Task, wire: Wire) -> Option<Value> {
    let callback = task.callback.as_ref()?;
    Some(match wire {
        Wire::V1 => json!({ "taskId": task.task_id, "id": PUSH_CONFIG_ID, "url": callback.url }),
        Wire::V03 => json!({ "taskId": task.task_id,
            "pushNotificationConfig": { "id": PUSH_CONFIG_ID, "url": callback.url } }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain reading takes only what the general one reads as a plain
    /// `SendMessage` (else `None`: the general reading answers it).
    #[test]
    fn only_plain_sends_are_read_without_a_tree() {
        let read = |body: &str, legacy: bool| {
            PlainSend::read(body.as_bytes(), legacy).map(|plain| {
                (
                    plain.id,
                    plain.wire == Wire::V1,
                    plain.payload,
                    plain.message_id.map(Cow::into_owned),
                    plain.context_id.map(Cow::into_owned),
                )
            })
        };
        let v1 = r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m\u00e9","parts":[{"data":{"a":1}}],"role":"ROLE_USER"},"metadata":{}}}"#;
        assert_eq!(
            read(v1, false),
            Some((json!(1), true, json!({"a": 1}), Some("m\u{e9}".to_string()), None))
        );
        let v03 = r#" {"jsonrpc":"2.0","id":"x","method":"message/send","params":{"message":{"contextId":"c","parts":[{"kind":"data","data":null}]},"configuration":null}} "#;
        assert_eq!(
            read(v03, true),
            Some((json!("x"), false, Value::Null, None, Some("c".to_string())))
        );
        for (body, legacy) in [
            // v0.3 names only when the version allows them.
            (v03, false),
            // Arrays read positionally would pass a typed reading.
            (r#"["2.0",1,"SendMessage",{"message":{"parts":[{"data":1}]}}]"#, false),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":[{"parts":[{"data":1}]}]}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":[null,null,[{"data":1}]]}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[[null,1]]}}}"#,
                false,
            ),
            // Not one part, not a DataPart, a kind v0.3 does not take as data.
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"data":1},{"data":2}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"text":"hi"}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"parts":[{"kind":"text","data":1}]}}}"#,
                true,
            ),
            // Asking more than a call, or a request that is not JSON-RPC 2.0.
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"data":1}]},"configuration":{}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"1.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"SendMessage","params":{"message":{"parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":{},"method":"SendMessage","params":{"message":{"parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"message":{"parts":[{"data":1}]}}}"#,
                false,
            ),
            // Types the general reading forgives (an id that is no string), repeated keys, trailing bytes.
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":5,"parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"SendMessage","params":{"message":{"parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"data":1}]}}} x"#,
                false,
            ),
            ("{", false),
        ] {
            assert_eq!(read(body, legacy), None, "{body}");
        }
    }

    /// The written answer is the `json!` shape, in both wires, an object
    /// output or not (v0.3 wraps the latter), with an id of either kind.
    #[test]
    fn a_sent_message_is_written_as_its_shape() {
        for (wire, output, id) in [
            (Wire::V1, r#"{"status":"paid","n":[1,2.5]}"#, json!(7)),
            (Wire::V1, r#""text \"quoted\"""#, json!("req-\u{e9}")),
            (Wire::V03, r#"{"status":"paid"}"#, json!("a")),
            (Wire::V03, "[1,2]", json!(-3)),
            (Wire::V03, "null", json!(1)),
        ] {
            let sent = Sent {
                id: &id,
                wire,
                message_id: "m-\"1\"",
                context_id: "ctx",
                output,
                agent_id: "billing-1",
                capability_version: "1.2.0",
                attempts: 2,
                request_id: "r-1",
            };
            let written: Value = serde_json::from_slice(&sent.to_vec().unwrap()).unwrap();
            let output: Value = serde_json::from_str(output).unwrap();
            let metadata = json!({
                "agent_id": "billing-1", "capability_version": "1.2.0", "attempts": 2, "request_id": "r-1",
            });
            let message = match wire {
                Wire::V1 => json!({ "message": {
                    "messageId": "m-\"1\"", "contextId": "ctx", "role": "ROLE_AGENT",
                    "parts": [data_part(output, wire)], "metadata": metadata,
                }}),
                Wire::V03 => json!({
                    "kind": "message", "messageId": "m-\"1\"", "contextId": "ctx", "role": "agent",
                    "parts": [data_part(output, wire)], "metadata": metadata,
                }),
            };
            assert_eq!(written, json!({ "jsonrpc": "2.0", "id": id, "result": message }));
        }
    }

    #[test]
    fn epoch_milliseconds_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_161_401_123), "2026-12-01T21:43:21.123Z");
    }
}
