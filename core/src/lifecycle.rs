//! A session's lifecycle points (SPEC A2, H10, H11, X1): what happens between "its servers
//! are ready" and the answer to `session/new` ([`Opening`]), and between "the session ends"
//! and its servers going away ([`Ending`]).
//!
//! - **Opening.** When every server of a session is ready (after `session/new`; `session/load`
//!   calls the same trigger), the agent starts an [`Opening`]: the `_SessionStart` hook round
//!   (H10) and, for every interceptor server (`BUZZ_AGENT_INTERCEPTOR_SERVERS`), its
//!   `interceptors/list` (X1), all at once. The answer to the request that opened the session
//!   waits for both, so it is delayed by at most one hook timeout (each request has that
//!   deadline; a paginated listing one per page). The decided round's texts wait in the
//!   session for its first prompt.
//! - **Ending.** When a session ends (`session/close`, or the agent shuts down by EOF, signal or
//!   a dead client), its `_SessionEnd` round runs (H11) with the reason and the prompt count;
//!   its texts are logged, never injected; it is decided within one hook timeout.
//!
//! Both are owned by the agent, stored in the [`Session`] while they run, and take their
//! inputs from the agent's routing (hook outcomes by round id, `interceptors/list` replies by
//! server).

use crate::config::{HookAllowlist, LogLevel};
use crate::cx::McpCx;
use crate::hooks::{EndReason, HookMeta, HookOutcome, HookPoint, HookRound};
use crate::ids::{HookRoundId, McpRequestId, ServerSlot};
use crate::interceptor::Interceptor;
use crate::interceptor::Interceptors;
use crate::interceptor::wire::{LIST_METHOD, ListResult, TOOLS_CALL, list_params};
use crate::jsonrpc::{RpcError, RpcId};
use crate::mcp::{ListLost, McpRequest, Purpose};
use crate::outbox::Outbox;
use crate::session::Session;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// `interceptors/list` pages followed at most per server (as `tools/list`, SPEC M2).
const MAX_LIST_PAGES: u32 = 100;

/// How a session was opened, sent to `_SessionStart` as `source` (SPEC H10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// `session/new`.
    New,
    /// `session/load`: a stored session, replayed to the client (SPEC A9).
    Load,
    /// `session/resume`: a stored session, not replayed (SPEC A9).
    Resume,
}

impl Source {
    /// The wire word.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::New => "new",
            Source::Load => "load",
            Source::Resume => "resume",
        }
    }
}

/// One interceptor server's `interceptors/list` (SPEC X1).
#[derive(Debug)]
struct Listing {
    name: String,
    /// The page in flight.
    request: Option<McpRequestId>,
    found: Vec<Interceptor>,
    cursors: BTreeSet<String>,
    pages: u32,
    /// `Some(Ok)` when listed, `Some(Err(why))` when the listing failed.
    done: Option<Result<(), String>>,
}

/// The opening of a session (see the module docs).
#[derive(Debug)]
pub(crate) struct Opening {
    source: Source,
    round: HookRound,
    /// Interceptor servers by slot, in registration order.
    listings: BTreeMap<ServerSlot, Listing>,
    /// Registration order of the interceptor servers.
    order: Vec<ServerSlot>,
    /// Interceptor servers the allowlist names that the session does not have (SPEC S4: a
    /// gate that is missing blocks, it is never silently dropped).
    missing: Vec<String>,
}

impl Opening {
    /// `sess`'s servers are all ready: the `_SessionStart` round and every interceptor
    /// server's `interceptors/list` start now (SPEC H10, X1).
    pub(crate) fn start(source: Source, sess: &Session, cx: &mut McpCx<'_>) -> Opening {
        let meta = HookMeta {
            attempt: 1,
            budget_remaining: cx.cfg.stop_max_rejections,
            source: Some(source.as_str()),
            reason: None,
            prompt_count: None,
        };
        let round = HookRound::start(HookPoint::SessionStart, sess, meta, cx);
        let mut opening = Opening {
            source,
            round,
            listings: BTreeMap::new(),
            order: Vec::new(),
            missing: Vec::new(),
        };
        if let HookAllowlist::Names(names) = &cx.cfg.interceptor_servers {
            let present: BTreeSet<String> =
                sess.servers.iter().map(|s| cx.servers.name(*s)).collect();
            opening.missing = names
                .iter()
                .filter(|n| !present.contains(*n))
                .cloned()
                .collect();
        }
        for (slot, name, ready) in cx
            .servers
            .allowed(&sess.servers, &cx.cfg.interceptor_servers)
        {
            opening.order.push(slot);
            let mut listing = Listing {
                name,
                request: None,
                found: Vec::new(),
                cursors: BTreeSet::new(),
                pages: 0,
                done: None,
            };
            if ready {
                listing.request = send_list(slot, None, sess, cx);
            }
            if listing.request.is_none() {
                listing.done = Some(Err("the server is not ready".into()));
            }
            opening.listings.insert(slot, listing);
        }
        opening
    }

    /// How the session was opened.
    pub(crate) fn source(&self) -> Source {
        self.source
    }

    /// Whether the `_SessionStart` round has id `round`.
    pub(crate) fn has_round(&self, round: HookRoundId) -> bool {
        self.round.id() == round
    }

    /// Call `index` of the `_SessionStart` round ended.
    pub(crate) fn on_hook_outcome(&mut self, index: usize, outcome: HookOutcome, out: &mut Outbox) {
        self.round.on_outcome(index, outcome, out);
    }

    /// A page of `server`'s `interceptors/list` was answered (or its server died): the
    /// descriptors that hook `tools/call` are kept and the next page is asked for; `-32601`
    /// (the server has no interceptors) ends the listing with none; any other error, a
    /// malformed result or a death fails it (SPEC X1: the session's calls are then denied).
    pub(crate) fn on_list_reply(
        &mut self,
        server: ServerSlot,
        reply: Result<Value, ListLost>,
        sess: &Session,
        cx: &mut McpCx<'_>,
    ) {
        let Some(listing) = self.listings.get_mut(&server) else {
            return;
        };
        if listing.done.is_some() {
            return;
        }
        listing.request = None;
        let result = match reply {
            Ok(v) => v,
            Err(ListLost::Error(e)) if e.code == RpcError::METHOD_NOT_FOUND => {
                cx.out.log(
                    LogLevel::Info,
                    format!(
                        "interceptor: server '{}' does not implement interceptors/list; it has no interceptors",
                        listing.name
                    ),
                );
                listing.done = Some(Ok(()));
                return;
            }
            Err(ListLost::Error(e)) => {
                listing.done = Some(Err(format!(
                    "interceptors/list was rejected: {} {}",
                    e.code, e.message
                )));
                return;
            }
            Err(ListLost::Lost(why)) => {
                listing.done = Some(Err(why));
                return;
            }
        };
        let page = match ListResult::from_value(&result) {
            Ok(p) => p,
            Err(e) => {
                listing.done = Some(Err(format!("malformed interceptors/list result: {e}")));
                return;
            }
        };
        // S4: a descriptor that cannot be understood is a gate of unknown shape; leaving it
        // out would drop it silently, so the listing fails (the session's calls are blocked).
        if !page.rejected.is_empty() {
            let why: Vec<String> = page.rejected.iter().map(ToString::to_string).collect();
            listing.done = Some(Err(format!(
                "it listed an interceptor that cannot be understood: {}",
                why.join("; ")
            )));
            return;
        }
        listing.found.extend(page.interceptors);
        listing.pages += 1;
        match page.next_cursor.filter(|c| !c.is_empty()) {
            Some(c) if !listing.cursors.contains(&c) && listing.pages < MAX_LIST_PAGES => {
                listing.cursors.insert(c.clone());
                listing.request = send_list(server, Some(c), sess, cx);
                if listing.request.is_none() {
                    listing.done = Some(Err("the server is gone".into()));
                }
            }
            Some(_) => {
                cx.out.log(
                    LogLevel::Warn,
                    format!(
                        "interceptor: server '{}': interceptors/list repeated a cursor or passed {MAX_LIST_PAGES} pages; stopping",
                        listing.name
                    ),
                );
                listing.done = Some(Ok(()));
            }
            None => listing.done = Some(Ok(())),
        }
    }

    /// Whether the round is decided and every listing is done.
    pub(crate) fn is_done(&self) -> bool {
        self.round.is_decided() && self.listings.values().all(|l| l.done.is_some())
    }

    /// The `_SessionStart` texts (registration order) and the session's interceptors, logged
    /// (SPEC H9, X1). Call once [`Opening::is_done`].
    pub(crate) fn finish(
        self,
        sess: &Session,
        out: &mut Outbox,
    ) -> (Vec<(String, String)>, Interceptors) {
        let texts = self.round.texts();
        let mut interceptors = Interceptors::default();
        let mut listings = self.listings;
        for slot in &self.order {
            let Some(listing) = listings.remove(slot) else {
                continue;
            };
            match listing.done.unwrap_or_else(|| Err("no answer".to_string())) {
                Ok(()) => {
                    let names: Vec<String> = listing
                        .found
                        .iter()
                        .filter(|i| i.hooks_event_any_phase(TOOLS_CALL))
                        .map(|i| format!("{} ({})", i.name, i.kind.as_str()))
                        .collect();
                    out.log(
                        LogLevel::Info,
                        format!(
                            "interceptor: session {}: server '{}' intercepts tools/call with {}",
                            sess.id,
                            listing.name,
                            if names.is_empty() {
                                "nothing".to_string()
                            } else {
                                names.join(", ")
                            }
                        ),
                    );
                    interceptors.add(&listing.name, *slot, listing.found);
                }
                Err(why) => {
                    out.log(
                        LogLevel::Error,
                        format!(
                            "interceptor: session {}: server '{}' could not list its interceptors ({why}); every tool call of the session is blocked (fail-closed)",
                            sess.id, listing.name
                        ),
                    );
                    interceptors.add_broken(&listing.name, why);
                }
            }
        }
        for name in self.missing {
            out.log(
                LogLevel::Error,
                format!(
                    "interceptor: session {}: interceptor server '{name}' is allowlisted but not in the session; every tool call of the session is blocked (fail-closed)",
                    sess.id
                ),
            );
            interceptors.add_broken(&name, "the session has no server of that name".into());
        }
        (texts, interceptors)
    }
}

/// Sends one page of `interceptors/list` for `tools/call` (SPEC X1), with the hook timeout.
fn send_list(
    slot: ServerSlot,
    cursor: Option<String>,
    sess: &Session,
    cx: &mut McpCx<'_>,
) -> Option<McpRequestId> {
    let mut params = list_params(Some(TOOLS_CALL));
    if let Some(c) = cursor {
        params["cursor"] = json!(c);
    }
    cx.servers.send_request(
        slot,
        McpRequest {
            method: LIST_METHOD,
            params: &params,
            purpose: Purpose::ListInterceptors(sess.id),
            timeout_ms: cx.cfg.hook_timeout_ms,
        },
        cx.out,
        cx.timers,
    )
}

/// The ending of a session (see the module docs).
#[derive(Debug)]
pub(crate) struct Ending {
    round: HookRound,
    reason: EndReason,
    /// The `session/close` request to answer when the session is gone.
    close: Option<RpcId>,
}

impl Ending {
    /// `sess` ends for `reason`: its `_SessionEnd` round starts (SPEC H11); `close` is the
    /// `session/close` request, if that is why.
    pub(crate) fn start(
        reason: EndReason,
        close: Option<RpcId>,
        sess: &Session,
        cx: &mut McpCx<'_>,
    ) -> Ending {
        let meta = HookMeta {
            attempt: 1,
            budget_remaining: cx.cfg.stop_max_rejections,
            source: None,
            reason: Some(reason),
            prompt_count: Some(sess.prompts),
        };
        cx.out.log(
            LogLevel::Info,
            format!(
                "session {}: ending ({}, {} prompt(s))",
                sess.id,
                reason.as_str(),
                sess.prompts
            ),
        );
        Ending {
            round: HookRound::start(HookPoint::SessionEnd, sess, meta, cx),
            reason,
            close,
        }
    }

    /// Whether the `_SessionEnd` round has id `round`.
    pub(crate) fn has_round(&self, round: HookRoundId) -> bool {
        self.round.id() == round
    }

    /// Call `index` of the round ended.
    pub(crate) fn on_hook_outcome(&mut self, index: usize, outcome: HookOutcome, out: &mut Outbox) {
        self.round.on_outcome(index, outcome, out);
    }

    /// Whether the round is decided.
    pub(crate) fn is_done(&self) -> bool {
        self.round.is_decided()
    }

    /// The servers whose `_SessionEnd` call is undecided (a shutdown keeps them open).
    pub(crate) fn waiting_servers(&self) -> impl Iterator<Item = ServerSlot> + '_ {
        self.round.waiting_servers()
    }

    /// Why the session ended.
    pub(crate) fn reason(&self) -> EndReason {
        self.reason
    }

    /// The decided round's texts are logged, never injected (SPEC H11); returns the
    /// `session/close` request to answer, if any.
    pub(crate) fn finish(self, sess: &Session, out: &mut Outbox) -> Option<RpcId> {
        for (server, text) in self.round.texts() {
            let shown = crate::text::utf8_prefix(&text, 2000);
            out.log(
                LogLevel::Info,
                format!(
                    "hook: _SessionEnd of session {} answered by '{server}': {shown:?}",
                    sess.id
                ),
            );
        }
        self.close
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HookAllowlist;
    use crate::cx::rig::Parts;
    use crate::ids::SessionId;
    use crate::interceptor::Phase;

    const SID: SessionId = SessionId(1);

    /// A server's `-32601` answer to `interceptors/list` (it has no interceptors).
    fn not_implemented() -> Result<Value, ListLost> {
        Err(ListLost::Error(RpcError::new(
            RpcError::METHOD_NOT_FOUND,
            "Method not found",
        )))
    }

    #[test]
    fn h10_the_opening_runs_session_start_hooks_and_keeps_their_texts_in_order() {
        let mut parts = Parts::for_tests();
        let sess = parts.session_with(
            SID,
            &[
                ("a", &["_SessionStart"]),
                ("b", &["_Stop"]),
                ("c", &["_SessionStart"]),
            ],
        );
        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        let calls = Parts::mcp_lines(&parts.drain());
        assert_eq!(calls.len(), 2, "only the servers exposing _SessionStart");
        assert_eq!(
            calls[0]["params"],
            json!({"name": "_SessionStart", "arguments": {}, "_meta": {"buzz/hook": {
                "point": "_SessionStart", "sessionId": "sess_1", "attempt": 1,
                "budgetRemaining": 3, "source": "new"}}})
        );
        assert!(!opening.is_done());
        let round = opening.round.id();
        assert!(opening.has_round(round) && !opening.has_round(HookRoundId(round.0 + 1)));
        opening.on_hook_outcome(1, HookOutcome::Text("from c".into()), &mut parts.out);
        opening.on_hook_outcome(0, HookOutcome::Text("from a".into()), &mut parts.out);
        assert!(opening.is_done());
        let (texts, interceptors) = opening.finish(&sess, &mut parts.out);
        assert_eq!(
            texts,
            vec![("a".into(), "from a".into()), ("c".into(), "from c".into())]
        );
        assert!(!interceptors.screens(Phase::Request));
    }

    #[test]
    fn x1_the_opening_lists_interceptors_with_pages_and_a_32601_means_none() {
        let mut parts = Parts::for_tests();
        parts.cfg.interceptor_servers = HookAllowlist::Names(vec!["p".into(), "q".into()]);
        let sess = parts.session_with(SID, &[("p", &[]), ("q", &["echo"]), ("r", &[])]);
        let (p, q) = (sess.servers[0], sess.servers[1]);
        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        let asked = Parts::mcp_lines(&parts.drain());
        assert_eq!(asked.len(), 2, "only the allowlisted servers: {asked:#?}");
        assert_eq!(asked[0]["method"], "interceptors/list");
        assert_eq!(asked[0]["params"], json!({"event": "tools/call"}));
        assert!(
            !opening.is_done(),
            "a round without targets is decided; the lists are not"
        );
        let descriptor = |name: &str, event: &str| {
            json!({"name": name, "type": "validation",
                "hooks": [{"events": [event], "phase": "request"}]})
        };
        opening.on_list_reply(
            p,
            Ok(json!({"interceptors": [descriptor("guard", "tools/call"),
                descriptor("prompts", "prompts/get")], "nextCursor": "2"})),
            &sess,
            &mut parts.mcp(),
        );
        let next = Parts::mcp_lines(&parts.drain());
        assert_eq!(
            next[0]["params"],
            json!({"event": "tools/call", "cursor": "2"})
        );
        opening.on_list_reply(
            p,
            Ok(json!({"interceptors": [descriptor("all", "*")]})),
            &sess,
            &mut parts.mcp(),
        );
        opening.on_list_reply(q, not_implemented(), &sess, &mut parts.mcp());
        assert!(opening.is_done());
        let (_, interceptors) = opening.finish(&sess, &mut parts.out);
        let names: Vec<&str> = interceptors
            .members()
            .iter()
            .map(|m| m.interceptor.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["guard", "all"],
            "tools/call only, wildcards included"
        );
        assert!(interceptors.screens(Phase::Request));
        assert!(
            !interceptors.screens(Phase::Response),
            "no member hooks the response phase"
        );
    }

    /// Answers `server`'s pending `interceptors/list` with one validator `name` and
    /// `next_cursor`; returns the cursors asked for next and the log lines.
    fn list_page(
        opening: &mut Opening,
        server: ServerSlot,
        name: &str,
        next_cursor: &str,
        sess: &Session,
        parts: &mut Parts,
    ) -> (Vec<Value>, Vec<String>) {
        opening.on_list_reply(
            server,
            Ok(json!({"interceptors": [{"name": name, "type": "validation",
                "hooks": [{"events": ["tools/call"], "phase": "request"}]}],
                "nextCursor": next_cursor})),
            sess,
            &mut parts.mcp(),
        );
        let actions = parts.drain();
        let cursors = Parts::mcp_lines(&actions)
            .iter()
            .map(|l| l["params"]["cursor"].clone())
            .collect();
        (cursors, Parts::logs(&actions))
    }

    #[test]
    fn x1_a_listing_stops_at_a_repeated_cursor_or_after_100_pages() {
        let mut parts = Parts::for_tests();
        parts.cfg.interceptor_servers = HookAllowlist::All;
        let sess = parts.session_with(SID, &[("p", &[])]);
        let p = sess.servers[0];
        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        parts.drain();
        let (asked, _) = list_page(&mut opening, p, "one", "a", &sess, &mut parts);
        assert_eq!(asked, [json!("a")]);
        let (asked, logs) = list_page(&mut opening, p, "two", "a", &sess, &mut parts);
        assert!(asked.is_empty(), "cursor a again: {asked:?}");
        assert_eq!(
            logs,
            [
                "interceptor: server 'p': interceptors/list repeated a cursor or passed 100 pages; stopping"
            ]
        );
        assert!(opening.is_done());
        let (_, interceptors) = opening.finish(&sess, &mut parts.out);
        assert_eq!(interceptors.members().len(), 2, "both pages count");
        parts.drain();

        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        parts.drain();
        let mut pages = 0;
        while !opening.is_done() && pages < 1000 {
            pages += 1;
            let (asked, logs) =
                list_page(&mut opening, p, "x", &pages.to_string(), &sess, &mut parts);
            let last = pages == MAX_LIST_PAGES;
            assert_eq!(asked.len(), usize::from(!last), "page {pages}");
            assert_eq!(logs.len(), usize::from(last), "page {pages}: {logs:?}");
        }
        assert_eq!(pages, MAX_LIST_PAGES, "the first page and 99 more");
    }

    #[test]
    fn x1_a_listing_that_fails_or_dies_makes_the_session_fail_closed() {
        let mut parts = Parts::for_tests();
        parts.cfg.interceptor_servers = HookAllowlist::All;
        let sess = parts.session_with(SID, &[("p", &[]), ("q", &[])]);
        let (p, q) = (sess.servers[0], sess.servers[1]);
        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        opening.on_list_reply(
            p,
            Err(ListLost::Error(RpcError::new(-32603, "boom"))),
            &sess,
            &mut parts.mcp(),
        );
        opening.on_list_reply(
            q,
            Err(ListLost::Lost(
                "interceptors/list timed out after 2500 ms".into(),
            )),
            &sess,
            &mut parts.mcp(),
        );
        assert!(opening.is_done());
        let (_, interceptors) = opening.finish(&sess, &mut parts.out);
        assert!(interceptors.screens(Phase::Request) && interceptors.screens(Phase::Response));
        let logs = Parts::logs(&parts.drain());
        assert!(
            logs.iter().any(|l| l.contains(
                "server 'p' could not list its interceptors (interceptors/list was rejected: -32603 boom)"
            )),
            "an error other than -32601 fails the listing: {logs:#?}"
        );
        assert!(
            logs.iter().any(|l| l.contains(
                "server 'q' could not list its interceptors (interceptors/list timed out after 2500 ms); every tool call of the session is blocked"
            )),
            "{logs:#?}"
        );
    }

    #[test]
    fn s4_an_allowlisted_interceptor_server_missing_from_the_session_blocks_with_one_line() {
        let mut parts = Parts::for_tests();
        parts.cfg.interceptor_servers = HookAllowlist::Names(vec!["p".into(), "guard".into()]);
        let sess = parts.session_with(SID, &[("p", &[]), ("fs", &["echo"])]);
        let p = sess.servers[0];
        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        let asked = Parts::mcp_lines(&parts.drain());
        assert_eq!(asked.len(), 1, "only p can be asked: {asked:#?}");
        opening.on_list_reply(p, not_implemented(), &sess, &mut parts.mcp());
        assert!(opening.is_done());
        let (_, interceptors) = opening.finish(&sess, &mut parts.out);
        assert!(
            interceptors.screens(Phase::Request) && interceptors.screens(Phase::Response),
            "a missing gate blocks both phases"
        );
        let logs = Parts::logs(&parts.drain());
        let missing: Vec<&String> = logs.iter().filter(|l| l.contains("'guard'")).collect();
        assert_eq!(
            missing,
            [
                "interceptor: session sess_1: interceptor server 'guard' is allowlisted but not in the session; every tool call of the session is blocked (fail-closed)"
            ],
            "{logs:#?}"
        );

        // `*` names no server in particular: nothing can be missing.
        parts.cfg.interceptor_servers = HookAllowlist::All;
        let sess = parts.session_with(SID, &[("fs", &["echo"])]);
        let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        opening.on_list_reply(sess.servers[0], not_implemented(), &sess, &mut parts.mcp());
        let (_, interceptors) = opening.finish(&sess, &mut parts.out);
        assert!(!interceptors.screens(Phase::Request));
    }

    #[test]
    fn s4_a_descriptor_that_cannot_be_understood_fails_the_listing_at_session_start() {
        for bad in [
            json!({"name": "typo", "type": "validaton",
                "hooks": [{"events": ["tools/call"], "phase": "request"}]}),
            json!({"name": "typo", "type": "validation",
                "hooks": [{"events": ["tools/call"], "phase": "reqest"}]}),
        ] {
            let mut parts = Parts::for_tests();
            parts.cfg.interceptor_servers = HookAllowlist::Names(vec!["p".into()]);
            let sess = parts.session_with(SID, &[("p", &[])]);
            let p = sess.servers[0];
            let mut opening = Opening::start(Source::New, &sess, &mut parts.mcp());
            parts.drain();
            opening.on_list_reply(
                p,
                Ok(json!({"interceptors": [
                    {"name": "fine", "type": "validation",
                        "hooks": [{"events": ["tools/call"], "phase": "request"}]},
                    bad], "nextCursor": "2"})),
                &sess,
                &mut parts.mcp(),
            );
            assert!(
                Parts::mcp_lines(&parts.drain()).is_empty(),
                "no next page is asked for once the listing failed"
            );
            assert!(opening.is_done());
            let (_, interceptors) = opening.finish(&sess, &mut parts.out);
            assert!(interceptors.members().is_empty());
            assert!(interceptors.screens(Phase::Request), "{bad}: fails closed");
            let logs = Parts::logs(&parts.drain());
            assert_eq!(logs.len(), 1, "one clear line: {logs:#?}");
            assert!(
                logs[0].starts_with("interceptor: session sess_1: server 'p' could not list its interceptors (it listed an interceptor that cannot be understood: interceptor \"typo\": ")
                    && logs[0].ends_with("every tool call of the session is blocked (fail-closed)"),
                "{logs:#?}"
            );
        }
    }

    /// `hooks check` calls each session point with `hooks::first_call_params`: the very params
    /// a new session's opening and a prompt-less session's close send.
    #[test]
    fn p3_hooks_checks_params_are_what_the_opening_and_the_ending_send() {
        let mut parts = Parts::for_tests();
        let budget = parts.cfg.stop_max_rejections;
        let sess = parts.session_with(SID, &[("a", &["_SessionStart", "_SessionEnd"])]);
        let _opening = Opening::start(Source::New, &sess, &mut parts.mcp());
        let _ending = Ending::start(EndReason::Close, None, &sess, &mut parts.mcp());
        let calls = Parts::mcp_lines(&parts.drain());
        let sid = sess.id.to_string();
        assert_eq!(
            calls[0]["params"],
            crate::hooks::first_call_params(HookPoint::SessionStart, &sid, budget)
        );
        assert_eq!(
            calls[1]["params"],
            crate::hooks::first_call_params(HookPoint::SessionEnd, &sid, budget)
        );
    }

    #[test]
    fn h11_the_ending_tells_the_reason_and_prompt_count_and_only_logs_the_answers() {
        let mut parts = Parts::for_tests();
        let mut sess = parts.session_with(SID, &[("mem", &["_SessionEnd"])]);
        sess.prompts = 4;
        let mut ending = Ending::start(
            EndReason::Close,
            Some(RpcId::Num(9.into())),
            &sess,
            &mut parts.mcp(),
        );
        let call = &Parts::mcp_lines(&parts.drain())[0];
        assert_eq!(
            call["params"]["_meta"]["buzz/hook"],
            json!({"point": "_SessionEnd", "sessionId": "sess_1", "attempt": 1,
                "budgetRemaining": 3, "reason": "close", "promptCount": 4})
        );
        assert_eq!(ending.waiting_servers().collect::<Vec<_>>(), sess.servers);
        assert!(!ending.is_done(), "the call waits");
        let round = ending.round.id();
        assert!(ending.has_round(round) && !ending.has_round(HookRoundId(round.0 + 1)));
        ending.on_hook_outcome(0, HookOutcome::Text("saved 3 notes".into()), &mut parts.out);
        assert!(ending.is_done());
        assert_eq!(ending.waiting_servers().count(), 0);
        assert_eq!(ending.reason(), EndReason::Close);
        assert_eq!(
            ending.finish(&sess, &mut parts.out),
            Some(RpcId::Num(9.into()))
        );
        let logs = Parts::logs(&parts.drain());
        assert!(
            logs.iter()
                .any(|l| l
                    == "hook: _SessionEnd of session sess_1 answered by 'mem': \"saved 3 notes\""),
            "{logs:#?}"
        );
        assert!(sess.transcript.messages().is_empty(), "never injected");
    }
}
