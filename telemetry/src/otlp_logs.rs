//! OTLP/gRPC log export: where the trail copies its records when asked
//! (`--trail-otlp-endpoint`, design §3.13), one `Export` call per written
//! segment. The records themselves stay in Redis, the trail's store of
//! record; the copy is for log pipelines (an OpenTelemetry Collector, a log
//! store behind it).

use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

/// The instrumentation scope the trail's log records carry.
pub const TRAIL_SCOPE: &str = "agent-reach.trail";

/// One log record to export.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogLine {
    /// When it happened (epoch ms).
    pub time_ms: u64,
    /// `ERROR` severity when set, else `INFO`.
    pub failed: bool,
    /// The record's text (the trail's stored body, JSON).
    pub body: String,
    /// The W3C trace id (32 hex digits) it belongs to; anything else is left out.
    pub trace_id: String,
    pub attributes: Vec<(&'static str, String)>,
}

/// Exports batches of log lines to an OTLP/gRPC collector.
#[derive(Debug, Clone)]
pub struct LogExporter {
    client: LogsServiceClient<Channel>,
    metadata: MetadataMap,
    timeout: Duration,
    resource: Resource,
}

impl LogExporter {
    /// A client of `endpoint` (`http://host:port`), connected on first use,
    /// its resource named `service_name` with `resource` attributes. Must be
    /// called inside a Tokio runtime.
    pub fn new(
        endpoint: &str,
        headers: &[(String, String)],
        timeout: Duration,
        service_name: &str,
        resource: &[(&'static str, String)],
    ) -> anyhow::Result<Self> {
        let (channel, metadata) = crate::export::connect(endpoint, headers, timeout)?;
        let attributes = std::iter::once(("service.name", service_name.to_string()))
            .chain(resource.iter().cloned())
            .map(|(key, value)| text_value(key, value))
            .collect();
        Ok(Self {
            client: LogsServiceClient::new(channel),
            metadata,
            timeout,
            resource: Resource {
                attributes,
                ..Resource::default()
            },
        })
    }

    /// Sends `lines` in one `Export` call.
    pub async fn export(&self, lines: Vec<LogLine>) -> Result<(), String> {
        let mut request = tonic::Request::new(request(lines, &self.resource));
        *request.metadata_mut() = self.metadata.clone();
        request.set_timeout(self.timeout);
        self.client
            .clone()
            .export(request)
            .await
            .map(|_| ())
            .map_err(|status| format!("OTLP log export failed: {status}"))
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`, then `OTEL_EXPORTER_OTLP_LOGS_HEADERS`
/// (the signal's own winning, header by header), as the span exporter reads
/// its own.
pub fn headers_from_env() -> anyhow::Result<Vec<(String, String)>> {
    crate::otlp::signal_headers("OTEL_EXPORTER_OTLP_LOGS_HEADERS", |name| std::env::var(name).ok())
}

fn text_value(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(AnyValueKind::StringValue(value)),
        }),
        ..KeyValue::default()
    }
}

/// The trace id's 16 bytes, when `hex` is one.
fn trace_id_bytes(hex: &str) -> Vec<u8> {
    if hex.len() != 32 {
        return Vec::new();
    }
    (0..16)
        .map(|at| u8::from_str_radix(hex.get(at * 2..at * 2 + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .unwrap_or_default()
}

fn request(lines: Vec<LogLine>, resource: &Resource) -> ExportLogsServiceRequest {
    let observed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    let log_records = lines
        .into_iter()
        .map(|line| {
            let (severity, text) = if line.failed {
                (SeverityNumber::Error, "ERROR")
            } else {
                (SeverityNumber::Info, "INFO")
            };
            LogRecord {
                time_unix_nano: line.time_ms.saturating_mul(1_000_000),
                observed_time_unix_nano: observed,
                severity_number: severity as i32,
                severity_text: text.to_string(),
                body: Some(AnyValue {
                    value: Some(AnyValueKind::StringValue(line.body)),
                }),
                trace_id: trace_id_bytes(&line.trace_id),
                attributes: line
                    .attributes
                    .into_iter()
                    .map(|(key, value)| text_value(key, value))
                    .collect(),
                ..LogRecord::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource.clone()),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: TRAIL_SCOPE.to_string(),
                    ..InstrumentationScope::default()
                }),
                log_records,
                ..ScopeLogs::default()
            }],
            ..ResourceLogs::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_becomes_a_log_record_with_its_trace_and_severity() {
        let resource = Resource::default();
        let request = request(
            vec![LogLine {
                time_ms: 1_700_000_000_123,
                failed: true,
                body: "{\"seq\":1}".into(),
                trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
                attributes: vec![("agent_reach.request_id", "r-1".into())],
            }],
            &resource,
        );
        let scope = &request.resource_logs[0].scope_logs[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, TRAIL_SCOPE);
        let record = &scope.log_records[0];
        assert_eq!(record.time_unix_nano, 1_700_000_000_123_000_000);
        assert_eq!(record.severity_number, SeverityNumber::Error as i32);
        assert_eq!(record.trace_id[0], 0x0a);
        assert_eq!(record.trace_id.len(), 16);
        assert_eq!(record.attributes[0].key, "agent_reach.request_id");
        // A trace id that is not 32 hex digits is left out, not mangled.
        assert!(trace_id_bytes("xyz").is_empty());
        assert!(trace_id_bytes("0af7651916cd43dd8448eb211c80319g").is_empty());
    }
}
