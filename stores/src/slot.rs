//! Redis Cluster's key slots (DESIGN §7.8): the slot of a key is CRC16
//! (XMODEM) of its hash tag, the part between the first `{` and the next `}`
//! when that part is not empty, else of the whole key, modulo 16384.
//!
//! The stores put every key a script or pipeline touches under one tag, so
//! each multi-key write is one slot by design; [`spread_tag`] picks tags whose
//! slots are spaced evenly over the slot space, so a fixed set of groups
//! (the task store's lanes, the context store's buckets) lands on the shards
//! of a cluster in proportion to the slots each serves. Single Redis and
//! Sentinel deployments ignore tags: the layout is the same everywhere.

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster uses it.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc = (crc << 8) ^ TABLE[usize::from(((crc >> 8) as u8) ^ byte)];
    }
    crc
}

const TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut index = 0;
    while index < 256 {
        let mut crc = (index as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[index] = crc;
        index += 1;
    }
    table
};

/// The part of `key` that decides its slot: the hash tag, or the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&byte| byte == b'{') {
        if let Some(length) = key[open + 1..].iter().position(|&byte| byte == b'}') {
            if length > 0 {
                return &key[open + 1..open + 1 + length];
            }
        }
    }
    key
}

/// The slot Redis Cluster keeps `key` in.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

/// A hash tag (without its braces) for group `index` of `groups`: the first
/// `{kind}{n}`, n = 0, 1, 2, …, whose slot lies in the `index`-th of
/// `groups` equal ranges of the slot space. The groups' slots are then
/// spread evenly, so a cluster whose primaries serve contiguous slot ranges
/// (what `redis-cli --cluster create` makes) holds groups in proportion to
/// its slots. Deterministic: every process and version derives the same tags,
/// which are part of the stores' key layout (`groups` at most 16384).
pub fn spread_tag(kind: &str, index: usize, groups: usize) -> String {
    let groups = groups.clamp(1, usize::from(SLOTS));
    let index = index % groups;
    let width = usize::from(SLOTS) / groups;
    let low = index * width;
    let high = if index + 1 == groups {
        usize::from(SLOTS)
    } else {
        low + width
    };
    // Each candidate lands in the range with probability width / 16384, so
    // the search ends after about 16384 / width candidates; it always ends
    // (CRC16 of the decimal numbers covers every slot).
    (0u64..)
        .map(|n| format!("{kind}{n}"))
        .find(|tag| (low..high).contains(&usize::from(key_slot(tag.as_bytes()))))
        .unwrap_or_else(|| format!("{kind}{index}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // The check value of CRC16/XMODEM, and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            crc16(b"foo{}{bar}") % SLOTS,
            "an empty tag is no tag"
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(hash_tag(b"a:{q3}:b{c}"), b"q3");
    }

    #[test]
    fn spread_tags_fall_in_their_ranges_and_are_stable() {
        for groups in [16usize, 256] {
            let width = 16384 / groups;
            for index in 0..groups {
                let tag = spread_tag("x", index, groups);
                let slot = usize::from(key_slot(tag.as_bytes()));
                assert!((index * width..(index + 1) * width).contains(&slot), "{tag}: {slot}");
            }
        }
        // Part of the key layout: a change here moves every stored key.
        let lanes: Vec<String> = (0..4).map(|lane| spread_tag("q", lane, 16)).collect();
        assert_eq!(lanes, LANE_TAGS_PINNED.map(str::to_string));
    }

    /// The first task lanes' tags (the task store's layout, DESIGN §3.10.9).
    const LANE_TAGS_PINNED: [&str; 4] = ["q41", "q63", "q23", "q0"];
}
