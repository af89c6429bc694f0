//! Typed ids (DESIGN "Ids"): the core allocates them from counters, each has a short `Display`
//! for logs and transcripts, and none can be mistaken for another. Peer ids (JSON-RPC ids of the
//! client and of servers) are not here: they are echoed verbatim as `jsonrpc::RpcId`.

use std::fmt;

/// An ACP session (SPEC A2), shown and sent on the wire as `sess_N` (N from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SessionId(pub(crate) u64);

impl SessionId {
    /// The session a client names, if `text` is exactly how we wrote one (`sess_7`; not
    /// `sess_07`, `sess_+7` or `7`). Other strings name no session.
    pub(crate) fn parse(text: &str) -> Option<SessionId> {
        let digits = text.strip_prefix("sess_")?;
        let n: u64 = digits.parse().ok()?;
        (n.to_string() == digits).then_some(SessionId(n))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sess_{}", self.0)
    }
}

/// An MCP server of a session: one per `mcpServers` entry of each `session/new`, unique in the
/// process and never reused (a restart keeps the slot and bumps [`ProcKey::generation`]).
/// Shown as `mcp#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerSlot(pub u64);

impl fmt::Display for ServerSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mcp#{}", self.0)
    }
}

/// A process the core asked for. `generation` grows at every (re)spawn of the same server, so
/// bytes or an exit from a killed process can never be mistaken for its restart (DESIGN ids).
/// Shown as `mcp#N.gG`. The core never sees a pid: the runtime keeps `ProcKey → child`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcKey {
    /// The server this process runs.
    pub server: ServerSlot,
    /// 0 for the first spawn, +1 per restart (SPEC M9).
    pub generation: u32,
}

impl fmt::Display for ProcKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mcp#{}.g{}", self.server.0, self.generation)
    }
}

/// One LLM HTTP call (one attempt), allocated from a counter (from 1). Shown as `llm#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LlmCallId(pub u64);

impl fmt::Display for LlmCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "llm#{}", self.0)
    }
}

/// A prompt turn (one `session/prompt`), numbered across the process from 1. Shown as `turn#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TurnNo(pub(crate) u64);

impl fmt::Display for TurnNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "turn#{}", self.0)
    }
}

/// A hook round (SPEC H3), numbered across the process from 1. Shown as `round#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct HookRoundId(pub(crate) u64);

impl fmt::Display for HookRoundId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "round#{}", self.0)
    }
}

/// The JSON-RPC id of a request we sent to one MCP server (per server, from 1; the wire id is
/// the bare number). Shown as `#N`, as in the transcripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct McpRequestId(pub(crate) u64);

impl fmt::Display for McpRequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The JSON-RPC id of a `session/request_permission` we sent to the client (SPEC A7), from 1
/// across the process; the wire id is the bare number. Shown as its number, as in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PermissionRequestId(pub(crate) u64);

impl fmt::Display for PermissionRequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The position of a tool call in the model response that asked for it (from 0; SPEC L2: the
/// results go back in this order). Shown as `call[N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ToolCallIndex(pub(crate) usize);

impl fmt::Display for ToolCallIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call[{}]", self.0)
    }
}

/// The process-wide counters of the ids above that are not owned by one sub-machine (server
/// slots are allocated by the server table, sessions by the agent). Every counter starts at 1.
#[derive(Debug, Clone)]
pub(crate) struct IdCounters {
    turn: u64,
    llm_call: u64,
    hook_round: u64,
    permission: u64,
}

impl Default for IdCounters {
    fn default() -> Self {
        IdCounters {
            turn: 1,
            llm_call: 1,
            hook_round: 1,
            permission: 1,
        }
    }
}

impl IdCounters {
    /// The next prompt turn's number.
    pub(crate) fn next_turn(&mut self) -> TurnNo {
        TurnNo(bump(&mut self.turn))
    }

    /// The next LLM call's id.
    pub(crate) fn next_llm_call(&mut self) -> LlmCallId {
        LlmCallId(bump(&mut self.llm_call))
    }

    /// The next hook round's id.
    pub(crate) fn next_hook_round(&mut self) -> HookRoundId {
        HookRoundId(bump(&mut self.hook_round))
    }

    /// The next permission request's id.
    pub(crate) fn next_permission(&mut self) -> PermissionRequestId {
        PermissionRequestId(bump(&mut self.permission))
    }
}

fn bump(counter: &mut u64) -> u64 {
    let n = *counter;
    *counter += 1;
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a2_only_the_exact_wire_form_names_a_session() {
        assert_eq!(SessionId::parse("sess_7"), Some(SessionId(7)));
        assert_eq!(SessionId(7).to_string(), "sess_7");
        for other in [
            "sess_07", "sess_+7", "sess_", "7", "sess_7 ", "SESS_7", "sess_-1",
        ] {
            assert_eq!(SessionId::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn ids_display_short_forms_for_transcripts() {
        let proc = ProcKey {
            server: ServerSlot(3),
            generation: 2,
        };
        assert_eq!(proc.to_string(), "mcp#3.g2");
        assert_eq!(ServerSlot(3).to_string(), "mcp#3");
        assert_eq!(LlmCallId(4).to_string(), "llm#4");
        assert_eq!(TurnNo(5).to_string(), "turn#5");
        assert_eq!(HookRoundId(6).to_string(), "round#6");
        assert_eq!(McpRequestId(7).to_string(), "#7");
        assert_eq!(PermissionRequestId(8).to_string(), "8");
        assert_eq!(ToolCallIndex(0).to_string(), "call[0]");
    }

    #[test]
    fn counters_start_at_one_and_never_repeat() {
        let mut ids = IdCounters::default();
        assert_eq!(ids.next_turn(), TurnNo(1));
        assert_eq!(ids.next_turn(), TurnNo(2));
        assert_eq!(ids.next_llm_call(), LlmCallId(1));
        assert_eq!(ids.next_hook_round(), HookRoundId(1));
        assert_eq!(ids.next_permission(), PermissionRequestId(1));
        assert_eq!(ids.next_permission(), PermissionRequestId(2));
    }
}
