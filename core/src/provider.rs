//! Provider dispatch: which request builder and stream decoder serve the configured route
//! (SPEC L6–L8), and HTTP error classification shared by all routes (SPEC L5).

use crate::config::{Config, ProviderKind};
use crate::llm::{HttpRequest, LlmRequest, StreamDecoder};
use crate::openai_chat::ChatOptions;
use crate::openai_responses::ResponsesOptions;
use crate::request::BodyCache;

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
/// the server streamed it, or for `deepseek-reasoner` from the start.
#[must_use]
pub(crate) fn chat_options(cfg: &Config, model: &str, learned: &Learned) -> ChatOptions {
    ChatOptions {
        max_completion_tokens: learned.max_completion_tokens
            || is_openai_reasoning_model(model)
            || cfg.base_url.contains("://api.openai.com"),
        reasoning_content: learned.reasoning_content || is_deepseek_reasoner(model),
    }
}

/// The Responses options for one request (SPEC L8, L10): encrypted reasoning is asked for when
/// the model is an OpenAI reasoning model, the models that return reasoning items.
#[must_use]
pub(crate) fn responses_options(model: &str) -> ResponsesOptions {
    ResponsesOptions {
        include_encrypted_reasoning: is_openai_reasoning_model(model),
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

/// Build the HTTP request of one LLM call for the configured route: Anthropic Messages (L6),
/// Chat Completions (L7, with [`chat_options`]) or Responses (L8).
#[cfg(test)]
#[must_use]
pub(crate) fn build_request(cfg: &Config, req: &LlmRequest<'_>, learned: &Learned) -> HttpRequest {
    build_request_cached(cfg, req, learned, None)
}

/// [`build_request`] through `cache`, the serialized prefix of `req.messages` kept from the
/// history's earlier requests (`History`, history.rs): the same bytes, but only the
/// messages new since then are serialized (issue #15).
#[must_use]
pub(crate) fn build_request_cached(
    cfg: &Config,
    req: &LlmRequest<'_>,
    learned: &Learned,
    cache: Option<&mut BodyCache>,
) -> HttpRequest {
    match cfg.provider {
        ProviderKind::Anthropic => crate::anthropic::build_request_cached(cfg, req, cache),
        ProviderKind::OpenAiChat => crate::openai_chat::build_request_cached(
            &cfg.base_url,
            &cfg.api_key,
            req,
            &chat_options(cfg, req.model, learned),
            cache,
        ),
        ProviderKind::OpenAiResponses => crate::openai_responses::build_request_cached(
            &cfg.base_url,
            &cfg.api_key,
            req,
            &responses_options(req.model),
            cache,
        ),
    }
}

/// A fresh stream decoder for the configured route; `id_prefix` makes synthesised tool-call
/// ids unique (case C21).
#[must_use]
pub(crate) fn decoder(cfg: &Config, id_prefix: String) -> Box<dyn StreamDecoder> {
    match cfg.provider {
        ProviderKind::Anthropic => Box::new(crate::anthropic::AnthropicDecoder::new(id_prefix)),
        ProviderKind::OpenAiChat => Box::new(crate::openai_chat::ChatDecoder::new(id_prefix)),
        ProviderKind::OpenAiResponses => {
            Box::new(crate::openai_responses::ResponsesDecoder::new(id_prefix))
        }
    }
}

/// How a non-2xx HTTP status is handled (SPEC L5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpFailure {
    /// 408, 409, 429, 5xx, 529: retry while attempts remain.
    Retryable,
    /// 401 / 403: `llm auth: …`, never retried.
    Auth,
    /// 400 saying the context is too long (SPEC K1 reactive compaction).
    ContextTooLong,
    /// Any other status: the provider's message, never retried.
    Fatal,
}

/// Classify a failed status and its (≤ 4 KiB) body.
#[must_use]
pub(crate) fn classify_status(status: u16, body: &str) -> HttpFailure {
    match status {
        408 | 409 | 429 | 500..=599 => HttpFailure::Retryable,
        401 | 403 => HttpFailure::Auth,
        400 | 413 if is_context_too_long(body) => HttpFailure::ContextTooLong,
        _ => HttpFailure::Fatal,
    }
}

/// Whether a provider error body says the prompt exceeded the context window.
#[must_use]
pub(crate) fn is_context_too_long(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "prompt is too long",
        "maximum context length",
        "context window",
        "too many tokens",
    ]
    .iter()
    .any(|p| b.contains(p))
}

/// The provider's error message from a body (`error.message`, `message`), else the body text,
/// cut to 4 KiB on a character boundary (SPEC A3).
#[must_use]
pub(crate) fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let msg = match crate::json::parse_lossy(&text) {
        Ok(v) => v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| text.trim().to_string()),
        Err(_) => text.trim().to_string(),
    };
    crate::text::utf8_prefix(&msg, 4096).to_owned()
}

/// Longest retry delay a provider can ask for, in ms (SPEC L5).
pub(crate) const MAX_RETRY_AFTER_MS: u64 = 60_000;

/// Retry delay hint from headers, in ms (SPEC L5): `retry-after-ms` (milliseconds), else
/// `retry-after` as seconds or as an HTTP date (IMF-fixdate, RFC 850 or asctime, parsed by the
/// `httpdate` crate) relative to the response's own `date` header; clamped to
/// [`MAX_RETRY_AFTER_MS`]. `None` when absent, unparsable, not finite (`NaN`, `inf`) or ≤ 0, or
/// a date without a `date` header or not after it (the exponential backoff applies).
///
/// Peer-supplied numbers never overflow: floats convert saturating (`1e308` s is the clamp),
/// date differences are checked.
#[must_use]
pub(crate) fn retry_after_ms(headers: &[(String, String)]) -> Option<u64> {
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.trim())
    };
    let ms = if let Some(v) = get("retry-after-ms") {
        float_ms(v.parse::<f64>().ok()?, 1.0)?
    } else if let Some(v) = get("retry-after") {
        if let Ok(secs) = v.parse::<f64>() {
            float_ms(secs, 1000.0)?
        } else {
            let target = httpdate::parse_http_date(v).ok()?;
            let base = httpdate::parse_http_date(get("date")?).ok()?;
            let wait = target.duration_since(base).ok()?;
            u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
        }
    } else {
        return None;
    };
    (ms > 0).then(|| ms.min(MAX_RETRY_AFTER_MS))
}

/// `value · scale` as whole milliseconds, saturating (`None` for `NaN` and infinities).
fn float_ms(value: f64, scale: f64) -> Option<u64> {
    if !value.is_finite() {
        return None;
    }
    let ms = value * scale;
    // `as` saturates: negative → 0, beyond u64::MAX (or infinite after scaling) → u64::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn l6_l7_l8_every_route_is_dispatched() {
        use crate::config::Config;
        use crate::llm::{LlmRequest, Message, StreamDelta};
        let messages = [Message::User { text: "hi".into() }];
        let req = LlmRequest {
            model: "m",
            system: None,
            messages: &messages,
            tools: &[],
            max_output_tokens: 8,
        };
        let routes = [
            (
                ProviderKind::Anthropic,
                "http://h/v1/messages",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
            (
                ProviderKind::OpenAiChat,
                "http://h/chat/completions",
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
            ),
            (
                ProviderKind::OpenAiResponses,
                "http://h/responses",
                "data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n",
            ),
        ];
        for (kind, url, body) in routes {
            let cfg = Config::for_tests(kind, "http://h/");
            assert_eq!(build_request(&cfg, &req, &Learned::default()).url, url);
            let mut decoder = decoder(&cfg, "call_1".into());
            let mut out: Vec<StreamDelta> = Vec::new();
            decoder.feed(body.as_bytes(), &mut out).unwrap();
            assert!(decoder.is_complete(), "{kind:?}");
            assert!(decoder.finish(&mut out).is_ok(), "{kind:?}");
        }
    }

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

    #[test]
    fn l5_statuses_are_classified() {
        for s in [408, 409, 429, 500, 503, 529] {
            assert_eq!(classify_status(s, ""), HttpFailure::Retryable, "{s}");
        }
        assert_eq!(classify_status(401, ""), HttpFailure::Auth);
        assert_eq!(classify_status(403, ""), HttpFailure::Auth);
        assert_eq!(
            classify_status(400, "{\"error\":{\"code\":\"context_length_exceeded\"}}"),
            HttpFailure::ContextTooLong
        );
        assert_eq!(classify_status(400, "bad"), HttpFailure::Fatal);
        assert_eq!(classify_status(404, ""), HttpFailure::Fatal);
    }

    #[test]
    fn c28_retry_after_forms_are_honoured_and_clamped() {
        assert_eq!(retry_after_ms(&h(&[("retry-after", "7")])), Some(7000));
        assert_eq!(retry_after_ms(&h(&[("retry-after-ms", "250")])), Some(250));
        assert_eq!(retry_after_ms(&h(&[("retry-after", "3600")])), Some(60_000));
        assert_eq!(retry_after_ms(&h(&[("retry-after", "0")])), None);
        assert_eq!(
            retry_after_ms(&h(&[
                ("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"),
                ("date", "Wed, 21 Oct 2026 07:27:50 GMT")
            ])),
            Some(10_000)
        );
        assert_eq!(retry_after_ms(&h(&[("retry-after", "soon")])), None);
        assert_eq!(retry_after_ms(&[]), None);
    }

    #[test]
    fn l5_retry_after_dates_in_every_http_format_are_relative_to_the_date_header() {
        let date = ("date", "Sun, 06 Nov 1994 08:49:37 GMT");
        for later in [
            "Sun, 06 Nov 1994 08:49:47 GMT",
            "Sunday, 06-Nov-94 08:49:47 GMT",
            "Sun Nov  6 08:49:47 1994",
        ] {
            assert_eq!(
                retry_after_ms(&h(&[("retry-after", later), date])),
                Some(10_000),
                "{later}"
            );
        }
        // Earlier than the response's date, equal, or no date header: no hint.
        assert_eq!(
            retry_after_ms(&h(&[
                ("retry-after", "Sun, 06 Nov 1994 08:49:30 GMT"),
                date
            ])),
            None
        );
        assert_eq!(retry_after_ms(&h(&[("retry-after", date.1), date])), None);
        assert_eq!(retry_after_ms(&h(&[("retry-after", date.1)])), None);
    }

    #[test]
    fn l5_extreme_retry_after_values_never_overflow() {
        let max = u64::MAX.to_string();
        let huge_int = "9".repeat(400);
        for (header, value, want) in [
            ("retry-after-ms", max.as_str(), Some(MAX_RETRY_AFTER_MS)),
            ("retry-after-ms", "1e308", Some(MAX_RETRY_AFTER_MS)),
            // 400 digits parse as infinity: not a finite hint.
            ("retry-after-ms", huge_int.as_str(), None),
            ("retry-after-ms", "-1", None),
            ("retry-after-ms", "-1e308", None),
            ("retry-after-ms", "NaN", None),
            ("retry-after-ms", "inf", None),
            ("retry-after-ms", "0.4", None),
            ("retry-after-ms", "1.9", Some(1)),
            ("retry-after", max.as_str(), Some(MAX_RETRY_AFTER_MS)),
            ("retry-after", "1e308", Some(MAX_RETRY_AFTER_MS)),
            (
                "retry-after",
                "1.7976931348623157e308",
                Some(MAX_RETRY_AFTER_MS),
            ),
            ("retry-after", "-5", None),
            ("retry-after", "-inf", None),
            ("retry-after", "0.25", Some(250)),
        ] {
            assert_eq!(
                retry_after_ms(&h(&[(header, value)])),
                want,
                "{header}: {value}"
            );
        }
        // Dates far apart or out of range: saturating, or unparsable.
        for (target, base, want) in [
            (
                "Fri, 31 Dec 9999 23:59:59 GMT",
                "Thu, 01 Jan 1970 00:00:00 GMT",
                Some(MAX_RETRY_AFTER_MS),
            ),
            (
                "Thu, 01 Jan 1970 00:00:00 GMT",
                "Fri, 31 Dec 9999 23:59:59 GMT",
                None,
            ),
            (
                "Wed, 99999999999999999999 Oct 2026 07:28:00 GMT",
                "Wed, 21 Oct 2026 07:27:50 GMT",
                None,
            ),
            (
                "Wed, 21 Oct 18446744073709551615 07:28:00 GMT",
                "Wed, 21 Oct 2026 07:27:50 GMT",
                None,
            ),
            (
                "Wed, 21 Oct 2026 99999999999:28:00 GMT",
                "Wed, 21 Oct 2026 07:27:50 GMT",
                None,
            ),
            ("Wed, 21 Oct 2026 07:28:00 GMT", "garbage", None),
        ] {
            assert_eq!(
                retry_after_ms(&h(&[("retry-after", target), ("date", base)])),
                want,
                "{target} / {base}"
            );
        }
    }

    #[test]
    fn a3_error_messages_come_from_the_body_and_are_capped() {
        assert_eq!(
            error_message(b"{\"error\":{\"message\":\"slow down\"}}"),
            "slow down"
        );
        assert_eq!(error_message(b"plain"), "plain");
        assert_eq!(error_message("é".repeat(5000).as_bytes()).len(), 4096);
    }

    #[test]
    fn l8_l10_encrypted_reasoning_is_asked_of_openai_reasoning_models_only() {
        use crate::llm::{LlmRequest, Message};
        assert!(responses_options("o4-mini").include_encrypted_reasoning);
        assert!(!responses_options("gpt-4o").include_encrypted_reasoning);
        let cfg = Config::for_tests(ProviderKind::OpenAiResponses, "http://h");
        let messages = [Message::User { text: "hi".into() }];
        for (model, asked) in [("openai/gpt-5", true), ("gpt-4.1", false)] {
            let req = LlmRequest {
                model,
                system: None,
                messages: &messages,
                tools: &[],
                max_output_tokens: 8,
            };
            let body = build_request(&cfg, &req, &Learned::default()).body.to_vec();
            let body = String::from_utf8_lossy(&body);
            assert_eq!(
                body.contains("\"include\":[\"reasoning.encrypted_content\"]"),
                asked,
                "{model}: {body}"
            );
        }
    }
}
