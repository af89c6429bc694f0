//! The bounded line reader for a child's stderr (SPEC M1, P2; case C52): lines of at most a cap
//! are forwarded, the rest of a longer line is skipped without being stored, so an endless line
//! costs a fixed buffer, never memory in proportion to its length.

use crate::runtime::{InputSender, ReadPipe};
use buzz_agent_core::{Input, ProcKey};

/// Bytes per read of a child's stderr.
const READ_BUF: usize = 8 * 1024;

/// Splits a byte stream into lines of at most `cap` bytes. A line that reaches the cap without a
/// newline is cut there and returned; the bytes after it, up to and including the next newline,
/// are skipped (never stored). Holds at most `cap` bytes whatever it is fed.
#[derive(Debug)]
pub struct CappedLines {
    /// The line being collected (without its newline), `len() <= cap`.
    line: Vec<u8>,
    cap: usize,
    /// `line` was returned by the last call: clear it before collecting the next.
    returned: bool,
    /// Inside the rest of a cut line: discard until the next newline.
    skipping: bool,
}

/// One line out of [`CappedLines`], as bytes without its newline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// The line's bytes (at most the cap).
    pub bytes: &'a [u8],
    /// `true` when the line was longer than the cap and this is its start.
    pub cut: bool,
}

impl CappedLines {
    /// A splitter for lines of at most `cap` bytes (a `cap` of 0 counts as 1).
    #[must_use]
    pub fn new(cap: usize) -> CappedLines {
        CappedLines {
            line: Vec::new(),
            cap: cap.max(1),
            returned: false,
            skipping: false,
        }
    }

    /// Consumes bytes from the front of `input` until one line is complete and returns it, or
    /// returns `None` once `input` is used up (a partial line is kept for the next call). Call it
    /// again with the rest of `input` until `None`.
    pub fn next_line<'s>(&'s mut self, input: &mut &[u8]) -> Option<Line<'s>> {
        if self.returned {
            self.line.clear();
            self.returned = false;
        }
        if self.skipping {
            let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                *input = &[];
                return None;
            };
            *input = &input[nl + 1..];
            self.skipping = false;
        }
        let room = self.cap - self.line.len();
        // One byte past the room: a newline right at the cap ends a whole line.
        let window = &input[..input.len().min(room + 1)];
        if let Some(nl) = window.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&window[..nl]);
            *input = &input[nl + 1..];
            self.returned = true;
            return Some(Line {
                bytes: &self.line,
                cut: false,
            });
        }
        let take = window.len().min(room);
        self.line.extend_from_slice(&input[..take]);
        *input = &input[take..];
        if self.line.len() < self.cap {
            return None;
        }
        // The cap is reached without a newline: cut here, skip the rest of the line.
        self.skipping = true;
        self.returned = true;
        Some(Line {
            bytes: &self.line,
            cut: true,
        })
    }

    /// At end of input: the unterminated last line, if any of its bytes are left (the start of
    /// a cut line was already returned).
    pub fn finish(&mut self) -> Option<Line<'_>> {
        if self.returned || self.skipping || self.line.is_empty() {
            self.line.clear();
            self.returned = false;
            return None;
        }
        self.returned = true;
        Some(Line {
            bytes: &self.line,
            cut: false,
        })
    }
}

/// The text of a stderr line: lossy UTF-8 (SPEC L9), trailing `\r` removed; a cut line loses
/// the incomplete character the cut may have split.
#[must_use]
pub fn line_text(line: &Line<'_>) -> String {
    let mut bytes = line.bytes;
    if line.cut
        && let Err(e) = std::str::from_utf8(bytes)
        && e.error_len().is_none()
    {
        bytes = &bytes[..e.valid_up_to()];
    }
    String::from_utf8_lossy(bytes)
        .trim_end_matches(['\n', '\r'])
        .to_string()
}

/// Reads `pipe` (a child's stderr) to its end and sends every line as
/// [`Input::McpStderrLine`], at most [`buzz_agent_core::io::MAX_STDERR_LINE_BYTES`] bytes each.
/// Memory: one read buffer and one line buffer, whatever the child writes.
pub async fn forward_stderr(mut pipe: impl ReadPipe, proc: ProcKey, tx: InputSender) {
    let mut lines = CappedLines::new(buzz_agent_core::io::MAX_STDERR_LINE_BYTES);
    let mut buf = vec![0u8; READ_BUF];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut input = &buf[..n];
        while let Some(line) = lines.next_line(&mut input) {
            let line = line_text(&line);
            if tx.send(Input::McpStderrLine { proc, line }).await.is_err() {
                return;
            }
        }
    }
    if let Some(line) = lines.finish() {
        let line = line_text(&line);
        let _ = tx.send(Input::McpStderrLine { proc, line }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` one after the other; returns the lines as text (with `✂` after a cut
    /// line), then the unterminated rest.
    fn split(cap: usize, chunks: &[&[u8]]) -> Vec<String> {
        let mut lines = CappedLines::new(cap);
        let mut out = Vec::new();
        for chunk in chunks {
            let mut input = *chunk;
            while let Some(line) = lines.next_line(&mut input) {
                let mark = if line.cut { "✂" } else { "" };
                out.push(format!("{}{mark}", line_text(&line)));
            }
            assert!(input.is_empty(), "every byte consumed");
            assert!(lines.line.len() <= cap, "never holds more than the cap");
        }
        if let Some(line) = lines.finish() {
            out.push(format!("{}<eof>", line_text(&line)));
        }
        out
    }

    #[test]
    fn lines_split_anywhere_come_out_whole() {
        assert_eq!(
            split(64, &[b"ab\ncd\r\n", b"e", b"f\n\n"]),
            ["ab", "cd", "ef", ""]
        );
        assert_eq!(split(64, &[b"a", b"b", b"\nc"]), ["ab", "c<eof>"]);
    }

    #[test]
    fn a_line_of_exactly_the_cap_is_whole_and_one_byte_more_is_cut() {
        assert_eq!(split(4, &[b"abcd\nef\n"]), ["abcd", "ef"]);
        assert_eq!(split(4, &[b"abcde\nfg\n"]), ["abcd✂", "fg"]);
    }

    #[test]
    fn the_rest_of_an_endless_line_is_skipped_until_the_newline() {
        let mut chunks: Vec<&[u8]> = vec![b"xxxx"; 10_000];
        chunks.push(b"xx\nnext\n");
        assert_eq!(split(16, &chunks), ["xxxxxxxxxxxxxxxx✂", "next"]);
    }

    #[test]
    fn a_cut_line_at_eof_is_not_repeated_and_an_empty_rest_is_nothing() {
        assert_eq!(split(4, &[b"abcdefgh"]), ["abcd✂"]);
        assert_eq!(split(4, &[b"ab\n"]), ["ab"]);
        assert_eq!(split(4, &[b""]), Vec::<String>::new());
    }

    #[test]
    fn a_cut_through_a_character_drops_its_first_bytes_and_bad_bytes_are_replaced() {
        // "é" is two bytes; the cap cuts after its first.
        assert_eq!(split(3, &["abé\n".as_bytes()]), ["ab✂"]);
        assert_eq!(split(8, &[b"a\xffb\n"]), ["a\u{fffd}b"]);
    }
}
