//! Fuzz target bodies (DESIGN "Testing pyramid", layer 4), compiled only with the `fuzzing`
//! feature: `fuzz/` (cargo-fuzz, nightly) calls them on generated inputs, and the core's test
//! `tests/fuzz_corpus.rs` (stable `cargo test`) replays every committed corpus file and crash
//! reproducer through them. Each body takes arbitrary bytes, never panics on its own, and panics
//! (the fuzzer's "crash") only when a property of the code under test is violated.
//!
//! | target | body | checks |
//! |---|---|---|
//! | `line_codec` | [`line_codec`] | JSON-RPC line codec under arbitrary splits and caps: same events for any split, lines within the cap, over-long lines carry the id the parser reads; parser and id scanner agree |
//! | `acp_input` | [`acp_input`] | arbitrary bytes as ACP input to a fresh `Agent`: no panic, every `WriteAcp` is one line that parses as one JSON-RPC message, every request answered exactly once, the agent exits after EOF |
//! | `mcp_output` | [`mcp_output`] | arbitrary bytes as an MCP server's stdout and stderr around a session, a prompt and a tool call: every line written parses, each ACP request answered once, the agent exits after EOF |
//! | `sse_chat`, `sse_anthropic`, `sse_responses` | [`sse_decoder`] | each route's stream decoder: the same deltas and response (or error) for any split of the body, sticky errors, one hand-out |
//! | `config_env` | [`config_env`] | `Config::from_env_map` on arbitrary maps: no panic; an accepted configuration is consistent and starts an `Agent` |
//! | `session` | [`session::session`] | an `Agent` driven by an arbitrary timed script of ACP, MCP and LLM inputs, with I1 and I7–I12 checked after every step |
//!
//! [`world`] is the core's one simulated world (virtual clock, every peer played in memory),
//! driven by the `session` target and by the core's own integration tests (`core/tests/support`
//! re-exports it); [`invariants`] holds the checks both run.
#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a fuzz body reports a violated property by panicking"
)]

pub mod invariants;
pub mod session;
pub mod world;

use crate::Agent;
use crate::config::{Config, LogLevel, PermissionMode, ProviderKind};
use crate::io::{Action, Input, StderrLines};
use crate::jsonrpc::{self, IdScanner, LineBuffer, LineEvent, Message, ParseError, RpcId};
use crate::llm::{StreamDecoder, StreamDelta};
use crate::time::MonoTime;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Reads a fuzz input front to back: small numbers for the harness's choices, then the rest.
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `data`.
    #[must_use]
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data }
    }

    /// The next byte, `0` when the input is used up.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes as a little-endian `u16` (zeros past the end).
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// Up to `n` next bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    /// Whether the input is used up.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// A split plan: a count (0..=15) then that many `u16` cut offsets.
    pub fn cuts(&mut self) -> Vec<usize> {
        let n = self.u8() % 16;
        (0..n).map(|_| usize::from(self.u16())).collect()
    }
}

/// `data` cut at `cuts` (offsets taken modulo `data.len() + 1`, sorted).
#[must_use]
pub fn split<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for p in points {
        out.push(data.get(start..p).unwrap_or_default());
        start = p;
    }
    out.push(data.get(start..).unwrap_or_default());
    out
}

// ------------------------------------------------------------------------------ line codec

/// Events of one buffer fed `chunks`, plus what EOF reports.
fn line_events(max: usize, recovering: bool, chunks: &[&[u8]]) -> (Vec<LineEvent>, Option<usize>) {
    let mut buf = if recovering {
        LineBuffer::recovering_ids(max)
    } else {
        LineBuffer::new(max)
    };
    let mut out = Vec::new();
    for c in chunks {
        buf.push(c, &mut out);
        assert!(buf.pending_bytes() <= max, "T3: held more than the cap");
    }
    let tail = buf.finish_into(&mut out);
    (out, tail)
}

/// The id the parser reads from a whole line, when the id scanner must agree: the line parses
/// as a JSON-RPC request (or an invalid message with a readable id) and has no `\` (an escaped
/// member name is never taken for `id` by the scanner).
fn parser_id(line: &[u8]) -> Option<Option<RpcId>> {
    if line.contains(&b'\\') {
        return None;
    }
    match jsonrpc::parse_message(line) {
        Ok(Message::Request { id, .. }) => Some(Some(id)),
        Ok(Message::Response { id, .. }) => Some(RpcId::from_value(&id)),
        Ok(Message::Notification { .. }) => Some(None),
        Err(ParseError::Invalid { id, .. }) => {
            // Only objects carry ids; `[…]` and scalars give `None` on both sides.
            Some(id)
        }
        Err(ParseError::NotJson) => None,
    }
}

/// `line_codec`: the JSON-RPC line codec under arbitrary splits and caps (SPEC T1, T3, T7,
/// C16, C50).
///
/// Input: cap byte (cap 1..=64), split plan ([`Reader::cuts`]), then the stream.
pub fn line_codec(data: &[u8]) {
    let mut r = Reader::new(data);
    let max = 1 + usize::from(r.u8() % 64);
    let cuts = r.cuts();
    let stream = r.rest();
    let chunks = split(stream, &cuts);
    for recovering in [false, true] {
        let whole = line_events(max, recovering, &[stream]);
        assert_eq!(
            line_events(max, recovering, &chunks),
            whole,
            "C16: events depend on the split"
        );
        if stream.len() <= 512 {
            let singles: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(
                line_events(max, recovering, &singles),
                whole,
                "byte by byte"
            );
        }
        for ev in &whole.0 {
            match ev {
                LineEvent::Line(l) => {
                    assert!(l.len() <= max && !l.contains(&b'\n'), "T1/T3: bad line");
                    assert!(
                        !l.iter().all(u8::is_ascii_whitespace),
                        "T1: blank line emitted"
                    );
                    check_line(l);
                }
                LineEvent::TooLong { bytes, id } => {
                    assert_eq!(*bytes, max + 1);
                    if !recovering {
                        assert!(id.is_none());
                    }
                }
            }
        }
    }
    // Over-long lines: the id recovered equals what the parser reads from the whole line.
    let (events, _) = line_events(max, true, &[stream]);
    let mut too_long = events.iter().filter_map(|e| match e {
        LineEvent::TooLong { id, .. } => Some(id.clone()),
        LineEvent::Line(_) => None,
    });
    for raw in stream.split(|&b| b == b'\n') {
        if raw.len() > max {
            let got = too_long.next().expect("an over-long line was not reported");
            if let Some(want) = parser_id(raw) {
                assert_eq!(got, want, "C50: recovered id differs from the parser's");
            }
        }
    }
}

/// Properties of one complete line: the parser never panics, the id scanner agrees with it,
/// an answer echoing the id parses back with the same id (T5) and is strict JSON; the lossy
/// JSON decoder gives what the strict one gives on strict JSON, and what it decodes from
/// anything else serialises back to strict JSON with no lone surrogate escape (L3b, L9).
fn check_line(line: &[u8]) {
    let strict = serde_json::from_slice::<Value>(line).ok();
    let lossy = crate::json::parse_bytes_lossy(line).ok();
    if strict.is_some() {
        assert_eq!(lossy, strict, "L9: the lossy decoder changed strict JSON");
    }
    if let Some(v) = &lossy {
        let back = v.to_string();
        assert!(
            serde_json::from_str::<Value>(&back).is_ok() && !has_lone_surrogate_escape(&back),
            "L3b: a decoded value does not serialise to strict JSON: {back}"
        );
    }
    let mut scan = IdScanner::new();
    scan.feed(line);
    let scanned = scan.into_id();
    if let Some(want) = parser_id(line) {
        assert_eq!(scanned, want, "id scanner and parser disagree");
    }
    if let Ok(Message::Request { id, .. }) = jsonrpc::parse_message(line) {
        let answer = jsonrpc::encode_result(&id, &Value::Null);
        assert!(
            serde_json::from_str::<Value>(&answer).is_ok(),
            "L3b: the answer is not strict JSON: {answer}"
        );
        match jsonrpc::parse_message(answer.as_bytes()) {
            Ok(Message::Response { id: back, .. }) => assert_eq!(back, id.to_value()),
            other => panic!("T5: echoed answer does not parse back: {other:?}"),
        }
    }
}

// ------------------------------------------------------------------------------ agents

/// A configuration for the agent targets: Chat route, hooks on for every server, debug logs
/// (so the logging paths run too), a fixed seed.
#[must_use]
pub fn fuzz_config(provider: ProviderKind) -> Config {
    let mut c = Config::for_tests(provider, "http://llm.test/v1");
    c.hook_servers = crate::config::HookAllowlist::All;
    c.permission = PermissionMode::Allow;
    c.log_level = LogLevel::Trace;
    c.seed = 7;
    c
}

/// Whether a JSON text holds a `\uD800`–`\uDFFF` escape that is not half of a pair (SPEC
/// L3b): what a strict peer rejects. Escapes are read whole, so `\\ud800` is not one.
#[must_use]
pub fn has_lone_surrogate_escape(text: &str) -> bool {
    let b = text.as_bytes();
    let hex = |at: usize| {
        b.get(at..at + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u16::from_str_radix(h, 16).ok())
    };
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        match hex(i + 2) {
            Some(0xD800..=0xDBFF) => {
                let low = b.get(i + 6) == Some(&b'\\')
                    && b.get(i + 7) == Some(&b'u')
                    && matches!(hex(i + 8), Some(0xDC00..=0xDFFF));
                if !low {
                    return true;
                }
                i += 12;
            }
            Some(0xDC00..=0xDFFF) => return true,
            Some(_) | None => i += 2,
        }
    }
    false
}

/// The `arguments` texts of the assistant tool calls in an LLM request body (Chat
/// `tool_calls[].function.arguments`, Responses `function_call.arguments`; Anthropic sends
/// `input` objects, which are JSON values already).
fn replayed_arguments(body: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            out.extend(c["function"]["arguments"].as_str());
        }
    }
    for item in body["input"].as_array().into_iter().flatten() {
        if item["type"] == "function_call" {
            out.extend(item["arguments"].as_str());
        }
    }
    out
}

/// Every action one step produced, checked for the properties that hold for every action:
/// `WriteAcp` and `WriteMcp` are one line (T1) of strict JSON (no lone surrogate escape, L3b)
/// that parses as one JSON-RPC message, and so is the body of an MCP `POST` (SPEC M10); an LLM
/// request body is strict JSON and replays no tool-call arguments holding a lone surrogate
/// escape (L3b). Returns the JSON of a frame or of an LLM request body, parsed once here for
/// the checks that follow ([`React`]).
pub fn check_action(a: &Action) -> Option<Value> {
    let line = if let Action::WriteAcp(l) | Action::WriteMcp { line: l, .. } = a {
        l
    } else {
        if let Action::CallLlm { request, .. } = a {
            let body: Value = serde_json::from_slice(&request.body.to_vec())
                .unwrap_or_else(|e| panic!("L3b: an LLM request body is not strict JSON: {e}"));
            for args in replayed_arguments(&body) {
                assert!(
                    !has_lone_surrogate_escape(args),
                    "L3b: replayed arguments hold a lone surrogate escape: {args:?}"
                );
            }
            return Some(body);
        } else if let Action::Http { request, .. } = a
            && request.method == crate::http::Method::Post
        {
            let body = request.body.to_vec();
            if let Err(e) = jsonrpc::parse_message(&body) {
                panic!(
                    "an MCP message we post does not parse back ({e}): {}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
        // The other actions carry no frame.
        return None;
    };
    let body = line
        .strip_suffix('\n')
        .expect("T1: a frame ends with a newline");
    assert!(!body.contains('\n'), "T1: a frame is one line: {line:?}");
    // serde_json's own parser is strict: a lone surrogate escape is an error.
    let value = serde_json::from_str::<Value>(body)
        .unwrap_or_else(|e| panic!("L3b: a frame we wrote is not strict JSON ({e}): {line}"));
    if let Err(e) = jsonrpc::parse_message(body.as_bytes()) {
        panic!("a frame we wrote does not parse back ({e}): {line}");
    }
    Some(value)
}

/// What a driver hands each action to, with the JSON [`check_action`] parsed from it (a frame
/// or an LLM request body): the world's reaction, which may queue inputs.
pub type React<'a> =
    dyn FnMut(&Action, Option<&Value>, &mut std::collections::VecDeque<Input>) + 'a;

/// The id of a response frame (as JSON text) from its parsed JSON, `None` for requests and
/// notifications (the frame parsed as one JSON-RPC message, [`check_action`]).
fn response_id(frame: &Value) -> Option<String> {
    if frame.get("method").is_some() {
        return None;
    }
    frame.get("id").map(Value::to_string)
}

/// What the client's input asks to be answered: per id (JSON text, `null` for unreadable
/// ids), the number of answers due (T3, T4, I7).
fn expected_answers(max: usize, input: &[u8]) -> BTreeMap<String, usize> {
    let (events, _) = line_events(max, true, &[input]);
    let mut due: BTreeMap<String, usize> = BTreeMap::new();
    let mut add = |id: Option<&RpcId>| {
        let key = id.map_or_else(|| "null".to_owned(), |i| i.to_value().to_string());
        *due.entry(key).or_default() += 1;
    };
    for ev in &events {
        match ev {
            LineEvent::TooLong { id, .. } => add(id.as_ref()),
            LineEvent::Line(l) => match jsonrpc::parse_message(l) {
                Ok(Message::Request { id, .. }) => add(Some(&id)),
                Ok(Message::Notification { .. } | Message::Response { .. }) => {}
                Err(ParseError::Invalid { id, .. }) => add(id.as_ref()),
                Err(ParseError::NotJson) => add(None),
            },
        }
    }
    due
}

/// Drives an agent: feeds inputs, drains actions through `react`, runs timers; records the
/// responses written and checks I11 after every timeout.
pub struct Driver {
    /// The agent under test.
    pub agent: Agent,
    /// The current (virtual) time.
    pub now: MonoTime,
    /// Responses written on ACP, by id (JSON text).
    pub answered: BTreeMap<String, usize>,
    /// Every ACP line written.
    pub acp_out: Vec<String>,
    /// Inputs the world wants delivered next (answers to actions).
    pub queue: std::collections::VecDeque<Input>,
}

impl Driver {
    /// A driver around a fresh agent with `cfg` at t = 0.
    #[must_use]
    pub fn new(cfg: Config) -> Driver {
        let mut d = Driver {
            agent: Agent::new(cfg, MonoTime::ZERO).with_version("0.0.0-fuzz"),
            now: MonoTime::ZERO,
            answered: BTreeMap::new(),
            acp_out: Vec::new(),
            queue: std::collections::VecDeque::new(),
        };
        d.drain(&mut |_, _, _| {});
        d
    }

    /// Drains every action, checking each and handing it to `react` (which may queue inputs).
    pub fn drain(&mut self, react: &mut React<'_>) {
        while let Some(a) = self.agent.poll_action() {
            let json = check_action(&a);
            if let Action::WriteAcp(l) = &a {
                if let Some(id) = json.as_ref().and_then(response_id) {
                    *self.answered.entry(id).or_default() += 1;
                }
                self.acp_out.push(l.clone());
            }
            react(&a, json.as_ref(), &mut self.queue);
        }
    }

    /// Feeds one input now and drains.
    pub fn feed(&mut self, input: Input, react: &mut React<'_>) {
        self.agent.handle(input, self.now);
        self.drain(react);
    }

    /// Delivers queued inputs (and what they cause) until none is left, at most `limit`.
    pub fn settle(&mut self, limit: usize, react: &mut React<'_>) {
        for _ in 0..limit {
            let Some(input) = self.queue.pop_front() else {
                return;
            };
            self.feed(input, react);
        }
    }

    /// Fires the next timer (advancing time to it); false when none is pending. Checks I11.
    pub fn fire_next_timer(&mut self, react: &mut React<'_>) -> bool {
        let Some((when, _)) = self.agent.poll_timeout() else {
            return false;
        };
        if when > self.now {
            self.now = when;
        }
        let now = self.now;
        self.agent.handle_timeout(now);
        self.drain(react);
        invariants::Invariants::after_timeout(now, self.agent.poll_timeout());
        true
    }

    /// Closes stdin and runs queued inputs and timers until the agent exits (P1); panics if it
    /// does not within `limit` steps.
    pub fn shut_down(&mut self, limit: usize, react: &mut React<'_>) {
        self.feed(Input::AcpEof, react);
        for _ in 0..limit {
            if self.agent.is_finished() {
                return;
            }
            if !self.queue.is_empty() {
                self.settle(1, react);
            } else if !self.fire_next_timer(react) {
                break;
            }
        }
        assert!(
            self.agent.is_finished(),
            "P1: the agent did not exit after EOF"
        );
    }
}

/// The world's default reactions: a spawned server starts at once, a signalled group exits,
/// a closed stdin makes the server exit.
pub fn os_reactions(a: &Action, q: &mut std::collections::VecDeque<Input>) {
    // The other actions need no answer from the OS: the fuzz agents keep no sessions on disk
    // (the state directory is off) and no HTTP MCP server answers.
    if let Action::SpawnMcp { proc, .. } = a {
        q.push_back(Input::McpSpawned { proc: *proc });
    } else if let Action::SignalProcessGroup { proc, .. } | Action::CloseMcpStdin { proc } = a {
        q.push_back(Input::McpStdoutClosed { proc: *proc });
        q.push_back(Input::McpExited {
            proc: *proc,
            status: "exit status 0".into(),
        });
    }
}

/// `acp_input`: arbitrary bytes as the ACP client's stdin of a fresh agent (SPEC T1–T7, C01,
/// C50, I7).
///
/// Input: cap byte (line cap 64..=1087 bytes), split plan, then the bytes. The agent never
/// panics, every frame it writes parses back, every request (including over-long lines with a
/// readable id, and invalid messages with one) is answered exactly once, lines that cannot be
/// correlated are answered with `id: null` once each, and after EOF the agent exits.
pub fn acp_input(data: &[u8]) {
    let mut r = Reader::new(data);
    let max = 64 + usize::from(r.u8()) * 4;
    let cuts = r.cuts();
    let input = r.rest();
    let mut cfg = fuzz_config(ProviderKind::OpenAiChat);
    cfg.max_line_bytes = max;
    cfg.mcp_init_timeout_ms = 1000;
    let mut d = Driver::new(cfg);
    let mut react = |a: &Action, _: Option<&Value>, q: &mut std::collections::VecDeque<Input>| {
        os_reactions(a, q);
        if let Action::CallLlm { call, .. } = a {
            // Every LLM call fails at once: prompts end without a network.
            q.push_back(Input::Llm {
                call: *call,
                event: crate::io::LlmEvent::Failed("offline".into()),
            });
        }
    };
    for chunk in split(input, &cuts) {
        d.feed(Input::AcpBytes(chunk.to_vec()), &mut react);
        d.settle(10_000, &mut react);
        d.now = d.now.plus_ms(1);
    }
    d.shut_down(100_000, &mut react);
    let due = expected_answers(max, input);
    assert_eq!(d.answered, due, "I7: answers differ from the requests");
}

/// `mcp_output`: arbitrary bytes as one MCP server's stdout and stderr, around the handshake, a
/// prompt and a tool call (SPEC T6, M1–M9, L9, C36, C52).
///
/// Input: split byte (share of stdout before the prompt), stderr share byte, split plan, then
/// the bytes. The agent never panics, every frame it writes (to the client and to the server)
/// parses back, `initialize` and `session/new` are answered exactly once, and after EOF the
/// agent exits.
pub fn mcp_output(data: &[u8]) {
    let mut r = Reader::new(data);
    let first_share = usize::from(r.u8());
    let stderr_share = usize::from(r.u8());
    let cuts = r.cuts();
    let bytes = r.rest();
    let stderr_len = bytes.len() * stderr_share / 256;
    let (stderr, stdout) = bytes.split_at(stderr_len);
    let first_len = stdout.len() * first_share / 256;
    let (before, after) = stdout.split_at(first_len);

    let mut cfg = fuzz_config(ProviderKind::OpenAiChat);
    cfg.mcp_init_timeout_ms = 1000;
    cfg.tool_timeout_ms = 2000;
    cfg.hook_timeout_ms = 500;
    let mut d = Driver::new(cfg);
    let llm_calls = std::cell::Cell::new(0u32);
    let mut react = |a: &Action, _: Option<&Value>, q: &mut std::collections::VecDeque<Input>| {
        os_reactions(a, q);
        if let Action::CallLlm { call, .. } = a {
            let n = llm_calls.get();
            llm_calls.set(n + 1);
            let body = if n == 0 {
                session::chat_tool_body(&[("c1", "fs__echo", "{\"text\":\"hi\"}")])
            } else {
                session::chat_text_body("done")
            };
            for event in [
                crate::io::LlmEvent::Head {
                    status: 200,
                    headers: Vec::new(),
                },
                crate::io::LlmEvent::Body(body),
                crate::io::LlmEvent::End,
            ] {
                q.push_back(Input::Llm { call: *call, event });
            }
        }
    };
    let send = |d: &mut Driver, react: &mut React<'_>, v: Value| {
        d.feed(Input::AcpBytes(format!("{v}\n").into_bytes()), react);
        d.settle(10_000, react);
    };
    send(
        &mut d,
        &mut react,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}),
    );
    send(
        &mut d,
        &mut react,
        json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w","mcpServers":[{"name":"fs","command":"fake"}]}}),
    );
    let proc = crate::io::ProcKey {
        server: crate::ids::ServerSlot(1),
        generation: 0,
    };
    let mut err_lines = StderrLines::new(crate::io::MAX_STDERR_LINE_BYTES);
    let mut lines = Vec::new();
    err_lines.push(stderr, &mut lines);
    lines.extend(err_lines.finish());
    let mut lines = lines.into_iter();
    let mut feed_stdout = |d: &mut Driver, part: &[u8], react: &mut React<'_>| {
        for chunk in split(part, &cuts) {
            d.feed(
                Input::McpBytes {
                    proc,
                    bytes: chunk.to_vec(),
                },
                react,
            );
            if let Some(line) = lines.next() {
                d.feed(Input::McpStderrLine { proc, line }, react);
            }
            d.settle(10_000, react);
            d.now = d.now.plus_ms(1);
        }
    };
    feed_stdout(&mut d, before, &mut react);
    // Let the handshake time out or finish, so `session/new` is decided either way.
    for _ in 0..8 {
        if d.answered.contains_key("2") || !d.fire_next_timer(&mut react) {
            break;
        }
        d.settle(10_000, &mut react);
    }
    if let Some(sid) = d.acp_out.iter().find_map(|l| {
        let v: Value = serde_json::from_str(l).ok()?;
        (v["id"] == json!(2)).then(|| v["result"]["sessionId"].as_str().map(str::to_owned))?
    }) {
        send(
            &mut d,
            &mut react,
            json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":sid,"prompt":[{"type":"text","text":"go"}]}}),
        );
    }
    feed_stdout(&mut d, after, &mut react);
    d.shut_down(100_000, &mut react);
    for id in ["1", "2"] {
        assert_eq!(
            d.answered.get(id),
            Some(&1),
            "I7: request {id} answered once"
        );
    }
    assert!(
        d.answered.get("3").is_none_or(|n| *n == 1),
        "I7: the prompt answered once"
    );
}

// ------------------------------------------------------------------------------ SSE decoders

/// The provider routes, one decoder target each (`sse_<name>`, [`decoder_target`]).
pub use crate::config::ProviderKind as Route;

/// The fuzz target (and corpus folder) of a route's stream decoder: `sse_chat`,
/// `sse_anthropic`, `sse_responses`. Every route of [`Route::ALL`] has one (the corpus replay
/// test checks that its target, `[[bin]]` and corpus exist).
#[must_use]
pub fn decoder_target(route: Route) -> &'static str {
    match route {
        Route::Anthropic => "sse_anthropic",
        Route::OpenAiChat => "sse_chat",
        Route::OpenAiResponses => "sse_responses",
    }
}

fn make_decoder(route: Route) -> Box<dyn StreamDecoder> {
    crate::llm::route(route).decoder("call_fz".to_owned())
}

/// What a decoder made of a body.
#[derive(Debug, PartialEq)]
struct Decoded {
    deltas: Vec<StreamDelta>,
    result: Result<crate::llm::LlmResponse, crate::llm::StreamError>,
    complete: bool,
}

fn decode(route: Route, chunks: &[&[u8]]) -> Decoded {
    let mut decoder = make_decoder(route);
    let mut deltas = Vec::new();
    for c in chunks {
        if let Err(e) = decoder.feed(c, &mut deltas) {
            // Sticky: every later call says the same.
            assert_eq!(
                decoder.feed(b"data: {}\n\n", &mut deltas).err(),
                Some(e.clone())
            );
            assert_eq!(decoder.finish(&mut deltas).err(), Some(e.clone()));
            return Decoded {
                deltas,
                result: Err(e),
                complete: decoder.is_complete(),
            };
        }
    }
    let complete = decoder.is_complete();
    let result = decoder.finish(&mut deltas);
    if result.is_ok() {
        assert!(decoder.finish(&mut Vec::new()).is_err(), "handed out twice");
    }
    Decoded {
        deltas,
        result,
        complete,
    }
}

/// `sse_chat` / `sse_anthropic` / `sse_responses`: one route's stream decoder under arbitrary
/// splits (SPEC L6–L9, C21–C24, C36, C37). Input: split plan, then the body.
pub fn sse_decoder(route: Route, data: &[u8]) {
    let mut r = Reader::new(data);
    let cuts = r.cuts();
    let body = r.rest();
    let whole = decode(route, &[body]);
    assert_eq!(
        decode(route, &split(body, &cuts)),
        whole,
        "L9: the outcome depends on the split"
    );
    if body.len() <= 256 {
        let singles: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(decode(route, &singles), whole, "byte by byte");
    }
    if let Ok(resp) = &whole.result {
        let streamed: String = whole
            .deltas
            .iter()
            .filter_map(|d| match d {
                StreamDelta::Text(t) => Some(t.as_str()),
                StreamDelta::Thought(_) => None,
            })
            .collect();
        assert!(
            resp.text.starts_with(&streamed)
                || streamed.starts_with(&resp.text)
                || route == Route::OpenAiResponses,
            "streamed text and response text diverge"
        );
        for call in &resp.tool_calls {
            assert!(!call.id.is_empty() && !call.name.is_empty());
        }
        let mut ids: Vec<&str> = resp.tool_calls.iter().map(|c| c.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            resp.tool_calls.len(),
            "C21: tool-call ids not unique"
        );
    }
}

// ------------------------------------------------------------------------------ config

/// `config_env`: `Config::from_env_map` on arbitrary environment maps (SPEC C1, C2).
///
/// Input: entries, each a selector byte (a known variable name, or a free name read from the
/// input), then a value of up to 255 bytes (length byte first), decoded lossily. Never panics;
/// an accepted configuration starts an `Agent`; every error is one line.
pub fn config_env(data: &[u8]) {
    let names = crate::config::variable_names();
    let mut r = Reader::new(data);
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    while !r.is_empty() {
        let sel = usize::from(r.u8());
        let name = match names.get(sel % (names.len() + 8)) {
            Some(n) => (*n).to_owned(),
            None => {
                let len = usize::from(r.u8() % 32);
                String::from_utf8_lossy(r.take(len)).into_owned()
            }
        };
        let len = usize::from(r.u8());
        let value = String::from_utf8_lossy(r.take(len)).into_owned();
        env.insert(name, value);
    }
    let read_file = |path: &str| {
        if path.contains("missing") {
            Err("no such file".to_owned())
        } else {
            Ok(format!("system prompt from {path}"))
        }
    };
    let _ = crate::config::unknown_agent_variables(&env);
    match Config::from_env_map(&env, &read_file) {
        Ok(cfg) => {
            assert!(cfg.max_output_tokens >= 1);
            assert!(u64::from(cfg.max_output_tokens) < cfg.max_context_tokens);
            assert!(cfg.max_line_bytes >= 1024);
            assert!(cfg.llm_max_attempts >= 1 && cfg.max_parallel_tools >= 1);
            let _ = format!("{cfg:?}");
            let mut agent = Agent::new(cfg, MonoTime::ZERO);
            while let Some(a) = agent.poll_action() {
                check_action(&a);
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty());
            for e in &errors {
                let msg = e.to_string();
                assert!(
                    !msg.is_empty() && !msg.contains('\n'),
                    "one-line error: {msg:?}"
                );
            }
        }
    }
}
