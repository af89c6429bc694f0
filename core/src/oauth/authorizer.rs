//! The authorization state of one remote MCP server (SPEC M11): its tokens, the token file,
//! the flow in progress and the rules for starting one — when to load, refresh, step up or
//! give up. The HTTP transport of the server asks it for the `Authorization` header of each
//! request and hands it every `401`/`403`; it answers with requests of its own (HTTP, the
//! loopback listener, the user's visit to a URL, the token file) and, when done, tells the
//! transport to go on or why it cannot.
//!
//! ```text
//!            before_request / on_challenge
//!   Idle ─────────────────────────────────► Loading (token file) ──► Idle | Running
//!     ▲                                                                     │
//!     └────────────── Proceed / Failed(reason) ◄── flow finished/timed out ─┘
//! ```
//!
//! Bounds: one flow at a time; each of its steps has a deadline (a request: the request
//! timeout; the user's visit: `BUZZ_AGENT_OAUTH_TIMEOUT_SECS`); at most
//! [`MAX_CONSECUTIVE_FLOWS`] flows without a request accepted in between; a step-up is tried
//! once per scope set.

use super::challenge::{BearerChallenge, bearer_challenge};
use super::client::{ClientConfig, IdentitySource};
use super::flow::{
    CallbackPage, Discovered, Flow, FlowSetup, FlowStep, OAuthRequest, OAuthResponse,
};
use super::redirect::{CallbackAnswer, CallbackRequest, callback_response, parse_callback_head};
use super::secrets::SecretRng;
use super::settings::OAuthConfig;
use super::store::{self, Stored, StoredTokens};
use super::tokens::Clocks;
use crate::time::MonoTime;
use crate::url::HttpUrl;
use std::collections::{BTreeSet, VecDeque};
use std::fmt;

/// Flows started without a request accepted in between before the authorizer gives up (a
/// server that rejects every token it is given must not loop the user through logins).
pub(crate) const MAX_CONSECUTIVE_FLOWS: u32 = 3;

/// What the authorizer asks the world for.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum AuthAction {
    /// Send this request; answer with [`Authorizer::handle_http`] and the same `request`.
    Http {
        /// The request's number (answers to an older number are ignored).
        request: u64,
        /// The request.
        http: OAuthRequest,
    },
    /// Open the loopback listener on `127.0.0.1:port` (0: any); answer with
    /// [`Authorizer::handle_listening`]; connections go to [`Authorizer::handle_callback`].
    Listen {
        /// The port, 0 for any free one.
        port: u16,
    },
    /// Close the loopback listener.
    StopListening,
    /// Ask the user to open `url` (URL elicitation, else a notice and `$BROWSER`); a decline
    /// goes to [`Authorizer::handle_declined`].
    Browse {
        /// The authorization URL.
        url: String,
    },
    /// The user no longer needs to open it (the authorization ended).
    BrowseDone,
    /// Read the token file `file` of the state directory's `oauth/`; answer with
    /// [`Authorizer::handle_loaded`].
    Load {
        /// The file's name.
        file: String,
    },
    /// Write `bytes` as the token file `file` (mode 0600, replacing it whole).
    Save {
        /// The file's name.
        file: String,
        /// Its content (holds tokens: never log it).
        bytes: Vec<u8>,
    },
    /// A line for the log (no secret in it).
    Log(Severity, String),
}

/// How loud a log line of the authorizer is (the hub maps it to the log level; the `oauth`
/// module stays free of the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    /// A step that went well (authorized).
    Info,
    /// Something the operator should know (a token file ignored, an authorization failed).
    Warn,
}

impl fmt::Debug for AuthAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthAction::Http { request, http } => write!(f, "Http(#{request} {http:?})"),
            AuthAction::Listen { port } => write!(f, "Listen({port})"),
            AuthAction::StopListening => write!(f, "StopListening"),
            AuthAction::Browse { .. } => write!(f, "Browse(<authorization url>)"),
            AuthAction::BrowseDone => write!(f, "BrowseDone"),
            AuthAction::Load { file } => write!(f, "Load({file})"),
            AuthAction::Save { file, bytes } => write!(f, "Save({file}, {} B)", bytes.len()),
            AuthAction::Log(level, m) => write!(f, "Log({level:?}, {m})"),
        }
    }
}

/// What the transport learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthEvent {
    /// Requests held back may go now, with [`Authorizer::authorization`].
    Proceed,
    /// No authorization: fail the held requests with this sentence.
    Failed(String),
}

/// The answer to a `401`/`403`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// The header changed since the request was sent: send it again now.
    Retry,
    /// An authorization runs: hold the request until [`AuthEvent::Proceed`] or
    /// [`AuthEvent::Failed`].
    Wait,
    /// No (further) authorization will help: fail the request with this sentence.
    GiveUp(String),
    /// A `403` that is not about scope: an ordinary HTTP error for the transport.
    NotOurs,
}

/// The answer to [`Authorizer::before_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Send it, with [`Authorizer::authorization`] (which may be `None`).
    Send,
    /// Hold it until [`AuthEvent::Proceed`] or [`AuthEvent::Failed`].
    Wait,
}

/// What one authorizer is built from.
pub(crate) struct AuthorizerSetup<'a> {
    /// The server's `session/new` name (messages, the browser page).
    pub(crate) name: &'a str,
    /// Its URL.
    pub(crate) server: HttpUrl,
    /// The authorization settings.
    pub(crate) oauth: &'a OAuthConfig,
    /// The deadline of each OAuth request, ms.
    pub(crate) request_timeout_ms: u64,
    /// Whether there is a state directory to keep tokens in.
    pub(crate) keeps_tokens: bool,
    /// The wall clock at the runtime's start (ms since the Unix epoch).
    pub(crate) unix_ms_at_start: u64,
    /// This server's secrets generator.
    pub(crate) rng: SecretRng,
}

/// Where the token file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// No state directory, or loaded.
    Done,
    /// Not asked for yet.
    NotYet,
    /// Asked for.
    Loading,
}

/// The flow in progress.
#[derive(Debug)]
struct Running {
    flow: Flow,
    /// The number of the request it waits for, if any.
    request: Option<u64>,
    deadline: MonoTime,
    listening: bool,
    browsing: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Authorizer {
    name: String,
    server: HttpUrl,
    client: Option<ClientConfig>,
    client_metadata_url: Option<HttpUrl>,
    redirect_port: u16,
    user_timeout_ms: u64,
    request_timeout_ms: u64,
    unix_ms_at_start: u64,
    rng: SecretRng,
    file: String,
    /// There is a state directory: tokens are read from and saved to the file.
    keeps_tokens: bool,
    load: Load,
    stored: Stored,
    discovered: Option<Discovered>,
    asked_scopes: BTreeSet<String>,
    consecutive_flows: u32,
    running: Option<Running>,
    /// A challenge that came while the file was loading: acted on once it is.
    pending: Option<(BearerChallenge, Option<String>)>,
    next_request: u64,
    actions: VecDeque<AuthAction>,
    events: VecDeque<AuthEvent>,
}

impl Authorizer {
    /// An authorizer with no tokens yet (the file is read before the first request).
    pub(crate) fn new(setup: AuthorizerSetup<'_>) -> Authorizer {
        let client = setup.oauth.client_for(setup.name, &setup.server).cloned();
        Authorizer {
            name: setup.name.to_owned(),
            file: store::file_name(&setup.server),
            server: setup.server,
            client,
            client_metadata_url: setup.oauth.client_metadata_url.clone(),
            redirect_port: setup.oauth.redirect_port,
            user_timeout_ms: setup.oauth.user_timeout_ms,
            request_timeout_ms: setup.request_timeout_ms,
            unix_ms_at_start: setup.unix_ms_at_start,
            rng: setup.rng,
            keeps_tokens: setup.keeps_tokens,
            load: if setup.keeps_tokens {
                Load::NotYet
            } else {
                Load::Done
            },
            stored: Stored::default(),
            discovered: None,
            asked_scopes: BTreeSet::new(),
            consecutive_flows: 0,
            running: None,
            pending: None,
            next_request: 0,
            actions: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The `Authorization` header value for the server's requests (`Bearer …`), if there is
    /// a token. Never logged.
    pub(crate) fn authorization(&self) -> Option<String> {
        self.stored
            .tokens
            .as_ref()
            .map(|t| format!("Bearer {}", t.tokens.access_token.expose()))
    }

    /// Whether a request may go now. Holds it while the token file loads, while a flow runs,
    /// and while an expired token is refreshed (which this starts).
    pub(crate) fn before_request(&mut self, now: MonoTime) -> Gate {
        if self.running.is_some() || self.load == Load::Loading {
            return Gate::Wait;
        }
        if self.load == Load::NotYet {
            self.load = Load::Loading;
            self.actions.push_back(AuthAction::Load {
                file: self.file.clone(),
            });
            return Gate::Wait;
        }
        let expired = self.stored.tokens.as_ref().is_some_and(|t| {
            t.tokens.expires_at.is_some_and(|at| at <= now) && t.tokens.refresh_token.is_some()
        });
        if expired && self.consecutive_flows < MAX_CONSECUTIVE_FLOWS {
            self.start_flow(BearerChallenge::default(), true, None, now);
            return Gate::Wait;
        }
        Gate::Send
    }

    /// A request was answered with something other than `401`/`403`: the current token
    /// works (resets the count of consecutive flows).
    pub(crate) fn on_accepted(&mut self) {
        self.consecutive_flows = 0;
    }

    /// A request sent with `sent` (its `Authorization` value, if any) was answered `status`
    /// (401 or 403) with these `WWW-Authenticate` values.
    pub(crate) fn on_challenge<S: AsRef<str>>(
        &mut self,
        status: u16,
        www_authenticate: &[S],
        sent: Option<&str>,
        now: MonoTime,
    ) -> Challenge {
        let challenge = bearer_challenge(www_authenticate).unwrap_or_default();
        if status == 403 && !challenge.is_insufficient_scope() {
            return Challenge::NotOurs;
        }
        if self.running.is_some() {
            return Challenge::Wait;
        }
        if self.load != Load::Done {
            if self.load == Load::NotYet {
                self.load = Load::Loading;
                self.actions.push_back(AuthAction::Load {
                    file: self.file.clone(),
                });
            }
            self.pending = Some((challenge, sent.map(str::to_owned)));
            return Challenge::Wait;
        }
        let current = self.authorization();
        if status == 401 && current.is_some() && current.as_deref() != sent {
            return Challenge::Retry;
        }
        self.challenged(challenge, status == 403, now)
    }

    /// Acts on a challenge once the token file is known.
    fn challenged(
        &mut self,
        challenge: BearerChallenge,
        step_up: bool,
        now: MonoTime,
    ) -> Challenge {
        if self.consecutive_flows >= MAX_CONSECUTIVE_FLOWS {
            return Challenge::GiveUp(format!(
                "the server kept refusing its tokens ({MAX_CONSECUTIVE_FLOWS} authorizations in a row)"
            ));
        }
        let granted = self
            .stored
            .tokens
            .as_ref()
            .and_then(|t| t.tokens.scope.clone());
        if step_up {
            let Some(needed) = challenge.scope.clone() else {
                return Challenge::GiveUp(
                    "the server answered insufficient_scope without naming the scope it needs"
                        .into(),
                );
            };
            let key = scope_set(&[granted.as_deref().unwrap_or(""), &needed]);
            if self.asked_scopes.contains(&key) {
                return Challenge::GiveUp(format!(
                    "the server still refuses (insufficient scope) after authorizing for {key:?}"
                ));
            }
            self.start_flow(challenge, false, granted, now);
        } else {
            self.start_flow(challenge, true, None, now);
        }
        Challenge::Wait
    }

    /// The token file's content (`Ok(None)`: no file), or why it could not be read.
    pub(crate) fn handle_loaded(&mut self, result: Result<Option<Vec<u8>>, String>, now: MonoTime) {
        if self.load != Load::Loading {
            return;
        }
        self.load = Load::Done;
        match result {
            Ok(None) => {}
            Ok(Some(bytes)) => match store::decode(&bytes, &self.server, self.clocks(now)) {
                Ok(mut stored) => {
                    // A configured client's secret comes from the configuration; tokens of a
                    // client no longer configured are dropped.
                    if let Some(t) = stored.tokens.as_mut()
                        && t.identity.source == IdentitySource::Configured
                    {
                        match self
                            .client
                            .as_ref()
                            .filter(|c| c.client_id.as_deref() == Some(&t.identity.client_id))
                        {
                            Some(c) => t.identity.secret = c.client_secret.clone(),
                            None => stored.tokens = None,
                        }
                    }
                    self.stored = stored;
                }
                Err(e) => self.log(Severity::Warn, format!("token file ignored: {e}")),
            },
            Err(e) => self.log(Severity::Warn, format!("token file not read: {e}")),
        }
        match self.pending.take() {
            None => self.events.push_back(AuthEvent::Proceed),
            Some((challenge, sent)) => {
                let current = self.authorization();
                if current.is_some() && current != sent && !challenge.is_insufficient_scope() {
                    self.events.push_back(AuthEvent::Proceed);
                    return;
                }
                let step_up = challenge.is_insufficient_scope();
                match self.challenged(challenge, step_up, now) {
                    Challenge::GiveUp(reason) => self.events.push_back(AuthEvent::Failed(reason)),
                    Challenge::Retry | Challenge::NotOurs => {
                        self.events.push_back(AuthEvent::Proceed)
                    }
                    Challenge::Wait => {}
                }
            }
        }
    }

    fn start_flow(
        &mut self,
        challenge: BearerChallenge,
        may_refresh: bool,
        extra_scope: Option<String>,
        now: MonoTime,
    ) {
        self.consecutive_flows += 1;
        let refresh = if may_refresh {
            self.stored.tokens.as_ref().and_then(|t| {
                t.tokens
                    .refresh_token
                    .clone()
                    .map(|r| (r, t.identity.clone()))
            })
        } else {
            None
        };
        let setup = FlowSetup {
            server: self.server.clone(),
            challenge,
            client: self.client.clone(),
            client_metadata_url: self.client_metadata_url.clone(),
            redirect_port: self.redirect_port,
            discovered: self.discovered.clone(),
            refresh,
            registration: self.stored.registration.clone(),
            extra_scope,
            rng: self.rng.fork(),
        };
        let (flow, step) = Flow::start(setup, self.clocks(now));
        self.running = Some(Running {
            flow,
            request: None,
            deadline: now,
            listening: false,
            browsing: false,
        });
        self.step(step, now);
    }

    /// The answer to [`AuthAction::Http`] number `request`.
    pub(crate) fn handle_http(
        &mut self,
        request: u64,
        response: Result<OAuthResponse, String>,
        now: MonoTime,
    ) {
        let clocks = self.clocks(now);
        let Some(run) = self.running.as_mut() else {
            return;
        };
        if run.request != Some(request) {
            return;
        }
        run.request = None;
        let step = run.flow.on_response(response, clocks);
        self.step(step, now);
    }

    /// The loopback listener is open on `port`, or could not be opened.
    pub(crate) fn handle_listening(&mut self, result: Result<u16, String>, now: MonoTime) {
        let Some(run) = self.running.as_mut() else {
            return;
        };
        run.listening = result.is_ok();
        let step = run.flow.on_listening(result);
        self.step(step, now);
    }

    /// A connection to the loopback listener sent this request `head`: the bytes to answer
    /// with (then the connection is closed).
    pub(crate) fn handle_callback(&mut self, head: &[u8], now: MonoTime) -> Vec<u8> {
        let request = parse_callback_head(head);
        let CallbackRequest::Callback(params) = &request else {
            return callback_response(&CallbackAnswer::Refused(&request), &self.name);
        };
        let clocks = self.clocks(now);
        let Some(run) = self.running.as_mut().filter(|r| r.browsing) else {
            return callback_response(&CallbackAnswer::Expired, &self.name);
        };
        let (page, step) = run.flow.on_callback(params, clocks);
        if page != CallbackPage::Foreign {
            run.browsing = false;
            self.actions.push_back(AuthAction::BrowseDone);
        }
        let bytes = callback_response(&CallbackAnswer::Page(&page), &self.name);
        self.step(step, now);
        bytes
    }

    /// The user declined (or the client cancelled) the visit.
    pub(crate) fn handle_declined(&mut self, now: MonoTime) {
        let Some(run) = self.running.as_mut().filter(|r| r.browsing) else {
            return;
        };
        run.browsing = false;
        let step = run.flow.on_declined();
        self.step(step, now);
    }

    /// The next action, in order.
    pub(crate) fn poll_action(&mut self) -> Option<AuthAction> {
        self.actions.pop_front()
    }

    /// The next event for the transport, in order.
    pub(crate) fn poll_event(&mut self) -> Option<AuthEvent> {
        self.events.pop_front()
    }

    /// When [`Authorizer::handle_timeout`] must be called, if a flow runs.
    pub(crate) fn poll_timeout(&self) -> Option<MonoTime> {
        self.running.as_ref().map(|r| r.deadline)
    }

    /// The step in progress is over its deadline: the authorization fails, naming it.
    pub(crate) fn handle_timeout(&mut self, now: MonoTime) {
        let Some(run) = self.running.as_ref() else {
            return;
        };
        if run.deadline > now {
            return;
        }
        let what = if run.browsing {
            format!(
                "the authorization was not completed within {} s",
                self.user_timeout_ms / 1000
            )
        } else {
            format!(
                "an authorization request got no answer within {} s",
                self.request_timeout_ms / 1000
            )
        };
        self.finish(Err(what));
    }

    /// Whether a flow runs (or the file loads).
    pub(crate) fn is_busy(&self) -> bool {
        self.running.is_some() || self.load == Load::Loading
    }

    fn step(&mut self, step: FlowStep, now: MonoTime) {
        let Some(run) = self.running.as_mut() else {
            return;
        };
        match step {
            FlowStep::Request(http) => {
                self.next_request += 1;
                run.request = Some(self.next_request);
                run.deadline = now.plus_ms(self.request_timeout_ms);
                self.actions.push_back(AuthAction::Http {
                    request: self.next_request,
                    http,
                });
            }
            FlowStep::Listen { port } => {
                run.deadline = now.plus_ms(self.request_timeout_ms);
                self.actions.push_back(AuthAction::Listen { port });
            }
            FlowStep::Browse { url } => {
                run.browsing = true;
                run.deadline = now.plus_ms(self.user_timeout_ms);
                self.actions.push_back(AuthAction::Browse { url });
            }
            FlowStep::Wait => {}
            FlowStep::Finished(result) => self.finish(result),
        }
    }

    fn finish(&mut self, result: Result<Box<super::flow::Obtained>, String>) {
        let Some(run) = self.running.take() else {
            return;
        };
        if run.listening {
            self.actions.push_back(AuthAction::StopListening);
        }
        if run.browsing {
            self.actions.push_back(AuthAction::BrowseDone);
        }
        match result {
            Ok(got) => {
                let got = *got;
                if let Some(s) = &got.requested_scope {
                    self.asked_scopes.insert(scope_set(&[s]));
                }
                let issuer = got.discovered.server.issuer.canonical();
                if got.identity.source == IdentitySource::Registered
                    && let Some(redirect_uri) = got.redirect_uri.clone()
                {
                    self.stored.registration = Some(super::flow::Registration {
                        issuer: issuer.clone(),
                        redirect_uri,
                        identity: got.identity.clone(),
                    });
                }
                let scope = got.tokens.scope.clone();
                self.stored.tokens = Some(StoredTokens {
                    tokens: got.tokens,
                    issuer,
                    identity: got.identity,
                });
                self.discovered = Some(got.discovered);
                if self.keeps_tokens {
                    self.actions.push_back(AuthAction::Save {
                        file: self.file.clone(),
                        bytes: store::encode(&self.stored, &self.server),
                    });
                }
                let scope = scope.map_or_else(String::new, |s| format!(" (scope {s:?})"));
                self.log(Severity::Info, format!("authorized{scope}"));
                self.events.push_back(AuthEvent::Proceed);
            }
            Err(reason) => {
                self.log(Severity::Warn, format!("authorization failed: {reason}"));
                self.events.push_back(AuthEvent::Failed(reason));
            }
        }
    }

    fn log(&mut self, level: Severity, message: String) {
        self.actions.push_back(AuthAction::Log(
            level,
            format!("MCP server '{}': {message}", self.name),
        ));
    }

    fn clocks(&self, now: MonoTime) -> Clocks {
        Clocks {
            now,
            unix_ms: self.unix_ms_at_start.saturating_add(now.as_ms()),
        }
    }
}

/// A set of scopes as one key: the scopes of `parts`, sorted, unique, space-separated.
fn scope_set(parts: &[&str]) -> String {
    let set: BTreeSet<&str> = parts.iter().flat_map(|p| p.split_whitespace()).collect();
    set.into_iter().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::flow::Method;
    use crate::url::form_decode;
    use serde_json::{Value, json};

    const MCP: &str = "http://localhost:3000/mcp";
    const AS: &str = "http://localhost:4000";

    fn t(ms: u64) -> MonoTime {
        MonoTime::ZERO.plus_ms(ms)
    }

    fn authorizer(oauth: &OAuthConfig, keeps_tokens: bool) -> Authorizer {
        Authorizer::new(AuthorizerSetup {
            name: "remote",
            server: HttpUrl::parse(MCP).unwrap(),
            oauth,
            request_timeout_ms: 30_000,
            keeps_tokens,
            unix_ms_at_start: 1_700_000_000_000,
            rng: SecretRng::new([3; 32]),
        })
    }

    fn ok(body: Value) -> Result<OAuthResponse, String> {
        Ok(OAuthResponse {
            status: 200,
            headers: Vec::new(),
            body: body.to_string().into_bytes(),
        })
    }

    /// The conformance suite's servers, issuing `token-<n>` with `expires_in`.
    struct World {
        issued: u32,
        expires_in: u64,
        refresh_ok: bool,
    }

    impl World {
        fn answer(&mut self, r: &OAuthRequest) -> Result<OAuthResponse, String> {
            match (r.method, r.url.as_sent().as_str()) {
                (Method::Get, "http://localhost:3000/.well-known/oauth-protected-resource/mcp") => {
                    ok(json!({"resource": MCP, "authorization_servers": [AS]}))
                }
                (Method::Get, "http://localhost:4000/.well-known/oauth-authorization-server") => {
                    ok(json!({
                        "issuer": AS, "authorization_endpoint": format!("{AS}/authorize"), "token_endpoint": format!("{AS}/token"),
                        "registration_endpoint": format!("{AS}/register"), "code_challenge_methods_supported": ["S256"],
                        "token_endpoint_auth_methods_supported": ["none"]
                    }))
                }
                (Method::Post, "http://localhost:4000/register") => {
                    ok(json!({"client_id": "dcr", "token_endpoint_auth_method": "none"}))
                }
                (Method::Post, "http://localhost:4000/token") => {
                    let form = form_decode(std::str::from_utf8(&r.body).unwrap());
                    let grant = form
                        .iter()
                        .find(|(k, _)| k == "grant_type")
                        .map(|(_, v)| v.clone());
                    if grant.as_deref() == Some("refresh_token") && !self.refresh_ok {
                        return Ok(OAuthResponse {
                            status: 400,
                            headers: Vec::new(),
                            body: br#"{"error":"invalid_grant"}"#.to_vec(),
                        });
                    }
                    let scope = form
                        .iter()
                        .find(|(k, _)| k == "scope")
                        .map(|(_, v)| v.clone());
                    self.issued += 1;
                    let mut body = json!({"access_token": format!("token-{}", self.issued), "token_type": "Bearer",
                        "expires_in": self.expires_in, "refresh_token": format!("refresh-{}", self.issued)});
                    if let Some(s) = scope {
                        body["scope"] = json!(s);
                    }
                    ok(body)
                }
                _ => Ok(OAuthResponse {
                    status: 404,
                    headers: Vec::new(),
                    body: Vec::new(),
                }),
            }
        }
    }

    /// Runs the authorizer's actions until none is left: HTTP against `world`, the listener
    /// on port 50123, the browser following the authorization URL to the callback (unless
    /// `browse` is false), the token file answered `file`. Returns the actions seen.
    fn run(
        a: &mut Authorizer,
        world: &mut World,
        now: MonoTime,
        browse: bool,
        file: &mut Option<Vec<u8>>,
    ) -> Vec<AuthAction> {
        let mut seen = Vec::new();
        while let Some(action) = a.poll_action() {
            seen.push(action.clone());
            match action {
                AuthAction::Http { request, http } => {
                    let answer = world.answer(&http);
                    a.handle_http(request, answer, now);
                }
                AuthAction::Listen { .. } => a.handle_listening(Ok(50123), now),
                AuthAction::Browse { url } if browse => {
                    let u = HttpUrl::parse(&url).unwrap();
                    let q = form_decode(u.query().unwrap());
                    let state = q.iter().find(|(k, _)| k == "state").unwrap().1.clone();
                    let head = format!(
                        "GET /callback?code=c&state={state} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                    );
                    let page = a.handle_callback(head.as_bytes(), now);
                    assert!(
                        page.starts_with(b"HTTP/1.1 200 OK"),
                        "{}",
                        String::from_utf8_lossy(&page)
                    );
                }
                AuthAction::Load { .. } => a.handle_loaded(Ok(file.clone()), now),
                AuthAction::Save { bytes, .. } => *file = Some(bytes),
                AuthAction::Browse { .. }
                | AuthAction::StopListening
                | AuthAction::BrowseDone
                | AuthAction::Log(..) => {}
            }
        }
        seen
    }

    fn events(a: &mut Authorizer) -> Vec<AuthEvent> {
        std::iter::from_fn(|| a.poll_event()).collect()
    }

    fn world() -> World {
        World {
            issued: 0,
            expires_in: 3600,
            refresh_ok: true,
        }
    }

    #[test]
    fn the_token_file_is_read_before_the_first_request_and_a_401_runs_a_flow_that_saves_tokens() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, true);
        let mut w = world();
        let mut file = None;
        assert_eq!(a.before_request(t(0)), Gate::Wait);
        let seen = run(&mut a, &mut w, t(0), true, &mut file);
        assert!(matches!(seen[0], AuthAction::Load { ref file } if file.ends_with(".json")));
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert_eq!(a.before_request(t(1)), Gate::Send);
        assert_eq!(a.authorization(), None);
        let c = a.on_challenge(
            401,
            &[format!(
                "Bearer resource_metadata=\"{}\"",
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp"
            )],
            None,
            t(2),
        );
        assert_eq!(c, Challenge::Wait);
        assert!(a.is_busy());
        assert_eq!(
            a.before_request(t(2)),
            Gate::Wait,
            "requests wait while the flow runs"
        );
        let seen = run(&mut a, &mut w, t(3), true, &mut file);
        assert!(
            seen.contains(&AuthAction::StopListening) && seen.contains(&AuthAction::BrowseDone)
        );
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert_eq!(a.authorization().as_deref(), Some("Bearer token-1"));
        let saved = store::decode(
            file.as_ref().unwrap(),
            &HttpUrl::parse(MCP).unwrap(),
            Clocks {
                now: t(3),
                unix_ms: 1_700_000_000_003,
            },
        )
        .unwrap();
        assert_eq!(
            saved.tokens.unwrap().tokens.access_token.expose(),
            "token-1"
        );
        assert_eq!(saved.registration.unwrap().identity.client_id, "dcr");
        assert!(!format!("{seen:?}").contains("token-1"), "{seen:?}");

        // The next run reads the file: no flow, the kept token is used.
        let mut b = authorizer(&oauth, true);
        assert_eq!(b.before_request(t(0)), Gate::Wait);
        run(&mut b, &mut w, t(0), true, &mut file);
        assert_eq!(events(&mut b), [AuthEvent::Proceed]);
        assert_eq!(b.authorization().as_deref(), Some("Bearer token-1"));
        assert_eq!(w.issued, 1);
    }

    #[test]
    fn a_401_for_an_older_header_is_retried_and_for_the_current_one_refreshes() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        let mut w = world();
        let mut file = None;
        assert_eq!(
            a.on_challenge(401, &["Bearer"], None, t(0)),
            Challenge::Wait
        );
        run(&mut a, &mut w, t(0), true, &mut file);
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert!(file.is_none(), "no state directory: nothing saved");
        assert_eq!(
            a.on_challenge(401, &["Bearer"], None, t(1)),
            Challenge::Retry
        );
        assert_eq!(
            a.on_challenge(401, &["Bearer"], Some("Bearer stale"), t(1)),
            Challenge::Retry
        );
        let current = a.authorization();
        assert_eq!(
            a.on_challenge(
                401,
                &["Bearer error=\"invalid_token\""],
                current.as_deref(),
                t(2)
            ),
            Challenge::Wait
        );
        let seen = run(&mut a, &mut w, t(2), false, &mut file);
        assert!(
            !seen.iter().any(|x| matches!(x, AuthAction::Browse { .. })),
            "refreshed without the user"
        );
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert_eq!(a.authorization().as_deref(), Some("Bearer token-2"));
    }

    #[test]
    fn an_expired_token_is_refreshed_before_the_request_goes() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        let mut w = World {
            expires_in: 60,
            ..world()
        };
        let mut file = None;
        a.on_challenge(401, &["Bearer"], None, t(0));
        run(&mut a, &mut w, t(0), true, &mut file);
        events(&mut a);
        assert_eq!(a.before_request(t(59_000)), Gate::Send);
        assert_eq!(a.before_request(t(60_000)), Gate::Wait);
        run(&mut a, &mut w, t(60_000), false, &mut file);
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert_eq!(a.authorization().as_deref(), Some("Bearer token-2"));
    }

    #[test]
    fn step_up_happens_once_per_scope_set_and_a_plain_403_is_not_ours() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        let mut w = world();
        let mut file = None;
        a.on_challenge(401, &["Bearer scope=\"mcp:basic\""], None, t(0));
        run(&mut a, &mut w, t(0), true, &mut file);
        events(&mut a);
        let up = ["Bearer error=\"insufficient_scope\", scope=\"mcp:basic mcp:write\""];
        let sent = a.authorization();
        assert_eq!(
            a.on_challenge(403, &up, sent.as_deref(), t(1)),
            Challenge::Wait
        );
        let seen = run(&mut a, &mut w, t(1), true, &mut file);
        let browse = seen
            .iter()
            .find_map(|x| {
                if let AuthAction::Browse { url } = x {
                    Some(url.clone())
                } else {
                    None
                }
            })
            .unwrap();
        assert!(browse.contains("scope=mcp%3Abasic+mcp%3Awrite"), "{browse}");
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        let sent = a.authorization();
        let again = a.on_challenge(403, &up, sent.as_deref(), t(2));
        assert!(
            matches!(again, Challenge::GiveUp(ref e) if e.contains("insufficient scope")),
            "{again:?}"
        );
        assert_eq!(
            a.on_challenge(403, &["Bearer"], sent.as_deref(), t(2)),
            Challenge::NotOurs
        );
        assert!(matches!(
            a.on_challenge(403, &["Bearer error=\"insufficient_scope\""], sent.as_deref(), t(2)),
            Challenge::GiveUp(ref e) if e.contains("without naming")
        ));
    }

    #[test]
    fn the_retry_limit_fixture_sees_one_authorization() {
        // auth/scope-retry-limit: 401 asks for mcp:admin, then every request is 403 for it.
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        let mut w = world();
        let mut file = None;
        a.on_challenge(401, &["Bearer scope=\"mcp:admin\""], None, t(0));
        run(&mut a, &mut w, t(0), true, &mut file);
        events(&mut a);
        let sent = a.authorization();
        let c = a.on_challenge(
            403,
            &["Bearer error=\"insufficient_scope\", scope=\"mcp:admin\""],
            sent.as_deref(),
            t(1),
        );
        assert!(matches!(c, Challenge::GiveUp(_)), "{c:?}");
        assert_eq!(w.issued, 1);
    }

    #[test]
    fn a_server_refusing_every_token_stops_after_three_flows() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        let mut w = World {
            refresh_ok: false,
            ..world()
        };
        let mut file = None;
        for i in 0..MAX_CONSECUTIVE_FLOWS {
            let sent = a.authorization();
            assert_eq!(
                a.on_challenge(401, &["Bearer"], sent.as_deref(), t(u64::from(i))),
                Challenge::Wait
            );
            run(&mut a, &mut w, t(u64::from(i)), true, &mut file);
            assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        }
        let sent = a.authorization();
        assert!(
            matches!(a.on_challenge(401, &["Bearer"], sent.as_deref(), t(9)), Challenge::GiveUp(ref e) if e.contains("3 authorizations"))
        );
        // A request the server accepts resets the count.
        a.on_accepted();
        assert_eq!(
            a.on_challenge(401, &["Bearer"], sent.as_deref(), t(10)),
            Challenge::Wait
        );
    }

    #[test]
    fn the_user_s_time_limit_and_a_decline_fail_the_authorization_and_close_the_listener() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        let mut w = world();
        let mut file = None;
        a.on_challenge(401, &["Bearer"], None, t(0));
        run(&mut a, &mut w, t(0), false, &mut file);
        assert_eq!(a.poll_timeout(), Some(t(300_000)));
        a.handle_timeout(t(299_999));
        assert!(events(&mut a).is_empty());
        a.handle_timeout(t(300_000));
        let seen = run(&mut a, &mut w, t(300_000), false, &mut file);
        assert!(
            seen.contains(&AuthAction::StopListening) && seen.contains(&AuthAction::BrowseDone),
            "{seen:?}"
        );
        assert!(matches!(&events(&mut a)[..], [AuthEvent::Failed(e)] if e.contains("300 s")));
        assert_eq!(a.poll_timeout(), None);
        // A callback now finds nobody waiting.
        let page = a.handle_callback(b"GET /callback?code=x&state=y HTTP/1.1\r\n\r\n", t(300_001));
        assert!(page.starts_with(b"HTTP/1.1 410"));

        a.on_challenge(401, &["Bearer"], None, t(400_000));
        run(&mut a, &mut w, t(400_000), false, &mut file);
        a.handle_declined(t(400_001));
        run(&mut a, &mut w, t(400_001), false, &mut file);
        assert!(matches!(&events(&mut a)[..], [AuthEvent::Failed(e)] if e.contains("declined")));
    }

    #[test]
    fn a_request_that_gets_no_answer_times_out() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, false);
        a.on_challenge(401, &["Bearer"], None, t(0));
        assert!(matches!(a.poll_action(), Some(AuthAction::Http { .. })));
        assert_eq!(a.poll_timeout(), Some(t(30_000)));
        a.handle_timeout(t(30_000));
        assert!(
            matches!(&events(&mut a)[..], [AuthEvent::Failed(e)] if e.contains("no answer within 30 s"))
        );
        // The late answer changes nothing.
        a.handle_http(1, ok(json!({})), t(30_001));
        assert!(events(&mut a).is_empty());
    }

    #[test]
    fn a_broken_token_file_is_a_warning_and_a_fresh_start() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, true);
        let mut w = world();
        let mut file = Some(b"garbage".to_vec());
        a.before_request(t(0));
        let seen = run(&mut a, &mut w, t(0), true, &mut file);
        assert!(seen.iter().any(|x| matches!(x, AuthAction::Log(Severity::Warn, m) if m.contains("token file ignored") && m.contains("'remote'"))));
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert_eq!(a.authorization(), None);
    }

    #[test]
    fn a_challenge_while_the_file_loads_is_acted_on_after_it() {
        let oauth = OAuthConfig::default();
        let mut a = authorizer(&oauth, true);
        let mut w = world();
        let mut file = None;
        assert_eq!(
            a.on_challenge(401, &["Bearer"], None, t(0)),
            Challenge::Wait
        );
        let seen = run(&mut a, &mut w, t(0), true, &mut file);
        assert!(matches!(seen[0], AuthAction::Load { .. }));
        assert!(seen.iter().any(|x| matches!(x, AuthAction::Browse { .. })));
        assert_eq!(events(&mut a), [AuthEvent::Proceed]);
        assert_eq!(a.authorization().as_deref(), Some("Bearer token-1"));
    }

    #[test]
    fn scope_sets_ignore_order_and_repeats() {
        assert_eq!(scope_set(&["b a", "a c"]), "a b c");
        assert_eq!(scope_set(&["", " "]), "");
    }
}
