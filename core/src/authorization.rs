//! The authorization of one remote MCP server and its traffic with the runtime (SPEC M11):
//! [`ServerAuth`] owns the server's [`Authorizer`] and turns what it asks for into
//! [`Action::OAuth`](crate::Action::OAuth)s (the loopback listener, the token file), each carrying the server's slot so that the runtime's [`OAuthInput`]s come back
//! to it; it keeps the authorizer's deadline in the [`TimerTable`]
//! (`Timer::Server(slot, ServerTimer::Authorization)`), and hands its owner, the server's
//! HTTP transport, what only the owner can do ([`AuthNeed`]): the HTTP requests (through the
//! transport's exchanges), the user's visit to a URL (the ACP client), and the outcome.

use crate::config::{LogLevel, OAuthConfig};
use crate::ids::{ListenerId, ServerSlot};
use crate::io::{Action, OAuthAction, OAuthInput};
use crate::oauth::authorizer::{AuthAction, AuthEvent, Authorizer, AuthorizerSetup, Severity};
use crate::oauth::flow::{OAuthRequest, OAuthResponse};
use crate::oauth::redirect::{CallbackAnswer, callback_response};
use crate::oauth::secrets::SecretRng;
use crate::outbox::Outbox;
use crate::timers::{ServerTimer, Timer, TimerTable};
use crate::url::HttpUrl;

/// The most bytes of an OAuth response body read (metadata, registration and token answers
/// are a few KiB); a longer answer fails the request (docs/limits.md).
pub(crate) const MAX_OAUTH_BODY_BYTES: usize = 256 * 1024;

/// What the server's owner must do for its authorization, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthNeed {
    /// Send `http` (never following a redirect, reading at most [`MAX_OAUTH_BODY_BYTES`] of
    /// the body); give the answer to [`ServerAuth::on_http`] with `request`.
    Http {
        /// The authorizer's request number.
        request: u64,
        /// The request.
        http: OAuthRequest,
    },
    /// Ask the user to open `url` (the authorization request): URL-mode elicitation where
    /// the ACP client offers it, else a notice and `$BROWSER` ([`browser_argv`]); the agent
    /// decides. A decline goes to [`ServerAuth::declined`].
    Browse {
        /// The authorization URL.
        url: String,
    },
    /// The user no longer needs to open it (the authorization ended, either way).
    BrowseDone,
    /// Requests held back may go now, with [`Authorizer::authorization`].
    Proceed,
    /// No authorization: fail what waits, with this sentence.
    Failed(String),
}

/// What every server's authorization is built from (one per agent).
#[derive(Debug, Clone)]
pub(crate) struct AuthSetup {
    /// The authorization settings.
    pub(crate) oauth: OAuthConfig,
    /// Whether there is a state directory (tokens are kept).
    pub(crate) keeps_tokens: bool,
    /// `Config::unix_ms_at_start`.
    pub(crate) unix_ms_at_start: u64,
    /// The deadline of one OAuth HTTP request, ms (the MCP handshake step timeout).
    pub(crate) request_timeout_ms: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ServerAuth {
    slot: ServerSlot,
    authorizer: Authorizer,
    /// The listener in use, if any (one per flow; an input for another is stale).
    listener: Option<ListenerId>,
    next_listener: u64,
}

impl ServerAuth {
    /// The authorization of server `slot`, named `name`, at `url`; its secrets come from
    /// `rng` (fork it from the agent's generator).
    pub(crate) fn new(
        slot: ServerSlot,
        name: &str,
        url: HttpUrl,
        setup: &AuthSetup,
        rng: SecretRng,
    ) -> ServerAuth {
        ServerAuth {
            slot,
            authorizer: Authorizer::new(AuthorizerSetup {
                name,
                server: url,
                oauth: &setup.oauth,
                request_timeout_ms: setup.request_timeout_ms,
                keeps_tokens: setup.keeps_tokens,
                unix_ms_at_start: setup.unix_ms_at_start,
                rng,
            }),
            listener: None,
            next_listener: 0,
        }
    }

    /// The authorizer, to ask for the header and to hand it challenges. After any call that
    /// may change it, call [`ServerAuth::drain`].
    pub(crate) fn authorizer(&mut self) -> &mut Authorizer {
        &mut self.authorizer
    }

    /// The `Authorization` header value for the server's requests, if there is a token.
    pub(crate) fn header(&self) -> Option<String> {
        self.authorizer.authorization()
    }

    /// Carries out what the authorizer asked for since the last drain: runtime work goes to
    /// `out`, the rest is returned in order; its deadline is set in `timers`.
    pub(crate) fn drain(&mut self, out: &mut Outbox, timers: &mut TimerTable) -> Vec<AuthNeed> {
        let mut needs = Vec::new();
        while let Some(action) = self.authorizer.poll_action() {
            match action {
                AuthAction::Http { request, http } => needs.push(AuthNeed::Http { request, http }),
                AuthAction::Listen { port } => {
                    self.next_listener += 1;
                    let listener = ListenerId(self.next_listener);
                    self.listener = Some(listener);
                    out.push(Action::OAuth(OAuthAction::Listen {
                        server: self.slot,
                        listener,
                        port,
                    }));
                }
                AuthAction::StopListening => self.stop_listening(out),
                AuthAction::Browse { url } => needs.push(AuthNeed::Browse { url }),
                AuthAction::BrowseDone => needs.push(AuthNeed::BrowseDone),
                AuthAction::Load { file } => out.push(Action::OAuth(OAuthAction::ReadTokenFile {
                    server: self.slot,
                    file,
                })),
                AuthAction::Save { file, bytes } => {
                    out.push(Action::OAuth(OAuthAction::WriteTokenFile {
                        server: self.slot,
                        file,
                        bytes,
                    }));
                }
                AuthAction::Log(severity, message) => {
                    let level = match severity {
                        Severity::Info => LogLevel::Info,
                        Severity::Warn => LogLevel::Warn,
                    };
                    out.log(level, message);
                }
            }
        }
        while let Some(event) = self.authorizer.poll_event() {
            needs.push(match event {
                AuthEvent::Proceed => AuthNeed::Proceed,
                AuthEvent::Failed(reason) => AuthNeed::Failed(reason),
            });
        }
        let timer = Timer::Server(self.slot, ServerTimer::Authorization);
        match self.authorizer.poll_timeout() {
            Some(at) => timers.set(timer, at),
            None => {
                timers.clear(timer);
            }
        }
        needs
    }

    /// The answer to an [`AuthNeed::Http`] (`Err`: no answer, with the reason). A body over
    /// [`MAX_OAUTH_BODY_BYTES`] fails the request.
    pub(crate) fn on_http(
        &mut self,
        request: u64,
        response: Result<OAuthResponse, String>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<AuthNeed> {
        let response = response.and_then(|r| {
            if r.body.len() > MAX_OAUTH_BODY_BYTES {
                Err(format!(
                    "the answer is over {} KiB",
                    MAX_OAUTH_BODY_BYTES / 1024
                ))
            } else {
                Ok(r)
            }
        });
        self.authorizer.handle_http(request, response, out.now());
        self.drain(out, timers)
    }

    /// What the runtime reports for this server. A callback on a listener that is not the
    /// current one is answered "too late"; other stale inputs are ignored (I6).
    pub(crate) fn on_input(
        &mut self,
        input: OAuthInput,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<AuthNeed> {
        let now = out.now();
        match input {
            OAuthInput::Listening {
                listener, result, ..
            } => {
                if self.listener != Some(listener) {
                    if result.is_ok() {
                        out.push(Action::OAuth(OAuthAction::StopListening {
                            server: self.slot,
                            listener,
                        }));
                    }
                    return Vec::new();
                }
                if result.is_err() {
                    self.listener = None;
                }
                self.authorizer.handle_listening(result, now);
            }
            OAuthInput::Callback {
                listener,
                connection,
                head,
                ..
            } => {
                let response = if self.listener == Some(listener) {
                    self.authorizer.handle_callback(&head, now)
                } else {
                    callback_response(&CallbackAnswer::Expired, "this server")
                };
                out.push(Action::OAuth(OAuthAction::Answer {
                    server: self.slot,
                    listener,
                    connection,
                    response,
                }));
            }
            OAuthInput::TokenFile { result, .. } => self.authorizer.handle_loaded(result, now),
            OAuthInput::TokenFileWritten { file, result, .. } => {
                if let Err(e) = result {
                    out.log(
                        LogLevel::Warn,
                        format!("OAuth tokens not saved to the state directory ({file}): {e}"),
                    );
                }
            }
            OAuthInput::Browser { result, .. } => {
                if let Err(e) = result {
                    out.log(
                        LogLevel::Warn,
                        format!("could not start $BROWSER for an authorization: {e}"),
                    );
                }
            }
        }
        self.drain(out, timers)
    }

    /// The authorization's deadline passed.
    pub(crate) fn on_timeout(
        &mut self,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<AuthNeed> {
        self.authorizer.handle_timeout(out.now());
        self.drain(out, timers)
    }

    /// The user declined to open the URL.
    pub(crate) fn declined(&mut self, out: &mut Outbox, timers: &mut TimerTable) -> Vec<AuthNeed> {
        self.authorizer.handle_declined(out.now());
        self.drain(out, timers)
    }

    /// The server is gone: its listener is closed and its deadline cleared.
    pub(crate) fn close(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        self.stop_listening(out);
        timers.clear(Timer::Server(self.slot, ServerTimer::Authorization));
    }

    fn stop_listening(&mut self, out: &mut Outbox) {
        if let Some(listener) = self.listener.take() {
            out.push(Action::OAuth(OAuthAction::StopListening {
                server: self.slot,
                listener,
            }));
        }
    }
}

/// The command that opens `url` with `$BROWSER` (`browser`): its first `:`-separated entry,
/// split at blanks; `%s` in it is replaced by the URL (`%%` is a `%`), else the URL is the
/// last argument. `None` when the variable holds no command.
pub(crate) fn browser_argv(browser: &str, url: &str) -> Option<Vec<String>> {
    let entry = browser.split(':').map(str::trim).find(|e| !e.is_empty())?;
    let mut argv = Vec::new();
    let mut placed = false;
    for word in entry.split_whitespace() {
        if word.contains("%s") {
            placed = true;
        }
        argv.push(
            word.replace("%%", "\u{0}")
                .replace("%s", url)
                .replace('\u{0}', "%"),
        );
    }
    if !placed {
        argv.push(url.to_owned());
    }
    Some(argv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::authorizer::{Challenge, Gate};
    use crate::time::MonoTime;

    const S: ServerSlot = ServerSlot(4);

    fn auth(keeps_tokens: bool, browser: Option<&str>) -> ServerAuth {
        let setup = AuthSetup {
            oauth: OAuthConfig {
                browser: browser.map(str::to_owned),
                ..OAuthConfig::default()
            },
            keeps_tokens,
            unix_ms_at_start: 1_700_000_000_000,
            request_timeout_ms: 30_000,
        };
        ServerAuth::new(
            S,
            "remote",
            HttpUrl::parse("http://localhost:3000/mcp").unwrap(),
            &setup,
            SecretRng::new([1; 32]),
        )
    }

    fn actions(out: &mut Outbox) -> Vec<Action> {
        std::iter::from_fn(|| out.pop()).collect()
    }

    #[test]
    fn browser_commands_take_the_url_in_place_of_percent_s_or_at_the_end() {
        let url = "https://as/authorize?x=1";
        assert_eq!(
            browser_argv("firefox", url),
            Some(vec!["firefox".to_owned(), url.to_owned()])
        );
        assert_eq!(
            browser_argv(" : open -a Safari %s --new:lynx", url),
            Some(vec![
                "open".to_owned(),
                "-a".to_owned(),
                "Safari".to_owned(),
                url.to_owned(),
                "--new".to_owned()
            ])
        );
        assert_eq!(
            browser_argv("echo 100%% %s", url),
            Some(vec!["echo".to_owned(), "100%".to_owned(), url.to_owned()])
        );
        assert_eq!(browser_argv(" : ", url), None);
    }

    #[test]
    fn the_token_file_is_read_through_the_runtime_for_this_server() {
        let mut a = auth(true, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        assert_eq!(a.authorizer().before_request(MonoTime::ZERO), Gate::Wait);
        assert!(a.drain(&mut out, &mut timers).is_empty());
        let [Action::OAuth(OAuthAction::ReadTokenFile { server, file })] = &actions(&mut out)[..]
        else {
            panic!()
        };
        assert_eq!(*server, S);
        let ours = OAuthInput::TokenFile {
            server: S,
            file: file.clone(),
            result: Ok(None),
        };
        assert_eq!(a.on_input(ours, &mut out, &mut timers), [AuthNeed::Proceed]);
        assert_eq!(a.header(), None);
    }

    #[test]
    fn a_flow_s_requests_browser_and_deadline_go_through_its_owner() {
        let mut a = auth(false, Some("xdg-open"));
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        assert_eq!(
            a.authorizer()
                .on_challenge(401, &["Bearer"], None, MonoTime::ZERO),
            Challenge::Wait
        );
        let needs = a.drain(&mut out, &mut timers);
        let [AuthNeed::Http { request, http }] = &needs[..] else {
            panic!("{needs:?}")
        };
        assert!(
            http.url
                .as_sent()
                .ends_with("/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            timers.get(Timer::Server(S, ServerTimer::Authorization)),
            Some(MonoTime::ZERO.plus_ms(30_000))
        );
        // An answer too big to be metadata fails the request, naming the limit.
        let big = OAuthResponse {
            status: 200,
            headers: Vec::new(),
            body: vec![b' '; MAX_OAUTH_BODY_BYTES + 1],
        };
        let needs = a.on_http(*request, Ok(big), &mut out, &mut timers);
        assert!(
            matches!(&needs[..], [AuthNeed::Failed(e)] if e.contains("over 256 KiB")),
            "{needs:?}"
        );
        assert_eq!(
            timers.get(Timer::Server(S, ServerTimer::Authorization)),
            None
        );
    }

    #[test]
    fn a_deadline_ends_the_authorization_and_a_late_answer_changes_nothing() {
        let mut a = auth(false, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        a.authorizer()
            .on_challenge(401, &["Bearer"], None, MonoTime::ZERO);
        let needs = a.drain(&mut out, &mut timers);
        let [AuthNeed::Http { request, .. }] = &needs[..] else {
            panic!()
        };
        let request = *request;
        out.advance(MonoTime::ZERO.plus_ms(30_000));
        let needs = a.on_timeout(&mut out, &mut timers);
        assert!(matches!(&needs[..], [AuthNeed::Failed(_)]), "{needs:?}");
        assert!(
            a.on_http(request, Err("late".into()), &mut out, &mut timers)
                .is_empty()
        );
    }

    #[test]
    fn inputs_for_another_listener_are_stale() {
        let mut a = auth(false, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        let cb = OAuthInput::Callback {
            server: S,
            listener: ListenerId(9),
            connection: 2,
            head: b"GET /callback HTTP/1.1\r\n\r\n".to_vec(),
        };
        assert!(a.on_input(cb, &mut out, &mut timers).is_empty());
        let [
            Action::OAuth(OAuthAction::Answer {
                listener,
                connection,
                response,
                ..
            }),
        ] = &actions(&mut out)[..]
        else {
            panic!()
        };
        assert_eq!((*listener, *connection), (ListenerId(9), 2));
        assert!(response.starts_with(b"HTTP/1.1 410"));
        let opened = OAuthInput::Listening {
            server: S,
            listener: ListenerId(9),
            result: Ok(5000),
        };
        assert!(a.on_input(opened, &mut out, &mut timers).is_empty());
        assert_eq!(
            actions(&mut out),
            [Action::OAuth(OAuthAction::StopListening {
                server: S,
                listener: ListenerId(9)
            })]
        );
    }

    #[test]
    fn closing_stops_the_listener_and_clears_the_deadline() {
        let mut a = auth(false, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        a.listener = Some(ListenerId(3));
        timers.set(Timer::Server(S, ServerTimer::Authorization), MonoTime::ZERO);
        a.close(&mut out, &mut timers);
        assert_eq!(
            actions(&mut out),
            [Action::OAuth(OAuthAction::StopListening {
                server: S,
                listener: ListenerId(3)
            })]
        );
        assert_eq!(
            timers.get(Timer::Server(S, ServerTimer::Authorization)),
            None
        );
    }
}
