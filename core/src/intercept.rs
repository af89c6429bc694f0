//! SEP-2624 interceptors on the tool-call path (SPEC X1, experimental, opt-in with
//! `BUZZ_AGENT_INTERCEPTOR_SERVERS`): a session's interceptor set ([`Interceptors`], read with
//! `interceptors/list` while the session opens) and the [`Screen`] of one phase of one model
//! tool call. A screen runs one pure [`Chain`] through the server table: every invocation the
//! chain asks for becomes an `interceptor/invoke` request to its server with the hook timeout
//! (`BUZZ_AGENT_HOOK_TIMEOUT_MS`, whose timeouts count toward H4's kill rule), every reply,
//! death or timeout goes back into the chain, and the chain's verdict comes out as a
//! [`ScreenVerdict`].
//!
//! The tool batch (`tool_calls.rs`) owns the screens: the request phase runs before permission
//! is asked and before the call is sent, the response phase over the result before the model or
//! the client sees it (`docs/interceptors.md`).

use crate::config::LogLevel;
use crate::cx::Cx;
use crate::ids::{McpRequestId, ServerSlot, SessionId, ToolCallIndex, TurnNo};
use crate::interceptor::wire::TOOLS_CALL;
use crate::interceptor::{
    Chain, ChainOutput, ChainRequest, Interceptor, InvocationId, InvokeReply, Member, Phase,
    Verdict,
};
use crate::jsonrpc::RpcError;
use crate::mcp::{InterceptRef, McpRequest, Purpose};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The interceptors of one session (SPEC X1): those of every interceptor server that hook
/// `tools/call`, in registration order, then each server's list order; and the interceptor
/// servers whose `interceptors/list` failed (every call of the session is then denied: an
/// unknown gate fails closed).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Interceptors {
    members: Vec<Member>,
    /// Interceptor server name → its slot in this session.
    servers: BTreeMap<String, ServerSlot>,
    /// `(server name, why its listing failed)`.
    broken: Vec<(String, String)>,
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

/// Which tool call a screen belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScreenOf {
    pub(crate) session: SessionId,
    pub(crate) turn: TurnNo,
    pub(crate) index: ToolCallIndex,
}

/// How a screen resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ScreenVerdict {
    /// The call (or its result) goes on as `payload` (changed by an applied mutation when
    /// `modified`).
    Allow { payload: Value, modified: bool },
    /// Blocked; the text the model and the client see (every denial, one per line).
    Deny(String),
}

/// One phase of one tool call in the interceptor chain (see the module docs).
#[derive(Debug)]
pub(crate) struct Screen {
    of: ScreenOf,
    response: bool,
    chain: Option<Chain>,
    servers: BTreeMap<String, ServerSlot>,
    /// Invocations sent and not answered: invocation → (server, request id).
    in_flight: BTreeMap<u32, (ServerSlot, McpRequestId)>,
    verdict: Option<ScreenVerdict>,
}

impl Screen {
    /// Starts the `phase` chain of the call `of` over `payload` (the `tools/call` params
    /// `{name, arguments}` on the request phase, the `CallToolResult` on the response phase);
    /// `server` is the name of the server the tool belongs to (sent in the `context`). A
    /// session with a broken interceptor server is denied at once.
    pub(crate) fn start(
        interceptors: &Interceptors,
        phase: Phase,
        payload: Value,
        of: ScreenOf,
        server: &str,
        cx: &mut Cx<'_>,
    ) -> Screen {
        let mut screen = Screen {
            of,
            response: phase == Phase::Response,
            chain: None,
            servers: interceptors.servers.clone(),
            in_flight: BTreeMap::new(),
            verdict: None,
        };
        if !interceptors.broken.is_empty() {
            let texts: Vec<String> = interceptors
                .broken
                .iter()
                .map(|(name, why)| {
                    format!(
                        "blocked: interceptor server '{name}' could not list its interceptors ({why}) and fails closed"
                    )
                })
                .collect();
            screen.verdict = Some(ScreenVerdict::Deny(texts.join("\n")));
            return screen;
        }
        let request = ChainRequest {
            event: TOOLS_CALL.to_string(),
            phase,
            payload,
            timeout_ms: cx.cfg.hook_timeout_ms,
            context: Some(json!({"sessionId": of.session.to_string(), "server": server})),
        };
        screen.chain = Some(Chain::start(interceptors.members(), request, cx.out.now()));
        screen.pump(cx);
        screen
    }

    /// The verdict, once (the screen is done after it).
    pub(crate) fn take_verdict(&mut self) -> Option<ScreenVerdict> {
        self.verdict.take()
    }

    /// The reply (or the loss) of invocation `invocation` came back.
    pub(crate) fn on_reply(&mut self, invocation: u32, reply: InvokeReply, cx: &mut Cx<'_>) {
        if self.in_flight.remove(&invocation).is_none() {
            return;
        }
        if let Some(chain) = self.chain.as_mut() {
            chain.handle_reply(InvocationId(invocation), reply, cx.out.now());
        }
        self.pump(cx);
    }

    /// Invocation `invocation` timed out; the agent already abandoned the request and counted
    /// the timeout against its server (H4).
    pub(crate) fn on_timeout(&mut self, invocation: u32, cx: &mut Cx<'_>) {
        if self.in_flight.remove(&invocation).is_none() {
            return;
        }
        if let Some(chain) = self.chain.as_mut() {
            chain.time_out(InvocationId(invocation), cx.out.now());
        }
        self.pump(cx);
    }

    /// The turn was cancelled: every invocation in flight gets `notifications/cancelled`.
    pub(crate) fn cancel(&mut self, why: &str, cx: &mut Cx<'_>) {
        for (_, (slot, id)) in std::mem::take(&mut self.in_flight) {
            cx.servers.cancel_request(slot, id, why, cx.out, cx.timers);
        }
        self.chain = None;
    }

    /// Carries out what the chain asks for until it waits for a reply or has decided.
    fn pump(&mut self, cx: &mut Cx<'_>) {
        loop {
            let Some(output) = self.chain.as_mut().and_then(Chain::poll_output) else {
                return;
            };
            match output {
                ChainOutput::Invoke(inv) => self.send(inv.id, &inv.server, &inv.params, cx),
                ChainOutput::Abandon(a) => {
                    // Not produced: the agent reports each timeout with `on_timeout`.
                    if let Some((slot, id)) = self.in_flight.remove(&a.id.0) {
                        cx.servers.cancel_request(
                            slot,
                            id,
                            "interceptor timeout",
                            cx.out,
                            cx.timers,
                        );
                    }
                }
                ChainOutput::Log(record) => cx.out.log(record.level, record.message),
                ChainOutput::Decided(verdict) => {
                    self.verdict = Some(match verdict {
                        Verdict::Allow { payload, modified } => {
                            ScreenVerdict::Allow { payload, modified }
                        }
                        Verdict::Deny { .. } => {
                            ScreenVerdict::Deny(verdict.denial_text().unwrap_or_default())
                        }
                    });
                    self.chain = None;
                    return;
                }
            }
        }
    }

    /// Sends one invocation, or tells the chain at once that no reply will come.
    fn send(&mut self, id: InvocationId, server: &str, params: &Value, cx: &mut Cx<'_>) {
        let lost = |why: String| InvokeReply::Lost(why);
        let reply = match self.servers.get(server).copied() {
            None => Some(lost(format!(
                "interceptor server '{server}' is not in this session"
            ))),
            Some(slot) => match cx.servers.unavailable(slot) {
                Some(why) => Some(lost(format!("server '{server}' is not available: {why}"))),
                None => {
                    let purpose = Purpose::Intercept(InterceptRef {
                        session: self.of.session,
                        turn: self.of.turn,
                        index: self.of.index,
                        response: self.response,
                        invocation: id.0,
                    });
                    let request = McpRequest {
                        method: crate::interceptor::wire::INVOKE_METHOD,
                        params,
                        purpose,
                        timeout_ms: cx.cfg.hook_timeout_ms,
                    };
                    match cx.servers.send_request(slot, request, cx.out, cx.timers) {
                        Some(req) => {
                            self.in_flight.insert(id.0, (slot, req));
                            None
                        }
                        None => Some(lost(format!("server '{server}' is gone"))),
                    }
                }
            },
        };
        if let (Some(reply), Some(chain)) = (reply, self.chain.as_mut()) {
            cx.out.log(
                LogLevel::Debug,
                format!("interceptor: {id} to '{server}' not sent"),
            );
            chain.handle_reply(id, reply, cx.out.now());
        }
    }
}

/// What an `interceptor/invoke` reply means to the chain.
pub(crate) fn invoke_reply(reply: Result<Value, RpcError>) -> InvokeReply {
    match reply {
        Ok(v) => InvokeReply::Result(v),
        Err(e) => InvokeReply::Error(e),
    }
}
