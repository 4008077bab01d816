//! The router's Prometheus metrics (`agent_reach_router_*`, DESIGN §6), in a
//! per-service registry so several services can share one process (`dev`).
//!
//! Labelled children are resolved when a snapshot is built (a capability's
//! stream series by its first stream) and cached on the capability or
//! instance, so the request path never looks a label up.

use std::sync::{Arc, OnceLock};

use prometheus::{
    Counter, CounterVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::error::Code;
use agent_reach_telemetry::histogram::{Histogram, HistogramFamily};

/// The `outcome` label values: `succeeded` then every error code.
pub const OUTCOMES: usize = 1 + Code::ALL.len();

pub fn outcome_index(result: Result<(), Code>) -> usize {
    match result {
        Ok(()) => 0,
        Err(code) => 1 + Code::ALL.iter().position(|known| *known == code).unwrap_or(0),
    }
}

fn outcome_label(index: usize) -> &'static str {
    match index {
        0 => "succeeded",
        other => Code::ALL[other - 1].as_str(),
    }
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    requests: IntCounterVec,
    /// Observed per request: per-thread shards (see [`agent_reach_telemetry::histogram`]).
    forward_seconds: HistogramFamily,
    pub selection_seconds: Arc<Histogram>,
    pub retries: IntCounterVec,
    pub retry_budget_exhausted: IntCounter,
    breaker_state: IntGaugeVec,
    inflight: IntGaugeVec,
    health_score: IntGaugeVec,
    output_schema_mismatches: IntCounterVec,
    version_selections: IntCounterVec,
    /// Routable instances per capability, set at scrape time ([`crate::service::RouterService::publish_routable_instances`]).
    pub routable_instances: IntGaugeVec,
    pub snapshot_revision: IntGauge,
    pub snapshot_instances: IntGauge,
    pub snapshot_staleness_seconds: IntGauge,
    pub registry_connected: IntGauge,
    pub watch_reconnects: IntCounter,
    /// Quota share exchanges with the other routers (`crate::limits::shares`), by outcome.
    pub quota_exchanges: IntCounterVec,
    /// Streamed invokes (DESIGN §8, `crate::stream`).
    pub streams: StreamMetrics,
    /// Model tokens agents report in their answers' `usage` (`crate::usage`).
    model_tokens: IntCounterVec,
    /// Cost agents reported on calls that carried a budget (subtracted from their chains').
    budget_cost: CounterVec,
}

/// The streamed invoke's numbers, by capability. Observed once or twice per
/// stream (not per request of the fast path), so the `prometheus` crate's own
/// histograms serve.
#[derive(Clone)]
pub struct StreamMetrics {
    /// From the request's arrival to the first event relayed to the caller.
    pub first_event_seconds: HistogramVec,
    /// From the request's arrival to the stream's end.
    pub duration_seconds: HistogramVec,
    /// Events relayed.
    pub events: IntCounterVec,
    /// Streams whose caller went away before the end (the agent's request
    /// was cancelled). No label: present from the start, and rare.
    pub disconnects: IntCounter,
}

impl StreamMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let buckets = vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        let first_event_seconds = HistogramVec::new(
            HistogramOpts::new(
                "agent_reach_router_stream_first_event_seconds",
                "Streamed invokes: time from the request's arrival to the first event relayed, by capability.",
            )
            .buckets(buckets.clone()),
            &["capability"],
        )?;
        let duration_seconds = HistogramVec::new(
            HistogramOpts::new(
                "agent_reach_router_stream_duration_seconds",
                "Streamed invokes: time from the request's arrival to the end of the stream, by capability.",
            )
            .buckets(buckets),
            &["capability"],
        )?;
        let events = IntCounterVec::new(
            Opts::new(
                "agent_reach_router_stream_events_total",
                "Streamed invokes: events relayed to callers, by capability.",
            ),
            &["capability"],
        )?;
        let disconnects = IntCounter::new(
            "agent_reach_router_stream_disconnects_total",
            "Streamed invokes whose caller went away before the end (the agent's request was cancelled).",
        )?;
        registry.register(Box::new(first_event_seconds.clone()))?;
        registry.register(Box::new(duration_seconds.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(disconnects.clone()))?;
        Ok(Self {
            first_event_seconds,
            duration_seconds,
            events,
            disconnects,
        })
    }
}

/// Cached children for one capability (label `capability`).
#[derive(Clone)]
pub struct CapabilityMetrics {
    /// Shared: a stream holds a copy of these for its whole life (a clone is one count, not a vector).
    requests: Arc<[IntCounter]>,
    pub forward_seconds: Arc<Histogram>,
    /// The streamed invoke's children, resolved by the capability's first
    /// stream (a capability nobody streams from has no stream series).
    streams: Arc<OnceLock<Arc<StreamChildren>>>,
    /// Model tokens its agents report (`crate::usage`).
    pub(crate) model_tokens: crate::usage::ModelTokens,
    /// Cost its agents reported on calls carrying a budget (`agent_reach_budget_cost_spent_total`).
    pub(crate) budget_cost: Counter,
}

/// A streamed invoke's series for one capability ([`StreamMetrics`]' children).
pub struct StreamChildren {
    pub first_event: prometheus::Histogram,
    pub duration: prometheus::Histogram,
    pub events: IntCounter,
    pub disconnects: IntCounter,
}

impl CapabilityMetrics {
    pub fn record(&self, result: Result<(), Code>) {
        if let Some(counter) = self.requests.get(outcome_index(result)) {
            counter.inc();
        }
    }

    /// The stream series of `capability` (this one's name), looked up by its
    /// first stream only.
    pub fn streams(&self, metrics: &StreamMetrics, capability: &str) -> Arc<StreamChildren> {
        self.streams
            .get_or_init(|| {
                let label = [capability];
                Arc::new(StreamChildren {
                    first_event: metrics.first_event_seconds.with_label_values(&label),
                    duration: metrics.duration_seconds.with_label_values(&label),
                    events: metrics.events.with_label_values(&label),
                    disconnects: metrics.disconnects.clone(),
                })
            })
            .clone()
    }
}

/// Cached children for one instance (label `agent_id`).
#[derive(Clone)]
pub struct InstanceMetrics {
    pub breaker_state: IntGauge,
    /// Requests in flight, refreshed on each scrape (`Snapshot::publish_instance_gauges`).
    pub inflight: IntGauge,
    /// The 0–100 health score, refreshed on each scrape (`Snapshot::publish_instance_gauges`).
    pub health_score: IntGauge,
    /// Answers refused because they did not match the output schema.
    pub output_schema_mismatches: IntCounter,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        Self::in_registry(Registry::new())
    }

    /// The router's series, registered in `registry` (a tenant's, whose series carry its label).
    pub fn in_registry(registry: Registry) -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "agent_reach_router_requests_total",
                "Invocations by capability and outcome (succeeded or the error code).",
            ),
            &["capability", "outcome"],
        )?;
        let forward_seconds = HistogramFamily::new(
            "agent_reach_router_forward_duration_seconds",
            "Time from forwarding an attempt to an agent until its answer, by capability.",
            Some("capability"),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ],
        )?;
        let selection_family = HistogramFamily::new(
            "agent_reach_router_selection_wait_seconds",
            "Time spent finding an instance for an attempt (alert above 1 s).",
            None,
            &[0.00001, 0.0001, 0.001, 0.01, 0.1, 1.0],
        )?;
        let selection_seconds = selection_family.child("");
        let retries = IntCounterVec::new(
            Opts::new(
                "agent_reach_router_retries_total",
                "Retries by reason (connect, reset, unavailable_503, overloaded_429, refused_401).",
            ),
            &["reason"],
        )?;
        let retry_budget_exhausted = IntCounter::new(
            "agent_reach_router_retry_budget_exhausted_total",
            "Retries refused because the retry budget was spent.",
        )?;
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "agent_reach_router_breaker_state",
                "Circuit breaker per instance: 0 closed, 1 half-open, 2 open.",
            ),
            &["agent_id"],
        )?;
        let inflight = IntGaugeVec::new(
            Opts::new("agent_reach_router_inflight", "Requests in flight per instance."),
            &["agent_id"],
        )?;
        let health_score = IntGaugeVec::new(
            Opts::new(
                "agent_reach_router_instance_health_score",
                "Health score per instance, 0-100: heartbeat freshness x passive health (errors) x latency.",
            ),
            &["agent_id"],
        )?;
        let output_schema_mismatches = IntCounterVec::new(
            Opts::new(
                "agent_reach_router_output_schema_mismatches_total",
                "Answers refused as OUTPUT_SCHEMA_MISMATCH per instance (the agent's answer shape changed).",
            ),
            &["agent_id"],
        )?;
        let version_selections = IntCounterVec::new(
            Opts::new(
                "agent_reach_router_version_selections_total",
                "Calls admitted to each capability version (a traffic split's draw, or the highest routable version).",
            ),
            &["capability", "version"],
        )?;
        let routable_instances = IntGaugeVec::new(
            Opts::new(
                "agent_reach_router_routable_instances",
                "Instances of a capability (any version) this router can route to now: status, breaker and in-flight bound.",
            ),
            &["capability"],
        )?;
        let snapshot_revision = IntGauge::new(
            "agent_reach_router_snapshot_revision",
            "Registry revision the routing snapshot reflects.",
        )?;
        let snapshot_instances = IntGauge::new(
            "agent_reach_router_snapshot_instances",
            "Instances in the routing snapshot.",
        )?;
        let snapshot_staleness_seconds = IntGauge::new(
            "agent_reach_router_snapshot_staleness_seconds",
            "Seconds since the registry watch was lost (0 while connected).",
        )?;
        let registry_connected = IntGauge::new(
            "agent_reach_router_registry_connected",
            "1 while the registry Watch stream is up.",
        )?;
        let watch_reconnects = IntCounter::new(
            "agent_reach_router_watch_reconnects_total",
            "Registry Watch (re)connections attempted.",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(forward_seconds.clone()))?;
        registry.register(Box::new(selection_family))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(retry_budget_exhausted.clone()))?;
        registry.register(Box::new(breaker_state.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        registry.register(Box::new(health_score.clone()))?;
        registry.register(Box::new(output_schema_mismatches.clone()))?;
        registry.register(Box::new(version_selections.clone()))?;
        registry.register(Box::new(routable_instances.clone()))?;
        registry.register(Box::new(snapshot_revision.clone()))?;
        registry.register(Box::new(snapshot_instances.clone()))?;
        registry.register(Box::new(snapshot_staleness_seconds.clone()))?;
        registry.register(Box::new(registry_connected.clone()))?;
        registry.register(Box::new(watch_reconnects.clone()))?;
        let quota_exchanges = IntCounterVec::new(
            Opts::new(
                "agent_reach_router_quota_exchanges_total",
                "Quota share exchanges with the other routers on the task store's Redis, by outcome (ok, failed).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(quota_exchanges.clone()))?;
        let streams = StreamMetrics::new(&registry)?;
        let model_tokens = IntCounterVec::new(
            Opts::new(
                "agent_reach_model_tokens_total",
                "Model tokens agents reported in their answers' usage, by capability, model and type (input, output).",
            ),
            &["capability", "model", "type"],
        )?;
        registry.register(Box::new(model_tokens.clone()))?;
        let budget_cost = CounterVec::new(
            Opts::new(
                "agent_reach_budget_cost_spent_total",
                "Cost agents reported in their answers' usage on calls carrying a delegation budget, \
                 subtracted from the chains' budgets, by capability.",
            ),
            &["capability"],
        )?;
        registry.register(Box::new(budget_cost.clone()))?;
        Ok(Self {
            registry,
            requests,
            forward_seconds,
            selection_seconds,
            retries,
            retry_budget_exhausted,
            breaker_state,
            inflight,
            health_score,
            output_schema_mismatches,
            version_selections,
            routable_instances,
            snapshot_revision,
            snapshot_instances,
            snapshot_staleness_seconds,
            registry_connected,
            watch_reconnects,
            quota_exchanges,
            streams,
            model_tokens,
            budget_cost,
        })
    }

    /// Children for `capability`. Called when a snapshot is built, never per request.
    pub fn capability(&self, capability: &str) -> CapabilityMetrics {
        CapabilityMetrics {
            requests: (0..OUTCOMES)
                .map(|index| self.requests.with_label_values(&[capability, outcome_label(index)]))
                .collect(),
            forward_seconds: self.forward_seconds.child(capability),
            streams: Arc::default(),
            model_tokens: crate::usage::ModelTokens::new(self.model_tokens.clone(), capability),
            budget_cost: self.budget_cost.with_label_values(&[capability]),
        }
    }

    /// The counter of calls admitted to one version. Called when a snapshot is built.
    pub fn version_selections(&self, capability: &str, version: &str) -> IntCounter {
        self.version_selections.with_label_values(&[capability, version])
    }

    pub fn instance(&self, agent_id: &str) -> InstanceMetrics {
        InstanceMetrics {
            breaker_state: self.breaker_state.with_label_values(&[agent_id]),
            inflight: self.inflight.with_label_values(&[agent_id]),
            health_score: self.health_score.with_label_values(&[agent_id]),
            output_schema_mismatches: self.output_schema_mismatches.with_label_values(&[agent_id]),
        }
    }

    /// Counts a request refused before a capability was resolved (auth, envelope).
    pub fn record_rejected(&self, code: Code) {
        self.requests
            .with_label_values(&["_unresolved", outcome_label(outcome_index(Err(code)))])
            .inc();
    }

    /// Drops the series of an instance that left the snapshot.
    pub fn forget_instance(&self, agent_id: &str) {
        let _ = self.breaker_state.remove_label_values(&[agent_id]);
        let _ = self.inflight.remove_label_values(&[agent_id]);
        let _ = self.health_score.remove_label_values(&[agent_id]);
        let _ = self.output_schema_mismatches.remove_label_values(&[agent_id]);
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|error| format!("# metrics encoding failed: {error}\n"))
    }
}
