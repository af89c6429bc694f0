//! Least privilege (SPEC S1–S8, issue 26): what an MCP server, its output and the model cannot
//! reach or forge. Each scenario names the promise it holds (docs/threat-model.md lists them).

use super::setup::Setup;
use super::util::{Scratch, wait_file};
use crate::harness::{AGENT_UID_VAR, Ctx, SECRET_KEY};
use serde_json::Value;
use std::time::Duration;

/// `nobody`'s user and group id.
const NOBODY: u32 = 65534;

/// SPEC S1: the agent is not dumpable, so a server running as the same user (and without
/// `CAP_SYS_PTRACE`, which no server needs) cannot read the agent's environment, and the key
/// in it, from `/proc/<agent>/environ`.
///
/// As root the agent runs as `nobody` here: a root agent's environment is closed to its root
/// children by their missing capabilities already, so only an unprivileged agent shows what
/// "not dumpable" adds (its `/proc` files then belong to root, not to the agent's user).
pub fn s1_a_server_cannot_read_the_agents_environment_through_proc(ctx: &Ctx) {
    let s = Scratch::new();
    let report = s.file("parent-environ.json");
    let mut env: Vec<(&str, &str)> = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        for dir in [s.dir.path(), s.ws.as_path()] {
            std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).expect("chown scratch");
        }
        env.extend([(AGENT_UID_VAR, "65534"), ("BUZZ_AGENT_STATE_DIR", "off")]);
    }
    let (_llm, agent, _sid) = Setup::new(ctx, &s)
        .env(&env)
        .fake_mcp("peek", &[("FAKE_MCP_PARENT_ENVIRON", &report)])
        .start();
    let got: Value =
        serde_json::from_str(&wait_file(&report, Duration::from_secs(5))).expect("JSON report");
    assert_eq!(
        got["ok"],
        false,
        "the server read the agent's environment (with the key in it: {})",
        got["environ"]
            .as_str()
            .is_some_and(|e| e.contains(SECRET_KEY))
    );
    let error = got["error"].as_str().unwrap_or_default();
    assert!(error.contains("Permission denied"), "{got}");
    agent.finish();
}

/// SPEC S1, P3: `hooks check` starts a server with what the agent would give it: a variable of
/// its own environment outside the allowlist is withheld until `BUZZ_AGENT_CHILD_ENV` names it,
/// and a server that fails to start is told which variables it got.
pub fn s1_p3_hooks_check_passes_a_server_only_the_allowlisted_environment(ctx: &Ctx) {
    let server = r#"echo "token=${E2E_SERVER_TOKEN:-unset} home=${HOME:-unset}" >&2; exit 3"#;
    let run = |extra: &[(&str, &str)]| {
        let out = std::process::Command::new(&ctx.agent_bin)
            .args(["hooks", "check", "--", "sh", "-c", server])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", "/home/e2e")
            .env("E2E_SERVER_TOKEN", "tok-123")
            .envs(extra.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run hooks check");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let withheld = run(&[]);
    assert!(
        withheld.contains("[server] token=unset home=/home/e2e"),
        "{withheld}"
    );
    assert!(
        withheld.contains("the server got only these variables of this environment, as under the agent: HOME, PATH;")
            && withheld.contains("BUZZ_AGENT_CHILD_ENV"),
        "{withheld}"
    );
    let named = run(&[("BUZZ_AGENT_CHILD_ENV", "E2E_SERVER_*")]);
    assert!(named.contains("[server] token=tok-123"), "{named}");
}
