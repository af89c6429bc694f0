//! One entry per ACP session (SPEC A2–A4, A9, H10, H11): the [`Session`] itself, where it is
//! in its [`Lifecycle`], its running [`Turn`] and the prompt queued behind it. The router
//! (`agent.rs`) keeps one [`SessionEntry`] per session id and asks the entry, not a set of
//! flags and side maps, what the session may do next.
//!
//! # Lifecycle
//!
//! ```text
//!   session/new, session/load, session/resume
//!            │
//!            ▼
//!      ┌──────────┐  a server or the transcript failed   (entry removed,
//!      │ Starting │ ────────────────────────────────────▶ request answered
//!      └──────────┘                                        with the error)
//!            │ begin_opening: every server ready
//!            │ (and, for a load, the transcript read)
//!            ▼
//!      ┌──────────┐
//!      │ Opening  │  _SessionStart round and interceptors/list running
//!      └──────────┘
//!            │ finish_opening: both decided; the opening request is answered
//!            ▼
//!      ┌──────────┐
//!      │   Open   │  prompts run as turns; one prompt may wait behind a turn
//!      └──────────┘
//!            │ begin_ending: session/close or shutdown (EOF, signal, client gone)
//!            ▼
//!      ┌──────────┐
//!      │  Ending  │  _SessionEnd round running, then decided; after
//!      └──────────┘  session/close the entry is removed
//! ```
//!
//! A shutdown moves every entry to `Ending` at once ([`SessionEntry::refuse_opening`], then
//! [`SessionEntry::begin_ending`]): from `Opening` or `Open` with a `_SessionEnd` round (a
//! session that opened ends exactly once, SPEC H11), from `Starting` without one (it never
//! opened). `Ending` is final: no transition leaves it.
//!
//! The opening request (`session/new`, `session/load`, `session/resume`) is held by
//! `Starting` and `Opening`: it is answered exactly once, when the entry leaves them.

use crate::cx::{Cx, McpCx};
use crate::hooks::{EndReason, HookOutcome};
use crate::ids::{HookRoundId, SessionId};
use crate::jsonrpc::RpcId;
use crate::lifecycle::{Ending, Opening, Source};
use crate::session::Session;
use crate::turn::{Turn, TurnEnd};
use std::collections::BTreeMap;

/// The session `sid` of `entries` while its entry is in the state `state` tells (for example
/// [`SessionEntry::is_open`]); `None` for an unknown session or one in another state.
pub(crate) fn session_if(
    entries: &mut BTreeMap<SessionId, SessionEntry>,
    sid: SessionId,
    state: impl Fn(&SessionEntry) -> bool,
) -> Option<&mut Session> {
    entries
        .get_mut(&sid)
        .filter(|e| state(e))
        .map(|e| &mut e.session)
}

/// Where a session is in its life (see the [module docs](self) for the diagram).
#[derive(Debug)]
pub(crate) enum Lifecycle {
    /// Its project files, servers and (for a load) transcript are on their way; `request` is
    /// the `session/new`, `session/load` or `session/resume` to answer (SPEC A2, A9, A10).
    Starting {
        /// The request that opened the session.
        request: RpcId,
    },
    /// Every server is ready; its `_SessionStart` round and `interceptors/list` requests run
    /// (SPEC H10, X1); `request` is answered when they are decided.
    Opening {
        /// The request that opened the session.
        request: RpcId,
        /// The round and the listings.
        opening: Opening,
    },
    /// Answered; prompts run (SPEC A3).
    Open,
    /// Closing or shutting down (SPEC H11): `round` is the `_SessionEnd` round while it is
    /// undecided, `None` once decided or when the session never opened.
    Ending {
        /// The undecided `_SessionEnd` round.
        round: Option<Ending>,
    },
}

/// Which part of the entry a hook outcome belonged to ([`SessionEntry::on_hook_outcome`]).
#[derive(Debug)]
pub(crate) enum HookRouted {
    /// The `_SessionStart` round of the opening: see whether the opening is done.
    Opening,
    /// The `_SessionEnd` round: see whether the ending is done.
    Ending,
    /// A round of the running turn; `Some` when the turn ended.
    Turn(Option<TurnEnd>),
    /// No round of this session has that id (a late answer): dropped.
    Nobody,
}

/// One session and everything the router keeps about it.
pub(crate) struct SessionEntry {
    /// The session: servers, conversation, model, what the user allowed.
    pub(crate) session: Session,
    /// Where it is in its life.
    pub(crate) lifecycle: Lifecycle,
    /// The running prompt turn, if any (SPEC A3: at most one).
    pub(crate) turn: Option<Turn>,
    /// A prompt `(request, text)` waiting for the session to be free: behind a cancelled
    /// turn, an answer that waits for the disk, or the session's own start (SPEC A3).
    pub(crate) queued: Option<(RpcId, String)>,
}

impl SessionEntry {
    /// A `Starting` entry for `session`, opened by `request`.
    pub(crate) fn starting(session: Session, request: RpcId) -> SessionEntry {
        SessionEntry {
            session,
            lifecycle: Lifecycle::Starting { request },
            turn: None,
            queued: None,
        }
    }

    /// Whether the opening request is not answered yet (`Starting` or `Opening`).
    pub(crate) fn is_starting(&self) -> bool {
        matches!(
            self.lifecycle,
            Lifecycle::Starting { .. } | Lifecycle::Opening { .. }
        )
    }

    /// The request opening the session while it is not answered yet (`Starting` or
    /// `Opening`).
    pub(crate) fn opening_request(&self) -> Option<&RpcId> {
        match &self.lifecycle {
            Lifecycle::Starting { request } | Lifecycle::Opening { request, .. } => Some(request),
            Lifecycle::Open | Lifecycle::Ending { .. } => None,
        }
    }

    /// Whether the session is `Starting` (before its opening).
    pub(crate) fn is_before_opening(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Starting { .. })
    }

    /// Whether the session is `Open`.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Open)
    }

    /// Whether the session is `Ending` (it takes no more prompts).
    pub(crate) fn is_ending(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Ending { .. })
    }

    /// The undecided `_SessionEnd` round, if any.
    pub(crate) fn ending_round(&self) -> Option<&Ending> {
        match &self.lifecycle {
            Lifecycle::Ending { round } => round.as_ref(),
            Lifecycle::Starting { .. } | Lifecycle::Opening { .. } | Lifecycle::Open => None,
        }
    }

    /// `Starting` → `Opening`: every server is ready; `_SessionStart` and the interceptor
    /// listings start (SPEC H10, X1). Any other state: nothing happens (false).
    pub(crate) fn begin_opening(&mut self, source: Source, cx: &mut McpCx<'_>) -> bool {
        let Lifecycle::Starting { request } = &self.lifecycle else {
            return false;
        };
        let request = request.clone();
        let opening = Opening::start(source, &self.session, cx);
        self.lifecycle = Lifecycle::Opening { request, opening };
        true
    }

    /// A page of `server`'s `interceptors/list` came back (SPEC X1); false (dropped) when
    /// the session is not `Opening`.
    pub(crate) fn on_interceptor_list(
        &mut self,
        server: crate::ids::ServerSlot,
        reply: Result<serde_json::Value, crate::mcp::ListLost>,
        cx: &mut McpCx<'_>,
    ) -> bool {
        let Lifecycle::Opening { opening, .. } = &mut self.lifecycle else {
            return false;
        };
        opening.on_list_reply(server, reply, &self.session, cx);
        true
    }

    /// `Opening` → `Open` once the round and the listings are decided: the texts wait for the
    /// first prompt, the interceptors screen the calls (SPEC H10, X1). Returns how the session
    /// was opened and the request to answer; `None` (no change) when not decided yet or not
    /// `Opening`.
    pub(crate) fn finish_opening(
        &mut self,
        out: &mut crate::outbox::Outbox,
    ) -> Option<(Source, RpcId)> {
        if !matches!(&self.lifecycle, Lifecycle::Opening { opening, .. } if opening.is_done()) {
            return None;
        }
        let Lifecycle::Opening { request, opening } =
            std::mem::replace(&mut self.lifecycle, Lifecycle::Open)
        else {
            return None;
        };
        let source = opening.source();
        let (texts, interceptors) = opening.finish(&self.session, out);
        self.session.start_texts = texts;
        self.session.interceptors = interceptors;
        Some((source, request))
    }

    /// Shutdown refuses the opening request, which is returned for the caller to answer:
    /// `Starting` → `Ending` without a round (the session never opened); `Opening` → `Open`,
    /// its round and listings abandoned, so that [`SessionEntry::begin_ending`] gives it the
    /// `_SessionEnd` round every session that opened gets (SPEC H11). Other states: `None`.
    pub(crate) fn refuse_opening(&mut self) -> Option<RpcId> {
        match std::mem::replace(&mut self.lifecycle, Lifecycle::Open) {
            Lifecycle::Starting { request } => {
                self.lifecycle = Lifecycle::Ending { round: None };
                Some(request)
            }
            Lifecycle::Opening { request, .. } => Some(request),
            other @ (Lifecycle::Open | Lifecycle::Ending { .. }) => {
                self.lifecycle = other;
                None
            }
        }
    }

    /// `Open` → `Ending` (SPEC H11): the `_SessionEnd` round starts for `reason`, `close`
    /// being the `session/close` request to answer when it is decided. Any other state:
    /// nothing happens (false), so a session ends at most once.
    pub(crate) fn begin_ending(
        &mut self,
        reason: EndReason,
        close: Option<RpcId>,
        cx: &mut McpCx<'_>,
    ) -> bool {
        if !self.is_open() {
            return false;
        }
        let round = Ending::start(reason, close, &self.session, cx);
        self.lifecycle = Lifecycle::Ending { round: Some(round) };
        true
    }

    /// The `_SessionEnd` round once it is decided: its texts are logged (SPEC H11) and it is
    /// taken out; returns why the session ended and the `session/close` request to answer
    /// (`None` at shutdown). `None` while undecided or without a round.
    pub(crate) fn finish_ending(
        &mut self,
        out: &mut crate::outbox::Outbox,
    ) -> Option<(EndReason, Option<RpcId>)> {
        let Lifecycle::Ending { round } = &mut self.lifecycle else {
            return None;
        };
        if !round.as_ref().is_some_and(Ending::is_done) {
            return None;
        }
        let ending = round.take()?;
        let reason = ending.reason();
        Some((reason, ending.finish(&self.session, out)))
    }

    /// A hook call of round `round` ended (SPEC H3, H4): it goes to the `_SessionStart`
    /// round of the opening, the `_SessionEnd` round of the ending, or a round of the running
    /// turn, whichever has that id.
    pub(crate) fn on_hook_outcome(
        &mut self,
        round: HookRoundId,
        index: usize,
        outcome: HookOutcome,
        cx: &mut Cx<'_>,
    ) -> HookRouted {
        match &mut self.lifecycle {
            Lifecycle::Opening { opening, .. } if opening.has_round(round) => {
                opening.on_hook_outcome(index, outcome, cx.out);
                return HookRouted::Opening;
            }
            Lifecycle::Ending {
                round: Some(ending),
            } if ending.has_round(round) => {
                ending.on_hook_outcome(index, outcome, cx.out);
                return HookRouted::Ending;
            }
            Lifecycle::Starting { .. }
            | Lifecycle::Opening { .. }
            | Lifecycle::Open
            | Lifecycle::Ending { .. } => {}
        }
        match self.turn.as_mut() {
            Some(turn) => {
                HookRouted::Turn(turn.on_hook_outcome(round, index, outcome, &mut self.session, cx))
            }
            None => HookRouted::Nobody,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cx::rig::Parts;
    use crate::ids::SessionId;

    const SID: SessionId = SessionId(1);

    /// A `Starting` entry whose one server `hooks` exposes `_SessionStart` and `_SessionEnd`.
    fn entry(parts: &mut Parts) -> SessionEntry {
        let slot = parts.ready_server(SID, "hooks", &["_SessionStart", "_SessionEnd"]);
        SessionEntry::starting(Session::new(SID, vec![slot]), RpcId::Num(1.into()))
    }

    /// How many MCP requests were just sent.
    fn sent_calls(parts: &mut Parts) -> usize {
        Parts::mcp_lines(&parts.drain()).len()
    }

    #[test]
    fn a2_h10_h11_a_session_goes_starting_opening_open_ending_and_answers_once() {
        let mut parts = Parts::for_tests();
        let mut e = entry(&mut parts);
        assert!(e.is_starting() && e.is_before_opening() && !e.is_open());
        assert!(
            e.finish_opening(&mut parts.out).is_none(),
            "not opening yet"
        );
        assert!(e.begin_opening(Source::New, &mut parts.mcp()));
        assert_eq!(sent_calls(&mut parts), 1, "the _SessionStart call");
        assert!(
            !e.begin_opening(Source::New, &mut parts.mcp()),
            "opens once"
        );
        assert!(e.is_starting() && !e.is_before_opening());
        assert!(
            e.finish_opening(&mut parts.out).is_none(),
            "round undecided"
        );
        let Lifecycle::Opening { opening, .. } = &e.lifecycle else {
            panic!("opening");
        };
        let round = (0..64)
            .map(HookRoundId)
            .find(|r| opening.has_round(*r))
            .expect("the opening's round");
        assert!(matches!(
            e.on_hook_outcome(
                HookRoundId(round.0 + 100),
                0,
                HookOutcome::Dead,
                &mut parts.cx()
            ),
            HookRouted::Nobody
        ));
        assert!(matches!(
            e.on_hook_outcome(round, 0, HookOutcome::Text("hi".into()), &mut parts.cx()),
            HookRouted::Opening
        ));
        let (source, request) = e.finish_opening(&mut parts.out).expect("decided");
        assert_eq!((source, request), (Source::New, RpcId::Num(1.into())));
        assert!(e.is_open() && !e.is_starting());
        assert_eq!(e.session.start_texts, vec![("hooks".into(), "hi".into())]);
        assert!(e.refuse_opening().is_none(), "nothing left to refuse");
        assert!(e.begin_ending(
            EndReason::Close,
            Some(RpcId::Num(2.into())),
            &mut parts.mcp()
        ));
        assert_eq!(sent_calls(&mut parts), 1, "the _SessionEnd call");
        assert!(e.is_ending() && e.ending_round().is_some());
        assert!(
            !e.begin_ending(EndReason::Eof, None, &mut parts.mcp()),
            "a session ends once"
        );
        assert!(e.finish_ending(&mut parts.out).is_none(), "round undecided");
        let ending = e.ending_round().expect("ending");
        let round = (0..64)
            .map(HookRoundId)
            .find(|r| ending.has_round(*r))
            .expect("the ending's round");
        assert!(matches!(
            e.on_hook_outcome(round, 0, HookOutcome::Timeout, &mut parts.cx()),
            HookRouted::Ending
        ));
        let (reason, close) = e.finish_ending(&mut parts.out).expect("decided");
        assert_eq!(
            (reason, close),
            (EndReason::Close, Some(RpcId::Num(2.into())))
        );
        assert!(e.is_ending() && e.ending_round().is_none());
        assert!(e.finish_ending(&mut parts.out).is_none(), "finished once");
    }

    #[test]
    fn p1_h11_shutdown_refuses_the_opening_and_only_an_opened_session_gets_session_end() {
        let mut parts = Parts::for_tests();
        // Starting: refused, ending at once without a round.
        let mut e = entry(&mut parts);
        assert_eq!(e.refuse_opening(), Some(RpcId::Num(1.into())));
        assert!(e.is_ending() && e.ending_round().is_none());
        assert!(!e.begin_ending(EndReason::Eof, None, &mut parts.mcp()));
        assert!(
            parts.drain().is_empty(),
            "no hook call for a session that never opened"
        );
        // Opening: refused, then its _SessionEnd round runs.
        let mut e = entry(&mut parts);
        assert!(e.begin_opening(Source::Load, &mut parts.mcp()));
        parts.drain();
        assert_eq!(e.refuse_opening(), Some(RpcId::Num(1.into())));
        assert!(e.begin_ending(EndReason::Signal, None, &mut parts.mcp()));
        assert_eq!(sent_calls(&mut parts), 1, "the _SessionEnd call");
        assert!(e.ending_round().is_some());
    }
}
