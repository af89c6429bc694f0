//! SEP-2624 interceptors on the tool-call path (SPEC X1, experimental, opt-in with
//! `BUZZ_AGENT_INTERCEPTOR_SERVERS`): the [`Screen`] of one phase of one model tool call,
//! over the session's interceptor set ([`Interceptors`], read with `interceptors/list` while
//! the session opens). A screen runs one pure [`Chain`] through the server table: every invocation the
//! chain asks for becomes an `interceptor/invoke` request to its server with the hook timeout
//! (`BUZZ_AGENT_HOOK_TIMEOUT_MS`, whose timeouts count toward H4's kill rule), every reply,
//! death or timeout goes back into the chain, and the chain's verdict comes out as a
//! [`ScreenVerdict`].
//!
//! The tool batch (`tool_calls.rs`) owns the screens: the request phase runs before permission
//! is asked and before the call is sent, the response phase over the result before the model or
//! the client sees it (`docs/interceptors.md`).

use crate::config::LogLevel;
use crate::cx::McpCx;
use crate::ids::{McpRequestId, ServerSlot, SessionId, ToolCallIndex, TurnNo};
use crate::interceptor::wire::TOOLS_CALL;
use crate::interceptor::{
    Chain, ChainOutput, ChainRequest, Interceptors, InvocationId, InvokeReply, Phase, Verdict,
};
use crate::jsonrpc::RpcError;
use crate::mcp::{InterceptRef, McpRequest, Purpose};
use serde_json::{Value, json};
use std::collections::BTreeMap;

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
        cx: &mut McpCx<'_>,
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
    pub(crate) fn on_reply(&mut self, invocation: u32, reply: InvokeReply, cx: &mut McpCx<'_>) {
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
    pub(crate) fn on_timeout(&mut self, invocation: u32, cx: &mut McpCx<'_>) {
        if self.in_flight.remove(&invocation).is_none() {
            return;
        }
        if let Some(chain) = self.chain.as_mut() {
            chain.time_out(InvocationId(invocation), cx.out.now());
        }
        self.pump(cx);
    }

    /// The turn was cancelled: every invocation in flight gets `notifications/cancelled`.
    pub(crate) fn cancel(&mut self, why: &str, cx: &mut McpCx<'_>) {
        for (_, (slot, id)) in std::mem::take(&mut self.in_flight) {
            cx.servers.cancel_request(slot, id, why, cx.out, cx.timers);
        }
        self.chain = None;
    }

    /// Carries out what the chain asks for until it waits for a reply or has decided.
    fn pump(&mut self, cx: &mut McpCx<'_>) {
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
    fn send(&mut self, id: InvocationId, server: &str, params: &Value, cx: &mut McpCx<'_>) {
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

#[cfg(test)]
mod tests {
    //! The screens inside the tool batch that owns them (SPEC X1): the batch's interceptor
    //! paths, driven with the core's example server answering the invocations.

    use super::*;
    use crate::acp::PermissionAnswer;
    use crate::config::PermissionMode;
    use crate::cx::rig::{Parts, tool_call as call};
    use crate::interceptor::example_server::ExampleServer;
    use crate::io::Action;
    use crate::llm::Message;
    use crate::mcp::ToolRoute;
    use crate::session::Session;
    use crate::tool_calls::{InterceptEvent, ToolBatch};

    const SID: SessionId = SessionId(1);
    const TURN: TurnNo = TurnNo(1);

    /// A session with one ready server `fs` offering `read`, `write` and `shell`.
    fn setup(parts: &mut Parts) -> (Session, BTreeMap<String, ToolRoute>) {
        parts.fs_session(SID)
    }

    /// Adds the interceptor server `policy` (no tools) running the example server's `config`
    /// to `sess`; returns the server logic that answers its invocations.
    fn policy(parts: &mut Parts, sess: &mut Session, config: Value) -> ExampleServer {
        let slot = parts.ready_server(SID, "policy", &[]);
        sess.servers.push(slot);
        let server = ExampleServer::from_config(&config).expect("a valid configuration");
        let listed = server.list(Some("tools/call"), None).interceptors;
        sess.interceptors.add("policy", slot, listed);
        server
    }

    /// One `fs__read` call started in a session whose interceptor server `policy` runs the
    /// example server's `config` (what the start sent not drained): the parts, the session,
    /// the server logic that answers the invocations, and the batch.
    fn read_under_policy(config: Value) -> (Parts, Session, ExampleServer, ToolBatch) {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        let server = policy(&mut parts, &mut sess, config);
        let calls = vec![call("a", "fs__read", "{}")];
        let batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        (parts, sess, server, batch)
    }

    /// One `fs__read` call started under the mutation interceptor `name` of server `policy`,
    /// hooked on `phase` (what the start sent already drained): the parts, the session and the
    /// batch.
    fn one_call_under_mutator(name: &str, phase: &str) -> (Parts, Session, ToolBatch) {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        let slot = parts.ready_server(SID, "policy", &[]);
        sess.servers.push(slot);
        let mutator = crate::interceptor::Interceptor::from_value(&json!({
            "name": name, "type": "mutation",
            "hooks": [{"events": ["tools/call"], "phase": phase}]
        }))
        .expect("a descriptor");
        sess.interceptors.add("policy", slot, vec![mutator]);
        let batch = ToolBatch::start(
            TURN,
            vec![call("a", "fs__read", "{}")],
            &routes,
            &mut sess,
            &mut parts.tools(),
        );
        parts.drain();
        (parts, sess, batch)
    }

    /// Answers every `interceptor/invoke` of `actions` as `server` does (reply `Ok`) or with
    /// `event` when given; returns how many were answered.
    fn answer(
        batch: &mut ToolBatch,
        server: &ExampleServer,
        actions: &[Action],
        event: Option<InterceptEvent>,
        sess: &mut Session,
        parts: &mut Parts,
    ) -> usize {
        let invokes: Vec<Value> = Parts::mcp_lines(actions)
            .into_iter()
            .filter(|l| l["method"] == "interceptor/invoke")
            .collect();
        for line in &invokes {
            let params = &line["params"];
            let phase = crate::interceptor::Phase::parse(params["phase"].as_str().unwrap_or(""))
                .expect("a phase");
            let invocation = server
                .list(Some("tools/call"), Some(phase))
                .interceptors
                .iter()
                .position(|i| params["name"] == i.name.as_str())
                .expect("a listed interceptor") as u32;
            let call = InterceptRef {
                session: SID,
                turn: TURN,
                index: ToolCallIndex(0),
                response: phase == crate::interceptor::Phase::Response,
                invocation,
            };
            let ev = event.clone().unwrap_or_else(|| {
                InterceptEvent::Reply(crate::intercept::invoke_reply(server.invoke(params)))
            });
            batch.on_intercept(call, ev, &mut sess.remembered, &mut parts.tools());
        }
        invokes.len()
    }

    fn only_result(batch: ToolBatch) -> (String, bool) {
        let Some(Message::ToolResult { text, is_error, .. }) = batch.into_results().pop() else {
            panic!("one result");
        };
        (text, is_error)
    }

    #[test]
    fn x1_a_denying_validator_stops_the_call_and_model_and_client_see_its_messages() {
        let mut parts = Parts::for_tests();
        let (mut sess, routes) = setup(&mut parts);
        let server = policy(
            &mut parts,
            &mut sess,
            json!([{"name": "no-reads", "behavior": "deny-all", "phases": "request"}]),
        );
        let calls = vec![call("a", "fs__read", r#"{"path":"x"}"#)];
        let mut batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        let actions = parts.drain();
        let sent = Parts::mcp_lines(&actions);
        assert_eq!(sent.len(), 1, "only the invocation: {sent:#?}");
        assert_eq!(
            sent[0]["params"]["payload"],
            json!({"name": "read", "arguments": {"path": "x"}}),
            "the request phase sees the server's tools/call params"
        );
        assert_eq!(
            sent[0]["params"]["context"],
            json!({"sessionId": "sess_1", "server": "fs"})
        );
        assert_eq!(
            answer(&mut batch, &server, &actions, None, &mut sess, &mut parts),
            1
        );
        let after = parts.drain();
        assert!(
            !Parts::mcp_lines(&after)
                .iter()
                .any(|l| l["method"] == "tools/call"),
            "the call never runs"
        );
        let text = "blocked by interceptor 'no-reads': denied by policy";
        let update = &Parts::acp_lines(&after)[0]["params"]["update"];
        assert_eq!(update["status"], "failed");
        assert_eq!(update["content"][0]["content"]["text"], text);
        assert!(batch.is_done());
        assert_eq!(only_result(batch), (text.to_string(), true));
    }

    #[test]
    fn x1_a_mutator_changes_the_arguments_sent_and_raw_input_shows_them_before_permission() {
        let mut parts = Parts::for_tests();
        parts.cfg.permission = PermissionMode::Ask;
        let (mut sess, routes) = setup(&mut parts);
        let server = policy(
            &mut parts,
            &mut sess,
            json!([
                {"name": "upper", "behavior": "uppercase-note", "phases": "request"},
                {"name": "needs-upper", "behavior": "require-uppercase-note", "phases": "request"}
            ]),
        );
        let calls = vec![call("a", "fs__write", r#"{"note":"ship it"}"#)];
        let mut batch = ToolBatch::start(TURN, calls, &routes, &mut sess, &mut parts.tools());
        let actions = parts.drain();
        assert_eq!(
            Parts::acp_lines(&actions)
                .iter()
                .filter(|l| l["method"] == "session/request_permission")
                .count(),
            0,
            "the request phase runs before permission"
        );
        // The mutator first, alone; then the validator over the mutated payload.
        answer(&mut batch, &server, &actions, None, &mut sess, &mut parts);
        let actions = parts.drain();
        let invoke = &Parts::mcp_lines(&actions)[0];
        assert_eq!(invoke["params"]["name"], "needs-upper");
        assert_eq!(invoke["params"]["payload"]["arguments"]["note"], "SHIP IT");
        answer(&mut batch, &server, &actions, None, &mut sess, &mut parts);
        let acp = Parts::acp_lines(&parts.drain());
        assert_eq!(
            acp[0]["params"]["update"],
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "tc_1",
                "rawInput": {"note": "SHIP IT"}}),
            "rawInput shows what runs"
        );
        assert_eq!(acp[1]["method"], "session/request_permission");
        assert_eq!(
            acp[1]["params"]["toolCall"]["rawInput"],
            json!({"note": "SHIP IT"})
        );
        batch.on_permission(
            ToolCallIndex(0),
            PermissionAnswer::AllowOnce,
            &mut sess.remembered,
            &mut parts.tools(),
        );
        let sent = Parts::mcp_lines(&parts.drain());
        assert_eq!(sent[0]["method"], "tools/call");
        assert_eq!(
            sent[0]["params"],
            json!({"name": "write", "arguments": {"note": "SHIP IT"},
                "_meta": {"progressToken": "tc_1"}})
        );
    }

    #[test]
    fn x1_the_response_phase_screens_and_rewrites_the_result_before_anyone_sees_it() {
        let (mut parts, mut sess, server, mut batch) = read_under_policy(
            json!([{"name": "check", "behavior": "allow-all", "phases": "response"}]),
        );
        let sent = Parts::mcp_lines(&parts.drain());
        assert_eq!(sent[0]["method"], "tools/call", "no request-phase member");
        batch.on_reply(
            ToolCallIndex(0),
            Ok(json!({"content": [{"type": "text", "text": "secret"}]})),
            &mut parts.tools(),
        );
        let actions = parts.drain();
        let invoke = &Parts::mcp_lines(&actions)[0];
        assert_eq!(invoke["params"]["phase"], "response");
        assert_eq!(
            invoke["params"]["payload"],
            json!({"content": [{"type": "text", "text": "secret"}]})
        );
        assert!(
            Parts::acp_lines(&actions).is_empty(),
            "the client sees nothing before the verdict"
        );
        assert!(!batch.is_done());
        answer(&mut batch, &server, &actions, None, &mut sess, &mut parts);
        assert!(batch.is_done());
        assert_eq!(only_result(batch), ("secret".to_string(), false));

        // A response-phase mutator rewrites the result the model and the client see.
        let (mut parts, mut sess, mut batch) = one_call_under_mutator("redact", "response");
        batch.on_reply(
            ToolCallIndex(0),
            Ok(json!({"content": [{"type": "text", "text": "key=hunter2"}]})),
            &mut parts.tools(),
        );
        parts.drain();
        let reply = json!({"interceptor": "redact", "type": "mutation", "phase": "response",
            "modified": true, "payload": {"content": [{"type": "text", "text": "key=[redacted]"}]}});
        let call_ref = InterceptRef {
            session: SID,
            turn: TURN,
            index: ToolCallIndex(0),
            response: true,
            invocation: 0,
        };
        batch.on_intercept(
            call_ref,
            InterceptEvent::Reply(InvokeReply::Result(reply)),
            &mut sess.remembered,
            &mut parts.tools(),
        );
        let update = &Parts::acp_lines(&parts.drain())[0]["params"]["update"];
        assert_eq!(update["status"], "completed");
        assert_eq!(update["content"][0]["content"]["text"], "key=[redacted]");
        assert_eq!(only_result(batch), ("key=[redacted]".to_string(), false));
    }

    #[test]
    fn x1_i6_a_late_reply_to_a_call_no_longer_running_is_not_screened() {
        let (mut parts, _sess, _server, mut batch) = read_under_policy(
            json!([{"name": "check", "behavior": "allow-all", "phases": "response"}]),
        );
        let sent = Parts::mcp_lines(&parts.drain());
        assert_eq!(sent[0]["method"], "tools/call");
        batch.cancel("cancelled by the client", &mut parts.tools());
        parts.drain();
        assert!(batch.is_done());
        batch.on_reply(
            ToolCallIndex(0),
            Ok(json!({"content": [{"type": "text", "text": "late"}]})),
            &mut parts.tools(),
        );
        let actions = parts.drain();
        assert!(actions.is_empty(), "no invocation, no update: {actions:?}");
        let (text, is_error) = only_result(batch);
        assert!(is_error && text != "late", "{text}");
    }

    #[test]
    fn x1_a_crashing_or_silent_interceptor_blocks_unless_it_is_fail_open() {
        for (fail_open, runs) in [(false, false), (true, true)] {
            let (mut parts, mut sess, server, mut batch) = read_under_policy(
                json!([{"name": "guard", "behavior": "crash", "phases": "request", "failOpen": fail_open}]),
            );
            let (_, routes) = parts.servers.visible_tools(&sess.servers);
            let actions = parts.drain();
            answer(&mut batch, &server, &actions, None, &mut sess, &mut parts);
            let ran = Parts::mcp_lines(&parts.drain())
                .iter()
                .any(|l| l["method"] == "tools/call");
            assert_eq!(ran, runs, "failOpen {fail_open}");
            if !runs {
                let (text, _) = only_result(batch);
                assert!(
                    text.starts_with("blocked: interceptor 'guard' failed (error: ")
                        && text.ends_with("and fails closed"),
                    "{text}"
                );
            }
            // A timeout is a failure too.
            let mut batch = ToolBatch::start(
                TURN,
                vec![call("b", "fs__read", "{}")],
                &routes,
                &mut sess,
                &mut parts.tools(),
            );
            let actions = parts.drain();
            answer(
                &mut batch,
                &server,
                &actions,
                Some(InterceptEvent::Timeout),
                &mut sess,
                &mut parts,
            );
            let ran = Parts::mcp_lines(&parts.drain())
                .iter()
                .any(|l| l["method"] == "tools/call");
            assert_eq!(ran, runs, "timeout, failOpen {fail_open}");
            if !runs {
                assert_eq!(
                    only_result(batch).0,
                    "blocked: interceptor 'guard' failed (timed out after 2500 ms) and fails closed"
                );
            }
        }
    }

    #[test]
    fn x1_an_audit_validator_only_logs() {
        let (mut parts, mut sess, server, mut batch) = read_under_policy(
            json!([{"name": "watch", "behavior": "deny-all", "phases": "request", "mode": "audit"}]),
        );
        let actions = parts.drain();
        answer(&mut batch, &server, &actions, None, &mut sess, &mut parts);
        let actions = parts.drain();
        assert!(
            Parts::mcp_lines(&actions)
                .iter()
                .any(|l| l["method"] == "tools/call"),
            "audit never blocks"
        );
        assert!(
            Parts::logs(&actions).iter().any(
                |l| l.contains("'watch' (server 'policy') audit: would deny: denied by policy")
            ),
            "{:?}",
            Parts::logs(&actions)
        );
    }

    #[test]
    fn x1_cancel_mid_chain_cancels_the_invocation_and_fails_the_call() {
        let (mut parts, mut sess, _server, mut batch) = read_under_policy(
            json!([{"name": "slow", "behavior": "allow-all", "phases": "request"}]),
        );
        let invoke_id = Parts::mcp_lines(&parts.drain())[0]["id"].clone();
        batch.cancel("cancelled by the client", &mut parts.tools());
        let actions = parts.drain();
        let cancel = &Parts::mcp_lines(&actions)[0];
        assert_eq!(cancel["method"], "notifications/cancelled");
        assert_eq!(cancel["params"]["requestId"], invoke_id);
        assert!(batch.is_done());
        assert_eq!(
            parts.timers.next(),
            None,
            "the invocation's deadline is gone"
        );
        // A late reply changes nothing (I6).
        let late = InterceptRef {
            session: SID,
            turn: TURN,
            index: ToolCallIndex(0),
            response: false,
            invocation: 0,
        };
        batch.on_intercept(
            late,
            InterceptEvent::Timeout,
            &mut sess.remembered,
            &mut parts.tools(),
        );
        assert!(parts.drain().is_empty());
    }

    #[test]
    fn x1_a_mutation_that_renames_the_tool_is_refused() {
        let (mut parts, mut sess, mut batch) = one_call_under_mutator("rename", "request");
        let reply = json!({"interceptor": "rename", "type": "mutation", "phase": "request",
            "modified": true, "payload": {"name": "write", "arguments": {}}});
        let call_ref = InterceptRef {
            session: SID,
            turn: TURN,
            index: ToolCallIndex(0),
            response: false,
            invocation: 0,
        };
        batch.on_intercept(
            call_ref,
            InterceptEvent::Reply(InvokeReply::Result(reply)),
            &mut sess.remembered,
            &mut parts.tools(),
        );
        assert!(batch.is_done());
        assert_eq!(
            only_result(batch).0,
            "blocked: an interceptor renamed the tool call from 'read' to 'write', which is not supported"
        );
    }

    #[test]
    fn s4_a_malformed_rewrite_of_the_result_blocks_like_a_crash() {
        for (payload, why) in [
            (json!("redacted"), "a string, not an object"),
            (json!({}), "no \"content\" array"),
            (
                json!({"content": "redacted"}),
                "\"content\" is a string, not an array",
            ),
            (
                json!({"content": [{"text": "x"}]}),
                "content block 0 has no string \"type\"",
            ),
            (
                json!({"content": [], "isError": "no"}),
                "\"isError\" is a string, not a boolean",
            ),
            (
                json!({"content": [], "structuredContent": [1]}),
                "\"structuredContent\" is an array, not an object",
            ),
        ] {
            let (mut parts, mut sess, mut batch) = one_call_under_mutator("redact", "response");
            batch.on_reply(
                ToolCallIndex(0),
                Ok(json!({"content": [{"type": "text", "text": "key=hunter2"}]})),
                &mut parts.tools(),
            );
            parts.drain();
            let reply = json!({"interceptor": "redact", "type": "mutation", "phase": "response",
                "modified": true, "payload": payload});
            let call_ref = InterceptRef {
                session: SID,
                turn: TURN,
                index: ToolCallIndex(0),
                response: true,
                invocation: 0,
            };
            batch.on_intercept(
                call_ref,
                InterceptEvent::Reply(InvokeReply::Result(reply)),
                &mut sess.remembered,
                &mut parts.tools(),
            );
            let update = &Parts::acp_lines(&parts.drain())[0]["params"]["update"];
            assert_eq!(update["status"], "failed", "{payload}");
            let text = format!(
                "blocked: an interceptor changed the tool result into something that is not a tool result ({why})"
            );
            assert_eq!(update["content"][0]["content"]["text"], text.as_str());
            assert_eq!(only_result(batch), (text, true), "{payload}");
        }
    }

    #[test]
    fn x1_an_invocation_s_reply_comes_back_to_the_phase_that_sent_it() {
        for (phase, response) in [("request", false), ("response", true)] {
            let (mut parts, sess, _server, mut batch) = read_under_policy(
                json!([{"name": "check", "behavior": "allow-all", "phases": phase}]),
            );
            let slot = *sess.servers.last().unwrap_or(&ServerSlot(0));
            if response {
                parts.drain();
                batch.on_reply(
                    ToolCallIndex(0),
                    Ok(json!({"content": [{"type": "text", "text": "ok"}]})),
                    &mut parts.tools(),
                );
            }
            let invoke = Parts::mcp_lines(&parts.drain())
                .into_iter()
                .find(|l| l["method"] == "interceptor/invoke")
                .unwrap_or_default();
            assert_eq!(invoke["params"]["phase"], phase);
            let reply = json!({"jsonrpc": "2.0", "id": invoke["id"], "result": {}});
            let events = parts.servers.on_line(
                slot,
                crate::jsonrpc::LineEvent::Line(reply.to_string().into_bytes()),
                &mut parts.out,
                &mut parts.timers,
            );
            assert_eq!(
                events,
                [crate::mcp::McpEvent::InterceptReply {
                    call: InterceptRef {
                        session: SID,
                        turn: TURN,
                        index: ToolCallIndex(0),
                        response,
                        invocation: 0,
                    },
                    reply: Ok(json!({})),
                }],
                "{phase} phase"
            );
        }
    }
}
