//! The ACP client's stdin and stdout, without an async runtime between.
//!
//! **Stdout** (SPEC A6, P2: the loop never blocks). The lines one loop turn produces are
//! gathered and written on the loop thread with one non-blocking `write`
//! (`pwritev2(RWF_NOWAIT)`: it writes what the pipe or socket takes and never waits, without
//! setting `O_NONBLOCK`, a flag of the open file description that the agent's stdout may share
//! with its parent). What the client has not made room for goes to a writer thread, started
//! the first time it is needed, which writes it blocking; until that thread has written
//! everything, later lines queue behind it, so the order holds. When stdout cannot take a
//! non-blocking write at all (a terminal, a regular file, a kernel without `RWF_NOWAIT` for
//! pipes), every write goes through the thread. Before, every line crossed to a blocking-pool
//! thread (tokio's `stdout()`, smol's `Unblock`) and back: two thread hops per line.
//!
//! **Stdin** is read by one thread of its own, which sends each read to the loop: one hop per
//! read instead of two through a blocking pool. Reading stdin on the loop thread would need
//! `O_NONBLOCK` on it, which would change the parent's terminal or pipe too.

use crate::runtime::InputSender;
use crate::store::Backlog;
use crate::sys::{nowait_unsupported, write_nowait};
use buzz_agent_core::Input;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Bytes per read of stdin.
const STDIN_BUF: usize = 16 * 1024;

/// Starts the thread that sends stdin to the loop as `AcpBytes` chunks, then `AcpEof` (a read
/// error counts as end of file). It blocks while the loop's input queue is full.
///
/// # Errors
/// When the thread cannot be started.
pub fn read_stdin(tx: InputSender) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stdin".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; STDIN_BUF];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send_blocking(Input::AcpBytes(buf[..n].to_vec()))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
            let _ = tx.send_blocking(Input::AcpEof);
        })
        .map(|_| ())
}

/// The agent's stdout: [`AcpStdout::push`] the lines of a loop turn, then
/// [`AcpStdout::write_turn`] once.
pub struct AcpStdout {
    /// Lines of this loop turn, not written yet.
    turn: Vec<u8>,
    /// `pwritev2(RWF_NOWAIT)` works on stdout (cleared at the first sign it does not).
    nowait: bool,
    /// A write failed (EPIPE: the client is gone): later lines are discarded.
    failed: bool,
    /// The writer thread, once started.
    slow: Option<Arc<Slow>>,
    /// Reports a failed write from the writer thread.
    tx: InputSender,
    /// Counts the bytes handed to the writer thread and not written yet (a transcript being
    /// replayed waits while there are too many, SPEC A9).
    backlog: Arc<Backlog>,
}

/// The writer thread's queue.
struct Slow {
    state: Mutex<SlowState>,
    /// Signalled when bytes are queued or the queue is closed.
    queued: Condvar,
    /// Signalled when the thread has written everything queued (or gave up).
    drained: Condvar,
    /// The bytes queued and not written yet ([`AcpStdout::backlog`]).
    backlog: Arc<Backlog>,
}

#[derive(Default)]
struct SlowState {
    queue: VecDeque<Vec<u8>>,
    /// The thread is writing a batch it took from the queue.
    writing: bool,
    /// A write failed; nothing more is written.
    failed: bool,
    /// No more bytes will come: the thread exits once the queue is empty.
    closing: bool,
}

impl SlowState {
    fn is_idle(&self) -> bool {
        self.queue.is_empty() && !self.writing
    }
}

fn lock(m: &Mutex<SlowState>) -> MutexGuard<'_, SlowState> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AcpStdout {
    /// Stdout of this process; a failed write is reported on `tx` as `AcpWriteFailed` (by
    /// [`AcpStdout::write_turn`]'s result, or from the writer thread). `backlog` counts the
    /// bytes stdout did not take at once and the writer thread has not written yet.
    #[must_use]
    pub fn new(tx: InputSender, backlog: Arc<Backlog>) -> AcpStdout {
        AcpStdout {
            turn: Vec::new(),
            nowait: cfg!(target_os = "linux"),
            failed: false,
            slow: None,
            tx,
            backlog,
        }
    }

    /// Queues one complete line (ending with `\n`) for this turn's write.
    pub fn push(&mut self, line: &str) {
        if !self.failed {
            self.turn.extend_from_slice(line.as_bytes());
        }
    }

    /// Writes this turn's lines without blocking: what stdout does not take at once goes to the
    /// writer thread. Returns `Some(AcpWriteFailed)` when the write failed here (the thread
    /// reports its own failures on the input channel).
    pub fn write_turn(&mut self) -> Option<Input> {
        if self.turn.is_empty() {
            return None;
        }
        if self.failed {
            self.turn.clear();
            return None;
        }
        let mut done = 0;
        let (slow_idle, slow_failed) = self.slow.as_ref().map_or((true, false), |s| {
            let st = lock(&s.state);
            (st.is_idle(), st.failed)
        });
        if slow_failed {
            // The writer thread reported it already.
            self.failed = true;
            self.turn.clear();
            return None;
        }
        if self.nowait && slow_idle {
            while done < self.turn.len() {
                match write_nowait(stdout_fd(), &self.turn[done..]) {
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if nowait_unsupported(&e) => {
                        self.nowait = false;
                        break;
                    }
                    Err(_) => {
                        self.failed = true;
                        self.turn.clear();
                        return Some(Input::AcpWriteFailed);
                    }
                }
            }
        }
        if done == self.turn.len() {
            self.turn.clear();
            return None;
        }
        let rest = if done == 0 {
            std::mem::take(&mut self.turn)
        } else {
            let rest = self.turn[done..].to_vec();
            self.turn.clear();
            rest
        };
        self.hand_to_thread(rest)
    }

    /// Hands `bytes` to the writer thread, starting it if needed. If no thread can be started,
    /// writes them here, blocking (the loop stalls, but no line is lost or reordered).
    fn hand_to_thread(&mut self, bytes: Vec<u8>) -> Option<Input> {
        if self.slow.is_none() {
            let slow = Arc::new(Slow {
                state: Mutex::new(SlowState::default()),
                queued: Condvar::new(),
                drained: Condvar::new(),
                backlog: self.backlog.clone(),
            });
            let thread = slow.clone();
            let tx = self.tx.clone();
            let started = std::thread::Builder::new()
                .name("stdout".into())
                .stack_size(64 * 1024)
                .spawn(move || thread.run(&tx));
            match started {
                Ok(_) => self.slow = Some(slow),
                Err(_) => {
                    let mut out = acp_stdout();
                    if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                        self.failed = true;
                        return Some(Input::AcpWriteFailed);
                    }
                    return None;
                }
            }
        }
        if let Some(slow) = &self.slow {
            let mut st = lock(&slow.state);
            if st.failed {
                self.failed = true;
                return None;
            }
            self.backlog.queued(bytes.len());
            st.queue.push_back(bytes);
            drop(st);
            slow.queued.notify_one();
        }
        None
    }

    /// Waits at most `limit` for the writer thread to write what it was given; `true` when
    /// everything reached stdout. Later writes are discarded.
    pub fn finish(&mut self, limit: Duration) -> bool {
        let _ = self.write_turn();
        self.failed = true;
        let Some(slow) = &self.slow else {
            return true;
        };
        let deadline = Instant::now() + limit;
        let mut st = lock(&slow.state);
        st.closing = true;
        slow.queued.notify_one();
        while !st.is_idle() && !st.failed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match slow.drained.wait_timeout(st, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        !st.failed
    }
}

impl Slow {
    /// The writer thread: writes each queued batch, blocking as long as stdout does.
    fn run(&self, tx: &InputSender) {
        let mut out = acp_stdout();
        loop {
            let mut st = lock(&self.state);
            while st.queue.is_empty() && !st.closing {
                st = self.queued.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let Some(bytes) = st.queue.pop_front() else {
                return; // closing, and nothing left
            };
            st.writing = true;
            drop(st);
            let ok = out.write_all(&bytes).and_then(|()| out.flush()).is_ok();
            self.backlog.written(bytes.len());
            let mut st = lock(&self.state);
            st.writing = false;
            if !ok {
                st.failed = true;
                // Discarded: nothing waits for them any more.
                let dropped = st.queue.drain(..).map(|b| b.len()).sum();
                self.backlog.written(dropped);
            }
            let idle = st.is_idle();
            drop(st);
            if idle {
                self.drained.notify_all();
            }
            if !ok {
                let _ = tx.send_blocking(Input::AcpWriteFailed);
                return;
            }
        }
    }
}

/// The process's stdout, locked: the ACP channel. The only place in this crate that opens it
/// (`clippy.toml` denies `std::io::stdout` and `print!` elsewhere).
#[expect(
    clippy::disallowed_methods,
    reason = "the ACP writer is the one writer of stdout"
)]
fn acp_stdout() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

/// The process's stdout, fd 1.
fn stdout_fd() -> BorrowedFd<'static> {
    // SAFETY: fd 1 is the process's stdout for its whole life, as `std::io::stdout()` assumes
    // (nothing in the agent closes or replaces it).
    unsafe { BorrowedFd::borrow_raw(libc::STDOUT_FILENO) }
}
