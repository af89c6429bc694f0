//! Context compaction (SPEC K1, H7, L5 context-too-long): the [`Compactor`] decides at the top
//! of every round whether the context must shrink and how (a summary call while handoffs
//! remain, else truncation); the pure functions build the summary request, the new history
//! with its `_PostCompact` injections, and the truncated history. The turn runs the summary
//! call and the `_PostCompact` round. History validity (L4 / DESIGN I9) holds after every
//! path: whole units only.

use crate::config::LogLevel;
use crate::hooks::{HookPoint, injection_pair};
use crate::ids::SessionId;
use crate::llm::Message;
use crate::outbox::Outbox;
use crate::transcript::Transcript;

/// System prompt of the summary call (SPEC K1).
pub(crate) const SUMMARY_SYSTEM_PROMPT: &str = "You compact the working context of a software agent. \
Write a faithful, self-contained summary that lets the agent continue the task without the original transcript.";

/// The instruction of the summary call (SPEC K1: task, progress, decisions, remaining work,
/// next step).
pub(crate) const SUMMARY_INSTRUCTION: &str = "Summarize the conversation below for handoff to a fresh context. \
Use these sections: 1. Original task (the user's request, verbatim where it matters). \
2. Progress so far (what was done, with concrete results, file names, commands, values). \
3. Decisions and constraints (and why). 4. Remaining work. 5. Next step. \
Be concise but do not drop facts needed to continue.";

/// Header of the summary user message in the new history.
pub(crate) const SUMMARY_HEADER: &str = "[Context summary: earlier conversation was compacted]\n";

/// Per tool-result text rendered into the summary input, in bytes.
const SUMMARY_RESULT_CAP: usize = 2000;

/// Projected context size in tokens: last reported input tokens + bytes appended since
/// (1 byte ≈ 1 token, SPEC K1).
#[must_use]
pub(crate) fn projected_tokens(
    history: &[Message],
    last_input_tokens: u64,
    usage_mark: usize,
) -> u64 {
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
pub(crate) fn render_for_summary(history: &[Message], budget: usize) -> String {
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
                        crate::text::utf8_prefix(&c.arguments, SUMMARY_RESULT_CAP)
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

/// What compaction does now (SPEC K1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compaction {
    /// Ask the model for a summary (a handoff is left).
    Summarize,
    /// Drop the oldest whole units instead (every handoff is spent).
    Truncate,
}

/// The compaction state of one prompt (SPEC K1, L5): handoffs spent, the round last compacted
/// before, and whether a context-too-long answer already triggered a compaction. The pure
/// functions above do the history work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Compactor {
    /// Summaries this prompt (`BUZZ_AGENT_MAX_HANDOFFS` at most).
    handoffs: u32,
    /// The round before which the context was last compacted (at most once per round).
    compacted_before_round: u32,
    /// Whether a context-too-long answer already triggered reactive compaction (SPEC L5).
    reactive_tried: bool,
}

impl Compactor {
    /// Whether the context must be compacted before round `rounds + 1` (SPEC K1): the
    /// projected size reached 90 % of `max_context_tokens`, and this round was not compacted
    /// already.
    pub(crate) fn needed(
        &self,
        rounds: u32,
        transcript: &Transcript,
        max_context_tokens: u64,
    ) -> bool {
        self.compacted_before_round != rounds + 1
            && projected_tokens(
                transcript.messages(),
                transcript.last_input_tokens,
                transcript.usage_mark,
            ) >= threshold(max_context_tokens)
    }

    /// Compacts before round `rounds + 1`, `why` being the cause for the log: a summary while
    /// handoffs remain (of `max_handoffs`), else the truncation fallback.
    pub(crate) fn begin(
        &mut self,
        rounds: u32,
        max_handoffs: u32,
        session: SessionId,
        why: &str,
        out: &mut Outbox,
    ) -> Compaction {
        self.compacted_before_round = rounds + 1;
        if self.handoffs < max_handoffs {
            out.log(
                LogLevel::Info,
                format!(
                    "session {session}: compacting context ({why}); handoff {}/{max_handoffs}",
                    self.handoffs + 1
                ),
            );
            Compaction::Summarize
        } else {
            out.log(
                LogLevel::Warn,
                format!(
                    "session {session}: BUZZ_AGENT_MAX_HANDOFFS={max_handoffs} spent; truncating history ({why})"
                ),
            );
            Compaction::Truncate
        }
    }

    /// L5: a context-too-long answer compacts once per prompt, then the round is retried.
    /// False when that was already spent, or the turn is cancelled (the error then fails the
    /// prompt).
    pub(crate) fn try_reactive(&mut self, cancelled: bool) -> bool {
        if self.reactive_tried || cancelled {
            return false;
        }
        self.reactive_tried = true;
        true
    }

    /// The summary arrived: the history becomes [summary, live prompt] (SPEC K1). Returns the
    /// handoff number (the `_PostCompact` round's `attempt`), or `None` for an empty summary
    /// (the caller falls back to truncation).
    pub(crate) fn apply_summary(
        &mut self,
        transcript: &mut Transcript,
        summary: &str,
        prompt_text: &str,
        session: SessionId,
        out: &mut Outbox,
    ) -> Option<u32> {
        let summary = summary.trim();
        if summary.is_empty() {
            return None;
        }
        self.handoffs += 1;
        let before = transcript.len();
        transcript.replace(vec![
            Message::User {
                text: format!("{SUMMARY_HEADER}{summary}"),
            },
            Message::User {
                text: prompt_text.to_string(),
            },
        ]);
        out.log(
            LogLevel::Info,
            format!(
                "session {session}: context compacted ({before} messages → summary), handoff {}",
                self.handoffs
            ),
        );
        Some(self.handoffs)
    }
}

/// The messages of the summary call (SPEC K1): one user message with the instruction, the live
/// prompt whole (cut to a quarter of the budget at most) and the bounded transcript, within
/// 3/4 of the context window left after the output cap (at least 1 KiB).
pub(crate) fn summary_messages(
    transcript: &Transcript,
    prompt_text: &str,
    max_context_tokens: u64,
    max_output_tokens: u32,
) -> Vec<Message> {
    let window = max_context_tokens.saturating_sub(u64::from(max_output_tokens));
    let budget = usize::try_from(window / 4 * 3)
        .unwrap_or(usize::MAX)
        .max(1024);
    // The live prompt always goes in whole: the newest-first cut may not reach it in a long
    // turn, and the summary must name the original task.
    let live = crate::text::utf8_prefix(prompt_text, budget / 4);
    let rendered = render_for_summary(transcript.messages(), budget.saturating_sub(live.len()));
    vec![Message::User {
        text: format!(
            "{SUMMARY_INSTRUCTION}\n\n<current_request>\n{live}\n</current_request>\n\n<conversation>\n{rendered}</conversation>"
        ),
    }]
}

/// The summary call failed (SPEC K1): logged; the caller truncates instead.
pub(crate) fn log_summary_failed(session: SessionId, why: &str, out: &mut Outbox) {
    out.log(
        LogLevel::Warn,
        format!("session {session}: compaction summary failed ({why}); truncating history instead"),
    );
}

/// The truncation fallback (SPEC K1): the oldest whole units go until the history fits 90 % of
/// `max_context_tokens`; the live prompt (the last user message equal to `prompt_text`) stays.
pub(crate) fn truncate_transcript(
    transcript: &mut Transcript,
    prompt_text: &str,
    max_context_tokens: u64,
    session: SessionId,
    out: &mut Outbox,
) {
    let budget = threshold(max_context_tokens);
    let live = transcript
        .messages()
        .iter()
        .rposition(|m| matches!(m, Message::User { text } if *text == prompt_text))
        .unwrap_or(0);
    let history = transcript.take_messages();
    let (kept, _, dropped) = truncate(history, live, budget);
    transcript.replace(kept);
    out.log(
        LogLevel::Info,
        format!("session {session}: dropped {dropped} oldest history unit(s) to fit the context"),
    );
}

/// `_PostCompact` decided (SPEC H7): each text is injected right after the summary, in
/// registration order.
pub(crate) fn inject_post_compact(
    transcript: &mut Transcript,
    texts: &[(String, String)],
    session: SessionId,
    out: &mut Outbox,
) {
    let mut injected = Vec::new();
    for (server, text) in texts {
        let n = transcript.next_call_no();
        injected.extend(injection_pair(HookPoint::PostCompact, server, text, n));
    }
    transcript.insert_at(1, injected);
    if !texts.is_empty() {
        out.log(
            LogLevel::Info,
            format!(
                "hook: _PostCompact injected {} text(s) in session {session}",
                texts.len()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogLevel;
    use crate::llm::ToolCall;
    use crate::time::MonoTime;

    const SID: SessionId = SessionId(1);

    fn logs(out: &mut Outbox) -> Vec<String> {
        std::iter::from_fn(|| out.pop())
            .filter_map(|a| {
                if let crate::io::Action::Log(r) = a {
                    Some(r.message)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn k1_the_summary_input_keeps_what_fits_its_budget_newest_first() {
        let history = vec![Message::User { text: "a".into() }];
        assert_eq!(
            render_for_summary(&history, 8),
            "USER:\na\n",
            "8 bytes fit 8"
        );
        assert_eq!(
            render_for_summary(&history, 7),
            "[… older conversation omitted …]\n"
        );
        let call_only = vec![Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: vec![],
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "fs__read".into(),
                arguments: "{}".into(),
            }],
        }];
        assert_eq!(
            render_for_summary(&call_only, 1000),
            "TOOL CALL fs__read({})\n",
            "no empty ASSISTANT part"
        );
    }

    #[test]
    fn k1_the_live_prompt_goes_into_the_summary_request_cut_to_a_quarter_of_its_budget() {
        // A window of 10,000 - 2,000 = 8,000: a budget of 6,000, a quarter of it 1,500.
        let prompt = "x".repeat(2000);
        let t = transcript(vec![Message::User {
            text: prompt.clone(),
        }]);
        let messages = summary_messages(&t, &prompt, 10_000, 2000);
        let [Message::User { text }] = messages.as_slice() else {
            panic!("one user message");
        };
        let live = text
            .split("<current_request>\n")
            .nth(1)
            .and_then(|r| r.split("\n</current_request>").next())
            .expect("the live prompt");
        assert_eq!(live.len(), 1500);
        assert!(
            text.ends_with(&format!("<conversation>\nUSER:\n{prompt}\n</conversation>")),
            "the rest of the budget holds the history"
        );
    }

    #[test]
    fn k1_h7_failures_and_post_compact_injections_are_logged_and_nothing_for_no_texts() {
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        log_summary_failed(SID, "HTTP 500", &mut out);
        assert_eq!(
            logs(&mut out),
            ["session sess_1: compaction summary failed (HTTP 500); truncating history instead"]
        );
        let mut t = transcript(vec![Message::User { text: "s".into() }]);
        inject_post_compact(&mut t, &[], SID, &mut out);
        assert!(logs(&mut out).is_empty());
        inject_post_compact(&mut t, &[("mem".into(), "notes".into())], SID, &mut out);
        assert_eq!(
            logs(&mut out),
            ["hook: _PostCompact injected 1 text(s) in session sess_1"]
        );
        assert_eq!(t.messages().len(), 3);
    }

    #[test]
    fn k1_h6_truncation_keeps_the_live_prompt_the_last_unit_and_the_trailing_injections() {
        let answer = |t: &str| Message::Assistant {
            text: t.repeat(100),
            thinking: String::new(),
            reasoning: vec![],
            tool_calls: vec![],
        };
        let old = user(&"o".repeat(100));
        // No trailing injection: the last unit stays, the others after the live prompt may go.
        let history = vec![old.clone(), user("live"), answer("a"), answer("b")];
        let (kept, live, dropped) = truncate(history, 1, 10);
        assert_eq!(kept, [user("live"), answer("b")]);
        assert_eq!((live, dropped), (0, 2));
        // Trailing injection pairs (the round just decided) all stay.
        let mut history = vec![old, user("live"), answer("a")];
        history.extend(injection_pair(HookPoint::Stop, "g", "one", 1));
        history.extend(injection_pair(HookPoint::Stop, "h", "two", 2));
        let injections = history[3..].to_vec();
        let (kept, live, dropped) = truncate(history, 1, 10);
        assert_eq!(kept[0], user("live"));
        assert_eq!(kept[1..], injections[..]);
        assert_eq!((live, dropped), (0, 2));
    }

    #[test]
    fn k1_a_unit_is_a_user_message_or_an_assistant_message_with_its_tool_results() {
        let user = |t: &str| Message::User { text: t.into() };
        let result = |id: &str| Message::ToolResult {
            call_id: id.into(),
            name: "fs__read".into(),
            text: "ok".into(),
            is_error: false,
        };
        let assistant = Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: vec![],
            tool_calls: vec![],
        };
        let history = vec![
            user("a"),
            assistant.clone(),
            result("1"),
            result("2"),
            user("b"),
            assistant,
            result("3"),
        ];
        assert_eq!(units(&history), [(0, 1), (1, 4), (4, 5), (5, 7)]);
        assert_eq!(units(&[]), []);
    }

    fn transcript(messages: Vec<Message>) -> Transcript {
        let mut t = Transcript::default();
        t.extend(messages);
        t
    }

    #[test]
    fn k1_compaction_is_needed_at_ninety_percent_and_at_most_once_before_a_round() {
        let mut c = Compactor::default();
        let mut t = transcript(vec![user(&"x".repeat(890))]);
        assert!(!c.needed(0, &t, 1000), "890 of 1000 tokens");
        t.record_usage(800);
        t.push(user(&"y".repeat(100)));
        assert!(c.needed(0, &t, 1000), "800 reported + 100 bytes since");
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        c.begin(0, 10, SID, "full", &mut out);
        assert!(!c.needed(0, &t, 1000), "not twice before the same round");
        assert!(c.needed(1, &t, 1000), "the next round may compact again");
    }

    #[test]
    fn k1_summaries_while_handoffs_remain_then_truncation() {
        let mut c = Compactor::default();
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut t = transcript(vec![user("task"), user("more")]);
        assert_eq!(c.begin(0, 1, SID, "full", &mut out), Compaction::Summarize);
        assert_eq!(
            c.apply_summary(&mut t, "  ", "task", SID, &mut out),
            None,
            "an empty summary is no handoff"
        );
        assert_eq!(
            c.apply_summary(&mut t, "did X", "task", SID, &mut out),
            Some(1)
        );
        assert_eq!(
            t.messages(),
            [user(&format!("{SUMMARY_HEADER}did X")), user("task")]
        );
        assert_eq!((t.last_input_tokens, t.usage_mark), (0, 0));
        assert_eq!(c.begin(1, 1, SID, "full", &mut out), Compaction::Truncate);
        let logs: Vec<String> = std::iter::from_fn(|| out.pop())
            .filter_map(|a| {
                if let crate::io::Action::Log(r) = a {
                    Some(r.message)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            logs,
            [
                "session sess_1: compacting context (full); handoff 1/1",
                "session sess_1: context compacted (2 messages → summary), handoff 1",
                "session sess_1: BUZZ_AGENT_MAX_HANDOFFS=1 spent; truncating history (full)"
            ]
        );
    }

    #[test]
    fn l5_a_context_too_long_answer_compacts_once_per_prompt_and_never_when_cancelled() {
        let mut c = Compactor::default();
        assert!(!c.try_reactive(true));
        assert!(c.try_reactive(false));
        assert!(!c.try_reactive(false));
    }

    #[test]
    fn h7_post_compact_texts_go_right_after_the_summary_in_order() {
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut t = transcript(vec![user("summary"), user("task")]);
        inject_post_compact(
            &mut t,
            &[
                ("a".into(), "remember A".into()),
                ("b".into(), "remember B".into()),
            ],
            SID,
            &mut out,
        );
        assert_eq!(t.len(), 6);
        assert_eq!(t.messages()[0], user("summary"));
        assert_eq!(t.messages()[5], user("task"));
        let ids: Vec<String> = t
            .messages()
            .iter()
            .filter_map(|m| {
                if let Message::ToolResult { call_id, .. } = m {
                    Some(call_id.clone())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            ids,
            ["buzz_hook__PostCompact_a_1", "buzz_hook__PostCompact_b_2"]
        );
    }

    #[test]
    fn k1_the_summary_request_names_the_live_prompt_whole() {
        let t = transcript(vec![user("old stuff"), user("the live task")]);
        let msgs = summary_messages(&t, "the live task", 200_000, 32_768);
        let [Message::User { text }] = msgs.as_slice() else {
            panic!("one user message");
        };
        assert!(text.starts_with(SUMMARY_INSTRUCTION));
        assert!(text.contains("<current_request>\nthe live task\n</current_request>"));
        assert!(text.contains("USER:\nold stuff"));
    }

    #[test]
    fn k1_truncation_keeps_the_live_prompt_and_resets_usage() {
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut t = transcript(vec![
            user(&"o".repeat(500)),
            user("live"),
            call("1", 10),
            result("1", 10),
        ]);
        t.record_usage(999);
        truncate_transcript(&mut t, "live", 100, SID, &mut out);
        assert_eq!(t.messages()[0], user("live"));
        assert_eq!((t.last_input_tokens, t.usage_mark), (0, 0));
    }

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
