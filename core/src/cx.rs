//! The contexts of one step: the parts of the agent a machine borrows while it handles an
//! input. Each part is a typed sub-machine with its own methods; none of them is the agent.
//!
//! A machine takes the narrowest context that holds what it uses, so its signature says which
//! parts it can touch:
//!
//! | context | parts | taken by |
//! |---|---|---|
//! | [`McpCx`] | `cfg`, `out`, `timers`, `servers`, `ids` | hook rounds, interceptor screens, the session's opening and ending |
//! | [`Cx`] | every part: the LLM calls, the permission requests and the store too | the turn and its tool batch |
//!
//! A wider context lends a narrower one for a call ([`Cx::mcp`]): the parts are reborrowed,
//! nothing is copied.

use crate::config::Config;
use crate::ids::IdCounters;
use crate::llm_call::LlmCalls;
use crate::mcp::ServerTable;
use crate::outbox::Outbox;
use crate::permissions::Permissions;
use crate::store::SessionStore;
use crate::timers::TimerTable;

/// The MCP side of a step: what a machine that only talks to MCP servers and sets deadlines
/// may use (hook rounds, interceptor screens, the session's opening and ending).
pub(crate) struct McpCx<'a> {
    /// The configuration in force.
    pub(crate) cfg: &'a Config,
    /// The action queue (and the step's time).
    pub(crate) out: &'a mut Outbox,
    /// Every deadline.
    pub(crate) timers: &'a mut TimerTable,
    /// The MCP servers.
    pub(crate) servers: &'a mut ServerTable,
    /// The process-wide id counters.
    pub(crate) ids: &'a mut IdCounters,
}

/// What a turn may use: every part of the agent a step can borrow.
pub(crate) struct Cx<'a> {
    /// The configuration in force.
    pub(crate) cfg: &'a Config,
    /// The action queue (and the step's time).
    pub(crate) out: &'a mut Outbox,
    /// Every deadline.
    pub(crate) timers: &'a mut TimerTable,
    /// The MCP servers.
    pub(crate) servers: &'a mut ServerTable,
    /// The LLM calls in flight, the backoff jitter and what the provider taught us.
    pub(crate) llm: &'a mut LlmCalls,
    /// The permission requests in flight.
    pub(crate) permissions: &'a mut Permissions,
    /// The process-wide id counters.
    pub(crate) ids: &'a mut IdCounters,
    /// The session store (SPEC A9): what the client saw and each tool result are recorded as
    /// they happen.
    pub(crate) store: &'a mut SessionStore,
}

impl Cx<'_> {
    /// Lends the MCP side, for a hook round or an interceptor screen.
    pub(crate) fn mcp(&mut self) -> McpCx<'_> {
        McpCx {
            cfg: self.cfg,
            out: self.out,
            timers: self.timers,
            servers: self.servers,
            ids: self.ids,
        }
    }
}

/// Owned parts of a step context, for the unit tests of the machines that borrow one.
#[cfg(test)]
pub(crate) mod rig {
    use super::{Cx, McpCx};
    use crate::config::{Config, HookAllowlist, LogLevel, PermissionMode, ProviderKind};
    use crate::ids::{IdCounters, ServerSlot, SessionId};
    use crate::io::Action;
    use crate::llm::ToolCall;
    use crate::llm_call::LlmCalls;
    use crate::mcp::ServerTable;
    use crate::mcp::ToolRoute;
    use crate::outbox::Outbox;
    use crate::permissions::Permissions;
    use crate::session::Session;
    use crate::store::SessionStore;
    use crate::time::MonoTime;
    use crate::timers::TimerTable;
    use serde_json::Value;
    use std::collections::BTreeMap;

    /// A model tool call `id` of tool `name` with `args` (JSON text).
    pub(crate) fn tool_call(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    /// The parts; [`Parts::cx`] and [`Parts::mcp`] lend them.
    pub(crate) struct Parts {
        pub(crate) cfg: Config,
        pub(crate) out: Outbox,
        pub(crate) timers: TimerTable,
        pub(crate) servers: ServerTable,
        pub(crate) llm: LlmCalls,
        pub(crate) permissions: Permissions,
        pub(crate) ids: IdCounters,
        pub(crate) store: SessionStore,
    }

    impl Parts {
        /// OpenAI Chat at `http://llm.test/v1`, hooks allowed for every server, permission
        /// `allow`, debug logs, at t = 0.
        pub(crate) fn new() -> Parts {
            let mut cfg = Config::for_tests(ProviderKind::OpenAiChat, "http://llm.test/v1");
            cfg.hook_servers = HookAllowlist::All;
            cfg.permission = PermissionMode::Allow;
            cfg.log_level = LogLevel::Debug;
            Parts {
                out: Outbox::new(cfg.log_level, MonoTime::ZERO),
                timers: TimerTable::default(),
                servers: ServerTable::new(cfg.mcp_init_timeout_ms, "test".into()),
                llm: LlmCalls::new(7),
                permissions: Permissions::default(),
                ids: IdCounters::default(),
                store: SessionStore::new(&cfg.state_dir),
                cfg,
            }
        }

        /// The context of one step.
        pub(crate) fn cx(&mut self) -> Cx<'_> {
            Cx {
                cfg: &self.cfg,
                out: &mut self.out,
                timers: &mut self.timers,
                servers: &mut self.servers,
                llm: &mut self.llm,
                permissions: &mut self.permissions,
                ids: &mut self.ids,
                store: &mut self.store,
            }
        }

        /// The MCP side.
        pub(crate) fn mcp(&mut self) -> McpCx<'_> {
            McpCx {
                cfg: &self.cfg,
                out: &mut self.out,
                timers: &mut self.timers,
                servers: &mut self.servers,
                ids: &mut self.ids,
            }
        }

        /// Moves the step's time to `ms` after the start.
        pub(crate) fn at(&mut self, ms: u64) {
            self.out.advance(MonoTime::ZERO.plus_ms(ms));
        }

        /// Every action queued so far.
        pub(crate) fn drain(&mut self) -> Vec<Action> {
            std::iter::from_fn(|| self.out.pop()).collect()
        }

        /// A server of `session` named `name`, spawned and listed with `tools` (names starting
        /// with `_` are hooks); its start-up actions are drained.
        pub(crate) fn ready_server(
            &mut self,
            session: SessionId,
            name: &str,
            tools: &[&str],
        ) -> ServerSlot {
            let slot = self.servers.add_ready_for_tests(
                session,
                name,
                tools,
                &mut self.out,
                &mut self.timers,
            );
            self.drain();
            slot
        }

        /// A session `sid` with a ready server for each `(name, tools)` of `servers`
        /// ([`Self::ready_server`]).
        pub(crate) fn session_with(
            &mut self,
            sid: SessionId,
            servers: &[(&str, &[&str])],
        ) -> Session {
            let slots = servers
                .iter()
                .map(|(name, tools)| self.ready_server(sid, name, tools))
                .collect();
            Session::new(sid, slots)
        }

        /// A started session `sid` with one ready server `fs` offering `read`, `write` and
        /// `shell`, and the routes of its tools.
        pub(crate) fn fs_session(
            &mut self,
            sid: SessionId,
        ) -> (Session, BTreeMap<String, ToolRoute>) {
            let slot = self.ready_server(sid, "fs", &["read", "write", "shell"]);
            let sess = Session::new(sid, vec![slot]);
            let (_, routes) = self.servers.visible_tools(&sess.servers);
            (sess, routes)
        }

        /// The JSON of every line written to the client, in order.
        pub(crate) fn acp_lines(actions: &[Action]) -> Vec<Value> {
            actions
                .iter()
                .filter_map(|a| {
                    if let Action::WriteAcp(line) = a {
                        serde_json::from_str(line).ok()
                    } else {
                        None
                    }
                })
                .collect()
        }

        /// The JSON of every line written to any server, in order.
        pub(crate) fn mcp_lines(actions: &[Action]) -> Vec<Value> {
            actions
                .iter()
                .filter_map(|a| {
                    if let Action::WriteMcp { line, .. } = a {
                        serde_json::from_str(line).ok()
                    } else {
                        None
                    }
                })
                .collect()
        }

        /// The text of every log line, in order.
        pub(crate) fn logs(actions: &[Action]) -> Vec<String> {
            actions
                .iter()
                .filter_map(|a| {
                    if let Action::Log(r) = a {
                        Some(r.message.clone())
                    } else {
                        None
                    }
                })
                .collect()
        }
    }
}
