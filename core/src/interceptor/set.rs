//! A session's interceptor set (SPEC X1): what its interceptor servers' `interceptors/list`
//! pages gave, kept with the session (`session.rs`) and read by the screens of its tool calls
//! (`intercept.rs`). Plain data: no requests are sent from here.

use crate::ids::ServerSlot;
use crate::interceptor::wire::TOOLS_CALL;
use crate::interceptor::{Interceptor, Member, Phase};
use std::collections::BTreeMap;

/// The interceptors of one session (SPEC X1): those of every interceptor server that hook
/// `tools/call`, in registration order, then each server's list order; and the interceptor
/// servers whose `interceptors/list` failed (every call of the session is then denied: an
/// unknown gate fails closed).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Interceptors {
    members: Vec<Member>,
    /// Interceptor server name → its slot in this session.
    pub(crate) servers: BTreeMap<String, ServerSlot>,
    /// `(server name, why its listing failed)`.
    pub(crate) broken: Vec<(String, String)>,
}

impl Interceptors {
    /// Adds `server`'s interceptors (in its order) that hook `tools/call` on some phase.
    pub(crate) fn add(&mut self, server: &str, slot: ServerSlot, list: Vec<Interceptor>) {
        self.servers.insert(server.to_string(), slot);
        self.members.extend(
            list.into_iter()
                .filter(|i| i.hooks_event_any_phase(TOOLS_CALL))
                .map(|interceptor| Member {
                    server: server.to_string(),
                    interceptor,
                }),
        );
    }

    /// `server`'s listing failed (`why`): the session's calls are denied (fail-closed).
    pub(crate) fn add_broken(&mut self, server: &str, why: String) {
        self.broken.push((server.to_string(), why));
    }

    /// The interceptors, in chain member order.
    pub(crate) fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether a `tools/call` on `phase` must be screened.
    pub(crate) fn screens(&self, phase: Phase) -> bool {
        !self.broken.is_empty()
            || self
                .members
                .iter()
                .any(|m| m.interceptor.hooks_event(TOOLS_CALL, phase))
    }
}
