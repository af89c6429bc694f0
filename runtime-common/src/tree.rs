//! The agent's process tree as Linux's `/proc` shows it (SPEC S7): which processes descend from
//! a pid, their process group and whether they are zombies. Elsewhere than Linux the tree is
//! empty (no process is found, none is signalled by pid).
//!
//! A walk follows `/proc/<pid>/task/<tid>/children` (every thread's children: a child belongs
//! to the thread that forked it) and visits at most [`MAX_WALK`] processes, so a server that
//! forks without end costs the agent a bounded amount of reading.

use std::collections::BTreeSet;

/// The most processes one walk of the tree visits.
pub const MAX_WALK: usize = 4096;

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    /// Its pid.
    pub pid: i32,
    /// Its process group.
    pub pgid: i32,
    /// It exited and waits to be reaped (state `Z`, or `X` while it goes).
    pub zombie: bool,
    /// When it started, in clock ticks after boot (field 22): with the pid, names one process
    /// for good (a reused pid has a later start).
    pub start: u64,
}

/// `pid` as `/proc/<pid>/stat` shows it; `None` when it is gone (or elsewhere than Linux).
#[must_use]
pub fn read(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(pid, &text)
}

/// Parses a `/proc/<pid>/stat` line of `pid`. The command name (field 2) may hold blanks and
/// parentheses, so the fields are counted from its last `)`: state is field 3, the process
/// group 5, the start time 22.
fn parse(pid: i32, line: &str) -> Option<Proc> {
    let after = line.get(line.rfind(')')? + 1..)?;
    let fields: Vec<&str> = after.split_ascii_whitespace().collect();
    Some(Proc {
        pid,
        zombie: matches!(*fields.first()?, "Z" | "X"),
        pgid: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The pids of `pid`'s children, every thread's (none when it is gone).
#[must_use]
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        out.extend(
            list.split_ascii_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    out
}

/// Every process below `pid` (children, their children, …; zombies included), parents before
/// their children, at most [`MAX_WALK`] of them.
#[must_use]
pub fn descendants(pid: i32) -> Vec<Proc> {
    let mut seen = BTreeSet::from([pid]);
    let mut out = Vec::new();
    let mut next = 0;
    let mut parent = Some(pid);
    while let Some(p) = parent {
        for child in children(p) {
            if out.len() == MAX_WALK {
                return out;
            }
            if seen.insert(child)
                && let Some(found) = read(child)
            {
                out.push(found);
            }
        }
        parent = out.get(next).map(|d| d.pid);
        next += 1;
    }
    out
}

/// The agent's own pid.
#[must_use]
pub fn me() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn s7_a_stat_line_is_read_from_the_last_parenthesis() {
        let line = "42 (a (b) c) S 1 77 77 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9876 0 0";
        assert_eq!(
            parse(42, line),
            Some(Proc {
                pid: 42,
                pgid: 77,
                zombie: false,
                start: 9876
            })
        );
        let zombie = "7 (x) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert!(parse(7, zombie).is_some_and(|p| p.zombie));
        assert_eq!(parse(7, "7 (x) Z 1"), None, "a cut line");
    }

    #[test]
    fn s7_the_walk_finds_a_grandchild_in_another_session() {
        // sh runs `setsid sleep` in the background: the grandchild leads a group of its own.
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .expect("sh runs");
        let sh_pid = i32::try_from(sh.id()).expect("pid");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let below = loop {
            let below = descendants(sh_pid);
            if below.iter().any(|p| p.pgid != sh_pid) {
                break below;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no grandchild: {below:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(descendants(me()).iter().any(|p| p.pid == sh_pid));
        for p in &below {
            // SAFETY: kill(2) on processes this test started.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
        // SAFETY: as above.
        unsafe { libc::kill(sh_pid, libc::SIGKILL) };
        let _ = sh.wait();
    }
}
