//! The invariants I1 and I7–I12 of the design (docs/invariants.md), written once for every
//! driver of the simulated world ([`super::world`]): the `session` fuzz target
//! ([`super::session`]) and the core's property and snapshot tests (`core/tests/support`). An
//! [`Invariants`] watches what the client sent and every action the agent produced, and panics,
//! naming the invariant, at the first violation:
//!
//! - I1: a prompt response never reports more `_Stop` objections than the budget;
//! - I7: no request is answered more often than it was sent, and (at [`Invariants::all_answered`])
//!   every request was answered exactly once — counted with the agent's own line codec, so an
//!   over-long line with an id and an unreadable line are requests too (T3, T4);
//! - I8: a turn's `session/update` is only sent while a prompt of its session is outstanding
//!   (session-level updates, and the replay of a `session/load`, belong to no turn);
//! - I9: every LLM request pairs each assistant tool call with exactly one result, after it,
//!   on all three routes; on the Chat route the results follow their calls' message at once,
//!   in call order, and no tool message stands elsewhere;
//! - I10: no hook is offered to the LLM, and every `_` tool call sent to a server is a hook call
//!   carrying the hook `_meta`;
//! - I11: after `handle_timeout(t)` and a drain, `poll_timeout` is `None` or later than `t`;
//! - I12: two runs of the same script ([`Invariants::same_runs`]) are the same steps: the same
//!   inputs at the same times and the same actions (LLM request bodies byte for byte), ending
//!   at the same time.
//!
//! The simulated world ([`super::world::World`]) runs these after every step for both its
//! drivers (the core's tests and the `session` fuzz target); I2–I6 need the reference model of
//! `core/tests/hooks_props.rs`.

use super::world::Step;
use crate::config::{Config, ProviderKind};
use crate::io::{Action, Input};
use crate::jsonrpc::{self, LineBuffer, LineEvent, Message, ParseError, RpcId};
use crate::time::MonoTime;
use crate::timers::TimerKey;
use serde_json::Value;
use std::collections::BTreeMap;

/// `session/update` kinds that belong to a session, not to a turn (I8 does not apply).
const SESSION_LEVEL_UPDATES: &[&str] = &[
    "config_option_update",
    "available_commands_update",
    "current_mode_update",
    "session_info_update",
];

/// Methods whose outstanding request makes a session's updates legitimate (I8): a prompt's
/// turn, and the history a load or resume replays.
const TURN_METHODS: &[&str] = &["session/prompt", "session/load", "session/resume"];

/// What one run has shown so far, and the checks. See the module docs.
pub struct Invariants {
    provider: ProviderKind,
    budget: u32,
    /// The client's bytes through the agent's own line codec.
    client: LineBuffer,
    /// Answers due per request id (JSON text, `null` for an id nobody can read).
    due: BTreeMap<String, usize>,
    /// Answers written per request id.
    answered: BTreeMap<String, usize>,
    /// Outstanding prompt, load and resume request ids per session id.
    turns: BTreeMap<String, Vec<String>>,
}

impl Invariants {
    /// Checks for an agent built from `cfg` (its route for I9, its `_Stop` budget for I1, its
    /// ACP line cap for I7).
    #[must_use]
    pub fn new(cfg: &Config) -> Invariants {
        Invariants {
            provider: cfg.provider,
            budget: cfg.stop_max_rejections,
            client: LineBuffer::recovering_ids(cfg.max_line_bytes),
            due: BTreeMap::new(),
            answered: BTreeMap::new(),
            turns: BTreeMap::new(),
        }
    }

    /// Answers written so far, per request id (JSON text).
    #[must_use]
    pub fn answered(&self) -> &BTreeMap<String, usize> {
        &self.answered
    }

    /// Takes note of an input given to the agent: the client's bytes and EOF count their
    /// requests (I7) and open their turns (I8).
    pub fn input(&mut self, input: &Input) {
        let mut events = Vec::new();
        if let Input::AcpBytes(bytes) = input {
            self.client.push(bytes, &mut events);
        } else if let Input::AcpEof = input {
            let _ = self.client.finish_into(&mut events);
        } else {
            return;
        }
        for ev in &events {
            let (id, method, params) = match ev {
                LineEvent::TooLong { id, .. } => (id.clone(), None, Value::Null),
                LineEvent::Line(l) => match jsonrpc::parse_message(l) {
                    Ok(Message::Request { id, method, params }) => (Some(id), Some(method), params),
                    Ok(Message::Notification { .. } | Message::Response { .. }) => continue,
                    Err(ParseError::Invalid { id, .. }) => (id, None, Value::Null),
                    Err(ParseError::NotJson) => (None, None, Value::Null),
                },
            };
            let key = id_key(id.as_ref());
            *self.due.entry(key.clone()).or_default() += 1;
            if method.is_some_and(|m| TURN_METHODS.contains(&m.as_str())) {
                let sid = params["sessionId"].as_str().unwrap_or("").to_owned();
                self.turns.entry(sid).or_default().push(key);
            }
        }
    }

    /// Checks one action the agent produced (after [`super::check_action`]'s frame checks):
    /// I1, I7 (never more answers than requests), I8, I9, I10.
    pub fn action(&mut self, a: &Action) {
        let json = if let Action::WriteAcp(line) | Action::WriteMcp { line, .. } = a {
            Some(serde_json::from_str::<Value>(line).expect("T1: a frame is JSON"))
        } else if let Action::CallLlm { request, .. } = a {
            Some(
                serde_json::from_slice::<Value>(&request.body.to_vec())
                    .unwrap_or_else(|e| panic!("the LLM request body is not JSON: {e}")),
            )
        } else {
            None
        };
        self.action_json(a, json.as_ref());
    }

    /// [`Invariants::action`] with the action's JSON parsed already (a frame, or an LLM
    /// request body: what [`super::check_action`] returns).
    ///
    /// # Panics
    /// When `json` is `None` for a frame or an LLM call.
    pub fn action_json(&mut self, a: &Action, json: Option<&Value>) {
        let frame = matches!(
            a,
            Action::WriteAcp(_) | Action::WriteMcp { .. } | Action::CallLlm { .. }
        );
        let Some(v) = json.filter(|_| frame) else {
            assert!(!frame, "the JSON of {a:?} is missing");
            return;
        };
        if let Action::WriteAcp(line) = a {
            self.acp_line(line, v);
        } else if let Action::WriteMcp { .. } = a {
            mcp_frame(v);
        } else {
            llm_request(self.provider, v);
        }
    }

    /// I11, after `handle_timeout(now)` and a drain: `next` is the agent's `poll_timeout`.
    pub fn after_timeout(now: MonoTime, next: Option<(MonoTime, TimerKey)>) {
        if let Some((t, k)) = next {
            assert!(
                t > now,
                "I11: after handle_timeout({now}) poll_timeout is {t} ({k:?})"
            );
        }
    }

    /// I12: two runs of one script gave the same steps (inputs, times, actions compared whole,
    /// so LLM request bodies byte for byte) and ended at the same time.
    ///
    /// # Panics
    /// At the first step that differs, naming it.
    pub fn same_runs(first: (&[Step], MonoTime), second: (&[Step], MonoTime)) {
        let (a, b) = (first.0, second.0);
        if let Some(at) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
            panic!(
                "I12: the same script gave a different run at step {at}: {:?} then {:?}",
                a.get(at),
                b.get(at)
            );
        }
        assert_eq!(
            first.1, second.1,
            "I12: the same script finished at another time"
        );
    }

    /// I7 at the end of a run (after EOF and shutdown): every request answered exactly once.
    pub fn all_answered(&self) {
        assert_eq!(
            self.answered, self.due,
            "I7: every request answered exactly once"
        );
    }

    fn acp_line(&mut self, line: &str, v: &Value) {
        match (v.get("id"), v.get("method").and_then(Value::as_str)) {
            (None, Some("session/update")) => {
                let sid = v["params"]["sessionId"].as_str().unwrap_or("");
                let kind = v["params"]["update"]["sessionUpdate"]
                    .as_str()
                    .unwrap_or("");
                assert!(
                    SESSION_LEVEL_UPDATES.contains(&kind)
                        || self.turns.get(sid).is_some_and(|p| !p.is_empty()),
                    "I8: session/update for {sid} with no prompt outstanding: {line}"
                );
            }
            (Some(id), None) => {
                let key = id.to_string();
                for p in self.turns.values_mut() {
                    p.retain(|k| *k != key);
                }
                let n = self.answered.entry(key.clone()).or_default();
                *n += 1;
                let due = self.due.get(&key).copied().unwrap_or(0);
                assert!(
                    *n <= due,
                    "I7: request {key} answered {n} times ({due} sent)"
                );
                if let Some(n) = v["result"]["_meta"]["buzz"]["stopObjections"].as_u64() {
                    assert!(
                        n <= u64::from(self.budget),
                        "I1: {n} objections honoured with budget {}",
                        self.budget
                    );
                }
            }
            _ => {}
        }
    }
}

/// An id as the answers count it: its JSON text, `null` for none.
fn id_key(id: Option<&RpcId>) -> String {
    id.map_or_else(|| "null".to_owned(), |i| i.to_value().to_string())
}

/// I10 on a line to a server: a `_` tool call is a hook call, carrying the hook `_meta`.
#[cfg(test)]
fn mcp_line(line: &str) {
    mcp_frame(&serde_json::from_str(line).expect("T1: a frame is JSON"));
}

/// I10 on a frame to a server (its JSON): a `_` tool call is a hook call, carrying the hook
/// `_meta`.
fn mcp_frame(v: &Value) {
    if v["method"] != "tools/call" {
        return;
    }
    let name = v["params"]["name"].as_str().unwrap_or("");
    if name.starts_with('_') {
        assert!(
            v["params"]["_meta"].get("buzz/hook").is_some(),
            "I10: a model call to the hook {name} reached the server"
        );
    }
}

/// I9 and I10 on one LLM request body.
fn llm_request(provider: ProviderKind, body: &Value) {
    for name in offered_tools(body) {
        assert!(
            !name.contains("___"),
            "I10: the hook {name} was offered to the LLM"
        );
    }
    if provider == ProviderKind::OpenAiChat {
        chat_results_follow_their_calls(body);
    }
    let pairs = tool_pairs(provider, body);
    let mut open: Vec<&str> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (is_result, id) in &pairs {
        if *is_result {
            let at = open.iter().position(|o| o == id);
            assert!(
                at.is_some(),
                "I9: tool result {id} without a preceding open call: {pairs:?}"
            );
            if let Some(at) = at {
                open.remove(at);
            }
        } else {
            assert!(!seen.contains(&id.as_str()), "I9: call id {id} used twice");
            seen.push(id);
            open.push(id);
        }
    }
    assert!(open.is_empty(), "I9: calls without a result: {open:?}");
}

/// I9 on a Chat request: each assistant message's tool calls are answered by the tool messages
/// right after it, one per call, in call order; a tool message anywhere else is an orphan.
fn chat_results_follow_their_calls(body: &Value) {
    let msgs = body["messages"].as_array().map_or(&[][..], Vec::as_slice);
    let mut i = 0;
    while let Some(m) = msgs.get(i) {
        assert!(m["role"] != "tool", "I9: orphan tool message at {i}: {m}");
        i += 1;
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            let id = &c["id"];
            let r = msgs.get(i);
            assert!(
                r.is_some_and(|r| r["role"] == "tool" && r["tool_call_id"] == *id),
                "I9: tool call {id} answered by {r:?}"
            );
            i += 1;
        }
    }
}

/// The tool calls and results of one LLM request body, in order: (is a result, id).
fn tool_pairs(provider: ProviderKind, body: &Value) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    match provider {
        ProviderKind::OpenAiChat => {
            for m in body["messages"].as_array().into_iter().flatten() {
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    out.push((false, s(&c["id"])));
                }
                if m["role"] == "tool" {
                    out.push((true, s(&m["tool_call_id"])));
                }
            }
        }
        ProviderKind::Anthropic => {
            for m in body["messages"].as_array().into_iter().flatten() {
                for c in m["content"].as_array().into_iter().flatten() {
                    match c["type"].as_str() {
                        Some("tool_use") => out.push((false, s(&c["id"]))),
                        Some("tool_result") => out.push((true, s(&c["tool_use_id"]))),
                        _ => {}
                    }
                }
            }
        }
        ProviderKind::OpenAiResponses => {
            for item in body["input"].as_array().into_iter().flatten() {
                match item["type"].as_str() {
                    Some("function_call") => out.push((false, s(&item["call_id"]))),
                    Some("function_call_output") => out.push((true, s(&item["call_id"]))),
                    _ => {}
                }
            }
        }
    }
    out
}

/// The tool names offered in an LLM request body (all three routes).
fn offered_tools(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            t["name"]
                .as_str()
                .or_else(|| t["function"]["name"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn checks() -> Invariants {
        Invariants::new(&crate::fuzzing::fuzz_config(ProviderKind::OpenAiChat))
    }

    fn client(c: &mut Invariants, line: &Value) {
        c.input(&Input::AcpBytes(format!("{line}\n").into_bytes()));
    }

    fn agent(c: &mut Invariants, line: &Value) {
        c.action(&Action::WriteAcp(format!("{line}\n")));
    }

    #[test]
    fn i7_i8_a_prompt_answered_once_with_its_updates_before_passes() {
        let mut c = checks();
        client(
            &mut c,
            &json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"s"}}),
        );
        // A line cut by EOF is no request; an unreadable line is answered with `id: null`.
        c.input(&Input::AcpBytes(
            b"not json\n{\"jsonrpc\":\"2.0\",\"id\":9".to_vec(),
        ));
        c.input(&Input::AcpEof);
        let update = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk"}}});
        agent(&mut c, &update);
        agent(
            &mut c,
            &json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}),
        );
        agent(
            &mut c,
            &json!({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}),
        );
        c.all_answered();
    }

    /// Checks that have seen the client send `session/list` with id 5.
    fn listed() -> Invariants {
        let mut c = checks();
        client(
            &mut c,
            &json!({"jsonrpc":"2.0","id":5,"method":"session/list","params":{}}),
        );
        c
    }

    #[test]
    #[should_panic(expected = "I7: request 5 answered 2 times")]
    fn i7_a_second_answer_panics() {
        let mut c = listed();
        for _ in 0..2 {
            agent(&mut c, &json!({"jsonrpc":"2.0","id":5,"result":{}}));
        }
    }

    #[test]
    #[should_panic(expected = "I7: every request answered exactly once")]
    fn i7_an_unanswered_request_panics_at_the_end() {
        listed().all_answered();
    }

    #[test]
    #[should_panic(expected = "I8: session/update for s with no prompt outstanding")]
    fn i8_a_turn_update_after_the_prompt_response_panics() {
        let mut c = checks();
        client(
            &mut c,
            &json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"s"}}),
        );
        agent(&mut c, &json!({"jsonrpc":"2.0","id":5,"result":{}}));
        // A session-level update is fine; a turn's is not.
        let update = |kind: &str| json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":kind}}});
        agent(&mut c, &update("available_commands_update"));
        agent(&mut c, &update("agent_message_chunk"));
    }

    #[test]
    #[should_panic(expected = "I1: 2 objections honoured with budget 1")]
    fn i1_more_objections_than_the_budget_panics() {
        let mut cfg = crate::fuzzing::fuzz_config(ProviderKind::OpenAiChat);
        cfg.stop_max_rejections = 1;
        let mut c = Invariants::new(&cfg);
        client(
            &mut c,
            &json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"s"}}),
        );
        agent(
            &mut c,
            &json!({"jsonrpc":"2.0","id":5,"result":{"_meta":{"buzz":{"stopObjections":2}}}}),
        );
    }

    #[test]
    fn i9_calls_and_results_pair_on_every_route_and_an_open_call_panics() {
        let chat = json!({"messages":[{"role":"assistant","tool_calls":[{"id":"c1"}]},{"role":"tool","tool_call_id":"c1"}]});
        let anthropic = json!({"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"c1"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1"}]}]});
        let responses = json!({"input":[{"type":"function_call","call_id":"c1"},{"type":"function_call_output","call_id":"c1"}]});
        llm_request(ProviderKind::OpenAiChat, &chat);
        llm_request(ProviderKind::Anthropic, &anthropic);
        llm_request(ProviderKind::OpenAiResponses, &responses);
        let open = json!({"input":[{"type":"function_call","call_id":"c1"}]});
        let caught = std::panic::catch_unwind(|| llm_request(ProviderKind::OpenAiResponses, &open));
        assert!(caught.is_err(), "an open call is an I9 violation");
        // Chat: results right after their calls, in call order.
        let swapped = json!({"messages":[{"role":"assistant","tool_calls":[{"id":"c1"},{"id":"c2"}]},
            {"role":"tool","tool_call_id":"c2"},{"role":"tool","tool_call_id":"c1"}]});
        let caught = std::panic::catch_unwind(|| llm_request(ProviderKind::OpenAiChat, &swapped));
        assert!(
            caught.is_err(),
            "results out of call order are an I9 violation"
        );
        let orphan = json!({"messages":[{"role":"tool","tool_call_id":"c9"}]});
        let caught = std::panic::catch_unwind(|| llm_request(ProviderKind::OpenAiChat, &orphan));
        assert!(
            caught.is_err(),
            "a result without its call is an I9 violation"
        );
    }

    #[test]
    #[should_panic(expected = "I10: the hook a___Stop was offered to the LLM")]
    fn i10_a_hook_offered_to_the_llm_panics() {
        llm_request(
            ProviderKind::OpenAiChat,
            &json!({"tools":[{"type":"function","function":{"name":"a___Stop"}}]}),
        );
    }

    #[test]
    #[should_panic(expected = "I10: a model call to the hook _Stop reached the server")]
    fn i10_a_hook_call_without_the_hook_meta_panics() {
        mcp_line(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"_Stop"}}"#);
    }

    #[test]
    #[should_panic(expected = "I11: after handle_timeout")]
    fn i11_a_timer_due_at_the_timeout_just_handled_panics() {
        let now = MonoTime::ZERO.plus_ms(10);
        Invariants::after_timeout(now, Some((now, TimerKey::Shutdown)));
    }
}
