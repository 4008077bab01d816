//! Limits on runaway callers (DESIGN §8): AI agents loop, so each caller has
//! a token bucket (`rate_per_s`, `burst`) and a bound on calls in flight
//! (`concurrency`) from `acl.yaml`'s `limits:` section, hot-reloaded with the
//! rest of the file. One [`Limiter`] per router serves the synchronous path
//! (a call over a limit is 429 `RATE_LIMITED` with `Retry-After`) and the
//! slow path (a submission spends a token; a delivery waits for a
//! concurrency place instead of failing the task it already accepted).
//!
//! No global lock on the request path: a bucket is found through a per-thread
//! cache (the shared table is locked only when a thread meets a caller for
//! the first time, or after the caller's limit changed), its tokens are
//! behind that one caller's lock (held for a few arithmetic operations, as
//! smooth WRR's per-group lock is) and its in-flight count is an atomic.
//!
//! Across replicas ([`shares`]): a bucket holds this router's *share* of its
//! limit (all of it on a router alone). Routers that share a task store
//! exchange what each of their buckets was asked for, every
//! `--quota-share-ms`, off the request path, and each sets its shares from
//! the answer, so the limits hold for the installation, not per replica.
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach_access::acl::Limit;
use tokio::sync::Notify;

use crate::error::{Code, RouterError};

pub mod shares;

/// One caller's bucket and in-flight count: this router's share of the
/// caller's limit, and what it was asked for since the last exchange.
#[derive(Debug)]
pub struct Bucket {
    limit: Limit,
    tokens: Mutex<Tokens>,
    inflight: AtomicU32,
    /// This router's places of `limit.concurrency`.
    places: AtomicU32,
    /// Demand since the last exchange: calls that asked for a token, calls
    /// refused a place, the most places held at once.
    asked: AtomicU64,
    refused_places: AtomicU32,
    peak: AtomicU32,
    /// Deliveries waiting for a place now.
    waiting: AtomicU32,
    /// When a call last used the bucket (microseconds since the limiter's start).
    used_us: AtomicU64,
    freed: Notify,
}

/// A bucket's tokens and this router's share of the rate and the burst.
#[derive(Debug, Clone, Copy)]
struct Tokens {
    tokens: f64,
    /// Microseconds since the limiter's start when they were last refilled.
    refilled_us: u64,
    rate: f64,
    burst: f64,
}

/// Why a call was refused, and when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Rate { retry_after: Duration },
    Concurrency,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Rate { .. } => "rate",
            Refusal::Concurrency => "concurrency",
        }
    }

    /// Whole seconds, at least one, for the `Retry-After` header.
    pub fn retry_after_s(self) -> u64 {
        match self {
            Refusal::Rate { retry_after } => retry_after.as_secs_f64().ceil().max(1.0) as u64,
            Refusal::Concurrency => 1,
        }
    }
}

/// A call in flight for its caller (and its tenant, under a quota); dropping
/// it frees the places.
#[derive(Debug)]
pub struct Permit {
    bucket: Option<Arc<Bucket>>,
    /// The tenant's place, when its quota bounds concurrency.
    tenant: Option<Arc<Bucket>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        for bucket in [self.bucket.take(), self.tenant.take()].into_iter().flatten() {
            if bucket.limit.concurrency.is_some() {
                bucket.inflight.fetch_sub(1, Ordering::AcqRel);
                bucket.freed.notify_one();
            }
        }
    }
}

impl Permit {
    /// A permit for a caller without limits.
    pub fn unlimited() -> Self {
        Self {
            bucket: None,
            tenant: None,
        }
    }

    /// This caller's permit holding its tenant's place too.
    pub fn with_tenant(mut self, mut tenant: Permit) -> Self {
        self.tenant = tenant.bucket.take();
        self
    }
}

impl Bucket {
    /// A full bucket holding `fraction` of `limit` (1: a router alone).
    fn new(limit: Limit, now_us: u64, fraction: f64) -> Self {
        let share = shares::Share::fraction_of(&limit, fraction);
        Self {
            tokens: Mutex::new(Tokens {
                tokens: share.burst,
                refilled_us: now_us,
                rate: share.rate,
                burst: share.burst,
            }),
            inflight: AtomicU32::new(0),
            places: AtomicU32::new(share.places),
            asked: AtomicU64::new(0),
            refused_places: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            used_us: AtomicU64::new(now_us),
            freed: Notify::new(),
            limit,
        }
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, Tokens> {
        // Every update completes before the guard drops; a poisoned lock holds a consistent state.
        self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Spends one token, refilling first; `Err` says how long until one is there.
    fn spend(&self, now_us: u64) -> Result<(), Duration> {
        if self.limit.rate_per_s.is_none() {
            return Ok(());
        }
        self.asked.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock_tokens();
        state.refill(now_us);
        if state.tokens < 1.0 {
            // A share of nothing (other routers hold the whole rate) waits for the next exchange.
            let wait_s = if state.rate > 0.0 {
                (1.0 - state.tokens) / state.rate
            } else {
                1.0
            };
            return Err(Duration::from_secs_f64(wait_s));
        }
        state.tokens -= 1.0;
        Ok(())
    }

    /// Takes a place in flight when one is free.
    fn try_enter(&self) -> bool {
        if self.limit.concurrency.is_none() {
            return true;
        }
        let bound = self.places.load(Ordering::Acquire);
        match self
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |inflight| {
                (inflight < bound).then_some(inflight + 1)
            }) {
            Ok(before) => {
                self.peak.fetch_max(before + 1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.refused_places.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Sets this router's share (the tokens refilled at the old rate first,
    /// and never more than the new burst).
    fn set_share(&self, share: shares::Share, now_us: u64) {
        {
            let mut state = self.lock_tokens();
            state.refill(now_us);
            state.rate = share.rate;
            state.burst = share.burst;
            state.tokens = state.tokens.min(share.burst);
        }
        let before = self.places.swap(share.places, Ordering::AcqRel);
        if share.places > before {
            self.freed.notify_waiters();
        }
    }

    /// What this bucket was asked for since the last call: calls asking for
    /// a token, and places wanted (the most held, plus those refused or
    /// waited for, at most the limit).
    fn take_demand(&self) -> (u64, u32) {
        let asked = self.asked.swap(0, Ordering::Relaxed);
        let inflight = self.inflight.load(Ordering::Acquire);
        let peak = self.peak.swap(inflight, Ordering::Relaxed).max(inflight);
        let wanted = peak
            .saturating_add(self.refused_places.swap(0, Ordering::Relaxed))
            .saturating_add(self.waiting.load(Ordering::Relaxed));
        (asked, wanted.min(self.limit.concurrency.unwrap_or(0)))
    }
}

impl Tokens {
    fn refill(&mut self, now_us: u64) {
        let elapsed_s = now_us.saturating_sub(self.refilled_us) as f64 / 1e6;
        self.tokens = (self.tokens + elapsed_s * self.rate).min(self.burst);
        self.refilled_us = now_us.max(self.refilled_us);
    }
}

/// A thread's view of the buckets: (limiter id, caller) → bucket.
type ThreadBuckets = ahash::AHashMap<(u64, Arc<str>), Arc<Bucket>>;

thread_local! {
    static BUCKETS: RefCell<ThreadBuckets> = RefCell::new(ThreadBuckets::new());
}

/// Buckets a thread keeps before clearing its view (bounds memory under caller churn).
const THREAD_CAPACITY: usize = 4096;

static NEXT_LIMITER: AtomicU64 = AtomicU64::new(1);

/// Every caller's bucket on this router (or, for tenants' quotas, every tenant's).
pub struct Limiter {
    id: u64,
    started: Instant,
    buckets: Mutex<ahash::AHashMap<Arc<str>, Arc<Bucket>>>,
    refused: prometheus::IntCounterVec,
    /// Whose buckets: callers' (`acl.yaml` limits) or tenants' (the tenant map's quotas).
    scope: Scope,
    /// Routers sharing the limits, as the last exchange counted them (1:
    /// alone, or no exchange yet); a new bucket starts with its equal share.
    routers: AtomicU32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Callers,
    Tenants,
}

impl Limiter {
    pub fn new(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let refused = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "agent_reach_router_rate_limited_total",
                "Calls refused 429 RATE_LIMITED, by caller and the limit that refused them (rate, concurrency).",
            ),
            &["caller", "limit"],
        )?;
        registry.register(Box::new(refused.clone()))?;
        Ok(Self::with_counter(refused, Scope::Callers))
    }

    /// The tenants' quotas, counting refusals in `callers`' counter (with caller `*`).
    pub fn for_tenants(callers: &Limiter) -> Self {
        Self::with_counter(callers.refused.clone(), Scope::Tenants)
    }

    fn with_counter(refused: prometheus::IntCounterVec, scope: Scope) -> Self {
        Self {
            id: NEXT_LIMITER.fetch_add(1, Ordering::Relaxed),
            started: Instant::now(),
            buckets: Mutex::new(ahash::AHashMap::new()),
            refused,
            scope,
            routers: AtomicU32::new(1),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// `caller`'s bucket for `limit`, made anew when the limit changed.
    fn bucket(&self, caller: &Arc<str>, limit: &Limit) -> Arc<Bucket> {
        let key = (self.id, caller.clone());
        let cached = BUCKETS.with(|buckets| buckets.borrow().get(&key).cloned());
        if let Some(bucket) = cached.filter(|bucket| bucket.limit == *limit) {
            bucket.used_us.store(self.now_us(), Ordering::Relaxed);
            return bucket;
        }
        let bucket = {
            let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match buckets.get(caller) {
                Some(bucket) if bucket.limit == *limit => bucket.clone(),
                _ => {
                    let fraction = 1.0 / f64::from(self.routers.load(Ordering::Relaxed).max(1));
                    let bucket = Arc::new(Bucket::new(*limit, self.now_us(), fraction));
                    buckets.insert(caller.clone(), bucket.clone());
                    bucket
                }
            }
        };
        BUCKETS.with(|buckets| {
            let mut buckets = buckets.borrow_mut();
            if buckets.len() >= THREAD_CAPACITY {
                buckets.clear();
            }
            buckets.insert(key, bucket.clone());
        });
        bucket
    }

    /// A synchronous call: spends a token and takes a place in flight, or
    /// refuses with 429 `RATE_LIMITED`.
    pub fn admit_call(&self, caller: &Arc<str>, limit: Option<&Limit>) -> Result<Permit, RouterError> {
        let Some(limit) = limit else {
            return Ok(Permit::unlimited());
        };
        let bucket = self.bucket(caller, limit);
        if let Err(retry_after) = bucket.spend(self.now_us()) {
            return Err(self.refuse(caller, limit, Refusal::Rate { retry_after }));
        }
        if !bucket.try_enter() {
            return Err(self.refuse(caller, limit, Refusal::Concurrency));
        }
        Ok(Permit {
            bucket: Some(bucket),
            tenant: None,
        })
    }

    /// A task submission: spends a token (its delivery counts in flight later).
    pub fn admit_submission(&self, caller: &Arc<str>, limit: Option<&Limit>) -> Result<(), RouterError> {
        let Some(limit) = limit else {
            return Ok(());
        };
        self.bucket(caller, limit)
            .spend(self.now_us())
            .map_err(|retry_after| self.refuse(caller, limit, Refusal::Rate { retry_after }))
    }

    /// A task delivery: waits for a place in flight (the task is already
    /// accepted; refusing it would only fail it).
    pub async fn enter_delivery(&self, caller: &Arc<str>, limit: Option<&Limit>) -> Permit {
        let Some(limit) = limit else {
            return Permit::unlimited();
        };
        let bucket = self.bucket(caller, limit);
        let mut waiting = None;
        loop {
            {
                let freed = bucket.freed.notified();
                if !bucket.try_enter() {
                    // Counted as wanted places while it waits (the exchange reads it).
                    waiting.get_or_insert_with(|| Waiting::on(&bucket));
                    // A bounded wait: a place freed by a bucket replaced meanwhile wakes nobody.
                    let _ = tokio::time::timeout(Duration::from_millis(200), freed).await;
                    continue;
                }
            }
            drop(waiting);
            return Permit {
                bucket: Some(bucket),
                tenant: None,
            };
        }
    }

    fn refuse(&self, caller: &str, limit: &Limit, refusal: Refusal) -> RouterError {
        if self.scope == Scope::Tenants {
            return self.refuse_tenant(caller, limit, refusal);
        }
        self.refused.with_label_values(&[caller, refusal.as_str()]).inc();
        let message = match refusal {
            Refusal::Rate { .. } => format!(
                "caller `{caller}` is over its rate limit ({} requests/s, burst {}; acl.yaml limits); retry after {} s",
                limit.rate_per_s.unwrap_or_default(),
                limit.burst,
                refusal.retry_after_s()
            ),
            Refusal::Concurrency => format!(
                "caller `{caller}` has {} calls in flight, its limit (acl.yaml limits); retry when one ends",
                limit.concurrency.unwrap_or_default()
            ),
        };
        RouterError::new(Code::RateLimited, message).with_details(serde_json::json!({
            "caller": caller,
            "limit": refusal.as_str(),
            "retry_after_s": refusal.retry_after_s(),
        }))
    }
}

/// A delivery waiting for a place in `bucket`, counted until it is dropped.
struct Waiting(Arc<Bucket>);

impl Waiting {
    fn on(bucket: &Arc<Bucket>) -> Self {
        bucket.waiting.fetch_add(1, Ordering::Relaxed);
        Self(bucket.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Limiter {
    /// The buckets a call used within `recent` (the ones worth an exchange),
    /// by caller (or tenant).
    fn active(&self, recent: Duration) -> Vec<(Arc<str>, Arc<Bucket>)> {
        let since = self
            .now_us()
            .saturating_sub(u64::try_from(recent.as_micros()).unwrap_or(u64::MAX));
        let buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        buckets
            .iter()
            .filter(|(_, bucket)| bucket.used_us.load(Ordering::Relaxed) >= since)
            .map(|(caller, bucket)| (caller.clone(), bucket.clone()))
            .collect()
    }
}

impl Limiter {
    /// A tenant over its quota (the tenant map, DESIGN §8).
    fn refuse_tenant(&self, tenant: &str, limit: &Limit, refusal: Refusal) -> RouterError {
        let name = match refusal {
            Refusal::Rate { .. } => "tenant_rate",
            Refusal::Concurrency => "tenant_concurrency",
        };
        self.refused.with_label_values(&["*", name]).inc();
        let message = match refusal {
            Refusal::Rate { .. } => format!(
                "tenant `{tenant}` is over its rate quota ({} requests/s, burst {}; the tenant map); retry after {} s",
                limit.rate_per_s.unwrap_or_default(),
                limit.burst,
                refusal.retry_after_s()
            ),
            Refusal::Concurrency => format!(
                "tenant `{tenant}` has {} calls in flight, its quota (the tenant map); retry when one ends",
                limit.concurrency.unwrap_or_default()
            ),
        };
        RouterError::new(Code::RateLimited, message).with_details(serde_json::json!({
            "tenant": tenant,
            "limit": name,
            "retry_after_s": refusal.retry_after_s(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: Option<f64>, burst: u32, concurrency: Option<u32>) -> Limit {
        Limit {
            rate_per_s: rate,
            burst,
            concurrency,
        }
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refills_at_its_rate() {
        let bucket = Bucket::new(limit(Some(10.0), 3, None), 0, 1.0);
        for _ in 0..3 {
            assert!(bucket.spend(0).is_ok());
        }
        let wait = bucket.spend(0).unwrap_err();
        assert!(
            wait <= Duration::from_millis(100) && wait > Duration::from_millis(90),
            "{wait:?}"
        );
        assert!(bucket.spend(50_000).is_err(), "half a token after 50 ms");
        assert!(bucket.spend(100_000).is_ok(), "one token after 100 ms");
        // Never more than the burst, however long it waited.
        for _ in 0..3 {
            assert!(bucket.spend(60_000_000).is_ok());
        }
        assert!(bucket.spend(60_000_000).is_err());
    }

    #[test]
    fn concurrency_is_bounded_and_freed_by_dropping_the_permit() {
        let limiter = Limiter::new(&prometheus::Registry::new()).unwrap();
        let caller: Arc<str> = "chatty".into();
        let bound = limit(None, 1, Some(2));
        let first = limiter.admit_call(&caller, Some(&bound)).unwrap();
        let _second = limiter.admit_call(&caller, Some(&bound)).unwrap();
        let refused = limiter.admit_call(&caller, Some(&bound)).unwrap_err();
        assert_eq!(refused.code, Code::RateLimited);
        assert_eq!(refused.details.as_ref().unwrap()["limit"], "concurrency");
        drop(first);
        assert!(limiter.admit_call(&caller, Some(&bound)).is_ok());
        // Another caller has its own bucket.
        assert!(limiter.admit_call(&"calm".into(), Some(&bound)).is_ok());
        // No limit, no refusal.
        assert!(limiter.admit_call(&caller, None).is_ok());
    }

    #[test]
    fn a_changed_limit_gets_a_fresh_bucket() {
        let limiter = Limiter::new(&prometheus::Registry::new()).unwrap();
        let caller: Arc<str> = "bulk".into();
        let strict = limit(Some(1.0), 1, None);
        assert!(limiter.admit_call(&caller, Some(&strict)).is_ok());
        let refused = limiter.admit_call(&caller, Some(&strict)).unwrap_err();
        assert_eq!(refused.details.as_ref().unwrap()["limit"], "rate");
        assert!(refused.details.as_ref().unwrap()["retry_after_s"].as_u64().unwrap() >= 1);
        let relaxed = limit(Some(1000.0), 100, None);
        assert!(limiter.admit_call(&caller, Some(&relaxed)).is_ok());
        assert!(limiter.admit_submission(&caller, Some(&relaxed)).is_ok());
    }

    #[test]
    fn a_tenants_quota_refuses_for_the_tenant_and_holds_its_place_in_the_callers_permit() {
        let registry = prometheus::Registry::new();
        let callers = Limiter::new(&registry).unwrap();
        let tenants = Limiter::for_tenants(&callers);
        let tenant: Arc<str> = "team-a".into();
        let quota = limit(None, 1, Some(1));
        let held = callers
            .admit_call(&"billing".into(), None)
            .unwrap()
            .with_tenant(tenants.admit_call(&tenant, Some(&quota)).unwrap());
        let refused = tenants.admit_call(&tenant, Some(&quota)).unwrap_err();
        assert_eq!(refused.code, Code::RateLimited);
        let details = refused.details.as_ref().unwrap();
        assert_eq!(details["tenant"], "team-a");
        assert_eq!(details["limit"], "tenant_concurrency");
        assert!(refused.message.contains("tenant `team-a`"), "{}", refused.message);
        // The caller's permit frees the tenant's place too.
        drop(held);
        assert!(tenants.admit_call(&tenant, Some(&quota)).is_ok());
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains(r#"agent_reach_router_rate_limited_total{caller="*",limit="tenant_concurrency"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_delivery_waits_for_a_place_instead_of_failing() {
        let limiter = Arc::new(Limiter::new(&prometheus::Registry::new()).unwrap());
        let caller: Arc<str> = "slow".into();
        let bound = limit(None, 1, Some(1));
        let held = limiter.admit_call(&caller, Some(&bound)).unwrap();
        let waiting = {
            let (limiter, caller) = (limiter.clone(), caller.clone());
            tokio::spawn(async move { limiter.enter_delivery(&caller, Some(&bound)).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no place yet");
        drop(held);
        let permit = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(
            limiter.admit_call(&caller, Some(&bound)).is_err(),
            "the delivery holds the place"
        );
        drop(permit);
    }
}
