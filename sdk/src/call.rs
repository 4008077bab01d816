//! One call to the router's caller API, shared by handlers' [`Ctx`](crate::Ctx)
//! calls and the [`Client`](crate::Client): the options a caller may give, the
//! invoke envelope built from them, and the router's answer turned into a
//! result or a [`CallError`] carrying the router's stable code.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_reach_proto::envelope::{BudgetGiven, InvokeRequest, ResultEnvelope, ResultStatus, TargetPolicy};
use agent_reach_proto::Priority;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::CallError;

/// The HTTP client for the router, the registry and JWKS: trusting only `ca` when given.
pub(crate) fn http_client(ca: Option<&std::path::Path>) -> Result<reqwest::Client, crate::error::StartError> {
    let mut builder = reqwest::Client::builder();
    if let Some(path) = ca {
        let pem = std::fs::read(path).map_err(|error| {
            crate::error::StartError::Config(format!("cannot read the CA file {}: {error}", path.display()))
        })?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|error| {
            crate::error::StartError::Config(format!("{}: not PEM certificates: {error}", path.display()))
        })?;
        if certificates.is_empty() {
            return Err(crate::error::StartError::Config(format!(
                "{}: no certificate in it",
                path.display()
            )));
        }
        builder = builder.tls_built_in_root_certs(false);
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder
        .build()
        .map_err(|error| crate::error::StartError::Config(format!("the HTTP client: {error}")))
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

/// A fresh request id, shaped as the router makes them (design §3.13): the
/// epoch milliseconds as 12 hex digits, then 16 random ones. The trail
/// finds a request id of that shape by its time, with no index write.
pub(crate) fn new_id() -> String {
    format!("{:012x}{:016x}", now_ms() & 0xffff_ffff_ffff, rand::random::<u64>())
}

/// How to make one call: which versions, which policy, how urgent, how long
/// (DESIGN §3.2). Everything is optional; the default is the router's (the
/// highest version with a routable instance, weighted round-robin, `normal`,
/// the capability's own timeout).
///
/// ```
/// use std::time::Duration;
/// use agent_reach_sdk::{CallOptions, Priority, TargetPolicy};
/// let options = CallOptions::new()
///     .version("^1.2")
///     .policy(TargetPolicy::LeastConnections)
///     .priority(Priority::High)
///     .timeout(Duration::from_secs(2));
/// assert_eq!(options.timeout_ms(), Some(2000));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallOptions {
    version: Option<String>,
    policy: Option<TargetPolicy>,
    priority: Option<Priority>,
    timeout: Option<Duration>,
    session_id: Option<String>,
    context_id: Option<String>,
    request_id: Option<String>,
    budget: Option<BudgetGiven>,
}

impl CallOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// A semver requirement (`^1.2`, `=1.2.0`); the router takes the highest
    /// matching version that has an instance able to take the call.
    pub fn version(mut self, requirement: &str) -> Self {
        self.version = Some(requirement.to_string());
        self
    }

    pub fn policy(mut self, policy: TargetPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// How urgent the call is (forwarded to the agent; orders task delivery).
    /// A handler's calls carry its own request's priority unless set here.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
    }

    /// A budget for this call and every call made on its behalf down the
    /// delegation chain (DESIGN §9): `calls` in all, and `cost` in the unit
    /// agents report with [`crate::Ctx::report_usage`]; `None` is no limit of
    /// that kind. A handler's calls spend from the budget of the chain they
    /// belong to, whatever they set here.
    pub fn budget(mut self, calls: Option<u32>, cost: Option<f64>) -> Self {
        self.budget = Some(BudgetGiven { calls, cost });
        self
    }

    /// The time allowed. A handler's calls never outlive its own deadline,
    /// so this can only shorten it there.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The conversation (`consistent_hash` keys on it). A handler's calls carry
    /// its own request's session unless set here.
    pub fn session_id(mut self, session_id: &str) -> Self {
        self.session_id = Some(session_id.to_string());
        self
    }

    /// The session context the agents should use. A handler's calls carry its
    /// own request's context unless set here.
    pub fn context_id(mut self, context_id: &str) -> Self {
        self.context_id = Some(context_id.to_string());
        self
    }

    /// The idempotency key (generated when absent): a repeated task submission
    /// with it returns the task already stored.
    pub fn request_id(mut self, request_id: &str) -> Self {
        self.request_id = Some(request_id.to_string());
        self
    }

    /// The timeout in whole milliseconds, if one was given.
    pub fn timeout_ms(&self) -> Option<u64> {
        self.timeout
            .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1))
    }
}

/// What a call inherits from the request a handler serves (nothing for a [`Client`](crate::Client)).
#[derive(Debug, Default)]
pub(crate) struct Inherited<'a> {
    pub(crate) session_id: Option<&'a str>,
    pub(crate) context_id: Option<&'a str>,
    pub(crate) priority: Option<Priority>,
    /// The caller's own absolute deadline (epoch ms).
    pub(crate) deadline_ms: Option<u64>,
}

/// The invoke envelope for `capability` with `payload`, `options` over `inherited`.
pub(crate) fn envelope(
    capability: &str,
    payload: Value,
    options: &CallOptions,
    inherited: &Inherited<'_>,
) -> InvokeRequest {
    let own_deadline = options.timeout_ms().map(|ms| now_ms().saturating_add(ms));
    // The earlier of the caller's deadline and the timeout; a deadline, not a
    // relative timeout, so time spent before the router reads it counts too.
    let deadline = match (inherited.deadline_ms, own_deadline) {
        (Some(inherited), Some(own)) => Some(inherited.min(own)),
        (inherited, own) => inherited.or(own),
    };
    InvokeRequest {
        version: Some("1.0".to_string()),
        request_id: Some(options.request_id.clone().unwrap_or_else(new_id)),
        session_id: options
            .session_id
            .clone()
            .or_else(|| inherited.session_id.map(str::to_string)),
        context_id: options
            .context_id
            .clone()
            .or_else(|| inherited.context_id.map(str::to_string)),
        capability: capability.to_string(),
        capability_version: options.version.clone(),
        target_policy: options.policy.clone(),
        priority: options.priority.or(inherited.priority),
        timeout_ms: None,
        deadline,
        timeout: None,
        trace_id: None,
        source: None,
        replay_of: None,
        payload,
        budget: options.budget,
    }
}

/// How long to wait for the router's answer to a call with this deadline:
/// the router answers by it, and a little slack lets its `DEADLINE_EXCEEDED`
/// arrive. Without a deadline the router's default (30 s) or the
/// capability's applies, so the client's own bound is the fallback.
pub(crate) fn answer_within(deadline_ms: Option<u64>, fallback: Duration) -> Duration {
    match deadline_ms {
        Some(deadline) => Duration::from_millis(deadline.saturating_sub(now_ms())) + Duration::from_secs(2),
        None => fallback,
    }
}

/// The router at `router` with bearer `token` over `http`.
#[derive(Clone)]
pub(crate) struct RouterLink {
    pub(crate) http: reqwest::Client,
    pub(crate) router: String,
    pub(crate) token: String,
}

impl RouterLink {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.router.trim_end_matches('/'))
    }

    pub(crate) fn unreachable(&self, error: &reqwest::Error) -> CallError {
        CallError::new(
            "ROUTER_UNREACHABLE",
            format!("cannot reach the router at {}: {error}", self.router),
        )
        .retryable()
    }

    /// Sends one envelope to `POST /v1/invoke` and decodes the result envelope.
    /// A handler's call presents `upstream`: the router's assertion for the
    /// call it serves and that call's request id, so the router carries the
    /// delegation chain (and its budget) on to the next hop (DESIGN §9).
    pub(crate) async fn invoke(
        &self,
        request: &InvokeRequest,
        traceparent: Option<&str>,
        upstream: Option<(&str, &str)>,
        within: Duration,
    ) -> Result<ResultEnvelope, CallError> {
        let mut call = self
            .http
            .post(self.url("/v1/invoke"))
            .bearer_auth(&self.token)
            .timeout(within)
            .json(request);
        if let Some(traceparent) = traceparent {
            call = call.header("traceparent", traceparent);
        }
        if let Some((assertion, request_id)) = upstream {
            call = call
                .header("agent-reach-upstream", assertion)
                .header("agent-reach-upstream-request", request_id);
        }
        let response = call.send().await.map_err(|error| self.unreachable(&error))?;
        let status = response.status().as_u16();
        let envelope: ResultEnvelope = read_json(response).await?;
        match (envelope.status, &envelope.error) {
            (ResultStatus::Succeeded, _) => Ok(envelope),
            (ResultStatus::Failed, Some(error)) => Err(CallError {
                code: error.code.clone(),
                message: error.message.clone(),
                retryable: error.retryable,
                status: Some(status),
                details: error.details.clone(),
            }),
            (ResultStatus::Failed, None) => Err(CallError::new(
                "INVALID_RESULT",
                format!("router answered {status} without an error"),
            )),
        }
    }
}

/// A router answer's body as `T`, or, for a non-2xx answer, the failed result
/// envelope's error (every router failure has that shape, DESIGN §3.7).
pub(crate) async fn read_json<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, CallError> {
    let status = response.status();
    let bytes = response.bytes().await.map_err(|error| {
        CallError::new(
            "INVALID_RESULT",
            format!("the router's {status} answer broke off: {error}"),
        )
        .retryable()
    })?;
    if !status.is_success() {
        if let Ok(failed) = serde_json::from_slice::<ResultEnvelope>(&bytes) {
            if let Some(error) = failed.error {
                return Err(CallError {
                    code: error.code,
                    message: error.message,
                    retryable: error.retryable,
                    status: Some(status.as_u16()),
                    details: error.details,
                });
            }
        }
    }
    serde_json::from_slice(&bytes).map_err(|error| {
        let mut failure = CallError::new(
            "INVALID_RESULT",
            format!("router answered {status} with an unreadable body: {error}"),
        );
        failure.status = Some(status.as_u16());
        failure
    })
}

/// The output of a succeeded envelope as `O`.
pub(crate) fn output_as<O: DeserializeOwned>(capability: &str, output: Option<Value>) -> Result<O, CallError> {
    serde_json::from_value(output.unwrap_or(Value::Null)).map_err(|error| {
        CallError::new(
            "OUTPUT_MISMATCH",
            format!("`{capability}` answered an unexpected shape: {error}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_override_what_a_call_inherits_and_deadlines_only_shrink() {
        let inherited = Inherited {
            session_id: Some("s-1"),
            context_id: Some("c-1"),
            priority: Some(Priority::High),
            deadline_ms: Some(now_ms() + 1_000),
        };
        let plain = envelope("a.b", Value::Null, &CallOptions::new(), &inherited);
        assert_eq!(plain.session_id.as_deref(), Some("s-1"));
        assert_eq!(plain.context_id.as_deref(), Some("c-1"));
        assert_eq!(plain.priority, Some(Priority::High));
        assert_eq!(plain.deadline, inherited.deadline_ms);
        assert_eq!(plain.request_id.as_ref().map(String::len), Some(28));

        let options = CallOptions::new()
            .version("^2")
            .policy(TargetPolicy::ConsistentHash)
            .priority(Priority::Low)
            .session_id("s-2")
            .request_id("r-1")
            .timeout(Duration::from_secs(60));
        let given = envelope("a.b", Value::Null, &options, &inherited);
        assert_eq!(given.capability_version.as_deref(), Some("^2"));
        assert_eq!(given.target_policy, Some(TargetPolicy::ConsistentHash));
        assert_eq!(given.priority, Some(Priority::Low));
        assert_eq!(given.session_id.as_deref(), Some("s-2"));
        assert_eq!(given.request_id.as_deref(), Some("r-1"));
        assert_eq!(
            given.deadline, inherited.deadline_ms,
            "a timeout never extends the caller's deadline"
        );

        let short = envelope(
            "a.b",
            Value::Null,
            &CallOptions::new().timeout(Duration::from_millis(10)),
            &inherited,
        );
        assert!(short.deadline < inherited.deadline_ms);
        let free = envelope("a.b", Value::Null, &CallOptions::new(), &Inherited::default());
        assert_eq!((free.deadline, free.priority, free.session_id), (None, None, None));
    }
}
