//! The set-up most scenarios share, written once: a fake LLM built through the [`Ctx`] (so a
//! `dialects::<profile>::…` trial gets the profile's server), the agent spawned against it in
//! a scratch workspace with extra environment, `initialize`, and `session/new` there with the
//! scenario's MCP servers.
//!
//! ```ignore
//! let (s, [log]) = Scratch::with_files(["calls.log"]);
//! let (llm, agent, sid) = Setup::new(ctx, &s)
//!     .replies(vec![Reply::text("done")])
//!     .env(&[("MCP_HOOK_SERVERS", "fs")])
//!     .fake_mcp("fs", &[("FAKE_MCP_CALL_LOG", &log)])
//!     .start();
//! ```
//!
//! Bind the fake LLM to a name (`_llm` when the scenario never reads it): the pattern `_` drops
//! it at once, and a dropped fake LLM stops answering the agent.

use super::util::Scratch;
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, Wire};
use crate::harness::{AgentProc, Ctx, PermissionPolicy, StderrMode, fake_mcp_entry};
use serde_json::Value;

/// A scenario's set-up in the scratch directory `s` (the agent's cwd and the session cwd are
/// `s.ws`), built step by step; every step is optional. Defaults: a fake LLM with no replies
/// (every request is answered HTTP 500), no extra environment, no MCP server, the Chat
/// Completions route (or the dialect's), stderr read as it arrives, permission requests
/// answered `allow_once`.
pub struct Setup<'a> {
    ctx: &'a Ctx,
    s: &'a Scratch,
    llm: Option<FakeLlm>,
    env: Vec<(String, String)>,
    servers: Vec<Value>,
    wire: Wire,
    stderr: StderrMode,
    permission: PermissionPolicy,
}

impl<'a> Setup<'a> {
    /// A set-up in the scratch directory `s`.
    pub fn new(ctx: &'a Ctx, s: &'a Scratch) -> Setup<'a> {
        Setup {
            ctx,
            s,
            llm: None,
            env: Vec::new(),
            servers: Vec::new(),
            wire: Wire::Chat,
            stderr: StderrMode::Read,
            permission: PermissionPolicy::AllowOnce,
        }
    }

    /// The fake LLM answers the n-th request with the n-th reply ([`Ctx::fake_llm`]).
    pub fn replies(self, replies: Vec<Reply>) -> Self {
        let llm = self.ctx.fake_llm(replies);
        self.llm(llm)
    }

    /// The fake LLM answers by `handler(request index, request)` ([`Ctx::fake_llm_with`]).
    pub fn handler(
        self,
        handler: impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let llm = self.ctx.fake_llm_with(handler);
        self.llm(llm)
    }

    /// A fake LLM the scenario built itself (build it with `ctx.fake_llm*` for it to speak the
    /// run's dialect).
    pub fn llm(mut self, llm: FakeLlm) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Extra environment for the agent; it wins over the defaults and earlier calls.
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// MCP server entries for `session/new`, after those given before.
    pub fn servers(mut self, servers: impl IntoIterator<Item = Value>) -> Self {
        self.servers.extend(servers);
        self
    }

    /// One fake MCP server `name` with `env` ([`fake_mcp_entry`]).
    pub fn fake_mcp(self, name: &str, env: &[(&str, &str)]) -> Self {
        self.servers([fake_mcp_entry(name, env)])
    }

    /// The provider route ([`Ctx::agent_on`]; a dialect's fake LLM keeps its own route).
    pub fn wire(mut self, wire: Wire) -> Self {
        self.wire = wire;
        self
    }

    /// Where the agent's stderr goes.
    pub fn stderr(mut self, stderr: StderrMode) -> Self {
        self.stderr = stderr;
        self
    }

    /// How the client answers `session/request_permission` from the start.
    pub fn permission(mut self, policy: PermissionPolicy) -> Self {
        self.permission = policy;
        self
    }

    /// Spawns the agent in the workspace; sends nothing. Returns the fake LLM and the agent.
    pub fn spawn(self) -> (FakeLlm, AgentProc) {
        let llm = self.llm.unwrap_or_else(|| self.ctx.fake_llm(Vec::new()));
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let agent = self
            .ctx
            .agent_with(self.wire, &llm, &env, &self.s.ws, self.stderr);
        agent.set_permission_policy(self.permission);
        (llm, agent)
    }

    /// Spawns the agent, `initialize`s it and opens a session in the workspace with the MCP
    /// servers given (panics when `session/new` fails). Returns the fake LLM, the agent and the
    /// session id.
    pub fn start(mut self) -> (FakeLlm, AgentProc, String) {
        let servers = Value::Array(std::mem::take(&mut self.servers));
        let ws = &self.s.ws;
        let (llm, agent) = self.spawn();
        agent.initialize();
        let sid = agent.new_session(ws, servers);
        (llm, agent, sid)
    }
}
