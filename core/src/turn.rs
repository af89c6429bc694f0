//! The prompt turn (SPEC L1–L4, A3, A4, A6–A8): rounds of LLM call → tool calls → results,
//! the `_Stop` gate at the end, cancellation, and the prompt response with its `_meta`.

use crate::acp::{PermissionAnswer, chunk_update};
use crate::agent::{Agent, OutRequest, TimerKey};
use crate::config::{LogLevel, PermissionMode};
use crate::hooks::{
    HookPoint, HookRound, MAX_REMINDERS, REPLY_GUARD_SERVER, REPLY_REMINDER, append_injections,
};
use crate::io::{Action, LlmCallId, LlmIo};
use crate::jsonrpc::{self, RpcId};
use crate::llm::{
    ChatReasoningField, LlmRequest, LlmResponse, Message, ReasoningBlock, StopKind, StreamDecoder,
    StreamDelta, ToolCall, ToolDef,
};
use crate::mcp::Purpose;
use crate::provider::{self, HttpFailure};
use crate::time::MonoTime;
use crate::tools::ToolOutput;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Where an exposed tool name routes: (server slot, bare tool name, qualified `server__tool`).
pub(crate) type Route = (u64, String, String);

/// Tool calls of one response that are run at most (SPEC L2).
pub const MAX_CALLS_PER_RESPONSE: usize = 64;
/// Nudge appended after a `max_tokens`-truncated response (SPEC L1).
pub const MAX_TOKENS_NUDGE: &str =
    "Your reply was cut off because it hit the output token limit; continue in smaller steps.";
/// Bytes of a failed response body kept for the error message (SPEC A3).
pub const ERROR_BODY_CAP: usize = 4096;
/// Longest successful response body an attempt reads, in bytes (256 MiB): a provider that
/// streams without end (an endless answer, a loop of deltas) cannot grow the response held in
/// memory without bound; the attempt fails, not retried. A real response, even 128k output
/// tokens in Chat SSE framing, is a few tens of MiB.
pub const MAX_RESPONSE_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// How long to wait for more bytes once the decoder has the whole answer (case C24 b), in ms.
pub const FINAL_ANSWER_GRACE_MS: u64 = 1500;

/// Where a turn is.
pub(crate) enum Phase {
    /// About to start the next round (picked up after the current step).
    Ready,
    /// An LLM attempt is streaming.
    Llm(Box<LlmAttempt>),
    /// Waiting before the next attempt (SPEC L5).
    Backoff {
        until: MonoTime,
        attempt: u32,
        purpose: CallPurpose,
    },
    /// Tool calls of the last response.
    Tools(Vec<Slot>),
    /// A `_Stop` or `_PostCompact` hook round (SPEC H5, H7).
    Gate(HookRound),
}

/// What an LLM call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallPurpose {
    /// A round of the loop (history + tools).
    Round,
    /// A compaction summary (no tools, SPEC K1).
    Summary,
}

/// One LLM attempt.
pub(crate) struct LlmAttempt {
    pub call: LlmCallId,
    pub purpose: CallPurpose,
    pub attempt: u32,
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    pub err_body: Vec<u8>,
    /// Bytes of a 2xx body read so far (capped by [`MAX_RESPONSE_BODY_BYTES`]).
    pub body_bytes: u64,
    pub decoder: Box<dyn StreamDecoder>,
    /// Whether any text of this response reached the client (no retry after that, SPEC L5).
    pub streamed: bool,
    /// The decoder has the whole answer but the stream did not end: `idle_deadline` is the
    /// short grace after which the answer is taken (case C24 b).
    pub grace: bool,
    pub idle_deadline: MonoTime,
}

/// One tool call of a response.
pub(crate) struct Slot {
    pub acp_id: String,
    pub call: ToolCall,
    /// (server slot, bare tool name, qualified `server__tool`).
    pub route: Option<Route>,
    pub args: Value,
    pub state: SlotState,
}

pub(crate) enum SlotState {
    /// Allowed; waiting for a parallelism slot.
    Queued,
    /// `session/request_permission` sent (our request id).
    AwaitPermission(u64),
    /// `tools/call` in flight: (server slot, request id).
    Running(u64, u64),
    /// Finished; the result the model will see.
    Done(ToolOutput),
}

/// One `session/prompt` (SPEC L1: fresh counters per prompt).
pub(crate) struct Turn {
    pub rpc: RpcId,
    pub seq: u64,
    pub rounds: u32,
    /// `_Stop` objections honoured (SPEC H5; invariant `objections <= budget`, I1).
    pub objections: u32,
    pub reminders: u32,
    pub recoveries: u32,
    pub posted: bool,
    pub cancelled: bool,
    pub exhausted: bool,
    /// Compactions this prompt (SPEC K1, `BUZZ_AGENT_MAX_HANDOFFS`).
    pub handoffs: u32,
    /// The round number at which the context was last compacted (at most once per round).
    pub compacted_round: u32,
    /// Whether a context-too-long answer already triggered reactive compaction (SPEC L5).
    pub reactive_tried: bool,
    /// The live user prompt, kept through compaction (SPEC K1).
    pub prompt_text: String,
    pub phase: Phase,
    /// Exposed tool name → (server slot, bare, qualified), as offered in the last request.
    pub routes: BTreeMap<String, Route>,
}

impl Turn {
    /// The turn's own deadline, if any (tool and hook calls carry theirs in the MCP pending
    /// table, permission requests in the agent's table).
    pub(crate) fn deadline(&self) -> Option<(MonoTime, TimerKey)> {
        match &self.phase {
            Phase::Llm(a) => Some((a.idle_deadline, TimerKey::LlmIdle)),
            Phase::Backoff { until, .. } => Some((*until, TimerKey::Backoff)),
            Phase::Ready | Phase::Tools(_) | Phase::Gate(_) => None,
        }
    }
}

impl Agent {
    // ------------------------------------------------------------------ prompt / cancel

    pub(crate) fn on_prompt(&mut self, id: RpcId, params: &Value) {
        let sid = match crate::acp::string_field(params, "session/prompt", "sessionId") {
            Ok(s) => s.to_string(),
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        if self.sessions.get(&sid).is_none_or(|s| s.starting.is_some()) {
            return self.session_not_found(&id, &sid);
        }
        let text = match crate::acp::render_prompt(params) {
            Ok(t) => t,
            Err(m) => return self.reply_err(Some(&id), jsonrpc::RpcError::INVALID_PARAMS, m, None),
        };
        let Some(sess) = self.sessions.get_mut(&sid) else {
            return;
        };
        if let Some(turn) = &sess.turn {
            if turn.cancelled && sess.queued.is_none() {
                sess.queued = Some((id, text));
            } else {
                self.reply_err(
                    Some(&id),
                    jsonrpc::RpcError::INVALID_PARAMS,
                    "prompt already in flight".into(),
                    Some(json!({"sessionId": sid})),
                );
            }
            return;
        }
        self.start_turn(&sid, id, text);
    }

    pub(crate) fn session_not_found(&mut self, id: &RpcId, sid: &str) {
        self.reply_err(
            Some(id),
            jsonrpc::RpcError::RESOURCE_NOT_FOUND,
            format!("session not found: {sid}"),
            Some(json!({"sessionId": sid})),
        );
    }

    fn start_turn(&mut self, sid: &str, rpc: RpcId, text: String) {
        let seq = self.next_turn_seq;
        self.next_turn_seq += 1;
        if self.logs_enabled(LogLevel::Debug) {
            let msg = format!(
                "session {sid}: prompt #{seq}: {}",
                provider::cut(&text, 2000)
            );
            self.log(LogLevel::Debug, msg);
        }
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        sess.history.push(Message::User { text: text.clone() });
        sess.turn = Some(Turn {
            handoffs: 0,
            compacted_round: 0,
            reactive_tried: false,
            prompt_text: text,
            rpc,
            seq,
            rounds: 0,
            objections: 0,
            reminders: 0,
            recoveries: 0,
            posted: false,
            cancelled: false,
            exhausted: false,
            phase: Phase::Ready,
            routes: BTreeMap::new(),
        });
    }

    pub(crate) fn on_cancel(&mut self, params: &Value) {
        let Some(sid) = params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            self.log(
                LogLevel::Debug,
                "acp: session/cancel without sessionId ignored".into(),
            );
            return;
        };
        self.cancel_turn(&sid, "cancelled by the client");
    }

    /// Cancel the running turn of `sid` (SPEC A4). Idle or unknown: nothing happens.
    pub(crate) fn cancel_turn(&mut self, sid: &str, why: &str) {
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            self.log(
                LogLevel::Debug,
                format!("session {sid}: cancel with no running turn ignored"),
            );
            return;
        };
        if turn.cancelled {
            return;
        }
        turn.cancelled = true;
        let seq = turn.seq;
        let phase = std::mem::replace(&mut turn.phase, Phase::Ready);
        self.log(
            LogLevel::Info,
            format!("session {sid}: turn cancelled ({why})"),
        );
        match phase {
            Phase::Llm(a) => {
                self.release_llm(a.call);
                self.finish_turn(sid, "cancelled");
            }
            Phase::Backoff { .. } | Phase::Ready => self.finish_turn(sid, "cancelled"),
            Phase::Tools(mut slots) => {
                // A4: in-flight calls get notifications/cancelled; every announced call ends.
                let mut cancels = Vec::new();
                for (i, slot) in slots.iter_mut().enumerate() {
                    match slot.state {
                        SlotState::Running(server, req) => {
                            cancels.push((i, Some((server, req)), None))
                        }
                        SlotState::AwaitPermission(out) => cancels.push((i, None, Some(out))),
                        SlotState::Queued => cancels.push((i, None, None)),
                        SlotState::Done(_) => {}
                    }
                }
                if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
                    t.phase = Phase::Tools(slots);
                }
                for (i, running, out) in cancels {
                    if let Some((server, req)) = running {
                        self.cancel_mcp_request(server, req, why);
                    }
                    if let Some(out) = out {
                        self.out_requests.remove(&out);
                    }
                    let out = ToolOutput {
                        text: format!("tool call cancelled: {why}"),
                        is_error: true,
                    };
                    self.complete_slot(sid, seq, i, out, true);
                }
                self.maybe_finish_tools(sid);
            }
            Phase::Gate(round) => {
                // Hooks are not cancelled: their own timeout bounds them (SPEC A4).
                if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
                    t.phase = Phase::Gate(round);
                }
            }
        }
    }

    /// Answer the prompt and end the turn; a queued prompt starts next (SPEC A3, A8).
    pub(crate) fn finish_turn(&mut self, sid: &str, stop_reason: &str) {
        let budget = self.cfg.stop_max_rejections;
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.take() else { return };
        let queued = sess.queued.take();
        let meta = json!({"buzz": {
            "rounds": turn.rounds,
            "stopObjections": turn.objections,
            "stopBudget": budget,
            "stopBudgetExhausted": turn.exhausted
        }});
        self.log(
            LogLevel::Info,
            format!(
                "session {sid}: turn ended: {stop_reason} after {} round(s)",
                turn.rounds
            ),
        );
        self.reply_ok(
            &turn.rpc,
            &json!({"stopReason": stop_reason, "_meta": meta}),
        );
        if let Some((id, text)) = queued {
            self.start_turn(sid, id, text);
        }
    }

    /// Fail the prompt with a JSON-RPC error (LLM failure after retries, SPEC A3).
    fn fail_turn(&mut self, sid: &str, message: String) {
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.take() else { return };
        let queued = sess.queued.take();
        self.log(
            LogLevel::Error,
            format!("session {sid}: turn failed: {message}"),
        );
        self.reply_err(
            Some(&turn.rpc),
            jsonrpc::RpcError::SERVER_ERROR,
            message,
            None,
        );
        if let Some((id, text)) = queued {
            self.start_turn(sid, id, text);
        }
    }

    /// Start the next round of every turn that is `Ready` (called after each step).
    pub(crate) fn run_ready_sessions(&mut self) {
        // Loop because a round can finish synchronously and queue another prompt.
        for _ in 0..64 {
            let ready: Vec<String> = self
                .sessions
                .values()
                .filter(|s| {
                    s.turn
                        .as_ref()
                        .is_some_and(|t| matches!(t.phase, Phase::Ready))
                })
                .map(|s| s.id.clone())
                .collect();
            if ready.is_empty() {
                return;
            }
            for sid in ready {
                self.next_round(&sid);
            }
        }
    }

    fn next_round(&mut self, sid: &str) {
        let max_rounds = self.cfg.max_rounds;
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        if turn.cancelled {
            return self.finish_turn(sid, "cancelled");
        }
        if max_rounds > 0 && turn.rounds >= max_rounds {
            return self.finish_turn(sid, "max_turn_requests");
        }
        if turn.compacted_round != turn.rounds + 1 && self.compaction_needed(sid) {
            return self.begin_compaction(
                sid,
                "the context reached 90% of BUZZ_AGENT_MAX_CONTEXT_TOKENS",
            );
        }
        if let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
            turn.rounds += 1;
        }
        self.restart_due_servers(sid);
        self.start_llm_attempt(sid, 1, CallPurpose::Round);
    }

    // ------------------------------------------------------------------ LLM attempts

    /// The tools the model may call now: every ready server's non-hook tools, in registration
    /// order (SPEC M3, M4, I10).
    pub(crate) fn visible_tools(&self, sid: &str) -> (Vec<ToolDef>, BTreeMap<String, Route>) {
        let mut defs = Vec::new();
        let mut routes = BTreeMap::new();
        let Some(sess) = self.sessions.get(sid) else {
            return (defs, routes);
        };
        for slot in &sess.servers {
            let Some(s) = self.servers.get(slot) else {
                continue;
            };
            // M9: a recovering server keeps its tools listed; a permanently dead one loses them.
            if s.permanent || s.tools.is_empty() {
                continue;
            }
            for t in &s.tools {
                if routes.contains_key(&t.exposed) {
                    continue;
                }
                defs.push(ToolDef {
                    name: t.exposed.clone(),
                    description: t.description.clone(),
                    input_schema: t.schema.clone(),
                });
                routes.insert(
                    t.exposed.clone(),
                    (*slot, t.bare.clone(), format!("{}__{}", s.name, t.bare)),
                );
            }
        }
        (defs, routes)
    }

    pub(crate) fn start_llm_attempt(&mut self, sid: &str, attempt: u32, purpose: CallPurpose) {
        let (defs, routes) = match purpose {
            CallPurpose::Round => self.visible_tools(sid),
            CallPurpose::Summary => (Vec::new(), BTreeMap::new()),
        };
        let call = LlmCallId(self.next_llm);
        self.next_llm += 1;
        if !self.sessions.contains_key(sid) {
            return;
        }
        let model = self.model_of(sid);
        let summary_messages = match purpose {
            CallPurpose::Round => None,
            CallPurpose::Summary => Some(self.summary_messages(sid)),
        };
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        // A round sends the history through its cache of serialized messages (issue #15).
        let (system, messages, cache) = match &summary_messages {
            None => {
                let (messages, cache) = sess.history.with_cache();
                (self.cfg.system_prompt.as_deref(), messages, Some(cache))
            }
            Some(summary) => (
                Some(crate::compaction::SUMMARY_SYSTEM_PROMPT),
                &summary[..],
                None,
            ),
        };
        let req = LlmRequest {
            model: &model,
            system,
            messages,
            tools: &defs,
            max_output_tokens: self.cfg.max_output_tokens,
        };
        let request = provider::build_request_cached(&self.cfg, &req, &self.learned, cache);
        let decoder = provider::decoder(&self.cfg, format!("call_{}", call.0));
        let idle = self.now.plus_ms(self.cfg.llm_timeout_ms);
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        if purpose == CallPurpose::Round {
            turn.routes = routes;
        }
        turn.phase = Phase::Llm(Box::new(LlmAttempt {
            call,
            purpose,
            attempt,
            status: None,
            headers: Vec::new(),
            err_body: Vec::new(),
            body_bytes: 0,
            decoder,
            streamed: false,
            grace: false,
            idle_deadline: idle,
        }));
        self.llm_calls.insert(call, sid.to_string());
        self.log(
            LogLevel::Debug,
            format!("session {sid}: {call} attempt {attempt}: {request:?}"),
        );
        self.push(Action::CallLlm { call, request });
    }

    pub(crate) fn on_llm(&mut self, call: LlmCallId, event: LlmIo) {
        let Some(sid) = self.llm_calls.get(&call).cloned() else {
            return;
        };
        let idle_ms = self.cfg.llm_timeout_ms;
        let now = self.now;
        let Some(turn) = self.sessions.get_mut(&sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        let Phase::Llm(a) = &mut turn.phase else {
            return;
        };
        if a.call != call {
            return;
        }
        a.idle_deadline = now.plus_ms(idle_ms);
        match event {
            LlmIo::Head { status, headers } => {
                a.status = Some(status);
                a.headers = headers;
            }
            LlmIo::Body(bytes) => {
                if a.status.is_some_and(|s| !(200..300).contains(&s)) {
                    let room = ERROR_BODY_CAP.saturating_sub(a.err_body.len());
                    a.err_body
                        .extend_from_slice(&bytes[..bytes.len().min(room)]);
                    return;
                }
                a.body_bytes = a
                    .body_bytes
                    .saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
                if a.body_bytes > MAX_RESPONSE_BODY_BYTES {
                    let mib = MAX_RESPONSE_BODY_BYTES / (1024 * 1024);
                    let message = format!("the response body is over {mib} MiB; abandoned");
                    return self.attempt_failed(&sid, message, false, None);
                }
                let mut deltas = Vec::new();
                let res = a.decoder.feed(&bytes, &mut deltas);
                // A summary call (K1) is internal: nothing of it reaches the client.
                if !deltas.is_empty() && a.purpose == CallPurpose::Round {
                    a.streamed = true;
                }
                let complete = a.decoder.is_complete();
                if !complete && a.decoder.has_final_answer() {
                    a.grace = true;
                    a.idle_deadline = now.plus_ms(FINAL_ANSWER_GRACE_MS.min(idle_ms));
                }
                self.emit_deltas(&sid, deltas);
                match res {
                    Err(e) => self.attempt_failed(&sid, e.to_string(), e.is_retryable(), None),
                    Ok(()) if complete => {
                        // C24 b: the stream's own terminator was seen; do not wait for close.
                        self.release_llm(call);
                        self.finish_stream(&sid);
                    }
                    Ok(()) => {}
                }
            }
            LlmIo::End => {
                let status = a.status;
                let headers = std::mem::take(&mut a.headers);
                let body = std::mem::take(&mut a.err_body);
                self.release_llm(call);
                match status {
                    Some(s) if (200..300).contains(&s) => self.finish_stream(&sid),
                    Some(s) => self.http_failed(&sid, s, &headers, &body),
                    None => self.attempt_failed(
                        &sid,
                        "connection closed before a response".into(),
                        true,
                        None,
                    ),
                }
            }
            LlmIo::Failed(msg) => {
                // C24 a: a 2xx body the decoder accepts as complete (e.g. a Chat stream whose
                // finish_reason was seen but no `[DONE]`) is the answer even if the connection
                // then breaks; anything else is the transport error (retryable, L5).
                let ok = a.status.is_some_and(|s| (200..300).contains(&s));
                let mut deltas = Vec::new();
                let done = if ok {
                    a.decoder.finish(&mut deltas).ok()
                } else {
                    None
                };
                let purpose = a.purpose;
                self.release_llm(call);
                match done {
                    Some(resp) => {
                        self.emit_deltas(&sid, deltas);
                        if purpose == CallPurpose::Summary {
                            self.on_summary(&sid, resp);
                        } else {
                            self.on_llm_response(&sid, resp);
                        }
                    }
                    None => {
                        self.attempt_failed(&sid, format!("transport error: {msg}"), true, None)
                    }
                }
            }
        }
    }

    /// Forget an LLM call and tell the runtime to drop it (done or abandoned).
    pub(crate) fn release_llm(&mut self, call: LlmCallId) {
        if self.llm_calls.remove(&call).is_some() {
            self.push(Action::CancelLlm { call });
        }
    }

    fn emit_deltas(&mut self, sid: &str, deltas: Vec<StreamDelta>) {
        // K1: the compaction summary is not the agent's answer; it is never streamed.
        let summary = self
            .sessions
            .get(sid)
            .and_then(|s| s.turn.as_ref())
            .is_some_and(
                |t| matches!(&t.phase, Phase::Llm(a) if a.purpose == CallPurpose::Summary),
            );
        if summary {
            return;
        }
        for d in deltas {
            let update = match &d {
                StreamDelta::Text(t) => chunk_update("agent_message_chunk", t),
                StreamDelta::Thought(t) => chunk_update("agent_thought_chunk", t),
            };
            self.send_update(sid, &update);
        }
    }

    fn finish_stream(&mut self, sid: &str) {
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        let Phase::Llm(a) = &mut turn.phase else {
            return;
        };
        let mut deltas = Vec::new();
        let res = a.decoder.finish(&mut deltas);
        let purpose = a.purpose;
        self.emit_deltas(sid, deltas);
        match res {
            Ok(resp) if purpose == CallPurpose::Summary => self.on_summary(sid, resp),
            Ok(resp) => self.on_llm_response(sid, resp),
            Err(e) => self.attempt_failed(sid, e.to_string(), e.is_retryable(), None),
        }
    }

    /// The model of `sid`'s requests: the session's override, else the configured one.
    fn model_of(&self, sid: &str) -> String {
        self.sessions
            .get(sid)
            .and_then(|s| s.model_override.clone())
            .unwrap_or_else(|| self.cfg.model.clone())
    }

    fn http_failed(&mut self, sid: &str, status: u16, headers: &[(String, String)], body: &[u8]) {
        if self.cfg.provider == crate::config::ProviderKind::OpenAiChat {
            let sent = provider::chat_options(&self.cfg, &self.model_of(sid), &self.learned);
            if provider::wants_max_completion_tokens(status, body, &sent) {
                return self.retry_with_max_completion_tokens(sid);
            }
        }
        let message = provider::error_message(body);
        match provider::classify_status(status, &message) {
            HttpFailure::Retryable => {
                let hint = provider::retry_after_ms(headers);
                self.attempt_failed(sid, format!("HTTP {status}: {message}"), true, hint);
            }
            HttpFailure::Auth => {
                self.attempt_failed(sid, format!("auth: HTTP {status}: {message}"), false, None)
            }
            HttpFailure::ContextTooLong if self.try_reactive_compaction(sid) => {}
            HttpFailure::ContextTooLong | HttpFailure::Fatal => {
                self.attempt_failed(sid, format!("HTTP {status}: {message}"), false, None);
            }
        }
    }

    /// C41 / SPEC L7: the server rejected `max_tokens` and named `max_completion_tokens`:
    /// remember the name for the process and send the same attempt again at once (once: the
    /// retry already uses the new name, so the same answer cannot bring us here again).
    fn retry_with_max_completion_tokens(&mut self, sid: &str) {
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        let Phase::Llm(a) = &turn.phase else { return };
        let (call, attempt, purpose) = (a.call, a.attempt, a.purpose);
        self.release_llm(call);
        self.learned.max_completion_tokens = true;
        self.log(
            LogLevel::Warn,
            "llm: the server rejected max_tokens and asked for max_completion_tokens; sending the output cap under that name from now on".into(),
        );
        self.start_llm_attempt(sid, attempt, purpose);
    }

    /// One attempt failed: back off and retry when allowed (SPEC L5), else fail the prompt.
    fn attempt_failed(
        &mut self,
        sid: &str,
        message: String,
        retryable: bool,
        hint_ms: Option<u64>,
    ) {
        let max = self.cfg.llm_max_attempts;
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        let Phase::Llm(a) = &turn.phase else { return };
        let (call, attempt, streamed, purpose) = (a.call, a.attempt, a.streamed, a.purpose);
        self.release_llm(call);
        if retryable && attempt < max && !streamed {
            let delay = hint_ms.unwrap_or_else(|| self.backoff_ms(attempt));
            let until = self.now.plus_ms(delay);
            if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
                t.phase = Phase::Backoff {
                    until,
                    attempt: attempt + 1,
                    purpose,
                };
            }
            self.log(
                LogLevel::Warn,
                format!("llm: attempt {attempt}/{max} failed: {message}; retrying in {delay} ms"),
            );
            return;
        }
        if purpose == CallPurpose::Summary {
            return self.summary_failed(sid, &message);
        }
        let why = if streamed && retryable {
            " (not retried: part of the response was already streamed)"
        } else {
            ""
        };
        let prefix = if message.starts_with("auth:") {
            "llm "
        } else {
            "llm: "
        };
        let text = format!("{prefix}{message}{why}");
        if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
            t.phase = Phase::Ready;
        }
        self.fail_turn(sid, text);
    }

    /// 0.5 s · 2^(k−1), capped at 8 s, with ±25 % jitter from the seeded generator (SPEC L5).
    fn backoff_ms(&mut self, attempt: u32) -> u64 {
        let base = 500u64
            .saturating_mul(1u64 << (attempt.saturating_sub(1)).min(5))
            .min(8000);
        let r = self.next_random() % 1000;
        (base * (750 + r / 2) / 1000).min(8000)
    }

    pub(crate) fn fire_turn_timers(&mut self) {
        let now = self.now;
        let mut idle: Vec<String> = Vec::new();
        let mut graced: Vec<(String, LlmCallId)> = Vec::new();
        let mut backoff: Vec<(String, u32, CallPurpose)> = Vec::new();
        for s in self.sessions.values() {
            let Some(t) = &s.turn else { continue };
            match &t.phase {
                Phase::Llm(a) if a.idle_deadline <= now && a.grace => {
                    graced.push((s.id.clone(), a.call))
                }
                Phase::Llm(a) if a.idle_deadline <= now => idle.push(s.id.clone()),
                Phase::Backoff {
                    until,
                    attempt,
                    purpose,
                } if *until <= now => backoff.push((s.id.clone(), *attempt, *purpose)),
                Phase::Llm(_)
                | Phase::Backoff { .. }
                | Phase::Ready
                | Phase::Tools(_)
                | Phase::Gate(_) => {}
            }
        }
        for (sid, call) in graced {
            // C24 b: the answer is whole; stop waiting for the server to close.
            self.release_llm(call);
            self.finish_stream(&sid);
        }
        let secs = self.cfg.llm_timeout_ms / 1000;
        for sid in idle {
            self.attempt_failed(
                &sid,
                format!("no data from the provider for {secs} s (BUZZ_AGENT_LLM_TIMEOUT_SECS)"),
                true,
                None,
            );
        }
        for (sid, attempt, purpose) in backoff {
            self.start_llm_attempt(&sid, attempt, purpose);
        }
    }

    // ------------------------------------------------------------------ responses

    fn on_llm_response(&mut self, sid: &str, resp: LlmResponse) {
        let size = self.cfg.max_context_tokens;
        let recoveries_max = self.cfg.max_token_recoveries;
        if let Some(u) = resp.usage {
            // Peer-supplied counts: saturating, never an overflow panic.
            let used = u.input_tokens.saturating_add(u.output_tokens);
            self.send_update(
                sid,
                &json!({"sessionUpdate": "usage_update", "used": used, "size": size}),
            );
            if let Some(sess) = self.sessions.get_mut(sid) {
                sess.last_input_tokens = u.input_tokens;
                sess.usage_mark = sess.history.len();
            }
        }
        if resp.reasoning.contains(&ReasoningBlock::ChatField(
            ChatReasoningField::ReasoningContent,
        )) {
            // L10: a DeepSeek-style server; its thinking mode wants the field on every
            // assistant message of a turn that called tools, ours included.
            self.learned.reasoning_content = true;
        }
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        turn.phase = Phase::Ready;
        let LlmResponse {
            text,
            thinking,
            reasoning,
            tool_calls,
            stop,
            ..
        } = resp;
        match stop {
            StopKind::Refusal => {
                if !text.is_empty() {
                    sess.history.push(Message::Assistant {
                        text,
                        thinking,
                        reasoning,
                        tool_calls: Vec::new(),
                    });
                }
                self.finish_turn(sid, "refusal");
            }
            StopKind::MaxTokens => {
                // L1: truncated tool calls are never run.
                sess.history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: Vec::new(),
                });
                if turn.recoveries < recoveries_max {
                    turn.recoveries += 1;
                    sess.history.push(Message::User {
                        text: MAX_TOKENS_NUDGE.into(),
                    });
                } else {
                    self.finish_turn(sid, "max_tokens");
                }
            }
            StopKind::EndTurn | StopKind::ToolUse if !tool_calls.is_empty() => {
                sess.history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: tool_calls.clone(),
                });
                self.start_tools(sid, tool_calls);
            }
            StopKind::EndTurn | StopKind::ToolUse => {
                // L10: reasoning state alone (a redacted block) is kept too.
                if !text.is_empty() || !thinking.is_empty() || !reasoning.is_empty() {
                    sess.history.push(Message::Assistant {
                        text,
                        thinking,
                        reasoning,
                        tool_calls: Vec::new(),
                    });
                }
                self.stop_gate(sid);
            }
        }
    }

    // ------------------------------------------------------------------ tool calls (L2)

    fn start_tools(&mut self, sid: &str, calls: Vec<ToolCall>) {
        let ask = self.cfg.permission == PermissionMode::Ask;
        let perm_ms = self.cfg.permission_timeout_ms;
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        let seq = turn.seq;
        let mut slots = Vec::with_capacity(calls.len());
        let mut updates = Vec::with_capacity(calls.len());
        for call in calls {
            sess.seq += 1;
            let acp_id = format!("tc_{}", sess.seq);
            let parsed = parse_arguments(&call.arguments);
            let raw_input = match &parsed {
                Ok(v) => v.clone(),
                Err(_) => Value::String(call.arguments.clone()),
            };
            updates.push(json!({
                "sessionUpdate": "tool_call", "toolCallId": acp_id, "title": call.name,
                "kind": "other", "status": "pending", "rawInput": raw_input
            }));
            let route = turn.routes.get(&call.name).cloned();
            slots.push((
                Slot {
                    acp_id,
                    call,
                    route,
                    args: Value::Null,
                    state: SlotState::Queued,
                },
                parsed,
            ));
        }
        for u in &updates {
            self.send_update(sid, u);
        }
        // Decide each slot: too many, unknown tool (incl. hooks, M4), bad arguments, permission.
        let mut decided: Vec<(usize, ToolOutput)> = Vec::new();
        let mut asks: Vec<usize> = Vec::new();
        let mut final_slots = Vec::with_capacity(slots.len());
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        for (i, (mut slot, parsed)) in slots.into_iter().enumerate() {
            if i >= MAX_CALLS_PER_RESPONSE {
                decided.push((i, err_out(format!("too many tool calls in one response (limit {MAX_CALLS_PER_RESPONSE}); not run"))));
            } else if slot.route.is_none() {
                decided.push((i, err_out(format!("unknown tool: {}", slot.call.name))));
            } else {
                match parsed {
                    Err(e) => decided.push((
                        i,
                        err_out(format!(
                            "invalid arguments for {}: {e}; pass a JSON object",
                            slot.call.name
                        )),
                    )),
                    Ok(args) => {
                        slot.args = args;
                        let qualified =
                            slot.route.as_ref().map(|r| r.2.clone()).unwrap_or_default();
                        match (ask, sess.remembered.get(&qualified)) {
                            (false, _) | (true, Some(true)) => {}
                            (true, Some(false)) => decided.push((i, denied_out())),
                            (true, None) => asks.push(i),
                        }
                    }
                }
            }
            final_slots.push(slot);
        }
        let mut perm_requests = Vec::new();
        for &i in &asks {
            let out = self.next_out;
            self.next_out += 1;
            let s = &final_slots[i];
            let params = crate::acp::permission_params(sid, &s.acp_id, &s.call.name, &s.args);
            perm_requests.push(jsonrpc::encode_request(
                out,
                "session/request_permission",
                &params,
            ));
            self.out_requests.insert(
                out,
                OutRequest {
                    session: sid.to_string(),
                    turn_seq: seq,
                    slot: i,
                    deadline: self.now.plus_ms(perm_ms),
                },
            );
            final_slots[i].state = SlotState::AwaitPermission(out);
        }
        if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
            t.phase = Phase::Tools(final_slots);
        }
        for line in perm_requests {
            self.push(Action::WriteAcp(line));
        }
        for (i, out) in decided {
            self.complete_slot(sid, seq, i, out, true);
        }
        self.pump_tools(sid);
    }

    /// Dispatch queued calls up to `BUZZ_AGENT_MAX_PARALLEL_TOOLS` (SPEC L2).
    fn pump_tools(&mut self, sid: &str) {
        let max_par = self.cfg.max_parallel_tools;
        let timeout = self.cfg.tool_timeout_ms;
        loop {
            let Some(turn) = self.sessions.get(sid).and_then(|s| s.turn.as_ref()) else {
                return;
            };
            let seq = turn.seq;
            let Phase::Tools(slots) = &turn.phase else {
                return;
            };
            let running = slots
                .iter()
                .filter(|s| matches!(s.state, SlotState::Running(..)))
                .count();
            if running >= max_par {
                break;
            }
            let Some(i) = slots
                .iter()
                .position(|s| matches!(s.state, SlotState::Queued))
            else {
                break;
            };
            let slot = &slots[i];
            let Some((server, bare, qualified)) = slot.route.clone() else {
                break;
            };
            let args = slot.args.clone();
            let acp_id = slot.acp_id.clone();
            let dead = self.servers.get(&server).and_then(|s| match &s.state {
                crate::mcp::ServerState::Dead { reason } => Some(reason.clone()),
                crate::mcp::ServerState::Ready => None,
                crate::mcp::ServerState::Spawning
                | crate::mcp::ServerState::Initializing
                | crate::mcp::ServerState::Listing => {
                    Some(format!("server '{}' is not ready", s.name))
                }
            });
            if let Some(reason) = dead {
                let name = self
                    .servers
                    .get(&server)
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                let text =
                    format!("server '{name}' is recovering; the call was not run ({reason})");
                self.complete_slot(sid, seq, i, err_out(text), true);
                continue;
            }
            // G2: a dispatched call to a registered non-hook tool may be a posting attempt.
            let posting = (bare == "shell"
                && args
                    .get("command")
                    .and_then(Value::as_str)
                    .is_some_and(|c| c.contains("messages send") || c.contains("reactions add")))
                || self.cfg.reply_tools.iter().any(|t| t == &qualified);
            let params = json!({"name": bare, "arguments": args});
            let purpose = Purpose::Tool {
                session: sid.to_string(),
                turn_seq: seq,
                slot: i,
            };
            let Some(req) = self.send_mcp_request(server, "tools/call", &params, purpose, timeout)
            else {
                break;
            };
            if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
                if posting {
                    t.posted = true;
                }
                if let Phase::Tools(slots) = &mut t.phase {
                    slots[i].state = SlotState::Running(server, req);
                }
            }
            self.send_update(sid, &json!({"sessionUpdate": "tool_call_update", "toolCallId": acp_id, "status": "in_progress"}));
        }
        self.maybe_finish_tools(sid);
    }

    /// Record a slot's result and send its terminal update (SPEC A6).
    fn complete_slot(&mut self, sid: &str, seq: u64, idx: usize, out: ToolOutput, failed: bool) {
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        if turn.seq != seq {
            return;
        }
        let Phase::Tools(slots) = &mut turn.phase else {
            return;
        };
        let Some(slot) = slots.get_mut(idx) else {
            return;
        };
        if matches!(slot.state, SlotState::Done(_)) {
            return;
        }
        let status = if failed { "failed" } else { "completed" };
        let update = json!({
            "sessionUpdate": "tool_call_update", "toolCallId": slot.acp_id, "status": status,
            "content": [{"type": "content", "content": {"type": "text", "text": out.text}}],
            "rawOutput": {"isError": out.is_error}
        });
        slot.state = SlotState::Done(out);
        self.send_update(sid, &update);
    }

    /// An MCP tool call ended (reply, error, timeout, death).
    pub(crate) fn on_tool_finished(
        &mut self,
        sid: &str,
        seq: u64,
        idx: usize,
        out: ToolOutput,
        failed: bool,
    ) {
        self.complete_slot(sid, seq, idx, out, failed);
        self.pump_tools(sid);
    }

    pub(crate) fn on_permission_answer(
        &mut self,
        sid: &str,
        seq: u64,
        idx: usize,
        answer: PermissionAnswer,
    ) {
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        if turn.seq != seq {
            return;
        }
        let Phase::Tools(slots) = &mut turn.phase else {
            return;
        };
        let Some(slot) = slots.get_mut(idx) else {
            return;
        };
        if !matches!(slot.state, SlotState::AwaitPermission(_)) {
            return;
        }
        let qualified = slot.route.as_ref().map(|r| r.2.clone()).unwrap_or_default();
        let allowed = match answer {
            PermissionAnswer::AllowOnce => true,
            PermissionAnswer::AllowAlways => {
                sess.remembered.insert(qualified, true);
                true
            }
            PermissionAnswer::RejectAlways => {
                sess.remembered.insert(qualified, false);
                false
            }
            PermissionAnswer::RejectOnce | PermissionAnswer::Denied => false,
        };
        if allowed {
            slot.state = SlotState::Queued;
        } else {
            self.complete_slot(sid, seq, idx, denied_out(), true);
        }
        self.pump_tools(sid);
    }

    pub(crate) fn fire_permission_timers(&mut self) {
        let now = self.now;
        let expired: Vec<u64> = self
            .out_requests
            .iter()
            .filter(|(_, r)| r.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            if let Some(r) = self.out_requests.remove(&k) {
                self.log(
                    LogLevel::Warn,
                    format!("acp: permission request {k} timed out; denied (A7)"),
                );
                self.on_permission_answer(&r.session, r.turn_seq, r.slot, PermissionAnswer::Denied);
            }
        }
    }

    /// When every slot is done: append results in call order (L2, L4) and go on.
    fn maybe_finish_tools(&mut self, sid: &str) {
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        let Phase::Tools(slots) = &turn.phase else {
            return;
        };
        if !slots.iter().all(|s| matches!(s.state, SlotState::Done(_))) {
            return;
        }
        let Phase::Tools(slots) = std::mem::replace(&mut turn.phase, Phase::Ready) else {
            return;
        };
        for s in slots {
            if let SlotState::Done(out) = s.state {
                sess.history.push(Message::ToolResult {
                    call_id: s.call.id,
                    name: s.call.name,
                    text: out.text,
                    is_error: out.is_error,
                });
            }
        }
        if turn.cancelled {
            self.finish_turn(sid, "cancelled");
        }
    }

    // ------------------------------------------------------------------ the _Stop gate (H5)

    fn stop_gate(&mut self, sid: &str) {
        let budget = self.cfg.stop_max_rejections;
        let require_reply = self.cfg.require_reply;
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        if turn.cancelled {
            return self.finish_turn(sid, "cancelled");
        }
        if budget == 0 {
            return self.finish_turn(sid, "end_turn");
        }
        if turn.objections >= budget {
            turn.exhausted = true;
            self.log(LogLevel::Warn, format!("hook: _Stop budget of {budget} exhausted in session {sid}; ending the turn (H9)"));
            return self.finish_turn(sid, "end_turn");
        }
        let reminder = (require_reply && !turn.posted && turn.reminders < MAX_REMINDERS)
            .then(|| REPLY_REMINDER.to_string());
        let attempt = turn.objections + 1;
        let remaining = budget.saturating_sub(turn.objections);
        let round = self.start_hook_round(sid, HookPoint::Stop, attempt, remaining, reminder);
        if round.is_decided() {
            self.conclude_gate(sid, round);
        } else if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
            t.phase = Phase::Gate(round);
        }
    }

    pub(crate) fn hook_round_mut(&mut self, sid: &str, round: u64) -> Option<&mut HookRound> {
        let turn = self.sessions.get_mut(sid)?.turn.as_mut()?;
        match &mut turn.phase {
            Phase::Gate(r) if r.id == round => Some(r),
            Phase::Gate(_)
            | Phase::Ready
            | Phase::Llm(_)
            | Phase::Backoff { .. }
            | Phase::Tools(_) => None,
        }
    }

    pub(crate) fn maybe_finish_hook_round(&mut self, sid: &str, round: u64) {
        if !self
            .hook_round_mut(sid, round)
            .is_some_and(|r| r.is_decided())
        {
            return;
        }
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        let Phase::Gate(r) = std::mem::replace(&mut turn.phase, Phase::Ready) else {
            return;
        };
        match r.point {
            HookPoint::Stop => self.conclude_gate(sid, r),
            HookPoint::PostCompact => self.conclude_post_compact(sid, r),
        }
    }

    /// Decide a `_Stop` round: objections (hooks first, reminder last) cost one budget unit
    /// and are injected (SPEC H5, H6, G1); none → `end_turn`.
    fn conclude_gate(&mut self, sid: &str, round: HookRound) {
        let mut texts = round.objections();
        let used_reminder = round.reminder.is_some();
        if let Some(r) = round.reminder {
            texts.push((REPLY_GUARD_SERVER.to_string(), r));
        }
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        turn.phase = Phase::Ready;
        if turn.cancelled {
            return self.finish_turn(sid, "cancelled");
        }
        if texts.is_empty() {
            return self.finish_turn(sid, "end_turn");
        }
        turn.objections += 1;
        if used_reminder {
            turn.reminders += 1;
        }
        append_injections(sess.history.rewrite(), round.point, &texts, &mut sess.seq);
        let n = texts.len();
        let (objections, budget) = (turn.objections, self.cfg.stop_max_rejections);
        self.log(LogLevel::Info, format!("hook: _Stop objected in session {sid} ({n} text(s)); objection {objections}/{budget}"));
    }
}

fn err_out(text: String) -> ToolOutput {
    ToolOutput {
        text,
        is_error: true,
    }
}

fn denied_out() -> ToolOutput {
    err_out("tool call not authorized: the user did not allow this tool call (A7)".into())
}

/// Parse model tool-call arguments (SPEC L2, case C26): blank → `{}`; must be a JSON object.
fn parse_arguments(raw: &str) -> Result<Value, String> {
    if raw.trim().is_empty() {
        return Ok(json!({}));
    }
    match crate::sse::parse_json_lossy(raw) {
        Ok(Value::Object(m)) => Ok(Value::Object(m)),
        Ok(other) => Err(format!(
            "arguments must be a JSON object, got {}",
            crate::jsonrpc::json_type(&other)
        )),
        Err(e) => Err(format!("arguments were not valid JSON: {e}")),
    }
}
