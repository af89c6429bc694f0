//! The shutdown sub-machine (SPEC P1, M8, H11). On stdin EOF, SIGTERM/SIGINT/SIGHUP or a dead
//! stdout the agent cancels every turn, answers pending requests, starts the `_SessionEnd`
//! round of every session and closes the stdin of every server that is not answering one;
//! then this machine decides the rest: wait for the `_SessionEnd` rounds (each call is bounded
//! by the hook timeout; this stage by the same timeout as a safety net), close the remaining
//! servers' stdin, wait for the leaders to exit until [`STAGE_MS`] after the shutdown began
//! (at least [`GROUP_GRACE_MS`] after the last stdin was closed), SIGTERM every process group,
//! wait up to [`STAGE_MS`] again (or until every leader exited, plus [`GROUP_GRACE_MS`] for
//! grandchildren), SIGKILL every group and exit 0.
//!
//! Bound: without `_SessionEnd` hooks, about 4.3 s whatever the children do; a `_SessionEnd`
//! stage that takes h ms ends the close stage at max(2 s, h + 250 ms), so with the default
//! 2.5 s hook timeout the exit still comes within 4.75 s (SPEC P1's 5 s), and a longer hook
//! timeout delays it by at most that timeout (SPEC H11).
//!
//! It knows nothing of servers or sessions: the agent tells it whether `_SessionEnd` calls are
//! still waiting, whether any leader is alive and whether any server was ever spawned, and
//! carries out the [`ShutdownAction`]s it returns.

use crate::time::MonoTime;

/// Longest wait of each stage (close → TERM, TERM → KILL), in ms (SPEC M8: 2 s).
pub(crate) const STAGE_MS: u64 = crate::mcp::KILL_GRACE_MS;
/// Grace after SIGTERM for grandchildren when every leader already exited, and the least wait
/// between the last stdin closed and SIGTERM, in ms.
pub(crate) const GROUP_GRACE_MS: u64 = 250;

/// Shutdown stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `_SessionEnd` calls in flight since `since` (SPEC H11); their servers keep their stdin.
    Ending { since: MonoTime, hook_ms: u64 },
    /// stdin of every child closed (the last ones at `closed`); waiting for leaders to exit
    /// until `since` (the shutdown's start) + [`STAGE_MS`], or `closed` + [`GROUP_GRACE_MS`].
    Closing { since: MonoTime, closed: MonoTime },
    /// SIGTERM sent to every group at `since`; waiting.
    Terminating { since: MonoTime },
    /// Done: the exit was asked for.
    Exited,
}

/// What the agent must do for the shutdown, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShutdownAction {
    /// Close the stdin of every server still open (the `_SessionEnd` stage is over).
    CloseAll,
    /// SIGTERM every process group that may exist.
    TermAllGroups,
    /// SIGKILL every process group that may exist, then exit 0.
    KillAllGroupsAndExit,
}

/// Progress of the shutdown. Once begun it only moves forward; once exited it asks for
/// nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shutdown {
    stage: Stage,
}

impl Shutdown {
    /// Shutdown begun at `now`. `ending`: `_SessionEnd` calls are in flight, bounded by
    /// `hook_ms` each (their servers' stdin stays open); else every server's stdin was just
    /// closed.
    pub(crate) fn begin(now: MonoTime, ending: bool, hook_ms: u64) -> Shutdown {
        let stage = if ending {
            Stage::Ending {
                since: now,
                hook_ms,
            }
        } else {
            Stage::Closing {
                since: now,
                closed: now,
            }
        };
        Shutdown { stage }
    }

    /// Whether the exit was asked for.
    pub(crate) fn is_exited(&self) -> bool {
        self.stage == Stage::Exited
    }

    /// Whether the `_SessionEnd` stage is still running.
    #[cfg(test)]
    pub(crate) fn is_ending(&self) -> bool {
        matches!(self.stage, Stage::Ending { .. })
    }

    /// After every step: the `_SessionEnd` stage ends when no call waits (`hooks_waiting`
    /// false); then moves on early when the leaders are gone (`leaders_alive` false) —
    /// straight to TERM, and to KILL and exit when no group was ever started or the
    /// grandchild grace already passed.
    pub(crate) fn on_step(
        &mut self,
        now: MonoTime,
        hooks_waiting: bool,
        leaders_alive: bool,
        any_spawned: bool,
    ) -> Vec<ShutdownAction> {
        let mut actions = Vec::new();
        if let Stage::Ending { since, .. } = self.stage
            && !hooks_waiting
        {
            actions.push(ShutdownAction::CloseAll);
            self.stage = Stage::Closing { since, closed: now };
            // The servers just closed are still running: wait for them.
            return actions;
        }
        if let Stage::Closing { .. } = self.stage
            && !leaders_alive
        {
            actions.push(ShutdownAction::TermAllGroups);
            self.stage = Stage::Terminating { since: now };
        }
        if let Stage::Terminating { since } = self.stage
            && !leaders_alive
            && (now >= since.plus_ms(GROUP_GRACE_MS) || !any_spawned)
        {
            actions.push(ShutdownAction::KillAllGroupsAndExit);
            self.stage = Stage::Exited;
        }
        actions
    }

    /// The stage's deadline passed (`now` ≥ [`Shutdown::deadline`]).
    pub(crate) fn on_timeout(&mut self, now: MonoTime, leaders_alive: bool) -> Vec<ShutdownAction> {
        match self.stage {
            Stage::Ending { since, hook_ms } if now >= since.plus_ms(hook_ms) => {
                self.stage = Stage::Closing { since, closed: now };
                vec![ShutdownAction::CloseAll]
            }
            Stage::Closing { since, closed } if now >= close_deadline(since, closed) => {
                self.stage = Stage::Terminating { since: now };
                vec![ShutdownAction::TermAllGroups]
            }
            Stage::Terminating { since }
                if now >= since.plus_ms(STAGE_MS)
                    || (!leaders_alive && now >= since.plus_ms(GROUP_GRACE_MS)) =>
            {
                self.stage = Stage::Exited;
                vec![ShutdownAction::KillAllGroupsAndExit]
            }
            Stage::Ending { .. }
            | Stage::Closing { .. }
            | Stage::Terminating { .. }
            | Stage::Exited => Vec::new(),
        }
    }

    /// When the current stage times out: the hook timeout after the start while
    /// `_SessionEnd` calls wait; the close deadline (see the module docs); [`STAGE_MS`] after
    /// the TERM, or [`GROUP_GRACE_MS`] after it when every leader already exited; `None` once
    /// exited.
    pub(crate) fn deadline(&self, leaders_alive: bool) -> Option<MonoTime> {
        match self.stage {
            Stage::Ending { since, hook_ms } => Some(since.plus_ms(hook_ms)),
            Stage::Closing { since, closed } => Some(close_deadline(since, closed)),
            Stage::Terminating { since } if !leaders_alive => Some(since.plus_ms(GROUP_GRACE_MS)),
            Stage::Terminating { since } => Some(since.plus_ms(STAGE_MS)),
            Stage::Exited => None,
        }
    }
}

/// SIGTERM is due [`STAGE_MS`] after the shutdown began, but never sooner than
/// [`GROUP_GRACE_MS`] after the last stdin was closed.
fn close_deadline(since: MonoTime, closed: MonoTime) -> MonoTime {
    since.plus_ms(STAGE_MS).max(closed.plus_ms(GROUP_GRACE_MS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ShutdownAction::{CloseAll, KillAllGroupsAndExit, TermAllGroups};

    fn t(ms: u64) -> MonoTime {
        MonoTime::ZERO.plus_ms(ms)
    }

    #[test]
    fn m8_children_that_ignore_everything_are_killed_after_two_stages_of_two_seconds() {
        let mut s = Shutdown::begin(t(0), false, 2500);
        assert!(s.on_step(t(0), false, true, true).is_empty());
        assert_eq!(s.deadline(true), Some(t(2000)));
        assert!(s.on_timeout(t(1999), true).is_empty());
        assert_eq!(s.on_timeout(t(2000), true), vec![TermAllGroups]);
        assert_eq!(s.deadline(true), Some(t(4000)));
        assert!(s.on_step(t(3000), false, true, true).is_empty());
        assert_eq!(s.on_timeout(t(4000), true), vec![KillAllGroupsAndExit]);
        assert!(s.is_exited());
        assert_eq!(s.deadline(true), None);
        assert!(
            s.on_timeout(t(9000), false).is_empty(),
            "nothing after the exit"
        );
        assert!(s.on_step(t(9000), false, false, true).is_empty());
    }

    #[test]
    fn p1_leaders_that_exit_at_once_get_the_grandchild_grace_then_kill() {
        let mut s = Shutdown::begin(t(0), false, 2500);
        assert_eq!(s.on_step(t(10), false, false, true), vec![TermAllGroups]);
        assert_eq!(s.deadline(false), Some(t(260)), "TERM at 10 + 250 ms grace");
        assert!(s.on_timeout(t(259), false).is_empty());
        assert_eq!(s.on_timeout(t(260), false), vec![KillAllGroupsAndExit]);
    }

    #[test]
    fn p1_with_no_server_ever_spawned_the_exit_is_immediate() {
        let mut s = Shutdown::begin(t(0), false, 2500);
        assert_eq!(
            s.on_step(t(0), false, false, false),
            vec![TermAllGroups, KillAllGroupsAndExit]
        );
        assert!(s.is_exited());
    }

    #[test]
    fn m8_leaders_exiting_during_the_term_stage_shorten_it_to_the_grace() {
        let mut s = Shutdown::begin(t(0), false, 2500);
        assert_eq!(s.on_timeout(t(2000), true), vec![TermAllGroups]);
        assert!(
            s.on_step(t(2100), false, false, true).is_empty(),
            "grace not over"
        );
        assert_eq!(s.deadline(false), Some(t(2250)));
        assert_eq!(
            s.on_step(t(2250), false, false, true),
            vec![KillAllGroupsAndExit]
        );
    }

    #[test]
    fn h11_p1_a_hanging_session_end_hook_still_exits_within_five_seconds() {
        // The hook timeout is 2500 ms; its servers ignore everything.
        let mut s = Shutdown::begin(t(0), true, 2500);
        assert!(s.is_ending());
        assert!(s.on_step(t(100), true, true, true).is_empty(), "hooks wait");
        assert_eq!(s.deadline(true), Some(t(2500)));
        // The hook calls time out at 2500 ms (their own timers): the stage ends.
        assert_eq!(s.on_step(t(2500), false, true, true), vec![CloseAll]);
        assert_eq!(
            s.deadline(true),
            Some(t(2750)),
            "TERM at max(0 + 2000, 2500 + 250)"
        );
        assert!(s.on_timeout(t(2749), true).is_empty());
        assert_eq!(s.on_timeout(t(2750), true), vec![TermAllGroups]);
        assert_eq!(s.on_timeout(t(4750), true), vec![KillAllGroupsAndExit]);
        assert!(s.is_exited(), "4.75 s: within P1's 5 s");
    }

    #[test]
    fn h11_quick_session_end_answers_keep_the_usual_stages() {
        let mut s = Shutdown::begin(t(0), true, 2500);
        assert_eq!(s.on_step(t(30), false, true, true), vec![CloseAll]);
        assert_eq!(
            s.deadline(true),
            Some(t(2000)),
            "close stage from the start"
        );
        assert_eq!(s.on_step(t(60), false, false, true), vec![TermAllGroups]);
        assert_eq!(
            s.on_step(t(310), false, false, true),
            vec![KillAllGroupsAndExit]
        );
    }

    #[test]
    fn h11_the_ending_stage_is_bounded_by_the_hook_timeout_itself() {
        let mut s = Shutdown::begin(t(0), true, 300);
        assert_eq!(s.on_timeout(t(300), true), vec![CloseAll]);
        assert_eq!(s.deadline(true), Some(t(2000)));
    }
}
