//! The one simulated world of the core (DESIGN "Testing pyramid"): no async, no processes, no
//! clock. It owns an [`Agent`] and a virtual clock and plays every peer:
//!
//! * the ACP client (helpers to send `initialize`, `session/new`, `session/prompt`,
//!   `session/cancel`, raw bytes; it answers `session/request_permission` like a user would, or
//!   holds the request for the driver: [`World::permission_delay_ms`]);
//! * the MCP servers (a [`ServerSpec`] per `mcpServers` entry: handshake, `tools/list`, an `echo`
//!   tool, hook tools answering from a per-server script of [`HookReply`]s, or every call held
//!   for the driver to answer: [`ServerSpec::held`]);
//! * the LLM (a script of [`LlmReply`]s answered with OpenAI Chat SSE bodies; a
//!   [`LlmReply::Never`] call is held for the driver, [`World::held_llm`], which may answer it
//!   with any route's body: [`llm_body`]);
//! * the OS (spawn → `McpSpawned`, signals → `McpExited`) and the state directory
//!   ([`FakeDisk`]).
//!
//! Two drivers run it: the core's property, snapshot and scenario tests (`core/tests/support`
//! re-exports this module) and the `session` fuzz target ([`super::session`]), which holds
//! every call and answers them from its byte script.
//!
//! Drain rule: after every `handle*` the world drains `poll_action` fully, reacting to each action
//! by scheduling inputs; time only advances to the next scheduled input or `poll_timeout`.
//! Everything is recorded: [`World::steps`] (input + the actions it produced, for model checkers
//! and I12) and a readable [`World::transcript`] (`+2.500s -> mcp#1.g0 #4 tools/call _Stop …`),
//! where `->` is "the agent sends" and `<-` is "the agent receives" (off when
//! [`World::record`] is false, as the fuzz target runs it).
//!
//! Every action is checked as it is drained: [`super::check_action`] (one line of strict JSON
//! per frame, T1, L3b) and [`Invariants`] (I1, I7–I11); [`World::finish`] closes the run with
//! I7's "every request answered exactly once", and [`Invariants::same_runs`] compares two runs
//! (I12). A test or a fuzz input that breaks one panics with the invariant's id.
#![allow(
    clippy::collapsible_if,
    clippy::wildcard_enum_match_arm,
    reason = "a test world: the peers answer what they know and note the rest"
)]

use super::check_action;
use super::invariants::Invariants;
use crate::config::{HookAllowlist, LogLevel, PermissionMode, ProviderKind};
use crate::{
    Action, Agent, Config, Input, LlmCallId, LlmEvent, LogRecord, MonoTime, OpenMode, ProcKey,
    Signal, TRANSCRIPT_HEAD_BYTES, TranscriptEntry, TranscriptError, TranscriptEvent, TranscriptId,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Notes a transcript line, formatted only when the world keeps a transcript.
macro_rules! note {
    ($w:expr, $($arg:tt)*) => {
        if $w.record {
            let line = format!($($arg)*);
            $w.note(line);
        }
    };
}

/// Base URL of the fake LLM (never contacted: the world answers `CallLlm` itself).
pub const LLM_BASE: &str = "http://llm.test/v1";
/// The session cwd used by [`World::new_session`].
pub const CWD: &str = "/work/project";
/// Virtual delay between SIGTERM of a group and the exit of its (well-behaved) leader.
pub const TERM_EXIT_MS: u64 = 5;

/// One scripted LLM answer, popped for each `CallLlm` (the default answers when the script is
/// exhausted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LlmReply {
    /// A text-only response ending the turn (`finish_reason: stop`).
    Text {
        /// The text delta.
        text: String,
        /// How long after the request the whole body arrives.
        delay_ms: u64,
    },
    /// A text-only response with another `finish_reason` (`length`, `content_filter`).
    Finish {
        /// The text delta.
        text: String,
        /// The `finish_reason`.
        finish: String,
        /// How long after the request the whole body arrives.
        delay_ms: u64,
    },
    /// A response asking for tools: `(name, raw arguments)` (`finish_reason: tool_calls`).
    Tools {
        /// The calls asked for: `(name, raw arguments)`.
        calls: Vec<(String, String)>,
        /// How long after the request the whole body arrives.
        delay_ms: u64,
    },
    /// An HTTP error status with a JSON error body.
    Status {
        /// The HTTP status.
        status: u16,
        /// How long after the request the answer arrives.
        delay_ms: u64,
    },
    /// No answer from the script: the call is held ([`World::held_llm`]) for the driver to
    /// answer; otherwise the idle timeout fires.
    Never,
    /// A status and a body sent verbatim (any route's SSE, or a provider's own error body).
    Raw {
        /// The HTTP status.
        status: u16,
        /// The body, verbatim.
        body: String,
    },
    /// A 200 answer streamed in pieces: each `(delay_ms, text)` is one text delta sent that
    /// long after the request; then, if `finish` is set, the `finish_reason`, `[DONE]` and the
    /// end of the body at the last delta's time. With `finish: None` the stream stalls after
    /// the last delta (the idle timeout, or a cancel, ends it).
    Stream {
        /// `(ms after the request, text)` of each delta.
        deltas: Vec<(u64, String)>,
        /// The `finish_reason` after the last delta, or a stall.
        finish: Option<String>,
    },
}

impl LlmReply {
    /// A text answer ending the turn, at once.
    #[must_use]
    pub fn text(t: &str) -> Self {
        LlmReply::Text {
            text: t.to_string(),
            delay_ms: 0,
        }
    }

    /// One tool call `name(args)`, at once.
    #[must_use]
    pub fn tool(name: &str, args: &str) -> Self {
        LlmReply::Tools {
            calls: vec![(name.to_string(), args.to_string())],
            delay_ms: 0,
        }
    }
}

/// What a hook call answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookKind {
    /// A text result (an objection when non-blank).
    Text(String),
    /// A blank text result.
    Empty,
    /// A JSON-RPC error reply.
    RpcError,
    /// A result with `isError: true`.
    IsError,
    /// The server process exits (after the delay) instead of answering.
    Exit,
    /// No answer, ever.
    Never,
}

/// One scripted hook answer, after `delay_ms` of virtual time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookReply {
    /// What is answered.
    pub kind: HookKind,
    /// After how long.
    pub delay_ms: u64,
}

impl HookReply {
    /// `kind` at once.
    #[must_use]
    pub fn now(kind: HookKind) -> Self {
        HookReply { kind, delay_ms: 0 }
    }

    /// `kind` after `delay_ms`.
    #[must_use]
    pub fn after(kind: HookKind, delay_ms: u64) -> Self {
        HookReply { kind, delay_ms }
    }

    /// An objection with `text`, at once.
    #[must_use]
    pub fn objection(text: &str) -> Self {
        HookReply::now(HookKind::Text(text.to_string()))
    }
}

/// A fake MCP server: its name in `session/new`, its tools, its hooks and scripts.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// The server's name in `mcpServers`.
    pub name: String,
    /// Model-visible tools (each answers `echo: <arguments>`).
    pub tools: Vec<String>,
    /// Hook tools (bare names starting with `_`).
    pub hooks: Vec<String>,
    /// Delay of model tool-call answers.
    pub tool_delay_ms: u64,
    /// Hook answers, one per hook call, in order.
    pub hook_script: VecDeque<HookReply>,
    /// The answer once the script is exhausted.
    pub hook_default: HookReply,
    /// `Some(line)`: model tool calls are answered with this raw line (without its newline),
    /// `@ID@` replaced by the request id; written as is (invalid UTF-8 stays invalid, C36).
    pub tool_reply_raw: Option<Vec<u8>>,
    /// Fixed answers of named hooks (e.g. `_SessionStart`), used instead of the script.
    pub hook_by_name: BTreeMap<String, HookReply>,
    /// `Some(config)`: the server is also an interceptor server running the core's example
    /// server with this configuration (`interceptors/list`, `interceptor/invoke`, SPEC X1).
    pub interceptors: Option<Value>,
    /// Tool name → its `annotations` in `tools/list` (e.g. `destructiveHint`).
    pub annotations: BTreeMap<String, Value>,
    /// Every `tools/call` (tool or hook) is held unanswered for the driver
    /// ([`World::held_calls`], [`World::take_held_call`]) instead of answered from the spec.
    pub held: bool,
}

impl ServerSpec {
    /// A server with an `echo` tool and the given hooks, whose hooks answer blank by default.
    #[must_use]
    pub fn new(name: &str, hooks: &[&str]) -> Self {
        ServerSpec {
            name: name.to_string(),
            tools: vec!["echo".to_string()],
            hooks: hooks.iter().map(|h| (*h).to_string()).collect(),
            tool_delay_ms: 0,
            hook_script: VecDeque::new(),
            hook_default: HookReply::now(HookKind::Empty),
            tool_reply_raw: None,
            hook_by_name: BTreeMap::new(),
            interceptors: None,
            annotations: BTreeMap::new(),
            held: false,
        }
    }

    /// Adds the model tool `name` with these `annotations`.
    #[must_use]
    pub fn tool_with(mut self, name: &str, annotations: Value) -> Self {
        self.tools.push(name.to_string());
        self.annotations.insert(name.to_string(), annotations);
        self
    }

    /// Holds every `tools/call` for the driver (see [`ServerSpec::held`]).
    #[must_use]
    pub fn held(mut self) -> Self {
        self.held = true;
        self
    }

    /// The hook `hook` always answers `reply` (the script is for the other hooks).
    #[must_use]
    pub fn hook_reply(mut self, hook: &str, reply: HookReply) -> Self {
        self.hook_by_name.insert(hook.to_string(), reply);
        self
    }

    /// The server is also an interceptor server with the example server's `config`.
    #[must_use]
    pub fn interceptors(mut self, config: Value) -> Self {
        self.interceptors = Some(config);
        self
    }

    /// Answer model tool calls with `raw` as the result text, byte for byte.
    #[must_use]
    pub fn tool_text_raw(self, raw: &[u8]) -> Self {
        let mut line =
            b"{\"jsonrpc\":\"2.0\",\"id\":@ID@,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\""
                .to_vec();
        line.extend_from_slice(raw);
        line.extend_from_slice(b"\"}]}}");
        self.tool_reply_raw(&line)
    }

    /// Answer model tool calls with the raw `line` (`@ID@` replaced by the request id).
    #[must_use]
    pub fn tool_reply_raw(mut self, line: &[u8]) -> Self {
        self.tool_reply_raw = Some(line.to_vec());
        self
    }

    /// The hook answers, one per hook call, in order.
    #[must_use]
    pub fn script(mut self, replies: impl IntoIterator<Item = HookReply>) -> Self {
        self.hook_script = replies.into_iter().collect();
        self
    }

    /// The hook answer once the script is exhausted.
    #[must_use]
    pub fn default_reply(mut self, r: HookReply) -> Self {
        self.hook_default = r;
        self
    }
}

/// The state directory of the simulated runtime (SPEC A9): the transcript files by name. A
/// world's agent opens, appends, truncates, reads and lists them as the runtime would; a
/// disk can be handed to a new world (a new agent process) to load what the first wrote.
#[derive(Clone, Debug, Default)]
pub struct FakeDisk {
    /// File name → (bytes, last modification in ms since the epoch).
    pub files: BTreeMap<String, (Vec<u8>, u64)>,
    /// Files another process holds locked.
    pub locked_elsewhere: BTreeSet<String>,
    /// Bytes per read chunk (0: 4096).
    pub chunk: usize,
    /// Clock of the modification times: ms since the epoch at world time zero.
    pub epoch_ms: u64,
    /// File name → how many of its first bytes are on the disk: what an OS crash or a power
    /// loss leaves ([`FakeDisk::after_os_crash`]); the rest is only in the page cache, which a
    /// crash of the agent process alone does not lose.
    pub synced: BTreeMap<String, usize>,
    /// How long an `fdatasync` takes, ms.
    pub sync_ms: u64,
    /// `fdatasync`s done.
    pub syncs: usize,
}

impl FakeDisk {
    /// The disk as an OS crash leaves it: every file cut to what was synced (SPEC A9).
    #[must_use]
    pub fn after_os_crash(&self) -> FakeDisk {
        let mut disk = self.clone();
        for (name, (data, _)) in &mut disk.files {
            data.truncate(self.synced.get(name).copied().unwrap_or(0));
        }
        disk
    }

    /// The file's text (lossy), or "" when missing.
    #[must_use]
    pub fn text(&self, name: &str) -> String {
        self.files
            .get(name)
            .map(|(b, _)| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }
}

/// What triggered one step of the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepInput {
    /// `handle(input)`.
    Input(Input),
    /// `handle_timeout(t)` because `poll_timeout` said so.
    Timeout,
}

/// One `handle*` call and every action drained after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// When.
    pub t: MonoTime,
    /// What the agent was given.
    pub input: StepInput,
    /// Every action drained after it, in order.
    pub actions: Vec<Action>,
}

/// Only deliver a scheduled input if this still holds.
#[derive(Clone, Debug)]
enum Guard {
    Always,
    /// The process is still running (a dead process neither answers nor exits twice).
    Alive(ProcKey),
    /// The LLM call was not cancelled/released by the core.
    LlmLive(LlmCallId),
    /// Always; and first the disk has synced the first `.1` bytes of file `.0` (the input is
    /// the answer to that sync).
    Sync(String, usize),
}

#[derive(Clone, Debug)]
struct Scheduled {
    input: Input,
    guard: Guard,
}

#[derive(Clone, Debug)]
struct FakeServer {
    spec: ServerSpec,
    /// Its latest process (what [`World::exit_server`] and [`World::server_alive`] mean).
    latest: Option<ProcKey>,
    hook_calls: u32,
}

/// One process of a fake server (each session runs its own, a restart a new one).
#[derive(Clone, Debug)]
struct FakeProc {
    /// Index of its server in [`World::servers`].
    server: usize,
    alive: bool,
    /// `tools/call` requests held for the driver ([`ServerSpec::held`]): (id, tool name).
    held: VecDeque<(Value, String)>,
}

/// The simulated world. See the module docs.
pub struct World {
    /// The agent under test.
    pub agent: Agent,
    /// The virtual clock.
    pub now: MonoTime,
    /// Keep the readable [`World::transcript`] (on by default; the fuzz target turns it off,
    /// it costs a formatted line per event).
    pub record: bool,
    /// Readable transcript, one line per event.
    pub transcript: Vec<String>,
    /// Every step, in order (input + drained actions).
    pub steps: Vec<Step>,
    /// Every ACP line the agent wrote, parsed.
    pub acp_out: Vec<(MonoTime, Value)>,
    /// Every response the agent wrote (its id) with what was on the disk at that moment
    /// ([`FakeDisk::synced`]).
    pub answered_synced: Vec<(Value, BTreeMap<String, usize>)>,
    /// After every step: how many ACP lines the client had read, and each file's length (what
    /// a `kill -9` of the agent between two steps leaves: appends are written before the
    /// step's ACP lines reach stdout).
    pub disk_after_steps: Vec<(usize, BTreeMap<String, usize>)>,
    /// Every LLM request body, parsed.
    pub llm_requests: Vec<(MonoTime, LlmCallId, Value)>,
    /// The scripted reply given to each LLM call.
    pub llm_replies: BTreeMap<LlmCallId, LlmReply>,
    /// Lines the agent wrote to each server (by server name), parsed.
    pub mcp_lines: BTreeMap<String, Vec<(MonoTime, Value)>>,
    /// Every log record the agent produced.
    pub logs: Vec<LogRecord>,
    /// Every signal the agent sent a server's process group.
    pub signals: Vec<(MonoTime, ProcKey, Signal)>,
    /// Whether the agent asked to exit.
    pub exited: Option<i32>,
    /// The LLM script and its default.
    pub llm_script: VecDeque<LlmReply>,
    /// The LLM answer once the script is exhausted.
    pub llm_default: LlmReply,
    /// LLM calls answered [`LlmReply::Never`] and not released by the agent, oldest first:
    /// the driver may answer them ([`World::deliver_now`]).
    pub held_llm: VecDeque<LlmCallId>,
    /// `Some(ms)`: answer permission requests with `permission_option` after `ms`; `None`: hold
    /// their ids in [`World::held_permissions`] for the driver.
    pub permission_delay_ms: Option<u64>,
    /// The option a permission request is answered with.
    pub permission_option: String,
    /// Permission request ids not answered (when [`World::permission_delay_ms`] is `None`).
    pub held_permissions: VecDeque<Value>,
    /// Log lines at or above this level go to the transcript (hook lines always do).
    pub transcript_log_level: LogLevel,
    /// The session id of the last successful `session/new`.
    pub session: Option<String>,
    /// Every session id a response of the agent gave (`result.sessionId`), in order.
    pub sessions: Vec<String>,
    servers: Vec<FakeServer>,
    procs: BTreeMap<ProcKey, FakeProc>,
    queue: BTreeMap<(MonoTime, u64), Scheduled>,
    seq: u64,
    next_acp_id: u64,
    released_llm: BTreeSet<LlmCallId>,
    prev_messages: Vec<Value>,
    /// The state directory (used when the config's `state_dir` is on).
    pub disk: FakeDisk,
    /// Transcript files the agent holds open, by handle.
    open_files: BTreeMap<TranscriptId, String>,
    /// I1 and I7–I11 after every step: the checks the `session` fuzz target runs too.
    pub checks: Invariants,
}

/// A config for the simulated agent: OpenAI chat against [`LLM_BASE`], hooks on for every
/// server, permission `allow`, info logs.
#[must_use]
pub fn test_config() -> Config {
    let mut c = Config::for_tests(ProviderKind::OpenAiChat, LLM_BASE);
    c.hook_servers = HookAllowlist::All;
    c.permission = PermissionMode::Allow;
    c.log_level = LogLevel::Info;
    c.seed = 7;
    c
}

impl World {
    /// A world with an agent built from `cfg` at t = 0 and the given fake servers (used by
    /// [`World::new_session`], in this order).
    #[must_use]
    pub fn new(cfg: Config, servers: Vec<ServerSpec>) -> Self {
        let checks = Invariants::new(&cfg);
        let agent = Agent::new(cfg, MonoTime::ZERO).with_version("0.0.0-test");
        World {
            agent,
            now: MonoTime::ZERO,
            record: true,
            transcript: Vec::new(),
            steps: Vec::new(),
            acp_out: Vec::new(),
            answered_synced: Vec::new(),
            disk_after_steps: Vec::new(),
            llm_requests: Vec::new(),
            llm_replies: BTreeMap::new(),
            mcp_lines: BTreeMap::new(),
            logs: Vec::new(),
            signals: Vec::new(),
            exited: None,
            llm_script: VecDeque::new(),
            llm_default: LlmReply::text("Done."),
            held_llm: VecDeque::new(),
            permission_delay_ms: Some(0),
            permission_option: "allow_once".to_string(),
            held_permissions: VecDeque::new(),
            transcript_log_level: LogLevel::Warn,
            session: None,
            sessions: Vec::new(),
            servers: servers
                .into_iter()
                .map(|spec| FakeServer {
                    spec,
                    latest: None,
                    hook_calls: 0,
                })
                .collect(),
            procs: BTreeMap::new(),
            queue: BTreeMap::new(),
            seq: 0,
            next_acp_id: 1,
            released_llm: BTreeSet::new(),
            prev_messages: Vec::new(),
            disk: FakeDisk::default(),
            open_files: BTreeMap::new(),
            checks,
        }
    }

    /// The same world with `disk` as its state directory.
    #[must_use]
    pub fn with_disk(mut self, disk: FakeDisk) -> Self {
        self.disk = disk;
        self
    }

    /// Append LLM replies to the script.
    pub fn llm(&mut self, replies: impl IntoIterator<Item = LlmReply>) -> &mut Self {
        self.llm_script.extend(replies);
        self
    }

    /// The readable transcript, one event per line.
    #[must_use]
    pub fn transcript_text(&self) -> String {
        let mut s = self.transcript.join("\n");
        s.push('\n');
        s
    }

    fn note(&mut self, line: String) {
        if self.record {
            self.transcript.push(format!("{} {line}", self.now));
        }
    }

    /// Add a free comment line to the transcript (for snapshots).
    pub fn comment(&mut self, text: &str) {
        if self.record {
            self.transcript.push(format!("# {text}"));
        }
    }

    // ------------------------------------------------------------------ ACP client side

    /// Send one raw chunk of ACP bytes now.
    pub fn send_acp_bytes(&mut self, bytes: &[u8]) {
        let shown = String::from_utf8_lossy(bytes)
            .trim_end_matches('\n')
            .replace('\n', "\\n");
        note!(self, "<- acp {shown}");
        self.deliver(Input::AcpBytes(bytes.to_vec()));
    }

    /// Send one JSON-RPC request now; returns its id.
    pub fn request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_acp_id;
        self.next_acp_id += 1;
        let line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        self.send_acp_bytes(format!("{line}\n").as_bytes());
        id
    }

    /// Send one JSON-RPC notification now.
    pub fn notify(&mut self, method: &str, params: Value) {
        let line = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
        self.send_acp_bytes(format!("{line}\n").as_bytes());
    }

    /// `initialize` (then runs until idle).
    pub fn initialize(&mut self) -> u64 {
        let id = self.request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        self.run_idle();
        id
    }

    /// The `mcpServers` entries of the first `n` fake servers (all of them when `n` is larger).
    #[must_use]
    pub fn server_entries(&self, n: usize) -> Vec<Value> {
        self.servers
            .iter()
            .take(n)
            .map(|s| json!({"name": s.spec.name, "command": "fake-mcp", "args": [s.spec.name], "env": []}))
            .collect()
    }

    /// `session/new` with every fake server, run until idle; returns the session id.
    ///
    /// # Panics
    /// If the session could not be created.
    pub fn new_session(&mut self) -> String {
        let servers = self.server_entries(usize::MAX);
        let id = self.request("session/new", json!({"cwd": CWD, "mcpServers": servers}));
        self.run_idle();
        let resp = self.response(id).cloned();
        let sid = resp
            .as_ref()
            .and_then(|r| r["result"]["sessionId"].as_str())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("session/new failed: {resp:?}"));
        self.session = Some(sid.clone());
        sid
    }

    /// `session/load` (`replay`) or `session/resume` of `sid` with every fake server, run until
    /// idle; returns the request id. The session becomes the current one.
    pub fn load_session(&mut self, sid: &str, replay: bool) -> u64 {
        let servers = self.server_entries(usize::MAX);
        let method = if replay {
            "session/load"
        } else {
            "session/resume"
        };
        let id = self.request(
            method,
            json!({"sessionId": sid, "cwd": CWD, "mcpServers": servers}),
        );
        self.run_idle();
        self.session = Some(sid.to_string());
        id
    }

    /// The `session/update` payloads written for session `sid` after the `from`-th ACP line.
    #[must_use]
    pub fn updates_since(&self, from: usize, sid: &str) -> Vec<Value> {
        self.acp_out
            .iter()
            .skip(from)
            .map(|(_, v)| v)
            .filter(|v| v["method"] == "session/update" && v["params"]["sessionId"] == sid)
            .map(|v| v["params"]["update"].clone())
            .collect()
    }

    /// `initialize` + `session/new`.
    pub fn start(&mut self) -> String {
        self.initialize();
        self.new_session()
    }

    /// `session/prompt` with one text block on the current session (does not run).
    pub fn prompt(&mut self, text: &str) -> u64 {
        let sid = self.session.clone().unwrap_or_default();
        self.request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
        )
    }

    /// `session/cancel` notification on the current session (does not run).
    pub fn cancel(&mut self) {
        let sid = self.session.clone().unwrap_or_default();
        self.notify("session/cancel", json!({"sessionId": sid}));
    }

    /// The client closes the agent's stdin now (SPEC P1; does not run).
    pub fn eof(&mut self) {
        self.note("<- acp EOF".to_string());
        self.deliver(Input::AcpEof);
    }

    /// SIGTERM, SIGINT or SIGHUP reaches the agent now (SPEC P1; does not run).
    pub fn signal(&mut self) {
        self.note("<- signal".to_string());
        self.deliver(Input::ShutdownSignal);
    }

    /// Writing to the client failed now: it is gone (does not run).
    pub fn client_gone(&mut self) {
        self.note("<- acp write failed".to_string());
        self.deliver(Input::AcpWriteFailed);
    }

    /// The agent's response to our request `id`, if any.
    #[must_use]
    pub fn response(&self, id: u64) -> Option<&Value> {
        self.responses(id).into_iter().next()
    }

    /// Every response the agent wrote with id `id`.
    #[must_use]
    pub fn responses(&self, id: u64) -> Vec<&Value> {
        self.acp_out
            .iter()
            .map(|(_, v)| v)
            .filter(|v| v.get("method").is_none() && v.get("id") == Some(&json!(id)))
            .collect()
    }

    /// Make a fake server's latest process exit now (its stdout closes, then it is reaped).
    pub fn exit_server(&mut self, name: &str, status: &str) {
        let latest = self.servers.iter().find(|s| s.spec.name == name);
        if let Some(proc) = latest.and_then(|s| s.latest) {
            self.exit_proc(proc, status);
        }
    }

    /// Make the process `proc` exit now, if it runs (its stdout closes, then it is reaped).
    pub fn exit_proc(&mut self, proc: ProcKey, status: &str) {
        if self.proc_alive(proc) {
            self.schedule_exit(proc, 0, status);
            self.run_until(self.now);
        }
    }

    /// The running server processes, in key order; with `held`, only those holding a call.
    #[must_use]
    pub fn live_procs(&self, held: bool) -> Vec<ProcKey> {
        self.procs
            .iter()
            .filter(|(_, p)| p.alive && (!held || !p.held.is_empty()))
            .map(|(k, _)| *k)
            .collect()
    }

    /// The oldest `tools/call` held by `proc` ([`ServerSpec::held`]): its id and tool name.
    pub fn take_held_call(&mut self, proc: ProcKey) -> Option<(Value, String)> {
        self.procs.get_mut(&proc)?.held.pop_front()
    }

    /// Feeds `input` now (as the peer the driver plays) and delivers what it causes up to now.
    pub fn deliver_now(&mut self, input: Input) {
        self.describe_input(&input);
        self.deliver(input);
        self.run_until(self.now);
    }

    /// The end of a run: the client closes stdin, the world runs until the agent exits (P1),
    /// and every request was answered exactly once (I7).
    ///
    /// # Panics
    /// When the agent does not exit, or a request is unanswered.
    pub fn finish(&mut self) {
        self.eof();
        self.run_idle();
        assert!(
            self.exited.is_some(),
            "P1: the agent did not exit after EOF"
        );
        self.checks.all_answered();
    }

    /// Hook calls a fake server received so far.
    #[must_use]
    pub fn hook_calls(&self, name: &str) -> u32 {
        self.servers
            .iter()
            .find(|s| s.spec.name == name)
            .map_or(0, |s| s.hook_calls)
    }

    /// Whether the fake server's process is running.
    #[must_use]
    pub fn server_alive(&self, name: &str) -> bool {
        self.servers
            .iter()
            .find(|s| s.spec.name == name)
            .and_then(|s| s.latest)
            .is_some_and(|p| self.proc_alive(p))
    }

    fn proc_alive(&self, proc: ProcKey) -> bool {
        self.procs.get(&proc).is_some_and(|p| p.alive)
    }

    // ------------------------------------------------------------------ time

    /// Advance virtual time by `ms`, delivering scheduled inputs and firing timers in order.
    pub fn advance(&mut self, ms: u64) {
        let limit = self.now.plus_ms(ms);
        self.run_until(limit);
    }

    /// Run until nothing is scheduled and no timer is pending.
    pub fn run_idle(&mut self) {
        self.run_inner(None);
    }

    /// Deliver every scheduled input and fire every timer due at or before `limit`; the clock
    /// ends at `limit`.
    pub fn run_until(&mut self, limit: MonoTime) {
        self.run_inner(Some(limit));
        if limit > self.now {
            self.now = limit;
        }
    }

    fn run_inner(&mut self, limit: Option<MonoTime>) {
        for _ in 0..200_000 {
            let ev = self.queue.keys().next().copied();
            let timer = self.agent.poll_timeout();
            let next = match (ev.map(|k| k.0), timer.map(|t| t.0)) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => return,
            };
            if limit.is_some_and(|l| next > l) {
                return;
            }
            if self.exited.is_some() {
                return;
            }
            if next > self.now {
                self.now = next;
            }
            // Scheduled inputs go before timers due at the same instant.
            match ev {
                Some(key) if key.0 <= next => {
                    let Some(s) = self.queue.remove(&key) else {
                        return;
                    };
                    if let Guard::Sync(name, len) = &s.guard {
                        let synced = self.disk.synced.entry(name.clone()).or_default();
                        *synced = (*synced).max(*len);
                        self.disk.syncs += 1;
                    }
                    if self.guard_holds(&s.guard) {
                        self.describe_input(&s.input);
                        self.deliver(s.input);
                    }
                }
                Some(_) | None => self.fire_timeout(),
            }
        }
        panic!("busy loop: 200000 events without going idle (I11)");
    }

    fn guard_holds(&self, g: &Guard) -> bool {
        match g {
            Guard::Always | Guard::Sync(..) => true,
            Guard::Alive(p) => self.proc_alive(*p),
            Guard::LlmLive(c) => !self.released_llm.contains(c),
        }
    }

    fn fire_timeout(&mut self) {
        let key = self
            .agent
            .poll_timeout()
            .map_or_else(|| "?".to_string(), |(_, k)| format!("{k:?}"));
        note!(self, "timer {key}");
        let now = self.now;
        self.agent.handle_timeout(now);
        let actions = self.drain();
        self.steps.push(Step {
            t: now,
            input: StepInput::Timeout,
            actions,
        });
        Invariants::after_timeout(now, self.agent.poll_timeout());
    }

    fn schedule(&mut self, at: MonoTime, input: Input, guard: Guard) {
        self.seq += 1;
        self.queue
            .insert((at, self.seq), Scheduled { input, guard });
    }

    fn schedule_exit(&mut self, proc: ProcKey, delay_ms: u64, status: &str) {
        let at = self.now.plus_ms(delay_ms);
        self.schedule(at, Input::McpStdoutClosed { proc }, Guard::Alive(proc));
        self.schedule(
            at,
            Input::McpExited {
                proc,
                status: status.to_string(),
            },
            Guard::Alive(proc),
        );
    }

    fn describe_input(&mut self, input: &Input) {
        if !self.record {
            return;
        }
        let line = match input {
            Input::AcpBytes(b) => format!("<- acp {}", String::from_utf8_lossy(b).trim_end()),
            Input::McpSpawned { proc } => format!("<- {proc} spawned"),
            Input::McpBytes { proc, bytes } => format!("<- {proc} {}", summarize_mcp_in(bytes)),
            Input::McpStdoutClosed { proc } => format!("<- {proc} stdout closed"),
            Input::McpExited { proc, status } => format!("<- {proc} exited ({status})"),
            Input::Llm { call, event } => match event {
                LlmEvent::Head { .. } => return,
                LlmEvent::Body(b) => {
                    let status = self.llm_replies.get(call).map_or(0, |r| match r {
                        LlmReply::Status { status, .. } | LlmReply::Raw { status, .. } => *status,
                        LlmReply::Text { .. }
                        | LlmReply::Finish { .. }
                        | LlmReply::Tools { .. }
                        | LlmReply::Stream { .. }
                        | LlmReply::Never => 200,
                    });
                    format!("<- {call} {status} {}", summarize_sse(b))
                }
                LlmEvent::End => format!("<- {call} end"),
                LlmEvent::Failed(e) => format!("<- {call} failed: {e}"),
            },
            other => format!("<- {other:?}"),
        };
        self.note(line);
    }

    /// Feed one input now, drain, and record the step.
    fn deliver(&mut self, input: Input) {
        if let Input::McpSpawned { proc } = &input {
            if let Some(p) = self.procs.get_mut(proc) {
                p.alive = true;
            }
        }
        if let Input::McpExited { proc, .. } = &input {
            if let Some(p) = self.procs.get_mut(proc) {
                p.alive = false;
                p.held.clear();
            }
        }
        let now = self.now;
        self.checks.input(&input);
        self.agent.handle(input.clone(), now);
        let actions = self.drain();
        self.steps.push(Step {
            t: now,
            input: StepInput::Input(input),
            actions,
        });
    }

    // ------------------------------------------------------------------ the peers

    fn drain(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        while let Some(a) = self.agent.poll_action() {
            // Each frame and LLM body is parsed once, for every check and the peers.
            let json = check_action(&a);
            self.checks.action_json(&a, json.as_ref());
            self.react(&a, json);
            out.push(a);
        }
        let lens = self
            .disk
            .files
            .iter()
            .map(|(name, (data, _))| (name.clone(), data.len()))
            .collect();
        self.disk_after_steps.push((self.acp_out.len(), lens));
        out
    }

    /// The peers' reaction to one action; `json` is the frame or LLM body [`check_action`]
    /// parsed.
    fn react(&mut self, a: &Action, json: Option<Value>) {
        match a {
            Action::WriteAcp(line) => self.on_acp_out(line, json.unwrap_or_default()),
            Action::WriteMcp { proc, line } => {
                self.on_mcp_out(*proc, line, json.unwrap_or_default());
            }
            Action::SpawnMcp { proc, spec } => {
                note!(
                    self,
                    "-> spawn {proc} {} {}",
                    spec.command,
                    spec.args.join(" ")
                );
                if let Some(server) = self.servers.iter().position(|s| s.spec.name == spec.name) {
                    self.servers[server].latest = Some(*proc);
                    let p = FakeProc {
                        server,
                        alive: false,
                        held: VecDeque::new(),
                    };
                    self.procs.insert(*proc, p);
                }
                let now = self.now;
                self.schedule(now, Input::McpSpawned { proc: *proc }, Guard::Always);
            }
            Action::CloseMcpStdin { proc } => note!(self, "-> {proc} close stdin"),
            Action::SignalProcessGroup { proc, signal } => {
                note!(self, "-> {proc} signal {signal:?}");
                self.signals.push((self.now, *proc, *signal));
                match signal {
                    Signal::Term => self.schedule_exit(*proc, TERM_EXIT_MS, "killed by signal 15"),
                    Signal::Kill => self.schedule_exit(*proc, 0, "killed by signal 9"),
                }
            }
            Action::CallLlm { call, request } => {
                self.on_llm_call(*call, &request.url, json.unwrap_or_default());
            }
            Action::CancelLlm { call } => {
                note!(self, "-> {call} release");
                self.released_llm.insert(*call);
                self.held_llm.retain(|c| c != call);
            }
            // The world's servers are stdio servers: an HTTP exchange is noted, never answered.
            Action::Http { exchange, request } => note!(self, "-> {exchange} {request:?}"),
            Action::CancelHttp { exchange } => note!(self, "-> {exchange} cancel"),
            Action::Log(r) => {
                if r.level <= self.transcript_log_level || r.message.starts_with("hook:") {
                    let level = format!("{:?}", r.level).to_ascii_uppercase();
                    note!(self, "log {level} {}", r.message);
                }
                self.logs.push(r.clone());
            }
            Action::Exit { code } => {
                note!(self, "-> exit {code}");
                self.exited = Some(*code);
            }
            Action::OpenTranscript { file, name, mode } => {
                note!(self, "-> {file} open {name} {mode:?}");
                let exists = self.disk.files.contains_key(name);
                let event = match mode {
                    OpenMode::Create if exists => TranscriptEvent::Failed(TranscriptError::Io(
                        "File exists (os error 17)".into(),
                    )),
                    OpenMode::Existing if !exists => {
                        TranscriptEvent::Failed(TranscriptError::NotFound)
                    }
                    OpenMode::Create | OpenMode::Existing
                        if self.disk.locked_elsewhere.contains(name) =>
                    {
                        TranscriptEvent::Failed(TranscriptError::Locked)
                    }
                    OpenMode::Create | OpenMode::Existing => {
                        let mtime = self.mtime();
                        self.disk
                            .files
                            .entry(name.clone())
                            .or_insert_with(|| (Vec::new(), mtime));
                        self.open_files.insert(*file, name.clone());
                        TranscriptEvent::Opened
                    }
                };
                let now = self.now;
                let input = Input::Transcript { file: *file, event };
                self.schedule(now, input, Guard::Always);
            }
            Action::AppendTranscript { file, bytes } => {
                note!(self, "-> {file} append {} B", bytes.len());
                let mtime = self.mtime();
                if let Some(name) = self.open_files.get(file)
                    && let Some((data, at)) = self.disk.files.get_mut(name)
                {
                    data.extend_from_slice(bytes);
                    *at = mtime;
                }
            }
            Action::SyncTranscript { file, mark } => {
                note!(self, "-> {file} sync ({mark})");
                if let Some(name) = self.open_files.get(file).cloned() {
                    let len = self.disk.files.get(&name).map_or(0, |(d, _)| d.len());
                    let at = self.now.plus_ms(self.disk.sync_ms);
                    let event = TranscriptEvent::Synced(*mark);
                    let input = Input::Transcript { file: *file, event };
                    self.schedule(at, input, Guard::Sync(name, len));
                }
            }
            Action::TruncateTranscript { file, len } => {
                note!(self, "-> {file} truncate {len}");
                if let Some(name) = self.open_files.get(file)
                    && let Some((data, _)) = self.disk.files.get_mut(name)
                {
                    let len = usize::try_from(*len).unwrap_or(usize::MAX);
                    data.truncate(len);
                    if let Some(synced) = self.disk.synced.get_mut(name) {
                        *synced = (*synced).min(len);
                    }
                }
            }
            Action::CloseTranscript { file } => {
                note!(self, "-> {file} close");
                self.open_files.remove(file);
            }
            Action::ReadTranscript { file } => {
                note!(self, "-> {file} read");
                let data = self
                    .open_files
                    .get(file)
                    .and_then(|n| self.disk.files.get(n))
                    .map(|(d, _)| d.clone())
                    .unwrap_or_default();
                let chunk = if self.disk.chunk == 0 {
                    4096
                } else {
                    self.disk.chunk
                };
                let now = self.now;
                for piece in data.chunks(chunk) {
                    let event = TranscriptEvent::Bytes(piece.to_vec());
                    self.schedule(now, Input::Transcript { file: *file, event }, Guard::Always);
                }
                let event = TranscriptEvent::End;
                self.schedule(now, Input::Transcript { file: *file, event }, Guard::Always);
            }
            Action::ListTranscripts { request } => {
                note!(self, "-> list #{request}");
                let entries = self
                    .disk
                    .files
                    .iter()
                    .map(|(name, (data, at))| {
                        let end = data
                            .iter()
                            .position(|&b| b == b'\n')
                            .unwrap_or(data.len())
                            .min(TRANSCRIPT_HEAD_BYTES);
                        TranscriptEntry {
                            name: name.clone(),
                            modified_ms: *at,
                            head: data[..end].to_vec(),
                        }
                    })
                    .collect();
                let now = self.now;
                let input = Input::TranscriptList {
                    request: *request,
                    entries: Ok(entries),
                };
                self.schedule(now, input, Guard::Always);
            }
            // The simulated world holds no project instructions or skills (SPEC A10).
            Action::ReadProject { request, spec } => {
                note!(self, "-> read project #{request} {}", spec.cwd);
                let now = self.now;
                let input = Input::ProjectRead {
                    request: *request,
                    files: crate::project::ProjectFiles::default(),
                };
                self.schedule(now, input, Guard::Always);
            }
            // These worlds run no remote MCP server, so no authorization.
            Action::OAuth(a) => note!(self, "-> oauth {a:?}"),
        }
    }

    /// The wall-clock time of a file change now.
    fn mtime(&self) -> u64 {
        self.disk.epoch_ms + self.now.as_ms()
    }

    /// A line to the client (`v`: its JSON, one line checked by [`check_action`]).
    fn on_acp_out(&mut self, line: &str, v: Value) {
        note!(self, "-> acp {}", line.trim_end());
        // The client answers permission requests (SPEC A7), or holds them for the driver.
        if v.get("method").and_then(Value::as_str) == Some("session/request_permission") {
            match (self.permission_delay_ms, v.get("id").cloned()) {
                (Some(d), Some(id)) => {
                    let reply = json!({"jsonrpc": "2.0", "id": id,
                    "result": {"outcome": {"outcome": "selected", "optionId": self.permission_option}}});
                    let at = self.now.plus_ms(d);
                    self.schedule(
                        at,
                        Input::AcpBytes(format!("{reply}\n").into_bytes()),
                        Guard::Always,
                    );
                }
                (None, Some(id)) => self.held_permissions.push_back(id),
                (_, None) => {}
            }
        }
        if v.get("method").is_none()
            && let Some(id) = v.get("id")
        {
            self.answered_synced
                .push((id.clone(), self.disk.synced.clone()));
            if let Some(sid) = v["result"]["sessionId"].as_str()
                && !self.sessions.iter().any(|s| s == sid)
            {
                self.sessions.push(sid.to_string());
            }
        }
        self.acp_out.push((self.now, v));
    }

    fn server_index(&self, proc: ProcKey) -> Option<usize> {
        self.procs.get(&proc).map(|p| p.server)
    }

    /// A line to a server (`v`: its JSON, checked by [`check_action`]).
    fn on_mcp_out(&mut self, proc: ProcKey, line: &str, v: Value) {
        note!(self, "-> {proc} {}", summarize_mcp_out(&v));
        let Some(i) = self.server_index(proc) else {
            return;
        };
        let name = self.servers[i].spec.name.clone();
        self.mcp_lines
            .entry(name.clone())
            .or_default()
            .push((self.now, v.clone()));
        let (Some(id), Some(method)) = (
            v.get("id").cloned(),
            v.get("method").and_then(Value::as_str),
        ) else {
            return; // a notification or a response
        };
        let now = self.now;
        let reply = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
        match method {
            "initialize" => {
                let r = reply(
                    json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                    "serverInfo": {"name": name, "version": "1.0.0"}}),
                );
                self.schedule_mcp(now, proc, &r);
            }
            "tools/list" => {
                let spec = &self.servers[i].spec;
                let mut tools: Vec<Value> = spec
                    .tools
                    .iter()
                    .map(|t| {
                        let mut tool = json!({"name": t, "description": format!("{t} tool"),
                        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}});
                        if let Some(a) = spec.annotations.get(t) {
                            tool["annotations"] = a.clone();
                        }
                        tool
                    })
                    .collect();
                tools.extend(spec.hooks.iter().map(|h| {
                    json!({"name": h, "description": "lifecycle hook",
                    "inputSchema": {"type": "object"}})
                }));
                let r = reply(json!({"tools": tools}));
                self.schedule_mcp(now, proc, &r);
            }
            "tools/call" => {
                let tool = v["params"]["name"].as_str().unwrap_or("").to_string();
                if tool.starts_with('_') {
                    self.servers[i].hook_calls += 1;
                }
                if self.servers[i].spec.held {
                    if let Some(p) = self.procs.get_mut(&proc) {
                        p.held.push_back((id.clone(), tool));
                    }
                } else if tool.starts_with('_') {
                    let s = &mut self.servers[i];
                    let r = match s.spec.hook_by_name.get(&tool) {
                        Some(r) => r.clone(),
                        None => s
                            .spec
                            .hook_script
                            .pop_front()
                            .unwrap_or_else(|| s.spec.hook_default.clone()),
                    };
                    let at = now.plus_ms(r.delay_ms);
                    let line = match r.kind {
                        HookKind::Text(t) => {
                            Some(reply(json!({"content": [{"type": "text", "text": t}]})))
                        }
                        HookKind::Empty => {
                            Some(reply(json!({"content": [{"type": "text", "text": " \n"}]})))
                        }
                        HookKind::RpcError => Some(json!({"jsonrpc": "2.0", "id": id,
                            "error": {"code": -32603, "message": "hook crashed"}})),
                        HookKind::IsError => Some(reply(
                            json!({"content": [{"type": "text", "text": "hook failed"}],
                            "isError": true}),
                        )),
                        HookKind::Exit => {
                            self.schedule_exit(proc, r.delay_ms, "exit status 1");
                            None
                        }
                        HookKind::Never => None,
                    };
                    if let Some(l) = line {
                        self.schedule_mcp(at, proc, &l);
                    }
                } else if let Some(raw) = self.servers[i].spec.tool_reply_raw.clone() {
                    let id_text = id.to_string().into_bytes();
                    let mut bytes = Vec::with_capacity(raw.len() + 1);
                    let mut rest = raw.as_slice();
                    while let Some(at) = rest.windows(4).position(|w| w == b"@ID@") {
                        bytes.extend_from_slice(&rest[..at]);
                        bytes.extend_from_slice(&id_text);
                        rest = &rest[at + 4..];
                    }
                    bytes.extend_from_slice(rest);
                    bytes.push(b'\n');
                    let at = now.plus_ms(self.servers[i].spec.tool_delay_ms);
                    self.schedule(at, Input::McpBytes { proc, bytes }, Guard::Alive(proc));
                } else {
                    let args = v["params"]["arguments"].to_string();
                    let r = reply(
                        json!({"content": [{"type": "text", "text": format!("{tool}: {args}")}]}),
                    );
                    let at = now.plus_ms(self.servers[i].spec.tool_delay_ms);
                    self.schedule_mcp(at, proc, &r);
                }
            }
            "interceptors/list" | "interceptor/invoke"
                if self.servers[i].spec.interceptors.is_some() =>
            {
                let config = self.servers[i]
                    .spec
                    .interceptors
                    .clone()
                    .unwrap_or_default();
                let server =
                    crate::interceptor::example_server::ExampleServer::from_config(&config)
                        .unwrap_or_else(|e| panic!("bad interceptor config: {e}"));
                if let Some(answer) = server.handle_line(line.as_bytes()) {
                    let r: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
                    self.schedule_mcp(now, proc, &r);
                }
            }
            other => {
                let r = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("no {other}")}});
                self.schedule_mcp(now, proc, &r);
            }
        }
    }

    /// The transcript lines of an LLM request: its path, tools and the messages it adds to the
    /// previous request's.
    fn note_llm_request(&mut self, call: LlmCallId, url: &str, v: &Value) {
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let tools: Vec<&str> = v["tools"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        let path = url.strip_prefix(LLM_BASE).unwrap_or(url);
        let line = format!(
            "-> {call} POST {path} tools=[{}] messages={}",
            tools.join(","),
            msgs.len()
        );
        self.note(line);
        let shared = if msgs.len() >= self.prev_messages.len()
            && msgs[..self.prev_messages.len()] == self.prev_messages[..]
        {
            self.prev_messages.len()
        } else {
            0
        };
        for m in &msgs[shared..] {
            self.transcript.push(format!("           + {m}"));
        }
        self.prev_messages = msgs;
    }

    fn schedule_mcp(&mut self, at: MonoTime, proc: ProcKey, v: &Value) {
        let bytes = format!("{v}\n").into_bytes();
        self.schedule(at, Input::McpBytes { proc, bytes }, Guard::Alive(proc));
    }

    /// An LLM call (`v`: its request body, parsed by [`check_action`]).
    fn on_llm_call(&mut self, call: LlmCallId, url: &str, v: Value) {
        if self.record {
            self.note_llm_request(call, url, &v);
        }
        self.llm_requests.push((self.now, call, v));
        let reply = self
            .llm_script
            .pop_front()
            .unwrap_or_else(|| self.llm_default.clone());
        self.llm_replies.insert(call, reply.clone());
        let (status, body, delay) = match &reply {
            LlmReply::Text { text, delay_ms } => (200, sse_text(text), *delay_ms),
            LlmReply::Finish {
                text,
                finish,
                delay_ms,
            } => (200, sse_finish(text, finish), *delay_ms),
            LlmReply::Tools { calls, delay_ms } => (200, sse_tools(call, calls), *delay_ms),
            LlmReply::Status { status, delay_ms } => {
                let b = json!({"error": {"message": format!("scripted status {status}"), "type": "server_error"}});
                (*status, b.to_string().into_bytes(), *delay_ms)
            }
            LlmReply::Raw { status, body } => (*status, body.clone().into_bytes(), 0),
            LlmReply::Never => {
                self.held_llm.push_back(call);
                return;
            }
            LlmReply::Stream { deltas, finish } => {
                let g = || Guard::LlmLive(call);
                let head = LlmEvent::Head {
                    status: 200,
                    headers: Vec::new(),
                };
                self.schedule(self.now, Input::Llm { call, event: head }, g());
                let mut last = 0;
                for (delay, text) in deltas {
                    last = *delay;
                    let d = json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
                    let event = LlmEvent::Body(format!("data: {d}\n\n").into_bytes());
                    self.schedule(self.now.plus_ms(*delay), Input::Llm { call, event }, g());
                }
                if let Some(finish) = finish {
                    let f =
                        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
                    let at = self.now.plus_ms(last);
                    let body = format!("data: {f}\n\ndata: [DONE]\n\n").into_bytes();
                    let event = LlmEvent::Body(body);
                    self.schedule(at, Input::Llm { call, event }, g());
                    let event = LlmEvent::End;
                    self.schedule(at, Input::Llm { call, event }, g());
                }
                return;
            }
        };
        let at = self.now.plus_ms(delay);
        let g = || Guard::LlmLive(call);
        self.schedule(
            at,
            Input::Llm {
                call,
                event: LlmEvent::Head {
                    status,
                    headers: Vec::new(),
                },
            },
            g(),
        );
        self.schedule(
            at,
            Input::Llm {
                call,
                event: LlmEvent::Body(body),
            },
            g(),
        );
        self.schedule(
            at,
            Input::Llm {
                call,
                event: LlmEvent::End,
            },
            g(),
        );
    }
}

/// An OpenAI Chat SSE body with one text delta and `finish_reason: stop`.
#[must_use]
pub fn sse_text(text: &str) -> Vec<u8> {
    sse_finish(text, "stop")
}

/// An OpenAI Chat SSE body with one text delta and the given `finish_reason`.
#[must_use]
pub fn sse_finish(text: &str, finish: &str) -> Vec<u8> {
    chat_body(text, finish, None)
}

/// A Chat Completions SSE body with one text delta, `finish_reason: stop` and a usage.
#[must_use]
pub fn chat_text_body(text: &str) -> Vec<u8> {
    let usage = json!({"prompt_tokens": 50, "completion_tokens": 5});
    chat_body(text, "stop", Some(usage))
}

/// A Chat Completions SSE body: one text delta, then `finish` (with `usage` when given).
fn chat_body(text: &str, finish: &str, usage: Option<Value>) -> Vec<u8> {
    let d = json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    let mut f = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
    if let Some(u) = usage {
        f["usage"] = u;
    }
    format!("data: {d}\n\ndata: {f}\n\ndata: [DONE]\n\n").into_bytes()
}

/// An OpenAI Chat SSE body asking for `calls` (ids `call_<llm>_<i>`), `finish_reason: tool_calls`.
#[must_use]
pub fn sse_tools(call: LlmCallId, calls: &[(String, String)]) -> Vec<u8> {
    let ids: Vec<String> = (0..calls.len())
        .map(|i| format!("call_{}_{i}", call.0))
        .collect();
    let calls: Vec<(&str, &str, &str)> = calls
        .iter()
        .zip(&ids)
        .map(|((name, args), id)| (id.as_str(), name.as_str(), args.as_str()))
        .collect();
    chat_tool_body(&calls)
}

/// A Chat Completions SSE body asking for `calls` (`(id, name, arguments)`),
/// `finish_reason: tool_calls`.
#[must_use]
pub fn chat_tool_body(calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut s = String::new();
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let d = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": id,
            "type": "function", "function": {"name": name, "arguments": args}}]}, "finish_reason": null}]});
        s.push_str(&format!("data: {d}\n\n"));
    }
    let f = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]});
    s.push_str(&format!("data: {f}\n\ndata: [DONE]\n\n"));
    s.into_bytes()
}

/// An Anthropic Messages SSE body: `text` (when not empty), then `calls` (`(id, name,
/// arguments)`), `stop_reason` `end_turn` or `tool_use`.
#[must_use]
pub fn anthropic_body(text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut s = String::new();
    let mut ev = |name: &str, v: Value| s.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
            "content": [], "usage": {"input_tokens": 50, "output_tokens": 1}}}),
    );
    let mut index = 0;
    if !text.is_empty() {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        );
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        );
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        );
        index = 1;
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let at = index + i;
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": at, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        );
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": at, "delta": {"type": "input_json_delta", "partial_json": args}}),
        );
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": at}),
        );
    }
    let stop = if calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}),
    );
    ev("message_stop", json!({"type": "message_stop"}));
    s.into_bytes()
}

/// An OpenAI Responses SSE body: `text` (when not empty), then `calls` (`(id, name,
/// arguments)`), then `response.completed`.
#[must_use]
pub fn responses_body(text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut s = String::new();
    let mut ev = |v: Value| {
        let name = v["type"].as_str().unwrap_or("").to_owned();
        s.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    };
    let mut output = Vec::new();
    if !text.is_empty() {
        ev(
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text}),
        );
        output.push(json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}));
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let item = json!({"id": format!("fc_{i}"), "type": "function_call", "arguments": args, "call_id": id, "name": name});
        ev(
            json!({"type": "response.output_item.added", "output_index": i + 1, "item": {"id": format!("fc_{i}"), "type": "function_call", "arguments": "", "call_id": id, "name": name}}),
        );
        ev(
            json!({"type": "response.function_call_arguments.delta", "item_id": format!("fc_{i}"), "output_index": i + 1, "delta": args}),
        );
        ev(json!({"type": "response.output_item.done", "output_index": i + 1, "item": item}));
        output.push(item);
    }
    ev(
        json!({"type": "response.completed", "response": {"id": "r", "status": "completed", "output": output,
        "usage": {"input_tokens": 50, "output_tokens": 5}}}),
    );
    s.into_bytes()
}

/// A successful response body on `provider`'s route: text, or tool calls (`(id, name,
/// arguments)`) when `calls` is not empty.
#[must_use]
pub fn llm_body(provider: &ProviderKind, text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    match provider {
        ProviderKind::OpenAiChat if calls.is_empty() => chat_text_body(text),
        ProviderKind::OpenAiChat => chat_tool_body(calls),
        ProviderKind::Anthropic => anthropic_body(text, calls),
        ProviderKind::OpenAiResponses => responses_body(text, calls),
    }
}

fn summarize_sse(b: &[u8]) -> String {
    let text = String::from_utf8_lossy(b);
    let mut parts = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            parts.push("[DONE]".to_string());
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            parts.push(data.to_string());
            continue;
        };
        if v.get("error").is_some() {
            parts.push(v.to_string());
            continue;
        }
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"].as_str() {
            parts.push(format!("text {}", Value::String(t.to_string())));
        }
        if let Some(calls) = c["delta"]["tool_calls"].as_array() {
            for tc in calls {
                parts.push(format!(
                    "call {}({})",
                    tc["function"]["name"].as_str().unwrap_or(""),
                    tc["function"]["arguments"].as_str().unwrap_or("")
                ));
            }
        }
        if let Some(f) = c["finish_reason"].as_str() {
            parts.push(format!("finish={f}"));
        }
    }
    if parts.is_empty() {
        text.trim_end().to_string()
    } else {
        parts.join(" ")
    }
}

fn summarize_mcp_out(v: &Value) -> String {
    let method = v.get("method").and_then(Value::as_str);
    match (v.get("id"), method) {
        (Some(id), Some("tools/call")) => {
            let p = &v["params"];
            let name = p["name"].as_str().unwrap_or("");
            match p.get("_meta") {
                Some(meta) => format!("#{id} tools/call {name} {} _meta={meta}", p["arguments"]),
                None => format!("#{id} tools/call {name} {}", p["arguments"]),
            }
        }
        (Some(id), Some("interceptor/invoke")) => {
            let p = &v["params"];
            format!(
                "#{id} interceptor/invoke {} {} {}",
                p["name"].as_str().unwrap_or(""),
                p["phase"].as_str().unwrap_or(""),
                p["payload"]
            )
        }
        (Some(id), Some(m)) => format!("#{id} {m}"),
        (None, Some(m)) => match v.get("params") {
            Some(p) if !p.as_object().is_some_and(serde_json::Map::is_empty) => format!("{m} {p}"),
            Some(_) | None => m.to_string(),
        },
        (Some(_), None) | (None, None) => v.to_string(),
    }
}

fn summarize_mcp_in(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let Ok(v) = serde_json::from_str::<Value>(text.trim_end()) else {
        return text.trim_end().to_string();
    };
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    if let Some(tools) = v["result"]["tools"].as_array() {
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        return format!("#{id} tools: {}", names.join(", "));
    }
    if v["result"].get("protocolVersion").is_some() {
        return format!("#{id} initialized {}", v["result"]["protocolVersion"]);
    }
    match (v.get("result"), v.get("error")) {
        (Some(r), _) => format!("#{id} {r}"),
        (None, Some(e)) => format!("#{id} error {e}"),
        (None, None) => v.to_string(),
    }
}
