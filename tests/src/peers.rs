//! Real third-party peers (DESIGN.md layer 5): the npm ACP client `acpx` drives the agent, and
//! the reference MCP server `@modelcontextprotocol/server-everything` serves it. Both come from
//! `tests/package.json` (exact versions, `npm ci` in `tests/`). Without `tests/node_modules` the
//! peer scenarios are reported ignored with the reason — unless `CI` is set, where they fail.

use crate::fake_llm::{FakeLlm, Reply};
use crate::fake_mcp;
use crate::harness::{
    Ctx, agent_env, assert_tool_updates_well_formed, fake_mcp_entry, tool_update_text,
};
use crate::scenarios::util::{Scratch, path_str};
use libtest_mimic::{Completion, Failed, Trial};
use serde_json::{Value, json};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `tests/node_modules` of this crate.
pub fn node_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("node_modules")
}

const ACPX_CLI: &str = "acpx/dist/cli.js";
const EVERYTHING_JS: &str = "@modelcontextprotocol/server-everything/dist/index.js";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no"
        )
    })
}

type Peer = fn(&Ctx, &Path);

/// The peer trials: each needs one file from `node_modules`.
pub fn trials(ctx: &Ctx) -> Vec<Trial> {
    let list: [(&str, &str, Peer); 2] = [
        (
            "peers::acpx_drives_the_agent_through_one_tool_call",
            ACPX_CLI,
            acpx_drives_the_agent_through_one_tool_call,
        ),
        (
            "peers::server_everything_echo_result_reaches_the_llm",
            EVERYTHING_JS,
            server_everything_echo_result_reaches_the_llm,
        ),
    ];
    list.into_iter()
        .map(|(name, file, peer)| {
            let ctx = ctx.clone();
            Trial::ignorable_test(name, move || {
                let path = node_modules().join(file);
                if !path.is_file() {
                    let why = format!(
                        "{} missing: run `npm ci` in {}",
                        path.display(),
                        Path::new(env!("CARGO_MANIFEST_DIR")).display()
                    );
                    return if in_ci() {
                        Err(Failed::from(format!("CI is set and {why}")))
                    } else {
                        Ok(Completion::ignored_with(why))
                    };
                }
                peer(&ctx, &path);
                Ok(Completion::Completed)
            })
        })
        .collect()
}

/// Runs `cmd` (in its own process group) with a deadline; returns (status code, stdout, stderr).
/// The whole group is killed at the deadline and afterwards, so nothing leaks.
fn run_bounded(mut cmd: Command, timeout: Duration) -> (Option<i32>, String, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().expect("spawn peer");
    let pid = child.id() as i32;
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if Instant::now() >= deadline {
            crate::harness::kill_tree(pid);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever acpx left behind (its agent, the agent's servers) goes too.
    // SAFETY: killpg has no memory-safety preconditions.
    unsafe { libc::killpg(pid, libc::SIGKILL) };
    (
        code,
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default(),
    )
}

/// acpx (an independent ACP client) runs a one-shot prompt against the agent with permission
/// `ask` and `--approve-all`: one `fs__echo` call, then the final answer.
fn acpx_drives_the_agent_through_one_tool_call(ctx: &Ctx, acpx_cli: &Path) {
    let s = Scratch::new();
    let log = s.file("calls.log");
    let home = s.dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir home");
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "peer hello"}))]),
        Reply::text("acpx run done"),
    ]);
    let mcp_config = s.dir.path().join("mcp.json");
    let config = json!({"mcpServers": [fake_mcp_entry("fs", &[("FAKE_MCP_CALL_LOG", &log)])]});
    std::fs::write(&mcp_config, config.to_string()).expect("write mcp config");

    let agent_cmd = format!(
        "'{}'",
        ctx.agent_bin.display().to_string().replace('\'', r"'\''")
    );
    let mut cmd = Command::new("node");
    cmd.arg(acpx_cli)
        .args([
            "--agent",
            &agent_cmd,
            "--approve-all",
            "--format",
            "json",
            "--timeout",
            "60",
        ])
        .arg("--mcp-config")
        .arg(&mcp_config)
        .arg("--cwd")
        .arg(&s.ws)
        .args(["exec", "Echo 'peer hello' with the echo tool, then finish."])
        .current_dir(&s.ws)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home);
    for (k, v) in agent_env(&llm) {
        cmd.env(k, v);
    }
    cmd.env("BUZZ_AGENT_PERMISSION", "ask");
    let (code, out, err) = run_bounded(cmd, Duration::from_secs(120));
    let context = format!("\n--- acpx stdout:\n{out}\n--- acpx stderr:\n{err}");
    assert_eq!(code, Some(0), "acpx exit status{context}");

    let msgs: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        msgs.iter().any(|m| m["result"]["stopReason"] == "end_turn"),
        "the prompt ends end_turn{context}"
    );
    assert!(
        msgs.iter()
            .any(|m| m["method"] == "session/request_permission"),
        "permission ask reaches acpx{context}"
    );
    let updates: Vec<Value> = msgs
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| m["params"]["update"].clone())
        .collect();
    let terminal = assert_tool_updates_well_formed(&updates);
    assert_eq!(terminal.len(), 1, "{context}");
    assert_eq!(terminal[0]["status"], "completed", "{context}");
    assert_eq!(tool_update_text(&terminal[0]), "peer hello", "{context}");
    assert_eq!(
        crate::harness::agent_text(&updates),
        "acpx run done",
        "{context}"
    );

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "{context}");
    reqs[1].assert_tool_calls_paired();
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results, ["peer hello"], "{context}");
    let logged = fake_mcp::read_call_log(Path::new(&log));
    assert_eq!(fake_mcp::count_calls(&logged, "echo"), 1, "{context}");
}

/// The reference MCP server (which also sends `tools/list_changed` before its initialize
/// reply) registers, its `echo` tool is offered as `everything__echo`, and its result reaches
/// the next LLM request.
fn server_everything_echo_result_reaches_the_llm(ctx: &Ctx, index_js: &Path) {
    let s = Scratch::new();
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![(
            "call_1",
            "everything__echo",
            json!({"message": "hello peer"}),
        )]),
        Reply::text("done"),
    ]);
    let agent = ctx.agent(&llm, &[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "30")], &s.ws);
    agent.initialize();
    let server = json!({"name": "everything", "command": "node", "args": [path_str(index_js), "stdio"], "env": []});
    let sid = agent.new_session(&s.ws, json!([server]));
    let r = agent.request_timeout(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "echo hello peer"}]}),
        Duration::from_secs(60),
    );
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let names = reqs[0].tool_names();
    assert!(names.contains(&"everything__echo".to_string()), "{names:?}");
    reqs[1].assert_tool_calls_paired();
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results, ["Echo: hello peer"]);
    let terminal = assert_tool_updates_well_formed(&agent.session_updates(&sid));
    assert_eq!(terminal.len(), 1);
    assert_eq!(terminal[0]["status"], "completed", "{}", terminal[0]);
    agent.finish();
}
