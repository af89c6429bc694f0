//! `soak`: does an agent's memory follow its live sessions? (issue 27: no leak per server.)
//!
//! `soak [--sessions N] [--every K] [--restarts] [--max-growth-kib G] <agent-binary>…` runs,
//! for each binary, one agent process through `N` sessions one after the other (default
//! 1,500): `session/new` with one stdio MCP server of its own (the fake MCP server, this very
//! binary run with `BUZZ_E2E_ROLE=fake-mcp`), one `session/prompt` of one `fs__echo` tool
//! round and a text reply, then `session/close` (which stops the server). With `--restarts`
//! each session's server crashes on its first call and the model calls it again after the
//! 0.5 s restart backoff (SPEC M9), so every session also restarts its server once.
//!
//! After every `K` sessions (default 100) it prints the agent's resident set
//! (`/proc/<pid>/status` `VmRSS`, KiB), one line per sample for `scripts/soak.sh`:
//! `soak bin=… sessions=… rss_kib=… peak_rss_kib=… children=…` (`children`: the agent's live
//! descendant processes, 0 after each close once the stopped server is reaped). The last line
//! per binary is `soak bin=… growth_kib=…`: the RSS after `N` sessions minus the RSS after the
//! first `K` (the warm-up: allocator arenas, the TLS and HTTP state of the first connection).
//! Exits 1 when a session does not complete as scripted, or when the growth is above `G` KiB
//! (default 1,024: the acceptance bound of issue 27).

use buzz_agent_e2e::cli::Args;
use buzz_agent_e2e::fake_llm::{FakeLlm, Options, Reply};
use buzz_agent_e2e::harness::{AgentProc, agent_env, fake_mcp_entry};
use buzz_agent_e2e::procfs;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const USAGE: &str =
    "usage: soak [--sessions N] [--every K] [--restarts] [--max-growth-kib G] <agent-binary>…";

/// How long one prompt may take (a restart waits out the 0.5 s backoff).
const PROMPT_TIMEOUT: Duration = Duration::from_secs(60);

fn main() {
    buzz_agent_e2e::serve_role_if_asked();
    let mut sessions = 1500usize;
    let mut every = 100usize;
    let mut restarts = false;
    let mut max_growth_kib = 1024u64;
    let mut bins = Vec::new();
    let mut args = Args::new("soak", USAGE);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sessions" => sessions = args.number("--sessions"),
            "--every" => every = args.number("--every"),
            "--max-growth-kib" => max_growth_kib = args.number("--max-growth-kib"),
            "--restarts" => restarts = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            _ if a.starts_with('-') => args.fail(&format!("unknown option {a}")),
            _ => bins.push(a),
        }
    }
    if bins.is_empty() || every > sessions {
        args.fail("an agent binary, and --every at most --sessions");
    }
    let mut over = false;
    for bin in &bins {
        let path = std::fs::canonicalize(bin).unwrap_or_else(|e| fail(&format!("{bin}: {e}")));
        match soak(&path, sessions, every, restarts) {
            Ok(growth) => {
                println!("soak bin={bin} growth_kib={growth}");
                if growth > i64::try_from(max_growth_kib).unwrap_or(i64::MAX) {
                    eprintln!(
                        "soak: {bin}: RSS grew {growth} KiB from session {every} to {sessions} (more than {max_growth_kib} KiB)"
                    );
                    over = true;
                }
            }
            Err(e) => fail(&format!("{bin}: {e}")),
        }
    }
    if over {
        std::process::exit(1);
    }
}

/// One agent through `sessions` sessions; the RSS growth after the first `every`, KiB.
fn soak(bin: &Path, sessions: usize, every: usize, restarts: bool) -> Result<i64, String> {
    // Per session: a tool call, (with restarts: the call that crashed it, a call after the
    // backoff,) then the answer. The call ids repeat across sessions, as in real ones.
    let per_session = if restarts { 3 } else { 2 };
    let llm = FakeLlm::with_options(
        Options {
            keep_alive: true,
            record_bodies: false,
        },
        move |i, _| {
            let call = |id: &str| Reply::tool_calls(vec![(id, "fs__echo", json!({"text": "hi"}))]);
            match (i % per_session, restarts) {
                (0, _) => call("call_1"),
                (1, true) => call("call_2").delay_ms(600),
                _ => Reply::text("done"),
            }
        },
    );
    let dir = tempfile::Builder::new()
        .prefix("buzz-soak-")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    let mut env = agent_env(&llm);
    env.retain(|(k, _)| k != "BUZZ_AGENT_LOG");
    env.push(("BUZZ_AGENT_LOG".into(), "warn".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let agent = AgentProc::spawn(bin, &env, dir.path());
    agent.initialize();
    let pid = agent.pid();
    let fake_env: &[(&str, &str)] = if restarts {
        &[("FAKE_MCP_CRASH_AFTER", "0")]
    } else {
        &[]
    };
    let server = fake_mcp_entry("fs", fake_env);
    let mut warm: Option<u64> = None;
    let mut last = 0u64;
    for n in 1..=sessions {
        let sid = agent.new_session(dir.path(), json!([server]));
        let r = agent.prompt_timeout(&sid, "echo hi", PROMPT_TIMEOUT);
        if r["result"]["stopReason"] != "end_turn" {
            return Err(format!("session {n}: {r}{}", agent.context()));
        }
        let closed = agent.request("session/close", json!({"sessionId": sid}));
        if closed.get("result").is_none() {
            return Err(format!("session {n}: session/close answered {closed}"));
        }
        if n % every == 0 {
            let rss = rss_kib(pid).ok_or("the agent is gone")?;
            let peak = procfs::peak_rss_kib(pid).unwrap_or(0);
            let children = procfs::descendants(pid).len();
            println!(
                "soak bin={} sessions={n} rss_kib={rss} peak_rss_kib={peak} children={children}",
                bin.display()
            );
            warm.get_or_insert(rss);
            last = rss;
        }
    }
    agent.close_stdin();
    agent.wait_exit(Duration::from_secs(10));
    let warm = warm.unwrap_or(last);
    Ok(i64::try_from(last).unwrap_or(i64::MAX) - i64::try_from(warm).unwrap_or(0))
}

/// `VmRSS` of `pid`, KiB.
fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn fail(msg: &str) -> ! {
    eprintln!("soak: {msg}");
    std::process::exit(2);
}
