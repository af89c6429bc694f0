//! Server-sent events (W3C `text/event-stream`) over a byte stream split anywhere (SPEC L9).
//! Event payloads are JSON decoded by [`crate::json::parse_lossy`].
//!
//! [`SseParser`] is bytes in, [`SseEvent`]s out: a body may be cut mid-line, mid-UTF-8
//! character or between the `\r` and `\n` of a CRLF, and the events come out the same. Every
//! byte is looked at a constant number of times, so a long stream is never rescanned per chunk.

use std::borrow::Cow;

/// One dispatched server-sent event (W3C "dispatch the event").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SseEvent {
    /// The last `event:` field of the event; `None` when absent or empty (W3C type `message`).
    pub event: Option<String>,
    /// The event's `data:` lines joined with `\n`, without a trailing newline.
    pub data: String,
}

/// Incremental W3C server-sent-events parser (SPEC L9).
///
/// Lines end with LF, CR or CRLF (a CRLF split across two [`feed`](SseParser::feed) calls counts
/// once). A blank line dispatches the pending event; `:` lines are comments; `data:` lines are
/// joined with `\n`; one space after the colon is stripped; `id:`, `retry:` and unknown fields
/// are ignored; an event without a `data:` line is not dispatched. A leading UTF-8 BOM is
/// skipped. Bytes are buffered until their line is complete, then decoded as UTF-8 (invalid
/// sequences become U+FFFD).
///
/// Memory: one partial line plus one pending event, each at most [`MAX_SSE_LINE_BYTES`] (a
/// provider streaming an endless line, or endless `data:` lines without a blank line, is cut
/// off: the parser then reports [`SseParser::overflowed`] and ignores the rest of the stream).
/// Time: linear in the bytes fed.
pub(crate) struct SseParser {
    /// Cap on the partial line and on the pending event's data, in bytes.
    cap: usize,
    /// The cap was crossed: everything after is ignored (sticky until `finish`).
    overflowed: bool,
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The last byte fed was a CR that ended a line: a LF at the start of the next feed belongs
    /// to it.
    skip_lf: bool,
    /// At least one line was processed (the BOM is only skipped on the first line).
    seen_first_line: bool,
    /// The pending event's type.
    event: Option<String>,
    /// The pending event's data lines, each followed by `\n`.
    data: String,
    /// The pending event has at least one `data:` line.
    has_data: bool,
    /// The pending event has at least one `event:` or `data:` line.
    has_fields: bool,
}

/// Longest SSE line, and longest event data, a provider stream may send, in bytes (16 MiB, the
/// same bound as an MCP stdout line, T6). The biggest legitimate events (a Responses
/// `response.completed` carrying the whole output) stay far below it.
pub(crate) const MAX_SSE_LINE_BYTES: usize = 16 * 1024 * 1024;

impl Default for SseParser {
    fn default() -> Self {
        SseParser::with_cap(MAX_SSE_LINE_BYTES)
    }
}

impl std::fmt::Debug for SseParser {
    // Lengths, not contents (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SseParser(partial line {} B, pending data {} B)",
            self.line.len(),
            self.data.len()
        )
    }
}

impl SseParser {
    /// A parser at the start of a stream, capped at [`MAX_SSE_LINE_BYTES`].
    #[cfg(test)]
    #[must_use]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A parser whose line and event-data cap is `cap` bytes (tests use small caps).
    #[must_use]
    pub(crate) fn with_cap(cap: usize) -> Self {
        SseParser {
            cap,
            overflowed: false,
            line: Vec::new(),
            skip_lf: false,
            seen_first_line: false,
            event: None,
            data: String::new(),
            has_data: false,
            has_fields: false,
        }
    }

    /// Whether a line or an event's data grew past the cap. The stream is then unusable: the
    /// parser dropped the pending line and event and ignores all later bytes until
    /// [`finish`](SseParser::finish).
    #[must_use]
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    #[cfg(test)]
    /// Bytes held for the partial line and the pending event (at most twice the cap).
    #[must_use]
    pub(crate) fn held_bytes(&self) -> usize {
        self.line.len().saturating_add(self.data.len())
    }

    /// The cap was crossed: drop what is held and ignore the rest.
    fn overflow(&mut self) {
        self.overflowed = true;
        self.line = Vec::new();
        self.data = String::new();
        self.event = None;
        self.has_data = false;
        self.has_fields = false;
    }

    /// Feed the next bytes of the stream (any split); complete events are appended to `out` in
    /// stream order. Nothing happens once [`overflowed`](SseParser::overflowed).
    pub(crate) fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        if self.overflowed {
            return;
        }
        let mut rest = bytes;
        if self.skip_lf && !rest.is_empty() {
            self.skip_lf = false;
            rest = rest.strip_prefix(b"\n").unwrap_or(rest);
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (head, tail) = rest.split_at(pos);
            let Some((&terminator, after)) = tail.split_first() else {
                break;
            };
            if self.line.len().saturating_add(head.len()) > self.cap {
                self.overflow();
                return;
            }
            if self.line.is_empty() {
                self.process_line(head, out);
            } else {
                self.line.extend_from_slice(head);
                let line = std::mem::take(&mut self.line);
                self.process_line(&line, out);
                // Keep the allocation for the next partial line.
                self.line = line;
                self.line.clear();
            }
            rest = after;
            if terminator == b'\r' {
                match rest.split_first() {
                    Some((&b'\n', tail)) => rest = tail,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            if self.overflowed {
                return;
            }
        }
        if self.line.len().saturating_add(rest.len()) > self.cap {
            self.overflow();
            return;
        }
        self.line.extend_from_slice(rest);
    }

    /// The stream ended (EOF). A last line without a terminator is processed, and a pending
    /// event that has `data:` lines is dispatched even without its blank line (our leniency:
    /// the provider decoder decides whether the stream was complete). Returns `true` when there
    /// was an unterminated line or an event without its closing blank line. The parser is reset
    /// to the start-of-stream state, except after an overflow: then nothing is dispatched, the
    /// result is `true` and the parser stays [`overflowed`](SseParser::overflowed).
    pub(crate) fn finish(&mut self, out: &mut Vec<SseEvent>) -> bool {
        let mut partial = false;
        if !self.line.is_empty() {
            partial = true;
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out);
        }
        if self.overflowed {
            return true;
        }
        if self.has_fields {
            partial = true;
        }
        self.dispatch(out);
        *self = Self::with_cap(self.cap);
        partial
    }

    /// Interpret one complete line (without its terminator).
    fn process_line(&mut self, raw: &[u8], out: &mut Vec<SseEvent>) {
        let decoded: Cow<'_, str> = String::from_utf8_lossy(raw);
        let mut line: &str = &decoded;
        if !self.seen_first_line {
            self.seen_first_line = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => {
                self.event = (!value.is_empty()).then(|| value.to_owned());
                self.has_fields = true;
            }
            "data" => {
                if self.data.len().saturating_add(value.len()) >= self.cap {
                    self.overflow();
                    return;
                }
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
                self.has_fields = true;
            }
            // `id`, `retry` and unknown fields: nothing we use.
            _ => {}
        }
    }

    /// W3C "dispatch the event": emit it if it has data, then reset the pending event.
    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        self.has_fields = false;
        if !self.has_data {
            return;
        }
        self.has_data = false;
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the `\n` after the last data line
        out.push(SseEvent { event, data });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> (Vec<SseEvent>, bool) {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out);
        }
        let partial = parser.finish(&mut out);
        (out, partial)
    }

    /// Whole, every 2-chunk split and byte by byte all give the same events (SPEC L9).
    fn parse_every_split(body: &[u8]) -> (Vec<SseEvent>, bool) {
        let whole = parse_all(&[body]);
        for i in 0..=body.len() {
            let (a, b) = body.split_at(i);
            assert_eq!(parse_all(&[a, b]), whole, "split at {i}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse_all(&bytes), whole, "byte by byte");
        whole
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn c52_an_endless_sse_line_is_cut_off_without_buffering() {
        let mut p = SseParser::with_cap(1024);
        let mut out = Vec::new();
        p.feed(b"data: {\"ok\":1}\n\ndata: ", &mut out);
        assert_eq!(out.len(), 1);
        for _ in 0..100 {
            p.feed(&[b'a'; 1000], &mut out);
            assert!(p.held_bytes() <= 1024);
        }
        assert!(p.overflowed());
        assert_eq!(p.held_bytes(), 0);
        p.feed(b"\n\ndata: {}\n\n", &mut out);
        assert_eq!(out.len(), 1, "nothing after the overflow");
        assert!(p.finish(&mut out));
        assert!(p.overflowed());
    }

    #[test]
    fn c52_endless_data_lines_without_a_blank_line_are_cut_off() {
        let mut p = SseParser::with_cap(1024);
        let mut out = Vec::new();
        for _ in 0..1000 {
            p.feed(b"data: 0123456789\n", &mut out);
            assert!(p.held_bytes() <= 2048);
        }
        assert!(p.overflowed() && out.is_empty());
    }

    #[test]
    fn c52_a_line_of_exactly_the_cap_is_parsed() {
        let value = "v".repeat(1024 - 6 - 1);
        let body = format!("data: {value}\n\n");
        let (events, _) = {
            let mut p = SseParser::with_cap(1024);
            let mut out = Vec::new();
            p.feed(body.as_bytes(), &mut out);
            assert!(!p.overflowed());
            (out, p.finish(&mut Vec::new()))
        };
        assert_eq!(events, vec![ev(None, &value)]);
    }

    #[test]
    fn l9_lf_crlf_and_cr_line_endings_give_the_same_events_at_every_split() {
        let lf = "event: a\ndata: one\n\ndata: two\ndata: three\n\n";
        let expected = vec![ev(Some("a"), "one"), ev(None, "two\nthree")];
        for body in [
            lf.to_owned(),
            lf.replace('\n', "\r\n"),
            lf.replace('\n', "\r"),
        ] {
            assert_eq!(
                parse_every_split(body.as_bytes()),
                (expected.clone(), false),
                "{body:?}"
            );
        }
    }

    #[test]
    fn l9_mixed_line_endings_and_crlf_split_between_cr_and_lf_count_once() {
        let body = b"data: a\r\n\r\ndata: b\r\rdata: c\n\r\n";
        assert_eq!(
            parse_every_split(body),
            (vec![ev(None, "a"), ev(None, "b"), ev(None, "c")], false)
        );
        let (events, _) = parse_all(&[b"data: x\r", b"\n", b"\r", b"\n"]);
        assert_eq!(events, vec![ev(None, "x")]);
    }

    #[test]
    fn l9_comments_id_retry_and_unknown_fields_are_ignored() {
        let body = b": keep-alive\nid: 7\nretry: 1000\nfoo: bar\ndata: x\n\n:\n\n";
        assert_eq!(parse_every_split(body), (vec![ev(None, "x")], false));
    }

    #[test]
    fn l9_only_one_leading_space_is_stripped_and_a_bare_field_name_is_an_empty_value() {
        let body = b"data:  two spaces\n\ndata:none\n\ndata\n\ndata:\ndata\n\n";
        let expected = vec![
            ev(None, " two spaces"),
            ev(None, "none"),
            ev(None, ""),
            ev(None, "\n"),
        ];
        assert_eq!(parse_every_split(body), (expected, false));
    }

    #[test]
    fn l9_an_event_without_data_is_not_dispatched_and_its_type_does_not_leak() {
        let body = b"event: ping\n\ndata: x\n\nevent: \ndata: y\n\n";
        assert_eq!(
            parse_every_split(body),
            (vec![ev(None, "x"), ev(None, "y")], false)
        );
    }

    #[test]
    fn l9_a_chunk_split_inside_a_multibyte_character_decodes_whole() {
        let body = "data: héllo 🐝\n\n".as_bytes();
        assert_eq!(parse_every_split(body), (vec![ev(None, "héllo 🐝")], false));
    }

    #[test]
    fn l9_invalid_utf8_becomes_replacement_character() {
        let (events, _) = parse_all(&[b"data: a\xffb\n\n"]);
        assert_eq!(events, vec![ev(None, "a\u{fffd}b")]);
    }

    #[test]
    fn l9_a_leading_bom_is_skipped_only_at_stream_start() {
        let body = "\u{feff}data: a\n\ndata: \u{feff}b\n\n".as_bytes();
        assert_eq!(
            parse_every_split(body),
            (vec![ev(None, "a"), ev(None, "\u{feff}b")], false)
        );
    }

    #[test]
    fn l9_finish_dispatches_a_pending_event_and_reports_it_as_partial() {
        assert_eq!(
            parse_every_split(b"data: a\n\ndata: b"),
            (vec![ev(None, "a"), ev(None, "b")], true)
        );
        assert_eq!(
            parse_every_split(b"data: a\n\ndata: b\n"),
            (vec![ev(None, "a"), ev(None, "b")], true)
        );
        assert_eq!(
            parse_every_split(b"data: a\n\nevent: x\n"),
            (vec![ev(None, "a")], true)
        );
        assert_eq!(
            parse_every_split(b"data: a\n\n: comment"),
            (vec![ev(None, "a")], true)
        );
        assert_eq!(
            parse_every_split(b"data: a\r\n\r\n"),
            (vec![ev(None, "a")], false)
        );
        assert_eq!(parse_every_split(b""), (vec![], false));
    }

    #[test]
    fn l9_finish_resets_the_parser_for_a_new_stream() {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        parser.feed(b"data: a\r", &mut out);
        assert!(parser.finish(&mut out));
        parser.feed(b"\ndata: b\n\n", &mut out);
        assert!(!parser.finish(&mut out));
        assert_eq!(out, vec![ev(None, "a"), ev(None, "b")]);
    }

    #[test]
    fn l9_a_megabyte_line_fed_byte_by_byte_is_parsed_in_linear_time() {
        let payload = "x".repeat(1 << 20);
        let body = format!("data: {payload}\n\n");
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for byte in body.as_bytes().chunks(1) {
            parser.feed(byte, &mut out);
        }
        assert!(!parser.finish(&mut out));
        assert_eq!(out.len(), 1);
        assert_eq!(out.first().map(|e| e.data.len()), Some(1 << 20));
    }

    #[test]
    fn c52_a_line_of_the_cap_is_parsed_and_one_byte_more_overflows_however_it_arrives() {
        let at_cap = b"data: 0123456789"; // 16 bytes
        let over = b"data: 0123456789a"; // 17 bytes
        // Terminated in the chunk that carries it.
        let mut p = SseParser::with_cap(16);
        let mut out = Vec::new();
        p.feed(&[at_cap.as_slice(), b"\n\n"].concat(), &mut out);
        assert!(!p.overflowed());
        assert_eq!(out, vec![ev(None, "0123456789")]);
        p.feed(&[over.as_slice(), b"\n\n"].concat(), &mut out);
        assert!(p.overflowed(), "a terminated line over the cap");
        assert_eq!(out.len(), 1);
        // Held as a partial line, terminated by the next chunk.
        let mut p = SseParser::with_cap(16);
        let mut out = Vec::new();
        p.feed(at_cap, &mut out);
        assert!(!p.overflowed(), "a partial line of exactly the cap is held");
        assert_eq!(p.held_bytes(), 16);
        p.feed(b"\n\n", &mut out);
        assert_eq!(out, vec![ev(None, "0123456789")]);
        p.feed(over, &mut out);
        assert!(p.overflowed(), "a partial line over the cap");
        assert_eq!(p.held_bytes(), 0);
    }

    #[test]
    fn l9_the_parser_shows_its_sizes_not_its_contents() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(b"data: secret\ndata: ab", &mut out);
        assert_eq!(
            format!("{p:?}"),
            "SseParser(partial line 8 B, pending data 7 B)"
        );
    }
}
