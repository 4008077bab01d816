//! Answers written: a whole answer in one write (head, date, body), a streamed one chunked
//! as it comes, every frame ready at a write in that write.

use super::*;

/// Writes `answer` as an HTTP/1.1 answer into `output` (status line, the
/// handler's headers, `date`, `content-length`, body); `None` if its body
/// cannot be read (it is always a complete buffer here).
pub(crate) async fn encode_response(answer: Answer, output: &mut Vec<u8>) -> Option<&[u8]> {
    let response = match answer {
        Answer::Json { status, body } => {
            status_line(status, output);
            output.extend_from_slice(b"content-type: application/json\r\n");
            return Some(finish_answer(&body, output));
        }
        Answer::Typed {
            status,
            content_type,
            body,
        } => {
            status_line(status, output);
            header_line(b"content-type", content_type.as_bytes(), output);
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
pub(crate) fn header_line(name: &[u8], value: &[u8], output: &mut Vec<u8>) {
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
pub(crate) const STREAM_BATCH_BYTES: usize = 64 * 1024;

/// Writes a streamed answer (a body of unknown length; `head` writes its
/// status line and headers) with chunked framing
/// as its frames come: every frame ready when the last write finished goes
/// out in the next one, as one chunk (a proxy relaying what one read
/// brought, as nginx does), so a frame waits for nothing but the write
/// before it. While it
/// waits for the body, the connection is watched: a caller that closes it
/// ends the answer, and dropping the body cancels whatever produces it (as
/// hyper notices a caller that went away). `false`: the connection is done.
pub(crate) async fn write_streamed<S: Stream>(
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
pub(crate) fn chunk_size(length: usize, line: &mut [u8; SIZE_LINE_ROOM]) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = ((usize::BITS - length.leading_zeros()).div_ceil(4).max(1)) as usize;
    for at in 0..digits {
        line[digits - 1 - at] = HEX[(length >> (at * 4)) & 0xf];
    }
    line[digits..digits + 2].copy_from_slice(b"\r\n");
    digits + 2
}

/// What [`gather`] found.
pub(crate) enum Gathered {
    /// Frames appended to the output (up to [`STREAM_BATCH_BYTES`]).
    More,
    /// The body ended; its last frames and the last chunk are appended.
    End,
    /// The body failed: the answer cannot be finished.
    Failed,
}

/// Room left before a chunk's data for its size line (the hex digits of a
/// `usize` and CRLF), filled in once the chunk's length is known.
pub(crate) const SIZE_LINE_ROOM: usize = 18;

/// Appends every frame `body` has ready (at most `most_frames`) to `output`
/// as one chunk (as nginx relays what one read brought: a client then parses
/// one chunk, not one per frame); `Pending` only when none was ready (and
/// `output` is as it was). The chunk's data is copied once: its size line
/// goes into room left before it, and what `output` held before (the head,
/// on the first write) moves up to the line, so the bytes to write start at
/// `output[*skip..]`.
pub(crate) fn gather(
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
pub(crate) fn status_line(status: http::StatusCode, output: &mut Vec<u8>) {
    output.clear();
    output.extend_from_slice(b"HTTP/1.1 ");
    output.extend_from_slice(status.as_str().as_bytes());
    output.push(b' ');
    output.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    output.extend_from_slice(b"\r\n");
}

/// Ends the head (`date`, `content-length`) and appends `body`.
pub(crate) fn finish_answer<'a>(body: &[u8], output: &'a mut Vec<u8>) -> &'a [u8] {
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
pub(crate) fn with_date(write: impl FnOnce(&[u8])) {
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
