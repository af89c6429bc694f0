//! `buzz-agent-smol`: the minimal binary — the smol driver over `buzz-agent-core`
//! (docs/architecture.md, "The runtimes"). The loop and everything that does not depend on
//! the runtime are in `buzz-agent-runtime`; this file is its [`Runtime`] for smol.
//!
//! Everything runs on one [`LocalExecutor`] on the main thread (like tokio's current-thread
//! runtime in `buzz-agent`). Blocking work lives elsewhere, in the driver crate: stdin has a
//! reader thread; HTTP exchanges (LLM calls, MCP over HTTP) are tasks on the executor over
//! `smol::net` sockets; children are reaped by
//! [`smol::process::driver`] running on the same executor. The `demo`,
//! `example-server` and `hooks check` subcommands are left out unless the `extras` feature is
//! on.

use async_signal::{Signal, Signals};
use buzz_agent_core::Input;
use buzz_agent_runtime::{
    InputSender, Program, ReadPipe, Runtime, Socket, SpawnedChild, WritePipe,
};
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use smol::process::Stdio;
use smol::stream::StreamExt;
use smol::{LocalExecutor, Timer};
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Instant;

/// The minimal binary: without the `extras` feature, `demo`, `exec`, `example-server` and
/// `hooks check` (the `buzz-agent-extras` crate) are not linked in.
const PROGRAM: Program = Program {
    name: env!("CARGO_BIN_NAME"),
    version: env!("CARGO_PKG_VERSION"),
    #[cfg(feature = "extras")]
    extras: Some(buzz_agent_extras::EXTRAS),
    #[cfg(not(feature = "extras"))]
    extras: None,
};

fn main() {
    let config = match buzz_agent_runtime::start(&PROGRAM) {
        Ok(c) => c,
        Err(code) => std::process::exit(code),
    };
    let ex = Rc::new(LocalExecutor::new());
    // Reap children on this executor instead of async-process's own background thread.
    ex.spawn(smol::process::driver()).detach();
    let rt = Smol { ex: ex.clone() };
    // The loop is a task like the others, not the future `block_on` polls itself: a task
    // waking it (an input sent) then only queues it on the executor, which runs it in the same
    // pass. As the future of `block_on`, every such wake-up made `block_on` poll the reactor
    // once more without waiting (a `timerfd_settime`, two `epoll_ctl`, an `epoll_pwait` and an
    // eventfd read) before polling the loop again.
    let main = ex.spawn(buzz_agent_runtime::drive(rt, config, &PROGRAM));
    let code = smol::block_on(ex.run(main));
    // Blocked stdin or LLM threads must not keep the process alive (SPEC P1).
    std::process::exit(code);
}

/// The smol [`Runtime`]: tasks on the main thread's [`LocalExecutor`].
struct Smol {
    ex: Rc<LocalExecutor<'static>>,
}

buzz_agent_runtime::pipe_newtype!(
    /// A smol (futures-io) pipe as the driver's [`ReadPipe`] / [`WritePipe`].
    Pipe: AsyncRead, AsyncWrite
);

/// A smol (async-net) TCP stream as the driver's [`Socket`].
struct Tcp(smol::net::TcpStream);

impl Socket for Tcp {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        self.0.read(buf)
    }

    fn write_vectored<'a>(
        &'a mut self,
        bufs: &'a [io::IoSlice<'a>],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        self.0.write_vectored(bufs)
    }
}

impl Runtime for Smol {
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.ex.spawn(task).detach();
    }

    async fn sleep_until(deadline: Instant) {
        Timer::at(deadline).await;
    }

    type Timer = smol::Timer;

    fn timer(deadline: Instant) -> Timer {
        Timer::at(deadline)
    }

    fn reset_timer(timer: &mut Timer, deadline: Instant) {
        timer.set_at(deadline);
    }

    /// `smol::process` (async-process) has no `process_group`, so the command comes in as a
    /// `std::process::Command` (which has it) and is converted; async-process keeps the
    /// conversion's settings and adds its own stdio wrapping and reaping.
    fn spawn_child(
        &self,
        cmd: std::process::Command,
    ) -> io::Result<
        SpawnedChild<
            impl WritePipe,
            impl ReadPipe,
            impl ReadPipe,
            impl Future<Output = io::Result<ExitStatus>> + Send + 'static,
        >,
    > {
        let mut cmd = smol::process::Command::from(cmd);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        let mut child = cmd.spawn()?;
        let pipe = || io::Error::other("a piped stream is missing");
        let stdin = child.stdin.take().ok_or_else(pipe)?;
        Ok(SpawnedChild {
            stdin_fd: stdin.as_fd().try_clone_to_owned().ok(),
            pid: child.id(),
            stdin: Pipe(stdin),
            stdout: Pipe(child.stdout.take().ok_or_else(pipe)?),
            stderr: Pipe(child.stderr.take().ok_or_else(pipe)?),
            exit: async move { child.status().await },
        })
    }

    type Tcp = Tcp;

    async fn connect(host: String, port: u16) -> io::Result<Tcp> {
        // A host name is resolved on smol's blocking pool, an address literal at once.
        let stream = smol::net::TcpStream::connect((host.as_str(), port)).await?;
        stream.set_nodelay(true)?;
        Ok(Tcp(stream))
    }

    fn watch_shutdown_signals(&self, tx: InputSender) -> io::Result<()> {
        let mut signals = Signals::new([Signal::Term, Signal::Int, Signal::Hup])?;
        self.spawn(async move {
            while let Some(sig) = signals.next().await {
                if sig.is_ok() && tx.send(Input::ShutdownSignal).await.is_err() {
                    return;
                }
            }
        });
        Ok(())
    }
}
