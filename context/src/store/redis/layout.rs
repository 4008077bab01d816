//! The key layout (DESIGN §4.7): the buckets, their hash tags and slots, a
//! tenant's namespace, a context's key.

use std::sync::OnceLock;

use agent_reach_stores::slot::{crc16, key_slot, spread_tag};

use super::RedisStore;

/// Buckets per tenant (a context's is CRC16 of its id, modulo this). Part of
/// the key layout: every bucket is one slot of a cluster.
pub const BUCKETS: usize = 256;

/// The buckets' hash tags (without braces) and their slots, computed once.
pub(super) fn buckets() -> &'static [(String, u16)] {
    static BUCKET_TAGS: OnceLock<Vec<(String, u16)>> = OnceLock::new();
    BUCKET_TAGS.get_or_init(|| {
        (0..BUCKETS)
            .map(|bucket| {
                let tag = spread_tag("c", bucket, BUCKETS);
                let slot = key_slot(tag.as_bytes());
                (tag, slot)
            })
            .collect()
    })
}

/// The bucket of a context id.
pub fn bucket_of(context_id: &str) -> usize {
    usize::from(crc16(context_id.as_bytes())) % BUCKETS
}

/// Where a tenant's keys live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub prefix: String,
    pub tenant: String,
}

impl Namespace {
    /// The key of context `id`'s hash (DESIGN §4.7).
    pub fn context_key(&self, id: &str) -> String {
        format!("{}{id}", self.context_prefix(bucket_of(id)))
    }

    /// The key of the deadline set context `id` is in (its bucket's).
    pub fn deadlines_key(&self, id: &str) -> String {
        self.deadlines(bucket_of(id))
    }

    /// What the keys of the contexts in `bucket` start with.
    pub(super) fn context_prefix(&self, bucket: usize) -> String {
        format!(
            "{}:{}:ctx:{{{}}}:",
            self.prefix,
            self.tenant,
            buckets()[bucket % BUCKETS].0
        )
    }

    /// The deadline set of `bucket`.
    pub(super) fn deadlines(&self, bucket: usize) -> String {
        format!(
            "{}:{}:deadlines:{{{}}}",
            self.prefix,
            self.tenant,
            buckets()[bucket % BUCKETS].0
        )
    }
}

impl RedisStore {
    pub(super) fn key(&self, bucket: usize, id: &str) -> String {
        let prefix = &self.context_prefixes[bucket];
        let mut key = String::with_capacity(prefix.len() + id.len());
        key.push_str(prefix);
        key.push_str(id);
        key
    }
}
