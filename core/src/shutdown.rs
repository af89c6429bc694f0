//! The shutdown sub-machine (SPEC P1, M8). On stdin EOF, SIGTERM/SIGINT/SIGHUP or a dead
//! stdout the agent cancels every turn, answers pending requests and closes every server's
//! stdin; then this machine decides the rest: wait up to [`STAGE_MS`] for the leaders to exit,
//! SIGTERM every process group, wait up to [`STAGE_MS`] again (or until every leader exited,
//! plus [`GROUP_GRACE_MS`] for grandchildren), SIGKILL every group and exit 0. Bounded by about
//! 4.3 s whatever the children do.
//!
//! It knows nothing of servers: the agent tells it whether any leader is alive and whether any
//! server was ever spawned, and carries out the [`ShutdownAction`]s it returns.

use crate::time::MonoTime;

/// Longest wait of each stage (close → TERM, TERM → KILL), in ms (SPEC M8: 2 s).
pub(crate) const STAGE_MS: u64 = crate::mcp::KILL_GRACE_MS;
/// Grace after SIGTERM for grandchildren when every leader already exited, in ms.
pub(crate) const GROUP_GRACE_MS: u64 = 250;

/// Shutdown stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// stdin of every child closed at `since`; waiting for leaders to exit.
    Closing { since: MonoTime },
    /// SIGTERM sent to every group at `since`; waiting.
    Terminating { since: MonoTime },
    /// Done: the exit was asked for.
    Exited,
}

/// What the agent must do for the shutdown, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShutdownAction {
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
    /// Shutdown begun at `now`, every server's stdin just closed.
    pub(crate) fn begin(now: MonoTime) -> Shutdown {
        Shutdown {
            stage: Stage::Closing { since: now },
        }
    }

    /// Whether the exit was asked for.
    pub(crate) fn is_exited(&self) -> bool {
        self.stage == Stage::Exited
    }

    /// After every step: moves on early when the leaders are gone (`leaders_alive` false) —
    /// straight to TERM, and to KILL and exit when no group was ever started or the
    /// grandchild grace already passed.
    pub(crate) fn on_step(
        &mut self,
        now: MonoTime,
        leaders_alive: bool,
        any_spawned: bool,
    ) -> Vec<ShutdownAction> {
        let mut actions = Vec::new();
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
            Stage::Closing { since } if now >= since.plus_ms(STAGE_MS) => {
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
            Stage::Closing { .. } | Stage::Terminating { .. } | Stage::Exited => Vec::new(),
        }
    }

    /// When the current stage times out: [`STAGE_MS`] after it began, or [`GROUP_GRACE_MS`]
    /// after the TERM when every leader already exited; `None` once exited.
    pub(crate) fn deadline(&self, leaders_alive: bool) -> Option<MonoTime> {
        match self.stage {
            Stage::Terminating { since } if !leaders_alive => Some(since.plus_ms(GROUP_GRACE_MS)),
            Stage::Closing { since } | Stage::Terminating { since } => {
                Some(since.plus_ms(STAGE_MS))
            }
            Stage::Exited => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ShutdownAction::{KillAllGroupsAndExit, TermAllGroups};

    fn t(ms: u64) -> MonoTime {
        MonoTime::ZERO.plus_ms(ms)
    }

    #[test]
    fn m8_children_that_ignore_everything_are_killed_after_two_stages_of_two_seconds() {
        let mut s = Shutdown::begin(t(0));
        assert!(s.on_step(t(0), true, true).is_empty());
        assert_eq!(s.deadline(true), Some(t(2000)));
        assert!(s.on_timeout(t(1999), true).is_empty());
        assert_eq!(s.on_timeout(t(2000), true), vec![TermAllGroups]);
        assert_eq!(s.deadline(true), Some(t(4000)));
        assert!(s.on_step(t(3000), true, true).is_empty());
        assert_eq!(s.on_timeout(t(4000), true), vec![KillAllGroupsAndExit]);
        assert!(s.is_exited());
        assert_eq!(s.deadline(true), None);
        assert!(
            s.on_timeout(t(9000), false).is_empty(),
            "nothing after the exit"
        );
        assert!(s.on_step(t(9000), false, true).is_empty());
    }

    #[test]
    fn p1_leaders_that_exit_at_once_get_the_grandchild_grace_then_kill() {
        let mut s = Shutdown::begin(t(0));
        assert_eq!(s.on_step(t(10), false, true), vec![TermAllGroups]);
        assert_eq!(s.deadline(false), Some(t(260)), "TERM at 10 + 250 ms grace");
        assert!(s.on_timeout(t(259), false).is_empty());
        assert_eq!(s.on_timeout(t(260), false), vec![KillAllGroupsAndExit]);
    }

    #[test]
    fn p1_with_no_server_ever_spawned_the_exit_is_immediate() {
        let mut s = Shutdown::begin(t(0));
        assert_eq!(
            s.on_step(t(0), false, false),
            vec![TermAllGroups, KillAllGroupsAndExit]
        );
        assert!(s.is_exited());
    }

    #[test]
    fn m8_leaders_exiting_during_the_term_stage_shorten_it_to_the_grace() {
        let mut s = Shutdown::begin(t(0));
        assert_eq!(s.on_timeout(t(2000), true), vec![TermAllGroups]);
        assert!(s.on_step(t(2100), false, true).is_empty(), "grace not over");
        assert_eq!(s.deadline(false), Some(t(2250)));
        assert_eq!(s.on_step(t(2250), false, true), vec![KillAllGroupsAndExit]);
    }
}
