//! The request envelope at the edge: bounded body reading, strict parsing that
//! names the failing field, and the semantic checks serde cannot express.
//! Everything fails as `INVALID_ENVELOPE` (400) except an oversized body
//! (`PAYLOAD_TOO_LARGE`, 413).

use agent_reach_edge::HeaderLookup;
use agent_reach_proto::envelope::{InvokeRequest, TargetPolicy, ENVELOPE_VERSION};
use axum::body::Body;
use serde_json::json;

use crate::error::{Code, RouterError};

/// A request envelope that passed every check.
pub struct CheckedRequest {
    pub request: InvokeRequest,
    pub version_req: Option<semver::VersionReq>,
    pub policy: TargetPolicy,
}

fn invalid(field: &str, message: impl Into<String>) -> RouterError {
    RouterError::new(Code::InvalidEnvelope, message).with_details(json!({ "field": field }))
}

/// Bodies over the limit are still read (and discarded) up to this many times
/// the limit, so the client gets its 413 instead of a reset while still sending.
const DRAIN_FACTOR: usize = 8;

/// Reads at most `limit` bytes of body.
pub async fn read_body(headers: &impl HeaderLookup, body: Body, limit: usize) -> Result<bytes::Bytes, RouterError> {
    use http_body_util::BodyExt;

    let too_large = || {
        RouterError::new(
            Code::PayloadTooLarge,
            format!("request body exceeds this router's limit of {limit} bytes"),
        )
        .with_details(json!({ "limit_bytes": limit }))
    };
    let drain_cap = limit.saturating_mul(DRAIN_FACTOR);
    let declared = headers
        .value("content-length")
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > drain_cap) {
        return Err(too_large());
    }
    let mut body = body;
    // Most bodies arrive as one chunk: keep it without copying.
    let mut first: Option<bytes::Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| {
            RouterError::new(Code::InvalidEnvelope, format!("cannot read the request body: {error}"))
        })?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        total += chunk.len();
        if total > drain_cap {
            break;
        }
        if total > limit {
            continue;
        }
        match &first {
            None => first = Some(chunk),
            Some(head) => {
                if more.is_empty() {
                    more.extend_from_slice(head);
                }
                more.extend_from_slice(&chunk);
            }
        }
    }
    if total > limit {
        return Err(too_large());
    }
    Ok(if more.is_empty() {
        first.unwrap_or_default()
    } else {
        bytes::Bytes::from(more)
    })
}

/// Parses JSON into the envelope, naming the field at fault.
pub fn parse(bytes: &[u8]) -> Result<InvokeRequest, RouterError> {
    // The happy path parses once, without path tracking; only a failure is
    // parsed again to name the field.
    if let Ok(request) = serde_json::from_slice::<InvokeRequest>(bytes) {
        return Ok(request);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed: Result<InvokeRequest, _> = serde_path_to_error::deserialize(&mut deserializer);
    let request = parsed.map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let message = inner.to_string();
        let field = if message.starts_with("unknown field") || message.starts_with("missing field") {
            // serde reports these at the parent; name the field itself.
            let name = message.split('`').nth(1).unwrap_or_default().to_string();
            if path == "." || path == name {
                name
            } else if path.ends_with(&format!(".{name}")) {
                path
            } else {
                format!("{path}.{name}")
            }
        } else {
            path
        };
        let kind = match inner.classify() {
            serde_json::error::Category::Data => "invalid envelope",
            _ => "malformed JSON",
        };
        invalid(&field, format!("{kind}: {message} (field `{field}`)"))
    })?;
    deserializer
        .end()
        .map_err(|error| invalid(".", format!("trailing data after the JSON envelope: {error}")))?;
    Ok(request)
}

/// Checks what the types alone cannot.
pub fn check(request: InvokeRequest) -> Result<CheckedRequest, RouterError> {
    let (version_req, policy) = check_fields(&request)?;
    Ok(CheckedRequest {
        request,
        version_req,
        policy,
    })
}

/// [`check`] without taking the request: the requirement and policy it
/// parses, or the first field at fault.
pub fn check_fields(request: &InvokeRequest) -> Result<(Option<semver::VersionReq>, TargetPolicy), RouterError> {
    if let Some(version) = &request.version {
        if version != ENVELOPE_VERSION {
            return Err(invalid(
                "version",
                format!("envelope version `{version}` is not supported (expected `{ENVELOPE_VERSION}`)"),
            ));
        }
    }
    agent_reach_access::acl::check_dotted(&request.capability)
        .map_err(|why| invalid("capability", format!("capability `{}`: {why}", request.capability)))?;
    let version_req = match request.capability_version.as_deref().map(str::trim) {
        None | Some("") | Some("*") => None,
        Some(text) => Some(semver::VersionReq::parse(text).map_err(|error| {
            invalid(
                "capability_version",
                format!("`{text}` is not a semver requirement (e.g. `^1.2`): {error}"),
            )
        })?),
    };
    if request.timeout_ms == Some(0) {
        return Err(invalid("timeout_ms", "timeout_ms must be above 0"));
    }
    if let Some(request_id) = &request.request_id {
        let printable = request_id.chars().all(|c| c.is_ascii_graphic());
        if request_id.is_empty() || request_id.len() > 128 || !printable {
            return Err(invalid(
                "request_id",
                "request_id must be 1..=128 printable ASCII characters without spaces",
            ));
        }
    }
    let policy = request.target_policy.unwrap_or_default();
    if policy == TargetPolicy::ConsistentHash && request.session_id.as_deref().unwrap_or("").is_empty() {
        return Err(invalid(
            "session_id",
            "target_policy `consistent_hash` is keyed by session_id; send one",
        ));
    }
    Ok((version_req, policy))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(error: RouterError) -> String {
        assert_eq!(error.code, Code::InvalidEnvelope);
        error.details.unwrap()["field"].as_str().unwrap().to_string()
    }

    #[test]
    fn names_the_failing_field() {
        assert_eq!(field_of(parse(br#"{"payload":{}}"#).unwrap_err()), "capability");
        assert_eq!(
            field_of(parse(br#"{"capability":"a","timeout_ms":"x"}"#).unwrap_err()),
            "timeout_ms"
        );
        assert_eq!(
            field_of(parse(br#"{"capability":"a","target_policy":"random"}"#).unwrap_err()),
            "target_policy"
        );
        assert_eq!(
            field_of(parse(br#"{"capability":"a","extra":1}"#).unwrap_err()),
            "extra"
        );
        assert_eq!(parse(b"{not json").unwrap_err().code, Code::InvalidEnvelope);
    }

    #[test]
    fn semantic_checks() {
        let check_text = |text: &str| check(parse(text.as_bytes()).unwrap());
        assert_eq!(
            field_of(check_text(r#"{"capability":"Order"}"#).err().unwrap()),
            "capability"
        );
        assert_eq!(
            field_of(
                check_text(r#"{"capability":"a","capability_version":"x.y"}"#)
                    .err()
                    .unwrap()
            ),
            "capability_version"
        );
        assert_eq!(
            field_of(
                check_text(r#"{"capability":"a","target_policy":"consistent_hash"}"#)
                    .err()
                    .unwrap()
            ),
            "session_id"
        );
        let ok = check_text(r#"{"capability":"order.query","capability_version":"^1.2"}"#)
            .ok()
            .unwrap();
        assert!(ok.version_req.unwrap().matches(&semver::Version::new(1, 3, 0)));
    }
}
