//! The three provider routes and their faults: SPEC L5–L9, A3, A4 and cases C21–C24, C28.
//! Every fault scenario states its expected outcome in its doc comment; every wait is bounded.

use super::setup::Setup;
use super::util::{Scratch, log_of};
use crate::fake_llm::{Reply, Wire};
use crate::fake_mcp;
use crate::harness::{
    AgentProc, Ctx, agent_text, assert_tool_updates_well_formed, assert_updates_precede_response,
    tool_call_announcements, tool_update_text,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// `session/prompt` with one text block, answered within `secs`; returns the response and how
/// long it took.
fn prompt(agent: &AgentProc, sid: &str, text: &str, secs: u64) -> (Value, Duration) {
    let started = Instant::now();
    let r = agent.prompt_timeout(sid, text, Duration::from_secs(secs));
    (r, started.elapsed())
}

fn stop_reason(agent: &AgentProc, resp: &Value) -> String {
    agent.result(resp)["stopReason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// SPEC A3: a failed LLM call is the JSON-RPC error -32000 whose message starts `prefix`.
fn llm_error(agent: &AgentProc, resp: &Value, prefix: &str) -> String {
    let (code, msg) = agent.error(resp);
    assert_eq!(code, -32000, "{resp}{}", agent.context());
    assert!(
        msg.starts_with(prefix),
        "error message must start {prefix:?}: {msg:?}{}",
        agent.context()
    );
    msg
}

fn thought_text(updates: &[Value]) -> String {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_thought_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

fn message_chunks(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str().map(str::to_string))
        .collect()
}

fn usage_used(updates: &[Value]) -> Vec<u64> {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "usage_update")
        .filter_map(|u| u["used"].as_u64())
        .collect()
}

fn gap(a: &crate::fake_llm::RecordedRequest, b: &crate::fake_llm::RecordedRequest) -> Duration {
    b.received_at.duration_since(a.received_at)
}

fn tool_calls_logged(log: &str) -> Vec<Value> {
    fake_mcp::logged_tool_calls(&log_of(log))
}

/// One Chat Completions chunk as an SSE event.
fn chat_chunk(delta: Value, finish: Value) -> String {
    let obj = json!({"id": "c", "object": "chat.completion.chunk", "model": "test-model",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {obj}\n\n")
}

fn tool_delta(call: Value) -> Value {
    json!({"tool_calls": [call]})
}

const STREAM_TERMINATORS: [&str; 4] = [
    "finish_reason\":\"tool_calls",
    "message_stop",
    "response.completed",
    "[DONE]",
];

// ------------------------------------------------------------------------------------------------

/// L6/L7/L8 (+L4, A6): the same five-round tool prompt on the Chat Completions, Responses and
/// Anthropic routes. Expected on every route: five `fs__echo` calls reach the MCP server, every
/// request is on the route's path with its auth headers and carries every earlier call paired
/// with its result (L4), the text and the round-2 reasoning arrive as chunks, a usage update per
/// response, `end_turn` after six rounds. Anthropic replays the thinking block with its
/// signature before the tool use.
pub fn l6_l7_l8_five_round_tool_prompt_on_every_route(ctx: &Ctx) {
    for wire in Wire::ALL {
        five_rounds_on(ctx, wire);
    }
}

fn five_rounds_on(ctx: &Ctx, wire: Wire) {
    let mut replies = Vec::new();
    for i in 1..=5u64 {
        let id = format!("call_{i}");
        let mut r = Reply::tool_calls(vec![(
            id.as_str(),
            "fs__echo",
            json!({"text": format!("r{i}")}),
        )])
        .usage(Some((100 * i, 10)));
        if i % 2 == 1 {
            r = r.with_text(format!("step {i}. "));
        }
        if i == 2 {
            r = r.with_thinking("pondering r2");
        }
        replies.push(r);
    }
    replies.push(Reply::text("All done, five echoes.").usage(Some((700, 20))));
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .wire(wire)
        .replies(replies)
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let prompt_text = "Echo r1 to r5, one per round, then say you are done.";
    let pid = agent.start_prompt(&sid, prompt_text);
    let resp = agent.wait_response(&pid, Duration::from_secs(30));
    let what = format!("{wire:?} route");
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{what}: {resp}");
    assert_eq!(
        agent.result(&resp)["_meta"]["buzz"]["rounds"],
        6,
        "{what}: {resp}"
    );

    let ups = agent.session_updates(&sid);
    assert_eq!(
        agent_text(&ups),
        "step 1. \n\nstep 3. \n\nstep 5. \n\nAll done, five echoes.",
        "{what}"
    );
    assert!(
        message_chunks(&ups).len() >= 4,
        "{what}: text arrives in chunks"
    );
    assert_eq!(
        thought_text(&ups),
        "pondering r2",
        "{what}: reasoning chunks"
    );
    let announced = tool_call_announcements(&ups);
    let terminal = assert_tool_updates_well_formed(&ups);
    assert_eq!(announced.len(), 5, "{what}: {ups:#?}");
    for (i, (a, t)) in announced.iter().zip(&terminal).enumerate() {
        let text = format!("r{}", i + 1);
        assert_eq!(a["rawInput"], json!({"text": text}), "{what}: {a}");
        assert_eq!(t["status"], "completed", "{what}: {t}");
        assert_eq!(tool_update_text(t), text, "{what}: {t}");
    }
    assert_eq!(
        usage_used(&ups),
        [110, 210, 310, 410, 510, 720],
        "{what}: usage_update per response"
    );

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 6, "{what}: one LLM call per round");
    for (k, req) in reqs.iter().enumerate() {
        assert_eq!(req.method, "POST", "{what}");
        assert_eq!(req.path, wire.path(), "{what}");
        assert_eq!(req.wire(), wire);
        assert_eq!(req.body["model"], "test-model", "{what}");
        assert_eq!(req.body["stream"], true, "{what}");
        match wire {
            Wire::Anthropic => {
                assert_eq!(req.header("x-api-key"), Some("sk-test-secret"), "{what}");
                assert_eq!(
                    req.header("anthropic-version"),
                    Some("2023-06-01"),
                    "{what}"
                );
                assert_eq!(req.header("authorization"), None, "{what}");
                assert!(req.body["max_tokens"].is_u64(), "{what}: {}", req.body);
            }
            Wire::Chat | Wire::Responses => {
                assert_eq!(
                    req.header("authorization"),
                    Some("Bearer sk-test-secret"),
                    "{what}"
                );
            }
        }
        match wire {
            Wire::Chat => assert_eq!(req.body["stream_options"]["include_usage"], true),
            Wire::Responses => assert_eq!(req.body["store"], false, "{what}"),
            Wire::Anthropic => {}
        }
        assert!(
            req.tool_names().contains(&"fs__echo".to_string()),
            "{what}: {:?}",
            req.tool_names()
        );
        assert!(
            req.user_text().contains(prompt_text),
            "{what}: the prompt is in the history: {:?}",
            req.user_text()
        );
        req.assert_tool_calls_paired();
        let calls = req.assistant_tool_calls();
        assert_eq!(
            calls.len(),
            k,
            "{what}: request {k} carries every earlier call"
        );
        for (j, (id, name, args)) in calls.iter().enumerate() {
            let text = format!("r{}", j + 1);
            assert_eq!(id, &format!("call_{}", j + 1), "{what}");
            assert_eq!(name, "fs__echo", "{what}");
            let args: Value = serde_json::from_str(args)
                .unwrap_or_else(|e| panic!("{what}: arguments {args:?}: {e}"));
            assert_eq!(args, json!({"text": text}), "{what}");
            assert_eq!(
                req.tool_result_for(id).as_deref(),
                Some(text.as_str()),
                "{what}"
            );
        }
    }
    if wire == Wire::Anthropic {
        // L6: the thinking block of round 2 is replayed verbatim, before its tool use.
        let assistants: Vec<Value> = reqs[5]
            .messages()
            .into_iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        assert_eq!(
            assistants[1]["content"][0],
            json!({"type": "thinking", "thinking": "pondering r2", "signature": "sig-fake"}),
            "{what}: {:#?}",
            assistants[1]
        );
        assert_eq!(assistants[1]["content"][1]["type"], "tool_use", "{what}");
    }

    let calls = tool_calls_logged(&log);
    assert_eq!(calls.len(), 5, "{what}: {calls:#?}");
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c["params"]["name"], "echo", "{what}");
        assert_eq!(
            c["params"]["arguments"],
            json!({"text": format!("r{}", i + 1)})
        );
    }
    assert_updates_precede_response(&agent, &sid, &pid);
    agent.finish();
}

// ---- L5 / C28: retries ---------------------------------------------------------------------

/// L5/C28: `429` with `retry-after: 1`, then a good stream. Expected: retried once, the second
/// request comes ≥ 0.9 s after the first and is the same request, the turn ends `end_turn` with
/// only the second stream's text.
pub fn l5_c28_429_retry_after_is_honoured_then_success(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::status(
                429,
                vec![("retry-after", "1")],
                r#"{"error":{"message":"rate limited","type":"rate_limit_error"}}"#,
            ),
            Reply::text("after the wait"),
        ])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 15);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    assert_eq!(agent_text(&agent.session_updates(&sid)), "after the wait");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one retry");
    let waited = gap(&reqs[0], &reqs[1]);
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "retry-after: 1 must be honoured, waited {waited:?}"
    );
    assert_eq!(
        reqs[0].body, reqs[1].body,
        "a retry resends the same request"
    );
    agent.finish();
}

/// L5/C28 on the Anthropic route: `529` (overloaded, no hint), then `503` (no hint), then a
/// good stream. Expected: two retries with exponential backoff (≈0.5 s, then ≈1 s, ±25 %),
/// `end_turn`, three requests.
pub fn l5_c28_529_then_503_back_off_then_success(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .wire(Wire::Anthropic)
        .replies(vec![
            Reply::status(
                529,
                vec![],
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            Reply::status(
                503,
                vec![],
                r#"{"type":"error","error":{"type":"api_error","message":"unavailable"}}"#,
            ),
            Reply::text("third time lucky"),
        ])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 20);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    assert_eq!(agent_text(&agent.session_updates(&sid)), "third time lucky");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let (g1, g2) = (gap(&reqs[0], &reqs[1]), gap(&reqs[1], &reqs[2]));
    assert!(
        g1 >= Duration::from_millis(300) && g1 < Duration::from_secs(4),
        "first backoff ≈0.5 s: {g1:?}"
    );
    assert!(
        g2 >= Duration::from_millis(650) && g2 < Duration::from_secs(6),
        "second backoff ≈1 s: {g2:?}"
    );
    agent.finish();
}

/// L6: an Anthropic `error` event (`overloaded_error`) mid-stream, before any text. Expected: a
/// retryable failure (never a silent empty answer): retried after a backoff, `end_turn` with
/// the second stream's text only.
pub fn l6_overloaded_error_event_before_text_is_retried(ctx: &Ctx) {
    let overloaded = "event: message_start\n\
        data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_x\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"test-model\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
        event: ping\ndata: {\"type\": \"ping\"}\n\n\
        event: error\n\
        data: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n";
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .wire(Wire::Anthropic)
        .replies(vec![
            Reply::raw_sse(overloaded),
            Reply::text("after overload"),
        ])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 15);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    assert_eq!(agent_text(&agent.session_updates(&sid)), "after overload");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "the overloaded stream is retried once");
    assert!(
        gap(&reqs[0], &reqs[1]) >= Duration::from_millis(300),
        "backoff before retry"
    );
    agent.finish();
}

/// C24 c/L5 on every route: a body cut mid-event in the middle of a tool call (no finish, no
/// `[DONE]` / `message_stop` / `response.completed`, no final HTTP chunk). Expected: the
/// partial call is not run (no `tools/call`, no announcement), the attempt is retried and the
/// retry's answer ends the turn `end_turn`.
pub fn c24_body_cut_mid_event_is_retried_then_succeeds(ctx: &Ctx) {
    for wire in Wire::ALL {
        let cut = Reply::tool_calls(vec![(
            "call_cut",
            "fs__echo",
            json!({"text": "never run, this call is cut"}),
        )]);
        let pieces = cut.sse_pieces_for(wire);
        let at = pieces.len() / 2;
        assert!(
            !STREAM_TERMINATORS
                .iter()
                .any(|t| pieces[..=at].concat().contains(t)),
            "{wire:?}: the cut must come before any terminator"
        );
        // In a dialect the stream has more pieces (thinking, whole calls): cut in its middle.
        let cut = if ctx.dialect.is_some() {
            cut.cut_in_middle()
        } else {
            cut.cut_in_piece(at)
        };
        let (s, [log]) = Scratch::with_files(["calls.log"]);
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .replies(vec![cut, Reply::text("recovered")])
            .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
            .start();
        let (resp, _) = prompt(&agent, &sid, "hi", 15);
        assert_eq!(stop_reason(&agent, &resp), "end_turn", "{wire:?}: {resp}");
        let ups = agent.session_updates(&sid);
        assert_eq!(agent_text(&ups), "recovered", "{wire:?}");
        assert!(
            tool_call_announcements(&ups).is_empty(),
            "{wire:?}: {ups:#?}"
        );
        assert_eq!(llm.requests().len(), 2, "{wire:?}: retried once");
        assert!(
            tool_calls_logged(&log).is_empty(),
            "{wire:?}: cut call must not run"
        );
        llm.requests()[1].assert_tool_calls_paired();
        agent.finish();
    }
}

/// C24 a/L7: a Chat Completions stream with `finish_reason: "stop"` that ends (clean HTTP end)
/// without `data: [DONE]`. Expected: success without retry — one request, `end_turn`.
pub fn c24_finish_without_done_is_success_without_retry(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("complete but no DONE").without_done(),
            Reply::text("a retry must not happen"),
        ])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 10);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    let ups = agent.session_updates(&sid);
    assert_eq!(agent_text(&ups), "complete but no DONE");
    assert_eq!(
        usage_used(&ups),
        [110],
        "the usage chunk before the end is used"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(llm.requests().len(), 1, "no retry");
    agent.finish();
}

/// L5/C24 d: response head, then a body that stays silent for 3 s, with
/// `BUZZ_AGENT_LLM_TIMEOUT_SECS=1`. Expected: the idle timeout fails the attempt after ≈1 s
/// (long before the stall ends), it is retried after a backoff, `end_turn`.
pub fn l5_c24_stalled_body_hits_idle_timeout_and_is_retried(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::raw_sse("").stall_after_ms(3000),
            Reply::text("after the stall"),
        ])
        .env(&[("BUZZ_AGENT_LLM_TIMEOUT_SECS", "1")])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 15);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    assert_eq!(agent_text(&agent.session_updates(&sid)), "after the stall");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let waited = gap(&reqs[0], &reqs[1]);
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(2900),
        "idle timeout (1 s) + backoff, before the 3 s stall ends: {waited:?}"
    );
    agent.finish();
}

/// L5/A3: the same stall with `BUZZ_AGENT_LLM_MAX_ATTEMPTS=1`. Expected: no retry; the prompt
/// fails after ≈1 s with -32000 `llm: …` naming the idle timeout.
pub fn l5_stalled_body_with_one_attempt_is_an_llm_error(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::raw_sse("").stall_after_ms(3000),
            Reply::text("a retry must not happen"),
        ])
        .env(&[
            ("BUZZ_AGENT_LLM_TIMEOUT_SECS", "1"),
            ("BUZZ_AGENT_LLM_MAX_ATTEMPTS", "1"),
        ])
        .start();
    let (resp, took) = prompt(&agent, &sid, "hi", 10);
    let msg = llm_error(&agent, &resp, "llm:");
    let lower = msg.to_ascii_lowercase();
    assert!(
        lower.contains("timeout") || lower.contains("timed out") || lower.contains("no data"),
        "the error names the idle timeout: {msg:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2900),
        "failed by the 1 s idle timeout: {took:?}"
    );
    assert_eq!(llm.requests().len(), 1, "one attempt");
    agent.finish();
}

/// L5/C28: three `503`s with `BUZZ_AGENT_LLM_MAX_ATTEMPTS=2` (the script would succeed on the
/// fourth). Expected: exactly two requests, then -32000 `llm: …` naming 503 and the provider's
/// message.
pub fn l5_retries_exhausted_is_an_llm_error_naming_the_status(ctx: &Ctx) {
    let unavailable = || {
        Reply::status(
            503,
            vec![],
            r#"{"error":{"message":"upstream unavailable"}}"#,
        )
    };
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            unavailable(),
            unavailable(),
            unavailable(),
            Reply::text("too late"),
        ])
        .env(&[("BUZZ_AGENT_LLM_MAX_ATTEMPTS", "2")])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 15);
    let msg = llm_error(&agent, &resp, "llm:");
    assert!(
        msg.contains("503") && msg.contains("upstream unavailable"),
        "{msg:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        llm.requests().len(),
        2,
        "exactly BUZZ_AGENT_LLM_MAX_ATTEMPTS requests"
    );
    agent.finish();
}

/// L5/A3 on every route: `401`. Expected: -32000 `llm auth: …` with the provider's message, no
/// retry (one request).
pub fn l5_401_is_llm_auth_error_without_retry(ctx: &Ctx) {
    for wire in Wire::ALL {
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .replies(vec![
            Reply::status(
                401,
                vec![],
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            ),
            Reply::text("a retry must not happen"),
        ])
            .start();
        let (resp, _) = prompt(&agent, &sid, "hi", 10);
        let msg = llm_error(&agent, &resp, "llm auth:");
        assert!(msg.contains("invalid x-api-key"), "{wire:?}: {msg:?}");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(llm.requests().len(), 1, "{wire:?}: 401 is never retried");
        agent.finish();
    }
}

/// L5/A3 on every route: `400` (not context-too-long). Expected: -32000 `llm: …` carrying the
/// status and the provider's message, no retry; the user's prompt stays in history, so the next
/// prompt's request carries both prompts.
pub fn l5_400_is_an_llm_error_with_the_provider_message(ctx: &Ctx) {
    for wire in Wire::ALL {
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .replies(vec![
            Reply::status(
                400,
                vec![],
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.0: something is off"}}"#,
            ),
            Reply::text("second prompt answered"),
        ])
            .start();
        let (resp, _) = prompt(&agent, &sid, "first prompt", 10);
        let msg = llm_error(&agent, &resp, "llm:");
        assert!(
            msg.contains("400") && msg.contains("messages.0: something is off"),
            "{wire:?}: {msg:?}"
        );
        assert_eq!(llm.requests().len(), 1, "{wire:?}: 400 is never retried");
        let (resp, _) = prompt(&agent, &sid, "second prompt", 10);
        assert_eq!(stop_reason(&agent, &resp), "end_turn", "{wire:?}: {resp}");
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2, "{wire:?}");
        let users = reqs[1].user_text();
        assert!(
            users.contains("first prompt") && users.contains("second prompt"),
            "{wire:?}: A3 the failed prompt stays in history: {users:?}"
        );
        agent.finish();
    }
}

/// L5 on every route: text already streamed to the client, then the body is cut mid-event.
/// Expected: NOT retried (exactly one request); -32000 `llm: …`; the streamed chunks arrived.
pub fn l5_text_streamed_then_cut_is_not_retried(ctx: &Ctx) {
    for wire in Wire::ALL {
        let reply = Reply::text("partial answer that");
        let pieces = reply.sse_pieces_for(wire);
        let at = pieces
            .iter()
            .position(|p| p.contains("\" that\""))
            .unwrap_or_else(|| panic!("{wire:?}: no third text piece in {pieces:#?}"));
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .replies(vec![reply.cut_in_piece(at), Reply::text("no retry")])
            .start();
        let (resp, _) = prompt(&agent, &sid, "hi", 10);
        llm_error(&agent, &resp, "llm:");
        assert_eq!(
            agent_text(&agent.session_updates(&sid)),
            "partial answer",
            "{wire:?}: the streamed part reached the client"
        );
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            llm.requests().len(),
            1,
            "{wire:?}: streamed text forbids a retry"
        );
        agent.finish();
    }
}

/// A4/L5/C28 on the Anthropic route: `529` with `retry-after: 30`, then `session/cancel` during
/// the backoff. Expected: the prompt is answered `cancelled` within 3 s of the cancel, and no
/// second request is made. (`lifecycle::a4_cancel_during_backoff` covers Chat with a 429.)
pub fn a4_l5_cancel_during_long_backoff_is_prompt(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .wire(Wire::Anthropic)
        .replies(vec![
            Reply::status(
                529,
                vec![("retry-after", "30")],
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            Reply::text("must not be requested"),
        ])
        .start();
    let pid = agent.start_prompt(&sid, "hi");
    assert_eq!(llm.wait_requests(1, Duration::from_secs(10)).len(), 1);
    // Let the agent read the 429 and enter its backoff (its warning says so), bounded.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !agent.stderr_text().contains("retrying in") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    let cancelled_at = Instant::now();
    agent.cancel(&sid);
    let resp = agent.wait_response(&pid, Duration::from_secs(3));
    let took = cancelled_at.elapsed();
    assert_eq!(stop_reason(&agent, &resp), "cancelled", "{resp}");
    assert!(took < Duration::from_secs(3), "cancel answered in {took:?}");
    assert_eq!(llm.requests().len(), 1, "no retry after the cancel");
    agent.finish();
}

// ---- L9: text handling ---------------------------------------------------------------------

/// L9 on every route: the body written one byte per HTTP chunk, so lines and UTF-8 characters
/// (`é`, `🐝`) are cut. Expected: the exact text `héllo 🐝`, `end_turn`.
pub fn l9_utf8_split_inside_characters_gives_exact_text(ctx: &Ctx) {
    for wire in Wire::ALL {
        let s = Scratch::new();
        let (_llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .replies(vec![Reply::text("héllo 🐝").split_every(1)])
            .start();
        let (resp, _) = prompt(&agent, &sid, "hi", 15);
        assert_eq!(stop_reason(&agent, &resp), "end_turn", "{wire:?}: {resp}");
        let ups = agent.session_updates(&sid);
        assert_eq!(agent_text(&ups), "héllo 🐝", "{wire:?}");
        assert!(
            message_chunks(&ups).iter().all(|c| !c.contains('\u{fffd}')),
            "{wire:?}: no replacement character from a split: {ups:#?}"
        );
        agent.finish();
    }
}

/// L9 on every route: a lone-surrogate escape (`\ud800`) inside a text delta. Expected: not
/// fatal; the streamed chunk carries U+FFFD in its place, `end_turn`.
pub fn l9_lone_surrogate_becomes_replacement_character(ctx: &Ctx) {
    let bad = r#""bad \ud800 surrogate""#;
    let bodies = [
        (
            Wire::Chat,
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{bad}}},\"finish_reason\":null}}]}}\n\n\
                 data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n\
                 data: [DONE]\n\n"
            ),
        ),
        (
            Wire::Anthropic,
            format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}}}\n\n\
                 event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
                 event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{bad}}}}}\n\n\
                 event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
                 event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}}}}\n\n\
                 event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            ),
        ),
        (
            Wire::Responses,
            format!(
                "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":{bad}}}\n\n\
                 event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"id\":\"r\",\"status\":\"completed\"}}}}\n\n"
            ),
        ),
    ];
    for (wire, body) in bodies {
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .replies(vec![Reply::raw_sse(body)])
            .start();
        let (resp, _) = prompt(&agent, &sid, "hi", 10);
        assert_eq!(stop_reason(&agent, &resp), "end_turn", "{wire:?}: {resp}");
        let ups = agent.session_updates(&sid);
        assert_eq!(agent_text(&ups), "bad \u{fffd} surrogate", "{wire:?}");
        assert!(
            message_chunks(&ups).iter().any(|c| c.contains('\u{fffd}')),
            "{wire:?}: the streamed chunk carries U+FFFD"
        );
        assert_eq!(llm.requests().len(), 1, "{wire:?}");
        agent.finish();
    }
}

// ---- C21–C23: Chat Completions stream shapes -------------------------------------------------

/// C21: tool-call deltas at indices 1..3 (not from 0): `call_A` with `id:""` on its
/// continuation, one with `id:""` throughout, one with no `id` at all. Expected: exactly three
/// calls run in index order with their full arguments, the two id-less calls get non-empty,
/// distinct synthesised ids, and the next request pairs every id with its result (L4).
pub fn c21_tool_call_deltas_without_ids_get_synthesised_paired_ids(ctx: &Ctx) {
    let body = [
        chat_chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 1, "id": "call_A",
                   "type": "function", "function": {"name": "fs__echo", "arguments": ""}}]}),
            Value::Null,
        ),
        chat_chunk(
            tool_delta(json!({"index": 1, "id": "", "type": "function",
                              "function": {"arguments": "{\"text\": "}})),
            Value::Null,
        ),
        chat_chunk(
            tool_delta(json!({"index": 1, "function": {"arguments": "\"a\"}"}})),
            Value::Null,
        ),
        chat_chunk(
            tool_delta(json!({"index": 2, "id": "", "type": "function",
                              "function": {"name": "fs__echo", "arguments": "{\"text\":"}})),
            Value::Null,
        ),
        chat_chunk(
            tool_delta(json!({"index": 2, "id": "", "function": {"arguments": "\"b\"}"}})),
            Value::Null,
        ),
        chat_chunk(
            tool_delta(json!({"index": 3, "function": {"name": "fs__echo",
                                                       "arguments": "{\"text\":\"c\"}"}})),
            Value::Null,
        ),
        chat_chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![Reply::raw_sse(body), Reply::text("three echoed")])
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let (resp, _) = prompt(&agent, &sid, "echo a b c", 15);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    let ups = agent.session_updates(&sid);
    let inputs: Vec<Value> = tool_call_announcements(&ups)
        .iter()
        .map(|a| a["rawInput"].clone())
        .collect();
    assert_eq!(
        inputs,
        [
            json!({"text": "a"}),
            json!({"text": "b"}),
            json!({"text": "c"})
        ],
        "three calls in index order, no phantom call"
    );
    let mut ran: Vec<Value> = tool_calls_logged(&log)
        .iter()
        .map(|c| c["params"]["arguments"].clone())
        .collect();
    ran.sort_by_key(Value::to_string);
    assert_eq!(
        ran,
        [
            json!({"text": "a"}),
            json!({"text": "b"}),
            json!({"text": "c"})
        ]
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    reqs[1].assert_tool_calls_paired();
    let calls = reqs[1].assistant_tool_calls();
    let ids: Vec<&str> = calls.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(ids.len(), 3, "{calls:?}");
    assert_eq!(ids[0], "call_A", "the first non-empty id is kept");
    assert!(
        !ids[1].is_empty()
            && !ids[2].is_empty()
            && ids[1] != ids[2]
            && !ids[1..].contains(&"call_A"),
        "synthesised ids are non-empty and unique: {ids:?}"
    );
    for ((id, _, _), text) in calls.iter().zip(["a", "b", "c"]) {
        assert_eq!(reqs[1].tool_result_for(id).as_deref(), Some(text), "{id}");
    }
    agent.finish();
}

/// C22: chunks with `choices: []` (content-filter preamble), no `choices`, `choices: null`, and
/// a usage-only final chunk. Expected: no failure, text `Hi`, `end_turn`, one `usage_update`
/// with used = 624 (from the usage chunk), one request.
pub fn c22_usage_only_and_empty_choices_chunks_are_accepted(ctx: &Ctx) {
    let body = [
        r#"data: {"id":"c2","object":"chat.completion.chunk","choices":[],"prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}"#,
        r#"data: {"id":"c2","object":"chat.completion.chunk"}"#,
        r#"data: {"id":"c2","object":"chat.completion.chunk","choices":null}"#,
        r#"data: {"id":"c2","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
        r#"data: {"id":"c2","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"data: {"id":"c2","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":611,"completion_tokens":13,"total_tokens":624}}"#,
        "data: [DONE]",
    ]
    .map(|l| format!("{l}\n\n"))
    .concat();
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![Reply::raw_sse(body)])
        .start();
    let (resp, _) = prompt(&agent, &sid, "hi", 10);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    let ups = agent.session_updates(&sid);
    assert_eq!(agent_text(&ups), "Hi");
    assert_eq!(
        usage_used(&ups),
        [624],
        "usage from the usage-only chunk: {ups:#?}"
    );
    assert_eq!(llm.requests().len(), 1);
    agent.finish();
}

/// C23: tool calls streamed with `finish_reason: ""` throughout and no finish chunk (then
/// `[DONE]`); in a second prompt, complete tool calls with `finish_reason: "stop"`. Expected:
/// both times the tool runs, its result is paired in the next request, `end_turn`.
pub fn c23_missing_or_stop_finish_reason_with_complete_tool_calls_runs_tools(ctx: &Ctx) {
    let missing = [
        chat_chunk(json!({"content": "Let me check."}), json!("")),
        chat_chunk(
            tool_delta(json!({"index": 0, "id": "call_1", "type": "function",
                              "function": {"name": "fs__echo", "arguments": "{\"text\":\"c23\"}"}})),
            json!(""),
        ),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let stop = [
        chat_chunk(
            tool_delta(json!({"index": 0, "id": "call_2", "type": "function",
                              "function": {"name": "fs__echo", "arguments": "{\"text\":\"c23 stop\"}"}})),
            Value::Null,
        ),
        chat_chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::raw_sse(missing),
            Reply::text("checked"),
            Reply::raw_sse(stop),
            Reply::text("checked again"),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let (resp, _) = prompt(&agent, &sid, "check", 15);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    let (resp, _) = prompt(&agent, &sid, "check again", 15);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    let ran: Vec<Value> = tool_calls_logged(&log)
        .iter()
        .map(|c| c["params"]["arguments"].clone())
        .collect();
    assert_eq!(ran, [json!({"text": "c23"}), json!({"text": "c23 stop"})]);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    for (k, id, text) in [(1, "call_1", "c23"), (3, "call_2", "c23 stop")] {
        reqs[k].assert_tool_calls_paired();
        assert_eq!(
            reqs[k].tool_result_for(id).as_deref(),
            Some(text),
            "request {k}"
        );
    }
    let ups = agent.session_updates(&sid);
    // C60: a paragraph break between the rounds of a turn (not between prompts).
    assert_eq!(agent_text(&ups), "Let me check.\n\ncheckedchecked again");
    let terminal = assert_tool_updates_well_formed(&ups);
    assert!(
        terminal.iter().all(|t| t["status"] == "completed"),
        "{terminal:#?}"
    );
    agent.finish();
}

/// C24 b: a complete Chat Completions stream (`finish_reason: "stop"`, usage chunk) without
/// `[DONE]`, after which the server keeps the connection open and silent (4 s, then an unclean
/// close). Expected: the turn completes `end_turn` with the text within a short grace (< 3 s),
/// without waiting for the idle timeout or the close, and without a retry.
pub fn c24_finish_then_connection_left_open_completes_after_grace(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("finished, socket open")
                .without_done()
                .stall_after_ms(4000),
            Reply::text("a retry must not happen"),
        ])
        .start();
    let (resp, took) = prompt(&agent, &sid, "hi", 10);
    assert_eq!(stop_reason(&agent, &resp), "end_turn", "{resp}");
    assert_eq!(
        agent_text(&agent.session_updates(&sid)),
        "finished, socket open"
    );
    assert!(
        took < Duration::from_secs(3),
        "completed after a short grace: {took:?}"
    );
    assert_eq!(llm.requests().len(), 1, "no retry");
    agent.finish();
}

/// Issue #15, issue 27: every round of a session goes over one kept-alive connection, and the
/// exchanges run on the loop's own thread: no thread is started for them (before, a worker
/// thread per concurrent call carried each body chunk across to the loop).
pub fn l7_every_round_of_a_session_uses_one_kept_alive_connection(ctx: &Ctx) {
    let llm = crate::fake_llm::FakeLlm::with_options(
        crate::fake_llm::Options {
            keep_alive: true,
            ..crate::fake_llm::Options::default()
        },
        |i, _| {
            const IDS: [&str; 5] = ["call_0", "call_1", "call_2", "call_3", "call_4"];
            match IDS.get(i) {
                Some(id) => Reply::tool_calls(vec![(id, "fs__echo", json!({"text": i}))]),
                None => Reply::text("all five done"),
            }
        },
    );
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s).llm(llm).fake_mcp("fs", &[]).start();
    for prompt_no in 0..2 {
        let (r, _) = prompt(&agent, &sid, "echo five times", 30);
        assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
        if prompt_no == 0 {
            assert_eq!(llm.requests().len(), 6, "five tool rounds and the answer");
        }
    }
    // The main thread and the driver's named helpers (stdin reader, log and store writers, a
    // stdout writer for a slow client): nothing for HTTP. (Both binaries' reactors are on the
    // main thread; the smol binary's resolves host names on a thread, and the fake LLM is
    // at an address literal.)
    let main = std::fs::read_to_string(format!("/proc/{}/comm", agent.pid())).unwrap_or_default();
    let main = main.trim_end();
    for name in agent.thread_names() {
        assert!(
            name == main || ["stdin", "log", "store", "stdout"].contains(&name.as_str()),
            "no thread for the HTTP exchanges: {:?}",
            agent.thread_names()
        );
    }
    // Usually one connection; two when a call started while the previous call's connection
    // had not yet read its stream's last bytes (the core ends a call at the stream's
    // terminator: under load the next round can come first). Each stays open, idle.
    let connections = llm.connections();
    assert!(
        (1..=2).contains(&connections),
        "{} requests over {connections} connections",
        llm.requests().len(),
    );
    assert_eq!(agent.open_sockets() as u64, connections, "kept alive, idle");
    agent.finish();
}
