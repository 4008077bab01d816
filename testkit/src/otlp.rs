//! A real OTLP/gRPC trace and log receiver on loopback (feature `otlp`):
//! the collector stand-in for tests that check exported spans and log
//! records end to end. It implements the OTLP trace and logs services with
//! the generated servers, keeps every span and log record it is sent
//! (decoded for assertions), the `service.name` of each resource, and each
//! call's gRPC metadata and item count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;

/// One received span, decoded for assertions (ids in lowercase hex, every
/// attribute value as text).
#[derive(Debug, Clone)]
pub struct Received {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent: String,
    pub kind: i32,
    pub attributes: HashMap<String, String>,
}

/// One received log record, decoded for assertions.
#[derive(Debug, Clone)]
pub struct ReceivedLog {
    /// The instrumentation scope's name.
    pub scope: String,
    pub severity_text: String,
    pub body: String,
    /// Lowercase hex; empty when the record has none.
    pub trace_id: String,
    pub time_unix_nano: u64,
    pub attributes: HashMap<String, String>,
    /// Its resource's attributes.
    pub resource: HashMap<String, String>,
}

/// One `Export` call as it arrived.
#[derive(Debug, Clone)]
pub struct Call {
    /// The call's gRPC metadata (exporter headers, `grpc-timeout`).
    pub metadata: tonic::metadata::MetadataMap,
    /// How many spans (or log records) it carried.
    pub spans: usize,
}

/// A running receiver; it serves until the test's runtime ends.
#[derive(Clone, Default)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
    services: Arc<Mutex<Vec<String>>>,
    calls: Arc<Mutex<Vec<Call>>>,
    logs: Arc<Mutex<Vec<ReceivedLog>>>,
    log_calls: Arc<Mutex<Vec<Call>>>,
    endpoint: String,
}

impl Receiver {
    /// Starts a receiver on a free loopback port (inside a Tokio runtime).
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|error| panic!("cannot bind a loopback port for the OTLP receiver: {error}"));
        let endpoint = match listener.local_addr() {
            Ok(addr) => format!("http://{addr}"),
            Err(error) => panic!("OTLP receiver address: {error}"),
        };
        let receiver = Receiver {
            endpoint,
            ..Receiver::default()
        };
        let service = TraceServiceServer::new(receiver.clone());
        let logs = LogsServiceServer::new(receiver.clone());
        tokio::spawn(async move {
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .add_service(logs)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
            {
                eprintln!("OTLP receiver stopped: {error}");
            }
        });
        receiver
    }

    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every `Export` call received so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every log record received so far, in arrival order.
    pub fn logs(&self) -> Vec<ReceivedLog> {
        self.logs.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every logs `Export` call received so far, in arrival order.
    pub fn log_calls(&self) -> Vec<Call> {
        self.log_calls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The `service.name` of every resource received so far.
    pub fn services(&self) -> Vec<String> {
        self.services.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|value| value.value.as_ref()) {
        Some(AnyValue::StringValue(text)) => text.clone(),
        Some(AnyValue::IntValue(number)) => number.to_string(),
        Some(AnyValue::BoolValue(flag)) => flag.to_string(),
        Some(AnyValue::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        let mut count = 0;
        for resource_spans in request.into_inner().resource_spans {
            if let Some(resource) = &resource_spans.resource {
                for attribute in &resource.attributes {
                    if attribute.key == "service.name" {
                        self.services
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(text(&attribute.value));
                    }
                }
            }
            for scope in resource_spans.scope_spans {
                count += scope.spans.len();
                for span in scope.spans {
                    self.spans
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Received {
                            name: span.name,
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent: hex(&span.parent_span_id),
                            kind: span.kind,
                            attributes: attributes(&span.attributes),
                        });
                }
            }
        }
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Call { metadata, spans: count });
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attributes(list: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|attribute| (attribute.key.clone(), text(&attribute.value)))
        .collect()
}

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        let mut count = 0;
        for resource_logs in request.into_inner().resource_logs {
            let resource = resource_logs
                .resource
                .as_ref()
                .map(|resource| attributes(&resource.attributes))
                .unwrap_or_default();
            for scope_logs in resource_logs.scope_logs {
                let scope = scope_logs
                    .scope
                    .as_ref()
                    .map(|scope| scope.name.clone())
                    .unwrap_or_default();
                count += scope_logs.log_records.len();
                for record in scope_logs.log_records {
                    self.logs
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(ReceivedLog {
                            scope: scope.clone(),
                            severity_text: record.severity_text.clone(),
                            body: text(&record.body),
                            trace_id: hex(&record.trace_id),
                            time_unix_nano: record.time_unix_nano,
                            attributes: attributes(&record.attributes),
                            resource: resource.clone(),
                        });
                }
            }
        }
        self.log_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Call { metadata, spans: count });
        Ok(tonic::Response::new(ExportLogsServiceResponse {
            partial_success: None,
        }))
    }
}
