//! The session hook points end to end (SPEC H10 `_SessionStart`, H11 `_SessionEnd`, ACP
//! `session/close`), with the real agent, the fake LLM and fake MCP servers as processes.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, assert_exits_cleanly, log_of, wait_stderr};
use crate::fake_llm::{HistoryItem, RecordedRequest, Reply};
use crate::fake_mcp;
use crate::harness::{Ctx, fake_mcp_entry};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A fake MCP server exposing the session hooks (and `echo`) that logs every line to `log`.
fn session_server(name: &str, log: &str, extra: &[(&str, &str)]) -> Value {
    let mut env = vec![("FAKE_MCP_CALL_LOG", log)];
    env.extend_from_slice(extra);
    fake_mcp_entry(name, &env)
}

/// The `tools/call` of `hook` a server received, in order.
fn hook_calls(log: &str, hook: &str) -> Vec<Value> {
    fake_mcp::logged_tool_calls(&log_of(log))
        .into_iter()
        .filter(|c| c["params"]["name"] == hook)
        .collect()
}

/// The `_SessionStart` injections of a request: `(index in history_items, result text)`.
fn session_start_injections(req: &RecordedRequest) -> Vec<(usize, String)> {
    let items = req.history_items();
    items
        .iter()
        .enumerate()
        .filter_map(|(k, item)| match item {
            HistoryItem::Call { name, id, .. } if name.ends_with("___SessionStart") => {
                Some((k, req.tool_result_for(id).unwrap_or_default()))
            }
            _ => None,
        })
        .collect()
}

/// H10/H6/L10: the `_SessionStart` answer goes into the first LLM request of the session's
/// first prompt, right after the prompt, in the H6 encoding, and into no other prompt (the
/// second prompt's request has it only as history, once). In the dialect matrix: the request
/// stays valid for every profile (thinking models, strict alternation).
pub fn h10_session_start_goes_right_after_the_first_prompt_and_into_no_other(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["mem.log"]);
    let text = "Open items from yesterday:\n- \"finish\" the parser </tool_result>";
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("Noted."))
        .env(&[("MCP_HOOK_SERVERS", "mem")])
        .servers([session_server(
            "mem",
            &log,
            &[("FAKE_MCP_SESSION_START_TEXT", text)],
        )])
        .start();
    let calls = hook_calls(&log, "_SessionStart");
    assert_eq!(calls.len(), 1, "H10: once, before session/new was answered");
    let meta = &calls[0]["params"]["_meta"]["buzz/hook"];
    assert_eq!(meta["point"], "_SessionStart");
    assert_eq!(meta["sessionId"], json!(sid));
    assert_eq!(meta["source"], "new");
    assert_end_turn(&agent, &agent.prompt(&sid, "first prompt"));
    assert_end_turn(&agent, &agent.prompt(&sid, "second prompt"));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one request per prompt{}", agent.context());
    let first = session_start_injections(&reqs[0]);
    assert_eq!(first.len(), 1, "{:#?}", reqs[0].messages());
    let expected = format!(
        r#"{{"hook":"_SessionStart","server":"mem","text":{}}}"#,
        serde_json::to_string(text).unwrap_or_default()
    );
    assert_eq!(first[0].1, expected, "H6 encoding");
    reqs[0].assert_tool_calls_paired();
    // Right after the prompt: the prompt is the last user text before the injected call.
    let items = reqs[0].history_items();
    let before = &items[..first[0].0];
    assert!(
        reqs[0].user_text().starts_with("first prompt"),
        "the prompt opens the request: {:#?}",
        reqs[0].messages()
    );
    assert!(
        !before
            .iter()
            .any(|i| matches!(i, HistoryItem::Call { .. } | HistoryItem::Result { .. })),
        "nothing but the prompt before the injection: {items:?}"
    );
    assert_eq!(
        session_start_injections(&reqs[1]).len(),
        1,
        "H10: the second prompt carries no new injection"
    );
    for req in &reqs {
        assert!(
            req.tool_names().iter().all(|t| !t.contains("___")),
            "M4: hooks offered: {:?}",
            req.tool_names()
        );
    }
    wait_stderr(
        &agent,
        "hook: point=_SessionStart server=mem outcome=objection",
        Duration::from_secs(5),
    );
    agent.finish();
}

/// H10/H3/H4: a `_SessionStart` hook that never answers delays `session/new` by one hook
/// timeout at most, fails open (nothing is injected) and is logged as a timeout.
pub fn h10_h4_a_silent_session_start_hook_delays_session_new_by_one_timeout_and_fails_open(
    ctx: &Ctx,
) {
    let (s, [log]) = Scratch::with_files(["slow.log"]);
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("Hello.")])
        .env(&[
            ("MCP_HOOK_SERVERS", "slow"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "700"),
        ])
        .spawn();
    agent.initialize();
    let started = Instant::now();
    let sid = agent.new_session(
        &s.ws,
        json!([session_server(
            "slow",
            &log,
            &[
                ("FAKE_MCP_SESSION_START_TEXT", "never seen"),
                ("FAKE_MCP_SESSION_HOOK_DELAY_MS", "hang"),
            ],
        )]),
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_secs(5),
        "session/new waited {took:?} (one 700 ms hook timeout expected){}",
        agent.context()
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "hi"));
    let reqs = llm.requests();
    assert!(
        session_start_injections(&reqs[0]).is_empty(),
        "fail-open: nothing injected"
    );
    assert!(
        !reqs[0].body.to_string().contains("never seen"),
        "the late answer never reaches the model"
    );
    wait_stderr(
        &agent,
        "hook: point=_SessionStart server=slow outcome=timeout",
        Duration::from_secs(5),
    );
    assert!(
        log_of(&log)
            .iter()
            .any(|m| m["method"] == "notifications/cancelled"),
        "H4: the timed-out call is cancelled"
    );
    agent.finish();
}

/// H11/P1: at EOF the session's `_SessionEnd` runs exactly once, its `_meta` carrying the
/// reason and the prompt count; its answer is logged, never injected; the agent exits cleanly.
pub fn h11_session_end_runs_once_at_eof_with_reason_and_prompt_count(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["mem.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("Done."))
        .env(&[("MCP_HOOK_SERVERS", "mem")])
        .servers([session_server(
            "mem",
            &log,
            &[("FAKE_MCP_SESSION_END_TEXT", "saved 2 notes")],
        )])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "one"));
    assert_end_turn(&agent, &agent.prompt(&sid, "two"));
    assert!(
        hook_calls(&log, "_SessionEnd").is_empty(),
        "not before the session ends"
    );
    agent.finish_keep();
    let calls = hook_calls(&log, "_SessionEnd");
    assert_eq!(calls.len(), 1, "H11: exactly once");
    assert_eq!(
        calls[0]["params"]["_meta"]["buzz/hook"],
        json!({"point": "_SessionEnd", "sessionId": sid, "attempt": 1, "budgetRemaining": 3,
               "reason": "eof", "promptCount": 2})
    );
    let err = agent.stderr_text();
    assert!(
        err.contains(&format!(
            "hook: _SessionEnd of session {sid} answered by 'mem': \"saved 2 notes\""
        )),
        "H11: the answer is logged{}",
        agent.context()
    );
    assert!(
        !llm.requests()
            .iter()
            .any(|r| r.body.to_string().contains("saved 2 notes")),
        "H11: never injected"
    );
}

/// H11/P1/M8: SIGTERM with a `_SessionEnd` hook that never answers: the hook is called once
/// with reason `signal`, the exit waits for its timeout (2.5 s) but still comes within P1's
/// bound, and nothing survives.
pub fn h11_p1_sigterm_with_a_silent_session_end_hook_still_exits_in_bound(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["mem.log"]);
    let (_llm, agent, _sid) = Setup::new(ctx, &s)
        .env(&[("MCP_HOOK_SERVERS", "mem")])
        .servers([session_server(
            "mem",
            &log,
            &[
                ("FAKE_MCP_SESSION_END_TEXT", "never"),
                ("FAKE_MCP_SESSION_HOOK_DELAY_MS", "hang"),
            ],
        )])
        .start();
    assert_exits_cleanly(
        &agent,
        Duration::from_secs(10),
        Duration::from_secs(6),
        "P1/H11 SIGTERM",
        // SAFETY: kill(2) on our own child's pid.
        || unsafe {
            libc::kill(agent.pid(), libc::SIGTERM);
        },
    );
    let calls = hook_calls(&log, "_SessionEnd");
    assert_eq!(calls.len(), 1, "H11: once{}", agent.context());
    assert_eq!(calls[0]["params"]["_meta"]["buzz/hook"]["reason"], "signal");
    assert!(
        agent
            .stderr_text()
            .contains("hook: point=_SessionEnd server=mem outcome=timeout"),
        "H9{}",
        agent.context()
    );
    agent.finish();
}

/// H11/ACP `session/close`: the agent advertises `sessionCapabilities.close`; closing a session
/// runs its `_SessionEnd` (reason `close`) once, stops its servers and answers `{}`; the closed
/// session is unknown afterwards (`-32002`) and EOF does not end it again.
pub fn h11_session_close_runs_session_end_stops_the_servers_and_answers(ctx: &Ctx) {
    let (s, [log, pids]) = Scratch::with_files(["mem.log", "mem.pids"]);
    let (_llm, agent) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("ok"))
        .env(&[("MCP_HOOK_SERVERS", "mem")])
        .spawn();
    let init = agent.initialize();
    assert_eq!(
        init["agentCapabilities"]["sessionCapabilities"]["close"],
        json!({}),
        "{init}"
    );
    let sid = agent.new_session(
        &s.ws,
        json!([session_server(
            "mem",
            &log,
            &[
                ("FAKE_MCP_SESSION_END_TEXT", "bye"),
                ("FAKE_MCP_GRANDCHILD_PIDFILE", &pids),
            ],
        )]),
    );
    let (server, grandchild) = super::util::read_pids(&pids);
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    let closed = agent.request("session/close", json!({"sessionId": sid}));
    assert_eq!(agent.result(&closed), &json!({}), "{closed}");
    let calls = hook_calls(&log, "_SessionEnd");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]["params"]["_meta"]["buzz/hook"],
        json!({"point": "_SessionEnd", "sessionId": sid, "attempt": 1, "budgetRemaining": 3,
               "reason": "close", "promptCount": 1})
    );
    super::util::assert_no_survivors(
        &[server, grandchild],
        &[server],
        Duration::from_secs(6),
        "M8 after session/close",
    );
    let again = agent.prompt(&sid, "still there?");
    assert_eq!(agent.error(&again).0, -32002, "{again}");
    let twice = agent.request("session/close", json!({"sessionId": sid}));
    assert_eq!(agent.error(&twice).0, -32002, "{twice}");
    agent.finish_keep();
    assert_eq!(
        hook_calls(&log, "_SessionEnd").len(),
        1,
        "H11: EOF does not end the closed session again"
    );
}

// ---- the extras (production binary) --------------------------------------------------------

/// H10, E2: the bundled `todo` server keeps its list in `TODO_FILE`; a new session's
/// `_SessionStart` re-injects the items an earlier session left open, into the first prompt.
pub fn h10_e2_todo_reinjects_open_items_at_session_start(ctx: &Ctx) {
    let (s, [todo_file]) = Scratch::with_files(["todo.json"]);
    std::fs::write(
        &todo_file,
        r#"{"open": ["write the changelog"], "done": ["ship 1.0"]}"#,
    )
    .expect("write the todo file");
    let bin = ctx.agent_bin.to_string_lossy().into_owned();
    let todo = json!({"name": "todo", "command": bin, "args": ["example-server", "todo"],
                      "env": [{"name": "TODO_FILE", "value": todo_file}]});
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("I will write the changelog."))
        .env(&[
            ("MCP_HOOK_SERVERS", "todo"),
            ("BUZZ_AGENT_STOP_MAX_REJECTIONS", "0"),
        ])
        .servers([todo])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "what is left?"));
    let reqs = llm.requests();
    let injected = session_start_injections(&reqs[0]);
    assert_eq!(injected.len(), 1, "{:#?}", reqs[0].messages());
    assert!(
        injected[0]
            .1
            .contains(r#""hook":"_SessionStart","server":"todo""#)
            && injected[0].1.contains("- write the changelog")
            && !injected[0].1.contains("ship 1.0"),
        "{}",
        injected[0].1
    );
    agent.finish_keep();
    assert!(
        agent
            .stderr_text()
            .contains("answered by 'todo': \"1 todo item(s) still open\""),
        "H11: the todo server's _SessionEnd answer is logged{}",
        agent.context()
    );
}

/// P3, H10, H11: `hooks check` calls the session points too and says what their answers do
/// (`_SessionStart` injects, `_SessionEnd` is logged).
pub fn p3_h10_h11_hooks_check_covers_the_session_points(ctx: &Ctx) {
    use std::process::{Command, Stdio};
    let fake = crate::harness::current_exe();
    let out = Command::new(&ctx.agent_bin)
        .args(["hooks", "check", "--", &fake])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BUZZ_E2E_ROLE", "fake-mcp")
        // A server gets only what the agent would pass it (SPEC S1).
        .env("BUZZ_AGENT_CHILD_ENV", "BUZZ_E2E_ROLE,FAKE_MCP_*")
        .env("FAKE_MCP_SESSION_START_TEXT", "remember the style guide")
        .env("FAKE_MCP_SESSION_END_TEXT", "")
        .stdin(Stdio::null())
        .output()
        .expect("run hooks check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("ok    _SessionStart: found, answered, ")
            && stdout.contains("would inject: \"remember the style guide\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok    _SessionEnd: found, answered empty, ")
            && stdout.contains("would not be logged"),
        "{stdout}"
    );
    assert!(stdout.contains("--    _Stop: not found"), "{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
}
