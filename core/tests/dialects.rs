//! Provider dialects through the whole agent (SPEC L7, L10; cases C39, C41, C61), in the
//! deterministic simulation world (`support`): virtual time, scripted LLM bodies answered
//! verbatim, real hook rounds. Each test reads the request bodies the agent built.

mod support;

use buzz_agent_core::config::ProviderKind;
use serde_json::{Value, json};
use support::{HookReply, LlmReply, ServerSpec, World, test_config};

/// The case's own 400 body (C41).
const C41_BODY: &str = r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens"}}"#;

fn bodies(w: &World) -> Vec<Value> {
    w.llm_requests.iter().map(|(_, _, b)| b.clone()).collect()
}

fn result(w: &World, id: u64) -> Value {
    w.response(id).map_or(Value::Null, |r| r["result"].clone())
}

/// Prompts `one`, then `two`, each to the end; panics unless both end `end_turn`.
fn two_prompts_end_their_turns(w: &mut World) {
    for text in ["one", "two"] {
        let p = w.prompt(text);
        w.run_idle();
        assert_eq!(
            result(w, p)["stopReason"],
            "end_turn",
            "{text}: {}",
            w.transcript_text()
        );
    }
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
    two_prompts_end_their_turns(&mut w);
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
    let b = refused_prompt_fails(cfg, 400, C41_BODY);
    assert_eq!(b.len(), 1, "no rename retry when the name was already sent");
    assert_eq!(b[0]["max_completion_tokens"], json!(32_768));
}

/// One prompt on `cfg` whose every request is refused with `status` and `body`: panics unless
/// the prompt fails with the provider's error; the request bodies sent.
fn refused_prompt_fails(
    cfg: buzz_agent_core::config::Config,
    status: u16,
    body: &str,
) -> Vec<Value> {
    let mut w = World::new(cfg, vec![ServerSpec::new("fs", &[])]);
    w.start();
    w.llm([LlmReply::Raw {
        status,
        body: body.into(),
    }]);
    let p = w.prompt("one");
    w.run_idle();
    let resp = w.response(p).cloned().unwrap_or(Value::Null);
    assert_eq!(resp["error"]["code"], -32000, "{resp}");
    bodies(&w)
}

/// An Anthropic Messages SSE body: an optional signed thinking block, a text block, then
/// `stop_reason` (SPEC L6).
fn anthropic_sse(thinking: Option<(&str, &str)>, text: &str, stop: &str) -> String {
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    ];
    let mut index = 0;
    if let Some((thought, signature)) = thinking {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}));
        events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": thought}}));
        events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}}));
        events.push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    }
    events.push(json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}));
    events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}));
    events.push(json!({"type": "content_block_stop", "index": index}));
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}));
    events.push(json!({"type": "message_stop"}));
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect()
}

/// Anthropic's extended-thinking rule as documented (and as the 400 "Expected `thinking` or
/// `redacted_thinking`, but found `text`" enforces it): when a request continues a tool loop
/// (its last message is a user message of tool results only), the first assistant message
/// since the last user message with other content must start with a thinking block.
fn anthropic_thinking_rule(body: &Value) -> Result<(), String> {
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    let only_results = |m: &Value| {
        m["role"] == "user"
            && m["content"]
                .as_array()
                .is_some_and(|c| c.iter().all(|b| b["type"] == "tool_result"))
    };
    let Some(last) = msgs.last() else {
        return Ok(());
    };
    if !only_results(last) {
        return Ok(());
    }
    let start = msgs
        .iter()
        .rposition(|m| m["role"] == "user" && !only_results(m))
        .map_or(0, |i| i + 1);
    let first = msgs[start..].iter().find(|m| m["role"] == "assistant");
    match first.and_then(|m| m["content"][0]["type"].as_str()) {
        Some("thinking" | "redacted_thinking") => Ok(()),
        other => Err(format!(
            "messages.{start}.content.0.type: Expected `thinking` or `redacted_thinking`, but found {other:?}"
        )),
    }
}

#[test]
fn c39_anthropic_objection_while_thinking_keeps_the_signed_block_in_the_joined_turn() {
    let mut cfg = test_config();
    cfg.provider = ProviderKind::Anthropic;
    let guard = ServerSpec::new("h", &["_Stop"]).script([HookReply::objection("tests fail")]);
    let mut w = World::new(cfg, vec![guard]);
    w.start();
    w.llm([
        LlmReply::Raw {
            status: 200,
            body: anthropic_sse(
                Some(("Everything is done, I think.", "SIG_T1")),
                "All done.",
                "end_turn",
            ),
        },
        LlmReply::Raw {
            status: 200,
            body: anthropic_sse(None, "Fixed; done now.", "end_turn"),
        },
    ]);
    let p = w.prompt("finish");
    w.run_idle();
    let r = result(&w, p);
    assert_eq!(r["stopReason"], "end_turn", "{}", w.transcript_text());
    assert_eq!(r["_meta"]["buzz"]["stopObjections"], 1);
    let b = bodies(&w);
    assert_eq!(b.len(), 2);
    let turn = &b[1]["messages"][1];
    assert_eq!(turn["role"], "assistant");
    let content = turn["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        content[0],
        json!({"type": "thinking", "thinking": "Everything is done, I think.", "signature": "SIG_T1"}),
        "unmodified, first"
    );
    assert_eq!(content[1], json!({"type": "text", "text": "All done."}));
    assert_eq!(content[2]["type"], "tool_use");
    assert_eq!(content[2]["name"], "h___Stop");
    assert_eq!(content.len(), 3);
    for body in &b {
        anthropic_thinking_rule(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    }
}

#[test]
fn c39_anthropic_postcompact_after_a_summary_with_thinking_keeps_every_request_valid() {
    let mut cfg = test_config();
    cfg.provider = ProviderKind::Anthropic;
    cfg.max_context_tokens = 2_000;
    cfg.max_output_tokens = 100;
    let guard = ServerSpec::new("g", &["_PostCompact"])
        .default_reply(HookReply::objection("remember: run the tests"));
    let mut w = World::new(cfg, vec![guard]);
    w.start();
    w.llm([
        // The summary call, then the round after compaction.
        LlmReply::Raw {
            status: 200,
            body: anthropic_sse(
                Some(("summarising", "SIG_S")),
                "Task: X. Done: Y.",
                "end_turn",
            ),
        },
        LlmReply::Raw {
            status: 200,
            body: anthropic_sse(Some(("ok", "SIG_2")), "Continuing.", "end_turn"),
        },
    ]);
    let p = w.prompt(&"a long task description ".repeat(80));
    w.run_idle();
    assert_eq!(
        result(&w, p)["stopReason"],
        "end_turn",
        "{}",
        w.transcript_text()
    );
    let b = bodies(&w);
    assert_eq!(b.len(), 2, "summary, then the round");
    let msgs = b[1]["messages"].as_array().cloned().unwrap_or_default();
    let roles: Vec<&str> = msgs.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant", "user"],
        "{msgs:#?}"
    );
    assert_eq!(msgs[1]["content"][0]["name"], "g___PostCompact");
    assert!(
        msgs[4]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("a long task")),
        "the live prompt alone ends the request: {}",
        msgs[4]
    );
    for body in &b {
        anthropic_thinking_rule(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    }
}

/// A Chat Completions SSE body with DeepSeek-style `reasoning_content`, then text or one tool
/// call.
fn deepseek_sse(reasoning: &str, text: &str, call: Option<(&str, &str)>) -> String {
    let mut chunks = vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": reasoning}, "finish_reason": null}]}),
    ];
    if !text.is_empty() {
        chunks.push(
            json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
        );
    }
    let finish = match call {
        Some((id, name)) => {
            chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}]}, "finish_reason": null}]}));
            "tool_calls"
        }
        None => "stop",
    };
    chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    s.push_str("data: [DONE]\n\n");
    s
}

/// DeepSeek's documented rule (thinking mode, tool calls): between two user messages, when an
/// assistant message called tools, every assistant message there must carry
/// `reasoning_content`.
fn deepseek_rule(body: &Value) -> Result<(), String> {
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    let mut start = 0;
    for end in 0..=msgs.len() {
        if end == msgs.len() || msgs[end]["role"] == "user" {
            let segment = &msgs[start..end];
            if segment.iter().any(|m| m.get("tool_calls").is_some()) {
                for (k, m) in segment.iter().enumerate() {
                    if m["role"] == "assistant" && !m["reasoning_content"].is_string() {
                        return Err(format!(
                            "Missing `reasoning_content` field in the assistant message at message index {}",
                            start + k
                        ));
                    }
                }
            }
            start = end + 1;
        }
    }
    Ok(())
}

#[test]
fn c61_c39_chat_objection_joins_the_answer_and_keeps_deepseek_reasoning_valid() {
    let guard = ServerSpec::new("h", &["_Stop"]).script([HookReply::objection("tests fail")]);
    let mut w = World::new(test_config(), vec![guard]);
    w.start();
    w.llm([
        LlmReply::Raw {
            status: 200,
            body: deepseek_sse("R1", "", Some(("call_1", "h__echo"))),
        },
        LlmReply::Raw {
            status: 200,
            body: deepseek_sse("R2", "All done.", None),
        },
        LlmReply::Raw {
            status: 200,
            body: deepseek_sse("R3", "Fixed.", None),
        },
    ]);
    let p = w.prompt("go");
    w.run_idle();
    let r = result(&w, p);
    assert_eq!(r["stopReason"], "end_turn", "{}", w.transcript_text());
    assert_eq!(r["_meta"]["buzz"]["stopObjections"], 1);
    let b = bodies(&w);
    assert_eq!(b.len(), 3);
    for body in &b {
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        for pair in msgs.windows(2) {
            assert!(
                !(pair[0]["role"] == "assistant" && pair[1]["role"] == "assistant"),
                "C61: two assistant messages in a row: {body}"
            );
        }
        deepseek_rule(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    }
    // The objection joined the answer: text, its reasoning and the synthetic call together.
    let joined = b[2]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["content"] == "All done.")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(joined["reasoning_content"], "R2", "{joined}");
    assert_eq!(joined["tool_calls"][0]["function"]["name"], "h___Stop");
    let first_call = &b[1]["messages"][1];
    assert_eq!(first_call["reasoning_content"], "R1", "{first_call}");
}

/// OpenAI's answer on Chat Completions for a model only the Responses API serves (`o1-pro`).
const RESPONSES_ONLY_BODY: &str = r#"{"error":{"message":"This model is only supported in v1/responses and not in v1/chat/completions.","type":"invalid_request_error","param":"model","code":null}}"#;

/// A Responses API stream of one text answer (SPEC L8).
fn responses_sse(text: &str) -> String {
    [
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text}),
        json!({"type": "response.completed", "response": {"status": "completed", "usage": {"input_tokens": 10, "output_tokens": 2}}}),
    ]
    .iter()
    .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
    .collect()
}

#[test]
fn l8_a_model_only_the_responses_api_serves_moves_to_the_responses_route_within_the_prompt() {
    let mut cfg = test_config();
    cfg.model = "o1-pro".into();
    let mut w = World::new(cfg, vec![ServerSpec::new("fs", &[])]);
    let sid = w.start();
    let from = w.acp_out.len();
    w.llm([
        LlmReply::Raw {
            status: 404,
            body: RESPONSES_ONLY_BODY.into(),
        },
        LlmReply::Raw {
            status: 200,
            body: responses_sse("first answer"),
        },
        LlmReply::Raw {
            status: 200,
            body: responses_sse("second answer"),
        },
    ]);
    two_prompts_end_their_turns(&mut w);
    let b = bodies(&w);
    assert_eq!(
        b.len(),
        3,
        "the refused request, its resend, the next prompt"
    );
    assert!(b[0]["messages"].is_array(), "Chat first: {}", b[0]);
    for later in &b[1..] {
        // The Responses shape: `input` items, the output cap as `max_output_tokens`.
        assert!(
            later["input"].is_array() && later.get("messages").is_none(),
            "{later}"
        );
        assert_eq!(later["max_output_tokens"], json!(32_768), "{later}");
    }
    assert_eq!(b[2]["input"][0]["content"], json!("one"), "{}", b[2]);
    let warns: Vec<_> = w
        .logs
        .iter()
        .filter(|l| l.message.contains("Responses API"))
        .collect();
    assert_eq!(warns.len(), 1, "{warns:?}");
    assert_eq!(warns[0].level, buzz_agent_core::config::LogLevel::Warn);
    let notices: Vec<_> = w
        .updates_since(from, &sid)
        .into_iter()
        .filter(|u| u["_meta"]["buzz"]["notice"] == "llm_route_changed")
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("'o1-pro'") && t.contains("Responses API")),
        "{notices:?}"
    );
}

#[test]
fn l8_a_responses_route_refusal_naming_v1_responses_fails_the_prompt_without_looping() {
    let mut cfg = test_config();
    cfg.provider = ProviderKind::OpenAiResponses;
    let b = refused_prompt_fails(cfg, 404, RESPONSES_ONLY_BODY);
    assert_eq!(b.len(), 1, "nothing to upgrade to on Responses");
}
