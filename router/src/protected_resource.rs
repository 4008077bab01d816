//! OAuth 2.0 Protected Resource Metadata (RFC 9728), so that an OAuth
//! client that reaches the router (an MCP client following the MCP
//! authorization spec, say) finds where to get a token:
//! `GET /.well-known/oauth-protected-resource` names the router (`resource`,
//! the origin the client reached) and the OIDC issuers whose tokens it
//! accepts (`authorization_servers`, DESIGN §5.3.1); it is served only
//! when an issuer is configured. Every 401 the router answers carries
//! `WWW-Authenticate: Bearer` (RFC 6750 §3), with `resource_metadata`
//! pointing at that document (RFC 9728 §5.1) when there is one.

use std::sync::Arc;

use agent_reach_pipeline::answer::{method_not_allowed, refused};
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use agent_reach_serving::front::Answer;
use agent_reach_serving::HeaderLookup;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Where the metadata is served.
pub const PATH: &str = "/.well-known/oauth-protected-resource";

/// How a part of the router challenges the requests it refuses with 401.
#[derive(Clone)]
pub(crate) struct Challenge {
    /// Whether an OIDC issuer is configured (and the metadata served).
    metadata: bool,
    scheme: &'static str,
}

impl Challenge {
    pub(crate) fn of(service: &RouterService) -> Self {
        Self {
            metadata: service.identify().authenticator().oidc_issuers().next().is_some(),
            scheme: scheme(service),
        }
    }

    /// The `WWW-Authenticate` value for a 401 to a request: `invalid_token`
    /// when it carried a credential (RFC 6750 §3.1: none for a request
    /// without one), and the metadata's URL on the origin it reached.
    fn value(&self, request: &Reached) -> HeaderValue {
        let mut value = String::from("Bearer realm=\"agent-reach\"");
        if request.credential {
            value.push_str(", error=\"invalid_token\"");
        }
        // A host that could break out of the quoted string gets no pointer.
        if let Some(host) = request.host.as_deref() {
            value.push_str(&format!(", resource_metadata=\"{}://{host}{PATH}\"", self.scheme));
        }
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("Bearer realm=\"agent-reach\""))
    }

    /// `response` with the challenge when it is a 401 (in place of the bare
    /// `Bearer` the MCP and A2A adapters answer with).
    fn response(&self, mut response: Response, request: &Reached) -> Response {
        if response.status() == StatusCode::UNAUTHORIZED {
            let value = self.value(request);
            response.headers_mut().insert(http::header::WWW_AUTHENTICATE, value);
        }
        response
    }

    /// The front door's `answer` to a request with `headers`, challenged
    /// when it is a 401.
    pub(crate) fn answer(&self, answer: Answer, headers: &impl HeaderLookup) -> Answer {
        let refused = match &answer {
            Answer::Json { status, .. } | Answer::Typed { status, .. } => *status == StatusCode::UNAUTHORIZED,
            Answer::Response(response) => response.status() == StatusCode::UNAUTHORIZED,
            Answer::Stream { .. } => false,
        };
        if refused {
            Answer::Response(self.response(answer.into_response(), &self.reached(headers, None)))
        } else {
            answer
        }
    }
}

/// What a challenge says about the request it answers.
struct Reached {
    /// Whether it carried an `authorization` header.
    credential: bool,
    /// The host it reached, when plain ([`host_of`]) and the metadata is served.
    host: Option<String>,
}

impl Challenge {
    /// What the challenge to a request with `headers` needs; the host only
    /// when the metadata is served (the pointer names it).
    fn reached(&self, headers: &impl HeaderLookup, uri: Option<&axum::http::Uri>) -> Reached {
        Reached {
            credential: headers.value("authorization").is_some(),
            host: self.metadata.then(|| host_of(headers, uri)).flatten(),
        }
    }
}

/// The middleware over a part's axum routes.
pub(crate) async fn layer(State(challenge): State<Challenge>, request: Request, next: Next) -> Response {
    let reached = challenge.reached(request.headers(), Some(request.uri()));
    let response = next.run(request).await;
    challenge.response(response, &reached)
}

/// `GET /.well-known/oauth-protected-resource`.
pub(crate) fn routes(service: Arc<RouterService>) -> axum::Router {
    axum::Router::new()
        .route(PATH, axum::routing::get(metadata).fallback(method_not_allowed))
        .with_state(service)
}

async fn metadata(
    State(service): State<Arc<RouterService>>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    let issuers: Vec<&str> = service.identify().authenticator().oidc_issuers().collect();
    if issuers.is_empty() {
        return refused(RouterError::new(
            Code::NotFound,
            "no protected resource metadata: the router accepts no OIDC issuer's tokens \
             (start it with --auth-oidc-issuer URL --auth-oidc-audience AUD)",
        ));
    }
    let Some(host) = host_of(&headers, Some(&uri)) else {
        return refused(RouterError::new(
            Code::InvalidQuery,
            "the request names no plain host (`Host` or the HTTP/2 authority): the metadata's `resource` is the URL reached",
        ));
    };
    let document = serde_json::json!({
        "resource": format!("{}://{host}", scheme(&service)),
        "authorization_servers": issuers,
        "bearer_methods_supported": ["header"],
        "resource_name": "Agent-Reach router",
    });
    (
        [
            (http::header::CONTENT_TYPE, "application/json"),
            (http::header::CACHE_CONTROL, "max-age=300"),
        ],
        document.to_string(),
    )
        .into_response()
}

fn scheme(service: &RouterService) -> &'static str {
    if service.tuning().serves_tls {
        "https"
    } else {
        "http"
    }
}

/// The host (and port) the client reached: HTTP/1.1's `Host`, or HTTP/2's
/// `:authority` (the URI's), when it is plain: letters, digits and `.-:[]`
/// only, nothing that needs escaping in a URL or a quoted string.
fn host_of(headers: &impl HeaderLookup, uri: Option<&axum::http::Uri>) -> Option<String> {
    let host = match headers.value("host") {
        Some(host) => std::str::from_utf8(host).ok()?,
        None => uri?.authority()?.as_str(),
    };
    let plain = !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b':' | b'[' | b']'));
    plain.then(|| host.to_string())
}
