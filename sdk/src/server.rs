//! The inbound side: the HTTP endpoint the router forwards envelopes to, and
//! the health endpoint that reports real readiness.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use agent_reach_proto::envelope::ForwardedEnvelope;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use tracing::Instrument;

use agent_reach_access::assertion::{bearer, AssertionClaims, AssertionError};

use crate::answer::{error_answer, handler_error, respond, InflightGuard};
use crate::call::now_ms;
use crate::ctx::Ctx;
use crate::dedup::Answer;
use crate::state::{Shared, Status};

pub(crate) fn routes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/invoke", post(invoke))
        .route("/healthz", get(health))
        .with_state(shared)
}

/// One span per delivery: an OpenTelemetry server span continuing the
/// router's `traceparent` when OTLP export is on, named and attributed as the
/// GenAI conventions say (`invoke_agent {capability}`, `gen_ai.*`, model
/// usage the handler reported); its fields (`trace_id`, `request_id`,
/// `session_id`) are on every log line of the handler.
async fn invoke(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let traceparent = headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let span = tracing::info_span!(
        "invoke_agent",
        otel.kind = "server",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.provider.name = "agent_reach",
        gen_ai.agent.name = tracing::field::Empty,
        gen_ai.agent.id = %shared.config.agent_id,
        gen_ai.conversation.id = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.request.model = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        request_id = tracing::field::Empty,
        session_id = tracing::field::Empty,
        capability = tracing::field::Empty,
        capability.version = tracing::field::Empty,
        agent_id = %shared.config.agent_id,
        attempt = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    agent_reach_telemetry::propagation::set_parent(&span, traceparent.as_deref());
    let trace_id = agent_reach_telemetry::propagation::trace_id(&span).or_else(|| {
        traceparent
            .as_deref()
            .and_then(|header| header.split('-').nth(1))
            .map(str::to_string)
    });
    if let Some(trace_id) = &trace_id {
        span.record("trace_id", trace_id.as_str());
    }
    let assertion = match &shared.keys {
        None => None,
        Some(keys) => {
            let header = headers.get(http::header::AUTHORIZATION).map(|value| value.as_bytes());
            match keys.verify(header, &shared.config.agent_id).await {
                // The token is kept: onward calls present it upstream.
                Ok(claims) => bearer(header).ok().map(|token| (token.to_string(), claims)),
                Err(error) => return span.in_scope(|| refuse(&error)),
            }
        }
    };
    // A streaming handler answers events only to a caller (the router) that asks for them.
    let wants_events = headers
        .get(http::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| {
            accept.split(',').any(|item| {
                item.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .eq_ignore_ascii_case("text/event-stream")
            })
        });
    if headers
        .get("x-agent-reach-control")
        .is_some_and(|value| value.as_bytes() == b"pause")
    {
        return control(&shared, assertion.as_ref().map(|(_, claims)| &**claims), &body)
            .instrument(span)
            .await;
    }
    serve(shared, traceparent, assertion, body, wants_events)
        .instrument(span)
        .await
}

/// 401 `UNAUTHENTICATED` for a call the router did not vouch for (logged
/// without the assertion itself).
fn refuse(error: &AssertionError) -> Response {
    tracing::warn!(message = "Call refused: no valid router assertion.", reason = error.reason(), %error);
    let body = json!({
        "error": {
            "code": "UNAUTHENTICATED",
            "message": error.to_string(),
            "details": { "reason": error.reason() },
        }
    });
    (
        StatusCode::UNAUTHORIZED,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn serve(
    shared: Arc<Shared>,
    traceparent: Option<String>,
    assertion: Option<(String, Arc<AssertionClaims>)>,
    body: Bytes,
    wants_events: bool,
) -> Response {
    let envelope: ForwardedEnvelope = match serde_json::from_slice(&body) {
        Ok(envelope) => envelope,
        Err(error) => {
            return respond(error_answer(
                400,
                "INVALID_ENVELOPE",
                format!("cannot decode the envelope: {error}"),
            ))
        }
    };
    if let Some((_, claims)) = &assertion {
        if let Err(error) = crate::verify::matches_envelope(claims, envelope.source.as_deref(), &envelope.capability) {
            return refuse(&error);
        }
    }
    let span = tracing::Span::current();
    span.record("request_id", envelope.request_id.as_str());
    span.record("session_id", envelope.session_id.as_deref().unwrap_or(""));
    span.record("capability", envelope.capability.as_str());
    agent_reach_telemetry::propagation::rename(&span, format!("invoke_agent {}", envelope.capability));
    span.record("gen_ai.agent.name", envelope.capability.as_str());
    if let Some(session_id) = &envelope.session_id {
        span.record("gen_ai.conversation.id", session_id.as_str());
    }
    span.record("capability.version", envelope.capability_version.as_str());
    span.record("attempt", envelope.attempt);
    if !shared.accepts_traffic() {
        return respond(match shared.phase() {
            Status::Draining => error_answer(503, "DRAINING", "the agent is shutting down"),
            _ => error_answer(503, "NOT_READY", "the agent is still initialising"),
        });
    }
    if now_ms() >= envelope.deadline {
        return respond(error_answer(
            504,
            "DEADLINE_EXCEEDED",
            "the request's deadline passed before it arrived",
        ));
    }
    let Some(handler) = shared.handler(&envelope.capability, &envelope.capability_version) else {
        return respond(error_answer(
            404,
            "CAPABILITY_NOT_FOUND",
            format!(
                "this agent does not serve `{}` {}",
                envelope.capability, envelope.capability_version
            ),
        ));
    };
    if let (Some(stream), true) = (&handler.stream, wants_events) {
        // Not deduplicated: a stream cannot be replayed, and the router never
        // retries one it began relaying.
        if shared.inflight.load(Ordering::Acquire) >= shared.config.max_concurrency {
            return respond(error_answer(503, "OVERLOADED", "the agent is at its concurrency limit"));
        }
        let guard = InflightGuard::start(shared.clone());
        let ctx = Ctx::new(
            envelope.request_id.clone(),
            envelope.session_id.clone(),
            envelope.context_id.clone(),
            envelope.source.clone(),
            envelope.priority,
            envelope.deadline,
            envelope.attempt,
            traceparent,
            shared.links.clone(),
        )
        .with_delegation(assertion, envelope.budget);
        return crate::stream::serve(stream.clone(), ctx, envelope.payload, envelope.deadline, guard, span).await;
    }
    let request_id = envelope.request_id.clone();
    let slot = shared.dedup.slot(&envelope.request_id);
    if let Some(answer) = slot.get() {
        return respond(answer.clone());
    }
    // "Not now" answers are not cached: a later delivery may find room.
    if shared.inflight.load(Ordering::Acquire) >= shared.config.max_concurrency {
        return respond(error_answer(503, "OVERLOADED", "the agent is at its concurrency limit"));
    }
    // Worked out on a task of its own: a router that dies (or a caller that
    // leaves) mid-call does not abandon the answer, which the request-id
    // memory then gives the redelivery instead of running the handler again.
    let working = {
        let (slot, shared, handler, span) = (slot.clone(), shared.clone(), handler.clone(), span.clone());
        tokio::spawn(async move {
            slot.get_or_init(|| answer_of(shared, handler, envelope, traceparent, assertion, span))
                .await
                .clone()
        })
    };
    let answer = working
        .await
        .unwrap_or_else(|_| error_answer(500, "HANDLER_PANICKED", "the delivery's answer could not be worked out"));
    if crate::answer::is_paused(&answer) {
        // The resumed delivery (same request id) must run the handler again.
        shared.dedup.forget(&request_id);
    }
    span.record("http.response.status_code", answer.status);
    respond(answer)
}

/// Takes a finished delivery off the list pause requests look in.
struct Unlist {
    shared: Arc<Shared>,
    request_id: Option<String>,
}

impl Drop for Unlist {
    fn drop(&mut self) {
        if let Some(request_id) = &self.request_id {
            self.shared
                .pauses
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(request_id);
        }
    }
}

/// The router's pause request for a running delivery (DESIGN §9): `POST` to
/// this endpoint with `x-agent-reach-control: pause` and `{request_id,
/// capability}`, under the router's assertion for that capability. `202`
/// when the delivery runs here (its handler sees [`Ctx::pause_requested`]),
/// `404` otherwise.
async fn control(shared: &Shared, assertion: Option<&AssertionClaims>, body: &[u8]) -> Response {
    #[derive(serde::Deserialize)]
    struct Pause {
        request_id: String,
        capability: String,
    }
    let Ok(pause) = serde_json::from_slice::<Pause>(body) else {
        return respond(error_answer(
            400,
            "INVALID_ENVELOPE",
            "a pause request is {request_id, capability}",
        ));
    };
    if assertion.is_some_and(|claims| claims.cap != pause.capability) {
        return respond(error_answer(
            401,
            "UNAUTHENTICATED",
            "the assertion is for another capability",
        ));
    }
    let flag = shared
        .pauses
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&pause.request_id)
        .cloned();
    match flag {
        Some(flag) => {
            flag.store(true, Ordering::Release);
            tracing::info!(message = "Pause requested.", request_id = %pause.request_id);
            respond(Answer {
                status: 202,
                body: serde_json::to_vec(&json!({ "pause": "requested" })).unwrap_or_default(),
            })
        }
        None => respond(error_answer(
            404,
            "NOT_FOUND",
            "no preemptible delivery of that request id runs here",
        )),
    }
}

/// What a delivery answers: the handler run (on a task of its own, so a
/// panic is an answer) within the deadline, its output or error.
async fn answer_of(
    shared: Arc<Shared>,
    handler: crate::Handler,
    envelope: ForwardedEnvelope,
    traceparent: Option<String>,
    assertion: Option<(String, Arc<AssertionClaims>)>,
    span: tracing::Span,
) -> Answer {
    let _guard = InflightGuard::start(shared.clone());
    // A preemptible handler's task delivery may be asked to pause (DESIGN §9).
    let pause = (handler.descriptor.preemptible && envelope.task_id.is_some()).then(|| {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        shared
            .pauses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(envelope.request_id.clone(), flag.clone());
        flag
    });
    let _unlisted = Unlist {
        shared: shared.clone(),
        request_id: pause.as_ref().map(|_| envelope.request_id.clone()),
    };
    let ctx = Ctx::new(
        envelope.request_id.clone(),
        envelope.session_id.clone(),
        envelope.context_id.clone(),
        envelope.source.clone(),
        envelope.priority,
        envelope.deadline,
        envelope.attempt,
        traceparent,
        shared.links.clone(),
    )
    .for_task(envelope.task_id.clone(), envelope.history.clone())
    .resumable(pause, envelope.checkpoint.clone())
    .with_delegation(assertion, envelope.budget);
    let reported = ctx.clone();
    let remaining = Duration::from_millis(envelope.deadline.saturating_sub(now_ms()));
    // A spawned task isolates panics: the agent keeps serving.
    let running = tokio::spawn((handler.invoke)(ctx, envelope.payload.clone()).instrument(span.clone()));
    match tokio::time::timeout(remaining, running).await {
        Ok(Ok(Ok(output))) => Answer {
            status: 200,
            body: serde_json::to_vec(&match reported.usage() {
                Some(usage) => {
                    record_usage(&span, &usage);
                    json!({ "output": output, "usage": usage })
                }
                None => json!({ "output": output }),
            })
            .unwrap_or_default(),
        },
        Ok(Ok(Err(error))) => handler_error(&error),
        Ok(Err(join_error)) => {
            let why = join_error
                .try_into_panic()
                .ok()
                .and_then(|payload| {
                    payload
                        .downcast_ref::<&str>()
                        .map(|text| text.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                })
                .unwrap_or_else(|| "unknown panic".to_string());
            tracing::error!(message = "Handler panicked; the agent keeps serving.", panic = %why);
            error_answer(500, "HANDLER_PANICKED", format!("the handler panicked: {why}"))
        }
        Err(_) => error_answer(
            504,
            "DEADLINE_EXCEEDED",
            "the handler did not finish before the deadline",
        ),
    }
}

/// The handler's reported usage on its `invoke_agent` span (GenAI conventions' names).
fn record_usage(span: &tracing::Span, usage: &agent_reach_proto::envelope::Usage) {
    if let Some(input) = usage.input_tokens {
        span.record("gen_ai.usage.input_tokens", input);
    }
    if let Some(output) = usage.output_tokens {
        span.record("gen_ai.usage.output_tokens", output);
    }
    if let Some(model) = &usage.model {
        span.record("gen_ai.request.model", model.as_str());
    }
}

/// 200 only when the agent is ready, heartbeats are fresh and it has room.
async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let inflight = shared.inflight.load(Ordering::Acquire);
    let heartbeat_age = shared.last_heartbeat_age();
    let status = shared.status();
    let fresh = heartbeat_age.is_some_and(|age| age < Duration::from_secs(u64::from(shared.config.ttl_s)));
    let saturated = inflight >= shared.config.max_concurrency;
    let healthy = matches!(status, Status::Ready | Status::Busy) && fresh && !saturated;
    let body = json!({
        "status": status.as_str(),
        "inflight": inflight,
        "max_concurrency": shared.config.max_concurrency,
        "last_heartbeat_ms_ago": heartbeat_age.map(|age| age.as_millis() as u64),
        "healthy": healthy,
    });
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}
