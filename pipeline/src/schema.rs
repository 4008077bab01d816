//! Payload and answer checks against a version's compiled JSON Schemas
//! (compiled once per schema text when the snapshot is built, never per
//! request): the input before forwarding (422 `SCHEMA_MISMATCH`), the answer
//! after (502 `OUTPUT_SCHEMA_MISMATCH`). Both name each problem by JSON
//! pointer, at most [`MAX_SCHEMA_ERRORS`] of them, and the total.

use serde_json::{json, Value};

use crate::error::{Code, RouterError};
use crate::snapshot::VersionGroup;

/// Schema violations reported per request at most (the rest are counted).
const MAX_SCHEMA_ERRORS: usize = 20;

/// Validates the payload with the version's compiled input schema.
pub fn check_input(group: &VersionGroup, payload: &Value) -> Result<(), RouterError> {
    let Some(validator) = &group.validator else {
        return Ok(());
    };
    match schema_problems(validator, payload) {
        None => Ok(()),
        Some(problems) => Err(RouterError::new(
            Code::SchemaMismatch,
            format!(
                "payload does not match the input schema of {} ({} problem(s), first at `{}`)",
                group.version_text, problems.total, problems.first
            ),
        )
        .with_details(json!({ "errors": problems.errors, "total": problems.total }))),
    }
}

/// Validates `value` with `validator` (a workflow's input or output schema,
/// compiled when the snapshot was built): `code` with each problem's pointer
/// when it does not match, `what` naming the schema in the message.
pub fn check_value(
    validator: &jsonschema::Validator,
    value: &Value,
    code: Code,
    what: &str,
) -> Result<(), RouterError> {
    match schema_problems(validator, value) {
        None => Ok(()),
        Some(problems) => Err(RouterError::new(
            code,
            format!(
                "the value does not match {what} ({} problem(s), first at `{}`)",
                problems.total, problems.first
            ),
        )
        .with_details(json!({ "errors": problems.errors, "total": problems.total }))),
    }
}

/// Validates an agent's answer with the version's compiled output schema
/// (none when the agent asked for its answers to go unchecked): a mismatch is
/// the agent's fault, 502 `OUTPUT_SCHEMA_MISMATCH`, never retried.
pub fn check_output(
    group: &VersionGroup,
    output: Option<&serde_json::value::RawValue>,
    agent_id: &str,
) -> Result<(), RouterError> {
    let Some(validator) = &group.output_validator else {
        return Ok(());
    };
    let text = output.map_or("null", |raw| raw.get());
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        // The forwarder already parsed it; a number beyond serde's range ends up here.
        Err(error) => {
            return Err(RouterError::new(
                Code::OutputSchemaMismatch,
                format!("the answer of `{agent_id}` cannot be checked against the output schema: {error}"),
            )
            .with_details(json!({ "errors": [], "total": 0, "agent_id": agent_id })))
        }
    };
    match schema_problems(validator, &value) {
        None => Ok(()),
        Some(problems) => Err(RouterError::new(
            Code::OutputSchemaMismatch,
            format!(
                "the answer of `{agent_id}` does not match the output schema of {} ({} problem(s), first at `{}`)",
                group.version_text, problems.total, problems.first
            ),
        )
        .with_details(json!({ "errors": problems.errors, "total": problems.total, "agent_id": agent_id }))),
    }
}

/// What a schema found wrong with a value: the first [`MAX_SCHEMA_ERRORS`]
/// problems (`pointer`, `message`), how many there were, the first pointer.
struct Problems {
    errors: Vec<Value>,
    total: usize,
    first: String,
}

fn schema_problems(validator: &jsonschema::Validator, value: &Value) -> Option<Problems> {
    if validator.is_valid(value) {
        return None;
    }
    let mut errors = Vec::new();
    let mut total = 0usize;
    for error in validator.iter_errors(value) {
        total += 1;
        if errors.len() < MAX_SCHEMA_ERRORS {
            errors.push(json!({
                "pointer": error.instance_path().to_string(),
                "message": error.to_string(),
            }));
        }
    }
    let first = errors
        .first()
        .and_then(|error| error["pointer"].as_str())
        .map(|pointer| {
            if pointer.is_empty() {
                "/".to_string()
            } else {
                pointer.to_string()
            }
        })
        .unwrap_or_default();
    Some(Problems { errors, total, first })
}
