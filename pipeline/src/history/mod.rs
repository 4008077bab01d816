//! Outcome history per instance and capability version (issue 38): what
//! became of every attempt (succeeded, the agent's own error, timed out, a
//! 5xx or no answer at all) and how long answers took, per hour over seven
//! days, so `adaptive` can predict an instance's failure rate and latency at
//! this hour of the day ([`learn`]) and operators can read it.
//!
//! The request path only adds to [`History::record`]'s counters: two relaxed
//! atomic additions on the slot's own cache lines, no lock, no allocation,
//! no store. Every tick (`--routing-history-bucket-ms` / 360, 10 s by
//! default) the learning task drains them into the hour's bucket and the
//! recent slices. With `--redis` the routers' counts are merged through the
//! task store off the request path ([`exchange`]); without it each router
//! learns from its own calls.
//!
//! Memory, per (instance, capability version) slot: 168 hourly buckets of 20
//! 32-bit counters and their bucket number (14,784 bytes), six recent slices
//! (528 bytes), the pending counters (80 bytes) and the not-yet-exchanged
//! buckets (at most the 168 buckets again, only while Redis is unreachable):
//! about 15.5 KiB, 30 KiB at worst; 1,000 instances of one version hold
//! about 15 MiB. A slot lives while its instance offers the version.

pub mod changes;
pub mod exchange;
pub(crate) mod learn;
pub mod predict;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Hourly buckets kept: seven days.
pub const HOURS: usize = 7 * 24;
/// Buckets in a day: the pattern `adaptive` learns repeats every 24 buckets.
pub const DAY: u64 = 24;
/// Outcome kinds counted.
pub const KINDS: usize = 4;
/// Latency bins: `< 0.5 ms`, then doubling from 0.5 ms to `≥ 8.2 s`.
pub const LATENCY_BINS: usize = 16;
/// Counters of one window: the kinds, then the latency bins.
pub const WORDS: usize = KINDS + LATENCY_BINS;
/// Recent slices kept (each one tick long): "the last minute" by default.
pub const RECENT_SLICES: usize = 6;

/// How an attempt ended, as the history counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Answered 2xx (or `202` to a task's delivery), or a stream committed.
    Succeeded = 0,
    /// The agent's own business answer (a 4xx passed through): the instance works.
    AgentError = 1,
    /// No answer within a budget the instance should have met.
    Timeout = 2,
    /// A 5xx (503 included), a 429, a refused or broken connection, a body
    /// that was not an answer: the attempt was wasted.
    ServerError = 3,
}

impl Kind {
    pub const ALL: [Kind; KINDS] = [Kind::Succeeded, Kind::AgentError, Kind::Timeout, Kind::ServerError];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Succeeded => "succeeded",
            Kind::AgentError => "agent_error",
            Kind::Timeout => "timeout",
            Kind::ServerError => "server_error",
        }
    }
}

/// The counters of one window (an hour's bucket, a recent slice).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// [`KINDS`] outcome counts, then [`LATENCY_BINS`] latency counts.
    pub words: [u32; WORDS],
}

impl Counts {
    pub fn kind(&self, kind: Kind) -> u32 {
        self.words[kind as usize]
    }

    /// Attempts counted.
    pub fn calls(&self) -> u64 {
        self.words[..KINDS].iter().map(|count| u64::from(*count)).sum()
    }

    /// Attempts that failed (timed out, or a server error).
    pub fn failures(&self) -> u64 {
        u64::from(self.kind(Kind::Timeout)) + u64::from(self.kind(Kind::ServerError))
    }

    pub fn add(&mut self, other: &Counts) {
        for (mine, theirs) in self.words.iter_mut().zip(other.words.iter()) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|count| *count == 0)
    }

    /// The `q` quantile of the answered latencies (µs), by the geometric
    /// middle of its bin; `None` without an answer.
    pub fn latency_quantile_us(&self, q: f64) -> Option<u64> {
        quantile_of(
            &self.words[KINDS..]
                .iter()
                .map(|count| f64::from(*count))
                .collect::<Vec<_>>(),
            q,
        )
    }
}

/// The `q` quantile (µs) of latency `bins` (weights, [`LATENCY_BINS`] of them).
pub fn quantile_of(bins: &[f64], q: f64) -> Option<u64> {
    let total: f64 = bins.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let wanted = total * q.clamp(0.0, 1.0);
    let mut seen = 0.0;
    for (bin, weight) in bins.iter().enumerate() {
        seen += weight;
        if seen >= wanted && *weight > 0.0 {
            return Some(bin_middle_us(bin));
        }
    }
    bins.iter().rposition(|weight| *weight > 0.0).map(bin_middle_us)
}

/// The latency bin of an answer: `< 500 µs` is 0, then bin `i` holds
/// `[500 · 2^(i-1), 500 · 2^i)` µs, the last everything from 8.2 s.
pub fn bin_of(latency: Duration) -> usize {
    let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
    if us < 500 {
        return 0;
    }
    let doublings = 63 - (us / 500).leading_zeros() as usize;
    (doublings + 1).min(LATENCY_BINS - 1)
}

/// A bin's representative latency (µs): 250 µs for the first, the
/// geometric middle of the others.
pub fn bin_middle_us(bin: usize) -> u64 {
    if bin == 0 {
        return 250;
    }
    let low = 500u64 << (bin - 1);
    (low as f64 * std::f64::consts::SQRT_2) as u64
}

/// Counters the request path adds to.
#[derive(Debug, Default)]
struct Pending {
    words: [AtomicU32; WORDS],
}

/// What the learning task keeps of one slot (behind the slot's own mutex,
/// which the request path never takes).
#[derive(Debug)]
pub(crate) struct Recorded {
    /// `(bucket number, counts)`, at `number % HOURS`; number 0: never used.
    /// Empty until the slot first counts something: the week's ring is 15 KB,
    /// and an installation's idle instances (most of 100,000 agents) never
    /// fill it (registry-bench's routers held 14–21 KB per instance).
    pub(crate) hours: Box<[(u64, Counts)]>,
    /// `(slice number, counts)`, at `number % RECENT_SLICES`.
    pub(crate) recent: [(u64, Counts); RECENT_SLICES],
    /// Counts drained since the last exchange, by bucket (only while exchanging).
    unsent: Vec<(u64, Counts)>,
    /// Whether the merged history was read once from the ledger.
    pub(crate) fetched: bool,
    /// The learned weight (permille) when a change was last logged.
    pub(crate) logged: u32,
}

impl Recorded {
    fn new() -> Self {
        Self {
            hours: Box::default(),
            recent: [(0, Counts::default()); RECENT_SLICES],
            unsent: Vec::new(),
            fetched: false,
            logged: FULL,
        }
    }

    /// Bucket `number`'s counts, if the ring still holds it.
    pub(crate) fn hour(&self, number: u64) -> Option<&Counts> {
        let (held, counts) = self.hours.get((number % HOURS as u64) as usize)?;
        (*held == number && number != 0).then_some(counts)
    }

    fn hour_mut(&mut self, number: u64) -> &mut Counts {
        if self.hours.is_empty() {
            self.hours = vec![(0, Counts::default()); HOURS].into_boxed_slice();
        }
        let entry = &mut self.hours[(number % HOURS as u64) as usize];
        if entry.0 != number {
            *entry = (number, Counts::default());
        }
        &mut entry.1
    }

    /// Slice `number`'s counts, if still held.
    pub(crate) fn slice(&self, number: u64) -> Option<&Counts> {
        let (held, counts) = &self.recent[(number % RECENT_SLICES as u64) as usize];
        (*held == number && number != 0).then_some(counts)
    }

    fn slice_mut(&mut self, number: u64) -> &mut Counts {
        let entry = &mut self.recent[(number % RECENT_SLICES as u64) as usize];
        if entry.0 != number {
            *entry = (number, Counts::default());
        }
        &mut entry.1
    }
}

/// A full weight, in permille: what `adaptive` multiplies by when it knows nothing bad.
pub const FULL: u32 = 1000;

/// "Unknown" in the published prediction's atomics.
const UNKNOWN: u32 = u32::MAX;

/// One (instance, capability version)'s outcome history and what `adaptive`
/// learned from it.
#[derive(Debug)]
pub struct History {
    pending: Pending,
    recorded: Mutex<Recorded>,
    /// `adaptive`'s multiplier of the instance's effective weight (permille),
    /// set by the learning task, read per pick.
    learned: AtomicU32,
    /// The last prediction, for plugged-in policies and operators: failure
    /// rate (permille) and p50 latency (µs), `u32::MAX`/`u64::MAX` when unknown.
    predicted_failure: AtomicU32,
    predicted_p50_us: AtomicU64,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        Self {
            pending: Pending::default(),
            recorded: Mutex::new(Recorded::new()),
            learned: AtomicU32::new(FULL),
            predicted_failure: AtomicU32::new(UNKNOWN),
            predicted_p50_us: AtomicU64::new(u64::MAX),
        }
    }

    /// Counts one attempt (the request path): its kind and, for an answer,
    /// its latency bin.
    pub fn record(&self, kind: Kind, latency: Option<Duration>) {
        self.pending.words[kind as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(latency) = latency {
            self.pending.words[KINDS + bin_of(latency)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `adaptive`'s multiplier (permille) of this instance's effective weight.
    pub fn learned_permille(&self) -> u32 {
        self.learned.load(Ordering::Relaxed)
    }

    pub(crate) fn set_learned(&self, permille: u32) {
        self.learned.store(permille, Ordering::Relaxed);
    }

    /// The predicted failure rate now (permille), when known.
    pub fn predicted_failure_permille(&self) -> Option<u32> {
        Some(self.predicted_failure.load(Ordering::Relaxed)).filter(|value| *value != UNKNOWN)
    }

    /// The predicted p50 latency now, when known.
    pub fn predicted_p50(&self) -> Option<Duration> {
        Some(self.predicted_p50_us.load(Ordering::Relaxed))
            .filter(|value| *value != u64::MAX)
            .map(Duration::from_micros)
    }

    pub(crate) fn publish_prediction(&self, failure_permille: Option<u32>, p50_us: Option<u64>) {
        self.predicted_failure
            .store(failure_permille.unwrap_or(UNKNOWN), Ordering::Relaxed);
        self.predicted_p50_us
            .store(p50_us.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Moves the pending counters into bucket `bucket` and slice `slice`
    /// (and, while exchanging, into the bucket's unsent counts).
    pub(crate) fn drain(&self, bucket: u64, slice: u64, exchanging: bool) {
        let mut drained = Counts::default();
        for (word, pending) in drained.words.iter_mut().zip(self.pending.words.iter()) {
            // Read first: an idle slot's counters are not written.
            if pending.load(Ordering::Relaxed) != 0 {
                *word = pending.swap(0, Ordering::Relaxed);
            }
        }
        if drained.is_empty() {
            return;
        }
        let mut recorded = self.lock();
        recorded.hour_mut(bucket).add(&drained);
        recorded.slice_mut(slice).add(&drained);
        if exchanging {
            match recorded.unsent.iter_mut().find(|(number, _)| *number == bucket) {
                Some((_, counts)) => counts.add(&drained),
                None => recorded.unsent.push((bucket, drained)),
            }
        }
    }

    /// Reads what the learning task keeps, under the slot's lock (never on the request path).
    pub(crate) fn with<T>(&self, read: impl FnOnce(&Recorded) -> T) -> T {
        read(&self.lock())
    }

    pub(crate) fn with_mut<T>(&self, change: impl FnOnce(&mut Recorded) -> T) -> T {
        change(&mut self.lock())
    }

    /// Takes the counts to send to the ledger, buckets older than `oldest`
    /// dropped, and whether the merged history is still to be read whole.
    pub(crate) fn take_unsent(&self, oldest: u64) -> (Vec<(u64, Counts)>, bool) {
        let mut recorded = self.lock();
        let mut unsent = std::mem::take(&mut recorded.unsent);
        unsent.retain(|(number, _)| *number >= oldest);
        (unsent, !recorded.fetched)
    }

    /// Gives back counts an exchange failed to send (they go with the next one).
    pub(crate) fn restore_unsent(&self, sent: Vec<(u64, Counts)>) {
        let mut recorded = self.lock();
        for (bucket, counts) in sent {
            match recorded.unsent.iter_mut().find(|(number, _)| *number == bucket) {
                Some((_, held)) => held.add(&counts),
                None => recorded.unsent.push((bucket, counts)),
            }
        }
    }

    /// Takes the every-router totals the ledger answered: each bucket's
    /// counts become the total plus what was drained here since it was sent.
    pub(crate) fn apply_totals(&self, totals: &[(u64, Counts)], oldest: u64, whole: bool) {
        let mut recorded = self.lock();
        for (bucket, total) in totals.iter().filter(|(bucket, _)| *bucket >= oldest && *bucket != 0) {
            let mut merged = *total;
            if let Some((_, since)) = recorded.unsent.iter().find(|(number, _)| number == bucket) {
                merged.add(since);
            }
            if merged.is_empty() && recorded.hours.is_empty() {
                // Nothing to keep: the ring stays unallocated for an idle slot.
                continue;
            }
            *recorded.hour_mut(*bucket) = merged;
        }
        if whole {
            recorded.fetched = true;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A poisoned lock only means a reader panicked; the counts are still counts.
        self.recorded.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The history's clock: bucket and slice numbers from wall-clock epoch ms,
/// so every router numbers the same hour alike and bucket `n % 24` is the
/// hour of the day (UTC, with hourly buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// A bucket's length (`--routing-history-bucket-ms`; an hour by default).
    pub bucket_ms: u64,
}

impl Clock {
    pub fn new(bucket: Duration) -> Self {
        Self {
            bucket_ms: u64::try_from(bucket.as_millis()).unwrap_or(u64::MAX).max(1),
        }
    }

    /// "The last minute": a 60th of a bucket, within 500 ms..=60 s.
    pub fn recent_ms(&self) -> u64 {
        (self.bucket_ms / 60).clamp(500, 60_000)
    }

    /// A recent slice's length, and the learning task's tick.
    pub fn tick_ms(&self) -> u64 {
        (self.recent_ms() / RECENT_SLICES as u64).max(1)
    }

    pub fn bucket(&self, epoch_ms: u64) -> u64 {
        epoch_ms / self.bucket_ms
    }

    pub fn slice(&self, epoch_ms: u64) -> u64 {
        epoch_ms / self.tick_ms()
    }

    /// The first ms of bucket `number`.
    pub fn bucket_start_ms(&self, number: u64) -> u64 {
        number.saturating_mul(self.bucket_ms)
    }

    /// The first ms of slice `number`.
    pub fn slice_start_ms(&self, number: u64) -> u64 {
        number.saturating_mul(self.tick_ms())
    }

    /// The oldest bucket kept at `bucket`.
    pub fn oldest(&self, bucket: u64) -> u64 {
        bucket.saturating_sub(HOURS as u64 - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_bins_double_from_half_a_millisecond() {
        assert_eq!(bin_of(Duration::from_micros(100)), 0);
        assert_eq!(bin_of(Duration::from_micros(500)), 1);
        assert_eq!(bin_of(Duration::from_micros(999)), 1);
        assert_eq!(bin_of(Duration::from_millis(1)), 2);
        assert_eq!(bin_of(Duration::from_millis(5)), 4);
        assert_eq!(bin_of(Duration::from_millis(50)), 7);
        assert_eq!(bin_of(Duration::from_secs(60)), LATENCY_BINS - 1);
        let middle = bin_middle_us(bin_of(Duration::from_millis(5)));
        assert!((4_000..8_000).contains(&middle), "{middle}");
    }

    #[test]
    fn an_idle_slot_holds_no_week_of_buckets() {
        let history = History::new();
        history.drain(1000, 7, false);
        history.apply_totals(&[(1000, Counts::default())], 900, true);
        history.with(|recorded| {
            assert!(recorded.hours.is_empty(), "nothing counted, nothing allocated");
            assert!(recorded.hour(1000).is_none());
        });
        history.record(Kind::Succeeded, Some(Duration::from_millis(1)));
        history.drain(1000, 7, false);
        history.with(|recorded| {
            assert_eq!(recorded.hours.len(), HOURS);
            assert_eq!(recorded.hour(1000).unwrap().calls(), 1);
        });
    }

    #[test]
    fn drained_counts_land_in_their_bucket_and_slice_and_wrap_after_a_week() {
        let history = History::new();
        history.record(Kind::Succeeded, Some(Duration::from_millis(5)));
        history.record(Kind::ServerError, None);
        history.drain(1000, 7, false);
        history.with(|recorded| {
            let hour = recorded.hour(1000).unwrap();
            assert_eq!((hour.calls(), hour.failures()), (2, 1));
            assert_eq!(recorded.slice(7).unwrap().calls(), 2);
            assert!(recorded.hour(1000 - HOURS as u64).is_none());
        });
        history.record(Kind::Timeout, None);
        history.drain(1000 + HOURS as u64, 8, false);
        history.with(|recorded| {
            assert!(recorded.hour(1000).is_none(), "a week later the slot is reused");
            assert_eq!(recorded.hour(1000 + HOURS as u64).unwrap().calls(), 1);
            assert!(recorded.unsent.is_empty(), "nothing kept to send without a ledger");
        });
    }

    #[test]
    fn totals_replace_buckets_and_keep_what_was_drained_since() {
        let history = History::new();
        history.record(Kind::Succeeded, None);
        history.drain(50, 1, true);
        let (sent, whole) = history.take_unsent(0);
        assert!(whole);
        assert_eq!(sent.len(), 1);
        // Drained while the exchange was in flight.
        history.record(Kind::ServerError, None);
        history.drain(50, 2, true);
        let mut total = Counts::default();
        total.words[Kind::Succeeded as usize] = 7;
        history.apply_totals(&[(50, total)], 0, whole);
        history.with(|recorded| {
            let hour = recorded.hour(50).unwrap();
            assert_eq!((hour.calls(), hour.failures()), (8, 1));
            assert!(recorded.fetched);
        });
        // A failed exchange gives its counts back.
        let (sent, whole) = history.take_unsent(0);
        assert!(!whole);
        history.restore_unsent(sent);
        assert_eq!(history.take_unsent(0).0[0].1.calls(), 1);
    }

    #[test]
    fn the_clock_compresses_with_the_bucket() {
        let hourly = Clock::new(Duration::from_secs(3600));
        assert_eq!((hourly.recent_ms(), hourly.tick_ms()), (60_000, 10_000));
        assert_eq!(hourly.bucket(2 * 3_600_000 + 5) % DAY, 2);
        let bench = Clock::new(Duration::from_secs(3));
        assert_eq!((bench.recent_ms(), bench.tick_ms()), (500, 83));
        assert_eq!(bench.oldest(1000), 1000 - 167);
    }
}
