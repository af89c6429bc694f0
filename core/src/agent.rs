//! The [`Agent`]: the router. It decodes ACP input, hands every input and every due timer to
//! the sub-machine that owns it, routes what the sub-machines report to each other, and owns
//! the action queue ([`Outbox`]) and the [`TimerTable`].
//!
//! The sub-machines, each a type in its own file that never sees the agent: [`ServerTable`]
//! (`mcp.rs`), [`Turn`] (`turn.rs`) with its tool batch (`tool_calls.rs`), LLM attempts
//! (`llm_call.rs`), `_Stop` gate and hook rounds (`hooks.rs`) and compactor
//! (`compaction.rs`), [`Permissions`] (`permissions.rs`), [`Shutdown`] (`shutdown.rs`) and
//! the [`SessionStore`] (`store.rs`, SPEC A9: transcripts on disk, `session/load`,
//! `session/list`). Sessions (`session.rs`) and their transcripts (`transcript.rs`) are the
//! stores they work on; each session's [`SessionEntry`] (`session_entry.rs`) holds it with its
//! lifecycle, turn and queued prompt.
//!
//! The router's handlers are grouped by what they serve, each group a child module of this
//! one: `agent/sessions.rs`, the `session/*` requests that open, list, configure and close a
//! session and move its entry through its lifecycle; `agent/prompts.rs`, `session/prompt` and
//! `session/cancel`, the session's commands and the steps of its turn; `agent/login.rs`, a
//! remote server's OAuth login shown through the client (SPEC M11). What is left here is the
//! router: the inputs and timers by owner, the ACP decoding, the MCP events, the elicitations
//! and the shutdown.

use crate::acp::PermissionAnswer;
use crate::config::{Config, LogLevel};
use crate::cx::Parts;
use crate::elicitation::{ElicitationModes, Elicitations, Logins};
use crate::hooks::{EndReason, HookOutcome};
use crate::ids::{
    IdCounters, McpRequestId, PermissionRequestId, ProcKey, ServerSlot, SessionId, SessionIds,
};
use crate::intercept::invoke_reply;
use crate::interceptor::InvokeReply;
use crate::io::{Action, Input};
use crate::jsonrpc::{self, LineBuffer, LineEvent, ParseError, RpcError, RpcId};
use crate::lifecycle::Ending;
use crate::llm_call::LlmCalls;
use crate::mcp::{Expired, ListLost, McpEvent, ServerTable};
use crate::outbox::Outbox;
use crate::permissions::{PermissionTimer, Permissions};
use crate::session_entry::SessionEntry;
use crate::shutdown::{Shutdown, ShutdownAction};
use crate::store::SessionStore;
use crate::time::MonoTime;
use crate::timers::{ServerTimer, Stage, Timer, TimerKey, TimerTable};
use crate::tool_calls::InterceptEvent;
use crate::tools::ToolOutput;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

mod login;
mod prompts;
mod sessions;

use sessions::ProjectRead;

/// The pure agent state machine (DESIGN "The core's contract"): one per process, owned by the
/// runtime's loop. See the [crate docs](crate) for the drain rule and a run loop.
pub struct Agent {
    /// The configuration, the action queue, the deadlines, the MCP servers, the LLM calls,
    /// the permission requests, the id counters and the transcripts on disk (SPEC A9): what
    /// a step lends the machines as a context (`cx.rs`).
    parts: Parts,
    /// Reported in `initialize` (SPEC A1).
    version: String,
    /// stdin, split into lines (SPEC T1, T3).
    acp_in: LineBuffer,
    /// Reused buffer of the line events of one input.
    line_events: Vec<LineEvent>,
    /// One entry per session: the session, its lifecycle, its turn and its queued prompt
    /// (`session_entry.rs`).
    sessions: BTreeMap<SessionId, SessionEntry>,
    /// Where new session ids come from (SPEC A9: random).
    session_ids: SessionIds,
    /// `Some` once shutting down (SPEC P1).
    shutdown: Option<Shutdown>,
    /// The client advertised `clientCapabilities.session.notices` in `initialize`: notices go
    /// as ACP `notice` updates, else as marked message chunks (docs/clients.md).
    client_notices: bool,
    /// The elicitation modes the client presents (`clientCapabilities.elicitation`, SPEC M12).
    elicitation_modes: ElicitationModes,
    /// The ACP `elicitation/create` requests waiting for the client (SPEC M12).
    elicitations: Elicitations,
    /// The logins shown to the client as URL elicitations (SPEC M11).
    logins: Logins,
    /// The project reads in flight ([`Action::ReadProject`], SPEC A10), by request number.
    project_reads: BTreeMap<u64, ProjectRead>,
    /// The number of the next project read.
    next_project_read: u64,
}

/// Test support (the `testing` feature): what a session holds, to compare a session before
/// and after a `session/load` (SPEC A9).
#[cfg(feature = "testing")]
impl Agent {
    /// Session `id`'s conversation as JSON: `{"messages": [...] (the transcript record form),
    /// "lastInputTokens", "usageMark", "callsIssued", "model", "thoughtLevel" (the reasoning
    /// effort set with `session/set_config_option`: `default` or an effort; `null` when none
    /// was), "remembered"}`; `None` for an unknown or starting session.
    #[must_use]
    pub fn session_state_for_tests(&self, id: &str) -> Option<Value> {
        let sess = &self
            .sessions
            .get(&SessionId::parse(id)?)
            .filter(|e| !e.is_starting())?
            .session;
        let t = &sess.transcript;
        Some(json!({
            "messages": t.messages().iter().map(crate::record::message_to_json).collect::<Vec<Value>>(),
            "lastInputTokens": t.last_input_tokens,
            "usageMark": t.usage_mark,
            "callsIssued": t.calls_issued(),
            "model": sess.model_override,
            "thoughtLevel": sess.thought_level.map(crate::acp::effort_value),
            "remembered": sess.remembered,
        }))
    }
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
            // Values in the form the environment takes them (issue 12): provider=openai,
            // permission=ask, hooks=<MCP_HOOK_SERVERS>.
            let api = config
                .provider
                .api_value()
                .map(|a| format!(" api={a}"))
                .unwrap_or_default();
            let message = format!(
                "starting: provider={}{api} model={} base_url={} hooks={} stop_budget={} hook_timeout_ms={} permission={}",
                config.provider.env_value(),
                config.model,
                crate::text::redact_url(&config.base_url),
                config.hook_servers.env_value(),
                config.stop_max_rejections,
                config.hook_timeout_ms,
                config.permission.env_value()
            );
            out.log(LogLevel::Info, message);
        }
        let version = env!("CARGO_PKG_VERSION").to_string();
        let mut servers = ServerTable::new(config.mcp_init_timeout_ms, version.clone());
        servers.set_hook_allowlist(config.hook_servers.clone());
        servers.set_authorization(
            crate::authorization::AuthSetup {
                oauth: config.oauth.clone(),
                keeps_tokens: config.state_dir != crate::config::StateDir::Off,
                unix_ms_at_start: config.unix_ms_at_start,
                request_timeout_ms: config.mcp_init_timeout_ms,
            },
            crate::oauth::secrets::SecretRng::new(config.oauth_seed),
        );
        let session_ids = SessionIds::new(config.session_id_seed);
        let store = SessionStore::new(&config.state_dir);
        Agent {
            parts: Parts {
                servers,
                llm: LlmCalls::new(config.seed),
                out,
                timers: TimerTable::default(),
                permissions: Permissions::default(),
                ids: IdCounters::default(),
                store,
                cfg: config,
            },
            version,
            acp_in: LineBuffer::recovering_ids(max_line),
            line_events: Vec::new(),
            sessions: BTreeMap::new(),
            session_ids,
            shutdown: None,
            client_notices: false,
            elicitation_modes: ElicitationModes::default(),
            elicitations: Elicitations::default(),
            logins: Logins::default(),
            project_reads: BTreeMap::new(),
            next_project_read: 1,
        }
    }

    /// The environment the runtime itself received. MCP children get only its allowlisted
    /// part (SPEC S1, [`crate::config::child_environment`]: `HOME`, `PATH`, the locale, … and
    /// what `BUZZ_AGENT_CHILD_ENV` adds, never the agent's own variables), plus the client's
    /// `env` entries, which win (SPEC M1).
    #[must_use]
    pub fn with_inherited_env(mut self, env: impl IntoIterator<Item = (String, String)>) -> Self {
        self.parts
            .servers
            .set_inherited_env(crate::config::child_environment(
                env,
                &self.parts.cfg.child_env,
            ));
        self
    }

    /// The version reported as `agentInfo.version` to the client and as `clientInfo.version` to
    /// MCP servers (default: this crate's version), e.g. the runtime binary's version.
    #[must_use]
    pub fn with_version(mut self, version: &str) -> Self {
        self.version = version.to_string();
        self.parts.servers.set_client_version(version.to_string());
        self
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.parts.cfg
    }

    /// Feeds one observation made at `now` (clamped: never earlier than a time already seen).
    /// Then drain [`Agent::poll_action`]. Ignored once [`Agent::is_finished`].
    pub fn handle(&mut self, input: Input, now: MonoTime) {
        self.parts.out.advance(now);
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
                        format!("acp: dropped a partial line of {n} bytes at EOF"),
                    );
                }
                self.log(LogLevel::Info, "acp: stdin closed; shutting down".into());
                self.begin_shutdown(EndReason::Eof);
            }
            Input::ShutdownSignal => {
                self.log(LogLevel::Info, "signal received; shutting down".into());
                self.begin_shutdown(EndReason::Signal);
            }
            Input::AcpWriteFailed => {
                if self.shutdown.is_none() {
                    self.log(
                        LogLevel::Warn,
                        "acp: stdout write failed; shutting down".into(),
                    );
                }
                self.begin_shutdown(EndReason::ClientGone);
            }
            Input::McpSpawned { proc } => {
                self.parts
                    .servers
                    .on_spawned(proc, &mut self.parts.out, &mut self.parts.timers);
            }
            Input::McpSpawnFailed { proc, error } => {
                let events = self.parts.servers.on_spawn_failed(
                    proc,
                    &error,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Input::McpBytes { proc, bytes } => self.on_mcp_bytes(proc, &bytes),
            Input::McpStdoutClosed { proc } => {
                self.parts.servers.on_stdout_closed(
                    proc,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
            }
            Input::McpStderrLine { proc, line } => {
                self.parts
                    .servers
                    .on_stderr_line(proc, line, &mut self.parts.out);
            }
            Input::McpExited { proc, status } => {
                let events = self.parts.servers.on_exited(
                    proc,
                    &status,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Input::Http { exchange, event } => {
                let events = self.parts.servers.on_http(
                    exchange,
                    event,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Input::McpWriteFailed { proc } => {
                let events = self.parts.servers.on_write_failed(
                    proc,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Input::McpStdinFull { proc } => {
                let events = self.parts.servers.on_stdin_full(
                    proc,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Input::Llm { call, event } => {
                if let Some(sid) = self.parts.llm.session_of(call) {
                    self.step_turn(sid, |turn, sess, cx| {
                        turn.on_llm_event(call, event, sess, cx)
                    });
                }
            }
            Input::Transcript { file, event } => {
                let events = self
                    .parts
                    .store
                    .on_file_event(file, event, &mut self.parts.out);
                self.route_store(events);
            }
            Input::TranscriptList { request, entries } => {
                self.parts
                    .store
                    .on_list(request, entries, &mut self.parts.out);
            }
            Input::OAuth(input) => {
                let events =
                    self.parts
                        .servers
                        .on_oauth(input, &mut self.parts.out, &mut self.parts.timers);
                self.route_mcp(events);
            }
            Input::ProjectRead { request, files } => self.on_project_read(request, &files),
        }
        self.after_step();
    }

    /// Fires every timer due at or before `now`, in a fixed order (kill escalations, closed
    /// stdouts, MCP request deadlines, LLM graces and idle timeouts, backoffs, permission
    /// requests, the shutdown stage). Afterwards, and after a drain, [`Agent::poll_timeout`] is
    /// `None` or later than `now` (DESIGN I11). Calling it early is harmless: nothing is due.
    pub fn handle_timeout(&mut self, now: MonoTime) {
        self.parts.out.advance(now);
        if self.is_finished() {
            return;
        }
        let now = self.parts.out.now();
        for stage in Stage::ALL {
            for timer in self.parts.timers.due_in_stage(now, stage) {
                // An earlier timer of this step may have cleared or moved it.
                if self.parts.timers.is_due(timer, now) {
                    self.parts.timers.clear(timer);
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
        self.parts.out.pop()
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
        self.parts.timers.next().map(|(t, timer)| (t, timer.key()))
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
        // SPEC A9: what this step made final is recorded now (one append per session).
        self.parts.store.sync_all(
            self.sessions
                .values_mut()
                .filter(|e| !e.is_starting())
                .map(|e| &mut e.session),
            &mut self.parts.out,
        );
        self.check_shutdown_progress();
    }

    fn log(&mut self, level: LogLevel, message: String) {
        self.parts.out.log(level, message);
    }

    fn reply_ok(&mut self, id: &RpcId, result: &Value) {
        self.parts.out.reply_ok(id, result);
    }

    fn reply_err(&mut self, id: Option<&RpcId>, code: i64, message: String, data: Option<Value>) {
        self.parts.out.reply_err(id, code, message, data);
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
                            self.parts.cfg.max_line_bytes
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
            "initialize" => match crate::acp::initialize_result(
                &params,
                &self.version.clone(),
                self.parts.store.is_on(),
            ) {
                Ok(r) => {
                    self.client_notices = crate::acp::client_shows_notices(&params);
                    self.elicitation_modes = ElicitationModes::of_client(&params);
                    self.parts
                        .servers
                        .set_elicitation(self.elicitation_modes.mcp_capability());
                    self.reply_ok(&id, &r);
                }
                Err(m) => self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
            },
            "session/new" => self.on_session_new(id, &params),
            "session/load" => self.on_session_load(id, &params, true),
            "session/resume" => self.on_session_load(id, &params, false),
            "session/list" => self.on_session_list(id, &params),
            "session/prompt" => self.on_prompt(id, &params),
            "session/cancel" => {
                self.on_cancel(&params);
                self.reply_ok(&id, &Value::Null);
            }
            "session/set_model" => self.on_set_model(&id, &params),
            "session/set_config_option" => self.on_set_config_option(&id, &params),
            "session/close" => self.on_session_close(id, &params),
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
        if self.on_login_answer(out, &outcome) {
            return;
        }
        if let Some(pending) = self.elicitations.take(out) {
            self.on_elicitation_answer(pending, outcome);
            return;
        }
        let Some(req) = self.parts.permissions.take(out, &mut self.parts.timers) else {
            self.log(
                LogLevel::Debug,
                format!("acp: late or unknown response id {out}; dropped"),
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

    /// A server's `elicitation/create` (SPEC M12): forwarded to the client as its own
    /// `elicitation/create` when it presents the mode, else declined at once; a request that
    /// cannot be shown is `-32602`. The model never sees it.
    fn on_elicitation(
        &mut self,
        server: ServerSlot,
        generation: u64,
        request: RpcId,
        params: &Value,
    ) {
        let name = self.parts.servers.name(server);
        let ask = match crate::elicitation::decode(params) {
            Ok(ask) => ask,
            Err(why) => {
                self.log(
                    LogLevel::Warn,
                    format!("MCP server '{name}' asked for input that cannot be shown: {why}"),
                );
                let err = RpcError {
                    code: RpcError::INVALID_PARAMS,
                    message: format!("Invalid params: {why}"),
                    data: None,
                };
                self.parts.servers.answer_server_request(
                    server,
                    generation,
                    &request,
                    Err(&err),
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                return;
            }
        };
        let session = self
            .parts
            .servers
            .session_of(server)
            .filter(|sid| self.sessions.contains_key(sid));
        let shown = session
            .filter(|_| ask.presentable(self.elicitation_modes) && self.elicitations.has_room());
        let Some(session) = shown else {
            let why = if ask.presentable(self.elicitation_modes) {
                "too many requests wait for the user"
            } else {
                "the client does not present such requests"
            };
            self.log(
                LogLevel::Info,
                format!(
                    "MCP server '{name}' asked for input ({} mode); declined: {why}",
                    ask.mode()
                ),
            );
            self.parts.servers.answer_server_request(
                server,
                generation,
                &request,
                Ok(&crate::elicitation::declined()),
                &mut self.parts.out,
                &mut self.parts.timers,
            );
            return;
        };
        let id = self.parts.ids.next_permission();
        let mut acp = ask.acp_params(&session.to_string());
        // The user sees which server asks (S3: the name the client registered).
        acp["message"] = json!(format!("MCP server '{name}' asks: {}", ask.message()));
        self.log(
            LogLevel::Info,
            format!(
                "MCP server '{name}' asked for input ({} mode); asking the client (request {id})",
                ask.mode()
            ),
        );
        self.elicitations.insert(
            id,
            crate::elicitation::Pending {
                session,
                server,
                generation,
                request,
                ask,
            },
        );
        self.parts
            .out
            .push(Action::WriteAcp(jsonrpc::encode_request(
                id.0,
                "elicitation/create",
                &acp,
            )));
    }

    /// The client answered an `elicitation/create` (SPEC M12): the server gets the action
    /// (an accepted form with its defaults filled); a failed request is `cancel`.
    fn on_elicitation_answer(
        &mut self,
        pending: crate::elicitation::Pending,
        outcome: Result<Value, RpcError>,
    ) {
        let answer = match outcome {
            Ok(result) => crate::elicitation::answer(&result, &pending.ask),
            Err(e) => {
                self.log(
                    LogLevel::Warn,
                    format!(
                        "acp: elicitation request for MCP server '{}' failed: {} {}; the server is told cancel",
                        self.parts.servers.name(pending.server),
                        e.code,
                        e.message
                    ),
                );
                json!({"action": "cancel"})
            }
        };
        self.parts.servers.answer_server_request(
            pending.server,
            pending.generation,
            &pending.request,
            Ok(&answer),
            &mut self.parts.out,
            &mut self.parts.timers,
        );
    }

    fn session_not_found(&mut self, id: &RpcId, sid: &str) {
        self.reply_err(
            Some(id),
            jsonrpc::RpcError::RESOURCE_NOT_FOUND,
            format!("session not found: {sid}"),
            Some(json!({"sessionId": sid})),
        );
    }

    // ---------------------------------------------------------------- MCP routing

    fn on_mcp_bytes(&mut self, proc: ProcKey, bytes: &[u8]) {
        let Some((slot, lines)) = self.parts.servers.split_lines(proc, bytes) else {
            return;
        };
        for line in lines {
            if self.parts.servers.is_dead(slot) {
                return;
            }
            let events =
                self.parts
                    .servers
                    .on_line(slot, line, &mut self.parts.out, &mut self.parts.timers);
            self.route_mcp(events);
        }
    }

    /// Hands what the server table reports to its owners, in order.
    fn route_mcp(&mut self, events: Vec<McpEvent>) {
        let cap = self.parts.cfg.max_tool_result_text_bytes;
        for event in events {
            match event {
                McpEvent::ToolReply { call, reply } => {
                    if self.turn_no(call.session) == Some(call.turn) {
                        self.step_turn(call.session, |turn, sess, cx| {
                            turn.on_tool_reply(call.index, reply, sess, cx)
                        });
                    }
                }
                McpEvent::ToolFailed { call, reason } => {
                    let out = ToolOutput::plain(reason, true);
                    self.route_tool_result(call, out, true);
                }
                McpEvent::HookReply { call, reply } => {
                    let outcome = crate::hooks::classify_reply(reply, cap);
                    self.route_hook_outcome(call, outcome);
                }
                McpEvent::HookDead { call } => self.route_hook_outcome(call, HookOutcome::Dead),
                McpEvent::Progress {
                    server,
                    token,
                    text,
                } => {
                    if let Some(sid) = self.parts.servers.session_of(server) {
                        self.step_turn(sid, |turn, _, cx| {
                            turn.on_progress(server, &token, &text, cx);
                            None
                        });
                    }
                }
                McpEvent::InterceptorList {
                    session,
                    server,
                    reply,
                } => self.route_interceptor_list(session, server, reply),
                McpEvent::InterceptReply { call, reply } => {
                    self.route_intercept(call, InterceptEvent::Reply(invoke_reply(reply)));
                }
                McpEvent::InterceptLost { call, reason } => {
                    self.route_intercept(call, InterceptEvent::Reply(InvokeReply::Lost(reason)));
                }
                McpEvent::Elicit {
                    server,
                    generation,
                    request,
                    params,
                } => self.on_elicitation(server, generation, request, &params),
                McpEvent::ToolsDropped { session, notices } => {
                    if let Some(entry) = self.sessions.get_mut(&session) {
                        for text in notices {
                            entry.session.notify("mcp_tool_dropped", text);
                        }
                    }
                }
                McpEvent::StartSettled { session } => self.check_session_start(session),
                McpEvent::CommandsChanged { session } => self.advertise_commands(session),
                McpEvent::PromptGot { session, reply } => self.on_prompt_got(session, reply),
                McpEvent::Relist { server } => {
                    self.parts.servers.start_listing(
                        server,
                        &mut self.parts.out,
                        &mut self.parts.timers,
                    );
                }
                McpEvent::Login { server, url } => self.on_login(server, &url),
                McpEvent::LoginDone { server } => self.on_login_done(server),
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
                self.parts.servers.term_grace_over(
                    proc,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
            }
            Timer::Server(slot, ServerTimer::StdoutClosed) => {
                let events = self.parts.servers.stdout_grace_over(
                    slot,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Timer::Server(slot, ServerTimer::Request(id)) => self.expire_mcp_request(slot, id),
            Timer::Server(slot, ServerTimer::Authorization) => {
                let events = self.parts.servers.authorization_due(
                    slot,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Timer::Server(slot, ServerTimer::Exchange(seq)) => {
                let events = self.parts.servers.exchange_timed_out(
                    slot,
                    seq,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Timer::Server(slot, ServerTimer::HttpRetry) => {
                self.parts.servers.http_retry_due(
                    slot,
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
            }
            Timer::Turn(sid, kind) => {
                self.step_turn(sid, |turn, sess, cx| turn.on_timer(kind, sess, cx));
            }
            Timer::Permission(id) => {
                // A7: an unanswered permission request is named every 30 s, then denied.
                let now = self.parts.out.now();
                match self
                    .parts
                    .permissions
                    .on_timer(id, now, &mut self.parts.timers)
                {
                    Some(PermissionTimer::Waiting { message }) => self.log(LogLevel::Warn, message),
                    Some(PermissionTimer::Expired(req)) => {
                        self.log(
                            LogLevel::Warn,
                            format!("acp: permission request {id} timed out; denied"),
                        );
                        self.route_permission_answer(req, PermissionAnswer::Denied);
                    }
                    None => {}
                }
            }
            Timer::Shutdown => {
                let now = self.parts.out.now();
                let alive = self.parts.servers.any_leader_alive();
                if let Some(sh) = self.shutdown.as_mut() {
                    let actions = sh.on_timeout(now, alive);
                    self.run_shutdown_actions(actions);
                }
            }
        }
    }

    /// Sends the server `notifications/cancelled` for a request past the tool timeout (SPEC M5)
    /// and gives the timeout in whole seconds, for the error texts.
    fn cancel_timed_out(&mut self, slot: ServerSlot, id: McpRequestId) -> u64 {
        let secs = self.parts.cfg.tool_timeout_ms / 1000;
        self.parts.servers.cancel_request(
            slot,
            id,
            &format!("timeout after {secs}s"),
            &mut self.parts.out,
            &mut self.parts.timers,
        );
        secs
    }

    fn expire_mcp_request(&mut self, slot: ServerSlot, id: McpRequestId) {
        let Some((expired, events)) =
            self.parts
                .servers
                .expire(slot, id, &mut self.parts.out, &mut self.parts.timers)
        else {
            return;
        };
        self.route_mcp(events);
        match expired {
            Expired::Handshake => {}
            Expired::GetPrompt(sid) => {
                let secs = self.cancel_timed_out(slot, id);
                let name = self.parts.servers.name(slot);
                self.on_prompt_got(
                    sid,
                    Err(format!(
                        "MCP server '{name}' did not answer within {secs} s (BUZZ_AGENT_TOOL_TIMEOUT_SECS)"
                    )),
                );
            }
            Expired::Tool(call) => {
                let secs = self.cancel_timed_out(slot, id);
                let out = ToolOutput::plain(
                    tool_timeout_text(&self.parts.servers.name(slot), secs),
                    true,
                );
                self.route_tool_result(call, out, true);
                // M5: the server is killed and marked dead.
                let events = self.parts.servers.kill(
                    slot,
                    &format!("tool call timed out after {secs} s; killed"),
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
            }
            Expired::Hook(call) => {
                let events = self.parts.servers.hook_timed_out(
                    slot,
                    id,
                    self.parts.cfg.hook_timeout_ms,
                    "hook",
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
                self.route_hook_outcome(call, HookOutcome::Timeout);
            }
            Expired::ListInterceptors(sid) => {
                let ms = self.parts.cfg.hook_timeout_ms;
                let events = self.parts.servers.hook_timed_out(
                    slot,
                    id,
                    ms,
                    "interceptor",
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
                let why = format!("interceptors/list timed out after {ms} ms");
                self.route_interceptor_list(sid, slot, Err(ListLost::Lost(why)));
            }
            Expired::Intercept(call) => {
                let events = self.parts.servers.hook_timed_out(
                    slot,
                    id,
                    self.parts.cfg.hook_timeout_ms,
                    "interceptor",
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
                self.route_mcp(events);
                self.route_intercept(call, InterceptEvent::Timeout);
            }
        }
    }

    // ---------------------------------------------------------------- shutdown (P1, M8)

    /// Begin shutting down (idempotent): answer and cancel everything, start the
    /// `_SessionEnd` round of every session that opened (SPEC H11, `reason`), close the stdin
    /// of every server not answering one; the [`Shutdown`] machine takes it from there.
    fn begin_shutdown(&mut self, reason: EndReason) {
        if self.shutdown.is_some() {
            return;
        }
        let now = self.parts.out.now();
        // Set first so that nothing below starts anything new; replaced at the end.
        self.shutdown = Some(Shutdown::begin(now, false, 0));
        // Cancel every turn and answer pending requests (P1).
        let sids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for &sid in &sids {
            // An opening's answer is given now; its round and listings are abandoned.
            let starting = self
                .sessions
                .get_mut(&sid)
                .and_then(SessionEntry::refuse_opening);
            if self.parts.store.is_loading(sid) {
                self.parts.store.close(sid, &mut self.parts.out);
            }
            if let Some(rpc) = starting {
                self.reply_err(
                    Some(&rpc),
                    jsonrpc::RpcError::SERVER_ERROR,
                    "agent is shutting down".into(),
                    None,
                );
            }
            self.cancel_all_of(sid, "agent shutting down");
        }
        self.parts.llm.release_all(&mut self.parts.out);
        self.parts.permissions.clear(&mut self.parts.timers);
        // H11: every session that opened ends exactly once.
        for sid in sids {
            self.start_ending(sid, reason, None);
        }
        let keep: BTreeSet<ServerSlot> = self
            .sessions
            .values()
            .filter_map(SessionEntry::ending_round)
            .flat_map(Ending::waiting_servers)
            .collect();
        self.parts
            .servers
            .shut_down_all(&keep, &mut self.parts.out, &mut self.parts.timers);
        self.shutdown = Some(Shutdown::begin(
            now,
            !keep.is_empty(),
            self.parts.cfg.hook_timeout_ms,
        ));
        let kept = if keep.is_empty() {
            String::new()
        } else {
            format!(" (but {} answering _SessionEnd)", keep.len())
        };
        self.log(
            LogLevel::Debug,
            format!("shutdown: closed every MCP server's stdin{kept}"),
        );
    }

    fn run_shutdown_actions(&mut self, actions: Vec<ShutdownAction>) {
        for action in actions {
            let signal = match action {
                ShutdownAction::CloseAll => {
                    self.parts.servers.shut_down_all(
                        &BTreeSet::new(),
                        &mut self.parts.out,
                        &mut self.parts.timers,
                    );
                    continue;
                }
                ShutdownAction::TermAllGroups => crate::io::Signal::Term,
                ShutdownAction::KillAllGroupsAndExit => crate::io::Signal::Kill,
            };
            for proc in self.parts.servers.procs_to_sweep(&self.parts.timers) {
                self.parts
                    .out
                    .push(Action::SignalProcessGroup { proc, signal });
            }
            if action == ShutdownAction::KillAllGroupsAndExit {
                // The runtime finishes the queued syncs before it writes these (SPEC A9).
                self.parts.store.release_all(&mut self.parts.out);
                self.log(LogLevel::Info, "shutdown complete; exiting".into());
                self.parts.out.push(Action::Exit { code: 0 });
            }
        }
    }

    /// Advance shutdown when leaders exit early, and keep its deadline current (called after
    /// every step).
    fn check_shutdown_progress(&mut self) {
        let now = self.parts.out.now();
        let alive = self.parts.servers.any_leader_alive();
        let spawned = self.parts.servers.any_spawned();
        let waiting = self.sessions.values().any(|e| e.ending_round().is_some());
        let Some(sh) = self.shutdown.as_mut() else {
            return;
        };
        let actions = sh.on_step(now, waiting, alive, spawned);
        let deadline = sh.deadline(alive);
        self.run_shutdown_actions(actions);
        match deadline {
            Some(at) => self.parts.timers.set(Timer::Shutdown, at),
            None => {
                self.parts.timers.clear(Timer::Shutdown);
            }
        }
    }
}

/// The error result a model gets for a tool call to server `server` that outlived the tool
/// timeout of `secs` seconds (SPEC M5): it names the server, so that the model (and the user
/// reading the tool's failed update) knows which one did not answer.
fn tool_timeout_text(server: &str, secs: u64) -> String {
    format!(
        "tool call to MCP server '{server}' timed out after {secs} s (BUZZ_AGENT_TOOL_TIMEOUT_SECS)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m5_a_tool_timeout_names_the_server_and_the_setting() {
        assert_eq!(
            tool_timeout_text("github", 660),
            "tool call to MCP server 'github' timed out after 660 s (BUZZ_AGENT_TOOL_TIMEOUT_SECS)"
        );
    }
}
