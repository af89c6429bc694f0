//! The router's `session/*` handlers (SPEC A2, A5, A9, A10, H10, H11): opening a session
//! (`session/new`, `session/load`, `session/resume`: its project files, its servers, its
//! transcript, then its [`Opening`](crate::lifecycle::Opening)), `session/list`, the model and
//! config options, and closing it (`session/close`, its [`Ending`](crate::lifecycle::Ending)).
//! Each moves the session's [`SessionEntry`] through its lifecycle (`session_entry.rs`, with
//! the diagram); the parts it needs are the agent's, so these are methods of the [`Agent`].

use super::Agent;
use crate::config::LogLevel;
use crate::hooks::{EndReason, HookOutcome};
use crate::ids::{ServerSlot, SessionId};
use crate::instructions::{self, ClientPrompt};
use crate::io::Action;
use crate::jsonrpc::{self, RpcId};
use crate::lifecycle::Source;
use crate::mcp::{ListLost, StartState};
use crate::session::Session;
use crate::session_entry::{HookRouted, Lifecycle, SessionEntry, session_if};
use crate::store::StoreEvent;
use serde_json::{Value, json};

/// `text` as a sentence: its first letter upper-case, a full stop at the end.
fn sentence(text: &str) -> String {
    let mut chars = text.chars();
    let first: String = chars
        .next()
        .map(|c| c.to_uppercase().collect())
        .unwrap_or_default();
    let rest: String = chars.collect();
    let end = if rest.ends_with('.') { "" } else { "." };
    format!("{first}{rest}{end}")
}

/// A session waiting for its project files (SPEC A10) before it starts.
#[derive(Debug)]
pub(super) struct ProjectRead {
    session: SessionId,
    cwd: String,
    client: Option<ClientPrompt>,
    then: AfterRead,
}

/// What a starting session does once its project files are read.
#[derive(Debug, Clone, Copy)]
enum AfterRead {
    /// `session/new`: start its servers.
    New,
    /// `session/load` (`replay`) or `session/resume`: open its transcript.
    Load { replay: bool },
}

impl Agent {
    /// `session/new` (SPEC A2, C55): a `Starting` entry with its servers created (skipped
    /// `mcpServers` entries become notices for the first prompt), then its project files are
    /// read (SPEC A10). Too many sessions (`BUZZ_AGENT_MAX_SESSIONS`) is `-32000`.
    pub(super) fn on_session_new(&mut self, id: RpcId, params: &Value) {
        let spec = match crate::acp::decode_new_session(params) {
            Ok(s) => s,
            Err((m, data)) => {
                self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, Some(data));
                return;
            }
        };
        if let Some(max) = self.parts.cfg.max_sessions
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
        let sid = self.session_ids.next_id();
        let mut skipped_notices = Vec::with_capacity(spec.skipped.len());
        for skipped in &spec.skipped {
            // C55: the session starts without it; the user is told on the first prompt.
            self.log(
                LogLevel::Warn,
                format!(
                    "session {sid}: MCP server '{}' skipped: {}",
                    skipped.name, skipped.reason
                ),
            );
            skipped_notices.push(format!(
                "MCP server '{}' was not started: {}.",
                skipped.name, skipped.reason
            ));
        }
        let mut slots = Vec::with_capacity(spec.servers.len());
        for entry in &spec.servers {
            let slot =
                self.parts
                    .servers
                    .create(sid, &spec.cwd, &spec.additional_directories, entry);
            slots.push(slot);
        }
        let mut sess = Session::new(sid, slots.clone());
        for text in skipped_notices {
            sess.notify("mcp_server_skipped", text);
        }
        sess.client_notices = self.client_notices;
        self.sessions.insert(sid, SessionEntry::starting(sess, id));
        self.parts.store.on_new(sid, &spec.cwd);
        self.log(
            LogLevel::Info,
            format!("session {sid}: created with {} MCP server(s)", slots.len()),
        );
        self.read_project(sid, &spec.cwd, spec.system_prompt, AfterRead::New);
    }

    /// SPEC A10: a starting session's project instructions (and skills) are read before it
    /// starts its servers or reads its transcript; with `BUZZ_AGENT_NO_HINTS` nothing is read.
    /// Either way its system prompt is fixed here for all its requests.
    fn read_project(
        &mut self,
        sid: SessionId,
        cwd: &str,
        client: Option<ClientPrompt>,
        then: AfterRead,
    ) {
        if self.parts.cfg.no_hints {
            if let Some(entry) = self.sessions.get_mut(&sid) {
                entry.session.system_prompt =
                    instructions::system_prompt(&self.parts.cfg, client.as_ref(), None, None);
            }
            return self.after_project_read(sid, cwd, then);
        }
        let request = self.next_project_read;
        self.next_project_read += 1;
        self.project_reads.insert(
            request,
            ProjectRead {
                session: sid,
                cwd: cwd.to_string(),
                client,
                then,
            },
        );
        let spec = instructions::read_spec(&self.parts.cfg, cwd);
        self.parts.out.push(Action::ReadProject { request, spec });
    }

    /// The project files of a starting session were read (SPEC A10): its system prompt is
    /// built, what was cut or skipped is logged and told to the user, and the session goes on
    /// starting. A read for a session that is gone (closed, failed, shut down) is dropped.
    pub(super) fn on_project_read(&mut self, request: u64, files: &crate::project::ProjectFiles) {
        let Some(read) = self.project_reads.remove(&request) else {
            return;
        };
        let sid = read.session;
        let Some(sess) = session_if(&mut self.sessions, sid, SessionEntry::is_starting) else {
            return;
        };
        let (taken, mut findings) = instructions::take_instructions(
            &files.instructions,
            self.parts.cfg.instructions_max_bytes,
        );
        let bytes: usize = taken.files.iter().map(|(_, t)| t.len()).sum();
        let section = instructions::instructions_section(&taken);
        // The runtime's own findings: folders it could not look at, skills over the count.
        findings.extend(files.problems.iter().map(|p| {
            instructions::Finding::new("skill_skipped", format!("skills: {p}"), sentence(p))
        }));
        let (skills, skill_findings, warnings) =
            crate::skills::take_skills(&files.skills, crate::project::MAX_SKILL_BYTES);
        findings.extend(skill_findings);
        let listing = crate::skills::skills_section(&skills);
        sess.system_prompt =
            instructions::system_prompt(&self.parts.cfg, read.client.as_ref(), section, listing);
        let names: Vec<String> = skills.iter().map(|s| s.name.clone()).collect();
        sess.skills = skills;
        for f in &findings {
            sess.notify(f.kind, f.notice.clone());
        }
        for line in findings.into_iter().map(|f| f.log).chain(warnings) {
            self.log(LogLevel::Warn, format!("session {sid}: {line}"));
        }
        let root = files.git_root.as_deref().unwrap_or("none");
        self.log(
            LogLevel::Info,
            format!(
                "session {sid}: {} AGENTS.md file(s), {bytes} bytes, and {} skill(s) [{}] in the system prompt (git root {root})",
                taken.files.len(),
                names.len(),
                names.join(", ")
            ),
        );
        self.after_project_read(sid, &read.cwd, read.then);
    }

    /// A starting session whose project files are read goes on: `session/new` starts its
    /// servers (or is ready at once without any), a load opens its transcript (SPEC A2, A9).
    fn after_project_read(&mut self, sid: SessionId, cwd: &str, then: AfterRead) {
        match then {
            AfterRead::Load { replay } => {
                self.parts
                    .store
                    .begin_load(sid, cwd, replay, &mut self.parts.out)
            }
            AfterRead::New => {
                if !self.spawn_servers(sid) {
                    self.session_ready(sid, Source::New);
                }
            }
        }
    }

    /// Spawns the MCP servers of the starting session `sid`; whether it has any.
    fn spawn_servers(&mut self, sid: SessionId) -> bool {
        let slots = self
            .sessions
            .get(&sid)
            .map(|e| e.session.servers.clone())
            .unwrap_or_default();
        for &slot in &slots {
            self.parts
                .servers
                .spawn(slot, &mut self.parts.out, &mut self.parts.timers);
        }
        !slots.is_empty()
    }

    /// A server of a starting session became ready or failed: answer `session/new` when every
    /// server is ready, or fail it (and stop the others) when one failed (SPEC A2).
    pub(super) fn check_session_start(&mut self, sid: SessionId) {
        let Some(entry) = self.sessions.get(&sid).filter(|e| e.is_starting()) else {
            return;
        };
        let loading = self.parts.store.is_loading(sid);
        match self.parts.servers.start_state(&entry.session.servers) {
            StartState::Waiting => {}
            StartState::Failed(reason) => {
                let method = if loading {
                    "session/load"
                } else {
                    "session/new"
                };
                self.log(LogLevel::Error, format!("{method} failed: {reason}"));
                self.abandon_start(sid, loading, jsonrpc::RpcError::SERVER_ERROR, reason);
            }
            // SPEC A9: the servers of a stored session are up; now its transcript is read.
            StartState::Ready if loading => self.parts.store.read(sid, &mut self.parts.out),
            StartState::Ready => {
                if entry.is_before_opening() {
                    self.session_ready(sid, Source::New);
                }
            }
        }
    }

    /// The result of `session/new` for session `sid` (SPEC A2, A5, cases C55, C58):
    /// `sessionId`, the model selector (`configOptions`) and `models` state, and, when
    /// `mcpServers` entries were skipped, `_meta.buzz.notices` with one sentence each (the
    /// same sentences the first prompt streams). `session/load` answers with the same fields.
    fn session_result(&self, sid: SessionId) -> Value {
        let mut result = serde_json::Map::new();
        result.insert("sessionId".into(), Value::String(sid.to_string()));
        if let Some(sess) = self.sessions.get(&sid).map(|e| &e.session) {
            let current = sess.model(&self.parts.cfg.model);
            let available = self.available_models(current);
            result.extend(crate::acp::model_fields(
                current,
                &available,
                sess.effort(&self.parts.cfg),
            ));
            if !sess.notices.is_empty() {
                let texts: Vec<&str> = sess.notices.iter().map(|n| n.text.as_str()).collect();
                result.insert("_meta".into(), json!({"buzz": {"notices": texts}}));
            }
        }
        Value::Object(result)
    }

    /// The models a session whose model is `current` may switch to (SPEC A5): `current`,
    /// `BUZZ_AGENT_MODEL`, then `BUZZ_AGENT_MODELS`.
    fn available_models(&self, current: &str) -> Vec<String> {
        let mut configured = Vec::with_capacity(self.parts.cfg.models.len() + 1);
        configured.push(self.parts.cfg.model.clone());
        configured.extend(self.parts.cfg.models.iter().cloned());
        crate::acp::available_models(current, &configured)
    }

    /// A session became ready: every server of it is up (after `session/new`, and after
    /// `session/load`). Its `_SessionStart` round and its interceptor servers'
    /// `interceptors/list` start now (SPEC H10, X1); the opening request is answered when they
    /// are decided, within one hook timeout.
    fn session_ready(&mut self, sid: SessionId, source: Source) {
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let sess = &mut entry.session;
        // SPEC M11: servers whose authorization failed start without tools; the user is told.
        for text in self.parts.servers.start_notices(&sess.servers) {
            sess.notify("mcp_server_unauthorized", text);
        }
        // C56: hooks this session's servers expose but may not run; the WARN is the table's.
        for text in crate::hooks::hooks_off(
            &self.parts.servers,
            &sess.servers,
            &self.parts.cfg.hook_servers,
        ) {
            sess.notify("hooks_not_allowlisted", text);
        }
        let mut cx = self.parts.mcp();
        if entry.begin_opening(source, &mut cx) {
            self.check_opening(sid);
        }
    }

    /// Finishes the opening of `sid` once its round and listings are decided: the texts wait
    /// for the first prompt, the interceptors screen the session's calls, and the opening
    /// request is answered (SPEC A2, H10, X1).
    fn check_opening(&mut self, sid: SessionId) {
        let Some((source, rpc)) = self
            .sessions
            .get_mut(&sid)
            .and_then(|e| e.finish_opening(&mut self.parts.out))
        else {
            return;
        };
        // `session/new` answers with the session id; `session/load` and `session/resume` with
        // the same model fields (ACP `LoadSessionResponse`, `ResumeSessionResponse`).
        let mut result = self.session_result(sid);
        if source != Source::New
            && let Some(fields) = result.as_object_mut()
        {
            fields.remove("sessionId");
        }
        self.reply_ok(&rpc, &result);
        self.advertise_commands(sid);
        // A prompt that came while the session was starting runs now.
        if let Some((id, text)) = self.sessions.get_mut(&sid).and_then(|e| e.queued.take()) {
            self.begin_prompt(sid, id, text);
        }
    }

    /// Tells the client the commands of session `sid` (its servers' prompts, SPEC A11) with an
    /// `available_commands_update`, once the session is answered and whenever they differ from
    /// what it was last told; nothing while there never were any.
    pub(super) fn advertise_commands(&mut self, sid: SessionId) {
        let Some(sess) = session_if(&mut self.sessions, sid, SessionEntry::is_open) else {
            return;
        };
        let commands = self.parts.servers.commands(&sess.servers);
        let unchanged = match &sess.commands_sent {
            Some(sent) => *sent == commands,
            None => commands.is_empty(),
        };
        if unchanged {
            return;
        }
        self.parts.out.send_update(
            &sid.to_string(),
            &json!({"sessionUpdate": "available_commands_update", "availableCommands": commands}),
        );
        sess.commands_sent = Some(commands);
    }

    /// A starting session failed (a server, or its transcript; `loading`: a `session/load` or
    /// `session/resume`): forget it, stop its servers, close its file and answer its request
    /// with `code` and `message`.
    fn abandon_start(&mut self, sid: SessionId, loading: bool, code: i64, message: String) {
        let Some(entry) = self.sessions.remove(&sid) else {
            return;
        };
        self.elicitations.forget_session(sid);
        for &slot in &entry.session.servers {
            // SPEC M11: a login the client shows is over with its server.
            self.on_login_done(slot);
            self.parts.servers.stop(
                slot,
                "session start failed",
                &mut self.parts.out,
                &mut self.parts.timers,
            );
        }
        // A load names the session it failed to open (C03); a new session never existed.
        let data = loading.then(|| json!({"sessionId": sid.to_string()}));
        self.parts.store.close(sid, &mut self.parts.out);
        if let Lifecycle::Starting { request } | Lifecycle::Opening { request, .. } =
            &entry.lifecycle
        {
            self.reply_err(Some(request), code, message, data);
        }
        if let Some((queued, _)) = entry.queued {
            self.session_not_found(&queued, &sid.to_string());
        }
    }

    /// `session/load` (`replay`) or `session/resume` (SPEC A9): open the stored session's
    /// transcript (and lock it), start its servers (SPEC A2), read the transcript back —
    /// replaying it as `session/update`s for a load — then answer. Refused when sessions are
    /// not saved, for an id this agent could not have written (never a path), and for a
    /// session already open in this agent (its running turn keeps its budgets, SPEC I2).
    pub(super) fn on_session_load(&mut self, id: RpcId, params: &Value, replay: bool) {
        let method = if replay {
            "session/load"
        } else {
            "session/resume"
        };
        if !self.parts.store.is_on() {
            return self.reply_err(
                Some(&id),
                jsonrpc::RpcError::METHOD_NOT_FOUND,
                format!(
                    "{method}: sessions are not saved by this agent (BUZZ_AGENT_STATE_DIR=off)"
                ),
                None,
            );
        }
        let named = match crate::acp::string_field(params, method, "sessionId") {
            Ok(s) => s.to_owned(),
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let Some(sid) = SessionId::parse(&named) else {
            // C03: an unknown session is -32002 wherever it is named; this one cannot even be a
            // file name of the state directory, so nothing is looked up.
            let shown = crate::text::utf8_prefix(&named, 200);
            return self.reply_err(
                Some(&id),
                jsonrpc::RpcError::RESOURCE_NOT_FOUND,
                format!(
                    "session not found: {shown:?} is not a session id of this agent (sess_ and 32 hex digits)"
                ),
                Some(json!({"sessionId": named})),
            );
        };
        if self.sessions.contains_key(&sid) || self.parts.store.has_file(sid) {
            return self.reply_err(
                Some(&id),
                jsonrpc::RpcError::INVALID_PARAMS,
                format!("{method}: session {sid} is already open in this agent"),
                Some(json!({"sessionId": named})),
            );
        }
        let spec = match crate::acp::decode_session_setup(params, method) {
            Ok(s) => s,
            Err((m, data)) => {
                return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, Some(data));
            }
        };
        if let Some(max) = self.parts.cfg.max_sessions
            && self.sessions.len() >= max
        {
            return self.reply_err(
                Some(&id),
                jsonrpc::RpcError::SERVER_ERROR,
                format!("too many sessions: BUZZ_AGENT_MAX_SESSIONS={max}"),
                None,
            );
        }
        let slots: Vec<ServerSlot> = spec
            .servers
            .iter()
            .map(|entry| {
                self.parts
                    .servers
                    .create(sid, &spec.cwd, &spec.additional_directories, entry)
            })
            .collect();
        let sess = Session::new(sid, slots);
        self.log(
            LogLevel::Info,
            format!(
                "session {sid}: {} with {} MCP server(s) from {}",
                if replay { "loading" } else { "resuming" },
                sess.servers.len(),
                self.parts.store.path_of(sid)
            ),
        );
        self.sessions.insert(sid, SessionEntry::starting(sess, id));
        self.read_project(
            sid,
            &spec.cwd,
            spec.system_prompt,
            AfterRead::Load { replay },
        );
    }

    /// What the store reports about loads (SPEC A9).
    pub(super) fn route_store(&mut self, events: Vec<StoreEvent>) {
        for event in events {
            match event {
                StoreEvent::Opened(sid) => {
                    // The transcript is ours: start the servers, then read it.
                    if !self.spawn_servers(sid) {
                        self.parts.store.read(sid, &mut self.parts.out);
                    }
                }
                StoreEvent::Loaded(sid, restored) => {
                    let Some(sess) = self.sessions.get_mut(&sid).map(|e| &mut e.session) else {
                        continue;
                    };
                    sess.transcript = restored.transcript;
                    sess.model_override = restored.model;
                    sess.thought_level = restored.thought_level;
                    sess.remembered = restored.remembered;
                    // L10: a DeepSeek-style server's history keeps it one after a restart.
                    if sess.transcript.messages().iter().any(|m| {
                        matches!(m, crate::llm::Message::Assistant { reasoning, .. }
                            if reasoning.contains(&crate::llm::ReasoningBlock::ChatField(
                                crate::llm::ChatReasoningField::ReasoningContent)))
                    }) {
                        self.parts.llm.learned.reasoning_content = true;
                    }
                    // H10: a loaded session opens like a new one: its `_SessionStart` round
                    // and interceptor listings, then the answer.
                    let source = if restored.replayed {
                        Source::Load
                    } else {
                        Source::Resume
                    };
                    self.session_ready(sid, source);
                }
                StoreEvent::Released(sid) => self.start_queued(sid),
                StoreEvent::LoadFailed {
                    session,
                    code,
                    message,
                } => {
                    self.log(LogLevel::Error, message.clone());
                    self.abandon_start(session, true, code, message);
                }
            }
        }
    }

    /// `session/list` (SPEC A9): the saved sessions, newest first, a page at a time,
    /// optionally only those of one `cwd`.
    pub(super) fn on_session_list(&mut self, id: RpcId, params: &Value) {
        if !self.parts.store.is_on() {
            return self.reply_err(
                Some(&id),
                jsonrpc::RpcError::METHOD_NOT_FOUND,
                "session/list: sessions are not saved by this agent (BUZZ_AGENT_STATE_DIR=off)"
                    .into(),
                None,
            );
        }
        let optional = |field: &str| -> Result<Option<String>, String> {
            match params.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("session/list: {field} must be a string")),
            }
        };
        let (cwd, cursor) = match (optional("cwd"), optional("cursor")) {
            (Ok(cwd), Ok(cursor)) => (cwd, cursor),
            (Err(m), _) | (_, Err(m)) => {
                return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None);
            }
        };
        if let Some(cwd) = &cwd
            && !cwd.starts_with('/')
        {
            return self.reply_err(
                Some(&id),
                jsonrpc::RpcError::INVALID_PARAMS,
                "session/list: cwd must be an absolute path".into(),
                Some(json!({"cwd": cwd})),
            );
        }
        if let Err(m) =
            self.parts
                .store
                .list(id.clone(), cwd, cursor.as_deref(), &mut self.parts.out)
        {
            self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None);
        }
    }

    /// A hook call ended (SPEC H3, H4): it belongs to a session's `_SessionStart` or
    /// `_SessionEnd` round, or to a round of its turn.
    pub(super) fn route_hook_outcome(
        &mut self,
        call: crate::mcp::HookCallRef,
        outcome: HookOutcome,
    ) {
        let sid = call.session;
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let mut cx = self.parts.cx();
        match entry.on_hook_outcome(call.round, call.index, outcome, &mut cx) {
            HookRouted::Opening => self.check_opening(sid),
            HookRouted::Ending => self.check_ending(sid),
            HookRouted::Turn(Some(end)) => self.end_turn(sid, end),
            HookRouted::Turn(None) | HookRouted::Nobody => {}
        }
    }

    /// A page of an interceptor server's `interceptors/list` came back (SPEC X1).
    pub(super) fn route_interceptor_list(
        &mut self,
        sid: SessionId,
        server: ServerSlot,
        reply: Result<Value, ListLost>,
    ) {
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let mut cx = self.parts.mcp();
        if entry.on_interceptor_list(server, reply, &mut cx) {
            self.check_opening(sid);
        }
    }

    pub(super) fn on_set_model(&mut self, id: &RpcId, params: &Value) {
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
        match SessionId::parse(&sid)
            .and_then(|id| self.sessions.get_mut(&id))
            .filter(|e| !e.is_starting())
            .map(|e| &mut e.session)
        {
            Some(s) => {
                let sid = s.id;
                s.model_override = Some(model.clone());
                let effort = s.effort(&self.parts.cfg);
                self.log(
                    LogLevel::Info,
                    format!("session {sid}: model set to {model}"),
                );
                // A client that shows the model selector (configOptions) sees the change too,
                // before the answer.
                let options =
                    crate::acp::config_options(&model, &self.available_models(&model), effort);
                self.parts.out.send_update(
                    &sid.to_string(),
                    &json!({"sessionUpdate": "config_option_update", "configOptions": options}),
                );
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

    /// `session/set_config_option` (SPEC A5, case C58; SPEC L12): `configId` `model` with one
    /// of the advertised models as `value` sets the session's model; `configId`
    /// `thought_level` with one of the advertised levels sets its reasoning effort from the
    /// next request on. The answer is the full `configOptions`. Unknown session, option or
    /// value → `-32602`.
    pub(super) fn on_set_config_option(&mut self, id: &RpcId, params: &Value) {
        const METHOD: &str = "session/set_config_option";
        let fields = crate::acp::string_field(params, METHOD, "sessionId").and_then(|sid| {
            crate::acp::string_field(params, METHOD, "configId").map(|c| (sid.to_string(), c))
        });
        let (sid, config_id) = match fields {
            Ok(f) => f,
            Err(m) => return self.reply_err(Some(id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        if config_id != crate::acp::MODEL_CONFIG_ID
            && config_id != crate::acp::THOUGHT_LEVEL_CONFIG_ID
        {
            let m = format!(
                "{METHOD}: unknown configId '{config_id}' (this agent has: model, thought_level)"
            );
            return self.reply_err(Some(id), jsonrpc::RpcError::INVALID_PARAMS, m, None);
        }
        let Some(sess_id) = SessionId::parse(&sid)
            .filter(|s| self.sessions.get(s).is_some_and(|e| !e.is_starting()))
        else {
            return self.reply_err(
                Some(id),
                jsonrpc::RpcError::INVALID_PARAMS,
                format!("{METHOD}: session not found: {sid}"),
                Some(json!({"sessionId": sid})),
            );
        };
        let Some(sess) = self.sessions.get(&sess_id).map(|e| &e.session) else {
            return;
        };
        let current = sess.model(&self.parts.cfg.model).to_string();
        let mut effort = sess.effort(&self.parts.cfg);
        let available = self.available_models(&current);
        let value = params.get("value").and_then(Value::as_str).map(str::trim);
        let (model, line) = if config_id == crate::acp::THOUGHT_LEVEL_CONFIG_ID {
            let Some(level) = value.and_then(crate::acp::parse_effort_value) else {
                let values: Vec<&str> = crate::acp::EFFORT_VALUES.iter().map(|v| v.0).collect();
                let m = format!("{METHOD}: value must be one of {}", values.join(", "));
                return self.reply_err(Some(id), jsonrpc::RpcError::INVALID_PARAMS, m, None);
            };
            if let Some(e) = self.sessions.get_mut(&sess_id) {
                e.session.thought_level = Some(level);
            }
            effort = level;
            let line = format!(
                "session {sess_id}: thinking effort set to {}",
                crate::acp::effort_value(level)
            );
            (current, line)
        } else {
            let Some(model) = value.filter(|v| available.iter().any(|m| m == v)) else {
                let m = format!(
                    "{METHOD}: value must be one of the advertised models: {}",
                    available.join(", ")
                );
                return self.reply_err(Some(id), jsonrpc::RpcError::INVALID_PARAMS, m, None);
            };
            let model = model.to_string();
            if let Some(e) = self.sessions.get_mut(&sess_id) {
                e.session.model_override = Some(model.clone());
            }
            let line = format!("session {sess_id}: model set to {model}");
            (model, line)
        };
        self.log(LogLevel::Info, line);
        let options = crate::acp::config_options(&model, &self.available_models(&model), effort);
        self.reply_ok(id, &json!({"configOptions": options}));
    }

    /// `session/close` (ACP, SPEC H11): the session's turn is cancelled and answered, its
    /// `_SessionEnd` round runs, then its servers are stopped (M8) and the request is
    /// answered `{}`. Unknown, still opening or already ending: `-32002`.
    pub(super) fn on_session_close(&mut self, id: RpcId, params: &Value) {
        let named = match crate::acp::string_field(params, "session/close", "sessionId") {
            Ok(s) => s.to_string(),
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let Some(sid) = SessionId::parse(&named)
            .filter(|sid| self.sessions.get(sid).is_some_and(SessionEntry::is_open))
        else {
            return self.session_not_found(&id, &named);
        };
        self.cancel_all_of(sid, "session closed");
        self.start_ending(sid, EndReason::Close, Some(id));
    }

    /// The `_SessionEnd` point of `sid` (SPEC H11): once per session that opened; `close` is
    /// the `session/close` request to answer when it is done.
    pub(super) fn start_ending(&mut self, sid: SessionId, reason: EndReason, close: Option<RpcId>) {
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let mut cx = self.parts.mcp();
        if entry.begin_ending(reason, close, &mut cx) {
            self.check_ending(sid);
        }
    }

    /// Finishes the ending of `sid` once its round is decided: the texts are logged; after a
    /// `session/close` the session's servers are stopped, the session is forgotten and the
    /// request is answered.
    fn check_ending(&mut self, sid: SessionId) {
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some((reason, Some(rpc))) = entry.finish_ending(&mut self.parts.out) else {
            return;
        };
        // A9: what the session recorded is written (then synced and its file closed, its lock
        // released: another agent may load it now).
        self.parts.store.sync(&mut entry.session);
        self.parts.store.flush(sid, &mut self.parts.out);
        self.elicitations.forget_session(sid);
        if let Some(entry) = self.sessions.remove(&sid)
            && self.shutdown.is_none()
        {
            for slot in entry.session.servers {
                self.on_login_done(slot);
                self.parts.servers.stop(
                    slot,
                    "the session was closed",
                    &mut self.parts.out,
                    &mut self.parts.timers,
                );
            }
        }
        self.log(
            LogLevel::Info,
            format!("session {sid}: closed ({})", reason.as_str()),
        );
        // SPEC A9: the file is synced and closed (its lock released) before the answer.
        let answer = jsonrpc::encode_result(&rpc, &json!({}));
        self.parts
            .store
            .close_then_send(sid, Some(answer), &mut self.parts.out);
    }
}
