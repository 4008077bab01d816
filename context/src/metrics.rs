//! The context service's Prometheus metrics (`agent_reach_context_*`), in a
//! per-service registry so several services can share one process (`dev`,
//! and each tenant's part of a service with a tenant map, whose registry
//! labels every series with its `tenant`).

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The operations the service counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Get,
    Patch,
    Close,
}

impl Op {
    const ALL: [Op; 4] = [Op::Create, Op::Get, Op::Patch, Op::Close];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Get => "get",
            Op::Patch => "patch",
            Op::Close => "close",
        }
    }
}

/// One operation's series for the common outcome, resolved once: looking a
/// labelled series up takes a hash and a read lock shared by every thread.
#[derive(Clone)]
pub struct OpSeries {
    pub ok: IntCounter,
    pub seconds: Histogram,
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Contexts alive in the store, refreshed by each sweep.
    pub live_contexts: IntGauge,
    pub operations: IntCounterVec,
    pub operation_seconds: HistogramVec,
    pub version_conflicts: IntCounter,
    pub sweeper_removals: IntCounterVec,
    pub sweeps: IntCounterVec,
    /// `operations{op, outcome="ok"}` and `operation_seconds{op}`, by [`Op`].
    series: [OpSeries; 4],
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        Self::in_registry(Registry::new())
    }

    /// The series registered in `registry` (a tenant's, from
    /// `agent_reach_tenancy::metrics_registry`).
    pub fn in_registry(registry: Registry) -> Result<Self, prometheus::Error> {
        let live_contexts = IntGauge::new(
            "agent_reach_context_live_contexts",
            "Contexts alive in this tenant's store (neither expired nor idle), as of the last sweep.",
        )?;
        let operations = IntCounterVec::new(
            Opts::new(
                "agent_reach_context_operations_total",
                "Context operations by kind (create, get, patch, close) and outcome \
                 (ok, rejected, denied, conflict, not_found, unavailable, error).",
            ),
            &["op", "outcome"],
        )?;
        let operation_seconds = HistogramVec::new(
            HistogramOpts::new(
                "agent_reach_context_operation_seconds",
                "Time to serve a context operation, by kind, including the store round trip.",
            )
            .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
            &["op"],
        )?;
        let version_conflicts = IntCounter::new(
            "agent_reach_context_version_conflicts_total",
            "Patches refused because their `if_version` was stale.",
        )?;
        let sweeper_removals = IntCounterVec::new(
            Opts::new(
                "agent_reach_context_sweeper_removals_total",
                "Contexts removed by the sweeper: `idle` (no read or write for the idle timeout) \
                 or `expired` (index entries of contexts their TTL already removed).",
            ),
            &["reason"],
        )?;
        let sweeps = IntCounterVec::new(
            Opts::new(
                "agent_reach_context_sweeps_total",
                "Sweeper runs by outcome (ok, error).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(live_contexts.clone()))?;
        registry.register(Box::new(operations.clone()))?;
        registry.register(Box::new(operation_seconds.clone()))?;
        registry.register(Box::new(version_conflicts.clone()))?;
        registry.register(Box::new(sweeper_removals.clone()))?;
        registry.register(Box::new(sweeps.clone()))?;
        for reason in ["idle", "expired"] {
            sweeper_removals.with_label_values(&[reason]).inc_by(0);
        }
        let series = Op::ALL.map(|op| OpSeries {
            ok: operations.with_label_values(&[op.as_str(), "ok"]),
            seconds: operation_seconds.with_label_values(&[op.as_str()]),
        });
        Ok(Self {
            series,
            registry,
            live_contexts,
            operations,
            operation_seconds,
            version_conflicts,
            sweeper_removals,
            sweeps,
        })
    }

    /// `op`'s pre-resolved series.
    pub fn series(&self, op: Op) -> &OpSeries {
        &self.series[op as usize]
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|error| format!("# metrics encoding failed: {error}\n"))
    }
}
