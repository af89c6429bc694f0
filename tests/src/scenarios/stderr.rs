//! SPEC P2 on the runtimes' side: the agent's own stderr never blocks the event loop (case C51),
//! and a child's stderr never grows the agent's memory (case C52). Both are runtime faults, so
//! they run against both binaries like every scenario.

use super::setup::Setup;
use super::util::Scratch;
use crate::fake_llm::{FakeLlm, Reply};
use crate::fake_mcp::{FLOOD_DONE, NOISY_LINE_BYTES};
use crate::harness::{AgentProc, Ctx, StderrMode};
use crate::procfs;
use serde_json::json;
use std::time::{Duration, Instant};

/// Longest forwarded MCP stderr line, in bytes, and the marker that ends a cut one
/// (`buzz_agent_core::io::{MAX_STDERR_LINE_BYTES, STDERR_CUT_MARKER}`; the e2e crate drives the
/// binaries only, so the values are restated here).
const MAX_STDERR_LINE_BYTES: usize = 16 * 1024;
const STDERR_CUT_MARKER: &str = "\u{2026}";
/// Bytes of stderr the chatty server writes per `noisy` call (case C51).
const NOISY_BYTES: usize = 300_000;
/// Bytes of the endless stderr line (case C52).
const FLOOD_BYTES: u64 = 100_000_000;
/// How long one prompt of these scenarios may take before it counts as frozen.
const PROMPT_LIMIT: Duration = Duration::from_secs(60);

fn prompt_end_turn(agent: &AgentProc, sid: &str) -> Duration {
    let started = Instant::now();
    let r = agent.prompt_timeout(sid, "go", PROMPT_LIMIT);
    let took = started.elapsed();
    assert_eq!(
        agent.result(&r)["stopReason"],
        "end_turn",
        "{r}{}",
        agent.context()
    );
    took
}

/// The sum of `N` over every `N log lines dropped` line of `log`.
fn dropped_lines(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            let head = l
                .split(" log lines dropped")
                .next()
                .filter(|h| h.len() < l.len())?;
            head.rsplit(' ').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// One C51 session: the model calls the chatty server's `noisy` tool twice (300 KB of stderr
/// each), then answers. Returns the prompt's duration and the agent, still running.
fn chatty_session(ctx: &Ctx, s: &Scratch, stderr: StderrMode) -> (Duration, AgentProc, FakeLlm) {
    let (llm, agent, sid) = Setup::new(ctx, s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__noisy", json!({"bytes": NOISY_BYTES}))]),
            Reply::tool_calls(vec![("call_2", "fs__noisy", json!({"bytes": NOISY_BYTES}))]),
            Reply::text("both done"),
        ])
        .stderr(stderr)
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "noisy")])
        .start();
    let took = prompt_end_turn(&agent, &sid);
    (took, agent, llm)
}

/// Every forwarded `noisy` line either reached stderr or was counted as dropped: nothing is lost
/// silently (the count may also include other lines that were dropped).
fn assert_noisy_lines_accounted(log: &str, what: &str) {
    let per_call = NOISY_BYTES.div_ceil(NOISY_LINE_BYTES) as u64;
    let seen = log.lines().filter(|l| l.contains("] noisy line ")).count() as u64;
    let dropped = dropped_lines(log);
    assert!(
        seen <= 2 * per_call && seen + dropped >= 2 * per_call,
        "{what}: {seen} noisy lines written + {dropped} counted as dropped, expected {} in all",
        2 * per_call
    );
}

/// C51, P2: with its stderr a pipe nobody reads and a server writing 300 KB of stderr per call,
/// the prompt still ends `end_turn`, in about the time it takes with stderr going to a file
/// (logging never blocks the event loop). The lines that did not fit were dropped and counted:
/// once the pipe is read, `N log lines dropped` shows up, and every forwarded line is either in
/// the log or in that count.
pub fn c51_unread_stderr_pipe_never_blocks_the_loop_and_drops_are_counted(ctx: &Ctx) {
    let file_scratch = Scratch::new();
    let log_file = file_scratch.dir.path().join("agent-stderr.log");
    let (with_file, agent, llm) =
        chatty_session(ctx, &file_scratch, StderrMode::File(log_file.clone()));
    assert_eq!(llm.requests().len(), 3);
    agent.finish_keep();
    assert_noisy_lines_accounted(&agent.stderr_text(), "stderr to a file");

    let s = Scratch::new();
    let (unread, agent, llm) = chatty_session(ctx, &s, StderrMode::Unread);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs[2]
            .tool_result_for("call_2")
            .is_some_and(|t| t.starts_with("wrote ")),
        "the second call completed: {:?}",
        reqs[2].tool_result_for("call_2")
    );
    eprintln!("C51: prompt {unread:?} with an unread stderr pipe, {with_file:?} with a file");
    assert!(
        unread <= with_file * 4 + Duration::from_secs(3),
        "C51: the prompt took {unread:?} with an unread stderr pipe, {with_file:?} with a file"
    );
    // The agent still serves while the pipe is full: a request is answered at once.
    let started = Instant::now();
    agent.request_timeout(
        "session/new",
        json!({"cwd": s.ws, "mcpServers": []}),
        Duration::from_secs(10),
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // Now somebody reads the pipe: the backlog drains and the drop count is logged.
    agent.start_reading_stderr();
    let deadline = Instant::now() + Duration::from_secs(20);
    while dropped_lines(&agent.stderr_text()) == 0 {
        assert!(
            Instant::now() < deadline,
            "C51: no `N log lines dropped` line after the pipe drained:\n{}",
            agent.stderr_tail(20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.finish_keep();
    let log = agent.stderr_text();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(" log lines dropped")),
        "{}",
        agent.stderr_tail(20)
    );
    eprintln!(
        "C51: {} log lines dropped while stderr was not read",
        dropped_lines(&log)
    );
    assert_noisy_lines_accounted(&log, "unread stderr pipe");
}

/// One C52 session: the model calls `flood` (an endless stderr line of `bytes` bytes; 0 for the
/// quiet run), then `echo`, then answers. Returns the agent's peak RSS (KiB) after the prompt,
/// its stderr and the second tool call's result.
fn flood_session(ctx: &Ctx, bytes: u64) -> (u64, String, Option<String>) {
    let s = Scratch::new();
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("call_1", "fs__flood", json!({"bytes": bytes}))]),
            Reply::tool_calls(vec![(
                "call_2",
                "fs__echo",
                json!({"text": "after the flood"}),
            )]),
            Reply::text("done"),
        ])
        .fake_mcp("fs", &[("FAKE_MCP_TOOLS", "flood,echo")])
        .start();
    prompt_end_turn(&agent, &sid);
    let hwm = procfs::peak_rss_kib(agent.pid()).expect("the agent's VmHWM");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3, "{}", agent.context());
    let second = reqs[2].tool_result_for("call_2");
    let first = reqs[2].tool_result_for("call_1");
    assert_eq!(
        first.as_deref(),
        Some(format!("flooded {bytes} bytes").as_str())
    );
    agent.finish_keep();
    (hwm, agent.stderr_text(), second)
}

/// C52, P2: a server writes 100 MB to stderr with no newline while serving. The agent forwards
/// the line cut at the cap, skips the rest without buffering it (peak RSS stays within 1 MiB of
/// the same session without the flood), picks up the next line after the newline, and the
/// server keeps working (the tool call after the flood succeeds).
pub fn c52_endless_server_stderr_line_is_cut_and_skipped_without_buffering(ctx: &Ctx) {
    let (quiet_kib, _, quiet_second) = flood_session(ctx, 0);
    assert_eq!(quiet_second.as_deref(), Some("after the flood"));
    let (flood_kib, log, second) = flood_session(ctx, FLOOD_BYTES);
    assert_eq!(
        second.as_deref(),
        Some("after the flood"),
        "C52: the server keeps working after the flood"
    );
    eprintln!("C52: peak RSS {flood_kib} KiB with a 100 MB stderr line, {quiet_kib} KiB without");
    assert!(
        flood_kib <= quiet_kib + 1024,
        "C52: peak RSS {flood_kib} KiB with a 100 MB stderr line, {quiet_kib} KiB without"
    );
    let forwarded: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("[mcp:fs] ").map(|(_, line)| line))
        .filter(|line| line.starts_with('x'))
        .collect();
    assert_eq!(
        forwarded.len(),
        1,
        "C52: one forwarded piece of the endless line, the rest skipped"
    );
    let cut = forwarded[0];
    assert!(
        cut.len() == MAX_STDERR_LINE_BYTES && cut.ends_with(STDERR_CUT_MARKER),
        "C52: the forwarded line is cut at the cap and marked: {} bytes, ends (reversed) {:?}",
        cut.len(),
        cut.chars().rev().take(4).collect::<String>()
    );
    assert!(
        cut.trim_end_matches(STDERR_CUT_MARKER)
            .bytes()
            .all(|b| b == b'x')
    );
    let done = format!("[mcp:fs] {FLOOD_DONE}");
    let cut_at = log.find("[mcp:fs] x").expect("the cut line");
    assert!(
        log[cut_at..].contains(&done),
        "C52: the line after the newline is forwarded whole"
    );
}

/// A6 / P2 / issue #15: a client that stops reading stdout never blocks the loop (the agent
/// writes stdout without blocking and leaves the rest to a writer thread), and once it reads
/// again every line arrives, whole and in order.
pub fn a6_unread_stdout_never_blocks_the_loop_and_loses_no_line(ctx: &Ctx) {
    const DELTAS: usize = 3000;
    let s = Scratch::new();
    // 3000 deltas of ~100 bytes: ~600 KiB of `agent_message_chunk` lines, far more than a
    // pipe holds.
    let text: String = (0..DELTAS)
        .map(|i| format!("{i:05} {}|", "x".repeat(93)))
        .collect();
    let big = text.clone();
    let handler = move |i: usize, _: &crate::fake_llm::RecordedRequest| match i {
        0 => Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "after"}))])
            .with_text(big.clone())
            .deltas(DELTAS),
        _ => Reply::text("done"),
    };
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .handler(handler)
        .fake_mcp("fs", &[])
        .start();
    agent.pause_stdout();
    let prompt = agent.start_prompt(&sid, "stream a lot, then echo");
    // With stdout full, the loop still runs the tool and makes the next LLM call.
    let deadline = Instant::now() + Duration::from_secs(20);
    while llm.requests().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the loop stalled while stdout was unread{}",
            agent.context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = agent.transcript().len();
    assert!(
        seen < DELTAS / 2,
        "stdout was read meanwhile ({seen} messages)"
    );
    agent.resume_stdout();
    let r = agent.wait_response(&prompt, Duration::from_secs(30));
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let updates = agent.session_updates(&sid);
    let streamed = crate::harness::agent_text(&updates);
    assert!(
        streamed.starts_with(&text),
        "the streamed text is whole and in order ({} of {} bytes)",
        streamed.len(),
        text.len()
    );
    crate::harness::assert_updates_precede_response(&agent, &sid, &prompt);
    agent.finish();
}
