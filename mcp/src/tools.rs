//! Tools: each capability the caller may call, listed with its schemas, and
//! `tools/call` as a call like `/v1/invoke`'s, answered whole or streamed
//! with progress.

use super::*;

/// A JSON Schema text as a value; empty (or unparsable, which the registry refuses) means "anything".
pub(crate) fn schema_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Bool(true))
}

/// Whether a schema describes objects only (MCP's `inputSchema`/`outputSchema` must).
pub(crate) fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// `{"input": schema}`, keeping `$schema` and `$defs` at the root for its references.
pub(crate) fn wrapped(schema: Value, field: &str) -> Value {
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

/// A capability's input schema as its tool's `inputSchema` (an object's: wrapped when it is not one).
pub(crate) fn tool_input_schema(text: &str) -> Value {
    let input = schema_value(text);
    if input == Value::Bool(true) {
        json!({ "type": "object" })
    } else if is_object_schema(&input) {
        input
    } else {
        wrapped(input, "input")
    }
}

/// The tools `caller` may call; with tasks (2025-11-25 and a router with
/// durable tasks) each says it may be called as one.
pub(crate) fn list_tools(service: &RouterService, caller: &Caller, era: Era, tasks: bool) -> Value {
    let mut tools: Vec<Value> = service
        .offerings()
        .into_iter()
        .filter(|capability| service.admission().authorize(caller, &capability.name).is_ok())
        .map(|capability| {
            let described = &capability.described;
            let mut tool = json!({
                "name": capability.name,
                "description": described.description,
                "inputSchema": tool_input_schema(&described.input_schema),
            });
            if tasks && era == Era::Legacy("2025-11-25") {
                tool["execution"] = json!({ "taskSupport": "optional" });
            }
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
    let mut listed = json!({ "tools": tools });
    if era == Era::Modern {
        // The list is the caller's (filtered by acl.yaml): private to its token.
        listed["ttlMs"] = json!(LIST_TTL_MS);
        listed["cacheScope"] = json!("private");
    }
    listed
}

/// A tool error: the stable code and message as text, the error envelope
/// in `_meta["agent-reach/error"]` and, for a tool that declares no
/// `outputSchema`, as `structuredContent.error` too. A tool with one gets no
/// `structuredContent` on an error: the spec has structured content conform
/// to the tool's output schema (the TypeScript client checks it, error or not).
pub(crate) fn tool_error(error: &RouterError, structured: bool) -> Value {
    let envelope = error.envelope_error();
    let mut result = json!({
        "isError": true,
        "content": [{ "type": "text", "text": format!("{}: {}", envelope.code, envelope.message) }],
        "_meta": { "agent-reach/error": envelope },
    });
    if structured {
        result["structuredContent"] = json!({ "error": envelope });
    }
    result
}

/// Whether `capability`'s tool is listed with an `outputSchema` (an unknown
/// capability has none).
pub(crate) fn declares_output(service: &RouterService, capability: &str) -> bool {
    service
        .offered(capability)
        .is_some_and(|offered| schema_value(&offered.described.output_schema) != Value::Bool(true))
}

/// A `tools/call` checked and turned into the capability's call.
pub(crate) struct Prepared {
    pub(crate) checked: envelope::CheckedRequest,
    pub(crate) request_id: String,
    /// The capability's output is not an object's: it is offered as `{"result": …}`.
    pub(crate) wraps_output: bool,
    /// Its tool has no `outputSchema`: an error may carry structured content.
    pub(crate) structured_errors: bool,
}

/// The call a `tools/call` asks for: `Ok(Err(tool error))` when refused
/// (forbidden, a bad envelope), `Err` for JSON-RPC's errors (bad params, unknown tool).
pub(crate) fn prepare_call(
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
        return Ok(Err(tool_error(&error, !declares_output(service, name))));
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
        Err(error) => return Ok(Err(tool_error(&error, !declares_output(service, name)))),
    };
    Ok(Ok(Prepared {
        checked,
        request_id,
        wraps_output,
        structured_errors: schema_value(&offered.described.output_schema) == Value::Bool(true),
    }))
}

/// A tool's successful result: the output structured (wrapped when not an
/// object) and as JSON text, with where it came from.
pub(crate) fn tool_result(output: Value, wraps_output: bool, request_id: &str, meta: (&str, &str, u32)) -> Value {
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

pub(crate) async fn call_tool(
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
        structured_errors,
    } = match prepare_call(service, caller, params)? {
        Ok(prepared) => prepared,
        Err(error) => return Ok(error),
    };
    let call = Call::begin(Door::Mcp, caller.clone(), checked, headers, received);
    match service.invoke(&call).await {
        Ok(success) => {
            let output = match success.output_value() {
                Ok(output) => output,
                Err(error) => return Ok(tool_error(&error, structured_errors)),
            };
            let meta = (
                success.agent_id.as_str(),
                success.capability_version.as_str(),
                success.attempts,
            );
            Ok(tool_result(output, wraps_output, &request_id, meta))
        }
        Err(failure) => Ok(tool_error(&failure.error, structured_errors)),
    }
}

/// `tools/call` with progress: the capability's events relayed as
/// `notifications/progress` as they arrive (SSE), then the JSON-RPC result
/// with the items collected. A failure before the first event is answered
/// as JSON (a tool error), as without progress.
pub(crate) async fn call_tool_streamed(request: &Request<'_>, prepared: Prepared, id: Value, token: Value) -> Response {
    let (service, caller, headers, received, era) = (
        request.service,
        request.caller,
        request.headers,
        request.received,
        request.era,
    );
    let Prepared {
        checked,
        request_id,
        wraps_output,
        structured_errors,
    } = prepared;
    let call = Call::begin(Door::Mcp, caller.clone(), checked, headers, received);
    let opened = match service.stream(call).await {
        Ok(opened) => opened,
        Err(failure) => {
            return answer(
                StatusCode::OK,
                rpc_result(id, completed(tool_error(&failure.error, structured_errors), era)),
            )
        }
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
                    rpc_result(
                        id,
                        completed(tool_result(output, wraps_output || !whole, &request_id, meta), era),
                    )
                }
                Item::End(Err(error)) => rpc_result(id, completed(tool_error(&error, structured_errors), era)),
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
