//! A small pipelined RESP2 client: the context store's path to Redis.
//!
//! Why not `redis::aio`: profiled under load, its combinator-based reply parser
//! took ~16 % of the context service's CPU and it issued ~1.7 write syscalls per
//! command (so Redis, too, read commands in pieces). Here every command queued
//! while the driver was busy goes out in one write, and replies are parsed by
//! a direct scanner.
//!
//! A [`Connection`] is a handle to one TCP (or TLS, for `rediss://`) connection driven by one task on the
//! runtime that opened it (the context store opens one per serving thread).
//! Requests queue on a channel; replies are matched to requests in order. A
//! connection that cannot be made, or breaks, fails everything queued on it
//! with an error and ends; [`Connection::is_closed`] then tells the owner to
//! open a new one, so the service recovers by itself when Redis is back.
//!
//! The reply timeout is the connection's, not each call's: when the oldest
//! unanswered command has waited longer than [`Target::reply_timeout`], Redis
//! is taken as lost (a partition, a hung host) and the connection fails like a
//! broken one. One coarse check timer per connection instead of one timer per
//! call: registering a Tokio timer per request woke the runtime's I/O driver
//! (an `eventfd` write) on most requests (tokio-rs/tokio#5207).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use agent_reach_serving::decimal;
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How a [`Connection::send`] error starts when none of its commands were
/// written (the connection could not be made, or was gone before): sending
/// them again elsewhere cannot run them twice. Any other error may come after
/// Redis ran them.
pub const NOT_SENT: &str = "not sent: ";

/// One reply, as RESP2 has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Status(String),
    Array(Vec<Reply>),
    /// An error reply (`-ERR ...`): the command failed, the connection is fine.
    Error(String),
}

impl Reply {
    /// A bulk or status reply as text, without copying its bytes.
    pub fn into_text(self) -> Result<String, String> {
        match self {
            Reply::Bulk(bytes) => String::from_utf8(bytes).map_err(|_| "a reply is not UTF-8".to_string()),
            Reply::Status(text) => Ok(text),
            other => Err(format!("expected text, got {other:?}")),
        }
    }

    /// An integer reply, or a bulk/status reply holding a decimal integer.
    pub fn int(&self) -> Result<i64, String> {
        match self {
            Reply::Int(value) => Ok(*value),
            Reply::Bulk(bytes) => {
                let text = String::from_utf8_lossy(bytes);
                text.parse().map_err(|_| format!("expected an integer, got `{text}`"))
            }
            Reply::Status(text) => text.parse().map_err(|_| format!("expected an integer, got `{text}`")),
            other => Err(format!("expected an integer, got {other:?}")),
        }
    }
}

/// A command's arguments, encoded as they are added.
#[derive(Debug, Clone, Default)]
pub struct Args {
    count: usize,
    body: Vec<u8>,
}

impl Args {
    pub fn new() -> Self {
        Self::with_capacity(512)
    }

    /// Room for `bytes` of encoded arguments before growing.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            count: 0,
            body: Vec::with_capacity(bytes),
        }
    }

    /// The encoded arguments' length.
    pub fn encoded_len(&self) -> usize {
        self.body.len()
    }

    pub fn arg(&mut self, value: impl Arg) -> &mut Self {
        self.count += 1;
        value.encode(&mut self.body);
        self
    }

    /// Appends every argument of `other`.
    pub fn extend(&mut self, other: &Args) -> &mut Self {
        self.count += other.count;
        self.body.extend_from_slice(&other.body);
        self
    }
}

/// Something that can be a command argument.
pub trait Arg {
    fn encode(&self, out: &mut Vec<u8>);
}

fn encode_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    out.push(b'$');
    push_decimal(out, bytes.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

fn push_decimal(out: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; 20];
    out.extend_from_slice(decimal(value, &mut digits));
}

impl Arg for &str {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(self.as_bytes(), out);
    }
}

impl Arg for &String {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(self.as_bytes(), out);
    }
}

impl Arg for u64 {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut digits = [0u8; 20];
        encode_bytes(decimal(*self, &mut digits), out);
    }
}

impl Arg for usize {
    fn encode(&self, out: &mut Vec<u8>) {
        (*self as u64).encode(out);
    }
}

impl Arg for i64 {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut text = Vec::with_capacity(21);
        if *self < 0 {
            text.push(b'-');
        }
        push_decimal(&mut text, self.unsigned_abs());
        encode_bytes(&text, out);
    }
}

/// Commands sent together; their replies come back together, in order.
#[derive(Debug, Default)]
pub struct Pipeline {
    bytes: Vec<u8>,
    commands: usize,
}

impl Pipeline {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `bytes` of commands before growing.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            commands: 0,
        }
    }

    /// How many commands it holds.
    pub fn len(&self) -> usize {
        self.commands
    }

    pub fn is_empty(&self) -> bool {
        self.commands == 0
    }

    /// Adds the command `args` (its first argument is the command name).
    pub fn command(&mut self, args: &Args) -> &mut Self {
        self.bytes.push(b'*');
        push_decimal(&mut self.bytes, args.count as u64);
        self.bytes.extend_from_slice(b"\r\n");
        self.bytes.extend_from_slice(&args.body);
        self.commands += 1;
        self
    }
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct Target {
    /// The server, when the URL names one (`redis://`); unused with `primary`.
    pub host: String,
    pub port: u16,
    /// The primary the Sentinels name (`redis+sentinel://`): connect where it
    /// is now, and refuse a server whose `ROLE` is not `master`.
    pub primary: Option<std::sync::Arc<agent_reach_stores::Primary>>,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Bound on connecting (and on the AUTH/SELECT handshake).
    pub connect_timeout: Duration,
    /// Bound on waiting for a reply: once the oldest unanswered command has
    /// waited this long (checked every tenth of it, at most every 100 ms),
    /// everything on the connection fails and it closes.
    pub reply_timeout: Duration,
    /// TLS (`rediss://`): the server's certificate is verified against this
    /// configuration's roots, for the name the URL (or the Sentinels) gave.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

struct Request {
    bytes: Vec<u8>,
    replies: usize,
    answer: oneshot::Sender<Result<Vec<Reply>, String>>,
}

/// A handle to one connection; cheap to clone.
#[derive(Clone)]
pub struct Connection {
    requests: mpsc::UnboundedSender<Request>,
}

impl Connection {
    /// Starts connecting to `target` on the current runtime; requests sent
    /// before the connection is up wait for it (or fail with it).
    pub fn open(target: Target) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        tokio::spawn(drive(target, queue));
        Self { requests }
    }

    /// The connection ended (it could not be made, or broke); open a new one.
    pub fn is_closed(&self) -> bool {
        self.requests.is_closed()
    }

    /// Both handles lead to the same connection.
    pub fn same_as(&self, other: &Connection) -> bool {
        self.requests.same_channel(&other.requests)
    }

    /// Sends `pipeline` and waits for all its replies. `Err` means the
    /// connection failed (the commands may or may not have run); error replies
    /// are `Ok` values ([`Reply::Error`]).
    pub async fn send(&self, pipeline: Pipeline) -> Result<Vec<Reply>, String> {
        if pipeline.commands == 0 {
            return Ok(Vec::new());
        }
        let (answer, reply) = oneshot::channel();
        let request = Request {
            bytes: pipeline.bytes,
            replies: pipeline.commands,
            answer,
        };
        self.requests
            .send(request)
            .map_err(|_| format!("{NOT_SENT}the Redis connection is closed"))?;
        reply
            .await
            .map_err(|_| "the Redis connection ended before answering".to_string())?
    }
}

async fn drive(target: Target, mut queue: mpsc::UnboundedReceiver<Request>) {
    let connected = tokio::time::timeout(target.connect_timeout, connect(&target))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "cannot connect to Redis at {}:{} within {} ms",
                target.host,
                target.port,
                target.connect_timeout.as_millis()
            ))
        });
    let served = match connected {
        Ok(Linked::Plain(stream)) => {
            let (reader, writer) = stream.into_split();
            serve(reader, writer, false, &mut queue, target.reply_timeout).await
        }
        Ok(Linked::Tls(stream)) => {
            let (reader, writer) = tokio::io::split(*stream);
            serve(reader, writer, true, &mut queue, target.reply_timeout).await
        }
        Err(why) => Err(why),
    };
    let why = match served {
        Ok(()) => return,
        Err(why) => why,
    };
    // Fail whatever is still queued (never written: a connection that could
    // not be made fails everything this way); the closed channel tells
    // owners to reconnect.
    queue.close();
    let unsent = format!("{NOT_SENT}{why}");
    while let Ok(request) = queue.try_recv() {
        let _ = request.answer.send(Err(unsent.clone()));
    }
}

/// A connected stream: plain TCP, or TLS over it.
enum Linked {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

async fn connect(target: &Target) -> Result<Linked, String> {
    let (host, address) = match &target.primary {
        Some(primary) => {
            let address = primary.current().await?.0;
            (address.host.clone(), address.to_string())
        }
        None => (target.host.clone(), format!("{}:{}", target.host, target.port)),
    };
    let stream = TcpStream::connect(&address)
        .await
        .map_err(|error| format!("cannot connect to Redis at {address}: {error}"))?;
    stream.set_nodelay(true).map_err(|error| error.to_string())?;
    match &target.tls {
        None => {
            let mut stream = stream;
            handshake(&mut stream, target, &address).await?;
            Ok(Linked::Plain(stream))
        }
        Some(config) => {
            let name =
                rustls::pki_types::ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
                    .map_err(|error| format!("`{host}` is not a name a TLS certificate can carry: {error}"))?;
            let mut stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, stream)
                .await
                .map_err(|error| {
                    format!(
                        "TLS with Redis at {address} failed: {}",
                        agent_reach_stores::error_chain(&error)
                    )
                })?;
            handshake(&mut stream, target, &address).await?;
            Ok(Linked::Tls(Box::new(stream)))
        }
    }
}

/// AUTH, SELECT and (behind Sentinels) ROLE, before any request is sent.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    target: &Target,
    address: &str,
) -> Result<(), String> {
    let mut handshake = Pipeline::new();
    if let Some(password) = &target.password {
        let mut auth = Args::new();
        auth.arg("AUTH");
        if let Some(username) = &target.username {
            auth.arg(username);
        }
        handshake.command(auth.arg(password));
    }
    if target.db != 0 {
        handshake.command(Args::new().arg("SELECT").arg(target.db));
    }
    if target.primary.is_some() {
        // A Sentinel's answer can lag a failover: check what the server says it is.
        handshake.command(Args::new().arg("ROLE"));
    }
    if handshake.commands > 0 {
        stream
            .write_all(&handshake.bytes)
            .await
            .map_err(|error| format!("Redis handshake failed: {error}"))?;
        stream
            .flush()
            .await
            .map_err(|error| format!("Redis handshake failed: {error}"))?;
        let mut input = BytesMut::with_capacity(256);
        let mut answered = 0;
        while answered < handshake.commands {
            match parse(&input)? {
                Some((Reply::Error(message), _)) => return Err(format!("Redis refused the handshake: {message}")),
                Some((reply, used)) => {
                    input.advance(used);
                    answered += 1;
                    if let (Some(primary), true) = (&target.primary, answered == handshake.commands) {
                        check_role(primary, address, reply).await?;
                    }
                }
                None => {
                    let read = stream
                        .read_buf(&mut input)
                        .await
                        .map_err(|error| format!("Redis handshake failed: {error}"))?;
                    if read == 0 {
                        return Err("Redis closed the connection during the handshake".to_string());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Refuses a server that is not the primary, and asks the Sentinels again.
async fn check_role(primary: &agent_reach_stores::Primary, address: &str, reply: Reply) -> Result<(), String> {
    let role = match reply {
        Reply::Array(items) => items.into_iter().next().and_then(|role| role.into_text().ok()),
        _ => None,
    }
    .unwrap_or_else(|| "server with an unreadable ROLE".to_string());
    if role == "master" {
        return Ok(());
    }
    if let Err(error) = primary.refresh().await {
        tracing::warn!(message = "No Sentinel answered after a demoted primary.", %error);
    }
    Err(format!(
        "refusing Redis at {address}: it is a {role} now, not the primary of `{}`",
        primary.service()
    ))
}

/// A request whose replies are being collected.
struct Waiting {
    /// When it was taken from the queue (stamped once per batch).
    since: Instant,
    expected: usize,
    replies: Vec<Reply>,
    answer: oneshot::Sender<Result<Vec<Reply>, String>>,
}

/// Runs one connection until every handle is gone (`Ok`), or it breaks (`Err`,
/// after failing what was waiting): a read or write error, or no reply to the
/// oldest command within `reply_timeout`. Every asker holds a handle while it
/// waits, so once all are gone, replies still due have nobody to go to: the
/// connection closes at once. `flushes`: the writer buffers (TLS records are
/// only sealed and sent on a flush once the socket pushes back).
async fn serve<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut reader: R,
    mut writer: W,
    flushes: bool,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    reply_timeout: Duration,
) -> Result<(), String> {
    let mut unflushed = false;
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut check = tokio::time::interval(check_period(reply_timeout));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut output: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut written = 0;
    let mut input = BytesMut::with_capacity(16 * 1024);
    let result = loop {
        tokio::select! {
            biased;
            request = queue.recv(), if output.is_empty() => {
                let Some(request) = request else {
                    break Ok(());
                };
                // Everything queued now goes out in one write.
                let since = Instant::now();
                let mut next = Some(request);
                while let Some(request) = next {
                    output.extend_from_slice(&request.bytes);
                    waiting.push_back(Waiting {
                        since,
                        expected: request.replies,
                        replies: Vec::with_capacity(request.replies),
                        answer: request.answer,
                    });
                    next = queue.try_recv().ok();
                }
            }
            sent = push(&mut writer, &output[written..]), if !output.is_empty() || unflushed => {
                match sent {
                    Ok(Pushed::Wrote(0)) => break Err("Redis stopped accepting data".to_string()),
                    Ok(Pushed::Wrote(count)) => {
                        written += count;
                        if written == output.len() {
                            output.clear();
                            written = 0;
                            unflushed = flushes;
                        }
                    }
                    Ok(Pushed::Flushed) => unflushed = false,
                    Err(error) => break Err(format!("writing to Redis failed: {error}")),
                }
            }
            read = reader.read_buf(&mut input) => {
                match read {
                    Ok(0) => break Err("Redis closed the connection".to_string()),
                    Ok(_) => match deliver(&mut input, &mut waiting) {
                        Err(why) => break Err(why),
                        // The server was demoted under us: what it still answers
                        // is stale, so reconnect (to the primary) instead.
                        Ok(Delivered::Demoted) => break Err("Redis answered READONLY: it is a replica now".to_string()),
                        Ok(Delivered::Fine) => {}
                    },
                    Err(error) => break Err(format!("reading from Redis failed: {error}")),
                }
            }
            _ = check.tick(), if !waiting.is_empty() => {
                if waiting.front().is_some_and(|oldest| oldest.since.elapsed() >= reply_timeout) {
                    break Err(format!("no answer from Redis within {} ms", reply_timeout.as_millis()));
                }
            }
        }
    };
    if let Err(why) = &result {
        for request in waiting {
            let _ = request.answer.send(Err(why.clone()));
        }
    }
    result
}

enum Pushed {
    Wrote(usize),
    Flushed,
}

/// Writes what is pending, or, with nothing pending, flushes what the writer
/// still buffers (one future, so `serve`'s select borrows the writer once).
async fn push<W: AsyncWrite + Unpin>(writer: &mut W, pending: &[u8]) -> std::io::Result<Pushed> {
    if pending.is_empty() {
        writer.flush().await.map(|()| Pushed::Flushed)
    } else {
        writer.write(pending).await.map(Pushed::Wrote)
    }
}

/// How often a connection checks its oldest unanswered command: a tenth of
/// the timeout (so a lost Redis is noticed within 110 % of it), between 1 ms
/// and 100 ms.
fn check_period(reply_timeout: Duration) -> Duration {
    (reply_timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

enum Delivered {
    Fine,
    /// A `READONLY` error came back: the server is a replica now.
    Demoted,
}

/// Parses every complete reply in `input` and hands it to the request it answers.
fn deliver(input: &mut BytesMut, waiting: &mut VecDeque<Waiting>) -> Result<Delivered, String> {
    let mut delivered = Delivered::Fine;
    while let Some((reply, used)) = parse(input)? {
        input.advance(used);
        if matches!(&reply, Reply::Error(message) if message.starts_with("READONLY")) {
            delivered = Delivered::Demoted;
        }
        let Some(front) = waiting.front_mut() else {
            return Err("Redis sent a reply nobody asked for".to_string());
        };
        front.replies.push(reply);
        if front.replies.len() == front.expected {
            if let Some(done) = waiting.pop_front() {
                // The asker may have timed out and gone; its replies are dropped.
                let _ = done.answer.send(Ok(done.replies));
            }
        }
    }
    Ok(delivered)
}

/// One complete reply at the start of `input` and the bytes it takes, `None`
/// when more bytes are needed.
pub fn parse(input: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    parse_at(input, 0)
}

fn parse_at(input: &[u8], at: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(&kind) = input.get(at) else {
        return Ok(None);
    };
    let Some((line, next)) = line(input, at + 1) else {
        return Ok(None);
    };
    let reply = match kind {
        b'+' => Reply::Status(String::from_utf8_lossy(line).into_owned()),
        b'-' => Reply::Error(String::from_utf8_lossy(line).into_owned()),
        b':' => Reply::Int(integer(line)?),
        b'$' => {
            let length = integer(line)?;
            if length < 0 {
                return Ok(Some((Reply::Nil, next)));
            }
            let end = next + length as usize;
            if input.len() < end + 2 {
                return Ok(None);
            }
            if &input[end..end + 2] != b"\r\n" {
                return Err("a Redis bulk reply is not terminated by CRLF".to_string());
            }
            return Ok(Some((Reply::Bulk(input[next..end].to_vec()), end + 2)));
        }
        b'*' => {
            let count = integer(line)?;
            if count < 0 {
                return Ok(Some((Reply::Nil, next)));
            }
            let mut items = Vec::with_capacity((count as usize).min(1024));
            let mut at = next;
            for _ in 0..count {
                match parse_at(input, at)? {
                    Some((item, after)) => {
                        items.push(item);
                        at = after;
                    }
                    None => return Ok(None),
                }
            }
            return Ok(Some((Reply::Array(items), at)));
        }
        other => return Err(format!("unexpected RESP type byte 0x{other:02x} from Redis")),
    };
    Ok(Some((reply, next)))
}

/// The bytes from `at` to the next CRLF, and the index after it.
fn line(input: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = input.get(at..)?;
    let end = rest.iter().position(|&byte| byte == b'\r')?;
    if rest.get(end + 1)? != &b'\n' {
        return None;
    }
    Some((&rest[..end], at + end + 2))
}

fn integer(text: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("`{}` is not a RESP integer", String::from_utf8_lossy(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_reply_type_and_waits_for_more_bytes() {
        let input = b"*5\r\n+OK\r\n:-12\r\n$3\r\nabc\r\n$-1\r\n*1\r\n-ERR no\r\n";
        let (reply, used) = parse(input).unwrap().unwrap();
        assert_eq!(used, input.len());
        assert_eq!(
            reply,
            Reply::Array(vec![
                Reply::Status("OK".into()),
                Reply::Int(-12),
                Reply::Bulk(b"abc".to_vec()),
                Reply::Nil,
                Reply::Array(vec![Reply::Error("ERR no".into())]),
            ])
        );
        for cut in 0..input.len() {
            assert_eq!(parse(&input[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b"$3\r\nabcd\r\n").is_err());
        assert!(parse(b":x\r\n").is_err());
    }

    #[test]
    fn encodes_commands_as_resp_arrays() {
        let mut args = Args::new();
        args.arg("SET").arg("k").arg(-5i64).arg(17usize);
        let mut pipeline = Pipeline::new();
        pipeline.command(&args).command(Args::new().arg("PING"));
        assert_eq!(
            pipeline.bytes,
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n-5\r\n$2\r\n17\r\n*1\r\n$4\r\nPING\r\n"
        );
        assert_eq!(pipeline.commands, 2);
    }
}
