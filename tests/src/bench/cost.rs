//! The cost workload of issue 23 (SPEC L11; `scripts/bench.sh`, the `cost` binary,
//! `docs/performance.md`): what a long tool session bills in input tokens on the Anthropic
//! route, with prompt caching on and off, against a fake LLM that applies Anthropic's caching
//! rules ([`CacheSim`]) and reports the usage they give (so the agent's own `usage_update`s
//! carry the same figures).
//!
//! The rules (docs.anthropic.com, "Prompt caching"), as the simulator applies them:
//! * the prefix is the request's blocks in the order tools → system → messages (each tool, each
//!   system block, each content block of each message is one block; a string is one block);
//! * a block with `cache_control` is a breakpoint: the prefix ending at it is written to the
//!   cache, unless it is under [`MIN_CACHED_TOKENS`];
//! * a request reads the longest written prefix that ends at one of its breakpoints or up to
//!   [`LOOKBACK_BLOCKS`] blocks before one;
//! * billing: the tokens read at 0.1×, the tokens written (from the end of what was read to the
//!   last breakpoint written) at 1.25×, the rest at 1×.
//!
//! A block's tokens are its compact JSON bytes (without its `cache_control`) / 4, at least 1.

use crate::fake_llm::{FakeLlm, Options, RecordedRequest, Reply, Wire};
use crate::harness::{AgentProc, env_for_origin, fake_mcp_entry};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Anthropic does not cache a prefix under 1,024 tokens (Sonnet and Opus).
pub const MIN_CACHED_TOKENS: u64 = 1024;
/// How many blocks before a breakpoint Anthropic looks for a cached prefix.
pub const LOOKBACK_BLOCKS: usize = 20;
/// What a cache write bills, × an uncached token.
pub const WRITE_FACTOR: f64 = 1.25;
/// What a cache read bills, × an uncached token.
pub const READ_FACTOR: f64 = 0.1;

/// The input tokens of one request as the cache splits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bill {
    /// Read from the cache.
    pub read: u64,
    /// Written to the cache.
    pub write: u64,
    /// Neither.
    pub uncached: u64,
}

impl Bill {
    /// All input tokens of the request.
    pub fn total(&self) -> u64 {
        self.read + self.write + self.uncached
    }

    /// Billed input token-equivalents.
    pub fn billed(&self) -> f64 {
        self.uncached as f64 + WRITE_FACTOR * self.write as f64 + READ_FACTOR * self.read as f64
    }
}

/// Anthropic's prompt cache as the module doc says: the prefixes written so far.
#[derive(Debug, Default)]
pub struct CacheSim {
    written: HashSet<u64>,
}

/// One block of a request's prefix: the hash of the prefix ending at it, the prefix's
/// tokens, whether it is a breakpoint.
struct Block {
    prefix: u64,
    tokens: u64,
    breakpoint: bool,
}

/// The blocks of an Anthropic Messages request `body`, in prefix order.
fn blocks(body: &Value) -> Vec<Block> {
    let mut out = Vec::new();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut tokens = 0u64;
    let mut push = |kind: &str, block: &Value| {
        let mut plain = block.clone();
        let breakpoint = plain
            .as_object_mut()
            .and_then(|o| o.remove("cache_control"))
            .is_some();
        let text = plain.to_string();
        kind.hash(&mut hasher);
        text.hash(&mut hasher);
        tokens += (text.len() as u64 / 4).max(1);
        out.push(Block {
            prefix: hasher.finish(),
            tokens,
            breakpoint,
        });
    };
    for tool in body["tools"].as_array().into_iter().flatten() {
        push("tool", tool);
    }
    match &body["system"] {
        Value::Array(blocks) => blocks.iter().for_each(|b| push("system", b)),
        Value::Null => {}
        other => push("system", other),
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or("?");
        match &message["content"] {
            Value::Array(blocks) => {
                for (k, b) in blocks.iter().enumerate() {
                    push(if k == 0 { role } else { "+" }, b);
                }
            }
            other => push(role, other),
        }
    }
    out
}

impl CacheSim {
    /// A cold cache.
    pub fn new() -> CacheSim {
        CacheSim::default()
    }

    /// Serves one request: what it reads and writes, and the prefixes it writes kept.
    pub fn serve(&mut self, body: &Value) -> Bill {
        let blocks = blocks(body);
        let total = blocks.last().map_or(0, |b| b.tokens);
        let mut read = 0;
        for (at, _) in blocks.iter().enumerate().filter(|(_, b)| b.breakpoint) {
            let from = at.saturating_sub(LOOKBACK_BLOCKS);
            if let Some(hit) = blocks[from..=at]
                .iter()
                .rev()
                .find(|p| self.written.contains(&p.prefix))
            {
                read = read.max(hit.tokens);
            }
        }
        let mut written_to = read;
        for b in blocks.iter().filter(|b| b.breakpoint) {
            if b.tokens >= MIN_CACHED_TOKENS {
                self.written.insert(b.prefix);
                written_to = written_to.max(b.tokens);
            }
        }
        Bill {
            read,
            write: written_to - read,
            uncached: total - written_to,
        }
    }
}

/// A session of the cost workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// Tool rounds in all.
    pub rounds: usize,
    /// Bytes of each tool result.
    pub result_bytes: usize,
    /// `BUZZ_AGENT_PROMPT_CACHING` on.
    pub caching: bool,
    /// The model stops halfway, a `_Stop` hook objects once, and the context is compacted once
    /// a little later (`BUZZ_AGENT_MAX_CONTEXT_TOKENS` set for it).
    pub objection_and_compaction: bool,
}

/// What a session billed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// LLM requests (the summary call included).
    pub requests: usize,
    /// Summary calls.
    pub summaries: usize,
    /// Input tokens with no cache at all (every token at 1×).
    pub uncached: u64,
    /// Tokens read, written, neither.
    pub bill: Bill,
    /// Billed input token-equivalents.
    pub billed: f64,
}

impl Totals {
    /// Billed input as a share of the uncached total.
    pub fn ratio(&self) -> f64 {
        self.billed / self.uncached.max(1) as f64
    }
}

/// The marker of the agent's compaction summary call (its system prompt, SPEC K1).
const SUMMARY_MARK: &str = "You compact the working context";

/// Runs `session` once against the agent at `bin` on the Anthropic route.
pub fn run(bin: &Path, session: Session) -> Result<Totals, String> {
    let sim = Arc::new(Mutex::new((CacheSim::new(), Totals::default(), 0usize)));
    let state = sim.clone();
    let half = session.rounds / 2;
    let llm = FakeLlm::with_options(
        Options {
            keep_alive: true,
            record_bodies: true,
        },
        move |_, req: &RecordedRequest| {
            let Ok(mut guard) = state.lock() else {
                return Reply::text("poisoned");
            };
            let (cache, totals, step) = &mut *guard;
            let bill = cache.serve(&req.body);
            totals.requests += 1;
            totals.uncached += bill.total();
            totals.bill.read += bill.read;
            totals.bill.write += bill.write;
            totals.bill.uncached += bill.uncached;
            totals.billed += bill.billed();
            let summary = req.body["system"].to_string().contains(SUMMARY_MARK);
            let reply = if summary {
                totals.summaries += 1;
                Reply::text(
                    "1. Original task: run the benchmark. 2. Progress: many rounds. 5. Next step: go on.",
                )
            } else {
                let k = *step;
                *step += 1;
                // With an objection, the model stops after `half` rounds (step `half`), the
                // hook objects, and it goes on: `rounds` tool calls and two stops in all.
                let stop_at = session.objection_and_compaction.then_some(half);
                let calls_done = if stop_at.is_some_and(|s| k > s) {
                    k - 1
                } else {
                    k
                };
                if stop_at == Some(k) || calls_done >= session.rounds {
                    Reply::text("All rounds done.")
                } else {
                    Reply::tool_calls(vec![(
                        format!("call_{k}").as_str(),
                        "fs__big",
                        json!({"bytes": session.result_bytes}),
                    )])
                }
            };
            reply
                .usage(Some((bill.total(), 20)))
                .cache_usage(bill.read, bill.write)
        },
    );
    let dir = tempfile::Builder::new()
        .prefix("buzz-cost-")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    let mut env = env_for_origin(Wire::Anthropic, &llm.origin());
    env.retain(|(k, _)| k != "BUZZ_AGENT_LOG");
    let mut extra = vec![
        ("BUZZ_AGENT_LOG", "warn".to_string()),
        ("BUZZ_AGENT_SYSTEM_PROMPT", "You are a careful software agent. Use the tools to do the work, one step at a time, and report what you did.".to_string()),
        ("BUZZ_AGENT_PROMPT_CACHING", if session.caching { "1" } else { "0" }.to_string()),
        ("MCP_HOOK_SERVERS", "gate".to_string()),
    ];
    if session.objection_and_compaction {
        // Compaction at 90 % of the window: a little after the objection's round.
        let per_round = session.result_bytes as u64 / 4 + 60;
        let window = per_round * (session.rounds as u64 * 6 / 10) * 10 / 9;
        extra.push(("BUZZ_AGENT_MAX_CONTEXT_TOKENS", window.to_string()));
        extra.push(("BUZZ_AGENT_MAX_OUTPUT_TOKENS", "4096".to_string()));
    }
    for (k, v) in extra {
        env.retain(|(name, _)| name != k);
        env.push((k.to_string(), v));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let agent = AgentProc::spawn(bin, &env, dir.path());
    agent.initialize();
    let mut servers = vec![fake_mcp_entry("fs", &[("FAKE_MCP_TOOLS", "big")])];
    if session.objection_and_compaction {
        servers.push(fake_mcp_entry(
            "gate",
            &[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_OBJECT_TIMES", "1")],
        ));
    }
    let sid = agent.new_session(dir.path(), json!(servers));
    let resp = agent.prompt_timeout(&sid, "run the benchmark", Duration::from_secs(1800));
    let stop = resp["result"]["stopReason"].clone();
    agent.close_stdin();
    agent.wait_exit(Duration::from_secs(10));
    if stop != "end_turn" {
        return Err(format!("stopReason {stop}: {resp}{}", agent.context()));
    }
    let totals = sim
        .lock()
        .map(|g| g.1.clone())
        .map_err(|_| "the fake LLM panicked".to_string())?;
    if session.objection_and_compaction && totals.summaries != 1 {
        return Err(format!(
            "{} summary calls, expected 1 (the compaction did not happen as planned)",
            totals.summaries
        ));
    }
    Ok(totals)
}

/// The cost table (Markdown) of `rows`: `(what, totals)`.
pub fn table(rows: &[(String, Totals)]) -> String {
    let mut out = String::from(
        "| session | requests | input tokens, uncached | read | written | other | billed input (token-equivalents) | × uncached |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (what, t) in rows {
        out.push_str(&format!(
            "| {what} | {} | {} | {} | {} | {} | {:.0} | {:.3} |\n",
            t.requests,
            t.uncached,
            t.bill.read,
            t.bill.write,
            t.bill.uncached,
            t.billed,
            t.ratio()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request of `n` tool-result rounds of `bytes` each, breakpoints where `marks` says
    /// (message indices whose last block is marked), the system prompt marked.
    fn request(n: usize, bytes: usize, marks: &[usize]) -> Value {
        let mut messages =
            vec![json!({"role": "user", "content": [{"type": "text", "text": "go"}]})];
        for i in 0..n {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": format!("c{i}"), "name": "t", "input": {}}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("c{i}"), "content": "x".repeat(bytes)}]}));
        }
        for &m in marks {
            if let Some(b) = messages[m]["content"]
                .as_array_mut()
                .and_then(|a| a.last_mut())
            {
                b["cache_control"] = json!({"type": "ephemeral"});
            }
        }
        json!({"system": [{"type": "text", "text": "s".repeat(8000), "cache_control": {"type": "ephemeral"}}],
               "messages": messages})
    }

    /// The tokens of [`request`]'s system block.
    fn system_tokens() -> u64 {
        json!({"type": "text", "text": "s".repeat(8000)})
            .to_string()
            .len() as u64
            / 4
    }

    #[test]
    fn l11_a_request_reads_what_the_last_one_wrote_and_writes_only_the_new_part() {
        let mut sim = CacheSim::new();
        let first = sim.serve(&request(1, 2000, &[2]));
        assert_eq!(first.read, 0);
        assert!(first.write > 0 && first.uncached == 0, "{first:?}");
        // The next round marks the previous end and the new end: it reads the old prefix.
        let second = sim.serve(&request(2, 2000, &[2, 4]));
        assert_eq!(second.read, first.total(), "{second:?}");
        assert_eq!(second.uncached, 0);
        assert!(
            second.write > 0 && second.write < first.total() / 2,
            "{second:?}"
        );
        // Without a mark on the conversation, only the system prompt is read, nothing written.
        let plain = sim.serve(&request(3, 2000, &[]));
        assert_eq!(plain.read, system_tokens(), "the system prompt: {plain:?}");
        assert_eq!(plain.write, 0);
    }

    #[test]
    fn l11_the_lookback_is_20_blocks_and_a_short_prefix_is_not_cached() {
        let mut sim = CacheSim::new();
        sim.serve(&request(1, 2000, &[2]));
        // 10 rounds later (20 blocks): the old end is just within the lookback.
        let near = sim.serve(&request(11, 2000, &[22]));
        assert!(near.read > system_tokens(), "{near:?}");
        let mut sim = CacheSim::new();
        sim.serve(&request(1, 2000, &[2]));
        let far = sim.serve(&request(12, 2000, &[24]));
        assert_eq!(far.read, system_tokens(), "only the system prompt: {far:?}");
        // Under 1,024 tokens nothing is written.
        let mut sim = CacheSim::new();
        let body = json!({"system": [{"type": "text", "text": "short", "cache_control": {"type": "ephemeral"}}],
                          "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(sim.serve(&body).write, 0);
        assert_eq!(sim.serve(&body).read, 0);
    }

    #[test]
    fn l11_the_bill_weighs_reads_and_writes() {
        let b = Bill {
            read: 1000,
            write: 100,
            uncached: 10,
        };
        assert_eq!(b.total(), 1110);
        assert!((b.billed() - (10.0 + 125.0 + 100.0)).abs() < 1e-9);
    }
}
