//! OpenAI Chat Completions (SPEC L7): the request builder and the streamed-response decoder.
//!
//! Works with OpenAI and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, LiteLLM,
//! DashScope, NIM, …), so the decoder accepts the known deviations (cases C21–C24, C26).

use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

#[allow(
    unused_imports,
    reason = "named by doc links and by the unit tests; the decoder is one via `EventHandler`"
)]
use crate::llm::StreamDecoder;
use crate::llm::{
    HttpRequest, LlmRequest, LlmResponse, Message, StopKind, StreamDelta, StreamError, ToolCall,
    ToolDef, Usage,
};
use crate::request::{
    ErrorText, arguments_or_empty_object, bearer, body_capacity, streaming_json_post,
};
use crate::sse::{SseEvent, parse_json_lossy};
use crate::sse_stream::{
    CallSlot, EventHandler, SseState, StreamedText, parse_event_json, take_calls,
};

/// Build the streaming `POST {base_url}/chat/completions` request (SPEC L7).
///
/// * `base_url`: e.g. `http://127.0.0.1:5000/v1` (a trailing `/` is tolerated).
/// * `api_key`: sent as `authorization: Bearer <key>` only when non-empty (local servers).
/// * Headers: `content-type: application/json`, `accept: text/event-stream`.
/// * Body (compact JSON, keys in this order): `model`; `messages` (the system prompt first
///   when present and non-empty, then the history: user → `{"role":"user","content"}`,
///   assistant → `{"role":"assistant","content"}` with `""` when empty (L7) plus
///   `tool_calls:[{"id","type":"function","function":{"name","arguments"}}]` when it called
///   tools, `arguments` being the model's own text or `"{}"` when that was blank (C26);
///   reasoning text is not sent back; tool result → `{"role":"tool","tool_call_id","content"}`
///   with `Error: ` prefixed to an error result); `tools` (omitted when empty, e.g. the
///   compaction call); `stream:true`; `stream_options:{"include_usage":true}`; `max_tokens`.
///
/// The output cap is sent as `max_tokens`, not OpenAI's newer `max_completion_tokens`: every
/// OpenAI-compatible server accepts `max_tokens`, many reject or ignore the newer name.
///
/// Serialized in one pass straight into the body buffer: linear in the history size.
#[must_use]
pub fn build_request(base_url: &str, api_key: &str, req: &LlmRequest<'_>) -> HttpRequest {
    let payload = ChatBody {
        model: req.model,
        messages: WireMessages {
            system: req.system,
            history: req.messages,
        },
        tools: WireTools(req.tools),
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        max_tokens: req.max_output_tokens,
    };
    streaming_json_post(
        format!("{}/chat/completions", base_url.trim_end_matches('/')),
        bearer(api_key),
        &payload,
        body_capacity(req, 64),
    )
}

/// The request body, borrowed from the history (no copies).
#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: WireMessages<'a>,
    #[serde(skip_serializing_if = "WireTools::is_empty")]
    tools: WireTools<'a>,
    stream: bool,
    stream_options: StreamOptions,
    max_tokens: u32,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

struct WireMessages<'a> {
    system: Option<&'a str>,
    history: &'a [Message],
}

impl Serialize for WireMessages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        if let Some(system) = self.system.filter(|s| !s.is_empty()) {
            seq.serialize_element(&TextMessage {
                role: "system",
                content: system,
            })?;
        }
        for message in self.history {
            seq.serialize_element(&WireMessage(message))?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct TextMessage<'a> {
    role: &'static str,
    content: &'a str,
}

struct WireMessage<'a>(&'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Message::User { text } => TextMessage {
                role: "user",
                content: text,
            }
            .serialize(serializer),
            Message::Assistant {
                text,
                thinking: _,
                reasoning: _,
                tool_calls,
            } => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("role", "assistant")?;
                map.serialize_entry("content", text)?;
                if !tool_calls.is_empty() {
                    map.serialize_entry("tool_calls", &WireToolCalls(tool_calls))?;
                }
                map.end()
            }
            Message::ToolResult {
                call_id,
                name: _,
                text,
                is_error,
            } => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", call_id)?;
                if *is_error {
                    map.serialize_entry("content", &ErrorText(text))?;
                } else {
                    map.serialize_entry("content", text)?;
                }
                map.end()
            }
        }
    }
}

struct WireToolCalls<'a>(&'a [ToolCall]);

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

impl WireTools<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

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
    parameters: &'a Value,
}

/// Decoder of one streamed Chat Completions body (SPEC L7, L9; cases C21–C24, C26).
///
/// * Each SSE `data:` payload is a JSON chunk (parsed with [`parse_json_lossy`], so lone
///   surrogates become U+FFFD); `data: [DONE]` ends the stream and later bytes are ignored.
///   Only choice `index` 0 is used (a choice without `index` counts as 0); chunks with empty,
///   missing or `null` `choices` are fine (C22); unknown fields are ignored.
/// * `delta.content` → [`StreamDelta::Text`] as it arrives; `delta.reasoning_content`, else
///   `delta.reasoning` (servers that send both send the same text) → [`StreamDelta::Thought`].
/// * Tool-call deltas are merged by `index` (C21): any start, gaps allowed; id and name are the
///   first non-empty ones; arguments are concatenated (a JSON object instead of a string is
///   appended as its JSON text). A delta without `index` continues the current call unless it
///   brings a different id, or a name while the current call already has one (then it opens
///   the next index). Calls come out in index order; a slot that never got a name is dropped;
///   a missing or duplicate id is replaced by `{id_prefix}_{index}`.
/// * Usage comes from the last chunk with a non-null `usage` (`prompt_tokens` → input,
///   `completion_tokens` → output): cumulative usage is not double counted (C22).
/// * `finish_reason` `null` or `""` is not terminal (C23). `stop` → end turn, `tool_calls`
///   and `function_call` → tool use, `length` → max tokens, `content_filter` → refusal; the
///   Anthropic spellings `end_turn`, `tool_use`, `max_tokens`, `refusal` are accepted as
///   aliases; anything else → end turn. The last non-empty reason wins.
/// * An `error` object in a chunk (or an `event: error` event) → retryable
///   [`StreamError::Provider`]; a complete chunk that is not JSON is one too. Errors are sticky.
///
/// [`StreamDecoder::is_complete`] is true only after `[DONE]`: a server that sends a
/// `finish_reason` but keeps the connection open (C24 b) is detected by
/// [`StreamDecoder::has_final_answer`]: the loop waits a short grace, drops the connection, and
/// [`StreamDecoder::finish`] then accepts the response because a finish reason was seen.
pub struct ChatDecoder {
    /// Prefix of synthesised call ids: `{id_prefix}_{index}`.
    id_prefix: String,
    /// Parser, sticky error, response taken.
    sse: SseState,
    /// Text and reasoning so far.
    streamed: StreamedText,
    /// Tool-call slots by provider `index`.
    calls: BTreeMap<u64, CallSlot>,
    /// The slot the last tool-call delta went to (for deltas without `index`).
    current_call: Option<u64>,
    usage: Option<Usage>,
    /// The last non-empty `finish_reason`, mapped.
    finish_reason: Option<StopKind>,
    /// `data: [DONE]` was seen.
    done: bool,
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
    pub fn new(id_prefix: String) -> Self {
        ChatDecoder {
            id_prefix,
            sse: SseState::new(),
            streamed: StreamedText::default(),
            calls: BTreeMap::new(),
            current_call: None,
            usage: None,
            finish_reason: None,
            done: false,
        }
    }

    fn handle_choice(&mut self, choice: &Value, out: &mut Vec<StreamDelta>) {
        if let Some(delta) = choice.get("delta") {
            if let Some(text) = non_empty_str(delta.get("content")) {
                self.streamed.push_text(text, out);
            }
            let reasoning = non_empty_str(delta.get("reasoning_content"))
                .or_else(|| non_empty_str(delta.get("reasoning")));
            if let Some(thought) = reasoning {
                self.streamed.push_thought(thought, out);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for call in calls {
                    self.merge_call(call);
                }
            }
        }
        if let Some(reason) = non_empty_str(choice.get("finish_reason")) {
            self.finish_reason = Some(stop_kind(reason));
        }
    }

    /// Merge one `delta.tool_calls[]` element into its slot (C21).
    fn merge_call(&mut self, call: &Value) {
        let id = non_empty_str(call.get("id"));
        let function = call.get("function");
        let name = non_empty_str(function.and_then(|f| f.get("name")));
        let index = match call.get("index").and_then(Value::as_u64) {
            Some(index) => index,
            None => self.index_for_unindexed(id, name.is_some()),
        };
        self.current_call = Some(index);
        let slot = self.calls.entry(index).or_default();
        if let Some(id) = id.filter(|_| slot.id.is_empty()) {
            id.clone_into(&mut slot.id);
        }
        if let Some(name) = name.filter(|_| slot.name.is_empty()) {
            name.clone_into(&mut slot.name);
        }
        if let Some(arguments) = function.and_then(|f| f.get("arguments")) {
            if let Some(text) = arguments.as_str() {
                slot.arguments.push_str(text);
            } else if arguments.is_object() {
                slot.arguments.push_str(&arguments.to_string());
            }
        }
    }

    /// The slot for a tool-call delta without `index` (servers that omit it): the current call,
    /// or the next index when the delta evidently starts another call.
    fn index_for_unindexed(&self, id: Option<&str>, has_name: bool) -> u64 {
        let Some((&last, _)) = self.calls.last_key_value() else {
            return 0;
        };
        let current = self.current_call.unwrap_or(last);
        let Some(slot) = self.calls.get(&current) else {
            return current;
        };
        let other_id = id.is_some_and(|id| !slot.id.is_empty() && slot.id != id);
        let another_name = has_name && id.is_none() && !slot.name.is_empty();
        if other_id || another_name {
            last.saturating_add(1)
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
        let Some(chunk) = parse_event_json(data, is_error_event, at_eof, "chunk")? else {
            return Ok(());
        };
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(StreamError::Provider {
                message: error_message(error),
                retryable: true,
            });
        }
        if is_error_event {
            return Err(StreamError::Provider {
                message: error_message(&chunk),
                retryable: true,
            });
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Some(Usage {
                input_tokens: count("prompt_tokens"),
                output_tokens: count("completion_tokens"),
            });
        }
        if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
            for choice in choices {
                if choice.get("index").and_then(Value::as_u64).unwrap_or(0) == 0 {
                    self.handle_choice(choice, out);
                }
            }
        }
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
        let tool_calls = take_calls(std::mem::take(&mut self.calls), &self.id_prefix);
        let stop = match self.finish_reason.take() {
            Some(StopKind::EndTurn | StopKind::ToolUse) if tool_calls.is_empty() => {
                StopKind::EndTurn
            }
            Some(StopKind::EndTurn | StopKind::ToolUse) => StopKind::ToolUse,
            Some(stop @ (StopKind::MaxTokens | StopKind::Refusal)) => stop,
            None if !self.done => {
                return Err(StreamError::Truncated(
                    "stream ended without [DONE] and without a finish_reason".to_owned(),
                ));
            }
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
        Ok(self
            .streamed
            .take_response(Vec::new(), tool_calls, stop, self.usage))
    }
}

/// `finish_reason` → [`StopKind`] (SPEC L7; Anthropic spellings as aliases; unknown → end turn).
fn stop_kind(reason: &str) -> StopKind {
    match reason {
        "tool_calls" | "function_call" | "tool_use" => StopKind::ToolUse,
        "length" | "max_tokens" => StopKind::MaxTokens,
        "content_filter" | "refusal" => StopKind::Refusal,
        _ => StopKind::EndTurn,
    }
}

/// Arguments that may run: blank (means `{}`, C26) or one whole JSON value.
fn arguments_complete(arguments: &str) -> bool {
    arguments.trim().is_empty()
        || serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_ok()
        || parse_json_lossy(arguments).is_ok()
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

    use crate::llm::decoder_tests::Outcome;

    fn make() -> Box<dyn StreamDecoder> {
        Box::new(ChatDecoder::new("call_t1".to_owned()))
    }

    fn decode_every_split(body: &str) -> Outcome {
        crate::llm::decoder_tests::decode_every_split(&make, body)
    }

    fn ok(outcome: &Outcome) -> &LlmResponse {
        match &outcome.result {
            Ok(response) => response,
            Err(err) => panic!("expected a response, got {err}"),
        }
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
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
                    output_tokens: 4
                }),
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
                reasoning: Vec::new(),
                thinking: "Need both.".into(),
                tool_calls: vec![
                    call("call_1", "fs__read_file", "{\"path\":\"hé.txt\"}"),
                    call("call_2", "fs__list_dir", "{\"p\":\".\"}"),
                ],
                stop: StopKind::ToolUse,
                usage: Some(Usage {
                    input_tokens: 100,
                    output_tokens: 30
                }),
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
                output_tokens: 13
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
                output_tokens: 13
            })
        );
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
        serde_json::from_slice(&request.body).unwrap()
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
            model: "gpt-x",
            system: Some("Be brief."),
            messages: &messages,
            tools: &tools,
            max_output_tokens: 4096,
        };
        let request = build_request("http://127.0.0.1:5000/v1", "sk-test", &req);
        assert_eq!(request.url, "http://127.0.0.1:5000/v1/chat/completions");
        assert_eq!(
            request.headers,
            vec![
                ("content-type".to_owned(), "application/json".to_owned()),
                ("accept".to_owned(), "text/event-stream".to_owned()),
                ("authorization".to_owned(), "Bearer sk-test".to_owned()),
            ]
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
        let text = String::from_utf8(request.body).unwrap();
        assert!(
            text.starts_with("{\"model\":\"gpt-x\",\"messages\":[{\"role\":\"system\""),
            "{text}"
        );
        assert!(!text.contains('\n') && !text.contains(": "));
    }

    #[test]
    fn l7_no_api_key_means_no_authorization_header_and_no_tools_means_no_tools_key() {
        let messages = [Message::User {
            text: "summarise".into(),
        }];
        let req = LlmRequest {
            model: "m",
            system: None,
            messages: &messages,
            tools: &[],
            max_output_tokens: 100,
        };
        let request = build_request("http://h/v1/", "", &req);
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
            model: "m",
            system: Some(""),
            messages: &messages,
            tools: &[],
            max_output_tokens: 1,
        };
        let request = build_request("http://h/v1", "k", &req);
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
            model: "m",
            system: None,
            messages: &messages,
            tools: &[],
            max_output_tokens: 1,
        };
        let body = body_json(&build_request("http://h", "", &req));
        assert_eq!(body["messages"][0]["tool_calls"][1]["id"], "call_t1_2");
        assert_eq!(body["messages"][2]["tool_call_id"], "call_t1_2");
    }
}
