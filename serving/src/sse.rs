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
    pub name: Cow<'static, str>,
    /// Its data: read from `raw` only when asked ([`Event::data`]), as a
    /// relayed event needs only its bytes.
    data: Data,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Data {
    /// In the `data:` lines of `raw`; whether they join to something.
    InRaw { empty: bool },
    /// Given whole (an event the router made of a JSON answer).
    Given(String),
}

impl Event {
    /// A `message` event carrying `data` (written as `data:` lines).
    pub fn message(data: String) -> Self {
        Self {
            raw: self::data(&data),
            name: Cow::Borrowed("message"),
            data: Data::Given(data),
        }
    }

    /// The `data:` lines joined by `\n` (empty when none).
    pub fn data(&self) -> Cow<'_, str> {
        match &self.data {
            Data::Given(data) => Cow::Borrowed(data),
            Data::InRaw { empty: true } => Cow::Borrowed(""),
            Data::InRaw { empty: false } => {
                let text = String::from_utf8_lossy(&self.raw);
                let mut joined: Option<String> = None;
                for_fields(text.as_bytes(), |field, value| {
                    if field == b"data" {
                        // Cut from valid UTF-8 at ASCII bytes: still valid.
                        let value = std::str::from_utf8(value).unwrap_or_default();
                        match &mut joined {
                            Some(joined) => {
                                joined.push('\n');
                                joined.push_str(value);
                            }
                            None => joined = Some(value.to_string()),
                        }
                    }
                });
                Cow::Owned(joined.unwrap_or_default())
            }
        }
    }

    /// Whether the event carries nothing a caller would see (comments and
    /// keep-alives only): relayed, but not counted as an event.
    pub fn is_comment_only(&self) -> bool {
        let empty = match &self.data {
            Data::InRaw { empty } => *empty,
            Data::Given(data) => data.is_empty(),
        };
        empty && self.name == "message"
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
    /// How far from its start the buffer is known to hold no `\r` (the
    /// first `\r`'s place, or where the check stopped): events there end at
    /// the first `\n\n`, which one pass of `memchr` finds ([`lf_event_end`]).
    lf_only: usize,
}

/// Whole events a caller sees as they are, their bytes as the agent wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub raw: Bytes,
    /// How many (≥ 1).
    pub events: u64,
}

/// What [`EventSplitter::next_cut`] cut off.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut {
    Run(Run),
    /// One event of another kind (comment-only, or `event: error`).
    One(Event),
}

/// Whether an event is one a caller sees as it is: named anything but
/// `error`, with data (a comment-only event and `event: error` are not).
fn plain(raw: &[u8]) -> bool {
    match outline(raw) {
        (Some(name), _) => name != b"error",
        (None, data_empty) => !data_empty,
    }
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

    /// Drops a `\n` that completes the `\r\n` an event ended on (`after_cr`
    /// is set only with the buffer emptied, so it is the next byte), and
    /// extends what is known to hold no `\r`.
    fn prepare(&mut self) {
        if self.after_cr && !self.buffer.is_empty() {
            if self.buffer[0] == b'\n' {
                self.cut_off(1);
            }
            self.after_cr = false;
        }
        if self.lf_only < self.buffer.len() {
            let from = self.lf_only;
            self.lf_only = memchr::memchr(b'\r', &self.buffer[from..]).map_or(self.buffer.len(), |at| from + at);
        }
    }

    /// Removes the buffer's first `count` bytes.
    fn cut_off(&mut self, count: usize) -> BytesMut {
        self.lf_only = self.lf_only.saturating_sub(count);
        self.buffer.split_to(count)
    }

    /// The end of the first whole event at `start`, scanning from `from`
    /// (both places in the buffer).
    fn scan(&self, start: usize, from: usize) -> Scan {
        lf_event_end(&self.buffer[start..], from, self.lf_only.saturating_sub(start))
            .unwrap_or_else(|| event_end(&self.buffer[start..], from))
    }

    /// Cuts off the next whole event, if one is complete; refuses an event
    /// begun and grown past [`MAX_EVENT_BYTES`] without an end.
    pub fn next_event(&mut self) -> Result<Option<Event>, TooLarge> {
        self.prepare();
        match self.scan(0, self.scanned) {
            Scan::End { end, on_cr } => {
                let raw = self.cut_off(end).freeze();
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

    /// Cuts off every whole event ready that a caller sees as it is (a
    /// run of them, contiguous as the agent wrote them: relaying them is one
    /// copy, not one per event); or, when the first ready event is not one of
    /// those (a comment-only one, or `event: error`), that event alone.
    /// `None`: no whole event yet.
    pub fn next_cut(&mut self) -> Result<Option<Cut>, TooLarge> {
        self.prepare();
        let (mut run_end, mut events, mut on_cr) = (0usize, 0u64, false);
        let mut from = self.scanned;
        loop {
            match self.scan(run_end, from) {
                Scan::End { end, on_cr: cr } => {
                    let raw = &self.buffer[run_end..run_end + end];
                    let lf_only = run_end + end <= self.lf_only;
                    if !((lf_only && one_data_line(raw)) || plain(raw)) {
                        if events == 0 {
                            return self.next_event().map(|event| event.map(Cut::One));
                        }
                        break;
                    }
                    run_end += end;
                    events += 1;
                    on_cr = cr;
                    from = 0;
                }
                Scan::More { line_start } => {
                    if events == 0 {
                        self.scanned = line_start;
                        if self.buffer.len() > MAX_EVENT_BYTES {
                            return Err(TooLarge);
                        }
                        return Ok(None);
                    }
                    // Where the rest's scan resumes, once the run is cut off.
                    self.scanned = line_start;
                    let raw = self.cut_off(run_end).freeze();
                    self.after_cr = on_cr && self.buffer.is_empty();
                    return Ok(Some(Cut::Run(Run { raw, events })));
                }
            }
        }
        let raw = self.cut_off(run_end).freeze();
        self.scanned = 0;
        Ok(Some(Cut::Run(Run { raw, events })))
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

/// [`event_end`] where the first `lf_only` bytes of `buffer` hold no `\r`
/// (every line ends in `\n`): an event ends at the first `\n\n` from the
/// line break before `from`, found in one pass of `memchr` over the lines
/// instead of one call per line. `None` when the answer depends on bytes
/// past `lf_only` (`event_end` decides).
fn lf_event_end(buffer: &[u8], from: usize, lf_only: usize) -> Option<Scan> {
    // A blank line at the buffer's start ends nothing: the search starts at
    // the break before `from` (a line start, so a `\n` when `from > 0`).
    let start = from.saturating_sub(1);
    let clean = &buffer[..lf_only.min(buffer.len())];
    if start < clean.len() {
        let mut breaks = memchr::memchr_iter(b'\n', &clean[start..]);
        if let Some(end) = breaks.find_map(|at| (clean.get(start + at + 1) == Some(&b'\n')).then_some(start + at + 2)) {
            return Some(Scan::End { end, on_cr: false });
        }
    }
    if clean.len() < buffer.len() {
        return None;
    }
    let line_start = memchr::memrchr(b'\n', &buffer[from.min(buffer.len())..]).map_or(from, |at| from + at + 1);
    Some(Scan::More { line_start })
}

/// Whether `raw` (a whole event without `\r`, so ending in `\n\n`) is one `data:` line
/// with something in it: a plain event ([`plain`] agrees), the usual shape
/// of a token stream's events, told without reading its fields.
fn one_data_line(raw: &[u8]) -> bool {
    let Some(rest) = raw.strip_prefix(b"data:") else {
        return false;
    };
    let value = rest.strip_prefix(b" ").unwrap_or(rest);
    // One line break inside: the line's own, then the blank line's.
    value.len() > 2 && memchr::memchr(b'\n', value) == Some(value.len() - 2) && value.ends_with(b"\n\n")
}

/// Calls `each` with every field line's name and value (after the one
/// optional space), skipping comments and blank lines.
fn for_fields<'a>(mut rest: &'a [u8], mut each: impl FnMut(&'a [u8], &'a [u8])) {
    while !rest.is_empty() {
        let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
        let line = &rest[..end];
        rest = &rest[(end + 1).min(rest.len())..];
        if line.is_empty() || line[0] == b':' {
            continue;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        each(field, value);
    }
}

/// An event's name (`None`: the format's default, `message`) and whether its
/// data is empty, read from its bytes without copying them.
fn outline(raw: &[u8]) -> (Option<&[u8]>, bool) {
    let mut name: Option<&[u8]> = None;
    // The joined data is empty only with no `data:` line, or one empty one.
    let (mut data_lines, mut data_bytes) = (0usize, 0usize);
    for_fields(raw, |field, value| match field {
        // The last `event:` line names the event; an empty one or `message` is the default.
        b"event" => name = Some(value).filter(|value| !value.is_empty() && *value != b"message"),
        b"data" => {
            data_lines += 1;
            data_bytes += value.len();
        }
        _ => {}
    });
    (name, data_lines <= 1 && data_bytes == 0)
}

/// The event read from its bytes ([`outline`]; its data is joined only when asked).
fn parse(raw: Bytes) -> Event {
    let (name, empty) = outline(&raw);
    let name = match name {
        None => Cow::Borrowed("message"),
        Some(name) => Cow::Owned(String::from_utf8_lossy(name).into_owned()),
    };
    Event {
        name,
        data: Data::InRaw { empty },
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
        assert_eq!(events[0].data(), "{\"a\":1}");
        assert_eq!(&events[0].raw[..], b"event: tok\ndata: {\"a\":1}\n\n");
        assert_eq!(
            (events[1].name.as_ref(), events[1].data().as_ref()),
            ("message", "x\ny")
        );
        assert!(events[2].is_comment_only());
        // `\r` then `\r` is a blank line whether or not a `\n` follows; that
        // `\n` is then the end of the same line, not an empty line of its own.
        let events = splitter.push(b"\r").unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data(), "z");
        assert_eq!(splitter.pending(), 0);
        assert!(splitter.push(b"\ndata: w\n\n").unwrap()[0].data() == "w");
        assert_eq!(splitter.pending(), 0);
        // A lone `\r` ending a non-blank line waits for more.
        assert!(splitter.push(b"data: v\r").unwrap().is_empty());
        assert_eq!(splitter.push(b"\n\n").unwrap()[0].data(), "v");
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
                    .map(|event| (event.name.clone(), event.data().into_owned()))
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
        assert_eq!(events[0].data(), "{\"a\":\n1}");
        assert_eq!(events[1].data(), "two");
        assert!(accepts_events(Some(b"application/json, text/event-stream;q=0.9")));
        assert!(accepts_events(Some(b"Text/Event-Stream")));
        assert!(!accepts_events(Some(b"application/json")));
        assert!(!accepts_events(None));
    }

    /// Runs cut the same events as one at a time, in any pieces, and stop
    /// before a comment-only event or `event: error`, which come alone.
    #[test]
    fn runs_hold_the_plain_events_and_stop_before_the_others() {
        let text: &[u8] = b"data: 1\n\nevent: a\r\ndata: 2\r\n\r\n: ping\n\ndata: 3\r\rdata: 4\n\nevent: error\ndata: {}\n\ndata: 5\n\n";
        let one_by_one: Vec<Event> = EventSplitter::default().push(text).unwrap();
        for step in 1..=text.len() {
            let mut splitter = EventSplitter::default();
            let mut cuts = Vec::new();
            for piece in text.chunks(step) {
                splitter.input().extend_from_slice(piece);
                while let Some(cut) = splitter.next_cut().unwrap() {
                    cuts.push(cut);
                }
            }
            assert_eq!(splitter.pending(), 0, "pieces of {step}");
            // Back to events: the same ones, in the same order.
            let mut events = Vec::new();
            for cut in &cuts {
                match cut {
                    Cut::Run(Run { raw, events: count }) => {
                        let inside = EventSplitter::default().push(raw).unwrap();
                        assert_eq!(inside.len() as u64, *count, "pieces of {step}");
                        assert!(inside.iter().all(|event| plain(&event.raw)), "pieces of {step}");
                        events.extend(inside);
                    }
                    Cut::One(event) => {
                        assert!(event.is_comment_only() || event.name == "error", "pieces of {step}");
                        events.push(event.clone());
                    }
                }
            }
            let fields = |events: &[Event]| {
                events
                    .iter()
                    .map(|event| (event.name.clone(), event.data().into_owned()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(fields(&events), fields(&one_by_one), "pieces of {step}");
        }
        // Whole: two runs around the comment and the error.
        let mut splitter = EventSplitter::default();
        splitter.input().extend_from_slice(text);
        let mut kinds = Vec::new();
        while let Some(cut) = splitter.next_cut().unwrap() {
            kinds.push(match cut {
                Cut::Run(run) => format!("run {}", run.events),
                Cut::One(event) if event.is_comment_only() => "comment".to_string(),
                Cut::One(event) => event.name.into_owned(),
            });
        }
        assert_eq!(kinds, ["run 2", "comment", "run 2", "error", "run 1"]);
    }

    /// The one-pass scan for `\n`-only bytes ([`lf_event_end`],
    /// [`one_data_line`]) cuts exactly what the line-by-line scan cuts:
    /// generated streams of every kind of line, with and without `\r`, fed in
    /// pieces of every size, against events cut by [`event_end`] and
    /// [`plain`] alone.
    #[test]
    fn the_one_pass_scan_cuts_what_the_line_scan_cuts() {
        const LINES: [&[u8]; 14] = [
            b"data: {\"t\":1}\n",
            b"data: x\n",
            b"data:\n",
            b"data: \n",
            b"data:y\n",
            b"event: error\n",
            b"event: tok\n",
            b"event: message\n",
            b": ping\n",
            b"id: 7\n",
            b"\n",
            b"\n",
            b"data: a\r\n",
            b"data: b\rdata: c\r",
        ];
        // The reference: whole events by `event_end` alone, each one's plainness by `plain`.
        fn reference(text: &[u8]) -> Vec<(Vec<u8>, bool)> {
            let mut events = Vec::new();
            let mut rest = text.to_vec();
            let mut after_cr = false;
            loop {
                if after_cr && rest.first() == Some(&b'\n') {
                    rest.remove(0);
                }
                match event_end(&rest, 0) {
                    Scan::End { end, on_cr } => {
                        let raw: Vec<u8> = rest.drain(..end).collect();
                        after_cr = on_cr && rest.is_empty();
                        events.push((raw.clone(), plain(&raw)));
                    }
                    Scan::More { .. } => return events,
                }
            }
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..300 {
            // Half the cases without `\r` (the one-pass scan), half with.
            let kinds = if case % 2 == 0 { 12 } else { LINES.len() as u64 };
            let mut text = Vec::new();
            for _ in 0..(next() % 24) {
                text.extend_from_slice(LINES[(next() % kinds) as usize]);
            }
            let expected = reference(&text);
            for step in [1, 2, 3, 5, 8, 13, text.len().max(1)] {
                let mut one_by_one = EventSplitter::default();
                let mut runs = EventSplitter::default();
                let (mut events, mut from_runs) = (Vec::new(), Vec::new());
                for piece in text.chunks(step) {
                    one_by_one.input().extend_from_slice(piece);
                    while let Some(event) = one_by_one.next_event().unwrap() {
                        events.push(event.raw.to_vec());
                    }
                    runs.input().extend_from_slice(piece);
                    while let Some(cut) = runs.next_cut().unwrap() {
                        match cut {
                            Cut::Run(run) => {
                                let inside = reference(&run.raw);
                                assert_eq!(inside.len() as u64, run.events, "case {case}, pieces of {step}");
                                from_runs.extend(inside.into_iter().map(|(raw, plain)| (raw, plain, true)));
                            }
                            Cut::One(event) => from_runs.push((event.raw.to_vec(), plain(&event.raw), false)),
                        }
                    }
                }
                // Pieces may only move a `\n` that follows a `\r` ending an event (see above);
                // without `\r` everything is the same, byte for byte.
                if case % 2 == 0 {
                    let raws: Vec<Vec<u8>> = expected.iter().map(|(raw, _)| raw.clone()).collect();
                    assert_eq!(events, raws, "case {case}, pieces of {step}");
                }
                assert_eq!(events.len(), expected.len(), "case {case}, pieces of {step}");
                assert_eq!(from_runs.len(), expected.len(), "case {case}, pieces of {step}");
                for ((_, plain, in_run), (_, expected_plain)) in from_runs.iter().zip(&expected) {
                    assert_eq!(plain, expected_plain, "case {case}, pieces of {step}");
                    // Runs hold exactly the plain events.
                    assert_eq!(in_run, plain, "case {case}, pieces of {step}");
                }
            }
        }
    }

    #[test]
    fn a_run_is_cut_before_an_endless_event_and_the_event_then_refused() {
        let mut splitter = EventSplitter::default();
        splitter.input().extend_from_slice(b"data: 1\n\n");
        splitter.input().extend_from_slice(&vec![b'x'; MAX_EVENT_BYTES + 1]);
        assert!(matches!(splitter.next_cut(), Ok(Some(Cut::Run(Run { events: 1, .. })))));
        assert_eq!(splitter.next_cut(), Err(TooLarge));
    }
}
