//! The registry's Prometheus metrics (`agent_reach_registry_*`), registered in
//! a per-service registry so several services can share one process (`dev`).

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub instances: IntGaugeVec,
    pub registrations: IntCounterVec,
    pub deregistrations: IntCounter,
    pub heartbeats: IntCounterVec,
    pub status_writes: IntCounter,
    pub inflight_writes: IntCounter,
    pub lease_expiries: IntCounter,
    pub watch_subscribers: IntGauge,
    pub catalog_revision: IntGauge,
    pub access_decisions: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        Self::in_registry(Registry::new())
    }

    /// The registry's series in `registry` (one tenant's part of a process
    /// serving several: `edge::tenants::metrics_registry` labels them).
    pub fn in_registry(registry: Registry) -> Result<Self, prometheus::Error> {
        let instances = IntGaugeVec::new(
            Opts::new("agent_reach_registry_instances", "Registered instances by status."),
            &["status"],
        )?;
        let registrations = IntCounterVec::new(
            Opts::new(
                "agent_reach_registry_registrations_total",
                "Registration attempts by outcome (ok, rejected, error).",
            ),
            &["outcome"],
        )?;
        let deregistrations = IntCounter::new(
            "agent_reach_registry_deregistrations_total",
            "Graceful deregistrations handled by this registry.",
        )?;
        let heartbeats = IntCounterVec::new(
            Opts::new(
                "agent_reach_registry_heartbeats_total",
                "Heartbeats by transport (http, grpc) and outcome (ok, lease_expired, rejected, error).",
            ),
            &["transport", "outcome"],
        )?;
        let status_writes = IntCounter::new(
            "agent_reach_registry_status_writes_total",
            "Status changes written to the store (heartbeats without a change write nothing).",
        )?;
        let inflight_writes = IntCounter::new(
            "agent_reach_registry_inflight_writes_total",
            "Reported in-flight counts written to the store without a status change (only when moved by an eighth).",
        )?;
        let lease_expiries = IntCounter::new(
            "agent_reach_registry_lease_expiries_total",
            "Instances removed without a deregistration through this registry (lease expiry).",
        )?;
        let watch_subscribers = IntGauge::new("agent_reach_registry_watch_subscribers", "Open Watch streams.")?;
        let catalog_revision = IntGauge::new(
            "agent_reach_registry_catalog_revision",
            "Store revision the registry's in-memory catalog reflects.",
        )?;
        let access_decisions = IntCounterVec::new(
            Opts::new(
                "agent_reach_registry_access_decisions_total",
                "Access requests filed and decided, and grants revoked (requested, approved, denied, revoked).",
            ),
            &["decision"],
        )?;
        registry.register(Box::new(access_decisions.clone()))?;
        registry.register(Box::new(instances.clone()))?;
        registry.register(Box::new(registrations.clone()))?;
        registry.register(Box::new(deregistrations.clone()))?;
        registry.register(Box::new(heartbeats.clone()))?;
        registry.register(Box::new(status_writes.clone()))?;
        registry.register(Box::new(inflight_writes.clone()))?;
        registry.register(Box::new(lease_expiries.clone()))?;
        registry.register(Box::new(watch_subscribers.clone()))?;
        registry.register(Box::new(catalog_revision.clone()))?;
        for status in crate::model::Status::ALL {
            instances.with_label_values(&[status.as_str()]).set(0);
        }
        // Served from the start, at 0, so dashboards and alerts see the family.
        for decision in ["requested", "approved", "denied", "revoked"] {
            access_decisions.with_label_values(&[decision]);
        }
        Ok(Self {
            registry,
            instances,
            registrations,
            deregistrations,
            heartbeats,
            status_writes,
            inflight_writes,
            lease_expiries,
            watch_subscribers,
            catalog_revision,
            access_decisions,
        })
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|error| format!("# metrics encoding failed: {error}\n"))
    }
}
