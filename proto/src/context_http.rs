//! Serde types of the context service's HTTP/JSON API (DESIGN §4).
//!
//! Field values are arbitrary JSON. Request types reject unknown fields, so a
//! misspelt `if_verison` is an error rather than an unconditional write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/contexts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateContextRequest {
    /// Absent: the service generates one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// `default` (when absent) or `one_shot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, Value>,
}

/// `201` answer to `POST /v1/contexts`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CreateContextResponse {
    pub context_id: String,
    pub version: u64,
    pub tier: String,
    /// Epoch milliseconds at which the context expires unless written again.
    pub expires_at: i64,
}

/// `GET /v1/contexts/{id}`: the fields the caller may read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextView {
    pub context_id: String,
    pub version: u64,
    pub tier: String,
    pub expires_at: i64,
    #[serde(default)]
    pub fields: BTreeMap<String, Value>,
}

/// `PATCH /v1/contexts/{id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PatchContextRequest {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete: Vec<String>,
    /// Apply only if the context is at this version (else `409 VERSION_CONFLICT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_version: Option<u64>,
}

/// `200` answer to a patch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PatchContextResponse {
    pub context_id: String,
    pub version: u64,
    pub expires_at: i64,
}
