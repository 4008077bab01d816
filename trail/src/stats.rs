//! The installation's figures from the trail: per capability, the calls,
//! failure rate and latency percentiles over a window, and the same in
//! equal buckets for a small chart. Every router replica's records count,
//! so the console shows the installation's traffic, not one replica's.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::record::Record;

/// The window the figures cover: `[since_ms, until_ms)` in `buckets` equal parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since_ms: u64,
    pub until_ms: u64,
    pub buckets: usize,
}

impl Window {
    /// Each bucket's length (at least 1 ms).
    pub fn bucket_ms(&self) -> u64 {
        (self.until_ms.saturating_sub(self.since_ms) / self.buckets.max(1) as u64).max(1)
    }

    /// The bucket `at_ms` falls in, when it falls in the window.
    fn bucket_of(&self, at_ms: u64) -> Option<usize> {
        if at_ms < self.since_ms || at_ms >= self.until_ms {
            return None;
        }
        let index = ((at_ms - self.since_ms) / self.bucket_ms()) as usize;
        Some(index.min(self.buckets.max(1) - 1))
    }
}

/// Calls, failures and latency percentiles of a set of calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub calls: u64,
    pub failed: u64,
    pub failure_rate: f64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// One bucket of a capability's chart.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    pub start_ms: u64,
    #[serde(flatten)]
    pub figures: Figures,
}

/// One capability's figures over the window and bucket by bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapabilityFigures {
    pub name: String,
    #[serde(flatten)]
    pub figures: Figures,
    /// The routers (chains) whose records counted.
    pub routers: usize,
    pub buckets: Vec<Bucket>,
}

/// Nearest-rank percentile of sorted `values`.
fn percentile(sorted: &[f64], quantile: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (quantile * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn figures(durations: &mut [f64], failed: u64) -> Figures {
    durations.sort_by(f64::total_cmp);
    let calls = durations.len() as u64;
    Figures {
        calls,
        failed,
        failure_rate: if calls == 0 { 0.0 } else { failed as f64 / calls as f64 },
        p50_ms: percentile(durations, 0.50),
        p90_ms: percentile(durations, 0.90),
        p99_ms: percentile(durations, 0.99),
    }
}

#[derive(Default)]
struct Tally {
    durations: Vec<f64>,
    failed: u64,
    routers: std::collections::BTreeSet<String>,
    buckets: Vec<(Vec<f64>, u64)>,
}

/// The figures of every capability with a record in `window`, by name.
/// A call counts where it arrived (`at_ms`); `failed` is its status.
pub fn by_capability<'a>(records: impl IntoIterator<Item = &'a Record>, window: Window) -> Vec<CapabilityFigures> {
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    for record in records {
        let Some(bucket) = window.bucket_of(record.at_ms) else {
            continue;
        };
        let tally = tallies.entry(record.capability.as_str()).or_default();
        if tally.buckets.is_empty() {
            tally.buckets = vec![(Vec::new(), 0); window.buckets.max(1)];
        }
        let failed = u64::from(record.status == "failed");
        tally.durations.push(record.duration_ms);
        tally.failed += failed;
        tally.buckets[bucket].0.push(record.duration_ms);
        tally.buckets[bucket].1 += failed;
        if !tally.routers.contains(&record.router) {
            tally.routers.insert(record.router.clone());
        }
    }
    let bucket_ms = window.bucket_ms();
    tallies
        .into_iter()
        .map(|(name, mut tally)| CapabilityFigures {
            name: name.to_string(),
            figures: figures(&mut tally.durations, tally.failed),
            routers: tally.routers.len(),
            buckets: tally
                .buckets
                .iter_mut()
                .enumerate()
                .map(|(index, (durations, failed))| Bucket {
                    start_ms: window.since_ms + index as u64 * bucket_ms,
                    figures: figures(durations, *failed),
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(capability: &str, router: &str, at_ms: u64, duration_ms: f64, status: &str) -> Record {
        Record {
            capability: capability.into(),
            router: router.into(),
            at_ms,
            duration_ms,
            status: status.into(),
            ..Record::default()
        }
    }

    #[test]
    fn calls_failures_and_percentiles_by_capability_and_bucket() {
        let window = Window {
            since_ms: 0,
            until_ms: 1200,
            buckets: 12,
        };
        let mut records: Vec<Record> = (0..100)
            .map(|n| {
                record(
                    "order.query",
                    if n % 2 == 0 { "ra" } else { "rb" },
                    n * 10,
                    (n + 1) as f64,
                    "succeeded",
                )
            })
            .collect();
        records.push(record("order.query", "ra", 1150, 500.0, "failed"));
        records.push(record("pay.check", "rb", 50, 3.0, "failed"));
        // Outside the window: not counted.
        records.push(record("pay.check", "rb", 1200, 3.0, "succeeded"));
        let figures = by_capability(&records, window);
        assert_eq!(figures.len(), 2);
        let order = &figures[0];
        assert_eq!(order.name, "order.query");
        assert_eq!((order.figures.calls, order.figures.failed, order.routers), (101, 1, 2));
        assert_eq!(order.figures.p50_ms, Some(51.0));
        assert_eq!(order.figures.p99_ms, Some(100.0));
        assert_eq!(order.buckets.len(), 12);
        assert_eq!(order.buckets[0].figures.calls, 10);
        assert_eq!(order.buckets[0].start_ms, 0);
        assert_eq!(order.buckets[11].start_ms, 1100);
        assert_eq!(order.buckets[11].figures.failed, 1);
        assert_eq!(order.buckets[11].figures.p99_ms, Some(500.0));
        let pay = &figures[1];
        assert_eq!((pay.figures.calls, pay.figures.failure_rate), (1, 1.0));
        assert_eq!(pay.buckets[1].figures.calls, 0);
        assert_eq!(pay.buckets[1].figures.p99_ms, None);
    }
}
