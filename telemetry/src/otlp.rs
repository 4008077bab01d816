//! OpenTelemetry span export over OTLP/gRPC, configured by the standard
//! environment variables:
//!
//! | variable | effect |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT` | where to send spans (`http://collector:4317`); export is off when neither is set |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL`, `..._TRACES_PROTOCOL` | must be `grpc` (the default) when set |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT`, `..._TRACES_TIMEOUT` | per export call, milliseconds (default 10000) |
//! | `OTEL_EXPORTER_OTLP_HEADERS`, `..._TRACES_HEADERS` | `key=value,...` (percent-encoded values) sent as gRPC metadata |
//! | `OTEL_SERVICE_NAME` | `service.name` (default: the subcommand, e.g. `agent-reach-router`) |
//! | `OTEL_RESOURCE_ATTRIBUTES` | extra resource attributes |
//! | `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` | e.g. `parentbased_traceidratio` and `0.1` |
//! | `OTEL_TRACES_EXPORTER=none`, `OTEL_SDK_DISABLED=true` | export off |

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter as _, SpanProcessor as _};
use opentelemetry_sdk::Resource;
use tracing::{Level, Subscriber};
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Where and as whom spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub endpoint: String,
    pub service_name: String,
    /// gRPC metadata sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// Per export call (`OTEL_EXPORTER_OTLP_TIMEOUT`, milliseconds; 10 s).
    pub timeout: Duration,
}

impl Settings {
    /// Export to `endpoint` as `service_name`, no headers, the default timeout.
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            service_name: service_name.into(),
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// From the `OTEL_*` variables; `None` when export is not asked for.
    pub fn from_env(default_service_name: &str) -> anyhow::Result<Option<Self>> {
        Self::from_lookup(default_service_name, |name| std::env::var(name).ok())
    }

    fn from_lookup(default_service_name: &str, var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Self>> {
        let set = |name: &str| {
            var(name)
                .map(|value| value.trim().to_string())
                .filter(|value| !value.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(exporter) = set("OTEL_TRACES_EXPORTER") {
            match exporter.as_str() {
                "otlp" => {}
                "none" => return Ok(None),
                other => bail!("OTEL_TRACES_EXPORTER={other} is not supported; use `otlp` or `none`"),
            }
        }
        let Some(endpoint) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        else {
            return Ok(None);
        };
        for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
            if let Some(protocol) = set(name) {
                if protocol != "grpc" {
                    bail!("{name}={protocol} is not supported; spans are exported over OTLP/gRPC (`grpc`)");
                }
            }
        }
        let service_name = set("OTEL_SERVICE_NAME").unwrap_or_else(|| default_service_name.to_string());
        let headers = signal_headers("OTEL_EXPORTER_OTLP_TRACES_HEADERS", set)?;
        let timeout = match set("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .map(|value| ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", value))
            .or_else(|| set("OTEL_EXPORTER_OTLP_TIMEOUT").map(|value| ("OTEL_EXPORTER_OTLP_TIMEOUT", value)))
        {
            Some((name, value)) => match value.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => bail!("{name}={value} is not a timeout; give milliseconds, e.g. 10000"),
            },
            None => DEFAULT_TIMEOUT,
        };
        Ok(Some(Self {
            endpoint,
            service_name,
            headers,
            timeout,
        }))
    }
}

/// The OTLP default export timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `OTEL_EXPORTER_OTLP_HEADERS`, then the signal's own variable (`signal`),
/// as `var` reads them: the signal's own winning, header by header. The span
/// exporter's and the trail's log exporter's alike.
pub(crate) fn signal_headers(
    signal: &str,
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for name in ["OTEL_EXPORTER_OTLP_HEADERS", signal] {
        for (key, value) in parse_headers(name, var(name).as_deref().unwrap_or(""))? {
            headers.retain(|(other, _)| !other.eq_ignore_ascii_case(&key));
            headers.push((key, value));
        }
    }
    Ok(headers)
}

/// `key=value,key2=value2` (values percent-encoded, as the OTLP exporter
/// specification says) → pairs; an entry without a key or `=` is an error.
fn parse_headers(name: &str, text: &str) -> anyhow::Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), percent_decode(value.trim()))),
            _ => bail!("{name}: `{entry}` is not `key=value`"),
        })
        .collect()
}

/// `%XX` escapes decoded; text that is not a valid escape is kept as is, and
/// so is the whole value when the decoded bytes are not UTF-8.
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map_or_else(|_| text.to_string(), |decoded| decoded.into_owned())
}

/// A tracer provider exporting in batches over OTLP/gRPC. The sampler comes
/// from `OTEL_TRACES_SAMPLER` (the SDK's default configuration reads it).
/// Export runs on threads of its own (see `background`); no runtime is needed.
pub fn tracer_provider(settings: &Settings) -> anyhow::Result<SdkTracerProvider> {
    // The SDK's default detectors (`OTEL_RESOURCE_ATTRIBUTES`, `telemetry.sdk.*`), our service name last.
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .build();
    // The SDK's batch processor with our exporter, its channel on a thread of
    // its own (see `background`), behind per-thread bursts (see `bursts`).
    let batch = crate::background::OnThread::start(|| {
        let mut exporter = crate::export::Exporter::new(&settings.endpoint, &settings.headers, settings.timeout)
            .with_context(|| format!("cannot set up the OTLP exporter for {}", settings.endpoint))?;
        // Given to the exporter here: the provider hands it to its processors, but
        // the bursts processor is shared with the span recorder by then.
        exporter.set_resource(&resource);
        let exporter = crate::background::InBackground(exporter);
        Ok(opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter).build())
    })?;
    let bursts = crate::bursts::Bursts::new(batch);
    let recorded = bursts.clone();
    // The sampler the SDK would pick from `OTEL_TRACES_SAMPLER`, shared by the
    // provider and the span recorder (the SDK no longer lends out its tracers' sampler).
    let sampler = opentelemetry_sdk::trace::Config::default().sampler;
    let provider = SdkTracerProvider::builder()
        .with_sampler(sampler.clone())
        .with_span_processor(bursts)
        .with_resource(resource)
        .build();
    // Request-path spans recorded without `tracing` go to the same processor (see `spans`).
    crate::spans::install(crate::spans::Recorder::new(
        sampler,
        Arc::new(move |span| recorded.on_end(span)),
    ));
    Ok(provider)
}

/// The `tracing` layer turning spans into OpenTelemetry spans of `provider`,
/// with its own filter: every `info` span, and our crates' `debug` spans too
/// (the router's per-attempt and selection spans are `debug`, so they cost
/// nothing unless spans are exported or debug logs are on).
pub fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    crate::propagation::enable();
    let spans = Targets::new()
        .with_default(Level::INFO)
        .with_target("agent_reach", Level::DEBUG);
    otel_layer::<S>(provider).with_filter(spans)
}

fn otel_layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("agent-reach"))
        // Busy/idle times and thread, target and source-location attributes
        // cost work (most of them allocations) on every span and answer no
        // question about a call.
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_target(false)
        .with_location(false)
        // Nothing here reads OpenTelemetry's current context (parents come from
        // the `tracing` span tree, as before tracing-opentelemetry 0.32), so
        // entering a span need not attach its context: a thread-local push and
        // pop per poll of every instrumented future.
        .with_context_activation(false)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> anyhow::Result<Option<Settings>> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_lookup("agent-reach-router", |name| vars.get(name).cloned())
    }

    #[test]
    fn export_only_when_an_endpoint_is_set() {
        assert_eq!(settings(&[]).unwrap(), None);
        let on = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")])
            .unwrap()
            .unwrap();
        assert_eq!(on.endpoint, "http://collector:4317");
        assert_eq!(on.service_name, "agent-reach-router");
        let named = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4317"),
            ("OTEL_SERVICE_NAME", "edge-router"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (named.endpoint.as_str(), named.service_name.as_str()),
            ("http://b:4317", "edge-router")
        );
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("OTEL_SDK_DISABLED", "true")
            ])
            .unwrap(),
            None
        );
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("OTEL_TRACES_EXPORTER", "none")
            ])
            .unwrap(),
            None
        );
        let error = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ])
        .unwrap_err();
        assert!(error.to_string().contains("grpc"), "{error}");
    }

    #[test]
    fn headers_and_timeout_come_from_the_otlp_variables() {
        let on = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=one, tenant=t%201"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "API-KEY=two"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            on.headers,
            [
                ("tenant".to_string(), "t 1".to_string()),
                ("API-KEY".to_string(), "two".to_string())
            ]
        );
        assert_eq!(on.timeout, Duration::from_millis(2500));
        let default = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317")])
            .unwrap()
            .unwrap();
        assert_eq!(default, Settings::new("http://a:4317", "agent-reach-router"));
        for (name, value, named) in [
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "novalue"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "=x", "=x"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "soon"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "OTEL_EXPORTER_OTLP_TIMEOUT"),
        ] {
            let error = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"), (name, value)]).unwrap_err();
            assert!(error.to_string().contains(named), "{error}");
        }
    }
}
