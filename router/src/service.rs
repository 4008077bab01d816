//! The router service, transport-free: every front door hands it an
//! authenticated caller and a checked envelope; it admits the call
//! ([`crate::admission`]), then picks an instance ([`crate::select`]),
//! forwards with the deadline, classifies the outcome ([`crate::outcome`])
//! and maybe retries elsewhere (`invoke`), or delivers to every routable
//! instance at once (`broadcast`). `http` and the task worker only adapt it.

use std::sync::Arc;
use std::time::Instant;

use agent_reach_access::{Authenticator, Caller};
use agent_reach_serving::HeaderLookup;
use agent_reach_telemetry::spans::{self, KeyValue, SpanKind};
use bytes::Bytes;

use crate::admission::{Admission, Admitted, Entry, Refused};
use crate::breaker::{BreakerConfig, Transition};
use crate::clock;
use crate::envelope::CheckedRequest;
use crate::error::{Code, RouterError};
use crate::forward::{header_value_or_dash, ForwardHeaders, Forwarder};
use crate::json::Forwarded;
use crate::metrics::Metrics;
use crate::outcome::{
    accepted_without_task, attempts_details, classify, exhausted, no_instance, Accepted, Failure, LastFailure, Outcome,
    Success,
};
use crate::recent::{Attempt, Finished, RecentCalls, Trail};
use crate::retry::{self, RetryBudget};
use crate::schema;
use crate::select::{self, Routable, SelectionLimits};
use crate::snapshot::SnapshotHandle;
use crate::trace::TraceContext;
use crate::tuning::Tuning;
use agent_reach_access::Assertions;

pub struct RouterService {
    tuning: Tuning,
    breaker: BreakerConfig,
    snapshot: Arc<SnapshotHandle>,
    admission: Admission,
    /// Signs the assertion every forwarded attempt carries.
    assertions: Arc<Assertions>,
    /// Verifies tokens; verified ones are cached per thread by `access`.
    auth: Authenticator,
    forwarder: Forwarder,
    budget: RetryBudget,
    metrics: Metrics,
    /// The last calls, for the console's request lookup (`GET /v1/requests/{id}`).
    recent: RecentCalls,
}

/// A call on its way: who, how it entered, what, when (the attempt loop
/// reads it; the recent-calls ring records it with its outcome).
struct Recorded<'a> {
    caller: &'a Caller,
    entry: Entry,
    checked: &'a CheckedRequest,
    request_id: &'a str,
    trace: &'a TraceContext,
    received: clock::Now,
}

/// One instance's outcome of a broadcast.
pub type Delivery = (String, Result<Success, Failure>);

impl RouterService {
    pub fn new(
        tuning: Tuning,
        snapshot: Arc<SnapshotHandle>,
        admission: Admission,
        auth: Authenticator,
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
            auth,
            assertions,
            metrics,
            recent: RecentCalls::new(),
        }
    }

    /// The recent-calls ring.
    pub(crate) fn recent(&self) -> &RecentCalls {
        &self.recent
    }

    /// The authenticator (the console seals and reopens operators' tokens it verified).
    pub(crate) fn authenticator(&self) -> &Authenticator {
        &self.auth
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

    /// The caller the request's `authorization` header names.
    pub fn authenticate(&self, headers: &impl HeaderLookup) -> Result<Caller, RouterError> {
        self.authenticate_at(headers, clock::epoch_ms())
    }

    /// [`RouterService::authenticate`] at `epoch_ms`, the request's clock reading.
    pub fn authenticate_at(&self, headers: &impl HeaderLookup, epoch_ms: u64) -> Result<Caller, RouterError> {
        self.auth
            .verify_value_at(headers.value("authorization"), epoch_ms)
            .map_err(RouterError::from)
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

    /// Runs one checked request to completion; `received` is when it arrived
    /// (its deadline counts from then).
    pub async fn invoke(
        &self,
        caller: &Caller,
        entry: Entry,
        checked: &CheckedRequest,
        request_id: &str,
        trace: &TraceContext,
        received: clock::Now,
    ) -> Result<Success, Failure> {
        let snapshot = self.snapshot.load_full();
        let admitted = match self.admission.admit_one(
            caller,
            entry,
            &checked.request,
            checked.version_req.as_ref(),
            &snapshot,
            received,
        ) {
            Ok(admitted) => admitted,
            Err(Refused { failure, capability }) => {
                if let (Some(span), Some(version)) = (&trace.span, &failure.capability_version) {
                    span.set(KeyValue::new("capability.version", version.clone()));
                }
                match capability {
                    Some(capability) => capability.metrics.record(Err(failure.error.code)),
                    None => self.metrics.record_rejected(failure.error.code),
                }
                let call = Recorded {
                    caller,
                    entry,
                    checked,
                    request_id,
                    trace,
                    received,
                };
                self.remember(
                    &call,
                    failure.capability_version.as_deref(),
                    Some(&failure.error),
                    Trail::new(),
                );
                return Err(*failure);
            }
        };
        let capability = admitted.capability;
        let call = Recorded {
            caller,
            entry,
            checked,
            request_id,
            trace,
            received,
        };
        let mut trail = Trail::new();
        let result = self.attempts(&call, &admitted, &mut trail).await;
        capability
            .metrics
            .record(result.as_ref().map(|_| ()).map_err(|failure| failure.error.code));
        match &result {
            Ok(success) => self.remember(&call, Some(&success.capability_version), None, trail),
            Err(failure) => self.remember(
                &call,
                failure.capability_version.as_deref(),
                Some(&failure.error),
                trail,
            ),
        }
        result
    }

    /// Records a finished call in the recent-calls ring.
    fn remember(&self, call: &Recorded<'_>, version: Option<&str>, error: Option<&RouterError>, trail: Trail) {
        let request = &call.checked.request;
        self.recent.record(
            &Finished {
                request_id: call.request_id,
                task_id: call.checked.task_id.as_deref(),
                capability: &request.capability,
                version,
                caller: call.caller.name(),
                session_id: request.session_id.as_deref(),
                trace_id: &call.trace.trace_id,
                entry: match call.entry {
                    Entry::Call => "call",
                    Entry::Delivery => "delivery",
                },
                started_ms: call.received.epoch_ms,
                duration_us: u64::try_from(call.received.instant.elapsed().as_micros()).unwrap_or(u64::MAX),
                error: error.map(|error| (error.code.as_str(), error.message.as_str())),
            },
            trail,
        );
    }

    /// The attempt loop of an admitted call: pick, forward, classify, maybe
    /// retry on another instance within the attempt limit, the retry budget
    /// and the deadline.
    async fn attempts(
        &self,
        call: &Recorded<'_>,
        admitted: &Admitted<'_>,
        trail: &mut Trail,
    ) -> Result<Success, Failure> {
        let &Recorded {
            caller,
            checked,
            request_id,
            trace,
            received: now,
            ..
        } = call;
        let CheckedRequest {
            request,
            policy,
            task_id,
            ..
        } = checked;
        let policy = *policy;
        let Admitted {
            capability,
            group,
            deadline_ms,
            deadline,
            ..
        } = *admitted;
        if let Some(span) = &trace.span {
            span.set(KeyValue::new("capability.version", group.version_text.clone()));
        }
        let fail = |error: RouterError, agent_id: Option<String>, attempts: u32| Failure {
            error,
            capability_version: Some(group.version_text.clone()),
            agent_id,
            attempts,
        };
        self.budget.deposit();
        let mut envelope = Forwarded::new(
            request,
            request_id,
            (&capability.name, &group.version_text),
            caller,
            deadline_ms,
            0,
        );
        envelope.task_id = task_id.as_deref();
        // Without OpenTelemetry spans, every attempt carries the router's own span id.
        let fallback_traceparent = trace.forward_header();
        // Selection and attempt spans only for traces that are kept (an unsampled
        // span costs as much as a sampled one): under the request's span, or under
        // the `tracing` span this runs in (a task's delivery) when that one is sampled.
        let parent_span = match &trace.span {
            Some(span) => Some(span.clone()),
            None if trace.sampled => spans::current(),
            None => None,
        };
        let limits = self.limits();
        // At most `max_attempts` (<= 10): inline, no allocation per request.
        let mut tried: smallvec::SmallVec<[usize; 10]> = smallvec::SmallVec::new();
        let mut failures: Vec<LastFailure> = Vec::new();
        let session_id = envelope.session_id;

        loop {
            let attempt = tried.len() as u32 + 1;
            // The first pick starts at the request's `now`; a retry's after its pause.
            let picked_at = if attempt == 1 { now.instant } else { Instant::now() };
            let select_span = parent_span.as_ref().map(|span| {
                span.child(
                    "select",
                    SpanKind::Internal,
                    vec![
                        KeyValue::new("policy", policy.as_str()),
                        KeyValue::new("attempt", i64::from(attempt)),
                    ],
                )
            });
            let picked = select::pick(group, policy, session_id, &tried, &limits);
            drop(select_span);
            // Selection ends and the attempt starts at one clock reading.
            let started = Instant::now();
            self.metrics
                .selection_seconds
                .observe(started.saturating_duration_since(picked_at).as_secs_f64());
            let Some((index, instance)) = picked else {
                return Err(if failures.is_empty() {
                    fail(no_instance(capability, group), None, 0)
                } else {
                    fail(
                        exhausted(&failures),
                        failures.last().map(|f| f.agent_id.clone()),
                        attempt - 1,
                    )
                });
            };
            tried.push(index);
            envelope.attempt = attempt;
            let authorization = match self
                .assertions
                .header(caller, &instance.agent_id, &capability.name, deadline_ms, now.epoch_ms)
                .map_err(assertion_failed)
            {
                Ok(header) => header,
                Err(error) => return Err(fail(error, Some(instance.agent_id.clone()), attempt - 1)),
            };
            let body = match envelope.to_vec() {
                Ok(body) => Bytes::from(body),
                Err(error) => {
                    return Err(fail(
                        RouterError::new(Code::InvalidEnvelope, format!("payload cannot be forwarded: {error}")),
                        None,
                        attempt - 1,
                    ))
                }
            };
            // A client span per attempt; the agent's span becomes its child through `traceparent`.
            let mut attempt_span = parent_span.as_ref().map(|span| {
                span.child(
                    "attempt",
                    SpanKind::Client,
                    vec![
                        KeyValue::new("agent_id", instance.agent_id.clone()),
                        KeyValue::new("attempt", i64::from(attempt)),
                        KeyValue::new("server.address", instance.endpoint.clone()),
                    ],
                )
            });
            let traceparent = attempt_span.as_ref().map(|span| span.traceparent());
            let headers = ForwardHeaders {
                traceparent: traceparent
                    .as_deref()
                    .map_or(&fallback_traceparent[..], |text| header_value_or_dash(text)),
                authorization: authorization.as_bytes(),
            };
            let fair = instance.state.fair_budget(deadline.saturating_duration_since(started));
            let result = {
                let _inflight = instance.state.start_request();
                self.forwarder
                    .send(&instance.uri, body, &headers, deadline, started)
                    .await
            };
            let elapsed = started.elapsed();
            capability.metrics.forward_seconds.observe(elapsed.as_secs_f64());
            let agent_id = instance.agent_id.clone();

            let (observation, outcome) = classify(result, elapsed, fair);
            if let Some(instance) = group.instances.get(index) {
                trail.push(Attempt {
                    instance: instance.clone(),
                    duration_us: u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                    outcome: match &outcome {
                        Outcome::Done(_) => "succeeded",
                        Outcome::Accepted => "accepted",
                        Outcome::Fatal(_) => "failed",
                        Outcome::Retryable(reason, _) => reason.as_str(),
                    },
                });
            }
            let transition = instance.state.observe(observation, &self.breaker);
            log_transition(transition, &agent_id, trace, request_id);
            if let Some(span) = &mut attempt_span {
                span.set(KeyValue::new(
                    "outcome",
                    match &outcome {
                        Outcome::Done(_) => "succeeded",
                        Outcome::Accepted => "accepted",
                        Outcome::Fatal(_) => "failed",
                        Outcome::Retryable(..) => "retryable",
                    },
                ));
                if let Outcome::Retryable(reason, _) = &outcome {
                    span.set(KeyValue::new("retry.reason", reason.as_str()));
                }
            }
            drop(attempt_span);
            let reason = match outcome {
                Outcome::Done(output) => {
                    if let Err(error) = schema::check_output(group, output.as_deref(), &agent_id) {
                        instance.state.count_output_mismatch();
                        return Err(fail(error, Some(agent_id), attempt));
                    }
                    return Ok(Success {
                        capability_version: group.version_text.clone(),
                        agent_id,
                        attempts: attempt,
                        output,
                        accepted: None,
                    });
                }
                Outcome::Accepted if task_id.is_some() => {
                    return Ok(Success {
                        capability_version: group.version_text.clone(),
                        agent_id,
                        attempts: attempt,
                        output: None,
                        accepted: Some(Accepted {
                            agent_name: instance.name.clone(),
                            deadline_ms,
                        }),
                    });
                }
                Outcome::Accepted => return Err(fail(accepted_without_task(), Some(agent_id), attempt)),
                Outcome::Fatal(error) => return Err(fail(error, Some(agent_id), attempt)),
                Outcome::Retryable(reason, detail) => {
                    failures.push(LastFailure {
                        reason,
                        agent_id: agent_id.clone(),
                        detail,
                    });
                    reason
                }
            };
            tracing::debug!(
                message = "Attempt failed; may retry.",
                trace_id = %trace.trace_id, request_id, session_id = session_id.unwrap_or(""),
                %agent_id, attempt, reason = reason.as_str()
            );
            if attempt >= self.tuning.max_attempts {
                return Err(fail(exhausted(&failures), Some(agent_id), attempt));
            }
            let pause = retry::backoff(attempt);
            if Instant::now() + pause >= deadline {
                return Err(fail(
                    RouterError::new(
                        Code::DeadlineExceeded,
                        format!(
                            "no time left to retry after {attempt} attempt(s); last: {}",
                            reason.as_str()
                        ),
                    )
                    .with_details(attempts_details(&failures)),
                    Some(agent_id),
                    attempt,
                ));
            }
            if !self.budget.try_withdraw() {
                self.metrics.retry_budget_exhausted.inc();
                let mut error = exhausted(&failures);
                error.message = format!(
                    "retry budget exhausted (retries are capped to protect agents); {}",
                    error.message
                );
                return Err(fail(error, Some(agent_id), attempt));
            }
            self.metrics.retries.with_label_values(&[reason.as_str()]).inc();
            tokio::time::sleep(pause).await;
        }
    }

    /// Fan-out: delivers one envelope to every routable instance of the
    /// admitted version at once (or only to `only`, one child of an
    /// asynchronous broadcast) and returns each instance's outcome. Admitted
    /// as [`RouterService::invoke`] is; no retries, since every instance is
    /// its own target. "Routable" is selection's ([`select::routable`]), and a
    /// breaker's half-open probe is claimed as selection claims it.
    pub async fn broadcast(
        &self,
        caller: &Caller,
        entry: Entry,
        checked: CheckedRequest,
        request_id: &str,
        trace: &TraceContext,
        only: Option<&str>,
    ) -> Result<Vec<Delivery>, Failure> {
        let CheckedRequest {
            request,
            version_req,
            task_id,
            ..
        } = checked;
        let now = clock::Now::read();
        let snapshot = self.snapshot.load_full();
        let Admitted {
            capability,
            group,
            deadline_ms,
            deadline,
            permit: _permit,
        } = self
            .admission
            .admit(caller, entry, &request, version_req.as_ref(), &snapshot, now)
            .map_err(|refused| *refused.failure)?;
        let version = group.version_text.clone();
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
            .cloned()
            .collect();
        if targets.is_empty() {
            return Err(Failure {
                error: no_instance(capability, group),
                capability_version: Some(version),
                agent_id: None,
                attempts: 0,
            });
        }
        let mut envelope = Forwarded::new(
            &request,
            request_id,
            (&capability.name, &version),
            caller,
            deadline_ms,
            1,
        );
        envelope.task_id = task_id.as_deref();
        let is_task = task_id.is_some();
        let body = Bytes::from(envelope.to_vec().map_err(|error| {
            Failure::from(RouterError::new(
                Code::InvalidEnvelope,
                format!("payload cannot be forwarded: {error}"),
            ))
        })?);
        let traceparent = trace.forward_header();
        let deliveries = targets.into_iter().map(|instance| {
            let body = body.clone();
            let (traceparent, version) = (&traceparent, &version);
            async move {
                let authorization = self
                    .assertions
                    .header(caller, &instance.agent_id, &capability.name, deadline_ms, now.epoch_ms)
                    .map_err(assertion_failed);
                let started = Instant::now();
                let result = match &authorization {
                    Ok(authorization) => {
                        let headers = ForwardHeaders {
                            traceparent,
                            authorization: authorization.as_bytes(),
                        };
                        let _inflight = instance.state.start_request();
                        self.forwarder
                            .send(&instance.uri, body, &headers, deadline, Instant::now())
                            .await
                    }
                    Err(error) => {
                        let agent_id = instance.agent_id.clone();
                        let failure = Failure {
                            error: error.clone(),
                            capability_version: Some(version.clone()),
                            agent_id: Some(agent_id.clone()),
                            attempts: 0,
                        };
                        return (agent_id, Err(failure));
                    }
                };
                let fair = instance.state.fair_budget(deadline.saturating_duration_since(started));
                let (observation, outcome) = classify(result, started.elapsed(), fair);
                log_transition(
                    instance.state.observe(observation, &self.breaker),
                    &instance.agent_id,
                    trace,
                    request_id,
                );
                let agent_id = instance.agent_id.clone();
                let outcome = match outcome {
                    Outcome::Done(output) => match schema::check_output(group, output.as_deref(), &agent_id) {
                        Ok(()) => Ok(Success {
                            capability_version: version.clone(),
                            agent_id: agent_id.clone(),
                            attempts: 1,
                            output,
                            accepted: None,
                        }),
                        Err(error) => {
                            instance.state.count_output_mismatch();
                            Err(Failure {
                                error,
                                capability_version: Some(version.clone()),
                                agent_id: Some(agent_id.clone()),
                                attempts: 1,
                            })
                        }
                    },
                    Outcome::Accepted if is_task => Ok(Success {
                        capability_version: version.clone(),
                        agent_id: agent_id.clone(),
                        attempts: 1,
                        output: None,
                        accepted: Some(Accepted {
                            agent_name: instance.name.clone(),
                            deadline_ms,
                        }),
                    }),
                    Outcome::Accepted => Err(Failure {
                        error: accepted_without_task(),
                        capability_version: Some(version.clone()),
                        agent_id: Some(agent_id.clone()),
                        attempts: 1,
                    }),
                    Outcome::Fatal(error) => Err(Failure {
                        error,
                        capability_version: Some(version.clone()),
                        agent_id: Some(agent_id.clone()),
                        attempts: 1,
                    }),
                    Outcome::Retryable(reason, detail) => Err(Failure {
                        error: RouterError::new(
                            Code::AllRetriesExhausted,
                            format!("the instance was unavailable ({}): {detail}", reason.as_str()),
                        ),
                        capability_version: Some(version.clone()),
                        agent_id: Some(agent_id.clone()),
                        attempts: 1,
                    }),
                };
                (agent_id, outcome)
            }
        });
        Ok(futures::future::join_all(deliveries).await)
    }
}

/// The assertion for an attempt could not be signed.
pub(crate) fn assertion_failed(error: String) -> RouterError {
    RouterError::new(Code::AssertionFailed, error)
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
