//! `bench`: the performance benchmark of issue #15 (run it through `scripts/bench.sh`; reading
//! the table: `docs/performance.md`).
//!
//! `bench [--quick] [--runs N] [--only NAME,…] <agent-binary>…` runs every workload of
//! [`buzz_agent_e2e::bench::workloads`] in the IO-floor column and one column per agent binary,
//! `N` times, interleaved, and prints one Markdown table of medians with ratios to the floor on
//! stdout (progress on stderr). The environment can say the same: `BENCH_RUNS=N` (default 5),
//! `BENCH_QUICK=1` (small workloads, for CI smoke), `BENCH_WORKLOADS=NAME,…` (`rounds`,
//! `rounds-long`, `rounds-4k`, `hooks`, `stream`, `startup`) and `BENCH_PEER=/path/to/agent`
//! (any other ACP agent as one more column; several separated by `,`).
//!
//! `--goals` prints the goals table of issue 27 instead ([`buzz_agent_e2e::bench::goals`]): the
//! limit probe and each binary with sessions saved and off, on the tool-round workloads and the
//! stream, with syscalls per round from one `strace -ff` run per column.
//!
//! Exits 1 when a run failed (the table still shows the other runs' medians), 2 on bad usage.
//! With `BUZZ_E2E_ROLE=fake-mcp` this binary is the fake MCP server the sessions use.

use buzz_agent_e2e::bench::{self, Column};

const USAGE: &str = "usage: bench [--quick] [--goals] [--runs N] [--only NAME,…] <agent-binary>…";

fn main() {
    buzz_agent_e2e::serve_role_if_asked();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let mut quick = env("BENCH_QUICK").is_some_and(|v| !matches!(v.trim(), "0" | "false" | "no"));
    let mut runs: usize = match env("BENCH_RUNS").map(|v| v.trim().parse()) {
        None => 5,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => usage("BENCH_RUNS must be a positive number"),
    };
    let mut only: Option<String> = env("BENCH_WORKLOADS");
    let mut goals = false;
    let mut paths: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--goals" => goals = true,
            "--runs" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n >= 1 => runs = n,
                _ => usage("--runs needs a positive number"),
            },
            "--only" => only = Some(args.next().unwrap_or_else(|| usage("--only needs names"))),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            _ if a.starts_with('-') => usage(&format!("unknown option {a}")),
            _ => paths.push(a),
        }
    }
    if let Some(peers) = env("BENCH_PEER") {
        paths.extend(peers.split(',').map(|p| p.trim().to_string()));
    }

    let mut specs = if goals {
        bench::goals::specs(quick)
    } else {
        bench::workloads(quick)
    };
    if let Some(only) = &only {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        for n in &names {
            if !specs.iter().any(|s| s.name == *n) {
                usage(&format!("unknown workload {n}"));
            }
        }
        specs.retain(|s| names.contains(&s.name));
    }
    let mut columns = vec![Column::Floor];
    for p in &paths {
        columns.push(Column::agent(p).unwrap_or_else(|e| usage(&e)));
    }
    bench::disambiguate(&mut columns);
    if goals {
        columns = bench::goals::columns(&columns);
    }

    eprintln!(
        "bench: {} workload(s) × {} column(s) × {runs} run(s){}",
        specs.len(),
        columns.len(),
        if quick { ", quick" } else { "" }
    );
    let results = bench::run(&specs, &columns, runs, |line| eprintln!("  {line}"));
    let names: Vec<&str> = columns.iter().map(Column::name).collect();
    let mut failed = results
        .iter()
        .flat_map(|w| w.cells.iter().flatten())
        .any(Result::is_err);
    if goals {
        // One strace run per agent column of the 200-round workload, for syscalls per round.
        let mut syscalls = std::collections::BTreeMap::new();
        if let Some(rounds) = specs.iter().find(|s| s.name == "rounds") {
            for (k, c) in columns.iter().enumerate().skip(1) {
                match bench::goals::syscalls(c, &rounds.workload) {
                    Ok(n) => {
                        eprintln!("  strace {}: {n:.1} syscalls per round", c.name());
                        syscalls.insert(k, n);
                    }
                    Err(e) => {
                        eprintln!("  strace {}: FAILED: {e}", c.name());
                        failed = true;
                    }
                }
            }
        }
        print!(
            "{}",
            bench::goals::render(&results, &names, &syscalls, runs)
        );
    } else {
        print!("{}", bench::table::render(&results, &names, runs, !quick));
    }
    if failed {
        std::process::exit(1);
    }
}

/// Prints `msg` and the usage; exits 2.
fn usage(msg: &str) -> ! {
    eprintln!("bench: {msg}\n{USAGE}");
    std::process::exit(2);
}
