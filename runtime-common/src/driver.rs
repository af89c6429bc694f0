//! The driver loop (docs/architecture.md, "The runtimes"), written once for every runtime: one
//! loop owns the [`Agent`] by value; every IO task and thread reports [`Input`]s over one
//! channel; executing an action never waits for its result.

use crate::Program;
use crate::children::Children;
use crate::http;
use crate::log::Log;
use crate::oauth::OAuthIo;
use crate::runtime::Runtime;
use crate::stdio::{self, AcpStdout};
use crate::store::{Backlog, Store};
use crate::util::{Either, race};
use buzz_agent_core::config::LogLevel;
use buzz_agent_core::{Action, Agent, Config, ExchangeId, Input, LlmCallId, LogRecord, MonoTime};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Capacity of the loop's input channel, in inputs. A producer that finds it full waits (IO
/// tasks `.await`, the LLM threads block), so the inputs waiting for the core stay bounded
/// (each is at most one 16 KiB read or one capped stderr line: about 1 MiB in all) however fast
/// a child, the client or the provider sends.
pub const INPUT_QUEUE: usize = 64;
/// How long the final flush of stdout may take before the process exits anyway.
const FINAL_FLUSH: Duration = Duration::from_secs(2);
/// How long the last log lines may take to reach stderr before the process exits anyway (a
/// stderr nobody reads must not hold up the exit, SPEC P1).
const FINAL_LOG_FLUSH: Duration = Duration::from_millis(500);
/// How long the session transcripts' last syncs may take at exit, before the last ACP lines
/// are written (SPEC A9).
const FINAL_STORE_FLUSH: Duration = Duration::from_secs(5);

/// Runs the agent with `config` on the runtime `rt` until the core asks to exit; returns the
/// exit status. Call it from inside the runtime (`block_on`); the caller then exits the process
/// (blocked stdin or LLM threads must not keep it alive, SPEC P1).
///
/// Wake-ups (issue #15): the ACP lines of one loop turn are written together, on the loop
/// thread, without blocking ([`AcpStdout`]); LLM calls are tasks on this executor over
/// kept-alive connections ([`http::Http`]); the loop's timer is one timer re-armed only when the core's next deadline
/// comes earlier than the armed one (a later deadline lets the armed one fire first, and the
/// loop then re-arms it: one early wake-up instead of a re-registration per turn, since the
/// LLM idle deadline moves with every streamed chunk).
pub async fn drive<R: Runtime>(rt: R, mut config: Config, program: &Program) -> i32 {
    let epoch = Instant::now();
    // The wall clock at the core's time zero (OAuth: JWT times, token expiry across runs).
    config.unix_ms_at_start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let now = || MonoTime(epoch.elapsed());
    let (tx, rx) = async_channel::bounded::<Input>(INPUT_QUEUE);
    // Stdin first: the client's `initialize` is read while the rest starts (its reply waits
    // for nothing else).
    let stdin = stdio::read_stdin(tx.clone());
    let log_format = config.log_format;
    let log = Log::start(log_format, epoch);
    let mut http = http::Http::new(format!("{}/{}", program.name, program.version));
    let mut agent = Agent::new(config, now())
        .with_inherited_env(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
        .with_version(program.version);

    let mut exit_code = 0;
    // Inputs that executing an action produced at once (a spawn's result), handled before
    // anything from the channel so that they precede what the new tasks report.
    let mut immediate: VecDeque<Input> = VecDeque::new();
    if let Err(e) = stdin {
        let record = LogRecord {
            level: LogLevel::Error,
            at: now(),
            message: format!("cannot start the stdin reader: {e}"),
        };
        log.write(record.render(log_format));
        immediate.push_back(Input::AcpEof);
    }
    // Bytes queued for stdout and not written yet: a transcript being replayed waits for the
    // client to read (SPEC A9: a load's memory stays bounded).
    let backlog = Arc::new(Backlog::default());
    let mut stdout = AcpStdout::new(tx.clone(), backlog.clone());
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
    let mut oauth = OAuthIo::new(&agent.config().state_dir, tx.clone());
    // SPEC S8: a state directory another user could write to is never used; said once here,
    // and every load, listing and new transcript fails with the same reason.
    if let Err(why) = store.check() {
        let record = LogRecord {
            level: LogLevel::Error,
            at: now(),
            message: format!(
                "{why}: sessions are not saved there or loaded from it until it belongs to this user and no one else can write to it (chmod go-w)"
            ),
        };
        log.write(record.render(log_format));
    }
    let mut llm: BTreeMap<LlmCallId, http::Exchange> = BTreeMap::new();
    let mut exchanges: BTreeMap<ExchangeId, http::Exchange> = BTreeMap::new();
    // The loop's timer and the deadline it is armed for (`None`: unarmed or fired).
    let mut timer: Option<R::Timer> = None;
    let mut armed: Option<Instant> = None;
    // The runtime's debug lines (each signal sent, SPEC S7), when the level asks for them.
    let debug = agent.config().log_level >= LogLevel::Debug;
    let log_notes = |children: &mut Children, at: MonoTime| {
        for message in children.take_notes() {
            if debug {
                let level = LogLevel::Debug;
                log.write(LogRecord { level, at, message }.render(log_format));
            }
        }
    };
    loop {
        children.reap_now_and_then(Instant::now());
        while let Some(action) = agent.poll_action() {
            match action {
                Action::WriteAcp(line) => stdout.push(&line),
                Action::WriteMcp { proc, line } => {
                    if let Some(full) = children.write(proc, line) {
                        immediate.push_back(full);
                    }
                }
                Action::SpawnMcp { proc, spec } => {
                    immediate.push_back(children.spawn(&rt, proc, spec, &tx));
                }
                Action::CloseMcpStdin { proc } => children.close_stdin(proc),
                Action::SignalProcessGroup { proc, signal } => {
                    children.signal(proc, signal);
                    log_notes(&mut children, now());
                }
                Action::CallLlm { call, request } => {
                    let report = move |event| Input::Llm { call, event };
                    match http.start(&rt, request.into(), report, &tx) {
                        Ok(handle) => {
                            llm.insert(call, handle);
                        }
                        Err(failed) => immediate.push_back(failed),
                    }
                }
                Action::CancelLlm { call } => {
                    if let Some(handle) = llm.remove(&call) {
                        handle.cancel();
                    }
                }
                read @ Action::ReadProject { .. } => {
                    if let Some(failed) = crate::project::start(read, &tx) {
                        immediate.push_back(failed);
                    }
                }
                Action::OAuth(action) => {
                    if let Some(answer) = oauth.start(action) {
                        immediate.push_back(answer);
                    }
                }
                Action::Http { exchange, request } => {
                    let report = move |event| Input::Http { exchange, event };
                    match http.start(&rt, request, report, &tx) {
                        Ok(handle) => {
                            exchanges.insert(exchange, handle);
                        }
                        Err(failed) => immediate.push_back(failed),
                    }
                }
                Action::CancelHttp { exchange } => {
                    if let Some(handle) = exchanges.remove(&exchange) {
                        handle.cancel();
                    }
                }
                Action::Log(record) => log.write(record.render(log_format)),
                Action::Exit { code } => exit_code = code,
                transcript @ (Action::OpenTranscript { .. }
                | Action::ReadTranscript { .. }
                | Action::AppendTranscript { .. }
                | Action::SyncTranscript { .. }
                | Action::TruncateTranscript { .. }
                | Action::CloseTranscript { .. }
                | Action::ListTranscripts { .. }) => {
                    if let Some(failed) = store.start(transcript) {
                        immediate.push_back(failed);
                    }
                }
            }
        }
        if agent.is_finished() {
            // The last lines (answers released at exit) are written after the store's last
            // syncs, below.
            break;
        }
        // One write of the turn's ACP lines, one wake-up of the log writer.
        if let Some(failed) = stdout.write_turn() {
            immediate.push_back(failed);
        }
        log.wake();
        if let Some(input) = immediate.pop_front() {
            agent.handle(input, now());
            continue;
        }
        let wake = agent.poll_timeout().map(|(t, _)| epoch + t.0);
        if let Some(w) = wake
            && armed.is_none_or(|a| w < a)
        {
            match &mut timer {
                Some(t) => R::reset_timer(t, w),
                None => timer = Some(R::timer(w)),
            }
            armed = Some(w);
        }
        let fired = async {
            match (&mut timer, armed) {
                (Some(t), Some(_)) => {
                    t.await;
                }
                _ => std::future::pending::<()>().await,
            }
        };
        // The timer is polled first: a due deadline wins over a flood of inputs (which could
        // otherwise starve it), and cannot starve them in turn, since after `handle_timeout(t)`
        // the next deadline is later than t (invariant I11).
        match race(fired, rx.recv()).await {
            Either::First(()) => {
                armed = None;
                // A timer armed for an earlier deadline than the core's current one fired
                // early: nothing is due yet, the next turn re-arms it.
                if wake.is_some_and(|w| Instant::now() >= w) {
                    agent.handle_timeout(now());
                }
            }
            Either::Second(Ok(input)) => agent.handle(input, now()),
            // Every sender is gone, which cannot happen while the loop holds one.
            Either::Second(Err(_)) => break,
        }
    }
    // Tasks still sending (a reader mid-flood) stop instead of waiting for a loop that is gone.
    rx.close();
    store.finish(FINAL_STORE_FLUSH);
    stdout.finish(FINAL_FLUSH);
    // SPEC S7: nothing the servers started outlives the agent (the client has its answers).
    children.stop_descendants::<R>(oauth.browser_groups()).await;
    log_notes(&mut children, now());
    log.flush(FINAL_LOG_FLUSH);
    exit_code
}
