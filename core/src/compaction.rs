//! Context compaction (SPEC K1, H7, L5 context-too-long): the gate at the top of every round,
//! the summary call, the new history with `_PostCompact` injections, and the truncation
//! fallback. History validity (L4 / DESIGN I9) holds after every path: whole units only.

use crate::agent::Agent;
use crate::config::LogLevel;
use crate::hooks::{HookPoint, HookRound, injection_pair};
use crate::llm::{History, LlmResponse, Message};
use crate::turn::{CallPurpose, Phase};

/// System prompt of the summary call (SPEC K1).
pub const SUMMARY_SYSTEM_PROMPT: &str = "You compact the working context of a software agent. \
Write a faithful, self-contained summary that lets the agent continue the task without the original transcript.";

/// The instruction of the summary call (SPEC K1: task, progress, decisions, remaining work,
/// next step).
pub const SUMMARY_INSTRUCTION: &str = "Summarize the conversation below for handoff to a fresh context. \
Use these sections: 1. Original task (the user's request, verbatim where it matters). \
2. Progress so far (what was done, with concrete results, file names, commands, values). \
3. Decisions and constraints (and why). 4. Remaining work. 5. Next step. \
Be concise but do not drop facts needed to continue.";

/// Header of the summary user message in the new history.
pub const SUMMARY_HEADER: &str = "[Context summary: earlier conversation was compacted]\n";

/// Per tool-result text rendered into the summary input, in bytes.
const SUMMARY_RESULT_CAP: usize = 2000;

/// Projected context size in tokens: last reported input tokens + bytes appended since
/// (1 byte ≈ 1 token, SPEC K1).
#[must_use]
pub fn projected_tokens(history: &[Message], last_input_tokens: u64, usage_mark: usize) -> u64 {
    let mark = usage_mark.min(history.len());
    let appended: usize = history[mark..].iter().map(Message::content_bytes).sum();
    last_input_tokens.saturating_add(u64::try_from(appended).unwrap_or(u64::MAX))
}

/// The compaction threshold: 90 % of the context window (SPEC K1), in tokens.
#[must_use]
pub fn threshold(max_context_tokens: u64) -> u64 {
    max_context_tokens / 10 * 9 + (max_context_tokens % 10) * 9 / 10
}

/// Split history into units that must be kept or dropped whole: a user message alone, or an
/// assistant message with the tool results that follow it (never split a call from its result).
#[must_use]
pub fn units(history: &[Message]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < history.len() {
        let start = i;
        i += 1;
        if matches!(history[start], Message::Assistant { .. }) {
            while i < history.len() && matches!(history[i], Message::ToolResult { .. }) {
                i += 1;
            }
        }
        out.push((start, i));
    }
    out
}

/// Drop the oldest whole units until the history fits `budget` bytes (SPEC K1 fallback). The
/// unit holding the live prompt (`live` = its index) is never dropped, and nor is the last
/// unit, nor the trailing run of hook injection pairs (the round just decided, SPEC H6); units
/// before the live prompt go first, then the oldest after it. Returns the new
/// history and the new index of the live prompt.
#[must_use]
pub fn truncate(history: Vec<Message>, live: usize, budget: u64) -> (Vec<Message>, usize, usize) {
    let us = units(&history);
    let total: u64 = history.iter().map(|m| m.content_bytes() as u64).sum();
    let size = |u: &(usize, usize)| -> u64 {
        history[u.0..u.1]
            .iter()
            .map(|m| m.content_bytes() as u64)
            .sum()
    };
    let live_unit = us
        .iter()
        .position(|u| u.0 <= live && live < u.1)
        .unwrap_or(0);
    let mut drop = vec![false; us.len()];
    let mut cur = total;
    // H6: the injection pairs at the end (the hook round just decided) are never dropped.
    // A hook call may have joined the model's answer (L10): a unit whose calls are all hook
    // calls is an injection.
    let is_injection = |u: &(usize, usize)| {
        matches!(&history[u.0], Message::Assistant { tool_calls, .. }
            if !tool_calls.is_empty() && tool_calls.iter().all(|c| c.id.starts_with("buzz_hook_")))
    };
    let mut keep_from = us.len();
    while keep_from > live_unit + 1 && is_injection(&us[keep_from - 1]) {
        keep_from -= 1;
    }
    if keep_from == us.len() {
        keep_from = us.len().saturating_sub(1); // no trailing injections: keep the last unit
    }
    let order = (0..live_unit).chain(live_unit + 1..keep_from);
    for k in order {
        if cur <= budget {
            break;
        }
        drop[k] = true;
        cur = cur.saturating_sub(size(&us[k]));
    }
    let dropped = drop.iter().filter(|d| **d).count();
    let mut out = Vec::with_capacity(history.len());
    let mut new_live = 0;
    let mut iter = history.into_iter().enumerate();
    for (k, u) in us.iter().enumerate() {
        for _ in u.0..u.1 {
            if let Some((idx, m)) = iter.next()
                && !drop[k]
            {
                if idx == live {
                    new_live = out.len();
                }
                out.push(m);
            }
        }
    }
    (out, new_live, dropped)
}

/// Render history for the summary call, newest first within `budget` bytes, then put back in
/// chronological order (SPEC K1: bounded input built newest-first).
#[must_use]
pub fn render_for_summary(history: &[Message], budget: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut used = 0usize;
    for m in history.iter().rev() {
        let piece = match m {
            Message::User { text } => format!("USER:\n{text}\n"),
            Message::Assistant {
                text, tool_calls, ..
            } => {
                let mut s = String::new();
                if !text.is_empty() {
                    s.push_str(&format!("ASSISTANT:\n{text}\n"));
                }
                for c in tool_calls {
                    s.push_str(&format!(
                        "TOOL CALL {}({})\n",
                        c.name,
                        crate::provider::cut(&c.arguments, SUMMARY_RESULT_CAP)
                    ));
                }
                s
            }
            Message::ToolResult {
                name,
                text,
                is_error,
                ..
            } => {
                let tag = if *is_error {
                    "TOOL ERROR"
                } else {
                    "TOOL RESULT"
                };
                format!(
                    "{tag} {name}:\n{}\n",
                    crate::tools::elide_middle(text.clone(), SUMMARY_RESULT_CAP)
                )
            }
        };
        if used + piece.len() > budget {
            parts.push("[… older conversation omitted …]\n".into());
            break;
        }
        used += piece.len();
        parts.push(piece);
    }
    parts.reverse();
    parts.concat()
}

impl Agent {
    /// Whether the gate must compact before the next LLM call (SPEC K1).
    pub(crate) fn compaction_needed(&self, sid: &str) -> bool {
        let Some(sess) = self.sessions.get(sid) else {
            return false;
        };
        projected_tokens(&sess.history, sess.last_input_tokens, sess.usage_mark)
            >= threshold(self.cfg.max_context_tokens)
    }

    /// Compact now: a summary call while handoffs remain, else the truncation fallback.
    pub(crate) fn begin_compaction(&mut self, sid: &str, why: &str) {
        let max = self.cfg.max_handoffs;
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return;
        };
        turn.compacted_round = turn.rounds + 1;
        let handoffs = turn.handoffs;
        if handoffs < max {
            self.log(
                LogLevel::Info,
                format!(
                    "session {sid}: compacting context ({why}); handoff {}/{max}",
                    handoffs + 1
                ),
            );
            self.start_llm_attempt(sid, 1, CallPurpose::Summary);
        } else {
            self.log(
                LogLevel::Warn,
                format!(
                    "session {sid}: BUZZ_AGENT_MAX_HANDOFFS={max} spent; truncating history ({why})"
                ),
            );
            self.truncate_session(sid);
        }
    }

    /// L5: a context-too-long answer → compact, then one retry of the round. False when the
    /// retry was already spent (the error then fails the prompt).
    pub(crate) fn try_reactive_compaction(&mut self, sid: &str) -> bool {
        let Some(turn) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) else {
            return false;
        };
        if turn.reactive_tried || turn.cancelled {
            return false;
        }
        turn.reactive_tried = true;
        turn.phase = Phase::Ready;
        self.begin_compaction(sid, "the provider said the context is too long");
        true
    }

    /// The messages of the summary call: one user message with the instruction and the
    /// bounded transcript.
    pub(crate) fn summary_messages(&self, sid: &str) -> Vec<Message> {
        let Some(sess) = self.sessions.get(sid) else {
            return Vec::new();
        };
        let window = self
            .cfg
            .max_context_tokens
            .saturating_sub(u64::from(self.cfg.max_output_tokens));
        let budget = usize::try_from(window / 4 * 3)
            .unwrap_or(usize::MAX)
            .max(1024);
        // The live prompt always goes in whole: the newest-first cut may not reach it in a long
        // turn, and the summary must name the original task.
        let live = sess
            .turn
            .as_ref()
            .map(|t| t.prompt_text.as_str())
            .unwrap_or("");
        let live = crate::provider::cut(live, budget / 4);
        let transcript = render_for_summary(&sess.history, budget.saturating_sub(live.len()));
        vec![Message::User {
            text: format!(
                "{SUMMARY_INSTRUCTION}\n\n<current_request>\n{live}\n</current_request>\n\n<conversation>\n{transcript}</conversation>"
            ),
        }]
    }

    /// The summary arrived: new history = [summary, `_PostCompact` injections, live prompt].
    pub(crate) fn on_summary(&mut self, sid: &str, resp: LlmResponse) {
        let summary = resp.text.trim().to_string();
        if summary.is_empty() {
            return self.summary_failed(sid, "the summary was empty");
        }
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        turn.handoffs += 1;
        turn.phase = Phase::Ready;
        let before = sess.history.len();
        sess.history = History::from(vec![
            Message::User {
                text: format!("{SUMMARY_HEADER}{summary}"),
            },
            Message::User {
                text: turn.prompt_text.clone(),
            },
        ]);
        sess.last_input_tokens = 0;
        sess.usage_mark = 0;
        let handoffs = turn.handoffs;
        self.log(
            LogLevel::Info,
            format!(
                "session {sid}: context compacted ({before} messages → summary), handoff {handoffs}"
            ),
        );
        // H7: `_PostCompact` before the next LLM request.
        let round = self.start_hook_round(sid, HookPoint::PostCompact, handoffs, 0, None);
        if round.is_decided() {
            self.conclude_post_compact(sid, round);
        } else if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
            t.phase = Phase::Gate(round);
        }
    }

    /// The summary call failed: fall back to truncation and go on (SPEC K1).
    pub(crate) fn summary_failed(&mut self, sid: &str, why: &str) {
        self.log(
            LogLevel::Warn,
            format!("session {sid}: compaction summary failed ({why}); truncating history instead"),
        );
        if let Some(t) = self.sessions.get_mut(sid).and_then(|s| s.turn.as_mut()) {
            t.phase = Phase::Ready;
        }
        self.truncate_session(sid);
    }

    fn truncate_session(&mut self, sid: &str) {
        let budget = threshold(self.cfg.max_context_tokens);
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let Some(turn) = sess.turn.as_mut() else {
            return;
        };
        turn.phase = Phase::Ready;
        // The live prompt: the last user message equal to the prompt text (it is never dropped).
        let live = sess
            .history
            .iter()
            .rposition(|m| matches!(m, Message::User { text } if *text == turn.prompt_text))
            .unwrap_or(0);
        let history = sess.history.take();
        let (new, _, dropped) = truncate(history, live, budget);
        sess.history = History::from(new);
        sess.last_input_tokens = 0;
        sess.usage_mark = 0;
        self.log(
            LogLevel::Info,
            format!("session {sid}: dropped {dropped} oldest history unit(s) to fit the context"),
        );
    }

    /// `_PostCompact` decided: inject each non-empty result right after the summary (H7).
    pub(crate) fn conclude_post_compact(&mut self, sid: &str, round: HookRound) {
        let texts = round.objections();
        let Some(sess) = self.sessions.get_mut(sid) else {
            return;
        };
        let mut injected = Vec::new();
        for (server, text) in &texts {
            sess.seq += 1;
            injected.extend(injection_pair(
                HookPoint::PostCompact,
                server,
                text,
                sess.seq,
            ));
        }
        let at = 1.min(sess.history.len());
        sess.history.rewrite().splice(at..at, injected);
        let cancelled = sess.turn.as_ref().is_some_and(|t| t.cancelled);
        if let Some(t) = sess.turn.as_mut() {
            t.phase = Phase::Ready;
        }
        if !texts.is_empty() {
            self.log(
                LogLevel::Info,
                format!(
                    "hook: _PostCompact injected {} text(s) in session {sid}",
                    texts.len()
                ),
            );
        }
        if cancelled {
            self.finish_turn(sid, "cancelled");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn user(t: &str) -> Message {
        Message::User { text: t.into() }
    }
    fn call(id: &str, args_len: usize) -> Message {
        Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "s__t".into(),
                arguments: "x".repeat(args_len),
            }],
        }
    }
    fn result(id: &str, n: usize) -> Message {
        Message::ToolResult {
            call_id: id.into(),
            name: "s__t".into(),
            text: "r".repeat(n),
            is_error: false,
        }
    }

    #[test]
    fn projected_tokens_saturate_on_peer_reported_u64_max() {
        let h = vec![Message::User { text: "abc".into() }];
        assert_eq!(projected_tokens(&h, u64::MAX, 0), u64::MAX);
        assert_eq!(projected_tokens(&h, u64::MAX - 1, 0), u64::MAX);
        assert_eq!(projected_tokens(&h, 7, 99), 7);
    }

    #[test]
    fn k1_threshold_is_ninety_percent() {
        assert_eq!(threshold(200_000), 180_000);
        assert_eq!(threshold(1000), 900);
        assert_eq!(threshold(15), 13);
    }

    #[test]
    fn k1_projection_adds_bytes_since_last_usage() {
        let h = vec![user("abcd"), call("1", 10), result("1", 100)];
        assert_eq!(
            projected_tokens(&h, 50, 1),
            50 + (1 + 4 + 10) + (1 + 4 + 100)
        );
    }

    #[test]
    fn k1_truncation_keeps_live_prompt_and_pairs() {
        let h = vec![
            user("old"),
            call("1", 10),
            result("1", 1000),
            user("live"),
            call("2", 10),
            result("2", 1000),
            call("3", 10),
            result("3", 10),
        ];
        let (out, live, dropped) = truncate(h, 3, 100);
        assert!(dropped >= 2);
        assert_eq!(out[live], user("live"));
        // every call still has its result right after it
        for (i, m) in out.iter().enumerate() {
            if let Message::Assistant { tool_calls, .. } = m {
                for c in tool_calls {
                    assert!(
                        matches!(&out[i + 1], Message::ToolResult { call_id, .. } if *call_id == c.id)
                    );
                }
            }
        }
        assert!(matches!(out.last(), Some(Message::ToolResult { call_id, .. }) if call_id == "3"));
    }

    #[test]
    fn k1_summary_input_is_bounded_and_newest_first() {
        let mut h = Vec::new();
        for i in 0..100 {
            h.push(user(&format!("message number {i} {}", "x".repeat(100))));
        }
        let r = render_for_summary(&h, 1000);
        assert!(r.len() <= 1100);
        assert!(r.contains("message number 99"));
        assert!(!r.contains("message number 0 "));
        assert!(r.starts_with("[… older"));
    }
}
