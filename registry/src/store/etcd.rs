//! The etcd v3 store, over etcd's gRPC API on one multiplexed HTTP/2 channel.
//!
//! Heartbeats of every instance share one `LeaseKeepAlive` stream
//! ([`KeepAliveMux`]): a heartbeat is one message on an open stream, not a new
//! request, and concurrent heartbeats for the same lease are coalesced.

// `tonic::Status` is the error type of the gRPC API we implement and call;
// boxing it would only fight tonic's signatures.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::time::Duration;

use agent_reach_proto::etcd as pb;
use agent_reach_proto::etcd::kv_client::KvClient;
use agent_reach_proto::etcd::lease_client::LeaseClient;
use agent_reach_proto::etcd::watch_client::WatchClient;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};

use super::{Condition, Event, KeyValue, LeaseId, Put, Revision, Store, StoreError, WatchBatch, WatchStream};

/// Bound on every unary call and on waiting for a keep-alive answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct EtcdStore {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
    keep_alive: KeepAliveMux,
}

impl EtcdStore {
    /// Connects lazily to the given endpoints (`http://host:port`); the
    /// registry starts even while etcd is down and `/readyz` says so.
    pub fn connect(endpoints: &[String]) -> Result<Self, String> {
        if endpoints.is_empty() {
            return Err("no etcd endpoint given".to_string());
        }
        let mut parsed = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let endpoint = Endpoint::from_shared(endpoint.clone())
                .map_err(|error| format!("invalid etcd endpoint `{endpoint}`: {error}"))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5));
            parsed.push(endpoint);
        }
        let channel = Channel::balance_list(parsed.into_iter());
        let lease = LeaseClient::new(channel.clone());
        Ok(Self {
            kv: KvClient::new(channel.clone()),
            watch: WatchClient::new(channel),
            keep_alive: KeepAliveMux::spawn(lease.clone()),
            lease,
        })
    }
}

fn unavailable(status: tonic::Status) -> StoreError {
    StoreError::Unavailable(format!("{}: {}", status.code(), status.message()))
}

/// etcd answers a write on a vanished lease with NotFound "requested lease not found".
fn is_lease_not_found(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::NotFound && status.message().contains("lease not found")
}

async fn bounded<T>(call: impl std::future::Future<Output = Result<T, tonic::Status>>) -> Result<T, tonic::Status> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("etcd did not answer within 5 s")))
}

/// `[prefix, prefix+1)`: etcd's range end for "every key with this prefix".
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn from_pb(kv: pb::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        value: kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        lease: kv.lease,
    }
}

fn header_revision(header: Option<pb::ResponseHeader>) -> Revision {
    header.map_or(0, |header| header.revision)
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn grant_lease(&self, ttl_s: i64) -> Result<LeaseId, StoreError> {
        let mut lease = self.lease.clone();
        let answer = bounded(lease.lease_grant(pb::LeaseGrantRequest { ttl: ttl_s, id: 0 }))
            .await
            .map_err(unavailable)?
            .into_inner();
        if !answer.error.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "lease grant refused: {}",
                answer.error
            )));
        }
        Ok(answer.id)
    }

    async fn revoke_lease(&self, id: LeaseId) -> Result<Revision, StoreError> {
        let mut lease = self.lease.clone();
        match bounded(lease.lease_revoke(pb::LeaseRevokeRequest { id })).await {
            Ok(answer) => Ok(header_revision(answer.into_inner().header)),
            Err(status) if is_lease_not_found(&status) => Err(StoreError::LeaseNotFound(id)),
            Err(status) => Err(unavailable(status)),
        }
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<i64, StoreError> {
        self.keep_alive.renew(lease).await
    }

    async fn txn(
        &self,
        conditions: Vec<Condition>,
        puts: Vec<Put>,
        deletes: Vec<String>,
    ) -> Result<Revision, StoreError> {
        let compare = conditions
            .into_iter()
            .map(|condition| {
                let Condition::ModRevision { key, revision } = condition;
                pb::Compare {
                    result: pb::compare::CompareResult::Equal as i32,
                    target: pb::compare::CompareTarget::Mod as i32,
                    key: key.into_bytes(),
                    target_union: Some(pb::compare::TargetUnion::ModRevision(revision)),
                }
            })
            .collect();
        let success = deletes
            .into_iter()
            .map(|key| pb::RequestOp {
                request: Some(pb::request_op::Request::RequestDeleteRange(pb::DeleteRangeRequest {
                    key: key.into_bytes(),
                    ..Default::default()
                })),
            })
            .chain(puts.into_iter().map(|put| pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: put.key.into_bytes(),
                    value: put.value,
                    lease: put.lease,
                    prev_kv: false,
                })),
            }))
            .collect();
        let mut kv = self.kv.clone();
        let request = pb::TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        };
        match bounded(kv.txn(request)).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                if answer.succeeded {
                    Ok(header_revision(answer.header))
                } else {
                    Err(StoreError::Conflict)
                }
            }
            Err(status) if is_lease_not_found(&status) => Err(StoreError::LeaseNotFound(0)),
            Err(status) => Err(unavailable(status)),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut kv = self.kv.clone();
        let answer = bounded(kv.range(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }))
        .await
        .map_err(unavailable)?
        .into_inner();
        Ok(answer.kvs.into_iter().next().map(from_pb))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let mut kv = self.kv.clone();
        let answer = bounded(kv.range(pb::RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        }))
        .await
        .map_err(unavailable)?
        .into_inner();
        let revision = header_revision(answer.header);
        Ok((answer.kvs.into_iter().map(from_pb).collect(), revision))
    }

    async fn watch(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream, StoreError> {
        let (requests, request_stream) = mpsc::channel(1);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(pb::WatchCreateRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix),
                start_revision: start_revision.max(0),
                progress_notify: true,
                prev_kv: false,
                watch_id: 0,
            })),
        };
        requests
            .send(create)
            .await
            .map_err(|_| StoreError::Unavailable("watch request channel closed".to_string()))?;
        let mut watch = self.watch.clone();
        let mut responses = bounded(watch.watch(tokio_stream::wrappers::ReceiverStream::new(request_stream)))
            .await
            .map_err(unavailable)?
            .into_inner();
        // The first answer confirms (or refuses) the watch.
        let first = bounded(async { responses.message().await })
            .await
            .map_err(unavailable)?
            .ok_or_else(|| StoreError::Unavailable("watch stream closed at creation".to_string()))?;
        if first.canceled || first.compact_revision > 0 {
            return Err(if first.compact_revision > 0 {
                StoreError::Compacted {
                    requested: start_revision,
                    compact_revision: first.compact_revision,
                }
            } else {
                StoreError::Unavailable(format!("watch refused: {}", first.cancel_reason))
            });
        }
        let stream = futures::stream::unfold(Some((responses, requests, start_revision)), |state| async move {
            // `requests` is kept alive so etcd does not see the client half-close.
            let (mut responses, requests, start_revision) = state?;
            loop {
                match responses.message().await {
                    Ok(Some(answer)) => {
                        if answer.canceled {
                            let error = if answer.compact_revision > 0 {
                                StoreError::Compacted {
                                    requested: start_revision,
                                    compact_revision: answer.compact_revision,
                                }
                            } else {
                                StoreError::Unavailable(format!("watch canceled: {}", answer.cancel_reason))
                            };
                            return Some((Err(error), None));
                        }
                        if answer.events.is_empty() {
                            continue; // progress notification
                        }
                        let events: Vec<Event> = answer.events.into_iter().filter_map(event_from_pb).collect();
                        let revision = events.iter().map(Event::revision).max().unwrap_or(0);
                        return Some((
                            Ok(WatchBatch { revision, events }),
                            Some((responses, requests, start_revision)),
                        ));
                    }
                    Ok(None) => {
                        return Some((
                            Err(StoreError::Unavailable("etcd closed the watch stream".to_string())),
                            None,
                        ))
                    }
                    Err(status) => return Some((Err(unavailable(status)), None)),
                }
            }
        });
        Ok(Box::pin(stream))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let mut kv = self.kv.clone();
        bounded(kv.compact(pb::CompactionRequest {
            revision,
            physical: true,
        }))
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut kv = self.kv.clone();
        bounded(kv.range(pb::RangeRequest {
            key: b"/agent-reach/ping".to_vec(),
            count_only: true,
            ..Default::default()
        }))
        .await
        .map_err(unavailable)?;
        Ok(())
    }
}

fn event_from_pb(event: pb::Event) -> Option<Event> {
    let kv = event.kv?;
    Some(if event.r#type == pb::event::EventType::Delete as i32 {
        Event::Delete {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            mod_revision: kv.mod_revision,
        }
    } else {
        Event::Put(from_pb(kv))
    })
}

// === KeepAliveMux ===

type Waiter = oneshot::Sender<Result<i64, StoreError>>;

/// Multiplexes every lease renewal onto one `LeaseKeepAlive` stream, opened
/// on first use and re-opened after a failure.
#[derive(Clone)]
struct KeepAliveMux {
    requests: mpsc::Sender<(LeaseId, Waiter)>,
}

impl KeepAliveMux {
    fn spawn(lease: LeaseClient<Channel>) -> Self {
        let (requests, receiver) = mpsc::channel(16_384);
        tokio::spawn(run_keep_alive(lease, receiver));
        Self { requests }
    }

    async fn renew(&self, lease: LeaseId) -> Result<i64, StoreError> {
        let (waiter, answer) = oneshot::channel();
        self.requests
            .send((lease, waiter))
            .await
            .map_err(|_| StoreError::Unavailable("keep-alive task stopped".to_string()))?;
        match tokio::time::timeout(CALL_TIMEOUT, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Unavailable("keep-alive stream reset".to_string())),
            Err(_) => Err(StoreError::Unavailable(
                "etcd did not answer the keep-alive within 5 s".to_string(),
            )),
        }
    }
}

async fn run_keep_alive(lease: LeaseClient<Channel>, mut requests: mpsc::Receiver<(LeaseId, Waiter)>) {
    // Wait for the first renewal before opening a stream.
    let Some(mut first) = requests.recv().await else { return };
    let mut backoff = Duration::from_millis(50);
    loop {
        let (sender, outgoing) = mpsc::channel::<pb::LeaseKeepAliveRequest>(16_384);
        // etcd answers the stream's headers only with its first response, so the
        // first request must be queued before waiting for the stream to open.
        let mut pending: HashMap<LeaseId, Vec<Waiter>> = HashMap::new();
        let (id, waiter) = first;
        pending.insert(id, vec![waiter]);
        let _ = sender.try_send(pb::LeaseKeepAliveRequest { id });
        let mut client = lease.clone();
        let opened = bounded(client.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(outgoing))).await;
        let mut incoming = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tracing::warn!(message = "Cannot open etcd keep-alive stream.", error = %status);
                for waiter in pending.into_values().flatten() {
                    let _ = waiter.send(Err(unavailable(status.clone())));
                }
                // Fail what queued up meanwhile too, then retry with backoff.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                while let Ok((_, waiter)) = requests.try_recv() {
                    let _ = waiter.send(Err(StoreError::Unavailable(
                        "etcd keep-alive stream unavailable".to_string(),
                    )));
                }
                match requests.recv().await {
                    Some(next) => first = next,
                    None => return,
                }
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let mut next = None;
        let failure = loop {
            if let Some((id, waiter)) = next.take() {
                let waiters = pending.entry(id).or_default();
                waiters.push(waiter);
                // Coalesce: one message per lease in flight.
                if waiters.len() == 1 && sender.send(pb::LeaseKeepAliveRequest { id }).await.is_err() {
                    break "keep-alive stream closed".to_string();
                }
            }
            tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => next = Some(request),
                    None => return,
                },
                answer = incoming.next() => match answer {
                    Some(Ok(answer)) => {
                        for waiter in pending.remove(&answer.id).unwrap_or_default() {
                            let result = if answer.ttl > 0 { Ok(answer.ttl) } else { Err(StoreError::LeaseNotFound(answer.id)) };
                            let _ = waiter.send(result);
                        }
                    }
                    Some(Err(status)) => break status.to_string(),
                    None => break "etcd closed the keep-alive stream".to_string(),
                },
            }
        };
        tracing::warn!(message = "etcd keep-alive stream failed; reopening.", error = %failure);
        for (_, waiters) in pending.drain() {
            for waiter in waiters {
                let _ = waiter.send(Err(StoreError::Unavailable(failure.clone())));
            }
        }
        match requests.recv().await {
            Some(request) => first = request,
            None => return,
        }
    }
}
