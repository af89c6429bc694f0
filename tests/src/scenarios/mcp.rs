//! MCP server lifecycle: SPEC A2 (start-up failures), M1 (environment), M8 and P1 (shutdown) and
//! cases C08, C33, C34.

use super::setup::Setup;
use super::util::{
    Scratch, agent_requests_of, assert_exits_cleanly, assert_no_survivors, call_then_always,
    first_request, is_cancel_of, log_of, read_pids, wait_file, wait_logged_call,
};
use crate::fake_mcp::FAIL_START_STDERR;
use crate::harness::{AgentProc, Ctx, fake_mcp_entry};
use crate::procfs;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Waits until the agent has no descendant left (children exited and reaped).
fn assert_no_children_within(agent: &AgentProc, timeout: Duration, when: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        let left = procfs::descendants(agent.pid());
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{when}: processes survive ({}){}",
            procfs::describe_all(&left).join("; "),
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// C08/A2: `session/new` fails with -32000 naming the server, the cause and the stderr tail,
/// within the init timeout (servers start concurrently); started children are killed and
/// reaped; the agent goes on serving.
pub fn c08_mcp_start_failures_name_server_and_stderr(ctx: &Ctx) {
    let s = Scratch::new();
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "1")])
        .spawn();
    agent.initialize();
    let good = fake_mcp_entry("ok", &[]);
    let fail = |servers: Value, bound: Duration| -> String {
        let started = Instant::now();
        let r = agent.request("session/new", json!({"cwd": s.ws, "mcpServers": servers}));
        let took = started.elapsed();
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32000, "{r}");
        assert!(
            took < bound,
            "session/new took {took:?} (bound {bound:?}): {msg}"
        );
        assert_no_children_within(
            &agent,
            Duration::from_secs(6),
            &format!("after failure {msg:?}"),
        );
        msg
    };

    let msg = fail(
        json!([good, {"name": "missing", "command": "/nonexistent/bin/x", "args": [], "env": []}]),
        Duration::from_secs(10),
    );
    let lower = msg.to_lowercase();
    assert!(msg.contains("missing"), "names the server: {msg}");
    assert!(
        ["no such file", "not found", "enoent", "os error 2"]
            .iter()
            .any(|k| lower.contains(k)),
        "names the spawn error: {msg}"
    );

    let msg = fail(
        json!([{"name": "crash", "command": "sh", "args": ["-c", "echo boom >&2; exit 3"], "env": []}, good]),
        Duration::from_secs(10),
    );
    assert!(msg.contains("crash"), "names the server: {msg}");
    assert!(msg.contains("boom"), "carries the stderr tail: {msg}");
    assert!(
        msg.contains('3') && msg.to_lowercase().contains("exit"),
        "names the exit status: {msg}"
    );

    let msg = fail(
        json!([fake_mcp_entry("failer", &[("FAKE_MCP_FAIL_START", "1")])]),
        Duration::from_secs(10),
    );
    assert!(
        msg.contains("failer") && msg.contains(FAIL_START_STDERR),
        "{msg}"
    );

    // Three silent servers with a 1 s handshake bound: concurrent, so well under 3 s.
    let mute = |name: &str| json!({"name": name, "command": "sh", "args": ["-c", "cat >/dev/null"], "env": []});
    let msg = fail(
        json!([
            mute("mute1"),
            fake_mcp_entry("silent", &[("FAKE_MCP_NO_INIT_REPLY", "1")]),
            mute("mute2"),
            good
        ]),
        Duration::from_millis(2500),
    );
    let lower = msg.to_lowercase();
    assert!(
        ["mute1", "mute2", "silent"].iter().any(|n| msg.contains(n)),
        "names a server: {msg}"
    );
    assert!(
        lower.contains("timeout") || lower.contains("timed out"),
        "names the timeout: {msg}"
    );

    let err = agent.stderr_text();
    assert!(
        err.contains("missing") && err.contains("boom"),
        "failures are logged{}",
        agent.context()
    );
    let sid = agent.new_session(&s.ws, json!([fake_mcp_entry("ok", &[])]));
    assert!(!sid.is_empty());
    agent.finish();
}

/// M8/P1/C33/C34: EOF on stdin during a running (60 s) tool call: the turn is cancelled
/// (`notifications/cancelled` to the server, prompt answered `cancelled`), every server is shut
/// down — including one that ignores SIGTERM and EOF — with its grandchild, and the agent exits
/// 0 within about 5 s (close, 2 s, TERM, 2 s, KILL).
pub fn m8_p1_c33_stdin_eof_reaps_children_and_grandchildren(ctx: &Ctx) {
    let (s, [pid_a, pid_b, log_a]) = Scratch::with_files(["a.pids", "b.pids", "a.log"]);
    let a = fake_mcp_entry(
        "a",
        &[
            ("FAKE_MCP_TOOLS", "slow"),
            ("FAKE_MCP_GRANDCHILD_PIDFILE", &pid_a),
            ("FAKE_MCP_CALL_LOG", &log_a),
        ],
    );
    let b = fake_mcp_entry(
        "b",
        &[
            ("FAKE_MCP_IGNORE_TERM", "1"),
            ("FAKE_MCP_GRANDCHILD_PIDFILE", &pid_b),
        ],
    );
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(call_then_always(
            "a__slow",
            json!({"ms": 60000}),
            "unexpected extra round",
        ))
        .servers([a, b])
        .start();
    let (server_a, grand_a) = read_pids(&pid_a);
    let (server_b, grand_b) = read_pids(&pid_b);
    for (server, grand) in [(server_a, grand_a), (server_b, grand_b)] {
        let st = procfs::stat(server).unwrap_or_else(|| panic!("server {server} is not running"));
        assert_eq!(
            st.pgid, server,
            "M1: each server leads its own process group: {st:?}"
        );
        assert_eq!(
            procfs::stat(grand).map(|g| g.pgid),
            Some(server),
            "grandchild in the server's group"
        );
    }

    let prompt = agent.start_prompt(&sid, "run the slow tool");
    agent.wait_until(
        "the slow tool call to start",
        Duration::from_secs(20),
        |t| {
            t.iter()
                .any(|m| m["params"]["update"]["status"] == "in_progress")
        },
    );
    let call_id = wait_logged_call(&agent, &log_a, "slow");
    let mut watched = procfs::descendants(agent.pid());
    watched.extend([server_a, grand_a, server_b, grand_b]);

    assert_exits_cleanly(
        &agent,
        Duration::from_secs(8),
        Duration::from_secs(6),
        "P1/C33: EOF with a stubborn server",
        || agent.close_stdin(),
    );
    assert_no_survivors(
        &watched,
        &[server_a, server_b],
        Duration::from_secs(1),
        "M8: after the agent exited",
    );
    let log = log_of(&log_a);
    assert!(
        log.iter().any(|m| is_cancel_of(m, &call_id)),
        "P1/A4: the in-flight call {call_id} gets notifications/cancelled: {log:#?}"
    );
    let r = agent.wait_response(&prompt, Duration::from_secs(2));
    assert_eq!(
        agent.result(&r)["stopReason"],
        "cancelled",
        "P1: the pending prompt is answered: {r}"
    );
    assert_eq!(llm.requests().len(), 1, "no LLM round after EOF");
    agent.finish();
}

/// SPEC M1, S1: a server gets the allowlisted part of the agent's environment (HOME, PATH, the
/// locale, TZ …), what `BUZZ_AGENT_CHILD_ENV` adds, and the client's entries (which win);
/// nothing else: no provider key, no `BUZZ_AGENT_*`, no `GITHUB_TOKEN`, AWS key or
/// `SSH_AUTH_SOCK`.
pub fn m1_children_do_not_get_agent_secrets(ctx: &Ctx) {
    let (s, [dump_a, dump_b]) = Scratch::with_files(["env-a.json", "env-b.json"]);
    let a = fake_mcp_entry(
        "a",
        &[
            ("FAKE_MCP_ENV_DUMP", &dump_a),
            ("LANG", "from-client"),
            ("CLIENT_ONLY", "yes"),
        ],
    );
    let b = json!({
        "name": "b",
        "command": crate::harness::current_exe(),
        "env": {"BUZZ_E2E_ROLE": "fake-mcp", "FAKE_MCP_ENV_DUMP": dump_b, "MAPVAR": "1"},
    });
    let (_llm, agent, _sid) = Setup::new(ctx, &s)
        .env(&[
            ("ANTHROPIC_API_KEY", "sk-ant-secret"),
            ("MCP_HOOK_SERVERS", "*"),
            ("BUZZ_AGENT_MAX_ROUNDS", "50"),
            ("BUZZ_AGENT_CHILD_ENV", "E2E_EXTRA_*, E2E_NAMED"),
            ("GITHUB_TOKEN", "ghp-secret"),
            ("AWS_SECRET_ACCESS_KEY", "aws-secret"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-secret.sock"),
            ("HF_TOKEN", "hf-secret"),
            ("E2E_NOT_LISTED", "hidden"),
            ("E2E_EXTRA_ONE", "1"),
            ("E2E_EXTRA_TWO", "2"),
            ("E2E_NAMED", "named"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TZ", "UTC"),
        ])
        .servers([a, b])
        .start();
    let read = |p: &str| -> serde_json::Map<String, Value> {
        serde_json::from_str(&wait_file(p, Duration::from_secs(5))).expect("env dump is JSON")
    };
    let (env_a, env_b) = (read(&dump_a), read(&dump_b));
    let keys = |env: &serde_json::Map<String, Value>| -> Vec<String> {
        let mut k: Vec<String> = env.keys().cloned().collect();
        k.sort();
        k
    };
    let inherited = [
        "E2E_EXTRA_ONE",
        "E2E_EXTRA_TWO",
        "E2E_NAMED",
        "HOME",
        "LANG",
        "LC_ALL",
        "PATH",
        "TZ",
    ];
    let expect = |client: &[&str]| -> Vec<String> {
        let mut k: Vec<String> = inherited
            .iter()
            .chain(client)
            .map(|s| (*s).to_string())
            .collect();
        k.sort();
        k.dedup();
        k
    };
    assert_eq!(
        keys(&env_a),
        expect(&["BUZZ_E2E_ROLE", "CLIENT_ONLY", "FAKE_MCP_ENV_DUMP", "LANG"]),
        "S1: exactly the allowlist, BUZZ_AGENT_CHILD_ENV's names and the client's entries"
    );
    assert_eq!(
        keys(&env_b),
        expect(&["BUZZ_E2E_ROLE", "FAKE_MCP_ENV_DUMP", "MAPVAR"])
    );
    for env in [&env_a, &env_b] {
        for v in env.values() {
            let v = v.as_str().unwrap_or_default();
            assert!(
                !v.contains("secret") && !v.contains("sk-test"),
                "a secret leaked: {v}"
            );
        }
        assert_eq!(env["E2E_EXTRA_ONE"], "1");
        assert_eq!(env["TZ"], "UTC");
    }
    assert_eq!(env_a["LANG"], "from-client", "the client's entries win");
    assert_eq!(env_b["LANG"], "C.UTF-8");
    assert_eq!(env_a["CLIENT_ONLY"], "yes");
    assert_eq!(env_b["MAPVAR"], "1", "A2: env given as an object map");
    assert!(
        !agent.stderr_text().contains("sk-ant-secret"),
        "P2: a key in the logs"
    );
    agent.finish();
}

/// M13: a server's `roots/list` is answered with the session cwd and then the client's
/// `additionalDirectories` (a repeat and the cwd itself dropped), as `file://` URIs with the
/// path percent-encoded, each named by its last component; `initialize` declared `roots`.
/// A relative additional directory is `-32602` like a relative cwd.
pub fn m13_roots_list_answers_the_cwd_and_the_additional_directories(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["fs.log"]);
    let lib = s
        .dir
        .path()
        .canonicalize()
        .expect("canonical")
        .join("my lib");
    std::fs::create_dir(&lib).expect("mkdir lib");
    let lib = lib.to_str().expect("UTF-8").to_string();
    let ws = s.ws.to_str().expect("UTF-8").to_string();
    let (_llm, agent) = Setup::new(ctx, &s).spawn();
    agent.initialize();
    let server = fake_mcp_entry(
        "fs",
        &[
            ("FAKE_MCP_SERVER_REQUESTS", "1"),
            ("FAKE_MCP_CALL_LOG", &log),
        ],
    );
    let r = agent.request(
        "session/new",
        json!({"cwd": ws, "additionalDirectories": [lib, ws, lib], "mcpServers": [server]}),
    );
    assert!(agent.result(&r)["sessionId"].is_string(), "{r}");
    let answer = |log: &str| -> Option<Value> {
        log_of(log)
            .into_iter()
            .find(|m| m["id"] == "init-2" && m.get("method").is_none())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while answer(&log).is_none() {
        assert!(
            Instant::now() < deadline,
            "no roots/list answer logged{}",
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let logged = log_of(&log);
    let init = first_request(&logged, "initialize");
    assert_eq!(
        init["params"]["capabilities"]["roots"],
        json!({"listChanged": false}),
        "{init}"
    );
    let encoded = lib.replace(' ', "%20");
    assert_eq!(
        answer(&log).expect("answered")["result"],
        json!({"roots": [
            {"uri": format!("file://{ws}"), "name": "ws"},
            {"uri": format!("file://{encoded}"), "name": "my lib"}
        ]})
    );
    let bad = agent.request(
        "session/new",
        json!({"cwd": ws, "additionalDirectories": ["relative"], "mcpServers": []}),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    agent.finish();
}

/// M12: a client that presents forms (`clientCapabilities.elicitation.form`) gets a server's
/// `elicitation/create` as its own, with the server named in the message; `initialize` to the
/// server declared `elicitation: {form: {}}`; the client's `accept` with the field left out
/// reaches the server with the schema's default filled in. The model never sees it.
pub fn m12_a_server_elicitation_goes_to_a_client_that_presents_forms_and_back(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["fs.log"]);
    let (llm, agent) = Setup::new(ctx, &s).spawn();
    agent.set_elicitation_answer(|_| Some(json!({"action": "accept", "content": {}})));
    let init = agent.request(
        "initialize",
        json!({"protocolVersion": 1,
               "clientCapabilities": {"elicitation": {"form": {}}},
               "clientInfo": {"name": "buzz-agent-e2e", "version": "0"}}),
    );
    assert!(init.get("result").is_some(), "{init}");
    let server = fake_mcp_entry(
        "fs",
        &[
            ("FAKE_MCP_SERVER_REQUESTS", "1"),
            ("FAKE_MCP_CALL_LOG", &log),
        ],
    );
    let _sid = agent.new_session(&s.ws, json!([server]));
    let answer = |log: &str| -> Option<Value> {
        log_of(log)
            .into_iter()
            .find(|m| m["id"] == "init-4" && m.get("method").is_none())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while answer(&log).is_none() {
        assert!(
            Instant::now() < deadline,
            "no elicitation answer logged{}",
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        answer(&log).expect("answered")["result"],
        json!({"action": "accept", "content": {"choice": "a"}}),
        "the default of the field the user left out"
    );
    let asked = agent_requests_of(&agent, "elicitation/create");
    assert_eq!(asked.len(), 1, "{asked:#?}");
    let params = &asked[0]["params"];
    assert_eq!(params["mode"], "form");
    assert_eq!(params["message"], "MCP server 'fs' asks: pick");
    assert_eq!(
        params["requestedSchema"]["properties"]["choice"]["default"],
        "a"
    );
    assert!(params["sessionId"].is_string(), "{params}");
    let logged = log_of(&log);
    let init = first_request(&logged, "initialize");
    assert_eq!(
        init["params"]["capabilities"]["elicitation"],
        json!({"form": {}})
    );
    assert!(llm.requests().is_empty(), "no prompt, no model request");
    agent.finish();
}
