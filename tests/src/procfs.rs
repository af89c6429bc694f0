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

/// The CPU time `pid` itself has used: all its threads, dead ones included, its reaped children
/// excluded — `utime + stime` of `/proc/<pid>/stat` (fields 14 and 15). Read with nanosecond
/// resolution from the process's CPU-time clock (`clock_getcpuclockid`, the kernel's
/// `sum_exec_runtime` that `/proc` reports rounded down to 10 ms clock ticks); from
/// `/proc/<pid>/stat` when that clock is unavailable. `None` when the process is gone.
pub fn cpu_time(pid: i32) -> Option<std::time::Duration> {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both out-pointers are valid and writable for the duration of the calls.
    let clock_ok = unsafe {
        libc::clock_getcpuclockid(pid, &mut clock) == 0 && libc::clock_gettime(clock, &mut ts) == 0
    };
    if clock_ok && stat(pid).is_some() {
        return Some(std::time::Duration::new(
            ts.tv_sec as u64,
            ts.tv_nsec as u32,
        ));
    }
    cpu_time_ticks(pid)
}

/// `utime + stime` of `/proc/<pid>/stat`, in whole clock ticks (`sysconf(_SC_CLK_TCK)`, 10 ms on
/// Linux). `None` when the process is gone.
pub fn cpu_time_ticks(pid: i32) -> Option<std::time::Duration> {
    let (user, system) = cpu_split(pid)?;
    Some(user + system)
}

/// `(utime, stime)` of `/proc/<pid>/stat`: the CPU `pid` spent in user space and in the kernel
/// on its behalf (syscalls, page faults), each in whole clock ticks. `None` when the process is
/// gone.
pub fn cpu_split(pid: i32) -> Option<(std::time::Duration, std::time::Duration)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // After the comm: state is field 3, so utime (14) and stime (15) are the 12th and 13th here.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&h| h > 0)
        .unwrap_or(100);
    let ticks = |t: u64| std::time::Duration::from_nanos(t * 1_000_000_000 / hz);
    Some((ticks(utime), ticks(stime)))
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

/// [`describe`] of each of `pids`, in order.
pub fn describe_all(pids: &[i32]) -> Vec<String> {
    pids.iter().map(|&p| describe(p)).collect()
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
    fn own_cpu_time_grows_with_work_and_agrees_with_the_ticks() {
        let me = std::process::id() as i32;
        let before = cpu_time(me).unwrap();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Busy until the tick figure moves, however loaded the machine is.
        let ticks_before = cpu_time_ticks(me).unwrap();
        while cpu_time_ticks(me).unwrap() == ticks_before && started.elapsed().as_secs() < 20 {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let ticks_a = cpu_time_ticks(me).unwrap();
        let fine = cpu_time(me).unwrap();
        let ticks_b = cpu_time_ticks(me).unwrap();
        assert!(fine > before && ticks_a > ticks_before, "{x}");
        // The same quantity, utime and stime each rounded down to ticks: a tick figure read
        // before the fine one is not above it, one read after is less than two ticks below it.
        let tick = std::time::Duration::from_millis(10);
        assert!(
            ticks_a <= fine && fine < ticks_b + 2 * tick,
            "{ticks_a:?} {fine:?} {ticks_b:?}"
        );
    }

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
        assert!(peak_rss_kib(cpid).is_some_and(|k| k > 0));
        assert!(cpu_time(cpid).is_some());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_alive(cpid));
        assert_eq!(peak_rss_kib(cpid), None);
        assert!(!descendants(me).contains(&cpid));
    }
}
