//! The goals table of issue 27 (`bench --goals`, printed by `scripts/bench.sh`): each agent
//! binary with sessions saved (the default) and with `BUZZ_AGENT_STATE_DIR=off`, next to the
//! [limit probe](super::limit), on the tool-round workloads and the stream, with the syscalls
//! per round of one `strace -ff` run per column and the goal checked for the saving-on
//! columns of `buzz-agent` and `buzz-agent-smol`.

use super::table::{medians, show};
use super::{Column, Figures, Metric, Spec, Workload, WorkloadResults, agent};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;

/// The environment of a column with sessions not saved.
const SAVING_OFF: (&str, &str) = ("BUZZ_AGENT_STATE_DIR", "off");

/// The workloads of the goals table (from [`super::workloads`]): 200 and 1,000 tool rounds,
/// 200 rounds of 4 KiB results, the stream.
pub fn specs(quick: bool) -> Vec<Spec> {
    super::workloads(quick)
        .into_iter()
        .filter(|s| matches!(s.name, "rounds" | "rounds-long" | "rounds-4k" | "stream"))
        .collect()
}

/// The columns: the limit probe, then per agent binary `<name> off` (sessions off) and
/// `<name>` (saving on, the default).
pub fn columns(agents: &[Column]) -> Vec<Column> {
    let mut out = vec![Column::Limit];
    for a in agents {
        if let Column::Agent { name, path, env } = a {
            let mut off = env.clone();
            off.push((SAVING_OFF.0.into(), SAVING_OFF.1.into()));
            out.push(Column::Agent {
                name: format!("{name} off"),
                path: path.clone(),
                env: off,
            });
            out.push(a.clone());
        }
    }
    out
}

/// Syscalls per LLM round of the agent's own threads in one run of `workload` under
/// `strace -ff` (`strace` on `PATH`); its MCP server children and their threads are left out.
pub fn syscalls(column: &Column, workload: &Workload) -> Result<f64, String> {
    let Column::Agent { path, env, .. } = column else {
        return Err("not an agent column".into());
    };
    let dir = tempfile::Builder::new()
        .prefix("buzz-bench-strace-")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    let wrapper = dir.path().join("agent");
    let out = dir.path().join("t");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec strace -ff -o '{}' '{}' \"$@\"\n",
            out.display(),
            path.display()
        ),
    )
    .map_err(|e| format!("wrapper: {e}"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("wrapper: {e}"))?;
    agent::run(&wrapper, workload, env)?;
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir.path()).map_err(|e| e.to_string())? {
        let p = entry.map_err(|e| e.to_string())?.path();
        let tid = p
            .extension()
            .and_then(|x| x.to_str())
            .and_then(|x| x.parse::<u32>().ok());
        if let Some(tid) = tid {
            files.insert(tid, std::fs::read_to_string(&p).map_err(|e| e.to_string())?);
        }
    }
    let total = agent_syscalls(&files, path)?;
    Ok(total as f64 / workload.llm_requests().max(1) as f64)
}

/// The syscalls of the agent's threads in `files` (`strace -ff` outputs by thread id): the
/// thread whose file starts with the `execve` of `bin`, and every thread it or they started
/// with `CLONE_THREAD` (its MCP children are processes and are not followed).
fn agent_syscalls(files: &BTreeMap<u32, String>, bin: &Path) -> Result<usize, String> {
    let exec = format!("execve(\"{}\"", bin.display());
    let main = files
        .iter()
        .find(|(_, text)| text.starts_with(&exec))
        .map(|(&t, _)| t)
        .ok_or_else(|| format!("no strace output of {}", bin.display()))?;
    let (mut ours, mut todo) = (BTreeSet::new(), vec![main]);
    while let Some(t) = todo.pop() {
        if !ours.insert(t) {
            continue;
        }
        for line in files.get(&t).map(String::as_str).unwrap_or("").lines() {
            if (line.starts_with("clone(") || line.starts_with("clone3("))
                && line.contains("CLONE_THREAD")
                && let Some(tid) = line.rsplit("= ").next().and_then(|n| n.parse().ok())
            {
                todo.push(tid);
            }
        }
    }
    let is_call = |l: &&str| {
        let name = l.split('(').next().unwrap_or("");
        l.contains('(')
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    Ok(ours
        .iter()
        .map(|t| {
            files
                .get(t)
                .map_or(0, |f| f.lines().filter(is_call).count())
        })
        .sum())
}

/// A row of the goals table: the workload, the figure, its label and the goal's text and limit
/// per column name (`None`: no goal for that column).
struct Row {
    workload: &'static str,
    metric: Metric,
    label: &'static str,
    goal: &'static str,
    check: fn(&str, f64, f64) -> Option<bool>,
}

/// Whether `column` is a saving-on column of one of the two binaries the goals are for.
fn ours_on(column: &str) -> bool {
    matches!(column, "buzz-agent" | "buzz-agent-smol")
}

const ROWS: &[Row] = &[
    Row {
        workload: "rounds",
        metric: Metric::Cpu,
        label: "200 rounds, agent CPU",
        goal: "≤ 12 ms, ≤ 2.5× the limit",
        check: |c, v, limit| ours_on(c).then_some(v <= 12.0 && v <= 2.5 * limit),
    },
    Row {
        workload: "rounds-long",
        metric: Metric::Cpu,
        label: "1,000 rounds, agent CPU",
        goal: "≤ 60 ms",
        check: |c, v, _| ours_on(c).then_some(v <= 60.0),
    },
    Row {
        workload: "rounds-4k",
        metric: Metric::Cpu,
        label: "200 rounds × 4 KiB results, agent CPU",
        goal: "≤ 30 ms",
        check: |c, v, _| ours_on(c).then_some(v <= 30.0),
    },
    Row {
        workload: "rounds",
        metric: Metric::Syscalls,
        label: "syscalls per round (200 rounds)",
        goal: "≤ 10 on both",
        check: |c, v, _| ours_on(c).then_some(v <= 10.0),
    },
    Row {
        workload: "rounds",
        metric: Metric::PeakRss,
        label: "peak RSS, 200 rounds",
        goal: "smol ≤ 4.0 MiB, tokio ≤ 4.5 MiB",
        check: |c, v, _| match c {
            "buzz-agent-smol" => Some(v <= 4.0 * 1024.0),
            "buzz-agent" => Some(v <= 4.5 * 1024.0),
            _ => None,
        },
    },
    Row {
        workload: "stream",
        metric: Metric::StreamP99,
        label: "streaming p99 delta latency",
        goal: "≤ 100 µs",
        check: |c, v, _| ours_on(c).then_some(v <= 100.0),
    },
];

/// The goals table as Markdown. `results` are [`super::run`]'s over [`specs`] and `columns`
/// (names in the same order; the first is the limit probe); `syscalls` holds the
/// [`Metric::Syscalls`] figure per column index (the probe's comes from its runs).
pub fn render(
    results: &[WorkloadResults],
    columns: &[&str],
    syscalls: &BTreeMap<usize, f64>,
    runs: usize,
) -> String {
    let med: BTreeMap<&str, Vec<Figures>> = results
        .iter()
        .map(|w| (w.spec.name, w.cells.iter().map(|c| medians(c)).collect()))
        .collect();
    let mut out = String::from("| figure |");
    let mut rule = String::from("|---|");
    for c in columns {
        let _ = write!(out, " {c} |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, " goal (saving on) |\n{rule}---|");
    for row in ROWS {
        let Some(cells) = med.get(row.workload) else {
            continue;
        };
        let value = |c: usize| match row.metric {
            Metric::Syscalls if c > 0 => syscalls.get(&c).copied(),
            m => cells.get(c).and_then(|f| f.get(&m).copied()),
        };
        let limit = value(0).filter(|&l| l > 0.0);
        let _ = write!(out, "| {} |", row.label);
        for (c, name) in columns.iter().enumerate() {
            let Some(v) = value(c) else {
                out.push_str(" — |");
                continue;
            };
            let mut s = show(row.metric, v);
            if let Some(l) = limit.filter(|_| c > 0) {
                let _ = write!(s, " (×{:.1})", v / l);
            }
            match (row.check)(name, v, limit.unwrap_or(f64::INFINITY)) {
                Some(true) => s.push_str(" ✓"),
                Some(false) => s.push_str(" ✗"),
                None => {}
            }
            let _ = write!(out, " {s} |");
        }
        let _ = writeln!(out, " {} |", row.goal);
    }
    let _ = writeln!(
        out,
        "\nMedians of {runs} run(s); (×r) = the cell ÷ the limit probe (the least IO of a tool \
         round, no JSON work, no start-up); `off` = `BUZZ_AGENT_STATE_DIR=off`, the other \
         agent columns save sessions (the default). Agent CPU = its utime+stime before stdin \
         EOF, start-up included; syscalls = its own threads' in one `strace -ff` run."
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscalls_count_the_agent_threads_and_not_its_children() {
        let bin = Path::new("/x/buzz-agent");
        let files = BTreeMap::from([
            (
                10,
                "execve(\"/x/buzz-agent\", [\"buzz-agent\"], 0x1) = 0\n\
                 clone3({flags=CLONE_VM|CLONE_THREAD|CLONE_SIGHAND, child_tid=0x7}, 88) = 11\n\
                 clone(child_stack=NULL, flags=CLONE_CHILD_SETTID|SIGCHLD) = 20\n\
                 +++ exited with 0 +++\n"
                    .to_string(),
            ),
            (
                11,
                "futex(0x1, FUTEX_WAIT, 0) = 0\nread(3, \"x\", 1) = 1\n".to_string(),
            ),
            (
                20,
                "execve(\"/x/fake-mcp\", [], 0x1) = 0\nread(0, \"\", 1) = 0\n".to_string(),
            ),
        ]);
        assert_eq!(agent_syscalls(&files, bin), Ok(5));
        assert!(agent_syscalls(&files, Path::new("/y/other")).is_err());
    }
}
