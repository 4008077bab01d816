//! The HTTP/JSON face: `POST /v1/invoke`, `GET /v1/openapi.json`, `/healthz`,
//! `/readyz`, `/metrics`. Every failure is a failed result envelope with a
//! stable code; no handler answers a bare string error.

use std::sync::Arc;
use std::time::Instant;

use agent_reach_proto::envelope::{ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_telemetry::spans::{self, Head, KeyValue};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use agent_reach_edge::front::Answer;
use agent_reach_edge::{HeaderLookup, RequestBody};

use crate::clock;
use crate::envelope::{self, CheckedRequest};
use crate::error::{Code, RouterError};
use crate::service::{Failure, RouterService};
use crate::trace::{self, TraceContext};

pub fn routes(service: Arc<RouterService>) -> Router {
    Router::new()
        .route("/v1/invoke", post(invoke).fallback(method_not_allowed))
        .route("/v1/broadcast", post(broadcast).fallback(method_not_allowed))
        .route("/v1/openapi.json", get(openapi))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::tasks::routes())
        .fallback(not_found)
        .with_state(service)
}

/// The succeeded result envelope (DESIGN §3), field for field as
/// [`ResultEnvelope`] serialises, with the agent's output written as it came
/// (`null` when it sent none).
struct Succeeded<'a> {
    version: &'a str,
    request_id: &'a str,
    capability: Option<&'a str>,
    capability_version: &'a str,
    agent_id: &'a str,
    attempts: u32,
    duration_ms: u64,
    output: Option<&'a serde_json::value::RawValue>,
}

impl Succeeded<'_> {
    fn to_vec(&self) -> Vec<u8> {
        let output = self.output.map(serde_json::value::RawValue::get);
        let mut out = Vec::with_capacity(192 + output.map_or(4, str::len));
        let mut object = crate::json::Object::start(&mut out);
        object.str("version", self.version);
        object.str("request_id", self.request_id);
        object.str("status", "succeeded");
        object.opt_str("capability", self.capability);
        object.str("capability_version", self.capability_version);
        object.str("agent_id", self.agent_id);
        object.u64("attempts", u64::from(self.attempts));
        object.u64("duration_ms", self.duration_ms);
        object.raw("output", output);
        object.end();
        out
    }
}

fn json_answer(status: StatusCode, envelope: &impl serde::Serialize) -> Answer {
    // Serialising plain strings and JSON values does not fail; answer something valid anyway.
    Answer::json(status, envelope).unwrap_or_else(|_| Answer::Json {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: br#"{"version":"1.0","request_id":"","status":"failed","attempts":0,"duration_ms":0,"error":{"code":"INTERNAL","message":"result could not be encoded","retryable":true}}"#.to_vec(),
    })
}

fn json_response(status: StatusCode, envelope: &impl serde::Serialize) -> Response {
    json_answer(status, envelope).into_response()
}

/// What is known about a request when its result envelope is written.
struct Known {
    request_id: String,
    capability: Option<String>,
    started: Instant,
}

fn failed(known: Known, failure: Failure) -> Response {
    failed_answer(known, failure).into_response()
}

fn failed_answer(known: Known, failure: Failure) -> Answer {
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
        error: Some(failure.error.to_envelope_error()),
    };
    json_answer(failure.error.status(), &envelope)
}

async fn invoke(State(service): State<Arc<RouterService>>, headers: HeaderMap, body: Body) -> Response {
    answer_invoke(&service, &headers, RequestBody::Unread(body))
        .await
        .into_response()
}

/// `POST /v1/invoke`, for the axum route and the front door alike.
pub(crate) async fn answer_invoke(service: &RouterService, headers: &impl HeaderLookup, body: RequestBody) -> Answer {
    // The request's one clock reading: its duration, its token's expiry check and its deadline count from here.
    let received = clock::Now::read();
    let started = received.instant;
    let trace = TraceContext::from_header(headers.value("traceparent"));
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
    let incoming = headers
        .value("traceparent")
        .and_then(|value| std::str::from_utf8(value).ok());
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
    let outcome = service.invoke(&caller, &checked, request_id, &trace, received).await;
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

/// `POST /v1/broadcast`: the invoke envelope delivered to every routable
/// instance at once; 200 with one outcome per instance, or the failed result
/// envelope when the request itself is refused.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BroadcastQuery {
    /// `true`: answer at once with a parent task and a child task per instance.
    #[serde(rename = "async")]
    asynchronous: Option<bool>,
}

async fn broadcast(
    State(service): State<Arc<RouterService>>,
    query: Result<axum::extract::Query<BroadcastQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    match query {
        Ok(axum::extract::Query(BroadcastQuery {
            asynchronous: Some(true),
        })) => {
            return crate::tasks::submit_broadcast(&service, &headers, body).await;
        }
        Ok(_) => {}
        Err(rejection) => {
            let known = Known {
                request_id: trace::new_request_id(),
                capability: None,
                started,
            };
            let error = RouterError::new(
                Code::InvalidEnvelope,
                format!("invalid query: {}", rejection.body_text()),
            );
            return failed(known, error.into());
        }
    }
    let trace = TraceContext::from_header(headers.value("traceparent"));
    let mut known = Known {
        request_id: trace::new_request_id(),
        capability: None,
        started,
    };
    let caller = match service.authenticate(&headers) {
        Ok(caller) => caller,
        Err(error) => return failed(known, error.into()),
    };
    let checked = match envelope::read_body(&headers, body, service.tuning().max_body_bytes).await {
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
    match service.broadcast(&caller, checked, &request_id, &trace, None).await {
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
                        error: Some(failure.error.to_envelope_error()),
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

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready once a first snapshot arrived and while it is not older than the staleness bound.
async fn readyz(State(service): State<Arc<RouterService>>) -> Response {
    let snapshot = service.snapshot();
    let staleness = snapshot.staleness();
    if !snapshot.is_synced() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no routing snapshot yet from the registry\n",
        )
            .into_response();
    }
    if staleness > service.tuning().max_staleness {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "registry unreachable for {} s; routing from a stale snapshot\n",
                staleness.as_secs()
            ),
        )
            .into_response();
    }
    let text = if snapshot.is_connected() {
        "ready\n".to_string()
    } else {
        format!(
            "ready (registry unreachable for {} s; serving the last snapshot)\n",
            staleness.as_secs()
        )
    };
    (StatusCode::OK, text).into_response()
}

async fn metrics(State(service): State<Arc<RouterService>>) -> Response {
    let staleness = service.snapshot().staleness();
    service
        .metrics()
        .snapshot_staleness_seconds
        .set(staleness.as_secs() as i64);
    crate::health::publish_instance_gauges(&service.snapshot().load(), staleness, service.tuning().max_staleness);
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        service.metrics().render(),
    )
        .into_response()
}

async fn not_found() -> Response {
    refused(RouterError::new(
        Code::NotFound,
        "no such route; see GET /v1/openapi.json",
    ))
}

async fn method_not_allowed() -> Response {
    refused(RouterError::new(
        Code::MethodNotAllowed,
        "use POST for /v1/invoke; see GET /v1/openapi.json",
    ))
}

/// A failed envelope for a request that never reached the pipeline.
fn refused(error: RouterError) -> Response {
    failed(
        Known {
            request_id: trace::new_request_id(),
            capability: None,
            started: Instant::now(),
        },
        error.into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_succeeded_envelope_is_written_as_result_envelope_writes_it_with_the_output_verbatim() {
        let output =
            serde_json::value::RawValue::from_string(r#"{"big":12345678901234567890123,"x":1.50}"#.into()).unwrap();
        let written = String::from_utf8(
            Succeeded {
                version: ENVELOPE_VERSION,
                request_id: "r-1",
                capability: Some("order.query"),
                capability_version: "1.2.0",
                agent_id: "order_query-1",
                attempts: 2,
                duration_ms: 7,
                output: Some(&output),
            }
            .to_vec(),
        )
        .unwrap();
        // Digits a JSON value would round away stay as the agent sent them.
        assert!(
            written.contains(r#""output":{"big":12345678901234567890123,"x":1.50}"#),
            "{written}"
        );
        let parsed: ResultEnvelope = serde_json::from_str(&written).unwrap();
        let expected = ResultEnvelope {
            version: ENVELOPE_VERSION.to_string(),
            request_id: "r-1".into(),
            status: ResultStatus::Succeeded,
            capability: Some("order.query".into()),
            capability_version: Some("1.2.0".into()),
            agent_id: Some("order_query-1".into()),
            attempts: 2,
            duration_ms: 7,
            output: parsed.output.clone(),
            error: None,
        };
        assert_eq!(parsed, expected);
        let reference = serde_json::to_value(&expected).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!(ours, reference, "same fields, same names");

        // No output is `null`; strings are escaped; no capability, no field; byte for byte as serde writes.
        let written = Succeeded {
            version: ENVELOPE_VERSION,
            request_id: "r\"\\1",
            capability: None,
            capability_version: "1.0.0",
            agent_id: "a\u{1}",
            attempts: 1,
            duration_ms: 0,
            output: None,
        }
        .to_vec();
        let reference = ResultEnvelope {
            version: ENVELOPE_VERSION.to_string(),
            request_id: "r\"\\1".into(),
            status: ResultStatus::Succeeded,
            capability: None,
            capability_version: Some("1.0.0".into()),
            agent_id: Some("a\u{1}".into()),
            attempts: 1,
            duration_ms: 0,
            output: Some(serde_json::Value::Null),
            error: None,
        };
        assert_eq!(
            String::from_utf8(written).unwrap(),
            serde_json::to_string(&reference).unwrap()
        );
    }
}
