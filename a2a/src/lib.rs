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

/// A JSON-RPC error, `data` naming the stable code as A2A's ErrorInfo does.
pub(crate) fn rpc_error(id: &Value, code: i64, message: &str, stable: Option<&RouterError>) -> Value {
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

mod cards;
mod jsonrpc;
mod message;
mod send;
mod tasks;

use cards::*;
pub use jsonrpc::answer_rpc;
use jsonrpc::*;
use message::*;
use send::*;
use tasks::*;

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
