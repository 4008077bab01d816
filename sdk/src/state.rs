//! What an agent's parts share: its settings ([`Config`]) and its live state
//! ([`Shared`]: handlers, links, dedup, in-flight count, status, lease), read
//! by the inbound server and written by the lifecycle task and the handle.
//!
//! The status an agent reports is its lifecycle phase (`starting`, `ready`,
//! `draining`) and, while `ready`, its load: the heavier of what the SDK sees
//! (in-flight deliveries against `max_concurrency`, [`LoadThresholds`]) and
//! what the program reported ([`Load`]).

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
    pub(crate) load_thresholds: LoadThresholds,
    pub(crate) drain_timeout: Duration,
}

/// Load the program reports for itself ([`Agent::report_load`](crate::Agent::report_load)):
/// what the SDK cannot see, such as a full GPU queue or a rate-limited upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Load {
    /// Routable, but routers prefer others (`busy`).
    Busy,
    /// Routers send it traffic only when no `ready`/`busy` instance can take it (`overloaded`).
    Overloaded,
}

/// Fractions of `max_concurrency` in flight at which the SDK reports the
/// agent `busy` and `overloaded` by itself (defaults 0.75 and 0.95, as the
/// Python SDK's). An instance is busy once `inflight ≥ ⌈max × busy⌉`.
///
/// ```
/// use agent_reach_sdk::LoadThresholds;
/// let thresholds = LoadThresholds { busy: 0.5, overloaded: 1.0 };
/// assert_eq!(thresholds.at(4), (2, 4)); // busy from 2 in flight, overloaded at 4
/// assert_eq!(LoadThresholds::default().at(256), (192, 244));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadThresholds {
    pub busy: f64,
    pub overloaded: f64,
}

impl Default for LoadThresholds {
    fn default() -> Self {
        Self {
            busy: 0.75,
            overloaded: 0.95,
        }
    }
}

impl LoadThresholds {
    /// What is wrong with these thresholds, if anything.
    pub(crate) fn problem(&self) -> Option<String> {
        let valid = 0.0 < self.busy && self.busy <= self.overloaded && self.overloaded <= 1.0;
        (!valid).then(|| {
            format!(
                "load thresholds need 0 < busy ({}) <= overloaded ({}) <= 1",
                self.busy, self.overloaded
            )
        })
    }

    /// In-flight counts at which `busy` and `overloaded` begin for a
    /// concurrency limit of `max` (each at least 1, busy never above overloaded).
    pub fn at(&self, max: usize) -> (usize, usize) {
        // Whole thousandths, so 0.07 × 100 is 7, not 7.000000000000001 rounded up to 8.
        let at = |fraction: f64| {
            let permille = (fraction * 1000.0).round().clamp(0.0, 1000.0) as usize;
            (max.saturating_mul(permille)).div_ceil(1000).max(1)
        };
        let busy = at(self.busy);
        (busy, at(self.overloaded).max(busy))
    }
}

/// State shared by the server, the lifecycle task and the [`Agent`] handle.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// Checks that a delivery came through the router (`None`: the development switch is on).
    pub(crate) keys: Option<Arc<Keys>>,
    pub(crate) handlers: Vec<Handler>,
    pub(crate) links: Arc<Links>,
    pub(crate) dedup: Dedup,
    /// Preemptible deliveries running now, by request id: the flag a pause request sets.
    pub(crate) pauses: std::sync::Mutex<std::collections::HashMap<String, Arc<std::sync::atomic::AtomicBool>>>,
    pub(crate) inflight: AtomicUsize,
    /// The fewest deliveries in flight since the last heartbeat: what the
    /// heartbeat reports ([`Shared::take_sustained_inflight`]).
    sustained_inflight: AtomicUsize,
    /// Lifecycle phase: `starting`, `ready` or `draining`.
    phase: AtomicU8,
    /// [`Load`] the program reported (0 none, 1 busy, 2 overloaded).
    reported_load: AtomicU8,
    /// The level the in-flight count last crossed into (0 ready, 1 busy, 2
    /// overloaded), so a delivery wakes the lifecycle only when it changes.
    automatic_load: AtomicU8,
    /// In-flight counts at which `busy` and `overloaded` begin.
    busy_at: usize,
    overloaded_at: usize,
    /// Milliseconds since `started` of the last acknowledged heartbeat (0 = none).
    last_heartbeat: AtomicU64,
    started: Instant,
    pub(crate) lease_id: AtomicI64,
    pub(crate) status_changed: Notify,
}

impl Shared {
    /// A new agent's state: `starting`, no lease yet, nothing in flight.
    pub(crate) fn new(config: Config, keys: Option<Arc<Keys>>, handlers: Vec<Handler>, links: Links) -> Self {
        let (busy_at, overloaded_at) = config.load_thresholds.at(config.max_concurrency);
        Self {
            config,
            keys,
            handlers,
            links: Arc::new(links),
            dedup: Dedup::new(10_000, Duration::from_secs(600)),
            pauses: std::sync::Mutex::new(std::collections::HashMap::new()),
            inflight: AtomicUsize::new(0),
            sustained_inflight: AtomicUsize::new(0),
            phase: AtomicU8::new(status_index(Status::Starting)),
            reported_load: AtomicU8::new(0),
            automatic_load: AtomicU8::new(0),
            busy_at,
            overloaded_at,
            last_heartbeat: AtomicU64::new(0),
            started: Instant::now(),
            lease_id: AtomicI64::new(0),
            status_changed: Notify::new(),
        }
    }

    /// The status to report: the phase, or while `ready` the heavier of the
    /// automatic and the reported load.
    pub(crate) fn status(&self) -> Status {
        let phase = self.phase();
        if phase != Status::Ready {
            return phase;
        }
        let level = self
            .level_of(self.inflight.load(Ordering::Acquire))
            .max(self.reported_load.load(Ordering::Acquire));
        match level {
            0 => Status::Ready,
            1 => Status::Busy,
            _ => Status::Overloaded,
        }
    }

    /// `starting`, `ready` or `draining`.
    pub(crate) fn phase(&self) -> Status {
        status_at(self.phase.load(Ordering::Acquire))
    }

    /// Whether deliveries are served: after `mark_ready` and before draining.
    pub(crate) fn accepts_traffic(&self) -> bool {
        self.phase() == Status::Ready
    }

    pub(crate) fn set_phase(&self, phase: Status) {
        self.phase.store(status_index(phase), Ordering::Release);
        self.status_changed.notify_one();
    }

    /// The program's own report (`None` clears it).
    pub(crate) fn report_load(&self, load: Option<Load>) {
        let level = match load {
            None => 0,
            Some(Load::Busy) => 1,
            Some(Load::Overloaded) => 2,
        };
        if self.reported_load.swap(level, Ordering::AcqRel) != level {
            self.status_changed.notify_one();
        }
    }

    fn level_of(&self, inflight: usize) -> u8 {
        if inflight >= self.overloaded_at {
            2
        } else if inflight >= self.busy_at {
            1
        } else {
            0
        }
    }

    /// Called as a delivery starts and ends: wakes the lifecycle when the
    /// in-flight count crossed a threshold (two atomics otherwise).
    pub(crate) fn inflight_changed(&self, inflight: usize) {
        // Only a decrement can lower it (it never exceeds the count since the reset).
        self.sustained_inflight.fetch_min(inflight, Ordering::AcqRel);
        let level = self.level_of(inflight);
        if self.automatic_load.swap(level, Ordering::AcqRel) != level {
            self.status_changed.notify_one();
        }
    }

    /// The in-flight count a heartbeat reports: the fewest in flight since
    /// the previous heartbeat, and the count now for the next one. Not the
    /// count at the instant: that samples whichever short call happens to be
    /// running, and routers would steer away from an instance for a whole
    /// heartbeat interval because of a call that ended a millisecond later
    /// (their own calls they count themselves, DESIGN §3.4). The minimum is
    /// the load that lasted the whole interval, which is what another router
    /// cannot see.
    pub(crate) fn take_sustained_inflight(&self) -> usize {
        let now = self.inflight.load(Ordering::Acquire);
        self.sustained_inflight.swap(now, Ordering::AcqRel).min(now)
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
