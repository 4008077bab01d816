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
enum Stream {
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
        let (authority, https) = match target(uri) {
            Ok(target) => target,
            Err(why) => return AttemptResult::ConnectFailed(why),
        };
        let path = uri.path_and_query().map_or("/", |path| path.as_str());
        let request = encode_request(authority, path, &body, headers, b"");
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

/// `uri`'s authority and whether it is `https://`.
fn target(uri: &http::Uri) -> Result<(&str, bool), String> {
    let Some(authority) = uri.authority().map(|authority| authority.as_str()) else {
        return Err(format!("the endpoint `{uri}` has no host"));
    };
    match uri.scheme_str() {
        Some("http") | None => Ok((authority, false)),
        Some("https") => Ok((authority, true)),
        Some(other) => Err(format!(
            "the endpoint `{uri}` is neither http:// nor https:// ({other})"
        )),
    }
}

/// The request's bytes; `extra` is more header lines, each ending in CRLF.
fn encode_request(authority: &str, path: &str, body: &[u8], headers: &ForwardHeaders<'_>, extra: &[u8]) -> Vec<u8> {
    let mut request = Vec::with_capacity(256 + body.len());
    request.extend_from_slice(b"POST ");
    request.extend_from_slice(path.as_bytes());
    request.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    request.extend_from_slice(authority.as_bytes());
    request.extend_from_slice(b"\r\ncontent-type: application/json\r\ntraceparent: ");
    request.extend_from_slice(headers.traceparent);
    request.extend_from_slice(b"\r\nauthorization: ");
    request.extend_from_slice(headers.authorization);
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(extra);
    request.extend_from_slice(b"content-length: ");
    request.extend_from_slice(agent_reach_serving::decimal(body.len() as u64, &mut [0; 20]));
    request.extend_from_slice(b"\r\n\r\n");
    request.extend_from_slice(body);
    request
}

/// An answer's head as the router uses it.
#[derive(Debug, Clone, Copy)]
struct Head {
    status: StatusCode,
    framing: Framing,
    keep_alive: bool,
    /// `content-type: text/event-stream`.
    events: bool,
}

/// Writes `request` and reads the answer's head into `input` (empty; the
/// connection's buffer), leaving what follows the head in `input`.
async fn send_and_read_head(stream: &mut Stream, input: &mut BytesMut, request: &[u8]) -> Result<Head, Exchange> {
    // TLS buffers records: the flush sends them (a no-op on plain TCP).
    let sent = match stream.write_all(request).await {
        Ok(()) => stream.flush().await,
        Err(error) => Err(error),
    };
    if let Err(error) = sent {
        return Err(Exchange::FailedBeforeAnswer(format!(
            "sending the request failed: {error}"
        )));
    }
    // The head: status line and headers (skipping any 1xx interim answers).
    loop {
        let parsed = {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(input) {
                Ok(httparse::Status::Complete(length)) => Some(head_of(&response).map(|head| (head, length))),
                Ok(httparse::Status::Partial) => None,
                Err(error) => Some(Err(format!("the agent's answer is not HTTP/1.1: {error}"))),
            }
        };
        match parsed {
            Some(Ok((head, length))) => {
                input.advance(length);
                if head.status.is_informational() {
                    continue;
                }
                return Ok(head);
            }
            Some(Err(why)) => return Err(Exchange::Broken(why)),
            None if input.len() > MAX_HEAD_BYTES => {
                return Err(Exchange::Broken("the agent's answer headers are too large".to_string()))
            }
            None => match stream.read_buf(input).await {
                Ok(0) if input.is_empty() => {
                    return Err(Exchange::FailedBeforeAnswer(
                        "the agent closed the connection without answering".to_string(),
                    ))
                }
                Ok(0) => return Err(Exchange::Broken("the answer was cut short".to_string())),
                Ok(_) => {}
                Err(error) if input.is_empty() => {
                    return Err(Exchange::FailedBeforeAnswer(format!(
                        "reading the answer failed: {error}"
                    )))
                }
                Err(error) => return Err(Exchange::Broken(format!("reading the answer failed: {error}"))),
            },
        }
    }
}

/// Writes `request` and reads one answer into `input` (empty; the
/// connection's buffer). The stream and buffer come back when the
/// connection may be reused or retried on.
async fn exchange(mut stream: Stream, mut input: BytesMut, request: &[u8]) -> (Exchange, Option<(Stream, BytesMut)>) {
    match send_and_read_head(&mut stream, &mut input, request).await {
        Ok(head) => read_whole(stream, input, head).await,
        Err(failed) => (failed, None),
    }
}

/// Reads the body of an answer whose `head` was read.
async fn read_whole(mut stream: Stream, mut input: BytesMut, head: Head) -> (Exchange, Option<(Stream, BytesMut)>) {
    let Head {
        status,
        framing,
        keep_alive,
        ..
    } = head;
    let body = match framing {
        Framing::Length(length) => read_exactly(&mut stream, &mut input, length).await,
        Framing::Chunked => read_chunked(&mut stream, &mut input).await,
        Framing::UntilClose => read_to_close(&mut stream, &mut input).await,
    };
    match body {
        Ok(body) => {
            // Bytes beyond the body would be an answer nobody asked for: do not reuse.
            let reusable = keep_alive && framing != Framing::UntilClose && input.is_empty();
            // The body was split off the buffer; once it is dropped, the next
            // answer reuses the allocation. A large buffer is not kept.
            if input.capacity() > KEPT_BUFFER_BYTES {
                input = BytesMut::with_capacity(READ_BUFFER_BYTES);
            }
            (
                Exchange::Done { status, body, reusable },
                reusable.then_some((stream, input)),
            )
        }
        Err(why) => (Exchange::Broken(why), None),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Status, body framing and whether the connection stays open, from a parsed head.
fn head_of(response: &httparse::Response<'_, '_>) -> Result<Head, String> {
    let status = response
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| "the agent's answer has no valid status".to_string())?;
    let mut framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    let mut keep_alive = response.version == Some(1);
    let mut events = false;
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            let length = std::str::from_utf8(header.value)
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
                .ok_or_else(|| "the agent's answer has an invalid Content-Length".to_string())?;
            if length > MAX_ANSWER_BYTES {
                return Err(format!("the agent's answer is larger than {MAX_ANSWER_BYTES} bytes"));
            }
            framing = Framing::Length(length);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let value = header.value.trim_ascii();
            if value.len() >= 7 && value[value.len() - 7..].eq_ignore_ascii_case(b"chunked") {
                framing = Framing::Chunked;
            }
        } else if header.name.eq_ignore_ascii_case("connection") {
            let has = |token: &[u8]| {
                header
                    .value
                    .windows(token.len())
                    .any(|window| window.eq_ignore_ascii_case(token))
            };
            if has(b"close") {
                keep_alive = false;
            } else if has(b"keep-alive") {
                keep_alive = true;
            }
        } else if header.name.eq_ignore_ascii_case("content-type") {
            events = agent_reach_serving::sse::accepts_events(Some(header.value));
        }
    }
    Ok(Head {
        status,
        framing,
        keep_alive,
        events,
    })
}

async fn fill(stream: &mut Stream, input: &mut BytesMut) -> Result<(), String> {
    match stream.read_buf(input).await {
        Ok(0) => Err("the answer was cut short".to_string()),
        Ok(_) => Ok(()),
        Err(error) => Err(format!("reading the answer failed: {error}")),
    }
}

async fn read_exactly(stream: &mut Stream, input: &mut BytesMut, length: usize) -> Result<Bytes, String> {
    if input.capacity() < length {
        input.reserve(length - input.len());
    }
    while input.len() < length {
        fill(stream, input).await?;
    }
    Ok(input.split_to(length).freeze())
}

async fn read_to_close(stream: &mut Stream, input: &mut BytesMut) -> Result<Bytes, String> {
    loop {
        if input.len() > MAX_ANSWER_BYTES {
            return Err(format!("the agent's answer is larger than {MAX_ANSWER_BYTES} bytes"));
        }
        match stream.read_buf(input).await {
            Ok(0) => return Ok(input.split().freeze()),
            Ok(_) => {}
            Err(error) => return Err(format!("reading the answer failed: {error}")),
        }
    }
}

/// Decodes a chunked body (chunk extensions and trailers are skipped).
async fn read_chunked(stream: &mut Stream, input: &mut BytesMut) -> Result<Bytes, String> {
    let mut body = BytesMut::new();
    loop {
        let line = read_line(stream, input).await?;
        let size = chunk_size_of(&line).ok_or_else(|| "the agent's answer has an invalid chunk size".to_string())?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(stream, input).await?.is_empty() {}
            return Ok(body.freeze());
        }
        if body.len() + size > MAX_ANSWER_BYTES {
            return Err(format!("the agent's answer is larger than {MAX_ANSWER_BYTES} bytes"));
        }
        while input.len() < size + 2 {
            fill(stream, input).await?;
        }
        body.extend_from_slice(&input[..size]);
        if &input[size..size + 2] != b"\r\n" {
            return Err("the agent's answer has a malformed chunk".to_string());
        }
        input.advance(size + 2);
    }
}

/// One CRLF-terminated line, without the CRLF.
async fn read_line(stream: &mut Stream, input: &mut BytesMut) -> Result<Vec<u8>, String> {
    loop {
        if let Some(end) = input.windows(2).position(|pair| pair == b"\r\n") {
            let line = input[..end].to_vec();
            input.advance(end + 2);
            return Ok(line);
        }
        if input.len() > MAX_HEAD_BYTES {
            return Err("the agent's answer has an overlong chunk line".to_string());
        }
        fill(stream, input).await?;
    }
}

// === Streamed answers ===

/// What opening a streamed answer came to ([`Forwarder::open_stream`]).
pub(crate) enum Opened {
    /// 2xx with `content-type: text/event-stream`: the body, read as it arrives.
    Events(AgentBody),
    /// Any other answer (read whole) or a failure, as [`Forwarder::send`] reports it.
    Other(AttemptResult),
}

/// Where a streamed answer's connection goes back once read to its end.
struct PoolSlot {
    forwarder: usize,
    idle_per_instance: usize,
    authority: String,
}

/// Where the reading of a streamed body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    /// `Content-Length` framing: the bytes still to come.
    Length(usize),
    /// The body ends when the agent closes the connection.
    UntilClose,
    /// Chunked: a chunk-size line is next.
    ChunkSize,
    /// Chunked: this many bytes of the current chunk are still to come.
    ChunkData(usize),
    /// Chunked: the CRLF after a chunk's data is next.
    ChunkEnd,
    /// Chunked: the trailer lines after the last chunk, up to an empty one.
    Trailers,
    Done,
}

/// The body of a streamed answer, read as the agent writes it: each
/// [`AgentBody::read_into`] hands over what one read of the connection
/// brought (decoded from its framing), so many events written back to back
/// travel on together. Dropping it before the end closes the connection,
/// which cancels the agent's request; read to the end over a keep-alive
/// connection, the connection goes back to the pool it came from.
pub(crate) struct AgentBody {
    /// The connection and its read buffer; `None` once the body ended.
    connection: Option<(Stream, BytesMut)>,
    body: BodyState,
    /// The agent keeps the connection open after the answer.
    reusable: bool,
    slot: PoolSlot,
}

impl AgentBody {
    /// Appends the next of the body's bytes to `out`, reading the connection
    /// when none are buffered; `Ok(false)` once the body has ended (nothing
    /// was appended). At most `most` bytes of what was read are moved (the
    /// rest stays for the next call, which needs no read: the first event
    /// of a stream need not wait for every chunk behind it to be decoded).
    /// Cancel-safe: what was read stays buffered.
    pub(crate) async fn read_into(&mut self, out: &mut BytesMut, most: usize) -> Result<bool, String> {
        loop {
            if let Some(moved) = self.read_buffered(out, most)? {
                return Ok(moved);
            }
            let Some((stream, input)) = self.connection.as_mut() else {
                return Ok(false);
            };
            input.reserve(READ_BUFFER_BYTES);
            match stream.read_buf(input).await {
                Ok(0) if self.body == BodyState::UntilClose => {
                    self.body = BodyState::Done;
                    self.connection = None;
                    return Ok(false);
                }
                Ok(0) => return Err("the agent closed the connection inside its answer".to_string()),
                Ok(_) => {}
                Err(error) => return Err(format!("reading the answer failed: {error}")),
            }
        }
    }

    /// [`AgentBody::read_into`] from the bytes already read only: `None`
    /// when it would have to read the connection (nothing decodable is left).
    pub(crate) fn read_buffered(&mut self, out: &mut BytesMut, most: usize) -> Result<Option<bool>, String> {
        let Some((_, input)) = self.connection.as_mut() else {
            return Ok(Some(false));
        };
        let before = out.len();
        if decode(&mut self.body, input, out, most)? {
            self.finish();
            return Ok(Some(out.len() > before));
        }
        Ok((out.len() > before).then_some(true))
    }

    /// The body ended: the connection goes back to its pool if the agent
    /// keeps it open and sent nothing beyond the answer.
    fn finish(&mut self) {
        if let Some((stream, mut input)) = self.connection.take() {
            if self.reusable && input.is_empty() {
                if input.capacity() > KEPT_BUFFER_BYTES {
                    input = BytesMut::with_capacity(READ_BUFFER_BYTES);
                }
                let slot = &self.slot;
                put_idle(
                    slot.forwarder,
                    slot.idle_per_instance,
                    &slot.authority,
                    stream,
                    input,
                    Instant::now(),
                );
            }
        }
    }
}

/// Moves what `input` holds of the body into `out`, as far as it goes;
/// `Ok(true)` once the body's end was reached.
/// At most `most` bytes are moved per call (a chunk may be cut).
fn decode(state: &mut BodyState, input: &mut BytesMut, out: &mut BytesMut, most: usize) -> Result<bool, String> {
    let start = out.len();
    loop {
        match *state {
            BodyState::Done => return Ok(true),
            BodyState::Length(0) => {
                *state = BodyState::Done;
            }
            BodyState::Length(left) | BodyState::ChunkData(left) => {
                let room = most.saturating_sub(out.len() - start);
                let take = left.min(input.len()).min(room);
                if take == 0 {
                    return Ok(false);
                }
                out.extend_from_slice(&input[..take]);
                input.advance(take);
                *state = match *state {
                    BodyState::Length(_) => BodyState::Length(left - take),
                    _ if left == take => BodyState::ChunkEnd,
                    _ => BodyState::ChunkData(left - take),
                };
            }
            BodyState::UntilClose => {
                out.extend_from_slice(input);
                input.clear();
                return Ok(false);
            }
            BodyState::ChunkEnd => {
                if input.len() < 2 {
                    return Ok(false);
                }
                if &input[..2] != b"\r\n" {
                    return Err("the agent's answer has a malformed chunk".to_string());
                }
                input.advance(2);
                *state = BodyState::ChunkSize;
            }
            BodyState::ChunkSize | BodyState::Trailers => {
                // The line ends at the first `\r\n` (memchr finds each `\n` a word at a time).
                let mut from = 0;
                let end = loop {
                    match memchr::memchr(b'\n', &input[from..]) {
                        Some(at) if from + at > 0 && input[from + at - 1] == b'\r' => break Some(from + at - 1),
                        Some(at) => from += at + 1,
                        None => break None,
                    }
                };
                let Some(end) = end else {
                    if input.len() > MAX_HEAD_BYTES {
                        return Err("the agent's answer has an overlong chunk line".to_string());
                    }
                    return Ok(false);
                };
                if *state == BodyState::Trailers {
                    *state = if end == 0 { BodyState::Done } else { BodyState::Trailers };
                } else {
                    let size = chunk_size_of(&input[..end])
                        .ok_or_else(|| "the agent's answer has an invalid chunk size".to_string())?;
                    *state = if size == 0 {
                        BodyState::Trailers
                    } else {
                        BodyState::ChunkData(size)
                    };
                }
                input.advance(end + 2);
            }
        }
    }
}

/// A chunk-size line's size: hex digits, spaces or tabs around them,
/// anything after a `;` (chunk extensions) ignored; `None` for anything else
/// or a size past `usize`.
fn chunk_size_of(line: &[u8]) -> Option<usize> {
    let digits = line.split(|&byte| byte == b';').next()?;
    let digits = digits.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |size, &byte| {
        let digit = (byte as char).to_digit(16)?;
        size.checked_mul(16)?.checked_add(digit as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn chunk_sizes_are_hex_with_extensions_ignored() {
        for (line, size) in [
            (&b"0"[..], Some(0)),
            (b"2d", Some(0x2d)),
            (b"2D", Some(0x2d)),
            (b"0010", Some(0x10)),
            (b" 1a \t", Some(0x1a)),
            (b"1a;name=value", Some(0x1a)),
            (b"ffffffffffffffff", Some(usize::MAX)),
            (b"", None),
            (b";x", None),
            (b"+1", None),
            (b"-1", None),
            (b"1 2", None),
            (b"0x10", None),
            (b"g", None),
            (b"10000000000000000", None),
        ] {
            assert_eq!(chunk_size_of(line), size, "{:?}", String::from_utf8_lossy(line));
        }
    }

    /// An "agent" answering each accepted connection's requests with `answers`, in order.
    async fn agent(answers: Vec<&'static [u8]>) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            for answer in answers {
                let mut request = vec![0u8; 64 * 1024];
                let _ = stream.read(&mut request).await.unwrap();
                stream.write_all(answer).await.unwrap();
            }
        });
        addr
    }

    async fn send(forwarder: &Forwarder, addr: std::net::SocketAddr) -> AttemptResult {
        let uri: http::Uri = format!("http://{addr}/invoke").parse().unwrap();
        let headers = ForwardHeaders {
            traceparent: b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            authorization: b"Bearer test",
        };
        assert_eq!(header_value_or_dash("a\nb"), b"-");
        forwarder
            .send(
                &uri,
                Bytes::from_static(b"{}"),
                &headers,
                Instant::now() + Duration::from_secs(5),
                Instant::now(),
            )
            .await
    }

    fn answered(result: AttemptResult) -> (StatusCode, Bytes) {
        match result {
            AttemptResult::Answered { status, body } => (status, body),
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reads_length_chunked_and_until_close_answers_and_reuses_connections() {
        let forwarder = Forwarder::new(4, Err("no TLS in this test".to_string()));
        // One connection serves both: the second request reuses it.
        let addr = agent(vec![
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n{\"a\":1}",
            b"HTTP/1.1 422 Unprocessable Entity\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{\"b\r\n4;ext=1\r\n\":2}\r\n0\r\nx-trailer: 1\r\n\r\n",
        ])
        .await;
        let first = answered(send(&forwarder, addr).await);
        assert_eq!(first, (StatusCode::OK, Bytes::from_static(b"{\"a\":1}")));
        // The pooled connection's read buffer is reused while the first body is still held.
        assert_eq!(
            answered(send(&forwarder, addr).await),
            (StatusCode::UNPROCESSABLE_ENTITY, Bytes::from_static(b"{\"b\":2}"))
        );
        assert_eq!(first.1, Bytes::from_static(b"{\"a\":1}"));
        let addr = agent(vec![b"HTTP/1.0 200 OK\r\n\r\n{\"c\":3}"]).await;
        // (The agent task drops the stream after its last answer: EOF ends the body.)
        assert_eq!(
            answered(send(&forwarder, addr).await),
            (StatusCode::OK, Bytes::from_static(b"{\"c\":3}"))
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_pooled_connection_the_agent_closed_is_replaced_by_a_fresh_one() {
        let forwarder = Forwarder::new(4, Err("no TLS in this test".to_string()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // First connection: one answer, then closed. Second: one answer.
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = vec![0u8; 64 * 1024];
                let _ = stream.read(&mut request).await.unwrap();
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .unwrap();
            }
        });
        assert_eq!(answered(send(&forwarder, addr).await).0, StatusCode::OK);
        assert_eq!(answered(send(&forwarder, addr).await).0, StatusCode::OK);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_sweep_closes_connections_idle_past_the_timeout_and_forgets_gone_instances() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connect = || TcpStream::connect(addr);
        let start = Instant::now();
        let mut pool = Pool::default();
        pool.idle.insert(
            "gone:1".into(),
            vec![Idle {
                stream: Stream::Plain(connect().await.unwrap()),
                input: BytesMut::new(),
                since: start,
            }],
        );
        pool.idle.insert(
            "live:1".into(),
            vec![
                Idle {
                    stream: Stream::Plain(connect().await.unwrap()),
                    input: BytesMut::new(),
                    since: start,
                },
                Idle {
                    stream: Stream::Plain(connect().await.unwrap()),
                    input: BytesMut::new(),
                    since: start + IDLE_TIMEOUT / 2,
                },
            ],
        );
        pool.sweep(start + IDLE_TIMEOUT);
        assert!(!pool.idle.contains_key("gone:1"));
        assert_eq!(pool.idle["live:1"].len(), 1);
    }

    /// An "agent" answering every request on every connection with `answer`
    /// (which may stop short of the body's end), counting its connections.
    async fn streaming_agent(answer: &'static [u8]) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = vec![0u8; 64 * 1024];
                    while matches!(stream.read(&mut request).await, Ok(read) if read > 0) {
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, connections)
    }

    async fn open(forwarder: &Forwarder, addr: std::net::SocketAddr) -> AgentBody {
        let uri: http::Uri = format!("http://{addr}/invoke").parse().unwrap();
        let headers = ForwardHeaders {
            traceparent: b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            authorization: b"Bearer test",
        };
        match forwarder.open_stream(&uri, b"{}", &headers, Instant::now()).await {
            Opened::Events(body) => body,
            Opened::Other(other) => panic!("expected events, got {other:?}"),
        }
    }

    const EVENTS_HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_read_to_its_end_gives_its_connection_back_and_the_next_reuses_it() {
        let forwarder = Forwarder::new(4, Err("no TLS in this test".to_string()));
        let answer = format!("{EVENTS_HEAD}9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n0\r\n\r\n");
        let (addr, connections) = streaming_agent(answer.leak().as_bytes()).await;
        for _ in 0..3 {
            let mut body = open(&forwarder, addr).await;
            let mut out = BytesMut::new();
            while body.read_into(&mut out, usize::MAX).await.unwrap() {}
            assert_eq!(&out[..], b"data: a\n\ndata: b\n\n");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1, "each stream made a connection");
        // A JSON attempt reuses it too: one pool per instance.
        let (status, _) = answered(send(&forwarder, addr).await);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_cut_short_never_gives_its_connection_back() {
        let forwarder = Forwarder::new(4, Err("no TLS in this test".to_string()));
        // The agent never ends its answer: the caller leaves after the first event.
        let answer = format!("{EVENTS_HEAD}9\r\ndata: a\n\n\r\n");
        let (addr, connections) = streaming_agent(answer.leak().as_bytes()).await;
        for expected in 1..=2 {
            let mut body = open(&forwarder, addr).await;
            let mut out = BytesMut::new();
            assert!(body.read_into(&mut out, usize::MAX).await.unwrap());
            assert_eq!(&out[..], b"data: a\n\n");
            drop(body);
            assert_eq!(connections.load(Ordering::SeqCst), expected);
        }
        // An answer that breaks its framing is not pooled either.
        let answer = format!("{EVENTS_HEAD}9\r\ndata: a\n\nXX0\r\n\r\n");
        let (addr, connections) = streaming_agent(answer.leak().as_bytes()).await;
        for expected in 1..=2 {
            let mut body = open(&forwarder, addr).await;
            let mut out = BytesMut::new();
            let failed = loop {
                match body.read_into(&mut out, usize::MAX).await {
                    Ok(true) => {}
                    Ok(false) => panic!("a malformed chunk was read as the end"),
                    Err(why) => break why,
                }
            };
            assert!(failed.contains("malformed chunk"), "{failed}");
            drop(body);
            assert_eq!(connections.load(Ordering::SeqCst), expected);
        }
    }

    #[test]
    fn streamed_bodies_decode_in_any_split() {
        let chunked = b"4;x=1\r\nab\r\n\r\n3\r\ncde\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, chunked.len()] {
            let (mut state, mut input, mut out) = (BodyState::ChunkSize, BytesMut::new(), BytesMut::new());
            let mut ended = false;
            for piece in chunked.chunks(step) {
                assert!(!ended, "ended early at step {step}");
                input.extend_from_slice(piece);
                ended = decode(&mut state, &mut input, &mut out, usize::MAX).unwrap();
            }
            assert!(ended, "step {step}");
            assert_eq!(&out[..], b"ab\r\ncde", "step {step}");
            assert!(input.is_empty());
        }
        let (mut state, mut input, mut out) = (BodyState::Length(3), BytesMut::from(&b"abcd"[..]), BytesMut::new());
        assert!(decode(&mut state, &mut input, &mut out, usize::MAX).unwrap());
        assert_eq!((&out[..], &input[..]), (&b"abc"[..], &b"d"[..]));
        // A budget cuts what one call moves; the rest comes with the next calls.
        let (mut state, mut input, mut out) = (BodyState::ChunkSize, BytesMut::from(&chunked[..]), BytesMut::new());
        assert!(!decode(&mut state, &mut input, &mut out, 3).unwrap());
        assert_eq!(&out[..], b"ab\r");
        while !decode(&mut state, &mut input, &mut out, 3).unwrap() {}
        assert_eq!(&out[..], b"ab\r\ncde");
        let (mut state, mut input) = (BodyState::ChunkSize, BytesMut::from(&b"zz\r\n"[..]));
        assert!(decode(&mut state, &mut input, &mut BytesMut::new(), usize::MAX).is_err());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn failures_are_classified() {
        let forwarder = Forwarder::new(4, Err("no TLS in this test".to_string()));
        // Nothing listens: the agent never saw the request.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        assert!(matches!(
            send(&forwarder, closed).await,
            AttemptResult::ConnectFailed(_)
        ));
        // Garbage and cut-short answers break the attempt.
        let addr = agent(vec![b"SMTP ready\r\n\r\n"]).await;
        assert!(matches!(send(&forwarder, addr).await, AttemptResult::Broken(_)));
        let addr = agent(vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"]).await;
        assert!(matches!(send(&forwarder, addr).await, AttemptResult::Broken(_)));
    }
}
