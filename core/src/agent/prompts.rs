//! The router's prompt handling (SPEC A3, A4, A8, A11): `session/prompt` starts a session's
//! [`Turn`], or queues the prompt behind a cancelled turn, an answer waiting for the disk or
//! the session's own start; a command (`/<server>:<prompt>`) runs its `prompts/get` first;
//! `session/cancel` cancels the command or the turn. Each turn step borrows the session and the
//! step context ([`Cx`]); what a turn reports back (its [`TurnEnd`]) is answered here, and the
//! turn's inputs (LLM events, tool results, permission answers, interceptor replies) are
//! routed to it by `turn_no`, so a late answer of an earlier turn is dropped.

use super::Agent;
use crate::acp::PermissionAnswer;
use crate::config::LogLevel;
use crate::cx::Cx;
use crate::ids::{SessionId, TurnNo};
use crate::jsonrpc::{self, RpcError, RpcId};
use crate::mcp::{InterceptRef, McpRequest, Purpose, ToolCallRef};
use crate::permissions::PermissionRequest;
use crate::session::Session;
use crate::tool_calls::InterceptEvent;
use crate::tools::ToolOutput;
use crate::turn::{StopReason, Turn, TurnEnd};
use serde_json::{Value, json};

impl Agent {
    /// Runs one step of the turn of `sid` with its session and the agent's shared parts; a
    /// turn that ends is answered. Nothing happens without a turn.
    pub(super) fn step_turn(
        &mut self,
        sid: SessionId,
        step: impl FnOnce(&mut Turn, &mut Session, &mut Cx<'_>) -> Option<TurnEnd>,
    ) {
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(turn) = entry.turn.as_mut() else {
            return;
        };
        let mut cx = self.parts.cx();
        if let Some(end) = step(turn, &mut entry.session, &mut cx) {
            self.end_turn(sid, end);
        }
    }

    /// Whether session `sid` has a running turn.
    pub(super) fn has_turn(&self, sid: SessionId) -> bool {
        self.sessions.get(&sid).is_some_and(|e| e.turn.is_some())
    }

    /// The number of session `sid`'s running turn, if any (late answers of an earlier turn
    /// are dropped by comparing it).
    pub(super) fn turn_no(&self, sid: SessionId) -> Option<TurnNo> {
        self.sessions
            .get(&sid)
            .and_then(|e| e.turn.as_ref())
            .map(Turn::no)
    }

    /// `session/prompt` (SPEC A3): starts a turn, or queues the prompt behind a cancelled one.
    pub(super) fn on_prompt(&mut self, id: RpcId, params: &Value) {
        let named = match crate::acp::string_field(params, "session/prompt", "sessionId") {
            Ok(s) => s.to_string(),
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let Some(sid) = SessionId::parse(&named)
            .filter(|sid| self.sessions.get(sid).is_some_and(|e| !e.is_ending()))
        else {
            return self.session_not_found(&id, &named);
        };
        let text = match crate::acp::render_prompt(params) {
            Ok(t) => t,
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let starting = entry.is_starting();
        // Whether the prompt may wait for the session to be free: behind a cancelled turn,
        // behind the last answer, which waits for the disk (sent before the client read it),
        // or behind the session's own start (a client that sends its first prompt before the
        // session/new answer, knowing the id: its project files are still being read).
        let running_command = entry.session.command.is_some();
        let may_queue = match &entry.turn {
            Some(turn) => Some(turn.is_cancelled()),
            None if running_command => Some(false),
            None if starting || self.parts.store.is_holding(sid) => Some(true),
            None => None,
        };
        if let Some(may_queue) = may_queue {
            if may_queue && entry.queued.is_none() {
                entry.queued = Some((id, text));
            } else {
                self.reply_err(
                    Some(&id),
                    jsonrpc::RpcError::INVALID_PARAMS,
                    "prompt already in flight".into(),
                    Some(json!({"sessionId": sid.to_string()})),
                );
            }
            return;
        }
        self.begin_prompt(sid, id, text);
    }

    /// A prompt of the free session `sid` starts: a command of the session (`/<server>:<prompt>
    /// …`, SPEC A11) runs its `prompts/get` first; any other text starts the turn.
    pub(super) fn begin_prompt(&mut self, sid: SessionId, rpc: RpcId, text: String) {
        let found = crate::mcp::parse_command(&text).and_then(|(name, rest)| {
            let sess = &self.sessions.get(&sid)?.session;
            let found = self.parts.servers.find_command(&sess.servers, name)?;
            Some((name.to_string(), rest.to_string(), found))
        });
        let Some((name, rest, found)) = found else {
            return self.start_turn(sid, rpc, text);
        };
        let (args, extra) = match crate::mcp::bind_arguments(&found.prompt, &rest) {
            Ok(bound) => bound,
            Err(why) => {
                let usage = crate::mcp::usage(&found.prefix, &found.prompt);
                return self.reply_err(
                    Some(&rpc),
                    jsonrpc::RpcError::INVALID_PARAMS,
                    format!("The command /{name} cannot run: {why} (usage: {usage})."),
                    Some(json!({"sessionId": sid.to_string()})),
                );
            }
        };
        if !found.ready {
            return self.reply_err(
                Some(&rpc),
                jsonrpc::RpcError::SERVER_ERROR,
                format!(
                    "The command /{name} cannot run now: MCP server '{}' is not running.",
                    found.server
                ),
                Some(json!({"sessionId": sid.to_string()})),
            );
        }
        let params = json!({"name": found.prompt.name, "arguments": args});
        let request = McpRequest {
            method: "prompts/get",
            params: &params,
            purpose: Purpose::GetPrompt(sid),
            timeout_ms: self.parts.cfg.tool_timeout_ms,
        };
        let Some(request) = self.parts.servers.send_request(
            found.slot,
            request,
            &mut self.parts.out,
            &mut self.parts.timers,
        ) else {
            return self.start_turn(sid, rpc, text);
        };
        self.log(
            LogLevel::Info,
            format!(
                "session {sid}: command /{name}: prompts/get of MCP server '{}'",
                found.server
            ),
        );
        if let Some(entry) = self.sessions.get_mut(&sid) {
            entry.session.command = Some(crate::mcp::PendingCommand {
                rpc,
                server: found.slot,
                request,
                command: name,
                extra,
            });
        }
    }

    /// The `prompts/get` of the command of `sid` was answered (SPEC A11): its messages start
    /// the turn as the user's words; a failure answers the prompt with an error naming the
    /// command and the server, and the session goes on.
    pub(super) fn on_prompt_got(&mut self, sid: SessionId, reply: Result<Value, String>) {
        let Some(pending) = self
            .sessions
            .get_mut(&sid)
            .and_then(|e| e.session.command.take())
        else {
            return;
        };
        let cap = self.parts.cfg.max_tool_result_text_bytes;
        match reply.and_then(|r| crate::mcp::render_messages(&r, cap)) {
            Ok(mut text) => {
                if let Some(extra) = pending.extra {
                    text.push_str("\n\n");
                    text.push_str(&extra);
                }
                self.start_turn(sid, pending.rpc, text);
            }
            Err(why) => {
                let message = format!("The command /{} failed: {why}.", pending.command);
                self.log(LogLevel::Warn, format!("session {sid}: {message}"));
                self.reply_err(
                    Some(&pending.rpc),
                    jsonrpc::RpcError::SERVER_ERROR,
                    message,
                    Some(json!({"sessionId": sid.to_string()})),
                );
            }
        }
    }

    /// A command of `sid` still waiting for its `prompts/get` is given up (`why` is sent to
    /// the server with `notifications/cancelled`) and its prompt answered `cancelled` (SPEC
    /// A4, A11); whether there was one.
    pub(super) fn cancel_command(&mut self, sid: SessionId, why: &str) -> bool {
        let Some(pending) = self
            .sessions
            .get_mut(&sid)
            .and_then(|e| e.session.command.take())
        else {
            return false;
        };
        self.parts.servers.cancel_request(
            pending.server,
            pending.request,
            why,
            &mut self.parts.out,
            &mut self.parts.timers,
        );
        self.reply_ok(&pending.rpc, &json!({"stopReason": "cancelled"}));
        true
    }

    fn start_turn(&mut self, sid: SessionId, rpc: RpcId, text: String) {
        let no = self.parts.ids.next_turn();
        if self.parts.out.logs(LogLevel::Debug) {
            let msg = format!(
                "session {sid}: prompt #{}: {}",
                no.0,
                crate::text::utf8_prefix(&text, 2000)
            );
            self.log(LogLevel::Debug, msg);
        }
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        // SPEC A9: what came before is recorded first, then the prompt the client sent.
        self.parts.store.sync(&mut entry.session);
        self.parts.store.on_prompt(sid, &text);
        let mut cx = self.parts.cx();
        entry.turn = Some(Turn::start(no, rpc, text, &mut entry.session, &mut cx));
    }

    /// Answers the prompt of the turn of `sid` and forgets the turn; a queued prompt starts
    /// next (SPEC A3, A8).
    pub(super) fn end_turn(&mut self, sid: SessionId, end: TurnEnd) {
        let Some(entry) = self.sessions.get_mut(&sid) else {
            return;
        };
        let Some(mut turn) = entry.turn.take() else {
            return;
        };
        self.parts.timers.clear_turn(sid);
        // SPEC L13: what the turn leaves in the history, then recorded.
        turn.settle(&end, &mut entry.session);
        self.parts.store.sync(&mut entry.session);
        match &end {
            TurnEnd::Stopped(reason) => {
                self.parts.store.on_turn_end(
                    sid,
                    Some(reason.as_str()),
                    turn.meta(self.parts.cfg.prices.as_ref()),
                );
            }
            TurnEnd::Failed(message) => self.parts.store.on_turn_end(sid, None, json!(message)),
        }
        let answer = match end {
            TurnEnd::Stopped(reason) => {
                self.log(
                    LogLevel::Info,
                    format!(
                        "session {sid}: turn ended: {reason} after {} round(s)",
                        turn.rounds()
                    ),
                );
                jsonrpc::encode_result(
                    turn.rpc(),
                    &json!({"stopReason": reason.as_str(), "_meta": turn.meta(self.parts.cfg.prices.as_ref())}),
                )
            }
            TurnEnd::Failed(message) => {
                self.log(
                    LogLevel::Error,
                    format!("session {sid}: turn failed: {message}"),
                );
                jsonrpc::encode_error(
                    Some(turn.rpc()),
                    &RpcError {
                        code: RpcError::SERVER_ERROR,
                        message,
                        data: None,
                    },
                )
            }
        };
        // SPEC A9: the answer goes out once the turn's records, `turn_end` included, are on
        // the disk; a queued prompt starts after it (SPEC I8: its updates follow the answer).
        self.parts
            .store
            .send_when_synced(sid, answer, &mut self.parts.out);
        self.start_queued(sid);
    }

    /// Starts the prompt queued for `sid` (behind a cancelled turn, or behind an answer that
    /// waits for the disk) once neither is left.
    pub(super) fn start_queued(&mut self, sid: SessionId) {
        if self.has_turn(sid) || self.parts.store.is_holding(sid) {
            return;
        }
        if let Some((id, text)) = self.sessions.get_mut(&sid).and_then(|e| e.queued.take()) {
            self.begin_prompt(sid, id, text);
        }
    }

    /// Starts the next round of every turn that is ready (after each step), and the tool calls
    /// a re-listing held (C65).
    pub(super) fn run_ready_turns(&mut self) {
        let max_par = self.parts.cfg.max_parallel_tools;
        let now = self.parts.out.now();
        let held: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, e)| {
                e.turn
                    .as_ref()
                    .is_some_and(|t| t.can_dispatch(&self.parts.servers, max_par, now))
            })
            .map(|(sid, _)| *sid)
            .collect();
        for sid in held {
            self.step_turn(sid, |turn, sess, cx| turn.dispatch(sess, cx));
        }
        // Loop because a round can end a turn at once and start a queued prompt.
        for _ in 0..64 {
            let servers = &self.parts.servers;
            let ready: Vec<SessionId> = self
                .sessions
                .iter_mut()
                .filter_map(|(sid, e)| {
                    e.turn
                        .as_mut()
                        .is_some_and(|t| t.tools_relisted(servers))
                        .then_some(*sid)
                })
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
    pub(super) fn on_cancel(&mut self, params: &Value) {
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
        // A prompt waiting for its session to start is answered at once.
        if let Some((queued, _)) = self
            .sessions
            .get_mut(&sid)
            .filter(|e| e.is_starting())
            .and_then(|e| e.queued.take())
        {
            self.reply_ok(&queued, &json!({"stopReason": "cancelled"}));
            return;
        }
        if self.cancel_command(sid, "cancelled by the client") {
            return;
        }
        self.cancel_turn(sid, "cancelled by the client");
    }

    /// Cancels the running turn of `sid` (SPEC A4). Idle or unknown: nothing happens.
    pub(super) fn cancel_turn(&mut self, sid: SessionId, why: &str) {
        if !self.has_turn(sid) {
            self.log(
                LogLevel::Debug,
                format!("session {sid}: cancel with no running turn ignored"),
            );
            return;
        }
        self.step_turn(sid, |turn, sess, cx| turn.cancel(why, sess, cx));
    }

    /// Everything `sid` is doing is stopped, for `why` (its close, the agent's shutdown): the
    /// queued prompt is answered `cancelled`, the command waiting for `prompts/get` and the
    /// turn are cancelled, and a turn still in a hook gate is answered `cancelled` now (neither
    /// waits for hooks).
    pub(super) fn cancel_all_of(&mut self, sid: SessionId, why: &str) {
        if let Some((queued, _)) = self.sessions.get_mut(&sid).and_then(|e| e.queued.take()) {
            self.reply_ok(&queued, &json!({"stopReason": "cancelled"}));
        }
        self.cancel_command(sid, why);
        self.cancel_turn(sid, why);
        if self.has_turn(sid) {
            self.end_turn(sid, TurnEnd::Stopped(StopReason::Cancelled));
        }
    }

    /// A permission answer (or its timeout) for a tool call of a turn (SPEC A7).
    pub(super) fn route_permission_answer(
        &mut self,
        req: PermissionRequest,
        answer: PermissionAnswer,
    ) {
        if self.turn_no(req.session) == Some(req.turn) {
            self.step_turn(req.session, |turn, sess, cx| {
                turn.on_permission(req.index, answer, sess, cx)
            });
        }
    }

    /// A tool call of a turn ended (SPEC L2, L3).
    pub(super) fn route_tool_result(&mut self, call: ToolCallRef, out: ToolOutput, failed: bool) {
        if self.turn_no(call.session) == Some(call.turn) {
            self.step_turn(call.session, |turn, sess, cx| {
                turn.on_tool_result(call.index, out, failed, sess, cx)
            });
        }
    }

    /// An `interceptor/invoke` of a tool call's chain came back, was lost or timed out.
    pub(super) fn route_intercept(&mut self, call: InterceptRef, event: InterceptEvent) {
        if self.turn_no(call.session) == Some(call.turn) {
            self.step_turn(call.session, |turn, sess, cx| {
                turn.on_intercept(call, event, sess, cx)
            });
        }
    }
}
