//! The context service's hot routes for the edge's front door
//! ([`agent_reach_serving::front`]): `GET` and `PATCH /v1/contexts/{id}` (no
//! query, an id of plain context-id characters, so nothing to decode) take the
//! front door's own HTTP/1.1 loop and the same handlers as the axum routes;
//! everything else, gRPC included, goes to hyper and the axum routes.
//!
//! With a tenant map, a hot request is answered by the part of its token's
//! tenant, as the axum routes' dispatch would pick it; a process serving one
//! tenant never looks at the token here.

use std::future::Future;
use std::sync::Arc;

use agent_reach_serving::front::{Answer, Door, Headers};
use agent_reach_tenancy::Parts;
use axum::response::IntoResponse;
use bytes::Bytes;

use crate::error::{Code, ContextError};
use crate::http::ReadQuery;
use crate::service::ContextService;

/// `GET` and `PATCH /v1/contexts/{id}`, answered by [`crate::http::read_view`]
/// and [`crate::http::patch_written`] of the service the request is for.
#[derive(Clone)]
pub(crate) enum Contexts {
    /// One tenant (no tenant map).
    One(Arc<ContextService>),
    /// Each tenant's part, picked by the token's claim.
    Tenants(Arc<Parts<crate::tenants::Part>>),
}

impl Contexts {
    fn service(&self, headers: &http::HeaderMap) -> Arc<ContextService> {
        match self {
            Contexts::One(service) => service.clone(),
            Contexts::Tenants(parts) => {
                parts
                    .for_authorization(headers.get(http::header::AUTHORIZATION).map(|value| value.as_bytes()))
                    .service
            }
        }
    }
}

/// Which handler, with the context id from the path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Read(String),
    Patch(String),
}

/// `GET` or `PATCH /v1/contexts/{id}` with an id of context-id characters
/// only (A-Z a-z 0-9 _ - . :; so no percent-escape to decode) and no query.
fn route(method: &str, target: &str) -> Option<Route> {
    let id = target.strip_prefix("/v1/contexts/")?;
    let plain = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.' | b':');
    if id.is_empty() || !id.bytes().all(plain) {
        return None;
    }
    match method {
        "GET" => Some(Route::Read(id.to_string())),
        "PATCH" => Some(Route::Patch(id.to_string())),
        _ => None,
    }
}

impl agent_reach_serving::front::HotRoutes for Contexts {
    type Route = Route;

    fn route(&self, method: &str, target: &str) -> Option<Route> {
        route(method, target)
    }

    fn call(&self, route: Route, headers: Headers, body: Bytes) -> impl Future<Output = Answer> + Send {
        let served = self.clone();
        async move {
            // The handlers are axum's, written for a header map.
            let Some(headers) = headers.header_map() else {
                // Unreachable: the front door checks every field as a header map does.
                let error = ContextError::new(Code::Internal, "a request header could not be read");
                return Answer::from(error.into_response());
            };
            let service = served.service(&headers);
            match route {
                Route::Read(id) => json(crate::http::read_view(&service, id, ReadQuery::default(), &headers).await),
                Route::Patch(id) => json(
                    crate::http::patch_written(&service, id, &headers, agent_reach_serving::RequestBody::Read(body))
                        .await,
                ),
            }
        }
    }
}

/// A success as the front door's JSON answer (200), a failure as its error response.
fn json(result: Result<impl serde::Serialize, ContextError>) -> Answer {
    let answer = result.and_then(|value| {
        Answer::json(http::StatusCode::OK, &value)
            .map_err(|error| ContextError::new(Code::Internal, format!("the answer could not be encoded: {error}")))
    });
    answer.unwrap_or_else(|error| Answer::from(error.into_response()))
}

pub(crate) fn door(service: Arc<ContextService>, tls: Option<agent_reach_serving::tls::ServerTls>) -> Door<Contexts> {
    Door {
        app: crate::app(service.clone()),
        body_limit: service.config().max_body_bytes,
        hot: Contexts::One(service),
        tls,
    }
}

pub(crate) fn tenants_door(
    tenants: Arc<crate::Tenants>,
    tls: Option<agent_reach_serving::tls::ServerTls>,
) -> Door<Contexts> {
    Door {
        app: tenants.app(),
        body_limit: tenants.max_body_bytes(),
        hot: Contexts::Tenants(tenants.parts()),
        tls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_context_reads_and_patches_are_hot() {
        assert_eq!(
            route("GET", "/v1/contexts/s-1:a.b_C"),
            Some(Route::Read("s-1:a.b_C".into()))
        );
        assert_eq!(route("PATCH", "/v1/contexts/s-1"), Some(Route::Patch("s-1".into())));
        for (method, target) in [
            ("DELETE", "/v1/contexts/s-1"),
            ("POST", "/v1/contexts"),
            ("GET", "/v1/contexts/"),
            ("GET", "/v1/contexts/s-1?fields=a,b"),
            ("GET", "/v1/contexts/s%2D1"),
            ("GET", "/v1/contexts/a/b"),
            ("GET", "/healthz"),
            ("POST", "/agent_reach.context.v1.Contexts/Get"),
        ] {
            assert_eq!(route(method, target), None, "{method} {target} is hyper's");
        }
    }
}
