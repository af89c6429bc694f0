//! `session_load`: what loading a long saved session costs (SPEC A9, issue 14).
//!
//! `session_load [--rounds N] [--result-bytes B] [--runs R] <agent-binary>…` writes two
//! transcripts of N tool rounds each in the documented format (`docs/sessions.md`): a **raw**
//! one, whose whole history is kept, and a **compacted** one, the same records plus a
//! compaction (a `rewind` to a two-message summary) every 100 rounds and at the end, so its
//! file is as large but the history it leaves is small. Each round is a prompt, a streamed
//! text, one tool call and its B-byte result (default 2048), and the answer. For each binary
//! and file it starts the agent, `initialize`s it, and times `session/load` (request written →
//! response read; the replay is read meanwhile) and `session/resume` (no replay), each R times
//! (default 3, the median is printed), reading the agent's peak RSS (`VmHWM`) after each.
//!
//! Prints one line per (binary, file, method): `session_load bin=… file=raw|compacted
//! method=load|resume rounds=… file_bytes=… history_items=… ms=… cpu_ms=… peak_rss_kib=…
//! idle_rss_kib=…` (`cpu_ms`: the agent's own CPU time for the load, `utime + stime`; a load's
//! wall time also waits for this client to read the replay; `idle_rss_kib`: the same agent
//! after `initialize`, before the load).

use buzz_agent_e2e::cli::Args;
use buzz_agent_e2e::harness::AgentProc;
use buzz_agent_e2e::procfs;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn main() {
    buzz_agent_e2e::serve_role_if_asked();
    let mut rounds = 1000usize;
    let mut result_bytes = 2048usize;
    let mut runs = 3usize;
    let mut bins = Vec::new();
    let mut args = Args::new(
        "session_load",
        "usage: session_load [--rounds N] [--result-bytes B] [--runs R] <agent-binary>…",
    );
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.number("--rounds"),
            "--result-bytes" => result_bytes = args.number("--result-bytes"),
            "--runs" => runs = args.number("--runs"),
            "-h" | "--help" => {
                println!("{}", args.usage());
                return;
            }
            _ => bins.push(a),
        }
    }
    if bins.is_empty() {
        args.fail("an agent binary");
    }
    let scratch = tempfile::Builder::new()
        .prefix("buzz-session-load-")
        .tempdir()
        .unwrap_or_else(|e| fail(&format!("tempdir: {e}")));
    let dir = scratch.path().join("sessions");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("mkdir: {e}")));
    let ws = scratch
        .path()
        .canonicalize()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let files = [("raw", 1u128, false), ("compacted", 2u128, true)];
    let mut written = Vec::new();
    for (name, n, compact) in files {
        let sid = format!("sess_{:032x}", (1u128 << 127) | n);
        let (bytes, items) = write_transcript(&dir, &sid, &ws, rounds, result_bytes, compact);
        written.push((name, sid, bytes, items));
    }
    for bin in &bins {
        let path = std::fs::canonicalize(bin).unwrap_or_else(|e| fail(&format!("{bin}: {e}")));
        for (name, sid, bytes, items) in &written {
            for method in ["session/load", "session/resume"] {
                let mut samples = Vec::new();
                for _ in 0..runs {
                    samples.push(measure(&path, &dir, &ws, sid, method));
                }
                samples.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (ms, cpu, peak, idle) = samples[samples.len() / 2];
                println!(
                    "session_load bin={bin} file={name} method={} rounds={rounds} file_bytes={bytes} history_items={items} ms={ms:.0} cpu_ms={cpu:.0} peak_rss_kib={peak} idle_rss_kib={idle}",
                    method.trim_start_matches("session/")
                );
            }
        }
    }
}

/// One load of `sid` by a fresh agent: (milliseconds, the agent's CPU milliseconds, peak RSS
/// KiB, RSS KiB before the load).
fn measure(bin: &Path, dir: &Path, ws: &Path, sid: &str, method: &str) -> (f64, f64, u64, u64) {
    let dir = dir
        .to_str()
        .unwrap_or_else(|| fail("the state directory is not UTF-8"));
    let env = [
        ("BUZZ_AGENT_PROVIDER", "openai"),
        ("OPENAI_COMPAT_BASE_URL", "http://127.0.0.1:9/v1"),
        ("OPENAI_COMPAT_MODEL", "m"),
        ("BUZZ_AGENT_STATE_DIR", dir),
        ("BUZZ_AGENT_LOG", "warn"),
    ];
    let agent = AgentProc::spawn(bin, &env, ws);
    agent.initialize();
    let idle = procfs::peak_rss_kib(agent.pid()).unwrap_or(0);
    let cpu_before = procfs::cpu_time(agent.pid()).unwrap_or_default();
    let started = Instant::now();
    let r = agent.request_timeout(
        method,
        json!({"sessionId": sid, "cwd": ws, "mcpServers": []}),
        Duration::from_secs(600),
    );
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if r.get("result") != Some(&json!({})) {
        fail(&format!("{method} {sid}: {r}"));
    }
    let peak = procfs::peak_rss_kib(agent.pid()).unwrap_or(0);
    let cpu = procfs::cpu_time(agent.pid())
        .unwrap_or_default()
        .saturating_sub(cpu_before)
        .as_secs_f64()
        * 1000.0;
    agent.finish();
    (ms, cpu, peak, idle)
}

/// Writes `rounds` tool rounds of session `sid`; returns (file bytes, history items left).
fn write_transcript(
    dir: &Path,
    sid: &str,
    ws: &Path,
    rounds: usize,
    result_bytes: usize,
    compact: bool,
) -> (u64, usize) {
    let path: PathBuf = dir.join(format!("{sid}.jsonl"));
    let file = std::fs::File::create(&path).unwrap_or_else(|e| fail(&e.to_string()));
    let mut out = std::io::BufWriter::new(file);
    let mut line = |v: Value| {
        let mut text = v.to_string();
        text.push('\n');
        out.write_all(text.as_bytes())
            .unwrap_or_else(|e| fail(&e.to_string()));
    };
    line(json!({"v": 1, "type": "session", "sessionId": sid, "cwd": ws, "title": "round 0"}));
    let filler: String = "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(result_bytes)
        .collect();
    let mut items = 0usize;
    for r in 0..rounds {
        let prompt = format!("round {r}: read the next file");
        let call = format!("call_{r}");
        let tc = format!("tc_{}", r + 1);
        line(
            json!({"v": 1, "type": "update", "update": {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": prompt}}}),
        );
        line(json!({"v": 1, "type": "message", "message": {"role": "user", "text": prompt}}));
        line(
            json!({"v": 1, "type": "update", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Reading it."}}}),
        );
        line(
            json!({"v": 1, "type": "message", "message": {"role": "assistant", "text": "Reading it.",
            "toolCalls": [{"id": call, "name": "fs__read", "arguments": format!("{{\"path\":\"f{r}.txt\"}}")}]}}),
        );
        line(
            json!({"v": 1, "type": "tool_call", "index": 0, "toolCallId": tc, "callId": call, "name": "fs__read",
            "update": {"sessionUpdate": "tool_call", "toolCallId": tc, "title": "fs__read", "kind": "other", "status": "pending", "rawInput": {"path": format!("f{r}.txt")}}}),
        );
        line(
            json!({"v": 1, "type": "tool_result", "index": 0, "toolCallId": tc, "callId": call, "name": "fs__read",
            "text": filler, "isError": false, "status": "completed"}),
        );
        line(
            json!({"v": 1, "type": "update", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Done with it."}}}),
        );
        line(
            json!({"v": 1, "type": "message", "message": {"role": "assistant", "text": "Done with it."}}),
        );
        line(
            json!({"v": 1, "type": "turn_end", "stopReason": "end_turn", "meta": {"buzz": {"rounds": 2}}}),
        );
        items += 4;
        if compact && (r + 1) % 100 == 0 {
            line(json!({"v": 1, "type": "rewind", "keep": 0}));
            line(
                json!({"v": 1, "type": "message", "message": {"role": "user", "text": format!("[Context summary: earlier conversation was compacted]\nrounds up to {r}")}}),
            );
            line(json!({"v": 1, "type": "message", "message": {"role": "user", "text": prompt}}));
            items = 2;
        }
    }
    drop(out);
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    (bytes, items)
}

/// Prints `msg` and exits with status 1.
fn fail(msg: &str) -> ! {
    eprintln!("session_load: {msg}");
    std::process::exit(1);
}
