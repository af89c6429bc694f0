//! The agent loop with real MCP tool calls: SPEC L1–L4, L7, A6, A8, M4, M5, M7, T6 and cases
//! C02, C11, C26.

use super::setup::Setup;
use super::util::{Scratch, log_of, statuses};
use crate::fake_llm::{Reply, Wire};
use crate::fake_mcp::{self, CRASH_STDERR, GARBAGE_AFTER_REPLY, GARBAGE_BANNER, big_text};
use crate::harness::{
    Ctx, agent_text, assert_tool_updates_well_formed, assert_updates_precede_response, current_exe,
    fake_mcp_entry, tool_call_announcements, tool_update_text,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn parse_args(args: &str) -> Value {
    serde_json::from_str(args)
        .unwrap_or_else(|e| panic!("tool call arguments {args:?} are not JSON: {e}"))
}

/// The bare tool name of a qualified `<server>__<tool>` name.
fn bare(qualified: &str) -> &str {
    qualified.split_once("__").map_or(qualified, |(_, t)| t)
}

/// L1/L4/A6/A8/L7/M2: five rounds of LLM → `fs__echo` → LLM, then a final answer.
pub fn l1_l4_five_round_tool_prompt(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
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
        replies.push(r);
    }
    replies.push(Reply::text("All done, five echoes.").usage(Some((700, 20))));
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(replies)
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let prompt_text = "Echo r1 to r5, one per round, then say you are done.";
    let pid = agent.start_prompt(&sid, prompt_text);
    let resp = agent.wait_response(&pid, Duration::from_secs(60));
    let res = agent.result(&resp);
    assert_eq!(res["stopReason"], "end_turn", "{resp}");
    assert_eq!(
        res["_meta"]["buzz"],
        json!({"rounds": 6, "stopObjections": 0, "stopBudget": 3, "stopBudgetExhausted": false}),
        "A8 meta: {resp}"
    );

    // A6: streamed text in order, every tool call announced then completed with its text.
    let ups = agent.session_updates(&sid);
    assert_eq!(
        agent_text(&ups),
        "step 1. \n\nstep 3. \n\nstep 5. \n\nAll done, five echoes."
    );
    let chunks = ups
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert!(
        chunks >= 4,
        "text arrives as chunks per round, got {chunks}"
    );
    let announced = tool_call_announcements(&ups);
    let terminal = assert_tool_updates_well_formed(&ups);
    assert_eq!(announced.len(), 5, "{ups:#?}");
    for (i, (a, t)) in announced.iter().zip(&terminal).enumerate() {
        let text = format!("r{}", i + 1);
        assert_eq!(a["rawInput"], json!({"text": text}), "{a}");
        assert!(
            a["title"].as_str().is_some_and(|t| !t.is_empty()),
            "title: {a}"
        );
        assert_eq!(t["status"], "completed", "{t}");
        assert_eq!(tool_update_text(t), text, "{t}");
        assert_eq!(t["rawOutput"]["isError"], false, "{t}");
        let started = ups.iter().any(|u| {
            u["sessionUpdate"] == "tool_call_update"
                && u["toolCallId"] == a["toolCallId"]
                && u["status"] == "in_progress"
        });
        assert!(started, "no in_progress update for {}", a["toolCallId"]);
    }
    let usage: Vec<&Value> = ups
        .iter()
        .filter(|u| u["sessionUpdate"] == "usage_update")
        .collect();
    let used: Vec<u64> = usage.iter().filter_map(|u| u["used"].as_u64()).collect();
    assert_eq!(
        used,
        [110, 210, 310, 410, 510, 720],
        "A6 usage_update per LLM response: {usage:#?}"
    );
    assert!(usage.iter().all(|u| u["size"] == 200_000), "{usage:#?}");

    // L7 requests and L4 history.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 6, "one LLM call per round");
    for (k, req) in reqs.iter().enumerate() {
        assert_eq!(
            (req.method.as_str(), req.path.as_str()),
            ("POST", ctx.wire().path())
        );
        assert_eq!(req.body["model"], ctx.model());
        assert_eq!(req.body["stream"], true);
        if ctx.wire() == Wire::Chat {
            assert_eq!(req.header("authorization"), Some("Bearer sk-test-secret"));
            assert_eq!(req.body["stream_options"]["include_usage"], true);
        }
        assert!(
            req.tool_names().contains(&"fs__echo".to_string()),
            "{:?}",
            req.tool_names()
        );
        let user_text = req.user_text();
        assert!(
            user_text.contains(prompt_text),
            "the prompt is in the history: {user_text:?}"
        );
        req.assert_tool_calls_paired();
        let calls = req.assistant_tool_calls();
        assert_eq!(
            calls.len(),
            k,
            "request {k} carries every earlier tool call"
        );
        for (j, (id, name, args)) in calls.iter().enumerate() {
            assert_eq!(name, "fs__echo");
            assert_eq!(parse_args(args), json!({"text": format!("r{}", j + 1)}));
            assert_eq!(
                req.tool_result_for(id).as_deref(),
                Some(format!("r{}", j + 1).as_str())
            );
        }
        let assistant: Vec<Value> = req
            .messages()
            .into_iter()
            .filter(|m| m["role"] == "assistant" && m["tool_calls"].is_array())
            .filter(|_| ctx.wire() == Wire::Chat)
            .collect();
        for (j, m) in assistant.iter().enumerate() {
            let expect = if j % 2 == 0 {
                format!("step {}. ", j + 1)
            } else {
                String::new()
            };
            assert_eq!(
                m["content"],
                json!(expect),
                "L7: assistant content (\"\" when empty): {m}"
            );
        }
    }

    // M2 handshake, then exactly five tools/call.
    let logged = log_of(&log);
    let methods: Vec<&str> = logged.iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(
        &methods[..3],
        ["initialize", "notifications/initialized", "tools/list"],
        "{methods:?}"
    );
    let init = &logged[0]["params"];
    assert_eq!(init["protocolVersion"], "2025-11-25", "{init}");
    assert_eq!(init["clientInfo"]["name"], "buzz-agent", "{init}");
    let calls = fake_mcp::logged_tool_calls(&logged);
    assert_eq!(calls.len(), 5, "{calls:#?}");
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c["params"]["name"], "echo");
        assert_eq!(
            c["params"]["arguments"],
            json!({"text": format!("r{}", i + 1)})
        );
    }
    agent.initialize();
    assert_updates_precede_response(&agent, &sid, &pid);
    assert!(
        agent.permission_requests().is_empty(),
        "BUZZ_AGENT_PERMISSION=allow asks nothing"
    );
    agent.finish();
}

/// L2/M4: a model call to a hook name (`fs___Stop`, `fs___Other`) or an unknown name is the
/// error result `unknown tool: <name>` with a `failed` update, and never reaches MCP; hooks are
/// not in the tool list; results come back in call order.
pub fn l2_unknown_and_hook_tool_names_are_unknown_tool(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![
                ("call_a", "fs___Stop", json!({})),
                ("call_b", "nope__x", json!({})),
                ("call_c", "fs___Other", json!({})),
                ("call_d", "fs__echo", json!({"text": "still works"})),
            ]),
            Reply::text("ok"),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let r = agent.prompt(&sid, "call the tools");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let names = reqs[0].tool_names();
    assert!(names.contains(&"fs__echo".to_string()), "{names:?}");
    assert!(
        names.iter().all(|n| !bare(n).starts_with('_')),
        "hooks leak into the tool list: {names:?}"
    );
    let calls = reqs[1].assistant_tool_calls();
    let results = reqs[1].tool_results();
    assert_eq!(results.len(), 4, "{results:?}");
    let order: Vec<&String> = calls.iter().map(|(id, _, _)| id).collect();
    let result_order: Vec<&String> = results.iter().map(|(id, _)| id).collect();
    assert_eq!(order, result_order, "results in call order (L2)");
    for ((id, name, _), expect) in calls.iter().zip(["fs___Stop", "nope__x", "fs___Other"]) {
        assert_eq!(name, expect);
        let text = reqs[1].tool_result_for(id).unwrap_or_default();
        assert!(
            text.contains(&format!("unknown tool: {expect}")),
            "{expect}: {text:?}"
        );
    }
    assert_eq!(
        reqs[1].tool_result_for(&calls[3].0).as_deref(),
        Some("still works")
    );

    let ups = agent.session_updates(&sid);
    let terminal = assert_tool_updates_well_formed(&ups);
    let statuses = statuses(&terminal);
    assert_eq!(
        statuses,
        ["failed", "failed", "failed", "completed"],
        "{terminal:#?}"
    );
    assert!(
        tool_update_text(&terminal[0]).contains("unknown tool"),
        "{}",
        terminal[0]
    );

    let logged = log_of(&log);
    let called: Vec<Value> = fake_mcp::logged_tool_calls(&logged)
        .iter()
        .map(|c| c["params"]["name"].clone())
        .collect();
    assert_eq!(
        called,
        [json!("echo")],
        "only echo may reach the server (hooks are off)"
    );
    agent.finish();
}

/// L2/C26: arguments that are invalid JSON or not an object are error results (the server is
/// not called, the turn goes on); empty or blank arguments mean `{}`.
pub fn l2_c26_invalid_tool_arguments_are_error_results_and_empty_means_empty_object(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls_raw(vec![
                ("call_a", "fs__echo", "{\"text\": ".to_string()),
                ("call_b", "fs__echo", "[1,2]".to_string()),
                ("call_c", "fs__echo", "{\"text\":\"fine\"}".to_string()),
                ("call_d", "fs__echo", String::new()),
                ("call_e", "fs__echo", "  ".to_string()),
            ]),
            Reply::text("ok"),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let r = agent.prompt(&sid, "go");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "the turn goes on after bad arguments");
    reqs[1].assert_tool_calls_paired();
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results.len(), 5, "{results:?}");
    for bad in &results[..2] {
        assert!(
            bad.to_lowercase().contains("argument"),
            "an invalid-arguments error: {bad:?}"
        );
    }
    assert_eq!(results[2], "fine");
    let logged = log_of(&log);
    let args: Vec<Value> = fake_mcp::logged_tool_calls(&logged)
        .iter()
        .map(|c| c["params"]["arguments"].clone())
        .collect();
    assert_eq!(
        args,
        [json!({"text": "fine"}), json!({}), json!({})],
        "C26: empty arguments are {{}}"
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    let statuses = statuses(&terminal);
    assert_eq!(
        &statuses[2..],
        ["completed", "completed", "completed"],
        "{terminal:#?}"
    );
    agent.finish();
}

/// Length in bytes of the longest common prefix of `a` and `b`, on character boundaries.
fn common_prefix(a: &str, b: &str) -> usize {
    a.chars()
        .zip(b.chars())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum()
}

fn common_suffix(a: &str, b: &str) -> usize {
    a.chars()
        .rev()
        .zip(b.chars().rev())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum()
}

/// L3: a tool result text over BUZZ_AGENT_MAX_TOOL_RESULT_TEXT_BYTES reaches the model
/// middle-elided: head and tail kept, one marker with the exact elided byte count, UTF-8 safe.
pub fn l3_big_tool_result_is_middle_elided(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![
                ("call_1", "fs__big", json!({"bytes": 10000})),
                ("call_2", "fs__big", json!({"bytes": 10000, "fill": "😀é"})),
                ("call_3", "fs__big", json!({"bytes": 1000})),
            ]),
            Reply::text("ok"),
        ])
        .env(&[("BUZZ_AGENT_MAX_TOOL_RESULT_TEXT_BYTES", "1024")])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "big")])
        .start();
    let r = agent.prompt(&sid, "make big output");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results.len(), 3);
    for (text, fill) in results[..2].iter().zip(["m", "😀é"]) {
        let original = big_text(10000, fill);
        assert!(
            !text.contains('\u{fffd}'),
            "elision broke a UTF-8 character: {text:?}"
        );
        assert!(
            text.len() < 1024 + 200,
            "{} bytes reached the model",
            text.len()
        );
        assert!(
            text.starts_with("BEGIN-") && text.ends_with("-END"),
            "head and tail kept: {text:?}"
        );
        let head = common_prefix(text, &original);
        let tail = common_suffix(text, &original);
        assert!(
            head >= 256 && tail >= 256,
            "head {head} / tail {tail} bytes kept: {text:?}"
        );
        let marker = &text[head..text.len() - tail];
        let elided = original.len() - head - tail;
        assert!(
            marker.contains(&elided.to_string()),
            "the marker {marker:?} must state the {elided} elided bytes"
        );
        assert!(
            marker.trim().lines().count() == 1,
            "one marker line: {marker:?}"
        );
    }
    assert_eq!(
        results[2],
        big_text(1000, "m"),
        "a result under the cap is untouched"
    );
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert!(
        terminal.iter().all(|t| t["status"] == "completed"),
        "{terminal:#?}"
    );
    agent.finish();
}

/// M7/M5/M1: the server exits during a call; the call fails at once with the exit status and
/// the stderr tail, the update is `failed`, the turn continues, stderr is forwarded prefixed.
pub fn m7_server_crash_mid_call_gives_error_result_and_turn_continues(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__crash", json!({}))]),
            Reply::text("recovered"),
            Reply::text("still here"),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "echo,crash")])
        .start();
    let started = Instant::now();
    let r = agent.prompt(&sid, "crash it");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the exit is noticed at once: {:?}",
        started.elapsed()
    );

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    reqs[1].assert_tool_calls_paired();
    let (_, text) = reqs[1]
        .tool_results()
        .into_iter()
        .next()
        .unwrap_or_default();
    assert!(
        text.contains(CRASH_STDERR),
        "the stderr tail reaches the model: {text:?}"
    );
    assert!(
        text.contains('3') && text.to_lowercase().contains("exit"),
        "the exit status reaches the model: {text:?}"
    );
    let ups = agent.session_updates(&sid);
    let terminal = assert_tool_updates_well_formed(&ups);
    assert_eq!(terminal.len(), 1);
    assert_eq!(terminal[0]["status"], "failed", "{}", terminal[0]);
    assert_eq!(agent_text(&ups), "recovered");
    assert!(
        agent
            .stderr_text()
            .lines()
            .any(|l| l.contains("[mcp:fs]") && l.contains(CRASH_STDERR)),
        "the server's stderr is forwarded prefixed [mcp:fs] (M1){}",
        agent.context()
    );
    let r = agent.prompt(&sid, "are you there?");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    agent.finish();
}

/// C02/C11/T2/T6: MCP servers that print banners on stdout (and stderr) before the handshake
/// and after every reply: the handshake and calls work, nothing reaches the agent's stdout,
/// the banners are logged with the server name, and the agent never answers them.
pub fn c02_c11_mcp_banner_never_reaches_agent_stdout(ctx: &Ctx) {
    let (s, [log_fs]) = Scratch::with_files(["fs.log"]);
    let log_noisy = s.file("noisy.log");
    let noisy = json!({
        "name": "noisy",
        "command": "sh",
        "args": ["-c", "echo BANNER; echo BANNER >&2; exec \"$0\"", current_exe()],
        "env": [
            {"name": "BUZZ_E2E_ROLE", "value": "fake-mcp"},
            {"name": "FAKE_MCP_TOOLS", "value": "shell"},
            {"name": "FAKE_MCP_CALL_LOG", "value": log_noisy},
        ],
    });
    let fs = fake_mcp_entry(
        "fs",
        &[("FAKE_MCP_GARBAGE", "1"), ("FAKE_MCP_CALL_LOG", &log_fs)],
    );
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![
                ("call_1", "fs__echo", json!({"text": "through the noise"})),
                ("call_2", "noisy__shell", json!({"command": "ls"})),
            ]),
            Reply::text("done"),
        ])
        .servers([fs, noisy])
        .start();
    let r = agent.prompt(&sid, "call both");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    let texts: Vec<String> = terminal.iter().map(tool_update_text).collect();
    assert_eq!(texts, ["through the noise", "ran: ls"], "{terminal:#?}");
    assert!(terminal.iter().all(|t| t["status"] == "completed"));

    for m in agent.transcript() {
        let text = m.to_string();
        assert!(
            !text.contains("BANNER") && !text.contains(GARBAGE_AFTER_REPLY),
            "server output reached the agent's stdout: {text}"
        );
    }
    for log in [&log_fs, &log_noisy] {
        let raw = std::fs::read_to_string(log).unwrap_or_default();
        for l in raw.lines() {
            let m: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("agent wrote non-JSON to MCP ({e}): {l}"));
            assert!(
                m.get("method").is_some(),
                "the agent answered something the server never asked: {l}"
            );
        }
    }
    let err = agent.stderr_text();
    assert!(
        err.lines()
            .any(|l| l.contains("fs") && l.contains(GARBAGE_BANNER)),
        "T6: the banner is logged with the server name{}",
        agent.context()
    );
    assert!(
        err.lines()
            .any(|l| l.contains("[mcp:noisy]") && l.contains("BANNER")),
        "M1: the launcher's stderr is forwarded{}",
        agent.context()
    );
    agent.finish();
}

/// SPEC M14 / case C63, under every dialect profile: a server whose tools use JSON Schema the
/// providers take only in part (root `anyOf`, `oneOf` with `const` discriminators, `allOf`
/// with a `$ref`, `type` arrays, `const`, `exclusiveMinimum`, maps, `if`/`then`, no
/// `properties`; [`fake_mcp::odd_schema`]). Every tool is offered (none dropped), every
/// schema has an object root without combinators (a profile rejects what its server rejects,
/// and the trial fails on it), the rules a folded root lost are in the tool's description,
/// and calls to the rewritten tools reach the server with the model's arguments.
pub fn m14_odd_tool_schemas_are_offered_in_a_form_the_provider_accepts(ctx: &Ctx) {
    let names = [
        "search",
        "create_attachment",
        "choose",
        "merged",
        "typed",
        "conditional",
        "bare",
    ];
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![
                (
                    "call_a",
                    "n__create_attachment",
                    json!({"source_url": "https://example.com/a.pdf"}),
                ),
                ("call_c", "n__choose", json!({"action": "delete", "id": 7})),
                ("call_t", "n__typed", json!({"mode": "fast", "note": null})),
            ]),
            Reply::text("done"),
        ])
        .fake_mcp("n", &[("FAKE_MCP_TOOLS", &names.join(","))])
        .start();
    let r = agent.prompt(&sid, "attach it");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let offered = reqs[0].tool_schemas();
    let offered_names: Vec<&str> = offered.iter().map(|(n, _, _)| n.as_str()).collect();
    for name in names {
        assert!(
            offered_names.contains(&format!("n__{name}").as_str()),
            "M14: n__{name} is offered, never dropped: {offered_names:?}"
        );
    }
    for (name, description, schema) in &offered {
        let Some(schema) = schema else {
            assert_eq!(
                name, "n__bare",
                "only a tool without arguments goes without a schema"
            );
            continue;
        };
        assert_eq!(schema["type"], "object", "{name}: {schema}");
        for k in ["anyOf", "oneOf", "allOf"] {
            assert!(
                schema.get(k).is_none(),
                "M14: {name} has a root {k}: {schema}"
            );
        }
        if name == "n__create_attachment" {
            assert!(
                description.contains("(1) content, (2) source_url"),
                "M14: the folded rule is in the description: {description:?}"
            );
        }
    }
    let results = &reqs[1];
    assert_eq!(
        results.tool_result_for("call_a").as_deref(),
        Some(r#"create_attachment {"source_url":"https://example.com/a.pdf"}"#)
    );
    assert_eq!(
        results.tool_result_for("call_c").as_deref(),
        Some(r#"choose {"action":"delete","id":7}"#)
    );
    assert_eq!(
        results.tool_result_for("call_t").as_deref(),
        Some(r#"typed {"mode":"fast","note":null}"#)
    );
    let err = agent.stderr_text();
    for tool in ["create_attachment", "choose", "merged"] {
        assert_eq!(
            err.lines()
                .filter(|l| l.contains("WARN") && l.contains(&format!("tool '{tool}'")))
                .count(),
            1,
            "M14: one WARN for {tool}{}",
            agent.context()
        );
    }
    agent.finish();
}
