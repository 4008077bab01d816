//! The router's whole HTTP API, composed: the fast path's routes
//! ([`agent_reach_pipeline::http`]), the slow path's beside them ([`agent_reach_tasks`]), and
//! `/v1/broadcast`, which answers on either path (`?async=true` makes it a
//! task), and the operator console ([`crate::console`]). Neither path's
//! routes know the other's.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;

use agent_reach_pipeline::answer::{method_not_allowed, refused};
use agent_reach_pipeline::call::identify::{self, Identified};
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use agent_reach_tasks::{TaskApi, TaskService};

/// `POST /v1/broadcast`'s query.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BroadcastQuery {
    /// `true`: answer at once with a parent task and a child task per instance.
    #[serde(rename = "async")]
    asynchronous: Option<bool>,
}

#[derive(Clone)]
struct Both {
    service: Arc<RouterService>,
    tasks: TaskApi,
}

/// Every route of the router.
pub fn routes(
    service: Arc<RouterService>,
    tasks: Option<Arc<TaskService>>,
    console: Arc<agent_reach_console::Console>,
) -> axum::Router {
    let console = agent_reach_console::routes(agent_reach_console::ConsoleState {
        service: service.clone(),
        tasks: tasks.clone(),
        console,
    });
    let task_api = TaskApi::new(service.clone(), tasks);
    let broadcast_route = axum::Router::new()
        .route("/v1/broadcast", post(broadcast).fallback(method_not_allowed))
        .with_state(Both {
            service: service.clone(),
            tasks: task_api.clone(),
        });
    let identify = service.identify().clone();
    let openapi = axum::Router::new().route(
        "/v1/openapi.json",
        axum::routing::get(openapi).fallback(method_not_allowed),
    );
    let challenge = crate::protected_resource::Challenge::of(&service);
    agent_reach_pipeline::http::routes(service.clone())
        .merge(openapi)
        .merge(crate::protected_resource::routes(service.clone()))
        .merge(agent_reach_mcp::routes(task_api.clone()))
        .merge(agent_reach_a2a::routes(task_api.clone()))
        .merge(agent_reach_tasks::routes(task_api))
        .merge(broadcast_route)
        .merge(console)
        // Every route behind the one way in: identified once, before its handler.
        .layer(axum::middleware::from_fn_with_state(identify, identify::layer))
        // Every 401 says how to authenticate (RFC 6750, RFC 9728 §5.1).
        .layer(axum::middleware::from_fn_with_state(
            challenge,
            crate::protected_resource::layer,
        ))
}

async fn broadcast(
    State(both): State<Both>,
    query: Result<Query<BroadcastQuery>, axum::extract::rejection::QueryRejection>,
    identified: Identified,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match query {
        Ok(Query(BroadcastQuery {
            asynchronous: Some(true),
        })) => agent_reach_tasks::submit_broadcast(&both.tasks, identified, &headers, body).await,
        Ok(_) => agent_reach_pipeline::http::broadcast(&both.service, identified, &headers, body).await,
        Err(rejection) => refused(RouterError::new(
            Code::InvalidQuery,
            format!("invalid query: {}", rejection.body_text()),
        )),
    }
}

/// `GET /v1/openapi.json`: every route's description.
async fn openapi() -> Response {
    use axum::response::IntoResponse as _;
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        crate::openapi::document().to_string(),
    )
        .into_response()
}
