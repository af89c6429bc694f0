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
//! The credential is either the one the client configured (an `authorization` header in the
//! server entry's `headers`, sent with every request; a challenge is then refused with a reason
//! that says what the server asked for), or, for every other HTTP server, an OAuth
//! authorization ([`ServerAuth`], SPEC M11): it holds requests while its token file loads or a
//! flow runs ([`Authorization::before_request`]), answers challenges with
//! [`AuthVerdict::Retry`] or [`AuthVerdict::Wait`], and hands out the tokens it obtains as the
//! header. What it needs done ([`AuthNeed`]) the transport carries out.

use crate::authorization::{AuthNeed, ServerAuth};
use crate::oauth::authorizer::{Challenge as Answer, Gate};
use crate::outbox::Outbox;
use crate::timers::TimerTable;

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
    Retry,
    /// Hold it: an authorization flow runs and tells the transport when to send it
    /// ([`AuthNeed::Proceed`], [`AuthNeed::Failed`]).
    Wait,
    /// It fails with this text (during the handshake the server does not start).
    Refused(String),
    /// Not an authorization matter (a `403` without `insufficient_scope`): an ordinary HTTP
    /// error answer.
    NotOurs,
}

/// The authorization state of one HTTP server. `Debug` never shows the credential.
#[derive(Default)]
pub(crate) struct Authorization {
    /// The `authorization` header value the entry configured, if any.
    configured: Option<String>,
    /// The OAuth authorization of a server without a configured header.
    oauth: Option<Box<ServerAuth>>,
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.configured.is_some() {
            "configured"
        } else if self.oauth.is_some() {
            "oauth"
        } else {
            "none"
        };
        write!(f, "Authorization({shown})")
    }
}

impl Authorization {
    /// The authorization of a server whose entry carried `configured` as its `authorization`
    /// header (taken out of its headers: the transport sends [`Authorization::header`]);
    /// without one, `oauth` authorizes it (SPEC M11).
    pub(crate) fn new(configured: Option<String>, oauth: Option<ServerAuth>) -> Authorization {
        let oauth = if configured.is_some() {
            None
        } else {
            oauth.map(Box::new)
        };
        Authorization { configured, oauth }
    }

    /// The `authorization` header value to send with the next request.
    pub(crate) fn header(&self) -> Option<String> {
        match &self.oauth {
            Some(a) => a.header(),
            None => self.configured.clone(),
        }
    }

    /// Whether a request may go now (`false`: hold it until [`AuthNeed::Proceed`]). Call
    /// [`Authorization::drain`] after it.
    pub(crate) fn before_request(&mut self, out: &Outbox) -> bool {
        match &mut self.oauth {
            Some(a) => a.authorizer().before_request(out.now()) == Gate::Send,
            None => true,
        }
    }

    /// A request was answered with something other than a challenge.
    pub(crate) fn on_accepted(&mut self) {
        if let Some(a) = &mut self.oauth {
            a.authorizer().on_accepted();
        }
    }

    /// The OAuth authorization, for the transport to carry out its needs.
    pub(crate) fn oauth(&mut self) -> Option<&mut ServerAuth> {
        self.oauth.as_deref_mut()
    }

    /// What the OAuth authorization needs done since the last call (nothing without one).
    pub(crate) fn drain(&mut self, out: &mut Outbox, timers: &mut TimerTable) -> Vec<AuthNeed> {
        match &mut self.oauth {
            Some(a) => a.drain(out, timers),
            None => Vec::new(),
        }
    }

    /// The server answered a request that carried `sent` (its `authorization` value) with
    /// `challenge`. Call [`Authorization::drain`] after it.
    pub(crate) fn on_challenge(
        &mut self,
        challenge: &Challenge,
        sent: Option<&str>,
        out: &Outbox,
    ) -> AuthVerdict {
        if let Some(a) = &mut self.oauth {
            return match a.authorizer().on_challenge(
                challenge.status,
                &challenge.www_authenticate,
                sent,
                out.now(),
            ) {
                Answer::Retry => AuthVerdict::Retry,
                Answer::Wait => AuthVerdict::Wait,
                Answer::GiveUp(reason) => AuthVerdict::Refused(format!("not authorized: {reason}")),
                Answer::NotOurs => AuthVerdict::NotOurs,
            };
        }
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
        let mut a = Authorization::new(None, None);
        assert_eq!(a.header(), None);
        let out = Outbox::new(crate::config::LogLevel::Info, crate::time::MonoTime::ZERO);
        let v = a.on_challenge(
            &Challenge {
                status: 401,
                www_authenticate: vec![
                    r#"Bearer resource_metadata="https://x/.well-known/oauth-protected-resource""#
                        .into(),
                ],
            },
            None,
            &out,
        );
        assert_eq!(
            v,
            AuthVerdict::Refused(
                "the server requires authorization: HTTP 401 (Bearer authentication asked); give its entry an authorization header".into()
            )
        );
        let mut b = Authorization::new(Some("Bearer t0ken".into()), None);
        assert_eq!(b.header().as_deref(), Some("Bearer t0ken"));
        assert_eq!(
            format!("{b:?}"),
            "Authorization(configured)",
            "P2: never the token"
        );
        let AuthVerdict::Refused(why) = b.on_challenge(
            &Challenge {
                status: 403,
                www_authenticate: vec![],
            },
            Some("Bearer t0ken"),
            &out,
        ) else {
            panic!("refused");
        };
        assert_eq!(
            why,
            "the server refused access: HTTP 403; the configured authorization header was not accepted"
        );
    }
}
