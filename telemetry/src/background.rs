//! Where span export runs: a thread of its own, out of the serving threads' way.
//!
//! Exporting is background work (batching, protobuf encoding, a gRPC call per
//! batch) that wakes up in bursts. On a box whose cores are all serving
//! requests, each wake-up used to preempt a serving thread at once (the
//! scheduler favours a task that has just woken); on the router bench at 10 %
//! sampling the tracing router spent 2.6 us more CPU per request than the
//! untraced one, about half of it those preemptions. So the export task runs
//! on [`ExportThread`], a single-threaded runtime on a thread scheduled
//! `SCHED_BATCH` on Linux: it still gets its fair share of CPU (nothing
//! starves), but its wake-ups never preempt a running thread; it runs when a
//! serving thread waits for I/O, which on a busy proxy is microseconds later.
//! The span drainer thread (see `bursts`) runs the same way.

use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use anyhow::Context as _;
use opentelemetry::trace::TraceResult;
use opentelemetry::Context;
use opentelemetry_sdk::export::trace::SpanData;
use opentelemetry_sdk::trace::{Span, SpanProcessor};
use opentelemetry_sdk::Resource;

/// Lowers the calling thread to `SCHED_BATCH` (Linux; elsewhere nothing). A
/// thread may always do this to itself, so failure only means the thread keeps
/// preempting like any other; it is reported, not fatal.
pub(crate) fn run_in_background() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid, initialised sched_param that outlives the
        // call; pid 0 means the calling thread.
        let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if result != 0 {
            eprintln!(
                "agent-reach telemetry: cannot schedule thread `{}` as SCHED_BATCH \
                 (its wake-ups may preempt serving threads): {}",
                std::thread::current().name().unwrap_or("unnamed"),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A thread running a single-threaded Tokio runtime for the span exporter and
/// the batch processor's task. Stopped (and joined) by [`ExportThread::stop`]
/// or on drop.
#[derive(Debug)]
pub(crate) struct ExportThread {
    handle: tokio::runtime::Handle,
    stop: Mutex<Option<(tokio::sync::oneshot::Sender<()>, JoinHandle<()>)>>,
}

impl ExportThread {
    pub(crate) fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the span export runtime")?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("span-export".to_string())
            .spawn(move || {
                run_in_background();
                // Runs the export task (spawned through `handle`) until stopped;
                // a dropped sender stops it too.
                let _ = runtime.block_on(stopped);
            })
            .context("spawning the span export thread")?;
        Ok(Self {
            handle,
            stop: Mutex::new(Some((stop, thread))),
        })
    }

    /// The runtime to build the exporter and the batch processor in (its tasks
    /// and connections then live on this thread).
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Stops the runtime (tasks still on it are dropped) and joins the thread.
    /// Call after the batch processor has shut down.
    pub(crate) fn stop(&self) {
        let stop = self.stop.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some((stop, thread)) = stop {
            let _ = stop.send(());
            // Never called from the export thread itself (the processor's
            // shutdown is called by the provider's owner), so this cannot wait on itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for ExportThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A span processor (the SDK's batch processor) whose task runs on an
/// [`ExportThread`]; shutting it down stops the thread too.
#[derive(Debug)]
pub(crate) struct OnThread<P> {
    // Declared first: dropped (and so shut down by the provider) before the thread stops.
    inner: P,
    thread: ExportThread,
}

impl<P: SpanProcessor> OnThread<P> {
    /// Builds the processor with `build` inside a new export thread's runtime.
    pub(crate) fn start(build: impl FnOnce() -> anyhow::Result<P>) -> anyhow::Result<Self> {
        let thread = ExportThread::start()?;
        let inner = {
            let _runtime = thread.handle().enter();
            build()?
        };
        Ok(Self { inner, thread })
    }
}

impl<P: SpanProcessor> SpanProcessor for OnThread<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> TraceResult<()> {
        self.inner.force_flush()
    }

    fn shutdown(&self) -> TraceResult<()> {
        let result = self.inner.shutdown();
        self.thread.stop();
        result
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_on_a_batch_scheduled_thread_until_stopped() {
        let thread = ExportThread::start().unwrap();
        let (policy, name) = thread
            .handle()
            .block_on(thread.handle().spawn(async {
                #[cfg(target_os = "linux")]
                // SAFETY: reads the calling thread's policy; no pointers involved.
                let policy = unsafe { libc::sched_getscheduler(0) };
                #[cfg(not(target_os = "linux"))]
                let policy = 0;
                (policy, std::thread::current().name().map(str::to_string))
            }))
            .unwrap();
        assert_eq!(name.as_deref(), Some("span-export"));
        #[cfg(target_os = "linux")]
        assert_eq!(policy, libc::SCHED_BATCH);
        let _ = policy;
        thread.stop();
        // Stopped: the runtime is gone with its thread, so nothing spawned runs.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        drop(thread.handle().spawn(async move {
            let _ = tx.send(());
        }));
        assert!(rx.recv().is_err(), "a task ran after the export thread stopped");
        thread.stop(); // idempotent
    }
}
