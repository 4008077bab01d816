//! The fuzz targets' way into the registry (`fuzz/`, feature `fuzzing`, off
//! in every service build): a registration body through the HTTP edge's
//! parse and the registration checks, as `POST /v1/agents` runs them. Not an API.

use agent_reach_errors::ErrorCode as _;
use agent_reach_proto::http as wire;
use axum::body::Body;
use http::HeaderMap;

use crate::error::RegistryError;
use crate::service::RegistryConfig;
use crate::validate;

/// How the registry refuses a registration: the status, the stable code's
/// string, the field at fault and the `{"error": …}` body.
pub struct Refusal {
    pub status: http::StatusCode,
    pub code: &'static str,
    pub field: Option<String>,
    pub body: wire::ErrorBody,
}

impl Refusal {
    fn boxed(error: RegistryError) -> Box<Self> {
        Box::new(Self {
            status: error.status(),
            code: error.code.as_str(),
            field: error.field.clone(),
            body: error.body(),
        })
    }
}

/// `body` as `POST /v1/agents` reads it (the default body limit, its
/// `content-length` sent), then checked with the default TTL bounds. An
/// accepted registration comes back as the request it amounts to, every
/// default filled in.
pub async fn registration(body: &[u8]) -> Result<wire::RegisterRequest, Box<Refusal>> {
    let config = RegistryConfig::default();
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_LENGTH, body.len().into());
    let request: wire::RegisterRequest =
        crate::http::parse_body(&headers, Body::from(body.to_vec()), config.max_body_bytes)
            .await
            .map_err(Refusal::boxed)?;
    let registration = validate::registration(
        request,
        validate::Bounds {
            ttl: config.ttl,
            schema: config.schema,
        },
    )
    .map_err(Refusal::boxed)?;
    Ok(wire::RegisterRequest {
        agent_id: registration.agent_id,
        name: registration.name,
        endpoint: registration.endpoint,
        protocol: Some(registration.protocol),
        weight: Some(registration.weight),
        tags: registration.tags,
        ttl_s: Some(registration.ttl_s),
        status: Some(registration.status.as_str().to_string()),
        capabilities: registration
            .capabilities
            .iter()
            .map(crate::http::capability_to_wire)
            .collect(),
    })
}
