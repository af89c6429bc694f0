//! The contexts of one step: the parts of the agent a machine borrows while it handles an
//! input. Each part is a typed sub-machine with its own methods; none of them is the agent.
//!
//! The agent owns its parts in one [`Parts`]. A machine takes the narrowest context that holds
//! what it uses, so its signature says which parts it can touch:
//!
//! | context | parts | taken by |
//! |---|---|---|
//! | [`McpCx`] | `cfg`, `out`, `timers`, `servers`, `ids` | hook rounds, interceptor screens, the session's opening and ending |
//! | [`ToolCx`] | the MCP side and `permissions`, `store` | the tool batch |
//! | [`Cx`] | every part, the LLM calls too | the turn |
//!
//! [`Parts`] lends each context ([`Parts::mcp`], [`Parts::tools`], [`Parts::cx`]), and a wider
//! context lends a narrower one for a call ([`Cx::mcp`], [`Cx::tools`], [`ToolCx::mcp`]): the
//! parts are reborrowed, nothing is copied. Lending from `Parts` borrows only the parts, so the
//! agent's sessions stay free to borrow beside the context.
//!
//! The three contexts and `Parts` are written once, by `contexts!` below: each context lists
//! only the parts it adds to the one before it, so a part's type and doc are written once.

use crate::config::Config;
use crate::ids::IdCounters;
use crate::llm_call::LlmCalls;
use crate::mcp::ServerTable;
use crate::outbox::Outbox;
use crate::permissions::Permissions;
use crate::store::SessionStore;
use crate::timers::TimerTable;

/// Writes the contexts, each a struct of `cfg: &Config` and `&mut` borrows of the parts it
/// lists and of every part listed before it; the owned [`Parts`] holding them all; a lend from
/// `Parts` to each context and from each context to every narrower one.
macro_rules! contexts {
    // All contexts written: the owned parts.
    (@next [$($(#[$am:meta])* $af:ident: $at:ty,)*] [$($prior:tt)*]) => {
        /// The parts of the agent a step borrows, owned: the agent holds one, and so does each
        /// unit test of a machine that borrows a context.
        pub(crate) struct Parts {
            /// The configuration in force.
            pub(crate) cfg: Config,
            $($(#[$am])* pub(crate) $af: $at,)*
        }
    };
    // One context: the parts before it (`$af`), then its own (`$f`); the narrower contexts
    // written before it (`$pname`, lent by `$plend`, with parts `$pf`).
    (@next [$($(#[$am:meta])* $af:ident: $at:ty,)*]
        [$($pname:ident $plend:ident [$($pf:ident)*])*]
        $(#[$m:meta])* $name:ident, lent by $lend:ident, adds {
            $($(#[$fm:meta])* $f:ident: $t:ty,)*
        }
        $($rest:tt)*
    ) => {
        $(#[$m])*
        pub(crate) struct $name<'a> {
            /// The configuration in force.
            pub(crate) cfg: &'a Config,
            $($(#[$am])* pub(crate) $af: &'a mut $at,)*
            $($(#[$fm])* pub(crate) $f: &'a mut $t,)*
        }

        impl $name<'_> {
            $(
                #[doc = concat!("Lends the narrower [`", stringify!($pname), "`] for a call.")]
                pub(crate) fn $plend(&mut self) -> $pname<'_> {
                    $pname {
                        cfg: self.cfg,
                        $($pf: self.$pf,)*
                    }
                }
            )*
        }

        // The agent lends the tool batch's context only through the turn's; the unit tests of
        // the batch lend it directly.
        #[allow(dead_code)]
        impl Parts {
            #[doc = concat!("Lends a [`", stringify!($name), "`] over these parts.")]
            pub(crate) fn $lend(&mut self) -> $name<'_> {
                $name {
                    cfg: &self.cfg,
                    $($af: &mut self.$af,)*
                    $($f: &mut self.$f,)*
                }
            }
        }

        contexts!(@next
            [$($(#[$am])* $af: $at,)* $($(#[$fm])* $f: $t,)*]
            [$($pname $plend [$($pf)*])* $name $lend [$($af)* $($f)*]]
            $($rest)*);
    };
    ($($contexts:tt)*) => {
        contexts!(@next [] [] $($contexts)*);
    };
}

contexts! {
    /// The MCP side of a step: what a machine that only talks to MCP servers and sets
    /// deadlines may use (hook rounds, interceptor screens, the session's opening and ending).
    McpCx, lent by mcp, adds {
        /// The action queue (and the step's time).
        out: Outbox,
        /// Every deadline.
        timers: TimerTable,
        /// The MCP servers.
        servers: ServerTable,
        /// The process-wide id counters.
        ids: IdCounters,
    }

    /// What a tool batch may use: the MCP side, the permission requests and the session store.
    ToolCx, lent by tools, adds {
        /// The permission requests in flight.
        permissions: Permissions,
        /// The session store (SPEC A9): what the client saw and each tool result are recorded
        /// as they happen.
        store: SessionStore,
    }

    /// What a turn may use: every part of the agent a step can borrow.
    Cx, lent by cx, adds {
        /// The LLM calls in flight, the backoff jitter and what the provider taught us.
        llm: LlmCalls,
    }
}

/// The unit tests' own [`Parts`] and helpers around them, for the machines that borrow a context.
#[cfg(test)]
pub(crate) mod rig {
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

    /// The agent's parts, as the unit tests own them.
    pub(crate) use super::Parts;

    impl Parts {
        /// OpenAI Chat at `http://llm.test/v1`, hooks allowed for every server, permission
        /// `allow`, debug logs, at t = 0.
        pub(crate) fn for_tests() -> Parts {
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
