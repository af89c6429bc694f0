//! The [`Agent`]: the router. It decodes ACP input, hands every input and every due timer to
//! the sub-machine that owns it, routes what the sub-machines report to each other, and owns
//! the action queue ([`Outbox`]) and the [`TimerTable`].
//!
//! The sub-machines, each a type in its own file that never sees the agent: [`ServerTable`]
//! (`mcp.rs`), [`Shutdown`] (`shutdown.rs`), [`Permissions`] (`permissions.rs`); the prompt
//! turn (`turn.rs`), hook rounds and the `_Stop` gate (`hooks.rs`) and compaction
//! (`compaction.rs`).

use crate::config::{Config, LogLevel};
use crate::ids::{IdCounters, LlmCallId, PermissionRequestId, ServerSlot, SessionId};
use crate::io::{Action, Input};
use crate::jsonrpc::{self, LineBuffer, LineEvent, ParseError, RpcError, RpcId};
use crate::llm::Message;
use crate::mcp::{Expired, McpEvent, ServerTable, StartState};
use crate::outbox::Outbox;
use crate::permissions::Permissions;
use crate::shutdown::{Shutdown, ShutdownAction};
use crate::time::MonoTime;
use crate::timers::{ServerTimer, Stage, Timer, TimerTable};
use crate::turn::Turn;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(crate) use crate::timers::TimerKey;

/// An ACP session (SPEC A2).
pub(crate) struct Session {
    pub id: SessionId,
    /// Server slots in registration order (SPEC H3).
    pub servers: Vec<ServerSlot>,
    /// `Some(request id)` while `session/new` waits for the handshakes.
    pub starting: Option<RpcId>,
    pub history: Vec<Message>,
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

/// The pure agent state machine (DESIGN "The core's contract"): one per process, owned by the
/// runtime's loop. See the [crate docs](crate) for the drain rule and a run loop.
pub struct Agent {
    pub(crate) cfg: Config,
    pub(crate) version: String,
    pub(crate) out: Outbox,
    pub(crate) timers: TimerTable,
    acp_in: LineBuffer,
    line_events: Vec<LineEvent>,
    pub(crate) sessions: BTreeMap<SessionId, Session>,
    next_session: u64,
    pub(crate) servers: ServerTable,
    /// LLM call → session id.
    pub(crate) llm_calls: BTreeMap<LlmCallId, SessionId>,
    pub(crate) permissions: Permissions,
    pub(crate) ids: IdCounters,
    /// What the provider taught us while running, kept for the process (SPEC L7 C41, L10).
    pub(crate) learned: crate::provider::Learned,
    pub(crate) rng: u64,
    pub(crate) shutdown: Option<Shutdown>,
}

impl Agent {
    /// A fresh agent started at `now`, with a validated configuration (from
    /// [`Config::from_env_map`]). It reports this crate's version in `initialize` and to MCP
    /// servers until [`Agent::with_version`] says otherwise (SPEC A1, M2), and logs one
    /// `starting:` line at info (SPEC T2).
    #[must_use]
    pub fn new(config: Config, now: MonoTime) -> Self {
        let rng = config.seed ^ 0x9e37_79b9_7f4a_7c15;
        let max_line = config.max_line_bytes;
        let mut out = Outbox::new(config.log_level, now);
        if out.logs(LogLevel::Info) {
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
            out.log(LogLevel::Info, message);
        }
        let version = env_version();
        Agent {
            servers: ServerTable::new(config.mcp_init_timeout_ms, version.clone()),
            cfg: config,
            version,
            out,
            timers: TimerTable::default(),
            acp_in: LineBuffer::recovering_ids(max_line),
            line_events: Vec::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
            llm_calls: BTreeMap::new(),
            permissions: Permissions::default(),
            ids: IdCounters::default(),
            learned: crate::provider::Learned::default(),
            rng: if rng == 0 { 1 } else { rng },
            shutdown: None,
        }
    }

    /// The environment the runtime itself received. MCP children get it minus the agent's own
    /// variables (SPEC M1: provider keys, `BUZZ_AGENT_*`, `MCP_HOOK_SERVERS`), plus the
    /// client's `env` entries, which win.
    #[must_use]
    pub fn with_inherited_env(mut self, env: impl IntoIterator<Item = (String, String)>) -> Self {
        self.servers.set_inherited_env(
            env.into_iter()
                .filter(|(k, _)| !crate::config::is_agent_secret_or_own_variable(k))
                .collect(),
        );
        self
    }

    /// The version reported as `agentInfo.version` to the client and as `clientInfo.version` to
    /// MCP servers (default: this crate's version), e.g. the runtime binary's version.
    #[must_use]
    pub fn with_version(mut self, version: &str) -> Self {
        self.version = version.to_string();
        self.servers.set_client_version(version.to_string());
        self
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Feeds one observation made at `now` (clamped: never earlier than a time already seen).
    /// Then drain [`Agent::poll_action`]. Ignored once [`Agent::is_finished`].
    pub fn handle(&mut self, input: Input, now: MonoTime) {
        self.advance(now);
        if self.is_finished() {
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
            Input::McpSpawned { proc } => {
                self.servers
                    .on_spawned(proc, &mut self.out, &mut self.timers);
            }
            Input::McpSpawnFailed { proc, error } => {
                let events =
                    self.servers
                        .on_spawn_failed(proc, &error, &mut self.out, &mut self.timers);
                self.route_mcp(events);
            }
            Input::McpBytes { proc, bytes } => self.on_mcp_bytes(proc, &bytes),
            Input::McpStdoutClosed { proc } => {
                self.servers
                    .on_stdout_closed(proc, &mut self.out, &mut self.timers);
            }
            Input::McpStderrLine { proc, line } => {
                self.servers.on_stderr_line(proc, line, &mut self.out);
            }
            Input::McpExited { proc, status } => {
                let events = self
                    .servers
                    .on_exited(proc, &status, &mut self.out, &mut self.timers);
                self.route_mcp(events);
            }
            Input::McpWriteFailed { proc } => {
                let events = self
                    .servers
                    .on_write_failed(proc, &mut self.out, &mut self.timers);
                self.route_mcp(events);
            }
            Input::Llm { call, event } => self.on_llm(call, event),
        }
        self.after_step();
    }

    /// Fires every timer due at or before `now`, in a fixed order (kill escalations, closed
    /// stdouts, MCP request deadlines, LLM graces and idle timeouts, backoffs, permission
    /// requests, the shutdown stage). Afterwards, and after a drain, [`Agent::poll_timeout`] is
    /// `None` or later than `now` (DESIGN I11). Calling it early is harmless: nothing is due.
    pub fn handle_timeout(&mut self, now: MonoTime) {
        self.advance(now);
        if self.is_finished() {
            return;
        }
        let now = self.now();
        for stage in Stage::ALL {
            for timer in self.timers.due_in_stage(now, stage) {
                // An earlier timer of this step may have cleared or moved it.
                if self.timers.is_due(timer, now) {
                    self.timers.clear(timer);
                    self.on_timer(timer);
                }
            }
        }
        self.after_step();
    }

    /// The next action to start, in the order asked for; `None` when the queue is empty. Drain
    /// until `None` after every `handle*`.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop()
    }

    /// The earliest pending deadline and why, or `None` when nothing is timed (and always after
    /// the exit). Call [`Agent::handle_timeout`] at or after it. Simultaneous deadlines are
    /// labelled by the first in a fixed order (server by server, then permission requests,
    /// turns, shutdown).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<(MonoTime, TimerKey)> {
        if self.is_finished() {
            return None;
        }
        self.timers.next().map(|(t, timer)| (t, timer.key()))
    }

    /// True once the agent asked to exit ([`Action::Exit`] was queued): the runtime drains the
    /// last actions and stops its loop.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.shutdown.is_some_and(|s| s.is_exited())
    }

    fn advance(&mut self, now: MonoTime) {
        // Clamp monotonic (DESIGN: time is passed in; the core never goes backwards).
        self.out.advance(now);
    }

    /// The time of the step being handled.
    pub(crate) fn now(&self) -> MonoTime {
        self.out.now()
    }

    fn after_step(&mut self) {
        self.run_ready_sessions();
        self.check_shutdown_progress();
    }

    // ---------------------------------------------------------------- output helpers

    pub(crate) fn push(&mut self, a: Action) {
        self.out.push(a);
    }

    /// Queue a log line if `level` passes `BUZZ_AGENT_LOG`.
    pub(crate) fn log(&mut self, level: LogLevel, message: String) {
        self.out.log(level, message);
    }

    pub(crate) fn logs_enabled(&self, level: LogLevel) -> bool {
        self.out.logs(level)
    }

    pub(crate) fn reply_ok(&mut self, id: &RpcId, result: &Value) {
        self.out.reply_ok(id, result);
    }

    pub(crate) fn reply_err(
        &mut self,
        id: Option<&RpcId>,
        code: i64,
        message: String,
        data: Option<Value>,
    ) {
        self.out.reply_err(id, code, message, data);
    }

    pub(crate) fn send_update(&mut self, session: SessionId, update: &Value) {
        self.out.send_update(&session.to_string(), update);
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
        let out = PermissionRequestId(out);
        let Some(req) = self.permissions.take(out, &mut self.timers) else {
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
        self.on_permission_answer(req.session, req.turn, req.index.0, answer);
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
        let sid = SessionId(self.next_session);
        self.next_session += 1;
        let mut slots = Vec::with_capacity(spec.servers.len());
        for entry in &spec.servers {
            let slot = self.servers.create(sid, &spec.cwd, entry);
            slots.push(slot);
        }
        let starting = if slots.is_empty() {
            None
        } else {
            Some(id.clone())
        };
        self.sessions.insert(
            sid,
            Session {
                id: sid,
                servers: slots.clone(),
                starting,
                history: Vec::new(),
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
            self.reply_ok(&id, &json!({"sessionId": sid.to_string()}));
        } else {
            for slot in slots {
                self.servers.spawn(slot, &mut self.out);
            }
        }
    }

    /// A server of a starting session became ready or failed: answer `session/new` when every
    /// server is ready, or fail it (and stop the others) when one failed (SPEC A2).
    pub(crate) fn check_session_start(&mut self, sid: SessionId) {
        let Some(sess) = self.sessions.get(&sid) else {
            return;
        };
        let Some(rpc) = sess.starting.clone() else {
            return;
        };
        match self.servers.start_state(&sess.servers) {
            StartState::Waiting => {}
            StartState::Failed(reason) => {
                let slots = sess.servers.clone();
                self.sessions.remove(&sid);
                for slot in slots {
                    self.servers.stop(
                        slot,
                        "session start failed",
                        &mut self.out,
                        &mut self.timers,
                    );
                }
                self.log(LogLevel::Error, format!("session/new failed: {reason}"));
                self.reply_err(Some(&rpc), jsonrpc::RpcError::SERVER_ERROR, reason, None);
            }
            StartState::Ready => {
                if let Some(sess) = self.sessions.get_mut(&sid) {
                    sess.starting = None;
                }
                self.reply_ok(&rpc, &json!({"sessionId": sid.to_string()}));
            }
        }
    }

    // ---------------------------------------------------------------- MCP routing

    fn on_mcp_bytes(&mut self, proc: crate::ids::ProcKey, bytes: &[u8]) {
        let Some((slot, lines)) = self.servers.split_lines(proc, bytes) else {
            return;
        };
        for line in lines {
            if self.servers.is_dead(slot) {
                return;
            }
            let events = self
                .servers
                .on_line(slot, line, &mut self.out, &mut self.timers);
            self.route_mcp(events);
        }
    }

    /// Hands what the server table reports to its owners, in order.
    pub(crate) fn route_mcp(&mut self, events: Vec<McpEvent>) {
        for event in events {
            match event {
                McpEvent::ToolReply { call, reply } => {
                    let (out, failed) =
                        crate::turn::tool_output(reply, self.cfg.max_tool_result_text_bytes);
                    self.on_tool_finished(call.session, call.turn, call.index.0, out, failed);
                }
                McpEvent::ToolFailed { call, reason } => {
                    let out = crate::tools::ToolOutput {
                        text: reason,
                        is_error: true,
                    };
                    self.on_tool_finished(call.session, call.turn, call.index.0, out, true);
                }
                McpEvent::HookReply { call, reply } => {
                    let outcome =
                        crate::hooks::classify_reply(reply, self.cfg.max_tool_result_text_bytes);
                    self.on_hook_outcome(call.session, call.round, call.index, outcome);
                }
                McpEvent::HookDead { call } => {
                    self.on_hook_outcome(
                        call.session,
                        call.round,
                        call.index,
                        crate::hooks::HookOutcome::Dead,
                    );
                }
                McpEvent::StartSettled { session } => self.check_session_start(session),
                McpEvent::Relist { server } => {
                    self.servers
                        .start_listing(server, &mut self.out, &mut self.timers);
                }
            }
        }
    }

    /// One due timer, already cleared from the table: route it to its owner.
    fn on_timer(&mut self, timer: Timer) {
        match timer {
            Timer::Server(slot, ServerTimer::Kill { generation }) => {
                let proc = crate::ids::ProcKey {
                    server: slot,
                    generation,
                };
                self.servers.term_grace_over(proc, &mut self.out);
            }
            Timer::Server(slot, ServerTimer::StdoutClosed) => {
                let events = self
                    .servers
                    .stdout_grace_over(slot, &mut self.out, &mut self.timers);
                self.route_mcp(events);
            }
            Timer::Server(slot, ServerTimer::Request(id)) => self.expire_mcp_request(slot, id),
            Timer::Turn(sid, kind) => self.on_turn_timer(sid, kind),
            Timer::Permission(id) => {
                // A7: an unanswered permission request is denied.
                if let Some(r) = self.permissions.take(id, &mut self.timers) {
                    self.log(
                        LogLevel::Warn,
                        format!("acp: permission request {id} timed out; denied (A7)"),
                    );
                    self.on_permission_answer(
                        r.session,
                        r.turn,
                        r.index.0,
                        crate::acp::PermissionAnswer::Denied,
                    );
                }
            }
            Timer::Shutdown => {
                let now = self.now();
                let alive = self.servers.any_leader_alive();
                if let Some(sh) = self.shutdown.as_mut() {
                    let actions = sh.on_timeout(now, alive);
                    self.run_shutdown_actions(actions);
                }
            }
        }
    }

    fn expire_mcp_request(&mut self, slot: ServerSlot, id: crate::ids::McpRequestId) {
        let Some((expired, events)) =
            self.servers
                .expire(slot, id, &mut self.out, &mut self.timers)
        else {
            return;
        };
        self.route_mcp(events);
        match expired {
            Expired::Handshake => {}
            Expired::Tool(call) => {
                let secs = self.cfg.tool_timeout_ms / 1000;
                self.servers.cancel_request(
                    slot,
                    id,
                    &format!("timeout after {secs}s"),
                    &mut self.out,
                    &mut self.timers,
                );
                let out = crate::tools::ToolOutput {
                    text: format!(
                        "tool call timed out after {secs} s (BUZZ_AGENT_TOOL_TIMEOUT_SECS)"
                    ),
                    is_error: true,
                };
                self.on_tool_finished(call.session, call.turn, call.index.0, out, true);
                // M5: the server is killed and marked dead.
                let events = self.servers.kill(
                    slot,
                    &format!("tool call timed out after {secs} s; killed (M5)"),
                    &mut self.out,
                    &mut self.timers,
                );
                self.route_mcp(events);
            }
            Expired::Hook(call) => {
                let events = self.servers.hook_timed_out(
                    slot,
                    id,
                    self.cfg.hook_timeout_ms,
                    &mut self.out,
                    &mut self.timers,
                );
                self.route_mcp(events);
                self.on_hook_outcome(
                    call.session,
                    call.round,
                    call.index,
                    crate::hooks::HookOutcome::Timeout,
                );
            }
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
        match SessionId::parse(&sid).and_then(|id| self.sessions.get_mut(&id)) {
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
}

impl Agent {
    // ---------------------------------------------------------------- shutdown (P1, M8)

    /// Begin shutting down (idempotent): answer and cancel everything, close every server's
    /// stdin; the [`Shutdown`] machine takes it from there.
    fn begin_shutdown(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        self.shutdown = Some(Shutdown::begin(self.now()));
        // Cancel every turn and answer pending requests (P1).
        let sids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for sid in sids {
            let starting = self.sessions.get(&sid).and_then(|s| s.starting.clone());
            if let Some(rpc) = starting {
                self.reply_err(
                    Some(&rpc),
                    jsonrpc::RpcError::SERVER_ERROR,
                    "agent is shutting down".into(),
                    None,
                );
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.starting = None;
                }
            }
            if let Some(s) = self.sessions.get_mut(&sid)
                && let Some((id, _)) = s.queued.take()
            {
                self.reply_ok(&id, &json!({"stopReason": "cancelled"}));
            }
            self.cancel_turn(sid, "agent shutting down");
            // A turn still in a hook gate is answered now: shutdown does not wait for hooks.
            if self.sessions.get(&sid).is_some_and(|s| s.turn.is_some()) {
                self.finish_turn(sid, "cancelled");
            }
        }
        for call in std::mem::take(&mut self.llm_calls).into_keys() {
            self.push(Action::CancelLlm { call });
        }
        self.permissions.clear(&mut self.timers);
        self.servers.shut_down_all(&mut self.out, &mut self.timers);
        self.log(
            LogLevel::Debug,
            "shutdown: closed every MCP server's stdin".into(),
        );
    }

    fn run_shutdown_actions(&mut self, actions: Vec<ShutdownAction>) {
        for action in actions {
            let signal = match action {
                ShutdownAction::TermAllGroups => crate::io::Signal::Term,
                ShutdownAction::KillAllGroupsAndExit => crate::io::Signal::Kill,
            };
            for proc in self.servers.procs_to_sweep(&self.timers) {
                self.push(Action::SignalProcessGroup { proc, signal });
            }
            if action == ShutdownAction::KillAllGroupsAndExit {
                self.log(LogLevel::Info, "shutdown complete; exiting".into());
                self.push(Action::Exit { code: 0 });
            }
        }
    }

    /// Advance shutdown when leaders exit early, and keep its deadline current (called after
    /// every step).
    fn check_shutdown_progress(&mut self) {
        let now = self.now();
        let alive = self.servers.any_leader_alive();
        let spawned = self.servers.any_spawned();
        let Some(sh) = self.shutdown.as_mut() else {
            return;
        };
        let actions = sh.on_step(now, alive, spawned);
        let deadline = sh.deadline(alive);
        self.run_shutdown_actions(actions);
        match deadline {
            Some(at) => self.timers.set(Timer::Shutdown, at),
            None => {
                self.timers.clear(Timer::Shutdown);
            }
        }
    }
}

fn env_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
