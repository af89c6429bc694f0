//! The stdio transport (MCP 2025-11-25 basic/transports; SPEC M1, M7, M8, T6): a child
//! process per generation, JSON-RPC frames as lines on its stdin and stdout, its stderr kept
//! for error messages. It knows processes and lines, never the MCP session above it: it
//! carries the frames [`McpSession`](super::session::McpSession) queues and hands back the
//! lines it reads.

use crate::config::LogLevel;
use crate::ids::{ProcKey, ServerSlot};
use crate::io::{Action, Signal, SpawnSpec};
use crate::jsonrpc::{LineBuffer, LineEvent};
use crate::outbox::Outbox;
use crate::timers::{Timer, TimerTable};
use std::collections::VecDeque;

/// An MCP stdout line over this kills the server (SPEC T6), in bytes.
pub(crate) const MAX_MCP_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Stderr lines kept for error messages (SPEC M1).
const STDERR_TAIL_LINES: usize = 20;
/// Grace between SIGTERM and SIGKILL of a process group (SPEC M8), in ms.
pub(crate) const KILL_GRACE_MS: u64 = 2000;
/// How long a server whose stdout closed may take to exit before it is declared dead, in ms.
pub(crate) const STDOUT_CLOSED_GRACE_MS: u64 = 500;
/// Non-JSON-RPC stdout lines of one process logged at warn; later ones at debug (SPEC T6).
const BAD_LINES_AT_WARN: u32 = 100;

/// What became of the current generation's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Process {
    /// Not asked for yet, or the spawn failed: there is no process.
    NotSpawned,
    /// `SpawnMcp` was asked for and not answered yet: a process may be about to exist.
    Spawning,
    /// The leader runs (it may be exiting after a signal).
    Running,
    /// The leader exited and was reaped (its group may still hold grandchildren).
    Exited,
}

/// One server's child process and its pipes, generation after generation (SPEC M1, M9).
#[derive(Debug)]
pub(crate) struct StdioTransport {
    spec: SpawnSpec,
    /// The current generation's process key.
    proc: ProcKey,
    process: Process,
    buf: LineBuffer,
    stderr_tail: VecDeque<String>,
    /// Non-JSON-RPC stdout lines of this generation (SPEC T6).
    bad_lines: u32,
    /// Its stdin was closed by the agent's shutdown (SPEC P1, M8).
    shut_down: bool,
}

impl StdioTransport {
    /// The transport of the server in `slot`, generation 0, not spawned yet.
    pub(crate) fn new(slot: ServerSlot, spec: SpawnSpec) -> StdioTransport {
        StdioTransport {
            spec,
            proc: ProcKey {
                server: slot,
                generation: 0,
            },
            process: Process::NotSpawned,
            buf: LineBuffer::new(MAX_MCP_LINE_BYTES),
            stderr_tail: VecDeque::new(),
            bad_lines: 0,
            shut_down: false,
        }
    }

    /// The current generation.
    pub(crate) fn proc(&self) -> ProcKey {
        self.proc
    }

    /// How the process is started.
    pub(crate) fn spec(&self) -> &SpawnSpec {
        &self.spec
    }

    /// What became of the current generation's process.
    pub(crate) fn process(&self) -> Process {
        self.process
    }

    /// Whether the current generation's leader runs (spawned, not yet reaped).
    pub(crate) fn leader_alive(&self) -> bool {
        self.process == Process::Running
    }

    /// Whether some generation was spawned, so a process group may exist. Restarts only
    /// follow a server that served, so every generation after the first had a spawned
    /// predecessor.
    pub(crate) fn ever_spawned(&self) -> bool {
        self.proc.generation > 0 || matches!(self.process, Process::Running | Process::Exited)
    }

    /// Whether a process of the current generation runs or may be about to (a spawn not
    /// answered yet): the server cannot be forgotten yet.
    pub(crate) fn process_pending(&self) -> bool {
        matches!(self.process, Process::Running | Process::Spawning)
    }

    /// Whether its stdin was closed by the agent's shutdown.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// Asks the runtime to spawn the current generation (SPEC M1).
    pub(crate) fn spawn(&mut self, out: &mut Outbox) {
        self.process = Process::Spawning;
        let spec = &self.spec;
        out.log(
            LogLevel::Info,
            format!(
                "mcp '{}': spawning {} {:?} in {}",
                spec.name, spec.command, spec.args, spec.cwd
            ),
        );
        out.push(Action::SpawnMcp {
            proc: self.proc,
            spec: spec.clone(),
        });
    }

    /// The next generation, not spawned yet (an M9 restart): a fresh line buffer, no bad
    /// lines counted. The stderr tail is kept (it explains the deaths so far).
    pub(crate) fn next_generation(&mut self) {
        self.proc = ProcKey {
            server: self.proc.server,
            generation: self.proc.generation + 1,
        };
        self.process = Process::NotSpawned;
        self.buf = LineBuffer::new(MAX_MCP_LINE_BYTES);
        self.bad_lines = 0;
    }

    /// `Input::McpSpawned` for the current generation: the leader runs.
    pub(crate) fn spawned(&mut self) {
        self.process = Process::Running;
    }

    /// `Input::McpSpawnFailed` for the current generation: there is no process.
    pub(crate) fn spawn_failed(&mut self) {
        self.process = Process::NotSpawned;
    }

    /// `Input::McpExited` for the current generation: the leader was reaped.
    pub(crate) fn exited(&mut self) {
        if self.process == Process::Running {
            self.process = Process::Exited;
        }
    }

    /// Writes one frame (a complete line) to the current generation's stdin.
    pub(crate) fn send(&self, line: String, out: &mut Outbox) {
        out.push(Action::WriteMcp {
            proc: self.proc,
            line,
        });
    }

    /// Closes the current generation's stdin for the agent's shutdown (SPEC P1, M8), once.
    pub(crate) fn shut_down(&mut self, out: &mut Outbox) {
        if self.ever_spawned() && !self.shut_down {
            out.push(Action::CloseMcpStdin { proc: self.proc });
        }
        self.shut_down = true;
    }

    /// Asks for the process group of the current generation to go (SPEC M8): close stdin,
    /// SIGTERM now, SIGKILL after [`KILL_GRACE_MS`].
    pub(crate) fn terminate_group(&self, out: &mut Outbox, timers: &mut TimerTable) {
        let proc = self.proc;
        timers.set(Timer::kill(proc), out.now().plus_ms(KILL_GRACE_MS));
        out.push(Action::CloseMcpStdin { proc });
        out.push(Action::SignalProcessGroup {
            proc,
            signal: Signal::Term,
        });
    }

    /// Splits stdout bytes into lines (decoded later, lossily, C36).
    pub(crate) fn split(&mut self, bytes: &[u8]) -> Vec<LineEvent> {
        let mut events = Vec::new();
        self.buf.push(bytes, &mut events);
        events
    }

    /// Counts a stdout line that is not JSON-RPC; the level to log it at (SPEC T6: warn for
    /// the first [`BAD_LINES_AT_WARN`] of a generation, then debug).
    pub(crate) fn bad_line(&mut self) -> LogLevel {
        self.bad_lines += 1;
        if self.bad_lines <= BAD_LINES_AT_WARN {
            LogLevel::Warn
        } else {
            LogLevel::Debug
        }
    }

    /// Keeps one stderr line of the current generation for error messages, the last
    /// [`STDERR_TAIL_LINES`] of them (SPEC M1).
    pub(crate) fn keep_stderr(&mut self, line: &str) {
        if self.stderr_tail.len() == STDERR_TAIL_LINES {
            self.stderr_tail.pop_front();
        }
        self.stderr_tail.push_back(line.to_string());
    }

    /// The last stderr lines, joined, for error messages (SPEC M1, A2).
    pub(crate) fn stderr_tail(&self) -> String {
        self.stderr_tail
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;

    fn transport() -> StdioTransport {
        let spec = SpawnSpec {
            name: "fs".into(),
            command: "fake-mcp".into(),
            args: vec![],
            env: vec![],
            cwd: "/w".into(),
        };
        StdioTransport::new(ServerSlot(3), spec)
    }

    fn drain(out: &mut Outbox) -> Vec<Action> {
        std::iter::from_fn(|| out.pop()).collect()
    }

    #[test]
    fn m8_p1_shutdown_closes_stdin_once_and_only_of_a_spawned_process() {
        let mut out = Outbox::new(LogLevel::Debug, MonoTime::ZERO);
        let mut never = transport();
        never.shut_down(&mut out);
        assert!(drain(&mut out).is_empty(), "no process, no stdin to close");
        let mut t = transport();
        t.spawned();
        t.shut_down(&mut out);
        t.shut_down(&mut out);
        assert_eq!(
            drain(&mut out),
            vec![Action::CloseMcpStdin { proc: t.proc() }]
        );
    }

    #[test]
    fn m9_a_new_generation_is_unspawned_with_a_fresh_line_buffer_and_bad_line_count() {
        let mut t = transport();
        t.spawned();
        assert!(t.split(b"{\"half").is_empty());
        for _ in 0..BAD_LINES_AT_WARN {
            assert_eq!(t.bad_line(), LogLevel::Warn);
        }
        assert_eq!(t.bad_line(), LogLevel::Debug, "T6: quieter after 100");
        t.keep_stderr("boom");
        t.exited();
        assert_eq!(t.process(), Process::Exited);
        t.next_generation();
        assert_eq!(t.proc().generation, 1);
        assert_eq!(t.process(), Process::NotSpawned);
        assert!(t.ever_spawned() && !t.leader_alive());
        assert_eq!(t.bad_line(), LogLevel::Warn);
        assert_eq!(
            t.split(b"{}\n"),
            vec![LineEvent::Line(b"{}".to_vec())],
            "the half line of the old generation is gone"
        );
        assert_eq!(
            t.stderr_tail(),
            "boom",
            "the tail explains the deaths so far"
        );
    }
}
