//! Keeping an issuer's keys: OIDC discovery (`{issuer}/.well-known/openid-configuration`
//! names the `jwks_uri`), the JWKS fetched from there, refreshed in the
//! background. The request path only reads the last key set (one atomic
//! load) and, for a `kid` it does not know, asks for a refetch without
//! waiting for it: one refresher task per issuer does every fetch, at most
//! one at a time and no sooner than [`REFETCH_MIN_INTERVAL`] after the last,
//! so a stream of tokens with made-up `kid`s costs the issuer one request
//! every few seconds, and a request never waits on the network.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use super::keys::KeySet;

/// How often keys are fetched again when nothing asks sooner (an issuer
/// publishes a new key before it signs with it, so a rotation is usually
/// seen here first).
pub(crate) const REFRESH_INTERVAL: Duration = Duration::from_secs(300);
/// The least time between two fetches asked for by unknown `kid`s.
pub(crate) const REFETCH_MIN_INTERVAL: Duration = Duration::from_secs(2);
/// After a failed fetch, the first wait; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// A discovery document or JWKS larger than this is refused.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// The whole of one HTTP exchange with the issuer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One issuer's keys, shared by every authenticator of a service.
pub(crate) struct IssuerKeys {
    issuer: Arc<str>,
    current: ArcSwap<KeySet>,
    /// Wakes the refresher: a refetch asked for, or these keys dropped.
    wake: Arc<Notify>,
    /// A refetch was asked for and not yet begun (asks in between are one ask).
    asked: AtomicBool,
}

impl IssuerKeys {
    /// The keys of `issuer`, empty until the refresher spawned now on the
    /// current tokio runtime has fetched them. It stops once these keys are
    /// dropped.
    pub(crate) fn start(issuer: &str) -> Result<Arc<Self>, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "OIDC issuers are served from a tokio runtime (a bug: report it)".to_string())?;
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(|error| format!("cannot build the HTTP client for OIDC discovery: {error}"))?;
        let keys = Arc::new(Self {
            issuer: issuer.into(),
            current: ArcSwap::from_pointee(KeySet::default()),
            wake: Arc::new(Notify::new()),
            asked: AtomicBool::new(false),
        });
        runtime.spawn(refresh(Arc::downgrade(&keys), keys.wake.clone(), client));
        Ok(keys)
    }

    /// Keys that are never fetched (unit tests).
    #[cfg(test)]
    pub(crate) fn fixed(issuer: &str, set: KeySet) -> Arc<Self> {
        Arc::new(Self {
            issuer: issuer.into(),
            current: ArcSwap::from_pointee(set),
            wake: Arc::new(Notify::new()),
            asked: AtomicBool::new(false),
        })
    }

    /// Whether a refetch was asked for and not yet begun (unit tests).
    #[cfg(test)]
    pub(crate) fn refetch_asked(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }

    pub(crate) fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key set as last fetched (one atomic load).
    pub(crate) fn current(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.current.load()
    }

    /// Asks the refresher for a fetch soon (a token named a `kid` not in the
    /// set); returns at once.
    pub(crate) fn ask_refetch(&self) {
        if !self.asked.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }
}

impl Drop for IssuerKeys {
    fn drop(&mut self) {
        // The refresher wakes, finds these keys gone and stops.
        self.wake.notify_one();
    }
}

/// The refresher of one issuer's keys: fetches now, then every
/// [`REFRESH_INTERVAL`], or when asked (not within [`REFETCH_MIN_INTERVAL`]
/// of the last fetch), or, after a failure, with a growing backoff. A failed
/// fetch keeps the keys it had.
async fn refresh(keys: Weak<IssuerKeys>, wake: Arc<Notify>, client: reqwest::Client) {
    let mut retry = RETRY_FIRST;
    loop {
        let Some(shared) = keys.upgrade() else { return };
        let issuer = shared.issuer.clone();
        shared.asked.store(false, Ordering::Release);
        drop(shared);
        let fetched_at = tokio::time::Instant::now();
        let next = match fetch_keys(&client, &issuer).await {
            Ok((set, skipped)) => {
                let Some(shared) = keys.upgrade() else { return };
                let before: Vec<String> = shared.current().kids().into_iter().map(str::to_string).collect();
                let after = set.kids();
                if before != after {
                    tracing::info!(
                        message = "OIDC issuer's keys fetched.",
                        issuer = %issuer,
                        kids = ?after,
                        previous = ?before,
                        skipped
                    );
                }
                shared.current.store(Arc::new(set));
                retry = RETRY_FIRST;
                REFRESH_INTERVAL
            }
            Err(error) => {
                tracing::warn!(
                    message = "Cannot fetch the OIDC issuer's keys; the keys fetched before stay in use.",
                    issuer = %issuer,
                    %error,
                    retry_in_ms = retry.as_millis() as u64
                );
                let wait = retry;
                retry = (retry * 2).min(RETRY_MAX);
                wait
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(fetched_at + next) => {}
            () = wake.notified() => {
                tokio::time::sleep_until(fetched_at + REFETCH_MIN_INTERVAL).await;
            }
        }
    }
}

/// Discovery, then the JWKS it names.
async fn fetch_keys(client: &reqwest::Client, issuer: &str) -> Result<(KeySet, usize), String> {
    #[derive(serde::Deserialize)]
    struct Discovery {
        issuer: String,
        jwks_uri: String,
    }
    let url = discovery_url(issuer);
    let discovery: Discovery = serde_json::from_slice(&get(client, &url).await?)
        .map_err(|error| format!("{url} is not an OpenID discovery document: {error}"))?;
    // OpenID Connect Discovery §4.3: the document must name the issuer it was fetched for.
    if discovery.issuer != issuer {
        return Err(format!(
            "{url} names the issuer `{}`, not `{issuer}`: configure the issuer exactly as it names itself",
            discovery.issuer.escape_debug()
        ));
    }
    super::check_issuer_url(&discovery.jwks_uri).map_err(|why| format!("its jwks_uri: {why}"))?;
    let document = get(client, &discovery.jwks_uri).await?;
    KeySet::from_jwks(&document).map_err(|why| format!("{}: {why}", discovery.jwks_uri))
}

/// `{issuer}/.well-known/openid-configuration` (OpenID Connect Discovery §4).
pub(crate) fn discovery_url(issuer: &str) -> String {
    format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'))
}

/// The body of a `GET url` answered 200, at most [`MAX_DOCUMENT_BYTES`].
async fn get(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let mut response = client
        .get(url)
        .header(http::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|error| format!("GET {url}: {error}"))?;
    if !response.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|error| format!("GET {url}: {error}"))? {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(format!("GET {url}: the answer exceeds {MAX_DOCUMENT_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
