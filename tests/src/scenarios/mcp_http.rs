//! MCP servers over HTTP (SPEC M10): Streamable HTTP with event-stream and JSON answers, the
//! session and protocol-version headers, the `GET` stream, `DELETE` at shutdown, a new session
//! after a server restart, the legacy HTTP+SSE transport, a `_Stop` hook on a remote server,
//! and servers that cannot be used (unreachable, refusing the credential). The server is
//! [`HttpFake`], a separate process listening on `127.0.0.1`.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, log_of, stop_calls, stop_json};
use crate::fake_llm::Reply;
use crate::fake_mcp;
use crate::fake_mcp_http::{HttpFake, posted_method, posts, read_http_log};
use crate::harness::Ctx;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Waits until the fake's log satisfies `cond` (the agent's `DELETE` at shutdown and its `GET`
/// stream are concurrent with the test).
pub(super) fn wait_log(path: &str, what: &str, cond: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = read_http_log(path);
        if cond(&log) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the fake's requests were {log:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// M10: a tool call over Streamable HTTP answered as an event stream: `initialize` without a
/// session id, every later request with the session id the server gave and the protocol
/// version, the entry's headers on each, no request and no `GET` stream before the server
/// accepted `initialized`, and a `DELETE` of the session when the agent exits.
pub fn m10_tools_over_streamable_http_carry_the_session_and_end_with_delete(ctx: &Ctx) {
    let (s, [http_log]) = Scratch::with_files(["http.log"]);
    let fake = HttpFake::start(
        s.dir.path(),
        &[("FAKE_MCP_TOOLS", "echo"), ("FAKE_MCP_HTTP_LOG", &http_log)],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "remote__echo", json!({"text": "over http"}))]),
            Reply::text("done"),
        ])
        .servers([fake.entry("remote", &[("X-Team", "blue")])])
        .start();
    let r = agent.prompt(&sid, "echo over http");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs[0].tool_names(), ["remote__echo"]);
    assert_eq!(
        reqs[1].tool_results(),
        [("c1".to_string(), "over http".to_string())]
    );
    agent.finish();

    let log = wait_log(&http_log, "a DELETE at exit", |l| {
        l.iter().any(|e| e["method"] == "DELETE")
    });
    let sent = posts(&log);
    assert_eq!(sent[0], ("initialize".into(), None), "{log:#?}");
    let session = log[0]["headers"]["mcp-session-id"].as_str();
    assert!(session.is_none(), "initialize carries no session id");
    // Nothing goes out before `notifications/initialized` was accepted: separate POSTs could
    // reach the server in any order (the fake refuses a request before it with 400).
    let methods: Vec<&str> = sent.iter().map(|(m, _)| m.as_str()).collect();
    let initialized_at = log
        .iter()
        .position(|e| posted_method(e).as_deref() == Some("notifications/initialized"));
    let get_at = log.iter().position(|e| e["method"] == "GET");
    assert!(
        initialized_at.is_some() && get_at > initialized_at,
        "the GET stream after initialized: {log:#?}"
    );
    assert_eq!(
        methods,
        [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/call"
        ],
        "{log:#?}"
    );
    let given = log
        .iter()
        .skip(1)
        .filter_map(|e| e["session"].as_str())
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(
        given.len(),
        1,
        "one session id on every later request: {log:#?}"
    );
    for e in log.iter().skip(1) {
        assert!(e["session"].is_string(), "session id missing: {e}");
        assert_eq!(e["version"], "2025-11-25", "MCP-Protocol-Version: {e}");
        assert_ne!(e["status"], 400, "the fake refused a request: {e}");
    }
    for e in &log {
        assert_eq!(e["headers"]["x-team"], "blue", "the entry's header: {e}");
    }
    let gets: Vec<&Value> = log.iter().filter(|e| e["method"] == "GET").collect();
    assert!(
        gets.first()
            .is_some_and(|g| g["accept"] == "text/event-stream" && g["status"] == 200),
        "the GET stream for server messages: {log:#?}"
    );
    assert_eq!(
        log.iter().filter(|e| e["method"] == "DELETE").count(),
        1,
        "{log:#?}"
    );
}

/// M10: JSON answers, and a server restarted mid-session: the next request carries the old
/// session id, gets `404`, and the agent initializes a new session itself and sends the
/// request again; the tool call succeeds and the model never hears of it.
pub fn m10_a_restarted_server_gets_a_new_session_and_the_call_goes_through(ctx: &Ctx) {
    let (s, [http_log]) = Scratch::with_files(["http.log"]);
    let mut fake = HttpFake::start(
        s.dir.path(),
        &[
            ("FAKE_MCP_TOOLS", "echo"),
            ("FAKE_MCP_HTTP_MODE", "json"),
            ("FAKE_MCP_HTTP_LOG", &http_log),
        ],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "remote__echo", json!({"text": "before"}))]),
            Reply::text("one"),
            Reply::tool_calls(vec![("c2", "remote__echo", json!({"text": "after"}))]),
            Reply::text("two"),
        ])
        .servers([fake.entry("remote", &[])])
        .start();
    let r = agent.prompt(&sid, "first");
    assert_end_turn(&agent, &r);
    fake.restart();
    let r = agent.prompt(&sid, "second");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(
        reqs[3].tool_results().last().cloned(),
        Some(("c2".to_string(), "after".to_string())),
        "the call after the restart succeeded{}",
        agent.context()
    );
    let log = read_http_log(&http_log);
    let calls: Vec<&Value> = log.iter().filter(|e| e["method"] == "POST").collect();
    let expired = calls
        .iter()
        .position(|e| e["status"] == 404)
        .unwrap_or_else(|| panic!("no 404 after the restart: {log:#?}"));
    // `notifications/initialized` and the request sent again go out together: any order.
    let mut after: Vec<(String, u64)> = calls[expired + 1..]
        .iter()
        .take(3)
        .map(|e| {
            (
                crate::fake_mcp_http::posted_method(e).unwrap_or_default(),
                e["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        after.first(),
        Some(&("initialize".to_string(), 200)),
        "a new session first: {log:#?}"
    );
    after.sort();
    assert_eq!(
        after,
        [
            ("initialize".to_string(), 200),
            ("notifications/initialized".to_string(), 202),
            ("tools/call".to_string(), 200),
        ],
        "then the request again: {log:#?}"
    );
    assert_ne!(
        calls[expired]["session"],
        calls.last().map_or(Value::Null, |e| e["session"].clone()),
        "the request went again with the new session id"
    );
    agent.finish();
}

/// M10, M12: a server that sends its own requests on the `GET` stream and drops those with no
/// stream to take them (the TypeScript SDK's transport, as the conformance suite's
/// elicitation server uses it), behind a `GET` whose head is slow: the agent's requests wait
/// for that head, so the call's server requests reach the agent and are answered. Before,
/// `tools/list` and the call went out at once, the call's requests were lost and the call
/// waited for their answers (the suite's scenario hung about one run in thirty).
pub fn m10_server_requests_on_a_slow_get_stream_are_not_lost(ctx: &Ctx) {
    let s = Scratch::new();
    let http_log = s.file("http.log");
    let fake = HttpFake::start(
        s.dir.path(),
        &[
            ("FAKE_MCP_TOOLS", "echo"),
            ("FAKE_MCP_HTTP_MODE", "json"),
            ("FAKE_MCP_SERVER_REQUESTS", "1"),
            ("FAKE_MCP_HTTP_GET_DELAY_MS", "700"),
            ("FAKE_MCP_HTTP_DROP_UNROUTED", "1"),
            ("FAKE_MCP_HTTP_LOG", &http_log),
        ],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "remote__echo", json!({"text": "asked back"}))]),
            Reply::text("done"),
        ])
        .servers([fake.entry("remote", &[])])
        .start();
    let r = agent.prompt(&sid, "echo with server requests");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(
        reqs[1].tool_results(),
        [("c1".to_string(), "asked back".to_string())],
        "the call's server requests were answered{}",
        agent.context()
    );
    let log = read_http_log(&http_log);
    let get_at = log.iter().position(|e| e["method"] == "GET");
    let list_at = log
        .iter()
        .position(|e| posted_method(e).as_deref() == Some("tools/list"));
    assert!(
        get_at.is_some() && list_at > get_at,
        "tools/list after the GET stream answered: {log:#?}"
    );
    agent.finish();
}

/// M10: the legacy HTTP+SSE transport (`"type": "sse"`): the event stream's `endpoint`
/// receives every message, the answers come on the stream.
pub fn m10_a_legacy_sse_server_serves_tool_calls(ctx: &Ctx) {
    let s = Scratch::new();
    let fake = HttpFake::start(
        s.dir.path(),
        &[("FAKE_MCP_TOOLS", "echo"), ("FAKE_MCP_HTTP_MODE", "legacy")],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "old__echo", json!({"text": "legacy"}))]),
            Reply::text("done"),
        ])
        .servers([fake.entry("old", &[])])
        .start();
    let r = agent.prompt(&sid, "echo");
    assert_end_turn(&agent, &r);
    assert_eq!(
        llm.requests()[1].tool_results(),
        [("c1".to_string(), "legacy".to_string())]
    );
    agent.finish();
}

/// M10/H1–H6 on a remote server: an allowlisted HTTP server's `_Stop` objects once; the
/// objection reaches the model as on stdio, and the second call clears the turn.
pub fn m10_a_remote_stop_hook_objects_over_http(ctx: &Ctx) {
    let (s, [calls]) = Scratch::with_files(["calls.log"]);
    let fake = super::mcp_http_hooks::remote_hook(
        &s,
        &calls,
        &[
            ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
            ("FAKE_MCP_STOP_TEXT", "policy: add a changelog entry"),
        ],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("All done."),
            Reply::text("Changelog added."),
        ])
        .env(&[("MCP_HOOK_SERVERS", "policy")])
        .servers([fake.entry("policy", &[])])
        .start();
    let r = agent.prompt(&sid, "finish");
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one objection = one more LLM call");
    assert_eq!(
        reqs[1].tool_results().last().map(|(_, t)| t.clone()),
        Some(stop_json("policy", "policy: add a changelog entry")),
        "the objection, as on stdio"
    );
    assert_eq!(stop_calls(&calls).len(), 2, "objection, then empty");
    assert_eq!(
        fake_mcp::count_calls(&log_of(&calls), "_Other"),
        0,
        "H1: only hook names"
    );
    agent.finish();
}

/// M10, bad input: an unreachable URL fails `session/new` with the server's name and why; a
/// server refusing the request for want of a credential it has no OAuth for starts without
/// tools (M11); with the right `Authorization` header the same server starts, and the
/// credential is never logged.
pub fn m10_unusable_http_servers_fail_the_session_with_a_reason(ctx: &Ctx) {
    let s = Scratch::new();
    let token = "s3cret-token-1234";
    let fake = HttpFake::start(
        s.dir.path(),
        &[("FAKE_MCP_TOOLS", "echo"), ("FAKE_MCP_HTTP_TOKEN", token)],
    );
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "5")])
        .spawn();
    agent.initialize();
    let new =
        |servers: Value| agent.request("session/new", json!({"cwd": s.ws, "mcpServers": servers}));

    // Port 1 on loopback: nothing listens; the connection is refused at once.
    let r = new(
        json!([{"type": "http", "name": "gone", "url": "http://127.0.0.1:1/mcp", "headers": []}]),
    );
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(
        msg.contains("'gone'") && msg.contains("unreachable"),
        "{msg}"
    );

    // Without the header the agent tries to authorize it (SPEC M11), which this server does
    // not offer: it starts without tools, the session starts with a notice saying why.
    let r = new(json!([fake.entry("locked", &[])]));
    let notices = &agent.result(&r)["_meta"]["buzz"]["notices"];
    assert!(
        notices[0]
            .as_str()
            .is_some_and(|n| n.starts_with("MCP server 'locked' is not authorized: ")),
        "{r}"
    );

    let bearer = format!("Bearer {token}");
    let r = new(json!([fake.entry("locked", &[("Authorization", &bearer)])]));
    assert!(agent.result(&r)["sessionId"].is_string(), "{r}");
    assert!(
        !agent.stderr_text().contains(token),
        "the credential is never logged{}",
        agent.context()
    );
    agent.finish();
}
