//! The OTLP/gRPC span exporter behind the batch processor.
//!
//! Same wire format, endpoint and `OTEL_EXPORTER_OTLP_*` settings as
//! `opentelemetry-otlp`'s tonic exporter, which (in the 0.27 line this was
//! measured on) cloned every span, its attribute list and each attribute's
//! text, before converting it: on the router bench that clone was a third of
//! the export thread's work. Here each span is handed to
//! `opentelemetry-proto`'s conversion as it is (which still copies each string
//! attribute value once), grouped by instrumentation scope, and a batch goes
//! out as one `Export` call with the configured headers and timeout.
//!
//! The SDK's batch processor calls [`Exporter::export`] on its own thread and
//! blocks on the returned future there; the gRPC channel's connection and
//! request tasks run on the runtime the exporter was built in (the export
//! thread's, see `background`).

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::InstrumentationScope;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as ProtoSpan};
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};

/// Exports batches of spans to an OTLP/gRPC collector.
#[derive(Debug)]
pub struct Exporter {
    client: TraceServiceClient<Channel>,
    metadata: MetadataMap,
    timeout: Duration,
    resource: ResourceAttributesWithSchema,
}

impl Exporter {
    /// A client of `endpoint` (`http://host:port`), connected on first use.
    /// Must be called inside a Tokio runtime.
    pub fn new(endpoint: &str, headers: &[(String, String)], timeout: Duration) -> anyhow::Result<Self> {
        let (channel, metadata) = connect(endpoint, headers, timeout)?;
        Ok(Self {
            client: TraceServiceClient::new(channel),
            metadata,
            timeout,
            resource: ResourceAttributesWithSchema::default(),
        })
    }
}

/// A lazily connected channel to the OTLP/gRPC `endpoint` and the metadata
/// every export sends: the spans' and the trail's logs' exporters alike.
pub(crate) fn connect(
    endpoint: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<(Channel, MetadataMap)> {
    let channel = Endpoint::from_shared(endpoint.to_string())
        .with_context(|| format!("`{endpoint}` is not a valid OTLP endpoint URL"))?
        .timeout(timeout)
        .connect_lazy();
    let mut metadata = MetadataMap::new();
    for (name, value) in headers {
        let key = MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
            .with_context(|| format!("OTLP header name `{name}` is not a valid gRPC metadata key"))?;
        let value = MetadataValue::try_from(value.as_str())
            .with_context(|| format!("the value of OTLP header `{name}` is not valid gRPC metadata"))?;
        metadata.insert(key, value);
    }
    Ok((channel, metadata))
}

impl SpanExporter for Exporter {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let request = request(batch, &self.resource);
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(request);
        *request.metadata_mut() = self.metadata.clone();
        request.set_timeout(self.timeout);
        async move {
            client
                .export(request)
                .await
                .map(|_| ())
                .map_err(|status| OTelSdkError::InternalFailure(format!("OTLP export failed: {status}")))
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.into();
    }
}

/// One request for `batch`: the spans moved into their protobuf form, one
/// group per instrumentation scope (in order of first appearance).
fn request(batch: Vec<SpanData>, resource: &ResourceAttributesWithSchema) -> ExportTraceServiceRequest {
    let mut groups: Vec<(InstrumentationScope, Vec<ProtoSpan>)> = Vec::new();
    for span in batch {
        let index = match groups
            .iter()
            .position(|(scope, _)| *scope == span.instrumentation_scope)
        {
            Some(index) => index,
            None => {
                groups.push((span.instrumentation_scope.clone(), Vec::new()));
                groups.len() - 1
            }
        };
        groups[index].1.push(span.into());
    }
    let schema_url = resource.schema_url.clone().unwrap_or_default();
    let scope_spans = groups
        .into_iter()
        .map(|(scope, spans)| ScopeSpans {
            scope: Some((scope, None).into()),
            spans,
            schema_url: schema_url.clone(),
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(ProtoResource {
                attributes: resource.attributes.0.clone(),
                dropped_attributes_count: 0,
                entity_refs: Vec::new(),
            }),
            scope_spans,
            schema_url,
        }],
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
    use opentelemetry::KeyValue;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;

    use super::*;

    fn span(scope: &'static str, span_id: u64) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(7_u128),
                SpanId::from(span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::from(1_u64),
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: "attempt".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            end_time: std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(6),
            attributes: vec![KeyValue::new("agent_id", "a-1"), KeyValue::new("attempt", 2_i64)],
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::error("AGENT_ERROR"),
            instrumentation_scope: InstrumentationScope::builder(scope).build(),
        }
    }

    #[test]
    fn a_batch_is_encoded_as_the_opentelemetry_conversion_encodes_it() {
        let resource: ResourceAttributesWithSchema =
            (&Resource::builder_empty().with_service_name("router").build()).into();
        let batch = vec![span("agent-reach", 2), span("other", 3), span("agent-reach", 4)];
        let ours = request(batch.clone(), &resource);
        let reference = group_spans_by_resource_and_scope(batch, &resource);
        assert_eq!(ours.resource_spans.len(), 1);
        assert_eq!(ours.resource_spans[0].resource, reference[0].resource);
        // The reference groups through a HashMap: compare scope by scope.
        let scopes = &ours.resource_spans[0].scope_spans;
        assert_eq!(scopes.len(), 2);
        assert_eq!(scopes[0].scope.as_ref().unwrap().name, "agent-reach");
        assert_eq!(scopes[0].spans.len(), 2, "spans of one scope stay together, in order");
        for scope in scopes {
            let twin = reference[0]
                .scope_spans
                .iter()
                .find(|other| other.scope == scope.scope)
                .unwrap();
            assert_eq!(scope, twin);
        }
    }

    #[tokio::test]
    async fn a_batch_goes_out_as_one_call_with_the_configured_headers_and_timeout() {
        let receiver = agent_reach_testkit::otlp::Receiver::start().await;
        let endpoint = receiver.endpoint().to_string();
        let exporter = Exporter::new(
            &endpoint,
            &[("X-Tenant".to_string(), "team a".to_string())],
            Duration::from_millis(2500),
        )
        .unwrap();
        exporter
            .export(vec![span("agent-reach", 2), span("agent-reach", 3)])
            .await
            .unwrap();
        let calls = receiver.calls();
        assert_eq!(calls.len(), 1, "one call per batch");
        assert_eq!(calls[0].spans, 2);
        assert_eq!(calls[0].metadata.get("x-tenant").unwrap(), "team a");
        assert_eq!(calls[0].metadata.get("grpc-timeout").unwrap(), "2500000u");
    }

    #[tokio::test]
    async fn bad_headers_and_endpoints_are_refused_with_their_name() {
        let error = Exporter::new("not a url", &[], Duration::from_secs(1)).unwrap_err();
        assert!(error.to_string().contains("not a url"), "{error}");
        let error = Exporter::new(
            "http://127.0.0.1:4317",
            &[("bad header".to_string(), "x".to_string())],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(error.to_string().contains("bad header"), "{error}");
        Exporter::new(
            "http://127.0.0.1:4317",
            &[("Authorization".to_string(), "Bearer t".to_string())],
            Duration::from_secs(1),
        )
        .unwrap();
    }
}
