//! Small text helpers shared by the sub-machines, the terminal-safe escaping of text that
//! comes from peers ([`escape_controls`], SPEC S6), which the runtimes' `exec` uses too, and
//! the redaction of credentials in URLs ([`redact_url`], SPEC S2).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal or a line-oriented log raw (SPEC S6): the ASCII controls
/// (U+0000–U+001F: ESC, which starts ANSI and OSC sequences such as OSC 52's clipboard write,
/// `\r`, which returns to the start of the line, `\n`, which starts a forged one, BEL, …),
/// DEL, the 0x80–0x9F controls (U+0080–U+009F, among them the 8-bit CSI and OSC), and the Unicode line
/// and paragraph separators U+2028 and U+2029, which some viewers break lines at.
#[must_use]
pub fn is_unsafe_control(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// `text` with every [`is_unsafe_control`] character written as a visible escape, so that a
/// text log line stays one line and a terminal shows what a peer sent instead of obeying it
/// (SPEC S6): `\n`, `\r` and `\t` as those two characters, other ASCII controls and DEL as
/// `\x1b`-style hex, 0x80–0x9F controls and U+2028/U+2029 as `\u{85}`-style. Everything else,
/// backslashes included, is kept; text without such characters is returned as it is (no
/// copy). `keep` names characters to leave alone (e.g. `\n` and `\t` in a model's answer
/// printed as text).
///
/// ```
/// use buzz_agent_core::text::escape_controls;
/// assert_eq!(escape_controls("ok", &[]), "ok");
/// assert_eq!(escape_controls("a\x1b]52;c;ZWNobw==\x07b\r\nERROR", &[]), "a\\x1b]52;c;ZWNobw==\\x07b\\r\\nERROR");
/// assert_eq!(escape_controls("x\u{9b}31m\u{2028}y", &[]), "x\\u{9b}31m\\u{2028}y");
/// assert_eq!(escape_controls("two\nlines\tand\x1b[2J", &['\n', '\t']), "two\nlines\tand\\x1b[2J");
/// ```
#[must_use]
pub fn escape_controls<'a>(text: &'a str, keep: &[char]) -> Cow<'a, str> {
    let unsafe_char = |c: char| is_unsafe_control(c) && !keep.contains(&c);
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !unsafe_char(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// The longest prefix of `s` of at most `max_bytes` bytes that ends on a character boundary
/// (`s` itself when it fits). No marker is added; callers that show the cut add their own.
pub(crate) fn utf8_prefix(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut end = max_bytes;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// Compact JSON text `json` (as `serde_json` writes it, which escapes only the ASCII controls)
/// with the 0x80–0x9F controls and U+2028/U+2029 written as `\uXXXX` escapes too: the same JSON value,
/// and no character a terminal obeys (SPEC S6). Those characters can only occur inside JSON
/// strings, where the escape means the same.
#[must_use]
pub fn escape_json_controls(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_unsafe_control) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_unsafe_control(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether a query parameter named `name` carries a credential (SPEC S2): its name, in any
/// case, contains `key`, `token`, `secret`, `pass`, `pwd`, `auth`, `sig`, `credential` or
/// `session` (`key`, `api_key`, `api-key`, `access_token`, `X-Amz-Signature`, `password`, …).
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "key",
        "token",
        "secret",
        "pass",
        "pwd",
        "auth",
        "sig",
        "credential",
        "session",
    ]
    .iter()
    .any(|w| name.contains(w))
}

/// The parts of `url` that are credentials (SPEC S2), as byte ranges of `url`: the userinfo
/// of the authority (`user:password` in `https://user:password@host/`), and the value of every
/// query parameter [`is_secret_param`] names. Nothing for a URL without them.
fn secret_ranges(url: &str) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if let Some(at) = rest[..authority_end].rfind('@') {
        out.push(after_scheme..after_scheme + at);
    }
    let Some(q) = url.find('?') else {
        return out;
    };
    let query_end = url[q..].find('#').map_or(url.len(), |i| q + i);
    let mut start = q + 1;
    for pair in url[q + 1..query_end].split('&') {
        if let Some(eq) = pair.find('=')
            && is_secret_param(&pair[..eq])
            && eq + 1 < pair.len()
        {
            out.push(start + eq + 1..start + pair.len());
        }
        start += pair.len() + 1;
    }
    out
}

/// `url` with its credentials replaced by `***` (SPEC S2): the userinfo
/// (`https://***@host/…`) and the values of query parameters that name a key, token, secret,
/// password or signature (`?api_key=***&api-version=2024-06-01`). A URL without them is
/// returned as it is. For every URL the agent prints: logs, client errors, transcripts.
///
/// ```
/// use buzz_agent_core::text::redact_url;
/// assert_eq!(redact_url("https://api.example.com/v1"), "https://api.example.com/v1");
/// assert_eq!(redact_url("https://me:pw@proxy.example/v1/x"), "https://***@proxy.example/v1/x");
/// assert_eq!(
///     redact_url("https://h/v1?api-version=2024&api_key=sk-1&sig=abc#top"),
///     "https://h/v1?api-version=2024&api_key=***&sig=***#top"
/// );
/// ```
#[must_use]
pub fn redact_url(url: &str) -> Cow<'_, str> {
    let ranges = secret_ranges(url);
    if ranges.is_empty() {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len());
    let mut at = 0;
    for r in ranges {
        out.push_str(&url[at..r.start]);
        out.push_str("***");
        at = r.end;
    }
    out.push_str(&url[at..]);
    Cow::Owned(out)
}

/// `text` (an error message that may quote `url`, e.g. one from the HTTP library) without
/// `url`'s credentials (SPEC S2): every occurrence of `url` itself is written redacted
/// ([`redact_url`]), then every remaining occurrence of one of its secrets of 4 bytes or more
/// (the userinfo, a key parameter's value, percent-encoded or not as the URL wrote it) becomes
/// `***`.
#[must_use]
pub fn scrub_url_secrets<'a>(text: &'a str, url: &str) -> Cow<'a, str> {
    let ranges = secret_ranges(url);
    if ranges.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = text.replace(url, &redact_url(url));
    for r in ranges {
        let secret = &url[r];
        if secret.len() >= 4 {
            out = out.replace(secret, "***");
        }
        if let Some((_, password)) = secret.split_once(':')
            && password.len() >= 4
        {
            out = out.replace(password, "***");
        }
    }
    if out == text {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s6_every_control_a_terminal_obeys_is_escaped_and_nothing_else() {
        for c in (0u32..0x20).chain(0x7f..0xa0).chain([0x2028, 0x2029]) {
            let c = char::from_u32(c).unwrap();
            let escaped = escape_controls(&c.to_string(), &[]).into_owned();
            assert!(escaped.starts_with('\\'), "{c:?}: {escaped}");
            assert!(!escaped.chars().any(is_unsafe_control), "{c:?}: {escaped}");
        }
        for plain in ["plain text", "é ü 🐝 \\x1b literal", "tab-free", ""] {
            assert!(
                matches!(escape_controls(plain, &[]), Cow::Borrowed(_)),
                "{plain}"
            );
        }
        assert_eq!(escape_controls("a\u{0}b\u{7f}c", &[]), "a\\x00b\\x7fc");
        assert_eq!(escape_controls("\u{85}\u{2029}", &[]), "\\u{85}\\u{2029}");
        assert_eq!(escape_controls("a\nb\rc", &['\n']), "a\nb\\rc");
    }

    #[test]
    fn s6_json_keeps_its_value_and_loses_the_raw_c1_and_separators() {
        let text = "a\u{9b}2J\u{2028}b\u{1b}[31m\u{85}";
        let json = serde_json::json!({"msg": text}).to_string();
        assert!(
            json.contains('\u{9b}'),
            "serde_json writes the 0x80–0x9F controls raw: {json:?}"
        );
        let safe = escape_json_controls(&json);
        assert!(!safe.chars().any(is_unsafe_control), "{safe:?}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["msg"], text, "the same value");
        assert!(matches!(
            escape_json_controls("{\"a\":1}"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn s2_credentials_in_urls_are_redacted_and_the_rest_kept() {
        for (url, shown) in [
            ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
            ("https://u:p@h:1/v1", "https://***@h:1/v1"),
            ("https://token@h/v1?x=1", "https://***@h/v1?x=1"),
            ("https://h/p@q", "https://h/p@q"),
            ("https://h/v1?key=AIza", "https://h/v1?key=***"),
            (
                "https://h/v1?Api-Key=1&api-version=2&access_token=3",
                "https://h/v1?Api-Key=***&api-version=2&access_token=***",
            ),
            ("https://h/v1?key=", "https://h/v1?key="),
            (
                "https://h/?X-Amz-Signature=abc&a",
                "https://h/?X-Amz-Signature=***&a",
            ),
            (
                "https://a:b@h/?token=t#frag",
                "https://***@h/?token=***#frag",
            ),
            ("no scheme user:pw@host?password=x", "***@host?password=***"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn s2_an_error_text_quoting_the_url_or_its_secrets_is_scrubbed() {
        let url = "https://bob:hunter22@proxy.example/v1?api_key=sk-12345";
        let text = format!("bad uri {url}: connect failed for bob:hunter22 (hunter22)");
        let clean = scrub_url_secrets(&text, url);
        assert!(
            !clean.contains("hunter22") && !clean.contains("sk-12345"),
            "{clean}"
        );
        assert!(
            clean.contains("https://***@proxy.example/v1?api_key=***"),
            "{clean}"
        );
        assert!(matches!(
            scrub_url_secrets("nothing to hide", url),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            scrub_url_secrets("a b", "https://h/v1"),
            Cow::Borrowed(_)
        ));
        // Secrets under 4 bytes are replaced only where the whole URL is quoted.
        let short = "https://h/v1?key=ab";
        assert_eq!(
            scrub_url_secrets("ab at https://h/v1?key=ab", short),
            "ab at https://h/v1?key=***"
        );
    }

    #[test]
    fn a_prefix_never_splits_a_character() {
        assert_eq!(utf8_prefix("héllo", 10), "héllo");
        assert_eq!(
            utf8_prefix("héllo", 2),
            "h",
            "é is two bytes: cut before it"
        );
        assert_eq!(utf8_prefix("héllo", 3), "hé");
        assert_eq!(utf8_prefix("🐝", 3), "");
        assert_eq!(utf8_prefix("", 0), "");
    }
}
