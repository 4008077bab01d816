//! Histograms observed on the request path without threads sharing a cache
//! line: each thread counts into its own shard, and a scrape adds the shards
//! up. The `prometheus` crate's histogram has every thread update the same
//! count, bucket and sum atomics; with a thread per core, those lines moved
//! between cores on every request (profiled: ~1 % of the router's CPU for two
//! observations per request, most of it waiting on the sum's CAS loop).
//!
//! A family is a `prometheus` [`Collector`], registered like any metric, and
//! renders exactly as the crate's own histograms do (same names, `le` labels,
//! `_sum` and `_count`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto;

/// Shards per histogram: threads beyond this share shards (still correct,
/// only contended again). The router runs a thread per core.
const SHARDS: usize = 8;
/// Most bucket bounds a histogram may have.
const MAX_BOUNDS: usize = 16;

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, assigned round-robin on first use.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

/// One thread's counts: per bucket (not cumulative; the last is `+Inf`) and
/// the sum's f64 bits. Aligned so two shards never share a cache line.
#[repr(align(128))]
#[derive(Default)]
struct Shard {
    counts: [AtomicU64; MAX_BOUNDS + 1],
    sum_bits: AtomicU64,
}

/// One histogram (one label value of a family).
pub struct Histogram {
    bounds: Arc<[f64]>,
    shards: Box<[Shard; SHARDS]>,
}

impl Histogram {
    fn new(bounds: Arc<[f64]>) -> Self {
        Self {
            bounds,
            shards: Box::default(),
        }
    }

    pub fn observe(&self, value: f64) {
        let shard = &self.shards[SHARD.with(|shard| *shard)];
        let bucket = self
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(self.bounds.len());
        shard.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // Only this thread writes this shard unless threads outnumber shards:
        // the update is one uncontended compare-and-swap.
        let _ = shard
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// Cumulative bucket counts (one per bound, then `+Inf`, which is the
    /// count) and the sum, over every shard.
    fn read(&self) -> (Vec<u64>, f64) {
        let mut cumulative = vec![0_u64; self.bounds.len() + 1];
        let mut sum = 0.0;
        for shard in self.shards.iter() {
            for (total, count) in cumulative.iter_mut().zip(&shard.counts) {
                *total += count.load(Ordering::Relaxed);
            }
            sum += f64::from_bits(shard.sum_bits.load(Ordering::Relaxed));
        }
        for index in 1..cumulative.len() {
            cumulative[index] += cumulative[index - 1];
        }
        (cumulative, sum)
    }
}

/// A histogram family with at most one label (`None`: a single histogram).
/// Clones share the family: register one, make children from another.
#[derive(Clone)]
pub struct HistogramFamily(Arc<Family>);

struct Family {
    desc: Desc,
    label: Option<String>,
    bounds: Arc<[f64]>,
    /// By label value; touched when a child is made (snapshot builds) and on scrapes.
    children: Mutex<BTreeMap<String, Arc<Histogram>>>,
}

impl HistogramFamily {
    /// `bounds` ascending, at most 16; `label` names the one label, if any.
    pub fn new(name: &str, help: &str, label: Option<&str>, bounds: &[f64]) -> prometheus::Result<Self> {
        if bounds.len() > MAX_BOUNDS || bounds.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(prometheus::Error::Msg(format!(
                "{name}: at most {MAX_BOUNDS} strictly ascending bucket bounds"
            )));
        }
        let labels = label.map(|label| vec![label.to_string()]).unwrap_or_default();
        Ok(Self(Arc::new(Family {
            desc: Desc::new(name.to_string(), help.to_string(), labels, Default::default())?,
            label: label.map(str::to_string),
            bounds: bounds.into(),
            children: Mutex::new(BTreeMap::new()),
        })))
    }

    /// The histogram for `value` of the family's label (or the family's only
    /// histogram, for a family without a label: pass `""`).
    pub fn child(&self, value: &str) -> Arc<Histogram> {
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still whole.
        let family = &self.0;
        let mut children = family.children.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        children
            .entry(value.to_string())
            .or_insert_with(|| Arc::new(Histogram::new(family.bounds.clone())))
            .clone()
    }
}

impl Collector for HistogramFamily {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let family_data = &self.0;
        let children = family_data
            .children
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut family = proto::MetricFamily::default();
        family.set_name(family_data.desc.fq_name.clone());
        family.set_help(family_data.desc.help.clone());
        family.set_field_type(proto::MetricType::HISTOGRAM);
        for (value, histogram) in children.iter() {
            let (cumulative, sum) = histogram.read();
            let mut data = proto::Histogram::default();
            data.set_sample_count(cumulative.last().copied().unwrap_or(0));
            data.set_sample_sum(sum);
            let buckets = family_data.bounds.iter().zip(&cumulative).map(|(bound, count)| {
                let mut bucket = proto::Bucket::default();
                bucket.set_upper_bound(*bound);
                bucket.set_cumulative_count(*count);
                bucket
            });
            data.set_bucket(buckets.collect());
            let mut metric = proto::Metric::default();
            if let Some(label) = &family_data.label {
                let mut pair = proto::LabelPair::default();
                pair.set_name(label.clone());
                pair.set_value(value.clone());
                metric.set_label(vec![pair]);
            }
            metric.set_histogram(data);
            family.mut_metric().push(metric);
        }
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(family: HistogramFamily) -> (HistogramFamily, prometheus::Registry) {
        let registry = prometheus::Registry::new();
        registry.register(Box::new(family.clone())).unwrap();
        (family, registry)
    }

    fn text(registry: &prometheus::Registry) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap()
    }

    #[test]
    fn renders_as_the_prometheus_crate_renders_its_histograms() {
        let bounds = [0.001, 0.01, 0.1];
        let (ours, registry) = render(HistogramFamily::new("t_seconds", "Help.", Some("capability"), &bounds).unwrap());
        let theirs = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("t_seconds", "Help.").buckets(bounds.to_vec()),
            &["capability"],
        )
        .unwrap();
        let reference = prometheus::Registry::new();
        reference.register(Box::new(theirs.clone())).unwrap();
        // Observations from several threads, each on its own shard.
        std::thread::scope(|scope| {
            for thread in 0..3 {
                let (ours, theirs) = (&ours, &theirs);
                scope.spawn(move || {
                    // Dyadic values: every sum is exact, whatever order the threads add in.
                    for value in [1.0 / 1024.0, 1.0 / 128.0, 1.0 / 16.0, 0.5, 1.0 / 64.0] {
                        for capability in ["a.b", "c.d"] {
                            let value = value * f64::from(thread + 1);
                            ours.child(capability).observe(value);
                            theirs.with_label_values(&[capability]).observe(value);
                        }
                    }
                });
            }
        });
        assert_eq!(text(&registry), text(&reference));
    }

    #[test]
    fn a_family_without_a_label_has_one_histogram() {
        let (ours, registry) = render(HistogramFamily::new("w_seconds", "Wait.", None, &[1.0]).unwrap());
        ours.child("").observe(0.5);
        ours.child("").observe(2.0);
        let text = text(&registry);
        assert!(text.contains("w_seconds_bucket{le=\"1\"} 1\n"), "{text}");
        assert!(text.contains("w_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("w_seconds_sum 2.5\n"), "{text}");
        assert!(text.contains("w_seconds_count 2\n"), "{text}");
    }

    #[test]
    fn bounds_are_checked() {
        assert!(HistogramFamily::new("x", "X.", None, &[1.0, 1.0]).is_err());
        assert!(HistogramFamily::new("x", "X.", None, &[0.0; 17]).is_err());
    }
}
