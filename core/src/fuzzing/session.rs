//! The `session` fuzz target: an [`Agent`](crate::Agent) driven by an arbitrary timed script of
//! ACP, MCP and LLM inputs, with invariants checked after every step.
//!
//! The world plays every peer. MCP servers answer the handshake and `tools/list` at once (so
//! sessions start); everything else is the script's choice: which pending tool or hook call is
//! answered and how, which LLM call gets a text answer, tool calls, an error status, a cut body
//! or raw bytes, when time passes, what the client sends (prompts, cancels, permission answers,
//! raw bytes), when a server dies. The whole script runs twice and the two action transcripts
//! must be byte-identical (I12).
//!
//! Checked after every step: every frame parses back (T1, [`super::check_action`]), and I1 and
//! I7–I11 by [`super::invariants::Invariants`], the same checks the core's simulated world
//! (`core/tests/support`) runs: no request answered twice and, after EOF and shutdown, every
//! request answered exactly once (I7); a turn's `session/update` only while a prompt of its
//! session is outstanding (I8); tool calls and results paired in every LLM request (I9); no
//! hook offered to the LLM, every `_` call to a server a hook call with `_meta` (I10); no busy
//! loop after a timeout (I11); objections within the budget (I1). I2–I6 (hook counters, rounds,
//! fail-open, kills, late replies) need the reference model of `core/tests/hooks_props.rs`,
//! which checks them by property tests.

use super::invariants::Invariants;
use super::{Driver, React, Reader, fuzz_config, split};
use crate::config::{PermissionMode, ProviderKind};
use crate::io::{Action, Input, LlmCallId, LlmEvent, ProcKey};
use crate::jsonrpc::{self, Message};
use crate::time::MonoTime;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};

/// A Chat Completions SSE body with one text delta and `finish_reason: stop`.
#[must_use]
pub fn chat_text_body(text: &str) -> Vec<u8> {
    let d = json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    let f = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}});
    format!("data: {d}\n\ndata: {f}\n\ndata: [DONE]\n\n").into_bytes()
}

/// A Chat Completions SSE body asking for `calls` (`(id, name, arguments)`).
#[must_use]
pub fn chat_tool_body(calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut s = String::new();
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let d = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": id,
            "type": "function", "function": {"name": name, "arguments": args}}]}, "finish_reason": null}]});
        s.push_str(&format!("data: {d}\n\n"));
    }
    let f = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]});
    s.push_str(&format!("data: {f}\n\ndata: [DONE]\n\n"));
    s.into_bytes()
}

fn anthropic_body(text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut s = String::new();
    let mut ev = |name: &str, v: Value| s.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
            "content": [], "usage": {"input_tokens": 50, "output_tokens": 1}}}),
    );
    let mut index = 0;
    if !text.is_empty() {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        );
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        );
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        );
        index = 1;
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let at = index + i;
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": at, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        );
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": at, "delta": {"type": "input_json_delta", "partial_json": args}}),
        );
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": at}),
        );
    }
    let stop = if calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}),
    );
    ev("message_stop", json!({"type": "message_stop"}));
    s.into_bytes()
}

fn responses_body(text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    let mut s = String::new();
    let mut ev = |v: Value| {
        let name = v["type"].as_str().unwrap_or("").to_owned();
        s.push_str(&format!("event: {name}\ndata: {v}\n\n"));
    };
    let mut output = Vec::new();
    if !text.is_empty() {
        ev(
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text}),
        );
        output.push(json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}));
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let item = json!({"id": format!("fc_{i}"), "type": "function_call", "arguments": args, "call_id": id, "name": name});
        ev(
            json!({"type": "response.output_item.added", "output_index": i + 1, "item": {"id": format!("fc_{i}"), "type": "function_call", "arguments": "", "call_id": id, "name": name}}),
        );
        ev(
            json!({"type": "response.function_call_arguments.delta", "item_id": format!("fc_{i}"), "output_index": i + 1, "delta": args}),
        );
        ev(json!({"type": "response.output_item.done", "output_index": i + 1, "item": item}));
        output.push(item);
    }
    ev(
        json!({"type": "response.completed", "response": {"id": "r", "status": "completed", "output": output,
        "usage": {"input_tokens": 50, "output_tokens": 5}}}),
    );
    s.into_bytes()
}

/// A successful response body for `route`: text, or tool calls when `calls` is not empty.
fn llm_body(provider: &ProviderKind, text: &str, calls: &[(&str, &str, &str)]) -> Vec<u8> {
    match provider {
        ProviderKind::OpenAiChat if calls.is_empty() => chat_text_body(text),
        ProviderKind::OpenAiChat => chat_tool_body(calls),
        ProviderKind::Anthropic => anthropic_body(text, calls),
        ProviderKind::OpenAiResponses => responses_body(text, calls),
    }
}

/// One fake MCP server process.
struct FakeServer {
    name: String,
    alive: bool,
    /// Pending `tools/call` requests: (id, tool name).
    calls: VecDeque<(Value, String)>,
}

/// The world's state between steps.
struct World {
    /// I1 and I7–I11 (the checks the core's simulated world runs too).
    checks: Invariants,
    servers: BTreeMap<ProcKey, FakeServer>,
    /// LLM calls not answered, not released.
    llm: VecDeque<LlmCallId>,
    /// The agent's requests to the client (`session/request_permission`), by id.
    permission: VecDeque<Value>,
    /// Session ids created.
    sessions: Vec<String>,
    /// `session/new` request ids not answered yet.
    new_session_ids: Vec<String>,
    next_id: u64,
    /// Every action, in order (I12: compared whole, LLM request bodies byte for byte).
    transcript: Vec<Action>,
}

/// A tool `name` of a server: hooks start with `_`.
fn server_tools(name: &str) -> Value {
    let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
    let mut tools = vec![json!({"name": "echo", "description": "echo", "inputSchema": schema})];
    tools.push(json!({"name": "_Stop", "description": "hook", "inputSchema": {"type": "object"}}));
    if name == "b" {
        tools.push(
            json!({"name": "_PostCompact", "description": "hook", "inputSchema": {"type": "object"}}),
        );
        tools.push(
            json!({"name": "write", "description": "writes", "inputSchema": schema,
            "annotations": {"destructiveHint": true}}),
        );
    }
    Value::Array(tools)
}

impl World {
    fn key(id: &Value) -> String {
        id.to_string()
    }

    /// Registers client bytes with the checks, and the `session/new` requests among them.
    fn note_client_bytes(&mut self, bytes: &[u8], max: usize) {
        self.checks.input(&Input::AcpBytes(bytes.to_vec()));
        for line in bytes.split(|&b| b == b'\n') {
            if line.len() > max {
                continue;
            }
            if let Ok(Message::Request { id, method, .. }) = jsonrpc::parse_message(line)
                && method == "session/new"
            {
                self.new_session_ids.push(Self::key(&id.to_value()));
            }
        }
    }

    /// Reacts to one action (`json`: its frame or LLM body, parsed by the driver's checks):
    /// the OS and the servers' automatic answers, bookkeeping, checks.
    fn react(&mut self, a: &Action, json: Option<&Value>, q: &mut VecDeque<Input>) {
        self.transcript.push(a.clone());
        self.checks.action_json(a, json);
        // No other action needs an answer: no HTTP server answers (the scripted sessions name
        // stdio servers only) and the fuzz agents keep no sessions on disk.
        if let (Action::WriteAcp(_), Some(v)) = (a, json) {
            self.on_acp(v);
        } else if let (Action::WriteMcp { proc, .. }, Some(v)) = (a, json) {
            self.on_mcp(*proc, v, q);
        } else if let Action::SpawnMcp { proc, spec } = a {
            let server = FakeServer {
                name: spec.name.clone(),
                alive: true,
                calls: VecDeque::new(),
            };
            self.servers.insert(*proc, server);
            q.push_back(Input::McpSpawned { proc: *proc });
        } else if let Action::SignalProcessGroup { proc, .. } | Action::CloseMcpStdin { proc } = a
            && let Some(s) = self.servers.get_mut(proc).filter(|s| s.alive)
        {
            s.alive = false;
            s.calls.clear();
            q.push_back(Input::McpStdoutClosed { proc: *proc });
            let status = "killed by signal 15".into();
            q.push_back(Input::McpExited {
                proc: *proc,
                status,
            });
        } else if let Action::CallLlm { call, .. } = a {
            self.llm.push_back(*call);
        } else if let Action::CancelLlm { call } = a {
            self.llm.retain(|c| c != call);
        }
    }

    fn on_acp(&mut self, v: &Value) {
        match (v.get("id"), v.get("method").and_then(Value::as_str)) {
            (Some(id), Some("session/request_permission")) => {
                self.permission.push_back(id.clone());
            }
            (Some(_), Some(_)) | (None, _) => {}
            (Some(id), None) => {
                let key = Self::key(id);
                if let Some(at) = self.new_session_ids.iter().position(|k| *k == key) {
                    self.new_session_ids.remove(at);
                    if let Some(sid) = v["result"]["sessionId"].as_str() {
                        self.sessions.push(sid.to_owned());
                    }
                }
            }
        }
    }

    fn on_mcp(&mut self, proc: ProcKey, v: &Value, q: &mut VecDeque<Input>) {
        let Some(server) = self.servers.get_mut(&proc).filter(|s| s.alive) else {
            return;
        };
        let (Some(id), Some(method)) = (v.get("id"), v.get("method").and_then(Value::as_str))
        else {
            return;
        };
        let reply = |result: Value| {
            let bytes = format!(
                "{}\n",
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            );
            Input::McpBytes {
                proc,
                bytes: bytes.into_bytes(),
            }
        };
        match method {
            "initialize" => q.push_back(reply(json!({"protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}}, "serverInfo": {"name": server.name, "version": "1"}}))),
            "tools/list" => q.push_back(reply(json!({"tools": server_tools(&server.name)}))),
            "tools/call" => {
                let name = v["params"]["name"].as_str().unwrap_or("").to_owned();
                server.calls.push_back((id.clone(), name));
            }
            _ => q.push_back(Input::McpBytes {
                proc,
                bytes: format!(
                    "{}\n",
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}})
                )
                .into_bytes(),
            }),
        }
    }

    /// The `k`-th live server with a pending call (or any live server when none has one).
    fn pick_server(&self, k: u8, with_call: bool) -> Option<ProcKey> {
        let live: Vec<ProcKey> = self
            .servers
            .iter()
            .filter(|(_, s)| s.alive && (!with_call || !s.calls.is_empty()))
            .map(|(p, _)| *p)
            .collect();
        if live.is_empty() {
            return None;
        }
        live.get(usize::from(k) % live.len()).copied()
    }
}

/// Runs one script; returns every action and the time it finished at (for I12).
pub fn run(data: &[u8]) -> (Vec<Action>, MonoTime) {
    let mut r = Reader::new(data);
    let c = r.u8();
    // Any route of the one list (a new route is fuzzed without a change here).
    let provider = ProviderKind::ALL[usize::from(c) % ProviderKind::ALL.len()];
    let mut cfg = fuzz_config(provider);
    // Debug logs: the formatting paths run, without trace-level cost on every step.
    cfg.log_level = crate::config::LogLevel::Debug;
    cfg.permission = if c & 4 != 0 {
        PermissionMode::Ask
    } else {
        PermissionMode::Allow
    };
    cfg.stop_max_rejections = u32::from((c >> 3) % 4);
    cfg.require_reply = c & 0x20 != 0;
    cfg.max_parallel_tools = if c & 0x40 != 0 { 1 } else { 4 };
    cfg.hook_timeout_ms = 300;
    cfg.tool_timeout_ms = 2000;
    cfg.llm_timeout_ms = 3000;
    cfg.mcp_init_timeout_ms = 1000;
    cfg.permission_timeout_ms = 1500;
    cfg.llm_max_attempts = 2;
    cfg.max_output_tokens = 64;
    cfg.max_context_tokens = 400 + u64::from(r.u8()) * 16;
    cfg.max_line_bytes = 4096;
    cfg.max_tool_result_text_bytes = 1024;
    let max_line = cfg.max_line_bytes;
    let n_servers = 1 + usize::from(r.u8() % 2);
    let mut world = World {
        checks: Invariants::new(&cfg),
        servers: BTreeMap::new(),
        llm: VecDeque::new(),
        permission: VecDeque::new(),
        sessions: Vec::new(),
        new_session_ids: Vec::new(),
        next_id: 1,
        transcript: Vec::new(),
    };
    let mut d = Driver::new(cfg);
    let world = std::cell::RefCell::new(&mut world);
    let mut react = |a: &Action, json: Option<&Value>, q: &mut VecDeque<Input>| {
        world.borrow_mut().react(a, json, q);
    };

    let send = |d: &mut Driver, react: &mut React<'_>, bytes: Vec<u8>| {
        world.borrow_mut().note_client_bytes(&bytes, max_line);
        d.feed(Input::AcpBytes(bytes), react);
        d.settle(20_000, react);
    };
    let request = |d: &mut Driver, react: &mut React<'_>, method: &str, params: Value| {
        let id = {
            let mut w = world.borrow_mut();
            w.next_id += 1;
            w.next_id
        };
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        send(d, react, format!("{line}\n").into_bytes());
    };
    let servers: Vec<Value> = ["a", "b"]
        .iter()
        .take(n_servers)
        .map(|n| json!({"name": n, "command": "fake-mcp"}))
        .collect();
    request(
        &mut d,
        &mut react,
        "initialize",
        json!({"protocolVersion": 1}),
    );
    request(
        &mut d,
        &mut react,
        "session/new",
        json!({"cwd": "/w", "mcpServers": servers}),
    );

    let mut ops = 0;
    while !r.is_empty() && ops < 400 && !d.agent.is_finished() {
        ops += 1;
        let op = r.u8() % 15;
        let arg = r.u8();
        let session = {
            let w = world.borrow();
            (!w.sessions.is_empty())
                .then(|| w.sessions[usize::from(arg) % w.sessions.len()].clone())
        };
        match op {
            0 => {
                let target = d.now.plus_ms(u64::from(arg) * 20);
                while d.agent.poll_timeout().is_some_and(|(t, _)| t <= target) {
                    d.fire_next_timer(&mut react);
                    d.settle(20_000, &mut react);
                }
                if target > d.now {
                    d.now = target;
                }
            }
            1 => {
                if let Some(sid) = session {
                    let text = String::from_utf8_lossy(r.take(usize::from(arg % 64))).into_owned();
                    request(
                        &mut d,
                        &mut react,
                        "session/prompt",
                        json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
                    );
                }
            }
            2 => {
                if let Some(sid) = session {
                    let line = json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}});
                    send(&mut d, &mut react, format!("{line}\n").into_bytes());
                }
            }
            3..=6 | 13 => {
                let Some(call) = world.borrow().llm.front().copied() else {
                    continue;
                };
                let events: Vec<LlmEvent> = match op {
                    3 => {
                        let text = ["done", "", "x y z", "é🐝"][usize::from(arg % 4)];
                        let body = llm_body(&provider, text, &[]);
                        let cuts = [usize::from(arg)];
                        let mut ev = vec![LlmEvent::Head {
                            status: 200,
                            headers: Vec::new(),
                        }];
                        ev.extend(
                            split(&body, &cuts)
                                .into_iter()
                                .map(|c| LlmEvent::Body(c.to_vec())),
                        );
                        ev.push(LlmEvent::End);
                        ev
                    }
                    4 => {
                        let names = [
                            "a__echo", "b__echo", "b__write", "a___Stop", "zz__nope", "a__echo",
                        ];
                        let n = 1 + usize::from(arg % 3);
                        let owned: Vec<(String, String, String)> = (0..n)
                            .map(|i| {
                                let pick = r.u8();
                                let name = names[usize::from(pick) % names.len()];
                                let args = if pick & 0x80 != 0 {
                                    "{bad"
                                } else if pick & 0x40 != 0 {
                                    // L3b: a model cutting text inside a surrogate pair.
                                    "{\"text\":\"cut \\ud83d\"}"
                                } else {
                                    "{\"text\":\"t\"}"
                                };
                                (
                                    format!("call_{}_{i}", call.0),
                                    name.to_owned(),
                                    args.to_owned(),
                                )
                            })
                            .collect();
                        let calls: Vec<(&str, &str, &str)> = owned
                            .iter()
                            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
                            .collect();
                        vec![
                            LlmEvent::Head {
                                status: 200,
                                headers: Vec::new(),
                            },
                            LlmEvent::Body(llm_body(&provider, "", &calls)),
                            LlmEvent::End,
                        ]
                    }
                    5 => {
                        let (status, body) = [
                            (429, "{\"error\":{\"message\":\"slow down\"}}"),
                            (500, "oops"),
                            (400, "{\"error\":{\"code\":\"context_length_exceeded\"}}"),
                            (401, "bad key"),
                            (529, "overloaded"),
                        ][usize::from(arg % 5)];
                        let headers = if arg & 0x10 != 0 {
                            vec![("retry-after".to_owned(), "1".to_owned())]
                        } else {
                            Vec::new()
                        };
                        vec![
                            LlmEvent::Head { status, headers },
                            LlmEvent::Body(body.as_bytes().to_vec()),
                            LlmEvent::End,
                        ]
                    }
                    6 => {
                        let body = llm_body(&provider, "partial", &[]);
                        let cut = usize::from(arg) % (body.len() + 1);
                        vec![
                            LlmEvent::Head {
                                status: 200,
                                headers: Vec::new(),
                            },
                            LlmEvent::Body(body[..cut].to_vec()),
                            LlmEvent::Failed("connection reset".into()),
                        ]
                    }
                    _ => {
                        let raw = r.take(usize::from(arg)).to_vec();
                        vec![
                            LlmEvent::Head {
                                status: 200,
                                headers: Vec::new(),
                            },
                            LlmEvent::Body(raw),
                        ]
                    }
                };
                for event in events {
                    if !world.borrow().llm.contains(&call) {
                        break;
                    }
                    d.feed(Input::Llm { call, event }, &mut react);
                    d.settle(20_000, &mut react);
                }
                if let Some(w) = world.borrow_mut().llm.iter().position(|c| *c == call) {
                    // The script answered it (or stopped mid-body); the next op moves on.
                    if op != 13 {
                        world.borrow_mut().llm.remove(w);
                    }
                }
            }
            7 => {
                let Some(proc) = world.borrow().pick_server(arg, true) else {
                    continue;
                };
                let Some((id, name)) = world
                    .borrow_mut()
                    .servers
                    .get_mut(&proc)
                    .and_then(|s| s.calls.pop_front())
                else {
                    continue;
                };
                let pick = r.u8();
                let kind = pick % 5;
                if pick & 0x80 != 0 {
                    // L3b: the reply's text holds a pair, a lone high and a lone low surrogate.
                    let line = format!(
                        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"\\ud83d\\ude00 \\ud83d \\udc00\"}}]}}}}\n"
                    );
                    d.feed(
                        Input::McpBytes {
                            proc,
                            bytes: line.into_bytes(),
                        },
                        &mut react,
                    );
                    d.settle(20_000, &mut react);
                    continue;
                }
                let msg = match (name.starts_with('_'), kind) {
                    (_, 0) => {
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "crashed"}})
                    }
                    (_, 1) => {
                        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "bad"}], "isError": true}})
                    }
                    (true, 2) => {
                        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": " "}]}})
                    }
                    (true, _) => {
                        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "tests fail"}]}})
                    }
                    (false, _) => {
                        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "ok"}]}})
                    }
                };
                d.feed(
                    Input::McpBytes {
                        proc,
                        bytes: format!("{msg}\n").into_bytes(),
                    },
                    &mut react,
                );
                d.settle(20_000, &mut react);
            }
            8 => {
                let Some(proc) = world.borrow().pick_server(arg, false) else {
                    continue;
                };
                if let Some(s) = world.borrow_mut().servers.get_mut(&proc) {
                    s.alive = false;
                    s.calls.clear();
                }
                d.feed(Input::McpStdoutClosed { proc }, &mut react);
                d.feed(
                    Input::McpExited {
                        proc,
                        status: "exit status 3".into(),
                    },
                    &mut react,
                );
                d.settle(20_000, &mut react);
            }
            9 => {
                let Some(proc) = world.borrow().pick_server(arg, false) else {
                    continue;
                };
                let len = usize::from(r.u8() % 128);
                let raw = r.take(len).to_vec();
                let input = if arg & 1 == 0 {
                    Input::McpBytes { proc, bytes: raw }
                } else {
                    Input::McpStderrLine {
                        proc,
                        line: String::from_utf8_lossy(&raw).into_owned(),
                    }
                };
                d.feed(input, &mut react);
                d.settle(20_000, &mut react);
            }
            10 => {
                let mut raw = r.take(usize::from(arg)).to_vec();
                raw.push(b'\n');
                send(&mut d, &mut react, raw);
            }
            11 => {
                let Some(id) = world.borrow_mut().permission.pop_front() else {
                    continue;
                };
                let outcome = match arg % 5 {
                    0 => json!({"outcome": "selected", "optionId": "allow_once"}),
                    1 => json!({"outcome": "selected", "optionId": "allow_always"}),
                    2 => json!({"outcome": "selected", "optionId": "reject_once"}),
                    3 => json!({"outcome": "cancelled"}),
                    _ => json!({"outcome": "selected", "optionId": "reject_always"}),
                };
                let line = json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": outcome}});
                send(&mut d, &mut react, format!("{line}\n").into_bytes());
            }
            12 => {
                let servers: Vec<Value> = ["a", "b"]
                    .iter()
                    .take(1 + usize::from(arg % 2))
                    .map(|n| json!({"name": n, "command": "fake-mcp"}))
                    .collect();
                request(
                    &mut d,
                    &mut react,
                    "session/new",
                    json!({"cwd": "/w", "mcpServers": servers}),
                );
            }
            _ => {
                let Some(sid) = session else { continue };
                request(
                    &mut d,
                    &mut react,
                    "session/set_model",
                    json!({"sessionId": sid, "modelId": "other"}),
                );
            }
        }
    }
    world.borrow_mut().checks.input(&Input::AcpEof);
    d.shut_down(200_000, &mut react);
    let mut w = world.borrow_mut();
    w.checks.all_answered();
    (std::mem::take(&mut w.transcript), d.now)
}

/// `session`: see the module docs. Input: a configuration byte (route, permission mode,
/// `_Stop` budget, reply guard, parallelism), the context window byte, the server count byte,
/// then operations (an op byte and an argument byte each, some reading more bytes).
pub fn session(data: &[u8]) {
    let (first, first_end) = run(data);
    let (second, second_end) = run(data);
    if let Some(at) = (0..first.len().max(second.len())).find(|&i| first.get(i) != second.get(i)) {
        panic!(
            "I12: the same script gave a different transcript at action {at}: {:?} then {:?}",
            first.get(at),
            second.get(at)
        );
    }
    assert_eq!(
        first_end, second_end,
        "I12: the same script finished at another time"
    );
}
