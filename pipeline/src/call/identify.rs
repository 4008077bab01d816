//! Who is calling: the one place the router verifies a credential. Every
//! route sits behind [`layer`] (the front door's hot routes call
//! [`Identify::headers`] themselves, once per request), which reads the
//! request's clock and its bearer token, or, without one, a console session
//! ([`Sessions`]), and hands the handlers an [`Identified`]. No handler
//! verifies a token itself: each one only decides whether the identity it
//! was given is enough for what it does.

use std::sync::Arc;

use agent_reach_access::{Authenticator, Caller};
use agent_reach_serving::HeaderLookup;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::clock;
use crate::error::{Code, RouterError};

/// What the console's session cookie stands for: the operator's own bearer
/// token, sealed by the console (implemented where the console lives; the
/// router only asks).
pub trait Sessions: Send + Sync + 'static {
    /// The token a request's session carries: `None` without a session,
    /// `Err` for one that cannot be used (expired, forged, sent without
    /// the console page's header).
    fn token(&self, headers: &axum::http::HeaderMap, now_ms: u64) -> Option<Result<String, RouterError>>;
}

/// Verifies credentials for one tenant's part.
#[derive(Clone)]
pub struct Identify {
    auth: Arc<Authenticator>,
    sessions: Option<Arc<dyn Sessions>>,
}

/// A request's identity, as verified once when it arrived.
#[derive(Clone)]
pub struct Identified {
    /// The caller its `authorization` header names (or, with authentication
    /// off, the unauthenticated caller); the refusal otherwise.
    pub caller: Result<Caller, RouterError>,
    /// The caller a console session names, when the request carried no
    /// `authorization` header but a session: `(caller, the sealed token)`.
    /// Only the operator routes accept it ([`Identified::operator`]).
    pub session: Option<Result<(Caller, String), RouterError>>,
    /// The request's one clock reading: its duration, its token's expiry
    /// check and its deadline count from here.
    pub received: clock::Now,
}

impl Identified {
    /// The caller of an operator route: the bearer token's, else the
    /// console session's; with the credential's text (relayed to the
    /// registry, sealed into sign-in links).
    pub fn operator(&self, headers: &impl HeaderLookup) -> Result<(Caller, String), RouterError> {
        // A session is only read from a request without an `authorization` header.
        match &self.session {
            Some(session) => session.clone(),
            None => {
                let caller = self.caller.clone()?;
                Ok((caller, bearer(headers).unwrap_or_default().to_string()))
            }
        }
    }
}

/// The token of a `Bearer` `authorization` header.
pub fn bearer(headers: &impl HeaderLookup) -> Option<&str> {
    let value = std::str::from_utf8(headers.value("authorization")?).ok()?;
    value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))
}

impl Identify {
    pub fn new(auth: Arc<Authenticator>) -> Self {
        Self { auth, sessions: None }
    }

    /// The authenticator (its OIDC issuers name the router's protected resource metadata).
    pub fn authenticator(&self) -> &Arc<Authenticator> {
        &self.auth
    }

    /// Also accepts console sessions (for the operator routes).
    pub fn with_sessions(mut self, sessions: Arc<dyn Sessions>) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// The identity of a request with `headers`, read now.
    pub fn headers(&self, headers: &impl HeaderLookup) -> Identified {
        self.headers_at(headers, None, clock::Now::read())
    }

    /// The identity of a request with the header map `headers`, read now,
    /// as the routes' layer reads it (a console session too).
    pub fn header_map(&self, headers: &axum::http::HeaderMap) -> Identified {
        self.headers_at(headers, Some(headers), clock::Now::read())
    }

    /// [`Identify::headers`] at `received`, the request's clock reading; the
    /// full header map, when there is one, lets a console session be read.
    fn headers_at(
        &self,
        headers: &impl HeaderLookup,
        map: Option<&axum::http::HeaderMap>,
        received: clock::Now,
    ) -> Identified {
        let authorization = headers.value("authorization");
        let caller = self.verify(authorization, received.epoch_ms);
        let session = match (authorization, &self.sessions, map) {
            (None, Some(sessions), Some(map)) => sessions.token(map, received.epoch_ms).map(|token| {
                let token = token?;
                let caller = self.token(&token, received.epoch_ms)?;
                Ok((caller, token))
            }),
            _ => None,
        };
        Identified {
            caller,
            session,
            received,
        }
    }

    /// The caller a bearer `token` (not from a header: a sign-in link's) names, verified at `now_ms`.
    pub fn token(&self, token: &str, now_ms: u64) -> Result<Caller, RouterError> {
        if token.is_empty() {
            return self.verify(None, now_ms);
        }
        self.verify(Some(format!("Bearer {token}").as_bytes()), now_ms)
    }

    fn verify(&self, authorization: Option<&[u8]>, now_ms: u64) -> Result<Caller, RouterError> {
        self.auth
            .verify_value_at(authorization, now_ms)
            .map_err(RouterError::from)
    }
}

/// The middleware every route of a part sits behind: identifies the request
/// once and hands the [`Identified`] on in its extensions.
pub async fn layer(State(identify): State<Identify>, request: Request, next: Next) -> Response {
    identify.request(request, next).await
}

impl Identify {
    /// Identifies `request` and runs the rest of its route ([`layer`]'s
    /// body, for a middleware that picks the part first).
    pub async fn request(&self, mut request: Request, next: Next) -> Response {
        let received = clock::Now::read();
        let identified = self.headers_at(request.headers(), Some(request.headers()), received);
        request.extensions_mut().insert(identified);
        next.run(request).await
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Identified {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.remove::<Identified>().ok_or_else(|| {
            // A route mounted outside the part's routes: never silently anonymous.
            crate::answer::refused(RouterError::new(
                Code::Internal,
                "this route is not behind the router's authentication layer (a bug: report it)",
            ))
            .into_response()
        })
    }
}

/// An operator, identified by a bearer token or the console's session.
pub struct Operator {
    pub caller: Caller,
    /// The operator's own bearer token: relayed to the registry, sealed into sign-in links.
    pub token: String,
}

impl Operator {
    /// The name actions are logged with.
    pub fn name(&self) -> &str {
        self.caller.name().unwrap_or("(authentication off)")
    }
}

/// The operator behind a request (as identified when it arrived): its
/// bearer token, or else the console's session; 401 without either, 403 for
/// a caller not under `operators:` in `acl.yaml`.
pub fn operator(
    admission: &crate::admission::Admission,
    identified: &Identified,
    headers: &impl HeaderLookup,
) -> Result<Operator, RouterError> {
    let (caller, token) = identified.operator(headers)?;
    admission.authorize_operator(&caller)?;
    Ok(Operator { caller, token })
}
