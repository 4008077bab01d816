//! The router's front door on the wire (`router/src/front.rs`): plain
//! `POST /v1/invoke` and `POST /a2a/{capability}` requests take the router's
//! own HTTP/1.1 loop, anything
//! else is handed, mid-connection if need be, to hyper. Raw TCP against a real
//! router, registry (on real etcd) and HTTP agent; every other router test
//! goes through the same front door with a real HTTP client.

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One parsed answer.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The body as JSON (`null` for none: a notification's 204).
    fn json(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads the next answer from `stream` (`input` keeps what is read past it);
/// `None` when the connection ends before one.
async fn read_answer(stream: &mut TcpStream, input: &mut Vec<u8>) -> Option<Answer> {
    loop {
        let mut raw = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut raw);
        if let httparse::Status::Complete(head) = response.parse(input).expect("a valid HTTP answer") {
            let headers: Vec<(String, String)> = response
                .headers
                .iter()
                .map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).into_owned()))
                .collect();
            let status = response.code.expect("status");
            let length: usize = headers
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case("content-length"))
                .map(|(_, value)| value.parse().expect("content-length"))
                // 204 and 304 have no body, and no length to say so.
                .or((status == 204 || status == 304).then_some(0))
                .expect("answers carry a content-length");
            while input.len() < head + length {
                let mut chunk = [0u8; 8192];
                let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
                    .await
                    .expect("the answer's body came")
                    .expect("read");
                assert!(read > 0, "the connection ended inside an answer");
                input.extend_from_slice(&chunk[..read]);
            }
            let body = input[head..head + length].to_vec();
            input.drain(..head + length);
            return Some(Answer { status, headers, body });
        }
        let mut chunk = [0u8; 8192];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("an answer came")
            .expect("read");
        if read == 0 {
            return None;
        }
        input.extend_from_slice(&chunk[..read]);
    }
}

/// Whether the router closes `stream` (reads to the end within 10 s).
async fn closes(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await,
        Ok(Ok(_))
    )
}

fn invoke_request(request_id: &str, extra_headers: &str) -> String {
    let body = serde_json::json!({
        "capability": CAPABILITY,
        "request_id": request_id,
        "payload": { "order_id": request_id },
    })
    .to_string();
    format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n{extra_headers}\r\n{body}",
        token(CALLER),
        body.len()
    )
}

async fn cluster_with_an_agent() -> (Cluster, Agent) {
    let cluster = Cluster::start().await;
    let agent = cluster.agent(AgentSpec::new("front-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["front-1"]).await;
    (cluster, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_pipelined_and_split_requests_are_answered_in_order() {
    let (cluster, _agent) = cluster_with_an_agent().await;
    let mut stream = TcpStream::connect(cluster.router_addr).await.unwrap();
    let mut input = Vec::new();

    // Two requests in one write: two answers, in order.
    let pipelined = format!("{}{}", invoke_request("r-1", ""), invoke_request("r-2", ""));
    stream.write_all(pipelined.as_bytes()).await.unwrap();
    for id in ["r-1", "r-2"] {
        let answer = read_answer(&mut stream, &mut input).await.expect("an answer");
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        let envelope = answer.json();
        assert_eq!(
            (envelope["request_id"].as_str(), envelope["status"].as_str()),
            (Some(id), Some("succeeded"))
        );
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert!(answer.header("date").is_some_and(|date| date.ends_with(" GMT")));
    }

    // One request written byte by byte in pieces (head and body split).
    let request = invoke_request("r-3", "");
    let (head, body) = request.split_at(request.find("\r\n\r\n").unwrap() + 2);
    for piece in [&head[..10], &head[10..], &body[..3], &body[3..]] {
        stream.write_all(piece.as_bytes()).await.unwrap();
        stream.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    let answer = read_answer(&mut stream, &mut input).await.expect("an answer");
    assert_eq!(
        (answer.status, answer.json()["request_id"].as_str()),
        (200, Some("r-3"))
    );

    // Errors are result envelopes on this path too: no token, then a bad body.
    // (The header line dropped whatever token it holds: a token made again
    // here could differ, its `iat` a second later.)
    let unauthenticated: String = invoke_request("r-4", "")
        .split_inclusive("\r\n")
        .filter(|line| !line.starts_with("authorization:"))
        .collect();
    assert!(!unauthenticated.contains("Bearer"));
    stream.write_all(unauthenticated.as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream, &mut input).await.expect("an answer");
    assert_eq!(
        (answer.status, answer.json()["error"]["code"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    let malformed = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {}\r\ncontent-length: 5\r\n\r\n{{\"a\":",
        token(CALLER)
    );
    stream.write_all(malformed.as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream, &mut input).await.expect("an answer");
    assert_eq!(
        (answer.status, answer.json()["error"]["code"].as_str()),
        (400, Some("INVALID_ENVELOPE"))
    );

    // The same connection still serves the next plain request.
    stream.write_all(invoke_request("r-5", "").as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream, &mut input).await.expect("an answer");
    assert_eq!(
        (answer.status, answer.json()["request_id"].as_str()),
        (200, Some("r-5"))
    );

    // Pipelined requests each get their own headers (header values are slices
    // of the read buffer): a good token, then a forged one, then a good one.
    let forged = invoke_request("r-7", "").replacen("\r\ncontent-type:", "x\r\ncontent-type:", 1);
    assert!(
        forged.contains("x\r\ncontent-type:"),
        "the token (ending the authorization line) is forged"
    );
    let pipelined = format!("{}{forged}{}", invoke_request("r-6", ""), invoke_request("r-8", ""));
    stream.write_all(pipelined.as_bytes()).await.unwrap();
    for (id, status) in [("r-6", 200), ("r-7", 401), ("r-8", 200)] {
        let answer = read_answer(&mut stream, &mut input).await.expect("an answer");
        assert_eq!(answer.status, status, "{id}: {}", String::from_utf8_lossy(&answer.body));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_requests_are_served_by_hyper_mid_connection() {
    let (cluster, _agent) = cluster_with_an_agent().await;
    let mut stream = TcpStream::connect(cluster.router_addr).await.unwrap();
    let mut input = Vec::new();

    // A plain invoke, then another route on the same connection, then invokes again.
    stream.write_all(invoke_request("h-1", "").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut stream, &mut input).await.unwrap().status, 200);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: router\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_answer(&mut stream, &mut input).await.unwrap().status, 200);
    stream.write_all(invoke_request("h-2", "").as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream, &mut input).await.unwrap();
    assert_eq!(
        (answer.status, answer.json()["request_id"].as_str()),
        (200, Some("h-2"))
    );

    // A chunked body (hyper's framing) is read whole and routed.
    let body =
        serde_json::json!({"capability": CAPABILITY, "request_id": "h-3", "payload": {"order_id": "h-3"}}).to_string();
    let (first, second) = body.split_at(10);
    let chunked = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {}\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
        token(CALLER),
        first.len(),
        second.len()
    );
    stream.write_all(chunked.as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream, &mut input).await.unwrap();
    assert_eq!(
        (answer.status, answer.json()["request_id"].as_str()),
        (200, Some("h-3"))
    );

    // A body over the limit is refused with its code, without reading it.
    let mut fresh = TcpStream::connect(cluster.router_addr).await.unwrap();
    let oversized = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{{",
        token(CALLER),
        64 * 1024 * 1024
    );
    fresh.write_all(oversized.as_bytes()).await.unwrap();
    let answer = read_answer(&mut fresh, &mut Vec::new()).await.unwrap();
    assert_eq!(
        (answer.status, answer.json()["error"]["code"].as_str()),
        (413, Some("PAYLOAD_TOO_LARGE"))
    );

    // `Connection: close` is honoured: answered, then closed.
    let mut closing = TcpStream::connect(cluster.router_addr).await.unwrap();
    closing
        .write_all(invoke_request("h-4", "connection: close\r\n").as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut closing, &mut Vec::new()).await.unwrap();
    assert_eq!(
        (answer.status, answer.json()["request_id"].as_str()),
        (200, Some("h-4"))
    );
    assert!(
        closes(&mut closing).await,
        "the router kept a `Connection: close` connection open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_refused_and_nothing_is_smuggled() {
    let (cluster, agent) = cluster_with_an_agent().await;
    // Content-Length and Transfer-Encoding together: the classic smuggling
    // request. Whatever follows must not be taken as a second request.
    let smuggled = invoke_request("s-2", "");
    let attack = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {}\r\ncontent-length: 4\r\n\
         transfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        token(CALLER)
    );
    let mut stream = TcpStream::connect(cluster.router_addr).await.unwrap();
    stream.write_all(attack.as_bytes()).await.unwrap();
    let mut input = Vec::new();
    let first = read_answer(&mut stream, &mut input).await;
    if let Some(first) = &first {
        assert_ne!(first.status, 200, "an ambiguous request was routed");
    }
    assert!(
        closes(&mut stream).await,
        "the connection must close after an ambiguous request"
    );
    assert!(
        read_answer(&mut stream, &mut input).await.is_none(),
        "a second (smuggled) request was answered"
    );
    assert_eq!(agent.hits(), 0, "the agent saw a request");

    // Two Content-Length headers: refused too.
    let doubled = invoke_request("s-3", "content-length: 7\r\n");
    let mut stream = TcpStream::connect(cluster.router_addr).await.unwrap();
    stream.write_all(doubled.as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream, &mut Vec::new()).await;
    assert!(answer.is_none_or(|answer| answer.status == 400));
    assert_eq!(agent.hits(), 0, "the agent saw a request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_and_finishes() {
    let (cluster, _agent) = cluster_with_an_agent().await;
    // A second front door on the same router, with a shutdown of our own.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(agent_reach_router::serve(listener, cluster.router.clone(), async {
        let _ = stopped.await;
    }));
    let mut fast = TcpStream::connect(addr).await.unwrap();
    fast.write_all(invoke_request("d-1", "").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut fast, &mut Vec::new()).await.unwrap().status, 200);
    let mut handed = TcpStream::connect(addr).await.unwrap();
    handed
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: router\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_answer(&mut handed, &mut Vec::new()).await.unwrap().status, 200);

    stop.send(()).unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(
        matches!(finished, Ok(Ok(Ok(())))),
        "the server did not finish after shutdown: {finished:?}"
    );
    assert!(closes(&mut fast).await, "an idle fast-path connection stayed open");
    assert!(closes(&mut handed).await, "an idle hyper connection stayed open");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
}

/// A JSON-RPC request to `/a2a/{capability}`: with a `Content-Length` body
/// (the front door's hot route) or chunked (hyper and the axum route).
fn a2a_request(capability: &str, body: &str, chunked: bool, authorized: bool) -> String {
    let authorization = if authorized {
        format!("authorization: Bearer {}\r\n", token(CALLER))
    } else {
        String::new()
    };
    let framing = if chunked {
        format!(
            "transfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
    } else {
        format!("content-length: {}\r\n\r\n{body}", body.len())
    };
    format!(
        "POST /a2a/{capability} HTTP/1.1\r\nhost: router\r\n{authorization}content-type: application/json\r\n\
         a2a-version: 1.0\r\n{framing}"
    )
}

/// `POST /a2a/{capability}` takes the front door's hot route; its answers,
/// refusals of malformed JSON-RPC included, are the axum route's exactly
/// (status, content type, body; the generated message ids aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_answers_on_the_hot_route_are_the_axum_routes() {
    let (cluster, _agent) = cluster_with_an_agent().await;
    let send = |data: Value| {
        serde_json::json!({
            "jsonrpc": "2.0", "id": "c-1", "method": "SendMessage",
            "params": { "message": { "messageId": "m-1", "role": "ROLE_USER", "parts": [{ "data": data }] } }
        })
        .to_string()
    };
    let cases: Vec<(&str, String, bool, u16)> = vec![
        (CAPABILITY, "{nope".to_string(), true, 200),
        (CAPABILITY, "[1, 2]".to_string(), true, 200),
        (
            CAPABILITY,
            r#"{"jsonrpc":"2.0","method":"SendMessage"}"#.to_string(),
            true,
            204,
        ),
        (
            CAPABILITY,
            r#"[{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t_x"}},{"jsonrpc":"2.0","method":"GetTask"}]"#
                .to_string(),
            true,
            200,
        ),
        (
            CAPABILITY,
            r#"{"jsonrpc":"2.0","id":1,"method":"Teleport","params":{}}"#.to_string(),
            true,
            200,
        ),
        (
            CAPABILITY,
            r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{}}"#.to_string(),
            true,
            200,
        ),
        (
            CAPABILITY,
            r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":[]}"#.to_string(),
            true,
            200,
        ),
        (
            CAPABILITY,
            r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#.to_string(),
            true,
            200,
        ),
        (CAPABILITY, send(serde_json::json!({ "count": 0 })), true, 200),
        (
            "no.such.capability",
            send(serde_json::json!({ "order_id": "a-1" })),
            true,
            404,
        ),
        (CAPABILITY, send(serde_json::json!({ "order_id": "a-1" })), false, 401),
        (CAPABILITY, send(serde_json::json!({ "order_id": "a-1" })), true, 200),
    ];
    let mut hot = TcpStream::connect(cluster.router_addr).await.unwrap();
    let mut through_hyper = TcpStream::connect(cluster.router_addr).await.unwrap();
    let (mut hot_input, mut hyper_input) = (Vec::new(), Vec::new());
    let comparable = |answer: &Answer| {
        let mut body = answer.json();
        if let Some(message) = body.pointer_mut("/result/message").and_then(Value::as_object_mut) {
            assert!(message.remove("messageId").is_some() && message.remove("contextId").is_some());
        }
        // An A2A error's ErrorInfo says when it was made.
        let strip = |reply: &mut Value| {
            if let Some(metadata) = reply
                .pointer_mut("/error/data/0/metadata")
                .and_then(Value::as_object_mut)
            {
                metadata.remove("timestamp");
            }
        };
        match &mut body {
            Value::Array(replies) => replies.iter_mut().for_each(strip),
            reply => strip(reply),
        }
        (
            answer.status,
            answer.header("content-type").map(str::to_string),
            answer.header("www-authenticate").map(str::to_string),
            body,
        )
    };
    for (capability, body, authorized, status) in cases {
        hot.write_all(a2a_request(capability, &body, false, authorized).as_bytes())
            .await
            .unwrap();
        let from_hot = read_answer(&mut hot, &mut hot_input).await.expect("an answer");
        through_hyper
            .write_all(a2a_request(capability, &body, true, authorized).as_bytes())
            .await
            .unwrap();
        let from_hyper = read_answer(&mut through_hyper, &mut hyper_input)
            .await
            .expect("an answer");
        assert_eq!(
            from_hot.status,
            status,
            "{body}: {}",
            String::from_utf8_lossy(&from_hot.body)
        );
        assert_eq!(comparable(&from_hot), comparable(&from_hyper), "{body}");
    }
    // The call went through: the agent's output is the answer's one DataPart.
    hot.write_all(a2a_request(CAPABILITY, &send(serde_json::json!({ "order_id": "a-2" })), false, true).as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut hot, &mut hot_input).await.expect("an answer").json();
    assert_eq!(answer["id"], "c-1", "{answer}");
    assert!(answer["result"]["message"]["parts"][0]["data"].is_object(), "{answer}");
    assert_eq!(answer["result"]["message"]["metadata"]["request_id"], "m-1", "{answer}");
}

/// One gRPC call's answer over HTTP/2: the HTTP status, the content type,
/// the body (messages, framed) and `grpc-status` / `grpc-message` (in
/// trailers, or in the headers of a trailers-only answer).
#[derive(Debug, PartialEq)]
struct GrpcAnswer {
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
    grpc_status: Option<String>,
    grpc_message: Option<String>,
}

/// Sends `body` (DATA frames as given, then `trailers` if any) as a gRPC
/// request to `path` on `client`'s HTTP/2 connection, with `headers`.
async fn grpc_call(
    client: &h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    headers: &[(&str, &str)],
    frames: Vec<Vec<u8>>,
    trailers: Option<http::HeaderMap>,
) -> GrpcAnswer {
    let mut request = http::Request::post(format!("http://router{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut client = client.clone().ready().await.expect("the connection takes a stream");
    let (answer, mut sending) = client.send_request(request.body(()).unwrap(), false).unwrap();
    let last = frames.len().saturating_sub(1);
    for (at, frame) in frames.into_iter().enumerate() {
        sending
            .send_data(frame.into(), at == last && trailers.is_none())
            .unwrap();
    }
    if let Some(trailers) = trailers {
        sending.send_trailers(trailers).unwrap();
    }
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("an answer came")
        .expect("an answer");
    let (head, mut received) = answer.into_parts();
    let header = |map: &http::HeaderMap, name: &str| {
        map.get(name)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
    };
    let mut body = Vec::new();
    while let Some(data) = received.data().await {
        let data = data.expect("the body");
        let _ = received.flow_control().release_capacity(data.len());
        body.extend_from_slice(&data);
    }
    let trailers = received.trailers().await.expect("the trailers").unwrap_or_default();
    let status_of = |name| header(&trailers, name).or_else(|| header(&head.headers, name));
    GrpcAnswer {
        status: head.status.as_u16(),
        content_type: header(&head.headers, "content-type"),
        body,
        grpc_status: status_of("grpc-status"),
        grpc_message: status_of("grpc-message"),
    }
}

/// `message` as one gRPC message (uncompressed).
fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_send_message_on_the_http2_hot_route_is_answered_as_tonic_answers_it() {
    use agent_reach_proto::a2a as pb;
    use prost::Message as _;

    let (cluster, _agent) = cluster_with_an_agent().await;
    let tcp = TcpStream::connect(cluster.router_addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.expect("an HTTP/2 connection");
    let driven = tokio::spawn(connection);

    let send = |tenant: &str, data: Value| {
        let data = prost_types::Value {
            kind: Some(prost_types::value::Kind::StructValue(prost_types::Struct {
                fields: data
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(key, value)| {
                        let value = prost_types::Value {
                            kind: Some(prost_types::value::Kind::StringValue(
                                value.as_str().unwrap().to_string(),
                            )),
                        };
                        (key.clone(), value)
                    })
                    .collect(),
            })),
        };
        pb::SendMessageRequest {
            tenant: tenant.to_string(),
            message: Some(pb::Message {
                message_id: "m-1".to_string(),
                role: pb::Role::User as i32,
                parts: vec![pb::Part {
                    content: Some(pb::part::Content::Data(data)),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let plain = send(CAPABILITY, serde_json::json!({ "order_id": "g-1" }));
    let bearer = format!("Bearer {}", token(CALLER));
    let authorized: &[(&str, &str)] = &[("authorization", bearer.as_str())];
    let other_version = [("authorization", bearer.as_str()), ("a2a-version", "9.9")];
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-extra", http::HeaderValue::from_static("1"));
    let oversized = send(CAPABILITY, serde_json::json!({ "order_id": "x".repeat(2 << 20) }));
    let mut compressed = grpc_frame(&plain);
    compressed[0] = 1;
    let mut truncated = grpc_frame(&plain);
    truncated.pop();
    // (name, headers, DATA frames, trailers, the gRPC status expected)
    type Case<'a> = (
        &'a str,
        &'a [(&'a str, &'a str)],
        Vec<Vec<u8>>,
        Option<http::HeaderMap>,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        ("plain", authorized, vec![grpc_frame(&plain)], None, "0"),
        (
            "split in frames",
            authorized,
            grpc_frame(&plain).chunks(7).map(<[u8]>::to_vec).collect(),
            None,
            "0",
        ),
        ("no token", &[], vec![grpc_frame(&plain)], None, "16"),
        (
            "an agent that is none",
            authorized,
            vec![grpc_frame(&send(
                "no.such.agent",
                serde_json::json!({ "order_id": "g-1" }),
            ))],
            None,
            "5",
        ),
        (
            "a payload the schema refuses",
            authorized,
            vec![grpc_frame(&send(CAPABILITY, serde_json::json!({ "other": "g-1" })))],
            None,
            "3",
        ),
        (
            "a version not spoken",
            &other_version,
            vec![grpc_frame(&plain)],
            None,
            "9",
        ),
        (
            "not protobuf",
            authorized,
            vec![grpc_frame(b"\xff\xff\xff\xff")],
            None,
            "13",
        ),
        (
            "two messages",
            authorized,
            vec![grpc_frame(&plain), grpc_frame(&plain)],
            None,
            "0",
        ),
        (
            "compressed without grpc-encoding",
            authorized,
            vec![compressed],
            None,
            "13",
        ),
        ("a truncated message", authorized, vec![truncated], None, "13"),
        ("no message", authorized, vec![Vec::new()], None, "13"),
        (
            "over the body limit",
            authorized,
            vec![grpc_frame(&oversized)],
            None,
            "11",
        ),
        (
            "with trailers",
            authorized,
            vec![grpc_frame(&plain)],
            Some(trailers),
            "0",
        ),
    ];
    // A query keeps a request off the hot route: the axum routes and tonic answer it.
    let tonic_path = format!("{}?via=tonic", agent_reach_a2a::SEND_MESSAGE_PATH);
    let comparable = |mut answer: GrpcAnswer| {
        if answer.grpc_status.as_deref() == Some("0") {
            // The answer's message names itself, its call and its context afresh each time.
            let message = pb::SendMessageResponse::decode(&answer.body[5..]).expect("a SendMessageResponse");
            let Some(pb::send_message_response::Payload::Message(mut message)) = message.payload else {
                panic!("an answer message: {message:?}");
            };
            message.message_id.clear();
            message.context_id.clear();
            message.metadata = None;
            answer.body = message.encode_to_vec();
        }
        answer
    };
    for (name, headers, frames, trailers, expected) in cases {
        let hot = grpc_call(
            &client,
            agent_reach_a2a::SEND_MESSAGE_PATH,
            headers,
            frames.clone(),
            trailers.clone(),
        )
        .await;
        let by_tonic = grpc_call(&client, &tonic_path, headers, frames, trailers).await;
        assert_eq!(hot.grpc_status.as_deref(), Some(expected), "{name}: {hot:?}");
        assert_eq!(comparable(hot), comparable(by_tonic), "{name}");
    }
    // The two paths compared are two: the plain call is the hot route's, its `?via=tonic` twin not.
    let parts_of = |path: &str| {
        http::Request::post(path)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", bearer.as_str())
            .body(())
            .unwrap()
            .into_parts()
            .0
    };
    assert!(agent_reach_a2a::is_plain_grpc_send(&parts_of(
        agent_reach_a2a::SEND_MESSAGE_PATH
    )));
    assert!(!agent_reach_a2a::is_plain_grpc_send(&parts_of(&tonic_path)));
    driven.abort();
}
