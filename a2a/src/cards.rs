//! Agent cards: each capability's card at `/a2a/{capability}/.well-known/agent-card.json`,
//! and the root card (`--a2a-root-capability`).

use super::*;

pub(crate) fn not_found(what: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": { "code": "CAPABILITY_NOT_FOUND", "message": what } })),
    )
        .into_response()
}

pub(crate) async fn card(
    State(api): State<TaskApi>,
    Path(capability): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    match card_of(&api, &capability, &reached(&uri, &headers)) {
        Some(card) => cached(&card, &headers),
        None => not_found(format!("no agent offers capability `{capability}`")),
    }
}

/// How long a client may keep a card without asking again (spec §8.6.1):
/// a card changes when its capability's highest version or schemas do.
pub(crate) const CARD_MAX_AGE_S: u32 = 60;

/// A card with its caching headers (spec §8.6.1): `Cache-Control` with a
/// `max-age`, and an `ETag` hashing the card as served; `304 Not Modified`
/// (no body) when `If-None-Match` names that tag.
pub(crate) fn cached(card: &Value, headers: &HeaderMap) -> Response {
    use sha2::Digest;
    let body = card.to_string();
    let digest = sha2::Sha256::digest(body.as_bytes());
    let tag: String = digest[..12].iter().map(|byte| format!("{byte:02x}")).collect();
    let etag = format!("\"{tag}\"");
    let cache_control = format!("public, max-age={CARD_MAX_AGE_S}");
    let matches = headers
        .get_all(http::header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|candidate| candidate.trim().trim_start_matches("W/"))
        .any(|candidate| candidate == "*" || candidate == etag);
    let status = if matches {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    };
    let mut response = if matches {
        status.into_response()
    } else {
        ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
    };
    let headers = response.headers_mut();
    for (name, value) in [(http::header::ETAG, etag), (http::header::CACHE_CONTROL, cache_control)] {
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

pub(crate) async fn root_card(State(api): State<TaskApi>, uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let Some(capability) = api.service().tuning().a2a_root_capability.clone() else {
        return not_found("no root agent card (start the router with --a2a-root-capability NAME)".to_string());
    };
    match card_of(&api, &capability, &reached(&uri, &headers)) {
        Some(card) => cached(&card, &headers),
        None => not_found(format!(
            "the root agent card is `{capability}`'s (--a2a-root-capability), and no agent offers it now"
        )),
    }
}

/// The host (and port) the client reached: HTTP/1.1's `Host`, or HTTP/2's
/// `:authority` (which arrives as the URI's authority, with no `Host` header).
pub(crate) fn reached(uri: &axum::http::Uri, headers: &HeaderMap) -> String {
    headers
        .value("host")
        .and_then(|host| std::str::from_utf8(host).ok())
        .map(str::to_string)
        .or_else(|| uri.authority().map(|authority| authority.as_str().to_string()))
        .unwrap_or_else(|| "localhost".to_string())
}

/// The agent card of `capability` at its highest version, its interface URL on the
/// host the client reached, `https://` when the listener serves TLS.
pub(crate) fn card_of(api: &TaskApi, capability: &str, host: &str) -> Option<Value> {
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
        "supportedInterfaces": [
            {
                "url": format!("{scheme}://{host}/a2a/{capability}"),
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0",
            },
            {
                "url": format!("{scheme}://{host}/a2a/{capability}/v1"),
                "protocolBinding": "HTTP+JSON",
                "protocolVersion": "1.0",
            },
            // gRPC takes an address (spec §4.4.6); the agent is the request's `tenant`.
            {
                "url": host,
                "protocolBinding": "GRPC",
                "protocolVersion": "1.0",
                "tenant": capability,
            },
        ],
        "provider": { "organization": "Agent-Reach", "url": format!("{scheme}://{host}") },
        "capabilities": {
            "streaming": true,
            // Push configs are the slow path's signed callbacks.
            "pushNotifications": api.tasks_enabled(),
            "extendedAgentCard": false,
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

pub(crate) fn schema_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Bool(true))
}

/// Whether an input schema takes `{"text": "…"}` (a TextPart maps to it).
pub(crate) fn takes_text(schema: &Value) -> bool {
    schema.pointer("/properties/text/type").and_then(Value::as_str) == Some("string")
}
