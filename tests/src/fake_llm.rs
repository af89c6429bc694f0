//! A fake LLM: a real TCP listener on 127.0.0.1 speaking HTTP/1.1, one thread per connection, one
//! request per connection (`connection: close`). Streaming replies use `transfer-encoding:
//! chunked`; each piece is written and flushed on its own so the agent sees the splits the script
//! asks for (SPEC L6–L9; DESIGN layer 5).
//!
//! The same scripted [`Reply::text`] / [`Reply::tool_calls`] is streamed in the wire format the
//! request path asks for ([`Wire::from_path`]): OpenAI Chat Completions (`…/chat/completions`),
//! Anthropic Messages (`…/messages`) or OpenAI Responses (`…/responses`). Raw SSE and status
//! replies are sent as given on every route.

use buzz_agent_core::config::ProviderKind;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One HTTP request the agent made.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON; a body that is not JSON is kept as a JSON string.
    pub body: Value,
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The first header of that (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The wire format of this request, from its path.
    pub fn wire(&self) -> Wire {
        Wire::from_path(&self.path)
    }

    /// The history: `body.messages` (Chat Completions, Anthropic) or `body.input` (Responses),
    /// empty when absent.
    pub fn messages(&self) -> Vec<Value> {
        let key = match self.wire() {
            Wire::Responses => "input",
            Wire::Chat | Wire::Anthropic => "messages",
        };
        self.body[key].as_array().cloned().unwrap_or_default()
    }

    /// The system prompt as sent: the `system` (or `developer`) message of Chat Completions,
    /// Anthropic's `system` (a string, or the texts of its blocks joined), the Responses API's
    /// `instructions`; `None` when there is none.
    pub fn system_text(&self) -> Option<String> {
        match self.wire() {
            Wire::Chat => self
                .messages()
                .iter()
                .find(|m| m["role"] == "system" || m["role"] == "developer")
                .map(|m| content_text(&m["content"])),
            Wire::Anthropic => match &self.body["system"] {
                Value::String(s) => Some(s.clone()),
                Value::Array(blocks) => Some(
                    blocks
                        .iter()
                        .filter_map(|b| b["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                ),
                _ => None,
            },
            Wire::Responses => self.body["instructions"].as_str().map(str::to_string),
        }
    }

    /// The function names of `body.tools` (`tools[].function.name` for Chat Completions,
    /// `tools[].name` for Anthropic and Responses).
    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| {
                        t["function"]["name"]
                            .as_str()
                            .or_else(|| t["name"].as_str())
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every offered tool as `(name, description, input schema)` on every route (Chat
    /// `function.parameters`, Responses `parameters`, Anthropic `input_schema`); the schema
    /// is `None` for a tool sent without one.
    pub fn tool_schemas(&self) -> Vec<(String, String, Option<Value>)> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        self.body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| match self.wire() {
                Wire::Chat => (
                    text(&t["function"]["name"]),
                    text(&t["function"]["description"]),
                    t["function"].get("parameters").cloned(),
                ),
                Wire::Responses => (
                    text(&t["name"]),
                    text(&t["description"]),
                    t.get("parameters").cloned().filter(|p| !p.is_null()),
                ),
                Wire::Anthropic => (
                    text(&t["name"]),
                    text(&t["description"]),
                    t.get("input_schema").cloned(),
                ),
            })
            .collect()
    }

    /// The text of every user message of the history, concatenated (tool results excluded).
    pub fn user_text(&self) -> String {
        self.messages()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| content_text(&m["content"]))
            .collect()
    }

    /// The history as tool-call pairing items, in order (see [`HistoryItem`]).
    pub fn history_items(&self) -> Vec<HistoryItem> {
        let mut out = Vec::new();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        for (i, m) in self.messages().iter().enumerate() {
            let role = m["role"].as_str().unwrap_or_default().to_string();
            match self.wire() {
                Wire::Chat => match role.as_str() {
                    "tool" => out.push(HistoryItem::Result {
                        msg: i,
                        id: text(&m["tool_call_id"]),
                        text: content_text(&m["content"]),
                    }),
                    _ => {
                        out.push(HistoryItem::Other {
                            msg: i,
                            what: role.clone(),
                        });
                        if role == "assistant" {
                            for c in m["tool_calls"].as_array().into_iter().flatten() {
                                out.push(HistoryItem::Call {
                                    msg: i,
                                    id: text(&c["id"]),
                                    name: text(&c["function"]["name"]),
                                    arguments: text(&c["function"]["arguments"]),
                                });
                            }
                        }
                    }
                },
                Wire::Anthropic => {
                    if role != "user" {
                        out.push(HistoryItem::Other {
                            msg: i,
                            what: role.clone(),
                        });
                    }
                    let blocks = match &m["content"] {
                        Value::Array(blocks) => blocks.clone(),
                        other => vec![json!({"type": "text", "text": other.clone()})],
                    };
                    for b in blocks {
                        match b["type"].as_str() {
                            Some("tool_use") if role == "assistant" => {
                                out.push(HistoryItem::Call {
                                    msg: i,
                                    id: text(&b["id"]),
                                    name: text(&b["name"]),
                                    arguments: b["input"].to_string(),
                                });
                            }
                            Some("tool_result") if role == "user" => {
                                out.push(HistoryItem::Result {
                                    msg: i,
                                    id: text(&b["tool_use_id"]),
                                    text: content_text(&b["content"]),
                                });
                            }
                            kind => out.push(HistoryItem::Other {
                                msg: i,
                                what: format!("{role} {} block", kind.unwrap_or("untyped")),
                            }),
                        }
                    }
                }
                Wire::Responses => match m["type"].as_str() {
                    Some("function_call") => out.push(HistoryItem::Call {
                        msg: i,
                        id: text(&m["call_id"]),
                        name: text(&m["name"]),
                        arguments: text(&m["arguments"]),
                    }),
                    Some("function_call_output") => out.push(HistoryItem::Result {
                        msg: i,
                        id: text(&m["call_id"]),
                        text: content_text(&m["output"]),
                    }),
                    kind => out.push(HistoryItem::Other {
                        msg: i,
                        what: format!("{} {role}", kind.unwrap_or("message")),
                    }),
                },
            }
        }
        out
    }

    /// Every assistant tool call in the history, in order: `(id, name, arguments string)`
    /// (Anthropic: `input` as compact JSON text).
    pub fn assistant_tool_calls(&self) -> Vec<(String, String, String)> {
        self.history_items()
            .into_iter()
            .filter_map(|item| match item {
                HistoryItem::Call {
                    id,
                    name,
                    arguments,
                    ..
                } => Some((id, name, arguments)),
                HistoryItem::Result { .. } | HistoryItem::Other { .. } => None,
            })
            .collect()
    }

    /// Every tool result in order: `(call id, content as text)` — `role:"tool"` messages,
    /// Anthropic `tool_result` blocks, Responses `function_call_output` items.
    pub fn tool_results(&self) -> Vec<(String, String)> {
        self.history_items()
            .into_iter()
            .filter_map(|item| match item {
                HistoryItem::Result { id, text, .. } => Some((id, text)),
                HistoryItem::Call { .. } | HistoryItem::Other { .. } => None,
            })
            .collect()
    }

    /// The visible text the assistant said together with the tool call `call_id`: Chat, the
    /// `content` of the message holding the call; Anthropic, the text blocks of that turn;
    /// Responses, the `output_text` of the assistant message items right before the call's
    /// items. `None` when no such call is in the history.
    pub fn assistant_text_with_call(&self, call_id: &str) -> Option<String> {
        let items = self.messages();
        match self.wire() {
            Wire::Chat => items
                .iter()
                .find(|m| {
                    m["tool_calls"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["id"] == call_id))
                })
                .map(|m| content_text(&m["content"])),
            Wire::Anthropic => items
                .iter()
                .find(|m| {
                    m["content"].as_array().is_some_and(|b| {
                        b.iter()
                            .any(|b| b["type"] == "tool_use" && b["id"] == call_id)
                    })
                })
                .map(|m| {
                    m["content"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|b| b["type"] == "text")
                        .filter_map(|b| b["text"].as_str())
                        .collect()
                }),
            Wire::Responses => {
                let at = items
                    .iter()
                    .position(|i| i["type"] == "function_call" && i["call_id"] == call_id)?;
                let mut text = String::new();
                for item in items[..at].iter().rev() {
                    match item["type"].as_str() {
                        Some("function_call" | "reasoning") => {}
                        Some("message") if item["role"] == "assistant" => {
                            text.insert_str(0, &content_text(&item["content"]));
                        }
                        _ => break,
                    }
                }
                Some(text)
            }
        }
    }

    /// The text of the tool result answering the assistant tool call of that id.
    pub fn tool_result_for(&self, call_id: &str) -> Option<String> {
        self.tool_results()
            .into_iter()
            .find(|(id, _)| id == call_id)
            .map(|(_, t)| t)
    }

    /// SPEC L4 on the wire, for every route: every assistant tool call is answered by exactly
    /// one tool result before anything else comes (the next assistant message, a user text, a
    /// non-result item), and every result answers an open call. Chat: `role:"tool"` messages
    /// after the assistant message; Anthropic: `tool_result` blocks first in the next user
    /// message; Responses: `function_call_output` items after the `function_call` items.
    /// Panics with the history when not.
    pub fn assert_tool_calls_paired(&self) {
        if let Some(why) = self.pairing_error() {
            panic!(
                "L4 violated ({:?} route): {why}\nhistory: {}",
                self.wire(),
                serde_json::to_string_pretty(&self.messages()).unwrap_or_default()
            );
        }
    }

    /// Where an Anthropic request marks `cache_control` breakpoints (SPEC L11), in prefix
    /// order: `system <k>`, `tool <k>`, `message <i> block <k>` (a string `content` counts as
    /// one block that cannot carry one).
    pub fn cache_breakpoints(&self) -> Vec<String> {
        let mut out = Vec::new();
        let body = &self.body;
        let marked = |v: &Value| v.get("cache_control").is_some();
        for (k, t) in body["tools"].as_array().into_iter().flatten().enumerate() {
            if marked(t) {
                out.push(format!("tool {k}"));
            }
        }
        for (k, b) in body["system"].as_array().into_iter().flatten().enumerate() {
            if marked(b) {
                out.push(format!("system {k}"));
            }
        }
        for (i, m) in body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for (k, b) in m["content"].as_array().into_iter().flatten().enumerate() {
                if marked(b) {
                    out.push(format!("message {i} block {k}"));
                }
            }
        }
        out
    }

    /// The history ([`RecordedRequest::messages`]) with every `cache_control` removed: what
    /// a provider's prompt cache compares from one request to the next (SPEC L11).
    pub fn messages_without_breakpoints(&self) -> Vec<Value> {
        fn strip(v: &mut Value) {
            match v {
                Value::Object(map) => {
                    map.remove("cache_control");
                    map.values_mut().for_each(strip);
                }
                Value::Array(items) => items.iter_mut().for_each(strip),
                _ => {}
            }
        }
        let mut messages = self.messages();
        messages.iter_mut().for_each(strip);
        messages
    }

    /// What breaks SPEC L4 in this request's history (see
    /// [`RecordedRequest::assert_tool_calls_paired`]), or `None`.
    pub fn pairing_error(&self) -> Option<String> {
        let mut open: Vec<String> = Vec::new();
        for item in self.history_items() {
            match item {
                HistoryItem::Result { msg, id, .. } => match open.iter().position(|o| *o == id) {
                    Some(p) => {
                        open.remove(p);
                    }
                    None => {
                        return Some(format!(
                            "message {msg}: tool result {id:?} answers no open tool call"
                        ));
                    }
                },
                HistoryItem::Other { msg, what } => {
                    if !open.is_empty() {
                        return Some(format!(
                            "message {msg} ({what:?}) comes while tool calls {open:?} have no result"
                        ));
                    }
                }
                HistoryItem::Call { msg, id, .. } => {
                    if id.is_empty() || open.contains(&id) {
                        return Some(format!(
                            "message {msg}: empty or repeated tool call id {id:?}"
                        ));
                    }
                    open.push(id);
                }
            }
        }
        (!open.is_empty())
            .then(|| format!("tool calls {open:?} have no result at the end of the history"))
    }
}

/// One element of a request's history as far as tool-call pairing (SPEC L4) is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryItem {
    /// An assistant tool call (`msg` = index in [`RecordedRequest::messages`]).
    Call {
        msg: usize,
        id: String,
        name: String,
        arguments: String,
    },
    /// A tool result.
    Result {
        msg: usize,
        id: String,
        text: String,
    },
    /// Anything else: a message start or a non-tool content block / item.
    Other { msg: usize, what: String },
}

/// Which provider wire format a request uses (SPEC L6–L8): one per route of the agent's own
/// list (`ProviderKind::ALL` of the core, [`Wire::ALL`]); a route the fake does not speak fails
/// to build here ([`Wire::of`] is exhaustive). Only the list is shared with the agent: the
/// fake's streams and its reading of requests are its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI Chat Completions, `POST …/chat/completions` (L7).
    Chat,
    /// Anthropic Messages, `POST …/v1/messages` (L6).
    Anthropic,
    /// OpenAI Responses, `POST …/responses` (L8).
    Responses,
}

impl Wire {
    /// Every route the agent has, in its order.
    pub const ALL: [Wire; ProviderKind::ALL.len()] = {
        let mut all = [Wire::Chat; ProviderKind::ALL.len()];
        let mut i = 0;
        while i < all.len() {
            all[i] = Wire::of(ProviderKind::ALL[i]);
            i += 1;
        }
        all
    };

    /// The wire format of the agent's route `route`.
    pub const fn of(route: ProviderKind) -> Wire {
        match route {
            ProviderKind::Anthropic => Wire::Anthropic,
            ProviderKind::OpenAiChat => Wire::Chat,
            ProviderKind::OpenAiResponses => Wire::Responses,
        }
    }

    /// The agent's route for this wire format.
    pub const fn route(self) -> ProviderKind {
        match self {
            Wire::Anthropic => ProviderKind::Anthropic,
            Wire::Chat => ProviderKind::OpenAiChat,
            Wire::Responses => ProviderKind::OpenAiResponses,
        }
    }

    /// The format a request path asks for: `…/messages` → Anthropic, `…/responses` →
    /// Responses, anything else → Chat Completions.
    pub fn from_path(path: &str) -> Wire {
        let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        if path.ends_with("/messages") {
            Wire::Anthropic
        } else if path.ends_with("/responses") {
            Wire::Responses
        } else {
            Wire::Chat
        }
    }

    /// The request path the agent uses on this route with the fake's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Wire::Chat => "/v1/chat/completions",
            Wire::Anthropic => "/v1/messages",
            Wire::Responses => "/v1/responses",
        }
    }
}

/// The text of a Chat Completions `content`: a string, or the `text` of its parts joined.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

#[derive(Debug, Clone)]
enum Body {
    /// A stream built from its parts at serve time, in the request's wire format.
    Scripted {
        text: Option<String>,
        thinking: Option<String>,
        calls: Vec<(String, String, String)>,
        finish: String,
        usage: Option<(u64, u64)>,
        /// Of the input tokens, `(read from, written to)` the prompt cache ([`Reply::cache_usage`]).
        cache: Option<(u64, u64)>,
        done: bool,
        style: Style,
        /// How many deltas the text and the thinking are split into.
        parts: usize,
    },
    /// SSE text sent verbatim (one chunk, unless split).
    RawSse(String),
    /// A plain response with `content-length`.
    Status {
        code: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
}

/// How a scripted stream spells what real servers spell differently (the dialect profiles of
/// [`crate::dialects`] set it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Style {
    /// Anthropic: the thinking block's `signature_delta` (default `sig-fake`).
    pub signature: Option<String>,
    /// Responses: the reasoning item's `encrypted_content` (none by default).
    pub encrypted_reasoning: Option<String>,
    /// Chat: the delta field reasoning is streamed in (default `reasoning_content`).
    pub reasoning_field: Option<&'static str>,
    /// Chat: every tool call whole in one delta at `index: 0`, each with its own id (Ollama).
    pub calls_at_index_0: bool,
}

/// What the fake LLM answers to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    body: Body,
    split_every: Option<usize>,
    stall_after_ms: Option<u64>,
    cut_in_piece: Option<usize>,
    /// Where to cut, decided when the stream is built in its wire format (and its dialect's
    /// style): see [`Cut`].
    cut: Option<Cut>,
    delay_ms: u64,
    /// Not one of the scenario's requests: a dialect profile's rejection or injected error; left
    /// out of [`FakeLlm::requests`] and of the handler's request index.
    pub(crate) uncounted: bool,
    pace_ms: Option<u64>,
}

/// How many deltas a scripted text or thinking is split into unless [`Reply::deltas`] says.
const DEFAULT_PARTS: usize = 3;

impl Reply {
    fn new(body: Body) -> Self {
        Reply {
            body,
            split_every: None,
            stall_after_ms: None,
            cut_in_piece: None,
            cut: None,
            delay_ms: 0,
            uncounted: false,
            pace_ms: None,
        }
    }

    /// The reasoning text of a scripted reply.
    pub fn thinking(&self) -> Option<&str> {
        match &self.body {
            Body::Scripted { thinking, .. } => thinking.as_deref(),
            Body::RawSse(_) | Body::Status { .. } => None,
        }
    }

    /// Whether this is a scripted reply (streamed in the request's wire format).
    pub fn is_scripted(&self) -> bool {
        matches!(self.body, Body::Scripted { .. })
    }

    /// Removes a scripted reply's reasoning.
    pub fn without_thinking(mut self) -> Self {
        if let Body::Scripted { thinking, .. } = &mut self.body {
            *thinking = None;
        }
        self
    }

    /// Sets how a scripted reply spells its dialect details ([`Style`]).
    pub fn with_style(mut self, new: Style) -> Self {
        if let Body::Scripted { style, .. } = &mut self.body {
            *style = new;
        }
        self
    }

    /// Marks the reply as not one of the scenario's requests (see [`Reply::uncounted`]).
    pub(crate) fn uncounted(mut self) -> Self {
        self.uncounted = true;
        self
    }

    /// Streamed assistant text (several deltas) ending the turn. Chat: `content` deltas, finish
    /// `stop`, a usage-only chunk (`choices: []`), `data: [DONE]`. Anthropic: `message_start`
    /// (input tokens), `ping`, a text block of `text_delta`s, `message_delta` (`end_turn`,
    /// output tokens), `message_stop`. Responses: a message item with `output_text` deltas,
    /// `response.completed` with usage.
    pub fn text(s: impl Into<String>) -> Self {
        Reply::new(Body::Scripted {
            text: Some(s.into()),
            thinking: None,
            calls: Vec::new(),
            finish: "stop".into(),
            usage: Some((100, 10)),
            cache: None,
            done: true,
            style: Style::default(),
            parts: DEFAULT_PARTS,
        })
    }

    /// Tool calls `(id, name, arguments)`, finish `tool_calls`. Each call's arguments are
    /// streamed across at least two deltas; id, type and name only on the first. Anthropic:
    /// one `tool_use` block per call (`input: {}`, arguments as `input_json_delta`s), stop
    /// reason `tool_use`. Responses: a `function_call` item per call (`output_item.added`,
    /// `function_call_arguments.delta`s and `.done`, `output_item.done`).
    pub fn tool_calls(calls: Vec<(&str, &str, Value)>) -> Self {
        Reply::tool_calls_raw(
            calls
                .into_iter()
                .map(|(i, n, a)| (i, n, a.to_string()))
                .collect(),
        )
    }

    /// Like [`Reply::tool_calls`] with the arguments string sent as given (invalid JSON, `""`).
    pub fn tool_calls_raw(calls: Vec<(&str, &str, String)>) -> Self {
        Reply::new(Body::Scripted {
            text: None,
            thinking: None,
            calls: calls
                .into_iter()
                .map(|(i, n, a)| (i.to_string(), n.to_string(), a))
                .collect(),
            finish: "tool_calls".into(),
            usage: Some((100, 10)),
            cache: None,
            done: true,
            style: Style::default(),
            parts: DEFAULT_PARTS,
        })
    }

    /// SSE body sent verbatim.
    pub fn raw_sse(body: impl Into<String>) -> Self {
        Reply::new(Body::RawSse(body.into()))
    }

    /// A non-streaming response: status, extra headers, body (sent with `content-length`).
    pub fn status(code: u16, headers: Vec<(&str, &str)>, body: impl Into<String>) -> Self {
        Reply::new(Body::Status {
            code,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.into(),
        })
    }

    /// Streamed text before the tool calls (scripted replies only).
    pub fn with_text(mut self, s: impl Into<String>) -> Self {
        if let Body::Scripted { text, .. } = &mut self.body {
            *text = Some(s.into());
        }
        self
    }

    /// The `finish_reason` of the final choice chunk (scripted replies only), e.g. `length`.
    /// Anthropic maps it to a stop reason (`stop` → `end_turn`, `tool_calls` → `tool_use`,
    /// `length` → `max_tokens`, `content_filter` → `refusal`, others verbatim); Responses
    /// ends `response.incomplete` for `length` / `content_filter`, else `response.completed`.
    pub fn finish_reason(mut self, reason: &str) -> Self {
        if let Body::Scripted { finish, .. } = &mut self.body {
            *finish = reason.to_string();
        }
        self
    }

    /// Of the usage's input tokens, `read` came from the prompt cache and `write` went to it
    /// (SPEC L11), spelled per route: Chat `prompt_tokens_details.cached_tokens` (and
    /// OpenRouter's `cache_write_tokens` when `write > 0`), Anthropic `cache_read_input_tokens`
    /// and `cache_creation_input_tokens` beside the rest as `input_tokens`, Responses
    /// `input_tokens_details.cached_tokens`.
    pub fn cache_usage(mut self, read: u64, write: u64) -> Self {
        if let Body::Scripted { cache, .. } = &mut self.body {
            *cache = Some((read, write));
        }
        self
    }

    /// Usage `(prompt_tokens, completion_tokens)` of the usage-only chunk; `None` omits it.
    pub fn usage(mut self, u: Option<(u64, u64)>) -> Self {
        if let Body::Scripted { usage, .. } = &mut self.body {
            *usage = u;
        }
        self
    }

    /// Reasoning streamed before the text (scripted replies only): Chat `reasoning_content`
    /// deltas, an Anthropic `thinking` block (`thinking_delta`s, then a `signature_delta`),
    /// Responses `response.reasoning_summary_text.delta`s.
    pub fn with_thinking(mut self, s: impl Into<String>) -> Self {
        if let Body::Scripted { thinking, .. } = &mut self.body {
            *thinking = Some(s.into());
        }
        self
    }

    /// Leaves out the stream terminator (scripted replies only): `data: [DONE]` (Chat),
    /// `message_stop` (Anthropic), the final `response.completed` (Responses).
    pub fn without_done(mut self) -> Self {
        if let Body::Scripted { done, .. } = &mut self.body {
            *done = false;
        }
        self
    }

    /// Writes the body in pieces of `n` bytes (ignoring event boundaries, so lines and UTF-8
    /// characters are cut), each flushed, with a ~1 ms pause between them.
    pub fn split_every(mut self, n: usize) -> Self {
        self.split_every = Some(n.max(1));
        self
    }

    /// After the body pieces, keeps the socket open and silent for `ms`, then closes it
    /// **without** the terminating zero-length chunk, so the HTTP body never ends cleanly.
    /// `stall_after_ms(0)` cuts the stream right after the pieces.
    pub fn stall_after_ms(mut self, ms: u64) -> Self {
        self.stall_after_ms = Some(ms);
        self
    }

    /// Sends the SSE pieces before piece `n` whole, then the first half of piece `n` (cut
    /// mid-event), then closes the socket without the terminating chunk (as
    /// `stall_after_ms(0)`, or after the stall if one is set). Ignored with `split_every`.
    pub fn cut_in_piece(mut self, n: usize) -> Self {
        self.cut_in_piece = Some(n);
        self.stall_after_ms.get_or_insert(0);
        self
    }

    /// Like [`Reply::cut_in_piece`] with the piece chosen when the stream is built, after the
    /// dialect's style is applied: the middle piece of the stream, or the first piece that
    /// streams anything to the client (reasoning or text) when that comes earlier — so nothing
    /// reached the client and the attempt may be retried (SPEC L5).
    pub fn cut_in_middle(mut self) -> Self {
        self.cut = Some(Cut::Middle);
        self.stall_after_ms.get_or_insert(0);
        self
    }

    /// Sends the pieces up to and including the first one that streams visible text, then
    /// keeps the socket silent for `ms` and closes it without the terminating chunk: a stream
    /// the client sees start, on every route and in every dialect.
    pub fn stall_after_first_text(mut self, ms: u64) -> Self {
        self.cut = Some(Cut::AfterFirstText);
        self.stall_after_ms = Some(ms);
        self
    }

    /// Waits `ms` before sending the response head.
    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.delay_ms = ms;
        self
    }

    /// Splits the text and the thinking into `n` deltas (on character boundaries, each
    /// non-empty; fewer when the text has fewer characters) instead of 3 (scripted replies only).
    pub fn deltas(mut self, n: usize) -> Self {
        if let Body::Scripted { parts, .. } = &mut self.body {
            *parts = n.max(1);
        }
        self
    }

    /// Sleeps `ms` after each body piece and records the instant each piece was written
    /// ([`FakeLlm::piece_writes`]), so a client's latency per piece can be measured.
    pub fn pace_ms(mut self, ms: u64) -> Self {
        self.pace_ms = Some(ms);
        self
    }

    /// The Chat Completions SSE body as the pieces written one by one (before `split_every`).
    pub fn sse_pieces(&self) -> Vec<String> {
        self.sse_pieces_for(Wire::Chat)
    }

    /// The SSE body in `wire`'s format as the pieces written one by one (before
    /// `split_every` / `cut_in_piece`). Raw SSE is the same on every route.
    pub fn sse_pieces_for(&self, wire: Wire) -> Vec<String> {
        match &self.body {
            Body::Scripted {
                text,
                thinking,
                calls,
                finish,
                usage,
                cache,
                done,
                style,
                parts,
            } => {
                let s = Script {
                    text: text.as_deref(),
                    thinking: thinking.as_deref(),
                    calls,
                    finish,
                    usage: *usage,
                    cache: *cache,
                    done: *done,
                    style,
                    parts: *parts,
                };
                match wire {
                    Wire::Chat => chat_events(&s),
                    Wire::Anthropic => anthropic_events(&s),
                    Wire::Responses => responses_events(&s),
                }
            }
            Body::RawSse(s) => vec![s.clone()],
            Body::Status { .. } => Vec::new(),
        }
    }
}

/// A cut chosen at serve time (see [`Reply::cut_in_middle`], [`Reply::stall_after_first_text`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Half of the middle piece, or of the first piece streaming reasoning or text if earlier.
    Middle,
    /// Everything up to the first piece with visible text, whole.
    AfterFirstText,
}

/// Whether an SSE piece streams visible text (Chat `delta.content`, Anthropic `text_delta`,
/// Responses `response.output_text.delta`).
fn streams_text(piece: &str) -> bool {
    if piece.contains("\"text_delta\"") || piece.contains("response.output_text.delta") {
        return true;
    }
    piece
        .strip_prefix("data: ")
        .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .is_some_and(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
}

/// Whether an SSE piece streams anything the client is shown: text or reasoning.
fn streams_to_client(piece: &str) -> bool {
    let reasoning = [
        "\"thinking_delta\"",
        "reasoning_summary_text.delta",
        "reasoning_text.delta",
    ];
    if streams_text(piece) || reasoning.iter().any(|r| piece.contains(r)) {
        return true;
    }
    piece
        .strip_prefix("data: ")
        .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .is_some_and(|v| {
            let delta = &v["choices"][0]["delta"];
            ["reasoning_content", "reasoning"]
                .iter()
                .any(|f| delta[f].as_str().is_some_and(|c| !c.is_empty()))
        })
}

/// The parts of a scripted stream.
struct Script<'a> {
    text: Option<&'a str>,
    thinking: Option<&'a str>,
    calls: &'a [(String, String, String)],
    finish: &'a str,
    usage: Option<(u64, u64)>,
    cache: Option<(u64, u64)>,
    done: bool,
    style: &'a Style,
    parts: usize,
}

fn chunk(delta: Value, finish: Value) -> String {
    let obj = json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {obj}\n\n")
}

/// Splits `s` into about `parts` pieces on character boundaries (each non-empty).
fn split_chars(s: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(parts.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn chat_events(s: &Script<'_>) -> Vec<String> {
    let Script {
        text,
        thinking,
        calls,
        finish,
        usage,
        cache,
        done,
        style,
        parts,
    } = *s;
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(thinking) = thinking {
        let field = style.reasoning_field.unwrap_or("reasoning_content");
        for piece in split_chars(thinking, parts) {
            out.push(chunk(json!({field: piece}), Value::Null));
        }
    }
    if let Some(text) = text {
        for piece in split_chars(text, parts) {
            out.push(chunk(json!({"content": piece}), Value::Null));
        }
    }
    for (index, (id, name, args)) in calls.iter().enumerate() {
        if style.calls_at_index_0 {
            // Ollama: each call whole, with its own id, all at index 0 (case C37).
            let call = json!({"index": 0, "id": id, "type": "function",
                              "function": {"name": name, "arguments": args}});
            out.push(chunk(json!({"tool_calls": [call]}), Value::Null));
            continue;
        }
        let mut pieces = split_chars(args, 3);
        while pieces.len() < 2 {
            pieces.push(String::new());
        }
        for (k, piece) in pieces.into_iter().enumerate() {
            let call = if k == 0 {
                json!({"index": index, "id": id, "type": "function",
                       "function": {"name": name, "arguments": piece}})
            } else {
                json!({"index": index, "function": {"arguments": piece}})
            };
            out.push(chunk(json!({"tool_calls": [call]}), Value::Null));
        }
    }
    out.push(chunk(json!({}), json!(finish)));
    if let Some((prompt, completion)) = usage {
        let mut obj = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "test-model",
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        });
        if let Some((read, write)) = cache {
            obj["usage"]["prompt_tokens_details"] = json!({"cached_tokens": read});
            if write > 0 {
                obj["usage"]["prompt_tokens_details"]["cache_write_tokens"] = json!(write);
            }
        }
        out.push(format!("data: {obj}\n\n"));
    }
    if done {
        out.push("data: [DONE]\n\n".to_string());
    }
    out
}

/// The argument text of one call split into at least two pieces (the second may be empty).
fn argument_pieces(args: &str) -> Vec<String> {
    let mut pieces = split_chars(args, 3);
    while pieces.len() < 2 {
        pieces.push(String::new());
    }
    pieces
}

fn anthropic_event(kind: &str, data: &Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

/// Anthropic Messages stream (SPEC L6): `message_start`, `ping`, a thinking block, a text block,
/// one `tool_use` block per call, `message_delta`, `message_stop`.
fn anthropic_events(s: &Script<'_>) -> Vec<String> {
    let mut message = json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "content": [],
        "model": "test-model", "stop_reason": null, "stop_sequence": null,
    });
    if let Some((input, _)) = s.usage {
        message["usage"] = json!({"input_tokens": input, "output_tokens": 1});
        if let Some((read, write)) = s.cache {
            // Anthropic counts the three parts apart: `input_tokens` is the rest.
            message["usage"] = json!({"input_tokens": input.saturating_sub(read + write),
                "cache_read_input_tokens": read, "cache_creation_input_tokens": write,
                "output_tokens": 1});
        }
    }
    let mut out = vec![
        anthropic_event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ),
        anthropic_event("ping", &json!({"type": "ping"})),
    ];
    let mut index = 0u64;
    let delta = |index: u64, delta: Value| {
        anthropic_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    };
    let start = |index: u64, block: Value| {
        anthropic_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    };
    let stop = |index: u64| {
        anthropic_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        )
    };
    if let Some(thinking) = s.thinking {
        out.push(start(
            index,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
        ));
        for piece in split_chars(thinking, s.parts) {
            out.push(delta(
                index,
                json!({"type": "thinking_delta", "thinking": piece}),
            ));
        }
        let signature = s.style.signature.as_deref().unwrap_or("sig-fake");
        out.push(delta(
            index,
            json!({"type": "signature_delta", "signature": signature}),
        ));
        out.push(stop(index));
        index += 1;
    }
    if let Some(text) = s.text {
        out.push(start(index, json!({"type": "text", "text": ""})));
        for piece in split_chars(text, s.parts) {
            out.push(delta(index, json!({"type": "text_delta", "text": piece})));
        }
        out.push(stop(index));
        index += 1;
    }
    for (id, name, args) in s.calls {
        out.push(start(
            index,
            json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
        ));
        for piece in argument_pieces(args) {
            out.push(delta(
                index,
                json!({"type": "input_json_delta", "partial_json": piece}),
            ));
        }
        out.push(stop(index));
        index += 1;
    }
    let reason = match s.finish {
        "stop" => "end_turn",
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        "content_filter" => "refusal",
        other => other,
    };
    let mut message_delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": null},
    });
    if let Some((_, output)) = s.usage {
        message_delta["usage"] = json!({"output_tokens": output});
    }
    out.push(anthropic_event("message_delta", &message_delta));
    if s.done {
        out.push(anthropic_event(
            "message_stop",
            &json!({"type": "message_stop"}),
        ));
    }
    out
}

/// OpenAI Responses stream (SPEC L8): `response.created`, a reasoning item, a message item with
/// `output_text` deltas, one `function_call` item per call, `response.completed` (or
/// `response.incomplete`) with usage.
fn responses_events(s: &Script<'_>) -> Vec<String> {
    let mut seq = 0u64;
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        format!("event: {kind}\ndata: {data}\n\n")
    };
    let mut out = vec![event(
        "response.created",
        json!({"response": {"id": "resp_fake", "object": "response", "status": "in_progress",
                            "model": "test-model", "output": []}}),
    )];
    let mut output = Vec::new();
    let mut index = 0u64;
    if let Some(thinking) = s.thinking {
        let item = json!({"id": "rs_fake", "type": "reasoning", "summary": []});
        let mut done_item = json!({"id": "rs_fake", "type": "reasoning",
            "summary": [{"type": "summary_text", "text": thinking}]});
        if let Some(enc) = &s.style.encrypted_reasoning {
            done_item["encrypted_content"] = json!(enc);
        }
        out.push(event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        out.push(event(
            "response.reasoning_summary_part.added",
            json!({"item_id": "rs_fake", "output_index": index, "summary_index": 0,
                   "part": {"type": "summary_text", "text": ""}}),
        ));
        for piece in split_chars(thinking, s.parts) {
            out.push(event(
                "response.reasoning_summary_text.delta",
                json!({"item_id": "rs_fake", "output_index": index, "summary_index": 0,
                       "delta": piece}),
            ));
        }
        out.push(event(
            "response.output_item.done",
            json!({"output_index": index, "item": done_item}),
        ));
        output.push(done_item);
        index += 1;
    }
    if let Some(text) = s.text {
        let id = "msg_fake";
        out.push(event(
            "response.output_item.added",
            json!({"output_index": index, "item": {"id": id, "type": "message",
                   "status": "in_progress", "role": "assistant", "content": []}}),
        ));
        out.push(event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        ));
        for piece in split_chars(text, s.parts) {
            out.push(event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "delta": piece}),
            ));
        }
        out.push(event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
        ));
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        out.push(event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        ));
        let item = json!({"id": id, "type": "message", "status": "completed",
                          "role": "assistant", "content": [part]});
        out.push(event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        output.push(item);
        index += 1;
    }
    for (k, (call_id, name, args)) in s.calls.iter().enumerate() {
        let id = format!("fc_fake_{k}");
        out.push(event(
            "response.output_item.added",
            json!({"output_index": index, "item": {"id": id, "type": "function_call",
                   "status": "in_progress", "call_id": call_id, "name": name,
                   "arguments": ""}}),
        ));
        for piece in argument_pieces(args) {
            out.push(event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": piece}),
            ));
        }
        out.push(event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": args}),
        ));
        let item = json!({"id": id, "type": "function_call", "status": "completed",
                          "call_id": call_id, "name": name, "arguments": args});
        out.push(event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        output.push(item);
        index += 1;
    }
    if s.done {
        let usage = s.usage.map_or(Value::Null, |(input, output)| {
            let mut u = json!({"input_tokens": input, "output_tokens": output,
                   "total_tokens": input + output});
            if let Some((read, _)) = s.cache {
                u["input_tokens_details"] = json!({"cached_tokens": read});
            }
            u
        });
        let (kind, status, details) = match s.finish {
            "length" => (
                "response.incomplete",
                "incomplete",
                json!({"reason": "max_output_tokens"}),
            ),
            "content_filter" => (
                "response.incomplete",
                "incomplete",
                json!({"reason": "content_filter"}),
            ),
            _ => ("response.completed", "completed", Value::Null),
        };
        out.push(event(
            kind,
            json!({"response": {"id": "resp_fake", "object": "response", "status": status,
                                "model": "test-model", "output": output,
                                "incomplete_details": details, "usage": usage}}),
        ));
    }
    out
}

type Handler = dyn Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static;

struct Shared {
    /// The scenario's requests (counted replies only).
    requests: Mutex<Vec<RecordedRequest>>,
    /// Every request, rejected and injected-error attempts included.
    all_requests: Mutex<Vec<RecordedRequest>>,
    /// Numbering, answering and recording of one request happen under this lock.
    order: Mutex<()>,
    handler: Box<Handler>,
    stop: AtomicBool,
    options: Options,
    /// Connections accepted.
    connections: AtomicU64,
    /// Request body bytes received, over all requests.
    body_bytes: AtomicU64,
    /// The largest request body received, bytes.
    largest_body: AtomicU64,
    /// Paced pieces written ([`Reply::pace_ms`]).
    piece_writes: Mutex<Vec<PieceWrite>>,
}

/// How the server behaves beyond the script ([`FakeLlm::with_options`]).
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// HTTP/1.1 persistent connections: replies carry no `connection: close` and the server
    /// reads the next request on the same connection (until the client closes it, sends
    /// `connection: close`, or stays idle for 60 s). Off by default: one request per connection.
    pub keep_alive: bool,
    /// Parse every request body as JSON and keep it in [`FakeLlm::requests`]. On by default;
    /// off, [`RecordedRequest::body`] is `null` (long benchmark sessions send hundreds of MiB
    /// of history, which the fake then neither parses nor keeps).
    pub record_bodies: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            keep_alive: false,
            record_bodies: true,
        }
    }
}

/// When one piece of a paced reply ([`Reply::pace_ms`]) was written to the socket.
#[derive(Debug, Clone, Copy)]
pub struct PieceWrite {
    /// Index of the request the reply answers.
    pub request: usize,
    /// Index of the piece in [`Reply::sse_pieces_for`] of the request's wire.
    pub piece: usize,
    /// Just after the write of the whole HTTP chunk returned.
    pub at: Instant,
}

/// How long a kept-alive connection may stay idle before the server closes it.
const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(60);

/// The fake LLM server. Dropping it stops the accept loop.
pub struct FakeLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    /// The dialect profile it speaks ([`FakeLlm::dialect`]), if any.
    pub(crate) dialect: Option<crate::dialects::Dialect>,
}

/// OpenAI's answer on Chat Completions for a model only the Responses API serves (`o1-pro`,
/// `gpt-5-pro`, the `…-codex` models), sent with status 404.
pub const RESPONSES_ONLY_BODY: &str = r#"{"error":{"message":"This model is only supported in v1/responses and not in v1/chat/completions.","type":"invalid_request_error","param":"model","code":null}}"#;

/// What an OpenAI endpoint where `model` exists only on the Responses API answers `req`: a
/// Chat Completions request for it gets the 404 [`RESPONSES_ONLY_BODY`] (not one of the
/// scenario's requests, see [`Reply::uncounted`]); `None` for any other request (the script's).
pub fn responses_only(model: &str, req: &RecordedRequest) -> Option<Reply> {
    (req.wire() == Wire::Chat && req.body["model"] == model).then(|| {
        Reply::status(
            404,
            vec![("content-type", "application/json")],
            RESPONSES_ONLY_BODY,
        )
        .uncounted()
    })
}

/// Body of the 500 answered when a script runs out.
pub const EXHAUSTED_BODY: &str = r#"{"error":{"message":"fake llm: script exhausted"}}"#;

impl FakeLlm {
    /// The n-th request gets the n-th reply; past the end, HTTP 500 with [`EXHAUSTED_BODY`].
    pub fn scripted(replies: Vec<Reply>) -> Self {
        FakeLlm::with_handler(move |i, _| {
            replies.get(i).cloned().unwrap_or_else(|| {
                Reply::status(
                    500,
                    vec![("content-type", "application/json")],
                    EXHAUSTED_BODY,
                )
            })
        })
    }

    /// Every request is answered by `handler(request index, request)`.
    pub fn with_handler(
        handler: impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        FakeLlm::with_options(Options::default(), handler)
    }

    /// [`FakeLlm::with_handler`] with `options` (keep-alive, body recording).
    pub fn with_options(
        options: Options,
        handler: impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake llm: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake llm: local addr");
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            all_requests: Mutex::new(Vec::new()),
            order: Mutex::new(()),
            handler: Box::new(handler),
            stop: AtomicBool::new(false),
            options,
            connections: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
            largest_body: AtomicU64::new(0),
            piece_writes: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("fake-llm-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    s.connections.fetch_add(1, Ordering::Relaxed);
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("fake-llm-conn".into())
                        .spawn(move || {
                            let _ = serve_connection(conn, &s);
                        });
                }
            })
            .expect("fake llm: spawn accept thread");
        FakeLlm {
            addr,
            shared,
            accept: Some(accept),
            dialect: None,
        }
    }

    /// The dialect profile this server speaks, if any.
    pub fn dialect_profile(&self) -> Option<crate::dialects::Dialect> {
        self.dialect
    }

    /// `http://127.0.0.1:PORT/v1`, the value for `OPENAI_COMPAT_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT`, e.g. for `ANTHROPIC_BASE_URL`.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order, including those a dialect profile
    /// rejected or answered with an injected error ([`FakeLlm::requests`] leaves them out).
    pub fn all_requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .all_requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// The requests received so far, in arrival order (a dialect profile's rejected and
    /// injected-error attempts left out).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// How many requests arrived so far (cheaper than [`FakeLlm::requests`]).
    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// How many TCP connections were accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Request body bytes received so far, over all requests.
    pub fn body_bytes(&self) -> u64 {
        self.shared.body_bytes.load(Ordering::Relaxed)
    }

    /// The largest request body received so far, in bytes.
    pub fn largest_body(&self) -> u64 {
        self.shared.largest_body.load(Ordering::Relaxed)
    }

    /// The pieces of paced replies written so far ([`Reply::pace_ms`]), in write order.
    pub fn piece_writes(&self) -> Vec<PieceWrite> {
        self.shared
            .piece_writes
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default()
    }

    /// Waits until at least `n` requests arrived; returns them.
    pub fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<RecordedRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.requests();
            if r.len() >= n || Instant::now() >= deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Reads one request from the connection; `None` at a clean EOF before its first line.
/// Returns the request and the number of body bytes on the wire.
fn read_request(
    reader: &mut BufReader<TcpStream>,
    record_body: bool,
) -> std::io::Result<Option<(RecordedRequest, u64)>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if size == 0 {
                let mut trailer = String::new();
                reader.read_line(&mut trailer)?;
                break;
            }
            let start = body.len();
            body.resize(start + size + 2, 0);
            reader.read_exact(&mut body[start..])?;
            body.truncate(start + size);
        }
    } else if let Some(len) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body)?;
    }
    let wire_bytes = body.len() as u64;
    let body = if record_body {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    } else {
        Value::Null
    };
    Ok(Some((
        RecordedRequest {
            method,
            path,
            headers,
            body,
            received_at: Instant::now(),
        },
        wire_bytes,
    )))
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// Sleeps up to `ms`, returning early when the server is being dropped.
fn sleep_unless_stopped(ms: u64, shared: &Shared) {
    let deadline = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < deadline && !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5).min(deadline - Instant::now()));
    }
}

/// Serves the requests of one connection: one, or with keep-alive every request until the
/// client closes, asks for `connection: close`, stays idle or a reply cuts the stream.
fn serve_connection(conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let keep_alive = shared.options.keep_alive;
    if keep_alive {
        conn.set_read_timeout(Some(KEEP_ALIVE_IDLE))?;
    }
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    loop {
        let Some((req, wire_bytes)) = read_request(&mut reader, shared.options.record_bodies)?
        else {
            return Ok(());
        };
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let close = !keep_alive
            || req
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        match serve_request(&mut conn, req, wire_bytes, close, shared)? {
            Served::Whole if !close => continue,
            Served::Whole => break,
            Served::Cut => return Ok(()),
        }
    }
    let _ = conn.shutdown(Shutdown::Write);
    // Drain whatever the client still sends so the close is orderly.
    conn.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut sink = [0u8; 1024];
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

/// How a reply ended.
enum Served {
    /// The response is complete; the connection may carry another request.
    Whole,
    /// The body was cut on purpose ([`Reply::stall_after_ms`]) and the socket is shut down.
    Cut,
}

/// What every provider answers a body that is not JSON (a lone surrogate escape is enough:
/// strict JSON parsers reject it, SPEC L3b): a 400 in the route's error shape, not one of the
/// scenario's requests. `None` for a JSON body, or when bodies are not recorded.
fn not_json_body(req: &RecordedRequest, recorded: bool) -> Option<Reply> {
    // A form body (the fake authorization server's token requests, [`crate::fake_oauth`]) is
    // not a provider's business.
    let form = req
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if !recorded || req.method != "POST" || !req.body.is_string() || form {
        return None;
    }
    let message = "We could not parse the JSON body of your request: the body is not valid JSON";
    let body = match req.wire() {
        Wire::Anthropic => json!({"type": "error",
            "error": {"type": "invalid_request_error", "message": message}}),
        Wire::Chat | Wire::Responses => json!({"error": {"message": message,
            "type": "invalid_request_error", "param": null, "code": null}}),
    };
    Some(Reply::status(400, vec![], body.to_string()).uncounted())
}

/// Records `req`, asks the handler and writes its reply (with `connection: close` when `close`).
fn serve_request(
    conn: &mut TcpStream,
    req: RecordedRequest,
    wire_bytes: u64,
    close: bool,
    shared: &Shared,
) -> std::io::Result<Served> {
    shared.body_bytes.fetch_add(wire_bytes, Ordering::Relaxed);
    shared.largest_body.fetch_max(wire_bytes, Ordering::Relaxed);
    let (index, reply) = {
        let _order = shared
            .order
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let poisoned = |_| std::io::Error::other("poisoned");
        let index = shared.requests.lock().map_err(poisoned)?.len();
        let reply = match not_json_body(&req, shared.options.record_bodies) {
            Some(rejection) => rejection,
            None => (shared.handler)(index, &req),
        };
        shared
            .all_requests
            .lock()
            .map_err(poisoned)?
            .push(req.clone());
        if !reply.uncounted {
            shared.requests.lock().map_err(poisoned)?.push(req.clone());
        }
        (index, reply)
    };
    sleep_unless_stopped(reply.delay_ms, shared);
    let connection = if close { "connection: close\r\n" } else { "" };
    match &reply.body {
        Body::Status {
            code,
            headers,
            body,
        } => {
            let mut head = format!("HTTP/1.1 {code} {}\r\n", reason_phrase(*code));
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            {
                head.push_str("content-type: application/json\r\n");
            }
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str(&format!(
                "content-length: {}\r\n{connection}\r\n",
                body.len()
            ));
            conn.write_all(head.as_bytes())?;
            conn.write_all(body.as_bytes())?;
            conn.flush()?;
        }
        Body::Scripted { .. } | Body::RawSse(_) => {
            conn.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                     transfer-encoding: chunked\r\n{connection}\r\n"
                )
                .as_bytes(),
            )?;
            conn.flush()?;
            let wire = req.wire();
            let cut_in_piece = match reply.cut {
                Some(Cut::Middle) => {
                    let pieces = reply.sse_pieces_for(wire);
                    let first = pieces.iter().position(|p| streams_to_client(p));
                    Some(first.unwrap_or(usize::MAX).min(pieces.len() / 2))
                }
                Some(Cut::AfterFirstText) | None => reply.cut_in_piece,
            };
            let pieces: Vec<Vec<u8>> = match (reply.split_every, cut_in_piece) {
                (Some(n), _) => {
                    let all: Vec<u8> = reply.sse_pieces_for(wire).concat().into_bytes();
                    all.chunks(n).map(<[u8]>::to_vec).collect()
                }
                (None, Some(cut)) => {
                    let mut pieces: Vec<Vec<u8>> = reply
                        .sse_pieces_for(wire)
                        .into_iter()
                        .map(String::into_bytes)
                        .collect();
                    pieces.truncate(cut + 1);
                    if let Some(last) = pieces.get_mut(cut) {
                        last.truncate(last.len() / 2);
                    }
                    pieces
                }
                (None, None) => {
                    let mut pieces = reply.sse_pieces_for(wire);
                    if reply.cut == Some(Cut::AfterFirstText)
                        && let Some(at) = pieces.iter().position(|p| streams_text(p))
                    {
                        pieces.truncate(at + 1);
                    }
                    pieces.into_iter().map(String::into_bytes).collect()
                }
            };
            let mut chunk = Vec::new();
            for (k, piece) in pieces.into_iter().enumerate() {
                if piece.is_empty() {
                    continue;
                }
                // One write per HTTP chunk, as servers send them: the client wakes once per piece.
                chunk.clear();
                chunk.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                chunk.extend_from_slice(&piece);
                chunk.extend_from_slice(b"\r\n");
                conn.write_all(&chunk)?;
                conn.flush()?;
                if let Some(ms) = reply.pace_ms {
                    let at = Instant::now();
                    if let Ok(mut log) = shared.piece_writes.lock() {
                        log.push(PieceWrite {
                            request: index,
                            piece: k,
                            at,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(ms));
                }
                if reply.split_every.is_some() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if let Some(ms) = reply.stall_after_ms {
                sleep_unless_stopped(ms, shared);
                // Close without the terminating chunk: the body is cut.
                let _ = conn.shutdown(Shutdown::Both);
                return Ok(Served::Cut);
            }
            conn.write_all(b"0\r\n\r\n")?;
            conn.flush()?;
        }
    }
    Ok(Served::Whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one raw HTTP request; returns (head, de-chunked body, chunk sizes).
    fn raw_post(llm: &FakeLlm, body: &str) -> (String, String, Vec<usize>) {
        raw_post_to(llm, "/v1/chat/completions", body)
    }

    /// [`raw_post`] to `path`.
    fn raw_post_to(llm: &FakeLlm, path: &str, body: &str) -> (String, String, Vec<usize>) {
        let addr = llm.addr;
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer k\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8(raw[..split].to_vec()).unwrap();
        let mut rest = &raw[split + 4..];
        if !head.contains("transfer-encoding: chunked") {
            return (head, String::from_utf8(rest.to_vec()).unwrap(), Vec::new());
        }
        let mut body = Vec::new();
        let mut sizes = Vec::new();
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
            let after = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            sizes.push(size);
            body.extend_from_slice(&after[..size]);
            assert_eq!(&after[size..size + 2], b"\r\n");
            rest = &after[size + 2..];
        }
        (head, String::from_utf8(body).unwrap(), sizes)
    }

    fn data_lines(body: &str) -> Vec<String> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap().to_string())
            .collect()
    }

    #[test]
    fn text_reply_streams_deltas_stop_usage_and_done_as_separate_chunks() {
        let llm = FakeLlm::scripted(vec![Reply::text("Hello, world! How are you?")]);
        let (head, body, sizes) = raw_post(&llm, r#"{"model":"m","stream":true}"#);
        assert!(head.starts_with("HTTP/1.1 200 OK"));
        assert!(head.contains("content-type: text/event-stream"));
        assert!(head.contains("connection: close"));
        let lines = data_lines(&body);
        assert_eq!(sizes.len(), lines.len(), "one HTTP chunk per SSE event");
        assert_eq!(lines.last().unwrap(), "[DONE]");
        let events: Vec<Value> = lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello, world! How are you?");
        let deltas = events
            .iter()
            .filter(|e| {
                e["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
            .count();
        assert!(deltas >= 2, "text must come in several deltas");
        assert_eq!(
            events[events.len() - 2]["choices"][0]["finish_reason"],
            "stop"
        );
        assert_eq!(events[events.len() - 1]["choices"], json!([]));
        assert_eq!(events[events.len() - 1]["usage"]["total_tokens"], 110);
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].method, "POST");
        assert_eq!(reqs[0].path, "/v1/chat/completions");
        assert_eq!(reqs[0].header("Authorization"), Some("Bearer k"));
        assert_eq!(reqs[0].body["model"], "m");
    }

    #[test]
    fn tool_call_arguments_span_two_deltas_with_the_id_only_on_the_first() {
        let llm = FakeLlm::scripted(vec![
            Reply::tool_calls(vec![
                ("call_1", "fs__echo", json!({"text": "hi"})),
                ("call_2", "fs__add", json!({})),
            ])
            .with_text("Let me see."),
        ]);
        let (_, body, _) = raw_post(&llm, "{}");
        let lines = data_lines(&body);
        let events: Vec<Value> = lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut args = [String::new(), String::new()];
        let mut deltas = [0, 0];
        let mut ids = [Vec::new(), Vec::new()];
        for e in &events {
            for c in e["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let i = c["index"].as_u64().unwrap() as usize;
                deltas[i] += 1;
                args[i].push_str(c["function"]["arguments"].as_str().unwrap());
                if let Some(id) = c["id"].as_str() {
                    ids[i].push(id.to_string());
                }
            }
        }
        assert_eq!(
            serde_json::from_str::<Value>(&args[0]).unwrap(),
            json!({"text": "hi"})
        );
        assert_eq!(args[1], "{}");
        assert!(deltas[0] >= 2 && deltas[1] >= 2);
        assert_eq!(
            ids,
            [vec!["call_1".to_string()], vec!["call_2".to_string()]]
        );
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Let me see.");
        let finish: Vec<&Value> = events
            .iter()
            .map(|e| &e["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, vec![&json!("tool_calls")]);
    }

    #[test]
    fn split_every_cuts_the_body_into_small_chunks_and_exhausted_script_is_500() {
        let llm = FakeLlm::scripted(vec![Reply::text("naïve café 😀").split_every(7)]);
        let (_, body, sizes) = raw_post(&llm, "{}");
        assert!(sizes.iter().all(|&s| s <= 7) && sizes.len() > 10);
        assert!(body.ends_with("data: [DONE]\n\n"));
        assert!(body.contains("😀") || body.contains("\\ud83d"));
        let (head, body, _) = raw_post(&llm, "{}");
        assert!(head.starts_with("HTTP/1.1 500"), "{head}");
        assert_eq!(body, EXHAUSTED_BODY);
        assert_eq!(llm.requests().len(), 2);
    }

    #[test]
    fn status_reply_has_headers_and_content_length_and_stall_cuts_the_body() {
        let llm = FakeLlm::with_handler(|i, _| match i {
            0 => Reply::status(
                429,
                vec![("retry-after", "7")],
                r#"{"error":{"message":"slow down"}}"#,
            ),
            _ => Reply::raw_sse("data: {\"choices\":[]}\n\n").stall_after_ms(50),
        });
        let (head, body, _) = raw_post(&llm, "{}");
        assert!(head.starts_with("HTTP/1.1 429 Too Many Requests"));
        assert!(head.contains("retry-after: 7"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let started = Instant::now();
        let mut s = TcpStream::connect(llm.addr).unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let raw = String::from_utf8(raw).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(raw.contains("data: {\"choices\":[]}"));
        assert!(
            !raw.ends_with("0\r\n\r\n"),
            "a stalled body must not be terminated: {raw:?}"
        );
    }

    #[test]
    fn paired_history_passes_and_unanswered_call_fails() {
        let req = |messages: Value| RecordedRequest {
            method: "POST".into(),
            path: "/".into(),
            headers: vec![],
            body: json!({ "messages": messages }),
            received_at: Instant::now(),
        };
        let ok = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":"","tool_calls":[
                {"id":"a","type":"function","function":{"name":"x","arguments":"{}"}},
                {"id":"b","type":"function","function":{"name":"y","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"tool","tool_call_id":"b","content":"2"},
        ]));
        ok.assert_tool_calls_paired();
        assert_eq!(ok.tool_result_for("b").as_deref(), Some("2"));
        let bad = req(json!([
            {"role":"assistant","content":"","tool_calls":[
                {"id":"a","type":"function","function":{"name":"x","arguments":"{}"}}]},
            {"role":"user","content":"go on"},
        ]));
        assert!(std::panic::catch_unwind(|| bad.assert_tool_calls_paired()).is_err());
    }

    /// `(event name, data)` of each SSE event of a body.
    fn named_events(body: &str) -> Vec<(String, Value)> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let mut name = String::new();
                let mut data = Value::Null;
                for line in e.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = n.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(d).unwrap();
                    }
                }
                (name, data)
            })
            .collect()
    }

    fn script() -> Reply {
        Reply::tool_calls(vec![
            ("call_1", "fs__echo", json!({"text": "hi"})),
            ("call_2", "fs__add", json!({})),
        ])
        .with_text("Let me see.")
        .with_thinking("hmm")
        .usage(Some((40, 7)))
    }

    #[test]
    fn anthropic_route_streams_the_same_script_as_typed_events() {
        let llm = FakeLlm::scripted(vec![script(), Reply::text("done").without_done()]);
        let (head, body, sizes) = raw_post_to(&llm, "/v1/messages", "{}");
        assert!(head.contains("content-type: text/event-stream"));
        let events = named_events(&body);
        assert_eq!(sizes.len(), events.len(), "one HTTP chunk per event");
        for (name, data) in &events {
            assert_eq!(data["type"], json!(name), "event name = data.type");
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(&names[..2], ["message_start", "ping"]);
        assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 40);
        let delta = &events[events.len() - 2].1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["usage"]["output_tokens"], 7);
        let mut blocks: Vec<(String, String)> = Vec::new();
        for (name, data) in &events {
            match name.as_str() {
                "content_block_start" => {
                    assert_eq!(data["index"], blocks.len());
                    let b = &data["content_block"];
                    let label = match b["type"].as_str().unwrap() {
                        "tool_use" => format!("tool_use {} {}", b["id"], b["name"]),
                        other => other.to_string(),
                    };
                    blocks.push((label, String::new()));
                }
                "content_block_delta" => {
                    let i = data["index"].as_u64().unwrap() as usize;
                    let d = &data["delta"];
                    let piece = d["text"]
                        .as_str()
                        .or(d["thinking"].as_str())
                        .or(d["partial_json"].as_str())
                        .unwrap_or_default();
                    blocks[i].1.push_str(piece);
                }
                _ => {}
            }
        }
        assert_eq!(
            blocks,
            [
                ("thinking".to_string(), "hmm".to_string()),
                ("text".to_string(), "Let me see.".to_string()),
                (
                    "tool_use \"call_1\" \"fs__echo\"".to_string(),
                    r#"{"text":"hi"}"#.to_string()
                ),
                (
                    "tool_use \"call_2\" \"fs__add\"".to_string(),
                    "{}".to_string()
                ),
            ]
        );
        let json_deltas = events
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "input_json_delta" && d["index"] == 3)
            .count();
        assert!(json_deltas >= 2, "arguments span at least two deltas");
        // without_done leaves out message_stop.
        let (_, body, _) = raw_post_to(&llm, "/v1/messages", "{}");
        let names: Vec<String> = named_events(&body).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.last().map(String::as_str), Some("message_delta"));
        assert_eq!(llm.requests()[0].wire(), Wire::Anthropic);
    }

    #[test]
    fn responses_route_streams_items_deltas_and_completed_with_usage() {
        let llm = FakeLlm::scripted(vec![script(), Reply::text("cut").finish_reason("length")]);
        let (_, body, _) = raw_post_to(&llm, "/v1/responses", "{}");
        let events = named_events(&body);
        for (k, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], json!(name));
            assert_eq!(data["sequence_number"], k);
        }
        let text: String = events
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Let me see.");
        let thinking: String = events
            .iter()
            .filter(|(n, _)| n == "response.reasoning_summary_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(thinking, "hmm");
        let added: Vec<&Value> = events
            .iter()
            .filter(|(n, d)| {
                n == "response.output_item.added" && d["item"]["type"] == "function_call"
            })
            .map(|(_, d)| &d["item"])
            .collect();
        assert_eq!(added.len(), 2);
        assert_eq!(
            (&added[0]["call_id"], &added[0]["name"]),
            (&json!("call_1"), &json!("fs__echo"))
        );
        let args: String = events
            .iter()
            .filter(|(n, d)| {
                n == "response.function_call_arguments.delta" && d["item_id"] == added[0]["id"]
            })
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(args, r#"{"text":"hi"}"#);
        let (last, data) = events.last().unwrap();
        assert_eq!(last, "response.completed");
        assert_eq!(data["response"]["status"], "completed");
        assert_eq!(data["response"]["usage"]["input_tokens"], 40);
        assert_eq!(data["response"]["usage"]["output_tokens"], 7);
        assert_eq!(data["response"]["output"].as_array().unwrap().len(), 4);
        let (_, body, _) = raw_post_to(&llm, "/v1/responses", "{}");
        let (last, data) = named_events(&body).pop().unwrap();
        assert_eq!(last, "response.incomplete");
        assert_eq!(
            data["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }

    /// Reads one chunked response from a kept-alive connection: (head, de-chunked body).
    fn read_chunked(r: &mut BufReader<TcpStream>) -> (String, String) {
        let mut head = String::new();
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            if l == "\r\n" {
                break;
            }
            head.push_str(&l);
        }
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut buf = vec![0; size + 2];
            r.read_exact(&mut buf).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&buf[..size]);
        }
        (head, String::from_utf8(body).unwrap())
    }

    #[test]
    fn keep_alive_serves_requests_on_one_connection_and_counts_bytes_and_paced_pieces() {
        let llm = FakeLlm::with_options(
            Options {
                keep_alive: true,
                record_bodies: false,
            },
            |i, _| Reply::text(format!("reply {i} done")).deltas(4).pace_ms(1),
        );
        let mut s = TcpStream::connect(llm.addr).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        for (i, body) in ["{\"a\":1}", "{\"bb\":22}"].iter().enumerate() {
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let (head, text) = read_chunked(&mut r);
            assert!(!head.contains("connection: close"), "{head}");
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            let streamed: String = data_lines(&text)
                .iter()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter_map(|e| {
                    e["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(String::from)
                })
                .collect();
            assert_eq!(streamed, format!("reply {i} done"));
        }
        assert_eq!(llm.connections(), 1);
        assert_eq!(llm.body_bytes(), 7 + 9);
        assert_eq!(llm.largest_body(), 9);
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[1].body, Value::Null, "bodies are not recorded");
        // Every piece of both replies was paced: 1 role chunk + 4 deltas + finish + usage + DONE.
        let pieces = Reply::text("reply 0 done").deltas(4).sse_pieces().len();
        assert_eq!(pieces, 8);
        let writes = llm.piece_writes();
        assert_eq!(writes.len(), 2 * pieces);
        assert!(writes.windows(2).all(|w| w[0].at <= w[1].at));
        assert_eq!(
            writes
                .iter()
                .filter(|w| w.request == 1)
                .map(|w| w.piece)
                .collect::<Vec<_>>(),
            (0..pieces).collect::<Vec<_>>()
        );
        // A client asking to close gets `connection: close` and the server closes.
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .unwrap();
        let (head, _) = read_chunked(&mut r);
        assert!(head.contains("connection: close"), "{head}");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn cut_in_piece_sends_half_of_that_piece_and_no_final_chunk() {
        let reply = Reply::text("abcdefghi");
        let pieces = reply.sse_pieces_for(Wire::Anthropic);
        let llm = FakeLlm::scripted(vec![reply.cut_in_piece(4)]);
        let mut s = TcpStream::connect(llm.addr).unwrap();
        s.write_all(b"POST /v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let raw = String::from_utf8(raw).unwrap();
        let want = format!(
            "{}{}",
            pieces[..4].concat(),
            &pieces[4][..pieces[4].len() / 2]
        );
        let body: String = raw
            .split("\r\n")
            .skip_while(|l| !l.is_empty())
            .skip(1)
            .collect::<Vec<_>>()
            .chunks(2)
            .filter_map(|c| c.get(1).copied())
            .collect();
        assert_eq!(body, want);
        assert!(!raw.ends_with("0\r\n\r\n"), "the body must be cut: {raw:?}");
    }

    #[test]
    fn paired_history_on_the_anthropic_and_responses_routes() {
        let req = |path: &str, body: Value| RecordedRequest {
            method: "POST".into(),
            path: path.into(),
            headers: vec![],
            body,
            received_at: Instant::now(),
        };
        let ok = req(
            "/v1/messages",
            json!({"tools": [{"name": "fs__echo"}], "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "a", "name": "x", "input": {"k": 1}},
                    {"type": "tool_use", "id": "b", "name": "y", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                    {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "2"}]},
                    {"type": "text", "text": "go on"}]},
            ]}),
        );
        ok.assert_tool_calls_paired();
        assert_eq!(ok.tool_names(), ["fs__echo"]);
        assert_eq!(ok.user_text(), "higo on");
        assert_eq!(
            ok.assistant_tool_calls(),
            [
                ("a".to_string(), "x".to_string(), r#"{"k":1}"#.to_string()),
                ("b".to_string(), "y".to_string(), "{}".to_string())
            ]
        );
        assert_eq!(ok.tool_result_for("b").as_deref(), Some("2"));
        // A user text before the results, and a result in a later turn, both break L4.
        for bad in [
            json!([
                {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}]},
                {"role": "user", "content": [{"type": "text", "text": "first"},
                                             {"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
            ]),
            json!([
                {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x", "input": {}}]},
                {"role": "assistant", "content": [{"type": "text", "text": "again"}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
            ]),
        ] {
            let r = req("/v1/messages", json!({"messages": bad}));
            assert!(
                std::panic::catch_unwind(|| r.assert_tool_calls_paired()).is_err(),
                "{bad}"
            );
        }
        let ok = req(
            "/v1/responses",
            json!({"tools": [{"type": "function", "name": "fs__echo"}], "input": [
                {"role": "user", "content": "hi"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                {"type": "function_call", "call_id": "a", "name": "x", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "a", "output": "1"},
            ]}),
        );
        ok.assert_tool_calls_paired();
        assert_eq!(ok.tool_names(), ["fs__echo"]);
        assert_eq!(ok.tool_results(), [("a".to_string(), "1".to_string())]);
        let bad = req(
            "/v1/responses",
            json!({"input": [
                {"type": "function_call", "call_id": "a", "name": "x", "arguments": "{}"},
                {"role": "user", "content": "too early"},
            ]}),
        );
        assert!(std::panic::catch_unwind(|| bad.assert_tool_calls_paired()).is_err());
        assert_eq!(Wire::from_path("/v1/chat/completions?x=1"), Wire::Chat);
        assert_eq!(Wire::from_path("/v1/messages"), Wire::Anthropic);
        assert_eq!(Wire::from_path("/api/v1/responses/"), Wire::Responses);
    }
}
