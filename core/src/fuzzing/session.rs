//! The `session` fuzz target: an [`Agent`](crate::Agent) driven by an arbitrary timed script of
//! ACP, MCP and LLM inputs, in the core's one simulated world ([`super::world::World`], the
//! world of the core's own tests), with invariants checked after every step.
//!
//! The world plays every peer. MCP servers answer the handshake and `tools/list` at once (so
//! sessions start); everything else is held for the script ([`ServerSpec::held`],
//! [`LlmReply::Never`], no permission answers): which pending tool or hook call is answered and
//! how, which LLM call gets a text answer, tool calls, an error status, a cut body or raw bytes
//! (on the configured route), when time passes, what the client sends (prompts, cancels,
//! permission answers, raw bytes), when a server dies. The whole script runs twice and the two
//! runs must be the same steps (I12, [`Invariants::same_runs`]: actions compared whole, LLM
//! request bodies byte for byte).
//!
//! Checked after every step, by the world, as for every world-driven test: every frame parses
//! back (T1, L3b, [`super::check_action`]) and I1 and I7–I11 by [`Invariants`]: no request
//! answered twice and, after EOF and shutdown, every request answered exactly once (I7); a
//! turn's `session/update` only while a prompt of its session is outstanding (I8); tool calls
//! and results paired in every LLM request (I9); no hook offered to the LLM, every `_` call to
//! a server a hook call with `_meta` (I10); no busy loop after a timeout (I11); objections
//! within the budget (I1). I2–I6 (hook counters, rounds, fail-open, kills, late replies) need
//! the reference model of `core/tests/hooks_props.rs`, which checks them by property tests.

use super::invariants::Invariants;
use super::world::{LlmReply, ServerSpec, Step, World, llm_body};
use super::{Reader, fuzz_config, split};
use crate::config::{PermissionMode, ProviderKind};
use crate::io::{Input, LlmEvent};
use crate::time::MonoTime;
use serde_json::{Value, json};

pub use super::world::{chat_text_body, chat_tool_body};

/// The world of a script: servers `a` (`echo`, `_Stop`) and `b` (also `write`, destructive,
/// and `_PostCompact`), every call held; LLM calls and permission requests held.
fn world(cfg: crate::Config) -> World {
    let a = ServerSpec::new("a", &["_Stop"]).held();
    let b = ServerSpec::new("b", &["_Stop", "_PostCompact"])
        .tool_with("write", json!({"destructiveHint": true}))
        .held();
    let mut w = World::new(cfg, vec![a, b]);
    w.record = false;
    w.llm_default = LlmReply::Never;
    w.permission_delay_ms = None;
    w
}

/// Sends one request from the client and delivers what it causes now.
fn request(w: &mut World, method: &str, params: Value) {
    w.request(method, params);
    w.run_until(w.now);
}

/// Runs one script; returns every step and the time it finished at (for I12).
pub fn run(data: &[u8]) -> (Vec<Step>, MonoTime) {
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
    let n_servers = 1 + usize::from(r.u8() % 2);
    let mut w = world(cfg);
    request(&mut w, "initialize", json!({"protocolVersion": 1}));
    let servers = w.server_entries(n_servers);
    request(
        &mut w,
        "session/new",
        json!({"cwd": "/w", "mcpServers": servers}),
    );

    let mut ops = 0;
    while !r.is_empty() && ops < 400 && !w.agent.is_finished() {
        ops += 1;
        let op = r.u8() % 15;
        let arg = r.u8();
        let session = (!w.sessions.is_empty())
            .then(|| w.sessions[usize::from(arg) % w.sessions.len()].clone());
        match op {
            0 => w.advance(u64::from(arg) * 20),
            1 => {
                if let Some(sid) = session {
                    let text = String::from_utf8_lossy(r.take(usize::from(arg % 64))).into_owned();
                    request(
                        &mut w,
                        "session/prompt",
                        json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
                    );
                }
            }
            2 => {
                if let Some(sid) = session {
                    w.notify("session/cancel", json!({"sessionId": sid}));
                    w.run_until(w.now);
                }
            }
            3..=6 | 13 => {
                let Some(call) = w.held_llm.front().copied() else {
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
                    if !w.held_llm.contains(&call) {
                        break;
                    }
                    w.deliver_now(Input::Llm { call, event });
                }
                // The script answered it (or stopped mid-body: op 13 leaves it to a later op).
                if op != 13 {
                    w.held_llm.retain(|c| *c != call);
                }
            }
            7 => {
                let live = w.live_procs(true);
                let Some(&proc) = live.get(usize::from(arg) % live.len().max(1)) else {
                    continue;
                };
                let Some((id, name)) = w.take_held_call(proc) else {
                    continue;
                };
                let pick = r.u8();
                let kind = pick % 5;
                if pick & 0x80 != 0 {
                    // L3b: the reply's text holds a pair, a lone high and a lone low surrogate.
                    let line = format!(
                        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"\\ud83d\\ude00 \\ud83d \\udc00\"}}]}}}}\n"
                    );
                    w.deliver_now(Input::McpBytes {
                        proc,
                        bytes: line.into_bytes(),
                    });
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
                w.deliver_now(Input::McpBytes {
                    proc,
                    bytes: format!("{msg}\n").into_bytes(),
                });
            }
            8 => {
                let live = w.live_procs(false);
                if let Some(&proc) = live.get(usize::from(arg) % live.len().max(1)) {
                    w.exit_proc(proc, "exit status 3");
                }
            }
            9 => {
                let live = w.live_procs(false);
                let Some(&proc) = live.get(usize::from(arg) % live.len().max(1)) else {
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
                w.deliver_now(input);
            }
            10 => {
                let mut raw = r.take(usize::from(arg)).to_vec();
                raw.push(b'\n');
                w.send_acp_bytes(&raw);
                w.run_until(w.now);
            }
            11 => {
                let Some(id) = w.held_permissions.pop_front() else {
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
                w.send_acp_bytes(format!("{line}\n").as_bytes());
                w.run_until(w.now);
            }
            12 => {
                let servers = w.server_entries(1 + usize::from(arg % 2));
                request(
                    &mut w,
                    "session/new",
                    json!({"cwd": "/w", "mcpServers": servers}),
                );
            }
            _ => {
                let Some(sid) = session else { continue };
                request(
                    &mut w,
                    "session/set_model",
                    json!({"sessionId": sid, "modelId": "other"}),
                );
            }
        }
    }
    w.finish();
    (std::mem::take(&mut w.steps), w.now)
}

/// `session`: see the module docs. Input: a configuration byte (route, permission mode,
/// `_Stop` budget, reply guard, parallelism), the context window byte, the server count byte,
/// then operations (an op byte and an argument byte each, some reading more bytes).
pub fn session(data: &[u8]) {
    let (first, first_end) = run(data);
    let (second, second_end) = run(data);
    Invariants::same_runs((&first, first_end), (&second, second_end));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Action;

    /// The frames of a run, as text.
    fn lines(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .flat_map(|s| &s.actions)
            .filter_map(|a| {
                if let Action::WriteAcp(l) | Action::WriteMcp { line: l, .. } = a {
                    Some(l.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn a_script_drives_the_world_through_a_tool_call_a_stop_hook_and_an_answered_prompt() {
        let script = [
            8, 255, 1, // Chat, allow, a `_Stop` budget of 1; a large context; servers a and b
            1, 3, b'a', b'b', b'c', // prompt "abc"
            4, 0, 0, // the LLM asks for a__echo
            7, 0, 4, // its server answers "ok"
            3, 0, // the LLM answers "done"
            7, 0, 4, // one server's _Stop hook objects ("tests fail"), the other's times out
            0, 50, // time passes
            3, 0, // the LLM answers the objection
        ];
        let (steps, _) = run(&script);
        let lines = lines(&steps);
        let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
        assert!(
            has(r#""name":"echo""#),
            "the tool call reached its server: {lines:#?}"
        );
        assert!(
            has(r#""name":"_Stop""#),
            "the _Stop hook was called: {lines:#?}"
        );
        assert!(
            has(r#""stopObjections":1},"#) && has(r#""stopReason":"end_turn""#),
            "the prompt was answered after one objection: {lines:#?}"
        );
        session(&script);
    }
}
