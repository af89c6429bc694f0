//! MCP lifecycle hooks (SPEC H1–H11, G1–G2), all in one place: the points ([`HookPoint`]), how
//! a hook's answer counts ([`classify_reply`]), the [`HookRound`] that calls every hook of a
//! point concurrently, the `_Stop` [`StopGate`] with its per-prompt budget, the reply guard (G1
//! reminder, G2 posting detection) and the model-visible injections (H6, H7, H10).
//!
//! Who starts a round: the turn for `_Stop` (the model ended its answer) and `_PostCompact`
//! (after a summary); the session's lifecycle (`lifecycle.rs`) for `_SessionStart` (its
//! servers are ready) and `_SessionEnd` (`session/close` or the agent's shutdown).
//!
//! Invariants (DESIGN I1–I5, checked here and by `core/tests/hooks_props.rs`):
//! - `objections <= budget` for every prompt (I1); the count resets only at `session/prompt`
//!   (I2: a new turn has a new gate);
//! - a round started at t is decided by t + hook timeout (each call's deadline is in the timer
//!   table), results in registration order (I3);
//! - timeout / error / isError / empty / dead never objects (I4);
//! - a server is killed only on its 2nd consecutive hook timeout (I5: counted by the server
//!   table, which owns server state).
//!
//! Adding a hook point: a [`HookPoint`] variant and its name here, a [`HookRound::start`] where
//! the turn reaches the point, and what the decided round's texts do.

use crate::config::{HookAllowlist, LogLevel};
use crate::cx::McpCx;
use crate::ids::{HookRoundId, ServerSlot, SessionId};
use crate::jsonrpc::RpcError;
use crate::llm::{Message, ToolCall};
use crate::mcp::{HookCallRef, McpRequest, Purpose, ServerTable};
use crate::outbox::Outbox;
use crate::session::Session;
use crate::time::MonoTime;
use crate::transcript::Transcript;
use serde_json::{Value, json};

/// A hook point (SPEC H1, H10, H11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    /// `_Stop`: the model ended its turn; an objection sends it back (SPEC H5).
    Stop,
    /// `_PostCompact`: the context was just compacted; text is injected after the summary
    /// (SPEC H7).
    PostCompact,
    /// `_SessionStart`: the session's servers are ready (after `session/new`); text is
    /// injected right after the first prompt of the session (SPEC H10).
    SessionStart,
    /// `_SessionEnd`: the session ends (`session/close`, or the agent shuts down); text is
    /// logged, never injected (SPEC H11).
    SessionEnd,
}

impl HookPoint {
    /// Every point, in the order of a session's life.
    pub const ALL: [HookPoint; 4] = [
        HookPoint::SessionStart,
        HookPoint::Stop,
        HookPoint::PostCompact,
        HookPoint::SessionEnd,
    ];

    /// The hook tool name, e.g. `_Stop`.
    #[must_use]
    pub const fn tool_name(self) -> &'static str {
        match self {
            HookPoint::Stop => "_Stop",
            HookPoint::PostCompact => "_PostCompact",
            HookPoint::SessionStart => "_SessionStart",
            HookPoint::SessionEnd => "_SessionEnd",
        }
    }

    /// What a non-blank answer does: `object` (`_Stop`), `inject` (`_PostCompact`,
    /// `_SessionStart`) or `log` (`_SessionEnd`), e.g. for `hooks check`.
    #[must_use]
    pub fn effect(self) -> &'static str {
        match self {
            HookPoint::Stop => "object",
            HookPoint::PostCompact | HookPoint::SessionStart => "inject",
            HookPoint::SessionEnd => "log",
        }
    }

    /// The point whose hook tool is named `name` exactly (names are case-sensitive).
    #[must_use]
    pub fn from_tool_name(name: &str) -> Option<HookPoint> {
        HookPoint::ALL.into_iter().find(|p| p.tool_name() == name)
    }
}

/// Why a session ended, sent to `_SessionEnd` as `reason` (SPEC H11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReason {
    /// The client sent `session/close`.
    Close,
    /// The client closed the agent's stdin.
    Eof,
    /// SIGTERM, SIGINT or SIGHUP.
    Signal,
    /// Writing to the client failed (it is gone).
    ClientGone,
}

impl EndReason {
    /// The wire word: `close`, `eof`, `signal` or `client_gone`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EndReason::Close => "close",
            EndReason::Eof => "eof",
            EndReason::Signal => "signal",
            EndReason::ClientGone => "client_gone",
        }
    }
}

/// How one hook call ended (SPEC H3, H4, H9). Only `Text` carries text to the model. Public
/// for `hooks check` (the extras), whose verdict is the agent's: [`classify_reply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookOutcome {
    /// Non-blank text: an objection (for `_Stop`) or an injection (for `_PostCompact`).
    Text(String),
    /// Empty after trimming.
    Empty,
    /// JSON-RPC error or `isError` result (fail-open).
    Error(String),
    /// No reply within `BUZZ_AGENT_HOOK_TIMEOUT_MS` (fail-open).
    Timeout,
    /// The server was dead or not ready (never called), or died during the call (fail-open).
    Dead,
}

impl HookOutcome {
    /// The `outcome=` word of the H9 log line.
    fn label(&self) -> &'static str {
        match self {
            HookOutcome::Text(_) => "objection",
            HookOutcome::Empty => "empty",
            HookOutcome::Error(_) => "error",
            HookOutcome::Timeout => "timeout",
            HookOutcome::Dead => "dead",
        }
    }
}

/// The notices for hooks that will not run (case C56, SPEC H2): one sentence for each server
/// among `slots` (registration order) that exposes hook points but is not in `allowlist`
/// (`MCP_HOOK_SERVERS`), naming the server as the client did, its hook points and the
/// allowlist. Hook-like tools that are no hook point (`_Other`) are never called anyway and are
/// not named. The MCP catalogue (`core/src/mcp/catalogue.rs`) logs the WARN of the same
/// finding.
pub(crate) fn hooks_off(
    servers: &ServerTable,
    slots: &[ServerSlot],
    allowlist: &HookAllowlist,
) -> Vec<String> {
    let mut off: Vec<(usize, String, Vec<&str>)> = Vec::new();
    for point in HookPoint::ALL {
        let hook = point.tool_name();
        for target in servers.hook_targets(slots, hook, &HookAllowlist::All) {
            if allowlist.allows(&target.name) {
                continue;
            }
            let at = slots
                .iter()
                .position(|s| *s == target.slot)
                .unwrap_or(usize::MAX);
            match off.iter_mut().find(|(i, ..)| *i == at) {
                Some((_, _, hooks)) => hooks.push(hook),
                None => off.push((at, target.name, vec![hook])),
            }
        }
    }
    off.sort_by_key(|(at, ..)| *at);
    let why = match allowlist {
        HookAllowlist::Off => "MCP_HOOK_SERVERS is not set".to_string(),
        HookAllowlist::All | HookAllowlist::Names(_) => {
            format!(
                "MCP_HOOK_SERVERS ({}) does not name it",
                allowlist.env_value()
            )
        }
    };
    off.into_iter()
        .map(|(_, name, hooks)| {
            format!(
                "MCP server '{name}' has hooks ({}), but {why}: they will not run.",
                hooks.join(", ")
            )
        })
        .collect()
}

/// How a hook's answer counts (SPEC H3, H4, I4, case C40): the text of its `content` text
/// blocks (never `structuredContent`), middle-elided over `cap` bytes; non-blank text objects,
/// blank text is empty, an `isError` result or a JSON-RPC error is an error (fail-open).
///
/// `reply` is the outcome of a response as [`crate::jsonrpc::parse_message`] reads it. The
/// agent classifies every hook answer here, and `hooks check` does too, so what it reports is
/// what the agent would do with the same answer.
pub fn classify_reply(reply: Result<Value, RpcError>, cap: usize) -> HookOutcome {
    match reply {
        Ok(v) => {
            let out = crate::tools::hook_answer(&v, cap);
            if out.is_error {
                HookOutcome::Error(format!("isError: {}", out.text))
            } else if out.text.trim().is_empty() {
                HookOutcome::Empty
            } else {
                HookOutcome::Text(out.text)
            }
        }
        Err(e) => HookOutcome::Error(format!("{} {}", e.code, e.message)),
    }
}

/// The `tools/call` params of the first call of `point` in a session `session_id` opened as
/// new and, for `_SessionEnd`, closed before any prompt, with `budget_remaining` objections
/// left (`BUZZ_AGENT_STOP_MAX_REJECTIONS`): the request the agent sends (SPEC H3, H10, H11),
/// built by the same code. For `hooks check`, which calls each hook once.
#[must_use]
pub fn first_call_params(point: HookPoint, session_id: &str, budget_remaining: u32) -> Value {
    let mut meta = HookMeta::turn(1, budget_remaining);
    match point {
        HookPoint::SessionStart => meta.source = Some("new"),
        HookPoint::SessionEnd => {
            meta.reason = Some(EndReason::Close);
            meta.prompt_count = Some(0);
        }
        HookPoint::Stop | HookPoint::PostCompact => {}
    }
    meta.call_params(point, session_id)
}

/// One call of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HookCall {
    /// The server called (a shutdown waits for its answer, SPEC H11).
    slot: ServerSlot,
    /// The name the client gave (logs, notices).
    server_name: String,
    /// The server's tool prefix (the injection's tool name, SPEC H6).
    prefix: String,
    started: MonoTime,
    outcome: Option<HookOutcome>,
}

/// A hook round (SPEC H3): every allowlisted server of the session that exposes the hook is
/// called at once, each call with its own deadline (`BUZZ_AGENT_HOOK_TIMEOUT_MS`, in the timer
/// table); the round is decided when every call is, and its texts come out in registration
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookRound {
    id: HookRoundId,
    point: HookPoint,
    /// In registration order.
    calls: Vec<HookCall>,
}

/// What a hook call's `_meta["buzz/hook"]` carries besides `point` and `sessionId` (SPEC H3,
/// H11): `attempt` and `budgetRemaining` for every point, `reason` and `promptCount` for
/// `_SessionEnd`, `source` for `_SessionStart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HookMeta {
    /// `_Stop`: the objection this round would be (1-based); `_PostCompact`: the handoff; 1
    /// for the session points.
    pub(crate) attempt: u32,
    /// `_Stop` budget left (informational; the session points never spend it).
    pub(crate) budget_remaining: u32,
    /// `_SessionStart`: how the session was opened (`new`).
    pub(crate) source: Option<&'static str>,
    /// `_SessionEnd`: why the session ended.
    pub(crate) reason: Option<EndReason>,
    /// `_SessionEnd`: how many prompts the session ran.
    pub(crate) prompt_count: Option<u32>,
}

impl HookMeta {
    /// The meta of a `_Stop` or `_PostCompact` round.
    pub(crate) fn turn(attempt: u32, budget_remaining: u32) -> HookMeta {
        HookMeta {
            attempt,
            budget_remaining,
            source: None,
            reason: None,
            prompt_count: None,
        }
    }

    /// The `tools/call` params of a call of `point` in the session `session_id`: the hook's
    /// name, no arguments and this meta in `_meta["buzz/hook"]` (SPEC H3).
    fn call_params(self, point: HookPoint, session_id: &str) -> Value {
        json!({
            "name": point.tool_name(),
            "arguments": {},
            "_meta": {"buzz/hook": self.to_value(point, session_id)}
        })
    }

    fn to_value(self, point: HookPoint, session_id: &str) -> Value {
        let mut meta = json!({
            "point": point.tool_name(),
            "sessionId": session_id,
            "attempt": self.attempt,
            "budgetRemaining": self.budget_remaining
        });
        if let Some(source) = self.source {
            meta["source"] = json!(source);
        }
        if let Some(reason) = self.reason {
            meta["reason"] = json!(reason.as_str());
        }
        if let Some(n) = self.prompt_count {
            meta["promptCount"] = json!(n);
        }
        meta
    }
}

impl HookRound {
    /// Starts a round for `point` over `session`'s servers (SPEC H2, H3), telling each hook
    /// `meta` in `_meta.buzz/hook`. Servers that are dead or not ready are not called and
    /// count as `dead` at once, so a round with no live target is decided as soon as it
    /// starts.
    pub(crate) fn start(
        point: HookPoint,
        session: &Session,
        meta: HookMeta,
        cx: &mut McpCx<'_>,
    ) -> HookRound {
        let now = cx.out.now();
        let timeout = cx.cfg.hook_timeout_ms;
        let id = cx.ids.next_hook_round();
        let hook = point.tool_name();
        let targets = cx
            .servers
            .hook_targets(&session.servers, hook, &cx.cfg.hook_servers);
        let mut calls = Vec::with_capacity(targets.len());
        for target in targets {
            let index = calls.len();
            let mut request = None;
            if target.ready {
                let params = meta.call_params(point, &session.id.to_string());
                let purpose = Purpose::Hook(HookCallRef {
                    session: session.id,
                    round: id,
                    index,
                });
                request = cx.servers.send_request(
                    target.slot,
                    McpRequest::tools_call(&params, purpose, timeout),
                    cx.out,
                    cx.timers,
                );
            }
            calls.push(HookCall {
                slot: target.slot,
                server_name: target.name,
                prefix: target.prefix,
                started: now,
                outcome: request.is_none().then_some(HookOutcome::Dead),
            });
        }
        let round = HookRound { id, point, calls };
        for c in &round.calls {
            if c.outcome == Some(HookOutcome::Dead) {
                log_hook_call(cx.out, point, &c.server_name, &HookOutcome::Dead, 0);
            }
        }
        round
    }

    /// The round's id.
    pub(crate) fn id(&self) -> HookRoundId {
        self.id
    }

    /// The hook point.
    pub(crate) fn point(&self) -> HookPoint {
        self.point
    }

    /// The servers whose call is still undecided (registration order): a shutdown keeps
    /// their stdin open until they answer (SPEC H11).
    pub(crate) fn waiting_servers(&self) -> impl Iterator<Item = ServerSlot> + '_ {
        self.calls
            .iter()
            .filter(|c| c.outcome.is_none())
            .map(|c| c.slot)
    }

    /// Every call decided.
    pub(crate) fn is_decided(&self) -> bool {
        self.calls.iter().all(|c| c.outcome.is_some())
    }

    /// Call `index` ended at the step's time (reply, error, timeout, death): recorded and
    /// logged (SPEC H9). A call already decided keeps its first outcome (a late reply after a
    /// timeout changes nothing, I6). Returns whether the round is now decided.
    pub(crate) fn on_outcome(
        &mut self,
        index: usize,
        outcome: HookOutcome,
        out: &mut Outbox,
    ) -> bool {
        let Some(call) = self.calls.get_mut(index) else {
            return false;
        };
        if call.outcome.is_some() {
            return false;
        }
        let ms = out.now().ms_since(call.started);
        call.outcome = Some(outcome.clone());
        let name = call.server_name.clone();
        log_hook_call(out, self.point, &name, &outcome, ms);
        self.is_decided()
    }

    /// The texts of the decided round in registration order: `(server's tool prefix, text)`
    /// (SPEC H3; the prefix is the server's name unless the client's name is not a valid
    /// tool-name part, A2).
    pub(crate) fn texts(&self) -> Vec<(String, String)> {
        self.texts_by(|c| c.prefix.clone())
    }

    /// The texts of the decided round in registration order with the servers' names as the
    /// client gave them, for what the user reads.
    pub(crate) fn texts_by_name(&self) -> Vec<(String, String)> {
        self.texts_by(|c| c.server_name.clone())
    }

    fn texts_by(&self, key: impl Fn(&HookCall) -> String) -> Vec<(String, String)> {
        self.calls
            .iter()
            .filter_map(|c| match &c.outcome {
                Some(HookOutcome::Text(t)) => Some((key(c), t.clone())),
                Some(
                    HookOutcome::Empty
                    | HookOutcome::Error(_)
                    | HookOutcome::Timeout
                    | HookOutcome::Dead,
                )
                | None => None,
            })
            .collect()
    }
}

/// H9: one log line per hook call.
fn log_hook_call(out: &mut Outbox, point: HookPoint, server: &str, outcome: &HookOutcome, ms: u64) {
    let level = match outcome {
        HookOutcome::Text(_) | HookOutcome::Empty => LogLevel::Info,
        HookOutcome::Error(_) | HookOutcome::Timeout | HookOutcome::Dead => LogLevel::Warn,
    };
    let detail = match outcome {
        HookOutcome::Error(e) => format!(" ({e})"),
        HookOutcome::Text(_) | HookOutcome::Empty | HookOutcome::Timeout | HookOutcome::Dead => {
            String::new()
        }
    };
    out.log(
        level,
        format!(
            "hook: point={} server={server} outcome={}{detail} latency_ms={ms}",
            point.tool_name(),
            outcome.label()
        ),
    );
}

/// How the gate opens when the model ends its turn (SPEC H5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateOpening {
    /// No `_Stop` round: end the turn (`end_turn`): the budget is 0, or it is spent.
    EndTurn,
    /// Run a `_Stop` round; hooks see `attempt` and `budget_remaining` (SPEC H8).
    Round { attempt: u32, budget_remaining: u32 },
}

/// What a decided `_Stop` round means (SPEC H5, H6, G1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GateVerdict {
    /// Nobody objected: end the turn (`end_turn`).
    EndTurn,
    /// Objections (hooks in registration order, then the reply guard's reminder): inject
    /// them and run another round. They cost one budget unit together.
    Objected(Vec<(String, String)>),
}

/// The `_Stop` gate of one prompt (SPEC H5, G1): how many objections were honoured against the
/// budget, and the reply guard's state. A new prompt has a new gate (I2).
///
/// Invariant (I1): `objections <= budget`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StopGate {
    /// `BUZZ_AGENT_STOP_MAX_REJECTIONS`.
    budget: u32,
    /// `BUZZ_AGENT_REQUIRE_REPLY` (SPEC G1).
    require_reply: bool,
    /// Objecting rounds honoured.
    objections: u32,
    /// Reply-guard reminders given (at most [`MAX_REMINDERS`]).
    reminders: u32,
    /// Whether a posting tool call was dispatched this prompt (SPEC G2).
    posted: bool,
    /// The budget ran out: the turn ended although a hook might still object.
    exhausted: bool,
    /// The reply guard's reminder goes with the round in progress.
    reminder_due: bool,
}

impl StopGate {
    /// A fresh gate for one prompt.
    pub(crate) fn new(budget: u32, require_reply: bool) -> StopGate {
        StopGate {
            budget,
            require_reply,
            objections: 0,
            reminders: 0,
            posted: false,
            exhausted: false,
            reminder_due: false,
        }
    }

    /// A posting tool call was dispatched (SPEC G2): the reply guard is satisfied.
    pub(crate) fn mark_posted(&mut self) {
        self.posted = true;
    }

    /// The model ended its turn in `session`: end it, or run a round (SPEC H5). A spent
    /// budget is logged (SPEC H9).
    pub(crate) fn open(&mut self, session: SessionId, out: &mut Outbox) -> GateOpening {
        if self.budget == 0 {
            return GateOpening::EndTurn;
        }
        if self.objections >= self.budget {
            self.exhausted = true;
            out.log(
                LogLevel::Warn,
                format!(
                    "hook: _Stop budget of {} exhausted in session {session}; ending the turn",
                    self.budget
                ),
            );
            return GateOpening::EndTurn;
        }
        self.reminder_due = self.require_reply && !self.posted && self.reminders < MAX_REMINDERS;
        GateOpening::Round {
            attempt: self.objections + 1,
            budget_remaining: self.budget.saturating_sub(self.objections),
        }
    }

    /// The round opened by [`StopGate::open`] is decided with `texts` (hooks' objections in
    /// registration order): the reply guard's reminder goes last, and any text costs one
    /// budget unit (SPEC H5, G1); the objection is logged.
    pub(crate) fn conclude(
        &mut self,
        mut texts: Vec<(String, String)>,
        session: SessionId,
        out: &mut Outbox,
    ) -> GateVerdict {
        let reminded = std::mem::take(&mut self.reminder_due);
        if reminded {
            texts.push((REPLY_GUARD_SERVER.to_string(), REPLY_REMINDER.to_string()));
        }
        if texts.is_empty() {
            return GateVerdict::EndTurn;
        }
        self.objections += 1;
        if reminded {
            self.reminders += 1;
        }
        out.log(
            LogLevel::Info,
            format!(
                "hook: _Stop objected in session {session} ({} text(s)); objection {}/{}",
                texts.len(),
                self.objections,
                self.budget
            ),
        );
        GateVerdict::Objected(texts)
    }

    /// The `_meta.buzz` of the prompt response (SPEC H9): `rounds` LLM rounds, objections
    /// honoured, the budget and whether it ran out.
    pub(crate) fn meta(&self, rounds: u32) -> Value {
        json!({"buzz": {
            "rounds": rounds,
            "stopObjections": self.objections,
            "stopBudget": self.budget,
            "stopBudgetExhausted": self.exhausted
        }})
    }
}

/// The reply guard's reminder text (SPEC G1).
pub(crate) const REPLY_REMINDER: &str = "Your text reply is not seen by anyone: nobody reads this transcript. \
If a reply is expected, post it with `buzz messages send` (or the configured reply tool) before ending; \
if silence is right, end your turn again without posting.";
/// Server name used for the reply guard's objection (SPEC G1).
pub(crate) const REPLY_GUARD_SERVER: &str = "buzz-agent";
/// Reply-guard reminders per prompt at most (SPEC G1).
pub(crate) const MAX_REMINDERS: u32 = 2;

/// Whether a dispatched call to a (non-hook) tool is a posting attempt (SPEC G2): a `shell`
/// call whose `command` sends a message or a reaction, or a call to a tool named in
/// `BUZZ_AGENT_REPLY_TOOLS` (by its qualified name `server__tool`).
pub(crate) fn counts_as_posting(
    bare: &str,
    args: &Value,
    qualified: &str,
    reply_tools: &[String],
) -> bool {
    (bare == "shell"
        && args
            .get("command")
            .and_then(Value::as_str)
            .is_some_and(|c| c.contains("messages send") || c.contains("reactions add")))
        || reply_tools.iter().any(|t| t == qualified)
}

/// The model-visible injection pair of one objection (SPEC H6): an assistant message with one
/// tool call `<server>__<hook>` (id `buzz_hook_<hook>_<server>_<n>`, arguments `{}`) and its
/// tool result, the compact JSON `{"hook","server","text"}`. Example: (`_Stop`, `testguard`,
/// `2 tests fail`, 7) → a call `testguard___Stop` with id `buzz_hook__Stop_testguard_7`.
#[must_use]
pub fn injection_pair(point: HookPoint, server: &str, text: &str, n: u64) -> [Message; 2] {
    let hook = point.tool_name();
    let id = format!("buzz_hook_{hook}_{server}_{n}");
    let name = format!("{server}__{hook}");
    let body = json!({"hook": hook, "server": server, "text": text}).to_string();
    [
        Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: vec![ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: "{}".into(),
            }],
        },
        Message::ToolResult {
            call_id: id,
            name,
            text: body,
            is_error: false,
        },
    ]
}

/// Append the injections of one decided round to the history (SPEC H6, L10, case C61): for
/// each `(server, text)`, in order, the pair of [`injection_pair`] numbered with the session's
/// next tool-call number. The first call **joins the model's answer** when that answer ends the history (an
/// assistant message without tool calls): one assistant message then carries the answer's text,
/// its reasoning state and the synthetic call, so no provider sees two assistant messages in a
/// row and a thinking block still opens the turn (Anthropic: `[thinking, text, tool_use]`).
/// Every later text is a pair of its own.
pub(crate) fn append_injections(
    transcript: &mut Transcript,
    point: HookPoint,
    texts: &[(String, String)],
) {
    for (k, (server, text)) in texts.iter().enumerate() {
        let n = transcript.next_call_no();
        let [call, result] = injection_pair(point, server, text, n);
        let joins = k == 0
            && matches!(transcript.messages().last(), Some(Message::Assistant { tool_calls, .. }) if tool_calls.is_empty());
        if joins
            && let Message::Assistant { tool_calls, .. } = &call
            && let Some(Message::Assistant {
                tool_calls: answer, ..
            }) = transcript.last_mut()
        {
            answer.extend(tool_calls.iter().cloned());
        } else {
            transcript.push(call);
        }
        transcript.push(result);
    }
}

/// The user line that closes the `_SessionStart` injections (SPEC H10, L10). A request may not
/// end in the results of a tool call the model did not make when it thinks (Anthropic: a tool
/// loop must open with a thinking block), so the model's turn starts after this line.
pub(crate) const SESSION_START_FOLLOW_UP: &str = "The tool results above are session context from the session-start hooks; now answer the request before them.";

/// Appends a session's `_SessionStart` texts right after its first prompt (SPEC H10, H6,
/// L10): one injection pair per text ([`injection_pair`], in registration order), then
/// [`SESSION_START_FOLLOW_UP`] as a user message. Nothing for no texts.
pub(crate) fn append_session_start(transcript: &mut Transcript, texts: &[(String, String)]) {
    if texts.is_empty() {
        return;
    }
    append_injections(transcript, HookPoint::SessionStart, texts);
    transcript.push(Message::User {
        text: SESSION_START_FOLLOW_UP.to_string(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cx::rig::Parts;
    use crate::io::Action;

    const SID: SessionId = SessionId(1);

    fn out() -> Outbox {
        Outbox::new(LogLevel::Debug, MonoTime::ZERO)
    }

    fn objection(server: &str, text: &str) -> (String, String) {
        (server.to_string(), text.to_string())
    }

    #[test]
    fn h2_c56_servers_with_hooks_the_allowlist_does_not_name_get_one_sentence_each() {
        let mut parts = Parts::for_tests();
        let guard = parts.ready_server(
            SID,
            "TestGuard",
            &["_Stop", "_PostCompact", "_Other", "echo"],
        );
        let plain = parts.ready_server(SID, "fs", &["echo", "_Other"]);
        let todo = parts.ready_server(SID, "todo", &["_SessionEnd", "todo_add"]);
        let slots = [guard, plain, todo];
        let names = HookAllowlist::Names(vec!["testguard".into(), "other".into()]);
        assert_eq!(
            hooks_off(&parts.servers, &slots, &names),
            [
                "MCP server 'TestGuard' has hooks (_Stop, _PostCompact), but MCP_HOOK_SERVERS (testguard,other) does not name it: they will not run.",
                "MCP server 'todo' has hooks (_SessionEnd), but MCP_HOOK_SERVERS (testguard,other) does not name it: they will not run.",
            ],
            "registration order; `_Other` is no hook point; a server without hook points says nothing"
        );
        assert_eq!(
            hooks_off(&parts.servers, &[todo], &HookAllowlist::Off),
            [
                "MCP server 'todo' has hooks (_SessionEnd), but MCP_HOOK_SERVERS is not set: they will not run."
            ]
        );
        let todo_named = HookAllowlist::Names(vec!["todo".into()]);
        assert_eq!(
            hooks_off(&parts.servers, &[todo], &todo_named),
            Vec::<String>::new()
        );
        assert!(hooks_off(&parts.servers, &slots, &HookAllowlist::All).is_empty());
    }

    #[test]
    fn i1_a_gate_honours_at_most_budget_objections_then_ends_exhausted() {
        let mut out = out();
        let mut gate = StopGate::new(2, false);
        for k in 1..=2u32 {
            assert_eq!(
                gate.open(SID, &mut out),
                GateOpening::Round {
                    attempt: k,
                    budget_remaining: 3 - k
                }
            );
            assert!(matches!(
                gate.conclude(vec![objection("guard", "no")], SID, &mut out),
                GateVerdict::Objected(_)
            ));
            assert!(gate.objections <= gate.budget, "I1");
        }
        assert_eq!(gate.open(SID, &mut out), GateOpening::EndTurn);
        assert_eq!(
            gate.meta(3)["buzz"],
            json!({"rounds": 3, "stopObjections": 2, "stopBudget": 2, "stopBudgetExhausted": true})
        );
        let logs: Vec<String> = std::iter::from_fn(|| out.pop())
            .filter_map(|a| {
                if let Action::Log(r) = a {
                    Some(r.message)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            logs.last().map(String::as_str),
            Some("hook: _Stop budget of 2 exhausted in session sess_1; ending the turn")
        );
    }

    #[test]
    fn h5_no_objection_ends_the_turn_and_costs_nothing_and_budget_zero_runs_no_round() {
        let mut out = out();
        let mut gate = StopGate::new(3, false);
        assert!(matches!(
            gate.open(SID, &mut out),
            GateOpening::Round { .. }
        ));
        assert_eq!(
            gate.conclude(Vec::new(), SID, &mut out),
            GateVerdict::EndTurn
        );
        assert_eq!(gate.meta(1)["buzz"]["stopObjections"], 0);
        let mut off = StopGate::new(0, true);
        assert_eq!(off.open(SID, &mut out), GateOpening::EndTurn);
        assert_eq!(off.meta(1)["buzz"]["stopBudgetExhausted"], false);
    }

    #[test]
    fn g1_the_reminder_goes_last_in_the_same_unit_at_most_twice_and_never_after_a_post() {
        let mut out = out();
        let mut gate = StopGate::new(5, true);
        gate.open(SID, &mut out);
        let GateVerdict::Objected(texts) =
            gate.conclude(vec![objection("hook1", "red")], SID, &mut out)
        else {
            panic!("objected");
        };
        assert_eq!(
            texts,
            vec![
                objection("hook1", "red"),
                objection(REPLY_GUARD_SERVER, REPLY_REMINDER)
            ],
            "hooks first, the reminder last, one unit"
        );
        assert_eq!(gate.meta(1)["buzz"]["stopObjections"], 1);
        gate.open(SID, &mut out);
        assert!(matches!(
            gate.conclude(Vec::new(), SID, &mut out),
            GateVerdict::Objected(_)
        ));
        gate.open(SID, &mut out);
        assert_eq!(
            gate.conclude(Vec::new(), SID, &mut out),
            GateVerdict::EndTurn,
            "at most two reminders"
        );
        let mut posted = StopGate::new(5, true);
        posted.mark_posted();
        posted.open(SID, &mut out);
        assert_eq!(
            posted.conclude(Vec::new(), SID, &mut out),
            GateVerdict::EndTurn
        );
    }

    #[test]
    fn i4_c40_only_non_blank_content_text_objects() {
        let cap = 1024;
        let text = |t: &str| Ok(json!({"content": [{"type": "text", "text": t}]}));
        assert_eq!(
            classify_reply(text("run the tests"), cap),
            HookOutcome::Text("run the tests".into())
        );
        assert_eq!(classify_reply(text("  \n"), cap), HookOutcome::Empty);
        assert_eq!(
            classify_reply(
                Ok(json!({"content": [], "structuredContent": {"result": null}})),
                cap
            ),
            HookOutcome::Empty,
            "C40: FastMCP's None"
        );
        assert_eq!(
            classify_reply(
                Ok(json!({"content": [{"type": "text", "text": "boom"}], "isError": true})),
                cap
            ),
            HookOutcome::Error("isError: boom".into())
        );
        assert_eq!(
            classify_reply(Err(RpcError::new(-32601, "no such tool")), cap),
            HookOutcome::Error("-32601 no such tool".into())
        );
    }

    #[test]
    fn h2_h3_a_round_calls_every_hook_at_once_and_decides_in_registration_order() {
        let mut parts = Parts::for_tests();
        let sess = parts.session_with(
            SID,
            &[
                ("a", &["_Stop"]),
                ("plain", &["echo"]),
                ("b", &["_Stop", "_PostCompact"]),
            ],
        );
        let mut round = HookRound::start(
            HookPoint::Stop,
            &sess,
            HookMeta::turn(2, 1),
            &mut parts.mcp(),
        );
        let calls = Parts::mcp_lines(&parts.drain());
        assert_eq!(calls.len(), 2, "only the servers exposing _Stop");
        assert_eq!(
            calls[0]["params"]["_meta"]["buzz/hook"],
            json!({"point": "_Stop", "sessionId": "sess_1", "attempt": 2, "budgetRemaining": 1})
        );
        // `hooks check` sends a first `_Stop` call with the same code (attempt 1).
        let mut first = first_call_params(HookPoint::Stop, "sess_1", 1);
        first["_meta"]["buzz/hook"]["attempt"] = json!(2);
        assert_eq!(calls[0]["params"], first);
        assert!(!round.is_decided());
        parts.at(40);
        assert!(!round.on_outcome(1, HookOutcome::Text("b objects".into()), &mut parts.out));
        assert!(round.on_outcome(0, HookOutcome::Text("a objects".into()), &mut parts.out));
        assert_eq!(
            round.texts(),
            vec![objection("a", "a objects"), objection("b", "b objects")],
            "I3: registration order, not arrival order"
        );
        assert!(
            !round.on_outcome(0, HookOutcome::Empty, &mut parts.out),
            "I6: a decided call keeps its outcome"
        );
        assert_eq!(round.texts().len(), 2);
        let logs = Parts::logs(&parts.drain());
        assert_eq!(
            logs,
            vec![
                "hook: point=_Stop server=b outcome=objection latency_ms=40",
                "hook: point=_Stop server=a outcome=objection latency_ms=40"
            ]
        );
    }

    #[test]
    fn h3_texts_by_name_carry_the_client_s_server_name_where_texts_carry_the_prefix() {
        let mut parts = Parts::for_tests();
        let sess = parts.session_with(SID, &[("My Guard", &["_Stop"]), ("b", &["_Stop"])]);
        let mut round = HookRound::start(
            HookPoint::Stop,
            &sess,
            HookMeta::turn(1, 1),
            &mut parts.mcp(),
        );
        round.on_outcome(0, HookOutcome::Text("no".into()), &mut parts.out);
        round.on_outcome(1, HookOutcome::Text("wait".into()), &mut parts.out);
        let prefix = crate::tools::server_prefix("My Guard");
        assert_ne!(prefix, "My Guard");
        assert_eq!(
            round.texts(),
            vec![objection(&prefix, "no"), objection("b", "wait")]
        );
        assert_eq!(
            round.texts_by_name(),
            vec![objection("My Guard", "no"), objection("b", "wait")]
        );
    }

    #[test]
    fn g2_a_call_to_a_configured_reply_tool_counts_as_posting_and_no_other() {
        let reply_tools = vec!["chat__post".to_string()];
        let args = json!({});
        assert!(counts_as_posting("post", &args, "chat__post", &reply_tools));
        assert!(!counts_as_posting(
            "read",
            &args,
            "chat__read",
            &reply_tools
        ));
        assert!(!counts_as_posting("post", &args, "chat__post", &[]));
        let send = json!({"command": "buzz reactions add +1"});
        assert!(counts_as_posting("shell", &send, "fs__shell", &[]));
        assert!(
            !counts_as_posting("run", &send, "fs__run", &[]),
            "only `shell`"
        );
    }

    #[test]
    fn i4_a_round_without_a_live_or_allowed_target_is_decided_at_once_and_objects_to_nothing() {
        let mut parts = Parts::for_tests();
        let sess = parts.session_with(SID, &[("guard", &["_Stop"])]);
        let decided_at_once = |parts: &mut Parts| {
            let round = HookRound::start(
                HookPoint::Stop,
                &sess,
                HookMeta::turn(1, 3),
                &mut parts.mcp(),
            );
            round.is_decided() && round.texts().is_empty()
        };
        parts.cfg.hook_servers = crate::config::HookAllowlist::Off;
        assert!(decided_at_once(&mut parts), "H2: not allowlisted");
        parts.cfg.hook_servers = crate::config::HookAllowlist::All;
        let slot = sess.servers[0];
        parts
            .servers
            .kill(slot, "test kill", &mut parts.out, &mut parts.timers);
        parts.drain();
        assert!(decided_at_once(&mut parts), "a dead server counts as dead");
        assert_eq!(
            Parts::logs(&parts.drain()),
            vec!["hook: point=_Stop server=guard outcome=dead latency_ms=0"]
        );
    }

    #[test]
    fn c61_the_first_injection_joins_the_answer_that_ends_the_history() {
        let mut transcript = Transcript::default();
        transcript.extend(vec![
            Message::User {
                text: "fix it".into(),
            },
            Message::Assistant {
                text: "All done.".into(),
                thinking: String::new(),
                reasoning: vec![],
                tool_calls: vec![],
            },
        ]);
        append_injections(
            &mut transcript,
            HookPoint::Stop,
            &[("guard".into(), "tests fail".into())],
        );
        let history = transcript.messages();
        assert_eq!(history.len(), 3);
        let Message::Assistant {
            text, tool_calls, ..
        } = &history[1]
        else {
            panic!("the answer stays second");
        };
        assert_eq!(
            (text.as_str(), tool_calls[0].name.as_str()),
            ("All done.", "guard___Stop")
        );
        assert!(
            matches!(&history[2], Message::ToolResult { call_id, .. } if *call_id == tool_calls[0].id)
        );
        assert_eq!(transcript.next_call_no(), 2, "the injection took number 1");
    }

    #[test]
    fn c61_an_answer_that_made_tool_calls_is_not_joined() {
        let mut transcript = Transcript::default();
        let earlier = ToolCall {
            id: "tc_1".into(),
            name: "fs__read".into(),
            arguments: "{}".into(),
        };
        transcript.extend(vec![
            Message::User {
                text: "fix it".into(),
            },
            Message::Assistant {
                text: String::new(),
                thinking: String::new(),
                reasoning: vec![],
                tool_calls: vec![earlier.clone()],
            },
        ]);
        append_injections(
            &mut transcript,
            HookPoint::Stop,
            &[("guard".into(), "tests fail".into())],
        );
        let history = transcript.messages();
        assert_eq!(history.len(), 4, "a pair of its own: {history:?}");
        assert!(
            matches!(&history[1], Message::Assistant { tool_calls, .. } if *tool_calls == [earlier]),
            "the earlier calls stay alone"
        );
        assert!(
            matches!(&history[2], Message::Assistant { tool_calls, .. } if tool_calls[0].name == "guard___Stop")
        );
    }

    #[test]
    fn h6_an_injection_pair_is_a_synthetic_call_and_its_json_result() {
        let [call, result] = injection_pair(HookPoint::Stop, "testguard", "2 tests \"fail\"", 7);
        let Message::Assistant { tool_calls, .. } = call else {
            panic!("the call comes first");
        };
        assert_eq!(tool_calls[0].name, "testguard___Stop");
        assert_eq!(tool_calls[0].id, "buzz_hook__Stop_testguard_7");
        assert_eq!(tool_calls[0].arguments, "{}");
        let Message::ToolResult { text, call_id, .. } = result else {
            panic!("then its result");
        };
        assert_eq!(call_id, "buzz_hook__Stop_testguard_7");
        assert_eq!(
            text,
            r#"{"hook":"_Stop","server":"testguard","text":"2 tests \"fail\""}"#
        );
    }

    #[test]
    fn h10_h11_every_point_has_its_exact_tool_name_and_effect() {
        let names: Vec<&str> = HookPoint::ALL.iter().map(|p| p.tool_name()).collect();
        assert_eq!(
            names,
            ["_SessionStart", "_Stop", "_PostCompact", "_SessionEnd"]
        );
        for p in HookPoint::ALL {
            assert_eq!(HookPoint::from_tool_name(p.tool_name()), Some(p));
        }
        assert_eq!(
            HookPoint::from_tool_name("_sessionstart"),
            None,
            "names are exact"
        );
        let effects: Vec<&str> = HookPoint::ALL.iter().map(|p| p.effect()).collect();
        assert_eq!(effects, ["inject", "object", "inject", "log"]);
    }

    #[test]
    fn h10_l10_session_start_texts_go_after_the_prompt_then_a_user_line_closes_them() {
        let mut transcript = Transcript::default();
        transcript.push(Message::User {
            text: "fix the bug".into(),
        });
        append_session_start(&mut transcript, &[]);
        assert_eq!(transcript.messages().len(), 1, "no texts: nothing");
        append_session_start(
            &mut transcript,
            &[
                ("todo".into(), "open: write docs".into()),
                ("mem".into(), "you prefer tabs".into()),
            ],
        );
        let kinds: Vec<String> = transcript
            .messages()
            .iter()
            .map(|m| match m {
                Message::User { text } => format!("user:{text}"),
                Message::Assistant { tool_calls, .. } => format!("call:{}", tool_calls[0].name),
                Message::ToolResult { text, .. } => format!("result:{text}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "user:fix the bug".to_string(),
                "call:todo___SessionStart".into(),
                r#"result:{"hook":"_SessionStart","server":"todo","text":"open: write docs"}"#
                    .into(),
                "call:mem___SessionStart".into(),
                r#"result:{"hook":"_SessionStart","server":"mem","text":"you prefer tabs"}"#.into(),
                format!("user:{SESSION_START_FOLLOW_UP}"),
            ]
        );
    }
}
