//! The fast path's HTTP/JSON face: `POST /v1/invoke`, the synchronous
//! `/v1/broadcast`, `GET /v1/openapi.json`, `/healthz`, `/readyz`, `/metrics`,
//! and the answers for unknown routes and methods. Every failure is a failed
//! result envelope with a stable code ([`crate::answer`]).

use std::sync::Arc;
use std::time::Instant;

use agent_reach_proto::envelope::{ResultStatus, ENVELOPE_VERSION};
use agent_reach_telemetry::spans::{self, Head, KeyValue};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use agent_reach_serving::front::Answer;
use agent_reach_serving::{HeaderLookup, RequestBody};

use crate::admission::Entry;
use crate::answer::{failed, failed_answer, json_response, method_not_allowed, not_found, Known};
use crate::clock;
use crate::envelope::{self, CheckedRequest};
use crate::json::Succeeded;
use crate::service::RouterService;
use crate::trace::{self, TraceContext};

/// The fast path's routes; the slow path's and `/v1/broadcast` are added by `app`.
pub fn routes(service: Arc<RouterService>) -> Router {
    Router::new()
        .route("/v1/invoke", post(invoke).fallback(method_not_allowed))
        .route("/v1/openapi.json", get(openapi).fallback(method_not_allowed))
        .route("/.well-known/jwks.json", get(jwks).fallback(method_not_allowed))
        .route("/healthz", get(healthz).fallback(method_not_allowed))
        .route("/readyz", get(readyz).fallback(method_not_allowed))
        .route("/metrics", get(metrics).fallback(method_not_allowed))
        .fallback(not_found)
        .with_state(service)
}

async fn invoke(State(service): State<Arc<RouterService>>, headers: HeaderMap, body: Body) -> Response {
    answer_invoke(&service, &headers, RequestBody::Unread(body))
        .await
        .into_response()
}

/// `POST /v1/invoke`, for the axum route and the front door alike.
pub(crate) async fn answer_invoke(service: &RouterService, headers: &impl HeaderLookup, body: RequestBody) -> Answer {
    // A caller asking for events gets the streamed invoke (DESIGN §8), written
    // as it comes (the front door streams a body of unknown length).
    if crate::sse::accepts_events(headers.value("accept")) {
        // Boxed: the JSON path's future stays as small as it was.
        return Box::pin(crate::stream::answer(service, headers, body)).await;
    }
    // The request's one clock reading: its duration, its token's expiry check and its deadline count from here.
    let received = clock::Now::read();
    let started = received.instant;
    let mut trace = TraceContext::from_header(headers.value("traceparent"));
    let mut known = Known {
        request_id: String::new(),
        capability: None,
        started,
    };
    // Authenticate first: an unauthenticated caller learns nothing, not even parse errors.
    let caller = match service.authenticate_at(headers, received.epoch_ms) {
        Ok(caller) => caller,
        Err(error) => {
            known.request_id = trace::new_request_id();
            // The body is not read for unauthenticated callers: the ids are the trace's and a fresh one.
            tracing::info!(
                message = "Unauthenticated call refused.",
                trace_id = %trace.trace_id, request_id = %known.request_id, session_id = "", %error
            );
            return failed_answer(known, error.into());
        }
    };
    let read = match body {
        RequestBody::Unread(body) => envelope::read_body(headers, body, service.tuning().max_body_bytes).await,
        RequestBody::Read(bytes) => Ok(bytes),
    };
    let request = match read.and_then(|bytes| envelope::parse(&bytes)) {
        Ok(request) => request,
        Err(error) => {
            known.request_id = trace::new_request_id();
            service.metrics().record_rejected(error.code);
            return failed_answer(known, error.into());
        }
    };
    let (version_req, policy) = match envelope::check_fields(&request) {
        Ok(checks) => checks,
        Err(error) => {
            // Keep the caller's request id (when usable) and capability in the answer.
            known.request_id = request
                .request_id
                .filter(|id| !id.is_empty() && id.len() <= 128)
                .unwrap_or_else(trace::new_request_id);
            known.capability = Some(request.capability);
            service.metrics().record_rejected(error.code);
            return failed_answer(known, error.into());
        }
    };
    let checked = CheckedRequest {
        request,
        version_req,
        policy,
        task_id: None,
    };
    // The caller's id (checked: 1-128 printable characters) or a fresh one, inline.
    let fresh_id;
    let request_id: &str = match checked.request.request_id.as_deref() {
        Some(id) => id,
        None => {
            fresh_id = trace::HexId::<16>::random();
            &fresh_id
        }
    };
    let session_id = checked.request.session_id.as_deref().unwrap_or("");
    // Every request-scoped log line carries trace_id, request_id and session_id as
    // fields of its own (DESIGN §6): logs need no span. A span exists only for a
    // request the configured sampler keeps, decided before any span is built, so
    // with tracing off, or for a request left out of the sample, the request path
    // builds no span at all.
    let mut incoming = headers
        .value("traceparent")
        .and_then(|value| std::str::from_utf8(value).ok());
    // The seeds' `trace_id`, honoured when no `traceparent` came.
    let named;
    if let (None, Some(trace_id)) = (incoming, checked.request.trace_id.as_deref()) {
        trace = TraceContext::from_caller_trace_id(trace_id);
        named = trace.as_incoming();
        incoming = Some(&named);
    }
    let head = spans::start_request("invoke", incoming, &trace.trace_id, || {
        vec![
            KeyValue::new("trace_id", trace.trace_id.to_string()),
            KeyValue::new("request_id", request_id.to_string()),
            KeyValue::new("session_id", session_id.to_string()),
            KeyValue::new("capability", checked.request.capability.clone()),
            KeyValue::new("caller", caller.name().unwrap_or("").to_string()),
            KeyValue::new("policy", checked.policy.as_str()),
        ]
    });
    let trace = match head {
        Head::Sampled(span) => TraceContext {
            span: Some(span),
            ..trace
        },
        // Spans are exported but this request is not in the sample: the next hop learns so.
        Head::NotSampled => TraceContext {
            sampled: false,
            ..trace
        },
        Head::Off => trace,
    };
    let outcome = service
        .invoke(&caller, Entry::Call, &checked, request_id, &trace, received)
        .await;
    if let (Err(failure), Some(span)) = (&outcome, &trace.span) {
        span.fail(failure.error.code.as_str());
    }
    match outcome {
        Ok(success) => {
            let envelope = Succeeded {
                version: ENVELOPE_VERSION,
                request_id,
                capability: Some(&checked.request.capability),
                capability_version: &success.capability_version,
                agent_id: &success.agent_id,
                attempts: success.attempts,
                duration_ms: started.elapsed().as_millis() as u64,
                output: success.output.as_deref(),
            };
            Answer::Json {
                status: StatusCode::OK,
                body: envelope.to_vec(),
            }
        }
        Err(failure) => {
            known.request_id = request_id.to_string();
            known.capability = Some(checked.request.capability.clone());
            tracing::info!(
                message = "Invocation failed.",
                trace_id = %trace.trace_id, request_id = %known.request_id, session_id = %session_id,
                capability = known.capability.as_deref().unwrap_or(""),
                code = failure.error.code.as_str(), error = %failure.error.message,
                attempts = failure.attempts
            );
            failed_answer(known, failure)
        }
    }
}

/// One instance's answer to a broadcast; outputs are written as the agents sent them.
#[derive(serde::Serialize)]
struct InstanceOutcome {
    agent_id: String,
    status: ResultStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<Option<Box<serde_json::value::RawValue>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<agent_reach_proto::envelope::EnvelopeError>,
}

#[derive(serde::Serialize)]
struct BroadcastAnswer<'a> {
    version: &'a str,
    request_id: &'a str,
    capability: Option<&'a str>,
    duration_ms: u64,
    outcomes: Vec<InstanceOutcome>,
}

/// `POST /v1/broadcast` (synchronous): the invoke envelope delivered to every
/// routable instance at once; 200 with one outcome per instance, or the
/// failed result envelope when the request itself is refused.
pub async fn broadcast(service: &RouterService, headers: &HeaderMap, body: Body, started: Instant) -> Response {
    let trace = TraceContext::from_header(headers.value("traceparent"));
    let mut known = Known::fresh(started);
    let caller = match service.authenticate(headers) {
        Ok(caller) => caller,
        Err(error) => return failed(known, error.into()),
    };
    let checked = match envelope::read_body(headers, body, service.tuning().max_body_bytes).await {
        Ok(bytes) => envelope::parse(&bytes).and_then(|request| {
            if let Some(id) = request
                .request_id
                .clone()
                .filter(|id| !id.is_empty() && id.len() <= 128)
            {
                known.request_id = id;
            }
            known.capability = Some(request.capability.clone());
            envelope::check(request)
        }),
        Err(error) => Err(error),
    };
    let checked = match checked {
        Ok(checked) => checked,
        Err(error) => return failed(known, error.into()),
    };
    let request_id = known.request_id.clone();
    // The seeds' `trace_id`, honoured when no `traceparent` came.
    let trace = match (headers.value("traceparent"), checked.request.trace_id.as_deref()) {
        (None, Some(trace_id)) => TraceContext::from_caller_trace_id(trace_id),
        _ => trace,
    };
    match service
        .broadcast(&caller, Entry::Call, checked, &request_id, &trace, None)
        .await
    {
        Err(failure) => failed(known, failure),
        Ok(outcomes) => {
            let outcomes: Vec<InstanceOutcome> = outcomes
                .into_iter()
                .map(|(agent_id, outcome)| match outcome {
                    Ok(success) => InstanceOutcome {
                        agent_id,
                        status: ResultStatus::Succeeded,
                        output: Some(success.output),
                        error: None,
                    },
                    Err(failure) => InstanceOutcome {
                        agent_id,
                        status: ResultStatus::Failed,
                        output: None,
                        error: Some(failure.error.envelope_error()),
                    },
                })
                .collect();
            let body = BroadcastAnswer {
                version: ENVELOPE_VERSION,
                request_id: &request_id,
                capability: known.capability.as_deref(),
                duration_ms: started.elapsed().as_millis() as u64,
                outcomes,
            };
            json_response(StatusCode::OK, &body)
        }
    }
}

async fn openapi() -> Response {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        crate::openapi::document().to_string(),
    )
        .into_response()
}

/// The public keys that verify the router's assertions (RFC 7517), signing key first.
async fn jwks(State(service): State<Arc<RouterService>>) -> Response {
    (
        [
            (http::header::CONTENT_TYPE, "application/jwk-set+json"),
            // Agents refresh on an unknown key id anyway; a minute keeps rotations quick.
            (http::header::CACHE_CONTROL, "max-age=60"),
        ],
        service.assertions().jwks(),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready once a first snapshot arrived and while it is not older than the staleness bound.
async fn readyz(State(service): State<Arc<RouterService>>) -> Response {
    match readiness(&service) {
        Ok(text) => (StatusCode::OK, format!("ready ({text})\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// What `/readyz` says of `service`'s snapshot: `Ok` with the routing state, or why not ready.
pub(crate) fn readiness(service: &RouterService) -> Result<String, String> {
    let snapshot = service.snapshot();
    let staleness = snapshot.staleness();
    if !snapshot.is_synced() {
        return Err("no routing snapshot yet from the registry".to_string());
    }
    if staleness > service.tuning().max_staleness {
        return Err(format!(
            "registry unreachable for {} s; routing from a stale snapshot",
            staleness.as_secs()
        ));
    }
    let current = snapshot.load();
    let routing = format!(
        "snapshot revision {}, {} instance(s)",
        current.revision, current.instance_count
    );
    Ok(if snapshot.is_connected() {
        routing
    } else {
        format!(
            "{routing}; registry unreachable for {} s, serving the last snapshot",
            staleness.as_secs()
        )
    })
}

async fn metrics(State(service): State<Arc<RouterService>>) -> Response {
    refresh_gauges(&service);
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        service.metrics().render(),
    )
        .into_response()
}

/// Sets the gauges read at scrape time (snapshot staleness, instances).
pub(crate) fn refresh_gauges(service: &RouterService) {
    let staleness = service.snapshot().staleness();
    service
        .metrics()
        .snapshot_staleness_seconds
        .set(staleness.as_secs() as i64);
    service
        .snapshot()
        .load()
        .publish_instance_gauges(staleness, service.tuning().max_staleness);
    service.publish_routable_instances();
}
