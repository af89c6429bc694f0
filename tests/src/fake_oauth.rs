//! The fake OAuth 2.1 authorization server of the remote-server scenarios (SPEC M11), on a real
//! TCP socket (the fake LLM's HTTP server, [`FakeLlm::with_handler`], is a general one), and a
//! fake browser ([`browse`], the test binary run with `BUZZ_E2E_ROLE=fake-browser`) that the
//! agent starts as `$BROWSER`.
//!
//! It speaks what the MCP authorization spec (2025-11-25) and the SDKs' servers speak, and
//! rejects what they reject (each rejection is also kept in [`FakeAuth::rejections`], so a
//! scenario can say what the agent did wrong):
//!
//! | path | what |
//! |---|---|
//! | `/.well-known/oauth-protected-resource…`, `/prm` | RFC 9728 metadata of the MCP server it protects ([`FakeAuth::set_resource`]) |
//! | `/.well-known/oauth-authorization-server` | RFC 8414 metadata, `issuer` = the origin |
//! | `POST /register` | RFC 7591 dynamic registration (when [`AuthOptions::registration`]) |
//! | `GET /authorize` | approves at once like the conformance suite's server: `302` to `redirect_uri?code&state`; requires `response_type=code`, a known client and one of its redirect URIs (loopback), `code_challenge_method=S256`, `state`, and `resource` = the MCP server's URL (RFC 8707) |
//! | `POST /token` | `authorization_code` (PKCE S256 checked, same `redirect_uri` and `resource`, one use per code), `refresh_token` (rotated), `client_credentials`; client authentication as the client registered (`none`, `client_secret_basic`, `client_secret_post`) |
//!
//! Access tokens it issues are appended to [`FakeAuth::tokens_file`] as `<token> <scope>...`
//! lines, which the HTTP fake MCP server accepts (`FAKE_MCP_HTTP_TOKENS_FILE`);
//! [`FakeAuth::revoke_access_tokens`] empties it (as if they expired early).

use crate::fake_llm::{FakeLlm, RecordedRequest, Reply};
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the fake authorization server behaves.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    /// `scopes_supported` of both metadata documents (`None`: left out).
    pub scopes_supported: Option<Vec<String>>,
    /// A `registration_endpoint` is offered (RFC 7591).
    pub registration: bool,
    /// Pre-registered clients: id, secret (`None`: a public client) and its authentication
    /// method at the token endpoint.
    pub clients: Vec<(String, Option<String>, String)>,
    /// `token_endpoint_auth_methods_supported`.
    pub auth_methods: Vec<String>,
    /// `expires_in` of the access tokens, seconds.
    pub expires_in: u64,
    /// Refresh tokens are issued.
    pub refresh_tokens: bool,
    /// `grant_types_supported`.
    pub grant_types: Vec<String>,
    /// The `authorization_servers` entry of the protected resource metadata, when not this
    /// server itself (an authorization server elsewhere: one that fails TLS, one that answers
    /// garbage).
    pub authorization_server: Option<String>,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            scopes_supported: None,
            registration: true,
            clients: Vec::new(),
            auth_methods: vec![
                "none".into(),
                "client_secret_basic".into(),
                "client_secret_post".into(),
            ],
            expires_in: 3600,
            refresh_tokens: true,
            grant_types: vec![
                "authorization_code".into(),
                "refresh_token".into(),
                "client_credentials".into(),
            ],
            authorization_server: None,
        }
    }
}

#[derive(Debug, Clone)]
struct Client {
    secret: Option<String>,
    method: String,
    redirect_uris: Vec<String>,
}

#[derive(Debug, Clone)]
struct CodeGrant {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    resource: String,
    scope: String,
}

#[derive(Debug, Default)]
struct State {
    clients: BTreeMap<String, Client>,
    codes: BTreeMap<String, CodeGrant>,
    /// Refresh token → (client, scope, resource).
    refresh: BTreeMap<String, (String, String, String)>,
    issued: u64,
    resource: String,
    rejections: Vec<String>,
}

/// The fake authorization server. Dropping it stops it.
pub struct FakeAuth {
    http: FakeLlm,
    state: Arc<Mutex<State>>,
    tokens: Arc<PathBuf>,
    _dir: tempfile::TempDir,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeAuth {
    /// Starts a server with `options` on `127.0.0.1` (any port).
    pub fn start(options: AuthOptions) -> FakeAuth {
        let dir = tempfile::tempdir().expect("fake oauth: temp dir");
        let tokens = Arc::new(dir.path().join("tokens"));
        std::fs::write(&*tokens, "").expect("fake oauth: tokens file");
        let mut state = State::default();
        for (id, secret, method) in &options.clients {
            state.clients.insert(
                id.clone(),
                Client {
                    secret: secret.clone(),
                    method: method.clone(),
                    redirect_uris: Vec::new(),
                },
            );
        }
        let state = Arc::new(Mutex::new(state));
        let (s, t) = (state.clone(), tokens.clone());
        let http = FakeLlm::with_handler(move |_, req| {
            let mut st = lock(&s);
            let reply = serve(&options, &mut st, &t, req);
            match reply {
                Ok(r) => r,
                Err((status, error, why)) => {
                    st.rejections
                        .push(format!("{} {}: {error}: {why}", req.method, req.path));
                    json_reply(
                        status,
                        &json!({"error": error, "error_description": why}),
                        &[],
                    )
                }
            }
        });
        FakeAuth {
            http,
            state,
            tokens,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`: the issuer.
    pub fn issuer(&self) -> String {
        self.http.origin()
    }

    /// The URL of the protected resource metadata it serves for the MCP server.
    pub fn prm_url(&self) -> String {
        format!("{}/prm", self.issuer())
    }

    /// The MCP server's URL (the metadata's `resource`, and what `resource` must say).
    pub fn set_resource(&self, url: &str) {
        lock(&self.state).resource = url.to_owned();
    }

    /// The file of issued access tokens (for `FAKE_MCP_HTTP_TOKENS_FILE`).
    pub fn tokens_file(&self) -> PathBuf {
        (*self.tokens).clone()
    }

    /// Forgets every access token issued so far (refresh tokens stay valid).
    pub fn revoke_access_tokens(&self) {
        std::fs::write(&*self.tokens, "").expect("fake oauth: tokens file");
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.http.requests()
    }

    /// The paths of the requests received, with their method (`GET /authorize`), in order.
    pub fn request_lines(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path.split('?').next().unwrap_or("")))
            .collect()
    }

    /// What it refused, one line each (`POST /token: invalid_grant: …`).
    pub fn rejections(&self) -> Vec<String> {
        lock(&self.state).rejections.clone()
    }
}

type Refusal = (u16, &'static str, String);

fn json_reply(status: u16, body: &Value, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("cache-control", "no-store"),
    ];
    headers.extend_from_slice(extra);
    Reply::status(status, headers, body.to_string())
}

fn serve(
    options: &AuthOptions,
    st: &mut State,
    tokens: &PathBuf,
    req: &RecordedRequest,
) -> Result<Reply, Refusal> {
    let issuer = format!("http://{}", req.header("host").unwrap_or("127.0.0.1"));
    let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
    let bad = |e: &'static str, why: String| Err((400, e, why));
    match (req.method.as_str(), path) {
        ("GET", p) if p == "/prm" || p.starts_with("/.well-known/oauth-protected-resource") => {
            let server = options.authorization_server.as_deref().unwrap_or(&issuer);
            let mut prm = json!({"resource": st.resource, "authorization_servers": [server]});
            if let Some(s) = &options.scopes_supported {
                prm["scopes_supported"] = json!(s);
            }
            Ok(json_reply(200, &prm, &[]))
        }
        ("GET", "/.well-known/oauth-authorization-server") => {
            let mut m = json!({
                "issuer": issuer,
                "authorization_endpoint": format!("{issuer}/authorize"),
                "token_endpoint": format!("{issuer}/token"),
                "response_types_supported": ["code"],
                "grant_types_supported": options.grant_types,
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": options.auth_methods,
            });
            if options.registration {
                m["registration_endpoint"] = json!(format!("{issuer}/register"));
            }
            if let Some(s) = &options.scopes_supported {
                m["scopes_supported"] = json!(s);
            }
            Ok(json_reply(200, &m, &[]))
        }
        ("POST", "/register") if options.registration => {
            if !req
                .header("content-type")
                .is_some_and(|c| c.starts_with("application/json"))
            {
                return bad("invalid_client_metadata", "the body must be JSON".into());
            }
            let uris: Vec<String> = req.body["redirect_uris"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|u| u.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if uris.is_empty() || !uris.iter().all(|u| is_loopback_http(u)) {
                return bad(
                    "invalid_redirect_uri",
                    format!("redirect_uris must be loopback http URLs: {uris:?}"),
                );
            }
            let method = req.body["token_endpoint_auth_method"]
                .as_str()
                .unwrap_or("client_secret_basic")
                .to_owned();
            if !options.auth_methods.contains(&method) {
                return bad(
                    "invalid_client_metadata",
                    format!("token_endpoint_auth_method {method} not supported"),
                );
            }
            st.issued += 1;
            let id = format!("dyn-client-{}", st.issued);
            let secret = (method != "none").then(|| format!("dyn-secret-{}", st.issued));
            let mut answer = req.body.clone();
            answer["client_id"] = json!(id);
            answer["token_endpoint_auth_method"] = json!(method);
            if let Some(s) = &secret {
                answer["client_secret"] = json!(s);
            }
            st.clients.insert(
                id,
                Client {
                    secret,
                    method,
                    redirect_uris: uris,
                },
            );
            Ok(json_reply(201, &answer, &[]))
        }
        ("GET", "/authorize") => {
            let q = form_decode(query);
            let get = |k: &str| q.get(k).cloned().unwrap_or_default();
            if get("response_type") != "code" {
                return bad("unsupported_response_type", get("response_type"));
            }
            let client_id = get("client_id");
            let Some(client) = st.clients.get(&client_id) else {
                return bad("invalid_client", format!("unknown client {client_id:?}"));
            };
            let redirect_uri = get("redirect_uri");
            let registered = client.redirect_uris.is_empty()
                || client.redirect_uris.contains(&redirect_uri)
                || client
                    .redirect_uris
                    .iter()
                    .any(|u| same_but_port(u, &redirect_uri));
            if !is_loopback_http(&redirect_uri) || !registered {
                return bad(
                    "invalid_request",
                    format!("redirect_uri {redirect_uri:?} not registered"),
                );
            }
            if get("code_challenge_method") != "S256" || get("code_challenge").len() != 43 {
                return bad("invalid_request", "PKCE S256 is required".into());
            }
            if get("state").is_empty() {
                return bad("invalid_request", "state is required".into());
            }
            if get("resource") != st.resource {
                return bad(
                    "invalid_target",
                    format!("resource {:?} is not {:?}", get("resource"), st.resource),
                );
            }
            st.issued += 1;
            let code = format!("code-{}", st.issued);
            st.codes.insert(
                code.clone(),
                CodeGrant {
                    client_id,
                    redirect_uri: redirect_uri.clone(),
                    challenge: get("code_challenge"),
                    resource: get("resource"),
                    scope: get("scope"),
                },
            );
            let sep = if redirect_uri.contains('?') { '&' } else { '?' };
            let location = format!(
                "{redirect_uri}{sep}code={code}&state={}",
                form_component(&get("state"))
            );
            Ok(Reply::status(302, vec![("location", &location)], ""))
        }
        ("POST", "/token") => {
            let form = match &req.body {
                Value::String(s) => form_decode(s),
                _ => return bad("invalid_request", "the body must be a form".into()),
            };
            let get = |k: &str| form.get(k).cloned().unwrap_or_default();
            let client_id = authenticate(st, req, &form)?;
            let (scope, resource) = match get("grant_type").as_str() {
                "authorization_code" => {
                    let Some(grant) = st.codes.remove(&get("code")) else {
                        return bad("invalid_grant", "unknown or used code".into());
                    };
                    if grant.client_id != client_id || grant.redirect_uri != get("redirect_uri") {
                        return bad("invalid_grant", "client or redirect_uri differ".into());
                    }
                    let digest = sha2::Sha256::digest(get("code_verifier").as_bytes());
                    let expected = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
                    if expected != grant.challenge {
                        return bad("invalid_grant", "PKCE verifier does not match".into());
                    }
                    if get("resource") != grant.resource {
                        return bad("invalid_target", "resource differs from the code's".into());
                    }
                    (grant.scope, grant.resource)
                }
                "refresh_token" => {
                    let Some((owner, scope, resource)) = st.refresh.remove(&get("refresh_token"))
                    else {
                        return bad("invalid_grant", "unknown refresh token".into());
                    };
                    if owner != client_id {
                        return bad("invalid_grant", "another client's refresh token".into());
                    }
                    (scope, resource)
                }
                "client_credentials" => (get("scope"), get("resource")),
                other => return bad("unsupported_grant_type", other.to_owned()),
            };
            st.issued += 1;
            let access = format!("at-{}", st.issued);
            let mut line = access.clone();
            for s in scope.split_whitespace() {
                line.push(' ');
                line.push_str(s);
            }
            line.push('\n');
            std::fs::OpenOptions::new()
                .append(true)
                .open(tokens)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .expect("fake oauth: tokens file");
            let mut answer = json!({
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": options.expires_in,
            });
            if !scope.is_empty() {
                answer["scope"] = json!(scope);
            }
            if options.refresh_tokens && get("grant_type") != "client_credentials" {
                let rt = format!("rt-{}", st.issued);
                st.refresh.insert(rt.clone(), (client_id, scope, resource));
                answer["refresh_token"] = json!(rt);
            }
            Ok(json_reply(200, &answer, &[]))
        }
        _ => Err((404, "not_found", format!("{} {}", req.method, req.path))),
    }
}

/// The client a token request authenticates as, by its registered method.
fn authenticate(
    st: &State,
    req: &RecordedRequest,
    form: &BTreeMap<String, String>,
) -> Result<String, Refusal> {
    let basic = req
        .header("authorization")
        .and_then(|h| h.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            let (id, secret) = s.split_once(':')?;
            Some((form_unescape(id), form_unescape(secret)))
        });
    let id = match (&basic, form.get("client_id")) {
        (Some((id, _)), _) => id.clone(),
        (None, Some(id)) => id.clone(),
        (None, None) => return Err((401, "invalid_client", "no client".into())),
    };
    let Some(client) = st.clients.get(&id) else {
        return Err((401, "invalid_client", format!("unknown client {id:?}")));
    };
    let ok = match client.method.as_str() {
        "none" => basic.is_none() && !form.contains_key("client_secret"),
        "client_secret_basic" => {
            basic.as_ref().map(|(_, s)| s) == client.secret.as_ref()
                && !form.contains_key("client_secret")
        }
        "client_secret_post" => {
            basic.is_none() && form.get("client_secret") == client.secret.as_ref()
        }
        _ => false,
    };
    if ok {
        Ok(id)
    } else {
        Err((
            401,
            "invalid_client",
            format!("client {id} must authenticate with {}", client.method),
        ))
    }
}

fn is_loopback_http(u: &str) -> bool {
    u.strip_prefix("http://").is_some_and(|rest| {
        rest.starts_with("127.0.0.1:")
            || rest.starts_with("localhost:")
            || rest.starts_with("[::1]:")
    })
}

/// Loopback redirect URIs may differ in the port alone (RFC 8252 §7.3).
fn same_but_port(a: &str, b: &str) -> bool {
    let strip = |u: &str| {
        let rest = u.strip_prefix("http://")?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        Some((
            host.rsplit_once(':').map_or(host, |(h, _)| h).to_owned(),
            path.to_owned(),
        ))
    };
    is_loopback_http(a) && is_loopback_http(b) && strip(a) == strip(b)
}

/// `application/x-www-form-urlencoded` (also a query string) into its pairs (last wins).
pub fn form_decode(s: &str) -> BTreeMap<String, String> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_unescape(k), form_unescape(v))
        })
        .collect()
}

fn form_unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(v)) => {
                out.push(v);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn form_component(s: &str) -> String {
    let mut out = String::new();
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The fake browser (`BUZZ_E2E_ROLE=fake-browser`, the URL as its last argument): `GET`s the
/// URL and follows `Location` redirects (at most 10, `http://` only) like a browser whose user
/// approves at once; appends each URL it visits and the final status to `FAKE_BROWSER_LOG`
/// if set. Exits 0 when the last answer was a 2xx.
pub fn browse_main() -> ! {
    let url = std::env::args().next_back().unwrap_or_default();
    let log = std::env::var_os("FAKE_BROWSER_LOG");
    let mut lines = Vec::new();
    let status = browse(&url, &mut lines);
    if let Some(log) = log {
        let mut text = lines.join("\n");
        text.push('\n');
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(text.as_bytes()));
    }
    std::process::exit(if (200..300).contains(&status) { 0 } else { 1 });
}

/// Visits `url` and its redirects; `visited` gets `GET <url>` and `-> <status>` lines.
/// Returns the last status (0: no answer).
pub fn browse(url: &str, visited: &mut Vec<String>) -> u16 {
    let mut url = url.to_owned();
    for _ in 0..10 {
        visited.push(format!("GET {url}"));
        let Some((status, location)) = get_once(&url) else {
            visited.push("-> no answer".into());
            return 0;
        };
        visited.push(format!("-> {status}"));
        match location {
            Some(next) if (300..400).contains(&status) => {
                url = if next.starts_with("http://") {
                    next
                } else {
                    let origin_end = url[7..].find('/').map_or(url.len(), |i| i + 7);
                    format!("{}{next}", &url[..origin_end])
                };
            }
            _ => return status,
        }
    }
    0
}

fn get_once(url: &str) -> Option<(u16, Option<String>)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut conn = TcpStream::connect(host).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: {host}\r\nuser-agent: fake-browser\r\naccept: text/html\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let head = text.split("\r\n\r\n").next()?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let location = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("location")
            .then(|| v.trim().to_owned())
    });
    Some((status, location))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    /// One `POST` with `content_type`; the status and the body as JSON.
    fn post(url: &str, content_type: &str, body: &str, auth: Option<&str>) -> (u16, Value) {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_at(rest.find('/').unwrap());
        let mut conn = TcpStream::connect(host).unwrap();
        let auth = auth.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
        write!(
            conn,
            "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: {content_type}\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn challenge_of(verifier: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier))
    }

    /// Accepts one request on the redirect listener, reads its whole head (closing with unread
    /// bytes would reset the connection, and the browser would see an error, not `answer`),
    /// answers, and gives the request line.
    fn answer_callback(callback: &TcpListener, answer: &[u8]) -> String {
        let (mut conn, _) = callback.accept().unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let mut header = String::new();
        while reader.read_line(&mut header).unwrap_or(0) > 2 {
            header.clear();
        }
        conn.write_all(answer).unwrap();
        line
    }

    #[test]
    fn m11_the_fake_runs_a_whole_pkce_flow_and_refuses_a_wrong_verifier() {
        let auth = FakeAuth::start(AuthOptions::default());
        let resource = "http://127.0.0.1:9/mcp";
        auth.set_resource(resource);
        let callback = TcpListener::bind("127.0.0.1:0").unwrap();
        let redirect = format!("http://{}/callback", callback.local_addr().unwrap());
        let (status, client) = post(
            &format!("{}/register", auth.issuer()),
            "application/json",
            &json!({"redirect_uris": [redirect], "token_endpoint_auth_method": "none"}).to_string(),
            None,
        );
        assert_eq!(status, 201, "{client}");
        let client_id = client["client_id"].as_str().unwrap().to_owned();
        let verifier = "v".repeat(43);
        let url = format!(
            "{}/authorize?response_type=code&client_id={client_id}&redirect_uri={}&code_challenge={}&code_challenge_method=S256&state=s%201&resource={}",
            auth.issuer(),
            form_component(&redirect),
            challenge_of(&verifier),
            form_component(resource),
        );
        let seen = std::thread::spawn(move || {
            answer_callback(
                &callback,
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
            )
        });
        // The query of the redirect the callback got (its request line's target).
        let callback_query = |line: String| {
            let target = line.split_whitespace().nth(1).unwrap().to_string();
            form_decode(target.split_once('?').unwrap().1)
        };
        let mut visited = Vec::new();
        assert_eq!(browse(&url, &mut visited), 200, "{visited:?}");
        let q = callback_query(seen.join().unwrap());
        assert_eq!(q["state"], "s 1");
        let token = |verifier: &str, code: &str| {
            post(
                &format!("{}/token", auth.issuer()),
                "application/x-www-form-urlencoded",
                &format!(
                    "grant_type=authorization_code&code={code}&client_id={client_id}&redirect_uri={}&code_verifier={verifier}&resource={}",
                    form_component(&redirect),
                    form_component(resource)
                ),
                None,
            )
        };
        let (status, _) = token(&"w".repeat(43), &q["code"]);
        assert_eq!(status, 400);
        assert!(
            auth.rejections()[0].contains("PKCE"),
            "{:?}",
            auth.rejections()
        );
        // A refused code is spent, as on real servers; a new flow gets a new one.
        let mut visited = Vec::new();
        let seen = std::thread::spawn({
            let callback = TcpListener::bind(
                redirect
                    .trim_start_matches("http://")
                    .trim_end_matches("/callback"),
            )
            .unwrap();
            move || {
                answer_callback(
                    &callback,
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
            }
        });
        assert_eq!(browse(&url, &mut visited), 200, "{visited:?}");
        let (status, tokens) = token(&verifier, &callback_query(seen.join().unwrap())["code"]);
        assert_eq!(status, 200, "{tokens} {:?}", auth.rejections());
        let access = tokens["access_token"].as_str().unwrap();
        let file = std::fs::read_to_string(auth.tokens_file()).unwrap();
        assert!(file.lines().any(|l| l == access), "{file}");
        let (status, refreshed) = post(
            &format!("{}/token", auth.issuer()),
            "application/x-www-form-urlencoded",
            &format!(
                "grant_type=refresh_token&refresh_token={}&client_id={client_id}",
                tokens["refresh_token"].as_str().unwrap()
            ),
            None,
        );
        assert_eq!(status, 200, "{refreshed}");
        assert_ne!(refreshed["access_token"], tokens["access_token"]);
    }
}
