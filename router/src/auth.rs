//! Bearer-token verification with a small per-thread cache of recent
//! successes: a caller sends the same token on every request, and checking
//! its HMAC, base64 and claims each time is pure repeated work. Entries live
//! one second (well inside the verifier's 5 s expiry leeway), so an expired
//! or revoked secret stops working just as promptly. Failures are never cached.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent_reach_access::{AuthError, Authenticator, Caller};
use http::HeaderValue;

use crate::clock;

/// How long a verified token is trusted without verifying it again.
const CACHE_TTL_MS: u64 = 1000;
/// Entries per thread before the cache is cleared (bounds memory under token churn).
const CACHE_CAPACITY: usize = 4096;

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

struct Entry {
    verifier: usize,
    caller: Caller,
    valid_until_ms: u64,
}

thread_local! {
    static VERIFIED: RefCell<HashMap<String, Entry>> = RefCell::new(HashMap::new());
}

pub struct CachingAuthenticator {
    inner: Authenticator,
    /// Distinguishes routers sharing a thread (tests run several in one process).
    id: usize,
}

impl CachingAuthenticator {
    pub fn new(inner: Authenticator) -> Self {
        Self {
            inner,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_enabled()
    }

    pub fn verify_header(&self, header: Option<&HeaderValue>) -> Result<Caller, AuthError> {
        let Some(text) = header.and_then(|value| value.to_str().ok()) else {
            return self.inner.verify_header(header);
        };
        let now = clock::now_ms();
        let hit = VERIFIED.with(|cache| {
            cache.borrow().get(text).and_then(|entry| {
                (entry.verifier == self.id && entry.valid_until_ms > now).then(|| entry.caller.clone())
            })
        });
        if let Some(caller) = hit {
            return Ok(caller);
        }
        let caller = self.inner.verify_header(header)?;
        VERIFIED.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(
                text.to_string(),
                Entry {
                    verifier: self.id,
                    caller: caller.clone(),
                    valid_until_ms: now + CACHE_TTL_MS,
                },
            );
        });
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn caches_successes_only_and_per_verifier() {
        let auth = CachingAuthenticator::new(Authenticator::hs256(SECRET));
        let other = CachingAuthenticator::new(Authenticator::hs256(b"another-secret-another-secret-xx"));
        let token = agent_reach_access::token::issue_hs256("caller", SECRET, Duration::from_secs(60)).unwrap();
        let header = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        assert_eq!(auth.verify_header(Some(&header)), Ok(Caller::Agent("caller".into())));
        assert_eq!(auth.verify_header(Some(&header)), Ok(Caller::Agent("caller".into())));
        assert!(
            other.verify_header(Some(&header)).is_err(),
            "another verifier's cache entry is not reused"
        );
        let bad = HeaderValue::from_static("Bearer nope");
        assert!(auth.verify_header(Some(&bad)).is_err());
        assert!(auth.verify_header(Some(&bad)).is_err());
        assert!(auth.verify_header(None).is_err());
    }
}
