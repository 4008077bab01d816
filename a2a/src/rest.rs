//! The HTTP+JSON/REST binding (spec §11) under `/a2a/{capability}/v1/…`:
//! each route is the JSON-RPC request of the same operation, answered by the
//! one reading ([`One::answer`]: the same admission, calls and task store),
//! and its answer translated: a result is the body, an error is a
//! `google.rpc.Status` (AIP-193) with the HTTP status of spec §5.4 and the
//! same `ErrorInfo`, and streams carry bare `StreamResponse`s.

use super::*;

/// The REST answer's media type (spec §11.1).
pub(crate) const A2A_JSON: &str = "application/a2a+json";

/// `GET`, `POST` and `DELETE` under `/a2a/{capability}/v1/`.
pub(crate) async fn rest(
    State(api): State<TaskApi>,
    Path((capability, route)): Path<(String, String)>,
    method: http::Method,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request = RestRequest {
        capability: &capability,
        method: &method,
        route: &route,
        query: query.as_deref(),
    };
    answer_rest(&api, identified, request, &headers, RequestBody::Unread(body)).await
}

/// `POST /a2a/{capability}/v1/message:send` on the front door's hot route
/// (router/src/front.rs): the common call (one DataPart, no configuration)
/// read without a JSON tree and answered as [`send_rest`] writes it; any
/// other request, and every refusal, by the REST reading ([`answer_rest`]),
/// so both readings agree on every request.
pub async fn answer_rest_send(
    api: &TaskApi,
    identified: Identified,
    capability: &str,
    headers: &impl HeaderLookup,
    body: bytes::Bytes,
) -> Answer {
    let version_spoken = matches!(
        headers.value("a2a-version").map(<[u8]>::trim_ascii),
        None | Some(b"") | Some(b"1.0") | Some(b"1.0.0")
    );
    let always = api.service().tuning().a2a_tasks_always && api.tasks_enabled();
    if let (Ok(caller), true, false) = (&identified.caller, version_spoken, always) {
        if let Some(plain) = PlainSend::read_rest(&body) {
            let called = plain_call(
                api.service(),
                caller,
                capability,
                plain.payload,
                plain.message_id,
                plain.context_id,
            );
            if let Ok(message) = called {
                return send_rest(api, caller, headers, message, identified.received).await;
            }
        }
    }
    let request = RestRequest {
        capability,
        method: &http::Method::POST,
        route: "message:send",
        query: None,
    };
    answer_rest(api, identified, request, headers, RequestBody::Read(body))
        .await
        .into()
}

/// A REST request's target.
pub(crate) struct RestRequest<'a> {
    capability: &'a str,
    method: &'a http::Method,
    /// The path after `/v1/`.
    route: &'a str,
    query: Option<&'a str>,
}

/// A REST request, read as the JSON-RPC request of its operation and
/// answered by the one reading ([`One::answer`]), its answer translated.
async fn answer_rest(
    api: &TaskApi,
    identified: Identified,
    RestRequest {
        capability,
        method,
        route,
        query,
    }: RestRequest<'_>,
    headers: &impl HeaderLookup,
    body: RequestBody,
) -> Response {
    let received = identified.received;
    let caller = match identified.caller {
        Ok(caller) => caller,
        Err(error) => return translate(failed(&Value::Null, &error).into()).await,
    };
    match headers.value("a2a-version").map(<[u8]>::trim_ascii) {
        None | Some(b"") | Some(b"1.0") | Some(b"1.0.0") => {}
        Some(other) => {
            let other = String::from_utf8_lossy(other);
            return status_reply(
                StatusCode::BAD_REQUEST,
                &rpc_error(
                    &Value::Null,
                    VERSION_NOT_SUPPORTED,
                    &format!("A2A-Version `{other}` is not supported on the REST binding; it speaks 1.0"),
                    None,
                ),
            );
        }
    }
    let (rpc_method, path_params) = match operation_of(method, route) {
        Ok(found) => found,
        Err(refusal) => return status_reply(refusal.0, &rpc_error(&Value::Null, refusal.1, &refusal.2, None)),
    };
    let mut params = Map::new();
    if method == http::Method::POST {
        let read = match body {
            RequestBody::Unread(body) => {
                envelope::read_body(headers, body, api.service().tuning().max_body_bytes).await
            }
            RequestBody::Read(bytes) => Ok(bytes),
        };
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(error) => return translate(failed(&Value::Null, &error).into()).await,
        };
        params = match body_params(&bytes) {
            Ok(params) => params,
            Err((code, message)) => {
                return status_reply(StatusCode::BAD_REQUEST, &rpc_error(&Value::Null, code, &message, None))
            }
        };
    }
    if let Err(problem) = query_params(rpc_method, query, &mut params) {
        return status_reply(
            StatusCode::BAD_REQUEST,
            &rpc_error(&Value::Null, INVALID_PARAMS, &problem, None),
        );
    }
    // The path names the task (and config); a body naming others is refused, not ignored.
    for (name, value) in path_params {
        match params.get(name) {
            Some(given) if given != &value && !given.is_null() => {
                return status_reply(
                    StatusCode::BAD_REQUEST,
                    &rpc_error(
                        &Value::Null,
                        INVALID_PARAMS,
                        &format!("`{name}` is {given} in the body and {value} in the path: send one"),
                        None,
                    ),
                )
            }
            _ => {
                params.insert(name.to_string(), value);
            }
        }
    }
    let request = json!({ "jsonrpc": "2.0", "id": 0, "method": rpc_method, "params": params });
    let one = One {
        api,
        caller: &caller,
        capability,
        headers,
        received,
        legacy_allowed: false,
        rest: true,
    };
    match one.answer(&request, false).await {
        Some(answer) => translate(answer).await,
        // Every request here has an id: never a notification.
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// A route's JSON-RPC method and the parameters its path carries.
type Routed = (&'static str, Vec<(&'static str, Value)>);

/// The operation `method` on `route` (the path after `/v1/`) asks for.
fn operation_of(method: &http::Method, route: &str) -> Result<Routed, (StatusCode, i64, String)> {
    use http::Method;
    let segments: Vec<&str> = route.split('/').collect();
    let id = |text: &str| Value::String(text.to_string());
    let routed = match (method, segments.as_slice()) {
        (&Method::POST, ["message:send"]) => ("SendMessage", vec![]),
        (&Method::POST, ["message:stream"]) => ("SendStreamingMessage", vec![]),
        (&Method::GET, ["tasks"]) => ("ListTasks", vec![]),
        (&Method::GET, ["extendedAgentCard"]) => ("GetExtendedAgentCard", vec![]),
        (&Method::POST, ["tasks", task]) if task.ends_with(":cancel") => {
            ("CancelTask", vec![("id", id(task.trim_end_matches(":cancel")))])
        }
        // The spec's text says POST, its proto's HTTP rule GET: both are served.
        (&Method::POST | &Method::GET, ["tasks", task]) if task.ends_with(":subscribe") => {
            ("SubscribeToTask", vec![("id", id(task.trim_end_matches(":subscribe")))])
        }
        (&Method::GET, ["tasks", task]) if !task.contains(':') => ("GetTask", vec![("id", id(task))]),
        (&Method::POST, ["tasks", task, "pushNotificationConfigs"]) => {
            ("CreateTaskPushNotificationConfig", vec![("taskId", id(task))])
        }
        (&Method::GET, ["tasks", task, "pushNotificationConfigs"]) => {
            ("ListTaskPushNotificationConfigs", vec![("taskId", id(task))])
        }
        (&Method::GET, ["tasks", task, "pushNotificationConfigs", config]) => (
            "GetTaskPushNotificationConfig",
            vec![("taskId", id(task)), ("id", id(config))],
        ),
        (&Method::DELETE, ["tasks", task, "pushNotificationConfigs", config]) => (
            "DeleteTaskPushNotificationConfig",
            vec![("taskId", id(task)), ("id", id(config))],
        ),
        _ => {
            return Err((
                StatusCode::NOT_FOUND,
                METHOD_NOT_FOUND,
                format!(
                "no REST operation is `{method} /v1/{route}` (the spec's §11.3 paths: message:send, message:stream, \
                     tasks, tasks/{{id}}, tasks/{{id}}:cancel, tasks/{{id}}:subscribe, \
                     tasks/{{id}}/pushNotificationConfigs[/{{configId}}], extendedAgentCard)"
            ),
            ))
        }
    };
    if routed
        .1
        .iter()
        .any(|(_, value)| value.as_str().is_some_and(str::is_empty))
    {
        return Err((
            StatusCode::BAD_REQUEST,
            INVALID_PARAMS,
            "the path names an empty id".to_string(),
        ));
    }
    Ok(routed)
}

/// A POST's body as the request's parameters (an object; none is `{}`);
/// else the JSON-RPC code and message of the refusal.
fn body_params(bytes: &[u8]) -> Result<Map<String, Value>, (i64, String)> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(params)) => Ok(params),
        Ok(other) => Err((
            INVALID_PARAMS,
            format!("the body must be a JSON object (the operation's request), not {other}"),
        )),
        Err(error) => Err((PARSE_ERROR, format!("the body is not JSON: {error}"))),
    }
}

/// The query's parameters (camelCase, spec §11.5) into `params`, typed as
/// the operation's request fields are; an unknown one is refused.
fn query_params(method: &str, query: Option<&str>, params: &mut Map<String, Value>) -> Result<(), String> {
    enum Kind {
        Text,
        Count,
        Flag,
    }
    let known: &[(&str, Kind)] = match method {
        "GetTask" => &[("historyLength", Kind::Count), ("tenant", Kind::Text)],
        "ListTasks" => &[
            ("contextId", Kind::Text),
            ("status", Kind::Text),
            ("pageSize", Kind::Count),
            ("pageToken", Kind::Text),
            ("historyLength", Kind::Count),
            ("statusTimestampAfter", Kind::Text),
            ("includeArtifacts", Kind::Flag),
            ("tenant", Kind::Text),
        ],
        "ListTaskPushNotificationConfigs" => &[
            ("pageSize", Kind::Count),
            ("pageToken", Kind::Text),
            ("tenant", Kind::Text),
        ],
        _ => &[("tenant", Kind::Text)],
    };
    for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            percent_decode(&text.replace('+', " "))
                .ok_or_else(|| format!("the query parameter `{text}` is not URL-encoded UTF-8"))
        };
        let (name, value) = (decode(name)?, decode(value)?);
        let Some((_, kind)) = known.iter().find(|(known, _)| *known == name) else {
            return Err(format!(
                "`{name}` is not a query parameter of {method} (it takes {})",
                known.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
            ));
        };
        let typed = match kind {
            Kind::Text => Value::String(value),
            Kind::Count => Value::Number(
                value
                    .parse::<i64>()
                    .map_err(|_| format!("`{name}` must be an integer, not `{value}`"))?
                    .into(),
            ),
            Kind::Flag => match value.as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(format!("`{name}` must be `true` or `false`, not `{value}`")),
            },
        };
        if params.insert(name.clone(), typed).is_some() {
            return Err(format!("`{name}` is given twice"));
        }
    }
    Ok(())
}

/// `%XX` escapes decoded (`percent-encoding`); `None` for a broken escape
/// or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let escapes_whole = bytes
        .iter()
        .enumerate()
        .filter(|(_, byte)| **byte == b'%')
        .all(|(at, _)| {
            bytes
                .get(at + 1..at + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
        });
    if !escapes_whole {
        return None;
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|decoded| decoded.into_owned())
}

/// A JSON-RPC answer as the REST binding's: its result as the body, its
/// error as a `google.rpc.Status`; a stream as it is.
pub(crate) async fn translate(answer: Answer) -> Response {
    let (status, mut headers, body) = match answer {
        Answer::Stream { .. } => return answer.into_response(),
        Answer::Json { status, body } | Answer::Typed { status, body, .. } => {
            (status, HeaderMap::new(), bytes::Bytes::from(body))
        }
        Answer::Response(response) => {
            let is_stream = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
            if is_stream || response.status() == StatusCode::NO_CONTENT {
                return response;
            }
            let (parts, body) = response.into_parts();
            match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => (parts.status, parts.headers, bytes),
                Err(error) => {
                    return status_reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &rpc_error(
                            &Value::Null,
                            INTERNAL_ERROR,
                            &format!("the answer cannot be read: {error}"),
                            None,
                        ),
                    )
                }
            }
        }
    };
    let Ok(mut reply) = serde_json::from_slice::<Value>(&body) else {
        return status_reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            &rpc_error(&Value::Null, INTERNAL_ERROR, "the answer is not JSON", None),
        );
    };
    let mut response = match reply.get_mut("result").map(Value::take) {
        // `DeleteTaskPushNotificationConfig` answers nothing: `{}` (google.protobuf.Empty).
        Some(Value::Null) => json_response(StatusCode::OK, &json!({})),
        Some(result) => json_response(StatusCode::OK, &result),
        None => status_reply(status, &reply),
    };
    if let Some(challenge) = headers.remove(http::header::WWW_AUTHENTICATE) {
        response.headers_mut().insert(http::header::WWW_AUTHENTICATE, challenge);
    }
    response
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [(http::header::CONTENT_TYPE, A2A_JSON)], body.to_string()).into_response()
}

/// A JSON-RPC error reply as the REST binding's `google.rpc.Status`, with its
/// HTTP status: the stable code's for an Agent-Reach refusal, spec §5.4's for
/// an A2A error, 400 for a bad request, and `status` when the JSON-RPC
/// answer already had one of its own (401, 403, 404).
fn status_reply(status: StatusCode, reply: &Value) -> Response {
    let (status, body) = rest_error(reply, status);
    json_response(status, &body)
}

/// [`status_reply`]'s status and body.
pub(crate) fn rest_error(reply: &Value, status: StatusCode) -> (StatusCode, Value) {
    let error = &reply["error"];
    let code = error["code"].as_i64().unwrap_or(INTERNAL_ERROR);
    let details = error
        .get("data")
        .filter(|data| data.is_array())
        .cloned()
        .unwrap_or(json!([]));
    let stable = details
        .pointer("/0/domain")
        .filter(|domain| *domain == "agent-reach")
        .and_then(|_| details.pointer("/0/reason"))
        .and_then(Value::as_str)
        .and_then(agent_reach_proto::RouterCode::parse);
    let (http_status, name) = match (code, stable) {
        (_, _) if status.is_client_error() => (status, grpc_name(status, code)),
        (PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS, _) => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        // A call that failed (no instance, the deadline, the agent's error): the stable code's status.
        (INTERNAL_ERROR, Some(stable)) => {
            let http_status = StatusCode::from_u16(stable.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (http_status, grpc_name(http_status, code))
        }
        (TASK_NOT_FOUND, _) => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        (INVALID_AGENT_RESPONSE, _) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        (CONTENT_TYPE_NOT_SUPPORTED, _) => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        (-32009..=-32002, _) => (StatusCode::BAD_REQUEST, "FAILED_PRECONDITION"),
        (METHOD_NOT_FOUND, _) => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    };
    let body = json!({ "error": {
        "code": http_status.as_u16(),
        "status": name,
        "message": error["message"],
        "details": details,
    }});
    (http_status, body)
}

/// The canonical (gRPC) code name of an HTTP error status, an A2A
/// precondition error's `FAILED_PRECONDITION` kept.
fn grpc_name(status: StatusCode, code: i64) -> &'static str {
    if status == StatusCode::BAD_REQUEST
        && (-32009..=-32002).contains(&code)
        && !matches!(code, CONTENT_TYPE_NOT_SUPPORTED | INVALID_AGENT_RESPONSE)
    {
        return "FAILED_PRECONDITION";
    }
    match status.as_u16() {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        413 | 429 => "RESOURCE_EXHAUSTED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        400..=499 => "INVALID_ARGUMENT",
        _ => "INTERNAL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_paths_are_the_operations() {
        use http::Method;
        let routed = |method: Method, route: &str| operation_of(&method, route);
        assert_eq!(routed(Method::POST, "message:send").unwrap().0, "SendMessage");
        assert_eq!(
            routed(Method::POST, "message:stream").unwrap().0,
            "SendStreamingMessage"
        );
        assert_eq!(routed(Method::GET, "tasks").unwrap().0, "ListTasks");
        assert_eq!(
            routed(Method::GET, "tasks/t_1").unwrap(),
            ("GetTask", vec![("id", json!("t_1"))])
        );
        assert_eq!(
            routed(Method::POST, "tasks/t_1:cancel").unwrap(),
            ("CancelTask", vec![("id", json!("t_1"))])
        );
        assert_eq!(routed(Method::GET, "tasks/t_1:subscribe").unwrap().0, "SubscribeToTask");
        assert_eq!(
            routed(Method::DELETE, "tasks/t_1/pushNotificationConfigs/c").unwrap(),
            (
                "DeleteTaskPushNotificationConfig",
                vec![("taskId", json!("t_1")), ("id", json!("c"))]
            )
        );
        for (method, route) in [
            (Method::GET, "message:send"),
            (Method::POST, "tasks"),
            (Method::DELETE, "tasks/t_1"),
            (Method::GET, "tasks/t_1:cancel"),
            (Method::GET, "nope"),
            (Method::GET, "tasks/t_1/pushNotificationConfigs/c/extra"),
        ] {
            assert_eq!(
                routed(method.clone(), route).map_err(|error| error.0),
                Err(StatusCode::NOT_FOUND),
                "{method} {route}"
            );
        }
        assert_eq!(
            routed(Method::GET, "tasks/:cancel").map_err(|error| error.0),
            Err(StatusCode::NOT_FOUND)
        );
        assert_eq!(
            routed(Method::POST, "tasks/:cancel").map_err(|error| error.0),
            Err(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn query_parameters_are_typed_and_unknown_ones_refused() {
        let mut params = Map::new();
        query_params(
            "ListTasks",
            Some("contextId=c%201&pageSize=5&includeArtifacts=true&statusTimestampAfter=2026-01-01T00%3A00%3A00Z"),
            &mut params,
        )
        .unwrap();
        assert_eq!(
            Value::Object(params),
            json!({"contextId": "c 1", "pageSize": 5, "includeArtifacts": true, "statusTimestampAfter": "2026-01-01T00:00:00Z"})
        );
        for (method, query) in [
            ("ListTasks", "pagesize=5"),
            ("ListTasks", "pageSize=five"),
            ("ListTasks", "includeArtifacts=yes"),
            ("ListTasks", "pageSize=1&pageSize=2"),
            ("GetTask", "status=x"),
            ("GetTask", "historyLength=%ZZ"),
        ] {
            assert!(
                query_params(method, Some(query), &mut Map::new()).is_err(),
                "{method}?{query}"
            );
        }
    }

    #[test]
    fn errors_are_google_rpc_statuses_with_the_specs_http_status() {
        let status = |code: i64, stable: Option<RouterError>, http: StatusCode| {
            let (status, body) = rest_error(&rpc_error(&Value::Null, code, "m", stable.as_ref()), http);
            assert_eq!(body["error"]["code"], status.as_u16());
            (
                status.as_u16(),
                body["error"]["status"].as_str().unwrap_or_default().to_string(),
            )
        };
        assert_eq!(status(TASK_NOT_FOUND, None, StatusCode::OK), (404, "NOT_FOUND".into()));
        assert_eq!(
            status(TASK_NOT_CANCELABLE, None, StatusCode::OK),
            (400, "FAILED_PRECONDITION".into())
        );
        assert_eq!(
            status(CONTENT_TYPE_NOT_SUPPORTED, None, StatusCode::OK),
            (400, "INVALID_ARGUMENT".into())
        );
        assert_eq!(
            status(INVALID_PARAMS, None, StatusCode::OK),
            (400, "INVALID_ARGUMENT".into())
        );
        assert_eq!(
            status(
                INVALID_REQUEST,
                Some(RouterError::new(Code::Forbidden, "no")),
                StatusCode::FORBIDDEN
            ),
            (403, "PERMISSION_DENIED".into())
        );
        assert_eq!(
            status(
                INTERNAL_ERROR,
                Some(RouterError::new(Code::NoAvailableInstance, "none")),
                StatusCode::OK
            ),
            (503, "UNAVAILABLE".into())
        );
        let (_, body) = rest_error(&rpc_error(&Value::Null, TASK_NOT_FOUND, "m", None), StatusCode::OK);
        assert_eq!(body["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
        assert_eq!(body["error"]["details"][0]["domain"], "a2a-protocol.org");
    }
}
