//! The router's stable codes (DESIGN §3), their HTTP statuses and whether a
//! later retry by the caller may succeed. The error itself is the edge's
//! shared [`ApiError`]; the router renders every failure, on every route, as
//! a failed result envelope (`http::failed_answer`).

use agent_reach_edge::{ApiError, BodyProblem, ErrorCode};
use http::StatusCode;

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
    /// Redis is unreachable and the local task buffer is full (or cannot be written).
    TaskBufferFull,
    InvalidCallback,
    Canceled,
    InvalidQuery,
    AssertionFailed,
    RateLimited,
    OutputSchemaMismatch,
    StreamInterrupted,
    InvalidTaskResult,
    DeadLetterNotFound,
}

impl Code {
    pub const ALL: [Code; 28] = [
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
        Code::TaskBufferFull,
        Code::InvalidCallback,
        Code::Canceled,
        Code::InvalidQuery,
        Code::AssertionFailed,
        Code::RateLimited,
        Code::OutputSchemaMismatch,
        Code::StreamInterrupted,
        Code::InvalidTaskResult,
        Code::DeadLetterNotFound,
    ];
}

impl ErrorCode for Code {
    const UNAUTHENTICATED: Self = Code::Unauthenticated;
    const METHOD_NOT_ALLOWED: Self = Code::MethodNotAllowed;

    fn as_str(self) -> &'static str {
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
            Code::TaskBufferFull => "TASK_BUFFER_FULL",
            Code::InvalidCallback => "INVALID_CALLBACK",
            Code::Canceled => "CANCELED",
            Code::InvalidQuery => "INVALID_QUERY",
            Code::AssertionFailed => "ASSERTION_FAILED",
            Code::RateLimited => "RATE_LIMITED",
            Code::OutputSchemaMismatch => "OUTPUT_SCHEMA_MISMATCH",
            Code::StreamInterrupted => "STREAM_INTERRUPTED",
            Code::InvalidTaskResult => "INVALID_TASK_RESULT",
            Code::DeadLetterNotFound => "DEAD_LETTER_NOT_FOUND",
        }
    }

    /// The status for this code. `AGENT_ERROR` carries the agent's own status
    /// instead (a passthrough, see [`ApiError::status`]); 502 is only its fallback.
    fn http_status(self) -> StatusCode {
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
            Code::TaskBufferFull => StatusCode::SERVICE_UNAVAILABLE,
            Code::InvalidCallback => StatusCode::BAD_REQUEST,
            Code::Canceled => StatusCode::CONFLICT,
            Code::InvalidQuery => StatusCode::BAD_REQUEST,
            Code::AssertionFailed => StatusCode::INTERNAL_SERVER_ERROR,
            Code::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Code::OutputSchemaMismatch | Code::StreamInterrupted => StatusCode::BAD_GATEWAY,
            Code::InvalidTaskResult => StatusCode::BAD_REQUEST,
            Code::DeadLetterNotFound => StatusCode::NOT_FOUND,
        }
    }

    /// May the caller succeed by sending the same request again later?
    fn is_retryable(self) -> bool {
        matches!(
            self,
            Code::Overloaded
                | Code::RateLimited
                | Code::AllRetriesExhausted
                | Code::NoAvailableInstance
                | Code::DeadlineExceeded
                | Code::TaskStoreUnavailable
                | Code::TaskBufferFull
                // The router does not retry a stream it began relaying; the caller may call again.
                | Code::StreamInterrupted
        )
    }

    fn for_body(problem: &BodyProblem) -> Self {
        match problem {
            BodyProblem::TooLarge { .. } => Code::PayloadTooLarge,
            _ => Code::InvalidEnvelope,
        }
    }
}

/// Every error the router answers with.
pub type RouterError = ApiError<Code>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_distinct() {
        let names: std::collections::HashSet<_> = Code::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(names.len(), Code::ALL.len());
        assert_eq!(Code::SchemaMismatch.http_status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(Code::DeadlineExceeded.http_status(), StatusCode::GATEWAY_TIMEOUT);
        let agent =
            RouterError::new(Code::AgentError, "no such order").with_passthrough(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(agent.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!agent.envelope_error().retryable);
    }
}
