//! Finding the current primary through Redis Sentinel, as the Sentinel client
//! guidelines describe: ask each Sentinel in turn `SENTINEL
//! get-master-addr-by-name SERVICE`, take the first answer, and ask the one
//! that answered first next time. The caller then connects and checks `ROLE`
//! says `master` (a Sentinel's view can lag a failover by a moment), so a
//! demoted primary is never written to.
//!
//! Discovery runs when a connection is opened (at start, after a connection
//! broke, after a `READONLY` answer), never per request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use crate::redis_url::{HostPort, Nodes, RedisUrl, SentinelAuth};
use crate::tls::TlsFiles;

/// The Sentinels of one service.
pub struct Sentinels {
    sentinels: Vec<HostPort>,
    service: String,
    tls: Option<redis::TlsCertificates>,
    username: Option<String>,
    password: Option<String>,
    /// The Sentinel that answered last; asked first next time.
    preferred: AtomicUsize,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Sentinels {
    /// `None` when `url` names one server.
    pub fn from_url(url: &RedisUrl, tls: &TlsFiles) -> Option<Self> {
        let Nodes::Sentinel {
            sentinels,
            service,
            auth,
        } = &url.nodes
        else {
            return None;
        };
        let same = *auth == SentinelAuth::Same;
        Some(Self {
            sentinels: sentinels.clone(),
            service: service.clone(),
            tls: url.tls.then(|| tls.redis_certificates()),
            username: url.username.clone().filter(|_| same),
            password: url.password.clone().filter(|_| same),
            preferred: AtomicUsize::new(0),
        })
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    /// The primary's address as the first Sentinel that answers says, within
    /// `timeout` per Sentinel. The error names every Sentinel's failure.
    pub async fn primary(&self, timeout: Duration) -> Result<HostPort, String> {
        let count = self.sentinels.len();
        let first = self.preferred.load(Ordering::Relaxed) % count.max(1);
        let mut failures = Vec::new();
        for offset in 0..count {
            let index = (first + offset) % count;
            let sentinel = &self.sentinels[index];
            match tokio::time::timeout(timeout, self.ask(sentinel, timeout)).await {
                Ok(Ok(Some(primary))) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(primary);
                }
                Ok(Ok(None)) => failures.push(format!("{sentinel}: does not monitor a service `{}`", self.service)),
                Ok(Err(why)) => failures.push(format!("{sentinel}: {why}")),
                Err(_) => failures.push(format!("{sentinel}: no answer within {} ms", timeout.as_millis())),
            }
        }
        Err(format!(
            "no Sentinel named the primary of `{}` ({})",
            self.service,
            failures.join("; ")
        ))
    }

    async fn ask(&self, sentinel: &HostPort, timeout: Duration) -> Result<Option<HostPort>, String> {
        let addr = if self.tls.is_some() {
            ConnectionAddr::TcpTls {
                host: sentinel.host.clone(),
                port: sentinel.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(sentinel.host.clone(), sentinel.port)
        };
        let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(username) = &self.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        let info = addr
            .into_connection_info()
            .map_err(|error| error.to_string())?
            .set_redis_settings(settings);
        let client = match &self.tls {
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone()),
            None => redis::Client::open(info),
        }
        .map_err(|error| crate::error_chain(&error))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|error| crate::error_chain(&error))?;
        let answer: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.service)
            .query_async(&mut connection)
            .await
            .map_err(|error| crate::error_chain(&error))?;
        Ok(answer.map(|(host, port)| HostPort { host, port }))
    }
}

// === Primary ===

/// The primary's address as the Sentinels last said, followed in the
/// background. Connections compare [`Primary::generation`] (one atomic load)
/// with the one they were opened under and reopen when it moved, so a
/// failover is followed without a restart and without a Sentinel round trip
/// per request.
pub struct Primary {
    sentinels: Sentinels,
    address: std::sync::RwLock<Option<HostPort>>,
    generation: std::sync::atomic::AtomicU64,
    timeout: Duration,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary")
            .field("sentinels", &self.sentinels)
            .field("address", &self.address())
            .finish()
    }
}

/// How often the Sentinels are asked who the primary is. A failover takes
/// the Sentinels `down-after-milliseconds` plus an election (seconds); this
/// adds at most half a second to it.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(500);

impl Primary {
    /// `timeout` bounds each Sentinel's answer.
    pub fn new(sentinels: Sentinels, timeout: Duration) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            sentinels,
            address: std::sync::RwLock::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            timeout,
        })
    }

    /// Moves whenever the primary's address changes.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The last known address, if any Sentinel has answered yet.
    pub fn address(&self) -> Option<HostPort> {
        self.address
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The service name the Sentinels monitor.
    pub fn service(&self) -> &str {
        self.sentinels.service()
    }

    /// Asks the Sentinels now and records the answer; returns it with its generation.
    pub async fn refresh(&self) -> Result<(HostPort, u64), String> {
        let found = self.sentinels.primary(self.timeout).await?;
        let mut address = self.address.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if address.as_ref() != Some(&found) {
            if let Some(before) = address.as_ref() {
                tracing::warn!(
                    message = "Redis primary changed (Sentinel failover); reconnecting.",
                    service = %self.sentinels.service(),
                    before = %before,
                    now = %found,
                );
            }
            *address = Some(found.clone());
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        Ok((found, self.generation()))
    }

    /// The address to connect to: the known one, or the Sentinels' answer.
    pub async fn current(&self) -> Result<(HostPort, u64), String> {
        let generation = self.generation();
        match self.address() {
            Some(address) => Ok((address, generation)),
            None => self.refresh().await,
        }
    }

    /// Asks the Sentinels every [`FOLLOW_EVERY`] until the last other handle
    /// is dropped. Needs a Tokio runtime.
    pub fn follow(self: &std::sync::Arc<Self>) {
        let weak = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(FOLLOW_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(primary) = weak.upgrade() else { return };
                if let Err(error) = primary.refresh().await {
                    tracing::warn!(message = "No Sentinel answered; keeping the last known primary.", %error);
                }
            }
        });
    }
}
