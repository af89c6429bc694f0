//! Logging that never blocks the event loop (SPEC P2, case C51).
//!
//! The loop hands each rendered line to [`Log::write`], which only queues it, and calls
//! [`Log::wake`] once per turn; one writer thread does the blocking `write(2)`s to stderr, one
//! batch per wake-up (a turn that logs ten lines costs one wake-up and one write). The queue is
//! bounded by bytes ([`QUEUE_BYTES`], counting the lines the thread is writing): when stderr
//! cannot take more (a pipe nobody reads, case C51), new lines are dropped and counted, and the
//! thread writes `N log lines dropped` as soon as a write goes through again. The loop's cost
//! per line is one short mutex section; memory stays under `QUEUE_BYTES` plus one line.
//!
//! Why a thread and not non-blocking writes: `O_NONBLOCK` belongs to the open file description,
//! which the agent's stderr shares with its parent (a terminal, the client's pipe), so setting
//! it would change the parent's stderr too; and a blocked `write(2)` in a thread of its own
//! costs nothing but the thread.

use buzz_agent_core::config::{LogFormat, LogLevel};
use buzz_agent_core::{LogRecord, MonoTime};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most bytes of log lines waiting for stderr (queued, or being written by the thread). The
/// pipe itself holds 64 KiB on Linux; this absorbs bursts several times that.
pub const QUEUE_BYTES: usize = 256 * 1024;

/// The non-blocking stderr log. Cloning shares the one queue and writer thread.
#[derive(Clone)]
pub struct Log {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a line is queued or the log is closed (the thread waits on it).
    queued: Condvar,
    /// Signalled when the thread finished a write (a flush waits on it).
    written: Condvar,
    format: LogFormat,
    epoch: Instant,
}

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    /// Bytes in `queue` plus the batch the thread is writing.
    bytes: usize,
    /// Lines dropped since the last `N log lines dropped` line.
    dropped: u64,
    /// The thread is writing a batch.
    writing: bool,
    /// Set by [`Log::flush`]: the thread exits once the queue is empty.
    closing: bool,
    /// The thread waits for [`Log::wake`] (it must be woken to see new lines).
    idle: bool,
    /// The writer thread could not be started: lines go nowhere.
    no_thread: bool,
}

impl Log {
    /// Starts the writer thread. `format` is used for the `N log lines dropped` line, whose time
    /// is measured from `epoch` (the core's time zero).
    #[must_use]
    pub fn start(format: LogFormat, epoch: Instant) -> Log {
        Log::start_with(format, epoch, std::io::stderr())
    }

    /// [`Log::start`] writing to `out` instead of stderr (for tests).
    pub fn start_with(format: LogFormat, epoch: Instant, out: impl Write + Send + 'static) -> Log {
        let log = Log {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                queued: Condvar::new(),
                written: Condvar::new(),
                format,
                epoch,
            }),
        };
        let shared = log.shared.clone();
        let started = std::thread::Builder::new()
            .name("log".into())
            .stack_size(64 * 1024)
            .spawn(move || shared.run(out));
        if started.is_err() {
            log.shared.lock().no_thread = true;
        }
        log
    }

    /// Queues one rendered line (ending with `\n`) for the next [`Log::wake`]. Never blocks on
    /// stderr: when the queue is full the line is dropped and counted. A line longer than the
    /// whole queue is still taken when nothing else is waiting.
    pub fn write(&self, line: String) {
        let mut st = self.shared.lock();
        if st.no_thread || st.closing {
            return;
        }
        if st.bytes > 0 && st.bytes + line.len() > QUEUE_BYTES {
            st.dropped += 1;
            return;
        }
        st.bytes += line.len();
        st.queue.push_back(line);
    }

    /// Lets the writer thread write what was queued: wakes it if it sleeps (a busy thread
    /// takes the new lines with its next batch). Call it after a burst of [`Log::write`]s.
    pub fn wake(&self) {
        let mut st = self.shared.lock();
        if st.idle && !st.queue.is_empty() {
            st.idle = false;
            drop(st);
            self.shared.queued.notify_one();
        }
    }

    /// Lets the thread write what is queued (and a last drop count), waiting at most `limit`;
    /// afterwards [`Log::write`] drops everything. Returns `true` when all of it was written.
    pub fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = self.shared.lock();
        st.closing = true;
        self.shared.queued.notify_one();
        while !st.no_thread && (st.writing || !st.queue.is_empty() || st.dropped > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match self.shared.written.wait_timeout(st, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        !st.no_thread
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer thread: takes everything queued as one batch, writes it (blocking as long as
    /// stderr does), then reports the lines dropped meanwhile.
    fn run(&self, mut out: impl Write) {
        let mut batch = Vec::new();
        loop {
            let mut st = self.lock();
            while st.queue.is_empty() && st.dropped == 0 && !st.closing {
                st.idle = true;
                st = self.queued.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.idle = false;
            if st.queue.is_empty() && st.dropped == 0 {
                // Closing, and nothing left.
                drop(st);
                self.written.notify_all();
                return;
            }
            batch.clear();
            let mut lines = 0usize;
            while let Some(line) = st.queue.pop_front() {
                batch.extend_from_slice(line.as_bytes());
                lines += 1;
            }
            st.writing = true;
            drop(st);

            let ok = batch.is_empty() || (out.write_all(&batch).is_ok() && out.flush().is_ok());

            let mut st = self.lock();
            st.bytes = st.bytes.saturating_sub(batch.len());
            let dropped = if ok {
                std::mem::take(&mut st.dropped)
            } else {
                // Lost to a failed write: counted, reported by the next write that works.
                st.dropped += lines as u64;
                0
            };
            drop(st);
            if dropped > 0 {
                let _ = out.write_all(self.dropped_line(dropped).as_bytes());
                let _ = out.flush();
            }
            self.lock().writing = false;
            self.written.notify_all();
            if batch.capacity() > QUEUE_BYTES {
                // One large burst must not keep its buffer for the rest of the session.
                batch = Vec::new();
            }
        }
    }

    /// The `N log lines dropped` line, in the configured format.
    fn dropped_line(&self, n: u64) -> String {
        LogRecord {
            level: LogLevel::Warn,
            at: MonoTime(self.epoch.elapsed()),
            message: format!("{n} log lines dropped (stderr was not being read)"),
        }
        .render(self.format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A writer that blocks every write until the test lets it through, and records the bytes.
    struct Gate {
        open: mpsc::Receiver<()>,
        seen: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.open.recv();
            self.seen.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn gated() -> (Log, mpsc::Sender<()>, Arc<Mutex<Vec<u8>>>) {
        let (open_tx, open) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gate = Gate {
            open,
            seen: seen.clone(),
        };
        let log = Log::start_with(LogFormat::Text, Instant::now(), gate);
        (log, open_tx, seen)
    }

    #[test]
    fn a_blocked_stderr_never_blocks_the_caller_and_drops_are_counted_once_it_drains() {
        let (log, open, seen) = gated();
        let line = format!("{}\n", "l".repeat(99));
        let started = Instant::now();
        for _ in 0..10_000 {
            log.write(line.clone());
            log.wake();
        }
        // 1 MB of lines against a stderr that takes nothing: no call waited.
        assert!(started.elapsed() < Duration::from_secs(2));
        let queued = log.shared.lock().bytes;
        assert!(queued <= QUEUE_BYTES, "{queued}");
        // Stderr drains: everything queued is written, then the count of the rest.
        for _ in 0..100 {
            let _ = open.send(());
        }
        assert!(log.flush(Duration::from_secs(5)));
        let text = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        let written = text.lines().filter(|l| l.starts_with('l')).count();
        let dropped_line = text
            .lines()
            .find(|l| l.contains("log lines dropped"))
            .unwrap();
        assert!(dropped_line.contains("WARN"), "{dropped_line}");
        let n: usize = dropped_line
            .split(" log lines dropped")
            .next()
            .and_then(|h| h.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(written > 0 && n > 0, "{written} written, {n} dropped");
        assert_eq!(written + n, 10_000, "every line is written or counted");
    }

    #[test]
    fn lines_are_written_in_order_and_nothing_is_dropped_when_stderr_keeps_up() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let log = Log::start_with(LogFormat::Text, Instant::now(), Sink(seen.clone()));
        for i in 0..100 {
            log.write(format!("line {i}\n"));
            if i % 3 == 0 {
                log.wake();
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(log.flush(Duration::from_secs(5)));
        let text = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, expected);
        // After the flush the log is closed.
        log.write("late\n".into());
        assert!(!String::from_utf8_lossy(&seen.lock().unwrap()).contains("late"));
    }

    #[test]
    fn a_flush_against_a_stderr_that_stays_blocked_gives_up_at_its_limit() {
        let (log, _open, _seen) = gated();
        log.write("stuck\n".into());
        log.wake();
        let started = Instant::now();
        assert!(!log.flush(Duration::from_millis(200)));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(5));
    }
}
