//! Serde types of the router's JSON envelopes (DESIGN §3): what callers send to
//! `POST /v1/invoke`, what the router forwards to an agent, what agents answer,
//! and the result envelope every caller gets back, success or failure.
//!
//! The request envelope rejects unknown fields: a misspelt `capabilty_version`
//! must be an `INVALID_ENVELOPE` naming the field, never a silently ignored hint.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The envelope format version this crate speaks.
pub const ENVELOPE_VERSION: &str = "1.0";

// === Caller → router ===

/// `POST /v1/invoke` body.
///
/// The seeds' own envelope is accepted as an alias form (DESIGN §3.2):
/// `msg_id` for `request_id`, `agent_capability` for `capability` (and a
/// `cap:` prefix on it), `timeout: {value, unit}` for `timeout_ms`,
/// `weighted_random` for `weighted_round_robin`, `trace_id` (honoured when no
/// `traceparent` header is sent), and `source` (accepted, ignored: the caller
/// is who its token says). Every other unknown field is refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    /// Envelope format version; `1.0` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Idempotency key and trace handle; generated when absent.
    #[serde(default, alias = "msg_id", skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Keys `consistent_hash` so a conversation stays on one instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// Lowercase dotted capability name, e.g. `order.query`.
    #[serde(alias = "agent_capability")]
    pub capability: String,
    /// A semver requirement (`^1.2`); absent means the highest registered version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_policy: Option<TargetPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Relative budget; ignored when `deadline` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Absolute epoch milliseconds; wins over `timeout_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// The seeds' `timeout: {value, unit}`, folded into `timeout_ms` by the router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Timeout>,
    /// The seeds' `trace_id`: continues that trace when no `traceparent` header came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The seeds' `source`: accepted and ignored (the caller is who its token says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A replay of a recorded call (`agent-reach trail replay`): the request id
    /// it replays. Recorded in the trail; not forwarded to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// A budget for this call and every call made on its behalf down the
    /// chain (DESIGN §9): calls in all, and an abstract cost agents report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetGiven>,
    #[serde(default)]
    pub payload: Value,
}

/// A budget given with a call (`budget: {calls, cost}`); an absent member is no limit of that kind.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetGiven {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// What is left of a chain's budget: in a forwarded envelope (for the
/// handler), in a result envelope (after the call and all it caused). A
/// member is absent when the budget given set no limit of that kind.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct BudgetLeft {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_left: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_left: Option<f64>,
}

/// A relative timeout in the seeds' form: `{"value": 15, "unit": "s"}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Timeout {
    pub value: u64,
    /// `ms`, `s`, `m` (and their long names); milliseconds when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl Timeout {
    /// The timeout in milliseconds, or why the unit is not one.
    pub fn as_millis(&self) -> Result<u64, String> {
        let factor = match self.unit.as_deref().unwrap_or("ms") {
            "ms" | "millis" | "milliseconds" => 1,
            "s" | "sec" | "secs" | "seconds" => 1000,
            "m" | "min" | "mins" | "minutes" => 60_000,
            other => return Err(format!("unit `{other}` is not one of ms, s, m")),
        };
        self.value
            .checked_mul(factor)
            .ok_or_else(|| format!("{} {} is too long", self.value, self.unit.as_deref().unwrap_or("ms")))
    }
}

/// How the router picks an instance among the routable ones (DESIGN §3.4).
///
/// On the wire a word: `weighted_round_robin` (the seeds' `weighted_random`
/// is the same), `least_connections`, `consistent_hash`, `p2c_ewma`,
/// `adaptive`, or `plugin:NAME` for a policy a team registered in the router
/// (`NAME`: `[a-z][a-z0-9_]*`, at most 64 characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TargetPolicy {
    /// Smooth weighted round-robin (nginx's algorithm); the seeds' `weighted_random` is this.
    #[default]
    WeightedRoundRobin,
    LeastConnections,
    /// Keyed by `session_id`.
    ConsistentHash,
    /// Power of two choices on peak-EWMA latency × requests in flight.
    P2cEwma,
    /// Weights learned from each instance's recorded outcomes.
    Adaptive,
    /// A policy plugged into the router under this name (`plugin:NAME` on the wire).
    Plugin(String),
}

/// The prefix of a plugged-in policy's name on the wire.
pub const PLUGIN_PREFIX: &str = "plugin:";

/// The longest name of a plugged-in policy.
pub const MAX_PLUGIN_NAME: usize = 64;

impl TargetPolicy {
    /// Every built-in policy, by its wire name.
    pub const BUILT_IN: [TargetPolicy; 5] = [
        TargetPolicy::WeightedRoundRobin,
        TargetPolicy::LeastConnections,
        TargetPolicy::ConsistentHash,
        TargetPolicy::P2cEwma,
        TargetPolicy::Adaptive,
    ];

    /// The wire name; a plugged-in policy's is its bare `NAME` (see [`Display`](std::fmt::Display)
    /// for `plugin:NAME`).
    pub fn as_str(&self) -> &str {
        match self {
            TargetPolicy::WeightedRoundRobin => "weighted_round_robin",
            TargetPolicy::LeastConnections => "least_connections",
            TargetPolicy::ConsistentHash => "consistent_hash",
            TargetPolicy::P2cEwma => "p2c_ewma",
            TargetPolicy::Adaptive => "adaptive",
            TargetPolicy::Plugin(name) => name,
        }
    }

    /// Parses a wire name, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(name) = text.strip_prefix(PLUGIN_PREFIX) {
            check_plugin_name(name)?;
            return Ok(TargetPolicy::Plugin(name.to_string()));
        }
        if text == "weighted_random" {
            return Ok(TargetPolicy::WeightedRoundRobin);
        }
        Self::BUILT_IN
            .into_iter()
            .find(|policy| policy.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown target_policy `{text}`: expected weighted_round_robin, least_connections, \
                     consistent_hash, p2c_ewma, adaptive or plugin:NAME"
                )
            })
    }
}

/// A plugged-in policy's name: `[a-z][a-z0-9_]*`, 1..=64 characters.
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let starts = chars.next().is_some_and(|first| first.is_ascii_lowercase());
    let rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if starts && rest && name.len() <= MAX_PLUGIN_NAME {
        Ok(())
    } else {
        Err(format!(
            "policy plugin name `{name}` must be [a-z][a-z0-9_]*, at most {MAX_PLUGIN_NAME} characters"
        ))
    }
}

impl std::fmt::Display for TargetPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetPolicy::Plugin(name) => write!(f, "{PLUGIN_PREFIX}{name}"),
            other => f.write_str(other.as_str()),
        }
    }
}

impl TryFrom<String> for TargetPolicy {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text)
    }
}

impl From<TargetPolicy> for String {
    fn from(policy: TargetPolicy) -> String {
        policy.to_string()
    }
}

pub use crate::vocabulary::Priority;

// === Router → agent ===

/// What the router POSTs to an instance's endpoint: the caller's envelope with
/// the verified `source`, the absolute `deadline` and the `attempt` filled in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ForwardedEnvelope {
    pub version: String,
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    pub capability: String,
    /// The concrete version chosen by the router.
    pub capability_version: String,
    /// The verified caller name (absent only when authentication is switched off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub priority: Priority,
    /// Absolute epoch milliseconds; the agent should give up after it.
    pub deadline: u64,
    /// 1 for the first try, 2 for the first retry, ...
    pub attempt: u32,
    pub payload: Value,
    /// Set on a task's delivery (DESIGN §8): the agent may answer `202` and
    /// report the outcome later with `POST /v1/tasks/{task_id}/result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// What is left of the chain's budget (this call charged), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetLeft>,
    /// Set on the delivery of a multi-turn task's next turn: the conversation
    /// so far, oldest first, `{"role": "user", "payload": …}` for each
    /// message of the caller and `{"role": "agent", "message": …}` for each
    /// time the agent asked for more input; `payload` is the latest answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Value>,
    /// Set on a workflow step's delivery (DESIGN §9): the run it is part of,
    /// as its hop assertion's `run` claim says too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Set on the delivery that resumes a paused task (DESIGN §9,
    /// preemption): the checkpoint its handler returned when it paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
}

/// An agent's `200` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentOutput {
    #[serde(default)]
    pub output: Value,
}

/// What serving a call cost the agent (DESIGN §3.5): `usage: {cost,
/// input_tokens?, output_tokens?, model?}` beside `output` in its answer.
/// `cost` is the abstract unit a delegation budget counts; the tokens and the
/// model are what the router's spans (`gen_ai.usage.*`, `gen_ai.request.model`)
/// and `agent_reach_model_tokens_total` report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    #[serde(default)]
    pub cost: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl Usage {
    /// `model` used `input_tokens` in and `output_tokens` out; the cost is
    /// their sum (what a budget counts when the agent names no other unit).
    pub fn tokens(model: impl Into<String>, input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            cost: (input_tokens + output_tokens) as f64,
            input_tokens: Some(input_tokens),
            output_tokens: Some(output_tokens),
            model: Some(model.into()),
        }
    }

    /// This usage and `more` together (two model calls in one handler):
    /// costs and tokens add up, the later model name wins.
    pub fn add(&mut self, more: Usage) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        self.cost += more.cost;
        self.input_tokens = sum(self.input_tokens, more.input_tokens);
        self.output_tokens = sum(self.output_tokens, more.output_tokens);
        if more.model.is_some() {
            self.model = more.model;
        }
    }
}

/// An agent's non-2xx answer: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentErrorBody {
    pub error: AgentErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentErrorDetail {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

// === Router → caller ===

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    Succeeded,
    Failed,
}

/// The same shape for every capability and every outcome.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResultEnvelope {
    pub version: String,
    pub request_id: String,
    pub status: ResultStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    /// The concrete version that answered (or was chosen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub attempts: u32,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<EnvelopeError>,
    /// What is left of the call's budget once it (and all it caused) ended,
    /// when it carried one: the spend is what was given less this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetLeft>,
}

/// `error` of a failed result envelope.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EnvelopeError {
    /// A stable code of DESIGN §3, e.g. `SCHEMA_MISMATCH`.
    pub code: String,
    pub message: String,
    /// Whether the same request may succeed if sent again later.
    pub retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_unknown_fields() {
        let text = r#"{"version":"1.0","request_id":"r1","session_id":"s","context_id":"c",
            "capability":"order.query","capability_version":"^1.2","target_policy":"consistent_hash",
            "priority":"high","timeout_ms":15000,"deadline":1710000000000,"payload":{"order_id":"SO-1"}}"#;
        let request: InvokeRequest = serde_json::from_str(text).unwrap();
        assert_eq!(request.target_policy, Some(TargetPolicy::ConsistentHash));
        assert_eq!(request.deadline, Some(1_710_000_000_000));
        let bad = r#"{"capability":"a","capabilty_version":"1"}"#;
        assert!(serde_json::from_str::<InvokeRequest>(bad).is_err());
        let policy = r#"{"capability":"a","target_policy":"random"}"#;
        assert!(serde_json::from_str::<InvokeRequest>(policy).is_err());
    }

    #[test]
    fn policies_round_trip_and_plugin_names_are_checked() {
        for text in [
            "weighted_round_robin",
            "least_connections",
            "consistent_hash",
            "p2c_ewma",
            "adaptive",
            "plugin:cheapest",
        ] {
            let policy: TargetPolicy = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(serde_json::to_value(&policy).unwrap(), serde_json::json!(text));
        }
        assert_eq!(
            TargetPolicy::parse("weighted_random"),
            Ok(TargetPolicy::WeightedRoundRobin)
        );
        assert_eq!(
            TargetPolicy::parse("plugin:a_1"),
            Ok(TargetPolicy::Plugin("a_1".to_string()))
        );
        for bad in ["plugin:", "plugin:Cheap", "plugin:1a", "plugin:a-b", "random", ""] {
            assert!(TargetPolicy::parse(bad).is_err(), "{bad}");
        }
        assert!(TargetPolicy::parse(&format!("plugin:{}", "a".repeat(65))).is_err());
    }

    #[test]
    fn usage_reads_the_designs_shape_and_adds_up() {
        let usage: Usage = serde_json::from_str(r#"{"cost":3.5,"input_tokens":12,"model":"m-1"}"#).unwrap();
        assert_eq!(usage.cost, 3.5);
        assert_eq!((usage.input_tokens, usage.output_tokens), (Some(12), None));
        let mut total = Usage::tokens("m-1", 10, 5);
        assert_eq!(total.cost, 15.0);
        total.add(usage);
        assert_eq!(
            (total.cost, total.input_tokens, total.output_tokens),
            (18.5, Some(22), Some(5))
        );
        assert_eq!(
            serde_json::to_value(Usage {
                cost: 1.0,
                ..Usage::default()
            })
            .unwrap(),
            serde_json::json!({"cost": 1.0})
        );
    }
}
