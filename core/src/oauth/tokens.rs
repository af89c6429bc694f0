//! Token endpoint answers (RFC 6749 §5.1 success, §5.2 error; RFC 8693 §2.2 token exchange)
//! and the tokens the agent holds.

use super::metadata::quote_for_message;
use super::secrets::Secret;
use crate::time::MonoTime;
use serde_json::Value;

/// `requested_token_type` / `issued_token_type` of an Identity Assertion JWT Authorization
/// Grant (SEP-990).
pub(crate) const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";

/// Tokens issued for one MCP server. `Debug` shows no token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenSet {
    /// The bearer access token.
    pub(crate) access_token: Secret,
    /// The refresh token, if one was issued (or kept from before: RFC 6749 §6 lets a refresh
    /// answer omit it).
    pub(crate) refresh_token: Option<Secret>,
    /// The granted scopes (`scope` of the answer, else the ones requested, RFC 6749 §5.1).
    pub(crate) scope: Option<String>,
    /// When the access token expires on the runtime's clock (`expires_in` after the answer).
    pub(crate) expires_at: Option<MonoTime>,
    /// The same instant in milliseconds since the Unix epoch, for the token file.
    pub(crate) expires_at_unix_ms: Option<u64>,
}

/// A refused token request: the OAuth `error` code when the answer had one, and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenError {
    /// `error` (`invalid_grant`, `invalid_client` …), if the answer was an OAuth error.
    pub(crate) code: Option<String>,
    /// A sentence for the user.
    pub(crate) message: String,
}

/// The clocks a token answer is read against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clocks {
    /// The runtime's monotonic time.
    pub(crate) now: MonoTime,
    /// Milliseconds since the Unix epoch at the same instant.
    pub(crate) unix_ms: u64,
}

/// Reads a token endpoint answer (`status`, JSON `body`) to a request that asked for
/// `requested_scope`.
///
/// # Errors
/// An OAuth error answer (`error`, `error_description`), a non-JSON body, no `access_token`,
/// or a `token_type` other than `Bearer` (RFC 6750; case-insensitive).
pub(crate) fn parse_token_response(
    status: u16,
    body: &[u8],
    requested_scope: Option<&str>,
    clocks: Clocks,
) -> Result<TokenSet, TokenError> {
    let doc = read_answer(status, body)?;
    let access = doc
        .get("access_token")
        .and_then(Value::as_str)
        .unwrap_or("");
    if access.is_empty() {
        return Err(plain("the token endpoint answered without an access_token"));
    }
    let token_type = doc.get("token_type").and_then(Value::as_str).unwrap_or("");
    if !token_type.eq_ignore_ascii_case("bearer") {
        return Err(plain(&format!(
            "the token endpoint issued a {} token, not a Bearer token",
            quote_for_message(token_type)
        )));
    }
    let expires_in = doc.get("expires_in").and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
    });
    Ok(TokenSet {
        access_token: Secret::new(access),
        refresh_token: doc
            .get("refresh_token")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(Secret::new),
        scope: doc
            .get("scope")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| requested_scope.map(str::to_owned)),
        expires_at: expires_in.map(|s| clocks.now.plus_ms(s.saturating_mul(1000))),
        expires_at_unix_ms: expires_in
            .map(|s| clocks.unix_ms.saturating_add(s.saturating_mul(1000))),
    })
}

/// Reads an RFC 8693 token exchange answer that must carry an ID-JAG (SEP-990: the
/// `access_token` field holds it, `issued_token_type` says so, `token_type` is `N_A`).
///
/// # Errors
/// As [`parse_token_response`], or another `issued_token_type`.
pub(crate) fn parse_id_jag_response(status: u16, body: &[u8]) -> Result<Secret, TokenError> {
    let doc = read_answer(status, body)?;
    let issued = doc
        .get("issued_token_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if issued != ID_JAG {
        return Err(plain(&format!(
            "the identity provider issued a {} token, not an identity assertion grant",
            quote_for_message(issued)
        )));
    }
    match doc.get("access_token").and_then(Value::as_str) {
        Some(t) if !t.is_empty() => Ok(Secret::new(t)),
        _ => Err(plain("the identity provider answered without the grant")),
    }
}

/// The JSON object of a 2xx answer, or the error an error answer carries.
fn read_answer(status: u16, body: &[u8]) -> Result<serde_json::Map<String, Value>, TokenError> {
    let doc = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Some(map),
        Ok(_) | Err(_) => None,
    };
    if !(200..300).contains(&status) {
        let code = doc
            .as_ref()
            .and_then(|d| d.get("error"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let description = doc
            .as_ref()
            .and_then(|d| d.get("error_description"))
            .and_then(Value::as_str);
        let message = match (&code, description) {
            (Some(c), Some(d)) => format!(
                "the token endpoint refused the request: {} ({})",
                quote_for_message(c),
                quote_for_message(d)
            ),
            (Some(c), None) => format!(
                "the token endpoint refused the request: {}",
                quote_for_message(c)
            ),
            (None, _) => format!("the token endpoint answered HTTP {status}"),
        };
        return Err(TokenError { code, message });
    }
    doc.ok_or_else(|| plain("the token endpoint's answer is not a JSON object"))
}

fn plain(message: &str) -> TokenError {
    TokenError {
        code: None,
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CLOCKS: Clocks = Clocks {
        now: MonoTime(std::time::Duration::from_secs(5)),
        unix_ms: 1_000_000,
    };

    #[test]
    fn a_bearer_answer_gives_tokens_expiry_and_scope() {
        let body = json!({"access_token": "at", "token_type": "bearer", "expires_in": 3600, "refresh_token": "rt", "scope": "a b"});
        let t = parse_token_response(200, body.to_string().as_bytes(), Some("x"), CLOCKS).unwrap();
        assert_eq!(t.access_token.expose(), "at");
        assert_eq!(t.refresh_token.unwrap().expose(), "rt");
        assert_eq!(t.scope.as_deref(), Some("a b"));
        assert_eq!(t.expires_at, Some(CLOCKS.now.plus_ms(3_600_000)));
        assert_eq!(t.expires_at_unix_ms, Some(1_000_000 + 3_600_000));
        let body = json!({"access_token": "at", "token_type": "Bearer", "expires_in": "60"});
        let t =
            parse_token_response(200, body.to_string().as_bytes(), Some("req"), CLOCKS).unwrap();
        assert_eq!(
            t.scope.as_deref(),
            Some("req"),
            "no scope answered: the requested one"
        );
        assert_eq!(t.expires_at_unix_ms, Some(1_060_000));
        assert!(t.refresh_token.is_none());
    }

    #[test]
    fn errors_and_garbage_are_sentences_with_the_oauth_code() {
        let body = json!({"error": "invalid_grant", "error_description": "code used"});
        let e = parse_token_response(400, body.to_string().as_bytes(), None, CLOCKS).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("invalid_grant"));
        assert!(
            e.message.contains("invalid_grant") && e.message.contains("code used"),
            "{}",
            e.message
        );
        let e = parse_token_response(502, b"<html>Bad gateway</html>", None, CLOCKS).unwrap_err();
        assert_eq!(e.code, None);
        assert!(e.message.contains("502"), "{}", e.message);
        let e = parse_token_response(200, b"<html>", None, CLOCKS).unwrap_err();
        assert!(e.message.contains("not a JSON object"));
        let e = parse_token_response(200, br#"{"token_type":"Bearer"}"#, None, CLOCKS).unwrap_err();
        assert!(e.message.contains("access_token"));
        let e = parse_token_response(
            200,
            br#"{"access_token":"a","token_type":"mac"}"#,
            None,
            CLOCKS,
        )
        .unwrap_err();
        assert!(e.message.contains("\"mac\""), "{}", e.message);
    }

    #[test]
    fn an_id_jag_exchange_answer_must_say_it_issued_one() {
        let body = json!({"access_token": "jag", "issued_token_type": ID_JAG, "token_type": "N_A"});
        assert_eq!(
            parse_id_jag_response(200, body.to_string().as_bytes())
                .unwrap()
                .expose(),
            "jag"
        );
        let body = json!({"access_token": "x", "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"});
        assert!(
            parse_id_jag_response(200, body.to_string().as_bytes())
                .unwrap_err()
                .message
                .contains("not an identity assertion grant")
        );
        let body = json!({"error": "invalid_grant"});
        assert_eq!(
            parse_id_jag_response(400, body.to_string().as_bytes())
                .unwrap_err()
                .code
                .as_deref(),
            Some("invalid_grant")
        );
    }
}
