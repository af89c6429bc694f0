//! The provider-neutral model of an LLM conversation (SPEC §4, §8).
//!
//! The loop (`turn`) only speaks these types; each provider module (`anthropic` for Anthropic
//! Messages, `openai_chat` for Chat Completions, `openai_responses` for OpenAI Responses) builds
//! an [`HttpRequest`] from them and decodes a streamed body back into [`StreamDelta`]s and one
//! [`LlmResponse`].

use std::sync::Arc;

use serde_json::Value;

use crate::config::Prices;

/// The text of the short assistant message put between tool results and a following user
/// message (SPEC L10): strict chat templates and Mistral's validator reject a user message right
/// after a tool result ("Unexpected role 'user' after role 'tool'"), and on Anthropic a user
/// text in the same turn as tool results would make a synthetic tool call the start of a tool
/// loop that thinking rules apply to.
pub(crate) const TOOL_RESULTS_BRIDGE: &str = "(tool results received)";

/// One entry of a session's history.
///
/// Invariant (SPEC L4, DESIGN I9): every [`ToolCall`] of an `Assistant` message is followed,
/// before the next `User` or `Assistant` message, by exactly one `ToolResult` with its id.
#[derive(Clone, PartialEq)]
pub enum Message {
    /// A user turn (the client's prompt, a compaction summary, or an agent nudge).
    User {
        /// The text.
        text: String,
    },
    /// What the model said: text, optional reasoning text, and the tool calls it asked for.
    ///
    /// `thinking` is the reasoning as plain text (ACP thought chunks, size accounting);
    /// `reasoning` holds the provider's reasoning state that must be replayed (Anthropic
    /// thinking / redacted_thinking with signatures, Responses reasoning items, the Chat
    /// reasoning fields; SPEC L10); empty when the provider sent none.
    Assistant {
        /// The answer text (may be empty).
        text: String,
        /// The reasoning as plain text (may be empty).
        thinking: String,
        /// The provider's reasoning state to replay.
        reasoning: Vec<ReasoningBlock>,
        /// The tool calls, in the order asked.
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, paired by `call_id` (SPEC L3).
    ToolResult {
        /// The [`ToolCall::id`] it answers.
        call_id: String,
        /// The [`ToolCall::name`] it answers.
        name: String,
        /// The result as the model sees it (SPEC L3).
        text: String,
        /// Whether the call failed or the tool reported an error.
        is_error: bool,
    },
}

impl Message {
    /// Approximate size in bytes of the model-visible content (SPEC K1: 1 byte ≈ 1 token).
    #[must_use]
    pub fn content_bytes(&self) -> usize {
        match self {
            Message::User { text } => text.len(),
            Message::Assistant {
                text,
                thinking,
                reasoning,
                tool_calls,
            } => {
                text.len()
                    + thinking.len()
                    + reasoning
                        .iter()
                        .map(ReasoningBlock::content_bytes)
                        .sum::<usize>()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len() + c.id.len())
                        .sum::<usize>()
            }
            Message::ToolResult {
                call_id,
                name,
                text,
                ..
            } => call_id.len() + name.len() + text.len(),
        }
    }
}

impl std::fmt::Debug for Message {
    // Lengths, not contents: history can be megabytes and may hold secrets (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::User { text } => write!(f, "User({} B)", text.len()),
            Message::Assistant {
                text,
                thinking,
                reasoning,
                tool_calls,
            } => write!(
                f,
                "Assistant({} B text, {} B thinking, {} reasoning blocks, calls {:?})",
                text.len(),
                thinking.len(),
                reasoning.len(),
                tool_calls
            ),
            Message::ToolResult {
                call_id,
                name,
                text,
                is_error,
            } => {
                write!(
                    f,
                    "ToolResult({call_id} {name} {} B err={is_error})",
                    text.len()
                )
            }
        }
    }
}

/// One piece of provider reasoning state kept with its assistant message and replayed as that
/// provider requires (SPEC L10, case C39).
#[derive(Clone, PartialEq)]
pub enum ReasoningBlock {
    /// An Anthropic `thinking` block: its text (`thinking_delta`s concatenated) and its opaque
    /// signature (`signature_delta`s; may be empty for servers that send none, or when the
    /// block was cut). Replayed unmodified (SPEC L6).
    Thinking { text: String, signature: String },
    /// An Anthropic `redacted_thinking` block: the opaque encrypted `data`, replayed unmodified.
    Redacted { data: String },
    /// An OpenAI Responses `reasoning` output item, verbatim as streamed in
    /// `response.output_item.done` (`id`, `summary`, `encrypted_content`, …); kept only when it
    /// carries `encrypted_content`, the form a stateless (`store: false`) request may replay
    /// (SPEC L8).
    ResponsesItem(Value),
    /// Chat Completions: the message's reasoning text ([`Message::Assistant`]'s `thinking`)
    /// arrived in this field and is sent back under the same name (SPEC L7, L10).
    ChatField(ChatReasoningField),
    /// Chat Completions (OpenRouter and gateways in front of it): the `reasoning_details`
    /// array, its streamed pieces merged by `index`, sent back verbatim.
    ChatDetails(Value),
    /// Anthropic: the response's whole `content` array, verbatim in block order (text with
    /// its citations, signed thinking, `tool_use`, and the blocks the agent does not model:
    /// `server_tool_use`, `web_search_tool_result`, `mcp_tool_use`, …), kept when the response
    /// holds such a block. The assistant turn is then sent as these blocks (SPEC L13, case C69:
    /// a `pause_turn` response goes back as it came so the model continues it; Anthropic
    /// "Server tools", "pause_turn").
    AnthropicContent(Value),
}

/// The Chat Completions field a server streams reasoning text in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatReasoningField {
    /// `reasoning_content` (DeepSeek, Moonshot Kimi, Qwen/DashScope, older vLLM).
    ReasoningContent,
    /// `reasoning` (OpenRouter, Ollama, Groq, newer vLLM).
    Reasoning,
}

impl ChatReasoningField {
    /// The JSON field name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            ChatReasoningField::ReasoningContent => "reasoning_content",
            ChatReasoningField::Reasoning => "reasoning",
        }
    }
}

impl ReasoningBlock {
    /// Approximate size in bytes of what the block adds to a request (SPEC K1 accounting): the
    /// signature or opaque data; the JSON strings of a verbatim item; nothing for a
    /// [`ReasoningBlock::ChatField`] marker (its text is the message's `thinking`).
    #[must_use]
    pub fn content_bytes(&self) -> usize {
        match self {
            ReasoningBlock::Thinking { signature, .. } => signature.len(),
            ReasoningBlock::Redacted { data } => data.len(),
            ReasoningBlock::ResponsesItem(v)
            | ReasoningBlock::ChatDetails(v)
            | ReasoningBlock::AnthropicContent(v) => json_text_len(v),
            ReasoningBlock::ChatField(_) => 0,
        }
    }
}

/// The summed length of the strings (keys included) in a JSON value: a cheap size estimate.
fn json_text_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(json_text_len).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| k.len() + json_text_len(v)).sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 4,
    }
}

impl std::fmt::Debug for ReasoningBlock {
    // Lengths, not contents (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReasoningBlock::Thinking { text, signature } => {
                write!(f, "Thinking({} B, sig {} B)", text.len(), signature.len())
            }
            ReasoningBlock::Redacted { data } => write!(f, "Redacted({} B)", data.len()),
            ReasoningBlock::ResponsesItem(v) => write!(f, "ResponsesItem({} B)", json_text_len(v)),
            ReasoningBlock::ChatField(field) => write!(f, "ChatField({})", field.name()),
            ReasoningBlock::ChatDetails(v) => write!(f, "ChatDetails({} B)", json_text_len(v)),
            ReasoningBlock::AnthropicContent(v) => {
                write!(f, "AnthropicContent({} B)", json_text_len(v))
            }
        }
    }
}

/// One tool call as the model asked for it.
#[derive(Clone, PartialEq)]
pub struct ToolCall {
    /// Provider call id (synthesised when the provider sent none, SPEC C21).
    pub id: String,
    /// Provider-visible (qualified, sanitized) tool name, e.g. `fs__read_file`.
    pub name: String,
    /// The raw JSON text of the arguments as streamed (may be empty or invalid; the loop
    /// validates it, SPEC L2).
    pub arguments: String,
}

impl std::fmt::Debug for ToolCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}({} B)", self.id, self.name, self.arguments.len())
    }
}

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolDef {
    /// Provider-safe name (`^[A-Za-z0-9_-]{1,64}$`, SPEC M3).
    pub name: String,
    pub description: String,
    /// JSON Schema with `type: "object"` at the root (SPEC M3, C19), in the form the route's
    /// provider accepts (SPEC M14, `tool_schema`); `Value::Null` (Gemini only): the tool takes
    /// no arguments and is sent without `parameters`.
    pub input_schema: Value,
}

/// Everything a provider needs to build one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LlmRequest<'a> {
    pub model: &'a str,
    pub system: Option<&'a str>,
    pub messages: &'a [Message],
    /// Empty for a compaction summary call (SPEC K1).
    pub tools: &'a [ToolDef],
    /// Per-call output cap in tokens (`BUZZ_AGENT_MAX_OUTPUT_TOKENS`).
    pub max_output_tokens: u32,
    /// Prompt caching for this request (SPEC L11); `None`: off, or a call whose prefix is not
    /// the session's (the compaction summary).
    pub cache: Option<PromptCache<'a>>,
    /// The session's reasoning effort (SPEC L12); `None`: no reasoning parameter.
    pub effort: Option<crate::config::Effort>,
}

#[cfg(test)]
impl<'a> LlmRequest<'a> {
    /// The unit tests' request of `messages` to `model`: no system prompt, no tools, an output
    /// cap of 1024 tokens, no prompt caching, no effort; a test sets what it needs on top
    /// (`LlmRequest { tools, ..LlmRequest::for_tests(model, messages) }`).
    pub(crate) fn for_tests(model: &'a str, messages: &'a [Message]) -> Self {
        Self {
            model,
            system: None,
            messages,
            tools: &[],
            max_output_tokens: 1024,
            cache: None,
            effort: None,
        }
    }
}

/// What a route needs to cache a session's prompt prefix (SPEC L11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PromptCache<'a> {
    /// One key per session (the session id): OpenAI's `prompt_cache_key`, where the route
    /// sends it.
    pub key: &'a str,
    /// How many messages of this history the session's previous cached request carried
    /// (`History::cache_mark`): the end of that request, whose breakpoint this request reads
    /// back on Anthropic. `None` for the first request, and after any change of the history
    /// but an append.
    pub previous_len: Option<usize>,
}

/// A fully built HTTP request of one LLM call (SPEC L6–L8): the runtime sends it verbatim
/// (DESIGN: `CallLlm`) and streams the answer back as [`LlmEvent`](crate::LlmEvent)s. Every LLM
/// call is a `POST` with a JSON body and a streamed (SSE) answer, so the method is not carried.
/// `Debug` shows the URL, the header names and the body length only: never a key (SPEC P2).
#[derive(Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The absolute URL (`https://…/v1/messages`, `…/chat/completions` or `…/responses`).
    pub url: String,
    /// Header `(name, value)` pairs, names lower-case, to send in this order (content type,
    /// accept, then the provider's auth and version headers).
    pub headers: Vec<(String, String)>,
    /// The JSON body, UTF-8, in pieces sent back to back ([`Body`]).
    pub body: Body,
}

/// A request body as pieces, sent back to back: [`Body::len`] bytes in all.
///
/// The serialized history that a session keeps between rounds is one shared piece
/// (issue #15): a round's request adds what is new to it instead of copying it, and the
/// runtime writes the pieces in order. Equality compares the bytes, not how they are cut.
#[derive(Clone, Default)]
pub struct Body {
    pieces: Vec<Arc<Vec<u8>>>,
    len: usize,
}

impl Body {
    /// Appends a piece.
    pub fn push(&mut self, bytes: Vec<u8>) {
        self.push_shared(Arc::new(bytes));
    }

    /// Appends a shared piece (not copied; while the body lives, the owner of the other
    /// handles cannot change it in place).
    pub fn push_shared(&mut self, bytes: Arc<Vec<u8>>) {
        if !bytes.is_empty() {
            self.len += bytes.len();
            self.pieces.push(bytes);
        }
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces.iter().map(|p| p.as_slice())
    }

    /// Total length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// No bytes at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All the bytes in one buffer (a copy).
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for piece in self.pieces() {
            out.extend_from_slice(piece);
        }
        out
    }
}

impl From<Vec<u8>> for Body {
    fn from(bytes: Vec<u8>) -> Body {
        let mut body = Body::default();
        body.push(bytes);
        body
    }
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        self.len == other.len && self.pieces().flatten().eq(other.pieces().flatten())
    }
}

impl Eq for Body {}

impl std::fmt::Debug for Body {
    // Lengths, not contents (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Body({} B in {} pieces)", self.len, self.pieces.len())
    }
}

impl std::fmt::Debug for HttpRequest {
    // Never print secrets or the (large) body (SPEC P2).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        write!(
            f,
            "POST {} headers={:?} body={} B",
            crate::text::redact_url(&self.url),
            names,
            self.body.len()
        )
    }
}

/// Why the model stopped, provider-neutral (SPEC L1, L6, L7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopKind {
    /// The model ended its turn (`stop`, `end_turn`, `stop_sequence`).
    EndTurn,
    /// The model asked for tools (`tool_calls`, `tool_use`).
    ToolUse,
    /// Output was cut by the token cap (`length`, `max_tokens`).
    MaxTokens,
    /// Output was cut because prompt and answer filled the model's context window (Anthropic
    /// `model_context_window_exceeded`, Mistral `model_length`): the context is compacted
    /// before the next round, as for a context-too-long answer (SPEC K1, L5).
    ContextFull,
    /// Refusal or content filter (`refusal`, `content_filter`).
    Refusal,
    /// Anthropic `pause_turn`: a long-running server-tool turn paused; the turn goes on with
    /// the paused response sent back as the last assistant turn (SPEC L13, case C69).
    Pause,
}

/// Token usage reported by one response, in tokens, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Every input token of the call, those read from or written to the prompt cache included
    /// (Anthropic reports the three parts apart; they are summed here).
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `input_tokens` read from the provider's prompt cache (SPEC L11: Anthropic
    /// `cache_read_input_tokens`, OpenAI `cached_tokens`); `None` when the provider said
    /// nothing about it.
    pub cache_read_tokens: Option<u64>,
    /// The part of `input_tokens` written to the prompt cache (Anthropic
    /// `cache_creation_input_tokens`); `None` when not reported.
    pub cache_write_tokens: Option<u64>,
}

/// Token counts summed over calls (a turn's, a session's), saturating; the cache counts are
/// known once any call reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UsageTotals {
    /// LLM calls that reported usage.
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
}

impl UsageTotals {
    /// Adds one call's usage.
    pub(crate) fn add(&mut self, u: &Usage) {
        fn sum(total: &mut Option<u64>, part: Option<u64>) {
            if let Some(n) = part {
                *total = Some(total.unwrap_or(0).saturating_add(n));
            }
        }
        self.calls = self.calls.saturating_add(1);
        self.input_tokens = self.input_tokens.saturating_add(u.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(u.output_tokens);
        sum(&mut self.cache_read_tokens, u.cache_read_tokens);
        sum(&mut self.cache_write_tokens, u.cache_write_tokens);
    }

    /// One call's usage as totals.
    pub(crate) fn of(u: &Usage) -> UsageTotals {
        let mut t = UsageTotals::default();
        t.add(u);
        t
    }

    /// What these tokens cost at `prices` (per million tokens, `BUZZ_AGENT_PRICES`), in the
    /// prices' currency: cache reads and writes at their own prices, the rest of the input at
    /// the input price, the output at the output price.
    #[must_use]
    pub(crate) fn cost(&self, prices: &Prices) -> f64 {
        let read = self.cache_read_tokens.unwrap_or(0);
        let write = self.cache_write_tokens.unwrap_or(0);
        let plain = self.input_tokens.saturating_sub(read).saturating_sub(write);
        // Token counts and micro-prices are far below 2^53: the products are exact enough.
        #[allow(clippy::cast_precision_loss)]
        let micros = plain as f64 * prices.input_micros as f64
            + read as f64 * prices.cache_read_micros as f64
            + write as f64 * prices.cache_write_micros as f64
            + self.output_tokens as f64 * prices.output_micros as f64;
        micros / 1e12
    }
}

/// A complete decoded response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LlmResponse {
    pub text: String,
    /// All reasoning text of the response, concatenated (also streamed as
    /// [`StreamDelta::Thought`]).
    pub thinking: String,
    /// Reasoning state in stream order, for replay in [`Message::Assistant`] (SPEC L10); empty
    /// when the provider sent none.
    pub reasoning: Vec<ReasoningBlock>,
    /// In provider order (by index), ids never empty.
    pub tool_calls: Vec<ToolCall>,
    pub stop: StopKind,
    pub usage: Option<Usage>,
    /// Why the provider stopped, in its words, when it said (Anthropic `stop_details` of a
    /// `refusal`: its `explanation`, then `(category: …)`); shown to the client
    /// (SPEC L13, case C77).
    pub stop_details: Option<String>,
}

/// An incremental piece of a streamed response, forwarded to the client as it arrives (SPEC A6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamDelta {
    /// Visible text → `agent_message_chunk`.
    Text(String),
    /// Reasoning → `agent_thought_chunk`.
    Thought(String),
}

/// Why a stream could not produce a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StreamError {
    /// The body ended before the response was complete (no terminator, cut mid-event, partial
    /// tool-call JSON). Retryable (SPEC L5, C24).
    #[error("stream truncated: {0}")]
    Truncated(String),
    /// A 2xx body that is not an event stream (JSON where a stream was expected, issue 12).
    /// Not retryable: the same request gets the same body.
    #[error("{0}")]
    NotAStream(String),
    /// The provider reported an error inside the stream (e.g. Anthropic `overloaded_error`).
    #[error("provider error: {message}")]
    Provider { message: String, retryable: bool },
}

impl StreamError {
    /// Whether another attempt may succeed (SPEC L5).
    #[must_use]
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            StreamError::Truncated(_) => true,
            StreamError::NotAStream(_) => false,
            StreamError::Provider { retryable, .. } => *retryable,
        }
    }
}

/// Decodes one streamed response body. Bytes may be split anywhere (SPEC L9).
pub(crate) trait StreamDecoder: Send {
    /// Feed the next chunk of body bytes; incremental deltas are pushed to `out` in order.
    ///
    /// # Errors
    /// A provider error event in the stream.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<StreamDelta>) -> Result<(), StreamError>;
    /// True once the stream's own terminator was seen (`[DONE]`, `message_stop`, …): the
    /// runtime may drop the connection (SPEC C24 b).
    fn is_complete(&self) -> bool;
    /// True once the response is known to be whole even without the terminator (e.g. a Chat
    /// Completions `finish_reason` arrived but `[DONE]` did not): the loop then waits only a
    /// short grace for more bytes before finishing (case C24 b). Defaults to `is_complete`.
    fn has_final_answer(&self) -> bool {
        self.is_complete()
    }
    /// The body ended (EOF); produce the response or say why it is incomplete.
    ///
    /// # Errors
    /// [`StreamError::Truncated`] when the stream ended before a complete response.
    fn finish(&mut self, out: &mut Vec<StreamDelta>) -> Result<LlmResponse, StreamError>;
}

/// Test support shared by the provider decoders' unit tests (SPEC L9: any split of the bytes).
#[cfg(test)]
pub(crate) mod decoder_tests {
    use super::{LlmResponse, StreamDecoder, StreamDelta, StreamError, ToolCall};
    use proptest::prelude::*;
    use serde_json::Value;

    /// `body` with every `data: {…}` payload that holds one of `keys` (fields of a route's
    /// view, tried in order) given the first of them twice, the copy first with the same
    /// value: the view refuses a duplicate field, so the event goes the route's general path,
    /// whose `Value` is the same as without the copy. A payload with none of them (or not
    /// strict JSON, which the view refuses anyway) is left as it is.
    pub(crate) fn forced_general(body: &str, keys: &[&str]) -> String {
        body.split_inclusive('\n')
            .map(|line| {
                let Some(rest) = line.strip_prefix("data: {") else {
                    return line.to_owned();
                };
                let json = line.trim_start_matches("data: ").trim_end();
                let Ok(map) = serde_json::from_str::<serde_json::Map<String, Value>>(json) else {
                    return line.to_owned();
                };
                match keys.iter().find_map(|k| map.get(*k).map(|v| (k, v))) {
                    Some((key, value)) => format!("data: {{\"{key}\":{value},{rest}"),
                    None => line.to_owned(),
                }
            })
            .collect()
    }

    /// Values of a generated text field: plain, empty, escaped, a surrogate pair, a lone
    /// surrogate (the view refuses it, the general path makes it U+FFFD), and not a string.
    pub(crate) const TEXT: &[&str] = &[
        r#""Hel""#,
        r#""""#,
        r#""a\nb \"q\" \u00e9""#,
        r#""\ud83d\udc1d""#,
        r#""lone \ud800""#,
        "null",
        "3",
        "[]",
        "{}",
    ];
    /// Values of a generated index field, some of them not a `u64`.
    pub(crate) const INDEX: &[&str] = &["0", "1", "2", "null", "1.0", "-1", r#""0""#];
    /// Values of a field no decoder reads.
    pub(crate) const UNKNOWN: &[&str] =
        &[r#""c1""#, r#"{"a":[1,{"b":null}]}"#, r#""\ud800""#, "true"];

    /// `{…}` of the fields that are present (for generators of stream payloads).
    pub(crate) fn object(fields: Vec<Option<String>>) -> String {
        let fields: Vec<String> = fields.into_iter().flatten().collect();
        format!("{{{}}}", fields.join(","))
    }

    /// `"name":value`, for a value among `values`, or absent.
    pub(crate) fn field(
        name: &'static str,
        values: &'static [&'static str],
    ) -> impl Strategy<Value = Option<String>> {
        prop::option::of(prop::sample::select(values).prop_map(move |v| format!("\"{name}\":{v}")))
    }

    /// `"name":value` for a generated value, or absent.
    pub(crate) fn field_of(
        name: &'static str,
        value: impl Strategy<Value = String>,
    ) -> impl Strategy<Value = Option<String>> {
        prop::option::of(value.prop_map(move |v| format!("\"{name}\":{v}")))
    }

    /// Mostly a well-typed value from `good`, sometimes any from `any`.
    pub(crate) fn mostly(
        good: &'static [&'static str],
        any: &'static [&'static str],
    ) -> BoxedStrategy<String> {
        prop_oneof![
            5 => prop::sample::select(good).prop_map(str::to_owned),
            1 => prop::sample::select(any).prop_map(str::to_owned),
        ]
        .boxed()
    }

    /// A text value: mostly a string (plain, escaped, a pair, empty), sometimes any of [`TEXT`].
    pub(crate) fn text() -> BoxedStrategy<String> {
        mostly(
            &[r#""Hel""#, r#""a\nb \"q\"""#, r#""\ud83d\udc1d""#, r#""""#],
            TEXT,
        )
    }

    /// An index value: mostly 0–2, sometimes any of [`INDEX`].
    pub(crate) fn index() -> BoxedStrategy<String> {
        mostly(&["0", "1", "2"], INDEX)
    }

    /// `"name":value` for a generated value, present nine times in ten.
    pub(crate) fn often(
        name: &'static str,
        value: BoxedStrategy<String>,
    ) -> BoxedStrategy<Option<String>> {
        prop::option::weighted(0.9, value.prop_map(move |v| format!("\"{name}\":{v}"))).boxed()
    }

    /// One SSE event of a type drawn from `kind`: its name (mostly the type, sometimes another
    /// of `names`) and its JSON object, with a `type` (mostly the name, sometimes absent or not
    /// a string), the type's `fields` and a field no decoder reads.
    pub(crate) fn sse_event(
        kind: impl Strategy<Value = &'static str>,
        names: &'static [&'static str],
        fields: fn(&'static str) -> BoxedStrategy<Vec<Option<String>>>,
    ) -> impl Strategy<Value = (String, String)> {
        kind.prop_flat_map(move |kind| {
            let name = prop_oneof![
                10 => Just(kind),
                1 => prop::sample::select(names),
            ];
            let type_field = prop_oneof![
                10 => Just(Some(format!("\"type\":\"{kind}\""))),
                1 => Just(None),
                1 => prop::sample::select(&["null", "7"][..])
                    .prop_map(|t| Some(format!("\"type\":{t}"))),
            ];
            (name, type_field, fields(kind), field("future", UNKNOWN)).prop_map(
                |(name, t, mut fields, x)| {
                    fields.insert(0, t);
                    fields.push(x);
                    (name.to_owned(), object(fields))
                },
            )
        })
    }

    /// The SSE body of `events` (name, data).
    pub(crate) fn sse_body(events: &[(String, String)]) -> String {
        events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect()
    }

    /// What a decoder made of one body.
    #[derive(Debug, PartialEq)]
    pub(crate) struct Outcome {
        pub result: Result<LlmResponse, StreamError>,
        pub deltas: Vec<StreamDelta>,
        pub complete: bool,
    }

    /// The response of `outcome`; panics with its error when it has none.
    pub(crate) fn ok(outcome: &Outcome) -> &LlmResponse {
        match &outcome.result {
            Ok(response) => response,
            Err(err) => panic!("expected a response, got {err}"),
        }
    }

    /// The tool call `id` of `name` with the raw `arguments`.
    pub(crate) fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }

    /// The headers of a streaming JSON `POST`: `content-type: application/json`,
    /// `accept: text/event-stream`, then `auth` (the route's key and version headers).
    pub(crate) fn streaming_headers(auth: &[(&str, &str)]) -> Vec<(String, String)> {
        [
            ("content-type", "application/json"),
            ("accept", "text/event-stream"),
        ]
        .iter()
        .chain(auth)
        .map(|&(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
    }

    /// Feed `chunks` to a fresh decoder, then finish it.
    pub(crate) fn run_chunks(mut decoder: Box<dyn StreamDecoder>, chunks: &[&[u8]]) -> Outcome {
        let mut deltas = Vec::new();
        for chunk in chunks {
            if let Err(err) = decoder.feed(chunk, &mut deltas) {
                return Outcome {
                    result: Err(err),
                    deltas,
                    complete: decoder.is_complete(),
                };
            }
        }
        let complete = decoder.is_complete();
        let result = decoder.finish(&mut deltas);
        Outcome {
            result,
            deltas,
            complete,
        }
    }

    /// C52 for one route: a body that streams one line past
    /// [`crate::sse::MAX_SSE_LINE_BYTES`] without a newline fails with a sticky, non-retryable
    /// provider error once the cap is crossed, and later bytes are not buffered.
    pub(crate) fn assert_endless_line_is_cut_off(make: &dyn Fn() -> Box<dyn StreamDecoder>) {
        let mut decoder = make();
        let mut deltas = Vec::new();
        assert!(decoder.feed(b"data: {\"x\":\"", &mut deltas).is_ok());
        let chunk = vec![b'a'; 1024 * 1024];
        let mut failed_at = None;
        for i in 0..20 {
            if let Err(e) = decoder.feed(&chunk, &mut deltas) {
                assert!(!e.is_retryable(), "{e}");
                assert!(e.to_string().contains("over 16 MiB"), "{e}");
                failed_at = Some(i);
                break;
            }
        }
        assert_eq!(failed_at, Some(15), "fails as the 16 MiB cap is crossed");
        assert!(decoder.feed(b"\n\n", &mut deltas).is_err(), "sticky");
        assert!(decoder.finish(&mut deltas).is_err());
        assert!(deltas.is_empty());
    }

    /// C36 / L9 for one route: `body` with every `é` written as the lone byte `0xE9` (invalid
    /// UTF-8, as a Latin-1 tool would) decodes, whole, at every 2-chunk split and byte by byte,
    /// exactly like `body` with every `é` replaced by U+FFFD. Returns that outcome.
    pub(crate) fn assert_invalid_utf8_is_decoded_lossily(
        make: &dyn Fn() -> Box<dyn StreamDecoder>,
        body: &str,
    ) -> Outcome {
        assert!(body.contains('é'), "the body needs an é to corrupt");
        let bad: Vec<u8> = body
            .replace('é', "\u{1}")
            .bytes()
            .map(|b| if b == 1 { 0xE9 } else { b })
            .collect();
        assert!(std::str::from_utf8(&bad).is_err());
        let want = run_chunks(make(), &[body.replace('é', "\u{FFFD}").as_bytes()]);
        assert!(want.result.is_ok(), "{:?}", want.result);
        for i in 0..=bad.len() {
            let (a, b) = bad.split_at(i);
            assert_eq!(run_chunks(make(), &[a, b]), want, "split at byte {i}");
        }
        let singles: Vec<&[u8]> = bad.chunks(1).collect();
        assert_eq!(run_chunks(make(), &singles), want, "byte by byte");
        want
    }

    /// Decode `body` whole, at every 2-chunk split, byte by byte, and byte by byte with CRLF and
    /// CR line endings; every run must give the same response and the same deltas.
    pub(crate) fn decode_every_split(
        make: &dyn Fn() -> Box<dyn StreamDecoder>,
        body: &str,
    ) -> Outcome {
        let whole = run_chunks(make(), &[body.as_bytes()]);
        let bytes = body.as_bytes();
        for i in 0..=bytes.len() {
            let (a, b) = bytes.split_at(i);
            assert_eq!(run_chunks(make(), &[a, b]), whole, "split at byte {i}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(run_chunks(make(), &singles), whole, "byte by byte");
        for ending in ["\r\n", "\r"] {
            let converted = body.replace('\n', ending);
            let singles: Vec<&[u8]> = converted.as_bytes().chunks(1).collect();
            assert_eq!(
                run_chunks(make(), &singles),
                whole,
                "byte by byte, line ending {ending:?}"
            );
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    //! The provider-neutral types' own rules: the size estimates compaction counts with
    //! (SPEC K1), `Debug` forms that show lengths and never contents (SPEC P2, DESIGN habits),
    //! the request body in shared pieces (issue #15) and the stream error's retry rule (SPEC L5).

    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// An answer with every kind of content, each of a different length.
    fn full_answer() -> Message {
        Message::Assistant {
            text: "answer".into(),  // 6
            thinking: "hmm".into(), // 3
            reasoning: vec![
                ReasoningBlock::Thinking {
                    text: "not counted: it is the message's thinking".into(),
                    signature: "sig==".into(), // 5
                },
                ReasoningBlock::Redacted {
                    data: "encrypted".into(), // 9
                },
                ReasoningBlock::ChatField(ChatReasoningField::Reasoning), // 0
            ],
            tool_calls: vec![
                call("call_1", "fs__read", r#"{"p":1}"#), // 6 + 8 + 7
                call("c2", "sh", "{}"),                   // 2 + 2 + 2
            ],
        }
    }

    #[test]
    fn k1_a_message_counts_the_bytes_the_model_sees() {
        assert_eq!(
            Message::User {
                text: "hello".into()
            }
            .content_bytes(),
            5
        );
        assert_eq!(full_answer().content_bytes(), 6 + 3 + (5 + 9) + (21 + 6));
        let result = Message::ToolResult {
            call_id: "call_1".into(), // 6
            name: "fs__read".into(),  // 8
            text: "contents".into(),  // 8
            is_error: true,
        };
        assert_eq!(result.content_bytes(), 22);
    }

    #[test]
    fn k1_l10_reasoning_state_counts_its_opaque_bytes_and_json_strings() {
        let thinking = ReasoningBlock::Thinking {
            text: "the text is the message's thinking".into(),
            signature: "sig".into(),
        };
        assert_eq!(thinking.content_bytes(), 3);
        assert_eq!(
            ReasoningBlock::Redacted { data: "ab".into() }.content_bytes(),
            2
        );
        assert_eq!(
            ReasoningBlock::ChatField(ChatReasoningField::ReasoningContent).content_bytes(),
            0
        );
        // Keys and strings count their bytes; null, booleans and numbers count 4 each.
        let item = json!({"id": "rs_1", "encrypted_content": "xyz", "n": null});
        assert_eq!(
            ReasoningBlock::ResponsesItem(item).content_bytes(),
            (2 + 4) + (17 + 3) + (1 + 4)
        );
        let details = json!([{"type": "reasoning.text", "text": "t"}, true, 7]);
        assert_eq!(
            ReasoningBlock::ChatDetails(details).content_bytes(),
            (4 + 14) + (4 + 1) + 4 + 4
        );
    }

    #[test]
    fn l7_a_chat_reasoning_field_is_sent_back_under_its_own_name() {
        assert_eq!(
            ChatReasoningField::ReasoningContent.name(),
            "reasoning_content"
        );
        assert_eq!(ChatReasoningField::Reasoning.name(), "reasoning");
    }

    #[test]
    fn p2_debug_shows_lengths_and_ids_never_contents() {
        let secret = "sk-secret";
        let shown = format!(
            "{:?}",
            [
                Message::User {
                    text: secret.into()
                },
                full_answer(),
                Message::ToolResult {
                    call_id: "call_1".into(),
                    name: "fs__read".into(),
                    text: secret.into(),
                    is_error: false,
                },
            ]
        );
        assert_eq!(
            shown,
            "[User(9 B), Assistant(6 B text, 3 B thinking, 3 reasoning blocks, calls \
             [call_1:fs__read(7 B), c2:sh(2 B)]), ToolResult(call_1 fs__read 9 B err=false)]"
        );
        let blocks = [
            ReasoningBlock::Thinking {
                text: secret.into(),
                signature: "sig".into(),
            },
            ReasoningBlock::Redacted {
                data: secret.into(),
            },
            ReasoningBlock::ResponsesItem(json!({"k": secret})),
            ReasoningBlock::ChatField(ChatReasoningField::ReasoningContent),
            ReasoningBlock::ChatDetails(json!([secret])),
        ];
        assert_eq!(
            format!("{blocks:?}"),
            "[Thinking(9 B, sig 3 B), Redacted(9 B), ResponsesItem(10 B), \
             ChatField(reasoning_content), ChatDetails(9 B)]"
        );
        let request = HttpRequest {
            url: "https://llm.test/v1/messages".into(),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("x-api-key".into(), secret.into()),
            ],
            body: Body::from(format!("{{\"key\":\"{secret}\"}}").into_bytes()),
        };
        assert_eq!(
            format!("{request:?}"),
            "POST https://llm.test/v1/messages headers=[\"content-type\", \"x-api-key\"] body=19 B"
        );
        assert_eq!(format!("{:?}", request.body), "Body(19 B in 1 pieces)");
    }

    #[test]
    fn l6_a_request_body_is_its_pieces_back_to_back_and_equal_by_bytes_however_cut() {
        let mut body = Body::default();
        assert!(body.is_empty());
        body.push(b"{\"a\":".to_vec());
        body.push(Vec::new()); // an empty piece is not kept
        let shared = Arc::new(b"[1,2]".to_vec());
        body.push_shared(Arc::clone(&shared));
        body.push(b"}".to_vec());
        assert!(!body.is_empty());
        assert_eq!(body.len(), 11);
        assert_eq!(
            body.pieces().collect::<Vec<&[u8]>>(),
            [&b"{\"a\":"[..], b"[1,2]", b"}"]
        );
        assert_eq!(body.to_vec(), b"{\"a\":[1,2]}");
        assert_eq!(format!("{body:?}"), "Body(11 B in 3 pieces)");
        let whole = Body::from(b"{\"a\":[1,2]}".to_vec());
        assert_eq!(whole.len(), 11);
        assert_eq!(whole, body, "the same bytes cut differently");
        assert_ne!(
            Body::from(b"{\"a\":[1,3]}".to_vec()),
            body,
            "the same length, other bytes"
        );
        assert_ne!(Body::from(b"{\"a\":[1,2]} ".to_vec()), body, "longer");
        assert_eq!(Body::from(Vec::new()), Body::default());
    }

    #[test]
    fn l5_a_truncated_stream_is_retried_a_body_that_is_no_stream_is_not() {
        assert!(StreamError::Truncated("cut".into()).is_retryable());
        assert!(!StreamError::NotAStream("{}".into()).is_retryable());
        for retryable in [true, false] {
            let e = StreamError::Provider {
                message: "overloaded".into(),
                retryable,
            };
            assert_eq!(e.is_retryable(), retryable);
        }
    }

    /// A decoder that keeps the default [`StreamDecoder::has_final_answer`].
    struct Terminated(bool);

    impl StreamDecoder for Terminated {
        fn feed(&mut self, _: &[u8], _: &mut Vec<StreamDelta>) -> Result<(), StreamError> {
            Ok(())
        }
        fn is_complete(&self) -> bool {
            self.0
        }
        fn finish(&mut self, _: &mut Vec<StreamDelta>) -> Result<LlmResponse, StreamError> {
            Err(StreamError::Truncated("no answer".into()))
        }
    }

    #[test]
    fn c24_an_answer_is_final_by_default_once_the_stream_is_complete() {
        assert!(Terminated(true).has_final_answer());
        assert!(!Terminated(false).has_final_answer());
    }
}
