//! ACP surface and framing: SPEC T1–T5, A1–A5 and cases C01, C03, C07.

use super::setup::Setup;
use super::util::{Scratch, path_str, wait_file, wait_stderr};
use crate::fake_llm::{FakeLlm, Reply};
use crate::harness::{Ctx, agent_text, fake_mcp_entry};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn line(v: &Value) -> Vec<u8> {
    let mut l = v.to_string().into_bytes();
    l.push(b'\n');
    l
}

/// A1: the initialize result, min(client, 1), string ids echoed (T5), bad versions -32602.
pub fn a1_initialize_capabilities(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent) = Setup::new(ctx, &s).spawn();
    let r = agent.initialize();
    assert_eq!(r["protocolVersion"], json!(1), "{r}");
    let caps = &r["agentCapabilities"];
    // A9: sessions are saved (the harness gives every agent a state directory of its own).
    assert_eq!(caps["loadSession"], true, "{r}");
    assert_eq!(
        caps["sessionCapabilities"],
        json!({"close": {}, "list": {}, "resume": {}, "additionalDirectories": {}}),
        "{r}"
    );
    assert_eq!(
        caps["promptCapabilities"],
        json!({"image": false, "audio": false, "embeddedContext": true}),
        "{r}"
    );
    assert_eq!(
        caps["mcpCapabilities"],
        json!({"http": true, "sse": true}),
        "{r}"
    );
    assert_eq!(r["agentInfo"]["name"], "buzz-agent", "{r}");
    assert_eq!(r["agentInfo"]["version"], env!("CARGO_PKG_VERSION"), "{r}");
    assert_eq!(r["authMethods"], json!([]), "{r}");

    // A newer client gets our version; calling initialize again is allowed.
    let again = agent.request(
        "initialize",
        json!({"protocolVersion": 7, "clientCapabilities": {}}),
    );
    assert_eq!(agent.result(&again)["protocolVersion"], json!(1), "{again}");

    // T5: a string id comes back as the same string.
    agent.send_raw(&line(
        &json!({"jsonrpc": "2.0", "id": "init-str", "method": "initialize",
                                  "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
    ));
    let r = agent.wait_response(&json!("init-str"), Duration::from_secs(30));
    assert_eq!(r["id"], json!("init-str"));
    assert_eq!(agent.result(&r)["protocolVersion"], json!(1));

    // A1: a missing or non-integer version is -32602.
    for params in [
        json!({"clientCapabilities": {}}),
        json!({"protocolVersion": "1"}),
        json!({"protocolVersion": 1.5}),
    ] {
        let r = agent.request("initialize", params.clone());
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32602, "initialize {params}: {msg}");
    }
    assert!(
        llm.requests().is_empty(),
        "initialize must not call the LLM"
    );
    agent.finish();
}

/// C01 / T1 / T4 / T7: garbage, blank, whitespace, BOM + CRLF lines; the agent keeps serving,
/// answers each bad line at most once with -32700 and id null, and drops a truncated last line.
pub fn c01_garbage_and_bom_lines_keep_serving(ctx: &Ctx) {
    let s = Scratch::new();
    let (_llm, agent) = Setup::new(ctx, &s).spawn();
    let long_garbage = format!("{}\n", "x".repeat(1000));
    agent.send_raw(b"Welcome back user\n");
    agent.send_raw(b"\n");
    agent.send_raw(b"   \t \r\n");
    agent.send_raw(b"stitem parent list node; CSS resets require\n");
    agent.send_raw(b"\xff\xfe not utf-8 \xc3\n");
    agent.send_raw(long_garbage.as_bytes());
    let bad_lines = 4;
    let mut init = b"\xEF\xBB\xBF".to_vec();
    init.extend_from_slice(
        br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
    );
    init.extend_from_slice(b"\r\n");
    agent.send_raw(&init);
    agent.send_raw(&line(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                                  "params": {"cwd": path_str(&s.ws), "mcpServers": []}}),
    ));

    let r0 = agent.wait_response(&json!(0), Duration::from_secs(30));
    assert_eq!(agent.result(&r0)["protocolVersion"], json!(1), "{r0}");
    let r1 = agent.wait_response(&json!(1), Duration::from_secs(30));
    assert!(agent.result(&r1)["sessionId"].is_string(), "{r1}");

    let nulls = agent.null_id_responses();
    assert!(
        nulls.len() <= bad_lines,
        "more than one reply per bad line: {nulls:#?}"
    );
    for n in &nulls {
        assert_eq!(
            n["error"]["code"], -32700,
            "a bad line must be answered -32700: {n}"
        );
    }
    // The log line may reach stderr after the frames (the agent's log has its own writer).
    wait_stderr(&agent, "Welcome back user", Duration::from_secs(20));
    let err = agent.stderr_text();
    assert!(
        !err.contains(&"x".repeat(600)),
        "a bad line is logged cut to about 200 bytes, not whole{}",
        agent.context()
    );

    // T7: a partial last line at EOF gets no answer; the agent exits cleanly.
    agent.send_raw(br#"{"jsonrpc":"2.0","id":9,"method":"#);
    agent.close_stdin();
    let status = agent.wait_exit(Duration::from_secs(8));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit after EOF: {status:?}{}",
        agent.context()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        agent.response(&json!(9)).is_none(),
        "a truncated line must not be answered"
    );
    assert_eq!(
        agent.null_id_responses().len(),
        nulls.len(),
        "the truncated line was answered"
    );
    agent.finish();
}

/// Every response on stdout with id `id` (a request answered twice shows up twice).
fn answers(agent: &crate::harness::AgentProc, id: i64) -> Vec<Value> {
    agent
        .transcript()
        .into_iter()
        .filter(|m| m.get("method").is_none() && m.get("id") == Some(&json!(id)))
        .collect()
}

/// T3 (amended), C50: a line over BUZZ_AGENT_MAX_LINE_BYTES is discarded, answered once with
/// -32600 carrying the request's own id, and the next lines are served; lines under the cap
/// work.
pub fn t3_oversized_line_is_answered_once_and_reading_continues(ctx: &Ctx) {
    let s = Scratch::new();
    let (_llm, agent) = Setup::new(ctx, &s)
        .env(&[("BUZZ_AGENT_MAX_LINE_BYTES", "1024")])
        .spawn();
    let init = |id: i64, pad: usize| {
        line(&json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
                      "params": {"protocolVersion": 1, "clientCapabilities": {}, "_pad": "p".repeat(pad)}}))
    };
    let big = init(77, 5000);
    assert!(big.len() > 5000);
    for piece in big.chunks(700) {
        agent.send_raw(piece);
        std::thread::sleep(Duration::from_millis(2));
    }
    let small = init(78, 700);
    assert!(small.len() < 1024);
    agent.send_raw(&small);
    let r = agent.wait_response(&json!(78), Duration::from_secs(30));
    assert_eq!(agent.result(&r)["protocolVersion"], json!(1));
    let long = answers(&agent, 77);
    assert_eq!(
        long.len(),
        1,
        "exactly one answer to the long line: {long:#?}"
    );
    assert_eq!(long[0]["error"]["code"], -32600, "{}", long[0]);
    let msg = long[0]["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        msg.contains("too long") || msg.contains("exceed") || msg.contains("too large"),
        "{msg}"
    );
    assert!(
        agent.null_id_responses().is_empty(),
        "the long line's id is readable: no id:null answer"
    );

    // Two long lines in one write, then a good one: one answer each, with its id.
    let mut both = init(79, 3000);
    both.extend(init(80, 9000));
    both.extend(init(81, 10));
    agent.send_raw(&both);
    let r = agent.wait_response(&json!(81), Duration::from_secs(30));
    assert_eq!(agent.result(&r)["protocolVersion"], json!(1));
    for id in [79, 80] {
        let a = answers(&agent, id);
        assert_eq!(a.len(), 1, "one answer per long line: {a:#?}");
        assert_eq!(a[0]["error"]["code"], -32600, "{}", a[0]);
    }
    assert!(agent.null_id_responses().is_empty());

    // A long line without a readable id still gets its one answer, with id null.
    let mut no_id = line(&json!({"jsonrpc": "2.0", "method": "initialize",
        "params": {"_pad": "n".repeat(4000)}}));
    no_id.extend(init(82, 10));
    agent.send_raw(&no_id);
    agent.wait_response(&json!(82), Duration::from_secs(30));
    let nulls = agent.null_id_responses();
    assert_eq!(nulls.len(), 1, "{nulls:#?}");
    assert_eq!(nulls[0]["error"]["code"], -32600);
    agent.finish();
}

/// C50: a 5 MiB `session/prompt` line (an @-mentioned big file) with the default 4 MiB cap is
/// answered `-32600` with its own id 103, the agent's memory stays bounded (the line is never
/// buffered whole), and the session keeps working.
pub fn c50_a_request_over_the_line_cap_is_answered_with_its_own_id(ctx: &Ctx) {
    let s = Scratch::new();
    let (_llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("small answer")])
        .start();
    let rss_before = crate::procfs::peak_rss_kib(agent.pid());
    let big = "b".repeat(5 * 1024 * 1024);
    let frame = line(
        &json!({"jsonrpc": "2.0", "id": 103, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "resource",
            "resource": {"uri": "file:///big.txt", "mimeType": "text/plain", "text": big}}]}}),
    );
    drop(big);
    for piece in frame.chunks(64 * 1024) {
        agent.send_raw(piece);
    }
    let r = agent.wait_response(&json!(103), Duration::from_secs(60));
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(answers(&agent, 103).len(), 1);
    assert!(agent.null_id_responses().is_empty());
    let rss_after = crate::procfs::peak_rss_kib(agent.pid());
    if let (Some(before), Some(after)) = (rss_before, rss_after) {
        // The 4 MiB head may be held once; the 5 MiB line is never held whole.
        assert!(
            after < before + 4 * 1024 + 1024,
            "peak RSS grew from {before} KiB to {after} KiB{}",
            agent.context()
        );
    }
    // The session stays usable.
    let p = agent.prompt(&sid, "small");
    assert_eq!(agent.result(&p)["stopReason"], "end_turn", "{p}");
    agent.finish();
}

/// T4 / A5: unknown methods -32601, unknown notifications ignored, undecodable params -32602
/// naming method and field, non-JSON-RPC values -32600 (id echoed when readable), and the
/// agent keeps working after each.
pub fn t4_unknown_method_bad_params_invalid_request(ctx: &Ctx) {
    let s = Scratch::new();
    let ws = path_str(&s.ws);
    let (llm, agent) = Setup::new(ctx, &s).spawn();
    agent.initialize();

    let r = agent.request("foo/bar", json!({}));
    assert_eq!(agent.error(&r).0, -32601, "{r}");
    agent.send(&json!({"jsonrpc": "2.0", "method": "foo/notify", "params": {}}));
    for (method, params) in [
        ("authenticate", json!({"methodId": "x"})),
        ("session/set_mode", json!({"sessionId": "s", "modeId": "m"})),
    ] {
        let r = agent.request(method, params);
        assert_eq!(agent.error(&r).0, -32601, "{method} (A5): {r}");
    }

    let bad = |method: &str, params: Value, field: &str| {
        let r = agent.request(method, params.clone());
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32602, "{method} {params}: {msg}");
        assert!(
            msg.contains(method),
            "the message names the method {method}: {msg}"
        );
        assert!(
            msg.contains(field),
            "the message names the field {field}: {msg}"
        );
    };
    bad("session/new", json!({"cwd": 5, "mcpServers": []}), "cwd");
    bad(
        "session/new",
        json!({"cwd": ws, "mcpServers": "none"}),
        "mcpServers",
    );
    let sid = agent.new_session(&s.ws, json!([]));
    bad("session/prompt", json!({"sessionId": sid}), "prompt");
    bad(
        "session/prompt",
        json!({"sessionId": sid, "prompt": "hi"}),
        "prompt",
    );
    // A3: images are not advertised.
    let r = agent.request(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]}),
    );
    assert_eq!(agent.error(&r).0, -32602, "image block: {r}");

    agent.send_raw(b"[]\n");
    agent.send_raw(b"{\"foo\":1}\n");
    agent.send_raw(b"{\"jsonrpc\":\"1.0\",\"id\":\"abc\",\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n");
    agent.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":5}\n");
    for id in [json!("abc"), json!(8)] {
        let r = agent.wait_response(&id, Duration::from_secs(30));
        assert_eq!(agent.error(&r).0, -32600, "{r}");
    }
    // A4: session/cancel sent as a request is answered null, even for an unknown session.
    let r = agent.request("session/cancel", json!({"sessionId": "nope"}));
    assert_eq!(agent.result(&r), &Value::Null, "{r}");

    agent.initialize();
    let nulls = agent.null_id_responses();
    assert_eq!(
        nulls.len(),
        2,
        "one -32600 for [] and one for {{\"foo\":1}}: {nulls:#?}"
    );
    assert!(
        nulls.iter().all(|n| n["error"]["code"] == -32600),
        "{nulls:#?}"
    );
    assert!(llm.requests().is_empty(), "no LLM call was due");
    agent.finish();
}

/// C03 / A3: a prompt for an unknown or empty session id is -32002 `session not found: <id>`
/// with `data.sessionId`, creates nothing, and the agent stays usable.
pub fn c03_unknown_session_is_32002_everywhere(ctx: &Ctx) {
    let s = Scratch::new();
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("hello")])
        .spawn();
    agent.initialize();
    for sid in ["sess-does-not-exist", "", "sess-does-not-exist"] {
        let r = agent.prompt(sid, "hi");
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32002, "prompt on {sid:?}: {r}");
        assert_eq!(msg, format!("session not found: {sid}"), "{r}");
        assert_eq!(
            r["error"]["data"]["sessionId"],
            json!(sid),
            "data carries the id (C03): {r}"
        );
    }
    // A9: session/load and session/resume of an unknown session are -32002 too.
    for method in ["session/load", "session/resume"] {
        for named in [
            "sess-does-not-exist",
            "sess_9f86d081884c7d659a2feaa0c55ad015",
        ] {
            let r = agent.request(
                method,
                json!({"sessionId": named, "cwd": path_str(&s.ws), "mcpServers": []}),
            );
            assert_eq!(agent.error(&r).0, -32002, "{method} {named}: {r}");
            assert_eq!(r["error"]["data"]["sessionId"], named, "{r}");
        }
    }
    // A5: set_model on an unknown session is -32602.
    let r = agent.request(
        "session/set_model",
        json!({"sessionId": "sess-does-not-exist", "modelId": "m"}),
    );
    assert_eq!(agent.error(&r).0, -32602, "{r}");
    // A4: cancel for an unknown session is ignored (no answer to the notification).
    agent.send(&json!({"jsonrpc": "2.0", "method": "session/cancel",
                       "params": {"sessionId": "sess-does-not-exist"}}));

    let sid = agent.new_session(&s.ws, json!([]));
    assert_ne!(sid, "sess-does-not-exist");
    let r = agent.prompt(&sid, "hi");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert_eq!(agent_text(&agent.session_updates(&sid)), "hello");
    assert!(
        agent.null_id_responses().is_empty(),
        "the cancel notification was answered"
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "unknown-session prompts must not reach the LLM"
    );
    agent.finish();
}

/// C07 / A2: relative, `~`, empty and missing cwd are -32602 `cwd must be an absolute path`
/// with `data.cwd`; MCP servers run in the session cwd, not the agent's (started in `/`).
pub fn c07_relative_cwd_rejected(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = FakeLlm::scripted(vec![]);
    let agent = ctx.agent(&llm, &[], std::path::Path::new("/"));
    agent.initialize();
    for cwd in [".", "~", "", "rel/dir", "~/ws", "./ws"] {
        let r = agent.request("session/new", json!({"cwd": cwd, "mcpServers": []}));
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32602, "cwd {cwd:?}: {r}");
        assert!(
            msg.contains("cwd must be an absolute path"),
            "cwd {cwd:?}: {msg}"
        );
        assert_eq!(
            r["error"]["data"]["cwd"],
            json!(cwd),
            "data carries the cwd (C07): {r}"
        );
    }
    let r = agent.request("session/new", json!({"mcpServers": []}));
    assert_eq!(agent.error(&r).0, -32602, "missing cwd: {r}");
    // A nonexistent absolute path: either rejected with -32602 or accepted (documented choice).
    let r = agent.request(
        "session/new",
        json!({"cwd": "/does/not/exist/buzz-e2e", "mcpServers": []}),
    );
    if r.get("error").is_some() {
        assert_eq!(agent.error(&r).0, -32602, "{r}");
    }

    let cwd_file = s.file("server-cwd.txt");
    let started = Instant::now();
    agent.new_session(
        &s.ws,
        json!([fake_mcp_entry("fs", &[("FAKE_MCP_CWD_FILE", &cwd_file)])]),
    );
    let seen = wait_file(&cwd_file, Duration::from_secs(5));
    assert_eq!(
        seen,
        path_str(&s.ws),
        "the MCP server runs in the session cwd (M1, C07)"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    agent.finish();
}

/// The JSON lines of the README's copy-paste session ("By hand, in JSON"), as a shell would
/// pass them: the single-quoted arguments of its `printf`.
fn readme_session_lines() -> (Vec<String>, String) {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md beside the workspace");
    let start = readme
        .find("**By hand, in JSON**")
        .expect("the README has the copy-paste session");
    let block = &readme[start..];
    let block = &block[block.find("```sh").expect("its code block") + 5..];
    let block = &block[..block.find("```").expect("the end of its code block")];
    let lines = block
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix('\'')) // '{"jsonrpc":…}' \
        .map(|l| {
            l.trim_end_matches('\\')
                .trim_end()
                .trim_end_matches('\'')
                .to_string()
        })
        .collect();
    (lines, block.to_string())
}

/// The `NAME=value` words before the agent binary on the README block's command line (the
/// session runs with them, as written).
fn readme_session_env(block: &str) -> Vec<(String, String)> {
    let line = block
        .lines()
        .find(|l| l.contains("buzz-agent") && l.contains('|'))
        .expect("the command line of the README session");
    let command = line
        .split('|')
        .find(|segment| segment.contains("buzz-agent"))
        .unwrap_or("");
    command
        .split_whitespace()
        .map_while(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A1–A3, issue 12: the README's copy-paste JSON session works as written — its three lines
/// (`initialize`, `session/new`, `session/prompt` on the session id it names), sent at once as
/// `printf` would, get three answers, the last `end_turn` with the model's text streamed
/// before it — and it keeps stdin open (a `sleep` loop until the answer), since EOF cancels
/// the turn (P1). The environment written on its command line applies (`BUZZ_AGENT_SEED` makes
/// the session id the third line names predictable, SPEC A9). (The block as a whole, with
/// `demo --llm` as its LLM, runs in `cli::p3_the_readme_json_by_hand_block_runs_as_written`.)
pub fn a3_the_readme_copy_paste_session_reaches_end_turn(ctx: &Ctx) {
    let (lines, block) = readme_session_lines();
    assert_eq!(lines.len(), 3, "{block}");
    assert!(
        block.contains("sleep "),
        "stdin stays open until the answer: {block}"
    );
    let env = readme_session_env(&block);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = Scratch::new();
    let (_llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("Hello there, nice to meet.")])
        .env(&env)
        .spawn();
    let mut bytes = Vec::new();
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_eq!(v["jsonrpc"], "2.0", "{l}");
        bytes.extend_from_slice(l.as_bytes());
        bytes.push(b'\n');
    }
    agent.send_raw(&bytes);
    for id in [json!(1), json!(2)] {
        let r = agent.wait_response(&id, Duration::from_secs(30));
        agent.result(&r);
    }
    let r = agent.wait_response(&json!(3), Duration::from_secs(30));
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let sid = serde_json::from_str::<Value>(&lines[2]).expect("json")["params"]["sessionId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        agent_text(&agent.session_updates(&sid)),
        "Hello there, nice to meet."
    );
    agent.finish();
}
