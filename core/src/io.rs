//! Inputs (observations of the world) and actions (requests to the runtime), DESIGN.md
//! "The core's contract". Failures of the world are inputs, never `Err`s.

use crate::llm::HttpRequest;
use std::fmt;

/// A process the core asked for. `generation` grows at every (re)spawn of the same server, so
/// bytes or an exit from a killed process can never be mistaken for its restart (DESIGN ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcKey {
    /// Process-wide unique server slot (one per `mcpServers` entry of each session).
    pub server: u64,
    /// 0 for the first spawn, +1 per restart.
    pub generation: u32,
}

impl fmt::Display for ProcKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mcp#{}.g{}", self.server, self.generation)
    }
}

/// One LLM HTTP call (one attempt). Allocated from a counter by the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LlmCallId(pub u64);

impl fmt::Display for LlmCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "llm#{}", self.0)
    }
}

/// What the runtime observed of an LLM HTTP call, in order: `Head`, `Body`*, then `End` or
/// `Failed`. After `CancelLlm` the runtime may still deliver some; the core ignores them.
#[derive(Clone, PartialEq, Eq)]
pub enum LlmIo {
    /// Status line and headers (names lower-cased by the runtime).
    Head {
        status: u16,
        headers: Vec<(String, String)>,
    },
    /// The next chunk of the body, as read.
    Body(Vec<u8>),
    /// The body ended cleanly.
    End,
    /// Connection or IO failure (before or during the body): retryable (SPEC L5).
    Failed(String),
}

impl fmt::Debug for LlmIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LlmIo::Head { status, .. } => write!(f, "Head({status})"),
            LlmIo::Body(b) => write!(f, "Body({} B)", b.len()),
            LlmIo::End => write!(f, "End"),
            LlmIo::Failed(e) => write!(f, "Failed({e})"),
        }
    }
}

/// One observation from the world.
#[derive(Clone, PartialEq, Eq)]
pub enum Input {
    /// Bytes read from the agent's stdin (ACP client), split anywhere.
    AcpBytes(Vec<u8>),
    /// The agent's stdin reached EOF (SPEC P1).
    AcpEof,
    /// SIGTERM or SIGINT was received (SPEC P1).
    ShutdownSignal,
    /// A write to stdout failed (EPIPE: the client is gone) → shut down.
    AcpWriteFailed,
    /// The process of `SpawnMcp` is running.
    McpSpawned { proc: ProcKey },
    /// `SpawnMcp` failed (e.g. ENOENT); no process exists.
    McpSpawnFailed { proc: ProcKey, error: String },
    /// Bytes from a server's stdout.
    McpBytes { proc: ProcKey, bytes: Vec<u8> },
    /// A server's stdout reached EOF.
    McpStdoutClosed { proc: ProcKey },
    /// One line of a server's stderr (without the newline, lossily decoded, at most
    /// [`MAX_STDERR_LINE_BYTES`]).
    McpStderrLine { proc: ProcKey, line: String },
    /// The server process exited and was reaped; `status` is human readable
    /// (`exit status 3`, `killed by signal 9`).
    McpExited { proc: ProcKey, status: String },
    /// A write to a server's stdin failed (it is gone).
    McpWriteFailed { proc: ProcKey },
    /// Progress of an LLM call.
    Llm { call: LlmCallId, event: LlmIo },
}

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
            Input::Llm { call, event } => write!(f, "Llm({call}, {event:?})"),
        }
    }
}

/// Longest MCP stderr line the runtimes forward, in bytes; the rest of a longer line is dropped.
pub const MAX_STDERR_LINE_BYTES: usize = 16 * 1024;

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
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// Signals the core may ask to send to a child's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

/// Log severity, ordered from most to least severe.
pub use crate::config::LogLevel;

/// One log line for stderr (SPEC T2, P2). The runtime writes [`LogRecord::render`] verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub level: LogLevel,
    /// Core time when it was produced.
    pub at: crate::time::MonoTime,
    pub message: String,
}

impl LogRecord {
    /// The stderr line (with `\n`), in the configured format (`BUZZ_AGENT_LOG_FORMAT`).
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
                    self.message.replace('\n', "\\n")
                )
            }
            crate::config::LogFormat::Json => {
                let v = serde_json::json!({
                    "t_ms": self.at.as_ms(),
                    "level": level.to_ascii_lowercase(),
                    "msg": self.message,
                });
                format!("{v}\n")
            }
        }
    }
}

/// A request to the runtime. Exhaustive on purpose: a new variant must break both runtimes.
#[derive(Clone, PartialEq, Eq)]
pub enum Action {
    /// Write one complete ACP line (ends with `\n`) to stdout.
    WriteAcp(String),
    /// Write one complete line to a server's stdin.
    WriteMcp { proc: ProcKey, line: String },
    /// Spawn a server; answer with `McpSpawned` or `McpSpawnFailed`, then stream its IO.
    SpawnMcp { proc: ProcKey, spec: SpawnSpec },
    /// Close a server's stdin (the polite shutdown request, SPEC M8).
    CloseMcpStdin { proc: ProcKey },
    /// Signal the server's whole process group (`killpg`), even if the leader already exited.
    SignalProcessGroup { proc: ProcKey, signal: Signal },
    /// Start an HTTP request and report it as `Input::Llm` events.
    CallLlm {
        call: LlmCallId,
        request: HttpRequest,
    },
    /// The core is done with this call (finished or abandoned): drop the HTTP request; events
    /// for it that still arrive are ignored.
    CancelLlm { call: LlmCallId },
    /// Write a log line to stderr.
    Log(LogRecord),
    /// Exit the process with this status after flushing stdout.
    Exit { code: i32 },
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
            Action::Log(r) => write!(f, "Log({:?}, {})", r.level, r.message),
            Action::Exit { code } => write!(f, "Exit({code})"),
        }
    }
}
