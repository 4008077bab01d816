//! The agent trusts only calls the router vouched for (DESIGN §8): every
//! delivery must carry the router's assertion for this very instance
//! (`aud` = its `agent_id`), unexpired, signed by a key the router publishes,
//! for the capability the envelope names, and the envelope's `source` must be
//! the caller the router verified. Anything else is 401 `UNAUTHENTICATED`
//! with the reason, before the body is even decoded.
//!
//! The keys come from the router's JWKS (`{router}/.well-known/jwks.json`,
//! fetched at start, refreshed every minute and at once, rate-limited, when
//! an assertion names a key not seen yet: a key rotation costs no call) or
//! from a JWKS file (polled for changes). Only the development switch turns
//! this off, and it says so loudly.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_access::assertion::{bearer, AssertionClaims, AssertionError, AssertionVerifier};
use agent_reach_access::kept::Kept;
use arc_swap::ArcSwapOption;
use tokio::sync::{watch, Notify};

/// Environment variable that turns verification off (development only).
pub const INSECURE_ACCEPT_UNVERIFIED_ENV: &str = "AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED";

/// How often published keys are fetched again without being asked.
const REFRESH_EVERY: Duration = Duration::from_secs(60);
/// How often a key file is read again.
const FILE_POLL: Duration = Duration::from_secs(1);
/// The fewest seconds between two fetches asked for by unknown key ids.
const MIN_REFRESH_GAP: Duration = Duration::from_secs(1);
/// How long a call waits for a refresh its unknown key id asked for.
const REFRESH_WAIT: Duration = Duration::from_secs(2);
/// Verified assertions kept in each of the cache's two generations (those in
/// use kept longest: a run's steps on this instance share one assertion and
/// may be seconds apart behind a backlog).
const CACHE_CAPACITY: usize = 4096;

/// Where the router's public keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// The router's JWKS document.
    Url(String),
    /// A JWKS document on disk.
    File(PathBuf),
}

/// Whether the environment turns verification off.
pub(crate) fn insecure_from_env() -> bool {
    std::env::var(INSECURE_ACCEPT_UNVERIFIED_ENV)
        .map(|value| matches!(value.trim(), "1" | "true" | "yes"))
        .unwrap_or(false)
}

/// The keys in use, refreshed in the background.
pub(crate) struct Keys {
    source: KeySource,
    issuer: String,
    verifier: ArcSwapOption<AssertionVerifier>,
    /// Bumped on every swap, so a waiting call sees the refresh it asked for.
    generation: watch::Sender<u64>,
    wanted: Arc<Notify>,
    http: reqwest::Client,
    /// Verified assertions (the router reuses one per caller and instance for seconds).
    verified: std::sync::Mutex<Kept<String, Arc<AssertionClaims>>>,
}

impl Keys {
    /// Starts fetching (or reading) the keys; the task ends when the agent drops them.
    pub(crate) fn start(source: KeySource, issuer: String, http: reqwest::Client) -> Arc<Self> {
        let keys = Arc::new(Self {
            source,
            issuer,
            verifier: ArcSwapOption::empty(),
            generation: watch::channel(0).0,
            wanted: Arc::new(Notify::new()),
            http,
            verified: std::sync::Mutex::new(Kept::new(CACHE_CAPACITY)),
        });
        tokio::spawn(refresh(Arc::downgrade(&keys)));
        keys
    }

    /// Verifies the `authorization` header of a delivery for `agent_id`.
    pub(crate) async fn verify(
        &self,
        header: Option<&[u8]>,
        agent_id: &str,
    ) -> Result<Arc<AssertionClaims>, AssertionError> {
        let token = bearer(header)?;
        if let Some(claims) = self.cached(token) {
            return Ok(claims);
        }
        let kid = AssertionVerifier::key_id(token)?;
        let mut verifier = self.verifier.load_full();
        if !verifier.as_ref().is_some_and(|known| known.knows(&kid)) {
            // A key not seen yet (a rotation, or keys not fetched yet): ask for
            // a refresh and wait a little for it.
            let mut changed = self.generation.subscribe();
            self.wanted.notify_one();
            let _ = tokio::time::timeout(REFRESH_WAIT, changed.changed()).await;
            verifier = self.verifier.load_full();
        }
        let Some(verifier) = verifier else {
            return Err(AssertionError::UnknownKey(kid));
        };
        let claims = Arc::new(verifier.verify(token, agent_id)?);
        self.verified
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(token.to_string(), claims.clone());
        Ok(claims)
    }

    /// A verified assertion still before its expiry.
    fn cached(&self, token: &str) -> Option<Arc<AssertionClaims>> {
        let mut verified = self.verified.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let claims = verified.get(token)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs();
        (claims.exp + agent_reach_access::assertion::LEEWAY_S > now).then(|| claims.clone())
    }

    async fn fetch(&self) -> Result<AssertionVerifier, String> {
        let document = match &self.source {
            KeySource::File(path) => {
                std::fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?
            }
            KeySource::Url(url) => {
                let response = self
                    .http
                    .get(url)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .map_err(|error| format!("cannot fetch {url}: {error}"))?;
                if !response.status().is_success() {
                    return Err(format!("{url} answered {}", response.status()));
                }
                response
                    .bytes()
                    .await
                    .map_err(|error| format!("cannot read {url}: {error}"))?
                    .to_vec()
            }
        };
        AssertionVerifier::from_jwks(&document, &self.issuer)
    }
}

/// Keeps the keys fresh: at start, every minute (every second for a file),
/// and when a call meets an unknown key id (at most once a second); failures
/// are retried with backoff and never drop the last good keys.
async fn refresh(keys: std::sync::Weak<Keys>) {
    let mut backoff = Duration::from_millis(200);
    let mut last = Instant::now() - MIN_REFRESH_GAP;
    loop {
        let Some(current) = keys.upgrade() else { return };
        let since = last.elapsed();
        if since < MIN_REFRESH_GAP {
            tokio::time::sleep(MIN_REFRESH_GAP - since).await;
        }
        last = Instant::now();
        let wait = match current.fetch().await {
            Ok(verifier) => {
                current.verifier.store(Some(Arc::new(verifier)));
                current.generation.send_modify(|generation| *generation += 1);
                backoff = Duration::from_millis(200);
                match current.source {
                    KeySource::File(_) => FILE_POLL,
                    KeySource::Url(_) => REFRESH_EVERY,
                }
            }
            Err(error) => {
                let have_keys = current.verifier.load().is_some();
                tracing::warn!(
                    message = "Cannot load the router's assertion keys; retrying.",
                    %error, have_keys
                );
                backoff = (backoff * 2).min(Duration::from_secs(10));
                backoff
            }
        };
        // Wait without holding the keys, so the agent can drop them meanwhile.
        let wanted = current.wanted.clone();
        drop(current);
        tokio::select! {
            () = wanted.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// The check of the envelope against its assertion: the caller and the capability.
pub(crate) fn matches_envelope(
    claims: &AssertionClaims,
    source: Option<&str>,
    capability: &str,
) -> Result<(), AssertionError> {
    let source = source.unwrap_or("");
    if source != claims.sub {
        return Err(AssertionError::SourceMismatch {
            source_field: source.to_string(),
            asserted: claims.sub.clone(),
        });
    }
    if capability != claims.cap {
        return Err(AssertionError::CapabilityMismatch {
            envelope: capability.to_string(),
            asserted: claims.cap.clone(),
        });
    }
    Ok(())
}
