//! The router service, transport-free: every door hands it a [`Call`] (an
//! identified caller and a checked envelope, `crate::pipeline`); it admits
//! the call ([`crate::admission`]) and runs its attempts through the one
//! loop (`crate::pipeline::attempts`): answered whole ([`RouterService::invoke`]),
//! streamed (`RouterService::stream`, in `crate::stream`), or delivered to
//! every routable instance at once ([`RouterService::broadcast`]). Every
//! call is recorded in the recent calls and its failures logged here once.

use std::sync::Arc;

use agent_reach_access::Assertions;
use agent_reach_telemetry::spans::KeyValue;

use crate::admission::{Admission, Admitted, Refused};
use crate::breaker::{BreakerConfig, Transition};
use crate::error::RouterError;
use crate::forward::Forwarder;
use crate::metrics::Metrics;
use crate::outcome::{no_instance, Failure, Success};
use crate::pipeline::attempts::{self, Answered, Targets, Whole};
use crate::pipeline::identify::Identify;
use crate::pipeline::Call;
use crate::recent::{Finished, RecentCalls, Trail};
use crate::retry::RetryBudget;
use crate::select::{self, Routable, SelectionLimits};
use crate::snapshot::SnapshotHandle;
use crate::trace::TraceContext;
use crate::tuning::Tuning;

pub struct RouterService {
    tuning: Tuning,
    breaker: BreakerConfig,
    snapshot: Arc<SnapshotHandle>,
    admission: Admission,
    /// Signs the assertion every forwarded attempt carries.
    assertions: Arc<Assertions>,
    /// Verifies every request's credentials, once ([`crate::pipeline::identify`]).
    identify: Identify,
    forwarder: Forwarder,
    budget: RetryBudget,
    metrics: Metrics,
    /// The last calls, for the console's request lookup (`GET /v1/requests/{id}`).
    recent: Arc<RecentCalls>,
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
        }
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

    pub fn snapshot(&self) -> &SnapshotHandle {
        &self.snapshot
    }

    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    pub fn assertions(&self) -> &Assertions {
        &self.assertions
    }

    /// The retry budget every attempt loop draws on (the streamed invoke's too).
    pub(crate) fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The agent client (the streamed invoke makes its connections with it).
    pub(crate) fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }

    pub(crate) fn breaker(&self) -> &BreakerConfig {
        &self.breaker
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
        let admitted = self.admit(call, &snapshot)?;
        let capability = admitted.capability;
        let mut trail = Trail::new();
        let result = match attempts::run(self, call, &admitted, Targets::Select, &mut Whole, &mut trail).await {
            Ok(Answered::Done(success)) => Ok(success),
            Ok(Answered::Committed { committed, .. }) => match committed {},
            Err(failure) => Err(failure),
        };
        capability
            .metrics
            .record(result.as_ref().map(|_| ()).map_err(|failure| failure.error.code));
        match &result {
            Ok(success) => self.remember(&Recorded::of(call, Some(&success.capability_version), None), trail),
            Err(failure) => {
                self.failed(call, failure);
                let recorded = Recorded::of(call, failure.capability_version.as_deref(), Some(&failure.error));
                self.remember(&recorded, trail);
            }
        }
        result
    }

    /// Admits `call` for one instance; a refusal is counted, recorded and marked on its span.
    pub(crate) fn admit<'s>(
        &self,
        call: &Call,
        snapshot: &'s crate::snapshot::Snapshot,
    ) -> Result<Admitted<'s>, Failure> {
        let checked = &call.checked;
        let admitted = self.admission.admit(
            &call.caller,
            call.entry,
            &checked.request,
            checked.version_req.as_ref(),
            snapshot,
            call.received,
        );
        admitted.map_err(|refused| self.refused(call, refused))
    }

    /// A refusal at admission: counted (by its capability when it was
    /// resolved), recorded, marked on the span.
    fn refused(&self, call: &Call, Refused { failure, capability }: Refused<'_>) -> Failure {
        if let (Some(span), Some(version)) = (&call.trace.span, &failure.capability_version) {
            span.set(KeyValue::new("capability.version", version.clone()));
        }
        match capability {
            Some(capability) => capability.metrics.record(Err(failure.error.code)),
            None => self.metrics.record_rejected(failure.error.code),
        }
        self.failed(call, &failure);
        let recorded = Recorded::of(call, failure.capability_version.as_deref(), Some(&failure.error));
        self.remember(&recorded, Trail::new());
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

    /// Records a finished call in the recent-calls ring.
    pub(crate) fn remember(&self, call: &Recorded<'_>, trail: Trail) {
        self.recent.record(&call.finished(), trail);
    }

    /// Fan-out: delivers one envelope to every routable instance of the
    /// admitted version at once (or only to `only`, one child of an
    /// asynchronous broadcast) and returns each instance's outcome. Admitted
    /// for a broadcast (no split); each instance is its own target, its
    /// attempt run by the one loop with no retry. "Routable" is selection's
    /// ([`select::routable`]), and a breaker's half-open probe is claimed as
    /// selection claims it.
    pub async fn broadcast(&self, call: &Call, only: Option<&str>) -> Result<Vec<Delivery>, Failure> {
        let checked = &call.checked;
        let snapshot = self.snapshot.load_full();
        let admitted = self
            .admission
            .admit_broadcast(
                &call.caller,
                call.entry,
                &checked.request,
                checked.version_req.as_ref(),
                &snapshot,
                call.received,
            )
            .map_err(|refused| *refused.failure)?;
        let (capability, group) = (admitted.capability, admitted.group);
        let limits = self.limits();
        let targets: Vec<_> = group
            .instances
            .iter()
            .filter(|instance| only.is_none_or(|agent_id| instance.agent_id == agent_id))
            .filter(|instance| select::routable(instance, &limits) == Some(Routable::Yes))
            .filter(|instance| {
                let claimed = instance.state.breaker.try_acquire(limits.breaker);
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
            let mut trail = Trail::new();
            let outcome = attempts::run(self, call, admitted, Targets::Only(instance), &mut Whole, &mut trail).await;
            let outcome = match outcome {
                Ok(Answered::Done(success)) => Ok(success),
                Ok(Answered::Committed { committed, .. }) => match committed {},
                Err(failure) => Err(failure),
            };
            ((instance.agent_id.clone(), outcome), trail)
        });
        let (deliveries, trails): (Vec<Delivery>, Vec<Trail>) =
            futures::future::join_all(deliveries).await.into_iter().unzip();
        // One record for the broadcast, every member's attempt in it.
        let version = Some(group.version_text.as_str());
        self.remember(
            &Recorded::of(call, version, None),
            trails.into_iter().flatten().collect(),
        );
        Ok(deliveries)
    }
}

/// A call as the recent-calls ring records it.
pub(crate) struct Recorded<'a> {
    call: &'a Call,
    version: Option<&'a str>,
    error: Option<&'a RouterError>,
}

impl<'a> Recorded<'a> {
    pub(crate) fn of(call: &'a Call, version: Option<&'a str>, error: Option<&'a RouterError>) -> Self {
        Self { call, version, error }
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
                crate::admission::Entry::Call => "call",
                crate::admission::Entry::Delivery => "delivery",
            },
            started_ms: call.received.epoch_ms,
            duration_us: u64::try_from(call.received.instant.elapsed().as_micros()).unwrap_or(u64::MAX),
            error: self.error.map(|error| (error.code.as_str(), error.message.as_str())),
        }
    }
}

/// Logs a breaker transition with the ids of the request whose outcome caused it.
pub(crate) fn log_transition(transition: Transition, agent_id: &str, trace: &TraceContext, request_id: &str) {
    let trace_id = trace.trace_id.as_str();
    match transition {
        Transition::Opened => tracing::warn!(message = "Circuit breaker opened.", agent_id, trace_id, request_id),
        Transition::Closed => tracing::info!(message = "Circuit breaker closed.", agent_id, trace_id, request_id),
        Transition::None => {}
    }
}
