//! What a delivery answers, shared by the JSON and the streamed paths
//! (`server.rs`, `stream.rs`): error bodies, the HTTP response, the in-flight
//! count a delivery holds while it runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use agent_reach_proto::envelope::{AgentErrorBody, AgentErrorDetail};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::dedup::Answer;
use crate::state::Shared;
use crate::HandlerError;

pub(crate) fn error_answer(status: u16, code: &str, message: impl Into<String>) -> Answer {
    let body = AgentErrorBody {
        error: AgentErrorDetail {
            code: code.to_string(),
            message: message.into(),
        },
    };
    Answer {
        status,
        body: serde_json::to_vec(&body).unwrap_or_default(),
    }
}

pub(crate) fn respond(answer: Answer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(http::header::CONTENT_TYPE, "application/json")], answer.body).into_response()
}

/// Counts a delivery in flight until it ends, however it ends; both edges
/// may move the agent's automatic load (busy, overloaded, ready again).
pub(crate) struct InflightGuard(Arc<Shared>);

impl InflightGuard {
    pub(crate) fn start(shared: Arc<Shared>) -> Self {
        let inflight = shared.inflight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.inflight_changed(inflight);
        Self(shared)
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let inflight = self.0.inflight.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        self.0.inflight_changed(inflight);
    }
}

/// Whether `answer` is a pause's (never remembered: the resumed delivery has the same request id).
pub(crate) fn is_paused(answer: &Answer) -> bool {
    answer.status == 200 && answer.body.starts_with(b"{\"paused\"")
}

pub(crate) fn handler_error(error: &HandlerError) -> Answer {
    if let Some(checkpoint) = &error.checkpoint {
        return Answer {
            status: 200,
            body: serde_json::to_vec(&json!({ "paused": { "checkpoint": checkpoint } })).unwrap_or_default(),
        };
    }
    if error.is_accepted() {
        // Remembered like any answer: a redelivery of this task finds it accepted, not started twice.
        return Answer {
            status: 202,
            body: serde_json::to_vec(&json!({ "accepted": true })).unwrap_or_default(),
        };
    }
    error_answer(error.status, &error.code, error.message.clone())
}
