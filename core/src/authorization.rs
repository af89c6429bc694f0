//! The authorizers of every remote MCP server, and their traffic with the runtime (SPEC M11):
//! the hub turns what an [`Authorizer`](crate::oauth::authorizer::Authorizer) asks for into [`Action::OAuth`](crate::Action::OAuth)s
//! (listener, token files, browser) with ids of its own, routes the runtime's
//! [`OAuthInput`]s back to the authorizer they belong to, keeps each authorizer's deadline in
//! the [`TimerTable`], and hands its owner what only the owner can do: HTTP requests (through
//! the MCP transport's HTTP exchange), asking the user to open a URL (the ACP client), and
//! the outcome of each authorization.

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
use std::collections::BTreeMap;

/// What the hub's owner must do for a server's authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HubEvent {
    /// Send `http` through the HTTP exchange; give the answer to [`OAuthHub::handle_http`]
    /// with `slot` and `request`.
    Http {
        /// The server being authorized.
        slot: ServerSlot,
        /// The authorizer's request number.
        request: u64,
        /// The request.
        http: OAuthRequest,
    },
    /// Ask the user to open `url` (the authorization request of server `slot`): URL-mode
    /// elicitation where the ACP client offers it, else a notice. A decline goes to
    /// [`OAuthHub::declined`]. (`$BROWSER` was already started when set.)
    Browse {
        /// The server.
        slot: ServerSlot,
        /// The authorization URL.
        url: String,
    },
    /// The user no longer needs to open it (the authorization ended, either way).
    BrowseDone {
        /// The server.
        slot: ServerSlot,
    },
    /// Requests held back for `slot` may go now.
    Proceed {
        /// The server.
        slot: ServerSlot,
    },
    /// `slot` is not authorized: fail what waits, with this sentence.
    Failed {
        /// The server.
        slot: ServerSlot,
        /// Why.
        reason: String,
    },
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct OAuthHub {
    config: OAuthConfig,
    keeps_tokens: bool,
    unix_ms_at_start: u64,
    request_timeout_ms: u64,
    rng: SecretRng,
    authorizers: BTreeMap<ServerSlot, Authorizer>,
    listeners: BTreeMap<ListenerId, ServerSlot>,
    next_listener: u64,
    /// Token files being read, by the server that asked.
    reading: BTreeMap<String, ServerSlot>,
}

/// What the hub is built from.
#[derive(Debug, Clone)]
pub(crate) struct HubSetup {
    /// The authorization settings.
    pub(crate) oauth: OAuthConfig,
    /// Whether there is a state directory (tokens are kept).
    pub(crate) keeps_tokens: bool,
    /// `Config::unix_ms_at_start`.
    pub(crate) unix_ms_at_start: u64,
    /// The deadline of one OAuth HTTP request, ms (the MCP handshake step timeout).
    pub(crate) request_timeout_ms: u64,
    /// `Config::oauth_seed`.
    pub(crate) seed: [u8; 32],
}

impl OAuthHub {
    /// A hub with no server yet.
    pub(crate) fn new(setup: HubSetup) -> OAuthHub {
        OAuthHub {
            config: setup.oauth,
            keeps_tokens: setup.keeps_tokens,
            unix_ms_at_start: setup.unix_ms_at_start,
            request_timeout_ms: setup.request_timeout_ms,
            rng: SecretRng::new(setup.seed),
            authorizers: BTreeMap::new(),
            listeners: BTreeMap::new(),
            next_listener: 0,
            reading: BTreeMap::new(),
        }
    }

    /// Adds the authorizer of server `slot` (`name` at `url`); an existing one is kept.
    pub(crate) fn add(&mut self, slot: ServerSlot, name: &str, url: HttpUrl) {
        if self.authorizers.contains_key(&slot) {
            return;
        }
        let rng = self.rng.fork();
        let a = Authorizer::new(AuthorizerSetup {
            name,
            server: url,
            oauth: &self.config,
            request_timeout_ms: self.request_timeout_ms,
            keeps_tokens: self.keeps_tokens,
            unix_ms_at_start: self.unix_ms_at_start,
            rng,
        });
        self.authorizers.insert(slot, a);
    }

    /// The authorizer of `slot`. After calling into it, call [`OAuthHub::drain`].
    pub(crate) fn get_mut(&mut self, slot: ServerSlot) -> Option<&mut Authorizer> {
        self.authorizers.get_mut(&slot)
    }

    /// The authorizer of `slot`, to read.
    pub(crate) fn get(&self, slot: ServerSlot) -> Option<&Authorizer> {
        self.authorizers.get(&slot)
    }

    /// Server `slot` is gone: its listener is closed, its timer cleared.
    pub(crate) fn remove(&mut self, slot: ServerSlot, out: &mut Outbox, timers: &mut TimerTable) {
        if self.authorizers.remove(&slot).is_none() {
            return;
        }
        timers.clear(Timer::Server(slot, ServerTimer::Authorization));
        let ids: Vec<ListenerId> = self
            .listeners
            .iter()
            .filter(|(_, s)| **s == slot)
            .map(|(l, _)| *l)
            .collect();
        for listener in ids {
            self.listeners.remove(&listener);
            out.push(Action::OAuth(OAuthAction::StopListening { listener }));
        }
        self.reading.retain(|_, s| *s != slot);
    }

    /// Carries out what `slot`'s authorizer asked for since the last drain: runtime work goes
    /// to `out`, the rest is returned in order; its deadline is set in `timers`.
    pub(crate) fn drain(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<HubEvent> {
        let Some(a) = self.authorizers.get_mut(&slot) else {
            return Vec::new();
        };
        let mut events: Vec<AuthEvent> = Vec::new();
        let mut actions = Vec::new();
        while let Some(action) = a.poll_action() {
            actions.push(action);
        }
        while let Some(event) = a.poll_event() {
            events.push(event);
        }
        let deadline = a.poll_timeout();
        let timer = Timer::Server(slot, ServerTimer::Authorization);
        match deadline {
            Some(at) => timers.set(timer, at),
            None => {
                timers.clear(timer);
            }
        }
        let mut hub_events = Vec::with_capacity(actions.len() + events.len());
        for action in actions {
            match action {
                AuthAction::Http { request, http } => {
                    hub_events.push(HubEvent::Http {
                        slot,
                        request,
                        http,
                    });
                }
                AuthAction::Listen { port } => {
                    self.next_listener += 1;
                    let listener = ListenerId(self.next_listener);
                    self.listeners.insert(listener, slot);
                    out.push(Action::OAuth(OAuthAction::Listen { listener, port }));
                }
                AuthAction::StopListening => {
                    let ids: Vec<ListenerId> = self
                        .listeners
                        .iter()
                        .filter(|(_, s)| **s == slot)
                        .map(|(l, _)| *l)
                        .collect();
                    for listener in ids {
                        self.listeners.remove(&listener);
                        out.push(Action::OAuth(OAuthAction::StopListening { listener }));
                    }
                }
                AuthAction::Browse { url } => {
                    if let Some(argv) = self
                        .config
                        .browser
                        .as_deref()
                        .and_then(|b| browser_argv(b, &url))
                    {
                        out.push(Action::OAuth(OAuthAction::OpenBrowser { argv }));
                    }
                    hub_events.push(HubEvent::Browse { slot, url });
                }
                AuthAction::BrowseDone => hub_events.push(HubEvent::BrowseDone { slot }),
                AuthAction::Load { file } => {
                    self.reading.insert(file.clone(), slot);
                    out.push(Action::OAuth(OAuthAction::ReadTokenFile { file }));
                }
                AuthAction::Save { file, bytes } => {
                    out.push(Action::OAuth(OAuthAction::WriteTokenFile { file, bytes }));
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
        for event in events {
            hub_events.push(match event {
                AuthEvent::Proceed => HubEvent::Proceed { slot },
                AuthEvent::Failed(reason) => HubEvent::Failed { slot, reason },
            });
        }
        hub_events
    }

    /// The answer to a [`HubEvent::Http`].
    pub(crate) fn handle_http(
        &mut self,
        slot: ServerSlot,
        request: u64,
        response: Result<OAuthResponse, String>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<HubEvent> {
        let now = out.now();
        let Some(a) = self.authorizers.get_mut(&slot) else {
            return Vec::new();
        };
        a.handle_http(request, response, now);
        self.drain(slot, out, timers)
    }

    /// The user declined to open the URL of `slot`'s authorization.
    pub(crate) fn declined(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<HubEvent> {
        let now = out.now();
        let Some(a) = self.authorizers.get_mut(&slot) else {
            return Vec::new();
        };
        a.handle_declined(now);
        self.drain(slot, out, timers)
    }

    /// What the runtime reports. Inputs for listeners or files nobody waits for are answered
    /// (a connection gets a "too late" page) and otherwise ignored.
    pub(crate) fn handle_input(
        &mut self,
        input: OAuthInput,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<HubEvent> {
        let now = out.now();
        match input {
            OAuthInput::Listening { listener, result } => {
                let Some(&slot) = self.listeners.get(&listener) else {
                    if result.is_ok() {
                        out.push(Action::OAuth(OAuthAction::StopListening { listener }));
                    }
                    return Vec::new();
                };
                if result.is_err() {
                    self.listeners.remove(&listener);
                }
                if let Some(a) = self.authorizers.get_mut(&slot) {
                    a.handle_listening(result, now);
                }
                self.drain(slot, out, timers)
            }
            OAuthInput::Callback {
                listener,
                connection,
                head,
            } => {
                let slot = self.listeners.get(&listener).copied();
                let response = match slot.and_then(|s| self.authorizers.get_mut(&s)) {
                    Some(a) => a.handle_callback(&head, now),
                    None => callback_response(&CallbackAnswer::Expired, "this server"),
                };
                out.push(Action::OAuth(OAuthAction::Answer {
                    listener,
                    connection,
                    response,
                }));
                match slot {
                    Some(s) => self.drain(s, out, timers),
                    None => Vec::new(),
                }
            }
            OAuthInput::TokenFile { file, result } => {
                let Some(slot) = self.reading.remove(&file) else {
                    return Vec::new();
                };
                if let Some(a) = self.authorizers.get_mut(&slot) {
                    a.handle_loaded(result, now);
                }
                self.drain(slot, out, timers)
            }
            OAuthInput::TokenFileWritten { file, result } => {
                if let Err(e) = result {
                    out.log(
                        LogLevel::Warn,
                        format!("OAuth tokens not saved to the state directory ({file}): {e}"),
                    );
                }
                Vec::new()
            }
            OAuthInput::Browser { result } => {
                if let Err(e) = result {
                    out.log(
                        LogLevel::Warn,
                        format!("could not start $BROWSER for an authorization: {e}"),
                    );
                }
                Vec::new()
            }
        }
    }

    /// The authorization deadline of `slot` passed (its [`ServerTimer::Authorization`]).
    pub(crate) fn handle_timeout(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<HubEvent> {
        let now = out.now();
        let Some(a) = self.authorizers.get_mut(&slot) else {
            return Vec::new();
        };
        a.handle_timeout(now);
        self.drain(slot, out, timers)
    }

    /// The number of servers with an authorizer.
    pub(crate) fn len(&self) -> usize {
        self.authorizers.len()
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
    use crate::time::MonoTime;

    const S: ServerSlot = ServerSlot(4);

    fn hub(keeps_tokens: bool, browser: Option<&str>) -> OAuthHub {
        let oauth = OAuthConfig {
            browser: browser.map(str::to_owned),
            ..OAuthConfig::default()
        };
        let mut h = OAuthHub::new(HubSetup {
            oauth,
            keeps_tokens,
            unix_ms_at_start: 1_700_000_000_000,
            request_timeout_ms: 30_000,
            seed: [1; 32],
        });
        h.add(
            S,
            "remote",
            HttpUrl::parse("http://localhost:3000/mcp").unwrap(),
        );
        h
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
    fn the_token_file_is_read_through_the_runtime_and_routed_back() {
        let mut h = hub(true, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        let a = h.get_mut(S).unwrap();
        assert_eq!(
            a.before_request(MonoTime::ZERO),
            crate::oauth::authorizer::Gate::Wait
        );
        assert!(h.drain(S, &mut out, &mut timers).is_empty());
        let [Action::OAuth(OAuthAction::ReadTokenFile { file })] = &actions(&mut out)[..] else {
            panic!()
        };
        // An answer for another file is ignored; ours lets the requests go.
        let other = OAuthInput::TokenFile {
            file: "other.json".into(),
            result: Ok(None),
        };
        assert!(h.handle_input(other, &mut out, &mut timers).is_empty());
        let ours = OAuthInput::TokenFile {
            file: file.clone(),
            result: Ok(None),
        };
        assert_eq!(
            h.handle_input(ours, &mut out, &mut timers),
            [HubEvent::Proceed { slot: S }]
        );
    }

    #[test]
    fn a_flow_s_listener_browser_and_deadline_go_through_the_hub() {
        let mut h = hub(false, Some("xdg-open"));
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        let a = h.get_mut(S).unwrap();
        a.on_challenge(401, &["Bearer"], None, MonoTime::ZERO);
        let events = h.drain(S, &mut out, &mut timers);
        let [HubEvent::Http { request, http, .. }] = &events[..] else {
            panic!("{events:?}")
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
        // The deadline passes: the authorization fails and its timer is gone.
        let request = *request;
        out.advance(MonoTime::ZERO.plus_ms(30_000));
        let events = h.handle_timeout(S, &mut out, &mut timers);
        assert!(
            matches!(&events[..], [HubEvent::Failed { slot: S, .. }]),
            "{events:?}"
        );
        assert_eq!(
            timers.get(Timer::Server(S, ServerTimer::Authorization)),
            None
        );
        let late = h.handle_http(S, request, Err("late".into()), &mut out, &mut timers);
        assert!(late.is_empty());
    }

    #[test]
    fn a_callback_for_no_listener_is_answered_too_late() {
        let mut h = hub(false, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        let cb = OAuthInput::Callback {
            listener: ListenerId(9),
            connection: 2,
            head: b"GET /callback HTTP/1.1\r\n\r\n".to_vec(),
        };
        assert!(h.handle_input(cb, &mut out, &mut timers).is_empty());
        let [
            Action::OAuth(OAuthAction::Answer {
                listener,
                connection,
                response,
            }),
        ] = &actions(&mut out)[..]
        else {
            panic!()
        };
        assert_eq!((*listener, *connection), (ListenerId(9), 2));
        assert!(response.starts_with(b"HTTP/1.1 410"));
        // A listener opened for nobody is closed again.
        let opened = OAuthInput::Listening {
            listener: ListenerId(9),
            result: Ok(5000),
        };
        h.handle_input(opened, &mut out, &mut timers);
        assert_eq!(
            actions(&mut out),
            [Action::OAuth(OAuthAction::StopListening {
                listener: ListenerId(9)
            })]
        );
    }

    #[test]
    fn removing_a_server_closes_its_listener_and_clears_its_timer() {
        let mut h = hub(false, None);
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        let mut timers = TimerTable::default();
        h.listeners.insert(ListenerId(3), S);
        timers.set(Timer::Server(S, ServerTimer::Authorization), MonoTime::ZERO);
        h.remove(S, &mut out, &mut timers);
        assert_eq!(
            actions(&mut out),
            [Action::OAuth(OAuthAction::StopListening {
                listener: ListenerId(3)
            })]
        );
        assert_eq!(timers.len(), 0);
        assert_eq!(h.len(), 0);
    }
}
