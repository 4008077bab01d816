//! The registry's own types: an instance record as stored in the store, and
//! the status lifecycle. Wire types convert to and from these at the edge.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Status lifecycle: `starting → ready ↔ busy/overloaded → draining`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Starting,
    Ready,
    Busy,
    Overloaded,
    Draining,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Starting,
        Status::Ready,
        Status::Busy,
        Status::Overloaded,
        Status::Draining,
    ];

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Starting => "starting",
            Status::Ready => "ready",
            Status::Busy => "busy",
            Status::Overloaded => "overloaded",
            Status::Draining => "draining",
        }
    }

    /// Resolve returns only these; `overloaded` is a last resort chosen by the router.
    pub fn is_routable(self) -> bool {
        matches!(self, Status::Ready | Status::Busy)
    }

    /// Whether a heartbeat may move an instance from `self` to `next`.
    /// Nothing goes back to `starting`, and `draining` is final: a draining
    /// instance leaves by deregistering (or re-registering as a new life).
    pub fn can_become(self, next: Status) -> bool {
        match (self, next) {
            (current, next) if current == next => true,
            (Status::Draining, _) | (_, Status::Starting) => false,
            _ => true,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_transitions() {
        assert!(Status::Starting.can_become(Status::Ready));
        assert!(Status::Ready.can_become(Status::Busy));
        assert!(Status::Overloaded.can_become(Status::Ready));
        assert!(Status::Ready.can_become(Status::Draining));
        assert!(!Status::Ready.can_become(Status::Starting));
        assert!(!Status::Draining.can_become(Status::Ready));
        assert!(Status::Busy.is_routable() && !Status::Overloaded.is_routable() && !Status::Starting.is_routable());
    }
}
