//! The router (DESIGN §3): turns "I need `order.query`" into a reliable call to
//! a healthy instance, and every failure into a stable answer.
//!
//! The fast path: [`watch`] feeds the immutable [`snapshot`] from the
//! registry's Watch stream; a front door ([`http`], [`front`]) authenticates
//! and parses the envelope ([`envelope`]); [`service`] admits the call
//! ([`admission`]: ACL, capability, version, schema, deadline), then
//! [`select`]s among routable instances ([`health`]- and [`breaker`]-aware),
//! [`forward`]s with the deadline and classifies the [`outcome`], retrying by
//! the [`retry`] rules; every failure answers one shape ([`answer`]).
//! The slow path ([`tasks`]) sits beside it and uses it; [`app`] composes the
//! routes of both. This file is the crate's front: build, serve, run.
//!
//! Architecture invariant: the request path never calls the registry, etcd or
//! Redis, takes no global lock and never compiles a schema.

mod a2a;
mod admission;
mod answer;
mod app;
mod assertion;
mod breaker;
mod clock;
mod config;
mod console;
mod envelope;
mod error;
mod forward;
mod front;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod health;
mod histogram;
mod http;
mod json;
mod limits;
mod mcp;
mod metrics;
mod openapi;
mod operator;
mod outcome;
mod recent;
mod retry;
mod schema;
mod select;
mod service;
mod snapshot;
mod split;
mod sse;
mod stream;
mod tasks;
mod trace;
mod tuning;
mod watch;

use std::future::Future;
use std::sync::Arc;

use agent_reach_access::{AclHandle, Authenticator};
use anyhow::Context;

pub use assertion::{AssertionSettings, SigningKey};
pub use config::{RouterArgs, Settings};
pub use tasks::{TagLimit, TaskArgs, TasksSettings};
pub use tuning::Tuning;
pub use watch::RegistryCredential;

use service::RouterService;
use tasks::TaskService;

/// A built router: the fast path and, with `--redis`, the slow path beside
/// it. Cheap to clone; the background work (the registry watch, the task
/// worker) stops once every clone and every server using it is gone.
#[derive(Clone)]
pub struct Router {
    service: Arc<RouterService>,
    tasks: Option<Arc<TaskService>>,
    tls: Option<agent_reach_edge::tls::ServerTls>,
    /// The console's registry relay and cookie settings.
    console: Arc<console::Console>,
}

impl Router {
    /// The whole API as one axum router (tests drive it in-process).
    pub fn app(&self) -> axum::Router {
        app::routes(self.service.clone(), self.tasks.clone(), self.console.clone())
    }

    /// The front door serving this router: its hot route and every other route.
    fn door(&self) -> agent_reach_edge::front::Door<front::Invoke> {
        front::door(self.app(), self.service.clone(), self.tasks.clone(), self.tls.clone())
    }

    /// The instances the router can currently route to, by id (tests and diagnostics).
    pub fn routed_agent_ids(&self) -> Vec<String> {
        self.service.snapshot().load().agent_ids()
    }

    /// `capability`'s traffic split as the snapshot applies it: `(version,
    /// weight)` of the versions it can draw from, highest first (tests and diagnostics).
    pub fn routed_split(&self, capability: &str) -> Option<Vec<(String, u32)>> {
        let snapshot = self.service.snapshot().load();
        let capability = snapshot.capabilities.get(capability)?;
        let split = capability.split.as_ref()?;
        Some(
            split
                .shares()
                .iter()
                .filter_map(|(index, weight)| {
                    capability
                        .versions
                        .get(*index)
                        .map(|group| (group.version_text.clone(), *weight))
                })
                .collect(),
        )
    }

    /// An instance's static weight in the snapshot (tests and diagnostics).
    pub fn routed_weight(&self, agent_id: &str) -> Option<u32> {
        let snapshot = self.service.snapshot().load();
        let found = snapshot
            .capabilities
            .values()
            .flat_map(|capability| capability.versions.iter())
            .flat_map(|group| group.instances.iter())
            .find(|instance| instance.agent_id == agent_id)
            .map(|instance| instance.weight);
        found
    }
}

/// Every path of the OpenAPI description with its method (tests compare it with the routes).
pub fn openapi_paths() -> &'static [(&'static str, &'static str)] {
    static ALL: std::sync::OnceLock<Vec<(&'static str, &'static str)>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        openapi::PATHS
            .iter()
            .chain(console::openapi::PATHS.iter())
            .copied()
            .collect()
    })
}

/// Builds the policy, authenticator and service, starts the registry watch
/// that feeds the snapshot and, with `--redis`, the slow path's worker and
/// callback sender.
pub async fn build(settings: &Settings) -> anyhow::Result<Router> {
    let metrics = metrics::Metrics::new().context("registering metrics")?;
    let acl = AclHandle::load_and_watch(&settings.acl, &metrics.registry)?;
    let auth = Authenticator::load(&settings.auth)
        .map_err(anyhow::Error::msg)?
        .serving(&settings.tenant);
    if !auth.is_enabled() {
        tracing::warn!(
            message = "Router runs WITHOUT authentication (--insecure-no-auth): every caller is trusted \
                       and the ACL is not enforced. Development only."
        );
    }
    let tls = agent_reach_edge::tls::listener(settings.listener_tls.as_ref()).context("the listener's TLS")?;
    // An agent CA file that cannot be read is a start-up error; no system roots only
    // matter once an https:// agent is called (plain http:// agents need none).
    let agent_tls = match agent_reach_edge::tls::client_config(&settings.agent_tls, &[b"http/1.1"]) {
        Ok(config) => Ok(Arc::new(config)),
        Err(error) if settings.agent_tls.ca.is_none() && settings.agent_tls.identity.is_none() => Err(format!(
            "https:// agents cannot be verified: {error} (pass --agent-ca-file)"
        )),
        Err(error) => return Err(anyhow::Error::new(error).context("TLS to agents")),
    };
    // The registry's TLS files are checked now, so a typo fails the start, not every reconnect.
    for registry in &settings.registry {
        agent_reach_edge::tls::grpc_endpoint(registry, &settings.registry_tls).context("the registry's address")?;
    }
    let snapshot = Arc::new(snapshot::SnapshotHandle::new());
    tokio::spawn(watch::run(
        settings.registry.clone(),
        settings.registry_tls.clone(),
        settings.registry_credential.clone(),
        settings.tenant.clone(),
        snapshot.clone(),
        metrics.clone(),
    ));
    let tasks = match &settings.tasks {
        Some(tasks) => {
            // The slow path's keys are the served tenant's (`{prefix}:{tenant}:…`).
            let mut tasks = tasks.clone();
            tasks.store.tenant = settings.tenant.clone();
            Some(Arc::new(
                TaskService::new(&tasks, &metrics.registry).map_err(anyhow::Error::msg)?,
            ))
        }
        None => None,
    };
    let assertions =
        assertion::Assertions::load(settings.assertion.clone(), &metrics.registry).map_err(anyhow::Error::msg)?;
    assertions.watch();
    let limiter = limits::Limiter::new(&metrics.registry).context("registering metrics")?;
    let tuning = Tuning {
        serves_tls: settings.listener_tls.is_some(),
        ..settings.tuning.clone()
    };
    let service = Arc::new(RouterService::new(
        tuning,
        snapshot,
        admission::Admission::new(acl, limiter, &settings.tuning),
        auth,
        assertions,
        forward::Forwarder::new(settings.tuning.pool_idle_per_instance, agent_tls),
        metrics,
    ));
    if let Some(tasks) = &tasks {
        tasks.start(&service);
    }
    let console = Arc::new(console::Console::new(
        &settings.registry,
        &settings.registry_tls,
        tls.is_some(),
    ));
    Ok(Router {
        service,
        tasks,
        tls,
        console,
    })
}

/// Runs the router until `shutdown` resolves.
pub async fn run(args: RouterArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let settings = args
        .validate()
        .map_err(|problems| anyhow::anyhow!("invalid router configuration:\n  - {}", problems.join("\n  - ")))?;
    let router = build(&settings).await?;
    let threads = agent_reach_edge::serve::thread_count(settings.tuning.threads);
    tracing::info!(
        message = "Router listening.", address = %settings.listen, registry = ?settings.registry, threads
    );
    serve_per_core(settings.listen, threads, router, shutdown).await
}

/// Serves on `threads` threads (0: one per core), each a single-threaded
/// runtime with its own `SO_REUSEPORT` listener on `addr` (see
/// [`agent_reach_edge::serve::per_core`]) behind the router's front door
/// ([`front`]): a request, its forwarded call and its answer stay on one
/// thread. Background work (the registry watch, ACL reload, the task
/// worker) stays on the caller's runtime.
pub async fn serve_per_core(
    addr: std::net::SocketAddr,
    threads: usize,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    router.door().per_core("router", addr, threads, shutdown).await
}

/// Serves `router` on an already bound listener, behind the same front door
/// (tests bind port 0).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    router
        .door()
        .serve(listener, shutdown)
        .await
        .context("router server failed")
}
