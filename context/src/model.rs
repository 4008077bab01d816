//! Plain types of the context service, free of any transport or store.

use std::collections::BTreeMap;
use std::time::Duration;

/// How long a context lives after its last write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// A conversation's context (30 min by default).
    Default,
    /// Short hand-offs (5 min by default), so short tasks do not leave data behind.
    OneShot,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::Default, Tier::OneShot];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Default => "default",
            Tier::OneShot => "one_shot",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Tier::ALL.into_iter().find(|tier| tier.as_str() == text)
    }
}

/// Field name -> the value's compact JSON text. The text is what the store
/// keeps and what the byte limits measure; it is never empty (the shortest
/// JSON value is one byte), which the Redis scripts rely on.
pub type Fields = BTreeMap<String, String>;

/// What a create writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewContext {
    pub tier: Tier,
    /// The creating agent (empty when authentication is off); it may close the context.
    pub owner: String,
    pub fields: Fields,
}

/// An incremental write: set some fields, delete others, optionally conditional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    pub set: Fields,
    /// Names to delete; never also in `set`, no duplicates (checked before the store).
    pub delete: Vec<String>,
    pub if_version: Option<u64>,
}

/// Which fields a read fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    All,
    /// These names only (possibly none: metadata only).
    Only(Vec<String>),
}

/// A context as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub version: u64,
    pub tier: Tier,
    pub owner: String,
    /// Epoch milliseconds.
    pub expires_at_ms: i64,
    pub fields: Fields,
}

/// The result of a create or patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub version: u64,
    pub expires_at_ms: i64,
}

/// Who may close a context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseAs {
    /// Anyone (authentication off, or a `write: ["*"]` agent).
    Anyone,
    /// Only the context's creator.
    Owner(String),
}

/// Lifetimes and limits the store applies atomically with each write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorePolicy {
    pub default_ttl: Duration,
    pub one_shot_ttl: Duration,
    /// A context with no read or write for this long is removed by the sweeper.
    pub idle_timeout: Duration,
    pub max_fields: usize,
    /// Sum of name and value bytes over all fields.
    pub max_context_bytes: usize,
}

impl StorePolicy {
    pub fn ttl(&self, tier: Tier) -> Duration {
        match tier {
            Tier::Default => self.default_ttl,
            Tier::OneShot => self.one_shot_ttl,
        }
    }

    /// How close together writes share one TTL refresh: a write less than this
    /// after the last refresh leaves the expiry and the idle deadline as they
    /// are (a hundredth of the tier's TTL, at most 1 s). So every write extends
    /// life to at least `now + TTL - granularity`, and a burst of writes to one
    /// context costs Redis one PEXPIRE and one ZADD instead of one each (the
    /// Redis patch script applies the same rule).
    pub fn refresh_granularity(&self, tier: Tier) -> Duration {
        (self.ttl(tier) / 100).min(Duration::from_secs(1))
    }

    /// How long after a write (create, or a patch that refreshes) a context
    /// is left alone before the sweeper may remove it: the idle timeout, or
    /// the tier's TTL if that ends first.
    pub fn idle_deadline_after_write(&self, tier: Tier) -> Duration {
        self.ttl(tier).min(self.idle_timeout)
    }
}

impl Default for StorePolicy {
    fn default() -> Self {
        Self {
            default_ttl: Duration::from_secs(30 * 60),
            one_shot_ttl: Duration::from_secs(5 * 60),
            idle_timeout: Duration::from_secs(10 * 60),
            max_fields: 64,
            max_context_bytes: 256 * 1024,
        }
    }
}

/// What one sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Contexts deleted because nobody read or wrote them for the idle timeout.
    pub idle: u64,
    /// Index entries of contexts their TTL had already removed.
    pub expired: u64,
}

/// Bytes a field costs against the per-context limit.
pub fn field_cost(name: &str, value: &str) -> usize {
    name.len() + value.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_round_trip() {
        for tier in Tier::ALL {
            assert_eq!(Tier::parse(tier.as_str()), Some(tier));
        }
        assert_eq!(Tier::parse("forever"), None);
        let policy = StorePolicy::default();
        assert_eq!(policy.ttl(Tier::Default), Duration::from_secs(1800));
        assert_eq!(policy.ttl(Tier::OneShot), Duration::from_secs(300));
    }
}
