//! An ACP session (SPEC A2): its MCP servers, its conversation, its model and what the user
//! allowed. The running prompt turn is kept beside it by the agent (see `turn.rs`), so a turn
//! can borrow its session while the agent holds both.

use crate::ids::{ServerSlot, SessionId};
use crate::jsonrpc::RpcId;
use crate::transcript::Transcript;
use std::collections::BTreeMap;

/// One session.
#[derive(Debug)]
pub(crate) struct Session {
    /// Its id (`sess_N`).
    pub(crate) id: SessionId,
    /// Its MCP servers in registration order (SPEC H3: hooks run and answer in this order).
    pub(crate) servers: Vec<ServerSlot>,
    /// `Some(request id)` while `session/new` waits for the handshakes (SPEC A2).
    pub(crate) starting: Option<RpcId>,
    /// The conversation.
    pub(crate) transcript: Transcript,
    /// The model set with `session/set_model`, else the configured one.
    pub(crate) model_override: Option<String>,
    /// A prompt that arrived after a cancel and waits for the cancelled turn (SPEC A3).
    pub(crate) queued: Option<(RpcId, String)>,
    /// `*_always` permission answers per qualified tool name (`server__tool`): true = allow
    /// (SPEC A7).
    pub(crate) remembered: BTreeMap<String, bool>,
}

impl Session {
    /// A new session with `servers`, waiting for their handshakes when there are any.
    pub(crate) fn new(id: SessionId, servers: Vec<ServerSlot>, request: &RpcId) -> Session {
        Session {
            id,
            starting: (!servers.is_empty()).then(|| request.clone()),
            servers,
            transcript: Transcript::default(),
            model_override: None,
            queued: None,
            remembered: BTreeMap::new(),
        }
    }

    /// The model of this session's requests.
    pub(crate) fn model<'a>(&'a self, configured: &'a str) -> &'a str {
        self.model_override.as_deref().unwrap_or(configured)
    }
}
