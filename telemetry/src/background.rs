//! Where span export runs: threads of their own, out of the serving threads' way.
//!
//! Exporting is background work (batching, protobuf encoding, a gRPC call per
//! batch) that wakes up in bursts. On a box whose cores are all serving
//! requests, each wake-up used to preempt a serving thread at once (the
//! scheduler favours a task that has just woken); on the router bench at 10 %
//! sampling the tracing router spent 2.6 us more CPU per request than the
//! untraced one, about half of it those preemptions. So every thread export
//! runs on is scheduled `SCHED_BATCH` on Linux: it still gets its fair share of
//! CPU (nothing starves), but its wake-ups never preempt a running thread; it
//! runs when a serving thread waits for I/O, which on a busy proxy is
//! microseconds later. Those threads are:
//! - the SDK's batch processor thread, which collects ended spans, converts a
//!   batch and blocks on its export; it lowers itself on its first export
//!   ([`InBackground`]);
//! - [`ExportThread`], a single-threaded runtime for the gRPC channel's
//!   connection and request tasks (tonic needs a Tokio runtime);
//! - the span drainer thread (see `bursts`).

use std::cell::Cell;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
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

thread_local! {
    /// Whether [`InBackground`] has lowered this thread already.
    static LOWERED: Cell<bool> = const { Cell::new(false) };
}

/// A span exporter whose calling thread is lowered to `SCHED_BATCH` on its
/// first export: the SDK's batch processor spawns its thread itself and calls
/// `export` only on it.
#[derive(Debug)]
pub(crate) struct InBackground<E>(pub(crate) E);

impl<E: SpanExporter> SpanExporter for InBackground<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        if !LOWERED.with(|lowered| lowered.replace(true)) {
            run_in_background();
        }
        self.0.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// A thread running a single-threaded Tokio runtime for the span exporter's
/// gRPC channel. Stopped (and joined) by [`ExportThread::stop`] or on drop.
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
                // Runs the channel's tasks (spawned through `handle`) until
                // stopped; a dropped sender stops it too.
                let _ = runtime.block_on(stopped);
            })
            .context("spawning the span export thread")?;
        Ok(Self {
            handle,
            stop: Mutex::new(Some((stop, thread))),
        })
    }

    /// The runtime to build the exporter in (its channel's tasks and
    /// connections then live on this thread).
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

/// A span processor (the SDK's batch processor) whose exporter's channel runs
/// on an [`ExportThread`]; shutting it down stops the thread too.
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

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        // The processor exports what it still holds first, which needs the channel.
        let result = self.inner.shutdown_with_timeout(timeout);
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

    /// The calling thread's scheduling policy and name.
    type Caller = (i32, Option<String>);

    /// Each export's [`Caller`].
    #[derive(Debug, Default)]
    struct Callers(std::sync::Arc<Mutex<Vec<Caller>>>);

    impl SpanExporter for Callers {
        fn export(&self, _: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            #[cfg(target_os = "linux")]
            // SAFETY: reads the calling thread's policy; no pointers involved.
            let policy = unsafe { libc::sched_getscheduler(0) };
            #[cfg(not(target_os = "linux"))]
            let policy = 0;
            let name = std::thread::current().name().map(str::to_string);
            self.0.lock().unwrap().push((policy, name));
            std::future::ready(Ok(()))
        }
    }

    #[test]
    fn the_batch_processors_own_thread_exports_in_the_background() {
        let callers = Callers::default();
        let seen = callers.0.clone();
        let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(InBackground(callers)).build();
        let span_context = opentelemetry::trace::SpanContext::new(
            opentelemetry::trace::TraceId::from(7_u128),
            opentelemetry::trace::SpanId::from(2_u64),
            opentelemetry::trace::TraceFlags::SAMPLED,
            false,
            Default::default(),
        );
        processor.on_end(SpanData {
            span_context,
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: opentelemetry::trace::SpanKind::Internal,
            name: "test".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: Default::default(),
        });
        processor.force_flush().unwrap();
        processor.shutdown().unwrap();
        let seen = seen.lock().unwrap();
        let [(policy, name)] = &seen[..] else {
            panic!("one export: {seen:?}");
        };
        assert_ne!(
            name.as_deref(),
            std::thread::current().name(),
            "exported on the processor's thread"
        );
        #[cfg(target_os = "linux")]
        assert_eq!(*policy, libc::SCHED_BATCH);
        let _ = policy;
    }
}
