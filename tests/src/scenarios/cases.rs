//! Real-world failure cases (docs/cases.md) that no SPEC-area scenario covers
//! whole: C13 (server→client requests), C14 (unanswered and late MCP replies), C15 (error
//! replies, `isError`, exits), C30 (hanging and late hook servers), C31 (a `_Stop` hook that
//! always blocks), C33 (the client killed: EOF plus a broken stdout) and C34 (`sh -c`
//! launchers on every teardown path). Each is named after its case and the rule; where a case
//! and docs/spec.md differ, the spec wins (noted at the assertion).

use super::setup::Setup;
use super::util::{
    Scratch, assert_end_turn, assert_no_survivors, bodies, buzz_meta, count_lines, first_request,
    hook_attempts, hook_server, is_cancel_of, log_of, read_pids, stop_calls, stop_json,
    stubborn_launcher, wait_for,
};
use crate::fake_llm::{FakeLlm, Reply};
use crate::fake_mcp::{self, CRASH_STDERR, EXIT_AFTER_INIT_STDERR};
use crate::harness::{
    AgentProc, Ctx, agent_command, agent_env, assert_tool_updates_well_formed, fake_mcp_entry,
    kill_tree, tool_update_text,
};
use crate::procfs;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---- helpers ------------------------------------------------------------------------------------

/// Waits until process group `pgid` has no live member (C34: `pgrep -g` is empty).
fn assert_group_dies(agent: &AgentProc, pgid: i32, timeout: Duration, when: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        let left = procfs::group_members(pgid);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "C34 {when}: process group {pgid} still has members after {timeout:?}: {:?}{}",
            procfs::describe_all(&left),
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The launcher's process group for a server whose pids are in `pidfile`: the group of the
/// server, led by the `sh` that the agent spawned.
fn launcher_group(agent: &AgentProc, pidfile: &str) -> (i32, i32, i32) {
    let (server, grand) = read_pids(pidfile);
    let st = procfs::stat(server).unwrap_or_else(|| panic!("server {server} is not running"));
    let sh = procfs::stat(st.pgid).unwrap_or_else(|| panic!("group leader {} gone", st.pgid));
    assert_eq!(
        (sh.ppid, st.ppid),
        (agent.pid(), sh.pid),
        "the launcher is the agent's child and leads its own group (M1): {sh:?} / {st:?}"
    );
    assert_eq!(procfs::stat(grand).map(|g| g.pgid), Some(sh.pid));
    (sh.pid, server, grand)
}

// ---- C13 ----------------------------------------------------------------------------------------

/// C13/M6/T5: a server sends `ping`, `roots/list`, `sampling/createMessage` and
/// `elicitation/create` after `notifications/initialized` and again while each of our
/// `tools/call`s is pending (the sampling request reusing that call's own numeric id). `ping`
/// gets `{}`, `roots/list` the session cwd (M13), `elicitation/create` `decline` (M12: this
/// client presents no elicitation, so none is declared and a server asking anyway is
/// declined), sampling -32601 (SPEC M6), each answer echoes the id with its exact type,
/// exactly once; the
/// server's request 5 never resolves our request 5 (the call completes with its own text), and
/// answering while our call is pending does not deadlock. The server keeps working.
pub fn c13_server_requests_are_answered_in_their_own_id_space(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["fs.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "done"}))]),
            Reply::tool_calls(vec![(
                "call_2",
                "fs__echo",
                json!({"text": "still serving"}),
            )]),
            Reply::text("ok"),
        ])
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_SERVER_REQUESTS", "1"),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )
        .start();
    let started = Instant::now();
    let r = agent.prompt(&sid, "echo twice");
    let took = started.elapsed();
    assert_end_turn(&agent, &r);
    assert!(
        took < Duration::from_secs(4),
        "C13: server requests are answered at once (the fake waits 5 s for them): {took:?}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let last = &reqs[2];
    last.assert_tool_calls_paired();
    assert_eq!(
        last.tool_result_for("call_1").as_deref(),
        Some("done"),
        "C13: our call completes with its own result, not the server's request answers"
    );
    assert_eq!(
        last.tool_result_for("call_2").as_deref(),
        Some("still serving")
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert!(
        terminal.iter().all(|t| t["status"] == "completed"),
        "{terminal:#?}"
    );

    let logged = log_of(&log);
    let init = first_request(&logged, "initialize");
    assert_eq!(
        init["params"]["capabilities"],
        json!({"roots": {"listChanged": false}}),
        "M13: roots is declared; M12: no elicitation for a client without it; no sampling"
    );
    let ws = s.ws.to_str().expect("a UTF-8 workspace path");
    let name =
        s.ws.file_name()
            .and_then(|n| n.to_str())
            .expect("a last component");
    let mut batches = vec![("init".to_string(), init["id"].clone())];
    for call in fake_mcp::logged_tool_calls(&logged) {
        let id = call["id"].clone();
        assert!(id.is_u64(), "M2/T5: we send integer ids: {call}");
        batches.push((format!("call-{id}"), id));
    }
    assert_eq!(batches.len(), 3, "{logged:#?}");
    let answers_to = |id: &Value| -> Vec<&Value> {
        logged
            .iter()
            .filter(|m| m.get("method").is_none() && &m["id"] == id)
            .collect()
    };
    for (prefix, collide) in &batches {
        let ping_id = json!(format!("{prefix}-1"));
        assert_eq!(
            answers_to(&ping_id),
            [&json!({"jsonrpc": "2.0", "id": ping_id, "result": {}})],
            "C13/M6: ping → {{}} once"
        );
        let roots_id = json!(format!("{prefix}-2"));
        assert_eq!(
            answers_to(&roots_id),
            [&json!({"jsonrpc": "2.0", "id": roots_id,
                     "result": {"roots": [{"uri": format!("file://{ws}"), "name": name}]}})],
            "M13: roots/list → the session cwd as a file:// URI, once"
        );
        let elicit_id = json!(format!("{prefix}-4"));
        assert_eq!(
            answers_to(&elicit_id),
            [&json!({"jsonrpc": "2.0", "id": elicit_id, "result": {"action": "decline"}})],
            "M12: a client without elicitation → decline, once"
        );
        let a = answers_to(collide);
        assert_eq!(a.len(), 1, "sampling {collide}: exactly one answer: {a:#?}");
        assert_eq!(a[0]["error"]["code"], -32601, "sampling: {}", a[0]);
        assert!(a[0].get("result").is_none(), "sampling: {}", a[0]);
        assert!(
            answers_to(&json!(collide.to_string())).is_empty(),
            "T5: the numeric id {collide} is echoed as a number, not a string"
        );
    }
    agent.finish();
}

// ---- C14 ----------------------------------------------------------------------------------------

/// C14/M5/M9/A2: (3) a server that never answers `initialize` fails `session/new` within the
/// init timeout, naming the server and the timeout; it is killed (grandchild too) and gets no
/// `notifications/cancelled`. (1, 2) A `tools/call` past BUZZ_AGENT_TOOL_TIMEOUT_SECS gets
/// `notifications/cancelled {requestId, reason}`, a `failed` update and an error result naming
/// the timeout; the server (which ignores SIGTERM, so it lives on to write its late reply) is
/// killed; a call that comes after the restart backoff (M9: 0.5 s from the death) waits for the
/// old process to be reaped and the server to restart, and gets its own reply from the new
/// process, as does the next call — the late reply reaches no call and never the model; the
/// timed-out call is not retried; the session takes prompts afterwards. (A call within the
/// backoff failing at once is `lifecycle::m9_…`.)
pub fn c14_unanswered_initialize_and_timed_out_call_are_bounded_cancelled_and_killed(ctx: &Ctx) {
    let (s, [silent_log, silent_pids]) = Scratch::with_files(["silent.log", "silent.pids"]);
    let (log, pids) = (s.file("fs.log"), s.file("fs.pids"));
    // The first server process, and whether it was still alive when its late reply was due.
    let server0: Arc<Mutex<i32>> = Arc::default();
    let alive_at_late_reply: Arc<Mutex<Option<bool>>> = Arc::default();
    let fresh_sent = Arc::new(AtomicBool::new(false));
    let llm = {
        let (log, server0, alive) = (log.clone(), server0.clone(), alive_at_late_reply.clone());
        FakeLlm::with_handler(move |i, _| match i {
            // Times out after 1 s; the server (deaf to SIGTERM) replies at 2 s, before its
            // SIGKILL 2 s after the timeout.
            0 => Reply::tool_calls(vec![("call_1", "fs__slow", json!({"ms": 2000}))]),
            // Right after the timeout, the model "thinks" past the late reply; then calls the
            // dead server, past its backoff: the call restarts it and waits.
            1 => {
                std::thread::sleep(Duration::from_millis(1300));
                let pid = *server0.lock().unwrap_or_else(|e| e.into_inner());
                *alive.lock().unwrap_or_else(|e| e.into_inner()) = Some(procfs::is_alive(pid));
                Reply::tool_calls(vec![("call_2", "fs__echo", json!({"text": "too soon"}))])
                    .delay_ms(1000)
            }
            // Once the killed process is reaped and the backoff passed, a round restarts the
            // server; the model waits for that handshake, then calls it.
            _ if fresh_sent.load(Ordering::SeqCst) => Reply::text("carried on"),
            _ => {
                let deadline = Instant::now() + Duration::from_secs(2);
                let relisted = || {
                    log_of(&log)
                        .iter()
                        .filter(|m| m["method"] == "tools/list")
                        .count()
                        >= 2
                };
                while !relisted() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if relisted() {
                    std::thread::sleep(Duration::from_millis(200));
                    fresh_sent.store(true, Ordering::SeqCst);
                    Reply::tool_calls(vec![("call_fresh", "fs__echo", json!({"text": "fresh"}))])
                } else {
                    let id = format!("call_wait_{i}");
                    Reply::tool_calls(vec![(id.as_str(), "fs__echo", json!({"text": "wait"}))])
                        .delay_ms(500)
                }
            }
        })
    };
    let (llm, agent) = Setup::new(ctx, &s)
        .llm(llm)
        .env(&[
            ("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "1"),
            ("BUZZ_AGENT_TOOL_TIMEOUT_SECS", "1"),
        ])
        .spawn();
    agent.initialize();

    // (3) initialize never answered.
    let started = Instant::now();
    let r = agent.request(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [fake_mcp_entry("silent", &[
            ("FAKE_MCP_NO_INIT_REPLY", "1"),
            ("FAKE_MCP_CALL_LOG", &silent_log),
            ("FAKE_MCP_GRANDCHILD_PIDFILE", &silent_pids),
        ])]}),
    );
    let took = started.elapsed();
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(
        took < Duration::from_secs(4),
        "C14: bounded by the 1 s init timeout: {took:?}"
    );
    assert!(
        msg.contains("silent") && msg.to_lowercase().contains("timed out"),
        "C14/C08: names the server and the timeout: {msg}"
    );
    let (server, grand) = read_pids(&silent_pids);
    assert_no_survivors(
        &[server, grand],
        &[],
        Duration::from_secs(5),
        "C14: the unanswering server is killed",
    );
    let methods: Vec<Value> = log_of(&silent_log)
        .iter()
        .map(|m| m["method"].clone())
        .collect();
    assert_eq!(
        methods,
        [json!("initialize")],
        "C14: an initialize timeout gets no notifications/cancelled (nor anything else)"
    );

    // (1, 2) tools/call timeout and a late reply.
    let sid = agent.new_session(
        &s.ws,
        json!([fake_mcp_entry(
            "fs",
            &[
                ("FAKE_MCP_TOOLS", "slow,echo"),
                ("FAKE_MCP_IGNORE_TERM", "1"),
                ("FAKE_MCP_CALL_LOG", &log),
                ("FAKE_MCP_GRANDCHILD_PIDFILE", &pids),
            ]
        )]),
    );
    let (first, first_grand) = read_pids(&pids);
    *server0.lock().unwrap_or_else(|e| e.into_inner()) = first;
    let started = Instant::now();
    let r = agent.prompt_timeout(&sid, "slow then more", Duration::from_secs(40));
    let took = started.elapsed();
    assert_end_turn(&agent, &r);
    assert!(took < Duration::from_secs(25), "{took:?}");
    assert_eq!(
        *alive_at_late_reply
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
        Some(true),
        "the timed-out server was alive (SIGTERM ignored) when its late reply was due"
    );
    let reqs = llm.requests();
    let last = reqs.last().expect("requests");
    last.assert_tool_calls_paired();
    let t1 = last.tool_result_for("call_1").unwrap_or_default();
    assert!(
        t1.contains("MCP server 'fs' timed out") && t1.contains("BUZZ_AGENT_TOOL_TIMEOUT_SECS"),
        "C14: the model learns the call to server 'fs' timed out: {t1:?}"
    );
    let t2 = last.tool_result_for("call_2").unwrap_or_default();
    assert_eq!(
        t2, "too soon",
        "M9: a call after the backoff restarts the killed server, waits for it and is served"
    );
    assert_eq!(
        last.tool_result_for("call_fresh").as_deref(),
        Some("fresh"),
        "C14: the next call on the restarted server gets its own reply"
    );
    assert!(
        !bodies(&reqs).contains("slept 2000 ms"),
        "C14: the late reply to the timed-out call reached the model"
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(terminal[0]["status"], "failed", "{}", terminal[0]);
    assert!(
        tool_update_text(&terminal[0]).contains("timed out"),
        "{}",
        terminal[0]
    );
    let fresh = terminal.last().expect("updates");
    assert_eq!(
        (fresh["status"].as_str(), tool_update_text(fresh).as_str()),
        (Some("completed"), "fresh"),
        "{terminal:#?}"
    );
    let logged = log_of(&log);
    let calls = fake_mcp::logged_tool_calls(&logged);
    let slow: Vec<&Value> = calls
        .iter()
        .filter(|c| c["params"]["name"] == "slow")
        .collect();
    assert_eq!(
        slow.len(),
        1,
        "C14: a timed-out call is never retried: {calls:#?}"
    );
    let id1 = slow[0]["id"].clone();
    let cancel = logged
        .iter()
        .find(|m| is_cancel_of(m, &id1))
        .unwrap_or_else(|| panic!("C14: no notifications/cancelled for {id1}: {logged:#?}"));
    assert!(
        cancel["params"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("timeout")),
        "C14: the cancellation says why: {cancel}"
    );
    let inits = logged
        .iter()
        .filter(|m| m["method"] == "initialize")
        .count();
    assert_eq!(inits, 2, "M5/M9: killed, then restarted once: {logged:#?}");
    assert_no_survivors(
        &[first, first_grand],
        &[],
        Duration::from_secs(1),
        "M5: the timed-out server's group is killed",
    );
    let r = agent.prompt(&sid, "still there?");
    assert_end_turn(&agent, &r);
    agent.finish();
}

// ---- C15 ----------------------------------------------------------------------------------------

/// C15/M5/M7/L3/A6: a JSON-RPC error reply resolves the call at once as
/// `tool call rejected: <message>` with the code (`failed`), and the server stays healthy; an
/// `isError` result reaches the model as an error with its text (SPEC A6: `completed` with
/// `rawOutput.isError`, where the case says `failed`); an exit mid-call fails **every** pending
/// call at once with the exit status and stderr tail, the child is reaped; a server that exits
/// right after answering `initialize` fails `session/new` naming the exit status and stderr; the
/// ACP session stays alive throughout.
pub fn c15_error_replies_iserror_and_exits_resolve_at_once_with_the_cause(ctx: &Ctx) {
    let (s, [log, pids]) = Scratch::with_files(["fs.log", "fs.pids"]);
    let inits_at_round_2: Arc<Mutex<Option<usize>>> = Arc::default();
    let llm = {
        let (log, seen) = (log.clone(), inits_at_round_2.clone());
        FakeLlm::with_handler(move |i, _| match i {
            0 => Reply::tool_calls(vec![
                ("call_rej", "fs__reject", json!({})),
                ("call_fail", "fs__fail", json!({})),
            ]),
            1 => Reply::tool_calls(vec![(
                "call_ok",
                "fs__echo",
                json!({"text": "still healthy"}),
            )]),
            2 => {
                let n = log_of(&log)
                    .iter()
                    .filter(|m| m["method"] == "initialize")
                    .count();
                *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(n);
                Reply::tool_calls(vec![
                    ("call_slow", "fs__slow", json!({"ms": 30000})),
                    ("call_crash", "fs__crash", json!({})),
                ])
            }
            3 => Reply::text("recovered"),
            _ => Reply::text("alive"),
        })
    };
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(llm)
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_TOOLS", "reject,fail,echo,slow,crash"),
                ("FAKE_MCP_CALL_LOG", &log),
                ("FAKE_MCP_GRANDCHILD_PIDFILE", &pids),
            ],
        )
        .start();
    let (server, grand) = read_pids(&pids);
    let started = Instant::now();
    let r = agent.prompt(&sid, "reject, fail, echo, then crash mid-call");
    let took = started.elapsed();
    assert_end_turn(&agent, &r);
    assert!(
        took < Duration::from_secs(10),
        "C15: no call waits for a timeout (slow sleeps 30 s): {took:?}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    let last = &reqs[3];
    last.assert_tool_calls_paired();
    let rej = last.tool_result_for("call_rej").unwrap_or_default();
    assert!(
        rej.contains("tool call rejected: Invalid arguments") && rej.contains("-32602"),
        "C15/M5: the error message and code reach the model: {rej:?}"
    );
    let fail = last.tool_result_for("call_fail").unwrap_or_default();
    assert!(
        fail.contains("boom") && fail.to_lowercase().contains("error"),
        "C15/L3: an isError result reaches the model as an error with its text: {fail:?}"
    );
    assert_eq!(
        last.tool_result_for("call_ok").as_deref(),
        Some("still healthy")
    );
    assert_eq!(
        *inits_at_round_2.lock().unwrap_or_else(|e| e.into_inner()),
        Some(1),
        "M5: a JSON-RPC error leaves the server healthy (no restart before the echo)"
    );
    for id in ["call_slow", "call_crash"] {
        let t = last.tool_result_for(id).unwrap_or_default();
        assert!(
            t.contains("'fs'")
                && t.contains("exited")
                && t.contains("exit status 3")
                && t.contains(CRASH_STDERR),
            "C15/M7: {id} fails with the name, exit status and stderr tail: {t:?}"
        );
    }
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    let summary: Vec<(&str, bool)> = terminal
        .iter()
        .map(|t| {
            (
                t["status"].as_str().unwrap_or_default(),
                t["rawOutput"]["isError"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("failed", true),
            // C54: an isError result is a failed call.
            ("failed", true),
            ("completed", false),
            ("failed", true),
            ("failed", true)
        ],
        "{terminal:#?}"
    );
    // The crashed child is reaped (no zombie) and its group swept (its grandchild too).
    let deadline = Instant::now() + Duration::from_secs(5);
    while procfs::stat(server).is_some() {
        assert!(
            Instant::now() < deadline,
            "C15: the exited server is not reaped: {}",
            procfs::describe(server)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Script B: answers initialize, then exits 3.
    let started = Instant::now();
    let r = agent.request(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [fake_mcp_entry("dbx", &[("FAKE_MCP_EXIT_AFTER_INIT", "1")])]}),
    );
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        msg.contains("dbx")
            && msg.contains("exit status 3")
            && msg.contains(EXIT_AFTER_INIT_STDERR),
        "C15: names the server, the exit status and the stderr tail: {msg}"
    );
    // The first session is alive.
    let r = agent.prompt(&sid, "are you there?");
    assert_end_turn(&agent, &r);
    assert_group_dies(&agent, server, Duration::from_secs(5), "crashed server");
    assert!(!procfs::is_alive(grand));
    agent.finish();
}

// ---- C30 ----------------------------------------------------------------------------------------

/// C30 (b, c)/H4/I6: the hook server answers each odd `_Stop` call late — only when the next
/// call arrives, just before answering that one in time. The late objection is dropped (it
/// never satisfies the next call and never reaches the model), the in-time reply resets the
/// consecutive-timeout count, so timeouts 1 and 3 both log `(1/2)` and the server is never
/// killed; each timed-out call gets `notifications/cancelled`; every prompt ends `end_turn`
/// within the hook timeout plus a margin (C30 a).
pub fn h4_c30_late_hook_reply_never_satisfies_the_next_call_and_a_reply_resets_the_count(
    ctx: &Ctx,
) {
    const LATE: &str = "LATE-OBJECTION must never be injected";
    let (s, [log, pids]) = Scratch::with_files(["guard.log", "guard.pids"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("done"))
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "400"),
        ])
        .servers([hook_server(
            "guard",
            &log,
            &[
                ("FAKE_MCP_STOP_MODE", "late"),
                ("FAKE_MCP_STOP_TEXT", LATE),
                ("FAKE_MCP_GRANDCHILD_PIDFILE", &pids),
            ],
        )])
        .start();
    let (server, _) = read_pids(&pids);
    for k in 1..=4usize {
        let started = Instant::now();
        let r = agent.prompt(&sid, &format!("prompt {k}"));
        let took = started.elapsed();
        assert_end_turn(&agent, &r);
        assert_eq!(
            buzz_meta(&agent, &r)["stopObjections"],
            0,
            "prompt {k}: a late reply is no objection: {r}"
        );
        assert!(
            took < Duration::from_millis(400 + 2000),
            "C30: prompt {k} took {took:?} (hook timeout 400 ms)"
        );
        assert_eq!(llm.requests().len(), k, "prompt {k}: one LLM call");
        assert_eq!(stop_calls(&log).len(), k);
    }
    assert!(
        !bodies(&llm.requests()).contains("LATE-OBJECTION"),
        "C30: a late reply satisfied a later call"
    );
    let calls = stop_calls(&log);
    for n in [0, 2] {
        let id = calls[n]["id"].clone();
        wait_for(
            &agent,
            &format!("notifications/cancelled for _Stop {id}"),
            Duration::from_secs(3),
            || log_of(&log).iter().any(|m| is_cancel_of(m, &id)),
        );
    }
    assert!(
        !log_of(&log)
            .iter()
            .any(|m| is_cancel_of(m, &calls[1]["id"]) || is_cancel_of(m, &calls[3]["id"])),
        "in-time calls are not cancelled"
    );
    assert_eq!(
        count_lines(&agent, "hook: server 'guard' timed out (1/2)"),
        2,
        "H4: the in-time reply reset the count, so the 3rd call's timeout is again 1/2{}",
        agent.context()
    );
    assert_eq!(count_lines(&agent, "consecutive timeouts"), 0);
    assert_eq!(
        count_lines(&agent, "point=_Stop server=guard outcome=timeout"),
        2
    );
    assert_eq!(
        count_lines(&agent, "point=_Stop server=guard outcome=empty"),
        2
    );
    assert!(
        procfs::is_alive(server),
        "H4: never two consecutive timeouts, the server lives"
    );
    agent.finish();
}

/// C30 (a, e)/C34/H4: a hook server that never answers `_Stop`, launched by `sh -c` with
/// `trap '' TERM`, itself ignoring SIGTERM and running a `sleep 1000` grandchild: every prompt
/// ends `end_turn` within the 300 ms hook timeout plus a margin; the second consecutive timeout
/// kills the launcher's whole process group (SIGKILL after the grace), leaving no member.
pub fn h4_c30_c34_hanging_stubborn_hook_launcher_bounds_every_prompt_and_its_group_dies(ctx: &Ctx) {
    let (s, [log, pids]) = Scratch::with_files(["guard.log", "guard.pids"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("done"))
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "300"),
        ])
        .servers([stubborn_launcher(
            "guard",
            &pids,
            &[
                ("FAKE_MCP_STOP", "1"),
                ("FAKE_MCP_STOP_MODE", "hang"),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )])
        .start();
    let (group, server, grand) = launcher_group(&agent, &pids);
    for k in 1..=3usize {
        let started = Instant::now();
        let r = agent.prompt(&sid, &format!("prompt {k}"));
        let took = started.elapsed();
        assert_end_turn(&agent, &r);
        assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 0, "{r}");
        assert!(
            took < Duration::from_millis(300 + 2000),
            "C30 a: prompt {k} took {took:?} (hook timeout 300 ms)"
        );
        if k == 1 {
            assert!(
                procfs::is_alive(server) && procfs::is_alive(grand),
                "H4: one timeout is tolerated"
            );
        }
        if k == 2 {
            wait_for(
                &agent,
                "the kill after 2 consecutive timeouts",
                Duration::from_secs(2),
                || {
                    count_lines(
                        &agent,
                        "hook: killing server 'guard' after 2 consecutive timeouts",
                    ) == 1
                },
            );
            assert_group_dies(&agent, group, Duration::from_secs(6), "hook double timeout");
        }
    }
    assert_eq!(llm.requests().len(), 3);
    agent.finish();
}

// ---- C31 ----------------------------------------------------------------------------------------

/// C31/H5/A8/H3/H4: a `_Stop` hook that blocks every time (`{"decision":"block",…}` text) is
/// capped by the budget: each prompt makes exactly budget + 1 LLM calls and ends `end_turn` with
/// `stopBudgetExhausted`; the hook sees the attempt and the remaining budget; the count resets
/// per prompt. Hooks that fail (JSON-RPC error, or `isError` carrying the same block text) every
/// time never count as a block.
pub fn h5_c31_always_blocking_stop_is_capped_per_prompt_and_errors_never_block(ctx: &Ctx) {
    const BLOCK: &str = r#"{"decision":"block","reason":"tests not run"}"#;
    let s = Scratch::new();
    let (blog, elog, ilog) = (
        s.file("blocker.log"),
        s.file("err.log"),
        s.file("iserr.log"),
    );
    let (llm, agent, blocking) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("done"))
        .env(&[("MCP_HOOK_SERVERS", "blocker,err,iserr")])
        .servers([hook_server(
            "blocker",
            &blog,
            &[("FAKE_MCP_STOP_TEXT", BLOCK)],
        )])
        .start();
    for k in 1..=2usize {
        let r = agent.prompt(&blocking, &format!("prompt {k}"));
        assert_end_turn(&agent, &r);
        assert_eq!(
            buzz_meta(&agent, &r),
            json!({"rounds": 4, "stopObjections": 3, "stopBudget": 3, "stopBudgetExhausted": true}),
            "C31: capped at the budget, visibly (A8), prompt {k}: {r}"
        );
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 4 * k, "prompt {k}: budget 3 → 4 LLM calls");
        let expected = stop_json("blocker", BLOCK);
        let injected = reqs[4 * k - 1]
            .tool_results()
            .into_iter()
            .filter(|(_, t)| *t == expected)
            .count();
        assert_eq!(
            injected,
            3 * k,
            "H6: three objections per prompt, JSON-encoded, kept in history"
        );
        let calls = stop_calls(&blog);
        assert_eq!(calls.len(), 3 * k, "the exhausted gate calls no hook");
        let meta = hook_attempts(&calls[3 * (k - 1)..]);
        assert_eq!(
            meta,
            [
                (json!(1), json!(3)),
                (json!(2), json!(2)),
                (json!(3), json!(1))
            ],
            "C31/H3: the hook sees its re-entry count, reset per prompt"
        );
    }
    assert!(
        agent
            .stderr_text()
            .lines()
            .any(|l| l.to_lowercase().contains("budget") && l.to_lowercase().contains("exhausted")),
        "H9: a budget-exhaustion warning{}",
        agent.context()
    );

    let failing = agent.new_session(
        &s.ws,
        json!([
            hook_server("err", &elog, &[("FAKE_MCP_STOP_MODE", "error")]),
            hook_server(
                "iserr",
                &ilog,
                &[
                    ("FAKE_MCP_STOP_MODE", "iserror"),
                    ("FAKE_MCP_STOP_TEXT", BLOCK)
                ]
            ),
        ]),
    );
    for k in 1..=2usize {
        let before = llm.requests().len();
        let r = agent.prompt(&failing, &format!("failing {k}"));
        assert_end_turn(&agent, &r);
        assert_eq!(
            buzz_meta(&agent, &r),
            json!({"rounds": 1, "stopObjections": 0, "stopBudget": 3, "stopBudgetExhausted": false}),
            "C31: a hook error never counts as a block: {r}"
        );
        assert_eq!(llm.requests().len(), before + 1);
        assert_eq!(stop_calls(&elog).len(), k);
        assert_eq!(stop_calls(&ilog).len(), k);
    }
    agent.finish();
}

// ---- C33 ----------------------------------------------------------------------------------------

/// Kills the process tree of `pid` when dropped (a scenario that spawns the agent itself).
struct TreeGuard(i32);

impl Drop for TreeGuard {
    fn drop(&mut self) {
        kill_tree(self.0);
    }
}

/// C33/P1/M8: the client is killed mid-call (a 60 s tool): the agent's stdout pipe breaks and
/// its stdin reaches EOF at once. Writing the `cancelled` answer then fails with EPIPE; the agent
/// still cancels the call (`notifications/cancelled`), stops every server, exits 0 within 5 s,
/// prints no panic, and no process of its servers survives.
pub fn p1_c33_client_killed_stdin_eof_and_broken_stdout_exit_cleanly(ctx: &Ctx) {
    let (s, [log, pids]) = Scratch::with_files(["a.log", "a.pids"]);
    let llm = FakeLlm::with_handler(|i, _| match i {
        0 => Reply::tool_calls(vec![("call_1", "a__slow", json!({"ms": 60000}))]),
        _ => Reply::text("unexpected extra round"),
    });
    let mut cmd = agent_command(&ctx.agent_bin, &s.ws);
    cmd.envs(agent_env(&llm)).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the agent");
    let pid = child.id() as i32;
    let _guard = TreeGuard(pid);
    // A watchdog: blocking reads below end when the agent is killed.
    let done = Arc::new(AtomicBool::new(false));
    {
        let done = done.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(40);
            while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !done.load(Ordering::SeqCst) {
                kill_tree(pid);
            }
        });
    }
    let stderr = Arc::new(Mutex::new(String::new()));
    {
        let stderr = stderr.clone();
        let mut pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                stderr
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&text);
            }
        });
    }
    let err_text = || stderr.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut call = |id: u64, method: &str, params: Value| -> Value {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{msg}").expect("write to the agent");
        loop {
            let mut line = String::new();
            let n = stdout
                .read_line(&mut line)
                .expect("read the agent's stdout");
            assert!(n > 0, "agent closed stdout; stderr:\n{}", err_text());
            let v: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if v.get("method").is_none() && v["id"] == id {
                return v;
            }
        }
    };
    call(
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let r = call(
        2,
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [fake_mcp_entry("a", &[
            ("FAKE_MCP_TOOLS", "slow"),
            ("FAKE_MCP_CALL_LOG", &log),
            ("FAKE_MCP_GRANDCHILD_PIDFILE", &pids),
        ])]}),
    );
    let sid = r["result"]["sessionId"].clone();
    assert!(sid.is_string(), "{r}");
    let prompt = json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "run the slow tool"}]}});
    writeln!(stdin, "{prompt}").expect("write the prompt");
    let (server, grand) = read_pids(&pids);
    let deadline = Instant::now() + Duration::from_secs(20);
    let call_id = loop {
        if let Some(c) = fake_mcp::logged_tool_calls(&log_of(&log)).first() {
            break c["id"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the slow call never started; stderr:\n{}",
            err_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut watched = procfs::descendants(pid);
    watched.extend([server, grand]);

    // The client dies: its end of both pipes closes.
    drop(stdout);
    drop(stdin);
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break Some(st);
        }
        if started.elapsed() > Duration::from_secs(8) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(200));
    let err = err_text();
    assert!(
        status.is_some_and(|st| st.success()),
        "C33: exit 0 after EOF + EPIPE, got {status:?} after {took:?}; stderr:\n{err}"
    );
    assert!(
        took < Duration::from_secs(5),
        "P1: exit within 5 s, took {took:?}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "C33: no panic on a broken stdout:\n{err}"
    );
    assert!(
        log_of(&log).iter().any(|m| is_cancel_of(m, &call_id)),
        "C33: the in-flight call {call_id} gets notifications/cancelled"
    );
    assert_no_survivors(&watched, &[server], Duration::from_secs(2), "C33");
    assert!(
        !err.contains(crate::harness::SECRET_KEY),
        "P2: the key in the logs"
    );
}

// ---- C34 ----------------------------------------------------------------------------------------

/// C34/M8/A2/T6/C16 (session-start and size-cap teardown paths; hook double timeout:
/// `h4_c30_c34_…`; agent exit: `lifecycle::m8_c34_…`): `sh -c` launchers that ignore SIGTERM
/// with a TERM-ignoring server and a `sleep` grandchild. (1) `session/new` fails (another
/// server's handshake times out): both launchers' groups — the healthy one's too — lose every
/// member. (2) A server writes a stdout line over 16 MiB: the pending call fails at once naming
/// the cap, the turn goes on, and the group loses every member.
pub fn m8_c34_sh_c_launcher_groups_die_on_start_failure_and_oversize_line(ctx: &Ctx) {
    let (s, [p_ok, p_mute, p_big]) = Scratch::with_files(["ok.pids", "mute.pids", "big.pids"]);
    let fill = "x".repeat(4096);
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![(
                "call_big",
                "big__big",
                json!({"bytes": 17 * 1024 * 1024, "fill": fill}),
            )]),
            Reply::text("survived"),
        ])
        .env(&[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "1")])
        .spawn();
    agent.initialize();

    // (1) session start failure.
    let pending = agent.start_request(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [
            stubborn_launcher("ok", &p_ok, &[]),
            stubborn_launcher("mute", &p_mute, &[("FAKE_MCP_NO_INIT_REPLY", "1")]),
        ]}),
    );
    let (g_ok, _, _) = launcher_group(&agent, &p_ok);
    let (g_mute, _, _) = launcher_group(&agent, &p_mute);
    let r = agent.wait_response(&pending, Duration::from_secs(10));
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(msg.contains("mute"), "{msg}");
    for g in [g_mute, g_ok] {
        assert_group_dies(&agent, g, Duration::from_secs(6), "session start failure");
    }

    // (2) a stdout line over 16 MiB.
    let sid = agent.new_session(
        &s.ws,
        json!([stubborn_launcher(
            "big",
            &p_big,
            &[("FAKE_MCP_TOOLS", "big")]
        )]),
    );
    let (g_big, _, _) = launcher_group(&agent, &p_big);
    let r = agent.prompt_timeout(&sid, "flood", Duration::from_secs(30));
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let t = reqs[1].tool_result_for("call_big").unwrap_or_default();
    assert!(
        t.contains("16 MiB") && t.len() < 4096,
        "T6/C16: the call fails naming the cap: {}",
        &t[..t.len().min(300)]
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(terminal[0]["status"], "failed");
    assert_group_dies(&agent, g_big, Duration::from_secs(6), "oversize line");
    agent.finish();
}

/// C36 / L9: a server's reply line holds invalid UTF-8 (legacy-encoded tool output) but is
/// otherwise perfect JSON-RPC. The call completes at once with the text decoded lossily
/// (U+FFFD per invalid sequence), the server is not killed and serves the next call.
pub fn c36_invalid_utf8_mcp_reply_is_decoded_lossily(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__latin1", json!({}))]),
            Reply::text("read it"),
            Reply::tool_calls(vec![(
                "call_2",
                "fs__echo",
                json!({"text": "still serving"}),
            )]),
            Reply::text("done"),
        ])
        // A tool timeout far longer than the test: a dropped frame would hang the call.
        .env(&[("BUZZ_AGENT_TOOL_TIMEOUT_SECS", "600")])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "latin1,echo")])
        .start();
    let started = Instant::now();
    let r = agent.prompt(&sid, "read the legacy file");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the call completed at once, not after a timeout: {:?}",
        started.elapsed()
    );
    let reqs = llm.requests();
    assert_eq!(
        reqs[1].tool_result_for("call_1").as_deref(),
        Some(fake_mcp::LATIN1_TEXT_LOSSY)
    );
    let r2 = agent.prompt(&sid, "again");
    assert_eq!(agent.result(&r2)["stopReason"], "end_turn", "{r2}");
    let reqs = llm.requests();
    assert_eq!(
        reqs[3].tool_result_for("call_2").as_deref(),
        Some("still serving"),
        "the server stays usable"
    );
    let err = agent.stderr_text();
    assert!(
        !err.contains("non-JSON-RPC") && !err.contains("killed"),
        "the frame was neither dropped nor the server killed{}",
        agent.context()
    );
    agent.finish();
}

// ---- C64 ----------------------------------------------------------------------------------------

/// C64 / SPEC L3b: lone surrogate escapes, as JavaScript and Python serialisers write them, at
/// every JSON boundary of a session. (a) A tool reply line holding a surrogate pair, a lone high
/// and a lone low surrogate is decoded with U+FFFD for each lone one: the call completes at once
/// (the tool timeout is far longer than the test), the server stays usable, and no LLM request
/// carries a lone escape (the fake LLM answers 400 to a body that is not strict JSON). (b) A
/// `session/prompt` line with id 555 whose text ends in a lone `\ud83d` is answered under id 555
/// and its text reaches the model with U+FFFD. (c) Tool-call arguments the model streams with a
/// lone escape run with U+FFFD and are replayed as that repaired text.
pub fn c64_lone_surrogates_are_decoded_at_every_json_boundary_and_answered(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__surrogates", json!({}))]),
            Reply::text("read it"),
            Reply::text("your text arrived"),
            Reply::tool_calls_raw(vec![(
                "call_2",
                "fs__echo",
                r#"{"text":"model cut \ud83d"}"#.to_string(),
            )]),
            Reply::text("done"),
        ])
        // A tool timeout far longer than the test: a dropped frame would hang the call.
        .env(&[("BUZZ_AGENT_TOOL_TIMEOUT_SECS", "600")])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "surrogates,echo")])
        .start();
    // (a) the tool reply.
    let started = Instant::now();
    let r = agent.prompt(&sid, "read the snapshot");
    assert_end_turn(&agent, &r);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "C64: the call completed at once, not after the tool timeout: {:?}",
        started.elapsed()
    );
    let reqs = llm.requests();
    assert_eq!(
        reqs[1].tool_result_for("call_1").as_deref(),
        Some(fake_mcp::SURROGATE_TEXT_LOSSY),
        "C64: each lone surrogate is U+FFFD, the pair stays one character"
    );
    // (b) the prompt line, written by hand so its escape is on the wire as a client writes it.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":555,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"cut here \ud83d"}}]}}}}"#
    );
    agent.send_raw(format!("{line}\n").as_bytes());
    let r = agent.wait_response(&json!(555), Duration::from_secs(30));
    assert_eq!(
        agent.result(&r)["stopReason"],
        "end_turn",
        "C64: id 555 is answered under its own id: {r}"
    );
    assert!(
        agent.null_id_responses().is_empty(),
        "no -32700 for the line"
    );
    let reqs = llm.requests();
    assert!(
        reqs[2].user_text().ends_with("cut here \u{FFFD}"),
        "C64: the prompt reached the model with U+FFFD: {:?}",
        reqs[2].user_text()
    );
    // (c) the model's own arguments; and the server still serves.
    let r = agent.prompt(&sid, "echo it");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    let last = &reqs[4];
    assert_eq!(
        last.tool_result_for("call_2").as_deref(),
        Some("model cut \u{FFFD}"),
        "C64: the arguments ran with U+FFFD and the server stays usable"
    );
    let (_, _, replayed) = last
        .assistant_tool_calls()
        .into_iter()
        .find(|(id, _, _)| id == "call_2")
        .unwrap_or_else(|| panic!("call_2 is not in the history{}", agent.context()));
    assert_eq!(
        serde_json::from_str::<Value>(&replayed).ok(),
        Some(json!({"text": "model cut \u{FFFD}"})),
        "C64: the arguments are replayed as the strict JSON that ran: {replayed:?}"
    );
    assert_eq!(
        llm.all_requests().len(),
        llm.requests().len(),
        "C64: no request was refused as not JSON"
    );
    let err = agent.stderr_text();
    assert!(
        !err.contains("non-JSON-RPC") && !err.contains("killed") && !err.contains("not JSON"),
        "C64: no frame was dropped and the server was not killed{}",
        agent.context()
    );
    agent.finish();
}

// ---- C65 ----------------------------------------------------------------------------------------

/// C65 / SPEC M14: servers `s` and `t` list `unlock` and `old_tool`; on `tools/call unlock`
/// one changes its list to `unlock`, `secret_number`, writes
/// `notifications/tools/list_changed`, then the reply (and answers the changed list 300 ms
/// late). Prompt 1 (the case): the model calls `s__unlock`, then at once `s__secret_number`:
/// the very next LLM request offers `s__secret_number` and no longer `s__old_tool`, and the
/// call runs. Prompt 2: the model calls `t__unlock` and, in the same response, `t__old_tool`
/// (one call at a time): the call to the tool removed while the round ran ends with an error
/// that says so, and the server never sees it.
pub fn c65_a_tool_list_changed_during_a_round_is_offered_in_the_very_next_request(ctx: &Ctx) {
    let (s, [log_t]) = Scratch::with_files(["t.log"]);
    let tools = ("FAKE_MCP_TOOLS", "unlock,old_tool,secret_number");
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_u", "s__unlock", json!({}))]),
            Reply::tool_calls(vec![("call_n", "s__secret_number", json!({}))]),
            Reply::text("The secret number is 42."),
            Reply::tool_calls(vec![
                ("call_tu", "t__unlock", json!({})),
                ("call_to", "t__old_tool", json!({})),
            ]),
            Reply::text("The old tool is gone."),
        ])
        .env(&[("BUZZ_AGENT_MAX_PARALLEL_TOOLS", "1")])
        .fake_mcp("s", &[tools])
        .fake_mcp("t", &[tools, ("FAKE_MCP_CALL_LOG", &log_t)])
        .start();
    let r = agent.prompt(&sid, "unlock it and tell me the number");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let offered = |i: usize, server: &str| -> Vec<String> {
        reqs[i]
            .tool_names()
            .into_iter()
            .filter(|n| n.starts_with(server))
            .collect()
    };
    assert_eq!(offered(0, "s__"), ["s__unlock", "s__old_tool"]);
    assert_eq!(
        offered(1, "s__"),
        ["s__unlock", "s__secret_number"],
        "C65: the very next request offers the announced tool and not the removed one"
    );
    assert_eq!(
        reqs[1].tool_result_for("call_u").as_deref(),
        Some("unlocked")
    );
    assert_eq!(
        reqs[2].tool_result_for("call_n").as_deref(),
        Some("42"),
        "C65: the call to the announced tool runs"
    );

    let r = agent.prompt(&sid, "unlock the other one and use the old tool");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    let removed = reqs[4].tool_result_for("call_to").unwrap_or_default();
    assert!(
        removed.contains("no longer offered by server 't'")
            && removed.contains("tool list changed"),
        "C65: a call to a tool removed mid-round gets a clear error: {removed:?}"
    );
    let called: Vec<Value> = fake_mcp::logged_tool_calls(&log_of(&log_t))
        .into_iter()
        .map(|c| c["params"]["name"].clone())
        .collect();
    assert_eq!(
        called,
        [json!("unlock")],
        "the removed tool was never called on the server"
    );
    agent.finish();
}
