//! `buzz-agent-core`: the pure, sans-IO state machine of buzz-agent — an ACP agent that runs
//! the loop LLM → MCP tool calls → results → LLM with MCP lifecycle hooks (`_SessionStart`,
//! `_Stop`, `_PostCompact`, `_SessionEnd`) and, experimental, SEP-2624 interceptors.
//!
//! The core never reads a clock, the environment or a file, never spawns a process or a
//! thread, never blocks and never does IO. Everything it learns arrives as an [`Input`] (an
//! observation of the world: bytes, an exit, an HTTP event, a signal) with the current
//! [`MonoTime`]; everything it wants done leaves as an [`Action`] (write a line, spawn, signal,
//! start or drop an HTTP request, log, exit). A runtime (`buzz-agent` on tokio,
//! `buzz-agent-smol` on smol) moves the bytes; both behave identically because all behaviour
//! is here.
//!
//! # The drain rule
//!
//! One [`Agent`] is owned by one loop. The loop repeats:
//!
//! 1. **Drain.** Call [`Agent::poll_action`] until it returns `None`, starting each action
//!    without waiting for its result (results come back later as inputs).
//! 2. **Stop** if [`Agent::is_finished`] (an [`Action::Exit`] was the last action).
//! 3. **Ask for the deadline.** [`Agent::poll_timeout`] gives the earliest time the core
//!    must be woken, and why ([`TimerKey`]), or `None`.
//! 4. **Wait** for the next input or that time, whichever comes first.
//! 5. **Feed.** An input goes to [`Agent::handle`]; a passed deadline to
//!    [`Agent::handle_timeout`]. Both take the current time. Go to 1.
//!
//! Skipping step 1 after a `handle*` loses nothing (actions queue up in order) but delays it;
//! skipping step 3 can leave a deadline unserved for ever.
//!
//! # Example: a run loop with a fake clock
//!
//! The agent below is answered `initialize`, then stdin closes; it shuts down (SPEC P1) and
//! asks to exit. The clock is a plain [`MonoTime`] the loop moves to each deadline — exactly
//! what the property tests do with thousands of random scripts.
//!
//! ```
//! use buzz_agent_core::{Action, Agent, Config, Input, MonoTime};
//! use std::collections::BTreeMap;
//!
//! let env: BTreeMap<String, String> = [
//!     ("BUZZ_AGENT_PROVIDER", "openai"),
//!     ("OPENAI_COMPAT_MODEL", "test-model"),
//!     ("OPENAI_COMPAT_API_KEY", "test-key"),
//! ]
//! .into_iter()
//! .map(|(k, v)| (k.to_string(), v.to_string()))
//! .collect();
//! let no_files = |path: &str| Err(format!("{path}: no files in this example"));
//! let config = Config::from_env_map(&env, &no_files).expect("a valid configuration");
//!
//! let mut now = MonoTime::ZERO;
//! let mut agent = Agent::new(config, now);
//! let mut inputs = vec![
//!     Input::AcpBytes(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#.to_vec()),
//!     Input::AcpBytes(b"\n".to_vec()),
//!     Input::AcpEof,
//! ]
//! .into_iter();
//! let mut stdout = Vec::new();
//! let mut exit_code = None;
//! loop {
//!     // 1. Drain.
//!     while let Some(action) = agent.poll_action() {
//!         match action {
//!             Action::WriteAcp(line) => stdout.push(line),
//!             Action::Exit { code } => exit_code = Some(code),
//!             Action::Log(record) => eprint!("{}", record.render(agent.config().log_format)),
//!             // This agent has no MCP server and makes no LLM call; a runtime starts these.
//!             other => panic!("unexpected {other:?}"),
//!         }
//!     }
//!     // 2. Stop.
//!     if agent.is_finished() {
//!         break;
//!     }
//!     // 3.–5. The next input, else jump the fake clock to the deadline.
//!     match (inputs.next(), agent.poll_timeout()) {
//!         (Some(input), _) => agent.handle(input, now),
//!         (None, Some((deadline, _why))) => {
//!             now = deadline;
//!             agent.handle_timeout(now);
//!         }
//!         (None, None) => break,
//!     }
//! }
//! assert!(stdout[0].contains(r#""id":1,"result""#), "initialize was answered");
//! assert_eq!(exit_code, Some(0));
//! ```
//!
//! # Methods
//!
//! - **Construction:** [`Agent::new`] with a validated [`Config`] ([`Config::from_env_map`])
//!   and the start time; [`Agent::with_inherited_env`] and [`Agent::with_version`] before the
//!   first input.
//! - **Inputs:** [`Agent::handle`] (one [`Input`]), [`Agent::handle_timeout`] (deadlines).
//!   Failures of the world (a spawn that failed, a broken pipe, a dropped connection) are
//!   inputs too; no method returns an error.
//! - **Outputs:** [`Agent::poll_action`] (one [`Action`] at a time, in order),
//!   [`Agent::is_finished`].
//! - **Time:** [`Agent::poll_timeout`]. Time is monotonic per agent: an earlier `now` than one
//!   already seen is treated as that one.
//!
//! # Invariants between calls
//!
//! - After `handle_timeout(t)` and a drain, `poll_timeout` is `None` or later than `t` (no busy
//!   loop, DESIGN I11).
//! - The same inputs at the same times give the same actions, byte for byte (I12); jitter
//!   comes from [`Config::seed`], session ids from [`Config::session_id_seed`].
//! - Every ACP request gets exactly one response (I7); every `session/update` of a turn
//!   precedes the turn's response (I8).
//! - Replies that arrive after their deadline, or for a process generation that was replaced
//!   ([`ProcKey::generation`]), change nothing but a debug log (I6).
//! - After [`Action::Exit`], `is_finished` is true, `poll_timeout` is `None` and inputs are
//!   ignored.
//!
//! # Inside
//!
//! [`Agent`] routes inputs to typed sub-machines and owns the action queue; each sub-machine
//! owns its state and never sees the agent. `docs/architecture.md` in the repository maps
//! them.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Every `pub` item of a private module is either re-exported below or `pub(crate)`. The
// `testing` feature re-exports internals for the core's own tests, so the lint is checked
// with it on (as `cargo test` and CI build the crate).
#![cfg_attr(feature = "testing", deny(unreachable_pub))]

mod acp;
mod agent;
#[allow(
    dead_code,
    reason = "the HTTP transport creates the authorizers (next step)"
)]
mod authorization;
#[cfg(test)]
mod body_cache_props;
mod compaction;
pub mod config;
mod cx;
mod elicitation;
mod frontmatter;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod history;
pub mod hooks;
pub mod http;
mod ids;
mod instructions;
mod intercept;
pub mod interceptor;
pub mod io;
mod json;
pub mod jsonrpc;
mod lifecycle;
mod llm;
mod llm_call;
mod mcp;
#[allow(dead_code, reason = "wired into the HTTP transport in a later step")]
mod oauth;
mod outbox;
mod permissions;
pub mod project;
mod record;
mod session;
mod session_entry;
mod shutdown;
mod skills;
mod sse;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
mod time;
mod timers;
mod tool_calls;
mod tool_schema;
mod tools;
mod transcript;
mod turn;
#[allow(
    dead_code,
    reason = "used by the OAuth machines; the HTTP transport uses it next"
)]
mod url;

pub use agent::Agent;
pub use config::Config;
pub use hooks::HookPoint;
pub use ids::{ExchangeId, ListenerId, LlmCallId, ProcKey, ServerSlot, TranscriptId};
pub use io::{
    Action, HttpEvent, Input, LlmEvent, LogRecord, OAuthAction, OAuthInput, OpenMode, Signal,
    SpawnSpec, TRANSCRIPT_HEAD_BYTES, TranscriptEntry, TranscriptError, TranscriptEvent,
};
pub use llm::{Body, HttpRequest};
pub use mcp::{ACCEPTED_MCP_VERSIONS, MCP_PROTOCOL_VERSION};

/// The parts of the agent's MCP client that `hooks check` (the extras) runs over its own
/// blocking pipes, so that it talks to a server exactly as a session does: the `initialize`
/// params, the answers to a server's requests, the roots of a directory, the accepted
/// protocol versions, how a `tools/list` is read page by page
/// ([`ToolListing`](mcp_client::ToolListing)) and what the agent makes of it
/// ([`ToolsSeen`](mcp_client::ToolsSeen): the tools it offers, its hooks, what it drops). Read
/// the answers with [`jsonrpc::parse_message`] and judge a hook's with
/// [`hooks::classify_reply`].
pub mod mcp_client {
    pub use crate::mcp::{
        ACCEPTED_MCP_VERSIONS, MCP_PROTOCOL_VERSION, ToolListing, ToolsSeen, answer_server_request,
        initialize_params, roots_of,
    };
}
pub use time::MonoTime;
pub use timers::TimerKey;
