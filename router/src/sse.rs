//! Server-sent events (the WHATWG `text/event-stream` format) as the router
//! reads them from agents and writes them to callers: [`EventSplitter`] cuts
//! an agent's byte stream into whole events as they complete (each kept as
//! the bytes the agent wrote, so relaying one is a copy, never a re-encode),
//! and [`event`] writes one.
//!
//! Only what relaying needs is parsed: the event's name (`event:`) and its
//! data (`data:` lines joined by `\n`). Comments and `id:`/`retry:` fields are
//! relayed untouched.

use std::borrow::Cow;

use bytes::{Buf, Bytes, BytesMut};

/// Largest event the router relays (a larger one ends the stream: an agent
/// that never writes a blank line would otherwise grow the buffer forever).
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// One whole event as the agent wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's bytes including the blank line that ended it.
    pub raw: Bytes,
    /// The `event:` field; `message` when absent (the format's default).
    pub name: Cow<'static, str>,
    /// The `data:` lines joined by `\n` (empty when none).
    pub data: String,
}

impl Event {
    /// Whether the event carries nothing a caller would see (comments and
    /// keep-alives only): relayed, but not counted as an event.
    pub fn is_comment_only(&self) -> bool {
        self.data.is_empty() && self.name == "message"
    }
}

/// Cuts a byte stream into events; feed it bytes as they arrive.
#[derive(Default)]
pub struct EventSplitter {
    buffer: BytesMut,
    /// The last event ended on a `\r` at the buffer's end: a `\n` starting
    /// what comes next is the rest of that line break, not a line of its own.
    after_cr: bool,
    /// Where the scan for the next event's end resumes: the start of the
    /// first line not yet complete (the lines before it are whole and not
    /// blank), so an event arriving in many reads is scanned once.
    scanned: usize,
}

/// The stream broke the format beyond relaying.
#[derive(Debug, PartialEq, Eq)]
pub struct TooLarge;

impl EventSplitter {
    /// Adds `chunk` and returns every event it completed, in order.
    #[cfg(test)]
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLarge> {
        self.input().extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(event) = self.next_event()? {
            events.push(event);
        }
        Ok(events)
    }

    /// Where new bytes go (appended), before [`EventSplitter::next_event`].
    pub fn input(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// Cuts off the next whole event, if one is complete; refuses an event
    /// begun and grown past [`MAX_EVENT_BYTES`] without an end.
    pub fn next_event(&mut self) -> Result<Option<Event>, TooLarge> {
        if self.after_cr && !self.buffer.is_empty() {
            // `after_cr` is set only with the buffer emptied, so this is the next byte.
            if self.buffer[0] == b'\n' {
                self.buffer.advance(1);
            }
            self.after_cr = false;
        }
        match event_end(&self.buffer, self.scanned) {
            Scan::End { end, on_cr } => {
                let raw = self.buffer.split_to(end).freeze();
                self.after_cr = on_cr && self.buffer.is_empty();
                self.scanned = 0;
                Ok(Some(parse(raw)))
            }
            Scan::More { line_start } => {
                self.scanned = line_start;
                if self.buffer.len() > MAX_EVENT_BYTES {
                    return Err(TooLarge);
                }
                Ok(None)
            }
        }
    }

    /// Bytes of an event begun and not finished (the stream ended inside it).
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}

/// Where the scan for an event's end got to.
enum Scan {
    /// The first whole event ends (exclusive) at `end`, the blank line after
    /// it included; `on_cr`: on a `\r` at the buffer's end (a `\n` may follow).
    End { end: usize, on_cr: bool },
    /// No whole event yet; the incomplete line starts at `line_start`.
    More { line_start: usize },
}

/// Finds the end of the first whole event in `buffer` (the blank line after
/// it, in any of the format's line endings: `\n`, `\r\n`, `\r`), scanning
/// from `from`, the start of a line.
fn event_end(buffer: &[u8], from: usize) -> Scan {
    let mut line_start = from;
    // From one line break to the next (memchr: a word at a time, not a byte).
    while let Some(found) = memchr::memchr2(b'\n', b'\r', &buffer[line_start..]) {
        let at = line_start + found;
        let width = match buffer[at] {
            b'\r' if buffer.get(at + 1) == Some(&b'\n') => 2,
            // A `\r` at the buffer's end ending a blank line ends the event
            // either way; otherwise it may be the first half of `\r\n`: wait.
            b'\r' if at + 1 == buffer.len() => {
                return if at == line_start && at > 0 {
                    Scan::End {
                        end: at + 1,
                        on_cr: true,
                    }
                } else {
                    Scan::More { line_start }
                };
            }
            _ => 1,
        };
        if at == line_start && at > 0 {
            return Scan::End {
                end: at + width,
                on_cr: false,
            };
        }
        line_start = at + width;
    }
    Scan::More { line_start }
}

fn parse(raw: Bytes) -> Event {
    // Valid UTF-8 (the common case) is read in place; otherwise as a lossy copy.
    let text = match std::str::from_utf8(&raw) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(&raw),
    };
    let mut name: Option<&str> = None;
    let mut data: Option<String> = None;
    let mut rest = text.as_ref();
    while !rest.is_empty() {
        // Line breaks are ASCII: the cut is at a character boundary.
        let end = memchr::memchr2(b'\n', b'\r', rest.as_bytes()).unwrap_or(rest.len());
        let line = &rest[..end];
        rest = &rest[(end + 1).min(rest.len())..];
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => name = Some(value),
            "data" => match &mut data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => data = Some(value.to_string()),
            },
            _ => {}
        }
    }
    let name = match name {
        None | Some("") | Some("message") => Cow::Borrowed("message"),
        Some(name) => Cow::Owned(name.to_string()),
    };
    Event {
        name,
        data: data.unwrap_or_default(),
        raw,
    }
}

/// One event as the router writes it: `event: NAME`, one `data:` line per
/// line of `data`, a blank line.
pub fn event(name: &str, data: &str) -> Bytes {
    let mut out = Vec::with_capacity(name.len() + data.len() + 24);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.trim_end_matches('\r').as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// An event with data only (the default name, `message`).
pub fn data(data: &str) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 10);
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.trim_end_matches('\r').as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// Whether an `Accept` header asks for server-sent events.
pub fn accepts_events(accept: Option<&[u8]>) -> bool {
    accept.is_some_and(|value| {
        value.split(|&byte| byte == b',').any(|item| {
            let media = item.split(|&byte| byte == b';').next().unwrap_or_default();
            media.trim_ascii().eq_ignore_ascii_case(b"text/event-stream")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_as_they_complete_in_every_line_ending() {
        let mut splitter = EventSplitter::default();
        assert!(splitter.push(b"event: tok\ndata: {\"a\"").unwrap().is_empty());
        let events = splitter
            .push(b":1}\n\ndata: x\r\ndata: y\r\n\r\n: ping\n\ndata: z\r")
            .unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].name, "tok");
        assert_eq!(events[0].data, "{\"a\":1}");
        assert_eq!(&events[0].raw[..], b"event: tok\ndata: {\"a\":1}\n\n");
        assert_eq!((events[1].name.as_ref(), events[1].data.as_str()), ("message", "x\ny"));
        assert!(events[2].is_comment_only());
        // `\r` then `\r` is a blank line whether or not a `\n` follows; that
        // `\n` is then the end of the same line, not an empty line of its own.
        let events = splitter.push(b"\r").unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data, "z");
        assert_eq!(splitter.pending(), 0);
        assert!(splitter.push(b"\ndata: w\n\n").unwrap()[0].data == "w");
        assert_eq!(splitter.pending(), 0);
        // A lone `\r` ending a non-blank line waits for more.
        assert!(splitter.push(b"data: v\r").unwrap().is_empty());
        assert_eq!(splitter.push(b"\n\n").unwrap()[0].data, "v");
    }

    /// The scan resumes where it stopped: bytes fed in any pieces cut the same events.
    #[test]
    fn events_fed_in_any_pieces_are_cut_alike() {
        let text: &[u8] =
            b": hi\n\nevent: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata: x\r\rdata: y\n\nid: 3\ndata: {\"k\":\"v\"}\n\n";
        let whole: Vec<Event> = EventSplitter::default().push(text).unwrap();
        assert_eq!(whole.len(), 5);
        for step in 1..text.len() {
            let mut splitter = EventSplitter::default();
            let mut events = Vec::new();
            for piece in text.chunks(step) {
                events.extend(splitter.push(piece).unwrap());
            }
            // The same events; only a `\r\n` ending one that was split after its
            // `\r` loses the `\n` (the event is relayed at its `\r`, not held back).
            let fields = |events: &[Event]| {
                events
                    .iter()
                    .map(|event| (event.name.clone(), event.data.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(fields(&events), fields(&whole), "pieces of {step}");
            assert_eq!(splitter.pending(), 0, "pieces of {step}");
        }
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut splitter = EventSplitter::default();
        let chunk = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert_eq!(splitter.push(&chunk), Err(TooLarge));
    }

    #[test]
    fn written_events_read_back_and_accept_is_recognised() {
        let mut splitter = EventSplitter::default();
        let written = [event("result", "{\"a\":\n1}"), data("two")].concat();
        let events = splitter.push(&written).unwrap();
        assert_eq!(events[0].name, "result");
        assert_eq!(events[0].data, "{\"a\":\n1}");
        assert_eq!(events[1].data, "two");
        assert!(accepts_events(Some(b"application/json, text/event-stream;q=0.9")));
        assert!(accepts_events(Some(b"Text/Event-Stream")));
        assert!(!accepts_events(Some(b"application/json")));
        assert!(!accepts_events(None));
    }
}
