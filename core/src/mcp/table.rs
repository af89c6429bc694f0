//! The server table (SPEC M1–M10, H4, A2): one [`Server`] per `mcpServers` entry of each
//! session. A server is an MCP session ([`McpSession`]) over a [`Transport`] (a child process,
//! [`StdioTransport`], or HTTP, [`HttpTransport`]) with a [`Catalogue`] of what it offers; the table routes each input to the part it
//! concerns, and owns what spans generations: which session a server serves, its death and
//! M9 restart accounting, and the H4 count of consecutive hook timeouts.

use super::catalogue::{self, Catalogue, NameClaims, Owner, ToolRoute};
use super::http::{Delivery, HttpTransport, Wire};
use super::prompts::{self, Prompt};
use super::session::{McpSession, SessionEvent, SessionState};
use super::stdio::{Process, STDOUT_CLOSED_GRACE_MS, StdioTransport};
use super::{Expired, HookTarget, ListLost, McpEvent, McpRequest, Purpose, StartState, failed};
use crate::acp::{EntryTransport, McpServerEntry};
use crate::authorization::{AuthSetup, ServerAuth};
use crate::config::{HookAllowlist, LogLevel};
use crate::ids::{ExchangeId, McpRequestId, ProcKey, ServerSlot, SessionId};
use crate::io::{Action, Signal, SpawnSpec};
use crate::io::{HttpEvent, OAuthInput};
use crate::jsonrpc::{self, LineEvent};
use crate::llm::ToolDef;
use crate::oauth::secrets::SecretRng;
use crate::outbox::Outbox;
use crate::time::MonoTime;
use crate::timers::{ServerTimer, Timer, TimerTable};
use crate::tool_schema::SchemaDialect;
use crate::tools;
use crate::url::HttpUrl;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// M9: restart backoff base and cap, in ms (0.5 s · 2^(n−1), cap 30 s).
const RESTART_BASE_MS: u64 = 500;
const RESTART_CAP_MS: u64 = 30_000;
/// M9: failed restarts, or deaths without a successful call, before a server is permanently dead.
const MAX_FAILED_RESTARTS: u32 = 3;
const MAX_DEATHS: u32 = 3;

/// How a server's messages travel (MCP 2025-11-25 basic/transports).
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per configured server, never moved in a hot path"
)]
pub(crate) enum Transport {
    /// A child process per generation (SPEC M1).
    Stdio(StdioTransport),
    /// HTTP (SPEC M10).
    Http(Box<HttpTransport>),
}

/// One MCP server (one `mcpServers` entry of one session).
#[derive(Debug)]
pub(crate) struct Server {
    slot: ServerSlot,
    session: SessionId,
    /// The name the client gave (logs, titles, the hook allowlist).
    name: String,
    /// The prefix of its tool names (SPEC M3, A2: the name itself when it is a valid server
    /// name, else a safe stand-in).
    prefix: String,
    /// What carries the session.
    transport: Transport,
    /// The MCP session of the current generation; closed while the server is dead.
    mcp: McpSession,
    /// Its tools and hooks from the last complete `tools/list`.
    catalogue: Catalogue,
    /// Its prompts from the last complete `prompts/list`, offered as commands (SPEC A11).
    prompts: Vec<Prompt>,
    /// M9, while the session is closed: when a lazy restart is allowed; `None` for a server
    /// that never served, was stopped, or is permanently dead (its tools then leave the
    /// model's list).
    restart_at: Option<MonoTime>,
    /// The current generation is an M9 restart that is not ready yet.
    restarting: bool,
    /// Whether a `tools/list` ever completed (the server served at least once).
    listed_once: bool,
    /// How many `tools/list`s completed (a turn waiting for a re-listing compares it, SPEC
    /// M14).
    listings: u64,
    /// Consecutive hook timeouts (SPEC H4, DESIGN I5).
    consecutive_hook_timeouts: u32,
    /// M9: failed restarts in a row.
    failed_restarts: u32,
    /// M9: deaths without one successful tool call in between.
    deaths: u32,
    /// The agent's shutdown closed it (SPEC P1, M8).
    shut_down: bool,
    /// Its authorization failed before it ever served (SPEC M11): it stays without tools, the
    /// session starts anyway; the text says why (`not authorized: …`).
    unauthorized: Option<String>,
    /// Stopped for good ([`ServerTable::stop`]: its session closed or failed to start): it
    /// leaves the table as soon as nothing of it is pending (see [`ServerTable::sweep`]).
    retired: bool,
}

impl Server {
    /// The session's lifecycle state.
    #[cfg(test)]
    fn state(&self) -> &SessionState {
        self.mcp.state()
    }

    /// The stdio transport, if that is the server's.
    fn stdio(&self) -> Option<&StdioTransport> {
        match &self.transport {
            Transport::Stdio(t) => Some(t),
            Transport::Http(_) => None,
        }
    }

    fn stdio_mut(&mut self) -> Option<&mut StdioTransport> {
        match &mut self.transport {
            Transport::Stdio(t) => Some(t),
            Transport::Http(_) => None,
        }
    }

    /// Whether a process of the current generation runs, or (HTTP) an exchange that must
    /// finish before exit is in flight (the `DELETE` at shutdown, SPEC M8).
    fn leader_alive(&self) -> bool {
        match &self.transport {
            Transport::Stdio(t) => t.leader_alive(),
            Transport::Http(t) => self.is_dead() && t.busy(),
        }
    }

    /// Whether some process was ever spawned (HTTP: never).
    fn ever_spawned(&self) -> bool {
        self.stdio().is_some_and(StdioTransport::ever_spawned)
    }

    /// Whether the transport still carries messages (a process that has not exited, an HTTP
    /// session not closed): a `notifications/cancelled` can reach the server.
    fn reachable(&self) -> bool {
        match &self.transport {
            Transport::Stdio(t) => t.leader_alive() && !self.is_dead(),
            Transport::Http(_) => !self.is_dead(),
        }
    }

    /// Ready to serve calls.
    pub(crate) fn is_ready(&self) -> bool {
        self.mcp.is_ready()
    }

    fn is_dead(&self) -> bool {
        self.mcp.is_closed()
    }

    /// Whether anything of the transport is still to come: a process that runs or is being
    /// spawned, a SIGKILL still to send to a generation's group (SPEC M8), an HTTP exchange
    /// in flight (the `DELETE` of a stop, SPEC M10).
    fn transport_pending(&self, timers: &TimerTable) -> bool {
        match &self.transport {
            Transport::Stdio(t) => {
                t.process_pending() || !timers.pending_kills(self.slot).is_empty()
            }
            Transport::Http(t) => t.busy(),
        }
    }

    /// M9: dead, allowed to restart, its backoff over at `now` (the previous process may still
    /// be being reaped).
    fn restart_is_due(&self, now: MonoTime) -> bool {
        self.is_dead() && self.restart_at.is_some_and(|t| t <= now)
    }

    /// M9: whether the previous generation is gone (reaped, or never spawned), so a restart
    /// may spawn the next one.
    fn reaped(&self) -> bool {
        self.stdio()
            .is_none_or(|t| matches!(t.process(), Process::NotSpawned | Process::Exited))
    }

    /// Whether the model may see its tools (SPEC M9: a recovering server keeps them listed; a
    /// permanently dead or stopped one loses them).
    fn offers_tools(&self) -> bool {
        let permanently_dead = self.is_dead() && self.restart_at.is_none();
        self.catalogue.has_tools() && !permanently_dead
    }

    /// The start failure reason, if the server died before becoming ready the first time.
    fn start_failure(&self) -> Option<&str> {
        if self.unauthorized.is_some() {
            return None;
        }
        match self.mcp.state() {
            SessionState::Closed { reason } if !self.listed_once => Some(reason),
            SessionState::Connecting
            | SessionState::Initializing
            | SessionState::Listing
            | SessionState::Ready
            | SessionState::Closed { .. } => None,
        }
    }

    fn describe_death(&self, cause: &str) -> String {
        let tail = self
            .stdio()
            .map(StdioTransport::stderr_tail)
            .unwrap_or_default();
        if tail.is_empty() {
            format!("MCP server '{}' {cause}", self.name)
        } else {
            format!("MCP server '{}' {cause}; stderr:\n{tail}", self.name)
        }
    }

    /// Hands the frames the session queued to the transport, in order.
    fn flush(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        while let Some(frame) = self.mcp.poll_outgoing() {
            match &mut self.transport {
                Transport::Stdio(t) => t.send(frame.text, out),
                Transport::Http(t) => t.send(frame, self.mcp.version(), out, timers),
            }
        }
    }

    /// Ends the transport's part of a death or stop: the process group is asked to go (TERM
    /// now, KILL after the grace, SPEC M8/H4) when `kill_group` and one was spawned; an HTTP
    /// session is closed (exchanges dropped, `DELETE`).
    fn end_transport(&mut self, kill_group: bool, out: &mut Outbox, timers: &mut TimerTable) {
        match &mut self.transport {
            Transport::Stdio(t) => {
                if kill_group && t.ever_spawned() {
                    t.terminate_group(out, timers);
                }
            }
            Transport::Http(t) => t.close(out, timers),
        }
    }

    /// The one transition into death (SPEC M7): the session closes, the requests in flight
    /// are taken (and their deadlines cleared) for the caller to fail; an already dead server
    /// keeps its reason.
    fn enter_dead(
        &mut self,
        reason: String,
        restart_at: Option<MonoTime>,
        timers: &mut TimerTable,
    ) -> Vec<Purpose> {
        self.restart_at = restart_at;
        timers.clear(Timer::Server(self.slot, ServerTimer::StdoutClosed));
        self.mcp.close(reason, timers)
    }
}

/// A command found by [`ServerTable::find_command`] (SPEC A11).
#[derive(Debug, Clone)]
pub(crate) struct FoundCommand {
    /// The server offering it.
    pub(crate) slot: ServerSlot,
    /// Its prompt.
    pub(crate) prompt: Prompt,
    /// The server's tool prefix (the command's first part).
    pub(crate) prefix: String,
    /// The server's name as the client gave it (messages).
    pub(crate) server: String,
    /// Whether the server can be asked now.
    pub(crate) ready: bool,
}

/// Every MCP server of the process, by slot.
#[derive(Debug)]
pub(crate) struct ServerTable {
    servers: BTreeMap<ServerSlot, Server>,
    next_slot: u64,
    /// Handshake and `tools/list` deadline (`BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS`), in ms.
    init_timeout_ms: u64,
    /// Sent as `clientInfo.version` in `initialize`.
    client_version: String,
    /// The allowlisted part of the agent's environment (SPEC M1, S1).
    inherited_env: Vec<(String, String)>,
    /// `MCP_HOOK_SERVERS`, for the warning about hooks that will not be called (case C56).
    hook_allowlist: HookAllowlist,
    /// Per session, the exposed tool names its servers' tools hold for the whole session
    /// (names that collide, issue 26). Kept while the session has a server in the table;
    /// forgotten with its last one ([`ServerTable::sweep`]).
    claims: BTreeMap<SessionId, NameClaims>,
    /// What every HTTP server's OAuth authorization is built from, and the generator its
    /// secrets fork from (SPEC M11); `None`: servers are not authorized by the agent.
    authorization: Option<(AuthSetup, SecretRng)>,
    /// The `elicitation` capability servers created from now on declare (SPEC M12).
    elicitation: Option<serde_json::Value>,
}

impl ServerTable {
    /// An empty table; handshakes time out after `init_timeout_ms`.
    pub(crate) fn new(init_timeout_ms: u64, client_version: String) -> ServerTable {
        ServerTable {
            servers: BTreeMap::new(),
            next_slot: 1,
            init_timeout_ms,
            client_version,
            inherited_env: Vec::new(),
            hook_allowlist: HookAllowlist::Off,
            claims: BTreeMap::new(),
            authorization: None,
            elicitation: None,
        }
    }

    /// The `elicitation` capability that servers created from now on declare in
    /// `initialize` (SPEC M12: what the ACP client presents), `None` for none.
    pub(crate) fn set_elicitation(&mut self, capability: Option<serde_json::Value>) {
        self.elicitation = capability;
    }

    /// Answers the server request `request` of `slot`'s session generation `generation` (an
    /// `elicitation/create`, SPEC M12); dropped when the server died or restarted since.
    pub(crate) fn answer_server_request(
        &mut self,
        slot: ServerSlot,
        generation: u64,
        request: &jsonrpc::RpcId,
        outcome: Result<&serde_json::Value, &jsonrpc::RpcError>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if s.mcp.generation() != generation || s.is_dead() {
            out.log(
                LogLevel::Debug,
                format!("mcp '{}': an answer for a closed session dropped", s.name),
            );
            return;
        }
        s.mcp.respond(request, outcome);
        s.flush(out, timers);
    }

    /// HTTP servers created from now on without a configured `authorization` header are
    /// authorized with OAuth (SPEC M11), from `setup`; their secrets come from `rng`.
    pub(crate) fn set_authorization(&mut self, setup: AuthSetup, rng: SecretRng) {
        self.authorization = Some((setup, rng));
    }

    /// `MCP_HOOK_SERVERS`: a server exposing hooks that it does not name is warned about once
    /// (case C56).
    pub(crate) fn set_hook_allowlist(&mut self, allowlist: HookAllowlist) {
        self.hook_allowlist = allowlist;
    }

    /// The version sent as `clientInfo.version`.
    pub(crate) fn set_client_version(&mut self, version: String) {
        self.client_version = version;
    }

    /// The environment children inherit (already allowlisted, SPEC M1, S1).
    pub(crate) fn set_inherited_env(&mut self, env: Vec<(String, String)>) {
        self.inherited_env = env;
    }

    /// The server in `slot`.
    #[cfg(test)]
    fn get(&self, slot: ServerSlot) -> Option<&Server> {
        self.servers.get(&slot)
    }

    /// The server name in `slot` (empty if there is none, for log lines).
    pub(crate) fn name(&self, slot: ServerSlot) -> String {
        self.servers
            .get(&slot)
            .map(|s| s.name.clone())
            .unwrap_or_default()
    }

    /// The servers among `slots` that serve and are re-listing their tools (a
    /// `notifications/tools/list_changed` arrived), each with its count of completed listings:
    /// what the next LLM request of a turn waits for (SPEC M14, case C65).
    pub(crate) fn relisting(&self, slots: &[ServerSlot]) -> Vec<(ServerSlot, u64)> {
        slots
            .iter()
            .filter_map(|slot| self.servers.get(slot).map(|s| (*slot, s)))
            .filter(|(_, s)| s.is_ready() && s.mcp.is_listing())
            .map(|(slot, s)| (slot, s.listings))
            .collect()
    }

    /// Whether the re-listing that `relisting` reported as `(slot, listings)` is over: a
    /// listing completed since, none is in flight any more (it failed or timed out), or the
    /// server is gone.
    pub(crate) fn relisted(&self, slot: ServerSlot, listings: u64) -> bool {
        self.servers
            .get(&slot)
            .is_none_or(|s| s.listings > listings || !s.mcp.is_listing() || !s.is_ready())
    }

    /// Whether the server in `slot` still lists the tool it calls `bare` (a re-listing after
    /// `notifications/tools/list_changed` may have removed it since the round began, C65).
    pub(crate) fn lists_tool(&self, slot: ServerSlot, bare: &str) -> bool {
        self.servers
            .get(&slot)
            .is_some_and(|s| s.catalogue.has_tool(bare))
    }

    /// The ACP commands (`AvailableCommand`s) of the servers among `slots`, in their order:
    /// each prompt of a server that is not stopped or permanently dead, as `<prefix>:<prompt>`
    /// (SPEC A11).
    pub(crate) fn commands(&self, slots: &[ServerSlot]) -> Vec<serde_json::Value> {
        slots
            .iter()
            .filter_map(|slot| self.servers.get(slot))
            .filter(|s| !(s.is_dead() && s.restart_at.is_none()))
            .flat_map(|s| {
                s.prompts
                    .iter()
                    .map(|p| prompts::available_command(&s.prefix, p))
            })
            .collect()
    }

    /// The command `name` (`<prefix>:<prompt>`, without the `/`) among the servers in `slots`
    /// that are not stopped or permanently dead (SPEC A11): its server, the prompt, the
    /// server's prefix and name, and whether it is ready to be asked now.
    pub(crate) fn find_command(&self, slots: &[ServerSlot], name: &str) -> Option<FoundCommand> {
        let (prefix, prompt) = name.split_once(':')?;
        slots
            .iter()
            .filter_map(|slot| self.servers.get(slot).map(|s| (*slot, s)))
            .filter(|(_, s)| s.prefix == prefix && !(s.is_dead() && s.restart_at.is_none()))
            .find_map(|(slot, s)| {
                let p = s.prompts.iter().find(|p| p.name == prompt)?;
                Some(FoundCommand {
                    slot,
                    prompt: p.clone(),
                    prefix: s.prefix.clone(),
                    server: s.name.clone(),
                    ready: s.is_ready(),
                })
            })
    }

    /// The session of the server in `slot`.
    pub(crate) fn session_of(&self, slot: ServerSlot) -> Option<SessionId> {
        self.servers.get(&slot).map(|s| s.session)
    }

    /// The slot of `proc`, only if it is the server's current generation (late bytes or exits
    /// of a killed generation name no server).
    fn current(&self, proc: ProcKey) -> Option<ServerSlot> {
        self.servers
            .get(&proc.server)
            .filter(|s| s.stdio().is_some_and(|t| t.proc() == proc))
            .map(|_| proc.server)
    }

    /// The server of `proc`, only if `proc` is its current generation (as [`Self::current`]).
    fn current_mut(&mut self, proc: ProcKey) -> Option<&mut Server> {
        self.servers
            .get_mut(&proc.server)
            .filter(|s| s.stdio().is_some_and(|t| t.proc() == proc))
    }

    /// Records a server of `session` (not yet spawned; SPEC M1, S1: the allowlisted inherited
    /// environment, then the client's entries, which win). A stdio server runs in `cwd`; every
    /// server is offered `cwd` and `additional` as its roots (SPEC M13).
    pub(crate) fn create(
        &mut self,
        session: SessionId,
        cwd: &str,
        additional: &[String],
        entry: &McpServerEntry,
    ) -> ServerSlot {
        let slot = ServerSlot(self.next_slot);
        self.next_slot += 1;
        let transport = match &entry.transport {
            EntryTransport::Stdio { command, args, env } => {
                let mut merged: BTreeMap<String, String> =
                    self.inherited_env.iter().cloned().collect();
                for (k, v) in env {
                    merged.insert(k.clone(), v.clone());
                }
                let spec = SpawnSpec {
                    name: entry.name.clone(),
                    command: command.clone(),
                    args: args.clone(),
                    env: merged.into_iter().collect(),
                    cwd: cwd.to_string(),
                };
                Transport::Stdio(StdioTransport::new(slot, spec))
            }
            EntryTransport::Http {
                url,
                headers,
                legacy,
            } => Transport::Http(Box::new(HttpTransport::new(
                slot,
                &entry.name,
                if *legacy {
                    Wire::Legacy
                } else {
                    Wire::Streamable
                },
                url,
                headers,
                self.init_timeout_ms,
                self.authorization.as_mut().and_then(|(setup, rng)| {
                    let url = HttpUrl::parse(url).ok()?;
                    Some(ServerAuth::new(slot, &entry.name, url, setup, rng.fork()))
                }),
            ))),
        };
        let mut mcp = McpSession::new(slot, &entry.name, self.init_timeout_ms);
        mcp.set_roots(super::roots::roots_of(cwd, additional));
        mcp.set_elicitation(self.elicitation.clone());
        self.servers.insert(
            slot,
            Server {
                slot,
                session,
                name: entry.name.clone(),
                prefix: tools::server_prefix(&entry.name),
                transport,
                mcp,
                catalogue: Catalogue::default(),
                prompts: Vec::new(),
                restart_at: None,
                restarting: false,
                listed_once: false,
                listings: 0,
                consecutive_hook_timeouts: 0,
                failed_restarts: 0,
                deaths: 0,
                shut_down: false,
                unauthorized: None,
                retired: false,
            },
        );
        slot
    }

    /// Starts the server's current generation: spawns its process (SPEC M1), or, over HTTP,
    /// sends `initialize` at once (SPEC M10).
    pub(crate) fn spawn(&mut self, slot: ServerSlot, out: &mut Outbox, timers: &mut TimerTable) {
        let version = &self.client_version;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        match &mut s.transport {
            Transport::Stdio(t) => t.spawn(out),
            Transport::Http(t) => {
                out.log(
                    LogLevel::Info,
                    format!("mcp '{}': connecting to {}", s.name, t.url()),
                );
                t.open(out, timers);
                s.mcp.open(version, out, timers);
                s.flush(out, timers);
            }
        }
    }

    /// M9 lazy restart: respawns every dead server of `session` that may restart, whose
    /// previous process was reaped and whose backoff elapsed (called at the top of each round).
    pub(crate) fn restart_due(
        &mut self,
        session: SessionId,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let now = out.now();
        let due: Vec<ServerSlot> = self
            .servers
            .values()
            .filter(|s| s.session == session && s.restart_is_due(now) && s.reaped())
            .map(|s| s.slot)
            .collect();
        for slot in due {
            self.restart(slot, out, timers);
        }
    }

    /// M9 restart on call: a tool call found `slot` dead with its backoff over, so the server
    /// restarts now (if its previous process is reaped; else once it is) and the call waits
    /// for it ([`ServerTable::holds_calls`]) instead of failing.
    pub(crate) fn restart_for_call(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let now = out.now();
        if self
            .servers
            .get(&slot)
            .is_some_and(|s| s.restart_is_due(now) && s.reaped())
        {
            self.restart(slot, out, timers);
        }
    }

    /// Starts the next generation of a dead server (SPEC M9): spawn, handshake, list.
    fn restart(&mut self, slot: ServerSlot, out: &mut Outbox, timers: &mut TimerTable) {
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if let Some(t) = s.stdio_mut() {
            t.next_generation();
        }
        s.mcp.reopen(timers);
        timers.clear(Timer::Server(slot, ServerTimer::StdoutClosed));
        s.restart_at = None;
        s.restarting = true;
        let msg = match s.stdio() {
            Some(t) => format!("mcp '{}': restarting ({})", s.name, t.proc()),
            None => format!("mcp '{}': restarting", s.name),
        };
        out.log(LogLevel::Info, msg);
        self.spawn(slot, out, timers);
    }

    /// Whether a tool call to `slot` waits rather than being sent or failed now: the server
    /// re-lists its tools (the call runs against the new list, C65), or it restarts (SPEC M9:
    /// the handshake of a restart is in progress, bounded by its timeout, or the restart is
    /// due and waits for the previous process to be reaped, bounded by the kill grace). The
    /// agent dispatches held calls again after each step.
    pub(crate) fn holds_calls(&self, slot: ServerSlot, now: MonoTime) -> bool {
        self.servers.get(&slot).is_some_and(|s| {
            (s.is_ready() && s.mcp.is_listing())
                || (s.restarting && !s.is_dead() && !s.is_ready())
                || (s.restart_is_due(now) && !s.reaped())
        })
    }

    /// Sends `request` to `slot` with one deadline `request.timeout_ms` from now; its id, or
    /// `None` if there is no such server.
    pub(crate) fn send_request(
        &mut self,
        slot: ServerSlot,
        request: McpRequest<'_>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Option<McpRequestId> {
        let s = self.servers.get_mut(&slot)?;
        let id = s.mcp.request(
            request.method,
            request.params,
            request.purpose,
            request.timeout_ms,
            out,
            timers,
        );
        s.flush(out, timers);
        Some(id)
    }

    /// Abandons a request with `notifications/cancelled` (SPEC M5, H4, A4); a later reply is
    /// inert (I6).
    pub(crate) fn cancel_request(
        &mut self,
        slot: ServerSlot,
        id: McpRequestId,
        reason: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        s.mcp.forget(id, timers);
        if let Transport::Http(t) = &mut s.transport {
            t.forget(id, out, timers);
        }
        if s.reachable() {
            s.mcp.notify(
                "notifications/cancelled",
                &json!({"requestId": id.0, "reason": reason}),
            );
            s.flush(out, timers);
        }
    }

    /// `Input::McpSpawned`: the handshake starts (SPEC M2); a server stopped while its spawn
    /// was in flight is stopped now.
    pub(crate) fn on_spawned(&mut self, proc: ProcKey, out: &mut Outbox, timers: &mut TimerTable) {
        let Some(slot) = self.current(proc) else {
            return;
        };
        let version = &self.client_version;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        let dead = s.is_dead();
        let Some(t) = s.stdio_mut() else { return };
        if dead {
            t.spawned();
            t.terminate_group(out, timers);
            return;
        }
        if *s.mcp.state() != SessionState::Connecting {
            return;
        }
        if let Some(t) = s.stdio_mut() {
            t.spawned();
        }
        s.mcp.open(version, out, timers);
        s.flush(out, timers);
    }

    /// `Input::McpSpawnFailed` (e.g. ENOENT): the server is dead, no process exists.
    pub(crate) fn on_spawn_failed(
        &mut self,
        proc: ProcKey,
        error: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let slot = proc.server;
        let Some(s) = self.current_mut(proc) else {
            return Vec::new();
        };
        if let Some(t) = s.stdio_mut() {
            t.spawn_failed();
        }
        let reason = format!(
            "MCP server '{}' failed to start: spawning '{}' failed: {error}",
            s.name,
            s.stdio().map(|t| t.spec().command.as_str()).unwrap_or("")
        );
        let events = self.died(slot, reason, false, out, timers);
        self.sweep(slot, timers);
        events
    }

    /// `Input::McpStderrLine`: kept for error messages and forwarded to the log with a prefix
    /// (SPEC M1, P2: capped at [`crate::io::MAX_STDERR_LINE_BYTES`]).
    pub(crate) fn on_stderr_line(&mut self, proc: ProcKey, line: String, out: &mut Outbox) {
        let Some(s) = self.servers.get_mut(&proc.server) else {
            return;
        };
        let line = if line.len() > crate::io::MAX_STDERR_LINE_BYTES {
            crate::io::cap_stderr_line(&line, crate::io::MAX_STDERR_LINE_BYTES)
        } else {
            line
        };
        if let Some(t) = s.stdio_mut()
            && t.proc() == proc
        {
            t.keep_stderr(&line);
        }
        out.log(LogLevel::Info, format!("[mcp:{}] {line}", s.name));
    }

    /// `Input::McpExited`: a running server died (SPEC M7); a dead one is now reaped.
    pub(crate) fn on_exited(
        &mut self,
        proc: ProcKey,
        status: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let slot = proc.server;
        let Some(s) = self.current_mut(proc) else {
            return Vec::new();
        };
        timers.clear(Timer::Server(slot, ServerTimer::StdoutClosed));
        let reason = match s.mcp.state() {
            SessionState::Closed { .. } => {
                if let Some(t) = s.stdio_mut() {
                    t.exited();
                }
                out.log(
                    LogLevel::Debug,
                    format!("mcp '{}': process reaped ({status})", s.name),
                );
                self.sweep(slot, timers);
                return Vec::new();
            }
            SessionState::Ready => s.describe_death(&format!("exited ({status})")),
            SessionState::Connecting | SessionState::Initializing | SessionState::Listing => s
                .describe_death(&format!(
                    "failed to start: exited ({status}) during the handshake"
                )),
        };
        let events = self.died(slot, reason, true, out, timers);
        if let Some(t) = self.servers.get_mut(&slot).and_then(Server::stdio_mut) {
            t.exited();
        }
        events
    }

    /// `Input::McpStdoutClosed`: a live server gets a short grace to exit (its exit status and
    /// stderr tail then explain the death) before it is declared dead.
    pub(crate) fn on_stdout_closed(
        &mut self,
        proc: ProcKey,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let Some(slot) = self.current(proc) else {
            return;
        };
        if self
            .servers
            .get(&slot)
            .is_some_and(|s| s.leader_alive() && !s.is_dead())
        {
            timers.set(
                Timer::Server(slot, ServerTimer::StdoutClosed),
                out.now().plus_ms(STDOUT_CLOSED_GRACE_MS),
            );
        }
    }

    /// `Input::McpWriteFailed`: usually the process is exiting; it gets the stdout-closed
    /// grace, and one that already exited is dead now.
    pub(crate) fn on_write_failed(
        &mut self,
        proc: ProcKey,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let slot = proc.server;
        let Some(s) = self.current_mut(proc) else {
            return Vec::new();
        };
        if s.is_dead() {
            return Vec::new();
        }
        if s.leader_alive() {
            let closed = Timer::Server(slot, ServerTimer::StdoutClosed);
            if !timers.contains(closed) {
                timers.set(closed, out.now().plus_ms(STDOUT_CLOSED_GRACE_MS));
            }
            return Vec::new();
        }
        let reason = s.describe_death("stopped reading its stdin");
        self.died(slot, reason, true, out, timers)
    }

    /// `Input::McpStdinFull` (SPEC S5): the server stopped reading its stdin while more than
    /// 32 MiB waited for it; it is killed (one WARN) and its calls fail.
    pub(crate) fn on_stdin_full(
        &mut self,
        proc: ProcKey,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let Some(slot) = self.current(proc) else {
            return Vec::new();
        };
        self.kill(
            slot,
            "stopped reading its stdin with more than 32 MiB waiting for it; killed",
            out,
            timers,
        )
    }

    /// Marks a server dead, fails its requests in flight (SPEC M7), schedules its M9 restart
    /// (or makes it permanently dead) and, with `kill_group`, makes sure its process group is
    /// gone (TERM now, KILL after the grace, SPEC M8/H4).
    fn died(
        &mut self,
        slot: ServerSlot,
        reason: String,
        kill_group: bool,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let now = out.now();
        let Some(s) = self.servers.get_mut(&slot) else {
            return Vec::new();
        };
        if s.is_dead() {
            return Vec::new();
        }
        let listed_before = s.listed_once;
        // M9 accounting: a server that was serving may be restarted lazily, with a backoff.
        let mut permanent_now = false;
        let mut restart_at = None;
        if listed_before {
            s.deaths += 1;
            if s.restarting {
                s.failed_restarts += 1;
            }
            if s.failed_restarts >= MAX_FAILED_RESTARTS || s.deaths >= MAX_DEATHS {
                permanent_now = true;
            } else {
                let backoff = (RESTART_BASE_MS << s.failed_restarts.min(16)).min(RESTART_CAP_MS);
                restart_at = Some(now.plus_ms(backoff));
            }
        }
        s.restarting = false;
        let pending = s.enter_dead(reason.clone(), restart_at, timers);
        s.end_transport(kill_group, out, timers);
        out.log(LogLevel::Warn, reason.clone());
        if permanent_now {
            out.log(LogLevel::Error, format!("mcp '{}': permanently dead (3 failed restarts or 3 deaths without a successful call); its tools are removed", s.name));
        }
        let session = s.session;
        let mut events: Vec<McpEvent> = pending
            .into_iter()
            .filter_map(|p| failed(slot, p, &reason))
            .collect();
        if !listed_before {
            events.push(McpEvent::StartSettled { session });
        }
        events
    }

    /// Kills a live server (tool timeout, hook double timeout, oversize line) and marks it
    /// dead; `cause` completes `MCP server '<name>' …`.
    pub(crate) fn kill(
        &mut self,
        slot: ServerSlot,
        cause: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let Some(s) = self.servers.get(&slot) else {
            return Vec::new();
        };
        let reason = s.describe_death(cause);
        self.died(slot, reason, true, out, timers)
    }

    /// Orderly stop when its session failed to start (SPEC A2, M8): no restart, requests
    /// dropped unanswered, stdin closed, TERM, KILL later.
    pub(crate) fn stop(
        &mut self,
        slot: ServerSlot,
        why: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        let reason = format!("MCP server '{}' stopped: {why}", s.name);
        s.enter_dead(reason, None, timers);
        let kill_pending = s
            .stdio()
            .is_some_and(|t| timers.contains(Timer::kill(t.proc())));
        s.end_transport(!kill_pending, out, timers);
        s.retired = true;
        self.sweep(slot, timers);
    }

    /// Forgets a retired server once nothing of it is pending (its process reaped or never
    /// spawned, no SIGKILL left to send, no HTTP exchange in flight), with every timer of it:
    /// nothing of a stopped server outlives it in the core (its spawn spec and environment,
    /// its tool lists, its buffers), so memory follows the live sessions (issue 27). Later
    /// inputs naming it are inert (I6).
    fn sweep(&mut self, slot: ServerSlot, timers: &mut TimerTable) {
        if self
            .servers
            .get(&slot)
            .is_some_and(|s| s.retired && !s.transport_pending(timers))
        {
            if let Some(s) = self.servers.remove(&slot)
                && !self.servers.values().any(|o| o.session == s.session)
            {
                // The session's last server is gone: so are the names its tools held.
                self.claims.remove(&s.session);
            }
            timers.clear_server(slot);
        }
    }

    /// The number of servers in the table (live ones and stopped ones not yet swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.servers.len()
    }

    /// Agent shutdown (SPEC P1, M8 first stage): every server's stdin is closed, every server
    /// is dead and its requests in flight dropped (their turns were already answered) — except
    /// the servers in `keep`, which answer `_SessionEnd` hooks first (SPEC H11) and are shut
    /// down by a later call with an empty `keep`.
    pub(crate) fn shut_down_all(
        &mut self,
        keep: &BTreeSet<ServerSlot>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        for s in self.servers.values_mut() {
            let done = match &s.transport {
                Transport::Stdio(t) => t.is_shut_down(),
                Transport::Http(_) => s.shut_down,
            };
            if keep.contains(&s.slot) || done {
                continue;
            }
            s.shut_down = true;
            match &mut s.transport {
                Transport::Stdio(t) => t.shut_down(out),
                Transport::Http(t) => t.close(out, timers),
            }
            let reason = format!("MCP server '{}' stopped: agent shutting down", s.name);
            let restart_at = if s.is_dead() { s.restart_at } else { None };
            s.enter_dead(reason, restart_at, timers);
        }
    }

    /// Whether any server's current leader still runs.
    pub(crate) fn any_leader_alive(&self) -> bool {
        self.servers.values().any(Server::leader_alive)
    }

    /// Whether any server was ever spawned (so there may be process groups to sweep).
    pub(crate) fn any_spawned(&self) -> bool {
        self.servers.values().any(Server::ever_spawned)
    }

    /// Every process generation that may still have a live group (for shutdown sweeps): those
    /// with a SIGKILL pending, then the current one if it was ever spawned.
    pub(crate) fn procs_to_sweep(&self, timers: &TimerTable) -> Vec<ProcKey> {
        let mut procs = Vec::new();
        for s in self.servers.values() {
            let Some(t) = s.stdio() else { continue };
            let mut v = timers.pending_kills(s.slot);
            let proc = t.proc();
            if t.ever_spawned() && !v.contains(&proc) {
                v.push(proc);
            }
            procs.extend(v);
        }
        procs
    }

    /// Whether the servers in `slots` (a starting session's) are all up (SPEC A2).
    pub(crate) fn start_state(&self, slots: &[ServerSlot]) -> StartState {
        let mut all_ready = true;
        for slot in slots {
            if let Some(s) = self.servers.get(slot) {
                if let Some(reason) = s.start_failure() {
                    return StartState::Failed(reason.to_string());
                }
                if !s.is_ready() && s.unauthorized.is_none() {
                    all_ready = false;
                }
            }
        }
        if all_ready {
            StartState::Ready
        } else {
            StartState::Waiting
        }
    }

    /// Why a tool call to `slot` cannot be sent now (the server is dead or not ready), as the
    /// text after "the call was not run"; `None` when it is ready.
    pub(crate) fn unavailable(&self, slot: ServerSlot) -> Option<String> {
        let s = self.servers.get(&slot)?;
        match s.mcp.state() {
            SessionState::Closed { reason } => Some(reason.clone()),
            SessionState::Ready => None,
            SessionState::Connecting | SessionState::Initializing | SessionState::Listing => {
                Some(format!("server '{}' is not ready", s.name))
            }
        }
    }

    /// The tools the model may call now: every offering server's non-hook tools, in
    /// registration order (`slots`), merged by the catalogue's rules (SPEC M3, M4, M9, I10).
    /// The schemas are the servers' own ([`ServerTable::offered_tools`] for a request).
    pub(crate) fn visible_tools(
        &self,
        slots: &[ServerSlot],
    ) -> (Vec<ToolDef>, BTreeMap<String, ToolRoute>) {
        catalogue::visible_tools(
            slots
                .iter()
                .filter_map(|slot| self.servers.get(slot))
                .filter(|s| s.offers_tools())
                .map(|s| (s.slot, s.prefix.as_str(), &s.catalogue)),
        )
    }

    /// [`ServerTable::visible_tools`] as an LLM request offers them: each schema in the form
    /// `dialect`'s provider accepts (SPEC M14, case C63), converted once per listing.
    pub(crate) fn offered_tools(
        &mut self,
        slots: &[ServerSlot],
        dialect: SchemaDialect,
        out: &mut Outbox,
    ) -> (Vec<ToolDef>, BTreeMap<String, ToolRoute>) {
        let (mut defs, routes) = self.visible_tools(slots);
        for def in &mut defs {
            let Some(s) = routes
                .get(&def.name)
                .and_then(ToolRoute::server)
                .and_then(|slot| self.servers.get_mut(&slot))
            else {
                continue;
            };
            if let Some(offered) = s.catalogue.offered(&def.name, dialect, &s.name, out) {
                *def = offered;
            }
        }
        (defs, routes)
    }

    /// The servers among `slots` (registration order) that expose `hook` and are allowlisted
    /// by the name the client gave (SPEC H2, A2).
    pub(crate) fn hook_targets(
        &self,
        slots: &[ServerSlot],
        hook: &str,
        allowlist: &HookAllowlist,
    ) -> Vec<HookTarget> {
        slots
            .iter()
            .filter_map(|slot| self.servers.get(slot).map(|s| (slot, s)))
            .filter(|(_, s)| allowlist.allows(&s.name) && s.catalogue.has_hook(hook))
            .map(|(slot, s)| HookTarget {
                slot: *slot,
                name: s.name.clone(),
                prefix: s.prefix.clone(),
                ready: s.is_ready(),
            })
            .collect()
    }

    /// The servers among `slots` (registration order) that `allowlist` names:
    /// `(slot, name, ready)` (SPEC X1: the interceptor servers, C3 syntax).
    pub(crate) fn allowed(
        &self,
        slots: &[ServerSlot],
        allowlist: &HookAllowlist,
    ) -> Vec<(ServerSlot, String, bool)> {
        slots
            .iter()
            .filter_map(|slot| self.servers.get(slot).map(|s| (slot, s)))
            .filter(|(_, s)| allowlist.allows(&s.name))
            .map(|(slot, s)| (*slot, s.name.clone(), s.is_ready()))
            .collect()
    }

    /// A hook call (or, `what` = `interceptor`, an interceptor request: SPEC X1) timed out
    /// (SPEC H4): it is cancelled and counted; the 1st consecutive timeout warns, the 2nd kills
    /// the server (the events are the kill's). Hooks and interceptors share the count.
    pub(crate) fn hook_timed_out(
        &mut self,
        slot: ServerSlot,
        id: McpRequestId,
        hook_timeout_ms: u64,
        what: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        self.cancel_request(
            slot,
            id,
            &format!("{what} timeout after {hook_timeout_ms} ms"),
            out,
            timers,
        );
        let (name, count) = match self.servers.get_mut(&slot) {
            Some(s) => {
                s.consecutive_hook_timeouts += 1;
                (s.name.clone(), s.consecutive_hook_timeouts)
            }
            None => (String::new(), 0),
        };
        if count >= 2 {
            out.log(
                LogLevel::Warn,
                format!("{what}: killing server '{name}' after 2 consecutive timeouts"),
            );
            self.kill(
                slot,
                "was killed after 2 consecutive hook timeouts",
                out,
                timers,
            )
        } else {
            out.log(
                LogLevel::Warn,
                format!("{what}: server '{name}' timed out (1/2)"),
            );
            Vec::new()
        }
    }

    /// The deadline of request `id` of `slot` passed (its timer was taken by the agent).
    /// Handshake steps are handled here; tool and hook calls are returned for the agent to
    /// finish in order (see [`Expired`]). `None` when the request is no longer in flight.
    pub(crate) fn expire(
        &mut self,
        slot: ServerSlot,
        id: McpRequestId,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Option<(Expired, Vec<McpEvent>)> {
        let purpose = self.servers.get(&slot)?.mcp.purpose(id)?;
        match purpose {
            Purpose::Initialize | Purpose::ListTools => {
                let secs = self.init_timeout_ms / 1000;
                let s = self.servers.get_mut(&slot)?;
                s.mcp.forget(id, timers);
                if s.is_ready() {
                    let name = s.name.clone();
                    out.log(
                        LogLevel::Warn,
                        format!("mcp '{name}': tools/list timed out after {secs} s"),
                    );
                    Some((Expired::Handshake, Vec::new()))
                } else {
                    let cause = format!(
                        "failed to start: handshake timed out after {secs} s (BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS)"
                    );
                    Some((Expired::Handshake, self.kill(slot, &cause, out, timers)))
                }
            }
            Purpose::ListPrompts => {
                let secs = self.init_timeout_ms / 1000;
                let s = self.servers.get_mut(&slot)?;
                s.mcp.forget(id, timers);
                let name = s.name.clone();
                out.log(
                    LogLevel::Warn,
                    format!("mcp '{name}': prompts/list timed out after {secs} s"),
                );
                Some((Expired::Handshake, Vec::new()))
            }
            Purpose::GetPrompt(session) => Some((Expired::GetPrompt(session), Vec::new())),
            Purpose::Tool(call) => Some((Expired::Tool(call), Vec::new())),
            Purpose::Hook(call) => Some((Expired::Hook(call), Vec::new())),
            Purpose::ListInterceptors(session) => {
                Some((Expired::ListInterceptors(session), Vec::new()))
            }
            Purpose::Intercept(call) => Some((Expired::Intercept(call), Vec::new())),
        }
    }

    /// The TERM grace of `proc`'s group passed (its timer was taken by the agent): SIGKILL the
    /// whole group, even if the leader already exited (SPEC M8).
    pub(crate) fn term_grace_over(
        &mut self,
        proc: ProcKey,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        out.push(Action::SignalProcessGroup {
            proc,
            signal: Signal::Kill,
        });
        self.sweep(proc.server, timers);
    }

    /// The stdout-closed grace of `slot` passed: the server is killed and dead.
    pub(crate) fn stdout_grace_over(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        self.kill(slot, "closed its stdout", out, timers)
    }

    /// Splits `bytes` from `proc`'s stdout into lines (lossily decoded later, C36); `None` for
    /// a generation that is not current. The agent then hands each line to
    /// [`ServerTable::on_line`] while the server is not dead.
    pub(crate) fn split_lines(
        &mut self,
        proc: ProcKey,
        bytes: &[u8],
    ) -> Option<(ServerSlot, Vec<LineEvent>)> {
        let s = self.current_mut(proc)?;
        Some((proc.server, s.stdio_mut()?.split(bytes)))
    }

    /// `Input::Http`: what the runtime observed of an exchange of an HTTP server (SPEC M10):
    /// the messages it carried go to the session, failed requests to their owners; a server
    /// that cannot be reached is dead. Events of an exchange no longer in flight are inert.
    pub(crate) fn on_http(
        &mut self,
        exchange: ExchangeId,
        event: HttpEvent,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let slot = exchange.server;
        let Some(s) = self.servers.get_mut(&slot) else {
            return Vec::new();
        };
        let Transport::Http(t) = &mut s.transport else {
            return Vec::new();
        };
        if !t.owns(exchange.seq) {
            out.log(
                LogLevel::Debug,
                format!("mcp '{}': event of a dropped exchange {exchange}", s.name),
            );
            return Vec::new();
        }
        let deliveries = t.on_event(exchange.seq, event, out, timers);
        let events = self.deliver(slot, deliveries, out, timers);
        self.sweep(slot, timers);
        events
    }

    /// Hands what an HTTP transport learned to the session and the table, in order.
    fn deliver(
        &mut self,
        slot: ServerSlot,
        deliveries: Vec<Delivery>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let mut events = Vec::new();
        for d in deliveries {
            if self.is_dead(slot) {
                break;
            }
            match d {
                Delivery::Message(message) => {
                    events.extend(self.on_message(slot, message, out, timers));
                }
                Delivery::RequestFailed { id, reason } => {
                    let Some(s) = self.servers.get_mut(&slot) else {
                        break;
                    };
                    if let Some(event) = s.mcp.fail(id, &reason, timers) {
                        events.extend(self.on_session_event(slot, event, out, timers));
                    }
                }
                Delivery::Dead(cause) => events.extend(self.kill(slot, &cause, out, timers)),
                Delivery::Unauthorized(reason) => {
                    let Some(s) = self.servers.get_mut(&slot) else {
                        break;
                    };
                    if s.listed_once {
                        continue;
                    }
                    // SPEC M11: it starts without tools; the session starts anyway.
                    let cause = format!("MCP server '{}' is {reason}", s.name);
                    s.unauthorized = Some(reason);
                    events.extend(self.died(slot, cause, false, out, timers));
                }
                Delivery::Login(url) => events.push(McpEvent::Login { server: slot, url }),
                Delivery::LoginDone => events.push(McpEvent::LoginDone { server: slot }),
            }
        }
        events
    }

    /// One step of the HTTP transport of `slot` (`step`); what it learned is delivered.
    /// Nothing for a server that is gone or not remote.
    fn http_step(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
        step: impl FnOnce(&mut HttpTransport, &mut Outbox, &mut TimerTable) -> Vec<Delivery>,
    ) -> Vec<McpEvent> {
        let Some(Transport::Http(t)) = self.servers.get_mut(&slot).map(|s| &mut s.transport) else {
            return Vec::new();
        };
        let deliveries = step(t, out, timers);
        self.deliver(slot, deliveries, out, timers)
    }

    /// The user declined the login of `slot` (SPEC M11): its authorization fails; a server
    /// that never served starts without tools. Nothing for a server that is gone or not
    /// logging in.
    pub(crate) fn login_declined(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        self.http_step(slot, out, timers, HttpTransport::login_declined)
    }

    /// `Input::OAuth`: what the runtime reports for the authorization of the server it names
    /// (SPEC M11). Inputs for a server that is gone are inert (I6).
    pub(crate) fn on_oauth(
        &mut self,
        input: OAuthInput,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let slot = input.server();
        self.http_step(slot, out, timers, |t, out, timers| {
            t.on_oauth(input, out, timers)
        })
    }

    /// The deadline of `slot`'s authorization step passed (SPEC M11).
    pub(crate) fn authorization_due(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        self.http_step(slot, out, timers, HttpTransport::authorization_due)
    }

    /// The notices of the servers in `slots` (a session that starts) that start without tools
    /// because their authorization failed (SPEC M11).
    pub(crate) fn start_notices(&self, slots: &[ServerSlot]) -> Vec<String> {
        slots
            .iter()
            .filter_map(|slot| self.servers.get(slot))
            .filter_map(|s| {
                let reason = s.unauthorized.as_deref()?;
                Some(format!("MCP server '{}' is {reason}.", s.name))
            })
            .collect()
    }

    /// The deadline of exchange `seq` of `slot` (one carrying no request) passed.
    pub(crate) fn exchange_timed_out(
        &mut self,
        slot: ServerSlot,
        seq: u64,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let Some(Transport::Http(t)) = self.servers.get_mut(&slot).map(|s| &mut s.transport) else {
            return Vec::new();
        };
        let deliveries = t.exchange_timed_out(seq, out, timers);
        let events = self.deliver(slot, deliveries, out, timers);
        self.sweep(slot, timers);
        events
    }

    /// The `retry` wait of `slot`'s event streams passed: due resumptions start (SPEC M10).
    pub(crate) fn http_retry_due(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        if let Some(Transport::Http(t)) = self.servers.get_mut(&slot).map(|s| &mut s.transport) {
            t.retry_due(out, timers);
        }
    }

    /// Whether the server in `slot` is dead (or gone).
    pub(crate) fn is_dead(&self, slot: ServerSlot) -> bool {
        self.servers.get(&slot).is_none_or(Server::is_dead)
    }

    /// One line of a server's stdout (SPEC T6: a line over 16 MiB kills it; garbage is logged,
    /// never answered).
    pub(crate) fn on_line(
        &mut self,
        slot: ServerSlot,
        line: LineEvent,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let line = match line {
            LineEvent::Line(line) => line,
            LineEvent::TooLong { bytes, .. } => {
                return self.kill(
                    slot,
                    &format!("sent a stdout line over 16 MiB ({bytes} bytes); killed"),
                    out,
                    timers,
                );
            }
        };
        match jsonrpc::parse_message(&line) {
            Ok(message) => self.on_message(slot, message, out, timers),
            Err(jsonrpc::ParseError::NotJson) | Err(jsonrpc::ParseError::Invalid { .. }) => {
                let Some(s) = self.servers.get_mut(&slot) else {
                    return Vec::new();
                };
                // T6: logged at warn (cut to 200 bytes), never answered.
                let level = s
                    .stdio_mut()
                    .map_or(LogLevel::Warn, StdioTransport::bad_line);
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                out.log(
                    level,
                    format!(
                        "mcp '{}': ignoring non-JSON-RPC stdout line: {shown:?}",
                        s.name
                    ),
                );
                Vec::new()
            }
        }
    }

    /// One JSON-RPC message of `slot`'s session, whatever carried it: the session handles it,
    /// its answers go out, and what it reports becomes the table's events (SPEC M2, M5, M6, H4).
    fn on_message(
        &mut self,
        slot: ServerSlot,
        message: jsonrpc::Message,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let Some(s) = self.servers.get_mut(&slot) else {
            return Vec::new();
        };
        let event = s.mcp.on_message(message, out, timers);
        s.flush(out, timers);
        let Some(event) = event else {
            return Vec::new();
        };
        self.on_session_event(slot, event, out, timers)
    }

    /// What `slot`'s session reported, as the table's events (SPEC M2, M5, M6, H4).
    fn on_session_event(
        &mut self,
        slot: ServerSlot,
        event: SessionEvent,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<McpEvent> {
        let Some(s) = self.servers.get_mut(&slot) else {
            return Vec::new();
        };
        match event {
            SessionEvent::Lost { purpose, reason } => {
                let reason = format!("MCP server '{}' {reason}", s.name);
                out.log(LogLevel::Warn, reason.clone());
                failed(slot, purpose, &reason).into_iter().collect()
            }
            SessionEvent::Prompts(Err(cause)) => {
                s.consecutive_hook_timeouts = 0;
                out.log(LogLevel::Warn, format!("mcp '{}': {cause}", s.name));
                Vec::new()
            }
            SessionEvent::Prompts(Ok(entries)) => {
                s.consecutive_hook_timeouts = 0;
                let (list, warns) = prompts::parse_list(&entries, &s.name);
                for w in warns {
                    out.log(LogLevel::Warn, w);
                }
                if list == s.prompts {
                    return Vec::new();
                }
                s.prompts = list;
                vec![McpEvent::CommandsChanged { session: s.session }]
            }
            SessionEvent::CutOff { cause } => self.kill(slot, &cause, out, timers),
            SessionEvent::Elicit { request, params } => vec![McpEvent::Elicit {
                server: slot,
                generation: s.mcp.generation(),
                request,
                params,
            }],
            SessionEvent::Progress { token, text } => vec![McpEvent::Progress {
                server: slot,
                token,
                text,
            }],
            SessionEvent::HandshakeStep => {
                // H4 / I5: any reply resets the consecutive hook-timeout counter.
                s.consecutive_hook_timeouts = 0;
                Vec::new()
            }
            SessionEvent::HandshakeFailed { cause, fatal } => {
                s.consecutive_hook_timeouts = 0;
                let reason = s.describe_death(&cause);
                if fatal {
                    return self.died(slot, reason, true, out, timers);
                }
                out.log(LogLevel::Warn, reason);
                Vec::new()
            }
            SessionEvent::Listed {
                tools,
                ready_now,
                relist,
            } => {
                s.consecutive_hook_timeouts = 0;
                if ready_now && s.restarting {
                    s.failed_restarts = 0;
                    s.restarting = false;
                }
                let owner = Owner {
                    slot,
                    name: &s.name,
                    prefix: &s.prefix,
                };
                let claims = self.claims.entry(s.session).or_default();
                let dropped = s
                    .catalogue
                    .install(tools, owner, claims, &self.hook_allowlist, out);
                s.listed_once = true;
                s.listings = s.listings.saturating_add(1);
                let mut events = Vec::new();
                if !dropped.is_empty() {
                    events.push(McpEvent::ToolsDropped {
                        session: s.session,
                        notices: dropped,
                    });
                }
                if ready_now {
                    events.push(McpEvent::StartSettled { session: s.session });
                }
                if relist {
                    events.push(McpEvent::Relist { server: slot });
                }
                events
            }
            SessionEvent::Reply { purpose, outcome } => {
                s.consecutive_hook_timeouts = 0;
                match purpose {
                    // The session handles its own handshake answers.
                    Purpose::Initialize | Purpose::ListTools | Purpose::ListPrompts => Vec::new(),
                    Purpose::Tool(call) => {
                        if outcome.is_ok() {
                            s.deaths = 0; // M9: a successful call
                        }
                        vec![McpEvent::ToolReply {
                            call,
                            reply: outcome,
                        }]
                    }
                    Purpose::Hook(call) => vec![McpEvent::HookReply {
                        call,
                        reply: outcome,
                    }],
                    Purpose::GetPrompt(session) => vec![McpEvent::PromptGot {
                        session,
                        reply: outcome.map_err(|e| {
                            format!("MCP server '{}' answered {} {}", s.name, e.code, e.message)
                        }),
                    }],
                    Purpose::ListInterceptors(session) => vec![McpEvent::InterceptorList {
                        session,
                        server: slot,
                        reply: outcome.map_err(ListLost::Error),
                    }],
                    Purpose::Intercept(call) => vec![McpEvent::InterceptReply {
                        call,
                        reply: outcome,
                    }],
                }
            }
        }
    }

    /// Starts a `tools/list` (first page) unless one is in flight; a wanted relist then runs
    /// after it (SPEC M2, M6).
    pub(crate) fn start_listing(
        &mut self,
        slot: ServerSlot,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        if let Some(s) = self.servers.get_mut(&slot) {
            s.mcp.start_listing(out, timers);
            s.flush(out, timers);
        }
    }
}

#[cfg(test)]
impl ServerTable {
    /// Records a server of `session` named `name`, spawns it and completes its handshake with
    /// `tools` (names starting with `_` are hooks): a ready server for the tests of the machines
    /// that use the table.
    pub(crate) fn add_ready_for_tests(
        &mut self,
        session: SessionId,
        name: &str,
        tools: &[&str],
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> ServerSlot {
        let entry = McpServerEntry::stdio(name, "fake-mcp", &[]);
        let slot = self.create(session, "/w", &[], &entry);
        self.spawn(slot, out, timers);
        let proc = ProcKey {
            server: slot,
            generation: 0,
        };
        self.on_spawned(proc, out, timers);
        let answer = |table: &mut ServerTable,
                      result: serde_json::Value,
                      out: &mut Outbox,
                      timers: &mut TimerTable| {
            let id = table.servers[&slot].mcp.last_pending().map_or(0, |id| id.0);
            let message = jsonrpc::Message::Response {
                id: json!(id),
                outcome: Ok(result),
            };
            table.on_message(slot, message, out, timers)
        };
        answer(self, json!({"protocolVersion": "2025-06-18"}), out, timers);
        let list: Vec<serde_json::Value> = tools.iter().map(|t| json!({"name": t})).collect();
        answer(self, json!({"tools": list}), out, timers);
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::super::MCP_PROTOCOL_VERSION;
    use super::super::stdio::{KILL_GRACE_MS, MAX_MCP_LINE_BYTES};
    use super::super::{HookCallRef, ToolCallRef};
    use super::*;
    use crate::ids::{HookRoundId, ToolCallIndex, TurnNo};
    use crate::time::MonoTime;
    use serde_json::Value;

    const SESSION: SessionId = SessionId(1);
    const INIT_MS: u64 = 30_000;

    /// A table, its outbox and its timers: the pieces a step of the agent lends it.
    struct Rig {
        table: ServerTable,
        out: Outbox,
        timers: TimerTable,
    }

    impl Rig {
        fn new() -> Rig {
            Rig {
                table: ServerTable::new(INIT_MS, "9.9.9".into()),
                out: Outbox::new(LogLevel::Debug, MonoTime::ZERO),
                timers: TimerTable::default(),
            }
        }

        fn at(&mut self, ms: u64) {
            self.out.advance(MonoTime::ZERO.plus_ms(ms));
        }

        fn drain(&mut self) -> Vec<Action> {
            std::iter::from_fn(|| self.out.pop()).collect()
        }

        /// The JSON of every line written to `proc`, in order.
        fn written(actions: &[Action], proc: ProcKey) -> Vec<Value> {
            actions
                .iter()
                .filter_map(|a| {
                    if let Action::WriteMcp { proc: p, line } = a
                        && *p == proc
                    {
                        serde_json::from_str(line).ok()
                    } else {
                        None
                    }
                })
                .collect()
        }

        fn add(&mut self, name: &str) -> ServerSlot {
            self.add_in(SESSION, name)
        }

        /// Adds `name` to `session`'s servers and spawns it.
        fn add_in(&mut self, session: SessionId, name: &str) -> ServerSlot {
            let entry = McpServerEntry::stdio(name, "fake-mcp", &[("K", "client")]);
            let slot = self.table.create(session, "/w", &[], &entry);
            self.table.spawn(slot, &mut self.out, &mut self.timers);
            slot
        }

        /// Adds `name` and reports its first generation spawned: `initialize` is on its way.
        fn spawned(&mut self, name: &str) -> (ServerSlot, ProcKey) {
            let slot = self.add(name);
            let proc = ProcKey {
                server: slot,
                generation: 0,
            };
            self.table.on_spawned(proc, &mut self.out, &mut self.timers);
            (slot, proc)
        }

        /// Answers `request` of `proc` with `result` as one stdout line.
        fn reply(&mut self, proc: ProcKey, id: u64, result: Value) -> Vec<McpEvent> {
            let line = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string() + "\n";
            self.bytes(proc, line.as_bytes())
        }

        fn bytes(&mut self, proc: ProcKey, bytes: &[u8]) -> Vec<McpEvent> {
            let Some((slot, lines)) = self.table.split_lines(proc, bytes) else {
                return Vec::new();
            };
            let mut events = Vec::new();
            for line in lines {
                if self.table.is_dead(slot) {
                    break;
                }
                events.extend(
                    self.table
                        .on_line(slot, line, &mut self.out, &mut self.timers),
                );
            }
            events
        }

        /// Answers the pending request of `proc` whose method is `method` (the last one written).
        fn answer(&mut self, proc: ProcKey, method: &str, result: Value) -> Vec<McpEvent> {
            let actions = self.drain();
            let Some(id) = Rig::written(&actions, proc)
                .iter()
                .rev()
                .find(|l| l["method"] == method)
                .and_then(|l| l["id"].as_u64())
            else {
                panic!("no {method} request in {actions:?}");
            };
            self.reply(proc, id, result)
        }

        /// The handshake of `proc` (spawned), answered: `initialize`, then one page of tools.
        fn handshake(&mut self, proc: ProcKey, tools: &[&str]) -> Vec<McpEvent> {
            self.table.on_spawned(proc, &mut self.out, &mut self.timers);
            let events = self.answer(proc, "initialize", json!({"protocolVersion": "2025-06-18"}));
            assert!(events.is_empty());
            let list: Vec<Value> = tools.iter().map(|t| json!({"name": t})).collect();
            self.answer(proc, "tools/list", json!({"tools": list}))
        }

        /// Spawns and lists `name` with `tools` (names; `_` names are hooks): a ready server.
        fn ready(&mut self, name: &str, tools: &[&str]) -> (ServerSlot, ProcKey) {
            self.ready_in(SESSION, name, tools)
        }

        /// [`Rig::ready`] for a server of `session`.
        fn ready_in(
            &mut self,
            session: SessionId,
            name: &str,
            tools: &[&str],
        ) -> (ServerSlot, ProcKey) {
            let slot = self.add_in(session, name);
            let proc = ProcKey {
                server: slot,
                generation: 0,
            };
            let events = self.handshake(proc, tools);
            assert_eq!(events, vec![McpEvent::StartSettled { session }]);
            self.drain();
            (slot, proc)
        }

        fn tool_call(&mut self, slot: ServerSlot, index: usize) -> (McpRequestId, ToolCallRef) {
            let call = ToolCallRef {
                session: SESSION,
                turn: TurnNo(1),
                index: ToolCallIndex(index),
            };
            let id = self
                .table
                .send_request(
                    slot,
                    McpRequest {
                        method: "tools/call",
                        params: &json!({"name": "echo"}),
                        purpose: Purpose::Tool(call),
                        timeout_ms: 1000,
                    },
                    &mut self.out,
                    &mut self.timers,
                )
                .expect("the server exists");
            (id, call)
        }
    }

    #[test]
    fn m1_m2_a_server_is_spawned_with_the_merged_env_then_handshakes_and_lists() {
        let mut rig = Rig::new();
        rig.table.set_inherited_env(vec![
            ("K".into(), "agent".into()),
            ("PATH".into(), "/bin".into()),
        ]);
        let slot = rig.add("fs");
        let proc = ProcKey {
            server: slot,
            generation: 0,
        };
        let actions = rig.drain();
        let Some(Action::SpawnMcp { spec, .. }) = actions
            .iter()
            .find(|a| matches!(a, Action::SpawnMcp { .. }))
        else {
            panic!("no spawn in {actions:?}");
        };
        assert_eq!(
            spec.env,
            vec![
                ("K".into(), "client".into()),
                ("PATH".into(), "/bin".into())
            ],
            "M1: the client's entries win"
        );
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        let init = Rig::written(&rig.drain(), proc);
        assert_eq!(init[0]["method"], "initialize");
        assert_eq!(init[0]["params"]["clientInfo"]["version"], "9.9.9");
        assert_eq!(rig.table.start_state(&[slot]), StartState::Waiting);
        assert!(
            rig.reply(proc, 1, json!({"protocolVersion": "2025-06-18"}))
                .is_empty()
        );
        let lines = Rig::written(&rig.drain(), proc);
        assert_eq!(lines[0]["method"], "notifications/initialized");
        assert_eq!(lines[1]["method"], "tools/list");
        let events = rig.reply(
            proc,
            2,
            json!({"tools": [{"name": "read"}, {"name": "_Stop"}]}),
        );
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        assert_eq!(rig.table.start_state(&[slot]), StartState::Ready);
        let (defs, routes) = rig.table.visible_tools(&[slot]);
        assert_eq!(defs.len(), 1, "I10: hooks are never offered");
        assert_eq!(routes["fs__read"].qualified, "fs__read");
        assert_eq!(
            rig.table
                .hook_targets(&[slot], "_Stop", &HookAllowlist::All),
            vec![HookTarget {
                slot,
                name: "fs".to_string(),
                prefix: "fs".to_string(),
                ready: true
            }]
        );
        assert!(
            rig.table
                .hook_targets(&[slot], "_Stop", &HookAllowlist::Off)
                .is_empty(),
            "H2: not allowlisted"
        );
        assert_eq!(rig.timers.next(), None, "no request left in flight");
    }

    #[test]
    fn m2_an_unsupported_protocol_version_fails_the_start_and_kills_the_group() {
        let mut rig = Rig::new();
        let slot = rig.add("old");
        let proc = ProcKey {
            server: slot,
            generation: 0,
        };
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.drain();
        let events = rig.reply(proc, 1, json!({"protocolVersion": "1999-01-01"}));
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        let StartState::Failed(reason) = rig.table.start_state(&[slot]) else {
            panic!("the start must have failed");
        };
        assert!(reason.contains("unsupported MCP protocol version '1999-01-01'"));
        let actions = rig.drain();
        assert!(actions.contains(&Action::SignalProcessGroup {
            proc,
            signal: Signal::Term
        }));
        assert_eq!(
            rig.timers.next().map(|(t, k)| (t.as_ms(), k)),
            Some((KILL_GRACE_MS, Timer::kill(proc))),
            "M8: KILL follows the TERM"
        );
    }

    #[test]
    fn m7_a_death_fails_every_call_in_flight_with_the_stderr_tail() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let (_, call) = rig.tool_call(slot, 0);
        let hook = HookCallRef {
            session: SESSION,
            round: HookRoundId(1),
            index: 0,
        };
        rig.table.send_request(
            slot,
            McpRequest {
                method: "tools/call",
                params: &json!({}),
                purpose: Purpose::Hook(hook),
                timeout_ms: 1000,
            },
            &mut rig.out,
            &mut rig.timers,
        );
        rig.table
            .on_stderr_line(proc, "panic: disk full".into(), &mut rig.out);
        let events = rig
            .table
            .on_exited(proc, "exit status 3", &mut rig.out, &mut rig.timers);
        let [
            McpEvent::ToolFailed {
                call: failed,
                reason,
            },
            McpEvent::HookDead { call: dead },
        ] = events.as_slice()
        else {
            panic!("unexpected events {events:?}");
        };
        assert_eq!((*failed, *dead), (call, hook));
        assert_eq!(
            reason,
            "MCP server 'fs' exited (exit status 3); stderr:\npanic: disk full"
        );
        assert!(
            rig.timers
                .next()
                .is_some_and(|(_, t)| t == Timer::kill(proc)),
            "request deadlines are gone with the requests; only the group kill is left"
        );
        assert_eq!(
            rig.table.unavailable(slot).as_deref(),
            Some(reason.as_str())
        );
    }

    #[test]
    fn m9_a_serving_server_restarts_after_its_backoff_and_three_deaths_are_permanent() {
        let mut rig = Rig::new();
        let (slot, mut proc) = rig.ready("fs", &["read"]);
        for death in 1..=3u32 {
            rig.table
                .on_exited(proc, "exit status 1", &mut rig.out, &mut rig.timers);
            let (defs, _) = rig.table.visible_tools(&[slot]);
            if death < 3 {
                assert_eq!(defs.len(), 1, "M9: a recovering server keeps its tools");
                rig.table
                    .restart_due(SESSION, &mut rig.out, &mut rig.timers);
                assert!(
                    !rig.drain()
                        .iter()
                        .any(|a| matches!(a, Action::SpawnMcp { .. })),
                    "not before the backoff"
                );
                rig.at(u64::from(death) * 10_000);
                rig.table
                    .restart_due(SESSION, &mut rig.out, &mut rig.timers);
                proc = ProcKey {
                    server: slot,
                    generation: death,
                };
                assert!(
                    rig.drain().contains(&Action::SpawnMcp {
                        proc,
                        spec: rig.table.servers[&slot]
                            .stdio()
                            .expect("stdio")
                            .spec()
                            .clone()
                    })
                );
                let events = rig.handshake(proc, &["read"]);
                // Every completed first listing of a generation reports; the agent ignores it
                // for a session that already started.
                assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
                assert!(rig.table.servers[&slot].is_ready());
            } else {
                assert!(
                    defs.is_empty(),
                    "M9: permanently dead, its tools are removed"
                );
                rig.at(999_000);
                rig.table
                    .restart_due(SESSION, &mut rig.out, &mut rig.timers);
                assert!(
                    !rig.drain()
                        .iter()
                        .any(|a| matches!(a, Action::SpawnMcp { .. }))
                );
            }
        }
    }

    fn spawned(actions: &[Action]) -> Vec<ProcKey> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::SpawnMcp { proc, .. } = a {
                    Some(*proc)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn m9_a_call_after_the_backoff_restarts_the_server_and_waits_for_its_handshake() {
        let mut rig = Rig::new();
        let (slot, p0) = rig.ready("fs", &["read"]);
        // Killed (a tool timeout): its TERM is sent, its leader not reaped yet.
        rig.table
            .kill(slot, "timed out", &mut rig.out, &mut rig.timers);
        rig.drain();
        let now = |rig: &Rig| rig.out.now();
        // Within the backoff: the call fails at once, nothing restarts.
        rig.at(RESTART_BASE_MS - 1);
        rig.table
            .restart_for_call(slot, &mut rig.out, &mut rig.timers);
        assert!(spawned(&rig.drain()).is_empty());
        assert!(!rig.table.holds_calls(slot, now(&rig)));
        assert!(rig.table.unavailable(slot).is_some());
        // Past the backoff, the old leader still exiting: the call waits for the reap.
        rig.at(RESTART_BASE_MS);
        rig.table
            .restart_for_call(slot, &mut rig.out, &mut rig.timers);
        assert!(spawned(&rig.drain()).is_empty(), "not before the reap");
        assert!(rig.table.holds_calls(slot, now(&rig)));
        rig.table
            .on_exited(p0, "killed by signal 15", &mut rig.out, &mut rig.timers);
        assert!(
            !rig.table.holds_calls(slot, now(&rig)),
            "reaped: the call is dispatched again"
        );
        // The call restarts it and waits through the handshake.
        rig.table
            .restart_for_call(slot, &mut rig.out, &mut rig.timers);
        let p1 = generation(slot, 1);
        assert_eq!(spawned(&rig.drain()), vec![p1]);
        assert!(rig.table.holds_calls(slot, now(&rig)));
        rig.table
            .restart_for_call(slot, &mut rig.out, &mut rig.timers);
        assert!(spawned(&rig.drain()).is_empty(), "one restart at a time");
        rig.table.on_spawned(p1, &mut rig.out, &mut rig.timers);
        rig.answer(p1, "initialize", json!({"protocolVersion": "2025-06-18"}));
        assert!(rig.table.holds_calls(slot, now(&rig)), "listing");
        rig.answer(p1, "tools/list", json!({"tools": [{"name": "read"}]}));
        assert!(!rig.table.holds_calls(slot, now(&rig)));
        assert_eq!(rig.table.unavailable(slot), None, "ready: the call is sent");
    }

    #[test]
    fn m9_a_restart_whose_handshake_times_out_releases_the_waiting_call_to_fail() {
        let mut rig = Rig::new();
        let (slot, p0) = rig.ready("fs", &["read"]);
        rig.table
            .on_exited(p0, "exit status 1", &mut rig.out, &mut rig.timers);
        fire_kill(&mut rig, p0);
        rig.at(RESTART_BASE_MS);
        rig.table
            .restart_for_call(slot, &mut rig.out, &mut rig.timers);
        let p1 = generation(slot, 1);
        rig.table.on_spawned(p1, &mut rig.out, &mut rig.timers);
        rig.drain();
        assert!(rig.table.holds_calls(slot, rig.out.now()));
        let (at, timer) = rig.timers.next().expect("the handshake deadline");
        assert_eq!(at, MonoTime::ZERO.plus_ms(RESTART_BASE_MS + INIT_MS));
        let Timer::Server(_, ServerTimer::Request(id)) = timer else {
            panic!("{timer:?}");
        };
        rig.at(RESTART_BASE_MS + INIT_MS);
        rig.timers.clear(timer);
        rig.table.expire(slot, id, &mut rig.out, &mut rig.timers);
        assert!(
            !rig.table.holds_calls(slot, rig.out.now()),
            "the wait is bounded by the handshake timeout"
        );
        let reason = rig.table.unavailable(slot).unwrap_or_default();
        assert!(reason.contains("handshake timed out"), "{reason}");
        // Its next restart backs off longer (a failed restart): not due yet.
        rig.table
            .restart_for_call(slot, &mut rig.out, &mut rig.timers);
        assert!(spawned(&rig.drain()).is_empty());
    }

    #[test]
    fn m9_a_successful_call_resets_the_death_count() {
        let mut rig = Rig::new();
        let (slot, mut proc) = rig.ready("fs", &["read"]);
        for generation in 1..=4u32 {
            let (id, _) = rig.tool_call(slot, 0);
            rig.reply(proc, id.0, json!({"content": []}));
            rig.table
                .on_exited(proc, "exit status 1", &mut rig.out, &mut rig.timers);
            rig.at(u64::from(generation) * 10_000);
            rig.table
                .restart_due(SESSION, &mut rig.out, &mut rig.timers);
            proc = ProcKey {
                server: slot,
                generation,
            };
            rig.handshake(proc, &["read"]);
            assert!(rig.table.servers[&slot].is_ready(), "death {generation}");
        }
    }

    #[test]
    fn h4_i5_the_second_consecutive_hook_timeout_kills_and_a_reply_resets_the_count() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("guard", &["_Stop"]);
        let hook_call = |rig: &mut Rig, n: u64| {
            let call = HookCallRef {
                session: SESSION,
                round: HookRoundId(n),
                index: 0,
            };
            rig.table
                .send_request(
                    slot,
                    McpRequest {
                        method: "tools/call",
                        params: &json!({}),
                        purpose: Purpose::Hook(call),
                        timeout_ms: 100,
                    },
                    &mut rig.out,
                    &mut rig.timers,
                )
                .expect("ready")
        };
        let first = hook_call(&mut rig, 1);
        assert!(
            rig.table
                .hook_timed_out(slot, first, 100, "hook", &mut rig.out, &mut rig.timers)
                .is_empty()
        );
        let answered = hook_call(&mut rig, 2);
        let events = rig.reply(proc, answered.0, json!({"content": []}));
        assert!(matches!(events.as_slice(), [McpEvent::HookReply { .. }]));
        let third = hook_call(&mut rig, 3);
        assert!(
            rig.table
                .hook_timed_out(slot, third, 100, "hook", &mut rig.out, &mut rig.timers)
                .is_empty(),
            "I5: the reply reset the count, this is 1/2 again"
        );
        assert!(rig.table.servers[&slot].is_ready());
        let fourth = hook_call(&mut rig, 4);
        rig.table
            .hook_timed_out(slot, fourth, 100, "hook", &mut rig.out, &mut rig.timers);
        assert!(
            rig.table.is_dead(slot),
            "I5: the 2nd consecutive timeout kills"
        );
        let actions = rig.drain();
        let cancels = Rig::written(&actions, proc)
            .into_iter()
            .filter(|l| l["method"] == "notifications/cancelled")
            .count();
        assert_eq!(cancels, 3, "every timed-out hook call is cancelled");
    }

    #[test]
    fn i6_late_and_foreign_replies_and_stale_generations_change_nothing() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let (id, _) = rig.tool_call(slot, 0);
        rig.table
            .cancel_request(slot, id, "cancelled", &mut rig.out, &mut rig.timers);
        assert_eq!(
            rig.timers.next(),
            None,
            "a cancelled request has no deadline"
        );
        assert!(rig.reply(proc, id.0, json!({"content": []})).is_empty());
        assert!(rig.reply(proc, 77, json!({})).is_empty());
        let stale = ProcKey {
            server: slot,
            generation: 5,
        };
        assert!(rig.reply(stale, 1, json!({})).is_empty());
        assert!(
            rig.table
                .on_exited(stale, "exit status 0", &mut rig.out, &mut rig.timers)
                .is_empty()
        );
        assert!(rig.table.servers[&slot].is_ready());
    }

    #[test]
    fn t6_an_oversize_stdout_line_kills_the_server() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let big = vec![b'x'; MAX_MCP_LINE_BYTES + 1];
        rig.bytes(proc, &big);
        assert!(rig.table.is_dead(slot));
        let Some(SessionState::Closed { reason }) = rig.table.get(slot).map(Server::state) else {
            panic!("dead");
        };
        assert!(reason.contains("over 16 MiB"), "{reason}");
    }

    #[test]
    fn c53_c55_c56_titles_kinds_prefixes_and_one_warning_for_hooks_that_will_not_run() {
        let mut rig = Rig::new();
        rig.table
            .set_hook_allowlist(HookAllowlist::Names(vec!["testguard".into()]));
        let slot = rig.add("TestGuard");
        let proc = ProcKey {
            server: slot,
            generation: 0,
        };
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.reply(proc, 1, json!({"protocolVersion": "2025-06-18"}));
        let tools = json!({"tools": [
            {"name": "read_text_file", "title": "Read Text File", "annotations": {"readOnlyHint": true}},
            {"name": "delete_file", "annotations": {"destructiveHint": true}},
            {"name": "_Stop"}
        ]});
        rig.reply(proc, 2, tools.clone());
        let warned = |actions: &[Action]| {
            actions
                .iter()
                .filter_map(|a| {
                    if let Action::Log(r) = a {
                        Some(r.message.clone())
                    } else {
                        None
                    }
                })
                .filter(|m| m.contains("MCP_HOOK_SERVERS"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            warned(&rig.drain()),
            [
                "server 'TestGuard' exposes hooks _Stop but is not in MCP_HOOK_SERVERS (testguard); they will not be called"
            ]
        );
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        rig.reply(proc, 3, tools);
        assert!(
            warned(&rig.drain()).is_empty(),
            "once per session and server"
        );
        assert!(
            rig.table
                .hook_targets(
                    &[slot],
                    "_Stop",
                    &HookAllowlist::Names(vec!["testguard".into()])
                )
                .is_empty(),
            "no case folding"
        );
        let (_, routes) = rig.table.visible_tools(&[slot]);
        let read = &routes["TestGuard__read_text_file"];
        assert_eq!((read.title.as_str(), read.kind), ("Read Text File", "read"));
        let del = &routes["TestGuard__delete_file"];
        assert_eq!(
            (del.title.as_str(), del.kind),
            ("TestGuard: delete_file", "delete")
        );

        let odd = rig.add("My Files");
        let proc = ProcKey {
            server: odd,
            generation: 0,
        };
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.reply(proc, 1, json!({"protocolVersion": "2025-06-18"}));
        rig.reply(proc, 2, json!({"tools": [{"name": "read"}]}));
        let (_, routes) = rig.table.visible_tools(&[odd]);
        let prefix = crate::tools::server_prefix("My Files");
        let route = &routes[&format!("{prefix}__read")];
        assert_eq!(
            route.target,
            super::super::ToolTarget::Server(odd),
            "the mapped name reaches the right server"
        );
        assert_eq!(
            route.title, "My Files: read",
            "the title keeps the client's name"
        );
    }

    #[test]
    fn m6_a_list_change_during_the_first_listing_relists_after_the_start_settles() {
        let mut rig = Rig::new();
        let slot = rig.add("fs");
        let proc = ProcKey {
            server: slot,
            generation: 0,
        };
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.reply(proc, 1, json!({"protocolVersion": "2025-06-18"}));
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        let events = rig.reply(proc, 2, json!({"tools": []}));
        assert_eq!(
            events,
            vec![
                McpEvent::StartSettled { session: SESSION },
                McpEvent::Relist { server: slot }
            ]
        );
    }

    #[test]
    fn m8_a_server_stopped_while_its_spawn_is_in_flight_is_stopped_when_it_starts() {
        let mut rig = Rig::new();
        let slot = rig.add("fs");
        let proc = ProcKey {
            server: slot,
            generation: 0,
        };
        rig.table
            .stop(slot, "session start failed", &mut rig.out, &mut rig.timers);
        assert!(
            rig.drain()
                .iter()
                .all(|a| !matches!(a, Action::SignalProcessGroup { .. }))
        );
        assert!(!rig.table.any_spawned());
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        let actions = rig.drain();
        assert_eq!(
            actions,
            vec![
                Action::CloseMcpStdin { proc },
                Action::SignalProcessGroup {
                    proc,
                    signal: Signal::Term
                }
            ]
        );
        assert!(rig.table.any_leader_alive() && rig.table.any_spawned());
        assert_eq!(rig.table.procs_to_sweep(&rig.timers), vec![proc]);
        rig.table
            .on_exited(proc, "exit status 0", &mut rig.out, &mut rig.timers);
        assert!(!rig.table.any_leader_alive());
    }

    #[test]
    fn m5_a_tool_call_deadline_is_handed_to_the_agent_with_its_owner() {
        let mut rig = Rig::new();
        let (slot, _) = rig.ready("fs", &["read"]);
        let (id, call) = rig.tool_call(slot, 3);
        let (at, timer) = rig.timers.next().expect("one deadline");
        assert_eq!(
            (at.as_ms(), timer),
            (1000, Timer::Server(slot, ServerTimer::Request(id)))
        );
        let (expired, events) = rig
            .table
            .expire(slot, id, &mut rig.out, &mut rig.timers)
            .expect("still in flight");
        assert_eq!(expired, Expired::Tool(call));
        assert!(events.is_empty());
    }

    /// The log lines among `actions`, with their levels.
    fn logs(actions: &[Action]) -> Vec<(LogLevel, String)> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::Log(r) = a {
                    Some((r.level, r.message.clone()))
                } else {
                    None
                }
            })
            .collect()
    }

    /// The process-group signals among `actions`.
    fn signals(actions: &[Action]) -> Vec<(ProcKey, Signal)> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::SignalProcessGroup { proc, signal } = a {
                    Some((*proc, *signal))
                } else {
                    None
                }
            })
            .collect()
    }

    fn generation(slot: ServerSlot, generation: u32) -> ProcKey {
        ProcKey {
            server: slot,
            generation,
        }
    }

    #[test]
    fn t6_a_stdout_line_of_exactly_16_mib_is_still_a_reply() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let (id, call) = rig.tool_call(slot, 0);
        let tail = b"\"}}";
        let mut line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"text\":\"",
            id.0
        )
        .into_bytes();
        line.resize(16 * 1024 * 1024 - tail.len(), b'x');
        line.extend_from_slice(tail);
        assert_eq!(line.len(), 16 << 20);
        line.push(b'\n');
        let events = rig.bytes(proc, &line);
        assert!(
            matches!(events.as_slice(), [McpEvent::ToolReply { call: c, reply: Ok(_) }] if *c == call),
            "T6: only a line over 16 MiB kills"
        );
        assert!(rig.table.servers[&slot].is_ready());
    }

    #[test]
    fn m2_the_initialize_request_carries_our_protocol_version_and_the_set_client_version() {
        let mut rig = Rig::new();
        rig.table.set_client_version("1.2.3".into());
        let slot = rig.add("fs");
        let proc = generation(slot, 0);
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        let init = Rig::written(&rig.drain(), proc);
        assert_eq!(init[0]["params"]["clientInfo"]["version"], "1.2.3");
        assert_eq!(init[0]["params"]["protocolVersion"], MCP_PROTOCOL_VERSION);
    }

    #[test]
    fn a2_x1_each_server_has_its_own_slot_session_and_name_and_the_allowlist_picks_some() {
        let mut rig = Rig::new();
        let (a, _) = rig.ready("a", &["one"]);
        let (b, _) = rig.ready("b", &["two"]);
        assert_ne!(a, b);
        let (_, routes) = rig.table.visible_tools(&[a]);
        assert_eq!(routes.keys().collect::<Vec<_>>(), ["a__one"]);
        let (_, routes) = rig.table.visible_tools(&[b]);
        assert_eq!(routes.keys().collect::<Vec<_>>(), ["b__two"]);
        assert_eq!(rig.table.session_of(b), Some(SESSION));
        assert_eq!(rig.table.session_of(ServerSlot(99)), None);
        assert_eq!(
            (rig.table.name(a), rig.table.name(b)),
            ("a".into(), "b".into())
        );
        assert_eq!(rig.table.name(ServerSlot(99)), "");
        let c = rig.add("c");
        assert_eq!(
            rig.table.allowed(
                &[a, b, c],
                &HookAllowlist::Names(vec!["b".into(), "c".into()])
            ),
            vec![(b, "b".to_string(), true), (c, "c".to_string(), false)],
            "X1: the named servers in registration order, ready or not"
        );
        assert!(rig.table.allowed(&[a, b], &HookAllowlist::Off).is_empty());
    }

    #[test]
    fn m1_a_server_s_log_messages_are_logged_at_their_level_with_its_name() {
        let mut rig = Rig::new();
        let (_, proc) = rig.ready("fs", &[]);
        for (level, data) in [
            ("debug", json!("d")),
            ("info", json!("i")),
            ("notice", json!("n")),
            ("warning", json!("w")),
            ("error", json!("e")),
            ("alert", json!({"k": 1})),
        ] {
            let line = json!({"jsonrpc": "2.0", "method": "notifications/message",
                              "params": {"level": level, "data": data}})
            .to_string()
                + "\n";
            assert!(rig.bytes(proc, line.as_bytes()).is_empty());
        }
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":\"plain\"}}\n",
        );
        assert_eq!(
            logs(&rig.drain()),
            vec![
                (LogLevel::Debug, "[mcp:fs] d".to_string()),
                (LogLevel::Info, "[mcp:fs] i".to_string()),
                (LogLevel::Info, "[mcp:fs] n".to_string()),
                (LogLevel::Warn, "[mcp:fs] w".to_string()),
                (LogLevel::Error, "[mcp:fs] e".to_string()),
                (LogLevel::Error, "[mcp:fs] {\"k\":1}".to_string()),
                (LogLevel::Info, "[mcp:fs] plain".to_string()),
            ]
        );
    }

    #[test]
    fn t6_non_json_rpc_lines_are_logged_never_answered_and_quieter_after_100() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        for _ in 0..101 {
            assert!(rig.bytes(proc, b"garbage\n").is_empty());
        }
        let actions = rig.drain();
        assert!(Rig::written(&actions, proc).is_empty(), "never answered");
        let levels: Vec<LogLevel> = logs(&actions).into_iter().map(|(l, _)| l).collect();
        assert_eq!(levels.len(), 101);
        assert!(levels[..100].iter().all(|l| *l == LogLevel::Warn));
        assert_eq!(levels[100], LogLevel::Debug);
        assert_eq!(
            logs(&actions)[0].1,
            "mcp 'fs': ignoring non-JSON-RPC stdout line: \"garbage\""
        );
        assert!(rig.table.servers[&slot].is_ready());
    }

    #[test]
    fn m1_a_server_s_ping_is_answered_and_its_other_requests_get_method_not_found() {
        let mut rig = Rig::new();
        let (_, proc) = rig.ready("fs", &[]);
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"id\":\"p1\",\"method\":\"ping\"}\n",
        );
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"sampling/createMessage\"}\n",
        );
        let lines = Rig::written(&rig.drain(), proc);
        assert_eq!(
            lines,
            vec![
                json!({"jsonrpc": "2.0", "id": "p1", "result": {}}),
                json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32601,
                       "message": "Method not found: sampling/createMessage"}}),
            ]
        );
    }

    #[test]
    fn c59_a_progress_notification_with_a_token_is_an_event_with_its_text() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &[]);
        let events = rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t1\",\"progress\":3,\"total\":10,\"message\":\" copying \"}}\n",
        );
        assert_eq!(
            events,
            vec![McpEvent::Progress {
                server: slot,
                token: json!("t1"),
                text: "copying (3/10)".into()
            }]
        );
        for params in [
            json!({"progress": 1}),
            json!({"progressToken": null, "progress": 1}),
        ] {
            let line =
                json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})
                    .to_string()
                    + "\n";
            assert!(rig.bytes(proc, line.as_bytes()).is_empty(), "{params}");
        }
    }

    #[test]
    fn m2_tools_list_pages_are_followed_until_no_cursor_or_an_empty_one() {
        let mut rig = Rig::new();
        let slot = rig.add("fs");
        let proc = generation(slot, 0);
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.answer(proc, "initialize", json!({"protocolVersion": "2025-06-18"}));
        let events = rig.answer(
            proc,
            "tools/list",
            json!({"tools": [{"name": "a"}], "nextCursor": "c1"}),
        );
        assert!(events.is_empty());
        let actions = rig.drain();
        let lines = Rig::written(&actions, proc);
        assert_eq!(lines[0]["params"], json!({"cursor": "c1"}));
        let id = lines[0]["id"].as_u64().expect("an id");
        let events = rig.reply(
            proc,
            id,
            json!({"tools": [{"name": "b"}], "nextCursor": ""}),
        );
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        assert!(
            Rig::written(&rig.drain(), proc).is_empty(),
            "an empty cursor ends the list"
        );
        let (_, routes) = rig.table.visible_tools(&[slot]);
        assert_eq!(routes.keys().collect::<Vec<_>>(), ["fs__a", "fs__b"]);
    }

    #[test]
    fn m2_a_tools_list_stops_at_a_repeated_cursor_or_after_100_pages() {
        let mut rig = Rig::new();
        let slot = rig.add("loop");
        let proc = generation(slot, 0);
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.answer(proc, "initialize", json!({"protocolVersion": "2025-06-18"}));
        rig.answer(
            proc,
            "tools/list",
            json!({"tools": [{"name": "a"}], "nextCursor": "c1"}),
        );
        let events = rig.answer(
            proc,
            "tools/list",
            json!({"tools": [{"name": "b"}], "nextCursor": "c1"}),
        );
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        let actions = rig.drain();
        assert!(Rig::written(&actions, proc).is_empty());
        assert!(
            logs(&actions).contains(&(
                LogLevel::Warn,
                "mcp 'loop': tools/list repeated cursor \"c1\"; stopping".to_string()
            )),
            "{actions:?}"
        );
        assert_eq!(rig.table.visible_tools(&[slot]).0.len(), 2);

        let slot = rig.add("endless");
        let proc = generation(slot, 0);
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        rig.answer(proc, "initialize", json!({"protocolVersion": "2025-06-18"}));
        let mut pages = 0;
        let events = loop {
            pages += 1;
            let page = json!({"tools": [{"name": format!("t{pages}")}], "nextCursor": format!("c{pages}")});
            let events = rig.answer(proc, "tools/list", page);
            if !events.is_empty() {
                break events;
            }
            assert!(pages < 200, "the listing never stops");
        };
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        assert_eq!(pages, 100, "M2: at most 100 pages");
        assert_eq!(rig.table.visible_tools(&[slot]).0.len(), 100);
        assert!(logs(&rig.drain()).contains(&(
            LogLevel::Warn,
            "mcp 'endless': tools/list exceeded 100 pages; stopping".to_string()
        )));
    }

    #[test]
    fn m3_a_repeated_tool_name_gets_a_suffix_once_and_is_then_dropped() {
        let suffixed = format!("fs__read_{:08x}", tools::fnv1a(b"read") & 0xffff_ffff);
        for (copies, warned) in [(2, false), (3, true)] {
            let mut rig = Rig::new();
            let slot = rig.add("fs");
            rig.handshake(generation(slot, 0), &vec!["read"; copies]);
            let dropped = logs(&rig.drain()).contains(&(
                LogLevel::Warn,
                "mcp 'fs': dropping duplicate tool 'read'".to_string(),
            ));
            assert_eq!(dropped, warned, "{copies} copies");
            let (defs, _) = rig.table.visible_tools(&[slot]);
            let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
            assert_eq!(names, ["fs__read", suffixed.as_str()], "{copies} copies");
        }
    }

    #[test]
    fn c56_no_warning_for_a_server_without_hooks_or_one_that_is_allowlisted() {
        let mut rig = Rig::new();
        rig.table
            .set_hook_allowlist(HookAllowlist::Names(vec!["guard".into()]));
        for (name, tools) in [("plain", "read"), ("guard", "_Stop")] {
            let slot = rig.add(name);
            rig.handshake(generation(slot, 0), &[tools]);
            assert!(
                logs(&rig.drain())
                    .iter()
                    .all(|(_, m)| !m.contains("MCP_HOOK_SERVERS")),
                "C56: {name} has no hooks that will not run"
            );
        }
    }

    #[test]
    fn m1_p2_the_stderr_tail_keeps_the_last_20_lines_each_capped() {
        let mut rig = Rig::new();
        let (_, proc) = rig.ready("fs", &["read"]);
        for n in 0..20 {
            rig.table
                .on_stderr_line(proc, format!("l{n}"), &mut rig.out);
        }
        let long = "x".repeat(20_000);
        rig.table.on_stderr_line(proc, long, &mut rig.out);
        let capped =
            crate::io::cap_stderr_line(&"x".repeat(20_000), crate::io::MAX_STDERR_LINE_BYTES);
        assert_eq!(capped.len(), crate::io::MAX_STDERR_LINE_BYTES);
        assert_eq!(
            logs(&rig.drain()).last(),
            Some(&(LogLevel::Info, format!("[mcp:fs] {capped}")))
        );
        rig.table
            .on_exited(proc, "exit status 1", &mut rig.out, &mut rig.timers);
        let tail: Vec<String> = (1..20).map(|n| format!("l{n}")).chain([capped]).collect();
        assert_eq!(
            rig.table.unavailable(proc.server),
            Some(format!(
                "MCP server 'fs' exited (exit status 1); stderr:\n{}",
                tail.join("\n")
            ))
        );
    }

    #[test]
    fn m7_a_closed_stdout_gives_the_server_a_grace_to_exit_then_it_is_killed() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let (_, call) = rig.tool_call(slot, 0);
        let closed = Timer::Server(slot, ServerTimer::StdoutClosed);
        rig.at(100);
        rig.table
            .on_stdout_closed(proc, &mut rig.out, &mut rig.timers);
        assert_eq!(
            rig.timers.get(closed),
            Some(MonoTime::ZERO.plus_ms(100 + STDOUT_CLOSED_GRACE_MS))
        );
        let events = rig
            .table
            .stdout_grace_over(slot, &mut rig.out, &mut rig.timers);
        assert_eq!(
            events,
            vec![McpEvent::ToolFailed {
                call,
                reason: "MCP server 'fs' closed its stdout".into()
            }]
        );
        assert!(!rig.timers.contains(closed));
        assert_eq!(signals(&rig.drain()), vec![(proc, Signal::Term)]);

        // Within the grace the exit explains the death and the grace ends.
        let (slot, proc) = rig.ready("exits", &["read"]);
        rig.table
            .on_stdout_closed(proc, &mut rig.out, &mut rig.timers);
        let closed = Timer::Server(slot, ServerTimer::StdoutClosed);
        assert!(rig.timers.contains(closed));
        rig.table
            .on_exited(proc, "exit status 2", &mut rig.out, &mut rig.timers);
        assert!(!rig.timers.contains(closed));
        assert_eq!(
            rig.table.unavailable(slot).as_deref(),
            Some("MCP server 'exits' exited (exit status 2)")
        );
    }

    #[test]
    fn m7_a_killed_server_whose_stdout_closes_gets_no_second_grace() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        rig.table
            .kill(slot, "was killed", &mut rig.out, &mut rig.timers);
        rig.table
            .on_stdout_closed(proc, &mut rig.out, &mut rig.timers);
        assert!(
            !rig.timers
                .contains(Timer::Server(slot, ServerTimer::StdoutClosed))
        );
        assert!(
            rig.table
                .on_write_failed(proc, &mut rig.out, &mut rig.timers)
                .is_empty()
        );
        assert!(
            !rig.timers
                .contains(Timer::Server(slot, ServerTimer::StdoutClosed))
        );
    }

    #[test]
    fn m7_a_failed_write_gives_a_running_server_the_grace_and_kills_one_not_running() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        assert!(
            rig.table
                .on_write_failed(proc, &mut rig.out, &mut rig.timers)
                .is_empty()
        );
        let closed = Timer::Server(slot, ServerTimer::StdoutClosed);
        assert_eq!(
            rig.timers.get(closed),
            Some(MonoTime::ZERO.plus_ms(STDOUT_CLOSED_GRACE_MS))
        );
        assert!(rig.table.servers[&slot].is_ready());

        let waiting = rig.add("spawning");
        let events =
            rig.table
                .on_write_failed(generation(waiting, 0), &mut rig.out, &mut rig.timers);
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        assert_eq!(
            rig.table.unavailable(waiting).as_deref(),
            Some("MCP server 'spawning' stopped reading its stdin")
        );
    }

    #[test]
    fn m1_m9_a_server_that_cannot_be_spawned_fails_without_signals_and_failed_restarts_back_off() {
        let mut rig = Rig::new();
        let slot = rig.add("gone");
        rig.drain();
        let events = rig.table.on_spawn_failed(
            generation(slot, 0),
            "No such file or directory (os error 2)",
            &mut rig.out,
            &mut rig.timers,
        );
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        assert_eq!(
            rig.table.start_state(&[slot]),
            StartState::Failed(
                "MCP server 'gone' failed to start: spawning 'fake-mcp' failed: No such file or directory (os error 2)"
                    .into()
            )
        );
        assert!(signals(&rig.drain()).is_empty(), "no process, no group");
        assert!(!rig.table.any_spawned());

        // A serving server dies (death 1, backoff 0.5 s); its restart cannot be spawned
        // (a failed restart, death 2): the next backoff is 1 s; then it is permanently dead.
        let (slot, proc) = rig.ready("fs", &["read"]);
        rig.table
            .on_exited(proc, "exit status 1", &mut rig.out, &mut rig.timers);
        rig.at(RESTART_BASE_MS);
        rig.table
            .restart_due(SESSION, &mut rig.out, &mut rig.timers);
        let g1 = generation(slot, 1);
        assert!(rig.table.any_spawned(), "an earlier generation was spawned");
        rig.drain();
        let events = rig
            .table
            .on_spawn_failed(g1, "EACCES", &mut rig.out, &mut rig.timers);
        assert!(events.is_empty(), "the session started long ago");
        let actions = rig.drain();
        assert!(signals(&actions).is_empty(), "{actions:?}");
        assert!(!rig.timers.contains(Timer::kill(g1)));
        assert_eq!(
            rig.table.start_state(&[slot]),
            StartState::Waiting,
            "a server that served once is recovering, not a failed start"
        );
        rig.at(RESTART_BASE_MS + 999);
        rig.table
            .restart_due(SESSION, &mut rig.out, &mut rig.timers);
        assert!(
            !rig.drain()
                .iter()
                .any(|a| matches!(a, Action::SpawnMcp { .. })),
            "M9: the backoff doubled"
        );
        rig.at(RESTART_BASE_MS + 1000);
        rig.table
            .restart_due(SESSION, &mut rig.out, &mut rig.timers);
        let g2 = generation(slot, 2);
        assert!(
            rig.drain()
                .iter()
                .any(|a| matches!(a, Action::SpawnMcp { proc, .. } if *proc == g2))
        );
        rig.table
            .on_spawn_failed(g2, "EACCES", &mut rig.out, &mut rig.timers);
        assert!(
            rig.table.visible_tools(&[slot]).0.is_empty(),
            "permanently dead"
        );
    }

    #[test]
    fn m2_a_handshake_that_times_out_fails_the_start_and_a_late_relist_only_warns() {
        let mut rig = Rig::new();
        let slot = rig.add("slow");
        let proc = generation(slot, 0);
        rig.table.on_spawned(proc, &mut rig.out, &mut rig.timers);
        let (_, timer) = rig.timers.next().expect("the handshake deadline");
        let Timer::Server(_, ServerTimer::Request(id)) = timer else {
            panic!("{timer:?}");
        };
        let (expired, events) = rig
            .table
            .expire(slot, id, &mut rig.out, &mut rig.timers)
            .expect("in flight");
        assert_eq!(expired, Expired::Handshake);
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        assert_eq!(
            rig.table.start_state(&[slot]),
            StartState::Failed(
                "MCP server 'slow' failed to start: handshake timed out after 30 s (BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS)"
                    .into()
            )
        );

        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        let (_, timer) = rig.timers.next().expect("the listing deadline");
        let Timer::Server(_, ServerTimer::Request(id)) = timer else {
            panic!("{timer:?}");
        };
        rig.drain();
        let (expired, events) = rig
            .table
            .expire(slot, id, &mut rig.out, &mut rig.timers)
            .expect("in flight");
        assert_eq!((expired, events), (Expired::Handshake, vec![]));
        assert_eq!(
            logs(&rig.drain()),
            vec![(
                LogLevel::Warn,
                "mcp 'fs': tools/list timed out after 30 s".to_string()
            )]
        );
        assert!(rig.table.servers[&slot].is_ready());
    }

    #[test]
    fn h4_the_kill_after_two_hook_timeouts_fails_the_tool_calls_still_in_flight() {
        let mut rig = Rig::new();
        let (slot, _) = rig.ready("guard", &["read", "_Stop"]);
        let (_, call) = rig.tool_call(slot, 0);
        for round in 1..=2 {
            let id = rig
                .table
                .send_request(
                    slot,
                    McpRequest {
                        method: "tools/call",
                        params: &json!({}),
                        purpose: Purpose::Hook(HookCallRef {
                            session: SESSION,
                            round: HookRoundId(round),
                            index: 0,
                        }),
                        timeout_ms: 100,
                    },
                    &mut rig.out,
                    &mut rig.timers,
                )
                .expect("ready");
            let events =
                rig.table
                    .hook_timed_out(slot, id, 100, "hook", &mut rig.out, &mut rig.timers);
            if round == 2 {
                assert_eq!(
                    events,
                    vec![McpEvent::ToolFailed {
                        call,
                        reason: "MCP server 'guard' was killed after 2 consecutive hook timeouts"
                            .into()
                    }]
                );
            }
        }
    }

    #[test]
    fn m8_stopping_a_ready_server_closes_its_stdin_and_terms_its_group_once() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        rig.tool_call(slot, 0);
        rig.drain();
        rig.table
            .stop(slot, "session start failed", &mut rig.out, &mut rig.timers);
        assert_eq!(
            rig.drain(),
            vec![
                Action::CloseMcpStdin { proc },
                Action::SignalProcessGroup {
                    proc,
                    signal: Signal::Term
                }
            ]
        );
        assert_eq!(
            rig.timers.next(),
            Some((MonoTime::ZERO.plus_ms(KILL_GRACE_MS), Timer::kill(proc))),
            "the request is dropped with its deadline; the KILL follows"
        );
        rig.table.stop(slot, "again", &mut rig.out, &mut rig.timers);
        assert!(rig.drain().is_empty(), "a group is asked to go once");
        assert_eq!(
            rig.table.unavailable(slot).as_deref(),
            Some("MCP server 'fs' stopped: session start failed")
        );
        rig.table
            .term_grace_over(proc, &mut rig.out, &mut rig.timers);
        assert_eq!(signals(&rig.drain()), vec![(proc, Signal::Kill)]);
    }

    /// The agent's part of a due kill timer: taken from the table, then handed over.
    fn fire_kill(rig: &mut Rig, proc: ProcKey) {
        assert!(
            rig.timers.clear(Timer::kill(proc)).is_some(),
            "{proc} has a kill timer"
        );
        rig.table
            .term_grace_over(proc, &mut rig.out, &mut rig.timers);
    }

    #[test]
    fn m8_a_stopped_server_leaves_the_table_once_reaped_and_killed_in_either_order() {
        let mut rig = Rig::new();
        // Exit first (the leader heeds the TERM), then the group's SIGKILL.
        let (a, pa) = rig.ready("a", &["read"]);
        rig.tool_call(a, 0);
        rig.table
            .stop(a, "the session was closed", &mut rig.out, &mut rig.timers);
        rig.table
            .on_exited(pa, "exit status 0", &mut rig.out, &mut rig.timers);
        assert_eq!(rig.table.len(), 1, "the group still gets its SIGKILL");
        fire_kill(&mut rig, pa);
        assert_eq!(
            signals(&rig.drain()),
            vec![(pa, Signal::Term), (pa, Signal::Kill)]
        );
        assert_eq!(rig.table.len(), 0, "nothing of a stopped server is kept");
        assert_eq!(rig.timers.len(), 0, "and no timer of it");
        // A leader deaf to TERM: the SIGKILL first, then its exit.
        let (b, pb) = rig.ready("b", &["read"]);
        rig.table
            .stop(b, "the session was closed", &mut rig.out, &mut rig.timers);
        fire_kill(&mut rig, pb);
        assert_eq!(rig.table.len(), 1, "its leader is not reaped yet");
        rig.table
            .on_exited(pb, "killed by signal 9", &mut rig.out, &mut rig.timers);
        assert_eq!((rig.table.len(), rig.timers.len()), (0, 0));
        // Inputs that name a forgotten server are inert.
        assert!(rig.bytes(pb, b"{}\n").is_empty());
        rig.table.on_stderr_line(pb, "late".into(), &mut rig.out);
        assert!(rig.table.is_dead(b) && rig.table.name(b).is_empty());
        rig.drain();
    }

    #[test]
    fn m8_a_server_stopped_before_its_spawn_was_answered_or_after_it_failed_is_forgotten() {
        let mut rig = Rig::new();
        // Stopped while its spawn is in flight: kept until the spawn is answered.
        let a = rig.add("a");
        let pa = generation(a, 0);
        rig.table
            .stop(a, "session start failed", &mut rig.out, &mut rig.timers);
        assert_eq!(rig.table.len(), 1, "a process may be about to exist");
        rig.table.on_spawned(pa, &mut rig.out, &mut rig.timers);
        rig.table
            .on_exited(pa, "exit status 0", &mut rig.out, &mut rig.timers);
        fire_kill(&mut rig, pa);
        assert_eq!(rig.table.len(), 0);
        // Its spawn failed, then it was stopped: nothing to wait for.
        let b = rig.add("b");
        rig.table.on_spawn_failed(
            generation(b, 0),
            "No such file or directory",
            &mut rig.out,
            &mut rig.timers,
        );
        rig.table
            .stop(b, "session start failed", &mut rig.out, &mut rig.timers);
        assert_eq!(rig.table.len(), 0);
        // Stopped in flight, then the spawn failed.
        let c = rig.add("c");
        rig.table
            .stop(c, "session start failed", &mut rig.out, &mut rig.timers);
        rig.table.on_spawn_failed(
            generation(c, 0),
            "No such file or directory",
            &mut rig.out,
            &mut rig.timers,
        );
        assert_eq!((rig.table.len(), rig.timers.len()), (0, 0));
        rig.drain();
    }

    #[test]
    fn m8_m9_servers_of_1500_sessions_restarted_then_stopped_leave_nothing_behind() {
        let mut rig = Rig::new();
        let mut now = 0;
        for n in 0..1500 {
            let session = SessionId(100 + n);
            let (slot, p0) = rig.ready_in(session, "fs", &["read", "write"]);
            // It dies once and restarts (a second generation), then its session closes.
            rig.table
                .on_exited(p0, "exit status 1", &mut rig.out, &mut rig.timers);
            fire_kill(&mut rig, p0);
            now += RESTART_BASE_MS;
            rig.at(now);
            rig.table
                .restart_due(session, &mut rig.out, &mut rig.timers);
            let p1 = generation(slot, 1);
            rig.handshake(p1, &["read"]);
            assert!(rig.table.servers[&slot].is_ready());
            rig.table.stop(
                slot,
                "the session was closed",
                &mut rig.out,
                &mut rig.timers,
            );
            rig.table
                .on_exited(p1, "exit status 0", &mut rig.out, &mut rig.timers);
            fire_kill(&mut rig, p1);
            rig.drain();
        }
        assert_eq!(rig.table.len(), 0, "memory follows live servers only");
        assert_eq!(rig.timers.len(), 0);
        assert!(rig.table.claims.is_empty(), "nor the names sessions held");
    }

    #[test]
    fn p1_h11_shutdown_closes_every_spawned_server_s_stdin_once_keeping_those_asked() {
        let mut rig = Rig::new();
        let (a, pa) = rig.ready("a", &["read"]);
        let (b, pb) = rig.ready("b", &["_SessionEnd"]);
        let c = rig.add("c");
        rig.drain();
        let keep = BTreeSet::from([b]);
        rig.table
            .shut_down_all(&keep, &mut rig.out, &mut rig.timers);
        assert_eq!(rig.drain(), vec![Action::CloseMcpStdin { proc: pa }]);
        assert!(rig.table.is_dead(a) && rig.table.is_dead(c));
        assert!(
            rig.table.servers[&b].is_ready(),
            "H11: b answers its hooks first"
        );
        rig.table
            .shut_down_all(&BTreeSet::new(), &mut rig.out, &mut rig.timers);
        assert_eq!(rig.drain(), vec![Action::CloseMcpStdin { proc: pb }]);
        assert!(rig.table.is_dead(b));
        rig.table
            .shut_down_all(&BTreeSet::new(), &mut rig.out, &mut rig.timers);
        assert!(rig.drain().is_empty(), "once");
    }

    #[test]
    fn i6_no_cancellation_is_written_to_a_dead_or_unspawned_server() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let (id, _) = rig.tool_call(slot, 0);
        rig.table
            .kill(slot, "was killed", &mut rig.out, &mut rig.timers);
        rig.drain();
        rig.table
            .cancel_request(slot, id, "cancelled", &mut rig.out, &mut rig.timers);
        assert!(Rig::written(&rig.drain(), proc).is_empty());
        let waiting = rig.add("spawning");
        rig.drain();
        rig.table.cancel_request(
            waiting,
            McpRequestId(1),
            "cancelled",
            &mut rig.out,
            &mut rig.timers,
        );
        assert!(rig.drain().is_empty());
    }

    #[test]
    fn m6_a_list_change_while_serving_lists_again_one_listing_at_a_time() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        rig.tool_call(slot, 0);
        rig.drain();
        let changed = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n";
        rig.bytes(proc, changed);
        let lists = |actions: &[Action]| {
            Rig::written(actions, proc)
                .into_iter()
                .filter(|l| l["method"] == "tools/list")
                .count()
        };
        assert_eq!(
            lists(&rig.drain()),
            1,
            "a call in flight does not hold it back"
        );
        rig.bytes(proc, changed);
        assert_eq!(lists(&rig.drain()), 0, "a listing is in flight");
    }

    #[test]
    fn m6_a_resources_list_change_is_harmless_the_agent_lists_no_resources() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("fs", &["read"]);
        let (id, _) = rig.tool_call(slot, 0);
        rig.drain();
        let events = rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/list_changed\"}\n",
        );
        assert!(events.is_empty(), "{events:?}");
        let actions = rig.drain();
        assert!(
            Rig::written(&actions, proc).is_empty(),
            "nothing is listed again: {actions:?}"
        );
        assert!(!rig.table.is_dead(slot), "the server keeps serving");
        let events = rig.reply(
            proc,
            id.0,
            json!({"content": [{"type": "text", "text": "ok"}]}),
        );
        assert!(
            matches!(events.as_slice(), [McpEvent::ToolReply { .. }]),
            "the call in flight is answered: {events:?}"
        );
    }

    #[test]
    fn a11_prompts_are_listed_after_the_tools_page_by_page_and_relisted_on_a_change() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.spawned("docs");
        let init = json!({"protocolVersion": "2025-11-25", "capabilities": {"prompts": {"listChanged": true}}});
        assert!(rig.answer(proc, "initialize", init).is_empty());
        // A change before the server is ready is part of the first listing: nothing is sent.
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/prompts/list_changed\"}\n",
        );
        let sent = Rig::written(&rig.drain(), proc);
        assert!(
            sent.iter().all(|l| l["method"] != "prompts/list"),
            "prompts wait for the tools: {sent:?}"
        );
        let list_id = sent
            .iter()
            .find(|l| l["method"] == "tools/list")
            .and_then(|l| l["id"].as_u64())
            .unwrap_or(0);
        let events = rig.reply(proc, list_id, json!({"tools": [{"name": "read"}]}));
        assert_eq!(events, vec![McpEvent::StartSettled { session: SESSION }]);
        let events = rig.answer(
            proc,
            "prompts/list",
            json!({"prompts": [{"name": "review", "arguments": [{"name": "file", "required": true}]}],
                   "nextCursor": "2"}),
        );
        assert!(
            events.is_empty(),
            "a page with a cursor is not the list yet"
        );
        let actions = rig.drain();
        let page2 = Rig::written(&actions, proc);
        assert_eq!(
            page2.last().map(|l| l["params"].clone()),
            Some(json!({"cursor": "2"}))
        );
        let id = page2.last().and_then(|l| l["id"].as_u64()).unwrap_or(0);
        let events = rig.reply(
            proc,
            id,
            json!({"prompts": [{"name": "_Stop"}, {"name": "plain", "description": "A plain one"}]}),
        );
        assert_eq!(events, vec![McpEvent::CommandsChanged { session: SESSION }]);
        assert_eq!(
            rig.table.commands(&[slot]),
            vec![
                json!({"name": "docs:review", "description": "", "input": {"hint": "<file>"}}),
                json!({"name": "docs:plain", "description": "A plain one", "input": null}),
            ]
        );
        // list_changed on a ready server lists again; the same list is no change.
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/prompts/list_changed\"}\n",
        );
        let same = json!({"prompts": [{"name": "review", "arguments": [{"name": "file", "required": true}]},
                                      {"name": "plain", "description": "A plain one"}]});
        assert!(rig.answer(proc, "prompts/list", same).is_empty());
        // A failed listing keeps the prompts and warns.
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/prompts/list_changed\"}\n",
        );
        let actions = rig.drain();
        let id = Rig::written(&actions, proc)
            .last()
            .and_then(|l| l["id"].as_u64())
            .unwrap_or(0);
        let line =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "db down"}})
                .to_string()
                + "\n";
        assert!(rig.bytes(proc, line.as_bytes()).is_empty());
        assert_eq!(
            warns(&rig.drain()),
            ["mcp 'docs': prompts/list failed: -32603 db down"]
        );
        assert_eq!(rig.table.commands(&[slot]).len(), 2);
    }

    #[test]
    fn a11_a_server_without_the_prompts_capability_is_never_asked_for_prompts() {
        let mut rig = Rig::new();
        let (_, proc) = rig.ready("fs", &["read"]);
        let changed = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/prompts/list_changed\"}\n";
        rig.bytes(proc, changed);
        let sent = Rig::written(&rig.drain(), proc);
        assert!(
            sent.iter().all(|l| l["method"] != "prompts/list"),
            "{sent:?}"
        );
    }

    #[test]
    fn a11_a_prompts_list_that_times_out_only_warns_and_the_server_keeps_serving() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.spawned("docs");
        let init = json!({"protocolVersion": "2025-11-25", "capabilities": {"prompts": {}}});
        rig.answer(proc, "initialize", init);
        rig.answer(proc, "tools/list", json!({"tools": [{"name": "read"}]}));
        let actions = rig.drain();
        let id = Rig::written(&actions, proc)
            .iter()
            .find(|l| l["method"] == "prompts/list")
            .and_then(|l| l["id"].as_u64())
            .unwrap_or(0);
        let expired = rig
            .table
            .expire(slot, McpRequestId(id), &mut rig.out, &mut rig.timers);
        assert_eq!(
            expired.map(|(e, ev)| (e, ev.len())),
            Some((Expired::Handshake, 0))
        );
        assert_eq!(
            warns(&rig.drain()),
            [format!(
                "mcp 'docs': prompts/list timed out after {} s",
                INIT_MS / 1000
            )]
        );
        assert!(rig.table.get(slot).is_some_and(Server::is_ready));
    }

    /// The WARN lines of `actions`.
    fn warns(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::Log(r) = a
                    && r.level == LogLevel::Warn
                {
                    Some(r.message.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn c63_offered_tools_are_converted_once_per_listing_and_provider_with_one_warn() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("n", &[]);
        let any_of = json!({"type": "object", "anyOf": [
            {"properties": {"content": {"type": "string"}}, "required": ["content"]},
            {"properties": {"source_url": {"type": "string"}}, "required": ["source_url"]}]});
        let list = json!({"tools": [{"name": "create_attachment", "inputSchema": any_of}]});
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        rig.answer(proc, "tools/list", list.clone());
        rig.drain();
        let (defs, _) = rig
            .table
            .offered_tools(&[slot], SchemaDialect::Anthropic, &mut rig.out);
        assert!(defs[0].input_schema.get("anyOf").is_none(), "{:?}", defs[0]);
        let first = warns(&rig.drain());
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(
            first[0].starts_with("mcp 'n': tool 'create_attachment':"),
            "{first:?}"
        );
        let (again, _) = rig
            .table
            .offered_tools(&[slot], SchemaDialect::Anthropic, &mut rig.out);
        assert_eq!(again, defs);
        assert!(warns(&rig.drain()).is_empty(), "converted once");
        rig.table
            .offered_tools(&[slot], SchemaDialect::Gemini, &mut rig.out);
        assert_eq!(
            warns(&rig.drain()).len(),
            1,
            "another provider's rules: anew"
        );
        // A new listing starts afresh.
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        rig.answer(proc, "tools/list", list);
        rig.drain();
        rig.table
            .offered_tools(&[slot], SchemaDialect::Gemini, &mut rig.out);
        assert_eq!(warns(&rig.drain()).len(), 1);
        let (plain, _) = rig.table.visible_tools(&[slot]);
        assert!(
            plain[0].input_schema.get("anyOf").is_some(),
            "the source stays as listed"
        );
    }

    #[test]
    fn c65_a_relisting_is_reported_until_its_list_arrives_or_the_listing_ends() {
        let mut rig = Rig::new();
        let (slot, proc) = rig.ready("s", &["unlock", "old_tool"]);
        assert!(rig.table.relisting(&[slot]).is_empty());
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        let waiting = rig.table.relisting(&[slot]);
        assert_eq!(waiting, vec![(slot, 1)]);
        assert!(!rig.table.relisted(slot, 1));
        rig.answer(
            proc,
            "tools/list",
            json!({"tools": [{"name": "unlock"}, {"name": "secret_number"}]}),
        );
        assert!(rig.table.relisted(slot, 1), "the new list arrived");
        let (defs, _) = rig.table.visible_tools(&[slot]);
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["s__unlock", "s__secret_number"],
            "the removed tool is gone"
        );
        // A listing that dies with its server ends the wait too.
        rig.bytes(
            proc,
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        assert_eq!(rig.table.relisting(&[slot]), vec![(slot, 2)]);
        rig.table
            .on_exited(proc, "exit status 1", &mut rig.out, &mut rig.timers);
        assert!(rig.table.relisted(slot, 2));
        assert!(rig.table.relisting(&[slot]).is_empty());
    }
}
