//! The router service, transport-free: authenticate → ACL → resolve
//! capability/version from the snapshot → schema check → pick → forward with
//! the deadline → classify → maybe retry elsewhere. `http` only adapts it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_access::{AclHandle, Authenticator, Caller};
use agent_reach_edge::HeaderLookup;

use agent_reach_proto::envelope::{AgentErrorBody, InvokeRequest, ENVELOPE_VERSION};
use agent_reach_telemetry::spans::{self, KeyValue, SpanKind};
use bytes::Bytes;
use http::StatusCode;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::breaker::{BreakerConfig, Transition};
use crate::clock;
use crate::config::Tuning;
use crate::envelope::CheckedRequest;
use crate::error::{Code, RouterError};
use crate::forward::{header_value_or_dash, AttemptResult, ForwardHeaders, Forwarder};
use crate::health::Observation;
use crate::metrics::Metrics;
use crate::retry::{self, RetryBudget, RetryReason};
use crate::select::{self, SelectionLimits};
use crate::snapshot::{Capability, Snapshot, SnapshotHandle, VersionGroup};
use crate::trace::TraceContext;

/// Schema violations reported per request at most (the rest are counted).
const MAX_SCHEMA_ERRORS: usize = 20;

pub struct RouterService {
    tuning: Tuning,
    breaker: BreakerConfig,
    snapshot: Arc<SnapshotHandle>,
    acl: AclHandle,
    /// Verifies tokens; verified ones are cached per thread by `access`.
    auth: Authenticator,
    /// The slow path, when the router runs with `--redis`.
    tasks: Option<Arc<crate::tasks::Tasks>>,
    forwarder: Forwarder,
    budget: RetryBudget,
    metrics: Metrics,
}

/// A successful call, for the result envelope.
pub struct Success {
    pub capability_version: String,
    pub agent_id: String,
    pub attempts: u32,
    /// The agent's `output`, exactly as it sent it (`None`: absent, i.e. `null`):
    /// checked to be JSON, passed on without being rebuilt (no parse-and-reserialise
    /// per call, and numbers keep their digits).
    pub output: Option<Box<RawValue>>,
}

impl Success {
    /// The output as a JSON value (for stores that keep values). Fails only for
    /// numbers a JSON value cannot hold (e.g. `1e400`).
    pub fn output_value(&self) -> Result<Value, RouterError> {
        let Some(output) = &self.output else {
            return Ok(Value::Null);
        };
        serde_json::from_str(output.get()).map_err(|error| {
            RouterError::new(
                Code::AgentError,
                format!("the agent's output cannot be kept as a JSON value: {error}"),
            )
        })
    }
}

/// [`ForwardedEnvelope`] as the router writes it, borrowing what it already
/// holds instead of copying six strings and the payload per call; written as
/// the same JSON (a test keeps the two equal).
struct Forwarded<'a> {
    version: &'a str,
    request_id: &'a str,
    session_id: Option<&'a str>,
    context_id: Option<&'a str>,
    capability: &'a str,
    capability_version: &'a str,
    source: Option<&'a str>,
    priority: agent_reach_proto::envelope::Priority,
    deadline: u64,
    attempt: u32,
    payload: &'a Value,
}

impl<'a> Forwarded<'a> {
    /// What the router forwards of `request` for `capability` at `capability_version`.
    fn new(
        request: &'a InvokeRequest,
        request_id: &'a str,
        (capability, capability_version): (&'a str, &'a str),
        caller: &'a Caller,
        deadline: u64,
        attempt: u32,
    ) -> Self {
        Self {
            version: ENVELOPE_VERSION,
            request_id,
            session_id: request.session_id.as_deref(),
            context_id: request.context_id.as_deref(),
            capability,
            capability_version,
            source: caller.name(),
            priority: request.priority.unwrap_or_default(),
            deadline,
            attempt,
            payload: &request.payload,
        }
    }

    /// The envelope's JSON, field for field as [`ForwardedEnvelope`] serialises.
    fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        use agent_reach_proto::envelope::Priority;

        let mut out = Vec::with_capacity(256);
        let mut object = crate::json::Object::start(&mut out);
        object.str("version", self.version);
        object.str("request_id", self.request_id);
        object.opt_str("session_id", self.session_id);
        object.opt_str("context_id", self.context_id);
        object.str("capability", self.capability);
        object.str("capability_version", self.capability_version);
        object.opt_str("source", self.source);
        object.str(
            "priority",
            match self.priority {
                Priority::High => "high",
                Priority::Normal => "normal",
                Priority::Low => "low",
            },
        );
        object.u64("deadline", self.deadline);
        object.u64("attempt", u64::from(self.attempt));
        object.value("payload", self.payload)?;
        object.end();
        Ok(out)
    }
}

/// An agent's 2xx answer, `{"output": ...}` (absent: `null`), the output left as raw JSON.
#[derive(serde::Deserialize)]
struct AgentAnswer {
    #[serde(default)]
    output: Option<Box<RawValue>>,
}

/// A failed call: the error plus what is known for the result envelope.
pub struct Failure {
    pub error: RouterError,
    pub capability_version: Option<String>,
    pub agent_id: Option<String>,
    pub attempts: u32,
}

impl From<RouterError> for Failure {
    fn from(error: RouterError) -> Self {
        Self {
            error,
            capability_version: None,
            agent_id: None,
            attempts: 0,
        }
    }
}

/// The last retryable failure seen, to explain an exhausted call.
struct LastFailure {
    reason: RetryReason,
    agent_id: String,
    detail: String,
}

impl RouterService {
    pub fn new(
        tuning: Tuning,
        snapshot: Arc<SnapshotHandle>,
        acl: AclHandle,
        auth: Authenticator,
        metrics: Metrics,
    ) -> Self {
        Self {
            breaker: BreakerConfig {
                failures: tuning.breaker_failures,
                open_for: tuning.breaker_open,
            },
            forwarder: Forwarder::new(tuning.pool_idle_per_instance),
            budget: RetryBudget::new(tuning.retry_budget_percent, tuning.retry_budget_floor),
            tuning,
            snapshot,
            acl,
            auth,
            tasks: None,
            metrics,
        }
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

    /// Enables the slow path (before the service is shared).
    pub fn set_tasks(&mut self, tasks: Arc<crate::tasks::Tasks>) {
        self.tasks = Some(tasks);
    }

    pub fn tasks(&self) -> Option<&Arc<crate::tasks::Tasks>> {
        self.tasks.as_ref()
    }

    /// May `caller` call `capability` under the current policy?
    pub fn acl_allows(&self, caller: &str, capability: &str) -> bool {
        self.acl.current().may_call(caller, capability)
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

    /// Runs one checked request to completion; `received` is when it arrived
    /// (its deadline counts from then).
    pub async fn invoke(
        &self,
        caller: &Caller,
        checked: &CheckedRequest,
        request_id: &str,
        trace: &TraceContext,
        received: clock::Now,
    ) -> Result<Success, Failure> {
        let CheckedRequest {
            request,
            version_req,
            policy,
        } = checked;
        if let Caller::Agent(name) = caller {
            if !self.acl.current().may_call(name, &request.capability) {
                self.metrics.record_rejected(Code::Forbidden);
                return Err(RouterError::new(
                    Code::Forbidden,
                    format!(
                        "caller `{name}` may not call `{}` (acl.yaml permissions)",
                        request.capability
                    ),
                )
                .with_details(json!({ "caller": &**name, "capability": &request.capability }))
                .into());
            }
        }
        let snapshot = self.snapshot.load_full();
        let capability = resolve_capability(&snapshot, &request.capability).inspect_err(|error| {
            self.metrics.record_rejected(error.code);
        })?;
        let result = self
            .invoke_resolved(
                caller,
                capability,
                version_req.as_ref(),
                *policy,
                request,
                request_id,
                trace,
                received,
            )
            .await;
        capability
            .metrics
            .record(result.as_ref().map(|_| ()).map_err(|failure| failure.error.code));
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn invoke_resolved(
        &self,
        caller: &Caller,
        capability: &Capability,
        version_req: Option<&semver::VersionReq>,
        policy: agent_reach_proto::envelope::TargetPolicy,
        request: &InvokeRequest,
        request_id: &str,
        trace: &TraceContext,
        now: clock::Now,
    ) -> Result<Success, Failure> {
        let group = resolve_version(capability, version_req)?;
        if let Some(span) = &trace.span {
            span.set(KeyValue::new("capability.version", group.version_text.clone()));
        }
        let fail = |error: RouterError, agent_id: Option<String>, attempts: u32| Failure {
            error,
            capability_version: Some(group.version_text.clone()),
            agent_id,
            attempts,
        };
        check_schema(group, &request.payload).map_err(|error| fail(error, None, 0))?;

        let deadline_ms = self.deadline_ms(request, group, now.epoch_ms);
        let deadline = now.instant_for(deadline_ms);
        if deadline_ms <= now.epoch_ms {
            return Err(fail(
                RouterError::new(
                    Code::DeadlineExceeded,
                    "the deadline had passed before the call started",
                )
                .with_details(json!({ "deadline": deadline_ms })),
                None,
                0,
            ));
        }

        self.budget.deposit();
        let mut envelope = Forwarded::new(
            request,
            request_id,
            (&capability.name, &group.version_text),
            caller,
            deadline_ms,
            0,
        );
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
        let limits = SelectionLimits {
            breaker: &self.breaker,
            max_inflight: self.tuning.max_inflight_per_instance,
        };
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
            };
            let result = {
                let _inflight = instance.state.start_request();
                self.forwarder
                    .send(&instance.uri, body, &headers, deadline, started)
                    .await
            };
            let elapsed = started.elapsed();
            capability.metrics.forward_seconds.observe(elapsed.as_secs_f64());
            let agent_id = instance.agent_id.clone();

            let (observation, outcome) = classify(result, elapsed);
            let transition = instance.state.observe(observation, &self.breaker);
            log_transition(transition, &agent_id, trace, request_id);
            if let Some(span) = &mut attempt_span {
                span.set(KeyValue::new(
                    "outcome",
                    match &outcome {
                        Outcome::Done(_) => "succeeded",
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
                    return Ok(Success {
                        capability_version: group.version_text.clone(),
                        agent_id,
                        attempts: attempt,
                        output,
                    })
                }
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
}

impl RouterService {
    /// The absolute deadline: the envelope's, else its timeout, else the capability's, else ours.
    fn deadline_ms(&self, request: &InvokeRequest, group: &VersionGroup, now_epoch_ms: u64) -> u64 {
        request.deadline.unwrap_or_else(|| {
            let budget = request
                .timeout_ms
                .map(Duration::from_millis)
                .or(group.timeout)
                .unwrap_or(self.tuning.default_timeout);
            now_epoch_ms.saturating_add(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX))
        })
    }

    /// Fan-out: delivers one envelope to every routable (`ready`/`busy`)
    /// instance of the resolved version at once (or only to `only`, one child
    /// of an asynchronous broadcast) and returns each instance's outcome. Same checks as [`RouterService::invoke`] (ACL, version,
    /// schema, deadline); no retries, since every instance is its own target.
    pub async fn broadcast(
        &self,
        caller: &Caller,
        checked: CheckedRequest,
        request_id: &str,
        trace: &TraceContext,
        only: Option<&str>,
    ) -> Result<Vec<(String, Result<Success, Failure>)>, Failure> {
        let CheckedRequest {
            request, version_req, ..
        } = checked;
        if let Caller::Agent(name) = caller {
            if !self.acl_allows(name, &request.capability) {
                return Err(RouterError::new(
                    Code::Forbidden,
                    format!(
                        "caller `{name}` may not call `{}` (acl.yaml permissions)",
                        request.capability
                    ),
                )
                .into());
            }
        }
        let snapshot = self.snapshot.load_full();
        let capability = resolve_capability(&snapshot, &request.capability)?;
        let group = resolve_version(capability, version_req.as_ref())?;
        let version = group.version_text.clone();
        check_schema(group, &request.payload).map_err(|error| Failure {
            error,
            capability_version: Some(version.clone()),
            agent_id: None,
            attempts: 0,
        })?;
        let targets: Vec<_> = group
            .instances
            .iter()
            .filter(|instance| {
                matches!(
                    instance.status,
                    crate::snapshot::Status::Ready | crate::snapshot::Status::Busy
                )
            })
            .filter(|instance| only.is_none_or(|agent_id| instance.agent_id == agent_id))
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
        let now = clock::Now::read();
        let deadline_ms = self.deadline_ms(&request, group, now.epoch_ms);
        let deadline = now.instant_for(deadline_ms);
        let envelope = Forwarded::new(
            &request,
            request_id,
            (&capability.name, &version),
            caller,
            deadline_ms,
            1,
        );
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
                let headers = ForwardHeaders { traceparent };
                let started = Instant::now();
                let result = {
                    let _inflight = instance.state.start_request();
                    self.forwarder
                        .send(&instance.uri, body, &headers, deadline, Instant::now())
                        .await
                };
                let (observation, outcome) = classify(result, started.elapsed());
                log_transition(
                    instance.state.observe(observation, &self.breaker),
                    &instance.agent_id,
                    trace,
                    request_id,
                );
                let agent_id = instance.agent_id.clone();
                let outcome = match outcome {
                    Outcome::Done(output) => Ok(Success {
                        capability_version: version.clone(),
                        agent_id: agent_id.clone(),
                        attempts: 1,
                        output,
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

enum Outcome {
    Done(Option<Box<RawValue>>),
    Fatal(RouterError),
    Retryable(RetryReason, String),
}

/// Maps one attempt's result to its health observation and what the router does next.
fn classify(result: AttemptResult, elapsed: Duration) -> (Observation, Outcome) {
    match result {
        AttemptResult::Answered { status, body } if status.is_success() => {
            match serde_json::from_slice::<AgentAnswer>(&body) {
                Ok(answer) => (Observation::Healthy(elapsed), Outcome::Done(answer.output)),
                Err(error) => (
                    Observation::Failed,
                    Outcome::Fatal(RouterError {
                        agent_status: Some(StatusCode::BAD_GATEWAY),
                        ..RouterError::new(
                            Code::AgentError,
                            format!("the agent answered {status} without a valid `{{\"output\": ...}}` body: {error}"),
                        )
                        .with_details(json!({ "agent_status": status.as_u16() }))
                    }),
                ),
            }
        }
        AttemptResult::Answered { status, body } => {
            let agent = serde_json::from_slice::<AgentErrorBody>(&body)
                .ok()
                .map(|body| body.error);
            let detail = agent
                .as_ref()
                .map(|error| format!("{} {}: {}", status.as_u16(), error.code, error.message))
                .unwrap_or_else(|| format!("{}", status.as_u16()));
            match status {
                StatusCode::SERVICE_UNAVAILABLE => (
                    Observation::Failed,
                    Outcome::Retryable(RetryReason::Unavailable, detail),
                ),
                StatusCode::TOO_MANY_REQUESTS => {
                    (Observation::Busy, Outcome::Retryable(RetryReason::Overloaded, detail))
                }
                _ => {
                    // The agent's own business answer: passed through, never retried.
                    let observation = if status.is_server_error() {
                        Observation::Failed
                    } else {
                        Observation::Healthy(elapsed)
                    };
                    let (code, message) = agent
                        .map(|error| (error.code, error.message))
                        .unwrap_or_else(|| (String::new(), format!("the agent answered {status}")));
                    let error = RouterError {
                        agent_status: Some(status),
                        ..RouterError::new(Code::AgentError, message)
                            .with_details(json!({ "agent_status": status.as_u16(), "agent_code": code }))
                    };
                    (observation, Outcome::Fatal(error))
                }
            }
        }
        AttemptResult::ConnectFailed(why) => (Observation::Failed, Outcome::Retryable(RetryReason::Connect, why)),
        AttemptResult::Broken(why) => (Observation::Failed, Outcome::Retryable(RetryReason::Reset, why)),
        AttemptResult::TimedOut => (
            Observation::Failed,
            Outcome::Fatal(RouterError::new(
                Code::DeadlineExceeded,
                "the agent did not answer before the deadline",
            )),
        ),
    }
}

/// Logs a breaker transition with the ids of the request whose outcome caused it.
fn log_transition(transition: Transition, agent_id: &str, trace: &TraceContext, request_id: &str) {
    let trace_id = trace.trace_id.as_str();
    match transition {
        Transition::Opened => tracing::warn!(message = "Circuit breaker opened.", agent_id, trace_id, request_id),
        Transition::Closed => tracing::info!(message = "Circuit breaker closed.", agent_id, trace_id, request_id),
        Transition::None => {}
    }
}

fn attempts_details(failures: &[LastFailure]) -> Value {
    json!({
        "attempts": failures
            .iter()
            .map(|failure| json!({
                "agent_id": failure.agent_id,
                "reason": failure.reason.as_str(),
                "detail": failure.detail,
            }))
            .collect::<Vec<_>>()
    })
}

/// Every attempt failed retryably: `OVERLOADED` when every instance said 429, else `ALL_RETRIES_EXHAUSTED`.
fn exhausted(failures: &[LastFailure]) -> RouterError {
    let all_busy = !failures.is_empty() && failures.iter().all(|failure| failure.reason == RetryReason::Overloaded);
    let (code, message) = if all_busy {
        (
            Code::Overloaded,
            format!("every instance tried ({}) is overloaded (429)", failures.len()),
        )
    } else {
        (
            Code::AllRetriesExhausted,
            format!("{} attempt(s) failed on unavailable instances", failures.len()),
        )
    };
    RouterError::new(code, message).with_details(attempts_details(failures))
}

fn no_instance(capability: &Capability, group: &VersionGroup) -> RouterError {
    RouterError::new(
        Code::NoAvailableInstance,
        format!(
            "no instance of `{}` {} can take a request now ({} registered; none ready, busy or overloaded \
             with a closed circuit)",
            capability.name,
            group.version_text,
            group.instances.len()
        ),
    )
    .with_details(json!({ "capability": capability.name, "version": group.version_text }))
}

pub fn resolve_capability<'a>(snapshot: &'a Snapshot, name: &str) -> Result<&'a Capability, RouterError> {
    snapshot.capabilities.get(name).ok_or_else(|| {
        RouterError::new(Code::CapabilityNotFound, format!("no agent offers capability `{name}`"))
            .with_details(json!({ "capability": name }))
    })
}

/// The highest version matching `requirement` (or the highest overall).
pub fn resolve_version<'a>(
    capability: &'a Capability,
    requirement: Option<&semver::VersionReq>,
) -> Result<&'a Arc<VersionGroup>, RouterError> {
    let found = match requirement {
        None => capability.versions.first(),
        Some(requirement) => capability
            .versions
            .iter()
            .find(|group| requirement.matches(&group.version)),
    };
    found.ok_or_else(|| {
        let available: Vec<&str> = capability
            .versions
            .iter()
            .map(|group| group.version_text.as_str())
            .collect();
        let requested = requirement.map(ToString::to_string).unwrap_or_default();
        RouterError::new(
            Code::VersionNotFound,
            format!(
                "no version of `{}` matches `{requested}`; available: {}",
                capability.name,
                available.join(", ")
            ),
        )
        .with_details(json!({ "capability": capability.name, "requested": requested, "available": available }))
    })
}

/// Validates the payload with the version's compiled input schema.
pub fn check_schema(group: &VersionGroup, payload: &Value) -> Result<(), RouterError> {
    let Some(validator) = &group.validator else {
        return Ok(());
    };
    if validator.is_valid(payload) {
        return Ok(());
    }
    let mut errors = Vec::new();
    let mut total = 0usize;
    for error in validator.iter_errors(payload) {
        total += 1;
        if errors.len() < MAX_SCHEMA_ERRORS {
            errors.push(json!({
                "pointer": error.instance_path.to_string(),
                "message": error.to_string(),
            }));
        }
    }
    let first = errors
        .first()
        .and_then(|error| error["pointer"].as_str())
        .map(|pointer| {
            if pointer.is_empty() {
                "/".to_string()
            } else {
                pointer.to_string()
            }
        })
        .unwrap_or_default();
    Err(RouterError::new(
        Code::SchemaMismatch,
        format!(
            "payload does not match the input schema of {} ({total} problem(s), first at `{first}`)",
            group.version_text
        ),
    )
    .with_details(json!({ "errors": errors, "total": total })))
}

#[cfg(test)]
mod tests {
    use agent_reach_proto::envelope::{ForwardedEnvelope, Priority};

    use super::*;

    /// The borrowed envelope the router writes is the agents' `ForwardedEnvelope`, byte for byte.
    #[test]
    fn the_forwarded_envelope_is_written_as_the_contract_type() {
        let payload = json!({ "order_id": "SO-1", "lines": [1, 2.5, "x\"y"] });
        let cases = [
            (Some("s-1"), Some("c-1"), Some("caller"), "req-1", Priority::High),
            (None, None, None, "req\"\\2", Priority::Normal),
            (Some("s\u{1}"), None, Some("c\n"), "r", Priority::Low),
        ];
        for (session_id, context_id, source, request_id, priority) in cases {
            let borrowed = Forwarded {
                version: ENVELOPE_VERSION,
                request_id,
                session_id,
                context_id,
                capability: "order.query",
                capability_version: "1.2.0",
                source,
                priority,
                deadline: 1_700_000_000_123,
                attempt: 2,
                payload: &payload,
            };
            let owned = ForwardedEnvelope {
                version: ENVELOPE_VERSION.to_string(),
                request_id: request_id.to_string(),
                session_id: session_id.map(str::to_string),
                context_id: context_id.map(str::to_string),
                capability: "order.query".to_string(),
                capability_version: "1.2.0".to_string(),
                source: source.map(str::to_string),
                priority,
                deadline: 1_700_000_000_123,
                attempt: 2,
                payload: payload.clone(),
            };
            let written = String::from_utf8(borrowed.to_vec().unwrap()).unwrap();
            assert_eq!(written, serde_json::to_string(&owned).unwrap());
            assert_eq!(serde_json::from_str::<ForwardedEnvelope>(&written).unwrap(), owned);
        }
    }
}
