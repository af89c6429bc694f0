//! OpenAI Responses API (SPEC L8, `OPENAI_COMPAT_API=responses`): the request builder and the
//! streamed-response decoder.
//!
//! Stateless use only (`store: false`, the whole history is sent every call), so it works with
//! OpenAI and with Responses-compatible servers (vLLM, Ollama, gateways).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

use super::request::{
    BodyCache, CacheKey, ErrorText, Last, Planned, WireElement, arguments_or_empty_object,
    assemble, bearer, body_capacity, history_json, push_item, streaming_json_post, write_field,
};
use super::route::{
    ErrorReaction, Learned, ProviderRoute, drop_prompt_cache_key, drop_reasoning_effort,
    is_openai_reasoning_model, openai_effort, rejects_field, sends_prompt_cache_key,
};
use super::sse_stream::{
    CallSlot, EventHandler, JsonStr, SseState, StreamedText, parse_event_json, read_view,
    str_or_empty, take_calls,
};
use crate::config::{Config, Effort};
#[allow(unused_imports, reason = "named by doc links and by the unit tests")]
use crate::llm::ToolCall;
use crate::llm::{
    HttpRequest, LlmRequest, LlmResponse, Message, ReasoningBlock, StopKind, StreamDecoder,
    StreamDelta, StreamError, ToolDef, Usage,
};
use crate::sse::SseEvent;

/// Build the streaming `POST {base_url}/responses` request (SPEC L8).
///
/// * `base_url`: e.g. `https://api.openai.com/v1` (a trailing `/` is tolerated).
/// * `api_key`: sent as `authorization: Bearer <key>` only when non-empty (local servers).
/// * Headers: `content-type: application/json`, `accept: text/event-stream`.
/// * Body (compact JSON, keys in this order): `model`; `instructions` (the system prompt, only
///   when present and non-empty); `input` (below); `tools` (`[{"type":"function","name",
///   "description","parameters","strict":false}]`, omitted when empty); `stream: true`;
///   `store: false`; `max_output_tokens` (tokens).
///
/// `input` items, in history order: user → `{"role":"user","content":text}`; assistant → its
/// reasoning items (below), then
/// `{"type":"message","role":"assistant","content":[{"type":"output_text","text"}]}` when its
/// text is non-empty, then `{"type":"function_call","call_id","name","arguments"}` per call
/// (`arguments` the model's own text, `"{}"` when blank, C26); tool result →
/// `{"type":"function_call_output","call_id","output"}` with `Error: ` prefixed to an error
/// result.
///
/// Reasoning (SPEC L10, case C39): with `options.include_encrypted_reasoning`, or with a
/// reasoning effort sent (SPEC L12: the operator says the model reasons), the body asks for
/// `include: ["reasoning.encrypted_content"]` (set for OpenAI reasoning models, which are the
/// ones that return reasoning items; others may reject the value). Reasoning items that
/// carry `encrypted_content` are replayed verbatim before the items of their assistant message
/// — the only form a stateless (`store: false`) request may send back: an item with only an id
/// is answered "Items are not persisted when `store` is set to false". A reasoning item must be
/// followed by the item it preceded, so it is replayed only when its message sends a text or a
/// call (a hook's synthetic call joined to the answer counts).
///
/// `strict: false` is explicit because the Responses API treats function tools as strict by
/// default, and strict mode rejects ordinary MCP schemas (optional properties,
/// `additionalProperties`).
///
/// Serialized in one pass straight into the body buffer: linear in the history size.
#[cfg(test)]
#[must_use]
pub(crate) fn build_request(
    base_url: &str,
    api_key: &str,
    req: &LlmRequest<'_>,
    options: &ResponsesOptions,
) -> HttpRequest {
    build_request_cached(base_url, api_key, req, options, None)
}

/// [`build_request`], reusing and extending `cache`, which holds the serialized items of
/// `req.messages` as sent by earlier requests of the same history (issue #15). The body is
/// byte for byte the one [`build_request`] builds; its history part is a piece shared with the
/// cache.
#[must_use]
pub(crate) fn build_request_cached(
    base_url: &str,
    api_key: &str,
    req: &LlmRequest<'_>,
    options: &ResponsesOptions,
    cache: Option<&mut BodyCache>,
) -> HttpRequest {
    let mut head = Vec::with_capacity(256 + req.system.map_or(0, str::len));
    head.push(b'{');
    write_field(&mut head, "model", req.model);
    if let Some(system) = req.system.filter(|s| !s.is_empty()) {
        write_field(&mut head, "instructions", system);
    }
    head.extend_from_slice(b",\"input\":[");
    let capacity = if cache.is_none() {
        body_capacity(req, 96)
    } else {
        0
    };
    let history = history_json(
        req.messages,
        cache.map(|c| (c, CacheKey::Responses)),
        capacity,
        None,
        wire_items,
    );
    let mut tail = Vec::with_capacity(128);
    tail.push(b']');
    if !req.tools.is_empty() {
        write_field(&mut tail, "tools", &WireTools(req.tools));
    }
    write_field(&mut tail, "stream", &true);
    write_field(&mut tail, "store", &false);
    // An effort sent says the model reasons (SPEC L12): its reasoning must come back too.
    let effort_sent = req.effort.is_some() && options.reasoning;
    if options.include_encrypted_reasoning || effort_sent {
        write_field(&mut tail, "include", &["reasoning.encrypted_content"]);
    }
    write_field(&mut tail, "max_output_tokens", &req.max_output_tokens);
    if let Some(cache) = req.cache.filter(|_| options.prompt_cache_key) {
        write_field(&mut tail, "prompt_cache_key", cache.key);
    }
    let reasoning = Reasoning {
        effort: req.effort.map(openai_effort),
        summary: options.reasoning_summary,
    };
    if options.reasoning && (reasoning.effort.is_some() || reasoning.summary.is_some()) {
        write_field(&mut tail, "reasoning", &reasoning);
    }
    tail.push(b'}');
    streaming_json_post(
        format!("{}/responses", base_url.trim_end_matches('/')),
        bearer(api_key),
        assemble(head, false, history, &tail),
    )
}

/// The Responses options for one request (SPEC L8, L10): encrypted reasoning is asked for when
/// the model is an OpenAI reasoning model, the models that return reasoning items.
#[must_use]
pub(crate) fn responses_options(cfg: &Config, model: &str, learned: &Learned) -> ResponsesOptions {
    ResponsesOptions {
        include_encrypted_reasoning: is_openai_reasoning_model(model),
        prompt_cache_key: sends_prompt_cache_key(cfg, learned),
        reasoning: !learned.no_reasoning_effort,
        reasoning_summary: match cfg.thinking_summary.as_deref() {
            Some("auto") => Some("auto"),
            Some("concise") => Some("concise"),
            Some("detailed") => Some("detailed"),
            _ => None,
        },
    }
}

/// The Responses `reasoning` parameter (SPEC L12): `effort` and `summary`, each only when set.
#[derive(Serialize)]
struct Reasoning {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'static str>,
}

/// The Responses route (SPEC L8): [`build_request_cached`] with [`responses_options`],
/// [`ResponsesDecoder`].
pub(crate) struct Responses;

impl ProviderRoute for Responses {
    fn build_request(
        &self,
        cfg: &Config,
        req: &LlmRequest<'_>,
        learned: &Learned,
        cache: Option<&mut BodyCache>,
    ) -> HttpRequest {
        let options = responses_options(cfg, req.model, learned);
        build_request_cached(&cfg.base_url, &cfg.api_key, req, &options, cache)
    }

    fn decoder(&self, id_prefix: String) -> Box<dyn StreamDecoder> {
        Box::new(ResponsesDecoder::new(id_prefix))
    }

    /// A server that rejects `prompt_cache_key` (SPEC L11) gets requests without it.
    fn on_http_error(
        &self,
        cfg: &Config,
        model: &str,
        effort: Option<Effort>,
        status: u16,
        body: &[u8],
        learned: &mut Learned,
    ) -> Option<ErrorReaction> {
        let sent = responses_options(cfg, model, learned);
        if sent.prompt_cache_key && rejects_field(status, body, "prompt_cache_key") {
            return Some(drop_prompt_cache_key(learned));
        }
        // SPEC L12: a server that does not take `reasoning` gets requests without it.
        let carried = effort.is_some() || sent.reasoning_summary.is_some();
        (carried && sent.reasoning && rejects_field(status, body, "reasoning"))
            .then(|| drop_reasoning_effort(learned, "reasoning"))
    }
}

/// The per-server choices of a Responses request (SPEC L8, L10), decided by
/// [`responses_options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ResponsesOptions {
    /// Ask for `include: ["reasoning.encrypted_content"]`, so reasoning items can be replayed.
    pub include_encrypted_reasoning: bool,
    /// Send the request's prompt cache key as `prompt_cache_key` (SPEC L11), when it has one.
    pub prompt_cache_key: bool,
    /// Send `reasoning` (the request's effort, [`Self::reasoning_summary`]; SPEC L12) when
    /// there is one: until the server rejected the field.
    pub reasoning: bool,
    /// `BUZZ_AGENT_THINKING_SUMMARY`: `reasoning.summary`.
    pub reasoning_summary: Option<&'static str>,
}

/// `history[start..]` as `input` elements: each message gives its own items, whatever comes
/// before or after it, so every element is final at once.
fn wire_items(history: &[Message], start: usize, _last: Last) -> Vec<Planned<WireMessage<'_>>> {
    history
        .iter()
        .enumerate()
        .skip(start)
        .map(|(i, message)| Planned {
            element: WireMessage(message),
            source: i,
            kind: Last::Nothing,
            closed: true,
        })
        .collect()
}

/// One history message as its `input` items (none, one or several).
struct WireMessage<'a>(&'a Message);

impl WireElement for WireMessage<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self.0 {
            Message::User { text } => push_item(
                out,
                &UserItem {
                    role: "user",
                    content: text,
                },
            ),
            Message::Assistant {
                text,
                thinking: _,
                reasoning,
                tool_calls,
            } => {
                if !text.is_empty() || !tool_calls.is_empty() {
                    for block in reasoning {
                        if let ReasoningBlock::ResponsesItem(item) = block {
                            push_item(out, item);
                        }
                    }
                }
                if !text.is_empty() {
                    push_item(out, &AssistantItem(text));
                }
                for call in tool_calls {
                    push_item(
                        out,
                        &FunctionCallItem {
                            kind: "function_call",
                            call_id: &call.id,
                            name: &call.name,
                            arguments: arguments_or_empty_object(&call.arguments),
                        },
                    );
                }
            }
            Message::ToolResult {
                call_id,
                name: _,
                text,
                is_error,
            } => push_item(
                out,
                &FunctionOutputItem {
                    call_id,
                    text,
                    is_error: *is_error,
                },
            ),
        }
    }
}

#[derive(Serialize)]
struct UserItem<'a> {
    role: &'static str,
    content: &'a str,
}

/// `{"type":"message","role":"assistant","content":[{"type":"output_text","text"}]}`.
struct AssistantItem<'a>(&'a str);

impl Serialize for AssistantItem<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct OutputText<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            text: &'a str,
        }
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("type", "message")?;
        map.serialize_entry("role", "assistant")?;
        map.serialize_entry(
            "content",
            &[OutputText {
                kind: "output_text",
                text: self.0,
            }],
        )?;
        map.end()
    }
}

#[derive(Serialize)]
struct FunctionCallItem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    call_id: &'a str,
    name: &'a str,
    arguments: &'a str,
}

/// `{"type":"function_call_output","call_id","output"}`, `Error: ` prefixed to an error.
struct FunctionOutputItem<'a> {
    call_id: &'a str,
    text: &'a str,
    is_error: bool,
}

impl Serialize for FunctionOutputItem<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("type", "function_call_output")?;
        map.serialize_entry("call_id", self.call_id)?;
        if self.is_error {
            map.serialize_entry("output", &ErrorText(self.text))?;
        } else {
            map.serialize_entry("output", self.text)?;
        }
        map.end()
    }
}

struct WireTools<'a>(&'a [ToolDef]);

impl Serialize for WireTools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|tool| WireTool {
            kind: "function",
            name: &tool.name,
            description: &tool.description,
            parameters: &tool.input_schema,
            strict: false,
        }))
    }
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    strict: bool,
}

/// A Responses stream event as the decoder reads it: the fields it looks at, typed, their
/// strings borrowed from the payload (SPEC L8, L9). Unknown fields (`sequence_number`, an
/// item's `content`, the response's `model`, `tools`, …) are skipped without being built,
/// `response.completed`'s copy of the whole output included.
///
/// The common event is parsed straight into it (serde derive over the payload text). An event
/// it cannot take as it is — a field of another type than the view's (a number as `delta`, a
/// float `output_index`, an `item` that is not an object), a duplicate key, a lone surrogate
/// escape, not an object — goes the general way: parsed into a `Value` with `parse_lossy` and
/// read into the same view with the general path's looser rules ([`EventView::of`]: a field
/// of another type counts as absent). So do the events that need more than the view
/// ([`EventView::decodes_alone`]): errors, and those that keep a reasoning item whole. One
/// handler ([`ResponsesDecoder::handle`]) decides for both.
#[derive(serde::Deserialize)]
struct EventView<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<JsonStr<'a>>,
    #[serde(borrow)]
    item_id: Option<JsonStr<'a>>,
    output_index: Option<u64>,
    /// A text, refusal, reasoning or arguments delta.
    #[serde(borrow)]
    delta: Option<JsonStr<'a>>,
    /// `output_text.done`'s whole text.
    #[serde(borrow)]
    text: Option<JsonStr<'a>>,
    /// `function_call_arguments.done`'s final arguments.
    #[serde(borrow)]
    arguments: Option<JsonStr<'a>>,
    #[serde(borrow)]
    name: Option<JsonStr<'a>>,
    /// `output_item.added` / `.done`'s item.
    #[serde(borrow)]
    item: Option<ItemView<'a>>,
    /// The response of `response.created`, `.completed`, `.incomplete`, ….
    #[serde(borrow)]
    response: Option<ResponseView<'a>>,
}

/// An output item: what a `function_call` gives, and the type of the others.
#[derive(serde::Deserialize)]
struct ItemView<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<JsonStr<'a>>,
    #[serde(borrow)]
    id: Option<JsonStr<'a>>,
    #[serde(borrow)]
    call_id: Option<JsonStr<'a>>,
    #[serde(borrow)]
    name: Option<JsonStr<'a>>,
    #[serde(borrow)]
    arguments: Option<JsonStr<'a>>,
}

/// An event's `response`.
#[derive(serde::Deserialize, Default)]
struct ResponseView<'a> {
    usage: Option<UsageView>,
    #[serde(borrow)]
    status: Option<JsonStr<'a>>,
    #[serde(borrow)]
    incomplete_details: Option<IncompleteView<'a>>,
    /// Only the items' types: whether one is a reasoning item (see
    /// [`EventView::decodes_alone`]).
    #[serde(borrow)]
    output: Option<Vec<OutputView<'a>>>,
}

/// A response's `usage`.
#[derive(serde::Deserialize)]
struct UsageView {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<UsageDetailsView>,
}

/// `usage.input_tokens_details`.
#[derive(serde::Deserialize)]
struct UsageDetailsView {
    cached_tokens: Option<u64>,
}

/// A response's `incomplete_details`.
#[derive(serde::Deserialize)]
struct IncompleteView<'a> {
    #[serde(borrow)]
    reason: Option<JsonStr<'a>>,
}

/// One element of a response's `output`, by its type.
#[derive(serde::Deserialize)]
struct OutputView<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<JsonStr<'a>>,
}

impl<'a> EventView<'a> {
    /// The general path's reading of an event: a field of another type than the view's counts
    /// as absent (an object that is not one has no fields).
    fn of(value: &'a Value) -> Self {
        let text = |key: &str| JsonStr::of(value.get(key));
        EventView {
            kind: text("type"),
            item_id: text("item_id"),
            output_index: value.get("output_index").and_then(Value::as_u64),
            delta: text("delta"),
            text: text("text"),
            arguments: text("arguments"),
            name: text("name"),
            item: value.get("item").map(|item| ItemView {
                kind: JsonStr::of(item.get("type")),
                id: JsonStr::of(item.get("id")),
                call_id: JsonStr::of(item.get("call_id")),
                name: JsonStr::of(item.get("name")),
                arguments: JsonStr::of(item.get("arguments")),
            }),
            response: value.get("response").map(|response| ResponseView {
                usage: response
                    .get("usage")
                    .filter(|u| u.is_object())
                    .map(|usage| UsageView {
                        input_tokens: usage.get("input_tokens").and_then(Value::as_u64),
                        output_tokens: usage.get("output_tokens").and_then(Value::as_u64),
                        input_tokens_details: usage.get("input_tokens_details").map(|d| {
                            UsageDetailsView {
                                cached_tokens: d.get("cached_tokens").and_then(Value::as_u64),
                            }
                        }),
                    }),
                status: JsonStr::of(response.get("status")),
                incomplete_details: response.get("incomplete_details").map(|d| IncompleteView {
                    reason: JsonStr::of(d.get("reason")),
                }),
                output: response
                    .get("output")
                    .and_then(Value::as_array)
                    .map(|items| {
                        items
                            .iter()
                            .map(|item| OutputView {
                                kind: JsonStr::of(item.get("type")),
                            })
                            .collect()
                    }),
            }),
        }
    }

    /// Whether an event of type `kind` read through the view is decided by it alone (given
    /// whether the decoder has kept no reasoning item yet): not an error (read from the whole
    /// event), nor an event that keeps a reasoning item, which is kept whole: a finished
    /// reasoning item, or a final response listing one when none was kept before.
    fn decodes_alone(&self, kind: &str, no_reasoning_kept: bool) -> bool {
        let is_reasoning = |kind: &Option<JsonStr<'_>>| kind.as_deref() == Some("reasoning");
        match kind {
            "response.failed" | "error" => false,
            "response.output_item.done" => {
                !self.item.as_ref().is_some_and(|i| is_reasoning(&i.kind))
            }
            "response.completed" | "response.incomplete" => {
                let output = self.response.as_ref().and_then(|r| r.output.as_deref());
                !(no_reasoning_kept
                    && output
                        .unwrap_or_default()
                        .iter()
                        .any(|o| is_reasoning(&o.kind)))
            }
            _ => true,
        }
    }
}

/// Decoder of one streamed Responses body (SPEC L8, L9; cases C24, C26).
///
/// * Each SSE event's `data:` is a JSON object (read through [`EventView`], else parsed with
///   [`parse_lossy`](crate::json::parse_lossy)) whose `type` names the event (the SSE
///   `event:` name is the fallback). Unknown events and fields are ignored; a `data: [DONE]`
///   (some compatible servers add one) is ignored too.
/// * `response.output_text.delta` → [`StreamDelta::Text`]; `response.output_text.done` only
///   adds its `text` when no delta of that item was seen. `response.refusal.delta` → text too,
///   and the response is a refusal. `response.reasoning_summary_text.delta` and
///   `response.reasoning_text.delta` → [`StreamDelta::Thought`] (a blank line separates
///   summary parts).
/// * Function calls are assembled per `output_index` (the `item_id` locates events without one):
///   `response.output_item.added` / `.done` with a `function_call` item give `call_id`, `name`
///   (and, on `.done`, the final `arguments`); `response.function_call_arguments.delta` appends,
///   `.done` replaces with the final `arguments`. Calls come out in `output_index` order; a
///   nameless one is dropped; a missing or duplicate `call_id` becomes `{id_prefix}_{index}`.
/// * `response.completed` / `response.incomplete` end the stream (later bytes are ignored) and
///   give `usage` (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens` as
///   the cache read). `incomplete_details.reason`
///   `content_filter` → refusal; `max_output_tokens` and any other reason → max tokens.
/// * `response.failed` (`response.error`) and `error` events (`{code,message}` at the top level
///   or in `error`) → [`StreamError::Provider`], retryable unless the code or type names an
///   invalid request (`invalid_*`, `context_length_exceeded`, `insufficient_quota`,
///   `authentication_error`, `permission_error`). A complete event that is not JSON is a
///   retryable provider error. Errors are sticky.
pub(crate) struct ResponsesDecoder {
    /// Prefix of synthesised call ids: `{id_prefix}_{index}`.
    id_prefix: String,
    /// Parser, sticky error, response taken.
    sse: SseState,
    /// Text and reasoning so far.
    streamed: StreamedText,
    /// Function calls by `output_index` (`call_id` in `id`).
    calls: BTreeMap<u64, CallSlot>,
    /// `item_id` → `output_index` of function-call items.
    item_index: BTreeMap<String, u64>,
    /// Item ids that streamed text deltas (`""` for deltas without an id).
    text_items: BTreeSet<String>,
    /// A refusal was streamed.
    refused: bool,
    /// Reasoning items with `encrypted_content`, by `output_index` (SPEC L10).
    reasoning_items: BTreeMap<u64, Value>,
    usage: Option<Usage>,
    /// Set by `response.completed` / `response.incomplete`.
    end: Option<StopKind>,
}

impl std::fmt::Debug for ResponsesDecoder {
    // Lengths, not contents (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ResponsesDecoder(text {} B, thinking {} B, {} calls, end {:?})",
            self.streamed.text.len(),
            self.streamed.thinking.len(),
            self.calls.len(),
            self.end
        )
    }
}

impl ResponsesDecoder {
    /// A decoder for one response; `id_prefix` names calls that arrive without a `call_id`
    /// (`{id_prefix}_{index}`), so it should be unique per LLM call (e.g. `call_7`).
    #[must_use]
    pub(crate) fn new(id_prefix: String) -> Self {
        ResponsesDecoder {
            id_prefix,
            sse: SseState::new(),
            streamed: StreamedText::default(),
            calls: BTreeMap::new(),
            item_index: BTreeMap::new(),
            text_items: BTreeSet::new(),
            refused: false,
            reasoning_items: BTreeMap::new(),
            usage: None,
            end: None,
        }
    }

    /// The call slot an arguments event belongs to: by `output_index`, else by `item_id`,
    /// else a new slot after the last one.
    fn slot(&mut self, output_index: Option<u64>, item_id: &str) -> &mut CallSlot {
        let index = match output_index {
            Some(index) => index,
            None => match self.item_index.get(item_id) {
                Some(&index) => index,
                None => self
                    .calls
                    .last_key_value()
                    .map_or(0, |(&last, _)| last.saturating_add(1)),
            },
        };
        if !item_id.is_empty() {
            self.item_index.entry(item_id.to_owned()).or_insert(index);
        }
        self.calls.entry(index).or_default()
    }

    /// A `function_call` item from `output_item.added` / `.done`.
    fn merge_item(&mut self, output_index: Option<u64>, item: &ItemView<'_>, done: bool) {
        let (call_id, name) = (str_or_empty(&item.call_id), str_or_empty(&item.name));
        let arguments = item.arguments.as_deref();
        let slot = self.slot(output_index, str_or_empty(&item.id));
        if slot.id.is_empty() {
            call_id.clone_into(&mut slot.id);
        }
        if slot.name.is_empty() {
            name.clone_into(&mut slot.name);
        }
        if let Some(arguments) = arguments
            && (done || slot.arguments.is_empty())
        {
            arguments.clone_into(&mut slot.arguments);
        }
    }

    /// Keep a finished reasoning item for replay when it carries `encrypted_content` (SPEC L10);
    /// without it the item cannot be sent back statelessly.
    fn keep_reasoning(&mut self, index: Option<u64>, item: &Value) {
        let encrypted = item
            .get("encrypted_content")
            .and_then(Value::as_str)
            .is_some_and(|e| !e.is_empty());
        if encrypted {
            let index = index.unwrap_or_else(|| {
                self.reasoning_items
                    .last_key_value()
                    .map_or(0, |(&last, _)| last.saturating_add(1))
            });
            self.reasoning_items.insert(index, item.clone());
        }
    }

    /// One event of type `kind`, read into `event`; `raw` is its `Value` on the general path
    /// (what errors and reasoning items, kept whole, are read from).
    fn handle(
        &mut self,
        kind: &str,
        event: &EventView<'_>,
        raw: Option<&Value>,
        out: &mut Vec<StreamDelta>,
    ) -> Result<(), StreamError> {
        match kind {
            "response.output_text.delta" => {
                self.text_items
                    .insert(str_or_empty(&event.item_id).to_owned());
                self.streamed.push_text(str_or_empty(&event.delta), out);
            }
            "response.output_text.done" => {
                let item = str_or_empty(&event.item_id);
                if !item.is_empty()
                    && !self.text_items.contains(item)
                    && !self.text_items.contains("")
                {
                    self.text_items.insert(item.to_owned());
                    self.streamed.push_text(str_or_empty(&event.text), out);
                }
            }
            "response.refusal.delta" => {
                self.refused = true;
                self.streamed.push_text(str_or_empty(&event.delta), out);
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                self.streamed.push_thought(str_or_empty(&event.delta), out);
            }
            "response.reasoning_summary_part.added"
                if !self.streamed.thinking.is_empty()
                    && !self.streamed.thinking.ends_with('\n') =>
            {
                self.streamed.push_thought("\n\n", out);
            }
            "response.output_item.added" | "response.output_item.done" => {
                let done = kind.ends_with(".done");
                let Some(item) = &event.item else {
                    return Ok(());
                };
                match item.kind.as_deref() {
                    Some("function_call") => self.merge_item(event.output_index, item, done),
                    Some("reasoning") if done => {
                        if let Some(item) = raw.and_then(|v| v.get("item")) {
                            self.keep_reasoning(event.output_index, item);
                        }
                    }
                    Some(_) | None => {}
                }
            }
            "response.function_call_arguments.delta" => {
                let slot = self.slot(event.output_index, str_or_empty(&event.item_id));
                slot.arguments.push_str(str_or_empty(&event.delta));
            }
            "response.function_call_arguments.done" => {
                let name = str_or_empty(&event.name);
                let slot = self.slot(event.output_index, str_or_empty(&event.item_id));
                if let Some(arguments) = event.arguments.as_deref() {
                    arguments.clone_into(&mut slot.arguments);
                }
                if slot.name.is_empty() && !name.is_empty() {
                    name.clone_into(&mut slot.name);
                }
            }
            "response.completed" | "response.incomplete" => {
                let absent = ResponseView::default();
                let response = event.response.as_ref().unwrap_or(&absent);
                if let Some(usage) = &response.usage {
                    self.usage = Some(Usage {
                        input_tokens: usage.input_tokens.unwrap_or(0),
                        output_tokens: usage.output_tokens.unwrap_or(0),
                        cache_read_tokens: usage
                            .input_tokens_details
                            .as_ref()
                            .and_then(|d| d.cached_tokens),
                        cache_write_tokens: None,
                    });
                }
                // Reasoning items a server lists only in the final response (the view leaves
                // such an event to the general path).
                if self.reasoning_items.is_empty() {
                    let output = raw
                        .and_then(|v| v.pointer("/response/output"))
                        .and_then(Value::as_array);
                    for (index, item) in output.into_iter().flatten().enumerate() {
                        if item.get("type").and_then(Value::as_str) == Some("reasoning") {
                            self.keep_reasoning(Some(index as u64), item);
                        }
                    }
                }
                let incomplete = kind == "response.incomplete"
                    || response.status.as_deref() == Some("incomplete");
                self.end = Some(if incomplete {
                    let reason = response
                        .incomplete_details
                        .as_ref()
                        .and_then(|d| d.reason.as_deref());
                    match reason {
                        Some("content_filter") => StopKind::Refusal,
                        // "max_output_tokens" and reasons added later: the output was cut.
                        Some(_) | None => StopKind::MaxTokens,
                    }
                } else {
                    StopKind::EndTurn
                });
            }
            "response.failed" => {
                let error = raw.and_then(|v| v.pointer("/response/error"));
                return Err(provider_error(
                    error.unwrap_or(&Value::Null),
                    "response failed",
                ));
            }
            "error" => {
                let raw = raw.unwrap_or(&Value::Null);
                let error = raw.get("error").filter(|e| e.is_object()).unwrap_or(raw);
                return Err(provider_error(error, "stream error"));
            }
            // `response.created`, `response.in_progress`, part/content events, and event
            // types added later carry nothing we need.
            _ => {}
        }
        Ok(())
    }

    /// The stop the stream ended with; truncated before `response.completed` /
    /// `response.incomplete`.
    fn end(&self) -> Result<StopKind, StreamError> {
        self.end.clone().ok_or_else(|| {
            StreamError::Truncated("stream ended before response.completed".to_owned())
        })
    }
}

impl EventHandler for ResponsesDecoder {
    fn sse_state(&mut self) -> &mut SseState {
        &mut self.sse
    }

    /// One SSE event. `at_eof`: flushed at EOF without its blank line, so data that is not
    /// JSON is a cut event (the stream is truncated anyway), not a provider error.
    fn handle_event(
        &mut self,
        event: &SseEvent,
        out: &mut Vec<StreamDelta>,
        at_eof: bool,
    ) -> Result<(), StreamError> {
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        let sse_name = event.event.as_deref().unwrap_or("");
        let is_error_event = sse_name == "error";
        // The common event is read through the view; one it refuses (see `EventView`) goes the
        // general way below, into the same view, and is decided by the same `handle`.
        if let Some(view) = read_view::<EventView<'_>>(data, is_error_event) {
            let kind = view.kind.as_deref().unwrap_or(sse_name);
            if view.decodes_alone(kind, self.reasoning_items.is_empty()) {
                return self.handle(kind, &view, None, out);
            }
        }
        let Some(value) = parse_event_json(data, is_error_event, at_eof, "event")? else {
            return Ok(());
        };
        let view = EventView::of(&value);
        let kind = view.kind.as_deref().unwrap_or(sse_name);
        self.handle(kind, &view, Some(&value), out)
    }

    /// True after `response.completed` or `response.incomplete`.
    fn is_done(&self) -> bool {
        self.end.is_some()
    }

    /// Whole only after `response.completed` / `response.incomplete`.
    fn check_complete(&self) -> Result<(), StreamError> {
        self.end().map(|_| ())
    }

    /// The response once the body ended: only after `response.completed` /
    /// `response.incomplete` (otherwise [`StreamError::Truncated`], C24). Completed: function
    /// calls → tool use, else a streamed refusal → refusal, else end turn. Incomplete keeps the
    /// (possibly cut) calls: the loop does not run them with max tokens (L1).
    fn take_response(&mut self) -> Result<LlmResponse, StreamError> {
        let end = self.end()?;
        let tool_calls = take_calls(std::mem::take(&mut self.calls), &self.id_prefix);
        let stop = match end {
            // `end` never gives a pause (Anthropic only).
            StopKind::EndTurn | StopKind::ToolUse | StopKind::Pause if !tool_calls.is_empty() => {
                StopKind::ToolUse
            }
            StopKind::EndTurn | StopKind::ToolUse | StopKind::Pause if self.refused => {
                StopKind::Refusal
            }
            StopKind::EndTurn | StopKind::ToolUse | StopKind::Pause => StopKind::EndTurn,
            stop @ (StopKind::MaxTokens | StopKind::ContextFull | StopKind::Refusal) => stop,
        };
        let reasoning = std::mem::take(&mut self.reasoning_items)
            .into_values()
            .map(ReasoningBlock::ResponsesItem)
            .collect();
        Ok(self
            .streamed
            .take_response(reasoning, tool_calls, stop, self.usage))
    }
}

/// An error object (`code`, `type`, `message`) as a provider error: `"<message> (<code>)"`.
fn provider_error(error: &Value, fallback: &str) -> StreamError {
    let field = |key: &str| {
        error
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && *s != "error")
    };
    let code = field("code").or_else(|| field("type"));
    let message = field("message").unwrap_or(fallback);
    let retryable = ![field("code"), field("type")]
        .into_iter()
        .flatten()
        .any(|c| {
            c.starts_with("invalid")
                || matches!(
                    c,
                    "context_length_exceeded"
                        | "insufficient_quota"
                        | "authentication_error"
                        | "permission_error"
                )
        });
    let message = match code {
        Some(code) => format!("{message} ({code})"),
        None => message.to_owned(),
    };
    StreamError::Provider { message, retryable }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn l8_l10_encrypted_reasoning_is_asked_of_openai_reasoning_models_only() {
        use crate::config::ProviderKind;
        let cfg = Config::for_tests(ProviderKind::OpenAiResponses, "http://h");
        let none = Learned::default();
        assert!(responses_options(&cfg, "o4-mini", &none).include_encrypted_reasoning);
        assert!(!responses_options(&cfg, "gpt-4o", &none).include_encrypted_reasoning);
        let messages = [Message::User { text: "hi".into() }];
        for (model, asked) in [("openai/gpt-5", true), ("gpt-4.1", false)] {
            let req = LlmRequest {
                max_output_tokens: 8,
                ..LlmRequest::for_tests(model, &messages)
            };
            let body = Responses
                .build_request(&cfg, &req, &Learned::default(), None)
                .body
                .to_vec();
            let body = String::from_utf8_lossy(&body);
            assert_eq!(
                body.contains("\"include\":[\"reasoning.encrypted_content\"]"),
                asked,
                "{model}: {body}"
            );
        }
    }

    use serde_json::json;

    // ---------------------------------------------------------------- recorded streams
    // Shapes as documented for Responses streaming (response.created … response.completed).

    const PLAIN_TEXT: &str = r#"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress"}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"delta":", héllo 🐝!"}

event: response.output_text.done
data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello, héllo 🐝!"}

event: response.content_part.done
data: {"type":"response.content_part.done","sequence_number":7,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"Hello, héllo 🐝!","annotations":[]}}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":8,"output_index":0,"item":{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello, héllo 🐝!","annotations":[]}]}}

event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"completed","output":[{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello, héllo 🐝!","annotations":[]}]}],"usage":{"input_tokens":37,"output_tokens":11,"total_tokens":48}}}

"#;

    const REASONING_AND_CALLS: &str = r#"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_2","status":"in_progress","output":[]}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}

event: response.reasoning_summary_part.added
data: {"type":"response.reasoning_summary_part.added","sequence_number":2,"item_id":"rs_1","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}

event: response.reasoning_summary_text.delta
data: {"type":"response.reasoning_summary_text.delta","sequence_number":3,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"**Checking**\n\nNeed the file."}

event: response.reasoning_summary_part.added
data: {"type":"response.reasoning_summary_part.added","sequence_number":4,"item_id":"rs_1","output_index":0,"summary_index":1,"part":{"type":"summary_text","text":""}}

event: response.reasoning_summary_text.delta
data: {"type":"response.reasoning_summary_text.delta","sequence_number":5,"item_id":"rs_1","output_index":0,"summary_index":1,"delta":"Then list."}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":6,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":7,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_A","name":"fs__read_file"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":8,"item_id":"fc_1","output_index":1,"delta":"{\"path\":"}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":9,"item_id":"fc_1","output_index":1,"delta":"\"hé.txt\"}"}

event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","sequence_number":10,"item_id":"fc_1","output_index":1,"arguments":"{\"path\":\"hé.txt\"}"}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":11,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"path\":\"hé.txt\"}","call_id":"call_A","name":"fs__read_file"}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":12,"output_index":2,"item":{"id":"fc_2","type":"function_call","status":"in_progress","arguments":"","call_id":"call_B","name":"fs__list_dir"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":13,"item_id":"fc_2","delta":"{}"}

event: response.completed
data: {"type":"response.completed","sequence_number":14,"response":{"id":"resp_2","status":"completed","usage":{"input_tokens":120,"output_tokens":40,"output_tokens_details":{"reasoning_tokens":20}}}}

"#;

    // ---------------------------------------------------------------- harness

    use crate::llm::decoder_tests::{Outcome, call, ok};

    fn make() -> Box<dyn StreamDecoder> {
        Box::new(ResponsesDecoder::new("call_t1".to_owned()))
    }

    fn run_chunks(chunks: &[&[u8]]) -> Outcome {
        crate::llm::decoder_tests::run_chunks(make(), chunks)
    }

    fn decode_every_split(body: &str) -> Outcome {
        crate::llm::decoder_tests::decode_every_split(&make, body)
    }

    #[test]
    fn l11_the_cached_part_of_the_input_is_the_cache_read() {
        let body = |usage: Value| {
            let event = json!({"type": "response.completed",
                "response": {"status": "completed", "usage": usage}});
            format!("event: response.completed\ndata: {event}\n\n")
        };
        let cached = json!({"input_tokens": 2000, "output_tokens": 30,
            "input_tokens_details": {"cached_tokens": 1920}});
        assert_eq!(
            ok(&decode_every_split(&body(cached))).usage,
            Some(Usage {
                input_tokens: 2000,
                output_tokens: 30,
                cache_read_tokens: Some(1920),
                cache_write_tokens: None,
            })
        );
        let silent = json!({"input_tokens": 2000, "output_tokens": 30});
        assert_eq!(
            ok(&decode_every_split(&body(silent)))
                .usage
                .and_then(|u| u.cache_read_tokens),
            None
        );
    }

    #[test]
    fn c52_an_endless_line_in_a_responses_stream_is_cut_off_at_16_mib() {
        crate::llm::decoder_tests::assert_endless_line_is_cut_off(&make);
    }

    #[test]
    fn c36_invalid_utf8_in_a_responses_stream_is_decoded_lossily() {
        let outcome =
            crate::llm::decoder_tests::assert_invalid_utf8_is_decoded_lossily(&make, PLAIN_TEXT);
        assert_eq!(ok(&outcome).text, "Hello, h\u{FFFD}llo \u{1F41D}!");
    }

    /// One SSE event with `type` = `kind` and the given extra JSON fields.
    fn event(kind: &str, fields: &str) -> String {
        format!("event: {kind}\ndata: {{\"type\":\"{kind}\",{fields}}}\n\n")
    }

    fn completed() -> String {
        event(
            "response.completed",
            "\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":6}}",
        )
    }

    fn text_delta(text: &str) -> String {
        event(
            "response.output_text.delta",
            &format!(
                "\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"{text}\""
            ),
        )
    }

    // ---------------------------------------------------------------- decoder tests

    #[test]
    fn c39_encrypted_reasoning_items_are_kept_and_replayed_before_their_message_and_hook_call() {
        let item = json!({"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}], "encrypted_content": "gAAAA-ENC"});
        let bare = json!({"id": "rs_0", "type": "reasoning", "summary": []});
        let body = format!(
            "{}{}{}{}",
            event(
                "response.output_item.done",
                &format!("\"output_index\":0,\"item\":{bare}")
            ),
            event(
                "response.output_item.done",
                &format!("\"output_index\":1,\"item\":{item}")
            ),
            text_delta("All done."),
            completed()
        );
        let outcome = decode_every_split(&body);
        let response = ok(&outcome).clone();
        // Only the item with encrypted content can be replayed statelessly.
        assert_eq!(
            response.reasoning,
            vec![ReasoningBlock::ResponsesItem(item.clone())]
        );
        // The hook's call joined the answer: reasoning item, message, function call, output.
        let messages = [
            Message::User {
                text: "finish".into(),
            },
            Message::Assistant {
                text: response.text.clone(),
                thinking: response.thinking.clone(),
                reasoning: response.reasoning.clone(),
                tool_calls: vec![call("buzz_hook__Stop_h_1", "h___Stop", "{}")],
            },
            Message::ToolResult {
                call_id: "buzz_hook__Stop_h_1".into(),
                name: "h___Stop".into(),
                text: "{}".into(),
                is_error: false,
            },
        ];
        let req = LlmRequest {
            max_output_tokens: 8,
            ..LlmRequest::for_tests("o4-mini", &messages)
        };
        let options = ResponsesOptions {
            include_encrypted_reasoning: true,
            ..ResponsesOptions::default()
        };
        let body: Value =
            serde_json::from_slice(&build_request("http://h", "", &req, &options).body.to_vec())
                .unwrap();
        assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(body["store"], false);
        let types: Vec<&str> = body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| i["type"].as_str().unwrap_or("user"))
            .collect();
        assert_eq!(
            types,
            [
                "user",
                "reasoning",
                "message",
                "function_call",
                "function_call_output"
            ]
        );
        assert_eq!(body["input"][1], item, "replayed verbatim");
        // An assistant message with nothing after its reasoning drops it (a reasoning item
        // must be followed by its item), and without the option there is no `include`.
        let lonely = [Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: vec![ReasoningBlock::ResponsesItem(item)],
            tool_calls: vec![],
        }];
        let req = LlmRequest {
            effort: None,
            messages: &lonely,
            ..req
        };
        let body: Value = serde_json::from_slice(
            &build_request("http://h", "", &req, &ResponsesOptions::default())
                .body
                .to_vec(),
        )
        .unwrap();
        assert_eq!(body["input"], json!([]));
        assert!(body.get("include").is_none());
    }

    #[test]
    fn l8_plain_text_reply_streams_text_deltas_and_ends_the_turn_at_every_split() {
        let outcome = decode_every_split(PLAIN_TEXT);
        assert!(outcome.complete);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Text("Hello".into()),
                StreamDelta::Text(", héllo 🐝!".into())
            ]
        );
        assert_eq!(
            ok(&outcome),
            &LlmResponse {
                text: "Hello, héllo 🐝!".into(),
                thinking: String::new(),
                reasoning: vec![],
                tool_calls: vec![],
                stop: StopKind::EndTurn,
                usage: Some(Usage {
                    input_tokens: 37,
                    output_tokens: 11,
                    ..Usage::default()
                }),
                stop_details: None,
            }
        );
    }

    #[test]
    fn l8_reasoning_summary_and_function_calls_are_assembled_at_every_split() {
        let outcome = decode_every_split(REASONING_AND_CALLS);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Thought("**Checking**\n\nNeed the file.".into()),
                StreamDelta::Thought("\n\n".into()),
                StreamDelta::Thought("Then list.".into()),
            ]
        );
        assert_eq!(
            ok(&outcome),
            &LlmResponse {
                text: String::new(),
                thinking: "**Checking**\n\nNeed the file.\n\nThen list.".into(),
                reasoning: vec![],
                tool_calls: vec![
                    call("call_A", "fs__read_file", "{\"path\":\"hé.txt\"}"),
                    call("call_B", "fs__list_dir", "{}"),
                ],
                stop: StopKind::ToolUse,
                usage: Some(Usage {
                    input_tokens: 120,
                    output_tokens: 40,
                    ..Usage::default()
                }),
                stop_details: None,
            }
        );
    }

    #[test]
    fn l8_reasoning_text_deltas_are_thoughts() {
        let body = event(
            "response.reasoning_text.delta",
            "\"item_id\":\"rs_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"hmm\"",
        ) + &text_delta("ok")
            + &completed();
        let outcome = decode_every_split(&body);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Thought("hmm".into()),
                StreamDelta::Text("ok".into())
            ]
        );
        assert_eq!(ok(&outcome).thinking, "hmm");
    }

    #[test]
    fn l8_arguments_done_and_item_done_are_authoritative_and_ids_are_synthesised() {
        let body = [
            // No call_id, arguments only in the .done events.
            event(
                "response.output_item.added",
                "\"output_index\":3,\"item\":{\"id\":\"fc_9\",\"type\":\"function_call\",\"name\":\"get_time\",\"arguments\":\"\"}",
            ),
            event(
                "response.function_call_arguments.delta",
                "\"item_id\":\"fc_9\",\"output_index\":3,\"delta\":\"{\\\"tz\\\":\"",
            ),
            event(
                "response.function_call_arguments.done",
                "\"item_id\":\"fc_9\",\"output_index\":3,\"arguments\":\"{\\\"tz\\\":\\\"UTC\\\"}\"",
            ),
            // An item that appears only at .done.
            event(
                "response.output_item.done",
                "\"output_index\":4,\"item\":{\"id\":\"fc_10\",\"type\":\"function_call\",\"call_id\":\"call_Z\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":\\\".\\\"}\"}",
            ),
            // Arguments without a named item: dropped.
            event(
                "response.function_call_arguments.delta",
                "\"item_id\":\"fc_11\",\"output_index\":5,\"delta\":\"{}\"",
            ),
            completed(),
        ]
        .concat();
        let response = ok(&decode_every_split(&body)).clone();
        assert_eq!(
            response.tool_calls,
            vec![
                call("call_t1_3", "get_time", "{\"tz\":\"UTC\"}"),
                call("call_Z", "ls", "{\"p\":\".\"}"),
            ]
        );
        assert_eq!(response.stop, StopKind::ToolUse);
    }

    #[test]
    fn l8_incomplete_responses_map_to_max_tokens_or_refusal() {
        let incomplete = |reason: &str| {
            text_delta("Long")
                + &event(
                    "response.incomplete",
                    &format!(
                        "\"response\":{{\"status\":\"incomplete\",\"incomplete_details\":{{\"reason\":\"{reason}\"}},\"usage\":{{\"input_tokens\":1,\"output_tokens\":2}}}}"
                    ),
                )
        };
        let outcome = decode_every_split(&incomplete("max_output_tokens"));
        assert!(outcome.complete);
        assert_eq!(ok(&outcome).stop, StopKind::MaxTokens);
        assert_eq!(ok(&outcome).text, "Long");
        assert_eq!(
            ok(&decode_every_split(&incomplete("content_filter"))).stop,
            StopKind::Refusal
        );
        assert_eq!(
            ok(&decode_every_split(&incomplete("something_new"))).stop,
            StopKind::MaxTokens
        );
    }

    #[test]
    fn l8_refusal_deltas_are_text_and_make_a_refusal() {
        let body = event(
            "response.refusal.delta",
            "\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"I can't help with that.\"",
        ) + &completed();
        let outcome = decode_every_split(&body);
        assert_eq!(ok(&outcome).stop, StopKind::Refusal);
        assert_eq!(ok(&outcome).text, "I can't help with that.");
    }

    #[test]
    fn l8_output_text_done_fills_in_only_when_no_delta_was_seen() {
        let done = event(
            "response.output_text.done",
            "\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"text\":\"whole\"",
        );
        let outcome = decode_every_split(&(done.clone() + &completed()));
        assert_eq!(outcome.deltas, vec![StreamDelta::Text("whole".into())]);
        // PLAIN_TEXT has deltas and a .done for the same item: no duplicate.
        assert_eq!(ok(&decode_every_split(PLAIN_TEXT)).text, "Hello, héllo 🐝!");
    }

    #[test]
    fn l8_failed_response_and_error_events_are_provider_errors() {
        let failed = text_delta("Hi")
            + &event(
                "response.failed",
                "\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"The server had an error\"}}",
            );
        let outcome = decode_every_split(&failed);
        assert_eq!(
            outcome.result,
            Err(StreamError::Provider {
                message: "The server had an error (server_error)".into(),
                retryable: true
            })
        );
        assert_eq!(outcome.deltas, vec![StreamDelta::Text("Hi".into())]);

        let flat = event(
            "error",
            "\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null",
        );
        assert_eq!(
            decode_every_split(&flat).result,
            Err(StreamError::Provider {
                message: "slow down (rate_limit_exceeded)".into(),
                retryable: true
            })
        );
        let nested = event(
            "error",
            "\"error\":{\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\",\"message\":\"too long\"}",
        );
        assert_eq!(
            decode_every_split(&nested).result,
            Err(StreamError::Provider {
                message: "too long (context_length_exceeded)".into(),
                retryable: false
            })
        );
        let invalid_prompt = event(
            "response.failed",
            "\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"invalid_prompt\",\"message\":\"no\"}}",
        );
        assert_eq!(
            decode_every_split(&invalid_prompt)
                .result
                .map_err(|e| e.is_retryable()),
            Err(false)
        );
        assert!(matches!(
            decode_every_split("event: response.output_text.delta\ndata: {oops}\n\n").result,
            Err(StreamError::Provider {
                retryable: true,
                ..
            })
        ));
    }

    #[test]
    fn l8_errors_are_sticky() {
        let body = event("error", "\"code\":\"server_error\",\"message\":\"x\"");
        let mut decoder = ResponsesDecoder::new("c".into());
        let mut out = Vec::new();
        assert!(decoder.feed(body.as_bytes(), &mut out).is_err());
        assert!(decoder.feed(completed().as_bytes(), &mut out).is_err());
        assert!(decoder.finish(&mut out).is_err());
    }

    #[test]
    fn c24_stream_cut_before_completion_is_truncated() {
        let cut = PLAIN_TEXT
            .find("event: response.completed")
            .map(|at| &PLAIN_TEXT[..at])
            .unwrap();
        let outcome = decode_every_split(cut);
        assert!(matches!(outcome.result, Err(StreamError::Truncated(_))));
        assert!(!outcome.complete);
        assert_eq!(outcome.deltas.len(), 2);
        let in_arguments = REASONING_AND_CALLS.find("\\\"hé.txt").unwrap();
        assert!(matches!(
            decode_every_split(&REASONING_AND_CALLS[..in_arguments]).result,
            Err(StreamError::Truncated(_))
        ));
        // A cut inside the completed event itself.
        assert!(matches!(
            decode_every_split(&PLAIN_TEXT[..PLAIN_TEXT.len() - 20]).result,
            Err(StreamError::Truncated(_))
        ));
        // The completed event without its closing blank line still completes.
        assert_eq!(
            ok(&decode_every_split(PLAIN_TEXT.trim_end())).stop,
            StopKind::EndTurn
        );
    }

    #[test]
    fn c24_done_marker_and_bytes_after_completion_are_ignored() {
        let body = format!("{PLAIN_TEXT}data: [DONE]\n\n{}garbage", text_delta("late"));
        let outcome = decode_every_split(&body);
        assert_eq!(ok(&outcome).text, "Hello, héllo 🐝!");
        assert_eq!(outcome.deltas.len(), 2);
        // A [DONE] without completion is still truncated.
        let early = text_delta("Hi") + "data: [DONE]\n\n";
        assert!(matches!(
            decode_every_split(&early).result,
            Err(StreamError::Truncated(_))
        ));
    }

    #[test]
    fn l9_split_inside_a_multibyte_character_and_lone_surrogates() {
        let bee = PLAIN_TEXT.find('🐝').unwrap();
        let bytes = PLAIN_TEXT.as_bytes();
        for cut in bee + 1..bee + 4 {
            let outcome = run_chunks(&[&bytes[..cut], &bytes[cut..]]);
            assert_eq!(ok(&outcome).text, "Hello, héllo 🐝!", "cut at {cut}");
        }
        let body = text_delta("a\\ud800b") + &completed();
        assert_eq!(ok(&decode_every_split(&body)).text, "a\u{fffd}b");
    }

    #[test]
    fn l8_finish_twice_does_not_hand_out_the_response_again() {
        let mut decoder = ResponsesDecoder::new("c".into());
        let mut out = Vec::new();
        decoder.feed(PLAIN_TEXT.as_bytes(), &mut out).unwrap();
        assert!(decoder.is_complete());
        assert!(decoder.finish(&mut out).is_ok());
        assert!(matches!(
            decoder.finish(&mut out),
            Err(StreamError::Truncated(_))
        ));
    }

    #[test]
    fn l9_long_stream_fed_byte_by_byte_decodes_in_linear_time() {
        let mut body = String::new();
        let delta = text_delta("abcdefgh");
        for _ in 0..10_000 {
            body.push_str(&delta);
        }
        body.push_str(&completed());
        let mut decoder = ResponsesDecoder::new("c".into());
        let mut out = Vec::new();
        for byte in body.as_bytes().chunks(1) {
            decoder.feed(byte, &mut out).unwrap();
        }
        assert_eq!(decoder.finish(&mut out).unwrap().text.len(), 80_000);
    }

    // ---------------------------------------------------------------- request tests

    fn schema() -> Value {
        json!({"type": "object", "properties": {"path": {"type": "string"}}})
    }

    #[test]
    fn l8_request_has_url_headers_and_streaming_body() {
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
            "http://127.0.0.1:5000/v1/",
            "sk-test",
            &req,
            &ResponsesOptions::default(),
        );
        assert_eq!(request.url, "http://127.0.0.1:5000/v1/responses");
        assert_eq!(
            request.headers,
            crate::llm::decoder_tests::streaming_headers(&[("authorization", "Bearer sk-test")])
        );
        let text = String::from_utf8(request.body.to_vec()).unwrap();
        assert!(
            text.starts_with("{\"model\":\"gpt-x\",\"instructions\":\"Be brief.\",\"input\":"),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({
                "model": "gpt-x",
                "instructions": "Be brief.",
                "input": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "name": "fs__read_file", "description": "Read a file", "parameters": schema(), "strict": false}],
                "stream": true,
                "store": false,
                "max_output_tokens": 4096
            })
        );
    }

    #[test]
    fn l8_no_key_no_system_and_no_tools_leave_those_out() {
        let messages = [Message::User {
            text: "summarise".into(),
        }];
        let req = LlmRequest {
            system: Some(""),
            max_output_tokens: 100,
            ..LlmRequest::for_tests("m", &messages)
        };
        let request = build_request("http://h/v1", "", &req, &ResponsesOptions::default());
        assert!(request.headers.iter().all(|(k, _)| k != "authorization"));
        assert_eq!(
            serde_json::from_slice::<Value>(&request.body.to_vec()).unwrap(),
            json!({
                "model": "m",
                "input": [{"role": "user", "content": "summarise"}],
                "stream": true,
                "store": false,
                "max_output_tokens": 100
            })
        );
    }

    #[test]
    fn l8_history_becomes_message_function_call_and_output_items() {
        let messages = [
            Message::User {
                text: "list".into(),
            },
            Message::Assistant {
                text: "Checking.".into(),
                thinking: "secret reasoning".into(),
                reasoning: vec![],
                tool_calls: vec![
                    call("call_1", "fs__list_dir", "{\"p\":\".\"}"),
                    call("call_2", "clock__now", "  "),
                ],
            },
            Message::ToolResult {
                call_id: "call_1".into(),
                name: "fs__list_dir".into(),
                text: "a.txt".into(),
                is_error: false,
            },
            Message::ToolResult {
                call_id: "call_2".into(),
                name: "clock__now".into(),
                text: "boom".into(),
                is_error: true,
            },
            Message::Assistant {
                text: String::new(),
                thinking: "only thoughts".into(),
                reasoning: vec![],
                tool_calls: vec![],
            },
            Message::Assistant {
                text: "Done \"quoted\" é".into(),
                thinking: String::new(),
                reasoning: vec![],
                tool_calls: vec![],
            },
        ];
        let req = LlmRequest {
            max_output_tokens: 1,
            ..LlmRequest::for_tests("m", &messages)
        };
        let body: Value = serde_json::from_slice(
            &build_request("http://h", "k", &req, &ResponsesOptions::default())
                .body
                .to_vec(),
        )
        .unwrap();
        assert_eq!(
            body["input"],
            json!([
                {"role": "user", "content": "list"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "fs__list_dir", "arguments": "{\"p\":\".\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "clock__now", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "call_2", "output": "Error: boom"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done \"quoted\" é"}]}
            ])
        );
    }

    #[test]
    fn l8_decoded_response_rebuilds_into_a_request_with_the_same_call_ids() {
        let response = ok(&decode_every_split(REASONING_AND_CALLS)).clone();
        let mut messages = vec![Message::Assistant {
            text: response.text,
            thinking: response.thinking,
            reasoning: response.reasoning,
            tool_calls: response.tool_calls.clone(),
        }];
        messages.extend(response.tool_calls.iter().map(|c| Message::ToolResult {
            call_id: c.id.clone(),
            name: c.name.clone(),
            text: "ok".into(),
            is_error: false,
        }));
        let req = LlmRequest {
            max_output_tokens: 1,
            ..LlmRequest::for_tests("m", &messages)
        };
        let body: Value = serde_json::from_slice(
            &build_request("http://h", "", &req, &ResponsesOptions::default())
                .body
                .to_vec(),
        )
        .unwrap();
        assert_eq!(body["input"][0]["call_id"], "call_A");
        assert_eq!(body["input"][1]["call_id"], "call_B");
        assert_eq!(body["input"][2]["call_id"], "call_A");
        assert_eq!(body["input"][3]["call_id"], "call_B");
    }

    #[test]
    fn p2_debug_of_a_responses_decoder_shows_sizes_not_the_streamed_text() {
        let mut decoder = ResponsesDecoder::new("c".into());
        let mut out = Vec::new();
        decoder
            .feed(text_delta("secret").as_bytes(), &mut out)
            .unwrap();
        assert_eq!(
            format!("{decoder:?}"),
            "ResponsesDecoder(text 6 B, thinking 0 B, 0 calls, end None)"
        );
    }

    #[test]
    fn l8_argument_events_find_their_call_by_item_id_and_the_finished_item_is_authoritative() {
        let body = [
            event(
                "response.output_item.added",
                "\"output_index\":2,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"ls\",\"arguments\":\"\"}",
            ),
            // Without `output_index`: located by `item_id`.
            event(
                "response.function_call_arguments.delta",
                "\"item_id\":\"fc_1\",\"delta\":\"{\\\"p\\\":\"",
            ),
            // The finished item's arguments replace the (here incomplete) streamed pieces.
            event(
                "response.output_item.done",
                "\"output_index\":2,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":\\\".\\\"}\"}",
            ),
            completed(),
        ]
        .concat();
        let response = ok(&decode_every_split(&body)).clone();
        assert_eq!(
            response.tool_calls,
            vec![call("call_1", "ls", "{\"p\":\".\"}")]
        );
    }

    #[test]
    fn l8_arguments_done_names_a_call_only_when_its_item_did_not() {
        let body = [
            // Known only from its argument events: `.done` names it.
            event(
                "response.function_call_arguments.delta",
                "\"item_id\":\"fc_1\",\"output_index\":0,\"delta\":\"{}\"",
            ),
            event(
                "response.function_call_arguments.done",
                "\"item_id\":\"fc_1\",\"output_index\":0,\"name\":\"get_time\",\"arguments\":\"{}\"",
            ),
            // Named by its item: a different name in `.done` does not rename it.
            event(
                "response.output_item.added",
                "\"output_index\":1,\"item\":{\"id\":\"fc_2\",\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"ls\",\"arguments\":\"\"}",
            ),
            event(
                "response.function_call_arguments.done",
                "\"item_id\":\"fc_2\",\"output_index\":1,\"name\":\"other\",\"arguments\":\"{}\"",
            ),
            completed(),
        ]
        .concat();
        let response = ok(&decode_every_split(&body)).clone();
        assert_eq!(
            response.tool_calls,
            vec![
                call("call_t1_0", "get_time", "{}"),
                call("call_2", "ls", "{}")
            ]
        );
    }

    #[test]
    fn l8_an_error_event_with_plain_text_data_is_a_provider_error_with_that_text() {
        assert_eq!(
            decode_every_split("event: error\ndata: upstream overloaded\n\n").result,
            Err(StreamError::Provider {
                message: "upstream overloaded".into(),
                retryable: true
            })
        );
        let Err(StreamError::Provider { message, .. }) =
            decode_every_split("event: response.output_text.delta\ndata: {oops}\n\n").result
        else {
            panic!("a provider error")
        };
        assert!(message.starts_with("malformed stream event: "), "{message}");
    }

    #[test]
    fn l8_an_error_event_without_a_code_is_its_message_alone() {
        assert_eq!(
            decode_every_split(&event("error", "\"message\":\"slow down\",\"code\":\"\"")).result,
            Err(StreamError::Provider {
                message: "slow down".into(),
                retryable: true
            })
        );
    }

    #[test]
    fn l8_an_incomplete_event_or_an_incomplete_status_alone_means_the_output_was_cut() {
        let bare = text_delta("Long") + &event("response.incomplete", "\"response\":{}");
        assert_eq!(ok(&decode_every_split(&bare)).stop, StopKind::MaxTokens);
        let status = text_delta("Long")
            + &event(
                "response.completed",
                "\"response\":{\"status\":\"incomplete\"}",
            );
        assert_eq!(ok(&decode_every_split(&status)).stop, StopKind::MaxTokens);
    }

    #[test]
    fn c39_a_reasoning_item_is_replayed_before_a_text_only_answer() {
        let item =
            json!({"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "ENC"});
        let messages = [
            Message::User { text: "q".into() },
            Message::Assistant {
                text: "answer".into(),
                thinking: String::new(),
                reasoning: vec![ReasoningBlock::ResponsesItem(item.clone())],
                tool_calls: vec![],
            },
        ];
        let req = LlmRequest {
            max_output_tokens: 8,
            ..LlmRequest::for_tests("o4-mini", &messages)
        };
        let body: Value = serde_json::from_slice(
            &build_request("http://h", "", &req, &ResponsesOptions::default())
                .body
                .to_vec(),
        )
        .unwrap();
        assert_eq!(body["input"][1], item);
        assert_eq!(body["input"][2]["type"], "message");
        assert_eq!(body["input"].as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn l10_a_reasoning_item_is_kept_as_finished_never_as_first_announced() {
        // The item as announced (`.added`) is not the finished one; a server that lists the
        // finished items only in the final response gets those kept.
        let announced =
            json!({"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "EARLY"});
        let finished =
            json!({"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "FINAL"});
        let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "content": []});
        let body = event(
            "response.output_item.added",
            &format!("\"output_index\":0,\"item\":{announced}"),
        ) + &text_delta("ok")
            + &event(
                "response.completed",
                &format!(
                    "\"response\":{{\"status\":\"completed\",\"output\":[{message},{finished}]}}"
                ),
            );
        let response = ok(&decode_every_split(&body)).clone();
        assert_eq!(
            response.reasoning,
            vec![ReasoningBlock::ResponsesItem(finished)]
        );
    }

    #[test]
    fn c24_a_cut_stream_is_truncated_on_every_finish_and_never_taken() {
        let mut decoder = ResponsesDecoder::new("c".into());
        let mut out = Vec::new();
        decoder.feed(text_delta("Hi").as_bytes(), &mut out).unwrap();
        let cut = Err(StreamError::Truncated(
            "stream ended before response.completed".to_owned(),
        ));
        assert_eq!(decoder.finish(&mut out), cut);
        assert_eq!(decoder.finish(&mut out), cut, "nothing was handed out");
    }

    // ---------------------------------------------------------------- the event view

    /// `body`'s events with a field of the view twice each, which the view refuses: every
    /// event then goes the general path.
    fn forced_general(body: &str) -> String {
        const KEYS: &[&str] = &[
            "type",
            "item_id",
            "output_index",
            "delta",
            "text",
            "arguments",
            "name",
            "item",
            "response",
        ];
        crate::llm::decoder_tests::forced_general(body, KEYS)
    }

    /// The view borrows plain strings, decodes escaped ones and skips unknown fields at every
    /// level (the final response's copy of the output included): the same outcome as the
    /// general path, and the escapes decoded.
    #[test]
    fn l9_the_event_view_decodes_escapes_and_skips_unknown_fields_like_the_general_path() {
        let body = [
            event(
                "response.output_text.delta",
                r#""item_id":"msg_1","output_index":0,"delta":"line\nnext \"q\" \u00e9 \ud83d\udc1d","logprobs":[{"deep":[[{}]]}]"#,
            ),
            event(
                "response.output_item.added",
                r#""output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_\u0031","name":"fs__read","arguments":"","status":"in_progress"}"#,
            ),
            event(
                "response.function_call_arguments.delta",
                r#""item_id":"fc_1","output_index":1,"delta":"{\"path\":\"a\\\\b\"}""#,
            ),
            event(
                "response.completed",
                r#""response":{"id":"r","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]},{"type":"function_call","arguments":"{}"}],"usage":{"input_tokens":9,"output_tokens":4,"input_tokens_details":{"cached_tokens":2},"output_tokens_details":{"reasoning_tokens":0}}}"#,
            ),
        ]
        .concat();
        let outcome = decode_every_split(&body);
        assert_eq!(outcome, run_chunks(&[forced_general(&body).as_bytes()]));
        let response = ok(&outcome);
        assert_eq!(response.text, "line\nnext \"q\" é 🐝");
        assert_eq!(
            response.tool_calls,
            vec![call("call_1", "fs__read", r#"{"path":"a\\b"}"#)]
        );
        let usage = response.usage.expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (9, 4));
        assert_eq!(usage.cache_read_tokens, Some(2));
    }

    /// Generators of Responses stream events for the view-against-general-path property: every
    /// field the decoder reads, with values of the right type and of others, escapes, lone
    /// surrogates, unknown fields, reasoning items, error events.
    mod event_gen {
        use crate::llm::decoder_tests::{
            TEXT, UNKNOWN, field, field_of, index, mostly, object, often, sse_event, text,
        };
        use proptest::prelude::*;

        fn item_id() -> BoxedStrategy<String> {
            mostly(&[r#""fc_1""#, r#""fc_2""#, r#""msg_1""#, r#""""#], TEXT)
        }

        const ITEM_KIND: &[&str] = &[
            r#""function_call""#,
            r#""function_call""#,
            r#""reasoning""#,
            r#""message""#,
            "null",
            "4",
        ];
        const ENCRYPTED: &[&str] = &[r#""enc""#, r#""""#, "null", "5"];
        const USAGE: &[&str] = &[
            r#"{"input_tokens":3,"output_tokens":2}"#,
            r#"{"input_tokens":5,"input_tokens_details":{"cached_tokens":1}}"#,
            r#"{"input_tokens":"x"}"#,
            r#"{"input_tokens_details":null}"#,
            r#"{"input_tokens_details":3}"#,
            "null",
            "5",
            "{}",
        ];
        const STATUS: &[&str] = &[r#""completed""#, r#""incomplete""#, "null", "1"];
        const INCOMPLETE: &[&str] = &[
            r#"{"reason":"max_output_tokens"}"#,
            r#"{"reason":"content_filter"}"#,
            r#"{"reason":7}"#,
            "null",
            r#""x""#,
        ];
        const ERROR: &[&str] = &[
            r#"{"code":"server_error","message":"boom"}"#,
            r#"{"type":"invalid_request_error","message":""}"#,
            "null",
        ];
        /// Names and `type`s of the events.
        const KIND: &[&str] = &[
            "response.created",
            "response.output_item.added",
            "response.output_item.done",
            "response.output_text.delta",
            "response.output_text.done",
            "response.refusal.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_summary_part.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
        ];

        fn item() -> BoxedStrategy<String> {
            prop_oneof![
                10 => (
                    prop::sample::select(ITEM_KIND),
                    field_of("id", item_id()),
                    field_of("call_id", mostly(&[r#""call_1""#, r#""call_2""#, r#""""#], TEXT)),
                    field_of("name", text()),
                    field_of("arguments", text()),
                    field("encrypted_content", ENCRYPTED),
                    field("summary", UNKNOWN),
                )
                    .prop_map(|(k, id, c, n, a, e, s)| {
                        object(vec![Some(format!("\"type\":{k}")), id, c, n, a, e, s])
                    }),
                1 => Just("null".to_owned()),
                1 => Just("\"i\"".to_owned()),
            ]
            .boxed()
        }

        /// An item of a response's `output`: often a reasoning item to keep.
        fn output_item() -> BoxedStrategy<String> {
            prop_oneof![
                2 => item(),
                1 => Just(r#"{"type":"reasoning","id":"rs_1","encrypted_content":"enc"}"#.to_owned()),
            ]
            .boxed()
        }

        fn response() -> BoxedStrategy<String> {
            let output = prop_oneof![
                8 => prop::collection::vec(output_item(), 0..3).prop_map(|i| format!("[{}]", i.join(","))),
                1 => Just("null".to_owned()),
                1 => Just("{}".to_owned()),
            ];
            prop_oneof![
                10 => (
                    field("usage", USAGE),
                    field("status", STATUS),
                    field("incomplete_details", INCOMPLETE),
                    field_of("output", output),
                    prop::option::weighted(0.2, prop::sample::select(ERROR))
                        .prop_map(|e| e.map(|e| format!("\"error\":{e}"))),
                    field("model", UNKNOWN),
                )
                    .prop_map(|(u, s, i, o, e, m)| object(vec![u, s, i, o, e, m])),
                1 => Just("null".to_owned()),
                1 => Just("3".to_owned()),
            ]
            .boxed()
        }

        /// The fields of an event of type `kind`.
        fn fields(kind: &'static str) -> BoxedStrategy<Vec<Option<String>>> {
            let index = field_of("output_index", index());
            let id = field_of("item_id", item_id());
            match kind {
                "response.created"
                | "response.completed"
                | "response.incomplete"
                | "response.failed" => often("response", response()).prop_map(|r| vec![r]).boxed(),
                "response.output_item.added" | "response.output_item.done" => {
                    (index, often("item", item()))
                        .prop_map(|(i, it)| vec![i, it])
                        .boxed()
                }
                "response.output_text.done" => (id, index, often("text", text()))
                    .prop_map(|(d, i, t)| vec![d, i, t])
                    .boxed(),
                "response.function_call_arguments.done" => (
                    id,
                    index,
                    often("arguments", text()),
                    field_of("name", text()),
                )
                    .prop_map(|(d, i, a, n)| vec![d, i, a, n])
                    .boxed(),
                "response.reasoning_summary_part.added" => Just(Vec::new()).boxed(),
                "error" => (
                    field("error", ERROR),
                    field("code", &[r#""rate_limit""#, "null"]),
                    field("message", &[r#""slow down""#, "3"]),
                )
                    .prop_map(|(e, c, m)| vec![e, c, m])
                    .boxed(),
                _ => (id, index, often("delta", text()))
                    .prop_map(|(d, i, t)| vec![d, i, t])
                    .boxed(),
            }
        }

        /// One event: its SSE name and its JSON text (always an object). The `type` is mostly
        /// the name, sometimes another, absent or not a string; the events that end the
        /// stream are rare.
        pub(super) fn event() -> impl Strategy<Value = (String, String)> {
            let kind = prop_oneof![
                1 => Just("response.created"),
                4 => Just("response.output_item.added"),
                4 => Just("response.output_item.done"),
                6 => Just("response.output_text.delta"),
                2 => Just("response.output_text.done"),
                1 => Just("response.refusal.delta"),
                2 => Just("response.reasoning_summary_text.delta"),
                1 => Just("response.reasoning_text.delta"),
                1 => Just("response.reasoning_summary_part.added"),
                6 => Just("response.function_call_arguments.delta"),
                2 => Just("response.function_call_arguments.done"),
                1 => Just("response.completed"),
                1 => Just("response.failed"),
                1 => Just("error"),
            ];
            sse_event(kind, KIND, fields)
        }

        /// The event that ends a body: completed or incomplete, with a generated response.
        pub(super) fn end() -> impl Strategy<Value = String> {
            (
                prop::sample::select(&["response.completed", "response.incomplete"][..]),
                response(),
            )
                .prop_map(|(kind, r)| {
                    format!("event: {kind}\ndata: {{\"type\":\"{kind}\",\"response\":{r}}}\n\n")
                })
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]

        /// The view decides every event as the general (`Value`) path does: a body of generated
        /// events decodes to the same deltas, response or error whether or not each event is
        /// first offered to the view.
        #[test]
        fn l9_the_event_view_decodes_every_generated_body_like_the_general_path(
            events in proptest::collection::vec(event_gen::event(), 1..16),
            end in proptest::option::of(event_gen::end()),
        ) {
            let mut body = crate::llm::decoder_tests::sse_body(&events);
            body.push_str(end.as_deref().unwrap_or(""));
            let general = forced_general(&body);
            proptest::prop_assert_eq!(
                run_chunks(&[body.as_bytes()]),
                run_chunks(&[general.as_bytes()]),
                "{}",
                body
            );
        }
    }
}
