//! The MCP client (SPEC M1–M10, T6, H4): every MCP server of every session, in these parts.
//!
//! | file | type | owns |
//! |---|---|---|
//! | `table.rs` | [`ServerTable`] / `Server` | one server per `mcpServers` entry of each session: which session it serves, its death and M9 restart accounting, the H4 timeout count; routes inputs to the parts below and reports [`McpEvent`]s |
//! | `session.rs` | `McpSession` | the MCP session machine (initialize → initialized → list → ready → closed, its diagram in that file): request ids and purposes in flight, each with one deadline, the paginated `tools/list`, server→client requests and notifications. It does not know its transport |
//! | `prompts.rs` | `Prompt` | what a server's `prompts/list` offers, and the ACP commands the client is shown for them (SPEC A11) |
//! | `catalogue.rs` | `Catalogue` | what a server offers: tools under exposed names with usable schemas, hooks, and the merged list the model sees ([`ToolRoute`]s back) |
//! | `stdio.rs` | `StdioTransport` | the child process of each generation: spawn, stdin lines, stdout line buffer, stderr tail, process-group kill |
//! | `http.rs` | `HttpTransport` | Streamable HTTP (and the legacy HTTP+SSE wire): a `POST` per frame, JSON or event-stream answers, the session id and protocol version headers, the `GET` stream, resumption, a new session after a `404`, `DELETE` |
//! | `auth.rs` | `Authorization` | the header an HTTP server's requests carry, and what becomes of a `401`/`403` |
//! | `roots.rs` | `roots_of` | the session's directories as the MCP roots `roots/list` answers (SPEC M13) |
//!
//! The table never sees a turn or a hook round: a request carries a [`Purpose`] naming who
//! waits for it, and replies, failures and settled start-ups come back to the agent as
//! [`McpEvent`]s, in the order they happened, for the agent to route.

mod auth;
mod catalogue;
mod http;
mod prompts;
mod roots;
mod session;
mod stdio;
mod table;

pub(crate) use catalogue::{Builtin, ToolRoute, ToolTarget, with_builtins};
pub use catalogue::{ToolListing, ToolsSeen};
pub(crate) use prompts::{PendingCommand, bind_arguments, parse_command, render_messages, usage};
pub use roots::roots_of;
pub use session::{answer_server_request, initialize_params};
pub(crate) use stdio::KILL_GRACE_MS;
pub(crate) use table::ServerTable;

use crate::ids::{HookRoundId, ServerSlot, SessionId, ToolCallIndex, TurnNo};
use crate::jsonrpc::RpcError;
use serde_json::Value;

/// MCP protocol version we request (SPEC M2).
pub const MCP_PROTOCOL_VERSION: &str = "2025-11-25";
/// Server protocol versions we accept in the `initialize` answer (SPEC M2).
pub const ACCEPTED_MCP_VERSIONS: [&str; 4] =
    ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Who waits for a `tools/call` of the model: the call at `index` of `turn` in `session`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ToolCallRef {
    pub(crate) session: SessionId,
    pub(crate) turn: TurnNo,
    pub(crate) index: ToolCallIndex,
}

/// Who waits for a hook call: the call at `index` (registration order) of `round` in `session`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HookCallRef {
    pub(crate) session: SessionId,
    pub(crate) round: HookRoundId,
    pub(crate) index: usize,
}

/// Who waits for an `interceptor/invoke` (SPEC X1): invocation `invocation` of the chain of
/// the tool call at `index` of `turn` in `session`, on its request (`response: false`) or
/// response phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InterceptRef {
    pub(crate) session: SessionId,
    pub(crate) turn: TurnNo,
    pub(crate) index: ToolCallIndex,
    pub(crate) response: bool,
    pub(crate) invocation: u32,
}

/// What a request to a server is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The `initialize` request (SPEC M2).
    Initialize,
    /// A page of `tools/list` (SPEC M2).
    ListTools,
    /// A page of `prompts/list` (SPEC A11).
    ListPrompts,
    /// The `prompts/get` of a command the user typed in `session` (SPEC A11).
    GetPrompt(SessionId),
    /// A model tool call (SPEC L2).
    Tool(ToolCallRef),
    /// A hook call of a hook round (SPEC H3).
    Hook(HookCallRef),
    /// A page of `interceptors/list` while `session` opens (SPEC X1).
    ListInterceptors(SessionId),
    /// An `interceptor/invoke` of a tool call's chain (SPEC X1).
    Intercept(InterceptRef),
}

/// A request to send to a server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct McpRequest<'a> {
    /// The JSON-RPC method.
    pub(crate) method: &'a str,
    /// Its params.
    pub(crate) params: &'a Value,
    /// Who waits for the reply.
    pub(crate) purpose: Purpose,
    /// Its deadline from now, in ms.
    pub(crate) timeout_ms: u64,
}

impl<'a> McpRequest<'a> {
    /// A `tools/call` (a model's tool call or a hook's) with `params`.
    pub(crate) fn tools_call(params: &'a Value, purpose: Purpose, timeout_ms: u64) -> Self {
        McpRequest {
            method: "tools/call",
            params,
            purpose,
            timeout_ms,
        }
    }
}

/// What the agent must route after a table step, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum McpEvent {
    /// A model tool call was answered (`result` or JSON-RPC error).
    ToolReply {
        call: ToolCallRef,
        reply: Result<Value, RpcError>,
    },
    /// A model tool call ended without an answer (its server died); `reason` is the text the
    /// model sees.
    ToolFailed { call: ToolCallRef, reason: String },
    /// A hook call was answered.
    HookReply {
        call: HookCallRef,
        reply: Result<Value, RpcError>,
    },
    /// A hook call's server died before it answered (fail-open, SPEC H4, I4).
    HookDead { call: HookCallRef },
    /// `server` asks the user for input (`elicitation/create`, SPEC M12): answer `request`
    /// with [`ServerTable::answer_server_request`] for the session `generation` it came from.
    Elicit {
        server: ServerSlot,
        generation: u64,
        request: crate::jsonrpc::RpcId,
        params: Value,
    },
    /// `notifications/progress` for a request of `server` (SPEC A6, case C59): the
    /// `progressToken` as sent and the progress text to show.
    Progress {
        server: ServerSlot,
        token: Value,
        text: String,
    },
    /// A page of `interceptors/list` of `server` was answered, or (`Err`) its server died
    /// first (SPEC X1).
    InterceptorList {
        session: SessionId,
        server: ServerSlot,
        reply: Result<Value, ListLost>,
    },
    /// An `interceptor/invoke` was answered (`result` or JSON-RPC error).
    InterceptReply {
        call: InterceptRef,
        reply: Result<Value, RpcError>,
    },
    /// An `interceptor/invoke`'s server died before it answered; `reason` says how.
    InterceptLost { call: InterceptRef, reason: String },
    /// A listing of a server of `session` dropped tools whose input schema cannot be used:
    /// the user is told, one sentence each (the WARN is logged already).
    ToolsDropped {
        session: SessionId,
        notices: Vec<String>,
    },
    /// A server of `session` became ready or failed before ever serving: `session/new` may be
    /// answered now (SPEC A2).
    StartSettled { session: SessionId },
    /// The prompts a server of `session` offers as commands changed (SPEC A11): the client is
    /// told the session's commands again.
    CommandsChanged { session: SessionId },
    /// The `prompts/get` of a command of `session` was answered (`Ok`: its result), or failed
    /// (`Err`: why, naming the server) (SPEC A11).
    PromptGot {
        session: SessionId,
        reply: Result<Value, String>,
    },
    /// The server's tool list changed while it was being listed: list it again, after the
    /// events before this one were routed.
    Relist { server: ServerSlot },
    /// The user must open `url` to authorize `server` (SPEC M11): shown through the ACP
    /// client; a decline goes to [`ServerTable::login_declined`].
    Login { server: ServerSlot, url: String },
    /// The login of `server` is over (its redirect landed, or its authorization ended).
    LoginDone { server: ServerSlot },
}

/// Why an `interceptors/list` got no answer: a JSON-RPC error, or the server died (the text).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ListLost {
    /// The server answered with a JSON-RPC error.
    Error(RpcError),
    /// The server died (or the request timed out); the text says how.
    Lost(String),
}

/// Why a request of a server timed out, for the agent to act on (see [`ServerTable::expire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// A handshake step: already handled by the table (the events say what followed).
    Handshake,
    /// A model tool call (SPEC M5): the agent fails the call, then kills the server.
    Tool(ToolCallRef),
    /// A hook call (SPEC H4): the agent counts the timeout at the table, then decides the call.
    Hook(HookCallRef),
    /// An `interceptors/list` page (SPEC X1): the agent counts the timeout as for a hook (H4)
    /// and the session's opening records the failure.
    ListInterceptors(SessionId),
    /// An `interceptor/invoke` (SPEC X1): counted as for a hook (H4), then its chain learns.
    Intercept(InterceptRef),
    /// The `prompts/get` of a command of the session (SPEC A11): the agent cancels it and
    /// answers the prompt with an error; the server keeps serving.
    GetPrompt(SessionId),
}

/// Whether the servers of a starting session are all up (SPEC A2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartState {
    /// Some handshake is still running.
    Waiting,
    /// Every server is ready.
    Ready,
    /// A server died before it ever served; the reason names it.
    Failed(String),
}

/// A server a hook round calls (SPEC H3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HookTarget {
    pub(crate) slot: ServerSlot,
    /// The name the client gave (logs).
    pub(crate) name: String,
    /// Its tool prefix (the model-visible injection's tool name, SPEC H6).
    pub(crate) prefix: String,
    /// Whether it is ready to be called now.
    pub(crate) ready: bool,
}

/// The event that fails a request's owner when its server (`slot`) died.
fn failed(slot: ServerSlot, purpose: Purpose, reason: &str) -> Option<McpEvent> {
    match purpose {
        Purpose::Initialize | Purpose::ListTools | Purpose::ListPrompts => None,
        Purpose::GetPrompt(session) => Some(McpEvent::PromptGot {
            session,
            reply: Err(reason.to_string()),
        }),
        Purpose::Tool(call) => Some(McpEvent::ToolFailed {
            call,
            reason: reason.to_string(),
        }),
        Purpose::Hook(call) => Some(McpEvent::HookDead { call }),
        Purpose::ListInterceptors(session) => Some(McpEvent::InterceptorList {
            session,
            server: slot,
            reply: Err(ListLost::Lost(reason.to_string())),
        }),
        Purpose::Intercept(call) => Some(McpEvent::InterceptLost {
            call,
            reason: reason.to_string(),
        }),
    }
}
