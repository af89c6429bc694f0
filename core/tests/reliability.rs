//! Never freeze, never balloon, never drop a frame (issue 10): every inbound stream the core
//! reads is decoded lossily (SPEC L9, C36), every reader is capped (T3, T6, P2, C50, C52), and
//! bad input from one peer leaves the session usable. Driven through the deterministic world
//! (`support`): virtual time, no IO.

mod support;

use buzz_agent_core::io::{MAX_STDERR_LINE_BYTES, STDERR_CUT_MARKER};
use buzz_agent_core::{Action, Input, LlmCallId, LlmEvent, ProcKey};
use serde_json::{Value, json};
use support::{HookReply, LlmReply, ServerSpec, World, test_config};

/// The C36 tool output: Latin-1 `é` and CP949 bytes inside otherwise perfect JSON-RPC.
const C36_RAW: &[u8] = b"int caf\xE9 = 1; // \xB0\xA1\xC7\xD1 END";
const C36_LOSSY: &str = "int caf\u{FFFD} = 1; // \u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD} END";

/// The text of every `role:"tool"` message of an LLM request body.
fn tool_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

fn stop_reason(w: &World, id: u64) -> Value {
    w.response(id)
        .map_or(Value::Null, |r| r["result"]["stopReason"].clone())
}

#[test]
fn c36_invalid_utf8_mcp_reply_is_decoded_lossily() {
    let fs = ServerSpec::new("fs", &[]).tool_text_raw(C36_RAW);
    let mut w = World::new(test_config(), vec![fs]);
    w.start();
    w.llm([
        LlmReply::tool("fs__echo", "{}"),
        LlmReply::text("read it"),
        LlmReply::tool("fs__echo", "{}"),
        LlmReply::text("again"),
    ]);
    let p = w.prompt("read the file");
    let t0 = w.now;
    w.run_idle();
    assert_eq!(stop_reason(&w, p), "end_turn");
    assert_eq!(w.llm_requests.len(), 2);
    let (t1, _, body) = &w.llm_requests[1];
    assert_eq!(tool_texts(body), vec![C36_LOSSY.to_string()]);
    assert_eq!(
        *t1, t0,
        "the call completes at once, not after the tool timeout"
    );
    assert!(w.signals.is_empty(), "the server is never killed");
    // The server stays usable.
    let p2 = w.prompt("once more");
    w.run_idle();
    assert_eq!(stop_reason(&w, p2), "end_turn");
    assert_eq!(
        tool_texts(&w.llm_requests[3].2).last().map(String::as_str),
        Some(C36_LOSSY)
    );
    assert!(w.server_alive("fs"));
}

#[test]
fn c36_invalid_utf8_in_an_acp_prompt_is_decoded_lossily() {
    let mut w = World::new(test_config(), vec![]);
    w.start();
    let sid = w.session.clone().unwrap_or_default();
    let mut line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":77,\"method\":\"session/prompt\",\"params\":{{\"sessionId\":\"{sid}\",\"prompt\":[{{\"type\":\"text\",\"text\":\""
    )
    .into_bytes();
    line.extend_from_slice(C36_RAW);
    line.extend_from_slice(b"\"}]}}\n");
    w.send_acp_bytes(&line);
    w.run_idle();
    assert_eq!(stop_reason(&w, 77), "end_turn");
    let user = &w.llm_requests[0].2["messages"];
    let last = user
        .as_array()
        .and_then(|m| m.last())
        .map_or(Value::Null, |m| m["content"].clone());
    assert_eq!(last, json!(C36_LOSSY));
}

/// Starts a prompt whose LLM call the test answers by hand; returns (prompt id, call).
fn prompt_with_manual_llm(w: &mut World, text: &str) -> (u64, LlmCallId) {
    w.llm_default = LlmReply::Never;
    let p = w.prompt(text);
    w.advance(10);
    let call = w.llm_requests.last().map(|r| r.1).unwrap_or(LlmCallId(0));
    (p, call)
}

/// Delivers `events` for `call` now; returns the ACP lines the agent wrote, parsed.
fn feed_llm(w: &mut World, call: LlmCallId, events: Vec<LlmEvent>) -> Vec<Value> {
    let mut out = Vec::new();
    for event in events {
        w.agent.handle(Input::Llm { call, event }, w.now);
        while let Some(a) = w.agent.poll_action() {
            if let Action::WriteAcp(l) = a {
                out.push(serde_json::from_str::<Value>(&l).unwrap_or(Value::Null));
            }
        }
    }
    out
}

fn ok_head() -> LlmEvent {
    LlmEvent::Head {
        status: 200,
        headers: vec![],
    }
}

#[test]
fn c36_invalid_utf8_in_a_provider_stream_is_decoded_lossily() {
    let mut w = World::new(test_config(), vec![]);
    w.start();
    let (p, call) = prompt_with_manual_llm(&mut w, "hi");
    let mut body = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"".to_vec();
    body.extend_from_slice(C36_RAW);
    body.extend_from_slice(b"\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    let out = feed_llm(&mut w, call, vec![ok_head(), LlmEvent::Body(body)]);
    let text: Vec<&Value> = out
        .iter()
        .filter(|v| v["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|v| &v["params"]["update"]["content"]["text"])
        .collect();
    assert_eq!(text, vec![&json!(C36_LOSSY)]);
    let done = out.iter().find(|v| v["id"] == json!(p));
    assert_eq!(
        done.map(|v| v["result"]["stopReason"].clone()),
        Some(json!("end_turn"))
    );
}

#[test]
fn usage_counts_of_u64_max_saturate_instead_of_overflowing() {
    let mut w = World::new(test_config(), vec![]);
    w.start();
    let (p, call) = prompt_with_manual_llm(&mut w, "hi");
    let body = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"x\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":{m},\"completion_tokens\":{m}}}}}\n\ndata: [DONE]\n\n",
        m = u64::MAX
    );
    let out = feed_llm(
        &mut w,
        call,
        vec![ok_head(), LlmEvent::Body(body.into_bytes())],
    );
    let usage = out
        .iter()
        .find(|v| v["params"]["update"]["sessionUpdate"] == "usage_update")
        .map(|v| v["params"]["update"]["used"].clone());
    assert_eq!(usage, Some(json!(u64::MAX)));
    assert!(out.iter().any(|v| v["id"] == json!(p)));
    // The next prompt projects u64::MAX + its own bytes: saturating, and the turn still runs
    // (compaction is attempted; the world answers every call).
    w.llm_default = LlmReply::text("fine");
    let p2 = w.prompt("next");
    w.run_idle();
    assert!(w.response(p2).is_some());
}

#[test]
fn c50_a_request_over_the_line_cap_is_answered_with_its_own_id() {
    let mut w = World::new(test_config(), vec![]);
    w.start();
    let sid = w.session.clone().unwrap_or_default();
    // A 5 MiB resource block with the default 4 MiB cap, written in 64 KiB pieces.
    let big = "b".repeat(5 * 1024 * 1024);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":103,\"method\":\"session/prompt\",\"params\":{{\"sessionId\":\"{sid}\",\"prompt\":[{{\"type\":\"resource\",\"resource\":{{\"uri\":\"file:///big.txt\",\"text\":\"{big}\"}}}}]}}}}\n"
    );
    for chunk in line.as_bytes().chunks(64 * 1024) {
        w.agent.handle(Input::AcpBytes(chunk.to_vec()), w.now);
        while let Some(a) = w.agent.poll_action() {
            if let Action::WriteAcp(l) = a {
                w.acp_out
                    .push((w.now, serde_json::from_str(&l).unwrap_or(Value::Null)));
            }
        }
    }
    let answers = w.responses(103);
    assert_eq!(answers.len(), 1, "exactly one answer: {answers:?}");
    assert_eq!(answers[0]["error"]["code"], -32600);
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("line too long")),
        "{}",
        answers[0]
    );
    assert!(
        w.acp_out.iter().all(|(_, v)| v["id"] != Value::Null),
        "no id:null answer"
    );
    // The session stays usable.
    let p = w.prompt("small");
    w.run_idle();
    assert_eq!(stop_reason(&w, p), "end_turn");
}

#[test]
fn c52_a_huge_stderr_line_handed_to_the_core_is_capped() {
    let mut w = World::new(test_config(), vec![ServerSpec::new("fs", &[])]);
    w.start();
    let proc = ProcKey {
        server: buzz_agent_core::ServerSlot(1),
        generation: 0,
    };
    w.agent.handle(
        Input::McpStderrLine {
            proc,
            line: "e".repeat(1024 * 1024),
        },
        w.now,
    );
    let mut forwarded = Vec::new();
    while let Some(a) = w.agent.poll_action() {
        if let Action::Log(r) = a {
            forwarded.push(r.message);
        }
    }
    assert_eq!(forwarded.len(), 1);
    let line = forwarded[0].strip_prefix("[mcp:fs] ").unwrap_or("");
    assert!(line.len() <= MAX_STDERR_LINE_BYTES && line.ends_with(STDERR_CUT_MARKER));
}

#[test]
fn c52_a_hook_answer_of_megabytes_is_injected_capped_and_middle_elided() {
    let mut cfg = test_config();
    cfg.stop_max_rejections = 1;
    let cap = cfg.max_tool_result_text_bytes;
    let huge = format!("{}{}", "h".repeat(4 * 1024 * 1024), "THE END");
    let guard = ServerSpec::new("guard", &["_Stop"]).script([HookReply::objection(&huge)]);
    let mut w = World::new(cfg, vec![guard]);
    w.start();
    let p = w.prompt("go");
    w.run_idle();
    assert_eq!(stop_reason(&w, p), "end_turn");
    let injected = tool_texts(&w.llm_requests[1].2);
    assert_eq!(injected.len(), 1);
    let inner: Value = serde_json::from_str(&injected[0]).unwrap_or(Value::Null);
    let text = inner["text"].as_str().unwrap_or("");
    assert!(text.len() <= cap + 128, "{} bytes injected", text.len());
    assert!(text.starts_with("hhhh") && text.ends_with("THE END"));
}

#[test]
fn c52_an_endless_successful_response_body_is_abandoned_at_256_mib() {
    use buzz_agent_core::testing::MAX_RESPONSE_BODY_BYTES;
    let mut w = World::new(test_config(), vec![]);
    w.start();
    let (p, call) = prompt_with_manual_llm(&mut w, "hi");
    let first =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"so far\"}}]}\n\n".to_vec();
    let used = first.len() as u64;
    // Zeroed pages are not touched, so this costs no memory until read.
    let rest = usize::try_from(MAX_RESPONSE_BODY_BYTES - used + 1).unwrap_or(usize::MAX);
    let out = feed_llm(
        &mut w,
        call,
        vec![
            ok_head(),
            LlmEvent::Body(first),
            LlmEvent::Body(vec![0u8; rest]),
        ],
    );
    let r = out.iter().find(|v| v["id"] == json!(p)).cloned();
    let msg = r
        .as_ref()
        .and_then(|r| r["error"]["message"].as_str())
        .unwrap_or_default();
    assert!(msg.contains("over 256 MiB"), "{r:?}");
    assert_eq!(w.llm_requests.len(), 1, "not retried");
}

#[test]
fn c52_an_error_body_of_megabytes_keeps_only_its_first_4_kib() {
    use buzz_agent_core::testing::ERROR_BODY_CAP;
    let mut w = World::new(test_config(), vec![]);
    w.start();
    let (p, call) = prompt_with_manual_llm(&mut w, "hi");
    let mut events = vec![LlmEvent::Head {
        status: 400,
        headers: vec![],
    }];
    for _ in 0..64 {
        events.push(LlmEvent::Body(vec![b'e'; 128 * 1024]));
    }
    events.push(LlmEvent::End);
    let out = feed_llm(&mut w, call, events);
    let r = out.iter().find(|v| v["id"] == json!(p)).cloned();
    let msg = r
        .as_ref()
        .and_then(|r| r["error"]["message"].as_str())
        .unwrap_or_default();
    assert!(msg.contains("HTTP 400") && msg.contains("eeee"), "{r:?}");
    assert!(msg.len() <= ERROR_BODY_CAP + 64, "{} bytes", msg.len());
}

#[test]
fn c52_a_tool_error_message_of_megabytes_reaches_the_model_cut_to_4_kib() {
    use buzz_agent_core::jsonrpc::MAX_ERROR_MESSAGE_BYTES;
    let big = "r".repeat(3 * 1024 * 1024);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":@ID@,\"error\":{{\"code\":-32000,\"message\":\"{big}\"}}}}"
    );
    let fs = ServerSpec::new("fs", &[]).tool_reply_raw(line.as_bytes());
    let mut w = World::new(test_config(), vec![fs]);
    w.start();
    w.llm([LlmReply::tool("fs__echo", "{}"), LlmReply::text("ok")]);
    let p = w.prompt("go");
    w.run_idle();
    assert_eq!(stop_reason(&w, p), "end_turn");
    let texts = tool_texts(&w.llm_requests[1].2);
    assert_eq!(texts.len(), 1);
    assert!(texts[0].contains("rrrr"), "{}", &texts[0][..100]);
    assert!(
        texts[0].len() <= MAX_ERROR_MESSAGE_BYTES + 64,
        "{} bytes reached the model",
        texts[0].len()
    );
}

#[test]
fn c52_an_endless_mcp_stdout_line_kills_the_server_once_it_passes_16_mib() {
    let mut w = World::new(test_config(), vec![ServerSpec::new("fs", &[])]);
    w.start();
    let proc = ProcKey {
        server: buzz_agent_core::ServerSlot(1),
        generation: 0,
    };
    let chunk = vec![b'x'; 1024 * 1024];
    let mut killed_at = None;
    for i in 1..=20 {
        w.agent.handle(
            Input::McpBytes {
                proc,
                bytes: chunk.clone(),
            },
            w.now,
        );
        while let Some(a) = w.agent.poll_action() {
            if matches!(a, Action::SignalProcessGroup { .. }) && killed_at.is_none() {
                killed_at = Some(i);
            }
        }
    }
    assert_eq!(killed_at, Some(17), "killed as the line passes 16 MiB");
}
