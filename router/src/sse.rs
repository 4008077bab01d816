//! Server-sent events (the WHATWG `text/event-stream` format) as the router
//! reads them from agents and writes them to callers: [`EventSplitter`] cuts
//! an agent's byte stream into whole events as they complete (each kept as
//! the bytes the agent wrote, so relaying one is a copy, never a re-encode),
//! and [`event`] writes one.
//!
//! Only what relaying needs is parsed: the event's name (`event:`) and its
//! data (`data:` lines joined by `\n`). Comments and `id:`/`retry:` fields are
//! relayed untouched.

use bytes::{Bytes, BytesMut};

/// Largest event the router relays (a larger one ends the stream: an agent
/// that never writes a blank line would otherwise grow the buffer forever).
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// One whole event as the agent wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's bytes including the blank line that ended it.
    pub raw: Bytes,
    /// The `event:` field; `message` when absent (the format's default).
    pub name: String,
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

/// Cuts a byte stream into events; feed it chunks as they arrive.
#[derive(Default)]
pub struct EventSplitter {
    buffer: BytesMut,
    /// The last event ended on a `\r` at a chunk's end: a `\n` starting the
    /// next chunk is the rest of that line break, not a line of its own.
    after_cr: bool,
}

/// The stream broke the format beyond relaying.
#[derive(Debug, PartialEq, Eq)]
pub struct TooLarge;

impl EventSplitter {
    /// Adds `chunk` and returns every event it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLarge> {
        let chunk = match (self.after_cr, chunk.first()) {
            (true, Some(b'\n')) => &chunk[1..],
            _ => chunk,
        };
        if !chunk.is_empty() {
            self.after_cr = false;
        }
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some((end, on_cr)) = event_end(&self.buffer) {
            let raw = self.buffer.split_to(end).freeze();
            events.push(parse(raw));
            self.after_cr = on_cr && self.buffer.is_empty();
        }
        if self.buffer.len() > MAX_EVENT_BYTES {
            return Err(TooLarge);
        }
        Ok(events)
    }

    /// Bytes of an event begun and not finished (the stream ended inside it).
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}

/// The end (exclusive) of the first whole event in `buffer`: the blank line
/// after it, in any of the format's line endings (`\n`, `\r\n`, `\r`); and
/// whether it ended on a `\r` at the buffer's end (a `\n` may follow).
fn event_end(buffer: &[u8]) -> Option<(usize, bool)> {
    let mut at = 0;
    let mut line_start = 0;
    while at < buffer.len() {
        let (is_break, width) = match buffer[at] {
            b'\n' => (true, 1),
            b'\r' if buffer.get(at + 1) == Some(&b'\n') => (true, 2),
            // A `\r` at the buffer's end ending a blank line ends the event
            // either way; otherwise it may be the first half of `\r\n`: wait.
            b'\r' if at + 1 == buffer.len() => {
                return (at == line_start && at > 0).then_some((at + 1, true));
            }
            b'\r' => (true, 1),
            _ => (false, 1),
        };
        if is_break {
            if at == line_start && at > 0 {
                return Some((at + width, false));
            }
            line_start = at + width;
        }
        at += width;
    }
    None
}

fn parse(raw: Bytes) -> Event {
    let text = String::from_utf8_lossy(&raw);
    let mut name = None;
    let mut data: Option<String> = None;
    for line in text.split(['\n', '\r']).filter(|line| !line.is_empty()) {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => name = Some(value.to_string()),
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
    Event {
        raw,
        name: name
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "message".to_string()),
        data: data.unwrap_or_default(),
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
        assert_eq!((events[1].name.as_str(), events[1].data.as_str()), ("message", "x\ny"));
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
