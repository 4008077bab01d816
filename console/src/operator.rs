//! The console's session cookie (DESIGN §3.12): what it stands for (the
//! operator's sealed token, [`Sessions`]), read by the pipeline's one way
//! in for a request without an `authorization` header; the operator check
//! itself is the pipeline's (`agent_reach_pipeline::call::identify::operator`).

use std::sync::Arc;

use agent_reach_access::Assertions;
use agent_reach_pipeline::error::{Code, RouterError};
use axum::http::{header, HeaderMap};
use serde_json::json;

use crate::seal::{Kind, Sealer, Unsealed};

/// The session cookie's name.
pub const COOKIE: &str = "agent_reach_console";
/// The header a cookie-authenticated request must carry (the page sends it on every call).
pub const PAGE_HEADER: &str = "x-agent-reach-console";

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

/// What the console's session cookie stands for (`agent_reach_pipeline::call::identify`
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

impl agent_reach_pipeline::call::identify::Sessions for Sessions {
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
