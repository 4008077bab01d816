//! What operators see of this router (the console and the CLI read it):
//! every instance in the snapshot with its live state, every capability's
//! versions, split, policy and recent statistics, what `adaptive` learned
//! and why its weights changed, and the outcome history it learned from.
//! Read when asked, never on the request path.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::clock;
use crate::history::{Counts, Kind};
use crate::recent::Call;
use crate::select;
use crate::service::RouterService;

/// The window of the capabilities' statistics.
const WINDOW_MS: u64 = 5 * 60 * 1000;

/// `GET /v1/routing/instances`: every instance in this router's snapshot,
/// by capability and version, with its live state.
pub fn instances(service: &RouterService) -> Value {
    let handle = service.snapshot();
    let staleness = handle.staleness();
    let snapshot = handle.load();
    let scores = snapshot.instance_scores(staleness, service.tuning().max_staleness);
    let limits = service.limits();
    let mut rows = Vec::new();
    let mut names: Vec<&String> = snapshot.capabilities.keys().collect();
    names.sort();
    for name in names {
        let Some(capability) = snapshot.capabilities.get(name) else {
            continue;
        };
        for group in &capability.versions {
            for (instance, history) in group.instances.iter().zip(&group.histories) {
                let state = &instance.state;
                let health = scores.get(instance.agent_id.as_str()).map_or(0, |(score, _)| *score);
                rows.push(json!({
                    "agent_id": instance.agent_id,
                    "name": instance.name,
                    "endpoint": instance.endpoint,
                    "capability": name,
                    "version": group.version_text,
                    "status": instance.status.as_str(),
                    "weight": instance.weight,
                    "health": health,
                    "breaker": state.breaker.state().as_str(),
                    "routable": select::routable(instance, &limits).is_some(),
                    "inflight": state.inflight(),
                    "reported_inflight": state.reported_inflight(),
                    "operator_weight": instance.operator_weight,
                    "learned_permille": history.learned_permille(),
                    "predicted_failure_permille": history.predicted_failure_permille(),
                    "predicted_p50_ms": history.predicted_p50().map(|p50| p50.as_secs_f64() * 1000.0),
                    "peak_ewma_ms": state.peak_ewma_us() / 1000.0,
                }));
            }
        }
    }
    json!({
        "snapshot": {
            "revision": snapshot.revision,
            "synced": handle.is_synced(),
            "registry_connected": handle.is_connected(),
            // While connected, every instance listed renewed its lease within its TTL.
            "staleness_ms": u64::try_from(staleness.as_millis()).unwrap_or(u64::MAX),
        },
        "instances": rows,
    })
}

/// Calls, failures and latency percentiles of calls within the window.
#[derive(Default)]
struct Stats {
    calls: u64,
    failures: u64,
    durations_us: Vec<u64>,
}

impl Stats {
    fn view(mut self) -> Value {
        self.durations_us.sort_unstable();
        let percentile = |p: f64| -> Value {
            if self.durations_us.is_empty() {
                return Value::Null;
            }
            let rank = ((self.durations_us.len() as f64) * p).ceil() as usize;
            let index = rank.clamp(1, self.durations_us.len()) - 1;
            self.durations_us
                .get(index)
                .map_or(Value::Null, |us| json!(*us as f64 / 1000.0))
        };
        json!({
            "calls": self.calls,
            "failures": self.failures,
            "failure_rate": if self.calls == 0 { 0.0 } else { self.failures as f64 / self.calls as f64 },
            "p50_ms": percentile(0.5),
            "p90_ms": percentile(0.9),
            "p99_ms": percentile(0.99),
        })
    }
}

/// `GET /v1/routing/capabilities`: every capability's versions, traffic
/// split and, from the recent-calls ring, its calls, failure rate and
/// latency over the last five minutes.
pub fn capabilities(service: &RouterService) -> Value {
    let since = clock::epoch_ms().saturating_sub(WINDOW_MS);
    let mut stats: BTreeMap<String, Stats> = BTreeMap::new();
    let mut oldest = u64::MAX;
    service.recent().each(|call: &Call| {
        if call.started_ms < since || call.request_id.is_empty() {
            return;
        }
        oldest = oldest.min(call.started_ms);
        // Shards are held while this runs: no allocation but a capability's first.
        let entry = match stats.get_mut(call.capability.as_str()) {
            Some(entry) => entry,
            None => stats.entry(call.capability.clone()).or_default(),
        };
        entry.calls += 1;
        entry.failures += u64::from(call.code.is_some());
        entry.durations_us.push(call.duration_us);
    });
    let snapshot = service.snapshot().load();
    let limits = service.limits();
    let mut names: Vec<&String> = snapshot.capabilities.keys().collect();
    names.sort();
    let rows: Vec<Value> = names
        .into_iter()
        .filter_map(|name| {
            let capability = snapshot.capabilities.get(name)?;
            let versions: Vec<Value> = capability
                .versions
                .iter()
                .map(|group| {
                    json!({
                        "version": group.version_text,
                        "instances": group.instances.len(),
                        "routable": group.instances.iter().filter(|instance| select::routable(instance, &limits).is_some()).count(),
                        "description": group.described.description,
                    })
                })
                .collect();
            let split = service.routed_split(name).map(|shares| {
                shares
                    .into_iter()
                    .map(|(version, weight)| json!({ "version": version, "weight": weight }))
                    .collect::<Vec<_>>()
            });
            Some(json!({
                "name": name,
                "versions": versions,
                "split": split,
                "policy": capability.policy.as_ref().map(ToString::to_string),
                "changes": service.weight_changes().newest(Some(name), 5),
                "stats": stats.remove(name.as_str()).unwrap_or_default().view(),
            }))
        })
        .collect();
    json!({
        "window_s": WINDOW_MS / 1000,
        // The ring is bounded: under load the window covers less than five minutes.
        "ring_capacity": service.recent().capacity(),
        "oldest_call_ms": if oldest == u64::MAX { Value::Null } else { json!(oldest) },
        "capabilities": rows,
    })
}

/// `GET /v1/routing/changes`: `adaptive`'s recent weight changes, newest
/// first, each with its reason (of one capability when given).
pub fn weight_changes(service: &RouterService, capability: Option<&str>, limit: usize) -> Value {
    json!({
        "bucket_ms": service.history_clock().bucket_ms,
        "capacity": crate::history::changes::CAPACITY,
        "changes": service.weight_changes().newest(capability, limit),
    })
}

/// `GET /v1/routing/history?capability=NAME`: each instance's outcome
/// history in each version of `capability` (the buckets holding attempts,
/// newest first) and what it predicts now; `None` when no instance offers it.
pub fn history(service: &RouterService, capability: &str) -> Option<Value> {
    let clock = service.history_clock();
    let now_ms = clock::epoch_ms();
    let snapshot = service.snapshot().load();
    let found = snapshot.capabilities.get(capability)?;
    let mut rows = Vec::new();
    for group in &found.versions {
        for (instance, history) in group.instances.iter().zip(&group.histories) {
            let buckets = history.with(|recorded| {
                let mut held: Vec<(u64, Counts)> = recorded
                    .hours
                    .iter()
                    .filter(|(number, counts)| *number != 0 && !counts.is_empty())
                    .copied()
                    .collect();
                held.sort_by_key(|(number, _)| std::cmp::Reverse(*number));
                held
            });
            let buckets: Vec<Value> = buckets
                .into_iter()
                .map(|(number, counts)| {
                    let ms = |q: f64| counts.latency_quantile_us(q).map(|us| us as f64 / 1000.0);
                    json!({
                        "bucket": number,
                        "start_ms": clock.bucket_start_ms(number),
                        "hour_of_day": number % crate::history::DAY,
                        "calls": counts.calls(),
                        "succeeded": counts.kind(Kind::Succeeded),
                        "agent_error": counts.kind(Kind::AgentError),
                        "timeout": counts.kind(Kind::Timeout),
                        "server_error": counts.kind(Kind::ServerError),
                        "p50_ms": ms(0.5),
                        "p99_ms": ms(0.99),
                    })
                })
                .collect();
            rows.push(json!({
                "agent_id": instance.agent_id,
                "version": group.version_text,
                "operator_weight": instance.operator_weight,
                "learned_permille": history.learned_permille(),
                "predicted_failure_permille": history.predicted_failure_permille(),
                "predicted_p50_ms": history.predicted_p50().map(|p50| p50.as_secs_f64() * 1000.0),
                "buckets": buckets,
            }));
        }
    }
    Some(json!({
        "capability": capability,
        "bucket_ms": clock.bucket_ms,
        "now_bucket": clock.bucket(now_ms),
        "instances": rows,
    }))
}
