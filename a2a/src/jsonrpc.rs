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
