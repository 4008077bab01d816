//! One HTTP/1.1 exchange with an agent: the request written, the answer's head
//! parsed, its body read whole (`Content-Length`, chunked, or to the close).

use super::*;

/// `uri`'s authority and whether it is `https://`.
pub(crate) fn target(uri: &http::Uri) -> Result<(&str, bool), String> {
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
pub(crate) fn encode_request(
    authority: &str,
    path: &str,
    body: &[u8],
    headers: &ForwardHeaders<'_>,
    extra: &[u8],
) -> Vec<u8> {
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
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) framing: Framing,
    pub(crate) keep_alive: bool,
    /// `content-type: text/event-stream`.
    pub(crate) events: bool,
}

/// Writes `request` and reads the answer's head into `input` (empty; the
/// connection's buffer), leaving what follows the head in `input`.
pub(crate) async fn send_and_read_head(
    stream: &mut Stream,
    input: &mut BytesMut,
    request: &[u8],
) -> Result<Head, Exchange> {
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
pub(crate) async fn exchange(
    mut stream: Stream,
    mut input: BytesMut,
    request: &[u8],
) -> (Exchange, Option<(Stream, BytesMut)>) {
    match send_and_read_head(&mut stream, &mut input, request).await {
        Ok(head) => read_whole(stream, input, head).await,
        Err(failed) => (failed, None),
    }
}

/// Reads the body of an answer whose `head` was read.
pub(crate) async fn read_whole(
    mut stream: Stream,
    mut input: BytesMut,
    head: Head,
) -> (Exchange, Option<(Stream, BytesMut)>) {
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
pub(crate) enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Status, body framing and whether the connection stays open, from a parsed head.
pub(crate) fn head_of(response: &httparse::Response<'_, '_>) -> Result<Head, String> {
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

pub(crate) async fn fill(stream: &mut Stream, input: &mut BytesMut) -> Result<(), String> {
    match stream.read_buf(input).await {
        Ok(0) => Err("the answer was cut short".to_string()),
        Ok(_) => Ok(()),
        Err(error) => Err(format!("reading the answer failed: {error}")),
    }
}

pub(crate) async fn read_exactly(stream: &mut Stream, input: &mut BytesMut, length: usize) -> Result<Bytes, String> {
    if input.capacity() < length {
        input.reserve(length - input.len());
    }
    while input.len() < length {
        fill(stream, input).await?;
    }
    Ok(input.split_to(length).freeze())
}

pub(crate) async fn read_to_close(stream: &mut Stream, input: &mut BytesMut) -> Result<Bytes, String> {
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
pub(crate) async fn read_chunked(stream: &mut Stream, input: &mut BytesMut) -> Result<Bytes, String> {
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
pub(crate) async fn read_line(stream: &mut Stream, input: &mut BytesMut) -> Result<Vec<u8>, String> {
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
