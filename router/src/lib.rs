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
pub mod health;
pub mod http;
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
    let threads = match settings.tuning.threads {
        0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        threads => threads,
    };
    tracing::info!(
        message = "Router listening.", address = %settings.listen, registry = %settings.registry, threads
    );
    serve_per_core(settings.listen, threads, service, shutdown).await
}

/// Serves on `threads` threads, each a single-threaded runtime with its own
/// `SO_REUSEPORT` listener on `addr`: a request, its forwarded call and its
/// answer stay on one thread (no cross-thread wake-ups, no work stealing), the
/// way event-loop proxies such as HAProxy and nginx run. Background work (the
/// registry watch, ACL reload) stays on the caller's runtime.
pub async fn serve_per_core(
    addr: std::net::SocketAddr,
    threads: usize,
    service: Arc<RouterService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // SO_REUSEPORT would let a second router on the same port share it silently;
    // an exclusive probe bind fails with "address in use" instead, as operators expect.
    drop(std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut workers = Vec::with_capacity(threads);
    for index in 0..threads.max(1) {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
        .context("creating a listening socket")?;
        socket.set_reuseaddr(true).context("SO_REUSEADDR")?;
        socket.set_reuseport(true).context("SO_REUSEPORT")?;
        socket.bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        let listener = socket
            .listen(1024)
            .with_context(|| format!("cannot listen on {addr}"))?;
        let std_listener = listener.into_std().context("detaching the listener")?;
        let service = service.clone();
        let mut stopped = stopped.clone();
        let worker = std::thread::Builder::new()
            .name(format!("router-worker-{index}"))
            .spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("building a worker runtime")?;
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(std_listener).context("attaching the listener")?;
                    let until_stopped = async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    };
                    axum::serve(listener, app(service))
                        .tcp_nodelay(true)
                        .with_graceful_shutdown(until_stopped)
                        .await
                        .context("router server failed")
                })
            })
            .context("spawning a router worker thread")?;
        workers.push(worker);
    }
    shutdown.await;
    let _ = stop.send(true);
    tokio::task::spawn_blocking(move || {
        for worker in workers {
            match worker.join() {
                Ok(result) => result?,
                Err(_) => anyhow::bail!("a router worker thread panicked"),
            }
        }
        Ok(())
    })
    .await
    .context("joining router workers")?
}

/// Serves `service` on an already bound listener (tests bind port 0).
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<RouterService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, app(service))
        .tcp_nodelay(true)
        .with_graceful_shutdown(shutdown)
        .await
        .context("router server failed")
}
