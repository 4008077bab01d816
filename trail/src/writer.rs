//! Off the request path: the pipeline offers each finished call to a
//! [`Recorder`] (a push into a bounded buffer, never a wait); one task
//! per chain takes what arrived, seals it as segments and writes them to the
//! store. When the store cannot keep up (or is down) the buffer fills and
//! further records are dropped, counted in
//! `agent_reach_trail_dropped_total`; a sealed batch that failed to write is
//! kept and written again, so a chain has no holes, only an end.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::FutureExt;
use tokio::sync::Notify;

use crate::chain::{Batch, Chain, HeadClaims, HeadSigner, StoredHead};
use crate::record::{Entry, Rendered, Stored};
use crate::sealer::{here, preferably_idle, Ran, WriterPriority};

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
    /// Records the buffers hold at most, and the writer besides (the batch
    /// being written and those taken from the buffers since); more are
    /// dropped (and counted).
    pub buffer: usize,
    /// Records per segment at most.
    pub batch: usize,
    /// A segment's records' text at most (bytes, about; a record larger
    /// than this is a segment on its own). A batch's buffers (the
    /// segment's command, the store's pipeline) stay below the allocator's
    /// huge-object size (512 KiB in mimalloc v3): above it each would be
    /// fresh memory, its pages zeroed, every batch (`router-bench --trail`'s
    /// profile: ~0.5 µs a record in `clear_page_erms` with 1,024-record
    /// segments of ~560 KB).
    pub segment_bytes: usize,
    /// What CPU sealing gets ([`WriterPriority`]).
    pub priority: WriterPriority,
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
            segment_bytes: 256 * 1024,
            priority: WriterPriority::Idle,
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
    /// Records exported as OTLP logs (`--trail-otlp-endpoint`).
    pub otlp_exported: prometheus::IntCounter,
    /// Records whose OTLP export failed or was skipped (kept in the store all the same).
    pub otlp_failures: prometheus::IntCounter,
    /// Segments sealed and written at the calls' priority because the
    /// idle-priority thread had not started their batch in time or fell
    /// behind (`--trail-writer-priority idle`).
    pub sealed_starved: prometheus::IntCounter,
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
            otlp_exported: counter(
                "agent_reach_trail_otlp_exported_total",
                "Trail records exported as OTLP logs (--trail-otlp-endpoint).",
            )?,
            otlp_failures: counter(
                "agent_reach_trail_otlp_failures_total",
                "Trail records not exported as OTLP logs: the collector failed or was slower than the trail (the records are in the store all the same).",
            )?,
            sealed_starved: counter(
                "agent_reach_trail_sealed_starved_total",
                "Trail segments sealed and written at the calls' priority because the idle-priority sealing thread had not started their batch within 0.5 s or fell behind (the calls kept every core busy).",
            )?,
        })
    }
}

/// What the pipeline holds: offers records, never waits.
///
/// Records wait in a few buffers, one per request thread (a thread picks
/// its buffer once): an offer is an uncontended lock and a push, and the
/// writer is woken only when a buffer it emptied gets its first record or
/// one fills a segment. One shared channel cost each call a send and a
/// wake (`router-bench --trail`'s profile).
pub struct Recorder {
    shared: Arc<Shared>,
    metrics: TrailMetrics,
}

struct Shared {
    buffers: Box<[Buffer]>,
    /// Records one buffer holds at most (the buffer setting, shared out).
    room: usize,
    /// Records that fill a segment: a buffer this full wakes the writer early.
    batch: usize,
    wake: Notify,
    closed: AtomicBool,
}

impl Shared {
    fn is_empty(&self) -> bool {
        self.buffers.iter().all(|buffer| lock(&buffer.records).is_empty())
    }

    /// Whether some buffer holds a segment's worth.
    fn has_a_segment(&self) -> bool {
        self.buffers
            .iter()
            .any(|buffer| lock(&buffer.records).len() >= self.batch)
    }

    /// Moves every waiting record into `entries`.
    fn drain_into(&self, entries: &mut Vec<Rendered>) {
        self.drain_up_to(entries, usize::MAX);
    }

    /// Moves waiting records into `entries` until it holds `most` (each
    /// buffer's oldest first).
    fn drain_up_to(&self, entries: &mut Vec<Rendered>, most: usize) {
        for buffer in self.buffers.iter() {
            let wanted = most.saturating_sub(entries.len());
            if wanted == 0 {
                return;
            }
            let mut records = lock(&buffer.records);
            if records.len() <= wanted {
                entries.append(&mut records);
            } else {
                entries.extend(records.drain(..wanted));
            }
            buffer.full.store(false, Ordering::Relaxed);
        }
    }
}

/// One request thread's (or a few's) records waiting for the writer.
#[derive(Default)]
struct Buffer {
    records: Mutex<Vec<Rendered>>,
    /// Set (under the lock) when `records` reaches the room, cleared when
    /// the writer empties it: an offer reads it first and drops a record
    /// without rendering it or taking the lock.
    full: AtomicBool,
}

/// A buffer, even one a panicking thread held (it holds plain records).
fn lock(buffer: &Mutex<Vec<Rendered>>) -> std::sync::MutexGuard<'_, Vec<Rendered>> {
    buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which buffer this thread offers to (threads numbered as they first offer).
fn buffer_of_this_thread(count: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|number| number % count)
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
        // Twice the cores, so that request threads rarely share one.
        let count = std::thread::available_parallelism()
            .map_or(4, |cores| cores.get() * 2)
            .clamp(1, 64)
            .min(settings.buffer.max(1));
        let shared = Arc::new(Shared {
            buffers: (0..count).map(|_| Buffer::default()).collect(),
            room: (settings.buffer / count).max(1),
            batch: settings.batch.max(1),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let writer = Writer {
            store,
            signer,
            chain: Chain::new(router, tenant),
            settings,
            metrics: metrics.clone(),
            dropped_told: (0, None),
            starved_told: None,
        };
        tokio::spawn(writer.run(shared.clone()));
        Arc::new(Self { shared, metrics })
    }

    /// Hands `entry` to the writer, or counts it dropped when its buffer is
    /// full. Its members are written here ([`Rendered`]), on the offering
    /// thread, and not by the writer.
    pub fn offer(&self, entry: Entry<'_>) {
        let shared = &*self.shared;
        let buffer = &shared.buffers[buffer_of_this_thread(shared.buffers.len())];
        // A full buffer (the store down or behind) drops the record before
        // it is rendered: no work for what is not kept.
        if buffer.full.load(Ordering::Relaxed) {
            self.metrics.dropped.inc();
            return;
        }
        let entry = Rendered::of(entry);
        let held = {
            let mut records = lock(&buffer.records);
            if records.len() >= shared.room {
                None
            } else {
                records.push(entry);
                if records.len() >= shared.room {
                    buffer.full.store(true, Ordering::Relaxed);
                }
                Some(records.len())
            }
        };
        match held {
            None => self.metrics.dropped.inc(),
            // The first record since the writer emptied it, or a segment's worth.
            Some(held) if held == 1 || held == shared.batch => shared.wake.notify_one(),
            Some(_) => {}
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
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
    /// The dropped counter when the writer last said so, and when.
    dropped_told: (u64, Option<Instant>),
    /// When the writer last said the idle thread was starved.
    starved_told: Option<Instant>,
}

/// How often at most the writer says records were dropped, or sealing starved.
const TOLD_EVERY: Duration = Duration::from_secs(60);

/// How long a job may wait for the idle-priority thread to start it (a
/// batch is a few ms of CPU; a thread that gets none in this long is
/// starved): then the writer runs it itself.
const STARVED_AFTER: Duration = Duration::from_millis(500);

/// A batch of more than this share of the buffer (1/4) is sealed at the
/// calls' priority: the records waited that long because the idle thread
/// fell behind (each batch is otherwise what `flush_every`, 100 ms, or a
/// segment's worth brought), and sealing it there too would leave the
/// next one closer to a full buffer.
const BEHIND_SHARE: usize = 4;

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Writer {
    async fn run(mut self, shared: Arc<Shared>) {
        let mut entries = Vec::new();
        // Records taken from the buffers while a batch was being sealed and
        // written: the next batch's first.
        let mut taken = Vec::new();
        loop {
            std::mem::swap(&mut entries, &mut taken);
            // Wait for a record (or the recorder's end) ...
            while entries.is_empty() && shared.is_empty() {
                if shared.closed.load(Ordering::Acquire) {
                    return;
                }
                shared.wake.notified().await;
            }
            // ... then until the segment is due, and take what arrived in
            // one go. A segment's worth already waiting, or the recorder
            // gone, does not wait.
            if !shared.closed.load(Ordering::Acquire) && entries.len() < self.settings.batch && !shared.has_a_segment()
            {
                let due = tokio::time::sleep(self.settings.flush_every);
                tokio::pin!(due);
                loop {
                    tokio::select! {
                        () = &mut due => break,
                        () = shared.wake.notified() => {
                            if shared.closed.load(Ordering::Acquire) || shared.has_a_segment() {
                                break;
                            }
                        }
                    }
                }
            }
            shared.drain_into(&mut entries);
            self.tell_drops();
            // While the batch is sealed and written (at idle priority that
            // may take a while: a job the idle thread has started is
            // preempted whenever the calls want its core), the buffers
            // keep being emptied into the next batch: they fill, and drop
            // records, only once the writer holds as many as the buffer
            // setting (the batch and those taken since).
            let (every, room) = (
                self.settings.flush_every,
                self.settings.buffer.saturating_sub(entries.len()),
            );
            let unwritten = {
                let sealing = self.seal_and_write(&mut entries);
                tokio::pin!(sealing);
                loop {
                    tokio::select! {
                        unwritten = &mut sealing => break unwritten,
                        () = tokio::time::sleep(every) => shared.drain_up_to(&mut taken, room),
                    }
                }
            };
            if let Some((error, unwritten)) = unwritten {
                let mut failed = Some(error);
                for batch in unwritten {
                    self.write(&batch, &shared, failed.take()).await;
                }
            }
        }
    }

    /// Seals `entries` (emptying it) as segments and writes them once each,
    /// in order, where the priority says: at idle priority unless that
    /// thread is starved or behind (then at the calls' priority: a router
    /// whose calls keep every core busy pays the trail's CPU rather than
    /// drop its records). The idle thread prepares and sends the store's
    /// commands too; their I/O is the runtime's. What a write failed on
    /// (its error, that segment and those after it) is the caller's to retry.
    async fn seal_and_write(&mut self, entries: &mut Vec<Rendered>) -> Unwritten {
        let limits = (self.settings.batch, self.settings.segment_bytes);
        let (signer, store, metrics) = (self.signer.clone(), self.store.clone(), self.metrics.clone());
        let retention = self.settings.retention;
        // The chain goes with its records and comes back advanced; a job
        // that is lost leaves it as it was, as if they had never been offered.
        let state = (self.chain.clone(), std::mem::take(entries));
        let count = state.1.len() as u64;
        let job = move || async move {
            let (mut chain, mut taken) = state;
            let batches = seal_segments(&mut chain, &mut taken, limits, &*signer, &metrics.dropped);
            let sealed = batches.len() as u64;
            let mut batches = batches.into_iter();
            let mut unwritten = None;
            while let Some(batch) = batches.next() {
                if let Err(error) = write_once(&*store, &batch, retention, &metrics).await {
                    unwritten = Some((error, std::iter::once(batch).chain(batches).collect()));
                    break;
                }
            }
            (chain, taken, sealed, unwritten)
        };
        let idle = self.settings.priority == WriterPriority::Idle;
        let ran = if !idle || count as usize > self.settings.buffer / BEHIND_SHARE {
            here(job).await.map(|out| (out, Ran::Here))
        } else {
            preferably_idle(job, STARVED_AFTER).await
        };
        let Some(((chain, taken, sealed, unwritten), ran)) = ran else {
            self.metrics.dropped.inc_by(count);
            return None;
        };
        self.chain = chain;
        // Empty, its capacity kept for the next batch.
        *entries = taken;
        if idle && ran == Ran::Here {
            self.starved(sealed, count);
        }
        unwritten
    }

    /// Counts `segments` sealed at the calls' priority, the idle thread
    /// starved or behind, and says so (once a minute at most).
    fn starved(&mut self, segments: u64, records: u64) {
        self.metrics.sealed_starved.inc_by(segments);
        if self.starved_told.is_none_or(|at| at.elapsed() >= TOLD_EVERY) {
            tracing::info!(
                message = "The trail's idle-priority sealing gets too little CPU (calls keep every core busy); this batch is sealed at the calls' priority.",
                router = %self.chain.router(), records
            );
            self.starved_told = Some(Instant::now());
        }
    }

    /// Warns (once a minute at most) when records were dropped since it last did.
    fn tell_drops(&mut self) {
        let dropped = self.metrics.dropped.get();
        let (told, at) = self.dropped_told;
        if dropped > told && at.is_none_or(|at| at.elapsed() >= TOLD_EVERY) {
            tracing::warn!(
                message = "Trail records were dropped: the trail's buffers were full (Redis down or slower than the calls).",
                dropped = dropped - told, router = %self.chain.router()
            );
            self.dropped_told = (dropped, Some(Instant::now()));
        }
    }

    /// Writes `batch` (whose last write failed with `failed`, when it was
    /// tried), again and again until it is written (or nobody can offer more).
    async fn write(&self, batch: &Batch, shared: &Shared, mut failed: Option<String>) {
        let mut wait = RETRY_MIN;
        let mut failing = false;
        loop {
            let result = match failed.take() {
                Some(error) => Err(error),
                None => write_once(&*self.store, batch, self.settings.retention, &self.metrics).await,
            };
            match result {
                Ok(()) => {
                    if failing {
                        tracing::info!(message = "Trail writes succeed again.", router = %batch.router);
                    }
                    return;
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(
                            message = "Cannot write the trail; retrying (calls go on, records beyond the buffer are dropped).",
                            %error, router = %batch.router
                        );
                        failing = true;
                    }
                    if shared.closed.load(Ordering::Acquire) {
                        // The router is stopping: nobody waits for this batch.
                        return;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// A write that failed: its error, and the segments from the one it failed
/// on (in order: a segment written after one that is not would be refused by
/// its stream id once that one is).
type Unwritten = Option<(String, Vec<Batch>)>;

/// Writes `batch` once, counting it written or its failure. A store that
/// panics has failed this write like any other: the chain, advanced past
/// segments already written, must not be lost with it.
async fn write_once(
    store: &dyn TrailStore,
    batch: &Batch,
    retention: Duration,
    metrics: &TrailMetrics,
) -> Result<(), String> {
    let written = std::panic::AssertUnwindSafe(store.append(batch, retention))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err("the store panicked while writing".to_string()));
    match &written {
        Ok(()) => {
            metrics.written.inc_by(batch.records.len() as u64);
            metrics.segments.inc();
            tracing::debug!(
                message = "Trail segment sealed.", router = %batch.router,
                head = %crate::record::hash_of(batch.head.jws.as_bytes()), records = batch.records.len()
            );
        }
        Err(_) => metrics.write_failures.inc(),
    }
    written
}

/// Seals `entries` (emptying it) as the next segments of `chain`, each at
/// most `limits` (records, bytes); records whose segment cannot be signed
/// are dropped and counted.
fn seal_segments(
    chain: &mut Chain,
    entries: &mut Vec<Rendered>,
    (batch, bytes): (usize, usize),
    signer: &dyn HeadSigner,
    dropped: &prometheus::IntCounter,
) -> Vec<Batch> {
    let mut batches = Vec::new();
    while !entries.is_empty() {
        let count = segment_len(entries, batch, bytes);
        match chain.seal(entries.drain(..count), now_ms(), signer) {
            Ok(batch) => batches.push(batch),
            Err(error) => {
                // Nothing was chained: the records are lost, and said so.
                tracing::error!(message = "Cannot seal a trail segment; its records are dropped.", %error, records = count);
                dropped.inc_by(count as u64);
            }
        }
    }
    batches
}

/// How many of `entries` (at least one) the next segment takes: at most
/// `batch` records and, past the first, `bytes` of their text.
fn segment_len(entries: &[Rendered], batch: usize, bytes: usize) -> usize {
    let mut taken = 0;
    let mut count = 0;
    for entry in entries.iter().take(batch.max(1)) {
        taken += entry.stored_len();
        if count > 0 && taken > bytes {
            break;
        }
        count += 1;
    }
    count
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::tests::{entry, TestSigner};

    /// Keeps what it is given; refuses while `down`; panics once when told
    /// to; a write waits for a permit of `gate` when there is one (`entered`
    /// once one does).
    #[derive(Default)]
    struct Kept {
        batches: Mutex<Vec<Batch>>,
        down: AtomicBool,
        panic_once: AtomicBool,
        gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
        entered: AtomicBool,
    }

    #[async_trait]
    impl TrailStore for Kept {
        async fn append(&self, batch: &Batch, _retention: Duration) -> Result<(), String> {
            assert!(
                !self.panic_once.swap(false, Ordering::SeqCst),
                "the store panics, on purpose"
            );
            if self.down.load(Ordering::SeqCst) {
                return Err("down".into());
            }
            let gate = self.gate.lock().unwrap().clone();
            if let Some(gate) = gate {
                self.entered.store(true, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
            }
            self.batches.lock().unwrap().push(batch.clone());
            Ok(())
        }
        async fn chains(&self) -> Result<Vec<ChainInfo>, String> {
            Ok(Vec::new())
        }
        async fn records_of(&self, _: &Index, _: usize) -> Result<Vec<crate::Stored>, String> {
            Ok(Vec::new())
        }
        async fn chain_records(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<crate::Stored>, String> {
            Ok(Vec::new())
        }
        async fn chain_heads(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<StoredHead>, String> {
            Ok(Vec::new())
        }
        async fn chain_records_since(&self, _: &str, _: u64, _: usize) -> Result<Vec<crate::Stored>, String> {
            Ok(Vec::new())
        }
        async fn recent_with_input(&self, _: &str, _: usize) -> Result<Vec<crate::Stored>, String> {
            Ok(Vec::new())
        }
    }

    /// A recorder writing to a [`Kept`] store, with its metrics.
    fn start(settings: TrailSettings) -> (Arc<Kept>, TrailMetrics, Arc<Recorder>) {
        let store = Arc::new(Kept::default());
        let metrics = TrailMetrics::new(&prometheus::Registry::new()).unwrap();
        let recorder = Recorder::start(
            store.clone(),
            Arc::new(TestSigner::new()),
            "r-a",
            "default",
            settings,
            metrics.clone(),
        );
        (store, metrics, recorder)
    }

    /// Offers `each` records from each of `threads` threads of their own, and waits for them.
    fn offer_from_threads(recorder: &Arc<Recorder>, threads: usize, each: usize) {
        let offering: Vec<_> = (0..threads)
            .map(|thread| {
                let recorder = recorder.clone();
                std::thread::spawn(move || {
                    for n in 0..each {
                        recorder.offer(entry(&format!("{thread}-{n}")));
                    }
                })
            })
            .collect();
        for thread in offering {
            thread.join().unwrap();
        }
    }

    /// The seqs of the records `store` was given, in the order written.
    fn seqs(store: &Kept) -> Vec<u64> {
        store
            .batches
            .lock()
            .unwrap()
            .iter()
            .flat_map(|batch| batch.records.iter().map(|sealed| sealed.seq))
            .collect()
    }

    async fn until(what: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !what() {
            assert!(tokio::time::Instant::now() < deadline, "not reached in 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn a_segment_takes_records_up_to_its_count_and_its_bytes() {
        let entries: Vec<Rendered> = (0..10).map(|n| Rendered::of(entry(&format!("r-{n}")))).collect();
        let one = entries[0].stored_len();
        assert_eq!(segment_len(&entries, 1024, usize::MAX), 10);
        assert_eq!(segment_len(&entries, 4, usize::MAX), 4);
        assert_eq!(segment_len(&entries, 1024, 3 * one), 3);
        assert_eq!(segment_len(&entries, 1024, 3 * one + 1), 3);
        // A record larger than the bound is a segment on its own.
        assert_eq!(segment_len(&entries, 1024, 1), 1);
        assert_eq!(segment_len(&entries, 0, 1), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_offered_from_many_threads_are_chained_in_segments() {
        for priority in [WriterPriority::Idle, WriterPriority::Normal] {
            let (store, metrics, recorder) = start(TrailSettings {
                batch: 64,
                flush_every: Duration::from_millis(20),
                priority,
                ..TrailSettings::default()
            });
            offer_from_threads(&recorder, 4, 250);
            until(|| metrics.written.get() == 1000).await;
            assert_eq!(seqs(&store), (1..=1000).collect::<Vec<_>>(), "{priority:?}");
            assert!(store
                .batches
                .lock()
                .unwrap()
                .iter()
                .all(|batch| batch.records.len() <= 64));
            assert_eq!(metrics.dropped.get(), 0);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_are_written_while_the_idle_thread_is_starved() {
        // Keep the idle-priority thread busy, as calls on every core would.
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let busy = tokio::spawn(crate::sealer::preferably_idle(
            move || async move {
                let _ = started.send(());
                released.recv().ok()
            },
            Duration::from_secs(60),
        ));
        running.await.unwrap();
        let (store, metrics, recorder) = start(TrailSettings {
            flush_every: Duration::from_millis(20),
            ..TrailSettings::default()
        });
        for n in 0..3 {
            recorder.offer(entry(&format!("r-{n}")));
        }
        // The writer seals them itself once its patience is out.
        until(|| metrics.written.get() == 3).await;
        recorder.offer(entry("r-3"));
        until(|| metrics.written.get() == 4).await;
        assert_eq!(metrics.dropped.get(), 0);
        assert_eq!(seqs(&store), [1, 2, 3, 4]);
        release.send(()).unwrap();
        busy.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_the_idle_thread_fell_behind_on_is_sealed_at_the_calls_priority() {
        // Records wait for the recorder's end (not due for an hour); the
        // writer then takes them as one batch. A quarter of this buffer is 16.
        let settings = TrailSettings {
            buffer: 64,
            flush_every: Duration::from_secs(3600),
            ..TrailSettings::default()
        };
        for (threads, behind) in [(1, false), (8, true)] {
            let (store, metrics, recorder) = start(settings);
            offer_from_threads(&recorder, threads, 3);
            drop(recorder);
            until(|| metrics.written.get() + metrics.dropped.get() == 3 * threads as u64).await;
            assert_eq!(metrics.dropped.get(), 0);
            assert_eq!(store.batches.lock().unwrap().len(), 1);
            assert_eq!(metrics.sealed_starved.get() == 1, behind, "{threads} threads");
        }
    }

    /// Signs as [`TestSigner`] does; panics once when told to.
    struct PanickingSigner {
        signer: TestSigner,
        panic_once: AtomicBool,
    }

    impl HeadSigner for PanickingSigner {
        fn sign(&self, claims: &HeadClaims) -> Result<String, String> {
            assert!(
                !self.panic_once.swap(false, Ordering::SeqCst),
                "the signer panics, on purpose"
            );
            self.signer.sign(claims)
        }
        fn issuer(&self) -> &str {
            self.signer.issuer()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_panics_drops_its_records_and_leaves_the_chain_as_it_was() {
        // On the idle thread, and on the writer's own task (where a panic
        // once ended the writer, and with it every later record).
        for priority in [WriterPriority::Idle, WriterPriority::Normal] {
            let store = Arc::new(Kept::default());
            let metrics = TrailMetrics::new(&prometheus::Registry::new()).unwrap();
            let signer = Arc::new(PanickingSigner {
                signer: TestSigner::new(),
                panic_once: AtomicBool::new(true),
            });
            let settings = TrailSettings {
                flush_every: Duration::from_millis(5),
                priority,
                ..TrailSettings::default()
            };
            let recorder = Recorder::start(store.clone(), signer, "r-a", "default", settings, metrics.clone());
            recorder.offer(entry("lost"));
            until(|| metrics.dropped.get() == 1).await;
            recorder.offer(entry("kept"));
            until(|| metrics.written.get() == 1).await;
            // The chain goes on from where it was: the lost record never took a seq.
            assert_eq!(seqs(&store), [1], "{priority:?}");
            assert_eq!(
                store.batches.lock().unwrap()[0].records[0].request_id,
                "kept",
                "{priority:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_that_panics_fails_that_write_and_the_chain_goes_on() {
        for priority in [WriterPriority::Idle, WriterPriority::Normal] {
            let (store, metrics, recorder) = start(TrailSettings {
                flush_every: Duration::from_millis(5),
                priority,
                ..TrailSettings::default()
            });
            recorder.offer(entry("a"));
            until(|| metrics.written.get() == 1).await;
            store.panic_once.store(true, Ordering::SeqCst);
            recorder.offer(entry("b"));
            until(|| metrics.written.get() == 2).await;
            recorder.offer(entry("c"));
            until(|| metrics.written.get() == 3).await;
            assert_eq!(metrics.write_failures.get(), 1, "{priority:?}");
            assert_eq!(seqs(&store), [1, 2, 3], "{priority:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_buffer_drops_and_counts_and_nothing_sealed_is_lost() {
        let (store, metrics, recorder) = start(TrailSettings {
            buffer: 8,
            batch: 4,
            flush_every: Duration::from_millis(5),
            ..TrailSettings::default()
        });
        store.down.store(true, Ordering::SeqCst);
        // The writer takes the first records and retries them; the rest
        // fill the buffers and overflow.
        recorder.offer(entry("first"));
        until(|| metrics.write_failures.get() > 0).await;
        for n in 0..100 {
            recorder.offer(entry(&format!("r-{n}")));
        }
        assert!(metrics.dropped.get() >= 100 - 8, "dropped {}", metrics.dropped.get());
        store.down.store(false, Ordering::SeqCst);
        let offered = 101 - metrics.dropped.get();
        until(|| metrics.written.get() == offered).await;
        assert_eq!(store.batches.lock().unwrap()[0].records[0].request_id, "first");
        // Emptied by the writer, the buffers take records again.
        let dropped = metrics.dropped.get();
        recorder.offer(entry("after"));
        until(|| metrics.written.get() == offered + 1).await;
        assert_eq!(metrics.dropped.get(), dropped);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_buffers_are_emptied_while_a_batch_is_written_until_the_writer_holds_the_buffer_setting() {
        for priority in [WriterPriority::Idle, WriterPriority::Normal] {
            let (store, metrics, recorder) = start(TrailSettings {
                buffer: 64,
                batch: 8,
                flush_every: Duration::from_millis(5),
                priority,
                ..TrailSettings::default()
            });
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            *store.gate.lock().unwrap() = Some(gate.clone());
            // One record taken, its write held (a job the idle thread is
            // preempted in, or a slow store) ...
            recorder.offer(entry("first"));
            until(|| store.entered.load(Ordering::SeqCst)).await;
            // ... and the buffers still emptied while it is: more records
            // than this thread's buffer holds (the setting shared out among
            // the buffers), none dropped, until the writer holds 64.
            for n in 0..63 {
                recorder.offer(entry(&format!("r-{n}")));
                until(|| recorder.shared.is_empty()).await;
            }
            assert_eq!(metrics.dropped.get(), 0, "{priority:?}");
            // Then the buffers fill, and overflow.
            for n in 0..64 {
                recorder.offer(entry(&format!("over-{n}")));
            }
            let dropped = metrics.dropped.get();
            assert!(dropped > 0 && dropped < 64, "{priority:?}: dropped {dropped}");
            gate.add_permits(1_000);
            until(|| metrics.written.get() == 128 - dropped).await;
            assert_eq!(seqs(&store), (1..=128 - dropped).collect::<Vec<_>>(), "{priority:?}");
            assert_eq!(store.batches.lock().unwrap()[0].records[0].request_id, "first");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_writes_what_it_holds_and_ends_with_the_recorder() {
        let (store, metrics, recorder) = start(TrailSettings {
            flush_every: Duration::from_secs(3600),
            ..TrailSettings::default()
        });
        recorder.offer(entry("a"));
        recorder.offer(entry("b"));
        // Not due for an hour: the recorder's end is what writes them.
        drop(recorder);
        until(|| metrics.written.get() == 2).await;
        assert_eq!(store.batches.lock().unwrap().len(), 1);
    }
}
