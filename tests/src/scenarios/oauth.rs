//! Remote MCP servers behind OAuth 2.1 (SPEC M11), end to end: the agent binary, the HTTP fake
//! MCP server process ([`HttpFake`], accepting the tokens [`FakeAuth`] issued), the fake
//! authorization server on its own port, and `$BROWSER` = the fake browser (the test binary
//! with `BUZZ_E2E_ROLE=fake-browser`), which follows the authorization endpoint's redirect to
//! the agent's loopback listener as a browser would.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn};
use crate::fake_llm::Reply;
use crate::fake_mcp_http::{HttpFake, read_http_log};
use crate::fake_oauth::{AuthOptions, FakeAuth};
use crate::harness::{Ctx, current_exe};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// `$BROWSER` running the fake browser, which appends the URLs it visits to `log`.
fn browser(log: &str) -> String {
    format!(
        "env BUZZ_E2E_ROLE=fake-browser FAKE_BROWSER_LOG={log} {}",
        current_exe()
    )
}

/// The fake MCP server with tool `echo`, protected by `auth`.
fn protected_server(s: &Scratch, auth: &FakeAuth, extra: &[(&str, &str)]) -> HttpFake {
    let tokens = auth.tokens_file();
    let tokens = tokens.to_str().expect("utf-8 path");
    let prm = auth.prm_url();
    let mut env = vec![
        ("FAKE_MCP_TOOLS", "echo"),
        ("FAKE_MCP_HTTP_TOKENS_FILE", tokens),
        ("FAKE_MCP_HTTP_RESOURCE_METADATA", prm.as_str()),
    ];
    env.extend_from_slice(extra);
    let fake = HttpFake::start(s.dir.path(), &env);
    auth.set_resource(&fake.url());
    fake
}

/// Prompts `prompt` in session `sid`: the turn ends, and the model's first call, `c1`, got
/// `echoed` back from the server (its result in the second LLM request).
fn assert_first_call_echoes(
    agent: &crate::harness::AgentProc,
    llm: &crate::fake_llm::FakeLlm,
    sid: &str,
    prompt: &str,
    echoed: &str,
) {
    let r = agent.prompt(sid, prompt);
    assert_end_turn(agent, &r);
    assert_eq!(
        llm.requests()[1].tool_results(),
        [("c1".to_string(), echoed.to_string())],
        "{}",
        agent.context()
    );
}

/// The notices of the `session/new` answer `r` (`_meta.buzz.notices`); the session started.
fn start_notices<'a>(agent: &crate::harness::AgentProc, r: &'a Value) -> Vec<&'a str> {
    let result = agent.result(r);
    assert!(result["sessionId"].is_string(), "{r}");
    result["_meta"]["buzz"]["notices"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn lines(path: &str) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).map_or(0, |m| m.permissions().mode() & 0o777)
}

/// M11: a server answering `401` is authorized on the first request: its protected resource
/// metadata (the challenge's `resource_metadata`), the authorization server's metadata,
/// dynamic registration, the user's visit (`$BROWSER`) with PKCE and `resource`, the redirect
/// to the loopback listener, the token; `initialize` goes again with the token and the tool
/// call works. The tokens are kept in the state directory (0600 in a 0700 `oauth/`), never in
/// the log, and a second agent on the same state directory uses them without a login.
pub fn m11_a_server_behind_oauth_is_authorized_through_the_browser_and_its_tokens_are_kept(
    ctx: &Ctx,
) {
    let s = Scratch::new();
    let auth = FakeAuth::start(AuthOptions {
        scopes_supported: Some(vec!["mcp.read".into()]),
        ..AuthOptions::default()
    });
    let fake = protected_server(&s, &auth, &[]);
    let visits = s.file("browser.log");
    let state = s.dir.path().join("state/sessions");
    let state = state.to_str().expect("utf-8 path").to_owned();
    let env = [
        ("BROWSER", browser(&visits)),
        ("BUZZ_AGENT_STATE_DIR", state.clone()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "remote__echo", json!({"text": "over oauth"}))]),
            Reply::text("done"),
        ])
        .env(&env)
        .servers([fake.entry("remote", &[])])
        .start();
    assert_first_call_echoes(
        &agent,
        &llm,
        &sid,
        "echo through the authorized server",
        "over oauth",
    );
    assert!(auth.rejections().is_empty(), "{:?}", auth.rejections());
    let asked = auth.request_lines();
    for line in [
        "GET /prm",
        "GET /.well-known/oauth-authorization-server",
        "POST /register",
        "GET /authorize",
        "POST /token",
    ] {
        assert!(asked.iter().any(|l| l == line), "{line} missing: {asked:?}");
    }
    let authorize = auth
        .requests()
        .into_iter()
        .find(|r| r.path.starts_with("/authorize?"))
        .expect("the authorization request");
    assert!(
        authorize.path.contains("scope=mcp.read"),
        "the scope the metadata offers: {}",
        authorize.path
    );
    let visited = lines(&visits);
    assert!(
        visited
            .iter()
            .any(|l| l.starts_with("GET http://127.0.0.1:") && l.contains("/callback?code=")),
        "the browser reached the loopback listener: {visited:?}"
    );
    assert_eq!(
        visited.last().map(String::as_str),
        Some("-> 200"),
        "{visited:?}"
    );
    let dir = Path::new(&state).join("oauth");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}{}", dir.display(), agent.context()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&files[0]), 0o600);
    let stored = std::fs::read_to_string(&files[0]).unwrap_or_default();
    let issued = lines(auth.tokens_file().to_str().unwrap_or_default());
    let token = issued[0].split_whitespace().next().unwrap_or_default();
    assert!(stored.contains(&format!("\"{token}\"")), "{stored}");
    let log = agent.stderr_text();
    assert!(
        !log.contains(&format!("{token}\"")) && !log.contains(&format!("Bearer {token}")),
        "the token is never logged"
    );
    agent.finish();

    // A second agent on the same state directory: the stored token, no login.
    let before = auth.request_lines().len();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c2", "remote__echo", json!({"text": "again"}))]),
            Reply::text("done"),
        ])
        .env(&env)
        .servers([fake.entry("remote", &[])])
        .start();
    let r = agent.prompt(&sid, "again");
    assert_end_turn(&agent, &r);
    assert_eq!(
        llm.requests()[1].tool_results(),
        [("c2".to_string(), "again".to_string())]
    );
    assert_eq!(
        auth.request_lines().len(),
        before,
        "no authorization request at all: {:?}",
        auth.request_lines()
    );
    assert_eq!(lines(&visits), visited, "no second login");
    agent.finish();
}

/// M11: an access token the server no longer accepts is refreshed with the refresh token (no
/// login); a `403 insufficient_scope` on a tool call steps up once, asking for the granted
/// and the missing scope, and the call goes through.
pub fn m11_a_rejected_token_is_refreshed_and_a_missing_scope_is_stepped_up(ctx: &Ctx) {
    let s = Scratch::new();
    let auth = FakeAuth::start(AuthOptions {
        scopes_supported: Some(vec!["read".into()]),
        ..AuthOptions::default()
    });
    let http_log = s.file("http.log");
    let fake = protected_server(
        &s,
        &auth,
        &[
            ("FAKE_MCP_HTTP_TOOL_SCOPES", "echo=write"),
            ("FAKE_MCP_HTTP_LOG", &http_log),
        ],
    );
    let visits = s.file("browser.log");
    let browser = browser(&visits);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "remote__echo", json!({"text": "one"}))]),
            Reply::text("first"),
            Reply::tool_calls(vec![("c2", "remote__echo", json!({"text": "two"}))]),
            Reply::text("second"),
        ])
        .env(&[("BROWSER", &browser)])
        .servers([fake.entry("remote", &[])])
        .start();
    assert_first_call_echoes(&agent, &llm, &sid, "one", "one");
    let logins: Vec<String> = auth
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/authorize?"))
        .map(|r| r.path)
        .collect();
    assert_eq!(logins.len(), 2, "the login, then one step-up: {logins:?}");
    // Scopes are space-separated: `+` or `%20` in the query.
    let scope = |path: &str| {
        crate::fake_oauth::form_decode(path.split_once('?').map_or("", |(_, q)| q))
            .get("scope")
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(scope(&logins[0]), "read", "scopes_supported");
    // The step-up's login comes while the turn waits for the call: a client without URL
    // elicitation sees a notice carrying its URL at once (the first login came before the
    // session was answered: nowhere to show it but the log and `$BROWSER`).
    let shown: Vec<String> = agent
        .session_updates(&sid)
        .iter()
        .filter(|u| u["_meta"]["buzz"]["notice"] == "mcp_server_login")
        .map(|u| u.to_string())
        .collect();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(
        shown[0].contains("MCP server 'remote' needs authorization: open http://127.0.0.1:")
            && shown[0].contains("/authorize?response_type=code"),
        "{shown:?}"
    );
    let mut stepped: Vec<String> = scope(&logins[1]).split(' ').map(str::to_owned).collect();
    stepped.sort();
    assert_eq!(stepped, ["read", "write"], "{logins:?}");
    let statuses: Vec<u64> = read_http_log(&http_log)
        .iter()
        .filter(|e| e["body"].as_str().is_some_and(|b| b.contains("tools/call")))
        .map(|e| e["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [403, 200], "the call again after the step-up");

    // The server forgets the token: the next call is refreshed, not logged in again.
    auth.revoke_access_tokens();
    let r = agent.prompt(&sid, "two");
    assert_end_turn(&agent, &r);
    assert_eq!(
        llm.requests()[3].tool_results().last().cloned(),
        Some(("c2".to_string(), "two".to_string())),
        "{}",
        agent.context()
    );
    let refreshes = auth
        .requests()
        .iter()
        .filter(|r| {
            r.path == "/token"
                && r.body
                    .as_str()
                    .is_some_and(|b| b.contains("grant_type=refresh_token"))
        })
        .count();
    assert_eq!(refreshes, 1, "{:?}", auth.request_lines());
    assert_eq!(
        auth.requests()
            .iter()
            .filter(|r| r.path.starts_with("/authorize?"))
            .count(),
        2,
        "no third login"
    );
    assert!(auth.rejections().is_empty(), "{:?}", auth.rejections());
    agent.finish();
}

/// M11: a headless agent with a `client_credentials` client from the clients file
/// (`BUZZ_AGENT_OAUTH_CLIENTS_FILE`, `client_secret_basic`): no browser, no registration; and
/// a server whose login never happens (no `$BROWSER`, the user's time limit passes) starts
/// without tools while the session starts, with a notice naming it — its URL was logged for
/// the user.
pub fn m11_client_credentials_need_no_user_and_a_failed_login_leaves_the_server_without_tools(
    ctx: &Ctx,
) {
    let s = Scratch::new();
    let auth = FakeAuth::start(AuthOptions {
        registration: false,
        clients: vec![(
            "svc".into(),
            Some("s3cret".into()),
            "client_secret_basic".into(),
        )],
        ..AuthOptions::default()
    });
    let fake = protected_server(&s, &auth, &[]);
    let clients = s.file("clients.json");
    std::fs::write(
        &clients,
        json!({"servers": {"robot": {"client_id": "svc", "client_secret_env": "SVC_SECRET", "grant": "client_credentials"}}})
            .to_string(),
    )
    .expect("clients file");
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "robot__echo", json!({"text": "headless"}))]),
            Reply::text("done"),
        ])
        .env(&[
            ("BUZZ_AGENT_OAUTH_CLIENTS_FILE", &clients),
            ("SVC_SECRET", "s3cret"),
        ])
        .servers([fake.entry("robot", &[])])
        .start();
    assert_first_call_echoes(&agent, &llm, &sid, "echo", "headless");
    let asked = auth.request_lines();
    assert!(
        !asked
            .iter()
            .any(|l| l == "GET /authorize" || l == "POST /register"),
        "{asked:?}"
    );
    let token = auth
        .requests()
        .into_iter()
        .find(|r| r.path == "/token")
        .expect("a token request");
    assert!(
        token
            .body
            .as_str()
            .is_some_and(|b| b.contains("grant_type=client_credentials")),
        "{:?}",
        token.body
    );
    assert!(
        !agent.stderr_text().contains("s3cret"),
        "the secret is never logged"
    );
    agent.finish();

    // Nobody logs in: the server starts without tools, the session starts with a notice.
    let auth = FakeAuth::start(AuthOptions::default());
    let fake = protected_server(&s, &auth, &[]);
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[("BUZZ_AGENT_OAUTH_TIMEOUT_SECS", "1")])
        .spawn();
    agent.initialize();
    let r = agent.request(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [fake.entry("remote", &[])]}),
    );
    let notices = start_notices(&agent, &r);
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with("MCP server 'remote' is not authorized: ")),
        "{r}"
    );
    let log = agent.stderr_text();
    assert!(
        log.contains("MCP server 'remote' needs authorization: open http://127.0.0.1:")
            && log.contains("/authorize?response_type=code"),
        "the URL for the user{}",
        agent.context()
    );
    agent.finish();
}

/// `initialize` as a client that presents URL-mode elicitation.
fn initialize_with_url_elicitation(agent: &crate::harness::AgentProc) {
    let init = agent.request(
        "initialize",
        json!({"protocolVersion": 1,
               "clientCapabilities": {"elicitation": {"url": {}}},
               "clientInfo": {"name": "buzz-agent-e2e", "version": "0"}}),
    );
    assert!(init.get("result").is_some(), "{init}");
}

/// The `elicitation/create` requests the agent sent.
fn elicitations(agent: &crate::harness::AgentProc) -> Vec<Value> {
    agent
        .agent_requests()
        .into_iter()
        .filter(|m| m["method"] == "elicitation/create")
        .collect()
}

/// M11: a client that presents URL-mode elicitation is asked to open the login itself
/// (`elicitation/create` with the authorization URL, scoped to the `session/new` that waits
/// for it; no `$BROWSER`); it follows the URL, the authorization server redirects to the
/// loopback listener, the token is obtained, the client gets `elicitation/complete` for that
/// elicitation, and the server's tools serve the session.
pub fn m11_a_client_with_url_elicitation_shows_the_login_and_is_told_when_it_is_done(ctx: &Ctx) {
    let s = Scratch::new();
    let auth = FakeAuth::start(AuthOptions::default());
    let fake = protected_server(&s, &auth, &[]);
    let visits = s.file("browser.log");
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![(
                "c1",
                "remote__echo",
                json!({"text": "via the client"}),
            )]),
            Reply::text("done"),
        ])
        .env(&[("BROWSER", &browser(&visits))])
        .spawn();
    let followed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = followed.clone();
    agent.set_elicitation_answer(move |params| {
        let url = params["url"].as_str().unwrap_or_default().to_owned();
        let seen = seen.clone();
        // The user opens the URL in the client while the answer goes back.
        std::thread::spawn(move || {
            let mut visited = Vec::new();
            crate::fake_oauth::browse(&url, &mut visited);
            seen.lock().expect("visits").extend(visited);
        });
        Some(json!({"action": "accept"}))
    });
    initialize_with_url_elicitation(&agent);
    let r = agent.request(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [fake.entry("remote", &[])]}),
    );
    let sid = agent.result(&r)["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}{}", agent.context()))
        .to_owned();
    let asked = elicitations(&agent);
    assert_eq!(asked.len(), 1, "{asked:#?}");
    let params = &asked[0]["params"];
    assert_eq!(params["mode"], "url");
    assert_eq!(
        params["requestId"], r["id"],
        "scoped to the waiting session/new"
    );
    assert!(
        params["url"].as_str().is_some_and(
            |u| u.starts_with(&format!("{}/authorize?response_type=code", auth.issuer()))
        ),
        "{params}"
    );
    assert!(
        params["message"]
            .as_str()
            .is_some_and(|m| m.contains("MCP server 'remote'")),
        "{params}"
    );
    let id = params["elicitationId"].clone();
    assert!(id.is_string(), "{params}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let visited = loop {
        let visited = followed.lock().expect("visits").clone();
        if !visited.is_empty() || Instant::now() > deadline {
            break visited;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        visited
            .iter()
            .any(|l| l.starts_with("GET http://127.0.0.1:") && l.contains("/callback?code=")),
        "the client's visit reached the loopback listener: {visited:?}"
    );
    agent.wait_until("elicitation/complete", Duration::from_secs(10), |msgs| {
        msgs.iter()
            .any(|m| m["method"] == "elicitation/complete" && m["params"]["elicitationId"] == id)
    });
    assert!(
        lines(&visits).is_empty(),
        "$BROWSER is not started when the client shows the login"
    );
    assert_first_call_echoes(
        &agent,
        &llm,
        &sid,
        "echo through the authorized server",
        "via the client",
    );
    assert!(auth.rejections().is_empty(), "{:?}", auth.rejections());
    agent.finish();
}

/// M11: the user declines the login in the client: the server's authorization is declined,
/// it starts without tools, and the session starts with a notice saying why; nobody visits
/// the authorization endpoint and no `elicitation/complete` follows.
pub fn m11_a_declined_login_leaves_the_server_without_tools_and_the_session_says_why(ctx: &Ctx) {
    let s = Scratch::new();
    let auth = FakeAuth::start(AuthOptions::default());
    let fake = protected_server(&s, &auth, &[]);
    let (_llm, agent) = Setup::new(ctx, &s).spawn();
    agent.set_elicitation_answer(|_| Some(json!({"action": "decline"})));
    initialize_with_url_elicitation(&agent);
    let r = agent.request_timeout(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [fake.entry("remote", &[])]}),
        Duration::from_secs(20),
    );
    let notices = start_notices(&agent, &r);
    assert_eq!(
        notices,
        ["MCP server 'remote' is not authorized: the authorization was declined."],
        "{r}"
    );
    assert_eq!(elicitations(&agent).len(), 1);
    assert!(
        !auth.request_lines().iter().any(|l| l == "GET /authorize"),
        "{:?}",
        auth.request_lines()
    );
    assert!(
        !agent
            .notifications()
            .iter()
            .any(|m| m["method"] == "elicitation/complete"),
        "a declined login is not completed"
    );
    agent.finish();
}

/// A TCP server on `127.0.0.1` that answers every connection with bytes that are neither
/// HTTP nor TLS, then closes it; returns its `host:port`.
pub(super) fn garbage_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("garbage server");
    let at = listener.local_addr().expect("its address").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = std::io::Read::read(&mut conn, &mut [0; 512]);
            let _ =
                std::io::Write::write_all(&mut conn, b"\x00\x01garbage \xff\xfe not http\r\n\r\n");
        }
    });
    at
}

/// M11: the server's authorization server is unusable: an `https://` one whose TLS fails, and
/// one answering garbage. The server starts without tools, and the session starts anyway
/// with a notice saying why; no login is asked for.
pub fn m11_an_authorization_server_failing_tls_or_answering_garbage_leaves_the_server_without_tools(
    ctx: &Ctx,
) {
    let s = Scratch::new();
    let garbage = garbage_server();
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[
            ("BUZZ_AGENT_OAUTH_TIMEOUT_SECS", "5"),
            ("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "5"),
        ])
        .spawn();
    initialize_with_url_elicitation(&agent);
    agent.set_elicitation_answer(|_| Some(json!({"action": "accept"})));
    for (case, server, why) in [
        (
            "tls",
            format!("https://{garbage}"),
            "cannot connect to https://",
        ),
        (
            "garbage",
            format!("http://{garbage}"),
            "invalid HTTP response",
        ),
    ] {
        let auth = FakeAuth::start(AuthOptions {
            authorization_server: Some(server),
            ..AuthOptions::default()
        });
        let fake = protected_server(&s, &auth, &[]);
        let started = Instant::now();
        let r = agent.request_timeout(
            "session/new",
            json!({"cwd": s.ws, "mcpServers": [fake.entry("remote", &[])]}),
            Duration::from_secs(30),
        );
        let notices = start_notices(&agent, &r);
        assert!(
            matches!(&notices[..], [n] if n.starts_with("MCP server 'remote' is not authorized: could not fetch ")
                && n.contains(why)),
            "{case}: {r}{}",
            agent.context()
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{case}: {:?}",
            started.elapsed()
        );
    }
    assert!(elicitations(&agent).is_empty(), "no login was asked for");
    agent.finish();
}

/// M11: a login the client shows ends with its server: the session's other server never
/// answers `initialize`, so `session/new` fails while the login waits for the user, and the
/// client gets `elicitation/complete` for it (nothing is left for the user to do).
pub fn m11_a_login_the_client_shows_is_completed_when_the_session_fails_to_start(ctx: &Ctx) {
    let s = Scratch::new();
    let auth = FakeAuth::start(AuthOptions::default());
    let fake = protected_server(&s, &auth, &[]);
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "2")])
        .spawn();
    // The user never answers.
    agent.set_elicitation_answer(|_| None);
    initialize_with_url_elicitation(&agent);
    let silent = crate::harness::fake_mcp_entry("silent", &[("FAKE_MCP_NO_INIT_REPLY", "1")]);
    let r = agent.request_timeout(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [silent, fake.entry("remote", &[])]}),
        Duration::from_secs(20),
    );
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(msg.contains("'silent'"), "{msg}");
    let asked = elicitations(&agent);
    assert_eq!(asked.len(), 1, "{asked:#?}{}", agent.context());
    let id = asked[0]["params"]["elicitationId"].clone();
    agent.wait_until("elicitation/complete", Duration::from_secs(5), |msgs| {
        msgs.iter()
            .any(|m| m["method"] == "elicitation/complete" && m["params"]["elicitationId"] == id)
    });
    agent.finish();
}
