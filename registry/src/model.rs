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

/// Key layout (DESIGN §2.4): `/agent-reach/v1/{tenant}/agents/{agent_id}` and
/// `/agent-reach/v1/{tenant}/splits/{capability}`.
#[derive(Debug, Clone)]
pub struct Keys {
    tenant_prefix: String,
    agents_prefix: String,
    splits_prefix: String,
}

impl Keys {
    pub fn new(tenant: &str) -> Self {
        let tenant_prefix = format!("/agent-reach/v1/{tenant}/");
        Self {
            agents_prefix: format!("{tenant_prefix}agents/"),
            splits_prefix: format!("{tenant_prefix}splits/"),
            tenant_prefix,
        }
    }

    /// Every key of the tenant (agents and splits): what the catalog and the
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
