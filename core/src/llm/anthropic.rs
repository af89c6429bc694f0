//! Anthropic Messages API (SPEC L6): the request builder and the streamed-response decoder.
//!
//! Works with `api.anthropic.com` and Anthropic-compatible servers (proxies, gateways), so the
//! decoder accepts the known deviations (cases C24, C26, L9).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Value, json};

use super::request::{
    BodyCache, CacheKey, Last, Planned, WireElement, assemble, body_capacity, history_json,
    push_item, streaming_json_post, write_field,
};
use super::route::{ErrorReaction, Learned, ProviderRoute};
use super::sse_stream::{
    CallIds, EventHandler, JsonStr, SseState, StreamedText, parse_event_json, present, read_view,
    str_or_empty,
};
use crate::config::{Config, Effort};
use crate::json::parse_lossy;
use crate::llm::{
    HttpRequest, LlmRequest, LlmResponse, Message, ReasoningBlock, StopKind, StreamDecoder,
    StreamDelta, StreamError, TOOL_RESULTS_BRIDGE, ToolCall, ToolDef, Usage,
};
use crate::sse::SseEvent;

/// Text sent for a user turn that would otherwise be empty: Anthropic rejects empty content
/// and blank text blocks.
pub(crate) const EMPTY_USER_TEXT: &str = "(empty message)";

/// Text of an error tool result whose own text is blank: Anthropic rejects an empty `content`
/// when `is_error` is true.
pub(crate) const EMPTY_ERROR_TEXT: &str = "Error";

/// The Anthropic Messages route (SPEC L6): [`build_request_cached`], [`AnthropicDecoder`]; its
/// own reaction to an HTTP error is the other form of `thinking` (SPEC L12).
pub(crate) struct AnthropicMessages;

impl ProviderRoute for AnthropicMessages {
    fn build_request(
        &self,
        cfg: &Config,
        req: &LlmRequest<'_>,
        learned: &Learned,
        cache: Option<&mut BodyCache>,
    ) -> HttpRequest {
        build_request_with(cfg, req, learned, cache)
    }

    /// SPEC L12: a 400 refusing the form of `thinking` the request carried for `model` (an
    /// older model refuses `adaptive`, a newer one `enabled` with a budget;
    /// [`rejects_thinking_form`]): the other form from now on, once. Any other 400, one about
    /// the conversation's thinking blocks or the budget's size included, is left to the
    /// route-neutral handling.
    fn on_http_error(
        &self,
        _cfg: &Config,
        model: &str,
        effort: Option<Effort>,
        status: u16,
        body: &[u8],
        learned: &mut Learned,
    ) -> Option<ErrorReaction> {
        if effort.is_none() || status != 400 || learned.other_thinking_form {
            return None;
        }
        // Not swapped yet: the request carried the form chosen for the model.
        if !rejects_thinking_form(body, takes_adaptive_thinking(model)) {
            return None;
        }
        learned.other_thinking_form = true;
        Some(ErrorReaction::resend(
            "llm: the model rejected this form of extended thinking; sending the other form (adaptive or a token budget) from now on".into(),
        ))
    }

    fn decoder(&self, id_prefix: String) -> Box<dyn StreamDecoder> {
        Box::new(AnthropicDecoder::new(id_prefix))
    }
}

/// Build the streaming `POST {cfg.base_url}/v1/messages` request (SPEC L6).
///
/// * Headers: `content-type: application/json`, `accept: text/event-stream`,
///   `x-api-key: <cfg.api_key>` (only when non-empty), `anthropic-version:
///   <cfg.anthropic_version>`.
/// * Body (compact JSON, keys in this order): `model` (`req.model`); `max_tokens`
///   (`req.max_output_tokens`, tokens); `system` (only when present and non-empty); `messages`
///   (see below); `tools` (`[{"name","description","input_schema"}]`, `description` omitted
///   when empty, the key omitted when there are no tools, e.g. the compaction call); `stream:
///   true`.
///
/// `messages` are the history as alternating `user` / `assistant` turns whose `content` is an
/// array of blocks:
/// * `User { text }` → a `{"type":"text","text"}` block in a user turn;
/// * `ToolResult` → `{"type":"tool_result","tool_use_id","content","is_error"}` in a user
///   turn ([`EMPTY_ERROR_TEXT`] when an error result's text is blank);
/// * `Assistant` → an assistant turn: its reasoning blocks first (`{"type":"thinking",
///   "thinking","signature"}` / `{"type":"redacted_thinking","data"}`, verbatim), then a text
///   block when the text is not blank, then `{"type":"tool_use","id","name","input"}` per call,
///   `input` being the parsed arguments object, `{}` when they are blank, invalid or not an
///   object (C26; the loop already answered such calls with an error result, L2).
///
/// Consecutive messages of the same role are merged into one turn (Anthropic requires the
/// roles to alternate, and every `tool_result` of an assistant turn in the very next user
/// message), so consecutive tool results share one user turn. A user message right after tool
/// results gets a turn of its own, after a short assistant turn [`TOOL_RESULTS_BRIDGE`]
/// (SPEC L10): the tool loop is closed before the user speaks, so a synthetic hook call (which
/// has no thinking block) never becomes the start of the tool loop that extended thinking's
/// rules apply to. An assistant message with nothing to send is skipped (never an empty turn);
/// blank text blocks are never sent; a user turn left without any block gets
/// [`EMPTY_USER_TEXT`].
///
/// Reasoning blocks (SPEC L6, L10, case C39) are replayed unmodified at the start of every
/// assistant turn that called tools, in message order — including a turn where a hook's
/// synthetic `tool_use` joined the model's answer (`[thinking{…, signature}, text, tool_use
/// <server>___Stop]`): that is where Anthropic requires them when thinking is on. In other past
/// turns Anthropic ignores them, so they are not sent. A thinking block without a signature
/// (cut by `max_tokens`, or from a server that signs nothing) is never sent: the API rejects an
/// invalid signature. Reasoning state of other routes is never sent. Without `req.effort` no
/// `thinking` request parameter is set (extended thinking is whatever the model or gateway
/// does by default); with one, `thinking` (and `output_config`) as [`thinking`] says (SPEC L12).
///
/// Prompt caching (SPEC L11; with `req.cache`): `cache_control: {"type":"ephemeral"}`
/// breakpoints, three at most (Anthropic allows four), so that each request reads what the
/// previous one wrote and writes its own end:
/// * the end of the tools and the system prompt, which the cache puts first (tools, then
///   system, then messages): `system` is sent as one text block carrying the breakpoint; without
///   a system prompt the last tool carries it;
/// * the end of the previous request (`req.cache.previous_len`): the last block of the last
///   turn starting at or before its last message, when that is not the last turn. Anthropic
///   looks back at most 20 blocks from a breakpoint for a prefix it wrote, so a round that adds
///   more blocks than that still reads the whole previous request here;
/// * the end of the conversation: the last block of the last turn.
///
/// A breakpoint never goes on a `thinking` or `redacted_thinking` block (the API rejects it).
/// Only where the breakpoints are changes between requests; the blocks themselves are the same
/// bytes, so the prefix the cache keys on is stable (a turn carrying a breakpoint is written
/// for the one request and kept out of the history's cache of serialized turns).
///
/// Linear in the history size (each message is visited once; tool-call arguments are parsed
/// once).
#[cfg(test)]
#[must_use]
pub(crate) fn build_request(cfg: &Config, req: &LlmRequest<'_>) -> HttpRequest {
    build_request_cached(cfg, req, None)
}

/// [`build_request`], reusing and extending `cache`, which holds the serialized turns of
/// `req.messages` as sent by earlier requests of the same history (issue #15). The body is
/// byte for byte the one [`build_request`] builds; its history part is a piece shared with the
/// cache.
#[cfg(test)]
#[must_use]
pub(crate) fn build_request_cached(
    cfg: &Config,
    req: &LlmRequest<'_>,
    cache: Option<&mut BodyCache>,
) -> HttpRequest {
    build_request_with(cfg, req, &Learned::default(), cache)
}

/// [`build_request_cached`] with what the route learned (the form of `thinking`, SPEC L12).
fn build_request_with(
    cfg: &Config,
    req: &LlmRequest<'_>,
    learned: &Learned,
    cache: Option<&mut BodyCache>,
) -> HttpRequest {
    let caching = req.cache.is_some();
    let system = req.system.filter(|s| !s.is_empty());
    let mut head = Vec::with_capacity(256 + system.map_or(0, str::len));
    head.push(b'{');
    write_field(&mut head, "model", req.model);
    write_field(&mut head, "max_tokens", &req.max_output_tokens);
    match system {
        Some(system) if caching => write_field(&mut head, "system", &[CachedText(system)]),
        Some(system) => write_field(&mut head, "system", system),
        None => {}
    }
    head.extend_from_slice(b",\"messages\":[");
    let capacity = if cache.is_none() {
        body_capacity(req, 64)
    } else {
        0
    };
    // The turn holding the end of the previous request's history (SPEC L11).
    let previous_end = req
        .cache
        .and_then(|c| c.previous_len)
        .and_then(|n| n.checked_sub(1));
    let history = history_json(
        req.messages,
        cache.map(|c| (c, CacheKey::Anthropic)),
        capacity,
        previous_end,
        |history, start, last| {
            let mut turns = wire_turns(history, start, last);
            if caching {
                mark_breakpoints(&mut turns, previous_end);
            }
            turns
        },
    );
    let mut tail = Vec::with_capacity(128);
    tail.push(b']');
    if !req.tools.is_empty() {
        let last = req.tools.len() - 1;
        let tools: Vec<WireTool<'_>> = req
            .tools
            .iter()
            .enumerate()
            .map(|(i, tool)| WireTool {
                tool,
                breakpoint: caching && system.is_none() && i == last,
            })
            .collect();
        write_field(&mut tail, "tools", &tools);
    }
    match thinking(req, learned) {
        Some(Thinking::Adaptive(effort)) => {
            write_field(&mut tail, "thinking", &ThinkingParam::adaptive());
            write_field(&mut tail, "output_config", &OutputConfig { effort });
        }
        Some(Thinking::Budget(budget_tokens)) => {
            write_field(
                &mut tail,
                "thinking",
                &ThinkingParam::enabled(budget_tokens),
            );
        }
        None => {}
    }
    write_field(&mut tail, "stream", &true);
    tail.push(b'}');
    let api_key = (!cfg.api_key.is_empty()).then(|| ("x-api-key", cfg.api_key.clone()));
    let mut request = streaming_json_post(
        format!("{}/v1/messages", cfg.base_url.trim_end_matches('/')),
        api_key,
        assemble(head, false, history, &tail),
    );
    request.headers.push((
        "anthropic-version".to_owned(),
        cfg.anthropic_version.clone(),
    ));
    request
}

/// The `thinking` of one request (SPEC L12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thinking {
    /// `{"type":"adaptive"}` with `output_config.effort`.
    Adaptive(&'static str),
    /// `{"type":"enabled","budget_tokens":n}`.
    Budget(u32),
}

/// Anthropic's smallest thinking budget, tokens ("budget_tokens: Input should be greater than
/// or equal to 1024").
const MIN_THINKING_BUDGET: u32 = 1024;

/// The `thinking` parameter of `req` (SPEC L12), `None` when it sends none:
/// * no effort, or a request that continues a tool loop whose assistant message opened
///   without a thinking block (thinking switched on mid-turn, or a turn restored from a
///   provider that did not think): Anthropic requires that message to start with one, so this
///   request goes without, and the next prompt thinks;
/// * a model that takes adaptive thinking (Claude 4.6 and later, [`takes_adaptive_thinking`]):
///   `adaptive` with the effort as `output_config.effort`;
/// * else a token budget below `max_tokens`, at least [`MIN_THINKING_BUDGET`], leaving as
///   much again for the answer: ⅛, ¼, ½ or ¾ of `max_tokens` for `low`, `medium`, `high`,
///   `max`; none when `max_tokens` is under twice the minimum.
///
/// `learned.other_thinking_form` (a 400 named the form) swaps adaptive and budget.
fn thinking(req: &LlmRequest<'_>, learned: &Learned) -> Option<Thinking> {
    let effort = req.effort?;
    if continues_loop_without_thinking(req.messages) {
        return None;
    }
    if takes_adaptive_thinking(req.model) != learned.other_thinking_form {
        return Some(Thinking::Adaptive(effort.as_str()));
    }
    let max = req.max_output_tokens;
    if max < 2 * MIN_THINKING_BUDGET {
        return None;
    }
    let budget = match effort {
        Effort::Low => max / 8,
        Effort::Medium => max / 4,
        Effort::High => max / 2,
        Effort::Max => max / 4 * 3,
    };
    Some(Thinking::Budget(
        budget.clamp(MIN_THINKING_BUDGET, max - MIN_THINKING_BUDGET),
    ))
}

/// Whether the request ends in tool results whose tool loop's first assistant message has no
/// thinking block (the rule of "Extended thinking with tool use"). Walks back from the end
/// over the current turn only.
fn continues_loop_without_thinking(messages: &[Message]) -> bool {
    if !matches!(messages.last(), Some(Message::ToolResult { .. })) {
        return false;
    }
    let start = messages
        .iter()
        .rposition(|m| matches!(m, Message::User { .. }))
        .map_or(0, |i| i + 1);
    let opening = messages[start..]
        .iter()
        .find(|m| matches!(m, Message::Assistant { .. }));
    !matches!(opening, Some(Message::Assistant { reasoning, .. })
        if reasoning.iter().any(|b| matches!(b,
            ReasoningBlock::Thinking { signature, .. } if !signature.is_empty())
            || matches!(b, ReasoningBlock::Redacted { .. })))
}

/// Whether an Anthropic 400 `body` refuses the form of the `thinking` request parameter that
/// was sent (`sent_adaptive`: `{"type":"adaptive"}` with `output_config`, else `{"type":
/// "enabled","budget_tokens"}`), as the API words it (platform.claude.com, "Thinking
/// troubleshooting"):
/// * to `enabled` on an adaptive-only model: `"thinking.type.enabled" is not supported for this
///   model. Use "thinking.type.adaptive" and "output_config.effort" …`;
/// * to `adaptive` on an older model: `adaptive thinking is not supported on this model`, or,
///   from an endpoint that does not know the form, a validation error of `thinking.type` or
///   `output_config` (`thinking.type: Input should be 'enabled' or 'disabled'`, `output_config:
///   Extra inputs are not permitted`).
///
/// Not a form refusal: an error about the conversation (`messages.…`: a thinking block's
/// signature, a tool loop that must open with thinking) or about the budget's size (`max_tokens`
/// must be greater than `thinking.budget_tokens`, a budget under 1,024): the other form would
/// not help.
fn rejects_thinking_form(body: &[u8], sent_adaptive: bool) -> bool {
    let message = super::status::error_message(body).to_ascii_lowercase();
    let message = message.trim_start_matches(['"', '`', '\'', ' ']);
    if message.starts_with("messages")
        || message.contains("max_tokens")
        || message.contains("greater than")
    {
        return false;
    }
    let refuses = [
        "not supported",
        "unsupported",
        "does not support",
        "input should be",
        "extra inputs are not permitted",
    ]
    .iter()
    .any(|r| message.contains(r));
    let refuses_enabled = message.contains("thinking.type.enabled");
    let names_form = if sent_adaptive {
        !refuses_enabled
            && (message.contains("adaptive")
                || message.starts_with("thinking.type")
                || message.starts_with("output_config"))
    } else {
        refuses_enabled || message.contains("budget_tokens")
    };
    refuses && names_form
}

/// Whether `model` takes `thinking: {"type":"adaptive"}` (Anthropic: Claude Opus 4.6, Sonnet
/// 4.6 and later; Opus 4.7 and later take only that): a `claude-<family>-<major>[-<minor>]`
/// name (with or without a vendor prefix or suffix) of version 4.6 or later, or a preview of
/// a family without a version.
#[must_use]
pub(crate) fn takes_adaptive_thinking(model: &str) -> bool {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    let Some(at) = name.find("claude-") else {
        return false;
    };
    let mut parts = name[at + "claude-".len()..].split(['-', '.', '@', ':']);
    // `claude-3-7-sonnet`: the version before the family, Claude 3 and older.
    if parts
        .next()
        .is_none_or(|family| family.parse::<u32>().is_ok())
    {
        return false;
    }
    let number = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
    match number(parts.next()) {
        // A date suffix (`claude-sonnet-4-20250514`) is no minor version.
        Some(major) => {
            let minor = number(parts.next()).filter(|m| *m < 100).unwrap_or(0);
            major > 4 || (major == 4 && minor >= 6)
        }
        None => name.contains("preview"),
    }
}

/// `thinking` as sent (SPEC L12).
#[derive(Serialize)]
struct ThinkingParam {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget_tokens: Option<u32>,
}

impl ThinkingParam {
    fn adaptive() -> Self {
        ThinkingParam {
            kind: "adaptive",
            budget_tokens: None,
        }
    }
    fn enabled(budget: u32) -> Self {
        ThinkingParam {
            kind: "enabled",
            budget_tokens: Some(budget),
        }
    }
}

/// `output_config` as sent with adaptive thinking (SPEC L12).
#[derive(Serialize)]
struct OutputConfig {
    effort: &'static str,
}

/// `cache_control: {"type":"ephemeral"}`, the one kind of breakpoint (SPEC L11).
#[derive(Serialize)]
struct Ephemeral {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: Ephemeral = Ephemeral { kind: "ephemeral" };

/// The system prompt as one text block with a breakpoint (SPEC L11).
struct CachedText<'a>(&'a str);

impl Serialize for CachedText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("type", "text")?;
        map.serialize_entry("text", self.0)?;
        map.serialize_entry("cache_control", &EPHEMERAL)?;
        map.end()
    }
}

/// One role turn of `messages`.
struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
    /// The turn's replayable reasoning blocks, put first in `content` when the turn used tools.
    reasoning: Vec<Block<'a>>,
    /// Its last block carries a breakpoint (SPEC L11; [`mark_breakpoints`]).
    breakpoint: bool,
}

impl Serialize for Turn<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A user turn left without any block gets a placeholder text.
        let placeholder = [Block::Text(EMPTY_USER_TEXT)];
        let content: &[Block<'_>] = if self.content.is_empty() {
            &placeholder
        } else {
            &self.content
        };
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", self.role)?;
        map.serialize_entry(
            "content",
            &Content {
                blocks: content,
                breakpoint: self.breakpoint,
            },
        )?;
        map.end()
    }
}

/// A turn's blocks, the last one with a breakpoint when asked (never a thinking block: the API
/// rejects a `cache_control` there).
struct Content<'b, 'a> {
    blocks: &'b [Block<'a>],
    breakpoint: bool,
}

impl Serialize for Content<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let last = self.blocks.len().saturating_sub(1);
        serializer.collect_seq(self.blocks.iter().enumerate().map(|(i, block)| Marked {
            block,
            breakpoint: self.breakpoint && i == last,
        }))
    }
}

impl WireElement for Turn<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        push_item(out, self);
    }
}

/// Marks the breakpoints of SPEC L11 on `turns` (a plan of the history from some point): the
/// last turn, and the last turn starting at or before `previous_end` (the last message of the
/// previous request) when that is another one. The turns must be the history's from a point
/// at or before `previous_end` (`history_json`'s `keep_fresh` makes sure).
fn mark_breakpoints(turns: &mut [Planned<Turn<'_>>], previous_end: Option<usize>) {
    let previous = previous_end.and_then(|end| turns.iter().rposition(|t| t.source <= end));
    let last = turns.len().checked_sub(1);
    for i in [previous, last].into_iter().flatten() {
        turns[i].element.breakpoint = true;
    }
}

/// One content block of a turn.
enum Block<'a> {
    Text(&'a str),
    /// A `thinking` block replayed verbatim.
    Thinking {
        text: &'a str,
        signature: &'a str,
    },
    /// A `redacted_thinking` block replayed verbatim.
    Redacted(&'a str),
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        id: &'a str,
        text: &'a str,
        is_error: bool,
    },
    /// A block of a [`ReasoningBlock::AnthropicContent`], sent as it came (an object).
    Raw(&'a serde_json::Map<String, Value>),
}

/// A block as sent, with a breakpoint when asked and allowed.
struct Marked<'b, 'a> {
    block: &'b Block<'a>,
    breakpoint: bool,
}

impl Serialize for Marked<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self.block {
            Block::Raw(block) => {
                for (key, value) in *block {
                    if key != "cache_control" {
                        map.serialize_entry(key, value)?;
                    }
                }
            }
            Block::Text(text) => {
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
            }
            Block::Redacted(data) => {
                map.serialize_entry("type", "redacted_thinking")?;
                map.serialize_entry("data", data)?;
            }
            Block::Thinking { text, signature } => {
                map.serialize_entry("type", "thinking")?;
                map.serialize_entry("thinking", text)?;
                map.serialize_entry("signature", signature)?;
            }
            Block::ToolUse { id, name, input } => {
                map.serialize_entry("type", "tool_use")?;
                map.serialize_entry("id", id)?;
                map.serialize_entry("name", name)?;
                map.serialize_entry("input", input)?;
            }
            Block::ToolResult { id, text, is_error } => {
                map.serialize_entry("type", "tool_result")?;
                map.serialize_entry("tool_use_id", id)?;
                let content = if *is_error && text.trim().is_empty() {
                    EMPTY_ERROR_TEXT
                } else {
                    text
                };
                map.serialize_entry("content", content)?;
                map.serialize_entry("is_error", is_error)?;
            }
        }
        let thinking = match self.block {
            Block::Thinking { .. } | Block::Redacted(_) => true,
            Block::Raw(block) => matches!(
                block.get("type").and_then(Value::as_str),
                Some("thinking" | "redacted_thinking")
            ),
            Block::Text(_) | Block::ToolUse { .. } | Block::ToolResult { .. } => false,
        };
        if self.breakpoint && !thinking {
            map.serialize_entry("cache_control", &EPHEMERAL)?;
        }
        map.end()
    }
}

/// `history[start..]` as alternating role turns (see [`build_request`]), `last` being the
/// turn sent before `start`. A turn is finished (empty content filled, reasoning put first)
/// as soon as it is planned: only its own blocks decide that, so a turn's bytes do not depend
/// on what follows it.
fn wire_turns(history: &[Message], start: usize, last: Last) -> Vec<Planned<Turn<'_>>> {
    let mut turns: Vec<Planned<Turn<'_>>> = Vec::new();
    for (i, message) in history.iter().enumerate().skip(start) {
        let prev = turns.last().map_or(last, |t| t.kind);
        let (role, blocks, reasoning) = match message {
            Message::User { text } => {
                // L10: a user text never shares a turn with tool results: a short assistant
                // turn closes the tool loop first, so no thinking rule can apply to it.
                if prev == Last::Tool {
                    turns.push(Planned {
                        element: Turn {
                            role: "assistant",
                            content: vec![Block::Text(TOOL_RESULTS_BRIDGE)],
                            reasoning: Vec::new(),
                            breakpoint: false,
                        },
                        source: i,
                        kind: Last::Bridge,
                        closed: true,
                    });
                }
                let blocks = if text.trim().is_empty() {
                    Vec::new()
                } else {
                    vec![Block::Text(text)]
                };
                ("user", blocks, Vec::new())
            }
            Message::ToolResult {
                call_id,
                name: _,
                text,
                is_error,
            } => (
                "user",
                vec![Block::ToolResult {
                    id: call_id,
                    text,
                    is_error: *is_error,
                }],
                Vec::new(),
            ),
            Message::Assistant {
                reasoning,
                tool_calls,
                ..
            } if verbatim_content(reasoning).is_some() => {
                // L13, C69: the response's own blocks as they came (server tools included),
                // then the calls that joined it later (a hook's, H6).
                let content = verbatim_content(reasoning).unwrap_or_default();
                let mut blocks: Vec<Block<'_>> = content
                    .iter()
                    .filter_map(Value::as_object)
                    .filter(|b| {
                        b.get("type").and_then(Value::as_str) != Some("text")
                            || b.get("text")
                                .and_then(Value::as_str)
                                .is_some_and(|t| !t.trim().is_empty())
                    })
                    .map(Block::Raw)
                    .collect();
                let sent = |id: &str| {
                    content.iter().any(|b| {
                        b.get("type").and_then(Value::as_str) == Some("tool_use")
                            && b.get("id").and_then(Value::as_str) == Some(id)
                    })
                };
                blocks.extend(tool_calls.iter().filter(|c| !sent(&c.id)).map(|call| {
                    Block::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input: input_object(&call.arguments),
                    }
                }));
                if blocks.is_empty() {
                    continue; // never an empty assistant turn
                }
                ("assistant", blocks, Vec::new())
            }
            Message::Assistant {
                text,
                thinking: _,
                reasoning,
                tool_calls,
            } => {
                let mut blocks = Vec::with_capacity(1 + tool_calls.len());
                if !text.trim().is_empty() {
                    blocks.push(Block::Text(text));
                }
                blocks.extend(tool_calls.iter().map(|call| Block::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    input: input_object(&call.arguments),
                }));
                if blocks.is_empty() {
                    continue; // never an empty assistant turn
                }
                // A thinking block without a signature (cut by max_tokens, or from a server
                // that signs nothing) cannot be replayed: the API rejects an invalid signature.
                let replayable = reasoning.iter().filter_map(|r| match r {
                    ReasoningBlock::Thinking { text, signature } if !signature.is_empty() => {
                        Some(Block::Thinking { text, signature })
                    }
                    ReasoningBlock::Redacted { data } => Some(Block::Redacted(data)),
                    ReasoningBlock::Thinking { .. }
                    | ReasoningBlock::ResponsesItem(_)
                    | ReasoningBlock::ChatField(_)
                    | ReasoningBlock::ChatDetails(_)
                    | ReasoningBlock::AnthropicContent(_) => None,
                });
                ("assistant", blocks, replayable.collect())
            }
        };
        // The turn before this message's blocks (the bridge, if one was just added).
        let prev = turns.last().map_or(last, |t| t.kind);
        let same_role = match prev {
            Last::User | Last::Tool => role == "user",
            Last::Assistant | Last::Bridge => role == "assistant",
            Last::Nothing => false,
        };
        match turns.last_mut() {
            Some(last) if same_role => {
                last.element.content.extend(blocks);
                last.element.reasoning.extend(reasoning);
                last.kind = turn_kind(&last.element);
            }
            // A turn in the cache (same role) cannot be extended: unreachable, since planning
            // resumes only where a message started a new turn.
            Some(_) | None => {
                let element = Turn {
                    role,
                    content: blocks,
                    reasoning,
                    breakpoint: false,
                };
                turns.push(Planned {
                    kind: turn_kind(&element),
                    element,
                    source: i,
                    closed: false,
                });
            }
        }
    }
    for turn in &mut turns {
        // L6 / L10: the reasoning of an assistant turn that used tools opens it, verbatim.
        let turn = &mut turn.element;
        let uses_tools = turn
            .content
            .iter()
            .any(|b| matches!(b, Block::ToolUse { .. }));
        let reasoning = std::mem::take(&mut turn.reasoning);
        if uses_tools && !reasoning.is_empty() {
            turn.content.splice(0..0, reasoning);
        }
    }
    turns
}

/// The verbatim content blocks of an Anthropic response, when kept (SPEC L13, case C69).
fn verbatim_content(reasoning: &[ReasoningBlock]) -> Option<&[Value]> {
    reasoning.iter().find_map(|r| match r {
        ReasoningBlock::AnthropicContent(Value::Array(blocks)) => Some(blocks.as_slice()),
        ReasoningBlock::AnthropicContent(_)
        | ReasoningBlock::Thinking { .. }
        | ReasoningBlock::Redacted { .. }
        | ReasoningBlock::ResponsesItem(_)
        | ReasoningBlock::ChatField(_)
        | ReasoningBlock::ChatDetails(_) => None,
    })
}

/// What a planner resuming after `turn` must know: its role, and whether it ends with a tool
/// result (a user text after it needs the bridge turn).
fn turn_kind(turn: &Turn<'_>) -> Last {
    match (turn.role, turn.content.last()) {
        ("assistant", _) => Last::Assistant,
        (_, Some(Block::ToolResult { .. })) => Last::Tool,
        _ => Last::User,
    }
}

/// Tool-call arguments as the `input` object: `{}` when blank, invalid or not an object.
fn input_object(arguments: &str) -> Value {
    match parse_lossy(arguments) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) | Err(_) => Value::Object(serde_json::Map::new()),
    }
}

/// One offered tool: `{"name","description","input_schema"}`.
///
/// `breakpoint`: the last tool when there is no system prompt to carry the first breakpoint
/// (SPEC L11).
struct WireTool<'a> {
    tool: &'a ToolDef,
    breakpoint: bool,
}

impl Serialize for WireTool<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", &self.tool.name)?;
        if !self.tool.description.is_empty() {
            map.serialize_entry("description", &self.tool.description)?;
        }
        map.serialize_entry("input_schema", &self.tool.input_schema)?;
        if self.breakpoint {
            map.serialize_entry("cache_control", &EPHEMERAL)?;
        }
        map.end()
    }
}

/// Decoder of one streamed Messages body (SPEC L6, L9; cases C24, C26).
///
/// * Each SSE event's `data:` is a JSON object (parsed with [`parse_lossy`], so lone
///   surrogates become U+FFFD) whose `type` names the event (the SSE `event:` name is the
///   fallback). Unknown event and block types, `ping` and unknown fields are ignored.
/// * `message_start`: `message.usage` gives the input tokens (`input_tokens` +
///   `cache_creation_input_tokens` + `cache_read_input_tokens`, tokens; the two cache counts
///   are kept apart too, as the cache write and read of [`Usage`]).
/// * `content_block_start` opens block `index`: `text` (initial text, if any, is streamed),
///   `thinking` (initial `thinking` / `signature` kept), `redacted_thinking` (`data` kept),
///   `tool_use` (`id`, `name` and `input` kept).
/// * `content_block_delta`: `text_delta` → [`StreamDelta::Text`]; `thinking_delta` →
///   [`StreamDelta::Thought`]; `signature_delta` appended to the block's signature;
///   `input_json_delta` `partial_json` appended to the block's arguments. A delta for a block
///   that was never started opens one of the matching kind.
/// * `message_delta`: `delta.stop_reason`, `delta.stop_details` (a refusal's explanation and
///   category) and `usage` (`output_tokens`, cumulative; input fields when present). `message_stop` completes the stream; later bytes are ignored.
/// * `error` (`{"type":"error","error":{"type","message"}}`) → [`StreamError::Provider`],
///   retryable unless its type is `invalid_request_error`, `authentication_error`,
///   `permission_error`, `not_found_error`, `request_too_large` or `billing_error`; a complete
///   event whose data is not JSON is a retryable provider error too. Errors are sticky.
///
/// Stop reasons: `end_turn`, `stop_sequence` and unknown ones → end turn; `tool_use` → tool
/// use; `max_tokens` → max tokens; `model_context_window_exceeded` → context full; `refusal` → refusal;
/// `pause_turn` (a gateway's or the API's server tools paused a long turn) → pause, a tool use
/// if calls of the agent's own tools came with it. An end turn with tool calls is tool use, a
/// tool use without calls is end turn (as for Chat Completions, C23).
///
/// A response holding a block the agent does not model (server tools: `server_tool_use`,
/// `web_search_tool_result`, …) also keeps its whole content verbatim
/// ([`ReasoningBlock::AnthropicContent`]), so the assistant turn goes back as it came
/// (SPEC L13, case C69).
///
/// Tool calls come out in block order: a block whose accumulated `partial_json` is blank uses the
/// `input` of its `content_block_start` as JSON text (C26: no deltas for a parameterless tool);
/// a nameless block is dropped; a missing or duplicate id becomes `{id_prefix}_{index}`. Thinking
/// and redacted-thinking blocks become [`ReasoningBlock`]s in block order, and all thinking text
/// is concatenated in `thinking`.
pub(crate) struct AnthropicDecoder {
    /// Prefix of synthesised call ids: `{id_prefix}_{index}`.
    id_prefix: String,
    /// Parser, sticky error, response taken.
    sse: SseState,
    /// Text and reasoning so far.
    streamed: StreamedText,
    /// Content blocks by stream `index`.
    blocks: BTreeMap<u64, BlockSlot>,
    /// Input token counts as last reported: plain, cache creation, cache read.
    input_tokens: [Option<u64>; 3],
    output_tokens: Option<u64>,
    /// The last `stop_reason`, mapped.
    stop_reason: Option<StopKind>,
    /// `stop_details` as text (see [`stop_details_text`]).
    stop_details: Option<String>,
    /// `message_stop` was seen.
    done: bool,
}

/// A Messages stream event as the decoder reads it: the fields it looks at, typed, their
/// strings borrowed from the payload (SPEC L6, L9). Unknown fields (`id`, `model`, a block's
/// `cache_control`, …) are skipped without being built; the few kept as JSON (`input`,
/// `citations`, `citation`, `stop_details`) are parsed into a `Value` only when present.
///
/// The common event is parsed straight into it (serde derive over the payload text). An event
/// it cannot take as it is — a field of another type than the view's (a number as `text`, a
/// float `index`, an object as `message` that is not one), a duplicate key, a lone surrogate
/// escape, not an object — goes the general way: parsed into a `Value` with `parse_lossy` and
/// read into the same view with the general path's looser rules ([`EventView::of`]: a field
/// of another type counts as absent). So do the events that need more than the view:
/// `error` events and the start of a block the agent does not model (kept whole, as JSON).
/// One handler ([`AnthropicDecoder::handle`]) decides for both.
#[derive(serde::Deserialize)]
struct EventView<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<JsonStr<'a>>,
    /// Absent counts as 0.
    index: Option<u64>,
    /// A `content_block_delta`'s or a `message_delta`'s `delta`.
    #[serde(borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(borrow)]
    content_block: Option<BlockView<'a>>,
    /// `message_start`'s `message` (only its `usage` is read).
    message: Option<MessageView>,
    /// `message_delta`'s `usage`.
    usage: Option<UsageView>,
    /// `message_delta`'s `stop_details` where some servers put it (outside `delta`).
    #[serde(default, deserialize_with = "present")]
    stop_details: Option<Cow<'a, Value>>,
}

/// An event's `delta`: the fields of every delta type (`text_delta`, `thinking_delta`,
/// `signature_delta`, `input_json_delta`, `citations_delta`) and of `message_delta`'s.
#[derive(serde::Deserialize)]
struct DeltaView<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<JsonStr<'a>>,
    #[serde(borrow)]
    text: Option<JsonStr<'a>>,
    #[serde(borrow)]
    thinking: Option<JsonStr<'a>>,
    #[serde(borrow)]
    signature: Option<JsonStr<'a>>,
    #[serde(borrow)]
    partial_json: Option<JsonStr<'a>>,
    /// Present, `null` included: kept as it came (SPEC L13).
    #[serde(default, deserialize_with = "present")]
    citation: Option<Cow<'a, Value>>,
    #[serde(borrow)]
    stop_reason: Option<JsonStr<'a>>,
    /// Present, `null` included (a `null` here hides one outside `delta`).
    #[serde(default, deserialize_with = "present")]
    stop_details: Option<Cow<'a, Value>>,
}

/// A `content_block_start`'s `content_block`, for the block types the agent models.
#[derive(serde::Deserialize, Default)]
struct BlockView<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<JsonStr<'a>>,
    #[serde(borrow)]
    text: Option<JsonStr<'a>>,
    #[serde(borrow)]
    thinking: Option<JsonStr<'a>>,
    #[serde(borrow)]
    signature: Option<JsonStr<'a>>,
    #[serde(borrow)]
    data: Option<JsonStr<'a>>,
    #[serde(borrow)]
    id: Option<JsonStr<'a>>,
    #[serde(borrow)]
    name: Option<JsonStr<'a>>,
    /// A `tool_use` block's `input` (C26: used when no argument text streams).
    input: Option<Cow<'a, Value>>,
    /// A text block's `citations`.
    citations: Option<Cow<'a, [Value]>>,
}

/// `message_start`'s `message`.
#[derive(serde::Deserialize)]
struct MessageView {
    usage: Option<UsageView>,
}

/// A `usage` object's token counts.
#[derive(serde::Deserialize)]
struct UsageView {
    input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl<'a> EventView<'a> {
    /// The general path's reading of an event: a field of another type than the view's counts
    /// as absent (an object that is not one has no fields).
    fn of(value: &'a Value) -> Self {
        let borrowed = |v: Option<&'a Value>| v.map(Cow::Borrowed);
        EventView {
            kind: JsonStr::of(value.get("type")),
            index: value.get("index").and_then(Value::as_u64),
            delta: value.get("delta").map(|delta| DeltaView {
                kind: JsonStr::of(delta.get("type")),
                text: JsonStr::of(delta.get("text")),
                thinking: JsonStr::of(delta.get("thinking")),
                signature: JsonStr::of(delta.get("signature")),
                partial_json: JsonStr::of(delta.get("partial_json")),
                citation: borrowed(delta.get("citation")),
                stop_reason: JsonStr::of(delta.get("stop_reason")),
                stop_details: borrowed(delta.get("stop_details")),
            }),
            content_block: value.get("content_block").map(|block| BlockView {
                kind: JsonStr::of(block.get("type")),
                text: JsonStr::of(block.get("text")),
                thinking: JsonStr::of(block.get("thinking")),
                signature: JsonStr::of(block.get("signature")),
                data: JsonStr::of(block.get("data")),
                id: JsonStr::of(block.get("id")),
                name: JsonStr::of(block.get("name")),
                input: borrowed(block.get("input")),
                citations: block
                    .get("citations")
                    .and_then(Value::as_array)
                    .map(|c| Cow::Borrowed(c.as_slice())),
            }),
            message: value.get("message").map(|message| MessageView {
                usage: message.get("usage").map(UsageView::of),
            }),
            usage: value.get("usage").map(UsageView::of),
            stop_details: borrowed(value.get("stop_details")),
        }
    }

    /// Whether an event of type `kind` read through the view is decided by it alone: not an
    /// `error` (its message is read from the whole event) nor the start of a block the agent
    /// does not model (kept whole).
    fn decodes_alone(&self, kind: &str) -> bool {
        match kind {
            "error" => false,
            "content_block_start" => matches!(
                self.content_block.as_ref().and_then(|b| b.kind.as_deref()),
                Some("text" | "thinking" | "redacted_thinking" | "tool_use")
            ),
            _ => true,
        }
    }
}

impl UsageView {
    /// The general path's reading of a `usage` object (a count that is not a `u64` is absent).
    fn of(usage: &Value) -> Self {
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        UsageView {
            input_tokens: count("input_tokens"),
            cache_creation_input_tokens: count("cache_creation_input_tokens"),
            cache_read_input_tokens: count("cache_read_input_tokens"),
            output_tokens: count("output_tokens"),
        }
    }
}

/// One content block being assembled.
enum BlockSlot {
    /// A text block: its text and the citations its `citations_delta`s (or its start) gave.
    Text {
        text: String,
        citations: Vec<Value>,
    },
    Thinking {
        text: String,
        signature: String,
    },
    Redacted {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// `content_block_start`'s `input` (used when no argument text was streamed, C26).
        start_input: Option<Value>,
        json: String,
    },
    /// A block type the agent does not model (`server_tool_use`, `web_search_tool_result`,
    /// `mcp_tool_use`, …): its `content_block_start` object, and the `partial_json` streamed
    /// for its `input` (server tool calls stream their input as client ones do).
    Other {
        block: Value,
        json: String,
    },
}

impl std::fmt::Debug for AnthropicDecoder {
    // Lengths, not contents (DESIGN habits).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AnthropicDecoder(text {} B, thinking {} B, {} blocks, stop {:?}, done {})",
            self.streamed.text.len(),
            self.streamed.thinking.len(),
            self.blocks.len(),
            self.stop_reason,
            self.done
        )
    }
}

impl AnthropicDecoder {
    /// A decoder for one response; `id_prefix` names tool calls that arrive without an id
    /// (`{id_prefix}_{index}`), so it should be unique per LLM call (e.g. `call_7`).
    #[must_use]
    pub(crate) fn new(id_prefix: String) -> Self {
        AnthropicDecoder {
            id_prefix,
            sse: SseState::new(),
            streamed: StreamedText::default(),
            blocks: BTreeMap::new(),
            input_tokens: [None; 3],
            output_tokens: None,
            stop_reason: None,
            stop_details: None,
            done: false,
        }
    }

    /// Token counts from a `usage` object; absent fields keep their last value.
    fn read_usage(&mut self, usage: &UsageView) {
        let counts = [
            usage.input_tokens,
            usage.cache_creation_input_tokens,
            usage.cache_read_input_tokens,
        ];
        for (slot, count) in self.input_tokens.iter_mut().zip(counts) {
            if count.is_some() {
                *slot = count;
            }
        }
        if usage.output_tokens.is_some() {
            self.output_tokens = usage.output_tokens;
        }
    }

    /// A `content_block_start`. A block type the agent does not model is kept whole from the
    /// event's `Value` (`raw`, the general path's: the view refuses such a start, see
    /// [`EventView::decodes_alone`]).
    fn start_block(
        &mut self,
        event: &EventView<'_>,
        raw: Option<&Value>,
        out: &mut Vec<StreamDelta>,
    ) {
        let index = event.index.unwrap_or(0);
        let absent = BlockView::default();
        let block = event.content_block.as_ref().unwrap_or(&absent);
        let field = |text: &Option<JsonStr<'_>>| str_or_empty(text).to_owned();
        let slot = match str_or_empty(&block.kind) {
            "text" => {
                let text = field(&block.text);
                self.streamed.push_text(&text, out);
                let citations = block.citations.as_deref().map(<[Value]>::to_vec);
                BlockSlot::Text {
                    text,
                    citations: citations.unwrap_or_default(),
                }
            }
            "thinking" => {
                let text = field(&block.thinking);
                self.streamed.push_thought(&text, out);
                BlockSlot::Thinking {
                    text,
                    signature: field(&block.signature),
                }
            }
            "redacted_thinking" => BlockSlot::Redacted {
                data: field(&block.data),
            },
            "tool_use" => BlockSlot::ToolUse {
                id: field(&block.id),
                name: field(&block.name),
                start_input: block.input.as_deref().filter(|v| !v.is_null()).cloned(),
                json: String::new(),
            },
            _ => BlockSlot::Other {
                block: raw
                    .and_then(|v| v.get("content_block"))
                    .cloned()
                    .unwrap_or(Value::Null),
                json: String::new(),
            },
        };
        self.blocks.insert(index, slot);
    }

    fn block_delta(&mut self, event: &EventView<'_>, out: &mut Vec<StreamDelta>) {
        let index = event.index.unwrap_or(0);
        let Some(delta) = &event.delta else {
            return;
        };
        match str_or_empty(&delta.kind) {
            "text_delta" => {
                let piece = str_or_empty(&delta.text);
                if let BlockSlot::Text { text, .. } = self.text_slot(index) {
                    text.push_str(piece);
                }
                self.streamed.push_text(piece, out);
            }
            "citations_delta" => {
                if let (BlockSlot::Text { citations, .. }, Some(citation)) =
                    (self.text_slot(index), &delta.citation)
                {
                    citations.push(citation.clone().into_owned());
                }
            }
            "thinking_delta" => {
                let thought = str_or_empty(&delta.thinking);
                if let BlockSlot::Thinking { text, .. } = self.thinking_slot(index) {
                    text.push_str(thought);
                }
                self.streamed.push_thought(thought, out);
            }
            "signature_delta" => {
                if let BlockSlot::Thinking { signature, .. } = self.thinking_slot(index) {
                    signature.push_str(str_or_empty(&delta.signature));
                }
            }
            "input_json_delta" => {
                let slot = self
                    .blocks
                    .entry(index)
                    .or_insert_with(|| BlockSlot::ToolUse {
                        id: String::new(),
                        name: String::new(),
                        start_input: None,
                        json: String::new(),
                    });
                if let BlockSlot::ToolUse { json, .. } | BlockSlot::Other { json, .. } = slot {
                    json.push_str(str_or_empty(&delta.partial_json));
                }
            }
            // Delta types added later.
            _ => {}
        }
    }

    /// One event of type `kind`, read into `event`; `raw` is its `Value` on the general path
    /// (what an error and a block the agent does not model are read from).
    fn handle(
        &mut self,
        kind: &str,
        event: &EventView<'_>,
        raw: Option<&Value>,
        out: &mut Vec<StreamDelta>,
    ) -> Result<(), StreamError> {
        match kind {
            "message_start" => {
                if let Some(usage) = event.message.as_ref().and_then(|m| m.usage.as_ref()) {
                    self.read_usage(usage);
                }
            }
            "content_block_start" => self.start_block(event, raw, out),
            "content_block_delta" => self.block_delta(event, out),
            "message_delta" => {
                let delta = event.delta.as_ref();
                if let Some(reason) = delta
                    .and_then(|d| d.stop_reason.as_deref())
                    .filter(|r| !r.is_empty())
                {
                    self.stop_reason = Some(stop_kind(reason));
                }
                if let Some(details) = delta
                    .and_then(|d| d.stop_details.as_deref())
                    .or(event.stop_details.as_deref())
                    .and_then(stop_details_text)
                {
                    self.stop_details = Some(details);
                }
                if let Some(usage) = &event.usage {
                    self.read_usage(usage);
                }
            }
            "message_stop" => self.done = true,
            "error" => return Err(provider_error(raw.unwrap_or(&Value::Null))),
            // `content_block_stop`, `ping` and event types added later carry nothing we need.
            _ => {}
        }
        Ok(())
    }

    /// The text block at `index`, opened if the stream skipped its start.
    fn text_slot(&mut self, index: u64) -> &mut BlockSlot {
        self.blocks.entry(index).or_insert_with(|| BlockSlot::Text {
            text: String::new(),
            citations: Vec::new(),
        })
    }

    /// The thinking block at `index`, opened if the stream skipped its start.
    fn thinking_slot(&mut self, index: u64) -> &mut BlockSlot {
        self.blocks
            .entry(index)
            .or_insert_with(|| BlockSlot::Thinking {
                text: String::new(),
                signature: String::new(),
            })
    }

    /// Reasoning blocks and tool calls in block order (ids present and unique). When a block
    /// the agent does not model was streamed (a server tool's), the whole content comes last
    /// as one [`ReasoningBlock::AnthropicContent`], verbatim but for the repairs the request
    /// rules need: empty text and unsigned thinking blocks left out, tool ids as synthesised,
    /// an `input` that is not an object sent as `{}` (SPEC L13, case C69).
    fn take_blocks(&mut self) -> (Vec<ReasoningBlock>, Vec<ToolCall>) {
        let blocks = std::mem::take(&mut self.blocks);
        let verbatim = blocks
            .values()
            .any(|b| matches!(b, BlockSlot::Other { .. }));
        let mut content = Vec::new();
        let mut reasoning = Vec::new();
        let mut calls = Vec::new();
        let mut ids = CallIds::new(&self.id_prefix);
        for (index, slot) in blocks {
            match slot {
                BlockSlot::Thinking { text, signature } => {
                    if verbatim && !signature.is_empty() {
                        content.push(
                            json!({"type": "thinking", "thinking": text, "signature": signature}),
                        );
                    }
                    if !text.is_empty() || !signature.is_empty() {
                        reasoning.push(ReasoningBlock::Thinking { text, signature });
                    }
                }
                BlockSlot::Redacted { data } => {
                    if verbatim {
                        content.push(json!({"type": "redacted_thinking", "data": data}));
                    }
                    reasoning.push(ReasoningBlock::Redacted { data });
                }
                BlockSlot::ToolUse {
                    id,
                    name,
                    start_input,
                    json,
                } => {
                    if name.is_empty() {
                        continue;
                    }
                    let id = ids.unique(id, index);
                    let arguments = match start_input {
                        Some(input) if json.trim().is_empty() => input.to_string(),
                        Some(_) | None => json,
                    };
                    if verbatim {
                        let input = input_object(&arguments);
                        content.push(
                            json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                        );
                    }
                    calls.push(ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
                BlockSlot::Text { text, citations } => {
                    if verbatim && !text.is_empty() {
                        let mut block = json!({"type": "text", "text": text});
                        if !citations.is_empty() {
                            block["citations"] = Value::Array(citations);
                        }
                        content.push(block);
                    }
                }
                BlockSlot::Other { mut block, json } => {
                    if let Value::Object(map) = &mut block {
                        if !json.trim().is_empty() {
                            map.insert("input".to_owned(), input_object(&json));
                        }
                        content.push(block);
                    }
                }
            }
        }
        if verbatim && !content.is_empty() {
            reasoning.push(ReasoningBlock::AnthropicContent(Value::Array(content)));
        }
        (reasoning, calls)
    }

    fn usage(&self) -> Option<Usage> {
        let [plain, creation, read] = self.input_tokens;
        if plain.is_none() && creation.is_none() && read.is_none() && self.output_tokens.is_none() {
            return None;
        }
        let input = [plain, creation, read]
            .iter()
            .map(|n| n.unwrap_or(0))
            .fold(0u64, u64::saturating_add);
        Some(Usage {
            input_tokens: input,
            output_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: read,
            cache_write_tokens: creation,
        })
    }
}

impl EventHandler for AnthropicDecoder {
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
        if data.is_empty() {
            return Ok(());
        }
        let sse_name = event.event.as_deref().unwrap_or("");
        let is_error_event = sse_name == "error";
        // The common event is read through the view; one it refuses (see `EventView`) goes the
        // general way below, into the same view, and is decided by the same `handle`.
        if let Some(view) = read_view::<EventView<'_>>(data, is_error_event) {
            let kind = view.kind.as_deref().unwrap_or(sse_name);
            if view.decodes_alone(kind) {
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

    /// True after `message_stop`.
    fn is_done(&self) -> bool {
        self.done
    }

    /// Whole only after `message_stop`.
    fn check_complete(&self) -> Result<(), StreamError> {
        if self.done {
            Ok(())
        } else {
            Err(StreamError::Truncated(
                "stream ended before message_stop".to_owned(),
            ))
        }
    }

    /// The response once the body ended: only after `message_stop` (otherwise
    /// [`StreamError::Truncated`], even with a stop reason or partial text, C24). With
    /// `max_tokens` the (possibly cut) tool calls are kept: the loop does not run them (L1).
    fn take_response(&mut self) -> Result<LlmResponse, StreamError> {
        let (reasoning, tool_calls) = self.take_blocks();
        let stop = match self.stop_reason.take() {
            Some(StopKind::EndTurn | StopKind::ToolUse) | None if tool_calls.is_empty() => {
                StopKind::EndTurn
            }
            Some(StopKind::EndTurn | StopKind::ToolUse) | None => StopKind::ToolUse,
            // A pause with calls of the agent's tools does not happen (only server tools
            // pause); if one comes, the calls are run as for a tool use.
            Some(StopKind::Pause) if tool_calls.is_empty() => StopKind::Pause,
            Some(StopKind::Pause) => StopKind::ToolUse,
            Some(stop @ (StopKind::MaxTokens | StopKind::ContextFull | StopKind::Refusal)) => stop,
        };
        let usage = self.usage();
        let mut response = self
            .streamed
            .take_response(reasoning, tool_calls, stop, usage);
        response.stop_details = self.stop_details.take();
        Ok(response)
    }
}

/// A `stop_details` object (`{"type":"refusal","category","explanation"}`, both nullable) as
/// the text the client is shown: the explanation, then `(category: …)`; `None`
/// when it has neither (SPEC L13, case C77).
fn stop_details_text(details: &Value) -> Option<String> {
    let field = |key: &str| {
        details
            .get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
    };
    match (field("explanation"), field("category")) {
        (Some(explanation), Some(category)) => {
            Some(format!("{explanation} (category: {category})"))
        }
        (Some(explanation), None) => Some(explanation.to_owned()),
        (None, Some(category)) => Some(format!("category: {category}")),
        (None, None) => None,
    }
}

/// `stop_reason` → [`StopKind`] (SPEC L6, L13; docs/dialects.md, stop reasons; unknown
/// reasons → end turn).
fn stop_kind(reason: &str) -> StopKind {
    match reason {
        "tool_use" => StopKind::ToolUse,
        "max_tokens" => StopKind::MaxTokens,
        "model_context_window_exceeded" => StopKind::ContextFull,
        "refusal" => StopKind::Refusal,
        "pause_turn" => StopKind::Pause,
        // "end_turn", "stop_sequence" and reasons added later.
        _ => StopKind::EndTurn,
    }
}

/// An `error` event as a provider error: `"<message> (<type>)"`.
fn provider_error(value: &Value) -> StreamError {
    let error = value.get("error").unwrap_or(value);
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map_or_else(|| error.to_string(), str::to_owned);
    let retryable = !matches!(
        kind,
        "invalid_request_error"
            | "authentication_error"
            | "permission_error"
            | "not_found_error"
            | "request_too_large"
            | "billing_error"
    );
    let message = if kind.is_empty() || kind == "error" {
        message
    } else {
        format!("{message} ({kind})")
    };
    StreamError::Provider { message, retryable }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;
    use serde_json::json;

    // ---------------------------------------------------------------- recorded streams
    // Shapes as documented for the Messages streaming API (message_start … message_stop).

    const PLAIN_TEXT: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", héllo 🐝!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

"#;

    const THINKING_TOOL_USE: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_02","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":100,"cache_read_input_tokens":28,"output_tokens":2}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants "}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"the weather."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4a"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"Let me check."}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: content_block_start
data: {"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_01A","name":"weather__get","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"ncisco\", \"unit\": \"°C\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":3}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

"#;

    /// Case C26, verbatim: a parameterless tool with no `input_json_delta` at all.
    const C26: &str = r#"event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_time","input":{}}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}

event: message_stop
data: {"type":"message_stop"}

"#;

    const OVERLOADED: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_03","type":"message","role":"assistant","content":[],"usage":{"input_tokens":10,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Partial"}}

event: error
data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

"#;

    // ---------------------------------------------------------------- harness

    use crate::llm::decoder_tests::{Outcome, call, ok};

    fn make() -> Box<dyn StreamDecoder> {
        Box::new(AnthropicDecoder::new("call_t1".to_owned()))
    }

    fn run_chunks(chunks: &[&[u8]]) -> Outcome {
        crate::llm::decoder_tests::run_chunks(make(), chunks)
    }

    fn decode_every_split(body: &str) -> Outcome {
        crate::llm::decoder_tests::decode_every_split(&make, body)
    }

    #[test]
    fn c52_an_endless_line_in_an_anthropic_stream_is_cut_off_at_16_mib() {
        crate::llm::decoder_tests::assert_endless_line_is_cut_off(&make);
    }

    #[test]
    fn c36_invalid_utf8_in_an_anthropic_stream_is_decoded_lossily() {
        let outcome =
            crate::llm::decoder_tests::assert_invalid_utf8_is_decoded_lossily(&make, PLAIN_TEXT);
        assert_eq!(ok(&outcome).text, "Hello, h\u{FFFD}llo \u{1F41D}!");
    }

    fn thinking(text: &str, signature: &str) -> ReasoningBlock {
        ReasoningBlock::Thinking {
            text: text.to_owned(),
            signature: signature.to_owned(),
        }
    }

    fn redacted(data: &str) -> ReasoningBlock {
        ReasoningBlock::Redacted {
            data: data.to_owned(),
        }
    }

    fn user(text: &str) -> Message {
        Message::User {
            text: text.to_owned(),
        }
    }

    fn assistant(text: &str, reasoning: Vec<ReasoningBlock>, tool_calls: Vec<ToolCall>) -> Message {
        Message::Assistant {
            text: text.to_owned(),
            thinking: reasoning
                .iter()
                .map(|r| match r {
                    ReasoningBlock::Thinking { text, .. } => text.as_str(),
                    ReasoningBlock::Redacted { .. }
                    | ReasoningBlock::ResponsesItem(_)
                    | ReasoningBlock::ChatField(_)
                    | ReasoningBlock::ChatDetails(_)
                    | ReasoningBlock::AnthropicContent(_) => "",
                })
                .collect(),
            reasoning,
            tool_calls,
        }
    }

    fn result(call_id: &str, text: &str, is_error: bool) -> Message {
        Message::ToolResult {
            call_id: call_id.to_owned(),
            name: "n".to_owned(),
            text: text.to_owned(),
            is_error,
        }
    }

    fn cfg() -> Config {
        Config::for_tests(ProviderKind::Anthropic, "http://127.0.0.1:5000/")
    }

    fn request_body(messages: &[Message], tools: &[ToolDef], system: Option<&str>) -> Value {
        let req = LlmRequest {
            system,
            tools,
            ..LlmRequest::for_tests("claude-x", messages)
        };
        serde_json::from_slice(&build_request(&cfg(), &req).body.to_vec()).unwrap()
    }

    // ---------------------------------------------------------------- decoder tests

    #[test]
    fn l6_plain_text_reply_streams_text_deltas_and_ends_the_turn_at_every_split() {
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
                    input_tokens: 25,
                    output_tokens: 15,
                    ..Usage::default()
                }),
                stop_details: None,
            }
        );
    }

    #[test]
    fn l6_thinking_signature_redacted_text_and_tool_use_are_captured_at_every_split() {
        let outcome = decode_every_split(THINKING_TOOL_USE);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Thought("The user wants ".into()),
                StreamDelta::Thought("the weather.".into()),
                StreamDelta::Text("Let me check.".into()),
            ]
        );
        assert_eq!(
            ok(&outcome),
            &LlmResponse {
                text: "Let me check.".into(),
                thinking: "The user wants the weather.".into(),
                reasoning: vec![
                    thinking(
                        "The user wants the weather.",
                        "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"
                    ),
                    redacted("EmwKAhgBEgy3va3pzix/LafPsn4a"),
                ],
                tool_calls: vec![call(
                    "toolu_01A",
                    "weather__get",
                    "{\"location\": \"San Francisco\", \"unit\": \"°C\"}"
                )],
                stop: StopKind::ToolUse,
                // 472 + 100 cache creation + 28 cache read, the cache counts kept apart.
                usage: Some(Usage {
                    input_tokens: 600,
                    output_tokens: 89,
                    cache_read_tokens: Some(28),
                    cache_write_tokens: Some(100),
                }),
                stop_details: None,
            }
        );
    }

    #[test]
    fn l6_thinking_blocks_are_replayed_verbatim_before_text_and_tool_use() {
        let response = ok(&decode_every_split(THINKING_TOOL_USE)).clone();
        let messages = vec![
            user("weather?"),
            Message::Assistant {
                text: response.text,
                thinking: response.thinking,
                reasoning: response.reasoning,
                tool_calls: response.tool_calls,
            },
            result("toolu_01A", "18 °C", false),
        ];
        assert_eq!(
            request_body(&messages, &[], None)["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "The user wants the weather.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_01A", "name": "weather__get", "input": {"location": "San Francisco", "unit": "°C"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "18 °C", "is_error": false}
                ]}
            ])
        );
    }

    #[test]
    fn c26_tool_use_without_input_json_delta_takes_the_input_from_block_start() {
        let outcome = decode_every_split(C26);
        let response = ok(&outcome);
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(response.tool_calls, vec![call("toolu_1", "get_time", "{}")]);
        assert_eq!(
            response.usage,
            Some(Usage {
                input_tokens: 0,
                output_tokens: 12,
                ..Usage::default()
            })
        );
        // A non-empty start input is kept as its JSON text.
        let with_input = C26.replace("\"input\":{}", "\"input\":{\"tz\":\"UTC\"}");
        assert_eq!(
            ok(&decode_every_split(&with_input)).tool_calls,
            vec![call("toolu_1", "get_time", "{\"tz\":\"UTC\"}")]
        );
        // No input at all: blank arguments, which the loop reads as `{}`.
        let no_input = C26.replace(",\"input\":{}", "");
        assert_eq!(
            ok(&decode_every_split(&no_input)).tool_calls,
            vec![call("toolu_1", "get_time", "")]
        );
    }

    #[test]
    fn l6_overloaded_error_mid_stream_is_a_retryable_provider_error_and_sticks() {
        let outcome = decode_every_split(OVERLOADED);
        assert_eq!(
            outcome.result,
            Err(StreamError::Provider {
                message: "Overloaded (overloaded_error)".into(),
                retryable: true
            })
        );
        assert_eq!(outcome.deltas, vec![StreamDelta::Text("Partial".into())]);
        assert!(!outcome.complete);

        let mut decoder = AnthropicDecoder::new("c".into());
        let mut out = Vec::new();
        assert!(decoder.feed(OVERLOADED.as_bytes(), &mut out).is_err());
        assert!(
            decoder
                .feed(
                    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                    &mut out
                )
                .is_err()
        );
        assert!(decoder.finish(&mut out).is_err());
    }

    #[test]
    fn l6_error_types_decide_retryability() {
        let event = |kind: &str| {
            format!(
                "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\",\"message\":\"m\"}}}}\n\n"
            )
        };
        for kind in [
            "overloaded_error",
            "api_error",
            "rate_limit_error",
            "timeout_error",
        ] {
            assert_eq!(
                decode_every_split(&event(kind))
                    .result
                    .map_err(|e| e.is_retryable()),
                Err(true),
                "{kind}"
            );
        }
        for kind in [
            "invalid_request_error",
            "authentication_error",
            "request_too_large",
        ] {
            assert_eq!(
                decode_every_split(&event(kind))
                    .result
                    .map_err(|e| e.is_retryable()),
                Err(false),
                "{kind}"
            );
        }
        // Non-JSON data in an error event, and a malformed complete event.
        assert_eq!(
            decode_every_split("event: error\ndata: upstream exploded\n\n").result,
            Err(StreamError::Provider {
                message: "upstream exploded".into(),
                retryable: true
            })
        );
        assert!(matches!(
            decode_every_split("event: content_block_delta\ndata: {oops}\n\n").result,
            Err(StreamError::Provider {
                retryable: true,
                ..
            })
        ));
    }

    #[test]
    fn c24_stream_cut_before_message_stop_is_truncated() {
        let cut = PLAIN_TEXT
            .find("event: message_stop")
            .map(|at| &PLAIN_TEXT[..at])
            .unwrap();
        let outcome = decode_every_split(cut);
        assert!(matches!(outcome.result, Err(StreamError::Truncated(_))));
        assert!(!outcome.complete);
        assert_eq!(outcome.deltas.len(), 2);
        // Cut inside an event, and inside the tool's argument JSON.
        let in_arguments = THINKING_TOOL_USE.find("ncisco").unwrap();
        for body in [
            &PLAIN_TEXT[..PLAIN_TEXT.len() - 10],
            &THINKING_TOOL_USE[..in_arguments],
        ] {
            assert!(matches!(
                decode_every_split(body).result,
                Err(StreamError::Truncated(_))
            ));
        }
        // The message_stop event without its closing blank line still completes the stream.
        let unterminated = PLAIN_TEXT.trim_end();
        assert_eq!(
            ok(&decode_every_split(unterminated)).stop,
            StopKind::EndTurn
        );
        assert!(matches!(
            decode_every_split("").result,
            Err(StreamError::Truncated(_))
        ));
    }

    #[test]
    fn l6_bytes_after_message_stop_are_ignored() {
        let body = format!(
            "{PLAIN_TEXT}event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"late\"}}}}\n\ngarbage"
        );
        let outcome = decode_every_split(&body);
        assert_eq!(ok(&outcome).text, "Hello, héllo 🐝!");
        assert_eq!(outcome.deltas.len(), 2);
    }

    #[test]
    fn l6_stop_reasons_map_to_stop_kinds() {
        for (reason, stop) in [
            ("end_turn", StopKind::EndTurn),
            ("stop_sequence", StopKind::EndTurn),
            ("pause_turn", StopKind::Pause),
            ("model_context_window_exceeded", StopKind::ContextFull),
            ("something_new", StopKind::EndTurn),
            ("max_tokens", StopKind::MaxTokens),
            ("refusal", StopKind::Refusal),
            ("tool_use", StopKind::EndTurn), // no tool call in the stream
        ] {
            let body = PLAIN_TEXT.replace("\"end_turn\"", &format!("\"{reason}\""));
            assert_eq!(ok(&decode_every_split(&body)).stop, stop, "{reason}");
        }
        // end_turn with a tool call still runs it; max_tokens keeps the cut call.
        let c26_end = C26.replace(
            "\"tool_use\",\"stop_sequence\"",
            "\"end_turn\",\"stop_sequence\"",
        );
        assert_eq!(ok(&decode_every_split(&c26_end)).stop, StopKind::ToolUse);
        let c26_max = C26.replace(
            "\"tool_use\",\"stop_sequence\"",
            "\"max_tokens\",\"stop_sequence\"",
        );
        let response = ok(&decode_every_split(&c26_max)).clone();
        assert_eq!(response.stop, StopKind::MaxTokens);
        assert_eq!(response.tool_calls.len(), 1);
    }

    /// Case C69's first response: a server tool's search, its result, text, `pause_turn`.
    const C69_PAUSED: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":50,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"rust 2026"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" edition\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[{"type":"web_search_result","url":"https://example.com/r","title":"Rust","encrypted_content":"EqgfCioIARgBIiQ3YTAw","page_age":null}]}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"The 2026 edition "}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://example.com/r","title":"Rust","encrypted_index":"Eo8BCioIAhgB","cited_text":"edition"}}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"pause_turn","stop_sequence":null},"usage":{"output_tokens":40}}

event: message_stop
data: {"type":"message_stop"}

"#;

    #[test]
    fn c69_pause_turn_keeps_the_server_tool_blocks_verbatim_at_every_split() {
        let r = ok(&decode_every_split(C69_PAUSED)).clone();
        assert_eq!(r.stop, StopKind::Pause);
        assert_eq!(r.text, "The 2026 edition ");
        assert!(
            r.tool_calls.is_empty(),
            "a server tool is not the agent's to run"
        );
        assert_eq!(
            r.reasoning,
            vec![ReasoningBlock::AnthropicContent(json!([
                {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
                 "input": {"query": "rust 2026 edition"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
                    {"type": "web_search_result", "url": "https://example.com/r", "title": "Rust",
                     "encrypted_content": "EqgfCioIARgBIiQ3YTAw", "page_age": null}]},
                {"type": "text", "text": "The 2026 edition ", "citations": [
                    {"type": "web_search_result_location", "url": "https://example.com/r",
                     "title": "Rust", "encrypted_index": "Eo8BCioIAhgB", "cited_text": "edition"}]}
            ]))]
        );
        // A response without such blocks keeps no verbatim copy.
        assert!(ok(&decode_every_split(PLAIN_TEXT)).reasoning.is_empty());
    }

    #[test]
    fn c69_a_paused_turn_is_sent_back_as_it_came_and_a_joined_call_follows_it() {
        let paused = ok(&decode_every_split(C69_PAUSED)).clone();
        let Some(ReasoningBlock::AnthropicContent(content)) = paused.reasoning.first().cloned()
        else {
            panic!("no verbatim content: {paused:?}");
        };
        let history = vec![
            user("what is new in rust?"),
            assistant(&paused.text, paused.reasoning.clone(), vec![]),
        ];
        let body = request_body(&history, &[], None);
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2, "{body:#}");
        assert_eq!(messages[1]["role"], "assistant");
        assert_eq!(messages[1]["content"], content, "verbatim, nothing added");
        // The continuation (another assistant message) joins the same turn, and a call
        // that joined the message later (a hook's) comes after the verbatim blocks.
        let mut joined = history.clone();
        joined[1] = assistant(
            &paused.text,
            paused.reasoning.clone(),
            vec![call("toolu_h", "hooks___Stop", "{}")],
        );
        joined.push(assistant("is out.", vec![], vec![]));
        let body = request_body(&joined, &[], None);
        let turn = body["messages"][1]["content"].as_array().unwrap().clone();
        assert_eq!(body["messages"].as_array().unwrap().len(), 2, "{body:#}");
        assert_eq!(turn[..3], content.as_array().unwrap()[..]);
        assert_eq!(turn[3]["type"], "tool_use");
        assert_eq!(turn[3]["id"], "toolu_h");
        assert_eq!(turn[4], json!({"type": "text", "text": "is out."}));
    }

    #[test]
    fn l6_missing_or_duplicate_tool_ids_are_synthesised_and_nameless_blocks_dropped() {
        let body = r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"","name":"a","input":{}}}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"dup","name":"b","input":{}}}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"dup","name":"c","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":5,"delta":{"type":"input_json_delta","partial_json":"{}"}}

event: message_stop
data: {"type":"message_stop"}

"#;
        let response = ok(&decode_every_split(body)).clone();
        assert_eq!(
            response.tool_calls,
            vec![
                call("call_t1_0", "a", "{}"),
                call("dup", "b", "{}"),
                call("call_t1_2", "c", "{}"),
            ]
        );
        assert_eq!(response.stop, StopKind::ToolUse);
        assert_eq!(response.usage, None);
    }

    #[test]
    fn l9_lone_surrogate_escape_in_a_delta_becomes_replacement_character() {
        let body = PLAIN_TEXT.replace("\"Hello\"", "\"a\\ud800b\\udc00\"");
        assert_eq!(
            ok(&decode_every_split(&body)).text,
            "a\u{fffd}b\u{fffd}, héllo 🐝!"
        );
    }

    #[test]
    fn l9_split_inside_a_multibyte_character_decodes_whole() {
        let bee = PLAIN_TEXT.find('🐝').unwrap();
        let bytes = PLAIN_TEXT.as_bytes();
        for cut in bee + 1..bee + 4 {
            let outcome = run_chunks(&[&bytes[..cut], &bytes[cut..]]);
            assert_eq!(ok(&outcome).text, "Hello, héllo 🐝!", "cut at {cut}");
        }
    }

    #[test]
    fn l6_finish_twice_does_not_hand_out_the_response_again() {
        let mut decoder = AnthropicDecoder::new("c".into());
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
    fn l9_long_tool_input_fed_byte_by_byte_decodes_in_linear_time() {
        let mut body = String::from(
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{}}}\n\n",
        );
        let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"xxxxxxxx\"}}\n\n";
        for _ in 0..10_000 {
            body.push_str(delta);
        }
        body.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        let mut decoder = AnthropicDecoder::new("c".into());
        let mut out = Vec::new();
        for byte in body.as_bytes().chunks(1) {
            decoder.feed(byte, &mut out).unwrap();
        }
        let response = decoder.finish(&mut out).unwrap();
        assert_eq!(
            response.tool_calls.first().map(|c| c.arguments.len()),
            Some(80_000)
        );
    }

    // ---------------------------------------------------------------- request tests

    fn schema() -> Value {
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
    }

    #[test]
    fn l6_request_has_url_headers_and_streaming_body() {
        let tools = [
            ToolDef {
                name: "fs__read_file".into(),
                description: "Read a file".into(),
                input_schema: schema(),
            },
            ToolDef {
                name: "clock__now".into(),
                description: String::new(),
                input_schema: json!({"type": "object", "properties": {}}),
            },
        ];
        let messages = [user("hi")];
        let req = LlmRequest {
            system: Some("Be brief."),
            tools: &tools,
            max_output_tokens: 4096,
            ..LlmRequest::for_tests("claude-x", &messages)
        };
        let mut config = cfg();
        config.anthropic_version = "2024-01-01".into();
        let request = build_request(&config, &req);
        assert_eq!(request.url, "http://127.0.0.1:5000/v1/messages");
        assert_eq!(
            request.headers,
            crate::llm::decoder_tests::streaming_headers(&[
                ("x-api-key", "test-key"),
                ("anthropic-version", "2024-01-01"),
            ])
        );
        let text = String::from_utf8(request.body.to_vec()).unwrap();
        assert!(
            text.starts_with("{\"model\":\"claude-x\",\"max_tokens\":4096,\"system\":"),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({
                "model": "claude-x",
                "max_tokens": 4096,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "tools": [
                    {"name": "fs__read_file", "description": "Read a file", "input_schema": schema()},
                    {"name": "clock__now", "input_schema": {"type": "object", "properties": {}}}
                ],
                "stream": true
            })
        );
    }

    #[test]
    fn l6_no_tools_no_system_and_no_key_leave_those_out() {
        let mut config = cfg();
        config.api_key = String::new();
        let messages = [user("summarise")];
        let req = LlmRequest {
            system: Some(""),
            max_output_tokens: 100,
            ..LlmRequest::for_tests("m", &messages)
        };
        let request = build_request(&config, &req);
        assert!(request.headers.iter().all(|(k, _)| k != "x-api-key"));
        assert_eq!(
            serde_json::from_slice::<Value>(&request.body.to_vec()).unwrap(),
            json!({
                "model": "m",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "summarise"}]}],
                "stream": true
            })
        );
    }

    #[test]
    fn l6_l10_tool_results_share_one_user_turn_and_a_user_text_after_them_gets_a_bridge() {
        let messages = [
            user("list and time"),
            assistant(
                "",
                vec![thinking("plan", "sig1")],
                vec![
                    call("toolu_1", "fs__list_dir", "{\"p\":\".\"}"),
                    call("toolu_2", "clock__now", ""),
                    call("toolu_3", "fs__write", "{\"a\":"),
                    call("toolu_4", "fs__odd", "[1,2]"),
                ],
            ),
            result("toolu_1", "a.txt\nb.txt", false),
            result("toolu_2", "12:00", false),
            result("toolu_3", "arguments were not valid JSON", true),
            result("toolu_4", "", true),
            user("Your reply was cut off"),
            assistant("Done \"quoted\" é", vec![], vec![]),
            user("thanks"),
        ];
        assert_eq!(
            request_body(&messages, &[], None)["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "list and time"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "sig1"},
                    {"type": "tool_use", "id": "toolu_1", "name": "fs__list_dir", "input": {"p": "."}},
                    {"type": "tool_use", "id": "toolu_2", "name": "clock__now", "input": {}},
                    {"type": "tool_use", "id": "toolu_3", "name": "fs__write", "input": {}},
                    {"type": "tool_use", "id": "toolu_4", "name": "fs__odd", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.txt", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "12:00", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "toolu_3", "content": "arguments were not valid JSON", "is_error": true},
                    {"type": "tool_result", "tool_use_id": "toolu_4", "content": "Error", "is_error": true}
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "(tool results received)"}]},
                {"role": "user", "content": [{"type": "text", "text": "Your reply was cut off"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Done \"quoted\" é"}]},
                {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
            ])
        );
    }

    #[test]
    fn c39_the_synthetic_stop_call_joins_the_turn_that_starts_with_its_thinking_block() {
        let hook = || call("buzz_hook__Stop_h_1", "h___Stop", "{}");
        let expected = json!([
            {"role": "user", "content": [{"type": "text", "text": "finish"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Everything is done, I think.", "signature": "SIG_T1"},
                {"type": "text", "text": "All done."},
                {"type": "tool_use", "id": "buzz_hook__Stop_h_1", "name": "h___Stop", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "buzz_hook__Stop_h_1", "content": "{\"hook\":\"_Stop\"}", "is_error": false}
            ]}
        ]);
        let sig = || vec![thinking("Everything is done, I think.", "SIG_T1")];
        // The call joined the answer in history (what the loop does) …
        let joined = [
            user("finish"),
            assistant("All done.", sig(), vec![hook()]),
            result("buzz_hook__Stop_h_1", "{\"hook\":\"_Stop\"}", false),
        ];
        assert_eq!(request_body(&joined, &[], None)["messages"], expected);
        // … and as two messages (an older history) the merged turn is the same.
        let split = [
            user("finish"),
            assistant("All done.", sig(), vec![]),
            assistant("", vec![], vec![hook()]),
            result("buzz_hook__Stop_h_1", "{\"hook\":\"_Stop\"}", false),
        ];
        assert_eq!(request_body(&split, &[], None)["messages"], expected);
    }

    #[test]
    fn c39_postcompact_after_a_summary_closes_its_tool_loop_before_the_live_prompt() {
        let messages = [
            user("[Context summary]\nwork so far"),
            assistant(
                "",
                vec![],
                vec![call("buzz_hook__PostCompact_g_2", "g___PostCompact", "{}")],
            ),
            result(
                "buzz_hook__PostCompact_g_2",
                "{\"hook\":\"_PostCompact\"}",
                false,
            ),
            user("the live prompt"),
        ];
        let body = request_body(&messages, &[], None);
        let roles = crate::json::strs_of(&body["messages"], "role");
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
        // The last user turn is the live prompt alone: no tool loop is open at the end, so
        // thinking rules never ask the synthetic call for a thinking block.
        assert_eq!(
            body["messages"][4]["content"],
            json!([{"type": "text", "text": "the live prompt"}])
        );
        assert_eq!(
            body["messages"][3]["content"],
            json!([{"type": "text", "text": TOOL_RESULTS_BRIDGE}])
        );
    }

    #[test]
    fn l10_unsigned_thinking_is_never_replayed_and_redacted_is() {
        let messages = [
            user("go"),
            assistant(
                "",
                vec![thinking("cut", ""), redacted("ENC"), thinking("t", "S")],
                vec![call("toolu_1", "fs__x", "{}")],
            ),
            result("toolu_1", "ok", false),
        ];
        let body = request_body(&messages, &[], None);
        assert_eq!(
            body["messages"][1]["content"],
            json!([
                {"type": "redacted_thinking", "data": "ENC"},
                {"type": "thinking", "thinking": "t", "signature": "S"},
                {"type": "tool_use", "id": "toolu_1", "name": "fs__x", "input": {}}
            ])
        );
    }

    #[test]
    fn l6_empty_assistant_turns_are_never_sent_and_roles_alternate() {
        let messages = [
            user("one"),
            // Nothing at all: skipped.
            assistant("", vec![], vec![]),
            user("two"),
            // Only whitespace text and reasoning without tool calls: nothing to send.
            assistant("  \n", vec![thinking("cut", "")], vec![]),
            user("  "),
            user("three"),
            assistant("a", vec![], vec![]),
            // Consecutive assistants (a hook injection after a reply) share one turn.
            assistant("", vec![], vec![call("buzz_hook_1", "srv___Stop", "{}")]),
            result("buzz_hook_1", "{\"hook\":\"_Stop\"}", false),
        ];
        let body = request_body(&messages, &[], None);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "one"},
                    {"type": "text", "text": "two"},
                    {"type": "text", "text": "three"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "tool_use", "id": "buzz_hook_1", "name": "srv___Stop", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "buzz_hook_1", "content": "{\"hook\":\"_Stop\"}", "is_error": false}
                ]}
            ])
        );
        // A history of only blank user text still sends a non-empty user turn.
        assert_eq!(
            request_body(&[user("")], &[], None)["messages"],
            json!([{"role": "user", "content": [{"type": "text", "text": EMPTY_USER_TEXT}]}])
        );
    }

    #[test]
    fn l6_decoded_response_rebuilds_into_a_valid_request_with_c26_input() {
        let response = ok(&decode_every_split(C26)).clone();
        let mut messages = vec![
            user("time?"),
            Message::Assistant {
                text: response.text,
                thinking: response.thinking,
                reasoning: response.reasoning,
                tool_calls: response.tool_calls.clone(),
            },
        ];
        messages.extend(
            response
                .tool_calls
                .iter()
                .map(|c| result(&c.id, "12:00", false)),
        );
        let body = request_body(&messages, &[], None);
        assert_eq!(
            body["messages"][1]["content"],
            json!([{"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}])
        );
        assert_eq!(body["messages"][2]["content"][0]["tool_use_id"], "toolu_1");
    }

    /// A Messages stream of `events` (each named by its `type`), then `message_stop`.
    fn stream(events: &[Value]) -> String {
        let mut body = String::new();
        for e in events.iter().chain([&json!({"type": "message_stop"})]) {
            body.push_str(&format!(
                "event: {}\ndata: {e}\n\n",
                e["type"].as_str().unwrap()
            ));
        }
        body
    }

    fn block_start(index: u64, block: Value) -> Value {
        json!({"type": "content_block_start", "index": index, "content_block": block})
    }

    #[test]
    fn l6_a_thinking_block_is_kept_with_text_or_a_signature_and_dropped_with_neither() {
        let body = stream(&[
            block_start(
                0,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
            ),
            block_start(
                1,
                json!({"type": "thinking", "thinking": "unsigned", "signature": ""}),
            ),
            block_start(
                2,
                json!({"type": "thinking", "thinking": "", "signature": "SIG"}),
            ),
        ]);
        assert_eq!(
            ok(&decode_every_split(&body)).reasoning,
            vec![thinking("unsigned", ""), thinking("", "SIG")]
        );
    }

    #[test]
    fn l6_the_initial_text_of_a_text_block_is_streamed() {
        let body = stream(&[
            block_start(0, json!({"type": "text", "text": "Hi"})),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}}),
        ]);
        let outcome = decode_every_split(&body);
        assert_eq!(
            outcome.deltas,
            vec![
                StreamDelta::Text("Hi".into()),
                StreamDelta::Text(" there".into())
            ]
        );
        assert_eq!(ok(&outcome).text, "Hi there");
    }

    #[test]
    fn c26_a_null_start_input_counts_as_no_input() {
        let body = stream(&[block_start(
            0,
            json!({"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": null}),
        )]);
        assert_eq!(
            ok(&decode_every_split(&body)).tool_calls,
            vec![call("toolu_1", "get_time", "")]
        );
    }

    #[test]
    fn l6_input_tokens_alone_are_a_usage_with_no_output_tokens() {
        for (usage, read) in [
            (json!({"input_tokens": 9}), None),
            (json!({"cache_read_input_tokens": 9}), Some(9)),
        ] {
            let body = stream(&[json!({"type": "message_start", "message": {"usage": usage}})]);
            assert_eq!(
                ok(&decode_every_split(&body)).usage,
                Some(Usage {
                    input_tokens: 9,
                    output_tokens: 0,
                    cache_read_tokens: read,
                    cache_write_tokens: None,
                }),
                "{usage}"
            );
        }
    }

    #[test]
    fn l6_an_error_event_without_a_type_or_a_message_says_what_it_has() {
        let error = |error: Value| {
            decode_every_split(&stream(&[json!({"type": "error", "error": error})])).result
        };
        let provider = |message: &str| {
            Err(StreamError::Provider {
                message: message.to_owned(),
                retryable: true,
            })
        };
        assert_eq!(error(json!({"message": "boom"})), provider("boom"));
        assert_eq!(
            error(json!({"type": "error", "message": "boom"})),
            provider("boom")
        );
        assert_eq!(
            error(json!({"type": "overloaded_error", "message": ""})),
            provider("{\"message\":\"\",\"type\":\"overloaded_error\"} (overloaded_error)")
        );
    }

    #[test]
    fn l6_the_decoder_shows_sizes_and_the_stop_reason_not_contents() {
        let cut = THINKING_TOOL_USE.find("event: message_stop").unwrap();
        let mut decoder = AnthropicDecoder::new("c".into());
        decoder
            .feed(&THINKING_TOOL_USE.as_bytes()[..cut], &mut Vec::new())
            .unwrap();
        assert_eq!(
            format!("{decoder:?}"),
            "AnthropicDecoder(text 13 B, thinking 27 B, 4 blocks, stop Some(ToolUse), done false)"
        );
    }

    #[test]
    fn l6_l10_the_reasoning_of_a_turn_without_tool_calls_is_not_sent() {
        let messages = [
            user("hi"),
            assistant(
                "hello",
                vec![thinking("greet", "SIG"), redacted("ENC")],
                vec![],
            ),
            user("bye"),
        ];
        assert_eq!(
            request_body(&messages, &[], None)["messages"][1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "hello"}]})
        );
    }

    // ---------------------------------------------------------------- the event view

    /// `body`'s events with a field of the view twice each, which the view refuses: every
    /// event then goes the general path.
    fn forced_general(body: &str) -> String {
        const KEYS: &[&str] = &[
            "type",
            "index",
            "delta",
            "content_block",
            "message",
            "usage",
            "stop_details",
        ];
        crate::llm::decoder_tests::forced_general(body, KEYS)
    }

    /// The view borrows plain strings, decodes escaped ones and skips unknown fields at every
    /// level: the same outcome as the general path, and the escapes decoded.
    #[test]
    fn l9_the_event_view_decodes_escapes_and_skips_unknown_fields_like_the_general_path() {
        let body = concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"id":"m","model":"x","content":[],"usage":{"input_tokens":7,"cache_read_input_tokens":3,"service_tier":"standard"}}}"#,
            "\n\nevent: content_block_start\n",
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":"","cache_control":{"deep":[[{}]]}}}"#,
            "\n\nevent: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"line\nnext \"q\" \u00e9 \ud83d\udc1d","future":"\ud800"}}"#,
            "\n\nevent: content_block_start\n",
            r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_\u0031","name":"fs__read","input":{}}}"#,
            "\n\nevent: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\":\"a\\\\b\"}"}}"#,
            "\n\nevent: message_delta\n",
            r#"data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":4}}"#,
            "\n\nevent: message_stop\n",
            r#"data: {"type":"message_stop"}"#,
            "\n\n",
        );
        let outcome = decode_every_split(body);
        assert_eq!(outcome, run_chunks(&[forced_general(body).as_bytes()]));
        let response = ok(&outcome);
        assert_eq!(response.text, "line\nnext \"q\" é 🐝");
        assert_eq!(
            response.tool_calls,
            vec![call("toolu_1", "fs__read", r#"{"path":"a\\b"}"#)]
        );
        let usage = response.usage.expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (10, 4));
        assert_eq!(usage.cache_read_tokens, Some(3));
    }

    /// A server tool's block keeps the content verbatim: a `citation` that is `null` is kept
    /// as it came through the view too (present is not absent), as on the general path.
    #[test]
    fn l13_a_null_citation_is_kept_verbatim_through_the_view_as_on_the_general_path() {
        let body = stream(&[
            block_start(
                0,
                json!({"type": "server_tool_use", "id": "srv_1", "name": "web_search"}),
            ),
            block_start(1, json!({"type": "text", "text": "cited"})),
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "citations_delta", "citation": null}}),
        ]);
        let outcome = decode_every_split(&body);
        assert_eq!(outcome, run_chunks(&[forced_general(&body).as_bytes()]));
        let Some(ReasoningBlock::AnthropicContent(content)) = ok(&outcome).reasoning.last() else {
            panic!("verbatim content expected");
        };
        assert_eq!(content[1]["citations"], json!([null]));
    }

    /// Generators of Messages stream events for the view-against-general-path property: every
    /// field the decoder reads, with values of the right type and of others, escapes, lone
    /// surrogates, unknown fields, block types the agent does not model, error events.
    mod event_gen {
        use crate::llm::decoder_tests::{
            UNKNOWN, field, field_of, index, object, often, sse_event, text,
        };
        use proptest::prelude::*;

        const DELTA_KIND: &[&str] = &[
            r#""text_delta""#,
            r#""thinking_delta""#,
            r#""signature_delta""#,
            r#""input_json_delta""#,
            r#""citations_delta""#,
            r#""future_delta""#,
            "null",
            "3",
        ];
        const BLOCK_KIND: &[&str] = &[
            r#""text""#,
            r#""thinking""#,
            r#""redacted_thinking""#,
            r#""tool_use""#,
            r#""tool_use""#,
            r#""server_tool_use""#,
            "null",
            "5",
        ];
        const CITATION: &[&str] = &[
            r#"{"type":"char_location","cited_text":"a","start_char_index":0}"#,
            "null",
            r#""c""#,
        ];
        const CITATIONS: &[&str] = &[r#"[{"type":"web","url":"u"}]"#, "[]", "null", "{}"];
        const INPUT: &[&str] = &[r#"{}"#, r#"{"q":"\u00e9"}"#, "null", r#""s""#, "[1]"];
        const STOP_REASON: &[&str] = &[
            r#""end_turn""#,
            r#""tool_use""#,
            r#""max_tokens""#,
            r#""refusal""#,
            r#""pause_turn""#,
            r#""""#,
            "null",
            "3",
        ];
        const STOP_DETAILS: &[&str] = &[
            r#"{"type":"refusal","category":"cyber","explanation":" no "}"#,
            r#"{"category":"bio"}"#,
            r#"{"explanation":3}"#,
            "null",
            r#""x""#,
        ];
        const USAGE: &[&str] = &[
            r#"{"input_tokens":3,"output_tokens":2}"#,
            r#"{"cache_creation_input_tokens":4,"cache_read_input_tokens":5}"#,
            r#"{"output_tokens":9}"#,
            r#"{"input_tokens":"x"}"#,
            r#"{"output_tokens":1.5}"#,
            "null",
            "5",
            "{}",
        ];
        const ERROR: &[&str] = &[
            r#"{"type":"overloaded_error","message":"Overloaded"}"#,
            r#"{"type":"invalid_request_error","message":""}"#,
            "null",
        ];
        /// Names and `type`s of the events.
        const KIND: &[&str] = &[
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "ping",
            "error",
        ];

        /// A `content_block_delta`'s `delta`: a type and mostly its own field, sometimes others.
        fn block_delta() -> impl Strategy<Value = String> {
            let own = prop_oneof![
                (Just(r#""text_delta""#), text())
                    .prop_map(|(k, t)| (k, Some(format!("\"text\":{t}")))),
                (Just(r#""thinking_delta""#), text())
                    .prop_map(|(k, t)| (k, Some(format!("\"thinking\":{t}")))),
                (Just(r#""signature_delta""#), text())
                    .prop_map(|(k, t)| (k, Some(format!("\"signature\":{t}")))),
                (Just(r#""input_json_delta""#), text())
                    .prop_map(|(k, t)| (k, Some(format!("\"partial_json\":{t}")))),
                (Just(r#""citations_delta""#), prop::sample::select(CITATION))
                    .prop_map(|(k, c)| (k, Some(format!("\"citation\":{c}")))),
                prop::sample::select(DELTA_KIND).prop_map(|k| (k, None)),
            ];
            let others = (
                prop::option::weighted(0.15, text())
                    .prop_map(|t| t.map(|t| format!("\"text\":{t}"))),
                prop::option::weighted(0.15, text())
                    .prop_map(|t| t.map(|t| format!("\"partial_json\":{t}"))),
                prop::option::weighted(0.1, prop::sample::select(UNKNOWN))
                    .prop_map(|u| u.map(|u| format!("\"future\":{u}"))),
            );
            prop_oneof![
                10 => (own, others).prop_map(|((kind, own), (t, p, u))| {
                    object(vec![Some(format!("\"type\":{kind}")), own, t, p, u])
                }),
                1 => Just("null".to_owned()),
                1 => Just("\"d\"".to_owned()),
            ]
        }

        fn block() -> impl Strategy<Value = String> {
            let text_fields = (
                field_of("text", text()),
                field_of("thinking", text()),
                field_of("signature", text()),
                field_of("data", text()),
            );
            prop_oneof![
                10 => (
                    prop::sample::select(BLOCK_KIND),
                    text_fields,
                    field_of("id", text()),
                    field_of("name", text()),
                    field("input", INPUT),
                    field("citations", CITATIONS),
                    field("cache_control", UNKNOWN),
                )
                    .prop_map(|(k, (t, th, s, d), id, n, i, c, u)| {
                        object(vec![Some(format!("\"type\":{k}")), t, th, s, d, id, n, i, c, u])
                    }),
                1 => Just("null".to_owned()),
                1 => Just("\"b\"".to_owned()),
            ]
        }

        fn message_delta() -> impl Strategy<Value = String> {
            prop_oneof![
                10 => (field("stop_reason", STOP_REASON), field("stop_details", STOP_DETAILS))
                    .prop_map(|(r, d)| object(vec![r, d])),
                1 => Just("null".to_owned()),
                1 => Just("7".to_owned()),
            ]
        }

        /// The fields of an event of type `kind` (and, rarely, of any other).
        fn fields(kind: &'static str) -> BoxedStrategy<Vec<Option<String>>> {
            let index = field_of("index", index());
            match kind {
                "message_start" => (field("usage", USAGE), field("id", UNKNOWN))
                    .prop_map(|(u, id)| vec![Some(format!("\"message\":{}", object(vec![u, id])))])
                    .boxed(),
                "content_block_start" => (index, often("content_block", block().boxed()))
                    .prop_map(|(i, b)| vec![i, b])
                    .boxed(),
                "content_block_delta" | "content_block_stop" => {
                    (index, often("delta", block_delta().boxed()))
                        .prop_map(|(i, d)| vec![i, d])
                        .boxed()
                }
                "message_delta" => (
                    often("delta", message_delta().boxed()),
                    field("usage", USAGE),
                    prop::option::weighted(0.2, prop::sample::select(STOP_DETAILS))
                        .prop_map(|d| d.map(|d| format!("\"stop_details\":{d}"))),
                )
                    .prop_map(|(d, u, s)| vec![d, u, s])
                    .boxed(),
                "error" => field("error", ERROR).prop_map(|e| vec![e]).boxed(),
                _ => Just(Vec::new()).boxed(),
            }
        }

        /// One event: its SSE name and its JSON text (always an object). The `type` is mostly
        /// the name, sometimes another, absent or not a string; errors are rare (they end the
        /// stream).
        pub(super) fn event() -> impl Strategy<Value = (String, String)> {
            let kind = prop_oneof![
                3 => Just("message_start"),
                6 => Just("content_block_start"),
                12 => Just("content_block_delta"),
                2 => Just("content_block_stop"),
                4 => Just("message_delta"),
                1 => Just("ping"),
                1 => Just("error"),
            ];
            sse_event(kind, KIND, fields)
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
            done in proptest::bool::ANY,
        ) {
            let mut body = crate::llm::decoder_tests::sse_body(&events);
            if done {
                body.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
            }
            let general = forced_general(&body);
            proptest::prop_assert_eq!(run_chunks(&[body.as_bytes()]), run_chunks(&[general.as_bytes()]), "{}", body);
        }
    }
}

#[cfg(test)]
mod caching_tests {
    //! SPEC L11 on the Anthropic route: where the breakpoints go, how many, and that only they
    //! move between requests.

    use super::*;
    use crate::config::ProviderKind;
    use crate::llm::PromptCache;
    use serde_json::json;

    fn user(text: &str) -> Message {
        Message::User { text: text.into() }
    }

    fn call(id: &str) -> Message {
        Message::Assistant {
            text: String::new(),
            thinking: "why".into(),
            reasoning: vec![ReasoningBlock::Thinking {
                text: "why".into(),
                signature: "sig".into(),
            }],
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "fs__read".into(),
                arguments: "{}".into(),
            }],
        }
    }

    fn result(id: &str) -> Message {
        Message::ToolResult {
            call_id: id.into(),
            name: "fs__read".into(),
            text: format!("contents of {id}"),
            is_error: false,
        }
    }

    fn tools() -> Vec<ToolDef> {
        ["fs__read", "fs__write"]
            .iter()
            .map(|name| ToolDef {
                name: (*name).into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            })
            .collect()
    }

    /// The request body for `messages`, caching on with the previous request's length (or off).
    fn body(
        messages: &[Message],
        system: Option<&str>,
        caching: Option<Option<usize>>,
        cache: Option<&mut BodyCache>,
    ) -> Value {
        let tools = tools();
        let req = LlmRequest {
            system,
            tools: &tools,
            cache: caching.map(|previous_len| PromptCache {
                key: "sess_1",
                previous_len,
            }),
            ..LlmRequest::for_tests("claude-x", messages)
        };
        let cfg = Config::for_tests(ProviderKind::Anthropic, "http://h");
        serde_json::from_slice(&build_request_cached(&cfg, &req, cache).body.to_vec()).unwrap()
    }

    /// Where the breakpoints are: `system`, `tool <i>`, `message <i> block <k>`.
    fn breakpoints(body: &Value) -> Vec<String> {
        let mut out = Vec::new();
        let marked = |v: &Value| v.get("cache_control") == Some(&json!({"type": "ephemeral"}));
        if body["system"]
            .as_array()
            .is_some_and(|b| b.iter().any(marked))
        {
            out.push("system".to_string());
        }
        for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
            if marked(tool) {
                out.push(format!("tool {i}"));
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

    /// The body with every `cache_control` removed.
    fn unmarked(mut body: Value) -> Value {
        fn strip(v: &mut Value) {
            match v {
                Value::Object(map) => {
                    map.remove("cache_control");
                    map.values_mut().for_each(strip);
                }
                Value::Array(items) => items.iter_mut().for_each(strip),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
            }
        }
        strip(&mut body);
        body
    }

    #[test]
    fn l11_breakpoints_end_the_system_prompt_the_previous_request_and_the_conversation() {
        let history = [
            user("go"),
            call("c1"),
            result("c1"),
            call("c2"),
            result("c2"),
        ];
        // The previous request carried the first three messages.
        let b = body(&history, Some("be brief"), Some(Some(3)), None);
        assert_eq!(
            b["system"],
            json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(
            breakpoints(&b),
            ["system", "message 2 block 0", "message 4 block 0"]
        );
        // The first request of a session: no previous end yet.
        let first = body(&history[..1], Some("be brief"), Some(None), None);
        assert_eq!(breakpoints(&first), ["system", "message 0 block 0"]);
        // The previous request ended where this one does: one breakpoint there, not two.
        let again = body(&history, Some("be brief"), Some(Some(5)), None);
        assert_eq!(breakpoints(&again), ["system", "message 4 block 0"]);
    }

    #[test]
    fn l11_without_a_system_prompt_the_last_tool_carries_the_first_breakpoint() {
        let history = [user("go"), call("c1"), result("c1")];
        let b = body(&history, None, Some(Some(1)), None);
        assert!(b.get("system").is_none());
        assert_eq!(
            breakpoints(&b),
            ["tool 1", "message 0 block 0", "message 2 block 0"]
        );
    }

    #[test]
    fn l11_caching_off_sends_no_breakpoint_and_the_system_prompt_as_a_string() {
        let history = [user("go"), call("c1"), result("c1")];
        let b = body(&history, Some("be brief"), None, None);
        assert!(breakpoints(&b).is_empty());
        assert_eq!(b["system"], "be brief");
        assert!(!b.to_string().contains("cache_control"));
        // The rest is the body caching on sends, without its breakpoints.
        let on = body(&history, Some("be brief"), Some(Some(1)), None);
        let mut on = unmarked(on);
        on["system"] = json!("be brief");
        assert_eq!(on, b);
    }

    #[test]
    fn l11_a_round_of_more_than_20_blocks_still_reads_the_previous_requests_end() {
        // 30 calls in one answer, 30 results: 60 blocks after the previous end.
        let mut history = vec![user("go")];
        let calls: Vec<ToolCall> = (0..30)
            .map(|i| ToolCall {
                id: format!("c{i}"),
                name: "fs__read".into(),
                arguments: "{}".into(),
            })
            .collect();
        history.push(Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: calls,
        });
        history.extend((0..30).map(|i| result(&format!("c{i}"))));
        let b = body(&history, Some("s"), Some(Some(1)), None);
        assert_eq!(b["messages"].as_array().map(Vec::len), Some(3));
        assert_eq!(
            breakpoints(&b),
            ["system", "message 0 block 0", "message 2 block 29"]
        );
    }

    #[test]
    fn l11_at_most_four_breakpoints_and_never_on_a_thinking_block() {
        let mut history = vec![user("go")];
        for i in 0..6 {
            history.push(call(&format!("c{i}")));
            history.push(result(&format!("c{i}")));
        }
        for previous in 0..=history.len() {
            for system in [None, Some("s")] {
                let b = body(&history, system, Some(Some(previous)), None);
                let marks = breakpoints(&b);
                assert!(marks.len() <= 4, "{previous}: {marks:?}");
                for m in b["messages"].as_array().into_iter().flatten() {
                    for block in m["content"].as_array().into_iter().flatten() {
                        let thinking =
                            block["type"] == "thinking" || block["type"] == "redacted_thinking";
                        assert!(
                            !(thinking && block.get("cache_control").is_some()),
                            "{block}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn l11_round_after_round_only_the_breakpoints_move_and_the_history_cache_agrees() {
        let mut history = vec![user("go")];
        let mut cache = BodyCache::default();
        let mut previous: Option<usize> = None;
        let mut last_unmarked: Option<Vec<Value>> = None;
        for round in 0..8 {
            let fresh = body(&history, Some("s"), Some(previous), None);
            let cached = body(&history, Some("s"), Some(previous), Some(&mut cache));
            assert_eq!(
                cached, fresh,
                "round {round}: the history's cache changes nothing"
            );
            let messages = unmarked(fresh)["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if let Some(before) = &last_unmarked {
                // Every message of the previous request is sent again, the same but for the
                // breakpoints (SPEC L11: the prefix stays byte-stable).
                assert_eq!(&messages[..before.len()], &before[..], "round {round}");
            }
            last_unmarked = Some(messages);
            previous = Some(history.len());
            history.push(call(&format!("c{round}")));
            history.push(result(&format!("c{round}")));
        }
    }
}
