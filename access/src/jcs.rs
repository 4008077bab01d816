//! RFC 8785, the JSON Canonicalization Scheme (JCS): one byte string per JSON
//! value, so a signature over a document survives any JSON library's
//! re-serialisation. Object members are sorted by their names' UTF-16 code
//! units, strings escape only `"`, `\` and the C0 controls (the rest is
//! literal UTF-8), numbers are written as ECMAScript's `Number.prototype.toString`
//! writes the IEEE 754 double they denote, and there is no whitespace.
//!
//! Written here rather than taken from a crate: the one maintained crate
//! turns on serde_json's `float_roundtrip` for the whole workspace (slower
//! float parsing on every request path). The number formatting itself is
//! `ryu-js` (ECMA-262 §7.1.12.1, as RFC 8785 §3.2.2.3 requires).

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Parses JSON text with every number read exactly as RFC 8785 reads it:
/// the double nearest to its decimal text. serde_json's default parsing may
/// land one unit in the last place off for long decimals
/// (`333333333.33333329`), which would canonicalise to other bytes than the
/// signer's; verifiers read the documents they check with this.
pub fn parse(text: &[u8]) -> Result<Value, serde_json::Error> {
    let raw: &RawValue = serde_json::from_slice(text)?;
    exact(raw)
}

fn exact(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'{') => {
            // Later duplicates win, as in serde_json.
            let members: BTreeMap<String, &RawValue> = serde_json::from_str(text)?;
            let mut object = Map::new();
            for (name, value) in members {
                object.insert(name, exact(value)?);
            }
            Ok(Value::Object(object))
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text)?;
            items.into_iter().map(exact).collect::<Result<_, _>>().map(Value::Array)
        }
        Some(b'-' | b'0'..=b'9') => {
            let integer = text.bytes().all(|byte| byte == b'-' || byte.is_ascii_digit());
            if integer {
                if let Ok(value) = text.parse::<i64>() {
                    return Ok(Value::from(value));
                }
                if let Ok(value) = text.parse::<u64>() {
                    return Ok(Value::from(value));
                }
            }
            // Rust's float parsing is correctly rounded; JSON's grammar is a subset of what it reads.
            match text.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                Some(number) => Ok(Value::Number(number)),
                None => serde_json::from_str(text),
            }
        }
        _ => serde_json::from_str(text),
    }
}

/// The canonical UTF-8 bytes of `value`.
pub fn canonical(value: &Value) -> Vec<u8> {
    let mut out = String::with_capacity(256);
    write_value(value, &mut out);
    out.into_bytes()
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(number, out),
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => write_object(members, out),
    }
}

/// Members in the order of their names' UTF-16 code units (RFC 8785 §3.2.3),
/// which differs from UTF-8 byte order for names beyond the BMP.
fn write_object(members: &Map<String, Value>, out: &mut String) {
    let mut sorted: Vec<(Vec<u16>, &String, &Value)> = members
        .iter()
        .map(|(name, value)| (name.encode_utf16().collect(), name, value))
        .collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    out.push('{');
    for (index, (_, name, value)) in sorted.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_string(name, out);
        out.push(':');
        write_value(value, out);
    }
    out.push('}');
}

/// JSON numbers are IEEE 754 doubles (RFC 8785 §3.2.2.3): an integer beyond
/// 2^53 is written as the double it rounds to, as a JavaScript verifier reads it.
fn write_number(number: &serde_json::Number, out: &mut String) {
    let double = if let Some(integer) = number.as_i64() {
        integer as f64
    } else if let Some(integer) = number.as_u64() {
        integer as f64
    } else {
        // serde_json holds no NaN or infinity: every other number is an f64.
        number.as_f64().unwrap_or_default()
    };
    // ECMAScript writes -0 as "0"; ryu-js follows it.
    out.push_str(ryu_js::Buffer::new().format_finite(double));
}

/// RFC 8785 §3.2.2.2: `"` and `\` escaped, the C0 controls as `\b \t \n \f \r`
/// or `\u00xx` (lower-case hex), everything else as itself.
fn write_string(text: &str, out: &mut String) {
    out.push('"');
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            control if u32::from(control) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", u32::from(control)));
            }
            other => out.push(other),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical_of(text: &str) -> String {
        let value = parse(text.as_bytes()).unwrap();
        String::from_utf8(canonical(&value)).unwrap()
    }

    #[test]
    fn the_rfcs_worked_example() {
        // RFC 8785 §3.2.2: numbers, string escapes, literals, no whitespace.
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        assert_eq!(
            canonical_of(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn members_are_sorted_by_utf16_code_units() {
        // RFC 8785 §3.2.3: the emoji (a surrogate pair, 0xD83D…) sorts before
        // U+FB33, though its UTF-8 bytes (0xF0…) sort after.
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        assert_eq!(
            canonical_of(input),
            concat!(
                "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",",
                "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",",
                "\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
            )
        );
    }

    #[test]
    fn numbers_are_written_as_ecmascript_writes_them() {
        // RFC 8785 Appendix B, from the IEEE 754 bits.
        let cases: [(u64, &str); 14] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x41b3de4355555553, "333333333.3333332"),
        ];
        for (bits, expected) in cases {
            let value = serde_json::Number::from_f64(f64::from_bits(bits))
                .map(Value::Number)
                .unwrap();
            assert_eq!(
                String::from_utf8(canonical(&value)).unwrap(),
                expected,
                "bits {bits:#018x}"
            );
        }
        // Integers as the doubles they denote; 2^53 + 1 has none of its own.
        assert_eq!(
            canonical_of("[1, -7, 1.0, 100e-2, 9007199254740993, 1e21]"),
            "[1,-7,1,1,9007199254740992,1e+21]"
        );
    }

    #[test]
    fn numbers_are_parsed_to_the_nearest_double() {
        // serde_json's default parsing reads this one a unit off; the RFC's
        // example canonicalises it to 333333333.3333333.
        assert_eq!(
            canonical_of("[333333333.33333329, -0.0, 5e-324]"),
            "[333333333.3333333,0,5e-324]"
        );
        assert!(parse(b"[1E400]").is_err(), "no infinity in JSON");
        assert_eq!(parse(br#"{"a": 1, "a": 2}"#).unwrap(), serde_json::json!({"a": 2}));
        assert_eq!(
            parse(b" [ \"x\" , true , null ] ").unwrap(),
            serde_json::json!(["x", true, null])
        );
        assert!(parse(b"{").is_err() && parse(b"01").is_err() && parse(b"[1,]").is_err());
    }

    #[test]
    fn strings_escape_only_what_json_needs() {
        assert_eq!(
            canonical_of(r#""\u0000\u001f\u007f\u2028 é 😀 \/ \" \\""#),
            "\"\\u0000\\u001f\u{7f}\u{2028} é 😀 / \\\" \\\\\""
        );
        assert_eq!(
            canonical_of(r#"{"b": [], "a": {}, "c": "\t"}"#),
            r#"{"a":{},"b":[],"c":"\t"}"#
        );
    }
}
