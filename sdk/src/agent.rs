//! An agent's lifecycle: serve, register, heartbeat, re-register, drain,
//! deregister.
//!
//! Registration starts as `starting`: the router sends no traffic until
//! [`Agent::mark_ready`]. Heartbeats ride one gRPC keep-alive stream and
//! carry status and in-flight count, every TTL/3 and at once when the status
//! to report changes (a load change at most every 500 ms, so a load hovering
//! at a threshold is not a stream of registry writes); `LEASE_EXPIRED` or a
//! registry outage leads to re-registration by itself. [`Agent::shutdown`] (or a signal in
//! [`Agent::run_until_signal`]) reports `draining`, waits (bounded) for
//! in-flight work, deregisters and stops serving.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_proto::context::contexts_client::ContextsClient;
use agent_reach_proto::registry as pb;
use agent_reach_proto::registry::registry_client::RegistryClient;
use axum::serve::ListenerExt as _;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;
use tracing::Instrument;

use crate::call::RouterLink;
use crate::ctx::Links;
use crate::error::StartError;
use crate::handler::{Handler, IntoHandler};
use crate::registries::Registries;
use crate::state::{Config, Load, LoadThresholds, Shared, Status};
use crate::verify::{KeySource, Keys};

/// Builds an agent: identity, where it listens and is reached, which services
/// it talks to, and its handlers.
///
/// ```no_run
/// # async fn example(order_query: agent_reach_sdk::Handler) -> Result<(), Box<dyn std::error::Error>> {
/// use agent_reach_sdk::Agent;
/// let agent = Agent::builder("order_query", "order_query-1")
///     .listen("127.0.0.1:9101".parse()?)
///     .endpoint("http://127.0.0.1:9101")
///     .registry("http://127.0.0.1:7400")
///     .router("http://127.0.0.1:7500")
///     .token(std::env::var("AGENT_REACH_TOKEN")?)
///     .weight(3)
///     .handler(order_query)
///     .start()
///     .await?;
/// agent.mark_ready();
/// agent.run_until_signal().await;
/// # Ok(()) }
/// ```
pub struct AgentBuilder {
    config: Config,
    router: Option<String>,
    context: Option<String>,
    token: Option<String>,
    handlers: Vec<Handler>,
    keys: Option<KeySource>,
    issuer: String,
    accept_unverified: bool,
    /// The only CAs trusted for `https://` service URLs (none: the system's roots).
    ca_file: Option<std::path::PathBuf>,
    /// Serve the agent over TLS with these files.
    tls: Option<agent_reach_serving::tls::ServerFiles>,
}

impl AgentBuilder {
    /// Address to listen on (default `127.0.0.1:0`, a free port).
    pub fn listen(mut self, address: SocketAddr) -> Self {
        self.config.listen = address;
        self
    }

    /// The externally reachable base URL the router should use (e.g. the
    /// service's DNS name). Defaults to the bound address, which is only right
    /// when router and agent share a host: set it in production.
    pub fn endpoint(mut self, url: &str) -> Self {
        self.config.endpoint = Some(url.to_string());
        self
    }

    /// The registry, or several separated by commas (`http://r1:7400,http://r2:7400`):
    /// one is used at a time, and any failure moves to the next.
    pub fn registry(mut self, url: &str) -> Self {
        self.config.registry = url
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(str::to_string)
            .collect();
        self
    }

    /// The router, for [`Ctx::call`](crate::Ctx::call).
    pub fn router(mut self, url: &str) -> Self {
        self.router = Some(url.to_string());
        self
    }

    /// The context service (gRPC), for [`Ctx::context`](crate::Ctx::context).
    pub fn context_service(mut self, url: &str) -> Self {
        self.context = Some(url.to_string());
        self
    }

    /// The bearer token (JWT) whose `sub` is this agent's name.
    pub fn token(mut self, token: String) -> Self {
        self.token = Some(token);
        self
    }

    /// Relative capacity (1..=1000): map it to concurrency, e.g. GPU node 8, CPU node 2.
    pub fn weight(mut self, weight: u32) -> Self {
        self.config.weight = weight;
        self
    }

    /// Lease TTL in seconds (heartbeats go every TTL/3).
    pub fn ttl_s(mut self, ttl_s: u32) -> Self {
        self.config.ttl_s = ttl_s;
        self
    }

    pub fn tag(mut self, key: &str, value: &str) -> Self {
        self.config.tags.insert(key.to_string(), value.to_string());
        self
    }

    /// Requests served at once (default 256); beyond it the agent answers 503
    /// `OVERLOADED` (the router tries elsewhere).
    pub fn max_concurrency(mut self, limit: usize) -> Self {
        self.config.max_concurrency = limit.max(1);
        self
    }

    /// When the SDK reports the agent `busy` and `overloaded` by itself, as
    /// fractions of [`max_concurrency`](Self::max_concurrency) in flight
    /// (default 0.75 and 0.95; routers prefer other instances over a busy one
    /// and send an overloaded one traffic only as a last resort).
    ///
    /// ```no_run
    /// # async fn example(handler: agent_reach_sdk::Handler) -> Result<(), Box<dyn std::error::Error>> {
    /// use agent_reach_sdk::{Agent, LoadThresholds};
    /// let agent = Agent::builder("summarizer", "summarizer-1")
    ///     .registry("http://127.0.0.1:7400")
    ///     .router("http://127.0.0.1:7500")
    ///     .token(std::env::var("AGENT_REACH_TOKEN")?)
    ///     .max_concurrency(8)
    ///     .load_thresholds(LoadThresholds { busy: 0.5, overloaded: 1.0 }) // busy at 4, overloaded at 8
    ///     .handler(handler)
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn load_thresholds(mut self, thresholds: LoadThresholds) -> Self {
        self.config.load_thresholds = thresholds;
        self
    }

    /// How long shutdown waits for in-flight work before deregistering anyway.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config.drain_timeout = timeout;
        self
    }

    pub fn handler(mut self, handler: impl IntoHandler) -> Self {
        self.handlers.push(handler.into_handler());
        self
    }

    /// Where the router's assertion keys are published (default: the router's
    /// `/.well-known/jwks.json`).
    /// Trust only the CAs in this PEM file for `https://` registry, router
    /// (calls and its JWKS) and context service URLs; default: the system's
    /// roots. Verification is never off.
    pub fn ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Serve the agent over TLS with this certificate chain and private key
    /// (PEM files, reread every 10 s: a renewed pair applies to new
    /// connections). The endpoint then defaults to `https://`; routers must
    /// trust the certificate's CA (`--agent-ca-file`).
    pub fn tls(mut self, cert: impl Into<std::path::PathBuf>, key: impl Into<std::path::PathBuf>) -> Self {
        self.tls = Some(agent_reach_serving::tls::ServerFiles {
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
        });
        self
    }

    pub fn assertion_keys_url(mut self, url: &str) -> Self {
        self.keys = Some(KeySource::Url(url.to_string()));
        self
    }

    /// A JWKS file holding the router's assertion keys, instead of fetching them.
    pub fn assertion_keys_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.keys = Some(KeySource::File(path.into()));
        self
    }

    /// The issuer the router's assertions must name (default `agent-reach-router`).
    pub fn assertion_issuer(mut self, issuer: &str) -> Self {
        self.issuer = issuer.to_string();
        self
    }

    /// DEVELOPMENT ONLY: serve calls without the router's assertion (anyone
    /// who reaches the endpoint can call the agent as anyone). Also set by
    /// `AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED=1`. Logs a loud warning.
    pub fn insecure_accept_unverified_calls(mut self) -> Self {
        self.accept_unverified = true;
        self
    }

    /// Starts serving and registering (as `starting`); call
    /// [`Agent::mark_ready`] once the agent's own initialisation is done.
    pub async fn start(mut self) -> Result<Agent, StartError> {
        let mut problems = Vec::new();
        if self.handlers.is_empty() {
            problems.push("no handler: add at least one with .handler(...)".to_string());
        }
        if self.config.registry.is_empty() {
            problems.push("no registry URL: call .registry(URL)".to_string());
        }
        if let Some(problem) = self.config.load_thresholds.problem() {
            problems.push(problem);
        }
        let Some(token) = self.token else {
            return Err(StartError::Config(
                "no token: call .token(JWT whose sub is the agent name)".to_string(),
            ));
        };
        if !problems.is_empty() {
            return Err(StartError::Config(problems.join("; ")));
        }
        let trust = agent_reach_serving::tls::ClientFiles {
            ca: self.ca_file.clone(),
            identity: None,
        };
        let lazy = |url: &str| -> Result<Channel, StartError> {
            Ok(agent_reach_serving::tls::grpc_endpoint(url, &trust)
                .map_err(|error| StartError::Config(format!("invalid URL `{url}`: {error}")))?
                .connect_timeout(Duration::from_secs(2))
                .connect_lazy())
        };
        let mut clients = Vec::with_capacity(self.config.registry.len());
        for url in &self.config.registry {
            clients.push((url.clone(), RegistryClient::new(lazy(url)?)));
        }
        let registry = Arc::new(Registries::new(clients));
        let context = match &self.context {
            Some(url) => Some(ContextsClient::new(lazy(url)?)),
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(self.config.listen)
            .await
            .map_err(|error| StartError::Listen {
                address: self.config.listen.to_string(),
                error,
            })?;
        let bound = listener.local_addr().map_err(|error| StartError::Listen {
            address: self.config.listen.to_string(),
            error,
        })?;
        let http = crate::call::http_client(self.ca_file.as_deref())?;
        let tls = agent_reach_serving::tls::listener(self.tls.as_ref())
            .map_err(|error| StartError::Config(format!("the agent's TLS: {error}")))?;
        if tls.is_some() && self.config.endpoint.is_none() {
            self.config.endpoint = Some(format!("https://{bound}"));
        }
        let keys = if self.accept_unverified || crate::verify::insecure_from_env() {
            tracing::warn!(
                message = "ASSERTION VERIFICATION IS OFF: this agent serves calls that did not come through \
                           the router, from anyone who reaches its endpoint, as anyone. Development only.",
                agent_id = %self.config.agent_id
            );
            None
        } else {
            let source = match (self.keys, &self.router) {
                (Some(source), _) => source,
                (None, Some(router)) => {
                    KeySource::Url(format!("{}/.well-known/jwks.json", router.trim_end_matches('/')))
                }
                (None, None) => {
                    return Err(StartError::Config(
                        "the agent verifies the router's assertions but knows no keys: call .router(URL) \
                         (its keys are fetched from URL/.well-known/jwks.json) or .assertion_keys_file(PATH), \
                         or, for development only, .insecure_accept_unverified_calls()"
                            .to_string(),
                    ))
                }
            };
            Some(Keys::start(source, self.issuer, http.clone()))
        };
        let registry_http = http.clone();
        let links = Links {
            router: self.router.map(|router| RouterLink {
                http,
                router,
                token: token.clone(),
            }),
            context,
            token,
        };
        let shared = Arc::new(Shared::new(self.config, keys, self.handlers, links));
        let (stop_serving, serving_stopped) = watch::channel(false);
        let app = crate::server::routes(shared.clone());
        let server = tokio::spawn(async move {
            let mut stopped = serving_stopped;
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            let served = match tls {
                None => {
                    // No Nagle: answers must not wait for the router's delayed ACK.
                    let listener = listener.tap_io(|connection| {
                        if let Err(error) = connection.set_nodelay(true) {
                            // Only latency suffers: the connection is still served.
                            tracing::debug!(message = "Cannot set TCP_NODELAY on an accepted connection.", %error);
                        }
                    });
                    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
                }
                // TLS: the services' own front door (no hot routes: every request to `app`).
                Some(tls) => {
                    let door = agent_reach_serving::front::Door {
                        hot: agent_reach_serving::front::NoHotRoutes,
                        app,
                        body_limit: 0,
                        tls: Some(tls),
                    };
                    door.serve(listener, shutdown).await
                }
            };
            if let Err(error) = served {
                tracing::error!(message = "Agent server failed.", %error);
            }
        });
        let (stop_lifecycle, lifecycle_stop) = watch::channel(false);
        let lifecycle = tokio::spawn(lifecycle(shared.clone(), registry.clone(), bound, lifecycle_stop));
        Ok(Agent {
            shared,
            http: registry_http,
            registry,
            bound,
            server,
            lifecycle,
            stop_serving,
            stop_lifecycle,
        })
    }
}

/// A running agent.
pub struct Agent {
    pub(crate) shared: Arc<Shared>,
    /// The HTTP client (the registry's access requests; the CA file's trust).
    pub(crate) http: reqwest::Client,
    registry: Arc<Registries>,
    bound: SocketAddr,
    server: tokio::task::JoinHandle<()>,
    lifecycle: tokio::task::JoinHandle<()>,
    stop_serving: watch::Sender<bool>,
    stop_lifecycle: watch::Sender<bool>,
}

impl Agent {
    /// Starts building an agent named `name` (the identity in its token and
    /// the ACL) with the instance id `agent_id` (unique per running instance).
    pub fn builder(name: &str, agent_id: &str) -> AgentBuilder {
        AgentBuilder {
            config: Config {
                name: name.to_string(),
                agent_id: agent_id.to_string(),
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                endpoint: None,
                registry: Vec::new(),
                weight: 1,
                ttl_s: 15,
                tags: BTreeMap::new(),
                max_concurrency: 256,
                load_thresholds: LoadThresholds::default(),
                drain_timeout: Duration::from_secs(30),
            },
            router: None,
            context: None,
            token: None,
            handlers: Vec::new(),
            keys: None,
            issuer: agent_reach_access::assertion::DEFAULT_ISSUER.to_string(),
            accept_unverified: false,
            ca_file: None,
            tls: None,
        }
    }

    /// The address the agent serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.bound
    }

    pub fn agent_id(&self) -> &str {
        &self.shared.config.agent_id
    }

    pub fn status(&self) -> Status {
        self.shared.status()
    }

    /// Whether the registry has acknowledged a heartbeat in the last TTL.
    pub fn is_registered(&self) -> bool {
        self.shared
            .last_heartbeat_age()
            .is_some_and(|age| age < Duration::from_secs(u64::from(self.shared.config.ttl_s)))
    }

    /// The agent's own initialisation is done: accept traffic. Until then the
    /// instance is registered as `starting` and the router sends it nothing.
    ///
    /// ```no_run
    /// # async fn example(agent: agent_reach_sdk::Agent) {
    /// // load models, warm caches ...
    /// agent.mark_ready();
    /// assert_eq!(agent.status(), agent_reach_sdk::Status::Ready);
    /// # }
    /// ```
    pub fn mark_ready(&self) {
        if self.shared.phase() == Status::Starting {
            self.shared.set_phase(Status::Ready);
        }
    }

    /// Reports load the SDK cannot see (a full GPU queue, a rate-limited
    /// upstream). The heavier of this and the SDK's own view (in-flight
    /// deliveries against [`LoadThresholds`]) is what the registry and routers
    /// see, sent at once; [`Agent::clear_load`] leaves it to the SDK again.
    ///
    /// ```no_run
    /// # async fn example(agent: agent_reach_sdk::Agent) {
    /// use agent_reach_sdk::{Load, Status};
    /// agent.report_load(Load::Busy);
    /// assert_eq!(agent.status(), Status::Busy);
    /// agent.clear_load();
    /// # }
    /// ```
    pub fn report_load(&self, load: Load) {
        self.shared.report_load(Some(load));
    }

    /// Withdraws [`Agent::report_load`]: the SDK's own view of the load applies alone.
    pub fn clear_load(&self) {
        self.shared.report_load(None);
    }

    /// A handle that reports load from elsewhere (a handler, a monitoring
    /// task), for as long as the agent runs, e.g. after
    /// [`Agent::run_until_signal`] took the agent.
    pub fn load_reporter(&self) -> LoadReporter {
        LoadReporter {
            shared: self.shared.clone(),
        }
    }

    /// Drains and deregisters: reports `draining`, waits for in-flight work
    /// (up to the drain timeout), deregisters, and stops serving.
    ///
    /// ```no_run
    /// # async fn example(agent: agent_reach_sdk::Agent) {
    /// tokio::signal::ctrl_c().await.ok();
    /// agent.shutdown().await; // or simply agent.run_until_signal().await
    /// # }
    /// ```
    pub async fn shutdown(self) {
        self.shared.set_phase(Status::Draining);
        let drain_until = Instant::now() + self.shared.config.drain_timeout;
        while self.shared.inflight.load(Ordering::Acquire) > 0 && Instant::now() < drain_until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.stop_lifecycle.send(true);
        let _ = self.lifecycle.await;
        // Each registry gets one try, the one in use first.
        for _ in 0..self.registry.len() {
            let (url, mut registry) = self.registry.current();
            let url = url.to_string();
            let request = self.shared.authed(pb::DeregisterRequest {
                agent_id: self.shared.config.agent_id.clone(),
            });
            match tokio::time::timeout(Duration::from_secs(5), registry.deregister(request)).await {
                Ok(Ok(_)) => {
                    tracing::info!(message = "Deregistered.", agent_id = %self.shared.config.agent_id);
                    break;
                }
                Ok(Err(status)) if status.code() != tonic::Code::Unavailable => {
                    tracing::warn!(message = "Deregistration failed; the lease will expire.", registry = %url, error = %status);
                    break;
                }
                Ok(Err(status)) => {
                    tracing::warn!(message = "Deregistration failed; the lease will expire unless another registry takes it.", registry = %url, error = %status)
                }
                Err(_) => {
                    tracing::warn!(message = "Deregistration timed out; the lease will expire unless another registry takes it.", registry = %url)
                }
            }
            self.registry.failed();
        }
        let _ = self.stop_serving.send(true);
        let _ = self.server.await;
    }

    /// Serves until SIGINT or SIGTERM, then [`Agent::shutdown`].
    pub async fn run_until_signal(self) {
        let interrupt = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            if let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            } else {
                let _ = interrupt.await;
            }
        }
        #[cfg(not(unix))]
        let _ = interrupt.await;
        self.shutdown().await;
    }
}

/// Reports an agent's load from anywhere; see [`Agent::report_load`]. Cheap to clone.
#[derive(Clone)]
pub struct LoadReporter {
    shared: Arc<Shared>,
}

impl LoadReporter {
    /// As [`Agent::report_load`].
    pub fn report(&self, load: Load) {
        self.shared.report_load(Some(load));
    }

    /// As [`Agent::clear_load`].
    pub fn clear(&self) {
        self.shared.report_load(None);
    }
}

impl std::fmt::Debug for LoadReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadReporter")
            .field("agent_id", &self.shared.config.agent_id)
            .finish()
    }
}

fn register_request(shared: &Shared, bound: SocketAddr) -> pb::RegisterRequest {
    let config = &shared.config;
    pb::RegisterRequest {
        agent_id: config.agent_id.clone(),
        name: config.name.clone(),
        endpoint: shared.endpoint(bound),
        protocol: "http".to_string(),
        weight: config.weight,
        tags: config.tags.clone().into_iter().collect(),
        ttl_s: config.ttl_s,
        status: match shared.status() {
            // A draining agent never registers anew.
            Status::Draining => Status::Starting.as_str().to_string(),
            status => status.as_str().to_string(),
        },
        capabilities: shared
            .handlers
            .iter()
            .map(|handler| {
                let descriptor = &handler.descriptor;
                pb::CapabilityDescriptor {
                    name: descriptor.capability.clone(),
                    version: descriptor.version.clone(),
                    description: descriptor.description.clone(),
                    input_schema_json: descriptor.input_schema.to_string(),
                    output_schema_json: descriptor.output_schema.to_string(),
                    timeout_ms: descriptor.timeout_ms.unwrap_or(0),
                    skip_output_check: !descriptor.check_output,
                }
            })
            .collect(),
    }
}

/// Why a keep-alive session ended.
enum SessionEnd {
    Stop,
    LeaseExpired,
    StreamBroken,
}

/// Register, keep alive, re-register on `LEASE_EXPIRED` or after the registry
/// comes back; with capped exponential backoff between failures.
async fn lifecycle(shared: Arc<Shared>, registry: Arc<Registries>, bound: SocketAddr, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    let mut registered = false;
    // Failures in a row: the next registry is tried at once until each
    // failed once, then the backoff applies.
    let mut failures = 0usize;
    loop {
        if *stop.borrow() {
            return;
        }
        if !registered {
            let (url, mut client) = registry.current();
            let url = url.to_string();
            let span = tracing::info_span!("agent.register", otel.kind = "client", agent_id = %shared.config.agent_id);
            let request = span.in_scope(|| shared.authed(register_request(&shared, bound)));
            match client.register(request).instrument(span).await {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    shared.lease_id.store(answer.lease_id, Ordering::Release);
                    shared.heartbeat_acknowledged();
                    registered = true;
                    backoff = Duration::from_millis(100);
                    failures = 0;
                    tracing::info!(message = "Registered.", agent_id = %shared.config.agent_id, lease_id = answer.lease_id, registry = %url);
                }
                Err(status) => {
                    tracing::warn!(message = "Registration failed; retrying.", registry = %url, error = %status, retry_in = ?backoff);
                    registry.failed();
                    failures += 1;
                    if failures < registry.len() {
                        continue;
                    }
                    failures = 0;
                    if wait_or_stop(&mut stop, backoff).await {
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        let (_, client) = registry.current();
        match keep_alive_session(&shared, &client, &mut stop).await {
            SessionEnd::Stop => return,
            SessionEnd::LeaseExpired => {
                tracing::warn!(message = "Lease expired; registering again.", agent_id = %shared.config.agent_id);
                registered = false;
            }
            SessionEnd::StreamBroken => {
                registry.failed();
                let ttl = Duration::from_secs(u64::from(shared.config.ttl_s));
                if shared.last_heartbeat_age().is_some_and(|age| age < ttl) {
                    // The stream was serving: a fresh round of registries.
                    failures = 0;
                }
                failures += 1;
                if failures < registry.len() {
                    continue;
                }
                failures = 0;
                if wait_or_stop(&mut stop, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Sleeps for `duration`; true when asked to stop meanwhile.
async fn wait_or_stop(stop: &mut watch::Receiver<bool>, duration: Duration) -> bool {
    let stopped = tokio::select! {
        () = tokio::time::sleep(duration) => false,
        _ = stop.changed() => true,
    };
    stopped || *stop.borrow()
}

/// Load-driven status changes go out at most this often (phase changes, ready
/// and draining, at once), so a load hovering at a threshold is not a stream of
/// registry and etcd writes. The Python SDK spaces them the same.
const MIN_LOAD_REPORT_INTERVAL: Duration = Duration::from_millis(500);

async fn keep_alive_session(
    shared: &Arc<Shared>,
    registry: &RegistryClient<Channel>,
    stop: &mut watch::Receiver<bool>,
) -> SessionEnd {
    let interval = Duration::from_secs(u64::from((shared.config.ttl_s / 3).max(1)));
    let (sender, receiver) = mpsc::channel(8);
    // What the last heartbeat said, and when, for spacing load changes.
    let mut sent = (shared.phase(), shared.status(), Instant::now());
    let heartbeat = |shared: &Shared, sent: &mut (Status, Status, Instant)| {
        let status = shared.status();
        *sent = (shared.phase(), status, Instant::now());
        pb::KeepAliveRequest {
            agent_id: shared.config.agent_id.clone(),
            lease_id: shared.lease_id.load(Ordering::Acquire),
            status: status.as_str().to_string(),
            inflight: Some(u32::try_from(shared.take_sustained_inflight()).unwrap_or(u32::MAX)),
        }
    };
    // Queue the first heartbeat before opening: the stream opens with its first answer.
    if sender.try_send(heartbeat(shared, &mut sent)).is_err() {
        return SessionEnd::StreamBroken;
    }
    let mut client = registry.clone();
    let opened = tokio::time::timeout(
        Duration::from_secs(5),
        client.keep_alive(shared.authed(tokio_stream::wrappers::ReceiverStream::new(receiver))),
    )
    .await;
    let mut answers = match opened {
        Ok(Ok(answers)) => answers.into_inner(),
        Ok(Err(status)) => {
            tracing::warn!(message = "Cannot open the keep-alive stream.", error = %status);
            return SessionEnd::StreamBroken;
        }
        Err(_) => {
            tracing::warn!(message = "Opening the keep-alive stream timed out.");
            return SessionEnd::StreamBroken;
        }
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await; // the first heartbeat is already queued
                         // A load change that came too soon after the last report: sent at this instant.
    let mut deferred: Option<Instant> = None;
    loop {
        let due = deferred.unwrap_or_else(Instant::now);
        tokio::select! {
            // The flag only ever goes from false to true: any change means stop.
            _ = stop.changed() => return SessionEnd::Stop,
            _ = ticker.tick() => {
                deferred = None;
                if sender.send(heartbeat(shared, &mut sent)).await.is_err() {
                    return SessionEnd::StreamBroken;
                }
            }
            () = tokio::time::sleep_until(due.into()), if deferred.is_some() => {
                deferred = None;
                if shared.status() != sent.1 && sender.send(heartbeat(shared, &mut sent)).await.is_err() {
                    return SessionEnd::StreamBroken;
                }
            }
            () = shared.status_changed.notified() => {
                let (phase, status) = (shared.phase(), shared.status());
                if phase != sent.0 {
                    deferred = None;
                    if sender.send(heartbeat(shared, &mut sent)).await.is_err() {
                        return SessionEnd::StreamBroken;
                    }
                } else if status != sent.1 && deferred.is_none() {
                    let at = sent.2 + MIN_LOAD_REPORT_INTERVAL;
                    if at <= Instant::now() {
                        if sender.send(heartbeat(shared, &mut sent)).await.is_err() {
                            return SessionEnd::StreamBroken;
                        }
                    } else {
                        deferred = Some(at);
                    }
                }
            }
            answer = answers.next() => match answer {
                Some(Ok(answer)) => match answer.error {
                    None => shared.heartbeat_acknowledged(),
                    Some(error) if error.code == "LEASE_EXPIRED" => return SessionEnd::LeaseExpired,
                    Some(error) => tracing::warn!(message = "Heartbeat refused.", code = %error.code, reason = %error.message),
                },
                Some(Err(status)) => {
                    tracing::warn!(message = "Keep-alive stream failed.", error = %status);
                    return SessionEnd::StreamBroken;
                }
                None => return SessionEnd::StreamBroken,
            },
        }
    }
}
