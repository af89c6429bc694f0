//! `buzz-agent`: the production binary — a thin tokio driver over `buzz-agent-core`
//! (DESIGN.md "Runtimes are thin drivers"). One loop owns the [`Agent`]; IO tasks report
//! [`Input`]s over one channel; executing an action never waits for its result.

mod cli;
mod demo;
mod examples;
mod hooks_check;
mod http;
mod proc;

use buzz_agent_core::{Action, Agent, Input, MonoTime};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes per stdin read (tokio's blocking stdin copies through a buffer of the same size).
const STDIN_BUF: usize = 16 * 1024;

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
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("buzz-agent ERROR cannot start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(run(config));
    // Blocked stdin or LLM threads must not keep the process alive (SPEC P1).
    std::process::exit(code);
}

/// glibc gives each thread that allocates its own arena (up to 8 per core), and every arena
/// keeps its touched pages: the blocking pool's stdin/stdout threads and the LLM threads each
/// held ~0.3 MiB of their own over a long session. One arena suffices at this allocation rate.
/// Must run before any thread starts; elsewhere than glibc this does nothing.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

async fn run(config: buzz_agent_core::Config) -> i32 {
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
    let (tx, mut rx) = mpsc::unbounded_channel::<Input>();

    // stdin → AcpBytes / AcpEof
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; STDIN_BUF];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Input::AcpEof);
                        return;
                    }
                    Ok(n) => {
                        if tx.send(Input::AcpBytes(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    // stdout writer: one task, lines in order; a failed write is reported once.
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
    let writer = {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut stdout = tokio::io::stdout();
            let mut failed = false;
            while let Some(line) = out_rx.recv().await {
                if failed {
                    continue;
                }
                let ok =
                    stdout.write_all(line.as_bytes()).await.is_ok() && stdout.flush().await.is_ok();
                if !ok {
                    failed = true;
                    let _ = tx.send(Input::AcpWriteFailed);
                }
            }
        })
    };
    // SIGTERM / SIGINT / SIGHUP (the terminal or client went away, case C33) → ShutdownSignal
    for kind in [
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::hangup(),
    ] {
        if let Ok(mut sig) = tokio::signal::unix::signal(kind) {
            let tx = tx.clone();
            tokio::spawn(async move {
                while sig.recv().await.is_some() {
                    if tx.send(Input::ShutdownSignal).is_err() {
                        return;
                    }
                }
            });
        }
    }

    let mut children = proc::Children::default();
    let mut llm: BTreeMap<u64, Arc<AtomicBool>> = BTreeMap::new();
    let mut exit_code = 0;
    loop {
        while let Some(action) = agent.poll_action() {
            match action {
                Action::WriteAcp(line) => {
                    let _ = out_tx.send(line);
                }
                Action::WriteMcp { proc, line } => children.write(proc, line),
                Action::SpawnMcp { proc, spec } => children.spawn(proc, spec, &tx),
                Action::CloseMcpStdin { proc } => children.close_stdin(proc),
                Action::SignalProcessGroup { proc, signal } => children.signal(proc, signal),
                Action::CallLlm { call, request } => {
                    let tx = tx.clone();
                    let flag =
                        http::start(&http, call, request, move |input| tx.send(input).is_ok());
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
        tokio::select! {
            input = rx.recv() => match input {
                Some(input) => agent.handle(input, now()),
                None => break,
            },
            () = sleep_until(wake) => agent.handle_timeout(now()),
        }
    }
    drop(out_tx);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), writer).await;
    exit_code
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending::<()>().await,
    }
}
