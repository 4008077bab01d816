//! The router's hot routes for the edge's front door
//! ([`agent_reach_serving::front`]): `POST /v1/invoke` (streamed or not),
//! `POST /a2a/{capability}` and `POST /a2a/{capability}/v1/message:send`
//! take the front door's own HTTP/1.1 loop and the same handlers as the axum
//! routes; every other request (and any that is not plain HTTP/1.1 with a
//! `Content-Length` body) goes to hyper and the axum routes. On HTTP/2 (which
//! hyper reads and writes), gRPC `SendMessage` skips the axum routes and
//! tonic's server: [`agent_reach_a2a::answer_grpc_send`].

use std::future::Future;
use std::sync::Arc;

use agent_reach_serving::front::{Answer, Door, Headers};
use agent_reach_serving::RequestBody;
use bytes::Bytes;

use crate::parts::Part;
use agent_reach_tasks::TaskApi;

/// `POST /v1/invoke`, answered by [`agent_reach_pipeline::http::answer_invoke`], and
/// `POST /a2a/{capability}`, by [`agent_reach_a2a::answer_rpc`], of the router's
/// one part, or of the tenant's its token names ([`crate::parts`]).
#[derive(Clone)]
pub(crate) enum Invoke {
    One(Arc<Part>),
    Tenants(Arc<crate::parts::TenantParts>),
}

/// Which hot route a request took.
pub(crate) enum Route {
    Invoke,
    /// JSON-RPC; the capability named in the path.
    A2a(String),
    /// REST `message:send`; the capability named in the path.
    A2aRestSend(String),
}

impl agent_reach_serving::front::HotRoutes for Invoke {
    type Route = Route;

    fn route(&self, method: &str, target: &str) -> Option<Route> {
        if method != "POST" {
            return None;
        }
        if target == "/v1/invoke" {
            return Some(Route::Invoke);
        }
        // Only names the axum route would take as they are: no escapes to
        // decode, no query, one path segment.
        let named = target.strip_prefix("/a2a/")?;
        let plain = |capability: &str| !capability.is_empty() && !capability.contains(['/', '%', '?', '#']);
        if let Some(capability) = named
            .strip_suffix("/v1/message:send")
            .filter(|capability| plain(capability))
        {
            return Some(Route::A2aRestSend(capability.to_string()));
        }
        plain(named).then(|| Route::A2a(named.to_string()))
    }

    fn call(&self, route: Route, headers: Headers, body: Bytes) -> impl Future<Output = Answer> + Send {
        use agent_reach_serving::HeaderLookup as _;
        // Borrowed for the call: the connection holds the door (and so the part) throughout.
        let part = self.part(headers.value("authorization"));
        async move {
            // The one way in, as the axum routes' layer: identified once, here.
            let identified = part.service.identify().headers(&headers);
            let answer = match route {
                Route::Invoke => {
                    agent_reach_pipeline::http::answer_invoke(
                        &part.service,
                        identified,
                        &headers,
                        RequestBody::Read(body),
                    )
                    .await
                }
                Route::A2a(capability) => {
                    let api = TaskApi::new(part.service.clone(), part.tasks.clone());
                    agent_reach_a2a::answer_rpc(&api, identified, &capability, &headers, RequestBody::Read(body)).await
                }
                Route::A2aRestSend(capability) => {
                    let api = TaskApi::new(part.service.clone(), part.tasks.clone());
                    agent_reach_a2a::answer_rest_send(&api, identified, &capability, &headers, body).await
                }
            };
            // As the axum routes' challenge layer: a 401 says how to authenticate.
            part.challenge.answer(answer, &headers)
        }
    }

    /// gRPC `SendMessage` ([`agent_reach_a2a::is_plain_grpc_send`]).
    fn takes_h2(&self, request: &http::request::Parts) -> bool {
        agent_reach_a2a::is_plain_grpc_send(request)
    }

    fn call_h2(
        &self,
        request: http::Request<axum::body::Body>,
        app: axum::Router,
    ) -> impl Future<Output = http::Response<axum::body::Body>> + Send {
        use agent_reach_serving::HeaderLookup as _;
        let part = self.part(request.headers().value("authorization"));
        async move {
            // The one way in, as the axum routes' layer: identified once, here
            // (gRPC answers are HTTP 200: the challenge layer adds nothing to them).
            let identified = part.service.identify().header_map(request.headers());
            let api = TaskApi::new(part.service.clone(), part.tasks.clone());
            agent_reach_a2a::answer_grpc_send(&api, identified, request, app).await
        }
    }
}

impl Invoke {
    /// The part a request with `authorization` is for.
    fn part(&self, authorization: Option<&[u8]>) -> std::borrow::Cow<'_, Arc<Part>> {
        match self {
            Invoke::One(part) => std::borrow::Cow::Borrowed(part),
            Invoke::Tenants(parts) => std::borrow::Cow::Owned(parts.for_authorization(authorization)),
        }
    }
}

/// The front door: the hot routes (`hot`), the axum routes for the rest (`app`), the body limit.
pub(crate) fn door(
    app: axum::Router,
    hot: Invoke,
    body_limit: usize,
    tls: Option<agent_reach_serving::tls::ServerTls>,
) -> Door<Invoke> {
    Door {
        app,
        body_limit,
        hot,
        tls,
    }
}
