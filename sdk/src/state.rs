//! What an agent's parts share: its settings ([`Config`]) and its live state
//! ([`Shared`]: handlers, links, dedup, in-flight count, status, lease), read
//! by the inbound server and written by the lifecycle task and the handle.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::ctx::Links;
use crate::dedup::Dedup;
use crate::handler::Handler;
use crate::verify::Keys;

/// What the agent tells the registry about itself: the shared vocabulary.
pub use agent_reach_proto::Status;

/// `status` as stored in an atomic: its place in [`Status::ALL`].
pub(crate) fn status_index(status: Status) -> u8 {
    // ALL lists every variant, so the position always exists.
    Status::ALL.iter().position(|known| *known == status).unwrap_or(0) as u8
}

fn status_at(index: u8) -> Status {
    // Only `status_index` writes the atomic, so the index is always in range.
    Status::ALL.get(usize::from(index)).copied().unwrap_or(Status::Starting)
}

/// Settings of one agent instance; see [`AgentBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) name: String,
    pub(crate) agent_id: String,
    pub(crate) listen: SocketAddr,
    pub(crate) endpoint: Option<String>,
    /// Registry URLs, used one at a time in this order (failover).
    pub(crate) registry: Vec<String>,
    pub(crate) weight: u32,
    pub(crate) ttl_s: u32,
    pub(crate) tags: BTreeMap<String, String>,
    pub(crate) max_concurrency: usize,
    pub(crate) drain_timeout: Duration,
}

/// State shared by the server, the lifecycle task and the [`Agent`] handle.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// Checks that a delivery came through the router (`None`: the development switch is on).
    pub(crate) keys: Option<Arc<Keys>>,
    pub(crate) handlers: Vec<Handler>,
    pub(crate) links: Arc<Links>,
    pub(crate) dedup: Dedup,
    pub(crate) inflight: AtomicUsize,
    status: AtomicU8,
    /// Milliseconds since `started` of the last acknowledged heartbeat (0 = none).
    last_heartbeat: AtomicU64,
    started: Instant,
    pub(crate) lease_id: AtomicI64,
    pub(crate) status_changed: Notify,
}

impl Shared {
    /// A new agent's state: `starting`, no lease yet, nothing in flight.
    pub(crate) fn new(config: Config, keys: Option<Arc<Keys>>, handlers: Vec<Handler>, links: Links) -> Self {
        Self {
            config,
            keys,
            handlers,
            links: Arc::new(links),
            dedup: Dedup::new(10_000, Duration::from_secs(600)),
            inflight: AtomicUsize::new(0),
            status: AtomicU8::new(status_index(Status::Starting)),
            last_heartbeat: AtomicU64::new(0),
            started: Instant::now(),
            lease_id: AtomicI64::new(0),
            status_changed: Notify::new(),
        }
    }

    pub(crate) fn status(&self) -> Status {
        status_at(self.status.load(Ordering::Acquire))
    }

    pub(crate) fn set_status(&self, status: Status) {
        self.status.store(status_index(status), Ordering::Release);
        self.status_changed.notify_one();
    }

    pub(crate) fn handler(&self, capability: &str, version: &str) -> Option<&Handler> {
        self.handlers
            .iter()
            .find(|handler| handler.descriptor.capability == capability && handler.descriptor.version == version)
            .or_else(|| {
                self.handlers
                    .iter()
                    .find(|handler| handler.descriptor.capability == capability)
            })
    }

    pub(crate) fn last_heartbeat_age(&self) -> Option<Duration> {
        match self.last_heartbeat.load(Ordering::Acquire) {
            0 => None,
            at => Some(self.started.elapsed().saturating_sub(Duration::from_millis(at))),
        }
    }

    pub(crate) fn heartbeat_acknowledged(&self) {
        let at = u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_heartbeat.store(at, Ordering::Release);
    }

    pub(crate) fn endpoint(&self, bound: SocketAddr) -> String {
        let base = self
            .config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("http://{bound}"));
        format!("{}/invoke", base.trim_end_matches('/'))
    }

    pub(crate) fn authed<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Ok(value) = format!("Bearer {}", self.links.token).parse() {
            request.metadata_mut().insert("authorization", value);
        }
        // W3C trace context in gRPC metadata: the registry's span joins the current trace.
        let traceparent = agent_reach_telemetry::propagation::traceparent(&tracing::Span::current());
        if let Some(value) = traceparent.and_then(|text| text.parse().ok()) {
            request.metadata_mut().insert("traceparent", value);
        }
        request
    }
}
