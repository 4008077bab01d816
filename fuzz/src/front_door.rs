//! `front_door`: the bytes a client sends on one connection, served by the
//! edge's front door (`edge/src/front.rs`: its own HTTP/1.1 loop for a hot
//! route, hyper for everything else, the hand-over mid-connection) and, for
//! comparison, by hyper alone with the same routes.
//!
//! Holds, for every input:
//! - nothing panics or hangs;
//! - every request the door's own loop takes is plain: HTTP/1.1, no
//!   `Transfer-Encoding`, `Expect`, `Upgrade` or `Connection`, at most one
//!   `Content-Length`, all digits, and its body exactly that long and within
//!   the limit (none: no body); its header lookups agree with its header map;
//! - the door and hyper alone see the same requests in the same order (method,
//!   target, version, headers, body): the two parsers never disagree on where
//!   a request ends, which is what request smuggling needs;
//! - no request anyone accepts carries both `Content-Length` and
//!   `Transfer-Encoding`.

use std::future::Future;
use std::sync::{Arc, Mutex};

use agent_reach_serving::front::{Answer, Door, Headers, HotRoutes};
use agent_reach_serving::HeaderLookup as _;
use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// The door's body limit here: small, so inputs cross it.
const BODY_LIMIT: usize = 256;

/// One request as a handler saw it, body read to its end.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    method: http::Method,
    target: String,
    version: http::Version,
    headers: HeaderMap,
    body: Bytes,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn log(log: &Log, seen: Seen) {
    log.lock().expect("a handler panicked (reported already)").push(seen);
}

/// The router's hot route, `POST /v1/invoke`, recording what it is given.
#[derive(Clone)]
struct Invoke(Log);

impl HotRoutes for Invoke {
    type Route = ();

    fn route(&self, method: &str, target: &str) -> Option<()> {
        (method == "POST" && target == "/v1/invoke").then_some(())
    }

    fn call(&self, _: (), headers: Headers, body: Bytes) -> impl Future<Output = Answer> + Send {
        let map = headers
            .header_map()
            .expect("every field the door takes makes a header map (Headers::header_map)");
        plain_request_holds(&headers, &map, &body);
        log(
            &self.0,
            Seen {
                method: http::Method::POST,
                target: "/v1/invoke".to_string(),
                version: http::Version::HTTP_11,
                headers: map,
                body,
            },
        );
        std::future::ready(Answer::Json {
            status: StatusCode::OK,
            body: b"{}".to_vec(),
        })
    }
}

/// What the door's own loop promises of a request it takes.
fn plain_request_holds(headers: &Headers, map: &HeaderMap, body: &Bytes) {
    for refused in [TRANSFER_ENCODING, EXPECT, UPGRADE, CONNECTION] {
        assert!(
            !map.contains_key(&refused),
            "the door's loop took a request with `{refused}`"
        );
    }
    let lengths: Vec<&[u8]> = map
        .get_all(CONTENT_LENGTH)
        .iter()
        .map(|value| value.as_bytes())
        .collect();
    match lengths.as_slice() {
        [] => assert!(body.is_empty(), "a body without a content-length"),
        [length] => {
            assert!(length.iter().all(u8::is_ascii_digit), "content-length {length:?} taken");
            let declared: usize = std::str::from_utf8(length)
                .ok()
                .and_then(|text| text.parse().ok())
                .expect("digits within the limit");
            assert_eq!(declared, body.len(), "the body is not its content-length");
        }
        _ => panic!("the door's loop took {} content-lengths", lengths.len()),
    }
    assert!(body.len() <= BODY_LIMIT, "a body over the limit taken");
    for name in map.keys() {
        let first = map.get(name).map(|value| value.as_bytes());
        assert_eq!(headers.value(name.as_str()), first, "lookup of `{name}`");
        assert_eq!(
            headers.value(&name.as_str().to_ascii_uppercase()),
            first,
            "lookup of `{name}` in upper case"
        );
    }
    assert_eq!(
        headers.value("x-agent-reach-not-sent"),
        map.get("x-agent-reach-not-sent").map(|v| v.as_bytes())
    );
}

/// The axum routes behind the door (and hyper alone): every request recorded.
fn app(seen: Log) -> axum::Router {
    axum::Router::new().fallback(move |request: axum::extract::Request| {
        let seen = seen.clone();
        async move {
            let (parts, body) = request.into_parts();
            // A body cut short by the end of the input is not a request either side served.
            if let Ok(body) = axum::body::to_bytes(body, usize::MAX).await {
                log(
                    &seen,
                    Seen {
                        method: parts.method,
                        target: parts.uri.to_string(),
                        version: parts.version,
                        headers: parts.headers,
                        body,
                    },
                );
            }
            (StatusCode::OK, "{}")
        }
    })
}

/// Consecutive scheduler turns without a byte of answer after which the
/// server is taken to be waiting for more input.
const QUIET_TURNS: usize = 32;

/// The client: sends `data`, reads every answer, and says it is done only
/// once the server has gone quiet. Closing its side at once would race the
/// answers: hyper (without half-close, as the door runs it) drops a request
/// in progress when the peer's side closes, the door's own loop does not,
/// and that difference is the harness's, not a framing one.
async fn client(stream: DuplexStream, data: &[u8]) {
    let (mut read, mut write) = tokio::io::split(stream);
    let received = std::cell::Cell::new(0usize);
    // A server that stops reading (it closed the connection) fails the write: that is fine.
    let send = async {
        let _ = write.write_all(data).await;
        let (mut quiet, mut seen) = (0, received.get());
        while quiet < QUIET_TURNS {
            // One turn: every branch of the `join!`s and every spawned task polled once more.
            tokio::task::yield_now().await;
            let now = received.get();
            quiet = if now == seen { quiet + 1 } else { 0 };
            seen = now;
        }
        let _ = write.shutdown().await;
    };
    let receive = async {
        let mut buffer = [0u8; 8192];
        while let Ok(read) = read.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            received.set(received.get() + read);
        }
    };
    tokio::join!(send, receive);
}

/// What the front door's handlers see of `data`.
async fn through_the_door(data: &[u8]) -> Vec<Seen> {
    let seen = Log::default();
    let door = Door {
        hot: Invoke(seen.clone()),
        app: app(seen.clone()),
        body_limit: BODY_LIMIT,
        tls: None,
    };
    let (near, far) = tokio::io::duplex(64 * 1024);
    tokio::join!(
        agent_reach_serving::fuzzing::serve_connection(door, far),
        client(near, data)
    );
    let seen = seen.lock().expect("a handler panicked (reported already)");
    seen.clone()
}

/// What the same routes see of `data` served by hyper alone, as the door
/// hands a connection over.
async fn through_hyper(data: &[u8]) -> Vec<Seen> {
    let seen = Log::default();
    let (near, far) = tokio::io::duplex(64 * 1024);
    let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let service = hyper_util::service::TowerToHyperService::new(app(seen.clone()));
    let serve = async {
        // A refused request ends the connection with an error: that is an answer, not a finding.
        let _ = builder
            .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(far), service)
            .await;
    };
    tokio::join!(serve, client(near, data));
    let seen = seen.lock().expect("a handler panicked (reported already)");
    seen.clone()
}

thread_local! {
    /// One runtime per fuzzing thread: building one per input would dominate.
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
}

pub fn run(data: &[u8]) {
    let (door, hyper) = RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let door = through_the_door(data).await;
            (door, through_hyper(data).await)
        })
    });
    for seen in door.iter().chain(&hyper) {
        assert!(
            !(seen.headers.contains_key(CONTENT_LENGTH) && seen.headers.contains_key(TRANSFER_ENCODING)),
            "a request was accepted with both content-length and transfer-encoding: {seen:?}"
        );
    }
    assert_eq!(door, hyper, "the front door and hyper framed the input differently");
}
