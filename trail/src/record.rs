//! One call's record: what the pipeline hands the trail ([`Entry`]), the
//! text that is stored and hashed (the body), and what a reader gets back
//! ([`Record`]).
//!
//! A record is stored as its body (compact JSON, fields in a fixed order)
//! and the SHA-256 of those exact bytes, so a verifier hashes what it reads
//! and never has to reproduce a serialisation. The body holds `prev_hash`,
//! the hash of the record before it in the same chain: changing, removing
//! or reordering a record breaks a link.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest as _;

/// The `prev_hash` of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One finished call as the pipeline hands it over. Its strings are
/// borrowed from the call where the call is recorded at once (rendered on
/// the offering thread, [`Rendered::of`]: no copy of each), owned where the
/// entry waits for the call's end ([`Entry::into_owned`], a stream's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entry<'a> {
    /// When the call arrived (epoch ms).
    pub at_ms: u64,
    pub request_id: Cow<'a, str>,
    pub trace_id: Cow<'a, str>,
    pub session_id: Option<Cow<'a, str>>,
    pub context_id: Option<Cow<'a, str>>,
    pub run_id: Option<Cow<'a, str>>,
    pub task_id: Option<Cow<'a, str>>,
    /// The request this call was made while serving (an agent calling
    /// onwards), when the router knows it.
    pub parent_request_id: Option<Cow<'a, str>>,
    /// A replayed call: the request id it replays.
    pub replay_of: Option<Cow<'a, str>>,
    /// The verified caller (empty without authentication).
    pub caller: Cow<'a, str>,
    /// The delegation chain, outermost first (RFC 8693 `act`), when known.
    pub chain: Option<Value>,
    /// Which door: `invoke`, `stream`, `broadcast`, `delivery`, `a2a`, `mcp`.
    pub door: &'static str,
    pub capability: Cow<'a, str>,
    pub capability_version: Option<Cow<'a, str>>,
    /// The instance of the last attempt, and its agent name.
    pub agent_id: Option<Cow<'a, str>>,
    pub agent: Option<Cow<'a, str>>,
    pub attempts: u32,
    pub duration_ms: f64,
    /// `succeeded`, `failed` or `accepted` (answered 202, its result later).
    pub status: &'static str,
    /// The stable code of a failure.
    pub code: Option<&'static str>,
    /// Recorded only where the policy allows it, credential fields redacted.
    pub input: Option<Value>,
    pub output: Option<Value>,
}

impl Entry<'_> {
    /// The entry with its strings copied, to outlive what it borrowed.
    pub fn into_owned(self) -> Entry<'static> {
        let owned = |text: Cow<'_, str>| Cow::Owned(text.into_owned());
        Entry {
            at_ms: self.at_ms,
            request_id: owned(self.request_id),
            trace_id: owned(self.trace_id),
            session_id: self.session_id.map(owned),
            context_id: self.context_id.map(owned),
            run_id: self.run_id.map(owned),
            task_id: self.task_id.map(owned),
            parent_request_id: self.parent_request_id.map(owned),
            replay_of: self.replay_of.map(owned),
            caller: owned(self.caller),
            chain: self.chain,
            door: self.door,
            capability: owned(self.capability),
            capability_version: self.capability_version.map(owned),
            agent_id: self.agent_id.map(owned),
            agent: self.agent.map(owned),
            attempts: self.attempts,
            duration_ms: self.duration_ms,
            status: self.status,
            code: self.code,
            input: self.input,
            output: self.output,
        }
    }
}

/// An entry as it waits for its segment: its body's own members written out
/// on the thread that offered it, while its strings are in that thread's
/// cache, as one text. The writer, a hundred milliseconds and another core
/// later, reads one text instead of a dozen strings (`router-bench
/// --trail`'s profile: the writer's time went to cache misses on the
/// entries' strings), and only puts the chain's members around it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub(crate) at_ms: u64,
    /// `"request_id":…` through `"output":…` (compact JSON, the body's
    /// members between `tenant` and `prev_hash`), then the raw request id.
    text: String,
    members: usize,
    pub(crate) session_id: Option<String>,
    pub(crate) run_id: Option<String>,
    /// The capability, for a record holding its input (replays sample those).
    pub(crate) input_of: Option<String>,
}

impl Rendered {
    /// `entry`'s members, written as serde_json writes the body (fields in
    /// [`Body`]'s order; a test holds the two byte for byte).
    pub fn of(entry: Entry<'_>) -> Self {
        let mut text = String::with_capacity(384 + entry.request_id.len());
        let mut json = Writer {
            out: &mut text,
            first: true,
        };
        json.string("request_id", &entry.request_id);
        json.string("trace_id", &entry.trace_id);
        json.optional("session_id", entry.session_id.as_deref());
        json.optional("context_id", entry.context_id.as_deref());
        json.optional("run_id", entry.run_id.as_deref());
        json.optional("task_id", entry.task_id.as_deref());
        json.optional("parent_request_id", entry.parent_request_id.as_deref());
        json.optional("replay_of", entry.replay_of.as_deref());
        json.string("caller", &entry.caller);
        json.value("chain", entry.chain.as_ref());
        json.string("door", entry.door);
        json.string("capability", &entry.capability);
        json.optional("capability_version", entry.capability_version.as_deref());
        json.optional("agent_id", entry.agent_id.as_deref());
        json.optional("agent", entry.agent.as_deref());
        json.number("attempts", u64::from(entry.attempts));
        json.key("duration_ms");
        push_f64(json.out, entry.duration_ms);
        json.string("status", entry.status);
        json.optional("code", entry.code);
        json.value("input", entry.input.as_ref());
        json.value("output", entry.output.as_ref());
        let members = text.len();
        text.push_str(&entry.request_id);
        Self {
            at_ms: entry.at_ms,
            text,
            members,
            input_of: entry.input.is_some().then(|| entry.capability.into_owned()),
            session_id: entry.session_id.map(Cow::into_owned),
            run_id: entry.run_id.map(Cow::into_owned),
        }
    }

    /// About the bytes its line of a segment takes: its members, and the
    /// chain's (seq, time, router, tenant, hashes) around them.
    pub(crate) fn stored_len(&self) -> usize {
        self.members + 256
    }

    /// The request id, as given.
    pub fn request_id(&self) -> &str {
        &self.text[self.members..]
    }

    /// The stored body of this record at `seq` of `router`'s chain for
    /// `tenant`, after the record whose hash is `prev_hash`: the chain's
    /// members around the entry's own.
    pub(crate) fn body(&self, seq: u64, router: &str, tenant: &str, prev_hash: &str) -> String {
        let mut body = String::with_capacity(self.members + router.len() + tenant.len() + 160);
        body.push('{');
        let mut json = Writer {
            out: &mut body,
            first: true,
        };
        json.number("seq", seq);
        json.number("at_ms", self.at_ms);
        json.string("router", router);
        json.string("tenant", tenant);
        body.push(',');
        body.push_str(&self.text[..self.members]);
        let mut json = Writer {
            out: &mut body,
            first: false,
        };
        json.string("prev_hash", prev_hash);
        body.push('}');
        body
    }
}

impl From<Entry<'_>> for Rendered {
    fn from(entry: Entry<'_>) -> Self {
        Self::of(entry)
    }
}

/// `value` as serde_json writes an `f64` (`2.0`; `null` when not finite),
/// on the stack: the longest is 24 bytes (`-1.7976931348623157e308`).
fn push_f64(out: &mut String, value: f64) {
    let mut number = [0_u8; 32];
    let mut cursor = std::io::Cursor::new(&mut number[..]);
    // Neither can fail: a number fits the buffer, and it is ASCII.
    let written = serde_json::to_writer(&mut cursor, &value)
        .ok()
        .and_then(|()| usize::try_from(cursor.position()).ok())
        .and_then(|written| std::str::from_utf8(&number[..written]).ok());
    out.push_str(written.unwrap_or("null"));
}

/// The stored text of a record as serde's derive writes it: the reference
/// [`Rendered`] is held to byte for byte (writing it by hand took serde's
/// derive, the largest part of sealing in `router-bench --trail`'s
/// profile, off the writer). Field order is the struct's, fixed.
#[cfg(test)]
#[derive(Serialize)]
pub(crate) struct Body<'a> {
    pub seq: u64,
    pub at_ms: u64,
    pub router: &'a str,
    pub tenant: &'a str,
    pub request_id: &'a str,
    pub trace_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_request_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<&'a str>,
    pub caller: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<&'a Value>,
    pub door: &'a str,
    pub capability: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capability_version: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<&'a str>,
    pub attempts: u32,
    pub duration_ms: f64,
    pub status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<&'a Value>,
    pub prev_hash: &'a str,
}

#[cfg(test)]
impl<'a> Body<'a> {
    pub(crate) fn of(entry: &'a Entry<'_>, seq: u64, router: &'a str, tenant: &'a str, prev_hash: &'a str) -> Self {
        Self {
            seq,
            at_ms: entry.at_ms,
            router,
            tenant,
            request_id: &entry.request_id,
            trace_id: &entry.trace_id,
            session_id: entry.session_id.as_deref(),
            context_id: entry.context_id.as_deref(),
            run_id: entry.run_id.as_deref(),
            task_id: entry.task_id.as_deref(),
            parent_request_id: entry.parent_request_id.as_deref(),
            replay_of: entry.replay_of.as_deref(),
            caller: &entry.caller,
            chain: entry.chain.as_ref(),
            door: entry.door,
            capability: &entry.capability,
            capability_version: entry.capability_version.as_deref(),
            agent_id: entry.agent_id.as_deref(),
            agent: entry.agent.as_deref(),
            attempts: entry.attempts,
            duration_ms: entry.duration_ms,
            status: entry.status,
            code: entry.code,
            input: entry.input.as_ref(),
            output: entry.output.as_ref(),
            prev_hash,
        }
    }
}

/// A JSON object's members written one by one (the braces are the caller's).
struct Writer<'o> {
    out: &'o mut String,
    first: bool,
}

impl Writer<'_> {
    fn key(&mut self, name: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push('"');
        self.out.push_str(name);
        self.out.push_str("\":");
    }

    fn number(&mut self, name: &str, value: u64) {
        self.key(name);
        push_decimal(self.out, value);
    }

    fn string(&mut self, name: &str, value: &str) {
        self.key(name);
        // Without an early exit the scan is vectorised: most strings (ids,
        // names) hold nothing to escape.
        let escapes = value.bytes().fold(false, |seen, byte| {
            seen | (byte < 0x20) | (byte == b'"') | (byte == b'\\')
        });
        if escapes {
            // serde_json's escapes; writing a string cannot fail.
            self.out.push_str(&serde_json::to_string(value).unwrap_or_default());
        } else {
            self.out.push('"');
            self.out.push_str(value);
            self.out.push('"');
        }
    }

    fn optional(&mut self, name: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.string(name, value);
        }
    }

    fn value(&mut self, name: &str, value: Option<&Value>) {
        if let Some(value) = value {
            self.key(name);
            // A `Value` always serialises (its map keys are strings).
            self.out
                .push_str(&serde_json::to_string(value).unwrap_or_else(|_| "null".to_string()));
        }
    }
}

/// `value` in decimal, as `{value}` formats it, without the formatting machinery.
pub(crate) fn push_decimal(out: &mut String, value: u64) {
    let mut digits = [0_u8; 20];
    for &digit in agent_reach_serving::decimal(value, &mut digits) {
        out.push(char::from(digit));
    }
}

/// The lowercase hex SHA-256 of `bytes`: every hash of the trail.
pub fn hash_of(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A record as stored: its id in the chain's stream, its body and the hash
/// written beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The stream entry id (`{ms}-{seq}`).
    pub id: String,
    pub body: String,
    pub hash: String,
}

/// A record as a reader gets it (DESIGN §9): the body's fields and its hash.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub at_ms: u64,
    pub router: String,
    pub tenant: String,
    pub request_id: String,
    pub trace_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    pub caller: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Value>,
    pub door: String,
    pub capability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub attempts: u32,
    pub duration_ms: f64,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    pub prev_hash: String,
    /// The hash stored beside the body (not part of it).
    #[serde(default)]
    pub hash: String,
}

impl Record {
    /// The record a stored body holds, with the hash stored beside it.
    pub fn read(stored: &Stored) -> Result<Self, String> {
        let mut record: Record = serde_json::from_str(&stored.body)
            .map_err(|error| format!("record {} is not a trail record: {error}", stored.id))?;
        record.hash = stored.hash.clone();
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_written_as_serde_json_writes_it() {
        let full = Entry {
            at_ms: 1_700_000_000_123,
            request_id: "r-\"quoted\"".into(),
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            session_id: Some("s\n1".into()),
            context_id: Some("c-1".into()),
            run_id: Some("run-1".into()),
            task_id: Some("t-1".into()),
            parent_request_id: Some("p-1".into()),
            replay_of: Some("o-1".into()),
            caller: "caller\\x".into(),
            chain: Some(serde_json::json!(["a", "b"])),
            door: "invoke",
            capability: "order.query".into(),
            capability_version: Some("1.0.0".into()),
            agent_id: Some("oq-1".into()),
            agent: Some("order_query".into()),
            attempts: 3,
            duration_ms: 2.0,
            status: "failed",
            code: Some("AGENT_ERROR"),
            input: Some(serde_json::json!({"text": "é\u{1}", "n": 1.5})),
            output: Some(serde_json::json!(null)),
        };
        let cases = [
            (full, 42, 2.0),
            (Entry::default(), 0, f64::NAN),
            (Entry::default(), 10, 0.125),
            (Entry::default(), u64::MAX, f64::INFINITY),
            (Entry::default(), 9, -f64::MAX),
            (Entry::default(), 1_000_000, 1e-7),
            (Entry::default(), 99, 123_456.789),
        ];
        for (entry, seq, duration) in cases {
            let entry = Entry {
                duration_ms: duration,
                at_ms: seq / 2,
                ..entry
            };
            let written = Rendered::of(entry.clone()).body(seq, "r-a", "t\u{7f}", GENESIS);
            let reference = serde_json::to_string(&Body::of(&entry, seq, "r-a", "t\u{7f}", GENESIS)).unwrap();
            assert_eq!(written, reference);
        }
    }

    #[test]
    fn a_body_reads_back_as_its_record_and_hashes_as_its_bytes() {
        let entry = Entry {
            at_ms: 1_700_000_000_000,
            request_id: "r-1".into(),
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            session_id: Some("s-1".into()),
            caller: "intent_parser".into(),
            door: "invoke",
            capability: "order.query".into(),
            capability_version: Some("1.0.0".into()),
            agent_id: Some("oq-1".into()),
            agent: Some("order_query".into()),
            attempts: 1,
            duration_ms: 2.5,
            status: "succeeded",
            input: Some(serde_json::json!({"order_id": "SO-1"})),
            ..Entry::default()
        };
        let rendered = Rendered::of(entry.clone());
        assert_eq!(rendered.request_id(), "r-1");
        assert_eq!(rendered.input_of.as_deref(), Some("order.query"));
        let body = rendered.body(7, "r-a", "default", GENESIS);
        let stored = Stored {
            id: "1-7".into(),
            hash: hash_of(body.as_bytes()),
            body,
        };
        let record = Record::read(&stored).unwrap();
        assert_eq!(record.seq, 7);
        assert_eq!(record.session_id.as_deref(), Some("s-1"));
        assert_eq!(record.input, entry.input);
        assert_eq!(record.output, None);
        assert_eq!(record.prev_hash, GENESIS);
        assert_eq!(record.hash, stored.hash);
        assert_eq!(record.hash.len(), 64);
        // Absent options are left out of the body, not written as null.
        assert!(!stored.body.contains("run_id"), "{}", stored.body);
    }
}
