//! The slow path's store as the trail's store (`agent_reach_trail`, issue
//! 37): a tenant's records are kept in its Redis beside its tasks (the
//! layout is the task store's `trail` module).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_reach_trail::{Batch, ChainInfo, Index, Stored, StoredHead, TrailStore};

use crate::TaskService;

/// This process's chains' name: one per start (`r` and 12 hex digits), so
/// a restarted router begins new chains instead of continuing old ones.
pub fn router_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| format!("r{:012x}", rand::random::<u64>() >> 16))
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

    async fn recent_with_input(&self, capability: &str, limit: usize) -> Result<Vec<Stored>, String> {
        self.0.store.recent_with_input(capability, limit).await
    }
}
