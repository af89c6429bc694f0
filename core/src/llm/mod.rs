//! Everything about LLM providers (SPEC §8, L5–L10), behind one seam.
//!
//! - `model.rs`: the provider-neutral conversation the loop speaks (`Message`,
//!   `ReasoningBlock`, `ToolCall`, `ToolDef`, `LlmRequest`, `LlmResponse`, `StopKind`,
//!   `Usage`, `StreamDelta`, `StreamError`), the built `HttpRequest` with its `Body`, and the
//!   `StreamDecoder` every route's decoder is.
//! - `route.rs`: the seam: the `ProviderRoute` trait, the route of each `ProviderKind`, what
//!   the routes learn while the process runs.
//! - one module per route, each with its request builder, its stream decoder and its own
//!   reaction to an HTTP error: `anthropic.rs` (Anthropic Messages, L6), `openai_chat.rs`
//!   (Chat Completions, L7), `openai_responses.rs` (Responses, L8).
//! - what the routes share: `request.rs` (the streaming `POST`, the compact-JSON writers, the
//!   cache of a history's serialized prefix), `sse_stream.rs` (the decoder scaffold over the
//!   generic SSE codec `crate::sse`), `status.rs` (the route-neutral handling of a failed
//!   status, the provider's error message, `retry-after`).
//!
//! A new route follows the checklist "Adding a provider route" in docs/architecture.md.

mod anthropic;
mod model;
mod openai_chat;
mod openai_responses;
mod request;
mod route;
mod sse_stream;
mod status;

#[cfg(test)]
pub(crate) use model::decoder_tests;
pub use model::{Body, HttpRequest, Message, ToolCall};
pub(crate) use model::{
    ChatReasoningField, LlmRequest, LlmResponse, PromptCache, ReasoningBlock, StopKind,
    StreamDecoder, StreamDelta, StreamError, TOOL_RESULTS_BRIDGE, ToolDef, Usage, UsageTotals,
};
pub(crate) use request::BodyCache;
pub(crate) use route::{ErrorReaction, Learned, route, route_kind};
pub(crate) use status::{HttpFailure, classify_status, error_message, retry_after_ms};

/// The route modules' own builders and options, for the property tests of the incremental
/// request body (`body_cache_props.rs`) and the test helpers of the history's owners.
#[cfg(test)]
pub(crate) mod builders {
    pub(crate) use super::anthropic::build_request_cached as anthropic;
    pub(crate) use super::openai_chat::{ChatOptions, build_request_cached as chat};
    pub(crate) use super::openai_responses::{ResponsesOptions, build_request_cached as responses};
}
