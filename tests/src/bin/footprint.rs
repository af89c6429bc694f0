//! `footprint`: measures an agent binary over one long session (issue #6).
//!
//! `footprint [--rounds N] [--env K=V]… [--smaps] <agent-binary>…` runs, for each binary, the
//! benchmark's tool-rounds session ([`buzz_agent_e2e::bench::agent`], the workload
//! [`Workload::Rounds`]): one ACP session against the fake LLM with one fake MCP server named
//! `fs` (this very binary run with `BUZZ_E2E_ROLE=fake-mcp`), a single `session/prompt` whose
//! LLM answers `N - 1` rounds of one `fs__echo` tool call each, then a text reply (N = 200 by
//! default). Just before stdin EOF, `/proc/<pid>/status` gives the peak RSS (`VmHWM`, the
//! kernel's high-water mark) and the process CPU clock the agent's own `utime + stime`.
//!
//! Prints one line per binary, `key=value` separated by blanks, for `scripts/footprint.sh`:
//! `footprint bin=… size_bytes=… rounds=… wall_ms=… cpu_ms=… peak_rss_kib=…` (`wall_ms`: the
//! prompt). Exits non-zero (with the reason on stderr) when a session does not complete as
//! scripted. `--env K=V` (repeatable) adds a variable to the agent's environment (e.g.
//! `MALLOC_ARENA_MAX=1` to see what glibc's per-thread arenas cost). With `--smaps`, the
//! agent's largest mappings by RSS at the end of the prompt go to stderr (where the memory is:
//! binary text, libc, heap, thread stacks, malloc arenas).

use buzz_agent_e2e::bench::{Metric, Workload, agent};
use std::path::Path;

/// Default number of LLM rounds in the session.
const DEFAULT_ROUNDS: usize = 200;

fn main() {
    buzz_agent_e2e::serve_role_if_asked();
    let mut rounds = DEFAULT_ROUNDS;
    let mut smaps = false;
    let mut extra_env: Vec<(String, String)> = Vec::new();
    let mut bins = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n >= 1 => rounds = n,
                _ => fail("--rounds needs a positive number"),
            },
            "--smaps" => smaps = true,
            "--env" => match args.next().as_deref().and_then(|kv| kv.split_once('=')) {
                Some((k, v)) => extra_env.push((k.to_string(), v.to_string())),
                None => fail("--env needs K=V"),
            },
            "-h" | "--help" => {
                println!("usage: footprint [--rounds N] [--env K=V]… [--smaps] <agent-binary>…");
                return;
            }
            _ => bins.push(a),
        }
    }
    if bins.is_empty() {
        fail("usage: footprint [--rounds N] [--env K=V]… [--smaps] <agent-binary>…");
    }
    let workload = Workload::Rounds {
        tool_rounds: rounds - 1,
        result_bytes: None,
    };
    for bin in &bins {
        // Absolute, since the agent runs in a scratch directory.
        let path = std::fs::canonicalize(bin).unwrap_or_else(|e| fail(&format!("{bin}: {e}")));
        let size_bytes = std::fs::metadata(&path)
            .map(|m| m.len())
            .unwrap_or_else(|e| fail(&format!("{bin}: {e}")));
        let f = agent::run_inspecting(&path, &workload, &extra_env, |pid| {
            if smaps {
                print_smaps(pid, &path);
            }
        })
        .unwrap_or_else(|e| fail(&format!("{bin}: {e}")));
        let get = |m: Metric| f.get(&m).copied().unwrap_or(0.0);
        println!(
            "footprint bin={bin} size_bytes={size_bytes} rounds={rounds} wall_ms={:.0} cpu_ms={:.0} peak_rss_kib={:.0}",
            get(Metric::PromptWall),
            get(Metric::Cpu),
            get(Metric::PeakRss)
        );
    }
}

/// Prints `msg` and exits with status 1.
fn fail(msg: &str) -> ! {
    eprintln!("footprint: {msg}");
    std::process::exit(1);
}

/// Prints the 12 largest mappings of `pid` by RSS, and the RSS totals, to stderr.
fn print_smaps(pid: i32, bin: &Path) {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return;
    };
    let mut rows: Vec<(u64, String)> = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            let range = first.to_string();
            let path = parts.nth(4).unwrap_or("[anon]");
            name = format!("{range} {path}");
        } else if first == "Rss:" {
            let kib = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if kib > 0 {
                rows.push((kib, name.clone()));
            }
        }
    }
    rows.sort_unstable_by(|a, b| b.cmp(a));
    eprintln!("smaps of {} (pid {pid}), largest RSS first:", bin.display());
    for (kib, name) in rows.iter().take(12) {
        eprintln!("  {kib:>6} KiB  {name}");
    }
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for l in status
            .lines()
            .filter(|l| l.starts_with("Rss") || l.starts_with("Threads") || l.starts_with("VmHWM"))
        {
            eprintln!("  {l}");
        }
    }
}
