//! MCP prompts as ACP commands (SPEC A11, docs/context.md "MCP prompts as commands"): a
//! server's `prompts/list` (every page) reaches the client as `available_commands_update`,
//! `<server>:<prompt>` with the arguments as the input hint, a hook server's `_` prompts never;
//! `notifications/prompts/list_changed` sends the new list.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn};
use crate::fake_llm::Reply;
use crate::harness::{AgentProc, Ctx};
use serde_json::{Value, json};
use std::time::Duration;

/// The `availableCommands` of every `available_commands_update` of session `sid`, in order.
fn command_updates(agent: &AgentProc, sid: &str) -> Vec<Value> {
    agent
        .session_updates(sid)
        .into_iter()
        .filter(|u| u["sessionUpdate"] == "available_commands_update")
        .map(|u| u["availableCommands"].clone())
        .collect()
}

/// Waits until session `sid` was sent `n` command updates; the last one.
fn wait_commands(agent: &AgentProc, sid: &str, n: usize) -> Value {
    let sid2 = sid.to_string();
    agent.wait_until(
        &format!("{n} available_commands_update(s)"),
        Duration::from_secs(10),
        move |msgs| {
            msgs.iter()
                .filter(|m| {
                    m["method"] == "session/update"
                        && m["params"]["sessionId"] == sid2.as_str()
                        && m["params"]["update"]["sessionUpdate"] == "available_commands_update"
                })
                .count()
                >= n
        },
    );
    command_updates(agent, sid).pop().unwrap_or(Value::Null)
}

/// SPEC A11: the prompts of every `prompts/list` page are offered as `<server>:<prompt>`
/// commands once the session is answered, the arguments as the hint (`<required>
/// [optional]`), no hint without arguments, a hook prompt (`_hidden`) never; a server without
/// prompts adds none; `notifications/prompts/list_changed` sends the whole new list once.
pub fn a11_prompts_are_offered_as_commands_and_a_list_change_sends_the_new_list(ctx: &Ctx) {
    let s = Scratch::new();
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "docs__echo", json!({"text": "hi"}))]),
            Reply::text("done"),
        ])
        .fake_mcp(
            "docs",
            &[
                ("FAKE_MCP_PROMPTS", "review,_hidden,greet"),
                ("FAKE_MCP_PROMPT_PAGE_SIZE", "1"),
                ("FAKE_MCP_PROMPTS_CHANGED_AFTER_CALL", "1"),
            ],
        )
        .fake_mcp("plain", &[])
        .start();
    let first = wait_commands(&agent, &sid, 1);
    assert_eq!(
        first,
        json!([
            {"name": "docs:review", "description": "Reviews a file with an optional focus",
             "input": {"hint": "<file> [focus]"}},
            {"name": "docs:greet", "description": "Greets the team", "input": null},
        ]),
        "every page, no hook prompt, no command of the server without prompts"
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "echo something"));
    let second = wait_commands(&agent, &sid, 2);
    let names: Vec<&str> = second
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["docs:review", "docs:greet", "docs:later"]);
    // Give a stray duplicate time to arrive: the list is sent once per change.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(command_updates(&agent, &sid).len(), 2);
    agent.assert_acp_schema();
    agent.finish();
}
