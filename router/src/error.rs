//! The router's one error type: a stable code of DESIGN §3, a message a person
//! can act on, optional details, the HTTP status, and whether a later retry
//! by the caller may succeed. Rendered as a failed result envelope by `http`.

use agent_reach_proto::envelope::EnvelopeError;
use http::StatusCode;
use serde_json::Value;

/// Stable codes. The string forms are part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidEnvelope,
    Unauthenticated,
    Forbidden,
    CapabilityNotFound,
    VersionNotFound,
    PayloadTooLarge,
    SchemaMismatch,
    Overloaded,
    AgentError,
    AllRetriesExhausted,
    NoAvailableInstance,
    DeadlineExceeded,
    NotFound,
    MethodNotAllowed,
    TasksDisabled,
    TaskNotFound,
    TaskConflict,
    TaskStoreUnavailable,
    InvalidCallback,
    Canceled,
}

impl Code {
    pub const ALL: [Code; 20] = [
        Code::InvalidEnvelope,
        Code::Unauthenticated,
        Code::Forbidden,
        Code::CapabilityNotFound,
        Code::VersionNotFound,
        Code::PayloadTooLarge,
        Code::SchemaMismatch,
        Code::Overloaded,
        Code::AgentError,
        Code::AllRetriesExhausted,
        Code::NoAvailableInstance,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::MethodNotAllowed,
        Code::TasksDisabled,
        Code::TaskNotFound,
        Code::TaskConflict,
        Code::TaskStoreUnavailable,
        Code::InvalidCallback,
        Code::Canceled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidEnvelope => "INVALID_ENVELOPE",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Forbidden => "FORBIDDEN",
            Code::CapabilityNotFound => "CAPABILITY_NOT_FOUND",
            Code::VersionNotFound => "VERSION_NOT_FOUND",
            Code::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Code::SchemaMismatch => "SCHEMA_MISMATCH",
            Code::Overloaded => "OVERLOADED",
            Code::AgentError => "AGENT_ERROR",
            Code::AllRetriesExhausted => "ALL_RETRIES_EXHAUSTED",
            Code::NoAvailableInstance => "NO_AVAILABLE_INSTANCE",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Code::TasksDisabled => "TASKS_DISABLED",
            Code::TaskNotFound => "TASK_NOT_FOUND",
            Code::TaskConflict => "TASK_CONFLICT",
            Code::TaskStoreUnavailable => "TASK_STORE_UNAVAILABLE",
            Code::InvalidCallback => "INVALID_CALLBACK",
            Code::Canceled => "CANCELED",
        }
    }

    /// The status for this code. `AGENT_ERROR` carries the agent's own status
    /// instead (see [`RouterError::status`]); 502 is only its fallback.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidEnvelope => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::CapabilityNotFound | Code::VersionNotFound | Code::NotFound => StatusCode::NOT_FOUND,
            Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::SchemaMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Code::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            Code::AgentError | Code::AllRetriesExhausted => StatusCode::BAD_GATEWAY,
            Code::NoAvailableInstance => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::TasksDisabled => StatusCode::NOT_IMPLEMENTED,
            Code::TaskNotFound => StatusCode::NOT_FOUND,
            Code::TaskConflict => StatusCode::CONFLICT,
            Code::TaskStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::InvalidCallback => StatusCode::BAD_REQUEST,
            Code::Canceled => StatusCode::CONFLICT,
        }
    }

    /// May the caller succeed by sending the same request again later?
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Code::Overloaded
                | Code::AllRetriesExhausted
                | Code::NoAvailableInstance
                | Code::DeadlineExceeded
                | Code::TaskStoreUnavailable
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouterError {
    pub code: Code,
    pub message: String,
    pub details: Option<Value>,
    /// Only for `AGENT_ERROR`: the agent's own HTTP status, passed through.
    pub agent_status: Option<StatusCode>,
}

impl std::fmt::Display for RouterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for RouterError {}

impl RouterError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
            agent_status: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.agent_status.unwrap_or_else(|| self.code.http_status())
    }

    pub fn to_envelope_error(&self) -> EnvelopeError {
        EnvelopeError {
            code: self.code.as_str().to_string(),
            message: self.message.clone(),
            retryable: self.code.is_retryable(),
            details: self.details.clone(),
        }
    }
}

impl From<agent_reach_access::AuthError> for RouterError {
    fn from(error: agent_reach_access::AuthError) -> Self {
        Self::new(Code::Unauthenticated, error.to_string())
            .with_details(serde_json::json!({ "reason": error.reason() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_distinct() {
        let names: std::collections::HashSet<_> = Code::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(names.len(), Code::ALL.len());
        assert_eq!(Code::SchemaMismatch.http_status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(Code::DeadlineExceeded.http_status(), StatusCode::GATEWAY_TIMEOUT);
        let agent = RouterError {
            agent_status: Some(StatusCode::UNPROCESSABLE_ENTITY),
            ..RouterError::new(Code::AgentError, "no such order")
        };
        assert_eq!(agent.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!agent.to_envelope_error().retryable);
    }
}
