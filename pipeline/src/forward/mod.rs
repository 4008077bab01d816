//! Forwarding one attempt to one instance over a pooled keep-alive HTTP/1.1
//! connection, bounded by the request's absolute deadline, and classifying what
//! came back. The decision to retry is the caller's (`invoke`).
//!
//! The client is the router's own, not hyper's: a request takes an idle
//! connection from its thread's pool, writes the request in one syscall, reads
//! the answer itself and puts the connection back, all in the request's task.
//! (hyper's pooled client drives each connection from a separate task, so every
//! call crossed two channels and two extra task wake-ups; profiled, that was
//! the largest single cost of forwarding.) Agents answer with `Content-Length`
//! or chunked bodies, or close the connection after the body.
//!
//! `https://` endpoints are reached over TLS (rustls, verified against
//! `--agent-ca-file` or the system's roots, with a client certificate when
//! mutual TLS is configured); the handshake is part of making the connection,
//! so a certificate the router does not trust fails the attempt as a connect
//! failure (the instance never saw the request; it counts against its
//! health and breaker and the call may go to another instance), and the
//! reason is logged once per endpoint and reason.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::StatusCode;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Largest agent answer the router reads (an answer is a JSON envelope, not a stream).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Largest status line plus headers of an answer.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most headers an answer may carry.
const MAX_HEADERS: usize = 64;
/// An idle pooled connection older than this is closed instead of reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A fresh connection's read buffer (it grows for larger answers).
const READ_BUFFER_BYTES: usize = 4 * 1024;
/// Largest read buffer an idle connection keeps.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;
/// Bound on making a connection (the deadline bounds it too).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What one attempt produced.
#[derive(Debug)]
pub enum AttemptResult {
    /// The agent answered with this status and body.
    Answered { status: StatusCode, body: Bytes },
    /// The connection could not be made: the agent never saw the request.
    ConnectFailed(String),
    /// The connection broke before a complete answer arrived.
    Broken(String),
    /// The deadline passed before an answer.
    TimedOut,
}

/// Headers the router sets on every forwarded request besides `host`,
/// `content-type` and `content-length` (the request id travels in the
/// envelope: a header of its own only cost every agent a parse).
pub struct ForwardHeaders<'a> {
    /// A valid header value (see [`header_value_or_dash`]).
    pub traceparent: &'a [u8],
    /// The router's assertion for this attempt, `Bearer <jwt>` (base64url and dots only).
    pub authorization: &'a [u8],
}

/// `value` if it is a valid header value as written here (tab or visible
/// ASCII and spaces), else `-`. Trace contexts are made valid, so this only
/// guards the writer.
pub fn header_value_or_dash(value: &str) -> &[u8] {
    let valid = value.bytes().all(|byte| byte == b'\t' || (0x20..0x7f).contains(&byte));
    if valid {
        value.as_bytes()
    } else {
        b"-"
    }
}

/// A connection to an agent: plain TCP for `http://`, TLS over it for `https://`.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// How the router reaches `https://` agents: a TLS configuration, or why there is none.
pub type AgentTls = Result<Arc<rustls::ClientConfig>, String>;

struct Idle {
    stream: Stream,
    /// The connection's read buffer, kept for its next answer.
    input: BytesMut,
    since: Instant,
}

/// Distinguishes forwarders sharing a thread (several routers in one test process).
static NEXT_FORWARDER_ID: AtomicUsize = AtomicUsize::new(0);

/// One forwarder's idle connections on one thread, by instance authority.
#[derive(Default)]
struct Pool {
    /// aHash: this map is looked up twice per forwarded request.
    idle: ahash::AHashMap<String, Vec<Idle>>,
    last_sweep: Option<Instant>,
}

impl Pool {
    /// Closes connections idle past the timeout and forgets instances with none
    /// left, so instances that went away do not keep sockets open.
    fn sweep(&mut self, now: Instant) {
        self.idle.retain(|_, connections| {
            connections.retain(|connection| now.duration_since(connection.since) < IDLE_TIMEOUT);
            !connections.is_empty()
        });
        self.last_sweep = Some(now);
    }
}

thread_local! {
    /// Idle connections per forwarder per thread: a request never hops threads
    /// to reach its connection, and threads share no pool lock.
    static POOLS: RefCell<Vec<(usize, Pool)>> = const { RefCell::new(Vec::new()) };
}

/// Pools a connection of `forwarder`'s on this thread (see `Forwarder::put_idle`).
fn put_idle(
    forwarder: usize,
    idle_per_instance: usize,
    authority: &str,
    stream: Stream,
    input: BytesMut,
    now: Instant,
) {
    POOLS.with(|pools| {
        let mut pools = pools.borrow_mut();
        let at = match pools.iter().position(|(id, _)| *id == forwarder) {
            Some(at) => at,
            None => {
                pools.push((forwarder, Pool::default()));
                pools.len() - 1
            }
        };
        let pool = &mut pools[at].1;
        if pool
            .last_sweep
            .is_none_or(|last| now.duration_since(last) >= IDLE_TIMEOUT / 4)
        {
            pool.sweep(now);
        }
        let connection = Idle {
            stream,
            input,
            since: now,
        };
        // No key allocation on the hot path: only an instance's first connection adds one.
        match pool.idle.get_mut(authority) {
            Some(idle) if idle.len() >= idle_per_instance => {}
            Some(idle) => idle.push(connection),
            None => {
                pool.idle.insert(authority.to_string(), vec![connection]);
            }
        }
    })
}

pub struct Forwarder {
    id: usize,
    idle_per_instance: usize,
    tls: AgentTls,
    /// (endpoint, reason) pairs already logged, so a bad certificate is one line, not one per call.
    logged: std::sync::Mutex<ahash::AHashSet<(String, String)>>,
}

/// How an exchange on one connection ended.
enum Exchange {
    Done {
        status: StatusCode,
        body: Bytes,
        reusable: bool,
    },
    /// Failed before the first byte of an answer: on a reused connection this is
    /// the agent having closed it while idle, and a fresh connection is tried.
    FailedBeforeAnswer(String),
    Broken(String),
}

impl Forwarder {
    pub fn new(idle_per_instance: usize, tls: AgentTls) -> Self {
        Self {
            id: NEXT_FORWARDER_ID.fetch_add(1, Ordering::Relaxed),
            idle_per_instance,
            tls,
            logged: std::sync::Mutex::default(),
        }
    }

    /// Makes a connection to `authority`, with a TLS handshake for `https`.
    /// Callers box it: a pooled connection is the rule, and the handshake's
    /// state inline in every attempt's future made it ~4 KB to move per call.
    async fn connect(&self, authority: &str, host: &str, https: bool) -> Result<Stream, String> {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(format!("cannot connect to {authority}: {error}")),
            Err(_) => {
                return Err(format!(
                    "cannot connect to {authority} within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            }
        };
        // Small requests and answers: Nagle would only add delay.
        let _ = stream.set_nodelay(true);
        if !https {
            return Ok(Stream::Plain(stream));
        }
        let config = self.tls.as_ref().map_err(|why| self.log_tls(authority, why.clone()))?;
        let name = rustls::pki_types::ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .map_err(|error| self.log_tls(authority, format!("`{host}` is not a TLS server name: {error}")))?
            .to_owned();
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, stream)).await {
            Ok(Ok(stream)) => Ok(Stream::Tls(Box::new(stream))),
            Ok(Err(error)) => Err(self.log_tls(authority, format!("TLS handshake with {authority} failed: {error}"))),
            Err(_) => Err(self.log_tls(
                authority,
                format!(
                    "TLS handshake with {authority} took over {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            )),
        }
    }

    /// POSTs `body` to `uri` asking for server-sent events, up to the
    /// answer's head (`crate::stream`). Over a pooled connection, as every
    /// attempt: a stream holds its connection for its whole life and puts it
    /// back only once the agent's answer was read to its end
    /// ([`AgentBody::read_into`]); a stream cut short (the caller left, the
    /// deadline, a broken or oversized answer) drops it, which also cancels the
    /// agent's request. The caller bounds this by the deadline; `now` is the
    /// attempt's start.
    pub(crate) async fn open_stream(
        &self,
        uri: &http::Uri,
        body: &[u8],
        headers: &ForwardHeaders<'_>,
        now: Instant,
    ) -> Opened {
        let (authority, https) = match target(uri) {
            Ok(target) => target,
            Err(why) => return Opened::Other(AttemptResult::ConnectFailed(why)),
        };
        let path = uri.path_and_query().map_or("/", |path| path.as_str());
        let request = encode_request(authority, path, body, headers, b"accept: text/event-stream\r\n");
        if let Some((mut stream, mut input)) = self.take_idle(authority, https, now) {
            // As in `send`: a pooled connection the agent closed while idle fails
            // before any answer byte, and the request goes out on a fresh one.
            match send_and_read_head(&mut stream, &mut input, &request).await {
                Err(Exchange::FailedBeforeAnswer(_)) => {}
                head => return self.opened(authority, head, stream, input, now).await,
            }
        }
        let mut stream = match Box::pin(self.connect(authority, uri.host().unwrap_or(authority), https)).await {
            Ok(stream) => stream,
            Err(why) => return Opened::Other(AttemptResult::ConnectFailed(why)),
        };
        let mut input = BytesMut::with_capacity(READ_BUFFER_BYTES);
        let head = send_and_read_head(&mut stream, &mut input, &request).await;
        self.opened(authority, head, stream, input, now).await
    }

    /// A streamed attempt once its head is read: the events' body, or the whole answer.
    async fn opened(
        &self,
        authority: &str,
        head: Result<Head, Exchange>,
        stream: Stream,
        input: BytesMut,
        now: Instant,
    ) -> Opened {
        let head = match head {
            Ok(head) => head,
            Err(Exchange::FailedBeforeAnswer(why) | Exchange::Broken(why)) => {
                return Opened::Other(AttemptResult::Broken(why))
            }
            Err(Exchange::Done { status, body, .. }) => return Opened::Other(AttemptResult::Answered { status, body }),
        };
        if head.status.is_success() && head.events {
            let body = match head.framing {
                Framing::Length(length) => BodyState::Length(length),
                Framing::Chunked => BodyState::ChunkSize,
                Framing::UntilClose => BodyState::UntilClose,
            };
            return Opened::Events(AgentBody {
                connection: Some((stream, input)),
                body,
                reusable: head.keep_alive && head.framing != Framing::UntilClose,
                slot: PoolSlot {
                    forwarder: self.id,
                    idle_per_instance: self.idle_per_instance,
                    authority: authority.to_string(),
                },
            });
        }
        let (done, kept) = read_whole(stream, input, head).await;
        Opened::Other(self.finish(authority, done, kept, now))
    }

    /// Logs a TLS failure once per endpoint and reason (a certificate the router does not
    /// trust is an operator's problem to fix, not a line per call), and returns it.
    fn log_tls(&self, authority: &str, why: String) -> String {
        let mut logged = self.logged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Bounded: an endpoint cycling through reasons cannot grow it without limit.
        if logged.len() > 1024 {
            logged.clear();
        }
        if logged.insert((authority.to_string(), why.clone())) {
            tracing::warn!(message = "Cannot reach an https agent: TLS failed.", endpoint = authority, reason = %why);
        }
        why
    }

    /// An idle connection to `authority` younger than the idle timeout at `now`.
    fn take_idle(&self, authority: &str, https: bool, now: Instant) -> Option<(Stream, BytesMut)> {
        POOLS.with(|pools| {
            let mut pools = pools.borrow_mut();
            let (_, pool) = pools.iter_mut().find(|(id, _)| *id == self.id)?;
            let idle = pool.idle.get_mut(authority)?;
            // The most recently used first; older ones past the idle timeout are closed.
            while let Some(connection) = idle.pop() {
                // The scheme is part of the connection: an endpoint re-registered from
                // http:// to https:// (same authority) never reuses a plain one.
                if now.saturating_duration_since(connection.since) < IDLE_TIMEOUT && connection.stream.is_tls() == https
                {
                    return Some((connection.stream, connection.input));
                }
            }
            None
        })
    }

    /// Pools a connection whose attempt started at `now`: it counts as idle
    /// from then (no clock read per request), so it retires at most the
    /// attempt's duration early.
    fn put_idle(&self, authority: &str, stream: Stream, input: BytesMut, now: Instant) {
        put_idle(self.id, self.idle_per_instance, authority, stream, input, now);
    }

    /// POSTs `body` to `uri`, giving up at `deadline`; `now` is the attempt's start.
    pub async fn send(
        &self,
        uri: &http::Uri,
        body: Bytes,
        headers: &ForwardHeaders<'_>,
        deadline: Instant,
        now: Instant,
    ) -> AttemptResult {
        self.send_with(uri, (&body, b""), headers, deadline, now).await
    }

    /// POSTs a pause request for a running delivery (DESIGN §9): `body`
    /// with `x-agent-reach-control: pause`, to the instance's endpoint.
    pub async fn pause(
        &self,
        uri: &http::Uri,
        body: &[u8],
        headers: &ForwardHeaders<'_>,
        deadline: Instant,
        now: Instant,
    ) -> AttemptResult {
        self.send_with(uri, (body, b"x-agent-reach-control: pause\r\n"), headers, deadline, now)
            .await
    }

    async fn send_with(
        &self,
        uri: &http::Uri,
        (body, extra): (&[u8], &[u8]),
        headers: &ForwardHeaders<'_>,
        deadline: Instant,
        now: Instant,
    ) -> AttemptResult {
        let (authority, https) = match target(uri) {
            Ok(target) => target,
            Err(why) => return AttemptResult::ConnectFailed(why),
        };
        let path = uri.path_and_query().map_or("/", |path| path.as_str());
        let request = encode_request(authority, path, body, headers, extra);
        let attempt = async {
            if let Some((stream, input)) = self.take_idle(authority, https, now) {
                // A reused connection is not probed first (that costs a syscall per call):
                // if the agent closed it while idle, the exchange fails before any answer
                // byte and the request goes out once more on a fresh connection. Agents
                // deduplicate by request id (DESIGN §3), as for any retry.
                match exchange(stream, input, &request).await {
                    (Exchange::FailedBeforeAnswer(_), _) => {}
                    (done, stream) => return self.finish(authority, done, stream, now),
                }
            }
            let stream = match Box::pin(self.connect(authority, uri.host().unwrap_or(authority), https)).await {
                Ok(stream) => stream,
                Err(why) => return AttemptResult::ConnectFailed(why),
            };
            let (done, stream) = exchange(stream, BytesMut::with_capacity(READ_BUFFER_BYTES), &request).await;
            self.finish(authority, done, stream, now)
        };
        match tokio::time::timeout_at(deadline.into(), attempt).await {
            Ok(result) => result,
            Err(_) => AttemptResult::TimedOut,
        }
    }

    fn finish(&self, authority: &str, done: Exchange, kept: Option<(Stream, BytesMut)>, now: Instant) -> AttemptResult {
        match done {
            Exchange::Done { status, body, reusable } => {
                if let (true, Some((stream, input))) = (reusable, kept) {
                    self.put_idle(authority, stream, input, now);
                }
                AttemptResult::Answered { status, body }
            }
            Exchange::FailedBeforeAnswer(why) | Exchange::Broken(why) => AttemptResult::Broken(why),
        }
    }
}

mod body;
mod http1;
#[cfg(test)]
mod tests;

pub(crate) use body::*;
use http1::*;
