//! Inputs (observations of the world) and actions (requests to the runtime), the core's
//! contract (docs/architecture.md, "The core"), plus the small pure helpers both runtimes use to turn raw process IO
//! into inputs ([`StderrLines`], [`exit_description`]). Failures of the world are inputs, never
//! `Err`s.

use std::fmt;

pub use crate::config::LogLevel;
pub use crate::http::HttpEvent;
pub use crate::ids::{ExchangeId, ListenerId, LlmCallId, ProcKey, ServerSlot, TranscriptId};
pub use crate::llm::HttpRequest;
pub use crate::project::{ProjectFiles, ReadSpec};

/// The events of an LLM call: those of its HTTP exchange.
pub type LlmEvent = HttpEvent;

/// One observation from the world, fed to [`Agent::handle`](crate::Agent::handle).
#[derive(Clone, PartialEq, Eq)]
pub enum Input {
    /// Bytes read from the agent's stdin (the ACP client), split anywhere; lines are
    /// newline-delimited JSON-RPC messages (SPEC T1) decoded lossily (L9).
    AcpBytes(Vec<u8>),
    /// The agent's stdin reached EOF: shut down (SPEC P1).
    AcpEof,
    /// SIGTERM, SIGINT or SIGHUP was received: shut down (SPEC P1).
    ShutdownSignal,
    /// A write to stdout failed (EPIPE: the client is gone): shut down (SPEC P1).
    AcpWriteFailed,
    /// The process asked for by [`Action::SpawnMcp`] is running.
    McpSpawned {
        /// The process.
        proc: ProcKey,
    },
    /// [`Action::SpawnMcp`] failed (e.g. ENOENT): no process exists (SPEC M1).
    McpSpawnFailed {
        /// The process that could not be started.
        proc: ProcKey,
        /// The OS error, one line (`No such file or directory (os error 2)`).
        error: String,
    },
    /// Bytes from a server's stdout, split anywhere (SPEC M1, T6).
    McpBytes {
        /// The process that wrote them.
        proc: ProcKey,
        /// The bytes, as read.
        bytes: Vec<u8>,
    },
    /// A server's stdout reached EOF.
    McpStdoutClosed {
        /// The process.
        proc: ProcKey,
    },
    /// One line of a server's stderr (SPEC M1, P2), e.g. from [`StderrLines`].
    McpStderrLine {
        /// The process that wrote it.
        proc: ProcKey,
        /// The line without its newline, lossily decoded; the core caps a longer line at
        /// [`MAX_STDERR_LINE_BYTES`].
        line: String,
    },
    /// The server process exited and was reaped.
    McpExited {
        /// The process.
        proc: ProcKey,
        /// Human readable, from [`exit_description`] (`exit status 3`, `killed by signal 9`).
        status: String,
    },
    /// A write to a server's stdin failed (it is gone or exiting).
    McpWriteFailed {
        /// The process.
        proc: ProcKey,
    },
    /// A line for a server's stdin was dropped: more than [`MAX_MCP_STDIN_QUEUE_BYTES`] were
    /// already waiting for it (it stopped reading its stdin, SPEC S5). The server is cut off.
    McpStdinFull {
        /// The process.
        proc: ProcKey,
    },
    /// Progress of an LLM call.
    Llm {
        /// The call of [`Action::CallLlm`].
        call: LlmCallId,
        /// What happened.
        event: LlmEvent,
    },
    /// Progress of an HTTP exchange of an MCP server ([`Action::Http`], SPEC M10).
    Http {
        /// The exchange.
        exchange: ExchangeId,
        /// What happened.
        event: HttpEvent,
    },
    /// What happened to a transcript file (SPEC A9): the result of an open, the bytes of a
    /// read, or a failure.
    Transcript {
        /// The file of [`Action::OpenTranscript`].
        file: TranscriptId,
        /// What happened.
        event: TranscriptEvent,
    },
    /// The answer to [`Action::ListTranscripts`] (SPEC A9): every `sess_*.jsonl` regular file
    /// of the state directory (none when the directory does not exist), or why it could not
    /// be read.
    TranscriptList {
        /// The request's number, echoed.
        request: u64,
        /// The files, in any order, or the OS error.
        entries: Result<Vec<TranscriptEntry>, String>,
    },
    /// The answer to [`Action::ReadProject`] (SPEC A10): the project instructions and skill
    /// folders found for a session.
    ProjectRead {
        /// The read's number, echoed.
        request: u64,
        /// What was read.
        files: ProjectFiles,
    },
    /// What came of an [`Action::OAuth`] (SPEC M11).
    OAuth(OAuthInput),
}

/// The runtime's part of MCP authorization (SPEC M11): a loopback listener for the
/// authorization redirect, the token files, the user's browser. Each names the MCP server it
/// is for (`server`), and what comes of it ([`OAuthInput`]) names it too. HTTP requests of an
/// authorization go through the server's HTTP exchanges.
#[derive(Clone, PartialEq, Eq)]
pub enum OAuthAction {
    /// Listen on `127.0.0.1:port` (0: any free port) for the authorization redirect; answer
    /// with [`OAuthInput::Listening`], then hand each connection's request head (at most
    /// [`MAX_CALLBACK_HEAD_BYTES`] bytes, read for at most 10 s) to the core as
    /// [`OAuthInput::Callback`].
    Listen {
        /// The server being authorized.
        server: ServerSlot,
        /// The listener (numbered per server).
        listener: ListenerId,
        /// The port, 0 for any.
        port: u16,
    },
    /// Write `response` (a complete HTTP response) to the connection and close it.
    Answer {
        /// The server.
        server: ServerSlot,
        /// The listener.
        listener: ListenerId,
        /// The connection of [`OAuthInput::Callback`].
        connection: u64,
        /// The bytes to write.
        response: Vec<u8>,
    },
    /// Stop listening; connections still waiting for an answer are closed.
    StopListening {
        /// The server.
        server: ServerSlot,
        /// The listener.
        listener: ListenerId,
    },
    /// Read `file` (a plain name) in the `oauth/` directory of the state directory; answer
    /// with [`OAuthInput::TokenFile`].
    ReadTokenFile {
        /// The server.
        server: ServerSlot,
        /// The file name.
        file: String,
    },
    /// Replace `file` in `<state dir>/oauth/` with `bytes`: the directory is created mode
    /// 0700, the file written mode 0600 to a temporary name, synced and renamed over the old
    /// one, so that a crash leaves either file whole. Reported as
    /// [`OAuthInput::TokenFileWritten`]. Writes are done in the order asked.
    WriteTokenFile {
        /// The server.
        server: ServerSlot,
        /// The file name.
        file: String,
        /// The content (holds tokens: never logged).
        bytes: Vec<u8>,
    },
    /// Start `argv` (the user's `$BROWSER` on the authorization URL) detached, stdin/stdout/
    /// stderr to `/dev/null`; answer with [`OAuthInput::Browser`].
    OpenBrowser {
        /// The server.
        server: ServerSlot,
        /// The program and its arguments.
        argv: Vec<String>,
    },
}

/// The most bytes of lines a runtime keeps waiting for one server's stdin (SPEC S5): twice the
/// 16 MiB stdout line cap, so one whole answer of the largest size fits behind another. The
/// line that would go over it is dropped and reported as [`Input::McpStdinFull`].
pub const MAX_MCP_STDIN_QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// The most bytes of a request head the runtime reads from a loopback connection before it
/// hands them to the core as they are.
pub const MAX_CALLBACK_HEAD_BYTES: usize = 8 * 1024;

/// What came of an [`OAuthAction`], for the server it named.
#[derive(Clone, PartialEq, Eq)]
pub enum OAuthInput {
    /// The listener is open on this port, or why it could not be opened.
    Listening {
        /// The server.
        server: ServerSlot,
        /// The listener.
        listener: ListenerId,
        /// The port bound, or the OS error.
        result: Result<u16, String>,
    },
    /// A connection to the listener sent this request head (up to the blank line, or what
    /// arrived within the limits); answer with [`OAuthAction::Answer`].
    Callback {
        /// The server.
        server: ServerSlot,
        /// The listener.
        listener: ListenerId,
        /// The connection, numbered by the runtime.
        connection: u64,
        /// The request head's bytes.
        head: Vec<u8>,
    },
    /// The content of a token file (`Ok(None)`: there is none), or why it could not be read.
    TokenFile {
        /// The server.
        server: ServerSlot,
        /// The file name.
        file: String,
        /// The bytes, or the OS error.
        result: Result<Option<Vec<u8>>, String>,
    },
    /// A token file was written (or why not).
    TokenFileWritten {
        /// The server.
        server: ServerSlot,
        /// The file name.
        file: String,
        /// `Err`: the OS error.
        result: Result<(), String>,
    },
    /// The browser was started, or why not.
    Browser {
        /// The server.
        server: ServerSlot,
        /// `Err`: the OS error.
        result: Result<(), String>,
    },
}

impl OAuthInput {
    /// The server the input is for.
    #[must_use]
    pub fn server(&self) -> ServerSlot {
        match self {
            OAuthInput::Listening { server, .. }
            | OAuthInput::Callback { server, .. }
            | OAuthInput::TokenFile { server, .. }
            | OAuthInput::TokenFileWritten { server, .. }
            | OAuthInput::Browser { server, .. } => *server,
        }
    }
}

impl fmt::Debug for OAuthAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OAuthAction::Listen {
                server,
                listener,
                port,
            } => write!(f, "Listen({server}, {listener}, {port})"),
            OAuthAction::Answer {
                server,
                listener,
                connection,
                response,
            } => write!(
                f,
                "Answer({server}, {listener}, #{connection}, {} B)",
                response.len()
            ),
            OAuthAction::StopListening { server, listener } => {
                write!(f, "StopListening({server}, {listener})")
            }
            OAuthAction::ReadTokenFile { server, file } => {
                write!(f, "ReadTokenFile({server}, {file})")
            }
            OAuthAction::WriteTokenFile {
                server,
                file,
                bytes,
            } => write!(f, "WriteTokenFile({server}, {file}, {} B)", bytes.len()),
            OAuthAction::OpenBrowser { server, argv } => write!(
                f,
                "OpenBrowser({server}, {})",
                argv.first().map_or("", String::as_str)
            ),
        }
    }
}

impl fmt::Debug for OAuthInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OAuthInput::Listening {
                server,
                listener,
                result,
            } => write!(f, "Listening({server}, {listener}, {result:?})"),
            OAuthInput::Callback {
                server,
                listener,
                connection,
                head,
            } => write!(
                f,
                "Callback({server}, {listener}, #{connection}, {} B)",
                head.len()
            ),
            OAuthInput::TokenFile {
                server,
                file,
                result,
            } => match result {
                Ok(Some(b)) => write!(f, "TokenFile({server}, {file}, {} B)", b.len()),
                Ok(None) => write!(f, "TokenFile({server}, {file}, none)"),
                Err(e) => write!(f, "TokenFile({server}, {file}, error {e})"),
            },
            OAuthInput::TokenFileWritten {
                server,
                file,
                result,
            } => write!(f, "TokenFileWritten({server}, {file}, {result:?})"),
            OAuthInput::Browser { server, result } => write!(f, "Browser({server}, {result:?})"),
        }
    }
}

/// How [`Action::OpenTranscript`] opens a session's transcript file (SPEC A9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// A new session's file: create it, failing if it exists (`O_CREAT | O_EXCL`), mode 0600,
    /// creating the state directory (mode 0700) when it is missing.
    Create,
    /// A stored session being loaded: open the existing file for reading and appending (never
    /// create it), not following a symbolic link.
    Existing,
}

/// Why a transcript file operation failed (SPEC A9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TranscriptError {
    /// [`OpenMode::Existing`]: the file (or the state directory) does not exist.
    NotFound,
    /// Another process (another agent) holds the file's lock: it is writing that session.
    Locked,
    /// Any other failure: the OS error, one line (`Permission denied (os error 13)`).
    Io(String),
}

/// What happened to a transcript file the core asked about, in the order asked.
#[derive(Clone, PartialEq, Eq)]
pub enum TranscriptEvent {
    /// [`Action::OpenTranscript`] succeeded: the file is open and locked for this process.
    Opened,
    /// The next bytes of the file after [`Action::ReadTranscript`], from its first byte, in
    /// order, split anywhere.
    Bytes(Vec<u8>),
    /// The whole file was read.
    End,
    /// [`Action::SyncTranscript`] with this mark is done: everything appended before it is on
    /// the disk. One `Synced(m)` answers every sync asked with a mark up to `m` (the runtime
    /// may sync once for several).
    Synced(u64),
    /// An open, read, append, truncate or sync failed. After a failed open the file is not
    /// held; after a failed write or sync the runtime ignores later writes to it.
    Failed(TranscriptError),
}

impl fmt::Debug for TranscriptEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TranscriptEvent::Opened => write!(f, "Opened"),
            TranscriptEvent::Bytes(b) => write!(f, "Bytes({} B)", b.len()),
            TranscriptEvent::End => write!(f, "End"),
            TranscriptEvent::Synced(m) => write!(f, "Synced({m})"),
            TranscriptEvent::Failed(e) => write!(f, "Failed({e:?})"),
        }
    }
}

/// One file of the state directory, as [`Action::ListTranscripts`] reports it.
#[derive(Clone, PartialEq, Eq)]
pub struct TranscriptEntry {
    /// The file name (`sess_….jsonl`).
    pub name: String,
    /// Its last modification, in milliseconds since the Unix epoch (wall clock, from the file
    /// system).
    pub modified_ms: u64,
    /// Its first line without the newline, or as many bytes as were read of it (at most
    /// [`TRANSCRIPT_HEAD_BYTES`]).
    pub head: Vec<u8>,
}

impl fmt::Debug for TranscriptEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} @{} ({} B head)",
            self.name,
            self.modified_ms,
            self.head.len()
        )
    }
}

/// The most bytes of a transcript's first line the runtime reads for
/// [`Action::ListTranscripts`]; the header line of a file this agent wrote is shorter.
pub const TRANSCRIPT_HEAD_BYTES: usize = 8 * 1024;

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Input::AcpBytes(b) => write!(f, "AcpBytes({} B)", b.len()),
            Input::AcpEof => write!(f, "AcpEof"),
            Input::ShutdownSignal => write!(f, "ShutdownSignal"),
            Input::AcpWriteFailed => write!(f, "AcpWriteFailed"),
            Input::McpSpawned { proc } => write!(f, "McpSpawned({proc})"),
            Input::McpSpawnFailed { proc, error } => write!(f, "McpSpawnFailed({proc}, {error})"),
            Input::McpBytes { proc, bytes } => write!(f, "McpBytes({proc}, {} B)", bytes.len()),
            Input::McpStdoutClosed { proc } => write!(f, "McpStdoutClosed({proc})"),
            Input::McpStderrLine { proc, line } => {
                write!(f, "McpStderrLine({proc}, {} B)", line.len())
            }
            Input::McpExited { proc, status } => write!(f, "McpExited({proc}, {status})"),
            Input::McpWriteFailed { proc } => write!(f, "McpWriteFailed({proc})"),
            Input::McpStdinFull { proc } => write!(f, "McpStdinFull({proc})"),
            Input::Llm { call, event } => write!(f, "Llm({call}, {event:?})"),
            Input::Http { exchange, event } => write!(f, "Http({exchange}, {event:?})"),
            Input::Transcript { file, event } => write!(f, "Transcript({file}, {event:?})"),
            Input::TranscriptList { request, entries } => match entries {
                Ok(e) => write!(f, "TranscriptList(#{request}, {} files)", e.len()),
                Err(e) => write!(f, "TranscriptList(#{request}, error {e})"),
            },
            Input::ProjectRead { request, files } => write!(
                f,
                "ProjectRead(#{request}, {} instruction file(s), {} skill folder(s))",
                files.instructions.len(),
                files.skills.len()
            ),
            Input::OAuth(i) => write!(f, "OAuth({i:?})"),
        }
    }
}

/// Longest MCP stderr line the runtimes forward, in bytes; the rest of a longer line is dropped
/// (SPEC P2, C52).
pub const MAX_STDERR_LINE_BYTES: usize = 16 * 1024;

/// Appended to a stderr line that was cut at the cap (counted within the cap).
pub const STDERR_CUT_MARKER: &str = "\u{2026}";

/// Splits a child's stderr byte stream into the lines of `Input::McpStderrLine` (SPEC M1, P2,
/// L9, C52), whatever the chunking, in constant memory.
///
/// - Lines end at `\n`; one trailing `\r` is removed; every line, blank ones included, is
///   emitted (stderr is free text).
/// - Bytes are decoded lossily (invalid UTF-8 becomes U+FFFD, C36/L9).
/// - A line longer than the cap is emitted as soon as the cap is reached, cut on a character
///   boundary and ending with [`STDERR_CUT_MARKER`] (at most `cap` bytes in all); the rest of it,
///   up to and including its `\n`, is skipped without being stored. At most `cap` bytes are
///   ever held.
///
/// The runtimes read stderr in chunks, [`push`](StderrLines::push) each chunk and send each
/// line as `Input::McpStderrLine`; at EOF, [`finish`](StderrLines::finish) gives the last
/// unterminated line.
#[derive(Debug, Clone)]
pub struct StderrLines {
    cap: usize,
    line: Vec<u8>,
    skipping: bool,
}

impl Default for StderrLines {
    fn default() -> Self {
        StderrLines::new(MAX_STDERR_LINE_BYTES)
    }
}

impl StderrLines {
    /// A splitter whose lines are at most `cap` bytes (the runtimes use
    /// [`MAX_STDERR_LINE_BYTES`]; a `cap` below the marker's length is raised to it).
    #[must_use]
    pub fn new(cap: usize) -> StderrLines {
        StderrLines {
            cap: cap.max(STDERR_CUT_MARKER.len()),
            line: Vec::new(),
            skipping: false,
        }
    }

    /// Feeds the next bytes (any split); complete (or cut) lines are appended to `out`.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<String>) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|&b| b == b'\n');
            let (head, rest) = match newline {
                Some(i) => (
                    chunk.get(..i).unwrap_or(&[]),
                    chunk.get(i + 1..).unwrap_or(&[]),
                ),
                None => (chunk, &[][..]),
            };
            if !self.skipping {
                let room = self.cap.saturating_sub(self.line.len());
                if head.len() > room {
                    self.line
                        .extend_from_slice(head.get(..room).unwrap_or(head));
                    out.push(self.cut_line());
                    self.skipping = true;
                } else {
                    self.line.extend_from_slice(head);
                }
            }
            if newline.is_some() {
                if !self.skipping {
                    let mut line = std::mem::take(&mut self.line);
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    out.push(String::from_utf8_lossy(&line).into_owned());
                }
                self.skipping = false;
            }
            chunk = rest;
        }
    }

    /// End of stream: the last line if it had no `\n` (and was not already emitted cut).
    pub fn finish(&mut self) -> Option<String> {
        let skipping = std::mem::replace(&mut self.skipping, false);
        let line = std::mem::take(&mut self.line);
        if skipping || line.is_empty() {
            None
        } else {
            Some(String::from_utf8_lossy(&line).into_owned())
        }
    }

    /// Bytes held for the unfinished line (at most the cap).
    #[must_use]
    pub fn pending_bytes(&self) -> usize {
        self.line.len()
    }

    /// The held bytes (exactly `cap`) as a cut line; the holder is emptied.
    fn cut_line(&mut self) -> String {
        let line = std::mem::take(&mut self.line);
        cut_with_marker(&String::from_utf8_lossy(&line), self.cap)
    }
}

/// `line` if it is at most `cap` bytes, else cut on a character boundary so that with
/// [`STDERR_CUT_MARKER`] appended it is at most `cap` bytes (SPEC P2: every forwarded stderr
/// line is capped). The core applies it to every `Input::McpStderrLine` with
/// [`MAX_STDERR_LINE_BYTES`]; runtimes that split stderr themselves can use it too.
#[must_use]
pub fn cap_stderr_line(line: &str, cap: usize) -> String {
    if line.len() <= cap {
        return line.to_owned();
    }
    cut_with_marker(line, cap)
}

/// `line` cut on a character boundary to `cap` bytes minus the marker, then the marker.
fn cut_with_marker(line: &str, cap: usize) -> String {
    let mut end = cap.saturating_sub(STDERR_CUT_MARKER.len());
    while end > 0 && !line.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + STDERR_CUT_MARKER.len());
    out.push_str(line.get(..end).unwrap_or(""));
    out.push_str(STDERR_CUT_MARKER);
    out
}

/// The human-readable exit status of `Input::McpExited` from what the OS reported: the exit
/// code, else the terminating signal (`exit status 3`, `killed by signal 9`).
#[must_use]
pub fn exit_description(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "unknown exit status".into(),
    }
}

/// How to start an MCP server (SPEC M1). The runtime spawns `command` with `args` in `cwd`, in a
/// new process group, with exactly `env` as its environment (the core already removed the
/// agent's own variables and merged the client's), stdin/stdout/stderr piped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// Server name from `session/new` (for logs).
    pub name: String,
    /// The program, as the client gave it (a path or a name looked up in `PATH`).
    pub command: String,
    /// Its arguments, in order.
    pub args: Vec<String>,
    /// The complete environment of the child, `(name, value)` sorted by name.
    pub env: Vec<(String, String)>,
    /// The working directory: the session's absolute `cwd` (SPEC A2).
    pub cwd: String,
}

/// Signals the core may ask to send to a child's process group (`killpg`, SPEC M8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: please exit.
    Term,
    /// SIGKILL: the grace is over.
    Kill,
}

/// One log line for stderr (SPEC T2, P2). The runtime writes [`LogRecord::render`] verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its severity (already at or above `BUZZ_AGENT_LOG`: the core drops the others).
    pub level: LogLevel,
    /// Core time when it was produced.
    pub at: crate::time::MonoTime,
    /// The text, one logical line (a newline in it is escaped by `render`); never a secret
    /// (SPEC P2).
    pub message: String,
}

impl LogRecord {
    /// The stderr line (with `\n`), in the configured format (`BUZZ_AGENT_LOG_FORMAT`). Either
    /// way one record is one line, and no control character of the message reaches stderr raw
    /// (SPEC S6: a server's stderr, log notifications, tool names are peers' text): the text
    /// format writes them as visible escapes ([`crate::text::escape_controls`]), the JSON
    /// format as `\u` escapes.
    #[must_use]
    pub fn render(&self, format: crate::config::LogFormat) -> String {
        let level = match self.level {
            LogLevel::Error => "ERROR",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
            LogLevel::Trace => "TRACE",
        };
        match format {
            crate::config::LogFormat::Text => {
                format!(
                    "buzz-agent {} {level:<5} {}\n",
                    self.at,
                    crate::text::escape_controls(&self.message, &[])
                )
            }
            crate::config::LogFormat::Json => {
                let v = serde_json::json!({
                    "t_ms": self.at.as_ms(),
                    "level": level.to_ascii_lowercase(),
                    "msg": self.message,
                });
                // serde_json escapes ASCII controls; 0x80–0x9F controls and U+2028/U+2029 are written
                // raw, so they are escaped here too (the same JSON value).
                format!("{}\n", crate::text::escape_json_controls(&v.to_string()))
            }
        }
    }
}

/// A request to the runtime, from [`Agent::poll_action`](crate::Agent::poll_action). Starting
/// one never waits for its result: results come back as [`Input`]s. Exhaustive on purpose: a
/// new variant must break both runtimes' builds.
#[derive(Clone, PartialEq, Eq)]
pub enum Action {
    /// Write one complete ACP line (a JSON-RPC message ending with `\n`) to stdout (SPEC T1,
    /// T2). A failed write is reported as [`Input::AcpWriteFailed`].
    WriteAcp(String),
    /// Write one complete line (ending with `\n`) to a server's stdin. A failed write is
    /// reported as [`Input::McpWriteFailed`].
    WriteMcp {
        /// The process.
        proc: ProcKey,
        /// The line.
        line: String,
    },
    /// Spawn a server in a new process group; answer with [`Input::McpSpawned`] or
    /// [`Input::McpSpawnFailed`], then report its stdout, stderr and exit (SPEC M1).
    SpawnMcp {
        /// The key of the new process (a new generation for a restart, SPEC M9).
        proc: ProcKey,
        /// How to start it.
        spec: SpawnSpec,
    },
    /// Close a server's stdin (the polite shutdown request, SPEC M8).
    CloseMcpStdin {
        /// The process.
        proc: ProcKey,
    },
    /// Signal the server's whole process group (`killpg`), even if the leader already exited
    /// (grandchildren, SPEC M8). Unknown groups are ignored by the runtime; a group whose
    /// leader it reaped is not signalled as a group again (its id may be another process's),
    /// its members left behind are signalled one by one (SPEC S7).
    SignalProcessGroup {
        /// The process whose group is signalled.
        proc: ProcKey,
        /// Which signal.
        signal: Signal,
    },
    /// Start an HTTP request and report it as [`Input::Llm`] events, body chunks as they
    /// arrive (SSE text reaches the client as it streams).
    CallLlm {
        /// The call's id, echoed in every event.
        call: LlmCallId,
        /// The request to send verbatim.
        request: HttpRequest,
    },
    /// The core is done with this call (finished or abandoned): drop the HTTP request; events
    /// for it that still arrive are ignored.
    CancelLlm {
        /// The call.
        call: LlmCallId,
    },
    /// Start an HTTP exchange for an MCP server (SPEC M10) with the core's codec
    /// ([`crate::http::Exchange`]) and report it as [`Input::Http`] events, body chunks as they
    /// arrive. Redirects are never followed.
    Http {
        /// The exchange's id, echoed in every event.
        exchange: ExchangeId,
        /// The request to send.
        request: crate::http::Request,
    },
    /// The core is done with this exchange: drop it (an event stream is closed); events for it
    /// that still arrive are ignored.
    CancelHttp {
        /// The exchange.
        exchange: ExchangeId,
    },
    /// Open a session's transcript file `name` directly inside the state directory
    /// ([`Config::state_dir`](crate::Config::state_dir); `name` never holds a `/`) and take
    /// its exclusive lock (`flock`, released when the file is closed or the process dies).
    /// Answer with [`TranscriptEvent::Opened`] or [`TranscriptEvent::Failed`] (SPEC A9).
    OpenTranscript {
        /// The handle later actions use.
        file: TranscriptId,
        /// The file name (`sess_….jsonl`).
        name: String,
        /// Create a new file or open an existing one.
        mode: OpenMode,
    },
    /// Read the open file from its first byte and report it as [`TranscriptEvent::Bytes`]
    /// chunks, then [`TranscriptEvent::End`] (or `Failed`).
    ReadTranscript {
        /// The file.
        file: TranscriptId,
    },
    /// Append `bytes` (whole JSON lines) to the open file at once, before the ACP lines of the
    /// same step reach stdout (`write(2)`, no sync): once written, a crash of the process
    /// loses none of it; an OS crash or power loss may, until [`Action::SyncTranscript`]
    /// (SPEC A9). A failure is reported as [`TranscriptEvent::Failed`]. Ignored for a file
    /// that is not open (its open failed).
    AppendTranscript {
        /// The file.
        file: TranscriptId,
        /// The bytes to append.
        bytes: Vec<u8>,
    },
    /// Make everything appended to the open file before this action durable (`fdatasync(2)`;
    /// for a file created by this process, its directory entry too, once), off the loop, then
    /// answer [`TranscriptEvent::Synced`] with `mark` (or `Failed`). SPEC A9: once per
    /// answered prompt and at close, never per round. Ignored for a file that is not open.
    SyncTranscript {
        /// The file.
        file: TranscriptId,
        /// A number to echo: the core's count of the bytes it had appended.
        mark: u64,
    },
    /// Cut the open file to its first `len` bytes (a torn last line left by a crash, before
    /// the first append after a load).
    TruncateTranscript {
        /// The file.
        file: TranscriptId,
        /// The length to keep, bytes.
        len: u64,
    },
    /// Close the file (releasing its lock). Unknown files are ignored.
    CloseTranscript {
        /// The file.
        file: TranscriptId,
    },
    /// List the state directory: answer with [`Input::TranscriptList`] (SPEC A9,
    /// `session/list`).
    ListTranscripts {
        /// A number to echo.
        request: u64,
    },
    /// Read a session's project instructions and skills as `spec` says, bounded (see
    /// [`crate::project`]); answer with [`Input::ProjectRead`] (SPEC A10). Blocking file IO:
    /// off the loop.
    ReadProject {
        /// A number to echo.
        request: u64,
        /// What to read.
        spec: ReadSpec,
    },
    /// Do this part of an MCP server's authorization (SPEC M11).
    OAuth(OAuthAction),
    /// Write a log line to stderr ([`LogRecord::render`] gives its text).
    Log(LogRecord),
    /// Exit the process with this status after flushing stdout (SPEC P1: 0 after a clean
    /// shutdown). The last action the agent asks for.
    Exit {
        /// The exit status.
        code: i32,
    },
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::WriteAcp(l) => write!(f, "WriteAcp({})", l.trim_end()),
            Action::WriteMcp { proc, line } => write!(f, "WriteMcp({proc}, {})", line.trim_end()),
            Action::SpawnMcp { proc, spec } => {
                write!(f, "SpawnMcp({proc}, {} {:?})", spec.command, spec.args)
            }
            Action::CloseMcpStdin { proc } => write!(f, "CloseMcpStdin({proc})"),
            Action::SignalProcessGroup { proc, signal } => write!(f, "Signal({proc}, {signal:?})"),
            Action::CallLlm { call, request } => write!(f, "CallLlm({call}, {request:?})"),
            Action::CancelLlm { call } => write!(f, "CancelLlm({call})"),
            Action::Http { exchange, request } => write!(f, "Http({exchange}, {request:?})"),
            Action::CancelHttp { exchange } => write!(f, "CancelHttp({exchange})"),
            Action::OpenTranscript { file, name, mode } => {
                write!(f, "OpenTranscript({file}, {name}, {mode:?})")
            }
            Action::ReadTranscript { file } => write!(f, "ReadTranscript({file})"),
            Action::AppendTranscript { file, bytes } => {
                write!(f, "AppendTranscript({file}, {} B)", bytes.len())
            }
            Action::SyncTranscript { file, mark } => write!(f, "SyncTranscript({file}, {mark})"),
            Action::TruncateTranscript { file, len } => {
                write!(f, "TruncateTranscript({file}, {len})")
            }
            Action::CloseTranscript { file } => write!(f, "CloseTranscript({file})"),
            Action::ListTranscripts { request } => write!(f, "ListTranscripts(#{request})"),
            Action::ReadProject { request, spec } => {
                write!(f, "ReadProject(#{request}, {})", spec.cwd)
            }
            Action::OAuth(a) => write!(f, "OAuth({a:?})"),
            Action::Log(r) => write!(f, "Log({:?}, {})", r.level, r.message),
            Action::Exit { code } => write!(f, "Exit({code})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(cap: usize, chunks: &[&[u8]]) -> (Vec<String>, Option<String>) {
        let mut s = StderrLines::new(cap);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
            assert!(s.pending_bytes() <= cap.max(STDERR_CUT_MARKER.len()));
        }
        let last = s.finish();
        (out, last)
    }

    #[test]
    fn c36_invalid_utf8_on_stderr_is_decoded_lossily() {
        let (lines, last) = split(64, &[b"caf\xE9 \xB0\xA1\r\nok\n", b"tail\xFF"]);
        assert_eq!(lines, vec!["caf\u{FFFD} \u{FFFD}\u{FFFD}", "ok"]);
        assert_eq!(last.as_deref(), Some("tail\u{FFFD}"));
    }

    #[test]
    fn c52_an_endless_stderr_line_is_cut_at_the_cap_and_the_rest_skipped_without_buffering() {
        let mut s = StderrLines::new(MAX_STDERR_LINE_BYTES);
        let mut out = Vec::new();
        let chunk = vec![b'x'; 64 * 1024];
        // 100 MiB without a newline: memory held never exceeds the cap.
        for _ in 0..1600 {
            s.push(&chunk, &mut out);
            assert!(s.pending_bytes() <= MAX_STDERR_LINE_BYTES);
        }
        assert_eq!(out.len(), 1, "the cut line is forwarded once, at once");
        assert!(out[0].len() <= MAX_STDERR_LINE_BYTES);
        assert!(out[0].ends_with(STDERR_CUT_MARKER) && out[0].starts_with("xxxx"));
        s.push(b"xxx\nnext line\n", &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1], "next line");
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn c52_a_line_of_exactly_the_cap_is_whole_and_one_more_byte_is_cut() {
        let cap = 16;
        let exact = "a".repeat(cap);
        assert_eq!(
            split(cap, &[exact.as_bytes(), b"\n"]).0,
            vec![exact.clone()]
        );
        let (lines, _) = split(cap, &[exact.as_bytes(), b"b\n"]);
        assert_eq!(
            lines,
            vec![format!("{}{STDERR_CUT_MARKER}", "a".repeat(cap - 3))]
        );
    }

    #[test]
    fn c52_cap_stderr_line_cuts_on_a_character_boundary() {
        assert_eq!(cap_stderr_line("short", 16), "short");
        let cut = cap_stderr_line(&"é".repeat(20), 16);
        assert!(cut.len() <= 16 && cut.ends_with(STDERR_CUT_MARKER), "{cut}");
        assert_eq!(cut, format!("{}{STDERR_CUT_MARKER}", "é".repeat(6)));
    }

    proptest! {
        #[test]
        fn c52_any_split_gives_the_same_capped_lines(
            bytes in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(0xE9u8), Just(b'a'), any::<u8>()], 0..300),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
            cap in 0usize..40,
        ) {
            let whole = split(cap, &[&bytes]);
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&bytes[start..p]);
                start = p;
            }
            chunks.push(&bytes[start..]);
            prop_assert_eq!(split(cap, &chunks), whole.clone());
            let limit = cap.max(STDERR_CUT_MARKER.len());
            for l in whole.0.iter().chain(whole.1.iter()) {
                prop_assert!(!l.contains('\n'));
                // Lossy decoding may widen invalid bytes (1 byte → 3); the cap holds for cut lines.
                if l.ends_with(STDERR_CUT_MARKER) {
                    prop_assert!(l.len() <= limit);
                }
            }
        }
    }

    #[test]
    fn c52_the_splitter_holds_only_the_unfinished_line() {
        let mut s = StderrLines::new(16);
        let mut out = Vec::new();
        s.push(b"abc", &mut out);
        assert_eq!(s.pending_bytes(), 3);
        s.push(b"de\nf", &mut out);
        assert_eq!(out, vec!["abcde"]);
        assert_eq!(
            s.pending_bytes(),
            1,
            "only the bytes after the newline are held"
        );
        s.push(&[b'x'; 40], &mut out);
        assert_eq!(
            s.pending_bytes(),
            0,
            "a cut line is forwarded at once, its rest skipped"
        );
    }

    #[test]
    fn p2_c52_the_runtimes_splitter_forwards_a_16_kib_line_whole_and_cuts_a_longer_one() {
        let exact = "y".repeat(16 * 1024);
        let mut s = StderrLines::default();
        let mut out = Vec::new();
        s.push(format!("{exact}\n{exact}z\n").as_bytes(), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], exact, "16 KiB is within the cap");
        assert_eq!(out[1].len(), 16 * 1024);
        assert!(out[1].ends_with(STDERR_CUT_MARKER) && out[1].starts_with("yyyy"));
        assert_eq!(cap_stderr_line(&exact, MAX_STDERR_LINE_BYTES), exact);
    }

    #[test]
    fn m7_an_exit_is_described_by_its_code_else_its_signal() {
        assert_eq!(exit_description(Some(3), None), "exit status 3");
        assert_eq!(exit_description(Some(0), Some(9)), "exit status 0");
        assert_eq!(exit_description(None, Some(9)), "killed by signal 9");
        assert_eq!(exit_description(None, None), "unknown exit status");
    }

    #[test]
    fn t2_a_log_record_renders_as_one_stderr_line_of_text_or_json() {
        let record = |level| LogRecord {
            level,
            at: crate::time::MonoTime::ZERO.plus_ms(1_234),
            message: "two\nlines \"q\"".into(),
        };
        use crate::config::LogFormat;
        assert_eq!(
            record(LogLevel::Warn).render(LogFormat::Text),
            "buzz-agent +1.234s WARN  two\\nlines \"q\"\n"
        );
        let levels = [
            (LogLevel::Error, "ERROR", "error"),
            (LogLevel::Warn, "WARN", "warn"),
            (LogLevel::Info, "INFO", "info"),
            (LogLevel::Debug, "DEBUG", "debug"),
            (LogLevel::Trace, "TRACE", "trace"),
        ];
        for (level, text, json) in levels {
            let line = record(level).render(LogFormat::Text);
            assert!(
                line.starts_with(&format!("buzz-agent +1.234s {text:<5} two")),
                "{line}"
            );
            let line = record(level).render(LogFormat::Json);
            assert!(
                line.ends_with('\n') && line.matches('\n').count() == 1,
                "{line}"
            );
            let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object");
            assert_eq!(
                v,
                serde_json::json!({"t_ms": 1234, "level": json, "msg": "two\nlines \"q\""})
            );
        }
    }

    #[test]
    fn p2_debug_output_of_inputs_and_actions_shows_sizes_not_contents() {
        let proc = ProcKey {
            server: ServerSlot(2),
            generation: 1,
        };
        let secret = b"sk-secret".to_vec();
        let shown = [
            (
                format!(
                    "{:?}",
                    Input::Llm {
                        call: LlmCallId(4),
                        event: LlmEvent::Body(secret.clone())
                    }
                ),
                "Llm(llm#4, Body(9 B))",
            ),
            (
                format!(
                    "{:?}",
                    Input::Llm {
                        call: LlmCallId(4),
                        event: LlmEvent::Head {
                            status: 429,
                            headers: vec![("authorization".into(), "secret".into())]
                        }
                    }
                ),
                "Llm(llm#4, Head(429))",
            ),
            (
                format!("{:?}", LlmEvent::Failed("reset".into())),
                "Failed(reset)",
            ),
            (format!("{:?}", LlmEvent::End), "End"),
            (
                format!(
                    "{:?}",
                    Input::Transcript {
                        file: TranscriptId(7),
                        event: TranscriptEvent::Bytes(secret.clone())
                    }
                ),
                "Transcript(file#7, Bytes(9 B))",
            ),
            (
                format!("{:?}", TranscriptEvent::Failed(TranscriptError::Locked)),
                "Failed(Locked)",
            ),
            (
                format!(
                    "{:?}",
                    TranscriptEntry {
                        name: "sess_1.jsonl".into(),
                        modified_ms: 5,
                        head: secret.clone()
                    }
                ),
                "sess_1.jsonl @5 (9 B head)",
            ),
            (
                format!(
                    "{:?}",
                    Input::McpBytes {
                        proc,
                        bytes: secret.clone()
                    }
                ),
                "McpBytes(mcp#2.g1, 9 B)",
            ),
            (
                format!(
                    "{:?}",
                    Input::McpStderrLine {
                        proc,
                        line: "sk-secret".into()
                    }
                ),
                "McpStderrLine(mcp#2.g1, 9 B)",
            ),
            (
                format!("{:?}", Input::AcpBytes(secret.clone())),
                "AcpBytes(9 B)",
            ),
            (
                format!(
                    "{:?}",
                    Action::AppendTranscript {
                        file: TranscriptId(7),
                        bytes: secret
                    }
                ),
                "AppendTranscript(file#7, 9 B)",
            ),
            (
                format!("{:?}", Action::WriteAcp("{\"a\":1}\n".into())),
                "WriteAcp({\"a\":1})",
            ),
            (format!("{:?}", Action::Exit { code: 0 }), "Exit(0)"),
        ];
        for (debug, want) in shown {
            assert_eq!(debug, want);
        }
    }

    #[test]
    fn a9_the_header_of_a_transcript_fits_in_the_head_the_runtime_reads() {
        // The longest title (80 four-byte characters) and a cwd of PATH_MAX (4096) bytes.
        let header = crate::record::Record::Session {
            session_id: "sess_0123456789abcdef0123456789abcdef".into(),
            cwd: format!("/{}", "d".repeat(4095)),
            title: crate::store::title_of(&"𝄞".repeat(200)),
        };
        let mut line = Vec::new();
        header.write_line(&mut line);
        assert!(line.len() > 4096 + 320, "{}", line.len());
        assert!(
            line.len() <= TRANSCRIPT_HEAD_BYTES,
            "{} > {TRANSCRIPT_HEAD_BYTES}",
            line.len()
        );
    }
}
