//! What the driver needs from an async runtime: a small trait in the manner of quinn's
//! `Runtime` (which lets quinn run on tokio or smol). The loop, the child-process plumbing and
//! everything else in this crate are written once against it; each binary implements it for
//! its runtime in a few dozen lines (`runtime-tokio/src/main.rs`, `runtime-smol/src/main.rs`).

use buzz_agent_core::Input;
use std::future::Future;
use std::io;
use std::process::{Command, ExitStatus};
use std::time::Instant;

/// The sending side of the loop's input channel, given to every IO task and thread. Bounded
/// ([`crate::driver::INPUT_QUEUE`]): a producer that outruns the loop waits (tasks `.await`,
/// threads block), so the queue between the IO and the core never grows without bound.
pub type InputSender = async_channel::Sender<Input>;

/// A byte stream the driver reads: a child's stdout or stderr.
pub trait ReadPipe: Send + 'static {
    /// Reads up to `buf.len()` bytes; `Ok(0)` is end of file.
    ///
    /// # Errors
    /// The OS error of the read; the driver treats it like end of file.
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;
}

/// A byte stream the driver writes: a child's stdin.
pub trait WritePipe: Send + 'static {
    /// Writes all of `buf`.
    ///
    /// # Errors
    /// The OS error of the write (EPIPE: the reader is gone).
    fn write_all<'a>(
        &'a mut self,
        buf: &'a [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;

    /// Flushes what the runtime buffered.
    ///
    /// # Errors
    /// The OS error of the write.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_;
}

/// A TCP connection the driver's HTTP exchanges read and write ([`Runtime::connect`]), driven
/// by the runtime's reactor (non-blocking under the hood, no thread of its own).
pub trait Socket: Send + 'static {
    /// Reads up to `buf.len()` bytes; `Ok(0)` is end of stream. Cancel-safe: dropped before it
    /// completes, it has read nothing.
    ///
    /// # Errors
    /// The OS error of the read (a reset connection).
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;

    /// Writes from `bufs` in order, as much as one `writev` takes; the count written.
    ///
    /// # Errors
    /// The OS error of the write (a reset connection).
    fn write_vectored<'a>(
        &'a mut self,
        bufs: &'a [io::IoSlice<'a>],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;
}

/// A child process started by [`Runtime::spawn_child`]: its pid (also its process group id,
/// the command has `process_group(0)`), its three pipes and a future of its exit.
pub struct SpawnedChild<I, O, E, X> {
    /// The child's pid.
    pub pid: u32,
    /// The child's stdin.
    pub stdin: I,
    /// A duplicate of the stdin pipe's write end (`dup`), for the driver's non-blocking writes
    /// on the loop thread; `None` when it could not be made (every write then goes through
    /// `stdin`).
    pub stdin_fd: Option<std::os::fd::OwnedFd>,
    /// The child's stdout.
    pub stdout: O,
    /// The child's stderr.
    pub stderr: E,
    /// Completes when the child exited and was reaped, with its status.
    pub exit: X,
}

/// The runtime-specific half of a driver: an executor, timers, child processes with async
/// pipes and the shutdown signals. Nothing else in a driver depends on the runtime (stdin and
/// stdout are the driver's own, `crate::stdio`).
///
/// All futures are `Send` so that tokio's `spawn` takes them; both drivers still run every task
/// on the one thread that owns the loop (a current-thread runtime, a `LocalExecutor`).
pub trait Runtime: 'static {
    /// Starts `task` on the runtime's executor, detached: it runs until it completes (or the
    /// process exits).
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static);

    /// A future that completes at `deadline` (at once when it has passed).
    fn sleep_until(deadline: Instant) -> impl Future<Output = ()> + Send + 'static;

    /// A timer the loop keeps for its whole life and re-arms with [`Runtime::reset_timer`]
    /// (re-creating one per loop turn registers it anew with the reactor each time; smol's
    /// reactor is woken for every registration). Completes (any output) at its deadline;
    /// polled only while armed.
    type Timer: Future + Unpin + Send + 'static;

    /// A timer armed for `deadline`.
    fn timer(deadline: Instant) -> Self::Timer;

    /// Re-arms `timer` for `deadline`, whether or not it has fired.
    fn reset_timer(timer: &mut Self::Timer, deadline: Instant);

    /// Spawns `cmd` with stdin, stdout and stderr piped (the command's program, arguments,
    /// environment, working directory and process group are already set), never killed on
    /// drop, and reaped by the runtime.
    ///
    /// # Errors
    /// The OS error of the spawn (e.g. `ENOENT`); no process exists then.
    #[allow(clippy::type_complexity)]
    fn spawn_child(
        &self,
        cmd: Command,
    ) -> io::Result<
        SpawnedChild<
            impl WritePipe,
            impl ReadPipe,
            impl ReadPipe,
            impl Future<Output = io::Result<ExitStatus>> + Send + 'static,
        >,
    >;

    /// A TCP connection of the runtime's reactor.
    type Tcp: Socket;

    /// Opens a TCP connection to `host` (a name, resolved off the loop thread, or an IP
    /// address) and `port`, trying each address in turn, with `TCP_NODELAY` set.
    ///
    /// # Errors
    /// The OS error of the resolution or of the last connection attempt.
    fn connect(host: String, port: u16) -> impl Future<Output = io::Result<Self::Tcp>> + Send;

    /// Sends [`Input::ShutdownSignal`] on `tx` each time SIGTERM, SIGINT or SIGHUP arrives
    /// (SPEC P1; SIGHUP for case C33), from tasks on this runtime.
    ///
    /// # Errors
    /// The OS error of installing the signal handlers.
    fn watch_shutdown_signals(&self, tx: InputSender) -> io::Result<()>;
}

/// Declares `struct $name<T>(T)`, a runtime's pipe as the driver's [`ReadPipe`] (for
/// `T: $read`) and [`WritePipe`] (for `T: $write`). Runtimes name their async IO traits
/// differently (tokio's own, futures-io for smol) but the glue is the same, so it is written
/// once here; the call site must have the runtime's extension traits (`read`, `write_all`,
/// `flush`) in scope, e.g. `tokio::io::{AsyncReadExt, AsyncWriteExt}`.
///
/// ```text
/// use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
/// buzz_agent_runtime::pipe_newtype!(Pipe: AsyncRead, AsyncWrite);
/// let stdin = Pipe(child.stdin.take().unwrap());
/// ```
#[macro_export]
macro_rules! pipe_newtype {
    ($(#[$meta:meta])* $name:ident: $read:path, $write:path) => {
        $(#[$meta])*
        struct $name<T>(T);

        impl<T: $read + Unpin + Send + 'static> $crate::ReadPipe for $name<T> {
            fn read<'a>(
                &'a mut self,
                buf: &'a mut [u8],
            ) -> impl ::std::future::Future<Output = ::std::io::Result<usize>> + Send + 'a {
                self.0.read(buf)
            }
        }

        impl<T: $write + Unpin + Send + 'static> $crate::WritePipe for $name<T> {
            fn write_all<'a>(
                &'a mut self,
                buf: &'a [u8],
            ) -> impl ::std::future::Future<Output = ::std::io::Result<()>> + Send + 'a {
                self.0.write_all(buf)
            }

            fn flush(
                &mut self,
            ) -> impl ::std::future::Future<Output = ::std::io::Result<()>> + Send + '_ {
                self.0.flush()
            }
        }
    };
}
