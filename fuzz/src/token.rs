//! `token`: an `Authorization` header value through
//! `Authenticator::verify_value` (`access/src/token.rs`) with an HS256 key,
//! as every service checks its callers.
//!
//! Holds, for every input:
//! - verification never panics, and asking twice answers the same (the
//!   per-thread cache of verified tokens changes nothing);
//! - a refusal is one of the documented reasons (all `UNAUTHENTICATED`), and
//!   its message never repeats the token;
//! - an acceptance is earned: the value is `Bearer <jwt>`, the JWT's header
//!   says `HS256`, its signature is the HMAC-SHA256 of its first two parts
//!   under the key (checked here with `hmac`, not `jsonwebtoken`), its `sub`
//!   is the caller and its `exp` is not past.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_reach_access::{AuthError, Authenticator, Caller};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};

use crate::support::{leaks, HS256_SECRET};

const REASONS: [&str; 5] = ["missing", "malformed", "bad_signature", "expired", "invalid"];

/// Seconds of skew `token.rs` allows on `exp`.
const LEEWAY_S: u64 = 5;

fn authenticator() -> &'static Authenticator {
    static AUTHENTICATOR: OnceLock<Authenticator> = OnceLock::new();
    AUTHENTICATOR.get_or_init(|| Authenticator::hs256(HS256_SECRET))
}

pub fn run(data: &[u8]) {
    let authenticator = authenticator();
    let first = authenticator.verify_value(Some(data));
    let second = authenticator.verify_value(Some(data));
    assert_eq!(first, second, "asked twice, answered differently");
    match first {
        Ok(Caller::Agent { name, .. }) => acceptance_is_earned(data, &name),
        Ok(Caller::Unauthenticated) => panic!("an enabled authenticator trusted a caller unauthenticated"),
        Err(error) => refusal_holds(data, &error),
    }
}

fn refusal_holds(data: &[u8], error: &AuthError) {
    assert!(REASONS.contains(&error.reason()), "reason {}", error.reason());
    assert_eq!(AuthError::CODE, "UNAUTHENTICATED");
    let message = error.to_string();
    assert!(!message.is_empty());
    let token = String::from_utf8_lossy(data);
    let token = token.trim_start_matches("Bearer ").trim_start_matches("bearer ").trim();
    assert!(!leaks(&message, token), "the refusal repeats the token: {message}");
}

fn acceptance_is_earned(data: &[u8], name: &str) {
    let value = std::str::from_utf8(data).expect("an accepted header is ASCII");
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .expect("an accepted header is `Bearer <jwt>`")
        .trim();
    let parts: Vec<&str> = token.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        panic!("an accepted JWT of {} parts", parts.len());
    };
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .expect("an accepted JWT's parts are base64url")
    };
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(HS256_SECRET).expect("HMAC takes a key of any length");
    mac.update(format!("{header}.{claims}").as_bytes());
    mac.verify_slice(&decode(signature))
        .expect("an accepted token's signature is the key's HMAC");
    let header: serde_json::Value = serde_json::from_slice(&decode(header)).expect("an accepted JWT header is JSON");
    assert_eq!(header["alg"], "HS256", "accepted with {header}");
    let claims: serde_json::Value = serde_json::from_slice(&decode(claims)).expect("accepted claims are JSON");
    assert_eq!(claims["sub"].as_str(), Some(name), "the caller is not `sub`");
    assert!(!name.is_empty(), "an empty caller accepted");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let exp = claims["exp"].as_u64().expect("an accepted token has a numeric `exp`");
    assert!(
        exp + LEEWAY_S >= now,
        "an expired token accepted (exp {exp}, now {now})"
    );
}
