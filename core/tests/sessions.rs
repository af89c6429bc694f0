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
        w2.response(id).map(|r| r["result"].clone()),
        Some(json!({}))
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
