//! The command line of SPEC P3 and the bundled example hook servers (E1, E2), run as the real
//! binary: `demo`, `exec`, `hooks check`, `example-server` (the `extras` subcommands, listed in
//! `scenarios::extras()`), `--help`, `--version`, C1 startup errors, the hint on a terminal.

use crate::fake_llm::{FakeLlm, Reply};
use crate::fake_mcp;
use crate::fake_mcp_http::{HttpFake, read_http_log};
use crate::harness::{Ctx, agent_env, current_exe};
use crate::scenarios::util::{Scratch, path_str};
use serde_json::json;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run the agent binary with `args` and a clean environment plus `env`, bounded by `limit`.
/// `hooks check` gives the server only what the agent would (SPEC S1), so the fake's and the
/// examples' settings are named in `BUZZ_AGENT_CHILD_ENV` (unless `env` sets it).
fn run(ctx: &Ctx, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(&ctx.agent_bin);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    if args.first() == Some(&"hooks") {
        cmd.env(
            "BUZZ_AGENT_CHILD_ENV",
            "BUZZ_E2E_ROLE,FAKE_MCP_*,TESTGUARD_*",
        );
    }
    cmd.envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn the agent binary");
    let pid = child.id() as i32;
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for the agent binary"),
        Err(_) => {
            crate::harness::kill_tree(pid);
            panic!(
                "`{} {}` did not finish within {limit:?} (started {:?} ago)",
                ctx.agent_bin.display(),
                args.join(" "),
                started.elapsed()
            );
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// P3: `demo` runs a complete offline session in which `_Stop` objects once and the agent
/// carries on to `end_turn`; it exits 0 and leaves no process behind.
pub fn p3_demo_runs_offline_with_one_objection(ctx: &Ctx) {
    let out = run(ctx, &["demo"], &[], Duration::from_secs(30));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("stopReason: \"end_turn\""), "{stdout}");
    assert!(stdout.contains("_Stop objections 1"), "{stdout}");
    // The objection is shown right before the reply it caused, and only once.
    let objection = stdout
        .find("[_Stop hook of `todo` objected")
        .expect("the objection is shown");
    let stop_try = stdout.find("All set").expect("the model tried to stop");
    let after = stdout
        .find("Right, the item is still open")
        .expect("the model carried on");
    assert!(stop_try < objection && objection < after, "{stdout}");
    assert_eq!(stdout.matches("[_Stop hook of").count(), 1, "{stdout}");
    assert!(stdout.contains("tool call todo: todo_done"), "{stdout}");
    assert!(
        stdout.contains("notice: hook server 'todo' objected to ending the turn"),
        "{stdout}"
    );
}

/// P3, E2: `hooks check` against the bundled `todo` server: found, answered, would not object
/// (no open item) → exit 0.
pub fn p3_e2_hooks_check_passes_the_todo_example(ctx: &Ctx) {
    let bin = ctx.agent_bin.to_string_lossy().into_owned();
    let server = [bin.as_str(), "example-server", "todo"];
    let needles = [
        "_Stop: found, answered empty",
        "_PostCompact: found, answered empty",
        "todo_add, todo_done, todo_list",
    ];
    hooks_check_of(ctx, &server, &[], 0, &needles);
}

/// P3, E1: the bundled `testguard` objects with the failing command's output, and `hooks check`
/// reports that the answer would object.
pub fn p3_e1_hooks_check_shows_testguard_objection(ctx: &Ctx) {
    let bin = ctx.agent_bin.to_string_lossy().into_owned();
    let server = [bin.as_str(), "example-server", "testguard"];
    let env = [("TESTGUARD_CMD", "echo 'FAILED test_parse'; exit 3")];
    let needles = [
        "_Stop: found, answered",
        "would object",
        "exit status 3",
        "FAILED test_parse",
    ];
    hooks_check_of(ctx, &server, &env, 0, &needles);
    let env = [("TESTGUARD_CMD", "true")];
    hooks_check_of(ctx, &server, &env, 0, &["_Stop: found, answered empty"]);
}

/// P3, H4: a hook that never answers is reported as a timeout under
/// `BUZZ_AGENT_HOOK_TIMEOUT_MS`, the check fails (exit 1) and takes about one timeout.
pub fn p3_hooks_check_reports_a_hanging_hook(ctx: &Ctx) {
    let env = [
        ("FAKE_MCP_STOP", "1"),
        ("FAKE_MCP_STOP_MODE", "hang"),
        ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "300"),
    ];
    let started = Instant::now();
    hooks_check_says(ctx, &env, 1, &["_Stop: found, timeout after 300 ms"]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

/// C1, P3, C30 (d): `--help` lists every variable with its default; `--version` prints the
/// version; a bad value exits 2 with one line naming the variable (the hook timeout: `0`, `abc`
/// and over 600000 ms are startup errors); a missing provider names it.
pub fn c1_p3_c30_help_version_and_config_errors(ctx: &Ctx) {
    let help = run(ctx, &["--help"], &[], Duration::from_secs(10));
    let h = text(&help.stdout);
    assert!(help.status.success());
    for var in [
        "BUZZ_AGENT_PROVIDER",
        "MCP_HOOK_SERVERS",
        "BUZZ_AGENT_HOOK_TIMEOUT_MS",
        "BUZZ_AGENT_STOP_MAX_REJECTIONS",
        "[2500]",
        "[32768]",
    ] {
        assert!(h.contains(var), "--help lacks {var}: {h}");
    }
    // The extras subcommands are listed exactly when the binary has them; without them they
    // are a usage error that says so.
    assert_eq!(
        h.contains(" hooks check -- ") && h.contains(" demo [--interceptors | --llm [ADDR]]\n"),
        ctx.has_extras,
        "{h}"
    );
    if !ctx.has_extras {
        for sub in [
            &["demo"][..],
            &["exec", "hello"],
            &["hooks", "check", "--", "true"],
            &["example-server", "todo"],
        ] {
            let out = run(ctx, sub, &[], Duration::from_secs(10));
            let e = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{sub:?}: {e}");
            assert!(
                e.contains("not part of this minimal build") && e.contains("extras"),
                "{e}"
            );
        }
    }
    let v = run(ctx, &["--version"], &[], Duration::from_secs(10));
    assert!(
        v.status.success() && text(&v.stdout).contains(env!("CARGO_PKG_VERSION")),
        "{}",
        text(&v.stdout)
    );
    for value in ["0", "abc", "600001", "2.5"] {
        let bad = run(
            ctx,
            &[],
            &[
                ("BUZZ_AGENT_PROVIDER", "openai"),
                ("OPENAI_COMPAT_MODEL", "m"),
                ("BUZZ_AGENT_HOOK_TIMEOUT_MS", value),
            ],
            Duration::from_secs(10),
        );
        let e = text(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{value}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
        assert!(
            e.contains("BUZZ_AGENT_HOOK_TIMEOUT_MS") && e.contains(&format!("\"{value}\"")),
            "{e}"
        );
    }
    let star = run(
        ctx,
        &[],
        &[
            ("BUZZ_AGENT_PROVIDER", "openai"),
            ("OPENAI_COMPAT_MODEL", "m"),
            ("MCP_HOOK_SERVERS", "*,todo"),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(star.status.code(), Some(2));
    assert!(
        text(&star.stderr).contains("MCP_HOOK_SERVERS"),
        "{}",
        text(&star.stderr)
    );
    let none = run(ctx, &[], &[], Duration::from_secs(10));
    assert_eq!(none.status.code(), Some(2));
    assert!(
        text(&none.stderr).contains("BUZZ_AGENT_PROVIDER"),
        "{}",
        text(&none.stderr)
    );
}

/// A pseudo-terminal: (master, slave), both close-on-exec (opened by `std::fs`, which always
/// sets `O_CLOEXEC`), so that no other process the suite starts meanwhile inherits the master
/// and keeps the terminal open.
fn open_pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let open = |path: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(path)
            .unwrap_or_else(|e| panic!("open {path}: {e}"))
    };
    let master = open("/dev/ptmx");
    let fd = master.as_raw_fd();
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: fd is an open pty master; ptsname_r writes a NUL-terminated path into `name`.
    let ok = unsafe {
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0
    };
    assert!(ok, "pty setup: {}", std::io::Error::last_os_error());
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    let slave = open(&path.to_string_lossy());
    (master, slave)
}

/// P3 (issue 12): started with a terminal on stdin (a pseudo-terminal here), the agent tells
/// the person on stderr what it is and how to talk to it — naming `demo` and `exec` only where
/// the binary has them — and then serves as usual (EOF ends it, exit 0). With a pipe on stdin
/// (an ACP client) it says nothing of the kind.
pub fn p3_a_terminal_on_stdin_gets_a_hint_and_a_pipe_does_not(ctx: &Ctx) {
    let env = [
        ("BUZZ_AGENT_PROVIDER", "openai"),
        ("OPENAI_COMPAT_MODEL", "m"),
        ("OPENAI_COMPAT_BASE_URL", "http://127.0.0.1:9/v1"),
    ];
    let (master, slave) = open_pty();
    let mut child = Command::new(&ctx.agent_bin)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdin(Stdio::from(slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the agent on a pty");
    let pid = child.id() as i32;
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines: Vec<String> = Vec::new();
    let hint = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains("this is an ACP agent") => break l,
            Ok(l) => lines.push(l),
            Err(_) => {
                crate::harness::kill_tree(pid);
                panic!("no hint on stderr within 20 s; stderr so far: {lines:#?}");
            }
        }
    };
    let bin = ctx
        .agent_bin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    assert!(
        hint.starts_with(&format!("{bin}: ")) && hint.contains("ACP client"),
        "{hint}"
    );
    assert_eq!(
        hint.contains(&format!("`{bin} demo`")) && hint.contains(&format!("`{bin} exec")),
        ctx.has_extras,
        "the hint names demo and exec exactly when the binary has them: {hint}"
    );
    if !ctx.has_extras {
        assert!(!hint.contains("demo") && !hint.contains("exec"), "{hint}");
    }
    // Closing the terminal is EOF for the agent: a clean exit.
    drop(master);
    let limit = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > limit {
            crate::harness::kill_tree(pid);
            panic!("the agent did not exit after its terminal closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let piped = run(ctx, &[], &env, Duration::from_secs(10));
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    assert!(
        !text(&piped.stderr).contains("this is an ACP agent"),
        "{}",
        text(&piped.stderr)
    );
}

/// C1 (issue 12): every configuration error is reported in one run, one line each naming the
/// variable, exit 2; the default OpenAI URL without a key is a start-up warning, not an error.
pub fn c1_every_configuration_error_is_reported_in_one_run(ctx: &Ctx) {
    let out = run(
        ctx,
        &[],
        &[
            ("BUZZ_AGENT_PROVIDER", "openai"),
            ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "0"),
            ("BUZZ_AGENT_PERMISSION", "deny"),
            ("BUZZ_AGENT_LOG", "loud"),
        ],
        Duration::from_secs(10),
    );
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    let errors: Vec<&str> = e
        .lines()
        .filter(|l| l.contains("configuration error: "))
        .collect();
    assert_eq!(errors.len(), 4, "{e}");
    for (line, var) in errors.iter().zip([
        "OPENAI_COMPAT_MODEL",
        "BUZZ_AGENT_HOOK_TIMEOUT_MS",
        "BUZZ_AGENT_PERMISSION",
        "BUZZ_AGENT_LOG",
    ]) {
        assert!(
            line.contains(&format!("configuration error: {var}: ")),
            "{line}"
        );
    }
    let warned = run(
        ctx,
        &[],
        &[
            ("BUZZ_AGENT_PROVIDER", "openai"),
            ("OPENAI_COMPAT_MODEL", "m"),
        ],
        Duration::from_secs(10),
    );
    let w = text(&warned.stderr);
    assert!(warned.status.success(), "{w}");
    let line = w
        .lines()
        .find(|l| l.contains("WARN") && l.contains("OPENAI_COMPAT_API_KEY is empty"))
        .unwrap_or_else(|| panic!("no warning about the key: {w}"));
    assert!(line.contains("https://api.openai.com/v1"), "{line}");
}

/// A fake MCP server run by `hooks check` (or an `--mcp-config` entry): this test binary with
/// `BUZZ_E2E_ROLE=fake-mcp` and `env`.
fn fake_env<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![("BUZZ_E2E_ROLE", "fake-mcp")];
    all.extend_from_slice(env);
    all
}

/// `hooks check -- <server…>` with `env` (as given), which must exit `code` with every one of
/// `needles` in its report (stdout); (stdout, stderr).
fn hooks_check_of(
    ctx: &Ctx,
    server: &[&str],
    env: &[(&str, &str)],
    code: i32,
    needles: &[&str],
) -> (String, String) {
    let mut args = vec!["hooks", "check", "--"];
    args.extend_from_slice(server);
    let got = run(ctx, &args, env, Duration::from_secs(30));
    let (out, err) = (text(&got.stdout), text(&got.stderr));
    assert_eq!(got.status.code(), Some(code), "{env:?}: {out}\n{err}");
    for needle in needles {
        assert!(out.contains(needle), "{env:?}: no {needle:?} in {out}");
    }
    (out, err)
}

/// [`hooks_check_of`] the fake MCP server with `env`.
fn hooks_check_says(
    ctx: &Ctx,
    env: &[(&str, &str)],
    code: i32,
    needles: &[&str],
) -> (String, String) {
    let fake = current_exe();
    hooks_check_of(ctx, &[&fake], &fake_env(env), code, needles)
}

/// What `hooks check` says of a server without a hook point.
const NO_HOOK_POINT: &str =
    "FAIL: no hook point found (_SessionStart, _Stop, _PostCompact, _SessionEnd)";

/// P3, C57: a server without a hook point fails the check with `FAIL: no hook point found`
/// and the names that nearly are one (a misnamed `_stop`); a server with no hook-like name at
/// all fails too, saying it has none.
pub fn p3_c57_hooks_check_fails_without_a_hook_point_and_names_near_misses(ctx: &Ctx) {
    let misnamed = [("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_NAME", "_stop")];
    let near = "near misses: _stop (rename it _Stop)";
    let (out, _) = hooks_check_says(ctx, &misnamed, 1, &[NO_HOOK_POINT, near]);
    assert!(!out.contains("PASS"), "{out}");
    let none = "this server has none";
    hooks_check_says(
        ctx,
        &[("FAKE_MCP_TOOLS", "echo")],
        1,
        &[NO_HOOK_POINT, none],
    );
}

/// P3, C57: a hook that fails shows the server's own error text (an `isError` result's text, a
/// JSON-RPC error's message); the server's stderr lines reach stderr prefixed `[server] `, never
/// the report on stdout.
pub fn p3_c57_hooks_check_shows_the_servers_error_text_and_prefixes_its_stderr(ctx: &Ctx) {
    let env = [
        ("FAKE_MCP_STOP", "1"),
        ("FAKE_MCP_STOP_MODE", "iserror"),
        ("FAKE_MCP_STOP_TEXT", "database connection refused"),
        ("FAKE_MCP_STDERR_LINES", "2"),
    ];
    let text = "_Stop: found, error (isError result: \"database connection refused\")";
    let (out, err) = hooks_check_says(ctx, &env, 1, &[text]);
    for i in 0..2 {
        assert!(
            err.contains(&format!("[server] stderr line {i}\n")),
            "{err}"
        );
    }
    assert!(
        !out.contains("stderr line"),
        "server lines never reach the report: {out}"
    );
    let rpc = "JSON-RPC error -32000: \"stop hook failed on purpose\"";
    let env = [("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_MODE", "error")];
    hooks_check_says(ctx, &env, 1, &[rpc]);
}

/// P3, C57: a hook answer that would object only because of its shape (a JSON object from a
/// FastMCP hook returning a dict, a bare `False`) fails the check and says why; ordinary
/// objection text passes.
pub fn p3_c57_hooks_check_flags_answers_that_object_only_by_their_shape(ctx: &Ctx) {
    for (answer, shape) in [
        ("{\"ok\": true}", "a JSON object"),
        ("False", "a bare boolean"),
        ("None", "a bare null/None"),
    ] {
        let why = format!("— {shape}: any non-empty text would object");
        let env = [("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_TEXT", answer)];
        hooks_check_says(ctx, &env, 1, &[&why, "return an empty string"]);
    }
    let objects = "would object: \"tests are still red\"";
    hooks_check_says(ctx, &[("FAKE_MCP_STOP", "1")], 0, &[objects]);
}

/// P3, C64: `hooks check` reads and judges a hook's answer with the agent's own code (its line
/// codec and message parser, `hooks::classify_reply`): a `_Stop` answer whose text holds lone
/// surrogate escapes, which a strict JSON parser rejects, is an answer that would object, with
/// the text the agent gives the model. (A checker with a parser of its own skipped the line
/// and reported a timeout: exit 1 for a hook the agent runs.)
pub fn p3_c64_hooks_check_judges_a_hook_answer_as_the_agent_does(ctx: &Ctx) {
    let env = [("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_MODE", "surrogates")];
    let objects = format!("would object: {:?}", fake_mcp::SURROGATE_TEXT_LOSSY);
    hooks_check_says(ctx, &env, 0, &["_Stop: found, answered, ", &objects]);
}

/// P3: `hooks check` reads a server's tool list with the agent's own listing code. A tool the
/// agent drops for its schema is not model-visible and is noted with the agent's reason. A list
/// the agent cuts (at its tool cap within a page, at its page cap) hides the hooks listed after
/// the cut: no PASS, although the server answers every hook it lists (a checker that read the
/// whole list called them and passed).
pub fn p3_hooks_check_lists_the_tools_and_hooks_the_agent_would_see(ctx: &Ctx) {
    let env = [("FAKE_MCP_STOP", "1"), ("FAKE_MCP_TOOLS", "echo,scalar")];
    let visible = "ok    1 model-visible tool(s): echo\n";
    let dropped = "note  scalar: dropped: inputSchema root type is \"string\", not \"object\"\n";
    hooks_check_says(ctx, &env, 0, &[visible, dropped, "PASS"]);

    let never = "a hook point listed after that is never called";
    let env = [("FAKE_MCP_STOP", "1"), ("FAKE_MCP_TOOL_COUNT", "1000")];
    let cut = "note  the agent stops reading the list here: tools/list has more than 1000 tools; \
               the rest is cut off\n";
    let (out, _) = hooks_check_says(ctx, &env, 1, &[cut, NO_HOOK_POINT, never]);
    assert!(
        !out.contains("PASS") && !out.contains("_Stop: found"),
        "{out}"
    );

    // 102 entries a page each: `echo`, `t0`..`t97`, `_Stop` on page 100, `_Other` and
    // `_SessionStart` after the agent's last page.
    let env = [
        ("FAKE_MCP_STOP", "1"),
        ("FAKE_MCP_SESSION_START_TEXT", ""),
        ("FAKE_MCP_TOOL_COUNT", "98"),
        ("FAKE_MCP_PAGE_SIZE", "1"),
    ];
    let stopped =
        "note  the agent stops reading the list here: tools/list exceeded 100 pages; stopping\n";
    let needles = [
        "ok    99 model-visible tool(s): echo, t0, t1, ",
        "      hook tool(s): _Stop\n",
        stopped,
        "--    _SessionStart: not found\n",
        "ok    _Stop: found, answered, ",
        never,
    ];
    let (out, _) = hooks_check_says(ctx, &env, 1, &needles);
    assert!(!out.contains("PASS"), "{out}");
}

/// P3, issue 12: a server that exits is reported as exited — its exit status and its last
/// stderr lines — at once, even when a launcher's grandchild keeps its stdout open (without
/// the exit check that is a 30 s handshake timeout); one that exits after the handshake is
/// reported the same way at `tools/list`.
pub fn p3_hooks_check_reports_an_exited_server_at_once(ctx: &Ctx) {
    let fake = current_exe();
    let started = Instant::now();
    let out = run(
        ctx,
        &[
            "hooks",
            "check",
            "--",
            "sh",
            "-c",
            "sleep 60 & exec \"$0\"",
            &fake,
        ],
        &fake_env(&[("FAKE_MCP_FAIL_START", "1")]),
        Duration::from_secs(25),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("FAIL  initialize: the server exited (exit status 3)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[server] boom: start failure requested"),
        "the report carries the stderr tail: {stdout}"
    );
    assert!(!stdout.contains("timeout"), "{stdout}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    let exited = "FAIL  tools/list: the server exited (exit status 3)";
    let env = [("FAKE_MCP_EXIT_AFTER_INIT", "1")];
    hooks_check_says(ctx, &env, 1, &[exited, "[server] fatal: db locked"]);
}

/// P3, issue 12: `hooks` alone prints its usage (what `check` does, an example, the exit
/// statuses) and exits 2; `hooks --help` prints it on stdout and exits 0.
pub fn p3_hooks_alone_prints_its_usage(ctx: &Ctx) {
    let out = run(ctx, &["hooks"], &[], Duration::from_secs(10));
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    for needle in [
        "usage: ",
        "hooks check -- <command>",
        "example: ",
        "exit status: 0",
    ] {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    let help = run(ctx, &["hooks", "--help"], &[], Duration::from_secs(10));
    assert_eq!(help.status.code(), Some(0));
    assert_eq!(text(&help.stdout).trim(), e.trim());
}

/// Writes an `--mcp-config` file in the Claude Code / Cursor format.
pub(crate) fn mcp_config(s: &Scratch, servers: serde_json::Value) -> String {
    let path = s.file("mcp.json");
    std::fs::write(&path, json!({"mcpServers": servers}).to_string()).expect("write mcp.json");
    path
}

/// The agent's environment for `exec` against `llm` (the agent's own variables; `exec` sets
/// `BUZZ_AGENT_PERMISSION=ask` itself).
pub(crate) fn exec_env(llm: &FakeLlm) -> Vec<(String, String)> {
    agent_env(llm)
}

pub(crate) fn exec(
    ctx: &Ctx,
    args: &[&str],
    env: &[(String, String)],
) -> (Option<i32>, String, String) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut all = vec!["exec"];
    all.extend_from_slice(args);
    let out = run(ctx, &all, &env, Duration::from_secs(60));
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// `exec --cwd <the scratch workspace> --mcp-config <config> --approve all <prompt>`.
pub(crate) fn exec_approving_all(
    ctx: &Ctx,
    s: &Scratch,
    config: &str,
    prompt: &str,
    env: &[(String, String)],
) -> (Option<i32>, String, String) {
    let ws = path_str(&s.ws);
    let args = [
        "--cwd",
        &ws,
        "--mcp-config",
        config,
        "--approve",
        "all",
        prompt,
    ];
    exec(ctx, &args, env)
}

/// P3, E2, issue 12: `exec` runs one prompt end to end on the LLM the environment names, with
/// the MCP servers of an `--mcp-config` file in the Claude Code format (the fake MCP server and
/// the bundled `todo` hook server; a `ws` entry skipped with a warning): the model's text
/// on stdout, `[tool]` / `[permission]` / `[stop]` lines on stderr, every tool call asked for
/// and allowed by `--approve all`, the `todo` server's `_Stop` objecting once (shown on the
/// `[stop]` line), exit 0 on `end_turn`.
pub fn p3_e2_exec_runs_a_prompt_end_to_end_with_mcp_servers_and_a_hook(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["calls.log"]);
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![
            ("c1", "fs__echo", json!({"text": "hello"})),
            ("c2", "todo__todo_add", json!({"item": "ship"})),
        ]),
        Reply::text("All done."),
        Reply::tool_calls(vec![("c3", "todo__todo_done", json!({"item": "ship"}))])
            .with_text("Right, closing the item."),
        Reply::text("Shipped."),
    ]);
    let config = mcp_config(
        &s,
        json!({
            "fs": {"command": current_exe(), "env": {"BUZZ_E2E_ROLE": "fake-mcp", "FAKE_MCP_CALL_LOG": log}},
            "todo": {"command": path_str(&ctx.agent_bin), "args": ["example-server", "todo"]},
            "remote": {"type": "ws", "url": "wss://example.invalid/mcp"},
        }),
    );
    let mut env = exec_env(&llm);
    env.push(("MCP_HOOK_SERVERS".into(), "todo".into()));
    let (code, out, err) = exec_approving_all(ctx, &s, &config, "Echo hello, then ship it.", &env);
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let (done, shipped) = (out.find("All done."), out.find("Shipped."));
    assert!(
        done.is_some() && shipped.is_some() && done < shipped,
        "the model's text, in order, on stdout: {out}"
    );
    assert!(!out.contains("[tool]") && !out.contains("[stop]"), "{out}");
    assert!(
        err.contains("server \"remote\": skipped: transport \"ws\" is not supported"),
        "{err}"
    );
    assert!(
        err.contains("[tool] fs: echo (other) {\"text\":\"hello\"}"),
        "{err}"
    );
    assert!(err.contains("[tool] fs: echo completed: hello"), "{err}");
    assert!(err.contains("[tool] todo: todo_done completed"), "{err}");
    // Why the turn went on, and the answers a paragraph apart.
    assert!(
        err.contains("[hook] hook server 'todo' objected to ending the turn; the agent continues."),
        "{err}"
    );
    assert!(
        out.contains("All done.\n\nRight, closing the item.\n\nShipped."),
        "{out:?}"
    );
    assert_eq!(
        err.matches("[permission] ").count(),
        3,
        "every model tool call is asked for, hooks never: {err}"
    );
    assert_eq!(err.matches("allowed (--approve all)").count(), 3, "{err}");
    assert!(
        err.contains("[stop] end_turn (LLM rounds 4, _Stop objections 1)"),
        "{err}"
    );
    let logged = fake_mcp::read_call_log(std::path::Path::new(&log));
    assert_eq!(fake_mcp::count_calls(&logged, "echo"), 1);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[0].user_text(), "Echo hello, then ship it.");
    assert_eq!(reqs[1].tool_result_for("c1").as_deref(), Some("hello"));
}

/// P3, M10: an `--mcp-config` entry with a `url` (Claude Code's remote form, no `type`) is a
/// Streamable HTTP server of the session like an ACP `http` entry: its `headers` (with
/// `${VAR}` expanded from `exec`'s environment) go with every request, and the model's call
/// of its tool is answered.
pub fn m10_exec_connects_the_http_entries_of_an_mcp_config(ctx: &Ctx) {
    let (s, [log]) = Scratch::with_files(["http.log"]);
    let server_env = [
        ("FAKE_MCP_TOOLS", "echo"),
        ("FAKE_MCP_HTTP_TOKEN", "tok-123"),
    ];
    let mut server_env = server_env.to_vec();
    server_env.push(("FAKE_MCP_HTTP_LOG", &log));
    let fake = HttpFake::start(s.dir.path(), &server_env);
    let llm = FakeLlm::scripted(vec![
        Reply::tool_calls(vec![("c1", "remote__echo", json!({"text": "over http"}))]),
        Reply::text("Echoed."),
    ]);
    let config = mcp_config(
        &s,
        json!({"remote": {"url": fake.url(),
                          "headers": {"Authorization": "Bearer ${REMOTE_TOKEN}", "X-Team": "buzz"}}}),
    );
    let mut env = exec_env(&llm);
    env.push(("REMOTE_TOKEN".into(), "tok-123".into()));
    let (code, out, err) = exec_approving_all(ctx, &s, &config, "Echo.", &env);
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("Echoed."), "{out}");
    assert!(!err.contains("warning:"), "{err}");
    assert!(
        err.contains("[tool] remote: echo completed: over http"),
        "{err}"
    );
    let requests = read_http_log(&log);
    assert!(
        requests.iter().any(|r| r["method"] == "POST"),
        "{requests:?}"
    );
    for r in requests.iter().filter(|r| r["method"] == "POST") {
        assert_eq!(r["auth"], json!(true), "{r}");
        assert_eq!(r["status"].as_u64().map(|s| s < 400), Some(true), "{r}");
        assert_eq!(
            r["headers"]["x-team"], "buzz",
            "the entry's header on every request: {r}"
        );
    }
}

/// A7, C53, issue 12: `exec` answers permission requests by `--approve`: the default
/// (`reads`) allows only tool calls of kind `read` (the fake server's `read`, annotated
/// `readOnlyHint`), so it runs `read` and denies `echo` (kind `other`) and says how to allow
/// it; `none` denies both. A denied tool never runs, the model hears it was not authorized,
/// and the turn still ends `end_turn` (exit 0).
pub fn a7_exec_approve_reads_and_none_deny_tools_that_are_not_reads(ctx: &Ctx) {
    for approve in [None, Some("none")] {
        let (s, [log]) = Scratch::with_files(["calls.log"]);
        let llm = FakeLlm::scripted(vec![
            Reply::tool_calls(vec![
                ("c0", "fs__read", json!({"text": "a note"})),
                ("c1", "fs__echo", json!({"text": "hello"})),
            ]),
            Reply::text("I was not allowed to echo."),
        ]);
        let config = mcp_config(
            &s,
            json!({"fs": {"command": current_exe(),
                          "env": {"BUZZ_E2E_ROLE": "fake-mcp", "FAKE_MCP_CALL_LOG": log,
                                  "FAKE_MCP_TOOLS": "read,echo"}}}),
        );
        let ws = path_str(&s.ws);
        let mut args = vec!["--cwd", ws.as_str(), "--mcp-config", config.as_str()];
        if let Some(a) = approve {
            args.extend(["--approve", a]);
        }
        args.push("Echo hello.");
        let (code, out, err) = exec(ctx, &args, &exec_env(&llm));
        assert_eq!(code, Some(0), "{approve:?}: stdout:\n{out}\nstderr:\n{err}");
        assert!(
            err.contains("[permission] fs: echo (other): denied"),
            "{err}"
        );
        let reqs = llm.requests();
        let logged = fake_mcp::read_call_log(std::path::Path::new(&log));
        match approve {
            None => {
                assert!(
                    err.contains("--approve reads allows kind read only")
                        && err.contains("--approve all allows it"),
                    "{err}"
                );
                assert!(
                    err.contains(
                        r#"[permission] fs: read ("Read Note") (read): allowed (--approve reads)"#
                    ),
                    "{err}"
                );
                assert_eq!(fake_mcp::count_calls(&logged, "read"), 1, "the read ran");
                assert_eq!(reqs[1].tool_result_for("c0").as_deref(), Some("a note"));
            }
            Some(_) => {
                assert!(err.contains("denied (--approve none)"), "{err}");
                assert_eq!(fake_mcp::count_calls(&logged, "read"), 0);
            }
        }
        assert!(err.contains("[tool] fs: echo failed"), "{err}");
        assert!(out.contains("I was not allowed to echo."), "{out}");
        assert!(err.contains("[stop] end_turn"), "{err}");
        assert_eq!(
            fake_mcp::count_calls(&logged, "echo"),
            0,
            "denied: never run"
        );
        let result = reqs[1].tool_result_for("c1").unwrap_or_default();
        assert!(result.contains("not authorized"), "{result}");
    }
}

/// L5, A3, issue 12: when the LLM fails (401, no retry), `exec` prints the prompt's `llm:`
/// error with the provider's status and message and exits 1.
pub fn l5_exec_prints_an_llm_error_and_exits_1(ctx: &Ctx) {
    let llm = FakeLlm::scripted(vec![Reply::status(
        401,
        vec![("content-type", "application/json")],
        r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}"#,
    )]);
    let s = Scratch::new();
    let ws = path_str(&s.ws);
    let (code, out, err) = exec(ctx, &["--cwd", &ws, "Say hi."], &exec_env(&llm));
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    let line = err
        .lines()
        .find(|l| l.contains("exec: the prompt failed: llm"))
        .unwrap_or_else(|| panic!("no prompt error on stderr: {err}"));
    assert!(
        line.contains("401") && line.contains("Incorrect API key provided"),
        "{line}"
    );
    assert!(!err.contains("[stop]"), "{err}");
}

/// C1, issue 12: `exec` usage errors (no prompt, a `--cwd` that is missing or not a directory,
/// named with the reason, a bad `--approve`, a missing or invalid
/// `--mcp-config`) and the agent's own configuration error all exit 2 with the reason.
pub fn c1_exec_usage_config_file_and_configuration_errors_exit_2(ctx: &Ctx) {
    let llm = FakeLlm::scripted(vec![]);
    let env = exec_env(&llm);
    let (s, [bad_json]) = Scratch::with_files(["bad.json"]);
    std::fs::write(&bad_json, "{\"mcpServers\": {\"a\": {}}}").expect("write");
    let missing = s.file("missing.json");
    let no_dir = s.file("no-such-dir");
    let cwd_missing = format!("--cwd {no_dir}: No such file");
    for (args, needle) in [
        (vec![], "no prompt given"),
        (vec!["--cwd", no_dir.as_str(), "hi"], cwd_missing.as_str()),
        (
            vec!["--cwd", bad_json.as_str(), "hi"],
            "bad.json: not a directory",
        ),
        (vec!["--approve", "maybe", "hi"], "--approve \"maybe\""),
        (vec!["--mcp-config", missing.as_str(), "hi"], "missing.json"),
        (
            vec!["--mcp-config", bad_json.as_str(), "hi"],
            "server \"a\": no \"command\"",
        ),
    ] {
        let (code, out, err) = exec(ctx, &args, &env);
        assert_eq!(code, Some(2), "{args:?}: {out}\n{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let (code, _, err) = exec(ctx, &["hi"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("configuration error: BUZZ_AGENT_PROVIDER")
            && err.contains("the agent did not start"),
        "{err}"
    );
}

/// The first ```` ```sh ```` block after `marker` in README.md.
fn readme_block(marker: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("read README.md");
    readme
        .split_once(marker)
        .and_then(|(_, rest)| rest.split_once("```sh\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block.to_string())
        .unwrap_or_else(|| panic!("the README has a sh block after {marker:?}"))
}

/// What a README block printed, and how long it took.
struct BlockRun {
    stdout: String,
    /// stdout and stderr, for assertion messages.
    context: String,
    took: Duration,
}

/// Runs a README block with `sh -c` in `dir`, in an environment holding only `PATH` and a
/// scratch `HOME` (a fresh shell with no provider configured), as written but for the binary's
/// path and the scripted LLM's port (a free one, so parallel runs do not collide); at most 60 s.
/// Panics unless it exits 0.
fn run_readme_block(ctx: &Ctx, block: &str, dir: &std::path::Path) -> BlockRun {
    assert!(
        block.contains("./target/release/buzz-agent") && block.contains("127.0.0.1:8765"),
        "{block}"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let script = block
        .replace("./target/release/buzz-agent", &path_str(&ctx.agent_bin))
        .replace("127.0.0.1:8765", &format!("127.0.0.1:{port}"));
    let s = Scratch::new();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script])
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", s.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = cmd.spawn().expect("spawn sh");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("wait for sh"),
        Err(_) => {
            crate::harness::kill_tree(pid);
            panic!("the README block did not finish within 60 s:\n{script}");
        }
    };
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}");
    assert!(out.status.success(), "{:?}{context}", out.status);
    BlockRun {
        stdout,
        context,
        took,
    }
}

/// The README's "By hand, in JSON" block, pasted into a shell as written (issue 25): with no
/// provider in the environment it starts `demo --llm`, points the agent at it, and ends as soon
/// as the prompt is answered, not after a fixed sleep. Only the binary's path and the port are
/// replaced. The three answers arrive, the scripted LLM's sentence quotes the prompt, the
/// prompt ends `end_turn`, and the whole block takes seconds.
pub fn p3_the_readme_json_by_hand_block_runs_as_written(ctx: &Ctx) {
    let s = Scratch::new();
    let run = run_readme_block(ctx, &readme_block("**By hand, in JSON**"), &s.ws);
    let context = &run.context;
    let frames: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for id in [1, 2, 3] {
        assert_eq!(
            frames.iter().filter(|f| f["id"] == id).count(),
            1,
            "one answer to id {id}{context}"
        );
    }
    let answer = frames.iter().find(|f| f["id"] == 3).expect("id 3");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{context}");
    let said: String = frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert!(
        said.contains("scripted demo LLM") && said.contains("Say hello in five words."),
        "{said}{context}"
    );
    assert!(
        run.took < Duration::from_secs(15),
        "the block waits for the answer, not a fixed time: {:?}{context}",
        run.took
    );
}

/// The README's "Project instructions and skills, offline" block, run as written from the
/// repository's root (issue 24; SPEC A10 on the fixture project `tests/fixtures/project`): the
/// first `exec` answer quotes the fixture's `AGENTS.md` (so its text reached the model's
/// request) and names both of its skills; in the second the model calls `load_skill`, shown as
/// a `read` tool call, and quotes the skill's body.
pub fn a10_p3_the_readme_fixture_project_shows_its_instructions_and_loads_a_skill(ctx: &Ctx) {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let fixture = root.join("tests/fixtures/project");
    let block = readme_block("**Project instructions and skills, offline.**");
    assert!(
        block.contains("--cwd tests/fixtures/project"),
        "the block runs on the fixture: {block}"
    );
    let run = run_readme_block(ctx, &block, root);
    let context = &run.context;
    let first_rule = |path: &std::path::Path| -> String {
        let text = std::fs::read_to_string(path).expect("read the fixture");
        let body = text.rsplit("---\n").next().unwrap_or(&text).to_string();
        body.lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .expect("a first line")
            .to_string()
    };
    let rule = first_rule(&fixture.join("AGENTS.md"));
    let agents_md = path_str(
        &fixture
            .join("AGENTS.md")
            .canonicalize()
            .expect("the fixture"),
    );
    assert!(
        run.stdout.contains(&rule) && run.stdout.contains(&agents_md),
        "the fixture's instructions reached the model: {rule:?}{context}"
    );
    let skill = fixture.join(".agents/skills/release-notes/SKILL.md");
    assert!(
        run.stdout
            .contains("Skills offered: changelog-check, release-notes")
            || run
                .stdout
                .contains("Skills offered: release-notes, changelog-check"),
        "both skills are listed{context}"
    );
    let step = first_rule(&skill);
    assert!(
        context.contains("[tool] Load skill (read) {\"name\":\"release-notes\"}")
            && run.stdout.contains(&format!(
                "I loaded the skill release-notes, which begins \"{step}\""
            )),
        "load_skill returned the body{context}"
    );
}
