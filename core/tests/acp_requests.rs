//! How `Agent` answers the client's requests that no other machine owns: the session limit,
//! `session/list`, `session/set_model`, `session/set_config_option`, a prompt behind a
//! cancelled turn or to a closing session, the child environment, the tool-call timeout's
//! text and the end of the process (SPEC A3, A5, A9, M1, L3, P1; case C58). These run in the
//! simulated world of `support/`: the real core, every peer played in memory.

mod support;

use buzz_agent_core::config::StateDir;
use buzz_agent_core::{Action, Agent, Config, MonoTime};
use serde_json::{Value, json};
use support::{CWD, HookKind, HookReply, LlmReply, ServerSpec, World, test_config};

fn store_config() -> Config {
    let mut c = test_config();
    c.state_dir = StateDir::Dir("/state".into());
    c
}

fn error_code(w: &World, id: u64) -> Value {
    w.response(id)
        .map_or(Value::Null, |r| r["error"]["code"].clone())
}

fn new_session_request(w: &mut World) -> u64 {
    let id = w.request("session/new", json!({"cwd": CWD, "mcpServers": []}));
    w.run_idle();
    id
}

/// The `model` of every LLM request, in order.
fn models(w: &World) -> Vec<Value> {
    w.llm_requests
        .iter()
        .map(|(_, _, body)| body["model"].clone())
        .collect()
}

#[test]
fn a9_the_session_limit_refuses_a_new_or_loaded_session_only_once_it_is_reached() {
    let mut w = World::new(store_config(), vec![]);
    w.start();
    // The second session is the one saved: a new session elsewhere takes the first id.
    let saved = w.new_session();
    w.prompt("hello");
    w.run_idle();

    let mut cfg = store_config();
    cfg.max_sessions = Some(1);
    let mut w2 = World::new(cfg, vec![]).with_disk(w.disk.clone());
    w2.initialize();
    // Below the limit a load is taken ...
    let load = w2.load_session(&saved, false);
    assert!(
        w2.response(load).is_some_and(|r| r.get("result").is_some()),
        "{:?}",
        w2.response(load)
    );
    // ... and at it a new session is refused with the limit in the message.
    let new = new_session_request(&mut w2);
    assert_eq!(error_code(&w2, new), -32000);
    let message = w2.response(new).map(|r| r["error"]["message"].to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("too many sessions")),
        "{message:?}"
    );

    // The same limit refuses a load once a new session holds the only place.
    let mut cfg = store_config();
    cfg.max_sessions = Some(1);
    let mut w3 = World::new(cfg, vec![]).with_disk(w.disk.clone());
    w3.initialize();
    let new = new_session_request(&mut w3);
    assert!(w3.response(new).is_some_and(|r| r.get("result").is_some()));
    let load = w3.load_session(&saved, true);
    assert_eq!(error_code(&w3, load), -32000, "{:?}", w3.response(load));
}

#[test]
fn a9_session_list_answers_only_when_sessions_are_saved_and_wants_an_absolute_cwd() {
    let mut off = World::new(test_config(), vec![]);
    off.initialize();
    let id = off.request("session/list", json!({}));
    off.run_idle();
    assert_eq!(error_code(&off, id), -32601, "{:?}", off.response(id));

    let mut on = World::new(store_config(), vec![]);
    let sid = on.start();
    on.prompt("hello");
    on.run_idle();
    let all = on.request("session/list", json!({}));
    let here = on.request("session/list", json!({"cwd": CWD}));
    let relative = on.request("session/list", json!({"cwd": "work/project"}));
    on.run_idle();
    for id in [all, here] {
        let ids: Vec<Value> = on
            .response(id)
            .and_then(|r| r["result"]["sessions"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|s| s["sessionId"].clone())
            .collect();
        assert_eq!(ids, [json!(sid)], "{:?}", on.response(id));
    }
    assert_eq!(
        error_code(&on, relative),
        -32602,
        "{:?}",
        on.response(relative)
    );
}

#[test]
fn a5_c58_set_model_takes_a_non_blank_model_for_an_open_session_and_shows_it() {
    let mut w = World::new(test_config(), vec![]);
    let sid = w.start();
    let from = w.acp_out.len();
    let blank = w.request(
        "session/set_model",
        json!({"sessionId": sid, "modelId": "  "}),
    );
    let unknown = w.request(
        "session/set_model",
        json!({"sessionId": "sess_unknown", "modelId": "other-model"}),
    );
    let set = w.request(
        "session/set_model",
        json!({"sessionId": sid, "modelId": " other-model "}),
    );
    w.run_idle();
    assert_eq!(error_code(&w, blank), -32602);
    assert_eq!(error_code(&w, unknown), -32602);
    assert_eq!(
        w.response(set).map(|r| r["result"].clone()),
        Some(json!({}))
    );
    let shown: Vec<Value> = w
        .updates_since(from, &sid)
        .into_iter()
        .filter(|u| u["sessionUpdate"] == "config_option_update")
        .map(|u| u["configOptions"][0]["currentValue"].clone())
        .collect();
    assert_eq!(
        shown,
        [json!("other-model")],
        "one update, for the model set"
    );
    w.prompt("hello");
    w.run_idle();
    assert_eq!(
        models(&w),
        [json!("other-model")],
        "the trimmed model is used"
    );
}

#[test]
fn a5_c58_set_model_is_refused_while_the_session_is_still_starting() {
    // The server never finishes its handshake in time, so the session stays starting.
    let mut w = World::new(test_config(), vec![ServerSpec::new("slow", &[])]);
    w.initialize();
    // Learn the id this seed gives the first session, from a world that finishes starting.
    let mut probe = World::new(test_config(), vec![ServerSpec::new("slow", &[])]);
    let sid = probe.start();
    let new = w.request(
        "session/new",
        json!({"cwd": CWD, "mcpServers": [{"name": "slow", "command": "fake-mcp", "args": ["slow"], "env": []}]}),
    );
    let early = w.request(
        "session/set_model",
        json!({"sessionId": sid, "modelId": "other-model"}),
    );
    w.run_idle();
    assert_eq!(
        w.response(new).map(|r| r["result"]["sessionId"].clone()),
        Some(json!(sid)),
        "the same seed gives the same session id"
    );
    assert_eq!(error_code(&w, early), -32602, "{:?}", w.response(early));
    w.session = Some(sid);
    w.prompt("hello");
    w.run_idle();
    assert_eq!(
        models(&w),
        [json!("test-model")],
        "the model did not change"
    );
}

#[test]
fn a5_c58_set_config_option_sets_an_advertised_model_and_refuses_other_options() {
    let mut cfg = test_config();
    cfg.models = vec!["test-model".into(), "other-model".into()];
    let mut w = World::new(cfg, vec![]);
    let sid = w.start();
    let other_option = w.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "mode", "value": "other-model"}),
    );
    let not_advertised = w.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "model", "value": "third-model"}),
    );
    let set = w.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "model", "value": "other-model"}),
    );
    w.run_idle();
    assert_eq!(error_code(&w, other_option), -32602);
    assert_eq!(error_code(&w, not_advertised), -32602);
    assert_eq!(
        w.response(set)
            .map(|r| r["result"]["configOptions"][0]["currentValue"].clone()),
        Some(json!("other-model")),
        "{:?}",
        w.response(set)
    );
    w.prompt("hello");
    w.run_idle();
    assert_eq!(models(&w), [json!("other-model")]);
}

#[test]
fn a3_a_prompt_after_a_cancel_waits_for_the_cancelled_turn_and_a_second_one_is_refused() {
    // A cancelled turn lives on while its `_Stop` round is decided (the hook is slow).
    let gate = ServerSpec::new("guard", &["_Stop"])
        .default_reply(HookReply::after(HookKind::Empty, 1_000));
    let mut w = World::new(test_config(), vec![gate]);
    w.start();
    w.llm([LlmReply::text("First."), LlmReply::text("Second.")]);
    let first = w.prompt("first");
    w.advance(100);
    assert_eq!(w.hook_calls("guard"), 1, "the `_Stop` round is running");
    w.cancel();
    let queued = w.prompt("second");
    let refused = w.prompt("third");
    assert!(w.response(queued).is_none(), "the second prompt waits");
    w.run_idle();
    assert_eq!(
        w.response(first).map(|r| r["result"]["stopReason"].clone()),
        Some(json!("cancelled"))
    );
    assert_eq!(
        w.response(queued)
            .map(|r| r["result"]["stopReason"].clone()),
        Some(json!("end_turn")),
        "the prompt sent after the cancel runs once the turn ended"
    );
    assert_eq!(error_code(&w, refused), -32602, "only one prompt waits");
}

#[test]
fn a3_h11_a_prompt_or_a_second_close_to_a_session_that_is_closing_finds_no_session() {
    let ending = ServerSpec::new("end", &["_SessionEnd"])
        .hook_reply("_SessionEnd", HookReply::after(HookKind::Empty, 1_000));
    let mut w = World::new(test_config(), vec![ending]);
    let sid = w.start();
    let close = w.request("session/close", json!({"sessionId": sid}));
    w.advance(10);
    let prompt = w.prompt("too late");
    let again = w.request("session/close", json!({"sessionId": sid}));
    w.run_idle();
    assert_eq!(error_code(&w, prompt), -32002, "{:?}", w.response(prompt));
    assert_eq!(error_code(&w, again), -32002, "{:?}", w.response(again));
    assert!(w.llm_requests.is_empty(), "no turn started");
    assert_eq!(
        w.response(close).map(|r| r["result"].clone()),
        Some(json!({}))
    );
}

#[test]
fn l3_a_tool_call_that_outlives_the_tool_timeout_reports_it_in_whole_seconds() {
    let mut cfg = test_config();
    cfg.tool_timeout_ms = 3_000;
    let mut slow = ServerSpec::new("tools", &[]);
    slow.tool_delay_ms = 60_000;
    let mut w = World::new(cfg, vec![slow]);
    w.start();
    w.llm([
        LlmReply::tool("tools__echo", r#"{"x":1}"#),
        LlmReply::text("Done."),
    ]);
    w.prompt("go");
    w.run_idle();
    let second = w.llm_requests.get(1).map(|r| r.2["messages"].to_string());
    assert!(
        second
            .as_deref()
            .is_some_and(|m| m.contains("tool call to MCP server 'tools' timed out after 3 s")),
        "{second:?}"
    );
}

#[test]
fn m1_s1_servers_inherit_only_the_allowlisted_environment_and_what_child_env_adds() {
    let mut w = World::new(test_config(), vec![ServerSpec::new("tools", &[])]);
    let mut cfg = test_config();
    cfg.child_env = vec!["EXTRA_*".to_string()];
    w.agent = Agent::new(cfg, MonoTime::ZERO)
        .with_version("0.0.0-test")
        .with_inherited_env([
            ("HOME".to_string(), "/home/user".to_string()),
            ("BUZZ_AGENT_MODEL".to_string(), "m".to_string()),
            ("OPENAI_COMPAT_API_KEY".to_string(), "sk-secret".to_string()),
            ("GITHUB_TOKEN".to_string(), "ghp_secret".to_string()),
            ("EXTRA_SETTING".to_string(), "1".to_string()),
            ("PATH".to_string(), "/usr/bin".to_string()),
        ]);
    w.start();
    let envs: Vec<Vec<(String, String)>> = w
        .steps
        .iter()
        .flat_map(|s| &s.actions)
        .filter_map(|a| {
            if let Action::SpawnMcp { spec, .. } = a {
                Some(spec.env.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        envs,
        [vec![
            ("EXTRA_SETTING".to_string(), "1".to_string()),
            ("HOME".to_string(), "/home/user".to_string()),
            ("PATH".to_string(), "/usr/bin".to_string()),
        ]]
    );
}

#[test]
fn p1_the_agent_is_finished_only_once_it_asked_to_exit() {
    let mut w = World::new(test_config(), vec![ServerSpec::new("tools", &[])]);
    w.start();
    assert!(!w.agent.is_finished());
    w.eof();
    w.run_idle();
    assert_eq!(w.exited, Some(0));
    assert!(w.agent.is_finished());
}

#[test]
fn l12_set_config_option_sets_the_thinking_effort_from_the_next_request_and_a_load_keeps_it() {
    let mut w = World::new(store_config(), vec![]);
    let sid = w.start();
    w.prompt("before");
    w.run_idle();
    let high = w.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "thought_level", "value": "high"}),
    );
    let wrong = w.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "thought_level", "value": "huge"}),
    );
    w.run_idle();
    assert_eq!(error_code(&w, wrong), -32602, "{:?}", w.response(wrong));
    let options = w
        .response(high)
        .map(|r| r["result"]["configOptions"].clone())
        .unwrap_or_default();
    assert_eq!(options[0]["currentValue"], "test-model", "{options}");
    assert_eq!(options[1]["id"], "thought_level", "{options}");
    assert_eq!(options[1]["currentValue"], "high", "{options}");
    w.prompt("after");
    w.run_idle();
    let efforts: Vec<Value> = w
        .llm_requests
        .iter()
        .map(|(_, _, body)| body["reasoning_effort"].clone())
        .collect();
    assert_eq!(
        efforts,
        [Value::Null, json!("high")],
        "from the next request on"
    );

    // A new process loads the session: the effort it chose holds, and is advertised.
    let mut w2 = World::new(store_config(), vec![]).with_disk(w.disk.clone());
    w2.initialize();
    let load = w2.load_session(&sid, true);
    let loaded = w2.response(load).cloned().unwrap_or_default();
    assert_eq!(
        loaded["result"]["configOptions"][1]["currentValue"], "high",
        "{loaded}"
    );
    w2.session = Some(sid.clone());
    w2.prompt("loaded");
    w2.run_idle();
    assert_eq!(
        w2.llm_requests
            .last()
            .map(|(_, _, b)| b["reasoning_effort"].clone()),
        Some(json!("high"))
    );
    // Back to the provider's default: no reasoning parameter, recorded as such.
    let default = w2.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "thought_level", "value": "default"}),
    );
    w2.run_idle();
    assert_eq!(
        w2.response(default)
            .map(|r| r["result"]["configOptions"][1]["currentValue"].clone()),
        Some(json!("default"))
    );
    w2.prompt("plain");
    w2.run_idle();
    let last = w2
        .llm_requests
        .last()
        .map(|(_, _, b)| b.clone())
        .unwrap_or_default();
    assert!(last.get("reasoning_effort").is_none(), "{last}");
    let mut w3 = World::new(store_config(), vec![]).with_disk(w2.disk.clone());
    w3.initialize();
    let load = w3.load_session(&sid, false);
    assert_eq!(
        w3.response(load)
            .map(|r| r["result"]["configOptions"][1]["currentValue"].clone()),
        Some(json!("default"))
    );
}
