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
//! HTTP/2 stays hyper's (its frames, HPACK, flow control), but a request
//! the service takes with [`HotRoutes::takes_h2`] (the router: gRPC
//! `SendMessage`) is answered by [`HotRoutes::call_h2`] instead of going
//! through the axum routes, their layers and tonic's server.
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

    /// Whether this answers an HTTP/2 request (h2c, or h2 under TLS: hyper
    /// reads and writes its frames) itself, with [`HotRoutes::call_h2`];
    /// `false` (the default) leaves it to the axum routes. Take only what
    /// `call_h2` answers as they would, or hands back to them.
    fn takes_h2(&self, _request: &http::request::Parts) -> bool {
        false
    }

    /// Answers an HTTP/2 request [`HotRoutes::takes_h2`] took, as the axum
    /// routes would; what it does not answer itself it hands to `app`
    /// (those routes), its body as it came.
    fn call_h2(
        &self,
        request: http::Request<axum::body::Body>,
        app: axum::Router,
    ) -> impl Future<Output = http::Response<axum::body::Body>> + Send {
        answer_by(app, request)
    }
}

/// `request` answered by the axum routes `app`.
pub async fn answer_by(
    mut app: axum::Router,
    request: http::Request<axum::body::Body>,
) -> http::Response<axum::body::Body> {
    // A router is always ready, and its error type has no values.
    match tower_service::Service::call(&mut app, request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
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
    /// [`Answer::Json`] under another JSON media type (e.g. `application/a2a+json`).
    Typed {
        status: http::StatusCode,
        content_type: &'static str,
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
            Answer::Typed {
                status,
                content_type,
                body,
            } => (status, [(http::header::CONTENT_TYPE, content_type)], body).into_response(),
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
        let (hot, app) = (self.door.hot, self.door.app);
        // Every request to the axum routes, but an HTTP/2 one the hot routes take.
        let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let (parts, body) = request.into_parts();
            let taken = parts.version == http::Version::HTTP_2 && hot.takes_h2(&parts);
            let request = http::Request::from_parts(parts, axum::body::Body::new(body));
            // The hot route's future boxed: the other's stays as small as it was.
            let answered = if taken {
                let (hot, app) = (hot.clone(), app.clone());
                futures::future::Either::Left(Box::pin(async move { hot.call_h2(request, app).await }))
            } else {
                futures::future::Either::Right(answer_by(app.clone(), request))
            };
            async move { Ok::<_, std::convert::Infallible>(answered.await) }
        });
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

mod replay;
#[cfg(test)]
mod tests;
mod write;

use replay::*;
use write::*;
