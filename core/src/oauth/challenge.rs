//! `WWW-Authenticate` challenges (RFC 9110 §11.6.1 syntax, RFC 6750 §3 `Bearer` parameters,
//! RFC 9728 §5.1 `resource_metadata`): what a `401` or `403` from an MCP server asks of us.
//!
//! The grammar is ambiguous at commas (a comma separates both challenges and parameters); the
//! parser reads `name=value` after a comma as a parameter of the current challenge and
//! anything else as the next challenge. Garbage never fails the parse: an unreadable piece is
//! skipped up to the next comma, and a header with no `Bearer` challenge simply gives none.

/// The `Bearer` challenge of a response, with the parameters MCP authorization reads
/// (MCP 2025-11-25 basic/authorization "Protected Resource Metadata Discovery Requirements",
/// "Scope Challenge Handling").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct BearerChallenge {
    /// `resource_metadata`: the URL of the protected resource metadata (RFC 9728 §5.1).
    pub(crate) resource_metadata: Option<String>,
    /// `scope`: space-separated scopes the request needs (RFC 6750 §3).
    pub(crate) scope: Option<String>,
    /// `error`: `invalid_token`, `insufficient_scope`, `invalid_request` (RFC 6750 §3.1).
    pub(crate) error: Option<String>,
    /// `error_description`: human-readable text from the server.
    pub(crate) error_description: Option<String>,
}

impl BearerChallenge {
    /// Whether the server says the token lacks scope (`error="insufficient_scope"`).
    pub(crate) fn is_insufficient_scope(&self) -> bool {
        self.error.as_deref() == Some("insufficient_scope")
    }
}

/// One parsed challenge: its scheme (lower case) and its parameters (names lower case, values
/// unquoted), or its `token68`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
    token68: Option<String>,
}

/// The first `Bearer` challenge among `values` (every `WWW-Authenticate` field of a response,
/// in order; a field may hold several challenges). `None` when there is none; a `Bearer`
/// challenge without parameters gives an empty [`BearerChallenge`].
pub(crate) fn bearer_challenge<S: AsRef<str>>(values: &[S]) -> Option<BearerChallenge> {
    let challenge = values
        .iter()
        .flat_map(|v| parse(v.as_ref()))
        .find(|c| c.scheme == "bearer")?;
    let get = |name: &str| {
        challenge
            .params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    Some(BearerChallenge {
        resource_metadata: get("resource_metadata"),
        scope: get("scope").filter(|s| !s.trim().is_empty()),
        error: get("error"),
        error_description: get("error_description"),
    })
}

/// Bytes allowed in a `token` (RFC 9110 §5.6.2 tchar).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Bytes allowed in a `token68` before its trailing `=` (RFC 9110 §11.2).
fn is_token68_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~+/".contains(&b)
}

/// A cursor over one header value.
struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    /// Skips blanks and commas (empty list elements are allowed, RFC 9110 §5.6.1).
    fn skip_separators(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b',')) {
            self.i += 1;
        }
    }

    fn token(&mut self) -> Option<&'a str> {
        let start = self.i;
        while self.peek().is_some_and(is_tchar) {
            self.i += 1;
        }
        (self.i > start)
            .then(|| std::str::from_utf8(&self.s[start..self.i]).ok())
            .flatten()
    }

    /// A quoted-string after its opening quote was seen; backslash escapes one byte. An
    /// unterminated string runs to the end.
    fn quoted(&mut self) -> String {
        self.i += 1;
        let mut out = Vec::new();
        while let Some(b) = self.peek() {
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    if let Some(next) = self.peek() {
                        out.push(next);
                        self.i += 1;
                    }
                }
                other => out.push(other),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Skips to just after the next comma that is not inside a quoted string.
    fn skip_item(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b'"' => {
                    self.quoted();
                }
                b',' => {
                    self.i += 1;
                    return;
                }
                _ => self.i += 1,
            }
        }
    }

    /// Whether `name =` starts at the cursor (an auth-param rather than a new challenge or a
    /// token68 such as `abc==`).
    fn at_param(&self) -> bool {
        let mut j = self.i;
        let start = j;
        while self.s.get(j).copied().is_some_and(is_tchar) {
            j += 1;
        }
        if j == start {
            return false;
        }
        while matches!(self.s.get(j), Some(b' ' | b'\t')) {
            j += 1;
        }
        if self.s.get(j) != Some(&b'=') {
            return false;
        }
        j += 1;
        while matches!(self.s.get(j), Some(b' ' | b'\t')) {
            j += 1;
        }
        // `name=` followed by `=`, a comma or the end is a token68's padding.
        !matches!(self.s.get(j), None | Some(b'=' | b','))
    }
}

/// Every challenge of one header value, in order.
fn parse(value: &str) -> Vec<Challenge> {
    let mut c = Cursor {
        s: value.as_bytes(),
        i: 0,
    };
    let mut out: Vec<Challenge> = Vec::new();
    loop {
        c.skip_separators();
        if c.peek().is_none() {
            return out;
        }
        if !out.is_empty() && c.at_param() {
            // A parameter after a comma belongs to the challenge before it.
            if let Some(last) = out.last_mut()
                && let Some(param) = read_param(&mut c)
            {
                last.params.push(param);
            }
            continue;
        }
        let Some(scheme) = c.token() else {
            c.skip_item();
            continue;
        };
        let mut challenge = Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params: Vec::new(),
            token68: None,
        };
        c.skip_ws();
        if c.at_param() {
            if let Some(param) = read_param(&mut c) {
                challenge.params.push(param);
            }
        } else if c.peek().is_some_and(is_token68_char) {
            let start = c.i;
            while c.peek().is_some_and(is_token68_char) {
                c.i += 1;
            }
            while c.peek() == Some(b'=') {
                c.i += 1;
            }
            challenge.token68 = std::str::from_utf8(&c.s[start..c.i])
                .ok()
                .map(str::to_owned);
            c.skip_ws();
            if !matches!(c.peek(), None | Some(b',')) {
                c.skip_item();
            }
        }
        out.push(challenge);
    }
}

/// `name = (token / quoted-string)` at the cursor (checked by `at_param`), up to and not
/// including the next separator; the rest of a malformed item is skipped.
fn read_param(c: &mut Cursor<'_>) -> Option<(String, String)> {
    let name = c.token()?.to_ascii_lowercase();
    c.skip_ws();
    c.i += 1; // '='
    c.skip_ws();
    let value = if c.peek() == Some(b'"') {
        c.quoted()
    } else {
        c.token().unwrap_or_default().to_owned()
    };
    c.skip_ws();
    if !matches!(c.peek(), None | Some(b',')) {
        c.skip_item();
    }
    Some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(v: &str) -> Option<BearerChallenge> {
        bearer_challenge(&[v])
    }

    #[test]
    fn the_mcp_examples_give_their_metadata_url_and_scope() {
        let b = bearer(
            r#"Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource", scope="files:read""#,
        )
        .unwrap();
        assert_eq!(
            b.resource_metadata.as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource")
        );
        assert_eq!(b.scope.as_deref(), Some("files:read"));
        assert!(!b.is_insufficient_scope());
        let b = bearer(
            r#"Bearer error="insufficient_scope", scope="files:read files:write user:profile", resource_metadata="https://x/.well-known/oauth-protected-resource", error_description="Additional file write permission required""#,
        )
        .unwrap();
        assert!(b.is_insufficient_scope());
        assert_eq!(
            b.scope.as_deref(),
            Some("files:read files:write user:profile")
        );
        assert_eq!(
            b.error_description.as_deref(),
            Some("Additional file write permission required")
        );
    }

    #[test]
    fn names_and_schemes_match_in_any_case_and_tokens_need_no_quotes() {
        let b = bearer("BEARER Error=invalid_token,Scope=read").unwrap();
        assert_eq!(b.error.as_deref(), Some("invalid_token"));
        assert_eq!(b.scope.as_deref(), Some("read"));
    }

    #[test]
    fn the_bearer_challenge_is_found_among_others_and_across_fields() {
        let v = r#"Basic realm="a, b", Bearer realm="x", scope="s1 s2", Newauth abc=="#;
        let b = bearer(v).unwrap();
        assert_eq!(b.scope.as_deref(), Some("s1 s2"));
        let fields = ["Basic abc123==", r#"Bearer resource_metadata="https://r""#];
        let b = bearer_challenge(&fields).unwrap();
        assert_eq!(b.resource_metadata.as_deref(), Some("https://r"));
        let all = parse(v);
        assert_eq!(
            all.iter().map(|c| c.scheme.as_str()).collect::<Vec<_>>(),
            ["basic", "bearer", "newauth"]
        );
        assert_eq!(all[2].token68.as_deref(), Some("abc=="));
        assert_eq!(all[0].params, [("realm".to_owned(), "a, b".to_owned())]);
    }

    #[test]
    fn a_bare_bearer_and_no_bearer_are_told_apart() {
        assert_eq!(bearer("Bearer"), Some(BearerChallenge::default()));
        assert_eq!(
            bearer(r#"Bearer scope="""#),
            Some(BearerChallenge::default())
        );
        assert_eq!(bearer(r#"Basic realm="x""#), None);
        assert_eq!(bearer_challenge::<&str>(&[]), None);
    }

    #[test]
    fn escapes_and_garbage_do_not_break_the_parse() {
        let b = bearer(r#"Bearer error_description="say \"hi\"", scope=a"#).unwrap();
        assert_eq!(b.error_description.as_deref(), Some(r#"say "hi""#));
        assert_eq!(b.scope.as_deref(), Some("a"));
        for garbage in [
            "",
            ",,,",
            "=",
            "\"unterminated",
            "Bearer scope=\"unterminated",
            "@@@ , Bearer scope=x",
            "Bearer a=b c d, scope=z",
        ] {
            let _ = parse(garbage);
        }
        assert_eq!(
            bearer("@@@ , Bearer scope=x").unwrap().scope.as_deref(),
            Some("x")
        );
        assert_eq!(
            bearer("Bearer a=b c d, scope=z").unwrap().scope.as_deref(),
            Some("z")
        );
        assert_eq!(
            bearer("Bearer scope=\"unterminated")
                .unwrap()
                .scope
                .as_deref(),
            Some("unterminated")
        );
    }
}
