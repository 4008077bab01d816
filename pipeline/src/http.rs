//! The fast path's HTTP/JSON face: `POST /v1/invoke`, the synchronous
//! `/v1/broadcast`, `GET /v1/openapi.json`, `/healthz`, `/readyz`, `/metrics`,
//! and the answers for unknown routes and methods. Every failure is a failed
//! result envelope with a stable code ([`crate::answer`]).

use std::sync::Arc;

use agent_reach_proto::envelope::{ResultStatus, ENVELOPE_VERSION};
use agent_reach_serving::front::Answer;
use agent_reach_serving::{HeaderLookup, RequestBody};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::answer::{failed, failed_answer, json_response, method_not_allowed, not_found};
use crate::call::identify::Identified;
use crate::call::{prelude, Door};
use crate::json::Succeeded;
use crate::service::RouterService;

/// The pipeline's own routes (`POST /v1/invoke`, the keys, health, readiness,
/// metrics); the router adds every other door's, `/v1/broadcast` and the
/// OpenAPI description.
pub fn routes(service: Arc<RouterService>) -> Router {
    Router::new()
        .route("/v1/invoke", post(invoke).fallback(method_not_allowed))
        .route("/.well-known/jwks.json", get(jwks).fallback(method_not_allowed))
        .route("/healthz", get(healthz).fallback(method_not_allowed))
        .route("/readyz", get(readyz).fallback(method_not_allowed))
        .route("/metrics", get(metrics).fallback(method_not_allowed))
        .fallback(not_found)
        .with_state(service)
}

async fn invoke(
    State(service): State<Arc<RouterService>>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer_invoke(&service, identified, &headers, RequestBody::Unread(body))
        .await
        .into_response()
}

/// `POST /v1/invoke`, for the axum route and the front door alike.
pub async fn answer_invoke(
    service: &RouterService,
    identified: Identified,
    headers: &impl HeaderLookup,
    body: RequestBody,
) -> Answer {
    // A caller asking for events gets the streamed invoke (DESIGN §8), written
    // as it comes (the front door streams a body of unknown length).
    if agent_reach_serving::sse::accepts_events(headers.value("accept")) {
        // Boxed: the JSON path's future stays as small as it was.
        return Box::pin(crate::stream::answer(service, identified, headers, body)).await;
    }
    let call = match prelude::envelope(service, identified, headers, body, Door::Invoke).await {
        Ok(envelope) => envelope.call,
        Err(refusal) => return refusal.answer(),
    };
    match service.invoke(&call).await {
        // A workflow's run still going at the deadline: accepted, its result later (DESIGN §9).
        Ok(success) if success.run.is_some() && success.accepted.is_some() => Answer::Json {
            status: StatusCode::ACCEPTED,
            body: success
                .output
                .as_deref()
                .map_or_else(|| b"null".to_vec(), |output| output.get().as_bytes().to_vec()),
        },
        Ok(success) => {
            let envelope = Succeeded {
                version: ENVELOPE_VERSION,
                request_id: call.request_id(),
                capability: Some(&call.checked.request.capability),
                capability_version: &success.capability_version,
                agent_id: &success.agent_id,
                attempts: success.attempts,
                duration_ms: call.received.instant.elapsed().as_millis() as u64,
                output: success.output.as_deref(),
                budget: success.budget,
            };
            Answer::Json {
                status: StatusCode::OK,
                body: envelope.to_vec(),
            }
        }
        Err(failure) => failed_answer(call.known(), failure),
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
pub async fn broadcast(service: &RouterService, identified: Identified, headers: &HeaderMap, body: Body) -> Response {
    let call = match prelude::envelope(service, identified, headers, RequestBody::Unread(body), Door::Broadcast).await {
        Ok(envelope) => envelope.call,
        Err(refusal) => return refusal.answer().into_response(),
    };
    match service.broadcast(&call, None).await {
        Err(failure) => failed(call.known(), failure),
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
                request_id: call.request_id(),
                capability: Some(&call.checked.request.capability),
                duration_ms: call.received.instant.elapsed().as_millis() as u64,
                outcomes,
            };
            json_response(StatusCode::OK, &body)
        }
    }
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
pub fn readiness(service: &RouterService) -> Result<String, String> {
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
pub fn refresh_gauges(service: &RouterService) {
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
