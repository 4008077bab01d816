//! Off the request path: the pipeline offers each finished call to a
//! [`Recorder`] (a `try_send` into a bounded buffer, never a wait); one task
//! per chain takes what arrived, seals it as a segment and writes it to the
//! store. When the store cannot keep up (or is down) the buffer fills and
//! further records are dropped, counted in
//! `agent_reach_trail_dropped_total`; a sealed batch that failed to write is
//! kept and written again, so a chain has no holes, only an end.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::chain::{Batch, Chain, HeadClaims, HeadSigner, StoredHead};
use crate::record::{Entry, Stored};

/// Where records are looked up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Index {
    Request(String),
    Session(String),
    Run(String),
}

impl Index {
    /// The index's name and key (`request`, `session`, `run`).
    pub fn parts(&self) -> (&'static str, &str) {
        match self {
            Index::Request(id) => ("request", id),
            Index::Session(id) => ("session", id),
            Index::Run(id) => ("run", id),
        }
    }
}

/// A chain the store holds, and when it was last written to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainInfo {
    pub router: String,
    pub last_at_ms: u64,
}

/// Where a tenant's trail is kept (Redis: `agent_reach_task_store::TaskStore`).
#[async_trait]
pub trait TrailStore: Send + Sync + 'static {
    /// Writes a sealed batch: its records, their indexes, its head; records
    /// older than `retention` may go.
    async fn append(&self, batch: &Batch, retention: Duration) -> Result<(), String>;
    /// Every chain, most recently written first.
    async fn chains(&self) -> Result<Vec<ChainInfo>, String>;
    /// The records an index names, over every chain (at most `limit`).
    async fn records_of(&self, index: &Index, limit: usize) -> Result<Vec<Stored>, String>;
    /// A chain's records after the stream id `after` (from its start when `None`).
    async fn chain_records(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<Stored>, String>;
    /// A chain's segment heads after `after`.
    async fn chain_heads(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<StoredHead>, String>;
    /// A chain's records stored since `since_ms` (by the stream id's time),
    /// newest first, at most `limit`: what the console's figures count.
    async fn chain_records_since(&self, router: &str, since_ms: u64, limit: usize) -> Result<Vec<Stored>, String>;
    /// The most recent records of `capability` that hold their input (replays sample them).
    async fn recent_with_input(&self, capability: &str, limit: usize) -> Result<Vec<Stored>, String>;
}

/// How a chain's writer batches and keeps records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrailSettings {
    /// Records waiting to be written at most; more are dropped (and counted).
    pub buffer: usize,
    /// Records per segment at most.
    pub batch: usize,
    /// How long a record waits for its segment to fill at most.
    pub flush_every: Duration,
    /// How long records are kept.
    pub retention: Duration,
}

impl Default for TrailSettings {
    fn default() -> Self {
        Self {
            buffer: 65_536,
            batch: 1024,
            flush_every: Duration::from_millis(100),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// The trail's series (labelled by tenant where the router serves several).
#[derive(Clone)]
pub struct TrailMetrics {
    pub written: prometheus::IntCounter,
    pub dropped: prometheus::IntCounter,
    pub write_failures: prometheus::IntCounter,
    pub segments: prometheus::IntCounter,
}

impl TrailMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let counter = |name: &str, help: &str| -> Result<prometheus::IntCounter, prometheus::Error> {
            let counter = prometheus::IntCounter::new(name, help)?;
            registry.register(Box::new(counter.clone()))?;
            Ok(counter)
        };
        Ok(Self {
            written: counter("agent_reach_trail_records_total", "Trail records written to the store.")?,
            dropped: counter(
                "agent_reach_trail_dropped_total",
                "Trail records dropped because the buffer was full (the store was down or slower than the calls).",
            )?,
            write_failures: counter(
                "agent_reach_trail_write_failures_total",
                "Failed writes of a trail segment (each is retried).",
            )?,
            segments: counter("agent_reach_trail_segments_total", "Trail segments sealed and written.")?,
        })
    }
}

/// What the pipeline holds: offers records, never waits.
pub struct Recorder {
    sender: mpsc::Sender<Entry>,
    metrics: TrailMetrics,
}

impl Recorder {
    /// Starts the writer of `router`'s chain for `tenant` on the current
    /// runtime; it ends once the recorder is dropped and what it holds is written
    /// (or, with the store down, when the recorder is dropped).
    pub fn start(
        store: Arc<dyn TrailStore>,
        signer: Arc<dyn HeadSigner>,
        router: &str,
        tenant: &str,
        settings: TrailSettings,
        metrics: TrailMetrics,
    ) -> Arc<Self> {
        let (sender, receiver) = mpsc::channel(settings.buffer.max(1));
        let writer = Writer {
            store,
            signer,
            chain: Chain::new(router, tenant),
            settings,
            metrics: metrics.clone(),
        };
        tokio::spawn(writer.run(receiver));
        Arc::new(Self { sender, metrics })
    }

    /// Hands `entry` to the writer, or counts it dropped when the buffer is full.
    pub fn offer(&self, entry: Entry) {
        if self.sender.try_send(entry).is_err() {
            self.metrics.dropped.inc();
        }
    }
}

/// Signs segment heads with the router's assertion key (the one it signs
/// hop assertions with, published at `/.well-known/jwks.json`).
pub struct AssertionSigner(pub Arc<agent_reach_access::Assertions>);

impl HeadSigner for AssertionSigner {
    fn sign(&self, claims: &HeadClaims) -> Result<String, String> {
        self.0.signing_key().sign_document(claims)
    }

    fn issuer(&self) -> &str {
        self.0.issuer()
    }
}

struct Writer {
    store: Arc<dyn TrailStore>,
    signer: Arc<dyn HeadSigner>,
    chain: Chain,
    settings: TrailSettings,
    metrics: TrailMetrics,
}

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Writer {
    async fn run(mut self, mut receiver: mpsc::Receiver<Entry>) {
        let mut entries = Vec::with_capacity(self.settings.batch);
        loop {
            // Wait for the first record, then up to `flush_every` for more.
            let Some(first) = receiver.recv().await else {
                return;
            };
            entries.push(first);
            // Then sleep until the segment is due and take what arrived in
            // one go. Waiting on `recv` for each record instead woke this
            // task (a futex wake from the request thread) once per call:
            // the largest part of the trail's cost in `router-bench
            // --trail`'s profile. A full segment's worth already waiting,
            // or the recorder gone, does not wait.
            let due = tokio::time::Instant::now() + self.settings.flush_every;
            if receiver.len() + 1 < self.settings.batch && !receiver.is_closed() {
                tokio::time::sleep_until(due).await;
            }
            let room = self.settings.batch.saturating_sub(entries.len());
            if room > 0 && !receiver.is_empty() {
                // Returns at once: records are waiting.
                receiver.recv_many(&mut entries, room).await;
            }
            let batch = match self.chain.seal(&entries, now_ms(), &*self.signer) {
                Ok(batch) => batch,
                Err(error) => {
                    // Nothing was chained: the records are lost, and said so.
                    tracing::error!(message = "Cannot seal a trail segment; its records are dropped.", %error, records = entries.len());
                    self.metrics.dropped.inc_by(entries.len() as u64);
                    entries.clear();
                    continue;
                }
            };
            entries.clear();
            self.write(&batch, &receiver).await;
        }
    }

    /// Writes `batch`, again and again until it is written (or nobody can offer more).
    async fn write(&self, batch: &Batch, receiver: &mpsc::Receiver<Entry>) {
        let mut wait = RETRY_MIN;
        let mut failing = false;
        loop {
            match self.store.append(batch, self.settings.retention).await {
                Ok(()) => {
                    self.metrics.written.inc_by(batch.records.len() as u64);
                    self.metrics.segments.inc();
                    if failing {
                        tracing::info!(message = "Trail writes succeed again.", router = %batch.router);
                    }
                    tracing::debug!(
                        message = "Trail segment sealed.", router = %batch.router,
                        head = %crate::record::hash_of(batch.head.jws.as_bytes()), records = batch.records.len()
                    );
                    return;
                }
                Err(error) => {
                    self.metrics.write_failures.inc();
                    if !failing {
                        tracing::warn!(
                            message = "Cannot write the trail; retrying (calls go on, records beyond the buffer are dropped).",
                            %error, router = %batch.router
                        );
                        failing = true;
                    }
                    if receiver.is_closed() && receiver.is_empty() {
                        // The router is stopping and nothing waits behind this batch.
                        return;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}
