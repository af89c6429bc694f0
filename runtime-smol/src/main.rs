//! `buzz-agent-smol`: the minimal binary — the smol driver over `buzz-agent-core`
//! (docs/architecture.md, "The runtimes"). The loop and everything that does not depend on
//! the runtime are in `buzz-agent-runtime`; this file is its [`Runtime`] for smol.
//!
//! Everything runs on one [`LocalExecutor`] (smol's executor, `async-executor`) on the main
//! thread (like tokio's current-thread runtime in `buzz-agent`), over a reactor of this binary's
//! own rather than smol's (`async-io` and `polling` re-arm registrations and timers on every
//! wait: docs/performance.md, "smol's reactor"): [`reactor`] (epoll, edge-triggered, each fd
//! registered once, timers as the wait's timeout), [`exec`] (`block_on`, parking in that wait),
//! [`io`] (a registered fd), [`timer`], [`child`] (`std::process` children, their exit on a
//! pidfd), [`net`] (non-blocking TCP connects) and [`signals`]. Blocking work lives elsewhere,
//! in the driver crate: stdin has a reader thread, the store a thread of its own. The `demo`,
//! `example-server` and `hooks check` subcommands are left out unless the `extras` feature is
//! on.

mod child;
mod exec;
mod io;
mod net;
mod reactor;
#[cfg(test)]
mod reactor_tests;
mod signals;
mod timer;

use async_executor::LocalExecutor;
use buzz_agent_runtime::{
    InputSender, Program, ReadPipe, Runtime, Socket, SpawnedChild, WritePipe,
};
use futures_lite::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use std::future::Future;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::process::ExitStatus;
use std::rc::Rc;
use std::time::Instant;
use timer::Timer;

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
    let rt = Smol { ex: ex.clone() };
    // The loop is a task like the others, not the future `block_on` polls itself: a task
    // waking it (an input sent) then only queues it on the executor, which runs it in the same
    // pass.
    let main = ex.spawn(buzz_agent_runtime::drive(rt, config, &PROGRAM));
    let code = exec::block_on(ex.run(main));
    // Blocked stdin or LLM threads must not keep the process alive (SPEC P1).
    std::process::exit(code);
}

/// The smol [`Runtime`]: tasks on the main thread's [`LocalExecutor`].
struct Smol {
    ex: Rc<LocalExecutor<'static>>,
}

buzz_agent_runtime::pipe_newtype!(
    /// A registered pipe (futures-io) as the driver's [`ReadPipe`] / [`WritePipe`].
    Pipe: AsyncRead, AsyncWrite
);

/// A registered TCP stream as the driver's [`Socket`].
struct Tcp(io::Async<TcpStream>);

impl Socket for Tcp {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = std::io::Result<usize>> + Send + 'a {
        self.0.read(buf)
    }

    fn write_vectored<'a>(
        &'a mut self,
        bufs: &'a [std::io::IoSlice<'a>],
    ) -> impl Future<Output = std::io::Result<usize>> + Send + 'a {
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

    type Timer = Timer;

    fn timer(deadline: Instant) -> Timer {
        Timer::at(deadline)
    }

    fn reset_timer(timer: &mut Timer, deadline: Instant) {
        timer.set_at(deadline);
    }

    /// The command's settings (its process group among them) are kept: `std::process` spawns
    /// it ([`child::spawn`]).
    fn spawn_child(
        &self,
        cmd: std::process::Command,
    ) -> std::io::Result<
        SpawnedChild<
            impl WritePipe,
            impl ReadPipe,
            impl ReadPipe,
            impl Future<Output = std::io::Result<ExitStatus>> + Send + 'static,
        >,
    > {
        let child = child::spawn(cmd)?;
        Ok(SpawnedChild {
            stdin_fd: child.stdin.get_ref().as_fd().try_clone_to_owned().ok(),
            pid: child.pid,
            stdin: Pipe(child.stdin),
            stdout: Pipe(child.stdout),
            stderr: Pipe(child.stderr),
            exit: child.exit.wait(),
        })
    }

    type Tcp = Tcp;

    async fn connect(host: String, port: u16) -> std::io::Result<Tcp> {
        net::connect(host, port).await.map(Tcp)
    }

    fn watch_shutdown_signals(&self, tx: InputSender) -> std::io::Result<()> {
        self.spawn(signals::watch(tx)?);
        Ok(())
    }
}
