//! MCP at `/mcp` (DESIGN §8, "MCP"): every capability the caller may call is
//! an MCP tool, over the Streamable HTTP transport.
//!
//! Revisions, chosen per request by its `MCP-Protocol-Version` header:
//! - `2026-07-28`, stateless (what the `mcp` PyPI client picks after its
//!   `server/discover` probe): no handshake; every request carries the
//!   version and the client's capabilities in `_meta` (missing: 400
//!   `-32602`), the header and `Mcp-Method` (and, for `tools/call`,
//!   `Mcp-Name`, Base64 sentinel decoded) must match the body (else 400
//!   `-32020` HeaderMismatch); results carry `resultType: "complete"` and
//!   the server's identity in `_meta`; `tools/list` and `server/discover`
//!   carry `ttlMs` and `cacheScope` (`private` for the list: it is the
//!   token's); an unknown method is 404 `-32601`.
//! - the handshake revisions `2025-11-25`, `2025-06-18` and `2025-03-26`,
//!   through `initialize`; no header is `2025-03-26`, whose JSON-RPC
//!   batches are answered (an array, in order; `202` when only
//!   notifications came).
//! - any other version: 400 `-32022` UnsupportedProtocolVersion with
//!   `data: {supported, requested}`.
//!
//! The server keeps no session: it issues no `Mcp-Session-Id` (ignoring one
//! a client sends), so any router replica answers any request, and every
//! request carries the caller's bearer token, verified each time.
//!
//! `tools/list` lists the capabilities the caller's token may call under the
//! current `acl.yaml` (the one authorisation, [`agent_reach_pipeline::admission`]), each at
//! its highest version: name, description, `inputSchema`, `outputSchema`.
//! `tools/call` is a call like `/v1/invoke`'s ([`RouterService::invoke`]:
//! admission, selection, retries, deadline, metrics), its output as
//! `structuredContent` (and as JSON text); a call the router refuses or an
//! agent fails is a tool error (`isError: true`) carrying the stable code.
//!
//! A capability whose input schema is not an object's is offered with the
//! input wrapped (`{"input": …}`), since MCP tools take an object of arguments.
//! Answers are single JSON responses, except a `tools/call` that asks for
//! progress (`_meta.progressToken`) from a client that accepts
//! `text/event-stream`: it is streamed (`RouterService::stream`), each agent
//! event relayed as it arrives as a `notifications/progress` whose `message`
//! is the event's data, then the result (the events' items collected, as a
//! call without progress gets them). GET (a server-initiated stream) and
//! DELETE (no session to end) are 405.
//!
//! `Origin` (Streamable HTTP's security MUST, against DNS rebinding): a
//! request with no `Origin` (every non-browser client) passes; one whose
//! `Origin` is a loopback origin (`localhost`, `127.0.0.0/8`, `[::1]`) or
//! is listed in `--mcp-allowed-origin` passes; any other is 403 before
//! anything else is read, with a JSON-RPC error without id
//! (`data.code` `FORBIDDEN`, `data.details.origin`).

use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_serving::HeaderLookup;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{json, Map, Value};

use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::call::{Call, Door};
use agent_reach_pipeline::clock;
use agent_reach_pipeline::envelope;
use agent_reach_pipeline::error::RouterError;
use agent_reach_pipeline::stream::Item;
use agent_reach_pipeline::trace;
use agent_reach_pipeline::RouterService;
use agent_reach_tasks::TaskApi;

/// The handshake revisions served, newest first.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// JSON-RPC 2.0's codes, as MCP uses them.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
/// Implementation-defined (the range -32000..-32099): the bearer token was refused.
const UNAUTHENTICATED: i64 = -32001;
const INTERNAL_ERROR: i64 = -32603;
/// MCP's own codes (2026-07-28, the range -32020..-32099).
const HEADER_MISMATCH: i64 = -32020;
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The most messages one 2025-03-26 batch may hold.
const MOST_BATCHED: usize = 100;

mod origin;
mod tasks;
mod tools;

use origin::check_origin;
use tools::*;

/// `/mcp`.
pub fn routes(api: TaskApi) -> axum::Router {
    axum::Router::new()
        .route("/mcp", post(mcp).get(not_here).delete(not_here))
        .layer(axum::middleware::from_fn_with_state(
            api.service().clone(),
            check_origin,
        ))
        .with_state(api)
}

/// GET and DELETE: no server-initiated stream, no session to end.
async fn not_here() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(http::header::ALLOW, "POST")],
        axum::Json(rpc_error(
            Value::Null,
            INVALID_REQUEST,
            "this MCP server answers POST only (no server-initiated stream, no session)",
            None,
        )),
    )
        .into_response()
}

fn rpc_error(id: Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({ "code": code, "message": message });
    if let Some(data) = data {
        error["data"] = data;
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

fn rpc_result(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// An error answer in JSON-RPC's shape, with the stable code in `data.code`.
fn refused(status: StatusCode, id: Value, code: i64, error: &RouterError) -> Response {
    let data = json!({ "code": error.code.as_str(), "details": error.details.as_deref() });
    answer(status, rpc_error(id, code, &error.message, Some(data)))
}

/// The revision a request speaks, from its `MCP-Protocol-Version` header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Era {
    /// A handshake revision: `initialize`, then requests without `_meta`
    /// rules. No header is `2025-03-26` (the spec's rule for clients older
    /// than the header), the one revision whose JSON-RPC batches are served.
    Legacy(&'static str),
    /// `2026-07-28`: stateless, every request carrying its version and the
    /// client's capabilities in `_meta`, mirrored in `Mcp-Method`/`Mcp-Name`.
    Modern,
}

impl Era {
    fn batches(self) -> bool {
        self == Era::Legacy("2025-03-26")
    }
}

/// What one message gets back.
enum Reply {
    Json(StatusCode, Value),
    /// A notification accepted: `202` with no body (no element of a batch).
    Accepted,
    /// A `tools/call` streamed with progress (never in a batch).
    Stream(Box<Response>),
}

impl Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Json(status, body) => answer(status, body),
            Reply::Accepted => StatusCode::ACCEPTED.into_response(),
            Reply::Stream(response) => *response,
        }
    }
}

/// What every message of one HTTP request shares.
struct Request<'a> {
    api: &'a TaskApi,
    service: &'a Arc<RouterService>,
    caller: &'a Caller,
    headers: &'a HeaderMap,
    received: clock::Now,
    era: Era,
}

async fn mcp(State(api): State<TaskApi>, identified: Identified, headers: HeaderMap, body: Body) -> Response {
    let received = identified.received;
    // Authenticated first: an unauthenticated caller learns nothing, not even parse errors.
    let caller = match identified.caller {
        Ok(caller) => caller,
        Err(error) => {
            let mut response = refused(StatusCode::UNAUTHORIZED, Value::Null, UNAUTHENTICATED, &error);
            response
                .headers_mut()
                .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
            return response;
        }
    };
    let era = match headers.value("mcp-protocol-version") {
        None => Era::Legacy("2025-03-26"),
        Some(version) => match std::str::from_utf8(version) {
            Ok(MODERN_VERSION) => Era::Modern,
            Ok(version) => match PROTOCOL_VERSIONS.iter().find(|known| **known == version) {
                Some(known) => Era::Legacy(known),
                None => return unsupported_version(Value::Null, version).into_response(),
            },
            Err(_) => {
                let requested = String::from_utf8_lossy(version).into_owned();
                return unsupported_version(Value::Null, &requested).into_response();
            }
        },
    };
    let service = api.service();
    let bytes = match envelope::read_body(&headers, body, service.tuning().max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => return refused(error.status(), Value::Null, INVALID_REQUEST, &error),
    };
    let message: Value = match serde_json::from_slice(&bytes) {
        Ok(message) => message,
        Err(error) => {
            return answer(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    Value::Null,
                    PARSE_ERROR,
                    &format!("the body is not JSON: {error}"),
                    None,
                ),
            )
        }
    };
    let request = Request {
        api: &api,
        service,
        caller: &caller,
        headers: &headers,
        received,
        era,
    };
    match message {
        Value::Array(batch) if era.batches() => request.batch(batch).await,
        Value::Array(_) => answer(
            StatusCode::BAD_REQUEST,
            rpc_error(
                Value::Null,
                INVALID_REQUEST,
                "a JSON-RPC message is one object: batches are served only under MCP-Protocol-Version 2025-03-26 \
                 (or with no version header), the one revision that allows them",
                None,
            ),
        ),
        message => request.one(message, false).await.into_response(),
    }
}

/// The revision this server speaks without a handshake.
pub const MODERN_VERSION: &str = "2026-07-28";

/// Every revision served, newest first.
fn supported_versions() -> Vec<&'static str> {
    std::iter::once(MODERN_VERSION).chain(PROTOCOL_VERSIONS).collect()
}

/// `UnsupportedProtocolVersionError` (400, `-32022`, `data: {supported, requested}`).
fn unsupported_version(id: Value, requested: &str) -> Reply {
    Reply::Json(
        StatusCode::BAD_REQUEST,
        rpc_error(
            id,
            UNSUPPORTED_PROTOCOL_VERSION,
            &format!(
                "unsupported MCP protocol version `{requested}`; this server speaks {}",
                supported_versions().join(", ")
            ),
            Some(json!({ "supported": supported_versions(), "requested": requested })),
        ),
    )
}

/// A header that disagrees with the body it mirrors (400, `-32020`).
fn header_mismatch(id: Value, message: String) -> Reply {
    Reply::Json(
        StatusCode::BAD_REQUEST,
        rpc_error(id, HEADER_MISMATCH, &format!("Header mismatch: {message}"), None),
    )
}

/// A header value as the spec encodes it: plain visible ASCII, or
/// `=?base64?…?=` (UTF-8). `None` when it is neither.
fn header_text(value: &[u8]) -> Option<String> {
    use base64::Engine as _;
    let text = std::str::from_utf8(value).ok()?;
    if let Some(encoded) = text.strip_prefix("=?base64?").and_then(|rest| rest.strip_suffix("?=")) {
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
        return String::from_utf8(decoded).ok();
    }
    text.bytes()
        .all(|byte| byte == b' ' || byte == b'\t' || byte.is_ascii_graphic())
        .then(|| text.to_string())
}

impl Request<'_> {
    /// A 2025-03-26 batch: each message answered in order in one array,
    /// notifications and responses left out (`202` when nothing is left).
    async fn batch(&self, batch: Vec<Value>) -> Response {
        if batch.is_empty() || batch.len() > MOST_BATCHED {
            return answer(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    Value::Null,
                    INVALID_REQUEST,
                    &format!(
                        "a batch holds 1 to {MOST_BATCHED} messages; this one holds {}",
                        batch.len()
                    ),
                    None,
                ),
            );
        }
        let replies = futures::future::join_all(batch.into_iter().map(|message| self.one(message, true))).await;
        let answers: Vec<Value> = replies
            .into_iter()
            .filter_map(|reply| match reply {
                Reply::Json(_, body) => Some(body),
                Reply::Accepted => None,
                // Never: progress is not streamed in a batch.
                Reply::Stream(_) => Some(rpc_error(
                    Value::Null,
                    INTERNAL_ERROR,
                    "a streamed answer cannot be batched",
                    None,
                )),
            })
            .collect();
        if answers.is_empty() {
            return StatusCode::ACCEPTED.into_response();
        }
        answer(StatusCode::OK, Value::Array(answers))
    }

    /// One JSON-RPC message.
    async fn one(&self, message: Value, batched: bool) -> Reply {
        let (service, caller, headers, era) = (self.service, self.caller, self.headers, self.era);
        let Value::Object(message) = message else {
            return Reply::Json(
                StatusCode::BAD_REQUEST,
                rpc_error(Value::Null, INVALID_REQUEST, "a JSON-RPC message is an object", None),
            );
        };
        let id = message.get("id").cloned();
        let valid_id = matches!(id, None | Some(Value::String(_) | Value::Number(_)));
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") || !valid_id {
            return Reply::Json(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    id.filter(|_| valid_id).unwrap_or(Value::Null),
                    INVALID_REQUEST,
                    "not a JSON-RPC 2.0 message: `jsonrpc` must be \"2.0\" and `id` a string or number",
                    None,
                ),
            );
        }
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            // A response to a request of ours (we send none) or a malformed message.
            if message.contains_key("result") || message.contains_key("error") {
                return Reply::Accepted;
            }
            return Reply::Json(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    id.unwrap_or(Value::Null),
                    INVALID_REQUEST,
                    "a request needs a string `method`",
                    None,
                ),
            );
        };
        let Some(id) = id else {
            // A notification (`notifications/initialized`, `notifications/cancelled`): nothing to answer.
            return Reply::Accepted;
        };
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        if !matches!(params, Value::Null | Value::Object(_)) {
            let status = if era == Era::Modern {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::OK
            };
            return Reply::Json(
                status,
                rpc_error(id, INVALID_PARAMS, "`params` must be an object", None),
            );
        }
        if era == Era::Modern {
            if let Err(reply) = check_modern(headers, method, &params, &id) {
                return reply;
            }
        }
        if method == "initialize" && batched {
            return Reply::Json(
                StatusCode::OK,
                rpc_error(
                    id,
                    INVALID_REQUEST,
                    "`initialize` may not be part of a batch (2025-03-26)",
                    None,
                ),
            );
        }
        // A tool call that becomes a task (never in a batch), and the tasks' own methods.
        if method == "tools/call" && !batched {
            if let Some(answered) = self.call_as_task(&params).await {
                return reply_of(id, answered, era);
            }
        }
        if method.starts_with("tasks/") {
            if let Some(answered) = self.on_task_method(method, &params).await {
                return reply_of(id, answered, era);
            }
        }
        let tasks = self.api.tasks_enabled();
        let result = match (method, era) {
            ("server/discover", _) => Ok(discover(tasks)),
            ("initialize", Era::Legacy(_)) => Ok(initialize(&params, tasks)),
            ("ping", Era::Legacy(_)) => Ok(json!({})),
            ("tools/list", _) => Ok(list_tools(service, caller, era, tasks)),
            ("tools/call", _) => {
                let progress = params
                    .pointer("/_meta/progressToken")
                    .filter(|token| token.is_string() || token.is_number())
                    .filter(|_| !batched);
                match (progress, agent_reach_serving::sse::accepts_events(headers.value("accept"))) {
                    (Some(token), true) => {
                        return match prepare_call(service, caller, &params) {
                            Ok(Ok(prepared)) => {
                                Reply::Stream(Box::new(call_tool_streamed(self, prepared, id, token.clone()).await))
                            }
                            Ok(Err(error)) => Reply::Json(StatusCode::OK, rpc_result(id, completed(error, era))),
                            Err((code, message)) => {
                                Reply::Json(StatusCode::OK, rpc_error(id, code, &message, None))
                            }
                        };
                    }
                    _ => call_tool(service, caller, headers, &params, self.received).await,
                }
            }
            _ => Err((
                METHOD_NOT_FOUND,
                match era {
                    Era::Modern => format!(
                        "method `{method}` is not served here (server/discover, tools/list, tools/call under {MODERN_VERSION})"
                    ),
                    Era::Legacy(_) => format!(
                        "method `{method}` is not served here (initialize, ping, server/discover, tools/list, tools/call)"
                    ),
                },
            )),
        };
        reply_of(id, result, era)
    }
}

/// A method's answer as its reply.
fn reply_of(id: Value, result: Result<Value, (i64, String)>, era: Era) -> Reply {
    match result {
        Ok(result) => Reply::Json(StatusCode::OK, rpc_result(id, completed(result, era))),
        // Under 2026-07-28 an unknown method is 404 (the transport's rule).
        Err((METHOD_NOT_FOUND, message)) if era == Era::Modern => {
            Reply::Json(StatusCode::NOT_FOUND, rpc_error(id, METHOD_NOT_FOUND, &message, None))
        }
        Err((code, message)) => Reply::Json(StatusCode::OK, rpc_error(id, code, &message, None)),
    }
}

/// A result as its era writes it: under 2026-07-28 with `resultType` and the
/// server's identity in `_meta`.
fn completed(mut result: Value, era: Era) -> Value {
    if era == Era::Modern {
        if let Value::Object(fields) = &mut result {
            // A task's creation says `task`; every other result is complete.
            fields.entry("resultType").or_insert_with(|| json!("complete"));
            let meta = fields.entry("_meta").or_insert_with(|| json!({}));
            if let Value::Object(meta) = meta {
                meta.insert("io.modelcontextprotocol/serverInfo".into(), server_info());
            }
        }
    }
    result
}

fn server_info() -> Value {
    json!({ "name": "agent-reach-router", "version": env!("CARGO_PKG_VERSION") })
}

/// A 2026-07-28 request's rules (spec: basic §"Per-request protocol
/// fields", Streamable HTTP §"Server Validation"): `_meta` carries the
/// protocol version (the header's) and the client's capabilities; the
/// `Mcp-Method` header is the method, `Mcp-Name` the tool a `tools/call` names.
fn check_modern(headers: &HeaderMap, method: &str, params: &Value, id: &Value) -> Result<(), Reply> {
    let meta = params.get("_meta");
    match meta
        .and_then(|meta| meta.get("io.modelcontextprotocol/protocolVersion"))
        .and_then(Value::as_str)
    {
        None => {
            return Err(Reply::Json(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    id.clone(),
                    INVALID_PARAMS,
                    &format!(
                        "`params._meta[\"io.modelcontextprotocol/protocolVersion\"]` is required under {MODERN_VERSION}"
                    ),
                    None,
                ),
            ))
        }
        Some(MODERN_VERSION) => {}
        Some(other) => {
            return Err(header_mismatch(
                id.clone(),
                format!("MCP-Protocol-Version is {MODERN_VERSION}, the body's _meta protocolVersion `{other}`"),
            ))
        }
    }
    if !meta
        .and_then(|meta| meta.get("io.modelcontextprotocol/clientCapabilities"))
        .is_some_and(Value::is_object)
    {
        return Err(Reply::Json(
            StatusCode::BAD_REQUEST,
            rpc_error(
                id.clone(),
                INVALID_PARAMS,
                &format!(
                    "`params._meta[\"io.modelcontextprotocol/clientCapabilities\"]` (an object) is required under {MODERN_VERSION}"
                ),
                None,
            ),
        ));
    }
    mirrored(headers, "Mcp-Method", method, id)?;
    if method == "tools/call" {
        let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
        mirrored(headers, "Mcp-Name", name, id)?;
    }
    // The Tasks extension's routing header: a task method names its task.
    if matches!(method, "tasks/get" | "tasks/update" | "tasks/cancel") {
        let task_id = params.get("taskId").and_then(Value::as_str).unwrap_or_default();
        mirrored(headers, "Mcp-Name", task_id, id)?;
    }
    Ok(())
}

/// The `header` mirroring `body` (its Base64 sentinel decoded) is there and
/// equal to it; else 400 `-32020` HeaderMismatch naming both.
fn mirrored(headers: &HeaderMap, header: &str, body: &str, id: &Value) -> Result<(), Reply> {
    match headers.value(&header.to_ascii_lowercase()).map(header_text) {
        None => Err(header_mismatch(id.clone(), format!("the {header} header is missing"))),
        Some(Some(named)) if named == body => Ok(()),
        Some(named) => Err(header_mismatch(
            id.clone(),
            format!(
                "{header} header value `{}` does not match body value `{body}`",
                named.unwrap_or_else(|| "(not a header-safe value)".into())
            ),
        )),
    }
}

/// How long a client may keep `tools/list` or `server/discover` (2026-07-28 caching).
pub const LIST_TTL_MS: u64 = 30_000;

/// `server/discover`: the revisions served, the capabilities (the Tasks
/// extension with durable tasks), who answers.
fn discover(tasks: bool) -> Value {
    let mut capabilities = json!({ "tools": { "listChanged": false } });
    if tasks {
        capabilities["extensions"] = json!({ tasks::EXTENSION: {} });
    }
    json!({
        "supportedVersions": supported_versions(),
        "capabilities": capabilities,
        "instructions": INSTRUCTIONS,
        "ttlMs": LIST_TTL_MS,
        "cacheScope": "public",
    })
}

const INSTRUCTIONS: &str = "Each tool is an Agent-Reach capability this token may call; calls are schema-checked, \
                            load-balanced and retried by the router. A failed call is a tool error whose \
                            _meta[\"agent-reach/error\"].code is the router's stable code.";

/// The handshake: the client's revision when served, else our newest;
/// 2025-11-25's tasks utility with durable tasks.
fn initialize(params: &Value, tasks: bool) -> Value {
    let asked = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = PROTOCOL_VERSIONS
        .iter()
        .find(|version| **version == asked)
        .unwrap_or(&PROTOCOL_VERSIONS[0]);
    let mut capabilities = json!({ "tools": { "listChanged": false } });
    if tasks && *version == "2025-11-25" {
        capabilities["tasks"] = json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } });
    }
    json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": { "name": "agent-reach-router", "version": env!("CARGO_PKG_VERSION") },
        "instructions": INSTRUCTIONS,
    })
}

#[cfg(test)]
mod header_tests {
    use super::{header_text, supported_versions, MODERN_VERSION, PROTOCOL_VERSIONS};

    #[test]
    fn header_values_are_plain_ascii_or_the_base64_sentinel() {
        assert_eq!(header_text(b"tools/call").as_deref(), Some("tools/call"));
        assert_eq!(header_text(b"a b\tc").as_deref(), Some("a b\tc"));
        assert_eq!(
            header_text("=?base64?SGVsbG8sIOS4lueVjA==?=".as_bytes()).as_deref(),
            Some("Hello, 世界")
        );
        assert_eq!(
            header_text(b"=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=").as_deref(),
            Some("=?base64?literal?=")
        );
        for bad in [
            &b"=?base64?not base64?="[..],
            b"=?base64?/w==?=",
            b"line\nbreak",
            b"\xff",
        ] {
            assert_eq!(header_text(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_newest_revision_comes_first_then_the_handshake_ones() {
        let supported = supported_versions();
        assert_eq!(supported[0], MODERN_VERSION);
        assert_eq!(&supported[1..], PROTOCOL_VERSIONS);
    }
}
