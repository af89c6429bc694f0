//! MCP child processes (SPEC M1, M7, M8, case C34): spawned in their own process group with all
//! three streams piped, stdout streamed as bytes, stderr as capped lines, the exit reported after
//! reaping. The driver alone keeps `ProcKey → child`; the core never sees a pid.
//!
//! A line for a child's stdin is written on the loop thread when the pipe has room (one
//! non-blocking write, no task hop), else handed to the child's writer task, which waits for
//! room; lines stay in order either way. At most [`MAX_MCP_STDIN_QUEUE_BYTES`] wait for the
//! task (SPEC S5): the line that would go over is dropped, as is every later one, and the core
//! hears `McpStdinFull` once, so a server that stops reading its stdin cannot grow the agent.
//!
//! Every reader holds a fixed amount whatever the child writes (case C52): stdout goes to the
//! core in chunks (its codec caps lines), stderr through the core's [`StderrLines`] splitter,
//! which cuts a line at the cap and skips the rest of it without storing it.
//!
//! Descendants (SPEC S7). The agent is a child subreaper ([`crate::sys::child_subreaper`]), so
//! a process whose parent exits becomes the agent's child instead of init's. A process group
//! is signalled (`killpg`) only while its leader is not reaped: once the runtime reaped it,
//! the group's id is a free pid that another process may take, so the group is not signalled
//! again; its members left behind (the agent's descendants now) are signalled one by one.
//! Processes of a server's tree that left its group (`setsid`, `setpgid`) are noted, with
//! their start time, whenever the server's stdin is closed or its group signalled, and
//! signalled with the group. At exit [`Children::stop_descendants`] stops every process still
//! below the agent: SIGTERM, SIGKILL after [`DESCENDANT_GRACE`]. Exited processes that no one
//! else waits for (orphans re-parented to the agent) are reaped by pid, never with
//! `waitpid(-1)`: the runtimes wait for the servers they spawned by pid too (a pidfd, then
//! `waitpid(pid)`), and their statuses stay theirs. Each signal sent is logged at debug level
//! with the group or pid it went to.

use crate::runtime::{InputSender, ReadPipe, Runtime, WritePipe};
use crate::sys::{
    exit_description, nowait_unsupported, reap, signal_group, signal_name, signal_process,
    write_nowait,
};
use crate::tree;
use crate::util::race;
use buzz_agent_core::io::{MAX_MCP_STDIN_QUEUE_BYTES, StderrLines};
use buzz_agent_core::{Input, ProcKey, Signal, SpawnSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Bytes per read of a child's stdout (one buffer per child for its whole life; a full pipe
/// takes a few reads).
const STDOUT_BUF: usize = 16 * 1024;
/// Bytes per read of a child's stderr.
const STDERR_BUF: usize = 8 * 1024;
/// How long to wait for stderr to drain after the child exited, so the exit report carries
/// the last stderr lines (a grandchild holding stderr open must not delay it longer).
const STDERR_DRAIN: Duration = Duration::from_millis(300);
/// How long the processes still below the agent at exit have between SIGTERM and SIGKILL (a
/// server group's grace, SPEC M8).
pub const DESCENDANT_GRACE: Duration = Duration::from_secs(2);
/// How long after the SIGKILL at exit the agent waits to reap what it killed.
const REAP_AFTER_KILL: Duration = Duration::from_millis(200);
/// How often the loop reaps orphans that exited (each one a zombie until then).
const REAP_EVERY: Duration = Duration::from_secs(2);
/// How often [`Children::stop_descendants`] looks again.
const SWEEP_POLL: Duration = Duration::from_millis(20);

/// One live child as the driver sees it.
struct Child {
    /// `Some(line)` writes, `None` closes stdin; `None` here once closing was asked.
    stdin: Option<async_channel::Sender<Option<Vec<u8>>>>,
    /// A duplicate of the stdin pipe's write end, for writes on the loop thread that never
    /// block ([`write_nowait`]); `None` once the pipe takes no such writes or stdin is closing.
    direct: Option<OwnedFd>,
    /// Bytes handed to the writer task and not written yet. A line is written directly only
    /// when this is 0, so lines reach the child in order.
    queued: Arc<AtomicUsize>,
    /// The queue went over [`MAX_MCP_STDIN_QUEUE_BYTES`]: nothing more is written or queued.
    full: bool,
    /// Process group id (= the leader's pid, `process_group(0)`).
    pgid: i32,
    /// Set by the exit task as soon as the runtime reaped the leader: from then on the group
    /// is never signalled (its id may be another process's).
    reaped: Arc<AtomicBool>,
    /// Processes of the server's tree seen outside its group, by `(pid, start time)`.
    strays: BTreeSet<(i32, u64)>,
}

/// The live children, by process key, and what the agent knows of its other descendants.
#[derive(Default)]
pub struct Children {
    map: BTreeMap<ProcKey, Child>,
    /// The leaders the runtime still waits for (pid, reaped), whatever became of their entry
    /// in `map`: never reaped here.
    waited: Vec<(i32, Arc<AtomicBool>)>,
    /// When orphans were last reaped.
    reaped_at: Option<Instant>,
    /// Debug lines for the loop to log: each signal sent, each group not signalled.
    notes: Vec<String>,
}

impl Children {
    /// Spawns per `SpawnMcp` and starts one task per pipe and one that waits for the exit, all
    /// reporting to `tx`. Returns the input that answers the spawn, `McpSpawned` or
    /// `McpSpawnFailed`, for the loop to handle before anything the tasks report.
    pub fn spawn<R: Runtime>(
        &mut self,
        rt: &R,
        proc: ProcKey,
        spec: SpawnSpec,
        tx: &InputSender,
    ) -> Input {
        let mut cmd = std::process::Command::new(&spec.command);
        cmd.args(&spec.args)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&spec.cwd)
            .process_group(0);
        let child = match rt.spawn_child(cmd) {
            Ok(c) => c,
            Err(e) => {
                return Input::McpSpawnFailed {
                    proc,
                    error: e.to_string(),
                };
            }
        };
        let (in_tx, in_rx) = async_channel::unbounded::<Option<Vec<u8>>>();
        let queued = Arc::new(AtomicUsize::new(0));
        rt.spawn(write_stdin(
            child.stdin,
            in_rx,
            queued.clone(),
            proc,
            tx.clone(),
        ));
        rt.spawn(read_stdout(child.stdout, proc, tx.clone()));
        // Closed (its only sender dropped) when the stderr task ends: the "drained" signal.
        let (err_done_tx, err_done_rx) = async_channel::bounded::<()>(1);
        {
            let tx = tx.clone();
            let stderr = child.stderr;
            rt.spawn(async move {
                let _done = err_done_tx;
                read_stderr(stderr, proc, tx).await;
            });
        }
        let reaped = Arc::new(AtomicBool::new(false));
        {
            let tx = tx.clone();
            let exit = child.exit;
            let reaped = reaped.clone();
            rt.spawn(async move {
                let status = exit.await;
                // On the loop thread, in the poll that reaped it (tokio, and the smol binary
                // with a pidfd; its fallback, a thread blocked in `waitpid`, leaves a moment
                // between): no signal of the loop goes in between.
                reaped.store(true, Ordering::Release);
                let status = match status {
                    Ok(s) => exit_description(s),
                    Err(e) => format!("wait failed: {e}"),
                };
                let drained = async {
                    let _ = err_done_rx.recv().await;
                };
                race(drained, R::sleep_until(Instant::now() + STDERR_DRAIN)).await;
                let _ = tx.send(Input::McpExited { proc, status }).await;
            });
        }
        let pgid = i32::try_from(child.pid).unwrap_or(0);
        self.waited.push((pgid, reaped.clone()));
        self.map.insert(
            proc,
            Child {
                stdin: Some(in_tx),
                direct: child.stdin_fd,
                queued,
                full: false,
                pgid,
                reaped,
                strays: BTreeSet::new(),
            },
        );
        Input::McpSpawned { proc }
    }

    /// Writes one line to the child's stdin: at once on this thread when the pipe has room
    /// and nothing is queued before it; else (what is left of it) through the writer task.
    /// A failed direct write leaves the line to the task, which reports the failure.
    /// Returns `McpStdinFull`, once per child, for the loop to handle next when the line
    /// would take a non-empty queue over [`MAX_MCP_STDIN_QUEUE_BYTES`]; the line is dropped.
    pub fn write(&mut self, proc: ProcKey, line: String) -> Option<Input> {
        let c = self.map.get_mut(&proc)?;
        if c.full {
            return None;
        }
        let tx = c.stdin.as_ref()?;
        let mut done = 0;
        if let Some(fd) = &c.direct
            && c.queued.load(Ordering::Acquire) == 0
        {
            while done < line.len() {
                match write_nowait(fd.as_fd(), &line.as_bytes()[done..]) {
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        if nowait_unsupported(&e) {
                            c.direct = None;
                        }
                        break;
                    }
                }
            }
        }
        if done == line.len() {
            return None;
        }
        let left = line.len() - done;
        let queued = c.queued.load(Ordering::Acquire);
        // One line of any size may wait alone (the agent made it; a server that reads takes it).
        if queued > 0 && queued + left > MAX_MCP_STDIN_QUEUE_BYTES {
            c.full = true;
            return Some(Input::McpStdinFull { proc });
        }
        let mut rest = line.into_bytes();
        rest.drain(..done);
        c.queued.fetch_add(left, Ordering::AcqRel);
        if tx.try_send(Some(rest)).is_err() {
            c.queued.fetch_sub(left, Ordering::AcqRel);
        }
        None
    }

    /// Closes the child's stdin once the lines queued before are written (the processes of
    /// its tree outside its group are noted first: it may exit at end of file, and they are
    /// then no longer below it).
    pub fn close_stdin(&mut self, proc: ProcKey) {
        if let Some(c) = self.map.get_mut(&proc) {
            c.note_strays();
            // Both write ends must close for the child to see end of file.
            c.direct = None;
            if let Some(tx) = c.stdin.take() {
                let _ = tx.try_send(None);
            }
        }
    }

    /// Signals the child's process group and the strays of its tree (SPEC M8, S7). While the
    /// leader is not reaped, the group with `killpg`; after that, never the group: its members
    /// still below the agent (grandchildren, re-parented to it) one by one, unless a live
    /// leader's group took the same id. After `Kill` the child is forgotten.
    pub fn signal(&mut self, proc: ProcKey, signal: Signal) {
        let Some(c) = self.map.get_mut(&proc) else {
            return;
        };
        let name = signal_name(signal);
        let mut left = Vec::new();
        if c.reaped.load(Ordering::Acquire) {
            self.notes.push(format!(
                "process group {} not signalled ({name}): its leader was reaped",
                c.pgid
            ));
            let pgid = c.pgid;
            let taken = self
                .waited
                .iter()
                .any(|(pid, r)| *pid == pgid && !r.load(Ordering::Acquire));
            let below = tree::descendants(tree::me());
            if !taken {
                left.extend(
                    below
                        .iter()
                        .filter(|p| p.pgid == pgid && !p.zombie)
                        .map(|p| p.pid),
                );
            }
            left.extend(
                below
                    .iter()
                    .filter(|p| !p.zombie && c.strays.contains(&(p.pid, p.start)))
                    .map(|p| p.pid),
            );
        } else {
            c.note_strays();
            signal_group(c.pgid, signal);
            self.notes
                .push(format!("sent {name} to process group {}", c.pgid));
            left.extend(
                c.strays
                    .iter()
                    .filter(|&&(pid, start)| {
                        tree::read(pid).is_some_and(|p| p.start == start && !p.zombie)
                    })
                    .map(|&(pid, _)| pid),
            );
        }
        left.sort_unstable();
        left.dedup();
        for pid in left {
            signal_process(pid, signal);
            self.notes.push(format!("sent {name} to process {pid}"));
        }
        if signal == Signal::Kill {
            self.map.remove(&proc);
        }
    }

    /// The debug lines of the signals sent (and not sent) since the last call.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Reaps the orphans that exited, at most once per [`REAP_EVERY`] (the loop calls this
    /// every turn).
    pub fn reap_now_and_then(&mut self, now: Instant) {
        if self.reaped_at.is_none_or(|at| now >= at + REAP_EVERY) {
            self.reaped_at = Some(now);
            self.reap_orphans();
        }
    }

    /// Reaps every exited child of the agent that the runtime does not wait for (SPEC S7: an
    /// orphan re-parented to the subreaper), by pid.
    fn reap_orphans(&mut self) {
        self.waited.retain(|(_, r)| !r.load(Ordering::Acquire));
        for pid in tree::children(tree::me()) {
            if self.waited.iter().any(|(p, _)| *p == pid) {
                continue;
            }
            if tree::read(pid).is_some_and(|p| p.zombie) {
                reap(pid);
            }
        }
    }

    /// At exit (SPEC S7): SIGTERM to every process still below the agent that is not a zombie
    /// (but those in the process groups `spared`: the browsers the agent opened for the user),
    /// SIGKILL after [`DESCENDANT_GRACE`] to those still alive, and the orphans reaped.
    /// Returns as soon as nothing is left alive.
    pub async fn stop_descendants<R: crate::runtime::Runtime>(&mut self, spared: &[i32]) {
        let alive = || -> Vec<i32> {
            tree::descendants(tree::me())
                .into_iter()
                .filter(|p| !p.zombie && !spared.contains(&p.pgid))
                .map(|p| p.pid)
                .collect()
        };
        for (signal, wait) in [
            (Signal::Term, DESCENDANT_GRACE),
            (Signal::Kill, REAP_AFTER_KILL),
        ] {
            let left = alive();
            if left.is_empty() {
                break;
            }
            let name = signal_name(signal);
            for pid in left {
                signal_process(pid, signal);
                self.notes.push(format!("sent {name} to process {pid}"));
            }
            let deadline = Instant::now() + wait;
            loop {
                self.reap_orphans();
                if alive().is_empty() || Instant::now() >= deadline {
                    break;
                }
                R::sleep_until(Instant::now() + SWEEP_POLL).await;
            }
        }
        self.reap_orphans();
    }
}

impl Child {
    /// Notes the processes of the leader's tree outside its group, while the leader is not
    /// reaped (its tree is then intact).
    fn note_strays(&mut self) {
        if self.reaped.load(Ordering::Acquire) {
            return;
        }
        for p in tree::descendants(self.pgid) {
            if p.pgid != self.pgid && !p.zombie {
                self.strays.insert((p.pid, p.start));
            }
        }
    }
}

/// Writes the queued lines to the child's stdin in order; `None` (or the driver dropping the
/// queue) closes it. A failed write is reported once.
async fn write_stdin(
    mut stdin: impl WritePipe,
    lines: async_channel::Receiver<Option<Vec<u8>>>,
    queued: Arc<AtomicUsize>,
    proc: ProcKey,
    tx: InputSender,
) {
    while let Ok(Some(line)) = lines.recv().await {
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            // `queued` stays above 0: the loop writes nothing directly any more.
            let _ = tx.send(Input::McpWriteFailed { proc }).await;
            return;
        }
        queued.fetch_sub(line.len(), Ordering::AcqRel);
    }
    // Dropping `stdin` closes it.
}

/// Sends the child's stdout as `McpBytes` chunks, then `McpStdoutClosed`. Lines are the core's
/// business (its codec caps them); this holds one read buffer.
async fn read_stdout(mut stdout: impl ReadPipe, proc: ProcKey, tx: InputSender) {
    let mut buf = vec![0u8; STDOUT_BUF];
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = tx.send(Input::McpStdoutClosed { proc }).await;
                return;
            }
            Ok(n) => {
                let bytes = buf[..n].to_vec();
                if tx.send(Input::McpBytes { proc, bytes }).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Sends the child's stderr as `McpStderrLine`s, at most
/// [`buzz_agent_core::io::MAX_STDERR_LINE_BYTES`] bytes each (a cut line ends with the core's
/// cut marker). Holds one read buffer, the splitter's line (at most the cap) and the lines of
/// one read.
async fn read_stderr(mut stderr: impl ReadPipe, proc: ProcKey, tx: InputSender) {
    let mut splitter = StderrLines::default();
    let mut buf = vec![0u8; STDERR_BUF];
    let mut lines = Vec::new();
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        splitter.push(&buf[..n], &mut lines);
        for line in lines.drain(..) {
            if tx.send(Input::McpStderrLine { proc, line }).await.is_err() {
                return;
            }
        }
    }
    if let Some(line) = splitter.finish() {
        let _ = tx.send(Input::McpStderrLine { proc, line }).await;
    }
}
