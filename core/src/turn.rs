//! The prompt turn (SPEC L1–L5, A3, A4, K1, H5, H7): one `session/prompt`, from the user's text
//! to the stop reason. A [`Turn`] runs rounds of LLM call → tool calls → results; at the end of
//! each answer the `_Stop` gate decides whether it really ends; before each round the
//! compactor decides whether the context must shrink first.
//!
//! Every method takes the turn's [`Session`] and the step's [`Cx`] and returns
//! `Some(`[`TurnEnd`]`)` when the turn is over; the agent then answers the prompt. The turn
//! owns its phase, its counters, its [`StopGate`] and its [`Compactor`], and its own timer
//! (`Timer::Turn`: LLM idle / grace, backoff).

use crate::acp::{PermissionAnswer, chunk_update, cost_json, usage_json};
use crate::compaction::{self, Compaction, Compactor};
use crate::config::{LogLevel, Prices, ProviderKind};
use crate::cx::Cx;
use crate::hooks::{
    GateOpening, GateVerdict, HookMeta, HookOutcome, HookPoint, HookRound, StopGate,
    append_injections, append_session_start,
};
use crate::ids::{HookRoundId, LlmCallId, ServerSlot, ToolCallIndex, TurnNo};
use crate::io::{Action, LlmEvent};
use crate::jsonrpc::RpcError;
use crate::jsonrpc::RpcId;
use crate::llm::{
    self, ErrorReaction, HttpFailure, LlmRequest, LlmResponse, Message, PromptCache, StopKind,
    StreamDelta, ToolCall, Usage, UsageTotals,
};
use crate::llm_call::{
    CallPurpose, FINAL_ANSWER_GRACE_MS, LlmAttempt, MAX_RESPONSE_BODY_BYTES, Step,
};
use crate::mcp::{InterceptRef, ServerTable, ToolRoute};
use crate::session::Session;
use crate::time::MonoTime;
use crate::timers::{Timer, TurnTimer};
use crate::tool_calls::{InterceptEvent, ToolBatch};
use crate::tool_schema::SchemaDialect;
use crate::tools::ToolOutput;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The assistant message that closes a prompt cancelled before an answer (SPEC L13, C77).
pub(crate) const CANCELLED_MARK: &str = "(The user cancelled this request before it was answered.)";

/// The assistant message that closes a prompt whose LLM call failed (SPEC L13).
pub(crate) const FAILED_MARK: &str = "(This request failed before it was answered.)";

/// The assistant message that closes a prompt that ran out of rounds before an answer
/// (`BUZZ_AGENT_MAX_ROUNDS` after a nudge; SPEC L13).
pub(crate) const OUT_OF_ROUNDS_MARK: &str =
    "(This request ran out of rounds before it was answered.)";

/// Nudge appended after a `max_tokens`-truncated response (SPEC L1).
pub(crate) const MAX_TOKENS_NUDGE: &str =
    "Your reply was cut off because it hit the output token limit; continue in smaller steps.";

/// How many `pause_turn` responses one prompt continues (SPEC L13, case C69); the next one
/// ends the turn (`end_turn`, with a WARN), so a gateway that keeps pausing cannot hold a turn
/// when `BUZZ_AGENT_MAX_ROUNDS` is unlimited. Anthropic's server-tool loop pauses after 10
/// iterations, so 8 continuations allow about 90.
pub(crate) const MAX_PAUSES: u32 = 8;

/// Why a prompt turn ended (ACP `stopReason`, SPEC A3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The model ended its turn and the `_Stop` gate let it.
    EndTurn,
    /// The answer hit the output cap after every recovery (SPEC L1).
    MaxTokens,
    /// `BUZZ_AGENT_MAX_ROUNDS` rounds ran (SPEC L1).
    MaxTurnRequests,
    /// The model refused.
    Refusal,
    /// `session/cancel`, or the agent shutting down (SPEC A4, P1).
    Cancelled,
}

impl StopReason {
    /// The ACP wire value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::MaxTurnRequests => "max_turn_requests",
            StopReason::Refusal => "refusal",
            StopReason::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnEnd {
    /// Answer the prompt with this stop reason.
    Stopped(StopReason),
    /// Fail the prompt with this message (LLM failure after retries, SPEC A3).
    Failed(String),
}

/// Where a turn is.
enum Phase {
    /// About to start the next round (picked up after the current step).
    Ready,
    /// An LLM attempt is streaming.
    Llm(Box<LlmAttempt>),
    /// Waiting before the next attempt (SPEC L5); the end is the turn's backoff timer.
    Backoff { attempt: u32, purpose: CallPurpose },
    /// Tool calls of the last response.
    Tools(ToolBatch),
    /// A `_Stop` or `_PostCompact` hook round (SPEC H5, H7).
    Gate(HookRound),
    /// Before the round's LLM request: servers re-list their tools after
    /// `notifications/tools/list_changed`, `(server, completed listings)` (SPEC M14, C65).
    AwaitTools(Vec<(ServerSlot, u64)>),
}

/// One `session/prompt` (SPEC L1: fresh counters per prompt).
pub(crate) struct Turn {
    rpc: RpcId,
    no: TurnNo,
    /// LLM rounds started.
    rounds: u32,
    /// The round (`rounds` before it starts) that already waited for re-listings: a round
    /// waits once, so a server that keeps changing its list cannot hold the turn (SPEC M14).
    relist_waited: Option<u32>,
    /// `max_tokens` recoveries used (SPEC L1).
    recoveries: u32,
    /// `pause_turn` continuations used (SPEC L13, [`MAX_PAUSES`]).
    pauses: u32,
    cancelled: bool,
    gate: StopGate,
    compactor: Compactor,
    /// The live user prompt, kept through compaction (SPEC K1).
    prompt_text: String,
    phase: Phase,
    /// Exposed tool name → route, as offered in the last round's request.
    routes: BTreeMap<String, ToolRoute>,
    /// The text shown so far (paragraph breaks, C60).
    shown: Shown,
    /// The session's `_SessionStart` texts, taken by its first prompt and injected into that
    /// prompt's first LLM request; dropped if the turn ends before it (SPEC H10).
    session_start: Vec<(String, String)>,
    /// The `_SessionStart` texts this turn injected: given back to the session when a refusal
    /// takes the turn out of the history, so the next prompt carries them (SPEC H10, L13).
    injected_start: Vec<(String, String)>,
    /// The tokens of the turn's LLM calls, compaction summaries included (the prompt
    /// response's `_meta`, SPEC A8).
    usage: UsageTotals,
}

impl Turn {
    /// Prompt `rpc` with `text` starts turn `no` of `sess`: the text joins the history and the
    /// first round starts after the step. The session's first prompt takes its `_SessionStart`
    /// texts (SPEC H10): they go right after the prompt when the first round starts, and no
    /// other prompt ever sees them injected.
    pub(crate) fn start(
        no: TurnNo,
        rpc: RpcId,
        text: String,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Turn {
        sess.transcript.push(Message::User { text: text.clone() });
        let mut shown = Shown::default();
        // C55, C56: what the user must know about the session set-up, before the first answer.
        shown.pending_notices(sess, cx);
        sess.prompts += 1;
        let session_start = std::mem::take(&mut sess.start_texts);
        Turn {
            rpc,
            no,
            rounds: 0,
            relist_waited: None,
            recoveries: 0,
            pauses: 0,
            cancelled: false,
            gate: StopGate::new(cx.cfg.stop_max_rejections, cx.cfg.require_reply),
            compactor: Compactor::default(),
            prompt_text: text,
            phase: Phase::Ready,
            routes: BTreeMap::new(),
            shown,
            session_start,
            injected_start: Vec::new(),
            usage: UsageTotals::default(),
        }
    }

    /// Shows the session's queued notices now ([`Session::notify`]), not before the next
    /// round: what the user must act on while the turn waits (a login, SPEC M11).
    pub(crate) fn show_notices(&mut self, sess: &mut Session, cx: &mut Cx<'_>) {
        self.shown.pending_notices(sess, cx);
    }

    /// The turn's number.
    pub(crate) fn no(&self) -> TurnNo {
        self.no
    }

    /// The prompt request to answer.
    pub(crate) fn rpc(&self) -> &RpcId {
        &self.rpc
    }

    /// LLM rounds started.
    pub(crate) fn rounds(&self) -> u32 {
        self.rounds
    }

    /// Whether `session/cancel` reached it (a new prompt may then wait for it, SPEC A3).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled
    }

    /// Whether the next round is due.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// The `_meta` of the prompt response (SPEC A8, H9): the gate's figures, and the turn's
    /// token counts (with their cost at `prices`) under `usage` once a call reported usage
    /// (none is not zero tokens).
    pub(crate) fn meta(&self, prices: Option<&Prices>) -> Value {
        let mut meta = self.gate.meta(self.rounds);
        if self.usage.calls > 0 {
            meta["usage"] = usage_json(&self.usage, prices);
        }
        meta
    }

    /// A call of this turn reported `usage`: it counts for the turn and the session.
    fn count_usage(&mut self, usage: &Usage, sess: &mut Session) {
        self.usage.add(usage);
        sess.usage.add(usage);
    }

    // ------------------------------------------------------------------ rounds

    /// Starts the next round (SPEC L1, K1, M9): the turn ends if cancelled or out of rounds;
    /// the context is compacted first when it must; dead servers due a restart respawn.
    pub(crate) fn next_round(&mut self, sess: &mut Session, cx: &mut Cx<'_>) -> Option<TurnEnd> {
        if self.cancelled {
            return Some(TurnEnd::Stopped(StopReason::Cancelled));
        }
        let max_rounds = cx.cfg.max_rounds;
        if max_rounds > 0 && self.rounds >= max_rounds {
            return Some(TurnEnd::Stopped(StopReason::MaxTurnRequests));
        }
        // Notices that arrived while the turn ran come before the round's text.
        self.shown.pending_notices(sess, cx);
        if !self.session_start.is_empty() {
            // H10: right after the prompt, in the first LLM request of the first prompt.
            let texts = std::mem::take(&mut self.session_start);
            append_session_start(&mut sess.transcript, &texts);
            self.injected_start.clone_from(&texts);
            cx.out.log(
                LogLevel::Info,
                format!(
                    "hook: _SessionStart injected {} text(s) into the first prompt of session {}",
                    texts.len(),
                    sess.id
                ),
            );
        }
        if self
            .compactor
            .needed(self.rounds, &sess.transcript, cx.cfg.max_context_tokens)
        {
            return self.compact(
                "the context reached 90% of BUZZ_AGENT_MAX_CONTEXT_TOKENS",
                sess,
                cx,
            );
        }
        if self.relist_waited != Some(self.rounds) {
            // M14, C65: a tool list that changed during the last round (the notification came
            // before the results) is re-listed before the next request, not one round late.
            let relisting = cx.servers.relisting(&sess.servers);
            if !relisting.is_empty() {
                self.relist_waited = Some(self.rounds);
                cx.out.log(
                    LogLevel::Debug,
                    format!(
                        "session {}: the next round waits for {} server(s) re-listing their tools",
                        sess.id,
                        relisting.len()
                    ),
                );
                self.phase = Phase::AwaitTools(relisting);
                return None;
            }
        }
        self.rounds += 1;
        cx.servers.restart_due(sess.id, cx.out, cx.timers);
        self.start_llm_attempt(1, CallPurpose::Round, sess, cx);
        None
    }

    /// Whether the tool batch holds a call it can start now (one was held while its server
    /// re-listed its tools, C65).
    pub(crate) fn can_dispatch(
        &self,
        servers: &ServerTable,
        max_par: usize,
        now: MonoTime,
    ) -> bool {
        matches!(&self.phase, Phase::Tools(b) if b.can_dispatch(servers, max_par, now))
    }

    /// Starts the calls the batch can start now ([`Turn::can_dispatch`]).
    pub(crate) fn dispatch(&mut self, sess: &mut Session, cx: &mut Cx<'_>) -> Option<TurnEnd> {
        if let Phase::Tools(batch) = &mut self.phase {
            batch.pump(&mut cx.tools());
        }
        self.after_tools(sess)
    }

    /// A turn waiting for re-listings (SPEC M14) becomes ready once every one of them is over
    /// (completed, failed, timed out, or its server gone); returns whether it is ready now.
    pub(crate) fn tools_relisted(&mut self, servers: &ServerTable) -> bool {
        if let Phase::AwaitTools(waiting) = &self.phase
            && waiting.iter().all(|(slot, n)| servers.relisted(*slot, *n))
        {
            self.phase = Phase::Ready;
        }
        self.is_ready()
    }

    /// Compacts before the next round (SPEC K1): a summary call, or truncation.
    fn compact(&mut self, why: &str, sess: &mut Session, cx: &mut Cx<'_>) -> Option<TurnEnd> {
        // L13: the `_SessionStart` texts go into the summary (or with the truncated part), so
        // a refusal later in this turn does not give them back.
        self.injected_start.clear();
        match self
            .compactor
            .begin(self.rounds, cx.cfg.max_handoffs, sess.id, why, cx.out)
        {
            Compaction::Summarize => self.start_llm_attempt(1, CallPurpose::Summary, sess, cx),
            Compaction::Truncate => self.truncate(sess, cx),
        }
        None
    }

    fn truncate(&mut self, sess: &mut Session, cx: &mut Cx<'_>) {
        self.phase = Phase::Ready;
        compaction::truncate_transcript(
            &mut sess.transcript,
            &self.prompt_text,
            cx.cfg.max_context_tokens,
            sess.id,
            cx.out,
        );
    }

    // ------------------------------------------------------------------ LLM attempts

    fn start_llm_attempt(
        &mut self,
        attempt: u32,
        purpose: CallPurpose,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) {
        let model = sess.model(&cx.cfg.model).to_string();
        // M14: each tool's schema in the form this provider accepts.
        let dialect = SchemaDialect::of(&cx.cfg.provider, &cx.cfg.base_url, &model);
        let (defs, routes) = match purpose {
            CallPurpose::Round => crate::mcp::with_builtins(
                crate::skills::builtin_tools(&sess.skills),
                cx.servers.offered_tools(&sess.servers, dialect, cx.out),
            ),
            CallPurpose::Summary => (Vec::new(), BTreeMap::new()),
        };
        let call = cx.ids.next_llm_call();
        let summary_messages = match purpose {
            CallPurpose::Round => None,
            CallPurpose::Summary => Some(compaction::summary_messages(
                &sess.transcript,
                &self.prompt_text,
                cx.cfg.max_context_tokens,
                cx.cfg.max_output_tokens,
            )),
        };
        // A round sends the history through its cache of serialized messages (issue #15) and,
        // with prompt caching on, marks its prefix for the provider's cache (SPEC L11); a
        // summary call's messages are not the history: built afresh, and not cached (its
        // prefix, without tools, is none the rounds read or write).
        let key = sess.id.to_string();
        let caching = cx.cfg.prompt_caching && summary_messages.is_none();
        let previous_len = sess.transcript.cache_mark();
        // SPEC L12: a round thinks at the session's effort; a summary call does not.
        let effort = sess.effort(cx.cfg).filter(|_| summary_messages.is_none());
        let (system, messages, cache) = match &summary_messages {
            None => {
                let (messages, cache) = sess.transcript.with_cache();
                (sess.system_prompt.as_deref(), messages, Some(cache))
            }
            Some(summary) => (Some(compaction::SUMMARY_SYSTEM_PROMPT), &summary[..], None),
        };
        let req = LlmRequest {
            model: &model,
            system,
            messages,
            tools: &defs,
            max_output_tokens: cx.cfg.max_output_tokens,
            cache: caching.then_some(PromptCache {
                key: &key,
                previous_len,
            }),
            effort,
        };
        // SPEC L8: the configured route, or Responses for a model only it serves.
        let kind = llm::route_kind(cx.cfg, &model, &cx.llm.learned);
        let route = llm::route(kind);
        let request = route.build_request(cx.cfg, &req, &cx.llm.learned, cache);
        if caching {
            sess.transcript.set_cache_mark();
        }
        let decoder = route.decoder(format!("call_{}", call.0));
        self.set_timer(
            TurnTimer::LlmIdle,
            cx.out.now().plus_ms(cx.cfg.llm_timeout_ms),
            sess,
            cx,
        );
        if purpose == CallPurpose::Round {
            self.routes = routes;
            if attempt == 1 {
                self.shown.new_round();
            }
        }
        let url = request.url.clone();
        self.phase = Phase::Llm(Box::new(LlmAttempt::new(
            call, purpose, attempt, kind, url, decoder,
        )));
        cx.llm.insert(call, sess.id);
        cx.out.log(
            LogLevel::Debug,
            format!("session {}: {call} attempt {attempt}: {request:?}", sess.id),
        );
        cx.out.push(Action::CallLlm { call, request });
    }

    /// The turn's one timer is now `kind` at `at` (any other is cleared).
    fn set_timer(
        &self,
        kind: TurnTimer,
        at: crate::time::MonoTime,
        sess: &Session,
        cx: &mut Cx<'_>,
    ) {
        cx.timers.clear_turn(sess.id);
        cx.timers.set(Timer::Turn(sess.id, kind), at);
    }

    /// Forgets `call` (done or abandoned) with the turn's LLM timer.
    fn release(&self, call: LlmCallId, sess: &Session, cx: &mut Cx<'_>) {
        if cx.llm.release(call, cx.out) {
            cx.timers.clear_turn(sess.id);
        }
    }

    /// Progress of LLM call `call` (events of another call change nothing).
    pub(crate) fn on_llm_event(
        &mut self,
        call: LlmCallId,
        event: LlmEvent,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let idle_ms = cx.cfg.llm_timeout_ms;
        let now = cx.out.now();
        let Phase::Llm(a) = &mut self.phase else {
            return None;
        };
        if a.call() != call {
            return None;
        }
        let kind = if a.in_grace() {
            TurnTimer::LlmGrace
        } else {
            TurnTimer::LlmIdle
        };
        cx.timers.clear_turn(sess.id);
        cx.timers
            .set(Timer::Turn(sess.id, kind), now.plus_ms(idle_ms));
        let purpose = a.purpose();
        let target = a.target();
        match a.on_event(event) {
            Step::Nothing => None,
            Step::TooLarge => {
                let mib = MAX_RESPONSE_BODY_BYTES / (1024 * 1024);
                let message = format!("the response body is over {mib} MiB; abandoned");
                self.attempt_failed(message, false, None, sess, cx)
            }
            Step::Fed {
                deltas,
                grace_started,
                result,
            } => {
                if grace_started {
                    self.set_timer(
                        TurnTimer::LlmGrace,
                        now.plus_ms(FINAL_ANSWER_GRACE_MS.min(idle_ms)),
                        sess,
                        cx,
                    );
                }
                self.shown.emit(purpose, deltas, sess, cx);
                match result {
                    Err(e) => self.attempt_failed(e.to_string(), e.is_retryable(), None, sess, cx),
                    Ok(true) => {
                        // C24 b: the stream's own terminator was seen; do not wait for close.
                        self.release(call, sess, cx);
                        self.finish_stream(sess, cx)
                    }
                    Ok(false) => None,
                }
            }
            Step::Ended {
                status,
                headers,
                error_body,
            } => {
                self.release(call, sess, cx);
                match status {
                    Some(s) if (200..300).contains(&s) => self.finish_stream(sess, cx),
                    Some(s) => self.http_failed(s, &headers, &error_body, sess, cx),
                    None => self.attempt_failed(
                        format!("connection closed before a response to {target}"),
                        true,
                        None,
                        sess,
                        cx,
                    ),
                }
            }
            Step::Broken { message, answer } => {
                // C24 a: a 2xx body the decoder accepts as complete is the answer even if the
                // connection then breaks; anything else is the transport error (L5).
                self.release(call, sess, cx);
                match answer {
                    Some((resp, deltas)) => {
                        self.shown.emit(purpose, deltas, sess, cx);
                        self.on_response(purpose, resp, sess, cx)
                    }
                    None => self.attempt_failed(
                        format!("transport error on {target}: {message}"),
                        true,
                        None,
                        sess,
                        cx,
                    ),
                }
            }
        }
    }

    /// The stream of the current attempt is over: its last deltas, then the response.
    fn finish_stream(&mut self, sess: &mut Session, cx: &mut Cx<'_>) -> Option<TurnEnd> {
        let Phase::Llm(a) = &mut self.phase else {
            return None;
        };
        let purpose = a.purpose();
        let (deltas, res) = a.finish();
        self.shown.emit(purpose, deltas, sess, cx);
        match res {
            Ok(resp) => self.on_response(purpose, resp, sess, cx),
            Err(e) => self.attempt_failed(e.to_string(), e.is_retryable(), None, sess, cx),
        }
    }

    fn on_response(
        &mut self,
        purpose: CallPurpose,
        resp: LlmResponse,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        match purpose {
            CallPurpose::Summary => self.on_summary(resp, sess, cx),
            CallPurpose::Round => self.on_round_response(resp, sess, cx),
        }
    }

    fn http_failed(
        &mut self,
        status: u16,
        headers: &[(String, String)],
        body: &[u8],
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let model = sess.model(&cx.cfg.model);
        let route = llm::route(self.attempt_route(model, cx));
        match route.on_http_error(
            cx.cfg,
            model,
            sess.effort(cx.cfg),
            status,
            body,
            &mut cx.llm.learned,
        ) {
            Some(ErrorReaction::Resend { warn, notice }) => {
                self.resend(&warn, notice, sess, cx);
                return None;
            }
            None => {}
        }
        let message = llm::error_message(body);
        // Issue 12: the method and URL, so a wrong base URL shows (a 404 on
        // `…/chat/completions`).
        let on = match &self.phase {
            Phase::Llm(a) => format!(" on {}", a.target()),
            Phase::Ready
            | Phase::Backoff { .. }
            | Phase::Tools(_)
            | Phase::Gate(_)
            | Phase::AwaitTools(_) => String::new(),
        };
        match llm::classify_status(status, &message) {
            HttpFailure::Retryable => {
                let hint = llm::retry_after_ms(headers);
                self.attempt_failed(
                    format!("HTTP {status}{on}: {message}"),
                    true,
                    hint,
                    sess,
                    cx,
                )
            }
            HttpFailure::Auth => self.attempt_failed(
                format!("auth: HTTP {status}{on}: {message}"),
                false,
                None,
                sess,
                cx,
            ),
            HttpFailure::Redirect => {
                // S2: a redirect is never followed with the key; say where it pointed.
                let to = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("location"))
                    .map_or_else(
                        || "no location".to_string(),
                        |(_, v)| crate::text::redact_url(v.trim()).into_owned(),
                    );
                self.attempt_failed(
                    format!(
                        "HTTP {status}{on}: the provider redirected the request to {to}; redirects are not followed with an API key (set the base URL to the address it should use)"
                    ),
                    false,
                    None,
                    sess,
                    cx,
                )
            }
            HttpFailure::ContextTooLong if self.compactor.try_reactive(self.cancelled) => {
                // L5: compact, then the round runs again.
                self.phase = Phase::Ready;
                self.compact("the provider said the context is too long", sess, cx)
            }
            HttpFailure::ContextTooLong | HttpFailure::Fatal => self.attempt_failed(
                format!("HTTP {status}{on}: {message}"),
                false,
                None,
                sess,
                cx,
            ),
        }
    }

    /// The route changed what it sends after an HTTP error of its own
    /// ([`ErrorReaction::Resend`], e.g. C41): send the same attempt again at once, after its
    /// one WARN line and the user's `notice` (shown now: nothing of the attempt was).
    fn resend(&mut self, warn: &str, notice: Option<String>, sess: &mut Session, cx: &mut Cx<'_>) {
        let Phase::Llm(a) = &self.phase else { return };
        let (call, attempt, purpose) = (a.call(), a.attempt(), a.purpose());
        self.release(call, sess, cx);
        cx.out.log(LogLevel::Warn, warn.to_owned());
        if let Some(text) = notice {
            sess.notify("llm_route_changed", text);
            self.shown.pending_notices(sess, cx);
        }
        self.start_llm_attempt(attempt, purpose, sess, cx);
    }

    /// The route of the current attempt's request; without one, the route a request for
    /// `model` would go on now.
    fn attempt_route(&self, model: &str, cx: &Cx<'_>) -> ProviderKind {
        match &self.phase {
            Phase::Llm(a) => a.route(),
            Phase::Ready
            | Phase::Backoff { .. }
            | Phase::Tools(_)
            | Phase::Gate(_)
            | Phase::AwaitTools(_) => llm::route_kind(cx.cfg, model, &cx.llm.learned),
        }
    }

    /// One attempt failed: back off and retry when allowed (SPEC L5), else fall back (a
    /// summary: truncation) or fail the prompt.
    fn attempt_failed(
        &mut self,
        message: String,
        retryable: bool,
        hint_ms: Option<u64>,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let max = cx.cfg.llm_max_attempts;
        let Phase::Llm(a) = &self.phase else {
            return None;
        };
        // S2: an error text (the HTTP library's, the provider's) may quote the URL and its
        // credentials; logs, the client's error and the transcript get it without them.
        let message = crate::text::scrub_url_secrets(&message, &cx.cfg.base_url).into_owned();
        let (call, attempt, streamed, purpose) = (a.call(), a.attempt(), a.streamed(), a.purpose());
        self.release(call, sess, cx);
        if retryable && attempt < max && !streamed {
            let delay = hint_ms.unwrap_or_else(|| cx.llm.backoff_ms(attempt));
            let until = cx.out.now().plus_ms(delay);
            cx.timers
                .set(Timer::Turn(sess.id, TurnTimer::Backoff), until);
            self.phase = Phase::Backoff {
                attempt: attempt + 1,
                purpose,
            };
            cx.out.log(
                LogLevel::Warn,
                format!("llm: attempt {attempt}/{max} failed: {message}; retrying in {delay} ms"),
            );
            return None;
        }
        if purpose == CallPurpose::Summary {
            self.summary_failed(&message, sess, cx);
            return None;
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
        self.phase = Phase::Ready;
        Some(TurnEnd::Failed(format!("{prefix}{message}{why}")))
    }

    /// The turn's timer fired (already cleared from the table): the grace after a complete
    /// answer (C24 b), the idle timeout, or the end of a backoff (SPEC L5).
    pub(crate) fn on_timer(
        &mut self,
        kind: TurnTimer,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        match (&self.phase, kind) {
            (Phase::Llm(a), TurnTimer::LlmGrace) if a.in_grace() => {
                // C24 b: the answer is whole; stop waiting for the server to close.
                let call = a.call();
                self.release(call, sess, cx);
                self.finish_stream(sess, cx)
            }
            (Phase::Llm(_), TurnTimer::LlmIdle | TurnTimer::LlmGrace) => {
                let secs = cx.cfg.llm_timeout_ms / 1000;
                self.attempt_failed(
                    format!("no data from the provider for {secs} s (BUZZ_AGENT_LLM_TIMEOUT_SECS)"),
                    true,
                    None,
                    sess,
                    cx,
                )
            }
            (Phase::Backoff { attempt, purpose }, TurnTimer::Backoff) => {
                let (attempt, purpose) = (*attempt, *purpose);
                self.start_llm_attempt(attempt, purpose, sess, cx);
                None
            }
            (
                Phase::Llm(_)
                | Phase::Backoff { .. }
                | Phase::Ready
                | Phase::Tools(_)
                | Phase::Gate(_)
                | Phase::AwaitTools(_),
                _,
            ) => None,
        }
    }

    // ------------------------------------------------------------------ responses

    fn on_round_response(
        &mut self,
        resp: LlmResponse,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        if let Some(u) = resp.usage {
            self.count_usage(&u, sess);
            // Peer-supplied counts: saturating, never an overflow panic.
            let used = u.input_tokens.saturating_add(u.output_tokens);
            // SPEC A6, L11: this call's counts as the provider reported them, and the
            // session's cumulative cost when prices are configured.
            let mut update = json!({
                "sessionUpdate": "usage_update",
                "used": used,
                "size": cx.cfg.max_context_tokens,
                "_meta": {"buzz": usage_json(&UsageTotals::of(&u), None)},
            });
            if let Some(prices) = &cx.cfg.prices {
                update["cost"] = cost_json(&sess.usage, prices);
            }
            cx.out.send_update(&sess.id.to_string(), &update);
            sess.transcript.record_usage(u.input_tokens);
        }
        let kind = self.attempt_route(sess.model(&cx.cfg.model), cx);
        llm::route(kind).on_response(&resp, &mut cx.llm.learned);
        self.phase = Phase::Ready;
        let LlmResponse {
            text,
            thinking,
            reasoning,
            mut tool_calls,
            stop,
            stop_details,
            ..
        } = resp;
        // L3b: arguments holding lone surrogate escapes (or other faults the decoder repairs)
        // are kept as the repaired text, so what runs is what is replayed, and no request
        // carries a lone escape.
        for call in &mut tool_calls {
            crate::json::repair_in_place(&mut call.arguments);
        }
        let history = &mut sess.transcript;
        match stop {
            StopKind::Refusal => {
                // L13, C77: the client learns why; the turn leaves the history when it ends
                // ([`Turn::settle`]), so what was refused is not sent again.
                let why =
                    stop_details.map_or_else(String::new, |d| format!(" Its explanation: {d}"));
                cx.out.log(
                    LogLevel::Info,
                    format!(
                        "session {}: the provider refused the request.{why}",
                        sess.id
                    ),
                );
                let text = format!(
                    "[buzz-agent] the provider refused this request; it is left out of the conversation, so the next prompt does not repeat it.{why}"
                );
                self.shown.notice("refusal", "warning", &text, sess, cx);
                Some(TurnEnd::Stopped(StopReason::Refusal))
            }
            StopKind::MaxTokens => {
                // L1: truncated tool calls are never run.
                history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: Vec::new(),
                });
                if self.recoveries < cx.cfg.max_token_recoveries {
                    self.recoveries += 1;
                    history.push(Message::User {
                        text: MAX_TOKENS_NUDGE.into(),
                    });
                    None
                } else {
                    Some(TurnEnd::Stopped(StopReason::MaxTokens))
                }
            }
            StopKind::ContextFull => {
                // K1, L5: the prompt and the answer filled the context window, so a nudge to
                // go on would be cut at once. The cut answer is kept (its calls never run);
                // the context is compacted and the round runs again, once per prompt as for a
                // context-too-long answer; after that the turn ends `max_tokens`.
                history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: Vec::new(),
                });
                if self.compactor.try_reactive(self.cancelled) {
                    self.compact("the model's context window is full", sess, cx)
                } else {
                    Some(TurnEnd::Stopped(StopReason::MaxTokens))
                }
            }
            StopKind::Pause if self.pauses < MAX_PAUSES => {
                // L13, C69: not the end of the turn. The paused response (its server-tool
                // blocks verbatim) is the last assistant turn of the next request, which the
                // model continues; no `_Stop` gate here.
                self.pauses += 1;
                history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: Vec::new(),
                });
                self.shown.paused();
                None
            }
            StopKind::Pause => {
                cx.out.log(
                    LogLevel::Warn,
                    format!(
                        "llm: the provider paused the turn {MAX_PAUSES} times in a row; the turn ends here"
                    ),
                );
                history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: Vec::new(),
                });
                Some(TurnEnd::Stopped(StopReason::EndTurn))
            }
            StopKind::EndTurn | StopKind::ToolUse if !tool_calls.is_empty() => {
                history.push(Message::Assistant {
                    text,
                    thinking,
                    reasoning,
                    tool_calls: tool_calls.clone(),
                });
                self.start_tools(tool_calls, sess, cx)
            }
            StopKind::EndTurn | StopKind::ToolUse => {
                // L10: reasoning state alone (a redacted block) is kept too.
                if !text.is_empty() || !thinking.is_empty() || !reasoning.is_empty() {
                    history.push(Message::Assistant {
                        text,
                        thinking,
                        reasoning,
                        tool_calls: Vec::new(),
                    });
                }
                self.open_gate(sess, cx)
            }
        }
    }

    // ------------------------------------------------------------------ tool calls (L2)

    fn start_tools(
        &mut self,
        calls: Vec<ToolCall>,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let batch = ToolBatch::start(self.no, calls, &self.routes, sess, &mut cx.tools());
        self.phase = Phase::Tools(batch);
        self.after_tools(sess)
    }

    /// Call `index` of this turn's batch ended (reply, error, timeout, death; SPEC L2, L3).
    pub(crate) fn on_tool_result(
        &mut self,
        index: ToolCallIndex,
        out: ToolOutput,
        failed: bool,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let Phase::Tools(batch) = &mut self.phase else {
            return None;
        };
        batch.on_result(index, out, failed, &mut cx.tools());
        self.after_tools(sess)
    }

    /// `notifications/progress` from `server` (SPEC A6, case C59): shown on the running call
    /// it names, if this turn's tool batch has one.
    pub(crate) fn on_progress(
        &mut self,
        server: crate::ids::ServerSlot,
        token: &Value,
        text: &str,
        cx: &mut Cx<'_>,
    ) {
        if let Phase::Tools(batch) = &mut self.phase {
            batch.on_progress(server, token, text, &mut cx.tools());
        }
    }

    /// Call `index` of this turn's batch was answered (a result or a JSON-RPC error; SPEC L3,
    /// X1: the result may be screened first).
    pub(crate) fn on_tool_reply(
        &mut self,
        index: ToolCallIndex,
        reply: Result<Value, RpcError>,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let Phase::Tools(batch) = &mut self.phase else {
            return None;
        };
        batch.on_reply(index, reply, &mut cx.tools());
        self.after_tools(sess)
    }

    /// An `interceptor/invoke` of one of this turn's tool calls was answered, lost or timed
    /// out (SPEC X1).
    pub(crate) fn on_intercept(
        &mut self,
        call: InterceptRef,
        event: InterceptEvent,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let Phase::Tools(batch) = &mut self.phase else {
            return None;
        };
        batch.on_intercept(call, event, &mut sess.remembered, &mut cx.tools());
        self.after_tools(sess)
    }

    /// The client answered the permission request of call `index` (SPEC A7).
    pub(crate) fn on_permission(
        &mut self,
        index: ToolCallIndex,
        answer: PermissionAnswer,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let Phase::Tools(batch) = &mut self.phase else {
            return None;
        };
        batch.on_permission(index, answer, &mut sess.remembered, &mut cx.tools());
        self.after_tools(sess)
    }

    /// When every call is done: the results join the history in call order (L2, L4) and the
    /// turn goes on (or ends, if cancelled).
    fn after_tools(&mut self, sess: &mut Session) -> Option<TurnEnd> {
        let Phase::Tools(batch) = &self.phase else {
            return None;
        };
        if batch.posted() {
            self.gate.mark_posted();
        }
        if !batch.is_done() {
            return None;
        }
        let Phase::Tools(batch) = std::mem::replace(&mut self.phase, Phase::Ready) else {
            return None;
        };
        sess.transcript.extend(batch.into_results());
        self.cancelled
            .then_some(TurnEnd::Stopped(StopReason::Cancelled))
    }

    // ------------------------------------------------------------------ hook rounds

    /// The model ended its turn: the `_Stop` gate (SPEC H5).
    fn open_gate(&mut self, sess: &mut Session, cx: &mut Cx<'_>) -> Option<TurnEnd> {
        if self.cancelled {
            return Some(TurnEnd::Stopped(StopReason::Cancelled));
        }
        match self.gate.open(sess.id, cx.out) {
            GateOpening::EndTurn => Some(TurnEnd::Stopped(StopReason::EndTurn)),
            GateOpening::Round {
                attempt,
                budget_remaining,
            } => {
                let meta = HookMeta::turn(attempt, budget_remaining);
                let round = HookRound::start(HookPoint::Stop, sess, meta, &mut cx.mcp());
                self.run_round(round, sess, cx)
            }
        }
    }

    /// A round just started: decided at once (no live target) or waited for.
    fn run_round(
        &mut self,
        round: HookRound,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        if round.is_decided() {
            self.conclude_round(round, sess, cx)
        } else {
            self.phase = Phase::Gate(round);
            None
        }
    }

    /// Call `index` of hook round `round` ended (SPEC H3, H4).
    pub(crate) fn on_hook_outcome(
        &mut self,
        round: HookRoundId,
        index: usize,
        outcome: HookOutcome,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        let Phase::Gate(r) = &mut self.phase else {
            return None;
        };
        if r.id() != round || !r.on_outcome(index, outcome, cx.out) {
            return None;
        }
        let Phase::Gate(r) = std::mem::replace(&mut self.phase, Phase::Ready) else {
            return None;
        };
        self.conclude_round(r, sess, cx)
    }

    fn conclude_round(
        &mut self,
        round: HookRound,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        self.phase = Phase::Ready;
        let texts = round.texts();
        match round.point() {
            HookPoint::Stop => {
                // Objections (hooks first, the reminder last) cost one budget unit and are
                // injected (SPEC H5, H6, G1); none → end_turn.
                if self.cancelled {
                    return Some(TurnEnd::Stopped(StopReason::Cancelled));
                }
                match self.gate.conclude(texts, sess.id, cx.out) {
                    GateVerdict::EndTurn => Some(TurnEnd::Stopped(StopReason::EndTurn)),
                    GateVerdict::Objected(texts) => {
                        // The user sees why the turn goes on (notice), the model the texts.
                        let mut named = round.texts_by_name();
                        if texts.len() > named.len() {
                            named.extend(texts[named.len()..].iter().cloned());
                        }
                        let notice = objection_notice(&named);
                        self.shown
                            .notice("hook_objection", "info", &notice, sess, cx);
                        append_injections(&mut sess.transcript, HookPoint::Stop, &texts);
                        None
                    }
                }
            }
            HookPoint::PostCompact => {
                // H7: each text right after the summary.
                compaction::inject_post_compact(&mut sess.transcript, &texts, sess.id, cx.out);
                self.cancelled
                    .then_some(TurnEnd::Stopped(StopReason::Cancelled))
            }
            // The session's lifecycle runs these rounds, never a turn.
            HookPoint::SessionStart | HookPoint::SessionEnd => self
                .cancelled
                .then_some(TurnEnd::Stopped(StopReason::Cancelled)),
        }
    }

    // ------------------------------------------------------------------ compaction (K1)

    fn on_summary(
        &mut self,
        resp: LlmResponse,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        if let Some(u) = &resp.usage {
            // A summary is billed like any call; it is not the context, so no usage_update.
            self.count_usage(u, sess);
        }
        let Some(handoff) = self.compactor.apply_summary(
            &mut sess.transcript,
            &resp.text,
            &self.prompt_text,
            sess.id,
            cx.out,
        ) else {
            self.summary_failed("the summary was empty", sess, cx);
            return None;
        };
        self.phase = Phase::Ready;
        // H7: `_PostCompact` before the next LLM request.
        let meta = HookMeta::turn(handoff, 0);
        let round = HookRound::start(HookPoint::PostCompact, sess, meta, &mut cx.mcp());
        self.run_round(round, sess, cx)
    }

    /// The summary call failed: truncate instead and go on (SPEC K1).
    fn summary_failed(&mut self, why: &str, sess: &mut Session, cx: &mut Cx<'_>) {
        compaction::log_summary_failed(sess.id, why, cx.out);
        self.truncate(sess, cx);
    }

    // ------------------------------------------------------------------ the end (L13)

    /// What the turn leaves in the history once it ended with `end` (SPEC L13, case C77;
    /// docs/dialects.md, "What an ended turn leaves"), before the session records it:
    /// * `refusal`: the turn goes — its prompt and everything after it (the provider refuses
    ///   any request that still carries what it refused); `_SessionStart` texts it carried go
    ///   back to the session for the next prompt (H10);
    /// * `cancelled`, an error, `max_turn_requests`: a history that ends in a user message
    ///   (the prompt, a nudge, the line after `_SessionStart` results) gets a short assistant
    ///   message saying the request was not answered, so the next prompt is a user turn of
    ///   its own and not merged into this one as if the user had written both;
    /// * `end_turn`, `max_tokens`: the history ends with the model's answer; nothing to do.
    pub(crate) fn settle(&mut self, end: &TurnEnd, sess: &mut Session) {
        let history = &mut sess.transcript;
        let mark = match end {
            TurnEnd::Stopped(StopReason::Refusal) => {
                let prompt = history.messages().iter().rposition(
                    |m| matches!(m, Message::User { text } if *text == self.prompt_text),
                );
                if let Some(at) = prompt {
                    history.truncate(at);
                    let mut texts = std::mem::take(&mut self.injected_start);
                    texts.append(&mut sess.start_texts);
                    sess.start_texts = texts;
                }
                return;
            }
            TurnEnd::Stopped(StopReason::EndTurn | StopReason::MaxTokens) => return,
            TurnEnd::Stopped(StopReason::Cancelled) => CANCELLED_MARK,
            TurnEnd::Stopped(StopReason::MaxTurnRequests) => OUT_OF_ROUNDS_MARK,
            TurnEnd::Failed(_) => FAILED_MARK,
        };
        if matches!(history.messages().last(), Some(Message::User { .. })) {
            history.push(Message::Assistant {
                text: mark.to_owned(),
                thinking: String::new(),
                reasoning: Vec::new(),
                tool_calls: Vec::new(),
            });
        }
    }

    // ------------------------------------------------------------------ cancel (A4)

    /// `session/cancel` (or shutdown): the turn ends `cancelled` as soon as what it waits for
    /// allows — at once for an LLM call or a backoff, after the cancelled tool calls' updates,
    /// after the hook round (hooks are not cancelled: their own timeout bounds them).
    pub(crate) fn cancel(
        &mut self,
        why: &str,
        sess: &mut Session,
        cx: &mut Cx<'_>,
    ) -> Option<TurnEnd> {
        if self.cancelled {
            return None;
        }
        self.cancelled = true;
        let phase = std::mem::replace(&mut self.phase, Phase::Ready);
        cx.timers.clear_turn(sess.id);
        cx.out.log(
            LogLevel::Info,
            format!("session {}: turn cancelled ({why})", sess.id),
        );
        match phase {
            Phase::Llm(a) => {
                self.release(a.call(), sess, cx);
                Some(TurnEnd::Stopped(StopReason::Cancelled))
            }
            Phase::Backoff { .. } | Phase::Ready | Phase::AwaitTools(_) => {
                Some(TurnEnd::Stopped(StopReason::Cancelled))
            }
            Phase::Tools(mut batch) => {
                // A4: in-flight calls get notifications/cancelled; every announced call ends.
                batch.cancel(why, &mut cx.tools());
                self.phase = Phase::Tools(batch);
                self.after_tools(sess)
            }
            Phase::Gate(round) => {
                self.phase = Phase::Gate(round);
                None
            }
        }
    }
}

/// The agent's text as the client was shown it in this turn, for paragraph breaks (SPEC A6,
/// case C60): consecutive rounds' answers, and the agent's notices, are separated by a blank
/// line so they never run together ("All done." then "Fixed; done now." reads
/// `All done.\n\nFixed; done now.`).
#[derive(Debug, Default)]
struct Shown {
    /// The last (up to) two characters of message text sent; empty: nothing sent yet.
    tail: String,
    /// A new round or a notice began since the last text: the next text opens a paragraph.
    break_due: bool,
    /// The last response paused (SPEC L13): the next round continues its text.
    continues: bool,
}

impl Shown {
    /// A new round starts: its first text opens a new paragraph if anything was shown before,
    /// unless the round continues a paused response.
    fn new_round(&mut self) {
        if !std::mem::take(&mut self.continues) {
            self.break_due = !self.tail.is_empty();
        }
    }

    /// The response paused (`pause_turn`): the next round's text goes on from it.
    fn paused(&mut self) {
        self.continues = true;
    }

    /// The newlines that must precede the next text for a paragraph break (none, `\n` or
    /// `\n\n`), and the break is no longer due.
    fn take_break(&mut self) -> &'static str {
        if !std::mem::take(&mut self.break_due)
            || self.tail.is_empty()
            || self.tail.ends_with("\n\n")
        {
            ""
        } else if self.tail.ends_with('\n') {
            "\n"
        } else {
            "\n\n"
        }
    }

    fn record(&mut self, text: &str) {
        let mut tail = std::mem::take(&mut self.tail);
        tail.push_str(text);
        let keep = tail.char_indices().rev().nth(1).map_or(0, |(i, _)| i);
        self.tail = tail[keep..].to_string();
    }

    /// Streams `deltas` as message or thought chunks (SPEC A6); the first text of a round
    /// gets its paragraph break. A compaction summary is not the agent's answer and is never
    /// streamed (K1).
    fn emit(
        &mut self,
        purpose: CallPurpose,
        deltas: Vec<StreamDelta>,
        sess: &Session,
        cx: &mut Cx<'_>,
    ) {
        if purpose == CallPurpose::Summary {
            return;
        }
        let sid = sess.id.to_string();
        for d in deltas {
            let (kind, text) = match &d {
                StreamDelta::Text(t) if t.is_empty() => continue,
                StreamDelta::Text(t) => {
                    let text = format!("{}{t}", self.take_break());
                    self.record(&text);
                    ("agent_message_chunk", text)
                }
                StreamDelta::Thought(t) => ("agent_thought_chunk", t.clone()),
            };
            cx.out.send_update(&sid, &chunk_update(kind, &text));
            cx.store.on_chunk(sess.id, kind, &text);
        }
    }

    /// Shows the agent's own notice `text` (not the model's words; it starts `[buzz-agent] `)
    /// of `kind` and `severity` (`info`, `warning`). A client that advertised
    /// `clientCapabilities.session.notices` gets an ACP `notice` update (title: the text
    /// without the prefix); any other an `agent_message_chunk` in a paragraph of its own,
    /// whose text block is annotated `audience: ["user"]`. Both carry `_meta.buzz.notice` =
    /// `kind` (docs/clients.md, "Notices"). It never enters the conversation the model sees.
    /// Shows the session's queued notices ([`Session::notify`]) as warnings, in order.
    fn pending_notices(&mut self, sess: &mut Session, cx: &mut Cx<'_>) {
        for notice in std::mem::take(&mut sess.notices) {
            let text = format!("[buzz-agent] {}", notice.text);
            self.notice(notice.kind, "warning", &text, sess, cx);
        }
    }

    fn notice(&mut self, kind: &str, severity: &str, text: &str, sess: &Session, cx: &mut Cx<'_>) {
        let meta = json!({"buzz": {"notice": kind}});
        if sess.client_notices {
            let title = text.strip_prefix("[buzz-agent] ").unwrap_or(text);
            let update = json!({
                "sessionUpdate": "notice", "severity": severity, "title": title, "_meta": meta
            });
            cx.out.send_update(&sess.id.to_string(), &update);
            return;
        }
        if !self.tail.is_empty() {
            self.break_due = true;
        }
        let text = format!("{}{text}", self.take_break());
        self.record(&text);
        self.break_due = true;
        let update = json!({
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": text, "annotations": {"audience": ["user"]}},
            "_meta": meta
        });
        cx.out.send_update(&sess.id.to_string(), &update);
        // A9: a `session/load` replays the text as the client saw it, the notice included.
        cx.store.on_chunk(sess.id, "agent_message_chunk", &text);
    }
}

/// The notice shown when `_Stop` objections made the turn go on (issue 12): which hook servers
/// objected (and whether the reply guard reminded the model), never what they said (the
/// objection is for the model; hooks never show their text to the client, SPEC H8), e.g.
/// `[buzz-agent] hook server 'testguard' objected to ending the turn; the agent continues.`
fn objection_notice(objections: &[(String, String)]) -> String {
    let mut servers: Vec<&str> = Vec::new();
    let mut reminded = false;
    for (server, _) in objections {
        if server == crate::hooks::REPLY_GUARD_SERVER {
            reminded = true;
        } else if !servers.contains(&server.as_str()) {
            servers.push(server);
        }
    }
    let quoted: Vec<String> = servers.iter().map(|s| format!("'{s}'")).collect();
    let mut parts = Vec::new();
    match quoted.len() {
        0 => {}
        1 => parts.push(format!(
            "hook server {} objected to ending the turn",
            quoted[0]
        )),
        _ => parts.push(format!(
            "hook servers {} objected to ending the turn",
            quoted.join(", ")
        )),
    }
    if reminded {
        parts.push("the reply guard reminded the model to post its reply".to_string());
    }
    format!("[buzz-agent] {}; the agent continues.", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cx::rig::Parts;
    use crate::ids::SessionId;
    use crate::io::Action;
    use crate::llm::ReasoningBlock;

    const SID: SessionId = SessionId(1);

    /// A Chat Completions SSE body: `text`, then `finish_reason`, then `[DONE]`.
    fn answer(text: &str, finish: &str) -> Vec<u8> {
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n\
             data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{finish}\"}}]}}\n\n\
             data: [DONE]\n\n"
        )
        .into_bytes()
    }

    fn start(parts: &mut Parts, sess: &mut Session, text: &str) -> Turn {
        let no = parts.ids.next_turn();
        Turn::start(no, RpcId::Num(7.into()), text.into(), sess, &mut parts.cx())
    }

    /// Whether a log line of `actions` contains `needle`.
    fn logged(actions: &[Action], needle: &str) -> bool {
        Parts::logs(actions).iter().any(|l| l.contains(needle))
    }

    /// A turn on a session without servers, its first round's LLM call asked for (the
    /// actions drained).
    fn plain_first_round(text: &str) -> (Parts, Session, Turn, LlmCallId) {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[]);
        let (turn, call) = first_round(&mut parts, &mut sess, text);
        (parts, sess, turn, call)
    }

    /// The last LLM call asked for, with its JSON body.
    fn last_call(actions: &[Action]) -> (LlmCallId, serde_json::Value) {
        actions
            .iter()
            .rev()
            .find_map(|a| {
                let Action::CallLlm { call, request } = a else {
                    return None;
                };
                Some((
                    *call,
                    serde_json::from_slice(&request.body.to_vec()).unwrap_or_default(),
                ))
            })
            .expect("an LLM call")
    }

    fn respond(
        turn: &mut Turn,
        call: LlmCallId,
        status: u16,
        body: Vec<u8>,
        sess: &mut Session,
        parts: &mut Parts,
    ) -> Option<TurnEnd> {
        let mut end = turn.on_llm_event(
            call,
            LlmEvent::Head {
                status,
                headers: vec![("retry-after".into(), "2".into())],
            },
            sess,
            &mut parts.cx(),
        );
        for event in [LlmEvent::Body(body), LlmEvent::End] {
            if end.is_none() {
                end = turn.on_llm_event(call, event, sess, &mut parts.cx());
            }
        }
        end
    }

    #[test]
    fn a3_stop_reasons_are_the_acp_wire_values() {
        let all = [
            StopReason::EndTurn,
            StopReason::MaxTokens,
            StopReason::MaxTurnRequests,
            StopReason::Refusal,
            StopReason::Cancelled,
        ];
        let shown: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "end_turn",
                "max_tokens",
                "max_turn_requests",
                "refusal",
                "cancelled"
            ]
        );
        assert!(all.iter().all(|r| r.to_string() == r.as_str()));
    }

    #[test]
    fn l1_a_plain_answer_without_hooks_ends_the_turn() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[("fs", &["read"])]);
        let mut turn = start(&mut parts, &mut sess, "hello");
        assert!(turn.is_ready());
        assert_eq!(turn.next_round(&mut sess, &mut parts.cx()), None);
        let (call, body) = last_call(&parts.drain());
        assert_eq!(body["tools"][0]["function"]["name"], "fs__read");
        assert_eq!(
            parts.timers.next().map(|(t, k)| (t.as_ms(), k)),
            Some((240_000, Timer::Turn(SID, TurnTimer::LlmIdle)))
        );
        let end = respond(
            &mut turn,
            call,
            200,
            answer("Hi!", "stop"),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::EndTurn)));
        let actions = parts.drain();
        assert!(actions.contains(&Action::CancelLlm { call }));
        let chunk = &Parts::acp_lines(&actions)[0]["params"]["update"];
        assert_eq!(chunk["content"]["text"], "Hi!");
        assert_eq!(turn.meta(None)["buzz"]["rounds"], 1);
        assert_eq!(sess.transcript.len(), 2, "the prompt and the answer");
        assert_eq!(parts.timers.next(), None, "no timer outlives the call");
    }

    #[test]
    fn a6_l11_usage_reaches_the_client_per_call_and_the_prompt_response_as_the_turns_totals() {
        let mut parts = Parts::for_tests();
        parts.cfg.prices = Some(Prices {
            currency: "USD".into(),
            input_micros: 3_000_000,
            output_micros: 15_000_000,
            cache_read_micros: 300_000,
            cache_write_micros: 3_750_000,
        });
        let mut sess = parts.session_with(SID, &[("fs", &["read"])]);
        let mut turn = start(&mut parts, &mut sess, "hello");
        assert!(
            turn.meta(None).get("usage").is_none(),
            "no call reported usage yet: no figures (none is not zero tokens)"
        );
        let with_usage = |text: &str, finish: &str, usage: &str| {
            let body = String::from_utf8(answer(text, finish)).unwrap_or_default();
            let usage = format!("data: {{\"choices\":[],\"usage\":{usage}}}\n\ndata: [DONE]");
            body.replace("data: [DONE]", &usage).into_bytes()
        };
        // Round 1: a tool call, 1,000 input tokens of which 800 read from the cache.
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, _) = last_call(&parts.drain());
        let tool = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",",
            "\"function\":{\"name\":\"fs__read\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":10,",
            "\"prompt_tokens_details\":{\"cached_tokens\":800}}}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(
            respond(
                &mut turn,
                call,
                200,
                tool.as_bytes().to_vec(),
                &mut sess,
                &mut parts
            ),
            None
        );
        let updates: Vec<Value> = Parts::acp_lines(&parts.drain())
            .into_iter()
            .map(|l| l["params"]["update"].clone())
            .filter(|u| u["sessionUpdate"] == "usage_update")
            .collect();
        assert_eq!(updates.len(), 1, "{updates:?}");
        assert_eq!(updates[0]["used"], 1010);
        assert_eq!(
            updates[0]["_meta"]["buzz"],
            json!({"inputTokens": 1000, "outputTokens": 10, "totalTokens": 1010,
                   "cachedReadTokens": 800})
        );
        // 200 × $3 + 800 × $0.30 + 10 × $15 per million tokens.
        let cost = updates[0]["cost"]["amount"].as_f64().unwrap_or(0.0);
        assert!((cost - 0.000_99).abs() < 1e-12, "{cost}");
        assert_eq!(updates[0]["cost"]["currency"], "USD");
        // Round 2 (after the tool result): a text answer.
        let (index, out) = (
            ToolCallIndex(0),
            ToolOutput::plain("contents".into(), false),
        );
        let _ = turn.on_tool_result(index, out, false, &mut sess, &mut parts.cx());
        assert!(turn.is_ready());
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, _) = last_call(&parts.drain());
        let end = respond(
            &mut turn,
            call,
            200,
            with_usage(
                "Done.",
                "stop",
                r#"{"prompt_tokens":1100,"completion_tokens":5}"#,
            ),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::EndTurn)));
        let meta = turn.meta(parts.cfg.prices.as_ref());
        let usage = &meta["usage"];
        assert_eq!(usage["inputTokens"], 2100);
        assert_eq!(usage["outputTokens"], 15);
        assert_eq!(usage["totalTokens"], 2115);
        assert_eq!(usage["cachedReadTokens"], 800, "the calls that reported it");
        assert!(usage.get("cachedWriteTokens").is_none(), "never reported");
        let turn_cost = usage["cost"]["amount"].as_f64().unwrap_or(0.0);
        assert!(
            (turn_cost - (0.000_99 + 0.003_375)).abs() < 1e-12,
            "{turn_cost}"
        );
        assert!(
            turn.meta(None)["usage"].get("cost").is_none(),
            "no prices, no cost"
        );
        assert_eq!(sess.usage.calls, 2, "the session counts them too");
    }

    #[test]
    fn c56_queued_notices_come_first_in_a_prompt_and_before_the_next_round_of_a_running_turn() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[("fs", &["read"])]);
        sess.notify("hooks_not_allowlisted", "first.".into());
        let mut turn = start(&mut parts, &mut sess, "hello");
        assert!(sess.notices.is_empty(), "taken by the prompt");
        // A notice that arrives while the turn runs waits for its next round.
        sess.notify("mcp_server_skipped", "second.".into());
        assert_eq!(turn.next_round(&mut sess, &mut parts.cx()), None);
        let ups: Vec<Value> = Parts::acp_lines(&parts.drain())
            .iter()
            .map(|l| l["params"]["update"].clone())
            .collect();
        let shown: Vec<(&str, &str)> = ups
            .iter()
            .map(|u| {
                (
                    u["_meta"]["buzz"]["notice"].as_str().unwrap_or(""),
                    u["content"]["text"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("hooks_not_allowlisted", "[buzz-agent] first."),
                ("mcp_server_skipped", "\n\n[buzz-agent] second."),
            ]
        );
        assert!(
            ups.iter()
                .all(|u| u["content"]["annotations"]["audience"] == json!(["user"])),
            "for the user, not the model: {ups:?}"
        );
        assert!(sess.notices.is_empty());
        assert_eq!(
            sess.transcript.len(),
            1,
            "never in the model's conversation"
        );
    }

    /// An Anthropic Messages SSE body: a `server_tool_use` block when `server_tool`, a text
    /// block with `text`, then `stop_reason`.
    fn anthropic_answer(server_tool: bool, text: &str, stop_reason: &str) -> Vec<u8> {
        let mut events =
            vec![r#"{"type":"message_start","message":{"usage":{"input_tokens":5}}}"#.to_owned()];
        let mut index = 0;
        if server_tool {
            events.push(r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"q"}}}"#.to_owned());
            index = 1;
        }
        events.push(format!(
            r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"text","text":"{text}"}}}}"#
        ));
        events.push(format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop_reason}"}},"usage":{{"output_tokens":3}}}}"#
        ));
        events.push(r#"{"type":"message_stop"}"#.to_owned());
        events
            .iter()
            .map(|e| format!("data: {e}\n\n"))
            .collect::<String>()
            .into_bytes()
    }

    /// The Anthropic route without prompt caching, and a session with a `_Stop` hook server.
    fn anthropic_with_guard() -> (Parts, Session) {
        let mut parts = Parts::for_tests();
        parts.cfg.provider = crate::config::ProviderKind::Anthropic;
        parts.cfg.prompt_caching = false;
        let sess = parts.session_with(SID, &[("guard", &["_Stop"])]);
        (parts, sess)
    }

    /// Starts a turn with `text` and its first round: the turn and the round's LLM call.
    fn first_round(parts: &mut Parts, sess: &mut Session, text: &str) -> (Turn, LlmCallId) {
        let mut turn = start(parts, sess, text);
        turn.next_round(sess, &mut parts.cx());
        let (call, _) = last_call(&parts.drain());
        (turn, call)
    }

    #[test]
    fn c69_a_pause_turn_is_continued_with_the_paused_response_and_the_gate_runs_once_at_the_end() {
        let (mut parts, mut sess) = anthropic_with_guard();
        let (mut turn, call) = first_round(&mut parts, &mut sess, "what is new?");
        let paused = anthropic_answer(true, "Searching: ", "pause_turn");
        let end = respond(&mut turn, call, 200, paused, &mut sess, &mut parts);
        assert_eq!(end, None);
        assert!(turn.is_ready(), "L13: no gate at a pause, the turn goes on");
        let actions = parts.drain();
        assert!(Parts::mcp_lines(&actions).is_empty(), "{actions:?}");
        assert_eq!(turn.next_round(&mut sess, &mut parts.cx()), None);
        let (call, body) = last_call(&parts.drain());
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 2, "{body:#}");
        assert_eq!(
            messages[1]["content"],
            json!([
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
                {"type": "text", "text": "Searching: "}
            ]),
            "the paused response is the last turn, as it came"
        );
        let done = anthropic_answer(false, "found it.", "end_turn");
        let end = respond(&mut turn, call, 200, done, &mut sess, &mut parts);
        assert_eq!(end, None, "now the _Stop round runs");
        let actions = parts.drain();
        let hook_calls = Parts::mcp_lines(&actions);
        assert_eq!(hook_calls.len(), 1, "{actions:?}");
        assert_eq!(hook_calls[0]["params"]["name"], "_Stop");
        let shown: Vec<String> = Parts::acp_lines(&actions)
            .iter()
            .filter_map(|l| {
                l["params"]["update"]["content"]["text"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(shown, ["found it."], "the continuation is no new paragraph");
        assert_eq!(turn.rounds(), 2);
    }

    #[test]
    fn c69_a_provider_that_keeps_pausing_ends_the_turn_after_the_last_continuation() {
        let mut parts = Parts::for_tests();
        parts.cfg.provider = crate::config::ProviderKind::Anthropic;
        let mut sess = parts.session_with(SID, &[]);
        let mut turn = start(&mut parts, &mut sess, "search forever");
        for round in 0..=MAX_PAUSES {
            assert_eq!(turn.next_round(&mut sess, &mut parts.cx()), None);
            let (call, _) = last_call(&parts.drain());
            let paused = anthropic_answer(true, "more", "pause_turn");
            let end = respond(&mut turn, call, 200, paused, &mut sess, &mut parts);
            if round < MAX_PAUSES {
                assert_eq!(end, None, "continuation {round}");
            } else {
                assert_eq!(end, Some(TurnEnd::Stopped(StopReason::EndTurn)));
            }
        }
        assert!(logged(&parts.drain(), "paused the turn 8 times in a row"));
    }

    /// Case C77's refusal: no content block, `stop_details` with an explanation.
    const C77_REFUSAL: &str = concat!(
        r#"data: {"type":"message_start","message":{"usage":{"input_tokens":12}}}"#,
        "\n\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"refusal","stop_sequence":null,"stop_details":{"type":"refusal","category":"cyber","explanation":"This request asks for working malware."}},"usage":{"output_tokens":0}}"#,
        "\n\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n"
    );

    /// The texts of the user messages of an Anthropic request body.
    fn user_texts(body: &Value) -> Vec<String> {
        body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "user")
            .map(|m| crate::json::strs_of(&m["content"], "text").join("|"))
            .collect()
    }

    #[test]
    fn c77_a_refused_prompt_shows_the_explanation_and_leaves_the_history() {
        let (mut parts, mut sess) = anthropic_with_guard();
        let (mut first, call) = first_round(&mut parts, &mut sess, "hi");
        let done = anthropic_answer(false, "hello", "end_turn");
        respond(&mut first, call, 200, done, &mut sess, &mut parts);
        let end = TurnEnd::Stopped(StopReason::EndTurn);
        first.settle(&end, &mut sess);
        let kept = sess.transcript.messages().to_vec();
        assert_eq!(kept.len(), 2);

        let (mut turn, call) = first_round(&mut parts, &mut sess, "write the malware");
        let end = respond(
            &mut turn,
            call,
            200,
            C77_REFUSAL.into(),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::Refusal)));
        let actions = parts.drain();
        assert!(
            Parts::mcp_lines(&actions).is_empty(),
            "no _Stop after a refusal"
        );
        let shown = Parts::acp_lines(&actions);
        let notice = shown
            .iter()
            .find(|l| l["params"]["update"]["_meta"]["buzz"]["notice"] == "refusal")
            .map(|l| l["params"]["update"]["content"]["text"].clone());
        assert_eq!(
            notice,
            Some(json!(
                "[buzz-agent] the provider refused this request; it is left out of the conversation, so the next prompt does not repeat it. Its explanation: This request asks for working malware. (category: cyber)"
            )),
            "{shown:?}"
        );
        turn.settle(
            &end.unwrap_or(TurnEnd::Stopped(StopReason::Refusal)),
            &mut sess,
        );
        assert_eq!(
            sess.transcript.messages(),
            kept,
            "C77: the refused turn is gone"
        );

        let mut next = start(&mut parts, &mut sess, "what is 2+2?");
        next.next_round(&mut sess, &mut parts.cx());
        let (_, body) = last_call(&parts.drain());
        assert_eq!(user_texts(&body), ["hi", "what is 2+2?"], "{body:#}");
    }

    #[test]
    fn c77_a_refusal_gives_the_session_start_texts_back_to_the_next_prompt() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[]);
        sess.start_texts = vec![("ctx".into(), "the repo is a monorepo".into())];
        let (mut turn, call) = first_round(&mut parts, &mut sess, "refuse me");
        let refused = answer("", "content_filter");
        let end = respond(&mut turn, call, 200, refused, &mut sess, &mut parts);
        let end = end.unwrap_or(TurnEnd::Failed(String::new()));
        assert_eq!(end, TurnEnd::Stopped(StopReason::Refusal));
        turn.settle(&end, &mut sess);
        assert!(sess.transcript.messages().is_empty());
        assert_eq!(
            sess.start_texts.len(),
            1,
            "H10: the next prompt carries them"
        );
        let mut next = start(&mut parts, &mut sess, "hello");
        next.next_round(&mut sess, &mut parts.cx());
        let (_, body) = last_call(&parts.drain());
        assert!(
            body.to_string().contains("the repo is a monorepo"),
            "{body:#}"
        );
        assert!(!body.to_string().contains("refuse me"), "{body:#}");
    }

    #[test]
    fn c77_a_prompt_cancelled_or_failed_before_an_answer_stays_as_its_own_marked_turn() {
        for (how, mark) in [("cancel", CANCELLED_MARK), ("fail", FAILED_MARK)] {
            let mut parts = Parts::for_tests();
            parts.cfg.llm_max_attempts = 1;
            let mut sess = parts.session_with(SID, &[]);
            let (mut turn, call) = first_round(&mut parts, &mut sess, "first words");
            let end = if how == "cancel" {
                turn.cancel("session/cancel", &mut sess, &mut parts.cx())
            } else {
                respond(&mut turn, call, 500, b"{}".to_vec(), &mut sess, &mut parts)
            };
            let end = end.unwrap_or(TurnEnd::Stopped(StopReason::EndTurn));
            turn.settle(&end, &mut sess);
            let mut next = start(&mut parts, &mut sess, "second words");
            next.next_round(&mut sess, &mut parts.cx());
            let (_, body) = last_call(&parts.drain());
            let messages: Vec<(String, String)> = body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    let role = m["role"].as_str().unwrap_or("").to_owned();
                    (role, m["content"].as_str().unwrap_or("").to_owned())
                })
                .collect();
            let expected = [
                ("user", "first words"),
                ("assistant", mark),
                ("user", "second words"),
            ]
            .map(|(r, t)| (r.to_owned(), t.to_owned()));
            assert_eq!(messages, expected, "{how}: {end:?}");
        }
    }

    #[test]
    fn h5_h6_an_objection_sends_the_model_back_with_the_injection() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[("guard", &["_Stop"])]);
        let mut turn = start(&mut parts, &mut sess, "fix it");
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, _) = last_call(&parts.drain());
        let end = respond(
            &mut turn,
            call,
            200,
            answer("Done.", "stop"),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, None, "the _Stop round runs");
        let hook_calls = Parts::mcp_lines(&parts.drain());
        assert_eq!(hook_calls[0]["params"]["name"], "_Stop");
        assert!(!turn.is_ready());
        let Phase::Gate(round) = &turn.phase else {
            panic!("in the gate");
        };
        let round = round.id();
        let end = turn.on_hook_outcome(
            round,
            0,
            HookOutcome::Text("tests fail".into()),
            &mut sess,
            &mut parts.cx(),
        );
        assert_eq!(end, None);
        assert!(turn.is_ready(), "another round");
        assert_eq!(turn.meta(None)["buzz"]["stopObjections"], 1);
        let Some(Message::ToolResult { text, .. }) = sess.transcript.messages().last() else {
            panic!("the injection ends the history");
        };
        assert_eq!(
            text,
            r#"{"hook":"_Stop","server":"guard","text":"tests fail"}"#
        );
    }

    #[test]
    fn l5_a_429_backs_off_by_its_retry_after_then_retries_the_same_round() {
        let (mut parts, mut sess, mut turn, call) = plain_first_round("hi");
        let end = respond(&mut turn, call, 429, b"{}".to_vec(), &mut sess, &mut parts);
        assert_eq!(end, None);
        assert_eq!(
            parts.timers.next().map(|(t, k)| (t.as_ms(), k)),
            Some((2000, Timer::Turn(SID, TurnTimer::Backoff)))
        );
        parts.at(2000);
        assert_eq!(
            turn.on_timer(TurnTimer::Backoff, &mut sess, &mut parts.cx()),
            None
        );
        let actions = parts.drain();
        let (retry, _) = last_call(&actions);
        assert_ne!(retry, call);
        assert!(
            logged(&actions, &format!("{retry} attempt 2")),
            "{actions:?}"
        );
        assert_eq!(turn.rounds(), 1, "a retry is the same round");
    }

    #[test]
    fn l5_a_silent_provider_times_out_into_a_backoff_and_fails_after_the_last_attempt() {
        let mut parts = Parts::for_tests();
        parts.cfg.llm_max_attempts = 2;
        let mut sess = parts.session_with(SID, &[]);
        let mut turn = start(&mut parts, &mut sess, "hi");
        turn.next_round(&mut sess, &mut parts.cx());
        parts.drain();
        assert_eq!(
            turn.on_timer(TurnTimer::LlmIdle, &mut sess, &mut parts.cx()),
            None
        );
        assert!(matches!(turn.phase, Phase::Backoff { attempt: 2, .. }));
        turn.on_timer(TurnTimer::Backoff, &mut sess, &mut parts.cx());
        let end = turn.on_timer(TurnTimer::LlmIdle, &mut sess, &mut parts.cx());
        assert_eq!(
            end,
            Some(TurnEnd::Failed(
                "llm: no data from the provider for 240 s (BUZZ_AGENT_LLM_TIMEOUT_SECS)".into()
            ))
        );
    }

    #[test]
    fn l1_the_round_after_the_last_allowed_one_ends_the_turn_with_max_turn_requests() {
        let mut parts = Parts::for_tests();
        parts.cfg.max_rounds = 2;
        parts.cfg.max_token_recoveries = 5;
        let mut sess = parts.session_with(SID, &[]);
        let mut turn = start(&mut parts, &mut sess, "write a novel");
        for round in 1..=2 {
            assert_eq!(
                turn.next_round(&mut sess, &mut parts.cx()),
                None,
                "round {round}"
            );
            let (call, _) = last_call(&parts.drain());
            let end = respond(
                &mut turn,
                call,
                200,
                answer("Once", "length"),
                &mut sess,
                &mut parts,
            );
            assert_eq!(end, None, "a nudge, round {round}");
            let shown = &Parts::acp_lines(&parts.drain())[0]["params"]["update"]["content"];
            let expected = if round == 1 { "Once" } else { "\n\nOnce" };
            assert_eq!(shown["text"], expected, "C60: a new round is a paragraph");
        }
        assert_eq!(turn.rounds(), 2);
        assert_eq!(
            turn.next_round(&mut sess, &mut parts.cx()),
            Some(TurnEnd::Stopped(StopReason::MaxTurnRequests))
        );
    }

    /// [`answer`] without the stream's terminator (`[DONE]`).
    fn answer_unterminated(text: &str, finish: &str) -> Vec<u8> {
        let mut body = answer(text, finish);
        body.truncate(body.len() - "data: [DONE]\n\n".len());
        body
    }

    #[test]
    fn c24_an_answer_without_its_terminator_is_taken_when_the_server_closes() {
        let (mut parts, mut sess, mut turn, call) = plain_first_round("hi");
        let end = respond(
            &mut turn,
            call,
            200,
            answer_unterminated("Hi!", "stop"),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::EndTurn)));
    }

    #[test]
    fn c24_b_a_whole_answer_ends_after_the_grace_while_the_connection_stays_open() {
        let (mut parts, mut sess, mut turn, call) = plain_first_round("hi");
        let head = LlmEvent::Head {
            status: 200,
            headers: vec![],
        };
        assert_eq!(
            turn.on_llm_event(call, head, &mut sess, &mut parts.cx()),
            None
        );
        // A stale grace timer before the answer is whole is the idle timeout (a retry).
        assert_eq!(
            turn.on_timer(TurnTimer::LlmGrace, &mut sess, &mut parts.cx()),
            None
        );
        assert!(
            logged(&parts.drain(), "no data from the provider"),
            "not taken as an answer"
        );
        parts.timers.clear_turn(SID);
        let mut turn = start(&mut parts, &mut sess, "again");
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, _) = last_call(&parts.drain());
        for event in [
            LlmEvent::Head {
                status: 200,
                headers: vec![],
            },
            LlmEvent::Body(answer_unterminated("Hi!", "stop")),
        ] {
            assert_eq!(
                turn.on_llm_event(call, event, &mut sess, &mut parts.cx()),
                None
            );
        }
        assert_eq!(
            parts.timers.next().map(|(t, k)| (t.as_ms(), k)),
            Some((FINAL_ANSWER_GRACE_MS, Timer::Turn(SID, TurnTimer::LlmGrace)))
        );
        assert_eq!(
            turn.on_timer(TurnTimer::LlmGrace, &mut sess, &mut parts.cx()),
            Some(TurnEnd::Stopped(StopReason::EndTurn))
        );
    }

    #[test]
    fn k1_l5_a_context_too_long_answer_compacts_instead_of_failing() {
        let (mut parts, mut sess, mut turn, call) = plain_first_round("hi");
        let too_long =
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#;
        let end = respond(
            &mut turn,
            call,
            400,
            too_long.to_vec(),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, None, "compaction, not a failure");
        let actions = parts.drain();
        assert!(logged(
            &actions,
            "the provider said the context is too long"
        ),);
        // Once per turn: the same answer to the summary request compacts no more.
        let (summary, _) = last_call(&actions);
        assert_ne!(summary, call);
        respond(
            &mut turn,
            summary,
            400,
            too_long.to_vec(),
            &mut sess,
            &mut parts,
        );
        let actions = parts.drain();
        assert!(
            !logged(&actions, "the provider said the context is too long"),
            "{:#?}",
            Parts::logs(&actions)
        );
    }

    #[test]
    fn l10_l13_an_answer_is_kept_with_text_thinking_or_reasoning_state_and_a_refusal_never() {
        let resp = |text: &str, thinking: &str, reasoning: Vec<ReasoningBlock>, stop| LlmResponse {
            text: text.into(),
            thinking: thinking.into(),
            reasoning,
            tool_calls: vec![],
            stop,
            usage: None,
            stop_details: None,
        };
        let redacted = || vec![ReasoningBlock::Redacted { data: "x".into() }];
        for (response, kept) in [
            (resp("Hi", "", vec![], StopKind::EndTurn), true),
            (resp("", "hmm", vec![], StopKind::EndTurn), true),
            (resp("", "", redacted(), StopKind::EndTurn), true),
            (resp("", "", vec![], StopKind::EndTurn), false),
            // L13: a refused turn leaves the history (`settle`), its text with it.
            (resp("I can't", "", vec![], StopKind::Refusal), false),
            (resp("", "", vec![], StopKind::Refusal), false),
        ] {
            let mut parts = Parts::for_tests();
            let mut sess = parts.session_with(SID, &[]);
            let mut turn = start(&mut parts, &mut sess, "hi");
            let before = sess.transcript.len();
            turn.on_round_response(response.clone(), &mut sess, &mut parts.cx());
            assert_eq!(
                sess.transcript.len(),
                before + usize::from(kept),
                "{response:?}"
            );
        }
    }

    #[test]
    fn l2_c59_a_running_call_shows_progress_and_its_result_readies_the_next_round() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[("fs", &["read"])]);
        let mut turn = start(&mut parts, &mut sess, "read it");
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, _) = last_call(&parts.drain());
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",",
            "\"type\":\"function\",\"function\":{\"name\":\"fs__read\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let end = respond(&mut turn, call, 200, body.into(), &mut sess, &mut parts);
        assert_eq!(end, None);
        assert!(
            Parts::mcp_lines(&parts.drain())
                .iter()
                .any(|l| l["method"] == "tools/call"),
            "the call runs"
        );
        turn.on_progress(sess.servers[0], &json!("tc_1"), "halfway", &mut parts.cx());
        let update = &Parts::acp_lines(&parts.drain())[0]["params"]["update"];
        assert_eq!(
            (&update["toolCallId"], &update["status"]),
            (&json!("tc_1"), &json!("in_progress"))
        );
        assert!(!turn.is_ready());
        let end = turn.on_tool_result(
            ToolCallIndex(0),
            ToolOutput::plain("done".into(), false),
            false,
            &mut sess,
            &mut parts.cx(),
        );
        assert_eq!(end, None);
        assert!(turn.is_ready(), "the next round is due");
        assert!(matches!(
            sess.transcript.messages().last(),
            Some(Message::ToolResult { text, .. }) if text == "done"
        ));
    }

    #[test]
    fn l1_a_truncated_answer_gets_a_nudge_then_max_tokens() {
        let mut parts = Parts::for_tests();
        parts.cfg.max_token_recoveries = 1;
        let mut sess = parts.session_with(SID, &[]);
        let mut turn = start(&mut parts, &mut sess, "write a novel");
        for expected in [None, Some(TurnEnd::Stopped(StopReason::MaxTokens))] {
            turn.next_round(&mut sess, &mut parts.cx());
            let (call, _) = last_call(&parts.drain());
            let end = respond(
                &mut turn,
                call,
                200,
                answer("Once", "length"),
                &mut sess,
                &mut parts,
            );
            assert_eq!(end, expected);
        }
        assert!(sess.transcript.messages().contains(&Message::User {
            text: MAX_TOKENS_NUDGE.into()
        }));
    }

    #[test]
    fn k1_l5_a_full_context_window_compacts_once_then_ends_max_tokens_never_nudges() {
        let (mut parts, mut sess, mut turn, call) = plain_first_round("read it all");
        // Mistral's spelling; Anthropic's `model_context_window_exceeded` maps to the same.
        let full = || answer("Once", "model_length");
        let end = respond(&mut turn, call, 200, full(), &mut sess, &mut parts);
        assert_eq!(end, None, "compaction, not the end");
        let actions = parts.drain();
        assert!(
            logged(&actions, "the model's context window is full"),
            "{:#?}",
            Parts::logs(&actions)
        );
        let (summary, body) = last_call(&actions);
        assert!(
            body.to_string().contains(compaction::SUMMARY_SYSTEM_PROMPT),
            "the next call is the summary: {body}"
        );
        let end = respond(
            &mut turn,
            summary,
            200,
            answer("the summary", "stop"),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, None);
        assert!(turn.is_ready(), "the round runs again after the summary");
        turn.next_round(&mut sess, &mut parts.cx());
        let (again, body) = last_call(&parts.drain());
        assert!(body.to_string().contains("the summary"), "{body}");
        // Once per prompt: a second full window ends the turn.
        let end = respond(&mut turn, again, 200, full(), &mut sess, &mut parts);
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::MaxTokens)));
        assert!(
            !sess.transcript.messages().contains(&Message::User {
                text: MAX_TOKENS_NUDGE.into()
            }),
            "a full window is not nudged"
        );
    }

    #[test]
    fn a4_cancel_mid_stream_drops_the_call_and_later_bytes_change_nothing() {
        let (mut parts, mut sess, mut turn, call) = plain_first_round("hi");
        turn.on_llm_event(
            call,
            LlmEvent::Head {
                status: 200,
                headers: vec![],
            },
            &mut sess,
            &mut parts.cx(),
        );
        assert!(!turn.is_cancelled());
        let end = turn.cancel("cancelled by the client", &mut sess, &mut parts.cx());
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::Cancelled)));
        assert!(turn.is_cancelled());
        assert!(parts.drain().contains(&Action::CancelLlm { call }));
        assert_eq!(parts.timers.next(), None);
        let late = turn.on_llm_event(call, LlmEvent::End, &mut sess, &mut parts.cx());
        assert_eq!(late, None);
        assert!(parts.drain().is_empty(), "I6");
        assert_eq!(
            turn.cancel("again", &mut sess, &mut parts.cx()),
            None,
            "a second cancel is a no-op"
        );
    }

    #[test]
    fn k1_h7_a_full_context_is_summarised_then_post_compact_injects_after_the_summary() {
        let mut parts = Parts::for_tests();
        parts.cfg.max_context_tokens = 1000;
        let mut sess = parts.session_with(SID, &[("mem", &["_PostCompact"])]);
        sess.transcript.push(Message::User {
            text: "x".repeat(950),
        });
        let mut turn = start(&mut parts, &mut sess, "continue");
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, body) = last_call(&parts.drain());
        assert!(
            body.get("tools").is_none(),
            "a summary call offers no tools"
        );
        assert_eq!(turn.rounds(), 0, "compaction runs before the round");
        let end = respond(
            &mut turn,
            call,
            200,
            answer("We did X.", "stop"),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, None);
        let actions = parts.drain();
        assert!(
            Parts::acp_lines(&actions).is_empty(),
            "K1: the summary is never streamed"
        );
        assert_eq!(
            Parts::mcp_lines(&actions)[0]["params"]["name"],
            "_PostCompact"
        );
        let Phase::Gate(round) = &turn.phase else {
            panic!("the _PostCompact round runs");
        };
        let round = round.id();
        turn.on_hook_outcome(
            round,
            0,
            HookOutcome::Text("remember the API key rule".into()),
            &mut sess,
            &mut parts.cx(),
        );
        let kinds: Vec<&str> = sess
            .transcript
            .messages()
            .iter()
            .map(|m| match m {
                Message::User { .. } => "user",
                Message::Assistant { .. } => "assistant",
                Message::ToolResult { .. } => "result",
            })
            .collect();
        assert_eq!(
            kinds,
            ["user", "assistant", "result", "user"],
            "summary, injection, prompt"
        );
        assert!(turn.is_ready());
        turn.next_round(&mut sess, &mut parts.cx());
        assert_eq!(turn.rounds(), 1, "then the round runs");
    }

    #[test]
    fn c60_rounds_and_notices_are_paragraphs_and_never_run_together() {
        let mut parts = Parts::for_tests();
        let sess = parts.session_with(SID, &[]);
        let mut shown = Shown::default();
        let text = |t: &str| vec![StreamDelta::Text(t.into())];
        shown.new_round();
        shown.emit(CallPurpose::Round, text("All "), &sess, &mut parts.cx());
        shown.emit(CallPurpose::Round, text("done."), &sess, &mut parts.cx());
        shown.notice(
            "hook_objection",
            "info",
            "[buzz-agent] why",
            &sess,
            &mut parts.cx(),
        );
        shown.new_round();
        shown.emit(
            CallPurpose::Summary,
            text("summary"),
            &sess,
            &mut parts.cx(),
        );
        shown.emit(
            CallPurpose::Round,
            text("Fixed; done now."),
            &sess,
            &mut parts.cx(),
        );
        shown.new_round();
        shown.emit(
            CallPurpose::Round,
            text("Ends with a break\n"),
            &sess,
            &mut parts.cx(),
        );
        shown.new_round();
        shown.emit(CallPurpose::Round, text("Last."), &sess, &mut parts.cx());
        let chunks: Vec<(String, bool)> = Parts::acp_lines(&parts.drain())
            .iter()
            .map(|l| &l["params"]["update"])
            .map(|u| {
                (
                    u["content"]["text"].as_str().unwrap_or("").to_string(),
                    u["_meta"]["buzz"]["notice"].is_string(),
                )
            })
            .collect();
        let all: String = chunks.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            all,
            "All done.\n\n[buzz-agent] why\n\nFixed; done now.\n\nEnds with a break\n\nLast."
        );
        let answer: String = chunks
            .iter()
            .filter(|(_, notice)| !notice)
            .map(|(t, _)| t.as_str())
            .collect();
        assert!(
            answer.starts_with("All done.\n\nFixed; done now."),
            "{answer}"
        );
        assert_eq!(chunks.iter().filter(|(_, n)| *n).count(), 1);
    }

    #[test]
    fn c60_the_objection_notice_names_the_servers_but_never_their_text() {
        let n = objection_notice(&[
            ("TestGuard".into(), "2 tests\nfail".into()),
            (crate::hooks::REPLY_GUARD_SERVER.into(), "remember".into()),
        ]);
        assert_eq!(
            n,
            "[buzz-agent] hook server 'TestGuard' objected to ending the turn; the reply guard reminded the model to post its reply; the agent continues."
        );
        let two = objection_notice(&[("a".into(), "x".into()), ("b".into(), "y".into())]);
        assert_eq!(
            two,
            "[buzz-agent] hook servers 'a', 'b' objected to ending the turn; the agent continues."
        );
        let reminder =
            objection_notice(&[(crate::hooks::REPLY_GUARD_SERVER.into(), "remember".into())]);
        assert_eq!(
            reminder,
            "[buzz-agent] the reply guard reminded the model to post its reply; the agent continues.",
            "no hook server objected"
        );
    }

    #[test]
    fn c60_a_paragraph_break_is_due_once_per_round_and_only_after_text() {
        let mut shown = Shown::default();
        shown.new_round();
        assert_eq!(shown.take_break(), "", "nothing shown yet");
        shown.record("Hello");
        assert_eq!(shown.take_break(), "", "the same round goes on");
        shown.new_round();
        assert_eq!(shown.take_break(), "\n\n");
        assert_eq!(shown.take_break(), "", "taken once");
        shown.record("a list\n");
        shown.new_round();
        assert_eq!(shown.take_break(), "\n", "one newline is there");
        shown.record("done\n\n");
        shown.new_round();
        assert_eq!(shown.take_break(), "", "the paragraph already ends");
    }

    #[test]
    fn a6_an_empty_text_delta_shows_nothing_and_keeps_the_break_for_the_next_text() {
        let mut parts = Parts::for_tests();
        let sess = parts.session_with(SID, &[]);
        let mut shown = Shown::default();
        shown.record("All done.");
        shown.new_round();
        shown.emit(
            CallPurpose::Round,
            vec![
                StreamDelta::Text(String::new()),
                StreamDelta::Text("Fixed.".into()),
            ],
            &sess,
            &mut parts.cx(),
        );
        let texts: Vec<Value> = Parts::acp_lines(&parts.drain())
            .iter()
            .map(|l| l["params"]["update"]["content"]["text"].clone())
            .collect();
        assert_eq!(texts, [json!("\n\nFixed.")]);
    }

    #[test]
    fn c60_a_client_that_presents_notices_gets_an_acp_notice_and_the_text_is_untouched() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[]);
        sess.client_notices = true;
        let mut shown = Shown::default();
        shown.new_round();
        let text = |t: &str| vec![StreamDelta::Text(t.into())];
        shown.emit(
            CallPurpose::Round,
            text("All done."),
            &sess,
            &mut parts.cx(),
        );
        shown.notice(
            "hook_objection",
            "info",
            "[buzz-agent] why",
            &sess,
            &mut parts.cx(),
        );
        shown.new_round();
        shown.emit(CallPurpose::Round, text("Fixed."), &sess, &mut parts.cx());
        let ups: Vec<Value> = Parts::acp_lines(&parts.drain())
            .iter()
            .map(|l| l["params"]["update"].clone())
            .collect();
        assert_eq!(
            ups[1],
            json!({"sessionUpdate": "notice", "severity": "info", "title": "why",
                   "_meta": {"buzz": {"notice": "hook_objection"}}})
        );
        assert_eq!(
            ups[2]["content"]["text"], "\n\nFixed.",
            "the rounds still a paragraph apart"
        );
    }

    #[test]
    fn h10_the_first_prompt_carries_the_session_start_texts_in_its_first_request_only() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[]);
        sess.start_texts = vec![("todo".into(), "open: docs".into())];
        let mut turn = start(&mut parts, &mut sess, "first");
        assert!(sess.start_texts.is_empty(), "the first prompt took them");
        turn.next_round(&mut sess, &mut parts.cx());
        let (call, body) = last_call(&parts.drain());
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        let roles: Vec<&str> = msgs.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(
            roles,
            ["user", "assistant", "tool", "assistant", "user"],
            "{msgs:#?}"
        );
        assert_eq!(msgs[0]["content"], "first", "right after the prompt");
        assert_eq!(
            msgs[2]["content"],
            r#"{"hook":"_SessionStart","server":"todo","text":"open: docs"}"#
        );
        assert_eq!(msgs[4]["content"], crate::hooks::SESSION_START_FOLLOW_UP);
        let end = respond(
            &mut turn,
            call,
            200,
            answer("ok", "stop"),
            &mut sess,
            &mut parts,
        );
        assert_eq!(end, Some(TurnEnd::Stopped(StopReason::EndTurn)));
        let injected = |m: &Message| matches!(m, Message::ToolResult { text, .. } if text.contains("_SessionStart"));
        assert_eq!(
            sess.transcript
                .messages()
                .iter()
                .filter(|m| injected(m))
                .count(),
            1
        );
        // The second prompt injects nothing new.
        let mut second = start(&mut parts, &mut sess, "second");
        second.next_round(&mut sess, &mut parts.cx());
        parts.drain();
        assert_eq!(
            sess.transcript
                .messages()
                .iter()
                .filter(|m| injected(m))
                .count(),
            1
        );
        assert_eq!(sess.prompts, 2);
    }

    #[test]
    fn h10_a_first_prompt_cancelled_before_its_first_request_drops_the_texts() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[]);
        sess.start_texts = vec![("todo".into(), "open: docs".into())];
        let mut turn = start(&mut parts, &mut sess, "first");
        assert_eq!(
            turn.cancel("cancelled by the client", &mut sess, &mut parts.cx()),
            Some(TurnEnd::Stopped(StopReason::Cancelled))
        );
        let mut second = start(&mut parts, &mut sess, "second");
        second.next_round(&mut sess, &mut parts.cx());
        let (_, body) = last_call(&parts.drain());
        assert!(
            !body.to_string().contains("_SessionStart"),
            "never injected into another prompt: {body}"
        );
    }
}
