//! Smoke test of the benchmark (issue #15), so it cannot rot, and the cost workload's goals
//! (issue 23, SPEC L11: `l11_cost_billed_input_stays_within_the_goals` runs the `cost` binary
//! against both agent binaries at 200 rounds). The benchmark: the `bench` binary in quick mode
//! (`--quick --runs 1`) on the tool-rounds and streaming workloads, with the IO floor and both
//! agent binaries of this target directory as columns. It checks that every cell completed,
//! that the table has the figures, and that the floor sent the LLM the same history as the
//! agents (its request bodies are the agents' in size). No timing is asserted.
//!
//! The agents are the workspace binaries next to `bench` (`cargo test --workspace` builds them);
//! when one is missing the trial is ignored with the reason, or failed when `CI` is set.

use buzz_agent_e2e::differential::missing_sibling;
use buzz_agent_e2e::peers::in_ci;
use libtest_mimic::{Arguments, Completion, Trial};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const AGENTS: [&str; 2] = ["buzz-agent", "buzz-agent-smol"];

fn main() {
    let args = Arguments::from_args();
    let trial = Trial::ignorable_test("bench_quick_mode_prints_the_table_of_all_columns", || {
        let bench = PathBuf::from(env!("CARGO_BIN_EXE_bench"));
        let mut agents = Vec::new();
        for a in AGENTS {
            let path = bench.with_file_name(a);
            if let Some(outcome) = missing_sibling(&path, a, in_ci()) {
                return outcome;
            }
            agents.push(path);
        }
        quick_run_prints_the_table(&bench, &agents);
        Ok(Completion::Completed)
    });
    let cost = Trial::ignorable_test("l11_cost_billed_input_stays_within_the_goals", || {
        let cost = PathBuf::from(env!("CARGO_BIN_EXE_cost"));
        for a in AGENTS {
            let path = cost.with_file_name(a);
            if let Some(outcome) = missing_sibling(&path, a, in_ci()) {
                return outcome;
            }
            l11_cost_billed_input_stays_within_the_goals(&cost, &path);
        }
        Ok(Completion::Completed)
    });
    libtest_mimic::run(&args, vec![trial, cost]).exit();
}

/// The cost workload (issue 23, SPEC L11) at its full size: `cost` exits 0 only when every
/// session ends and caching on bills at most 0.15× the uncached input (0.20× with a `_Stop`
/// objection and a compaction); its table has the three rows, caching off at 1×.
fn l11_cost_billed_input_stays_within_the_goals(cost: &PathBuf, agent: &PathBuf) {
    let out = Command::new(cost).arg(agent).output().expect("run cost");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cost failed for {} ({}):\n{stdout}\n{stderr}",
        agent.display(),
        out.status
    );
    let ratios: Vec<f64> = stdout
        .lines()
        .skip(2)
        .filter_map(|l| {
            l.trim_end_matches('|')
                .rsplit('|')
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(ratios.len(), 3, "{stdout}");
    assert!(ratios[0] <= 0.15 && ratios[2] <= 0.20, "{stdout}");
    assert!(
        (ratios[1] - 1.0).abs() < 1e-9,
        "caching off bills every token: {stdout}"
    );
}

fn quick_run_prints_the_table(bench: &PathBuf, agents: &[PathBuf]) {
    let started = Instant::now();
    let out = Command::new(bench)
        .args(["--quick", "--runs", "1", "--only", "rounds,stream"])
        .args(agents)
        .env_remove("BENCH_PEER")
        .env_remove("BENCH_WORKLOADS")
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "quick mode took {:?}",
        started.elapsed()
    );
    let header = stdout.lines().next().unwrap_or_default();
    assert_eq!(
        header, "| workload | figure | floor | buzz-agent | buzz-agent-smol |",
        "{stdout}"
    );
    // The cells of a figure's row, after the workload and figure columns.
    let row = |figure: &str| -> Vec<String> {
        let line = stdout
            .lines()
            .find(|l| l.split('|').nth(2).is_some_and(|c| c.trim() == figure))
            .unwrap_or_else(|| panic!("no row {figure:?}:\n{stdout}"));
        line.split('|')
            .skip(3)
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect()
    };
    for figure in [
        "wall (prompt)",
        "CPU",
        "LLM connections",
        "delta → chunk p50",
        "delta → chunk p99",
    ] {
        let cells = row(figure);
        assert_eq!(cells.len(), 3, "{figure}: {cells:?}\n{stdout}");
        for c in &cells {
            let number: f64 = c
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{figure}: {c:?} is not a figure\n{stdout}"));
            assert!(number > 0.0, "{figure}: {c:?}\n{stdout}");
        }
    }
    let rss = row("peak RSS");
    assert_eq!(rss[0], "—", "the floor has no RSS of its own");
    assert!(rss[1..].iter().all(|c| c.ends_with("MiB")), "{rss:?}");
    // The floor sends the same history: each agent's last request is within 5 % of it.
    for c in &row("last request (history)")[1..] {
        let ratio: f64 = c
            .split("(×")
            .nth(1)
            .and_then(|r| r.trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("no ratio in {c:?}\n{stdout}"));
        assert!(
            (0.95..=1.05).contains(&ratio),
            "the floor's history differs from an agent's: {c}\n{stdout}"
        );
    }
}
