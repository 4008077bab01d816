//! The gRPC API (`proto/context.proto`) for the SDK and the router: the same
//! operations as HTTP, values carried as JSON text and decoded here, at the edge.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_proto::context as pb;
use serde_json::Value;
use tonic::{Request, Response, Status};

use crate::error::{Code, ContextError};
use crate::service::{ContextService, CreateInput, PatchInput};

pub struct GrpcContext {
    service: Arc<ContextService>,
}

impl GrpcContext {
    pub fn new(service: Arc<ContextService>) -> Self {
        Self { service }
    }

    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, ContextError> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| http::HeaderValue::from_str(value).ok());
        self.service.authenticate(header.as_ref())
    }
}

// === Conversions (edge) ===

fn values_from_json(fields: HashMap<String, String>, section: &str) -> Result<BTreeMap<String, Value>, ContextError> {
    fields
        .into_iter()
        .map(|(name, text)| match serde_json::from_str(&text) {
            Ok(value) => Ok((name, value)),
            Err(error) => Err(ContextError::field(
                Code::InvalidFieldValue,
                format!("{section}.{name}"),
                format!("the value is not JSON text: {error}"),
            )),
        })
        .collect()
}

fn text_map(fields: crate::model::Fields) -> HashMap<String, String> {
    fields.into_iter().collect()
}

/// Joins the caller's trace: the SDK sends W3C `traceparent` in gRPC metadata.
fn continue_trace<T>(request: &Request<T>) {
    let traceparent = request
        .metadata()
        .get("traceparent")
        .and_then(|value| value.to_str().ok());
    agent_reach_telemetry::propagation::set_parent(&tracing::Span::current(), traceparent);
}

#[tonic::async_trait]
impl pb::contexts_server::Contexts for GrpcContext {
    #[tracing::instrument(name = "grpc.Create", skip_all)]
    async fn create(&self, request: Request<pb::CreateRequest>) -> Result<Response<pb::CreateResponse>, Status> {
        continue_trace(&request);
        let caller = self.caller(&request).map_err(|error| error.to_status())?;
        let request = request.into_inner();
        let result = async {
            let input = CreateInput {
                context_id: Some(request.context_id).filter(|id| !id.is_empty()),
                tier: Some(request.tier).filter(|tier| !tier.is_empty()),
                fields: values_from_json(request.fields_json, "fields")?,
            };
            self.service.create(&caller, input).await
        }
        .await;
        let created = result.map_err(|error| error.to_status())?;
        Ok(Response::new(pb::CreateResponse {
            context_id: created.context_id,
            version: created.written.version,
            tier: created.tier.as_str().to_string(),
            expires_at_ms: created.written.expires_at_ms,
        }))
    }

    #[tracing::instrument(name = "grpc.Get", skip_all)]
    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        continue_trace(&request);
        let caller = self.caller(&request).map_err(|error| error.to_status())?;
        let request = request.into_inner();
        let fields = Some(request.fields).filter(|names| !names.is_empty());
        let snapshot = self
            .service
            .get(&caller, &request.context_id, fields)
            .await
            .map_err(|error| error.to_status())?;
        Ok(Response::new(pb::GetResponse {
            context_id: request.context_id,
            version: snapshot.version,
            tier: snapshot.tier.as_str().to_string(),
            expires_at_ms: snapshot.expires_at_ms,
            fields_json: text_map(snapshot.fields),
        }))
    }

    #[tracing::instrument(name = "grpc.Patch", skip_all)]
    async fn patch(&self, request: Request<pb::PatchRequest>) -> Result<Response<pb::PatchResponse>, Status> {
        continue_trace(&request);
        let caller = self.caller(&request).map_err(|error| error.to_status())?;
        let request = request.into_inner();
        let result = async {
            let input = PatchInput {
                set: values_from_json(request.set_json, "set")?,
                delete: request.delete,
                if_version: request.if_version,
            };
            self.service.patch(&caller, &request.context_id, input).await
        }
        .await;
        let written = result.map_err(|error| error.to_status())?;
        Ok(Response::new(pb::PatchResponse {
            context_id: request.context_id,
            version: written.version,
            expires_at_ms: written.expires_at_ms,
        }))
    }

    #[tracing::instrument(name = "grpc.Close", skip_all)]
    async fn close(&self, request: Request<pb::CloseRequest>) -> Result<Response<pb::CloseResponse>, Status> {
        continue_trace(&request);
        let caller = self.caller(&request).map_err(|error| error.to_status())?;
        let request = request.into_inner();
        self.service
            .close(&caller, &request.context_id)
            .await
            .map_err(|error| error.to_status())?;
        Ok(Response::new(pb::CloseResponse {
            context_id: request.context_id,
        }))
    }
}
