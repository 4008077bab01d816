//! The router's stable codes (DESIGN §3), their HTTP statuses and whether a
//! later retry by the caller may succeed. The error itself is the edge's
//! shared [`ApiError`]; the router renders every failure, on every route, as
//! a failed result envelope (`http::failed_answer`).

use agent_reach_errors::ApiError;

/// The router's stable codes, defined once for the router and the SDKs
/// (`agent_reach_proto::codes`); their statuses are `agent_reach_errors`'.
pub use agent_reach_proto::RouterCode as Code;

/// Every error the router answers with.
pub type RouterError = ApiError<Code>;

#[cfg(test)]
mod tests {
    use agent_reach_errors::ErrorCode as _;
    use http::StatusCode;

    use super::*;

    #[test]
    fn codes_are_stable_and_distinct() {
        assert_eq!(Code::SchemaMismatch.http_status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(Code::DeadlineExceeded.http_status(), StatusCode::GATEWAY_TIMEOUT);
        let agent =
            RouterError::new(Code::AgentError, "no such order").with_passthrough(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(agent.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!agent.envelope_error().retryable);
    }
}
