//! The tool calls of one model response (SPEC L2, L3, A4, A6, A7, M4, X1): the [`ToolBatch`]
//! announces each call to the client, decides the ones that cannot run (too many, unknown,
//! bad arguments, denied), screens the rest through the session's interceptors (X1, request
//! phase), asks permission where needed, dispatches them to their servers at most
//! `BUZZ_AGENT_MAX_PARALLEL_TOOLS` at a time, screens each result (X1, response phase), and
//! gives the results back in call order.

use crate::acp::PermissionAnswer;
use crate::config::PermissionMode;
use crate::cx::ToolCx;
use crate::ids::{McpRequestId, PermissionRequestId, ServerSlot, SessionId, ToolCallIndex, TurnNo};
use crate::intercept::{Screen, ScreenOf, ScreenVerdict};
use crate::interceptor::Interceptors;
use crate::interceptor::{InvokeReply, Phase};
use crate::jsonrpc;
use crate::llm::{Message, ToolCall};
use crate::mcp::{Builtin, InterceptRef, McpRequest, Purpose, ToolCallRef, ToolRoute, ToolTarget};
use crate::permissions::PermissionRequest;
use crate::session::Session;
use crate::store::AnnouncedCall;
use crate::time::MonoTime;
use crate::tools::ToolOutput;
use crate::{io::Action, jsonrpc::RpcError};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Tool calls of one response that are run at most (SPEC L2).
pub(crate) const MAX_CALLS_PER_RESPONSE: usize = 64;

/// Where one call of the batch is.
#[derive(Debug)]
enum CallState {
    /// The request phase of the interceptor chain runs (SPEC X1).
    Screening(Box<Screen>),
    /// Allowed; waiting for a free place (parallelism cap).
    Queued,
    /// `session/request_permission` sent.
    AwaitPermission(PermissionRequestId),
    /// `tools/call` in flight.
    Running(ServerSlot, McpRequestId),
    /// The response phase of the interceptor chain runs over the result (SPEC X1).
    ScreeningResult(Box<Screen>),
    /// Finished; the result the model will see.
    Done(ToolOutput),
}

/// One call of the batch.
#[derive(Debug)]
struct BatchCall {
    /// The ACP `toolCallId` (`tc_N`).
    acp_id: String,
    call: ToolCall,
    route: Option<ToolRoute>,
    /// The parsed arguments (a JSON object) once accepted.
    args: Value,
    state: CallState,
    /// A built-in tool's result (SPEC A10: `load_skill`), computed from the session when the
    /// call is accepted and given once it may run (after its permission).
    builtin: Option<ToolOutput>,
}

impl BatchCall {
    /// The call's qualified tool name, the key of a remembered permission answer; empty for a
    /// call with no route.
    fn qualified(&self) -> String {
        self.route
            .as_ref()
            .map(|r| r.qualified.clone())
            .unwrap_or_default()
    }
}

/// The tool calls of one response of one turn.
#[derive(Debug)]
pub(crate) struct ToolBatch {
    session: SessionId,
    turn: TurnNo,
    calls: Vec<BatchCall>,
    /// A posting call was dispatched (SPEC G2).
    posted: bool,
    /// The session's interceptors when some screen `tools/call` (SPEC X1).
    interceptors: Option<Interceptors>,
}

impl ToolBatch {
    /// The model asked for `calls` in `turn` of `session`: each is announced (`tool_call`,
    /// pending), the ones that cannot run are decided at once, permission is asked where
    /// `BUZZ_AGENT_PERMISSION=ask` and no `*_always` answer applies, and the rest start
    /// (SPEC L2, A6, A7, M4, I10). `routes` are the tools offered in the request that
    /// produced the calls.
    pub(crate) fn start(
        turn: TurnNo,
        calls: Vec<ToolCall>,
        routes: &BTreeMap<String, ToolRoute>,
        sess: &mut Session,
        cx: &mut ToolCx<'_>,
    ) -> ToolBatch {
        let ask = cx.cfg.permission == PermissionMode::Ask;
        let sid = sess.id;
        let mut pending = Vec::with_capacity(calls.len());
        let mut updates = Vec::with_capacity(calls.len());
        for call in calls {
            let acp_id = format!("tc_{}", sess.transcript.next_call_no());
            let parsed = parse_arguments(&call.arguments);
            let raw_input = match &parsed {
                Ok(v) => v.clone(),
                Err(_) => Value::String(call.arguments.clone()),
            };
            let route = routes.get(&call.name).cloned();
            // C53: title and kind from the MCP tool; an unknown name is shown as it came.
            let (title, kind) = route.as_ref().map_or((call.name.as_str(), "other"), |r| {
                (r.title.as_str(), r.kind)
            });
            updates.push(json!({
                "sessionUpdate": "tool_call", "toolCallId": acp_id, "title": title,
                "kind": kind, "status": "pending", "rawInput": raw_input
            }));
            pending.push((
                BatchCall {
                    acp_id,
                    call,
                    route,
                    args: Value::Null,
                    state: CallState::Queued,
                    builtin: None,
                },
                parsed,
            ));
        }
        let session_id = sid.to_string();
        for u in &updates {
            cx.out.send_update(&session_id, u);
        }
        let announced: Vec<AnnouncedCall<'_>> = pending
            .iter()
            .zip(&updates)
            .enumerate()
            .map(|(index, ((c, _), update))| AnnouncedCall {
                index,
                acp_id: &c.acp_id,
                call: &c.call,
                update,
            })
            .collect();
        cx.store.on_tool_calls(sess, &announced);
        // Decide each call: too many, unknown tool (incl. hooks, M4), bad arguments, permission.
        let mut decided: Vec<(usize, ToolOutput)> = Vec::new();
        let mut asks: Vec<usize> = Vec::new();
        let interceptors = (sess.interceptors.screens(Phase::Request)
            || sess.interceptors.screens(Phase::Response))
        .then(|| sess.interceptors.clone());
        let screen_requests = sess.interceptors.screens(Phase::Request);
        let mut screens: Vec<usize> = Vec::new();
        let mut batch = ToolBatch {
            session: sid,
            turn,
            calls: Vec::with_capacity(pending.len()),
            posted: false,
            interceptors,
        };
        for (i, (mut c, parsed)) in pending.into_iter().enumerate() {
            if i >= MAX_CALLS_PER_RESPONSE {
                decided.push((i, err_out(format!("too many tool calls in one response (limit {MAX_CALLS_PER_RESPONSE}); not run"))));
            } else if c.route.is_none() {
                decided.push((i, err_out(format!("unknown tool: {}", c.call.name))));
            } else {
                match parsed {
                    Err(e) => decided.push((
                        i,
                        err_out(format!(
                            "invalid arguments for {}: {e}; pass a JSON object",
                            c.call.name
                        )),
                    )),
                    Ok(args) if screen_requests && !is_builtin(c.route.as_ref()) => {
                        // X1: the request phase runs before permission and dispatch.
                        c.args = args;
                        screens.push(i);
                    }
                    Ok(args) => {
                        if is_builtin(c.route.as_ref()) {
                            // A built-in runs in the core: no interceptor screens it (X1
                            // screens MCP tools/call); permission is asked as for any tool
                            // (A7).
                            c.builtin = Some(run_builtin(c.route.as_ref(), &args, sess));
                        }
                        c.args = args;
                        match (ask, sess.remembered.get(&c.qualified())) {
                            (false, _) | (true, Some(true)) => {}
                            (true, Some(false)) => decided.push((i, denied_out())),
                            (true, None) => asks.push(i),
                        }
                    }
                }
            }
            batch.calls.push(c);
        }
        for &i in &asks {
            batch.ask_permission(ToolCallIndex(i), cx);
        }
        for (i, out) in decided {
            batch.complete(ToolCallIndex(i), out, true, cx);
        }
        for i in screens {
            batch.start_request_screen(ToolCallIndex(i), &sess.remembered, cx);
        }
        batch.pump(cx);
        batch
    }

    /// Starts the request phase of call `index` (SPEC X1) over `{name, arguments}`.
    fn start_request_screen(
        &mut self,
        index: ToolCallIndex,
        remembered: &BTreeMap<String, bool>,
        cx: &mut ToolCx<'_>,
    ) {
        let (true, Some(c)) = (self.interceptors.is_some(), self.calls.get(index.0)) else {
            return;
        };
        let Some(route) = c.route.as_ref() else {
            return;
        };
        let payload = json!({"name": route.bare, "arguments": c.args});
        let ToolTarget::Server(slot) = route.target else {
            return;
        };
        let server = cx.servers.name(slot);
        self.start_screen(
            index,
            (Phase::Request, payload, &server),
            CallState::Screening,
            remembered,
            cx,
        );
    }

    /// Starts screening call `index`'s `payload` in `phase` (SPEC X1) as a call to `server`;
    /// the call waits in `waiting` until the screen ends.
    fn start_screen(
        &mut self,
        index: ToolCallIndex,
        (phase, payload, server): (Phase, Value, &str),
        waiting: fn(Box<Screen>) -> CallState,
        remembered: &BTreeMap<String, bool>,
        cx: &mut ToolCx<'_>,
    ) {
        let Some(interceptors) = self.interceptors.as_ref() else {
            return;
        };
        let of = self.screen_of(index);
        let screen = Screen::start(interceptors, phase, payload, of, server, &mut cx.mcp());
        if let Some(c) = self.calls.get_mut(index.0) {
            c.state = waiting(Box::new(screen));
        }
        self.after_screen(index, remembered, cx);
    }

    fn screen_of(&self, index: ToolCallIndex) -> ScreenOf {
        ScreenOf {
            session: self.session,
            turn: self.turn,
            index,
        }
    }

    /// An `interceptor/invoke` of call `index` was answered, lost or timed out (SPEC X1).
    /// Anything for a call no longer screening changes nothing (I6).
    pub(crate) fn on_intercept(
        &mut self,
        call: InterceptRef,
        event: InterceptEvent,
        remembered: &mut BTreeMap<String, bool>,
        cx: &mut ToolCx<'_>,
    ) {
        let index = call.index;
        let Some(c) = self.calls.get_mut(index.0) else {
            return;
        };
        let screen = match (&mut c.state, call.response) {
            (CallState::Screening(screen), false) | (CallState::ScreeningResult(screen), true) => {
                screen
            }
            _ => return,
        };
        match event {
            InterceptEvent::Reply(reply) => screen.on_reply(call.invocation, reply, &mut cx.mcp()),
            InterceptEvent::Timeout => screen.on_timeout(call.invocation, &mut cx.mcp()),
        }
        self.after_screen(index, remembered, cx);
        self.pump(cx);
    }

    /// Acts on the verdict of call `index`'s screen, if there is one: the request phase
    /// admits the call (with the mutated arguments, shown as `rawInput`) or fails it with the
    /// denial; the response phase completes it with the (mutated) result or the denial.
    fn after_screen(
        &mut self,
        index: ToolCallIndex,
        remembered: &BTreeMap<String, bool>,
        cx: &mut ToolCx<'_>,
    ) {
        let Some(c) = self.calls.get_mut(index.0) else {
            return;
        };
        let (verdict, response) = match &mut c.state {
            CallState::Screening(screen) => (screen.take_verdict(), false),
            CallState::ScreeningResult(screen) => (screen.take_verdict(), true),
            CallState::Queued
            | CallState::AwaitPermission(_)
            | CallState::Running(..)
            | CallState::Done(_) => return,
        };
        let Some(verdict) = verdict else {
            return;
        };
        match (verdict, response) {
            (ScreenVerdict::Deny(text), _) => self.complete(index, err_out(text), true, cx),
            (ScreenVerdict::Allow { payload, modified }, true) => {
                // A rewritten result that is not a result blocks, as a crash does: it never
                // reaches the model as an empty success (SPEC X1, S4).
                if modified && let Err(why) = check_rewritten_result(&payload) {
                    self.complete(index, err_out(why), true, cx);
                    return;
                }
                let (out, failed) = tool_output(Ok(payload), cx.cfg.max_tool_result_text_bytes);
                self.complete(index, out, failed, cx);
            }
            (ScreenVerdict::Allow { payload, modified }, false) => {
                if modified {
                    if let Err(why) = apply_mutation(c, &payload) {
                        self.complete(index, err_out(why), true, cx);
                        return;
                    }
                    // X1: rawInput shows what actually runs.
                    let update = json!({"sessionUpdate": "tool_call_update",
                        "toolCallId": c.acp_id, "rawInput": c.args});
                    cx.out.send_update(&self.session.to_string(), &update);
                }
                c.state = CallState::Queued;
                self.admit(index, remembered, cx);
            }
        }
    }

    /// Permission for screened call `index` (SPEC A7): remembered answers apply, `ask` sends
    /// the request, `allow` leaves it queued.
    fn admit(
        &mut self,
        index: ToolCallIndex,
        remembered: &BTreeMap<String, bool>,
        cx: &mut ToolCx<'_>,
    ) {
        if cx.cfg.permission != PermissionMode::Ask {
            return;
        }
        let Some(c) = self.calls.get_mut(index.0) else {
            return;
        };
        let qualified = c.qualified();
        match remembered.get(&qualified) {
            Some(true) => {}
            Some(false) => self.complete(index, denied_out(), true, cx),
            None => self.ask_permission(index, cx),
        }
    }

    /// Sends `session/request_permission` for call `index` (SPEC A7) and waits for it, with
    /// `BUZZ_AGENT_PERMISSION_TIMEOUT_SECS`. The request names the server the client
    /// registered and the tool (SPEC S3); the server's own title is only its description.
    fn ask_permission(&mut self, index: ToolCallIndex, cx: &mut ToolCx<'_>) {
        let Some(c) = self.calls.get_mut(index.0) else {
            return;
        };
        let Some(route) = c.route.as_ref() else {
            return;
        };
        // A built-in tool is the agent's own: it names itself (SPEC A10, S3).
        let server = route
            .server()
            .map_or_else(|| "buzz-agent".to_string(), |slot| cx.servers.name(slot));
        // The title the client would see without one from the server (SPEC A6) is no
        // description.
        let unset = format!("{server}: {}", route.bare);
        let who = crate::acp::ToolIdentity {
            server: &server,
            tool: &route.bare,
            server_title: (route.server().is_some() && route.title != unset)
                .then_some(route.title.as_str()),
        };
        let id = cx.ids.next_permission();
        let params = crate::acp::permission_params(
            &self.session.to_string(),
            &c.acp_id,
            who,
            route.kind,
            &c.args,
        );
        let what = format!("{} ({})", who.title(), c.acp_id);
        cx.permissions.insert(
            id,
            PermissionRequest {
                session: self.session,
                turn: self.turn,
                index,
            },
            what,
            cx.out.now(),
            cx.out.now().plus_ms(cx.cfg.permission_timeout_ms),
            cx.timers,
        );
        c.state = CallState::AwaitPermission(id);
        cx.out.push(Action::WriteAcp(jsonrpc::encode_request(
            id.0,
            "session/request_permission",
            &params,
        )));
    }

    /// Whether every call is done (the turn then takes [`ToolBatch::into_results`]).
    pub(crate) fn is_done(&self) -> bool {
        self.calls
            .iter()
            .all(|c| matches!(c.state, CallState::Done(_)))
    }

    /// Whether a posting call was dispatched (SPEC G2).
    pub(crate) fn posted(&self) -> bool {
        self.posted
    }

    /// The tool results in call order (SPEC L2, L4): one per call.
    pub(crate) fn into_results(self) -> Vec<Message> {
        self.calls
            .into_iter()
            .filter_map(|c| match c.state {
                CallState::Done(out) => Some(Message::ToolResult {
                    call_id: c.call.id,
                    name: c.call.name,
                    text: out.text,
                    is_error: out.is_error,
                }),
                CallState::Queued
                | CallState::Screening(_)
                | CallState::AwaitPermission(_)
                | CallState::Running(..)
                | CallState::ScreeningResult(_) => None,
            })
            .collect()
    }

    /// Call `index`'s server answered (a result or a JSON-RPC error, SPEC L3): the result is
    /// screened when interceptors hook the response phase (SPEC X1), else converted and the
    /// call completes. A reply for a call no longer running changes nothing (I6).
    pub(crate) fn on_reply(
        &mut self,
        index: ToolCallIndex,
        reply: Result<Value, RpcError>,
        cx: &mut ToolCx<'_>,
    ) {
        let screened = self
            .interceptors
            .as_ref()
            .filter(|i| i.screens(Phase::Response));
        let running = self
            .calls
            .get(index.0)
            .is_some_and(|c| matches!(c.state, CallState::Running(..)));
        match (reply, screened) {
            (Ok(result), Some(_)) if running => {
                let server = self
                    .calls
                    .get(index.0)
                    .and_then(|c| c.route.as_ref())
                    .and_then(|r| match r.target {
                        ToolTarget::Server(slot) => Some(cx.servers.name(slot)),
                        ToolTarget::Builtin(_) => None,
                    })
                    .unwrap_or_default();
                self.start_screen(
                    index,
                    (Phase::Response, result, &server),
                    CallState::ScreeningResult,
                    &BTreeMap::new(),
                    cx,
                );
                self.pump(cx);
            }
            (reply, _) => {
                let (out, failed) = tool_output(reply, cx.cfg.max_tool_result_text_bytes);
                self.on_result(index, out, failed, cx);
            }
        }
    }

    /// Call `index`'s server answered or failed (reply, error, timeout, death): its terminal
    /// update goes out and the next queued call may start.
    pub(crate) fn on_result(
        &mut self,
        index: ToolCallIndex,
        out: ToolOutput,
        failed: bool,
        cx: &mut ToolCx<'_>,
    ) {
        self.complete(index, out, failed, cx);
        self.pump(cx);
    }

    /// The client answered the permission request of call `index` (or it timed out: denied,
    /// SPEC A7). `*_always` answers are remembered in `remembered` per qualified tool name. An
    /// answer for a call no longer waiting for one changes nothing (I6).
    pub(crate) fn on_permission(
        &mut self,
        index: ToolCallIndex,
        answer: PermissionAnswer,
        remembered: &mut BTreeMap<String, bool>,
        cx: &mut ToolCx<'_>,
    ) {
        let Some(c) = self.calls.get_mut(index.0) else {
            return;
        };
        if !matches!(c.state, CallState::AwaitPermission(_)) {
            return;
        }
        let qualified = c.qualified();
        let allowed = match answer {
            PermissionAnswer::AllowOnce => true,
            PermissionAnswer::AllowAlways => {
                remembered.insert(qualified, true);
                true
            }
            PermissionAnswer::RejectAlways => {
                remembered.insert(qualified, false);
                false
            }
            PermissionAnswer::RejectOnce | PermissionAnswer::Denied => false,
        };
        if allowed {
            c.state = CallState::Queued;
        } else {
            self.complete(index, denied_out(), true, cx);
        }
        self.pump(cx);
    }

    /// `notifications/progress` from `server` for `token` (SPEC A6, case C59): a running call
    /// of this batch at that server whose progress token (its ACP id) it is gets an
    /// `in_progress` update with `text`. Returns whether a call matched.
    pub(crate) fn on_progress(
        &mut self,
        server: ServerSlot,
        token: &Value,
        text: &str,
        cx: &mut ToolCx<'_>,
    ) -> bool {
        let Some(c) = self.calls.iter().find(|c| {
            matches!(c.state, CallState::Running(s, _) if s == server)
                && token.as_str() == Some(c.acp_id.as_str())
        }) else {
            return false;
        };
        let update = json!({
            "sessionUpdate": "tool_call_update", "toolCallId": c.acp_id, "status": "in_progress",
            "content": [crate::tools::text_content(text)]
        });
        cx.out.send_update(&self.session.to_string(), &update);
        true
    }

    /// The turn was cancelled (SPEC A4): calls in flight get `notifications/cancelled`,
    /// permission requests are forgotten, and every unfinished call ends with a failed update.
    pub(crate) fn cancel(&mut self, why: &str, cx: &mut ToolCx<'_>) {
        let cancels: Vec<(usize, CallState)> = self
            .calls
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c.state {
                CallState::Running(server, req) => Some((i, CallState::Running(server, req))),
                CallState::AwaitPermission(id) => Some((i, CallState::AwaitPermission(id))),
                CallState::Queued | CallState::Screening(_) | CallState::ScreeningResult(_) => {
                    Some((i, CallState::Queued))
                }
                CallState::Done(_) => None,
            })
            .collect();
        for (i, state) in cancels {
            match state {
                CallState::Running(server, req) => {
                    cx.servers
                        .cancel_request(server, req, why, cx.out, cx.timers);
                }
                CallState::AwaitPermission(id) => {
                    cx.permissions.take(id, cx.timers);
                }
                CallState::Queued
                | CallState::Screening(_)
                | CallState::ScreeningResult(_)
                | CallState::Done(_) => {}
            }
            if let Some(c) = self.calls.get_mut(i)
                && let CallState::Screening(screen) | CallState::ScreeningResult(screen) =
                    &mut c.state
            {
                // X1: a chain stops mid-way; its invocations in flight are cancelled.
                screen.cancel(why, &mut cx.mcp());
            }
            let out = err_out(format!("tool call cancelled: {why}"));
            self.complete(ToolCallIndex(i), out, true, cx);
        }
    }

    /// Records call `index`'s result and sends its terminal update (SPEC A6); a call already
    /// done keeps its first result.
    fn complete(
        &mut self,
        index: ToolCallIndex,
        out: ToolOutput,
        failed: bool,
        cx: &mut ToolCx<'_>,
    ) {
        let Some(c) = self.calls.get_mut(index.0) else {
            return;
        };
        if matches!(c.state, CallState::Done(_)) {
            return;
        }
        let update = crate::store::result_update(&c.acp_id, failed, &out);
        cx.store
            .on_tool_result(self.session, index.0, &c.acp_id, &c.call, &out, failed);
        c.state = CallState::Done(out);
        cx.out.send_update(&self.session.to_string(), &update);
    }

    /// Whether [`ToolBatch::pump`] would start (or end) a call now: a slot is free and a queued
    /// call's server does not hold it (true once a re-listing, C65, or a restart, SPEC M9,
    /// that held a call is over; `now` decides whether a restart is due).
    pub(crate) fn can_dispatch(
        &self,
        servers: &crate::mcp::ServerTable,
        max_par: usize,
        now: MonoTime,
    ) -> bool {
        let running = self
            .calls
            .iter()
            .filter(|c| matches!(c.state, CallState::Running(..)))
            .count();
        running < max_par
            && self.calls.iter().any(|c| {
                matches!(c.state, CallState::Queued)
                    && c.route
                        .as_ref()
                        .and_then(ToolRoute::server)
                        .is_some_and(|slot| !servers.holds_calls(slot, now))
            })
    }

    /// Dispatches queued calls up to `BUZZ_AGENT_MAX_PARALLEL_TOOLS` (SPEC L2). A call to a
    /// dead server whose restart backoff is over restarts it and waits for it (SPEC M9), as
    /// does a call to a server already restarting; a call whose server is dead within its
    /// backoff, or not ready, ends at once ("recovering", M9); a call whose server is
    /// re-listing its tools waits for the list, and a tool the new list dropped ends with an
    /// error saying so (C65).
    pub(crate) fn pump(&mut self, cx: &mut ToolCx<'_>) {
        let max_par = cx.cfg.max_parallel_tools;
        let timeout = cx.cfg.tool_timeout_ms;
        loop {
            let running = self
                .calls
                .iter()
                .filter(|c| matches!(c.state, CallState::Running(..)))
                .count();
            if running >= max_par {
                break;
            }
            // C65, M9: a call to a server re-listing its tools or restarting waits for it (the
            // turn pumps again once it is over, see `ToolBatch::can_dispatch`).
            let now = cx.out.now();
            let Some(i) = self.calls.iter().position(|c| {
                matches!(c.state, CallState::Queued)
                    && !c
                        .route
                        .as_ref()
                        .and_then(ToolRoute::server)
                        .is_some_and(|slot| cx.servers.holds_calls(slot, now))
            }) else {
                break;
            };
            let c = &mut self.calls[i];
            let Some(ToolRoute {
                target,
                bare,
                qualified,
                ..
            }) = c.route.clone()
            else {
                break;
            };
            let server = match target {
                ToolTarget::Server(slot) => slot,
                ToolTarget::Builtin(_) => {
                    // Its result was computed when it was accepted; it is given now.
                    let out = c.builtin.take().unwrap_or_else(|| {
                        err_out(format!("the built-in tool {bare} has no result"))
                    });
                    let failed = out.is_error;
                    self.complete(ToolCallIndex(i), out, failed, cx);
                    continue;
                }
            };
            // M9: a dead server whose backoff is over restarts for this call, which waits.
            cx.servers.restart_for_call(server, cx.out, cx.timers);
            if cx.servers.holds_calls(server, now) {
                continue;
            }
            let c = &mut self.calls[i];
            let args = c.args.clone();
            let acp_id = c.acp_id.clone();
            if let Some(reason) = cx.servers.unavailable(server) {
                let name = cx.servers.name(server);
                let text =
                    format!("server '{name}' is recovering; the call was not run ({reason})");
                self.complete(ToolCallIndex(i), err_out(text), true, cx);
                continue;
            }
            if !cx.servers.lists_tool(server, &bare) {
                // C65: the server's tool list changed during this round and dropped the tool.
                let name = cx.servers.name(server);
                let text = format!(
                    "tool '{bare}' is no longer offered by server '{name}' (its tool list changed during this round); the call was not run"
                );
                self.complete(ToolCallIndex(i), err_out(text), true, cx);
                continue;
            }
            let posting =
                crate::hooks::counts_as_posting(&bare, &args, &qualified, &cx.cfg.reply_tools);
            // C59: the ACP tool call id is the progress token (unique in the session, and so
            // at its server, which belongs to the session).
            let params =
                json!({"name": bare, "arguments": args, "_meta": {"progressToken": acp_id}});
            let purpose = Purpose::Tool(ToolCallRef {
                session: self.session,
                turn: self.turn,
                index: ToolCallIndex(i),
            });
            let Some(req) = cx.servers.send_request(
                server,
                McpRequest::tools_call(&params, purpose, timeout),
                cx.out,
                cx.timers,
            ) else {
                break;
            };
            if posting {
                self.posted = true;
            }
            self.calls[i].state = CallState::Running(server, req);
            cx.out.send_update(
                &self.session.to_string(),
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": acp_id, "status": "in_progress"}),
            );
        }
    }
}

/// The converted result of a model tool call's reply, and whether the call failed (SPEC L3,
/// A6, case C54): an `isError: true` result failed (the model still sees its text as an error
/// result, the client a `failed` update with that text); a JSON-RPC error failed too.
pub(crate) fn tool_output(reply: Result<Value, RpcError>, cap: usize) -> (ToolOutput, bool) {
    match reply {
        Ok(v) => {
            let out = crate::tools::convert_result(&v, cap);
            let failed = out.is_error;
            (out, failed)
        }
        Err(e) => (
            err_out(format!(
                "tool call rejected: {} (code {})",
                e.message, e.code
            )),
            true,
        ),
    }
}

/// What came back for an `interceptor/invoke` of a tool call's chain (SPEC X1).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum InterceptEvent {
    /// Its reply, or that none will come (the server died).
    Reply(InvokeReply),
    /// Its deadline passed (the request was already abandoned and counted, H4).
    Timeout,
}

/// Takes an allowed, mutated request payload `{name, arguments}` into call `c` (SPEC X1).
/// The tool may not be renamed (the user's permission and the `*_always` memory name the
/// tool the model called) and the arguments must stay a JSON object.
fn apply_mutation(c: &mut BatchCall, payload: &Value) -> Result<(), String> {
    let bare = c
        .route
        .as_ref()
        .map(|r| r.bare.as_str())
        .unwrap_or_default();
    match payload.get("name").and_then(Value::as_str) {
        Some(name) if name == bare => {}
        Some(name) => {
            return Err(format!(
                "blocked: an interceptor renamed the tool call from '{bare}' to '{name}', which is not supported"
            ));
        }
        None => {
            return Err("blocked: an interceptor's changed tool call has no tool name".into());
        }
    }
    match payload.get("arguments") {
        None | Some(Value::Null) => c.args = json!({}),
        Some(Value::Object(m)) => c.args = Value::Object(m.clone()),
        Some(other) => {
            return Err(format!(
                "blocked: an interceptor changed the tool call's arguments into {}, not a JSON object",
                crate::jsonrpc::json_type(other)
            ));
        }
    }
    Ok(())
}

/// Whether `route` leads to a built-in tool.
fn is_builtin(route: Option<&ToolRoute>) -> bool {
    route.is_some_and(|r| matches!(r.target, ToolTarget::Builtin(_)))
}

/// The result of a built-in tool call with `args` in `sess` (SPEC A10).
fn run_builtin(route: Option<&ToolRoute>, args: &Value, sess: &Session) -> ToolOutput {
    match route.map(|r| r.target) {
        Some(ToolTarget::Builtin(Builtin::LoadSkill)) => {
            crate::skills::load_skill(&sess.skills, args)
        }
        Some(ToolTarget::Server(_)) | None => err_out("not a built-in tool".into()),
    }
}

/// Checks that a response payload an interceptor changed is still an MCP `CallToolResult`
/// (MCP 2025-11-25 schema: an object with a `content` array of content blocks, each an object
/// with a string `type`; `isError`, when present, a boolean; `structuredContent`, when
/// present, an object). Errors: the text the model and the client see (SPEC X1, S4).
fn check_rewritten_result(payload: &Value) -> Result<(), String> {
    let fail = |what: String| {
        Err(format!(
            "blocked: an interceptor changed the tool result into something that is not a tool result ({what})"
        ))
    };
    let Value::Object(o) = payload else {
        return fail(format!(
            "{}, not an object",
            crate::jsonrpc::json_type(payload)
        ));
    };
    match o.get("content") {
        Some(Value::Array(blocks)) => {
            if let Some(i) = blocks
                .iter()
                .position(|b| !b.get("type").is_some_and(Value::is_string))
            {
                return fail(format!("content block {i} has no string \"type\""));
            }
        }
        Some(other) => {
            return fail(format!(
                "\"content\" is {}, not an array",
                crate::jsonrpc::json_type(other)
            ));
        }
        None => return fail("no \"content\" array".into()),
    }
    if let Some(e) = o.get("isError").filter(|e| !e.is_boolean() && !e.is_null()) {
        return fail(format!(
            "\"isError\" is {}, not a boolean",
            crate::jsonrpc::json_type(e)
        ));
    }
    if let Some(sc) = o
        .get("structuredContent")
        .filter(|v| !v.is_object() && !v.is_null())
    {
        return fail(format!(
            "\"structuredContent\" is {}, not an object",
            crate::jsonrpc::json_type(sc)
        ));
    }
    Ok(())
}

fn err_out(text: String) -> ToolOutput {
    ToolOutput::plain(text, true)
}

fn denied_out() -> ToolOutput {
    err_out("tool call not authorized: the user did not allow this tool call".into())
}

/// Parse model tool-call arguments (SPEC L2, case C26): blank → `{}`; must be a JSON object.
fn parse_arguments(raw: &str) -> Result<Value, String> {
    if raw.trim().is_empty() {
        return Ok(json!({}));
    }
    match crate::json::parse_lossy(raw) {
        Ok(Value::Object(m)) => Ok(Value::Object(m)),
        Ok(other) => Err(format!(
            "arguments must be a JSON object, got {}",
            crate::jsonrpc::json_type(&other)
        )),
        Err(e) => Err(format!("arguments were not valid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cx::rig::{Parts, tool_call as call};
    use crate::io::Action;

    const SID: SessionId = SessionId(1);
    const TURN: TurnNo = TurnNo(1);

    /// A session with one ready server `fs` offering `read`, `write` and `shell`.
    fn setup(parts: &mut Parts) -> (Session, BTreeMap<String, ToolRoute>) {
        parts.fs_session(SID)
    }

    fn statuses(actions: &[Action]) -> Vec<(String, String)> {
        Parts::acp_lines(actions)
            .iter()
            .map(|l| &l["params"]["update"])
            .map(|u| {
                (
                    u["toolCallId"].as_str().unwrap_or("").to_string(),
                    u["status"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn l2_m4_calls_that_cannot_run_fail_at_once_and_the_rest_run_in_order() {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        let calls = vec![
            call("a", "fs__read", r#"{"path":"x"}"#),
            call("b", "fs___Stop", "{}"),
            call("c", "fs__write", "[1]"),
            call("d", "fs__write", ""),
        ];
        let batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        let actions = parts.drain();
        assert_eq!(
            statuses(&actions),
            [
                ("tc_1", "pending"),
                ("tc_2", "pending"),
                ("tc_3", "pending"),
                ("tc_4", "pending"),
                ("tc_2", "failed"),
                ("tc_3", "failed"),
                ("tc_1", "in_progress"),
                ("tc_4", "in_progress"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        let sent = Parts::mcp_lines(&actions);
        assert_eq!(sent.len(), 2, "I10: the hook name never reaches MCP");
        assert_eq!(
            sent[1]["params"]["arguments"],
            json!({}),
            "C26: blank is {{}}"
        );
        assert!(!batch.is_done());
    }

    #[test]
    fn l2_the_parallel_cap_holds_and_results_come_back_in_call_order() {
        let mut parts = Parts::for_tests();
        parts.cfg.max_parallel_tools = 1;
        let (mut sess, routes) = setup(&mut parts);
        let calls = vec![call("a", "fs__read", "{}"), call("b", "fs__write", "{}")];
        let mut batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        assert_eq!(Parts::mcp_lines(&parts.drain()).len(), 1, "one at a time");
        let ok = |t: &str| ToolOutput::plain(t.into(), false);
        batch.on_result(ToolCallIndex(0), ok("first"), false, &mut parts.tools());
        assert_eq!(
            Parts::mcp_lines(&parts.drain()).len(),
            1,
            "the next one starts"
        );
        batch.on_result(ToolCallIndex(1), ok("second"), false, &mut parts.tools());
        assert!(batch.is_done());
        let results: Vec<String> = batch
            .into_results()
            .into_iter()
            .map(|m| {
                let Message::ToolResult { call_id, text, .. } = m else {
                    panic!("only results: {m:?}");
                };
                format!("{call_id}={text}")
            })
            .collect();
        assert_eq!(results, ["a=first", "b=second"]);
    }

    #[test]
    fn a7_permission_is_asked_and_always_answers_are_remembered_per_tool() {
        let mut parts = Parts::for_tests();
        parts.cfg.permission = PermissionMode::Ask;
        let (mut sess, routes) = setup(&mut parts);
        let calls = vec![call("a", "fs__read", "{}"), call("b", "fs__write", "{}")];
        let mut batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        let asked: Vec<_> = Parts::acp_lines(&parts.drain())
            .into_iter()
            .filter(|l| l["method"] == "session/request_permission")
            .collect();
        assert_eq!(asked.len(), 2);
        assert_eq!(
            parts.timers.next().map(|(t, _)| t.as_ms()),
            Some(30_000),
            "the first reminder, then the deadline"
        );
        batch.on_permission(
            ToolCallIndex(0),
            PermissionAnswer::AllowAlways,
            &mut sess.remembered,
            &mut parts.tools(),
        );
        batch.on_permission(
            ToolCallIndex(1),
            PermissionAnswer::RejectOnce,
            &mut sess.remembered,
            &mut parts.tools(),
        );
        assert_eq!(
            statuses(&parts.drain())[..],
            [
                ("tc_1".to_string(), "in_progress".to_string()),
                ("tc_2".to_string(), "failed".to_string())
            ]
        );
        assert_eq!(sess.remembered.get("fs__read"), Some(&true));
        assert_eq!(
            sess.remembered.get("fs__write"),
            None,
            "a one-off answer is not kept"
        );
        let again = ToolBatch::start(
            TurnNo(2),
            vec![call("c", "fs__read", "{}")],
            &routes,
            &mut sess,
            &mut parts.tools(),
        );
        assert!(
            !Parts::acp_lines(&parts.drain())
                .iter()
                .any(|l| l["method"] == "session/request_permission"),
            "allow_always is not asked again"
        );
        assert!(!again.is_done());
    }

    #[test]
    fn a4_cancel_ends_every_call_cancels_the_running_and_forgets_the_asked() {
        let mut parts = Parts::for_tests();
        parts.cfg.permission = PermissionMode::Ask;
        let (mut sess, routes) = setup(&mut parts);
        sess.remembered.insert("fs__read".into(), true);
        let calls = vec![call("a", "fs__read", "{}"), call("b", "fs__write", "{}")];
        let mut batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        parts.drain();
        batch.cancel("cancelled by the client", &mut parts.tools());
        let actions = parts.drain();
        let cancelled: Vec<_> = Parts::mcp_lines(&actions)
            .into_iter()
            .filter(|l| l["method"] == "notifications/cancelled")
            .collect();
        assert_eq!(
            cancelled.len(),
            1,
            "the running call is cancelled at its server"
        );
        assert_eq!(
            statuses(&actions),
            [
                ("tc_1".to_string(), "failed".to_string()),
                ("tc_2".to_string(), "failed".to_string())
            ]
        );
        assert!(batch.is_done());
        assert_eq!(parts.timers.next(), None, "no deadline is left behind");
    }

    #[test]
    fn c54_an_is_error_result_fails_with_its_text_and_the_model_sees_it() {
        let reply = Ok(
            json!({"content":[{"type":"text","text":"Access denied - path outside allowed directories"}],"isError":true}),
        );
        let (out, failed) = tool_output(reply, 1024);
        assert!(failed, "an isError result is a failed call");
        assert!(out.is_error);
        assert_eq!(out.text, "Access denied - path outside allowed directories");
        assert_eq!(
            out.client_content(),
            vec![crate::tools::text_content(
                "Access denied - path outside allowed directories"
            )]
        );
        let (ok, failed) = tool_output(Ok(json!({"content":[{"type":"text","text":"x"}]})), 1024);
        assert!(!failed && !ok.is_error);
    }

    #[test]
    fn c59_calls_carry_a_progress_token_and_progress_shows_on_the_running_call() {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        let mut batch = ToolBatch::start(
            TURN,
            vec![call("a", "fs__read", "{}")],
            &routes,
            &mut sess,
            &mut parts.tools(),
        );
        let sent = Parts::mcp_lines(&parts.drain());
        assert_eq!(sent[0]["params"]["_meta"]["progressToken"], "tc_1");
        let server = sess.servers[0];
        assert!(!batch.on_progress(server, &json!("tc_9"), "x", &mut parts.tools()));
        assert!(!batch.on_progress(ServerSlot(99), &json!("tc_1"), "x", &mut parts.tools()));
        assert!(
            parts.drain().is_empty(),
            "no update for another token or server"
        );
        assert!(batch.on_progress(server, &json!("tc_1"), "copying (3/10)", &mut parts.tools()));
        let ups = Parts::acp_lines(&parts.drain());
        assert_eq!(
            ups[0]["params"]["update"],
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "tc_1", "status": "in_progress",
                   "content": [{"type": "content", "content": {"type": "text", "text": "copying (3/10)"}}]})
        );
        batch.on_result(
            ToolCallIndex(0),
            ToolOutput::plain("done".into(), false),
            false,
            &mut parts.tools(),
        );
        parts.drain();
        assert!(
            !batch.on_progress(server, &json!("tc_1"), "late", &mut parts.tools()),
            "a finished call shows no more progress"
        );
    }

    #[test]
    fn g2_a_shell_call_that_sends_a_message_counts_as_posting() {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        let quiet = ToolBatch::start(
            TURN,
            vec![call("a", "fs__shell", r#"{"command":"ls"}"#)],
            &routes,
            &mut sess,
            &mut parts.tools(),
        );
        assert!(!quiet.posted());
        let post = ToolBatch::start(
            TURN,
            vec![call(
                "b",
                "fs__shell",
                r#"{"command":"buzz messages send hi"}"#,
            )],
            &routes,
            &mut sess,
            &mut parts.tools(),
        );
        assert!(post.posted());
    }

    #[test]
    fn m9_a_call_to_a_dead_server_is_not_run() {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        parts.servers.kill(
            sess.servers[0],
            "crashed",
            &mut parts.out,
            &mut parts.timers,
        );
        parts.drain();
        let batch = ToolBatch::start(
            TURN,
            vec![call("a", "fs__read", "{}")],
            &routes,
            &mut sess,
            &mut parts.tools(),
        );
        assert!(batch.is_done());
        let Some(Message::ToolResult { text, is_error, .. }) = batch.into_results().pop() else {
            panic!("one result");
        };
        assert!(is_error);
        assert!(
            text.starts_with(
                "server 'fs' is recovering; the call was not run (MCP server 'fs' crashed"
            ),
            "{text}"
        );
    }
}
