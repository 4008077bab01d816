//! The context service's one error type: a stable code, a message a person can
//! act on, the field at fault, and the mapping to HTTP status and gRPC code.

use agent_reach_proto::http::{ErrorBody, ErrorDetail};
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::store::StoreError;

/// Stable error codes. The string forms are part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    MalformedJson,
    MissingField,
    InvalidFieldType,
    UnknownField,
    InvalidQuery,
    PayloadTooLarge,
    InvalidContextId,
    InvalidTier,
    InvalidFieldName,
    InvalidFieldValue,
    EmptyPatch,
    ConflictingPatch,
    FieldTooLarge,
    TooManyFields,
    ContextTooLarge,
    Unauthenticated,
    Forbidden,
    ContextNotFound,
    ContextExists,
    VersionConflict,
    NotFound,
    ContextStoreUnavailable,
    Internal,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::MalformedJson => "MALFORMED_JSON",
            Code::MissingField => "MISSING_FIELD",
            Code::InvalidFieldType => "INVALID_FIELD_TYPE",
            Code::UnknownField => "UNKNOWN_FIELD",
            Code::InvalidQuery => "INVALID_QUERY",
            Code::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Code::InvalidContextId => "INVALID_CONTEXT_ID",
            Code::InvalidTier => "INVALID_TIER",
            Code::InvalidFieldName => "INVALID_FIELD_NAME",
            Code::InvalidFieldValue => "INVALID_FIELD_VALUE",
            Code::EmptyPatch => "EMPTY_PATCH",
            Code::ConflictingPatch => "CONFLICTING_PATCH",
            Code::FieldTooLarge => "FIELD_TOO_LARGE",
            Code::TooManyFields => "TOO_MANY_FIELDS",
            Code::ContextTooLarge => "CONTEXT_TOO_LARGE",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Forbidden => "FORBIDDEN",
            Code::ContextNotFound => "CONTEXT_NOT_FOUND",
            Code::ContextExists => "CONTEXT_EXISTS",
            Code::VersionConflict => "VERSION_CONFLICT",
            Code::NotFound => "NOT_FOUND",
            Code::ContextStoreUnavailable => "CONTEXT_STORE_UNAVAILABLE",
            Code::Internal => "INTERNAL",
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Code::PayloadTooLarge | Code::FieldTooLarge | Code::TooManyFields | Code::ContextTooLarge => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::ContextNotFound | Code::NotFound => StatusCode::NOT_FOUND,
            Code::ContextExists | Code::VersionConflict => StatusCode::CONFLICT,
            Code::ContextStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Code::PayloadTooLarge | Code::FieldTooLarge | Code::TooManyFields | Code::ContextTooLarge => {
                tonic::Code::ResourceExhausted
            }
            Code::Unauthenticated => tonic::Code::Unauthenticated,
            Code::Forbidden => tonic::Code::PermissionDenied,
            Code::ContextNotFound | Code::NotFound => tonic::Code::NotFound,
            Code::ContextExists => tonic::Code::AlreadyExists,
            // A failed `if_version` is a precondition, not a transient abort: retrying the same
            // request cannot succeed; the writer must re-read.
            Code::VersionConflict => tonic::Code::FailedPrecondition,
            Code::ContextStoreUnavailable => tonic::Code::Unavailable,
            Code::Internal => tonic::Code::Internal,
            _ => tonic::Code::InvalidArgument,
        }
    }

    /// A short label for the operations metric.
    pub fn outcome(self) -> &'static str {
        match self {
            Code::VersionConflict => "conflict",
            Code::ContextNotFound => "not_found",
            Code::ContextStoreUnavailable => "unavailable",
            Code::Unauthenticated | Code::Forbidden => "denied",
            Code::Internal => "error",
            _ => "rejected",
        }
    }
}

pub use agent_reach_edge::{CODE_METADATA, FIELD_METADATA};

#[derive(Debug, Clone, PartialEq)]
pub struct ContextError {
    pub code: Code,
    pub message: String,
    pub field: Option<String>,
    pub details: Option<serde_json::Value>,
}

impl std::fmt::Display for ContextError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        Ok(())
    }
}

impl std::error::Error for ContextError {}

impl ContextError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            details: None,
        }
    }

    pub fn field(code: Code, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(code, message)
        }
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(context_id: &str) -> Self {
        Self::new(
            Code::ContextNotFound,
            format!("no context `{context_id}` (never created, closed, expired or swept as idle)"),
        )
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.as_str().to_string(),
                message: self.message.clone(),
                field: self.field.clone(),
                details: self.details.clone(),
            },
        }
    }

    pub fn to_status(&self) -> tonic::Status {
        agent_reach_edge::grpc_status(
            self.code.grpc_code(),
            self.code.as_str(),
            self.to_string(),
            self.field.as_deref(),
        )
    }

    /// Maps a store answer for `context_id` to the API's codes.
    pub fn from_store(error: StoreError, context_id: &str) -> Self {
        match error {
            StoreError::NotFound => Self::not_found(context_id),
            StoreError::Exists => Self::field(
                Code::ContextExists,
                "context_id",
                format!("context `{context_id}` already exists; pick another id or omit it"),
            ),
            StoreError::VersionConflict { current } => Self::field(
                Code::VersionConflict,
                "if_version",
                format!("context `{context_id}` is at version {current}; re-read it and retry your patch"),
            )
            .with_details(serde_json::json!({ "current_version": current })),
            StoreError::TooManyFields { limit, would_have } => Self::new(
                Code::TooManyFields,
                format!("the context would hold {would_have} fields; the limit is {limit}"),
            )
            .with_details(serde_json::json!({ "limit": limit, "would_have": would_have })),
            StoreError::TooLarge { limit, would_have } => Self::new(
                Code::ContextTooLarge,
                format!("the context would hold {would_have} bytes of names and values; the limit is {limit}"),
            )
            .with_details(serde_json::json!({ "limit": limit, "would_have": would_have })),
            StoreError::NotOwner => Self::new(
                Code::Forbidden,
                format!("only the agent that created `{context_id}` (or one with `write: [\"*\"]`) may close it"),
            ),
            StoreError::Unavailable(why) => Self::new(
                Code::ContextStoreUnavailable,
                format!("the context store (Redis) is unreachable: {why}; retry shortly"),
            ),
            StoreError::Corrupt(why) => Self::new(Code::Internal, format!("unexpected store answer: {why}")),
        }
    }
}

impl From<agent_reach_edge::BodyProblem> for ContextError {
    fn from(problem: agent_reach_edge::BodyProblem) -> Self {
        use agent_reach_edge::BodyProblem;
        let code = match &problem {
            BodyProblem::TooLarge { .. } => Code::PayloadTooLarge,
            BodyProblem::Malformed { .. } => Code::MalformedJson,
            BodyProblem::UnknownField { .. } => Code::UnknownField,
            BodyProblem::MissingField { .. } => Code::MissingField,
            BodyProblem::WrongType { .. } => Code::InvalidFieldType,
        };
        Self {
            code,
            message: problem.message(),
            field: problem.field().map(str::to_string),
            details: None,
        }
    }
}

impl From<agent_reach_access::AuthError> for ContextError {
    fn from(error: agent_reach_access::AuthError) -> Self {
        Self::new(Code::Unauthenticated, error.to_string())
    }
}

impl IntoResponse for ContextError {
    fn into_response(self) -> Response {
        (self.code.http_status(), axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes_are_stable() {
        assert_eq!(Code::VersionConflict.http_status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::ContextStoreUnavailable.http_status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(Code::ContextStoreUnavailable.as_str(), "CONTEXT_STORE_UNAVAILABLE");
        assert_eq!(Code::FieldTooLarge.http_status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(Code::InvalidFieldName.http_status(), StatusCode::BAD_REQUEST);
        assert_eq!(Code::ContextStoreUnavailable.grpc_code(), tonic::Code::Unavailable);
        let status = ContextError::field(Code::InvalidFieldName, "set.Bad", "no").to_status();
        assert_eq!(
            status.metadata().get(CODE_METADATA).and_then(|v| v.to_str().ok()),
            Some("INVALID_FIELD_NAME")
        );
        assert_eq!(
            status.metadata().get(FIELD_METADATA).and_then(|v| v.to_str().ok()),
            Some("set.Bad")
        );
    }
}
