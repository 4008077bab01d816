//! A2A at `/a2a/{capability}` (DESIGN §8, "A2A"): every capability is an A2A
//! agent, with its agent card at `/a2a/{capability}/.well-known/agent-card.json`,
//! the JSON-RPC binding at `POST /a2a/{capability}`, the HTTP+JSON (REST)
//! binding under `/a2a/{capability}/v1/` (`rest.rs`) and the gRPC binding,
//! `lf.a2a.v1.A2AService` on the router's listener, the capability in each
//! request's `tenant` (`grpc/`).
//!
//! Methods: `SendMessage` and `SendStreamingMessage` (v1.0 names; v0.3's
//! `message/send` and `message/stream` when `A2A-Version` is absent or
//! `0.3`, answered in v0.3's shapes). A message's parts are the payload
//! (`message::payload_of`: one DataPart's `data`, TextParts as `{"text": …}`
//! when the capability's input schema takes a string `text`, several merged;
//! otherwise A2A's content-type error names what it accepts). The call goes through [`RouterService::invoke`]
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
//! it only; push-notification configs (several per task, each with the
//! client's id, its token and authentication sent back) are kept with the
//! task and notified, the task as a `StreamResponse`, when it ends or asks
//! for input. Without `--redis` the card says `pushNotifications: false`
//! and those methods answer A2A's errors.
//!
//! Multi-turn tasks: an agent that needs more input answers a 4xx coded
//! `INPUT_REQUIRED` (docs/design.md); the task goes `input-required` with the
//! agent's question as its status message (a call answered at once becomes a
//! durable task then, so it can be continued), and a message naming the task
//! (`taskId`) continues it: queued again, delivered with the conversation so
//! far (`history` in the envelope), its turns in the task's history.

use std::borrow::Cow;

use agent_reach_access::Caller;
use agent_reach_serving::front::Answer;
use agent_reach_serving::{HeaderLookup, RequestBody};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Map, Value};

use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::call::{Call, Door};
use agent_reach_pipeline::clock;
use agent_reach_pipeline::envelope;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::outcome::input_required;
use agent_reach_pipeline::stream::Item;
use agent_reach_pipeline::trace;
use agent_reach_pipeline::RouterService;
use agent_reach_tasks::{parse_rfc3339, rfc3339, Owned, TaskApi};

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
const INVALID_AGENT_RESPONSE: i64 = -32006;
const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
const EXTENSION_SUPPORT_REQUIRED: i64 = -32008;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// Where A2A errors say which stable code they carry (`google.rpc.ErrorInfo`).
const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// How many tasks a `ListTasks` page holds unless `pageSize` says (at most 100).
const LIST_PAGE: usize = 50;

/// `/a2a/{capability}`, its card, and the root card.
pub fn routes(api: TaskApi) -> axum::Router {
    // A push config's notification is the task as a `StreamResponse` (spec §4.3.3).
    api.set_a2a_notifications(std::sync::Arc::new(|task: &agent_reach_task_store::Task| {
        json!({ "task": task_value(task, Wire::V1, Shown::WHOLE) }).to_string()
    }));
    axum::Router::new()
        .route("/a2a/{capability}", post(rpc))
        // Every method reaches the binding: one it does not serve is its 404, not a bare 405.
        .route(
            "/a2a/{capability}/v1/{*route}",
            get(rest).post(rest).delete(rest).fallback(rest),
        )
        .with_state(api.clone())
        .merge(
            axum::Router::new()
                .route("/a2a/{capability}/.well-known/agent-card.json", get(card))
                .route("/.well-known/agent-card.json", get(root_card))
                .with_state(cards::CardState {
                    api: api.clone(),
                    signed: Default::default(),
                }),
        )
        .merge(grpc::routes(api))
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

/// The domain of A2A's own errors' `ErrorInfo` (spec §9.5, §10.6, §11.6).
const A2A_DOMAIN: &str = "a2a-protocol.org";

/// The domain of the `ErrorInfo` naming an Agent-Reach stable code on a
/// JSON-RPC error that is not one of A2A's (-32600, -32602, -32603).
const AGENT_REACH_DOMAIN: &str = "agent-reach";

/// The `ErrorInfo` reason of an A2A error code (§5.4): the error's name in
/// upper snake case without `Error`; `None` for the codes JSON-RPC defines.
pub(crate) fn a2a_reason(code: i64) -> Option<&'static str> {
    Some(match code {
        TASK_NOT_FOUND => "TASK_NOT_FOUND",
        TASK_NOT_CANCELABLE => "TASK_NOT_CANCELABLE",
        PUSH_NOT_SUPPORTED => "PUSH_NOTIFICATION_NOT_SUPPORTED",
        UNSUPPORTED_OPERATION => "UNSUPPORTED_OPERATION",
        CONTENT_TYPE_NOT_SUPPORTED => "CONTENT_TYPE_NOT_SUPPORTED",
        INVALID_AGENT_RESPONSE => "INVALID_AGENT_RESPONSE",
        EXTENDED_CARD_NOT_CONFIGURED => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        EXTENSION_SUPPORT_REQUIRED => "EXTENSION_SUPPORT_REQUIRED",
        VERSION_NOT_SUPPORTED => "VERSION_NOT_SUPPORTED",
        _ => return None,
    })
}

/// A JSON-RPC error. An A2A error (-32001..-32009) carries the spec's
/// `ErrorInfo` (domain `a2a-protocol.org`, reason its name, the stable code
/// and its details in `metadata` when there is one); any other code carries
/// an `ErrorInfo` of domain `agent-reach` naming the stable code, when there
/// is one, and no `data` otherwise.
pub(crate) fn rpc_error(id: &Value, code: i64, message: &str, stable: Option<&RouterError>) -> Value {
    let mut error = json!({ "code": code, "message": message });
    let envelope = stable.map(RouterError::envelope_error);
    let mut metadata = serde_json::Map::new();
    if let Some(envelope) = &envelope {
        metadata.insert("code".into(), json!(envelope.code));
        metadata.insert("retryable".into(), json!(envelope.retryable.to_string()));
        // ErrorInfo's metadata maps strings to strings: the details' scalars, as text.
        if let Some(Value::Object(details)) = &envelope.details {
            for (key, value) in details {
                let text = match value {
                    Value::String(text) => text.clone(),
                    Value::Number(_) | Value::Bool(_) => value.to_string(),
                    _ => continue,
                };
                metadata.entry(key.clone()).or_insert(json!(text));
            }
        }
    }
    let info = match (a2a_reason(code), &envelope) {
        (Some(reason), _) => {
            metadata.insert("timestamp".into(), json!(rfc3339(clock::epoch_ms())));
            Some((reason, A2A_DOMAIN))
        }
        (None, Some(envelope)) => Some((envelope.code.as_str(), AGENT_REACH_DOMAIN)),
        (None, None) => None,
    };
    if let Some((reason, domain)) = info {
        error["data"] = json!([{
            "@type": ERROR_INFO,
            "reason": reason,
            "domain": domain,
            "metadata": metadata,
        }]);
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

pub(crate) fn reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// [`reply`] as the front door writes it (no response object built).
pub(crate) fn json_reply(status: StatusCode, body: Value) -> Answer {
    Answer::json(status, &body).unwrap_or_else(|_| reply(status, body).into())
}

/// A router error as A2A's: its status and JSON-RPC code.
pub(crate) fn failed(id: &Value, error: &RouterError) -> Response {
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

/// The gRPC path of `SendMessage` (the front door's HTTP/2 hot route takes it).
pub const SEND_MESSAGE_PATH: &str = "/lf.a2a.v1.A2AService/SendMessage";

/// Whether an HTTP/2 request is a `SendMessage` [`answer_grpc_send`] may
/// take: `POST` to its path as gRPC (`application/grpc`, or `+proto`), its
/// message not compressed (no `grpc-encoding` but `identity`).
pub fn is_plain_grpc_send(request: &http::request::Parts) -> bool {
    let header = |name: &str| request.headers.get(name).map(http::HeaderValue::as_bytes);
    request.method == http::Method::POST
        && request.uri.path() == SEND_MESSAGE_PATH
        && request.uri.query().is_none()
        && matches!(
            header("content-type"),
            Some(b"application/grpc") | Some(b"application/grpc+proto")
        )
        && matches!(header("grpc-encoding"), None | Some(b"identity"))
}

/// `SendMessage` over gRPC answered without tonic's server and the axum
/// routes between (the router's front door, for an HTTP/2 request
/// [`is_plain_grpc_send`] took): its one message read from the body, the
/// same [`A2aService::send_message`] answer, written as tonic writes a
/// unary answer (the message, then `grpc-status` in trailers; an error as
/// a trailers-only answer). A body that is anything but one uncompressed
/// message within the body limit ending the stream (several messages,
/// trailers, a message over the limit or that does not decode) goes to
/// `app`, the axum routes, as it came: tonic answers it as it always did.
pub async fn answer_grpc_send(
    api: &TaskApi,
    identified: Identified,
    request: http::Request<Body>,
    app: axum::Router,
) -> http::Response<Body> {
    let limit = api.service().tuning().max_body_bytes;
    let (parts, body) = request.into_parts();
    let message = match grpc::one_message(body, limit).await {
        Ok(message) => message,
        Err(body) => return agent_reach_serving::front::answer_by(app, http::Request::from_parts(parts, body)).await,
    };
    grpc::answer_send(api, identified, parts.headers, message).await
}

mod cards;
mod grpc;
mod jsonrpc;
mod message;
mod push;
mod rest;
mod send;
mod tasks;
mod view;

use cards::*;
pub use jsonrpc::answer_rpc;
use jsonrpc::*;
use message::*;
use push::*;
pub use rest::answer_rest_send;
use rest::*;
use send::*;
use tasks::*;
use view::*;

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
        let v03 = r#" {"jsonrpc":"2.0","id":"x","method":"message/send","params":{"message":{"messageId":"m","role":"user","contextId":"c","parts":[{"kind":"data","data":null}]},"configuration":null}} "#;
        assert_eq!(
            read(v03, true),
            Some((
                json!("x"),
                false,
                Value::Null,
                Some("m".to_string()),
                Some("c".to_string())
            ))
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
            // A message without its sender's fields, from an agent, or continuing a task.
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"","role":"ROLE_USER","parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"kind":"data","data":1}]}}}"#,
                true,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","taskId":"t_1","parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","task_id":"t_1","parts":[{"data":1}]}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","context_id":"c","parts":[{"data":1}]}}}"#,
                false,
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

    #[test]
    fn rfc3339_is_read_back_with_fractions_and_offsets() {
        for ms in [0, 951_782_400_000, 1_796_161_401_123, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms), "{}", rfc3339(ms));
        }
        assert_eq!(parse_rfc3339("2026-12-01T21:43:21Z"), Some(1_796_161_401_000));
        assert_eq!(parse_rfc3339("2026-12-01T21:43:21.1234567z"), Some(1_796_161_401_123));
        assert_eq!(parse_rfc3339("2026-12-01T23:43:21.123+02:00"), Some(1_796_161_401_123));
        assert_eq!(parse_rfc3339("2026-12-01T20:13:21.123-01:30"), Some(1_796_161_401_123));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Some(0));
        for bad in [
            "",
            "2026-12-01",
            "2026-12-01 21:43:21Z",
            "2026-13-01T21:43:21Z",
            "2026-02-29T21:43:21Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T21:43:21",
            "2026-12-01T21:43:21.Z",
            "2026-12-01T21:43:21+0200",
            "2026-12-01T21:43:21Zjunk",
            "２026-12-01T21:43:21Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn a2a_errors_carry_the_specs_error_info_and_others_the_stable_code() {
        let found = rpc_error(
            &json!(3),
            TASK_NOT_FOUND,
            "no task",
            Some(&RouterError::new(Code::TaskNotFound, "no task").with_details(json!({"task_id": "t_1"}))),
        );
        assert_eq!(found["id"], 3);
        let info = &found["error"]["data"][0];
        assert_eq!(info["@type"], ERROR_INFO);
        assert_eq!(info["domain"], "a2a-protocol.org");
        assert_eq!(info["reason"], "TASK_NOT_FOUND");
        assert_eq!(info["metadata"]["code"], "TASK_NOT_FOUND");
        assert_eq!(info["metadata"]["task_id"], "t_1");
        assert!(info["metadata"]["timestamp"].as_str().and_then(parse_rfc3339).is_some());
        // Every A2A code has the spec's reason, with no stable error too.
        for (code, reason) in [
            (-32001, "TASK_NOT_FOUND"),
            (-32002, "TASK_NOT_CANCELABLE"),
            (-32003, "PUSH_NOTIFICATION_NOT_SUPPORTED"),
            (-32004, "UNSUPPORTED_OPERATION"),
            (-32005, "CONTENT_TYPE_NOT_SUPPORTED"),
            (-32006, "INVALID_AGENT_RESPONSE"),
            (-32007, "EXTENDED_AGENT_CARD_NOT_CONFIGURED"),
            (-32008, "EXTENSION_SUPPORT_REQUIRED"),
            (-32009, "VERSION_NOT_SUPPORTED"),
        ] {
            let error = rpc_error(&json!("a"), code, "m", None);
            assert_eq!(error["error"]["data"][0]["reason"], reason);
            assert_eq!(error["error"]["data"][0]["domain"], "a2a-protocol.org");
        }
        let forbidden = rpc_error(
            &json!(1),
            INVALID_REQUEST,
            "no",
            Some(&RouterError::new(Code::Forbidden, "no")),
        );
        let info = &forbidden["error"]["data"][0];
        assert_eq!(
            (&info["domain"], &info["reason"]),
            (&json!("agent-reach"), &json!("FORBIDDEN"))
        );
        assert!(rpc_error(&json!(1), METHOD_NOT_FOUND, "m", None)["error"]
            .get("data")
            .is_none());
    }

    #[test]
    fn parts_become_the_payload_by_the_documented_rule() {
        let text_schema = r#"{"type":"object","properties":{"text":{"type":"string"},"lang":{"type":"string"}}}"#;
        let data_schema = r#"{"type":"object","properties":{"order_id":{"type":"string"}}}"#;
        let payload = |parts: Value, wire: Wire, schema: &str| {
            payload_of(parts.as_array().unwrap(), wire, "x", schema).map_err(|refusal| (refusal.code, refusal.message))
        };
        assert_eq!(payload(json!([{"data": 5}]), Wire::V1, data_schema), Ok(json!(5)));
        assert_eq!(
            payload(json!([{"text": "a"}, {"text": "b"}]), Wire::V1, text_schema),
            Ok(json!({"text": "a\nb"}))
        );
        assert_eq!(
            payload(
                json!([{"data": {"order_id": "SO-1"}}, {"data": {"count": 2}}]),
                Wire::V1,
                data_schema
            ),
            Ok(json!({"order_id": "SO-1", "count": 2}))
        );
        assert_eq!(
            payload(
                json!([{"kind": "text", "text": "hi"}, {"kind": "data", "data": {"lang": "en"}}]),
                Wire::V03,
                text_schema
            ),
            Ok(json!({"text": "hi", "lang": "en"}))
        );
        for (parts, wire, schema, code) in [
            (
                json!([{"text": "a"}]),
                Wire::V1,
                data_schema,
                CONTENT_TYPE_NOT_SUPPORTED,
            ),
            (
                json!([{"url": "http://x/f.pdf"}]),
                Wire::V1,
                data_schema,
                CONTENT_TYPE_NOT_SUPPORTED,
            ),
            (
                json!([{"kind": "file", "file": {}}]),
                Wire::V03,
                data_schema,
                CONTENT_TYPE_NOT_SUPPORTED,
            ),
            (
                json!([{"data": 1}, {"data": {"a": 1}}]),
                Wire::V1,
                data_schema,
                INVALID_PARAMS,
            ),
            (
                json!([{"data": {"a": 1}}, {"data": {"a": 2}}]),
                Wire::V1,
                data_schema,
                INVALID_PARAMS,
            ),
            (
                json!([{"data": {"text": "x"}}, {"text": "y"}]),
                Wire::V1,
                text_schema,
                INVALID_PARAMS,
            ),
        ] {
            let answer = payload(parts.clone(), wire, schema);
            assert_eq!(
                answer.as_ref().map_err(|(code, _)| *code),
                Err(code),
                "{parts}: {answer:?}"
            );
        }
    }

    #[test]
    fn list_filters_are_checked() {
        assert_eq!(status_filter(None).ok(), Some(None));
        assert_eq!(status_filter(Some(&json!("TASK_STATE_UNSPECIFIED"))).ok(), Some(None));
        assert_eq!(
            status_filter(Some(&json!("TASK_STATE_WORKING"))).ok(),
            Some(Some("TASK_STATE_WORKING"))
        );
        assert_eq!(status_filter(Some(&json!(3))).ok(), Some(Some("TASK_STATE_COMPLETED")));
        for bad in [
            json!("WORKING"),
            json!("TASK_STATE_DONE"),
            json!(9),
            json!(-1),
            json!(true),
        ] {
            assert!(status_filter(Some(&bad)).is_err(), "{bad}");
        }
        assert_eq!(history_length(None, "h").ok(), Some(None));
        assert_eq!(history_length(Some(&json!(0)), "h").ok(), Some(Some(0)));
        for bad in [json!(-1), json!(1.5), json!("2")] {
            assert!(history_length(Some(&bad), "h").is_err(), "{bad}");
        }
    }
}
