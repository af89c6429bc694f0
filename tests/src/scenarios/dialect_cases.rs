//! The provider-dialect and hook-framework cases of `../shared/cases/README.md`: C37 (several
//! tool calls at one `index`), C39 (reasoning state kept through a hook objection), C40 (a
//! FastMCP hook returning `None`), C41 (`max_completion_tokens`) and C61 (never two assistant
//! messages in a row on the Chat route). Each runs against the real agent binary, the TCP fake
//! LLM and fake MCP server processes; the rules the real servers enforce are checked on every
//! request the agent sent.

use super::util::Scratch;
use crate::fake_llm::{FakeLlm, Reply};
use crate::fake_mcp;
use crate::harness::{AgentProc, Ctx, fake_mcp_entry};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// `result._meta.buzz` of a prompt response (SPEC A8).
fn buzz_meta(agent: &AgentProc, resp: &Value) -> Value {
    agent.result(resp)["_meta"]["buzz"].clone()
}

fn assert_end_turn(agent: &AgentProc, resp: &Value) {
    assert_eq!(
        agent.result(resp)["stopReason"],
        "end_turn",
        "{resp}{}",
        agent.context()
    );
}

/// Waits until the agent's stderr contains `needle`.
fn wait_stderr(agent: &AgentProc, needle: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !agent.stderr_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "stderr never contained {needle:?}{}",
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `_Stop` `tools/call` requests a server received, in order.
fn stop_calls(log: &str) -> Vec<Value> {
    fake_mcp::logged_tool_calls(&fake_mcp::read_call_log(Path::new(log)))
        .into_iter()
        .filter(|c| c["params"]["name"] == "_Stop")
        .collect()
}

/// C40 / SPEC H3: a FastMCP-style `_Stop` hook (`-> str | None`). `return None` answers
/// `{"content":[],"structuredContent":{"result":null}}`: outcome `empty`, one LLM call,
/// `stopObjections: 0`. Its objection (text mirrored in `structuredContent`) reaches the model
/// once, as the text — never as `{"result":…}`.
pub fn c40_fastmcp_none_is_empty_and_its_text_objects_once(ctx: &Ctx) {
    let s = Scratch::new();
    let log = s.file("fm.log");
    let llm = FakeLlm::with_handler(|_, _| Reply::text("All done."));
    let agent = ctx.agent(&llm, &[("MCP_HOOK_SERVERS", "fm")], &s.ws);
    agent.initialize();
    let server = fake_mcp_entry(
        "fm",
        &[
            ("FAKE_MCP_STOP", "1"),
            ("FAKE_MCP_STOP_MODE", "fastmcp"),
            ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
            ("FAKE_MCP_STOP_TEXT", "2 tests fail"),
            ("FAKE_MCP_CALL_LOG", &log),
        ],
    );
    let sid = agent.new_session(&s.ws, json!([server]));

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
