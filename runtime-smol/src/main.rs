//! `buzz-agent-smol`: the minimal binary — a thin smol driver over `buzz-agent-core`
//! (DESIGN.md "Runtimes are thin drivers"). One loop owns the [`Agent`]; IO tasks report
//! [`Input`]s over one channel; executing an action never waits for its result.
//!
//! Everything runs on one [`LocalExecutor`] on the main thread (like tokio's current-thread
//! runtime in `buzz-agent`). Blocking work lives elsewhere: stdin and stdout go through
//! [`Unblock`] (the `blocking` thread pool), LLM calls run `ureq` on their own threads
//! (`http.rs`, shared with the tokio driver), and children are reaped by
//! [`smol::process::driver`] running on the same executor.

#[path = "../../runtime-tokio/src/cli.rs"]
mod cli;
#[path = "../../runtime-tokio/src/demo.rs"]
mod demo;
#[path = "../../runtime-tokio/src/examples.rs"]
mod examples;
#[path = "../../runtime-tokio/src/hooks_check.rs"]
mod hooks_check;
#[path = "../../runtime-tokio/src/http.rs"]
mod http;
mod proc;

use buzz_agent_core::{Action, Agent, Input, MonoTime};
use smol::channel::Sender;
use smol::io::{AsyncReadExt, AsyncWriteExt};
use smol::stream::StreamExt;
use smol::{LocalExecutor, Timer, Unblock};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Ring buffer of each stdio [`Unblock`] (and the stdin read buffer), in bytes. The ring is
/// touched page by page as data flows through it, so all of it ends up resident: its default
/// (8 MiB) would add up to 8 MiB per stream over a long session. Longer lines simply take more
/// than one pass.
const STDIO_BUF: usize = 16 * 1024;
/// How long the final flush of stdout may take before the process exits anyway.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = cli::handle_args(&args) {
        std::process::exit(code);
    }
    let config = match cli::load_config() {
        Ok(c) => c,
        Err(code) => std::process::exit(code),
    };
    one_malloc_arena();
    let ex = LocalExecutor::new();
    let code = smol::block_on(ex.run(run(&ex, config)));
    // Blocked stdin or LLM threads must not keep the process alive (SPEC P1).
    std::process::exit(code);
}

/// glibc gives each thread that allocates its own arena (up to 8 per core), and every arena
/// keeps its touched pages: with an LLM thread per call that is ~0.4 MiB of peak RSS over a long
/// session for no gain at this allocation rate. One arena suffices for the minimal binary. Must
/// run before any thread starts; elsewhere than glibc this does nothing.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The driver loop: returns the exit code the core asked for once it is finished.
async fn run(ex: &LocalExecutor<'_>, config: buzz_agent_core::Config) -> i32 {
    let epoch = Instant::now();
    let now = || MonoTime(epoch.elapsed());
    let log_format = config.log_format;
    let http = http::agent(config.llm_timeout_ms);
    let mut agent = Agent::new(config, now())
        .with_inherited_env(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
        .with_version(env!("CARGO_PKG_VERSION"));
    let (tx, rx) = smol::channel::unbounded::<Input>();

    // Reap children on this executor instead of async-process's own background thread.
    ex.spawn(smol::process::driver()).detach();

    // stdin → AcpBytes / AcpEof
    {
        let tx = tx.clone();
        ex.spawn(async move {
            let mut stdin = Unblock::with_capacity(STDIO_BUF, std::io::stdin());
            let mut buf = vec![0u8; STDIO_BUF];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.try_send(Input::AcpEof);
                        return;
                    }
                    Ok(n) => {
                        if tx.try_send(Input::AcpBytes(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .detach();
    }
    // stdout writer: one task, lines in order; a failed write is reported once.
    let (out_tx, out_rx) = smol::channel::unbounded::<String>();
    let writer = {
        let tx = tx.clone();
        ex.spawn(async move {
            let mut stdout = Unblock::with_capacity(STDIO_BUF, std::io::stdout());
            let mut failed = false;
            while let Ok(line) = out_rx.recv().await {
                if failed {
                    continue;
                }
                let ok =
                    stdout.write_all(line.as_bytes()).await.is_ok() && stdout.flush().await.is_ok();
                if !ok {
                    failed = true;
                    let _ = tx.try_send(Input::AcpWriteFailed);
                }
            }
        })
    };
    // SIGTERM / SIGINT / SIGHUP → ShutdownSignal
    spawn_signals(ex, &tx);

    let mut children = proc::Children::default();
    let mut llm: BTreeMap<u64, Arc<AtomicBool>> = BTreeMap::new();
    let mut exit_code = 0;
    loop {
        while let Some(action) = agent.poll_action() {
            match action {
                Action::WriteAcp(line) => {
                    let _ = out_tx.try_send(line);
                }
                Action::WriteMcp { proc, line } => children.write(proc, line),
                Action::SpawnMcp { proc, spec } => children.spawn(ex, proc, spec, &tx),
                Action::CloseMcpStdin { proc } => children.close_stdin(proc),
                Action::SignalProcessGroup { proc, signal } => children.signal(proc, signal),
                Action::CallLlm { call, request } => {
                    let tx = tx.clone();
                    let flag = http::start(&http, call, request, move |input| {
                        tx.try_send(input).is_ok()
                    });
                    llm.insert(call.0, flag);
                }
                Action::CancelLlm { call } => {
                    if let Some(flag) = llm.remove(&call.0) {
                        flag.store(true, Ordering::Relaxed);
                    }
                }
                Action::Log(record) => {
                    use std::io::Write;
                    let _ = std::io::stderr().write_all(record.render(log_format).as_bytes());
                }
                Action::Exit { code } => exit_code = code,
            }
        }
        if agent.is_finished() {
            break;
        }
        let wake = agent.poll_timeout().map(|(t, _)| epoch + t.0);
        // `or` polls its first future first: a due deadline wins over a flood of inputs (which
        // could otherwise starve it), and cannot starve them in turn, since after
        // `handle_timeout(t)` the next deadline is later than t (invariant I11).
        let event = smol::future::or(
            async {
                sleep_until(wake).await;
                Event::Timeout
            },
            async { Event::Input(rx.recv().await.ok()) },
        )
        .await;
        match event {
            Event::Input(Some(input)) => agent.handle(input, now()),
            Event::Input(None) => break,
            Event::Timeout => agent.handle_timeout(now()),
        }
    }
    out_tx.close();
    smol::future::or(writer, async {
        Timer::after(FINAL_FLUSH).await;
    })
    .await;
    exit_code
}

/// What woke the loop.
enum Event {
    /// An input (`None`: every sender is gone, which cannot happen while the loop holds one).
    Input(Option<Input>),
    /// The core's `poll_timeout` instant passed.
    Timeout,
}

/// Report SIGTERM, SIGINT and SIGHUP as [`Input::ShutdownSignal`] (SPEC P1; SIGHUP for case C33),
/// each time one arrives.
fn spawn_signals(ex: &LocalExecutor<'_>, tx: &Sender<Input>) {
    use async_signal::{Signal, Signals};
    match Signals::new([Signal::Term, Signal::Int, Signal::Hup]) {
        Ok(mut signals) => {
            let tx = tx.clone();
            ex.spawn(async move {
                while let Some(sig) = signals.next().await {
                    if sig.is_ok() && tx.try_send(Input::ShutdownSignal).is_err() {
                        return;
                    }
                }
            })
            .detach();
        }
        Err(e) => eprintln!("buzz-agent ERROR cannot watch SIGTERM/SIGINT/SIGHUP: {e}"),
    }
}

/// Sleep until `wake`, or forever when the core has no deadline.
async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(t) => {
            Timer::at(t).await;
        }
        None => smol::future::pending::<()>().await,
    }
}
