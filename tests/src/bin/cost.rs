//! `cost`: the cost workload of issue 23 (SPEC L11; run it through `scripts/bench.sh`, reading
//! the table: `docs/performance.md`, "What a session costs").
//!
//! `cost [--rounds N] [--bytes B] <agent-binary>` runs three sessions of `N` tool rounds (default
//! 200) with results of `B` bytes (default 2048) on the Anthropic route against a fake LLM that
//! applies Anthropic's prompt-caching rules (`buzz_agent_e2e::bench::cost`): caching on, caching
//! off, and caching on with a `_Stop` objection halfway and a compaction after it. It prints one
//! Markdown table of billed input tokens (stdout) and exits 1 when a session failed, or when
//! caching on bills more than 0.15× the uncached total (0.20× with the objection and the
//! compaction), the goals of issue 23.
//!
//! With `BUZZ_E2E_ROLE=fake-mcp` this binary is the fake MCP server the sessions use.

use buzz_agent_e2e::bench::cost::{self, Session};
use buzz_agent_e2e::cli::Args;
use std::path::PathBuf;

const USAGE: &str = "usage: cost [--rounds N] [--bytes B] <agent-binary>";

fn main() {
    buzz_agent_e2e::serve_role_if_asked();
    let mut rounds = 200;
    let mut bytes = 2048;
    let mut bin: Option<PathBuf> = None;
    let mut args = Args::new("cost", USAGE);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.number("--rounds"),
            "--bytes" => bytes = args.number("--bytes"),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            _ if a.starts_with('-') => args.fail(&format!("unknown option {a}")),
            _ if bin.is_none() => bin = Some(PathBuf::from(a)),
            _ => args.fail("one agent binary"),
        }
    }
    let bin = bin.unwrap_or_else(|| args.fail("an agent binary"));
    let bin = std::fs::canonicalize(&bin)
        .unwrap_or_else(|e| args.fail(&format!("{}: {e}", bin.display())));
    let session = |caching, objection_and_compaction| Session {
        rounds,
        result_bytes: bytes,
        caching,
        objection_and_compaction,
    };
    let runs = [
        (
            format!("{rounds} rounds, caching on"),
            session(true, false),
            Some(0.15),
        ),
        (
            format!("{rounds} rounds, caching off"),
            session(false, false),
            None,
        ),
        (
            format!("{rounds} rounds, caching on, a `_Stop` objection and a compaction"),
            session(true, true),
            Some(0.20),
        ),
    ];
    let mut rows = Vec::new();
    let mut failed = false;
    for (what, s, goal) in runs {
        eprintln!("cost: {what} ({bytes}-byte results)");
        match cost::run(&bin, s) {
            Ok(totals) => {
                if let Some(goal) = goal.filter(|g| totals.ratio() > *g) {
                    eprintln!(
                        "cost: {what}: {:.3}× the uncached total, over the goal {goal}×",
                        totals.ratio()
                    );
                    failed = true;
                }
                rows.push((what, totals));
            }
            Err(e) => {
                eprintln!("cost: {what}: {e}");
                failed = true;
            }
        }
    }
    print!("{}", cost::table(&rows));
    if failed {
        std::process::exit(1);
    }
}
