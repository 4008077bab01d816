//! What is wrong with a definition: one [`Problem`], with a stable
//! [`Reason`], the step it is in and a JSON pointer into the definition
//! document. The registry answers it as `400 INVALID_WORKFLOW` with
//! `details: {reason, step, pointer}` (DESIGN §9).

use std::fmt;

use serde_json::Value;

/// Why a definition is refused. The words are part of the API
/// (`details.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not JSON or YAML, or not the definition's shape (a field missing,
    /// unknown or of the wrong type).
    Malformed,
    /// A field's value is out of its bounds or has the wrong form.
    InvalidField,
    /// The workflow's or a capability's name is not a lowercase dotted name.
    InvalidName,
    /// A `depends_on` entry or a `steps.ID` path names no step of the workflow.
    UnknownStep,
    /// The steps' dependencies go round in a circle.
    Cycle,
    /// A `${…}` expression does not parse, or reads what it cannot there.
    BadExpression,
    /// A step calls a capability no agent registered (or a workflow).
    UnknownCapability,
    /// No registered version of the capability matches the step's `version`.
    UnknownVersion,
    /// A step's input (or the output) can never satisfy its schema.
    Mapping,
    /// `input_schema` or `output_schema` is not a valid JSON Schema.
    InvalidSchema,
    /// Over a size limit (the definition's bytes, its steps, …).
    TooLarge,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::InvalidField => "invalid_field",
            Reason::InvalidName => "invalid_name",
            Reason::UnknownStep => "unknown_step",
            Reason::Cycle => "cycle",
            Reason::BadExpression => "bad_expression",
            Reason::UnknownCapability => "unknown_capability",
            Reason::UnknownVersion => "unknown_version",
            Reason::Mapping => "mapping",
            Reason::InvalidSchema => "invalid_schema",
            Reason::TooLarge => "too_large",
        }
    }
}

/// One problem of a definition (the first found; nothing is stored).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub reason: Reason,
    pub message: String,
    /// The step it is in, when it is in one.
    pub step: Option<String>,
    /// Where in the definition document (RFC 6901; `""` is the whole document).
    pub pointer: String,
    /// More, for some reasons (a cycle's steps).
    pub extra: Option<Value>,
}

impl Problem {
    pub fn new(reason: Reason, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            step: None,
            pointer: pointer.into(),
            extra: None,
        }
    }

    pub fn in_step(mut self, step: &str) -> Self {
        self.step = Some(step.to_string());
        self
    }

    pub fn with_extra(mut self, extra: Value) -> Self {
        self.extra = Some(extra);
        self
    }

    /// `{reason, step, pointer, …}`: the error's `details`.
    pub fn details(&self) -> Value {
        let mut details = serde_json::json!({
            "reason": self.reason.as_str(),
            "step": self.step,
            "pointer": self.pointer,
        });
        if let (Some(Value::Object(extra)), Some(map)) = (&self.extra, details.as_object_mut()) {
            for (key, value) in extra {
                map.insert(key.clone(), value.clone());
            }
        }
        details
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.step, self.pointer.is_empty()) {
            (Some(step), _) => write!(formatter, "step `{step}` ({}): {}", self.pointer, self.message),
            (None, false) => write!(formatter, "{}: {}", self.pointer, self.message),
            (None, true) => formatter.write_str(&self.message),
        }
    }
}

impl std::error::Error for Problem {}
