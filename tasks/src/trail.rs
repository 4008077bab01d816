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

/// The slow path's store, keeping the trail (shared with the writer task);
/// with `logs`, a written batch is also exported as OTLP logs.
pub(crate) struct StoreTrail {
    pub(crate) service: Arc<TaskService>,
    pub(crate) logs: Option<Arc<TrailLogs>>,
}

#[async_trait::async_trait]
impl TrailStore for StoreTrail {
    async fn append(&self, batch: &Batch, retention: Duration) -> Result<(), String> {
        self.service.store.append(batch, retention).await?;
        if let Some(logs) = &self.logs {
            logs.export(batch);
        }
        Ok(())
    }

    async fn chains(&self) -> Result<Vec<ChainInfo>, String> {
        self.service.store.chains().await
    }

    async fn records_of(&self, index: &Index, limit: usize) -> Result<Vec<Stored>, String> {
        self.service.store.records_of(index, limit).await
    }

    async fn chain_records(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<Stored>, String> {
        self.service.store.chain_records(router, after, limit).await
    }

    async fn chain_heads(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<StoredHead>, String> {
        self.service.store.chain_heads(router, after, limit).await
    }

    async fn chain_records_since(&self, router: &str, since_ms: u64, limit: usize) -> Result<Vec<Stored>, String> {
        self.service.store.chain_records_since(router, since_ms, limit).await
    }

    async fn recent_with_input(&self, capability: &str, limit: usize) -> Result<Vec<Stored>, String> {
        self.service.store.recent_with_input(capability, limit).await
    }
}

/// Exports at once at most this many segments; a segment written while as
/// many exports wait is not exported (and counted).
const EXPORTS_IN_FLIGHT: usize = 4;

/// The trail's records copied to an OTLP/gRPC collector as log records, one
/// `Export` call per written segment, off the writer's way (it does not wait
/// for the collector). Redis stays the store of record: a failed export is
/// counted (`agent_reach_trail_otlp_failures_total`) and logged, not retried.
pub(crate) struct TrailLogs {
    exporter: agent_reach_telemetry::otlp_logs::LogExporter,
    in_flight: Arc<tokio::sync::Semaphore>,
    metrics: agent_reach_trail::TrailMetrics,
}

impl TrailLogs {
    /// An exporter to `otlp`'s collector (connected on first use).
    pub(crate) fn start(
        otlp: &crate::TrailOtlp,
        chain: &str,
        tenant: &str,
        metrics: &agent_reach_trail::TrailMetrics,
    ) -> anyhow::Result<Arc<Self>> {
        let exporter = agent_reach_telemetry::otlp_logs::LogExporter::new(
            &otlp.endpoint,
            &otlp.headers,
            Duration::from_secs(10),
            "agent-reach-router",
            &[
                ("agent_reach.tenant", tenant.to_string()),
                ("agent_reach.trail.chain", chain.to_string()),
            ],
        )?;
        Ok(Arc::new(Self {
            exporter,
            in_flight: Arc::new(tokio::sync::Semaphore::new(EXPORTS_IN_FLIGHT)),
            metrics: metrics.clone(),
        }))
    }

    /// Exports `batch`'s records in the background.
    fn export(&self, batch: &Batch) {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.metrics.otlp_failures.inc_by(batch.records.len() as u64);
            tracing::warn!(
                message = "The OTLP collector is slower than the trail; a segment was not exported.",
                records = batch.records.len()
            );
            return;
        };
        let lines = batch.records.iter().map(|sealed| log_line(&sealed.stored)).collect();
        let count = batch.records.len() as u64;
        let exporter = self.exporter.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            match exporter.export(lines).await {
                Ok(()) => metrics.otlp_exported.inc_by(count),
                Err(error) => {
                    metrics.otlp_failures.inc_by(count);
                    tracing::warn!(message = "Cannot export trail records as OTLP logs (they are kept in Redis).", %error, records = count);
                }
            }
            drop(permit);
        });
    }
}

/// A stored record as a log line: its body as the body, what a log search
/// filters on as attributes.
fn log_line(stored: &Stored) -> agent_reach_telemetry::otlp_logs::LogLine {
    let record = agent_reach_trail::Record::read(stored).unwrap_or_default();
    let mut attributes = vec![
        ("agent_reach.request_id", record.request_id),
        ("agent_reach.capability", record.capability),
        ("agent_reach.caller", record.caller),
        ("agent_reach.door", record.door),
        ("agent_reach.status", record.status.clone()),
        ("agent_reach.trail.seq", record.seq.to_string()),
        ("agent_reach.trail.hash", stored.hash.clone()),
    ];
    let optional = [
        ("agent_reach.capability_version", record.capability_version),
        ("agent_reach.code", record.code),
        ("agent_reach.session_id", record.session_id),
        ("agent_reach.run_id", record.run_id),
        ("agent_reach.task_id", record.task_id),
    ];
    attributes.extend(
        optional
            .into_iter()
            .filter_map(|(key, value)| value.map(|value| (key, value))),
    );
    agent_reach_telemetry::otlp_logs::LogLine {
        time_ms: record.at_ms,
        failed: record.status == "failed",
        body: stored.body.clone(),
        trace_id: record.trace_id,
        attributes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_reach_trail::{Chain, Entry, HeadClaims, HeadSigner};

    struct FixedSigner;

    impl HeadSigner for FixedSigner {
        fn sign(&self, _claims: &HeadClaims) -> Result<String, String> {
            Ok("signature".to_string())
        }
        fn issuer(&self) -> &str {
            "agent-reach-router"
        }
    }

    fn batch(chain: &mut Chain, records: usize) -> Batch {
        let entries = (0..records).map(|index| Entry {
            request_id: format!("req-{index}").into(),
            ..Entry::default()
        });
        chain.seal(entries, 1_700_000_000_000, &FixedSigner).unwrap()
    }

    /// A collector that takes connections and never answers holds every
    /// export in flight: past `EXPORTS_IN_FLIGHT` a segment is skipped at
    /// once and its records counted as failures (the writer never waits);
    /// once the collector goes away the exports end and free their places.
    #[tokio::test]
    async fn a_segment_past_the_exports_in_flight_is_skipped_and_counted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (close, closed) = tokio::sync::oneshot::channel::<()>();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            tokio::select! {
                _ = closed => {}
                _ = async {
                    while let Ok((socket, _)) = listener.accept().await {
                        held.push(socket);
                    }
                } => {}
            }
        });
        let registry = prometheus::Registry::new();
        let metrics = agent_reach_trail::TrailMetrics::new(&registry).unwrap();
        let otlp = crate::TrailOtlp::new(&format!("http://{addr}")).unwrap();
        let logs = TrailLogs::start(&otlp, "rtest", "acme", &metrics).unwrap();
        let mut chain = Chain::new("rtest", "acme");

        for _ in 0..EXPORTS_IN_FLIGHT {
            logs.export(&batch(&mut chain, 2));
        }
        assert_eq!(logs.in_flight.available_permits(), 0);
        assert_eq!(metrics.otlp_failures.get(), 0);
        logs.export(&batch(&mut chain, 3));
        assert_eq!(
            metrics.otlp_failures.get(),
            3,
            "the skipped segment's records are counted"
        );
        assert_eq!(metrics.otlp_exported.get(), 0);

        close.send(()).unwrap();
        silent.await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while logs.in_flight.available_permits() < EXPORTS_IN_FLIGHT {
            assert!(tokio::time::Instant::now() < deadline, "the exports never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            metrics.otlp_failures.get(),
            3 + 2 * EXPORTS_IN_FLIGHT as u64,
            "the exports the gone collector failed are counted too"
        );
        assert_eq!(metrics.otlp_exported.get(), 0);
    }
}
