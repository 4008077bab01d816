//! Limits that hold across router replicas (issue 35, point 2).
//!
//! Each router's buckets hold a *share* of their limit. Every `every`
//! (`--quota-share-ms`, 100 ms by default) a router reports, for each bucket
//! a call used in the last [`ACTIVE`], what it was asked for (calls a second,
//! places wanted) to a [`QuotaLedger`] (the task store's Redis), and gets
//! back what every live router reported for the same limit. From that list
//! each router computes every router's share the same way ([`split`]): the
//! limit is divided in proportion to demand when demand exceeds it, and
//! otherwise each router gets what it asked for plus an equal part of what
//! is left. A rate share is taken as computed. Places are whole (apportioned
//! by largest remainder) and *granted* by the ledger: a router asks for its
//! share and holds at most what the other live routers do not hold; the
//! ledger records for it at least what it may still fill until the answer
//! is applied (its places before the exchange, or its calls in flight when
//! more), so the places held never add up to more than the limit. Nothing here is on the request path: a call spends a
//! local token and takes a local place, as on a router alone.
//!
//! Accuracy (what `docs/design.md` §3.10.11 states, and `router/tests/global_quota.rs`
//! measures): under steady demand the admitted rate across routers is the
//! limit's, and its burst is the limit's (each share's burst is at least one
//! token, so at most one token more per router). When demand moves, the
//! rate shares follow within two exchanges. Calls in flight never exceed
//! `concurrency` while every router exchanges within its report's expiry
//! and every router's bucket for the limit has had its first grant. The
//! exception: a bucket new on a router (or unused for [`ACTIVE`]) starts
//! with an equal share, `⌊concurrency / routers⌋`, that no grant covers,
//! until its first exchange (at most `every` later). In that interval calls
//! in flight may exceed the limit by that share for each router whose bucket
//! is new (and a caller's first call may be refused, `Retry-After: 1`, when
//! the share is 0).
//! A router that stops reporting (killed, cut off) holds its share until
//! its report expires (`5 × every`, at least 1 s); the others then take it
//! over. While the ledger is unreachable a router keeps the shares it last
//! had, and a router that has never reached it holds the whole limit (as a
//! router alone).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use agent_reach_access::acl::Limit;
use futures::future::BoxFuture;

use super::Bucket;
use crate::service::RouterService;

/// A bucket used within this long takes part in the exchanges.
pub const ACTIVE: Duration = Duration::from_secs(60);

/// The default exchange interval (`--quota-share-ms`).
pub const DEFAULT_EVERY: Duration = Duration::from_millis(100);

/// One limit's demand on this router, as it is reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    /// The limit's name among this tenant's: `caller:NAME` (an `acl.yaml`
    /// limit) or `tenant` (the tenant map's quota).
    pub key: String,
    /// Calls a second that asked for a token (admitted or not).
    pub rate: f64,
    /// Places wanted at once.
    pub places: u32,
    /// The limit's places (`concurrency`; 0: none).
    pub limit: u32,
    /// The places this router would hold: its share by the last answer.
    pub target: u32,
    /// The places it may fill until the answer is applied: its places
    /// now, or the calls in flight when more.
    pub holding: u32,
}

/// What one live router reported for a limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    pub router: String,
    pub rate: f64,
    pub places: u32,
}

/// The ledger's answer to an exchange.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exchanged {
    /// Routers that reported within their expiry (any limit, or none).
    pub routers: u32,
    /// For each demand reported, in order.
    pub limits: Vec<Answered>,
}

/// The ledger's answer for one limit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Answered {
    /// Every live router's report of the limit, this router's included.
    pub reports: Vec<Reported>,
    /// The places this router may hold: at most its target, and never more
    /// than the other live routers leave of the limit.
    pub granted: u32,
}

/// Where routers meet to share their limits: one call an exchange, off the
/// request path. The task store implements it on Redis.
pub trait QuotaLedger: Send + Sync + 'static {
    /// Records `router`'s `demands` (each kept `ttl`), grants it places
    /// (never more than the other live routers leave of each limit) and
    /// answers every live router's reports of the same limits.
    fn exchange<'a>(
        &'a self,
        router: &'a str,
        demands: &'a [Demand],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Exchanged, String>>;
}

/// This router's share of a limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Tokens a second.
    pub rate: f64,
    /// The bucket's depth (at least one token).
    pub burst: f64,
    /// Places in flight.
    pub places: u32,
}

impl Share {
    /// `fraction` of `limit` (1: all of it): a new bucket's share before
    /// its first exchange.
    pub(super) fn fraction_of(limit: &Limit, fraction: f64) -> Self {
        let fraction = fraction.clamp(0.0, 1.0);
        let rate = limit.rate_per_s.unwrap_or(0.0);
        let concurrency = limit.concurrency.unwrap_or(0);
        Self {
            rate: rate * fraction,
            burst: (f64::from(limit.burst) * fraction).max(1.0),
            // Whole places, never more than the fraction; all of them when alone.
            places: if fraction >= 1.0 {
                concurrency
            } else {
                (f64::from(concurrency) * fraction).floor() as u32
            },
        }
    }
}

/// `me`'s share of `limit` given every live router's report (`me`'s among
/// them; when it is missing, `me` counts as asking for nothing).
pub fn split(limit: &Limit, me: &str, reports: &[Reported]) -> Share {
    let mine = reports.iter().find(|report| report.router == me);
    let rates: Vec<f64> = reports.iter().map(|report| report.rate.max(0.0)).collect();
    let rate_limit = limit.rate_per_s.unwrap_or(0.0);
    let rate = divide(rate_limit, mine.map_or(0.0, |report| report.rate.max(0.0)), &rates);
    let fraction = if rate_limit > 0.0 { rate / rate_limit } else { 0.0 };
    Share {
        rate,
        burst: (f64::from(limit.burst) * fraction).max(1.0),
        places: places_of(limit.concurrency.unwrap_or(0), me, reports),
    }
}

/// A router's part of `total` when it asks `mine` and all (it included) ask
/// `all`: in proportion when they ask more than there is, else what it asked
/// plus an equal part of what is left.
fn divide(total: f64, mine: f64, all: &[f64]) -> f64 {
    let asked: f64 = all.iter().sum();
    if all.is_empty() {
        return total;
    }
    if asked >= total {
        return if asked > 0.0 { total * mine / asked } else { 0.0 };
    }
    mine + (total - asked) / all.len() as f64
}

/// `me`'s whole places of `total`: every router's part by [`divide`],
/// floored, the places left going one each to the largest remainders (ties
/// by router name), so every router computing it from the same reports
/// gets shares adding up to `total`.
fn places_of(total: u32, me: &str, reports: &[Reported]) -> u32 {
    if reports.is_empty() {
        return total;
    }
    let all: Vec<f64> = reports.iter().map(|report| f64::from(report.places)).collect();
    let parts: Vec<(f64, &str)> = reports
        .iter()
        .map(|report| {
            (
                divide(f64::from(total), f64::from(report.places), &all),
                report.router.as_str(),
            )
        })
        .collect();
    let floors: u32 = parts.iter().map(|(part, _)| part.floor() as u32).sum();
    let mut left = total.saturating_sub(floors);
    let mut by_remainder: Vec<&(f64, &str)> = parts.iter().collect();
    by_remainder.sort_by(|a, b| {
        let (ra, rb) = (a.0 - a.0.floor(), b.0 - b.0.floor());
        rb.total_cmp(&ra).then_with(|| a.1.cmp(b.1))
    });
    let mut mine = parts
        .iter()
        .find(|(_, router)| *router == me)
        .map_or(0, |(part, _)| part.floor() as u32);
    for (_, router) in by_remainder {
        if left == 0 {
            break;
        }
        left -= 1;
        if *router == me {
            mine += 1;
        }
    }
    mine
}

/// One bucket taking part in an exchange.
struct Entry {
    limiter: usize,
    bucket: Arc<Bucket>,
}

/// What the loop keeps of a limit between exchanges.
struct Kept {
    /// Smoothed rate demand (one exchange's count is noisy).
    rate: f64,
    /// The places to ask for: the share by the last answer.
    target: u32,
    bucket: Arc<Bucket>,
    limiter: usize,
}

/// Exchanges `service`'s demand through `ledger` every `every` until the
/// service is dropped, setting its buckets' shares from the answers.
pub(crate) async fn run(service: Weak<RouterService>, ledger: Arc<dyn QuotaLedger>, every: Duration) {
    let router = format!("{:016x}", rand::random::<u64>());
    let ttl = (every * 5).max(Duration::from_secs(1));
    let mut kept: ahash::AHashMap<String, Kept> = ahash::AHashMap::new();
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    let mut failing = false;
    loop {
        ticker.tick().await;
        let Some(service) = service.upgrade() else {
            return;
        };
        let elapsed_s = last.elapsed().as_secs_f64().max(1e-3);
        last = Instant::now();
        let limiters = service.admission().limiters();
        let mut entries = Vec::new();
        let mut demands = Vec::new();
        for (index, limiter) in limiters.iter().enumerate() {
            for (name, bucket) in limiter.active(ACTIVE) {
                let key = match limiter.scope {
                    super::Scope::Callers => format!("caller:{name}"),
                    super::Scope::Tenants => "tenant".to_string(),
                };
                let (asked, places) = bucket.take_demand();
                let now = asked as f64 / elapsed_s;
                let known = kept.get(&key).filter(|known| Arc::ptr_eq(&known.bucket, &bucket));
                let rate = known.map_or(now, |known| 0.5 * known.rate + 0.5 * now);
                let target = known.map_or_else(|| bucket.places.load(Ordering::Acquire), |known| known.target);
                kept.insert(
                    key.clone(),
                    Kept {
                        rate,
                        target,
                        bucket: bucket.clone(),
                        limiter: index,
                    },
                );
                demands.push(Demand {
                    key,
                    rate,
                    places,
                    limit: bucket.limit.concurrency.unwrap_or(0),
                    target,
                    // What the router may fill until this exchange's answer
                    // is applied: its places now (or more, when calls took
                    // them before a share shrank). Reporting only the calls
                    // in flight let the others take a place this router
                    // could still fill before the answer came back.
                    holding: bucket
                        .places
                        .load(Ordering::Acquire)
                        .max(bucket.inflight.load(Ordering::Acquire)),
                });
                entries.push(Entry { limiter: index, bucket });
            }
        }
        // A bucket out of the exchanges (idle, or replaced by a changed
        // limit) goes back to an equal share: its report expires and the
        // others may take its places.
        kept.retain(|key, known| {
            let still = demands.iter().any(|demand| &demand.key == key);
            if !still {
                if let Some(limiter) = limiters.get(known.limiter) {
                    let fraction = 1.0 / f64::from(limiter.routers.load(Ordering::Relaxed).max(1));
                    known
                        .bucket
                        .set_share(Share::fraction_of(&known.bucket.limit, fraction), limiter.now_us());
                }
            }
            still
        });
        match tokio::time::timeout(ttl, ledger.exchange(&router, &demands, ttl)).await {
            Ok(Ok(answer)) => {
                service.metrics().quota_exchanges.with_label_values(&["ok"]).inc();
                if failing {
                    tracing::info!(message = "Quota shares exchanged again; limits hold across routers.");
                    failing = false;
                }
                for limiter in &limiters {
                    limiter.routers.store(answer.routers.max(1), Ordering::Relaxed);
                }
                for ((entry, demand), answered) in entries.iter().zip(&demands).zip(&answer.limits) {
                    let limiter = limiters[entry.limiter];
                    let share = split(&entry.bucket.limit, &router, &answered.reports);
                    if let Some(known) = kept.get_mut(&demand.key) {
                        known.target = share.places;
                    }
                    entry.bucket.set_share(
                        Share {
                            places: answered.granted,
                            ..share
                        },
                        limiter.now_us(),
                    );
                }
            }
            failure => {
                service.metrics().quota_exchanges.with_label_values(&["failed"]).inc();
                if !failing {
                    let why = match failure {
                        Ok(Err(why)) => why,
                        _ => format!("no answer within {} ms", ttl.as_millis()),
                    };
                    tracing::warn!(
                        message = "Quota shares not exchanged; each router keeps the shares it had.",
                        problem = %why
                    );
                    failing = true;
                }
            }
        }
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

    fn report(router: &str, rate: f64, places: u32) -> Reported {
        Reported {
            router: router.to_string(),
            rate,
            places,
        }
    }

    #[test]
    fn a_router_alone_holds_the_whole_limit() {
        let quota = limit(Some(300.0), 300, Some(10));
        let share = split(&quota, "a", &[report("a", 5000.0, 40)]);
        assert_eq!(share.rate, 300.0);
        assert_eq!(share.burst, 300.0);
        assert_eq!(share.places, 10);
        assert_eq!(Share::fraction_of(&quota, 1.0).places, 10);
    }

    #[test]
    fn over_demand_splits_in_proportion_and_the_shares_add_up_to_the_limit() {
        let quota = limit(Some(300.0), 300, Some(10));
        let reports = [report("a", 400.0, 9), report("b", 400.0, 9), report("c", 800.0, 9)];
        let shares: Vec<Share> = ["a", "b", "c"].iter().map(|me| split(&quota, me, &reports)).collect();
        assert_eq!(shares[0].rate, 75.0);
        assert_eq!(shares[2].rate, 150.0);
        let rate: f64 = shares.iter().map(|share| share.rate).sum();
        assert!((rate - 300.0).abs() < 1e-9, "{rate}");
        let burst: f64 = shares.iter().map(|share| share.burst).sum();
        assert!((burst - 300.0).abs() < 1e-9, "{burst}");
        // 10 places over three equal demands: 4, 3, 3 (the tie goes by name).
        let places: Vec<u32> = shares.iter().map(|share| share.places).collect();
        assert_eq!(places, [4, 3, 3]);
    }

    #[test]
    fn under_demand_each_gets_what_it_asked_and_an_equal_part_of_the_rest() {
        let quota = limit(Some(300.0), 300, Some(12));
        let reports = [report("a", 100.0, 2), report("b", 0.0, 0)];
        let a = split(&quota, "a", &reports);
        let b = split(&quota, "b", &reports);
        assert_eq!(a.rate, 200.0);
        assert_eq!(b.rate, 100.0);
        assert_eq!(a.places + b.places, 12);
        assert_eq!(a.places, 7);
    }

    #[test]
    fn a_router_asking_nothing_of_a_saturated_limit_gets_nothing_but_one_token_of_depth() {
        let quota = limit(Some(10.0), 10, Some(2));
        let reports = [report("busy", 50.0, 2), report("idle", 0.0, 0)];
        let idle = split(&quota, "idle", &reports);
        assert_eq!(idle.rate, 0.0);
        assert_eq!(idle.burst, 1.0);
        assert_eq!(idle.places, 0);
        assert_eq!(split(&quota, "busy", &reports).places, 2);
    }

    #[test]
    fn a_new_bucket_starts_with_its_equal_share() {
        let quota = limit(Some(300.0), 30, Some(10));
        let third = Share::fraction_of(&quota, 1.0 / 3.0);
        assert!((third.rate - 100.0).abs() < 1e-9);
        assert!((third.burst - 10.0).abs() < 1e-9);
        assert_eq!(third.places, 3);
    }
}
