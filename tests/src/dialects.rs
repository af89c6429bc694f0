//! Dialect profiles of the fake LLM (issue 11; SPEC L5–L10): what a real server sends and what
//! it rejects, each taken from the provider's documentation or a public bug report (cited at
//! the rule). A profile styles every scripted reply the way that server streams it, and
//! **validates every request** the agent sends: a request that breaks one of its rules gets that
//! server's own 400 body, and the rule is recorded as a violation that fails the trial.
//!
//! The scenario suite runs its hook, compaction, cancel, retry and tool-loop scenarios under
//! every profile, on both binaries (`dialects::<profile>::<scenario>` trials, see
//! `scenarios::dialect_matrix`); `docs/dialects.md` has the profile × scenario table.

use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, Style, Wire};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One real-world server dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Claude with extended thinking on: the agent runs at an effort ([`Dialect::effort`]), so
    /// its requests ask for thinking, and every response to one that does starts with a signed
    /// thinking block; the thinking-block rules are enforced on the requests that ask for it.
    AnthropicThinking,
    /// Claude without an effort: Anthropic's structural rules, and the thinking rules only on a
    /// request that asks for thinking (with `BUZZ_E2E_THINKING_EFFORT` set, every one).
    Anthropic,
    /// An OpenAI reasoning model on Chat Completions (`gpt-5.4`): rejects `max_tokens` (C41).
    OpenAiReasoning,
    /// An OpenAI reasoning model on the Responses API (`o4-mini`, `store: false`): reasoning
    /// items with `encrypted_content`, replay rules enforced.
    OpenAiResponsesReasoning,
    /// Ollama's OpenAI-compatible endpoint: every tool call whole at `index: 0` (C37),
    /// reasoning in `reasoning`.
    Ollama,
    /// A strict-alternation chat template (vLLM or llama.cpp serving Mistral/Gemma): role
    /// sequence rules enforced (C61).
    StrictAlternation,
    /// DeepSeek's thinking mode: `reasoning_content` streamed, and required back in turns that
    /// called tools.
    DeepSeek,
    /// OpenRouter / LiteLLM / vLLM in front of a flaky upstream: the first attempt of every
    /// request gets an error object inside a 200 SSE stream (L5: a failed attempt, retried).
    InBandErrors,
    /// Gemini's OpenAI-compatible endpoint: tool schemas must be Gemini's OpenAPI subset (M14).
    Gemini,
}

/// A request a profile refused: the status and body the real server answers, and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    pub body: String,
    pub rule: String,
}

impl Dialect {
    /// Every profile, in the order of the docs table.
    pub const ALL: [Dialect; 9] = [
        Dialect::AnthropicThinking,
        Dialect::Anthropic,
        Dialect::OpenAiReasoning,
        Dialect::OpenAiResponsesReasoning,
        Dialect::Ollama,
        Dialect::StrictAlternation,
        Dialect::DeepSeek,
        Dialect::InBandErrors,
        Dialect::Gemini,
    ];

    /// The trial-name form, e.g. `anthropic_thinking`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::AnthropicThinking => "anthropic_thinking",
            Dialect::Anthropic => "anthropic",
            Dialect::OpenAiReasoning => "openai_reasoning",
            Dialect::OpenAiResponsesReasoning => "openai_responses_reasoning",
            Dialect::Ollama => "ollama",
            Dialect::StrictAlternation => "strict_alternation",
            Dialect::DeepSeek => "deepseek",
            Dialect::InBandErrors => "inband_errors",
            Dialect::Gemini => "gemini",
        }
    }

    /// The provider route the agent uses against this server.
    pub fn wire(self) -> Wire {
        match self {
            Dialect::AnthropicThinking | Dialect::Anthropic => Wire::Anthropic,
            Dialect::OpenAiResponsesReasoning => Wire::Responses,
            Dialect::OpenAiReasoning
            | Dialect::Ollama
            | Dialect::StrictAlternation
            | Dialect::DeepSeek
            | Dialect::InBandErrors
            | Dialect::Gemini => Wire::Chat,
        }
    }

    /// The model name the agent is configured with.
    pub fn model(self) -> &'static str {
        match self {
            Dialect::AnthropicThinking | Dialect::Anthropic => "claude-sonnet-4-5",
            Dialect::OpenAiReasoning => "gpt-5.4",
            Dialect::OpenAiResponsesReasoning => "o4-mini",
            Dialect::Ollama => "qwen3:8b",
            Dialect::StrictAlternation => "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
            Dialect::DeepSeek => "deepseek-reasoner",
            Dialect::InBandErrors => "anthropic/claude-sonnet-4.5",
            Dialect::Gemini => "gemini-2.5-flash",
        }
    }

    /// The reasoning effort the agent runs at against this profile (its
    /// `BUZZ_AGENT_THINKING_EFFORT`, `None`: unset): `BUZZ_E2E_THINKING_EFFORT` when set and not
    /// empty, for every profile (the whole matrix with effort on); else `high` for
    /// `anthropic_thinking`, whose thinking is on only because its requests ask for it, and
    /// `None` for the others.
    pub fn effort(self) -> Option<String> {
        match std::env::var("BUZZ_E2E_THINKING_EFFORT") {
            Ok(effort) if !effort.is_empty() => Some(effort),
            _ => (self == Dialect::AnthropicThinking).then(|| "high".to_string()),
        }
    }

    /// Restyles a scripted reply as this server streams it (raw SSE and status replies are the
    /// scenario's own and pass unchanged). `n` numbers the scenario's requests.
    pub fn style(self, reply: Reply, req: &RecordedRequest, n: usize) -> Reply {
        if !reply.is_scripted() {
            return reply;
        }
        let thought = || format!("Thinking about step {n}.");
        match self {
            // Anthropic thinks when the request asks for it, and only then.
            Dialect::AnthropicThinking | Dialect::Anthropic if asks_for_thinking(&req.body) => {
                let text = reply.thinking().map_or_else(thought, str::to_string);
                reply.with_thinking(text.clone()).with_style(Style {
                    signature: Some(signature(&text)),
                    ..Style::default()
                })
            }
            Dialect::AnthropicThinking | Dialect::Anthropic => reply.without_thinking(),
            Dialect::OpenAiResponsesReasoning => {
                let text = reply.thinking().map_or_else(thought, str::to_string);
                // Encrypted content only when asked for, as the API does.
                let asked = req.body["include"]
                    .as_array()
                    .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
                reply.with_thinking(text.clone()).with_style(Style {
                    encrypted_reasoning: asked.then(|| encrypted(&text)),
                    ..Style::default()
                })
            }
            Dialect::Ollama => reply.with_style(Style {
                reasoning_field: Some("reasoning"),
                calls_at_index_0: true,
                ..Style::default()
            }),
            Dialect::DeepSeek => {
                let text = reply.thinking().map_or_else(thought, str::to_string);
                reply.with_thinking(text)
            }
            Dialect::OpenAiReasoning
            | Dialect::StrictAlternation
            | Dialect::InBandErrors
            | Dialect::Gemini => reply,
        }
    }

    /// Validates one request against this server's rules.
    ///
    /// # Errors
    /// The server's own 400 for the first rule the request breaks.
    pub fn check(self, req: &RecordedRequest) -> Result<(), Rejection> {
        if let Some(why) = req.pairing_error() {
            // Every provider rejects an unanswered call (OpenAI: "An assistant message with
            // 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'";
            // Anthropic: "`tool_use` ids were found without `tool_result` blocks immediately
            // after").
            return Err(self.reject(&why, "tool call pairing"));
        }
        if let Some((message, rule)) = self.tool_rules(req) {
            return Err(self.reject(&message, rule));
        }
        let msgs = req.messages();
        let broken = match self {
            Dialect::AnthropicThinking | Dialect::Anthropic => anthropic_request_rules(&req.body)
                .or_else(|| anthropic_thinking_rules(&req.body))
                .or_else(|| server_tool_rules(&msgs))
                .or_else(|| anthropic_rules(&msgs, asks_for_thinking(&req.body))),
            Dialect::OpenAiReasoning => known_fields(&req.body, OPENAI_CHAT_FIELDS, |f| {
                format!("Unrecognized request argument supplied: {f}")
            })
            .or_else(|| openai_reasoning_rules(&req.body)),
            Dialect::OpenAiResponsesReasoning => {
                known_fields(&req.body, OPENAI_RESPONSES_FIELDS, |f| {
                    format!("Unknown parameter: '{f}'.")
                })
                .or_else(|| responses_rules(&req.body))
            }
            Dialect::StrictAlternation => strict_alternation_rules(&msgs),
            Dialect::DeepSeek => deepseek_rules(&msgs),
            Dialect::Ollama | Dialect::InBandErrors | Dialect::Gemini => None,
        };
        match broken {
            Some((message, rule)) => Err(self.reject(&message, rule)),
            None => Ok(()),
        }
    }

    /// This server's 400 body for `message`.
    fn reject(self, message: &str, rule: &str) -> Rejection {
        let body = match self {
            // Anthropic's error shape.
            Dialect::AnthropicThinking | Dialect::Anthropic => json!({"type": "error",
                "error": {"type": "invalid_request_error", "message": message}}),
            // vLLM's (and mistral_common's) error shape.
            Dialect::StrictAlternation => json!({"object": "error", "message": message,
                "type": "BadRequestError", "param": null, "code": 400}),
            // Google's error shape (the OpenAI-compatible endpoint passes it through).
            Dialect::Gemini => json!({"error": {"code": 400, "message": message,
                "status": "INVALID_ARGUMENT"}}),
            Dialect::OpenAiReasoning
            | Dialect::OpenAiResponsesReasoning
            | Dialect::Ollama
            | Dialect::DeepSeek
            | Dialect::InBandErrors => json!({"error": {"message": message,
                "type": "invalid_request_error", "param": null, "code": null}}),
        };
        Rejection {
            status: 400,
            body: body.to_string(),
            rule: format!("{}: {rule}: {message}", self.name()),
        }
    }

    /// The 200 SSE body of an attempt that fails upstream after the response started
    /// (`InBandErrors`, L5), in one of three real shapes chosen by `n`:
    /// * OpenRouter: "errors that occur mid-generation still arrive as regular data: events
    ///   with an error field" (openrouter.ai/docs/api/reference/streaming), with
    ///   `finish_reason: "error"`;
    /// * LiteLLM: `data: {"error": {...}}` (the shape the OpenAI SDK turns into an APIError);
    /// * vLLM / SGLang: `{"object":"error","message":…}` (block/goose#8031).
    ///
    /// Each is followed by a well-formed end, so an agent that ignored the error would take an
    /// empty answer.
    pub fn in_band_error(n: usize) -> String {
        let error = match n % 3 {
            0 => json!({"id": "gen-1", "object": "chat.completion.chunk", "created": 1,
                "model": "anthropic/claude-sonnet-4.5", "provider": "Anthropic",
                "error": {"code": 502, "message": "Provider returned error",
                          "metadata": {"raw": "overloaded_error"}},
                "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]}),
            1 => json!({"error": {"message": "litellm.RateLimitError: upstream 429",
                "type": "rate_limit_error", "param": null, "code": "429"}}),
            _ => json!({"object": "error", "message": "upstream overloaded",
                "type": "InternalServerError", "param": null, "code": 500}),
        };
        let end = json!({"id": "gen-1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        format!("data: {error}\n\ndata: {end}\n\ndata: [DONE]\n\n")
    }
}

impl Dialect {
    /// The tool-schema rules of this server (SPEC M14, case C63): the first offered tool it
    /// rejects, as its 400 message and the rule.
    ///
    /// * Anthropic (and OpenRouter in front of Claude, which passes the schema on):
    ///   `input_schema` must be `type: "object"`, and "input_schema does not support oneOf,
    ///   allOf, or anyOf at the top level" (makenotion/notion-mcp-server#340,
    ///   DeusData/codebase-memory-mcp#1524).
    /// * OpenAI (Chat Completions and Responses, function tools without strict mode): "schema
    ///   must have type 'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top
    ///   level" (langchain-ai/langchainjs#9804, Dicklesworthstone/flywheel_connectors#49).
    /// * Gemini: the `Schema` object, a subset of OpenAPI 3.0 (ai.google.dev `Schema`, the
    ///   js-genai `Schema` type): any other key is `Unknown name "…" at '…': Cannot find field`
    ///   (zed-industries/zed#44875 `const`, openswarm-ai/openswarm#24 `$schema`,
    ///   `additionalProperties`, `propertyNames`); a `type` list is not a repeated field; enum
    ///   values are strings; an object's `properties` must not be empty ("should be non-empty
    ///   for OBJECT type", agno-agi/agno#2112).
    fn tool_rules(self, req: &RecordedRequest) -> Broken {
        let tools = req.body["tools"].as_array().cloned().unwrap_or_default();
        for (i, tool) in tools.iter().enumerate() {
            let (name, schema) = match req.wire() {
                Wire::Anthropic => (&tool["name"], tool.get("input_schema")),
                Wire::Chat => (
                    &tool["function"]["name"],
                    tool["function"].get("parameters"),
                ),
                Wire::Responses => (&tool["name"], tool.get("parameters")),
            };
            let name = name.as_str().unwrap_or("");
            let broken = match self {
                Dialect::AnthropicThinking | Dialect::Anthropic | Dialect::InBandErrors => {
                    anthropic_schema_rules(i, schema)
                }
                Dialect::OpenAiReasoning | Dialect::OpenAiResponsesReasoning => {
                    openai_schema_rules(name, schema)
                }
                Dialect::Gemini => schema.and_then(|s| {
                    let at = format!("tools[0].function_declarations[{i}].parameters");
                    gemini_schema_rules(s, &at, true)
                }),
                Dialect::Ollama | Dialect::StrictAlternation | Dialect::DeepSeek => None,
            };
            if broken.is_some() {
                return broken;
            }
        }
        None
    }
}

const ROOT_COMBINATORS: [&str; 3] = ["oneOf", "allOf", "anyOf"];

fn anthropic_schema_rules(i: usize, schema: Option<&Value>) -> Broken {
    let schema = schema.unwrap_or(&Value::Null);
    if schema["type"] != "object" {
        return Some((
            format!("tools.{i}.custom.input_schema.type: Input should be 'object'"),
            "input_schema is an object",
        ));
    }
    if ROOT_COMBINATORS.iter().any(|k| schema.get(k).is_some()) {
        return Some((
            format!(
                "tools.{i}.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level"
            ),
            "no root combinators",
        ));
    }
    None
}

fn openai_schema_rules(name: &str, schema: Option<&Value>) -> Broken {
    // No `parameters` is a function without arguments.
    let schema = schema?;
    let top = ["oneOf", "anyOf", "allOf", "enum", "not"];
    if schema["type"] != "object" || top.iter().any(|k| schema.get(k).is_some()) {
        return Some((
            format!(
                "Invalid schema for function '{name}': schema must have type 'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level."
            ),
            "object root without combinators",
        ));
    }
    None
}

/// The keys of Gemini's `Schema` object.
const GEMINI_KEYS: [&str; 22] = [
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "properties",
    "required",
    "items",
    "anyOf",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "minimum",
    "maximum",
    "pattern",
    "example",
    "default",
    "propertyOrdering",
];

fn gemini_schema_rules(schema: &Value, at: &str, root: bool) -> Broken {
    let Some(map) = schema.as_object() else {
        return Some((
            format!(
                "Invalid JSON payload received. Invalid value at '{at}': expected a Schema object."
            ),
            "schema objects",
        ));
    };
    for (key, value) in map {
        if !GEMINI_KEYS.contains(&key.as_str()) {
            return Some((
                format!(
                    "Invalid JSON payload received. Unknown name \"{key}\" at '{at}': Cannot find field."
                ),
                "the OpenAPI subset",
            ));
        }
        match key.as_str() {
            "type" if !value.is_string() => {
                return Some((
                    format!(
                        "Invalid JSON payload received. Proto field is not repeating, cannot start list. (at '{at}.type')"
                    ),
                    "one type name",
                ));
            }
            "enum" => {
                if let Some(bad) = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| !v.is_string())
                {
                    return Some((
                        format!("Invalid value at '{at}.enum[0]' (TYPE_STRING), {bad}"),
                        "string enums",
                    ));
                }
            }
            "properties" => {
                let props = value.as_object().cloned().unwrap_or_default();
                if props.is_empty() {
                    let whole = if root { "GenerateContentRequest." } else { "" };
                    return Some((
                        format!("* {whole}{at}.properties: should be non-empty for OBJECT type"),
                        "non-empty properties",
                    ));
                }
                for (k, child) in props.values().enumerate() {
                    if let Some(b) =
                        gemini_schema_rules(child, &format!("{at}.properties[{k}].value"), false)
                    {
                        return Some(b);
                    }
                }
            }
            "items" => {
                if let Some(b) = gemini_schema_rules(value, &format!("{at}.items"), false) {
                    return Some(b);
                }
            }
            "anyOf" => {
                for (k, child) in value.as_array().into_iter().flatten().enumerate() {
                    if let Some(b) = gemini_schema_rules(child, &format!("{at}.any_of[{k}]"), false)
                    {
                        return Some(b);
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// The signature the fake issues for a thinking text (so a changed text or signature shows).
pub fn signature(thinking: &str) -> String {
    format!("SIG_{:016x}", fnv1a(thinking))
}

/// The `encrypted_content` the fake issues for a reasoning summary.
pub fn encrypted(summary: &str) -> String {
    format!("gAAAA_{:016x}", fnv1a(summary))
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

type Broken = Option<(String, &'static str)>;

/// The top-level request fields of OpenAI's Chat Completions API (platform.openai.com API
/// reference, "Create chat completion"); OpenAI answers any other with a 400 "Unrecognized
/// request argument supplied: <field>".
const OPENAI_CHAT_FIELDS: &[&str] = &[
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "messages",
    "metadata",
    "modalities",
    "model",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

/// The top-level request fields of OpenAI's Responses API (API reference, "Create a model
/// response"); any other: 400 "Unknown parameter: '<field>'." (code `unknown_parameter`).
const OPENAI_RESPONSES_FIELDS: &[&str] = &[
    "background",
    "conversation",
    "include",
    "input",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "model",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
];

/// The top-level request fields of Anthropic's Messages API (docs.anthropic.com API
/// reference, "Messages"); any other: 400 "<field>: Extra inputs are not permitted".
const ANTHROPIC_FIELDS: &[&str] = &[
    "container",
    "context_management",
    "max_tokens",
    "mcp_servers",
    "messages",
    "metadata",
    "model",
    "output_config",
    "service_tier",
    "stop_sequences",
    "stream",
    "system",
    "temperature",
    "thinking",
    "tool_choice",
    "tools",
    "top_k",
    "top_p",
];

/// A strict server's rule: every top-level field of the request is one it knows (`known`);
/// the first other one is rejected with `message(field)`.
fn known_fields(body: &Value, known: &[&str], message: impl Fn(&str) -> String) -> Broken {
    let unknown = body
        .as_object()?
        .keys()
        .find(|k| !known.contains(&k.as_str()))?;
    Some((message(unknown), "known request fields"))
}

/// Anthropic's rules on the request itself, before its messages: known top-level fields, and
/// prompt caching (docs.anthropic.com "Prompt caching"): "A maximum of 4 blocks with
/// cache_control may be provided"; a `cache_control` is `{"type": "ephemeral"}`, with an
/// optional `ttl` of `5m` or `1h`; thinking blocks cannot carry one ("Thinking blocks cannot be
/// explicitly marked with cache_control"; the block's schema has no such field).
fn anthropic_request_rules(body: &Value) -> Broken {
    if let Some(broken) = known_fields(body, ANTHROPIC_FIELDS, |f| {
        format!("{f}: Extra inputs are not permitted")
    }) {
        return Some(broken);
    }
    let mut marks: Vec<(String, &Value)> = Vec::new();
    if let Some(blocks) = body["system"].as_array() {
        for (k, b) in blocks.iter().enumerate() {
            marks.extend(b.get("cache_control").map(|c| (format!("system.{k}"), c)));
        }
    }
    for (k, t) in body["tools"].as_array().into_iter().flatten().enumerate() {
        marks.extend(t.get("cache_control").map(|c| (format!("tools.{k}"), c)));
    }
    for (i, m) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (k, b) in m["content"].as_array().into_iter().flatten().enumerate() {
            let Some(c) = b.get("cache_control") else {
                continue;
            };
            let kind = b["type"].as_str().unwrap_or("");
            if kind == "thinking" || kind == "redacted_thinking" {
                return Some((
                    format!(
                        "messages.{i}.content.{k}.{kind}.cache_control: Extra inputs are not permitted"
                    ),
                    "no cache_control on thinking",
                ));
            }
            marks.push((format!("messages.{i}.content.{k}"), c));
        }
    }
    for (at, c) in &marks {
        let ttl_ok = c.get("ttl").is_none_or(|t| t == "5m" || t == "1h");
        let fields_ok = c
            .as_object()
            .is_some_and(|o| o.keys().all(|k| k == "type" || k == "ttl"));
        if c["type"] != "ephemeral" || !ttl_ok || !fields_ok {
            return Some((
                format!(
                    "{at}.cache_control: Input should be a valid cache control: {{\"type\": \"ephemeral\"}}"
                ),
                "cache_control is ephemeral",
            ));
        }
    }
    if marks.len() > 4 {
        return Some((
            format!(
                "A maximum of 4 blocks with cache_control may be provided. Found {}.",
                marks.len()
            ),
            "at most 4 breakpoints",
        ));
    }
    None
}

/// Whether an Anthropic request asks for extended thinking: its `thinking` is
/// `{"type":"enabled",…}` or `{"type":"adaptive"}` (absent or `disabled`: no thinking).
fn asks_for_thinking(body: &Value) -> bool {
    matches!(
        body["thinking"]["type"].as_str(),
        Some("enabled" | "adaptive")
    )
}

/// The models that take `thinking: {"type":"adaptive"}` (platform.claude.com "Adaptive
/// thinking": Claude Opus 4.6, Sonnet 4.6 and later), by name prefix.
const ADAPTIVE_MODELS: &[&str] = &["claude-opus-4-6", "claude-sonnet-4-6", "claude-opus-4-7"];

/// The models that take only adaptive thinking (Claude Opus 4.7: "`thinking.type.enabled` is
/// not supported for this model").
const ADAPTIVE_ONLY_MODELS: &[&str] = &["claude-opus-4-7"];

/// Anthropic's rules on the `thinking` parameter and what it excludes (platform.claude.com
/// "Building with extended thinking", "Adaptive thinking" and "Thinking troubleshooting"):
/// * `thinking.type` is `enabled`, `disabled` or `adaptive`;
/// * `enabled` carries `budget_tokens` of at least 1,024 ("thinking.enabled.budget_tokens:
///   Input should be greater than or equal to 1024") and below `max_tokens` ("`max_tokens` must
///   be greater than `thinking.budget_tokens`"), and is refused by an adaptive-only model;
/// * `adaptive` only on a model that takes it ("adaptive thinking is not supported on this
///   model"), its effort in `output_config.effort`;
/// * with thinking on: `temperature` absent or 1, no `top_k`, and no `tool_choice` that forces
///   tool use (`any` or `tool`; "Thinking may not be enabled when tool_choice forces tool use").
fn anthropic_thinking_rules(body: &Value) -> Broken {
    let thinking = body.get("thinking")?;
    let model = body["model"].as_str().unwrap_or("");
    let is = |list: &[&str]| list.iter().any(|m| model.starts_with(m));
    match thinking["type"].as_str() {
        Some("disabled") => return None,
        Some("enabled") => {
            if is(ADAPTIVE_ONLY_MODELS) {
                return Some((
                    "\"thinking.type.enabled\" is not supported for this model. Use \"thinking.type.adaptive\" and \"output_config.effort\" to control thinking behavior.".into(),
                    "no budget on an adaptive-only model",
                ));
            }
            let budget = thinking["budget_tokens"].as_u64().unwrap_or(0);
            if budget < 1024 {
                return Some((
                    "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
                        .into(),
                    "a budget of at least 1024",
                ));
            }
            if budget >= body["max_tokens"].as_u64().unwrap_or(0) {
                return Some((
                    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size".into(),
                    "a budget below max_tokens",
                ));
            }
        }
        Some("adaptive") => {
            if !is(ADAPTIVE_MODELS) {
                return Some((
                    "adaptive thinking is not supported on this model".into(),
                    "adaptive only where the model takes it",
                ));
            }
            let effort = body["output_config"]["effort"].as_str();
            if effort.is_some_and(|e| !["low", "medium", "high", "max"].contains(&e)) {
                return Some((
                    "output_config.effort: Input should be 'low', 'medium', 'high' or 'max'".into(),
                    "a known effort",
                ));
            }
        }
        _ => {
            return Some((
                "thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'".into(),
                "a known thinking type",
            ));
        }
    }
    if body
        .get("temperature")
        .is_some_and(|t| t.as_f64() != Some(1.0))
    {
        return Some((
            "`temperature` may only be set to 1 when thinking is enabled or in adaptive mode. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#feature-compatibility".into(),
            "temperature 1 while thinking",
        ));
    }
    if body.get("top_k").is_some() {
        return Some((
            "`top_k` is not supported when thinking is enabled. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#feature-compatibility".into(),
            "no top_k while thinking",
        ));
    }
    if matches!(body["tool_choice"]["type"].as_str(), Some("any" | "tool")) {
        return Some((
            "Thinking may not be enabled when tool_choice forces tool use.".into(),
            "no forced tool_choice while thinking",
        ));
    }
    None
}

/// Anthropic Messages rules.
///
/// Always (docs.anthropic.com "Messages" and "Tool use"): the first message is `user`; no
/// empty `content`, no empty text block ("text content blocks must be non-empty"); in a user
/// message `tool_result` blocks come first ("tool_result blocks must come FIRST in the content
/// array").
///
/// With thinking (the request asks for it, [`asks_for_thinking`]; docs.anthropic.com "Building
/// with extended thinking", and the 400s reported
/// in n8n-io/n8n#22550, anthropics/claude-code#20705): when the request continues a tool loop
/// (its last message is a user message of tool results only), the assistant message that opens
/// the current assistant turn (the first one after the last user message with other content)
/// must start with a `thinking` or `redacted_thinking` block; "If an assistant message contains
/// any thinking blocks, the first block must be thinking or redacted_thinking"; "The final block
/// in an assistant message cannot be `thinking`" (tailcallhq/forgecode#2107); a thinking block
/// must come back unmodified (its signature checks its text).
///
/// Without thinking: "When thinking is disabled, an `assistant` message in the final position
/// cannot contain `thinking`" (tailcallhq/forgecode#1853).
fn anthropic_rules(msgs: &[Value], thinking: bool) -> Broken {
    let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
    if msgs.first().is_some_and(|m| m["role"] != "user") {
        return Some((
            "messages: first message must use the \"user\" role".into(),
            "first message",
        ));
    }
    for (i, m) in msgs.iter().enumerate() {
        let b = blocks(m);
        if b.is_empty() && !m["content"].is_string() {
            return Some((
                format!("messages.{i}: all messages must have non-empty content"),
                "non-empty content",
            ));
        }
        for (k, block) in b.iter().enumerate() {
            if block["type"] == "text" && block["text"].as_str().is_none_or(str::is_empty) {
                return Some((
                    format!("messages.{i}.content.{k}.text: text content blocks must be non-empty"),
                    "non-empty text",
                ));
            }
            if block["type"] == "tool_result" && k > 0 && b[k - 1]["type"] != "tool_result" {
                return Some((
                    format!(
                        "messages.{i}: tool_result blocks must come first in the content array"
                    ),
                    "tool_result first",
                ));
            }
            if block["type"] == "thinking" {
                let text = block["thinking"].as_str().unwrap_or("");
                if block["signature"].as_str() != Some(signature(text).as_str()) {
                    return Some((
                        format!(
                            "messages.{i}.content.{k}: Invalid `signature` in `thinking` block"
                        ),
                        "thinking replayed unmodified",
                    ));
                }
            }
        }
        if m["role"] == "assistant" {
            let kinds: Vec<&str> = b.iter().filter_map(|x| x["type"].as_str()).collect();
            let has_thinking = kinds
                .iter()
                .any(|k| *k == "thinking" || *k == "redacted_thinking");
            if has_thinking && !matches!(kinds.first(), Some(&("thinking" | "redacted_thinking"))) {
                return Some((
                    format!(
                        "messages.{i}.content.0: If an assistant message contains any thinking blocks, the first block must be thinking or redacted_thinking. Found {}.",
                        kinds.first().unwrap_or(&"nothing")
                    ),
                    "thinking first",
                ));
            }
            if matches!(kinds.last(), Some(&"thinking")) {
                return Some((
                    format!(
                        "messages.{i}: The final block in an assistant message cannot be `thinking`."
                    ),
                    "thinking not last",
                ));
            }
            if !thinking && has_thinking && i + 1 == msgs.len() {
                return Some((
                    format!(
                        "messages.{i}.content.0: When thinking is disabled, an `assistant` message in the final position cannot contain `thinking`. To use thinking blocks, enable `thinking` in your request."
                    ),
                    "no thinking in a final assistant message",
                ));
            }
        }
    }
    if !thinking {
        return None;
    }
    let only_results = |m: &Value| {
        m["role"] == "user" && {
            let b = blocks(m);
            !b.is_empty() && b.iter().all(|x| x["type"] == "tool_result")
        }
    };
    if !msgs.last().is_some_and(only_results) {
        return None;
    }
    let start = msgs
        .iter()
        .rposition(|m| m["role"] == "user" && !only_results(m))
        .map_or(0, |i| i + 1);
    let offset = msgs[start..]
        .iter()
        .position(|m| m["role"] == "assistant")?;
    let first = &msgs[start + offset];
    let kind = blocks(first)
        .first()
        .and_then(|b| b["type"].as_str().map(str::to_string))
        .unwrap_or_default();
    if kind == "thinking" || kind == "redacted_thinking" {
        return None;
    }
    Some((
        format!(
            "messages.{}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{kind}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking",
            start + offset
        ),
        "thinking opens the tool loop",
    ))
}

/// Anthropic's server-tool rules (platform.claude.com "Server tools", the server-side loop and
/// `pause_turn`), on assistant messages:
/// * a `server_tool_use` (or `mcp_tool_use`) block needs its result block (`web_search_tool_result`,
///   `web_fetch_tool_result`, … naming its id in `tool_use_id`) after it in the same message:
///   "messages.1: `web_search` tool use with id `srvtoolu_…` was found without a corresponding
///   `web_search_tool_result` block" (anthropics/anthropic-sdk-python#961, #1339;
///   gsd-build/gsd-2#2869) — except in the final message: a paused turn sent back to be
///   continued may end in a search that has not run yet ("the paused assistant turn just has to
///   stay the last message when you resubmit", #1339);
/// * a result block needs its use before it: "unexpected `tool_use_id` found in
///   `…_tool_result` blocks: … Each `…_tool_result` block must have a corresponding
///   `server_tool_use` block before it." (anthropics/claude-code#62577).
fn server_tool_rules(msgs: &[Value]) -> Broken {
    for (i, m) in msgs.iter().enumerate() {
        if m["role"] != "assistant" {
            continue;
        }
        let mut open: Vec<(&str, &str)> = Vec::new();
        for (k, b) in m["content"].as_array().into_iter().flatten().enumerate() {
            let kind = b["type"].as_str().unwrap_or("");
            let id = b["id"].as_str().unwrap_or("");
            if kind == "server_tool_use" || kind == "mcp_tool_use" {
                open.push((id, b["name"].as_str().unwrap_or("")));
            } else if kind.ends_with("_tool_result") {
                let used = b["tool_use_id"].as_str().unwrap_or("");
                let Some(at) = open.iter().position(|(o, _)| *o == used) else {
                    return Some((
                        format!(
                            "messages.{i}.content.{k}: unexpected `tool_use_id` found in `{kind}` blocks: {used}. Each `{kind}` block must have a corresponding `server_tool_use` block before it."
                        ),
                        "server tool result after its use",
                    ));
                };
                open.remove(at);
            }
        }
        if let Some((id, name)) = open.first()
            && i + 1 < msgs.len()
        {
            return Some((
                format!(
                    "messages.{i}: `{name}` tool use with id `{id}` was found without a corresponding `{name}_tool_result` block"
                ),
                "server tool use with its result",
            ));
        }
    }
    None
}

/// The paused responses (`stop_reason: "pause_turn"`) an Anthropic profile served, as content
/// blocks (SPEC L13, case C69). "Pass the paused response back as-is in a subsequent request
/// to let Claude continue its turn" (platform.claude.com "Server tools"); its server-tool
/// blocks carry encrypted content the API reads back. So a paused turn comes back unchanged:
/// every later request that holds it (the assistant message with its first block's `id`)
/// has its blocks, verbatim (`cache_control` aside), at the start of that message.
#[derive(Debug, Default)]
pub struct PausedTurns(Mutex<Vec<Vec<Value>>>);

impl PausedTurns {
    /// Remembers `reply` when it is a paused Anthropic response.
    pub fn served(&self, reply: &Reply) {
        if let Some(blocks) = paused_blocks(&reply.sse_pieces_for(Wire::Anthropic).concat())
            && let Ok(mut turns) = self.0.lock()
        {
            turns.push(blocks);
        }
    }

    /// The rule a request breaks: a paused turn it holds, changed.
    pub fn check(&self, msgs: &[Value]) -> Broken {
        let turns = self.0.lock().ok()?;
        for turn in turns.iter() {
            let Some(id) = turn.iter().find_map(|b| b["id"].as_str()) else {
                continue;
            };
            let held = msgs.iter().enumerate().find(|(_, m)| {
                m["role"] == "assistant"
                    && m["content"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|b| b["id"] == id))
            });
            let Some((i, m)) = held else {
                continue;
            };
            let sent: Vec<Value> = m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    let mut b = b.clone();
                    if let Some(o) = b.as_object_mut() {
                        o.remove("cache_control");
                    }
                    b
                })
                .collect();
            if let Some(k) = (0..turn.len()).find(|&k| sent.get(k) != Some(&turn[k])) {
                return Some((
                    format!(
                        "messages.{i}.content.{k}: a paused turn must be sent back as it was returned to be continued"
                    ),
                    "paused turn sent back unchanged",
                ));
            }
        }
        None
    }
}

/// The content blocks of an Anthropic SSE body that ends `pause_turn`, assembled as the API
/// returns them whole: each `content_block_start` block with its `text_delta`,
/// `thinking_delta`, `signature_delta` and `citations_delta` pieces joined in, and its
/// `input_json_delta` pieces parsed into `input`; `None` for any other stop reason.
fn paused_blocks(sse: &str) -> Option<Vec<Value>> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut inputs: std::collections::BTreeMap<usize, String> = std::collections::BTreeMap::new();
    let mut paused = false;
    for data in sse.lines().filter_map(|l| l.strip_prefix("data:")) {
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        let index = event["index"]
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .unwrap_or(0);
        match event["type"].as_str().unwrap_or("") {
            "content_block_start" => {
                if blocks.len() <= index {
                    blocks.resize(index + 1, Value::Null);
                }
                blocks[index] = event["content_block"].clone();
            }
            "content_block_delta" => {
                let Some(block) = blocks.get_mut(index) else {
                    continue;
                };
                let delta = &event["delta"];
                let piece = |field: &str| delta[field].as_str().unwrap_or("").to_owned();
                match delta["type"].as_str().unwrap_or("") {
                    "text_delta" => append(block, "text", &piece("text")),
                    "thinking_delta" => append(block, "thinking", &piece("thinking")),
                    "signature_delta" => append(block, "signature", &piece("signature")),
                    "citations_delta" => {
                        if !block["citations"].is_array() {
                            block["citations"] = json!([]);
                        }
                        if let Some(c) = block["citations"].as_array_mut() {
                            c.push(delta["citation"].clone());
                        }
                    }
                    "input_json_delta" => {
                        inputs
                            .entry(index)
                            .or_default()
                            .push_str(&piece("partial_json"));
                    }
                    _ => {}
                }
            }
            "message_delta" => paused = event["delta"]["stop_reason"] == "pause_turn",
            _ => {}
        }
    }
    for (index, text) in inputs {
        if let (Some(block), Ok(input)) = (blocks.get_mut(index), serde_json::from_str(&text)) {
            block["input"] = input;
        }
    }
    paused.then_some(blocks)
}

/// Appends `piece` to the string field `field` of `block`.
fn append(block: &mut Value, field: &str, piece: &str) {
    let held = block[field].as_str().unwrap_or("").to_owned();
    block[field] = Value::String(held + piece);
}

/// OpenAI reasoning models on Chat Completions reject `max_tokens` (case C41, verbatim body).
fn openai_reasoning_rules(body: &Value) -> Broken {
    body.get("max_tokens").map(|_| {
        (
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.".to_string(),
            "max_completion_tokens",
        )
    })
}

/// OpenAI Responses with `store: false` (platform.openai.com "Reasoning" guide, "encrypted
/// reasoning items"; community reports quoted in docs/dialects.md):
/// * a reasoning item without `encrypted_content` → "Item with id 'rs_…' not found. Items are
///   not persisted when `store` is set to false.";
/// * its `encrypted_content` must be the one issued (the fake checks it against the summary);
/// * "Item 'rs_…' of type 'reasoning' was provided without its required following item.";
/// * `max_tokens` is not a Responses parameter ("Unsupported parameter: 'max_tokens'").
fn responses_rules(body: &Value) -> Broken {
    if body.get("max_tokens").is_some() {
        return Some((
            "Unsupported parameter: 'max_tokens'. In the Responses API, this parameter has moved to 'max_output_tokens'.".into(),
            "max_output_tokens",
        ));
    }
    let items = body["input"].as_array().cloned().unwrap_or_default();
    for (i, item) in items.iter().enumerate() {
        if item["type"] != "reasoning" {
            continue;
        }
        let id = item["id"].as_str().unwrap_or("");
        let Some(enc) = item["encrypted_content"].as_str() else {
            return Some((
                format!(
                    "Item with id '{id}' not found. Items are not persisted when `store` is set to false. Try again with `store` set to `true`, or remove this item from your input."
                ),
                "stateless reasoning needs encrypted_content",
            ));
        };
        let summary: String = item["summary"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["text"].as_str())
            .collect();
        if enc != encrypted(&summary) {
            return Some((
                format!("The encrypted content for item {id} could not be verified."),
                "reasoning replayed unmodified",
            ));
        }
        if items
            .get(i + 1)
            .is_none_or(|next| next["type"] == "reasoning")
        {
            return Some((
                format!(
                    "Item '{id}' of type 'reasoning' was provided without its required following item."
                ),
                "reasoning followed by its item",
            ));
        }
    }
    None
}

/// Strict alternation (vLLM / llama.cpp `--jinja` serving Mistral's or Gemma's chat template,
/// and `mistral_common`'s request validator used by Mistral's API and vLLM's mistral tokenizer
/// mode):
/// * the Mistral v0.3 template: after the optional system message, the messages that are
///   neither `tool` results nor assistant messages with `tool_calls` must alternate
///   user/assistant starting with user, else "After the optional system message, conversation
///   roles must alternate user/assistant/user/assistant/..." (crush#279, Ministral);
/// * `mistral_common` `_validate_message_order`: after `tool` only `assistant` or `tool`
///   ("Unexpected role 'user' after role 'tool'", zed#37021, mistral-vibe#578).
///
/// Not enforced: `mistral_common`'s 9-character alphanumeric tool-call ids (V3+ tokenizers);
/// vLLM rewrites ids for Mistral models, and SPEC H6 fixes the hook ids' form.
fn strict_alternation_rules(msgs: &[Value]) -> Broken {
    let start = usize::from(msgs.first().is_some_and(|m| m["role"] == "system"));
    let mut expect_user = true;
    for m in &msgs[start..] {
        if m["role"] == "tool" || (m["role"] == "assistant" && m.get("tool_calls").is_some()) {
            continue;
        }
        let is_user = m["role"] == "user";
        if is_user != expect_user {
            return Some((
                "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...".into(),
                "template alternation",
            ));
        }
        expect_user = !expect_user;
    }
    for w in msgs.windows(2) {
        if w[0]["role"] == "tool" && w[1]["role"] != "assistant" && w[1]["role"] != "tool" {
            return Some((
                format!(
                    "Unexpected role '{}' after role 'tool'",
                    w[1]["role"].as_str().unwrap_or("")
                ),
                "assistant after tool",
            ));
        }
    }
    None
}

/// DeepSeek thinking mode (api-docs.deepseek.com/guides/thinking_mode, "Tool calls"): "between
/// two user messages, if the model performed a tool call, the intermediate assistant's
/// `reasoning_content` must participate in the context concatenation and must be passed back";
/// the 400 reads "The `reasoning_content` in the thinking mode must be passed back to the API."
/// (earlier: "Missing `reasoning_content` field in the assistant message at message index N",
/// openai/openai-agents-python#2155).
fn deepseek_rules(msgs: &[Value]) -> Broken {
    let mut start = 0;
    for end in 0..=msgs.len() {
        if end < msgs.len() && msgs[end]["role"] != "user" {
            continue;
        }
        let segment = &msgs[start..end];
        if segment.iter().any(|m| m.get("tool_calls").is_some()) {
            for (k, m) in segment.iter().enumerate() {
                if m["role"] == "assistant" && !m["reasoning_content"].is_string() {
                    return Some((
                        format!(
                            "The `reasoning_content` in the thinking mode must be passed back to the API. (assistant message at index {})",
                            start + k
                        ),
                        "reasoning_content passed back",
                    ));
                }
            }
        }
        start = end + 1;
    }
    None
}

/// Where a dialect trial collects the rules the agent broke.
pub type Violations = Arc<Mutex<Vec<String>>>;

impl FakeLlm {
    /// A fake LLM speaking `dialect`: every request is checked first (a broken rule gets the
    /// server's 400, is recorded in `violations` and is not one of the scenario's requests;
    /// the Anthropic profiles also check the paused turns they served, [`PausedTurns`]);
    /// `InBandErrors` answers the first attempt of every request body with an in-band error;
    /// then `handler` answers (its index counts the scenario's requests only) and the reply is
    /// styled the dialect's way.
    pub fn dialect(
        dialect: Dialect,
        violations: Violations,
        handler: impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let seen: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
        let errors = AtomicUsize::new(0);
        let paused = PausedTurns::default();
        let anthropic = dialect.wire() == Wire::Anthropic;
        let mut llm = FakeLlm::with_handler(move |i, req| {
            let verdict = dialect.check(req).and_then(|()| {
                match paused.check(&req.messages()).filter(|_| anthropic) {
                    Some((message, rule)) => Err(dialect.reject(&message, rule)),
                    None => Ok(()),
                }
            });
            if let Err(rejection) = verdict {
                if let Ok(mut v) = violations.lock() {
                    v.push(rejection.rule.clone());
                }
                return Reply::status(rejection.status, vec![], rejection.body).uncounted();
            }
            if dialect == Dialect::InBandErrors {
                let first = seen
                    .lock()
                    .map(|mut s| s.insert(req.body.to_string()))
                    .unwrap_or(false);
                if first {
                    let n = errors.fetch_add(1, Ordering::SeqCst);
                    return Reply::raw_sse(Dialect::in_band_error(n)).uncounted();
                }
            }
            let reply = dialect.style(handler(i, req), req, i);
            if anthropic {
                paused.served(&reply);
            }
            reply
        });
        llm.dialect = Some(dialect);
        llm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(wire: Wire, body: Value) -> RecordedRequest {
        RecordedRequest {
            method: "POST".into(),
            path: wire.path().into(),
            headers: Vec::new(),
            body,
            received_at: std::time::Instant::now(),
        }
    }

    #[test]
    fn anthropic_thinking_rejects_a_tool_loop_whose_turn_does_not_start_with_thinking() {
        let text = "Everything is done, I think.";
        let good = json!({"model": "claude-sonnet-4-5", "max_tokens": 32768,
            "thinking": {"type": "enabled", "budget_tokens": 16384}, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "finish"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": text, "signature": signature(text)},
                {"type": "text", "text": "All done."},
                {"type": "tool_use", "id": "h1", "name": "h___Stop", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "h1", "content": "x"}]}
        ]});
        assert_eq!(
            Dialect::AnthropicThinking.check(&req(Wire::Anthropic, good.clone())),
            Ok(())
        );
        // C39 as it was: the thinking block dropped.
        let mut dropped = good.clone();
        dropped["messages"][1]["content"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        let err = Dialect::AnthropicThinking
            .check(&req(Wire::Anthropic, dropped.clone()))
            .unwrap_err();
        assert!(err.body.contains("Expected `thinking`"), "{err:?}");
        // Thinking is what the request asks for, whichever Anthropic profile answers it.
        let err = Dialect::Anthropic
            .check(&req(Wire::Anthropic, dropped.clone()))
            .unwrap_err();
        assert!(err.body.contains("Expected `thinking`"), "{err:?}");
        let mut off = dropped;
        off.as_object_mut().unwrap().remove("thinking");
        for d in [Dialect::Anthropic, Dialect::AnthropicThinking] {
            assert_eq!(d.check(&req(Wire::Anthropic, off.clone())), Ok(()));
        }
        // A changed signature.
        let mut changed = good;
        changed["messages"][1]["content"][0]["thinking"] = json!("edited");
        assert!(
            Dialect::AnthropicThinking
                .check(&req(Wire::Anthropic, changed))
                .unwrap_err()
                .rule
                .contains("unmodified")
        );
    }

    #[test]
    fn anthropic_enforces_the_thinking_budget_the_adaptive_models_and_what_thinking_excludes() {
        let base = json!({"model": "claude-sonnet-4-5", "max_tokens": 4096,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [{"role": "user", "content": "go"}]});
        let rule = |body: &Value| {
            Dialect::Anthropic
                .check(&req(Wire::Anthropic, body.clone()))
                .err()
                .map(|e| e.rule)
        };
        assert_eq!(rule(&base), None);
        let with = |path: &[&str], v: Value| {
            let mut b = base.clone();
            let (last, head) = path.split_last().unwrap();
            let mut at = &mut b;
            for k in head {
                at = &mut at[*k];
            }
            at[*last] = v;
            b
        };
        let cases = [
            (
                with(&["thinking", "budget_tokens"], json!(1000)),
                "at least 1024",
            ),
            (
                with(&["thinking", "budget_tokens"], json!(4096)),
                "below max_tokens",
            ),
            (
                with(&["thinking", "type"], json!("on")),
                "a known thinking type",
            ),
            (with(&["temperature"], json!(0.2)), "temperature 1"),
            (with(&["top_k"], json!(5)), "no top_k"),
            (
                with(&["tool_choice"], json!({"type": "any"})),
                "forced tool_choice",
            ),
            (
                with(&["tool_choice"], json!({"type": "tool", "name": "f"})),
                "forced tool_choice",
            ),
            (with(&["model"], json!("claude-opus-4-7")), "adaptive-only"),
            (
                with(&["thinking"], json!({"type": "adaptive"})),
                "adaptive only where",
            ),
        ];
        for (body, expected) in cases {
            let got = rule(&body).unwrap_or_default();
            assert!(got.contains(expected), "{expected}: {got:?} for {body}");
        }
        // Allowed: temperature 1, tool_choice auto, adaptive on a model that takes it, and
        // anything at all with thinking disabled.
        assert_eq!(rule(&with(&["temperature"], json!(1))), None);
        assert_eq!(rule(&with(&["tool_choice"], json!({"type": "auto"}))), None);
        let mut adaptive = with(&["model"], json!("claude-sonnet-4-6"));
        adaptive["thinking"] = json!({"type": "adaptive"});
        adaptive["output_config"] = json!({"effort": "high"});
        assert_eq!(rule(&adaptive), None);
        adaptive["output_config"] = json!({"effort": "extreme"});
        assert!(
            rule(&adaptive)
                .unwrap_or_default()
                .contains("a known effort")
        );
        let mut off = with(&["thinking"], json!({"type": "disabled"}));
        off["temperature"] = json!(0.2);
        off["top_k"] = json!(5);
        off["tool_choice"] = json!({"type": "any"});
        assert_eq!(rule(&off), None);
    }

    /// A paused response: a search (input streamed), its result, text with a citation.
    const PAUSED: &str = concat!(
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}"#,
        "\n\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": "}}"#,
        "\n\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\"q\"}"}}"#,
        "\n\n",
        r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[]}}"#,
        "\n\n",
        r#"data: {"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"Found "}}"#,
        "\n\n",
        r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","cited_text":"c"}}}"#,
        "\n\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"pause_turn"}}"#,
        "\n\n",
    );

    #[test]
    fn anthropic_rejects_an_unanswered_server_tool_use_and_a_changed_paused_turn() {
        let search = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                            "input": {"query": "q"}});
        let result = json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                            "content": []});
        let user = |t: &str| json!({"role": "user", "content": [{"type": "text", "text": t}]});
        let asst = |content: Value| json!({"role": "assistant", "content": content});
        let check = |d: Dialect, msgs: Vec<Value>| {
            d.check(&req(Wire::Anthropic, json!({"messages": msgs})))
        };
        let text = json!({"type": "text", "text": "a"});
        let paired = asst(json!([search, result, text]));
        assert_eq!(
            check(Dialect::Anthropic, vec![user("q"), paired, user("more")]),
            Ok(())
        );
        // A search that has not run yet is taken only in the final message (a paused turn).
        let unpaired = asst(json!([search]));
        assert_eq!(
            check(Dialect::Anthropic, vec![user("q"), unpaired.clone()]),
            Ok(())
        );
        let err = check(Dialect::Anthropic, vec![user("q"), unpaired, user("more")]).unwrap_err();
        assert!(
            err.body.contains("messages.1: `web_search` tool use with id `srvtoolu_1` was found without a corresponding `web_search_tool_result` block"),
            "{err:?}"
        );
        let err = check(
            Dialect::AnthropicThinking,
            vec![user("q"), asst(json!([result]))],
        )
        .unwrap_err();
        assert!(err.body.contains("unexpected `tool_use_id`"), "{err:?}");

        let paused = PausedTurns::default();
        paused.served(&Reply::raw_sse(PAUSED));
        let citation = json!([{"type": "web_search_result_location", "cited_text": "c"}]);
        let turn =
            json!([search, result, {"type": "text", "text": "Found ", "citations": citation}]);
        assert_eq!(paused.check(&[user("q"), asst(turn.clone())]), None);
        // Later: the continuation joined, a cache breakpoint on it: still the same turn.
        let mut later = turn.clone();
        later[2]["cache_control"] = json!({"type": "ephemeral"});
        later
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "text", "text": "it."}));
        assert_eq!(paused.check(&[user("q"), asst(later), user("next")]), None);
        // Changed: the citation dropped, or the text edited.
        for (field, value) in [("citations", Value::Null), ("text", json!("Found"))] {
            let mut changed = turn.clone();
            changed[2][field] = value;
            let (message, rule) = paused.check(&[user("q"), asst(changed)]).unwrap();
            assert!(message.starts_with("messages.1.content.2: "), "{message}");
            assert_eq!(rule, "paused turn sent back unchanged");
        }
        // A response that ends otherwise is not a paused turn.
        let ended = PausedTurns::default();
        ended.served(&Reply::raw_sse(PAUSED.replace("pause_turn", "end_turn")));
        assert_eq!(
            ended.check(&[user("q"), asst(json!([search, result]))]),
            None
        );
    }

    #[test]
    fn anthropic_rejects_unknown_fields_five_breakpoints_and_a_marked_thinking_block() {
        let mark = json!({"type": "ephemeral"});
        let text = |t: &str| json!({"type": "text", "text": t, "cache_control": mark});
        let four = json!({"model": "m", "max_tokens": 8, "stream": true,
            "system": [text("s")],
            "messages": [
                {"role": "user", "content": [text("a")]},
                {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
                {"role": "user", "content": [text("c"), text("d")]}]});
        for d in [Dialect::Anthropic, Dialect::AnthropicThinking] {
            assert_eq!(d.check(&req(Wire::Anthropic, four.clone())), Ok(()));
            let mut five = four.clone();
            five["messages"][1]["content"][0]["cache_control"] = mark.clone();
            let err = d.check(&req(Wire::Anthropic, five)).unwrap_err();
            assert!(
                err.body
                    .contains("A maximum of 4 blocks with cache_control"),
                "{err:?}"
            );
            let mut key = four.clone();
            key["prompt_cache_key"] = json!("sess_1");
            let err = d.check(&req(Wire::Anthropic, key)).unwrap_err();
            assert!(
                err.body
                    .contains("prompt_cache_key: Extra inputs are not permitted"),
                "{err:?}"
            );
            let mut long = four.clone();
            long["system"][0]["cache_control"] = json!({"type": "persistent"});
            assert!(d.check(&req(Wire::Anthropic, long)).is_err());
        }
        let sig = signature("t");
        let marked_thinking = json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": sig, "cache_control": mark},
                {"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "x"}]}]});
        let err = Dialect::AnthropicThinking
            .check(&req(Wire::Anthropic, marked_thinking))
            .unwrap_err();
        assert!(err.rule.contains("no cache_control on thinking"), "{err:?}");
    }

    #[test]
    fn openai_profiles_reject_fields_openai_does_not_know_and_take_prompt_cache_key() {
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "go"}],
            "stream": true, "max_completion_tokens": 5, "prompt_cache_key": "sess_1"});
        assert_eq!(
            Dialect::OpenAiReasoning.check(&req(Wire::Chat, chat.clone())),
            Ok(())
        );
        let mut bad = chat;
        bad["thinking"] = json!({"type": "enabled"});
        let err = Dialect::OpenAiReasoning
            .check(&req(Wire::Chat, bad))
            .unwrap_err();
        assert!(
            err.body
                .contains("Unrecognized request argument supplied: thinking"),
            "{err:?}"
        );
        let responses = json!({"model": "m", "input": [], "stream": true, "store": false,
            "max_output_tokens": 5, "prompt_cache_key": "sess_1"});
        assert_eq!(
            Dialect::OpenAiResponsesReasoning.check(&req(Wire::Responses, responses.clone())),
            Ok(())
        );
        let mut bad = responses;
        bad["cache_control"] = json!({"type": "ephemeral"});
        let err = Dialect::OpenAiResponsesReasoning
            .check(&req(Wire::Responses, bad))
            .unwrap_err();
        assert!(
            err.body.contains("Unknown parameter: 'cache_control'."),
            "{err:?}"
        );
        // Servers that ignore what they do not know.
        let lenient = json!({"model": "m", "messages": [{"role": "user", "content": "go"}],
            "anything": 1});
        for d in [
            Dialect::Ollama,
            Dialect::DeepSeek,
            Dialect::StrictAlternation,
            Dialect::InBandErrors,
        ] {
            assert_eq!(d.check(&req(Wire::Chat, lenient.clone())), Ok(()), "{d:?}");
        }
    }

    #[test]
    fn strict_alternation_rejects_two_assistants_and_user_after_tool() {
        let two = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "All done."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "h", "type": "function", "function": {"name": "h___Stop", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "h", "content": "x"},
            {"role": "assistant", "content": "Fixed."},
            {"role": "user", "content": "next"}
        ]});
        // The template filters the tool_calls message out: assistant, assistant → rejected.
        assert!(
            Dialect::StrictAlternation
                .check(&req(Wire::Chat, two))
                .unwrap_err()
                .body
                .contains("must alternate")
        );
        let after_tool = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "x"},
            {"role": "user", "content": "next"}
        ]});
        assert!(
            Dialect::StrictAlternation
                .check(&req(Wire::Chat, after_tool))
                .is_err()
        );
    }

    #[test]
    fn deepseek_and_responses_and_openai_reasoning_rules_fire() {
        let missing = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "x"}
        ]});
        assert!(Dialect::DeepSeek.check(&req(Wire::Chat, missing)).is_err());
        let with_max_tokens =
            json!({"messages": [{"role": "user", "content": "go"}], "max_tokens": 5});
        let err = Dialect::OpenAiReasoning
            .check(&req(Wire::Chat, with_max_tokens))
            .unwrap_err();
        assert!(err.body.contains("max_completion_tokens"), "{err:?}");
        let bare = json!({"input": [{"role": "user", "content": "go"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}]});
        assert!(
            Dialect::OpenAiResponsesReasoning
                .check(&req(Wire::Responses, bare))
                .unwrap_err()
                .body
                .contains("not persisted")
        );
    }
}
