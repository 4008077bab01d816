//! The context service's stable codes, their HTTP statuses and gRPC codes, and
//! how store answers map onto them; the error itself (message, field,
//! details, body, statuses) is the edge's shared [`ApiError`].

use agent_reach_errors::{ApiError, ErrorCode};
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
    CredentialField,
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
    MethodNotAllowed,
    ContextStoreUnavailable,
    Internal,
}

impl ErrorCode for Code {
    const UNAUTHENTICATED: Self = Code::Unauthenticated;
    const METHOD_NOT_ALLOWED: Self = Code::MethodNotAllowed;
    const PAYLOAD_TOO_LARGE: Self = Code::PayloadTooLarge;
    const MALFORMED_JSON: Self = Code::MalformedJson;
    const UNKNOWN_FIELD: Self = Code::UnknownField;
    const MISSING_FIELD: Self = Code::MissingField;
    const INVALID_FIELD_TYPE: Self = Code::InvalidFieldType;

    fn as_str(self) -> &'static str {
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
            Code::CredentialField => "CREDENTIAL_FIELD",
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
            Code::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Code::ContextStoreUnavailable => "CONTEXT_STORE_UNAVAILABLE",
            Code::Internal => "INTERNAL",
        }
    }

    fn http_status(self) -> StatusCode {
        match self {
            Code::PayloadTooLarge | Code::FieldTooLarge | Code::TooManyFields | Code::ContextTooLarge => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::ContextNotFound | Code::NotFound => StatusCode::NOT_FOUND,
            Code::ContextExists | Code::VersionConflict => StatusCode::CONFLICT,
            Code::ContextStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn grpc_code(self) -> tonic::Code {
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
}

impl Code {
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

/// Every error the context service answers with.
pub type ContextError = ApiError<Code>;

/// No context `context_id`.
pub fn not_found(context_id: &str) -> ContextError {
    ContextError::new(
        Code::ContextNotFound,
        format!("no context `{context_id}` (never created, closed, expired or swept as idle)"),
    )
}

/// Maps a store answer for `context_id` to the API's codes.
pub fn from_store(error: StoreError, context_id: &str) -> ContextError {
    match error {
        StoreError::NotFound => not_found(context_id),
        StoreError::Exists => ContextError::field(
            Code::ContextExists,
            "context_id",
            format!("context `{context_id}` already exists; pick another id or omit it"),
        ),
        StoreError::VersionConflict { current } => ContextError::field(
            Code::VersionConflict,
            "if_version",
            format!("context `{context_id}` is at version {current}; re-read it and retry your patch"),
        )
        .with_details(serde_json::json!({ "current_version": current })),
        StoreError::TooManyFields { limit, would_have } => ContextError::new(
            Code::TooManyFields,
            format!("the context would hold {would_have} fields; the limit is {limit}"),
        )
        .with_details(serde_json::json!({ "limit": limit, "would_have": would_have })),
        StoreError::TooLarge { limit, would_have } => ContextError::new(
            Code::ContextTooLarge,
            format!("the context would hold {would_have} bytes of names and values; the limit is {limit}"),
        )
        .with_details(serde_json::json!({ "limit": limit, "would_have": would_have })),
        StoreError::NotOwner => ContextError::new(
            Code::Forbidden,
            format!("only the agent that created `{context_id}` (or one with `write: [\"*\"]`) may close it"),
        ),
        StoreError::Unavailable(why) => ContextError::new(
            Code::ContextStoreUnavailable,
            format!("the context store (Redis) is unreachable: {why}; retry shortly"),
        ),
        StoreError::Corrupt(why) => ContextError::new(Code::Internal, format!("unexpected store answer: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use agent_reach_errors::{CODE_METADATA, FIELD_METADATA};

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
