//! The routing snapshot: capability → versions (highest first) → instances,
//! each version with its input schema compiled once. Immutable once built and
//! swapped atomically ([`SnapshotHandle`]), so the request path reads it
//! without a lock and never calls the registry, etcd or Redis.
//!
//! [`SnapshotBuilder`] runs in the watch task: it applies registry events to
//! its own model and builds each new snapshot, reusing per-instance runtime
//! state (breaker, health, in-flight) and compiled validators whose schema
//! text did not change.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_proto::registry as pb;
use arc_swap::ArcSwap;

use agent_reach_proto::Status;

use agent_reach_proto::envelope::TargetPolicy;

use crate::clock;
use crate::grants::{Grants, GrantsHandle};
use crate::health::{health_score, latency_factor, status_permille, InstanceState};
use crate::history::History;
use crate::metrics::{CapabilityMetrics, Metrics};
use crate::split::Split;

/// One instance as routing needs it.
#[derive(Debug)]
pub struct Instance {
    pub agent_id: String,
    /// The agent's name (its tokens' subject), e.g. who may report a task's result.
    pub name: String,
    pub endpoint: String,
    /// `endpoint` parsed once.
    pub uri: http::Uri,
    pub weight: u32,
    /// `weight` was set by an operator: `adaptive` never scales it.
    pub operator_weight: bool,
    pub status: Status,
    /// The instance's tags (e.g. `class: bulk`), for per-tag task limits.
    pub tags: std::collections::BTreeMap<String, String>,
    /// Runtime state carried across snapshots, including the agent's reported
    /// in-flight count (`state.reported_inflight()`), which a record change of
    /// that count alone updates in place, without a rebuild.
    pub state: Arc<InstanceState>,
}

/// The instances offering one capability at one version.
pub struct VersionGroup {
    pub version: semver::Version,
    pub version_text: String,
    /// The capability's own default deadline.
    pub timeout: Option<Duration>,
    pub validator: Option<Arc<jsonschema::Validator>>,
    /// The compiled output schema, unless the agent asked for its answers to go unchecked.
    pub output_validator: Option<Arc<jsonschema::Validator>>,
    /// How the version describes itself (the MCP and A2A front doors advertise it).
    pub described: Arc<Described>,
    pub instances: Vec<Arc<Instance>>,
    /// Each instance's outcome history in this version (by position, as
    /// `instances`), carried across snapshots.
    pub histories: Vec<Arc<History>>,
    /// Smooth WRR's `current_weight` per instance. A lock per group, held for a
    /// few additions: nginx's per-upstream peer lock, not a global one.
    pub wrr_current: Mutex<Vec<i64>>,
    /// Rotates the tie-break start of least-connections.
    pub rotation: AtomicUsize,
    /// Calls admitted to this version (`agent_reach_router_version_selections_total`).
    pub selections: prometheus::IntCounter,
}

impl VersionGroup {
    /// The fastest instance's latency EWMA (µs; 0 before any outcome): each
    /// instance's latency factor is relative to it.
    pub fn fastest_ewma_us(&self) -> u64 {
        self.instances
            .iter()
            .map(|instance| instance.state.ewma_us())
            .filter(|ewma| *ewma > 0)
            .min()
            .unwrap_or(0)
    }
}

/// A capability version's description and schemas as registered (JSON
/// texts; empty means "any"), as the first instance offering it gave them.
#[derive(Debug, Default)]
pub struct Described {
    pub description: String,
    pub input_schema: String,
    pub output_schema: String,
}

pub struct Capability {
    pub name: String,
    /// Highest version first.
    pub versions: Vec<Arc<VersionGroup>>,
    pub metrics: CapabilityMetrics,
    /// The operator's traffic split between versions for unpinned calls, if any.
    pub split: Option<Split>,
    /// The operator's default policy for calls that name none, if any (DESIGN §9).
    pub policy: Option<TargetPolicy>,
    /// A default policy naming a plug-in this router lacks was reported (once per snapshot).
    pub policy_reported: AtomicBool,
}

pub struct Snapshot {
    pub revision: i64,
    /// aHash: looked up on every routed request.
    pub capabilities: ahash::AHashMap<String, Capability>,
    pub instance_count: usize,
}

impl Snapshot {
    pub fn empty() -> Self {
        Self {
            revision: 0,
            capabilities: ahash::AHashMap::new(),
            instance_count: 0,
        }
    }

    /// Publishes every instance's 0–100 health score (the seeds' console score:
    /// heartbeat freshness, error rate and latency in one number) and its requests
    /// in flight. Called when `/metrics` is scraped, never on the request path
    /// (a gauge updated per request was two more shared writes per request).
    ///
    /// `score = 100 × freshness × health × latency`, each factor in [0, 1]:
    /// - freshness: the registry keeps an instance only while its heartbeats renew
    ///   its lease, so an instance in a connected snapshot is fresh; its reported
    ///   status scales it (`ready` 1, `busy` 0.8, `overloaded` 0.5, `starting` and
    ///   `draining` 0), and once the registry watch is lost it decays linearly to 0
    ///   over `max_staleness`;
    /// - health: the passive health factor, halved by every failure, restored by successes;
    /// - latency: [`latency_factor`] against the fastest instance of the same capability version.
    ///
    /// A product, so any one bad dimension pulls the score down. An instance in
    /// several groups keeps its lowest score.
    pub fn publish_instance_gauges(&self, staleness: Duration, max_staleness: Duration) {
        for (score, state) in self.instance_scores(staleness, max_staleness).into_values() {
            state.publish(score);
        }
    }

    /// Every instance's health score (see [`Snapshot::publish_instance_gauges`])
    /// with its runtime state, by `agent_id` (the gauges and the console read it).
    pub fn instance_scores(
        &self,
        staleness: Duration,
        max_staleness: Duration,
    ) -> HashMap<&str, (i64, &InstanceState)> {
        let stale_permille = if max_staleness.is_zero() {
            1000
        } else {
            (staleness.as_millis() * 1000 / max_staleness.as_millis()).min(1000) as u64
        };
        let mut scores: HashMap<&str, (i64, &InstanceState)> = HashMap::new();
        let groups = self
            .capabilities
            .values()
            .flat_map(|capability| capability.versions.iter());
        for group in groups {
            let fastest = group.fastest_ewma_us();
            for instance in &group.instances {
                let freshness = status_permille(instance.status) * (1000 - stale_permille) / 1000;
                let score = health_score(
                    freshness,
                    u64::from(instance.state.health_permille()),
                    latency_factor(instance.state.ewma_us(), fastest),
                );
                let entry = scores
                    .entry(instance.agent_id.as_str())
                    .or_insert((score, &instance.state));
                entry.0 = entry.0.min(score);
            }
        }
        scores
    }

    /// Every instance id in the snapshot (tests and diagnostics).
    pub fn agent_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .capabilities
            .values()
            .flat_map(|capability| capability.versions.iter())
            .flat_map(|group| group.instances.iter().map(|instance| instance.agent_id.clone()))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

// === SnapshotHandle ===

/// The live snapshot plus the watch's connection state (for `/readyz` and staleness).
pub struct SnapshotHandle {
    current: ArcSwap<Snapshot>,
    /// The tenant's access grants, from the same Watch, swapped on their own
    /// (a grant changes no route, so it rebuilds no snapshot).
    grants: Arc<GrantsHandle>,
    synced: AtomicBool,
    connected: AtomicBool,
    /// Monotonic ms when the watch was last lost (meaningful while disconnected).
    lost_at_ms: AtomicU64,
}

impl Default for SnapshotHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotHandle {
    pub fn new() -> Self {
        Self {
            current: ArcSwap::from_pointee(Snapshot::empty()),
            grants: Arc::new(GrantsHandle::default()),
            synced: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            lost_at_ms: AtomicU64::new(clock::now_ms()),
        }
    }

    pub fn load(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// An owned reference, for holding across awaits.
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The access grants the Watch brought (admission reads them).
    pub fn grants(&self) -> &Arc<GrantsHandle> {
        &self.grants
    }

    pub fn store(&self, snapshot: Snapshot) {
        self.current.store(Arc::new(snapshot));
        self.synced.store(true, Ordering::Release);
    }

    /// Has a first snapshot arrived?
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub fn set_connected(&self, connected: bool) {
        let was = self.connected.swap(connected, Ordering::AcqRel);
        if was && !connected {
            self.lost_at_ms.store(clock::now_ms(), Ordering::Release);
        }
    }

    /// How long the snapshot has gone without registry updates (zero while connected).
    pub fn staleness(&self) -> Duration {
        if self.is_connected() {
            Duration::ZERO
        } else {
            Duration::from_millis(clock::now_ms().saturating_sub(self.lost_at_ms.load(Ordering::Acquire)))
        }
    }
}

// === SnapshotBuilder ===

/// One capability version as the first instance offering it describes it.
struct Offer {
    timeout: Option<Duration>,
    input_schema: String,
    /// `None`: answers go unchecked.
    output_schema: Option<String>,
    described: Arc<Described>,
    instances: Vec<Arc<Instance>>,
}

/// Applies registry Watch events and builds snapshots. Owned by the watch task.
pub struct SnapshotBuilder {
    metrics: Metrics,
    revision: i64,
    instances: BTreeMap<String, pb::AgentInstance>,
    states: HashMap<String, Arc<InstanceState>>,
    /// Compiled input schemas by schema text.
    validators: HashMap<String, Arc<jsonschema::Validator>>,
    capability_metrics: HashMap<String, CapabilityMetrics>,
    /// The groups of the last snapshot, so smooth WRR continues its cycle across
    /// rebuilds instead of restarting it (a restart always favours the heaviest
    /// instance first, which frequent status changes would turn into a skew).
    previous_groups: HashMap<(String, semver::Version), Arc<VersionGroup>>,
    /// Traffic splits by capability, as the registry last sent them.
    splits: BTreeMap<String, pb::CapabilitySplit>,
    /// Access grants by id, as the registry last sent them.
    grants: BTreeMap<String, pb::Grant>,
    /// Whether `grants` changed since [`SnapshotBuilder::take_grants`].
    grants_changed: bool,
    /// Default policies by capability, as the registry last sent them.
    policies: BTreeMap<String, pb::CapabilityPolicy>,
    /// Outcome histories by (capability, version, agent id).
    histories: HashMap<(String, semver::Version, String), Arc<History>>,
}

impl SnapshotBuilder {
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            revision: 0,
            instances: BTreeMap::new(),
            states: HashMap::new(),
            validators: HashMap::new(),
            capability_metrics: HashMap::new(),
            previous_groups: HashMap::new(),
            splits: BTreeMap::new(),
            grants: BTreeMap::new(),
            grants_changed: false,
            policies: BTreeMap::new(),
            histories: HashMap::new(),
        }
    }

    /// The grants index, when the grants changed since the last call.
    pub fn take_grants(&mut self) -> Option<Grants> {
        std::mem::take(&mut self.grants_changed).then(|| Grants::build(self.grants.values()))
    }

    /// The last applied revision (resume point for the next Watch).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Applies one event; returns whether the routing view changed.
    pub fn apply(&mut self, event: pb::WatchEvent) -> bool {
        use pb::watch_event::Kind;
        if event.revision > 0 {
            self.revision = event.revision;
        }
        match event.kind {
            Some(Kind::Snapshot(snapshot)) => {
                // A snapshot (first, or reset after compaction) replaces everything.
                self.instances = snapshot
                    .instances
                    .into_iter()
                    .map(|instance| (instance.agent_id.clone(), instance))
                    .collect();
                self.splits = snapshot
                    .splits
                    .into_iter()
                    .map(|split| (split.capability.clone(), split))
                    .collect();
                self.grants = snapshot
                    .grants
                    .into_iter()
                    .map(|grant| (grant.id.clone(), grant))
                    .collect();
                self.grants_changed = true;
                self.policies = snapshot
                    .policies
                    .into_iter()
                    .map(|policy| (policy.capability.clone(), policy))
                    .collect();
                true
            }
            // Grants change who may call, not where calls go: no rebuild.
            Some(Kind::GrantSet(grant)) => {
                self.grants.insert(grant.id.clone(), grant);
                self.grants_changed = true;
                false
            }
            Some(Kind::GrantRemoved(removed)) => {
                self.grants_changed |= self.grants.remove(&removed.id).is_some();
                false
            }
            Some(Kind::PolicySet(policy)) => {
                self.policies.insert(policy.capability.clone(), policy);
                true
            }
            Some(Kind::PolicyCleared(cleared)) => self.policies.remove(&cleared.capability).is_some(),
            Some(Kind::SplitSet(split)) => {
                self.splits.insert(split.capability.clone(), split);
                true
            }
            Some(Kind::SplitCleared(cleared)) => self.splits.remove(&cleared.capability).is_some(),
            Some(Kind::Updated(instance)) if self.only_inflight_changed(&instance) => {
                // The agent's load moved: a heartbeat's worth of news that routing
                // reads through an atomic, not worth rebuilding every group for.
                if let Some(state) = self.states.get(&instance.agent_id) {
                    state.set_reported_inflight(instance.inflight);
                }
                self.instances.insert(instance.agent_id.clone(), instance);
                false
            }
            Some(Kind::Added(instance)) | Some(Kind::Updated(instance)) => {
                self.instances.insert(instance.agent_id.clone(), instance);
                true
            }
            Some(Kind::Removed(removed)) => self.instances.remove(&removed.agent_id).is_some(),
            None => false,
        }
    }

    /// Whether `update` differs from the record held only in its reported in-flight count.
    fn only_inflight_changed(&self, update: &pb::AgentInstance) -> bool {
        self.instances.get(&update.agent_id).is_some_and(|held| {
            held.inflight != update.inflight
                && pb::AgentInstance {
                    inflight: update.inflight,
                    ..held.clone()
                } == *update
        })
    }

    pub fn build(&mut self) -> Snapshot {
        let mut live_states = HashMap::with_capacity(self.instances.len());
        let mut live_validators = HashMap::new();
        // capability → version → what the first instance's descriptor says, and every instance
        type Versions = BTreeMap<semver::Version, Offer>;
        let mut by_capability: BTreeMap<String, Versions> = BTreeMap::new();
        for record in self.instances.values() {
            let uri: http::Uri = match record.endpoint.parse::<http::Uri>() {
                // The forwarder speaks HTTP/1.1, plain or over TLS (DESIGN §2: protocol `http`).
                Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => uri,
                Ok(_) => {
                    tracing::warn!(
                        message = "Instance endpoint is not an http:// or https:// URL; not routable.",
                        agent_id = %record.agent_id, endpoint = %record.endpoint
                    );
                    continue;
                }
                Err(error) => {
                    tracing::warn!(
                        message = "Instance endpoint is not a URI; not routable.",
                        agent_id = %record.agent_id, endpoint = %record.endpoint, %error
                    );
                    continue;
                }
            };
            let status = match Status::parse(&record.status) {
                Ok(status) => status,
                Err(error) => {
                    // A registry newer than this router may know more words; until
                    // the router does, the instance takes no traffic from it.
                    tracing::warn!(
                        message = "Instance reports a status this router does not know; not routable.",
                        agent_id = %record.agent_id, %error
                    );
                    continue;
                }
            };
            let state = self
                .states
                .get(&record.agent_id)
                .cloned()
                .unwrap_or_else(|| Arc::new(InstanceState::new(self.metrics.instance(&record.agent_id))));
            state.set_reported_inflight(record.inflight);
            live_states.insert(record.agent_id.clone(), state.clone());
            let instance = Arc::new(Instance {
                agent_id: record.agent_id.clone(),
                name: record.name.clone(),
                endpoint: record.endpoint.clone(),
                uri,
                weight: record.weight.max(1),
                operator_weight: record.operator_weight,
                status,
                tags: record
                    .tags
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect(),
                state,
            });
            for descriptor in &record.capabilities {
                let Ok(version) = semver::Version::parse(&descriptor.version) else {
                    continue;
                };
                let timeout = Some(descriptor.timeout_ms)
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis);
                let entry = by_capability
                    .entry(descriptor.name.clone())
                    .or_default()
                    .entry(version)
                    .or_insert_with(|| Offer {
                        timeout,
                        input_schema: descriptor.input_schema_json.clone(),
                        // The agent may ask for its answers to go unchecked.
                        output_schema: (!descriptor.skip_output_check).then(|| descriptor.output_schema_json.clone()),
                        described: Arc::new(Described {
                            description: descriptor.description.clone(),
                            input_schema: descriptor.input_schema_json.clone(),
                            output_schema: descriptor.output_schema_json.clone(),
                        }),
                        instances: Vec::new(),
                    });
                entry.instances.push(instance.clone());
            }
        }
        for gone in self.states.keys().filter(|id| !live_states.contains_key(*id)) {
            self.metrics.forget_instance(gone);
        }
        self.states = live_states;

        let mut live_histories = HashMap::new();
        let mut capabilities = ahash::AHashMap::with_capacity(by_capability.len());
        for (name, versions) in by_capability {
            let mut groups = Vec::with_capacity(versions.len());
            for (version, offer) in versions.into_iter().rev() {
                let Offer {
                    timeout,
                    input_schema,
                    output_schema,
                    described,
                    instances,
                } = offer;
                let validator = self.validator(&input_schema, &name, &version, "input");
                if let Some(validator) = &validator {
                    live_validators.insert(input_schema.clone(), validator.clone());
                }
                let output_validator = output_schema
                    .as_deref()
                    .and_then(|text| self.validator(text, &name, &version, "output"));
                if let (Some(text), Some(validator)) = (&output_schema, &output_validator) {
                    live_validators.insert(text.clone(), validator.clone());
                }
                let carried = self.carried_wrr(&name, &version, &instances);
                let histories = instances
                    .iter()
                    .map(|instance| {
                        let key = (name.clone(), version.clone(), instance.agent_id.clone());
                        let history = self.histories.get(&key).cloned().unwrap_or_default();
                        live_histories.insert(key, history.clone());
                        history
                    })
                    .collect();
                let selections = self.metrics.version_selections(&name, &version.to_string());
                groups.push(Arc::new(VersionGroup {
                    version_text: version.to_string(),
                    version,
                    timeout,
                    validator,
                    output_validator,
                    described,
                    instances,
                    histories,
                    wrr_current: Mutex::new(carried),
                    rotation: AtomicUsize::new(0),
                    selections,
                }));
            }
            let metrics = self
                .capability_metrics
                .entry(name.clone())
                .or_insert_with(|| self.metrics.capability(&name))
                .clone();
            let split = self
                .splits
                .get(&name)
                .and_then(|record| Split::build(record, groups.iter().map(|group| &group.version)));
            let policy = self.policies.get(&name).and_then(|record| {
                TargetPolicy::parse(&record.policy)
                    .inspect_err(|why| {
                        // A registry newer than this router may know more policies.
                        tracing::warn!(message = "Capability policy not understood; its calls use the default.", capability = %name, %why);
                    })
                    .ok()
            });
            capabilities.insert(
                name.clone(),
                Capability {
                    name,
                    versions: groups,
                    metrics,
                    split,
                    policy,
                    policy_reported: AtomicBool::new(false),
                },
            );
        }
        self.validators = live_validators;
        self.histories = live_histories;
        self.previous_groups = capabilities
            .values()
            .flat_map(|capability: &Capability| {
                capability
                    .versions
                    .iter()
                    .map(|group| ((capability.name.clone(), group.version.clone()), group.clone()))
            })
            .collect();
        self.metrics.snapshot_revision.set(self.revision);
        self.metrics.snapshot_instances.set(self.instances.len() as i64);
        Snapshot {
            revision: self.revision,
            capabilities,
            instance_count: self.instances.len(),
        }
    }

    /// Smooth WRR's current weights for a rebuilt group: each instance keeps its
    /// value from the previous snapshot; newcomers start at 0.
    fn carried_wrr(&self, name: &str, version: &semver::Version, instances: &[Arc<Instance>]) -> Vec<i64> {
        let Some(previous) = self.previous_groups.get(&(name.to_string(), version.clone())) else {
            return vec![0; instances.len()];
        };
        let current = previous
            .wrr_current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        instances
            .iter()
            .map(|instance| {
                previous
                    .instances
                    .iter()
                    .position(|old| old.agent_id == instance.agent_id)
                    .and_then(|index| current.get(index).copied())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The compiled validator for a schema text, compiled only when new.
    fn validator(
        &mut self,
        text: &str,
        name: &str,
        version: &semver::Version,
        which: &str,
    ) -> Option<Arc<jsonschema::Validator>> {
        if text.trim().is_empty() {
            return None;
        }
        if let Some(existing) = self.validators.get(text) {
            return Some(existing.clone());
        }
        let schema: serde_json::Value = match serde_json::from_str(text) {
            Ok(schema) => schema,
            Err(error) => {
                tracing::warn!(message = "Schema is not JSON; this side goes unchecked.", schema = which, capability = name, %version, %error);
                return None;
            }
        };
        match jsonschema::draft202012::new(&schema) {
            Ok(validator) => {
                let validator = Arc::new(validator);
                self.validators.insert(text.to_string(), validator.clone());
                Some(validator)
            }
            Err(error) => {
                tracing::warn!(message = "Schema does not compile; this side goes unchecked.", schema = which, capability = name, %version, %error);
                None
            }
        }
    }

    /// How many distinct schemas are compiled (tests: compile-once).
    #[cfg(test)]
    pub fn compiled_schemas(&self) -> usize {
        self.validators.len()
    }
}

#[cfg(test)]
mod tests;
