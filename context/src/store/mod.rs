//! The store behind the context service: Redis in production, an embedded
//! in-memory store with the same semantics for development (`agent-reach dev`).
//!
//! Every write is atomic in the store (a Lua script in Redis, one lock in
//! memory): the version check, the field changes, the per-context limits, the
//! version bump, the TTL refresh and the idle-deadline update happen together
//! or not at all. Both implementations are held to one contract test suite
//! (`tests/store_contract.rs`).

pub mod cluster;
pub mod memory;
pub mod redis;
pub mod resp;

pub use self::memory::MemoryStore;
pub use self::redis::{Namespace, RedisStore};

use crate::model::{CloseAs, NewContext, Patch, Selection, Snapshot, SweepReport, Written};

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("no such context")]
    NotFound,
    #[error("the context id is taken")]
    Exists,
    #[error("the context is at version {current}")]
    VersionConflict { current: u64 },
    #[error("the context would hold {would_have} fields (limit {limit})")]
    TooManyFields { limit: usize, would_have: usize },
    #[error("the context would hold {would_have} bytes (limit {limit})")]
    TooLarge { limit: usize, would_have: usize },
    #[error("the caller did not create this context")]
    NotOwner,
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store answered something unexpected: {0}")]
    Corrupt(String),
}

/// The operations the context service needs. Lifetimes and limits come from
/// the store's [`crate::model::StorePolicy`], fixed at construction.
#[async_trait::async_trait]
pub trait ContextStore: Send + Sync + 'static {
    /// Creates `id`; [`StoreError::Exists`] when it is live.
    async fn create(&self, id: &str, context: &NewContext) -> Result<Written, StoreError>;
    /// Reads `id` and counts as an access for the idle sweeper (the TTL is not refreshed:
    /// only writes extend a context's life). `None` when it does not exist.
    async fn get(&self, id: &str, selection: &Selection) -> Result<Option<Snapshot>, StoreError>;
    /// Applies `patch` atomically, bumping the version and refreshing the TTL.
    async fn patch(&self, id: &str, patch: &Patch) -> Result<Written, StoreError>;
    /// Deletes `id` at once.
    async fn close(&self, id: &str, who: &CloseAs) -> Result<(), StoreError>;
    /// Removes contexts idle past the policy's timeout (and index entries of expired ones).
    /// Safe to run from several replicas at once: each removal happens exactly once.
    async fn sweep(&self) -> Result<SweepReport, StoreError>;
    /// Contexts alive now (neither expired nor idle past their deadline).
    async fn live_contexts(&self) -> Result<u64, StoreError>;
    /// Answers when the store is reachable.
    async fn ping(&self) -> Result<(), StoreError>;
}
