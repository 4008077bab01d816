//! Every failure of every router route answers one shape, the failed result
//! envelope (DESIGN §3): `{version, request_id, status: "failed", capability?,
//! capability_version?, agent_id?, attempts, duration_ms, error: {code,
//! message, retryable, details?}}`, with the code's HTTP status (or an
//! agent's own, for `AGENT_ERROR`). A route that is not a call (a task's
//! status, a session's results) answers it with a fresh `request_id` and no
//! capability.

use std::time::Instant;

use agent_reach_proto::envelope::{ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_serving::front::Answer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::{Code, RouterError};
use crate::outcome::Failure;
use crate::trace;

/// What is known about a request when its result envelope is written.
pub struct Known {
    pub request_id: String,
    pub capability: Option<String>,
    pub started: Instant,
}

impl Known {
    /// A request known only by a fresh id (refused before its envelope was read).
    pub fn fresh(started: Instant) -> Self {
        Self {
            request_id: trace::new_request_id(),
            capability: None,
            started,
        }
    }
}

/// `envelope` as JSON with `status`.
pub fn json_answer(status: StatusCode, envelope: &impl serde::Serialize) -> Answer {
    // Serialising plain strings and JSON values does not fail; answer something valid anyway.
    Answer::json(status, envelope).unwrap_or_else(|_| Answer::Json {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: br#"{"version":"1.0","request_id":"","status":"failed","attempts":0,"duration_ms":0,"error":{"code":"INTERNAL","message":"result could not be encoded","retryable":true}}"#.to_vec(),
    })
}

pub fn json_response(status: StatusCode, envelope: &impl serde::Serialize) -> Response {
    json_answer(status, envelope).into_response()
}

/// The failed result envelope for `failure` of the request `known`; a
/// `RATE_LIMITED` answer says when to come back (`Retry-After`).
pub fn failed_answer(known: Known, failure: Failure) -> Answer {
    let retry_after = (failure.error.code == Code::RateLimited)
        .then(|| failure.error.details.as_ref()?.get("retry_after_s")?.as_u64())
        .flatten();
    let envelope = ResultEnvelope {
        version: ENVELOPE_VERSION.to_string(),
        request_id: known.request_id,
        status: ResultStatus::Failed,
        capability: known.capability,
        capability_version: failure.capability_version,
        agent_id: failure.agent_id,
        attempts: failure.attempts,
        duration_ms: known.started.elapsed().as_millis() as u64,
        output: None,
        error: Some(failure.error.envelope_error()),
        budget: None,
    };
    let answer = json_answer(failure.error.status(), &envelope);
    match retry_after {
        Some(seconds) => {
            let mut response = answer.into_response();
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
            Answer::Response(response)
        }
        None => answer,
    }
}

pub fn failed(known: Known, failure: Failure) -> Response {
    failed_answer(known, failure).into_response()
}

/// A failed envelope for a request that never reached a call (a bad route,
/// a refused query, a task API failure).
pub fn refused(error: RouterError) -> Response {
    failed(Known::fresh(Instant::now()), error.into())
}

/// Any path the router does not serve.
pub async fn not_found() -> Response {
    refused(RouterError::new(
        Code::NotFound,
        "no such route; see GET /v1/openapi.json",
    ))
}

/// A route asked with a method it does not take.
pub async fn method_not_allowed(method: http::Method, uri: http::Uri) -> Response {
    refused(RouterError::new(
        Code::MethodNotAllowed,
        format!(
            "`{method}` is not allowed on `{}`; see GET /v1/openapi.json for each route's methods",
            uri.path()
        ),
    ))
}
