//! A segment as one stored text: the store keeps a sealed batch as one
//! entry instead of one entry (and an index write) per record, so a
//! record costs the store a few bytes of a larger write (`router-bench
//! --trail`: per-record entries and index keys were most of the trail's
//! cost). One line per record, in chain order:
//!
//! ```text
//! {seq} {hash} {body}\n
//! ```
//!
//! The body is compact JSON (never a raw newline: JSON escapes control
//! characters in strings), the hash its lowercase hex SHA-256. A record's id
//! is `{ms}-{seq}`, `ms` the segment's (every record of a segment shares
//! it); the segment's own id is its last record's.

use crate::chain::Sealed;
use crate::record::Stored;

/// The text of `records` (a batch's, in chain order).
pub fn encode(records: &[Sealed]) -> String {
    let mut text = String::with_capacity(encoded_len(records));
    write_parts(records, |part| text.push_str(part));
    text
}

/// The length of [`encode`]'s text for `records`.
pub fn encoded_len(records: &[Sealed]) -> usize {
    records
        .iter()
        .map(|sealed| decimal_len(sealed.seq) + sealed.stored.hash.len() + sealed.stored.body.len() + 3)
        .sum()
}

/// Hands [`encode`]'s text to `part` piece by piece: a store writes it
/// straight into its command this way, with no text of its own.
pub fn write_parts(records: &[Sealed], mut part: impl FnMut(&str)) {
    let mut seq = String::with_capacity(20);
    for sealed in records {
        seq.clear();
        crate::record::push_decimal(&mut seq, sealed.seq);
        part(&seq);
        part(" ");
        part(&sealed.stored.hash);
        part(" ");
        part(&sealed.stored.body);
        part("\n");
    }
}

fn decimal_len(mut value: u64) -> usize {
    let mut digits = 1;
    while value >= 10 {
        value /= 10;
        digits += 1;
    }
    digits
}

/// The records of a segment stored with id `segment_id` (`{ms}-{last seq}`).
/// A line that is not `{seq} {hash} {body}` (an edit of the stored text)
/// is left out: the chain then shows a missing record where it was.
pub fn decode(segment_id: &str, text: &str) -> Vec<Stored> {
    let ms = segment_id.split_once('-').map_or(segment_id, |(ms, _)| ms);
    text.lines()
        .filter_map(|line| {
            let (seq, rest) = line.split_once(' ')?;
            let (hash, body) = rest.split_once(' ')?;
            let seq: u64 = seq.parse().ok()?;
            Some(Stored {
                id: format!("{ms}-{seq}"),
                body: body.to_string(),
                hash: hash.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::tests::{entry, TestSigner};
    use crate::chain::Chain;

    #[test]
    fn a_segment_reads_back_as_its_records() {
        let signer = TestSigner::new();
        let mut chain = Chain::new("r-a", "default");
        let mut with_newline = entry("b");
        with_newline.input = Some(serde_json::json!({"text": "two\nlines", "tab": "\t"}));
        let batch = chain
            .seal([entry("a"), with_newline, entry("c")], 1000, &signer)
            .unwrap();
        let text = encode(&batch.records);
        assert_eq!(text.lines().count(), 3, "{text}");
        let read = decode(&batch.segment_id(), &text);
        let written: Vec<&Stored> = batch.records.iter().map(|sealed| &sealed.stored).collect();
        assert_eq!(read.iter().collect::<Vec<_>>(), written);
        assert_eq!(batch.segment_id(), "1000-3");
        assert_eq!(encoded_len(&batch.records), text.len());
        for seq in [0, 9, 10, 99, 100, u64::MAX] {
            let mut one = batch.records[..1].to_vec();
            one[0].seq = seq;
            assert_eq!(encoded_len(&one), encode(&one).len(), "seq {seq}");
        }
    }

    #[test]
    fn an_unreadable_line_is_left_out() {
        let text = "1 aa {\"seq\":1}\nnot a record\n3 cc {\"seq\":3}\n";
        let read = decode("5-3", text);
        assert_eq!(
            read.iter().map(|stored| stored.id.as_str()).collect::<Vec<_>>(),
            ["5-1", "5-3"]
        );
        assert_eq!(read[1].body, "{\"seq\":3}");
    }
}
