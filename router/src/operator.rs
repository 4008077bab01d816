//! Who is asking for an operator's action: a bearer token, or the console's
//! session cookie with the page's header (DESIGN §3.12). Shared by the
//! console's routes and the slow path's dead-letter routes, so neither
//! depends on the other for it.

use std::sync::Arc;

use agent_reach_access::{Assertions, Caller};
use axum::http::{header, HeaderMap};
use serde_json::json;

use crate::console::seal::{Kind, Sealer, Unsealed};
use crate::error::{Code, RouterError};
use crate::pipeline::identify::Identified;

/// The session cookie's name.
pub const COOKIE: &str = "agent_reach_console";
/// The header a cookie-authenticated request must carry (the page sends it on every call).
pub const PAGE_HEADER: &str = "x-agent-reach-console";

/// An operator, authenticated by a bearer token or the console's session.
pub struct Operator {
    pub(crate) caller: Caller,
    /// The operator's own bearer token: relayed to the registry.
    pub(crate) token: String,
}

impl Operator {
    /// The name actions are logged with.
    pub fn name(&self) -> &str {
        self.caller.name().unwrap_or("(authentication off)")
    }
}

pub(crate) fn sealer(assertions: &Assertions) -> Result<Sealer, RouterError> {
    Sealer::new(&assertions.signing_key())
        .map_err(|error| RouterError::new(Code::AssertionFailed, format!("console sealing key: {error}")))
}

pub(crate) fn unauthenticated(reason: &'static str, message: String) -> RouterError {
    RouterError::new(Code::Unauthenticated, message).with_details(json!({ "reason": reason }))
}

pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// What the console's session cookie stands for (`crate::pipeline::identify`
/// reads it for a request without an `authorization` header): the sealed
/// operator's token, from the console's page only.
pub struct Sessions {
    assertions: Arc<Assertions>,
}

impl Sessions {
    pub fn new(assertions: Arc<Assertions>) -> Self {
        Self { assertions }
    }
}

impl crate::pipeline::identify::Sessions for Sessions {
    fn token(&self, headers: &HeaderMap, now_ms: u64) -> Option<Result<String, RouterError>> {
        let cookie = session_cookie(headers)?;
        if !headers.contains_key(PAGE_HEADER) {
            return Some(Err(RouterError::new(
                Code::Forbidden,
                format!("a console session is accepted only from the console's page (with the `{PAGE_HEADER}` header); other clients send a bearer token"),
            )
            .with_details(json!({ "reason": "console_header_missing" }))));
        }
        let opened = sealer(&self.assertions).and_then(|sealer| {
            sealer.open(Kind::Session, cookie, now_ms).map_err(|problem| match problem {
                Unsealed::Expired(_) => unauthenticated(
                    "session_expired",
                    "your console session expired; run `agent-reach console` for a new sign-in link".to_string(),
                ),
                Unsealed::Invalid => unauthenticated(
                    "session_invalid",
                    "this console session is not valid here (signed out, or the router's key changed); run `agent-reach console` for a new sign-in link".to_string(),
                ),
            })
        });
        Some(opened)
    }
}

/// The operator behind a request: its bearer token, or else the console's
/// session cookie with the page's header (as identified when it arrived);
/// 401 without either, 403 for a caller not under `operators:` in `acl.yaml`.
pub fn operator(
    admission: &crate::admission::Admission,
    identified: &Identified,
    headers: &HeaderMap,
) -> Result<Operator, RouterError> {
    let (caller, token) = identified.operator(headers)?;
    admission.authorize_operator(&caller)?;
    Ok(Operator { caller, token })
}
