//! JSON log lines: one object per event with `timestamp`, `level`, `target`,
//! `span` (the innermost span's name), every field of every enclosing span
//! (inner spans win) and the event's own fields, all at the top level.
//!
//! Flattening is the point: the router's and the SDK's request spans carry
//! `trace_id`, `request_id` and `session_id`, so every line logged while
//! serving a request carries them too, where a log pipeline can index them.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A formatting layer writing [`JsonLines`] to `writer`.
pub fn json_layer<S, W>(writer: W) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(JsonFields::new())
        .event_format(JsonLines)
        .with_writer(writer)
}

/// The event format of [`json_layer`]. Span fields must be recorded with
/// [`JsonFields`] (the layer does), so they can be read back as JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        line.insert("level".into(), Value::String(event.metadata().level().to_string()));
        line.insert("target".into(), Value::String(event.metadata().target().to_string()));
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                innermost = Some(span.name());
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                // Spans without fields store an empty string.
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
            if let Some(name) = innermost {
                line.insert("span".into(), Value::String(name.to_string()));
            }
        }
        event.record(&mut Fields(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Copies an event's fields into the line.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn span_fields_are_copied_onto_every_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(json_layer(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("invoke", trace_id = "t1", request_id = "r1", session_id = "s1");
            let _outer = outer.enter();
            let inner = tracing::info_span!("attempt", agent_id = "a-1", outcome = tracing::field::Empty);
            inner.record("outcome", "failed");
            let _inner = inner.enter();
            tracing::warn!(message = "Attempt failed.", attempt = 2);
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message"], "Attempt failed.");
        assert_eq!(line["trace_id"], "t1");
        assert_eq!(line["request_id"], "r1");
        assert_eq!(line["session_id"], "s1");
        assert_eq!(line["agent_id"], "a-1");
        assert_eq!(line["outcome"], "failed");
        assert_eq!(line["attempt"], 2);
        assert_eq!(line["span"], "attempt");
        assert_eq!(line["level"], "WARN");
    }
}
