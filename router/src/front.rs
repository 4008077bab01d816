//! The router's hot route for the edge's front door
//! ([`agent_reach_edge::front`]): `POST /v1/invoke` takes the front door's own
//! HTTP/1.1 loop and the same handler as the axum route; every other request
//! (and any invoke that is not plain HTTP/1.1 with a `Content-Length` body)
//! goes to hyper and the axum routes.

use std::future::Future;
use std::io;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use bytes::Bytes;
use http::HeaderMap;
use tokio::net::TcpListener;

use crate::service::RouterService;

/// `POST /v1/invoke`, answered by [`crate::http::invoke`].
#[derive(Clone)]
pub(crate) struct Invoke(Arc<RouterService>);

impl agent_reach_edge::front::HotRoutes for Invoke {
    type Route = ();

    fn route(&self, method: &str, target: &str) -> Option<()> {
        (method == "POST" && target == "/v1/invoke").then_some(())
    }

    fn call(&self, _: (), headers: HeaderMap, body: Bytes) -> impl Future<Output = axum::response::Response> + Send {
        crate::http::invoke(State(self.0.clone()), headers, Body::from(body))
    }
}

/// Serves the router on `listener` until `shutdown` resolves, then lets open
/// requests finish.
pub async fn serve(
    listener: TcpListener,
    service: Arc<RouterService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let (hot, app, limit) = door(service);
    agent_reach_edge::front::serve(listener, hot, app, limit, shutdown).await
}

/// The front door's parts: the hot route, the axum routes for the rest, the body limit.
pub(crate) fn door(service: Arc<RouterService>) -> (Invoke, axum::Router, usize) {
    let app = crate::app(service.clone());
    let limit = service.tuning().max_body_bytes;
    (Invoke(service), app, limit)
}
