//! The router service, transport-free: every door hands it a [`Call`] (an
//! identified caller and a checked envelope, `crate::pipeline`); it admits
//! the call ([`crate::admission`]) and runs its attempts through the one
//! loop (`crate::call::attempts`): answered whole ([`RouterService::invoke`]),
//! streamed (`RouterService::stream`, in `crate::stream`), or delivered to
//! every routable instance at once ([`RouterService::broadcast`]). Every
//! call is recorded in the recent calls and its failures logged here once.

use std::sync::Arc;

use agent_reach_access::Assertions;
use agent_reach_telemetry::spans::KeyValue;

use crate::admission::{Admission, Admitted, Refused};
use crate::breaker::BreakerConfig;
use crate::call::attempts::{self, Answered, Means, Targets, Whole};
use crate::call::identify::Identify;
use crate::call::Call;
use crate::error::RouterError;
use crate::forward::Forwarder;
use crate::history::changes::Changes;
use crate::history::exchange::HistoryLedger;
use crate::history::Clock;
use crate::metrics::Metrics;
use crate::outcome::{no_instance, Failure, Success};
use crate::recent::{Finished, RecentCalls, Tried};
use crate::retry::RetryBudget;
use crate::select::plugin::Plugins;
use crate::select::{self, Routable, SelectionLimits};
use crate::snapshot::SnapshotHandle;
use crate::trail::{self, Ending, TrailHook};
use crate::tuning::Tuning;

mod preemption;

pub struct RouterService {
    tuning: Tuning,
    breaker: BreakerConfig,
    snapshot: Arc<SnapshotHandle>,
    admission: Admission,
    /// Signs the assertion every forwarded attempt carries.
    assertions: Arc<Assertions>,
    /// Verifies every request's credentials, once ([`crate::call::identify`]).
    identify: Identify,
    forwarder: Forwarder,
    budget: RetryBudget,
    metrics: Metrics,
    /// The last calls, for the console's request lookup (`GET /v1/requests/{id}`).
    recent: Arc<RecentCalls>,
    /// The selection policies plugged into this router (`plugin:NAME`).
    plugins: Plugins,
    /// `adaptive`'s recent weight changes and their reasons, for operators.
    changes: Changes,
    /// Whether outcome histories are exchanged with other routers (`--redis`).
    exchanging: std::sync::atomic::AtomicBool,
    /// Runs workflows' calls (installed by the slow path; none: a workflow's
    /// name answers `TASKS_DISABLED`, runs needing the task store).
    runner: std::sync::OnceLock<Arc<dyn crate::workflows::Runner>>,
    /// Where every call is recorded beyond the ring, when the trail is on.
    trail: std::sync::OnceLock<Arc<TrailHook>>,
}

/// One instance's outcome of a broadcast.
pub type Delivery = (String, Result<Success, Failure>);

impl RouterService {
    pub fn new(
        tuning: Tuning,
        snapshot: Arc<SnapshotHandle>,
        admission: Admission,
        identify: Identify,
        assertions: Arc<Assertions>,
        forwarder: Forwarder,
        metrics: Metrics,
    ) -> Self {
        Self {
            breaker: BreakerConfig {
                failures: tuning.breaker_failures,
                open_for: tuning.breaker_open,
            },
            forwarder,
            budget: RetryBudget::new(tuning.retry_budget_percent, tuning.retry_budget_floor),
            admission,
            tuning,
            snapshot,
            identify,
            assertions,
            metrics,
            recent: Arc::new(RecentCalls::new()),
            plugins: Plugins::new(),
            changes: Changes::default(),
            exchanging: std::sync::atomic::AtomicBool::new(false),
            runner: std::sync::OnceLock::new(),
            trail: std::sync::OnceLock::new(),
        }
    }

    /// Installs what runs workflows' calls (once; the slow path does).
    pub fn serve_workflows(&self, runner: Arc<dyn crate::workflows::Runner>) {
        if self.runner.set(runner).is_err() {
            tracing::warn!(message = "A workflow runner was installed twice; the first one stays.");
        }
    }

    /// Records every call of this part in the trail from now on (set once).
    pub fn record_trail(&self, hook: TrailHook) {
        self.admission.name_chains();
        if self.trail.set(Arc::new(hook)).is_err() {
            tracing::warn!(message = "The trail was set up twice for one part; the first stays.");
        }
    }

    /// The trail's hook, when the trail is on.
    pub(crate) fn trail(&self) -> Option<&Arc<TrailHook>> {
        self.trail.get()
    }

    /// This service with `plugins` as its plugged-in policies.
    pub fn with_plugins(mut self, plugins: Plugins) -> Self {
        self.plugins = plugins;
        self
    }

    /// The selection policies plugged into this router.
    pub fn plugins(&self) -> &Plugins {
        &self.plugins
    }

    /// `adaptive`'s recent weight changes, with their reasons.
    pub fn weight_changes(&self) -> &Changes {
        &self.changes
    }

    /// The outcome history's clock (its bucket from the tuning).
    pub fn history_clock(&self) -> Clock {
        Clock::new(self.tuning.history_bucket)
    }

    /// Starts learning from outcomes (`crate::history::learn`) until the service is dropped.
    pub fn learn_from_outcomes(self: &Arc<Self>) {
        tokio::spawn(crate::history::learn::run(Arc::downgrade(self), self.history_clock()));
    }

    /// Merges this service's outcome histories with the other routers'
    /// through `ledger`, off the request path, until the service is dropped
    /// (`crate::history::exchange`).
    pub fn share_history(self: &Arc<Self>, ledger: Arc<dyn HistoryLedger>) {
        self.exchanging.store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::spawn(crate::history::exchange::run(
            Arc::downgrade(self),
            ledger,
            self.history_clock(),
        ));
    }

    /// Whether histories are exchanged (their drained counts are then kept to send).
    pub(crate) fn history_exchanging(&self) -> bool {
        self.exchanging.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The recent-calls ring.
    pub fn recent(&self) -> &Arc<RecentCalls> {
        &self.recent
    }

    /// How this part verifies credentials (the one place it does).
    pub fn identify(&self) -> &Identify {
        &self.identify
    }

    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn snapshot(&self) -> &SnapshotHandle {
        &self.snapshot
    }

    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Shares this service's limits and quotas with the other routers
    /// meeting at `ledger`, exchanging every `every` until the service is
    /// dropped (`crate::limits::shares`).
    pub fn share_limits(self: &Arc<Self>, ledger: Arc<dyn crate::QuotaLedger>, every: std::time::Duration) {
        tokio::spawn(crate::limits::shares::run(Arc::downgrade(self), ledger, every));
    }

    pub fn assertions(&self) -> &Arc<Assertions> {
        &self.assertions
    }

    pub(crate) fn breaker(&self) -> &BreakerConfig {
        &self.breaker
    }

    /// What the attempt loop draws on for one call.
    pub(crate) fn means(&self) -> Means<'_> {
        Means {
            tuning: &self.tuning,
            budget: &self.budget,
            limits: self.limits(),
            metrics: &self.metrics,
            assertions: &self.assertions,
            forwarder: &self.forwarder,
            breaker: &self.breaker,
            plugins: &self.plugins,
        }
    }

    /// What `select` and `broadcast` need to tell whether an instance can take a request.
    pub(crate) fn limits(&self) -> SelectionLimits<'_> {
        self.admission.limits()
    }

    /// Sets `agent_reach_router_routable_instances` from the snapshot, at
    /// scrape time (never on the request path): per capability, the
    /// instances selection could pick now (the one definition, [`select::routable`]).
    pub fn publish_routable_instances(&self) {
        let snapshot = self.snapshot.load();
        let limits = self.limits();
        let gauge = &self.metrics.routable_instances;
        // Capabilities gone from the snapshot disappear from the scrape.
        gauge.reset();
        for (name, capability) in snapshot.capabilities.iter() {
            let routable: std::collections::HashSet<&str> = capability
                .versions
                .iter()
                .flat_map(|group| group.instances.iter())
                .filter(|instance| select::routable(instance, &limits).is_some())
                .map(|instance| instance.agent_id.as_str())
                .collect();
            gauge
                .with_label_values(&[name.as_str()])
                .set(i64::try_from(routable.len()).unwrap_or(i64::MAX));
        }
    }

    /// A call to one instance, answered whole: admitted (an unpinned call
    /// follows the capability's split), then the attempt loop; recorded in
    /// the recent calls, its request span marked with a failure's code.
    pub async fn invoke(&self, call: &Call) -> Result<Success, Failure> {
        let snapshot = self.snapshot.load_full();
        let admitted = match self.admission.admit(call, &snapshot) {
            Ok(admitted) => admitted,
            // Only a name no capability has can be a workflow's: looked up on this path alone.
            Err(refused) if refused.failure.error.code == crate::error::Code::CapabilityNotFound => {
                let name = &call.checked.request.capability;
                return match snapshot.workflows.get(name) {
                    Some(routed) => self.run_workflow(call, routed.workflow.clone()).await,
                    None => Err(self.refused(call, refused)),
                };
            }
            Err(refused) => return Err(self.refused(call, refused)),
        };
        let capability = admitted.capability;
        let mut tried = Tried::new();
        let result = match attempts::run(self.means(), call, &admitted, Targets::Select, &mut Whole, &mut tried).await {
            Ok(Answered::Done(success)) => Ok(success),
            Ok(Answered::Committed { committed, .. }) => match committed {},
            Err(failure) => Err(failure),
        };
        capability
            .metrics
            .record(result.as_ref().map(|_| ()).map_err(|failure| failure.error.code));
        match &result {
            Ok(success) => self.remember(&Recorded::answered(call, success), tried),
            Err(failure) => {
                self.failed(call, failure);
                let recorded = Recorded::of(call, failure.capability_version.as_deref(), Some(&failure.error));
                self.remember(&recorded, tried);
            }
        }
        result
    }

    /// A call to a workflow: admitted ([`Admission::admit_workflow`]), then
    /// handed to the runner; recorded in the recent calls like any call.
    async fn run_workflow(
        &self,
        call: &Call,
        workflow: Arc<agent_reach_workflows::Workflow>,
    ) -> Result<Success, Failure> {
        let outcome = self.start_workflow(call, &workflow).await;
        let version = workflow.version.to_string();
        match &outcome {
            Ok(_) => self.remember(&Recorded::of(call, Some(&version), None), Tried::new()),
            Err(failure) => {
                self.metrics.record_rejected(failure.error.code);
                self.failed(call, failure);
                self.remember(&Recorded::of(call, Some(&version), Some(&failure.error)), Tried::new());
            }
        }
        outcome
    }

    /// [`RouterService::run_workflow`] without the record (a stream records its own at its end).
    pub(crate) async fn start_workflow(
        &self,
        call: &Call,
        workflow: &Arc<agent_reach_workflows::Workflow>,
    ) -> Result<Success, Failure> {
        match self.admission.admit_workflow(call, workflow) {
            Err(error) => Err(Failure {
                capability_version: Some(workflow.version.to_string()),
                ..error.into()
            }),
            Ok((deadline_ms, _permit)) => match self.runner.get() {
                Some(runner) => runner.run(call, workflow.clone(), deadline_ms).await,
                None => Err(crate::error::RouterError::new(
                    crate::error::Code::TasksDisabled,
                    format!(
                        "`{}` is a workflow; workflows run on the slow path, which needs the router's --redis",
                        workflow.name
                    ),
                )
                .into()),
            },
        }
    }

    /// A refusal at admission: counted (by its capability when it was
    /// resolved), recorded, marked on the span.
    pub(crate) fn refused(&self, call: &Call, Refused { failure, capability }: Refused<'_>) -> Failure {
        if let (Some(span), Some(version)) = (&call.trace.span, &failure.capability_version) {
            span.set(KeyValue::new("capability.version", version.clone()));
        }
        match capability {
            Some(capability) => capability.metrics.record(Err(failure.error.code)),
            None => self.metrics.record_rejected(failure.error.code),
        }
        self.failed(call, &failure);
        let recorded = Recorded::of(call, failure.capability_version.as_deref(), Some(&failure.error));
        self.remember(&recorded, Tried::new());
        *failure
    }

    /// A failed call: its span says so, and so does the log.
    pub(crate) fn failed(&self, call: &Call, failure: &Failure) {
        if let Some(span) = &call.trace.span {
            span.fail(failure.error.code.as_str());
        }
        tracing::info!(
            message = "Invocation failed.",
            trace_id = %call.trace.trace_id, request_id = call.request_id(),
            session_id = call.checked.request.session_id.as_deref().unwrap_or(""),
            capability = %call.checked.request.capability,
            code = failure.error.code.as_str(), error = %failure.error.message,
            attempts = failure.attempts
        );
    }

    /// Records a finished call in the recent-calls ring, and in the trail when it is on.
    pub(crate) fn remember(&self, recorded: &Recorded<'_>, tried: Tried) {
        let finished = recorded.finished();
        if let Some(hook) = self.trail() {
            let capability = &recorded.call.checked.request.capability;
            let entry = hook.begin(recorded.call, self.admission.records_payloads(capability));
            let ending = Ending {
                version: recorded.version,
                error: recorded.error,
                success: recorded.success,
                duration_us: finished.duration_us,
            };
            hook.recorder.offer(trail::finish(hook, entry, &ending, &tried));
        }
        self.recent.record(&finished, tried);
    }

    /// Records a finished call in the recent-calls ring only (a broadcast,
    /// whose members the trail records one by one).
    fn remember_in_ring(&self, recorded: &Recorded<'_>, tried: Tried) {
        self.recent.record(&recorded.finished(), tried);
    }

    /// Fan-out: delivers one envelope to every routable instance of the
    /// admitted version at once (or only to `only`, one child of an
    /// asynchronous broadcast) and returns each instance's outcome. Admitted
    /// for a broadcast (no split); each instance is its own target, its
    /// attempt run by the one loop with no retry. "Routable" is selection's
    /// ([`select::routable`]), and a breaker's half-open probe is claimed as
    /// selection claims it.
    pub async fn broadcast(&self, call: &Call, only: Option<&str>) -> Result<Vec<Delivery>, Failure> {
        let snapshot = self.snapshot.load_full();
        let admitted = self
            .admission
            .admit_broadcast(call, &snapshot)
            .map_err(|refused| *refused.failure)?;
        let (capability, group) = (admitted.capability, admitted.group);
        let targets: Vec<_> = self
            .broadcast_members(&admitted)
            .filter(|instance| only.is_none_or(|agent_id| instance.agent_id == agent_id))
            .filter(|instance| {
                let claimed = instance.state.breaker.try_acquire(self.breaker());
                if claimed {
                    instance.state.sync_breaker_metric();
                }
                claimed
            })
            .collect();
        if targets.is_empty() {
            return Err(Failure {
                error: no_instance(capability, group),
                capability_version: Some(group.version_text.clone()),
                agent_id: None,
                attempts: 0,
            });
        }
        let admitted = &admitted;
        let deliveries = targets.into_iter().map(|instance| async move {
            let mut tried = Tried::new();
            let outcome = attempts::run(
                self.means(),
                call,
                admitted,
                Targets::Only(instance),
                &mut Whole,
                &mut tried,
            )
            .await;
            let outcome = match outcome {
                Ok(Answered::Done(success)) => Ok(success),
                Ok(Answered::Committed { committed, .. }) => match committed {},
                Err(failure) => Err(failure),
            };
            ((instance.agent_id.clone(), outcome), tried)
        });
        let (deliveries, tried_lists): (Vec<Delivery>, Vec<Tried>) =
            futures::future::join_all(deliveries).await.into_iter().unzip();
        let version = Some(group.version_text.as_str());
        // The trail records each member's call, the ring one record for the broadcast.
        if let Some(hook) = self.trail() {
            let payloads = self.admission.records_payloads(&capability.name);
            let duration_us = u64::try_from(call.received.instant.elapsed().as_micros()).unwrap_or(u64::MAX);
            for ((_, outcome), tried) in deliveries.iter().zip(&tried_lists) {
                let ending = Ending {
                    version,
                    error: outcome.as_ref().err().map(|failure| &failure.error),
                    success: outcome.as_ref().ok(),
                    duration_us,
                };
                hook.recorder
                    .offer(trail::finish(hook, hook.begin(call, payloads), &ending, tried));
            }
        }
        self.remember_in_ring(
            &Recorded::of(call, version, None),
            tried_lists.into_iter().flatten().collect(),
        );
        Ok(deliveries)
    }
}

/// A capability as this router offers it now: its highest routed version's
/// description and schemas (JSON texts; empty means "any"), for the
/// protocol doors' descriptions (A2A cards, MCP tools).
#[derive(Debug, Clone)]
pub struct Offered {
    pub name: String,
    pub version: String,
    pub described: Arc<crate::snapshot::Described>,
    /// The version's own deadline for a call (its `timeout_ms`), if it declares one.
    pub timeout: Option<std::time::Duration>,
}

fn offered_workflow(routed: &crate::workflows::RoutedWorkflow) -> Offered {
    Offered {
        name: routed.workflow.name.clone(),
        version: routed.workflow.version.to_string(),
        described: routed.described.clone(),
        // A workflow has no deadline of its own: the call's (or the router's default) applies.
        timeout: None,
    }
}

// === What the doors read of the snapshot ===

impl RouterService {
    /// `capability` as offered now, when any instance offers it, or a
    /// workflow of that name (DESIGN §9: a workflow is called as a capability).
    pub fn offered(&self, capability: &str) -> Option<Offered> {
        let snapshot = self.snapshot.load();
        let Some(found) = snapshot.capabilities.get(capability) else {
            return snapshot
                .workflows
                .get(capability)
                .map(|routed| offered_workflow(routed));
        };
        let group = found.versions.first()?;
        Some(Offered {
            name: found.name.clone(),
            version: group.version_text.clone(),
            described: group.described.clone(),
            timeout: group.timeout,
        })
    }

    /// `payload` checked against the input schema of `capability`'s highest
    /// version (compiled already), for a payload accepted now and delivered
    /// later (a multi-turn task's next message); a capability no instance
    /// offers now passes (its delivery answers for it).
    pub fn check_payload(&self, capability: &str, payload: &serde_json::Value) -> Result<(), RouterError> {
        let snapshot = self.snapshot.load();
        match snapshot
            .capabilities
            .get(capability)
            .and_then(|found| found.versions.first())
        {
            Some(group) => crate::schema::check_input(group, payload),
            None => Ok(()),
        }
    }

    /// Whether any instance offers `capability` now, or a workflow has that name (a lookup, no copy).
    pub fn is_offered(&self, capability: &str) -> bool {
        let snapshot = self.snapshot.load();
        snapshot.capabilities.contains_key(capability) || snapshot.workflows.contains_key(capability)
    }

    /// Every capability offered now, and every workflow, by name.
    pub fn offerings(&self) -> Vec<Offered> {
        let snapshot = self.snapshot.load();
        let mut offered: Vec<Offered> = snapshot
            .capabilities
            .values()
            .filter_map(|capability| {
                let group = capability.versions.first()?;
                Some(Offered {
                    name: capability.name.clone(),
                    version: group.version_text.clone(),
                    described: group.described.clone(),
                    timeout: group.timeout,
                })
            })
            .chain(
                snapshot
                    .workflows
                    .iter()
                    .filter(|(name, _)| !snapshot.capabilities.contains_key(*name))
                    .map(|(_, routed)| offered_workflow(routed)),
            )
            .collect();
        offered.sort_by(|a, b| a.name.cmp(&b.name));
        offered
    }

    /// Workflow `name` as this router knows it now.
    pub fn workflow(&self, name: &str) -> Option<Arc<agent_reach_workflows::Workflow>> {
        self.snapshot
            .load()
            .workflows
            .get(name)
            .map(|routed| routed.workflow.clone())
    }

    /// Every workflow this router knows now, by name.
    pub fn workflows(&self) -> Vec<Arc<agent_reach_workflows::Workflow>> {
        let snapshot = self.snapshot.load();
        let mut workflows: Vec<_> = snapshot
            .workflows
            .values()
            .map(|routed| routed.workflow.clone())
            .collect();
        workflows.sort_by(|a, b| a.name.cmp(&b.name));
        workflows
    }

    /// The instances a broadcast of `call` would reach now (admitted as a
    /// broadcast is, the version the highest that can take it): the
    /// capability's name and their agent ids.
    pub fn broadcast_targets(&self, call: &Call) -> Result<(String, Vec<String>), RouterError> {
        let snapshot = self.snapshot.load_full();
        let admitted = self
            .admission
            .admit_broadcast(call, &snapshot)
            .map_err(|refused| refused.failure.error)?;
        let targets = self
            .broadcast_members(&admitted)
            .map(|instance| instance.agent_id.clone())
            .collect();
        Ok((admitted.capability.name.clone(), targets))
    }

    /// The instances of an admitted broadcast's version that can take it now.
    fn broadcast_members<'a, 's>(
        &'s self,
        admitted: &Admitted<'a>,
    ) -> impl Iterator<Item = &'a Arc<crate::snapshot::Instance>> + use<'a, 's> {
        let limits = self.limits();
        admitted
            .group
            .instances
            .iter()
            .filter(move |instance| select::routable(instance, &limits) == Some(Routable::Yes))
    }

    /// An output reported later (a task's `202`) checked against
    /// `capability` `version`'s output schema, when this router still
    /// routes that version (a version gone since is checked by none); a
    /// mismatch counts against `agent_id`.
    pub fn check_reported_output(
        &self,
        (capability, version): (&str, &str),
        agent_id: &str,
        output: &serde_json::Value,
    ) -> Result<(), RouterError> {
        let snapshot = self.snapshot.load();
        let Some(group) = snapshot
            .capabilities
            .get(capability)
            .and_then(|capability| capability.versions.iter().find(|group| group.version_text == version))
        else {
            return Ok(());
        };
        let raw = serde_json::value::to_raw_value(output).map_err(|error| {
            RouterError::new(crate::error::Code::AgentError, format!("the reported output: {error}"))
        })?;
        crate::schema::check_output(group, Some(&raw), agent_id).inspect_err(|_| {
            if let Some(instance) = group.instances.iter().find(|instance| instance.agent_id == agent_id) {
                instance.state.count_output_mismatch();
            }
        })
    }

    /// Whether every instance of `capability` carries the tag `key: value`
    /// (and there is one): the slow path's per-tag delivery limits.
    pub fn all_instances_tagged(&self, capability: &str, (key, value): (&str, &str)) -> bool {
        let snapshot = self.snapshot.load();
        let Some(capability) = snapshot.capabilities.get(capability) else {
            return false;
        };
        let mut instances = capability
            .versions
            .iter()
            .flat_map(|group| group.instances.iter())
            .peekable();
        instances.peek().is_some()
            && instances.all(|instance| instance.tags.get(key).is_some_and(|tagged| tagged == value))
    }

    /// Whether the snapshot has been filled from the registry (no delivery before).
    pub fn is_synced(&self) -> bool {
        self.snapshot.is_synced()
    }

    /// The instances the snapshot holds, by id (tests and diagnostics).
    pub fn routed_agent_ids(&self) -> Vec<String> {
        self.snapshot.load().agent_ids()
    }

    /// `capability`'s traffic split as the snapshot applies it: `(version,
    /// weight)` of the versions it can draw from, highest first.
    pub fn routed_split(&self, capability: &str) -> Option<Vec<(String, u32)>> {
        let snapshot = self.snapshot.load();
        let capability = snapshot.capabilities.get(capability)?;
        let split = capability.split.as_ref()?;
        Some(
            split
                .shares()
                .iter()
                .filter_map(|(index, weight)| {
                    capability
                        .versions
                        .get(*index)
                        .map(|group| (group.version_text.clone(), *weight))
                })
                .collect(),
        )
    }

    /// An instance's static weight in the snapshot.
    pub fn routed_weight(&self, agent_id: &str) -> Option<u32> {
        let snapshot = self.snapshot.load();
        let found = snapshot
            .capabilities
            .values()
            .flat_map(|capability| capability.versions.iter())
            .flat_map(|group| group.instances.iter())
            .find(|instance| instance.agent_id == agent_id)
            .map(|instance| instance.weight);
        found
    }

    /// Instances in flight across the snapshot, and how many instances it
    /// holds (`GET /v1/tenants`' usage).
    pub fn load_summary(&self) -> (u64, usize) {
        let snapshot = self.snapshot.load();
        let in_flight = snapshot
            .capabilities
            .values()
            .flat_map(|capability| capability.versions.iter())
            .flat_map(|group| group.instances.iter())
            .map(|instance| u64::from(instance.state.inflight()))
            .sum();
        (in_flight, snapshot.instance_count)
    }
}

/// A call as the recent-calls ring records it.
pub(crate) struct Recorded<'a> {
    call: &'a Call,
    version: Option<&'a str>,
    error: Option<&'a RouterError>,
    success: Option<&'a Success>,
}

impl<'a> Recorded<'a> {
    pub(crate) fn of(call: &'a Call, version: Option<&'a str>, error: Option<&'a RouterError>) -> Self {
        Self {
            call,
            version,
            error,
            success: None,
        }
    }

    /// A call answered by `success`.
    pub(crate) fn answered(call: &'a Call, success: &'a Success) -> Self {
        Self {
            call,
            version: Some(&success.capability_version),
            error: None,
            success: Some(success),
        }
    }

    fn finished(&self) -> Finished<'_> {
        let call = self.call;
        let request = &call.checked.request;
        Finished {
            request_id: call.request_id(),
            task_id: call.checked.task_id.as_deref(),
            capability: &request.capability,
            version: self.version,
            caller: call.caller.name(),
            session_id: request.session_id.as_deref(),
            trace_id: &call.trace.trace_id,
            entry: match call.entry {
                crate::call::Entry::Call => "call",
                crate::call::Entry::Delivery => "delivery",
            },
            started_ms: call.received.epoch_ms,
            duration_us: u64::try_from(call.received.instant.elapsed().as_micros()).unwrap_or(u64::MAX),
            error: self.error.map(|error| (error.code.as_str(), error.message.as_str())),
        }
    }
}
