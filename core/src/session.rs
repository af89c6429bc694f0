//! An ACP session (SPEC A2): its MCP servers, its conversation, its model and what the user
//! allowed. Its lifecycle, running prompt turn (see `turn.rs`) and queued prompt are kept
//! beside it in its entry (`session_entry.rs`), so a turn can borrow its session while the
//! router holds both.

use crate::config::{Config, Effort};
use crate::ids::{ServerSlot, SessionId};
use crate::interceptor::Interceptors;
use crate::llm::UsageTotals;
use crate::transcript::Transcript;
use serde_json::Value;
use std::collections::BTreeMap;

/// One session.
#[derive(Debug)]
pub(crate) struct Session {
    /// Its id (`sess_…`).
    pub(crate) id: SessionId,
    /// Its MCP servers in registration order (SPEC H3: hooks run and answer in this order).
    pub(crate) servers: Vec<ServerSlot>,
    /// The decided `_SessionStart` texts `(server, text)`, waiting for the first prompt, which
    /// takes them (SPEC H10).
    pub(crate) start_texts: Vec<(String, String)>,
    /// The interceptors screening this session's tool calls (SPEC X1).
    pub(crate) interceptors: Interceptors,
    /// Prompts run so far (`promptCount` of `_SessionEnd`, SPEC H11).
    pub(crate) prompts: u32,
    /// The conversation.
    pub(crate) transcript: Transcript,
    /// The model set with `session/set_model`, else the configured one.
    pub(crate) model_override: Option<String>,
    /// `*_always` permission answers per qualified tool name (`server__tool`): true = allow
    /// (SPEC A7).
    pub(crate) remembered: BTreeMap<String, bool>,
    /// Notices for the user not yet shown ([`Session::notify`]): the next prompt turn streams
    /// them first, a running turn before its next round.
    pub(crate) notices: Vec<Notice>,
    /// The client presents ACP `notice` updates (`clientCapabilities.session.notices`).
    pub(crate) client_notices: bool,
    /// The system prompt of every request of this session (SPEC A10, L11): built once when
    /// the session opens (`instructions.rs`), so its bytes never change between rounds.
    pub(crate) system_prompt: Option<String>,
    /// The session's skills (SPEC A10), listed in its system prompt and loaded with the
    /// built-in `load_skill`.
    pub(crate) skills: Vec<crate::skills::Skill>,
    /// The tokens of every LLM call of the session in this process (SPEC A6, L11): the
    /// cumulative cost of `usage_update`.
    pub(crate) usage: UsageTotals,
    /// The reasoning effort a client chose with `session/set_config_option` (SPEC L12):
    /// `Some(None)` is the provider's default (no parameter); `None`: as configured
    /// (`BUZZ_AGENT_THINKING_EFFORT`).
    pub(crate) thought_level: Option<Option<Effort>>,
    /// The commands last sent to the client with `available_commands_update` (SPEC A11);
    /// `None`: none sent yet.
    pub(crate) commands_sent: Option<Vec<Value>>,
    /// A command the user typed, waiting for its `prompts/get` (SPEC A11): the session is busy
    /// until it is answered (then its turn starts) or fails.
    pub(crate) command: Option<crate::mcp::PendingCommand>,
}

/// A notice for the user, not the model: the agent's own sentence about something that changed
/// what the user asked for (an `mcpServers` entry skipped, hooks that will not run). Shown as an
/// ACP `notice` update (severity `warning`) to a client that presents them, else as a marked
/// message chunk (docs/clients.md, "Notices").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    /// Its kind, sent as `_meta.buzz.notice` (`mcp_server_skipped`, `hooks_not_allowlisted`,
    /// `mcp_tool_dropped`, …).
    pub(crate) kind: &'static str,
    /// One sentence, without the `[buzz-agent] ` mark (added when shown).
    pub(crate) text: String,
}

impl Session {
    /// Tells the user that something they asked for changed (the one place every such warning
    /// goes through; the caller still logs its WARN): a warning notice of `kind` with `text`
    /// (one sentence, no requirement ids). It is listed in the `session/new` (or load) answer's
    /// `_meta.buzz.notices` when the session is not answered yet, and shown before the next
    /// text the client sees: first in the next prompt, or before the running turn's next round.
    pub(crate) fn notify(&mut self, kind: &'static str, text: String) {
        self.notices.push(Notice { kind, text });
    }

    /// A new session with `servers` (its lifecycle is kept beside it, see
    /// `session_entry.rs`).
    pub(crate) fn new(id: SessionId, servers: Vec<ServerSlot>) -> Session {
        Session {
            id,
            start_texts: Vec::new(),
            interceptors: Interceptors::default(),
            prompts: 0,
            servers,
            transcript: Transcript::default(),
            model_override: None,
            remembered: BTreeMap::new(),
            notices: Vec::new(),
            client_notices: false,
            system_prompt: None,
            skills: Vec::new(),
            usage: UsageTotals::default(),
            thought_level: None,
            commands_sent: None,
            command: None,
        }
    }

    /// The model of this session's requests.
    pub(crate) fn model<'a>(&'a self, configured: &'a str) -> &'a str {
        self.model_override.as_deref().unwrap_or(configured)
    }

    /// The reasoning effort of this session's requests (SPEC L12): the client's choice, else
    /// `BUZZ_AGENT_THINKING_EFFORT`.
    pub(crate) fn effort(&self, cfg: &Config) -> Option<Effort> {
        self.thought_level.unwrap_or(cfg.thinking_effort)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a5_a_session_s_model_is_the_one_set_else_the_configured_one() {
        let mut s = Session::new(SessionId(1), Vec::new());
        assert_eq!(s.model("configured"), "configured");
        s.model_override = Some("picked".into());
        assert_eq!(s.model("configured"), "picked");
    }
}
