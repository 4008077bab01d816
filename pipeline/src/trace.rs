//! W3C trace context: continue the caller's `traceparent` (same trace id, the
//! router as the new parent span) or start a trace, and generate request ids.

use std::cell::Cell;

use agent_reach_telemetry::spans::RequestSpan;
use agent_reach_trail::request_id;
use rand::Rng;

/// An id of `N` lowercase hex digits (trace ids 32, span ids 16, generated
/// request ids 28: [`HexId::request`]),
/// held inline: made or copied per request without an allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HexId<const N: usize>([u8; N]);

impl<const N: usize> HexId<N> {
    /// A fresh random id (never all zeros, which W3C trace context forbids).
    pub fn random() -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0_u8; N];
        let mut bits = 0_u64;
        for (index, digit) in text.iter_mut().enumerate() {
            if index % 16 == 0 {
                bits = next_random();
            }
            *digit = DIGITS[(bits & 0x0f) as usize];
            bits >>= 4;
        }
        if text.iter().all(|&digit| digit == b'0') {
            text[N - 1] = b'1';
        }
        Self(text)
    }

    /// `text` as an id: exactly `N` ASCII hex digits (lowercased).
    fn parse(text: &str) -> Option<Self> {
        let bytes = <[u8; N]>::try_from(text.as_bytes()).ok()?;
        bytes
            .iter()
            .all(u8::is_ascii_hexdigit)
            .then(|| Self(bytes.map(|byte| byte.to_ascii_lowercase())))
    }

    /// A deterministic id for `text`: FNV-1a over it, as many 64-bit hashes
    /// (each with its own offset) as the id needs, written in hex.
    fn of_text(text: &str) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0_u8; N];
        for (block, chunk) in digits.chunks_mut(16).enumerate() {
            let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ (block as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for byte in text.bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
            for (index, digit) in chunk.iter_mut().enumerate() {
                *digit = DIGITS[((hash >> (index * 4)) & 0x0f) as usize];
            }
        }
        if digits.iter().all(|&digit| digit == b'0') {
            digits[N - 1] = b'1';
        }
        Self(digits)
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored (`random`, `parse`): always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl<const N: usize> std::ops::Deref for HexId<N> {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl<const N: usize> std::fmt::Display for HexId<N> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl<const N: usize> std::fmt::Debug for HexId<N> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), formatter)
    }
}

thread_local! {
    /// This thread's wyrand state, seeded once from the OS-seeded `thread_rng`.
    static STATE: Cell<u64> = Cell::new(rand::thread_rng().gen());
}

/// 64 random bits from wyrand: ids need to be unique and unguessable enough
/// to not collide, not secret (callers may choose their own request ids), so
/// a statistically strong, fast generator is enough; `thread_rng` (ChaCha)
/// cost ~1 % of the router's CPU for three ids per request.
fn next_random() -> u64 {
    STATE.with(|state| {
        let seed = state.get().wrapping_add(0xa076_1d64_78bd_642f);
        state.set(seed);
        let product = u128::from(seed) * u128::from(seed ^ 0xe703_7ed1_a0b4_28db);
        (product as u64) ^ ((product >> 64) as u64)
    })
}

#[derive(Debug, Clone)]
pub struct TraceContext {
    pub trace_id: HexId<32>,
    pub span_id: HexId<16>,
    pub sampled: bool,
    /// The request's exported span, when spans are exported and the trace is
    /// sampled: selection and attempt spans start under it.
    pub span: Option<RequestSpan>,
}

impl TraceContext {
    /// From an incoming `traceparent` header value, or a fresh trace when absent or invalid.
    pub fn from_header(header: Option<&[u8]>) -> Self {
        let span_id = HexId::random();
        if let Some((trace_id, flags)) = header.and_then(|value| std::str::from_utf8(value).ok()).and_then(parse) {
            return Self {
                trace_id,
                span_id,
                sampled: flags & 1 == 1,
                span: None,
            };
        }
        Self {
            trace_id: HexId::random(),
            span_id,
            sampled: true,
            span: None,
        }
    }

    /// A trace a caller named by an id of its own (the seeds' `trace_id`,
    /// sent without a `traceparent`): 32 hex digits are a W3C trace id as
    /// they are; any other text maps to one (two FNV-1a hashes of it), so every
    /// hop that sees the same text joins the same trace.
    pub fn from_caller_trace_id(text: &str) -> Self {
        let trace_id = HexId::<32>::parse(text)
            .filter(|id| !id.0.iter().all(|&b| b == b'0'))
            .unwrap_or_else(|| HexId::<32>::of_text(text));
        Self {
            trace_id,
            span_id: HexId::random(),
            sampled: true,
            span: None,
        }
    }

    /// The `traceparent` the caller would have sent for this trace (its span
    /// unknown: ours stands in), for span export to continue it.
    pub fn as_incoming(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }

    /// The `traceparent` sent to the agent: this trace, the router's span as
    /// parent (ASCII, a valid header value).
    pub fn forward_header(&self) -> [u8; 55] {
        let mut text = [0_u8; 55];
        text[..3].copy_from_slice(b"00-");
        text[3..35].copy_from_slice(&self.trace_id.0);
        text[35] = b'-';
        text[36..52].copy_from_slice(&self.span_id.0);
        text[52..].copy_from_slice(if self.sampled { b"-01" } else { b"-00" });
        text
    }
}

/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>` → (trace id, flags).
fn parse(text: &str) -> Option<(HexId<32>, u8)> {
    let mut parts = text.trim().split('-');
    let (version, trace_id, parent_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let trace_id = HexId::<32>::parse(trace_id)?;
    let parent_id = HexId::<16>::parse(parent_id)?;
    if version != "00" || flags.len() != 2 || !flags.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if trace_id.0.iter().all(|&b| b == b'0') || parent_id.0.iter().all(|&b| b == b'0') {
        return None;
    }
    Some((trace_id, u8::from_str_radix(flags, 16).ok()?))
}

impl HexId<{ request_id::LEN }> {
    /// A fresh request id for a call arrived at `epoch_ms`: the time as 12
    /// hex digits, then 16 random ones (`agent_reach_trail::request_id`:
    /// the trail finds a request's records by that time).
    pub fn request(epoch_ms: u64) -> Self {
        let mut text = [0_u8; request_id::LEN];
        let (time, random) = text.split_at_mut(request_id::LEN - 16);
        let mut digits = [0_u8; 12];
        request_id::write_time(epoch_ms, &mut digits);
        time.copy_from_slice(&digits);
        random.copy_from_slice(&HexId::<16>::random().0);
        Self(text)
    }
}

/// A fresh request id (28 hex characters, [`HexId::request`]) for envelopes that bring none.
pub fn new_request_id() -> String {
    HexId::request(crate::clock::epoch_ms()).as_str().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn continues_a_valid_trace_and_starts_one_otherwise() {
        let incoming = HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let context = TraceContext::from_header(Some(incoming.as_bytes()));
        assert_eq!(context.trace_id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let forwarded = context.forward_header();
        let forwarded = HeaderValue::from_bytes(&forwarded).unwrap();
        let forwarded = forwarded.to_str().unwrap();
        assert!(forwarded.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(!forwarded.contains("00f067aa0ba902b7"));
        assert_eq!(forwarded.len(), 55);
        assert!(forwarded.ends_with("-01"));
        assert_eq!(context.span_id.len(), 16);
        let fresh = TraceContext::from_header(Some(b"garbage"));
        assert_eq!(fresh.trace_id.len(), 32);
        assert!(fresh
            .trace_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(fresh.trace_id, TraceContext::from_header(None).trace_id);
        let unsampled = TraceContext::from_header(Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
        assert!(unsampled.forward_header().ends_with(b"-00"));
        // Upper-case ids are taken lower-cased; signs, short ids and zero ids are not ids.
        let upper = TraceContext::from_header(Some(b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"));
        assert_eq!(upper.trace_id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let context = TraceContext::from_header(Some(bad));
            assert_ne!(context.trace_id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_ne!(context.trace_id.as_str(), "0".repeat(32));
        }
        // A caller's own trace id: hex ids as they are, other text hashed the same way every time.
        let named = TraceContext::from_caller_trace_id("4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(named.trace_id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let seeds = TraceContext::from_caller_trace_id("trace_6e2b1d");
        assert_eq!(
            seeds.trace_id,
            TraceContext::from_caller_trace_id("trace_6e2b1d").trace_id
        );
        assert_ne!(
            seeds.trace_id,
            TraceContext::from_caller_trace_id("trace_6e2b1e").trace_id
        );
        assert_eq!(seeds.trace_id.len(), 32);
        assert!(parse(&seeds.as_incoming()).is_some(), "a valid traceparent");
        // Fresh ids differ and use every hex digit in every place.
        let ids: Vec<HexId<16>> = (0..2000).map(|_| HexId::random()).collect();
        let distinct: std::collections::HashSet<&str> = ids.iter().map(|id| id.as_str()).collect();
        assert_eq!(distinct.len(), ids.len());
        for place in 0..16 {
            let digits: std::collections::HashSet<u8> = ids.iter().map(|id| id.0[place]).collect();
            assert_eq!(digits.len(), 16, "place {place}");
        }
    }

    #[test]
    fn a_generated_request_id_says_when_it_was_made_and_is_random_after() {
        let at = 1_765_000_123_456;
        let one = HexId::request(at);
        let two = HexId::request(at);
        assert_eq!(one.len(), 28);
        assert_eq!(request_id::time_of(&one), Some(at));
        assert_eq!(request_id::time_of(&new_request_id()).map(|ms| ms > at), Some(true));
        assert_eq!(one[..12], two[..12]);
        assert_ne!(one[12..], two[12..]);
    }
}
