//! Reading the process table from `/proc` (Linux), to check that no child or grandchild of the
//! agent outlives it (SPEC M8, P1).

use std::collections::BTreeMap;

/// The fields of `/proc/<pid>/stat` the suite needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub comm: String,
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    pub state: char,
    pub ppid: i32,
    pub pgid: i32,
}

/// Parses one `/proc/<pid>/stat` line. `comm` may contain blanks and parentheses, so the fields
/// after it are found from the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let comm = line.get(open + 1..close)?.to_string();
    let mut rest = line.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgid = rest.next()?.parse().ok()?;
    Some(Stat {
        pid,
        comm,
        state,
        ppid,
        pgid,
    })
}

/// The stat of one process, `None` when it does not exist (any more).
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Every process visible in `/proc`.
pub fn all() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

/// All descendants of `pid` (children, grandchildren, …), zombies included, found by walking the
/// parent pids of the whole table. An orphan re-parented to init is no longer a descendant: use
/// [`group_members`] or remembered pids for those.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for s in all() {
        children.entry(s.ppid).or_default().push(s.pid);
    }
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if let Some(kids) = children.get(&p) {
            for &k in kids {
                if k != pid && !out.contains(&k) {
                    out.push(k);
                    todo.push(k);
                }
            }
        }
    }
    out
}

/// The live (not zombie) processes whose process group is `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    all()
        .into_iter()
        .filter(|s| s.pgid == pgid && !matches!(s.state, 'Z' | 'X'))
        .map(|s| s.pid)
        .collect()
}

/// `pid` exists and is neither a zombie nor dead.
///
/// ```
/// assert!(buzz_agent_e2e::procfs::is_alive(std::process::id() as i32));
/// assert!(!buzz_agent_e2e::procfs::is_alive(i32::MAX));
/// ```
pub fn is_alive(pid: i32) -> bool {
    stat(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X'))
}

/// Polls until none of `pids` is alive or `timeout` passes; returns the ones still alive.
pub fn wait_all_dead(pids: &[i32], timeout: std::time::Duration) -> Vec<i32> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|&p| is_alive(p)).collect();
        if alive.is_empty() || std::time::Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A readable description of a pid for failure messages.
pub fn describe(pid: i32) -> String {
    match stat(pid) {
        Some(s) => format!(
            "pid {} ({}) state {} ppid {} pgid {}",
            s.pid, s.comm, s.state, s.ppid, s.pgid
        ),
        None => format!("pid {pid} (gone)"),
    }
}

/// The kernel's peak-RSS mark (`VmHWM` of `/proc/<pid>/status`) in KiB, `None` when the process
/// is gone or the field is missing.
pub fn peak_rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_peak_rss_is_read_and_a_missing_process_has_none() {
        let kib = peak_rss_kib(std::process::id() as i32).expect("own VmHWM");
        assert!(kib > 100, "{kib} KiB");
        assert_eq!(peak_rss_kib(i32::MAX), None);
    }

    #[test]
    fn stat_with_blanks_and_parens_in_comm_parses() {
        let s = parse_stat("123 (a b) c)) S 7 99 99 0 -1 4194304").unwrap();
        assert_eq!(
            s,
            Stat {
                pid: 123,
                comm: "a b) c)".into(),
                state: 'S',
                ppid: 7,
                pgid: 99
            }
        );
    }

    #[test]
    fn own_process_is_alive_and_a_spawned_child_is_a_descendant() {
        let me = std::process::id() as i32;
        assert!(is_alive(me));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let cpid = child.id() as i32;
        assert!(descendants(me).contains(&cpid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_alive(cpid));
        assert!(!descendants(me).contains(&cpid));
    }
}
