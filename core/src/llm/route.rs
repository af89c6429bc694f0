//! The provider routes behind one seam (SPEC L6–L8; docs/architecture.md, "Adding a provider
//! route"). A route is what [`ProviderRoute`] says: it writes the request of one call, reads
//! its streamed answer, reacts to an HTTP error of its own (before the route-neutral handling
//! of `status.rs`) and learns from an answer. [`route`] gives the route of a
//! [`ProviderKind`], the one list of routes (`ProviderKind::ALL`) that the dispatch, the
//! core's route tests, the fuzz targets and the fake LLM's routes all follow. [`Learned`] is
//! what the routes learned while the process runs.

use super::request::BodyCache;
use super::{HttpRequest, LlmRequest, LlmResponse, StreamDecoder};
use crate::config::{Config, Effort, ProviderKind};

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
    /// a request it built for `model` at `effort` with `learned`, which it may update; `None` leaves the
    /// failure to the route-neutral handling (SPEC L5: retry, auth, context too long, fatal).
    fn on_http_error(
        &self,
        _cfg: &Config,
        _model: &str,
        _effort: Option<Effort>,
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

/// The route a request for `model` goes on: the configured one (`cfg.provider`), except that
/// on Chat Completions a model the server said is served only by the Responses API (SPEC L8;
/// [`Learned::responses_only`]) goes on the Responses route, at the same base URL.
#[must_use]
pub(crate) fn route_kind(cfg: &Config, model: &str, learned: &Learned) -> ProviderKind {
    if cfg.provider == ProviderKind::OpenAiChat && learned.responses_only.iter().any(|m| m == model)
    {
        ProviderKind::OpenAiResponses
    } else {
        cfg.provider
    }
}

/// What a route does about an HTTP error of its own ([`ProviderRoute::on_http_error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ErrorReaction {
    /// The route changed what it sends (in [`Learned`]; possibly the route itself, see
    /// [`route_kind`]): the same attempt is sent again at once, not counted as a retry, after
    /// one WARN line `warn` and, with `notice`, that sentence shown to the session's client as
    /// a warning notice. The route must not answer the same way to the request it now builds
    /// (no loop).
    Resend {
        /// The WARN line (no secrets, no requirement ids).
        warn: String,
        /// One sentence for the user (no `[buzz-agent]` mark, no requirement ids), when what
        /// changed is theirs to know (the model is served on another route).
        notice: Option<String>,
    },
}

impl ErrorReaction {
    /// [`ErrorReaction::Resend`] with only a WARN line.
    pub(crate) fn resend(warn: String) -> ErrorReaction {
        ErrorReaction::Resend { warn, notice: None }
    }
}

/// What the agent learned about its provider while running; kept for the life of the process
/// (the provider is configured once per process).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Learned {
    /// A Chat Completions 400 named `max_completion_tokens` (SPEC L7, case C41): the output cap
    /// is sent under that name from now on.
    pub max_completion_tokens: bool,
    /// The Chat server streamed `reasoning_content` (DeepSeek-style reasoning, SPEC L10): every
    /// assistant message carries the field from now on, including the ones the agent writes.
    pub reasoning_content: bool,
    /// An OpenAI route's server rejected `prompt_cache_key` (SPEC L11): it is not sent again.
    pub no_prompt_cache_key: bool,
    /// An OpenAI route's server rejected its reasoning parameter (`reasoning_effort` on Chat,
    /// `reasoning` on Responses; SPEC L12): it is not sent again.
    pub no_reasoning_effort: bool,
    /// An Anthropic 400 named the form of `thinking` the agent chose for the model (adaptive
    /// or a token budget; SPEC L12): the other form is sent from now on.
    pub other_thinking_form: bool,
    /// The models a Chat Completions server refused with an error naming `v1/responses`
    /// (OpenAI: "This model is only supported in v1/responses and not in
    /// v1/chat/completions."; SPEC L8): their requests go on the Responses route from now on
    /// ([`route_kind`]).
    pub responses_only: Vec<String>,
}

/// Whether a failed Chat Completions request was refused because its model is served only by
/// the Responses API: a 400 or 404 whose body names `v1/responses` (OpenAI answers 404 for
/// `o1-pro`, 400 for the `…-codex` models).
#[must_use]
pub(crate) fn names_responses_api(status: u16, body: &[u8]) -> bool {
    matches!(status, 400 | 404) && String::from_utf8_lossy(body).contains("v1/responses")
}

/// The reaction to a Chat Completions server that said `model` is served only by the
/// Responses API: its requests go there from now on, the attempt is sent again there, with one
/// WARN and a notice for the user.
pub(crate) fn upgrade_to_responses(learned: &mut Learned, model: &str) -> ErrorReaction {
    if !learned.responses_only.iter().any(|m| m == model) {
        learned.responses_only.push(model.to_owned());
    }
    ErrorReaction::Resend {
        warn: format!(
            "llm: model '{model}' is served only by the Responses API; sending its requests to /responses instead of /chat/completions from now on"
        ),
        notice: Some(format!(
            "model '{model}' is served only by the OpenAI Responses API; its requests go there from now on."
        )),
    }
}

/// The reaction to a server that rejected the reasoning parameter `field` (SPEC L12) on an
/// OpenAI route: never sent again, the attempt sent again without it, one WARN.
pub(crate) fn drop_reasoning_effort(learned: &mut Learned, field: &str) -> ErrorReaction {
    learned.no_reasoning_effort = true;
    ErrorReaction::resend(format!(
        "llm: the server does not take {field}; sending requests without a reasoning effort from now on"
    ))
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
    ErrorReaction::resend(
        "llm: the server does not take prompt_cache_key; sending requests without it from now on"
            .into(),
    )
}

/// OpenAI's spelling of `effort` for `reasoning_effort` and `reasoning.effort` (SPEC L12):
/// `max` is `high`, the top level every OpenAI reasoning model takes.
#[must_use]
pub(crate) fn openai_effort(effort: Effort) -> &'static str {
    match effort {
        Effort::Low => "low",
        Effort::Medium => "medium",
        Effort::High | Effort::Max => "high",
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
    use crate::llm::{Message, StreamDelta, ToolCall};
    use serde_json::json;

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
            max_output_tokens: 8,
            ..LlmRequest::for_tests("m", &messages)
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

    /// The JSON body `kind`'s route builds of `req` for `cfg` with `learned`.
    fn sent_body(
        kind: ProviderKind,
        cfg: &Config,
        req: &LlmRequest<'_>,
        learned: &Learned,
    ) -> serde_json::Value {
        let body = route(kind)
            .build_request(cfg, req, learned, None)
            .body
            .to_vec();
        serde_json::from_slice(&body).unwrap()
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
            max_output_tokens: 8,
            cache: cached.then_some(crate::llm::PromptCache {
                key: "sess_7",
                previous_len: None,
            }),
            ..LlmRequest::for_tests("m", &messages)
        };
        sent_body(kind, cfg, &req, learned)
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
            let Some(ErrorReaction::Resend { warn, .. }) =
                r.on_http_error(&cfg, "m", None, 400, body, &mut learned)
            else {
                panic!("{kind:?}: the rejection is handled by the route");
            };
            assert!(warn.contains("prompt_cache_key"), "{warn}");
            assert!(learned.no_prompt_cache_key);
            // Sent without it now, the same answer is the server's own error (no loop).
            assert_eq!(
                r.on_http_error(&cfg, "m", None, 400, body, &mut learned),
                None
            );
            // A 422 of a pydantic validator names it the same way.
            let mut fresh = Learned::default();
            let extra = br#"{"detail":[{"loc":["body","prompt_cache_key"],"msg":"Extra inputs are not permitted"}]}"#;
            assert!(
                r.on_http_error(&cfg, "m", None, 422, extra, &mut fresh)
                    .is_some()
            );
            // Not sent to this endpoint: another 400 naming it is not ours to fix.
            let local = Config::for_tests(kind, "http://127.0.0.1:8000/v1");
            let mut untouched = Learned::default();
            assert_eq!(
                r.on_http_error(&local, "m", None, 400, body, &mut untouched),
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
            let reaction = route(kind).on_http_error(&cfg, "m", None, 400, body, &mut learned);
            let chat = kind == ProviderKind::OpenAiChat;
            assert_eq!(reaction.is_some(), chat, "{kind:?}");
            assert_eq!(learned.max_completion_tokens, chat, "{kind:?}");
        }
    }

    #[test]
    fn l8_only_the_chat_route_moves_a_model_the_server_names_v1_responses_for() {
        let body = br#"{"error":{"message":"This model is only supported in v1/responses and not in v1/chat/completions."}}"#;
        for status in [400, 404] {
            for kind in ProviderKind::ALL {
                let cfg = Config::for_tests(kind, "https://api.openai.com/v1");
                let mut learned = Learned::default();
                let reaction =
                    route(kind).on_http_error(&cfg, "o1-pro", None, status, body, &mut learned);
                if kind != ProviderKind::OpenAiChat {
                    assert_eq!(reaction, None, "{kind:?}");
                    assert_eq!(route_kind(&cfg, "o1-pro", &learned), kind);
                    continue;
                }
                let Some(ErrorReaction::Resend {
                    warn,
                    notice: Some(notice),
                }) = reaction
                else {
                    panic!("{status}: {reaction:?}");
                };
                assert!(
                    warn.starts_with("llm: ") && warn.contains("'o1-pro'"),
                    "{warn}"
                );
                assert!(notice.contains("'o1-pro'"), "{notice}");
                // That model goes on Responses from now on (at the same base URL), others not.
                assert_eq!(
                    route_kind(&cfg, "o1-pro", &learned),
                    ProviderKind::OpenAiResponses
                );
                assert_eq!(route_kind(&cfg, "gpt-4o", &learned), kind);
                // Learned once, however often it is said.
                let _ = route(kind).on_http_error(&cfg, "o1-pro", None, status, body, &mut learned);
                assert_eq!(learned.responses_only, ["o1-pro"]);
            }
        }
        // Another status, or a body that does not name the Responses API, is not this.
        let cfg = Config::for_tests(ProviderKind::OpenAiChat, "https://api.openai.com/v1");
        let chat = route(ProviderKind::OpenAiChat);
        let mut learned = Learned::default();
        assert_eq!(
            chat.on_http_error(&cfg, "o1-pro", None, 500, body, &mut learned),
            None
        );
        let other = br#"{"error":{"message":"The model `o1-pro` does not exist"}}"#;
        assert_eq!(
            chat.on_http_error(&cfg, "o1-pro", None, 404, other, &mut learned),
            None
        );
        assert!(learned.responses_only.is_empty());
    }

    /// The body of `messages` on `kind` at `effort` for `model`.
    fn effort_body(
        kind: ProviderKind,
        cfg: &Config,
        model: &str,
        messages: &[Message],
        effort: Option<Effort>,
        learned: &Learned,
    ) -> serde_json::Value {
        let req = LlmRequest {
            max_output_tokens: 32_768,
            effort,
            ..LlmRequest::for_tests(model, messages)
        };
        sent_body(kind, cfg, &req, learned)
    }

    #[test]
    fn l12_each_route_sends_the_effort_its_way_and_nothing_without_one() {
        let hi = [Message::User { text: "hi".into() }];
        let none = Learned::default();
        let mut cfg = Config::for_tests(ProviderKind::OpenAiChat, "http://h/");
        let chat = |e| effort_body(ProviderKind::OpenAiChat, &cfg, "m", &hi, e, &none);
        assert_eq!(chat(Some(Effort::Low))["reasoning_effort"], "low");
        assert_eq!(chat(Some(Effort::Max))["reasoning_effort"], "high");
        assert!(chat(None).get("reasoning_effort").is_none());
        cfg.provider = ProviderKind::OpenAiResponses;
        let resp =
            |cfg: &Config, e| effort_body(ProviderKind::OpenAiResponses, cfg, "m", &hi, e, &none);
        assert_eq!(
            resp(&cfg, Some(Effort::Medium))["reasoning"],
            json!({"effort": "medium"})
        );
        assert!(resp(&cfg, None).get("reasoning").is_none());
        // An effort says the model reasons: its encrypted reasoning is asked for, so that a
        // stateless request can send it back (L10); not without one, nor once dropped.
        let include = json!(["reasoning.encrypted_content"]);
        assert_eq!(resp(&cfg, Some(Effort::Low))["include"], include);
        assert!(resp(&cfg, None).get("include").is_none());
        let dropped = Learned {
            no_reasoning_effort: true,
            ..Learned::default()
        };
        let without = effort_body(
            ProviderKind::OpenAiResponses,
            &cfg,
            "m",
            &hi,
            Some(Effort::Low),
            &dropped,
        );
        assert!(without.get("include").is_none(), "{without}");
        cfg.thinking_summary = Some("auto".into());
        assert_eq!(
            resp(&cfg, Some(Effort::High))["reasoning"],
            json!({"effort": "high", "summary": "auto"})
        );
        assert_eq!(resp(&cfg, None)["reasoning"], json!({"summary": "auto"}));
        let cfg = Config::for_tests(ProviderKind::Anthropic, "http://h/");
        let anth = |model: &str, e, learned: &Learned| {
            effort_body(ProviderKind::Anthropic, &cfg, model, &hi, e, learned)
        };
        let old = anth("claude-sonnet-4-5-20250929", Some(Effort::High), &none);
        assert_eq!(
            old["thinking"],
            json!({"type": "enabled", "budget_tokens": 16_384})
        );
        assert!(old.get("output_config").is_none());
        assert_eq!(
            anth("claude-3-7-sonnet-latest", Some(Effort::Low), &none)["thinking"]["budget_tokens"],
            4096
        );
        assert_eq!(
            anth("claude-opus-4-1", Some(Effort::Max), &none)["thinking"]["budget_tokens"],
            24_576
        );
        let new = anth("claude-opus-4-6", Some(Effort::Max), &none);
        assert_eq!(new["thinking"], json!({"type": "adaptive"}));
        assert_eq!(new["output_config"], json!({"effort": "max"}));
        let swapped = Learned {
            other_thinking_form: true,
            ..Learned::default()
        };
        assert_eq!(
            anth("claude-opus-4-6", Some(Effort::High), &swapped)["thinking"]["type"],
            "enabled"
        );
        let none_sent = anth("claude-opus-4-6", None, &none);
        assert!(none_sent.get("thinking").is_none() && none_sent.get("output_config").is_none());
    }

    #[test]
    fn l12_adaptive_thinking_is_for_claude_4_6_and_later() {
        for (model, adaptive) in [
            ("claude-opus-4-6", true),
            ("claude-sonnet-4-6", true),
            ("anthropic/claude-opus-4-7", true),
            ("claude-opus-5", true),
            ("claude-sonnet-5-1@20260101", true),
            ("claude-mythos-preview", true),
            ("claude-sonnet-4-5-20250929", false),
            ("claude-sonnet-4-20250514", false),
            ("claude-opus-4-1", false),
            ("claude-3-7-sonnet-latest", false),
            ("gpt-5", false),
        ] {
            assert_eq!(
                crate::llm::anthropic::takes_adaptive_thinking(model),
                adaptive,
                "{model}"
            );
        }
    }

    #[test]
    fn l12_a_tool_loop_opened_without_thinking_continues_without_it() {
        let cfg = Config::for_tests(ProviderKind::Anthropic, "http://h/");
        let call = ToolCall {
            id: "c1".into(),
            name: "fs__read".into(),
            arguments: "{}".into(),
        };
        let turn = |reasoning: Vec<crate::llm::ReasoningBlock>| {
            vec![
                Message::User { text: "hi".into() },
                Message::Assistant {
                    text: String::new(),
                    thinking: String::new(),
                    reasoning,
                    tool_calls: vec![call.clone()],
                },
                Message::ToolResult {
                    call_id: "c1".into(),
                    name: "fs__read".into(),
                    text: "ok".into(),
                    is_error: false,
                },
            ]
        };
        let none = Learned::default();
        let plain = turn(Vec::new());
        let body = effort_body(
            ProviderKind::Anthropic,
            &cfg,
            "claude-opus-4-6",
            &plain,
            Some(Effort::High),
            &none,
        );
        assert!(body.get("thinking").is_none(), "{body}");
        let signed = turn(vec![crate::llm::ReasoningBlock::Thinking {
            text: "t".into(),
            signature: "s".into(),
        }]);
        let body = effort_body(
            ProviderKind::Anthropic,
            &cfg,
            "claude-opus-4-6",
            &signed,
            Some(Effort::High),
            &none,
        );
        assert_eq!(body["thinking"]["type"], "adaptive");
    }

    #[test]
    fn l12_a_rejected_reasoning_parameter_is_dropped_once_with_a_warning() {
        let body =
            br#"{"error":{"message":"Unrecognized request argument supplied: reasoning_effort"}}"#;
        let rbody = br#"{"error":{"message":"Unknown parameter: 'reasoning'."}}"#;
        for (kind, body) in [
            (ProviderKind::OpenAiChat, &body[..]),
            (ProviderKind::OpenAiResponses, &rbody[..]),
        ] {
            let cfg = Config::for_tests(kind, "http://h/");
            let mut learned = Learned::default();
            // A request without an effort carried none: nothing to drop.
            assert_eq!(
                route(kind).on_http_error(&cfg, "m", None, 400, body, &mut learned),
                None
            );
            let r =
                route(kind).on_http_error(&cfg, "m", Some(Effort::Low), 400, body, &mut learned);
            assert!(matches!(r, Some(ErrorReaction::Resend { .. })), "{kind:?}");
            assert!(learned.no_reasoning_effort);
            assert_eq!(
                route(kind).on_http_error(&cfg, "m", Some(Effort::Low), 400, body, &mut learned),
                None,
                "once"
            );
            let hi = [Message::User { text: "hi".into() }];
            let sent = effort_body(kind, &cfg, "m", &hi, Some(Effort::Low), &learned);
            assert!(sent.get("reasoning_effort").is_none() && sent.get("reasoning").is_none());
        }
    }

    /// An Anthropic 400 body with `message`.
    fn anthropic_400(message: &str) -> Vec<u8> {
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn l12_only_a_400_refusing_the_form_of_thinking_sent_swaps_the_form() {
        let cfg = Config::for_tests(ProviderKind::Anthropic, "http://h/");
        let anthropic = route(ProviderKind::Anthropic);
        // (model, message, whether it refuses the form the request carried for that model)
        let adaptive_refused = "adaptive thinking is not supported on this model";
        let enabled_refused = "\"thinking.type.enabled\" is not supported for this model. Use \"thinking.type.adaptive\" and \"output_config.effort\" to control thinking behavior.";
        for (model, message, swaps) in [
            ("claude-opus-4-6", adaptive_refused, true),
            (
                "claude-opus-4-6",
                "thinking.type: Input should be 'enabled' or 'disabled'",
                true,
            ),
            (
                "claude-opus-4-6",
                "output_config: Extra inputs are not permitted",
                true,
            ),
            ("claude-sonnet-4-5", enabled_refused, true),
            // The refusal of the form not sent: nonsense for this request, not a reason.
            ("claude-sonnet-4-5", adaptive_refused, false),
            ("claude-opus-4-6", enabled_refused, false),
            // About the conversation's thinking blocks, or the budget's size: the other form
            // would not help.
            (
                "claude-sonnet-4-5",
                "messages.1.content.0: Invalid `signature` in `thinking` block",
                false,
            ),
            (
                "claude-sonnet-4-5",
                "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`. When `thinking` is enabled, a final `assistant` message must start with a thinking block.",
                false,
            ),
            (
                "claude-sonnet-4-5",
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation",
                false,
            ),
            (
                "claude-sonnet-4-5",
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
                false,
            ),
            (
                "claude-opus-4-6",
                "prompt is too long: 210000 tokens > 200000 maximum",
                false,
            ),
            (
                "claude-opus-4-6",
                "tools.0.custom.name: String should match pattern",
                false,
            ),
        ] {
            let body = anthropic_400(message);
            let mut learned = Learned::default();
            let r =
                anthropic.on_http_error(&cfg, model, Some(Effort::Low), 400, &body, &mut learned);
            assert_eq!(r.is_some(), swaps, "{model}: {message}");
            assert_eq!(learned.other_thinking_form, swaps, "{model}: {message}");
            // Without an effort the request carried no thinking: nothing to swap.
            let mut none = Learned::default();
            assert_eq!(
                anthropic.on_http_error(&cfg, model, None, 400, &body, &mut none),
                None
            );
            // Another status is never a form refusal.
            assert_eq!(
                anthropic.on_http_error(&cfg, model, Some(Effort::Low), 422, &body, &mut none),
                None
            );
            if swaps {
                assert_eq!(
                    anthropic.on_http_error(
                        &cfg,
                        model,
                        Some(Effort::Low),
                        400,
                        &body,
                        &mut learned
                    ),
                    None,
                    "the other form once, no loop"
                );
            }
        }
    }
}
