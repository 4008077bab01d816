//! Serde types of the HTTP/JSON API (DESIGN §2 for the registry).
//!
//! Request types reject unknown fields: a misspelt field is an error the caller
//! sees, not a setting silently ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

// === Errors ===

/// The body of every error answer: `{"error": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorDetail {
    /// A stable, upper-case code such as `LEASE_EXPIRED`.
    pub code: String,
    /// What went wrong and what to do about it, for a person.
    pub message: String,
    /// The request field at fault, as a dotted path (`capabilities[1].version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

// === Registry ===

/// `POST /v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub agent_id: String,
    pub name: String,
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    pub capabilities: Vec<CapabilitySpec>,
}

/// A capability as an agent declares it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapabilitySpec {
    pub name: String,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `false`: the agent asks the router not to check its answers against
    /// `output_schema` (they are checked when absent or `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_output: Option<bool>,
}

/// `201` answer to `POST /v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RegisterResponse {
    pub agent_id: String,
    pub lease_id: i64,
    pub ttl_s: u32,
    pub heartbeat_interval_s: u32,
}

/// `PUT /v1/agents/{agent_id}/heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub lease_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight: Option<u32>,
}

/// `200` answer to a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeartbeatResponse {
    pub agent_id: String,
    pub lease_id: i64,
    pub ttl_s: u32,
    pub status: String,
}

/// An instance as the registry reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentInstance {
    pub agent_id: String,
    pub name: String,
    pub endpoint: String,
    pub protocol: String,
    pub weight: u32,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    pub capabilities: Vec<CapabilitySpec>,
    pub status: String,
    pub lease_id: i64,
    pub ttl_s: u32,
    pub registered_at_ms: u64,
    /// Requests in flight the agent last reported, as stored (DESIGN §2.3; 0 when none).
    #[serde(default)]
    pub inflight: u32,
    /// The weight was set by an operator: adaptive routing never changes it (DESIGN §3.4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operator_weight: bool,
}

/// `GET /v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentList {
    pub agents: Vec<AgentInstance>,
    pub revision: i64,
    /// With `?limit=`: the `cursor` of the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// One instance in `GET /v1/heartbeats`: its lease as the store holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InstanceHeartbeat {
    pub agent_id: String,
    pub lease_id: i64,
    /// The TTL the store granted the lease.
    pub ttl_s: i64,
    /// Whole seconds before the lease expires without another heartbeat.
    pub remaining_s: i64,
    /// Whole seconds since the last heartbeat renewed the lease (`ttl_s - remaining_s`).
    pub age_s: i64,
}

/// `GET /v1/heartbeats` (operators): every live instance's last heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeartbeatList {
    pub heartbeats: Vec<InstanceHeartbeat>,
    /// When the registry read the leases (epoch ms).
    pub observed_at_ms: u64,
}

/// One entry of `GET /v1/capabilities`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapabilitySummary {
    pub name: String,
    /// Highest first.
    pub versions: Vec<String>,
    pub instances: usize,
    pub routable_instances: usize,
}

/// `GET /v1/capabilities`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapabilityList {
    pub capabilities: Vec<CapabilitySummary>,
    pub revision: i64,
}

/// `GET /v1/capabilities/{name}[?version=REQ]`: routable instances at the best
/// matching version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapabilityResolution {
    pub name: String,
    pub version: String,
    pub available_versions: Vec<String>,
    pub instances: Vec<ResolvedInstance>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResolvedInstance {
    pub agent_id: String,
    pub name: String,
    pub endpoint: String,
    pub weight: u32,
    pub status: String,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    pub capability: CapabilitySpec,
}

// === Operator API: traffic splits and live weights (DESIGN §2.9) ===

/// `PUT /v1/capabilities/{name}/split`: version → relative weight. Values are
/// taken as any JSON so the registry can name a bad weight precisely
/// (`INVALID_SPLIT`, field `weights.{version}`) instead of a generic type error.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SplitRequest {
    pub weights: BTreeMap<String, serde_json::Value>,
}

/// A capability's split as the registry stores and reports it
/// (`GET`/`PUT /v1/capabilities/{name}/split`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapabilitySplit {
    pub capability: String,
    /// Version → weight; at least one above 0.
    pub weights: BTreeMap<String, u32>,
    pub updated_at_ms: u64,
    /// The operator who set it (absent without authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
    /// The store revision of the write (`PUT` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// `PUT /v1/capabilities/{name}/policy`: the capability's default selection
/// policy, a `target_policy` word (DESIGN §9).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyRequest {
    pub policy: String,
}

/// A capability's default policy as the registry stores and reports it
/// (`GET`/`PUT /v1/capabilities/{name}/policy`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapabilityPolicy {
    pub capability: String,
    pub policy: String,
    pub updated_at_ms: u64,
    /// The operator who set it (absent without authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
    /// The store revision of the write (`PUT` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// `PUT /v1/agents/{agent_id}/weight`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeightRequest {
    pub weight: u32,
}

// === Access requests and grants (DESIGN §2.11) ===

/// `POST /v1/access-requests`: `caller` asks to call `capability`. `caller`
/// defaults to the token's subject; naming another caller is for operators.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessRequestBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    pub capability: String,
    pub reason: String,
    /// The grant's life once approved, in seconds (absent: until revoked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
}

/// `POST /v1/access-requests/{id}/approve|deny`: an optional note kept on the request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessDecisionBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// An access request as the registry reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AccessRequest {
    pub id: String,
    /// `pending`, `approved`, `denied`, `revoked` or `expired`.
    pub status: String,
    pub caller: String,
    pub capability: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Who filed it (the token's subject; absent without authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    pub requested_at_ms: u64,
    /// The approvers `owners:` names for the capability (pending requests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<u64>,
}

/// `GET /v1/access-requests`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AccessRequestList {
    pub requests: Vec<AccessRequest>,
}

/// A live grant: `caller` may call `capability` beside what acl.yaml allows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Grant {
    pub id: String,
    pub caller: String,
    pub capability: String,
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_by: Option<String>,
    pub granted_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

/// `GET /v1/grants`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GrantList {
    pub grants: Vec<Grant>,
}
