//! Provider dispatch: which request builder and stream decoder serve the configured route
//! (SPEC L6–L8), and HTTP error classification shared by all routes (SPEC L5).

use crate::config::{Config, ProviderKind};
use crate::llm::{HttpRequest, LlmRequest, StreamDecoder};
use crate::openai_chat::ChatOptions;
use crate::openai_responses::ResponsesOptions;

/// Whether this build implements the configured provider route (all three do).
#[must_use]
pub fn is_supported(kind: &ProviderKind) -> bool {
    match kind {
        ProviderKind::OpenAiChat | ProviderKind::Anthropic | ProviderKind::OpenAiResponses => true,
    }
}

/// What the agent learned about its provider while running; kept for the life of the process
/// (the provider is configured once per process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Learned {
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
pub fn is_openai_reasoning_model(model: &str) -> bool {
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

/// The Chat Completions options for one request (SPEC L7): the output cap goes as
/// `max_completion_tokens` for OpenAI's own endpoint (`api.openai.com`, which accepts it for
/// every model and requires it for reasoning models), for an OpenAI reasoning model name
/// anywhere, and once a server asked for it (`learned`); else as `max_tokens`, which every
/// OpenAI-compatible server accepts.
#[must_use]
pub fn chat_options(cfg: &Config, model: &str, learned: &Learned) -> ChatOptions {
    ChatOptions {
        max_completion_tokens: learned.max_completion_tokens
            || is_openai_reasoning_model(model)
            || cfg.base_url.contains("://api.openai.com"),
        reasoning_content: learned.reasoning_content,
    }
}

/// The Responses options for one request (SPEC L8, L10): encrypted reasoning is asked for when
/// the model is an OpenAI reasoning model, the models that return reasoning items.
#[must_use]
pub fn responses_options(model: &str) -> ResponsesOptions {
    ResponsesOptions {
        include_encrypted_reasoning: is_openai_reasoning_model(model),
    }
}

/// Whether a failed Chat Completions request should be retried with the output cap renamed:
/// a 400 whose body names `max_completion_tokens` while the request sent `max_tokens` (SPEC L7,
/// case C41).
#[must_use]
pub fn wants_max_completion_tokens(status: u16, body: &[u8], sent: &ChatOptions) -> bool {
    status == 400
        && !sent.max_completion_tokens
        && String::from_utf8_lossy(body).contains("max_completion_tokens")
}

/// Build the HTTP request of one LLM call for the configured route: Anthropic Messages (L6),
/// Chat Completions (L7, with [`chat_options`]) or Responses (L8).
#[must_use]
pub fn build_request(cfg: &Config, req: &LlmRequest<'_>, learned: &Learned) -> HttpRequest {
    match cfg.provider {
        ProviderKind::Anthropic => crate::anthropic::build_request(cfg, req),
        ProviderKind::OpenAiChat => crate::openai_chat::build_request(
            &cfg.base_url,
            &cfg.api_key,
            req,
            &chat_options(cfg, req.model, learned),
        ),
        ProviderKind::OpenAiResponses => crate::openai_responses::build_request(
            &cfg.base_url,
            &cfg.api_key,
            req,
            &responses_options(req.model),
        ),
    }
}

/// A fresh stream decoder for the configured route; `id_prefix` makes synthesised tool-call
/// ids unique (case C21).
#[must_use]
pub fn decoder(cfg: &Config, id_prefix: String) -> Box<dyn StreamDecoder> {
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
pub enum HttpFailure {
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
pub fn classify_status(status: u16, body: &str) -> HttpFailure {
    match status {
        408 | 409 | 429 | 500..=599 => HttpFailure::Retryable,
        401 | 403 => HttpFailure::Auth,
        400 | 413 if is_context_too_long(body) => HttpFailure::ContextTooLong,
        _ => HttpFailure::Fatal,
    }
}

/// Whether a provider error body says the prompt exceeded the context window.
#[must_use]
pub fn is_context_too_long(body: &str) -> bool {
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
pub fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let msg = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) => v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| text.trim().to_string()),
        Err(_) => text.trim().to_string(),
    };
    cut(&msg, 4096)
}

/// Cut `s` to at most `max` bytes on a char boundary.
#[must_use]
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Retry delay hint from headers, in ms (SPEC L5): `retry-after-ms`, else `retry-after` as
/// seconds or as an HTTP date relative to the response's own `date` header; clamped to 60 s.
/// `None` when absent, unparsable or ≤ 0 (the exponential backoff applies).
#[must_use]
pub fn retry_after_ms(headers: &[(String, String)]) -> Option<u64> {
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.trim())
    };
    let ms = if let Some(v) = get("retry-after-ms") {
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(|x| x.max(0.0) as u64)
    } else if let Some(v) = get("retry-after") {
        if let Ok(secs) = v.parse::<f64>() {
            Some((secs.max(0.0) * 1000.0) as u64)
        } else {
            let target = parse_http_date(v)?;
            let base = get("date").and_then(parse_http_date)?;
            Some(target.saturating_sub(base) * 1000)
        }
    } else {
        None
    }?;
    if ms == 0 {
        return None;
    }
    Some(ms.min(60_000))
}

/// Parse an IMF-fixdate (`Wed, 21 Oct 2026 07:28:00 GMT`) to Unix seconds.
#[must_use]
pub fn parse_http_date(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day: u64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as u64
        + 1;
    let year: u64 = parts[3].parse().ok()?;
    let hms: Vec<u64> = parts[4].split(':').filter_map(|x| x.parse().ok()).collect();
    if hms.len() != 3 || !(1..=31).contains(&day) || year < 1970 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm), shifted to start the year in March.
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
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
    fn l6_l7_l8_every_route_is_supported_and_dispatched() {
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
            assert!(is_supported(&kind));
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
    fn http_dates_parse_to_unix_seconds() {
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
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
}
