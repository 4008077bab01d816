//! What Redis holds, read back: a task's immutable spec, its hash assembled
//! into a [`Task`], and stream entries.

use std::collections::HashMap;

use redis::Value as RedisValue;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TaskStoreError;
use crate::model::{Accepted, Callback, Priority, State, Task, Transition, Turn};

/// The immutable part of a task, stored once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Spec {
    pub(super) task_id: String,
    pub(super) request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) session_id: Option<String>,
    pub(super) caller: String,
    pub(super) capability: String,
    pub(super) priority: Priority,
    pub(super) envelope: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) callback: Option<Callback>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) target_agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) parent: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) children: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) run: Option<String>,
    pub(super) created_at_ms: u64,
}

pub(super) fn assemble(fields: HashMap<String, String>) -> Result<Task, TaskStoreError> {
    let corrupt = |what: &str| TaskStoreError::Corrupt(what.to_string());
    let spec: Spec = serde_json::from_str(fields.get("spec").ok_or_else(|| corrupt("no spec"))?)
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    let state = fields
        .get("state")
        .and_then(|state| State::parse(state))
        .ok_or_else(|| corrupt("unknown state"))?;
    let number = |name: &str| {
        fields
            .get(name)
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let transitions: Vec<Transition> = json_lines(&fields, "transitions")?;
    let turns: Vec<Turn> = json_lines(&fields, "turns")?;
    // A2A push configs, one field each (`push:{id}`), in id order.
    let mut push_configs = fields
        .iter()
        .filter(|(name, _)| name.starts_with(PUSH_FIELD))
        .map(|(_, text)| serde_json::from_str::<Callback>(text))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    push_configs.sort_by(|a, b| {
        let id = |config: &Callback| config.a2a.as_ref().map(|push| push.id.clone()).unwrap_or_default();
        id(a).cmp(&id(b))
    });
    let result = fields
        .get("result")
        .map(|text| serde_json::from_str::<Value>(text))
        .transpose()
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    let accepted = fields
        .get("accepted")
        .map(|text| serde_json::from_str::<Accepted>(text))
        .transpose()
        .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
    // Set after submission (`set_callback`): replaces the spec's; `null` deleted it.
    let callback = match fields.get("callback") {
        Some(text) => serde_json::from_str::<Option<Callback>>(text)
            .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?,
        None => spec.callback,
    };
    Ok(Task {
        task_id: spec.task_id,
        request_id: spec.request_id,
        session_id: spec.session_id,
        caller: spec.caller,
        capability: spec.capability,
        priority: spec.priority,
        state,
        envelope: spec.envelope,
        callback,
        target_agent: spec.target_agent,
        parent: spec.parent,
        children: spec.children,
        run: spec.run,
        attempts: u32::try_from(number("attempts")).unwrap_or(u32::MAX),
        created_at_ms: spec.created_at_ms,
        updated_at_ms: number("updated_at_ms"),
        transitions,
        result,
        accepted,
        checkpoint: fields
            .get("checkpoint")
            .map(|text| serde_json::from_str::<Value>(text))
            .transpose()
            .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?,
        turns,
        push_configs,
    })
}

/// What starts the field of a task's A2A push config (`push:{id}`).
pub(super) const PUSH_FIELD: &str = "push:";

/// A field holding one JSON value a line (`transitions`, `turns`); absent: none.
fn json_lines<T: serde::de::DeserializeOwned>(
    fields: &HashMap<String, String>,
    name: &str,
) -> Result<Vec<T>, TaskStoreError> {
    fields
        .get(name)
        .map(|lines| {
            lines
                .lines()
                .filter(|line| !line.is_empty())
                .map(serde_json::from_str::<T>)
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()
        .map_err(|error| TaskStoreError::Corrupt(format!("`{name}`: {error}")))
        .map(Option::unwrap_or_default)
}

// === Stream replies ===

pub(super) fn text(value: &RedisValue) -> Option<String> {
    match value {
        RedisValue::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        RedisValue::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// `[[id, [field, value, ...]], ...]` → (id, fields).
pub(super) fn entry_fields(entries: &RedisValue) -> Vec<(String, HashMap<String, String>)> {
    stream_entries(entries)
        .map(|(id, pairs)| {
            let fields = pairs.filter_map(|(name, value)| Some((name, text(value)?))).collect();
            (id, fields)
        })
        .collect()
}

/// `[[id, [field, value, ...]], ...]` → each entry's id and its (field
/// name, value) pairs, the values as Redis gave them (an entry without an
/// id is left out, a field without a name or value skipped).
pub(super) fn stream_entries(
    entries: &RedisValue,
) -> impl Iterator<Item = (String, impl Iterator<Item = (String, &RedisValue)>)> {
    let entries = match entries {
        RedisValue::Array(entries) => entries.as_slice(),
        _ => &[],
    };
    entries.iter().filter_map(|entry| {
        let RedisValue::Array(parts) = entry else { return None };
        let id = text(parts.first()?)?;
        let pairs = match parts.get(1) {
            Some(RedisValue::Array(pairs)) => pairs.as_slice(),
            _ => &[],
        };
        let fields = pairs
            .chunks(2)
            .filter_map(|pair| Some((pair.first().and_then(text)?, pair.get(1)?)));
        Some((id, fields))
    })
}
