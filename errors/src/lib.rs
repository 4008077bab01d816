//! One API error for every service: a stable code (each service's own enum,
//! through [`ErrorCode`]), a message a person can act on, the field at fault,
//! optional details, and its HTTP status, JSON body and gRPC status. Services
//! keep only their code enums; the conversions from refused bodies
//! ([`BodyProblem`]) and failed credentials ([`AuthError`]) live here once.
//! The router's codes, which the SDKs share, are `agent_reach_proto`'s
//! [`RouterCode`]; their statuses are given here.

use agent_reach_access::AuthError;
use agent_reach_proto::envelope::EnvelopeError;
use agent_reach_proto::http::{ErrorBody, ErrorDetail};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::Value;

/// gRPC metadata keys carrying the stable code and the field at fault.
pub const CODE_METADATA: &str = "x-agent-reach-code";
pub const FIELD_METADATA: &str = "x-agent-reach-field";

/// Why a request body was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyProblem {
    TooLarge {
        limit: usize,
    },
    /// Not JSON at all, cut short, unreadable, or followed by trailing data.
    Malformed {
        message: String,
    },
    UnknownField {
        field: String,
        message: String,
    },
    MissingField {
        field: String,
        message: String,
    },
    /// A value of the wrong type or shape; `field` is `None` at the root.
    WrongType {
        field: Option<String>,
        message: String,
    },
}

impl BodyProblem {
    /// A message for a person.
    pub fn message(&self) -> String {
        match self {
            BodyProblem::TooLarge { limit } => format!("request body exceeds this service's limit of {limit} bytes"),
            BodyProblem::Malformed { message }
            | BodyProblem::UnknownField { message, .. }
            | BodyProblem::MissingField { message, .. }
            | BodyProblem::WrongType { message, .. } => format!("invalid request body: {message}"),
        }
    }

    /// The field at fault, as a dotted path (`capabilities[1].version`).
    pub fn field(&self) -> Option<&str> {
        match self {
            BodyProblem::UnknownField { field, .. } | BodyProblem::MissingField { field, .. } => Some(field),
            BodyProblem::WrongType { field, .. } => field.as_deref(),
            _ => None,
        }
    }
}

/// A gRPC status whose metadata carries the stable code and the field at fault.
pub fn grpc_status(code: tonic::Code, stable_code: &str, message: String, field: Option<&str>) -> tonic::Status {
    let mut status = tonic::Status::new(code, message);
    if let Ok(value) = stable_code.parse() {
        status.metadata_mut().insert(CODE_METADATA, value);
    }
    if let Some(Ok(value)) = field.map(str::parse) {
        status.metadata_mut().insert(FIELD_METADATA, value);
    }
    status
}

/// A service's stable error codes (their string forms are part of its API).
pub trait ErrorCode: Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// The code for a missing, expired or invalid credential.
    const UNAUTHENTICATED: Self;

    /// The code for a route asked with a method it does not take.
    const METHOD_NOT_ALLOWED: Self;

    /// The codes of refused bodies ([`ErrorCode::for_body`]): over the limit,
    /// not JSON, an unknown field, a missing one, a value of the wrong type.
    const PAYLOAD_TOO_LARGE: Self;
    const MALFORMED_JSON: Self;
    const UNKNOWN_FIELD: Self;
    const MISSING_FIELD: Self;
    const INVALID_FIELD_TYPE: Self;

    fn as_str(self) -> &'static str;

    fn http_status(self) -> StatusCode;

    /// The gRPC code; by default the one that matches the HTTP status.
    fn grpc_code(self) -> tonic::Code {
        grpc_code_for(self.http_status())
    }

    /// May the same request succeed when sent again later?
    fn is_retryable(self) -> bool {
        false
    }

    /// The code for a request body the edge refused.
    fn for_body(problem: &BodyProblem) -> Self {
        match problem {
            BodyProblem::TooLarge { .. } => Self::PAYLOAD_TOO_LARGE,
            BodyProblem::Malformed { .. } => Self::MALFORMED_JSON,
            BodyProblem::UnknownField { .. } => Self::UNKNOWN_FIELD,
            BodyProblem::MissingField { .. } => Self::MISSING_FIELD,
            BodyProblem::WrongType { .. } => Self::INVALID_FIELD_TYPE,
        }
    }
}

/// The router's codes (defined once in `agent_reach_proto`, shared with the SDKs).
impl ErrorCode for agent_reach_proto::RouterCode {
    const UNAUTHENTICATED: Self = Self::Unauthenticated;
    const METHOD_NOT_ALLOWED: Self = Self::MethodNotAllowed;
    // Every refused body but one over the limit is an invalid envelope.
    const PAYLOAD_TOO_LARGE: Self = Self::PayloadTooLarge;
    const MALFORMED_JSON: Self = Self::InvalidEnvelope;
    const UNKNOWN_FIELD: Self = Self::InvalidEnvelope;
    const MISSING_FIELD: Self = Self::InvalidEnvelope;
    const INVALID_FIELD_TYPE: Self = Self::InvalidEnvelope;

    fn as_str(self) -> &'static str {
        agent_reach_proto::RouterCode::as_str(self)
    }

    /// `AGENT_ERROR` carries the agent's own status instead (a passthrough,
    /// see [`ApiError::status`]); 502 is only its fallback.
    fn http_status(self) -> StatusCode {
        // Every status in the table is a valid one (`tests::router_codes_have_valid_statuses`).
        StatusCode::from_u16(self.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn is_retryable(self) -> bool {
        agent_reach_proto::RouterCode::is_retryable(self)
    }
}

/// The gRPC code conventionally paired with an HTTP status.
pub fn grpc_code_for(status: StatusCode) -> tonic::Code {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => tonic::Code::ResourceExhausted,
        StatusCode::UNAUTHORIZED => tonic::Code::Unauthenticated,
        StatusCode::FORBIDDEN => tonic::Code::PermissionDenied,
        StatusCode::NOT_FOUND => tonic::Code::NotFound,
        StatusCode::CONFLICT => tonic::Code::Aborted,
        StatusCode::NOT_IMPLEMENTED => tonic::Code::Unimplemented,
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => tonic::Code::Unavailable,
        StatusCode::GATEWAY_TIMEOUT => tonic::Code::DeadlineExceeded,
        StatusCode::INTERNAL_SERVER_ERROR => tonic::Code::Internal,
        _ => tonic::Code::InvalidArgument,
    }
}

/// An error a service answers with.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError<C> {
    pub code: C,
    pub message: String,
    /// The request field at fault, as a dotted path (`capabilities[1].version`).
    pub field: Option<String>,
    /// Boxed: errors travel by value through every `Result` on the request
    /// path, and details are rare.
    pub details: Option<Box<Value>>,
    /// An upstream's own status, passed through instead of the code's (the
    /// router's `AGENT_ERROR` carries the agent's).
    pub passthrough: Option<StatusCode>,
}

impl<C: ErrorCode> std::fmt::Display for ApiError<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        Ok(())
    }
}

impl<C: ErrorCode> std::error::Error for ApiError<C> {}

impl<C: ErrorCode> ApiError<C> {
    pub fn new(code: C, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            details: None,
            passthrough: None,
        }
    }

    /// An error about one request field.
    pub fn field(code: C, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(code, message)
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    /// Answers with an upstream's own `status` instead of the code's.
    pub fn with_passthrough(mut self, status: StatusCode) -> Self {
        self.passthrough = Some(status);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.passthrough.unwrap_or_else(|| self.code.http_status())
    }

    /// `{"error": {code, message, field?, details?}}`: the registry's and the
    /// context service's error body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.as_str().to_string(),
                message: self.message.clone(),
                field: self.field.clone(),
                details: self.details.as_deref().cloned(),
            },
        }
    }

    /// The `error` of a failed result envelope (the router's shape): the
    /// field at fault, if any, is `details.field`.
    pub fn envelope_error(&self) -> EnvelopeError {
        let details = match (&self.field, self.details.as_deref()) {
            (None, details) => details.cloned(),
            (Some(field), Some(Value::Object(details))) => {
                let mut details = details.clone();
                details.insert("field".to_string(), Value::String(field.clone()));
                Some(Value::Object(details))
            }
            (Some(field), _) => Some(serde_json::json!({ "field": field })),
        };
        EnvelopeError {
            code: self.code.as_str().to_string(),
            message: self.message.clone(),
            retryable: self.code.is_retryable(),
            details,
        }
    }

    /// A gRPC status whose metadata carries the stable code and the field.
    pub fn to_status(&self) -> tonic::Status {
        crate::grpc_status(
            self.code.grpc_code(),
            self.code.as_str(),
            self.to_string(),
            self.field.as_deref(),
        )
    }
}

impl<C: ErrorCode> From<BodyProblem> for ApiError<C> {
    fn from(problem: BodyProblem) -> Self {
        let mut error = Self::new(C::for_body(&problem), problem.message());
        error.field = problem.field().map(str::to_string);
        if let BodyProblem::TooLarge { limit } = problem {
            error.details = Some(Box::new(serde_json::json!({ "limit_bytes": limit })));
        }
        error
    }
}

impl<C: ErrorCode> From<AuthError> for ApiError<C> {
    fn from(error: AuthError) -> Self {
        Self::new(C::UNAUTHENTICATED, error.to_string()).with_details(serde_json::json!({ "reason": error.reason() }))
    }
}

/// The answer for a route asked with a method it does not take (`405` with
/// the service's code, naming the method and the path): a route's fallback.
pub async fn method_not_allowed<C: ErrorCode>(method: http::Method, uri: http::Uri) -> Response {
    ApiError::new(
        C::METHOD_NOT_ALLOWED,
        format!("`{method}` is not allowed on `{}`", uri.path()),
    )
    .into_response()
}

impl<C: ErrorCode> IntoResponse for ApiError<C> {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_codes_have_valid_statuses() {
        for &code in agent_reach_proto::RouterCode::ALL {
            assert!(StatusCode::from_u16(code.status_code()).is_ok(), "{code}");
            assert_eq!(ErrorCode::http_status(code).as_u16(), code.status_code());
        }
    }

    #[test]
    fn grpc_metadata_carries_code_and_field() {
        let status = grpc_status(tonic::Code::InvalidArgument, "INVALID_TTL", "bad".into(), Some("ttl_s"));
        assert_eq!(status.metadata().get(CODE_METADATA).unwrap(), "INVALID_TTL");
        assert_eq!(status.metadata().get(FIELD_METADATA).unwrap(), "ttl_s");
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Code {
        Bad,
        TooBig,
        Denied,
        Gone,
    }

    impl ErrorCode for Code {
        const UNAUTHENTICATED: Self = Code::Denied;
        const METHOD_NOT_ALLOWED: Self = Code::Bad;
        const PAYLOAD_TOO_LARGE: Self = Code::TooBig;
        const MALFORMED_JSON: Self = Code::Bad;
        const UNKNOWN_FIELD: Self = Code::Bad;
        const MISSING_FIELD: Self = Code::Bad;
        const INVALID_FIELD_TYPE: Self = Code::Bad;

        fn as_str(self) -> &'static str {
            match self {
                Code::Bad => "BAD",
                Code::TooBig => "TOO_BIG",
                Code::Denied => "DENIED",
                Code::Gone => "GONE",
            }
        }

        fn http_status(self) -> StatusCode {
            match self {
                Code::Bad => StatusCode::BAD_REQUEST,
                Code::TooBig => StatusCode::PAYLOAD_TOO_LARGE,
                Code::Denied => StatusCode::UNAUTHORIZED,
                Code::Gone => StatusCode::NOT_FOUND,
            }
        }
    }

    #[test]
    fn body_problems_keep_their_field_and_limit() {
        let error: ApiError<Code> = BodyProblem::MissingField {
            field: "capabilities[0].name".into(),
            message: "missing field `name`".into(),
        }
        .into();
        assert_eq!(
            (error.code, error.field.as_deref()),
            (Code::Bad, Some("capabilities[0].name"))
        );
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        let body = serde_json::to_value(error.body()).unwrap();
        assert_eq!(body["error"]["field"], "capabilities[0].name");
        assert_eq!(body["error"]["code"], "BAD");
        assert_eq!(error.to_status().code(), tonic::Code::InvalidArgument);

        let too_big: ApiError<Code> = BodyProblem::TooLarge { limit: 1024 }.into();
        assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(too_big.envelope_error().details.unwrap()["limit_bytes"], 1024);
    }

    #[test]
    fn the_envelope_error_names_the_field_in_its_details() {
        let error = ApiError::field(Code::Bad, "timeout_ms", "must be above 0");
        assert_eq!(
            error.envelope_error().details,
            Some(serde_json::json!({ "field": "timeout_ms" }))
        );
        let error = error.with_details(serde_json::json!({ "limit": 3 }));
        assert_eq!(
            error.envelope_error().details,
            Some(serde_json::json!({ "field": "timeout_ms", "limit": 3 }))
        );
        assert!(!error.envelope_error().retryable);
        assert_eq!(error.to_string(), "BAD: must be above 0 (field `timeout_ms`)");
    }

    #[test]
    fn a_passthrough_status_wins_over_the_codes() {
        let error = ApiError::new(Code::Gone, "upstream said so").with_passthrough(StatusCode::IM_A_TEAPOT);
        assert_eq!(error.status(), StatusCode::IM_A_TEAPOT);
        assert_eq!(error.envelope_error().code, "GONE");
    }
}
