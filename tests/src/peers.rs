//! Real third-party peers (docs/architecture.md, "How it is tested", layer 5): the npm ACP client `acpx` drives the agent, and
//! the reference MCP server `@modelcontextprotocol/server-everything` serves it. Both come from
//! `tests/package.json` (exact versions, `npm ci` in `tests/`). The PyPI mock LLM server
//! `fakellm` (`tests/requirements.txt`, installed into `tests/.venv`) answers the agent on the
//! Anthropic and the Chat Completions routes. Hook servers written with the official Python MCP
//! SDK (FastMCP of 1.x from `tests/requirements-mcp1.txt` in `tests/.venv-mcp1`, MCPServer of
//! 2.x) and with the `fastmcp` package (`tests/examples/hooks/`) answer `_Stop` and
//! `_PostCompact`; the official Python ACP SDK drives the agent as a client. Without the
//! installed file a peer scenario is reported ignored with the reason — unless `CI` is set,
//! where it fails.

use crate::fake_llm::{FakeLlm, Reply, Wire};
use crate::fake_mcp;
use crate::harness::{
    Ctx, agent_env, assert_tool_updates_well_formed, fake_mcp_entry, tool_call_announcements,
    tool_update_text,
};
use crate::scenarios::setup::Setup;
use crate::scenarios::util::{Scratch, path_str, wait_stderr};
use libtest_mimic::{Completion, Failed, Trial};
use serde_json::{Value, json};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod http;

/// `tests/node_modules` of this crate.
pub fn node_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("node_modules")
}

const ACPX_CLI: &str = "acpx/dist/cli.js";
const EVERYTHING_JS: &str = "@modelcontextprotocol/server-everything/dist/index.js";
const FILESYSTEM_JS: &str = "@modelcontextprotocol/server-filesystem/dist/index.js";

/// Whether `CI` is set to something other than empty, `0`, `false` or `no`: then a missing
/// prerequisite fails a trial instead of ignoring it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no"
        )
    })
}

type Peer = fn(&Ctx, &Path);

/// `tests/.venv` of this crate: the Python peers of `tests/requirements.txt` (exact pins),
/// installed by `.ci/run` (`python3 -m venv tests/.venv && tests/.venv/bin/pip install -r
/// tests/requirements.txt`).
pub fn venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv")
}

const FAKELLM_BIN: &str = "bin/fakellm";

/// `tests/.venv-mcp1` of this crate: the official Python MCP SDK 1.x (FastMCP API) of
/// `tests/requirements-mcp1.txt` (mcp 2.x, in `tests/.venv`, removed that module).
pub fn venv_mcp1() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-mcp1")
}

/// `rel` inside the `site-packages` of `venv` (whatever its Python version), or where it would
/// be when the package is not installed.
pub fn site_file(venv: &Path, rel: &str) -> PathBuf {
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dir| {
        dir.flatten()
            .map(|e| e.path().join("site-packages").join(rel))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| lib.join("python3").join("site-packages").join(rel))
}

/// `tests/examples/<rel>` of this crate.
fn example(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(rel)
}

/// The peer trials: each needs one installed file (from `node_modules` or `.venv`).
pub fn trials(ctx: &Ctx) -> Vec<Trial> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).display().to_string();
    let npm = format!("run `npm ci` in {dir}");
    let pip = format!(
        "run `python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` in {dir}"
    );
    let pip_mcp1 = format!(
        "run `python3 -m venv .venv-mcp1 && .venv-mcp1/bin/pip install -r requirements-mcp1.txt` in {dir}"
    );
    let list: [(&str, PathBuf, &str, Peer); 16] = [
        (
            "peers::m10_m12_fastmcp_http_server_serves_tools_an_elicitation_and_survives_a_restart",
            site_file(&venv(), "fastmcp/__init__.py"),
            &pip,
            http::m10_m12_fastmcp_http_server_serves_tools_an_elicitation_and_survives_a_restart,
        ),
        (
            "peers::m10_h5_fastmcp_http_policy_server_objects_once_then_allows",
            site_file(&venv(), "fastmcp/__init__.py"),
            &pip,
            http::m10_h5_fastmcp_http_policy_server_objects_once_then_allows,
        ),
        (
            "peers::c53_acpx_default_mode_denies_an_unannotated_fastmcp_tool_and_allows_a_read_only_one",
            site_file(&venv(), "fastmcp/__init__.py"),
            &pip,
            acpx_default_mode_and_a_read_only_fastmcp_tool,
        ),
        (
            "peers::c53_c58_acpx_default_mode_allows_filesystem_reads_denies_writes_and_sets_the_model",
            node_modules().join(FILESYSTEM_JS),
            &npm,
            acpx_default_mode_reads_writes_and_model,
        ),
        (
            "peers::c59_server_everything_image_and_progress_reach_the_client",
            node_modules().join(EVERYTHING_JS),
            &npm,
            server_everything_image_and_progress_reach_the_client,
        ),
        (
            "peers::h3_c40_fastmcp_v1_hooks_string_empty_none_raise",
            site_file(&venv_mcp1(), "mcp/server/fastmcp/__init__.py"),
            &pip_mcp1,
            hooks_fastmcp_v1,
        ),
        (
            "peers::h3_c40_mcpserver_v2_hooks_string_empty_none_raise",
            site_file(&venv(), "mcp/server/mcpserver/__init__.py"),
            &pip,
            hooks_mcpserver_v2,
        ),
        (
            "peers::h3_c40_fastmcp_package_hooks_string_empty_none_raise",
            site_file(&venv(), "fastmcp/__init__.py"),
            &pip,
            hooks_fastmcp_package,
        ),
        (
            "peers::acp_python_sdk_spawn_agent_process_tool_call_and_objection",
            site_file(&venv(), "acp/__init__.py"),
            &pip,
            acp_python_sdk_drives_a_tool_call_and_an_objection,
        ),
        (
            "peers::acpx_drives_the_agent_through_one_tool_call",
            node_modules().join(ACPX_CLI),
            &npm,
            acpx_drives_the_agent_through_one_tool_call,
        ),
        (
            "peers::a9_acp_python_sdk_loads_a_session_an_earlier_process_wrote",
            site_file(&venv(), "acp/__init__.py"),
            &pip,
            acp_python_sdk_loads_a_session_an_earlier_process_wrote,
        ),
        (
            "peers::a9_acpx_persistent_session_keeps_its_history_across_an_agent_restart",
            node_modules().join(ACPX_CLI),
            &npm,
            acpx_persistent_session_keeps_its_history_across_an_agent_restart,
        ),
        (
            "peers::server_everything_echo_result_reaches_the_llm",
            node_modules().join(EVERYTHING_JS),
            &npm,
            server_everything_echo_result_reaches_the_llm,
        ),
        (
            "peers::s1_server_everything_through_npx_starts_with_the_allowlisted_environment",
            node_modules().join(EVERYTHING_JS),
            &npm,
            server_everything_through_npx_starts_with_the_allowlisted_environment,
        ),
        (
            "peers::fakellm_anthropic_route_one_tool_call_then_final_text",
            venv().join(FAKELLM_BIN),
            &pip,
            fakellm_anthropic_route_one_tool_call_then_final_text,
        ),
        (
            "peers::fakellm_chat_route_one_tool_call_then_final_text",
            venv().join(FAKELLM_BIN),
            &pip,
            fakellm_chat_route_one_tool_call_then_final_text,
        ),
    ];
    let extras_only: [(&str, PathBuf, &str, Peer); 1] = [(
        "peers::p3_c57_hooks_check_fails_real_fastmcp_hook_mistakes",
        site_file(&venv(), "fastmcp/__init__.py"),
        &pip,
        hooks_check_fails_real_fastmcp_hook_mistakes,
    )];
    let without_extras = |name: &'static str| {
        let bin = ctx.agent_bin.display().to_string();
        Trial::ignorable_test(name, move || {
            Ok(Completion::ignored_with(format!(
                "{bin} is built without the `extras` feature (hooks check)"
            )))
        })
    };
    let extras: Vec<Trial> = if ctx.has_extras {
        Vec::new()
    } else {
        extras_only
            .iter()
            .map(|(name, ..)| without_extras(name))
            .collect()
    };
    let runnable = list
        .into_iter()
        .chain(extras_only.into_iter().filter(|_| ctx.has_extras));
    extras
        .into_iter()
        .chain(runnable.map(|(name, path, install, peer)| {
            let ctx = ctx.clone();
            let install = install.to_string();
            Trial::ignorable_test(name, move || {
                if !path.is_file() {
                    let why = format!("{} missing: {install}", path.display());
                    return if in_ci() {
                        Err(Failed::from(format!("CI is set and {why}")))
                    } else {
                        Ok(Completion::ignored_with(why))
                    };
                }
                peer(&ctx, &path);
                Ok(Completion::Completed)
            })
        }))
        .collect()
}

/// The real acpx (`node <acpx_cli>`) driving the agent under test: `--agent '<binary>' --format
/// json --timeout 60 --cwd <ws>`, run in `ws` with a clean environment (`PATH`, `HOME`) plus the
/// agent's settings for `llm`. The caller adds its options, the command and more environment.
fn acpx(ctx: &Ctx, acpx_cli: &Path, ws: &Path, home: &Path, llm: &FakeLlm) -> Command {
    let agent_cmd = format!(
        "'{}'",
        ctx.agent_bin.display().to_string().replace('\'', r"'\''")
    );
    let mut cmd = Command::new("node");
    cmd.arg(acpx_cli)
        .args(["--agent", &agent_cmd, "--format", "json", "--timeout", "60"])
        .arg("--cwd")
        .arg(ws)
        .current_dir(ws)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .envs(agent_env(llm));
    cmd
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
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let home = s.dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir home");
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "peer hello"}))]),
        Reply::text("acpx run done"),
    ]);
    let mcp_config = s.dir.path().join("mcp.json");
    let config = json!({"mcpServers": [fake_mcp_entry("fs", &[("FAKE_MCP_CALL_LOG", &log)])]});
    std::fs::write(&mcp_config, config.to_string()).expect("write mcp config");

    let mut cmd = acpx(ctx, acpx_cli, &s.ws, &home, &llm);
    cmd.arg("--approve-all")
        .arg("--mcp-config")
        .arg(&mcp_config)
        .args(["exec", "Echo 'peer hello' with the echo tool, then finish."])
        .env("BUZZ_AGENT_PERMISSION", "ask");
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

/// C53 and C58 with the real acpx in its DEFAULT permission mode (no `--approve-all`:
/// `approve-reads`, and without a terminal writes are denied) and the reference filesystem
/// server: `read_text_file` (`readOnlyHint`, title "Read Text File") is announced `read` and
/// allowed, `write_file` (`destructiveHint`) is `edit` and denied, and nothing is written; the
/// model still gets both results and the turn ends `end_turn`. `--model other-model` (advertised
/// through `BUZZ_AGENT_MODELS`) reaches the LLM request.
fn acpx_default_mode_reads_writes_and_model(ctx: &Ctx, fs_js: &Path) {
    let acpx_cli = node_modules().join(ACPX_CLI);
    let s = Scratch::new();
    let home = s.dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir home");
    let note = s.ws.join("note.txt");
    std::fs::write(&note, "hello from the file").expect("write note");
    let written = s.ws.join("new.txt");
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![
            (
                "call_1",
                "fs__read_text_file",
                json!({"path": path_str(&note)}),
            ),
            (
                "call_2",
                "fs__write_file",
                json!({"path": path_str(&written), "content": "must not be written"}),
            ),
        ]),
        Reply::text("read one, the other was denied"),
    ]);
    let mcp_config = s.dir.path().join("mcp.json");
    let server = json!({"name": "fs", "command": "node", "args": [path_str(fs_js), path_str(&s.ws)], "env": []});
    std::fs::write(&mcp_config, json!({"mcpServers": [server]}).to_string())
        .expect("write mcp config");
    let mut cmd = acpx(ctx, &acpx_cli, &s.ws, &home, &llm);
    cmd.args(["--model", "other-model"])
        .arg("--mcp-config")
        .arg(&mcp_config)
        .args(["exec", "Read note.txt, then write new.txt."])
        .env("BUZZ_AGENT_PERMISSION", "ask")
        .env("BUZZ_AGENT_MODELS", "other-model")
        .env("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "30");
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
    let asked: Vec<(String, String)> = msgs
        .iter()
        .filter(|m| m["method"] == "session/request_permission")
        .map(|m| {
            let c = &m["params"]["toolCall"];
            (
                c["title"].as_str().unwrap_or("").to_string(),
                c["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        asked,
        [
            (
                r#"fs: read_text_file ("Read Text File")"#.to_string(),
                "read".to_string()
            ),
            (
                r#"fs: write_file ("Write File")"#.to_string(),
                "edit".to_string()
            )
        ],
        "{context}"
    );
    let updates: Vec<Value> = msgs
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| m["params"]["update"].clone())
        .collect();
    let terminal = assert_tool_updates_well_formed(&updates);
    assert_eq!(terminal.len(), 2, "{context}");
    assert_eq!(
        terminal[0]["status"], "completed",
        "the read is allowed{context}"
    );
    assert_eq!(
        tool_update_text(&terminal[0]),
        "hello from the file",
        "{context}"
    );
    assert_eq!(
        terminal[1]["status"], "failed",
        "the write is denied{context}"
    );
    assert!(!written.exists(), "nothing was written");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "{context}");
    for r in &reqs {
        assert_eq!(r.body["model"], "other-model", "acpx --model{context}");
    }
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results[0], "hello from the file", "{context}");
    assert!(
        results[1].contains("tool call not authorized"),
        "{results:?}{context}"
    );
}

/// C53 with the real acpx in its default mode and the README's first FastMCP tool
/// (`tests/examples/tools/fastmcp_read_only.py`): a call of the tool without annotations is
/// kind `other` and denied, the turn still ends `end_turn`, and acpx exits 5 (its "permission
/// denied": every permission request of the prompt was denied); a call of the same tool with
/// `readOnlyHint` is kind `read`, allowed, and acpx exits 0 (README, "Your first tool").
fn acpx_default_mode_and_a_read_only_fastmcp_tool(ctx: &Ctx, _: &Path) {
    let acpx_cli = node_modules().join(ACPX_CLI);
    assert!(
        acpx_cli.is_file(),
        "{} missing: run `npm ci` in tests/",
        acpx_cli.display()
    );
    let python = venv().join("bin").join("python");
    let server = example("tools/fastmcp_read_only.py");
    for (tool, kind, status, exit) in [
        ("count_words_plain", "other", "failed", 5),
        ("count_words", "read", "completed", 0),
    ] {
        let s = Scratch::new();
        let home = s.dir.path().join("home");
        std::fs::create_dir(&home).expect("mkdir home");
        let llm = FakeLlm::scripted(vec![
            Reply::tool_calls(vec![(
                "call_1",
                &format!("words__{tool}"),
                json!({"text": "one two three"}),
            )]),
            Reply::text("counted"),
        ]);
        let mcp_config = s.dir.path().join("mcp.json");
        let entry = json!({"name": "words", "command": path_str(&python), "args": [path_str(&server)], "env": []});
        std::fs::write(&mcp_config, json!({"mcpServers": [entry]}).to_string())
            .expect("write mcp config");
        let mut cmd = acpx(ctx, &acpx_cli, &s.ws, &home, &llm);
        cmd.arg("--mcp-config")
            .arg(&mcp_config)
            .args(["exec", "Count the words of 'one two three'."])
            .env("BUZZ_AGENT_PERMISSION", "ask")
            .env("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "30");
        let (code, out, err) = run_bounded(cmd, Duration::from_secs(120));
        let context = format!("\n--- {tool}: acpx stdout:\n{out}\n--- acpx stderr:\n{err}");
        assert_eq!(code, Some(exit), "acpx exit status{context}");
        let msgs: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert!(
            msgs.iter().any(|m| m["result"]["stopReason"] == "end_turn"),
            "the prompt ends end_turn{context}"
        );
        let asked: Vec<&Value> = msgs
            .iter()
            .filter(|m| m["method"] == "session/request_permission")
            .map(|m| &m["params"]["toolCall"]["kind"])
            .collect();
        assert_eq!(asked, [kind], "{context}");
        let updates: Vec<Value> = msgs
            .iter()
            .filter(|m| m["method"] == "session/update")
            .map(|m| m["params"]["update"].clone())
            .collect();
        let terminal = assert_tool_updates_well_formed(&updates);
        assert_eq!(terminal.len(), 1, "{context}");
        assert_eq!(terminal[0]["status"], status, "{context}");
        let results: Vec<String> = llm.requests()[1]
            .tool_results()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        if exit == 0 {
            assert_eq!(results, ["3"], "{context}");
        } else {
            assert!(
                results[0].contains("not authorized"),
                "{results:?}{context}"
            );
        }
    }
}

/// C59 with the reference server: `get-tiny-image`'s image reaches the client in the
/// `tool_call_update` (the model gets its marker), and `trigger-long-running-operation` (which
/// reports progress for the call's `progressToken`) shows its progress as `in_progress`
/// updates; both are `read` calls titled by the server.
fn server_everything_image_and_progress_reach_the_client(ctx: &Ctx, index_js: &Path) {
    let s = Scratch::new();
    let server = json!({"name": "everything", "command": "node", "args": [path_str(index_js), "stdio"], "env": []});
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "everything__get-tiny-image", json!({}))]),
            Reply::tool_calls(vec![(
                "call_2",
                "everything__trigger-long-running-operation",
                json!({"duration": 1, "steps": 3}),
            )]),
            Reply::text("done"),
        ])
        .env(&[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "30")])
        .servers([server])
        .start();
    let r = agent.prompt_timeout(
        &sid,
        "image, then a long operation",
        Duration::from_secs(60),
    );
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let ups = agent.session_updates(&sid);
    let terminal = assert_tool_updates_well_formed(&ups);
    let announced: Vec<(Value, Value)> = ups
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call")
        .map(|u| (u["title"].clone(), u["kind"].clone()))
        .collect();
    assert_eq!(
        announced,
        [
            (json!("Get Tiny Image Tool"), json!("read")),
            (json!("Trigger Long Running Operation Tool"), json!("read"))
        ]
    );
    let image = terminal[0]["content"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["content"]["type"] == "image")
        .cloned();
    assert!(
        image.is_some_and(|c| c["content"]["mimeType"] == "image/png"
            && c["content"]["data"].as_str().is_some_and(|d| d.len() > 100)),
        "{:#}",
        terminal[0]
    );
    let reqs = llm.requests();
    assert!(
        reqs[1].tool_results()[0]
            .1
            .contains("[image elided: image/png, "),
        "{:?}",
        reqs[1].tool_results()
    );
    let id = terminal[1]["toolCallId"].clone();
    let progress: Vec<String> = ups
        .iter()
        .filter(|u| u["toolCallId"] == id && u["status"] == "in_progress")
        .map(tool_update_text)
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(
        progress,
        ["progress 1/3", "progress 2/3", "progress 3/3"],
        "{ups:#?}"
    );
    agent.finish();
}

/// The reference MCP server (which also sends `tools/list_changed` before its initialize
/// reply) registers, its `echo` tool is offered as `everything__echo`, and its result reaches
/// the next LLM request.
fn server_everything_echo_result_reaches_the_llm(ctx: &Ctx, index_js: &Path) {
    let server = json!({"name": "everything", "command": "node", "args": [path_str(index_js), "stdio"], "env": []});
    everything_echo(ctx, server, &[]);
}

/// SPEC S1 with the usual launcher: `npx` (npm's own runner, which needs `PATH` and `HOME` for
/// its cache and configuration) starts the reference server from this crate's `node_modules`
/// with only the allowlisted environment, and its tool works. The agent has a token in its
/// environment too, which the allowlist keeps from the server (as
/// `mcp::m1_children_do_not_get_agent_secrets` checks).
fn server_everything_through_npx_starts_with_the_allowlisted_environment(ctx: &Ctx, _: &Path) {
    let dir = path_str(Path::new(env!("CARGO_MANIFEST_DIR")));
    let launch = "cd \"$0\" && exec npx --no-install @modelcontextprotocol/server-everything stdio";
    let server =
        json!({"name": "everything", "command": "sh", "args": ["-c", launch, dir], "env": []});
    everything_echo(ctx, server, &[("GITHUB_TOKEN", "ghp-e2e-not-for-servers")]);
}

/// The reference server `server` (its `mcpServers` entry) serves one `everything__echo` call
/// of a prompt; the agent runs with `env` on top of the usual.
fn everything_echo(ctx: &Ctx, server: Value, env: &[(&str, &str)]) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![(
                "call_1",
                "everything__echo",
                json!({"message": "hello peer"}),
            )]),
            Reply::text("done"),
        ])
        .env(&[("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "30")])
        .env(env)
        .servers([server])
        .start();
    let r = agent.prompt_timeout(&sid, "echo hello peer", Duration::from_secs(60));
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let names = reqs[0].tool_names();
    assert!(names.contains(&"everything__echo".to_string()), "{names:?}");
    reqs[1].assert_tool_calls_paired();
    let results: Vec<String> = reqs[1].tool_results().into_iter().map(|(_, t)| t).collect();
    assert_eq!(results, ["Echo: hello peer"]);
    let ups = agent.session_updates(&sid);
    let terminal = assert_tool_updates_well_formed(&ups);
    assert_eq!(terminal.len(), 1);
    assert_eq!(terminal[0]["status"], "completed", "{}", terminal[0]);
    // C53: the server's title and annotations (`readOnlyHint`).
    let announced = &tool_call_announcements(&ups)[0];
    assert_eq!(
        (&announced["title"], &announced["kind"]),
        (&json!("Echo Tool"), &json!("read"))
    );
    agent.finish();
}

// ---- fakellm (PyPI): a third-party mock LLM server on the Anthropic and Chat routes ----------

/// The echo text fakellm's first rule asks for; its second rule fires once a tool result
/// containing it comes back.
const FAKELLM_MARK: &str = "fakellm-peer-echo";
const FAKELLM_FINAL: &str = "fakellm peer done";

/// A running `fakellm serve`; dropping it kills its process group.
struct Fakellm {
    child: std::process::Child,
    origin: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Fakellm {
    /// Starts `fakellm serve --host 127.0.0.1 --port <free> --config <file>` with two rules:
    /// a tool result containing [`FAKELLM_MARK`] → the text [`FAKELLM_FINAL`]; any request
    /// offering `fs__echo` → one `fs__echo` call with `{"text": FAKELLM_MARK}`. Waits (≤ 20 s)
    /// until the port accepts connections.
    fn start(bin: &Path, dir: &Path) -> Fakellm {
        let config = dir.join("fakellm.yaml");
        std::fs::write(
            &config,
            format!(
                "version: 1\n\
                 rules:\n\
                 \x20 - name: final_answer\n\
                 \x20   when:\n\
                 \x20     tool_result_contains: \"{FAKELLM_MARK}\"\n\
                 \x20   respond:\n\
                 \x20     content: \"{FAKELLM_FINAL}\"\n\
                 \x20 - name: call_echo\n\
                 \x20   when:\n\
                 \x20     tools_include: \"fs__echo\"\n\
                 \x20   respond:\n\
                 \x20     tool_calls:\n\
                 \x20       - name: fs__echo\n\
                 \x20         arguments: {{text: \"{FAKELLM_MARK}\"}}\n"
            ),
        )
        .expect("write fakellm config");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut child = Command::new(bin)
            .args([
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--config",
            ])
            .arg(&config)
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let sink = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut s) = sink.lock() {
                        s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        let mut server = Fakellm {
            child,
            origin: format!("http://127.0.0.1:{port}"),
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "fakellm exited with {status} before listening{}",
                    server.context()
                );
            }
            assert!(
                Instant::now() < deadline,
                "fakellm did not listen on {port} within 20 s{}",
                server.context()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn context(&self) -> String {
        let err = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
        format!("\n--- fakellm stderr:\n{err}---")
    }

    /// `GET /_fakellm/stats` (its record of the requests and the rules they matched).
    fn stats(&self) -> Value {
        use std::io::Write;
        let addr = self.origin.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).expect("connect fakellm");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            s,
            "GET /_fakellm/stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("write stats request");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("fakellm stats are not JSON ({e}): {raw}{}", self.context()))
    }
}

impl Drop for Fakellm {
    fn drop(&mut self) {
        crate::harness::kill_tree(self.child.id() as i32);
        let _ = self.child.wait();
    }
}

fn fakellm_anthropic_route_one_tool_call_then_final_text(ctx: &Ctx, bin: &Path) {
    fakellm_one_tool_call(ctx, bin, Wire::Anthropic, "anthropic");
}

fn fakellm_chat_route_one_tool_call_then_final_text(ctx: &Ctx, bin: &Path) {
    fakellm_one_tool_call(ctx, bin, Wire::Chat, "openai");
}

/// fakellm (an independent implementation of both APIs) streams one `fs__echo` call; the agent
/// runs it on the fake MCP server and sends the result back in a shape fakellm's own parser
/// recognises (its `tool_result_contains` rule fires), then fakellm's final text ends the turn
/// `end_turn` (SPEC L6 / L7, L4).
fn fakellm_one_tool_call(ctx: &Ctx, bin: &Path, wire: Wire, api: &str) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let server = Fakellm::start(bin, s.dir.path());
    let agent = ctx.agent_at(wire, &server.origin, &[], &s.ws);
    agent.initialize();
    let sid = agent.new_session(
        &s.ws,
        json!([fake_mcp_entry("fs", &[("FAKE_MCP_CALL_LOG", &log)])]),
    );
    let r = agent.prompt_timeout(&sid, "echo via fakellm", Duration::from_secs(30));
    let context = server.context();
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}{context}");
    let updates = agent.session_updates(&sid);
    let terminal = assert_tool_updates_well_formed(&updates);
    assert_eq!(terminal.len(), 1, "{updates:#?}{context}");
    assert_eq!(terminal[0]["status"], "completed", "{}", terminal[0]);
    assert_eq!(tool_update_text(&terminal[0]), FAKELLM_MARK);
    assert_eq!(
        crate::harness::agent_text(&updates),
        FAKELLM_FINAL,
        "{context}"
    );
    let logged = fake_mcp::read_call_log(Path::new(&log));
    let calls = fake_mcp::logged_tool_calls(&logged);
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0]["params"]["name"], "echo");
    assert_eq!(
        calls[0]["params"]["arguments"],
        json!({"text": FAKELLM_MARK})
    );
    let stats = server.stats();
    // `recent` is newest first.
    let recent: Vec<(String, String)> = stats["recent"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["api"].as_str().unwrap_or_default().to_string(),
                r["matched_rule"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        recent,
        [
            (api.to_string(), "final_answer".to_string()),
            (api.to_string(), "call_echo".to_string()),
        ],
        "two streamed requests on the {api} API: the tool call, then the result fakellm \
         recognised: {stats}"
    );
    agent.finish();
}

/// The hook servers of `tests/examples/hooks/` on a real Python framework (SPEC H3, H5, H6, H7;
/// case C40): four servers of one script, `HOOK_MODE` = `string`, `empty` (`return ""`), `none`
/// (`return None`) and `raise`. A prompt larger than the context compacts first, so
/// `_PostCompact` runs, then `_Stop` runs twice. Expected: only the `string` server's texts
/// reach the model — `_PostCompact`'s in the round after the summary, `_Stop`'s (first call
/// only) in the next round; `""` and `None` are `empty` (C40: no bogus objection), a raise is
/// `error` (fail-open); end_turn with `stopObjections: 1` after 3 LLM calls.
fn python_hook_framework(ctx: &Ctx, python: &Path, script: &str, framework: &str) {
    let s = Scratch::new();
    let script = example(script);
    let modes = ["string", "empty", "none", "raise"];
    let servers = modes.iter().map(|mode| {
        json!({"name": mode, "command": path_str(python), "args": [path_str(&script)],
               "env": [{"name": "HOOK_MODE", "value": mode}]})
    });
    let (llm, agent) = Setup::new(ctx, &s)
        .handler(|_, req| {
            if req.tool_names().is_empty() {
                Reply::text("SUMMARY: the user asked for a long task; nothing done yet.")
            } else {
                Reply::text("All done.")
            }
        })
        .env(&[
            ("MCP_HOOK_SERVERS", "*"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "20000"),
            ("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "60"),
            ("BUZZ_AGENT_MAX_CONTEXT_TOKENS", "6000"),
            ("BUZZ_AGENT_MAX_OUTPUT_TOKENS", "1000"),
        ])
        .spawn();
    agent.initialize();
    // Four Python frameworks start at once (FastMCP 4 takes ~28 s on a loaded 2-core machine):
    // wait as long as the servers' own start-up timeout above, not the default 30 s.
    let servers: Vec<Value> = servers.collect();
    let r = agent.request_timeout(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": servers}),
        Duration::from_secs(75),
    );
    let sid = agent.result(&r)["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{framework}: session/new: {r}"))
        .to_string();
    let prompt = format!("{} Now finish.", "Do the long task. ".repeat(360));
    let r = agent.prompt_timeout(&sid, &prompt, Duration::from_secs(120));
    let res = agent.result(&r);
    assert_eq!(res["stopReason"], "end_turn", "{framework}: {r}");
    assert_eq!(
        res["_meta"]["buzz"]["stopObjections"], 1,
        "{framework}: only the string hook objects, once: {r}"
    );
    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        3,
        "{framework}: summary, the round after it, the round after the objection"
    );
    assert!(
        reqs[0].tool_names().is_empty(),
        "the summary call comes first"
    );
    let injected = |req: &crate::fake_llm::RecordedRequest, point: &str| -> Vec<(String, Value)> {
        req.assistant_tool_calls()
            .into_iter()
            .filter(|(_, name, _)| name.ends_with(&format!("__{point}")))
            .map(|(id, name, _)| {
                let text = req.tool_result_for(&id).unwrap_or_default();
                (name, serde_json::from_str(&text).unwrap_or(Value::Null))
            })
            .collect()
    };
    assert_eq!(
        injected(&reqs[1], "_PostCompact"),
        [(
            "string___PostCompact".to_string(),
            json!({"hook": "_PostCompact", "server": "string",
                   "text": format!("POSTCOMPACT from {framework}")})
        )],
        "{framework}: H7, only the string answer is injected"
    );
    assert_eq!(
        injected(&reqs[2], "_Stop"),
        [(
            "string___Stop".to_string(),
            json!({"hook": "_Stop", "server": "string", "text": format!("STOP from {framework}")})
        )],
        "{framework}: H6, the objection reaches the next request"
    );
    for req in &reqs {
        req.assert_tool_calls_paired();
        assert!(
            !req.body.to_string().contains("\"result\":null"),
            "{framework}: C40, structuredContent never reaches the model"
        );
    }
    // The log has its own writer thread (it never blocks the loop), so a line may reach the
    // pipe after the prompt's response: wait for each one rather than reading stderr once.
    for point in ["_PostCompact", "_Stop"] {
        for (server, outcome) in [
            ("string", "objection"),
            ("empty", "empty"),
            ("none", "empty"),
            ("raise", "error"),
        ] {
            let needle = format!("point={point} server={server} outcome={outcome}");
            wait_stderr(&agent, &needle, Duration::from_secs(15));
        }
    }
    agent.finish();
}

fn hooks_fastmcp_v1(ctx: &Ctx, _: &Path) {
    let python = venv_mcp1().join("bin").join("python");
    python_hook_framework(ctx, &python, "hooks/fastmcp_v1_hooks.py", "fastmcp-v1");
}

fn hooks_mcpserver_v2(ctx: &Ctx, _: &Path) {
    let python = venv().join("bin").join("python");
    python_hook_framework(ctx, &python, "hooks/mcpserver_v2_hooks.py", "mcpserver-v2");
}

fn hooks_fastmcp_package(ctx: &Ctx, _: &Path) {
    let python = venv().join("bin").join("python");
    python_hook_framework(ctx, &python, "hooks/fastmcp_hooks.py", "fastmcp");
}

/// The official Python ACP SDK as the client, launching the agent with its own
/// `spawn_agent_process()` (`tests/examples/acp_sdk_client.py`): permission `ask`, one
/// `fs__echo` call (asked for and allowed once), a `_Stop` objection, then `end_turn` —
/// everything parsed by the SDK's own schema models. The SDK pipes the agent's stderr and never
/// reads it (case C51); the agent logs at `debug` all the same, which must never block it.
fn acp_python_sdk_drives_a_tool_call_and_an_objection(ctx: &Ctx, _: &Path) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![(
            "call_1",
            "fs__echo",
            json!({"text": "from the SDK"}),
        )]),
        Reply::text("All done."),
        Reply::text("Checked; done now."),
    ]);
    let servers = json!([
        fake_mcp_entry("fs", &[("FAKE_MCP_CALL_LOG", &log)]),
        fake_mcp_entry(
            "guard",
            &[
                ("FAKE_MCP_STOP", "1"),
                ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
                ("FAKE_MCP_STOP_TEXT", "run the tests first"),
            ]
        ),
    ]);
    let python = venv().join("bin").join("python");
    let mut cmd = Command::new(&python);
    cmd.arg(example("acp_sdk_client.py"))
        .arg(&ctx.agent_bin)
        .arg(&s.ws)
        .arg(servers.to_string())
        .arg("Echo 'from the SDK', then finish.")
        .current_dir(&s.ws)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", s.dir.path());
    for (k, v) in agent_env(&llm) {
        cmd.env(k, v);
    }
    cmd.env("BUZZ_AGENT_PERMISSION", "ask")
        .env("BUZZ_AGENT_LOG", "debug")
        .env("MCP_HOOK_SERVERS", "guard");
    let (code, out, err) = run_bounded(cmd, Duration::from_secs(120));
    let context = format!("\n--- client stdout:\n{out}\n--- client stderr:\n{err}");
    assert_eq!(code, Some(0), "the SDK client exit status{context}");
    let report: Value = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON report{context}"));
    assert_eq!(
        report["response"]["stopReason"], "end_turn",
        "{report}{context}"
    );
    assert_eq!(
        report["response"]["_meta"]["buzz"]["stopObjections"], 1,
        "{report}"
    );
    assert!(
        report["initialize"]["protocolVersion"].as_u64().is_some(),
        "{report}"
    );
    assert_eq!(
        report["permissions"].as_array().map(Vec::len),
        Some(1),
        "one permission ask, for fs__echo: {report}"
    );
    let updates: Vec<Value> = report["updates"].as_array().cloned().unwrap_or_default();
    let terminal = assert_tool_updates_well_formed(&updates);
    assert_eq!(
        terminal.len(),
        1,
        "hooks are never tool calls (H8): {updates:#?}"
    );
    assert_eq!(terminal[0]["status"], "completed");
    assert_eq!(tool_update_text(&terminal[0]), "from the SDK");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3, "tool round, objection, end{context}");
    let objection = reqs[2]
        .assistant_tool_calls()
        .into_iter()
        .find(|(_, name, _)| name == "guard___Stop")
        .and_then(|(id, _, _)| reqs[2].tool_result_for(&id))
        .unwrap_or_default();
    assert_eq!(
        objection,
        r#"{"hook":"_Stop","server":"guard","text":"run the tests first"}"#
    );
    let logged = fake_mcp::read_call_log(Path::new(&log));
    assert_eq!(fake_mcp::count_calls(&logged, "echo"), 1);
}

/// A9 with the official Python ACP SDK: one SDK process creates a session and prompts it; a
/// second SDK process (so a new agent) lists the saved sessions, loads that one (the replay
/// arrives as `session/update`s the SDK parses), and prompts again: the LLM gets the whole
/// earlier history. The client passes `transport_kwargs={"stderr": None}`, so the agent's log
/// reaches the client's stderr (the README's advice).
fn acp_python_sdk_loads_a_session_an_earlier_process_wrote(ctx: &Ctx, _: &Path) {
    let s = Scratch::new();
    let state = s.dir.path().join("state");
    let llm = FakeLlm::scripted(vec![
        Reply::text("Noted: the word is zebra."),
        Reply::text("It was zebra."),
    ]);
    let run = |args: &[&str]| -> Value {
        let python = venv().join("bin").join("python");
        let mut cmd = Command::new(&python);
        cmd.arg(example("acp_sdk_session.py"))
            .arg(&ctx.agent_bin)
            .arg(&s.ws)
            .args(args)
            .current_dir(&s.ws)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", s.dir.path())
            .env("BUZZ_AGENT_STATE_DIR", &state);
        for (k, v) in agent_env(&llm) {
            cmd.env(k, v);
        }
        let (code, out, err) = run_bounded(cmd, Duration::from_secs(120));
        let context = format!("\n--- client stdout:\n{out}\n--- client stderr:\n{err}");
        assert_eq!(code, Some(0), "the SDK client exit status{context}");
        assert!(
            err.contains("INFO  starting: provider="),
            "with transport_kwargs={{\"stderr\": None}} the agent's log reaches the client's stderr{context}"
        );
        out.lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no JSON report{context}"))
    };
    let first = run(&["new", "Remember the word zebra.\nThen say noted."]);
    assert_eq!(first["response"]["stopReason"], "end_turn", "{first}");
    assert_eq!(
        first["initialize"]["agentCapabilities"]["loadSession"],
        true
    );
    let sid = first["sessionId"].as_str().unwrap_or_default().to_string();

    let second = run(&["load", &sid, "Which word was it?"]);
    let listed = second["list"]["sessions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed.len(), 1, "{second}");
    assert_eq!(listed[0]["sessionId"], sid);
    assert_eq!(listed[0]["title"], "Remember the word zebra.");
    assert!(listed[0]["updatedAt"].is_string(), "{second}");
    let replayed: Vec<Value> = second["updates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|u| u["sessionId"] == sid.as_str())
        .map(|u| u["update"].clone())
        .collect();
    let kinds: Vec<&str> = replayed
        .iter()
        .filter_map(|u| u["sessionUpdate"].as_str())
        .collect();
    assert_eq!(
        kinds[..2],
        ["user_message_chunk", "agent_message_chunk"],
        "the replay, parsed by the SDK: {second}"
    );
    assert_eq!(
        replayed[0]["content"]["text"],
        "Remember the word zebra.\nThen say noted."
    );
    assert_eq!(replayed[1]["content"]["text"], "Noted: the word is zebra.");
    assert_eq!(second["response"]["stopReason"], "end_turn", "{second}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let users = reqs[1].user_text();
    assert!(
        users.contains("zebra") && users.contains("Which word"),
        "{users}"
    );
    assert!(
        reqs[1]
            .body
            .to_string()
            .contains("Noted: the word is zebra.")
    );
}

/// A9 with acpx's persistent sessions: acpx keeps the agent in a queue owner that exits after
/// an idle TTL (1 s here); the next `acpx prompt` starts a new agent process and reconnects
/// with `session/resume` (acpx prefers it over `session/load`), and the history is intact: the
/// model gets the earlier prompt and answer.
fn acpx_persistent_session_keeps_its_history_across_an_agent_restart(ctx: &Ctx, acpx_cli: &Path) {
    let s = Scratch::new();
    let home = s.dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir home");
    let state = s.dir.path().join("state");
    let llm = FakeLlm::scripted(vec![
        Reply::text("Noted: zebra."),
        Reply::text("The word was zebra."),
    ]);
    let run_acpx = |args: &[&str]| {
        let mut cmd = acpx(ctx, acpx_cli, &s.ws, &home, &llm);
        cmd.args(["--approve-all", "--ttl", "1"])
            .args(args)
            .env("BUZZ_AGENT_STATE_DIR", &state);
        let (code, out, err) = run_bounded(cmd, Duration::from_secs(120));
        let context = format!("\n--- acpx {args:?} stdout:\n{out}\n--- stderr:\n{err}");
        assert_eq!(code, Some(0), "acpx exit status{context}");
        (out, context)
    };
    run_acpx(&["sessions", "new"]);
    let (out, context) = run_acpx(&["prompt", "Remember the word zebra."]);
    assert!(out.contains("end_turn"), "{context}");
    let saved = || -> Vec<PathBuf> {
        std::fs::read_dir(&state)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    assert_eq!(saved().len(), 1, "one saved session{context}");
    // The queue owner (and with it the agent) exits after the 1 s idle TTL: the agent's lock
    // on the transcript (flock) is released.
    let file = saved().pop().expect("the transcript");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let f = std::fs::File::open(&file).expect("open the transcript");
        // SAFETY: flock(2) on a descriptor `f` owns; closing `f` releases what it takes.
        let free = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } == 0;
        if free {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never let go of its session{context}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (out, context) = run_acpx(&["prompt", "Which word was it?"]);
    assert!(out.contains("end_turn"), "{context}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "{context}");
    let users = reqs[1].user_text();
    assert!(
        users.contains("Remember the word zebra.") && users.contains("Which word was it?"),
        "the history survived the restart: {users}{context}"
    );
    assert!(
        reqs[1].body.to_string().contains("Noted: zebra."),
        "{context}"
    );
    assert_eq!(
        saved().len(),
        1,
        "still one session, not a fresh one{context}"
    );
}

/// P3, C57 with a real hook framework: `hooks check` fails each mistake a FastMCP author makes
/// (`tests/examples/hooks/fastmcp_c57_hooks.py`): a hook misnamed `_stop` (no hook point, the
/// near miss named), a `_Stop` that raises (the server's own error text shown), a `_Stop` that
/// returns a dict or `False` (objects only by its shape). FastMCP's own stderr (its start-up
/// banner, the script's log line) reaches stderr prefixed `[server] `, never the report.
fn hooks_check_fails_real_fastmcp_hook_mistakes(ctx: &Ctx, _: &Path) {
    let python = path_str(&venv().join("bin").join("python"));
    let script = path_str(&example("hooks/fastmcp_c57_hooks.py"));
    for (mode, needles) in [
        (
            "misnamed",
            &[
                "FAIL: no hook point found (_SessionStart, _Stop, _PostCompact, _SessionEnd)",
                "near misses: _stop (rename it _Stop)",
            ][..],
        ),
        (
            "raise",
            &[
                "_Stop: found, error (isError result: ",
                "database connection refused",
            ],
        ),
        ("dict", &["a JSON object: any non-empty text would object"]),
        ("false", &["answered \"false\"", "a bare boolean"]),
    ] {
        let mut cmd = Command::new(&ctx.agent_bin);
        cmd.args(["hooks", "check", "--", &python, &script])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::temp_dir())
            .env("HOOK_MODE", mode)
            // The server gets only what the agent would pass it (SPEC S1).
            .env("BUZZ_AGENT_CHILD_ENV", "HOOK_MODE")
            .env("BUZZ_AGENT_HOOK_TIMEOUT_MS", "20000")
            .env("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "60");
        let (code, out, err) = run_bounded(cmd, Duration::from_secs(120));
        let context = format!("\n--- {mode} stdout:\n{out}\n--- stderr:\n{err}");
        assert_eq!(code, Some(1), "{mode}: the check fails{context}");
        for needle in needles {
            assert!(out.contains(needle), "{mode}: {needle:?} missing{context}");
        }
        assert!(
            err.contains(&format!("[server] c57 hook server starting in mode {mode}")),
            "{mode}: the server's stderr is prefixed{context}"
        );
        assert!(
            !out.contains("c57 hook server starting") && !out.contains("PASS"),
            "{mode}: the server's lines never reach the report{context}"
        );
    }
}
