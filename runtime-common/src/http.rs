//! LLM HTTP with `ureq` on long-lived worker threads, streaming each body back as inputs
//! (DESIGN: "HTTP goes through ureq on a blocking thread that streams body chunks back as
//! inputs"). Idle timeouts, retries and parsing live in the core; this only moves bytes.
//!
//! **Workers.** A worker is a thread with its own `ureq::Agent` (its own connection pool) that
//! runs one call at a time and then waits for the next. A call goes to the worker that went
//! idle last, so one session's rounds run on one thread over one kept-alive connection; a
//! second worker starts only when calls overlap (several sessions, or a cancelled call still
//! winding down). A worker idle for [`WORKER_IDLE`] exits. Before, every call started a thread
//! and connection reuse was a race between the previous call's thread returning its connection
//! and the next call looking for one (issue #15: 9–135 connections for one session).
//!
//! **Cancellation** (SPEC A4; L5 idle timeouts cancel the attempt too). [`LlmCall::cancel`]
//! sets the call's flag; the worker then stops reporting and reads the rest of the body only
//! while it is short ([`DRAIN_CAP`]), so a call the core dropped after the stream's own
//! terminator (case C24 b) still ends cleanly and its connection is kept. If the worker is
//! still on the call [`CANCEL_GRACE`] later (a stalled or still-streaming body), the driver
//! calls [`LlmCall::abort`]: the worker's connections are shut down, which interrupts its
//! blocked read at once, and the worker is retired (it exits after the call; new calls go to
//! other workers). A connection is put back for reuse only when its body was read to the end
//! (ureq closes it otherwise), so a call cancelled mid-stream never leaves a half-read
//! connection behind.
//!
//! Memory: the response head must fit ureq's input buffer (`HTTP_INPUT_BUF`, 32 KiB; a longer
//! head is an error), and the body is read in `READ_CHUNK` (16 KiB) pieces that go to the loop
//! as they arrive (no `read_to_end`, no line splitting here), through the loop's bounded input
//! channel: an endless body or an endless SSE line costs a worker one chunk, and the queue at
//! most its capacity. Lines are the core's business (its SSE decoder caps them).

use crate::runtime::InputSender;
use buzz_agent_core::HttpRequest;
use buzz_agent_core::{Input, LlmCallId, LlmEvent};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Read buffer size per body read, in bytes (one buffer per worker, reused).
const READ_CHUNK: usize = 16 * 1024;
/// How long an idle worker waits for its next call before it exits, with its connection.
pub const WORKER_IDLE: Duration = Duration::from_secs(60);
/// Body bytes a worker still reads after its call was cancelled, to end the body cleanly and
/// keep the connection (the rest of a finished stream is a few bytes); past this it closes it.
pub const DRAIN_CAP: usize = 16 * 1024;
/// How long after [`LlmCall::cancel`] a worker still on the call is aborted (its connection
/// shut down). Long enough for the end of a finished stream to arrive, short enough that a
/// dropped stream is not kept open (SPEC A4).
pub const CANCEL_GRACE: Duration = Duration::from_millis(100);

/// The LLM workers of the process. Cheap to share by reference; the driver holds one.
pub struct Http {
    idle_timeout_ms: u64,
    /// Idle workers, the one that went idle last at the end.
    idle: Arc<Mutex<Vec<Arc<Worker>>>>,
    next_worker: u64,
}

/// One worker as the pool and its calls see it.
struct Worker {
    /// Sends the worker its next call.
    jobs: mpsc::Sender<Job>,
    /// A handle on the worker's `ureq::Agent` (the same pool), for [`LlmCall::abort`].
    agent: ureq::Agent,
    /// `call id + 1` of the call the worker runs, 0 when none.
    current: AtomicU64,
    /// Set by [`LlmCall::abort`]: the worker takes no more calls and exits.
    retired: AtomicBool,
}

/// One call given to a worker.
struct Job {
    call: LlmCallId,
    request: HttpRequest,
    tx: InputSender,
    cancelled: Arc<AtomicBool>,
}

/// A started call: cancel it when the core is done with it.
pub struct LlmCall {
    call: LlmCallId,
    worker: Arc<Worker>,
    cancelled: Arc<AtomicBool>,
}

impl LlmCall {
    /// The core dropped the call (`CancelLlm`): the worker stops reporting it. Returns `true`
    /// when the worker is still on it; the caller then calls [`LlmCall::abort`] after
    /// [`CANCEL_GRACE`].
    pub fn cancel(&self) -> bool {
        self.cancelled.store(true, Ordering::Relaxed);
        self.worker.current.load(Ordering::Acquire) == self.call.0 + 1
    }

    /// If the worker is still on this call: retires the worker and shuts its connections
    /// down, which ends a read blocked on a stalled body at once.
    pub fn abort(&self) {
        if self.worker.current.load(Ordering::Acquire) == self.call.0 + 1 {
            self.worker.retired.store(true, Ordering::Release);
            self.worker.agent.clone().shutdown();
        }
    }
}

impl Http {
    /// No worker yet: the first call starts one. Reads time out a little after the core's own
    /// idle timeout (`idle_timeout_ms`), so a worker never waits forever on a dead peer.
    #[must_use]
    pub fn new(idle_timeout_ms: u64) -> Http {
        Http {
            idle_timeout_ms,
            idle: Arc::new(Mutex::new(Vec::new())),
            next_worker: 0,
        }
    }

    /// Starts `request` on an idle worker, or on a new one; its events go to `tx` (the worker
    /// blocks while the loop's input queue is full).
    ///
    /// # Errors
    /// When no worker can be started: the `Input` reporting the call as failed (retryable,
    /// SPEC L5), for the loop to handle.
    pub fn start(
        &mut self,
        call: LlmCallId,
        request: HttpRequest,
        tx: &InputSender,
    ) -> Result<LlmCall, Input> {
        let cancelled = Arc::new(AtomicBool::new(false));
        let mut job = Job {
            call,
            request,
            tx: tx.clone(),
            cancelled: cancelled.clone(),
        };
        loop {
            let Some(worker) = lock(&self.idle).pop() else {
                break;
            };
            if worker.retired.load(Ordering::Acquire) {
                continue;
            }
            // Marked busy before the worker sees the job, so a cancel right away finds it.
            worker.current.store(call.0 + 1, Ordering::Release);
            match worker.jobs.send(job) {
                Ok(()) => {
                    return Ok(LlmCall {
                        call,
                        worker,
                        cancelled,
                    });
                }
                // The worker exited (idle too long) between going idle and now.
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        match self.spawn_worker() {
            Ok(worker) => {
                worker.current.store(call.0 + 1, Ordering::Release);
                match worker.jobs.send(job) {
                    Ok(()) => Ok(LlmCall {
                        call,
                        worker,
                        cancelled,
                    }),
                    Err(_) => Err(failed(call, "the LLM worker exited at once")),
                }
            }
            Err(e) => Err(failed(call, &format!("could not start an LLM worker: {e}"))),
        }
    }

    /// Starts a worker thread with its own `ureq::Agent`.
    fn spawn_worker(&mut self) -> std::io::Result<Arc<Worker>> {
        let (jobs, rx) = mpsc::channel();
        let worker = Arc::new(Worker {
            jobs,
            agent: agent(self.idle_timeout_ms),
            current: AtomicU64::new(0),
            retired: AtomicBool::new(false),
        });
        self.next_worker += 1;
        let me = worker.clone();
        let idle = self.idle.clone();
        std::thread::Builder::new()
            .name(format!("llm-{}", self.next_worker))
            .spawn(move || run_worker(&me, &rx, &idle))?;
        Ok(worker)
    }
}

fn failed(call: LlmCallId, message: &str) -> Input {
    Input::Llm {
        call,
        event: LlmEvent::Failed(message.to_owned()),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A worker thread: runs calls until it is retired or idle for [`WORKER_IDLE`].
fn run_worker(me: &Arc<Worker>, rx: &mpsc::Receiver<Job>, idle: &Mutex<Vec<Arc<Worker>>>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let job = match rx.recv_timeout(WORKER_IDLE) {
            Ok(job) => job,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                if me.retired.load(Ordering::Acquire) {
                    return;
                }
                let mut list = lock(idle);
                if let Some(at) = list.iter().position(|w| Arc::ptr_eq(w, me)) {
                    list.remove(at);
                    return;
                }
                // Not in the list: the pool just took this worker and its job is on the way.
                continue;
            }
        };
        let agent = me.agent.clone();
        run_call(&agent, job, &mut buf);
        me.current.store(0, Ordering::Release);
        if me.retired.load(Ordering::Acquire) {
            return;
        }
        lock(idle).push(me.clone());
    }
}

/// Runs one call: sends the request, reports the head and each body read, then `End` or
/// `Failed`. Once the call is cancelled nothing more is reported; the rest of the body is read
/// only while it stays under [`DRAIN_CAP`] (dropping an unfinished body closes its connection).
fn run_call(agent: &ureq::Agent, job: Job, buf: &mut [u8]) {
    let Job {
        call,
        request,
        tx,
        cancelled,
    } = job;
    let is_cancelled = || cancelled.load(Ordering::Relaxed);
    let emit =
        |event: LlmEvent| !is_cancelled() && tx.send_blocking(Input::Llm { call, event }).is_ok();
    if is_cancelled() {
        return;
    }
    let mut req = agent.post(&request.url);
    for (k, v) in &request.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    // The body's pieces (the history is one the session's cache shares) are read straight
    // into ureq's output buffer: no copy of the whole body first.
    req = req.header("content-length", request.body.len().to_string());
    let mut pieces = Pieces {
        pieces: request.body.pieces(),
        current: &[],
    };
    let sent = req.send(ureq::SendBody::from_reader(&mut pieces));
    // The body is not needed any more: free it before the response streams (and let the
    // session's cache grow in place again).
    drop(pieces);
    drop(request);
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            emit(LlmEvent::Failed(e.to_string()));
            return;
        }
    };
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    if !emit(LlmEvent::Head { status, headers }) && !is_cancelled() {
        return; // the loop is gone
    }
    let mut reader = resp.into_body().into_reader();
    let mut drained = 0usize;
    loop {
        match reader.read(buf) {
            Ok(0) => {
                emit(LlmEvent::End);
                return;
            }
            Ok(n) => {
                if is_cancelled() {
                    drained += n;
                    if drained > DRAIN_CAP {
                        return;
                    }
                } else if !emit(LlmEvent::Body(buf[..n].to_vec())) && !is_cancelled() {
                    return; // the loop is gone
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                emit(LlmEvent::Failed(e.to_string()));
                return;
            }
        }
    }
}

/// A [`Read`] over a body's pieces, in order.
struct Pieces<'a, I> {
    pieces: I,
    current: &'a [u8],
}

impl<'a, I: Iterator<Item = &'a [u8]>> Read for Pieces<'a, I> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            if self.current.is_empty() {
                match self.pieces.next() {
                    Some(next) => self.current = next,
                    None => break,
                }
                continue;
            }
            let take = self.current.len().min(buf.len() - n);
            buf[n..n + take].copy_from_slice(&self.current[..take]);
            self.current = &self.current[take..];
            n += take;
        }
        Ok(n)
    }
}

/// ureq's input buffer per connection, in bytes. It must hold the whole response head (ureq does
/// not grow it), so it is also the response-head limit; 32 KiB is far above what LLM providers
/// send. ureq's default (128 KiB, zero-filled per connection) was the largest heap item.
const HTTP_INPUT_BUF: usize = 32 * 1024;
/// ureq's output buffer per connection (request head, then the body streamed through it): one
/// `send` per buffer. A request carries the whole history, and on a loopback or LAN link each
/// send costs a segment's delivery and a wake-up of the reader: 64 KiB instead of 16 KiB took a
/// session with an 840 KiB history from 67 to 55 ms of CPU (issue #15), for ~30 KiB more
/// resident memory.
const HTTP_OUTPUT_BUF: usize = 64 * 1024;

/// A worker's HTTP agent: status codes are data (the core classifies them), reads time out a
/// little after the core's own idle timeout so an abandoned worker never waits forever, and no
/// redirect is followed: every request carries the API key (`x-api-key`, which ureq would
/// forward to another host, or `Authorization`), so a 3xx goes back to the core, which fails
/// the attempt naming it (SPEC S2).
#[must_use]
pub fn agent(idle_timeout_ms: u64) -> ureq::Agent {
    let per_read = Duration::from_millis(idle_timeout_ms.saturating_add(5_000));
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(per_read))
        .input_buffer_size(HTTP_INPUT_BUF)
        .max_response_header_size(HTTP_INPUT_BUF)
        .output_buffer_size(HTTP_OUTPUT_BUF)
        .build()
        .into()
}
