//! W3C Trace Context for `tracing` spans: continue a caller's `traceparent`
//! and produce the one to send downstream. Without an OpenTelemetry layer
//! (no OTLP endpoint) every function returns at once and callers fall back to
//! their own ids, so disabled tracing costs a relaxed atomic load.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Set once an OpenTelemetry layer exists ([`enable`], called by
/// `otlp::layer`): before that, propagation and the request-path spans do
/// nothing (and allocate nothing).
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Turns trace context on for the rest of the process (an OpenTelemetry layer now exists).
pub(crate) fn enable() {
    ACTIVE.store(true, Ordering::Relaxed);
}

/// A carrier holding just the `traceparent` value.
struct TraceParent<'a>(&'a str);

impl Extractor for TraceParent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

/// Makes `span` a child of the remote span named by `traceparent`. Does
/// nothing without a valid header or an OpenTelemetry layer.
pub fn set_parent(span: &Span, traceparent: Option<&str>) {
    let Some(header) = traceparent.filter(|_| active()) else {
        return;
    };
    if let Some(context) = remote_parent(header) {
        // Fails only for a span the layer does not record (filtered out) or
        // one already started (its context read, e.g. by `traceparent`): a
        // caller's bug worth a debug line, never a request's failure.
        if let Err(error) = span.set_parent(context) {
            tracing::debug!(message = "Span not continued from the caller's traceparent.", %error);
        }
    }
}

/// Renames `span` once what it is about is known (the GenAI conventions name
/// a span after its agent: `invoke_agent {capability}`), also after its
/// context was read (the layer ignores a recorded `otel.name` then). Does
/// nothing without an OpenTelemetry layer.
pub fn rename(span: &Span, name: String) {
    if active() {
        span.context().span().update_name(name);
    }
}

/// The remote span a `traceparent` header names, when the header is valid.
pub(crate) fn remote_parent(header: &str) -> Option<opentelemetry::Context> {
    Some(TraceContextPropagator::new().extract(&TraceParent(header)))
        .filter(|context| context.span().span_context().is_valid())
}

/// The `traceparent` naming `span` as the parent of the next hop, when spans
/// are OpenTelemetry spans.
pub fn traceparent(span: &Span) -> Option<String> {
    if !active() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| header(&span_context))
}

/// The W3C `traceparent` value naming `span_context` as the parent.
pub(crate) fn header(span_context: &opentelemetry::trace::SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        span_context.trace_id(),
        span_context.span_id(),
        span_context.trace_flags().to_u8()
    )
}

/// The OpenTelemetry trace id of `span` (32 hex digits), when it has one.
pub fn trace_id(span: &Span) -> Option<String> {
    trace_state(span).map(|(trace_id, _)| trace_id)
}

/// The OpenTelemetry trace id of `span` and whether its trace is sampled.
pub fn trace_state(span: &Span) -> Option<(String, bool)> {
    if !active() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| (format!("{:032x}", span_context.trace_id()), span_context.is_sampled()))
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::otlp;

    // Multi-threaded: dropping the provider at the end flushes, and blocks until
    // the batch task (on another worker) answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_span_continues_the_callers_trace_and_names_itself_as_the_next_parent() {
        // Nothing listens there; spans are only built, never delivered.
        let settings = otlp::Settings::new("http://127.0.0.1:9", "propagation-test");
        let provider = otlp::tracer_provider(&settings).unwrap();
        let subscriber = tracing_subscriber::registry().with(otlp::layer(&provider));
        tracing::subscriber::with_default(subscriber, || {
            let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let span = tracing::info_span!("agent.invoke");
            set_parent(&span, Some(caller));
            assert_eq!(
                trace_state(&span),
                Some(("4bf92f3577b34da6a3ce929d0e0e4736".to_string(), true))
            );
            let next = traceparent(&span).unwrap();
            assert!(next.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{next}");
            assert!(
                !next.contains("00f067aa0ba902b7"),
                "the span itself is the next parent: {next}"
            );
            // A header that is not a traceparent leaves the span a root of its own.
            let root = tracing::info_span!("agent.invoke");
            set_parent(&root, Some("garbage"));
            assert_ne!(trace_id(&root).as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        });
    }
}
