//! Callbacks: a finished task's result envelope POSTed to the caller's URL,
//! signed, retried on a schedule (by default after 2, 4, 8 and 16 s: five
//! attempts), then parked in the dead-letter stream — never dropped. The
//! schedule lives in Redis (see `store`), so any router sends any callback.
//!
//! Signature (header `X-Agent-Reach-Signature`): `t=<unix seconds>,v1=<hex>`
//! where `<hex>` is HMAC-SHA256 over `"<t>.<body>"` with the secret named by
//! the callback's `secret_ref` (or the default secret). A receiver recomputes
//! it, compares in constant time, and rejects old timestamps to stop replays.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use serde_json::Value;

use crate::model::Callback;
use crate::store::{now_ms, TaskStore, TaskStoreError};

pub const SIGNATURE_HEADER: &str = "x-agent-reach-signature";
pub const TASK_HEADER: &str = "x-agent-reach-task-id";
/// An A2A push config's `token`, sent back with each notification.
pub const A2A_TOKEN_HEADER: &str = "x-a2a-notification-token";

#[derive(Debug, Clone)]
pub struct CallbackConfig {
    /// Signing secrets by name (`secret_ref`).
    pub secrets: HashMap<String, Vec<u8>>,
    /// Used when a callback names no secret.
    pub default_secret: Vec<u8>,
    /// Waits between attempts; attempts = waits + 1.
    pub schedule: Vec<Duration>,
    /// Allow loopback and private-range targets (tests, single-host setups).
    pub allow_private_targets: bool,
    pub timeout: Duration,
}

impl CallbackConfig {
    pub fn new(default_secret: Vec<u8>) -> Self {
        Self {
            secrets: HashMap::new(),
            default_secret,
            schedule: [2, 4, 8, 16].map(Duration::from_secs).to_vec(),
            allow_private_targets: false,
            timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CallbackError {
    #[error("callback URL `{0}` is not an http(s) URL with a host")]
    InvalidUrl(String),
    #[error(
        "callback target `{0}` is in a loopback or private range; the router does not call those unless configured to"
    )]
    ForbiddenTarget(String),
    #[error("callback `secret_ref` `{0}` names no configured secret")]
    UnknownSecret(String),
}

impl CallbackError {
    /// The stable code of the API error.
    pub fn code(&self) -> &'static str {
        match self {
            CallbackError::InvalidUrl(_) => "INVALID_CALLBACK",
            CallbackError::ForbiddenTarget(_) => "CALLBACK_TARGET_FORBIDDEN",
            CallbackError::UnknownSecret(_) => "UNKNOWN_CALLBACK_SECRET",
        }
    }
}

fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64 // 100.64.0.0/10 (CGNAT)
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xfe00) == 0xfc00 // unique local
                || (v6.segments()[0] & 0xffc0) == 0xfe80 // link local
                || v6.to_ipv4_mapped().is_some_and(|v4| is_private(IpAddr::V4(v4)))
        }
    }
}

/// Signs `body` as the receiver will check it.
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={timestamp},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Checks a signature header in constant time; `max_age` bounds replays.
pub fn verify(secret: &[u8], header: &str, body: &[u8], now: u64, max_age: Duration) -> bool {
    let mut timestamp = None;
    let mut signature = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<u64>().ok(),
            Some(("v1", value)) => signature = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return false;
    };
    if now.abs_diff(timestamp) > max_age.as_secs() {
        return false;
    }
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&signature).is_ok()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// What one call of [`Deliverer::send_due`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackOutcome {
    Delivered {
        attempt: u32,
    },
    /// This attempt failed; the next is scheduled at `due_ms`.
    Retrying {
        attempt: u32,
        due_ms: u64,
    },
    /// The last attempt failed; the result is in the dead-letter stream.
    DeadLettered {
        attempts: u32,
    },
    /// Nothing to send (the task expired or has no callback).
    Dropped,
}

/// How the notification of a callback set through A2A (`Callback::a2a`) is
/// written: the task as the protocol's `StreamResponse` (set by the A2A door,
/// which owns the protocol's shapes; until it is, the result envelope).
pub type NotificationBody = std::sync::Arc<dyn Fn(&crate::model::Task) -> String + Send + Sync>;

pub struct Deliverer {
    config: CallbackConfig,
    http: reqwest::Client,
    a2a_body: std::sync::OnceLock<NotificationBody>,
}

impl Deliverer {
    pub fn new(config: CallbackConfig) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            // A callback target must not bounce us somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| format!("cannot build the callback client: {error}"))?;
        Ok(Self {
            config,
            http,
            a2a_body: std::sync::OnceLock::new(),
        })
    }

    fn secret(&self, callback: &Callback) -> Result<&[u8], CallbackError> {
        match &callback.secret_ref {
            None => Ok(&self.config.default_secret),
            Some(name) => self
                .config
                .secrets
                .get(name)
                .map(Vec::as_slice)
                .ok_or_else(|| CallbackError::UnknownSecret(name.clone())),
        }
    }

    /// Validates a callback at submission: URL shape, known secret, and a
    /// target outside private ranges (resolved now, and again at delivery).
    pub async fn check(&self, callback: &Callback) -> Result<(), CallbackError> {
        self.secret(callback)?;
        self.check_target(&callback.url).await
    }

    async fn check_target(&self, url: &str) -> Result<(), CallbackError> {
        let parsed = url::Url::parse(url).map_err(|_| CallbackError::InvalidUrl(url.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(CallbackError::InvalidUrl(url.to_string()));
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| CallbackError::InvalidUrl(url.to_string()))?;
        if self.config.allow_private_targets {
            return Ok(());
        }
        let port = parsed.port_or_known_default().unwrap_or(80);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addresses = tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| CallbackError::InvalidUrl(url.to_string()))?;
        for address in addresses {
            if is_private(address.ip()) {
                return Err(CallbackError::ForbiddenTarget(url.to_string()));
            }
        }
        Ok(())
    }

    /// Makes one attempt at a due callback from the durable schedule and
    /// records what comes next: done, the next attempt (after 2, 4, 8, 16 s by
    /// default), or the dead-letter stream after the last. Any router may call
    /// this for any scheduled task; the schedule's lease keeps it to one.
    pub async fn send_due(&self, store: &TaskStore, member: &str) -> Result<CallbackOutcome, TaskStoreError> {
        // `{task id}` for the task's callback, `{task id}#{config id}` for an A2A push config.
        let (task_id, config_id) = crate::store::schedule_member(member);
        let task = match store.get(task_id).await {
            Ok(task) => task,
            // Expired with its retention: nothing left to send.
            Err(TaskStoreError::NotFound(_)) => {
                store.reschedule_callback(member, None).await?;
                return Ok(CallbackOutcome::Dropped);
            }
            Err(error) => return Err(error),
        };
        let callback = match config_id {
            None => task.callback.as_ref(),
            // Deleted since it was scheduled: nothing to send.
            Some(id) => task.push_config(id),
        };
        let Some(callback) = callback else {
            store.reschedule_callback(member, None).await?;
            return Ok(CallbackOutcome::Dropped);
        };
        let attempt = store.count_callback_attempt(member).await?;
        let body = match (&callback.a2a, self.a2a_body.get()) {
            (Some(_), Some(write)) => write(&task),
            _ => task.result.as_ref().map(Value::to_string).unwrap_or_default(),
        };
        let outcome = match self.attempt(callback, task_id, &body).await {
            Ok(()) => CallbackOutcome::Delivered { attempt },
            Err(error) => match self
                .config
                .schedule
                .get(usize::try_from(attempt).unwrap_or(usize::MAX).saturating_sub(1))
            {
                Some(wait) => {
                    tracing::warn!(message = "Callback attempt failed; scheduled again.", task_id, attempt, %error);
                    let due_ms = now_ms() + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                    store.reschedule_callback(member, Some(due_ms)).await?;
                    return Ok(CallbackOutcome::Retrying { attempt, due_ms });
                }
                None => {
                    tracing::error!(
                        message = "Callback undeliverable; result moved to the dead-letter stream.",
                        task_id, attempts = attempt, url = %callback.url, %error
                    );
                    // If this fails the callback stays scheduled and is tried again.
                    store.dead_letter(&task, config_id, &callback.url, &error).await?;
                    CallbackOutcome::DeadLettered { attempts: attempt }
                }
            },
        };
        store.reschedule_callback(member, None).await?;
        Ok(outcome)
    }

    /// Sets how A2A push notifications are written (the first setting holds;
    /// `false` when one was set already).
    pub fn set_a2a_body(&self, body: NotificationBody) -> bool {
        self.a2a_body.set(body).is_ok()
    }

    /// The waits between attempts (attempts = waits + 1).
    pub fn schedule(&self) -> &[Duration] {
        &self.config.schedule
    }

    /// One delivery attempt: signed POST of `body` to the callback's URL.
    pub async fn attempt(&self, callback: &Callback, task_id: &str, body: &str) -> Result<(), String> {
        let secret = self.secret(callback).map_err(|error| error.to_string())?;
        self.check_target(&callback.url)
            .await
            .map_err(|error| error.to_string())?;
        // An A2A notification is the protocol's object (spec §4.3.3's media type).
        let media_type = match (&callback.a2a, self.a2a_body.get()) {
            (Some(_), Some(_)) => "application/a2a+json",
            _ => "application/json",
        };
        let mut request = self
            .http
            .post(&callback.url)
            .header("content-type", media_type)
            .header(TASK_HEADER, task_id)
            .header(SIGNATURE_HEADER, sign(secret, unix_now(), body.as_bytes()));
        // What an A2A push config asked to be sent back (checked header-safe when it was set).
        if let Some(push) = &callback.a2a {
            if let Some(token) = &push.token {
                request = request.header(A2A_TOKEN_HEADER, token);
            }
            if let Some(authentication) = &push.authentication {
                let value = match &authentication.credentials {
                    Some(credentials) => format!("{} {credentials}", authentication.scheme),
                    None => authentication.scheme.clone(),
                };
                request = request.header(reqwest::header::AUTHORIZATION, value);
            }
        }
        let response = request
            .body(body.to_string())
            .send()
            .await
            .map_err(|error| format!("cannot reach {}: {error}", callback.url))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("{} answered {}", callback.url, response.status()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_and_expire() {
        let header = sign(b"secret", 1_000, b"{\"a\":1}");
        assert!(verify(
            b"secret",
            &header,
            b"{\"a\":1}",
            1_010,
            Duration::from_secs(300)
        ));
        assert!(!verify(
            b"other",
            &header,
            b"{\"a\":1}",
            1_010,
            Duration::from_secs(300)
        ));
        assert!(!verify(
            b"secret",
            &header,
            b"{\"a\":2}",
            1_010,
            Duration::from_secs(300)
        ));
        assert!(
            !verify(b"secret", &header, b"{\"a\":1}", 5_000, Duration::from_secs(300)),
            "too old"
        );
        assert!(!verify(b"secret", "garbage", b"", 1_000, Duration::from_secs(300)));
    }

    #[test]
    fn private_ranges() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.5.4",
            "169.254.1.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "2001:4860:4860::8888"] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn targets_are_checked() {
        let deliverer = Deliverer::new(CallbackConfig::new(b"s".to_vec())).unwrap();
        let loopback = Callback {
            url: "http://127.0.0.1:9/hook".into(),
            secret_ref: None,
            a2a: None,
        };
        assert_eq!(
            deliverer.check(&loopback).await,
            Err(CallbackError::ForbiddenTarget(loopback.url.clone()))
        );
        let bad = Callback {
            url: "ftp://x/y".into(),
            secret_ref: None,
            a2a: None,
        };
        assert!(matches!(deliverer.check(&bad).await, Err(CallbackError::InvalidUrl(_))));
        let unknown = Callback {
            url: "http://127.0.0.1:9/hook".into(),
            secret_ref: Some("nope".into()),
            a2a: None,
        };
        assert_eq!(
            deliverer.check(&unknown).await,
            Err(CallbackError::UnknownSecret("nope".into()))
        );
    }

    #[test]
    fn push_credentials_never_reach_a_log() {
        let push = crate::PushConfig {
            id: "hook".into(),
            token: Some("t0k-secret".into()),
            authentication: Some(crate::PushAuthentication {
                scheme: "Bearer".into(),
                credentials: Some("cred-secret".into()),
            }),
        };
        let logged = format!("{push:?}");
        assert!(logged.contains("hook") && logged.contains("Bearer"), "{logged}");
        assert!(
            !logged.contains("t0k-secret") && !logged.contains("cred-secret"),
            "{logged}"
        );
    }
}
