//! The router's own envelopes written field by field (the forwarded envelope,
//! [`Forwarded`], and the succeeded result envelope, [`Succeeded`]): literal keys, strings
//! escaped exactly as serde_json escapes them, nested values (payloads) by
//! serde_json. Derived `Serialize` went through serde's field machinery per
//! field and per request (~3 % of the router's CPU for the forwarded and
//! result envelopes); tests keep each writer byte-equal to the contract type.

use agent_reach_access::Caller;
use agent_reach_proto::envelope::{BudgetLeft, InvokeRequest, Priority, ENVELOPE_VERSION};
use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON object being written into a buffer.
pub struct Object<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
    /// What [`Object::end`] writes: `}`, or `}]` for [`Object::array_of_one`]'s object.
    close: &'static [u8],
}

impl<'a> Object<'a> {
    /// Starts an object at the end of `out`.
    pub fn start(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self {
            out,
            empty: true,
            close: b"}",
        }
    }

    /// An object under `key`; written on until its own [`Object::end`].
    pub fn object(&mut self, key: &str) -> Object<'_> {
        self.key(key);
        Object::start(self.out)
    }

    /// An array under `key` holding one object, written on until its [`Object::end`].
    pub fn array_of_one(&mut self, key: &str) -> Object<'_> {
        self.key(key);
        self.out.push(b'[');
        Object {
            close: b"}]",
            ..Object::start(self.out)
        }
    }

    /// `key` must need no escaping (the router's own field names).
    fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    pub fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        string(self.out, value);
    }

    /// The field only when `value` is there (`skip_serializing_if = "Option::is_none"`).
    pub fn opt_str(&mut self, key: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.str(key, value);
        }
    }

    pub fn u64(&mut self, key: &str, value: u64) {
        self.key(key);
        self.out
            .extend_from_slice(agent_reach_serving::decimal(value, &mut [0; 20]));
    }

    /// `raw` is JSON already (e.g. an agent's output as it sent it); `None` is `null`.
    pub fn raw(&mut self, key: &str, raw: Option<&str>) {
        self.key(key);
        self.out.extend_from_slice(raw.unwrap_or("null").as_bytes());
    }

    /// Any serialisable value, by serde_json.
    pub fn value(&mut self, key: &str, value: &impl serde::Serialize) -> serde_json::Result<()> {
        self.key(key);
        serde_json::to_writer(&mut *self.out, value)
    }

    pub fn end(self) {
        self.out.extend_from_slice(self.close);
    }
}

/// [`ForwardedEnvelope`] as the router writes it, borrowing what it already
/// holds instead of copying six strings and the payload per call; written as
/// the same JSON (a test keeps the two equal).
pub(crate) struct Forwarded<'a> {
    pub(crate) version: &'a str,
    pub(crate) request_id: &'a str,
    pub(crate) session_id: Option<&'a str>,
    pub(crate) context_id: Option<&'a str>,
    pub(crate) capability: &'a str,
    pub(crate) capability_version: &'a str,
    pub(crate) source: Option<&'a str>,
    pub(crate) priority: Priority,
    pub(crate) deadline: u64,
    pub(crate) attempt: u32,
    pub(crate) payload: &'a Value,
    /// A task's delivery: the id the agent reports a `202`'s outcome under.
    pub(crate) task_id: Option<&'a str>,
    /// What is left of the chain's budget, this call charged.
    pub(crate) budget: Option<BudgetLeft>,
    /// A multi-turn task's next turn: the conversation so far.
    pub(crate) history: Option<&'a Value>,
    /// A workflow step's delivery: its run.
    pub(crate) run_id: Option<&'a str>,
    /// A paused task's resumed delivery: the checkpoint it paused with.
    pub(crate) checkpoint: Option<&'a Value>,
}

impl<'a> Forwarded<'a> {
    /// What the router forwards of `request` for `capability` at `capability_version`.
    pub(crate) fn new(
        request: &'a InvokeRequest,
        request_id: &'a str,
        (capability, capability_version): (&'a str, &'a str),
        caller: &'a Caller,
        deadline: u64,
        attempt: u32,
    ) -> Self {
        Self {
            version: ENVELOPE_VERSION,
            request_id,
            session_id: request.session_id.as_deref(),
            context_id: request.context_id.as_deref(),
            capability,
            capability_version,
            source: caller.name(),
            priority: request.priority.unwrap_or_default(),
            deadline,
            attempt,
            payload: &request.payload,
            task_id: None,
            budget: None,
            history: None,
            run_id: None,
            checkpoint: None,
        }
    }

    /// The envelope's JSON, field for field as [`ForwardedEnvelope`] serialises.
    pub(crate) fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256);
        let mut object = Object::start(&mut out);
        object.str("version", self.version);
        object.str("request_id", self.request_id);
        object.opt_str("session_id", self.session_id);
        object.opt_str("context_id", self.context_id);
        object.str("capability", self.capability);
        object.str("capability_version", self.capability_version);
        object.opt_str("source", self.source);
        object.str("priority", self.priority.as_str());
        object.u64("deadline", self.deadline);
        object.u64("attempt", u64::from(self.attempt));
        object.value("payload", self.payload)?;
        object.opt_str("task_id", self.task_id);
        if let Some(budget) = &self.budget {
            object.raw("budget", Some(&budget_json(budget)));
        }
        if let Some(history) = self.history {
            object.value("history", history)?;
        }
        object.opt_str("run_id", self.run_id);
        if let Some(checkpoint) = self.checkpoint {
            object.value("checkpoint", checkpoint)?;
        }
        object.end();
        Ok(out)
    }
}

/// The succeeded result envelope (DESIGN §3), field for field as
/// [`ResultEnvelope`] serialises, with the agent's output written as it came
/// (`null` when it sent none).
pub(crate) struct Succeeded<'a> {
    pub(crate) version: &'a str,
    pub(crate) request_id: &'a str,
    pub(crate) capability: Option<&'a str>,
    pub(crate) capability_version: &'a str,
    pub(crate) agent_id: &'a str,
    pub(crate) attempts: u32,
    pub(crate) duration_ms: u64,
    pub(crate) output: Option<&'a RawValue>,
    /// What is left of the call's budget, when it carried one.
    pub(crate) budget: Option<BudgetLeft>,
}

impl Succeeded<'_> {
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let output = self.output.map(RawValue::get);
        let mut out = Vec::with_capacity(192 + output.map_or(4, str::len));
        let mut object = Object::start(&mut out);
        object.str("version", self.version);
        object.str("request_id", self.request_id);
        object.str("status", "succeeded");
        object.opt_str("capability", self.capability);
        object.str("capability_version", self.capability_version);
        object.str("agent_id", self.agent_id);
        object.u64("attempts", u64::from(self.attempts));
        object.u64("duration_ms", self.duration_ms);
        object.raw("output", output);
        if let Some(budget) = &self.budget {
            object.raw("budget", Some(&budget_json(budget)));
        }
        object.end();
        out
    }
}

/// `{"calls_left": …, "cost_left": …}` as serde_json writes [`BudgetLeft`]
/// (written by hand: a chained call's every answer carries it).
fn budget_json(budget: &BudgetLeft) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(48);
    out.push('{');
    if let Some(calls) = budget.calls_left {
        // Writing into a String cannot fail.
        let _ = write!(out, "\"calls_left\":{calls}");
    }
    if let Some(cost) = budget.cost_left {
        if budget.calls_left.is_some() {
            out.push(',');
        }
        out.push_str("\"cost_left\":");
        // serde_json's own number format (`5.0`, `null` for what is not finite).
        out.push_str(&serde_json::to_string(&cost).unwrap_or_else(|_| "null".to_string()));
    }
    out.push('}');
    out
}

/// `text` as a JSON string, escaped as serde_json escapes it (only `"`, `\`
/// and control characters below 0x20).
pub fn string(out: &mut Vec<u8>, text: &str) {
    if !needs_escape(text.as_bytes()) {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

/// Whether any byte is `"`, `\` or below 0x20: eight bytes at a time
/// (the classic "has zero byte" word tricks), the tail byte by byte.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `word` below `n` (n <= 0x80) sets its high bit here; a byte equal to `b` does in `zero(word ^ b * ONES)`.
    let below = |word: u64, n: u64| word.wrapping_sub(ONES * n) & !word & HIGHS;
    let zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0_u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        if below(word, 0x20) | zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\'))) != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\')
}

#[cfg(test)]
mod tests {
    use agent_reach_proto::envelope::{ForwardedEnvelope, ResultEnvelope, ResultStatus};
    use serde_json::json;

    use super::*;

    #[test]
    fn a_budget_is_written_as_serde_json_writes_it() {
        for budget in [
            BudgetLeft {
                calls_left: Some(5),
                cost_left: Some(12.5),
            },
            BudgetLeft {
                calls_left: Some(-1),
                cost_left: None,
            },
            BudgetLeft {
                calls_left: None,
                cost_left: Some(3.0),
            },
            BudgetLeft {
                calls_left: None,
                cost_left: Some(f64::NAN),
            },
            BudgetLeft {
                calls_left: None,
                cost_left: None,
            },
        ] {
            assert_eq!(
                budget_json(&budget),
                serde_json::to_string(&budget).unwrap(),
                "{budget:?}"
            );
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for text in [
            "",
            "plain",
            "quote\"",
            "back\\slash",
            "tab\tnew\nline",
            "\u{1}\u{1f}",
            "ünïcødé €",
            "\u{7f}",
        ] {
            let mut out = Vec::new();
            string(&mut out, text);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn escapes_are_found_wherever_they_are() {
        let plain = "abcdefghijklmnopqrstuvwxyz-0123456789.ABC~\u{7f}é€";
        assert!(!needs_escape(plain.as_bytes()));
        for special in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
            for at in 0..=plain.len().min(40) {
                if !plain.is_char_boundary(at) {
                    continue;
                }
                let text = format!("{}{special}{}", &plain[..at], &plain[at..]);
                assert!(needs_escape(text.as_bytes()), "{text:?}");
            }
        }
        // Bytes just beside the special ones are plain.
        assert!(!needs_escape(&[0x20, b'!', b'#', b'[', b']', 0x80, 0xff, 0x20, 0x21]));
    }

    #[test]
    fn objects_are_written_field_by_field() {
        let mut out = Vec::new();
        let mut object = Object::start(&mut out);
        object.str("a", "x");
        object.opt_str("skipped", None);
        object.opt_str("b", Some("y\""));
        object.u64("n", u64::MAX);
        object.raw("r", Some("[1,2]"));
        object.raw("z", None);
        object.value("v", &serde_json::json!({"k": [true]})).unwrap();
        object.end();
        let expected =
            serde_json::json!({"a": "x", "b": "y\"", "n": u64::MAX, "r": [1, 2], "z": null, "v": {"k": [true]}});
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&out).unwrap(), expected);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":"x","b":"y\"","n":18446744073709551615,"r":[1,2],"z":null,"v":{"k":[true]}}"#
        );
        let mut empty = Vec::new();
        Object::start(&mut empty).end();
        assert_eq!(empty, b"{}");
    }

    /// The borrowed envelope the router writes is the agents' `ForwardedEnvelope`, byte for byte.
    #[test]
    fn the_forwarded_envelope_is_written_as_the_contract_type() {
        let payload = json!({ "order_id": "SO-1", "lines": [1, 2.5, "x\"y"] });
        let history =
            json!([{ "role": "user", "payload": { "size": 1 } }, { "role": "agent", "message": "which size?" }]);
        let cases = [
            (
                Some("s-1"),
                Some("c-1"),
                Some("caller"),
                "req-1",
                Priority::High,
                None,
                None,
            ),
            (
                None,
                None,
                None,
                "req\"\\2",
                Priority::Normal,
                Some("t_0123"),
                Some(&history),
            ),
            (Some("s\u{1}"), None, Some("c\n"), "r", Priority::Low, None, None),
        ];
        let checkpoint = json!({"done": 3});
        for (session_id, context_id, source, request_id, priority, task_id, turns) in cases {
            // A task's delivery may be a run's step resumed from a checkpoint.
            let (run_id, checkpoint) = match task_id {
                Some(_) => (Some("r_1"), Some(&checkpoint)),
                None => (None, None),
            };
            let borrowed = Forwarded {
                version: ENVELOPE_VERSION,
                request_id,
                session_id,
                context_id,
                capability: "order.query",
                capability_version: "1.2.0",
                source,
                priority,
                deadline: 1_700_000_000_123,
                attempt: 2,
                payload: &payload,
                task_id,
                budget: Some(BudgetLeft {
                    calls_left: Some(3),
                    cost_left: None,
                }),
                history: turns,
                run_id,
                checkpoint,
            };
            let owned = ForwardedEnvelope {
                version: ENVELOPE_VERSION.to_string(),
                request_id: request_id.to_string(),
                session_id: session_id.map(str::to_string),
                context_id: context_id.map(str::to_string),
                capability: "order.query".to_string(),
                capability_version: "1.2.0".to_string(),
                source: source.map(str::to_string),
                priority,
                deadline: 1_700_000_000_123,
                attempt: 2,
                payload: payload.clone(),
                task_id: task_id.map(str::to_string),
                budget: Some(BudgetLeft {
                    calls_left: Some(3),
                    cost_left: None,
                }),
                history: turns.cloned(),
                run_id: run_id.map(str::to_string),
                checkpoint: checkpoint.cloned(),
            };
            let written = String::from_utf8(borrowed.to_vec().unwrap()).unwrap();
            assert_eq!(written, serde_json::to_string(&owned).unwrap());
            assert_eq!(serde_json::from_str::<ForwardedEnvelope>(&written).unwrap(), owned);
        }
    }

    #[test]
    fn a_succeeded_envelope_is_written_as_result_envelope_writes_it_with_the_output_verbatim() {
        let output =
            serde_json::value::RawValue::from_string(r#"{"big":12345678901234567890123,"x":1.50}"#.into()).unwrap();
        let written = String::from_utf8(
            Succeeded {
                version: ENVELOPE_VERSION,
                request_id: "r-1",
                capability: Some("order.query"),
                capability_version: "1.2.0",
                agent_id: "order_query-1",
                attempts: 2,
                duration_ms: 7,
                output: Some(&output),
                budget: None,
            }
            .to_vec(),
        )
        .unwrap();
        // Digits a JSON value would round away stay as the agent sent them.
        assert!(
            written.contains(r#""output":{"big":12345678901234567890123,"x":1.50}"#),
            "{written}"
        );
        let parsed: ResultEnvelope = serde_json::from_str(&written).unwrap();
        let expected = ResultEnvelope {
            version: ENVELOPE_VERSION.to_string(),
            request_id: "r-1".into(),
            status: ResultStatus::Succeeded,
            capability: Some("order.query".into()),
            capability_version: Some("1.2.0".into()),
            agent_id: Some("order_query-1".into()),
            attempts: 2,
            duration_ms: 7,
            output: parsed.output.clone(),
            error: None,
            budget: None,
        };
        assert_eq!(parsed, expected);
        let reference = serde_json::to_value(&expected).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!(ours, reference, "same fields, same names");

        // No output is `null`; strings are escaped; no capability, no field; byte for byte as serde writes.
        let written = Succeeded {
            version: ENVELOPE_VERSION,
            request_id: "r\"\\1",
            capability: None,
            capability_version: "1.0.0",
            agent_id: "a\u{1}",
            attempts: 1,
            duration_ms: 0,
            output: None,
            budget: None,
        }
        .to_vec();
        let reference = ResultEnvelope {
            version: ENVELOPE_VERSION.to_string(),
            request_id: "r\"\\1".into(),
            status: ResultStatus::Succeeded,
            capability: None,
            capability_version: Some("1.0.0".into()),
            agent_id: Some("a\u{1}".into()),
            attempts: 1,
            duration_ms: 0,
            output: Some(serde_json::Value::Null),
            error: None,
            budget: None,
        };
        assert_eq!(
            String::from_utf8(written).unwrap(),
            serde_json::to_string(&reference).unwrap()
        );
    }
}
