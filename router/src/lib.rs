//! The router (DESIGN §3): turns "I need `order.query`" into a reliable call to
//! a healthy instance, and every failure into a stable answer.
//!
//! - [`watch`] feeds the immutable [`snapshot`] from the registry's Watch stream.
//! - [`envelope`] parses and checks the request envelope at the edge.
//! - [`service`] runs the pipeline: ACL, version resolve, schema check, then
//!   [`select`] (WRR, least connections, consistent hash) over [`health`]- and
//!   [`breaker`]-aware candidates, [`forward`] with the deadline, [`retry`] rules.
//! - [`error`] holds the stable codes; [`http`] and [`openapi`] are the API.
//!
//! Architecture invariant: the request path never calls the registry, etcd or
//! Redis, takes no global lock and never compiles a schema.

pub mod breaker;
pub mod clock;
pub mod config;
pub mod envelope;
pub mod error;
pub mod forward;
pub mod front;
pub mod health;
pub mod histogram;
pub mod http;
mod json;
pub mod metrics;
pub mod openapi;
pub mod retry;
pub mod select;
pub mod service;
pub mod snapshot;
pub mod tasks;
pub mod trace;
pub mod watch;

use std::future::Future;
use std::sync::Arc;

use agent_reach_access::{AclHandle, Authenticator};
use anyhow::Context;

pub use config::{RouterArgs, Settings, Tuning};
pub use service::RouterService;

/// The whole API as one axum router (tests drive it in-process).
pub fn app(service: Arc<RouterService>) -> axum::Router {
    http::routes(service)
}

/// Builds the policy, authenticator and service, and starts the registry
/// watch that feeds the snapshot (it stops when the service is dropped).
pub async fn build(settings: &Settings) -> anyhow::Result<Arc<RouterService>> {
    let metrics = metrics::Metrics::new().context("registering metrics")?;
    let acl = AclHandle::load_and_watch(&settings.acl, &metrics.registry)?;
    let auth = Authenticator::load(&settings.auth).map_err(anyhow::Error::msg)?;
    if !auth.is_enabled() {
        tracing::warn!(
            message = "Router runs WITHOUT authentication (--insecure-no-auth): every caller is trusted \
                       and the ACL is not enforced. Development only."
        );
    }
    let snapshot = Arc::new(snapshot::SnapshotHandle::new());
    tokio::spawn(watch::run(
        settings.registry.clone(),
        settings.registry_credential.clone(),
        snapshot.clone(),
        metrics.clone(),
    ));
    let tasks = match &settings.tasks {
        Some(tasks) => Some(Arc::new(
            tasks::Tasks::new(tasks, &metrics.registry).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let mut service = RouterService::new(settings.tuning.clone(), snapshot, acl, auth, metrics);
    if let Some(tasks) = &tasks {
        service.set_tasks(tasks.clone());
    }
    let service = Arc::new(service);
    if let Some(tasks) = tasks {
        // The worker holds the service weakly: it stops when the router is dropped.
        tokio::spawn(tasks::run_callbacks(Arc::downgrade(&tasks)));
        tokio::spawn(tasks::run_worker(Arc::downgrade(&service), tasks));
    }
    Ok(service)
}

/// Runs the router until `shutdown` resolves.
pub async fn run(args: RouterArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let settings = args
        .validate()
        .map_err(|problems| anyhow::anyhow!("invalid router configuration:\n  - {}", problems.join("\n  - ")))?;
    let service = build(&settings).await?;
    let threads = agent_reach_edge::serve::thread_count(settings.tuning.threads);
    tracing::info!(
        message = "Router listening.", address = %settings.listen, registry = %settings.registry, threads
    );
    serve_per_core(settings.listen, threads, service, shutdown).await
}

/// Serves on `threads` threads (0: one per core), each a single-threaded
/// runtime with its own `SO_REUSEPORT` listener on `addr` (see
/// [`agent_reach_edge::serve::per_core`]) behind the router's front door
/// ([`front`]): a request, its forwarded call and its answer stay on one
/// thread. Background work (the registry watch, ACL reload) stays on the
/// caller's runtime.
pub async fn serve_per_core(
    addr: std::net::SocketAddr,
    threads: usize,
    service: Arc<RouterService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    front::door(service).per_core("router", addr, threads, shutdown).await
}

/// Serves `service` on an already bound listener, behind the same front door
/// (tests bind port 0).
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<RouterService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    front::door(service)
        .serve(listener, shutdown)
        .await
        .context("router server failed")
}
