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

const EVENTS_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

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
