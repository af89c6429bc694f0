//! `buzz-agent`: the production binary — the tokio driver over `buzz-agent-core`
//! (docs/architecture.md, "The runtimes"). The loop and everything that does not depend on
//! the runtime are in `buzz-agent-runtime`; this file is its [`Runtime`] for tokio: a
//! current-thread runtime, its timers, `tokio::process` children, `tokio::net` sockets and `tokio::signal`. It also carries the `demo`, `example-server` and
//! `hooks check` subcommands (the `buzz-agent-extras` crate, its default `extras` feature).

use buzz_agent_core::Input;
use buzz_agent_runtime::{
    InputSender, Program, ReadPipe, Runtime, Socket, SpawnedChild, WritePipe,
};
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{} ERROR cannot start the tokio runtime: {e}", PROGRAM.name);
            std::process::exit(1);
        }
    };
    // The loop is a task like the others, not the future `block_on` polls itself: a task
    // waking it (an input sent) then only queues it, and the scheduler runs it next. As the
    // future of `block_on`, every such wake-up made the scheduler poll the IO driver once more
    // without waiting (an `epoll_wait` with a zero timeout) before polling the loop again: two
    // per tool round.
    let code = rt.block_on(async {
        let main = tokio::spawn(buzz_agent_runtime::drive(Tokio, config, &PROGRAM));
        match main.await {
            Ok(code) => code,
            // A panic in the loop ends the process as it did from `block_on` itself.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    });
    // Blocked stdin or LLM threads must not keep the process alive (SPEC P1).
    std::process::exit(code);
}

/// The tokio [`Runtime`]: tasks on the current-thread runtime that `main` blocks on.
struct Tokio;

buzz_agent_runtime::pipe_newtype!(
    /// A tokio pipe as the driver's [`ReadPipe`] / [`WritePipe`].
    Pipe: AsyncRead, AsyncWrite
);

/// A tokio TCP stream as the driver's [`Socket`].
struct Tcp(tokio::net::TcpStream);

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

impl Runtime for Tokio {
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        tokio::spawn(task);
    }

    fn sleep_until(deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        tokio::time::sleep_until(deadline.into())
    }

    type Timer = Pin<Box<tokio::time::Sleep>>;

    fn timer(deadline: Instant) -> Self::Timer {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }

    fn reset_timer(timer: &mut Self::Timer, deadline: Instant) {
        timer.as_mut().reset(deadline.into());
    }

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
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        let mut child = cmd.spawn()?;
        let pipe = || io::Error::other("a piped stream is missing");
        let stdin = child.stdin.take().ok_or_else(pipe)?;
        Ok(SpawnedChild {
            stdin_fd: stdin.as_fd().try_clone_to_owned().ok(),
            pid: child.id().unwrap_or(0),
            stdin: Pipe(stdin),
            stdout: Pipe(child.stdout.take().ok_or_else(pipe)?),
            stderr: Pipe(child.stderr.take().ok_or_else(pipe)?),
            exit: async move { child.wait().await },
        })
    }

    type Tcp = Tcp;

    async fn connect(host: String, port: u16) -> io::Result<Tcp> {
        // A host name is resolved on tokio's blocking pool, an address literal at once.
        let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        stream.set_nodelay(true)?;
        Ok(Tcp(stream))
    }

    fn watch_shutdown_signals(&self, tx: InputSender) -> io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        for kind in [
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::hangup(),
        ] {
            let mut sig = signal(kind)?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while sig.recv().await.is_some() {
                    if tx.send(Input::ShutdownSignal).await.is_err() {
                        return;
                    }
                }
            });
        }
        Ok(())
    }
}
