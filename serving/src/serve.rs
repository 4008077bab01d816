//! Serving a service the way event-loop proxies (HAProxy, nginx) run: one
//! single-threaded runtime per thread, each with its own `SO_REUSEPORT`
//! listener on the same address. A request, the calls it makes (a forwarded
//! invoke, a Redis command on a per-thread connection) and its answer stay on
//! one thread: no cross-thread wake-ups, no work stealing, no shared run queue.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

/// What tells a worker's server to stop: it resolves once shutdown begins.
pub type Stopped = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs a server on `threads` threads (0: one per core) until `shutdown`
/// resolves, then lets every worker finish its open requests and joins them:
/// on each worker thread, `serve` gets that thread's listener and a future
/// that resolves when shutdown begins, and must return once it has finished
/// its open requests. `name` names the threads (`{name}-worker-{i}`) and the
/// errors. Background work (watches, sweepers, reloads) stays on the caller's
/// runtime.
pub async fn per_core<F, Fut>(
    name: &str,
    addr: SocketAddr,
    threads: usize,
    serve: F,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    F: Fn(tokio::net::TcpListener, Stopped) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let threads = thread_count(threads);
    // SO_REUSEPORT would let a second server on the same port share it silently;
    // an exclusive probe bind fails with "address in use" instead, as operators expect.
    drop(std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut workers = Vec::with_capacity(threads);
    for index in 0..threads {
        let listener = reuseport_listener(addr)?;
        let serve = serve.clone();
        let mut stopped = stopped.clone();
        let label = name.to_string();
        let worker = std::thread::Builder::new()
            .name(format!("{name}-worker-{index}"))
            .spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("building a worker runtime")?;
                runtime.block_on(async move {
                    let anchor = tokio::spawn(timer_anchor());
                    let listener = tokio::net::TcpListener::from_std(listener).context("attaching the listener")?;
                    let until_stopped: Stopped = Box::pin(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    });
                    let served = serve(listener, until_stopped)
                        .await
                        .with_context(|| format!("{label} server failed"));
                    anchor.abort();
                    served
                })
            })
            .with_context(|| format!("spawning a {name} worker thread"))?;
        workers.push(worker);
    }
    shutdown.await;
    let _ = stop.send(true);
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        for worker in workers {
            match worker.join() {
                Ok(result) => result?,
                Err(_) => anyhow::bail!("a {name} worker thread panicked"),
            }
        }
        Ok(())
    })
    .await
    .context("joining worker threads")?
}

/// How far ahead a worker's timer anchor keeps the time driver's next wake-up.
const TIMER_ANCHOR: Duration = Duration::from_millis(100);

/// Keeps a timer due within [`TIMER_ANCHOR`] on the worker's runtime at all
/// times, so that registering a request's deadline timer costs no syscall.
///
/// Tokio's time driver remembers, when its thread goes to sleep, the earliest
/// timer it must wake for; a timer registered later that is due *earlier* than
/// that makes it write its `eventfd` to re-plan (even from its own thread,
/// tokio-rs/tokio#5207). With no timer pending, that is every new timer: under
/// load the router's per-attempt deadline did it on a third of its requests.
/// With this anchor pending, only deadlines shorter than 100 ms still do; the
/// price is ten wake-ups a second on an idle worker.
async fn timer_anchor() {
    loop {
        tokio::time::sleep(TIMER_ANCHOR).await;
    }
}

/// The number of serving threads `threads` asks for: itself, or one per core for 0.
pub fn thread_count(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        threads => threads,
    }
}

fn reuseport_listener(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
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
    listener.into_std().context("detaching the listener")
}
