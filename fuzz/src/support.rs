//! What several targets share: the fixed keys signed seeds are made with,
//! polling a future that never waits, comparing JSON that went through a
//! float round trip, and telling a leaked credential.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use agent_reach_access::AssertionKey;

/// The `token` target's HS256 secret. A fuzzing key, public on purpose: the
/// signed seeds in `corpus/token/` are made with it.
pub const HS256_SECRET: &[u8] = b"agent-reach fuzzing secret: public, tests only";

/// The seed of the `assertion` target's Ed25519 key (public, as above).
const ASSERTION_KEY_SEED: [u8; 32] = *b"agent-reach fuzz key, not secret";

/// PKCS#8 v1 for Ed25519 (RFC 8410): this prefix, then the 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The `assertion` target's signing key, from its fixed seed.
pub fn assertion_key() -> AssertionKey {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    der.extend_from_slice(&ASSERTION_KEY_SEED);
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", der));
    AssertionKey::from_pkcs8_pem(pem.as_bytes()).expect("a PKCS#8 Ed25519 key built from a fixed seed")
}

/// The output of `future`, which must be ready at its first poll (an
/// in-memory request body is: its one frame is there).
pub fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a future over in-memory input waited"),
    }
}

/// Equal JSON, numbers compared as serde_json reads them back: without its
/// `float_roundtrip` feature a float written and read again may move by its
/// last bit, which is serde_json's business, not the code under test's.
pub fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            _ if a == b => true,
            (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()) * 4.0,
            _ => false,
        },
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_json(a, b)),
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(key, a)| b.get(key).is_some_and(|b| same_json(a, b)))
        }
        _ => a == b,
    }
}

/// Whether `message` gives away `credential` (no secret in an error message,
/// issue 20 point 5). Only a credential shaped like a JWT counts (three
/// base64url parts, 16 characters or more): any message contains `a`, and the
/// fuzzer, which sees this very comparison, soon learns to send a token made
/// of the message's own words (`assertion: InvalidT`).
pub fn leaks(message: &str, credential: &str) -> bool {
    let jwt_shaped = credential.len() >= 16
        && credential.split('.').count() == 3
        && credential
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'));
    jwt_shaped && message.contains(credential)
}
