//! The few direct system calls a driver makes: signalling a process group, wording an exit
//! status, and glibc's arena setting.

use buzz_agent_core::Signal;
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
