//! The [`Agent`]: owner of all state, dispatcher of inputs, queue of actions.
//!
//! Sub-machines live in their own files as `impl Agent` blocks over the shared state:
//! `mcp.rs` (server lifecycle and MCP traffic), `turn.rs` (the prompt loop and tool calls),
//! `hooks.rs` (hook rounds, the `_Stop` gate and the reply guard), `llm_call.rs` (LLM attempts,
//! retries and idle timeouts), `shutdown.rs` (P1/M8).

use crate::config::{Config, LogLevel};
use crate::io::{Action, Input, LlmCallId, LogRecord, ProcKey};
use crate::jsonrpc::{self, LineBuffer, LineEvent, ParseError, RpcError, RpcId};
use crate::llm::History;
use crate::mcp::Server;
use crate::time::MonoTime;
use crate::turn::Turn;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};

/// Why the core wants to be woken (DESIGN: `poll_timeout` is labelled with its reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerKey {
    /// An MCP request's deadline (handshake step, tool call, hook call).
    McpRequest,
    /// Escalation of a process-group kill (TERM → KILL) or a stdout-closed grace.
    ProcessKill,
    /// A permission request's deadline (SPEC A7).
    Permission,
    /// An LLM attempt's idle timeout (SPEC L5).
    LlmIdle,
    /// The end of a retry backoff (SPEC L5).
    Backoff,
    /// A shutdown stage (SPEC M8, P1).
    Shutdown,
}

/// An ACP session (SPEC A2).
pub(crate) struct Session {
    pub id: String,
    /// Server slots in registration order (SPEC H3).
    pub servers: Vec<u64>,
    /// `Some(request id)` while `session/new` waits for the handshakes.
    pub starting: Option<RpcId>,
    /// The conversation, with the serialized form of its prefix kept for the next request.
    pub history: History,
    pub model_override: Option<String>,
    pub turn: Option<Turn>,
    /// A prompt that arrived after a cancel and waits for the cancelled turn (SPEC A3).
    pub queued: Option<(RpcId, String)>,
    /// `*_always` permission answers per qualified tool name: true = allow (SPEC A7).
    pub remembered: BTreeMap<String, bool>,
    /// Counter for ACP tool call ids and hook injection ids.
    pub seq: u64,
    /// Input tokens reported by the last LLM response (SPEC K1 projection).
    pub last_input_tokens: u64,
    /// History length when `last_input_tokens` was reported; bytes after it are projected.
    pub usage_mark: usize,
}

/// A request we sent to the ACP client (only `session/request_permission`).
pub(crate) struct OutRequest {
    pub session: String,
    pub turn_seq: u64,
    pub slot: usize,
    pub deadline: MonoTime,
}

/// The pure agent state machine. See the crate docs for the drain rule.
pub struct Agent {
    pub(crate) cfg: Config,
    pub(crate) version: String,
    pub(crate) inherited_env: Vec<(String, String)>,
    pub(crate) now: MonoTime,
    pub(crate) actions: VecDeque<Action>,
    acp_in: LineBuffer,
    line_events: Vec<LineEvent>,
    pub(crate) sessions: BTreeMap<String, Session>,
    next_session: u64,
    pub(crate) servers: BTreeMap<u64, Server>,
    pub(crate) next_server: u64,
    /// LLM call → session id.
    pub(crate) llm_calls: BTreeMap<LlmCallId, String>,
    pub(crate) next_llm: u64,
    pub(crate) out_requests: BTreeMap<u64, OutRequest>,
    pub(crate) next_out: u64,
    pub(crate) next_turn_seq: u64,
    pub(crate) next_hook_round: u64,
    /// What the provider taught us while running, kept for the process (SPEC L7 C41, L10).
    pub(crate) learned: crate::provider::Learned,
    pub(crate) rng: u64,
    pub(crate) shutdown: Option<crate::shutdown::Shutdown>,
    pub(crate) finished: bool,
}

impl Agent {
    /// A fresh agent. `version` is the crate version reported in `initialize` (SPEC A1).
    #[must_use]
    pub fn new(config: Config, now: MonoTime) -> Self {
        let rng = config.seed ^ 0x9e37_79b9_7f4a_7c15;
        let max_line = config.max_line_bytes;
        let mut actions = VecDeque::new();
        if LogLevel::Info <= config.log_level {
            let hooks = match &config.hook_servers {
                crate::config::HookAllowlist::Off => "off".to_string(),
                crate::config::HookAllowlist::All => "*".to_string(),
                crate::config::HookAllowlist::Names(n) => n.join(","),
            };
            let message = format!(
                "starting: provider={:?} model={} base_url={} hooks={hooks} stop_budget={} hook_timeout_ms={} permission={:?}",
                config.provider,
                config.model,
                config.base_url,
                config.stop_max_rejections,
                config.hook_timeout_ms,
                config.permission
            );
            actions.push_back(Action::Log(LogRecord {
                level: LogLevel::Info,
                at: now,
                message,
            }));
        }
        Agent {
            cfg: config,
            version: env_version(),
            inherited_env: Vec::new(),
            now,
            actions,
            acp_in: LineBuffer::recovering_ids(max_line),
            line_events: Vec::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
            servers: BTreeMap::new(),
            next_server: 1,
            llm_calls: BTreeMap::new(),
            next_llm: 1,
            out_requests: BTreeMap::new(),
            next_out: 1,
            next_turn_seq: 1,
            next_hook_round: 1,
            learned: crate::provider::Learned::default(),
            rng: if rng == 0 { 1 } else { rng },
            shutdown: None,
            finished: false,
        }
    }

    /// The environment the runtime itself received. MCP children get it minus the agent's own
    /// variables (SPEC M1: provider keys, `BUZZ_AGENT_*`, `MCP_HOOK_SERVERS`), plus the
    /// client's `env` entries, which win.
    #[must_use]
    pub fn with_inherited_env(mut self, env: impl IntoIterator<Item = (String, String)>) -> Self {
        self.inherited_env = env
            .into_iter()
            .filter(|(k, _)| !crate::config::is_agent_secret_or_own_variable(k))
            .collect();
        self
    }

    /// Override the version reported to clients and servers (defaults to the core's version).
    #[must_use]
    pub fn with_version(mut self, version: &str) -> Self {
        self.version = version.to_string();
        self
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Feed one observation.
    pub fn handle(&mut self, input: Input, now: MonoTime) {
        self.advance(now);
        if self.finished {
            return;
        }
        match input {
            Input::AcpBytes(bytes) => self.on_acp_bytes(&bytes),
            Input::AcpEof => {
                let mut events = std::mem::take(&mut self.line_events);
                let partial = self.acp_in.finish_into(&mut events);
                self.on_acp_line_events(&mut events);
                self.line_events = events;
                if let Some(n) = partial {
                    self.log(
                        LogLevel::Warn,
                        format!("acp: dropped a partial line of {n} bytes at EOF (T7)"),
                    );
                }
                self.log(LogLevel::Info, "acp: stdin closed; shutting down".into());
                self.begin_shutdown();
            }
            Input::ShutdownSignal => {
                self.log(LogLevel::Info, "signal received; shutting down".into());
                self.begin_shutdown();
            }
            Input::AcpWriteFailed => {
                if self.shutdown.is_none() {
                    self.log(
                        LogLevel::Warn,
                        "acp: stdout write failed; shutting down".into(),
                    );
                }
                self.begin_shutdown();
            }
            Input::McpSpawned { proc } => self.on_mcp_spawned(proc),
            Input::McpSpawnFailed { proc, error } => self.on_mcp_spawn_failed(proc, &error),
            Input::McpBytes { proc, bytes } => self.on_mcp_bytes(proc, &bytes),
            Input::McpStdoutClosed { proc } => self.on_mcp_stdout_closed(proc),
            Input::McpStderrLine { proc, line } => self.on_mcp_stderr(proc, line),
            Input::McpExited { proc, status } => self.on_mcp_exited(proc, &status),
            Input::McpWriteFailed { proc } => self.on_mcp_write_failed(proc),
            Input::Llm { call, event } => self.on_llm(call, event),
        }
        self.after_step();
    }

    /// Fire every timer due at or before `now` (DESIGN I11: afterwards `poll_timeout` is `None`
    /// or later than `now`).
    pub fn handle_timeout(&mut self, now: MonoTime) {
        self.advance(now);
        if self.finished {
            return;
        }
        self.fire_mcp_timers();
        self.fire_turn_timers();
        self.fire_permission_timers();
        self.fire_shutdown_timers();
        self.after_step();
    }

    /// The next action to execute, in order. Drain until `None` after every `handle*`.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The earliest pending deadline and why, or `None` when nothing is timed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<(MonoTime, TimerKey)> {
        if self.finished {
            return None;
        }
        let mut best: Option<(MonoTime, TimerKey)> = None;
        let mut consider = |t: Option<MonoTime>, k: TimerKey| {
            if let Some(t) = t
                && best.is_none_or(|(b, _)| t < b)
            {
                best = Some((t, k));
            }
        };
        for s in self.servers.values() {
            consider(s.next_request_deadline(), TimerKey::McpRequest);
            consider(s.next_kill_deadline(), TimerKey::ProcessKill);
        }
        for r in self.out_requests.values() {
            consider(Some(r.deadline), TimerKey::Permission);
        }
        for sess in self.sessions.values() {
            if let Some((d, k)) = sess.turn.as_ref().and_then(crate::turn::Turn::deadline) {
                consider(Some(d), k);
            }
        }
        consider(self.shutdown_deadline(), TimerKey::Shutdown);
        best
    }

    /// True once the agent asked to exit; the runtime stops its loop.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn advance(&mut self, now: MonoTime) {
        // Clamp monotonic (DESIGN: time is passed in; the core never goes backwards).
        if now > self.now {
            self.now = now;
        }
    }

    fn after_step(&mut self) {
        self.run_ready_sessions();
        self.check_shutdown_progress();
    }

    // ---------------------------------------------------------------- output helpers

    pub(crate) fn push(&mut self, a: Action) {
        self.actions.push_back(a);
    }

    /// Queue a log line if `level` passes `BUZZ_AGENT_LOG`.
    pub(crate) fn log(&mut self, level: LogLevel, message: String) {
        if level <= self.cfg.log_level {
            self.actions.push_back(Action::Log(LogRecord {
                level,
                at: self.now,
                message,
            }));
        }
    }

    pub(crate) fn logs_enabled(&self, level: LogLevel) -> bool {
        level <= self.cfg.log_level
    }

    pub(crate) fn reply_ok(&mut self, id: &RpcId, result: &Value) {
        self.push(Action::WriteAcp(jsonrpc::encode_result(id, result)));
    }

    pub(crate) fn reply_err(
        &mut self,
        id: Option<&RpcId>,
        code: i64,
        message: String,
        data: Option<Value>,
    ) {
        let err = RpcError {
            code,
            message,
            data,
        };
        self.push(Action::WriteAcp(jsonrpc::encode_error(id, &err)));
    }

    pub(crate) fn send_update(&mut self, session: &str, update: &Value) {
        self.push(Action::WriteAcp(crate::acp::update_line(session, update)));
    }

    /// xorshift64* — deterministic jitter from `Config::seed` (DESIGN I12).
    pub(crate) fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    // ---------------------------------------------------------------- ACP input

    fn on_acp_bytes(&mut self, bytes: &[u8]) {
        let mut events = std::mem::take(&mut self.line_events);
        self.acp_in.push(bytes, &mut events);
        self.on_acp_line_events(&mut events);
        self.line_events = events;
    }

    /// Handles (and drains) the line events of the ACP input.
    fn on_acp_line_events(&mut self, events: &mut Vec<LineEvent>) {
        for ev in events.drain(..) {
            match ev {
                LineEvent::Line(line) => self.on_acp_line(&line),
                LineEvent::TooLong { bytes, id } => {
                    let shown = id
                        .as_ref()
                        .map_or_else(|| "null".to_owned(), |i| i.to_value().to_string());
                    self.log(
                        LogLevel::Warn,
                        format!(
                            "acp: discarded an inbound line of over {} bytes (id {shown})",
                            bytes.saturating_sub(1)
                        ),
                    );
                    self.reply_err(
                        id.as_ref(),
                        jsonrpc::RpcError::INVALID_REQUEST,
                        format!(
                            "Invalid Request: line too long (over BUZZ_AGENT_MAX_LINE_BYTES={} bytes); discarded",
                            self.cfg.max_line_bytes
                        ),
                        None,
                    );
                }
            }
        }
    }

    fn on_acp_line(&mut self, line: &[u8]) {
        match jsonrpc::parse_message(line) {
            Ok(jsonrpc::Message::Request { id, method, params }) => {
                self.on_acp_request(id, &method, params)
            }
            Ok(jsonrpc::Message::Notification { method, params }) => {
                self.on_acp_notification(&method, &params)
            }
            Ok(jsonrpc::Message::Response { id, outcome }) => self.on_acp_response(&id, outcome),
            Err(ParseError::NotJson) => {
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                self.log(
                    LogLevel::Warn,
                    format!("acp: a line that is not JSON was answered -32700: {shown:?}"),
                );
                self.reply_err(
                    None,
                    jsonrpc::RpcError::PARSE_ERROR,
                    "Parse error: line is not JSON".into(),
                    None,
                );
            }
            Err(ParseError::Invalid { id, reason }) => {
                self.log(
                    LogLevel::Warn,
                    format!("acp: invalid JSON-RPC message: {reason}"),
                );
                self.reply_err(
                    id.as_ref(),
                    jsonrpc::RpcError::INVALID_REQUEST,
                    format!("Invalid Request: {reason}"),
                    None,
                );
            }
        }
    }

    fn on_acp_request(&mut self, id: RpcId, method: &str, params: Value) {
        if self.shutdown.is_some() {
            self.reply_err(
                Some(&id),
                jsonrpc::RpcError::SERVER_ERROR,
                "agent is shutting down".into(),
                None,
            );
            return;
        }
        match method {
            "initialize" => match crate::acp::initialize_result(&params, &self.version.clone()) {
                Ok(r) => self.reply_ok(&id, &r),
                Err(m) => self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
            },
            "session/new" => self.on_session_new(id, &params),
            "session/prompt" => self.on_prompt(id, &params),
            "session/cancel" => {
                self.on_cancel(&params);
                self.reply_ok(&id, &Value::Null);
            }
            "session/set_model" => self.on_set_model(&id, &params),
            other => {
                self.reply_err(
                    Some(&id),
                    jsonrpc::RpcError::METHOD_NOT_FOUND,
                    format!("Method not found: {other}"),
                    None,
                );
            }
        }
    }

    fn on_acp_notification(&mut self, method: &str, params: &Value) {
        match method {
            "session/cancel" => self.on_cancel(params),
            other => self.log(
                LogLevel::Debug,
                format!("acp: ignoring notification {other}"),
            ),
        }
    }

    fn on_acp_response(&mut self, id: &Value, outcome: Result<Value, RpcError>) {
        let Some(out) = jsonrpc::match_our_id(id) else {
            self.log(
                LogLevel::Debug,
                format!("acp: response with unknown id {id}; dropped"),
            );
            return;
        };
        let Some(req) = self.out_requests.remove(&out) else {
            self.log(
                LogLevel::Debug,
                format!("acp: late or unknown response id {out}; dropped (I6)"),
            );
            return;
        };
        let answer = match outcome {
            Ok(v) => crate::acp::decode_permission(&v),
            Err(e) => {
                self.log(
                    LogLevel::Warn,
                    format!("acp: permission request failed: {} {}", e.code, e.message),
                );
                crate::acp::PermissionAnswer::Denied
            }
        };
        self.on_permission_answer(&req.session, req.turn_seq, req.slot, answer);
    }

    fn on_session_new(&mut self, id: RpcId, params: &Value) {
        let spec = match crate::acp::decode_new_session(params) {
            Ok(s) => s,
            Err((m, data)) => {
                self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, Some(data));
                return;
            }
        };
        if let Some(max) = self.cfg.max_sessions
            && self.sessions.len() >= max
        {
            self.reply_err(
                Some(&id),
                jsonrpc::RpcError::SERVER_ERROR,
                format!("too many sessions: BUZZ_AGENT_MAX_SESSIONS={max}"),
                None,
            );
            return;
        }
        let sid = format!("sess_{}", self.next_session);
        self.next_session += 1;
        let mut slots = Vec::with_capacity(spec.servers.len());
        for entry in &spec.servers {
            let slot = self.create_server(&sid, &spec.cwd, entry);
            slots.push(slot);
        }
        let starting = if slots.is_empty() {
            None
        } else {
            Some(id.clone())
        };
        self.sessions.insert(
            sid.clone(),
            Session {
                id: sid.clone(),
                servers: slots.clone(),
                starting,
                history: History::default(),
                model_override: None,
                turn: None,
                queued: None,
                remembered: BTreeMap::new(),
                seq: 0,
                last_input_tokens: 0,
                usage_mark: 0,
            },
        );
        self.log(
            LogLevel::Info,
            format!("session {sid}: created with {} MCP server(s)", slots.len()),
        );
        if slots.is_empty() {
            self.reply_ok(&id, &json!({"sessionId": sid}));
        } else {
            for slot in slots {
                self.spawn_server(slot);
            }
        }
    }

    /// Called by the MCP machine when a server of a starting session became ready or failed.
    pub(crate) fn check_session_start(&mut self, sid: &str) {
        let Some(sess) = self.sessions.get(sid) else {
            return;
        };
        let Some(rpc) = sess.starting.clone() else {
            return;
        };
        let mut failure: Option<String> = None;
        let mut all_ready = true;
        for slot in &sess.servers {
            if let Some(s) = self.servers.get(slot) {
                if let Some(reason) = s.start_failure() {
                    failure = Some(reason);
                    break;
                }
                if !s.is_ready() {
                    all_ready = false;
                }
            }
        }
        if let Some(reason) = failure {
            let slots = sess.servers.clone();
            self.sessions.remove(sid);
            for slot in slots {
                self.stop_server(slot, "session start failed");
            }
            self.log(LogLevel::Error, format!("session/new failed: {reason}"));
            self.reply_err(Some(&rpc), jsonrpc::RpcError::SERVER_ERROR, reason, None);
        } else if all_ready {
            if let Some(sess) = self.sessions.get_mut(sid) {
                sess.starting = None;
            }
            self.reply_ok(&rpc, &json!({"sessionId": sid}));
        }
    }

    fn on_set_model(&mut self, id: &RpcId, params: &Value) {
        let sid = match crate::acp::string_field(params, "session/set_model", "sessionId") {
            Ok(s) => s.to_string(),
            Err(m) => return self.reply_err(Some(id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let model = match crate::acp::string_field(params, "session/set_model", "modelId") {
            Ok(m) if !m.trim().is_empty() => m.trim().to_string(),
            Ok(_) => {
                return self.reply_err(
                    Some(id),
                    jsonrpc::RpcError::INVALID_PARAMS,
                    "session/set_model: modelId must not be blank".into(),
                    None,
                );
            }
            Err(m) => return self.reply_err(Some(id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        match self.sessions.get_mut(&sid) {
            Some(s) if s.starting.is_none() => {
                s.model_override = Some(model);
                self.reply_ok(id, &json!({}));
            }
            _ => self.reply_err(
                Some(id),
                jsonrpc::RpcError::INVALID_PARAMS,
                format!("session/set_model: session not found: {sid}"),
                Some(json!({"sessionId": sid})),
            ),
        }
    }

    /// Allocate a process-wide proc slot id.
    pub(crate) fn alloc_server_slot(&mut self) -> u64 {
        let s = self.next_server;
        self.next_server += 1;
        s
    }

    /// Find the server slot of a proc key, only if it is the current generation.
    pub(crate) fn slot_of(&self, proc: ProcKey) -> Option<u64> {
        self.servers
            .get(&proc.server)
            .filter(|s| s.proc == proc)
            .map(|_| proc.server)
    }
}

fn env_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
