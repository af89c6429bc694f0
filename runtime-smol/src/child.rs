//! Child processes: `std::process` spawns them (the driver's `Command` keeps its process
//! group and the rest), their pipes are registered with the [`crate::reactor`], and the exit
//! is waited for on a pidfd, readable once the child has exited; the child is then reaped
//! (`waitpid(WNOHANG)`) in the same poll, on the loop thread.

use crate::io::Async;
use crate::reactor::Dir;
use std::io;
use std::os::fd::OwnedFd;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// A spawned child's parts.
pub struct Spawned {
    /// The child's pid.
    pub pid: u32,
    /// Its stdin (write end), non-blocking and registered.
    pub stdin: Async<ChildStdin>,
    /// Its stdout (read end).
    pub stdout: Async<ChildStdout>,
    /// Its stderr (read end).
    pub stderr: Async<ChildStderr>,
    /// A future of its exit status, reaping it.
    pub exit: Exit,
}

/// How the exit is waited for.
pub enum Exit {
    /// The child's pidfd (Linux 5.3 and later).
    PidFd(Child, Async<OwnedFd>),
    /// A thread blocked in `waitpid` (no pidfd), reporting through a channel.
    Thread(async_channel::Receiver<io::Result<ExitStatus>>),
}

impl Exit {
    /// Completes when the child exited, reaped, with its status.
    ///
    /// # Errors
    /// The OS error of `waitpid`.
    pub async fn wait(self) -> io::Result<ExitStatus> {
        match self {
            Self::PidFd(mut child, pidfd) => loop {
                pidfd.ready(Dir::Read).await;
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
            },
            Self::Thread(rx) => rx
                .recv()
                .await
                .unwrap_or_else(|_| Err(io::Error::other("the waiting thread is gone"))),
        }
    }
}

/// Spawns `cmd` with its three stdio streams piped.
///
/// # Errors
/// The OS error of the spawn, or of making a pipe non-blocking or registering it (the child
/// is then killed and reaped).
pub fn spawn(mut cmd: Command) -> io::Result<Spawned> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    match pipes(&mut child) {
        Ok((stdin, stdout, stderr)) => {
            let pid = child.id();
            Ok(Spawned {
                pid,
                stdin,
                stdout,
                stderr,
                exit: exit(child),
            })
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

type Pipes = (Async<ChildStdin>, Async<ChildStdout>, Async<ChildStderr>);

fn pipes(child: &mut Child) -> io::Result<Pipes> {
    let missing = || io::Error::other("a piped stream is missing");
    Ok((
        Async::new(child.stdin.take().ok_or_else(missing)?)?,
        Async::new(child.stdout.take().ok_or_else(missing)?)?,
        Async::new(child.stderr.take().ok_or_else(missing)?)?,
    ))
}

fn exit(mut child: Child) -> Exit {
    let pidfd = rustix::process::Pid::from_raw(child.id().cast_signed())
        .ok_or(rustix::io::Errno::SRCH)
        .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()))
        .map_err(io::Error::from)
        .and_then(Async::nonblocking);
    match pidfd {
        Ok(fd) => Exit::PidFd(child, fd),
        Err(_) => {
            let (tx, rx) = async_channel::bounded(1);
            let failed = tx.clone();
            let waiter = std::thread::Builder::new()
                .name("waitpid".into())
                .spawn(move || {
                    let _ = tx.send_blocking(child.wait());
                });
            // No thread to wait: the exit future reports why (the driver still signals the
            // child's group by pid, and orphans are reaped by pid).
            if let Err(e) = waiter {
                let _ = failed.try_send(Err(e));
            }
            Exit::Thread(rx)
        }
    }
}
