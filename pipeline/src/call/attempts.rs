//! The one attempt loop. Every call that goes to an instance runs its
//! attempts here, whichever door it came through (invoke, a stream, a task's
//! delivery, a broadcast member, A2A, MCP): pick an instance (or take the one
//! given), sign its assertion, forward, classify the outcome, update the
//! instance's health and breaker, and maybe retry elsewhere within the
//! attempt limit, the retry budget and the deadline, with a span per
//! attempt and every attempt in the call's list of attempts (`Tried`).
//!
//! What differs between a whole answer and a stream is only how one attempt
//! reaches its instance and what a committed answer becomes ([`Exchange`]):
//! a stream commits once the agent's answer head says events follow, and is
//! never retried after that.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use agent_reach_telemetry::spans::{self, KeyValue, SpanKind};
use bytes::Bytes;

use agent_reach_access::Assertions;

use crate::admission::Admitted;
use crate::breaker::{BreakerConfig, Transition};
use crate::call::Call;
use crate::error::{Code, RouterError};
use crate::forward::{header_value_or_dash, AttemptResult, ForwardHeaders, Forwarder};
use crate::health::Observation;
use crate::history::Kind;
use crate::json::Forwarded;
use crate::metrics::Metrics;
use crate::outcome::{
    accepted_without_task, attempts_details, classify, exhausted, no_instance, paused_without_task, Accepted, Failure,
    LastFailure, Outcome, Success,
};
use crate::recent::{Attempt, Tried};
use crate::retry::{self, RetryBudget};
use crate::schema;
use crate::select::plugin::{CallView, Plugins};
use crate::select::{self, Policy, SelectionLimits};
use crate::snapshot::Instance;
use crate::trace::TraceContext;
use crate::tuning::Tuning;
use crate::usage;

/// Which instances a call's attempts may go to.
#[derive(Clone, Copy)]
pub(crate) enum Targets<'a> {
    /// Picked by the call's policy among the version's routable instances,
    /// and retried elsewhere by the retry rules.
    Select,
    /// This one instance, one attempt (a broadcast member: every instance is
    /// its own target; its breaker probe was claimed when it was chosen).
    Only(&'a Arc<Instance>),
}

/// What one attempt's exchange came to.
pub(crate) enum Sent<C> {
    /// The agent committed to a streamed answer: its events follow.
    Committed(C),
    /// A whole answer, or a failure, as the forwarder reports it.
    Answered(AttemptResult),
}

/// How an attempt reaches its instance: the answer read whole, or a stream
/// opened up to its head.
pub(crate) trait Exchange {
    /// What a committed answer hands on (nothing, for whole answers).
    type Committed: Send;

    /// One attempt, until its answer (or head).
    fn attempt<'a>(&'a mut self, outbound: Outbound<'a>) -> impl Future<Output = Sent<Self::Committed>> + Send + 'a;
}

/// One attempt's request: `body` to `instance` with `headers` through
/// `forwarder`, giving up at `deadline`; `started` is the attempt's start.
pub(crate) struct Outbound<'a> {
    pub(crate) forwarder: &'a Forwarder,
    pub(crate) instance: &'a Instance,
    pub(crate) body: Bytes,
    pub(crate) headers: ForwardHeaders<'a>,
    pub(crate) deadline: Instant,
    pub(crate) started: Instant,
}

/// Whole answers: the agent's JSON read to its end.
pub(crate) struct Whole;

impl Exchange for Whole {
    type Committed = std::convert::Infallible;

    async fn attempt(&mut self, outbound: Outbound<'_>) -> Sent<Self::Committed> {
        let Outbound {
            forwarder,
            instance,
            body,
            headers,
            deadline,
            started,
        } = outbound;
        let _inflight = instance.state.start_request();
        Sent::Answered(forwarder.send(&instance.uri, body, &headers, deadline, started).await)
    }
}

/// What the attempts of an admitted call came to.
pub(crate) enum Answered<C> {
    /// A whole answer, checked against the output schema (or a task's `202`).
    Done(Success),
    /// A streamed answer, committed: no attempt follows.
    Committed {
        committed: C,
        agent_id: String,
        attempts: u32,
    },
}

/// What the loop draws on, lent by the router's service for one call (the
/// loop sits below the service, which hands it only these).
pub(crate) struct Means<'a> {
    pub(crate) tuning: &'a Tuning,
    pub(crate) budget: &'a RetryBudget,
    pub(crate) limits: SelectionLimits<'a>,
    pub(crate) metrics: &'a Metrics,
    pub(crate) assertions: &'a Assertions,
    pub(crate) forwarder: &'a Forwarder,
    pub(crate) breaker: &'a BreakerConfig,
    /// The policies plugged into this router (`plugin:NAME`).
    pub(crate) plugins: &'a Plugins,
}

/// The attempts of `call`, admitted as `admitted`, to `targets` through
/// `exchange`; every attempt is pushed onto `made`.
pub(crate) async fn run<E: Exchange>(
    means: Means<'_>,
    call: &Call,
    admitted: &Admitted<'_>,
    targets: Targets<'_>,
    exchange: &mut E,
    made: &mut Tried,
) -> Result<Answered<E::Committed>, Failure> {
    let Call {
        caller,
        checked,
        trace,
        received: now,
        ..
    } = call;
    let request_id = call.request_id();
    let task_id = checked.task_id.as_deref();
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
    // The caller's policy, else the capability's (DESIGN §9), else the default.
    let named = checked
        .policy
        .as_ref()
        .or(capability.policy.as_ref())
        .unwrap_or(&select::DEFAULT);
    if let Some(span) = &trace.span {
        // The policy this call's selection follows (the select spans say it per attempt too).
        span.set(KeyValue::new("policy", named.to_string()));
    }
    let policy = match Policy::resolve(named, means.plugins) {
        Ok(policy) => policy,
        Err(name) if checked.policy.is_some() => {
            return Err(fail(unknown_plugin(name, means.plugins), None, 0));
        }
        Err(name) => {
            // The operator's choice names a plug-in this router lacks: said once per snapshot.
            if !capability
                .policy_reported
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(
                    message = "The capability's policy names a plug-in this router does not have; its calls use weighted_round_robin.",
                    capability = %capability.name, plugin = name
                );
            }
            Policy::WeightedRoundRobin
        }
    };
    // One attempt to a given instance is not a retry candidate: it earns the budget nothing.
    let max_attempts = match targets {
        Targets::Select => {
            means.budget.deposit();
            means.tuning.max_attempts
        }
        Targets::Only(_) => 1,
    };
    let mut envelope = Forwarded::new(
        &checked.request,
        request_id,
        (&capability.name, &group.version_text),
        caller,
        deadline_ms,
        0,
    );
    envelope.task_id = task_id;
    envelope.budget = admitted.budget.as_ref().map(|(_, left)| *left);
    envelope.history = checked.history.as_ref();
    envelope.run_id = checked.run_id.as_deref();
    envelope.checkpoint = checked.checkpoint.as_ref();
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
    let limits = &means.limits;
    // At most `max_attempts` (<= 10): inline, no allocation per request.
    let mut tried: smallvec::SmallVec<[usize; 10]> = smallvec::SmallVec::new();
    let mut failures: Vec<LastFailure> = Vec::new();
    let session_id = envelope.session_id;

    loop {
        let attempt = tried.len() as u32 + 1;
        let instance: &Arc<Instance> = match targets {
            Targets::Only(instance) => {
                tried.push(usize::MAX);
                instance
            }
            Targets::Select => {
                // The first pick starts at the request's `now`; a retry's after its pause.
                let picked_at = if attempt == 1 { now.instant } else { Instant::now() };
                let select_span = parent_span.as_ref().map(|span| {
                    span.child(
                        "select",
                        SpanKind::Internal,
                        vec![
                            KeyValue::new("policy", named.to_string()),
                            KeyValue::new("attempt", i64::from(attempt)),
                        ],
                    )
                });
                let call = CallView {
                    capability: &capability.name,
                    version: &group.version_text,
                    session_id,
                    attempt,
                };
                let picked = select::pick(group, policy, &call, &tried, limits).map(|(index, _)| index);
                drop(select_span);
                means
                    .metrics
                    .selection_seconds
                    .observe(picked_at.elapsed().as_secs_f64());
                let Some(index) = picked else {
                    return Err(if failures.is_empty() {
                        fail(no_instance(capability, group), None, 0)
                    } else {
                        fail(
                            exhausted(&failures),
                            failures.last().map(|failure| failure.agent_id.clone()),
                            attempt - 1,
                        )
                    });
                };
                tried.push(index);
                &group.instances[index]
            }
        };
        envelope.attempt = attempt;
        // A chain that reaches this capability on this instance again loops.
        if admitted.delegation.visited(&capability.name, &instance.agent_id) {
            return Err(fail(
                loop_detected(caller, &capability.name, &instance.agent_id, &admitted.delegation),
                Some(instance.agent_id.clone()),
                attempt - 1,
            ));
        }
        let authorization = match means.assertions.header(
            caller,
            (&instance.agent_id, &capability.name),
            &admitted.delegation,
            checked.run_id.as_deref(),
            deadline_ms,
            now.epoch_ms,
        ) {
            Ok(header) => header,
            Err(error) => {
                return Err(fail(
                    RouterError::new(Code::AssertionFailed, error),
                    Some(instance.agent_id.clone()),
                    attempt - 1,
                ))
            }
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
        let started = Instant::now();
        // A timeout within a budget shorter than the instance ever needs is the caller's, not its fault.
        let fair = instance.state.fair_budget(deadline.saturating_duration_since(started));
        let outbound = Outbound {
            forwarder: means.forwarder,
            instance,
            body,
            headers,
            deadline,
            started,
        };
        let sent = exchange.attempt(outbound).await;
        let elapsed = started.elapsed();
        capability.metrics.forward_seconds.observe(elapsed.as_secs_f64());
        let agent_id = instance.agent_id.clone();
        let history = match targets {
            Targets::Select => tried.last().and_then(|index| group.histories.get(*index)),
            Targets::Only(only) => group
                .instances
                .iter()
                .position(|instance| Arc::ptr_eq(instance, only))
                .and_then(|index| group.histories.get(index)),
        };
        let (observation, outcome) = match sent {
            Sent::Committed(committed) => {
                if let Some(history) = history {
                    history.record(Kind::Succeeded, Some(elapsed));
                }
                let transition = instance.state.observe(Observation::Healthy(elapsed), means.breaker);
                log_transition(transition, &agent_id, trace, request_id);
                made.push(attempt_of(instance, elapsed, "succeeded"));
                if let Some(span) = &mut attempt_span {
                    span.set(KeyValue::new("outcome", "succeeded"));
                }
                if let Some(span) = &trace.span {
                    span.set(KeyValue::new("gen_ai.agent.id", agent_id.clone()));
                }
                return Ok(Answered::Committed {
                    committed,
                    agent_id,
                    attempts: attempt,
                });
            }
            Sent::Answered(result) => classify(result, elapsed, fair),
        };
        if let (Some(history), Some(kind)) = (history, kind_of(&observation, &outcome)) {
            history.record(
                kind,
                matches!(kind, Kind::Succeeded | Kind::AgentError).then_some(elapsed),
            );
        }
        made.push(attempt_of(
            instance,
            elapsed,
            match &outcome {
                Outcome::Done(..) => "succeeded",
                Outcome::Accepted => "accepted",
                Outcome::Paused(_) => "paused",
                Outcome::Fatal(_) => "failed",
                Outcome::Retryable(reason, _) => reason.as_str(),
            },
        ));
        let transition = instance.state.observe(observation, means.breaker);
        log_transition(transition, &agent_id, trace, request_id);
        if let Some(span) = &mut attempt_span {
            span.set(KeyValue::new(
                "outcome",
                match &outcome {
                    Outcome::Done(..) => "succeeded",
                    Outcome::Accepted => "accepted",
                    Outcome::Paused(_) => "paused",
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
            Outcome::Done(output, usage) => {
                if let Err(error) = schema::check_output(group, output.as_deref(), &agent_id) {
                    instance.state.count_output_mismatch();
                    return Err(fail(error, Some(agent_id), attempt));
                }
                if let Some(span) = &trace.span {
                    span.set(KeyValue::new("gen_ai.agent.id", agent_id.clone()));
                }
                if let Some(usage) = usage::parse(usage.as_deref(), &agent_id) {
                    usage::record(&usage, &capability.metrics.model_tokens, trace.span.as_ref());
                    if let Some((ledger, _)) = &admitted.budget {
                        capability.metrics.budget_cost.inc_by(ledger.spend(usage.cost));
                    }
                }
                return Ok(Answered::Done(Success {
                    capability_version: group.version_text.clone(),
                    agent_id,
                    attempts: attempt,
                    output,
                    accepted: None,
                    run: None,
                    paused: None,
                    budget: admitted.budget.as_ref().map(|(ledger, _)| ledger.left()),
                }));
            }
            // A preemptible task's delivery paused for higher-priority work (DESIGN §9).
            Outcome::Paused(checkpoint) if task_id.is_some() => {
                return Ok(Answered::Done(Success {
                    capability_version: group.version_text.clone(),
                    agent_id,
                    attempts: attempt,
                    output: None,
                    accepted: None,
                    run: None,
                    paused: Some(crate::outcome::Paused { checkpoint }),
                    budget: admitted.budget.as_ref().map(|(ledger, _)| ledger.left()),
                }));
            }
            Outcome::Paused(_) => return Err(fail(paused_without_task(), Some(agent_id), attempt)),
            Outcome::Accepted if task_id.is_some() => {
                return Ok(Answered::Done(Success {
                    capability_version: group.version_text.clone(),
                    agent_id,
                    attempts: attempt,
                    output: None,
                    accepted: Some(Accepted {
                        agent_name: instance.name.clone(),
                        deadline_ms,
                    }),
                    run: None,
                    paused: None,
                    budget: admitted.budget.as_ref().map(|(ledger, _)| ledger.left()),
                }));
            }
            Outcome::Accepted => return Err(fail(accepted_without_task(), Some(agent_id), attempt)),
            Outcome::Fatal(error) => return Err(fail(error, Some(agent_id), attempt)),
            Outcome::Retryable(reason, detail) if matches!(targets, Targets::Only(_)) => {
                // The one instance a broadcast member has: nowhere else to go.
                return Err(fail(
                    RouterError::new(
                        Code::AllRetriesExhausted,
                        format!("the instance was unavailable ({}): {detail}", reason.as_str()),
                    ),
                    Some(agent_id),
                    attempt,
                ));
            }
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
        if attempt >= max_attempts {
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
        if !means.budget.try_withdraw() {
            means.metrics.retry_budget_exhausted.inc();
            let mut error = exhausted(&failures);
            error.message = format!(
                "retry budget exhausted (retries are capped to protect agents); {}",
                error.message
            );
            return Err(fail(error, Some(agent_id), attempt));
        }
        means.metrics.retries.with_label_values(&[reason.as_str()]).inc();
        tokio::time::sleep(pause).await;
    }
}

/// The refusal of a call whose chain already reached `capability` on `agent_id`.
fn loop_detected(
    caller: &agent_reach_access::Caller,
    capability: &str,
    agent_id: &str,
    delegation: &agent_reach_access::Delegation,
) -> RouterError {
    let name = caller.name().unwrap_or("");
    RouterError::new(
        Code::LoopDetected,
        format!("the delegation chain already reached `{capability}` on `{agent_id}`: a loop"),
    )
    .with_details(serde_json::json!({
        "capability": capability,
        "agent_id": agent_id,
        "depth": delegation.depth,
        "chain": delegation.names(name),
    }))
}

/// How the outcome history counts an attempt; `None` for one it does not
/// judge (a timeout within a budget shorter than the instance ever needs).
fn kind_of(observation: &Observation, outcome: &Outcome) -> Option<Kind> {
    Some(match (observation, outcome) {
        (Observation::Unjudged, _) => return None,
        (_, Outcome::Done(..) | Outcome::Accepted) => Kind::Succeeded,
        (Observation::Healthy(_), Outcome::Fatal(_)) => Kind::AgentError,
        (_, Outcome::Fatal(error)) if error.code == Code::DeadlineExceeded => Kind::Timeout,
        _ => Kind::ServerError,
    })
}

/// A call naming a plug-in this router does not have.
fn unknown_plugin(name: &str, plugins: &Plugins) -> RouterError {
    let known: Vec<String> = plugins.names().map(|name| format!("plugin:{name}")).collect();
    RouterError::field(
        Code::InvalidEnvelope,
        "target_policy",
        format!(
            "this router has no policy plugin `{name}` (plugged in: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ),
    )
}

/// One attempt as the call's list of attempts keeps it.
fn attempt_of(instance: &Arc<Instance>, elapsed: std::time::Duration, outcome: &'static str) -> Attempt {
    Attempt {
        instance: instance.clone(),
        duration_us: u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        outcome,
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
