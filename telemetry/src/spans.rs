//! Spans recorded straight into the export pipeline, for request paths that
//! pay per request (the router's invoke, selection and attempt spans).
//!
//! A `tracing` span exported through `tracing-opentelemetry` goes through the
//! subscriber's registry, every layer's callbacks (the log formatter renders
//! its fields even when no line is logged), a field visitor per attribute and
//! an enter/exit per poll of the future it instruments; an SDK span adds a
//! sampler call, a shared context, a lock per attribute and a copy into the
//! exported form when it ends. Measured on the router bench, a sampled request
//! cost ~37 µs of router CPU through `tracing`, ~19 µs through SDK spans, ~7 µs
//! as recorded here (export included; `ROUTER_BENCH_SAMPLING=1.0`). Here
//! a span is the exported record itself ([`SpanData`]), filled in as the
//! request goes and handed to the service's span processor (the same per-thread
//! bursts, batch processor and OTLP exporter, with the same resource, as every
//! other span of the service) when it is dropped.
//!
//! Sampling: the configured sampler (`OTEL_TRACES_SAMPLER`) decides once, for
//! the request span, before anything is built. Child spans share that
//! decision: every standard sampler (parent-based, trace-id ratio, always
//! on/off) decides the same for a child of a sampled span of the same trace.
//!
//! Without an OpenTelemetry layer (no OTLP endpoint) nothing here builds
//! anything: [`start_request`] answers [`Head::Off`] after one relaxed atomic load.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

pub use opentelemetry::trace::SpanKind;
use opentelemetry::trace::{SpanContext, Status, TraceContextExt, TraceFlags, TraceId};
use opentelemetry::InstrumentationScope;
pub use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SamplingDecision, ShouldSample, SpanData};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::propagation::{active, remote_parent};

/// Where ended spans go: the span processor of the service's tracer provider.
pub type Deliver = Arc<dyn Fn(SpanData) + Send + Sync>;

/// Samples requests and records their spans for one tracer provider.
pub struct Recorder {
    /// The service's tracer provider's sampler.
    sampler: Box<dyn ShouldSample>,
    deliver: Deliver,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// The recorder of the service's tracer provider (the first one built).
static RECORDER: OnceLock<Recorder> = OnceLock::new();

pub(crate) fn install(recorder: Recorder) {
    let _ = RECORDER.set(recorder);
}

/// What the configured sampler decided about a request entering the service.
#[derive(Debug)]
pub enum Head {
    /// Spans are not exported at all.
    Off,
    /// Exported, but this request's trace is not in the sample: build nothing
    /// and tell the next hop so (`traceparent` flags `00`).
    NotSampled,
    /// In the sample: the request's span, already started.
    Sampled(RequestSpan),
}

/// The span of one request; delivered when the last clone is dropped. Child
/// spans started from it ([`RequestSpan::child`]) name it as their parent.
#[derive(Debug, Clone)]
pub struct RequestSpan {
    span_context: SpanContext,
    /// `None` for a parent that is someone else's (see [`current`]).
    recording: Option<Arc<Recording>>,
    recorder: &'static Recorder,
}

#[derive(Debug)]
struct Recording {
    data: Mutex<Option<SpanData>>,
    recorder: &'static Recorder,
}

/// A span under a [`RequestSpan`]; delivered when dropped.
#[derive(Debug)]
pub struct ChildSpan {
    data: Option<SpanData>,
    recorder: &'static Recorder,
}

/// Samples a request by its trace and, when it is kept, starts its span (kind
/// server) with the recorder of the service's tracer provider.
pub fn start_request(
    name: &'static str,
    traceparent: Option<&str>,
    trace_id: &str,
    attributes: impl FnOnce() -> Vec<KeyValue>,
) -> Head {
    match RECORDER.get().filter(|_| active()) {
        Some(recorder) => recorder.start_request(name, traceparent, trace_id, attributes),
        None => Head::Off,
    }
}

/// The current `tracing` span as the parent of recorded spans, when spans are
/// exported and that span is sampled: paths that run inside a `tracing` span
/// (an asynchronous task's delivery) get their attempts under it.
pub fn current() -> Option<RequestSpan> {
    let recorder = RECORDER.get().filter(|_| active())?;
    let span_context = tracing::Span::current().context().span().span_context().clone();
    (span_context.is_valid() && span_context.is_sampled()).then_some(RequestSpan {
        span_context,
        recording: None,
        recorder,
    })
}

impl Recorder {
    /// A recorder asking `sampler` (the one its tracer provider samples with)
    /// and handing ended spans to `deliver`.
    pub fn new(sampler: Box<dyn ShouldSample>, deliver: Deliver) -> Self {
        Self {
            sampler,
            deliver,
            scope: InstrumentationScope::builder("agent-reach").build(),
        }
    }

    /// [`start_request`] with this recorder.
    ///
    /// `traceparent` is the caller's header: when valid, the span continues
    /// that trace as a child of the caller's span and follows the caller's
    /// sampling decision as the configured sampler says (`parentbased_*`).
    /// Otherwise the request starts a trace with `trace_id` (32 hex digits, the
    /// id the service already generated and logs), so logs and spans agree.
    /// `attributes` are only built for a kept request.
    pub fn start_request(
        &'static self,
        name: &'static str,
        traceparent: Option<&str>,
        trace_id: &str,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Head {
        let parent = traceparent.and_then(remote_parent).unwrap_or_default();
        let parent_context = parent.span().span_context().clone();
        let trace_id = if parent_context.is_valid() {
            parent_context.trace_id()
        } else {
            // Not an id this service generated: a fresh one.
            TraceId::from_hex(trace_id)
                .ok()
                .filter(|id| *id != TraceId::INVALID)
                .unwrap_or_else(|| RandomIdGenerator::default().new_trace_id())
        };
        let decision = self
            .sampler
            .should_sample(Some(&parent), trace_id, name, &SpanKind::Server, &[], &[]);
        if !matches!(decision.decision, SamplingDecision::RecordAndSample) {
            return Head::NotSampled;
        }
        let span_context = SpanContext::new(
            trace_id,
            RandomIdGenerator::default().new_span_id(),
            TraceFlags::SAMPLED,
            false,
            decision.trace_state,
        );
        let mut attributes = attributes();
        attributes.extend(decision.attributes);
        let data = self.data(
            name,
            SpanKind::Server,
            span_context.clone(),
            &parent_context,
            attributes,
        );
        Head::Sampled(RequestSpan {
            span_context,
            recording: Some(Arc::new(Recording {
                data: Mutex::new(Some(data)),
                recorder: self,
            })),
            recorder: self,
        })
    }

    fn data(
        &self,
        name: &'static str,
        kind: SpanKind,
        span_context: SpanContext,
        parent: &SpanContext,
        attributes: Vec<KeyValue>,
    ) -> SpanData {
        let now = SystemTime::now();
        SpanData {
            span_context,
            // `SpanId::INVALID` (and not remote) for a root.
            parent_span_id: parent.span_id(),
            // A caller's span (from its `traceparent`) is remote; ours are not.
            parent_span_is_remote: parent.is_remote(),
            span_kind: kind,
            name: Cow::Borrowed(name),
            start_time: now,
            end_time: now,
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: self.scope.clone(),
        }
    }

    fn end(&self, mut data: SpanData) {
        data.end_time = SystemTime::now();
        (self.deliver)(data);
    }
}

impl RequestSpan {
    /// Adds an attribute (no effect on a parent that is not ours).
    pub fn set(&self, attribute: KeyValue) {
        self.update(|data| data.attributes.push(attribute));
    }

    /// Renames the span once what it is about is known (the GenAI
    /// conventions name a span after its agent or tool: `invoke_agent
    /// {gen_ai.agent.name}`); sampling was decided under the first name.
    pub fn rename(&self, name: String) {
        self.update(|data| data.name = Cow::Owned(name));
    }

    /// Marks the request failed: `error.type` (OpenTelemetry semantic
    /// conventions) and an error status carrying `code`.
    pub fn fail(&self, code: &'static str) {
        self.update(|data| {
            data.attributes.push(KeyValue::new("error.type", code));
            data.status = Status::error(code);
        });
    }

    fn update(&self, change: impl FnOnce(&mut SpanData)) {
        if let Some(recording) = &self.recording {
            // A panic while holding the lock leaves a valid SpanData behind.
            if let Some(data) = recording.data.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                change(data);
            }
        }
    }

    /// Starts a span under this one.
    pub fn child(&self, name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> ChildSpan {
        let span_context = SpanContext::new(
            self.span_context.trace_id(),
            RandomIdGenerator::default().new_span_id(),
            TraceFlags::SAMPLED,
            false,
            self.span_context.trace_state().clone(),
        );
        ChildSpan {
            data: Some(
                self.recorder
                    .data(name, kind, span_context, &self.span_context, attributes),
            ),
            recorder: self.recorder,
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let data = self.data.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(data) = data {
            self.recorder.end(data);
        }
    }
}

impl ChildSpan {
    pub fn set(&mut self, attribute: KeyValue) {
        if let Some(data) = &mut self.data {
            data.attributes.push(attribute);
        }
    }

    /// The `traceparent` naming this span as the parent of the next hop.
    pub fn traceparent(&self) -> String {
        // `data` is only taken when the span is dropped.
        self.data
            .as_ref()
            .map(|data| crate::propagation::header(&data.span_context))
            .unwrap_or_default()
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        if let Some(data) = self.data.take() {
            self.recorder.end(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::SpanId;
    use opentelemetry_sdk::trace::Sampler;

    use super::*;

    fn recorder(sampler: Sampler) -> (&'static Recorder, Arc<Mutex<Vec<SpanData>>>) {
        let ended = Arc::new(Mutex::new(Vec::new()));
        let sink = ended.clone();
        let recorder = Recorder::new(Box::new(sampler), Arc::new(move |span| sink.lock().unwrap().push(span)));
        (Box::leak(Box::new(recorder)), ended)
    }

    #[test]
    fn request_spans_take_the_decided_trace_id_and_children_link_to_them() {
        let (recorder, ended) = recorder(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let decided = "4bf92f3577b34da6a3ce929d0e0e4736";
        let Head::Sampled(root) =
            recorder.start_request("invoke", None, decided, || vec![KeyValue::new("request_id", "r-1")])
        else {
            panic!("the sampler keeps roots");
        };
        assert_eq!(format!("{:032x}", root.span_context.trace_id()), decided);
        let mut child = root.child("attempt", SpanKind::Client, vec![KeyValue::new("attempt", 1_i64)]);
        let header = child.traceparent();
        assert!(header.starts_with(&format!("00-{decided}-")), "{header}");
        assert!(header.ends_with("-01"), "{header}");
        child.set(KeyValue::new("outcome", "succeeded"));
        drop(child);
        root.fail("AGENT_ERROR");
        assert_eq!(
            ended.lock().unwrap().len(),
            1,
            "the request span is delivered when it is dropped"
        );
        drop(root);

        let spans = std::mem::take(&mut *ended.lock().unwrap());
        let [attempt, invoke] = &spans[..] else {
            panic!("two spans: {spans:?}");
        };
        assert_eq!(invoke.name, "invoke");
        assert_eq!(invoke.span_kind, SpanKind::Server);
        assert_eq!(invoke.parent_span_id, SpanId::INVALID, "a root");
        assert!(!invoke.parent_span_is_remote && !attempt.parent_span_is_remote);
        assert_eq!(format!("{:032x}", invoke.span_context.trace_id()), decided);
        assert_eq!(invoke.status, Status::error("AGENT_ERROR"));
        assert!(invoke.attributes.contains(&KeyValue::new("error.type", "AGENT_ERROR")));
        assert!(invoke.attributes.contains(&KeyValue::new("request_id", "r-1")));
        assert_eq!(attempt.name, "attempt");
        assert_eq!(attempt.span_kind, SpanKind::Client);
        assert_eq!(attempt.parent_span_id, invoke.span_context.span_id());
        assert_eq!(attempt.span_context.trace_id(), invoke.span_context.trace_id());
        assert!(attempt.attributes.contains(&KeyValue::new("outcome", "succeeded")));
        assert!(attempt.start_time >= invoke.start_time && attempt.end_time <= invoke.end_time);
        assert!(header.contains(&format!("{:016x}", attempt.span_context.span_id())));
    }

    #[test]
    fn a_callers_trace_is_continued_and_its_decision_followed() {
        let (recorder, ended) = recorder(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let Head::Sampled(continued) = recorder.start_request("invoke", Some(caller), "ignored", Vec::new) else {
            panic!("a sampled caller's trace is kept");
        };
        assert_eq!(
            format!("{:032x}", continued.span_context.trace_id()),
            "0af7651916cd43dd8448eb211c80319c"
        );
        drop(continued);
        assert_eq!(
            format!("{:016x}", ended.lock().unwrap()[0].parent_span_id),
            "b7ad6b7169203331"
        );
        assert!(
            ended.lock().unwrap()[0].parent_span_is_remote,
            "the caller's span is remote"
        );
        let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        assert!(matches!(
            recorder.start_request("invoke", Some(unsampled), "ignored", || panic!(
                "attributes built for a dropped span"
            )),
            Head::NotSampled
        ));
        // A ratio sampler keeps or drops a root by its trace id.
        let (never, _) = recorder_with_ratio(0.0);
        assert!(matches!(
            never.start_request("invoke", None, "4bf92f3577b34da6a3ce929d0e0e4736", Vec::new),
            Head::NotSampled
        ));
    }

    fn recorder_with_ratio(ratio: f64) -> (&'static Recorder, Arc<Mutex<Vec<SpanData>>>) {
        recorder(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))))
    }
}
