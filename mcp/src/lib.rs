//! MCP at `/mcp` (DESIGN §8, "MCP"): every capability the caller may call is
//! an MCP tool, over the Streamable HTTP transport.
//!
//! Revisions: the handshake revisions `2025-11-25` (what the `mcp` PyPI
//! client negotiates here), `2025-06-18` and `2025-03-26`, all through
//! `initialize`. The stateless `2026-07-28` revision's `server/discover` is
//! answered "method not found", which current clients take as the cue to use
//! the handshake. The server keeps no session: it issues no `Mcp-Session-Id`
//! (ignoring one a client sends), so any router replica answers any request,
//! and every request carries the caller's bearer token, verified each time.
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

/// The handshake revisions served, newest first.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// JSON-RPC 2.0's codes, as MCP uses them.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
/// Implementation-defined (the range -32000..-32099): the bearer token was refused.
const UNAUTHENTICATED: i64 = -32001;

/// `/mcp`.
pub fn routes(service: Arc<RouterService>) -> axum::Router {
    axum::Router::new()
        .route("/mcp", post(mcp).get(not_here).delete(not_here))
        .layer(axum::middleware::from_fn_with_state(service.clone(), check_origin))
        .with_state(service)
}

/// Refuses a request whose `Origin` is neither loopback nor allowed (403).
async fn check_origin(
    State(service): State<Arc<RouterService>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(origin) = request.headers().get(http::header::ORIGIN) else {
        return next.run(request).await;
    };
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    if origin_allowed(&origin, &service.tuning().mcp_allowed_origins) {
        return next.run(request).await;
    }
    answer(
        StatusCode::FORBIDDEN,
        rpc_error(
            Value::Null,
            INVALID_REQUEST,
            &format!(
                "Origin `{origin}` may not use this MCP server (DNS rebinding guard): \
                 only loopback origins and those given with --mcp-allowed-origin may"
            ),
            Some(json!({ "code": "FORBIDDEN", "details": { "origin": origin } })),
        ),
    )
}

/// `scheme://host[:port]` lowercased, without a default port or a trailing slash.
fn normalized_origin(origin: &str) -> Option<(String, String, String)> {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    if rest.is_empty() || rest.contains('/') || rest.contains('@') {
        return None;
    }
    // `[v6]:port` or `host:port`, the port optional.
    let (host, port) = match rest.strip_prefix('[') {
        Some(v6) => {
            let (address, after) = v6.split_once(']')?;
            (
                format!("[{address}]"),
                after.strip_prefix(':').unwrap_or(after).to_string(),
            )
        }
        None => match rest.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.to_string()),
            None => (rest.to_string(), String::new()),
        },
    };
    if host.is_empty() || host == "[]" || !port.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let port = match (scheme, port.as_str()) {
        ("http", "80") | ("https", "443") => String::new(),
        _ => port,
    };
    Some((scheme.to_string(), host, port))
}

/// Whether a browser page at `origin` may call: a loopback origin, or one of `allowed` (`*`: any).
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|entry| entry == "*") {
        return true;
    }
    if origin.trim() == "null" {
        return allowed.iter().any(|entry| entry == "null");
    }
    let Some(seen) = normalized_origin(origin) else {
        return false;
    };
    let host = seen.1.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    loopback
        || allowed
            .iter()
            .any(|entry| normalized_origin(entry).as_ref() == Some(&seen))
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

async fn mcp(
    State(service): State<Arc<RouterService>>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
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
    if let Some(version) = headers.value("mcp-protocol-version") {
        let known = std::str::from_utf8(version).is_ok_and(|version| PROTOCOL_VERSIONS.contains(&version));
        if !known {
            return answer(
                StatusCode::BAD_REQUEST,
                rpc_error(
                    Value::Null,
                    INVALID_REQUEST,
                    &format!(
                        "unsupported MCP-Protocol-Version `{}`; this server speaks {}",
                        String::from_utf8_lossy(version),
                        PROTOCOL_VERSIONS.join(", ")
                    ),
                    Some(json!({ "supported": PROTOCOL_VERSIONS })),
                ),
            );
        }
    }
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
    let Value::Object(message) = message else {
        // Batches went away in 2025-06-18; a bare value was never a message.
        return answer(
            StatusCode::BAD_REQUEST,
            rpc_error(
                Value::Null,
                INVALID_REQUEST,
                "a JSON-RPC message is one object (batches are not accepted)",
                None,
            ),
        );
    };
    let id = message.get("id").cloned();
    let valid_id = matches!(id, None | Some(Value::String(_) | Value::Number(_)));
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") || !valid_id {
        return answer(
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
            return StatusCode::ACCEPTED.into_response();
        }
        return answer(
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
        return StatusCode::ACCEPTED.into_response();
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    if !matches!(params, Value::Null | Value::Object(_)) {
        return answer(
            StatusCode::OK,
            rpc_error(id, INVALID_PARAMS, "`params` must be an object", None),
        );
    }
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(list_tools(&service, &caller)),
        "tools/call" => {
            let progress = params
                .pointer("/_meta/progressToken")
                .filter(|token| token.is_string() || token.is_number());
            match (
                progress,
                agent_reach_serving::sse::accepts_events(headers.value("accept")),
            ) {
                (Some(token), true) => {
                    return match prepare_call(&service, &caller, &params) {
                        Ok(Ok(prepared)) => {
                            call_tool_streamed(&service, &caller, &headers, prepared, received, id, token.clone()).await
                        }
                        Ok(Err(error)) => answer(StatusCode::OK, rpc_result(id, error)),
                        Err((code, message)) => answer(StatusCode::OK, rpc_error(id, code, &message, None)),
                    }
                }
                _ => call_tool(&service, &caller, &headers, &params, received).await,
            }
        }
        _ => Err((
            METHOD_NOT_FOUND,
            format!("method `{method}` is not served here (initialize, ping, tools/list, tools/call)"),
        )),
    };
    match result {
        Ok(result) => answer(StatusCode::OK, rpc_result(id, result)),
        Err((code, message)) => answer(StatusCode::OK, rpc_error(id, code, &message, None)),
    }
}

/// The handshake: the client's revision when served, else our newest.
fn initialize(params: &Value) -> Value {
    let asked = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = PROTOCOL_VERSIONS
        .iter()
        .find(|version| **version == asked)
        .unwrap_or(&PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": { "name": "agent-reach-router", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "Each tool is an Agent-Reach capability this token may call; calls are schema-checked, \
                         load-balanced and retried by the router. A failed call is a tool error whose \
                         structuredContent.error.code is the router's stable code.",
    })
}

/// A JSON Schema text as a value; empty (or unparsable, which the registry refuses) means "anything".
fn schema_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Bool(true))
}

/// Whether a schema describes objects only (MCP's `inputSchema`/`outputSchema` must).
fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// `{"input": schema}`, keeping `$schema` and `$defs` at the root for its references.
fn wrapped(schema: Value, field: &str) -> Value {
    let mut inner = schema;
    let mut root = Map::new();
    root.insert("type".into(), json!("object"));
    if let Value::Object(inner) = &mut inner {
        for key in ["$schema", "$defs", "definitions"] {
            if let Some(value) = inner.remove(key) {
                root.insert(key.into(), value);
            }
        }
    }
    root.insert("properties".into(), json!({ field: inner }));
    root.insert("required".into(), json!([field]));
    Value::Object(root)
}

fn list_tools(service: &RouterService, caller: &Caller) -> Value {
    let mut tools: Vec<Value> = service
        .offerings()
        .into_iter()
        .filter(|capability| service.admission().authorize(caller, &capability.name).is_ok())
        .map(|capability| {
            let described = &capability.described;
            let input = schema_value(&described.input_schema);
            let input_schema = if input == Value::Bool(true) {
                json!({ "type": "object" })
            } else if is_object_schema(&input) {
                input
            } else {
                wrapped(input, "input")
            };
            let mut tool = json!({
                "name": capability.name,
                "description": described.description,
                "inputSchema": input_schema,
            });
            let output = schema_value(&described.output_schema);
            if is_object_schema(&output) {
                tool["outputSchema"] = output;
            } else if output != Value::Bool(true) {
                tool["outputSchema"] = wrapped(output, "result");
            }
            tool
        })
        .collect();
    tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    json!({ "tools": tools })
}

/// A tool error: the stable code and message, in the text and the structured content.
fn tool_error(error: &RouterError) -> Value {
    let envelope = error.envelope_error();
    json!({
        "isError": true,
        "content": [{ "type": "text", "text": format!("{}: {}", envelope.code, envelope.message) }],
        "structuredContent": { "error": envelope },
    })
}

/// A `tools/call` checked and turned into the capability's call.
struct Prepared {
    checked: envelope::CheckedRequest,
    request_id: String,
    /// The capability's output is not an object's: it is offered as `{"result": …}`.
    wraps_output: bool,
}

/// The call a `tools/call` asks for: `Ok(Err(tool error))` when refused
/// (forbidden, a bad envelope), `Err` for JSON-RPC's errors (bad params, unknown tool).
fn prepare_call(
    service: &RouterService,
    caller: &Caller,
    params: &Value,
) -> Result<Result<Prepared, Value>, (i64, String)> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err((INVALID_PARAMS, "tools/call needs `name`, the tool's name".to_string()));
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::Object(arguments)) => Value::Object(arguments.clone()),
        Some(_) => return Err((INVALID_PARAMS, "`arguments` must be an object".to_string())),
    };
    // Authorised first, as on `/v1/invoke`: a caller learns nothing of tools it may not call.
    if let Err(error) = service.admission().authorize(caller, name) {
        return Ok(Err(tool_error(&error)));
    }
    let Some(offered) = service.offered(name) else {
        return Err((
            INVALID_PARAMS,
            format!("unknown tool `{name}` (no agent offers that capability; tools/list names those you may call)"),
        ));
    };
    // A tool whose capability does not take an object was offered as `{"input": …}`.
    let takes_object = {
        let input = schema_value(&offered.described.input_schema);
        input == Value::Bool(true) || is_object_schema(&input)
    };
    let wraps_output = {
        let output = schema_value(&offered.described.output_schema);
        output != Value::Bool(true) && !is_object_schema(&output)
    };
    let payload = if takes_object {
        arguments
    } else {
        arguments.get("input").cloned().unwrap_or(Value::Null)
    };
    let request_id = trace::new_request_id();
    let checked = match envelope::call(name, payload, request_id.clone(), None) {
        Ok(checked) => checked,
        Err(error) => return Ok(Err(tool_error(&error))),
    };
    Ok(Ok(Prepared {
        checked,
        request_id,
        wraps_output,
    }))
}

/// A tool's successful result: the output structured (wrapped when not an
/// object) and as JSON text, with where it came from.
fn tool_result(output: Value, wraps_output: bool, request_id: &str, meta: (&str, &str, u32)) -> Value {
    let (agent_id, capability_version, attempts) = meta;
    let structured = match (&output, wraps_output) {
        (Value::Object(_), false) => output.clone(),
        _ => json!({ "result": output }),
    };
    json!({
        "content": [{ "type": "text", "text": output.to_string() }],
        "structuredContent": structured,
        "isError": false,
        "_meta": {
            "agent-reach/request_id": request_id,
            "agent-reach/agent_id": agent_id,
            "agent-reach/capability_version": capability_version,
            "agent-reach/attempts": attempts,
        },
    })
}

async fn call_tool(
    service: &RouterService,
    caller: &Caller,
    headers: &HeaderMap,
    params: &Value,
    received: clock::Now,
) -> Result<Value, (i64, String)> {
    let Prepared {
        checked,
        request_id,
        wraps_output,
    } = match prepare_call(service, caller, params)? {
        Ok(prepared) => prepared,
        Err(error) => return Ok(error),
    };
    let call = Call::begin(Door::Mcp, caller.clone(), checked, headers, received);
    match service.invoke(&call).await {
        Ok(success) => {
            let output = match success.output_value() {
                Ok(output) => output,
                Err(error) => return Ok(tool_error(&error)),
            };
            let meta = (
                success.agent_id.as_str(),
                success.capability_version.as_str(),
                success.attempts,
            );
            Ok(tool_result(output, wraps_output, &request_id, meta))
        }
        Err(failure) => Ok(tool_error(&failure.error)),
    }
}

/// `tools/call` with progress: the capability's events relayed as
/// `notifications/progress` as they arrive (SSE), then the JSON-RPC result
/// with the items collected. A failure before the first event is answered
/// as JSON (a tool error), as without progress.
async fn call_tool_streamed(
    service: &RouterService,
    caller: &Caller,
    headers: &HeaderMap,
    prepared: Prepared,
    received: clock::Now,
    id: Value,
    token: Value,
) -> Response {
    let Prepared {
        checked,
        request_id,
        wraps_output,
    } = prepared;
    let call = Call::begin(Door::Mcp, caller.clone(), checked, headers, received);
    let opened = match service.stream(call).await {
        Ok(opened) => opened,
        Err(failure) => return answer(StatusCode::OK, rpc_result(id, tool_error(&failure.error))),
    };
    let whole = opened.is_whole();
    // (the stream, the items so far)
    let start = (Some(opened), Vec::<Value>::new());
    let body = futures::stream::unfold(start, move |(stream, mut items)| {
        let (id, token, request_id) = (id.clone(), token.clone(), request_id.clone());
        async move {
            let mut stream = stream?;
            let message = match stream.next().await? {
                Item::Event(event) => {
                    let data = event.data();
                    let item = serde_json::from_str(&data).unwrap_or_else(|_| Value::String(data.to_string()));
                    items.push(item);
                    let notification = json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": { "progressToken": token, "progress": items.len(), "message": data },
                    });
                    return Some((
                        Ok::<_, std::convert::Infallible>(agent_reach_serving::sse::data(&notification.to_string())),
                        (Some(stream), items),
                    ));
                }
                Item::End(Ok(summary)) => {
                    // A JSON answer is the output itself; events are items, collected.
                    let output = if whole {
                        items.pop().unwrap_or(Value::Null)
                    } else {
                        Value::Array(std::mem::take(&mut items))
                    };
                    let meta = (
                        summary.agent_id.as_str(),
                        summary.capability_version.as_str(),
                        summary.attempts,
                    );
                    rpc_result(id, tool_result(output, wraps_output || !whole, &request_id, meta))
                }
                Item::End(Err(error)) => rpc_result(id, tool_error(&error)),
            };
            Some((Ok(agent_reach_serving::sse::data(&message.to_string())), (None, items)))
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

#[cfg(test)]
mod origin_tests {
    use super::origin_allowed;

    #[test]
    fn loopback_and_listed_origins_pass_and_others_do_not() {
        let none: Vec<String> = Vec::new();
        for origin in [
            "http://localhost:3000",
            "http://127.0.0.1:7500",
            "http://[::1]:8080",
            "https://LOCALHOST",
        ] {
            assert!(origin_allowed(origin, &none), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "null",
            "not an origin",
            "http://user@localhost",
        ] {
            assert!(!origin_allowed(origin, &none), "{origin}");
        }
        let listed = vec![
            "https://app.example.com".to_string(),
            "http://tools.example:8080/".to_string(),
        ];
        assert!(origin_allowed("https://app.example.com:443", &listed));
        assert!(origin_allowed("http://TOOLS.example:8080", &listed));
        assert!(!origin_allowed("http://app.example.com", &listed), "the scheme counts");
        assert!(!origin_allowed("http://tools.example:8081", &listed), "the port counts");
        assert!(origin_allowed("null", &["null".to_string()]));
        assert!(origin_allowed("http://evil.example", &["*".to_string()]));
    }
}
