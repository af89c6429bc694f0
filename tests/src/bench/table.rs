//! The one table of medians ([`render`]): a row per workload figure, a column per
//! [`Column`](super::Column), each cell the median over the runs with its ratio to the floor,
//! and the issue #15 target of the row checked for the two buzz-agent binaries.

use super::{Figures, Metric, Workload, WorkloadResults, median};
use std::fmt::Write;

/// The figures the table shows for a workload, in row order.
pub fn rows(workload: &Workload) -> &'static [Metric] {
    use Metric::*;
    match workload {
        Workload::Rounds { .. } => &[
            PromptWall,
            Cpu,
            KernelCpu,
            PeakRss,
            LlmConnections,
            LlmBytes,
            LargestRequest,
        ],
        Workload::HookGate { .. } => &[PromptWall, Cpu, PeakRss],
        Workload::Stream { .. } => &[StreamP50, StreamP99, Cpu],
        Workload::Startup { .. } => &[Initialize, SessionNew, SlowestServer, Cpu, PeakRss],
    }
}

fn label(m: Metric) -> &'static str {
    match m {
        Metric::PromptWall => "wall (prompt)",
        Metric::Cpu => "CPU",
        Metric::KernelCpu => "… of which kernel",
        Metric::UserTime => "user time",
        Metric::SystemTime => "system time",
        Metric::PeakRss => "peak RSS",
        Metric::LlmConnections => "LLM connections",
        Metric::LlmBytes => "sent to the LLM",
        Metric::LargestRequest => "last request (history)",
        Metric::StreamP50 => "delta → chunk p50",
        Metric::StreamP99 => "delta → chunk p99",
        Metric::Initialize => "start → `initialize` reply",
        Metric::SessionNew => "`session/new`",
        Metric::SlowestServer => "slowest server alone",
        Metric::Syscalls => "syscalls per round",
    }
}

/// A value in the metric's display unit.
pub(super) fn show(m: Metric, v: f64) -> String {
    let ms = |v: f64| {
        if v < 10.0 {
            format!("{v:.2} ms")
        } else if v < 100.0 {
            format!("{v:.1} ms")
        } else {
            format!("{v:.0} ms")
        }
    };
    match m {
        Metric::PromptWall
        | Metric::Cpu
        | Metric::KernelCpu
        | Metric::UserTime
        | Metric::SystemTime
        | Metric::Initialize
        | Metric::SessionNew
        | Metric::SlowestServer => ms(v),
        Metric::PeakRss => format!("{:.2} MiB", v / 1024.0),
        Metric::LlmConnections => format!("{v:.0}"),
        Metric::LlmBytes => format!("{:.1} MiB", v / 1_048_576.0),
        Metric::LargestRequest => format!("{:.0} KiB", v / 1024.0),
        Metric::StreamP50 | Metric::StreamP99 => format!("{v:.0} µs"),
        Metric::Syscalls => format!("{v:.1}"),
    }
}

/// One line of figures for progress output.
pub fn brief(f: &Figures) -> String {
    f.iter()
        .filter(|(m, _)| {
            matches!(
                m,
                Metric::PromptWall | Metric::Cpu | Metric::PeakRss | Metric::StreamP99
            )
        })
        .map(|(&m, &v)| format!("{} {}", label(m), show(m, v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a cell meets the row's target: `None` when the target does not apply to the column.
type Check = Box<dyn Fn(&str, f64, &Figures, &Figures) -> Option<bool>>;

/// An issue #15 target: its text and its check (`column name, value, the column's medians, the
/// floor's medians`).
struct Target {
    text: &'static str,
    check: Check,
}

/// The two binaries the targets are for.
fn ours(column: &str) -> bool {
    matches!(column, "buzz-agent" | "buzz-agent-smol")
}

fn at_most(text: &'static str, limit: f64) -> Option<Target> {
    Some(Target {
        text,
        check: Box::new(move |c, v, _, _| ours(c).then_some(v <= limit)),
    })
}

/// The target of workload `name`'s `metric` row (issue #15), if it has one.
fn target(name: &str, metric: Metric) -> Option<Target> {
    match (name, metric) {
        ("rounds", Metric::Cpu) => at_most("≤ 50 ms", 50.0),
        ("rounds-long", Metric::Cpu) => at_most("≤ 200 ms", 200.0),
        ("rounds-4k", Metric::Cpu) => at_most("≤ 60 ms", 60.0),
        ("rounds", Metric::PeakRss) => Some(Target {
            text: "smol ≤ 4.0 MiB, tokio ≤ 4.5 MiB",
            check: Box::new(|c, v, _, _| match c {
                "buzz-agent-smol" => Some(v <= 4.0 * 1024.0),
                "buzz-agent" => Some(v <= 4.5 * 1024.0),
                _ => None,
            }),
        }),
        ("rounds-4k", Metric::PeakRss) => Some(Target {
            text: "≤ history + 4 MiB",
            check: Box::new(|c, v, own, _| {
                let history = own.get(&Metric::LargestRequest)?;
                ours(c).then_some(v <= history / 1024.0 + 4.0 * 1024.0)
            }),
        }),
        ("stream", Metric::StreamP99) => at_most("≤ 1000 µs", 1000.0),
        ("startup", Metric::Initialize) => at_most("≤ 2 ms", 2.0),
        ("startup", Metric::SessionNew) => Some(Target {
            text: "≤ 1.2 × slowest server alone",
            check: Box::new(|c, v, _, floor| {
                let slowest = floor.get(&Metric::SlowestServer)?;
                ours(c).then_some(v <= 1.2 * slowest)
            }),
        }),
        _ => None,
    }
}

/// The least CPU, summed over a cell's runs, whose user/kernel split is shown: 5 clock ticks.
const MIN_SPLIT_MS: f64 = 50.0;

/// The medians of every metric over the successful runs of one cell, and
/// [`Metric::KernelCpu`]: the median CPU times the kernel share of the user and system times
/// summed over the runs (one run's split is tick-sampled, too coarse alone; below
/// [`MIN_SPLIT_MS`] in total it is left out).
pub(super) fn medians(runs: &[Result<Figures, String>]) -> Figures {
    let mut all: std::collections::BTreeMap<Metric, Vec<f64>> = Default::default();
    for f in runs.iter().flatten() {
        for (&m, &v) in f {
            all.entry(m).or_default().push(v);
        }
    }
    let sum = |m: Metric| all.get(&m).map_or(0.0, |v| v.iter().sum::<f64>());
    let (user, system) = (sum(Metric::UserTime), sum(Metric::SystemTime));
    let mut out: Figures = all
        .iter()
        .filter_map(|(&m, v)| Some((m, median(v)?)))
        .collect();
    if let Some(&cpu) = out.get(&Metric::Cpu)
        && user + system >= MIN_SPLIT_MS
    {
        out.insert(Metric::KernelCpu, cpu * system / (user + system));
    }
    out
}

/// The table as Markdown, followed by its notes. `columns` are the column names in the order of
/// each [`WorkloadResults::cells`]; the first is the floor. `targets` adds the target column.
pub fn render(results: &[WorkloadResults], columns: &[&str], runs: usize, targets: bool) -> String {
    let mut out = String::new();
    let mut head = String::from("| workload | figure |");
    let mut rule = String::from("|---|---|");
    for c in columns {
        let _ = write!(head, " {c} |");
        rule.push_str("---:|");
    }
    if targets {
        head.push_str(" target (#15) |");
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{head}\n{rule}");
    let mut notes = Vec::new();
    for w in results {
        let med: Vec<Figures> = w.cells.iter().map(|c| medians(c)).collect();
        let floor = &med[0];
        for (k, &metric) in rows(&w.spec.workload).iter().enumerate() {
            let title = if k == 0 { w.spec.title.as_str() } else { "" };
            let mut line = format!("| {title} | {} |", label(metric));
            let target = if targets {
                target(w.spec.name, metric)
            } else {
                None
            };
            for (c, name) in columns.iter().enumerate() {
                let cell = match med[c].get(&metric) {
                    None if w.cells[c].iter().all(|r| r.is_err()) => "failed".to_string(),
                    None => "—".to_string(),
                    Some(&v) => {
                        let mut s = show(metric, v);
                        if c > 0
                            && let Some(&f) = floor.get(&metric).filter(|&&f| f > 0.0)
                        {
                            let r = v / f;
                            let _ = if r < 10.0 {
                                write!(s, " (×{r:.2})")
                            } else {
                                write!(s, " (×{r:.0})")
                            };
                        }
                        match target
                            .as_ref()
                            .and_then(|t| (t.check)(name, v, &med[c], floor))
                        {
                            Some(true) => s.push_str(" ✓"),
                            Some(false) => s.push_str(" ✗"),
                            None => {}
                        }
                        s
                    }
                };
                let _ = write!(line, " {cell} |");
            }
            if targets {
                let _ = write!(line, " {} |", target.map(|t| t.text).unwrap_or(""));
            }
            let _ = writeln!(out, "{line}");
        }
        for (c, cell) in w.cells.iter().enumerate() {
            let failed: Vec<&String> = cell.iter().filter_map(|r| r.as_ref().err()).collect();
            if let Some(first) = failed.first() {
                notes.push(format!(
                    "{} / {}: {} of {} runs failed; first: {}",
                    w.spec.name,
                    columns[c],
                    failed.len(),
                    cell.len(),
                    first.lines().next().unwrap_or_default()
                ));
            }
        }
    }
    let _ = writeln!(
        out,
        "\nMedians of {runs} run(s); (×r) = the cell ÷ the floor; ✓/✗ = the #15 target met or \
         not. Agent CPU = the agent's own utime+stime before stdin EOF (its process CPU clock, ns; \
         reaped children excluded); the floor's = its one driving thread's."
    );
    for n in notes {
        let _ = writeln!(out, "- {n}");
    }
    out
}
