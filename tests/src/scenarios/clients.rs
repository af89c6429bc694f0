//! Fitting the ACP clients people use (issue 12, cases C53–C60): what a client decides
//! permissions and icons by (tool call kind and title), failed tool results, lenient
//! `session/new`, the model picker, images, annotations and progress from MCP tools, the text a
//! user reads (paragraph breaks, notices, no requirement ids), and failures that say what
//! happened.

use super::setup::Setup;
use super::util::{
    Scratch, assert_end_turn, bodies, hook_server, log_of, stop_calls, strs_of, wait_stderr,
};
use crate::fake_llm::{RecordedRequest, Reply};
use crate::fake_mcp;
use crate::harness::{
    AgentProc, Ctx, PermissionPolicy, agent_text, assert_tool_updates_well_formed, fake_mcp_entry,
    select_kind, tool_call_announcements, tool_update_text,
};
use serde_json::{Value, json};
use std::time::Duration;

/// The agent's notices among `updates` (`agent_message_chunk` with `_meta.buzz.notice`):
/// `(kind, text)`.
fn notices(updates: &[Value]) -> Vec<(String, String)> {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| {
            let kind = u["_meta"]["buzz"]["notice"].as_str()?;
            Some((
                kind.to_string(),
                u["content"]["text"].as_str().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

/// The model's answer as the client shows it: every `agent_message_chunk` but the notices.
fn answer_text(updates: &[Value]) -> String {
    let plain: Vec<Value> = updates
        .iter()
        .filter(|u| u["_meta"]["buzz"]["notice"].is_null())
        .cloned()
        .collect();
    agent_text(&plain)
}

/// C53 (SPEC A6, A7): `kind` from the MCP annotations and `title` from the MCP tool's title,
/// else `<server>: <tool>`, in the `tool_call` update and in `session/request_permission`.
pub fn c53_tool_call_kind_and_title_come_from_the_mcp_tool(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![
                ("c1", "fs__read", json!({"text": "note"})),
                ("c2", "fs__delete", json!({"path": "/tmp/x"})),
                ("c3", "fs__echo", json!({"text": "hi"})),
                ("c4", "fs__nosuch", json!({})),
            ]),
            Reply::text("done"),
        ])
        .env(&[("BUZZ_AGENT_PERMISSION", "ask")])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "read,delete,echo")])
        .start();
    let r = agent.prompt(&sid, "use the tools");
    assert_end_turn(&agent, &r);
    let ups = agent.session_updates(&sid);
    assert_tool_updates_well_formed(&ups);
    let shown: Vec<(String, String)> = tool_call_announcements(&ups)
        .iter()
        .map(|u| {
            (
                u["title"].as_str().unwrap_or("").to_string(),
                u["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let expected = [
        ("Read Note", "read"),
        ("fs: delete", "delete"),
        ("fs: echo", "other"),
        ("fs__nosuch", "other"),
    ]
    .map(|(t, k)| (t.to_string(), k.to_string()));
    assert_eq!(shown, expected, "{ups:#?}");
    let asked: Vec<(String, String)> = agent
        .permission_requests()
        .iter()
        .map(|p| {
            let call = &p["params"]["toolCall"];
            (
                call["title"].as_str().unwrap_or("").to_string(),
                call["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    // S3: a permission request names the registered server and the tool; the server's own
    // title is only a quoted description.
    assert_eq!(
        asked,
        [
            (r#"fs: read ("Read Note")"#, "read"),
            ("fs: delete", "delete"),
            ("fs: echo", "other"),
        ]
        .map(|(t, k)| (t.to_string(), k.to_string())),
        "the unknown tool is never asked about"
    );
    assert_eq!(llm.requests().len(), 2);
    agent.finish();
}

/// C54: an `isError: true` result is a `failed` update whose content is the error text; the
/// model still gets the text as an error result and the turn goes on.
pub fn c54_an_is_error_result_is_failed_with_its_text_and_the_turn_goes_on(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "fs__fail", json!({}))]),
            Reply::text("it failed, as expected"),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "fail")])
        .start();
    let r = agent.prompt(&sid, "try it");
    assert_end_turn(&agent, &r);
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(terminal[0]["status"], "failed", "{}", terminal[0]);
    assert_eq!(tool_update_text(&terminal[0]), "boom");
    assert_eq!(terminal[0]["rawOutput"]["isError"], true);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "the turn goes on after the failed call");
    reqs[1].assert_tool_calls_paired();
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert!(
        results.len() == 1 && results[0].contains("boom"),
        "the model sees the error text: {results:?}"
    );
    agent.finish();
}

/// C55 (SPEC A2): `session/new` with two entries of unknown transports and servers
/// named `My Files`, `my.fs`, `github/copilot` and `ünï` starts; the skipped entries get a WARN,
/// `_meta.buzz.notices` on the result and a notice before the first answer; the odd names get
/// safe, stable tool prefixes and calls through them reach the right server; the hook
/// allowlist matches the client's original name (`My Files`).
pub fn c55_lenient_session_new_skips_other_transports_and_maps_odd_names(ctx: &Ctx) {
    let s = Scratch::new();
    let names = ["My Files", "my.fs", "github/copilot", "ünï"];
    let logs: Vec<String> = (0..names.len())
        .map(|i| s.file(&format!("srv{i}.log")))
        .collect();
    let mut servers = vec![
        json!({"type": "websocket", "name": "ws", "url": "wss://mcp.example.com"}),
        json!({"type": "grpc", "name": "rpc", "url": "grpc://mcp.example.com"}),
    ];
    for (i, name) in names.iter().enumerate() {
        let mut env = vec![("FAKE_MCP_CALL_LOG", logs[i].as_str())];
        if i == 0 {
            env.extend([("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_OBJECT_TIMES", "1")]);
        }
        servers.push(fake_mcp_entry(name, &env));
    }
    let (llm, agent) = Setup::new(ctx, &s)
        .handler(|i, req: &RecordedRequest| match i {
            // Call the echo tool of `github/copilot`, whatever its prefix is.
            0 => {
                let name = req
                    .tool_names()
                    .into_iter()
                    .find(|n| n.starts_with("github_copilot_") && n.ends_with("__echo"))
                    .unwrap_or_default();
                Reply::tool_calls(vec![("c1", name.as_str(), json!({"text": "to copilot"}))])
            }
            _ => Reply::text("done"),
        })
        .env(&[("MCP_HOOK_SERVERS", "My Files")])
        .spawn();
    agent.initialize();
    let resp = agent.request(
        "session/new",
        json!({"cwd": s.ws.to_str(), "mcpServers": servers}),
    );
    let result = agent.result(&resp).clone();
    let sid = result["sessionId"].as_str().expect("sessionId").to_string();
    let meta_notices = result["_meta"]["buzz"]["notices"].clone();
    assert_eq!(
        meta_notices,
        json!([
            "MCP server 'ws' was not started: websocket servers are not supported (only stdio, http and sse).",
            "MCP server 'rpc' was not started: grpc servers are not supported (only stdio, http and sse)."
        ]),
        "{result}"
    );
    wait_stderr(
        &agent,
        "MCP server 'ws' skipped: websocket servers are not supported (only stdio, http and sse)",
        Duration::from_secs(10),
    );

    let r = agent.prompt(&sid, "ask copilot");
    assert_end_turn(&agent, &r);
    let ups = agent.session_updates(&sid);
    let shown = notices(&ups);
    assert_eq!(
        shown.len(),
        3,
        "two skipped entries, one objection: {shown:#?}"
    );
    assert!(
        shown[..2]
            .iter()
            .all(|(k, t)| k == "mcp_server_skipped" && t.contains("was not started")),
        "{shown:#?}"
    );
    assert!(
        ups.iter()
            .position(|u| u["_meta"]["buzz"]["notice"] == "mcp_server_skipped")
            < ups.iter().position(|u| u["sessionUpdate"] == "tool_call"),
        "the notices come first"
    );

    let reqs = llm.requests();
    let offered = reqs[0].tool_names();
    assert_eq!(offered.len(), 4, "{offered:?}");
    for name in &offered {
        assert!(
            name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "provider-safe: {name}"
        );
    }
    // Stable: the same names in every request.
    assert_eq!(reqs[1].tool_names(), offered);
    // The call through the mapped prefix reached `github/copilot` and no other server.
    let echo_calls: Vec<usize> = logs
        .iter()
        .map(|l| fake_mcp::count_calls(&log_of(l), "echo"))
        .collect();
    assert_eq!(echo_calls, [0, 0, 1, 0], "only github/copilot was called");
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results[0], "to copilot");
    let ann = tool_call_announcements(&ups);
    assert_eq!(ann[0]["title"], "github/copilot: echo", "the client's name");
    // The allowlist matched `My Files`: its `_Stop` ran (and objected once).
    assert_eq!(stop_calls(&logs[0]).len(), 2);
    agent.finish();
}

/// Initializes `agent`, opens a session with `server` and runs two prompts: the `session/new`
/// answer lists `sentence` in `_meta.buzz.notices`, and the updates hold one notice of `kind`
/// with it, first of all (before the first prompt's answer) and never again. The updates.
fn one_notice_in_the_answer_and_the_first_prompt(
    agent: &AgentProc,
    s: &Scratch,
    server: Value,
    kind: &str,
    sentence: &str,
) -> Vec<Value> {
    agent.initialize();
    let resp = agent.request(
        "session/new",
        json!({"cwd": s.ws.to_str(), "mcpServers": [server]}),
    );
    let result = agent.result(&resp).clone();
    let sid = result["sessionId"].as_str().expect("sessionId").to_string();
    assert_eq!(
        result["_meta"]["buzz"]["notices"],
        json!([sentence]),
        "{result}"
    );
    for text in ["first", "second"] {
        let r = agent.prompt(&sid, text);
        assert_end_turn(agent, &r);
    }
    let ups = agent.session_updates(&sid);
    assert_eq!(
        notices(&ups),
        [(kind.to_string(), format!("[buzz-agent] {sentence}"))],
        "one notice, on the first prompt only"
    );
    assert_eq!(
        ups.iter()
            .position(|u| u["_meta"]["buzz"]["notice"] == kind),
        Some(0),
        "the notice comes before the first answer: {ups:#?}"
    );
    ups
}

/// C56: `MCP_HOOK_SERVERS=testguard` and a server named `TestGuard` that exposes `_Stop`: one
/// WARN per session and server naming it, its hooks and the allowlist, and the same finding as
/// a notice to the client (in the `session/new` answer's `_meta.buzz.notices` and before the
/// first prompt's answer, once); hooks stay off (no case folding).
pub fn c56_a_hook_server_missing_from_the_allowlist_is_warned_about_once(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (_llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("one"), Reply::text("two")])
        .env(&[("MCP_HOOK_SERVERS", "testguard")])
        .spawn();
    // The user sees it too, not only stderr: in the answer and before the first prompt's text.
    let sentence = "MCP server 'TestGuard' has hooks (_Stop), but MCP_HOOK_SERVERS (testguard) does not name it: they will not run.";
    let ups = one_notice_in_the_answer_and_the_first_prompt(
        &agent,
        &s,
        hook_server("TestGuard", &log, &[]),
        "hooks_not_allowlisted",
        sentence,
    );
    assert_eq!(
        answer_text(&ups),
        "\n\nonetwo",
        "a paragraph after the notice; prompts are not joined"
    );
    let line = "server 'TestGuard' exposes hooks _Other, _Stop but is not in MCP_HOOK_SERVERS (testguard); they will not be called";
    wait_stderr(&agent, line, Duration::from_secs(10));
    assert_eq!(
        agent.stderr_text().matches(line).count(),
        1,
        "once per session and server"
    );
    assert!(stop_calls(&log).is_empty(), "hooks stay off");
    agent.finish();
}

/// C63 (SPEC M14): a tool whose `inputSchema` no provider takes (root `type: "string"`) is
/// dropped, and the user is told, not only stderr: the sentence names server, tool and what
/// the schema says, in the `session/new` answer's `_meta.buzz.notices` and as an
/// `mcp_tool_dropped` notice before the first prompt's answer, once; the WARN is logged; the
/// server's other tools are offered.
pub fn c63_a_tool_dropped_for_its_schema_is_told_to_the_client(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("one"), Reply::text("two")])
        .spawn();
    let sentence = "MCP server 'n' offers tool 'scalar' with an input schema the agent cannot use (inputSchema root type is \"string\", not \"object\"); it is not offered to the model.";
    one_notice_in_the_answer_and_the_first_prompt(
        &agent,
        &s,
        fake_mcp_entry("n", &[("FAKE_MCP_TOOLS", "search,scalar")]),
        "mcp_tool_dropped",
        sentence,
    );
    let offered: Vec<String> = llm.requests()[0]
        .tool_schemas()
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    assert!(
        offered.iter().any(|n| n == "n__search") && !offered.iter().any(|n| n == "n__scalar"),
        "{offered:?}"
    );
    wait_stderr(
        &agent,
        "mcp 'n': dropping tool 'scalar'",
        Duration::from_secs(10),
    );
    agent.finish();
}

/// C58 (SPEC A5): `session/new` advertises the current model and the settable ones (the
/// `configOptions` model selector and the `models` state); `session/set_config_option` and
/// `session/set_model` switch the model of later requests; a model not advertised or an unknown
/// option is `-32602`.
pub fn c58_models_are_advertised_and_both_ways_of_setting_one_work(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("ok"))
        .env(&[("BUZZ_AGENT_MODELS", "other-model, big-model")])
        .spawn();
    agent.initialize();
    let resp = agent.request(
        "session/new",
        json!({"cwd": s.ws.to_str(), "mcpServers": []}),
    );
    let result = agent.result(&resp).clone();
    let sid = result["sessionId"].as_str().expect("sessionId").to_string();
    let current = ctx.model();
    let option = &result["configOptions"][0];
    assert_eq!(option["id"], "model", "{result}");
    assert_eq!(option["category"], "model");
    assert_eq!(option["type"], "select");
    assert_eq!(option["currentValue"], current);
    let values = strs_of(&option["options"], "value");
    assert_eq!(values, [current, "other-model", "big-model"]);
    assert_eq!(result["models"]["currentModelId"], current);
    assert_eq!(
        result["models"]["availableModels"][1],
        json!({"modelId": "other-model", "name": "other-model"})
    );

    let set = agent.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "model", "value": "other-model"}),
    );
    assert_eq!(
        agent.result(&set)["configOptions"][0]["currentValue"],
        "other-model",
        "{set}"
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "one"));
    let set = agent.request(
        "session/set_model",
        json!({"sessionId": sid, "modelId": "big-model"}),
    );
    assert_eq!(agent.result(&set), &json!({}));
    let shown = agent.session_updates(&sid);
    let update = shown
        .iter()
        .rfind(|u| u["sessionUpdate"] == "config_option_update")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        update["configOptions"][0]["currentValue"], "big-model",
        "the selector follows session/set_model: {shown:#?}"
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "two"));
    let models: Vec<Value> = llm
        .requests()
        .iter()
        .map(|r| r.body["model"].clone())
        .collect();
    assert_eq!(models, [json!("other-model"), json!("big-model")]);

    for params in [
        json!({"sessionId": sid, "configId": "model", "value": "not-advertised"}),
        json!({"sessionId": sid, "configId": "mode", "value": "x"}),
        json!({"sessionId": "nope", "configId": "model", "value": "other-model"}),
    ] {
        let bad = agent.request("session/set_config_option", params.clone());
        assert_eq!(agent.error(&bad).0, -32602, "{params} → {bad}");
    }
    agent.finish();
}

/// C59 (SPEC A6): an image block of a tool result reaches the client in the `tool_call_update`
/// (the model gets its marker); `audience: ["user"]` text goes to the client only,
/// `["assistant"]` to the model only; `tools/call` carries a `progressToken` and the server's
/// `notifications/progress` become `in_progress` updates with progress text.
pub fn c59_images_audience_and_progress_from_mcp_tools(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["fs.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "fs__media", json!({}))]),
            Reply::tool_calls(vec![("c2", "fs__progress", json!({"steps": 3}))]),
            Reply::text("done"),
        ])
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_TOOLS", "media,progress"),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )
        .start();
    let r = agent.prompt(&sid, "show me");
    assert_end_turn(&agent, &r);
    let ups = agent.session_updates(&sid);
    let terminal = assert_tool_updates_well_formed(&ups);
    let content = terminal[0]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let items: Vec<Value> = content.iter().map(|c| c["content"].clone()).collect();
    assert_eq!(
        items,
        [
            json!({"type": "text", "text": fake_mcp::MEDIA_TEXT}),
            json!({"type": "image", "mimeType": "image/png", "data": fake_mcp::MEDIA_PNG}),
            json!({"type": "text", "text": fake_mcp::MEDIA_USER_ONLY}),
        ],
        "{:#}",
        terminal[0]
    );
    let reqs = llm.requests();
    let model_saw = reqs[1].tool_results()[0].1.clone();
    assert!(
        model_saw.starts_with(&format!(
            "{}\n[image elided: image/png, ",
            fake_mcp::MEDIA_TEXT
        )) && model_saw.ends_with(fake_mcp::MEDIA_MODEL_ONLY),
        "{model_saw}"
    );
    assert!(!bodies(&reqs).contains(fake_mcp::MEDIA_USER_ONLY));
    assert!(
        !bodies(&reqs).contains(fake_mcp::MEDIA_PNG),
        "L3: the model gets a marker"
    );

    let calls = fake_mcp::logged_tool_calls(&log_of(&log));
    let tokens: Vec<Value> = calls
        .iter()
        .map(|c| c["params"]["_meta"]["progressToken"].clone())
        .collect();
    assert!(tokens.iter().all(Value::is_string), "{calls:#?}");
    let progress_id = terminal[1]["toolCallId"].clone();
    let progress: Vec<String> = ups
        .iter()
        .filter(|u| {
            u["sessionUpdate"] == "tool_call_update"
                && u["toolCallId"] == progress_id
                && u["status"] == "in_progress"
        })
        .map(tool_update_text)
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(
        progress,
        ["step 1 (1/3)", "step 2 (2/3)", "step 3 (3/3)"],
        "{ups:#?}"
    );
    assert_eq!(tool_update_text(&terminal[1]), "done");
    agent.finish();
}

/// C60: the model answers "All done.", `_Stop` objects once, the model answers "Fixed; done
/// now.": the client sees the answers a paragraph apart, and between them a notice saying a
/// hook made the turn go on (never the objection's text).
pub fn c60_answers_after_an_objection_are_paragraphs_and_a_notice_says_why(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("All done."),
            Reply::text("Fixed; done now."),
        ])
        .env(&[("MCP_HOOK_SERVERS", "guard")])
        .servers([hook_server(
            "guard",
            &log,
            &[
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                ("FAKE_MCP_STOP_TEXT", "secret objection text"),
            ],
        )])
        .start();
    let r = agent.prompt(&sid, "finish");
    assert_end_turn(&agent, &r);
    let ups = agent.session_updates(&sid);
    assert_eq!(answer_text(&ups), "All done.\n\nFixed; done now.");
    let shown = notices(&ups);
    assert_eq!(
        shown,
        [(
            "hook_objection".to_string(),
            "\n\n[buzz-agent] hook server 'guard' objected to ending the turn; the agent continues."
                .to_string()
        )]
    );
    assert_eq!(
        agent_text(&ups),
        "All done.\n\n[buzz-agent] hook server 'guard' objected to ending the turn; the agent continues.\n\nFixed; done now."
    );
    let notice = ups
        .iter()
        .find(|u| !u["_meta"]["buzz"]["notice"].is_null())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        notice["content"]["annotations"]["audience"],
        json!(["user"])
    );
    assert!(
        !ups.iter()
            .any(|u| u.to_string().contains("secret objection text"))
    );
    agent.finish();
}

/// C60 with a client that advertised `clientCapabilities.session.notices`: the objection notice
/// is an ACP `notice` update (schema-checked like every frame), and no message chunk carries it.
pub fn c60_a_client_that_presents_notices_gets_an_acp_notice(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (_llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("All done."),
            Reply::text("Fixed; done now."),
        ])
        .env(&[("MCP_HOOK_SERVERS", "guard")])
        .spawn();
    let init = agent.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {"session": {"notices": {}}}}),
    );
    assert_eq!(agent.result(&init)["protocolVersion"], 1);
    let sid = agent.new_session(
        &s.ws,
        json!([hook_server(
            "guard",
            &log,
            &[("FAKE_MCP_STOP_OBJECT_TIMES", "1")]
        )]),
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "finish"));
    let ups = agent.session_updates(&sid);
    let native: Vec<&Value> = ups
        .iter()
        .filter(|u| u["sessionUpdate"] == "notice")
        .collect();
    assert_eq!(native.len(), 1, "{ups:#?}");
    assert_eq!(native[0]["severity"], "info");
    assert_eq!(
        native[0]["title"],
        "hook server 'guard' objected to ending the turn; the agent continues."
    );
    assert_eq!(native[0]["_meta"]["buzz"]["notice"], "hook_objection");
    assert_eq!(agent_text(&ups), "All done.\n\nFixed; done now.");
    agent.finish();
}

/// A requirement id such as `(A7)`, `(H4)` or `C53` in `text`, if any.
fn requirement_id(text: &str) -> Option<String> {
    let b = text.as_bytes();
    for i in 0..b.len() {
        // a capital and one or two digits in parentheses, such as `(A7)` or `(H11)`
        if b[i] == b'(' && i + 3 < b.len() && b[i + 1].is_ascii_uppercase() {
            let digits = b[i + 2..].iter().take_while(|c| c.is_ascii_digit()).count();
            if (1..=2).contains(&digits) && b.get(i + 2 + digits) == Some(&b')') {
                return Some(text[i..i + 3 + digits].to_string());
            }
        }
        // `C12` as a word
        if b[i] == b'C'
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
            && b.len() > i + 2
            && b[i + 1].is_ascii_digit()
            && b[i + 2].is_ascii_digit()
            && b.get(i + 3).is_none_or(|c| !c.is_ascii_alphanumeric())
        {
            return Some(text[i..i + 3].to_string());
        }
    }
    None
}

/// Every frame the agent wrote and every LLM request body, checked for requirement ids.
fn assert_no_requirement_ids(agent: &AgentProc, reqs: &[RecordedRequest], what: &str) {
    for line in agent.stdout_lines() {
        if let Some(id) = requirement_id(&line) {
            panic!("{what}: requirement id {id} in an ACP frame: {line}");
        }
    }
    for r in reqs {
        let body = r.body.to_string();
        if let Some(id) = requirement_id(&body) {
            panic!("{what}: requirement id {id} in an LLM request: {body}");
        }
    }
}

/// C60 / SPEC P2: no requirement id (`(A7)`, `(H4)`, `C53`) in any text the user or the model
/// reads: every ACP frame the agent writes and every LLM request, through a denied permission,
/// an unknown tool, invalid arguments, an `isError` result, a JSON-RPC error, a timed-out and
/// a recovering server, a hook objection and the reply guard, and the client's garbage.
pub fn c60_no_requirement_ids_in_any_text_a_user_or_the_model_reads(ctx: &Ctx) {
    assert_eq!(requirement_id("denied (A7)").as_deref(), Some("(A7)"));
    assert_eq!(requirement_id("case C53 here").as_deref(), Some("C53"));
    assert_eq!(requirement_id("CO2 (a) C3PO x(A)"), None);

    let (s, [log]) = Scratch::with_files(["guard.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|i, _| match i {
            0 => Reply::tool_calls(vec![
                ("c1", "fs__echo", json!({"text": "denied"})),
                ("c2", "fs__nosuch", json!({})),
                ("c3", "guard___Stop", json!({})),
            ]),
            1 => Reply::tool_calls_raw(vec![("c4", "fs__fail", "[1]".into())]),
            2 => Reply::tool_calls(vec![
                ("c5", "fs__fail", json!({})),
                ("c6", "fs__reject", json!({})),
            ]),
            3 => Reply::tool_calls(vec![("c7", "fs__hang", json!({}))]),
            4 => Reply::tool_calls(vec![("c8", "fs__echo", json!({"text": "x"}))]),
            _ => Reply::text("done"),
        })
        .env(&[
            ("MCP_HOOK_SERVERS", "guard"),
            ("BUZZ_AGENT_PERMISSION", "ask"),
            ("BUZZ_AGENT_TOOL_TIMEOUT_SECS", "1"),
            ("BUZZ_AGENT_REQUIRE_REPLY", "true"),
        ])
        .permission(PermissionPolicy::Custom(std::sync::Arc::new(
            |p: &Value| {
                let text = p["toolCall"]["rawInput"]["text"].as_str().unwrap_or("");
                let kind = if text == "denied" {
                    "reject_once"
                } else {
                    "allow_once"
                };
                Some(select_kind(p, kind))
            },
        )))
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "echo,fail,reject,hang")])
        .servers([hook_server(
            "guard",
            &log,
            &[("FAKE_MCP_STOP_OBJECT_TIMES", "1")],
        )])
        .start();
    let r = agent.prompt_timeout(&sid, "do everything", Duration::from_secs(60));
    assert_end_turn(&agent, &r);
    agent.send_raw(b"not json\n");
    let _ = agent.request("no/such_method", json!({}));
    let reqs = llm.requests();
    assert!(reqs.len() >= 6, "{}", reqs.len());
    assert_no_requirement_ids(&agent, &reqs, "a turn through every failure");
    agent.finish();
}

/// Issue 12, failures that say what happened: a base URL without `/v1` gets a 404 on
/// `…/chat/completions`, and the error names the method and the URL; a JSON body where an event
/// stream was expected says exactly that, not "stream truncated", and is not retried.
pub fn l5_llm_failures_name_the_url_and_a_json_body_is_not_a_truncated_stream(ctx: &Ctx) {
    if ctx.dialect.is_some() {
        return;
    }
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::status(404, vec![], r#"{"error":{"message":"Not Found"}}"#),
            Reply::status(
                200,
                vec![("content-type", "application/json")],
                r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"hi"}}]}"#,
            ),
        ])
        .start();
    let r = agent.prompt(&sid, "one");
    let (code, message) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    let url = format!("{}/chat/completions", llm.base_url());
    assert_eq!(
        message,
        format!("llm: HTTP 404 on POST {url}: Not Found"),
        "{r}"
    );
    let r = agent.prompt(&sid, "two");
    let (_, message) = agent.error(&r);
    assert!(
        message.starts_with(&format!(
            "llm: POST {url} answered with a JSON body where an event stream was expected"
        )) && !message.contains("truncated"),
        "{message}"
    );
    assert_eq!(llm.requests().len(), 2, "the JSON body is not retried");
    agent.finish();
}

/// Issue 12, settings read as the user wrote them: the start-up log shows `provider=openai`,
/// `api=chat`, `permission=ask` and the hook allowlist as written.
pub fn p2_the_startup_log_shows_settings_as_the_environment_takes_them(ctx: &Ctx) {
    if ctx.dialect.is_some() {
        return;
    }
    let s = Scratch::new();
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[
            ("MCP_HOOK_SERVERS", "My Files,guard"),
            ("BUZZ_AGENT_PERMISSION", "ask"),
        ])
        .spawn();
    wait_stderr(
        &agent,
        "starting: provider=openai api=chat ",
        Duration::from_secs(10),
    );
    let line = agent
        .stderr_text()
        .lines()
        .find(|l| l.contains("starting: "))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains("hooks=My Files,guard") && line.ends_with("permission=ask"),
        "{line}"
    );
    agent.finish();
}
