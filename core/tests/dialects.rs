//! Provider dialects through the whole agent (SPEC L7, L10; cases C39, C41, C61), in the
//! deterministic simulation world (`support`): virtual time, scripted LLM bodies answered
//! verbatim, real hook rounds. Each test reads the request bodies the agent built.

mod support;

use serde_json::{Value, json};
use support::{LlmReply, ServerSpec, World, test_config};

/// The case's own 400 body (C41).
const C41_BODY: &str = r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens"}}"#;

fn bodies(w: &World) -> Vec<Value> {
    w.llm_requests.iter().map(|(_, _, b)| b.clone()).collect()
}

fn result(w: &World, id: u64) -> Value {
    w.response(id).map_or(Value::Null, |r| r["result"].clone())
}

#[test]
fn c41_max_tokens_rejected_is_retried_once_as_max_completion_tokens_and_remembered() {
    let mut cfg = test_config();
    cfg.model = "my-reasoner".into(); // not a known name: only the 400 can teach the agent
    let mut w = World::new(cfg, vec![ServerSpec::new("fs", &[])]);
    w.start();
    w.llm([
        LlmReply::Raw {
            status: 400,
            body: C41_BODY.into(),
        },
        LlmReply::text("first answer"),
        LlmReply::text("second answer"),
    ]);
    let p1 = w.prompt("one");
    w.run_idle();
    assert_eq!(
        result(&w, p1)["stopReason"],
        "end_turn",
        "{}",
        w.transcript_text()
    );
    let p2 = w.prompt("two");
    w.run_idle();
    assert_eq!(result(&w, p2)["stopReason"], "end_turn");
    let b = bodies(&w);
    assert_eq!(
        b.len(),
        3,
        "one rejected request, its retry, the next prompt"
    );
    assert_eq!(b[0]["max_tokens"], json!(32_768));
    assert!(b[0].get("max_completion_tokens").is_none());
    for later in &b[1..] {
        assert_eq!(later["max_completion_tokens"], json!(32_768), "{later}");
        assert!(later.get("max_tokens").is_none(), "{later}");
    }
}

#[test]
fn c41_a_second_rejection_under_the_new_name_fails_the_prompt_without_looping() {
    let mut cfg = test_config();
    cfg.model = "gpt-5.4".into(); // a known reasoning model: the new name from the first request
    let mut w = World::new(cfg, vec![ServerSpec::new("fs", &[])]);
    w.start();
    w.llm([LlmReply::Raw {
        status: 400,
        body: C41_BODY.into(),
    }]);
    let p = w.prompt("one");
    w.run_idle();
    let b = bodies(&w);
    assert_eq!(b.len(), 1, "no rename retry when the name was already sent");
    assert_eq!(b[0]["max_completion_tokens"], json!(32_768));
    let resp = w.response(p).cloned().unwrap_or(Value::Null);
    assert_eq!(resp["error"]["code"], -32000, "{resp}");
}
