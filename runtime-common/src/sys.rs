//! The few direct system calls a driver makes: signalling a process group, wording an exit
//! status, glibc's arena setting, the process's own hardening (not dumpable), and writes that
//! never block.

use buzz_agent_core::Signal;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::ExitStatus;

/// Sends `signal` to the process group `pgid` (`kill(-pgid, sig)`, i.e. `killpg`), reaching
/// grandchildren even after the group leader exited (SPEC M8, case C34). A `pgid` of 0 or 1
/// (unknown, or init's) is never signalled. The result is ignored: `ESRCH` (the group is gone)
/// is the expected outcome after a clean exit.
pub fn signal_group(pgid: i32, signal: Signal) {
    if pgid <= 1 {
        return;
    }
    let sig = match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    let _ = unsafe { libc::kill(-pgid, sig) };
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
    {
        // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and touches no memory of ours.
        let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
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
