//! The performance benchmark of issue #15 (`scripts/bench.sh`, the `bench` binary,
//! `docs/performance.md`).
//!
//! Every workload is one scripted session against the fake LLM ([`crate::fake_llm`], here with
//! keep-alive connections and without recording request bodies) and fake MCP servers
//! ([`crate::fake_mcp`], this very binary run with `BUZZ_E2E_ROLE=fake-mcp`). It runs in
//! *columns*: the **IO floor** ([`floor`]: the harness itself does the same LLM and MCP traffic,
//! with no agent between) and one column per ACP agent binary ([`agent`]: driven over stdio by
//! [`crate::harness::AgentProc`]). [`run`] interleaves the columns run by run, so machine noise
//! hits all alike, and [`table`] prints the medians with their ratio to the floor.

pub mod agent;
pub mod cost;
pub mod floor;
pub mod goals;
pub mod limit;
pub mod table;

use crate::fake_llm::{FakeLlm, Options, PieceWrite, Reply, Wire};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One measured quantity of a cell. Values are kept in the unit named here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// Wall time of the `session/prompt` (request written → response read), ms.
    PromptWall,
    /// The agent's own `utime + stime` before stdin EOF, ms (the floor: the CPU of the thread
    /// that drove the traffic, ns resolution).
    Cpu,
    /// The part of [`Metric::Cpu`] spent in the kernel (syscalls, page faults), ms. Derived
    /// by the table, never measured alone: the median CPU times the kernel share of
    /// [`Metric::UserTime`] + [`Metric::SystemTime`] pooled over the runs.
    KernelCpu,
    /// `utime` of `/proc/<pid>/stat` (the floor: the thread's `getrusage` user time), ms. The
    /// kernel splits a task's CPU between user and system by sampling at the clock tick, so one
    /// short run's split is coarse; the table pools it over the runs.
    UserTime,
    /// `stime` likewise, ms.
    SystemTime,
    /// Peak RSS (`VmHWM`) before stdin EOF, KiB. None for the floor (it runs in the harness).
    PeakRss,
    /// TCP connections the fake LLM accepted.
    LlmConnections,
    /// Request body bytes the fake LLM received, over the session.
    LlmBytes,
    /// The largest request body of the session, bytes (≈ the history at the end).
    LargestRequest,
    /// Streaming pass-through latency, median over the deltas, µs.
    StreamP50,
    /// Streaming pass-through latency, 99th percentile over the deltas, µs.
    StreamP99,
    /// Process start → `initialize` reply read, ms (the floor: a fake MCP server's).
    Initialize,
    /// `session/new` request → reply, ms (the floor: the same servers started and handshaken
    /// concurrently by the harness).
    SessionNew,
    /// One server (the slowest of the `session/new` set) started and handshaken alone, ms.
    SlowestServer,
    /// Syscalls per LLM round of the agent's own threads (`strace -ff`, its MCP server
    /// children left out; the limit probe: the calls it makes, counted as it makes them).
    Syscalls,
}

/// The figures of one cell (one column, one workload, one run).
pub type Figures = BTreeMap<Metric, f64>;

/// A stdio MCP server of a workload: its ACP `mcpServers` name and the `FAKE_MCP_*` environment
/// of the fake.
#[derive(Debug, Clone)]
pub struct Server {
    pub name: String,
    pub env: Vec<(String, String)>,
}

impl Server {
    fn new(name: &str, env: &[(&str, String)]) -> Server {
        Server {
            name: name.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// The ACP `mcpServers` entry running this fake.
    pub fn acp_entry(&self) -> Value {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        crate::harness::fake_mcp_entry(&self.name, &env)
    }
}

/// What a session does.
#[derive(Debug, Clone)]
pub enum Workload {
    /// One prompt: `tool_rounds` LLM responses with one tool call each, then a text reply.
    /// `result_bytes: None` calls `fs__echo` (a result of ~10 bytes), `Some(n)` calls `fs__big`
    /// (a result of `n` bytes).
    Rounds {
        tool_rounds: usize,
        result_bytes: Option<usize>,
    },
    /// One prompt through the `_Stop` gate twice: `servers` hook servers (allowlisted with
    /// `MCP_HOOK_SERVERS=*`) each answer `_Stop` after `latency_ms`, objecting the first time;
    /// the LLM answers text both times.
    HookGate { servers: usize, latency_ms: u64 },
    /// One prompt, no MCP server: a text reply of `deltas` deltas, one every `pace_ms`.
    Stream { deltas: usize, pace_ms: u64 },
    /// `initialize`, then `session/new` with `servers` servers whose own start-up (the delay
    /// before their `initialize` reply) is `step_ms`, 2×`step_ms`, …; no prompt.
    Startup { servers: usize, step_ms: u64 },
}

/// The prompt text every session sends.
pub const PROMPT: &str = "run the benchmark";

impl Workload {
    /// The MCP servers of the session, in `mcpServers` order.
    pub fn servers(&self) -> Vec<Server> {
        match *self {
            Workload::Rounds { result_bytes, .. } => {
                let tool = if result_bytes.is_some() {
                    "big"
                } else {
                    "echo"
                };
                vec![Server::new("fs", &[("FAKE_MCP_TOOLS", tool.into())])]
            }
            Workload::HookGate {
                servers,
                latency_ms,
            } => (0..servers)
                .map(|k| {
                    Server::new(
                        &format!("h{k}"),
                        &[
                            ("FAKE_MCP_TOOLS", "echo".into()),
                            ("FAKE_MCP_STOP", "1".into()),
                            ("FAKE_MCP_STOP_TEXT", format!("server h{k} objects")),
                            ("FAKE_MCP_STOP_OBJECT_TIMES", "1".into()),
                            ("FAKE_MCP_STOP_DELAY_MS", latency_ms.to_string()),
                        ],
                    )
                })
                .collect(),
            Workload::Stream { .. } => Vec::new(),
            Workload::Startup { servers, step_ms } => (0..servers)
                .map(|k| {
                    Server::new(
                        &format!("s{k}"),
                        &[
                            ("FAKE_MCP_TOOLS", "echo".into()),
                            (
                                "FAKE_MCP_INIT_DELAY_MS",
                                (step_ms * (k as u64 + 1)).to_string(),
                            ),
                        ],
                    )
                })
                .collect(),
        }
    }

    /// Environment the agent needs on top of the provider's for this workload.
    pub fn agent_env(&self) -> Vec<(String, String)> {
        match self {
            Workload::HookGate { .. } => vec![("MCP_HOOK_SERVERS".into(), "*".into())],
            _ => Vec::new(),
        }
    }

    /// Whether the session sends a `session/prompt`.
    pub fn has_prompt(&self) -> bool {
        !matches!(self, Workload::Startup { .. })
    }

    /// LLM requests a complete session makes.
    pub fn llm_requests(&self) -> usize {
        match *self {
            Workload::Rounds { tool_rounds, .. } => tool_rounds + 1,
            Workload::HookGate { .. } => 2,
            Workload::Stream { .. } => 1,
            Workload::Startup { .. } => 0,
        }
    }

    /// The tool call of round `i` of a [`Workload::Rounds`] session: `(id, name, arguments)`.
    pub fn round_call(&self, i: usize) -> (String, &'static str, Value) {
        match self {
            Workload::Rounds {
                result_bytes: Some(n),
                ..
            } => (format!("call_{i}"), "fs__big", json!({"bytes": n})),
            _ => (
                format!("call_{i}"),
                "fs__echo",
                json!({"text": format!("round {i}")}),
            ),
        }
    }

    /// The streamed text of a [`Workload::Stream`] session: `deltas` words of 6 characters, so
    /// each delta is one word.
    pub fn stream_text(deltas: usize) -> String {
        (0..deltas).map(|k| format!("w{k:04} ")).collect()
    }

    /// The reply to LLM request `i` (0-based) of this workload.
    pub fn reply(&self, i: usize) -> Reply {
        match *self {
            Workload::Rounds { tool_rounds, .. } if i < tool_rounds => {
                let (id, name, args) = self.round_call(i);
                Reply::tool_calls(vec![(&id, name, args)])
            }
            Workload::Rounds { .. } => Reply::text("all rounds done"),
            Workload::HookGate { .. } => Reply::text(format!("answer {i}")),
            Workload::Stream { deltas, pace_ms } => Reply::text(Workload::stream_text(deltas))
                .deltas(deltas)
                .pace_ms(pace_ms),
            Workload::Startup { .. } => Reply::text("no LLM call expected"),
        }
    }

    /// A fake LLM serving this workload: keep-alive connections (as real providers), request
    /// bodies counted but neither parsed nor kept.
    pub fn fake_llm(&self) -> FakeLlm {
        let w = self.clone();
        FakeLlm::with_options(
            Options {
                keep_alive: true,
                record_bodies: false,
            },
            move |i, _| w.reply(i),
        )
    }
}

/// A named workload of the benchmark.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Short name for `BENCH_WORKLOADS` / `--only`.
    pub name: &'static str,
    /// What the table calls it.
    pub title: String,
    pub workload: Workload,
}

/// The workloads of issue #15; `quick` makes each one small (CI smoke: seconds, not minutes).
pub fn workloads(quick: bool) -> Vec<Spec> {
    let (r200, r1000, hook_ms, deltas, step) = if quick {
        (20, 50, 30, 20, 5)
    } else {
        (200, 1000, 300, 200, 25)
    };
    vec![
        Spec {
            name: "rounds",
            title: format!("{r200} tool rounds"),
            workload: Workload::Rounds {
                tool_rounds: r200,
                result_bytes: None,
            },
        },
        Spec {
            name: "rounds-long",
            title: format!("{r1000} tool rounds"),
            workload: Workload::Rounds {
                tool_rounds: r1000,
                result_bytes: None,
            },
        },
        Spec {
            name: "rounds-4k",
            title: format!("{r200} rounds, 4 KiB results"),
            workload: Workload::Rounds {
                tool_rounds: r200,
                result_bytes: Some(4096),
            },
        },
        Spec {
            name: "hooks",
            title: format!("hook gate, 4 servers × {hook_ms} ms"),
            workload: Workload::HookGate {
                servers: 4,
                latency_ms: hook_ms,
            },
        },
        Spec {
            name: "stream",
            title: format!("streaming, {deltas} deltas"),
            workload: Workload::Stream { deltas, pace_ms: 2 },
        },
        Spec {
            name: "startup",
            title: format!("startup, 8 servers ({step}–{} ms)", step * 8),
            workload: Workload::Startup {
                servers: 8,
                step_ms: step,
            },
        },
    ]
}

/// A column of the table.
#[derive(Debug, Clone)]
pub enum Column {
    /// The IO floor ([`floor::run`]).
    Floor,
    /// The limit probe ([`limit::run`]): tool-round workloads only.
    Limit,
    /// An ACP agent binary ([`agent::run`]) with `env` on top of the workload's.
    Agent {
        name: String,
        path: PathBuf,
        env: Vec<(String, String)>,
    },
}

impl Column {
    /// `floor`, or the binary's file name.
    pub fn name(&self) -> &str {
        match self {
            Column::Floor => "floor",
            Column::Limit => "limit",
            Column::Agent { name, .. } => name,
        }
    }

    /// An agent column for `path` (made absolute), named after its file.
    pub fn agent(path: &str) -> Result<Column, String> {
        let path = std::fs::canonicalize(path).map_err(|e| format!("{path}: {e}"))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        Ok(Column::Agent {
            name,
            path,
            env: Vec::new(),
        })
    }

    /// Runs `workload` once in this column.
    pub fn run(&self, workload: &Workload) -> Result<Figures, String> {
        let run = || match self {
            Column::Floor => floor::run(workload),
            Column::Limit => limit::run(workload),
            Column::Agent { path, env, .. } => agent::run(path, workload, env),
        };
        // A misbehaving agent (a timeout in the ACP client panics) fails its cell, not the
        // benchmark; the AgentProc's drop kills its process tree on the way out.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
            Ok(r) => r,
            Err(p) => Err(p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())),
        }
    }
}

/// Renames agent columns that share a file name (e.g. a release and a debug build) to
/// `<parent directory>/<file name>`, so every column has its own name.
pub fn disambiguate(columns: &mut [Column]) {
    let names: Vec<String> = columns.iter().map(|c| c.name().to_string()).collect();
    for c in columns.iter_mut() {
        if let Column::Agent { name, path, .. } = c
            && names.iter().filter(|n| *n == name).count() > 1
            && let Some(dir) = path.parent().and_then(|d| d.file_name())
        {
            *name = format!("{}/{name}", dir.to_string_lossy());
        }
    }
}

/// The results of one workload: per column, one entry per run.
pub struct WorkloadResults {
    pub spec: Spec,
    pub cells: Vec<Vec<Result<Figures, String>>>,
}

/// Runs every workload `runs` times in every column. Within a run the columns are rotated (run
/// `r` starts with column `r mod n`), so no column always goes first. `progress` gets one line
/// per cell.
pub fn run(
    specs: &[Spec],
    columns: &[Column],
    runs: usize,
    mut progress: impl FnMut(&str),
) -> Vec<WorkloadResults> {
    let mut out = Vec::new();
    for spec in specs {
        let mut cells: Vec<Vec<Result<Figures, String>>> = vec![Vec::new(); columns.len()];
        for r in 0..runs {
            for k in 0..columns.len() {
                let c = (r + k) % columns.len();
                let started = Instant::now();
                let result = columns[c].run(&spec.workload);
                progress(&format!(
                    "{} run {}/{runs} {}: {} ({:.1?})",
                    spec.name,
                    r + 1,
                    columns[c].name(),
                    match &result {
                        Ok(f) => table::brief(f),
                        Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or_default()),
                    },
                    started.elapsed()
                ));
                cells[c].push(result);
            }
        }
        out.push(WorkloadResults {
            spec: spec.clone(),
            cells,
        });
    }
    out
}

/// Milliseconds of a duration, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The pass-through latency of every text delta of a paced stream, µs: from the instant the
/// delta's HTTP chunk was written ([`PieceWrite`]) to the instant the first ACP line whose
/// `agent_message_chunk` text completes that delta was read (`lines`: every ACP line with the
/// instant it was read). Deltas batched into one line get the latency of that line; a split
/// delta counts when its last part arrives. Errs when the streamed and the forwarded texts
/// differ.
pub fn stream_latencies(
    reply: &Reply,
    wire: Wire,
    writes: &[PieceWrite],
    lines: &[(Instant, String)],
) -> Result<Vec<f64>, String> {
    // (end offset in chars of the streamed text, write instant) per text delta.
    let mut deltas: Vec<(usize, Instant)> = Vec::new();
    let mut streamed = String::new();
    for (k, piece) in reply.sse_pieces_for(wire).iter().enumerate() {
        let Some(text) = piece_text(piece, wire) else {
            continue;
        };
        let at = writes
            .iter()
            .find(|w| w.piece == k)
            .ok_or_else(|| format!("no write time for piece {k}"))?
            .at;
        streamed.push_str(&text);
        deltas.push((streamed.chars().count(), at));
    }
    let mut forwarded = String::new();
    let mut arrivals: Vec<(usize, Instant)> = Vec::new();
    for (at, line) in lines {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let update = &msg["params"]["update"];
        if msg["method"] == "session/update"
            && update["sessionUpdate"] == "agent_message_chunk"
            && let Some(t) = update["content"]["text"].as_str()
        {
            forwarded.push_str(t);
            arrivals.push((forwarded.chars().count(), *at));
        }
    }
    if forwarded.trim_end() != streamed.trim_end() {
        return Err(format!(
            "the forwarded text ({} chars) is not the streamed text ({} chars)",
            forwarded.chars().count(),
            streamed.chars().count()
        ));
    }
    deltas
        .iter()
        .map(|&(end, written)| {
            arrivals
                .iter()
                .find(|(reached, _)| *reached >= end)
                .map(|(_, read)| read.saturating_duration_since(written).as_secs_f64() * 1e6)
                .ok_or_else(|| format!("no line completes the text up to char {end}"))
        })
        .collect()
}

/// The text of an SSE piece's text delta (`None` for other events).
fn piece_text(piece: &str, wire: Wire) -> Option<String> {
    let data = piece
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .and_then(|d| serde_json::from_str::<Value>(d).ok())?;
    let text = match wire {
        Wire::Chat => data["choices"][0]["delta"]["content"].as_str(),
        Wire::Anthropic => data["delta"]["text"].as_str(),
        Wire::Responses if data["type"] == "response.output_text.delta" => data["delta"].as_str(),
        Wire::Responses => None,
    }?;
    (!text.is_empty()).then(|| text.to_string())
}

/// The `q`-quantile (0..=1) of `values` by nearest rank; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Adds the latency quantiles of `latencies` (µs) to `figures`.
pub fn add_latencies(figures: &mut Figures, latencies: &[f64]) {
    if let Some(p) = quantile(latencies, 0.5) {
        figures.insert(Metric::StreamP50, p);
    }
    if let Some(p) = quantile(latencies, 0.99) {
        figures.insert(Metric::StreamP99, p);
    }
}

/// Adds what the fake LLM saw (connections, bytes, largest request) to `figures`.
pub fn add_llm_figures(figures: &mut Figures, llm: &FakeLlm) {
    figures.insert(Metric::LlmConnections, llm.connections() as f64);
    figures.insert(Metric::LlmBytes, llm.body_bytes() as f64);
    figures.insert(Metric::LargestRequest, llm.largest_body() as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_medians_by_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn stream_latency_counts_a_batched_delta_from_its_own_write() {
        let w = Workload::Stream {
            deltas: 3,
            pace_ms: 0,
        };
        let reply = w.reply(0);
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        // Chat pieces: 0 = role chunk, 1..=3 = the three words.
        let writes: Vec<PieceWrite> = (1..=3)
            .map(|k| PieceWrite {
                request: 0,
                piece: k,
                at: at(1000 * k as u64),
            })
            .collect();
        let line = |text: &str| {
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
                   "update": {"sessionUpdate": "agent_message_chunk",
                              "content": {"type": "text", "text": text}}}})
            .to_string()
        };
        // The first word alone 100 µs after its write; the last two batched at 3500 µs.
        let lines = vec![(at(1100), line("w0000 ")), (at(3500), line("w0001 w0002 "))];
        let l = stream_latencies(&reply, Wire::Chat, &writes, &lines).unwrap();
        assert_eq!(l, vec![100.0, 1500.0, 500.0]);
        let wrong = vec![(at(1100), line("something else"))];
        assert!(stream_latencies(&reply, Wire::Chat, &writes, &wrong).is_err());
    }
}
