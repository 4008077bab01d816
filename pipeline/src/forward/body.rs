//! Streamed answers: a body read as the agent writes it, decoded from its
//! framing, its connection pooled again only after a clean end.

use super::*;

/// What opening a streamed answer came to ([`Forwarder::open_stream`]).
pub(crate) enum Opened {
    /// 2xx with `content-type: text/event-stream`: the body, read as it arrives.
    Events(AgentBody),
    /// Any other answer (read whole) or a failure, as [`Forwarder::send`] reports it.
    Other(AttemptResult),
}

/// Where a streamed answer's connection goes back once read to its end.
pub(crate) struct PoolSlot {
    pub(crate) forwarder: usize,
    pub(crate) idle_per_instance: usize,
    pub(crate) authority: String,
}

/// Where the reading of a streamed body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyState {
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
    pub(crate) connection: Option<(Stream, BytesMut)>,
    pub(crate) body: BodyState,
    /// The agent keeps the connection open after the answer.
    pub(crate) reusable: bool,
    pub(crate) slot: PoolSlot,
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
    pub(crate) fn finish(&mut self) {
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
pub(crate) fn decode(
    state: &mut BodyState,
    input: &mut BytesMut,
    out: &mut BytesMut,
    most: usize,
) -> Result<bool, String> {
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
pub(crate) fn chunk_size_of(line: &[u8]) -> Option<usize> {
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
