//! Readable transcripts of hook behaviours (DESIGN "Testing pyramid" layer 3), produced by the
//! deterministic simulation world (`support`): virtual time, fixed seed, no IO. CI runs with
//! `CI=true`, so a transcript that changes fails instead of writing a new snapshot; review the
//! diff and accept with `cargo insta accept` (or `INSTA_UPDATE=always`) when the change is meant.
//!
//! Transcript lines: `+t.ttts -> X …` is the agent sending to X, `<- X …` the agent receiving;
//! `+ {…}` lines under an LLM request are the messages it added since the previous request.

mod support;

use buzz_agent_core::Signal;
use serde_json::{Value, json};
use support::{HookKind, HookReply, LlmReply, ServerSpec, World, test_config};

fn stop_meta(w: &World, id: u64) -> Value {
    w.response(id).map_or(Value::Null, |r| r["result"].clone())
}

/// `(server, text)` of every `_Stop` injection in an LLM request body, in order (SPEC H6).
fn injected(body: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        if m["role"] == "tool"
            && m["tool_call_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("buzz_hook__Stop_"))
        {
            let inner: Value =
                serde_json::from_str(m["content"].as_str().unwrap_or("")).unwrap_or(Value::Null);
            out.push((
                inner["server"].as_str().unwrap_or("").to_string(),
                inner["text"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    out
}

#[test]
fn h5_objection_loop_runs_to_the_budget_then_ends_the_turn() {
    let mut cfg = test_config();
    cfg.stop_max_rejections = 2;
    let guard = ServerSpec::new("guard", &["_Stop"])
        .default_reply(HookReply::objection("tests still fail: run `cargo test`"));
    let mut w = World::new(cfg, vec![guard]);
    w.start();
    w.comment("budget 2, the guard objects every time");
    let p = w.prompt("fix the bug");
    w.run_idle();
    let r = stop_meta(&w, p);
    assert_eq!(r["stopReason"], "end_turn");
    assert_eq!(
        r["_meta"]["buzz"],
        json!({"rounds": 3, "stopObjections": 2, "stopBudget": 2, "stopBudgetExhausted": true})
    );
    assert_eq!(w.llm_requests.len(), 3, "H5: N+1 end-turn LLM calls");
    assert_eq!(w.hook_calls("guard"), 2, "the exhausted gate calls no hook");
    insta::assert_snapshot!("objection_loop_to_budget", w.transcript_text());
}

#[test]
fn h4_hook_timeout_then_kill_on_the_second_consecutive_timeout() {
    let mut cfg = test_config();
    cfg.hook_timeout_ms = 200;
    let slow = ServerSpec::new("slow", &["_Stop"]).default_reply(HookReply::now(HookKind::Never));
    let mut w = World::new(cfg, vec![slow]);
    w.start();
    w.comment("prompt 1: the hook never answers (1/2)");
    let p1 = w.prompt("first");
    w.run_idle();
    assert_eq!(stop_meta(&w, p1)["stopReason"], "end_turn");
    assert!(w.signals.is_empty(), "H4: one slow call is tolerated");
    w.comment("prompt 2: the hook never answers again (2/2) -> killed");
    let p2 = w.prompt("second");
    w.run_idle();
    assert_eq!(stop_meta(&w, p2)["stopReason"], "end_turn");
    let sigs: Vec<Signal> = w.signals.iter().map(|s| s.2).collect();
    assert_eq!(
        sigs.first(),
        Some(&Signal::Term),
        "H4: the second consecutive timeout kills the group"
    );
    assert!(!w.server_alive("slow"));
    insta::assert_snapshot!("hook_timeout_then_kill", w.transcript_text());
}

#[test]
fn g1_two_hooks_and_the_reply_guard_share_one_budget_unit() {
    let mut cfg = test_config();
    cfg.require_reply = true;
    let h1 = ServerSpec::new("hook1", &["_Stop"])
        .script([HookReply::objection("hook1: the build is red")]);
    let h2 = ServerSpec::new("hook2", &["_Stop"])
        .script([HookReply::objection("hook2: TODO list has 2 open items")]);
    let mut w = World::new(cfg, vec![h1, h2]);
    w.start();
    w.comment("require_reply on, the model never posts; both hooks object in round 1 only");
    let p = w.prompt("summarise the repo");
    w.run_idle();
    let second = &w.llm_requests[1].2;
    let texts = injected(second);
    assert_eq!(texts.len(), 3);
    assert_eq!(
        texts.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(),
        ["hook1", "hook2", "buzz-agent"],
        "H6/G1: hooks in registration order, reminder last"
    );
    let r = stop_meta(&w, p);
    // Round 1: 3 texts = 1 unit; round 2: the second reminder = 1 unit; round 3: no reminder left.
    assert_eq!(r["_meta"]["buzz"]["stopObjections"], 2);
    assert_eq!(r["stopReason"], "end_turn");
    insta::assert_snapshot!("two_hooks_and_reply_guard_one_unit", w.transcript_text());
}

#[test]
fn l2_happy_turn_with_a_tool_call_and_a_passing_gate() {
    let mut cfg = test_config();
    cfg.permission = buzz_agent_core::config::PermissionMode::Ask;
    let fs = ServerSpec::new("fs", &["_Stop"]);
    let mut w = World::new(cfg, vec![fs]);
    w.llm([
        LlmReply::tool("fs__echo", r#"{"text":"hello"}"#),
        LlmReply::text("It says hello."),
    ]);
    w.start();
    let p = w.prompt("what does echo say?");
    w.run_idle();
    assert_eq!(stop_meta(&w, p)["stopReason"], "end_turn");
    assert_eq!(stop_meta(&w, p)["_meta"]["buzz"]["stopObjections"], 0);
    insta::assert_snapshot!("happy_turn_with_tool_call", w.transcript_text());
}

#[test]
fn t4_garbage_from_the_client_is_answered_and_the_session_keeps_working() {
    let mut w = World::new(test_config(), vec![]);
    w.send_acp_bytes(b"this is not json\n");
    w.send_acp_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":42}\n");
    w.send_acp_bytes(b"[1,2,3]\n");
    w.send_acp_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"no/such\"}\n");
    w.send_acp_bytes(b"{\"jsonrpc\":\"2.0\",\"method\":\"no/such/notification\"}\n");
    w.send_acp_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"session/prompt\",\"params\":{\"sessionId\":5}}\n");
    w.send_acp_bytes(b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"initialize\",\"params\":{\"protocolVersion\":3}}\r\n");
    w.run_idle();
    let codes: Vec<Value> = w
        .acp_out
        .iter()
        .map(|(_, v)| v["error"]["code"].clone())
        .collect();
    assert_eq!(
        codes,
        [
            json!(-32700),
            json!(-32600),
            json!(-32600),
            json!(-32601),
            json!(-32602),
            Value::Null
        ]
    );
    w.start();
    let p = w.prompt("still there?");
    w.run_idle();
    assert_eq!(stop_meta(&w, p)["stopReason"], "end_turn");
    insta::assert_snapshot!("garbage_from_the_client", w.transcript_text());
}

#[test]
fn m7_server_crash_during_a_hook_call_is_fail_open() {
    let crashy =
        ServerSpec::new("crashy", &["_Stop"]).script([HookReply::after(HookKind::Exit, 30)]);
    let mut w = World::new(test_config(), vec![crashy]);
    w.start();
    let p = w.prompt("go");
    w.run_idle();
    let r = stop_meta(&w, p);
    assert_eq!(r["stopReason"], "end_turn");
    assert_eq!(
        r["_meta"]["buzz"]["stopObjections"], 0,
        "I4: a dead server never objects"
    );
    insta::assert_snapshot!("server_crash_mid_hook", w.transcript_text());
}

#[test]
fn a4_cancel_during_a_hook_round_waits_for_the_round_and_answers_cancelled() {
    let mut cfg = test_config();
    cfg.hook_timeout_ms = 300;
    let guard = ServerSpec::new("guard", &["_Stop"])
        .script([HookReply::after(HookKind::Text("not yet".into()), 100)]);
    let mut w = World::new(cfg, vec![guard]);
    w.start();
    let p = w.prompt("go");
    w.advance(50);
    w.comment("cancel while the _Stop round is running; hooks are not cancelled");
    w.cancel();
    w.run_idle();
    let r = stop_meta(&w, p);
    assert_eq!(r["stopReason"], "cancelled");
    assert_eq!(r["_meta"]["buzz"]["stopObjections"], 0);
    assert_eq!(
        w.llm_requests.len(),
        1,
        "no LLM call after a cancelled gate"
    );
    insta::assert_snapshot!("cancel_during_hook_round", w.transcript_text());
}

#[test]
fn a4_cancel_mid_stream_drops_the_call_and_answers_cancelled_after_the_streamed_text() {
    let guard = ServerSpec::new("guard", &["_Stop"]);
    let mut w = World::new(test_config(), vec![guard]);
    w.llm([LlmReply::Stream {
        deltas: vec![(0, "Let me look".into()), (200, " at the code".into())],
        finish: None,
    }]);
    w.start();
    let p = w.prompt("review main.rs");
    w.advance(100);
    w.comment("cancel while the answer streams: the call is dropped, no _Stop round runs");
    w.cancel();
    w.run_idle();
    assert_eq!(stop_meta(&w, p)["stopReason"], "cancelled");
    assert_eq!(w.hook_calls("guard"), 0, "a cancelled turn skips the gate");
    let chunks: Vec<&Value> = w
        .acp_out
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .collect();
    assert_eq!(
        chunks.len(),
        1,
        "the text after the cancel never reaches the client"
    );
    w.comment("the session still works");
    let p2 = w.prompt("still there?");
    w.run_idle();
    assert_eq!(stop_meta(&w, p2)["stopReason"], "end_turn");
    insta::assert_snapshot!("cancel_mid_stream", w.transcript_text());
}

#[test]
fn k1_h7_compaction_summarises_then_post_compact_injects_after_the_summary() {
    let mut cfg = test_config();
    cfg.max_context_tokens = 150;
    cfg.max_output_tokens = 50;
    let memory = ServerSpec::new("memory", &["_PostCompact"])
        .script([HookReply::objection("Deploy to staging only.")]);
    let mut w = World::new(cfg, vec![memory]);
    w.llm([
        LlmReply::text("Summary: the user wants a release checklist for v2."),
        LlmReply::text("Here is the checklist."),
    ]);
    w.start();
    w.comment("the prompt alone is over 90% of a 150-token window: compact before round 1");
    let p = w.prompt(
        "Write the release checklist for v2: version bump, changelog, tag, build, \
         sign, upload to the registry, announce on the list, close the milestone, and \
         open the next one.",
    );
    w.run_idle();
    let r = stop_meta(&w, p);
    assert_eq!(r["stopReason"], "end_turn");
    assert_eq!(
        r["_meta"]["buzz"]["rounds"], 1,
        "the summary call is not a round"
    );
    assert_eq!(w.hook_calls("memory"), 1);
    let round = &w.llm_requests[1].2;
    let messages = round["messages"].as_array().cloned().unwrap_or_default();
    assert!(
        messages[0]["content"]
            .as_str()
            .is_some_and(|t| t.contains("release checklist for v2")),
        "the summary comes first"
    );
    assert_eq!(
        messages[1]["tool_calls"][0]["function"]["name"], "memory___PostCompact",
        "H7: the injection right after the summary"
    );
    insta::assert_snapshot!("compaction_with_post_compact", w.transcript_text());
}

/// The `_SessionStart` / `_SessionEnd` tool results in an LLM request body (SPEC H6, H10).
fn session_injections(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .filter(|c| c.contains("\"hook\":\"_Session"))
        .map(str::to_string)
        .collect()
}

#[test]
fn h10_h11_session_start_goes_into_the_first_prompt_and_session_end_runs_once_at_eof() {
    let todo = ServerSpec::new("todo", &["_SessionStart", "_Stop", "_SessionEnd"])
        .hook_reply(
            "_SessionStart",
            HookReply::objection("Open todo items:\n- write the docs"),
        )
        .hook_reply("_SessionEnd", HookReply::objection("2 items still open"));
    let mut w = World::new(test_config(), vec![todo]);
    w.start();
    w.comment("session/new was answered after the _SessionStart round");
    let p1 = w.prompt("first");
    w.run_idle();
    let p2 = w.prompt("second");
    w.run_idle();
    assert_eq!(stop_meta(&w, p1)["stopReason"], "end_turn");
    assert_eq!(stop_meta(&w, p2)["stopReason"], "end_turn");
    let first = &w.llm_requests[0].2;
    assert_eq!(
        session_injections(first),
        [r#"{"hook":"_SessionStart","server":"todo","text":"Open todo items:\n- write the docs"}"#],
        "H10: in the first request of the first prompt"
    );
    let second = &w.llm_requests[1].2;
    assert_eq!(
        session_injections(second).len(),
        1,
        "the second prompt only has it as history"
    );
    w.comment("EOF: _SessionEnd runs once, then the usual shutdown");
    w.eof();
    w.run_idle();
    assert_eq!(w.exited, Some(0));
    let ends: Vec<&Value> = w.mcp_lines["todo"]
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["params"]["name"] == "_SessionEnd")
        .collect();
    assert_eq!(ends.len(), 1, "H11: exactly once");
    assert_eq!(
        ends[0]["params"]["_meta"]["buzz/hook"],
        json!({"point": "_SessionEnd", "sessionId": "sess_1", "attempt": 1,
            "budgetRemaining": 3, "reason": "eof", "promptCount": 2})
    );
    assert!(
        w.logs.iter().any(|l| l.message
            == "hook: _SessionEnd of session sess_1 answered by 'todo': \"2 items still open\""),
        "H11: the answer is logged"
    );
    insta::assert_snapshot!("session_start_and_session_end_at_eof", w.transcript_text());
}

#[test]
fn h11_session_close_runs_session_end_then_stops_the_servers_and_answers() {
    let mut cfg = test_config();
    cfg.hook_timeout_ms = 300;
    let mem = ServerSpec::new("mem", &["_SessionEnd"])
        .hook_reply("_SessionEnd", HookReply::now(HookKind::Never));
    let mut w = World::new(cfg, vec![mem]);
    let sid = w.start();
    let p = w.prompt("hello");
    w.run_idle();
    assert_eq!(stop_meta(&w, p)["stopReason"], "end_turn");
    w.comment("session/close: the hook never answers; the close is answered after its timeout");
    let close = w.request("session/close", json!({"sessionId": sid}));
    w.run_until(w.now.plus_ms(299));
    assert!(
        w.response(close).is_none(),
        "waits for the _SessionEnd round"
    );
    w.run_until(w.now.plus_ms(1));
    assert_eq!(
        w.response(close).map(|r| r["result"].clone()),
        Some(json!({}))
    );
    w.run_idle();
    assert!(!w.server_alive("mem"), "its servers are stopped");
    let again = w.prompt("are you there?");
    w.run_idle();
    assert_eq!(
        w.response(again).map(|r| r["error"]["code"].clone()),
        Some(json!(-32002))
    );
    w.eof();
    w.run_idle();
    assert_eq!(w.exited, Some(0));
    let ends = w.mcp_lines["mem"]
        .iter()
        .filter(|(_, v)| v["params"]["name"] == "_SessionEnd")
        .count();
    assert_eq!(ends, 1, "H11: the closed session does not end again at EOF");
    insta::assert_snapshot!(
        "session_close_with_a_silent_session_end",
        w.transcript_text()
    );
}

#[test]
fn x1_an_interceptor_denies_one_call_and_rewrites_the_next() {
    let mut cfg = test_config();
    cfg.interceptor_servers =
        buzz_agent_core::config::HookAllowlist::Names(vec!["policy".to_string()]);
    let fs = ServerSpec::new("fs", &[]);
    let mut policy = ServerSpec::new("policy", &[]).interceptors(json!([
        {"name": "upper", "behavior": "uppercase-note", "phases": "request"},
        {"name": "needs-note", "behavior": "require-note", "phases": "request"}
    ]));
    policy.tools.clear();
    let mut w = World::new(cfg, vec![fs, policy]);
    w.llm([
        LlmReply::tool("fs__echo", r#"{"text":"hi"}"#),
        LlmReply::tool("fs__echo", r#"{"text":"hi","note":"ship it"}"#),
        LlmReply::text("Done."),
    ]);
    w.start();
    let p = w.prompt("echo something");
    w.run_idle();
    assert_eq!(stop_meta(&w, p)["stopReason"], "end_turn");
    let calls: Vec<Value> = w.mcp_lines["fs"]
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["method"] == "tools/call")
        .map(|v| v["params"]["arguments"].clone())
        .collect();
    assert_eq!(
        calls,
        [json!({"text": "hi", "note": "SHIP IT"})],
        "the denied call never ran; the mutated one ran as changed"
    );
    let second = &w.llm_requests[1].2;
    assert!(
        second
            .to_string()
            .contains("blocked by interceptor 'needs-note': note is required"),
        "the model sees the denial as the tool error"
    );
    insta::assert_snapshot!("interceptor_denies_then_rewrites", w.transcript_text());
}

/// SPEC A9: a session recorded by one agent and loaded by a new one. The first agent runs a
/// prompt with a tool call and one `_Stop` objection; the snapshot is the second agent's
/// side: the file opened and locked, the servers started, the transcript read and replayed
/// (the prompt, the text, the tool call and its final status, in the order the client saw
/// them), the answer, then the next prompt's request carrying the whole history.
#[test]
fn a9_load_replays_the_session_then_the_next_prompt_continues_it() {
    let mut cfg = test_config();
    cfg.state_dir = buzz_agent_core::config::StateDir::Dir("/state".into());
    let servers = || {
        vec![ServerSpec::new("guard", &["_Stop"]).script(vec![
            HookReply::objection("also run the tests"),
            HookReply::now(HookKind::Empty),
        ])]
    };
    let mut w = World::new(cfg.clone(), servers());
    let sid = w.start();
    w.llm([
        LlmReply::tool("guard__echo", r#"{"text":"hello"}"#),
        LlmReply::text("Echoed hello."),
        LlmReply::text("Tests pass too."),
    ]);
    let p = w.prompt("echo hello");
    w.run_idle();
    assert_eq!(stop_meta(&w, p)["stopReason"], "end_turn");
    let file = format!("{sid}.jsonl");
    let mut w2 = World::new(cfg, servers()).with_disk(w.disk.clone());
    w2.transcript_log_level = buzz_agent_core::config::LogLevel::Info;
    w2.initialize();
    w2.comment(&format!("a new agent process loads {sid}"));
    let id = w2.load_session(&sid, true);
    assert_eq!(
        w2.response(id)
            .map(|r| r["result"]["configOptions"][0]["id"].clone()),
        Some(json!("model")),
        "the answer carries the model selector"
    );
    w2.comment("the next prompt continues the same history");
    w2.llm([LlmReply::text("Still here.")]);
    w2.prompt("anything else?");
    w2.run_idle();
    insta::assert_snapshot!("session_load_replay", w2.transcript_text());
    insta::assert_snapshot!("session_transcript_file", w.disk.text(&file));
}
