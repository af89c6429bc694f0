//! The command line of SPEC P3 and the bundled example hook servers (E1, E2), run as the real
//! binary: `demo`, `hooks check`, `example-server` (the `extras` subcommands, listed in
//! `scenarios::extras()`), `--help`, `--version`, C1 startup errors.

use crate::harness::{Ctx, current_exe};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run the agent binary with `args` and a clean environment plus `env`, bounded by `limit`.
fn run(ctx: &Ctx, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(&ctx.agent_bin);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
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
    assert!(stdout.contains("todo__todo_done"), "{stdout}");
}

/// P3, E2: `hooks check` against the bundled `todo` server: found, answered, would not object
/// (no open item) → exit 0.
pub fn p3_e2_hooks_check_passes_the_todo_example(ctx: &Ctx) {
    let bin = ctx.agent_bin.to_string_lossy().into_owned();
    let out = run(
        ctx,
        &["hooks", "check", "--", &bin, "example-server", "todo"],
        &[],
        Duration::from_secs(20),
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("_Stop: found, answered empty"), "{stdout}");
    assert!(
        stdout.contains("_PostCompact: found, answered empty"),
        "{stdout}"
    );
    assert!(
        stdout.contains("todo_add, todo_done, todo_list"),
        "{stdout}"
    );
}

/// P3, E1: the bundled `testguard` objects with the failing command's output, and `hooks check`
/// reports that the answer would object.
pub fn p3_e1_hooks_check_shows_testguard_objection(ctx: &Ctx) {
    let bin = ctx.agent_bin.to_string_lossy().into_owned();
    let env = [("TESTGUARD_CMD", "echo 'FAILED test_parse'; exit 3")];
    let out = run(
        ctx,
        &["hooks", "check", "--", &bin, "example-server", "testguard"],
        &env,
        Duration::from_secs(20),
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("_Stop: found, answered") && stdout.contains("would object"),
        "{stdout}"
    );
    assert!(
        stdout.contains("exit status 3") && stdout.contains("FAILED test_parse"),
        "{stdout}"
    );
    let pass = run(
        ctx,
        &["hooks", "check", "--", &bin, "example-server", "testguard"],
        &[("TESTGUARD_CMD", "true")],
        Duration::from_secs(20),
    );
    assert!(
        text(&pass.stdout).contains("_Stop: found, answered empty"),
        "{}",
        text(&pass.stdout)
    );
}

/// P3, H4: a hook that never answers is reported as a timeout under
/// `BUZZ_AGENT_HOOK_TIMEOUT_MS`, the check fails (exit 1) and takes about one timeout.
pub fn p3_hooks_check_reports_a_hanging_hook(ctx: &Ctx) {
    let fake = current_exe();
    let env = [
        ("BUZZ_E2E_ROLE", "fake-mcp"),
        ("FAKE_MCP_STOP", "1"),
        ("FAKE_MCP_STOP_MODE", "hang"),
        ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "300"),
    ];
    let started = Instant::now();
    let out = run(
        ctx,
        &["hooks", "check", "--", &fake],
        &env,
        Duration::from_secs(20),
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("_Stop: found, timeout after 300 ms"),
        "{stdout}"
    );
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
        h.contains(" hooks check -- ") && h.contains(" demo\n"),
        ctx.has_extras,
        "{h}"
    );
    if !ctx.has_extras {
        for sub in [
            &["demo"][..],
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
