//! A definition as written (DESIGN §9): `{name?, version, description?,
//! input_schema, output_schema?, steps: [{id, capability, version?, input,
//! depends_on?, for_each?, max_parallel?, when?, timeout_ms?, retry?,
//! on_failure?}], output}`, read from JSON or YAML. Unknown fields are
//! refused. [`crate::check`] turns it into a [`crate::Workflow`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::problem::{Problem, Reason};

/// The largest definition accepted, in bytes (as sent, JSON or YAML).
pub const MAX_DEFINITION_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// Optional in the body (the path names the workflow); when given it
    /// must be the same name. Files for `agent-reach workflows apply` carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    pub steps: Vec<StepDefinition>,
    pub output: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDefinition {
    pub id: String,
    pub capability: String,
    /// A semver requirement (`^1.2`); absent: the highest version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// `${…}` giving an array: one call per element.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u64>,
    /// `${…}`: the step runs only when it is `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDefinition>,
    /// `fail` (default), `continue`, or `{compensate: {capability, version?, input, timeout_ms?}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryDefinition {
    /// Calls of the step at most (the first included).
    pub max_attempts: u64,
    /// Wait before the next attempt, doubled after each (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
    /// Retry only failures with these codes (the result envelope's
    /// `error.code`, or an agent's own code); absent: every failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompensationDefinition {
    pub capability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// How a body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// From a `Content-Type` (`application/json`, `application/yaml`,
    /// `text/yaml`, `application/x-yaml`), else by the first non-blank
    /// character (`{`: JSON).
    pub fn of(content_type: Option<&str>, body: &[u8]) -> Self {
        let essence = content_type
            .and_then(|value| value.split(';').next())
            .map(|value| value.trim().to_ascii_lowercase());
        match essence.as_deref() {
            Some("application/json") => Format::Json,
            Some("application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml") => Format::Yaml,
            _ => match body.iter().find(|byte| !byte.is_ascii_whitespace()) {
                Some(b'{') => Format::Json,
                _ => Format::Yaml,
            },
        }
    }
}

/// Reads a definition from `body` written as `format`.
pub fn parse(body: &[u8], format: Format) -> Result<Definition, Problem> {
    if body.len() > MAX_DEFINITION_BYTES {
        return Err(Problem::new(
            Reason::TooLarge,
            "",
            format!("the definition is {} bytes; at most {MAX_DEFINITION_BYTES}", body.len()),
        ));
    }
    let value: Value = match format {
        Format::Json => serde_json::from_slice(body)
            .map_err(|error| Problem::new(Reason::Malformed, "", format!("not JSON: {error}")))?,
        Format::Yaml => serde_yaml::from_slice(body)
            .map_err(|error| Problem::new(Reason::Malformed, "", format!("not YAML: {error}")))?,
    };
    // YAML's aliases can make a small text a large document.
    let expanded = value.to_string().len();
    if expanded > 2 * MAX_DEFINITION_BYTES {
        return Err(Problem::new(
            Reason::TooLarge,
            "",
            format!(
                "the definition expands to {expanded} bytes of JSON; at most {}",
                2 * MAX_DEFINITION_BYTES
            ),
        ));
    }
    from_value(value)
}

/// Reads a definition from a JSON value (a stored one, or a parsed body).
pub fn from_value(value: Value) -> Result<Definition, Problem> {
    // The step a problem is in, named by its id when it has one.
    let ids: Vec<Option<String>> = match value.get("steps") {
        Some(Value::Array(steps)) => steps
            .iter()
            .map(|step| step.get("id").and_then(Value::as_str).map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    serde_path_to_error::deserialize::<_, Definition>(value).map_err(|error| {
        let pointer = pointer_of(error.path());
        let mut problem = Problem::new(Reason::Malformed, pointer.clone(), error.inner().to_string());
        let index = pointer
            .strip_prefix("/steps/")
            .and_then(|rest| rest.split('/').next())
            .and_then(|index| index.parse::<usize>().ok());
        if let Some(Some(id)) = index.and_then(|index| ids.get(index)) {
            problem = problem.in_step(id);
        }
        problem
    })
}

/// A serde path as a JSON pointer (`steps[1].retry` → `/steps/1/retry`).
fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut pointer = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                pointer.push('/');
                pointer.push_str(&index.to_string());
            }
            Segment::Map { key } => {
                pointer.push('/');
                pointer.push_str(&crate::template::escape_pointer(key));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    pointer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_read_alike_and_problems_point_at_the_field() {
        let yaml = b"version: 1.0.0\ninput_schema: {type: object}\nsteps:\n  - id: a\n    capability: x.y\n    input: {q: '${input.q}'}\noutput: '${steps.a.output}'\n";
        let json = br#"{"version": "1.0.0", "input_schema": {"type": "object"},
            "steps": [{"id": "a", "capability": "x.y", "input": {"q": "${input.q}"}}], "output": "${steps.a.output}"}"#;
        assert_eq!(
            parse(yaml, Format::of(None, yaml)).unwrap(),
            parse(json, Format::of(None, json)).unwrap()
        );
        let bad = br#"{"version": "1.0.0", "input_schema": {}, "steps": [{"id": "a", "capability": "x", "input": 1, "retry": {"max_attempts": "3"}}], "output": 1}"#;
        let problem = parse(bad, Format::Json).unwrap_err();
        assert_eq!(
            (problem.reason, problem.pointer.as_str()),
            (Reason::Malformed, "/steps/0/retry/max_attempts")
        );
        let unknown = br#"{"version": "1.0.0", "input_schema": {}, "steps": [], "output": 1, "extra": 1}"#;
        assert!(parse(unknown, Format::Json)
            .unwrap_err()
            .message
            .contains("unknown field"));
        let missing = br#"{"version": "1.0.0", "input_schema": {}, "steps": []}"#;
        assert!(parse(missing, Format::Json).unwrap_err().message.contains("output"));
        assert_eq!(parse(b"{", Format::Json).unwrap_err().reason, Reason::Malformed);
        let large = vec![b' '; MAX_DEFINITION_BYTES + 1];
        assert_eq!(parse(&large, Format::Yaml).unwrap_err().reason, Reason::TooLarge);
        assert_eq!(Format::of(Some("application/yaml; charset=utf-8"), b"{}"), Format::Yaml);
    }
}
