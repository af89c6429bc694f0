//! One workload against an ACP agent binary, driven over stdio by
//! [`AgentProc`](crate::harness::AgentProc).
//!
//! The agent gets the suite's provider environment pointed at the workload's fake LLM
//! ([`crate::harness::agent_env`]: OpenAI-compatible Chat Completions, permission `allow`) with
//! the default log level, the common `OPENAI_BASE_URL` / `OPENAI_API_KEY` / `OPENAI_MODEL`
//! spellings for other agents, and the workload's own variables. Its CPU (`utime + stime`, its
//! reaped children excluded) and peak RSS (`VmHWM`) are read from `/proc` just before stdin EOF.

use super::{Figures, Metric, PROMPT, Workload, ms};
use crate::fake_llm::FakeLlm;
use crate::harness::{AgentProc, agent_env};
use crate::procfs;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest a prompt may take (1,000 rounds under valgrind take minutes).
const PROMPT_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long the agent may take to exit after stdin EOF before it is killed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment an agent gets for a session against `llm`, plus `extra` (which wins).
pub fn env(
    llm: &FakeLlm,
    workload: &Workload,
    extra: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env = agent_env(llm);
    env.retain(|(k, _)| k != "BUZZ_AGENT_LOG");
    env.push(("BUZZ_AGENT_LOG".into(), "info".into()));
    let key = env
        .iter()
        .find(|(k, _)| k == "OPENAI_COMPAT_API_KEY")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    env.push(("OPENAI_BASE_URL".into(), llm.base_url()));
    env.push(("OPENAI_API_KEY".into(), key));
    env.push(("OPENAI_MODEL".into(), "test-model".into()));
    for (k, v) in workload
        .agent_env()
        .into_iter()
        .chain(extra.iter().cloned())
    {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    }
    env
}

/// Runs `workload` once against the agent at `bin` (an absolute path), with `extra`
/// environment variables. `Err` when the session does not complete as scripted.
pub fn run(bin: &Path, workload: &Workload, extra: &[(String, String)]) -> Result<Figures, String> {
    run_inspecting(bin, workload, extra, |_| {})
}

/// [`run`], calling `before_eof(pid)` after the figures are read and before stdin EOF (e.g. to
/// read more of `/proc/<pid>`).
pub fn run_inspecting(
    bin: &Path,
    workload: &Workload,
    extra: &[(String, String)],
    before_eof: impl FnOnce(i32),
) -> Result<Figures, String> {
    let llm = workload.fake_llm();
    let dir = tempfile::Builder::new()
        .prefix("buzz-bench-")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    let env = env(&llm, workload, extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut figures = Figures::new();

    let started = Instant::now();
    let agent = AgentProc::spawn(bin, &env, dir.path());
    agent.initialize();
    figures.insert(Metric::Initialize, ms(started.elapsed()));
    let servers: Vec<Value> = workload.servers().iter().map(|s| s.acp_entry()).collect();
    let new_started = Instant::now();
    let sid = agent.new_session(dir.path(), json!(servers));
    figures.insert(Metric::SessionNew, ms(new_started.elapsed()));

    if workload.has_prompt() {
        let prompt_started = Instant::now();
        let resp = agent.prompt_timeout(&sid, PROMPT, PROMPT_TIMEOUT);
        figures.insert(Metric::PromptWall, ms(prompt_started.elapsed()));
        let stop = &resp["result"]["stopReason"];
        if stop != "end_turn" {
            return Err(format!(
                "stopReason {stop}, expected end_turn (response {resp}){}",
                agent.context()
            ));
        }
    }
    let pid = agent.pid();
    let cpu = procfs::cpu_time(pid).ok_or("the agent is gone before stdin EOF")?;
    figures.insert(Metric::Cpu, ms(cpu));
    if let Some((user, system)) = procfs::cpu_split(pid) {
        figures.insert(Metric::UserTime, ms(user));
        figures.insert(Metric::SystemTime, ms(system));
    }
    if let Some(kib) = procfs::peak_rss_kib(pid) {
        figures.insert(Metric::PeakRss, kib as f64);
    }
    before_eof(pid);

    let served = llm.request_count();
    if served != workload.llm_requests() {
        return Err(format!(
            "{served} LLM requests, expected {}",
            workload.llm_requests()
        ));
    }
    if workload.has_prompt() {
        super::add_llm_figures(&mut figures, &llm);
    }
    if let Workload::Stream { .. } = workload {
        let wire = llm
            .requests()
            .first()
            .map(|r| r.wire())
            .ok_or("no LLM request")?;
        let latencies = super::stream_latencies(
            &workload.reply(0),
            wire,
            &llm.piece_writes(),
            &agent.stdout_lines_timed(),
        )?;
        super::add_latencies(&mut figures, &latencies);
    }
    agent.close_stdin();
    if agent.wait_exit(EXIT_TIMEOUT).is_none() {
        eprintln!(
            "bench: {} still running {EXIT_TIMEOUT:?} after stdin EOF; killed",
            bin.display()
        );
    }
    Ok(figures)
}
