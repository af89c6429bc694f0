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
    /// An OpenAI route's server rejected `prompt_cache_key` (SPEC L11): it is not sent again.
    pub no_prompt_cache_key: bool,
}

/// Whether the OpenAI routes may send `prompt_cache_key` to the configured endpoint (SPEC
/// L11): as `OPENAI_COMPAT_PROMPT_CACHE_KEY` says, by default only to OpenAI's own API (other
/// OpenAI-compatible servers may reject a field they do not know), and never again once the
/// server rejected it.
#[must_use]
pub(crate) fn sends_prompt_cache_key(cfg: &Config, learned: &Learned) -> bool {
    let endpoint_takes_it = cfg
        .prompt_cache_key
        .unwrap_or_else(|| cfg.base_url.contains("://api.openai.com"));
    endpoint_takes_it && !learned.no_prompt_cache_key
}

/// Whether a failed request names an optional `field` it carried, as a server that does not
/// take the field answers (OpenAI: 400 "Unrecognized request argument supplied: …"; pydantic
/// validators such as Mistral's: 422 "Extra inputs are not permitted").
#[must_use]
pub(crate) fn rejects_field(status: u16, body: &[u8], field: &str) -> bool {
    matches!(status, 400 | 422) && String::from_utf8_lossy(body).contains(field)
}

/// The reaction to a server that rejected `prompt_cache_key` (SPEC L11) on an OpenAI route:
/// never sent again, the attempt sent again without it, one WARN.
pub(crate) fn drop_prompt_cache_key(learned: &mut Learned) -> ErrorReaction {
    learned.no_prompt_cache_key = true;
    ErrorReaction::Resend {
        warn: "llm: the server does not take prompt_cache_key; sending requests without it from now on".into(),
    }
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
            cache: None,
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

    /// The body of a one-message request on `kind` at `base_url`, with prompt caching on
    /// (`cached`) and what the route learned.
    fn body_on(
        kind: ProviderKind,
        cfg: &Config,
        cached: bool,
        learned: &Learned,
    ) -> serde_json::Value {
        let messages = [Message::User { text: "hi".into() }];
        let req = LlmRequest {
            model: "m",
            system: None,
            messages: &messages,
            tools: &[],
            max_output_tokens: 8,
            cache: cached.then_some(crate::llm::PromptCache {
                key: "sess_7",
                previous_len: None,
            }),
        };
        let body = route(kind)
            .build_request(cfg, &req, learned, None)
            .body
            .to_vec();
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn l11_the_openai_routes_send_the_session_key_only_where_the_endpoint_takes_it() {
        let none = Learned::default();
        for kind in [ProviderKind::OpenAiChat, ProviderKind::OpenAiResponses] {
            let openai = Config::for_tests(kind, "https://api.openai.com/v1");
            let local = Config::for_tests(kind, "http://127.0.0.1:8000/v1");
            assert_eq!(
                body_on(kind, &openai, true, &none)["prompt_cache_key"],
                "sess_7"
            );
            // Not OpenAI's own API: a server that may not know the field does not get it.
            assert!(
                body_on(kind, &local, true, &none)
                    .get("prompt_cache_key")
                    .is_none()
            );
            // Caching off (or a summary call): no key anywhere.
            assert!(
                body_on(kind, &openai, false, &none)
                    .get("prompt_cache_key")
                    .is_none()
            );
            // The operator's word wins over the endpoint's.
            let forced = Config {
                prompt_cache_key: Some(true),
                ..local.clone()
            };
            assert_eq!(
                body_on(kind, &forced, true, &none)["prompt_cache_key"],
                "sess_7"
            );
            let never = Config {
                prompt_cache_key: Some(false),
                ..openai.clone()
            };
            assert!(
                body_on(kind, &never, true, &none)
                    .get("prompt_cache_key")
                    .is_none()
            );
            // Once the server rejected it, never again.
            let rejected = Learned {
                no_prompt_cache_key: true,
                ..Learned::default()
            };
            assert!(
                body_on(kind, &openai, true, &rejected)
                    .get("prompt_cache_key")
                    .is_none()
            );
        }
        // Anthropic has no such field: its cache works by breakpoints.
        let anthropic = Config {
            prompt_cache_key: Some(true),
            ..Config::for_tests(ProviderKind::Anthropic, "http://h")
        };
        let body = body_on(ProviderKind::Anthropic, &anthropic, true, &none);
        assert!(body.get("prompt_cache_key").is_none(), "{body}");
    }

    #[test]
    fn l11_a_server_that_rejects_the_prompt_cache_key_gets_the_attempt_again_without_it() {
        let body =
            br#"{"error":{"message":"Unrecognized request argument supplied: prompt_cache_key"}}"#;
        for kind in [ProviderKind::OpenAiChat, ProviderKind::OpenAiResponses] {
            let cfg = Config::for_tests(kind, "https://api.openai.com/v1");
            let mut learned = Learned::default();
            let r = route(kind);
            let Some(ErrorReaction::Resend { warn }) =
                r.on_http_error(&cfg, "m", 400, body, &mut learned)
            else {
                panic!("{kind:?}: the rejection is handled by the route");
            };
            assert!(warn.contains("prompt_cache_key"), "{warn}");
            assert!(learned.no_prompt_cache_key);
            // Sent without it now, the same answer is the server's own error (no loop).
            assert_eq!(r.on_http_error(&cfg, "m", 400, body, &mut learned), None);
            // A 422 of a pydantic validator names it the same way.
            let mut fresh = Learned::default();
            let extra = br#"{"detail":[{"loc":["body","prompt_cache_key"],"msg":"Extra inputs are not permitted"}]}"#;
            assert!(r.on_http_error(&cfg, "m", 422, extra, &mut fresh).is_some());
            // Not sent to this endpoint: another 400 naming it is not ours to fix.
            let local = Config::for_tests(kind, "http://127.0.0.1:8000/v1");
            let mut untouched = Learned::default();
            assert_eq!(
                r.on_http_error(&local, "m", 400, body, &mut untouched),
                None
            );
            assert!(!untouched.no_prompt_cache_key);
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
