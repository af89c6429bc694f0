//! The provider-dialect and hook-framework cases of docs/cases.md: C37 (several
//! tool calls at one `index`), C39 (reasoning state kept through a hook objection), C40 (a
//! FastMCP hook returning `None`), C41 (`max_completion_tokens`) and C61 (never two assistant
//! messages in a row on the Chat route). Each runs against the real agent binary, the TCP fake
//! LLM and fake MCP server processes; the rules the real servers enforce are checked on every
//! request the agent sent.

use super::setup::Setup;
use super::util::{
    Scratch, assert_end_turn, buzz_meta, hook_server, log_of, stop_calls, wait_stderr,
};
use crate::fake_llm::{Reply, Wire};
use crate::fake_mcp;
use crate::harness::Ctx;
use serde_json::{Value, json};
use std::time::Duration;

/// C40 / SPEC H3: a FastMCP-style `_Stop` hook (`-> str | None`). `return None` answers
/// `{"content":[],"structuredContent":{"result":null}}`: outcome `empty`, one LLM call,
/// `stopObjections: 0`. Its objection (text mirrored in `structuredContent`) reaches the model
/// once, as the text — never as `{"result":…}`.
pub fn c40_fastmcp_none_is_empty_and_its_text_objects_once(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["fm.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, _| Reply::text("All done."))
        .env(&[("MCP_HOOK_SERVERS", "fm")])
        .servers([hook_server(
            "fm",
            &log,
            &[
                ("FAKE_MCP_STOP_MODE", "fastmcp"),
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                ("FAKE_MCP_STOP_TEXT", "2 tests fail"),
            ],
        )])
        .start();

    // Prompt 1: the hook objects once (text + structuredContent), then returns None.
    let r = agent.prompt(&sid, "finish");
    assert_end_turn(&agent, &r);
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 2, "stopObjections": 1, "stopBudget": 3, "stopBudgetExhausted": false}),
        "{r}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one objection, then None ends the turn");
    let injected = reqs[1]
        .tool_result_for(
            &reqs[1]
                .assistant_tool_calls()
                .into_iter()
                .find(|(_, name, _)| name == "fm___Stop")
                .map(|(id, _, _)| id)
                .unwrap_or_default(),
        )
        .unwrap_or_default();
    assert_eq!(
        injected, r#"{"hook":"_Stop","server":"fm","text":"2 tests fail"}"#,
        "the objection is the content text only"
    );
    assert!(
        !reqs[1].body.to_string().contains("result\\\":"),
        "structuredContent never reaches the model: {}",
        reqs[1].body
    );

    // Prompt 2: None from the first call on: empty, one LLM call, no objection.
    let r = agent.prompt(&sid, "again");
    assert_end_turn(&agent, &r);
    assert_eq!(
        buzz_meta(&agent, &r),
        json!({"rounds": 1, "stopObjections": 0, "stopBudget": 3, "stopBudgetExhausted": false}),
        "C40: return None never objects: {r}"
    );
    assert_eq!(llm.requests().len(), 3);
    assert_eq!(stop_calls(&log).len(), 3);
    wait_stderr(
        &agent,
        "point=_Stop server=fm outcome=empty",
        Duration::from_secs(2),
    );
    agent.finish();
}

/// The Chat Completions SSE body of a server that streams every tool call whole at `index: 0`,
/// each with its own id (Ollama, case C37), then `finish_reason: tool_calls` and `[DONE]`.
pub fn ollama_index0_calls(calls: &[(&str, &str, Value)]) -> String {
    let mut body = String::new();
    for (id, name, args) in calls {
        let chunk = json!({"id": "chatcmpl-ollama", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "",
                "tool_calls": [{"index": 0, "id": id, "type": "function",
                    "function": {"name": name, "arguments": args.to_string()}}]},
                "finish_reason": null}]});
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    let end = json!({"id": "chatcmpl-ollama", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]});
    body.push_str(&format!("data: {end}\n\ndata: [DONE]\n\n"));
    body
}

/// C37 / SPEC L7: two calls streamed whole at `index: 0` (Ollama) are two calls: two
/// `tools/call`, and the next request has one assistant message with both calls (each
/// `arguments` a valid JSON string) followed by both `role:"tool"` results.
pub fn c37_two_calls_at_index_0_run_as_two_calls(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::raw_sse(ollama_index0_calls(&[
                ("call_a1b2", "fs__echo", json!({"text": "hello.py"})),
                ("call_c3d4", "fs__echo", json!({"text": "world.py"})),
            ])),
            Reply::text("Both written."),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
        .start();
    let r = agent.prompt(&sid, "write both files");
    assert_end_turn(&agent, &r);
    let logged = log_of(&log);
    let texts: Vec<Value> = fake_mcp::logged_tool_calls(&logged)
        .iter()
        .map(|c| c["params"]["arguments"]["text"].clone())
        .collect();
    assert_eq!(texts.len(), 2, "two tools/call: {texts:?}");
    assert!(
        texts.contains(&json!("hello.py")) && texts.contains(&json!("world.py")),
        "{texts:?}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    reqs[1].assert_tool_calls_paired();
    let msgs = reqs[1].messages();
    let assistant: Vec<&Value> = msgs.iter().filter(|m| m["role"] == "assistant").collect();
    assert_eq!(assistant.len(), 1, "{msgs:#?}");
    let calls = assistant[0]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ids: Vec<&str> = calls.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids, ["call_a1b2", "call_c3d4"]);
    for c in &calls {
        let args = c["function"]["arguments"].as_str().unwrap_or_default();
        assert!(
            serde_json::from_str::<Value>(args).is_ok_and(|v| v.is_object()),
            "arguments must be one JSON object each: {args:?}"
        );
    }
    assert_eq!(
        reqs[1].tool_results(),
        vec![
            ("call_a1b2".to_string(), "hello.py".to_string()),
            ("call_c3d4".to_string(), "world.py".to_string())
        ]
    );
    agent.finish();
}

/// The 400 an OpenAI reasoning model answers on Chat Completions to a body with `max_tokens`
/// (case C41, verbatim).
pub const C41_BODY: &str = r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens"}}"#;

/// C41 / SPEC L7: a server that rejects `max_tokens` with OpenAI's own 400. Under a model name
/// the agent does not know, the first request is rejected, retried once as
/// `max_completion_tokens`, and the name is remembered for the next prompt; under `gpt-5.4` the
/// first request already uses it. Every prompt completes.
pub fn c41_max_tokens_rejected_is_retried_as_max_completion_tokens_and_remembered(ctx: &Ctx) {
    for (model, rejected) in [("my-reasoner", 1), ("gpt-5.4", 0)] {
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .handler(|_, req| {
                if req.body.get("max_tokens").is_some() {
                    Reply::status(400, vec![], C41_BODY)
                } else {
                    Reply::text("done")
                }
            })
            .env(&[("OPENAI_COMPAT_MODEL", model)])
            .start();
        for prompt in ["one", "two"] {
            let r = agent.prompt(&sid, prompt);
            assert_end_turn(&agent, &r);
        }
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2 + rejected, "{model}");
        let with_max_tokens = reqs
            .iter()
            .filter(|r| r.body.get("max_tokens").is_some())
            .count();
        assert_eq!(with_max_tokens, rejected, "{model}: one rejection at most");
        let last = reqs.last().map(|r| r.body.clone()).unwrap_or_default();
        assert!(
            last["max_completion_tokens"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{model}: {last}"
        );
        agent.finish();
    }
}

/// SPEC L8: an OpenAI endpoint where the configured model (`o1-pro`) exists only on the
/// Responses API answers its Chat Completions requests as OpenAI does (404, "only supported in
/// v1/responses"). The refused first request is sent again on `/v1/responses` within the same
/// prompt, with one WARN and one notice for the client before the answer; the tool round and
/// the next prompt go there at once. After a restart, a loaded session learns it again the same
/// way (one refused request, docs/dialects.md).
pub fn l8_a_model_only_the_responses_api_serves_moves_the_session_to_the_responses_route(
    ctx: &Ctx,
) {
    const MODEL: &str = "o1-pro";
    const WARN: &str = "served only by the Responses API";
    let s = Scratch::new();
    let state = super::util::path_str(&s.dir.path().join("state"));
    let env = [
        ("OPENAI_COMPAT_MODEL", MODEL),
        ("BUZZ_AGENT_STATE_DIR", state.as_str()),
    ];
    let replies = [
        Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "a"}))]),
        Reply::text("one"),
        Reply::text("two"),
        Reply::text("three"),
    ];
    let llm = ctx.fake_llm_with(move |i, req| {
        crate::fake_llm::responses_only(MODEL, req).unwrap_or_else(|| {
            replies
                .get(i)
                .cloned()
                .unwrap_or_else(|| Reply::text("extra"))
        })
    });
    let tools = || {
        json!([crate::harness::fake_mcp_entry(
            "fs",
            &[("FAKE_MCP_TOOLS", "echo")]
        )])
    };
    let (llm, agent) = Setup::new(ctx, &s).llm(llm).env(&env).spawn();
    agent.initialize();
    let sid = agent.new_session(&s.ws, tools());
    assert_end_turn(&agent, &agent.prompt(&sid, "Echo a."));
    assert_end_turn(&agent, &agent.prompt(&sid, "Again."));
    let warns = agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains(WARN))
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert_eq!(warns.len(), 1, "{warns:?}");
    assert!(
        warns[0].contains("WARN") && warns[0].contains(MODEL),
        "{warns:?}"
    );
    // The notice, once, before the answer's text.
    let updates = agent.session_updates(&sid);
    let notice = updates
        .iter()
        .position(|u| u["_meta"]["buzz"]["notice"] == "llm_route_changed");
    let answer = updates.iter().position(|u| {
        u["sessionUpdate"] == "agent_message_chunk" && u["_meta"]["buzz"]["notice"].is_null()
    });
    assert!(
        notice.is_some() && notice < answer,
        "notice {notice:?}, answer {answer:?}: {updates:?}"
    );
    let notices = updates
        .iter()
        .filter(|u| u["_meta"]["buzz"]["notice"] == "llm_route_changed")
        .count();
    assert_eq!(notices, 1, "{updates:?}");
    agent.finish();

    // A new process: the switch is learned again on the loaded session's first request.
    let (llm, agent) = Setup::new(ctx, &s).llm(llm).env(&env).spawn();
    agent.initialize();
    let loaded = agent.request(
        "session/load",
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": tools()}),
    );
    let _ = agent.result(&loaded);
    assert_end_turn(&agent, &agent.prompt(&sid, "After the restart."));
    assert_eq!(super::util::count_lines(&agent, WARN), 1);
    agent.finish();

    let all = llm.all_requests();
    let routes: Vec<Wire> = all.iter().map(|r| r.wire()).collect();
    assert_eq!(
        routes,
        [
            Wire::Chat,
            Wire::Responses,
            Wire::Responses,
            Wire::Responses,
            Wire::Chat,
            Wire::Responses
        ],
        "refused, resent, the tool round, the next prompt; after the restart refused, resent"
    );
    let reqs = llm.requests();
    // The tool round went on in the Responses shape, every call paired.
    for r in &reqs {
        r.assert_tool_calls_paired();
    }
    assert_eq!(reqs[1].tool_result_for("call_1").as_deref(), Some("a"));
    // The loaded history reached the Responses route whole.
    assert!(reqs[3].user_text().contains("Echo a."), "{}", reqs[3].body);
}

/// An Anthropic Messages stream (SPEC L6) with a signed thinking block, a text block and
/// `stop_reason: end_turn`, as Claude streams it with extended thinking on.
pub fn anthropic_thinking_then_text(thinking: &str, signature: &str, text: &str) -> String {
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_t", "type": "message", "role": "assistant", "content": [], "model": "claude", "usage": {"input_tokens": 20, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": thinking}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": signature}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 12}}),
        json!({"type": "message_stop"}),
    ];
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect()
}

/// C39 / SPEC L10, the case's own trigger: Anthropic with extended thinking; `_Stop` objects
/// once, then answers `""`. Request 2's assistant turn is `[thinking{…, "SIG_T1"} unmodified,
/// text "All done.", tool_use h___Stop]` — a thinking model accepts it — and the turn ends
/// after 2 calls with `stopObjections: 1`.
pub fn c39_stop_objection_while_thinking_keeps_the_signed_thinking_block(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["h.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::raw_sse(anthropic_thinking_then_text(
                "Everything is done, I think.",
                "SIG_T1",
                "All done.",
            )),
            Reply::raw_sse(anthropic_thinking_then_text(
                "Tests first.",
                "SIG_T2",
                "Fixed; done now.",
            )),
        ])
        .wire(Wire::Anthropic)
        .env(&[("MCP_HOOK_SERVERS", "h")])
        .servers([hook_server(
            "h",
            &log,
            &[
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                ("FAKE_MCP_STOP_TEXT", "run the tests"),
            ],
        )])
        .start();
    let r = agent.prompt(&sid, "finish");
    assert_end_turn(&agent, &r);
    assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 1, "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "end_turn after 2 calls");
    reqs[1].assert_tool_calls_paired();
    let msgs = reqs[1].messages();
    let turn = msgs
        .iter()
        .find(|m| m["role"] == "assistant")
        .cloned()
        .unwrap_or_default();
    let content = turn["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(content.len(), 3, "{turn}");
    assert_eq!(
        content[0],
        json!({"type": "thinking", "thinking": "Everything is done, I think.", "signature": "SIG_T1"}),
        "the thinking block opens the turn, unmodified"
    );
    assert_eq!(content[1], json!({"type": "text", "text": "All done."}));
    assert_eq!(
        (content[2]["type"].as_str(), content[2]["name"].as_str()),
        (Some("tool_use"), Some("h___Stop"))
    );
    assert_eq!(stop_calls(&log).len(), 2);
    agent.finish();
}

/// C61 / SPEC L10: after an objection on the Chat route, the model's answer and the synthetic
/// hook call are one assistant message (text plus `tool_calls`); no request of the prompt has
/// two assistant (or two user) messages in a row, or a user message right after a tool result.
pub fn c61_chat_objection_is_one_assistant_message_with_text_and_the_call(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "x"}))]),
            Reply::text("All done."),
            Reply::text("Fixed; done now."),
            Reply::text("second prompt answer"),
        ])
        .env(&[("MCP_HOOK_SERVERS", "fs")])
        .fake_mcp(
            "fs",
            &[
                ("FAKE_MCP_STOP", "1"),
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                ("FAKE_MCP_STOP_TEXT", "run the tests"),
            ],
        )
        .start();
    let r = agent.prompt(&sid, "go");
    assert_end_turn(&agent, &r);
    assert_eq!(buzz_meta(&agent, &r)["stopObjections"], 1, "{r}");
    let r = agent.prompt(&sid, "and again");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    for req in &reqs {
        req.assert_tool_calls_paired();
        let msgs = req.messages();
        for pair in msgs.windows(2) {
            let (a, b) = (&pair[0]["role"], &pair[1]["role"]);
            assert!(
                !(a == b && (a == "assistant" || a == "user")),
                "C61: two {a} messages in a row: {msgs:#?}"
            );
            assert!(
                !(a == "tool" && b == "user"),
                "a user message right after a tool result: {msgs:#?}"
            );
        }
    }
    let joined = reqs[2]
        .messages()
        .into_iter()
        .find(|m| m["content"] == "All done.")
        .unwrap_or_default();
    assert_eq!(
        joined["tool_calls"][0]["function"]["name"], "fs___Stop",
        "{joined}"
    );
    agent.finish();
}

/// C63 / SPEC M14: on the Anthropic route, against a server that rejects a root
/// `anyOf`/`oneOf`/`allOf` (the Anthropic profile), a server `n` lists `search` and
/// `create_attachment`, whose schema is a pure root `anyOf` (Notion's). The prompt ends
/// `end_turn` (before: every request was refused with a 400 naming the tool); `n__search` is
/// offered as it is; `n__create_attachment` is offered as one object schema with both
/// properties and the lost rule in its description, and its call runs; one WARN names server,
/// tool and keyword, once for the session, not once per request.
pub fn c63_one_tool_with_a_root_any_of_no_longer_fails_every_anthropic_prompt(ctx: &Ctx) {
    use crate::dialects::{Dialect, Violations};
    use crate::fake_llm::FakeLlm;
    let s = Scratch::new();
    let violations = Violations::default();
    let llm = FakeLlm::dialect(Dialect::Anthropic, violations.clone(), |i, _| match i {
        0 => Reply::tool_calls(vec![(
            "toolu_1",
            "n__create_attachment",
            json!({"source_url": "https://example.com/a.pdf"}),
        )]),
        1 => Reply::text("Attached."),
        _ => Reply::text("Still fine."),
    });
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(llm)
        .fake_mcp("n", &[("FAKE_MCP_TOOLS", "search,create_attachment")])
        .start();
    let r = agent.prompt(&sid, "attach the report");
    assert_end_turn(&agent, &r);
    let r2 = agent.prompt(&sid, "and again");
    assert_end_turn(&agent, &r2);
    let broken = violations.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(broken.is_empty(), "C63: the provider refused: {broken:?}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let tools = reqs[0].tool_schemas();
    let find = |name: &str| {
        tools
            .iter()
            .find(|(n, _, _)| n == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not offered: {tools:?}"))
    };
    let (_, _, search) = find("n__search");
    assert_eq!(
        search,
        fake_mcp::odd_schema("search").map(|(_, s)| s),
        "a plain schema goes out as the server wrote it"
    );
    let (_, description, schema) = find("n__create_attachment");
    let schema = schema.unwrap_or_default();
    assert!(schema.get("anyOf").is_none(), "{schema}");
    assert_eq!(schema["properties"]["content"], json!({"type": "string"}));
    assert_eq!(
        schema["properties"]["source_url"],
        json!({"type": "string"})
    );
    assert!(
        description
            .contains("at least one of these sets of arguments: (1) content, (2) source_url"),
        "{description:?}"
    );
    assert_eq!(
        reqs[1].tool_result_for("toolu_1").as_deref(),
        Some(r#"create_attachment {"source_url":"https://example.com/a.pdf"}"#)
    );
    let warns: Vec<String> = agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("create_attachment"))
        .map(str::to_string)
        .collect();
    assert_eq!(warns.len(), 1, "C63: one WARN for the session: {warns:?}");
    assert!(
        warns[0].contains("mcp 'n'")
            && warns[0].contains("tool 'create_attachment'")
            && warns[0].contains("anyOf"),
        "the WARN names server, tool and keyword: {}",
        warns[0]
    );
    agent.finish();
}

// ---- C69, C77 (SPEC L13) ------------------------------------------------------------------------

/// Case C69's first response, as an Anthropic gateway that adds server tools streams it: a
/// `server_tool_use` (input streamed), its `web_search_tool_result`, text with a citation, and
/// `stop_reason: "pause_turn"`.
pub const C69_PAUSED: &str = concat!(
    "event: message_start\n",
    r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":50,"output_tokens":1}}}"#,
    "\n\nevent: content_block_start\n",
    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{}}}"#,
    "\n\nevent: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"rust 2026 edition\"}"}}"#,
    "\n\nevent: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":0}"#,
    "\n\nevent: content_block_start\n",
    r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[{"type":"web_search_result","url":"https://example.com/r","title":"Rust","encrypted_content":"EqgfCioIARgBIiQ3YTAw","page_age":null}]}}"#,
    "\n\nevent: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":1}"#,
    "\n\nevent: content_block_start\n",
    r#"data: {"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}"#,
    "\n\nevent: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"The 2026 edition "}}"#,
    "\n\nevent: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://example.com/r","title":"Rust","encrypted_index":"Eo8BCioIAhgB","cited_text":"edition"}}}"#,
    "\n\nevent: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":2}"#,
    "\n\nevent: message_delta\n",
    r#"data: {"type":"message_delta","delta":{"stop_reason":"pause_turn","stop_sequence":null},"usage":{"output_tokens":40}}"#,
    "\n\nevent: message_stop\n",
    r#"data: {"type":"message_stop"}"#,
    "\n\n",
);

/// C69 / SPEC L13: on the Anthropic route a response that ends `pause_turn` is not the end of
/// the turn. Against the `anthropic` profile (which rejects a paused turn sent back changed,
/// and a server tool's use without its result anywhere but in the final message), the fake
/// answers the continuation only when the request ends with the paused response as it came
/// (server-tool blocks verbatim); a `_Stop` hook answers `""`. Expected: 2 requests, the
/// whole answer shown (no paragraph break at the pause), `end_turn`, and `_Stop` called once,
/// after the real end; a second prompt's request still carries the paused turn unchanged.
/// Before: the turn ended at the pause with half the answer, and `_Stop` ran there.
pub fn c69_a_pause_turn_is_continued_and_stop_runs_once_at_the_real_end(ctx: &Ctx) {
    use crate::dialects::{Dialect, Violations};
    use crate::fake_llm::FakeLlm;
    let (s, [log]) = Scratch::with_files(["h.log"]);
    let expected_turn = json!([
        {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
         "input": {"query": "rust 2026 edition"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
            {"type": "web_search_result", "url": "https://example.com/r", "title": "Rust",
             "encrypted_content": "EqgfCioIARgBIiQ3YTAw", "page_age": null}]},
        {"type": "text", "text": "The 2026 edition ", "citations": [
            {"type": "web_search_result_location", "url": "https://example.com/r",
             "title": "Rust", "encrypted_index": "Eo8BCioIAhgB", "cited_text": "edition"}]}
    ]);
    let wanted = expected_turn.clone();
    let violations = Violations::default();
    let llm = FakeLlm::dialect(Dialect::Anthropic, violations.clone(), move |i, req| {
        let last = req.messages().last().cloned().unwrap_or_default();
        match i {
            0 => Reply::raw_sse(C69_PAUSED),
            1 if last["role"] == "assistant" && last["content"] == wanted => Reply::text("is out."),
            1 => Reply::status(400, vec![], "the paused turn was not sent back"),
            _ => Reply::text("You're welcome."),
        }
    });
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .llm(llm)
        .env(&[
            ("MCP_HOOK_SERVERS", "h"),
            ("BUZZ_AGENT_PROMPT_CACHING", "0"),
        ])
        .servers([hook_server(
            "h",
            &log,
            &[("FAKE_MCP_STOP_OBJECT_TIMES", "0")],
        )])
        .start();
    let r = agent.prompt(&sid, "what is new in rust?");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "C69: one continuation");
    assert_eq!(
        reqs[1].messages().last().map(|m| m["content"].clone()),
        Some(expected_turn),
        "C69: the paused response is the last assistant turn, as it came"
    );
    assert_eq!(
        crate::harness::agent_text(&agent.session_updates(&sid)),
        "The 2026 edition is out.",
        "the whole answer, the continuation on from the paused text"
    );
    assert_eq!(
        stop_calls(&log).len(),
        1,
        "C69: _Stop once, at the real end"
    );
    let r = agent.prompt(&sid, "thanks");
    assert_end_turn(&agent, &r);
    let broken = violations.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(broken.is_empty(), "C69: the provider refused: {broken:?}");
    assert_eq!(llm.requests().len(), 3);
    agent.finish();
}

/// The reply each route gives a request it refuses: Anthropic case C77's stream (no content
/// block, `stop_reason: "refusal"` with `stop_details`), Chat `finish_reason:
/// "content_filter"`, Responses `response.incomplete` for `content_filter`.
fn refusal_reply(wire: Wire) -> Reply {
    match wire {
        Wire::Anthropic => Reply::raw_sse(concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"id":"msg_r","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":20,"output_tokens":0}}}"#,
            "\n\nevent: message_delta\n",
            r#"data: {"type":"message_delta","delta":{"stop_reason":"refusal","stop_sequence":null,"stop_details":{"type":"refusal","category":"cyber","explanation":"This request asks for working malware."}},"usage":{"output_tokens":0}}"#,
            "\n\nevent: message_stop\n",
            r#"data: {"type":"message_stop"}"#,
            "\n\n",
        )),
        Wire::Chat | Wire::Responses => Reply::text("").finish_reason("content_filter"),
    }
}

/// C77 / SPEC L13, on all three routes: the provider refuses every request that still
/// carries the refused words. Prompt 1 ends `refusal` without a `_Stop` call, and the client
/// is told (on Anthropic with the `stop_details` explanation); prompt 2 "what is 2+2?" is
/// answered `end_turn`: its request carries neither prompt 1's words nor two user turns in a
/// row. Before: the two prompts were one user turn, and every later prompt was refused.
pub fn c77_after_a_refusal_the_next_prompt_is_answered_on_every_route(ctx: &Ctx) {
    for wire in [Wire::Anthropic, Wire::Chat, Wire::Responses] {
        let (s, [log]) = Scratch::with_files(["h.log"]);
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .env(&[("MCP_HOOK_SERVERS", "h")])
            .handler(move |_, req| {
                if req.body.to_string().contains("zero-day worm") {
                    refusal_reply(wire)
                } else {
                    Reply::text("4")
                }
            })
            .servers([hook_server(
                "h",
                &log,
                &[("FAKE_MCP_STOP_OBJECT_TIMES", "0")],
            )])
            .start();
        let r = agent.prompt(&sid, "write me a zero-day worm");
        assert_eq!(agent.result(&r)["stopReason"], "refusal", "{wire:?}: {r}");
        assert!(
            stop_calls(&log).is_empty(),
            "{wire:?}: no _Stop after a refusal"
        );
        let shown = crate::harness::agent_text(&agent.session_updates(&sid));
        assert!(
            shown.contains("the provider refused this request"),
            "{wire:?}: {shown}"
        );
        if wire == Wire::Anthropic {
            assert!(
                shown.contains("This request asks for working malware. (category: cyber)"),
                "C77: the explanation reaches the client: {shown}"
            );
        }
        let r = agent.prompt(&sid, "what is 2+2?");
        assert_end_turn(&agent, &r);
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2, "{wire:?}");
        let users: Vec<String> = reqs[1]
            .messages()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| crate::fake_llm::content_text(&m["content"]))
            .collect();
        assert_eq!(users, ["what is 2+2?"], "C77 {wire:?}: {:?}", reqs[1].body);
        assert_eq!(stop_calls(&log).len(), 1, "{wire:?}");
        agent.finish();
    }
}

/// SPEC L5 on the Chat route: vLLM (and SGLang) end a request their engine dropped with
/// `finish_reason: "abort"`. Expected: a failed attempt retried after the back-off, the next
/// attempt's answer shown, `end_turn`; a server that aborts every attempt fails the prompt
/// after `BUZZ_AGENT_LLM_MAX_ATTEMPTS` (2 here) with an `llm:` error naming the abort. Before:
/// the aborted stream ended the turn `end_turn` with no answer.
pub fn l5_a_vllm_abort_finish_is_retried_a_bounded_number_of_times(ctx: &Ctx) {
    let s = Scratch::new();
    let aborted = || Reply::text("").finish_reason("abort");
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .env(&[("BUZZ_AGENT_LLM_MAX_ATTEMPTS", "2")])
        .handler(move |i, _| match i {
            1 => Reply::text("after the abort"),
            _ => aborted(),
        })
        .start();
    let r = agent.prompt(&sid, "hello");
    assert_end_turn(&agent, &r);
    assert_eq!(
        crate::harness::agent_text(&agent.session_updates(&sid)),
        "after the abort"
    );
    assert_eq!(
        llm.requests().len(),
        2,
        "the aborted attempt was retried once"
    );
    let r = agent.prompt(&sid, "again");
    let (_, message) = agent.error(&r);
    assert!(
        message.starts_with("llm:") && message.contains("abort"),
        "the prompt fails naming the abort: {message}"
    );
    assert_eq!(
        llm.requests().len(),
        4,
        "two attempts for the second prompt, no more"
    );
    agent.finish();
}

/// OpenAI's Chat stream of a refusal: `delta.refusal` pieces, `content` null, finish `stop`.
const OPENAI_CHAT_REFUSAL: &str = concat!(
    r#"data: {"id":"chatcmpl-r","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":""},"finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-r","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"refusal":"I'm sorry, I can't "},"finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-r","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"refusal":"help with that."},"finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-r","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    "\n\ndata: [DONE]\n\n",
);

/// C77 / SPEC L7, L13 on the Chat route: OpenAI streams a refusal as `delta.refusal` text
/// with `finish_reason: "stop"`. Expected: the refusal's words shown, the prompt ends
/// `refusal` with the notice, and the next prompt's request carries only the new prompt.
/// Before: the field was not read, the prompt ended `end_turn` with nothing shown, and the
/// refused words were merged into the next prompt's user turn.
pub fn c77_a_streamed_chat_refusal_is_shown_and_leaves_the_history(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(|_, req| {
            if req.body.to_string().contains("zero-day worm") {
                Reply::raw_sse(OPENAI_CHAT_REFUSAL)
            } else {
                Reply::text("4")
            }
        })
        .start();
    let r = agent.prompt(&sid, "write me a zero-day worm");
    assert_eq!(agent.result(&r)["stopReason"], "refusal", "{r}");
    let shown = crate::harness::agent_text(&agent.session_updates(&sid));
    assert!(
        shown.contains("I'm sorry, I can't help with that.")
            && shown.contains("the provider refused this request"),
        "the refusal and the notice reach the client: {shown}"
    );
    let r = agent.prompt(&sid, "what is 2+2?");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    let turns: Vec<(Value, String)> = reqs[1]
        .messages()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            (
                m["role"].clone(),
                crate::fake_llm::content_text(&m["content"]),
            )
        })
        .collect();
    assert_eq!(turns, [(json!("user"), "what is 2+2?".to_owned())]);
    agent.finish();
}

/// SPEC L13: a prompt cancelled while the model had not answered stays in the history as its
/// own turn, closed by a short assistant note, so the next prompt is not merged into it (as
/// if the user had written both): `[user p1, assistant note, user p2]`, on every route.
pub fn l13_a_cancelled_prompt_stays_as_its_own_marked_turn(ctx: &Ctx) {
    for wire in [Wire::Anthropic, Wire::Chat, Wire::Responses] {
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .wire(wire)
            .handler(|i, _| match i {
                0 => Reply::text("too late").delay_ms(30_000),
                _ => Reply::text("ok"),
            })
            .start();
        let first = agent.start_prompt(&sid, "first words");
        llm.wait_requests(1, Duration::from_secs(10));
        agent.cancel(&sid);
        let r1 = agent.wait_response(&first, Duration::from_secs(10));
        assert_eq!(agent.result(&r1)["stopReason"], "cancelled", "{r1}");
        let r2 = agent.prompt(&sid, "second words");
        assert_end_turn(&agent, &r2);
        let reqs = llm.requests();
        let turns: Vec<(String, String)> = reqs[reqs.len() - 1]
            .messages()
            .iter()
            .filter(|m| m["role"] == "user" || m["role"] == "assistant")
            .map(|m| {
                let text = crate::fake_llm::content_text(&m["content"]);
                (m["role"].as_str().unwrap_or("").to_owned(), text)
            })
            .collect();
        let expected = [
            ("user", "first words"),
            (
                "assistant",
                "(The user cancelled this request before it was answered.)",
            ),
            ("user", "second words"),
        ]
        .map(|(r, t)| (r.to_owned(), t.to_owned()));
        assert_eq!(turns, expected, "{wire:?}");
        agent.finish();
    }
}
