//! The slow path's store as the trail's store (`agent_reach_trail`, issue
//! 37): a tenant's records are kept in its Redis beside its tasks (the
//! layout is the task store's `trail` module).

use std::sync::Arc;
use std::time::Duration;

use agent_reach_trail::{Batch, ChainInfo, Index, Stored, StoredHead, TrailStore};

use crate::TaskService;

/// A new chain's name (`r` and 12 hex digits): each slow path started (a
/// router's start, per tenant) begins its own chain instead of continuing an
/// old one, and two routers in one process (tests, `agent-reach dev`) never
/// share one.
pub fn new_chain_id() -> String {
    format!("r{:012x}", rand::random::<u64>() >> 16)
}

/// The slow path's store, keeping the trail (shared with the writer task).
pub(crate) struct StoreTrail(pub(crate) Arc<TaskService>);

#[async_trait::async_trait]
impl TrailStore for StoreTrail {
    async fn append(&self, batch: &Batch, retention: Duration) -> Result<(), String> {
        self.0.store.append(batch, retention).await
    }

    async fn chains(&self) -> Result<Vec<ChainInfo>, String> {
        self.0.store.chains().await
    }

    async fn records_of(&self, index: &Index, limit: usize) -> Result<Vec<Stored>, String> {
        self.0.store.records_of(index, limit).await
    }

    async fn chain_records(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<Stored>, String> {
        self.0.store.chain_records(router, after, limit).await
    }

    async fn chain_heads(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<StoredHead>, String> {
        self.0.store.chain_heads(router, after, limit).await
    }

    async fn chain_records_since(&self, router: &str, since_ms: u64, limit: usize) -> Result<Vec<Stored>, String> {
        self.0.store.chain_records_since(router, since_ms, limit).await
    }

    async fn recent_with_input(&self, capability: &str, limit: usize) -> Result<Vec<Stored>, String> {
        self.0.store.recent_with_input(capability, limit).await
    }
}
