//! The registry's own types: an instance record as stored in the store, and
//! the status lifecycle. Wire types convert to and from these at the edge.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The status lifecycle is the shared vocabulary's (`starting → ready ↔
/// busy/overloaded → draining`), defined once in `proto`.
pub use agent_reach_proto::Status;

/// One capability offered by an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capability {
    pub name: String,
    pub version: semver::Version,
    #[serde(default)]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Whether the router checks answers against `output_schema` (records
    /// written before the switch existed lack it: checked).
    #[serde(default = "checked", skip_serializing_if = "is_checked")]
    pub check_output: bool,
}

fn checked() -> bool {
    true
}

fn is_checked(check: &bool) -> bool {
    *check
}

/// A registered instance: the value stored under `.../agents/{agent_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub agent_id: String,
    pub name: String,
    pub endpoint: String,
    pub protocol: String,
    pub weight: u32,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    pub capabilities: Vec<Capability>,
    pub status: Status,
    pub lease_id: i64,
    pub ttl_s: u32,
    pub registered_at_ms: u64,
    /// Requests in flight the agent reported, as last written (DESIGN §2.3):
    /// heartbeats rewrite it only when it moved meaningfully
    /// ([`inflight_worth_writing`]). Absent in records written before it
    /// existed, and while nothing was reported: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inflight: u32,
    /// Whether `weight` was set by an operator (`PUT /v1/agents/{id}/weight`
    /// from a caller under `operators`) rather than by the agent: adaptive
    /// routing never changes such a weight (DESIGN §3.4). A registration
    /// writes a new record without it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub operator_weight: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Whether a heartbeat's in-flight count differs enough from the stored one
/// to be worth an etcd write (and a watch event to every router): by at least
/// an eighth of the larger of the two, so any change counts up to 8 in flight
/// and the record follows a busy agent in steps of about 12 %. Without it,
/// every heartbeat of a loaded agent would be a write; routers only compare
/// instances' loads, which a 12 % step does not reorder much.
pub fn inflight_worth_writing(stored: u32, reported: u32) -> bool {
    let change = u64::from(stored.abs_diff(reported));
    change > 0 && change * 8 >= u64::from(stored.max(reported))
}

impl Instance {
    pub fn capability(&self, name: &str, version: &semver::Version) -> Option<&Capability> {
        self.capabilities
            .iter()
            .find(|capability| capability.name == name && &capability.version == version)
    }
}

/// A capability's traffic split between versions for unpinned calls
/// (DESIGN §2.9): the value stored under `.../splits/{capability}`, without a
/// lease (it outlives every instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    pub capability: String,
    /// Version → relative weight; at least one above 0.
    pub weights: BTreeMap<semver::Version, u32>,
    pub updated_at_ms: u64,
    /// The operator who set it; `None` without authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
}

/// Where an access request stands (DESIGN §2.11). `pending` is the only
/// state a decision leaves; `approved` becomes `revoked` when its grant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessStatus {
    Pending,
    Approved,
    Denied,
    Revoked,
}

impl AccessStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessStatus::Pending => "pending",
            AccessStatus::Approved => "approved",
            AccessStatus::Denied => "denied",
            AccessStatus::Revoked => "revoked",
        }
    }
}

/// An access request: the value stored under `.../access-requests/{id}`,
/// without a lease (kept, decided or not, as the record of who asked and
/// who decided).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRequest {
    pub id: String,
    pub caller: String,
    pub capability: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    pub status: AccessStatus,
    /// The token's subject that filed it; `None` without authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    pub requested_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    /// The grant's expiry, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<u64>,
}

/// An approved request's grant: the value stored under `.../grants/{id}`,
/// on a lease of its `ttl_s` when it expires (routers stop it at
/// `expires_at_ms` by their clock; the lease removes the key after).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

impl Grant {
    /// Live at `now_ms` (epoch): not yet past its expiry.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|expires| now_ms < expires)
    }
}

/// A capability's default selection policy (DESIGN §9): the value stored
/// under `.../policies/{capability}`, without a lease. `policy` is a
/// `target_policy` word (`adaptive`, `plugin:NAME`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub capability: String,
    pub policy: String,
    pub updated_at_ms: u64,
    /// The operator who set it; `None` without authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
}

/// Key layout (DESIGN §2.4): `/agent-reach/v1/{tenant}/agents/{agent_id}`,
/// `/agent-reach/v1/{tenant}/splits/{capability}`,
/// `/agent-reach/v1/{tenant}/access-requests/{id}`,
/// `/agent-reach/v1/{tenant}/grants/{id}` and
/// `/agent-reach/v1/{tenant}/policies/{capability}`.
#[derive(Debug, Clone)]
pub struct Keys {
    tenant_prefix: String,
    agents_prefix: String,
    splits_prefix: String,
    requests_prefix: String,
    grants_prefix: String,
    policies_prefix: String,
}

impl Keys {
    pub fn new(tenant: &str) -> Self {
        let tenant_prefix = format!("/agent-reach/v1/{tenant}/");
        Self {
            agents_prefix: format!("{tenant_prefix}agents/"),
            splits_prefix: format!("{tenant_prefix}splits/"),
            requests_prefix: format!("{tenant_prefix}access-requests/"),
            grants_prefix: format!("{tenant_prefix}grants/"),
            policies_prefix: format!("{tenant_prefix}policies/"),
            tenant_prefix,
        }
    }

    pub fn access_request(&self, id: &str) -> String {
        format!("{}{id}", self.requests_prefix)
    }

    /// Every access request of the tenant (listings read the store).
    pub fn access_requests(&self) -> &str {
        &self.requests_prefix
    }

    pub fn grant(&self, id: &str) -> String {
        format!("{}{id}", self.grants_prefix)
    }

    pub fn grant_id_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.grants_prefix.as_str())
    }

    pub fn policy(&self, capability: &str) -> String {
        format!("{}{capability}", self.policies_prefix)
    }

    pub fn capability_of_policy<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.policies_prefix.as_str())
    }

    /// Every key of the tenant (agents, splits, grants, requests and policies): what the catalog and the
    /// `Watch` stream follow, in one ordered history.
    pub fn tenant_prefix(&self) -> &str {
        &self.tenant_prefix
    }

    pub fn split(&self, capability: &str) -> String {
        format!("{}{capability}", self.splits_prefix)
    }

    pub fn capability_of_split<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.splits_prefix.as_str())
    }

    pub fn agent(&self, agent_id: &str) -> String {
        format!("{}{agent_id}", self.agents_prefix)
    }

    pub fn agent_id_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.agents_prefix.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::inflight_worth_writing;

    #[test]
    fn inflight_is_written_when_it_moves_by_an_eighth() {
        assert!(!inflight_worth_writing(0, 0));
        assert!(inflight_worth_writing(0, 1));
        assert!(inflight_worth_writing(7, 8), "small counts: every change");
        assert!(inflight_worth_writing(8, 7));
        assert!(!inflight_worth_writing(9, 10), "1 of 10 is under an eighth");
        assert!(inflight_worth_writing(9, 11));
        assert!(!inflight_worth_writing(100, 110));
        assert!(!inflight_worth_writing(100, 113), "13 of 113 is under an eighth");
        assert!(inflight_worth_writing(100, 115));
        assert!(inflight_worth_writing(100, 87));
        assert!(inflight_worth_writing(u32::MAX, 0));
    }
}
