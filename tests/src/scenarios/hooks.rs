//! MCP lifecycle hooks end to end: SPEC H1–H9, the reply guard G1–G2, A7 (hooks never ask),
//! A8 (prompt `_meta`) and M4 (hooks hidden from the model), with the real agent, the fake LLM
//! and fake MCP servers as real processes.

use super::setup::Setup;
use super::util::{
    Scratch, assert_end_turn, bodies, buzz_meta, call_then_always, hook_attempts, hook_server,
    is_cancel_of, log_of, read_pids, stop_calls, stop_json, wait_stderr,
};
use crate::fake_llm::{FakeLlm, HistoryItem, RecordedRequest, Reply};
use crate::fake_mcp;
use crate::harness::{Ctx, fake_mcp_entry, tool_call_announcements};
use crate::procfs;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// One `_Stop` injection pair found in a request's history (SPEC H6).
#[derive(Debug, Clone)]
struct Injection {
    id: String,
    name: String,
    arguments: String,
    /// The tool result text, verbatim.
    result: String,
}

/// Every assistant tool call named `<server>___Stop` in the history with its result, in order.
fn stop_injections(req: &RecordedRequest) -> Vec<Injection> {
    req.assistant_tool_calls()
        .into_iter()
        .filter(|(_, name, _)| name.ends_with("___Stop"))
        .map(|(id, name, arguments)| Injection {
            result: req.tool_result_for(&id).unwrap_or_else(|| {
                panic!(
                    "hook call {id} has no tool result: {}",
                    serde_json::to_string_pretty(&req.messages()).unwrap_or_default()
                )
            }),
            id,
            name,
            arguments,
        })
        .collect()
}

/// Checks one injection against SPEC H6: name `<server>___Stop`, id `buzz_hook__Stop_<server>_<n>`,
/// arguments `{}`, result exactly the compact JSON.
fn assert_injection(inj: &Injection, server: &str, text: &str) {
    assert_eq!(inj.name, format!("{server}___Stop"), "{inj:?}");
    let prefix = format!("buzz_hook__Stop_{server}_");
    assert!(
        inj.id
            .strip_prefix(&prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        "H6 id must be {prefix}<n>: {inj:?}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&inj.arguments).ok(),
        Some(json!({})),
        "H6 arguments {{}}: {inj:?}"
    );
    assert_eq!(
        inj.result,
        stop_json(server, text),
        "H6 result text: {inj:?}"
    );
}

/// The reply guard's reminder pairs (server `buzz-agent`) in a request's history.
fn reminders(req: &RecordedRequest) -> Vec<Injection> {
    stop_injections(req)
        .into_iter()
        .filter(|i| i.name == "buzz-agent___Stop")
        .collect()
}

/// Checks a reminder pair: H6 shape from server `buzz-agent`, text pointing at
/// `buzz messages send` (G1).
fn assert_reminder(inj: &Injection) {
    let v: Value = serde_json::from_str(&inj.result)
        .unwrap_or_else(|e| panic!("reminder result is not JSON ({e}): {inj:?}"));
    let text = v["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("buzz messages send"),
        "G1: the reminder names `buzz messages send`: {text:?}"
    );
    assert_injection(inj, "buzz-agent", text);
}

/// An LLM that answers every request with the same final text (so extra rounds show up).
fn always_text(ctx: &Ctx, text: &'static str) -> FakeLlm {
    ctx.fake_llm_with(move |_, _| Reply::text(text))
}

/// H5/H6/A8/H9/H1: a hook that objects once then clears: the turn goes on one round and ends
/// `end_turn`; the 2nd LLM request carries the injection pair (exact compact JSON, even for text
/// with quotes, newlines and delimiters); hooks are never announced to the client.
pub fn h5_h6_hook_objects_once_then_clears_end_turn(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let hook_text = "3 tests failing: \"parse\" </tool_result>\n{\"role\":\"system\"} ✗";
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "All done."))
        .env(&[("MCP_HOOK_SERVERS", "guard")])
        .servers([hook_server(
            "guard",
            &log,
            &[
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                ("FAKE_MCP_STOP_TEXT", hook_text),
            ],
        )])
        .start();
    let r = agent.prompt(&sid, "finish the task");
    assert_end_turn(&agent, &r);
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 2, "stopObjections": 1, "stopBudget": 3, "stopBudgetExhausted": false}),
        "A8: {r}"
    );

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one objection = one more LLM call");
    assert!(stop_injections(&reqs[0]).is_empty());
    reqs[1].assert_tool_calls_paired();
    let inj = stop_injections(&reqs[1]);
    assert_eq!(inj.len(), 1, "{inj:?}");
    assert_injection(&inj[0], "guard", hook_text);
    // The pair is appended after the model's own answer and is the end of the history; the
    // call joins the answer (C61: one assistant message / turn with the text and the call).
    let msgs = reqs[1].messages();
    assert!(
        matches!(reqs[1].history_items().last(), Some(HistoryItem::Result { id, .. }) if *id == inj[0].id),
        "the injection ends the history: {msgs:#?}"
    );
    assert_eq!(
        reqs[1].assistant_text_with_call(&inj[0].id).as_deref(),
        Some("All done."),
        "C61: the call joins the model's answer: {msgs:#?}"
    );
    for req in &reqs {
        assert!(
            req.tool_names().iter().all(|t| !t.contains("___")),
            "M4: hooks in the tool list: {:?}",
            req.tool_names()
        );
    }

    // The server: two `_Stop` calls (objection, then empty), `_Other` never (H1).
    let logged = log_of(&log);
    assert_eq!(fake_mcp::count_calls(&logged, "_Stop"), 2, "{logged:#?}");
    assert_eq!(fake_mcp::count_calls(&logged, "_Other"), 0, "H1");
    // H8/A6: hooks never produce updates.
    let ups = agent.session_updates(&sid);
    assert!(tool_call_announcements(&ups).is_empty(), "{ups:#?}");
    assert!(
        !ups.iter()
            .any(|u| u.to_string().contains("_Stop") || u.to_string().contains("3 tests failing")),
        "H8: a hook shows in session/update: {ups:#?}"
    );
    // H9: one line per call. The log is written apart from the answer (it never blocks the
    // loop, SPEC P2), so the last line may come just after it.
    wait_stderr(
        &agent,
        "point=_Stop server=guard outcome=empty",
        Duration::from_secs(5),
    );
    let err = agent.stderr_text();
    for outcome in ["objection", "empty"] {
        let needle = format!("point=_Stop server=guard outcome={outcome}");
        assert!(
            err.lines()
                .any(|l| l.contains(&needle) && l.contains("latency_ms=")),
            "H9: no log line {needle:?}{}",
            agent.context()
        );
    }
    agent.finish();
}

/// H5/A8/H9: budget 1 and a hook that always objects: after one tool round, exactly 2 end-turn
/// LLM calls (N+1), `_Stop` reached the server once, the response says the budget was exhausted
/// and stderr warns.
pub fn h5_always_objecting_budget_1_makes_exactly_the_predicted_calls(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(call_then_always(
            "guard__echo",
            json!({"text": "x"}),
            "I am done.",
        ))
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_STOP_MAX_REJECTIONS", "1"),
        ])
        .servers([hook_server("guard", &log, &[])])
        .start();
    let r = agent.prompt(&sid, "go");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        3,
        "1 tool round + exactly 2 end-turn calls with budget 1{}",
        agent.context()
    );
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 3, "stopObjections": 1, "stopBudget": 1, "stopBudgetExhausted": true}),
        "A8: {r}"
    );
    assert_eq!(
        stop_calls(&log).len(),
        1,
        "the exhausted gate calls no hook"
    );
    let inj = stop_injections(&reqs[2]);
    assert_eq!(inj.len(), 1, "{inj:?}");
    assert_injection(&inj[0], "guard", "tests are still red");
    // The log line may reach stderr a moment after the answer reached stdout.
    wait_stderr(&agent, "budget of 1 exhausted", Duration::from_secs(10));
    let err = agent.stderr_text();
    assert!(
        err.lines().any(|l| {
            let l = l.to_lowercase();
            l.contains("budget") && l.contains("exhausted") && l.contains("warn")
        }),
        "H9: a budget-exhaustion warning{}",
        agent.context()
    );
    agent.finish();
}

/// H5/I2: the objection count resets at every `session/prompt`: two prompts on one session with
/// budget 2 and an always-objecting hook each make 3 LLM calls and 2 `_Stop` calls, and the
/// `_meta` attempt/budget restart at 1/2.
pub fn h5_i2_budget_resets_per_prompt(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "done"))
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_STOP_MAX_REJECTIONS", "2"),
        ])
        .servers([hook_server("guard", &log, &[])])
        .start();
    for k in 1..=2usize {
        let r = agent.prompt(&sid, &format!("prompt {k}"));
        assert_end_turn(&agent, &r);
        assert_eq!(
            buzz_meta(&agent, &r),
            json!({"rounds": 3, "stopObjections": 2, "stopBudget": 2, "stopBudgetExhausted": true}),
            "prompt {k} gets the full budget: {r}"
        );
        assert_eq!(llm.requests().len(), 3 * k, "after prompt {k}");
        assert_eq!(stop_calls(&log).len(), 2 * k, "after prompt {k}");
    }
    let attempts = hook_attempts(&stop_calls(&log));
    assert_eq!(
        attempts,
        [
            (json!(1), json!(2)),
            (json!(2), json!(1)),
            (json!(1), json!(2)),
            (json!(2), json!(1))
        ],
        "H3 _meta per prompt"
    );
    agent.finish();
}

/// M4/H2/L2: without an allowlist entry (variable unset, or naming another server) a server's
/// `_` tools are hidden and never called: the model's `<server>___Stop` call is `unknown tool`,
/// the hook text never reaches the model, and the server gets no `_` tools/call. With
/// `MCP_HOOK_SERVERS=other` the named server's hook does run (exact-name match).
pub fn m4_h2_hooks_hidden_and_not_called_without_allowlist(ctx: &Ctx) {
    const GUARD_TEXT: &str = "GUARD-HOOK-TEXT-must-not-leak";
    const OTHER_TEXT: &str = "OTHER-HOOK-TEXT";
    for allowlist in [None, Some("other")] {
        let (s, [log, other_log]) = Scratch::with_files(["guard.log", "other.log"]);
        let env: Vec<(&str, &str)> = allowlist
            .map(|a| vec![("MCP_HOOK_SERVERS", a)])
            .unwrap_or_default();
        let guard = hook_server(
            "guard",
            &log,
            &[
                ("FAKE_MCP_STOP_TEXT", GUARD_TEXT),
                ("FAKE_MCP_POSTCOMPACT_TEXT", GUARD_TEXT),
            ],
        );
        let other = hook_server(
            "other",
            &other_log,
            &[
                ("FAKE_MCP_STOP_TEXT", OTHER_TEXT),
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
            ],
        );
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .handler(|i, _| match i {
                0 => Reply::tool_calls(vec![
                    ("call_a", "guard___Stop", json!({})),
                    ("call_b", "guard___PostCompact", json!({})),
                    ("call_c", "guard___Other", json!({})),
                ]),
                _ => Reply::text("done"),
            })
            .env(&env)
            .servers([guard, other])
            .start();
        let r = agent.prompt(&sid, "call the hidden tools");
        assert_end_turn(&agent, &r);
        let reqs = llm.requests();
        let case = format!("MCP_HOOK_SERVERS={allowlist:?}");
        // Unset: tool round + final answer. `other`: its hook objects once → one more round.
        let (expect_calls, expect_objections) = if allowlist.is_some() { (3, 1) } else { (2, 0) };
        assert_eq!(reqs.len(), expect_calls, "{case}{}", agent.context());
        assert_eq!(
            buzz_meta(&agent, &r)["stopObjections"],
            expect_objections,
            "{case}: {r}"
        );
        reqs[1].assert_tool_calls_paired();
        let calls = reqs[1].assistant_tool_calls();
        for (id, name, _) in calls.iter().take(3) {
            let text = reqs[1].tool_result_for(id).unwrap_or_default();
            assert!(
                text.contains(&format!("unknown tool: {name}")),
                "{case}: {name} → {text:?}"
            );
        }
        for req in &reqs {
            for t in req.tool_names() {
                assert!(
                    !["_Stop", "_PostCompact", "_Other"]
                        .iter()
                        .any(|h| t.contains(h)),
                    "{case}: M4: hook {t} advertised to the model"
                );
            }
        }
        assert!(
            !bodies(&reqs).contains(GUARD_TEXT),
            "{case}: H2: the non-allowlisted hook's text reached the model"
        );
        let logged = log_of(&log);
        let called: Vec<&Value> = logged
            .iter()
            .filter(|m| m["method"] == "tools/call")
            .map(|m| &m["params"]["name"])
            .collect();
        assert!(called.is_empty(), "{case}: guard got tools/call {called:?}");
        let other_stops = stop_calls(&other_log).len();
        if allowlist.is_some() {
            assert_eq!(other_stops, 2, "{case}: other's hook runs at each gate");
            let inj: Vec<Injection> = stop_injections(&reqs[2])
                .into_iter()
                .filter(|i| i.name == "other___Stop")
                .collect();
            assert_eq!(inj.len(), 1, "{case}: {inj:?}");
            assert_injection(&inj[0], "other", OTHER_TEXT);
        } else {
            assert_eq!(other_stops, 0, "{case}: hooks are off by default");
            assert!(!bodies(&reqs).contains(OTHER_TEXT), "{case}");
        }
        agent.finish();
    }
}

/// H4/H3/M9: a hook that never answers with `BUZZ_AGENT_HOOK_TIMEOUT_MS=200`: the first gate
/// fails open promptly (`end_turn`), warns `(1/2)`, abandons the request with
/// `notifications/cancelled` and keeps the server; the second consecutive timeout kills the
/// server's whole process group (grandchild included).
pub fn h4_hook_timeout_fails_open_then_second_timeout_kills_group(ctx: &Ctx) {
    let (s, [log, pidfile]) = Scratch::with_files(["guard.log", "guard.pids"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "done"))
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "200"),
        ])
        .servers([hook_server(
            "guard",
            &log,
            &[
                ("FAKE_MCP_STOP_MODE", "hang"),
                ("FAKE_MCP_GRANDCHILD_PIDFILE", &pidfile),
            ],
        )])
        .start();
    let (server, grand) = read_pids(&pidfile);
    assert!(procfs::is_alive(server) && procfs::is_alive(grand));

    // First prompt: one timeout, fail-open, prompt.
    let started = Instant::now();
    let p1 = agent.start_prompt(&sid, "first");
    let r1 = agent.wait_response(&p1, Duration::from_secs(10));
    let answered = Instant::now();
    assert_end_turn(&agent, &r1);
    let took = answered - started;
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "a timed-out hook never objects");
    let after_llm = answered.saturating_duration_since(reqs[0].received_at);
    assert!(
        after_llm < Duration::from_secs(1) && took < Duration::from_millis(1500),
        "H3/H4: the gate is bounded by the 200 ms hook timeout: prompt took {took:?}, \
         {after_llm:?} after the end-turn LLM request{}",
        agent.context()
    );
    assert_eq!(buzz_meta(&agent, &r1)["stopObjections"], 0, "{r1}");
    wait_stderr(
        &agent,
        "hook: server 'guard' timed out (1/2)",
        Duration::from_secs(2),
    );
    assert!(
        agent
            .stderr_text()
            .lines()
            .any(|l| l.contains("point=_Stop server=guard outcome=timeout")),
        "H9: timeout outcome logged{}",
        agent.context()
    );
    let first = stop_calls(&log);
    assert_eq!(first.len(), 1, "{first:#?}");
    let first_id = first[0]["id"].clone();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let logged = log_of(&log);
        if logged.iter().any(|m| is_cancel_of(m, &first_id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "H4: no notifications/cancelled for request {first_id}: {logged:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        procfs::is_alive(server) && procfs::is_alive(grand),
        "H4: one timeout is tolerated, the server must live: {} / {}",
        procfs::describe(server),
        procfs::describe(grand)
    );
    assert!(
        !agent.stderr_text().contains("consecutive timeouts"),
        "killed after one timeout{}",
        agent.context()
    );

    // Second prompt: the second consecutive timeout kills the group.
    let started = Instant::now();
    let r2 = agent.prompt_timeout(&sid, "second", Duration::from_secs(10));
    let took = started.elapsed();
    assert_end_turn(&agent, &r2);
    assert!(
        took < Duration::from_millis(1500),
        "second gate took {took:?}"
    );
    assert_eq!(llm.requests().len(), 2);
    assert_eq!(stop_calls(&log).len(), 2, "the second gate called the hook");
    wait_stderr(
        &agent,
        "hook: killing server 'guard' after 2 consecutive timeouts",
        Duration::from_secs(2),
    );
    let left = procfs::wait_all_dead(&[server, grand], Duration::from_secs(5));
    assert!(
        left.is_empty(),
        "H4: the server's process group survives the kill: {:?}{}",
        procfs::describe_all(&left),
        agent.context()
    );
    agent.finish();
}

/// H3: four allowlisted hook servers taking 300 ms each are called concurrently (the gate takes
/// about 300 ms, not 1200), and their objections are injected in registration order (the order
/// of `mcpServers`, not of the allowlist nor of the replies), one budget unit for the round.
pub fn h3_four_hook_servers_run_concurrently(ctx: &Ctx) {
    let s = Scratch::new();
    let names = ["delta", "alpha", "charlie", "bravo"];
    let logs: Vec<String> = names.iter().map(|n| s.file(&format!("{n}.log"))).collect();
    let texts: Vec<String> = names
        .iter()
        .map(|n| format!("objection from {n}"))
        .collect();
    let servers: Vec<Value> = names
        .iter()
        .zip(logs.iter().zip(&texts))
        .map(|(n, (log, text))| {
            hook_server(
                n,
                log,
                &[
                    ("FAKE_MCP_STOP_DELAY_MS", "300"),
                    ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                    ("FAKE_MCP_STOP_TEXT", text),
                ],
            )
        })
        .collect();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "done"))
        .env(&[("MCP_HOOK_SERVERS", "bravo,alpha,delta,charlie")])
        .servers(servers)
        .start();
    let p = agent.start_prompt(&sid, "go");
    let r = agent.wait_response(&p, Duration::from_secs(20));
    let answered = Instant::now();
    assert_end_turn(&agent, &r);
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 2, "stopObjections": 1, "stopBudget": 3, "stopBudgetExhausted": false}),
        "four objections in one round cost one unit: {r}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    // Each gate is timed from the request before it to the next request the agent made (a
    // dialect's injected error attempts count as requests here: they follow the gate).
    let all = llm.all_requests();
    let next_after = |t: Instant| all.iter().map(|r| r.received_at).find(|&r| r > t);
    let gate1 = next_after(reqs[0].received_at).map_or(Duration::MAX, |t| t - reqs[0].received_at);
    let gate2 = answered
        .saturating_duration_since(all.last().map_or(reqs[1].received_at, |r| r.received_at));
    for (which, gap) in [("first", gate1), ("second", gate2)] {
        assert!(
            gap < Duration::from_millis(900),
            "H3: the {which} gate over 4 × 300 ms hooks took {gap:?} (sequential would be ≥ 1200 ms)"
        );
    }
    let inj = stop_injections(&reqs[1]);
    assert_eq!(inj.len(), 4, "{inj:?}");
    for (i, (n, text)) in inj.iter().zip(names.iter().zip(&texts)) {
        assert_injection(i, n, text);
    }
    reqs[1].assert_tool_calls_paired();
    for log in &logs {
        assert_eq!(stop_calls(log).len(), 2, "{log}: one call per gate");
    }
    agent.finish();
}

/// A7/H8: with `BUZZ_AGENT_PERMISSION=ask`, `_Stop` reaches the server exactly once per gate
/// and never produces `session/request_permission` (nor a tool update); a model tool call in a
/// later prompt does ask, exactly once.
pub fn a7_h8_stop_reaches_server_once_without_permission_request(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("first answer"),
            Reply::text("second answer"),
            Reply::tool_calls(vec![("call_1", "guard__echo", json!({"text": "asked"}))]),
            Reply::text("third answer"),
        ])
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_PERMISSION", "ask"),
        ])
        .servers([hook_server(
            "guard",
            &log,
            &[("FAKE_MCP_STOP_OBJECT_TIMES", "1")],
        )])
        .start();
    let r = agent.prompt(&sid, "plain text please");
    assert_end_turn(&agent, &r);
    assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 1, "{r}");
    assert_eq!(llm.requests().len(), 2);
    assert_eq!(
        stop_calls(&log).len(),
        2,
        "A7: _Stop reaches the server exactly once per gate (2 gates)"
    );
    assert!(
        agent.permission_requests().is_empty(),
        "A7/H8: a hook call asked for permission: {:#?}",
        agent.permission_requests()
    );
    assert!(tool_call_announcements(&agent.session_updates(&sid)).is_empty());

    let r = agent.prompt(&sid, "now use the echo tool");
    assert_end_turn(&agent, &r);
    assert_eq!(llm.requests().len(), 4);
    assert_eq!(stop_calls(&log).len(), 3, "one more gate, one more call");
    let asks = agent.permission_requests();
    assert_eq!(asks.len(), 1, "only the model's echo call asks: {asks:#?}");
    assert_eq!(
        asks[0]["params"]["toolCall"]["rawInput"],
        json!({"text": "asked"}),
        "{asks:#?}"
    );
    let logged = log_of(&log);
    assert_eq!(fake_mcp::count_calls(&logged, "echo"), 1);
    agent.finish();
}

/// G1/G2/H5: the reply guard. (a) off by default; (b) on, silent model: exactly 2 reminders
/// then `end_turn` (3 LLM calls); (c) posting attempts (`shell` with `messages send` or
/// `reactions add`, a `BUZZ_AGENT_REPLY_TOOLS` entry) satisfy it, a non-posting shell command or
/// an undispatched unknown tool does not; (d) with a hook objection in the same round: one
/// budget unit, hook text first then the reminder; (e) it spends the `_Stop` budget.
pub fn g1_g2_reply_guard(ctx: &Ctx) {
    let s = Scratch::new();

    // (a) Off by default.
    {
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .llm(always_text(ctx, "silent answer"))
            .start();
        let r = agent.prompt(&sid, "hello");
        assert_end_turn(&agent, &r);
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 1, "(a) no reminder round by default");
        assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 0);
        assert!(!bodies(&reqs).contains("buzz-agent"), "(a)");
        agent.finish();
    }

    // (b), (c), (d) on one agent; one session per case, so histories are separate.
    let guard_log = s.file("guard.log");
    let replies = vec![
        // (b) silent model: three end-turn answers.
        Reply::text("b1"),
        Reply::text("b2"),
        Reply::text("b3"),
        // (c1) shell `messages send`.
        Reply::tool_calls(vec![(
            "c1",
            "sh__shell",
            json!({"command": "buzz messages send hi"}),
        )]),
        Reply::text("c1 done"),
        // (c2) shell `reactions add`.
        Reply::tool_calls(vec![(
            "c2",
            "sh__shell",
            json!({"command": "buzz reactions add thumbsup"}),
        )]),
        Reply::text("c2 done"),
        // (c3) a BUZZ_AGENT_REPLY_TOOLS entry.
        Reply::tool_calls(vec![("c3", "sh__echo", json!({"text": "hi"}))]),
        Reply::text("c3 done"),
        // (c4) shell that does not post: reminders still come.
        Reply::tool_calls(vec![("c4", "sh__shell", json!({"command": "ls -la"}))]),
        Reply::text("c4 a"),
        Reply::text("c4 b"),
        Reply::text("c4 c"),
        // (c5) `messages send` to an unknown tool is never dispatched: not a posting attempt.
        Reply::tool_calls(vec![(
            "c5",
            "nope__shell",
            json!({"command": "buzz messages send hi"}),
        )]),
        Reply::text("c5 a"),
        Reply::text("c5 b"),
        Reply::text("c5 c"),
        // (d) hook objection + reminder in one round, then the model posts.
        Reply::text("d1"),
        Reply::tool_calls(vec![(
            "d2",
            "guard__shell",
            json!({"command": "buzz messages send done"}),
        )]),
        Reply::text("d3"),
    ];
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(replies)
        .env(&[
            ("BUZZ_AGENT_REQUIRE_REPLY", "1"),
            ("BUZZ_AGENT_REPLY_TOOLS", "sh__echo"),
            ("MCP_HOOK_SERVERS", "guard"),
        ])
        .spawn();
    agent.initialize();
    let sh = || fake_mcp_entry("sh", &[("FAKE_MCP_TOOLS", "shell,echo")]);
    // Runs one prompt on a fresh session; returns its requests and the response.
    let run = |servers: Value, case: &str| -> (Vec<RecordedRequest>, Value) {
        let before = llm.requests().len();
        let sid = agent.new_session(&s.ws, servers);
        let r = agent.prompt(&sid, &format!("case {case}"));
        assert_end_turn(&agent, &r);
        let reqs = llm.requests()[before..].to_vec();
        for req in &reqs {
            req.assert_tool_calls_paired();
        }
        (reqs, r)
    };

    // (b)
    let (reqs, r) = run(json!([]), "b");
    assert_eq!(
        reqs.len(),
        3,
        "(b) 2 reminders then end_turn{}",
        agent.context()
    );
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 3, "stopObjections": 2, "stopBudget": 3, "stopBudgetExhausted": false}),
        "(b) {r}"
    );
    for (k, req) in reqs.iter().enumerate() {
        let rem = reminders(req);
        assert_eq!(rem.len(), k, "(b) request {k}: {rem:?}");
        rem.iter().for_each(assert_reminder);
    }

    // (c)
    for (case, expect_calls, expect_reminders) in [
        ("c1", 2, 0),
        ("c2", 2, 0),
        ("c3", 2, 0),
        ("c4", 4, 2),
        ("c5", 4, 2),
    ] {
        let (reqs, r) = run(json!([sh()]), case);
        assert_eq!(reqs.len(), expect_calls, "({case}){}", agent.context());
        assert_eq!(
            buzz_meta(&agent, &r)["stopObjections"],
            expect_reminders,
            "({case}) {r}"
        );
        let last = reqs.last().expect("a request");
        let rem = reminders(last);
        assert_eq!(rem.len(), expect_reminders, "({case}) {rem:?}");
        rem.iter().for_each(assert_reminder);
    }

    // (d)
    let guard = hook_server(
        "guard",
        &guard_log,
        &[
            ("FAKE_MCP_TOOLS", "shell"),
            ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
            ("FAKE_MCP_STOP_TEXT", "guard says: not yet"),
        ],
    );
    let (reqs, r) = run(json!([guard]), "d");
    assert_eq!(reqs.len(), 3, "(d){}", agent.context());
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 3, "stopObjections": 1, "stopBudget": 3, "stopBudgetExhausted": false}),
        "(d) hook + reminder in one round cost one unit: {r}"
    );
    let inj = stop_injections(&reqs[1]);
    assert_eq!(inj.len(), 2, "(d) {inj:?}");
    assert_injection(&inj[0], "guard", "guard says: not yet");
    assert_reminder(&inj[1]);
    assert_eq!(
        stop_injections(&reqs[2]).len(),
        2,
        "(d) nothing more after posting"
    );
    assert_eq!(stop_calls(&guard_log).len(), 2, "(d)");
    agent.finish();

    // (e) The reminder spends the `_Stop` budget: budget 1 → one reminder, then exhausted.
    {
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .llm(always_text(ctx, "silent"))
            .env(&[
                ("BUZZ_AGENT_REQUIRE_REPLY", "1"),
                ("BUZZ_AGENT_STOP_MAX_REJECTIONS", "1"),
            ])
            .start();
        let r = agent.prompt(&sid, "hello");
        assert_end_turn(&agent, &r);
        assert_eq!(llm.requests().len(), 2, "(e)");
        assert_eq!(
            buzz_meta(&agent, &r),
            json!({"rounds": 2, "stopObjections": 1, "stopBudget": 1, "stopBudgetExhausted": true}),
            "(e) {r}"
        );
        agent.finish();
    }
}

/// H5/G1: `BUZZ_AGENT_STOP_MAX_REJECTIONS=0` disables `_Stop` and the reply guard: one LLM call,
/// the always-objecting hook is never called.
pub fn h5_g1_budget_zero_disables_stop_and_reply_guard(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "done"))
        .env(&[
            ("MCP_HOOK_SERVERS", "*"),
            ("BUZZ_AGENT_REQUIRE_REPLY", "1"),
            ("BUZZ_AGENT_STOP_MAX_REJECTIONS", "0"),
        ])
        .servers([hook_server("guard", &log, &[])])
        .start();
    let r = agent.prompt(&sid, "go");
    assert_end_turn(&agent, &r);
    assert_eq!(llm.requests().len(), 1);
    assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 0, "{r}");
    assert_eq!(buzz_meta(&agent, &r)["stopBudget"], 0, "{r}");
    assert!(
        stop_calls(&log).is_empty(),
        "budget 0: _Stop must not be called"
    );
    agent.finish();
}

/// H3: the `_Stop` call is `tools/call {name:"_Stop", arguments:{}}` with
/// `_meta["buzz/hook"] = {point, sessionId, attempt, budgetRemaining}`: attempt 1 then 2,
/// budgetRemaining 3 then 2.
pub fn h3_meta_carries_point_session_attempt_budget(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "done"))
        .env(&[("MCP_HOOK_SERVERS", "guard")])
        .servers([hook_server(
            "guard",
            &log,
            &[("FAKE_MCP_STOP_OBJECT_TIMES", "1")],
        )])
        .start();
    let r = agent.prompt(&sid, "go");
    assert_end_turn(&agent, &r);
    let calls = stop_calls(&log);
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for (c, (attempt, remaining)) in calls.iter().zip([(1, 3), (2, 2)]) {
        let p = &c["params"];
        assert_eq!(p["name"], "_Stop", "{c}");
        assert_eq!(p["arguments"], json!({}), "H3: arguments stay {{}}: {c}");
        assert_eq!(
            p["_meta"]["buzz/hook"],
            json!({"point": "_Stop", "sessionId": sid, "attempt": attempt,
                   "budgetRemaining": remaining}),
            "{c}"
        );
    }
    agent.finish();
}

/// A fail-open server: name, extra `FAKE_MCP_*` variables, expected H9 outcome.
type FailOpenCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// H3/H4 fail-open: a JSON-RPC error, an `isError` result, an empty text and a blank text never
/// object: `end_turn` after one LLM call, each server called once, outcomes logged (H9).
pub fn h4_fail_open_error_iserror_empty_never_object(ctx: &Ctx) {
    let s = Scratch::new();
    let cases: [FailOpenCase; 4] = [
        ("err", &[("FAKE_MCP_STOP_MODE", "error")], "error"),
        (
            "iserr",
            &[
                ("FAKE_MCP_STOP_MODE", "iserror"),
                ("FAKE_MCP_STOP_TEXT", "ISERROR-TEXT"),
            ],
            "error",
        ),
        ("empty", &[("FAKE_MCP_STOP_OBJECT_TIMES", "0")], "empty"),
        ("blank", &[("FAKE_MCP_STOP_TEXT", "  \n\t  ")], "empty"),
    ];
    let logs: Vec<String> = cases
        .iter()
        .map(|(n, _, _)| s.file(&format!("{n}.log")))
        .collect();
    let servers = cases
        .iter()
        .zip(&logs)
        .map(|((n, extra, _), log)| hook_server(n, log, extra));
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(always_text(ctx, "done"))
        .env(&[("MCP_HOOK_SERVERS", "*")])
        .servers(servers)
        .start();
    let r = agent.prompt(&sid, "go");
    assert_end_turn(&agent, &r);
    assert_eq!(
        llm.requests().len(),
        1,
        "fail-open: no objection{}",
        agent.context()
    );
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 1, "stopObjections": 0, "stopBudget": 3, "stopBudgetExhausted": false}),
        "{r}"
    );
    for ((name, _, outcome), log) in cases.iter().zip(&logs) {
        assert_eq!(stop_calls(log).len(), 1, "{name}");
        let needle = format!("point=_Stop server={name} outcome={outcome}");
        wait_stderr(&agent, &needle, Duration::from_secs(2));
    }
    agent.finish();
}
