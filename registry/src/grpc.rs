//! The gRPC API (`proto/registry.proto`): the same operations as HTTP, plus
//! the multiplexed keep-alive stream and the Watch stream routers consume.

// `tonic::Status` is the error type of the gRPC API we implement and call;
// boxing it would only fight tonic's signatures.
#![allow(clippy::result_large_err)]

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::Caller;
use agent_reach_errors::ErrorCode as _;
use agent_reach_proto::http as wire;
use agent_reach_proto::registry as pb;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::catalog::{decode, decode_grant, decode_policy, decode_split};
use crate::error::{Code, RegistryError};
use crate::model::{Capability, Grant, Instance, Policy, Split};
use crate::service::{Heartbeat, RegistryService};
use crate::store::{Event, Revision, StoreError};
use crate::validate;

/// Heartbeats of one keep-alive stream processed concurrently.
const KEEP_ALIVE_CONCURRENCY: usize = 1024;
/// Watch events buffered per subscriber before back-pressure.
const WATCH_BUFFER: usize = 1024;
/// What one page of a paged snapshot or listing carries at most, encoded; an
/// instance larger than this (bounded by the registration limits) goes alone.
pub const PAGE_BYTES: usize = 1024 * 1024;
/// `ListAgents`' page when the request names none, and its largest.
const DEFAULT_PAGE_SIZE: usize = 500;
const MAX_PAGE_SIZE: usize = 10_000;

pub struct GrpcRegistry {
    service: Arc<RegistryService>,
}

impl GrpcRegistry {
    pub fn new(service: Arc<RegistryService>) -> Self {
        Self { service }
    }

    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| http::HeaderValue::from_str(value).ok());
        self.service
            .authenticate(header.as_ref())
            .map_err(|error| error.to_status())
    }
}

// === Conversions (edge) ===

fn schema_to_text(schema: Option<&serde_json::Value>) -> String {
    schema.map(ToString::to_string).unwrap_or_default()
}

pub fn capability_to_pb(capability: &Capability) -> pb::CapabilityDescriptor {
    pb::CapabilityDescriptor {
        name: capability.name.clone(),
        version: capability.version.to_string(),
        description: capability.description.clone(),
        input_schema_json: schema_to_text(capability.input_schema.as_ref()),
        output_schema_json: schema_to_text(capability.output_schema.as_ref()),
        timeout_ms: capability.timeout_ms.unwrap_or(0),
        skip_output_check: !capability.check_output,
    }
}

pub fn instance_to_pb(instance: &Instance) -> pb::AgentInstance {
    pb::AgentInstance {
        agent_id: instance.agent_id.clone(),
        name: instance.name.clone(),
        endpoint: instance.endpoint.clone(),
        protocol: instance.protocol.clone(),
        weight: instance.weight,
        tags: instance.tags.clone().into_iter().collect(),
        capabilities: instance.capabilities.iter().map(capability_to_pb).collect(),
        status: instance.status.as_str().to_string(),
        lease_id: instance.lease_id,
        ttl_s: instance.ttl_s,
        registered_at_ms: instance.registered_at_ms,
        inflight: instance.inflight,
        operator_weight: instance.operator_weight,
    }
}

/// A capability's default policy on the wire.
pub fn policy_to_pb(policy: &Policy) -> pb::CapabilityPolicy {
    pb::CapabilityPolicy {
        capability: policy.capability.clone(),
        policy: policy.policy.clone(),
        updated_at_ms: policy.updated_at_ms,
        updated_by: policy.updated_by.clone().unwrap_or_default(),
    }
}

/// A split on the wire: highest version first.
pub fn split_to_pb(split: &Split) -> pb::CapabilitySplit {
    pb::CapabilitySplit {
        capability: split.capability.clone(),
        weights: split
            .weights
            .iter()
            .rev()
            .map(|(version, weight)| pb::VersionWeight {
                version: version.to_string(),
                weight: *weight,
            })
            .collect(),
        updated_at_ms: split.updated_at_ms,
        updated_by: split.updated_by.clone().unwrap_or_default(),
    }
}

/// A grant on the wire (0: no expiry, empty: no approver without authentication).
pub fn grant_to_pb(grant: &Grant) -> pb::Grant {
    pb::Grant {
        id: grant.id.clone(),
        caller: grant.caller.clone(),
        capability: grant.capability.clone(),
        expires_at_ms: grant.expires_at_ms.unwrap_or(0),
        granted_by: grant.granted_by.clone().unwrap_or_default(),
        granted_at_ms: grant.granted_at_ms,
        request_id: grant.request_id.clone(),
    }
}

fn schema_from_text(text: &str, field: String) -> Result<Option<serde_json::Value>, RegistryError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|error| RegistryError::field(Code::InvalidSchema, field, format!("schema is not JSON: {error}")))
}

fn register_from_pb(request: pb::RegisterRequest) -> Result<wire::RegisterRequest, RegistryError> {
    let mut capabilities = Vec::with_capacity(request.capabilities.len());
    for (index, capability) in request.capabilities.into_iter().enumerate() {
        capabilities.push(wire::CapabilitySpec {
            input_schema: schema_from_text(
                &capability.input_schema_json,
                format!("capabilities[{index}].input_schema"),
            )?,
            output_schema: schema_from_text(
                &capability.output_schema_json,
                format!("capabilities[{index}].output_schema"),
            )?,
            name: capability.name,
            version: capability.version,
            description: Some(capability.description).filter(|text| !text.is_empty()),
            timeout_ms: Some(capability.timeout_ms).filter(|timeout| *timeout > 0),
            check_output: capability.skip_output_check.then_some(false),
        });
    }
    Ok(wire::RegisterRequest {
        agent_id: request.agent_id,
        name: request.name,
        endpoint: request.endpoint,
        protocol: Some(request.protocol).filter(|text| !text.is_empty()),
        weight: Some(request.weight).filter(|weight| *weight > 0),
        tags: request.tags.into_iter().collect(),
        ttl_s: Some(request.ttl_s).filter(|ttl| *ttl > 0),
        status: Some(request.status).filter(|text| !text.is_empty()),
        capabilities,
    })
}

fn error_to_pb(error: &RegistryError) -> pb::Error {
    pb::Error {
        code: error.code.as_str().to_string(),
        message: error.message.clone(),
        field: error.field.clone().unwrap_or_default(),
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Joins the caller's trace: the SDK sends W3C `traceparent` in gRPC metadata.
fn continue_trace<T>(request: &Request<T>) {
    let traceparent = request
        .metadata()
        .get("traceparent")
        .and_then(|value| value.to_str().ok());
    agent_reach_telemetry::propagation::set_parent(&tracing::Span::current(), traceparent);
}

#[tonic::async_trait]
impl pb::registry_server::Registry for GrpcRegistry {
    #[tracing::instrument(name = "grpc.Register", skip_all)]
    async fn register(&self, request: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterResponse>, Status> {
        continue_trace(&request);
        let caller = self.caller(&request)?;
        let request = register_from_pb(request.into_inner()).map_err(|error| error.to_status())?;
        let registered = self
            .service
            .register(&caller, request)
            .await
            .map_err(|error| error.to_status())?;
        Ok(Response::new(pb::RegisterResponse {
            agent_id: registered.agent_id,
            lease_id: registered.lease_id,
            ttl_s: registered.ttl_s,
            heartbeat_interval_s: registered.heartbeat_interval_s,
        }))
    }

    type KeepAliveStream = BoxStream<pb::KeepAliveResponse>;

    #[tracing::instrument(name = "grpc.KeepAlive", skip_all)]
    async fn keep_alive(
        &self,
        request: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        // One verification per stream; each heartbeat is still checked against its agent's name.
        let caller = self.caller(&request)?;
        let service = self.service.clone();
        // A tenant no longer served (DESIGN §8) ends its streams; the SDK registers again elsewhere.
        let retired = {
            let service = service.clone();
            async move { service.retired().await }
        };
        let responses = request
            .into_inner()
            .take_while(|message| futures::future::ready(message.is_ok()))
            .filter_map(|message| futures::future::ready(message.ok()))
            .map(move |heartbeat| {
                let service = service.clone();
                let caller = caller.clone();
                async move {
                    let outcome = async {
                        let status = Some(heartbeat.status.as_str())
                            .filter(|text| !text.is_empty())
                            .map(|text| validate::status(text, "status"))
                            .transpose()?;
                        let beat = Heartbeat {
                            agent_id: &heartbeat.agent_id,
                            lease_id: heartbeat.lease_id,
                            status,
                            inflight: heartbeat.inflight,
                        };
                        service.heartbeat(&caller, beat).await
                    }
                    .await;
                    service
                        .metrics()
                        .heartbeats
                        .with_label_values(&["grpc", crate::http::heartbeat_outcome(&outcome)])
                        .inc();
                    Ok(match outcome {
                        Ok(ack) => pb::KeepAliveResponse {
                            agent_id: ack.agent_id,
                            lease_id: ack.lease_id,
                            ttl_s: ack.ttl_s,
                            error: None,
                        },
                        Err(error) => pb::KeepAliveResponse {
                            agent_id: heartbeat.agent_id,
                            lease_id: heartbeat.lease_id,
                            ttl_s: 0,
                            error: Some(error_to_pb(&error)),
                        },
                    })
                }
            })
            .buffer_unordered(KEEP_ALIVE_CONCURRENCY)
            .take_until(Box::pin(retired));
        Ok(Response::new(Box::pin(responses)))
    }

    #[tracing::instrument(name = "grpc.Deregister", skip_all)]
    async fn deregister(
        &self,
        request: Request<pb::DeregisterRequest>,
    ) -> Result<Response<pb::DeregisterResponse>, Status> {
        let caller = self.caller(&request)?;
        self.service
            .deregister(&caller, &request.into_inner().agent_id)
            .await
            .map_err(|error| error.to_status())?;
        Ok(Response::new(pb::DeregisterResponse {}))
    }

    #[tracing::instrument(name = "grpc.GetAgent", skip_all)]
    async fn get_agent(&self, request: Request<pb::GetAgentRequest>) -> Result<Response<pb::AgentInstance>, Status> {
        self.caller(&request)?;
        let agent_id = request.into_inner().agent_id;
        let entry = self.service.catalog().get(&agent_id).ok_or_else(|| {
            RegistryError::new(Code::AgentNotFound, format!("no instance `{agent_id}` is registered")).to_status()
        })?;
        Ok(Response::new(instance_to_pb(&entry.instance)))
    }

    #[tracing::instrument(name = "grpc.ListAgents", skip_all)]
    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        self.caller(&request)?;
        let request = request.into_inner();
        let page_size = match request.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            size => size.min(MAX_PAGE_SIZE),
        };
        let after = Some(request.page_token.as_str()).filter(|token| !token.is_empty());
        let (instances, mut more, revision) = self.service.catalog().page(after, page_size);
        // Also bounded in bytes (one large instance still goes alone).
        let mut agents = Vec::with_capacity(instances.len());
        let mut bytes = 0;
        for instance in &instances {
            let instance = instance_to_pb(instance);
            let size = prost::Message::encoded_len(&instance);
            if !agents.is_empty() && bytes + size > PAGE_BYTES {
                more = true;
                break;
            }
            bytes += size;
            agents.push(instance);
        }
        let next_page_token = match agents.last() {
            Some(last) if more => last.agent_id.clone(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListAgentsResponse {
            agents,
            revision,
            next_page_token,
        }))
    }

    #[tracing::instrument(name = "grpc.ResolveCapability", skip_all)]
    async fn resolve_capability(
        &self,
        request: Request<pb::ResolveCapabilityRequest>,
    ) -> Result<Response<pb::ResolveCapabilityResponse>, Status> {
        self.caller(&request)?;
        let request = request.into_inner();
        let resolution = self
            .service
            .resolve(&request.name, Some(&request.version_req))
            .map_err(|error| error.to_status())?;
        Ok(Response::new(pb::ResolveCapabilityResponse {
            name: request.name,
            version: resolution.chosen.map(|version| version.to_string()).unwrap_or_default(),
            instances: resolution
                .instances
                .iter()
                .map(|(instance, capability)| pb::ResolvedInstance {
                    instance: Some(instance_to_pb(instance)),
                    capability: Some(capability_to_pb(capability)),
                })
                .collect(),
            available_versions: resolution.available.iter().map(ToString::to_string).collect(),
        }))
    }

    type WatchStream = BoxStream<pb::WatchEvent>;

    #[tracing::instrument(name = "grpc.Watch", skip_all)]
    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        self.caller(&request)?;
        let pb::WatchRequest { start_revision, paged } = request.into_inner();
        if start_revision < 0 {
            return Err(RegistryError::field(Code::InvalidFieldType, "start_revision", "must be >= 0").to_status());
        }
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        let service = self.service.clone();
        tokio::spawn(async move {
            // A tenant no longer served (DESIGN §8) ends its watchers' streams.
            tokio::select! {
                () = serve_watch(service.clone(), (start_revision, paged), sender) => {}
                () = service.retired() => {}
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        ))))
    }
}

/// Decrements the subscriber gauge however the watch ends.
struct SubscriberGuard(prometheus::IntGauge);

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Feeds one Watch subscriber: a snapshot when needed (in pages of at most
/// [`PAGE_BYTES`] when `paged`), then every change in revision order,
/// resuming from the last revision sent after store hiccups.
async fn serve_watch(
    service: Arc<RegistryService>,
    (start_revision, paged): (Revision, bool),
    sender: mpsc::Sender<Result<pb::WatchEvent, Status>>,
) {
    let gauge = service.metrics().watch_subscribers.clone();
    gauge.inc();
    let _guard = SubscriberGuard(gauge);
    // Agents, splits (DESIGN §2.9) and grants (§2.11) in one ordered history.
    let prefix = service.keys().tenant_prefix().to_string();
    // 0 means "the subscriber has nothing": start with a snapshot.
    let mut last = start_revision;
    let mut reset = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        if last == 0 {
            while !service.catalog().is_synced() {
                if sender.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let snapshot = service.catalog().snapshot();
            let revision = snapshot.revision;
            let budget = if paged { PAGE_BYTES } else { usize::MAX };
            let first = pb::Snapshot {
                splits: snapshot.splits.iter().map(|split| split_to_pb(split)).collect(),
                grants: snapshot.grants.iter().map(|grant| grant_to_pb(grant)).collect(),
                policies: snapshot.policies.iter().map(|policy| policy_to_pb(policy)).collect(),
                ..Default::default()
            };
            for page in snapshot_pages(&snapshot.instances, first, budget) {
                let event = pb::WatchEvent {
                    revision,
                    kind: Some(pb::watch_event::Kind::Snapshot(pb::Snapshot { reset, ..page })),
                };
                if sender.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            last = revision;
        }
        let mut stream = match service.store().watch(&prefix, last + 1).await {
            Ok(stream) => stream,
            Err(StoreError::Compacted { .. }) => {
                // The history the subscriber needs is gone: never a silent gap.
                last = 0;
                reset = true;
                continue;
            }
            Err(error) => {
                tracing::warn!(message = "Watch cannot reach the store; retrying.", %error);
                if sender.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        loop {
            let batch = tokio::select! {
                batch = stream.next() => batch,
                () = sender.closed() => return,
            };
            match batch {
                Some(Ok(batch)) => {
                    for event in batch.events {
                        let message = delta(&service, event);
                        if let Some(message) = message {
                            if sender.send(Ok(message)).await.is_err() {
                                return;
                            }
                        }
                    }
                    last = batch.revision;
                }
                Some(Err(StoreError::Compacted { .. })) => {
                    last = 0;
                    reset = true;
                    break;
                }
                Some(Err(error)) => {
                    tracing::warn!(message = "Watch stream from the store broke; resuming.", %error);
                    break;
                }
                None => break,
            }
        }
    }
}

/// A snapshot as pages of at most `budget` encoded bytes of instances each
/// (one instance larger than that goes alone), `first` (the splits and
/// grants, policies) the first, every page but the last saying `more`. Always at
/// least one page.
fn snapshot_pages(instances: &[Arc<Instance>], first: pb::Snapshot, budget: usize) -> Vec<pb::Snapshot> {
    let mut pages = vec![first];
    let mut bytes = 0;
    for instance in instances {
        let instance = instance_to_pb(instance);
        let size = prost::Message::encoded_len(&instance);
        let page = pages
            .last_mut()
            .filter(|page| page.instances.is_empty() || bytes + size <= budget);
        match page {
            Some(page) => page.instances.push(instance),
            None => {
                bytes = 0;
                pages.push(pb::Snapshot {
                    instances: vec![instance],
                    ..Default::default()
                });
            }
        }
        bytes += size;
    }
    let last = pages.len() - 1;
    for page in &mut pages[..last] {
        page.more = true;
    }
    pages
}

fn delta(service: &RegistryService, event: Event) -> Option<pb::WatchEvent> {
    let revision = event.revision();
    let keys = service.keys();
    let kind = match event {
        Event::Put(kv) if keys.capability_of_split(&kv.key).is_some() => {
            pb::watch_event::Kind::SplitSet(split_to_pb(&decode_split(&kv)?))
        }
        Event::Delete { key, .. } if keys.capability_of_split(&key).is_some() => {
            pb::watch_event::Kind::SplitCleared(pb::SplitCleared {
                capability: keys.capability_of_split(&key)?.to_string(),
            })
        }
        Event::Put(kv) if keys.grant_id_of(&kv.key).is_some() => {
            pb::watch_event::Kind::GrantSet(grant_to_pb(&decode_grant(&kv)?))
        }
        // Revoked, or expired and removed by its lease.
        Event::Delete { key, .. } if keys.grant_id_of(&key).is_some() => {
            pb::watch_event::Kind::GrantRemoved(pb::GrantRemoved {
                id: keys.grant_id_of(&key)?.to_string(),
            })
        }
        Event::Put(kv) if keys.capability_of_policy(&kv.key).is_some() => {
            pb::watch_event::Kind::PolicySet(policy_to_pb(&decode_policy(&kv)?))
        }
        Event::Delete { key, .. } if keys.capability_of_policy(&key).is_some() => {
            pb::watch_event::Kind::PolicyCleared(pb::PolicyCleared {
                capability: keys.capability_of_policy(&key)?.to_string(),
            })
        }
        Event::Put(kv) => {
            keys.agent_id_of(&kv.key)?;
            let instance = instance_to_pb(&decode(&kv)?);
            if kv.create_revision == kv.mod_revision {
                pb::watch_event::Kind::Added(instance)
            } else {
                pb::watch_event::Kind::Updated(instance)
            }
        }
        Event::Delete { key, .. } => pb::watch_event::Kind::Removed(pb::InstanceRemoved {
            agent_id: keys.agent_id_of(&key)?.to_string(),
        }),
    };
    Some(pb::WatchEvent {
        revision,
        kind: Some(kind),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(agent_id: &str, padding: usize) -> Arc<Instance> {
        Arc::new(Instance {
            agent_id: agent_id.to_string(),
            name: "a".to_string(),
            endpoint: "http://127.0.0.1:1/invoke".to_string(),
            protocol: "http".to_string(),
            weight: 1,
            tags: [("pad".to_string(), "x".repeat(padding))].into_iter().collect(),
            capabilities: Vec::new(),
            status: crate::model::Status::Ready,
            lease_id: 1,
            ttl_s: 15,
            registered_at_ms: 0,
            inflight: 0,
            operator_weight: false,
        })
    }

    /// Pages hold at most the budget (an instance over it alone), the splits
    /// ride on the first, every page but the last says `more`, and together
    /// they are every instance in order.
    #[test]
    fn snapshots_page_within_their_budget() {
        let instances: Vec<_> = (0..50).map(|n| instance(&format!("a-{n:02}"), 100)).collect();
        let mut with_large = instances.clone();
        with_large.insert(10, instance("large", 5000));
        let split = pb::CapabilitySplit {
            capability: "x".to_string(),
            ..Default::default()
        };
        let first = pb::Snapshot {
            splits: vec![split],
            ..Default::default()
        };
        let pages = snapshot_pages(&with_large, first, 1000);
        assert!(pages.len() > 5, "{}", pages.len());
        for (index, page) in pages.iter().enumerate() {
            let bytes: usize = page.instances.iter().map(prost::Message::encoded_len).sum();
            assert!(
                bytes <= 1000 || page.instances.len() == 1,
                "page {index}: {bytes} bytes"
            );
            assert_eq!(page.more, index + 1 < pages.len());
            assert_eq!(page.splits.len(), usize::from(index == 0));
        }
        let ids: Vec<String> = pages
            .iter()
            .flat_map(|page| page.instances.iter().map(|instance| instance.agent_id.clone()))
            .collect();
        let expected: Vec<String> = with_large.iter().map(|instance| instance.agent_id.clone()).collect();
        assert_eq!(ids, expected);
        // Unpaged (and an empty snapshot): one page, as before paging.
        assert_eq!(snapshot_pages(&instances, pb::Snapshot::default(), usize::MAX).len(), 1);
        let empty = snapshot_pages(&[], pb::Snapshot::default(), 1000);
        assert_eq!((empty.len(), empty[0].more), (1, false));
    }
}
