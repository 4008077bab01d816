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

/// `POST /hot` over HTTP/2 answered by the hot routes, its body echoed.
#[derive(Clone)]
struct H2Hot;

impl HotRoutes for H2Hot {
    type Route = std::convert::Infallible;

    fn route(&self, _: &str, _: &str) -> Option<Self::Route> {
        None
    }

    async fn call(&self, route: Self::Route, _: Headers, _: Bytes) -> Answer {
        match route {}
    }

    fn takes_h2(&self, request: &http::request::Parts) -> bool {
        request.method == http::Method::POST && request.uri.path() == "/hot"
    }

    async fn call_h2(
        &self,
        request: http::Request<axum::body::Body>,
        _: axum::Router,
    ) -> http::Response<axum::body::Body> {
        let body = axum::body::to_bytes(request.into_body(), 1024)
            .await
            .unwrap_or_default();
        http::Response::new(axum::body::Body::from([b"hot ".as_slice(), &body].concat()))
    }
}

/// `method path` with `body` on `client`'s HTTP/2 connection: the answer's body.
async fn h2_answer(client: &h2::client::SendRequest<Bytes>, method: &str, path: &str, body: &'static [u8]) -> String {
    let mut client = client.clone().ready().await.unwrap();
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://r{path}"))
        .body(())
        .unwrap();
    let (answer, mut sending) = client.send_request(request, false).unwrap();
    sending.send_data(Bytes::from_static(body), true).unwrap();
    let mut received = answer.await.unwrap().into_body();
    let mut text = Vec::new();
    while let Some(data) = received.data().await {
        let data = data.unwrap();
        let _ = received.flow_control().release_capacity(data.len());
        text.extend_from_slice(&data);
    }
    String::from_utf8(text).unwrap()
}

#[tokio::test]
async fn an_http2_request_the_hot_routes_take_is_theirs_and_every_other_the_axum_routes() {
    let app = axum::Router::new().fallback(|| async { "routed" });
    let door = || Door {
        hot: H2Hot,
        app: app.clone(),
        body_limit: 1024,
        tls: None,
    };
    let (client_io, server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(serve_connection(door(), server));
    let (client, connection) = h2::client::handshake(client_io).await.unwrap();
    let driven = tokio::spawn(connection);
    assert_eq!(h2_answer(&client, "POST", "/hot", b"a").await, "hot a");
    assert_eq!(h2_answer(&client, "POST", "/other", b"b").await, "routed");
    assert_eq!(h2_answer(&client, "PUT", "/hot", b"c").await, "routed");
    drop(client);
    driven.await.unwrap().unwrap();
    served.await.unwrap();

    // On HTTP/1.1, handed to hyper, the same request is the axum routes'.
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(serve_connection(door(), server));
    client
        .write_all(b"POST /hot HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n1\r\na\r\n0\r\n\r\n")
        .await
        .unwrap();
    let mut output = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut output))
        .await
        .expect("the answer came")
        .unwrap();
    served.await.unwrap();
    let output = String::from_utf8_lossy(&output);
    assert!(output.ends_with("routed"), "{output}");
}
