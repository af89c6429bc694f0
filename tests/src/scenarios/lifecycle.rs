//! The turn's lifecycle under an adversarial client and failing children: permission (SPEC A7),
//! cancellation (A3, A4, case C04), dead servers and restarts (M9), `tools/list_changed` (M6),
//! and shutdown by signal or through a launcher (P1, M8, cases C33, C34).

use super::setup::Setup;
use super::util::{
    Scratch, assert_exits_cleanly, assert_no_survivors, call_then_always, hook_server,
    is_cancel_of, log_of, read_pids, statuses, strs_of, stubborn_launcher, wait_for,
    wait_logged_call,
};
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, content_text};
use crate::fake_mcp::{self, CRASH_STDERR};
use crate::harness::{
    AgentProc, Ctx, PermissionPolicy, assert_tool_updates_well_formed,
    assert_updates_precede_response, fake_mcp_entry, last_tool_update, tool_call_announcements,
    tool_update_text,
};
use crate::procfs;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---- helpers ------------------------------------------------------------------------------------

/// For LLM handlers: waits (up to 15 s) until the call log holds at least `n` messages of
/// `method`, then 200 ms more so the agent has read the reply too. A model "thinking" while a
/// server restarts or re-lists, without a fixed sleep.
fn await_logged(log: &str, method: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while log_of(log).iter().filter(|m| m["method"] == method).count() < n
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
}

/// A permission-asking agent (the harness default is `allow`).
fn ask_env() -> Vec<(&'static str, &'static str)> {
    vec![("BUZZ_AGENT_PERMISSION", "ask")]
}

fn selected(option: &str) -> Value {
    json!({"outcome": {"outcome": "selected", "optionId": option}})
}

fn reply_to(agent: &AgentProc, request: &Value, result: Value) {
    agent.send(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}));
}

/// An LLM that answers a request ending in tool results with text, and anything else with
/// one `call` (id `call_<index>`).
fn call_then_text(call: &'static str, args: Value) -> FakeLlm {
    FakeLlm::with_handler(move |i, req| {
        let last_is_tool = req.messages().last().is_some_and(|m| m["role"] == "tool");
        if last_is_tool {
            Reply::text("ok, moving on")
        } else {
            let id = format!("call_{i}");
            Reply::tool_calls(vec![(id.as_str(), call, args.clone())])
        }
    })
}

/// The `toolCallId` the agent announced for the model call `call_id` (matched by rawInput
/// order is not enough with several calls, so match by position of announcement).
fn announced_ids(agent: &AgentProc, sid: &str) -> Vec<Value> {
    tool_call_announcements(&agent.session_updates(sid))
        .into_iter()
        .map(|a| a["toolCallId"].clone())
        .collect()
}

fn assert_denied(agent: &AgentProc, sid: &str, tool_call_id: &Value, case: &str) {
    let ups = agent.session_updates(sid);
    let last = last_tool_update(&ups, tool_call_id)
        .unwrap_or_else(|| panic!("{case}: no update for {tool_call_id}"));
    assert_eq!(last["status"], "failed", "{case}: {last}");
    assert!(
        tool_update_text(&last).contains("not authorized"),
        "{case}: the failed update says why: {last}"
    );
}

fn model_result(reqs: &[RecordedRequest], call_id: &str) -> String {
    reqs.iter()
        .find_map(|r| r.tool_result_for(call_id))
        .unwrap_or_else(|| panic!("no request carries a result for {call_id}"))
}

fn response_pos(agent: &AgentProc, id: &Value) -> usize {
    agent
        .transcript()
        .iter()
        .position(|m| m.get("method").is_none() && &m["id"] == id)
        .unwrap_or_else(|| panic!("no response to {id}{}", agent.context()))
}

// ---- A7 permission ------------------------------------------------------------------------------

enum Answer {
    Result(Value),
    Error,
}

/// A7: every answer that is not a `selected` allow option denies: reject, `cancelled`, an
/// error reply, malformed results, unknown option ids. The tool never reaches MCP, its update
/// is `failed`, the model gets an error result saying it was not authorized, the turn goes on.
pub fn a7_every_malformed_or_negative_outcome_denies(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(call_then_text("fs__echo", json!({"text": "secret op"})))
        .env(&ask_env())
        .permission(PermissionPolicy::NoReply)
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let cases: Vec<(&str, Answer)> = vec![
        ("reject_once", Answer::Result(selected("reject_once"))),
        (
            "cancelled outcome",
            Answer::Result(json!({"outcome": {"outcome": "cancelled"}})),
        ),
        ("error reply", Answer::Error),
        ("empty object", Answer::Result(json!({}))),
        ("null result", Answer::Result(Value::Null)),
        ("string result", Answer::Result(json!("allow_once"))),
        (
            "outcome as a string",
            Answer::Result(json!({"outcome": "allow_once"})),
        ),
        (
            "selected without optionId",
            Answer::Result(json!({"outcome": {"outcome": "selected"}})),
        ),
        (
            "optionId without selected",
            Answer::Result(json!({"outcome": {"optionId": "allow_once"}})),
        ),
        (
            "optionId not a string",
            Answer::Result(json!({"outcome": {"outcome": "selected", "optionId": ["allow_once"]}})),
        ),
        (
            "unknown optionId",
            Answer::Result(selected("allow_forever")),
        ),
        (
            "optionId in other case",
            Answer::Result(selected("ALLOW_ONCE")),
        ),
        (
            "allow under another outcome",
            Answer::Result(json!({"outcome": {"outcome": "allowed", "optionId": "allow_once"}})),
        ),
    ];
    for (n, (case, answer)) in cases.iter().enumerate() {
        let prompt = agent.start_prompt(&sid, &format!("case {n}: run echo"));
        agent.wait_until(
            &format!("permission request {}", n + 1),
            Duration::from_secs(20),
            |t| {
                t.iter()
                    .filter(|m| m["method"] == "session/request_permission")
                    .count()
                    > n
            },
        );
        let req = agent.permission_requests()[n].clone();
        let p = &req["params"];
        assert_eq!(p["sessionId"], json!(sid), "{case}: {req}");
        let kinds = strs_of(&p["options"], "kind");
        for k in ["allow_once", "allow_always", "reject_once", "reject_always"] {
            assert!(kinds.contains(&k), "{case}: option {k} missing: {req}");
        }
        let tc = &p["toolCall"];
        assert_eq!(
            tc["rawInput"],
            json!({"text": "secret op"}),
            "{case}: {req}"
        );
        let announced = announced_ids(&agent, &sid);
        assert_eq!(
            announced.last(),
            Some(&tc["toolCallId"]),
            "{case}: the permission names the announced call: {req}"
        );
        match answer {
            Answer::Result(r) => reply_to(&agent, &req, r.clone()),
            Answer::Error => agent.send(&json!({"jsonrpc": "2.0", "id": req["id"],
                "error": {"code": -32603, "message": "client exploded"}})),
        }
        let r = agent.wait_response(&prompt, Duration::from_secs(20));
        assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{case}: {r}");
        assert_denied(&agent, &sid, &tc["toolCallId"], case);
        let reqs = llm.requests();
        let text = model_result(&reqs, &format!("call_{}", 2 * n));
        assert!(
            text.contains("not authorized"),
            "{case}: the model is told: {text:?}"
        );
        reqs.last().expect("a request").assert_tool_calls_paired();
    }
    let logged = log_of(&log);
    assert!(
        fake_mcp::logged_tool_calls(&logged).is_empty(),
        "A7: a denied tool reached the server: {logged:#?}"
    );
    assert_tool_updates_well_formed(&agent.session_updates(&sid));
    agent.finish();
}

/// A7: `allow_once` runs the tool exactly once, and only after the answer was sent; a repeated
/// answer to the same request runs nothing more.
pub fn a7_allow_runs_exactly_once_after_the_answer(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let policy = {
        let seen = seen.clone();
        let log = log.clone();
        PermissionPolicy::Custom(Arc::new(move |params| {
            // Hold the answer back: nothing may run meanwhile.
            std::thread::sleep(Duration::from_millis(400));
            let n = fake_mcp::logged_tool_calls(&log_of(&log)).len();
            seen.lock().unwrap_or_else(|e| e.into_inner()).push(n);
            let _ = params;
            Some(selected("allow_once"))
        }))
    };
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(call_then_text("fs__echo", json!({"text": "allowed"})))
        .env(&ask_env())
        .permission(policy)
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let r = agent.prompt(&sid, "echo please");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert_eq!(
        *seen.lock().unwrap_or_else(|e| e.into_inner()),
        [0],
        "one permission request, and no tools/call before its answer"
    );
    assert_eq!(fake_mcp::count_calls(&log_of(&log), "echo"), 1);
    let t = agent.transcript();
    let asked = t
        .iter()
        .position(|m| m["method"] == "session/request_permission")
        .expect("a permission request");
    let started = t
        .iter()
        .position(|m| m["params"]["update"]["status"] == "in_progress")
        .expect("an in_progress update");
    assert!(asked < started, "in_progress before the permission request");
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(terminal.len(), 1);
    assert_eq!(terminal[0]["status"], "completed", "{}", terminal[0]);
    assert_eq!(model_result(&llm.requests(), "call_0"), "allowed");

    // A duplicate (late) answer to the same permission request is dropped.
    let req = agent.permission_requests()[0].clone();
    reply_to(&agent, &req, selected("allow_once"));
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        fake_mcp::count_calls(&log_of(&log), "echo"),
        1,
        "a repeated answer ran the tool again"
    );
    agent.finish();
}

/// A7: `allow_always` / `reject_always` are remembered per qualified tool name for the rest of
/// the session — no second question — and not across sessions.
pub fn a7_allow_always_is_remembered_per_tool(ctx: &Ctx) {
    let (s, [log1, log2]) = Scratch::with_files(["s1.log", "s2.log"]);
    let server = |log: &str| {
        fake_mcp_entry(
            "fs",
            &[("FAKE_MCP_TOOLS", "echo,add"), ("FAKE_MCP_CALL_LOG", log)],
        )
    };
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "one"}))]),
            Reply::text("ok1"),
            Reply::tool_calls(vec![
                ("call_2", "fs__echo", json!({"text": "two"})),
                ("call_3", "fs__add", json!({"a": 1, "b": 2})),
            ]),
            Reply::tool_calls(vec![("call_4", "fs__add", json!({"a": 3, "b": 4}))]),
            Reply::text("ok2"),
            Reply::tool_calls(vec![("call_5", "fs__echo", json!({"text": "three"}))]),
            Reply::text("ok3"),
        ])
        .env(&ask_env())
        .permission(PermissionPolicy::Custom(Arc::new(|p| {
            let title = p["toolCall"]["title"].as_str().unwrap_or_default();
            Some(if title.ends_with("echo") {
                selected("allow_always")
            } else {
                selected("reject_always")
            })
        })))
        .servers([server(&log1)])
        .start();
    let r = agent.prompt(&sid, "first");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let r = agent.prompt(&sid, "second");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let titles: Vec<String> = agent
        .permission_requests()
        .iter()
        .map(|m| {
            m["params"]["toolCall"]["title"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        titles,
        ["fs: echo", "fs: add"],
        "asked once per tool: echo (allow_always), add (reject_always)"
    );
    let reqs = llm.requests();
    assert_eq!(
        model_result(&reqs, "call_2"),
        "two",
        "remembered allow runs"
    );
    assert!(model_result(&reqs, "call_3").contains("not authorized"));
    assert!(
        model_result(&reqs, "call_4").contains("not authorized"),
        "remembered reject denies without asking"
    );
    let logged = log_of(&log1);
    assert_eq!(fake_mcp::count_calls(&logged, "echo"), 2);
    assert_eq!(fake_mcp::count_calls(&logged, "add"), 0);
    let ids = announced_ids(&agent, &sid);
    assert_eq!(ids.len(), 4);
    assert_denied(&agent, &sid, &ids[3], "remembered reject_always");

    // A new session asks again.
    let sid2 = agent.new_session(&s.ws, json!([server(&log2)]));
    let r = agent.prompt(&sid2, "third");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert_eq!(
        agent.permission_requests().len(),
        3,
        "the memory is per session"
    );
    assert_eq!(
        agent.permission_requests()[2]["params"]["sessionId"],
        json!(sid2)
    );
    assert_eq!(fake_mcp::count_calls(&log_of(&log2), "echo"), 1);
    agent.finish();
}

/// A7: no answer within BUZZ_AGENT_PERMISSION_TIMEOUT_SECS denies; a late answer is dropped.
pub fn a7_permission_timeout_denies(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(call_then_text("fs__echo", json!({"text": "x"})))
        .env(&ask_env())
        .env(&[("BUZZ_AGENT_PERMISSION_TIMEOUT_SECS", "1")])
        .permission(PermissionPolicy::NoReply)
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let started = Instant::now();
    let r = agent.prompt_timeout(&sid, "go", Duration::from_secs(20));
    let took = started.elapsed();
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "denied after about 1 s, took {took:?}"
    );
    assert_eq!(agent.permission_requests().len(), 1);
    let ids = announced_ids(&agent, &sid);
    assert_denied(&agent, &sid, &ids[0], "timeout");
    assert!(model_result(&llm.requests(), "call_0").contains("not authorized"));

    let req = agent.permission_requests()[0].clone();
    reply_to(&agent, &req, selected("allow_once"));
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        fake_mcp::logged_tool_calls(&log_of(&log)).is_empty(),
        "a late allow ran the tool"
    );
    assert_updates_precede_response(&agent, &sid, &r["id"]);
    agent.finish();
}

/// A7/L2: parallel calls of one response each ask (all questions are out before any answer),
/// each answer decides its own call, results come back in call order.
pub fn a7_parallel_calls_each_ask(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![
                ("call_a", "fs__echo", json!({"text": "A"})),
                ("call_b", "fs__echo", json!({"text": "B"})),
                ("call_c", "fs__add", json!({"a": 20, "b": 22})),
            ]),
            Reply::text("done"),
        ])
        .env(&ask_env())
        .permission(PermissionPolicy::NoReply)
        .fake_mcp(
            "fs",
            &[("FAKE_MCP_TOOLS", "echo,add"), ("FAKE_MCP_CALL_LOG", &log)],
        )
        .start();
    let prompt = agent.start_prompt(&sid, "three calls");
    agent.wait_until("three permission requests", Duration::from_secs(20), |t| {
        t.iter()
            .filter(|m| m["method"] == "session/request_permission")
            .count()
            == 3
    });
    let asks = agent.permission_requests();
    let asked: Vec<Value> = asks
        .iter()
        .map(|m| m["params"]["toolCall"]["toolCallId"].clone())
        .collect();
    let ids = announced_ids(&agent, &sid);
    assert_eq!(asked, ids, "one question per call, in call order");
    let out_ids: Vec<&Value> = asks.iter().map(|m| &m["id"]).collect();
    assert!(
        out_ids[0] != out_ids[1] && out_ids[1] != out_ids[2] && out_ids[0] != out_ids[2],
        "distinct request ids: {out_ids:?}"
    );
    // Answer in reverse order.
    reply_to(&agent, &asks[2], selected("allow_once"));
    reply_to(&agent, &asks[1], selected("reject_once"));
    reply_to(&agent, &asks[0], selected("allow_once"));
    let r = agent.wait_response(&prompt, Duration::from_secs(20));
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    reqs[1].assert_tool_calls_paired();
    let results: Vec<(String, String)> = reqs[1].tool_results();
    let order: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        order,
        ["call_a", "call_b", "call_c"],
        "results in call order"
    );
    assert_eq!(results[0].1, "A");
    assert!(results[1].1.contains("not authorized"), "{results:?}");
    assert_eq!(results[2].1, "42");
    let logged = log_of(&log);
    let args: Vec<Value> = fake_mcp::logged_tool_calls(&logged)
        .iter()
        .map(|c| c["params"]["arguments"].clone())
        .collect();
    assert_eq!(args.len(), 2, "{args:?}");
    assert!(args.contains(&json!({"text": "A"})) && args.contains(&json!({"a": 20, "b": 22})));
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(statuses(&terminal), ["completed", "failed", "completed"]);
    agent.finish();
}

// ---- A4 cancellation ----------------------------------------------------------------------------

/// Waits for the response to a cancelled prompt: `cancelled`, within `bound` of `since`, with
/// no update after it (checked again after a pause) and no zero `usage`.
fn expect_cancelled(agent: &AgentProc, sid: &str, prompt: &Value, since: Instant, bound: Duration) {
    let r = agent.wait_response(prompt, bound + Duration::from_secs(10));
    let took = since.elapsed();
    assert_eq!(
        agent.result(&r)["stopReason"],
        "cancelled",
        "A4: a cancelled prompt is answered cancelled, never an error: {r}"
    );
    assert!(
        took < bound,
        "A4: the cancelled prompt was answered after {took:?} (bound {bound:?}){}",
        agent.context()
    );
    if let Some(u) = r["result"].get("usage") {
        assert!(
            u.as_object()
                .is_some_and(|o| o.values().any(|v| v.as_u64() != Some(0))),
            "C04: omit usage rather than report zeros: {r}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_tool_updates_well_formed(&agent.session_updates(sid));
    assert_updates_precede_response(agent, sid, prompt);
}

/// After a cancelled prompt, the next one runs to `end_turn` with a provider-valid request.
fn next_prompt_works(agent: &AgentProc, llm: &FakeLlm, sid: &str, text: &str) -> RecordedRequest {
    let before = llm.requests().len();
    let r = agent.prompt(sid, text);
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert!(reqs.len() > before, "the next prompt called the LLM");
    let req = reqs[before].clone();
    req.assert_tool_calls_paired();
    let msgs = req.messages();
    let last = msgs.last().cloned().unwrap_or_default();
    // A cancelled prompt that got no answer shares the user message with the new one (L10).
    assert!(
        last["role"] == "user" && content_text(&last["content"]).ends_with(text),
        "the new prompt ends the request: {msgs:#?}"
    );
    req
}

/// A4/C04: cancel while the LLM is streaming (the body stalls): answered `cancelled` at once;
/// the next prompt works.
pub fn a4_c04_cancel_during_llm_stream(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::text("Thinking about it, at length").stall_after_first_text(30_000),
            _ => Reply::text("second answer"),
        })
        .fake_mcp("fs", &[])
        .start();
    let prompt = agent.start_prompt(&sid, "think long");
    agent.wait_until("the first streamed chunk", Duration::from_secs(20), |t| {
        t.iter()
            .any(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
    });
    let since = Instant::now();
    agent.cancel(&sid);
    expect_cancelled(&agent, &sid, &prompt, since, Duration::from_secs(3));
    assert_eq!(llm.requests().len(), 1, "no retry of a cancelled stream");
    next_prompt_works(&agent, &llm, &sid, "say ok");
    agent.finish();
}

/// A4/L5: cancel during a 30 s `retry-after` backoff: answered at once, no retry is made.
pub fn a4_cancel_during_backoff(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::status(
                429,
                vec![("retry-after", "30")],
                r#"{"error":{"message":"rate limited"}}"#,
            ),
            _ => Reply::text("fine now"),
        })
        .start();
    let prompt = agent.start_prompt(&sid, "hello");
    wait_for(&agent, "the retry backoff", Duration::from_secs(20), || {
        agent.stderr_text().contains("retrying in")
    });
    let since = Instant::now();
    agent.cancel(&sid);
    expect_cancelled(&agent, &sid, &prompt, since, Duration::from_secs(3));
    assert_eq!(
        llm.requests().len(),
        1,
        "the cancelled backoff made no retry"
    );
    next_prompt_works(&agent, &llm, &sid, "say ok");
    assert_eq!(llm.requests().len(), 2);
    agent.finish();
}

/// A4/A7: cancel while a permission question is pending: answered `cancelled`, the call ends
/// `failed` before the response, the tool never runs — not even on a late allow.
pub fn a4_cancel_during_permission_wait(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(call_then_text("fs__echo", json!({"text": "x"})))
        .env(&ask_env())
        .permission(PermissionPolicy::NoReply)
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let prompt = agent.start_prompt(&sid, "run it");
    agent.wait_until("the permission request", Duration::from_secs(20), |t| {
        t.iter()
            .any(|m| m["method"] == "session/request_permission")
    });
    let since = Instant::now();
    agent.cancel(&sid);
    expect_cancelled(&agent, &sid, &prompt, since, Duration::from_secs(3));
    let ids = announced_ids(&agent, &sid);
    let last = last_tool_update(&agent.session_updates(&sid), &ids[0]).unwrap_or_default();
    assert_eq!(last["status"], "failed", "{last}");

    let req = agent.permission_requests()[0].clone();
    reply_to(&agent, &req, selected("allow_once"));
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        fake_mcp::logged_tool_calls(&log_of(&log)).is_empty(),
        "the abandoned permission's late allow ran the tool"
    );
    assert_updates_precede_response(&agent, &sid, &prompt);
    agent.set_permission_policy(PermissionPolicy::AllowOnce);
    let req = next_prompt_works(&agent, &llm, &sid, "say ok");
    assert!(
        req.tool_result_for("call_0").is_some(),
        "L4: the cancelled call has its result in history"
    );
    agent.finish();
}

/// A4/C04/M5: cancel during a running tool call: the server gets `notifications/cancelled` with
/// the call's request id and a reason, the cancel notification is never answered, the call reaches `failed` (saying it was cancelled) before the prompt
/// response, nothing follows the response, and the next prompt runs on a valid history.
pub fn a4_c04_cancel_during_tool_call_sends_notifications_cancelled(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::tool_calls(vec![("call_slow", "fs__slow", json!({"ms": 60000}))]),
            _ => Reply::text("ok"),
        })
        .fake_mcp(
            "fs",
            &[("FAKE_MCP_TOOLS", "slow"), ("FAKE_MCP_CALL_LOG", &log)],
        )
        .start();
    let prompt = agent.start_prompt(&sid, "call the slow tool");
    let call_id = wait_logged_call(&agent, &log, "slow");
    agent.wait_until("in_progress", Duration::from_secs(10), |t| {
        t.iter()
            .any(|m| m["params"]["update"]["status"] == "in_progress")
    });
    let since = Instant::now();
    agent.cancel(&sid);
    expect_cancelled(&agent, &sid, &prompt, since, Duration::from_secs(3));
    let logged = log_of(&log);
    let cancels: Vec<&Value> = logged
        .iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .collect();
    assert_eq!(cancels.len(), 1, "{logged:#?}");
    assert_eq!(
        cancels[0]["params"]["requestId"], call_id,
        "A4: notifications/cancelled names the in-flight request"
    );
    assert!(
        cancels[0].get("id").is_none(),
        "a notification, not a request"
    );
    assert!(
        cancels[0]["params"]["reason"]
            .as_str()
            .is_some_and(|r| !r.trim().is_empty()),
        "C04: notifications/cancelled carries a reason: {}",
        cancels[0]
    );
    assert!(
        agent.null_id_responses().is_empty(),
        "C04: the session/cancel notification got a response: {:#?}",
        agent.null_id_responses()
    );
    let ids = announced_ids(&agent, &sid);
    let last = last_tool_update(&agent.session_updates(&sid), &ids[0]).unwrap_or_default();
    assert_eq!(last["status"], "failed", "{last}");
    assert!(
        tool_update_text(&last).to_lowercase().contains("cancel"),
        "C04: the failed content says it was cancelled: {last}"
    );
    let req = next_prompt_works(&agent, &llm, &sid, "say ok");
    assert!(
        req.tool_result_for("call_slow")
            .is_some_and(|t| t.to_lowercase().contains("cancel")),
        "the model learns the call was cancelled"
    );
    agent.finish();
}

/// A4/H3: cancel while `_Stop` hooks run: hooks are not cancelled, their timeout bounds the
/// wait; the prompt is answered `cancelled` within about one hook timeout, and an objection that
/// arrives meanwhile starts no new round.
pub fn a4_cancel_during_hook_gate_finishes_within_timeout_then_cancelled(ctx: &Ctx) {
    let (s, [log_hang, log_obj]) = Scratch::with_files(["hang.log", "obj.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("I am done."))
        .env(&[
            ("MCP_HOOK_SERVERS", "hang,obj"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "1500"),
        ])
        .servers([
            hook_server("hang", &log_hang, &[("FAKE_MCP_STOP_MODE", "hang")]),
            hook_server("obj", &log_obj, &[("FAKE_MCP_STOP_DELAY_MS", "400")]),
        ])
        .start();
    let prompt = agent.start_prompt(&sid, "finish up");
    let hook_id = wait_logged_call(&agent, &log_hang, "_Stop");
    let since = Instant::now();
    agent.cancel(&sid);
    expect_cancelled(
        &agent,
        &sid,
        &prompt,
        since,
        Duration::from_millis(1500 + 2500),
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "a cancelled turn makes no new round for an objection"
    );
    assert_eq!(fake_mcp::count_calls(&log_of(&log_obj), "_Stop"), 1);
    wait_for(
        &agent,
        "the hook's cancellation",
        Duration::from_secs(5),
        || log_of(&log_hang).iter().any(|m| is_cancel_of(m, &hook_id)),
    );
    assert!(
        tool_call_announcements(&agent.session_updates(&sid)).is_empty(),
        "H8: hooks are no ACP tool calls"
    );
    agent.finish();
}

/// A3/A4/C04: a prompt while a turn runs is `-32602`; cancel immediately followed by a new
/// prompt: the first is answered `cancelled` (once), then the second runs to `end_turn` on a
/// provider-valid history.
pub fn a4_a3_cancel_then_prompt_runs_the_new_prompt_after(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::tool_calls(vec![("call_slow", "fs__slow", json!({"ms": 60000}))]),
            _ => Reply::text("second prompt done"),
        })
        .fake_mcp(
            "fs",
            &[("FAKE_MCP_TOOLS", "slow"), ("FAKE_MCP_CALL_LOG", &log)],
        )
        .start();
    let first = agent.start_prompt(&sid, "call the slow tool");
    wait_logged_call(&agent, &log, "slow");
    let busy = agent.prompt(&sid, "me too");
    let (code, msg) = agent.error(&busy);
    assert_eq!(code, -32602, "A3: {busy}");
    assert!(msg.contains("in flight"), "{msg}");

    let second_text = "now say ok";
    let second = agent.next_id();
    let mut bytes =
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
            .to_string();
    bytes.push('\n');
    bytes.push_str(
        &json!({"jsonrpc": "2.0", "id": second, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": second_text}]}})
        .to_string(),
    );
    bytes.push('\n');
    let since = Instant::now();
    agent.send_raw(bytes.as_bytes());
    let r1 = agent.wait_response(&first, Duration::from_secs(10));
    assert_eq!(agent.result(&r1)["stopReason"], "cancelled", "{r1}");
    assert!(
        since.elapsed() < Duration::from_secs(3),
        "{:?}",
        since.elapsed()
    );
    let r2 = agent.wait_response(&second, Duration::from_secs(20));
    assert_eq!(agent.result(&r2)["stopReason"], "end_turn", "{r2}");
    assert!(response_pos(&agent, &first) < response_pos(&agent, &second));

    // Turn 1's tool updates all precede its response.
    let t = agent.transcript();
    let p1 = response_pos(&agent, &first);
    let ids = announced_ids(&agent, &sid);
    assert_eq!(ids.len(), 1);
    assert!(
        !t[p1..]
            .iter()
            .any(|m| m["params"]["update"]["toolCallId"] == ids[0]),
        "an update of the cancelled call after its response"
    );
    assert_tool_updates_well_formed(&agent.session_updates(&sid));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one request for the second prompt");
    reqs[1].assert_tool_calls_paired();
    assert!(reqs[1].tool_result_for("call_slow").is_some());
    let last = reqs[1].messages().last().cloned().unwrap_or_default();
    assert_eq!(content_text(&last["content"]), second_text);
    // The fake server logs the notification on its own reader thread: under load that can lag
    // behind the second prompt's answer, so wait for it (sent before the first response).
    wait_for(
        &agent,
        "notifications/cancelled in the call log",
        Duration::from_secs(10),
        || {
            log_of(&log)
                .iter()
                .any(|m| m["method"] == "notifications/cancelled")
        },
    );
    agent.finish();
}

/// A4/C04: cancel with no turn running (notification or request, known or unknown session) does
/// nothing (a request is answered `null`); cancel sent twice answers the prompt once; a stale
/// cancel does not touch the next prompt.
pub fn a4_c04_cancel_when_idle_and_twice_is_harmless(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::text("first"),
            1 => Reply::tool_calls(vec![("call_slow", "fs__slow", json!({"ms": 60000}))]),
            _ => Reply::text("later"),
        })
        .fake_mcp(
            "fs",
            &[("FAKE_MCP_TOOLS", "slow"), ("FAKE_MCP_CALL_LOG", &log)],
        )
        .start();
    let before = agent.transcript().len();
    agent.cancel(&sid);
    agent.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "nope"}}),
    );
    let r = agent.request("session/cancel", json!({"sessionId": sid}));
    assert_eq!(
        r["result"],
        Value::Null,
        "A4: as a request it is answered null: {r}"
    );
    assert!(r.get("error").is_none(), "{r}");
    let r = agent.request("session/cancel", json!({"sessionId": "nope"}));
    assert!(r.get("error").is_none(), "unknown session: ignored: {r}");
    assert_eq!(
        agent.transcript().len(),
        before + 2,
        "idle cancels produce nothing but the two answers: {:#?}",
        &agent.transcript()[before..]
    );
    let r = agent.prompt(&sid, "after idle cancels");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");

    let prompt = agent.start_prompt(&sid, "call the slow tool");
    wait_logged_call(&agent, &log, "slow");
    let since = Instant::now();
    agent.cancel(&sid);
    agent.cancel(&sid);
    expect_cancelled(&agent, &sid, &prompt, since, Duration::from_secs(3));
    let cancels = log_of(&log)
        .iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .count();
    assert_eq!(cancels, 1, "one notifications/cancelled for two cancels");
    // A stale cancel after the turn ended does not cancel the next prompt.
    agent.cancel(&sid);
    next_prompt_works(&agent, &llm, &sid, "say ok");
    agent.assert_no_violations();
    agent.finish();
}

// ---- M9 dead servers, M6 list_changed ----------------------------------------------------------

/// M9/M7: a server that crashed keeps its tools listed; a call within the backoff fails fast
/// with `recovering`; a call made once the backoff is over restarts it (no round started
/// after the backoff, so nothing else restarts it), waits through its slow handshake and
/// succeeds.
pub fn m9_crashed_server_recovers_after_backoff(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let echo =
        |id: &str, text: &str| Reply::tool_calls(vec![(id, "fs__echo", json!({"text": text}))]);
    let log2 = log.clone();
    // The `initialize`s logged when round 3 began: its top comes within the backoff.
    let inits_at_round_3 = Arc::new(AtomicUsize::new(usize::MAX));
    let seen = inits_at_round_3.clone();
    let llm = FakeLlm::with_handler(move |i, _| match i {
        0 => echo("call_a", "a"),
        1 => echo("call_b", "b"),
        // Right after the crash: inside the 0.5 s backoff.
        2 => echo("call_c", "c"),
        // The model thinks past the backoff; its call finds the server dead and restarts it.
        3 => {
            let inits = log_of(&log2)
                .iter()
                .filter(|m| m["method"] == "initialize")
                .count();
            seen.store(inits, Ordering::SeqCst);
            echo("call_d", "d").delay_ms(1000)
        }
        _ => Reply::text("all done"),
    });
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(llm)
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_CRASH_AFTER", "1"),
                ("FAKE_MCP_CALL_LOG", &log),
                ("FAKE_MCP_INIT_DELAY_MS", "400"),
            ],
        )
        .start();
    let r = agent.prompt_timeout(&sid, "echo a b c d", Duration::from_secs(40));
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    for req in &reqs {
        req.assert_tool_calls_paired();
        assert!(
            req.tool_names().contains(&"fs__echo".to_string()),
            "M9: a recovering server keeps its tools listed: {:?}",
            req.tool_names()
        );
    }
    let last = &reqs[4];
    assert_eq!(last.tool_result_for("call_a").as_deref(), Some("a"));
    let b = last.tool_result_for("call_b").unwrap_or_default();
    assert!(
        b.contains(CRASH_STDERR) && b.to_lowercase().contains("exit"),
        "M7: the crash names the exit and stderr: {b:?}"
    );
    let c = last.tool_result_for("call_c").unwrap_or_default();
    assert!(
        c.contains("server 'fs' is recovering"),
        "M9: a call to a dead server within its backoff fails fast: {c:?}"
    );
    assert_eq!(
        inits_at_round_3.load(Ordering::SeqCst),
        1,
        "no restart before the call that found the backoff over"
    );
    assert_eq!(
        last.tool_result_for("call_d").as_deref(),
        Some("d"),
        "M9: the call after the backoff restarts the server, waits for it and succeeds"
    );
    let logged = log_of(&log);
    let inits = logged
        .iter()
        .filter(|m| m["method"] == "initialize")
        .count();
    assert_eq!(inits, 2, "one restart handshake: {logged:#?}");
    let echoes: Vec<Value> = fake_mcp::logged_tool_calls(&logged)
        .iter()
        .map(|c| c["params"]["arguments"]["text"].clone())
        .collect();
    assert_eq!(
        echoes,
        [json!("a"), json!("b"), json!("d")],
        "c never reached a server"
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(
        statuses(&terminal),
        ["completed", "failed", "failed", "completed"]
    );
    agent.finish();
}

/// M9: three deaths without one successful call in between make a server permanently dead: its
/// tools leave the model's list (another server's stay) and it is not restarted again.
pub fn m9_three_deaths_make_it_permanent_and_tools_leave_the_list(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let crash = |id: &str| Reply::tool_calls(vec![(id, "fs__crash", json!({}))]);
    let wait = |id: &str| Reply::tool_calls(vec![(id, "keep__echo", json!({"text": "tick"}))]);
    let log2 = log.clone();
    // A death, then a round that outlasts the 0.5 s backoff, then (once the lazy restart has
    // listed the tools again) the next death.
    let llm = FakeLlm::with_handler(move |i, _| match i {
        0 => crash("call_1"),
        1 => wait("call_w1").delay_ms(1000),
        2 => {
            await_logged(&log2, "tools/list", 2);
            crash("call_2")
        }
        3 => wait("call_w2").delay_ms(1000),
        4 => {
            await_logged(&log2, "tools/list", 3);
            crash("call_3")
        }
        5 => Reply::tool_calls(vec![("call_4", "fs__echo", json!({"text": "anyone?"}))]),
        6 => Reply::text("giving up on fs"),
        7 => Reply::text("yes").delay_ms(700),
        _ => Reply::status(500, vec![], r#"{"error":{"message":"script exhausted"}}"#),
    });
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(llm)
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_TOOLS", "echo,crash"),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )
        .fake_mcp("keep", &[])
        .start();
    let r = agent.prompt_timeout(&sid, "crash it three times", Duration::from_secs(40));
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 7);
    let has_fs = |req: &RecordedRequest| req.tool_names().iter().any(|n| n.starts_with("fs__"));
    for (i, req) in reqs.iter().enumerate() {
        req.assert_tool_calls_paired();
        assert!(
            req.tool_names().contains(&"keep__echo".to_string()),
            "request {i}: the healthy server's tools stay"
        );
        assert_eq!(
            has_fs(req),
            i < 5,
            "request {i}: fs tools listed while recovering, gone once permanent: {:?}",
            req.tool_names()
        );
    }
    let last = &reqs[6];
    for id in ["call_1", "call_2", "call_3"] {
        let t = last.tool_result_for(id).unwrap_or_default();
        assert!(t.contains(CRASH_STDERR), "{id}: {t:?}");
    }
    let t4 = last.tool_result_for("call_4").unwrap_or_default();
    assert!(
        t4.contains("unknown tool") || t4.contains("fs"),
        "a call to a permanently dead server's tool fails: {t4:?}"
    );
    let logged = log_of(&log);
    let inits = logged
        .iter()
        .filter(|m| m["method"] == "initialize")
        .count();
    assert_eq!(
        inits, 3,
        "two restarts, none after the third death: {logged:#?}"
    );
    assert_eq!(fake_mcp::count_calls(&logged, "echo"), 0);
    assert!(
        agent.stderr_text().contains("permanently dead"),
        "the permanent death is logged{}",
        agent.context()
    );
    // A later prompt (well past any backoff) does not resurrect it.
    let r = agent.prompt(&sid, "still there?");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 8);
    assert!(!has_fs(&reqs[7]), "{:?}", reqs[7].tool_names());
    let inits = log_of(&log)
        .iter()
        .filter(|m| m["method"] == "initialize")
        .count();
    assert_eq!(inits, 3, "no restart after the permanent death");
    agent.finish();
}

/// M6: `notifications/tools/list_changed` makes the agent re-list; the new tool is offered in
/// a later round and its calls are routed to the server.
pub fn m6_tools_list_changed_relists(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let log2 = log.clone();
    let llm = FakeLlm::with_handler(move |i, _| match i {
        0 => Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "first"}))]),
        1 => {
            // The "model" thinks while the agent re-lists.
            await_logged(&log2, "tools/list", 2);
            Reply::tool_calls(vec![("call_2", "fs__echo", json!({"text": "second"}))])
        }
        2 => Reply::tool_calls(vec![("call_3", "fs__late", json!({"text": "new tool"}))]),
        _ => Reply::text("done"),
    });
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(llm)
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_LIST_CHANGED_AFTER_CALL", "1"),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )
        .start();
    let r = agent.prompt(&sid, "use the tools");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    assert!(!reqs[0].tool_names().contains(&"fs__late".to_string()));
    assert!(
        reqs[2].tool_names().contains(&"fs__late".to_string()),
        "M6: the new tool is offered after list_changed: {:?}",
        reqs[2].tool_names()
    );
    assert_eq!(
        reqs[3].tool_result_for("call_3").as_deref(),
        Some("new tool")
    );
    let logged = log_of(&log);
    let lists = logged
        .iter()
        .filter(|m| m["method"] == "tools/list")
        .count();
    assert_eq!(lists, 2, "one re-list: {logged:#?}");
    assert_eq!(fake_mcp::count_calls(&logged, "late"), 1);
    agent.finish();
}

// ---- P1 / M8 shutdown ---------------------------------------------------------------------------

/// P1/M8/C33: SIGTERM, SIGINT and SIGHUP (the client's terminal went away; handled like
/// SIGTERM, docs/configuration.md) to the agent during a tool call: the pending prompt is
/// answered `cancelled`, the server gets `notifications/cancelled`, the agent exits 0 within
/// 5 s, and no process of any server group survives.
pub fn p1_c33_sigterm_sigint_and_sighup_shut_down_cleanly(ctx: &Ctx) {
    for (signal, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let (s, [pids_a, pids_b, log]) = Scratch::with_files(["a.pids", "b.pids", "a.log"]);
        let (_llm, agent, sid) = Setup::new(ctx, &s)
            .handler(call_then_always(
                "a__slow",
                json!({"ms": 60000}),
                "unexpected extra round",
            ))
            .fake_mcp(
                "a",
                &[
                    ("FAKE_MCP_TOOLS", "slow"),
                    ("FAKE_MCP_GRANDCHILD_PIDFILE", &pids_a),
                    ("FAKE_MCP_CALL_LOG", &log),
                ],
            )
            .fake_mcp("b", &[("FAKE_MCP_GRANDCHILD_PIDFILE", &pids_b)])
            .start();
        let (server_a, grand_a) = read_pids(&pids_a);
        let (server_b, grand_b) = read_pids(&pids_b);
        let prompt = agent.start_prompt(&sid, "run the slow tool");
        let call_id = wait_logged_call(&agent, &log, "slow");
        let mut watched = procfs::descendants(agent.pid());
        watched.extend([server_a, grand_a, server_b, grand_b]);

        assert_exits_cleanly(
            &agent,
            Duration::from_secs(10),
            Duration::from_secs(5),
            &format!("P1 {name}"),
            // SAFETY: kill(2) on our own child's pid.
            || unsafe {
                libc::kill(agent.pid(), signal);
            },
        );
        assert_no_survivors(
            &watched,
            &[server_a, server_b],
            Duration::from_secs(1),
            &format!("M8 {name}"),
        );
        let r = agent.wait_response(&prompt, Duration::from_secs(2));
        assert_eq!(
            agent.result(&r)["stopReason"],
            "cancelled",
            "P1 {name}: the pending prompt is answered: {r}"
        );
        assert!(
            log_of(&log).iter().any(|m| is_cancel_of(m, &call_id)),
            "{name}: the in-flight call is cancelled"
        );
        assert_tool_updates_well_formed(&agent.session_updates(&sid));
        agent.finish();
    }
}

/// M8/C34 (agent exit path; the other teardown paths are in `cases`): the server command is
/// an `sh -c` launcher that ignores SIGTERM and runs the real server in the background, itself
/// ignoring SIGTERM and stdin EOF (with a grandchild of its own): after EOF the agent escalates
/// to SIGKILL of the group and nothing of it survives.
pub fn m8_c34_sh_c_launcher_with_term_ignoring_grandchild_is_killed_on_agent_exit(ctx: &Ctx) {
    let (s, [pids]) = Scratch::with_files(["pids"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "wrapped__echo", json!({"text": "via sh"}))]),
            Reply::text("ok"),
        ])
        .servers([stubborn_launcher("wrapped", &pids, &[])])
        .start();
    let r = agent.prompt(&sid, "call through the launcher");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert_eq!(
        llm.requests()[1].tool_result_for("call_1").as_deref(),
        Some("via sh")
    );
    let (server, grand) = read_pids(&pids);
    let sh = procfs::stat(server).map(|st| st.ppid).unwrap_or_default();
    let sh_stat = procfs::stat(sh).unwrap_or_else(|| panic!("launcher {sh} not running"));
    assert_eq!(
        sh_stat.ppid,
        agent.pid(),
        "the launcher is the agent's child"
    );
    assert_eq!(sh_stat.pgid, sh, "M1: the launcher leads its own group");
    for p in [server, grand] {
        assert_eq!(
            procfs::stat(p).map(|st| st.pgid),
            Some(sh),
            "{p} in the launcher's group"
        );
    }
    assert_exits_cleanly(
        &agent,
        Duration::from_secs(10),
        Duration::from_secs(8),
        "M8: EOF, then close, 2 s, TERM, 2 s, KILL",
        || agent.close_stdin(),
    );
    assert_no_survivors(
        &[sh, server, grand],
        &[sh],
        Duration::from_secs(1),
        "C34: the launcher's group",
    );
    agent.finish();
}

/// A4 / issue #15: cancel while the body stalls on a kept-alive connection. The exchange is
/// dropped at once: its connection is closed within the cancel grace (not read until some
/// timeout), and the next call goes over a new connection: the cancelled one, its body half
/// read, is never reused.
pub fn a4_cancel_of_a_stalled_stream_closes_its_connection_at_once(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = FakeLlm::with_options(
        crate::fake_llm::Options {
            keep_alive: true,
            ..crate::fake_llm::Options::default()
        },
        |i, _| match i {
            0 => Reply::text("first answer"),
            1 => Reply::text("Stalling at length, then more").stall_after_first_text(30_000),
            _ => Reply::text("third answer"),
        },
    );
    let (llm, agent, sid) = Setup::new(ctx, &s).llm(llm).start();
    let r = agent.prompt(&sid, "one");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert_eq!(llm.connections(), 1);
    let prompt = agent.start_prompt(&sid, "two");
    agent.wait_until(
        "the first chunk of the stalling stream",
        Duration::from_secs(20),
        |t| {
            t.iter().any(|m| {
                m["params"]["update"]["content"]["text"]
                    .as_str()
                    .is_some_and(|text| text.contains("Stalling"))
            })
        },
    );
    // One connection, or two when the second prompt came before the first call's connection
    // had read its stream's last bytes (then the second call got a connection of its own).
    let open = agent.open_sockets();
    assert!((1..=2).contains(&open), "{open} sockets");
    let since = Instant::now();
    agent.cancel(&sid);
    expect_cancelled(&agent, &sid, &prompt, since, Duration::from_secs(3));
    // The stalled connection is closed at once: nothing waits for the 30 s stall.
    wait_for(
        &agent,
        "the cancelled call's connection to close",
        Duration::from_secs(5),
        || agent.open_sockets() == open - 1,
    );
    next_prompt_works(&agent, &llm, &sid, "three");
    // The third call went over a new connection, or over the idle one: never over the
    // cancelled one.
    assert_eq!(
        llm.connections(),
        2,
        "the cancelled connection is not reused, and nothing else reconnected"
    );
    agent.finish();
}
