//! SPEC A9 across the `_Stop` budget (I2, H5): a load happens between prompts, never in the
//! middle of a turn, and the first prompt after it starts with a fresh budget.

mod support;

use buzz_agent_core::config::StateDir;
use serde_json::{Value, json};
use support::{HookReply, LlmReply, ServerSpec, World, test_config};

fn store_config(budget: u32) -> buzz_agent_core::Config {
    let mut c = test_config();
    c.state_dir = StateDir::Dir("/state".into());
    c.stop_max_rejections = budget;
    c
}

fn guard() -> Vec<ServerSpec> {
    vec![
        ServerSpec::new("guard", &["_Stop"]).default_reply(HookReply::after(
            support::HookKind::Text("not yet".into()),
            100,
        )),
    ]
}

fn meta(w: &World, id: u64) -> Value {
    w.response(id)
        .map_or(Value::Null, |r| r["result"]["_meta"]["buzz"].clone())
}

#[test]
fn a9_i2_a_load_of_a_session_in_the_middle_of_a_turn_is_refused_and_its_budget_untouched() {
    let mut w = World::new(store_config(2), guard());
    let sid = w.start();
    let p = w.prompt("first");
    w.advance(50); // the first `_Stop` round is running
    let id = w.load_session(&sid, true);
    let err = w.response(id).cloned().unwrap_or_default();
    assert_eq!(err["error"]["code"], -32602, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("already open")),
        "{err}"
    );
    w.run_idle();
    assert_eq!(
        meta(&w, p),
        json!({"rounds": 3, "stopObjections": 2, "stopBudget": 2, "stopBudgetExhausted": true}),
        "the turn ran to its budget as if nothing happened"
    );
}

#[test]
fn a9_i2_the_first_prompt_after_a_load_starts_with_a_fresh_stop_budget() {
    let mut w = World::new(store_config(1), guard());
    let sid = w.start();
    let p = w.prompt("first");
    w.run_idle();
    assert_eq!(meta(&w, p)["stopBudgetExhausted"], true);
    let mut w2 = World::new(store_config(1), guard()).with_disk(w.disk.clone());
    w2.initialize();
    let id = w2.load_session(&sid, false);
    assert_eq!(
        w2.response(id)
            .map(|r| r["result"]["configOptions"][0]["id"].clone()),
        Some(json!("model")),
        "the answer carries the model selector"
    );
    w2.llm([LlmReply::text("Again."), LlmReply::text("Done.")]);
    let p = w2.prompt("second");
    w2.run_idle();
    assert_eq!(
        meta(&w2, p),
        json!({"rounds": 2, "stopObjections": 1, "stopBudget": 1, "stopBudgetExhausted": true}),
        "I2: a new prompt, a new budget"
    );
    // The history carries the first prompt's objection too.
    let last = &w2.llm_requests[w2.llm_requests.len() - 1].2;
    let injections = last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["tool_call_id"]
                .as_str()
                .is_some_and(|i| i.starts_with("buzz_hook__Stop_"))
        })
        .count();
    assert_eq!(injections, 2, "one per prompt: {last}");
}

/// SPEC H10 × A9: a saved session opened again runs its `_SessionStart` round before the load
/// is answered (`source` `load`, or `resume`), and what it answers goes right after the next
/// prompt, once; the history the file restored is untouched.
#[test]
fn h10_a9_a_loaded_session_runs_session_start_with_its_source_and_injects_into_the_next_prompt() {
    let todo = || {
        vec![ServerSpec::new("todo", &["_SessionStart"]).hook_reply(
            "_SessionStart",
            HookReply::objection("open: write the docs"),
        )]
    };
    let mut w = World::new(store_config(1), todo());
    let sid = w.start();
    w.llm([LlmReply::text("Done.")]);
    w.prompt("first");
    w.run_idle();
    for (replay, source) in [(true, "load"), (false, "resume")] {
        let mut w2 = World::new(store_config(1), todo()).with_disk(w.disk.clone());
        w2.initialize();
        let id = w2.load_session(&sid, replay);
        assert!(w2.response(id).is_some_and(|r| r.get("result").is_some()));
        let starts: Vec<Value> = w2.mcp_lines["todo"]
            .iter()
            .map(|(_, v)| v)
            .filter(|v| v["params"]["name"] == "_SessionStart")
            .map(|v| v["params"]["_meta"]["buzz/hook"]["source"].clone())
            .collect();
        assert_eq!(starts, [json!(source)], "one round, before the answer");
        w2.llm([LlmReply::text("Next.")]);
        w2.prompt("second");
        w2.run_idle();
        let msgs = w2.llm_requests[0].2["messages"].to_string();
        let first = msgs.find("first").unwrap_or(usize::MAX);
        let second = msgs.find("second").unwrap_or(usize::MAX);
        let injected = msgs.rfind("open: write the docs").unwrap_or(usize::MAX);
        assert!(
            first < second && second < injected && injected < usize::MAX,
            "the restored history, the prompt, then the injection: {msgs}"
        );
        assert_eq!(msgs.matches("open: write the docs").count(), 2, "{msgs}");
    }
}
