//! The request ids the router generates (design §3.13, "Redis layout"): the
//! epoch milliseconds of the call's arrival as 12 lowercase hex digits, then
//! 16 random ones (64 bits, as unique as the 16-digit ids before them).
//!
//! The time in front lets the trail find a request's records without a
//! per-request index write: they were written by a chain in the buckets of
//! that time ([`bucket_of`]). Callers may choose their own request ids; an
//! id of another shape (or whose time is not plausible for the record, see
//! [`time_of`]) is indexed by request id as any other string.

/// The length of a generated request id.
pub const LEN: usize = 28;

/// Hex digits of the time in front.
const TIME_DIGITS: usize = 12;

/// The width of a request-id bucket of the trail's index (ms).
pub const BUCKET_MS: u64 = 1_000;

/// The time a generated-shape request id says it was made (epoch ms): for
/// exactly [`LEN`] lowercase hex digits, the first 12 read as a number.
/// Any string of that shape reads as some time, which is why the trail
/// also checks the time is plausible for the record before trusting it.
pub fn time_of(request_id: &str) -> Option<u64> {
    let bytes = request_id.as_bytes();
    if bytes.len() != LEN || !bytes.iter().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(&request_id[..TIME_DIGITS], 16).ok()
}

/// The bucket (its start, epoch ms) a generated-shape request id's records
/// are listed under.
pub fn bucket_of(request_id: &str) -> Option<u64> {
    time_of(request_id).map(|ms| ms / BUCKET_MS * BUCKET_MS)
}

/// Writes `ms` as the 12 hex digits a generated request id starts with.
pub fn write_time(ms: u64, digits: &mut [u8; TIME_DIGITS]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (index, digit) in digits.iter_mut().enumerate() {
        let shift = 4 * (TIME_DIGITS - 1 - index);
        *digit = DIGITS[((ms >> shift) & 0x0f) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_shape_reads_as_its_time_and_nothing_else_does() {
        let mut time = [0_u8; 12];
        write_time(1_765_000_123_456, &mut time);
        let id = format!("{}0123456789abcdef", std::str::from_utf8(&time).unwrap());
        assert_eq!(id.len(), LEN);
        assert_eq!(time_of(&id), Some(1_765_000_123_456));
        assert_eq!(bucket_of(&id), Some(1_765_000_123_000));
        // Another length, uppercase, or not hex: no time.
        assert_eq!(time_of("7f3a2c1e9b"), None);
        assert_eq!(time_of(&id.to_uppercase()), None);
        assert_eq!(time_of(&format!("{}x", &id[..LEN - 1])), None);
        assert_eq!(time_of(&format!("{id}0")), None);
        assert_eq!(time_of(""), None);
    }
}
