//! W3C trace context: continue the caller's `traceparent` (same trace id, the
//! router as the new parent span) or start a trace, and generate request ids.

use http::HeaderValue;
use rand::Rng;

#[derive(Debug, Clone)]
pub struct TraceContext {
    pub trace_id: String,
    pub span_id: String,
    pub sampled: bool,
    /// The trace came from a valid `traceparent` (else the router started it).
    pub continued: bool,
}

impl TraceContext {
    /// From an incoming `traceparent` header, or a fresh trace when absent or invalid.
    pub fn from_header(header: Option<&HeaderValue>) -> Self {
        let span_id = random_hex(8);
        if let Some((trace_id, flags)) = header.and_then(|value| value.to_str().ok()).and_then(parse) {
            return Self {
                trace_id,
                span_id,
                sampled: flags & 1 == 1,
                continued: true,
            };
        }
        Self {
            trace_id: random_hex(16),
            span_id,
            sampled: true,
            continued: false,
        }
    }

    /// The `traceparent` sent to the agent: this trace, the router's span as parent.
    pub fn forward_header(&self) -> HeaderValue {
        let text = format!(
            "00-{}-{}-{}",
            self.trace_id,
            self.span_id,
            if self.sampled { "01" } else { "00" }
        );
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>` → (trace id, flags).
fn parse(text: &str) -> Option<(String, u8)> {
    let mut parts = text.trim().split('-');
    let (version, trace_id, parent_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |part: &str, len: usize| part.len() == len && part.bytes().all(|b| b.is_ascii_hexdigit());
    if version != "00" || !hex(trace_id, 32) || !hex(parent_id, 16) || !hex(flags, 2) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
        return None;
    }
    Some((trace_id.to_ascii_lowercase(), u8::from_str_radix(flags, 16).ok()?))
}

fn random_hex(bytes: usize) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut rng = rand::thread_rng();
    let mut text = String::with_capacity(bytes * 2);
    for _ in 0..bytes {
        let byte: u8 = rng.gen();
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// A fresh request id (16 hex characters) for envelopes that bring none.
pub fn new_request_id() -> String {
    random_hex(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_a_valid_trace_and_starts_one_otherwise() {
        let incoming = HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let context = TraceContext::from_header(Some(&incoming));
        assert_eq!(context.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        let forwarded = context.forward_header();
        let forwarded = forwarded.to_str().unwrap();
        assert!(forwarded.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(!forwarded.contains("00f067aa0ba902b7"));
        let fresh = TraceContext::from_header(Some(&HeaderValue::from_static("garbage")));
        assert_eq!(fresh.trace_id.len(), 32);
    }
}
