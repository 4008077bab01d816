//! HTTP serving, shared by every Agent-Reach service: request bodies read
//! with a bound and JSON parsed so each failure names its kind and the field
//! at fault ([`BodyProblem`], from `agent-reach-errors`); [`serve::per_core`]
//! runs a service on one single-threaded runtime per core; [`front`] serves a
//! service's hot requests without hyper's and axum's per-request machinery
//! and the rest with its axum routes; [`tls`] is listener TLS from PEM files
//! and verifying client configurations.
//!
//! This crate decides nothing about HTTP statuses: each service maps a
//! [`BodyProblem`] onto its own codes (`agent_reach_errors::ErrorCode`).

pub mod front;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod serve;
pub mod sse;
pub mod tls;

pub use agent_reach_errors::BodyProblem;

use axum::body::Body;
use http::HeaderMap;
use serde::de::DeserializeOwned;

/// `value` in decimal, written at the end of `digits` (20 digits hold any
/// u64), without a formatter: lengths and counts on the wire (HTTP
/// `content-length`, RESP) and in the trail's records.
pub fn decimal(mut value: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &digits[at..];
        }
    }
}

/// Request header values by name (lowercase ASCII), from hyper's header map
/// or the front door's [`front::Headers`], so one handler serves both.
pub trait HeaderLookup {
    /// The first value of the field `name`, as sent.
    fn value(&self, name: &str) -> Option<&[u8]>;
}

impl HeaderLookup for HeaderMap {
    fn value(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }
}

/// A body over the limit is read and discarded up to this multiple of the
/// limit before the service answers, so the client sees the answer instead of
/// a connection reset; anything larger is refused without reading it.
const DRAIN_FACTOR: usize = 8;

/// Reads at most `limit` bytes of `body`. Most bodies arrive as one chunk,
/// which is kept as it came (no copy).
pub async fn read_limited(headers: &impl HeaderLookup, body: Body, limit: usize) -> Result<bytes::Bytes, BodyProblem> {
    use http_body_util::BodyExt;

    let drain_cap = limit.saturating_mul(DRAIN_FACTOR);
    let declared = headers
        .value("content-length")
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > drain_cap) {
        return Err(BodyProblem::TooLarge { limit });
    }
    let mut body = body;
    let mut first: Option<bytes::Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| BodyProblem::Malformed {
            message: format!("cannot read the request body: {error}"),
        })?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        total += chunk.len();
        if total > drain_cap {
            break;
        }
        if total > limit {
            // Over the limit: drained (up to the cap) so the client sees the answer, not kept.
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
        return Err(BodyProblem::TooLarge { limit });
    }
    Ok(if more.is_empty() {
        first.unwrap_or_default()
    } else {
        bytes::Bytes::from(more)
    })
}

/// A request body as a handler gets it: still to be read (hyper and the axum
/// routes), or already read within the body limit (the front door). Handlers
/// take it instead of reading first, so they choose when the body is read
/// (after authentication).
pub enum RequestBody {
    Unread(Body),
    Read(bytes::Bytes),
}

impl RequestBody {
    /// The body's bytes, read with `limit` first if it is still unread.
    pub async fn read(self, headers: &impl HeaderLookup, limit: usize) -> Result<bytes::Bytes, BodyProblem> {
        match self {
            RequestBody::Unread(body) => read_limited(headers, body, limit).await,
            RequestBody::Read(bytes) => Ok(bytes),
        }
    }

    /// The body parsed as JSON, read with `limit` first if it is still unread.
    pub async fn parse_json<T: DeserializeOwned>(
        self,
        headers: &impl HeaderLookup,
        limit: usize,
    ) -> Result<T, BodyProblem> {
        parse_json(&self.read(headers, limit).await?)
    }
}

/// Reads at most `limit` bytes and parses them as JSON.
pub async fn parse_body<T: DeserializeOwned>(
    headers: &impl HeaderLookup,
    body: Body,
    limit: usize,
) -> Result<T, BodyProblem> {
    let bytes = read_limited(headers, body, limit).await?;
    parse_json(&bytes)
}

/// Parses JSON, classifying a failure and naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyProblem> {
    // The common case, a valid body, parses once without tracking the path
    // (a wrapper around every value visited); a failure parses again to name the field.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut deserializer);
    let value = match parsed {
        Ok(value) => value,
        Err(error) => {
            // No segment is the root and a lone unknown one an unknown
            // position: no field to name. Decided on the segments, not the
            // path's text: a key named `.` or `?` is written the same way.
            let segments: Vec<&serde_path_to_error::Segment> = error.path().iter().collect();
            let nameless = matches!(segments.as_slice(), [] | [serde_path_to_error::Segment::Unknown]);
            let at = (!nameless).then(|| error.path().to_string());
            let inner = error.into_inner();
            let message = inner.to_string();
            return Err(match inner.classify() {
                serde_json::error::Category::Syntax
                | serde_json::error::Category::Eof
                | serde_json::error::Category::Io => BodyProblem::Malformed { message },
                // An unknown field's path already ends with its name.
                serde_json::error::Category::Data if message.starts_with("unknown field") => {
                    BodyProblem::UnknownField {
                        field: at.unwrap_or_default(),
                        message,
                    }
                }
                // A field given twice (or under two of its names) is reported at its parent too.
                serde_json::error::Category::Data if message.starts_with("duplicate field") => {
                    let name = message.split('`').nth(1).unwrap_or_default();
                    let field = match at {
                        Some(parent) => format!("{parent}.{name}"),
                        None => name.to_string(),
                    };
                    BodyProblem::WrongType {
                        field: Some(field),
                        message,
                    }
                }
                // A missing field is reported at its parent: name the field itself.
                serde_json::error::Category::Data if message.starts_with("missing field") => {
                    let name = message.split('`').nth(1).unwrap_or_default();
                    let field = match at {
                        Some(parent) => format!("{parent}.{name}"),
                        None => name.to_string(),
                    };
                    BodyProblem::MissingField { field, message }
                }
                serde_json::error::Category::Data => BodyProblem::WrongType { field: at, message },
            });
        }
    };
    deserializer.end().map_err(|error| BodyProblem::Malformed {
        message: format!("trailing data after the JSON body: {error}"),
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read through Debug only
    struct Outer {
        name: String,
        items: Vec<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        weight: u32,
    }

    #[test]
    fn each_failure_has_its_kind_and_field() {
        let problem = |text: &str| parse_json::<Outer>(text.as_bytes()).unwrap_err();
        assert!(matches!(problem("{\"name\":"), BodyProblem::Malformed { .. }));
        assert!(matches!(
            problem(r#"{"name":"a","items":[]} {}"#),
            BodyProblem::Malformed { .. }
        ));
        assert_eq!(problem(r#"{"name":"a","items":[],"extra":1}"#).field(), Some("extra"));
        assert_eq!(problem(r#"{"name":"a"}"#).field(), Some("items"));
        assert_eq!(problem(r#"{"name":"a","items":[{}]}"#).field(), Some("items[0].weight"));
        assert_eq!(
            problem(r#"{"name":"a","items":[{"weight":"x"}]}"#).field(),
            Some("items[0].weight")
        );
        assert!(matches!(problem("[]"), BodyProblem::WrongType { field: None, .. }));
        assert_eq!(problem(r#"{"name":"a","name":"b","items":[]}"#).field(), Some("name"));
        // Keys spelt like the root (`.`) or an unknown place (`?`) are fields
        // too (found by the `registration` fuzz target).
        assert_eq!(problem(r#"{".":"a]-1"}"#).field(), Some("."));
        assert_eq!(problem(r#"{"?":1}"#).field(), Some("?"));
        assert_eq!(problem(r#"{"name":"a","items":[{".":1}]}"#).field(), Some("items[0].."));
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_too_large() {
        let headers = HeaderMap::new();
        let read = read_limited(&headers, Body::from(vec![b'x'; 2048]), 1024).await;
        assert_eq!(read, Err(BodyProblem::TooLarge { limit: 1024 }));
        let read = read_limited(&headers, Body::from("{}"), 1024).await;
        assert_eq!(read, Ok(bytes::Bytes::from_static(b"{}")));
    }
}
