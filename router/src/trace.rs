//! W3C trace context: continue the caller's `traceparent` (same trace id, the
//! router as the new parent span) or start a trace, and generate request ids.

use agent_reach_telemetry::spans::RequestSpan;
use http::HeaderValue;
use rand::Rng;

#[derive(Debug, Clone)]
pub struct TraceContext {
    pub trace_id: String,
    pub span_id: String,
    pub sampled: bool,
    /// The request's exported span, when spans are exported and the trace is
    /// sampled: selection and attempt spans start under it.
    pub span: Option<RequestSpan>,
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
                span: None,
            };
        }
        Self {
            trace_id: random_hex(16),
            span_id,
            sampled: true,
            span: None,
        }
    }

    /// The `traceparent` sent to the agent: this trace, the router's span as parent.
    pub fn forward_header(&self) -> HeaderValue {
        let mut text = [0_u8; 55];
        text[..3].copy_from_slice(b"00-");
        text[3..35].copy_from_slice(&ascii_or_zeros::<32>(&self.trace_id));
        text[35] = b'-';
        text[36..52].copy_from_slice(&ascii_or_zeros::<16>(&self.span_id));
        text[52..].copy_from_slice(if self.sampled { b"-01" } else { b"-00" });
        HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// `id` as exactly `N` bytes: ids made here and ids parsed by [`parse`] have
/// their length already; anything else becomes zeros, which the next hop rejects.
fn ascii_or_zeros<const N: usize>(id: &str) -> [u8; N] {
    <[u8; N]>::try_from(id.as_bytes()).unwrap_or([b'0'; N])
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

/// `bytes` random bytes (at most 16) as lowercase hex.
fn random_hex(bytes: usize) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = bytes.min(16);
    let random: u128 = rand::thread_rng().gen();
    let mut text = [0_u8; 32];
    for (index, pair) in text.chunks_exact_mut(2).take(bytes).enumerate() {
        let byte = (random >> (index * 8)) as u8;
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
    // Hex digits are ASCII: the lossy conversion never replaces anything and
    // copies once (collecting chars pushed them one by one, per request).
    String::from_utf8_lossy(&text[..bytes * 2]).into_owned()
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
        assert_eq!(forwarded.len(), 55);
        assert!(forwarded.ends_with("-01"));
        assert_eq!(context.span_id.len(), 16);
        let fresh = TraceContext::from_header(Some(&HeaderValue::from_static("garbage")));
        assert_eq!(fresh.trace_id.len(), 32);
        assert!(fresh
            .trace_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(fresh.trace_id, TraceContext::from_header(None).trace_id);
        let unsampled = TraceContext::from_header(Some(&HeaderValue::from_static(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        )));
        assert!(unsampled.forward_header().to_str().unwrap().ends_with("-00"));
    }
}
