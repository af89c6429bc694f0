//! The MCP session machine (MCP 2025-11-25 basic/lifecycle; SPEC M2, M5, M6): the one place
//! that knows the order initialize → initialized → list → ready → closed, the JSON-RPC ids of
//! our requests in flight (each with exactly one deadline), the paginated `tools/list`, and
//! what a server may send us.
//!
//! It does not know its transport. Messages to the server are queued as complete JSON-RPC
//! frames and taken with [`McpSession::poll_outgoing`] by whoever carries them (a child's stdin
//! today); messages from the server come in as one frame each through
//! [`McpSession::on_message`], whichever stream or body they arrived on. It pushes only log
//! records into the [`Outbox`] it borrows, never an action.
//!
//! ```text
//!                open()                     initialize answered           last tools/list
//!  Connecting ──────────▶ Initializing ──── with an accepted ──────▶ Listing ──── page ─────▶ Ready
//!  (the transport         (initialize       protocol version:        (tools/list  answered    (serving calls;
//!   is opening)            in flight)       notifications/           pages, next-             list_changed
//!                                           initialized is sent)     Cursor followed)         re-lists here)
//!      │                       │                                        │                       │
//!      └───────────────────────┴─────────────── close(reason) ──────────┴───────────────────────┘
//!                                                      │
//!                                                      ▼
//!                                             Closed { reason } ────── reopen() ──────▶ Connecting
//!                                                                    (a restart, SPEC M9)
//! ```
//!
//! Transitions are the named methods [`open`](McpSession::open), the answers handled in
//! [`on_message`](McpSession::on_message) (Initializing → Listing, Listing → Ready),
//! [`close`](McpSession::close) and [`reopen`](McpSession::reopen). A failed handshake step is
//! reported as [`SessionEvent::HandshakeFailed`]; the owner decides to close.

use super::catalogue::{ToolListing, next_cursor};
use super::{ACCEPTED_MCP_VERSIONS, MCP_PROTOCOL_VERSION, Purpose};
use crate::config::LogLevel;
use crate::ids::{McpRequestId, ServerSlot};
use crate::jsonrpc::{self, RpcError, RpcId};
use crate::outbox::Outbox;
use crate::timers::{ServerTimer, Timer, TimerTable};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where a session is in its lifecycle (the diagram in the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SessionState {
    /// The transport is opening; nothing was sent yet.
    Connecting,
    /// `initialize` sent, its answer awaited.
    Initializing,
    /// Handshake done, `tools/list` pages in flight.
    Listing,
    /// Serving calls.
    Ready,
    /// No more traffic: the server died, was stopped or shut down. `reason` names the cause
    /// (and the stderr tail) as callers and the log see it.
    Closed {
        /// The text of the cause.
        reason: String,
    },
}

/// One JSON-RPC message for the server, as a complete line, and what it is (a transport that
/// answers per message, HTTP, needs to know).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    /// The message, ending with `\n`.
    pub(crate) text: String,
    /// What it is.
    pub(crate) kind: FrameKind,
}

/// What a [`Frame`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// The `initialize` request (its answer opens the session).
    Initialize(McpRequestId),
    /// `notifications/initialized`.
    Initialized,
    /// Any other request of ours.
    Request(McpRequestId),
    /// Any other notification.
    Notification,
    /// Our answer to a request of the server.
    Response,
}

/// The longest id (its JSON text, in bytes) a server-to-client request may carry (SPEC S5).
/// The answer echoes the id, so a server that never reads its stdin and sends requests with
/// huge ids would otherwise make the agent hold every answer; MCP SDKs number their ids.
pub(crate) const MAX_SERVER_REQUEST_ID_BYTES: usize = 1024;

/// [`SessionEvent::CutOff`] for a server request whose id is over
/// [`MAX_SERVER_REQUEST_ID_BYTES`]; `None` for any other. The request is not answered.
fn id_over_cap(id: &RpcId) -> Option<SessionEvent> {
    let bytes = match id {
        RpcId::Num(n) => n.to_string().len(),
        RpcId::Str(s) => s.len() + 2,
    };
    (bytes > MAX_SERVER_REQUEST_ID_BYTES).then(|| SessionEvent::CutOff {
        cause: format!("sent a request id of {bytes} bytes (over 1 KiB); killed"),
    })
}

/// What a server's message meant, for the owner of the session to act on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SessionEvent {
    /// A request of someone else (a tool, hook or interceptor call) was answered.
    Reply {
        /// Who waits for it.
        purpose: Purpose,
        /// Its `result` or JSON-RPC error.
        outcome: Result<Value, RpcError>,
    },
    /// A handshake step (or a re-listing page) was answered and the next one is on its way.
    HandshakeStep,
    /// A handshake step was answered with a failure; `cause` completes
    /// `MCP server '<name>' …`. `fatal`: the start fails (a re-listing of a ready server only
    /// warns).
    HandshakeFailed {
        /// The cause, e.g. `failed to start: initialize was rejected: -32603 boom`.
        cause: String,
        /// Whether the server must be closed.
        fatal: bool,
    },
    /// The last `tools/list` page arrived: the raw tools of every page, in order.
    Listed {
        /// The `tools` entries as the server sent them.
        tools: Vec<Value>,
        /// The listing ended the handshake (Listing → Ready) rather than re-listing.
        ready_now: bool,
        /// The list changed while it was being listed: list it again.
        relist: bool,
    },
    /// A request of someone else will get no answer: its transport gave up on it (an HTTP
    /// error answer, a stream that closed). `reason` completes `MCP server '<name>' …`.
    Lost {
        /// Who waits for it.
        purpose: Purpose,
        /// Why, e.g. `answered HTTP 500 (Internal Server Error)`.
        reason: String,
    },
    /// The last `prompts/list` page arrived (`Ok`: the raw prompts of every page, in order),
    /// or the listing failed (`Err`: the cause, completing `mcp '<name>': `) (SPEC A11).
    Prompts(Result<Vec<Value>, String>),
    /// The server sent what no server may (SPEC S5: a request id over
    /// [`MAX_SERVER_REQUEST_ID_BYTES`]): it is cut off. `cause` completes
    /// `MCP server '<name>' …`.
    CutOff {
        /// Why, e.g. `sent a request id of 1048578 bytes (over 1 KiB); killed`.
        cause: String,
    },
    /// The server asks the user for input (`elicitation/create`, SPEC M12): the owner answers
    /// `request` with [`McpSession::respond`].
    Elicit {
        /// The server's request id, to echo.
        request: RpcId,
        /// Its params, as sent.
        params: Value,
    },
    /// `notifications/progress` of a request of ours (SPEC A6, case C59).
    Progress {
        /// The `progressToken`, as sent.
        token: Value,
        /// The text to show.
        text: String,
    },
}

/// The `initialize` params the agent sends every server (SPEC M2): protocol version
/// [`MCP_PROTOCOL_VERSION`], `clientInfo` `buzz-agent` with `client_version`, and the client
/// capabilities the session serves: `roots` (M13) and, when the ACP client presents forms or
/// URLs, `elicitation` (M12).
#[must_use]
pub fn initialize_params(client_version: &str, elicitation: Option<&Value>) -> Value {
    let mut capabilities = json!({"roots": {"listChanged": false}});
    if let Some(elicitation) = elicitation {
        capabilities["elicitation"] = elicitation.clone();
    }
    json!({
        "protocolVersion": MCP_PROTOCOL_VERSION,
        "capabilities": capabilities,
        "clientInfo": {"name": "buzz-agent", "version": client_version}
    })
}

/// The agent's answer (a complete line) to a server's request `method` with `id` (SPEC M6):
/// `ping` → `{}`, `roots/list` → `roots` (M13, see [`roots_of`](super::roots::roots_of)),
/// any other → `-32601`. `None` for `elicitation/create` (M12), which the user answers.
#[must_use]
pub fn answer_server_request(id: &RpcId, method: &str, roots: &Value) -> Option<String> {
    Some(if method == "ping" {
        jsonrpc::encode_result(id, &json!({}))
    } else if method == "roots/list" {
        // M13: the session's directories; they do not change during a session.
        jsonrpc::encode_result(id, &json!({"roots": roots}))
    } else if method == "elicitation/create" {
        return None;
    } else {
        let err = RpcError {
            code: jsonrpc::RpcError::METHOD_NOT_FOUND,
            message: format!("Method not found: {method}"),
            data: None,
        };
        jsonrpc::encode_error(Some(id), &err)
    })
}

/// One MCP session with a server (one process generation or one HTTP session).
#[derive(Debug)]
pub(crate) struct McpSession {
    /// The server, for the keys of its request deadlines.
    slot: ServerSlot,
    /// The name the client gave (logs).
    name: String,
    state: SessionState,
    /// Requests in flight; each has exactly one `Timer::Server(slot, Request(id))`.
    pending: BTreeMap<McpRequestId, Purpose>,
    /// The next request id; never reused, not even across [`reopen`](McpSession::reopen).
    next_id: u64,
    /// The deadline of each handshake and `tools/list` request, in ms.
    list_timeout_ms: u64,
    /// Tools collected from the `tools/list` pages in flight, within the caps (SPEC S5), and
    /// the cursors followed.
    list_acc: ToolListing,
    relist_wanted: bool,
    /// The server declared `capabilities.prompts` in its `initialize` answer (SPEC A11).
    offers_prompts: bool,
    /// Prompts collected from the `prompts/list` pages in flight.
    prompt_acc: Vec<Value>,
    prompt_cursors: BTreeSet<String>,
    /// `notifications/prompts/list_changed` came while prompts were being listed.
    prompt_relist_wanted: bool,
    /// The protocol version the server's `initialize` answer settled on.
    version: Option<String>,
    /// Frames for the transport, in order.
    outgoing: VecDeque<Frame>,
    /// The `roots` of a `roots/list` answer (SPEC M13): the session's directories as MCP
    /// `Root`s, see [`super::roots::roots_of`].
    roots: Value,
    /// The `elicitation` capability declared in `initialize` (SPEC M12), if any.
    elicitation: Option<Value>,
    /// Which transport generation this is, counted by [`reopen`](McpSession::reopen): an
    /// answer meant for an earlier one is not sent to a later one.
    generation: u64,
}

impl McpSession {
    /// A session of the server in `slot` named `name`, [`SessionState::Connecting`]; handshake
    /// and listing requests time out after `list_timeout_ms`.
    pub(crate) fn new(slot: ServerSlot, name: &str, list_timeout_ms: u64) -> McpSession {
        McpSession {
            slot,
            name: name.to_string(),
            state: SessionState::Connecting,
            pending: BTreeMap::new(),
            next_id: 1,
            list_timeout_ms,
            list_acc: ToolListing::default(),
            relist_wanted: false,
            offers_prompts: false,
            prompt_acc: Vec::new(),
            prompt_cursors: BTreeSet::new(),
            prompt_relist_wanted: false,
            version: None,
            outgoing: VecDeque::new(),
            roots: Value::Array(Vec::new()),
            elicitation: None,
            generation: 0,
        }
    }

    /// The `elicitation` capability to declare in `initialize` (SPEC M12: the modes the ACP
    /// client presents), `None` for none.
    pub(crate) fn set_elicitation(&mut self, capability: Option<Value>) {
        self.elicitation = capability;
    }

    /// The transport generation (0 for the first, one more per [`reopen`](Self::reopen)).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Queues the answer to the server's request `request` (an `elicitation/create`, SPEC
    /// M12), unless the session closed meanwhile.
    pub(crate) fn respond(&mut self, request: &RpcId, outcome: Result<&Value, &RpcError>) {
        if self.is_closed() {
            return;
        }
        let text = match outcome {
            Ok(result) => jsonrpc::encode_result(request, result),
            Err(e) => jsonrpc::encode_error(Some(request), e),
        };
        self.outgoing.push_back(Frame {
            text,
            kind: FrameKind::Response,
        });
    }

    /// The roots `roots/list` answers with (SPEC M13): a JSON array of MCP `Root`s.
    pub(crate) fn set_roots(&mut self, roots: Value) {
        self.roots = roots;
    }

    /// The lifecycle state.
    pub(crate) fn state(&self) -> &SessionState {
        &self.state
    }

    /// Ready to serve calls.
    pub(crate) fn is_ready(&self) -> bool {
        self.state == SessionState::Ready
    }

    /// Closed (dead, stopped or shut down).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state, SessionState::Closed { .. })
    }

    /// The next frame to carry to the server, in order.
    pub(crate) fn poll_outgoing(&mut self) -> Option<Frame> {
        self.outgoing.pop_front()
    }

    /// The protocol version the server settled on in `initialize` (sent as
    /// `MCP-Protocol-Version` over HTTP), once known.
    pub(crate) fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The newest request in flight (tests answer it).
    #[cfg(test)]
    pub(crate) fn last_pending(&self) -> Option<McpRequestId> {
        self.pending.keys().next_back().copied()
    }

    /// The purpose of request `id`, while it is in flight.
    pub(crate) fn purpose(&self, id: McpRequestId) -> Option<Purpose> {
        self.pending.get(&id).copied()
    }

    /// Connecting → Initializing: the transport is open, `initialize` is sent (SPEC M2:
    /// protocol version 2025-11-25, `clientInfo` with `client_version`; the client
    /// capabilities name the server requests [`on_message`](Self::on_message) serves:
    /// `roots`, M13).
    /// Ignored in any other state.
    pub(crate) fn open(&mut self, client_version: &str, out: &Outbox, timers: &mut TimerTable) {
        if self.state != SessionState::Connecting {
            return;
        }
        self.state = SessionState::Initializing;
        let params = initialize_params(client_version, self.elicitation.as_ref());
        let id = self.request(
            "initialize",
            &params,
            Purpose::Initialize,
            self.list_timeout_ms,
            out,
            timers,
        );
        if let Some(frame) = self.outgoing.back_mut() {
            frame.kind = FrameKind::Initialize(id);
        }
    }

    /// Any state → Closed: the requests in flight are taken (their deadlines cleared), in id
    /// order, for the caller to fail. An already closed session keeps its first reason.
    pub(crate) fn close(&mut self, reason: String, timers: &mut TimerTable) -> Vec<Purpose> {
        if !self.is_closed() {
            self.state = SessionState::Closed { reason };
        }
        self.take_pending(timers)
    }

    /// Closed → Connecting, for a new transport (an M9 restart): nothing in flight, no list
    /// pages collected. Ids keep counting.
    pub(crate) fn reopen(&mut self, timers: &mut TimerTable) {
        self.take_pending(timers);
        self.list_acc.take();
        self.prompt_acc.clear();
        self.offers_prompts = false;
        self.outgoing.clear();
        self.version = None;
        self.generation += 1;
        self.state = SessionState::Connecting;
    }

    /// Queues request `method` with `params` for `purpose`, with one deadline `timeout_ms` from
    /// now; its id.
    pub(crate) fn request(
        &mut self,
        method: &str,
        params: &Value,
        purpose: Purpose,
        timeout_ms: u64,
        out: &Outbox,
        timers: &mut TimerTable,
    ) -> McpRequestId {
        let id = McpRequestId(self.next_id);
        self.next_id += 1;
        self.pending.insert(id, purpose);
        timers.set(
            Timer::Server(self.slot, ServerTimer::Request(id)),
            out.now().plus_ms(timeout_ms),
        );
        self.outgoing.push_back(Frame {
            text: jsonrpc::encode_request(id.0, method, params),
            kind: FrameKind::Request(id),
        });
        id
    }

    /// Queues notification `method` with `params`.
    pub(crate) fn notify(&mut self, method: &str, params: &Value) {
        let kind = if method == "notifications/initialized" {
            FrameKind::Initialized
        } else {
            FrameKind::Notification
        };
        self.outgoing.push_back(Frame {
            text: jsonrpc::encode_notification(method, params),
            kind,
        });
    }

    /// Request `id` will get no answer (its transport gave up on it, `reason`): its deadline is
    /// cleared and its owner learns why; a handshake step fails the handshake. `None` when it
    /// was not in flight.
    pub(crate) fn fail(
        &mut self,
        id: McpRequestId,
        reason: &str,
        timers: &mut TimerTable,
    ) -> Option<SessionEvent> {
        let purpose = self.forget(id, timers)?;
        Some(match purpose {
            Purpose::Initialize => SessionEvent::HandshakeFailed {
                cause: format!("failed to start: initialize {reason}"),
                fatal: true,
            },
            Purpose::ListTools => SessionEvent::HandshakeFailed {
                cause: format!("tools/list {reason}"),
                fatal: self.state == SessionState::Listing,
            },
            Purpose::ListPrompts => SessionEvent::Prompts(Err(format!("prompts/list {reason}"))),
            Purpose::Tool(_)
            | Purpose::Hook(_)
            | Purpose::GetPrompt(_)
            | Purpose::ListInterceptors(_)
            | Purpose::Intercept(_) => SessionEvent::Lost {
                purpose,
                reason: reason.to_string(),
            },
        })
    }

    /// Forgets request `id` and its deadline (abandoned, timed out or answered); its purpose if
    /// it was in flight. A later answer is inert (I6).
    pub(crate) fn forget(&mut self, id: McpRequestId, timers: &mut TimerTable) -> Option<Purpose> {
        timers.clear(Timer::Server(self.slot, ServerTimer::Request(id)));
        self.pending.remove(&id)
    }

    /// Every request in flight, removed with its deadline, in id order.
    fn take_pending(&mut self, timers: &mut TimerTable) -> Vec<Purpose> {
        let pending = std::mem::take(&mut self.pending);
        pending
            .into_iter()
            .map(|(id, purpose)| {
                timers.clear(Timer::Server(self.slot, ServerTimer::Request(id)));
                purpose
            })
            .collect()
    }

    /// Whether a `tools/list` is in flight (the first listing, or a re-listing after
    /// `notifications/tools/list_changed`).
    pub(crate) fn is_listing(&self) -> bool {
        self.is_in_flight(&Purpose::ListTools)
    }

    /// Whether a request for `purpose` is in flight.
    fn is_in_flight(&self, purpose: &Purpose) -> bool {
        self.pending.values().any(|p| p == purpose)
    }

    /// Starts a `tools/list` (first page) unless one is in flight; a list change meanwhile makes
    /// it run again after (SPEC M2, M6).
    pub(crate) fn start_listing(&mut self, out: &Outbox, timers: &mut TimerTable) {
        self.start_paged_listing(Listing::Tools, out, timers);
    }

    /// Starts a `prompts/list` (first page) of a server that declared prompts, unless one is
    /// in flight; a list change meanwhile makes it run again after (SPEC A11, MCP
    /// server/prompts).
    pub(crate) fn start_prompt_listing(&mut self, out: &Outbox, timers: &mut TimerTable) {
        if self.offers_prompts && !self.start_paged_listing(Listing::Prompts, out, timers) {
            self.prompt_relist_wanted = true;
        }
    }

    /// The first page of a paged listing (SPEC M2, A11), unless one is in flight (then
    /// `false`, and nothing changes): the pages, cursors and change flag of the listing before
    /// are forgotten first.
    fn start_paged_listing(
        &mut self,
        listing: Listing,
        out: &Outbox,
        timers: &mut TimerTable,
    ) -> bool {
        let (method, purpose) = match listing {
            Listing::Tools => ("tools/list", Purpose::ListTools),
            Listing::Prompts => ("prompts/list", Purpose::ListPrompts),
        };
        if self.is_in_flight(&purpose) {
            return false;
        }
        match listing {
            Listing::Tools => {
                self.relist_wanted = false;
                self.list_acc.take();
            }
            Listing::Prompts => {
                self.prompt_relist_wanted = false;
                self.prompt_acc.clear();
                self.prompt_cursors.clear();
            }
        }
        self.request(
            method,
            &json!({}),
            purpose,
            self.list_timeout_ms,
            out,
            timers,
        );
        true
    }

    /// One JSON-RPC message of the server, already parsed by its transport (which decides how
    /// loudly to report a frame that is not JSON-RPC, SPEC T6): a response is matched to its
    /// request, a request is answered (`ping` → `{}`, `roots/list` → the roots (M13), others
    /// `-32601`, SPEC M6) or handed to the owner (`elicitation/create`, M12); one whose id is
    /// over 1 KiB is not answered but cuts the server off (SPEC S5); a notification
    /// is acted on. `None` when nothing is left for the owner (a log line, an answer queued, a
    /// late reply dropped, I6).
    pub(crate) fn on_message(
        &mut self,
        message: jsonrpc::Message,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Option<SessionEvent> {
        match message {
            jsonrpc::Message::Response { id, outcome } => {
                self.on_response(&id, outcome, out, timers)
            }
            jsonrpc::Message::Request { id, method, params } => {
                if let Some(cut) = id_over_cap(&id) {
                    return Some(cut);
                }
                self.on_server_request(id, &method, params)
            }
            jsonrpc::Message::Notification { method, params } => {
                self.on_notification(&method, &params, out, timers)
            }
        }
    }

    fn on_server_request(
        &mut self,
        id: RpcId,
        method: &str,
        params: Value,
    ) -> Option<SessionEvent> {
        let Some(frame) = answer_server_request(&id, method, &self.roots) else {
            // M12: the user answers, through the ACP client (or the agent declines).
            return Some(SessionEvent::Elicit {
                request: id,
                params,
            });
        };
        self.outgoing.push_back(Frame {
            text: frame,
            kind: FrameKind::Response,
        });
        None
    }

    fn on_notification(
        &mut self,
        method: &str,
        params: &Value,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Option<SessionEvent> {
        let name = &self.name;
        match method {
            "notifications/progress" => {
                // C59: progress of a tool call; the batch matches the token to its call.
                if let Some(token) = params.get("progressToken").filter(|t| !t.is_null()) {
                    return Some(SessionEvent::Progress {
                        token: token.clone(),
                        text: progress_text(params),
                    });
                }
                out.log(
                    LogLevel::Debug,
                    format!("mcp '{name}': progress without a progressToken ignored"),
                );
            }
            "notifications/tools/list_changed" => {
                self.relist_wanted = true;
                if self.is_ready() {
                    self.start_listing(out, timers);
                }
            }
            "notifications/prompts/list_changed" => {
                // A11: the first listing starts when the server is ready; a change before
                // that is in it.
                if self.is_ready() {
                    self.start_prompt_listing(out, timers);
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
                out.log(level, format!("[mcp:{name}] {text}"));
            }
            other => out.log(
                LogLevel::Debug,
                format!("mcp '{name}': ignoring notification {other}"),
            ),
        }
        None
    }

    fn on_response(
        &mut self,
        id: &Value,
        outcome: Result<Value, RpcError>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Option<SessionEvent> {
        let name = &self.name;
        let Some(our) = jsonrpc::match_our_id(id) else {
            match &outcome {
                Err(e) => out.log(
                    LogLevel::Warn,
                    format!(
                        "mcp '{name}': error without request id: {} {}",
                        e.code, e.message
                    ),
                ),
                Ok(_) => out.log(
                    LogLevel::Debug,
                    format!("mcp '{name}': response with foreign id {id}; dropped"),
                ),
            }
            return None;
        };
        let Some(purpose) = self.forget(McpRequestId(our), timers) else {
            out.log(
                LogLevel::Debug,
                format!(
                    "mcp '{}': late or unknown response id {our}; dropped",
                    self.name
                ),
            );
            return None;
        };
        Some(match purpose {
            Purpose::Initialize => self.on_initialize_answer(outcome, out, timers),
            Purpose::ListTools => self.on_list_page(outcome, out, timers),
            Purpose::ListPrompts => self.on_prompt_page(outcome, out, timers),
            Purpose::Tool(_)
            | Purpose::Hook(_)
            | Purpose::GetPrompt(_)
            | Purpose::ListInterceptors(_)
            | Purpose::Intercept(_) => SessionEvent::Reply { purpose, outcome },
        })
    }

    /// Initializing → Listing when the answer carries an accepted protocol version (SPEC M2).
    fn on_initialize_answer(
        &mut self,
        outcome: Result<Value, RpcError>,
        out: &Outbox,
        timers: &mut TimerTable,
    ) -> SessionEvent {
        let result = match outcome {
            Ok(v) => v,
            Err(e) => {
                return SessionEvent::HandshakeFailed {
                    cause: format!(
                        "failed to start: initialize was rejected: {} {}",
                        e.code, e.message
                    ),
                    fatal: true,
                };
            }
        };
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !ACCEPTED_MCP_VERSIONS.contains(&version) {
            return SessionEvent::HandshakeFailed {
                cause: format!("failed to start: unsupported MCP protocol version '{version}'"),
                fatal: true,
            };
        }
        self.version = Some(version.to_string());
        self.offers_prompts = result
            .get("capabilities")
            .and_then(|c| c.get("prompts"))
            .is_some_and(Value::is_object);
        self.notify("notifications/initialized", &json!({}));
        if self.state == SessionState::Initializing {
            self.state = SessionState::Listing;
        }
        self.start_listing(out, timers);
        SessionEvent::HandshakeStep
    }

    /// A `tools/list` page: the next page is asked for (`nextCursor`, SPEC M2: stop on a
    /// repeated cursor or after [`MAX_LIST_PAGES`](super::catalogue::MAX_LIST_PAGES) pages, with a warning), or the listing is done
    /// (Listing → Ready).
    fn on_list_page(
        &mut self,
        outcome: Result<Value, RpcError>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> SessionEvent {
        let result = match outcome {
            Ok(v) => v,
            Err(e) => {
                return SessionEvent::HandshakeFailed {
                    cause: format!("tools/list failed: {} {}", e.code, e.message),
                    fatal: self.state == SessionState::Listing,
                };
            }
        };
        let mut warnings = Vec::new();
        let next = self.list_acc.page(&result, &mut warnings);
        for w in warnings {
            out.log(LogLevel::Warn, format!("mcp '{}': {w}", self.name));
        }
        if let Some(c) = next {
            return self.request_page("tools/list", Purpose::ListTools, &c, out, timers);
        }
        let ready_now = self.state == SessionState::Listing;
        if ready_now {
            self.state = SessionState::Ready;
        }
        if ready_now {
            // A11: the prompts are listed once the tools are, never delaying the start.
            self.start_prompt_listing(out, timers);
        }
        SessionEvent::Listed {
            tools: self.list_acc.take(),
            ready_now,
            relist: self.relist_wanted,
        }
    }

    /// A `prompts/list` page (SPEC A11): the next page is asked for (as for `tools/list`, SPEC
    /// M2), the listing runs again when the list changed meanwhile, or the prompts of every
    /// page are handed on. A failure keeps the prompts listed before.
    fn on_prompt_page(
        &mut self,
        outcome: Result<Value, RpcError>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> SessionEvent {
        let result = match outcome {
            Ok(v) => v,
            Err(e) => {
                return SessionEvent::Prompts(Err(format!(
                    "prompts/list failed: {} {}",
                    e.code, e.message
                )));
            }
        };
        if let Some(list) = result.get("prompts").and_then(Value::as_array) {
            let room =
                (super::prompts::MAX_PROMPTS_PER_SERVER + 1).saturating_sub(self.prompt_acc.len());
            self.prompt_acc.extend(list.iter().take(room).cloned());
        }
        let full = self.prompt_acc.len() > super::prompts::MAX_PROMPTS_PER_SERVER;
        let next = if full {
            None
        } else {
            next_cursor(&result, &mut self.prompt_cursors, "prompts/list").unwrap_or_else(|w| {
                out.log(LogLevel::Warn, format!("mcp '{}': {w}", self.name));
                None
            })
        };
        if let Some(c) = next {
            return self.request_page("prompts/list", Purpose::ListPrompts, &c, out, timers);
        }
        let prompts = std::mem::take(&mut self.prompt_acc);
        if self.prompt_relist_wanted {
            self.start_prompt_listing(out, timers);
        }
        SessionEvent::Prompts(Ok(prompts))
    }
}

/// The two paged listings of a server (SPEC M2, A11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    /// `tools/list`.
    Tools,
    /// `prompts/list`.
    Prompts,
}

impl McpSession {
    /// Asks for the page of `method` at `cursor` (SPEC M2, A11).
    fn request_page(
        &mut self,
        method: &str,
        purpose: Purpose,
        cursor: &str,
        out: &Outbox,
        timers: &mut TimerTable,
    ) -> SessionEvent {
        self.request(
            method,
            &json!({"cursor": cursor}),
            purpose,
            self.list_timeout_ms,
            out,
            timers,
        );
        SessionEvent::HandshakeStep
    }
}

/// The text of an MCP `notifications/progress` (case C59): its `message`, then
/// `(progress/total)` or `(progress)`, capped like a stderr line. `{"progress":3,"total":10,
/// "message":"copying"}` → `copying (3/10)`.
pub(super) fn progress_text(params: &Value) -> String {
    let num = |k: &str| {
        params.get(k).filter(|v| v.is_number()).map(|v| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                .map_or_else(|| v.to_string(), |f| format!("{}", f as i64))
        })
    };
    let count = match (num("progress"), num("total")) {
        (Some(p), Some(t)) => Some(format!("{p}/{t}")),
        (Some(p), None) => Some(p),
        (None, _) => None,
    };
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|m| !m.is_empty());
    let text = match (message, count) {
        (Some(m), Some(c)) => format!("{m} ({c})"),
        (Some(m), None) => m.to_string(),
        (None, Some(c)) => format!("progress {c}"),
        (None, None) => "in progress".to_string(),
    };
    crate::io::cap_stderr_line(&text, 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{SessionId, ToolCallIndex, TurnNo};
    use crate::io::Action;
    use crate::mcp::ToolCallRef;
    use crate::time::MonoTime;

    const SLOT: ServerSlot = ServerSlot(7);

    /// A session alone, with the outbox and timers a step lends it.
    struct Rig {
        mcp: McpSession,
        out: Outbox,
        timers: TimerTable,
    }

    impl Rig {
        fn new() -> Rig {
            Rig {
                mcp: McpSession::new(SLOT, "fs", 30_000),
                out: Outbox::new(LogLevel::Debug, MonoTime::ZERO),
                timers: TimerTable::default(),
            }
        }

        /// The frames queued for the transport, parsed.
        fn sent(&mut self) -> Vec<Value> {
            std::iter::from_fn(|| self.mcp.poll_outgoing())
                .map(|f| {
                    assert!(f.text.ends_with('\n'), "one frame per line: {f:?}");
                    serde_json::from_str(&f.text).expect("a JSON frame")
                })
                .collect()
        }

        fn answer(&mut self, id: &Value, result: Value) -> Option<SessionEvent> {
            let message = jsonrpc::Message::Response {
                id: id.clone(),
                outcome: Ok(result),
            };
            self.mcp
                .on_message(message, &mut self.out, &mut self.timers)
        }
    }

    #[test]
    fn m2_open_initialize_initialized_list_ready_with_frames_in_order_and_no_action() {
        let mut rig = Rig::new();
        assert_eq!(*rig.mcp.state(), SessionState::Connecting);
        rig.mcp.open("1.2.3", &rig.out, &mut rig.timers);
        assert_eq!(*rig.mcp.state(), SessionState::Initializing);
        let init = rig.sent();
        assert_eq!(init.len(), 1);
        assert_eq!(init[0]["method"], "initialize");
        assert_eq!(init[0]["params"]["protocolVersion"], MCP_PROTOCOL_VERSION);
        assert_eq!(init[0]["params"]["clientInfo"]["version"], "1.2.3");
        assert!(
            rig.timers
                .contains(Timer::Server(SLOT, ServerTimer::Request(McpRequestId(1))))
        );
        // A second open changes nothing.
        rig.mcp.open("1.2.3", &rig.out, &mut rig.timers);
        assert!(rig.sent().is_empty());

        let step = rig.answer(&init[0]["id"], json!({"protocolVersion": "2024-11-05"}));
        assert_eq!(step, Some(SessionEvent::HandshakeStep));
        assert_eq!(*rig.mcp.state(), SessionState::Listing);
        let frames = rig.sent();
        let methods: Vec<&str> = frames.iter().filter_map(|f| f["method"].as_str()).collect();
        assert_eq!(methods, ["notifications/initialized", "tools/list"]);
        assert!(frames[0].get("id").is_none(), "a notification has no id");

        let listed = rig.answer(&frames[1]["id"], json!({"tools": [{"name": "read"}]}));
        assert_eq!(
            listed,
            Some(SessionEvent::Listed {
                tools: vec![json!({"name": "read"})],
                ready_now: true,
                relist: false
            })
        );
        assert!(rig.mcp.is_ready());
        assert!(
            rig.timers.next().is_none(),
            "every deadline was cleared with its answer"
        );
        assert!(
            std::iter::from_fn(|| rig.out.pop()).all(|a| matches!(a, Action::Log(_))),
            "the session never asks the runtime for anything but log lines"
        );
    }

    #[test]
    fn m2_a_rejected_initialize_or_an_old_version_is_a_fatal_handshake_failure() {
        for (outcome, cause) in [
            (
                Err(RpcError {
                    code: -32603,
                    message: "boom".into(),
                    data: None,
                }),
                "failed to start: initialize was rejected: -32603 boom",
            ),
            (
                Ok(json!({"protocolVersion": "2023-01-01"})),
                "failed to start: unsupported MCP protocol version '2023-01-01'",
            ),
        ] {
            let mut rig = Rig::new();
            rig.mcp.open("1", &rig.out, &mut rig.timers);
            rig.sent();
            let message = jsonrpc::Message::Response {
                id: json!(1),
                outcome,
            };
            let event = rig.mcp.on_message(message, &mut rig.out, &mut rig.timers);
            assert_eq!(
                event,
                Some(SessionEvent::HandshakeFailed {
                    cause: cause.into(),
                    fatal: true
                })
            );
            assert!(rig.sent().is_empty(), "nothing follows a failed initialize");
        }
    }

    #[test]
    fn m9_close_hands_back_the_calls_in_flight_in_id_order_and_reopen_keeps_counting_ids() {
        let mut rig = Rig::new();
        let call = |i| {
            Purpose::Tool(ToolCallRef {
                session: SessionId(1),
                turn: TurnNo(1),
                index: ToolCallIndex(i),
            })
        };
        let a = rig.mcp.request(
            "tools/call",
            &json!({}),
            call(0),
            100,
            &rig.out,
            &mut rig.timers,
        );
        let b = rig.mcp.request(
            "tools/call",
            &json!({}),
            call(1),
            100,
            &rig.out,
            &mut rig.timers,
        );
        assert!(b > a);
        let taken = rig.mcp.close("gone".into(), &mut rig.timers);
        assert_eq!(taken, vec![call(0), call(1)]);
        assert!(rig.timers.next().is_none());
        assert!(rig.mcp.close("again".into(), &mut rig.timers).is_empty());
        assert_eq!(
            *rig.mcp.state(),
            SessionState::Closed {
                reason: "gone".into()
            },
            "the first reason stays"
        );
        rig.mcp.reopen(&mut rig.timers);
        assert_eq!(*rig.mcp.state(), SessionState::Connecting);
        assert!(
            rig.sent().is_empty(),
            "frames of the closed session are dropped"
        );
        rig.mcp.open("1", &rig.out, &mut rig.timers);
        assert_eq!(rig.sent()[0]["id"], json!(b.0 + 1));
        // A late answer to a request of the closed session is inert (I6).
        assert_eq!(rig.answer(&json!(a.0), json!({})), None);
    }

    #[test]
    fn m12_elicitation_is_declared_as_set_handed_to_the_owner_and_answered_once() {
        let mut rig = Rig::new();
        rig.mcp.set_elicitation(Some(json!({"form": {}})));
        rig.mcp.open("1", &rig.out, &mut rig.timers);
        assert_eq!(
            rig.sent()[0]["params"]["capabilities"],
            json!({"roots": {"listChanged": false}, "elicitation": {"form": {}}})
        );
        let params = json!({"message": "name?", "requestedSchema": {"type": "object"}});
        let request: RpcId = serde_json::from_value(json!(9)).expect("an id");
        let message = jsonrpc::Message::Request {
            id: request.clone(),
            method: "elicitation/create".into(),
            params: params.clone(),
        };
        assert_eq!(
            rig.mcp.on_message(message, &mut rig.out, &mut rig.timers),
            Some(SessionEvent::Elicit {
                request: request.clone(),
                params
            })
        );
        assert!(rig.sent().is_empty(), "the owner answers");
        rig.mcp.respond(&request, Ok(&json!({"action": "decline"})));
        assert_eq!(
            rig.sent(),
            [json!({"jsonrpc": "2.0", "id": 9, "result": {"action": "decline"}})]
        );
        assert_eq!(rig.mcp.generation(), 0);
        rig.mcp.close("gone".into(), &mut rig.timers);
        rig.mcp.respond(&request, Ok(&json!({"action": "decline"})));
        assert!(rig.sent().is_empty(), "nothing goes to a closed session");
        rig.mcp.reopen(&mut rig.timers);
        assert_eq!(rig.mcp.generation(), 1);
    }

    #[test]
    fn m6_a_ping_is_answered_and_another_server_request_gets_method_not_found() {
        let mut rig = Rig::new();
        for (id, method) in [(json!(5), "ping"), (json!("x"), "sampling/createMessage")] {
            let message = jsonrpc::Message::Request {
                id: serde_json::from_value(id).expect("an id"),
                method: method.into(),
                params: Value::Null,
            };
            assert_eq!(
                rig.mcp.on_message(message, &mut rig.out, &mut rig.timers),
                None
            );
        }
        let sent = rig.sent();
        assert_eq!(sent[0], json!({"jsonrpc": "2.0", "id": 5, "result": {}}));
        assert_eq!(sent[1]["id"], "x");
        assert_eq!(sent[1]["error"]["code"], -32601);
    }

    #[test]
    fn s5_a_server_request_with_an_id_over_1_kib_is_not_answered_and_cuts_the_server_off() {
        let mut rig = Rig::new();
        let at_cap = "i".repeat(MAX_SERVER_REQUEST_ID_BYTES - 2);
        let over = "i".repeat(MAX_SERVER_REQUEST_ID_BYTES - 1);
        let mut events = Vec::new();
        for id in [json!(at_cap), json!(over)] {
            let message = jsonrpc::Message::Request {
                id: serde_json::from_value(id).expect("an id"),
                method: "ping".into(),
                params: Value::Null,
            };
            events.push(rig.mcp.on_message(message, &mut rig.out, &mut rig.timers));
        }
        assert_eq!(events[0], None, "an id of exactly 1 KiB is answered");
        assert_eq!(
            events[1],
            Some(SessionEvent::CutOff {
                cause: "sent a request id of 1025 bytes (over 1 KiB); killed".into()
            })
        );
        let sent = rig.sent();
        assert_eq!(
            sent.len(),
            1,
            "only the id within the cap is answered: {sent:?}"
        );
        assert_eq!(sent[0]["id"], json!(at_cap));
    }

    #[test]
    fn m13_initialize_declares_roots_and_roots_list_answers_the_session_directories() {
        let mut rig = Rig::new();
        let roots = super::super::roots::roots_of("/w/my app", &["/lib".to_string()]);
        rig.mcp.set_roots(roots.clone());
        rig.mcp.open("1", &rig.out, &mut rig.timers);
        let init = rig.sent();
        assert_eq!(
            init[0]["params"]["capabilities"],
            json!({"roots": {"listChanged": false}})
        );
        let message = jsonrpc::Message::Request {
            id: serde_json::from_value(json!("r-1")).expect("an id"),
            method: "roots/list".into(),
            params: Value::Null,
        };
        assert_eq!(
            rig.mcp.on_message(message, &mut rig.out, &mut rig.timers),
            None
        );
        assert_eq!(
            rig.sent(),
            [json!({"jsonrpc": "2.0", "id": "r-1", "result": {"roots": [
                {"uri": "file:///w/my%20app", "name": "my app"},
                {"uri": "file:///lib", "name": "lib"}
            ]}})]
        );
        assert_eq!(
            roots,
            json!([
                {"uri": "file:///w/my%20app", "name": "my app"},
                {"uri": "file:///lib", "name": "lib"}
            ])
        );
    }

    #[test]
    fn c59_progress_text_is_the_message_then_the_count_in_whole_numbers_where_exact() {
        let text = |p: Value| progress_text(&p);
        assert_eq!(text(json!({"progress": 3.0, "total": 10})), "progress 3/10");
        assert_eq!(text(json!({"progress": 2.5})), "progress 2.5");
        assert_eq!(text(json!({"progress": -4.0})), "progress -4");
        assert_eq!(
            text(json!({"progress": 1e15})),
            "progress 1000000000000000.0",
            "as sent from 1e15 on"
        );
        assert_eq!(
            text(json!({"progress": 999_999_999_999_999.0_f64})),
            "progress 999999999999999"
        );
        assert_eq!(text(json!({"message": "copying"})), "copying");
        assert_eq!(text(json!({"message": "  ", "total": 3})), "in progress");
        assert_eq!(text(json!({"progress": "3"})), "in progress");
    }
}
