//! Hooks and interceptors on a remote server (SPEC M10: "Hooks (H1–H11) and interceptors (X1)
//! work on HTTP servers exactly as on stdio ones"): the same hook timeout and its kill rule —
//! for HTTP the agent drops the MCP session (a `DELETE`) and marks the server dead, to be
//! restarted lazily (M9) with a new `initialize` — the same `_Stop` budget, and a SEP-2624
//! validator served over HTTP. The server is [`HttpFake`], a separate process on `127.0.0.1`.

use super::mcp_http::wait_log;
use super::setup::Setup;
use super::util::{
    Scratch, assert_end_turn, buzz_meta, is_cancel_of, log_of, stop_calls, wait_for, wait_stderr,
};
use crate::fake_llm::{FakeLlm, Reply};
use crate::fake_mcp;
use crate::fake_mcp_http::{HttpFake, posted_method, read_http_log};
use crate::harness::{AgentProc, Ctx, fake_mcp_entry};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A fake HTTP server with a `_Stop` hook (`FAKE_MCP_STOP`), logging its MCP messages to
/// `calls`, with `extra` settings.
pub(super) fn remote_hook(s: &Scratch, calls: &str, extra: &[(&str, &str)]) -> HttpFake {
    let mut env = vec![("FAKE_MCP_STOP", "1"), ("FAKE_MCP_CALL_LOG", calls)];
    env.extend_from_slice(extra);
    HttpFake::start(s.dir.path(), &env)
}

/// A session whose one server is `fake`, named `name` and allowlisted for hooks; the model
/// always answers with a final text; `env` adds settings.
fn hooked_session(
    ctx: &Ctx,
    s: &Scratch,
    fake: &HttpFake,
    name: &str,
    env: &[(&str, &str)],
) -> (FakeLlm, AgentProc, String) {
    let mut env = env.to_vec();
    env.push(("MCP_HOOK_SERVERS", name));
    Setup::new(ctx, s)
        .handler(|_, _| Reply::text("done"))
        .env(&env)
        .servers([fake.entry(name, &[])])
        .start()
}

/// The `initialize` `POST`s of a fake's log.
fn initializes(log: &[Value]) -> usize {
    log.iter()
        .filter(|e| posted_method(e).as_deref() == Some("initialize"))
        .count()
}

/// H4 over HTTP: a remote `_Stop` that never answers fails open within the hook timeout and is
/// cancelled; the second consecutive timeout kills the server, which for HTTP ends its MCP
/// session with a `DELETE` of the session id the hook calls carried and marks it dead; after
/// the M9 backoff a new round starts it again with a new `initialize`, and every prompt ends
/// `end_turn`.
pub fn h4_m10_a_silent_remote_hook_times_out_twice_and_its_session_is_dropped(ctx: &Ctx) {
    let (s, [calls, http_log]) = Scratch::with_files(["calls.log", "http.log"]);
    let extra = [
        ("FAKE_MCP_STOP_MODE", "hang"),
        ("FAKE_MCP_HTTP_LOG", http_log.as_str()),
    ];
    let fake = remote_hook(&s, &calls, &extra);
    let timeout = [("BUZZ_AGENT_HOOK_TIMEOUT_MS", "300")];
    let (llm, agent, sid) = hooked_session(ctx, &s, &fake, "guard", &timeout);

    let five = Duration::from_secs(5);
    let started = Instant::now();
    let r = agent.prompt(&sid, "first");
    assert_end_turn(&agent, &r);
    let took = started.elapsed();
    let bounded = format!("the gate is bounded by the hook timeout: {took:?}");
    assert!(took < five, "{bounded}{}", agent.context());
    assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 0, "{r}");
    wait_stderr(&agent, "hook: server 'guard' timed out (1/2)", five);
    let first = stop_calls(&calls);
    assert_eq!(first.len(), 1, "{first:#?}");
    let first_id = first[0]["id"].clone();
    let cancelled = || log_of(&calls).iter().any(|m| is_cancel_of(m, &first_id));
    wait_for(&agent, "the hook call's cancellation", five, cancelled);
    assert!(
        read_http_log(&http_log)
            .iter()
            .all(|e| e["method"] != "DELETE"),
        "one timeout is tolerated: the session stays"
    );

    assert_end_turn(&agent, &agent.prompt(&sid, "second"));
    wait_stderr(
        &agent,
        "hook: killing server 'guard' after 2 consecutive timeouts",
        Duration::from_secs(5),
    );
    let log = wait_log(&http_log, "a DELETE of the session", |l| {
        l.iter().any(|e| e["method"] == "DELETE")
    });
    let hook_session = log
        .iter()
        .find(|e| {
            serde_json::from_str::<Value>(e["body"].as_str().unwrap_or(""))
                .is_ok_and(|b| b["params"]["name"] == "_Stop")
        })
        .map(|e| e["session"].clone());
    let deleted = log.iter().find(|e| e["method"] == "DELETE");
    assert_eq!(
        deleted.map(|e| e["session"].clone()),
        hook_session,
        "the DELETE ends the session the hook calls used: {log:#?}"
    );
    assert_eq!(initializes(&log), 1, "{log:#?}");

    // Past the M9 backoff (0.5 s) the next round starts the server again: a new session.
    std::thread::sleep(Duration::from_millis(1200));
    assert_end_turn(&agent, &agent.prompt(&sid, "third"));
    let log = wait_log(&http_log, "a new initialize after the kill", |l| {
        initializes(l) == 2
    });
    let reinit = log
        .iter()
        .rposition(|e| posted_method(e).as_deref() == Some("initialize"));
    let deleted_at = log.iter().position(|e| e["method"] == "DELETE");
    assert!(
        reinit > deleted_at && log[reinit.unwrap_or(0)]["session"].is_null(),
        "the new initialize carries no session id and follows the DELETE: {log:#?}"
    );
    assert_eq!(llm.requests().len(), 3, "no hook ever objected");
    agent.finish();
}

/// H5 over HTTP: a remote `_Stop` that always objects is honoured exactly
/// `BUZZ_AGENT_STOP_MAX_REJECTIONS` times per prompt (here 2: three end-turn LLM calls), then
/// the gate ends the turn without calling it and the answer says the budget is exhausted.
pub fn h5_m10_a_remote_hook_that_always_objects_spends_the_budget_exactly(ctx: &Ctx) {
    let (s, [calls]) = Scratch::with_files(["calls.log"]);
    let fake = remote_hook(&s, &calls, &[]);
    let budget = [("BUZZ_AGENT_STOP_MAX_REJECTIONS", "2")];
    let (llm, agent, sid) = hooked_session(ctx, &s, &fake, "policy", &budget);
    let r = agent.prompt(&sid, "go");
    assert_end_turn(&agent, &r);
    let spent =
        json!({"rounds": 3, "stopObjections": 2, "stopBudget": 2, "stopBudgetExhausted": true});
    assert_eq!(buzz_meta(&agent, &r), spent, "{r}");
    assert_eq!(llm.requests().len(), 3, "budget 2: exactly 3 LLM calls");
    assert_eq!(
        stop_calls(&calls).len(),
        2,
        "the exhausted gate calls no hook"
    );
    wait_stderr(&agent, "budget of 2 exhausted", Duration::from_secs(10));
    // The budget is per prompt: the next prompt is gated again.
    let r = agent.prompt(&sid, "again");
    assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 2, "{r}");
    assert_eq!(stop_calls(&calls).len(), 4);
    agent.finish();
}

/// X1 over HTTP: an interceptor server reached over Streamable HTTP is listed at session start
/// and its denying validator stops a stdio server's tool call before it runs; the model sees
/// the validator's message as the tool error.
pub fn x1_m10_a_remote_validator_denies_a_tool_call(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let deny = json!([{"name": "no-echo", "type": "validation", "behavior": "deny",
                       "message": "echo is not allowed here"}])
    .to_string();
    let fake = HttpFake::start(
        s.dir.path(),
        &[
            ("FAKE_MCP_CALL_LOG", &p_log),
            ("FAKE_MCP_TOOLS", ""),
            ("FAKE_MCP_INTERCEPTORS", &deny),
        ],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "hi"}))]),
            _ => Reply::text("Done."),
        })
        .env(&[("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy")])
        .servers([
            fake_mcp_entry("fs", &[("FAKE_MCP_CALL_LOG", &fs_log)]),
            fake.entry("policy", &[]),
        ])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "echo hi"));
    assert_eq!(
        fake_mcp::logged_tool_calls(&log_of(&fs_log)).len(),
        0,
        "the call never ran"
    );
    let invoked: Vec<Value> = log_of(&p_log)
        .into_iter()
        .filter(|m| m["method"] == "interceptor/invoke")
        .collect();
    assert_eq!(invoked.len(), 1, "{invoked:#?}");
    assert_eq!(
        invoked[0]["params"]["payload"],
        json!({"name": "echo", "arguments": {"text": "hi"}})
    );
    let text = "blocked by interceptor 'no-echo': echo is not allowed here";
    assert!(
        llm.requests()[1]
            .tool_result_for("call_1")
            .is_some_and(|t| t.contains(text)),
        "the model sees the denial{}",
        agent.context()
    );
    agent.finish();
}
