//! The provider routes behind one seam (SPEC L6–L8; docs/architecture.md, "Adding a provider
//! route"). A route is what [`ProviderRoute`] says: it writes the request of one call, reads
//! its streamed answer, reacts to an HTTP error of its own (before the route-neutral handling
//! of `status.rs`) and learns from an answer. [`route`] gives the route of a
//! [`ProviderKind`], the one list of routes (`ProviderKind::ALL`) that the dispatch, the
//! core's route tests, the fuzz targets and the fake LLM's routes all follow. [`Learned`] is
//! what the routes learned while the process runs.

use super::request::BodyCache;
use super::{HttpRequest, LlmRequest, LlmResponse, StreamDecoder};
use crate::config::{Config, ProviderKind};

/// One provider route: Anthropic Messages (`anthropic.rs`), Chat Completions
/// (`openai_chat.rs`) or Responses (`openai_responses.rs`).
pub(crate) trait ProviderRoute: Sync {
    /// The HTTP request of one LLM call: `req` written this route's way for the endpoint of
    /// `cfg` (`base_url`, key, version), with what the route learned so far (`learned`).
    /// Through `cache`, the serialized prefix of `req.messages` kept from the history's
    /// earlier requests (`History`, history.rs), only the messages new since then are
    /// serialized; the bytes are the same as without it (issue #15).
    fn build_request(
        &self,
        cfg: &Config,
        req: &LlmRequest<'_>,
        learned: &Learned,
        cache: Option<&mut BodyCache>,
    ) -> HttpRequest;

    /// A fresh decoder of one streamed answer; `id_prefix` makes synthesised tool-call ids
    /// unique (case C21).
    fn decoder(&self, id_prefix: String) -> Box<dyn StreamDecoder>;

    /// The route's own reaction to a failed status (`status`, the first 4 KiB of `body`) of
    /// a request it built for `model` with `learned`, which it may update; `None` leaves the
    /// failure to the route-neutral handling (SPEC L5: retry, auth, context too long, fatal).
    fn on_http_error(
        &self,
        _cfg: &Config,
        _model: &str,
        _status: u16,
        _body: &[u8],
        _learned: &mut Learned,
    ) -> Option<ErrorReaction> {
        None
    }

    /// What the route learns from a whole answer of a round (kept for the process).
    fn on_response(&self, _resp: &LlmResponse, _learned: &mut Learned) {}
}

/// The route of `kind`.
#[must_use]
pub(crate) fn route(kind: ProviderKind) -> &'static dyn ProviderRoute {
    match kind {
        ProviderKind::Anthropic => &super::anthropic::AnthropicMessages,
        ProviderKind::OpenAiChat => &super::openai_chat::ChatCompletions,
        ProviderKind::OpenAiResponses => &super::openai_responses::Responses,
    }
}

/// What a route does about an HTTP error of its own ([`ProviderRoute::on_http_error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ErrorReaction {
    /// The route changed what it sends (in [`Learned`]): the same attempt is sent again at
    /// once, not counted as a retry, after one WARN line `warn`. The route must not answer the
    /// same way to the request it now builds (no loop).
    Resend {
        /// The WARN line (no secrets, no requirement ids).
        warn: String,
    },
}

/// What the agent learned about its provider while running; kept for the life of the process
/// (the provider is configured once per process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Learned {
    /// A Chat Completions 400 named `max_completion_tokens` (SPEC L7, case C41): the output cap
    /// is sent under that name from now on.
    pub max_completion_tokens: bool,
    /// The Chat server streamed `reasoning_content` (DeepSeek-style reasoning, SPEC L10): every
    /// assistant message carries the field from now on, including the ones the agent writes.
    pub reasoning_content: bool,
}

/// Whether `model` is one of OpenAI's reasoning models (`o1`, `o3`, `o4-mini`, `gpt-5`, …,
/// with or without a gateway prefix such as `openai/`), which reject `max_tokens` on Chat
/// Completions (SPEC L7, case C41).
#[must_use]
pub(crate) fn is_openai_reasoning_model(model: &str) -> bool {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    let o_series = ["o1", "o3", "o4"]
        .iter()
        .any(|p| name == *p || name.strip_prefix(p).is_some_and(|r| r.starts_with('-')));
    o_series || name.starts_with("gpt-5")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{Message, StreamDelta};

    /// The URL a route posts to at `http://h/`, and the shortest body it takes as a whole
    /// answer.
    fn route_facts(kind: ProviderKind) -> (&'static str, &'static str) {
        match kind {
            ProviderKind::Anthropic => (
                "http://h/v1/messages",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
            ProviderKind::OpenAiChat => (
                "http://h/chat/completions",
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
            ),
            ProviderKind::OpenAiResponses => (
                "http://h/responses",
                "data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n",
            ),
        }
    }

    #[test]
    fn l6_l7_l8_every_route_is_dispatched() {
        let messages = [Message::User { text: "hi".into() }];
        let req = LlmRequest {
            model: "m",
            system: None,
            messages: &messages,
            tools: &[],
            max_output_tokens: 8,
        };
        for kind in ProviderKind::ALL {
            let (url, body) = route_facts(kind);
            let cfg = Config::for_tests(kind, "http://h/");
            let r = route(kind);
            assert_eq!(
                r.build_request(&cfg, &req, &Learned::default(), None).url,
                url
            );
            let mut decoder = r.decoder("call_1".into());
            let mut out: Vec<StreamDelta> = Vec::new();
            decoder.feed(body.as_bytes(), &mut out).unwrap();
            assert!(decoder.is_complete(), "{kind:?}");
            assert!(decoder.finish(&mut out).is_ok(), "{kind:?}");
        }
    }

    #[test]
    fn l5_only_the_chat_route_reacts_to_a_400_naming_max_completion_tokens() {
        let body = br#"{"error":{"message":"Use 'max_completion_tokens' instead."}}"#;
        for kind in ProviderKind::ALL {
            let cfg = Config::for_tests(kind, "http://127.0.0.1/v1");
            let mut learned = Learned::default();
            let reaction = route(kind).on_http_error(&cfg, "m", 400, body, &mut learned);
            let chat = kind == ProviderKind::OpenAiChat;
            assert_eq!(reaction.is_some(), chat, "{kind:?}");
            assert_eq!(learned.max_completion_tokens, chat, "{kind:?}");
        }
    }
}
