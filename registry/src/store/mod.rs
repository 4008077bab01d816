//! The key-value store behind the registry: etcd in production, an embedded
//! in-memory store with the same lease and watch semantics for development.
//!
//! The trait is deliberately etcd-shaped (leases, revisions, transactions,
//! watches from a revision) so both implementations can be held to one
//! contract test suite (`tests/store_contract.rs`).

use std::pin::Pin;

use futures::Stream;

pub mod etcd;
pub mod memory;

pub use self::etcd::EtcdStore;
pub use self::memory::MemoryStore;

pub type LeaseId = i64;
pub type Revision = i64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub lease: LeaseId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(KeyValue),
    Delete { key: String, mod_revision: Revision },
}

impl Event {
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { mod_revision, .. } => *mod_revision,
        }
    }
}

/// Events in revision order; `revision` is the highest revision they cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    pub revision: Revision,
    pub events: Vec<Event>,
}

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchBatch, StoreError>> + Send>>;

/// A guard on a transaction, checked atomically with its writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The key's mod revision equals this; 0 means "the key does not exist".
    ModRevision { key: String, revision: Revision },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    pub key: String,
    pub value: Vec<u8>,
    /// Attach to this lease; 0 for none.
    pub lease: LeaseId,
}

/// What the store knows of a live lease: the TTL it was granted and the
/// whole seconds left before it expires (etcd's `LeaseTimeToLive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTtl {
    pub granted_s: i64,
    pub remaining_s: i64,
}

impl LeaseTtl {
    /// Whole seconds since the lease was last renewed (granted or kept
    /// alive). etcd counts the remaining time in whole seconds, rounded
    /// down, so this errs by under a second towards older; after an etcd
    /// leader change the new leader extends every lease, which reads as 0.
    pub fn age_s(&self) -> i64 {
        (self.granted_s - self.remaining_s).max(0)
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("lease {0} not found (expired or revoked)")]
    LeaseNotFound(LeaseId),
    #[error("revision {requested} is compacted (oldest available: {compact_revision})")]
    Compacted {
        requested: Revision,
        compact_revision: Revision,
    },
    #[error("a transaction condition failed (concurrent change)")]
    Conflict,
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// The operations the registry needs. Every write is one atomic transaction.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// A new lease that expires `ttl_s` seconds after the last keep-alive.
    async fn grant_lease(&self, ttl_s: i64) -> Result<LeaseId, StoreError>;
    /// Ends the lease and deletes its keys now; returns the revision of the deletion.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<Revision, StoreError>;
    /// Refreshes the lease; returns its TTL in seconds.
    async fn keep_alive(&self, lease: LeaseId) -> Result<i64, StoreError>;
    /// The lease's granted TTL and time left; `None` when it is gone
    /// (expired, revoked, or never granted). An operator read, never on a
    /// hot path: one round trip per lease.
    async fn lease_ttl(&self, lease: LeaseId) -> Result<Option<LeaseTtl>, StoreError>;
    /// Applies `puts` and `deletes` atomically if every condition holds
    /// ([`StoreError::Conflict`] otherwise); returns the new revision.
    async fn txn(
        &self,
        conditions: Vec<Condition>,
        puts: Vec<Put>,
        deletes: Vec<String>,
    ) -> Result<Revision, StoreError>;
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;
    /// Every key under `prefix`, and the revision the listing reflects.
    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), StoreError>;
    /// Events under `prefix` from `start_revision` (inclusive), in order.
    /// [`StoreError::Compacted`] when that history is gone.
    async fn watch(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream, StoreError>;
    /// Drops history before `revision` (watches from earlier revisions fail).
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;
    /// Answers when the store is reachable.
    async fn ping(&self) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::LeaseTtl;

    #[test]
    fn a_lease_extended_past_its_ttl_reads_as_just_renewed() {
        let fresh = LeaseTtl {
            granted_s: 10,
            remaining_s: 9,
        };
        assert_eq!(fresh.age_s(), 1);
        // A new etcd leader extends every lease by an election timeout.
        let extended = LeaseTtl {
            granted_s: 10,
            remaining_s: 11,
        };
        assert_eq!(extended.age_s(), 0);
    }
}
