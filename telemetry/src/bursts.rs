//! Hands ended spans to the SDK's batch processor in bursts, per thread.
//!
//! The batch processor takes each ended span through one channel, shared by
//! every serving thread, to its export thread. In OpenTelemetry 0.27 every
//! span sent there woke the export task: measured on the router bench, those
//! wake-ups (a futex and a context switch each) were most of what a sampled
//! request cost. (Since 0.28 the SDK's processor wakes its thread once per
//! full batch instead; the channel is still shared.) Here each thread collects
//! its ended spans and passes them on [`BURST`] at a time; a drainer thread
//! passes on what is left every [`DRAIN_INTERVAL`], and
//! `force_flush`/`shutdown` pass on everything first.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;

/// Spans a thread collects before passing them on (with 0.27's processor each
/// burst woke the export task once, an eventfd write and a context switch; at
/// 32 spans per burst that wake-up was still ~1 % of the router's CPU at 10 %
/// sampling). Well under the batch processor's queue
/// (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048).
const BURST: usize = 256;
/// How long a span may wait in a thread's buffer when traffic is light.
const DRAIN_INTERVAL: Duration = Duration::from_millis(500);

type Buffer = Arc<Mutex<Vec<SpanData>>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a buffer leaves a valid Vec behind.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct Shared<P> {
    inner: P,
    /// Every thread's buffer (taken only to register a thread and to drain).
    buffers: Mutex<Vec<Buffer>>,
    drainer: OnceLock<()>,
}

impl<P: SpanProcessor> Shared<P> {
    fn pass_on(&self, spans: Vec<SpanData>) {
        for span in spans {
            self.inner.on_end(span);
        }
    }

    fn drain(&self) {
        let mut buffers = lock(&self.buffers);
        for buffer in buffers.iter() {
            let spans = std::mem::take(&mut *lock(buffer));
            self.pass_on(spans);
        }
        // Buffers of threads that are gone (only this list holds them) and are empty.
        buffers.retain(|buffer| Arc::strong_count(buffer) > 1);
    }
}

/// Distinguishes processors sharing a thread (tests build several providers).
static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    /// This thread's buffer per processor.
    static LOCAL: std::cell::RefCell<Vec<(usize, Buffer)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A [`SpanProcessor`] in front of `P` (the SDK's batch processor). Clones
/// share the buffers and `P`.
#[derive(Debug)]
pub struct Bursts<P> {
    id: usize,
    shared: Arc<Shared<P>>,
}

impl<P> Clone for Bursts<P> {
    fn clone(&self) -> Self {
        Self {
            id: self.id,
            shared: self.shared.clone(),
        }
    }
}

impl<P: SpanProcessor + 'static> Bursts<P> {
    pub fn new(inner: P) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            shared: Arc::new(Shared {
                inner,
                buffers: Mutex::new(Vec::new()),
                drainer: OnceLock::new(),
            }),
        }
    }

    /// Adds `span` to this thread's buffer (registering the buffer on the
    /// thread's first span); a full buffer is taken out and returned.
    fn push(&self, span: SpanData) -> Option<Vec<SpanData>> {
        LOCAL.with(|local| {
            let mut local = local.borrow_mut();
            let index = match local.iter().position(|(id, _)| *id == self.id) {
                Some(index) => index,
                None => {
                    let buffer = Buffer::default();
                    lock(&self.shared.buffers).push(buffer.clone());
                    local.push((self.id, buffer));
                    local.len() - 1
                }
            };
            let mut spans = lock(&local[index].1);
            spans.push(span);
            (spans.len() >= BURST).then(|| std::mem::take(&mut *spans))
        })
    }

    /// Starts the drainer thread once; it ends when the processor is dropped.
    fn start_drainer(&self) {
        self.shared.drainer.get_or_init(|| {
            let shared: Weak<Shared<P>> = Arc::downgrade(&self.shared);
            let started = std::thread::Builder::new()
                .name("span-drainer".to_string())
                .spawn(move || {
                    // Background work like the export it feeds: never preempt a serving thread.
                    crate::background::run_in_background();
                    loop {
                        std::thread::sleep(DRAIN_INTERVAL);
                        match shared.upgrade() {
                            Some(shared) => shared.drain(),
                            None => return,
                        }
                    }
                });
            if let Err(error) = started {
                // Spans still go out in bursts and on flush; only light traffic waits longer.
                eprintln!("agent-reach telemetry: cannot start the span drainer thread: {error}");
            }
        });
    }
}

impl<P: SpanProcessor + 'static> SpanProcessor for Bursts<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.shared.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.start_drainer();
        if let Some(spans) = self.push(span) {
            self.shared.pass_on(spans);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.shared.drain();
        self.shared.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.shared.drain();
        self.shared.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called while the provider is built, before any span. When a clone
        // shares `shared` already, whoever cloned gave `P` its resource (see
        // `otlp::tracer_provider`).
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.inner.set_resource(resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug, Default)]
    struct Counting {
        ended: Arc<AtomicUsize>,
        resource_set: bool,
    }

    impl SpanProcessor for Counting {
        fn on_start(&self, _: &mut Span, _: &Context) {}
        fn on_end(&self, _: SpanData) {
            self.ended.fetch_add(1, Ordering::SeqCst);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
        fn set_resource(&mut self, _: &Resource) {
            self.resource_set = true;
        }
    }

    fn span() -> SpanData {
        SpanData {
            span_context: opentelemetry::trace::SpanContext::empty_context(),
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
        }
    }

    #[test]
    fn spans_go_on_in_bursts_and_all_of_them_on_flush() {
        let ended = Arc::new(AtomicUsize::new(0));
        let mut processor = Bursts::new(Counting {
            ended: ended.clone(),
            resource_set: false,
        });
        processor.set_resource(&Resource::builder_empty().build());
        assert!(processor.shared.inner.resource_set, "the resource reaches the exporter");
        for _ in 0..BURST - 1 {
            processor.on_end(span());
        }
        assert_eq!(ended.load(Ordering::SeqCst), 0, "held until a burst is full");
        processor.on_end(span());
        assert_eq!(ended.load(Ordering::SeqCst), BURST);
        // Spans ended on another thread are passed on by a flush from this one.
        std::thread::scope(|scope| {
            scope.spawn(|| processor.on_end(span()));
        });
        processor.on_end(span());
        processor.force_flush().unwrap();
        assert_eq!(ended.load(Ordering::SeqCst), BURST + 2);
    }
}
