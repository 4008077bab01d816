//! The etcd v3 store, over etcd's gRPC API, on every member of the cluster.
//!
//! Each member has its own HTTP/2 channel ([`Members`]); calls go to one
//! member at a time and move to the next when that one fails (refused,
//! timed out, or "no leader"), within one bound per call. tonic's balanced
//! channel was used before: it keeps offering a killed member's connection,
//! so a third of the calls failed with "tcp connect error" for as long as the
//! member stayed down (issue 23; docs/design.md, "etcd client").
//!
//! Heartbeats of every instance share one `LeaseKeepAlive` stream
//! ([`KeepAliveMux`]): a heartbeat is one message on an open stream, not a new
//! request, and concurrent heartbeats for the same lease are coalesced. When
//! the stream breaks, the renewals in flight are sent again on a stream to
//! the next member rather than failed: a renewal is idempotent.

// `tonic::Status` is the error type of the gRPC API we implement and call;
// boxing it would only fight tonic's signatures.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_proto::etcd as pb;
use agent_reach_proto::etcd::kv_client::KvClient;
use agent_reach_proto::etcd::lease_client::LeaseClient;
use agent_reach_proto::etcd::watch_client::WatchClient;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::{Condition, Event, KeyValue, LeaseId, LeaseTtl, Put, Revision, Store, StoreError, WatchBatch, WatchStream};

/// Bound on every call, failovers included, and on waiting for a keep-alive answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one attempt on one member: a member that is up but cut off from
/// the others answers nothing, and the next member must still get its turn.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Pause after every member failed once, before the next round (an election
/// takes about one election timeout, 1 s by default).
const ROUND_PAUSE: Duration = Duration::from_millis(100);

/// `hasleader`: etcd's "require leader" metadata. A member cut off from the
/// quorum cancels such a stream ("no leader") instead of keeping it open and
/// silent, so watches and keep-alives move to a member that has one.
const REQUIRE_LEADER: (&str, &str) = ("hasleader", "true");
/// The largest answer the registry decodes from etcd (tonic's default is 4
/// MiB, less than one page of large registrations or one watch response).
const MAX_DECODE_BYTES: usize = 64 * 1024 * 1024;
/// Keys per page of a prefix listing, halved while a page is too large to
/// decode, so that no message limit caps how much a prefix holds.
const LIST_PAGE_KEYS: i64 = 1000;

#[derive(Clone)]
pub struct EtcdStore {
    members: Arc<Members>,
    keep_alive: KeepAliveMux,
}

/// TLS to the members (`https://` endpoints): the roots to trust and an
/// optional client identity, as tonic takes them.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    pub config: Option<ClientTlsConfig>,
}

impl EtcdTls {
    /// The CA bundle (the system's roots without one) and the client identity.
    pub fn from_files(files: &agent_reach_stores::TlsFiles) -> Self {
        let mut config = ClientTlsConfig::new();
        config = match &files.ca {
            Some((_, pem)) => config.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some(client) = &files.client {
            config = config.identity(tonic::transport::Identity::from_pem(&client.cert, &client.key));
        }
        Self { config: Some(config) }
    }
}

impl EtcdStore {
    /// Connects lazily to the given endpoints (`http://host:port`); the
    /// registry starts even while etcd is down and `/readyz` says so.
    pub fn connect(endpoints: &[String]) -> Result<Self, String> {
        Self::connect_with(endpoints, &EtcdTls::default())
    }

    /// As [`EtcdStore::connect`], with TLS for `https://` endpoints.
    pub fn connect_with(endpoints: &[String], tls: &EtcdTls) -> Result<Self, String> {
        let members = Arc::new(Members::new(endpoints, tls)?);
        Ok(Self {
            keep_alive: KeepAliveMux::spawn(members.clone()),
            members,
        })
    }

    async fn range(&self, request: pb::RangeRequest) -> Result<pb::RangeResponse, StoreError> {
        self.members
            .call(|channel| {
                let request = request.clone();
                async move {
                    KvClient::new(channel)
                        .max_decoding_message_size(MAX_DECODE_BYTES)
                        .range(request)
                        .await
                }
            })
            .await
            .map_err(unavailable)
    }
}

// === Members ===

struct Member {
    url: String,
    channel: Channel,
}

/// Every member's channel and the one in use. Moving on is shared: once one
/// call saw a member fail, the next calls start at the next member.
struct Members {
    list: Vec<Member>,
    current: AtomicUsize,
}

impl Members {
    fn new(endpoints: &[String], tls: &EtcdTls) -> Result<Self, String> {
        if endpoints.is_empty() {
            return Err("no etcd endpoint given".to_string());
        }
        let mut list = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|error| format!("invalid etcd endpoint `{url}`: {error}"))?
                .connect_timeout(Duration::from_secs(1))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(3))
                .keep_alive_while_idle(true)
                // A request that times out is cancelled (a local stream reset). h2 closes a
                // connection after 1024 such resets over its life (GOAWAY
                // `too_many_internal_resets`), failing every request on it: under load a
                // registry lost its etcd connections so (registry-bench, 100,000 agents).
                // etcd is a trusted peer: remember more resets, and no lifetime limit.
                .http2_max_concurrent_reset_streams(4096)
                .http2_max_local_error_reset_streams(None);
            if url.starts_with("https://") {
                // Without files: the system's roots, verification on.
                let config = tls
                    .config
                    .clone()
                    .unwrap_or_else(|| ClientTlsConfig::new().with_native_roots());
                endpoint = endpoint
                    .tls_config(config)
                    .map_err(|error| format!("etcd endpoint `{url}`: {error}"))?;
            }
            list.push(Member {
                url: url.clone(),
                channel: endpoint.connect_lazy(),
            });
        }
        Ok(Self {
            list,
            current: AtomicUsize::new(0),
        })
    }

    fn current(&self) -> usize {
        self.current.load(Ordering::Acquire) % self.list.len()
    }

    /// `index` failed: move on, unless another call already did.
    fn failed(&self, index: usize, status: &tonic::Status) {
        let next = (index + 1) % self.list.len();
        if self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            && self.list.len() > 1
        {
            tracing::warn!(
                message = "etcd member failed; moving to the next one.",
                failed = %self.list[index].url,
                next = %self.list[next].url,
                error = %describe(status),
            );
        }
    }

    /// Runs `call` on the current member, then on the others in turn while
    /// they fail in a way another member may not, within [`CALL_TIMEOUT`].
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, tonic::Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_indexed(call).await.map(|(_, answer)| answer)
    }

    /// [`Members::call`], also saying which member answered (streams report
    /// their later failures against it).
    async fn call_indexed<T, F, Fut>(&self, mut call: F) -> Result<(usize, T), tonic::Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + CALL_TIMEOUT;
        let mut tried_in_round = 0;
        let mut last: Option<tonic::Status> = None;
        loop {
            let index = self.current();
            let left = deadline.saturating_duration_since(Instant::now());
            if let (Some(status), true) = (&last, left < Duration::from_millis(20)) {
                // No time left for a real attempt: report the last real failure.
                return Err(give_up(status));
            }
            let attempt = left.min(ATTEMPT_TIMEOUT);
            let status = match tokio::time::timeout(attempt, call(self.list[index].channel.clone())).await {
                Ok(Ok(answer)) => return Ok((index, answer.into_inner())),
                Ok(Err(status)) if !is_member_failure(&status) => return Err(status),
                Ok(Err(status)) => status,
                Err(_) => {
                    let status = tonic::Status::deadline_exceeded(format!(
                        "etcd member {} did not answer within {} ms",
                        self.list[index].url,
                        attempt.as_millis()
                    ));
                    self.failed(index, &status);
                    // An attempt cut short by the call's bound says less than
                    // the failure before it (a refused certificate, say).
                    let status = match last.take() {
                        Some(earlier) if attempt < ATTEMPT_TIMEOUT => earlier,
                        _ => status,
                    };
                    if Instant::now() >= deadline {
                        return Err(give_up(&status));
                    }
                    last = Some(status);
                    continue;
                }
            };
            self.failed(index, &status);
            if Instant::now() >= deadline {
                return Err(give_up(&status));
            }
            last = Some(status);
            tried_in_round += 1;
            if tried_in_round >= self.list.len() {
                tried_in_round = 0;
                tokio::time::sleep(ROUND_PAUSE.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
        }
    }
}

fn give_up(status: &tonic::Status) -> tonic::Status {
    tonic::Status::new(
        status.code(),
        format!(
            "no etcd member answered within {} s (last: {})",
            CALL_TIMEOUT.as_secs(),
            describe(status)
        ),
    )
}

/// Whether another member may succeed where this one failed: the member is
/// unreachable, too slow, or has no leader / lost it mid-call. Answers about
/// the request itself (not found, invalid, compacted) are final.
fn is_member_failure(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// The status with the transport error behind it ("tcp connect error:
/// Connection refused"), which tonic keeps as the source.
fn describe(status: &tonic::Status) -> String {
    let mut text = format!("{}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn require_leader<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        REQUIRE_LEADER.0,
        tonic::metadata::MetadataValue::from_static(REQUIRE_LEADER.1),
    );
    request
}

fn unavailable(status: tonic::Status) -> StoreError {
    StoreError::Unavailable(describe(&status))
}

/// Whether a failed read was an answer too large to decode (tonic: "decoded
/// message length too large").
fn is_too_large(why: &str) -> bool {
    why.contains("message length too large")
}

/// etcd answers a write on a vanished lease with NotFound "requested lease not found".
fn is_lease_not_found(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::NotFound && status.message().contains("lease not found")
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
        let answer = self
            .members
            .call(|channel| async move {
                LeaseClient::new(channel)
                    .lease_grant(pb::LeaseGrantRequest { ttl: ttl_s, id: 0 })
                    .await
            })
            .await
            .map_err(unavailable)?;
        if !answer.error.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "lease grant refused: {}",
                answer.error
            )));
        }
        Ok(answer.id)
    }

    async fn revoke_lease(&self, id: LeaseId) -> Result<Revision, StoreError> {
        let revoke = self
            .members
            .call(|channel| async move {
                LeaseClient::new(channel)
                    .lease_revoke(pb::LeaseRevokeRequest { id })
                    .await
            })
            .await;
        match revoke {
            Ok(answer) => Ok(header_revision(answer.header)),
            Err(status) if is_lease_not_found(&status) => Err(StoreError::LeaseNotFound(id)),
            Err(status) => Err(unavailable(status)),
        }
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<i64, StoreError> {
        self.keep_alive.renew(lease).await
    }

    async fn lease_ttl(&self, id: LeaseId) -> Result<Option<LeaseTtl>, StoreError> {
        let answer = self
            .members
            .call(|channel| async move {
                LeaseClient::new(channel)
                    .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: false })
                    .await
            })
            .await;
        match answer {
            // etcd answers a lease it does not hold with TTL -1 (older
            // versions with NotFound "requested lease not found").
            Ok(answer) if answer.ttl < 0 => Ok(None),
            Ok(answer) => Ok(Some(LeaseTtl {
                granted_s: answer.granted_ttl,
                remaining_s: answer.ttl,
            })),
            Err(status) if is_lease_not_found(&status) => Ok(None),
            Err(status) => Err(unavailable(status)),
        }
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
        let request = pb::TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        };
        // A retry on another member after a lost answer may find its own
        // write applied: the registry's transactions are guarded by mod
        // revisions, so that shows as a Conflict, which callers re-read.
        let answer = self
            .members
            .call(|channel| {
                let request = request.clone();
                async move { KvClient::new(channel).txn(request).await }
            })
            .await;
        match answer {
            Ok(answer) => {
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
        let request = pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        };
        let answer = self.range(request).await?;
        Ok(answer.kvs.into_iter().next().map(from_pb))
    }

    /// In pages at one revision (the first page's), so that a prefix of any
    /// size lists whole and consistent.
    async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let range_end = prefix_end(prefix);
        let mut key = prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut limit = LIST_PAGE_KEYS;
        let mut all = Vec::new();
        loop {
            let request = pb::RangeRequest {
                key: key.clone(),
                range_end: range_end.clone(),
                limit,
                revision,
                ..Default::default()
            };
            let answer = match self.range(request).await {
                Ok(answer) => answer,
                Err(StoreError::Unavailable(why)) if limit > 1 && is_too_large(&why) => {
                    limit /= 2;
                    continue;
                }
                Err(error) => return Err(error),
            };
            if revision == 0 {
                revision = header_revision(answer.header);
            }
            let more = answer.more;
            all.extend(answer.kvs.into_iter().map(from_pb));
            match all.last() {
                Some(last) if more => {
                    // The next page starts right after the last key read.
                    key = last.key.as_bytes().to_vec();
                    key.push(0);
                }
                _ => return Ok((all, revision)),
            }
        }
    }

    async fn watch(&self, prefix: &str, start_revision: Revision) -> Result<WatchStream, StoreError> {
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
        let (index, (responses, requests, first)) = self
            .members
            .call_indexed(|channel| {
                let create = create.clone();
                async move {
                    let (requests, request_stream) = mpsc::channel(1);
                    requests
                        .send(create)
                        .await
                        .map_err(|_| tonic::Status::internal("watch request channel closed"))?;
                    let mut responses = WatchClient::new(channel)
                        .max_decoding_message_size(MAX_DECODE_BYTES)
                        .watch(require_leader(tokio_stream::wrappers::ReceiverStream::new(
                            request_stream,
                        )))
                        .await?
                        .into_inner();
                    // The first answer confirms (or refuses) the watch.
                    let first = responses
                        .message()
                        .await?
                        .ok_or_else(|| tonic::Status::unavailable("watch stream closed at creation"))?;
                    Ok(tonic::Response::new((responses, requests, first)))
                }
            })
            .await
            .map_err(unavailable)?;
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
        let members = self.members.clone();
        let state = (responses, requests, start_revision, members);
        let stream = futures::stream::unfold(Some(state), move |state| async move {
            // `requests` is kept alive so etcd does not see the client half-close.
            let (mut responses, requests, start_revision, members) = state?;
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
                                // "no leader" (the member lost the quorum) among others.
                                let status =
                                    tonic::Status::unavailable(format!("watch canceled: {}", answer.cancel_reason));
                                members.failed(index, &status);
                                unavailable(status)
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
                            Some((responses, requests, start_revision, members)),
                        ));
                    }
                    Ok(None) => {
                        let status = tonic::Status::unavailable("etcd closed the watch stream");
                        members.failed(index, &status);
                        return Some((Err(unavailable(status)), None));
                    }
                    Err(status) => {
                        // The catalog watches again at once: from the next member.
                        if is_member_failure(&status) {
                            members.failed(index, &status);
                        }
                        return Some((Err(unavailable(status)), None));
                    }
                }
            }
        });
        Ok(Box::pin(stream))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.members
            .call(|channel| async move {
                KvClient::new(channel)
                    .compact(pb::CompactionRequest {
                        revision,
                        physical: true,
                    })
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.range(pb::RangeRequest {
            key: b"/agent-reach/ping".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .await?;
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
/// on first use and re-opened (on the next member) after a failure.
#[derive(Clone)]
struct KeepAliveMux {
    requests: mpsc::Sender<(LeaseId, Waiter)>,
}

impl KeepAliveMux {
    fn spawn(members: Arc<Members>) -> Self {
        let (requests, receiver) = mpsc::channel(16_384);
        tokio::spawn(run_keep_alive(members, receiver));
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
            Ok(Err(_)) => Err(StoreError::Unavailable("keep-alive task stopped".to_string())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no etcd member answered the keep-alive within {} s",
                CALL_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// Renewals sent and not answered yet: since when, and who waits.
type Pending = HashMap<LeaseId, (Instant, Vec<Waiter>)>;

fn add_waiter(pending: &mut Pending, id: LeaseId, waiter: Waiter) -> bool {
    let entry = pending.entry(id).or_insert_with(|| (Instant::now(), Vec::new()));
    entry.1.push(waiter);
    entry.1.len() == 1
}

async fn run_keep_alive(members: Arc<Members>, mut requests: mpsc::Receiver<(LeaseId, Waiter)>) {
    let mut pending = Pending::new();
    let mut failures = 0usize;
    loop {
        // Callers that gave up (their own bound) are not renewed for.
        pending.retain(|_, (_, waiters)| {
            waiters.retain(|waiter| !waiter.is_closed());
            !waiters.is_empty()
        });
        if pending.is_empty() {
            // Open a stream only when there is something to renew.
            match requests.recv().await {
                Some((id, waiter)) => {
                    add_waiter(&mut pending, id, waiter);
                }
                None => return,
            }
        }
        let index = members.current();
        let failure = keep_alive_on(&members.list[index], &mut pending, &mut requests).await;
        let Some(status) = failure else { return };
        tracing::warn!(message = "etcd keep-alive stream failed; reopening.", member = %members.list[index].url, error = %describe(&status));
        members.failed(index, &status);
        failures += 1;
        if failures.is_multiple_of(members.list.len()) {
            // Every member failed once: let an election finish.
            tokio::time::sleep(ROUND_PAUSE).await;
        }
        // The renewals in `pending` are sent again on the next stream.
    }
}

/// Serves renewals on one stream to `member` until it fails (the reason is
/// returned) or the store is dropped (`None`).
async fn keep_alive_on(
    member: &Member,
    pending: &mut Pending,
    requests: &mut mpsc::Receiver<(LeaseId, Waiter)>,
) -> Option<tonic::Status> {
    let (sender, outgoing) = mpsc::channel::<pb::LeaseKeepAliveRequest>(16_384);
    // etcd answers the stream's headers only with its first response, so the
    // first requests must be queued before waiting for the stream to open.
    for (id, (since, _)) in pending.iter_mut() {
        *since = Instant::now();
        let _ = sender.try_send(pb::LeaseKeepAliveRequest { id: *id });
    }
    let mut client = LeaseClient::new(member.channel.clone());
    let open = client.lease_keep_alive(require_leader(tokio_stream::wrappers::ReceiverStream::new(outgoing)));
    let mut incoming = match tokio::time::timeout(ATTEMPT_TIMEOUT, open).await {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return Some(status),
        Err(_) => {
            return Some(tonic::Status::deadline_exceeded(format!(
                "no keep-alive stream within {} ms",
                ATTEMPT_TIMEOUT.as_millis()
            )))
        }
    };
    // A member that stops answering (frozen, cut off) keeps its stream
    // open: a renewal unanswered for an attempt's bound ends the stream.
    let mut check = tokio::time::interval(ATTEMPT_TIMEOUT / 4);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                Some((id, waiter)) => {
                    // Coalesce: one message per lease in flight.
                    if add_waiter(pending, id, waiter) && sender.send(pb::LeaseKeepAliveRequest { id }).await.is_err() {
                        return Some(tonic::Status::unavailable("keep-alive stream closed"));
                    }
                }
                None => return None,
            },
            answer = incoming.next() => match answer {
                Some(Ok(answer)) => {
                    let waiters = pending.remove(&answer.id).map(|(_, waiters)| waiters).unwrap_or_default();
                    for waiter in waiters {
                        let result = if answer.ttl > 0 { Ok(answer.ttl) } else { Err(StoreError::LeaseNotFound(answer.id)) };
                        let _ = waiter.send(result);
                    }
                }
                Some(Err(status)) => return Some(status),
                None => return Some(tonic::Status::unavailable("etcd closed the keep-alive stream")),
            },
            _ = check.tick() => {
                if pending.values().any(|(since, _)| since.elapsed() > ATTEMPT_TIMEOUT) {
                    return Some(tonic::Status::deadline_exceeded(format!(
                        "a renewal went unanswered for {} ms",
                        ATTEMPT_TIMEOUT.as_millis()
                    )));
                }
            }
        }
    }
}
