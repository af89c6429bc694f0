//! Remote servers that fail or send bad input (SPEC M10 with A2, M5, M9; docs/limits.md): a
//! proxy's HTML error page, a `500` cutting an event stream, a server that never answers
//! `initialize`, an event stream that never ends, a 10 MiB JSON body, a redirect loop. Each
//! gives the client an answer naming the server and what went wrong, within the configured
//! timeouts; a failure after the start costs only that call, the session's other server keeps
//! serving. The server is [`HttpFake`] with `FAKE_MCP_HTTP_FAULT`.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn};
use crate::fake_llm::Reply;
use crate::fake_mcp_http::HttpFake;
use crate::harness::{Ctx, fake_mcp_entry};
use crate::procfs;
use serde_json::json;
use std::time::{Duration, Instant};

/// A2/M10: a server whose start fails makes `session/new` fail with `-32000` naming it and
/// the cause, the other server of the request stopped with it, in bounded time: an HTML `502`
/// page (not quoted), a redirect loop (never followed), a server that never answers
/// `initialize` (its event stream kept open with keep-alives: the handshake timeout), an
/// `https://` server whose TLS fails.
pub fn m10_a2_a_remote_server_that_cannot_start_fails_session_new_with_its_name_and_why(ctx: &Ctx) {
    let s = Scratch::new();
    let handshake = [("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "2")];
    let (_llm, agent) = Setup::new(ctx, &s).env(&handshake).spawn();
    agent.initialize();
    let cases: [(&str, (&str, &str), &str); 3] = [
        (
            "html",
            ("FAKE_MCP_HTTP_FAULT", "initialize=html"),
            "HTTP 502 (Bad Gateway)",
        ),
        (
            "loop",
            ("FAKE_MCP_HTTP_FAULT", "initialize=redirect"),
            "redirects are not followed",
        ),
        ("silent", ("FAKE_MCP_NO_INIT_REPLY", "1"), "timed out"),
    ];
    for (name, fault, cause) in cases {
        let fake = HttpFake::start(s.dir.path(), &[("FAKE_MCP_TOOLS", "echo"), fault]);
        let started = Instant::now();
        let r = agent.request_timeout(
            "session/new",
            json!({"cwd": s.ws, "mcpServers": [fake_mcp_entry("fs", &[]), fake.entry(name, &[])]}),
            Duration::from_secs(20),
        );
        let took = started.elapsed();
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32000, "{r}");
        assert!(
            msg.contains(&format!("'{name}'")) && msg.contains(cause),
            "{name}: {msg}"
        );
        assert!(
            !msg.contains("<html"),
            "{name}: an HTML page is not quoted: {msg}"
        );
        assert!(
            took < Duration::from_secs(10),
            "{name}: within the 2 s handshake timeout and the stop: {took:?}"
        );
    }
    // An `https://` server whose TLS handshake fails (it answers garbage).
    let url = format!("https://{}/mcp", super::oauth::garbage_server());
    let r = agent.request_timeout(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": [{"type": "http", "name": "tls", "url": url, "headers": []}]}),
        Duration::from_secs(20),
    );
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(
        msg.contains("'tls' is unreachable: cannot connect to https://"),
        "tls: {msg}"
    );
    agent.finish();
}

/// M5/M10: failures after the start cost the call, not the session: a proxy's `502` page, a
/// `500` cutting the event stream (resumption refused too), and a stream with no answer that
/// never ends (the tool timeout, then M5 kills the server: for HTTP its session is dropped)
/// each fail the remote call with an error naming the server, and the stdio server of the same
/// session serves the next call; a stream that never ends after its response does not hold
/// the call; a 10 MiB JSON result is served, cut to the tool-result cap, the agent's memory
/// staying far below the 16 MiB body cap plus its own size (docs/limits.md).
pub fn m10_m5_a_remote_call_that_fails_or_floods_leaves_the_other_server_serving(ctx: &Ctx) {
    let s = Scratch::new();
    // Per session: the remote call, the local call, a final text.
    let (llm, agent) = Setup::new(ctx, &s)
        .handler(|i, _| match i % 3 {
            0 => Reply::tool_calls(vec![("r", "bad__echo", json!({"text": "remote"}))]),
            1 => Reply::tool_calls(vec![("l", "fs__echo", json!({"text": "local"}))]),
            _ => Reply::text("done"),
        })
        .env(&[("BUZZ_AGENT_TOOL_TIMEOUT_SECS", "3")])
        .spawn();
    agent.initialize();
    let cases: [(&str, &str, Option<&str>); 5] = [
        ("html", "tools/call=html", Some("HTTP 502 (Bad Gateway)")),
        (
            "mid500",
            "tools/call=mid500",
            Some("gave no response: the event stream broke"),
        ),
        ("endless", "tools/call=endless", None),
        ("big", "tools/call=big", None),
        ("silent", "", Some("timed out")),
    ];
    for (n, (case, fault, error)) in cases.into_iter().enumerate() {
        let mut env = vec![("FAKE_MCP_TOOLS", "echo"), ("FAKE_MCP_HTTP_FAULT", fault)];
        if case == "silent" {
            env.push(("FAKE_MCP_DELAY_MS", "600000"));
        }
        let fake = HttpFake::start(s.dir.path(), &env);
        let sid = agent.new_session(
            &s.ws,
            json!([fake_mcp_entry("fs", &[]), fake.entry("bad", &[])]),
        );
        let started = Instant::now();
        let r = agent.prompt_timeout(&sid, case, Duration::from_secs(30));
        assert_end_turn(&agent, &r);
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "{case}: bounded by the 3 s tool timeout and the resumption waits: {took:?}"
        );
        let reqs = llm.requests();
        let remote = reqs[3 * n + 1].tool_result_for("r").unwrap_or_default();
        match error {
            // A timeout's text is the stdio one (M5): the tool's name carries the server.
            Some(cause) => assert!(
                remote.contains(cause) && (case == "silent" || remote.contains("MCP server 'bad'")),
                "{case}: {remote}{}",
                agent.context()
            ),
            None if case == "big" => assert!(
                remote.starts_with("xxx") && remote.len() < 100 * 1024,
                "{case}: cut to the tool-result cap: {} bytes",
                remote.len()
            ),
            None => assert_eq!(remote, "remote", "{case}{}", agent.context()),
        }
        assert!(!remote.contains("<html"), "{case}: {remote}");
        assert_eq!(
            reqs[3 * n + 2].tool_result_for("l").as_deref(),
            Some("local"),
            "{case}: the other server keeps serving{}",
            agent.context()
        );
    }
    let hwm = procfs::peak_rss_kib(agent.pid()).expect("the agent's VmHWM");
    assert!(
        hwm < 160 * 1024,
        "a 10 MiB body held at most once or twice: peak RSS {hwm} KiB"
    );
    agent.finish();
}
