//! MCP lifecycle hooks (SPEC H1–H9, G1–G2): hook rounds (`call_hooks` as pure state), the
//! `_Stop` gate with its per-prompt budget, the reply guard and the model-visible injection.
//!
//! Invariants (DESIGN I1–I5, checked by `core/tests/`):
//! - `objections <= budget` for every prompt (I1); the count resets only at `session/prompt` (I2);
//! - a round started at t is decided by t + hook timeout, results in registration order (I3);
//! - timeout / error / isError / empty / dead never objects (I4);
//! - a server is killed only on its 2nd consecutive hook timeout (I5).

use crate::agent::Agent;
use crate::config::LogLevel;
use crate::ids::{HookRoundId, McpRequestId, ServerSlot, SessionId};
use crate::jsonrpc::RpcError;
use crate::llm::{Message, ToolCall};
use crate::mcp::{HookCallRef, McpRequest, Purpose};
use crate::time::MonoTime;
use serde_json::{Value, json};

/// A hook point (SPEC H1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    /// `_Stop`: the model ended its turn; an objection sends it back (SPEC H5).
    Stop,
    /// `_PostCompact`: the context was just compacted; text is injected after the summary
    /// (SPEC H7).
    PostCompact,
}

impl HookPoint {
    /// The hook tool name, e.g. `_Stop`.
    #[must_use]
    pub fn tool_name(self) -> &'static str {
        match self {
            HookPoint::Stop => "_Stop",
            HookPoint::PostCompact => "_PostCompact",
        }
    }
}

/// How one hook call ended (SPEC H3, H9). Only `Objection` carries text to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HookOutcome {
    /// Non-empty text: an objection (for `_Stop`) or an injection (for `_PostCompact`).
    Objection(String),
    /// Empty after trimming.
    Empty,
    /// JSON-RPC error or `isError` result.
    Error(String),
    /// No reply within `BUZZ_AGENT_HOOK_TIMEOUT_MS`.
    Timeout,
    /// The server was dead or not ready (never called), or died during the call.
    Dead,
}

impl HookOutcome {
    fn label(&self) -> &'static str {
        match self {
            HookOutcome::Objection(_) => "objection",
            HookOutcome::Empty => "empty",
            HookOutcome::Error(_) => "error",
            HookOutcome::Timeout => "timeout",
            HookOutcome::Dead => "dead",
        }
    }
}

/// How a hook's answer counts (SPEC H3, H4, I4): a non-blank text result objects; a blank one
/// is empty; an `isError` result or a JSON-RPC error is an error (fail-open). The text is the
/// tool result as the model would see it, middle-elided over `cap` bytes (SPEC L3).
pub(crate) fn classify_reply(reply: Result<Value, RpcError>, cap: usize) -> HookOutcome {
    match reply {
        Ok(v) => {
            // H3 / C40: content text only; structuredContent never objects.
            let out = crate::tools::hook_answer(&v, cap);
            if out.is_error {
                HookOutcome::Error(format!("isError: {}", out.text))
            } else if out.text.trim().is_empty() {
                HookOutcome::Empty
            } else {
                HookOutcome::Objection(out.text)
            }
        }
        Err(e) => HookOutcome::Error(format!("{} {}", e.code, e.message)),
    }
}

/// One call of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookCall {
    pub server_slot: ServerSlot,
    pub server_name: String,
    pub request: Option<McpRequestId>,
    pub started: MonoTime,
    pub outcome: Option<HookOutcome>,
}

/// A hook round: every target called concurrently, one deadline each (SPEC H3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookRound {
    pub id: HookRoundId,
    pub point: HookPoint,
    pub deadline: MonoTime,
    /// In registration order.
    pub calls: Vec<HookCall>,
    /// The reply guard's reminder decided at gate start (SPEC G1), delivered last.
    pub reminder: Option<String>,
}

impl HookRound {
    /// All calls decided.
    #[must_use]
    pub(crate) fn is_decided(&self) -> bool {
        self.calls.iter().all(|c| c.outcome.is_some())
    }

    /// Objection texts in registration order: `(server name, text)`.
    #[must_use]
    pub(crate) fn objections(&self) -> Vec<(String, String)> {
        self.calls
            .iter()
            .filter_map(|c| match &c.outcome {
                Some(HookOutcome::Objection(t)) => Some((c.server_name.clone(), t.clone())),
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

/// The reply guard's reminder text (SPEC G1).
pub(crate) const REPLY_REMINDER: &str = "Your text reply is not seen by anyone: nobody reads this transcript. \
If a reply is expected, post it with `buzz messages send` (or the configured reply tool) before ending; \
if silence is right, end your turn again without posting.";
/// Server name used for the reply guard's objection (SPEC G1).
pub(crate) const REPLY_GUARD_SERVER: &str = "buzz-agent";
/// Reply-guard reminders per prompt at most (SPEC G1).
pub(crate) const MAX_REMINDERS: u32 = 2;

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

/// Append the injections of one decided round to `history` (SPEC H6, L10, case C61): for each
/// `(server, text)`, in order, the pair of [`injection_pair`] numbered with `*seq` + 1 (`*seq` is
/// advanced). The first call **joins the model's answer** when that answer ends the history (an
/// assistant message without tool calls): one assistant message then carries the answer's text,
/// its reasoning state and the synthetic call, so no provider sees two assistant messages in a
/// row and a thinking block still opens the turn (Anthropic: `[thinking, text, tool_use]`).
/// Every later text is a pair of its own.
pub(crate) fn append_injections(
    history: &mut Vec<Message>,
    point: HookPoint,
    texts: &[(String, String)],
    seq: &mut u64,
) {
    for (k, (server, text)) in texts.iter().enumerate() {
        *seq += 1;
        let [call, result] = injection_pair(point, server, text, *seq);
        let joins = k == 0
            && matches!(history.last(), Some(Message::Assistant { tool_calls, .. }) if tool_calls.is_empty());
        match (call, history.last_mut()) {
            (
                Message::Assistant { tool_calls, .. },
                Some(Message::Assistant {
                    tool_calls: answer, ..
                }),
            ) if joins => {
                answer.extend(tool_calls);
            }
            (call, _) => history.push(call),
        }
        history.push(result);
    }
}

impl Agent {
    /// Start a hook round for `point` over the session's allowlisted servers exposing it
    /// (SPEC H2, H3). Servers that are dead or not ready are not called and count as `dead` at
    /// once, so a round with no live target is decided as soon as it starts.
    pub(crate) fn start_hook_round(
        &mut self,
        session: SessionId,
        point: HookPoint,
        attempt: u32,
        budget_remaining: u32,
        reminder: Option<String>,
    ) -> HookRound {
        let now = self.now();
        let timeout = self.cfg.hook_timeout_ms;
        let round_id = self.ids.next_hook_round();
        let slots: Vec<ServerSlot> = self
            .sessions
            .get(&session)
            .map(|s| s.servers.clone())
            .unwrap_or_default();
        let hook = point.tool_name();
        let targets = self
            .servers
            .hook_targets(&slots, hook, &self.cfg.hook_servers);
        let mut calls = Vec::new();
        for (slot, name, ready) in targets {
            let index = calls.len();
            let mut call = HookCall {
                server_slot: slot,
                server_name: name,
                request: None,
                started: now,
                outcome: None,
            };
            if ready {
                let params = json!({
                    "name": hook,
                    "arguments": {},
                    "_meta": {"buzz/hook": {
                        "point": hook,
                        "sessionId": session.to_string(),
                        "attempt": attempt,
                        "budgetRemaining": budget_remaining
                    }}
                });
                let purpose = Purpose::Hook(HookCallRef {
                    session,
                    round: round_id,
                    index,
                });
                call.request = self.servers.send_request(
                    slot,
                    McpRequest {
                        method: "tools/call",
                        params: &params,
                        purpose,
                        timeout_ms: timeout,
                    },
                    &mut self.out,
                    &mut self.timers,
                );
            }
            if call.request.is_none() {
                call.outcome = Some(HookOutcome::Dead);
            }
            calls.push(call);
        }
        let round = HookRound {
            id: round_id,
            point,
            deadline: now.plus_ms(timeout),
            calls,
            reminder,
        };
        for c in &round.calls {
            if c.outcome == Some(HookOutcome::Dead) {
                self.log_hook_call(point, &c.server_name, &HookOutcome::Dead, 0);
            }
        }
        round
    }

    /// H9: one log line per hook call.
    fn log_hook_call(&mut self, point: HookPoint, server: &str, outcome: &HookOutcome, ms: u64) {
        let level = match outcome {
            HookOutcome::Objection(_) | HookOutcome::Empty => LogLevel::Info,
            HookOutcome::Error(_) | HookOutcome::Timeout | HookOutcome::Dead => LogLevel::Warn,
        };
        let detail = match outcome {
            HookOutcome::Error(e) => format!(" ({e})"),
            HookOutcome::Objection(_)
            | HookOutcome::Empty
            | HookOutcome::Timeout
            | HookOutcome::Dead => String::new(),
        };
        self.log(
            level,
            format!(
                "hook: point={} server={server} outcome={}{detail} latency_ms={ms}",
                point.tool_name(),
                outcome.label()
            ),
        );
    }

    /// A hook call of `round` ended (reply, error, timeout, death).
    pub(crate) fn on_hook_outcome(
        &mut self,
        session: SessionId,
        round: HookRoundId,
        idx: usize,
        outcome: HookOutcome,
    ) {
        let now = self.now();
        let Some(r) = self.hook_round_mut(session, round) else {
            return;
        };
        let Some(call) = r.calls.get_mut(idx) else {
            return;
        };
        if call.outcome.is_some() {
            return;
        }
        let ms = now.ms_since(call.started);
        let (point, name) = (r.point, call.server_name.clone());
        call.outcome = Some(outcome.clone());
        self.log_hook_call(point, &name, &outcome, ms);
        self.maybe_finish_hook_round(session, round);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c61_the_first_injection_joins_the_answer_that_ends_the_history() {
        let mut history = vec![
            Message::User {
                text: "fix it".into(),
            },
            Message::Assistant {
                text: "All done.".into(),
                thinking: String::new(),
                reasoning: vec![],
                tool_calls: vec![],
            },
        ];
        let mut seq = 0;
        append_injections(
            &mut history,
            HookPoint::Stop,
            &[("guard".into(), "tests fail".into())],
            &mut seq,
        );
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
        assert_eq!(seq, 1);
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
}
