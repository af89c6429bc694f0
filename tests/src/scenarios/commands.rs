//! MCP prompts as ACP commands (SPEC A11, docs/context.md "MCP prompts as commands"): a
//! server's `prompts/list` (every page) reaches the client as `available_commands_update`,
//! `<server>:<prompt>` with the arguments as the input hint, a hook server's `_` prompts never;
//! `notifications/prompts/list_changed` sends the new list.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, strs_of};
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
    let names = strs_of(&second, "name");
    assert_eq!(names, ["docs:review", "docs:greet", "docs:later"]);
    // Give a stray duplicate time to arrive: the list is sent once per change.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(command_updates(&agent, &sid).len(), 2);
    agent.assert_acp_schema();
    agent.finish();
}

/// SPEC A11: a prompt that starts with a command runs `prompts/get` with the words bound to
/// the prompt's arguments (the last one takes the rest) and sends its messages as the user's
/// turn — text, an image marker, an embedded resource, an assistant line, converted as tool
/// results are; a prompt without arguments gets the typed text after its messages. A missing
/// required argument or a failing `prompts/get` is an error naming the command, and the
/// session goes on; a `/word` that is no command reaches the model as typed.
pub fn a11_a_command_runs_prompts_get_and_its_messages_are_the_users_turn(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("reviewed"),
            Reply::text("greeted"),
            Reply::text("described"),
            Reply::text("still here"),
            Reply::text("as typed"),
        ])
        .fake_mcp(
            "docs",
            &[
                ("FAKE_MCP_PROMPTS", "review,greet,media,broken"),
                ("FAKE_MCP_CALL_LOG", &log),
            ],
        )
        .start();
    wait_commands(&agent, &sid, 1);

    assert_end_turn(
        &agent,
        &agent.prompt(&sid, "/docs:review src/main.rs error handling and logs"),
    );
    let reqs = llm.requests();
    assert_eq!(
        reqs[0].user_text(),
        "Please review src/main.rs. Focus on: error handling and logs."
    );
    let gets: Vec<Value> = super::util::log_of(&log)
        .into_iter()
        .filter(|m| m["method"] == "prompts/get")
        .collect();
    assert_eq!(
        gets[0]["params"],
        json!({"name": "review", "arguments": {"file": "src/main.rs", "focus": "error handling and logs"}})
    );

    assert_end_turn(&agent, &agent.prompt(&sid, "/docs:greet and be brief"));
    let user = llm.requests()[1].user_text();
    assert!(
        user.ends_with("Say hello to the team.\n\nand be brief"),
        "{user:?}"
    );

    assert_end_turn(&agent, &agent.prompt(&sid, "/docs:media"));
    let user = llm.requests()[2].user_text();
    for part in [
        "Describe this picture.",
        "[image elided: image/png,",
        "[resource: file:///notes/plan.md]\n# Plan\nship it",
        "I will describe it.",
    ] {
        assert!(user.contains(part), "{part:?} in {user:?}");
    }

    let (code, message) = agent.error(&agent.prompt(&sid, "/docs:review"));
    assert_eq!(code, -32602);
    assert!(
        message.contains("/docs:review") && message.contains("<file>"),
        "{message}"
    );
    let (code, message) = agent.error(&agent.prompt(&sid, "/docs:broken now"));
    assert_eq!(code, -32000, "{message}");
    assert!(
        message.contains("/docs:broken")
            && message.contains("'docs'")
            && message.contains("prompt store unavailable"),
        "{message}"
    );
    assert_eq!(llm.requests().len(), 3, "a failed command reaches no model");

    assert_end_turn(&agent, &agent.prompt(&sid, "are you there?"));
    assert_end_turn(&agent, &agent.prompt(&sid, "/docs:nothing here"));
    let user = llm.requests()[4].user_text();
    assert!(user.ends_with("/docs:nothing here"), "{user:?}");
    agent.finish();
}

/// SPEC A11, A4: `session/cancel` while a command waits for its `prompts/get` answers the
/// prompt `cancelled`, tells the server (`notifications/cancelled` with the request's id), and
/// the next prompt runs.
pub fn a11_a_cancel_while_prompts_get_is_in_flight_answers_cancelled(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("next")])
        .fake_mcp(
            "docs",
            &[("FAKE_MCP_PROMPTS", "hang"), ("FAKE_MCP_CALL_LOG", &log)],
        )
        .start();
    wait_commands(&agent, &sid, 1);
    let id = agent.start_prompt(&sid, "/docs:hang");
    let get = || {
        super::util::log_of(&log)
            .into_iter()
            .find(|m| m["method"] == "prompts/get")
    };
    super::util::wait_for(&agent, "prompts/get", Duration::from_secs(10), || {
        get().is_some()
    });
    let get = get().unwrap_or_default();
    let (code, message) = agent.error(&agent.prompt(&sid, "meanwhile"));
    assert_eq!(code, -32602, "the session is busy: {message}");
    agent.cancel(&sid);
    let r = agent.wait_response(&id, Duration::from_secs(5));
    assert_eq!(agent.result(&r)["stopReason"], "cancelled", "{r}");
    super::util::wait_for(
        &agent,
        "notifications/cancelled",
        Duration::from_secs(5),
        || {
            super::util::log_of(&log)
                .iter()
                .any(|m| super::util::is_cancel_of(m, &get["id"]))
        },
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "hello again"));
    agent.finish();
}
