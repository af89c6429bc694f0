//! The context of one step: the parts of the agent a turn, a tool batch or a hook round
//! borrows while it handles an input. Each part is a typed sub-machine with its own methods;
//! none of them is the agent.

use crate::config::Config;
use crate::ids::IdCounters;
use crate::llm_call::LlmCalls;
use crate::mcp::ServerTable;
use crate::outbox::Outbox;
use crate::permissions::Permissions;
use crate::timers::TimerTable;

/// What a step may use besides its own state.
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
}
