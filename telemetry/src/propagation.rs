//! W3C Trace Context for `tracing` spans: continue a caller's `traceparent`
//! and produce the one to send downstream. Without an OpenTelemetry layer
//! (no OTLP endpoint) every function returns at once and callers fall back to
//! their own ids, so disabled tracing costs a relaxed atomic load.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SamplingDecision, SpanKind, TraceContextExt, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::otlp::{active, preset_trace_id, tracer};

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
    let context = TraceContextPropagator::new().extract(&TraceParent(header));
    if context.span().span_context().is_valid() {
        span.set_parent(context);
    }
}

/// The `traceparent` naming `span` as the parent of the next hop, when spans
/// are OpenTelemetry spans.
pub fn traceparent(span: &Span) -> Option<String> {
    if !active() {
        return None;
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
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

/// The configured sampler's (`OTEL_TRACES_SAMPLER`) decision for a request
/// entering a service, taken before any span exists so that a request left out
/// of the sample pays for no OpenTelemetry span at all: asked about `trace_id`
/// (the caller's, or the one the service generated) with the caller's
/// `traceparent`, when valid, as the parent. `None` when spans are not exported.
///
/// A root request (no valid `traceparent`) decided in must then create its span
/// with [`root_span_with_trace_id`], so the span carries the trace id decided on.
pub fn head_sample(traceparent: Option<&str>, trace_id: &str) -> Option<bool> {
    let tracer = tracer().filter(|_| active())?;
    let parent = traceparent
        .map(|header| TraceContextPropagator::new().extract(&TraceParent(header)))
        .filter(|context| context.span().span_context().is_valid())
        .unwrap_or_default();
    let trace_id = if parent.span().span_context().is_valid() {
        parent.span().span_context().trace_id()
    } else {
        TraceId::from_hex(trace_id).ok()?
    };
    let result = tracer
        .should_sample()
        .should_sample(Some(&parent), trace_id, "invoke", &SpanKind::Server, &[], &[]);
    Some(!matches!(result.decision, SamplingDecision::Drop))
}

/// Runs `make_span` so that a root span it creates gets `trace_id` (32 hex
/// digits) instead of a random one; later spans are unaffected.
pub fn root_span_with_trace_id(trace_id: &str, make_span: impl FnOnce() -> Span) -> Span {
    preset_trace_id(TraceId::from_hex(trace_id).ok());
    let span = make_span();
    preset_trace_id(None);
    span
}

/// Whether spans are exported at all (an OpenTelemetry layer is installed).
/// Callers skip optional detail spans of unsampled traces only when this holds.
pub fn exporting() -> bool {
    active()
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::otlp;

    #[tokio::test]
    async fn a_root_span_takes_the_trace_id_sampled_on_and_a_caller_decision_is_followed() {
        // Nothing listens there; spans are only built, never delivered.
        let settings = otlp::Settings {
            endpoint: "http://127.0.0.1:9".to_string(),
            service_name: "propagation-test".to_string(),
        };
        let provider = otlp::tracer_provider(&settings).unwrap();
        let subscriber = tracing_subscriber::registry().with(otlp::layer(&provider));
        tracing::subscriber::with_default(subscriber, || {
            let decided = "4bf92f3577b34da6a3ce929d0e0e4736";
            // The default sampler (parentbased_always_on) keeps roots ...
            assert_eq!(head_sample(None, decided), Some(true));
            let span = root_span_with_trace_id(decided, || tracing::info_span!("invoke"));
            assert_eq!(trace_state(&span), Some((decided.to_string(), true)));
            // ... and only the first root span takes the preset id.
            let next = tracing::info_span!("other");
            assert_ne!(trace_id(&next).as_deref(), Some(decided));
            // A caller's unsampled trace stays unsampled.
            let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
            assert_eq!(head_sample(Some(unsampled), "ignored"), Some(false));
            let sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            assert_eq!(head_sample(Some(sampled), "ignored"), Some(true));
        });
    }
}
