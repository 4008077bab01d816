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
//!
//! The text is stored compressed ([`FIELD`], [`write_compressed`]): an LZ4
//! block behind the text's length (4 bytes, little-endian), a third of the
//! text's bytes for the records the router writes (their JSON names repeat,
//! each `prev_hash` repeats the line before's hash). Redis keeps a third of
//! the memory for the retention, and the bytes a segment crosses (the
//! store's command, the socket, Redis's read) are a third. Compressing is
//! the sealer's work, at idle priority with the rest of it. A segment
//! written before (field [`PLAIN_FIELD`]) reads as it was.

use std::cell::RefCell;
use std::io::Write;

use crate::chain::Sealed;
use crate::record::Stored;

/// The stream entry's field holding a segment's text compressed.
pub const FIELD: &str = "z";

/// The field of a segment stored as plain text (written before segments
/// were compressed; still read).
pub const PLAIN_FIELD: &str = "s";

/// LZ4's most text per compressed byte (a byte of a match's length stands
/// for at most 255 bytes of text): a stored length above what the block
/// could make is refused before anything is allocated for it.
const LZ4_MOST_PER_BYTE: usize = 255;

/// Scratch kept above this after a segment (one record with a large
/// payload) is given back rather than held by the thread for good.
const SCRATCH_KEPT: usize = 1 << 20;

/// The text of `records` (a batch's, in chain order).
pub fn encode(records: &[Sealed]) -> String {
    let mut text = String::with_capacity(encoded_len(records));
    write_parts(records, |part| text.push_str(part));
    text
}

/// The length of [`encode`]'s text for `records`.
fn encoded_len(records: &[Sealed]) -> usize {
    records
        .iter()
        .map(|sealed| decimal_len(sealed.seq) + sealed.stored.hash.len() + sealed.stored.body.len() + 3)
        .sum()
}

/// Hands [`encode`]'s text to `part` piece by piece, so that [`encode`] and
/// [`write_compressed`] each write it into their own buffer.
fn write_parts(records: &[Sealed], mut part: impl FnMut(&str)) {
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

/// Writes [`encode`]'s text for `records` compressed, as [`FIELD`] holds
/// it: the text's length (`u32`, little-endian), then the text as one LZ4
/// block. The text and the block are made in this thread's scratch (kept
/// between segments: a segment's buffers taken fresh each time are fresh
/// pages, zeroed), so a segment costs one copy of its compressed bytes, into
/// `out`.
pub fn write_compressed(records: &[Sealed], out: &mut impl Write) -> std::io::Result<()> {
    thread_local! {
        static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }
    SCRATCH.with_borrow_mut(|(text, block)| {
        let written = compress_in(records, text, block, out);
        if text.capacity() > SCRATCH_KEPT {
            *text = Vec::new();
            *block = Vec::new();
        }
        written
    })
}

fn compress_in(
    records: &[Sealed],
    text: &mut Vec<u8>,
    block: &mut Vec<u8>,
    out: &mut impl Write,
) -> std::io::Result<()> {
    text.clear();
    text.reserve(encoded_len(records));
    write_parts(records, |part| text.extend_from_slice(part.as_bytes()));
    let length = u32::try_from(text.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a segment of {} bytes is over the 4 GiB a stored segment can hold",
                text.len()
            ),
        )
    })?;
    let room = lz4_flex::block::get_maximum_output_size(text.len());
    if block.len() < room {
        block.resize(room, 0);
    }
    let written = lz4_flex::block::compress_into(text, block)
        .map_err(|error| std::io::Error::other(format!("compressing a segment: {error}")))?;
    out.write_all(&length.to_le_bytes())?;
    out.write_all(&block[..written])
}

/// The text of a segment stored as [`write_compressed`] wrote it. A value
/// that is not such a block (an edit of the stored bytes) is an error: its
/// records are then missing from the chain.
pub fn decompress(stored: &[u8]) -> Result<String, String> {
    let (length, block) = stored
        .split_first_chunk::<4>()
        .ok_or("a compressed segment shorter than its length")?;
    let length = u32::from_le_bytes(*length) as usize;
    if length > block.len().saturating_mul(LZ4_MOST_PER_BYTE) {
        return Err(format!(
            "a compressed segment of {} bytes says it holds {length}, more than LZ4 makes of it",
            block.len()
        ));
    }
    let mut text = vec![0; length];
    let made = lz4_flex::block::decompress_into(block, &mut text)
        .map_err(|error| format!("a compressed segment that does not decompress: {error}"))?;
    if made != length {
        return Err(format!(
            "a compressed segment says it holds {length} bytes and holds {made}"
        ));
    }
    String::from_utf8(text).map_err(|_| "a compressed segment whose text is not UTF-8".to_string())
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

    /// A chain's first `records` records, sealed as one segment, and that
    /// segment stored compressed.
    fn compressed(records: usize) -> (Vec<Sealed>, Vec<u8>) {
        let signer = TestSigner::new();
        let mut chain = Chain::new("r-a", "default");
        let batch = chain
            .seal((0..records).map(|n| entry(&format!("r-{n}"))), 1000, &signer)
            .unwrap();
        let mut stored = Vec::new();
        write_compressed(&batch.records, &mut stored).unwrap();
        (batch.records, stored)
    }

    #[test]
    fn a_compressed_segment_reads_back_as_its_text() {
        let (records, stored) = compressed(200);
        let text = encode(&records);
        assert_eq!(decompress(&stored).unwrap(), text);
        assert!(stored.len() * 2 < text.len(), "{} of {}", stored.len(), text.len());
        // The thread's scratch is reused: a smaller segment after it is its own.
        let mut again = Vec::new();
        write_compressed(&records[..3], &mut again).unwrap();
        assert_eq!(decompress(&again).unwrap(), encode(&records[..3]));
        let mut empty = Vec::new();
        write_compressed(&[], &mut empty).unwrap();
        assert_eq!(decompress(&empty).unwrap(), "");
    }

    #[test]
    fn stored_bytes_that_are_not_a_compressed_segment_are_refused_and_nothing_panics() {
        let (_, stored) = compressed(50);
        assert!(decompress(b"").unwrap_err().contains("shorter than its length"));
        assert!(decompress(&[1, 0]).is_err());
        // A length no block of this size can hold is refused before it is allocated.
        let mut huge = stored.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decompress(&huge).unwrap_err().contains("more than LZ4 makes"),
            "{:?}",
            decompress(&huge)
        );
        // A length that is not the block's.
        let mut short = stored.clone();
        let length = u32::from_le_bytes(stored[..4].try_into().unwrap());
        short[..4].copy_from_slice(&(length - 1).to_le_bytes());
        assert!(decompress(&short).is_err());
        let mut long = stored.clone();
        long[..4].copy_from_slice(&(length + 1).to_le_bytes());
        assert!(
            decompress(&long).unwrap_err().contains("holds"),
            "{:?}",
            decompress(&long)
        );
        // Every byte changed in turn, and cut anywhere: an error or some
        // text (whose lines then fail their hashes), never a panic.
        for at in 4..stored.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut changed = stored.clone();
                changed[at] ^= flip;
                let _ = decompress(&changed);
            }
            let _ = decompress(&stored[..at]);
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
