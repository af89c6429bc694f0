//! The `session/request_permission` requests we sent to the client (SPEC A7): the only
//! requests the agent sends on ACP. Each has exactly one deadline in the [`TimerTable`]; an
//! answer, a timeout, a cancelled turn or the shutdown removes it, and a later answer is inert
//! (I6).

use crate::ids::{PermissionRequestId, SessionId, ToolCallIndex, TurnNo};
use crate::time::MonoTime;
use crate::timers::{Timer, TimerTable};
use std::collections::BTreeMap;

/// Who waits for a permission answer: the tool call at `index` of `turn` in `session`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PermissionRequest {
    pub(crate) session: SessionId,
    pub(crate) turn: TurnNo,
    pub(crate) index: ToolCallIndex,
}

/// The permission requests in flight, by their JSON-RPC id.
#[derive(Debug, Default)]
pub(crate) struct Permissions {
    pending: BTreeMap<PermissionRequestId, PermissionRequest>,
}

impl Permissions {
    /// Records request `id` for `request`, to be denied at `deadline` if unanswered.
    pub(crate) fn insert(
        &mut self,
        id: PermissionRequestId,
        request: PermissionRequest,
        deadline: MonoTime,
        timers: &mut TimerTable,
    ) {
        self.pending.insert(id, request);
        timers.set(Timer::Permission(id), deadline);
    }

    /// Removes request `id` (answered, timed out or abandoned) with its deadline; `None` when it
    /// is not in flight (late or unknown answer).
    pub(crate) fn take(
        &mut self,
        id: PermissionRequestId,
        timers: &mut TimerTable,
    ) -> Option<PermissionRequest> {
        timers.clear(Timer::Permission(id));
        self.pending.remove(&id)
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
        p.insert(PermissionRequestId(1), request(0), at, &mut timers);
        p.insert(PermissionRequestId(2), request(1), at, &mut timers);
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
            Some((at, Timer::Permission(PermissionRequestId(2))))
        );
        p.clear(&mut timers);
        assert_eq!(timers.next(), None);
        assert_eq!(p.take(PermissionRequestId(2), &mut timers), None);
    }
}
