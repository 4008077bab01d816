//! The registry's stable codes and their HTTP statuses and gRPC codes; the
//! error itself (message, field, details, body, statuses) is the edge's
//! shared [`ApiError`].

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
    PayloadTooLarge,
    InvalidAgentId,
    InvalidName,
    InvalidEndpoint,
    InvalidProtocol,
    InvalidWeight,
    InvalidTtl,
    InvalidStatus,
    InvalidTags,
    NoCapabilities,
    InvalidCapabilityName,
    InvalidVersion,
    InvalidVersionReq,
    InvalidSchema,
    SchemaTooLarge,
    SchemaTooDeep,
    InvalidTimeout,
    DuplicateCapability,
    InvalidSplit,
    InvalidAccessRequest,
    InvalidPolicy,
    Unauthenticated,
    Forbidden,
    AgentIdTaken,
    AgentNotFound,
    CapabilityNotFound,
    VersionNotFound,
    SplitNotFound,
    AccessRequestNotFound,
    GrantNotFound,
    AlreadyAllowed,
    AlreadyDecided,
    NoOwner,
    PolicyNotFound,
    LeaseExpired,
    InvalidStatusTransition,
    Conflict,
    NotFound,
    MethodNotAllowed,
    StoreUnavailable,
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
            Code::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Code::InvalidAgentId => "INVALID_AGENT_ID",
            Code::InvalidName => "INVALID_NAME",
            Code::InvalidEndpoint => "INVALID_ENDPOINT",
            Code::InvalidProtocol => "INVALID_PROTOCOL",
            Code::InvalidWeight => "INVALID_WEIGHT",
            Code::InvalidTtl => "INVALID_TTL",
            Code::InvalidStatus => "INVALID_STATUS",
            Code::InvalidTags => "INVALID_TAGS",
            Code::NoCapabilities => "NO_CAPABILITIES",
            Code::InvalidCapabilityName => "INVALID_CAPABILITY_NAME",
            Code::InvalidVersion => "INVALID_VERSION",
            Code::InvalidVersionReq => "INVALID_VERSION_REQ",
            Code::InvalidSchema => "INVALID_SCHEMA",
            Code::SchemaTooLarge => "SCHEMA_TOO_LARGE",
            Code::SchemaTooDeep => "SCHEMA_TOO_DEEP",
            Code::InvalidTimeout => "INVALID_TIMEOUT",
            Code::DuplicateCapability => "DUPLICATE_CAPABILITY",
            Code::InvalidSplit => "INVALID_SPLIT",
            Code::InvalidAccessRequest => "INVALID_ACCESS_REQUEST",
            Code::InvalidPolicy => "INVALID_POLICY",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Forbidden => "FORBIDDEN",
            Code::AgentIdTaken => "AGENT_ID_TAKEN",
            Code::AgentNotFound => "AGENT_NOT_FOUND",
            Code::CapabilityNotFound => "CAPABILITY_NOT_FOUND",
            Code::VersionNotFound => "VERSION_NOT_FOUND",
            Code::SplitNotFound => "SPLIT_NOT_FOUND",
            Code::AccessRequestNotFound => "ACCESS_REQUEST_NOT_FOUND",
            Code::GrantNotFound => "GRANT_NOT_FOUND",
            Code::AlreadyAllowed => "ALREADY_ALLOWED",
            Code::AlreadyDecided => "ALREADY_DECIDED",
            Code::NoOwner => "NO_OWNER",
            Code::PolicyNotFound => "POLICY_NOT_FOUND",
            Code::LeaseExpired => "LEASE_EXPIRED",
            Code::InvalidStatusTransition => "INVALID_STATUS_TRANSITION",
            Code::Conflict => "CONFLICT",
            Code::NotFound => "NOT_FOUND",
            Code::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Code::StoreUnavailable => "STORE_UNAVAILABLE",
            Code::Internal => "INTERNAL",
        }
    }

    fn http_status(self) -> StatusCode {
        match self {
            Code::PayloadTooLarge | Code::SchemaTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::AgentNotFound
            | Code::CapabilityNotFound
            | Code::VersionNotFound
            | Code::SplitNotFound
            | Code::AccessRequestNotFound
            | Code::GrantNotFound
            | Code::PolicyNotFound
            | Code::LeaseExpired
            | Code::NotFound => StatusCode::NOT_FOUND,
            Code::AgentIdTaken
            | Code::InvalidStatusTransition
            | Code::Conflict
            | Code::AlreadyAllowed
            | Code::AlreadyDecided
            | Code::NoOwner => StatusCode::CONFLICT,
            Code::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn grpc_code(self) -> tonic::Code {
        match self.http_status() {
            StatusCode::PAYLOAD_TOO_LARGE => tonic::Code::ResourceExhausted,
            StatusCode::UNAUTHORIZED => tonic::Code::Unauthenticated,
            StatusCode::FORBIDDEN => tonic::Code::PermissionDenied,
            StatusCode::NOT_FOUND => tonic::Code::NotFound,
            StatusCode::CONFLICT => match self {
                Code::InvalidStatusTransition | Code::AlreadyAllowed | Code::AlreadyDecided | Code::NoOwner => {
                    tonic::Code::FailedPrecondition
                }
                _ => tonic::Code::Aborted,
            },
            StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
            StatusCode::INTERNAL_SERVER_ERROR => tonic::Code::Internal,
            _ => tonic::Code::InvalidArgument,
        }
    }
}

/// Every error the registry answers with.
pub type RegistryError = ApiError<Code>;

/// A heartbeat or deregistration for a lease that no longer exists.
pub fn lease_expired(agent_id: &str) -> RegistryError {
    RegistryError::new(
        Code::LeaseExpired,
        format!("the lease of `{agent_id}` is gone (expired, revoked or replaced); register again"),
    )
}

impl From<StoreError> for RegistryError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(why) => Self::new(
                Code::StoreUnavailable,
                format!("the registry's store (etcd) is unreachable: {why}; retry shortly"),
            ),
            StoreError::Conflict => Self::new(Code::Conflict, "a concurrent change won; retry"),
            other => Self::new(Code::Internal, other.to_string()),
        }
    }
}
