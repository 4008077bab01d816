//! Outcome histories merged across router replicas (issue 38, point 1),
//! off the request path: every "minute" (a 60th of a bucket) a router sends
//! the counts it drained since its last exchange to a [`HistoryLedger`] (the
//! task store's Redis, with `--redis`), which adds them to every router's
//! totals per slot and bucket, and reads back the totals of the buckets it
//! sent, of this bucket and the one before (the whole week the first time
//! it sees a slot). Each bucket's counts become the every-router total plus
//! what this router drained since it sent. An exchange that fails keeps its
//! counts for the next one (at most a week of buckets per slot), and the
//! router goes on learning from what it has.
//!
//! Without a ledger each router learns from its own calls only.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Clock, Counts};
use crate::clock;
use crate::service::RouterService;

/// One slot's part of an exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotExchange {
    pub capability: String,
    pub version: String,
    pub agent_id: String,
    /// Counts to add, by bucket number.
    pub adds: Vec<(u64, Counts)>,
    /// Read back every bucket kept (the slot's first exchange).
    pub read_all: bool,
    /// Otherwise, the buckets to read back.
    pub read: Vec<u64>,
}

/// Every router's totals of one slot's buckets: `(bucket number, counts)`.
pub type SlotTotals = Vec<(u64, Counts)>;

/// Where routers merge their outcome histories: one call an exchange, off
/// the request path. The task store implements it on Redis.
pub trait HistoryLedger: Send + Sync + 'static {
    /// Adds every slot's `adds` to the totals of buckets of `bucket_ms`
    /// (dropping buckets before `oldest`), and answers, for each slot in
    /// order, the totals of the buckets it asked to read.
    fn exchange<'a>(
        &'a self,
        bucket_ms: u64,
        oldest: u64,
        slots: &'a [SlotExchange],
    ) -> BoxFuture<'a, Result<Vec<SlotTotals>, String>>;
}

/// Exchanges `service`'s histories through `ledger` every recent window until the service is dropped.
pub(crate) async fn run(service: Weak<RouterService>, ledger: Arc<dyn HistoryLedger>, history_clock: Clock) {
    let every = Duration::from_millis(history_clock.recent_ms());
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticker.tick().await;
        let Some(service) = service.upgrade() else {
            return;
        };
        let snapshot = service.snapshot().load_full();
        let bucket = history_clock.bucket(clock::epoch_ms());
        let oldest = history_clock.oldest(bucket);
        let mut slots = Vec::new();
        let mut histories = Vec::new();
        for capability in snapshot.capabilities.values() {
            for group in &capability.versions {
                for (instance, history) in group.instances.iter().zip(&group.histories) {
                    let (adds, read_all) = history.take_unsent(oldest);
                    let mut read: Vec<u64> = adds.iter().map(|(number, _)| *number).collect();
                    read.extend([bucket.saturating_sub(1), bucket]);
                    read.sort_unstable();
                    read.dedup();
                    slots.push(SlotExchange {
                        capability: capability.name.clone(),
                        version: group.version_text.clone(),
                        agent_id: instance.agent_id.clone(),
                        adds,
                        read_all,
                        read,
                    });
                    histories.push(history.clone());
                }
            }
        }
        if slots.is_empty() {
            continue;
        }
        let answer = tokio::time::timeout(
            every.max(Duration::from_secs(1)),
            ledger.exchange(history_clock.bucket_ms, oldest, &slots),
        )
        .await;
        match answer {
            Ok(Ok(totals)) if totals.len() == slots.len() => {
                if failing {
                    tracing::info!(
                        message = "Outcome histories exchanged again; routers learn from each other's calls."
                    );
                    failing = false;
                }
                for ((history, slot), totals) in histories.iter().zip(&slots).zip(&totals) {
                    history.apply_totals(totals, oldest, slot.read_all);
                }
            }
            failure => {
                for (history, slot) in histories.iter().zip(slots) {
                    history.restore_unsent(slot.adds);
                }
                if !failing {
                    let why = match failure {
                        Ok(Ok(totals)) => format!("{} answers for {} slots", totals.len(), histories.len()),
                        Ok(Err(why)) => why,
                        Err(_) => format!("no answer within {} ms", every.max(Duration::from_secs(1)).as_millis()),
                    };
                    tracing::warn!(
                        message = "Outcome histories not exchanged; this router learns from its own calls meanwhile.",
                        problem = %why
                    );
                    failing = true;
                }
            }
        }
    }
}
