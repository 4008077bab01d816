//! A front door for a service's hot requests: its own HTTP/1.1 loop for the
//! few requests a service names ([`HotRoutes`]), and hyper (through the
//! service's axum routes) for everything else.
//!
//! Why: profiled under load, hyper's server dispatch, axum's routing and
//! extractors and the tower layers between them cost ~5 µs of the router's
//! ~21 µs of CPU per routed request, more than the whole request path of
//! HAProxy's HTTP layer. This loop reads a request head, parses it with
//! `httparse` (the parser hyper uses), reads its body, calls the same handler
//! the axum route calls, and writes the answer in one write; a keep-alive
//! connection loops, pipelined requests included.
//!
//! Only a plain request takes this path: HTTP/1.1, a method and path the
//! service's [`HotRoutes::route`] takes, at most one `Content-Length` (digits
//! only, within the body limit; none means no body), every header name and
//! value valid, no `Transfer-Encoding`, `Expect`, `Upgrade` or `Connection`
//! header. Anything else (another route, HTTP/1.0 or 2, gRPC, a chunked body, a
//! malformed or oversized head, a body over the limit) hands the connection,
//! with every byte already read, to hyper, which serves it from that request on
//! exactly as it serves any connection (as HTTP/1.1 only once this loop has
//! answered on it: the HTTP/2 preface opens a connection). So framing
//! ambiguities (request smuggling: both `Content-Length` and
//! `Transfer-Encoding`, repeated lengths) are never resolved here; hyper
//! handles them as it always does (with both, the body is chunked and the
//! connection closed after the answer; differing lengths are refused). The
//! `front_door` fuzz target holds the door and hyper alone to the same framing.
//!
//! A hot route's answer whose body has no known length (server-sent events)
//! is written as it comes, with chunked framing: every frame ready by the
//! time the previous write finished goes out in one write as one chunk, and a caller that
//! closes the connection meanwhile ends the answer (its body is dropped),
//! as hyper would (see [`write_streamed`]).
//!
//! With TLS ([`Door::tls`]) each connection is first a TLS handshake
//! (bounded by [`HANDSHAKE_TIMEOUT`]); `h2` is offered by ALPN, so gRPC and
//! HTTP/2 clients reach hyper, and HTTP/1.1 requests take the same fast path.
//!
//! Shutdown is graceful like `axum::serve`'s: no new connections, an idle
//! connection closes, a request in progress is answered, then its connection
//! closes.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::HeaderLookup;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The requests a service's front door answers itself.
pub trait HotRoutes: Clone + Send + Sync + 'static {
    /// What `route` found: which handler, with what it took from the path.
    type Route: Send + 'static;

    /// The route for `method` and `target` (path and query, as sent), or
    /// `None` to leave the request to hyper and the axum routes. Take only
    /// what the axum route would answer identically (e.g. no percent-escapes
    /// to decode, no query to parse).
    fn route(&self, method: &str, target: &str) -> Option<Self::Route>;

    /// Answers a request `route` took, as the axum route would.
    fn call(&self, route: Self::Route, headers: Headers, body: Bytes) -> impl Future<Output = Answer> + Send;
}

/// No hot routes: every request goes to the axum routes (a service that only
/// wants the door's TLS and graceful shutdown, e.g. the registry).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHotRoutes;

impl HotRoutes for NoHotRoutes {
    type Route = std::convert::Infallible;

    fn route(&self, _: &str, _: &str) -> Option<Self::Route> {
        None
    }

    async fn call(&self, route: Self::Route, _: Headers, _: Bytes) -> Answer {
        match route {}
    }
}

/// A hot route's answer: a JSON body the front door writes as it is, or any
/// axum response (its body collected first).
pub enum Answer {
    /// `status`, `content-type: application/json` and `body`: no response
    /// object, header map or body stream built for the common answer.
    Json {
        status: http::StatusCode,
        body: Vec<u8>,
    },
    /// `200 OK` with `headers` (names in lowercase) and a body of unknown
    /// length (server-sent events), written chunked as its frames come: no
    /// response object or header map built for a stream.
    Stream {
        headers: &'static [(&'static str, &'static str)],
        body: axum::body::Body,
    },
    Response(axum::response::Response),
}

impl Answer {
    /// `value` as a JSON answer with `status`.
    pub fn json(status: http::StatusCode, value: &impl serde::Serialize) -> serde_json::Result<Self> {
        Ok(Answer::Json {
            status,
            body: serde_json::to_vec(value)?,
        })
    }
}

impl From<axum::response::Response> for Answer {
    fn from(response: axum::response::Response) -> Self {
        Answer::Response(response)
    }
}

impl axum::response::IntoResponse for Answer {
    fn into_response(self) -> axum::response::Response {
        match self {
            Answer::Json { status, body } => {
                (status, [(http::header::CONTENT_TYPE, "application/json")], body).into_response()
            }
            Answer::Stream { headers, body } => {
                let mut response = axum::response::Response::new(body);
                for (name, value) in headers {
                    response
                        .headers_mut()
                        .insert(HeaderName::from_static(name), HeaderValue::from_static(value));
                }
                response
            }
            Answer::Response(response) => response,
        }
    }
}

/// Most headers a request on the fast path may carry (more: hyper serves it).
const MAX_HEADERS: usize = 32;
/// Largest request head the fast path waits for (larger: hyper serves it).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Room made in the input buffer before each read.
const READ_RESERVE: usize = 8 * 1024;
/// Largest buffer a connection keeps between requests.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

/// A service's front door: its hot routes, its axum routes for every other
/// request, and the largest body the door reads itself (a larger one goes to
/// `app`, which refuses it with the service's own answer).
#[derive(Clone)]
pub struct Door<H> {
    pub hot: H,
    pub app: axum::Router,
    pub body_limit: usize,
    /// Serve TLS with this configuration (reloaded by its own watcher); `None`: plain TCP.
    pub tls: Option<crate::tls::ServerTls>,
}

/// The longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl<H: HotRoutes> Door<H> {
    /// Serves on `listener` until `shutdown` resolves, then lets open
    /// requests finish (see the module notes).
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        // Connections watch `signal` (closed once shutdown begins) and hold `open`
        // (the loop waits until every clone is gone).
        let (signal, signal_receiver) = watch::channel(());
        let signal = Arc::new(signal);
        tokio::spawn(async move {
            shutdown.await;
            drop(signal_receiver);
        });
        let (open, open_receiver) = watch::channel(());
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        accept_failed(error).await;
                        continue;
                    }
                },
                _ = signal.closed() => break,
            };
            // No Nagle: an answer goes out in one write and must not wait for an ACK.
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(message = "Cannot set TCP_NODELAY on a connection.", %error);
            }
            let connection = Connection {
                door: self.clone(),
                signal: signal.clone(),
            };
            let open = open_receiver.clone();
            match &self.tls {
                None => {
                    tokio::spawn(async move {
                        connection.run(stream).await;
                        drop(open);
                    });
                }
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    tokio::spawn(async move {
                        let peer = stream.peer_addr().ok();
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => connection.run(stream).await,
                            // A client that cannot finish a handshake (a wrong CA, no client
                            // certificate under mTLS, a port scan) is the client's problem.
                            Ok(Err(error)) => {
                                tracing::debug!(message = "TLS handshake failed.", peer = ?peer, %error)
                            }
                            Err(_) => tracing::debug!(message = "TLS handshake timed out.", peer = ?peer),
                        }
                        drop(open);
                    });
                }
            }
        }
        drop(open_receiver);
        drop(listener);
        open.closed().await;
        Ok(())
    }

    /// [`Door::serve`] on `threads` threads (0: one per core), each a
    /// single-threaded runtime with its own `SO_REUSEPORT` listener on `addr`
    /// (see [`crate::serve::per_core`]), until `shutdown` resolves.
    pub async fn per_core(
        self,
        name: &str,
        addr: std::net::SocketAddr,
        threads: usize,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let serve = move |listener: TcpListener, stopped: crate::serve::Stopped| {
            let door = self.clone();
            async move { door.serve(listener, stopped).await.map_err(anyhow::Error::from) }
        };
        crate::serve::per_core(name, addr, threads, serve, shutdown).await
    }
}

/// As `axum::serve`: a connection reset before it was accepted is nothing;
/// anything else (out of file descriptors) is logged and accepting pauses a
/// second so the process does not spin.
async fn accept_failed(error: io::Error) {
    if matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(message = "Cannot accept a connection; pausing 1 s.", %error);
    tokio::time::sleep(Duration::from_secs(1)).await;
}

struct Connection<H> {
    door: Door<H>,
    signal: Arc<watch::Sender<()>>,
}

/// A hot request's header fields: each name and value is a place in the
/// request's head, so nothing is copied or allocated per field (hyper slices
/// its values the same way) and no `HeaderName` is built for a lookup.
pub struct Headers {
    head: Bytes,
    fields: Fields,
}

/// A request's header fields in order, inline (at most `MAX_HEADERS`, as httparse parses).
struct Fields {
    at: [Field; MAX_HEADERS],
    count: usize,
}

impl Fields {
    fn as_slice(&self) -> &[Field] {
        &self.at[..self.count]
    }
}

/// One field's name and value as `start..end` places in the head.
#[derive(Clone, Copy, Default)]
struct Field {
    name: (u32, u32),
    value: (u32, u32),
}

impl Field {
    fn name<'a>(&self, head: &'a [u8]) -> &'a [u8] {
        &head[self.name.0 as usize..self.name.1 as usize]
    }

    fn value<'a>(&self, head: &'a [u8]) -> &'a [u8] {
        &head[self.value.0 as usize..self.value.1 as usize]
    }
}

impl Headers {
    /// The fields as a header map, for handlers written for axum. `None` only
    /// if a field `parse_head` accepted were invalid, which httparse rules out
    /// (it accepts only token names, and values of `HeaderValue`'s bytes).
    pub fn header_map(&self) -> Option<HeaderMap> {
        let fields = self.fields.as_slice();
        let mut map = HeaderMap::with_capacity(fields.len());
        for field in fields {
            let name = HeaderName::from_bytes(field.name(&self.head)).ok()?;
            let value =
                HeaderValue::from_maybe_shared(self.head.slice(field.value.0 as usize..field.value.1 as usize)).ok()?;
            map.append(name, value);
        }
        Some(map)
    }
}

impl HeaderLookup for Headers {
    fn value(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .as_slice()
            .iter()
            .find(|field| field.name(&self.head).eq_ignore_ascii_case(name.as_bytes()))
            .map(|field| field.value(&self.head))
    }
}

/// A request on the fast path: its route, its head's length, its body's and
/// its header fields (places in the head, see [`Headers`]).
struct Hot<R> {
    route: R,
    head_len: usize,
    body_len: usize,
    fields: Fields,
}

/// What the bytes at the start of the input buffer are.
// Returned once per request and consumed at once: boxing `Hot` would put back
// the allocation per request its inline field array avoids.
#[allow(clippy::large_enum_variant)]
enum Head<R> {
    /// A plain request of a hot route (see the module notes).
    Hot(Hot<R>),
    /// A complete or malformed head the fast path does not take: hyper's.
    Other,
    /// Not a whole head yet.
    Partial,
}

impl<H: HotRoutes> Connection<H> {
    // Generic over the stream only so the fuzz targets drive this very loop on
    // an in-memory connection (`fuzzing`); the server runs it on `TcpStream`.
    async fn run<S: Stream>(self, mut stream: S) {
        let mut input = BytesMut::with_capacity(READ_RESERVE);
        let mut output = Vec::with_capacity(1024);
        // One shutdown waiter for the connection's life: registering a fresh one
        // for every idle wait cost a lock and an unlink per request.
        let signal = self.signal.clone();
        let closed = signal.closed();
        tokio::pin!(closed);
        let mut served = Served::Nothing;
        loop {
            let request = loop {
                match parse_head(&input, &self.door.hot, self.door.body_limit) {
                    Head::Hot(request) => break request,
                    Head::Other => return self.hand_over(stream, input, served).await,
                    Head::Partial if input.len() > MAX_HEAD_BYTES => {
                        return self.hand_over(stream, input, served).await
                    }
                    Head::Partial => {
                        // Between requests, shutdown closes the idle connection.
                        let read = if input.is_empty() {
                            tokio::select! {
                                // In order: no random draw per idle wait.
                                biased;
                                read = read_more(&mut stream, &mut input) => read,
                                _ = &mut closed => return,
                            }
                        } else {
                            read_more(&mut stream, &mut input).await
                        };
                        if !read {
                            return;
                        }
                    }
                }
            };
            input.reserve((request.head_len + request.body_len).saturating_sub(input.len()));
            while input.len() < request.head_len + request.body_len {
                if !read_more(&mut stream, &mut input).await {
                    return;
                }
            }
            let headers = Headers {
                head: input.split_to(request.head_len).freeze(),
                fields: request.fields,
            };
            let body = input.split_to(request.body_len).freeze();
            let answering = Answering::start();
            let response = self.door.hot.call(request.route, headers, body).await;
            let written = match response {
                Answer::Stream { headers, body } => {
                    let head = |output: &mut Vec<u8>| {
                        status_line(http::StatusCode::OK, output);
                        for (name, value) in headers {
                            header_line(name.as_bytes(), value.as_bytes(), output);
                        }
                    };
                    write_streamed(&mut stream, &mut input, head, body, &mut output).await
                }
                // A body of unknown length is a stream (server-sent events): written as it comes.
                Answer::Response(response) if axum::body::HttpBody::size_hint(response.body()).exact().is_none() => {
                    let (parts, body) = response.into_parts();
                    let head = |output: &mut Vec<u8>| {
                        status_line(parts.status, output);
                        for (name, value) in &parts.headers {
                            if name != http::header::TRANSFER_ENCODING {
                                header_line(name.as_str().as_bytes(), value.as_bytes(), output);
                            }
                        }
                    };
                    write_streamed(&mut stream, &mut input, head, body, &mut output).await
                }
                response => match encode_response(response, &mut output).await {
                    // TLS buffers records: the flush sends them (a no-op on plain TCP).
                    Some(answer) => stream.write_all(answer).await.is_ok() && stream.flush().await.is_ok(),
                    None => false,
                },
            };
            drop(answering);
            if !written {
                return;
            }
            served = Served::Http1;
            if self.signal.is_closed() {
                return;
            }
            // A large request or answer does not keep its buffer for the connection's life.
            if output.capacity() > KEPT_BUFFER_BYTES {
                output = Vec::with_capacity(1024);
            }
            if input.is_empty() && input.capacity() > KEPT_BUFFER_BYTES {
                input = BytesMut::with_capacity(READ_RESERVE);
            }
        }
    }

    /// Serves the rest of the connection with hyper, replaying `input` first:
    /// HTTP/1.1, or HTTP/2 with prior knowledge if nothing was `served` yet.
    async fn hand_over<S: Stream>(self, stream: S, input: BytesMut, served: Served) {
        let io = hyper_util::rt::TokioIo::new(Replay {
            read: input.freeze(),
            stream,
        });
        let service = hyper_util::service::TowerToHyperService::new(self.door.app);
        match served {
            Served::Nothing => {
                let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                let connection = builder.serve_connection_with_upgrades(io, service);
                finish(connection, &self.signal, |connection| connection.graceful_shutdown()).await;
            }
            // The HTTP/2 preface opens a connection (RFC 9113 §3.4); after
            // HTTP/1.1 answers it is a malformed request, as hyper alone
            // treats it (found by the `front_door` fuzz target).
            Served::Http1 => {
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .with_upgrades();
                finish(connection, &self.signal, |connection| connection.graceful_shutdown()).await;
            }
        }
    }
}

thread_local! {
    /// Hot requests this thread is answering (each thread serves its own
    /// connections: see [`crate::serve::per_core`]). Under [`Door::serve`] on
    /// a multi-threaded runtime a connection's task may move between threads
    /// and the count drift (it saturates at zero); it only decides a yield,
    /// never what is answered.
    static ANSWERING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One hot request being answered on this thread, from its head read to its
/// answer written.
///
/// Why a thread counts them: once a streamed answer's first event is
/// written, a thread answering nothing else yields the CPU once
/// (`sched_yield`) before relaying the rest. The caller's reader, woken by
/// that write, is often put on this very CPU (a socket write wakes its
/// reader as a synchronous wake-up, and the other cores are busy), where it
/// would wait until everything the agent had already sent behind the first
/// event was relayed: measured with protocols-bench on 2 cores, the caller
/// waited 11 µs at the median and 69 µs at p75 for the CPU (5 and 11 µs
/// behind nginx), and the yield took ~40 µs off the median time to first
/// event. With other requests in progress the thread does not yield: they
/// would wait too, and under load the caller's reader gets a CPU anyway.
struct Answering;

impl Answering {
    fn start() -> Self {
        ANSWERING.with(|count| count.set(count.get() + 1));
        Answering
    }

    /// Whether the request in hand is the only one this thread is answering.
    fn alone() -> bool {
        ANSWERING.with(|count| count.get() == 1)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        ANSWERING.with(|count| count.set(count.get().saturating_sub(1)));
    }
}

/// What a connection's own loop answered before it handed the connection to hyper.
#[derive(Clone, Copy)]
enum Served {
    Nothing,
    /// At least one HTTP/1.1 request.
    Http1,
}

/// Runs a connection handed to hyper to its end; once shutdown begins, asks
/// it (`graceful_shutdown`) to finish the request in progress and close.
async fn finish<C, E>(connection: C, signal: &watch::Sender<()>, graceful_shutdown: fn(Pin<&mut C>))
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    tokio::pin!(connection);
    let mut signalled = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(message = "Connection ended with an error.", %error);
                }
                return;
            }
            _ = signal.closed(), if !signalled => {
                signalled = true;
                graceful_shutdown(connection.as_mut());
            }
        }
    }
}

/// Serves one connection as [`Door::serve`] serves each it accepts, never
/// shut down: the fuzz targets' way in ([`crate::fuzzing`]) and this file's tests'.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) async fn serve_connection<H: HotRoutes, S: Stream>(door: Door<H>, stream: S) {
    // Shutdown begins once every receiver is gone: this one lives as long as the connection.
    let (signal, _receiver) = watch::channel(());
    let connection = Connection {
        door,
        signal: Arc::new(signal),
    };
    connection.run(stream).await;
}

/// Reads more of the connection into `input`; `false` once it has ended or failed.
async fn read_more<S: Stream>(stream: &mut S, input: &mut BytesMut) -> bool {
    input.reserve(READ_RESERVE);
    matches!(stream.read_buf(input).await, Ok(read) if read > 0)
}

/// Classifies the head at the start of `input` (see [`Head`]).
fn parse_head<H: HotRoutes>(input: &[u8], hot: &H, limit: usize) -> Head<H::Route> {
    if input.is_empty() {
        return Head::Partial;
    }
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut raw);
    let head_len = match request.parse(input) {
        Ok(httparse::Status::Complete(head_len)) => head_len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Other,
    };
    // An oversized head is hyper's (as a partial one is), whatever one read brought.
    if head_len > MAX_HEAD_BYTES || request.version != Some(1) {
        return Head::Other;
    }
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return Head::Other;
    };
    let Some(route) = hot.route(method, target) else {
        return Head::Other;
    };
    let mut fields = Fields {
        at: [Field::default(); MAX_HEADERS],
        count: 0,
    };
    let mut body_len: Option<usize> = None;
    // httparse accepts in a value exactly the bytes `HeaderValue` accepts (tab,
    // 0x20-0x7E, 0x80-0xFF; hyper builds its values unchecked on that basis),
    // so a field map built later cannot fail. Its names and values are slices
    // of `input`: their offsets are their places in the head.
    let place = |part: &[u8]| {
        let start = part.as_ptr() as usize - input.as_ptr() as usize;
        // Within the head, at most `MAX_HEAD_BYTES` (checked above): far below u32::MAX.
        (start as u32, (start + part.len()) as u32)
    };
    for header in request.headers.iter() {
        // httparse accepts only token characters in names: any case, compared as such.
        let name = header.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            match (body_len, content_length(header.value)) {
                (None, Some(length)) if length <= limit => body_len = Some(length),
                _ => return Head::Other,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
            || name.eq_ignore_ascii_case(b"connection")
        {
            return Head::Other;
        }
        // httparse parsed at most `MAX_HEADERS` fields: there is room for each.
        fields.at[fields.count] = Field {
            name: place(name),
            value: place(header.value),
        };
        fields.count += 1;
    }
    // No `Content-Length` (and no `Transfer-Encoding`): no body (RFC 9112 §6.3).
    Head::Hot(Hot {
        route,
        head_len,
        body_len: body_len.unwrap_or(0),
        fields,
    })
}

/// A `Content-Length` value: one to nineteen ASCII digits, nothing else.
fn content_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0usize, |total, digit| {
        total.checked_mul(10)?.checked_add(usize::from(digit - b'0'))
    })
}

/// Writes `answer` as an HTTP/1.1 answer into `output` (status line, the
/// handler's headers, `date`, `content-length`, body); `None` if its body
/// cannot be read (it is always a complete buffer here).
async fn encode_response(answer: Answer, output: &mut Vec<u8>) -> Option<&[u8]> {
    let response = match answer {
        Answer::Json { status, body } => {
            status_line(status, output);
            output.extend_from_slice(b"content-type: application/json\r\n");
            return Some(finish_answer(&body, output));
        }
        Answer::Response(response) => response,
        // `Connection::run` writes streams with `write_streamed`; collected whole here.
        stream @ Answer::Stream { .. } => axum::response::IntoResponse::into_response(stream),
    };
    let (parts, body) = response.into_parts();
    let body: Bytes = axum::body::to_bytes(body, usize::MAX).await.ok()?;
    status_line(parts.status, output);
    for (name, value) in &parts.headers {
        header_line(name.as_str().as_bytes(), value.as_bytes(), output);
    }
    Some(finish_answer(&body, output))
}

/// Appends a handler's header line, except those the door writes itself
/// (`content-length`, `date`, `connection`; a stream's head also leaves out
/// a handler's `transfer-encoding`).
fn header_line(name: &[u8], value: &[u8], output: &mut Vec<u8>) {
    if name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"date")
        || name.eq_ignore_ascii_case(b"connection")
    {
        return;
    }
    output.extend_from_slice(name);
    output.extend_from_slice(b": ");
    output.extend_from_slice(value);
    output.extend_from_slice(b"\r\n");
}

/// Most bytes of a streamed answer gathered for one write.
const STREAM_BATCH_BYTES: usize = 64 * 1024;

/// Writes a streamed answer (a body of unknown length; `head` writes its
/// status line and headers) with chunked framing
/// as its frames come: every frame ready when the last write finished goes
/// out in the next one, as one chunk (a proxy relaying what one read
/// brought, as nginx does), so a frame waits for nothing but the write
/// before it. While it
/// waits for the body, the connection is watched: a caller that closes it
/// ends the answer, and dropping the body cancels whatever produces it (as
/// hyper notices a caller that went away). `false`: the connection is done.
async fn write_streamed<S: Stream>(
    stream: &mut S,
    input: &mut BytesMut,
    head: impl FnOnce(&mut Vec<u8>),
    body: axum::body::Body,
    output: &mut Vec<u8>,
) -> bool {
    // The status line and the handler's headers, then the door's own.
    head(output);
    output.extend_from_slice(b"date: ");
    with_date(|date| output.extend_from_slice(date));
    output.extend_from_slice(b"\r\ntransfer-encoding: chunked\r\n\r\n");
    let mut body = std::pin::pin!(body);
    // The head goes out with the first frame if it is ready, else alone: the
    // caller learns at once that the answer has begun. Only the first frame:
    // the time to the first event is not spent producing the ones behind it.
    // Where the bytes to write start in `output` (see `gather`).
    let mut skip = 0;
    let mut step = futures::FutureExt::now_or_never(std::future::poll_fn(|cx| {
        gather(body.as_mut(), cx, output, 1, &mut skip)
    }));
    // Reading stops once a caller has sent more than a head ahead (pipelined).
    let mut watching = true;
    let mut first_write = true;
    loop {
        match step {
            Some(Gathered::Failed) => return false,
            Some(Gathered::End) | Some(Gathered::More) | None => {}
        }
        let bytes = &output[skip..];
        if !bytes.is_empty() && (stream.write_all(bytes).await.is_err() || stream.flush().await.is_err()) {
            return false;
        }
        output.clear();
        skip = 0;
        if matches!(step, Some(Gathered::End)) {
            return true;
        }
        if first_write && Answering::alone() {
            // See `Answering`: the caller's reader, woken by this write, may be
            // waiting for this very CPU while the rest is relayed.
            std::thread::yield_now();
        }
        first_write = false;
        step = loop {
            tokio::select! {
                biased;
                gathered = std::future::poll_fn(|cx| gather(body.as_mut(), cx, output, usize::MAX, &mut skip)) => {
                    break Some(gathered)
                }
                read = stream.read_buf(input), if watching => match read {
                    // The caller went away (or half-closed: hyper's default treats it alike).
                    Ok(0) | Err(_) => return false,
                    Ok(_) => watching = input.len() <= MAX_HEAD_BYTES,
                },
            }
        };
    }
}

/// A chunk's size line (the length in hex, CRLF) in `line`; its length.
fn chunk_size(length: usize, line: &mut [u8; SIZE_LINE_ROOM]) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = ((usize::BITS - length.leading_zeros()).div_ceil(4).max(1)) as usize;
    for at in 0..digits {
        line[digits - 1 - at] = HEX[(length >> (at * 4)) & 0xf];
    }
    line[digits..digits + 2].copy_from_slice(b"\r\n");
    digits + 2
}

/// What [`gather`] found.
enum Gathered {
    /// Frames appended to the output (up to [`STREAM_BATCH_BYTES`]).
    More,
    /// The body ended; its last frames and the last chunk are appended.
    End,
    /// The body failed: the answer cannot be finished.
    Failed,
}

/// Room left before a chunk's data for its size line (the hex digits of a
/// `usize` and CRLF), filled in once the chunk's length is known.
const SIZE_LINE_ROOM: usize = 18;

/// Appends every frame `body` has ready (at most `most_frames`) to `output`
/// as one chunk (as nginx relays what one read brought: a client then parses
/// one chunk, not one per frame); `Pending` only when none was ready (and
/// `output` is as it was). The chunk's data is copied once: its size line
/// goes into room left before it, and what `output` held before (the head,
/// on the first write) moves up to the line, so the bytes to write start at
/// `output[*skip..]`.
fn gather(
    mut body: Pin<&mut axum::body::Body>,
    cx: &mut TaskContext<'_>,
    output: &mut Vec<u8>,
    most_frames: usize,
    skip: &mut usize,
) -> Poll<Gathered> {
    use axum::body::HttpBody as _;
    let start = output.len();
    output.resize(start + SIZE_LINE_ROOM, 0);
    let data = output.len();
    let mut frames = 0;
    let gathered = loop {
        if output.len() - data >= STREAM_BATCH_BYTES || frames >= most_frames {
            break Gathered::More;
        }
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // Trailers are not written (nothing here sends them).
                if let Ok(bytes) = frame.into_data() {
                    output.extend_from_slice(&bytes);
                    frames += 1;
                }
            }
            Poll::Ready(Some(Err(error))) => {
                tracing::debug!(message = "A streamed answer's body failed.", %error);
                return Poll::Ready(Gathered::Failed);
            }
            Poll::Ready(None) => break Gathered::End,
            Poll::Pending if output.len() > data => break Gathered::More,
            Poll::Pending => {
                output.truncate(start);
                return Poll::Pending;
            }
        }
    };
    let length = output.len() - data;
    if length == 0 {
        output.truncate(start);
    } else {
        let mut line = [0u8; SIZE_LINE_ROOM];
        let line_length = chunk_size(length, &mut line);
        let at = data - line_length;
        output[at..data].copy_from_slice(&line[..line_length]);
        let unused = at - start;
        output.copy_within(0..start, unused);
        *skip = unused;
        output.extend_from_slice(b"\r\n");
    }
    if matches!(gathered, Gathered::End) {
        output.extend_from_slice(b"0\r\n\r\n");
    }
    Poll::Ready(gathered)
}

/// Starts `output` afresh with the status line.
fn status_line(status: http::StatusCode, output: &mut Vec<u8>) {
    output.clear();
    output.extend_from_slice(b"HTTP/1.1 ");
    output.extend_from_slice(status.as_str().as_bytes());
    output.push(b' ');
    output.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    output.extend_from_slice(b"\r\n");
}

/// Ends the head (`date`, `content-length`) and appends `body`.
fn finish_answer<'a>(body: &[u8], output: &'a mut Vec<u8>) -> &'a [u8] {
    output.extend_from_slice(b"date: ");
    with_date(|date| output.extend_from_slice(date));
    output.extend_from_slice(b"\r\ncontent-length: ");
    output.extend_from_slice(crate::decimal(body.len() as u64, &mut [0u8; 20]));
    output.extend_from_slice(b"\r\n\r\n");
    output.extend_from_slice(body);
    output
}

thread_local! {
    /// This thread's `date` header value and the second it was made for.
    static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Calls `write` with the IMF-fixdate of now (RFC 9110 §5.6.7), formatted
/// once a second per thread, as hyper does.
fn with_date(write: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let second = now
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or_default();
    DATE.with(|date| {
        let mut date = date.borrow_mut();
        if date.0 != second {
            *date = (second, httpdate::fmt_http_date(now));
        }
        write(date.1.as_bytes());
    });
}

/// What a connection runs on: a `TcpStream` (an in-memory stream in the fuzz targets).
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for S {}

/// A connection handed to hyper: the bytes already read come first.
struct Replay<S> {
    read: Bytes,
    stream: S,
}

impl<S: Stream> AsyncRead for Replay<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let count = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..count]);
            self.read.advance(count);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: Stream> AsyncWrite for Replay<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `POST /v1/invoke` only, as the router's front door.
    #[derive(Clone)]
    struct Invoke;

    impl HotRoutes for Invoke {
        type Route = ();

        fn route(&self, method: &str, target: &str) -> Option<()> {
            (method == "POST" && target == "/v1/invoke").then_some(())
        }

        async fn call(&self, _: (), _: Headers, _: Bytes) -> Answer {
            Answer::Response(axum::response::Response::default())
        }
    }

    fn head(text: &str) -> Head<()> {
        parse_head(text.as_bytes(), &Invoke, 1024)
    }

    #[test]
    fn only_plain_requests_of_hot_routes_take_the_fast_path() {
        let plain = "POST /v1/invoke HTTP/1.1\r\nhost: r\r\ncontent-length: 2\r\nauthorization: Bearer t\r\n\r\n{}";
        let Head::Hot(request) = head(plain) else {
            panic!("a plain invoke is the fast path's");
        };
        assert_eq!((request.head_len, request.body_len), (plain.len() - 2, 2));
        // Header names and values are the head's own bytes, sliced; names match in any case.
        let headers = Headers {
            head: Bytes::copy_from_slice(&plain.as_bytes()[..request.head_len]),
            fields: request.fields,
        };
        assert_eq!(headers.value("authorization"), Some(&b"Bearer t"[..]));
        assert_eq!(headers.value("Authorization"), Some(&b"Bearer t"[..]));
        assert_eq!(headers.value("traceparent"), None);
        assert_eq!(headers.fields.as_slice().len(), 3);
        let map = headers.header_map().expect("valid fields");
        assert_eq!(map["authorization"], "Bearer t");
        assert_eq!(map["host"], "r");
        assert_eq!(map.len(), 3);
        let upper = head("POST /v1/invoke HTTP/1.1\r\nContent-Length: 2\r\nHost: r\r\n\r\n");
        assert!(matches!(
            upper,
            Head::Hot(Hot {
                body_len: 2,
                fields: Fields { count: 2, .. },
                ..
            })
        ));
        // A value with a control byte is not the fast path's (httparse refuses it, as does hyper).
        assert!(matches!(
            head("POST /v1/invoke HTTP/1.1\r\nx-a: a\x01b\r\n\r\n"),
            Head::Other
        ));
        assert!(matches!(
            head("POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\n"),
            Head::Partial
        ));
        assert!(matches!(head(""), Head::Partial));
        // Whitespace around a field value is not part of it (RFC 9110 §5.5).
        let spaced = head("POST /v1/invoke HTTP/1.1\r\ncontent-length:  2 \r\n\r\n");
        assert!(matches!(spaced, Head::Hot(Hot { body_len: 2, .. })));
        // Neither length nor chunking: no body.
        let bodiless = head("POST /v1/invoke HTTP/1.1\r\nhost: r\r\n\r\n");
        assert!(matches!(bodiless, Head::Hot(Hot { body_len: 0, .. })));
        let json = head("POST /v1/invoke HTTP/1.1\r\naccept: application/json\r\ncontent-length: 2\r\n\r\n{}");
        assert!(matches!(json, Head::Hot(Hot { body_len: 2, .. })));
        // A streamed answer is the fast path's too (written as it comes).
        let events = head("POST /v1/invoke HTTP/1.1\r\naccept: text/event-stream\r\ncontent-length: 2\r\n\r\n{}");
        assert!(matches!(events, Head::Hot(Hot { body_len: 2, .. })));

        for other in [
            "GET /healthz HTTP/1.1\r\n\r\n",
            "POST /v1/invoke?x=1 HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/invoke HTTP/1.0\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: +2\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 4096\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\nupgrade: h2c\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\nx: a\x01b\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "POST /v1/invoke HTTP/1.1\r\nbad header\r\n\r\n",
        ] {
            assert!(matches!(head(other), Head::Other), "{other:?} must be hyper's");
        }
        let many: String = (0..MAX_HEADERS + 1).map(|i| format!("x-{i}: v\r\n")).collect();
        let crowded = format!("POST /v1/invoke HTTP/1.1\r\ncontent-length: 2\r\n{many}\r\n");
        assert!(matches!(head(&crowded), Head::Other));
    }

    /// A connection whose first request took the fast path stays HTTP/1.1:
    /// the HTTP/2 preface after it is a bad request, as hyper alone answers
    /// it, and is never served as HTTP/2 (found by the `front_door` fuzz target).
    #[tokio::test]
    async fn after_a_fast_path_answer_the_connection_stays_http1() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        let routed = Arc::new(AtomicUsize::new(0));
        let counter = routed.clone();
        let app = axum::Router::new().fallback(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { "routed" }
        });
        let door = Door {
            hot: Invoke,
            app,
            body_limit: 1024,
            tls: None,
        };
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(serve_connection(door, server));
        let mut input = b"POST /v1/invoke HTTP/1.1\r\nhost: r\r\ncontent-length: 2\r\n\r\n{}".to_vec();
        // The preface, an empty SETTINGS frame, then HEADERS (POST, http, `/`) ending stream 1.
        input.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        input.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 3, 1, 5, 0, 0, 0, 1, 0x83, 0x86, 0x84]);
        client.write_all(&input).await.unwrap();
        let mut output = Vec::new();
        // hyper closes the connection after the bad request: the read ends.
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut output))
            .await
            .expect("the connection closes after the preface")
            .unwrap();
        served.await.unwrap();
        // One answer, the fast path's; hyper closes on the preface without one (as it does alone).
        let output = String::from_utf8_lossy(&output);
        assert!(output.starts_with("HTTP/1.1 200 OK\r\n"), "{output}");
        assert_eq!(output.matches("HTTP/").count(), 1, "{output}");
        assert_eq!(
            routed.load(Ordering::SeqCst),
            0,
            "a request after the preface was routed"
        );
    }

    /// `POST /v1/invoke` answering a stream fed by the test (one per request, in order).
    #[derive(Clone)]
    struct Streams(Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::Receiver<Bytes>>>>);

    impl HotRoutes for Streams {
        type Route = ();

        fn route(&self, method: &str, target: &str) -> Option<()> {
            (method == "POST" && target == "/v1/invoke").then_some(())
        }

        async fn call(&self, _: (), _: Headers, _: Bytes) -> Answer {
            let receiver = self.0.lock().unwrap().remove(0);
            let frames = futures::stream::unfold(receiver, |mut receiver| async move {
                let frame = receiver.recv().await?;
                Some((Ok::<_, std::convert::Infallible>(frame), receiver))
            });
            let response = axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from_stream(frames))
                .unwrap();
            Answer::Response(response)
        }
    }

    /// Reads `client` until what it sent so far contains `pattern`.
    async fn read_until(client: &mut tokio::io::DuplexStream, seen: &mut Vec<u8>, pattern: &str) {
        let found = tokio::time::timeout(Duration::from_secs(10), async {
            while !String::from_utf8_lossy(seen).contains(pattern) {
                let mut buffer = [0u8; 4096];
                let read = client.read(&mut buffer).await.unwrap();
                assert!(
                    read > 0,
                    "the connection closed before {pattern:?}: {:?}",
                    String::from_utf8_lossy(seen)
                );
                seen.extend_from_slice(&buffer[..read]);
            }
        })
        .await;
        assert!(
            found.is_ok(),
            "no {pattern:?} within 10 s: {:?}",
            String::from_utf8_lossy(seen)
        );
    }

    fn streaming_door(receivers: Vec<tokio::sync::mpsc::Receiver<Bytes>>) -> Door<Streams> {
        Door {
            hot: Streams(Arc::new(std::sync::Mutex::new(receivers))),
            app: axum::Router::new(),
            body_limit: 1024,
            tls: None,
        }
    }

    const STREAMED_REQUEST: &[u8] =
        b"POST /v1/invoke HTTP/1.1\r\nhost: r\r\naccept: text/event-stream\r\ncontent-length: 2\r\n\r\n{}";

    /// A body of unknown length goes out chunked, each frame as it comes (the
    /// head before any), and the connection serves its next request after it.
    #[tokio::test]
    async fn a_streamed_answer_is_written_as_it_comes_then_the_connection_is_kept() {
        let (first, first_frames) = tokio::sync::mpsc::channel(4);
        let (second, second_frames) = tokio::sync::mpsc::channel(4);
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(serve_connection(
            streaming_door(vec![first_frames, second_frames]),
            server,
        ));
        client.write_all(STREAMED_REQUEST).await.unwrap();
        let mut seen = Vec::new();
        // The head arrives while the body has nothing yet.
        read_until(&mut client, &mut seen, "\r\n\r\n").await;
        let head = String::from_utf8_lossy(&seen).to_string();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
        assert!(head.contains("content-type: text/event-stream\r\n"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        // Each frame is out before the next is produced.
        first.send(Bytes::from_static(b"data: a\n\n")).await.unwrap();
        read_until(&mut client, &mut seen, "9\r\ndata: a\n\n\r\n").await;
        first.send(Bytes::from_static(b"data: bb\n\n")).await.unwrap();
        read_until(&mut client, &mut seen, "a\r\ndata: bb\n\n\r\n").await;
        drop(first);
        read_until(&mut client, &mut seen, "\r\n0\r\n\r\n").await;
        // Kept alive: the next request is answered on the same connection.
        seen.clear();
        client.write_all(STREAMED_REQUEST).await.unwrap();
        drop(second);
        read_until(&mut client, &mut seen, "\r\n0\r\n\r\n").await;
        assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200 OK\r\n"));
        drop(client);
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .unwrap()
            .unwrap();
    }

    /// A caller that closes its connection mid-stream ends the answer: the
    /// body is dropped (which is how the router cancels the agent's request).
    #[tokio::test]
    async fn a_caller_that_leaves_mid_stream_drops_the_body() {
        let (frames, receiver) = tokio::sync::mpsc::channel(4);
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(serve_connection(streaming_door(vec![receiver]), server));
        client.write_all(STREAMED_REQUEST).await.unwrap();
        frames.send(Bytes::from_static(b"data: a\n\n")).await.unwrap();
        let mut seen = Vec::new();
        read_until(&mut client, &mut seen, "data: a").await;
        drop(client);
        tokio::time::timeout(Duration::from_secs(10), frames.closed())
            .await
            .expect("the body was not dropped when the caller left");
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn chunk_size_lines_are_hex() {
        for (length, line) in [(0, "0\r\n"), (9, "9\r\n"), (10, "a\r\n"), (0x10000, "10000\r\n")] {
            let mut buffer = [0u8; 18];
            let written = chunk_size(length, &mut buffer);
            assert_eq!(&buffer[..written], line.as_bytes());
        }
        let mut buffer = [0u8; 18];
        assert_eq!(chunk_size(usize::MAX, &mut buffer), 18);
    }

    /// A gathered chunk follows what the output held (the head) with nothing
    /// between: the size line fills the room before the data, the head moves up.
    #[test]
    fn gathered_chunks_follow_the_head_exactly() {
        let long = "x".repeat(300);
        let cases: [(&str, Vec<&str>, String); 4] = [
            (
                "HEAD\r\n\r\n",
                vec!["data: a\n\n"],
                "HEAD\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n".to_string(),
            ),
            ("", vec!["ab", "c"], "3\r\nabc\r\n0\r\n\r\n".to_string()),
            (
                "H\r\n\r\n",
                vec![long.as_str()],
                format!("H\r\n\r\n12c\r\n{long}\r\n0\r\n\r\n"),
            ),
            ("H\r\n\r\n", vec![""], "H\r\n\r\n0\r\n\r\n".to_string()),
        ];
        for (head, frames, expected) in cases {
            let frames: Vec<Result<Bytes, std::convert::Infallible>> = frames
                .into_iter()
                .map(|frame| Ok(Bytes::from(frame.to_string())))
                .collect();
            let body = axum::body::Body::from_stream(futures::stream::iter(frames));
            let mut body = std::pin::pin!(body);
            let mut output = head.as_bytes().to_vec();
            let mut skip = 0;
            let mut cx = TaskContext::from_waker(std::task::Waker::noop());
            let gathered = gather(body.as_mut(), &mut cx, &mut output, usize::MAX, &mut skip);
            assert!(matches!(gathered, Poll::Ready(Gathered::End)), "{expected:?}");
            assert_eq!(String::from_utf8_lossy(&output[skip..]), expected);
        }
        // Nothing ready: the output is left as it was.
        let body = axum::body::Body::from_stream(futures::stream::pending::<Result<Bytes, std::convert::Infallible>>());
        let mut body = std::pin::pin!(body);
        let mut output = b"HEAD".to_vec();
        let mut skip = 0;
        let mut cx = TaskContext::from_waker(std::task::Waker::noop());
        assert!(gather(body.as_mut(), &mut cx, &mut output, 1, &mut skip).is_pending());
        assert_eq!((&output[..], skip), (&b"HEAD"[..], 0));
    }

    #[test]
    fn content_lengths_are_plain_digits() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b"1048576"), Some(1_048_576));
        for bad in [&b""[..], b"-1", b"1e3", b" 1", b"0x10", b"99999999999999999999"] {
            assert_eq!(content_length(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn dates_are_imf_fixdates() {
        let mut seen = String::new();
        with_date(|date| seen = String::from_utf8_lossy(date).into_owned());
        assert!(httpdate::parse_http_date(&seen).is_ok(), "{seen}");
        assert!(seen.ends_with(" GMT") && seen.len() == 29, "{seen}");
        assert_eq!(crate::decimal(0, &mut [0; 20]), b"0");
        assert_eq!(crate::decimal(1_234_567, &mut [0; 20]), b"1234567");
        assert_eq!(crate::decimal(u64::MAX, &mut [0; 20]), u64::MAX.to_string().as_bytes());
    }
}
