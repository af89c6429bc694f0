//! Context compaction and output-cap recovery: SPEC K1, H7, L1 (max tokens), L4, L5
//! (context too long) and docs/compaction.md.

use super::setup::Setup;
use super::util::{Scratch, is_cancel_of, log_of};
use crate::fake_llm::{FakeLlm, HistoryItem, RecordedRequest, Reply, Wire, content_text};
use crate::fake_mcp;
use crate::harness::{Ctx, agent_text, assert_tool_updates_well_formed};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// A small context window: compaction at 90 % = 5400 tokens (bytes).
const CONTEXT: &str = "6000";
const OUTPUT: &str = "1000";
/// Bytes of each `big` tool result: two of them pass the 5400 threshold, one does not.
const BIG: u64 = 3000;
/// Header of the summary user message (core/src/compaction.rs `SUMMARY_HEADER`).
const SUMMARY_HEADER: &str = "[Context summary";
const SUMMARY_TEXT: &str = "SUMMARY-OF-WORK: two big results were fetched; next, write the report.";

/// A summary call is the one without tools (SPEC K1).
fn is_summary_request(req: &RecordedRequest) -> bool {
    req.body["tools"].as_array().is_none_or(|t| t.is_empty())
}

/// The non-system messages of a request.
fn convo(req: &RecordedRequest) -> Vec<Value> {
    req.messages()
        .into_iter()
        .filter(|m| m["role"] != "system" && m["role"] != "developer")
        .collect()
}

fn user_texts(req: &RecordedRequest) -> Vec<String> {
    convo(req)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| content_text(&m["content"]))
        .collect()
}

/// Usage as a real provider reports it: the prompt tokens grow with the request (1 byte ≈ 1
/// token, as the agent projects).
fn honest(reply: Reply, req: &RecordedRequest) -> Reply {
    let bytes = req.body.to_string().len() as u64;
    reply.usage(Some((bytes, 10)))
}

/// What the summary call gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SummaryAnswer {
    Text,
    BadRequest,
}

/// A fake LLM for one compaction: a prompt makes the model call `fs__big` until a summary
/// call was seen (at most `max_big` times), then answer `done`; `earlier` (a previous
/// prompt) is answered with text at once.
fn compaction_llm(
    ctx: &Ctx,
    earlier: Option<&'static str>,
    summary: SummaryAnswer,
    max_big: usize,
) -> FakeLlm {
    let seen = Arc::new(AtomicBool::new(false));
    let bigs = Arc::new(AtomicUsize::new(0));
    ctx.fake_llm_with(move |_, req| {
        if is_summary_request(req) {
            seen.store(true, Ordering::SeqCst);
            return match summary {
                SummaryAnswer::Text => Reply::text(SUMMARY_TEXT).usage(Some((900, 30))),
                SummaryAnswer::BadRequest => Reply::status(
                    400,
                    vec![],
                    r#"{"error":{"message":"summary refused by the fake provider","type":"invalid_request_error"}}"#,
                ),
            };
        }
        let last_user = user_texts(req).pop().unwrap_or_default();
        if earlier.is_some_and(|e| last_user == e) {
            return honest(Reply::text("earlier answer"), req);
        }
        if seen.load(Ordering::SeqCst) {
            return honest(Reply::text("done after compaction"), req);
        }
        let n = bigs.fetch_add(1, Ordering::SeqCst) + 1;
        if n > max_big {
            return honest(Reply::text("no compaction happened"), req);
        }
        let id = format!("call_big_{n}");
        honest(
            Reply::tool_calls(vec![(id.as_str(), "fs__big", json!({"bytes": BIG}))]),
            req,
        )
    })
}

/// The index of the (only) summary request; panics when there is none or several.
fn summary_index(reqs: &[RecordedRequest]) -> usize {
    let idx: Vec<usize> = reqs
        .iter()
        .enumerate()
        .filter(|(_, r)| is_summary_request(r))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        idx.len(),
        1,
        "exactly one summary call (no tools) expected; tool lists per request: {:?}",
        reqs.iter()
            .map(RecordedRequest::tool_names)
            .collect::<Vec<_>>()
    );
    idx[0]
}

/// K1: the summary call has no tools and asks for a summary of a bounded transcript that
/// carries each of `must` (the newest history is always in it).
fn assert_summary_request(req: &RecordedRequest, must: &[&str]) {
    let all: String = req
        .messages()
        .iter()
        .map(|m| content_text(&m["content"]))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        all.to_lowercase().contains("summar"),
        "the summary call asks for a summary: {all:.600}"
    );
    for m in must {
        assert!(
            all.contains(m),
            "the summary input carries {m:?}: {all:.3000}"
        );
    }
    assert!(
        all.len() < 6000,
        "the summary input is bounded by the window ({} bytes)",
        all.len()
    );
}

/// The agent's settings for one compaction: a 6000-token window, hooks of `fs` allowed.
fn compaction_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("BUZZ_AGENT_MAX_CONTEXT_TOKENS", CONTEXT),
        ("BUZZ_AGENT_MAX_OUTPUT_TOKENS", OUTPUT),
        ("MCP_HOOK_SERVERS", "fs"),
    ]
}

/// K1/H7/L4: two 3000-byte tool results push the projection over 90 % of a 6000-token window;
/// the agent makes one summary call (no tools, asks for a summary), calls `_PostCompact`, and
/// the NEXT request is exactly [summary user message, `_PostCompact` call + JSON result, live
/// prompt]; the turn ends `end_turn`; every request is provider-valid.
pub fn k1_h7_compaction_summary_then_postcompact_then_live_prompt(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let live = "Fetch two big results, then write the report.";
    let post = "todo: [ ] write the report";
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(compaction_llm(ctx, None, SummaryAnswer::Text, 4))
        .env(&compaction_env())
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_TOOLS", "big"),
                ("FAKE_MCP_POSTCOMPACT_TEXT", post),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )
        .start();
    let r = agent.prompt(&sid, live);
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");

    let reqs = llm.requests();
    for req in &reqs {
        req.assert_tool_calls_paired();
    }
    let k = summary_index(&reqs);
    assert_eq!(
        k, 2,
        "two tool rounds, then the summary (projection ≥ 5400 only after the second 3000-byte result)"
    );
    assert_summary_request(&reqs[k], &["fs__big", "BEGIN-", "-END"]);
    assert_eq!(
        reqs.len(),
        k + 2,
        "one request after the summary ends the turn"
    );

    let next = &reqs[k + 1];
    assert!(
        next.tool_names().contains(&"fs__big".to_string()),
        "the round after compaction offers the tools again: {:?}",
        next.tool_names()
    );
    // [summary, _PostCompact call, its result, live prompt] on every route; on Chat and
    // Anthropic an assistant message closes the injected call before the prompt (L10).
    let msgs = convo(next);
    let bridged = next.wire() != Wire::Responses;
    assert_eq!(msgs.len(), if bridged { 5 } else { 4 }, "{msgs:#?}");
    assert_eq!(msgs[0]["role"], "user", "{msgs:#?}");
    let summary = content_text(&msgs[0]["content"]);
    assert!(
        summary.starts_with(SUMMARY_HEADER) && summary.contains(SUMMARY_TEXT),
        "the history starts from the summary: {summary:?}"
    );
    let calls = next.assistant_tool_calls();
    assert_eq!(calls.len(), 1, "only the hook injection is left: {calls:?}");
    let (hook_id, hook_name, hook_args) = &calls[0];
    assert_eq!(hook_name, "fs___PostCompact", "H6 naming: {calls:?}");
    assert_eq!(
        serde_json::from_str::<Value>(hook_args).ok(),
        Some(json!({}))
    );
    let result = next.tool_result_for(hook_id).unwrap_or_default();
    let injected: Value = serde_json::from_str(&result)
        .unwrap_or_else(|e| panic!("the _PostCompact result is JSON ({e}): {result}"));
    assert_eq!(
        injected,
        json!({"hook": "_PostCompact", "server": "fs", "text": post}),
        "H7 injection"
    );
    let call_at = next
        .history_items()
        .into_iter()
        .find_map(|item| match item {
            HistoryItem::Call { msg, .. } => Some(msg),
            HistoryItem::Result { .. } | HistoryItem::Other { .. } => None,
        });
    assert_eq!(call_at, Some(1), "H7: right after the summary: {msgs:#?}");
    if bridged {
        let bridge = &msgs[3];
        assert!(
            bridge["role"] == "assistant"
                && bridge.get("tool_calls").is_none()
                && !bridge.to_string().contains("tool_use"),
            "L10: an assistant message closes the injected call before the prompt: {msgs:#?}"
        );
    }
    let last = &msgs[msgs.len() - 1];
    assert_eq!(last["role"], "user");
    assert_eq!(
        content_text(&last["content"]),
        live,
        "the live prompt is kept last"
    );
    assert!(
        !json!(next.messages()).to_string().contains("BEGIN-"),
        "the compacted tool results are gone from the next request"
    );

    let logged = log_of(&log);
    assert_eq!(
        fake_mcp::count_calls(&logged, "_PostCompact"),
        1,
        "H7: one _PostCompact call per compaction"
    );
    assert_eq!(fake_mcp::count_calls(&logged, "big"), 2);
    let ups = agent.session_updates(&sid);
    assert_eq!(
        agent_text(&ups),
        "done after compaction",
        "A6/K1: the internal summary call is not streamed to the client as the agent's answer"
    );
    let terminal = assert_tool_updates_well_formed(&ups);
    assert_eq!(
        terminal.len(),
        2,
        "H8: the hook call is no ACP tool call: {terminal:#?}"
    );
    assert!(agent.permission_requests().is_empty());
    agent.finish();
}

/// Runs a compaction with `_PostCompact` configured by `env`; returns (the request after the
/// summary, the summary request's and that request's arrival gap, the call log, the live
/// prompt).
fn compaction_with_hook(
    ctx: &Ctx,
    extra_agent: &[(&'static str, &'static str)],
    server_env: &[(&str, &str)],
) -> (RecordedRequest, Duration, Vec<Value>, &'static str) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let live = "Collect the data and report.";
    let mut senv = vec![
        ("FAKE_MCP_TOOLS", "big"),
        ("FAKE_MCP_CALL_LOG", log.as_str()),
    ];
    senv.extend_from_slice(server_env);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(compaction_llm(ctx, None, SummaryAnswer::Text, 4))
        .env(&compaction_env())
        .env(extra_agent)
        .fake_mcp("fs", &senv)
        .start();
    let r = agent.prompt(&sid, live);
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    for req in &reqs {
        req.assert_tool_calls_paired();
    }
    let k = summary_index(&reqs);
    assert_summary_request(&reqs[k], &["fs__big", "BEGIN-", "-END"]);
    assert_eq!(reqs.len(), k + 2, "one request after the summary");
    let gap = reqs[k + 1].received_at - reqs[k].received_at;
    let next = reqs[k + 1].clone();
    assert_tool_updates_well_formed(&agent.session_updates(&sid));
    agent.finish();
    (next, gap, log_of(&log), live)
}

fn assert_summary_then_live_only(next: &RecordedRequest, live: &str) {
    // Nothing injected: only user content — one message on Chat (texts joined, L10) and
    // Anthropic (two text blocks), two items on Responses.
    let msgs = convo(next);
    assert!(
        msgs.iter().all(|m| m["role"] == "user"),
        "nothing but the summary and the live prompt: {msgs:#?}"
    );
    let text = user_texts(next).concat();
    assert!(text.starts_with(SUMMARY_HEADER), "{text:?}");
    assert!(text.ends_with(live), "{text:?}");
    assert!(next.assistant_tool_calls().is_empty());
    assert!(
        !next.body.to_string().contains("_PostCompact"),
        "no _PostCompact trace in the request"
    );
}

/// H7/H3: a `_PostCompact` hook whose answer is blank after trimming injects nothing.
pub fn h7_empty_postcompact_injects_nothing(ctx: &Ctx) {
    let (next, _, log, live) =
        compaction_with_hook(ctx, &[], &[("FAKE_MCP_POSTCOMPACT_TEXT", "  \n\t ")]);
    assert_eq!(
        fake_mcp::count_calls(&log, "_PostCompact"),
        1,
        "the hook was called (and answered blank)"
    );
    assert_summary_then_live_only(&next, live);
}

/// H7/H3/H4: a `_PostCompact` hook slower than BUZZ_AGENT_HOOK_TIMEOUT_MS is abandoned
/// (`notifications/cancelled`) and the agent goes on without it, within about one hook timeout.
pub fn h7_postcompact_timeout_goes_on_without_it(ctx: &Ctx) {
    let (next, gap, log, live) = compaction_with_hook(
        ctx,
        &[("BUZZ_AGENT_HOOK_TIMEOUT_MS", "200")],
        &[
            ("FAKE_MCP_POSTCOMPACT_TEXT", "late text"),
            ("FAKE_MCP_POSTCOMPACT_DELAY_MS", "3000"),
        ],
    );
    let calls: Vec<&Value> = log
        .iter()
        .filter(|m| m["method"] == "tools/call" && m["params"]["name"] == "_PostCompact")
        .collect();
    assert_eq!(calls.len(), 1, "{log:#?}");
    let id = &calls[0]["id"];
    assert!(
        log.iter().any(|m| is_cancel_of(m, id)),
        "H4: the timed-out hook call {id} is cancelled: {log:#?}"
    );
    assert!(
        gap < Duration::from_millis(2500),
        "the next request came {gap:?} after the summary request: the 3 s hook was waited for"
    );
    assert_summary_then_live_only(&next, live);
}

/// K1 fallback: the summary call fails (HTTP 400) → the history is truncated instead: the
/// oldest whole units go (an earlier prompt and the first tool round), the live prompt stays,
/// calls keep their results, and the turn goes on to `end_turn`.
pub fn k1_summary_failure_falls_back_to_truncation(ctx: &Ctx) {
    let s = Scratch::new();
    let earlier = "EARLIER-PROMPT: say hi";
    let live = "LIVE-PROMPT: fetch two big results, then report.";
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(compaction_llm(
            ctx,
            Some(earlier),
            SummaryAnswer::BadRequest,
            4,
        ))
        .env(&compaction_env())
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "big")])
        .start();
    let r = agent.prompt(&sid, earlier);
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let r = agent.prompt(&sid, live);
    assert_eq!(
        agent.result(&r)["stopReason"],
        "end_turn",
        "a failed summary is no failed prompt: {r}"
    );

    let reqs = llm.requests();
    for req in &reqs {
        req.assert_tool_calls_paired();
    }
    let k = summary_index(&reqs);
    assert_eq!(
        k, 3,
        "earlier prompt, two tool rounds, then the summary call"
    );
    assert_eq!(
        reqs.len(),
        k + 2,
        "one more round after the fallback ends the turn"
    );
    let next = &reqs[k + 1];
    let msgs = convo(next);
    let users = user_texts(next);
    assert!(
        !next.body.to_string().contains(SUMMARY_HEADER),
        "no summary message after a failed summary"
    );
    assert!(
        !users.iter().any(|u| u.contains("EARLIER-PROMPT")),
        "the oldest unit (the earlier prompt) is dropped: {users:?}"
    );
    assert_eq!(
        content_text(&msgs[0]["content"]),
        live,
        "the live prompt is kept and now first: {msgs:#?}"
    );
    let ids: Vec<String> = next
        .assistant_tool_calls()
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    assert_eq!(
        ids,
        ["call_big_2"],
        "the first tool round is dropped whole, the last one kept"
    );
    let kept = next.tool_result_for("call_big_2").unwrap_or_default();
    assert!(kept.starts_with("BEGIN-") && kept.len() == BIG as usize);
    let size: usize = msgs.iter().map(|m| m.to_string().len()).sum();
    assert!(
        size < 5400,
        "the truncated history fits the window: {size} bytes"
    );
    let err = agent.stderr_text();
    assert!(
        err.contains("summary refused by the fake provider") || err.contains("400"),
        "the summary failure is logged{}",
        agent.context()
    );
    agent.finish();
}

/// L5/K1: a first round answered HTTP 400 `context_length_exceeded` → one summary call → the
/// round is retried from [summary, live prompt] and succeeds. A second prompt whose retry is
/// refused again fails with an `llm:` error: one reactive compaction per prompt.
pub fn l5_k1_context_too_long_400_compacts_then_succeeds(ctx: &Ctx) {
    let s = Scratch::new();
    let too_long = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let earlier = "EARLIER: remember the number 42";
    let live = "LIVE: what was the number?";
    let third = "THIRD: always too long";
    let llm = FakeLlm::with_handler(move |_, req| {
        if is_summary_request(req) {
            return Reply::text(SUMMARY_TEXT);
        }
        let users = user_texts(req);
        let last = users.last().cloned().unwrap_or_default();
        let compacted = users.iter().any(|u| u.starts_with(SUMMARY_HEADER));
        // A summary and the live prompt share one user message on the Chat wire (L10).
        if last == earlier {
            Reply::text("noted")
        } else if last.ends_with(live) && !compacted {
            Reply::status(400, vec![], too_long)
        } else if last.ends_with(live) {
            Reply::text("it was 42")
        } else {
            Reply::status(400, vec![], too_long)
        }
    });
    let (llm, agent, sid) = Setup::new(ctx, &s).llm(llm).fake_mcp("fs", &[]).start();
    let r = agent.prompt(&sid, earlier);
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let r = agent.prompt(&sid, live);
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        4,
        "earlier, refused round, summary, retried round: {:?}",
        reqs.iter().map(user_texts).collect::<Vec<_>>()
    );
    assert!(!is_summary_request(&reqs[1]) && is_summary_request(&reqs[2]));
    assert_summary_request(&reqs[2], &[earlier, "noted", live]);
    let msgs = convo(&reqs[3]);
    assert_eq!(
        msgs.len(),
        1,
        "[summary, live prompt] in one user message (L10): {msgs:#?}"
    );
    let text = content_text(&msgs[0]["content"]);
    assert!(text.starts_with(SUMMARY_HEADER) && text.ends_with(&format!("\n\n{live}")));
    assert!(
        !reqs[3].tool_names().is_empty(),
        "the retried round has the tools"
    );
    for req in &reqs {
        req.assert_tool_calls_paired();
    }

    let r = agent.prompt(&sid, third);
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(
        msg.starts_with("llm:") && msg.contains("maximum context length"),
        "A3: the provider's message: {msg}"
    );
    let reqs = llm.requests();
    let summaries = reqs[4..].iter().filter(|r| is_summary_request(r)).count();
    assert_eq!(
        (reqs.len() - 4, summaries),
        (3, 1),
        "refused round, one summary, one refused retry — then the error"
    );
    agent.finish();
}

/// K1/L5: a response that stops because the prompt and the answer filled the model's context
/// window (Anthropic `model_context_window_exceeded`, Mistral's Chat `model_length`) is not
/// nudged like a max-tokens cut: the context is compacted (one summary call that carries the
/// cut answer) and the round runs again from [summary, live prompt], `end_turn`. Once per
/// prompt: a prompt whose retried round fills the window again ends `max_tokens`. Before: the
/// nudge was appended to the full context (Anthropic) or the cut answer ended the turn (Mistral).
pub fn k1_l5_a_full_context_window_stop_compacts_and_the_round_runs_again(ctx: &Ctx) {
    for (wire, reason) in [
        (Wire::Anthropic, "model_context_window_exceeded"),
        (Wire::Chat, "model_length"),
    ] {
        let s = Scratch::new();
        let live = "LIVE: read every file";
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .handler(move |_, req| {
                let users = user_texts(req);
                let last = users.last().cloned().unwrap_or_default();
                if is_summary_request(req) {
                    Reply::text(SUMMARY_TEXT)
                } else if last.ends_with(live)
                    && users.iter().any(|u| u.starts_with(SUMMARY_HEADER))
                {
                    Reply::text("all read")
                } else {
                    Reply::text("PARTIAL answer").finish_reason(reason)
                }
            })
            .fake_mcp("fs", &[])
            .start();
        let r = agent.prompt(&sid, live);
        assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{wire:?}: {r}");
        let reqs = llm.requests();
        let summaries: Vec<bool> = reqs.iter().map(is_summary_request).collect();
        assert_eq!(
            summaries,
            [false, true, false],
            "{wire:?}: the round, the summary, the round again"
        );
        assert_summary_request(&reqs[1], &[live, "PARTIAL answer"]);
        let users = user_texts(&reqs[2]);
        assert!(
            users.concat().starts_with(SUMMARY_HEADER) && users.concat().ends_with(live),
            "{wire:?}: [summary, live prompt]: {users:?}"
        );
        assert!(
            agent_text(&agent.session_updates(&sid)).ends_with("all read"),
            "{wire:?}"
        );

        let r = agent.prompt(&sid, "THIRD: always full");
        assert_eq!(
            agent.result(&r)["stopReason"],
            "max_tokens",
            "{wire:?}: {r}"
        );
        let reqs = llm.requests();
        assert_eq!(
            reqs.len(),
            6,
            "{wire:?}: one compaction per prompt, then the end"
        );
        for req in &reqs {
            assert!(
                !req.body.to_string().contains("hit the output token limit"),
                "{wire:?}: a full window is not nudged: {}",
                req.body
            );
            req.assert_tool_calls_paired();
        }
        agent.finish();
    }
}

/// L1/L4: a response cut by the output cap (`finish_reason: length`) with a partial tool call:
/// the call is not run, the next request ends with the nudge, and the model recovers to
/// `end_turn`. Recoveries are per prompt (3 → four cut responses end `max_tokens`), and with
/// BUZZ_AGENT_MAX_TOKEN_RECOVERIES=0 the first cut ends the prompt `max_tokens`.
pub fn l1_max_tokens_partial_tool_call_not_run_nudge_then_recovery(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let cut = || {
        Reply::tool_calls_raw(vec![(
            "call_cut",
            "fs__echo",
            "{\"text\": \"a very long argu".to_string(),
        )])
        .with_text("Here is the start of a long answer")
        .finish_reason("length")
    };
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(move |i, _| match i {
            0 => cut(),
            1 => Reply::text("Short answer."),
            _ => cut(),
        })
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let r = agent.prompt(&sid, "write a long answer");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one nudge, then the recovery");
    reqs[1].assert_tool_calls_paired();
    assert!(
        reqs[1].assistant_tool_calls().is_empty(),
        "the cut tool call is not in history"
    );
    let msgs = convo(&reqs[1]);
    let last = msgs.last().cloned().unwrap_or_default();
    assert_eq!(
        last["role"], "user",
        "the request ends with the nudge: {msgs:#?}"
    );
    let nudge = content_text(&last["content"]);
    assert!(
        nudge.contains("cut off") && nudge.contains("smaller steps"),
        "nudge text: {nudge:?}"
    );
    let before = &msgs[msgs.len() - 2];
    assert_eq!(before["role"], "assistant");
    assert_eq!(
        content_text(&before["content"]),
        "Here is the start of a long answer",
        "the cut text is kept"
    );
    let logged = log_of(&log);
    assert!(
        fake_mcp::logged_tool_calls(&logged).is_empty(),
        "L1: a truncated tool call is never run: {logged:#?}"
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert!(
        terminal.iter().all(|t| t["status"] == "failed"),
        "a cut call, if announced at all, never completes: {terminal:#?}"
    );

    // Fresh counters per prompt: 1 + 3 nudged responses, then max_tokens.
    let r = agent.prompt(&sid, "again, long");
    assert_eq!(agent.result(&r)["stopReason"], "max_tokens", "{r}");
    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        2 + 4,
        "BUZZ_AGENT_MAX_TOKEN_RECOVERIES=3 → 4 calls"
    );
    for req in &reqs[3..] {
        req.assert_tool_calls_paired();
        let msgs = convo(req);
        assert!(content_text(&msgs[msgs.len() - 1]["content"]).contains("cut off"));
    }
    assert!(fake_mcp::logged_tool_calls(&log_of(&log)).is_empty());
    agent.finish();

    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(move |_, _| cut())
        .env(&[("BUZZ_AGENT_MAX_TOKEN_RECOVERIES", "0")])
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let r = agent.prompt(&sid, "write a long answer");
    assert_eq!(agent.result(&r)["stopReason"], "max_tokens", "{r}");
    assert_eq!(llm.requests().len(), 1, "no recovery allowed");
    assert!(fake_mcp::logged_tool_calls(&log_of(&log)).is_empty());
    agent.finish();
}
