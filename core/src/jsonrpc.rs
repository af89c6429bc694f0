//! JSON-RPC 2.0 over newline-delimited JSON (SPEC T1–T7), shared by ACP (the client on our
//! stdin/stdout) and MCP (each server's stdio).
//!
//! Three pure pieces:
//! - [`LineBuffer`]: bytes in any split → [`LineEvent`]s (T1 framing, T3 line cap, T7 EOF).
//! - [`parse_message`]: one line → [`Message`] or [`ParseError`] (T4, T5).
//! - `encode_*`: compact single-line frames ending in `\n` (T1).
//!
//! What each side does with a [`ParseError`] (answer with -32700/-32600 on ACP, log and ignore
//! on MCP, T6) is decided by the caller.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

/// A peer's request id (T5): a JSON number or string, echoed so the peer reads back what it
/// sent. Strings and integers (within `i64`/`u64`) are echoed verbatim (`"7"` stays `"7"`,
/// `-5` stays `-5`); any other number is read as the exact IEEE-754 double (serde_json's
/// `float_roundtrip`) and echoed in its shortest form, which every JSON parser reads back as
/// that same double (`1.0` stays `1.0`, `1e2` becomes `100.0`, a 45-digit id becomes
/// `3.3333337333333335e44`). Serializes untagged, as the bare number or string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RpcId {
    /// A numeric id (integer or float, as written).
    Num(Number),
    /// A string id.
    Str(String),
}

impl RpcId {
    /// The id as a JSON value (a number or a string).
    #[must_use]
    pub fn to_value(&self) -> Value {
        match self {
            RpcId::Num(n) => Value::Number(n.clone()),
            RpcId::Str(s) => Value::String(s.clone()),
        }
    }

    /// Reads an id from a JSON value: numbers and strings only (`null`, booleans, arrays and
    /// objects → `None`).
    #[must_use]
    pub fn from_value(v: &Value) -> Option<RpcId> {
        match v {
            Value::Number(n) => Some(RpcId::Num(n.clone())),
            Value::String(s) => Some(RpcId::Str(s.clone())),
            Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
        }
    }
}

/// Which of our outgoing request ids (always `u64` integers, C12) a response's `id` can
/// stand for: an exact non-negative integer (`7`), a canonical decimal string (`"7"`; no sign,
/// blanks or leading zeros) or an integral float (`7.0`, exact up to 2^53). `None` for
/// anything else: `null`, negatives, `1.5`, `"x"`, `"07"`, booleans, arrays, objects.
///
/// The caller gives an exact match priority and accepts a converted one only while that id is
/// still pending (C12); [`exact_our_id`] tells the two apart.
#[must_use]
pub fn match_our_id(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                return Some(u);
            }
            if n.is_f64() {
                let f = n.as_f64()?;
                // 2^53: beyond it, integral floats no longer identify one integer.
                const EXACT_LIMIT: f64 = 9_007_199_254_740_992.0;
                if f.fract() == 0.0 && (0.0..=EXACT_LIMIT).contains(&f) {
                    // Exact: f is integral and within u64 (and f64's exact integer) range.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    return Some(f as u64);
                }
            }
            None
        }
        Value::String(s) => {
            let canonical = !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && (s.len() == 1 || !s.starts_with('0'));
            if canonical { s.parse().ok() } else { None }
        }
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Our id if `v` is exactly the JSON integer we sent (no type drift, C12), else `None`.
#[must_use]
pub fn exact_our_id(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::Null | Value::Bool(_) | Value::String(_) | Value::Array(_) | Value::Object(_) => {
            None
        }
    }
}

/// One event of a [`LineBuffer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineEvent {
    /// A complete non-blank line: without its `\n`, one trailing `\r` and a leading UTF-8 BOM
    /// (T1). At most `max_line_bytes` bytes.
    Line(Vec<u8>),
    /// A line longer than `max_line_bytes` (T3), discarded without being stored. Emitted once
    /// per such line:
    /// - by [`LineBuffer::new`] as soon as the cap is crossed (so a peer that never sends a
    ///   newline is still detected; the MCP side kills such a server, T6), with `id: None`;
    /// - by [`LineBuffer::recovering_ids`] when the line ends (its `\n`, or EOF through
    ///   [`LineBuffer::finish_into`]), with the request id recovered by a constant-memory scan
    ///   of the whole line (T3 amended, C50).
    ///
    /// `bytes` is `max_line_bytes + 1`: the length at which the line was known to be too long
    /// (its full length is never counted, and this keeps the events independent of how input
    /// is split).
    TooLong {
        /// `max_line_bytes + 1`.
        bytes: usize,
        /// The line's top-level `"id"` when it is a number or a string (see [`IdScanner`]);
        /// `None` when absent, `null`, another type, longer than [`MAX_RECOVERED_ID_BYTES`], or
        /// when the buffer does not recover ids.
        id: Option<RpcId>,
    },
}

/// Splits a byte stream into lines (T1, T3, T7), whatever the chunking.
///
/// - Lines end at `\n`. One trailing `\r` and a leading UTF-8 BOM (`EF BB BF`) are removed
///   from every line; lines that are then empty or ASCII-whitespace-only are skipped silently.
/// - The cap counts a line's bytes before its `\n` (a trailing `\r` and a BOM included). A
///   longer line yields one [`LineEvent::TooLong`] and is discarded up to its newline; memory
///   held stays at most `max_line_bytes` bytes (plus the [`IdScanner`]'s
///   [`MAX_RECOVERED_ID_BYTES`] when recovering ids).
/// - Linear time: every input byte is looked at a bounded number of times (each chunk is
///   scanned once for newlines; buffered bytes are never rescanned, except once by the id
///   scanner when their line turns out too long).
#[derive(Debug, Clone)]
pub struct LineBuffer {
    max: usize,
    /// Bytes of the current, unfinished line (never more than `max`).
    partial: Vec<u8>,
    /// True while discarding the rest of a line already known to be too long.
    discarding: bool,
    /// `Some` for [`LineBuffer::recovering_ids`]: the scan of the line being discarded.
    ids: Option<IdScanner>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl LineBuffer {
    /// A buffer with a cap of `max_line_bytes` bytes per line that reports an over-long line as
    /// soon as the cap is crossed, without its id (the MCP side: 16 MiB, T6).
    #[must_use]
    pub fn new(max_line_bytes: usize) -> LineBuffer {
        LineBuffer {
            max: max_line_bytes,
            partial: Vec::new(),
            discarding: false,
            ids: None,
        }
    }

    /// A buffer with a cap of `max_line_bytes` bytes per line that reports an over-long line
    /// when it ends, with the request id recovered from it (the ACP side: T3 amended, C50,
    /// `Config::max_line_bytes`). The id is found by a streaming scan of the whole line in
    /// constant memory, wherever `"id"` sits among the top-level members.
    #[must_use]
    pub fn recovering_ids(max_line_bytes: usize) -> LineBuffer {
        LineBuffer {
            ids: Some(IdScanner::new()),
            ..LineBuffer::new(max_line_bytes)
        }
    }

    /// Feeds `chunk` (any size, split anywhere) and appends the events it completes to `out`,
    /// in stream order.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<LineEvent>) {
        let mut rest = chunk;
        while !rest.is_empty() {
            match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    let (head, tail) = rest.split_at(i);
                    if !self.discarding && self.partial.is_empty() && head.len() <= self.max {
                        // Fast path: the whole line is inside this chunk; copy it once.
                        emit_line(head, out);
                    } else {
                        self.append(head, out);
                        if self.discarding {
                            self.end_discarded_line(out);
                        } else {
                            let line = std::mem::take(&mut self.partial);
                            emit_line(&line, out);
                        }
                    }
                    self.discarding = false;
                    rest = tail.get(1..).unwrap_or(&[]);
                }
                None => {
                    self.append(rest, out);
                    rest = &[];
                }
            }
        }
    }

    /// End of stream (T7): forgets any unfinished line and returns its length in bytes so the
    /// caller can log that it was dropped. `None` when nothing was pending, when the pending
    /// bytes were blank (after BOM removal), or when the line was too long (already reported,
    /// or, for [`LineBuffer::recovering_ids`], dropped unreported: use
    /// [`LineBuffer::finish_into`] to have it reported). The buffer is empty afterwards and may
    /// be reused.
    pub fn finish(&mut self) -> Option<usize> {
        let partial = std::mem::take(&mut self.partial);
        let was_discarding = std::mem::replace(&mut self.discarding, false);
        if let Some(scan) = &mut self.ids {
            *scan = IdScanner::new();
        }
        let content = partial.strip_prefix(BOM).unwrap_or(&partial);
        if was_discarding || content.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(partial.len())
        }
    }

    /// [`LineBuffer::finish`], but an over-long line cut by the end of the stream that a
    /// [`LineBuffer::recovering_ids`] buffer has not reported yet is reported now as
    /// [`LineEvent::TooLong`] (with the id found so far), so its request is still answered.
    pub fn finish_into(&mut self, out: &mut Vec<LineEvent>) -> Option<usize> {
        if self.discarding && self.ids.is_some() {
            self.end_discarded_line(out);
        }
        self.finish()
    }

    /// Bytes currently held for an unfinished line (at most `max_line_bytes`).
    #[must_use]
    pub fn pending_bytes(&self) -> usize {
        self.partial.len()
    }

    /// Adds bytes of the unfinished line, switching to discarding when the cap is crossed.
    fn append(&mut self, bytes: &[u8], out: &mut Vec<LineEvent>) {
        if self.discarding {
            if let Some(scan) = &mut self.ids {
                scan.feed(bytes);
            }
            return;
        }
        if self.partial.len().saturating_add(bytes.len()) > self.max {
            let held = std::mem::take(&mut self.partial);
            self.discarding = true;
            match &mut self.ids {
                Some(scan) => {
                    *scan = IdScanner::new();
                    scan.feed(&held);
                    scan.feed(bytes);
                }
                None => out.push(self.too_long(None)),
            }
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    /// The newline (or EOF) of a discarded line: a recovering buffer reports it now.
    fn end_discarded_line(&mut self, out: &mut Vec<LineEvent>) {
        if let Some(scan) = &mut self.ids {
            let id = std::mem::take(scan).into_id();
            out.push(self.too_long(id));
        }
    }

    fn too_long(&self, id: Option<RpcId>) -> LineEvent {
        LineEvent::TooLong {
            bytes: self.max.saturating_add(1),
            id,
        }
    }
}

/// Emits `line` (without its `\n`) after T1 clean-up, unless it is blank.
fn emit_line(line: &[u8], out: &mut Vec<LineEvent>) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(BOM).unwrap_or(line);
    if !line.iter().all(u8::is_ascii_whitespace) {
        out.push(LineEvent::Line(line.to_vec()));
    }
}

/// Longest `id` value (its JSON text: a number, or a string with its quotes and escapes) that
/// [`IdScanner`] recovers, in bytes. Longer ids are not recovered (the error then carries
/// `id: null`).
pub const MAX_RECOVERED_ID_BYTES: usize = 1024;

/// Where an [`IdScanner`] is in the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ScanPhase {
    /// Before the top-level `{` (whitespace and a BOM are skipped).
    #[default]
    Start,
    /// Inside the top-level object, expecting a member name (or `,` / `}`).
    Key,
    /// After a member name, expecting `:`.
    Colon,
    /// After `:`, expecting the member's value.
    Value,
    /// Inside a member value that is not captured, until `,` or `}` at the top level.
    Skip,
    /// Capturing the digits of a number `id`.
    Number,
    /// The top-level value ended or is not an object: the rest is ignored.
    Done,
}

/// A constant-memory streaming scan of one JSON text for its top-level `"id"` member (T3
/// amended, C50): bytes in any split, at most [`MAX_RECOVERED_ID_BYTES`] held.
///
/// It tracks only what it needs: the nesting depth, whether it is inside a string (and after a
/// `\`), and the name of the current top-level member. A number or string value of a top-level
/// member named exactly `id` (written without escapes) is captured and decoded with
/// `json::parse_bytes_lossy` (invalid UTF-8 and lone surrogates as U+FFFD, L3b, L9);
/// like `serde_json`, the last `"id"` member wins.
/// The text is not validated: a line that is not JSON may still yield an id, which is harmless
/// (the answer is an error either way) and helps a client whose line was cut.
#[derive(Debug, Clone, Default)]
pub struct IdScanner {
    phase: ScanPhase,
    /// Nesting depth of objects and arrays (1 = inside the top-level object).
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The current string is a top-level member name: its first bytes (up to 3) and whether it
    /// could still be exactly `id`.
    key: Option<([u8; 3], usize, bool)>,
    /// The member whose value comes next is `id`.
    value_is_id: bool,
    /// The JSON text of the `id` value being captured (a string with its quotes, or a number).
    capture: Option<Vec<u8>>,
    /// The capture grew past [`MAX_RECOVERED_ID_BYTES`].
    capture_overflow: bool,
    /// The id found so far.
    id: Option<RpcId>,
}

impl IdScanner {
    /// A scanner at the start of a line.
    #[must_use]
    pub fn new() -> IdScanner {
        IdScanner::default()
    }

    /// Scans the next bytes of the line.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.phase == ScanPhase::Done {
                return;
            }
            self.byte(b);
        }
    }

    /// The line's top-level `id` (number or string), if one was found; `None` when absent or
    /// unreadable. A number still being captured when the line ended counts.
    #[must_use]
    pub fn into_id(mut self) -> Option<RpcId> {
        if self.phase == ScanPhase::Number {
            self.end_capture();
        }
        self.id
    }

    fn capture_byte(&mut self, b: u8) {
        if let Some(c) = &mut self.capture {
            if c.len() < MAX_RECOVERED_ID_BYTES {
                c.push(b);
            } else {
                self.capture_overflow = true;
            }
        }
    }

    /// The captured `id` value is complete: decode it (the last `id` member wins).
    fn end_capture(&mut self) {
        let Some(text) = self.capture.take() else {
            return;
        };
        let overflow = std::mem::replace(&mut self.capture_overflow, false);
        self.id = if overflow {
            None
        } else {
            crate::json::parse_bytes_lossy(&text)
                .ok()
                .as_ref()
                .and_then(RpcId::from_value)
        };
        self.phase = ScanPhase::Skip;
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            self.string_byte(b);
            return;
        }
        match self.phase {
            ScanPhase::Start => match b {
                b'{' => {
                    self.depth = 1;
                    self.phase = ScanPhase::Key;
                }
                b' ' | b'\t' | b'\r' | b'\n' | 0xEF | 0xBB | 0xBF => {}
                _ => self.phase = ScanPhase::Done,
            },
            ScanPhase::Key => match b {
                b'"' => {
                    self.in_string = true;
                    self.key = Some(([0; 3], 0, true));
                }
                b'}' => self.phase = ScanPhase::Done,
                _ => {}
            },
            ScanPhase::Colon => {
                if b == b':' {
                    self.phase = ScanPhase::Value;
                }
            }
            ScanPhase::Value => match b {
                b' ' | b'\t' | b'\r' | b'\n' => {}
                b'"' if self.value_is_id => {
                    self.capture = Some(vec![b]);
                    self.in_string = true;
                }
                b'-' | b'0'..=b'9' if self.value_is_id => {
                    self.capture = Some(vec![b]);
                    self.phase = ScanPhase::Number;
                }
                _ => {
                    if self.value_is_id {
                        // `null`, a boolean, an object or an array: not a usable id.
                        self.id = None;
                    }
                    self.phase = ScanPhase::Skip;
                    self.structural(b);
                }
            },
            ScanPhase::Number => {
                if matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    self.capture_byte(b);
                } else {
                    self.end_capture();
                    self.structural(b);
                }
            }
            ScanPhase::Skip => self.structural(b),
            ScanPhase::Done => {}
        }
    }

    /// A byte outside strings while skipping a value: nesting, strings, and the end of the
    /// member (`,` or `}` at the top level).
    fn structural(&mut self, b: u8) {
        match b {
            b'"' => self.in_string = true,
            b'{' | b'[' => self.depth = self.depth.saturating_add(1),
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.phase = ScanPhase::Done;
                }
            }
            b',' if self.depth == 1 => self.phase = ScanPhase::Key,
            _ => {}
        }
    }

    fn string_byte(&mut self, b: u8) {
        let closing = !self.escaped && b == b'"';
        if let Some((buf, len, plain)) = &mut self.key {
            if self.escaped || b == b'\\' {
                *plain = false; // an escaped name is never taken for `id`
            } else if !closing {
                if let Some(slot) = buf.get_mut(*len) {
                    *slot = b;
                }
                *len = len.saturating_add(1);
            }
        } else {
            self.capture_byte(b);
        }
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if closing {
            self.in_string = false;
            if let Some((buf, len, plain)) = self.key.take() {
                self.value_is_id = plain && len == 2 && buf.get(..2) == Some(b"id".as_slice());
                self.phase = ScanPhase::Colon;
            } else if self.capture.is_some() {
                self.end_capture();
            }
        }
    }
}

/// A JSON-RPC 2.0 error object (T4).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The error code, e.g. [`RpcError::METHOD_NOT_FOUND`].
    pub code: i64,
    /// A short human-readable description.
    pub message: String,
    /// Optional structured detail (`data`), omitted from the wire when `None`.
    pub data: Option<Value>,
}

impl RpcError {
    /// -32700: the line is not JSON (T4).
    pub const PARSE_ERROR: i64 = -32700;
    /// -32600: JSON but not a valid JSON-RPC 2.0 request, or a line over the cap (T3, T4).
    pub const INVALID_REQUEST: i64 = -32600;
    /// -32601: unknown request method (T4).
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// -32602: params that do not decode (T4).
    pub const INVALID_PARAMS: i64 = -32602;
    /// -32603: internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// -32000: generic server error (implementation-defined range).
    pub const SERVER_ERROR: i64 = -32000;
    /// -32002: resource not found (e.g. an unknown session).
    pub const RESOURCE_NOT_FOUND: i64 = -32002;

    /// An error with `code` and `message`, without `data`.
    #[must_use]
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The same error with `data` attached.
    #[must_use]
    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    /// The object as JSON: `{"code":…,"message":…[,"data":…]}`.
    #[must_use]
    pub fn to_value(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("code".into(), Value::from(self.code));
        obj.insert("message".into(), Value::String(self.message.clone()));
        if let Some(data) = &self.data {
            obj.insert("data".into(), data.clone());
        }
        Value::Object(obj)
    }

    /// Reads an `error` member leniently, so a malformed error still settles the pending
    /// request instead of leaving it to time out: a missing or non-integer `code` becomes
    /// [`RpcError::INTERNAL_ERROR`], a missing `message` becomes `""` (a string error value
    /// becomes the message), and an `error` that is not an object is kept whole as `data`.
    /// The message is a peer's free text that ends up in logs and model-visible tool results:
    /// it is cut to [`MAX_ERROR_MESSAGE_BYTES`] on a character boundary.
    #[must_use]
    pub fn from_value(v: &Value) -> RpcError {
        match v {
            Value::Object(obj) => {
                let code = obj.get("code").and_then(|c| {
                    c.as_i64().or_else(|| {
                        c.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                            .map(|f| f as i64)
                    })
                });
                let message = match obj.get("message") {
                    Some(Value::String(s)) => cut_message(s),
                    Some(other) => cut_message(&other.to_string()),
                    None => String::new(),
                };
                RpcError {
                    code: code.unwrap_or(RpcError::INTERNAL_ERROR),
                    message,
                    data: obj.get("data").cloned(),
                }
            }
            Value::String(s) => RpcError::new(RpcError::INTERNAL_ERROR, cut_message(s)),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) => {
                RpcError::new(RpcError::INTERNAL_ERROR, "malformed error").with_data(v.clone())
            }
        }
    }
}

/// Longest peer error message kept by [`RpcError::from_value`], in bytes (4 KiB, like a
/// provider's error body, SPEC A3).
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4096;

/// `s` cut to [`MAX_ERROR_MESSAGE_BYTES`] on a character boundary.
fn cut_message(s: &str) -> String {
    let mut end = s.len().min(MAX_ERROR_MESSAGE_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default().to_owned()
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// One decoded JSON-RPC 2.0 message (T4, T5).
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request (`method` and a number or string `id`).
    Request {
        /// The peer's id, to echo verbatim in the response (T5).
        id: RpcId,
        /// The method name.
        method: String,
        /// `params` (an object or array), `Value::Null` when absent or `null`.
        params: Value,
    },
    /// A notification (`method`, no `id` member).
    Notification {
        /// The method name.
        method: String,
        /// `params` (an object or array), `Value::Null` when absent or `null`.
        params: Value,
    },
    /// A response to one of our requests (`result` or `error`, no `method`).
    Response {
        /// The `id` as received: a number, a string or `null` (match it with
        /// [`match_our_id`]).
        id: Value,
        /// `Ok(result)` or `Err(error)`; see [`RpcError::from_value`] for malformed errors.
        outcome: Result<Value, RpcError>,
    },
}

/// Why a line is not a usable JSON-RPC 2.0 message (T4).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON even after the repairs of `json::parse_bytes_lossy` (invalid UTF-8,
    /// lone surrogates, bad escapes and non-finite numbers are repaired, L3b, L9): answer
    /// -32700 with `id: null` on ACP; log and ignore on MCP (T6).
    #[error("not JSON")]
    NotJson,
    /// JSON, but not a JSON-RPC 2.0 message: answer -32600 on ACP with `id` when readable.
    #[error("invalid JSON-RPC 2.0 message: {reason}")]
    Invalid {
        /// The message's `id` if it is a number or string.
        id: Option<RpcId>,
        /// What is wrong, for the error message and logs.
        reason: String,
    },
}

impl ParseError {
    /// The error to answer with on ACP (T4): `-32700 "Parse error"` or
    /// `-32600 "Invalid Request: <reason>"`.
    #[must_use]
    pub fn to_rpc_error(&self) -> RpcError {
        match self {
            ParseError::NotJson => RpcError::new(RpcError::PARSE_ERROR, "Parse error"),
            ParseError::Invalid { reason, .. } => RpcError::new(
                RpcError::INVALID_REQUEST,
                format!("Invalid Request: {reason}"),
            ),
        }
    }

    /// The id to answer with: the readable id of an invalid message, else `None` (`null`).
    #[must_use]
    pub fn id(&self) -> Option<&RpcId> {
        match self {
            ParseError::NotJson => None,
            ParseError::Invalid { id, .. } => id.as_ref(),
        }
    }
}

/// A JSON value's type as an English noun phrase (`a string`, `an object`, `null`), for error
/// messages.
#[must_use]
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Decodes one line (T4, T5). The line is decoded as UTF-8 lossily (each invalid sequence
/// becomes U+FFFD, as `String::from_utf8_lossy`; SPEC L9, C36: bad bytes never drop a frame)
/// and parsed into a `serde_json::Value` by `json::parse_bytes_lossy`: a lone
/// surrogate escape becomes U+FFFD (SPEC L3b, C64), and the other repairs listed there apply,
/// so a message real peers write is never dropped as "not JSON". A leading UTF-8 BOM and
/// surrounding JSON whitespace are tolerated. Valid UTF-8 that is valid JSON is parsed once,
/// without a copy.
///
/// Classification, after checking for an object with `"jsonrpc":"2.0"`:
/// - `method` present: it must be a string; with an `id` member (number or string) it is a
///   [`Message::Request`], without one a [`Message::Notification`]. `id: null` on a request is
///   invalid (a reply could not be correlated). `params`, when present and not `null`, must be
///   an object or an array. A `result` or `error` beside `method` is invalid.
/// - else `result` or `error` (exactly one): a [`Message::Response`]; its `id` must be present
///   and a number, string or `null`.
/// - else invalid.
///
/// Errors carry the id when it is a number or string, so the -32600 answer can echo it.
pub fn parse_message(line: &[u8]) -> Result<Message, ParseError> {
    let line = line.strip_prefix(BOM).unwrap_or(line);
    let value = crate::json::parse_bytes_lossy(line).map_err(|_| ParseError::NotJson)?;
    let Value::Object(mut obj) = value else {
        return Err(ParseError::Invalid {
            id: None,
            reason: format!("expected a JSON-RPC 2.0 object, got {}", json_type(&value)),
        });
    };
    let raw_id = obj.remove("id");
    let id = raw_id.as_ref().and_then(RpcId::from_value);
    let invalid = |reason: String| ParseError::Invalid {
        id: id.clone(),
        reason,
    };

    match obj.get("jsonrpc") {
        Some(Value::String(v)) if v == "2.0" => {}
        Some(other) => {
            let shown = other.to_string();
            let got = if shown.len() <= 32 {
                shown
            } else {
                json_type(other).to_owned()
            };
            return Err(invalid(format!("\"jsonrpc\" must be \"2.0\", got {got}")));
        }
        None => return Err(invalid("missing \"jsonrpc\":\"2.0\"".into())),
    }
    if let Some(bad) = raw_id
        .as_ref()
        .filter(|v| !matches!(v, Value::Number(_) | Value::String(_) | Value::Null))
    {
        return Err(invalid(format!(
            "\"id\" must be a number, a string or null, got {}",
            json_type(bad)
        )));
    }
    let result = obj.remove("result");
    let error = obj.remove("error");

    if let Some(method) = obj.remove("method") {
        let Value::String(method) = method else {
            return Err(invalid(format!(
                "\"method\" must be a string, got {}",
                json_type(&method)
            )));
        };
        if result.is_some() || error.is_some() {
            return Err(invalid(
                "a message cannot have both \"method\" and \"result\"/\"error\"".into(),
            ));
        }
        let params = obj.remove("params").unwrap_or(Value::Null);
        if !matches!(params, Value::Object(_) | Value::Array(_) | Value::Null) {
            return Err(invalid(format!(
                "\"params\" must be an object or an array, got {}",
                json_type(&params)
            )));
        }
        return match (raw_id, id.clone()) {
            (None, _) => Ok(Message::Notification { method, params }),
            (Some(_), Some(id)) => Ok(Message::Request { id, method, params }),
            (Some(_), None) => Err(invalid(
                "a request \"id\" must be a number or a string, not null".into(),
            )),
        };
    }

    let outcome = match (result, error) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "a response cannot have both \"result\" and \"error\"".into(),
            ));
        }
        (Some(result), None) => Ok(result),
        (None, Some(error)) => Err(RpcError::from_value(&error)),
        (None, None) => {
            return Err(invalid(
                "expected \"method\", \"result\" or \"error\"".into(),
            ));
        }
    };
    match raw_id {
        Some(id) => Ok(Message::Response { id, outcome }),
        None => Err(invalid("a response needs an \"id\"".into())),
    }
}

/// The JSON text of a string (quoted and escaped).
fn json_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

fn id_json(id: &RpcId) -> String {
    match id {
        RpcId::Num(n) => n.to_string(),
        RpcId::Str(s) => json_string(s),
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"method":<method>[,"params":<params>]}\n`; `params` is
/// omitted when `Value::Null`.
fn request_frame(id_text: &str, method: &str, params: &Value) -> String {
    let mut s = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id_text},\"method\":{}",
        json_string(method)
    );
    push_params(&mut s, params);
    s
}

fn push_params(s: &mut String, params: &Value) {
    if !params.is_null() {
        s.push_str(",\"params\":");
        // Straight into the frame, no intermediate string.
        let _ = std::fmt::Write::write_fmt(s, format_args!("{params}"));
    }
    s.push_str("}\n");
}

/// A request frame with one of our integer ids (C12: we only send integer ids), compact, ending
/// in exactly one `\n` (T1). `params` is omitted when it is `Value::Null`.
#[must_use]
pub fn encode_request(id: u64, method: &str, params: &Value) -> String {
    request_frame(&id.to_string(), method, params)
}

/// A request frame with an arbitrary id (T5), otherwise as [`encode_request`].
#[must_use]
pub fn encode_request_with_id(id: &RpcId, method: &str, params: &Value) -> String {
    request_frame(&id_json(id), method, params)
}

/// A notification frame `{"jsonrpc":"2.0","method":…[,"params":…]}\n` (T1); `params` is
/// omitted when it is `Value::Null`.
#[must_use]
pub fn encode_notification(method: &str, params: &Value) -> String {
    let mut s = format!("{{\"jsonrpc\":\"2.0\",\"method\":{}", json_string(method));
    push_params(&mut s, params);
    s
}

/// [`encode_notification`] with `params` any serializable value (never omitted): the frame is
/// written in one pass, without building a [`Value`] of the params first.
#[must_use]
pub fn encode_notification_with(method: &str, params: &impl serde::Serialize) -> String {
    let mut frame = Vec::with_capacity(128);
    frame.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    // Writing to a Vec cannot fail; every value written here is a string-keyed tree.
    let _ = serde_json::to_writer(&mut frame, method);
    frame.extend_from_slice(b",\"params\":");
    let _ = serde_json::to_writer(&mut frame, params);
    frame.extend_from_slice(b"}\n");
    // serde_json writes UTF-8 only.
    String::from_utf8(frame).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A success response `{"jsonrpc":"2.0","id":<id verbatim>,"result":…}\n` (T1, T5).
#[must_use]
pub fn encode_result(id: &RpcId, result: &Value) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{result}}}\n",
        id_json(id)
    )
}

/// An error response `{"jsonrpc":"2.0","id":<id or null>,"error":{"code","message"[,"data"]}}\n`
/// (T1, T4); `None` writes `"id":null` (unreadable id, T3/T4).
#[must_use]
pub fn encode_error(id: Option<&RpcId>, err: &RpcError) -> String {
    let id_text = id.map_or_else(|| "null".to_owned(), id_json);
    let mut s = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id_text},\"error\":{{\"code\":{},\"message\":{}",
        err.code,
        json_string(&err.message)
    );
    if let Some(data) = &err.data {
        s.push_str(",\"data\":");
        s.push_str(&data.to_string());
    }
    s.push_str("}}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn t5_an_error_object_is_code_message_and_data_only_when_there_is_some() {
        assert_eq!(
            RpcError::new(-32601, "nope").to_value(),
            json!({"code": -32601, "message": "nope"})
        );
        assert_eq!(
            RpcError::new(-32000, "busy")
                .with_data(json!({"retry": 2}))
                .to_value(),
            json!({"code": -32000, "message": "busy", "data": {"retry": 2}})
        );
        assert_eq!(RpcError::new(-32601, "nope").to_string(), "nope (-32601)");
    }

    #[test]
    fn c50_the_id_scanner_takes_the_top_level_id_up_to_its_cap() {
        let scan = |line: &str| {
            let mut s = IdScanner::new();
            s.feed(line.as_bytes());
            s.into_id()
        };
        assert_eq!(
            scan(r#"{"params":{"a":1,"id":5},"id":7}"#),
            Some(RpcId::Num(7.into())),
            "a nested `id` is not the request's"
        );
        assert_eq!(scan(r#"{"params":{"a":1,"id":5}}"#), None, "nor alone");
        // The captured JSON text, quotes included, may be 1024 bytes, not one more.
        let fits = "x".repeat(MAX_RECOVERED_ID_BYTES - 2);
        assert_eq!(
            scan(&format!(r#"{{"id":"{fits}"}}"#)),
            Some(RpcId::Str(fits.clone()))
        );
        let over = "x".repeat(MAX_RECOVERED_ID_BYTES - 1);
        assert_eq!(scan(&format!(r#"{{"id":"{over}"}}"#)), None);
    }

    #[test]
    fn t5_a_peer_s_code_may_be_a_whole_float_below_9e15() {
        let code = |c: Value| RpcError::from_value(&json!({"code": c, "message": "m"})).code;
        assert_eq!(code(json!(-32601.0)), -32601);
        assert_eq!(code(json!(8.0e15)), 8_000_000_000_000_000);
        for bad in [json!(1.5), json!(9.0e15), json!(1.0e16), json!(-9.5e15)] {
            assert_eq!(code(bad.clone()), RpcError::INTERNAL_ERROR, "{bad}");
        }
    }

    #[test]
    fn t5_a_long_error_message_is_cut_before_a_character_it_would_split() {
        let long = format!("{}é", "x".repeat(MAX_ERROR_MESSAGE_BYTES - 1));
        let e = RpcError::from_value(&json!({"code": 1, "message": long}));
        assert_eq!(e.message, "x".repeat(MAX_ERROR_MESSAGE_BYTES - 1));
    }

    fn lines(max: usize, chunks: &[&[u8]]) -> (Vec<LineEvent>, Option<usize>) {
        let mut buf = LineBuffer::new(max);
        let mut out = Vec::new();
        for c in chunks {
            buf.push(c, &mut out);
        }
        let tail = buf.finish();
        (out, tail)
    }

    fn line(s: &str) -> LineEvent {
        LineEvent::Line(s.as_bytes().to_vec())
    }

    fn parse(s: &str) -> Result<Message, ParseError> {
        parse_message(s.as_bytes())
    }

    fn num(s: &str) -> RpcId {
        match serde_json::from_str::<Number>(s) {
            Ok(n) => RpcId::Num(n),
            Err(e) => unreachable!("{s}: {e}"),
        }
    }

    #[test]
    fn t1_lines_split_on_newline_strip_cr_and_bom_and_skip_blank_lines() {
        let (ev, tail) = lines(
            1024,
            &[b"Welcome back user\n\n  \t\r\n\xEF\xBB\xBF{\"a\":1}\r\n{\"b\":2}\n\xEF\xBB\xBF\r\n"],
        );
        assert_eq!(
            ev,
            vec![
                line("Welcome back user"),
                line("{\"a\":1}"),
                line("{\"b\":2}")
            ]
        );
        assert_eq!(tail, None);
    }

    #[test]
    fn t1_only_one_trailing_cr_is_removed_and_inner_crs_stay() {
        let (ev, _) = lines(1024, &[b"a\r\r\nb\rc\n"]);
        assert_eq!(ev, vec![line("a\r"), line("b\rc")]);
    }

    #[test]
    fn c16_several_messages_in_one_read_are_all_delivered_in_order() {
        let (ev, tail) = lines(1024, &[b"{\"id\":1}\n{\"id\":2}\n{\"id\":"]);
        assert_eq!(ev, vec![line("{\"id\":1}"), line("{\"id\":2}")]);
        assert_eq!(tail, Some(6));
    }

    #[test]
    fn t7_partial_line_at_eof_is_dropped_and_its_length_returned() {
        let (ev, tail) = lines(1024, &[b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":"]);
        assert!(ev.is_empty());
        assert_eq!(tail, Some(33));
        assert_eq!(
            lines(1024, &[b"x\n  \r"]).1,
            None,
            "a blank tail is not reported"
        );
        assert_eq!(lines(1024, &[b""]).1, None);
    }

    #[test]
    fn t7_finish_resets_the_buffer_for_reuse() {
        let mut buf = LineBuffer::new(16);
        let mut out = Vec::new();
        buf.push(b"abc", &mut out);
        assert_eq!(buf.pending_bytes(), 3);
        assert_eq!(buf.finish(), Some(3));
        assert_eq!(buf.finish(), None);
        buf.push(b"d\n", &mut out);
        assert_eq!(out, vec![line("d")]);
    }

    #[test]
    fn t3_oversized_line_is_discarded_and_reported_once() {
        let (ev, tail) = lines(8, &[b"ok\n0123456789abcdef\nafter\n"]);
        assert_eq!(
            ev,
            vec![
                line("ok"),
                LineEvent::TooLong { bytes: 9, id: None },
                line("after")
            ]
        );
        assert_eq!(tail, None);
    }

    #[test]
    fn t3_line_of_exactly_the_cap_passes_and_one_more_byte_is_too_long() {
        assert_eq!(lines(4, &[b"abcd\n"]).0, vec![line("abcd")]);
        assert_eq!(lines(4, &[b"ab", b"cd\n"]).0, vec![line("abcd")]);
        assert_eq!(
            lines(4, &[b"abcde\n"]).0,
            vec![LineEvent::TooLong { bytes: 5, id: None }]
        );
        assert_eq!(
            lines(4, &[b"ab", b"cde\n"]).0,
            vec![LineEvent::TooLong { bytes: 5, id: None }]
        );
    }

    #[test]
    fn t3_oversized_line_in_small_chunks_keeps_memory_bounded_and_reports_once() {
        let mut buf = LineBuffer::new(1024);
        let mut out = Vec::new();
        for _ in 0..100 {
            buf.push(&[b'a'; 100], &mut out);
            assert!(buf.pending_bytes() <= 1024);
        }
        assert_eq!(
            out,
            vec![LineEvent::TooLong {
                bytes: 1025,
                id: None
            }]
        );
        buf.push(b"aaa\n{}\n", &mut out);
        assert_eq!(
            out,
            vec![
                LineEvent::TooLong {
                    bytes: 1025,
                    id: None
                },
                line("{}")
            ]
        );
    }

    #[test]
    fn c16_line_without_newline_past_the_cap_is_reported_before_eof_and_not_again_at_eof() {
        let mut buf = LineBuffer::new(1024);
        let mut out = Vec::new();
        buf.push(&vec![b'x'; 4096], &mut out);
        assert_eq!(
            out,
            vec![LineEvent::TooLong {
                bytes: 1025,
                id: None
            }]
        );
        assert_eq!(buf.finish(), None);
    }

    #[test]
    fn c16_a_5_mib_line_in_4_kib_chunks_parses_like_one_write() {
        let text = "a".repeat(5 * 1024 * 1024);
        let frame = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{text}\"}}]}}}}\n"
        );
        let mut buf = LineBuffer::new(16 * 1024 * 1024);
        let mut out = Vec::new();
        for chunk in frame.as_bytes().chunks(4096) {
            buf.push(chunk, &mut out);
        }
        assert_eq!(out.len(), 1);
        let Some(LineEvent::Line(l)) = out.first() else {
            unreachable!("{out:?}")
        };
        assert_eq!(l.len(), frame.len() - 1);
        let Ok(Message::Response { id, outcome: Ok(_) }) = parse_message(l) else {
            unreachable!()
        };
        assert_eq!(match_our_id(&id), Some(2));
    }

    #[test]
    fn t1_bom_and_cr_split_across_chunks_are_still_stripped() {
        let (ev, _) = lines(64, &[b"\xEF", b"\xBB", b"\xBF{}\r", b"\n"]);
        assert_eq!(ev, vec![line("{}")]);
    }

    proptest! {
        #[test]
        fn c16_any_split_of_a_stream_yields_the_same_events_as_one_push(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(b"\n".to_vec()),
                    Just(b"\r\n".to_vec()),
                    Just(b"\xEF\xBB\xBF".to_vec()),
                    Just(b" \t".to_vec()),
                    proptest::collection::vec(any::<u8>(), 0..12),
                    proptest::collection::vec(Just(b'z'), 0..40),
                ],
                0..24,
            ),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
            max in 0usize..48,
        ) {
            let stream: Vec<u8> = parts.concat();
            let whole = lines(max, &[&stream]);
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&stream[start..p]);
                start = p;
            }
            chunks.push(&stream[start..]);
            prop_assert_eq!(lines(max, &chunks), whole.clone());
            // Byte by byte too.
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            prop_assert_eq!(lines(max, &bytes), whole.clone());
            for ev in &whole.0 {
                if let LineEvent::Line(l) = ev {
                    prop_assert!(l.len() <= max && !l.contains(&b'\n'));
                }
            }
        }
    }

    fn recovering(max: usize, chunks: &[&[u8]]) -> Vec<LineEvent> {
        let mut buf = LineBuffer::recovering_ids(max);
        let mut out = Vec::new();
        for c in chunks {
            buf.push(c, &mut out);
            assert!(buf.pending_bytes() <= max);
        }
        buf.finish_into(&mut out);
        out
    }

    fn too_long(max: usize, id: Option<RpcId>) -> LineEvent {
        LineEvent::TooLong { bytes: max + 1, id }
    }

    fn scan(text: &str) -> Option<RpcId> {
        let mut s = IdScanner::new();
        s.feed(text.as_bytes());
        s.into_id()
    }

    #[test]
    fn c50_an_over_long_request_is_reported_with_its_own_id_when_the_line_ends() {
        let pad = "x".repeat(5000);
        let req = format!(
            r#"{{"jsonrpc":"2.0","id":103,"method":"session/prompt","params":{{"text":"{pad}"}}}}"#
        );
        let stream = format!("{req}\n{{\"jsonrpc\":\"2.0\",\"id\":104,\"method\":\"m\"}}\n");
        let want = vec![
            too_long(1024, Some(num("103"))),
            line(r#"{"jsonrpc":"2.0","id":104,"method":"m"}"#),
        ];
        assert_eq!(recovering(1024, &[stream.as_bytes()]), want);
        let chunks: Vec<&[u8]> = stream.as_bytes().chunks(100).collect();
        assert_eq!(recovering(1024, &chunks), want);
        // Nothing is reported before the newline: the id may come last.
        let mut buf = LineBuffer::recovering_ids(1024);
        let mut out = Vec::new();
        buf.push(&req.as_bytes()[..3000], &mut out);
        assert!(out.is_empty() && buf.pending_bytes() == 0);
    }

    #[test]
    fn c50_the_id_is_found_after_a_huge_params_member_and_nested_ids_are_ignored() {
        let pad = "y".repeat(10_000);
        let req = format!(
            r#"{{"jsonrpc":"2.0","method":"session/prompt","params":{{"id":1,"t":"{pad}","a":[{{"id":2}}]}},"id":"req-7"}}"#
        );
        assert_eq!(
            recovering(1024, &[req.as_bytes(), b"\n"]),
            vec![too_long(1024, Some(RpcId::Str("req-7".into())))]
        );
    }

    #[test]
    fn c50_an_over_long_line_without_a_readable_id_is_reported_with_null() {
        let pad = "z".repeat(2000);
        for text in [
            format!(r#"{{"jsonrpc":"2.0","method":"m","params":{{"t":"{pad}"}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":null,"method":"m","params":"{pad}"}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":{{"n":1}},"params":"{pad}"}}"#),
            format!(r#"[{{"id":1,"p":"{pad}"}}]"#),
            pad.clone(),
        ] {
            assert_eq!(
                recovering(1024, &[text.as_bytes(), b"\n"]),
                vec![too_long(1024, None)],
                "{}",
                &text[..40]
            );
        }
    }

    #[test]
    fn c50_an_over_long_line_cut_by_eof_is_still_reported_once_with_its_id() {
        let pad = "w".repeat(3000);
        let req = format!(r#"{{"id":9,"jsonrpc":"2.0","method":"m","params":{{"t":"{pad}""#);
        assert_eq!(
            recovering(1024, &[req.as_bytes()]),
            vec![too_long(1024, Some(num("9")))]
        );
        let mut buf = LineBuffer::recovering_ids(1024);
        let mut out = Vec::new();
        buf.push(req.as_bytes(), &mut out);
        assert_eq!(buf.finish(), None);
        assert!(out.is_empty());
    }

    #[test]
    fn c50_id_scanner_reads_numbers_strings_escapes_and_the_last_duplicate() {
        assert_eq!(scan(r#"{"id":103}"#), Some(num("103")));
        assert_eq!(scan(r#" {"id" : -1.5e3 , "x":1}"#), Some(num("-1.5e3")));
        assert_eq!(scan("\u{feff}{\"id\":7}"), Some(num("7")));
        assert_eq!(
            scan(r#"{"id":"a\"b\\","m":1}"#),
            Some(RpcId::Str("a\"b\\".into()))
        );
        assert_eq!(scan(r#"{"x":"\"id\":5","id":6}"#), Some(num("6")));
        assert_eq!(scan(r#"{"id":1,"id":2}"#), Some(num("2")));
        assert_eq!(scan(r#"{"id":1,"id":null}"#), None);
        assert_eq!(scan(r#"{"i\u0064":1}"#), None);
        assert_eq!(scan(r#"{"idx":1,"d":2}"#), None);
        assert_eq!(scan(r#"{"id":true}"#), None);
        assert_eq!(scan(r#"{"p":{"id":1}}"#), None);
        assert_eq!(scan(r#"{"id":12"#), Some(num("12")));
        assert_eq!(scan(r#"{"id":"unterminated"#), None);
        assert_eq!(scan(r#"{"id":1-2}"#), None);
        assert_eq!(scan(r#"{} {"id":1}"#), None);
        let long = format!(r#"{{"id":"{}"}}"#, "i".repeat(MAX_RECOVERED_ID_BYTES));
        assert_eq!(scan(&long), None);
        let fits = format!(r#"{{"id":"{}"}}"#, "i".repeat(MAX_RECOVERED_ID_BYTES - 2));
        assert!(scan(&fits).is_some());
        assert_eq!(
            scan("{\"id\":\"caf\u{e9}\"}"),
            Some(RpcId::Str("caf\u{e9}".into()))
        );
        let mut s = IdScanner::new();
        s.feed(b"{\"id\":\"caf\xE9\"}");
        assert_eq!(s.into_id(), Some(RpcId::Str("caf\u{FFFD}".into())));
    }

    #[test]
    fn c36_invalid_utf8_in_a_line_is_decoded_lossily_not_dropped() {
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"int caf\xE9 = 1; // \xB0\xA1\xC7\xD1 END\"}]}}";
        let Ok(Message::Response {
            id,
            outcome: Ok(result),
        }) = parse_message(line)
        else {
            panic!("C36 line was not decoded: {:?}", parse_message(line));
        };
        assert_eq!(id, json!(3));
        assert_eq!(
            result["content"][0]["text"],
            json!("int caf\u{FFFD} = 1; // \u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD} END")
        );
        // A request from the client with bad bytes in its params is a request too.
        assert!(matches!(
            parse_message(
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"t\":\"\xFF\"}}"
            ),
            Ok(Message::Request { .. })
        ));
    }

    fn id_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            (-1e12f64..1e12).prop_map(|f| json!(f)),
            ".{0,40}".prop_map(|s: String| json!(s)),
        ]
    }

    proptest! {
        #[test]
        fn c50_any_split_recovers_the_id_of_any_over_long_request(
            id in id_strategy(),
            pad in 0usize..3000,
            before in proptest::collection::vec("[a-hj-z]{1,6}", 0..4),
            after in proptest::collection::vec("[a-hj-z]{1,6}", 0..4),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
            max in 1usize..400,
        ) {
            // Members before and after "id" in any order, with a nested "id" in params.
            let mut obj = String::from("{");
            for k in &before {
                obj.push_str(&format!("\"{k}\":{{\"id\":[1,\"}}\"],\"s\":\"{}\"}},", "p".repeat(pad)));
            }
            obj.push_str(&format!("\"id\":{id}"));
            for k in &after {
                obj.push_str(&format!(",\"{k}\":\"{}\\\"\"", "q".repeat(pad)));
            }
            obj.push('}');
            let stream = format!("{obj}\n{{}}\n");
            let bytes = stream.as_bytes();
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&bytes[start..p]);
                start = p;
            }
            chunks.push(&bytes[start..]);
            let got = recovering(max, &chunks);
            let whole = recovering(max, &[bytes]);
            prop_assert_eq!(&got, &whole);
            // The id as the parser reads its text (floats need not round-trip exactly).
            let reparsed: Value = serde_json::from_str(&id.to_string()).unwrap_or(Value::Null);
            let want_id = RpcId::from_value(&reparsed);
            if obj.len() > max {
                prop_assert_eq!(got.first(), Some(&too_long(max, want_id)));
            } else {
                prop_assert_eq!(got.first(), Some(&LineEvent::Line(obj.clone().into_bytes())));
            }
        }

        #[test]
        fn c50_id_scanner_never_panics_and_agrees_with_the_parser_on_valid_lines(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut s = IdScanner::new();
            s.feed(&bytes);
            let scanned = s.into_id();
            if let Ok(Message::Request { id, .. }) = parse_message(&bytes) {
                // A plain `"id"` key (no escapes) is the only way a parsed request has an id.
                if !bytes.windows(2).any(|w| w[0] == b'\\') {
                    prop_assert_eq!(scanned, Some(id));
                }
            }
        }
    }

    #[test]
    fn c12_match_our_id_accepts_integers_numeric_strings_and_integral_floats() {
        assert_eq!(match_our_id(&json!(7)), Some(7));
        assert_eq!(match_our_id(&json!(0)), Some(0));
        assert_eq!(match_our_id(&json!(u64::MAX)), Some(u64::MAX));
        assert_eq!(match_our_id(&json!("7")), Some(7));
        assert_eq!(match_our_id(&json!("0")), Some(0));
        assert_eq!(match_our_id(&json!(7.0)), Some(7));
        assert_eq!(match_our_id(&json!(0.0)), Some(0));
        let parsed: Value = serde_json::from_str("1.0").unwrap_or(Value::Null);
        assert_eq!(match_our_id(&parsed), Some(1));
    }

    #[test]
    fn c12_match_our_id_rejects_everything_else() {
        for v in [
            json!(null),
            json!(-1),
            json!(1.5),
            json!(-2.0),
            json!(1e300),
            json!("x"),
            json!(""),
            json!("-1"),
            json!("07"),
            json!(" 7"),
            json!("7.0"),
            json!(true),
            json!([1]),
            json!({"id":1}),
        ] {
            assert_eq!(match_our_id(&v), None, "{v}");
        }
    }

    #[test]
    fn c12_exact_our_id_accepts_only_the_integer_we_sent() {
        assert_eq!(exact_our_id(&json!(3)), Some(3));
        assert_eq!(exact_our_id(&json!("3")), None);
        assert_eq!(exact_our_id(&json!(3.0)), None);
    }

    #[test]
    fn t4_request_notification_and_response_are_classified() {
        assert_eq!(
            parse(
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#
            ),
            Ok(Message::Request {
                id: num("0"),
                method: "initialize".into(),
                params: json!({"protocolVersion":1})
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification {
                method: "notifications/initialized".into(),
                params: Value::Null
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":"a","method":"m","params":[1,2]}"#),
            Ok(Message::Request {
                id: RpcId::Str("a".into()),
                method: "m".into(),
                params: json!([1, 2])
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[]}}"#),
            Ok(Message::Response {
                id: json!(3),
                outcome: Ok(json!({"tools":[]}))
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#),
            Ok(Message::Response {
                id: Value::Null,
                outcome: Err(RpcError::new(-32700, "Parse error"))
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":4,"result":null}"#),
            Ok(Message::Response {
                id: json!(4),
                outcome: Ok(Value::Null)
            })
        );
    }

    #[test]
    fn t4_error_data_is_kept_and_malformed_errors_still_settle_the_request() {
        let Ok(Message::Response {
            outcome: Err(e), ..
        }) = parse(
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"nope","data":{"x":1}}}"#,
        )
        else {
            unreachable!()
        };
        assert_eq!(
            e,
            RpcError::new(RpcError::RESOURCE_NOT_FOUND, "nope").with_data(json!({"x":1}))
        );
        let Ok(Message::Response {
            outcome: Err(e), ..
        }) = parse(r#"{"jsonrpc":"2.0","id":1,"error":"boom"}"#)
        else {
            unreachable!()
        };
        assert_eq!(e, RpcError::new(RpcError::INTERNAL_ERROR, "boom"));
        let Ok(Message::Response {
            outcome: Err(e), ..
        }) = parse(r#"{"jsonrpc":"2.0","id":1,"error":{"message":"m"}}"#)
        else {
            unreachable!()
        };
        assert_eq!(e.code, RpcError::INTERNAL_ERROR);
    }

    #[test]
    fn c52_a_peer_error_message_of_megabytes_is_cut_to_4_kib() {
        let big = "é".repeat(3 * 1024 * 1024);
        for error in [
            json!({"code": 1, "message": big}),
            json!(big),
            json!({"code": 1, "message": [big]}),
        ] {
            let e = RpcError::from_value(&error);
            assert!(
                e.message.len() <= MAX_ERROR_MESSAGE_BYTES && e.message.len() > 4000,
                "{}",
                e.message.len()
            );
        }
        assert_eq!(
            RpcError::from_value(&json!({"message": "short"})).message,
            "short"
        );
    }

    #[test]
    fn t5_ids_round_trip_verbatim_including_floats_and_strings() {
        for raw in ["1.0", "1", "-5", "\"7\"", "\"\"", "12345678901234567890"] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{raw},"method":"m"}}"#);
            let Ok(Message::Request { id, .. }) = parse(&line) else {
                unreachable!("{raw}")
            };
            let out = encode_result(&id, &json!({}));
            assert_eq!(
                out,
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{raw},\"result\":{{}}}}\n")
            );
        }
    }

    #[test]
    fn c01_non_json_lines_are_not_json() {
        for l in [
            "Welcome back user",
            "stitem parent list node; CSS resets require",
            "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":",
            "",
        ] {
            assert_eq!(parse(l), Err(ParseError::NotJson), "{l}");
        }
        assert_eq!(parse_message(b"\xFF\xFE{}"), Err(ParseError::NotJson));
        let e = ParseError::NotJson;
        assert_eq!(
            encode_error(e.id(), &e.to_rpc_error()),
            "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error\"}}\n"
        );
    }

    #[test]
    fn c64_a_prompt_ending_in_a_lone_surrogate_is_a_request_with_its_own_id() {
        let line = br#"{"jsonrpc":"2.0","id":555,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"cut here \ud83d"}]}}"#;
        let Ok(Message::Request { id, method, params }) = parse_message(line) else {
            unreachable!("{:?}", parse_message(line))
        };
        assert_eq!((id, method.as_str()), (num("555"), "session/prompt"));
        assert_eq!(params["prompt"][0]["text"], "cut here \u{FFFD}");
    }

    #[test]
    fn c64_a_tool_reply_with_a_pair_and_two_lone_surrogates_is_a_response() {
        let line = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"\ud83d\ude00 \ud83d \udc00"}]}}"#;
        let Ok(Message::Response {
            id,
            outcome: Ok(result),
        }) = parse_message(line)
        else {
            unreachable!("{:?}", parse_message(line))
        };
        assert_eq!(id, json!(7));
        assert_eq!(result["content"][0]["text"], "😀 \u{FFFD} \u{FFFD}");
        // The text serialises back without any escape a strict peer would reject.
        let out = encode_result(&num("7"), &result);
        assert!(!out.contains("\\u"), "{out}");
    }

    #[test]
    fn c64_the_id_scanner_reads_a_string_id_holding_a_lone_surrogate() {
        let mut scan = IdScanner::new();
        scan.feed(br#"{"id":"a\ud800","method":"m"}"#);
        assert_eq!(scan.into_id(), Some(RpcId::Str("a\u{FFFD}".into())));
    }

    #[test]
    fn c01_a_leading_bom_is_tolerated_by_the_parser_too() {
        assert!(matches!(
            parse_message(b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"method\":\"m\"}"),
            Ok(Message::Notification { .. })
        ));
    }

    fn invalid(s: &str) -> (Option<RpcId>, String) {
        match parse(s) {
            Err(ParseError::Invalid { id, reason }) => (id, reason),
            other => unreachable!("{s}: {other:?}"),
        }
    }

    #[test]
    fn c01_json_that_is_not_json_rpc_is_invalid_with_the_id_when_readable() {
        assert_eq!(invalid("[]").0, None);
        assert_eq!(invalid("42").0, None);
        assert_eq!(invalid(r#"{"foo":1}"#).0, None);
        assert_eq!(invalid(r#"{"id":5,"method":"m"}"#).0, Some(num("5")));
        assert_eq!(
            invalid(r#"{"jsonrpc":"1.0","id":"x","method":"m"}"#).0,
            Some(RpcId::Str("x".into()))
        );
        assert_eq!(
            invalid(r#"{"jsonrpc":2.0,"id":1,"method":"m"}"#).0,
            Some(num("1"))
        );
        assert_eq!(
            invalid(r#"{"jsonrpc":"2.0","id":6,"method":7}"#).0,
            Some(num("6"))
        );
        assert_eq!(
            invalid(r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#).0,
            None
        );
        assert_eq!(invalid(r#"{"jsonrpc":"2.0","id":{},"result":1}"#).0, None);
        assert_eq!(
            invalid(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).0,
            None
        );
        assert_eq!(invalid(r#"{"jsonrpc":"2.0","id":8}"#).0, Some(num("8")));
        assert_eq!(invalid(r#"{"jsonrpc":"2.0","result":1}"#).0, None);
        assert_eq!(
            invalid(r#"{"jsonrpc":"2.0","id":9,"result":1,"error":{}}"#).0,
            Some(num("9"))
        );
        assert_eq!(
            invalid(r#"{"jsonrpc":"2.0","id":10,"method":"m","result":1}"#).0,
            Some(num("10"))
        );
        assert_eq!(
            invalid(r#"{"jsonrpc":"2.0","id":11,"method":"m","params":"s"}"#).0,
            Some(num("11"))
        );
        assert_eq!(
            invalid(r#"{"jsonrpc":"1.0","method":"m"}"#).1,
            "\"jsonrpc\" must be \"2.0\", got \"1.0\""
        );
        let long = format!(r#"{{"jsonrpc":"{}","method":"m"}}"#, "v".repeat(100));
        assert_eq!(
            invalid(&long).1,
            "\"jsonrpc\" must be \"2.0\", got a string"
        );
        let e = ParseError::Invalid {
            id: Some(num("5")),
            reason: "r".into(),
        };
        assert_eq!(
            encode_error(e.id(), &e.to_rpc_error()),
            "{\"jsonrpc\":\"2.0\",\"id\":5,\"error\":{\"code\":-32600,\"message\":\"Invalid Request: r\"}}\n"
        );
    }

    #[test]
    fn t4_params_null_counts_as_absent() {
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":null}"#),
            Ok(Message::Request {
                id: num("1"),
                method: "m".into(),
                params: Value::Null
            })
        );
    }

    #[test]
    fn t1_encoders_write_compact_single_lines_in_field_order() {
        let params = json!({"text": "two\nlines", "n": [1, 2]});
        assert_eq!(
            encode_request(3, "tools/call", &params),
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"n\":[1,2],\"text\":\"two\\nlines\"}}\n"
        );
        assert_eq!(
            encode_request(1, "tools/list", &Value::Null),
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n"
        );
        assert_eq!(
            encode_notification("notifications/initialized", &Value::Null),
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
        );
        assert_eq!(
            encode_request_with_id(&RpcId::Str("q\"1".into()), "m", &json!([])),
            "{\"jsonrpc\":\"2.0\",\"id\":\"q\\\"1\",\"method\":\"m\",\"params\":[]}\n"
        );
        assert_eq!(
            encode_error(
                None,
                &RpcError::new(RpcError::INVALID_REQUEST, "line too long")
                    .with_data(json!({"max":1024}))
            ),
            "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":\"line too long\",\"data\":{\"max\":1024}}}\n"
        );
    }

    #[test]
    fn t1_every_encoder_output_parses_back_with_parse_message() {
        let params = json!({"s": "a\u{2028}b\r\n\u{0}é😀", "deep": {"x": [null, true, 1.5]}});
        let id = RpcId::Str("id\n".into());
        let cases: Vec<(String, Message)> = vec![
            (
                encode_request(u64::MAX, "m", &params),
                Message::Request {
                    id: num("18446744073709551615"),
                    method: "m".into(),
                    params: params.clone(),
                },
            ),
            (
                encode_request_with_id(&id, "m", &params),
                Message::Request {
                    id: id.clone(),
                    method: "m".into(),
                    params: params.clone(),
                },
            ),
            (
                encode_notification("n", &params),
                Message::Notification {
                    method: "n".into(),
                    params: params.clone(),
                },
            ),
            (
                encode_notification("n", &Value::Null),
                Message::Notification {
                    method: "n".into(),
                    params: Value::Null,
                },
            ),
            (
                encode_result(&id, &params),
                Message::Response {
                    id: id.to_value(),
                    outcome: Ok(params.clone()),
                },
            ),
            (
                encode_error(
                    Some(&num("2.5")),
                    &RpcError::new(RpcError::METHOD_NOT_FOUND, "no \"x\"")
                        .with_data(params.clone()),
                ),
                Message::Response {
                    id: json!(2.5),
                    outcome: Err(RpcError::new(-32601, "no \"x\"").with_data(params.clone())),
                },
            ),
            (
                encode_error(None, &RpcError::new(RpcError::SERVER_ERROR, "e")),
                Message::Response {
                    id: Value::Null,
                    outcome: Err(RpcError::new(-32000, "e")),
                },
            ),
        ];
        for (frame, want) in cases {
            assert!(
                frame.ends_with('\n') && frame.matches('\n').count() == 1,
                "{frame:?}"
            );
            assert_eq!(parse(&frame), Ok(want), "{frame}");
        }
    }

    #[test]
    fn t5_a_float_id_is_echoed_as_the_number_the_client_sent() {
        // Found by the acp_input fuzz target: without exact float parsing the echo read back
        // as a different double than the id sent, and the client could not correlate it.
        for raw in [
            "333333373333333333333333333000000000563666161.33333333333333333333333333333333333333333",
            "0.1",
            "1e2",
            "-2.5e-300",
            "123456789012345678901234567890",
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{raw},"method":"m"}}"#);
            let Ok(Message::Request { id, .. }) = parse(&line) else {
                unreachable!("{raw}")
            };
            let echo = encode_result(&id, &json!(null));
            let Ok(Message::Response { id: back, .. }) = parse(echo.trim_end()) else {
                unreachable!("{echo}")
            };
            let sent: f64 = raw.parse().unwrap_or(f64::NAN);
            assert_eq!(back.as_f64(), Some(sent), "{raw} echoed as {back}");
        }
    }

    #[test]
    fn t5_rpc_id_serde_is_untagged() {
        assert_eq!(
            serde_json::to_string(&RpcId::Str("a".into()))
                .ok()
                .as_deref(),
            Some("\"a\"")
        );
        assert_eq!(
            serde_json::to_string(&num("1.0")).ok().as_deref(),
            Some("1.0")
        );
        assert_eq!(serde_json::from_str::<RpcId>("7").ok(), Some(num("7")));
        assert_eq!(
            serde_json::from_str::<RpcId>("\"7\"").ok(),
            Some(RpcId::Str("7".into()))
        );
        assert!(serde_json::from_str::<RpcId>("null").is_err());
        assert_eq!(RpcId::from_value(&json!(null)), None);
    }

    #[test]
    fn error_codes_match_json_rpc_and_spec() {
        assert_eq!(
            [
                RpcError::PARSE_ERROR,
                RpcError::INVALID_REQUEST,
                RpcError::METHOD_NOT_FOUND,
                RpcError::INVALID_PARAMS,
                RpcError::INTERNAL_ERROR,
                RpcError::SERVER_ERROR,
                RpcError::RESOURCE_NOT_FOUND,
            ],
            [-32700, -32600, -32601, -32602, -32603, -32000, -32002]
        );
    }
}
