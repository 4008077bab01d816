//! The registry's one error type: a stable code, a message a person can act
//! on, the field at fault, and the mapping to HTTP status and gRPC code.

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
    InvalidTimeout,
    DuplicateCapability,
    Unauthenticated,
    Forbidden,
    AgentIdTaken,
    AgentNotFound,
    CapabilityNotFound,
    VersionNotFound,
    LeaseExpired,
    InvalidStatusTransition,
    Conflict,
    NotFound,
    StoreUnavailable,
    Internal,
}

impl Code {
    pub fn as_str(self) -> &'static str {
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
            Code::InvalidTimeout => "INVALID_TIMEOUT",
            Code::DuplicateCapability => "DUPLICATE_CAPABILITY",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Forbidden => "FORBIDDEN",
            Code::AgentIdTaken => "AGENT_ID_TAKEN",
            Code::AgentNotFound => "AGENT_NOT_FOUND",
            Code::CapabilityNotFound => "CAPABILITY_NOT_FOUND",
            Code::VersionNotFound => "VERSION_NOT_FOUND",
            Code::LeaseExpired => "LEASE_EXPIRED",
            Code::InvalidStatusTransition => "INVALID_STATUS_TRANSITION",
            Code::Conflict => "CONFLICT",
            Code::NotFound => "NOT_FOUND",
            Code::StoreUnavailable => "STORE_UNAVAILABLE",
            Code::Internal => "INTERNAL",
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::AgentNotFound
            | Code::CapabilityNotFound
            | Code::VersionNotFound
            | Code::LeaseExpired
            | Code::NotFound => StatusCode::NOT_FOUND,
            Code::AgentIdTaken | Code::InvalidStatusTransition | Code::Conflict => StatusCode::CONFLICT,
            Code::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub fn grpc_code(self) -> tonic::Code {
        match self.http_status() {
            StatusCode::PAYLOAD_TOO_LARGE => tonic::Code::ResourceExhausted,
            StatusCode::UNAUTHORIZED => tonic::Code::Unauthenticated,
            StatusCode::FORBIDDEN => tonic::Code::PermissionDenied,
            StatusCode::NOT_FOUND => tonic::Code::NotFound,
            StatusCode::CONFLICT => match self {
                Code::InvalidStatusTransition => tonic::Code::FailedPrecondition,
                _ => tonic::Code::Aborted,
            },
            StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
            StatusCode::INTERNAL_SERVER_ERROR => tonic::Code::Internal,
            _ => tonic::Code::InvalidArgument,
        }
    }
}

pub use agent_reach_edge::{CODE_METADATA, FIELD_METADATA};

#[derive(Debug, Clone, PartialEq)]
pub struct RegistryError {
    pub code: Code,
    pub message: String,
    pub field: Option<String>,
    pub details: Option<serde_json::Value>,
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        Ok(())
    }
}

impl std::error::Error for RegistryError {}

impl RegistryError {
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

    pub fn lease_expired(agent_id: &str) -> Self {
        Self::new(
            Code::LeaseExpired,
            format!("the lease of `{agent_id}` is gone (expired, revoked or replaced); register again"),
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
}

impl From<agent_reach_edge::BodyProblem> for RegistryError {
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

impl From<agent_reach_access::AuthError> for RegistryError {
    fn from(error: agent_reach_access::AuthError) -> Self {
        Self::new(Code::Unauthenticated, error.to_string())
    }
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        (self.code.http_status(), axum::Json(self.body())).into_response()
    }
}
