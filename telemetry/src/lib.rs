//! Logging and tracing set-up shared by every service and the SDK (DESIGN §6).
//!
//! - [`init`] installs the global subscriber: text or JSON log lines
//!   (`logs.rs`; in JSON every field of the enclosing spans is copied onto the
//!   line, so a request's `trace_id`, `request_id` and `session_id` are on
//!   every line logged while serving it), plus an OpenTelemetry layer exporting
//!   spans over OTLP when the standard `OTEL_*` variables ask for it (`otlp.rs`).
//! - [`otlp_logs`] exports log records over OTLP/gRPC (the trail's copy of
//!   its records for log pipelines, `--trail-otlp-endpoint`).
//! - [`propagation`] reads and writes W3C `traceparent` headers for spans, so
//!   the router and the SDK continue the caller's trace across hops.
//! - [`spans`] builds request-path spans straight on the OpenTelemetry SDK
//!   (the router's invoke, selection and attempt spans), without `tracing`.
//! - [`histogram`] is a Prometheus histogram observed on the request path
//!   without a shared atomic per observation (per-thread shards, summed at scrape).

mod background;
mod bursts;
mod export;
pub mod histogram;
pub mod logs;
pub mod otlp;
pub mod otlp_logs;
pub mod propagation;
pub mod spans;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// What [`init`] sets up.
#[derive(Debug, Clone)]
pub struct Options {
    pub format: LogFormat,
    /// The filter when `RUST_LOG` is unset (`info`, `warn`, ...).
    pub default_filter: String,
    /// `service.name` of exported spans when `OTEL_SERVICE_NAME` is unset.
    pub service_name: String,
}

/// Keeps the span exporter alive; flushes and shuts it down on drop.
#[must_use = "dropping the guard stops span export"]
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are exported (an OTLP endpoint was configured).
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Flush what the batch processor still holds; errors only mean spans are lost.
            if let Err(error) = provider.force_flush() {
                eprintln!("telemetry: flushing spans failed: {error}");
            }
            if let Err(error) = provider.shutdown() {
                eprintln!("telemetry: stopping the span exporter failed: {error}");
            }
        }
    }
}

/// Installs the global subscriber: logs to stderr in `options.format`, and
/// OTLP span export when [`otlp::Settings::from_env`] finds an endpoint.
pub fn init(options: &Options) -> anyhow::Result<TelemetryGuard> {
    // Per-layer filters: `RUST_LOG` decides what is logged, not what is traced.
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|text| !text.trim().is_empty())
        .unwrap_or_else(|| options.default_filter.clone());
    let fmt = match options.format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).boxed(),
        LogFormat::Json => logs::json_layer(std::io::stderr).boxed(),
    };
    // Plain `target=level` directives use `Targets`: `EnvFilter` takes a lock on
    // every span enter and exit, which the router's request path would pay per poll.
    // Span-field directives (`[span{field=value}]`) still get `EnvFilter`.
    let fmt = match directives.parse::<Targets>() {
        Ok(targets) => fmt.with_filter(targets).boxed(),
        Err(_) => fmt.with_filter(EnvFilter::new(&directives)).boxed(),
    };
    let settings = otlp::Settings::from_env(&options.service_name)?;
    let provider = settings.as_ref().map(otlp::tracer_provider).transpose()?;
    let otel = provider.as_ref().map(otlp::layer);
    tracing_subscriber::registry().with(fmt).with(otel).try_init()?;
    if let (Some(settings), Some(_)) = (&settings, &provider) {
        tracing::info!(message = "Exporting spans over OTLP.", endpoint = %settings.endpoint, service = %settings.service_name);
    }
    Ok(TelemetryGuard { provider })
}
