//! Absolute `http`/`https` URLs (RFC 3986, the subset HTTP needs): parsing, the parts a
//! request and a comparison need, well-known URI construction (RFC 8615, RFC 8414 §3.1,
//! RFC 9728 §3.1), reference resolution for `Location` (RFC 3986 §5.2) and the
//! `application/x-www-form-urlencoded` codec (WHATWG URL §5) of OAuth requests.
//!
//! Written here rather than taken from the `url` crate, whose internationalised host names
//! bring about twenty crates (idna, icu): hosts are ASCII here (a non-ASCII host is an error,
//! as in a request line), which is what every MCP and OAuth URL is in practice.

use std::fmt;

/// An absolute `http://` or `https://` URL. Scheme and host are kept lower-case; a port equal
/// to the scheme's default (80, 443) is dropped, so two spellings of one URL compare equal
/// ([`HttpUrl::canonical`]). The path is kept as written (`""` when the URL has none).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct HttpUrl {
    https: bool,
    /// `user[:password]` before `@`, if any (redacted by `Display`, SPEC S2).
    userinfo: Option<String>,
    /// Lower-case reg-name or IPv4 address, or an IPv6 literal with its brackets.
    host: String,
    /// An explicit non-default port.
    port: Option<u16>,
    /// As written: empty, or starting with `/`.
    path: String,
    /// After `?`, without it.
    query: Option<String>,
    /// After `#`, without it.
    fragment: Option<String>,
}

/// Why a string is not an absolute http(s) URL; `Display` is a short phrase for messages
/// ("not an http or https URL").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UrlError {
    /// Another scheme, or none.
    #[error("not an http or https URL")]
    Scheme,
    /// No host after `//`, or a host with characters a host cannot have.
    #[error("the URL has no valid host")]
    Host,
    /// A port that is not a number from 1 to 65535.
    #[error("the URL has an invalid port")]
    Port,
    /// Spaces, control characters or non-ASCII bytes (they must be percent-encoded).
    #[error("the URL contains characters that must be percent-encoded")]
    Characters,
}

impl HttpUrl {
    /// Parses an absolute http(s) URL (scheme in any case). Leading and trailing blanks are
    /// not accepted: callers trim what they read.
    ///
    /// # Errors
    /// [`UrlError`] naming the first problem.
    pub(crate) fn parse(text: &str) -> Result<HttpUrl, UrlError> {
        if text
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || !b.is_ascii())
        {
            return Err(UrlError::Characters);
        }
        let (scheme, rest) = text.split_once("://").ok_or(UrlError::Scheme)?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err(UrlError::Scheme),
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((r, f)) => (r, Some(f.to_owned())),
            None => (rest, None),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q.to_owned())),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_owned()), h),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport)?;
        let default = if https { 443 } else { 80 };
        Ok(HttpUrl {
            https,
            userinfo,
            host,
            port: port.filter(|&p| p != default),
            path: path.to_owned(),
            query,
            fragment,
        })
    }

    /// Whether the scheme is `https`.
    pub(crate) fn is_https(&self) -> bool {
        self.https
    }

    /// The host as written in the URL (lower case; IPv6 with brackets).
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// The port to connect to: the explicit one, else 443 or 80.
    pub(crate) fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(if self.https { 443 } else { 80 })
    }

    /// The path as written (`""` or starting with `/`).
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The query after `?`, if any.
    pub(crate) fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }

    /// Whether the URL carries a fragment (`#…`), which a resource identifier must not
    /// (RFC 8707 §2).
    pub(crate) fn has_fragment(&self) -> bool {
        self.fragment.is_some()
    }

    /// Whether the host is the loopback interface: `localhost` (and `*.localhost`, RFC 6761),
    /// `127.0.0.0/8`, or `[::1]`. OAuth allows plain `http` only there (OAuth 2.1 §1.5,
    /// RFC 8252 §7.3).
    pub(crate) fn is_loopback(&self) -> bool {
        let h = self.host.as_str();
        h == "localhost"
            || h.ends_with(".localhost")
            || h == "[::1]"
            || h.strip_prefix("127.").is_some_and(|rest| {
                let parts: Vec<&str> = rest.split('.').collect();
                parts.len() == 3 && parts.iter().all(|p| p.parse::<u8>().is_ok())
            })
    }

    /// `scheme://host[:port]` (RFC 6454 serialisation), e.g. `https://example.com:8443`.
    pub(crate) fn origin(&self) -> String {
        let mut s = String::with_capacity(self.host.len() + 14);
        s.push_str(if self.https { "https://" } else { "http://" });
        s.push_str(&self.host);
        if let Some(p) = self.port {
            s.push(':');
            s.push_str(&p.to_string());
        }
        s
    }

    /// The form used to compare identifiers (resource indicators, issuers, RFC 8707 §2 and the
    /// MCP authorization spec's "canonical server URI"): lower-case scheme and host, no default
    /// port, no userinfo, no fragment, and no trailing `/` at the end of the path (so
    /// `https://x/` and `https://x` are one resource, as are `https://x/mcp/` and
    /// `https://x/mcp`), query kept.
    pub(crate) fn canonical(&self) -> String {
        let mut s = self.origin();
        s.push_str(self.path.strip_suffix('/').unwrap_or(&self.path));
        if let Some(q) = &self.query {
            s.push('?');
            s.push_str(q);
        }
        s
    }

    /// The request target of an HTTP/1.1 request line: the path (`/` when empty) and the query.
    pub(crate) fn request_target(&self) -> String {
        let mut s = if self.path.is_empty() {
            "/".to_owned()
        } else {
            self.path.clone()
        };
        if let Some(q) = &self.query {
            s.push('?');
            s.push_str(q);
        }
        s
    }

    /// The URL with `suffix` (e.g. `oauth-protected-resource`) inserted as
    /// `/.well-known/<suffix>` between the host and the path, the path's terminating `/`
    /// removed, query kept, fragment dropped (RFC 8414 §3.1, RFC 9728 §3.1):
    /// `https://x/public/mcp` → `https://x/.well-known/oauth-protected-resource/public/mcp`.
    pub(crate) fn well_known_inserted(&self, suffix: &str) -> HttpUrl {
        let path = self.path.strip_suffix('/').unwrap_or(&self.path);
        HttpUrl {
            path: format!("/.well-known/{suffix}{path}"),
            userinfo: None,
            fragment: None,
            ..self.clone()
        }
    }

    /// The URL with `/.well-known/<suffix>` appended to its path (its terminating `/`
    /// removed), query and fragment dropped (OpenID Connect Discovery 1.0 §4):
    /// `https://x/tenant1` → `https://x/tenant1/.well-known/openid-configuration`.
    pub(crate) fn well_known_appended(&self, suffix: &str) -> HttpUrl {
        let path = self.path.strip_suffix('/').unwrap_or(&self.path);
        HttpUrl {
            path: format!("{path}/.well-known/{suffix}"),
            userinfo: None,
            query: None,
            fragment: None,
            ..self.clone()
        }
    }

    /// The URL with only its origin: path `""`, no query or fragment.
    pub(crate) fn root(&self) -> HttpUrl {
        HttpUrl {
            path: String::new(),
            userinfo: None,
            query: None,
            fragment: None,
            ..self.clone()
        }
    }

    /// The URL with `path` (which must be empty or start with `/`) and no query or fragment.
    pub(crate) fn with_path(&self, path: &str) -> HttpUrl {
        HttpUrl {
            path: path.to_owned(),
            query: None,
            fragment: None,
            ..self.clone()
        }
    }

    /// The URL with `pairs` appended to its query as `name=value` pairs, each form-encoded
    /// ([`form_encode`]).
    pub(crate) fn with_query_pairs<'a>(
        &self,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> HttpUrl {
        let mut query = self.query.clone().unwrap_or_default();
        for (name, value) in pairs {
            if !query.is_empty() {
                query.push('&');
            }
            query.push_str(&form_component(name));
            query.push('=');
            query.push_str(&form_component(value));
        }
        HttpUrl {
            query: Some(query),
            fragment: None,
            ..self.clone()
        }
    }

    /// Resolves `reference` (a `Location` header value) against this URL (RFC 3986 §5.2):
    /// absolute, scheme-relative (`//host/p`), absolute-path (`/p`) and relative (`p`, `../p`)
    /// references, dot segments removed.
    ///
    /// # Errors
    /// When the result is not an http(s) URL ([`UrlError`]).
    pub(crate) fn join(&self, reference: &str) -> Result<HttpUrl, UrlError> {
        let reference = reference.trim();
        if let Some((scheme, _)) = reference.split_once(':')
            && !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            && !scheme.contains('/')
        {
            return HttpUrl::parse(reference);
        }
        if let Some(rest) = reference.strip_prefix("//") {
            let scheme = if self.https { "https" } else { "http" };
            return HttpUrl::parse(&format!("{scheme}://{rest}"));
        }
        let (reference, fragment) = match reference.split_once('#') {
            Some((r, f)) => (r, Some(f.to_owned())),
            None => (reference, None),
        };
        let (ref_path, ref_query) = match reference.split_once('?') {
            Some((p, q)) => (p, Some(q.to_owned())),
            None => (reference, None),
        };
        if ref_path
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || !b.is_ascii())
            || ref_query
                .as_deref()
                .is_some_and(|q| q.bytes().any(|b| b <= b' ' || !b.is_ascii()))
        {
            return Err(UrlError::Characters);
        }
        let (path, query) = if ref_path.is_empty() {
            (self.path.clone(), ref_query.or_else(|| self.query.clone()))
        } else if ref_path.starts_with('/') {
            (remove_dot_segments(ref_path), ref_query)
        } else {
            let base = match self.path.rfind('/') {
                Some(i) => &self.path[..=i],
                None => "/",
            };
            (remove_dot_segments(&format!("{base}{ref_path}")), ref_query)
        };
        Ok(HttpUrl {
            path,
            query,
            fragment,
            userinfo: None,
            ..self.clone()
        })
    }

    /// The URL as sent with its credentials replaced by `***`: the userinfo and the values of
    /// key, token, secret, password and signature query parameters (SPEC S2: never printed;
    /// the one rule for every printed URL, [`crate::text::redact_url`]).
    pub(crate) fn redacted(&self) -> String {
        crate::text::redact_url(&self.as_sent()).into_owned()
    }

    /// The full URL as it is sent (userinfo kept, fragment dropped: a fragment never leaves
    /// the client).
    pub(crate) fn as_sent(&self) -> String {
        let mut s = String::new();
        s.push_str(if self.https { "https://" } else { "http://" });
        if let Some(u) = &self.userinfo {
            s.push_str(u);
            s.push('@');
        }
        s.push_str(&self.host);
        if let Some(p) = self.port {
            s.push(':');
            s.push_str(&p.to_string());
        }
        s.push_str(&self.path);
        if let Some(q) = &self.query {
            s.push('?');
            s.push_str(q);
        }
        s
    }
}

/// `Display` is [`HttpUrl::redacted`]: safe in logs and notices.
impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HttpUrl({})", self.redacted())
    }
}

/// Splits `host[:port]` (IPv6 in brackets) and checks both.
fn split_host_port(hostport: &str) -> Result<(String, Option<u16>), UrlError> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let end = rest.find(']').ok_or(UrlError::Host)?;
        let inner = &rest[..end];
        if inner.is_empty()
            || !inner
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err(UrlError::Host);
        }
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(UrlError::Host),
        };
        (format!("[{}]", inner.to_ascii_lowercase()), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (hostport.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty()
        || !host.starts_with('[')
            && !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b))
    {
        return Err(UrlError::Host);
    }
    let port = match port {
        None | Some("") => None,
        Some(p) => {
            if !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(UrlError::Port);
            }
            match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(UrlError::Port),
            }
        }
    };
    Ok((host, port))
}

/// RFC 3986 §5.2.4 on an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let mut s = String::with_capacity(path.len());
    for seg in out {
        s.push('/');
        s.push_str(seg);
    }
    if s.is_empty() { "/".to_owned() } else { s }
}

/// The bytes a `file:` URI path keeps as they are: ASCII alphanumerics, `-._~` (RFC 3986
/// unreserved) and the `/` separators; every other byte is `%XX`.
const FILE_PATH: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// The `file://` URI of the absolute local path `path` (RFC 8089, empty authority; the path's
/// UTF-8 bytes percent-encoded outside [`FILE_PATH`]): `/home/me/my dir` →
/// `file:///home/me/my%20dir`. An MCP root's `uri` (MCP 2025-11-25 client/roots).
pub(crate) fn file_uri(path: &str) -> String {
    format!(
        "file://{}",
        percent_encoding::utf8_percent_encode(path, FILE_PATH)
    )
}

/// The bytes form-encoding leaves as they are: ASCII alphanumerics and `*-._` (WHATWG URL
/// §5.2, `application/x-www-form-urlencoded` serializer); space becomes `+`, everything else
/// `%XX`.
const FORM: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'*')
    .remove(b'-')
    .remove(b'.')
    .remove(b'_');

/// One name or value form-encoded (`a b&c` → `a+b%26c`).
pub(crate) fn form_component(s: &str) -> String {
    let encoded = percent_encoding::utf8_percent_encode(s, FORM).to_string();
    encoded.replace("%20", "+")
}

/// `name=value` pairs joined by `&`, each form-encoded: the body of an OAuth token or
/// registration request (`application/x-www-form-urlencoded`, RFC 6749 §4.1.3).
pub(crate) fn form_encode<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (name, value) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&form_component(name));
        out.push('=');
        out.push_str(&form_component(value));
    }
    out
}

/// A form-encoded query or body decoded into `(name, value)` pairs in order: `+` is a space,
/// `%XX` a byte, invalid UTF-8 replaced (U+FFFD); empty pieces skipped.
pub(crate) fn form_decode(text: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let spaced = s.replace('+', " ");
        percent_encoding::percent_decode_str(&spaced)
            .decode_utf8_lossy()
            .into_owned()
    };
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((n, v)) => (decode(n), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> HttpUrl {
        HttpUrl::parse(s).unwrap()
    }

    #[test]
    fn scheme_and_host_are_lowered_and_a_default_port_is_dropped() {
        let u = url("HTTPS://Example.COM:443/MCP?a=B#frag");
        assert_eq!(u.canonical(), "https://example.com/MCP?a=B");
        assert_eq!(u.origin(), "https://example.com");
        assert!(u.has_fragment());
        assert_eq!(url("http://x:80").origin(), "http://x");
        assert_eq!(url("http://x:8080/").origin(), "http://x:8080");
        assert_eq!(url("http://x:8080/").port_or_default(), 8080);
        assert_eq!(url("https://x").port_or_default(), 443);
    }

    #[test]
    fn m13_a_file_uri_keeps_slashes_and_unreserved_bytes_and_encodes_the_rest() {
        assert_eq!(file_uri("/home/me/proj"), "file:///home/me/proj");
        assert_eq!(
            file_uri("/tmp/my dir/a#b?c%d"),
            "file:///tmp/my%20dir/a%23b%3Fc%25d"
        );
        assert_eq!(file_uri("/w/~x-y_z.rs"), "file:///w/~x-y_z.rs");
        assert_eq!(file_uri("/w/é"), "file:///w/%C3%A9", "UTF-8 bytes");
    }

    #[test]
    fn a_trailing_slash_does_not_change_the_canonical_form() {
        assert_eq!(url("https://x/").canonical(), url("https://x").canonical());
        assert_eq!(url("https://x/mcp/").canonical(), "https://x/mcp");
        assert_ne!(
            url("https://x/mcp").canonical(),
            url("https://x/mcp2").canonical()
        );
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        assert_eq!(HttpUrl::parse("ftp://x"), Err(UrlError::Scheme));
        assert_eq!(HttpUrl::parse("example.com/mcp"), Err(UrlError::Scheme));
        assert_eq!(HttpUrl::parse("https:///p"), Err(UrlError::Host));
        assert_eq!(HttpUrl::parse("https://x:0/"), Err(UrlError::Port));
        assert_eq!(HttpUrl::parse("https://x:70000/"), Err(UrlError::Port));
        assert_eq!(HttpUrl::parse("https://x:8a/"), Err(UrlError::Port));
        assert_eq!(HttpUrl::parse("https://x y/"), Err(UrlError::Characters));
        assert_eq!(HttpUrl::parse("https://é.com/"), Err(UrlError::Characters));
        assert_eq!(HttpUrl::parse("https://[zz]/"), Err(UrlError::Host));
        assert_eq!(HttpUrl::parse("https://a<b/"), Err(UrlError::Host));
    }

    #[test]
    fn ipv6_hosts_keep_their_brackets_and_ports() {
        let u = url("http://[::1]:3000/cb");
        assert_eq!(u.host(), "[::1]");
        assert_eq!(u.port_or_default(), 3000);
        assert!(u.is_loopback());
    }

    #[test]
    fn loopback_is_localhost_127_slash_8_and_ipv6_one() {
        for l in [
            "http://localhost",
            "http://app.localhost:1",
            "http://127.0.0.1:9",
            "http://127.1.2.3",
        ] {
            assert!(url(l).is_loopback(), "{l}");
        }
        for n in [
            "http://localhost.evil.com",
            "http://127.0.0.1.nip.io",
            "http://10.0.0.1",
            "http://127.0.0",
        ] {
            assert!(!url(n).is_loopback(), "{n}");
        }
    }

    #[test]
    fn well_known_uris_are_inserted_before_the_path_or_appended_to_it() {
        let u = url("https://example.com/public/mcp");
        assert_eq!(
            u.well_known_inserted("oauth-protected-resource").as_sent(),
            "https://example.com/.well-known/oauth-protected-resource/public/mcp"
        );
        assert_eq!(
            url("https://auth.example.com/tenant1/")
                .well_known_inserted("oauth-authorization-server")
                .as_sent(),
            "https://auth.example.com/.well-known/oauth-authorization-server/tenant1"
        );
        assert_eq!(
            url("https://auth.example.com")
                .well_known_inserted("openid-configuration")
                .as_sent(),
            "https://auth.example.com/.well-known/openid-configuration"
        );
        assert_eq!(
            url("https://auth.example.com/tenant1")
                .well_known_appended("openid-configuration")
                .as_sent(),
            "https://auth.example.com/tenant1/.well-known/openid-configuration"
        );
        assert_eq!(
            url("https://x/a?q=1").well_known_inserted("s").as_sent(),
            "https://x/.well-known/s/a?q=1"
        );
    }

    #[test]
    fn references_resolve_as_rfc_3986_says() {
        let base = url("https://a.com/b/c/d?q#f");
        assert_eq!(base.join("g").unwrap().as_sent(), "https://a.com/b/c/g");
        assert_eq!(base.join("./g/").unwrap().as_sent(), "https://a.com/b/c/g/");
        assert_eq!(base.join("../g").unwrap().as_sent(), "https://a.com/b/g");
        assert_eq!(
            base.join("../../../../g").unwrap().as_sent(),
            "https://a.com/g"
        );
        assert_eq!(
            base.join("/g?x=1").unwrap().as_sent(),
            "https://a.com/g?x=1"
        );
        assert_eq!(base.join("?y").unwrap().as_sent(), "https://a.com/b/c/d?y");
        assert_eq!(base.join("").unwrap().as_sent(), "https://a.com/b/c/d?q");
        assert_eq!(
            base.join("//other.org/p").unwrap().as_sent(),
            "https://other.org/p"
        );
        assert_eq!(base.join("http://z/").unwrap().as_sent(), "http://z/");
        assert_eq!(base.join("javascript:alert(1)"), Err(UrlError::Scheme));
        assert_eq!(base.join("/a b"), Err(UrlError::Characters));
    }

    #[test]
    fn userinfo_is_redacted_in_display_and_kept_when_sent() {
        let u = url("https://user:secret@x.com/p");
        assert_eq!(u.to_string(), "https://***@x.com/p");
        assert!(!format!("{u:?}").contains("secret"));
        assert_eq!(u.as_sent(), "https://user:secret@x.com/p");
        assert_eq!(u.canonical(), "https://x.com/p");
        // S2: a key in the query is a credential too.
        let k = url("https://x.com/mcp?api_key=sk-1&v=2");
        assert_eq!(k.to_string(), "https://x.com/mcp?api_key=***&v=2");
    }

    #[test]
    fn the_request_target_is_the_path_and_query() {
        assert_eq!(url("https://x").request_target(), "/");
        assert_eq!(url("https://x/a/b?c=d#e").request_target(), "/a/b?c=d");
    }

    #[test]
    fn form_encoding_round_trips_and_escapes_what_it_must() {
        let body = form_encode([
            ("a b", "c&d=e"),
            ("redirect_uri", "http://127.0.0.1:5/cb"),
            ("x", "é+~"),
        ]);
        assert_eq!(
            body,
            "a+b=c%26d%3De&redirect_uri=http%3A%2F%2F127.0.0.1%3A5%2Fcb&x=%C3%A9%2B%7E"
        );
        assert_eq!(
            form_decode(&body),
            vec![
                ("a b".to_owned(), "c&d=e".to_owned()),
                (
                    "redirect_uri".to_owned(),
                    "http://127.0.0.1:5/cb".to_owned()
                ),
                ("x".to_owned(), "é+~".to_owned()),
            ]
        );
        assert_eq!(
            form_decode("a&&b=%ZZ&c=%ff"),
            vec![
                ("a".to_owned(), String::new()),
                ("b".to_owned(), "%ZZ".to_owned()),
                ("c".to_owned(), "\u{fffd}".to_owned()),
            ]
        );
    }

    #[test]
    fn query_pairs_are_appended_after_an_existing_query() {
        let u = url("https://as.com/authorize?prompt=consent").with_query_pairs([("scope", "a b")]);
        assert_eq!(
            u.as_sent(),
            "https://as.com/authorize?prompt=consent&scope=a+b"
        );
        assert_eq!(
            url("https://as.com/authorize")
                .with_query_pairs([("k", "v")])
                .query(),
            Some("k=v")
        );
    }
}
