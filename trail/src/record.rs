//! One call's record: what the pipeline hands the trail ([`Entry`]), the
//! text that is stored and hashed (the body), and what a reader gets back
//! ([`Record`]).
//!
//! A record is stored as its body (compact JSON, fields in a fixed order)
//! and the SHA-256 of those exact bytes, so a verifier hashes what it reads
//! and never has to reproduce a serialisation. The body holds `prev_hash`,
//! the hash of the record before it in the same chain: changing, removing
//! or reordering a record breaks a link.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest as _;

/// The `prev_hash` of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One finished call as the pipeline hands it over: owned, so the request
/// path copies a handful of strings and nothing waits on the trail.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entry {
    /// When the call arrived (epoch ms).
    pub at_ms: u64,
    pub request_id: String,
    pub trace_id: String,
    pub session_id: Option<String>,
    pub context_id: Option<String>,
    pub run_id: Option<String>,
    pub task_id: Option<String>,
    /// The request this call was made while serving (an agent calling
    /// onwards), when the router knows it.
    pub parent_request_id: Option<String>,
    /// A replayed call: the request id it replays.
    pub replay_of: Option<String>,
    /// The verified caller (empty without authentication).
    pub caller: String,
    /// The delegation chain, outermost first (RFC 8693 `act`), when known.
    pub chain: Option<Value>,
    /// Which door: `invoke`, `stream`, `broadcast`, `delivery`, `a2a`, `mcp`.
    pub door: &'static str,
    pub capability: String,
    pub capability_version: Option<String>,
    /// The instance of the last attempt, and its agent name.
    pub agent_id: Option<String>,
    pub agent: Option<String>,
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

/// The stored text of a record: the entry, its place in the chain and the
/// previous record's hash. Field order is the struct's, fixed; written by
/// hand ([`Body::write`]: serde's derive was the largest part of sealing in
/// `router-bench --trail`'s profile), byte for byte what serde_json writes
/// (a test holds it to that; the derive is that test's reference).
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

impl<'a> Body<'a> {
    pub(crate) fn of(entry: &'a Entry, seq: u64, router: &'a str, tenant: &'a str, prev_hash: &'a str) -> Self {
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

impl Body<'_> {
    /// The body as compact JSON, as serde_json writes it.
    pub(crate) fn write(&self, out: &mut String) -> Result<(), String> {
        let mut json = Writer { out, first: true };
        json.number("seq", self.seq);
        json.number("at_ms", self.at_ms);
        json.string("router", self.router);
        json.string("tenant", self.tenant);
        json.string("request_id", self.request_id);
        json.string("trace_id", self.trace_id);
        json.optional("session_id", self.session_id);
        json.optional("context_id", self.context_id);
        json.optional("run_id", self.run_id);
        json.optional("task_id", self.task_id);
        json.optional("parent_request_id", self.parent_request_id);
        json.optional("replay_of", self.replay_of);
        json.string("caller", self.caller);
        json.value("chain", self.chain)?;
        json.string("door", self.door);
        json.string("capability", self.capability);
        json.optional("capability_version", self.capability_version);
        json.optional("agent_id", self.agent_id);
        json.optional("agent", self.agent);
        json.number("attempts", u64::from(self.attempts));
        json.key("duration_ms");
        // serde_json's number format (`2.0`; `null` when not finite).
        json.out.push_str(
            &serde_json::to_string(&self.duration_ms)
                .map_err(|error| format!("cannot write a trail record: {error}"))?,
        );
        json.string("status", self.status);
        json.optional("code", self.code);
        json.value("input", self.input)?;
        json.value("output", self.output)?;
        json.string("prev_hash", self.prev_hash);
        json.out.push('}');
        Ok(())
    }
}

/// A JSON object written member by member.
struct Writer<'o> {
    out: &'o mut String,
    first: bool,
}

impl Writer<'_> {
    fn key(&mut self, name: &str) {
        self.out.push(if self.first { '{' } else { ',' });
        self.first = false;
        self.out.push('"');
        self.out.push_str(name);
        self.out.push_str("\":");
    }

    fn number(&mut self, name: &str, value: u64) {
        self.key(name);
        // Writing into a String cannot fail.
        let _ = write!(self.out, "{value}");
    }

    fn string(&mut self, name: &str, value: &str) {
        self.key(name);
        if value.bytes().any(|byte| byte < 0x20 || byte == b'"' || byte == b'\\') {
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

    fn value(&mut self, name: &str, value: Option<&Value>) -> Result<(), String> {
        if let Some(value) = value {
            self.key(name);
            self.out.push_str(
                &serde_json::to_string(value).map_err(|error| format!("cannot write a trail record: {error}"))?,
            );
        }
        Ok(())
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
        for (entry, duration) in [(full, 2.0), (Entry::default(), f64::NAN), (Entry::default(), 0.125)] {
            let entry = Entry {
                duration_ms: duration,
                ..entry
            };
            let body = Body::of(&entry, 42, "r-a", "t\u{7f}", GENESIS);
            let mut written = String::new();
            body.write(&mut written).unwrap();
            assert_eq!(written, serde_json::to_string(&body).unwrap());
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
        let mut body = String::new();
        Body::of(&entry, 7, "r-a", "default", GENESIS).write(&mut body).unwrap();
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
