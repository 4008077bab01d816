//! Per-instance circuit breaker (DESIGN §3): `failures` consecutive failures
//! open it; after `open_for` one probe is let through (half-open); the probe's
//! success closes it, its failure opens it again. Atomics only: the request
//! path never takes a lock to consult or update a breaker.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::clock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `agent_reach_router_breaker_state` gauge.
    pub fn gauge_value(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    pub failures: u32,
    pub open_for: Duration,
}

/// What a recorded outcome changed, so the caller logs and exports only flips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    Opened,
    Closed,
}

#[derive(Debug)]
pub struct Breaker {
    state: AtomicU8,
    consecutive_failures: AtomicU32,
    opened_at_ms: AtomicU64,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new()
    }
}

impl Breaker {
    pub fn new() -> Self {
        Self {
            state: AtomicU8::new(BreakerState::Closed.as_u8()),
            consecutive_failures: AtomicU32::new(0),
            opened_at_ms: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Could a request go to this instance now (without claiming the probe)?
    pub fn is_available(&self, config: &BreakerConfig) -> bool {
        match self.state() {
            BreakerState::Closed => true,
            BreakerState::Open => self.open_elapsed(config),
            BreakerState::HalfOpen => false,
        }
    }

    /// Claims the right to send a request: always when closed; when open and
    /// the wait is over, exactly one caller wins the half-open probe.
    pub fn try_acquire(&self, config: &BreakerConfig) -> bool {
        match self.state() {
            BreakerState::Closed => true,
            BreakerState::Open if self.open_elapsed(config) => self
                .state
                .compare_exchange(
                    BreakerState::Open.as_u8(),
                    BreakerState::HalfOpen.as_u8(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok(),
            _ => false,
        }
    }

    fn open_elapsed(&self, config: &BreakerConfig) -> bool {
        let opened = self.opened_at_ms.load(Ordering::Acquire);
        clock::now_ms().saturating_sub(opened) >= config.open_for.as_millis() as u64
    }

    pub fn on_success(&self) -> Transition {
        // Every request ends here: read before writing, so a healthy instance's
        // breaker stays a shared cache line instead of bouncing between cores.
        if self.consecutive_failures.load(Ordering::Acquire) != 0 {
            self.consecutive_failures.store(0, Ordering::Release);
        }
        if self.state.load(Ordering::Acquire) == BreakerState::Closed.as_u8() {
            return Transition::None;
        }
        let previous = self.state.swap(BreakerState::Closed.as_u8(), Ordering::AcqRel);
        if previous == BreakerState::Closed.as_u8() {
            Transition::None
        } else {
            Transition::Closed
        }
    }

    pub fn on_failure(&self, config: &BreakerConfig) -> Transition {
        let failures = self
            .consecutive_failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        match self.state() {
            BreakerState::HalfOpen => {
                // The probe failed: wait a full period again.
                self.open_now();
                Transition::Opened
            }
            BreakerState::Closed if failures >= config.failures => {
                if self
                    .state
                    .compare_exchange(
                        BreakerState::Closed.as_u8(),
                        BreakerState::Open.as_u8(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    self.opened_at_ms.store(clock::now_ms(), Ordering::Release);
                    Transition::Opened
                } else {
                    Transition::None
                }
            }
            _ => Transition::None,
        }
    }

    fn open_now(&self) {
        self.opened_at_ms.store(clock::now_ms(), Ordering::Release);
        self.state.store(BreakerState::Open.as_u8(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_probes_once() {
        let config = BreakerConfig {
            failures: 5,
            open_for: Duration::from_millis(0),
        };
        let breaker = Breaker::new();
        for _ in 0..4 {
            assert_eq!(breaker.on_failure(&config), Transition::None);
        }
        breaker.on_success();
        for _ in 0..4 {
            breaker.on_failure(&config);
        }
        assert_eq!(breaker.state(), BreakerState::Closed, "a success resets the count");
        assert_eq!(breaker.on_failure(&config), Transition::Opened);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(breaker.try_acquire(&config), "open_for elapsed: one probe");
        assert!(!breaker.try_acquire(&config), "only one probe");
        assert_eq!(breaker.on_failure(&config), Transition::Opened);
        assert!(breaker.try_acquire(&config));
        assert_eq!(breaker.on_success(), Transition::Closed);
        assert!(breaker.try_acquire(&config));
    }

    #[test]
    fn stays_open_until_the_wait_is_over() {
        let config = BreakerConfig {
            failures: 1,
            open_for: Duration::from_secs(3600),
        };
        let breaker = Breaker::new();
        breaker.on_failure(&config);
        assert!(!breaker.is_available(&config));
        assert!(!breaker.try_acquire(&config));
    }
}
