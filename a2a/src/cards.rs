//! Agent cards: each capability's card at `/a2a/{capability}/.well-known/agent-card.json`,
//! and the root card (`--a2a-root-capability`), each signed by the router
//! (A2A §8.4: a detached JWS over the RFC 8785 canonical card, with the
//! router's assertion key, its key set at `jku`; `agent_reach_access::card_signature`).

use std::collections::HashMap;
use std::sync::Arc;

use agent_reach_access::card_signature::{self, ProtectedHeader};
use agent_reach_access::AssertionKey;
use arc_swap::ArcSwap;
use bytes::Bytes;

use super::*;

pub(crate) fn not_found(what: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": { "code": "CAPABILITY_NOT_FOUND", "message": what } })),
    )
        .into_response()
}

/// What the card routes read: the call API, and the cards signed so far.
#[derive(Clone)]
pub(crate) struct CardState {
    pub(crate) api: TaskApi,
    pub(crate) signed: Arc<SignedCards>,
}

pub(crate) async fn card(
    State(state): State<CardState>,
    Path(capability): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let host = reached(&uri, &headers);
    match card_of(&state.api, &capability, &host) {
        Some(card) => state.signed.serve(&state.api, card, &host, &headers),
        None => not_found(format!("no agent offers capability `{capability}`")),
    }
}

pub(crate) async fn root_card(State(state): State<CardState>, uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let Some(capability) = state.api.service().tuning().a2a_root_capability.clone() else {
        return not_found("no root agent card (start the router with --a2a-root-capability NAME)".to_string());
    };
    let host = reached(&uri, &headers);
    match card_of(&state.api, &capability, &host) {
        Some(card) => state.signed.serve(&state.api, card, &host, &headers),
        None => not_found(format!(
            "the root agent card is `{capability}`'s (--a2a-root-capability), and no agent offers it now"
        )),
    }
}

/// How long a client may keep a card without asking again (spec §8.6.1):
/// a card changes when its capability's highest version or schemas do.
pub(crate) const CARD_MAX_AGE_S: u32 = 60;

/// Signed cards kept before the cache starts over (cards differ per capability,
/// version, schemas, signing key and the host a client reached).
const SIGNED_CARDS: usize = 512;

/// A card as served: signed, its bytes and their `ETag`.
struct Served {
    body: Bytes,
    etag: String,
}

/// The cards signed so far, keyed by what the signature covers (the protected
/// header and the canonical payload), so a card is signed once per content and
/// key (A2A §8.4, docs/design.md "Signed agent cards"), not per request. Read
/// without a lock; a new card swaps in a copy of the (small) map.
#[derive(Default)]
pub(crate) struct SignedCards {
    served: ArcSwap<HashMap<Arc<[u8]>, Arc<Served>>>,
}

impl SignedCards {
    /// `card`, signed by the router's assertion key, with its caching headers.
    fn serve(&self, api: &TaskApi, card: Value, host: &str, headers: &HeaderMap) -> Response {
        let key = api.service().assertions().signing_key();
        // The key set beside the card: the router's `/.well-known/jwks.json`, on the host reached.
        let jku = format!("{}/.well-known/jwks.json", origin(api, host));
        match self.signed(&key, &jku, card) {
            Ok(served) => cached(&served, headers),
            Err(error) => {
                tracing::error!(message = "Cannot sign an agent card.", %error);
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(
                        json!({ "error": { "code": "INTERNAL", "message": "the agent card could not be signed" } }),
                    ),
                )
                    .into_response()
            }
        }
    }

    /// `card` signed by `key`, its key set at `jku`: signed now only if this
    /// content was not signed with this header before.
    fn signed(&self, key: &AssertionKey, jku: &str, card: Value) -> Result<Arc<Served>, String> {
        let header = ProtectedHeader::for_key(key, Some(jku));
        let protected = header.encoded();
        let payload = card_signature::payload(&card).map_err(|error| error.to_string())?;
        let mut signs: Vec<u8> = Vec::with_capacity(protected.len() + 1 + payload.len());
        signs.extend_from_slice(protected.as_bytes());
        signs.push(b'.');
        signs.extend_from_slice(&payload);
        if let Some(served) = self.served.load().get(&*signs) {
            return Ok(served.clone());
        }
        let signature = card_signature::sign(key, &header, &payload)?;
        let mut card = card;
        if let Value::Object(members) = &mut card {
            members.insert("signatures".to_string(), json!([signature]));
        }
        let body = Bytes::from(agent_reach_access::jcs::canonical(&card));
        let served = Arc::new(Served {
            etag: etag_of(&body),
            body,
        });
        let signs: Arc<[u8]> = signs.into();
        self.served.rcu(|cards| {
            let mut cards = if cards.len() >= SIGNED_CARDS {
                HashMap::new()
            } else {
                HashMap::clone(cards)
            };
            cards.insert(signs.clone(), served.clone());
            cards
        });
        Ok(served)
    }
}

/// A strong `ETag` over the card as served, its signature included.
fn etag_of(body: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(body);
    let tag: String = digest[..12].iter().map(|byte| format!("{byte:02x}")).collect();
    format!("\"{tag}\"")
}

/// A card with its caching headers (spec §8.6.1): `Cache-Control` with a
/// `max-age`, and the `ETag` of the signed card; `304 Not Modified` (no body)
/// when `If-None-Match` names that tag.
fn cached(served: &Served, headers: &HeaderMap) -> Response {
    let cache_control = format!("public, max-age={CARD_MAX_AGE_S}");
    let matches = headers
        .get_all(http::header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|candidate| candidate.trim().trim_start_matches("W/"))
        .any(|candidate| candidate == "*" || candidate == served.etag);
    let mut response = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(http::header::CONTENT_TYPE, "application/json")], served.body.clone()).into_response()
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (http::header::ETAG, served.etag.as_str()),
        (http::header::CACHE_CONTROL, cache_control.as_str()),
    ] {
        if let Ok(value) = http::HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    }
    response
}

/// `http(s)://host`: `https` when the listener serves TLS.
fn origin(api: &TaskApi, host: &str) -> String {
    let scheme = if api.service().tuning().serves_tls {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{host}")
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
    let origin = origin(api, host);
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
                "url": format!("{origin}/a2a/{capability}"),
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0",
            },
            {
                "url": format!("{origin}/a2a/{capability}/v1"),
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
        "provider": { "organization": "Agent-Reach", "url": origin },
        "capabilities": {
            "streaming": true,
            // Push configs are the slow path's signed callbacks.
            "pushNotifications": api.tasks_enabled(),
            "extendedAgentCard": false,
            "extensions": [{
                "uri": "https://agent-reach.dev/a2a/schemas/v1",
                "description": "The capability's JSON Schemas (draft 2020-12): a DataPart's data must match input_schema.",
                // `required: false` is the default, so it is left out: a field without
                // presence at its default is not part of what the signature covers.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_is_signed_once_per_content_and_key() {
        let cards = SignedCards::default();
        let (key, _) = AssertionKey::generate().unwrap();
        let jku = "http://h/.well-known/jwks.json";
        let card = json!({ "name": "x", "version": "1.0.0", "skills": [] });
        let first = cards.signed(&key, jku, card.clone()).unwrap();
        let again = cards.signed(&key, jku, card.clone()).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "served from the cache, not signed again");
        // The body served is the signed card; its ETag hashes those bytes.
        let served: Value = serde_json::from_slice(&first.body).unwrap();
        let verifier = verifier_of(&key);
        assert_eq!(card_signature::verify(&served, &verifier), Ok(key.kid().to_string()));
        assert_eq!(first.etag, etag_of(&first.body));
        // Another content, host or key: signed anew.
        let newer = cards
            .signed(&key, jku, json!({ "name": "x", "version": "1.1.0", "skills": [] }))
            .unwrap();
        let elsewhere = cards
            .signed(&key, "http://other/.well-known/jwks.json", card.clone())
            .unwrap();
        let (rotated_key, _) = AssertionKey::generate().unwrap();
        let rotated = cards.signed(&rotated_key, jku, card.clone()).unwrap();
        let etags = [&first.etag, &newer.etag, &elsewhere.etag, &rotated.etag];
        for (index, etag) in etags.iter().enumerate() {
            assert_eq!(
                etags.iter().filter(|other| *other == etag).count(),
                1,
                "ETag {index} is its own"
            );
        }
        // Bounded: full, the cache starts over.
        for version in 0..SIGNED_CARDS {
            cards
                .signed(&key, jku, json!({ "name": "x", "version": format!("9.{version}.0") }))
                .unwrap();
        }
        assert!(cards.served.load().len() <= SIGNED_CARDS);
    }

    /// A verifier for one key (its JWKS).
    fn verifier_of(key: &AssertionKey) -> agent_reach_access::AssertionVerifier {
        let document = agent_reach_access::assertion::jwks([key]).to_string();
        agent_reach_access::AssertionVerifier::from_jwks(document.as_bytes(), "").unwrap()
    }
}
