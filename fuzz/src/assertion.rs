//! `assertion`: an `Authorization` header value through the SDK agents'
//! check of the router's hop assertion (`access/src/assertion.rs`:
//! `AssertionVerifier::verify_header` for an audience, and `key_id`, read
//! before verifying to decide on a key refresh), with the router's JWKS; a
//! body that looks like JSON also goes through `from_jwks`.
//!
//! Holds, for every input:
//! - nothing panics; a refusal is one of the documented reasons, and its
//!   message never repeats the assertion;
//! - `key_id` names the `kid` of the JWT header as written;
//! - an acceptance is earned: the JWT's header says `EdDSA` and names the
//!   published key, its signature verifies under that key (checked here
//!   with `ring`, not `jsonwebtoken`), it is for this audience from this
//!   issuer, and it has not expired;
//! - a JWKS document either is refused or yields a verifier.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_reach_access::assertion::{jwks, LEEWAY_S};
use agent_reach_access::{AssertionClaims, AssertionError, AssertionVerifier};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use crate::support::{assertion_key, leaks};

/// Who the seeds' assertions are for and from.
pub const AUDIENCE: &str = "order_query-1";
pub const ISSUER: &str = "agent-reach-router";

const REASONS: [&str; 9] = [
    "missing",
    "malformed",
    "unknown_key",
    "bad_signature",
    "wrong_audience",
    "wrong_issuer",
    "expired",
    "source_mismatch",
    "capability_mismatch",
];

/// The verifier an agent builds from the router's JWKS, and the key's public half and `kid`.
fn verifier() -> &'static (AssertionVerifier, Vec<u8>, String) {
    static VERIFIER: OnceLock<(AssertionVerifier, Vec<u8>, String)> = OnceLock::new();
    VERIFIER.get_or_init(|| {
        let key = assertion_key();
        let document = jwks([&key]).to_string();
        let verifier = AssertionVerifier::from_jwks(document.as_bytes(), ISSUER).expect("the router's own JWKS");
        let x = key.jwk()["x"].as_str().map(str::to_string).expect("a JWK has `x`");
        let public = URL_SAFE_NO_PAD.decode(x).expect("`x` is base64url");
        (verifier, public, key.kid().to_string())
    })
}

pub fn run(data: &[u8]) {
    let (verifier, public, kid) = verifier();
    if data.first() == Some(&b'{') {
        if let Ok(other) = AssertionVerifier::from_jwks(data, ISSUER) {
            let _ = other.verify_header(Some(b"Bearer x.y.z"), AUDIENCE);
        }
    }
    if let Ok(token) = agent_reach_access::assertion::bearer(Some(data)) {
        key_id_holds(token);
    }
    match verifier.verify_header(Some(data), AUDIENCE) {
        Ok(claims) => acceptance_is_earned(data, &claims, public, kid),
        Err(error) => {
            assert!(REASONS.contains(&error.reason()), "reason {}", error.reason());
            let message = error.to_string();
            let token = String::from_utf8_lossy(data);
            let token = token.trim_start_matches("Bearer ").trim_start_matches("bearer ").trim();
            assert!(!leaks(&message, token), "the refusal repeats the assertion: {message}");
            if let AssertionError::WrongAudience { expected, .. } = &error {
                assert_eq!(expected, AUDIENCE);
            }
        }
    }
}

/// The `kid` `key_id` reads is the one the JWT header holds.
fn key_id_holds(token: &str) {
    let Ok(kid) = AssertionVerifier::key_id(token) else {
        return;
    };
    let header = token.split('.').next().expect("split yields a first part");
    let header = URL_SAFE_NO_PAD
        .decode(header)
        .expect("a header key_id read is base64url");
    // jsonwebtoken skips the members it does not read without checking their
    // strings (invalid UTF-8 there passes); such a header is only compared
    // when it is JSON through and through.
    if let Ok(header) = serde_json::from_slice::<serde_json::Value>(&header) {
        assert_eq!(header["kid"].as_str(), Some(kid.as_str()));
    }
}

fn acceptance_is_earned(data: &[u8], claims: &AssertionClaims, public: &[u8], kid: &str) {
    let token = agent_reach_access::assertion::bearer(Some(data)).expect("an accepted header is `Bearer <jwt>`");
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = parts[..] else {
        panic!("an accepted JWT of {} parts", parts.len());
    };
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .expect("an accepted JWT's parts are base64url")
    };
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
        .verify(format!("{header}.{payload}").as_bytes(), &decode(signature))
        .expect("an accepted assertion's signature verifies under the published key");
    let header: serde_json::Value = serde_json::from_slice(&decode(header)).expect("an accepted JWT header is JSON");
    assert_eq!(header["alg"], "EdDSA", "accepted with {header}");
    assert_eq!(header["kid"].as_str(), Some(kid));
    assert_eq!((claims.aud.as_str(), claims.iss.as_str()), (AUDIENCE, ISSUER));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    assert!(claims.exp + LEEWAY_S >= now, "an expired assertion accepted");
}
