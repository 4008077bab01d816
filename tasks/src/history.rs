//! The task store as the routers' history ledger: where replicas on one
//! Redis merge their outcome histories (`agent_reach_pipeline`'s
//! `HistoryLedger`; the layout is the store's `history` module).

use std::sync::Arc;
use std::time::Duration;

use agent_reach_pipeline::{HistoryCounts, HistoryLedger, SlotExchange, SlotTotals};
use agent_reach_task_store::HistorySlot;
use futures::future::BoxFuture;

use crate::TaskService;

/// A slot's hash lives a week and a day after its last write (in buckets).
const KEPT_BUCKETS: u64 = 8 * 24;

/// The slow path's store, merging outcome histories.
pub(crate) struct StoreHistory(pub(crate) Arc<TaskService>);

impl HistoryLedger for StoreHistory {
    fn exchange<'a>(
        &'a self,
        bucket_ms: u64,
        oldest: u64,
        slots: &'a [SlotExchange],
    ) -> BoxFuture<'a, Result<Vec<SlotTotals>, String>> {
        Box::pin(async move {
            let sent: Vec<HistorySlot> = slots
                .iter()
                .map(|slot| HistorySlot {
                    name: format!("{}@{}:{}", slot.capability, slot.version, slot.agent_id),
                    adds: slot
                        .adds
                        .iter()
                        .map(|(bucket, counts)| (*bucket, counts.words.to_vec()))
                        .collect(),
                    read_all: slot.read_all,
                    read: slot.read.clone(),
                })
                .collect();
            let ttl = Duration::from_millis(bucket_ms.saturating_mul(KEPT_BUCKETS));
            let totals = self
                .0
                .store
                .exchange_history(bucket_ms, oldest, ttl, &sent)
                .await
                .map_err(|error| error.to_string())?;
            Ok(totals
                .into_iter()
                .map(|buckets| {
                    buckets
                        .into_iter()
                        .map(|(bucket, words)| {
                            let mut counts = HistoryCounts::default();
                            // A shorter list (a router with fewer counters) leaves the rest at 0.
                            for (into, from) in counts.words.iter_mut().zip(words) {
                                *into = from;
                            }
                            (bucket, counts)
                        })
                        .collect()
                })
                .collect())
        })
    }
}
