//! One authorization of one MCP server, as a state machine (MCP 2025-11-25
//! basic/authorization "Authorization Flow Steps"): it asks for one thing at a time — an HTTP
//! request, a loopback listener, the user's visit to a URL — and is told what came of it.
//!
//! ```text
//!  start ──► Resource ──(metadata, resource covers the server)──► Server ──► (discovered)
//!              │ every URL 4xx: the 2025-03-26 fallback ───────────┘   │
//!              └ cached discovery (step-up, refresh) ──────────────────┤
//!                                                                      ▼
//!            refresh token? ──► Refresh ──ok──► Finished(tokens)
//!                                  │ refused: fall through to the grant
//!                                  ▼
//!   grant: authorization code ─► Listening ─► [Registering] ─► Browsing ─(callback)─► ExchangingCode ─► Finished
//!          client credentials ─► ClientCredentials ─────────────────────────────────────────────────► Finished
//!          cross-app access ───► IdentityExchange (IdP, RFC 8693) ─► JwtBearer (RFC 7523) ──────────► Finished
//! ```
//!
//! Every failure finishes the flow with one sentence for the user; nothing is retried here
//! except what the discovery order prescribes (the next well-known URL) and bounded
//! redirects of metadata requests. Time limits are the [`Authorizer`](super::authorizer)'s.

use super::challenge::BearerChallenge;
use super::client::{
    AssertionInputs, AuthMethod, ClientConfig, ClientIdentity, Grant, IdentitySource, authenticate,
    choose_method, registration_method,
};
use super::metadata::{
    ResourceMetadata, ServerMetadata, assumed_server_metadata, parse_resource_metadata,
    parse_server_metadata, quote_for_message, resource_metadata_urls, server_metadata_urls,
};
use super::secrets::{Pkce, Secret, SecretRng};
use super::tokens::{self, Clocks, TokenSet};
use crate::url::{HttpUrl, form_encode};
use serde_json::{Value, json};
use std::fmt;

/// Redirects one metadata request may follow (then it fails, naming the loop).
pub(crate) const MAX_REDIRECTS: u8 = 5;

/// The path of the loopback redirect URI (`http://127.0.0.1:<port>/callback`).
pub(crate) const CALLBACK_PATH: &str = "/callback";

/// `client_name` in a dynamic registration.
pub(crate) const CLIENT_NAME: &str = "buzz-agent";

/// An HTTP method of an authorization request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// Metadata.
    Get,
    /// Registration and token requests.
    Post,
}

/// One HTTP request of an authorization, complete (the runtime sends it as is and follows no
/// redirect). `Debug` shows the method, the URL and the body's length, never the body or the
/// headers (they carry credentials).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct OAuthRequest {
    /// GET or POST.
    pub(crate) method: Method,
    /// Where.
    pub(crate) url: HttpUrl,
    /// Header `(name, value)` pairs, names lower case.
    pub(crate) headers: Vec<(String, String)>,
    /// The body (empty for GET).
    pub(crate) body: Vec<u8>,
}

impl fmt::Debug for OAuthRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} {} ({} B)", self.method, self.url, self.body.len())
    }
}

/// What came back for an [`OAuthRequest`]: the status, the headers (names lower case) and
/// the whole body (the caller caps it), or why there is no answer.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct OAuthResponse {
    /// HTTP status.
    pub(crate) status: u16,
    /// `(name, value)`, names lower case.
    pub(crate) headers: Vec<(String, String)>,
    /// The body.
    pub(crate) body: Vec<u8>,
}

impl fmt::Debug for OAuthResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {} ({} B)", self.status, self.body.len())
    }
}

impl OAuthResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What a flow wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FlowStep {
    /// Send this request; answer with [`Flow::on_response`].
    Request(OAuthRequest),
    /// Open a loopback listener on `127.0.0.1:port` (0: any free port); answer with
    /// [`Flow::on_listening`].
    Listen {
        /// The port, 0 for any.
        port: u16,
    },
    /// The user must open `url` (the authorization request); answer with
    /// [`Flow::on_callback`] when the redirect arrives, or [`Flow::on_declined`].
    Browse {
        /// The authorization URL.
        url: String,
    },
    /// Nothing to do until the next input (a callback that was not ours).
    Wait,
    /// The flow ended.
    Finished(Result<Box<Obtained>, String>),
}

/// What a discovery found, kept by the authorizer so that a step-up or a refresh skips it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Discovered {
    /// The RFC 8707 `resource` value: the protected resource metadata's `resource`, or the
    /// server's canonical URL when it has none (the 2025-03-26 fallback).
    pub(crate) resource: String,
    /// `scopes_supported` of the protected resource metadata.
    pub(crate) resource_scopes: Option<Vec<String>>,
    /// The authorization server.
    pub(crate) server: ServerMetadata,
}

/// The result of a successful flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Obtained {
    /// The tokens.
    pub(crate) tokens: TokenSet,
    /// The client that obtained them (used again to refresh).
    pub(crate) identity: ClientIdentity,
    /// A dynamically registered client's redirect URI (to keep the registration with it).
    pub(crate) redirect_uri: Option<String>,
    /// The discovery the flow used.
    pub(crate) discovered: Discovered,
    /// The scopes it asked for (space-separated), if any.
    pub(crate) requested_scope: Option<String>,
}

/// A dynamically registered client from an earlier flow or run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registration {
    /// The issuer it was registered with (canonical form).
    pub(crate) issuer: String,
    /// The redirect URI it registered.
    pub(crate) redirect_uri: String,
    /// The client.
    pub(crate) identity: ClientIdentity,
}

/// Everything a flow starts from.
#[derive(Debug, Clone)]
pub(crate) struct FlowSetup {
    /// The MCP server's URL.
    pub(crate) server: HttpUrl,
    /// The challenge that started it (its `resource_metadata` and `scope`).
    pub(crate) challenge: BearerChallenge,
    /// The server's configured client, if any.
    pub(crate) client: Option<ClientConfig>,
    /// The global client ID metadata document URL, if configured.
    pub(crate) client_metadata_url: Option<HttpUrl>,
    /// The redirect port when the client configures none (0: any).
    pub(crate) redirect_port: u16,
    /// An earlier discovery to reuse.
    pub(crate) discovered: Option<Discovered>,
    /// A refresh token and the client it belongs to: tried before any grant.
    pub(crate) refresh: Option<(Secret, ClientIdentity)>,
    /// A registration to reuse when its issuer and redirect URI match.
    pub(crate) registration: Option<Registration>,
    /// Scopes to add to the selected ones (the ones granted before a step-up).
    pub(crate) extra_scope: Option<String>,
    /// Where the flow's secrets come from.
    pub(crate) rng: SecretRng,
}

/// The answer to a redirect that reached the loopback listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallbackPage {
    /// The code was received: "you can close this window".
    Received,
    /// The authorization server sent an error (the user declined, …), shown to the user.
    Refused(String),
    /// Not the callback of this flow (wrong or missing `state`): 400, the flow keeps waiting.
    Foreign,
}

/// Where a flow is.
#[derive(Debug)]
enum Stage {
    Resource(Box<ResourceCursor>),
    Server(Box<ServerCursor>),
    Refresh {
        identity: ClientIdentity,
    },
    Listening {
        port: u16,
        fixed: bool,
    },
    Registering {
        redirect_uri: String,
    },
    Browsing {
        state: String,
        pkce: Pkce,
        redirect_uri: String,
        identity: ClientIdentity,
        registered: bool,
        scope: Option<String>,
    },
    ExchangingCode {
        identity: ClientIdentity,
        redirect_uri: Option<String>,
        scope: Option<String>,
    },
    ClientCredentials {
        identity: ClientIdentity,
        scope: Option<String>,
    },
    IdentityExchange {
        identity: ClientIdentity,
        scope: Option<String>,
    },
    JwtBearer {
        identity: ClientIdentity,
        scope: Option<String>,
    },
    Done,
}

/// One authorization in progress. Built by [`Flow::start`], driven by the `on_*` methods,
/// each of which returns the next [`FlowStep`]; after `Finished` every input is ignored.
#[derive(Debug)]
pub(crate) struct Flow {
    setup: FlowSetup,
    stage: Stage,
    discovered: Option<Discovered>,
}

impl Flow {
    /// A flow for `setup` and its first step.
    pub(crate) fn start(setup: FlowSetup, clocks: Clocks) -> (Flow, FlowStep) {
        let mut flow = Flow {
            discovered: setup.discovered.clone(),
            setup,
            stage: Stage::Done,
        };
        let step = if flow.discovered.is_some() {
            flow.after_discovery(clocks)
        } else {
            let from_header = flow.setup.challenge.resource_metadata.as_deref();
            let urls = resource_metadata_urls(&flow.setup.server, from_header);
            let from_header = from_header.is_some_and(|h| HttpUrl::parse(h.trim()).is_ok());
            let cursor = ResourceCursor {
                current: flow.setup.server.clone(),
                urls,
                next: 0,
                redirects: 0,
                all_client_errors: true,
                from_header,
                last_error: None,
            };
            flow.resource_request(cursor, clocks)
        };
        (flow, step)
    }

    /// The flow's time-sensitive stage: whether it waits for the user (the authorizer gives
    /// that stage the user's time limit instead of a request's).
    pub(crate) fn waits_for_user(&self) -> bool {
        matches!(self.stage, Stage::Browsing { .. })
    }

    /// The redirect URI the flow listens on, once it has one.
    pub(crate) fn redirect_uri(&self) -> Option<&str> {
        match &self.stage {
            Stage::Registering { redirect_uri } | Stage::Browsing { redirect_uri, .. } => {
                Some(redirect_uri)
            }
            Stage::Resource(_)
            | Stage::Server(_)
            | Stage::Refresh { .. }
            | Stage::Listening { .. }
            | Stage::ExchangingCode { .. }
            | Stage::ClientCredentials { .. }
            | Stage::IdentityExchange { .. }
            | Stage::JwtBearer { .. }
            | Stage::Done => None,
        }
    }

    /// The answer to the last [`FlowStep::Request`] (`Err`: no answer, with the reason).
    pub(crate) fn on_response(
        &mut self,
        response: Result<OAuthResponse, String>,
        clocks: Clocks,
    ) -> FlowStep {
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        match stage {
            Stage::Resource(c) => self.on_resource(response, *c, clocks),
            Stage::Server(c) => self.on_server(response, *c, clocks),
            Stage::Refresh { identity } => match post_answer(response, "token endpoint") {
                Ok(r) => match tokens::parse_token_response(r.status, &r.body, None, clocks) {
                    Ok(mut t) => {
                        if t.refresh_token.is_none() {
                            t.refresh_token = self.setup.refresh.as_ref().map(|(r, _)| r.clone());
                        }
                        self.finish_ok(t, identity, None, None)
                    }
                    // A refused refresh token falls through to the grant.
                    Err(_) => self.start_grant(clocks),
                },
                Err(_) => self.start_grant(clocks),
            },
            Stage::Registering { redirect_uri } => {
                match post_answer(response, "registration endpoint")
                    .and_then(|r| self.read_registration(&r))
                {
                    Ok(identity) => self.browse(identity, redirect_uri, true),
                    Err(e) => self.fail(e),
                }
            }
            Stage::ExchangingCode {
                identity,
                redirect_uri,
                scope,
            } => self.token_answer(response, identity, redirect_uri, scope, clocks),
            Stage::ClientCredentials { identity, scope } | Stage::JwtBearer { identity, scope } => {
                self.token_answer(response, identity, None, scope, clocks)
            }
            Stage::IdentityExchange { identity, scope } => {
                match post_answer(response, "identity provider").and_then(|r| {
                    tokens::parse_id_jag_response(r.status, &r.body).map_err(|e| e.message)
                }) {
                    Ok(grant) => self.jwt_bearer(identity, scope, &grant, clocks),
                    Err(e) => self.fail(format!(
                        "the identity provider refused the token exchange: {e}"
                    )),
                }
            }
            other @ (Stage::Listening { .. } | Stage::Browsing { .. } | Stage::Done) => {
                self.stage = other;
                FlowStep::Wait
            }
        }
    }

    /// The loopback listener is open on `port`, or could not be opened.
    pub(crate) fn on_listening(&mut self, result: Result<u16, String>) -> FlowStep {
        let Stage::Listening { port, fixed } = self.stage else {
            return FlowStep::Wait;
        };
        match result {
            Ok(bound) => {
                let redirect_uri = format!("http://127.0.0.1:{bound}{CALLBACK_PATH}");
                self.choose_identity(redirect_uri)
            }
            // A port kept from an earlier registration may be taken now: any port will do
            // (the client is registered anew).
            Err(_) if !fixed && port != 0 => {
                self.setup.registration = None;
                self.stage = Stage::Listening {
                    port: 0,
                    fixed: false,
                };
                FlowStep::Listen { port: 0 }
            }
            Err(e) => self.fail(format!(
                "could not listen for the authorization redirect on 127.0.0.1:{port}: {e}"
            )),
        }
    }

    /// The redirect reached the listener with these query parameters.
    pub(crate) fn on_callback(
        &mut self,
        params: &[(String, String)],
        clocks: Clocks,
    ) -> (CallbackPage, FlowStep) {
        let get = |n: &str| params.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        let Stage::Browsing { state, .. } = &self.stage else {
            return (CallbackPage::Foreign, FlowStep::Wait);
        };
        if get("state") != Some(state.as_str()) {
            return (CallbackPage::Foreign, FlowStep::Wait);
        }
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        let Stage::Browsing {
            pkce,
            redirect_uri,
            identity,
            registered,
            scope,
            ..
        } = stage
        else {
            return (CallbackPage::Foreign, FlowStep::Wait);
        };
        let Some(discovered) = self.discovered.clone() else {
            return (
                CallbackPage::Foreign,
                self.fail("internal: no discovery".into()),
            );
        };
        // RFC 9207: an `iss` in the answer must be the issuer we sent the user to.
        if let Some(iss) = get("iss")
            && HttpUrl::parse(iss).map(|u| u.canonical()).ok()
                != Some(discovered.server.issuer.canonical())
        {
            let e = format!(
                "the authorization answer came from the issuer {}, not {} (refused, RFC 9207)",
                quote_for_message(iss),
                discovered.server.issuer
            );
            return (CallbackPage::Refused(e.clone()), self.fail(e));
        }
        if let Some(error) = get("error") {
            let e = match get("error_description") {
                Some(d) => format!(
                    "the authorization server refused: {} ({})",
                    quote_for_message(error),
                    quote_for_message(d)
                ),
                None => format!(
                    "the authorization server refused: {}",
                    quote_for_message(error)
                ),
            };
            return (CallbackPage::Refused(e.clone()), self.fail(e));
        }
        let Some(code) = get("code").filter(|c| !c.is_empty()) else {
            let e = "the authorization answer carried no code".to_owned();
            return (CallbackPage::Refused(e.clone()), self.fail(e));
        };
        let mut form = vec![
            ("grant_type".to_owned(), "authorization_code".to_owned()),
            ("code".to_owned(), code.to_owned()),
            ("redirect_uri".to_owned(), redirect_uri.clone()),
            ("code_verifier".to_owned(), pkce.verifier.clone()),
            ("resource".to_owned(), discovered.resource.clone()),
        ];
        let step = match self.token_request(&identity, &mut form, Some(clocks)) {
            Ok(request) => {
                self.stage = Stage::ExchangingCode {
                    identity,
                    redirect_uri: registered.then_some(redirect_uri),
                    scope,
                };
                FlowStep::Request(request)
            }
            Err(e) => self.fail(e),
        };
        (CallbackPage::Received, step)
    }

    /// The user declined to open the authorization URL (or the client cancelled).
    pub(crate) fn on_declined(&mut self) -> FlowStep {
        if matches!(self.stage, Stage::Done) {
            return FlowStep::Wait;
        }
        self.fail("the authorization was declined".to_owned())
    }

    // ---- discovery ----

    /// The next URL of `c`, or the end of the search.
    fn resource_request(&mut self, mut c: ResourceCursor, clocks: Clocks) -> FlowStep {
        let Some(url) = c.urls.get(c.next).cloned() else {
            return self.resource_exhausted(c, clocks);
        };
        c.next += 1;
        c.current = url.clone();
        c.redirects = 0;
        self.stage = Stage::Resource(Box::new(c));
        FlowStep::Request(get(url))
    }

    fn resource_exhausted(&mut self, c: ResourceCursor, clocks: Clocks) -> FlowStep {
        if c.all_client_errors && !c.from_header {
            // No protected resource metadata anywhere: the 2025-03-26 rules, with the
            // server's origin as the authorization server.
            let issuer = self.setup.server.root();
            return self.server_request(ServerCursor::new(None, issuer), clocks);
        }
        let tried = tried(&c.urls);
        self.fail(match c.last_error {
            Some(e) => format!("no protected resource metadata ({e}; tried {tried})"),
            None => format!("no protected resource metadata (tried {tried})"),
        })
    }

    fn on_resource(
        &mut self,
        response: Result<OAuthResponse, String>,
        mut c: ResourceCursor,
        clocks: Clocks,
    ) -> FlowStep {
        let response = match response {
            Ok(r) => r,
            Err(e) => return self.fail(format!("could not fetch {}: {e}", c.current)),
        };
        if let Some(step) = follow(&response, &mut c.current, &mut c.redirects) {
            self.stage = Stage::Resource(Box::new(c));
            return step;
        }
        if let Err(e) = redirect_error(&response, &c.current, c.redirects) {
            return self.fail(e);
        }
        match response.status {
            200..=299 => {
                match parse_resource_metadata(&response.body, &c.current, &self.setup.server) {
                    Ok(resource) => {
                        let issuer = resource.issuer.clone();
                        self.server_request(ServerCursor::new(Some(resource), issuer), clocks)
                    }
                    // Not JSON (an HTML catch-all page): as if nothing were there.
                    Err(e) if e.contains("not a JSON object") => {
                        c.last_error = Some(e);
                        self.resource_request(c, clocks)
                    }
                    Err(e) => self.fail(e),
                }
            }
            status => {
                c.last_error = Some(format!("{} answered HTTP {status}", c.current));
                c.all_client_errors &= (400..500).contains(&status);
                self.resource_request(c, clocks)
            }
        }
    }

    /// The next URL of `c`, or the end of the search.
    fn server_request(&mut self, mut c: ServerCursor, clocks: Clocks) -> FlowStep {
        let Some(url) = c.urls.get(c.next).cloned() else {
            return self.server_exhausted(c, clocks);
        };
        c.next += 1;
        c.current = url.clone();
        c.redirects = 0;
        self.stage = Stage::Server(Box::new(c));
        FlowStep::Request(get(url))
    }

    fn server_exhausted(&mut self, c: ServerCursor, clocks: Clocks) -> FlowStep {
        if let Some(e) = c.invalid {
            return self.fail(e);
        }
        if c.resource.is_none() && c.all_client_errors {
            let discovered = Discovered {
                resource: self.setup.server.canonical(),
                resource_scopes: None,
                server: assumed_server_metadata(&self.setup.server),
            };
            self.discovered = Some(discovered);
            return self.after_discovery(clocks);
        }
        self.fail(format!(
            "no authorization server metadata for {} (tried {})",
            c.issuer,
            tried(&c.urls)
        ))
    }

    fn on_server(
        &mut self,
        response: Result<OAuthResponse, String>,
        mut c: ServerCursor,
        clocks: Clocks,
    ) -> FlowStep {
        let response = match response {
            Ok(r) => r,
            Err(e) => return self.fail(format!("could not fetch {}: {e}", c.current)),
        };
        if let Some(step) = follow(&response, &mut c.current, &mut c.redirects) {
            self.stage = Stage::Server(Box::new(c));
            return step;
        }
        if let Err(e) = redirect_error(&response, &c.current, c.redirects) {
            return self.fail(e);
        }
        match response.status {
            200..=299 => match parse_server_metadata(&response.body, &c.current, &c.issuer) {
                Ok(server) => {
                    let discovered = match c.resource {
                        Some(r) => Discovered {
                            resource: r.resource,
                            resource_scopes: r.scopes_supported,
                            server,
                        },
                        None => Discovered {
                            resource: self.setup.server.canonical(),
                            resource_scopes: None,
                            server,
                        },
                    };
                    self.discovered = Some(discovered);
                    self.after_discovery(clocks)
                }
                Err(e) => {
                    // An HTML page is as good as nothing; a JSON document that fails the
                    // checks is remembered (and reported if nothing better is found).
                    if !e.contains("not a JSON object") && c.invalid.is_none() {
                        c.invalid = Some(e);
                    }
                    c.all_client_errors = false;
                    self.server_request(c, clocks)
                }
            },
            status => {
                c.all_client_errors &= (400..500).contains(&status);
                self.server_request(c, clocks)
            }
        }
    }

    fn after_discovery(&mut self, clocks: Clocks) -> FlowStep {
        if let Some((refresh, identity)) = self.setup.refresh.clone() {
            let Some(d) = &self.discovered else {
                return self.fail("internal: no discovery".into());
            };
            let mut form = vec![
                ("grant_type".to_owned(), "refresh_token".to_owned()),
                ("refresh_token".to_owned(), refresh.expose().to_owned()),
                ("resource".to_owned(), d.resource.clone()),
            ];
            return match self.token_request(&identity, &mut form, Some(clocks)) {
                Ok(request) => {
                    self.stage = Stage::Refresh { identity };
                    FlowStep::Request(request)
                }
                Err(_) => self.start_grant(clocks),
            };
        }
        self.start_grant(clocks)
    }

    // ---- grants ----

    fn start_grant(&mut self, clocks: Clocks) -> FlowStep {
        let Some(d) = self.discovered.clone() else {
            return self.fail("internal: no discovery".into());
        };
        let grant = self
            .setup
            .client
            .as_ref()
            .map_or(Grant::AuthorizationCode, |c| c.grant.clone());
        match grant {
            Grant::AuthorizationCode => {
                if d.server.authorization_endpoint.is_none() {
                    return self.fail(format!(
                        "the authorization server {} has no authorization endpoint",
                        d.server.issuer
                    ));
                }
                if !d.server.pkce_s256 {
                    return self.fail(format!(
                        "the authorization server {} does not support PKCE with S256 (code_challenge_methods_supported); refusing to authorize without it",
                        d.server.issuer
                    ));
                }
                if !d.server.offers_grant("authorization_code") {
                    return self.fail(format!(
                        "the authorization server {} does not offer the authorization code grant; configure client_credentials for this server if it is a service",
                        d.server.issuer
                    ));
                }
                let configured = self.setup.client.as_ref().and_then(|c| c.redirect_port);
                let (port, fixed) = match configured.filter(|&p| p != 0) {
                    Some(p) => (p, true),
                    None => match self.registration_port(&d) {
                        Some(p) => (p, false),
                        None => (self.setup.redirect_port, self.setup.redirect_port != 0),
                    },
                };
                self.stage = Stage::Listening { port, fixed };
                FlowStep::Listen { port }
            }
            Grant::ClientCredentials => {
                let identity = match self.configured_identity(&d, "client_credentials") {
                    Ok(i) => i,
                    Err(e) => return self.fail(e),
                };
                if !d.server.offers_grant("client_credentials") {
                    return self.fail(format!(
                        "the authorization server {} does not offer the client_credentials grant",
                        d.server.issuer
                    ));
                }
                let scope = self.select_scope(&d, false);
                let mut form = vec![("grant_type".to_owned(), "client_credentials".to_owned())];
                if let Some(s) = &scope {
                    form.push(("scope".to_owned(), s.clone()));
                }
                form.push(("resource".to_owned(), d.resource.clone()));
                match self.token_request(&identity, &mut form, Some(clocks)) {
                    Ok(request) => {
                        self.stage = Stage::ClientCredentials { identity, scope };
                        FlowStep::Request(request)
                    }
                    Err(e) => self.fail(e),
                }
            }
            Grant::CrossAppAccess(idp) => {
                let identity = match self.configured_identity(&d, "cross-app access") {
                    Ok(i) => i,
                    Err(e) => return self.fail(e),
                };
                let scope = self.select_scope(&d, false);
                let mut form = vec![
                    (
                        "grant_type".to_owned(),
                        "urn:ietf:params:oauth:grant-type:token-exchange".to_owned(),
                    ),
                    ("requested_token_type".to_owned(), tokens::ID_JAG.to_owned()),
                    ("audience".to_owned(), d.server.issuer.canonical()),
                    ("resource".to_owned(), d.resource.clone()),
                ];
                if let Some(s) = &scope {
                    form.push(("scope".to_owned(), s.clone()));
                }
                form.push(("subject_token".to_owned(), idp.id_token.expose().to_owned()));
                form.push((
                    "subject_token_type".to_owned(),
                    "urn:ietf:params:oauth:token-type:id_token".to_owned(),
                ));
                let idp_client = ClientIdentity {
                    client_id: idp.client_id.clone(),
                    method: if idp.client_secret.is_some() {
                        AuthMethod::ClientSecretBasic
                    } else {
                        AuthMethod::None
                    },
                    secret: idp.client_secret.clone(),
                    source: IdentitySource::Configured,
                };
                let auth = match authenticate(
                    &idp_client,
                    &AssertionInputs {
                        key: None,
                        audience: "",
                        now_unix_secs: 0,
                        jti: "",
                    },
                ) {
                    Ok(a) => a,
                    Err(e) => return self.fail(e),
                };
                form.extend(auth.form);
                self.stage = Stage::IdentityExchange { identity, scope };
                FlowStep::Request(post_form(idp.token_endpoint.clone(), &form, auth.headers))
            }
        }
    }

    fn jwt_bearer(
        &mut self,
        identity: ClientIdentity,
        scope: Option<String>,
        grant: &Secret,
        clocks: Clocks,
    ) -> FlowStep {
        let Some(d) = self.discovered.clone() else {
            return self.fail("internal: no discovery".into());
        };
        let mut form = vec![
            (
                "grant_type".to_owned(),
                "urn:ietf:params:oauth:grant-type:jwt-bearer".to_owned(),
            ),
            ("assertion".to_owned(), grant.expose().to_owned()),
            ("resource".to_owned(), d.resource.clone()),
        ];
        if let Some(s) = &scope {
            form.push(("scope".to_owned(), s.clone()));
        }
        match self.token_request(&identity, &mut form, Some(clocks)) {
            Ok(request) => {
                self.stage = Stage::JwtBearer { identity, scope };
                FlowStep::Request(request)
            }
            Err(e) => self.fail(e),
        }
    }

    /// The configured client of a headless grant, with its method.
    fn configured_identity(&self, d: &Discovered, grant: &str) -> Result<ClientIdentity, String> {
        let client = self.setup.client.as_ref();
        let Some(id) = client.and_then(|c| c.client_id.clone()) else {
            return Err(format!(
                "{grant} needs a configured client_id for this server"
            ));
        };
        let secret = client.and_then(|c| c.client_secret.clone());
        let key = client.is_some_and(|c| c.key.is_some());
        let method = client.and_then(|c| c.auth_method).unwrap_or_else(|| {
            choose_method(secret.is_some(), key, &d.server.token_endpoint_auth_methods)
        });
        Ok(ClientIdentity {
            client_id: id,
            secret,
            method,
            source: IdentitySource::Configured,
        })
    }

    /// The port of a registration this flow could reuse.
    fn registration_port(&self, d: &Discovered) -> Option<u16> {
        let r = self.setup.registration.as_ref()?;
        if r.issuer != d.server.issuer.canonical() {
            return None;
        }
        HttpUrl::parse(&r.redirect_uri)
            .ok()
            .map(|u| u.port_or_default())
    }

    /// Configured client → client ID metadata document → a kept registration → a new one.
    fn choose_identity(&mut self, redirect_uri: String) -> FlowStep {
        let Some(d) = self.discovered.clone() else {
            return self.fail("internal: no discovery".into());
        };
        let client = self.setup.client.as_ref();
        if let Some(id) = client.and_then(|c| c.client_id.clone()) {
            let secret = client.and_then(|c| c.client_secret.clone());
            let key = client.is_some_and(|c| c.key.is_some());
            let method = client.and_then(|c| c.auth_method).unwrap_or_else(|| {
                choose_method(secret.is_some(), key, &d.server.token_endpoint_auth_methods)
            });
            let identity = ClientIdentity {
                client_id: id,
                secret,
                method,
                source: IdentitySource::Configured,
            };
            return self.browse(identity, redirect_uri, false);
        }
        let document = client
            .and_then(|c| c.client_metadata_url.clone())
            .or_else(|| self.setup.client_metadata_url.clone());
        if let Some(url) = document.filter(|_| d.server.client_id_metadata_documents) {
            let identity = ClientIdentity {
                client_id: url.as_sent(),
                secret: None,
                method: AuthMethod::None,
                source: IdentitySource::MetadataDocument,
            };
            return self.browse(identity, redirect_uri, false);
        }
        if let Some(r) = self.setup.registration.clone()
            && r.issuer == d.server.issuer.canonical()
            && r.redirect_uri == redirect_uri
        {
            return self.browse(r.identity, redirect_uri, true);
        }
        let Some(endpoint) = d.server.registration_endpoint.clone() else {
            return self.fail(format!(
                "the authorization server {} offers neither client ID metadata documents nor dynamic client registration: configure a client for this server (docs/configuration.md, \"Authorization\")",
                d.server.issuer
            ));
        };
        let method = registration_method(&d.server.token_endpoint_auth_methods);
        let body = json!({
            "client_name": CLIENT_NAME,
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": method.as_str(),
        });
        self.stage = Stage::Registering { redirect_uri };
        FlowStep::Request(OAuthRequest {
            method: Method::Post,
            url: endpoint,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("accept".into(), "application/json".into()),
            ],
            body: body.to_string().into_bytes(),
        })
    }

    /// The client of a registration answer (RFC 7591 §3.2.1).
    fn read_registration(&self, r: &OAuthResponse) -> Result<ClientIdentity, String> {
        if !(200..300).contains(&r.status) {
            let detail = serde_json::from_slice::<Value>(&r.body)
                .ok()
                .and_then(|v| {
                    v.get("error")
                        .and_then(Value::as_str)
                        .map(quote_for_message)
                })
                .map_or_else(String::new, |e| format!(": {e}"));
            return Err(format!(
                "the client registration was refused (HTTP {}{detail})",
                r.status
            ));
        }
        let doc: Value = serde_json::from_slice(&r.body)
            .map_err(|_| "the client registration answer is not JSON".to_owned())?;
        let id = doc
            .get("client_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or("the client registration answer has no client_id")?;
        let secret = doc
            .get("client_secret")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(Secret::new);
        let supported = self
            .discovered
            .as_ref()
            .map(|d| d.server.token_endpoint_auth_methods.clone())
            .unwrap_or_default();
        let method = match doc
            .get("token_endpoint_auth_method")
            .and_then(Value::as_str)
        {
            Some(name) => AuthMethod::parse(name).ok_or_else(|| {
                format!(
                    "the client was registered for {}, which buzz-agent cannot use",
                    quote_for_message(name)
                )
            })?,
            None => choose_method(secret.is_some(), false, &supported),
        };
        Ok(ClientIdentity {
            client_id: id.to_owned(),
            secret,
            method,
            source: IdentitySource::Registered,
        })
    }

    /// The authorization request, for the user to open.
    fn browse(
        &mut self,
        identity: ClientIdentity,
        redirect_uri: String,
        registered: bool,
    ) -> FlowStep {
        let Some(d) = self.discovered.clone() else {
            return self.fail("internal: no discovery".into());
        };
        let Some(endpoint) = d.server.authorization_endpoint.clone() else {
            return self.fail("internal: no authorization endpoint".into());
        };
        let scope = self.select_scope(&d, true);
        let state = self.setup.rng.token();
        let pkce = self.setup.rng.pkce();
        let mut pairs = vec![
            ("response_type", "code"),
            ("client_id", identity.client_id.as_str()),
            ("redirect_uri", redirect_uri.as_str()),
            ("code_challenge", pkce.challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("state", state.as_str()),
            ("resource", d.resource.as_str()),
        ];
        if let Some(s) = &scope {
            pairs.push(("scope", s.as_str()));
        }
        let url = endpoint.with_query_pairs(pairs).as_sent();
        self.stage = Stage::Browsing {
            state,
            pkce,
            redirect_uri,
            identity,
            registered,
            scope,
        };
        FlowStep::Browse { url }
    }

    /// The scopes to ask for (MCP "Scope Selection Strategy"): the configured ones, else the
    /// challenge's, else the resource's `scopes_supported`, else none; plus the ones granted
    /// before (a step-up keeps them); plus `offline_access` for a user's grant when the
    /// authorization server lists it (SEP-2207: only when offered).
    fn select_scope(&self, d: &Discovered, users_grant: bool) -> Option<String> {
        let configured = self.setup.client.as_ref().and_then(|c| c.scope.clone());
        let base = configured
            .or_else(|| self.setup.challenge.scope.clone())
            .or_else(|| d.resource_scopes.as_ref().map(|s| s.join(" ")))
            .unwrap_or_default();
        let mut scopes: Vec<String> = Vec::new();
        let extra = self.setup.extra_scope.clone().unwrap_or_default();
        for s in extra.split_whitespace().chain(base.split_whitespace()) {
            if !scopes.iter().any(|x| x == s) {
                scopes.push(s.to_owned());
            }
        }
        if users_grant
            && d.server.offers_scope("offline_access")
            && !scopes.iter().any(|x| x == "offline_access")
        {
            scopes.push("offline_access".to_owned());
        }
        (!scopes.is_empty()).then(|| scopes.join(" "))
    }

    /// A token request to the authorization server by `identity` with `form`.
    fn token_request(
        &mut self,
        identity: &ClientIdentity,
        form: &mut Vec<(String, String)>,
        clocks: Option<Clocks>,
    ) -> Result<OAuthRequest, String> {
        let Some(d) = self.discovered.clone() else {
            return Err("internal: no discovery".into());
        };
        let jti = self.setup.rng.token();
        let key = self.setup.client.as_ref().and_then(|c| c.key.as_ref());
        let audience = d.server.issuer.canonical();
        let auth = authenticate(
            identity,
            &AssertionInputs {
                key,
                audience: &audience,
                now_unix_secs: clocks.map_or(0, |c| c.unix_ms / 1000),
                jti: &jti,
            },
        )?;
        form.extend(auth.form);
        Ok(post_form(
            d.server.token_endpoint.clone(),
            form,
            auth.headers,
        ))
    }

    fn token_answer(
        &mut self,
        response: Result<OAuthResponse, String>,
        identity: ClientIdentity,
        redirect_uri: Option<String>,
        scope: Option<String>,
        clocks: Clocks,
    ) -> FlowStep {
        match post_answer(response, "token endpoint").and_then(|r| {
            tokens::parse_token_response(r.status, &r.body, scope.as_deref(), clocks)
                .map_err(|e| e.message)
        }) {
            Ok(t) => self.finish_ok(t, identity, redirect_uri, scope),
            Err(e) => self.fail(e),
        }
    }

    fn finish_ok(
        &mut self,
        tokens: TokenSet,
        identity: ClientIdentity,
        redirect_uri: Option<String>,
        requested_scope: Option<String>,
    ) -> FlowStep {
        self.stage = Stage::Done;
        match self.discovered.clone() {
            Some(discovered) => FlowStep::Finished(Ok(Box::new(Obtained {
                tokens,
                identity,
                redirect_uri,
                discovered,
                requested_scope,
            }))),
            None => FlowStep::Finished(Err("internal: no discovery".into())),
        }
    }

    fn fail(&mut self, reason: String) -> FlowStep {
        self.stage = Stage::Done;
        FlowStep::Finished(Err(reason))
    }
}

/// A redirect of a metadata GET, followed: the next request, with `current` and the count
/// updated. `None` when `response` is not a redirect that may be followed (not one, too many,
/// https to http off loopback, no usable `Location`).
fn follow(response: &OAuthResponse, current: &mut HttpUrl, redirects: &mut u8) -> Option<FlowStep> {
    if !matches!(response.status, 301 | 302 | 303 | 307 | 308) || *redirects >= MAX_REDIRECTS {
        return None;
    }
    let target = current.join(response.header("location")?).ok()?;
    if current.is_https() && !target.is_https() && !target.is_loopback() {
        return None;
    }
    *redirects += 1;
    *current = target.clone();
    Some(FlowStep::Request(get(target)))
}

/// The error for a redirect that was not followed (too many, a downgrade, no usable
/// `Location`); `Ok` for any other answer.
fn redirect_error(
    response: &OAuthResponse,
    current: &HttpUrl,
    redirects: u8,
) -> Result<(), String> {
    if !(300..400).contains(&response.status) || response.status == 304 {
        return Ok(());
    }
    if redirects >= MAX_REDIRECTS {
        return Err(format!(
            "{current} is a redirect loop (more than {MAX_REDIRECTS} redirects)"
        ));
    }
    match response.header("location").map(|l| current.join(l)) {
        Some(Ok(t)) if current.is_https() && !t.is_https() => {
            Err(format!("{current} redirects from https to {t} (refused)"))
        }
        Some(Ok(_) | Err(_)) | None => Err(format!(
            "{current} answered HTTP {} without a usable Location",
            response.status
        )),
    }
}

/// The URLs of a search, for a message.
fn tried(urls: &[HttpUrl]) -> String {
    urls.iter()
        .map(HttpUrl::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The position of a protected resource metadata search.
#[derive(Debug)]
struct ResourceCursor {
    urls: Vec<HttpUrl>,
    next: usize,
    current: HttpUrl,
    redirects: u8,
    all_client_errors: bool,
    from_header: bool,
    last_error: Option<String>,
}

/// The position of an authorization server metadata search.
#[derive(Debug)]
struct ServerCursor {
    resource: Option<ResourceMetadata>,
    issuer: HttpUrl,
    urls: Vec<HttpUrl>,
    next: usize,
    current: HttpUrl,
    redirects: u8,
    all_client_errors: bool,
    invalid: Option<String>,
}

impl ServerCursor {
    /// The search for `issuer`'s metadata, from the first URL of the spec's order.
    fn new(resource: Option<ResourceMetadata>, issuer: HttpUrl) -> ServerCursor {
        ServerCursor {
            urls: server_metadata_urls(&issuer),
            current: issuer.clone(),
            resource,
            issuer,
            next: 0,
            redirects: 0,
            all_client_errors: true,
            invalid: None,
        }
    }
}

/// A metadata GET.
fn get(url: HttpUrl) -> OAuthRequest {
    OAuthRequest {
        method: Method::Get,
        url,
        headers: vec![("accept".into(), "application/json".into())],
        body: Vec::new(),
    }
}

/// A form POST with `extra` headers (client authentication).
fn post_form(
    url: HttpUrl,
    form: &[(String, String)],
    extra: Vec<(String, String)>,
) -> OAuthRequest {
    let mut headers = vec![
        (
            "content-type".to_owned(),
            "application/x-www-form-urlencoded".to_owned(),
        ),
        ("accept".to_owned(), "application/json".to_owned()),
    ];
    headers.extend(extra);
    OAuthRequest {
        method: Method::Post,
        url,
        headers,
        body: form_encode(form.iter().map(|(k, v)| (k.as_str(), v.as_str()))).into_bytes(),
    }
}

/// The answer to a POST, or the sentence for no answer and for a redirect (never followed: the
/// request carries credentials, SPEC S2).
fn post_answer(
    response: Result<OAuthResponse, String>,
    what: &str,
) -> Result<OAuthResponse, String> {
    let r = response.map_err(|e| format!("could not reach the {what}: {e}"))?;
    if (300..400).contains(&r.status) && r.status != 304 {
        return Err(format!(
            "the {what} answered with a redirect (HTTP {}), which is not followed for a request carrying credentials",
            r.status
        ));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::client::IdentityProvider;
    use crate::time::MonoTime;
    use crate::url::form_decode;
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde_json::json;

    const CLOCKS: Clocks = Clocks {
        now: MonoTime(std::time::Duration::from_secs(1)),
        unix_ms: 1_700_000_000_000,
    };
    const MCP: &str = "http://localhost:3000/mcp";
    const AS: &str = "http://localhost:4000";

    fn url(s: &str) -> HttpUrl {
        HttpUrl::parse(s).unwrap()
    }

    fn setup(challenge: BearerChallenge) -> FlowSetup {
        FlowSetup {
            server: url(MCP),
            challenge,
            client: None,
            client_metadata_url: None,
            redirect_port: 0,
            discovered: None,
            refresh: None,
            registration: None,
            extra_scope: None,
            rng: SecretRng::new([9; 32]),
        }
    }

    fn header_challenge() -> BearerChallenge {
        BearerChallenge {
            resource_metadata: Some(
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp".to_owned(),
            ),
            ..BearerChallenge::default()
        }
    }

    fn ok(body: Value) -> Result<OAuthResponse, String> {
        Ok(OAuthResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
        })
    }

    fn status(code: u16) -> Result<OAuthResponse, String> {
        Ok(OAuthResponse {
            status: code,
            headers: Vec::new(),
            body: b"Not Found".to_vec(),
        })
    }

    fn redirect(code: u16, location: &str) -> Result<OAuthResponse, String> {
        Ok(OAuthResponse {
            status: code,
            headers: vec![("location".into(), location.into())],
            body: Vec::new(),
        })
    }

    fn prm(resource: &str, scopes: Option<Vec<&str>>) -> Value {
        let mut v = json!({"resource": resource, "authorization_servers": [AS]});
        if let Some(s) = scopes {
            v["scopes_supported"] = json!(s);
        }
        v
    }

    fn as_metadata(issuer: &str) -> Value {
        json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
            "registration_endpoint": format!("{issuer}/register"),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
        })
    }

    fn token_ok() -> Result<OAuthResponse, String> {
        ok(
            json!({"access_token": "test-token-1", "token_type": "Bearer", "expires_in": 3600, "refresh_token": "r1"}),
        )
    }

    fn form(r: &OAuthRequest) -> Vec<(String, String)> {
        form_decode(std::str::from_utf8(&r.body).unwrap())
    }

    fn field(pairs: &[(String, String)], name: &str) -> Option<String> {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// What a driven flow did.
    struct Run {
        result: Result<Box<Obtained>, String>,
        requests: Vec<OAuthRequest>,
        browsed: Vec<String>,
    }

    impl Run {
        fn urls(&self) -> Vec<String> {
            self.requests
                .iter()
                .map(|r| format!("{:?} {}", r.method, r.url.as_sent()))
                .collect()
        }

        fn authorize_query(&self) -> Vec<(String, String)> {
            let u = url(self.browsed.last().unwrap());
            form_decode(u.query().unwrap_or(""))
        }

        fn last_to(&self, suffix: &str) -> &OAuthRequest {
            self.requests
                .iter()
                .rev()
                .find(|r| r.url.as_sent().ends_with(suffix))
                .unwrap()
        }
    }

    /// Drives a flow to its end: `server` answers each request; the "browser" follows the
    /// authorization URL to the redirect with `code=c1` and the state it was given.
    fn drive(
        setup: FlowSetup,
        mut server: impl FnMut(&OAuthRequest) -> Result<OAuthResponse, String>,
    ) -> Run {
        let (mut flow, mut step) = Flow::start(setup, CLOCKS);
        let mut requests = Vec::new();
        let mut browsed = Vec::new();
        for _ in 0..50 {
            step = match step {
                FlowStep::Request(r) => {
                    let answer = server(&r);
                    requests.push(r);
                    flow.on_response(answer, CLOCKS)
                }
                FlowStep::Listen { port } => {
                    flow.on_listening(Ok(if port == 0 { 50123 } else { port }))
                }
                FlowStep::Browse { url: u } => {
                    let q = form_decode(url(&u).query().unwrap_or(""));
                    let state = field(&q, "state").unwrap();
                    assert_eq!(field(&q, "redirect_uri").as_deref(), flow.redirect_uri());
                    assert!(flow.waits_for_user());
                    browsed.push(u);
                    let (page, next) = flow.on_callback(
                        &[("code".into(), "c1".into()), ("state".into(), state)],
                        CLOCKS,
                    );
                    assert_eq!(page, CallbackPage::Received);
                    next
                }
                FlowStep::Wait => panic!("the flow waits for nothing"),
                FlowStep::Finished(result) => {
                    return Run {
                        result,
                        requests,
                        browsed,
                    };
                }
            };
        }
        panic!("the flow did not finish in 50 steps");
    }

    /// The conformance suite's shape: MCP server on :3000, authorization server on :4000.
    fn standard(r: &OAuthRequest) -> Result<OAuthResponse, String> {
        match (r.method, r.url.as_sent().as_str()) {
            (Method::Get, "http://localhost:3000/.well-known/oauth-protected-resource/mcp") => {
                ok(prm(MCP, None))
            }
            (Method::Get, "http://localhost:4000/.well-known/oauth-authorization-server") => {
                ok(as_metadata(AS))
            }
            (Method::Post, "http://localhost:4000/register") => Ok(OAuthResponse {
                status: 201,
                headers: Vec::new(),
                body: json!({"client_id": "dcr-client", "token_endpoint_auth_method": "none"})
                    .to_string()
                    .into_bytes(),
            }),
            (Method::Post, "http://localhost:4000/token") => token_ok(),
            _ => status(404),
        }
    }

    #[test]
    fn the_default_flow_discovers_registers_authorizes_with_pkce_and_exchanges_the_code() {
        let run = drive(setup(header_challenge()), standard);
        let got = run.result.as_ref().unwrap();
        assert_eq!(got.tokens.access_token.expose(), "test-token-1");
        assert_eq!(got.identity.source, IdentitySource::Registered);
        assert_eq!(
            got.redirect_uri.as_deref(),
            Some("http://127.0.0.1:50123/callback")
        );
        assert_eq!(
            run.urls(),
            [
                "Get http://localhost:3000/.well-known/oauth-protected-resource/mcp",
                "Get http://localhost:4000/.well-known/oauth-authorization-server",
                "Post http://localhost:4000/register",
                "Post http://localhost:4000/token",
            ]
        );
        let registration: Value = serde_json::from_slice(&run.requests[2].body).unwrap();
        assert_eq!(
            registration["redirect_uris"],
            json!(["http://127.0.0.1:50123/callback"])
        );
        assert_eq!(
            registration["grant_types"],
            json!(["authorization_code", "refresh_token"])
        );
        assert_eq!(registration["token_endpoint_auth_method"], "none");
        let q = run.authorize_query();
        assert_eq!(field(&q, "response_type").as_deref(), Some("code"));
        assert_eq!(field(&q, "client_id").as_deref(), Some("dcr-client"));
        assert_eq!(field(&q, "code_challenge_method").as_deref(), Some("S256"));
        assert_eq!(field(&q, "resource").as_deref(), Some(MCP));
        assert_eq!(field(&q, "scope"), None, "no scope anywhere: omitted");
        let token = form(run.last_to("/token"));
        assert_eq!(
            field(&token, "grant_type").as_deref(),
            Some("authorization_code")
        );
        assert_eq!(field(&token, "code").as_deref(), Some("c1"));
        assert_eq!(field(&token, "resource").as_deref(), Some(MCP));
        assert_eq!(field(&token, "client_id").as_deref(), Some("dcr-client"));
        let verifier = field(&token, "code_verifier").unwrap();
        assert_eq!(
            field(&q, "code_challenge").unwrap(),
            super::super::secrets::b64url(&super::super::secrets::sha256(verifier.as_bytes()))
        );
    }

    #[test]
    fn without_the_header_the_path_well_known_then_openid_configuration_are_used() {
        let run = drive(setup(BearerChallenge::default()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    ok(prm(MCP, None))
                }
                "http://localhost:4000/.well-known/oauth-authorization-server" => status(404),
                "http://localhost:4000/.well-known/openid-configuration" => ok(as_metadata(AS)),
                _ => standard(r),
            }
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert_eq!(
            run.urls()[1],
            "Get http://localhost:4000/.well-known/oauth-authorization-server"
        );
        assert_eq!(
            run.urls()[2],
            "Get http://localhost:4000/.well-known/openid-configuration"
        );
    }

    #[test]
    fn root_metadata_names_the_origin_and_a_tenant_issuer_is_found_by_path_insertion() {
        let tenant = "http://localhost:4000/tenant1";
        let run = drive(setup(BearerChallenge::default()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => status(404),
                "http://localhost:3000/.well-known/oauth-protected-resource" => ok(
                    json!({"resource": "http://localhost:3000", "authorization_servers": [tenant]}),
                ),
                "http://localhost:4000/.well-known/oauth-authorization-server/tenant1" => {
                    ok(as_metadata(tenant))
                }
                "http://localhost:4000/tenant1/register" => standard(&OAuthRequest {
                    url: url("http://localhost:4000/register"),
                    ..r.clone()
                }),
                "http://localhost:4000/tenant1/token" => token_ok(),
                _ => status(404),
            }
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert!(
            !run.urls()
                .iter()
                .any(|u| u.ends_with("4000/.well-known/oauth-authorization-server")),
            "{:?}",
            run.urls()
        );
        assert_eq!(
            field(&run.authorize_query(), "resource").as_deref(),
            Some("http://localhost:3000")
        );
    }

    #[test]
    fn a_custom_metadata_url_and_appended_openid_discovery_are_followed() {
        let tenant = "http://localhost:4000/tenant1";
        let mut challenge = header_challenge();
        challenge.resource_metadata =
            Some("http://localhost:3000/custom/metadata/location.json".into());
        let run = drive(setup(challenge), |r| match r.url.as_sent().as_str() {
            "http://localhost:3000/custom/metadata/location.json" => {
                ok(json!({"resource": MCP, "authorization_servers": [tenant]}))
            }
            "http://localhost:4000/tenant1/.well-known/openid-configuration" => {
                ok(as_metadata(tenant))
            }
            "http://localhost:4000/tenant1/register" => standard(&OAuthRequest {
                url: url("http://localhost:4000/register"),
                ..r.clone()
            }),
            "http://localhost:4000/tenant1/token" => token_ok(),
            _ => status(404),
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert_eq!(
            run.urls()[..4],
            [
                "Get http://localhost:3000/custom/metadata/location.json",
                "Get http://localhost:4000/.well-known/oauth-authorization-server/tenant1",
                "Get http://localhost:4000/.well-known/openid-configuration/tenant1",
                "Get http://localhost:4000/tenant1/.well-known/openid-configuration",
            ]
        );
    }

    #[test]
    fn with_no_metadata_anywhere_the_2025_03_26_endpoints_are_assumed() {
        let run = drive(setup(BearerChallenge::default()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/register" => Ok(OAuthResponse {
                    status: 201,
                    headers: Vec::new(),
                    body: json!({"client_id": "c", "client_secret": "s"})
                        .to_string()
                        .into_bytes(),
                }),
                "http://localhost:3000/token" => token_ok(),
                _ => status(404),
            }
        });
        let got = run.result.clone().unwrap();
        assert_eq!(got.discovered.resource, MCP);
        assert!(got.discovered.server.assumed);
        let urls = run.urls();
        assert_eq!(
            urls[2],
            "Get http://localhost:3000/.well-known/oauth-authorization-server"
        );
        assert_eq!(
            urls[3],
            "Get http://localhost:3000/.well-known/openid-configuration"
        );
        assert!(run.browsed[0].starts_with("http://localhost:3000/authorize?"));
        // A registered secret without a method: client_secret_basic, RFC 8414's default.
        let token = run.last_to("/token");
        assert!(
            token
                .headers
                .iter()
                .any(|(k, v)| k == "authorization" && v.starts_with("Basic "))
        );
    }

    #[test]
    fn the_back_compat_fixture_s_sub_path_issuer_is_refused() {
        let run = drive(setup(BearerChallenge::default()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-authorization-server" => {
                    ok(as_metadata("http://localhost:3000/oauth"))
                }
                _ => status(404),
            }
        });
        let e = run.result.unwrap_err();
        assert!(
            e.contains("http://localhost:3000/oauth") && e.contains("8414"),
            "{e}"
        );
        assert!(run.browsed.is_empty());
    }

    #[test]
    fn a_resource_for_another_origin_stops_the_flow_before_any_authorization() {
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    ok(prm("https://evil.example.com/mcp", None))
                }
                _ => standard(r),
            }
        });
        assert!(run.result.unwrap_err().contains("evil.example.com"));
        assert_eq!(run.requests.len(), 1);
        assert!(run.browsed.is_empty());
    }

    #[test]
    fn scope_comes_from_the_challenge_else_scopes_supported_plus_offered_offline_access() {
        let mut challenge = header_challenge();
        challenge.scope = Some("mcp:basic".into());
        let run = drive(setup(challenge), |r| match r.url.as_sent().as_str() {
            "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                ok(prm(MCP, Some(vec!["a", "b"])))
            }
            _ => standard(r),
        });
        assert_eq!(
            field(&run.authorize_query(), "scope").as_deref(),
            Some("mcp:basic")
        );

        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    ok(prm(MCP, Some(vec!["mcp:basic", "mcp:read", "mcp:write"])))
                }
                _ => standard(r),
            }
        });
        assert_eq!(
            field(&run.authorize_query(), "scope").as_deref(),
            Some("mcp:basic mcp:read mcp:write")
        );
        assert_eq!(
            run.result.unwrap().requested_scope.as_deref(),
            Some("mcp:basic mcp:read mcp:write")
        );

        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    ok(prm(MCP, Some(vec!["mcp:basic"])))
                }
                "http://localhost:4000/.well-known/oauth-authorization-server" => {
                    let mut m = as_metadata(AS);
                    m["scopes_supported"] = json!(["mcp:basic", "offline_access"]);
                    ok(m)
                }
                _ => standard(r),
            }
        });
        assert_eq!(
            field(&run.authorize_query(), "scope").as_deref(),
            Some("mcp:basic offline_access")
        );
    }

    #[test]
    fn a_step_up_keeps_the_scopes_granted_before() {
        let mut challenge = header_challenge();
        challenge.scope = Some("mcp:basic mcp:write".into());
        let mut s = setup(challenge);
        s.extra_scope = Some("mcp:basic old:scope".into());
        let run = drive(s, standard);
        assert_eq!(
            field(&run.authorize_query(), "scope").as_deref(),
            Some("mcp:basic old:scope mcp:write")
        );
    }

    fn dcr_answering(
        method: &'static str,
        secret: Option<&'static str>,
    ) -> impl FnMut(&OAuthRequest) -> Result<OAuthResponse, String> {
        move |r: &OAuthRequest| match r.url.as_sent().as_str() {
            "http://localhost:4000/.well-known/oauth-authorization-server" => {
                let mut m = as_metadata(AS);
                m["token_endpoint_auth_methods_supported"] = json!([method]);
                ok(m)
            }
            "http://localhost:4000/register" => {
                let requested: Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(requested["token_endpoint_auth_method"], method);
                let mut answer = json!({"client_id": "cid", "token_endpoint_auth_method": method});
                if let Some(s) = secret {
                    answer["client_secret"] = json!(s);
                }
                Ok(OAuthResponse {
                    status: 201,
                    headers: Vec::new(),
                    body: answer.to_string().into_bytes(),
                })
            }
            _ => standard(r),
        }
    }

    #[test]
    fn the_token_endpoint_auth_method_is_the_one_the_server_registered() {
        let run = drive(
            setup(header_challenge()),
            dcr_answering("client_secret_basic", Some("sec")),
        );
        let token = run.last_to("/token");
        let basic = token
            .headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .unwrap();
        let decoded = STANDARD
            .decode(basic.1.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(decoded, b"cid:sec");
        assert_eq!(field(&form(token), "client_secret"), None);

        let run = drive(
            setup(header_challenge()),
            dcr_answering("client_secret_post", Some("sec")),
        );
        let token = run.last_to("/token");
        assert!(!token.headers.iter().any(|(k, _)| k == "authorization"));
        assert_eq!(field(&form(token), "client_secret").as_deref(), Some("sec"));
        assert_eq!(field(&form(token), "client_id").as_deref(), Some("cid"));

        let run = drive(setup(header_challenge()), dcr_answering("none", None));
        let token = run.last_to("/token");
        assert!(!token.headers.iter().any(|(k, _)| k == "authorization"));
        assert_eq!(field(&form(token), "client_secret"), None);
        assert_eq!(field(&form(token), "client_id").as_deref(), Some("cid"));
    }

    #[test]
    fn a_configured_client_is_used_before_metadata_documents_and_registration() {
        let mut s = setup(header_challenge());
        let mut client = ClientConfig::with_grant(Grant::AuthorizationCode);
        client.client_id = Some("pre-registered-client".into());
        client.client_secret = Some(Secret::new("pre-registered-secret"));
        s.client = Some(client);
        s.client_metadata_url = Some(url("https://conformance-test.local/client-metadata.json"));
        let run = drive(s, |r| match r.url.as_sent().as_str() {
            "http://localhost:4000/.well-known/oauth-authorization-server" => {
                let mut m = as_metadata(AS);
                m.as_object_mut().unwrap().remove("registration_endpoint");
                m["token_endpoint_auth_methods_supported"] = json!(["client_secret_basic"]);
                m["client_id_metadata_document_supported"] = json!(true);
                ok(m)
            }
            _ => standard(r),
        });
        assert_eq!(
            run.result.as_ref().unwrap().identity.source,
            IdentitySource::Configured
        );
        assert!(!run.urls().iter().any(|u| u.ends_with("/register")));
        let basic = run
            .last_to("/token")
            .headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .unwrap()
            .1
            .clone();
        assert_eq!(
            STANDARD.decode(&basic[6..]).unwrap(),
            b"pre-registered-client:pre-registered-secret"
        );
    }

    #[test]
    fn a_metadata_document_url_is_the_client_id_where_the_server_supports_it() {
        let mut s = setup(header_challenge());
        s.client_metadata_url = Some(url("https://conformance-test.local/client-metadata.json"));
        let with_cimd = |r: &OAuthRequest| match r.url.as_sent().as_str() {
            "http://localhost:4000/.well-known/oauth-authorization-server" => {
                let mut m = as_metadata(AS);
                m["client_id_metadata_document_supported"] = json!(true);
                ok(m)
            }
            _ => standard(r),
        };
        let run = drive(s.clone(), with_cimd);
        assert_eq!(
            field(&run.authorize_query(), "client_id").as_deref(),
            Some("https://conformance-test.local/client-metadata.json")
        );
        assert!(!run.urls().iter().any(|u| u.ends_with("/register")));
        // Without the server's support, registration.
        let run = drive(s, standard);
        assert!(run.urls().iter().any(|u| u.ends_with("/register")));
    }

    #[test]
    fn a_kept_registration_is_reused_on_its_port() {
        let mut s = setup(header_challenge());
        s.registration = Some(Registration {
            issuer: AS.into(),
            redirect_uri: "http://127.0.0.1:41000/callback".into(),
            identity: ClientIdentity {
                client_id: "kept".into(),
                secret: None,
                method: AuthMethod::None,
                source: IdentitySource::Registered,
            },
        });
        let run = drive(s.clone(), standard);
        assert!(!run.urls().iter().any(|u| u.ends_with("/register")));
        assert_eq!(
            field(&run.authorize_query(), "client_id").as_deref(),
            Some("kept")
        );
        // The port is taken now: any port, and a new registration.
        let (mut flow, step) = Flow::start(s, CLOCKS);
        let mut step = step;
        for _ in 0..2 {
            let FlowStep::Request(r) = step else {
                panic!("{step:?}")
            };
            step = flow.on_response(standard(&r), CLOCKS);
        }
        assert_eq!(step, FlowStep::Listen { port: 41000 });
        assert_eq!(
            flow.on_listening(Err("Address in use".into())),
            FlowStep::Listen { port: 0 }
        );
        let FlowStep::Request(r) = flow.on_listening(Ok(50000)) else {
            panic!()
        };
        assert!(r.url.as_sent().ends_with("/register"));
    }

    #[test]
    fn without_pkce_s256_or_any_registration_the_flow_refuses() {
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:4000/.well-known/oauth-authorization-server" => {
                    let mut m = as_metadata(AS);
                    m.as_object_mut()
                        .unwrap()
                        .remove("code_challenge_methods_supported");
                    ok(m)
                }
                _ => standard(r),
            }
        });
        assert!(run.result.unwrap_err().contains("PKCE"));
        assert!(run.browsed.is_empty());
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:4000/.well-known/oauth-authorization-server" => {
                    let mut m = as_metadata(AS);
                    m.as_object_mut().unwrap().remove("registration_endpoint");
                    ok(m)
                }
                _ => standard(r),
            }
        });
        assert!(run.result.unwrap_err().contains("configure a client"));
    }

    fn headless(grant: Grant, id: &str) -> FlowSetup {
        let mut s = setup(BearerChallenge::default());
        let mut client = ClientConfig::with_grant(grant);
        client.client_id = Some(id.into());
        s.client = Some(client);
        s
    }

    #[test]
    fn client_credentials_with_a_secret_uses_basic_and_no_browser() {
        let mut s = headless(Grant::ClientCredentials, "conformance-test-client");
        s.client.as_mut().unwrap().client_secret = Some(Secret::new("conformance-test-secret"));
        let run = drive(s, |r| match r.url.as_sent().as_str() {
            "http://localhost:4000/.well-known/oauth-authorization-server" => {
                let mut m = as_metadata(AS);
                m["grant_types_supported"] = json!(["client_credentials"]);
                m["token_endpoint_auth_methods_supported"] = json!(["client_secret_basic"]);
                ok(m)
            }
            _ => standard(r),
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert!(run.browsed.is_empty());
        let token = run.last_to("/token");
        assert_eq!(
            field(&form(token), "grant_type").as_deref(),
            Some("client_credentials")
        );
        assert_eq!(field(&form(token), "resource").as_deref(), Some(MCP));
        assert!(
            token
                .headers
                .iter()
                .any(|(k, v)| k == "authorization" && v.starts_with("Basic "))
        );
    }

    #[test]
    fn client_credentials_with_a_key_signs_an_assertion_for_the_issuer() {
        let mut s = headless(Grant::ClientCredentials, "conformance-test-client");
        s.client.as_mut().unwrap().key = Some(
            super::super::jwt::Es256Key::from_pem(super::super::jwt::tests::TEST_KEY_PKCS8)
                .unwrap(),
        );
        let run = drive(s, |r| match r.url.as_sent().as_str() {
            "http://localhost:4000/.well-known/oauth-authorization-server" => {
                let mut m = as_metadata(AS);
                m["grant_types_supported"] = json!(["client_credentials"]);
                m["token_endpoint_auth_methods_supported"] = json!(["private_key_jwt"]);
                ok(m)
            }
            _ => standard(r),
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        let token = form(run.last_to("/token"));
        assert_eq!(
            field(&token, "client_assertion_type").as_deref(),
            Some(super::super::jwt::JWT_BEARER_ASSERTION)
        );
        let jwt = field(&token, "client_assertion").unwrap();
        let claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(jwt.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["aud"], AS);
        assert_eq!(claims["iss"], "conformance-test-client");
        assert_eq!(claims["iat"], CLOCKS.unix_ms / 1000);
    }

    #[test]
    fn a_grant_the_server_does_not_offer_and_a_missing_client_id_are_refused() {
        let mut s = headless(Grant::ClientCredentials, "c");
        s.client.as_mut().unwrap().client_secret = Some(Secret::new("s"));
        let run = drive(s, standard);
        assert!(
            run.result
                .unwrap_err()
                .contains("does not offer the client_credentials grant")
        );
        let mut s = setup(BearerChallenge::default());
        s.client = Some(ClientConfig::with_grant(Grant::ClientCredentials));
        let run = drive(s, standard);
        assert!(run.result.unwrap_err().contains("client_id"));
    }

    #[test]
    fn cross_app_access_exchanges_the_id_token_at_the_idp_then_presents_the_grant() {
        let idp = IdentityProvider {
            token_endpoint: url("http://localhost:5000/token"),
            client_id: "conformance-test-idp-client".into(),
            client_secret: None,
            id_token: Secret::new("id-token-jwt"),
        };
        let mut s = headless(Grant::CrossAppAccess(idp), "conformance-test-xaa-client");
        s.client.as_mut().unwrap().client_secret = Some(Secret::new("conformance-test-xaa-secret"));
        let run = drive(s, |r| match r.url.as_sent().as_str() {
            "http://localhost:5000/token" => {
                let f = form(r);
                assert_eq!(
                    field(&f, "grant_type").as_deref(),
                    Some("urn:ietf:params:oauth:grant-type:token-exchange")
                );
                assert_eq!(field(&f, "subject_token").as_deref(), Some("id-token-jwt"));
                assert_eq!(
                    field(&f, "subject_token_type").as_deref(),
                    Some("urn:ietf:params:oauth:token-type:id_token")
                );
                assert_eq!(
                    field(&f, "requested_token_type").as_deref(),
                    Some(tokens::ID_JAG)
                );
                assert_eq!(field(&f, "audience").as_deref(), Some(AS));
                assert_eq!(field(&f, "resource").as_deref(), Some(MCP));
                assert_eq!(
                    field(&f, "client_id").as_deref(),
                    Some("conformance-test-idp-client")
                );
                ok(
                    json!({"access_token": "the-id-jag", "issued_token_type": tokens::ID_JAG, "token_type": "N_A"}),
                )
            }
            "http://localhost:4000/.well-known/oauth-authorization-server" => {
                let mut m = as_metadata(AS);
                m["grant_types_supported"] = json!(["urn:ietf:params:oauth:grant-type:jwt-bearer"]);
                m["token_endpoint_auth_methods_supported"] = json!(["client_secret_basic"]);
                ok(m)
            }
            "http://localhost:4000/token" => {
                let f = form(r);
                assert_eq!(
                    field(&f, "grant_type").as_deref(),
                    Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
                );
                assert_eq!(field(&f, "assertion").as_deref(), Some("the-id-jag"));
                assert!(
                    r.headers
                        .iter()
                        .any(|(k, v)| k == "authorization" && v.starts_with("Basic "))
                );
                token_ok()
            }
            _ => standard(r),
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert!(run.browsed.is_empty());
    }

    fn discovered() -> Discovered {
        let m = parse_server_metadata(
            as_metadata(AS).to_string().as_bytes(),
            &url("http://localhost:4000/.well-known/oauth-authorization-server"),
            &url(AS),
        )
        .unwrap();
        Discovered {
            resource: MCP.into(),
            resource_scopes: None,
            server: m,
        }
    }

    fn public(id: &str) -> ClientIdentity {
        ClientIdentity {
            client_id: id.into(),
            secret: None,
            method: AuthMethod::None,
            source: IdentitySource::Registered,
        }
    }

    #[test]
    fn a_refresh_token_is_tried_first_and_kept_when_the_answer_omits_it() {
        let mut s = setup(BearerChallenge::default());
        s.discovered = Some(discovered());
        s.refresh = Some((Secret::new("old-refresh"), public("cid")));
        let run = drive(s, |r| {
            let f = form(r);
            assert_eq!(field(&f, "grant_type").as_deref(), Some("refresh_token"));
            assert_eq!(field(&f, "refresh_token").as_deref(), Some("old-refresh"));
            assert_eq!(field(&f, "resource").as_deref(), Some(MCP));
            ok(json!({"access_token": "fresh", "token_type": "Bearer"}))
        });
        let got = run.result.unwrap();
        assert_eq!(got.tokens.access_token.expose(), "fresh");
        assert_eq!(got.tokens.refresh_token.unwrap().expose(), "old-refresh");
        assert_eq!(run.requests.len(), 1, "no discovery: it was reused");
    }

    #[test]
    fn a_refused_refresh_falls_through_to_a_new_authorization() {
        let mut s = setup(BearerChallenge::default());
        s.discovered = Some(discovered());
        s.refresh = Some((Secret::new("revoked"), public("cid")));
        let run = drive(s, |r| {
            if field(&form(r), "grant_type").as_deref() == Some("refresh_token") {
                return Ok(OAuthResponse {
                    status: 400,
                    headers: Vec::new(),
                    body: br#"{"error":"invalid_grant"}"#.to_vec(),
                });
            }
            standard(r)
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert_eq!(run.browsed.len(), 1);
    }

    #[test]
    fn metadata_redirects_are_followed_a_few_times_and_loops_are_named() {
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    redirect(302, "/moved/prm")
                }
                "http://localhost:3000/moved/prm" => ok(prm(MCP, None)),
                _ => standard(r),
            }
        });
        assert!(run.result.is_ok(), "{:?}", run.result);
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    redirect(307, "/a")
                }
                "http://localhost:3000/a" => {
                    redirect(307, "/.well-known/oauth-protected-resource/mcp")
                }
                _ => standard(r),
            }
        });
        let e = run.result.unwrap_err();
        assert!(e.contains("redirect loop"), "{e}");
        assert_eq!(run.requests.len(), 1 + usize::from(MAX_REDIRECTS));
    }

    #[test]
    fn a_token_endpoint_redirect_is_never_followed() {
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:4000/token" => {
                    redirect(307, "https://elsewhere.example.com/token")
                }
                _ => standard(r),
            }
        });
        let e = run.result.clone().unwrap_err();
        assert!(e.contains("redirect") && e.contains("not followed"), "{e}");
        assert!(!run.urls().iter().any(|u| u.contains("elsewhere")));
    }

    #[test]
    fn garbage_unreachable_and_html_answers_end_in_one_sentence() {
        let run = drive(setup(header_challenge()), |_| {
            Err("connection refused".into())
        });
        let e = run.result.unwrap_err();
        assert!(
            e.contains("could not fetch") && e.contains("connection refused"),
            "{e}"
        );
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:3000/.well-known/oauth-protected-resource/mcp" => {
                    ok(prm(MCP, None))
                }
                _ => Ok(OAuthResponse {
                    status: 200,
                    headers: Vec::new(),
                    body: b"<html>app</html>".to_vec(),
                }),
            }
        });
        let e = run.result.unwrap_err();
        assert!(e.contains("no authorization server metadata"), "{e}");
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:4000/token" => Ok(OAuthResponse {
                    status: 200,
                    headers: Vec::new(),
                    body: b"\xff\xfe garbage".to_vec(),
                }),
                _ => standard(r),
            }
        });
        assert!(run.result.unwrap_err().contains("not a JSON object"));
        let run = drive(setup(header_challenge()), |r| {
            match r.url.as_sent().as_str() {
                "http://localhost:4000/register" => Ok(OAuthResponse {
                    status: 400,
                    headers: Vec::new(),
                    body: br#"{"error":"invalid_redirect_uri"}"#.to_vec(),
                }),
                _ => standard(r),
            }
        });
        let e = run.result.unwrap_err();
        assert!(
            e.contains("registration was refused") && e.contains("invalid_redirect_uri"),
            "{e}"
        );
    }

    /// The flow up to its authorization URL, and the URL's state.
    fn browsing() -> (Flow, String) {
        let (mut flow, mut step) = Flow::start(setup(header_challenge()), CLOCKS);
        loop {
            step = match step {
                FlowStep::Request(r) => flow.on_response(standard(&r), CLOCKS),
                FlowStep::Listen { .. } => flow.on_listening(Ok(50123)),
                FlowStep::Browse { url: u } => {
                    let state = field(&form_decode(url(&u).query().unwrap()), "state").unwrap();
                    return (flow, state);
                }
                other @ (FlowStep::Wait | FlowStep::Finished(_)) => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_callback_with_another_state_is_turned_away_and_the_flow_keeps_waiting() {
        let (mut flow, state) = browsing();
        let (page, step) = flow.on_callback(
            &[
                ("code".into(), "x".into()),
                ("state".into(), "forged".into()),
            ],
            CLOCKS,
        );
        assert_eq!((page, step), (CallbackPage::Foreign, FlowStep::Wait));
        let (page, _) = flow.on_callback(&[("code".into(), "x".into())], CLOCKS);
        assert_eq!(page, CallbackPage::Foreign);
        let (page, step) = flow.on_callback(
            &[("code".into(), "x".into()), ("state".into(), state)],
            CLOCKS,
        );
        assert_eq!(page, CallbackPage::Received);
        assert!(matches!(step, FlowStep::Request(_)));
        // The flow has moved on: a replayed callback is foreign.
        let (page, _) = flow.on_callback(&[("code".into(), "x".into())], CLOCKS);
        assert_eq!(page, CallbackPage::Foreign);
    }

    #[test]
    fn an_error_callback_a_foreign_issuer_and_a_decline_end_the_flow() {
        let (mut flow, state) = browsing();
        let (page, step) = flow.on_callback(
            &[
                ("error".into(), "access_denied".into()),
                ("error_description".into(), "user said no".into()),
                ("state".into(), state),
            ],
            CLOCKS,
        );
        let CallbackPage::Refused(shown) = page else {
            panic!()
        };
        assert!(shown.contains("access_denied") && shown.contains("user said no"));
        assert!(matches!(step, FlowStep::Finished(Err(e)) if e.contains("access_denied")));

        let (mut flow, state) = browsing();
        let (page, step) = flow.on_callback(
            &[
                ("code".into(), "c".into()),
                ("iss".into(), "https://other.example.com".into()),
                ("state".into(), state),
            ],
            CLOCKS,
        );
        assert!(matches!(page, CallbackPage::Refused(_)));
        assert!(matches!(step, FlowStep::Finished(Err(e)) if e.contains("9207")));

        let (mut flow, _) = browsing();
        assert!(matches!(flow.on_declined(), FlowStep::Finished(Err(e)) if e.contains("declined")));
        assert_eq!(flow.on_declined(), FlowStep::Wait);
        assert_eq!(flow.on_response(token_ok(), CLOCKS), FlowStep::Wait);
    }

    #[test]
    fn requests_show_no_credentials_in_debug() {
        let run = drive(
            setup(header_challenge()),
            dcr_answering("client_secret_post", Some("sekrit")),
        );
        let text = format!("{:?}", run.requests);
        assert!(!text.contains("sekrit") && !text.contains("c1"), "{text}");
        assert!(!format!("{:?}", run.result).contains("test-token-1"));
    }
}
