//! Helpers shared by scenario bodies (and by `peers` and `differential`): the scratch
//! directory, waiting on files, logs and stderr, reading a fake MCP server's call log and pid
//! file, and the checks several areas make on a prompt response.

use crate::fake_llm::{RecordedRequest, Reply};
use crate::fake_mcp;
use crate::harness::{AgentProc, current_exe, fake_mcp_entry};
use crate::procfs;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A scratch directory plus a workspace directory `ws` inside it (the session cwd). The
/// path is canonical, so it compares equal to what a child reads from `getcwd`.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub ws: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("buzz-e2e-")
            .tempdir()
            .expect("tempdir");
        let ws = dir.path().canonicalize().expect("canonicalize").join("ws");
        std::fs::create_dir(&ws).expect("mkdir ws");
        Scratch { dir, ws }
    }

    /// A path in the scratch dir (outside the workspace), as a string.
    pub fn file(&self, name: &str) -> String {
        path_str(&self.dir.path().join(name))
    }

    /// A new scratch directory and the paths of the files `names` in it ([`Scratch::file`]):
    /// `let (s, [log, pids]) = Scratch::with_files(["calls.log", "pids"]);`.
    pub fn with_files<const N: usize>(names: [&str; N]) -> (Scratch, [String; N]) {
        let s = Scratch::new();
        let paths = names.map(|name| s.file(name));
        (s, paths)
    }
}

pub fn path_str(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_string()
}

/// Waits until `path` exists and is non-empty; returns its content.
pub fn wait_file(path: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        match std::fs::read_to_string(path) {
            Ok(s) if !s.is_empty() => return s,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "{path} was not written within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` every 20 ms; panics naming `what` (with the agent's stderr) after `timeout`.
pub fn wait_for(agent: &AgentProc, what: &str, timeout: Duration, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the agent's stderr contains `needle`.
pub fn wait_stderr(agent: &AgentProc, needle: &str, timeout: Duration) {
    wait_for(agent, &format!("{needle:?} on stderr"), timeout, || {
        agent.stderr_text().contains(needle)
    });
}

/// Lines of the agent's stderr containing `needle`.
pub fn count_lines(agent: &AgentProc, needle: &str) -> usize {
    agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// P1: once `cause` ran (EOF on stdin, a signal) the agent exits 0 within `bound` (waiting up
/// to `wait` to report a slow exit); panics naming `what`.
pub fn assert_exits_cleanly(
    agent: &AgentProc,
    wait: Duration,
    bound: Duration,
    what: &str,
    cause: impl FnOnce(),
) {
    let started = Instant::now();
    cause();
    let status = agent.wait_exit(wait);
    let took = started.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "{what}: exit 0, got {status:?} after {took:?}{}",
        agent.context()
    );
    assert!(took < bound, "{what}: exit took {took:?} (bound {bound:?})");
}

/// M8: every process of `pids` is gone within `within`, and the process groups `groups` have
/// no member left; panics naming `when` and the survivors.
pub fn assert_no_survivors(pids: &[i32], groups: &[i32], within: Duration, when: &str) {
    let left = procfs::wait_all_dead(pids, within);
    assert!(
        left.is_empty(),
        "{when}: survivors: {:?}",
        procfs::describe_all(&left)
    );
    for &group in groups {
        let members = procfs::group_members(group);
        assert!(
            members.is_empty(),
            "{when}: process group {group} has survivors: {:?}",
            procfs::describe_all(&members)
        );
    }
}

// ---- fake MCP servers ---------------------------------------------------------------------------

/// Every message a fake MCP server logged to its `FAKE_MCP_CALL_LOG` at `path`, in order (none
/// when the file does not exist yet).
pub fn log_of(path: &str) -> Vec<Value> {
    fake_mcp::read_call_log(Path::new(path))
}

/// The `_Stop` `tools/call` requests a server received, in order.
pub fn stop_calls(log: &str) -> Vec<Value> {
    fake_mcp::logged_tool_calls(&log_of(log))
        .into_iter()
        .filter(|c| c["params"]["name"] == "_Stop")
        .collect()
}

/// The exact compact JSON text of a `_Stop` objection result (SPEC H6).
pub fn stop_json(server: &str, text: &str) -> String {
    format!(
        r#"{{"hook":"_Stop","server":{},"text":{}}}"#,
        serde_json::to_string(server).expect("json"),
        serde_json::to_string(text).expect("json")
    )
}

/// `(attempt, budgetRemaining)` of each hook call's `_meta["buzz/hook"]` (SPEC H3), in order.
pub fn hook_attempts(calls: &[Value]) -> Vec<(Value, Value)> {
    calls
        .iter()
        .map(|c| {
            let m = &c["params"]["_meta"]["buzz/hook"];
            (m["attempt"].clone(), m["budgetRemaining"].clone())
        })
        .collect()
}

/// Waits (20 s) until the call log holds a `tools/call` of `name`; returns that request's id.
pub fn wait_logged_call(agent: &AgentProc, log: &str, name: &str) -> Value {
    wait_for(
        agent,
        &format!("tools/call {name} in {log}"),
        Duration::from_secs(20),
        || fake_mcp::count_calls(&log_of(log), name) > 0,
    );
    fake_mcp::logged_tool_calls(&log_of(log))
        .into_iter()
        .find(|c| c["params"]["name"] == name)
        .map(|c| c["id"].clone())
        .unwrap_or_default()
}

/// `m` is the `notifications/cancelled` of our request `id`.
pub fn is_cancel_of(m: &Value, id: &Value) -> bool {
    m["method"] == "notifications/cancelled" && &m["params"]["requestId"] == id
}

/// `(server pid, grandchild pid)` from a `FAKE_MCP_GRANDCHILD_PIDFILE` (waits 10 s for it).
pub fn read_pids(pidfile: &str) -> (i32, i32) {
    let text = wait_file(pidfile, Duration::from_secs(10));
    let mut it = text
        .split_whitespace()
        .map(|p| p.parse::<i32>().expect("pid"));
    (
        it.next().expect("server pid"),
        it.next().expect("grandchild pid"),
    )
}

/// A fake MCP server exposing `_Stop` (and the hidden `_Other`) that logs every line to `log`,
/// with `extra` `FAKE_MCP_*` variables.
pub fn hook_server(name: &str, log: &str, extra: &[(&str, &str)]) -> Value {
    let mut env = vec![("FAKE_MCP_STOP", "1"), ("FAKE_MCP_CALL_LOG", log)];
    env.extend_from_slice(extra);
    fake_mcp_entry(name, &env)
}

/// An `sh -c` launcher (C34) that ignores SIGTERM and runs the fake MCP server in the
/// background, the server itself ignoring SIGTERM and stdin EOF and running a `sleep 1000`
/// grandchild (pids in `pidfile`). Only SIGKILL of the whole group ends it.
pub fn stubborn_launcher(name: &str, pidfile: &str, extra: &[(&str, &str)]) -> Value {
    let mut env = vec![
        json!({"name": "BUZZ_E2E_ROLE", "value": "fake-mcp"}),
        json!({"name": "FAKE_MCP_IGNORE_TERM", "value": "1"}),
        json!({"name": "FAKE_MCP_GRANDCHILD_PIDFILE", "value": pidfile}),
    ];
    env.extend(extra.iter().map(|(k, v)| json!({"name": k, "value": v})));
    json!({
        "name": name,
        "command": "sh",
        "args": ["-c", "trap '' TERM; exec 3<&0; \"$0\" <&3 3<&- & wait", current_exe()],
        "env": env,
    })
}

// ---- prompt responses and LLM requests ----------------------------------------------------------

/// A fake LLM handler whose first answer is one tool call (`call_1`: `tool` with `args`) and
/// every later one `text`.
pub fn call_then_always(
    tool: &'static str,
    args: Value,
    text: &'static str,
) -> impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static {
    move |round, _| match round {
        0 => Reply::tool_calls(vec![("call_1", tool, args.clone())]),
        _ => Reply::text(text),
    }
}

/// The model's replies for a prompt that makes one tool call (`call_1`: `tool` with `args`)
/// and then answers `text`.
pub fn call_then(tool: &str, args: Value, text: &str) -> Vec<Reply> {
    vec![
        Reply::tool_calls(vec![("call_1", tool, args)]),
        Reply::text(text),
    ]
}

/// `result._meta.buzz` of a prompt response (SPEC A8).
pub fn buzz_meta(agent: &AgentProc, resp: &Value) -> Value {
    agent.result(resp)["_meta"]["buzz"].clone()
}

/// The first message of `logged` (a fake server's call log) whose method is `method`; panics
/// when there is none.
pub fn first_request<'a>(logged: &'a [Value], method: &str) -> &'a Value {
    let found = logged.iter().find(|m| m["method"] == method);
    found.unwrap_or_else(|| panic!("no {method} logged: {logged:#?}"))
}

/// The string `key` of each object in the JSON array `list`, in order (objects without it
/// skipped; none when `list` is not an array).
pub fn strs_of<'a>(list: &'a Value, key: &str) -> Vec<&'a str> {
    let items = list.as_array().map_or(&[][..], Vec::as_slice);
    items.iter().filter_map(|o| o.get(key)?.as_str()).collect()
}

/// The `status` of each tool call's last update, in order (as
/// [`crate::harness::assert_tool_updates_well_formed`] returns them).
pub fn statuses(terminal: &[Value]) -> Vec<&str> {
    terminal.iter().map(status_of).collect()
}

/// The `status` of one tool call update (empty when it has none).
fn status_of(update: &Value) -> &str {
    update
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The prompt response is a result with `stopReason: end_turn`.
pub fn assert_end_turn(agent: &AgentProc, resp: &Value) {
    assert_eq!(
        agent.result(resp)["stopReason"],
        "end_turn",
        "{resp}{}",
        agent.context()
    );
}

/// The requests the agent sent to the client whose `method` is `method`, in order.
pub fn agent_requests_of(agent: &AgentProc, method: &str) -> Vec<Value> {
    let mut all = agent.agent_requests();
    all.retain(|m| m["method"] == method);
    all
}

/// The whole JSON of every request body, to search for text that must never reach the model.
pub fn bodies(reqs: &[RecordedRequest]) -> String {
    reqs.iter()
        .map(|r| r.body.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}
