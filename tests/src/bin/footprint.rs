//! `footprint`: measures an agent binary over one long session (issue #6).
//!
//! `footprint [--rounds N] [--env K=V]… [--smaps] <agent-binary>…` runs, for each binary, one ACP session against the
//! fake LLM ([`buzz_agent_e2e::fake_llm`]) with one fake MCP server named `fs` (this very binary
//! run with `BUZZ_E2E_ROLE=fake-mcp`): a single `session/prompt` whose LLM answers `N - 1` rounds
//! of one `fs__echo` tool call each, then a text reply (N = 200 by default). While the agent
//! runs, `/proc/<pid>/status` (`VmHWM`, the kernel's peak-RSS mark) and `/proc/<pid>/stat`
//! (`utime + stime`) are sampled every 5 ms; the last sample before stdin EOF is the CPU figure.
//!
//! Prints one line per binary, `key=value` separated by blanks, for `scripts/footprint.sh`:
//! `footprint bin=… size_bytes=… rounds=… wall_ms=… cpu_ms=… peak_rss_kib=…`.
//! Exits non-zero (with the reason on stderr) when a session does not complete as scripted.
//! `--env K=V` (repeatable) adds a variable to the agent's environment (e.g. `MALLOC_ARENA_MAX=1`
//! to see what glibc's per-thread arenas cost). With `--smaps`, the agent's largest mappings by RSS at the end of the prompt go to stderr
//! (where the memory is: binary text, libc, heap, thread stacks, malloc arenas).

use buzz_agent_e2e::fake_llm::{FakeLlm, Reply};
use buzz_agent_e2e::harness::{self, AgentProc, agent_env};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default number of LLM rounds in the session.
const DEFAULT_ROUNDS: usize = 200;
/// How often `/proc` is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// The longest the whole prompt may take.
const PROMPT_TIMEOUT: Duration = Duration::from_secs(300);

/// The figures of one run.
struct Figures {
    size_bytes: u64,
    wall_ms: u128,
    cpu_ms: u64,
    peak_rss_kib: u64,
}

fn main() {
    if std::env::var("BUZZ_E2E_ROLE").as_deref() == Ok("fake-mcp") {
        buzz_agent_e2e::fake_mcp::main();
    }
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
    for bin in &bins {
        let f = measure(Path::new(bin), rounds, &extra_env, smaps);
        println!(
            "footprint bin={bin} size_bytes={} rounds={rounds} wall_ms={} cpu_ms={} peak_rss_kib={}",
            f.size_bytes, f.wall_ms, f.cpu_ms, f.peak_rss_kib
        );
    }
}

/// Prints `msg` and exits with status 1.
fn fail(msg: &str) -> ! {
    eprintln!("footprint: {msg}");
    std::process::exit(1);
}

/// One session of `rounds` LLM calls against `bin`.
fn measure(bin: &Path, rounds: usize, extra_env: &[(String, String)], smaps: bool) -> Figures {
    // Absolute, since the agent runs in a scratch directory.
    let bin =
        &std::fs::canonicalize(bin).unwrap_or_else(|e| fail(&format!("{}: {e}", bin.display())));
    let size_bytes = std::fs::metadata(bin)
        .map(|m| m.len())
        .unwrap_or_else(|e| fail(&format!("{}: {e}", bin.display())));
    let tool_rounds = rounds - 1;
    let llm = FakeLlm::with_handler(move |i, _| {
        if i < tool_rounds {
            Reply::tool_calls(vec![(
                &format!("call_{i}"),
                "fs__echo",
                json!({"text": format!("round {i}")}),
            )])
        } else {
            Reply::text("all rounds done")
        }
    });
    let dir = tempfile::Builder::new()
        .prefix("buzz-footprint-")
        .tempdir()
        .unwrap_or_else(|e| fail(&format!("tempdir: {e}")));
    let mut env = agent_env(&llm);
    env.retain(|(k, _)| k != "BUZZ_AGENT_LOG");
    env.push(("BUZZ_AGENT_LOG".into(), "info".into()));
    env.extend(extra_env.iter().cloned());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    let started = Instant::now();
    let agent = AgentProc::spawn(bin, &env, dir.path());
    let sampler = Sampler::start(agent.pid());
    agent.initialize();
    let sid = agent.new_session(
        dir.path(),
        json!([harness::fake_mcp_entry("fs", &[("FAKE_MCP_TOOLS", "echo")])]),
    );
    let resp = agent.request_timeout(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "run the footprint rounds"}]}),
        PROMPT_TIMEOUT,
    );
    let wall_ms = started.elapsed().as_millis();
    sampler.sample_now();
    let (peak_rss_kib, cpu_ms) = sampler.stop();
    if smaps {
        print_smaps(agent.pid(), bin);
    }

    let stop = agent.result(&resp)["stopReason"].clone();
    if stop != "end_turn" {
        fail(&format!(
            "{}: stopReason {stop}, expected end_turn\n{}",
            bin.display(),
            agent.stderr_tail(20)
        ));
    }
    let served = llm.requests().len();
    if served != rounds {
        fail(&format!(
            "{}: {served} LLM requests, expected {rounds}",
            bin.display()
        ));
    }
    agent.finish();
    Figures {
        size_bytes,
        wall_ms,
        cpu_ms,
        peak_rss_kib,
    }
}

/// Samples one process's `/proc` figures on a thread until stopped.
struct Sampler {
    pid: i32,
    stop: Arc<AtomicBool>,
    peak_kib: Arc<AtomicU64>,
    cpu_ms: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(pid: i32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak_kib = Arc::new(AtomicU64::new(0));
        let cpu_ms = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, peak_kib, cpu_ms) = (stop.clone(), peak_kib.clone(), cpu_ms.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    sample(pid, &peak_kib, &cpu_ms);
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Sampler {
            pid,
            stop,
            peak_kib,
            cpu_ms,
            thread,
        }
    }

    /// One more sample from the caller's thread.
    fn sample_now(&self) {
        sample(self.pid, &self.peak_kib, &self.cpu_ms);
    }

    /// Stops sampling; returns (peak RSS KiB, CPU ms).
    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        (
            self.peak_kib.load(Ordering::Relaxed),
            self.cpu_ms.load(Ordering::Relaxed),
        )
    }
}

/// Reads `VmHWM` and `utime + stime` of `pid` into the running maxima (a vanished process or a
/// zombie without an address space leaves them as they are).
fn sample(pid: i32, peak_kib: &AtomicU64, cpu_ms: &AtomicU64) {
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        let hwm = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        if let Some(kib) = hwm {
            peak_kib.fetch_max(kib, Ordering::Relaxed);
        }
    }
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Fields after the last ')': state is field 3, utime 14 and stime 15 (1-based).
        let rest = stat.rfind(')').map(|i| &stat[i + 1..]).unwrap_or("");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let total = ticks(11) + ticks(12);
        // SAFETY: sysconf has no memory-safety preconditions.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
            .ok()
            .filter(|&h| h > 0)
            .unwrap_or(100);
        cpu_ms.fetch_max(total * 1000 / hz, Ordering::Relaxed);
    }
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
