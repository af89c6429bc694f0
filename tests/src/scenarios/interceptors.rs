//! SEP-2624 interceptors on the tool-call path end to end (SPEC X1, experimental), with the
//! real agent, the fake LLM and fake MCP servers as processes: an interceptor server is a fake
//! MCP server with `FAKE_MCP_INTERCEPTORS` (its own wire code, written independently of the
//! agent's), named in `BUZZ_AGENT_INTERCEPTOR_SERVERS`.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, log_of, wait_stderr};
use crate::fake_llm::Reply;
use crate::fake_mcp;
use crate::harness::{Ctx, PermissionPolicy, fake_mcp_entry, tool_call_announcements};
use serde_json::{Value, json};
use std::time::Duration;

/// An ordinary fake MCP server `fs` with `echo`, logging to `log`.
fn fs(log: &str) -> Value {
    fake_mcp_entry("fs", &[("FAKE_MCP_CALL_LOG", log)])
}

/// An interceptor server `name` (no tools unless `tools`) with `interceptors`, logging to `log`.
fn policy(name: &str, log: &str, interceptors: &Value, tools: &str) -> Value {
    let list = interceptors.to_string();
    fake_mcp_entry(
        name,
        &[
            ("FAKE_MCP_CALL_LOG", log),
            ("FAKE_MCP_TOOLS", tools),
            ("FAKE_MCP_INTERCEPTORS", &list),
        ],
    )
}

/// The `tools/call` arguments a server received, in order.
fn received(log: &str) -> Vec<Value> {
    fake_mcp::logged_tool_calls(&log_of(log))
        .into_iter()
        .map(|c| c["params"]["arguments"].clone())
        .collect()
}

/// The `interceptor/invoke` requests a server received, in order.
fn invocations(log: &str) -> Vec<Value> {
    log_of(log)
        .into_iter()
        .filter(|m| m["method"] == "interceptor/invoke")
        .collect()
}

/// The terminal `tool_call_update`s of the session: `(status, text)`, in order.
fn terminal_updates(updates: &[Value]) -> Vec<(String, String)> {
    updates
        .iter()
        .filter(|u| {
            u["sessionUpdate"] == "tool_call_update"
                && (u["status"] == "completed" || u["status"] == "failed")
        })
        .map(|u| {
            (
                u["status"].as_str().unwrap_or_default().to_string(),
                u["content"][0]["content"]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// One `fs__echo` call, then a text answer.
fn echo_then_text(args: Value) -> impl Fn(usize, &crate::fake_llm::RecordedRequest) -> Reply {
    move |i, _| match i {
        0 => Reply::tool_calls(vec![("call_1", "fs__echo", args.clone())]),
        _ => Reply::text("Done."),
    }
}

/// X1: a denying validator (`enforce`, `valid: false`, severity `error`) stops a real tool
/// call before permission is asked: the MCP server never receives it, the client sees the call
/// `failed` with the validator's message, and the model gets the same text as the tool error.
pub fn x1_a_denying_validator_stops_a_real_tool_call(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let deny = json!([{"name": "no-echo", "type": "validation", "behavior": "deny",
                       "message": "echo is not allowed here"}]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(echo_then_text(json!({"text": "hi"})))
        .env(&[
            ("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy"),
            ("BUZZ_AGENT_PERMISSION", "ask"),
        ])
        .servers([fs(&fs_log), policy("policy", &p_log, &deny, "")])
        .start();
    assert_eq!(
        log_of(&p_log)
            .iter()
            .filter(|m| m["method"] == "interceptors/list")
            .count(),
        1,
        "X1: listed once at session start"
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "echo hi"));
    assert!(received(&fs_log).is_empty(), "the call never ran");
    let inv = invocations(&p_log);
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0]["params"]["phase"], "request");
    assert_eq!(
        inv[0]["params"]["payload"],
        json!({"name": "echo", "arguments": {"text": "hi"}})
    );
    let text = "blocked by interceptor 'no-echo': echo is not allowed here";
    assert_eq!(
        terminal_updates(&agent.session_updates(&sid)),
        [("failed".to_string(), text.to_string())]
    );
    assert!(
        agent.permission_requests().is_empty(),
        "X1: the request phase runs before permission; a denied call is never asked for"
    );
    let reqs = llm.requests();
    assert!(
        reqs[1]
            .tool_result_for("call_1")
            .is_some_and(|t| t.contains(text)),
        "the model sees the denial: {:#?}",
        reqs[1].messages()
    );
    agent.finish();
}

/// X1: a mutator rewrites the arguments, the MCP server receives the rewritten ones, and the
/// client's `rawInput` (a `tool_call_update`, then the permission request) shows what runs.
pub fn x1_a_mutator_rewrites_the_arguments_the_server_receives(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let rewrite = json!([
        {"name": "tag", "type": "mutation", "behavior": "set", "set": {"text": "REWRITTEN"},
         "priorityHint": 5},
        {"name": "stamp", "type": "mutation", "behavior": "set", "set": {"by": "policy"},
         "priorityHint": 1},
        {"name": "ok", "type": "validation", "behavior": "allow"}
    ]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .handler(echo_then_text(json!({"text": "original"})))
        .env(&[
            ("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy"),
            ("BUZZ_AGENT_PERMISSION", "ask"),
        ])
        .servers([fs(&fs_log), policy("policy", &p_log, &rewrite, "")])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "echo"));
    let ran = json!({"text": "REWRITTEN", "by": "policy"});
    assert_eq!(
        received(&fs_log),
        std::slice::from_ref(&ran),
        "the server got the rewritten call"
    );
    let order: Vec<String> = invocations(&p_log)
        .iter()
        .map(|m| m["params"]["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        order,
        ["stamp", "tag", "ok"],
        "X1: mutators by priorityHint, then the validator"
    );
    let updates = agent.session_updates(&sid);
    assert_eq!(
        tool_call_announcements(&updates)[0]["rawInput"],
        json!({"text": "original"})
    );
    assert!(
        updates
            .iter()
            .any(|u| u["sessionUpdate"] == "tool_call_update" && u["rawInput"] == ran),
        "rawInput shows what ran: {updates:#?}"
    );
    let asked = agent.permission_requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["params"]["toolCall"]["rawInput"], ran);
    agent.finish();
}

/// X1: an `audit` validator that would deny never blocks: the call runs and the would-be
/// denial is logged.
pub fn x1_an_audit_validator_only_logs(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let audit = json!([{"name": "watch", "type": "validation", "behavior": "deny",
                        "message": "would be blocked", "mode": "audit"}]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .handler(echo_then_text(json!({"text": "hi"})))
        .env(&[("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy")])
        .servers([fs(&fs_log), policy("policy", &p_log, &audit, "")])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "echo"));
    assert_eq!(
        received(&fs_log),
        [json!({"text": "hi"})],
        "audit never blocks"
    );
    assert_eq!(
        terminal_updates(&agent.session_updates(&sid))[0].0,
        "completed"
    );
    wait_stderr(
        &agent,
        "'watch' (server 'policy') audit: would deny: would be blocked",
        Duration::from_secs(5),
    );
    agent.finish();
}

/// X1: an interceptor whose server crashes mid-invocation blocks the call when it is
/// fail-closed (the default) and lets it through when it says `failOpen: true`.
pub fn x1_a_crashing_interceptor_blocks_unless_it_fails_open(ctx: &Ctx) {
    for fail_open in [false, true] {
        let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
        let crash = json!([{"name": "fragile", "type": "validation", "behavior": "crash",
                            "failOpen": fail_open}]);
        let (_llm, agent, sid) = Setup::new(ctx, &s)
            .handler(echo_then_text(json!({"text": "hi"})))
            .env(&[("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy")])
            .servers([fs(&fs_log), policy("policy", &p_log, &crash, "")])
            .start();
        assert_end_turn(&agent, &agent.prompt(&sid, "echo"));
        let updates = terminal_updates(&agent.session_updates(&sid));
        if fail_open {
            assert_eq!(
                received(&fs_log),
                [json!({"text": "hi"})],
                "fail-open runs it"
            );
            assert_eq!(updates[0].0, "completed");
        } else {
            assert!(received(&fs_log).is_empty(), "fail-closed blocks it");
            assert_eq!(updates[0].0, "failed");
            assert!(
                updates[0]
                    .1
                    .starts_with("blocked: interceptor 'fragile' failed (")
                    && updates[0].1.ends_with(") and fails closed"),
                "{updates:?}"
            );
        }
        agent.finish();
    }
}

/// X1/H4: an interceptor that never answers blocks the call after one hook timeout (it fails
/// closed), its invocation is abandoned with `notifications/cancelled`, and a second
/// consecutive timeout kills its server.
pub fn x1_h4_a_silent_interceptor_times_out_closed_and_its_second_timeout_kills_it(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let hang = json!([{"name": "slowpoke", "type": "validation", "behavior": "hang"}]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 | 2 => Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "hi"}))]),
            _ => Reply::text("Done."),
        })
        .env(&[
            ("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "400"),
        ])
        .servers([fs(&fs_log), policy("policy", &p_log, &hang, "")])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "first"));
    assert!(received(&fs_log).is_empty());
    let updates = terminal_updates(&agent.session_updates(&sid));
    assert_eq!(
        updates[0].1,
        "blocked: interceptor 'slowpoke' failed (timed out after 400 ms) and fails closed"
    );
    let invoke_id = invocations(&p_log)[0]["id"].clone();
    assert!(
        log_of(&p_log)
            .iter()
            .any(|m| m["method"] == "notifications/cancelled"
                && m["params"]["requestId"] == invoke_id),
        "H4: the timed-out invocation is abandoned"
    );
    wait_stderr(
        &agent,
        "interceptor: server 'policy' timed out (1/2)",
        Duration::from_secs(5),
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "second"));
    wait_stderr(
        &agent,
        "interceptor: killing server 'policy' after 2 consecutive timeouts",
        Duration::from_secs(5),
    );
    assert!(received(&fs_log).is_empty(), "still blocked");
    agent.finish();
}

/// X1/A4: a cancel while the chain waits for an interceptor ends the prompt `cancelled` at
/// once, the call `failed`, and the invocation is cancelled at its server.
pub fn x1_a4_cancel_mid_chain_cancels_the_invocation(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let hang = json!([{"name": "slowpoke", "type": "validation", "behavior": "hang"}]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .handler(echo_then_text(json!({"text": "hi"})))
        .env(&[
            ("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "60000"),
        ])
        .servers([fs(&fs_log), policy("policy", &p_log, &hang, "")])
        .start();
    let prompt = agent.start_prompt(&sid, "echo");
    super::util::wait_for(&agent, "the invocation", Duration::from_secs(20), || {
        !invocations(&p_log).is_empty()
    });
    agent.cancel(&sid);
    let r = agent.wait_response(&prompt, Duration::from_secs(5));
    assert_eq!(agent.result(&r)["stopReason"], "cancelled", "{r}");
    assert_eq!(
        terminal_updates(&agent.session_updates(&sid))[0].0,
        "failed"
    );
    let invoke_id = invocations(&p_log)[0]["id"].clone();
    super::util::wait_for(
        &agent,
        "notifications/cancelled",
        Duration::from_secs(5),
        || {
            log_of(&p_log).iter().any(|m| {
                m["method"] == "notifications/cancelled" && m["params"]["requestId"] == invoke_id
            })
        },
    );
    assert!(received(&fs_log).is_empty());
    agent.finish();
}

/// X1: interceptor servers are ordinary MCP servers the client names: the tools of one that
/// also offers tools stay callable (and pass the chain like every call), one that only
/// intercepts contributes no tool (a call to its name is `unknown tool`), and the interceptor
/// methods are never tools.
pub fn x1_interceptor_servers_tools_stay_callable_only_if_they_are_also_ordinary_servers(
    ctx: &Ctx,
) {
    let (s, [both_log, only_log]) = Scratch::with_files(["both.log", "only.log"]);
    let allow = json!([{"name": "ok", "type": "validation", "behavior": "allow"}]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::tool_calls(vec![
                ("call_1", "both__echo", json!({"text": "from both"})),
                ("call_2", "only__echo", json!({"text": "from only"})),
            ]),
            _ => Reply::text("Done."),
        })
        .env(&[("BUZZ_AGENT_INTERCEPTOR_SERVERS", "both,only")])
        .servers([
            policy("both", &both_log, &allow, "echo"),
            policy("only", &only_log, &allow, ""),
        ])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "go"));
    let reqs = llm.requests();
    assert_eq!(
        reqs[0].tool_names(),
        ["both__echo"],
        "only the ordinary tools are offered"
    );
    assert_eq!(received(&both_log), [json!({"text": "from both"})]);
    assert!(received(&only_log).is_empty());
    assert!(
        reqs[1]
            .tool_result_for("call_2")
            .is_some_and(|t| t.contains("unknown tool: only__echo")),
        "{:#?}",
        reqs[1].messages()
    );
    // The call to `both__echo` was screened by both servers' validators.
    assert_eq!(invocations(&both_log).len(), 1);
    assert_eq!(invocations(&only_log).len(), 1);
    agent.finish();
}

/// X1 with the permission prompt set to deny: a call the chain allows still needs the user's
/// permission (the request phase comes first, it does not replace permission).
pub fn x1_a7_an_allowed_call_still_asks_permission(ctx: &Ctx) {
    let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
    let allow = json!([{"name": "ok", "type": "validation", "behavior": "allow"}]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .handler(echo_then_text(json!({"text": "hi"})))
        .env(&[
            ("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy"),
            ("BUZZ_AGENT_PERMISSION", "ask"),
        ])
        .permission(PermissionPolicy::Reject)
        .servers([fs(&fs_log), policy("policy", &p_log, &allow, "")])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "echo"));
    assert_eq!(invocations(&p_log).len(), 1);
    assert_eq!(agent.permission_requests().len(), 1);
    assert!(received(&fs_log).is_empty(), "A7: rejected by the user");
    agent.finish();
}

// ---- the extras (production binary) --------------------------------------------------------

/// Runs `<agent binary> <args>` with `env` (on a clean environment), writes `input` to its
/// stdin and closes it; returns (exit success, stdout, stderr) within `limit`.
fn run_with_input(
    ctx: &Ctx,
    args: &[&str],
    env: &[(&str, &str)],
    input: &str,
    limit: Duration,
) -> (bool, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(&ctx.agent_bin)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the agent binary");
    let pid = child.id() as i32;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => {
            let out = out.expect("wait for the agent binary");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            crate::harness::kill_tree(pid);
            panic!("`{}` did not finish within {limit:?}", args.join(" "));
        }
    }
}

/// The working group's protocol fixtures (vendored with the core's conformance replay).
fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/sep-2624/protocol")
}

/// `v` without the keys named in `volatile`, at every depth (the fixtures' replay rule).
fn scrub(v: &Value, volatile: &[Value]) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(|i| scrub(i, volatile)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| !volatile.iter().any(|x| x == k.as_str()))
                .map(|(k, v)| (k.clone(), scrub(v, volatile)))
                .collect(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => v.clone(),
    }
}

/// X1 conformance, against the process: the 7 `list-*` / `invoke-*` fixtures of the SEP-2624
/// suite replayed over stdio against `buzz-agent example-server interceptors`, configured with
/// each fixture's interceptors through `EXAMPLE_INTERCEPTORS` (the core replays all 14 in
/// process, `core/tests/sep2624.rs`). Prints passed / total; all 7 must pass.
pub fn x1_example_server_interceptors_passes_the_list_and_invoke_fixtures_over_stdio(ctx: &Ctx) {
    let mut paths: Vec<_> = std::fs::read_dir(fixture_dir())
        .expect("the fixture folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                (n.starts_with("list-") || n.starts_with("invoke-")) && n.ends_with(".json")
            })
        })
        .collect();
    paths.sort();
    assert_eq!(paths.len(), 7, "7 list-*/invoke-* fixtures");
    let mut report = Vec::new();
    let mut passed = 0;
    for path in &paths {
        let fixture: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
        let volatile = fixture["volatile"].as_array().cloned().unwrap_or_default();
        let steps = fixture["steps"].as_array().cloned().unwrap_or_default();
        let mut input = String::from(
            "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"replay\",\"version\":\"0\"}}}\n",
        );
        for (i, step) in steps.iter().enumerate() {
            let (method, params) = match step["op"].as_str() {
                Some("list") => (
                    "interceptors/list",
                    match &step["event"] {
                        Value::String(e) => json!({"event": e}),
                        _ => json!({}),
                    },
                ),
                _ => ("interceptor/invoke", step["params"].clone()),
            };
            input.push_str(
                &json!({"jsonrpc": "2.0", "id": i + 1, "method": method, "params": params})
                    .to_string(),
            );
            input.push('\n');
        }
        let config = fixture["interceptors"].to_string();
        let (ok, out, err) = run_with_input(
            ctx,
            &["example-server", "interceptors"],
            &[("EXAMPLE_INTERCEPTORS", &config)],
            &input,
            Duration::from_secs(20),
        );
        let answers: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let mut failures = Vec::new();
        if !ok {
            failures.push(format!("the server failed: {err}"));
        }
        if answers
            .first()
            .map(|a| &a["result"]["capabilities"]["extensions"])
            .is_none_or(|e| e.get("io.modelcontextprotocol/interceptors").is_none())
        {
            failures.push("initialize does not advertise the interceptors extension".into());
        }
        for (i, step) in steps.iter().enumerate() {
            let got = answers.iter().find(|a| a["id"] == json!(i + 1));
            let expect = &step["expect"];
            let verdict = match (got, expect.get("errorCode")) {
                (None, _) => Err("no answer".to_string()),
                (Some(a), Some(code)) if &a["error"]["code"] == code => Ok(()),
                (Some(a), Some(code)) => Err(format!("expected error {code}, got {a}")),
                (Some(a), None) => {
                    let result = scrub(&a["result"], &volatile);
                    if result == scrub(&expect["result"], &volatile) {
                        Ok(())
                    } else {
                        Err(format!(
                            "expected {}, got {}",
                            expect["result"], a["result"]
                        ))
                    }
                }
            };
            if let Err(e) = verdict {
                failures.push(format!("step {i}: {e}"));
            }
        }
        let id = fixture["id"].as_str().unwrap_or("?");
        if failures.is_empty() {
            passed += 1;
            report.push(format!("  PASS  {id}"));
        } else {
            report.push(format!(
                "  FAIL  {id}\n       {}",
                failures.join("\n       ")
            ));
        }
    }
    eprintln!(
        "SEP-2624 list/invoke fixtures against `example-server interceptors` over stdio:\n{}\n  {passed}/{} fixtures passed",
        report.join("\n"),
        paths.len()
    );
    assert_eq!(passed, paths.len(), "{}", report.join("\n"));
}

/// X1, P3: `demo --interceptors` runs offline: the bundled example interceptor server denies
/// the model's `rm -rf` tool call before it runs, the model sees the denial, records a safe
/// step and the turn ends `end_turn`; exit 0.
pub fn x1_p3_demo_interceptors_shows_a_dangerous_call_denied(ctx: &Ctx) {
    // A user's state directory: the scripted demo session is not saved in it.
    let (s, [state]) = Scratch::with_files(["state"]);
    let (ok, out, err) = run_with_input(
        ctx,
        &["demo", "--interceptors"],
        &[
            ("XDG_STATE_HOME", state.as_str()),
            ("HOME", s.dir.path().to_str().expect("UTF-8")),
        ],
        "",
        Duration::from_secs(30),
    );
    assert!(ok, "demo --interceptors failed: {out}\n{err}");
    assert!(
        !std::path::Path::new(&state).exists(),
        "the demo saved its session under the user's state directory {state}"
    );
    let denied = out
        .find("→ failed: blocked by interceptor 'policy/no-rm-rf': the call matches the blocked pattern \"rm -rf\"")
        .unwrap_or_else(|| panic!("the denial is shown: {out}"));
    let seen = out
        .find("[the model now sees the tool error:")
        .unwrap_or_else(|| panic!("the model's view is shown: {out}"));
    let safe = out
        .find("→ completed: added: archive")
        .unwrap_or_else(|| panic!("the safe call ran: {out}"));
    assert!(denied < seen && seen < safe, "{out}");
    assert!(out.contains("stopReason: \"end_turn\""), "{out}");
}

/// SPEC S4: every way an interceptor gate can go missing blocks the call, with one clear log
/// line: an allowlisted interceptor server the session does not have, a descriptor whose
/// `type` or hook `phase` has a typo, and `valid: false` without a severity. The MCP server
/// never receives the call; the client and the model see why.
pub fn s4_every_way_an_interceptor_gate_goes_missing_blocks_the_call(ctx: &Ctx) {
    let hooks = json!([{"events": ["tools/call"], "phase": "request"}]);
    let cases = [
        (
            "policy,guard",
            json!([{"name": "ok", "type": "validation", "behavior": "allow"}]),
            "interceptor server 'guard' is allowlisted but not in the session; every tool call of the session is blocked (fail-closed)",
            "blocked: interceptor server 'guard' could not list its interceptors (the session has no server of that name) and fails closed",
        ),
        (
            "policy",
            json!([{"name": "typo", "descriptor":
                {"name": "typo", "type": "validaton", "hooks": hooks}}]),
            "server 'policy' could not list its interceptors (it listed an interceptor that cannot be understood: interceptor \"typo\": \"type\" must be",
            "blocked: interceptor server 'policy' could not list its interceptors (it listed an interceptor that cannot be understood: ",
        ),
        (
            "policy",
            json!([{"name": "typo", "descriptor": {"name": "typo", "type": "validation",
                "hooks": [{"events": ["tools/call"], "phase": "reqest"}]}}]),
            "server 'policy' could not list its interceptors (it listed an interceptor that cannot be understood: interceptor \"typo\": a hook \"phase\" must be",
            "blocked: interceptor server 'policy' could not list its interceptors (it listed an interceptor that cannot be understood: ",
        ),
        (
            "policy",
            json!([{"name": "vague", "type": "validation", "behavior": "vague",
                    "message": "echo looks risky"}]),
            "'vague' (server 'policy') denied: echo looks risky",
            "blocked by interceptor 'vague': echo looks risky",
        ),
    ];
    for (allowlist, interceptors, logged, shown) in cases {
        let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .handler(echo_then_text(json!({"text": "hi"})))
            .env(&[("BUZZ_AGENT_INTERCEPTOR_SERVERS", allowlist)])
            .servers([fs(&fs_log), policy("policy", &p_log, &interceptors, "")])
            .start();
        assert_end_turn(&agent, &agent.prompt(&sid, "echo hi"));
        assert!(
            received(&fs_log).is_empty(),
            "{allowlist} {interceptors}: blocked"
        );
        let updates = terminal_updates(&agent.session_updates(&sid));
        assert_eq!(updates.len(), 1, "{updates:?}");
        assert_eq!(updates[0].0, "failed");
        assert!(updates[0].1.starts_with(shown), "{shown}\n{updates:?}");
        assert!(
            llm.requests()[1]
                .tool_result_for("call_1")
                .is_some_and(|t| t.contains(shown)),
            "the model sees why"
        );
        wait_stderr(&agent, logged, Duration::from_secs(5));
        agent.finish();
    }
}

/// SPEC S4 (a malformed rewrite): a response-phase mutator whose new result is not a
/// `CallToolResult` blocks the result as a crash does; the model never gets an empty success.
pub fn s4_a_malformed_rewrite_of_a_tool_result_blocks_it(ctx: &Ctx) {
    for payload in [json!({"content": "redacted"}), json!("redacted"), json!({})] {
        let (s, [fs_log, p_log]) = Scratch::with_files(["fs.log", "policy.log"]);
        let rewrite = json!([{"name": "scrub", "type": "mutation", "phase": "response",
                              "behavior": "rewrite", "payload": payload}]);
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .handler(echo_then_text(json!({"text": "hi"})))
            .env(&[("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy")])
            .servers([fs(&fs_log), policy("policy", &p_log, &rewrite, "")])
            .start();
        assert_end_turn(&agent, &agent.prompt(&sid, "echo hi"));
        assert_eq!(received(&fs_log), [json!({"text": "hi"})], "the call ran");
        let shown = "blocked: an interceptor changed the tool result into something that is not a tool result (";
        let updates = terminal_updates(&agent.session_updates(&sid));
        assert_eq!(updates[0].0, "failed", "{payload}: {updates:?}");
        assert!(updates[0].1.starts_with(shown), "{updates:?}");
        let reqs = llm.requests();
        assert!(
            reqs[1]
                .tool_result_for("call_1")
                .is_some_and(|t| t.contains(shown)),
            "the model gets the error, not an empty success: {:#?}",
            reqs[1].messages()
        );
        agent.finish();
    }
}
