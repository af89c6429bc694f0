//! The driver loop (DESIGN.md "Runtimes are thin drivers"), written once for every runtime: one
//! loop owns the [`Agent`] by value; every IO task and thread reports [`Input`]s over one
//! channel; executing an action never waits for its result.

use crate::Program;
use crate::children::Children;
use crate::http;
use crate::log::Log;
use crate::runtime::{InputSender, ReadPipe, Runtime, WritePipe};
use crate::store::{Backlog, Store};
use crate::util::{Either, race};
use buzz_agent_core::config::LogLevel;
use buzz_agent_core::{Action, Agent, Config, Input, LlmCallId, LogRecord, MonoTime};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Capacity of the loop's input channel, in inputs. A producer that finds it full waits (IO
/// tasks `.await`, the LLM threads block), so the inputs waiting for the core stay bounded
/// (each is at most one 16 KiB read or one capped stderr line: about 1 MiB in all) however fast
/// a child, the client or the provider sends.
pub const INPUT_QUEUE: usize = 64;
/// Bytes per read of stdin.
const STDIN_BUF: usize = 16 * 1024;
/// How long the final flush of stdout may take before the process exits anyway.
const FINAL_FLUSH: Duration = Duration::from_secs(2);
/// How long the last log lines may take to reach stderr before the process exits anyway (a
/// stderr nobody reads must not hold up the exit, SPEC P1).
const FINAL_LOG_FLUSH: Duration = Duration::from_millis(500);
/// How long the session transcripts' last appends may take at exit (SPEC A9).
const FINAL_STORE_FLUSH: Duration = Duration::from_secs(5);

/// Runs the agent with `config` on the runtime `rt` until the core asks to exit; returns the
/// exit status. Call it from inside the runtime (`block_on`); the caller then exits the process
/// (blocked stdin or LLM threads must not keep it alive, SPEC P1).
pub async fn drive<R: Runtime>(rt: R, config: Config, program: &Program) -> i32 {
    let epoch = Instant::now();
    let now = || MonoTime(epoch.elapsed());
    let log_format = config.log_format;
    let log = Log::start(log_format, epoch);
    let http = http::agent(config.llm_timeout_ms);
    let mut agent = Agent::new(config, now())
        .with_inherited_env(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
        .with_version(program.version);
    let (tx, rx) = async_channel::bounded::<Input>(INPUT_QUEUE);

    rt.spawn(read_stdin(rt.acp_stdin(), tx.clone()));
    let (out_tx, out_rx) = async_channel::unbounded::<String>();
    // Bytes queued for stdout and not written yet: a transcript being replayed waits for the
    // client to read (SPEC A9: a load's memory stays bounded).
    let backlog = Arc::new(Backlog::default());
    // Closed (its only sender dropped) when the writer task ends: "stdout is flushed".
    let (written_tx, written_rx) = async_channel::bounded::<()>(1);
    {
        let stdout = rt.acp_stdout();
        let tx = tx.clone();
        let backlog = backlog.clone();
        rt.spawn(async move {
            let _done = written_tx;
            write_stdout(stdout, out_rx, tx, &backlog).await;
        });
    }
    if let Err(e) = rt.watch_shutdown_signals(tx.clone()) {
        let record = LogRecord {
            level: LogLevel::Error,
            at: now(),
            message: format!("cannot watch SIGTERM/SIGINT/SIGHUP: {e}"),
        };
        log.write(record.render(log_format));
    }

    let mut children = Children::default();
    let mut store = Store::new(&agent.config().state_dir, tx.clone(), backlog.clone());
    let mut llm: BTreeMap<LlmCallId, Arc<AtomicBool>> = BTreeMap::new();
    // Inputs that executing an action produced at once (a spawn's result), handled before
    // anything from the channel so that they precede what the new tasks report.
    let mut immediate: VecDeque<Input> = VecDeque::new();
    let mut exit_code = 0;
    loop {
        while let Some(action) = agent.poll_action() {
            match action {
                Action::WriteAcp(line) => {
                    backlog.queued(line.len());
                    let _ = out_tx.try_send(line);
                }
                Action::WriteMcp { proc, line } => children.write(proc, line),
                Action::SpawnMcp { proc, spec } => {
                    immediate.push_back(children.spawn(&rt, proc, spec, &tx));
                }
                Action::CloseMcpStdin { proc } => children.close_stdin(proc),
                Action::SignalProcessGroup { proc, signal } => children.signal(proc, signal),
                Action::CallLlm { call, request } => match http::start(&http, call, request, &tx) {
                    Ok(cancel) => {
                        llm.insert(call, cancel);
                    }
                    Err(failed) => immediate.push_back(failed),
                },
                Action::CancelLlm { call } => {
                    if let Some(cancel) = llm.remove(&call) {
                        cancel.store(true, Ordering::Relaxed);
                    }
                }
                Action::Log(record) => log.write(record.render(log_format)),
                Action::Exit { code } => exit_code = code,
                transcript @ (Action::OpenTranscript { .. }
                | Action::ReadTranscript { .. }
                | Action::AppendTranscript { .. }
                | Action::TruncateTranscript { .. }
                | Action::CloseTranscript { .. }
                | Action::ListTranscripts { .. }) => {
                    if let Some(failed) = store.start(transcript) {
                        immediate.push_back(failed);
                    }
                }
            }
        }
        // One wake-up of the log writer per turn, however many lines the turn logged.
        log.wake();
        if agent.is_finished() {
            break;
        }
        if let Some(input) = immediate.pop_front() {
            agent.handle(input, now());
            continue;
        }
        let wake = agent.poll_timeout().map(|(t, _)| epoch + t.0);
        let timer = async {
            match wake {
                Some(t) => R::sleep_until(t).await,
                None => std::future::pending::<()>().await,
            }
        };
        // The timer is polled first: a due deadline wins over a flood of inputs (which could
        // otherwise starve it), and cannot starve them in turn, since after `handle_timeout(t)`
        // the next deadline is later than t (invariant I11).
        match race(timer, rx.recv()).await {
            Either::First(()) => agent.handle_timeout(now()),
            Either::Second(Ok(input)) => agent.handle(input, now()),
            // Every sender is gone, which cannot happen while the loop holds one.
            Either::Second(Err(_)) => break,
        }
    }
    // Tasks still sending (a reader mid-flood) stop instead of waiting for a loop that is gone.
    rx.close();
    out_tx.close();
    let flushed = async {
        let _ = written_rx.recv().await;
    };
    race(flushed, R::sleep_until(Instant::now() + FINAL_FLUSH)).await;
    store.finish(FINAL_STORE_FLUSH);
    log.flush(FINAL_LOG_FLUSH);
    exit_code
}

/// Sends stdin as `AcpBytes` chunks, then `AcpEof` (a read error counts as EOF).
async fn read_stdin(mut stdin: impl ReadPipe, tx: InputSender) {
    let mut buf = vec![0u8; STDIN_BUF];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = tx.send(Input::AcpEof).await;
                return;
            }
            Ok(n) => {
                if tx.send(Input::AcpBytes(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes the ACP lines to stdout in order until the queue is closed; a failed write is
/// reported once (`AcpWriteFailed`) and later lines are discarded. `backlog` counts the bytes
/// queued and not written yet.
async fn write_stdout(
    mut stdout: impl WritePipe,
    lines: async_channel::Receiver<String>,
    tx: InputSender,
    backlog: &Backlog,
) {
    let mut failed = false;
    while let Ok(line) = lines.recv().await {
        if !failed
            && (stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err())
        {
            failed = true;
            let _ = tx.send(Input::AcpWriteFailed).await;
        }
        backlog.written(line.len());
    }
}
