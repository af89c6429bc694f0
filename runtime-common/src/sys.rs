//! The few direct system calls a driver makes: signalling a process group or a process,
//! reaping orphans, wording an exit status, glibc's arena setting, the process's own hardening
//! (not dumpable, child subreaper), and writes that never block.

use buzz_agent_core::Signal;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::ExitStatus;

/// Sends `signal` to the process group `pgid` (`kill(-pgid, sig)`, i.e. `killpg`), reaching
/// grandchildren (SPEC M8, case C34). Only while the group's leader is not reaped: after that
/// its pid, the group's id, may be another process's (SPEC S7). A `pgid` of 0 or 1 (unknown,
/// or init's) is never signalled. The result is ignored: `ESRCH` (the group is gone) is the
/// expected outcome after a clean exit.
pub fn signal_group(pgid: i32, signal: Signal) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        let _ = unsafe { libc::kill(-pgid, signal_number(signal)) };
    }
}

/// Sends `signal` to the one process `pid` (`kill(2)`); a `pid` of 0 or 1 is never signalled.
/// The result is ignored (`ESRCH`: it is gone).
pub fn signal_process(pid: i32, signal: Signal) {
    if pid > 1 {
        // SAFETY: kill(2) with a positive pid signals one process; no memory is involved.
        let _ = unsafe { libc::kill(pid, signal_number(signal)) };
    }
}

/// The signal's name as logs show it.
#[must_use]
pub fn signal_name(signal: Signal) -> &'static str {
    match signal {
        Signal::Term => "SIGTERM",
        Signal::Kill => "SIGKILL",
    }
}

fn signal_number(signal: Signal) -> i32 {
    match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    }
}

/// Reaps `pid` if it is an exited child of the agent (`waitpid(pid, WNOHANG)`): whether it
/// was. Only for children no one else waits for (the runtime waits for the MCP servers it
/// spawned; their statuses must stay theirs).
pub fn reap(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) on one pid, writing the status into a local.
    unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) == pid }
}

/// Makes the agent a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER, 1)`, SPEC S7): a
/// descendant whose parent exits is re-parented to the agent rather than to init, so a
/// grandchild that left its server's process group (`setsid`) is still the agent's to find
/// and stop at shutdown, and the agent reaps it. Elsewhere than Linux this does nothing.
///
/// # Errors
/// The OS error of `prctl` (never expected on Linux).
pub fn child_subreaper() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    return prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    #[cfg(not(target_os = "linux"))]
    Ok(())
}

/// `prctl(option, value)` for the options that take one integer and touch no memory.
#[cfg(target_os = "linux")]
fn prctl(option: libc::c_int, value: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only (PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER).
    if unsafe { libc::prctl(option, value, 0, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Takes the exclusive `flock(2)` lock of `file` without waiting (SPEC A9: one agent per
/// session transcript). The lock belongs to the open file: it is released when the file is
/// closed or the process dies, `kill -9` included, so it can never be left stale.
///
/// # Errors
/// `WouldBlock` when another open file (another agent) holds the lock; the OS error otherwise.
pub fn lock_exclusive(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a file descriptor this `File` owns for the whole call.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The exit status as the core words it (`exit status 3`, `killed by signal 9`).
#[must_use]
pub fn exit_description(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    buzz_agent_core::io::exit_description(status.code(), status.signal())
}

/// Makes the agent process not dumpable (`prctl(PR_SET_DUMPABLE, 0)`, SPEC S1): its
/// `/proc/<pid>/environ`, `mem`, `maps` and `fd/` are then closed to every process without
/// `CAP_SYS_PTRACE`, its MCP servers included, so the keys in the agent's environment cannot be
/// read back by a child that runs as the same user. No core dump is written either. Children
/// are dumpable again after their `execve`, as usual. Elsewhere than Linux this does nothing.
///
/// # Errors
/// The OS error of `prctl` (never expected on Linux).
pub fn not_dumpable() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    return prctl(libc::PR_SET_DUMPABLE, 0);
    #[cfg(not(target_os = "linux"))]
    Ok(())
}

/// glibc gives each thread that allocates its own arena (up to 8 per core), and every arena
/// keeps its touched pages: the stdio threads and the LLM threads each held ~0.3 MiB of their
/// own over a long session. One arena suffices at an agent's allocation rate. Must run before
/// any thread starts; elsewhere than glibc this does nothing.
pub fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// One write of `buf` to `fd` that never waits: `pwritev2(RWF_NOWAIT)` takes what the pipe or
/// socket has room for. Unlike `O_NONBLOCK`, the flag belongs to this call, not to the open
/// file description, which the agent's stdout may share with its parent.
///
/// # Errors
/// `WouldBlock` when nothing fits now; an error for which [`nowait_unsupported`] holds when
/// the file cannot be written this way (then write it blocking, elsewhere); any other error is
/// the write's own (`EPIPE`: the reader is gone).
#[cfg(target_os = "linux")]
pub fn write_nowait(fd: BorrowedFd<'_>, buf: &[u8]) -> std::io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one valid iovec over `buf`, which outlives the call, on an fd that is open for
    // the borrow; offset -1 is the current position (required for pipes and sockets).
    let n = unsafe { libc::pwritev2(fd.as_raw_fd(), &raw const iov, 1, -1, libc::RWF_NOWAIT) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// Without `RWF_NOWAIT`: always "unsupported", so every write goes the blocking way.
#[cfg(not(target_os = "linux"))]
pub fn write_nowait(fd: BorrowedFd<'_>, _buf: &[u8]) -> std::io::Result<usize> {
    let _ = fd.as_raw_fd();
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// Whether an error of [`write_nowait`] means "this file takes no non-blocking writes" rather
/// than a failed write: `EOPNOTSUPP` (terminals, regular files; pipes before Linux 5.x),
/// `ENOSYS` (no `pwritev2`), `EINVAL` (the flag is unknown), `ESPIPE`.
#[must_use]
pub fn nowait_unsupported(e: &std::io::Error) -> bool {
    #[cfg(target_os = "linux")]
    let errno = matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ESPIPE)
    );
    #[cfg(not(target_os = "linux"))]
    let errno = false;
    errno || e.kind() == std::io::ErrorKind::Unsupported
}

/// The effective user id of the agent (whose files the state directory must hold, SPEC S8).
#[must_use]
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
