//! Every deadline of the core in one table (DESIGN "Deadlines live in the core"; quinn-proto's
//! `TimerTable` is the model). Each pending thing that can time out has exactly one [`Timer`]
//! here, set when it starts and cleared when it ends; `Agent::poll_timeout` is the earliest
//! entry, labelled with its [`TimerKey`]. A timer that is cleared never fires, so a late reply
//! or a finished call can never be timed out afterwards (I6).

use crate::ids::{McpRequestId, PermissionRequestId, ProcKey, ServerSlot, SessionId};
use crate::time::MonoTime;
use std::collections::{BTreeMap, BTreeSet};

/// Why the core wants to be woken (DESIGN: `poll_timeout` is labelled with its reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerKey {
    /// An MCP request's deadline: a handshake step (SPEC M2), a tool call (M5) or a hook call
    /// (H4); or an HTTP exchange's deadline or an event stream's `retry` (M10).
    McpRequest,
    /// Escalation of a process-group kill (TERM → KILL, SPEC M8) or the grace after a server
    /// closed its stdout before it is declared dead.
    ProcessKill,
    /// A permission request's deadline (SPEC A7).
    Permission,
    /// An LLM attempt's idle timeout, or the short grace after a complete answer (SPEC L5,
    /// case C24).
    LlmIdle,
    /// The end of a retry backoff (SPEC L5).
    Backoff,
    /// A shutdown stage (SPEC M8, P1).
    Shutdown,
    /// A step of an MCP server's authorization: an OAuth request, or the user's login
    /// (SPEC M11).
    Authorization,
}

/// A timer of one MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ServerTimer {
    /// The deadline of a request we sent (handshake, `tools/list`, tool call or hook call).
    Request(McpRequestId),
    /// The grace between the server closing its stdout and it being declared dead.
    StdoutClosed,
    /// SIGKILL of this generation's process group after the TERM grace.
    Kill { generation: u32 },
    /// The deadline of the step in progress of the server's authorization (SPEC M11).
    Authorization,
    /// The deadline of an HTTP exchange that carries no request of ours (a notification, a
    /// response, the `DELETE`), by its number (SPEC M10).
    Exchange(u64),
    /// An event stream to resume, or the `GET` stream to open again, after its `retry`.
    HttpRetry,
}

/// The timer of a prompt turn (at most one at a time: they belong to exclusive phases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TurnTimer {
    /// The decoder has the whole answer but the stream did not end (case C24 b).
    LlmGrace,
    /// No byte from the provider for `BUZZ_AGENT_LLM_TIMEOUT_SECS` (SPEC L5).
    LlmIdle,
    /// The next attempt starts (SPEC L5).
    Backoff,
}

/// One deadline's owner. The order of the variants is the order in which `poll_timeout`
/// labels simultaneous deadlines (server by server, then permissions, turns, shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// A timer of one MCP server.
    Server(ServerSlot, ServerTimer),
    /// A `session/request_permission` we sent (SPEC A7).
    Permission(PermissionRequestId),
    /// The running turn of a session.
    Turn(SessionId, TurnTimer),
    /// The current shutdown stage (SPEC P1, M8).
    Shutdown,
}

impl Timer {
    /// The kill timer of `proc`'s process group.
    pub(crate) fn kill(proc: ProcKey) -> Timer {
        Timer::Server(
            proc.server,
            ServerTimer::Kill {
                generation: proc.generation,
            },
        )
    }

    /// The label `poll_timeout` gives this timer.
    pub(crate) fn key(self) -> TimerKey {
        match self {
            Timer::Server(
                _,
                ServerTimer::Request(_) | ServerTimer::Exchange(_) | ServerTimer::HttpRetry,
            ) => TimerKey::McpRequest,
            Timer::Server(_, ServerTimer::StdoutClosed | ServerTimer::Kill { .. }) => {
                TimerKey::ProcessKill
            }
            Timer::Server(_, ServerTimer::Authorization) => TimerKey::Authorization,
            Timer::Permission(_) => TimerKey::Permission,
            Timer::Turn(_, TurnTimer::LlmGrace | TurnTimer::LlmIdle) => TimerKey::LlmIdle,
            Timer::Turn(_, TurnTimer::Backoff) => TimerKey::Backoff,
            Timer::Shutdown => TimerKey::Shutdown,
        }
    }

    /// The firing stage of this timer within one `handle_timeout`.
    pub(crate) fn stage(self) -> Stage {
        match self {
            Timer::Server(_, ServerTimer::Kill { .. }) => Stage::Kills,
            Timer::Server(_, ServerTimer::StdoutClosed) => Stage::ClosedStdouts,
            Timer::Server(
                _,
                ServerTimer::Request(_)
                | ServerTimer::Authorization
                | ServerTimer::Exchange(_)
                | ServerTimer::HttpRetry,
            ) => Stage::McpRequests,
            Timer::Turn(_, TurnTimer::LlmGrace) => Stage::LlmGraces,
            Timer::Turn(_, TurnTimer::LlmIdle) => Stage::LlmIdle,
            Timer::Turn(_, TurnTimer::Backoff) => Stage::Backoffs,
            Timer::Permission(_) => Stage::Permissions,
            Timer::Shutdown => Stage::Shutdown,
        }
    }
}

/// The order in which due timers fire within one `handle_timeout`: all timers of a stage (in
/// [`Timer`] order, the due set taken when the stage begins), then the next stage. A timer an
/// earlier one cleared does not fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    /// SIGKILL escalations.
    Kills,
    /// Servers whose stdout closed and who did not exit in time.
    ClosedStdouts,
    /// MCP request deadlines.
    McpRequests,
    /// Complete LLM answers whose stream did not end.
    LlmGraces,
    /// Silent LLM streams.
    LlmIdle,
    /// Retry backoffs that ended.
    Backoffs,
    /// Unanswered permission requests.
    Permissions,
    /// The shutdown stage.
    Shutdown,
}

impl Stage {
    /// Every stage, in firing order.
    pub(crate) const ALL: [Stage; 8] = [
        Stage::Kills,
        Stage::ClosedStdouts,
        Stage::McpRequests,
        Stage::LlmGraces,
        Stage::LlmIdle,
        Stage::Backoffs,
        Stage::Permissions,
        Stage::Shutdown,
    ];
}

/// Deadlines by owner, and the same ordered by time.
#[derive(Debug, Default)]
pub(crate) struct TimerTable {
    at: BTreeMap<Timer, MonoTime>,
    queue: BTreeSet<(MonoTime, Timer)>,
}

impl TimerTable {
    /// Sets (or moves) `timer` to fire at `at`.
    pub(crate) fn set(&mut self, timer: Timer, at: MonoTime) {
        if let Some(old) = self.at.insert(timer, at) {
            self.queue.remove(&(old, timer));
        }
        self.queue.insert((at, timer));
    }

    /// Removes `timer`; returns when it would have fired.
    pub(crate) fn clear(&mut self, timer: Timer) -> Option<MonoTime> {
        let old = self.at.remove(&timer)?;
        self.queue.remove(&(old, timer));
        Some(old)
    }

    /// Removes every timer of the turn of `session`.
    pub(crate) fn clear_turn(&mut self, session: SessionId) {
        for kind in [TurnTimer::LlmGrace, TurnTimer::LlmIdle, TurnTimer::Backoff] {
            self.clear(Timer::Turn(session, kind));
        }
    }

    /// When `timer` fires, if set.
    pub(crate) fn get(&self, timer: Timer) -> Option<MonoTime> {
        self.at.get(&timer).copied()
    }

    /// Whether `timer` is set.
    pub(crate) fn contains(&self, timer: Timer) -> bool {
        self.at.contains_key(&timer)
    }

    /// Whether `timer` is set to fire at or before `now`.
    pub(crate) fn is_due(&self, timer: Timer, now: MonoTime) -> bool {
        self.get(timer).is_some_and(|t| t <= now)
    }

    /// The earliest deadline and its owner (ties: the first in [`Timer`] order).
    pub(crate) fn next(&self) -> Option<(MonoTime, Timer)> {
        self.queue.first().copied()
    }

    /// Every timer of firing `stage` due at or before `now`, in [`Timer`] order.
    pub(crate) fn due_in_stage(&self, now: MonoTime, stage: Stage) -> Vec<Timer> {
        let mut due: Vec<Timer> = self
            .queue
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, timer)| *timer)
            .filter(|timer| timer.stage() == stage)
            .collect();
        due.sort_unstable();
        due
    }

    /// Removes every timer of `server` (it left the server table).
    pub(crate) fn clear_server(&mut self, server: ServerSlot) {
        let from = Timer::Server(server, ServerTimer::Request(McpRequestId(0)));
        let mine: Vec<Timer> = self
            .at
            .range(from..)
            .take_while(|(timer, _)| matches!(timer, Timer::Server(s, _) if *s == server))
            .map(|(timer, _)| *timer)
            .collect();
        for timer in mine {
            self.clear(timer);
        }
    }

    /// The process generations of `server` whose group still has a SIGKILL pending.
    pub(crate) fn pending_kills(&self, server: ServerSlot) -> Vec<ProcKey> {
        let from = Timer::Server(server, ServerTimer::Kill { generation: 0 });
        let to = Timer::Server(
            server,
            ServerTimer::Kill {
                generation: u32::MAX,
            },
        );
        self.at
            .range(from..=to)
            .filter_map(|(timer, _)| match timer {
                Timer::Server(server, ServerTimer::Kill { generation }) => Some(ProcKey {
                    server: *server,
                    generation: *generation,
                }),
                Timer::Server(..) | Timer::Permission(_) | Timer::Turn(..) | Timer::Shutdown => {
                    None
                }
            })
            .collect()
    }

    /// The number of timers set.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        debug_assert_eq!(self.at.len(), self.queue.len());
        self.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> MonoTime {
        MonoTime::ZERO.plus_ms(ms)
    }

    const S1: ServerSlot = ServerSlot(1);
    const S2: ServerSlot = ServerSlot(2);

    #[test]
    fn next_is_the_earliest_and_moving_a_timer_replaces_it() {
        let mut timers = TimerTable::default();
        assert_eq!(timers.next(), None);
        timers.set(Timer::Shutdown, t(50));
        timers.set(Timer::Permission(PermissionRequestId(1)), t(20));
        assert_eq!(
            timers.next(),
            Some((t(20), Timer::Permission(PermissionRequestId(1))))
        );
        timers.set(Timer::Permission(PermissionRequestId(1)), t(80));
        assert_eq!(timers.next(), Some((t(50), Timer::Shutdown)));
        assert_eq!(timers.len(), 2, "a moved timer is held once");
        assert_eq!(timers.clear(Timer::Shutdown), Some(t(50)));
        assert_eq!(timers.clear(Timer::Shutdown), None);
        assert_eq!(
            timers.next().map(|(_, timer)| timer.key()),
            Some(TimerKey::Permission)
        );
    }

    #[test]
    fn simultaneous_deadlines_are_labelled_server_by_server_then_permissions_turns_shutdown() {
        let mut timers = TimerTable::default();
        timers.set(Timer::Shutdown, t(10));
        timers.set(Timer::Turn(SessionId(1), TurnTimer::Backoff), t(10));
        timers.set(Timer::Permission(PermissionRequestId(3)), t(10));
        timers.set(
            Timer::kill(ProcKey {
                server: S2,
                generation: 0,
            }),
            t(10),
        );
        timers.set(
            Timer::Server(S2, ServerTimer::Request(McpRequestId(9))),
            t(10),
        );
        assert_eq!(
            timers.next().map(|(_, k)| k.key()),
            Some(TimerKey::McpRequest)
        );
        timers.set(Timer::Server(S1, ServerTimer::StdoutClosed), t(10));
        assert_eq!(
            timers.next().map(|(_, k)| k.key()),
            Some(TimerKey::ProcessKill)
        );
    }

    #[test]
    fn due_timers_fire_stage_by_stage() {
        let mut timers = TimerTable::default();
        let request = Timer::Server(S1, ServerTimer::Request(McpRequestId(1)));
        let kill = Timer::kill(ProcKey {
            server: S2,
            generation: 1,
        });
        let idle = Timer::Turn(SessionId(2), TurnTimer::LlmIdle);
        timers.set(request, t(5));
        timers.set(kill, t(7));
        timers.set(idle, t(1));
        timers.set(Timer::Shutdown, t(100));
        let stages: Vec<Vec<Timer>> = Stage::ALL
            .iter()
            .map(|s| timers.due_in_stage(t(10), *s))
            .collect();
        assert_eq!(stages[0], vec![kill], "kills first, whatever their time");
        assert_eq!(stages[2], vec![request]);
        assert_eq!(stages[4], vec![idle]);
        assert!(stages[7].is_empty(), "not due yet");
        assert!(timers.is_due(request, t(5)) && !timers.is_due(request, t(4)));
    }

    #[test]
    fn a_timer_is_set_from_set_until_it_is_cleared() {
        let mut timers = TimerTable::default();
        let kill = |generation| {
            Timer::kill(ProcKey {
                server: S1,
                generation,
            })
        };
        assert!(!timers.contains(kill(0)), "an empty table holds nothing");
        timers.set(kill(0), t(5));
        assert!(timers.contains(kill(0)));
        assert!(
            !timers.contains(kill(1)),
            "another generation's timer is not set"
        );
        timers.clear(kill(0));
        assert!(!timers.contains(kill(0)));
    }

    #[test]
    fn pending_kills_are_the_server_generations_with_a_kill_timer() {
        let mut timers = TimerTable::default();
        timers.set(
            Timer::kill(ProcKey {
                server: S1,
                generation: 0,
            }),
            t(1),
        );
        timers.set(
            Timer::kill(ProcKey {
                server: S1,
                generation: 2,
            }),
            t(1),
        );
        timers.set(
            Timer::kill(ProcKey {
                server: S2,
                generation: 0,
            }),
            t(1),
        );
        timers.set(Timer::Server(S1, ServerTimer::StdoutClosed), t(1));
        assert_eq!(
            timers.pending_kills(S1),
            vec![
                ProcKey {
                    server: S1,
                    generation: 0
                },
                ProcKey {
                    server: S1,
                    generation: 2
                }
            ]
        );
        timers.clear_turn(SessionId(1));
        assert_eq!(timers.len(), 4);
    }
}
