//! The HTTP/JSON API (DESIGN §2) and the operational endpoints.
//!
//! Bodies are read with an explicit size limit and parsed here, so every
//! failure (too large, malformed, wrong type, unknown field) gets its own
//! stable code and the path of the field at fault.

use std::sync::Arc;

use agent_reach_errors::ErrorCode as _;
use agent_reach_proto::http as wire;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{Code, RegistryError};

/// `405 METHOD_NOT_ALLOWED` with the registry's error body.
async fn method_not_allowed(method: http::Method, uri: http::Uri) -> axum::response::Response {
    agent_reach_errors::method_not_allowed::<Code>(method, uri).await
}
use crate::access::{Decision, GrantFilter};
use crate::model::{Capability, Instance};
use crate::operator;
use crate::service::{Heartbeat, RegistryService};
use crate::validate;

pub fn routes(service: Arc<RegistryService>) -> Router {
    Router::new()
        .route(
            "/v1/agents",
            get(list_agents).post(register).fallback(method_not_allowed),
        )
        .route(
            "/v1/agents/{agent_id}",
            get(get_agent).delete(deregister).fallback(method_not_allowed),
        )
        .route(
            "/v1/agents/{agent_id}/heartbeat",
            put(heartbeat).fallback(method_not_allowed),
        )
        .route(
            "/v1/agents/{agent_id}/weight",
            put(set_weight).fallback(method_not_allowed),
        )
        .route(
            "/v1/agents/{agent_id}/drain",
            axum::routing::post(drain).fallback(method_not_allowed),
        )
        // Not under `/v1/agents/`: `heartbeats` is a valid agent_id.
        .route("/v1/heartbeats", get(heartbeats).fallback(method_not_allowed))
        .route("/v1/capabilities", get(list_capabilities).fallback(method_not_allowed))
        .route(
            "/v1/capabilities/{name}",
            get(resolve_capability).fallback(method_not_allowed),
        )
        .route(
            "/v1/capabilities/{name}/split",
            get(get_split)
                .put(set_split)
                .delete(clear_split)
                .fallback(method_not_allowed),
        )
        .route(
            "/v1/access-requests",
            get(list_access_requests)
                .post(request_access)
                .fallback(method_not_allowed),
        )
        .route(
            "/v1/access-requests/{id}",
            get(get_access_request).fallback(method_not_allowed),
        )
        .route(
            "/v1/access-requests/{id}/approve",
            axum::routing::post(approve_access).fallback(method_not_allowed),
        )
        .route(
            "/v1/access-requests/{id}/deny",
            axum::routing::post(deny_access).fallback(method_not_allowed),
        )
        .route("/v1/grants", get(list_grants).fallback(method_not_allowed))
        .route(
            "/v1/grants/{id}",
            axum::routing::delete(revoke_grant).fallback(method_not_allowed),
        )
        .route(
            "/v1/capabilities/{name}/policy",
            get(get_policy)
                .put(set_policy)
                .delete(clear_policy)
                .fallback(method_not_allowed),
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
pub async fn parse_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, RegistryError> {
    Ok(agent_reach_serving::parse_body(headers, body, limit).await?)
}

// === Conversions (edge) ===

pub fn capability_to_wire(capability: &Capability) -> wire::CapabilitySpec {
    wire::CapabilitySpec {
        name: capability.name.clone(),
        version: capability.version.to_string(),
        description: Some(capability.description.clone()).filter(|text| !text.is_empty()),
        input_schema: capability.input_schema.clone(),
        output_schema: capability.output_schema.clone(),
        timeout_ms: capability.timeout_ms,
        check_output: (!capability.check_output).then_some(false),
    }
}

pub fn instance_to_wire(instance: &Instance) -> wire::AgentInstance {
    wire::AgentInstance {
        agent_id: instance.agent_id.clone(),
        name: instance.name.clone(),
        endpoint: instance.endpoint.clone(),
        protocol: instance.protocol.clone(),
        weight: instance.weight,
        tags: instance.tags.clone(),
        capabilities: instance.capabilities.iter().map(capability_to_wire).collect(),
        status: instance.status.as_str().to_string(),
        lease_id: instance.lease_id,
        ttl_s: instance.ttl_s,
        registered_at_ms: instance.registered_at_ms,
        inflight: instance.inflight,
        operator_weight: instance.operator_weight,
    }
}

// === Handlers ===

#[tracing::instrument(name = "http.register", skip_all)]
async fn register(State(service): State<Arc<RegistryService>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
        let request: wire::RegisterRequest = parse_body(&headers, body, service.config().max_body_bytes).await?;
        service.register(&caller, request).await
    }
    .await;
    match result {
        Ok(registered) => (
            StatusCode::CREATED,
            Json(wire::RegisterResponse {
                agent_id: registered.agent_id,
                lease_id: registered.lease_id,
                ttl_s: registered.ttl_s,
                heartbeat_interval_s: registered.heartbeat_interval_s,
            }),
        )
            .into_response(),
        Err(error) => {
            tracing::info!(message = "Registration refused.", error = %error);
            error.into_response()
        }
    }
}

#[tracing::instrument(name = "http.heartbeat", skip_all)]
async fn heartbeat(
    State(service): State<Arc<RegistryService>>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::HeartbeatResponse>, RegistryError> {
    let outcome = async {
        let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
        let request: wire::HeartbeatRequest = parse_body(&headers, body, service.config().max_body_bytes).await?;
        let status = request
            .status
            .as_deref()
            .map(|text| validate::status(text, "status"))
            .transpose()?;
        service
            .heartbeat(
                &caller,
                Heartbeat {
                    agent_id: &agent_id,
                    lease_id: request.lease_id,
                    status,
                    inflight: request.inflight,
                },
            )
            .await
    }
    .await;
    service
        .metrics()
        .heartbeats
        .with_label_values(&["http", heartbeat_outcome(&outcome)])
        .inc();
    let ack = outcome?;
    Ok(Json(wire::HeartbeatResponse {
        agent_id: ack.agent_id,
        lease_id: ack.lease_id,
        ttl_s: ack.ttl_s,
        status: ack.status.as_str().to_string(),
    }))
}

pub fn heartbeat_outcome<T>(outcome: &Result<T, RegistryError>) -> &'static str {
    match outcome {
        Ok(_) => "ok",
        Err(error) if error.code == Code::LeaseExpired => "lease_expired",
        Err(error) if error.code.http_status().is_client_error() => "rejected",
        Err(_) => "error",
    }
}

#[tracing::instrument(name = "http.deregister", skip_all)]
async fn deregister(
    State(service): State<Arc<RegistryService>>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    service.deregister(&caller, &agent_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[tracing::instrument(name = "http.list_agents", skip_all)]
async fn list_agents(
    State(service): State<Arc<RegistryService>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<wire::AgentList>, RegistryError> {
    service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let Query(query) = query.map_err(|rejection| {
        RegistryError::new(Code::UnknownField, format!("invalid query: {}", rejection.body_text()))
    })?;
    if query.limit == Some(0) {
        return Err(RegistryError::field(
            Code::InvalidFieldType,
            "limit",
            "limit must be at least 1",
        ));
    }
    // Without `limit`, every instance (one JSON answer has no message limit).
    let limit = query.limit.unwrap_or(usize::MAX);
    let (instances, more, revision) = service.catalog().page(query.cursor.as_deref(), limit);
    let next_cursor = more
        .then(|| instances.last().map(|last| last.agent_id.clone()))
        .flatten();
    Ok(Json(wire::AgentList {
        agents: instances.iter().map(|instance| instance_to_wire(instance)).collect(),
        revision,
        next_cursor,
    }))
}

/// `GET /v1/agents`' query: a page of `limit` after the `cursor` of the page before.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

#[tracing::instrument(name = "http.get_agent", skip_all)]
async fn get_agent(
    State(service): State<Arc<RegistryService>>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<wire::AgentInstance>, RegistryError> {
    service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let entry = service
        .catalog()
        .get(&agent_id)
        .ok_or_else(|| RegistryError::new(Code::AgentNotFound, format!("no instance `{agent_id}` is registered")))?;
    Ok(Json(instance_to_wire(&entry.instance)))
}

#[tracing::instrument(name = "http.list_capabilities", skip_all)]
async fn list_capabilities(
    State(service): State<Arc<RegistryService>>,
    headers: HeaderMap,
) -> Result<Json<wire::CapabilityList>, RegistryError> {
    service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let (capabilities, revision) = service.catalog().capabilities();
    Ok(Json(wire::CapabilityList {
        capabilities: capabilities
            .into_iter()
            .map(|summary| wire::CapabilitySummary {
                name: summary.name,
                versions: summary.versions.iter().map(ToString::to_string).collect(),
                instances: summary.instances,
                routable_instances: summary.routable_instances,
            })
            .collect(),
        revision,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveQuery {
    version: Option<String>,
}

#[tracing::instrument(name = "http.resolve_capability", skip_all)]
async fn resolve_capability(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    query: Result<Query<ResolveQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<wire::CapabilityResolution>, RegistryError> {
    service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let Query(query) = query.map_err(|rejection| {
        RegistryError::new(Code::UnknownField, format!("invalid query: {}", rejection.body_text()))
    })?;
    let resolution = service.resolve(&name, query.version.as_deref())?;
    Ok(Json(wire::CapabilityResolution {
        name,
        version: resolution.chosen.map(|version| version.to_string()).unwrap_or_default(),
        available_versions: resolution.available.iter().map(ToString::to_string).collect(),
        instances: resolution
            .instances
            .iter()
            .map(|(instance, capability)| wire::ResolvedInstance {
                agent_id: instance.agent_id.clone(),
                name: instance.name.clone(),
                endpoint: instance.endpoint.clone(),
                weight: instance.weight,
                status: instance.status.as_str().to_string(),
                tags: instance.tags.clone(),
                capability: capability_to_wire(capability),
            })
            .collect(),
    }))
}

// === Operator API (DESIGN §2.9) ===

#[tracing::instrument(name = "http.set_split", skip_all)]
async fn set_split(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::CapabilitySplit>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let request: wire::SplitRequest = parse_body(&headers, body, service.config().max_body_bytes).await?;
    let written = service.set_split(&caller, &name, request).await?;
    Ok(Json(operator::split_to_wire(&written.split, Some(written.revision))))
}

#[tracing::instrument(name = "http.get_split", skip_all)]
async fn get_split(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Json<wire::CapabilitySplit>, RegistryError> {
    service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let split = service.split(&name)?;
    Ok(Json(operator::split_to_wire(&split, None)))
}

#[tracing::instrument(name = "http.clear_split", skip_all)]
async fn clear_split(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    service.clear_split(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[tracing::instrument(name = "http.set_policy", skip_all)]
async fn set_policy(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::CapabilityPolicy>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let request: wire::PolicyRequest = parse_body(&headers, body, service.config().max_body_bytes).await?;
    let written = service.set_policy(&caller, &name, request).await?;
    Ok(Json(operator::policy_to_wire(&written.policy, Some(written.revision))))
}

#[tracing::instrument(name = "http.get_policy", skip_all)]
async fn get_policy(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Json<wire::CapabilityPolicy>, RegistryError> {
    service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let policy = service.policy(&name)?;
    Ok(Json(operator::policy_to_wire(&policy, None)))
}

#[tracing::instrument(name = "http.clear_policy", skip_all)]
async fn clear_policy(
    State(service): State<Arc<RegistryService>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    service.clear_policy(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[tracing::instrument(name = "http.set_weight", skip_all)]
async fn set_weight(
    State(service): State<Arc<RegistryService>>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::AgentInstance>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let request: wire::WeightRequest = parse_body(&headers, body, service.config().max_body_bytes).await?;
    let instance = service.set_weight(&caller, &agent_id, request.weight).await?;
    Ok(Json(instance_to_wire(&instance)))
}

/// `POST /v1/agents/{agent_id}/drain` (operators): the instance becomes `draining`.
async fn drain(
    State(service): State<Arc<RegistryService>>,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<wire::AgentInstance>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let instance = service.drain(&caller, &agent_id).await?;
    Ok(Json(instance_to_wire(&instance)))
}

/// `GET /v1/heartbeats` (operators): every live instance's last heartbeat age.
#[tracing::instrument(name = "http.heartbeats", skip_all)]
async fn heartbeats(
    State(service): State<Arc<RegistryService>>,
    headers: HeaderMap,
) -> Result<Json<wire::HeartbeatList>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let ages = service.heartbeats(&caller).await?;
    Ok(Json(wire::HeartbeatList {
        heartbeats: ages
            .into_iter()
            .map(|age| wire::InstanceHeartbeat {
                agent_id: age.agent_id,
                lease_id: age.lease_id,
                ttl_s: age.lease.granted_s,
                remaining_s: age.lease.remaining_s,
                age_s: age.lease.age_s(),
            })
            .collect(),
        observed_at_ms: crate::service::now_ms(),
    }))
}

// === Access requests and grants (DESIGN §2.11) ===

/// Parses a query string strictly: an unknown parameter is `UNKNOWN_FIELD`.
fn query<T>(query: Result<Query<T>, axum::extract::rejection::QueryRejection>) -> Result<T, RegistryError> {
    query.map(|Query(query)| query).map_err(|rejection| {
        RegistryError::new(Code::UnknownField, format!("invalid query: {}", rejection.body_text()))
    })
}

/// `POST /v1/access-requests`: `201` a new pending request, `200` the one
/// already pending for the same caller and capability.
#[tracing::instrument(name = "http.request_access", skip_all)]
async fn request_access(
    State(service): State<Arc<RegistryService>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let request: wire::AccessRequestBody = parse_body(&headers, body, service.config().max_body_bytes).await?;
    let (request, created) = service.request_access(&caller, request).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(request)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessRequestsQuery {
    status: Option<String>,
}

#[tracing::instrument(name = "http.list_access_requests", skip_all)]
async fn list_access_requests(
    State(service): State<Arc<RegistryService>>,
    query_string: Result<Query<AccessRequestsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<wire::AccessRequestList>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let AccessRequestsQuery { status } = query(query_string)?;
    let requests = service.access_requests(&caller, status.as_deref()).await?;
    Ok(Json(wire::AccessRequestList { requests }))
}

#[tracing::instrument(name = "http.get_access_request", skip_all)]
async fn get_access_request(
    State(service): State<Arc<RegistryService>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<wire::AccessRequest>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    Ok(Json(service.access_request(&caller, &id).await?))
}

/// The optional decision body: empty, or `{note}`.
async fn decision_body(
    service: &RegistryService,
    headers: &HeaderMap,
    body: Body,
) -> Result<wire::AccessDecisionBody, RegistryError> {
    let limit = service.config().max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| RegistryError::new(Code::PayloadTooLarge, format!("the body is over {limit} bytes")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(wire::AccessDecisionBody::default());
    }
    parse_body(headers, Body::from(bytes), limit).await
}

async fn decide(
    service: Arc<RegistryService>,
    (id, headers, body): (String, HeaderMap, Body),
    decision: Decision,
) -> Result<Json<wire::AccessRequest>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let wire::AccessDecisionBody { note } = decision_body(&service, &headers, body).await?;
    Ok(Json(service.decide(&caller, &id, decision, note).await?))
}

/// `POST /v1/access-requests/{id}/approve` (its capability's approvers): `{id, status: "approved", grant_id, …}`.
#[tracing::instrument(name = "http.approve_access", skip_all)]
async fn approve_access(
    State(service): State<Arc<RegistryService>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::AccessRequest>, RegistryError> {
    decide(service, (id, headers, body), Decision::Approve).await
}

/// `POST /v1/access-requests/{id}/deny` (its capability's approvers).
#[tracing::instrument(name = "http.deny_access", skip_all)]
async fn deny_access(
    State(service): State<Arc<RegistryService>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::AccessRequest>, RegistryError> {
    decide(service, (id, headers, body), Decision::Deny).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsQuery {
    caller: Option<String>,
    capability: Option<String>,
}

#[tracing::instrument(name = "http.list_grants", skip_all)]
async fn list_grants(
    State(service): State<Arc<RegistryService>>,
    query_string: Result<Query<GrantsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<wire::GrantList>, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    let GrantsQuery { caller: of, capability } = query(query_string)?;
    let filter = GrantFilter { caller: of, capability };
    Ok(Json(wire::GrantList {
        grants: service.grants(&caller, &filter),
    }))
}

/// `DELETE /v1/grants/{id}` (the capability's approvers, operators): `204`.
#[tracing::instrument(name = "http.revoke_grant", skip_all)]
async fn revoke_grant(
    State(service): State<Arc<RegistryService>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, RegistryError> {
    let caller = service.authenticate(headers.get(http::header::AUTHORIZATION))?;
    service.revoke_grant(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when the store answers and the catalog is in sync with it.
async fn readyz(State(service): State<Arc<RegistryService>>) -> Response {
    let store = tokio::time::timeout(std::time::Duration::from_secs(2), service.store().ping()).await;
    match (store, service.catalog().is_synced()) {
        (Ok(Ok(())), true) => (StatusCode::OK, "ready\n").into_response(),
        (Ok(Ok(())), false) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "catalog not yet in sync with the store\n",
        )
            .into_response(),
        (Ok(Err(error)), _) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("store unreachable: {error}\n")).into_response()
        }
        (Err(_), _) => (StatusCode::SERVICE_UNAVAILABLE, "store did not answer within 2 s\n").into_response(),
    }
}

async fn metrics(State(service): State<Arc<RegistryService>>) -> Response {
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        service.metrics().render(),
    )
        .into_response()
}

async fn not_found() -> RegistryError {
    RegistryError::new(Code::NotFound, "no such route; see DESIGN §2 for the registry API")
}
