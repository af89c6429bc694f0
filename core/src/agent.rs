//! The [`Agent`]: the router. It decodes ACP input, hands every input and every due timer to
//! the sub-machine that owns it, routes what the sub-machines report to each other, and owns
//! the action queue ([`Outbox`]) and the [`TimerTable`].
//!
//! The sub-machines, each a type in its own file that never sees the agent: [`ServerTable`]
//! (`mcp.rs`), [`Turn`] (`turn.rs`) with its tool batch (`tool_calls.rs`), LLM attempts
//! (`llm_call.rs`), `_Stop` gate and hook rounds (`hooks.rs`) and compactor
//! (`compaction.rs`), [`Permissions`] (`permissions.rs`) and [`Shutdown`] (`shutdown.rs`).
//! Sessions (`session.rs`) and their transcripts (`transcript.rs`) are the stores they work
//! on.

use crate::acp::PermissionAnswer;
use crate::config::{Config, LogLevel};
use crate::cx::Cx;
use crate::hooks::HookOutcome;
use crate::ids::{IdCounters, McpRequestId, PermissionRequestId, ProcKey, ServerSlot, SessionId};
use crate::io::{Action, Input};
use crate::jsonrpc::{self, LineBuffer, LineEvent, ParseError, RpcError, RpcId};
use crate::llm_call::LlmCalls;
use crate::mcp::{Expired, McpEvent, ServerTable, StartState, ToolCallRef};
use crate::outbox::Outbox;
use crate::permissions::{PermissionRequest, Permissions};
use crate::session::Session;
use crate::shutdown::{Shutdown, ShutdownAction};
use crate::time::MonoTime;
use crate::timers::{ServerTimer, Stage, Timer, TimerKey, TimerTable};
use crate::tools::ToolOutput;
use crate::turn::{StopReason, Turn, TurnEnd};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The pure agent state machine (DESIGN "The core's contract"): one per process, owned by the
/// runtime's loop. See the [crate docs](crate) for the drain rule and a run loop.
pub struct Agent {
    cfg: Config,
    /// Reported in `initialize` (SPEC A1).
    version: String,
    out: Outbox,
    timers: TimerTable,
    /// stdin, split into lines (SPEC T1, T3).
    acp_in: LineBuffer,
    /// Reused buffer of the line events of one input.
    line_events: Vec<LineEvent>,
    sessions: BTreeMap<SessionId, Session>,
    /// The running turn of each session that has one.
    turns: BTreeMap<SessionId, Turn>,
    next_session: u64,
    servers: ServerTable,
    llm: LlmCalls,
    permissions: Permissions,
    ids: IdCounters,
    /// `Some` once shutting down (SPEC P1).
    shutdown: Option<Shutdown>,
}

impl Agent {
    /// A fresh agent started at `now`, with a validated configuration (from
    /// [`Config::from_env_map`]). It reports this crate's version in `initialize` and to MCP
    /// servers until [`Agent::with_version`] says otherwise (SPEC A1, M2), and logs one
    /// `starting:` line at info (SPEC T2).
    #[must_use]
    pub fn new(config: Config, now: MonoTime) -> Self {
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
        let version = env!("CARGO_PKG_VERSION").to_string();
        Agent {
            servers: ServerTable::new(config.mcp_init_timeout_ms, version.clone()),
            llm: LlmCalls::new(config.seed),
            cfg: config,
            version,
            out,
            timers: TimerTable::default(),
            acp_in: LineBuffer::recovering_ids(max_line),
            line_events: Vec::new(),
            sessions: BTreeMap::new(),
            turns: BTreeMap::new(),
            next_session: 1,
            permissions: Permissions::default(),
            ids: IdCounters::default(),
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
        self.out.advance(now);
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
            Input::Llm { call, event } => {
                if let Some(sid) = self.llm.session_of(call) {
                    self.step_turn(sid, |turn, sess, cx| {
                        turn.on_llm_event(call, event, sess, cx)
                    });
                }
            }
        }
        self.after_step();
    }

    /// Fires every timer due at or before `now`, in a fixed order (kill escalations, closed
    /// stdouts, MCP request deadlines, LLM graces and idle timeouts, backoffs, permission
    /// requests, the shutdown stage). Afterwards, and after a drain, [`Agent::poll_timeout`] is
    /// `None` or later than `now` (DESIGN I11). Calling it early is harmless: nothing is due.
    pub fn handle_timeout(&mut self, now: MonoTime) {
        self.out.advance(now);
        if self.is_finished() {
            return;
        }
        let now = self.out.now();
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

    /// After every input or timeout: start the rounds that are due, then let the shutdown
    /// move on.
    fn after_step(&mut self) {
        self.run_ready_turns();
        self.check_shutdown_progress();
    }

    fn log(&mut self, level: LogLevel, message: String) {
        self.out.log(level, message);
    }

    fn reply_ok(&mut self, id: &RpcId, result: &Value) {
        self.out.reply_ok(id, result);
    }

    fn reply_err(&mut self, id: Option<&RpcId>, code: i64, message: String, data: Option<Value>) {
        self.out.reply_err(id, code, message, data);
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
        self.route_permission_answer(req, answer);
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
        self.sessions
            .insert(sid, Session::new(sid, slots.clone(), &id));
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

    // ---------------------------------------------------------------- prompt turns

    /// Runs one step of the turn of `sid` with its session and the agent's shared parts; a
    /// turn that ends is answered. Nothing happens without a turn.
    fn step_turn(
        &mut self,
        sid: SessionId,
        step: impl FnOnce(&mut Turn, &mut Session, &mut Cx<'_>) -> Option<TurnEnd>,
    ) {
        let (Some(turn), Some(sess)) = (self.turns.get_mut(&sid), self.sessions.get_mut(&sid))
        else {
            return;
        };
        let mut cx = Cx {
            cfg: &self.cfg,
            out: &mut self.out,
            timers: &mut self.timers,
            servers: &mut self.servers,
            llm: &mut self.llm,
            permissions: &mut self.permissions,
            ids: &mut self.ids,
        };
        if let Some(end) = step(turn, sess, &mut cx) {
            self.end_turn(sid, end);
        }
    }

    /// `session/prompt` (SPEC A3): starts a turn, or queues the prompt behind a cancelled one.
    fn on_prompt(&mut self, id: RpcId, params: &Value) {
        let named = match crate::acp::string_field(params, "session/prompt", "sessionId") {
            Ok(s) => s.to_string(),
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let Some(sid) = SessionId::parse(&named)
            .filter(|sid| self.sessions.get(sid).is_some_and(|s| s.starting.is_none()))
        else {
            return self.session_not_found(&id, &named);
        };
        let text = match crate::acp::render_prompt(params) {
            Ok(t) => t,
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        if let Some(turn) = self.turns.get(&sid) {
            let cancelled = turn.is_cancelled();
            match self.sessions.get_mut(&sid) {
                Some(sess) if cancelled && sess.queued.is_none() => sess.queued = Some((id, text)),
                Some(_) | None => self.reply_err(
                    Some(&id),
                    jsonrpc::RpcError::INVALID_PARAMS,
                    "prompt already in flight".into(),
                    Some(json!({"sessionId": sid.to_string()})),
                ),
            }
            return;
        }
        self.start_turn(sid, id, text);
    }

    fn session_not_found(&mut self, id: &RpcId, sid: &str) {
        self.reply_err(
            Some(id),
            jsonrpc::RpcError::RESOURCE_NOT_FOUND,
            format!("session not found: {sid}"),
            Some(json!({"sessionId": sid})),
        );
    }

    fn start_turn(&mut self, sid: SessionId, rpc: RpcId, text: String) {
        let no = self.ids.next_turn();
        if self.out.logs(LogLevel::Debug) {
            let msg = format!(
                "session {sid}: prompt #{}: {}",
                no.0,
                crate::text::utf8_prefix(&text, 2000)
            );
            self.log(LogLevel::Debug, msg);
        }
        let Some(sess) = self.sessions.get_mut(&sid) else {
            return;
        };
        let mut cx = Cx {
            cfg: &self.cfg,
            out: &mut self.out,
            timers: &mut self.timers,
            servers: &mut self.servers,
            llm: &mut self.llm,
            permissions: &mut self.permissions,
            ids: &mut self.ids,
        };
        let turn = Turn::start(no, rpc, text, sess, &mut cx);
        self.turns.insert(sid, turn);
    }

    /// Answers the prompt of the turn of `sid` and forgets the turn; a queued prompt starts
    /// next (SPEC A3, A8).
    fn end_turn(&mut self, sid: SessionId, end: TurnEnd) {
        let Some(turn) = self.turns.remove(&sid) else {
            return;
        };
        self.timers.clear_turn(sid);
        let queued = self.sessions.get_mut(&sid).and_then(|s| s.queued.take());
        match end {
            TurnEnd::Stopped(reason) => {
                self.log(
                    LogLevel::Info,
                    format!(
                        "session {sid}: turn ended: {reason} after {} round(s)",
                        turn.rounds()
                    ),
                );
                self.reply_ok(
                    turn.rpc(),
                    &json!({"stopReason": reason.as_str(), "_meta": turn.meta()}),
                );
            }
            TurnEnd::Failed(message) => {
                self.log(
                    LogLevel::Error,
                    format!("session {sid}: turn failed: {message}"),
                );
                self.reply_err(
                    Some(turn.rpc()),
                    jsonrpc::RpcError::SERVER_ERROR,
                    message,
                    None,
                );
            }
        }
        if let Some((id, text)) = queued {
            self.start_turn(sid, id, text);
        }
    }

    /// Starts the next round of every turn that is ready (after each step).
    fn run_ready_turns(&mut self) {
        // Loop because a round can end a turn at once and start a queued prompt.
        for _ in 0..64 {
            let ready: Vec<SessionId> = self
                .turns
                .iter()
                .filter(|(_, t)| t.is_ready())
                .map(|(sid, _)| *sid)
                .collect();
            if ready.is_empty() {
                return;
            }
            for sid in ready {
                self.step_turn(sid, |turn, sess, cx| turn.next_round(sess, cx));
            }
        }
    }

    /// `session/cancel` (SPEC A4).
    fn on_cancel(&mut self, params: &Value) {
        let Some(named) = params.get("sessionId").and_then(Value::as_str) else {
            self.log(
                LogLevel::Debug,
                "acp: session/cancel without sessionId ignored".into(),
            );
            return;
        };
        let Some(sid) = SessionId::parse(named) else {
            self.log(
                LogLevel::Debug,
                format!("session {named}: cancel with no running turn ignored"),
            );
            return;
        };
        self.cancel_turn(sid, "cancelled by the client");
    }

    /// Cancels the running turn of `sid` (SPEC A4). Idle or unknown: nothing happens.
    fn cancel_turn(&mut self, sid: SessionId, why: &str) {
        if !self.turns.contains_key(&sid) {
            self.log(
                LogLevel::Debug,
                format!("session {sid}: cancel with no running turn ignored"),
            );
            return;
        }
        self.step_turn(sid, |turn, sess, cx| turn.cancel(why, sess, cx));
    }

    /// A permission answer (or its timeout) for a tool call of a turn (SPEC A7).
    fn route_permission_answer(&mut self, req: PermissionRequest, answer: PermissionAnswer) {
        if self
            .turns
            .get(&req.session)
            .is_some_and(|t| t.no() == req.turn)
        {
            self.step_turn(req.session, |turn, sess, cx| {
                turn.on_permission(req.index, answer, sess, cx)
            });
        }
    }

    /// A tool call of a turn ended (SPEC L2, L3).
    fn route_tool_result(&mut self, call: ToolCallRef, out: ToolOutput, failed: bool) {
        if self
            .turns
            .get(&call.session)
            .is_some_and(|t| t.no() == call.turn)
        {
            self.step_turn(call.session, |turn, sess, cx| {
                turn.on_tool_result(call.index, out, failed, sess, cx)
            });
        }
    }

    /// A hook call of a turn's round ended (SPEC H3, H4).
    fn route_hook_outcome(&mut self, call: crate::mcp::HookCallRef, outcome: HookOutcome) {
        self.step_turn(call.session, |turn, sess, cx| {
            turn.on_hook_outcome(call.round, call.index, outcome, sess, cx)
        });
    }

    // ---------------------------------------------------------------- MCP routing

    fn on_mcp_bytes(&mut self, proc: ProcKey, bytes: &[u8]) {
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
    fn route_mcp(&mut self, events: Vec<McpEvent>) {
        let cap = self.cfg.max_tool_result_text_bytes;
        for event in events {
            match event {
                McpEvent::ToolReply { call, reply } => {
                    let (out, failed) = crate::tool_calls::tool_output(reply, cap);
                    self.route_tool_result(call, out, failed);
                }
                McpEvent::ToolFailed { call, reason } => {
                    let out = ToolOutput {
                        text: reason,
                        is_error: true,
                    };
                    self.route_tool_result(call, out, true);
                }
                McpEvent::HookReply { call, reply } => {
                    let outcome = crate::hooks::classify_reply(reply, cap);
                    self.route_hook_outcome(call, outcome);
                }
                McpEvent::HookDead { call } => self.route_hook_outcome(call, HookOutcome::Dead),
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
                let proc = ProcKey {
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
            Timer::Turn(sid, kind) => {
                self.step_turn(sid, |turn, sess, cx| turn.on_timer(kind, sess, cx));
            }
            Timer::Permission(id) => {
                // A7: an unanswered permission request is denied.
                if let Some(req) = self.permissions.take(id, &mut self.timers) {
                    self.log(
                        LogLevel::Warn,
                        format!("acp: permission request {id} timed out; denied (A7)"),
                    );
                    self.route_permission_answer(req, PermissionAnswer::Denied);
                }
            }
            Timer::Shutdown => {
                let now = self.out.now();
                let alive = self.servers.any_leader_alive();
                if let Some(sh) = self.shutdown.as_mut() {
                    let actions = sh.on_timeout(now, alive);
                    self.run_shutdown_actions(actions);
                }
            }
        }
    }

    fn expire_mcp_request(&mut self, slot: ServerSlot, id: McpRequestId) {
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
                let out = ToolOutput {
                    text: format!(
                        "tool call timed out after {secs} s (BUZZ_AGENT_TOOL_TIMEOUT_SECS)"
                    ),
                    is_error: true,
                };
                self.route_tool_result(call, out, true);
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
                self.route_hook_outcome(call, HookOutcome::Timeout);
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

    // ---------------------------------------------------------------- shutdown (P1, M8)

    /// Begin shutting down (idempotent): answer and cancel everything, close every server's
    /// stdin; the [`Shutdown`] machine takes it from there.
    fn begin_shutdown(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        self.shutdown = Some(Shutdown::begin(self.out.now()));
        // Cancel every turn and answer pending requests (P1).
        let sids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for sid in sids {
            let starting = self.sessions.get_mut(&sid).and_then(|s| s.starting.take());
            if let Some(rpc) = starting {
                self.reply_err(
                    Some(&rpc),
                    jsonrpc::RpcError::SERVER_ERROR,
                    "agent is shutting down".into(),
                    None,
                );
            }
            if let Some((id, _)) = self.sessions.get_mut(&sid).and_then(|s| s.queued.take()) {
                self.reply_ok(&id, &json!({"stopReason": "cancelled"}));
            }
            self.cancel_turn(sid, "agent shutting down");
            // A turn still in a hook gate is answered now: shutdown does not wait for hooks.
            if self.turns.contains_key(&sid) {
                self.end_turn(sid, TurnEnd::Stopped(StopReason::Cancelled));
            }
        }
        self.llm.release_all(&mut self.out);
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
                self.out.push(Action::SignalProcessGroup { proc, signal });
            }
            if action == ShutdownAction::KillAllGroupsAndExit {
                self.log(LogLevel::Info, "shutdown complete; exiting".into());
                self.out.push(Action::Exit { code: 0 });
            }
        }
    }

    /// Advance shutdown when leaders exit early, and keep its deadline current (called after
    /// every step).
    fn check_shutdown_progress(&mut self) {
        let now = self.out.now();
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
