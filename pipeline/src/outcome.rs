//! What one call came to: [`Success`] or [`Failure`] for the result envelope,
//! and how an attempt's raw result ([`AttemptResult`]) is classified into a
//! health observation and what the router does next (done, fatal, retry
//! elsewhere), with the errors that explain an exhausted or unroutable call.

use std::time::Duration;

use agent_reach_proto::envelope::AgentErrorBody;
use http::StatusCode;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::error::{Code, RouterError};
use crate::forward::AttemptResult;
use crate::health::Observation;
use crate::retry::RetryReason;
use crate::snapshot::{Capability, VersionGroup};

/// A successful call, for the result envelope.
pub struct Success {
    pub capability_version: String,
    pub agent_id: String,
    pub attempts: u32,
    /// The agent's `output`, exactly as it sent it (`None`: absent, i.e. `null`):
    /// checked to be JSON, passed on without being rebuilt (no parse-and-reserialise
    /// per call, and numbers keep their digits).
    pub output: Option<Box<RawValue>>,
    /// A task's delivery the agent answered `202 Accepted`: no output yet, the
    /// agent reports it later (DESIGN §8). Never set outside task deliveries,
    /// except beside `run` for a run still going at the call's deadline.
    pub accepted: Option<Accepted>,
    /// A task's delivery the agent paused for higher-priority work (DESIGN
    /// §9), with the checkpoint to resume from. Never set outside task deliveries.
    pub paused: Option<Paused>,
    /// A call to a workflow (DESIGN §9): the run that answered it (its id is
    /// also the envelope's `agent_id`). With `accepted`, the run had not
    /// ended by the call's deadline: the output is `{run_id, status}` and
    /// `/v1/invoke` answers `202`.
    pub run: Option<String>,
    /// What is left of the call's budget once it ended, when it carried one.
    pub budget: Option<agent_reach_proto::envelope::BudgetLeft>,
}

/// A delivery its agent paused (DESIGN §9, preemption).
#[derive(Debug)]
pub struct Paused {
    /// What the handler needs to resume, as it sent it (`None`: nothing).
    pub checkpoint: Option<Box<RawValue>>,
}

/// What a `202` to a task delivery leaves to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The instance's agent name: only a token with this subject may report.
    pub agent_name: String,
    /// The delivery's absolute deadline (epoch ms): no report by then fails the task.
    pub deadline_ms: u64,
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

/// An agent's 2xx answer, `{"output": ..., "usage"?: ...}` (absent output:
/// `null`), the output left as raw JSON, the usage read only when present.
#[derive(serde::Deserialize)]
pub(crate) struct AgentAnswer {
    #[serde(default)]
    output: Option<Box<RawValue>>,
    #[serde(default)]
    usage: Option<Box<RawValue>>,
    /// `{"paused": {"checkpoint": …}}`: a preemptible delivery paused (DESIGN §9).
    #[serde(default)]
    paused: Option<PausedAnswer>,
}

#[derive(serde::Deserialize)]
pub(crate) struct PausedAnswer {
    #[serde(default)]
    checkpoint: Option<Box<RawValue>>,
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
pub(crate) struct LastFailure {
    pub reason: RetryReason,
    pub agent_id: String,
    pub detail: String,
}

pub(crate) enum Outcome {
    /// The output and, when the agent reported it, what the call cost it
    /// (raw: read by `crate::usage` only when present).
    Done(Option<Box<RawValue>>, Option<Box<RawValue>>),
    /// `202 Accepted`: the agent reports the outcome later (task deliveries only).
    Accepted,
    /// The agent paused the delivery, with its checkpoint (task deliveries only).
    Paused(Option<Box<RawValue>>),
    Fatal(RouterError),
    Retryable(RetryReason, String),
}

/// Maps one attempt's result to its health observation and what the router
/// does next. `fair`: the attempt's budget was one the instance should have
/// met ([`crate::health::InstanceState::fair_budget`]); a timeout or 504
/// within an unfair one is [`Observation::Unjudged`].
pub(crate) fn classify(result: AttemptResult, elapsed: Duration, fair: bool) -> (Observation, Outcome) {
    let timed_out = if fair {
        Observation::Failed
    } else {
        Observation::Unjudged
    };
    match result {
        // Whether a 202 may stand is the caller's to decide: only a task's delivery may be answered so.
        AttemptResult::Answered { status, .. } if status == StatusCode::ACCEPTED => {
            (Observation::Healthy(elapsed), Outcome::Accepted)
        }
        AttemptResult::Answered { status, body } if status.is_success() => {
            match serde_json::from_slice::<AgentAnswer>(&body) {
                Ok(AgentAnswer {
                    paused: Some(paused), ..
                }) => (Observation::Healthy(elapsed), Outcome::Paused(paused.checkpoint)),
                Ok(answer) => (
                    Observation::Healthy(elapsed),
                    Outcome::Done(answer.output, answer.usage),
                ),
                Err(error) => (
                    Observation::Failed,
                    Outcome::Fatal(
                        RouterError::new(
                            Code::AgentError,
                            format!("the agent answered {status} without a valid `{{\"output\": ...}}` body: {error}"),
                        )
                        .with_details(json!({ "agent_status": status.as_u16() }))
                        .with_passthrough(StatusCode::BAD_GATEWAY),
                    ),
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
                // The agent refused the router's assertion (one that expired in
                // transit after a partition, a key it has not fetched yet): it
                // did not run the call, so another attempt, with a fresh
                // assertion, is safe. Counted against the instance: one that
                // refuses every assertion can serve nothing.
                StatusCode::UNAUTHORIZED if agent.as_ref().is_some_and(|error| error.code == "UNAUTHENTICATED") => {
                    (Observation::Failed, Outcome::Retryable(RetryReason::Refused, detail))
                }
                // The agent gave up at the call's own deadline a moment before
                // this router's timer did (the SDKs enforce the envelope's
                // deadline): the same outcome as a timeout here, so the same code.
                StatusCode::GATEWAY_TIMEOUT
                    if agent.as_ref().is_some_and(|error| error.code == "DEADLINE_EXCEEDED") =>
                {
                    (
                        timed_out,
                        Outcome::Fatal(RouterError::new(
                            Code::DeadlineExceeded,
                            "the agent did not finish before the deadline",
                        )),
                    )
                }
                _ => {
                    // The agent's own business answer: passed through, never retried.
                    let observation = if status == StatusCode::GATEWAY_TIMEOUT {
                        timed_out
                    } else if status.is_server_error() {
                        Observation::Failed
                    } else {
                        Observation::Healthy(elapsed)
                    };
                    let (code, message) = agent
                        .map(|error| (error.code, error.message))
                        .unwrap_or_else(|| (String::new(), format!("the agent answered {status}")));
                    let error = RouterError::new(Code::AgentError, message)
                        .with_details(json!({ "agent_status": status.as_u16(), "agent_code": code }))
                        .with_passthrough(status);
                    (observation, Outcome::Fatal(error))
                }
            }
        }
        AttemptResult::ConnectFailed(why) => (Observation::Failed, Outcome::Retryable(RetryReason::Connect, why)),
        AttemptResult::Broken(why) => (Observation::Failed, Outcome::Retryable(RetryReason::Reset, why)),
        AttemptResult::TimedOut => (
            timed_out,
            Outcome::Fatal(RouterError::new(
                Code::DeadlineExceeded,
                "the agent did not answer before the deadline",
            )),
        ),
    }
}

/// The stable code an agent answers (with any 4xx status) when it needs more
/// input before it can answer (docs/design.md, "Multi-turn tasks"): its
/// message says what it needs.
pub const INPUT_REQUIRED: &str = "INPUT_REQUIRED";

/// What the agent asked for, when a call failed because it needs more input
/// (an `AGENT_ERROR` passing through a 4xx answer coded [`INPUT_REQUIRED`]).
pub fn input_required(error: &RouterError) -> Option<&str> {
    let asks = error.code == Code::AgentError
        && error.passthrough.is_some_and(|status| status.is_client_error())
        && error
            .details
            .as_deref()
            .and_then(|details| details.get("agent_code"))
            .and_then(Value::as_str)
            == Some(INPUT_REQUIRED);
    asks.then_some(error.message.as_str())
}

/// A `202` to a call that is not a task's delivery: nothing could ever report its outcome.
pub(crate) fn paused_without_task() -> RouterError {
    RouterError::new(
        Code::AgentError,
        "the agent paused a call that is not a task's delivery: only tasks are paused (DESIGN §9)",
    )
    .with_details(json!({ "agent_status": 200, "agent_code": "PAUSED" }))
    .with_passthrough(StatusCode::BAD_GATEWAY)
}

pub(crate) fn accepted_without_task() -> RouterError {
    RouterError::new(
        Code::AgentError,
        "the agent answered 202 Accepted, which only a task's delivery (POST /v1/tasks) may be answered; \
         answer 200 {\"output\": ...} to a synchronous call",
    )
    .with_details(json!({ "agent_status": 202 }))
    .with_passthrough(StatusCode::BAD_GATEWAY)
}

pub(crate) fn attempts_details(failures: &[LastFailure]) -> Value {
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
pub(crate) fn exhausted(failures: &[LastFailure]) -> RouterError {
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

pub(crate) fn no_instance(capability: &Capability, group: &VersionGroup) -> RouterError {
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
