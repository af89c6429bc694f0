//! The route-neutral part of a failed LLM call (SPEC L5, A3): how an HTTP status is handled,
//! the provider's error message from a body, and the `retry-after` hint. A route reacts to an
//! error of its own first (`ProviderRoute::on_http_error`, route.rs); what it leaves is handled
//! here the same way on every route.

/// How a non-2xx HTTP status is handled (SPEC L5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpFailure {
    /// 408, 409, 429, 5xx, 529: retry while attempts remain.
    Retryable,
    /// 401 / 403: `llm auth: …`, never retried.
    Auth,
    /// 400 saying the context is too long (SPEC K1 reactive compaction).
    ContextTooLong,
    /// 3xx: the provider redirected the request. Never followed, as the request carries the API
    /// key (SPEC S2); the attempt fails, naming where it pointed, and is not retried.
    Redirect,
    /// Any other status: the provider's message, never retried.
    Fatal,
}

/// Classify a failed status and its (≤ 4 KiB) body.
#[must_use]
pub(crate) fn classify_status(status: u16, body: &str) -> HttpFailure {
    match status {
        408 | 409 | 429 | 500..=599 => HttpFailure::Retryable,
        401 | 403 => HttpFailure::Auth,
        300..=399 => HttpFailure::Redirect,
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
        for s in [300, 301, 302, 303, 307, 308, 399] {
            assert_eq!(classify_status(s, ""), HttpFailure::Redirect, "S2: {s}");
        }
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
}
