//! Authorization of an HTTP MCP server (MCP 2025-11-25 basic/authorization; SPEC M11), as the
//! HTTP transport sees it: the header each request carries, and what becomes of a request the
//! server answered `401` or `403`.
//!
//! The transport asks [`Authorization::header`] for every request it sends, and hands every
//! challenge to [`Authorization::on_challenge`], which answers with an [`AuthVerdict`]: send
//! the request again (a new header), hold it (a flow is running and will call the transport
//! back), or give up with a reason. This is the one place an authorization flow plugs into;
//! the transport knows nothing else about it.
//!
//! Today the only credential is the one the client configured: an `authorization` header in
//! the server entry's `headers`, sent with every request; a challenge is refused with a reason
//! that says what the server asked for. An OAuth flow (M11) answers challenges with
//! [`AuthVerdict::Retry`] or [`AuthVerdict::Wait`] and hands out the tokens it obtains as the
//! header.

/// A challenge of the server: a `401` or `403` answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// `401` (no or bad credentials) or `403` (e.g. `insufficient_scope`).
    pub(crate) status: u16,
    /// Every `WWW-Authenticate` header value, in order (RFC 9110 §11.6.1, RFC 6750 §3).
    pub(crate) www_authenticate: Vec<String>,
}

/// What the transport does with a challenged request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthVerdict {
    /// Send it again now, with [`Authorization::header`] (which changed).
    #[allow(
        dead_code,
        reason = "answered by the OAuth flow (SPEC M11), which plugs in here"
    )]
    Retry,
    /// Hold it: an authorization flow runs and tells the transport when to send it.
    #[allow(
        dead_code,
        reason = "answered by the OAuth flow (SPEC M11), which plugs in here"
    )]
    Wait,
    /// It fails with this text (during the handshake the server does not start).
    Refused(String),
}

/// The authorization state of one HTTP server. `Debug` never shows the credential.
#[derive(Default)]
pub(crate) struct Authorization {
    /// The `authorization` header value the entry configured, if any.
    configured: Option<String>,
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.configured.is_some() {
            "configured"
        } else {
            "none"
        };
        write!(f, "Authorization({shown})")
    }
}

impl Authorization {
    /// The authorization of a server whose entry carried `configured` as its `authorization`
    /// header (taken out of its headers: the transport sends [`Authorization::header`]).
    pub(crate) fn new(configured: Option<String>) -> Authorization {
        Authorization { configured }
    }

    /// The `authorization` header value to send with the next request.
    pub(crate) fn header(&self) -> Option<&str> {
        self.configured.as_deref()
    }

    /// The server answered a request with `challenge`.
    pub(crate) fn on_challenge(&mut self, challenge: &Challenge) -> AuthVerdict {
        let scheme = challenge
            .www_authenticate
            .first()
            .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            .filter(|s| !s.is_empty());
        let asked = match scheme {
            Some(s) => format!(" ({s} authentication asked)"),
            None => String::new(),
        };
        let what = if challenge.status == 403 {
            "refused access"
        } else {
            "requires authorization"
        };
        let hint = if self.configured.is_some() {
            "the configured authorization header was not accepted"
        } else {
            "give its entry an authorization header"
        };
        AuthVerdict::Refused(format!(
            "the server {what}: HTTP {}{asked}; {hint}",
            challenge.status
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m11_without_a_flow_a_challenge_is_refused_with_what_the_server_asked() {
        let mut a = Authorization::new(None);
        assert_eq!(a.header(), None);
        let v = a.on_challenge(&Challenge {
            status: 401,
            www_authenticate: vec![
                r#"Bearer resource_metadata="https://x/.well-known/oauth-protected-resource""#
                    .into(),
            ],
        });
        assert_eq!(
            v,
            AuthVerdict::Refused(
                "the server requires authorization: HTTP 401 (Bearer authentication asked); give its entry an authorization header".into()
            )
        );
        let mut b = Authorization::new(Some("Bearer t0ken".into()));
        assert_eq!(b.header(), Some("Bearer t0ken"));
        assert_eq!(
            format!("{b:?}"),
            "Authorization(configured)",
            "P2: never the token"
        );
        let AuthVerdict::Refused(why) = b.on_challenge(&Challenge {
            status: 403,
            www_authenticate: vec![],
        }) else {
            panic!("refused");
        };
        assert_eq!(
            why,
            "the server refused access: HTTP 403; the configured authorization header was not accepted"
        );
    }
}
