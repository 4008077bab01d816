//! The HTTP/JSON API (issue 4, DESIGN §4) and the operational endpoints.
//!
//! Bodies are read with an explicit size limit and parsed here, so every
//! failure (too large, malformed, wrong type, unknown field) gets its own
//! stable code and the path of the field at fault.

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_reach_proto::context_http as wire;
use agent_reach_serving::RequestBody;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{Code, ContextError};

/// `405 METHOD_NOT_ALLOWED` with the context service's error body.
pub(crate) async fn method_not_allowed(method: http::Method, uri: http::Uri) -> axum::response::Response {
    agent_reach_errors::method_not_allowed::<Code>(method, uri).await
}
use crate::model::Snapshot;
use crate::service::{ContextService, CreateInput, PatchInput};

pub fn routes(service: Arc<ContextService>) -> Router {
    Router::new()
        .route("/v1/contexts", post(create).fallback(method_not_allowed))
        .route(
            "/v1/contexts/{context_id}",
            get(read).patch(patch).delete(close).fallback(method_not_allowed),
        )
        .route("/healthz", get(healthz).fallback(method_not_allowed))
        .route("/readyz", get(readyz).fallback(method_not_allowed))
        .route("/metrics", get(metrics).fallback(method_not_allowed))
        .fallback(not_found)
        .with_state(service)
}

// === Body parsing ===

/// Reads at most `limit` bytes and parses JSON; each failure gets its own code
/// and the field at fault (see `agent_reach_serving`).
pub async fn parse_body<T: DeserializeOwned>(headers: &HeaderMap, body: Body, limit: usize) -> Result<T, ContextError> {
    Ok(agent_reach_serving::parse_body(headers, body, limit).await?)
}

// === Conversions (edge) ===

/// Stored JSON text back to JSON values. The store only ever holds text the
/// service serialized, so a failure here means someone wrote the hash by hand.
fn fields_to_wire(fields: crate::model::Fields) -> Result<BTreeMap<String, serde_json::Value>, ContextError> {
    fields
        .into_iter()
        .map(|(name, text)| {
            serde_json::from_str(&text)
                .map(|value| (name.clone(), value))
                .map_err(|error| {
                    ContextError::new(Code::Internal, format!("stored field `{name}` is not JSON: {error}"))
                })
        })
        .collect()
}

fn view(context_id: String, snapshot: Snapshot) -> Result<wire::ContextView, ContextError> {
    Ok(wire::ContextView {
        context_id,
        version: snapshot.version,
        tier: snapshot.tier.as_str().to_string(),
        expires_at: snapshot.expires_at_ms,
        fields: fields_to_wire(snapshot.fields)?,
    })
}

// === Handlers ===

async fn create(State(service): State<Arc<ContextService>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
        let request: wire::CreateContextRequest = parse_body(&headers, body, service.config().max_body_bytes).await?;
        let input = CreateInput {
            context_id: request.context_id,
            tier: request.tier,
            fields: request.fields,
        };
        service.create(&caller, input).await
    }
    .await;
    match result {
        Ok(created) => (
            StatusCode::CREATED,
            Json(wire::CreateContextResponse {
                context_id: created.context_id,
                version: created.written.version,
                tier: created.tier.as_str().to_string(),
                expires_at: created.written.expires_at_ms,
            }),
        )
            .into_response(),
        Err(error) => error.into_response(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadQuery {
    /// Comma-separated field names.
    fields: Option<String>,
}

pub(crate) async fn read(
    State(service): State<Arc<ContextService>>,
    Path(context_id): Path<String>,
    query: Result<Query<ReadQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<wire::ContextView>, ContextError> {
    let Query(query) = query.map_err(|rejection| {
        ContextError::new(Code::InvalidQuery, format!("invalid query: {}", rejection.body_text()))
    })?;
    Ok(Json(read_view(&service, context_id, query, &headers).await?))
}

/// `GET /v1/contexts/{id}` after the query is parsed, for the axum route and the front door.
pub(crate) async fn read_view(
    service: &ContextService,
    context_id: String,
    query: ReadQuery,
    headers: &HeaderMap,
) -> Result<wire::ContextView, ContextError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let fields = query.fields.map(|text| {
        text.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_string)
            .collect()
    });
    let snapshot = service.get(&caller, &context_id, fields).await?;
    view(context_id, snapshot)
}

pub(crate) async fn patch(
    State(service): State<Arc<ContextService>>,
    Path(context_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::PatchContextResponse>, ContextError> {
    Ok(Json(
        patch_written(&service, context_id, &headers, RequestBody::Unread(body)).await?,
    ))
}

/// `PATCH /v1/contexts/{id}`, for the axum route and the front door.
pub(crate) async fn patch_written(
    service: &ContextService,
    context_id: String,
    headers: &HeaderMap,
    body: RequestBody,
) -> Result<wire::PatchContextResponse, ContextError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let request: wire::PatchContextRequest = body.parse_json(headers, service.config().max_body_bytes).await?;
    let input = PatchInput {
        set: request.set,
        delete: request.delete,
        if_version: request.if_version,
    };
    let written = service.patch(&caller, &context_id, input).await?;
    Ok(wire::PatchContextResponse {
        context_id,
        version: written.version,
        expires_at: written.expires_at_ms,
    })
}

async fn close(
    State(service): State<Arc<ContextService>>,
    Path(context_id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ContextError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    service.close(&caller, &context_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when the store answers.
async fn readyz(State(service): State<Arc<ContextService>>) -> Response {
    match service.store().ping().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("context store unreachable: {error}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(service): State<Arc<ContextService>>) -> Response {
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        service.metrics().render(),
    )
        .into_response()
}

async fn not_found() -> ContextError {
    ContextError::new(Code::NotFound, "no such route; see DESIGN §4 for the context API")
}
