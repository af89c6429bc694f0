//! The `session/request_permission` requests we sent to the client (SPEC A7): the only
//! requests the agent sends on ACP. Each has exactly one timer in the [`TimerTable`]: the next
//! reminder (a WARN every [`REMINDER_MS`] while it waits, issue 12) or, at last, its deadline;
//! an answer, a timeout, a cancelled turn or the shutdown removes it, and a later answer is
//! inert (I6).

use crate::ids::{PermissionRequestId, SessionId, ToolCallIndex, TurnNo};
use crate::time::MonoTime;
use crate::timers::{Timer, TimerTable};
use std::collections::BTreeMap;

/// While a permission request waits, a WARN names it this often, in ms (issue 12).
pub(crate) const REMINDER_MS: u64 = 30_000;

/// Who waits for a permission answer: the tool call at `index` of `turn` in `session`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PermissionRequest {
    pub(crate) session: SessionId,
    pub(crate) turn: TurnNo,
    pub(crate) index: ToolCallIndex,
}

/// One request in flight.
#[derive(Debug)]
struct Pending {
    request: PermissionRequest,
    /// The tool call's title and id, for the reminders: `Read Text File (tc_3)`.
    what: String,
    asked: MonoTime,
    deadline: MonoTime,
}

/// What the timer of a request meant (see [`Permissions::on_timer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PermissionTimer {
    /// The deadline passed: the request is removed and the call denied.
    Expired(PermissionRequest),
    /// It still waits: log `message` (a WARN); the timer was set again.
    Waiting { message: String },
}

/// The permission requests in flight, by their JSON-RPC id.
#[derive(Debug, Default)]
pub(crate) struct Permissions {
    pending: BTreeMap<PermissionRequestId, Pending>,
}

impl Permissions {
    /// Records request `id` for `request` about `what` (the tool call's title and id), asked
    /// at `now`, to be denied at `deadline` if unanswered; reminders every [`REMINDER_MS`]
    /// before that.
    pub(crate) fn insert(
        &mut self,
        id: PermissionRequestId,
        request: PermissionRequest,
        what: String,
        now: MonoTime,
        deadline: MonoTime,
        timers: &mut TimerTable,
    ) {
        self.pending.insert(
            id,
            Pending {
                request,
                what,
                asked: now,
                deadline,
            },
        );
        timers.set(
            Timer::Permission(id),
            deadline.min(now.plus_ms(REMINDER_MS)),
        );
    }

    /// The timer of request `id` fired at `now` (already cleared from the table): the
    /// deadline passed, or a reminder is due (the next one is set). `None` when the request
    /// is not in flight.
    pub(crate) fn on_timer(
        &mut self,
        id: PermissionRequestId,
        now: MonoTime,
        timers: &mut TimerTable,
    ) -> Option<PermissionTimer> {
        let p = self.pending.get(&id)?;
        if now >= p.deadline {
            return self.take(id, timers).map(PermissionTimer::Expired);
        }
        let waited = now.ms_since(p.asked) / 1000;
        let left = p.deadline.ms_since(now).div_ceil(1000);
        let message = format!(
            "acp: permission request {id} for {} unanswered for {waited} s; denied in {left} s (BUZZ_AGENT_PERMISSION_TIMEOUT_SECS)",
            p.what
        );
        timers.set(
            Timer::Permission(id),
            p.deadline.min(now.plus_ms(REMINDER_MS)),
        );
        Some(PermissionTimer::Waiting { message })
    }

    /// Removes request `id` (answered, timed out or abandoned) with its deadline; `None` when it
    /// is not in flight (late or unknown answer).
    pub(crate) fn take(
        &mut self,
        id: PermissionRequestId,
        timers: &mut TimerTable,
    ) -> Option<PermissionRequest> {
        timers.clear(Timer::Permission(id));
        self.pending.remove(&id).map(|p| p.request)
    }

    /// Forgets every request (shutdown: their turns were already answered).
    pub(crate) fn clear(&mut self, timers: &mut TimerTable) {
        for id in std::mem::take(&mut self.pending).into_keys() {
            timers.clear(Timer::Permission(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(index: usize) -> PermissionRequest {
        PermissionRequest {
            session: SessionId(1),
            turn: TurnNo(1),
            index: ToolCallIndex(index),
        }
    }

    #[test]
    fn a7_each_request_has_one_deadline_and_an_answer_removes_both() {
        let mut timers = TimerTable::default();
        let mut p = Permissions::default();
        let at = MonoTime::ZERO.plus_ms(330_000);
        let t0 = MonoTime::ZERO;
        p.insert(
            PermissionRequestId(1),
            request(0),
            "a".into(),
            t0,
            at,
            &mut timers,
        );
        p.insert(
            PermissionRequestId(2),
            request(1),
            "b".into(),
            t0,
            at,
            &mut timers,
        );
        assert_eq!(timers.len(), 2);
        assert_eq!(
            p.take(PermissionRequestId(1), &mut timers),
            Some(request(0))
        );
        assert_eq!(
            p.take(PermissionRequestId(1), &mut timers),
            None,
            "I6: a second answer finds nothing"
        );
        assert_eq!(
            timers.next(),
            Some((
                t0.plus_ms(REMINDER_MS),
                Timer::Permission(PermissionRequestId(2))
            ))
        );
        p.clear(&mut timers);
        assert_eq!(timers.next(), None);
        assert_eq!(p.take(PermissionRequestId(2), &mut timers), None);
    }

    #[test]
    fn a7_an_unanswered_request_is_named_every_30_s_then_denied_at_its_deadline() {
        let mut timers = TimerTable::default();
        let mut p = Permissions::default();
        let id = PermissionRequestId(4);
        let deadline = MonoTime::ZERO.plus_ms(70_000);
        let what = "Read Text File (tc_1)".to_string();
        p.insert(id, request(0), what, MonoTime::ZERO, deadline, &mut timers);
        let mut fired = Vec::new();
        while let Some((at, timer)) = timers.next() {
            assert_eq!(timer, Timer::Permission(id));
            timers.clear(timer);
            fired.push((at.as_ms(), p.on_timer(id, at, &mut timers)));
        }
        assert_eq!(fired.len(), 3, "{fired:?}");
        assert_eq!(fired[0].0, 30_000);
        let Some(PermissionTimer::Waiting { message }) = &fired[0].1 else {
            panic!("{fired:?}");
        };
        assert_eq!(
            message,
            "acp: permission request 4 for Read Text File (tc_1) unanswered for 30 s; denied in 40 s (BUZZ_AGENT_PERMISSION_TIMEOUT_SECS)"
        );
        assert_eq!(fired[1].0, 60_000);
        assert_eq!(
            fired[2],
            (70_000, Some(PermissionTimer::Expired(request(0))))
        );
        assert_eq!(p.on_timer(id, deadline, &mut timers), None, "gone");
    }
}
