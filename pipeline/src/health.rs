//! Passive per-instance health (DESIGN §3): what the router learned from its
//! own calls. Effective weight = static weight × health factor × latency
//! factor; failures cut the health factor at once, successes restore it step
//! by step (as nginx restores `effective_weight`), so a recovering instance
//! gets traffic back gradually. Atomics only.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_reach_proto::Status;

use crate::breaker::{Breaker, BreakerConfig, BreakerState, Transition};
use crate::clock;
use crate::metrics::InstanceMetrics;

/// Full health, in permille.
const FULL: u32 = 1000;
/// The floor a failing instance's health factor falls to (it is never zero, so it can recover).
const FLOOR: u32 = 50;
/// Health regained per success.
const STEP: u32 = 100;
/// Latencies up to twice the fastest candidate's plus this slack count as equally fast:
/// scheduling jitter must not skew the configured weights, only a clearly slow instance
/// (a cold model, a swapping host) should lose traffic.
const LATENCY_SLACK_US: u64 = 20_000;
/// The latency factor never drops below 10 %.
const LATENCY_FLOOR: u64 = 100;
/// Peak-EWMA's time constant (Finagle's and Linkerd's default): a sample
/// weighs `1 - e^(-Δt/τ)` against the value before it, and an instance that
/// gets no sample decays towards 0, so `p2c_ewma` probes it again.
const PEAK_EWMA_TAU_MS: f64 = 10_000.0;

/// Runtime state of one instance, kept across snapshot swaps (keyed by `agent_id`).
#[derive(Debug)]
pub struct InstanceState {
    pub breaker: Breaker,
    health_permille: AtomicU32,
    /// Exponentially weighted moving average of successful latencies, µs (0 = no sample yet).
    ewma_us: AtomicU64,
    /// Peak-EWMA of answered latencies for `p2c_ewma`: the value (µs, high
    /// 32 bits) and when it was set (this process's ms clock, low 32 bits),
    /// one word so a reader never sees one without the other.
    peak_ewma: AtomicU64,
    /// When an attempt last failed or was refused (this process's ms clock; 0: never).
    last_failure_ms: AtomicU64,
    inflight: AtomicU32,
    /// What the agent itself last reported in flight (its heartbeat, through
    /// the registry record): its load from every router and direct caller.
    /// Written by the watch task, read by `least_connections`.
    reported_inflight: AtomicU32,
    metrics: InstanceMetricsHandle,
}

/// Wrapper so `InstanceState` can derive `Debug`.
struct InstanceMetricsHandle(InstanceMetrics);

impl std::fmt::Debug for InstanceMetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InstanceMetrics")
    }
}

/// How an attempt ended, as far as the instance's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// Answered (2xx, or a business error that shows the instance works).
    Healthy(Duration),
    /// "Not now" (429): no breaker failure, but send less.
    Busy,
    /// Unreachable, reset, timed out, 503 or a 5xx: counts towards the breaker.
    Failed,
    /// Ran out of a deadline shorter than this instance ever needs (see
    /// [`InstanceState::fair_budget`]): the caller's choice, not the
    /// instance's fault, so it changes neither health nor breaker. Otherwise
    /// any caller could open every breaker with `timeout_ms: 1`.
    Unjudged,
}

/// Slack on top of twice the smoothed latency before a timeout is the instance's fault.
const FAIR_SLACK: Duration = Duration::from_millis(10);

impl InstanceState {
    pub fn new(metrics: InstanceMetrics) -> Self {
        metrics.breaker_state.set(BreakerState::Closed.gauge_value());
        metrics.inflight.set(0);
        metrics.health_score.set(100);
        Self {
            breaker: Breaker::new(),
            health_permille: AtomicU32::new(FULL),
            ewma_us: AtomicU64::new(0),
            peak_ewma: AtomicU64::new(0),
            last_failure_ms: AtomicU64::new(0),
            inflight: AtomicU32::new(0),
            reported_inflight: AtomicU32::new(0),
            metrics: InstanceMetricsHandle(metrics),
        }
    }

    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// The agent's own last report of its requests in flight (0 when none).
    pub fn reported_inflight(&self) -> u32 {
        self.reported_inflight.load(Ordering::Relaxed)
    }

    pub fn set_reported_inflight(&self, inflight: u32) {
        self.reported_inflight.store(inflight, Ordering::Relaxed);
    }

    /// Counts one request in flight until the guard drops (the gauge follows
    /// on each scrape, `Snapshot::publish_instance_gauges`, not per request).
    pub fn start_request(&self) -> InflightGuard<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightGuard { state: self }
    }

    /// Counts an answer that did not match the capability's output schema.
    pub fn count_output_mismatch(&self) {
        self.metrics.0.output_schema_mismatches.inc();
    }

    pub fn health_permille(&self) -> u32 {
        self.health_permille.load(Ordering::Relaxed)
    }

    pub fn ewma_us(&self) -> u64 {
        self.ewma_us.load(Ordering::Relaxed)
    }

    /// The peak-EWMA latency now (µs; 0 before any answer): the last value
    /// decayed towards 0 by the time since it was set.
    pub fn peak_ewma_us(&self) -> f64 {
        let (value, at) = unpack_peak(self.peak_ewma.load(Ordering::Relaxed));
        decay(value, elapsed_ms(at))
    }

    /// Effective weight in thousandths of a static weight unit.
    pub fn effective_weight(&self, weight: u32, fastest_ewma_us: u64) -> i64 {
        let health = u64::from(self.health_permille());
        let latency = latency_factor(self.ewma_us(), fastest_ewma_us);
        let scaled = u64::from(weight) * health * latency / 1000;
        scaled.max(1) as i64
    }

    /// Records one attempt's outcome; returns the breaker flip, if any, for logging.
    pub fn observe(&self, observation: Observation, breaker: &BreakerConfig) -> Transition {
        let transition = match observation {
            Observation::Healthy(latency) => {
                self.record_latency(latency);
                // Read first: a healthy instance (the common case) is not written to.
                if self.health_permille() < FULL {
                    let _ = self
                        .health_permille
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |health| {
                            Some((health + STEP).min(FULL))
                        });
                }
                self.breaker.on_success()
            }
            Observation::Busy => {
                self.degrade();
                Transition::None
            }
            Observation::Failed => {
                self.degrade();
                self.breaker.on_failure(breaker)
            }
            Observation::Unjudged => Transition::None,
        };
        if transition != Transition::None {
            self.metrics.0.breaker_state.set(self.breaker.state().gauge_value());
        }
        transition
    }

    /// Whether an attempt given `budget` was a fair test of this instance: at
    /// least twice its smoothed latency plus 10 ms. A timeout (or an agent's
    /// 504) within a fair budget counts towards the breaker; within a shorter
    /// one it is [`Observation::Unjudged`]. An instance that never answered
    /// has no latency yet, so any budget above the slack is fair.
    pub fn fair_budget(&self, budget: Duration) -> bool {
        budget >= Duration::from_micros(self.ewma_us().saturating_mul(2)) + FAIR_SLACK
    }

    /// The health factor (permille) with its failures forgiven over time:
    /// the shortfall from full shrinks by `e^(-t/τ)` (τ = 10 s) with the
    /// time since the last failure. `p2c_ewma` weighs by it, so an instance
    /// that failed and then got no traffic is tried again (its peak-EWMA
    /// decays on the same clock) instead of waiting for successes it cannot get.
    pub fn forgiven_health_permille(&self) -> u32 {
        let health = self.health_permille();
        if health >= FULL {
            return FULL;
        }
        forgiven(
            health,
            clock::now_ms().saturating_sub(self.last_failure_ms.load(Ordering::Relaxed)),
        )
    }

    fn degrade(&self) {
        self.last_failure_ms.store(clock::now_ms(), Ordering::Relaxed);
        let _ = self
            .health_permille
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |health| {
                Some((health / 2).max(FLOOR))
            });
    }

    fn record_latency(&self, latency: Duration) {
        let sample = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        self.record_peak(sample);
        let _ = self.ewma_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            // α = 1/8, like TCP's smoothed RTT.
            Some(if old == 0 {
                sample.max(1)
            } else {
                old - old / 8 + sample / 8
            })
        });
    }

    /// Peak-EWMA (Finagle's): a sample above the decayed value replaces it at
    /// once (a slow answer is believed at once); one below is averaged in by
    /// the time since the last sample.
    fn record_peak(&self, sample_us: u64) {
        let now = clock::now_ms() as u32;
        let sample = sample_us.min(u64::from(u32::MAX)) as f64;
        let _ = self
            .peak_ewma
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                let (value, at) = unpack_peak(word);
                let elapsed = f64::from(now.wrapping_sub(at));
                let next = if sample >= value {
                    sample
                } else {
                    let keep = (-elapsed / PEAK_EWMA_TAU_MS).exp();
                    value * keep + sample * (1.0 - keep)
                };
                Some(pack_peak(next, now))
            });
    }

    /// Sets the scrape-time gauges: the health score and the requests in flight.
    pub fn publish(&self, score: i64) {
        self.metrics.0.health_score.set(score);
        self.metrics.0.inflight.set(i64::from(self.inflight()));
    }

    /// Exposes the breaker state after a half-open claim.
    pub fn sync_breaker_metric(&self) {
        self.metrics.0.breaker_state.set(self.breaker.state().gauge_value());
    }
}

fn pack_peak(value_us: f64, at_ms: u32) -> u64 {
    ((value_us.clamp(0.0, f64::from(u32::MAX)) as u64) << 32) | u64::from(at_ms)
}

fn unpack_peak(word: u64) -> (f64, u32) {
    ((word >> 32) as f64, word as u32)
}

/// Milliseconds since `at` on the process clock's low 32 bits (wraps every 49 days).
fn elapsed_ms(at: u32) -> u32 {
    (clock::now_ms() as u32).wrapping_sub(at)
}

/// A health factor `since_ms` after the last failure, its shortfall shrunk by `e^(-t/τ)`.
fn forgiven(health: u32, since_ms: u64) -> u32 {
    let shortfall = f64::from(FULL.saturating_sub(health)) * (-(since_ms as f64) / PEAK_EWMA_TAU_MS).exp();
    FULL - (shortfall.round() as u32).min(FULL)
}

/// `value` decayed towards 0 over `elapsed_ms`.
fn decay(value: f64, elapsed_ms: u32) -> f64 {
    if value == 0.0 {
        return 0.0;
    }
    value * (-f64::from(elapsed_ms) / PEAK_EWMA_TAU_MS).exp()
}

/// Latency factor in permille: 1000 unless this instance is clearly slower than the fastest.
pub fn latency_factor(ewma_us: u64, fastest_ewma_us: u64) -> u64 {
    if ewma_us == 0 {
        return 1000;
    }
    let reference = fastest_ewma_us.saturating_mul(2).saturating_add(LATENCY_SLACK_US);
    if ewma_us <= reference {
        1000
    } else {
        (reference * 1000 / ewma_us).max(LATENCY_FLOOR)
    }
}

// === Health score ===

/// How much an instance's reported status counts towards its health score
/// (the score's freshness factor, see `Snapshot::publish_instance_gauges`),
/// in permille: `ready` 1, `busy` 0.8, `overloaded` 0.5, `starting` and `draining` 0.
pub fn status_permille(status: Status) -> u64 {
    match status {
        Status::Ready => 1000,
        Status::Busy => 800,
        Status::Overloaded => 500,
        Status::Starting | Status::Draining => 0,
    }
}

/// Three permille factors → 0–100.
pub fn health_score(freshness_permille: u64, health_permille: u64, latency_permille: u64) -> i64 {
    let product = freshness_permille.min(1000) * health_permille.min(1000) * latency_permille.min(1000);
    (product / 10_000_000) as i64
}

/// [`InflightGuard`] for a request that outlives the borrow of its instance
/// (a streamed invoke holds its place until the stream ends).
pub struct OwnedInflight(Arc<InstanceState>);

impl InstanceState {
    pub fn start_owned(self: &Arc<Self>) -> OwnedInflight {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        OwnedInflight(self.clone())
    }
}

impl Drop for OwnedInflight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct InflightGuard<'a> {
    state: &'a InstanceState,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.state.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> InstanceState {
        let metrics = crate::metrics::Metrics::new().unwrap();
        InstanceState::new(metrics.instance("a"))
    }

    #[test]
    fn failures_cut_weight_and_successes_restore_it_gradually() {
        let state = state();
        let breaker = BreakerConfig {
            failures: 5,
            open_for: Duration::from_secs(30),
        };
        assert_eq!(state.effective_weight(3, 0), 3000);
        state.observe(Observation::Failed, &breaker);
        state.observe(Observation::Failed, &breaker);
        assert_eq!(state.effective_weight(3, 0), 750);
        state.observe(Observation::Healthy(Duration::from_millis(1)), &breaker);
        assert_eq!(state.effective_weight(3, 0), 1050);
        for _ in 0..10 {
            state.observe(Observation::Healthy(Duration::from_millis(1)), &breaker);
        }
        assert_eq!(state.effective_weight(3, 1000), 3000);
    }

    #[test]
    fn health_score_combines_freshness_errors_and_latency() {
        assert_eq!(health_score(1000, 1000, 1000), 100);
        assert_eq!(health_score(1000, 500, 1000), 50, "one failure halves it");
        assert_eq!(health_score(500, 1000, 1000), 50, "overloaded or half-stale");
        assert_eq!(health_score(1000, 1000, 100), 10, "clearly slow");
        assert_eq!(health_score(0, 1000, 1000), 0, "draining or stale");
        let state = state();
        assert_eq!(state.metrics.0.health_score.get(), 100, "new instances start healthy");
    }

    #[test]
    fn peak_ewma_takes_peaks_at_once_and_decays_towards_zero() {
        let state = state();
        assert_eq!(state.peak_ewma_us(), 0.0, "no answer yet: the cheapest");
        state.record_peak(1_000);
        state.record_peak(50_000);
        assert!(state.peak_ewma_us() > 49_000.0, "a peak is believed at once");
        // A fast sample right after barely moves it (little time passed).
        state.record_peak(1_000);
        assert!(state.peak_ewma_us() > 40_000.0);
        assert!(decay(50_000.0, 10_000) < 18_500.0, "one τ later: e^-1 of it");
        assert!(decay(50_000.0, 60_000) < 200.0, "an idle instance is probed again");
    }

    #[test]
    fn failures_are_forgiven_over_time_for_p2c() {
        let state = state();
        let breaker = BreakerConfig {
            failures: 100,
            open_for: Duration::from_secs(30),
        };
        assert_eq!(state.forgiven_health_permille(), FULL);
        for _ in 0..5 {
            state.observe(Observation::Failed, &breaker);
        }
        assert_eq!(state.health_permille(), FLOOR);
        assert!(
            state.forgiven_health_permille() <= FLOOR + 10,
            "just failed: not forgiven"
        );
        // Ten seconds later, two thirds of the shortfall are forgiven.
        let later = forgiven(FLOOR, 10_000);
        assert!((640..=660).contains(&later), "{later}");
        assert_eq!(forgiven(FLOOR, 600_000), FULL);
        assert_eq!(
            state.health_permille(),
            FLOOR,
            "the other policies' health is unchanged"
        );
    }

    #[test]
    fn only_clearly_slow_instances_lose_weight() {
        assert_eq!(latency_factor(300, 200), 1000, "loopback jitter is ignored");
        assert_eq!(latency_factor(15_000, 1_000), 1000, "a scheduling hiccup is ignored");
        assert_eq!(latency_factor(0, 200), 1000);
        assert_eq!(latency_factor(1_000_000, 0), 100);
        assert!(latency_factor(500_000, 1_000) <= 100);
    }
}
