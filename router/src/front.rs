//! The router's hot route for the edge's front door
//! ([`agent_reach_edge::front`]): `POST /v1/invoke` takes the front door's own
//! HTTP/1.1 loop and the same handler as the axum route; every other request
//! (and any invoke that is not plain HTTP/1.1 with a `Content-Length` body)
//! goes to hyper and the axum routes.

use std::future::Future;
use std::sync::Arc;

use agent_reach_edge::front::{Answer, Door, Headers};
use bytes::Bytes;

use crate::service::RouterService;

/// `POST /v1/invoke`, answered by [`crate::http::answer_invoke`] of the
/// router's one service, or of the tenant's its token names ([`crate::tenancy`]).
#[derive(Clone)]
pub(crate) enum Invoke {
    One(Arc<RouterService>),
    Tenants(Arc<crate::tenancy::TenantParts>),
}

impl agent_reach_edge::front::HotRoutes for Invoke {
    type Route = ();

    fn route(&self, method: &str, target: &str) -> Option<()> {
        (method == "POST" && target == "/v1/invoke").then_some(())
    }

    fn call(&self, _: (), headers: Headers, body: Bytes) -> impl Future<Output = Answer> + Send {
        use agent_reach_edge::HeaderLookup as _;
        let service = match self {
            // Borrowed for the call: the connection holds the door (and so the service) throughout.
            Invoke::One(service) => std::borrow::Cow::Borrowed(service),
            Invoke::Tenants(parts) => {
                std::borrow::Cow::Owned(parts.for_authorization(headers.value("authorization")).service.clone())
            }
        };
        async move { crate::http::answer_invoke(&service, &headers, agent_reach_edge::RequestBody::Read(body)).await }
    }
}

/// The front door: the hot route (`hot`), the axum routes for the rest (`app`), the body limit.
pub(crate) fn door(
    app: axum::Router,
    hot: Invoke,
    body_limit: usize,
    tls: Option<agent_reach_edge::tls::ServerTls>,
) -> Door<Invoke> {
    Door {
        app,
        body_limit,
        hot,
        tls,
    }
}
