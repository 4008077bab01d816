//! The operator console (issue 26, DESIGN §8 `operators:`): `/console`, a
//! page embedded in the binary (plain HTML, CSS and JavaScript, no network
//! beyond this router), and the JSON API it and the CLI share, every route
//! in the OpenAPI description (`docs/console.md`).
//!
//! Sign-in: `POST /v1/console/links` (an operator's bearer token) answers a
//! short-lived link whose `#code=` fragment seals that token ([`seal`]); the
//! page exchanges it at `POST /v1/console/session` for an HttpOnly,
//! `SameSite=Strict` session cookie sealing the same token. Every operator
//! route takes either a bearer token or that cookie plus the
//! `x-agent-reach-console` header (a page on another site cannot send it
//! without a CORS preflight, which the router never grants): [`operator`].
//!
//! Reads: [`views`] (instances, capabilities, recent calls, the slow path),
//! from the snapshot, the recent-calls ring and the task store; never on
//! the request path. Actions: dead-letter replay is the slow path's own
//! route; drains, weights, traffic splits and capability policies are the registry's, relayed with the
//! operator's own token ([`relay`]) so the registry records who did it, as is
//! the heartbeat ages read (the lease in etcd is the only place that knows them),
//! and access requests' decisions and revocations ([`access`], which also
//! shows the file's rules beside the grants this router applies).

mod access;
pub mod openapi;
mod operator;
mod relay;
pub mod seal;
mod trail;
mod views;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

pub use relay::Console;

use agent_reach_pipeline::answer::{method_not_allowed, refused};
use agent_reach_pipeline::call::identify::Identified;
pub use agent_reach_pipeline::call::identify::{operator, Operator};
use agent_reach_pipeline::clock;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use agent_reach_tasks::TaskService;
use operator::{sealer, unauthenticated};
pub use operator::{Sessions, COOKIE, PAGE_HEADER};
use seal::{Kind, Unsealed};

/// A sign-in link's default and longest life.
const LINK_TTL_S: u64 = 120;
const LINK_TTL_MAX_S: u64 = 600;
/// A session's life (each request also re-verifies the operator's token, so
/// an expired token ends the session sooner).
const SESSION_TTL_S: u64 = 8 * 3600;

const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");
/// The access section's script (its own file: the section is self-contained).
const ACCESS_JS: &str = include_str!("assets/access.js");

/// What the console's routes share.
#[derive(Clone)]
pub struct ConsoleState {
    pub service: Arc<RouterService>,
    pub tasks: Option<Arc<TaskService>>,
    pub console: Arc<Console>,
}

/// The console's page, its sign-in and its API.
pub fn routes(state: ConsoleState) -> axum::Router {
    axum::Router::new()
        .route("/console", get(index).fallback(method_not_allowed))
        .route("/console/", get(index).fallback(method_not_allowed))
        .route("/console/console.js", get(script).fallback(method_not_allowed))
        .route("/console/console.css", get(style).fallback(method_not_allowed))
        .route("/console/access.js", get(access_script).fallback(method_not_allowed))
        .route("/v1/console/links", post(create_link).fallback(method_not_allowed))
        .route(
            "/v1/console/session",
            get(show_session)
                .post(open_session)
                .delete(close_session)
                .fallback(method_not_allowed),
        )
        .route(
            "/v1/routing/instances",
            get(views::instances).fallback(method_not_allowed),
        )
        .route(
            "/v1/routing/capabilities",
            get(views::capabilities).fallback(method_not_allowed),
        )
        .route(
            "/v1/routing/changes",
            get(views::weight_changes).fallback(method_not_allowed),
        )
        .route("/v1/routing/history", get(views::history).fallback(method_not_allowed))
        .route("/v1/requests", get(views::recent).fallback(method_not_allowed))
        .route(
            "/v1/requests/{request_id}",
            get(views::request).fallback(method_not_allowed),
        )
        .route("/v1/backlog", get(views::backlog).fallback(method_not_allowed))
        .route("/v1/trail", get(trail::records).fallback(method_not_allowed))
        .route("/v1/trail/chains", get(trail::chains).fallback(method_not_allowed))
        .route("/v1/trail/inputs", get(trail::inputs).fallback(method_not_allowed))
        .route(
            "/v1/trail/chains/{router}/records",
            get(trail::chain_records).fallback(method_not_allowed),
        )
        .route(
            "/v1/trail/chains/{router}/heads",
            get(trail::chain_heads).fallback(method_not_allowed),
        )
        .route(
            "/v1/agents/{agent_id}/weight",
            put(relay::weight).fallback(method_not_allowed),
        )
        .route(
            "/v1/agents/{agent_id}/drain",
            post(relay::drain).fallback(method_not_allowed),
        )
        .route("/v1/heartbeats", get(relay::heartbeats).fallback(method_not_allowed))
        .route("/v1/routing/access", get(access::view).fallback(method_not_allowed))
        .route(
            "/v1/access-requests",
            get(access::requests).fallback(method_not_allowed),
        )
        .route(
            "/v1/access-requests/{id}/approve",
            post(access::decide).fallback(method_not_allowed),
        )
        .route(
            "/v1/access-requests/{id}/deny",
            post(access::decide).fallback(method_not_allowed),
        )
        .route(
            "/v1/grants/{id}",
            axum::routing::delete(access::revoke).fallback(method_not_allowed),
        )
        .route(
            "/v1/capabilities/{name}/split",
            get(relay::split)
                .put(relay::split)
                .delete(relay::split)
                .fallback(method_not_allowed),
        )
        .route(
            "/v1/capabilities/{name}/policy",
            get(relay::split)
                .put(relay::split)
                .delete(relay::split)
                .fallback(method_not_allowed),
        )
        .with_state(state)
}

// === The page ===

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Everything the page loads is this router's own; it is never framed.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

async fn access_script() -> Response {
    asset("text/javascript; charset=utf-8", ACCESS_JS)
}

// === Sign-in ===

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkRequest {
    /// The link's life in seconds, 1..=600 (default 120).
    ttl_s: Option<u64>,
}

/// `POST /v1/console/links`: a short-lived sign-in link for the calling operator.
async fn create_link(
    State(state): State<ConsoleState>,
    identified: Identified,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let outcome = (|| {
        let operator = operator(state.service.admission(), &identified, &headers)?;
        let request: LinkRequest = if body.iter().all(u8::is_ascii_whitespace) {
            LinkRequest::default()
        } else {
            serde_json::from_slice(&body).map_err(|error| {
                RouterError::new(Code::InvalidEnvelope, format!("invalid sign-in link request: {error}"))
            })?
        };
        let ttl_s = request.ttl_s.unwrap_or(LINK_TTL_S);
        if !(1..=LINK_TTL_MAX_S).contains(&ttl_s) {
            return Err(RouterError::field(
                Code::InvalidEnvelope,
                "ttl_s",
                format!("`ttl_s` is {ttl_s}; a sign-in link lives 1 to {LINK_TTL_MAX_S} s"),
            ));
        }
        let expires_ms = clock::epoch_ms() + ttl_s * 1000;
        let code = sealer(state.service.assertions())?
            .seal(Kind::Link, &operator.token, expires_ms)
            .map_err(|error| RouterError::new(Code::AssertionFailed, format!("cannot seal the link: {error}")))?;
        tracing::info!(message = "Console sign-in link issued.", operator = %operator.name(), ttl_s);
        Ok::<_, RouterError>(
            Json(json!({
                "path": format!("/console#code={code}"),
                "code": code,
                "operator": operator.name(),
                "expires_at_ms": expires_ms,
            }))
            .into_response(),
        )
    })();
    outcome.unwrap_or_else(refused)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRequest {
    code: String,
}

fn cookie(state: &ConsoleState, value: &str, max_age_s: u64) -> Result<HeaderValue, RouterError> {
    let secure = if state.console.secure_cookie() { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}"
    ))
    .map_err(|error| RouterError::new(Code::AssertionFailed, format!("session cookie: {error}")))
}

/// `POST /v1/console/session` `{"code"}`: the link's code for a session cookie.
async fn open_session(State(state): State<ConsoleState>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let outcome = (|| {
        // Only the console's page signs in: another site cannot make a browser
        // send this header, so it cannot sign a visitor in as someone else.
        if !headers.contains_key(PAGE_HEADER) {
            return Err(RouterError::new(
                Code::Forbidden,
                format!("sign in from the console's page (it sends the `{PAGE_HEADER}` header)"),
            )
            .with_details(json!({ "reason": "console_header_missing" })));
        }
        let request: SessionRequest = serde_json::from_slice(&body).map_err(|error| {
            RouterError::new(
                Code::InvalidEnvelope,
                format!("expected {{\"code\": \"...\"}} from a sign-in link: {error}"),
            )
        })?;
        let now = clock::epoch_ms();
        let sealer = sealer(state.service.assertions())?;
        let token = sealer.open(Kind::Link, &request.code, now).map_err(|problem| match problem {
            Unsealed::Expired(at) => unauthenticated(
                "link_expired",
                format!(
                    "this sign-in link expired {} s ago; run `agent-reach console` for a new one",
                    now.saturating_sub(at) / 1000
                ),
            ),
            Unsealed::Invalid => unauthenticated(
                "link_invalid",
                "this sign-in link is not valid (mistyped, or made by a router with another key); run `agent-reach console` for a new one".to_string(),
            ),
        })?;
        let caller = state.service.identify().token(&token, now)?;
        state.service.admission().authorize_operator(&caller)?;
        let session = sealer
            .seal(Kind::Session, &token, now + SESSION_TTL_S * 1000)
            .map_err(|error| RouterError::new(Code::AssertionFailed, format!("cannot seal the session: {error}")))?;
        let operator = Operator { caller, token };
        tracing::info!(message = "Operator signed in to the console.", operator = %operator.name());
        let mut response = Json(json!({
            "operator": operator.name(),
            "expires_at_ms": now + SESSION_TTL_S * 1000,
        }))
        .into_response();
        response
            .headers_mut()
            .insert(header::SET_COOKIE, cookie(&state, &session, SESSION_TTL_S)?);
        Ok::<_, RouterError>(response)
    })();
    outcome.unwrap_or_else(refused)
}

/// `GET /v1/console/session`: who is signed in (the page's first call).
async fn show_session(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    match operator(state.service.admission(), &identified, &headers) {
        Ok(operator) => Json(json!({ "operator": operator.name() })).into_response(),
        Err(error) => refused(error),
    }
}

/// `DELETE /v1/console/session`: signs out (the cookie is cleared).
async fn close_session(State(state): State<ConsoleState>) -> Response {
    match cookie(&state, "", 0) {
        Ok(value) => (StatusCode::NO_CONTENT, [(header::SET_COOKIE, value)]).into_response(),
        Err(error) => refused(error),
    }
}
