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

/// Key layout (DESIGN §2): `/agent-reach/v1/{tenant}/agents/{agent_id}`.
#[derive(Debug, Clone)]
pub struct Keys {
    agents_prefix: String,
}

impl Keys {
    pub fn new(tenant: &str) -> Self {
        Self {
            agents_prefix: format!("/agent-reach/v1/{tenant}/agents/"),
        }
    }

    pub fn agents_prefix(&self) -> &str {
        &self.agents_prefix
    }

    pub fn agent(&self, agent_id: &str) -> String {
        format!("{}{agent_id}", self.agents_prefix)
    }

    pub fn agent_id_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.agents_prefix.as_str())
    }
}
