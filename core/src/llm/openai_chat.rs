//! OpenAI Chat Completions (SPEC L7): the request builder and the streamed-response decoder.
//!
//! Works with OpenAI and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, LiteLLM,
//! DashScope, NIM, …), so the decoder accepts the known deviations (cases C21–C24, C26).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

use super::request::{
    BodyCache, CacheKey, ErrorText, Last, Planned, WireElement, arguments_or_empty_object,
    assemble, bearer, body_capacity, history_json, push_item, streaming_json_post, write_field,
    write_json,
};
use super::route::{
    ErrorReaction, Learned, ProviderRoute, drop_prompt_cache_key, drop_reasoning_effort,
    is_openai_reasoning_model, names_responses_api, openai_effort, rejects_field,
    sends_prompt_cache_key, upgrade_to_responses,
};
use super::sse_stream::{
    CallSlot, EventHandler, JsonStr, SseState, StreamedText, non_empty, parse_event_json,
    read_view, take_calls,
};
use crate::config::{Config, Effort};
use crate::json::parse_lossy;
use crate::llm::{
    ChatReasoningField, HttpRequest, LlmRequest, LlmResponse, Message, ReasoningBlock, StopKind,
    StreamDecoder, StreamDelta, StreamError, TOOL_RESULTS_BRIDGE, ToolCall, ToolDef, Usage,
};
use crate::sse::SseEvent;

/// Build the streaming `POST {base_url}/chat/completions` request (SPEC L7).
///
/// * `base_url`: e.g. `http://127.0.0.1:5000/v1` (a trailing `/` is tolerated).
/// * `api_key`: sent as `authorization: Bearer <key>` only when non-empty (local servers).
/// * Headers: `content-type: application/json`, `accept: text/event-stream`.
/// * Body (compact JSON, keys in this order): `model`; `messages` (the system prompt first
///   when present and non-empty, then the history: user → `{"role":"user","content"}`,
///   assistant → `{"role":"assistant","content"}` with `""` when empty (L7) plus
///   `tool_calls:[{"id","type":"function","function":{"name","arguments"}}]` when it called
///   tools, `arguments` being the model's own text or `"{}"` when that was blank (C26); tool
///   result → `{"role":"tool","tool_call_id","content"}` with `Error: ` prefixed to an error
///   result); `tools` (omitted when empty, e.g. the compaction call); `stream:true`;
///   `stream_options:{"include_usage":true}`; the output cap (`req.max_output_tokens`) as
///   `max_tokens`, or as `max_completion_tokens` when `options.max_completion_tokens` says so
///   (OpenAI's reasoning models reject `max_tokens`, SPEC L7, case C41; many
///   OpenAI-compatible servers know only `max_tokens`).
///
/// Strict chat templates (Mistral and Gemma in vLLM and llama.cpp, Mistral's own validator)
/// reject some role sequences, so the history is sent normalized (SPEC L10, case C61):
/// consecutive user messages are one message (texts joined with a blank line: a compaction
/// summary and the live prompt); consecutive assistant messages are one message (texts joined,
/// calls in order: a hook's synthetic call after the model's answer); an assistant message with
/// no text, no call and no reasoning is not sent; a user message right after tool results is
/// preceded by the assistant message [`TOOL_RESULTS_BRIDGE`].
///
/// Reasoning (SPEC L10): the reasoning text of an assistant message is sent back under the
/// field it arrived in (`reasoning_content` — DeepSeek and Moonshot require it back in a turn
/// that called tools; `reasoning` — OpenRouter, Ollama, vLLM, Groq accept their own field), and
/// OpenRouter's `reasoning_details` verbatim (it carries the signatures Anthropic and Gemini
/// models need back). Text that arrived in no field (another route's) is not sent. With
/// `options.reasoning_content` (a DeepSeek-style server) every assistant message carries
/// `reasoning_content`, `""` when it has none: DeepSeek's thinking mode rejects an assistant
/// message without the field in a turn that called tools, and the agent's own messages (hook
/// calls, the bridge) have no reasoning.
///
/// Serialized in one pass straight into the body buffer: linear in the history size. With a
/// session's [`BodyCache`] ([`build_request_cached`]) only the messages new since the last
/// request are serialized, and the body is the same bytes.
#[cfg(test)]
#[must_use]
pub(crate) fn build_request(
    base_url: &str,
    api_key: &str,
    req: &LlmRequest<'_>,
    options: &ChatOptions,
) -> HttpRequest {
    build_request_cached(base_url, api_key, req, options, None)
}

/// [`build_request`], reusing and extending `cache`, which holds the serialized messages of
/// `req.messages` as sent by earlier requests of the same history (issue #15). The body is
/// byte for byte the one [`build_request`] builds; its history part is a piece shared with the
/// cache.
#[must_use]
pub(crate) fn build_request_cached(
    base_url: &str,
    api_key: &str,
    req: &LlmRequest<'_>,
    options: &ChatOptions,
    cache: Option<&mut BodyCache>,
) -> HttpRequest {
    let mut head = Vec::with_capacity(256 + req.system.map_or(0, str::len));
    head.push(b'{');
    write_field(&mut head, "model", req.model);
    head.extend_from_slice(b",\"messages\":[");
    let system = req.system.filter(|s| !s.is_empty());
    if let Some(system) = system {
        write_json(
            &mut head,
            &TextMessage {
                role: "system",
                content: system,
            },
        );
    }
    let capacity = if cache.is_none() {
        body_capacity(req, 64)
    } else {
        0
    };
    let key = CacheKey::Chat {
        reasoning_content: options.reasoning_content,
    };
    let history = history_json(
        req.messages,
        cache.map(|c| (c, key)),
        capacity,
        None,
        |history, start, last| plan(history, start, last, options),
    );
    let mut tail = Vec::with_capacity(128);
    tail.push(b']');
    if !req.tools.is_empty() {
        write_field(&mut tail, "tools", &WireTools(req.tools));
    }
    write_field(&mut tail, "stream", &true);
    write_field(
        &mut tail,
        "stream_options",
        &StreamOptions {
            include_usage: true,
        },
    );
    let cap_name = if options.max_completion_tokens {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    write_field(&mut tail, cap_name, &req.max_output_tokens);
    if let Some(cache) = req.cache.filter(|_| options.prompt_cache_key) {
        write_field(&mut tail, "prompt_cache_key", cache.key);
    }
    if let Some(effort) = req.effort.filter(|_| options.reasoning_effort) {
        write_field(&mut tail, "reasoning_effort", openai_effort(effort));
    }
    tail.push(b'}');
    streaming_json_post(
        format!("{}/chat/completions", base_url.trim_end_matches('/')),
        bearer(api_key),
        assemble(head, system.is_some(), history, &tail),
    )
}

/// Whether `model` is DeepSeek's thinking model as its own API names it (`deepseek-reasoner`),
/// whose tool loops need `reasoning_content` on every assistant message (SPEC L10): known
/// before its first answer, so that a request that opens with the agent's own messages (a
/// `_SessionStart` injection, H10) is valid too. Gateways name it otherwise and use their own
/// reasoning field; they are learned from what they stream.
#[must_use]
pub(crate) fn is_deepseek_reasoner(model: &str) -> bool {
    model.eq_ignore_ascii_case("deepseek-reasoner")
}

/// The Chat Completions options for one request (SPEC L7, L10): the output cap goes as
/// `max_completion_tokens` for OpenAI's own endpoint (`api.openai.com`, which accepts it for
/// every model and requires it for reasoning models), for an OpenAI reasoning model name
/// anywhere, and once a server asked for it (`learned`); else as `max_tokens`, which every
/// OpenAI-compatible server accepts. `reasoning_content` goes on every assistant message once
/// the server streamed it, or for `deepseek-reasoner` from the start. `prompt_cache_key` as
/// `sends_prompt_cache_key` (route.rs) says.
#[must_use]
pub(crate) fn chat_options(cfg: &Config, model: &str, learned: &Learned) -> ChatOptions {
    ChatOptions {
        max_completion_tokens: learned.max_completion_tokens
            || is_openai_reasoning_model(model)
            || cfg.base_url.contains("://api.openai.com"),
        reasoning_content: learned.reasoning_content || is_deepseek_reasoner(model),
        prompt_cache_key: sends_prompt_cache_key(cfg, learned),
        reasoning_effort: !learned.no_reasoning_effort,
    }
}

/// Whether a failed Chat Completions request should be retried with the output cap renamed:
/// a 400 whose body names `max_completion_tokens` while the request sent `max_tokens` (SPEC L7,
/// case C41).
#[must_use]
pub(crate) fn wants_max_completion_tokens(status: u16, body: &[u8], sent: &ChatOptions) -> bool {
    status == 400
        && !sent.max_completion_tokens
        && String::from_utf8_lossy(body).contains("max_completion_tokens")
}

/// The Chat Completions route (SPEC L7): [`build_request_cached`] with [`chat_options`],
/// [`ChatDecoder`]; a 400 or 404 naming `v1/responses` sends the model's requests on the
/// Responses route from then on (SPEC L8, `route_kind`, route.rs); a 400 naming
/// `max_completion_tokens` renames the output cap once (C41);
/// a streamed `reasoning_content` puts the field on every assistant message from then on
/// (SPEC L10).
pub(crate) struct ChatCompletions;

impl ProviderRoute for ChatCompletions {
    fn build_request(
        &self,
        cfg: &Config,
        req: &LlmRequest<'_>,
        learned: &Learned,
        cache: Option<&mut BodyCache>,
    ) -> HttpRequest {
        let options = chat_options(cfg, req.model, learned);
        build_request_cached(&cfg.base_url, &cfg.api_key, req, &options, cache)
    }

    fn decoder(&self, id_prefix: String) -> Box<dyn StreamDecoder> {
        Box::new(ChatDecoder::new(id_prefix))
    }

    /// C41: the server rejected `max_tokens` and named `max_completion_tokens`: the name is
    /// remembered for the process and the attempt sent again (once: the request now uses the
    /// new name, so the same answer does not bring it here again).
    fn on_http_error(
        &self,
        cfg: &Config,
        model: &str,
        effort: Option<Effort>,
        status: u16,
        body: &[u8],
        learned: &mut Learned,
    ) -> Option<ErrorReaction> {
        // SPEC L8: a model served only by the Responses API goes there (not back here: no
        // loop).
        if names_responses_api(status, body) {
            return Some(upgrade_to_responses(learned, model));
        }
        let sent = chat_options(cfg, model, learned);
        if wants_max_completion_tokens(status, body, &sent) {
            learned.max_completion_tokens = true;
            return Some(ErrorReaction::resend(
                "llm: the server rejected max_tokens and asked for max_completion_tokens; sending the output cap under that name from now on".into(),
            ));
        }
        // A round's request carried the key when the options allowed it (SPEC L11).
        if sent.prompt_cache_key && rejects_field(status, body, "prompt_cache_key") {
            return Some(drop_prompt_cache_key(learned));
        }
        // SPEC L12: a server that does not take the effort gets requests without it.
        if effort.is_some()
            && sent.reasoning_effort
            && rejects_field(status, body, "reasoning_effort")
        {
            return Some(drop_reasoning_effort(learned, "reasoning_effort"));
        }
        None
    }

    /// SPEC L10: a DeepSeek-style server; its thinking mode wants the field on every assistant
    /// message of a turn that called tools, the agent's own included.
    fn on_response(&self, resp: &LlmResponse, learned: &mut Learned) {
        if resp.reasoning.contains(&ReasoningBlock::ChatField(
            ChatReasoningField::ReasoningContent,
        )) {
            learned.reasoning_content = true;
        }
    }
}

/// The per-server choices of a Chat Completions request (SPEC L7), decided by
/// [`chat_options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChatOptions {
    /// Send the output cap as `max_completion_tokens` instead of `max_tokens` (case C41).
    pub max_completion_tokens: bool,
    /// The server streams DeepSeek-style `reasoning_content`: every assistant message carries
    /// the field, `""` when it has no reasoning (DeepSeek's thinking mode rejects an assistant
    /// message without it in a turn that called tools, SPEC L10).
    pub reasoning_content: bool,
    /// Send the request's prompt cache key as `prompt_cache_key` (SPEC L11), when it has one.
    pub prompt_cache_key: bool,
    /// Send the request's effort as `reasoning_effort` (SPEC L12), when it has one: until the
    /// server rejected the field.
    pub reasoning_effort: bool,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One message as sent: consecutive messages of one role merged (SPEC L10, case C61).
enum Element<'a> {
    /// User texts, joined with a blank line.
    User(Vec<&'a str>),
    /// Assistant messages merged into one: their texts, reasoning and calls in order.
    Assistant(Vec<&'a Message>),
    /// A tool result.
    Tool(&'a Message),
    /// The short assistant message between tool results and a following user message.
    Bridge,
}

/// An [`Element`] with the options it is written under.
struct Wire<'a> {
    element: Element<'a>,
    options: &'a ChatOptions,
}

impl WireElement for Wire<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match &self.element {
            Element::User(texts) => push_item(out, &UserMessage(texts)),
            Element::Assistant(parts) => push_item(
                out,
                &AssistantMessage {
                    parts,
                    options: self.options,
                },
            ),
            Element::Tool(message) => push_item(out, &ToolMessage(message)),
            Element::Bridge => push_item(
                out,
                &AssistantMessage {
                    parts: &[],
                    options: self.options,
                },
            ),
        }
    }
}

/// `history[start..]` as the Chat messages to send (see [`build_request`]), `last` being the
/// message sent before `start`: never two user or two assistant messages in a row, never an
/// empty assistant message, never a user message right after a tool result.
fn plan<'a>(
    history: &'a [Message],
    start: usize,
    last: Last,
    options: &'a ChatOptions,
) -> Vec<Planned<Wire<'a>>> {
    let item = |element, source, kind, closed| Planned {
        element: Wire { element, options },
        source,
        kind,
        closed,
    };
    let mut out: Vec<Planned<Wire<'a>>> = Vec::with_capacity(history.len().saturating_sub(start));
    for (i, message) in history.iter().enumerate().skip(start) {
        let prev = out.last().map_or(last, |p| p.kind);
        match message {
            Message::User { text } => match (prev, out.last_mut()) {
                (
                    Last::User,
                    Some(Planned {
                        element:
                            Wire {
                                element: Element::User(texts),
                                ..
                            },
                        ..
                    }),
                ) => texts.push(text),
                (Last::Tool, _) => {
                    out.push(item(Element::Bridge, i, Last::Bridge, true));
                    out.push(item(Element::User(vec![text]), i, Last::User, false));
                }
                _ => out.push(item(Element::User(vec![text]), i, Last::User, false)),
            },
            Message::Assistant {
                text,
                thinking,
                reasoning,
                tool_calls,
            } => {
                if text.trim().is_empty()
                    && tool_calls.is_empty()
                    && thinking.is_empty()
                    && reasoning.is_empty()
                {
                    continue; // nothing to send (C61: never an empty assistant turn)
                }
                match (prev, out.last_mut()) {
                    (
                        Last::Assistant,
                        Some(Planned {
                            element:
                                Wire {
                                    element: Element::Assistant(merged),
                                    ..
                                },
                            ..
                        }),
                    ) => merged.push(message),
                    _ => out.push(item(
                        Element::Assistant(vec![message]),
                        i,
                        Last::Assistant,
                        false,
                    )),
                }
            }
            // Nothing merges into a tool message: it is final at once.
            Message::ToolResult { .. } => {
                out.push(item(Element::Tool(message), i, Last::Tool, true))
            }
        }
    }
    out
}

#[derive(Serialize)]
struct TextMessage<'a> {
    role: &'static str,
    content: &'a str,
}

/// `{"role":"user","content"}`, the texts joined with a blank line.
struct UserMessage<'a>(&'a [&'a str]);

impl Serialize for UserMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", "user")?;
        map.serialize_entry("content", &Joined(self.0))?;
        map.end()
    }
}

/// Strings joined with a blank line, written without building the joined string first.
struct Joined<'a>(&'a [&'a str]);

impl Serialize for Joined<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            [one] => serializer.serialize_str(one),
            many => serializer.collect_str(&JoinedDisplay(many)),
        }
    }
}

struct JoinedDisplay<'a>(&'a [&'a str]);

impl std::fmt::Display for JoinedDisplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, part) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n\n")?;
            }
            f.write_str(part)?;
        }
        Ok(())
    }
}

/// One assistant message made of `parts` (merged assistant messages; none for the bridge):
/// `content` (their non-blank texts joined with a blank line, `""` when none; the bridge text
/// for the bridge), the reasoning fields (SPEC L10) and `tool_calls`.
struct AssistantMessage<'a> {
    parts: &'a [&'a Message],
    options: &'a ChatOptions,
}

impl Serialize for AssistantMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut texts: Vec<&str> = Vec::new();
        let mut thinking: Vec<&str> = Vec::new();
        let mut fields: Vec<ChatReasoningField> = Vec::new();
        let mut details: Vec<&Value> = Vec::new();
        let mut calls: Vec<&ToolCall> = Vec::new();
        for part in self.parts {
            if let Message::Assistant {
                text,
                thinking: t,
                reasoning,
                tool_calls,
            } = part
            {
                if !text.trim().is_empty() {
                    texts.push(text);
                }
                let has_field = reasoning
                    .iter()
                    .any(|r| matches!(r, ReasoningBlock::ChatField(_)));
                if has_field && !t.is_empty() {
                    thinking.push(t);
                }
                for block in reasoning {
                    match block {
                        ReasoningBlock::ChatField(field) if !fields.contains(field) => {
                            fields.push(*field);
                        }
                        ReasoningBlock::ChatDetails(value) => details.push(value),
                        ReasoningBlock::ChatField(_)
                        | ReasoningBlock::Thinking { .. }
                        | ReasoningBlock::Redacted { .. }
                        | ReasoningBlock::ResponsesItem(_)
                        | ReasoningBlock::AnthropicContent(_) => {}
                    }
                }
                calls.extend(tool_calls);
            }
        }
        if self.parts.is_empty() {
            texts.push(TOOL_RESULTS_BRIDGE);
        }
        if self.options.reasoning_content && !fields.contains(&ChatReasoningField::ReasoningContent)
        {
            fields.push(ChatReasoningField::ReasoningContent);
        }
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", "assistant")?;
        map.serialize_entry("content", &Joined(&texts))?;
        for field in fields {
            map.serialize_entry(field.name(), &Joined(&thinking))?;
        }
        match details.as_slice() {
            [] => {}
            [one] => map.serialize_entry("reasoning_details", one)?,
            many => {
                let all: Vec<&Value> = many
                    .iter()
                    .flat_map(|v| v.as_array().into_iter().flatten())
                    .collect();
                map.serialize_entry("reasoning_details", &all)?;
            }
        }
        if !calls.is_empty() {
            map.serialize_entry("tool_calls", &WireToolCalls(&calls))?;
        }
        map.end()
    }
}

/// `{"role":"tool","tool_call_id","content"}`, `Error: ` prefixed to an error result.
struct ToolMessage<'a>(&'a Message);

impl Serialize for ToolMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("role", "tool")?;
        if let Message::ToolResult {
            call_id,
            name: _,
            text,
            is_error,
        } = self.0
        {
            map.serialize_entry("tool_call_id", call_id)?;
            if *is_error {
                map.serialize_entry("content", &ErrorText(text))?;
            } else {
                map.serialize_entry("content", text)?;
            }
        }
        map.end()
    }
}

struct WireToolCalls<'a>(&'a [&'a ToolCall]);

impl Serialize for WireToolCalls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|call| WireToolCall {
            id: &call.id,
            kind: "function",
            function: WireFunctionCall {
                name: &call.name,
                arguments: arguments_or_empty_object(&call.arguments),
            },
        }))
    }
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

struct WireTools<'a>(&'a [ToolDef]);

impl Serialize for WireTools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|tool| WireTool {
            kind: "function",
            function: WireFunction {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.input_schema,
            },
        }))
    }
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    /// Omitted for a tool sent without parameters (`Value::Null`, SPEC M14: Gemini rejects an
    /// object schema with no properties; the Chat API reads no `parameters` as no arguments).
    #[serde(skip_serializing_if = "Value::is_null")]
    parameters: &'a Value,
}

/// A Chat chunk as the decoder reads it: the fields it looks at, typed, their strings borrowed
/// from the payload (SPEC L7, L9). Unknown fields (`id`, `model`, `created`, `logprobs`, …) are
/// skipped without being built.
///
/// The common chunk is parsed straight into it (serde derive over the payload text). A chunk it
/// cannot take as it is — a field of another type than the view's (an object as `arguments`,
/// a number as `content`, a float `index`), a duplicate key, a lone surrogate escape, not an
/// object — goes the general way: parsed into a `Value` with `parse_lossy` and read into the
/// same view with the general path's looser rules ([`ChoiceView::of`]: a field of another type
/// counts as absent), so one handler decides for both and every such chunk decodes as before.
#[derive(serde::Deserialize)]
struct ChunkView<'a> {
    #[serde(borrow)]
    choices: Option<Vec<ChoiceView<'a>>>,
    usage: Option<UsageView>,
    /// Present and not `null`: the chunk is an error, decided on the general path.
    error: Option<serde::de::IgnoredAny>,
    /// `"error"` (vLLM, SGLang): the chunk is an error, decided on the general path.
    #[serde(borrow)]
    object: Option<JsonStr<'a>>,
}

/// One element of a chunk's `choices`.
#[derive(serde::Deserialize)]
struct ChoiceView<'a> {
    /// Absent counts as 0.
    index: Option<u64>,
    #[serde(borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(borrow)]
    finish_reason: Option<JsonStr<'a>>,
}

/// A choice's `delta`.
#[derive(serde::Deserialize, Default)]
struct DeltaView<'a> {
    #[serde(borrow)]
    content: Option<JsonStr<'a>>,
    #[serde(borrow)]
    refusal: Option<JsonStr<'a>>,
    #[serde(borrow)]
    reasoning_content: Option<JsonStr<'a>>,
    #[serde(borrow)]
    reasoning: Option<JsonStr<'a>>,
    /// OpenRouter's entries, kept as JSON (they are sent back as they came, SPEC L10).
    reasoning_details: Option<Cow<'a, [Value]>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<CallView<'a>>>,
}

/// One element of a delta's `tool_calls`.
#[derive(serde::Deserialize)]
struct CallView<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    id: Option<JsonStr<'a>>,
    #[serde(borrow)]
    function: Option<FunctionView<'a>>,
}

/// A tool-call delta's `function`.
#[derive(serde::Deserialize, Default)]
struct FunctionView<'a> {
    #[serde(borrow)]
    name: Option<JsonStr<'a>>,
    /// A string on the fast path; on the general path a JSON object too, as its JSON text.
    #[serde(borrow)]
    arguments: Option<JsonStr<'a>>,
}

/// A chunk's `usage` object.
#[derive(serde::Deserialize)]
struct UsageView {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    /// DeepSeek's cache read count.
    prompt_cache_hit_tokens: Option<u64>,
    prompt_tokens_details: Option<UsageDetailsView>,
}

/// `usage.prompt_tokens_details`.
#[derive(serde::Deserialize)]
struct UsageDetailsView {
    cached_tokens: Option<u64>,
    /// OpenRouter, for providers that bill cache writes.
    cache_write_tokens: Option<u64>,
}

impl UsageView {
    /// The general path's reading of a `usage` object (a count that is not a `u64` is absent).
    fn of(usage: &Value) -> Self {
        let count = |value: &Value, key: &str| value.get(key).and_then(Value::as_u64);
        let details = usage.get("prompt_tokens_details");
        UsageView {
            prompt_tokens: count(usage, "prompt_tokens"),
            completion_tokens: count(usage, "completion_tokens"),
            prompt_cache_hit_tokens: count(usage, "prompt_cache_hit_tokens"),
            prompt_tokens_details: details.map(|d| UsageDetailsView {
                cached_tokens: count(d, "cached_tokens"),
                cache_write_tokens: count(d, "cache_write_tokens"),
            }),
        }
    }

    fn usage(&self) -> Usage {
        let details = self.prompt_tokens_details.as_ref();
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.completion_tokens.unwrap_or(0),
            // OpenAI, vLLM, OpenRouter: `prompt_tokens_details.cached_tokens`; DeepSeek:
            // `prompt_cache_hit_tokens`. Both are part of `prompt_tokens`.
            cache_read_tokens: details
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens),
            cache_write_tokens: details.and_then(|d| d.cache_write_tokens),
        }
    }
}

impl<'a> ChoiceView<'a> {
    /// The general path's reading of one `choices` element: a field of another type than the
    /// view's counts as absent (a choice or delta that is not an object has no fields).
    fn of(choice: &'a Value) -> Self {
        ChoiceView {
            index: choice.get("index").and_then(Value::as_u64),
            delta: choice.get("delta").map(|delta| DeltaView {
                content: JsonStr::of(delta.get("content")),
                refusal: JsonStr::of(delta.get("refusal")),
                reasoning_content: JsonStr::of(delta.get("reasoning_content")),
                reasoning: JsonStr::of(delta.get("reasoning")),
                reasoning_details: delta
                    .get("reasoning_details")
                    .and_then(Value::as_array)
                    .map(|details| Cow::Borrowed(details.as_slice())),
                tool_calls: delta
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .map(|calls| calls.iter().map(CallView::of).collect()),
            }),
            finish_reason: JsonStr::of(choice.get("finish_reason")),
        }
    }
}

impl<'a> CallView<'a> {
    /// The general path's reading of one `tool_calls` element (an element that is not an
    /// object has no fields, and still continues the current call); `arguments` that are a
    /// JSON object are taken as their JSON text.
    fn of(call: &'a Value) -> Self {
        CallView {
            index: call.get("index").and_then(Value::as_u64),
            id: JsonStr::of(call.get("id")),
            function: call.get("function").map(|function| FunctionView {
                name: JsonStr::of(function.get("name")),
                arguments: match function.get("arguments") {
                    Some(Value::String(text)) => Some(JsonStr(Cow::Borrowed(text))),
                    Some(object @ Value::Object(_)) => {
                        Some(JsonStr(Cow::Owned(object.to_string())))
                    }
                    _ => None,
                },
            }),
        }
    }
}

/// Decoder of one streamed Chat Completions body (SPEC L7, L9; cases C21–C24, C26).
///
/// * Each SSE `data:` payload is a JSON chunk (parsed with [`parse_lossy`], so lone
///   surrogates become U+FFFD); `data: [DONE]` ends the stream and later bytes are ignored.
///   Only choice `index` 0 is used (a choice without `index` counts as 0); chunks with empty,
///   missing or `null` `choices` are fine (C22); unknown fields are ignored.
/// * `delta.content` → [`StreamDelta::Text`] as it arrives; `delta.refusal` (OpenAI: the model
///   refused, the finish reason stays `stop`) → text too, and a response without tool calls
///   is then a refusal; `delta.reasoning_content`, else
///   `delta.reasoning` (servers that send both send the same text) → [`StreamDelta::Thought`].
/// * Tool-call deltas are merged by `index` (C21): any start, gaps allowed; id and name are the
///   first non-empty ones; arguments are concatenated (a JSON object instead of a string is
///   appended as its JSON text). A delta whose non-empty `id` differs from the id already held
///   at its `index` starts a new call at that index (C37: Ollama sends every call at
///   `index: 0`, each with its own id); a delta without an id continues the current call of its
///   index. A delta without `index` continues the current call unless it brings a different
///   id, or a name while the current call already has one (then it opens the next index). Calls
///   come out in index order (calls sharing an index in arrival order); a slot that never got a
///   name is dropped; a missing or duplicate id is replaced by `{id_prefix}_{index}`.
/// * Usage comes from the last chunk with a non-null `usage` (`prompt_tokens` → input,
///   `completion_tokens` → output; `prompt_tokens_details.cached_tokens`, else DeepSeek's
///   `prompt_cache_hit_tokens` → cache read; OpenRouter's
///   `prompt_tokens_details.cache_write_tokens` → cache write): cumulative usage is not
///   double counted (C22).
/// * `finish_reason` `null` or `""` is not terminal (C23). `stop` → end turn, `tool_calls`
///   and `function_call` → tool use, `length` → max tokens, `model_length` (Mistral) →
///   context full, `content_filter` → refusal; the
///   Anthropic spellings `end_turn`, `tool_use`, `max_tokens`, `refusal` are accepted as
///   aliases; `abort` (vLLM, SGLang: the server dropped the request) → a retryable
///   [`StreamError::Provider`]; anything else → end turn. The last non-empty reason wins.
/// * An `error` object in a chunk (OpenAI, OpenRouter, LiteLLM, SGLang; OpenRouter adds
///   `finish_reason: "error"`), a chunk with `"object":"error"` (vLLM), or an `event: error`
///   event → retryable [`StreamError::Provider`], never a short answer; a complete chunk that
///   is not JSON is one too. Errors are sticky.
///
/// [`StreamDecoder::is_complete`] is true only after `[DONE]`: a server that sends a
/// `finish_reason` but keeps the connection open (C24 b) is detected by
/// [`StreamDecoder::has_final_answer`]: the loop waits a short grace, drops the connection, and
/// [`StreamDecoder::finish`] then accepts the response because a finish reason was seen.
pub(crate) struct ChatDecoder {
    /// Prefix of synthesised call ids: `{id_prefix}_{index}`.
    id_prefix: String,
    /// Parser, sticky error, response taken.
    sse: SseState,
    /// Text and reasoning so far.
    streamed: StreamedText,
    /// Tool-call slots by (provider `index`, call number at that index), C37.
    calls: BTreeMap<(u64, u32), CallSlot>,
    /// The current call number of each `index` (C37: a new id at an index opens the next one).
    open: BTreeMap<u64, u32>,
    /// The slot the last tool-call delta went to (for deltas without `index`).
    current_call: Option<(u64, u32)>,
    usage: Option<Usage>,
    /// The field the reasoning text came in first (SPEC L10).
    reasoning_field: Option<ChatReasoningField>,
    /// `reasoning_details` entries, streamed pieces merged by `index` (SPEC L10).
    details: Vec<Value>,
    /// The last non-empty `finish_reason`, mapped.
    finish_reason: Option<StopKind>,
    /// `delta.refusal` text was streamed (OpenAI: the model refused; the finish reason stays
    /// `stop`).
    refused: bool,
    /// The last non-empty `finish_reason` was `abort` (vLLM, SGLang: the server dropped the
    /// request): a failed attempt, not an answer.
    aborted: bool,
    /// `data: [DONE]` was seen.
    done: bool,
}

/// Merge one streamed `reasoning_details` entry (OpenRouter): an entry with the `index` and
/// `type` of one already held continues it (its `text`, `summary` and `data` strings appended,
/// other non-null fields such as `signature`, `id`, `format` taken as they come); any other
/// entry is appended.
fn merge_detail(details: &mut Vec<Value>, piece: &Value) {
    let Some(fields) = piece.as_object() else {
        return;
    };
    let key = (
        piece.get("index").and_then(Value::as_u64),
        piece.get("type"),
    );
    let held = details.iter_mut().find(|d| {
        key.0.is_some() && (d.get("index").and_then(Value::as_u64), d.get("type")) == key
    });
    let Some(Value::Object(held)) = held else {
        details.push(piece.clone());
        return;
    };
    for (name, value) in fields {
        match (name.as_str(), held.get_mut(name), value) {
            ("text" | "summary" | "data", Some(Value::String(acc)), Value::String(more)) => {
                acc.push_str(more);
            }
            (_, _, Value::Null) => {}
            (_, _, other) => {
                held.insert(name.clone(), other.clone());
            }
        }
    }
}

impl std::fmt::Debug for ChatDecoder {
    // Lengths, not contents (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ChatDecoder(text {} B, thinking {} B, {} call slots, finish {:?}, done {})",
            self.streamed.text.len(),
            self.streamed.thinking.len(),
            self.calls.len(),
            self.finish_reason,
            self.done
        )
    }
}

impl ChatDecoder {
    /// A decoder for one response; `id_prefix` names calls the provider sent without an id
    /// (`{id_prefix}_{index}`, C21), so it should be unique per LLM call (e.g. `call_t3r2`).
    #[must_use]
    pub(crate) fn new(id_prefix: String) -> Self {
        ChatDecoder {
            id_prefix,
            sse: SseState::new(),
            streamed: StreamedText::default(),
            calls: BTreeMap::new(),
            open: BTreeMap::new(),
            current_call: None,
            usage: None,
            reasoning_field: None,
            details: Vec::new(),
            finish_reason: None,
            refused: false,
            aborted: false,
            done: false,
        }
    }

    /// A chunk's `usage` (the last one wins, C22) and its choices of index 0.
    fn handle_chunk(
        &mut self,
        usage: Option<&UsageView>,
        choices: &[ChoiceView<'_>],
        out: &mut Vec<StreamDelta>,
    ) {
        if let Some(usage) = usage {
            self.usage = Some(usage.usage());
        }
        for choice in choices {
            if choice.index.unwrap_or(0) == 0 {
                self.handle_choice(choice, out);
            }
        }
    }

    fn handle_choice(&mut self, choice: &ChoiceView<'_>, out: &mut Vec<StreamDelta>) {
        if let Some(delta) = &choice.delta {
            if let Some(text) = non_empty(&delta.content) {
                self.streamed.push_text(text, out);
            }
            if let Some(text) = non_empty(&delta.refusal) {
                self.refused = true;
                self.streamed.push_text(text, out);
            }
            let reasoning = match non_empty(&delta.reasoning_content) {
                Some(text) => Some((ChatReasoningField::ReasoningContent, text)),
                None => {
                    non_empty(&delta.reasoning).map(|text| (ChatReasoningField::Reasoning, text))
                }
            };
            if let Some((field, thought)) = reasoning {
                self.reasoning_field.get_or_insert(field);
                self.streamed.push_thought(thought, out);
            }
            for detail in delta.reasoning_details.iter().flat_map(|d| d.iter()) {
                merge_detail(&mut self.details, detail);
            }
            for call in delta.tool_calls.iter().flatten() {
                self.merge_call(call);
            }
        }
        if let Some(reason) = non_empty(&choice.finish_reason) {
            self.aborted = reason == "abort";
            self.finish_reason = Some(stop_kind(reason));
        }
    }

    /// Merge one `delta.tool_calls[]` element into its slot (C21, C37).
    fn merge_call(&mut self, call: &CallView<'_>) {
        let id = non_empty(&call.id);
        let function = call.function.as_ref();
        let name = function.and_then(|f| non_empty(&f.name));
        let key = match call.index {
            Some(index) => self.key_for_index(index, id),
            None => self.key_for_unindexed(id, name.is_some()),
        };
        self.open.insert(key.0, key.1);
        self.current_call = Some(key);
        let slot = self.calls.entry(key).or_default();
        if let Some(id) = id.filter(|_| slot.id.is_empty()) {
            id.clone_into(&mut slot.id);
        }
        if let Some(name) = name.filter(|_| slot.name.is_empty()) {
            name.clone_into(&mut slot.name);
        }
        if let Some(arguments) = function.and_then(|f| f.arguments.as_deref()) {
            slot.arguments.push_str(arguments);
        }
    }

    /// The slot for a delta at `index`: the index's current call, or a new call at that index
    /// when the delta brings a non-empty id other than the one the current call holds (C37).
    fn key_for_index(&self, index: u64, id: Option<&str>) -> (u64, u32) {
        let Some(&number) = self.open.get(&index) else {
            return (index, 0);
        };
        let held = self
            .calls
            .get(&(index, number))
            .map_or("", |s| s.id.as_str());
        match id {
            Some(id) if !held.is_empty() && held != id => (index, number.saturating_add(1)),
            Some(_) | None => (index, number),
        }
    }

    /// The slot for a tool-call delta without `index` (servers that omit it): the current call,
    /// or the next index when the delta evidently starts another call.
    fn key_for_unindexed(&self, id: Option<&str>, has_name: bool) -> (u64, u32) {
        let Some((&last, _)) = self.open.last_key_value() else {
            return (0, 0);
        };
        let Some(current) = self.current_call else {
            return (last, self.open.get(&last).copied().unwrap_or(0));
        };
        let Some(slot) = self.calls.get(&current) else {
            return current;
        };
        let other_id = id.is_some_and(|id| !slot.id.is_empty() && slot.id != id);
        let another_name = has_name && id.is_none() && !slot.name.is_empty();
        if other_id || another_name {
            (last.saturating_add(1), 0)
        } else {
            current
        }
    }
}

impl EventHandler for ChatDecoder {
    fn sse_state(&mut self) -> &mut SseState {
        &mut self.sse
    }

    /// One SSE event. `at_eof`: the event was flushed at EOF without its blank line, so a
    /// payload that is not JSON is a cut chunk, judged by `finish` (no `[DONE]`/finish reason
    /// → truncated), not a provider error.
    fn handle_event(
        &mut self,
        event: &SseEvent,
        out: &mut Vec<StreamDelta>,
        at_eof: bool,
    ) -> Result<(), StreamError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let is_error_event = event.event.as_deref() == Some("error");
        // The common chunk, read without building the fields the decoder never looks at. Any
        // chunk this cannot take as it is (an error, invalid escapes, a duplicate key, not an
        // object) goes the general way below, which decides exactly as before.
        if let Some(view) = read_view::<ChunkView<'_>>(data, is_error_event)
            && view.error.is_none()
            && view.object.as_deref() != Some("error")
        {
            let choices = view.choices.as_deref().unwrap_or_default();
            self.handle_chunk(view.usage.as_ref(), choices, out);
            return Ok(());
        }
        let Some(chunk) = parse_event_json(data, is_error_event, at_eof, "chunk")? else {
            return Ok(());
        };
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(StreamError::Provider {
                message: error_message(error),
                retryable: true,
            });
        }
        // vLLM and SGLang send an error mid-stream as `{"object":"error","message",…}`.
        if is_error_event || chunk.get("object").and_then(Value::as_str) == Some("error") {
            return Err(StreamError::Provider {
                message: error_message(&chunk),
                retryable: true,
            });
        }
        let usage = chunk
            .get("usage")
            .filter(|u| u.is_object())
            .map(UsageView::of);
        let choices: Vec<ChoiceView<'_>> = chunk
            .get("choices")
            .and_then(Value::as_array)
            .map(|choices| choices.iter().map(ChoiceView::of).collect())
            .unwrap_or_default();
        self.handle_chunk(usage.as_ref(), &choices, out);
        Ok(())
    }

    /// True after `data: [DONE]`.
    fn is_done(&self) -> bool {
        self.done
    }

    /// True after `[DONE]` or a finish reason (C24 b).
    fn answer_is_final(&self) -> bool {
        self.done || self.finish_reason.is_some()
    }

    /// The response, once the body ended. Accepted when `[DONE]` or a finish reason was seen
    /// (C24 a); otherwise [`StreamError::Truncated`] (L7), even with partial text. With
    /// `[DONE]` but no finish reason the stop is inferred (C23): tool calls whose arguments are
    /// blank or JSON → tool use, a call with unparsable arguments → truncated (C24 c), no calls
    /// → end turn. An end-turn finish with tool calls is tool use (C23: the tools still run); a
    /// tool-use finish without any call is end turn. With `length` the (possibly cut) calls are
    /// kept: the loop does not run them (L1).
    fn take_response(&mut self) -> Result<LlmResponse, StreamError> {
        if self.aborted {
            // vLLM and SGLang end a request their engine dropped (preempted, shut down, its
            // client gone) with `abort`: what came is not the model's answer, and the same
            // request may well succeed again (SPEC L5).
            return Err(StreamError::Provider {
                message: "the server aborted the response (finish_reason \"abort\")".to_owned(),
                retryable: true,
            });
        }
        let slots = std::mem::take(&mut self.calls)
            .into_iter()
            .map(|((index, _), slot)| (index, slot));
        let tool_calls = take_calls(slots, &self.id_prefix);
        let stop = match self.finish_reason.take() {
            // `stop_kind` never gives a pause: nothing on this route can be sent back to
            // continue one.
            Some(StopKind::EndTurn | StopKind::ToolUse | StopKind::Pause)
                if tool_calls.is_empty() && self.refused =>
            {
                StopKind::Refusal
            }
            Some(StopKind::EndTurn | StopKind::ToolUse | StopKind::Pause)
                if tool_calls.is_empty() =>
            {
                StopKind::EndTurn
            }
            Some(StopKind::EndTurn | StopKind::ToolUse | StopKind::Pause) => StopKind::ToolUse,
            Some(stop @ (StopKind::MaxTokens | StopKind::ContextFull | StopKind::Refusal)) => stop,
            None if !self.done => {
                return Err(StreamError::Truncated(
                    "stream ended without [DONE] and without a finish_reason".to_owned(),
                ));
            }
            None if tool_calls.is_empty() && self.refused => StopKind::Refusal,
            None if tool_calls.is_empty() => StopKind::EndTurn,
            None => {
                if let Some(cut) = tool_calls
                    .iter()
                    .find(|c| !arguments_complete(&c.arguments))
                {
                    return Err(StreamError::Truncated(format!(
                        "stream ended without a finish_reason inside the arguments of tool call {}",
                        cut.id
                    )));
                }
                StopKind::ToolUse
            }
        };
        let mut reasoning = Vec::new();
        if let Some(field) = self.reasoning_field {
            reasoning.push(ReasoningBlock::ChatField(field));
        }
        if !self.details.is_empty() {
            let details = std::mem::take(&mut self.details);
            reasoning.push(ReasoningBlock::ChatDetails(Value::Array(details)));
        }
        Ok(self
            .streamed
            .take_response(reasoning, tool_calls, stop, self.usage))
    }
}

/// `finish_reason` → [`StopKind`] (SPEC L7; Anthropic spellings as aliases; unknown → end turn).
fn stop_kind(reason: &str) -> StopKind {
    match reason {
        "tool_calls" | "function_call" | "tool_use" => StopKind::ToolUse,
        "length" | "max_tokens" => StopKind::MaxTokens,
        // Mistral: the prompt and the answer filled the context window.
        "model_length" => StopKind::ContextFull,
        "content_filter" | "refusal" => StopKind::Refusal,
        _ => StopKind::EndTurn,
    }
}

/// Arguments that may run: blank (means `{}`, C26) or one whole JSON value.
fn arguments_complete(arguments: &str) -> bool {
    arguments.trim().is_empty()
        || serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_ok()
        || parse_lossy(arguments).is_ok()
}

/// The string value, when it is a non-empty string.
fn non_empty_str(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// A provider error's message: `message` of an object, a plain string, else the JSON text.
fn error_message(error: &Value) -> String {
    let nested = error.get("error").unwrap_or(error);
    if let Some(message) = nested
        .as_str()
        .or_else(|| non_empty_str(nested.get("message")))
    {
        return message.to_owned();
    }
    nested.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;
    /// The case's own 400 body (C41).
    const C41_BODY: &str = r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens"}}"#;

    #[test]
    fn c41_reasoning_model_names_and_openai_endpoint_get_max_completion_tokens() {
        for m in [
            "gpt-5.4",
            "gpt-5",
            "gpt-5-mini",
            "o1",
            "o3-mini",
            "o4-mini-2025-04-16",
            "openai/o3",
            "openai/gpt-5.1-codex",
            "O3",
        ] {
            assert!(is_openai_reasoning_model(m), "{m}");
        }
        for m in [
            "gpt-4o",
            "gpt-4.1",
            "o1x",
            "llama3.1:8b",
            "qwen3",
            "deepseek-reasoner",
            "",
        ] {
            assert!(!is_openai_reasoning_model(m), "{m}");
        }
        let local = Config::for_tests(ProviderKind::OpenAiChat, "http://127.0.0.1:11434/v1");
        let none = Learned::default();
        assert!(!chat_options(&local, "llama3.1", &none).max_completion_tokens);
        assert!(chat_options(&local, "gpt-5.4", &none).max_completion_tokens);
        let openai = Config::for_tests(ProviderKind::OpenAiChat, "https://api.openai.com/v1");
        assert!(chat_options(&openai, "gpt-4o", &none).max_completion_tokens);
        let learned = Learned {
            max_completion_tokens: true,
            reasoning_content: false,
            ..Learned::default()
        };
        assert!(chat_options(&local, "llama3.1", &learned).max_completion_tokens);
    }

    #[test]
    fn l10_h10_deepseek_reasoner_gets_reasoning_content_before_it_streamed_any() {
        let local = Config::for_tests(ProviderKind::OpenAiChat, "http://127.0.0.1:8000/v1");
        let none = Learned::default();
        assert!(chat_options(&local, "deepseek-reasoner", &none).reasoning_content);
        for other in ["deepseek-chat", "deepseek/deepseek-r1", "qwen3"] {
            assert!(
                !chat_options(&local, other, &none).reasoning_content,
                "{other}"
            );
        }
        let learned = Learned {
            max_completion_tokens: false,
            reasoning_content: true,
            ..Learned::default()
        };
        assert!(chat_options(&local, "qwen3", &learned).reasoning_content);
    }

    #[test]
    fn c41_a_400_naming_max_completion_tokens_asks_for_the_rename_once() {
        let sent_max_tokens = ChatOptions::default();
        assert!(wants_max_completion_tokens(
            400,
            C41_BODY.as_bytes(),
            &sent_max_tokens
        ));
        // Already sent under the new name: the same answer does not loop.
        let sent_new = ChatOptions {
            max_completion_tokens: true,
            reasoning_content: false,
            ..ChatOptions::default()
        };
        assert!(!wants_max_completion_tokens(
            400,
            C41_BODY.as_bytes(),
            &sent_new
        ));
        // Other statuses and other 400s are not a rename.
        assert!(!wants_max_completion_tokens(
            429,
            C41_BODY.as_bytes(),
            &sent_max_tokens
        ));
        assert!(!wants_max_completion_tokens(
            400,
            br#"{"error":{"message":"bad tools"}}"#,
            &sent_max_tokens
        ));
    }

    use serde_json::json;

    // ---------------------------------------------------------------- recorded streams

    const PLAIN_TEXT: &str = concat!(
        "data: {\"id\":\"p1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"p1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
        ": keep-alive\n\n",
        "data: {\"id\":\"p1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", wor\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"p1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ld!\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"p1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"p1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\"total_tokens\":16}}\n\n",
        "data: [DONE]\n\n",
    );

    const TWO_TOOLS: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"Need both.\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Checking.\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"fs__read_file\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\":\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"h\u{e9}.txt\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"fs__list_dir\",\"arguments\":\"{\\\"p\\\":\\\".\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":30}}\n\n",
        "data: [DONE]\n\n",
    );

    const C21: &str = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"index\":1,\"id\":\"call_A\",\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"\",\"type\":\"function\",\"function\":{\"arguments\":\"{\\\"path\\\": \"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"\\\"a.txt\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":2,\"function\":{\"name\":\"list_dir\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );

    const C22: &str = concat!(
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0,\"content_filter_results\":{}}]}\n\n",
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":611,\"completion_tokens\":13,\"total_tokens\":624}}\n\n",
        "data: [DONE]\n\n",
    );

    const C22_CUMULATIVE_USAGE: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"H\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":611,\"completion_tokens\":1}}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"i\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":611,\"completion_tokens\":12}}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":611,\"completion_tokens\":13}}\n\n",
        "data: [DONE]\n\n",
    );

    const C23: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Let me check.\"},\"finish_reason\":\"\"}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":\\\".\\\"}\"}}]},\"finish_reason\":\"\"}]}\n\n",
        "data: [DONE]\n\n",
    );

    const C24A: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Done.\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    );

    const C24C: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"write\",\"arguments\":\"{\\\"path\\\":\\\"a\\\",\\\"body\\\":\\\"hel\"}}]}}]}\n\n";

    /// C26: one tool-call delta with the given (JSON-escaped) arguments, then `tool_calls`.
    fn c26_body(arguments_json: &str) -> String {
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"call_9\",\"type\":\"function\",\"function\":{{\"name\":\"get_time\",\"arguments\":{arguments_json}}}}}]}},\"finish_reason\":null}}]}}\n\n\
             data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"tool_calls\"}}]}}\n\n\
             data: [DONE]\n\n"
        )
    }

    // ---------------------------------------------------------------- harness

    use crate::llm::decoder_tests::{Outcome, call, ok};

    fn make() -> Box<dyn StreamDecoder> {
        Box::new(ChatDecoder::new("call_t1".to_owned()))
    }

    fn decode_every_split(body: &str) -> Outcome {
        crate::llm::decoder_tests::decode_every_split(&make, body)
    }

    /// The chunk fast path (`ChunkView`) decides like the general path: every body is decoded
    /// once as it is and once with each chunk given a duplicate `object` key, which the view
    /// refuses (serde rejects a duplicate field) while the general path keeps the last value,
    /// the chunk's own.
    #[test]
    fn a_chunk_read_through_the_view_decodes_like_the_general_path() {
        let chunks = [
            r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other choice"}},{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":"r","reasoning_details":[{"type":"reasoning.text","text":"t","index":0}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"fs__read","arguments":"{\"p\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":{"x":1}}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
            r#"{"choices":null,"usage":{"prompt_tokens":"x"}}"#,
            r#"{"object":"error","message":"overloaded"}"#,
            r#"{"error":{"message":"bad gateway"}}"#,
            r#"{"error":null,"choices":[{"delta":{"content":"after a null error"}}]}"#,
            r#"{"choices":[{"delta":{"content":"lone \ud800 surrogate"}}]}"#,
            r#"["not","an","object"]"#,
        ];
        let body = |duplicate: bool| -> String {
            let mut body = String::new();
            for chunk in chunks {
                let chunk = if duplicate {
                    chunk.replacen('{', r#"{"object":null,"object":null,"#, 1)
                } else {
                    chunk.to_owned()
                };
                body.push_str(&format!("data: {chunk}\n\n"));
            }
            body.push_str("data: [DONE]\n\n");
            body
        };
        let run = |body: &str| crate::llm::decoder_tests::run_chunks(make(), &[body.as_bytes()]);
        // Chunk by chunk, so an error part-way is compared too.
        for n in 1..=chunks.len() {
            let cut = |duplicate: bool| -> String {
                body(duplicate)
                    .split_inclusive("\n\n")
                    .take(n)
                    .collect::<String>()
            };
            assert_eq!(run(&cut(false)), run(&cut(true)), "after {n} chunks");
        }
    }

    /// `body`'s chunks with a field of the view twice each, which the view refuses: every
    /// chunk then goes the general path.
    fn forced_general(body: &str) -> String {
        crate::llm::decoder_tests::forced_general(body, &["choices", "usage", "object", "error"])
    }

    /// The view borrows plain strings, decodes escaped ones and ignores unknown fields at every
    /// level: the same events as the general path, and the escapes decoded.
    #[test]
    fn l9_the_chunk_view_decodes_escapes_and_skips_unknown_fields_like_the_general_path() {
        let body = concat!(
            r#"data: {"id":"c","created":1,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"logprobs":{"content":[{"token":"x","bytes":[1,2]}]},"delta":{"role":"assistant","content":"line\nnext \"quoted\" \u00e9 \ud83d\udc1d","extra":{"deep":[[[{}]]]}},"finish_reason":null,"future":"\ud800"}]}"#,
            "\n\n",
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_\u0031","type":"function","function":{"name":"fs__read","arguments":"{\"path\":\"a\\\\b\"}","strict":true}}]}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":2,"audio_tokens":0}}}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(
            outcome,
            crate::llm::decoder_tests::run_chunks(make(), &[forced_general(body).as_bytes()])
        );
        let response = ok(&outcome);
        assert_eq!(response.text, "line\nnext \"quoted\" é 🐝");
        assert_eq!(
            response.tool_calls,
            vec![call("call_1", "fs__read", r#"{"path":"a\\b"}"#)]
        );
        assert_eq!(response.stop, StopKind::ToolUse);
        let usage = response.usage.expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (9, 4));
        assert_eq!(usage.cache_read_tokens, Some(2));
    }

    /// Chunks the view cannot take go the general path and decide as it always did: arguments
    /// as an object, a float `index` (counts as 0 for a choice, as absent for a call), a
    /// `content` that is not a string (ignored), a lone surrogate (U+FFFD).
    #[test]
    fn l9_chunks_the_view_refuses_decode_on_the_general_path() {
        let body = concat!(
            r#"data: {"choices":[{"index":0.0,"delta":{"content":"a \ud800 b"}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"delta":{"content":["not","text"],"tool_calls":[{"index":0,"id":"call_a","function":{"name":"f","arguments":{"x":1}}}]}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":1.0,"function":{"arguments":{"y":2}}}]}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1.5,"completion_tokens":2}}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        let response = ok(&outcome);
        assert_eq!(response.text, "a \u{FFFD} b");
        assert_eq!(
            response.tool_calls,
            vec![call("call_a", "f", r#"{"x":1}{"y":2}"#)]
        );
        let usage = response.usage.expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (0, 2));
    }

    /// Generators of Chat chunks for the view-against-general-path property: every field the
    /// decoder reads, with values of the right type and of others, escapes, lone surrogates,
    /// unknown fields, error chunks.
    mod chunk_gen {
        use crate::llm::decoder_tests::{INDEX, TEXT, UNKNOWN, field, field_of, object};
        use proptest::prelude::*;

        pub(super) const ID: &[&str] = &[r#""call_1""#, r#""call_2""#, r#""""#, "null", "7"];
        pub(super) const NAME: &[&str] =
            &[r#""fs__read""#, r#""w\u0072ite""#, r#""""#, "null", "[]"];
        pub(super) const ARGUMENTS: &[&str] = &[
            r#""{\"p\":""#,
            r#""\"a\\\\b\"}""#,
            r#""""#,
            r#"{"x":[1,"\u00e9"]}"#,
            "null",
            "5",
            "[1]",
        ];
        pub(super) const FINISH: &[&str] = &[
            r#""stop""#,
            r#""tool_calls""#,
            r#""length""#,
            r#""abort""#,
            r#""""#,
            "null",
            "7",
            r#""content_filter""#,
        ];
        pub(super) const DETAILS: &[&str] = &[
            r#"[{"type":"reasoning.text","text":"t","index":0}]"#,
            r#"[{"type":"reasoning.text","text":"u","index":0,"signature":"s"}]"#,
            r#"[{"type":"reasoning.encrypted","data":"d"}]"#,
            "null",
            "{}",
        ];
        pub(super) const USAGE: &[&str] = &[
            "null",
            r#"{"prompt_tokens":3,"completion_tokens":2}"#,
            r#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":1,"cache_write_tokens":2}}"#,
            r#"{"prompt_cache_hit_tokens":4}"#,
            r#"{"prompt_tokens":"x"}"#,
            "5",
            r#"{"prompt_tokens_details":null}"#,
            r#"{"prompt_tokens_details":3}"#,
            "{}",
        ];
        pub(super) const OBJECT: &[&str] =
            &[r#""chat.completion.chunk""#, r#""error""#, "null", "7"];
        pub(super) const ERROR: &[&str] = &["null", r#"{"message":"bad gateway"}"#, r#""down""#];

        fn function() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => (field("name", NAME), field("arguments", ARGUMENTS))
                    .prop_map(|(n, a)| object(vec![n, a])),
                1 => Just("null".to_owned()),
                1 => Just("\"f\"".to_owned()),
            ]
        }

        fn call() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => (field("index", INDEX), field("id", ID), field("type", &[r#""function""#]), field_of("function", function()))
                    .prop_map(|(i, id, t, f)| object(vec![i, id, t, f])),
                1 => Just("null".to_owned()),
            ]
        }

        fn delta() -> impl Strategy<Value = String> {
            let calls = prop_oneof![
                8 => prop::collection::vec(call(), 0..3).prop_map(|c| format!("[{}]", c.join(","))),
                1 => Just("null".to_owned()),
                1 => Just("{}".to_owned()),
            ];
            prop_oneof![
                8 => (
                    field("content", TEXT),
                    field("refusal", TEXT),
                    field("reasoning_content", TEXT),
                    field("reasoning", TEXT),
                    field("reasoning_details", DETAILS),
                    field_of("tool_calls", calls),
                    field("role", &[r#""assistant""#]),
                )
                    .prop_map(|(c, r, rc, re, d, t, role)| object(vec![c, r, rc, re, d, t, role])),
                1 => Just("null".to_owned()),
                1 => Just("\"d\"".to_owned()),
            ]
        }

        fn choice() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => (field("index", INDEX), field_of("delta", delta()), field("finish_reason", FINISH), field("logprobs", UNKNOWN))
                    .prop_map(|(i, d, f, u)| object(vec![i, d, f, u])),
                1 => Just("null".to_owned()),
            ]
        }

        /// One chunk's JSON text (always an object).
        pub(super) fn chunk() -> impl Strategy<Value = String> {
            let choices = prop_oneof![
                8 => prop::collection::vec(choice(), 0..3).prop_map(|c| format!("[{}]", c.join(","))),
                1 => Just("null".to_owned()),
                1 => Just("{}".to_owned()),
            ];
            (
                field("id", UNKNOWN),
                field_of("choices", choices),
                field("usage", USAGE),
                prop::option::weighted(0.1, prop::sample::select(OBJECT))
                    .prop_map(|o| o.map(|o| format!("\"object\":{o}"))),
                prop::option::weighted(0.1, prop::sample::select(ERROR))
                    .prop_map(|e| e.map(|e| format!("\"error\":{e}"))),
            )
                .prop_map(|(id, c, u, o, e)| object(vec![id, c, u, o, e]))
        }
    }

    proptest::proptest! {
        /// The view decides every chunk as the general (`Value`) path does: a body of generated
        /// chunks decodes to the same deltas, response or error whether or not each chunk is
        /// first offered to the view.
        #[test]
        fn l9_the_chunk_view_decodes_every_generated_body_like_the_general_path(
            chunks in proptest::collection::vec(chunk_gen::chunk(), 1..6),
            done in proptest::bool::ANY,
        ) {
            let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
            if done {
                body.push_str("data: [DONE]\n\n");
            }
            let run = |body: &str| crate::llm::decoder_tests::run_chunks(make(), &[body.as_bytes()]);
            proptest::prop_assert_eq!(run(&body), run(&forced_general(&body)), "{}", body);
        }
    }

    #[test]
    fn c52_an_endless_line_in_a_chat_stream_is_cut_off_at_16_mib() {
        crate::llm::decoder_tests::assert_endless_line_is_cut_off(&make);
    }

    #[test]
    fn c36_invalid_utf8_in_a_chat_stream_is_decoded_lossily() {
        let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"int caf\u{e9} = 1; h\u{e9}llo\"},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"fs__w\",\"arguments\":\"{\\\"t\\\":\\\"\u{e9}\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n";
        let outcome =
            crate::llm::decoder_tests::assert_invalid_utf8_is_decoded_lossily(&make, body);
        let response = ok(&outcome);
        assert_eq!(response.text, "int caf\u{FFFD} = 1; h\u{FFFD}llo");
        assert_eq!(response.tool_calls[0].arguments, "{\"t\":\"\u{FFFD}\"}");
    }

    fn text_of(deltas: &[StreamDelta]) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                StreamDelta::Text(t) => Some(t.as_str()),
                StreamDelta::Thought(_) => None,
            })
            .collect()
    }

    // ---------------------------------------------------------------- decoder tests

    #[test]
    fn l7_plain_text_reply_streams_text_deltas_and_ends_the_turn_at_every_split() {
        let outcome = decode_every_split(PLAIN_TEXT);
        assert!(outcome.complete);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Text("Hello".into()),
                StreamDelta::Text(", wor".into()),
                StreamDelta::Text("ld!".into())
            ]
        );
        assert_eq!(
            ok(&outcome),
            &LlmResponse {
                text: "Hello, world!".into(),
                thinking: String::new(),
                reasoning: Vec::new(),
                tool_calls: vec![],
                stop: StopKind::EndTurn,
                usage: Some(Usage {
                    input_tokens: 12,
                    output_tokens: 4,
                    ..Usage::default()
                }),
                stop_details: None,
            }
        );
    }

    #[test]
    fn l7_two_tool_calls_with_reasoning_are_merged_by_index_at_every_split() {
        let outcome = decode_every_split(TWO_TOOLS);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Thought("Need both.".into()),
                StreamDelta::Text("Checking.".into())
            ]
        );
        assert_eq!(
            ok(&outcome),
            &LlmResponse {
                text: "Checking.".into(),
                reasoning: vec![ReasoningBlock::ChatField(
                    ChatReasoningField::ReasoningContent
                )],
                thinking: "Need both.".into(),
                tool_calls: vec![
                    call("call_1", "fs__read_file", "{\"path\":\"hé.txt\"}"),
                    call("call_2", "fs__list_dir", "{\"p\":\".\"}"),
                ],
                stop: StopKind::ToolUse,
                usage: Some(Usage {
                    input_tokens: 100,
                    output_tokens: 30,
                    ..Usage::default()
                }),
                stop_details: None,
            }
        );
    }

    #[test]
    fn c21_ids_only_on_first_chunk_merge_by_index_and_missing_ids_are_synthesised() {
        let outcome = decode_every_split(C21);
        let response = ok(&outcome);
        assert_eq!(
            response.tool_calls,
            vec![
                call("call_A", "read_file", "{\"path\": \"a.txt\"}"),
                call("call_t1_2", "list_dir", "{}"),
            ]
        );
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(response.text, "");
        assert!(outcome.deltas.is_empty());
    }

    #[test]
    fn c21_arguments_before_the_name_are_buffered_and_nameless_slots_are_dropped() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"id\":\"\",\"function\":{\"name\":\"\",\"arguments\":\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"id\":\"call_Z\",\"function\":{\"name\":\"late\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(
            ok(&outcome).tool_calls,
            vec![call("call_Z", "late", "{\"a\":1}")]
        );
    }

    /// C37, the case's own trigger: Ollama streams two whole calls, each with its own id, both
    /// at `index: 0`.
    const C37: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0,\"id\":\"call_a1b2\",\"type\":\"function\",\"function\":{\"name\":\"fs__write\",\"arguments\":\"{\\\"path\\\":\\\"hello.py\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_c3d4\",\"type\":\"function\",\"function\":{\"name\":\"fs__write\",\"arguments\":\"{\\\"path\\\":\\\"world.py\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn c37_calls_sharing_index_0_with_their_own_ids_stay_separate() {
        let outcome = decode_every_split(C37);
        let response = ok(&outcome);
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(
            response.tool_calls,
            vec![
                call("call_a1b2", "fs__write", "{\"path\":\"hello.py\"}"),
                call("call_c3d4", "fs__write", "{\"path\":\"world.py\"}"),
            ]
        );
        // Rebuilt into the next request: one assistant message with two calls, each a valid
        // JSON string.
        let mut messages = vec![Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: response.tool_calls.clone(),
        }];
        for c in &response.tool_calls {
            messages.push(Message::ToolResult {
                call_id: c.id.clone(),
                name: c.name.clone(),
                text: "ok".into(),
                is_error: false,
            });
        }
        let req = LlmRequest {
            max_output_tokens: 1,
            ..LlmRequest::for_tests("m", &messages)
        };
        let body = body_json(&build_request(
            "http://h",
            "",
            &req,
            &ChatOptions::default(),
        ));
        let calls = body["messages"][0]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(calls.len(), 2, "{body}");
        for c in &calls {
            let args = c["function"]["arguments"].as_str().unwrap_or_default();
            assert!(serde_json::from_str::<Value>(args).is_ok(), "{args}");
        }
        assert_eq!(body["messages"][1]["tool_call_id"], "call_a1b2");
        assert_eq!(body["messages"][2]["tool_call_id"], "call_c3d4");
    }

    #[test]
    fn c37_id_less_continuations_append_to_the_current_call_of_their_index() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"s__x\",\"arguments\":\"{\\\"k\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n",
            // The same id again continues the call (some servers repeat it on every delta).
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"b\",\"function\":{\"name\":\"s__y\",\"arguments\":\"{\\\"k\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"\",\"function\":{\"arguments\":\"2}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c\",\"function\":{\"name\":\"s__z\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(
            ok(&outcome).tool_calls,
            vec![
                call("a", "s__x", "{\"k\":1}"),
                call("b", "s__y", "{\"k\":2}"),
                call("c", "s__z", "{}"),
            ]
        );
    }

    #[test]
    fn c21_deltas_without_index_continue_the_current_call_or_start_the_next() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"x1\",\"function\":{\"name\":\"a\",\"arguments\":\"{\\\"k\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"x2\",\"function\":{\"name\":\"b\",\"arguments\":{\"k\":2}}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"c\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(
            ok(&outcome).tool_calls,
            vec![
                call("x1", "a", "{\"k\":1}"),
                call("x2", "b", "{\"k\":2}"),
                call("call_t1_2", "c", "{}")
            ]
        );
    }

    #[test]
    fn c21_duplicate_provider_ids_are_made_unique() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_0\",\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}},{\"index\":1,\"id\":\"call_0\",\"function\":{\"name\":\"b\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(
            ok(&outcome).tool_calls,
            vec![call("call_0", "a", "{}"), call("call_t1_1", "b", "{}")]
        );
    }

    #[test]
    fn l7_only_choice_index_0_is_used() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other\"},\"finish_reason\":null},{\"index\":0,\"delta\":{\"content\":\"mine\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(ok(&outcome).text, "mine");
        assert_eq!(ok(&outcome).stop, StopKind::EndTurn);
    }

    #[test]
    fn c22_empty_choices_preamble_and_usage_only_chunk_are_accepted() {
        let outcome = decode_every_split(C22);
        let response = ok(&outcome);
        assert_eq!(response.text, "Hi");
        assert_eq!(response.stop, StopKind::EndTurn);
        assert_eq!(
            response.usage,
            Some(Usage {
                input_tokens: 611,
                output_tokens: 13,
                ..Usage::default()
            })
        );
        assert_eq!(outcome.deltas, vec![StreamDelta::Text("Hi".into())]);
    }

    #[test]
    fn c22_choices_absent_or_null_give_the_same_response() {
        let expected = decode_every_split(C22);
        let absent = C22.replace("\"choices\":[],", "");
        let null = C22.replace("\"choices\":[]", "\"choices\":null");
        assert_ne!(absent, C22);
        assert_ne!(null, C22);
        assert_eq!(decode_every_split(&absent), expected);
        assert_eq!(decode_every_split(&null), expected);
    }

    #[test]
    fn c22_cumulative_usage_on_every_chunk_is_taken_from_the_last_not_summed() {
        let outcome = decode_every_split(C22_CUMULATIVE_USAGE);
        assert_eq!(ok(&outcome).text, "Hi");
        assert_eq!(
            ok(&outcome).usage,
            Some(Usage {
                input_tokens: 611,
                output_tokens: 13,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn l11_cache_reads_and_writes_are_read_in_each_servers_spelling() {
        let with_usage = |usage: serde_json::Value| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"finish_reason\":\"stop\"}}]}}\n\ndata: {{\"choices\":[],\"usage\":{usage}}}\n\ndata: [DONE]\n\n"
            )
        };
        for (usage, read, write) in [
            // OpenAI (and vLLM): the cached part of `prompt_tokens`.
            (
                json!({"prompt_tokens": 900, "completion_tokens": 7,
                       "prompt_tokens_details": {"cached_tokens": 768}}),
                Some(768),
                None,
            ),
            // OpenRouter in front of a provider that bills cache writes.
            (
                json!({"prompt_tokens": 900, "completion_tokens": 7,
                       "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 850}}),
                Some(0),
                Some(850),
            ),
            // DeepSeek.
            (
                json!({"prompt_tokens": 900, "completion_tokens": 7,
                       "prompt_cache_hit_tokens": 640, "prompt_cache_miss_tokens": 260}),
                Some(640),
                None,
            ),
            // A server that says nothing about its cache.
            (
                json!({"prompt_tokens": 900, "completion_tokens": 7}),
                None,
                None,
            ),
        ] {
            let outcome = decode_every_split(&with_usage(usage.clone()));
            assert_eq!(
                ok(&outcome).usage,
                Some(Usage {
                    input_tokens: 900,
                    output_tokens: 7,
                    cache_read_tokens: read,
                    cache_write_tokens: write,
                }),
                "{usage}"
            );
        }
    }

    #[test]
    fn c23_empty_finish_reason_is_not_terminal_and_done_infers_tool_use() {
        let outcome = decode_every_split(C23);
        let response = ok(&outcome);
        assert_eq!(response.text, "Let me check.");
        assert_eq!(
            response.tool_calls,
            vec![call("call_1", "ls", "{\"p\":\".\"}")]
        );
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(response.usage, None);
    }

    #[test]
    fn c23_stop_finish_with_complete_tool_calls_still_runs_the_tools() {
        let body = C23.replace(
            "data: [DONE]",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]",
        );
        let outcome = decode_every_split(&body);
        assert_eq!(ok(&outcome).stop, StopKind::ToolUse);
        assert_eq!(ok(&outcome).tool_calls.len(), 1);
    }

    #[test]
    fn c23_done_without_finish_and_without_tools_is_end_turn() {
        let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"\"}]}\n\ndata: [DONE]\n\n";
        let outcome = decode_every_split(body);
        assert_eq!(ok(&outcome).stop, StopKind::EndTurn);
        assert_eq!(ok(&outcome).text, "ok");
    }

    #[test]
    fn c23_done_without_finish_and_cut_tool_arguments_is_truncated() {
        let body = format!("{C24C}data: [DONE]\n\n");
        let outcome = decode_every_split(&body);
        assert!(
            matches!(outcome.result, Err(StreamError::Truncated(_))),
            "{:?}",
            outcome.result
        );
    }

    #[test]
    fn c24a_finish_stop_without_done_then_eof_completes_the_turn() {
        let outcome = decode_every_split(C24A);
        assert!(!outcome.complete);
        assert_eq!(ok(&outcome).text, "Done.");
        assert_eq!(ok(&outcome).stop, StopKind::EndTurn);
    }

    #[test]
    fn c24c_cut_tool_call_without_finish_or_done_is_a_retryable_truncation() {
        let outcome = decode_every_split(C24C);
        assert!(!outcome.complete);
        let Err(err) = &outcome.result else {
            panic!("expected truncation")
        };
        assert!(matches!(err, StreamError::Truncated(_)));
        assert!(err.is_retryable());
    }

    #[test]
    fn l7_body_cut_after_partial_text_is_truncated_even_mid_event() {
        let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"index\":0,\"del";
        let outcome = decode_every_split(body);
        assert_eq!(outcome.deltas, vec![StreamDelta::Text("Hel".into())]);
        assert!(matches!(outcome.result, Err(StreamError::Truncated(_))));
        // A whole last event without its blank line is still decoded.
        let outcome = decode_every_split(&C24A[..C24A.len() - 2]);
        assert_eq!(ok(&outcome).stop, StopKind::EndTurn);
    }

    #[test]
    fn c24_bytes_after_done_are_ignored() {
        let body = format!(
            "{PLAIN_TEXT}data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"late\"}}}}]}}\n\ngarbage"
        );
        let outcome = decode_every_split(&body);
        assert_eq!(ok(&outcome).text, "Hello, world!");
    }

    #[test]
    fn c26_empty_and_blank_arguments_are_complete_tool_calls() {
        for arguments in ["\"\"", "\"  \""] {
            let outcome = decode_every_split(&c26_body(arguments));
            let response = ok(&outcome);
            assert_eq!(response.stop, StopKind::ToolUse, "{arguments}");
            assert_eq!(response.tool_calls.len(), 1);
            assert_eq!(
                response.tool_calls.first().map(|c| c.name.as_str()),
                Some("get_time")
            );
            // Without [DONE] and finish_reason, blank arguments still infer tool use.
            let no_finish = c26_body(arguments)
                .replace("\"finish_reason\":\"tool_calls\"", "\"finish_reason\":null");
            assert_eq!(ok(&decode_every_split(&no_finish)).stop, StopKind::ToolUse);
        }
    }

    #[test]
    fn c26_invalid_arguments_with_tool_calls_finish_are_kept_raw_for_the_loop_to_reject() {
        let outcome = decode_every_split(&c26_body("\"{\\\"a\\\":\""));
        let response = ok(&outcome);
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(
            response.tool_calls,
            vec![call("call_9", "get_time", "{\"a\":")]
        );
    }

    #[test]
    fn l1_length_finish_keeps_the_cut_tool_calls_with_max_tokens() {
        let body = C24C.replace("]}}]}", "]},\"finish_reason\":\"length\"}]}");
        assert_ne!(body, C24C);
        let outcome = decode_every_split(&body);
        let response = ok(&outcome);
        assert_eq!(response.stop, StopKind::MaxTokens);
        assert_eq!(response.tool_calls.len(), 1);
    }

    #[test]
    fn l7_content_filter_finish_is_a_refusal_and_unknown_reasons_end_the_turn() {
        let filtered = C24A.replace("\"stop\"", "\"content_filter\"");
        assert_eq!(ok(&decode_every_split(&filtered)).stop, StopKind::Refusal);
        let odd = C24A.replace("\"stop\"", "\"eos_token\"");
        assert_eq!(ok(&decode_every_split(&odd)).stop, StopKind::EndTurn);
    }

    #[test]
    fn c77_l7_streamed_refusal_deltas_are_text_and_make_a_refusal() {
        // OpenAI's stream of a refusal: `refusal` deltas (the first one empty, `content` null),
        // then `finish_reason: "stop"`.
        let chunk = |delta: Value, finish: Value| {
            let choice = serde_json::json!({"index": 0, "delta": delta, "finish_reason": finish});
            format!("data: {}\n\n", serde_json::json!({"choices": [choice]}))
        };
        let body = [
            chunk(
                serde_json::json!({"role": "assistant", "content": null, "refusal": ""}),
                Value::Null,
            ),
            chunk(serde_json::json!({"refusal": "I'm sorry, "}), Value::Null),
            chunk(
                serde_json::json!({"refusal": "I can't help with that."}),
                Value::Null,
            ),
            chunk(serde_json::json!({}), "stop".into()),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let outcome = decode_every_split(&body);
        let response = ok(&outcome);
        assert_eq!(response.stop, StopKind::Refusal);
        assert_eq!(response.text, "I'm sorry, I can't help with that.");
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Text("I'm sorry, ".into()),
                StreamDelta::Text("I can't help with that.".into())
            ]
        );
        // Without a finish reason, ended by `[DONE]`, it is a refusal too; an empty refusal
        // field alone is not.
        let no_finish = body.replace(",\"finish_reason\":\"stop\"", "");
        assert_ne!(no_finish, body);
        assert_eq!(ok(&decode_every_split(&no_finish)).stop, StopKind::Refusal);
        let empty = C24A.replace(
            "\"content\":\"Done.\"",
            "\"content\":\"Done.\",\"refusal\":\"\"",
        );
        assert_ne!(empty, C24A);
        assert_eq!(ok(&decode_every_split(&empty)).stop, StopKind::EndTurn);
    }

    #[test]
    fn l5_an_abort_finish_is_a_retryable_failed_attempt_not_an_answer() {
        // vLLM's stream of a request its engine aborted: what came, then `abort`, `[DONE]`.
        let aborted = C24A.replace("\"stop\"", "\"abort\"") + "data: [DONE]\n\n";
        let outcome = decode_every_split(&aborted);
        let Err(error) = &outcome.result else {
            panic!("an aborted stream is not an answer: {:?}", outcome.result);
        };
        assert!(error.is_retryable(), "{error}");
        assert!(error.to_string().contains("abort"), "{error}");
        // Only the last reason counts: an `abort` followed by a real end is that end.
        let ended = C24A.replace("\"stop\"", "\"abort\"") + &C24A.replace("Done.", "");
        assert_eq!(ok(&decode_every_split(&ended)).stop, StopKind::EndTurn);
    }

    #[test]
    fn l5_error_object_in_a_chunk_is_a_retryable_provider_error_and_sticks() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
            "data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"server_error\"}}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"never\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(
            outcome.result,
            Err(StreamError::Provider {
                message: "Overloaded".into(),
                retryable: true
            })
        );
        assert_eq!(outcome.deltas, vec![StreamDelta::Text("Hi".into())]);

        let mut decoder = ChatDecoder::new("c".into());
        let mut out = Vec::new();
        assert!(decoder.feed(body.as_bytes(), &mut out).is_err());
        assert!(decoder.feed(b"data: [DONE]\n\n", &mut out).is_err());
        assert!(decoder.finish(&mut out).is_err());
    }

    #[test]
    fn l5_in_band_error_chunks_of_gateways_are_failed_attempts_not_short_answers() {
        // OpenRouter (error object plus finish_reason "error"), LiteLLM, vLLM: each followed by
        // a well-formed end, which must not turn the attempt into an empty answer.
        for first in [
            r#"{"id":"gen-1","object":"chat.completion.chunk","provider":"Anthropic","error":{"code":502,"message":"Provider returned error"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
            r#"{"error":{"message":"litellm.RateLimitError: upstream 429","type":"rate_limit_error","param":null,"code":"429"}}"#,
            r#"{"object":"error","message":"upstream overloaded","type":"InternalServerError","param":null,"code":500}"#,
        ] {
            let end = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
            let body = format!("data: {first}\n\ndata: {end}\n\ndata: [DONE]\n\n");
            let outcome = decode_every_split(&body);
            assert!(
                matches!(
                    outcome.result,
                    Err(StreamError::Provider {
                        retryable: true,
                        ..
                    })
                ),
                "{first}: {:?}",
                outcome.result
            );
        }
    }

    #[test]
    fn l5_error_event_and_malformed_complete_chunk_are_provider_errors() {
        let event = "event: error\ndata: {\"message\":\"rate limited\"}\n\n";
        assert_eq!(
            decode_every_split(event).result,
            Err(StreamError::Provider {
                message: "rate limited".into(),
                retryable: true
            })
        );
        let malformed = "data: {not json}\n\ndata: [DONE]\n\n";
        assert!(matches!(
            decode_every_split(malformed).result,
            Err(StreamError::Provider {
                retryable: true,
                ..
            })
        ));
    }

    #[test]
    fn l9_split_inside_a_multibyte_character_decodes_whole() {
        let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"héllo 🐝\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let outcome = decode_every_split(body);
        assert_eq!(ok(&outcome).text, "héllo 🐝");
        assert_eq!(text_of(&outcome.deltas), "héllo 🐝");
    }

    #[test]
    fn l9_lone_surrogate_escape_in_content_becomes_replacement_character() {
        let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\ud800b\\udc00\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let outcome = decode_every_split(body);
        assert_eq!(ok(&outcome).text, "a\u{fffd}b\u{fffd}");
    }

    #[test]
    fn l7_reasoning_field_is_a_thought_and_reasoning_content_wins_when_both_are_sent() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r1\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r2\",\"reasoning_content\":\"r2\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\"},\"finish_reason\":\"stop\"}]}\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(ok(&outcome).thinking, "r1r2");
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Thought("r1".into()),
                StreamDelta::Thought("r2".into()),
                StreamDelta::Text("t".into())
            ]
        );
    }

    #[test]
    fn l7_finish_twice_does_not_hand_out_the_response_again() {
        let mut decoder = ChatDecoder::new("c".into());
        let mut out = Vec::new();
        decoder.feed(PLAIN_TEXT.as_bytes(), &mut out).unwrap();
        assert!(decoder.finish(&mut out).is_ok());
        assert!(matches!(
            decoder.finish(&mut out),
            Err(StreamError::Truncated(_))
        ));
    }

    #[test]
    fn l9_long_stream_fed_byte_by_byte_decodes_in_linear_time() {
        let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"abcdefgh\",\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"xxxxxxxx\"}}]}}]}\n\n";
        let mut body = String::from(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"n\"}}]}}]}\n\n",
        );
        for _ in 0..10_000 {
            body.push_str(chunk);
        }
        body.push_str(
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        );
        let mut decoder = ChatDecoder::new("c".into());
        let mut out = Vec::new();
        for byte in body.as_bytes().chunks(1) {
            decoder.feed(byte, &mut out).unwrap();
        }
        let response = decoder.finish(&mut out).unwrap();
        assert_eq!(response.text.len(), 80_000);
        assert_eq!(
            response.tool_calls.first().map(|c| c.arguments.len()),
            Some(80_000)
        );
        assert_eq!(out.len(), 10_000);
    }

    // ---------------------------------------------------------------- request tests

    fn body_json(request: &HttpRequest) -> Value {
        serde_json::from_slice(&request.body.to_vec()).unwrap()
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
    }

    #[test]
    fn l7_request_has_url_headers_and_streaming_body() {
        let tools = [ToolDef {
            name: "fs__read_file".into(),
            description: "Read a file".into(),
            input_schema: schema(),
        }];
        let messages = [Message::User { text: "hi".into() }];
        let req = LlmRequest {
            system: Some("Be brief."),
            tools: &tools,
            max_output_tokens: 4096,
            ..LlmRequest::for_tests("gpt-x", &messages)
        };
        let request = build_request(
            "http://127.0.0.1:5000/v1",
            "sk-test",
            &req,
            &ChatOptions::default(),
        );
        assert_eq!(request.url, "http://127.0.0.1:5000/v1/chat/completions");
        assert_eq!(
            request.headers,
            crate::llm::decoder_tests::streaming_headers(&[("authorization", "Bearer sk-test")])
        );
        assert_eq!(
            body_json(&request),
            json!({
                "model": "gpt-x",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "hi"}
                ],
                "tools": [{"type": "function", "function": {"name": "fs__read_file", "description": "Read a file", "parameters": schema()}}],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 4096
            })
        );
        // Compact JSON, keys in the documented order.
        let text = String::from_utf8(request.body.to_vec()).unwrap();
        assert!(
            text.starts_with("{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"system\""),
            "{text}"
        );
        assert!(!text.contains('\n') && !text.contains(": "));
    }

    #[test]
    fn c41_the_output_cap_goes_as_max_completion_tokens_when_asked() {
        let messages = [Message::User { text: "hi".into() }];
        let req = LlmRequest {
            max_output_tokens: 321,
            ..LlmRequest::for_tests("gpt-5.4", &messages)
        };
        let options = ChatOptions {
            max_completion_tokens: true,
            reasoning_content: false,
            ..ChatOptions::default()
        };
        let body = body_json(&build_request("http://h/v1", "", &req, &options));
        assert_eq!(body["max_completion_tokens"], 321);
        assert!(body.get("max_tokens").is_none(), "{body}");
        let body = body_json(&build_request(
            "http://h/v1",
            "",
            &req,
            &ChatOptions::default(),
        ));
        assert_eq!(body["max_tokens"], 321);
        assert!(body.get("max_completion_tokens").is_none(), "{body}");
    }

    #[test]
    fn l7_no_api_key_means_no_authorization_header_and_no_tools_means_no_tools_key() {
        let messages = [Message::User {
            text: "summarise".into(),
        }];
        let req = LlmRequest {
            max_output_tokens: 100,
            ..LlmRequest::for_tests("m", &messages)
        };
        let request = build_request("http://h/v1/", "", &req, &ChatOptions::default());
        assert_eq!(request.url, "http://h/v1/chat/completions");
        assert!(request.headers.iter().all(|(k, _)| k != "authorization"));
        assert_eq!(
            body_json(&request),
            json!({
                "model": "m",
                "messages": [{"role": "user", "content": "summarise"}],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 100
            })
        );
    }

    #[test]
    fn l7_assistant_tool_calls_and_tool_results_round_trip_with_empty_content_as_empty_string() {
        let messages = [
            Message::User {
                text: "list".into(),
            },
            Message::Assistant {
                text: String::new(),
                thinking: "secret reasoning".into(),
                reasoning: Vec::new(),
                tool_calls: vec![
                    call("call_1", "fs__list_dir", "{\"p\":\".\"}"),
                    call("call_t1_1", "clock__now", ""),
                    call("call_3", "clock__tz", "  "),
                    call("call_4", "fs__write", "{\"a\":"),
                ],
            },
            Message::ToolResult {
                call_id: "call_1".into(),
                name: "fs__list_dir".into(),
                text: "a.txt\nb.txt".into(),
                is_error: false,
            },
            Message::ToolResult {
                call_id: "call_t1_1".into(),
                name: "clock__now".into(),
                text: "12:00".into(),
                is_error: false,
            },
            Message::ToolResult {
                call_id: "call_3".into(),
                name: "clock__tz".into(),
                text: "UTC".into(),
                is_error: false,
            },
            Message::ToolResult {
                call_id: "call_4".into(),
                name: "fs__write".into(),
                text: "arguments were not valid JSON".into(),
                is_error: true,
            },
            Message::Assistant {
                text: "Done \"quoted\" é".into(),
                thinking: String::new(),
                reasoning: Vec::new(),
                tool_calls: vec![],
            },
        ];
        let req = LlmRequest {
            system: Some(""),
            max_output_tokens: 1,
            ..LlmRequest::for_tests("m", &messages)
        };
        let request = build_request("http://h/v1", "k", &req, &ChatOptions::default());
        assert_eq!(
            body_json(&request)["messages"],
            json!([
                {"role": "user", "content": "list"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "fs__list_dir", "arguments": "{\"p\":\".\"}"}},
                    {"id": "call_t1_1", "type": "function", "function": {"name": "clock__now", "arguments": "{}"}},
                    {"id": "call_3", "type": "function", "function": {"name": "clock__tz", "arguments": "{}"}},
                    {"id": "call_4", "type": "function", "function": {"name": "fs__write", "arguments": "{\"a\":"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
                {"role": "tool", "tool_call_id": "call_t1_1", "content": "12:00"},
                {"role": "tool", "tool_call_id": "call_3", "content": "UTC"},
                {"role": "tool", "tool_call_id": "call_4", "content": "Error: arguments were not valid JSON"},
                {"role": "assistant", "content": "Done \"quoted\" é"}
            ])
        );
    }

    fn chat_body(messages: &[Message], options: &ChatOptions) -> Value {
        let req = LlmRequest {
            system: Some("sys"),
            max_output_tokens: 1,
            ..LlmRequest::for_tests("m", messages)
        };
        body_json(&build_request("http://h/v1", "", &req, options))
    }

    fn assistant(text: &str, calls: Vec<ToolCall>) -> Message {
        Message::Assistant {
            text: text.into(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: calls,
        }
    }

    fn tool_result(id: &str, text: &str) -> Message {
        Message::ToolResult {
            call_id: id.into(),
            name: "n".into(),
            text: text.into(),
            is_error: false,
        }
    }

    #[test]
    fn c61_the_synthetic_hook_call_joins_the_preceding_assistant_message() {
        // The case's history: the model's answer, then the hook's call as a second message.
        let messages = [
            Message::User {
                text: "finish".into(),
            },
            assistant("All done.", vec![]),
            assistant("", vec![call("buzz_hook__Stop_h_1", "h___Stop", "{}")]),
            tool_result("buzz_hook__Stop_h_1", "{\"hook\":\"_Stop\"}"),
        ];
        assert_eq!(
            chat_body(&messages, &ChatOptions::default())["messages"],
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "finish"},
                {"role": "assistant", "content": "All done.", "tool_calls": [
                    {"id": "buzz_hook__Stop_h_1", "type": "function", "function": {"name": "h___Stop", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "buzz_hook__Stop_h_1", "content": "{\"hook\":\"_Stop\"}"}
            ])
        );
    }

    #[test]
    fn c61_strict_alternation_users_merge_empty_assistants_vanish_tool_results_get_a_bridge() {
        let messages = [
            // A compaction summary followed by the live prompt: one user message.
            Message::User {
                text: "[summary]".into(),
            },
            Message::User {
                text: "the prompt".into(),
            },
            assistant("", vec![call("c1", "fs__x", "{}")]),
            tool_result("c1", "cancelled"),
            // The next prompt right after tool results: a bridge first.
            Message::User {
                text: "next".into(),
            },
            // An empty answer (cut at once by max_tokens) then the nudge: nothing of it sent.
            assistant("", vec![]),
            Message::User {
                text: "continue".into(),
            },
        ];
        assert_eq!(
            chat_body(&messages, &ChatOptions::default())["messages"],
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "[summary]\n\nthe prompt"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "fs__x", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "cancelled"},
                {"role": "assistant", "content": TOOL_RESULTS_BRIDGE},
                {"role": "user", "content": "next\n\ncontinue"}
            ])
        );
    }

    #[test]
    fn c39_l10_chat_reasoning_fields_are_replayed_under_the_name_they_came_in() {
        let with = |thinking: &str, reasoning: Vec<ReasoningBlock>, calls: Vec<ToolCall>| {
            Message::Assistant {
                text: "t".into(),
                thinking: thinking.into(),
                reasoning,
                tool_calls: calls,
            }
        };
        let details =
            json!([{"type": "reasoning.text", "text": "R", "signature": "S", "index": 0}]);
        let messages = [
            Message::User { text: "q".into() },
            with(
                "DS",
                vec![ReasoningBlock::ChatField(
                    ChatReasoningField::ReasoningContent,
                )],
                vec![call("c1", "fs__x", "{}")],
            ),
            tool_result("c1", "r"),
            with(
                "OR",
                vec![
                    ReasoningBlock::ChatField(ChatReasoningField::Reasoning),
                    ReasoningBlock::ChatDetails(details.clone()),
                ],
                vec![],
            ),
            // Text the provider never sent as a field (another route's) is not sent.
            with("plain", vec![], vec![]),
        ];
        let body = chat_body(&messages, &ChatOptions::default());
        let m = &body["messages"];
        assert_eq!(m[2]["reasoning_content"], "DS");
        assert!(m[2].get("reasoning").is_none());
        assert_eq!(m[4]["reasoning"], "OR");
        assert_eq!(m[4]["reasoning_details"], details);
        // Consecutive assistants merged: the plain one adds its text, no field.
        assert_eq!(m[4]["content"], "t\n\nt");
        // DeepSeek-style server (learned): every assistant message carries reasoning_content,
        // "" when it has none — the bridge and the agent's synthetic calls included.
        let options = ChatOptions {
            max_completion_tokens: false,
            reasoning_content: true,
            ..ChatOptions::default()
        };
        let messages = [
            Message::User {
                text: "[summary]".into(),
            },
            assistant(
                "",
                vec![call("buzz_hook__PostCompact_g_1", "g___PostCompact", "{}")],
            ),
            tool_result("buzz_hook__PostCompact_g_1", "{}"),
            Message::User {
                text: "prompt".into(),
            },
        ];
        let body = chat_body(&messages, &options);
        let assistants: Vec<&Value> = body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "assistant")
            .collect();
        assert_eq!(assistants.len(), 2, "{body}");
        for a in assistants {
            assert_eq!(a["reasoning_content"], "", "{a}");
        }
    }

    #[test]
    fn l10_reasoning_fields_and_details_are_decoded_for_replay() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"Th\",\"reasoning_details\":[{\"type\":\"reasoning.text\",\"text\":\"Th\",\"index\":0,\"format\":\"anthropic-claude-v1\"}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"ink\",\"reasoning_details\":[{\"type\":\"reasoning.text\",\"text\":\"ink\",\"index\":0}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_details\":[{\"type\":\"reasoning.text\",\"signature\":\"SIG\",\"index\":0},{\"type\":\"reasoning.encrypted\",\"data\":\"ENC\",\"index\":1}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        let response = ok(&outcome);
        assert_eq!(response.thinking, "Think");
        assert_eq!(
            response.reasoning,
            vec![
                ReasoningBlock::ChatField(ChatReasoningField::Reasoning),
                ReasoningBlock::ChatDetails(json!([
                    {"type": "reasoning.text", "text": "Think", "index": 0, "format": "anthropic-claude-v1", "signature": "SIG"},
                    {"type": "reasoning.encrypted", "data": "ENC", "index": 1}
                ]))
            ]
        );
    }

    #[test]
    fn l7_decoded_response_rebuilds_into_a_valid_request_c21_ids_reused() {
        let outcome = decode_every_split(C21);
        let response = ok(&outcome).clone();
        let results: Vec<Message> = response
            .tool_calls
            .iter()
            .map(|c| Message::ToolResult {
                call_id: c.id.clone(),
                name: c.name.clone(),
                text: "ok".into(),
                is_error: false,
            })
            .collect();
        let mut messages = vec![Message::Assistant {
            text: response.text,
            thinking: response.thinking,
            reasoning: response.reasoning,
            tool_calls: response.tool_calls,
        }];
        messages.extend(results);
        let req = LlmRequest {
            max_output_tokens: 1,
            ..LlmRequest::for_tests("m", &messages)
        };
        let body = body_json(&build_request(
            "http://h",
            "",
            &req,
            &ChatOptions::default(),
        ));
        assert_eq!(body["messages"][0]["tool_calls"][1]["id"], "call_t1_2");
        assert_eq!(body["messages"][2]["tool_call_id"], "call_t1_2");
    }

    #[test]
    fn p2_debug_of_a_chat_decoder_shows_sizes_not_the_streamed_text() {
        let mut decoder = ChatDecoder::new("c".into());
        let mut out = Vec::new();
        decoder.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"secret\",\"reasoning\":\"hidden thought\"}}]}\n\n", &mut out).unwrap();
        let shown = format!("{decoder:?}");
        assert_eq!(
            shown,
            "ChatDecoder(text 6 B, thinking 14 B, 0 call slots, finish None, done false)"
        );
    }

    #[test]
    fn l7_each_finish_reason_spelling_is_shown_as_its_stop_kind() {
        for (reason, shown) in [
            ("tool_calls", "Some(ToolUse)"),
            ("function_call", "Some(ToolUse)"),
            ("tool_use", "Some(ToolUse)"),
            ("length", "Some(MaxTokens)"),
            ("max_tokens", "Some(MaxTokens)"),
            ("model_length", "Some(ContextFull)"),
            ("content_filter", "Some(Refusal)"),
            ("refusal", "Some(Refusal)"),
            ("stop", "Some(EndTurn)"),
            ("something_new", "Some(EndTurn)"),
        ] {
            let mut decoder = ChatDecoder::new("c".into());
            let chunk = format!(
                "data: {{\"choices\":[{{\"delta\":{{}},\"finish_reason\":\"{reason}\"}}]}}\n\n"
            );
            decoder.feed(chunk.as_bytes(), &mut Vec::new()).unwrap();
            let debug = format!("{decoder:?}");
            assert!(
                debug.contains(&format!("finish {shown},")),
                "{reason}: {debug}"
            );
        }
    }

    #[test]
    fn c24_b_a_finish_reason_or_done_makes_the_answer_final() {
        let mut decoder = ChatDecoder::new("c".into());
        let mut out = Vec::new();
        decoder
            .feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n", &mut out)
            .unwrap();
        assert!(!decoder.has_final_answer(), "the answer may go on");
        decoder
            .feed(
                b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                &mut out,
            )
            .unwrap();
        assert!(decoder.has_final_answer() && !decoder.is_complete());

        let mut decoder = ChatDecoder::new("c".into());
        decoder.feed(b"data: [DONE]\n\n", &mut out).unwrap();
        assert!(decoder.has_final_answer() && decoder.is_complete());
    }

    #[test]
    fn c21_an_unindexed_delta_repeating_the_current_id_and_name_continues_that_call() {
        // Servers that omit `index` and repeat the id and name on every delta of a call.
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"x1\",\"function\":{\"name\":\"a\",\"arguments\":\"{\\\"k\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"x1\",\"function\":{\"name\":\"a\",\"arguments\":\"1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(ok(&outcome).tool_calls, vec![call("x1", "a", "{\"k\":1}")]);
    }

    /// One tool-call delta with `arguments_json` (JSON-escaped), then `[DONE]` without a
    /// finish reason (C23).
    fn done_without_finish(arguments_json: &str) -> String {
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"call_9\",\"function\":{{\"name\":\"get_time\",\"arguments\":{arguments_json}}}}}]}}}}]}}\n\n\
             data: [DONE]\n\n"
        )
    }

    #[test]
    fn c23_c26_blank_arguments_at_done_without_a_finish_reason_are_a_whole_call() {
        for blank in ["\"\"", "\"  \""] {
            let outcome = decode_every_split(&done_without_finish(blank));
            let response = ok(&outcome);
            assert_eq!(response.stop, StopKind::ToolUse, "{blank}");
            assert_eq!(response.tool_calls.len(), 1, "{blank}");
        }
    }

    #[test]
    fn c23_l9_arguments_with_an_invalid_escape_at_done_are_whole_not_cut() {
        // `{"a":"\q"}`: not strict JSON (an unknown escape) but whole, so the call runs (the
        // escape is replaced, L9) instead of the stream being judged cut.
        let outcome = decode_every_split(&done_without_finish(r#""{\"a\":\"\\q\"}""#));
        let response = ok(&outcome);
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(response.tool_calls[0].arguments, r#"{"a":"\q"}"#);
    }

    #[test]
    fn l10_merged_assistant_messages_send_each_reasoning_field_once() {
        let thought = |text: &str, thinking: &str, field: ChatReasoningField| Message::Assistant {
            text: text.into(),
            thinking: thinking.into(),
            reasoning: vec![ReasoningBlock::ChatField(field)],
            tool_calls: Vec::new(),
        };
        for (field, options) in [
            (ChatReasoningField::Reasoning, ChatOptions::default()),
            (
                ChatReasoningField::ReasoningContent,
                ChatOptions {
                    max_completion_tokens: false,
                    reasoning_content: true,
                    ..ChatOptions::default()
                },
            ),
        ] {
            let messages = [
                Message::User { text: "q".into() },
                thought("a", "one", field),
                thought("b", "two", field),
            ];
            let req = LlmRequest {
                max_output_tokens: 1,
                ..LlmRequest::for_tests("m", &messages)
            };
            let body = build_request("http://h/v1", "", &req, &options)
                .body
                .to_vec();
            let text = String::from_utf8(body).unwrap();
            let key = format!("\"{}\":", field.name());
            assert_eq!(text.matches(key.as_str()).count(), 1, "{text}");
            assert!(text.contains(&format!("{key}\"one\\n\\ntwo\"")), "{text}");
        }
    }
}
