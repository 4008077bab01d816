//! Retry policy (DESIGN §3): which failures may be retried, the exponential
//! backoff with full jitter, and the retry budget that keeps retries from
//! amplifying an outage (retries ≤ `percent` % of requests, plus a floor of
//! `floor` retries per second that is always available).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;

use crate::clock;

/// First backoff ceiling; doubles per retry.
const BASE_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(200);
/// Budget tokens are counted in thousandths so percentages stay integral.
const TOKEN: i64 = 1000;
/// Unused budget saved up at most this many retries (a burst allowance).
const MAX_SAVED_RETRIES: i64 = 1000;

/// Why an attempt may be retried on another instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The connection could not be made (refused, unreachable): the request was never sent.
    Connect,
    /// The connection failed before any response arrived.
    Reset,
    /// The instance answered 503.
    Unavailable,
    /// The instance answered 429.
    Overloaded,
    /// The instance refused this router's assertion (401 `UNAUTHENTICATED`):
    /// it did not run the call.
    Refused,
}

impl RetryReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Connect => "connect",
            RetryReason::Reset => "reset",
            RetryReason::Unavailable => "unavailable_503",
            RetryReason::Overloaded => "overloaded_429",
            RetryReason::Refused => "refused_401",
        }
    }
}

/// Full-jitter exponential backoff before retry number `retry` (1-based).
pub fn backoff(retry: u32) -> Duration {
    let ceiling = BASE_BACKOFF
        .saturating_mul(1u32 << retry.saturating_sub(1).min(10))
        .min(MAX_BACKOFF);
    let micros = rand::thread_rng().gen_range(0..=ceiling.as_micros() as u64);
    Duration::from_micros(micros)
}

/// A lock-free token bucket: each request deposits `percent`/100 of a retry,
/// each retry withdraws one; `floor` retries per second are added by time.
#[derive(Debug)]
pub struct RetryBudget {
    balance: AtomicI64,
    percent: i64,
    floor_per_s: i64,
    last_refill_s: AtomicU64,
}

impl RetryBudget {
    pub fn new(percent: u32, floor_per_s: u32) -> Self {
        Self {
            balance: AtomicI64::new(i64::from(floor_per_s) * TOKEN),
            percent: i64::from(percent),
            floor_per_s: i64::from(floor_per_s),
            last_refill_s: AtomicU64::new(clock::now_ms() / 1000),
        }
    }

    /// Called once per request.
    pub fn deposit(&self) {
        self.add(self.percent * TOKEN / 100);
    }

    /// Takes one retry from the budget, if any is left.
    pub fn try_withdraw(&self) -> bool {
        self.refill();
        self.balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |balance| {
                (balance >= TOKEN).then_some(balance - TOKEN)
            })
            .is_ok()
    }

    fn refill(&self) {
        let now_s = clock::now_ms() / 1000;
        let last = self.last_refill_s.load(Ordering::Acquire);
        if now_s > last
            && self
                .last_refill_s
                .compare_exchange(last, now_s, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let seconds = (now_s - last).min(60) as i64;
            self.add(seconds * self.floor_per_s * TOKEN);
        }
    }

    fn add(&self, amount: i64) {
        let cap = MAX_SAVED_RETRIES * TOKEN;
        // Every request deposits: once the budget is full (no retries lately),
        // read only, so the counter is not a cache line written from every core.
        if self.balance.load(Ordering::Acquire) >= cap {
            return;
        }
        let _ = self
            .balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |balance| {
                Some((balance + amount).min(cap))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        for retry in 1..20 {
            assert!(backoff(retry) <= MAX_BACKOFF);
        }
        assert!(backoff(1) <= BASE_BACKOFF);
    }

    #[test]
    fn budget_allows_the_floor_then_a_share_of_requests() {
        let budget = RetryBudget::new(20, 2);
        assert!(budget.try_withdraw());
        assert!(budget.try_withdraw());
        assert!(!budget.try_withdraw(), "floor spent");
        for _ in 0..10 {
            budget.deposit();
        }
        assert!(budget.try_withdraw());
        assert!(budget.try_withdraw());
        assert!(!budget.try_withdraw(), "20 % of 10 requests is 2 retries");
    }
}
