//! The MCP client sub-machine (SPEC M1–M9, T6, H4): one [`Server`] per `mcpServers` entry,
//! its handshake, paginated `tools/list`, pending request table with one deadline each,
//! server→client traffic, death and process-group kills.

use crate::acp::McpServerEntry;
use crate::agent::Agent;
use crate::config::LogLevel;
use crate::io::{Action, ProcKey, Signal, SpawnSpec};
use crate::jsonrpc::{self, LineBuffer, LineEvent, RpcError, RpcId};
use crate::time::MonoTime;
use crate::tools;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// MCP protocol version we request (SPEC M2).
pub const MCP_PROTOCOL_VERSION: &str = "2025-11-25";
/// Server protocol versions we accept (SPEC M2).
pub const ACCEPTED_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// An MCP stdout line over this kills the server (SPEC T6), in bytes.
pub const MAX_MCP_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Stderr lines kept for error messages (SPEC M1).
pub const STDERR_TAIL_LINES: usize = 20;
/// Grace between SIGTERM and SIGKILL of a process group (SPEC M8), in ms.
pub const KILL_GRACE_MS: u64 = 2000;
/// How long a server whose stdout closed may take to exit before it is declared dead, in ms.
const STDOUT_CLOSED_GRACE_MS: u64 = 500;
/// `tools/list` pages followed at most (SPEC M2).
const MAX_LIST_PAGES: u32 = 100;
/// M9: restart backoff base and cap, in ms (0.5 s · 2^(n−1), cap 30 s).
const RESTART_BASE_MS: u64 = 500;
const RESTART_CAP_MS: u64 = 30_000;
/// M9: failed restarts, or deaths without a successful call, before a server is permanently dead.
const MAX_FAILED_RESTARTS: u32 = 3;
const MAX_DEATHS: u32 = 3;

/// A tool a server offers (hooks excluded).
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The name the server knows.
    pub bare: String,
    /// The provider-safe qualified name the model sees (SPEC M3).
    pub exposed: String,
    pub description: String,
    pub schema: Value,
}

/// Lifecycle of a server process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// `SpawnMcp` sent, waiting for `McpSpawned`.
    Spawning,
    /// `initialize` sent.
    Initializing,
    /// Handshake done, `tools/list` pages in flight.
    Listing,
    /// Serving calls.
    Ready,
    /// Dead (exited, killed, failed to start); the reason names the cause and stderr tail.
    Dead { reason: String },
}

/// What a pending request to a server is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    Initialize,
    /// A page of `tools/list`.
    ListTools,
    /// A model tool call: (session, turn seq, slot index).
    Tool {
        session: String,
        turn_seq: u64,
        slot: usize,
    },
    /// A hook call of a hook round: (session, round id, index in the round).
    Hook {
        session: String,
        round: u64,
        idx: usize,
    },
}

/// One request awaiting its reply, with exactly one deadline (DESIGN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub purpose: Purpose,
    pub deadline: Option<MonoTime>,
}

/// One MCP server (one `mcpServers` entry of one session).
pub struct Server {
    pub slot: u64,
    pub session: String,
    pub name: String,
    pub spec: SpawnSpec,
    pub proc: ProcKey,
    pub state: ServerState,
    buf: LineBuffer,
    pub pending: BTreeMap<u64, Pending>,
    next_id: u64,
    pub tools: Vec<McpTool>,
    /// Hook names (bare, starting with `_`) the server exposes (SPEC H1).
    pub hooks: BTreeSet<String>,
    /// Tools collected from `tools/list` pages in flight.
    list_acc: Vec<Value>,
    list_cursors: BTreeSet<String>,
    /// Whether a `tools/list` ever completed (the server served at least once).
    listed_once: bool,
    relist_wanted: bool,
    stderr_tail: VecDeque<String>,
    /// Consecutive hook timeouts (SPEC H4, DESIGN I5).
    pub consecutive_hook_timeouts: u32,
    /// Whether the process (leader) is running: spawned and not yet reaped.
    pub alive: bool,
    exit_status: Option<String>,
    /// Deadline to declare the server dead after its stdout closed.
    stdout_closed_at: Option<MonoTime>,
    /// Pending SIGKILL escalations: (when, which generation's group).
    kills: Vec<(MonoTime, ProcKey)>,
    /// M9: when a lazy restart is allowed (dead, not permanent).
    restart_at: Option<MonoTime>,
    /// M9: failed restarts in a row.
    failed_restarts: u32,
    /// M9: deaths without one successful tool call in between.
    deaths: u32,
    /// M9: permanently dead — its tools leave the model's list, no more restarts.
    pub permanent: bool,
    /// A restart's handshake is in progress.
    restarting: bool,
    /// Whether the group was ever signalled (so shutdown still sweeps grandchildren).
    pub was_started: bool,
    bad_lines: u32,
}

impl Server {
    /// Earliest deadline among pending requests.
    #[must_use]
    pub fn next_request_deadline(&self) -> Option<MonoTime> {
        let mut best: Option<MonoTime> = None;
        for p in self.pending.values() {
            if let Some(d) = p.deadline
                && best.is_none_or(|b| d < b)
            {
                best = Some(d);
            }
        }
        best
    }

    /// Earliest process-control deadline (kill escalation, stdout-closed grace).
    #[must_use]
    pub fn next_kill_deadline(&self) -> Option<MonoTime> {
        let kill = self.kills.iter().map(|(t, _)| *t).min();
        match (kill, self.stdout_closed_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Every process generation that may still have a live group (for shutdown sweeps).
    #[must_use]
    pub fn procs_to_sweep(&self) -> Vec<ProcKey> {
        let mut v: Vec<ProcKey> = self.kills.iter().map(|(_, p)| *p).collect();
        if self.was_started && !v.contains(&self.proc) {
            v.push(self.proc);
        }
        v
    }

    /// Ready to serve calls.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.state == ServerState::Ready
    }

    /// The start failure reason, if the server died before becoming ready the first time.
    #[must_use]
    pub fn start_failure(&self) -> Option<String> {
        match &self.state {
            ServerState::Dead { reason } if !self.tools_ever_listed() => Some(reason.clone()),
            ServerState::Spawning
            | ServerState::Initializing
            | ServerState::Listing
            | ServerState::Ready
            | ServerState::Dead { .. } => None,
        }
    }

    fn tools_ever_listed(&self) -> bool {
        self.listed_once
    }

    /// The last stderr lines, joined, for error messages (SPEC M1, A2).
    #[must_use]
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn describe_death(&self, cause: &str) -> String {
        let tail = self.stderr_tail();
        if tail.is_empty() {
            format!("MCP server '{}' {cause}", self.name)
        } else {
            format!("MCP server '{}' {cause}; stderr:\n{tail}", self.name)
        }
    }
}

impl Agent {
    /// Create the server record of a session entry (not yet spawned).
    pub(crate) fn create_server(
        &mut self,
        session: &str,
        cwd: &str,
        entry: &McpServerEntry,
    ) -> u64 {
        let slot = self.alloc_server_slot();
        // M1: inherited env minus agent variables, then the client's entries win.
        let mut env: BTreeMap<String, String> = self.inherited_env.iter().cloned().collect();
        for (k, v) in &entry.env {
            env.insert(k.clone(), v.clone());
        }
        let spec = SpawnSpec {
            name: entry.name.clone(),
            command: entry.command.clone(),
            args: entry.args.clone(),
            env: env.into_iter().collect(),
            cwd: cwd.to_string(),
        };
        self.servers.insert(
            slot,
            Server {
                slot,
                session: session.to_string(),
                name: entry.name.clone(),
                spec,
                proc: ProcKey {
                    server: slot,
                    generation: 0,
                },
                state: ServerState::Spawning,
                buf: LineBuffer::new(MAX_MCP_LINE_BYTES),
                pending: BTreeMap::new(),
                next_id: 1,
                tools: Vec::new(),
                hooks: BTreeSet::new(),
                list_acc: Vec::new(),
                list_cursors: BTreeSet::new(),
                listed_once: false,
                relist_wanted: false,
                stderr_tail: VecDeque::new(),
                consecutive_hook_timeouts: 0,
                alive: false,
                exit_status: None,
                stdout_closed_at: None,
                kills: Vec::new(),
                restart_at: None,
                failed_restarts: 0,
                deaths: 0,
                permanent: false,
                restarting: false,
                was_started: false,
                bad_lines: 0,
            },
        );
        slot
    }

    /// M9 lazy restart: respawn every dead, non-permanent server of `session` whose previous
    /// process was reaped and whose backoff elapsed (called at the top of each round).
    pub(crate) fn restart_due_servers(&mut self, session: &str) {
        let now = self.now;
        let due: Vec<u64> = self
            .servers
            .values()
            .filter(|s| {
                s.session == session
                    && matches!(s.state, ServerState::Dead { .. })
                    && !s.permanent
                    && !s.alive
                    && s.restart_at.is_some_and(|t| t <= now)
            })
            .map(|s| s.slot)
            .collect();
        for slot in due {
            let Some(s) = self.servers.get_mut(&slot) else {
                continue;
            };
            s.proc = ProcKey {
                server: slot,
                generation: s.proc.generation + 1,
            };
            s.buf = LineBuffer::new(MAX_MCP_LINE_BYTES);
            s.pending.clear();
            s.restart_at = None;
            s.restarting = true;
            s.stdout_closed_at = None;
            s.bad_lines = 0;
            s.list_acc.clear();
            let msg = format!("mcp '{}': restarting ({})", s.name, s.proc);
            self.log(LogLevel::Info, msg);
            self.spawn_server(slot);
        }
    }

    pub(crate) fn spawn_server(&mut self, slot: u64) {
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        s.state = ServerState::Spawning;
        let (proc, spec) = (s.proc, s.spec.clone());
        let msg = format!(
            "mcp '{}': spawning {} {:?} in {}",
            spec.name, spec.command, spec.args, spec.cwd
        );
        self.log(LogLevel::Info, msg);
        self.push(Action::SpawnMcp { proc, spec });
    }

    pub(crate) fn send_mcp_request(
        &mut self,
        slot: u64,
        method: &str,
        params: &Value,
        purpose: Purpose,
        deadline_ms: u64,
    ) -> Option<u64> {
        let now = self.now;
        let s = self.servers.get_mut(&slot)?;
        let id = s.alloc_id();
        s.pending.insert(
            id,
            Pending {
                purpose,
                deadline: Some(now.plus_ms(deadline_ms)),
            },
        );
        let line = jsonrpc::encode_request(id, method, params);
        let proc = s.proc;
        self.push(Action::WriteMcp { proc, line });
        Some(id)
    }

    fn send_mcp_notification(&mut self, slot: u64, method: &str, params: &Value) {
        let Some(s) = self.servers.get(&slot) else {
            return;
        };
        let proc = s.proc;
        self.push(Action::WriteMcp {
            proc,
            line: jsonrpc::encode_notification(method, params),
        });
    }

    /// Abandon a pending request with `notifications/cancelled` (SPEC M5, H4, A4).
    pub(crate) fn cancel_mcp_request(&mut self, slot: u64, id: u64, reason: &str) {
        let alive = match self.servers.get_mut(&slot) {
            Some(s) => {
                s.pending.remove(&id);
                s.alive && !matches!(s.state, ServerState::Dead { .. })
            }
            None => false,
        };
        if alive {
            self.send_mcp_notification(
                slot,
                "notifications/cancelled",
                &json!({"requestId": id, "reason": reason}),
            );
        }
    }

    pub(crate) fn on_mcp_spawned(&mut self, proc: ProcKey) {
        let Some(slot) = self.slot_of(proc) else {
            return;
        };
        let timeout = self.cfg.mcp_init_timeout_ms;
        let version = self.version.clone();
        let now = self.now;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        s.alive = true;
        s.was_started = true;
        if matches!(s.state, ServerState::Dead { .. }) {
            // Stopped (session failed, shutdown) while the spawn was in flight: stop it now.
            s.kills.push((now.plus_ms(KILL_GRACE_MS), proc));
            self.push(Action::CloseMcpStdin { proc });
            self.push(Action::SignalProcessGroup {
                proc,
                signal: Signal::Term,
            });
            return;
        }
        if s.state != ServerState::Spawning {
            return;
        }
        s.state = ServerState::Initializing;
        let params = json!({
            "protocolVersion": MCP_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "buzz-agent", "version": version}
        });
        self.send_mcp_request(slot, "initialize", &params, Purpose::Initialize, timeout);
    }

    pub(crate) fn on_mcp_spawn_failed(&mut self, proc: ProcKey, error: &str) {
        let Some(slot) = self.slot_of(proc) else {
            return;
        };
        let Some(s) = self.servers.get(&slot) else {
            return;
        };
        let reason = format!(
            "MCP server '{}' failed to start: spawning '{}' failed: {error}",
            s.name, s.spec.command
        );
        self.server_died(slot, reason, false);
    }

    pub(crate) fn on_mcp_stderr(&mut self, proc: ProcKey, line: String) {
        let Some(s) = self.servers.get_mut(&proc.server) else {
            return;
        };
        // P2, C52: whatever the runtime hands in, a forwarded line is capped.
        let line = if line.len() > crate::io::MAX_STDERR_LINE_BYTES {
            crate::io::cap_stderr_line(&line, crate::io::MAX_STDERR_LINE_BYTES)
        } else {
            line
        };
        let name = s.name.clone();
        if s.proc == proc {
            if s.stderr_tail.len() == STDERR_TAIL_LINES {
                s.stderr_tail.pop_front();
            }
            s.stderr_tail.push_back(line.clone());
        }
        // M1: forwarded line by line with a prefix. Child stderr is operator-facing text.
        self.log(LogLevel::Info, format!("[mcp:{name}] {line}"));
    }

    pub(crate) fn on_mcp_exited(&mut self, proc: ProcKey, status: &str) {
        let Some(slot) = self.slot_of(proc) else {
            return;
        };
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        s.alive = false;
        s.exit_status = Some(status.to_string());
        s.stdout_closed_at = None;
        let dead = matches!(s.state, ServerState::Dead { .. });
        let name = s.name.clone();
        if dead {
            self.log(
                LogLevel::Debug,
                format!("mcp '{name}': process reaped ({status})"),
            );
        } else {
            let reason = if s.state == ServerState::Ready {
                s.describe_death(&format!("exited ({status})"))
            } else {
                s.describe_death(&format!(
                    "failed to start: exited ({status}) during the handshake"
                ))
            };
            self.server_died(slot, reason, true);
        }
    }

    pub(crate) fn on_mcp_stdout_closed(&mut self, proc: ProcKey) {
        let Some(slot) = self.slot_of(proc) else {
            return;
        };
        let now = self.now;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if s.alive && !matches!(s.state, ServerState::Dead { .. }) {
            s.stdout_closed_at = Some(now.plus_ms(STDOUT_CLOSED_GRACE_MS));
        }
    }

    pub(crate) fn on_mcp_write_failed(&mut self, proc: ProcKey) {
        let Some(slot) = self.slot_of(proc) else {
            return;
        };
        let now = self.now;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if matches!(s.state, ServerState::Dead { .. }) {
            return;
        }
        if s.alive {
            // Usually the process is exiting: wait briefly for its exit status and stderr tail
            // (reported by `McpExited`), as for a closed stdout.
            if s.stdout_closed_at.is_none() {
                s.stdout_closed_at = Some(now.plus_ms(STDOUT_CLOSED_GRACE_MS));
            }
            return;
        }
        let reason = s.describe_death("stopped reading its stdin");
        self.server_died(slot, reason, true);
    }

    /// Mark a server dead, fail its pending requests (SPEC M7), and make sure its process group
    /// is gone (TERM now, KILL after the grace, SPEC M8/H4).
    pub(crate) fn server_died(&mut self, slot: u64, reason: String, kill_group: bool) {
        let now = self.now;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if matches!(s.state, ServerState::Dead { .. }) {
            return;
        }
        let listed_before = s.tools_ever_listed();
        s.state = ServerState::Dead {
            reason: reason.clone(),
        };
        s.stdout_closed_at = None;
        let pending: Vec<(u64, Pending)> = std::mem::take(&mut s.pending).into_iter().collect();
        let (proc, session) = (s.proc, s.session.clone());
        // M9 accounting: a server that was serving may be restarted lazily, with a backoff.
        let mut permanent_now = false;
        if listed_before && !s.permanent {
            s.deaths += 1;
            if s.restarting {
                s.failed_restarts += 1;
            }
            s.restarting = false;
            if s.failed_restarts >= MAX_FAILED_RESTARTS || s.deaths >= MAX_DEATHS {
                s.permanent = true;
                permanent_now = true;
            } else {
                let backoff = (RESTART_BASE_MS << s.failed_restarts.min(16)).min(RESTART_CAP_MS);
                s.restart_at = Some(now.plus_ms(backoff));
            }
        }
        if kill_group && s.was_started {
            s.kills.push((now.plus_ms(KILL_GRACE_MS), proc));
            self.push(Action::CloseMcpStdin { proc });
            self.push(Action::SignalProcessGroup {
                proc,
                signal: Signal::Term,
            });
        }
        self.log(LogLevel::Warn, reason.clone());
        if permanent_now {
            let name = self
                .servers
                .get(&slot)
                .map(|s| s.name.clone())
                .unwrap_or_default();
            self.log(LogLevel::Error, format!("mcp '{name}': permanently dead (3 failed restarts or 3 deaths without a successful call); its tools are removed (M9)"));
        }
        for (_, p) in pending {
            self.fail_pending(p.purpose, &reason);
        }
        if !listed_before {
            self.check_session_start(&session);
        }
    }

    /// Kill a live server (tool timeout, hook double timeout, oversize line) and mark it dead.
    pub(crate) fn kill_server(&mut self, slot: u64, cause: &str) {
        let Some(s) = self.servers.get(&slot) else {
            return;
        };
        let reason = s.describe_death(cause);
        self.server_died(slot, reason, true);
    }

    /// Orderly stop at session failure or shutdown: close stdin, TERM, KILL later.
    pub(crate) fn stop_server(&mut self, slot: u64, why: &str) {
        let now = self.now;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if !matches!(s.state, ServerState::Dead { .. }) {
            s.state = ServerState::Dead {
                reason: format!("MCP server '{}' stopped: {why}", s.name),
            };
        }
        s.permanent = true;
        s.restart_at = None;
        s.pending.clear();
        let proc = s.proc;
        if s.was_started && !s.kills.iter().any(|(_, p)| *p == proc) {
            s.kills.push((now.plus_ms(KILL_GRACE_MS), proc));
            self.push(Action::CloseMcpStdin { proc });
            self.push(Action::SignalProcessGroup {
                proc,
                signal: Signal::Term,
            });
        }
    }

    fn fail_pending(&mut self, purpose: Purpose, reason: &str) {
        match purpose {
            Purpose::Initialize | Purpose::ListTools => {}
            Purpose::Tool {
                session,
                turn_seq,
                slot: idx,
            } => {
                let out = tools::ToolOutput {
                    text: reason.to_string(),
                    is_error: true,
                };
                self.on_tool_finished(&session, turn_seq, idx, out, true);
            }
            Purpose::Hook {
                session,
                round,
                idx,
            } => {
                self.on_hook_outcome(&session, round, idx, crate::hooks::HookOutcome::Dead);
            }
        }
    }

    pub(crate) fn on_mcp_bytes(&mut self, proc: ProcKey, bytes: &[u8]) {
        let Some(slot) = self.slot_of(proc) else {
            return;
        };
        let mut events = Vec::new();
        if let Some(s) = self.servers.get_mut(&slot) {
            s.buf.push(bytes, &mut events);
        }
        for ev in events {
            if self
                .servers
                .get(&slot)
                .is_none_or(|s| matches!(s.state, ServerState::Dead { .. }))
            {
                return;
            }
            match ev {
                LineEvent::Line(line) => self.on_mcp_line(slot, &line),
                LineEvent::TooLong { bytes, .. } => {
                    self.kill_server(
                        slot,
                        &format!("sent a stdout line over 16 MiB ({bytes} bytes); killed (T6)"),
                    );
                }
            }
        }
    }

    fn on_mcp_line(&mut self, slot: u64, line: &[u8]) {
        let name = self
            .servers
            .get(&slot)
            .map(|s| s.name.clone())
            .unwrap_or_default();
        match jsonrpc::parse_message(line) {
            Ok(jsonrpc::Message::Response { id, outcome }) => {
                self.on_mcp_response(slot, &id, outcome)
            }
            Ok(jsonrpc::Message::Request { id, method, .. }) => {
                self.on_mcp_server_request(slot, &id, &method)
            }
            Ok(jsonrpc::Message::Notification { method, params }) => {
                self.on_mcp_notification(slot, &method, &params)
            }
            Err(jsonrpc::ParseError::NotJson) | Err(jsonrpc::ParseError::Invalid { .. }) => {
                // T6: logged once each at warn (cut to 200 bytes), never answered.
                let n = self.servers.get_mut(&slot).map(|s| {
                    s.bad_lines += 1;
                    s.bad_lines
                });
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                let level = if n.unwrap_or(0) <= 100 {
                    LogLevel::Warn
                } else {
                    LogLevel::Debug
                };
                self.log(
                    level,
                    format!("mcp '{name}': ignoring non-JSON-RPC stdout line: {shown:?}"),
                );
            }
        }
    }

    fn on_mcp_server_request(&mut self, slot: u64, id: &RpcId, method: &str) {
        let Some(s) = self.servers.get(&slot) else {
            return;
        };
        let proc = s.proc;
        let line = if method == "ping" {
            jsonrpc::encode_result(id, &json!({}))
        } else {
            let err = RpcError {
                code: jsonrpc::RpcError::METHOD_NOT_FOUND,
                message: format!("Method not found: {method}"),
                data: None,
            };
            jsonrpc::encode_error(Some(id), &err)
        };
        self.push(Action::WriteMcp { proc, line });
    }

    fn on_mcp_notification(&mut self, slot: u64, method: &str, params: &Value) {
        let name = self
            .servers
            .get(&slot)
            .map(|s| s.name.clone())
            .unwrap_or_default();
        match method {
            "notifications/tools/list_changed" => {
                let ready = self.servers.get(&slot).is_some_and(Server::is_ready);
                if let Some(s) = self.servers.get_mut(&slot) {
                    s.relist_wanted = true;
                }
                if ready {
                    self.start_listing(slot);
                }
            }
            "notifications/message" => {
                let level = match params
                    .get("level")
                    .and_then(Value::as_str)
                    .unwrap_or("info")
                {
                    "debug" => LogLevel::Debug,
                    "info" | "notice" => LogLevel::Info,
                    "warning" => LogLevel::Warn,
                    _ => LogLevel::Error,
                };
                let data = params
                    .get("data")
                    .map(|d| d.as_str().map_or_else(|| d.to_string(), str::to_string));
                // A server's log text is capped like its stderr lines (P2).
                let text = crate::io::cap_stderr_line(
                    &data.unwrap_or_default(),
                    crate::io::MAX_STDERR_LINE_BYTES,
                );
                self.log(level, format!("[mcp:{name}] {text}"));
            }
            other => self.log(
                LogLevel::Debug,
                format!("mcp '{name}': ignoring notification {other}"),
            ),
        }
    }

    fn on_mcp_response(&mut self, slot: u64, id: &Value, outcome: Result<Value, RpcError>) {
        let name = self
            .servers
            .get(&slot)
            .map(|s| s.name.clone())
            .unwrap_or_default();
        let Some(our) = jsonrpc::match_our_id(id) else {
            match &outcome {
                Err(e) => self.log(
                    LogLevel::Warn,
                    format!(
                        "mcp '{name}': error without request id: {} {}",
                        e.code, e.message
                    ),
                ),
                Ok(_) => self.log(
                    LogLevel::Debug,
                    format!("mcp '{name}': response with foreign id {id}; dropped"),
                ),
            }
            return;
        };
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        let Some(p) = s.pending.remove(&our) else {
            self.log(
                LogLevel::Debug,
                format!("mcp '{name}': late or unknown response id {our}; dropped (I6)"),
            );
            return;
        };
        // H4 / I5: any reply resets the consecutive hook-timeout counter.
        s.consecutive_hook_timeouts = 0;
        match p.purpose {
            Purpose::Initialize => self.on_initialize_reply(slot, outcome),
            Purpose::ListTools => self.on_list_reply(slot, outcome),
            Purpose::Tool {
                session,
                turn_seq,
                slot: idx,
            } => {
                let out = match outcome {
                    Ok(v) => {
                        if let Some(s) = self.servers.get_mut(&slot) {
                            s.deaths = 0; // M9: a successful call
                        }
                        let out = tools::convert_result(&v, self.cfg.max_tool_result_text_bytes);
                        self.on_tool_finished(&session, turn_seq, idx, out, false);
                        return;
                    }
                    Err(e) => tools::ToolOutput {
                        text: format!("tool call rejected: {} (code {})", e.message, e.code),
                        is_error: true,
                    },
                };
                self.on_tool_finished(&session, turn_seq, idx, out, true);
            }
            Purpose::Hook {
                session,
                round,
                idx,
            } => {
                let outcome = match outcome {
                    Ok(v) => {
                        let out = tools::convert_result(&v, self.cfg.max_tool_result_text_bytes);
                        if out.is_error {
                            crate::hooks::HookOutcome::Error(format!("isError: {}", out.text))
                        } else if out.text.trim().is_empty() {
                            crate::hooks::HookOutcome::Empty
                        } else {
                            crate::hooks::HookOutcome::Objection(out.text)
                        }
                    }
                    Err(e) => crate::hooks::HookOutcome::Error(format!("{} {}", e.code, e.message)),
                };
                self.on_hook_outcome(&session, round, idx, outcome);
            }
        }
    }

    fn on_initialize_reply(&mut self, slot: u64, outcome: Result<Value, RpcError>) {
        let Some(s) = self.servers.get(&slot) else {
            return;
        };
        let result = match outcome {
            Ok(v) => v,
            Err(e) => {
                let reason = s.describe_death(&format!(
                    "failed to start: initialize was rejected: {} {}",
                    e.code, e.message
                ));
                return self.server_died(slot, reason, true);
            }
        };
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !ACCEPTED_VERSIONS.contains(&version) {
            let reason = s.describe_death(&format!(
                "failed to start: unsupported MCP protocol version '{version}'"
            ));
            return self.server_died(slot, reason, true);
        }
        self.send_mcp_notification(slot, "notifications/initialized", &json!({}));
        if let Some(s) = self.servers.get_mut(&slot) {
            s.state = ServerState::Listing;
        }
        self.start_listing(slot);
    }

    fn start_listing(&mut self, slot: u64) {
        let timeout = self.cfg.mcp_init_timeout_ms;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        if s.pending.values().any(|p| p.purpose == Purpose::ListTools) {
            return; // a listing is in flight; relist_wanted makes it run again after
        }
        s.relist_wanted = false;
        s.list_acc.clear();
        s.list_cursors.clear();
        self.send_mcp_request(slot, "tools/list", &json!({}), Purpose::ListTools, timeout);
    }

    fn on_list_reply(&mut self, slot: u64, outcome: Result<Value, RpcError>) {
        let timeout = self.cfg.mcp_init_timeout_ms;
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        let result = match outcome {
            Ok(v) => v,
            Err(e) => {
                let reason =
                    s.describe_death(&format!("tools/list failed: {} {}", e.code, e.message));
                if s.state == ServerState::Listing {
                    return self.server_died(slot, reason, true);
                }
                self.log(LogLevel::Warn, reason);
                return;
            }
        };
        if let Some(list) = result.get("tools").and_then(Value::as_array) {
            s.list_acc.extend(list.iter().cloned());
        }
        let cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut warn = None;
        let next = match cursor {
            Some(c) if !c.is_empty() => {
                let page_no = s.list_cursors.len() as u32 + 1;
                if s.list_cursors.contains(&c) {
                    warn = Some(format!(
                        "mcp '{}': tools/list repeated cursor {c:?}; stopping (M2)",
                        s.name
                    ));
                    None
                } else if page_no >= MAX_LIST_PAGES {
                    warn = Some(format!(
                        "mcp '{}': tools/list exceeded {MAX_LIST_PAGES} pages; stopping (M2)",
                        s.name
                    ));
                    None
                } else {
                    s.list_cursors.insert(c.clone());
                    Some(c)
                }
            }
            _ => None,
        };
        if let Some(w) = warn {
            self.log(LogLevel::Warn, w);
        }
        if let Some(c) = next {
            self.send_mcp_request(
                slot,
                "tools/list",
                &json!({"cursor": c}),
                Purpose::ListTools,
                timeout,
            );
            return;
        }
        self.install_tools(slot);
    }

    fn install_tools(&mut self, slot: u64) {
        let Some(s) = self.servers.get_mut(&slot) else {
            return;
        };
        let raw = std::mem::take(&mut s.list_acc);
        let name = s.name.clone();
        let mut tools_out: Vec<McpTool> = Vec::new();
        let mut hooks = BTreeSet::new();
        let mut warnings = Vec::new();
        let mut seen_exposed = BTreeSet::new();
        for t in raw {
            let Some(bare) = t.get("name").and_then(Value::as_str) else {
                warnings.push(format!("mcp '{name}': dropping a tool without a name"));
                continue;
            };
            if tools::is_hook_name(bare) {
                hooks.insert(bare.to_string());
                continue;
            }
            let schema = match tools::normalize_schema(t.get("inputSchema")) {
                Ok(s) => s,
                Err(e) => {
                    warnings.push(format!("mcp '{name}': dropping tool '{bare}': {e} (M3)"));
                    continue;
                }
            };
            let mut exposed = tools::exposed_name(&name, bare);
            if !seen_exposed.insert(exposed.clone()) {
                exposed = format!(
                    "{}_{:08x}",
                    &exposed[..exposed.len().min(55)],
                    tools::fnv1a(bare.as_bytes()) & 0xffff_ffff
                );
                if !seen_exposed.insert(exposed.clone()) {
                    warnings.push(format!("mcp '{name}': dropping duplicate tool '{bare}'"));
                    continue;
                }
            }
            let description = t
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            tools_out.push(McpTool {
                bare: bare.to_string(),
                exposed,
                description,
                schema,
            });
        }
        let was_listing = s.state == ServerState::Listing;
        if was_listing && s.restarting {
            s.restarting = false;
            s.failed_restarts = 0;
        }
        let count = tools_out.len();
        s.tools = tools_out;
        s.hooks = hooks.clone();
        s.listed_once = true;
        if was_listing {
            s.state = ServerState::Ready;
        }
        let relist = s.relist_wanted;
        let session = s.session.clone();
        for w in warnings {
            self.log(LogLevel::Warn, w);
        }
        self.log(
            LogLevel::Info,
            format!("mcp '{name}': ready with {count} tool(s), hooks {hooks:?}"),
        );
        if was_listing {
            self.check_session_start(&session);
        }
        if relist {
            self.start_listing(slot);
        }
    }

    /// Expire MCP request deadlines and process-kill escalations.
    pub(crate) fn fire_mcp_timers(&mut self) {
        let now = self.now;
        let mut expired: Vec<(u64, u64, Purpose)> = Vec::new();
        let mut escalate: Vec<ProcKey> = Vec::new();
        let mut closed: Vec<u64> = Vec::new();
        for (slot, s) in &mut self.servers {
            for (id, p) in &s.pending {
                if p.deadline.is_some_and(|d| d <= now) {
                    expired.push((*slot, *id, p.purpose.clone()));
                }
            }
            s.kills.retain(|(d, p)| {
                if *d <= now {
                    escalate.push(*p);
                    false
                } else {
                    true
                }
            });
            if s.stdout_closed_at.is_some_and(|d| d <= now) {
                s.stdout_closed_at = None;
                closed.push(*slot);
            }
        }
        for proc in escalate {
            self.push(Action::SignalProcessGroup {
                proc,
                signal: Signal::Kill,
            });
        }
        for slot in closed {
            self.kill_server(slot, "closed its stdout");
        }
        for (slot, id, purpose) in expired {
            // The request may have been resolved by an earlier expiry in this loop (death).
            if self
                .servers
                .get(&slot)
                .is_none_or(|s| !s.pending.contains_key(&id))
            {
                continue;
            }
            match purpose {
                Purpose::Initialize | Purpose::ListTools => {
                    let secs = self.cfg.mcp_init_timeout_ms / 1000;
                    if let Some(s) = self.servers.get_mut(&slot) {
                        s.pending.remove(&id);
                    }
                    let starting = self
                        .servers
                        .get(&slot)
                        .is_some_and(|s| s.state != ServerState::Ready);
                    let cause = if starting {
                        format!(
                            "failed to start: handshake timed out after {secs} s (BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS)"
                        )
                    } else {
                        format!("tools/list timed out after {secs} s")
                    };
                    if starting {
                        self.kill_server(slot, &cause);
                    } else {
                        let name = self
                            .servers
                            .get(&slot)
                            .map(|s| s.name.clone())
                            .unwrap_or_default();
                        self.log(LogLevel::Warn, format!("mcp '{name}': {cause}"));
                    }
                }
                Purpose::Tool {
                    session,
                    turn_seq,
                    slot: idx,
                } => {
                    let secs = self.cfg.tool_timeout_ms / 1000;
                    self.cancel_mcp_request(slot, id, &format!("timeout after {secs}s"));
                    let out = tools::ToolOutput {
                        text: format!(
                            "tool call timed out after {secs} s (BUZZ_AGENT_TOOL_TIMEOUT_SECS)"
                        ),
                        is_error: true,
                    };
                    self.on_tool_finished(&session, turn_seq, idx, out, true);
                    // M5: the server is killed and marked dead.
                    self.kill_server(
                        slot,
                        &format!("tool call timed out after {secs} s; killed (M5)"),
                    );
                }
                Purpose::Hook {
                    session,
                    round,
                    idx,
                } => {
                    self.on_hook_timeout(slot, id, &session, round, idx);
                }
            }
        }
    }
}
