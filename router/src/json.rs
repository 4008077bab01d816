//! The router's own envelopes written field by field: literal keys, strings
//! escaped exactly as serde_json escapes them, nested values (payloads) by
//! serde_json. Derived `Serialize` went through serde's field machinery per
//! field and per request (~3 % of the router's CPU for the forwarded and
//! result envelopes); tests keep each writer byte-equal to the contract type.

/// A JSON object being written into a buffer.
pub(crate) struct Object<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Object<'a> {
    /// Starts an object at the end of `out`.
    pub fn start(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
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
            .extend_from_slice(agent_reach_edge::decimal(value, &mut [0; 20]));
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
        self.out.push(b'}');
    }
}

/// `text` as a JSON string, escaped as serde_json escapes it (only `"`, `\`
/// and control characters below 0x20).
pub(crate) fn string(out: &mut Vec<u8>, text: &str) {
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
    use super::*;

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
}
