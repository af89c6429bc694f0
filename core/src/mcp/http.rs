//! The Streamable HTTP transport (MCP 2025-11-25 basic/transports; SPEC M10), and the legacy
//! HTTP+SSE transport of MCP 2024-11-05 for `"type": "sse"` entries. It carries the frames the
//! [`McpSession`](super::session::McpSession) queues and hands back the JSON-RPC messages it
//! reads; it knows HTTP, never the MCP lifecycle above it.
//!
//! **Streamable HTTP.** Every frame is a `POST` to the server's URL with `Accept:
//! application/json, text/event-stream`, the entry's headers, and once the server gave one,
//! `Mcp-Session-Id` and `MCP-Protocol-Version`. A request's answer is one JSON body or an event
//! stream carrying the response (and any server requests and notifications before it); a
//! notification's or a response's answer is `202 Accepted`. Each frame after
//! `notifications/initialized` waits until that `POST` is answered (the server has then taken
//! it: separate `POST`s can reach it in any order, and a server may refuse a request before
//! `initialized`; the legacy wire waits the same way); then the waiting frames go out in order
//! and the optional `GET` stream for server-initiated messages is opened; `405`, `404` or
//! `406` on it means there is none. A `404` on a request that carried the session id means the session
//! expired: the transport initializes a new session itself (once), then sends the request
//! again. An event stream that closes before its response is resumed with a `GET` carrying
//! `Last-Event-ID`, after the stream's `retry` (bounded attempts). `DELETE` ends the session.
//!
//! **Legacy HTTP+SSE.** A `GET` opens the event stream; its `endpoint` event names the URL (on
//! the same origin) every frame is then `POST`ed to; every answer arrives on the stream.
//!
//! **Failures.** A server that cannot be reached (no connection, TLS, not HTTP) is dead; an
//! HTTP error answer to a request fails that request (during the handshake the start); a `3xx`
//! is reported as a redirect that is not followed; a `401`/`403` goes to its
//! [`Authorization`].

use super::auth::{AuthVerdict, Authorization, Challenge};
use super::session::{Frame, FrameKind};
use crate::authorization::{AuthNeed, MAX_OAUTH_BODY_BYTES, ServerAuth};
use crate::config::LogLevel;
use crate::http::{Method, Request};
use crate::ids::{ExchangeId, McpRequestId, ServerSlot};
use crate::io::OAuthInput;
use crate::io::{Action, HttpEvent};
use crate::jsonrpc::{self, Message};
use crate::llm::Body;
use crate::oauth::flow::{Method as OAuthMethod, OAuthRequest, OAuthResponse};
use crate::outbox::Outbox;
use crate::sse::{SseEvent, SseParser};
use crate::time::MonoTime;
use crate::timers::{ServerTimer, Timer, TimerTable};
use serde_json::Value;
use std::collections::BTreeMap;

/// The largest JSON body (a response of one request) accepted, in bytes, the same bound as an
/// MCP stdout line (SPEC T6); a larger one fails its request.
pub(crate) const MAX_JSON_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Bytes of an error answer's body kept for its message.
const ERROR_BODY_BYTES: usize = 512;
/// Attempts to resume one event stream that closed before its response (SPEC M10).
const MAX_RESUME_ATTEMPTS: u32 = 3;
/// The wait before resuming a stream that gave no `retry`, in ms.
const DEFAULT_RETRY_MS: u64 = 1000;
/// The longest `retry` honoured, in ms (a server asking for more is waited on this long).
const MAX_RETRY_MS: u64 = 30_000;
/// Times the `GET` stream is opened again after it ended, without an event in between.
const MAX_LISTEN_REOPENS: u32 = 3;
/// How long, in ms, the frames after `notifications/initialized` wait for the `GET` stream's
/// head (SPEC M10): a server that sends its own requests on that stream, not on the answer
/// of the call they belong to, loses them while the stream is not open yet (the TypeScript
/// SDK drops a message for a stream that does not exist). A server that never answers the
/// `GET` costs its session this much once.
pub(crate) const LISTEN_SETTLE_MS: u64 = 2_000;
/// The JSON-RPC id prefix of the transport's own `initialize` after an expired session (never
/// a number, so it cannot be mistaken for a request of the session).
const REINIT_ID: &str = "buzz-reinit-";

/// Which wire the transport speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Streamable HTTP (2025-03-26 and later).
    Streamable,
    /// HTTP+SSE (2024-11-05): a `GET` stream and an `endpoint` to post to.
    Legacy,
}

/// What the transport learned from the server, for the table to act on, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delivery {
    /// A JSON-RPC message of the server, for the session.
    Message(Message),
    /// Request `id` will get no answer over this transport; the text says why.
    RequestFailed {
        /// The request.
        id: McpRequestId,
        /// E.g. `HTTP 500 (Internal Server Error)`.
        reason: String,
    },
    /// The server cannot be used any more (unreachable, its session lost for good); the
    /// cause completes `MCP server '<name>' …`.
    Dead(String),
    /// Its authorization failed while the session was being opened (SPEC M11): the server
    /// starts without tools; the text says why (`not authorized: …`).
    Unauthorized(String),
    /// The user must open this authorization URL to log in (SPEC M11): the agent asks the
    /// ACP client to show it; a decline goes to [`HttpTransport::login_declined`].
    Login(String),
    /// The login asked for by the last [`Delivery::Login`] is over (the redirect landed, or
    /// the authorization ended otherwise): the user need not open the URL any more.
    LoginDone,
}

/// What an exchange is for.
#[derive(Debug)]
enum Purpose {
    /// One frame `POST`ed; its text is kept to send it again (expired session, authorization).
    Post { frame: Frame },
    /// The transport's own `initialize` for a new session after a `404`; `answered` once its
    /// response came (the stream that carried it may then end, or be dropped unread).
    Reinitialize { frame: Frame, answered: bool },
    /// The `GET` stream for server-initiated messages (legacy: the stream of every answer).
    Listen,
    /// A `GET` resuming a stream that closed before its responses: attempt `attempt`.
    Resume { attempt: u32 },
    /// The `DELETE` that ends the session.
    Delete,
    /// A request of the server's OAuth authorization (SPEC M11), by the authorizer's number.
    Auth { request: u64 },
}

/// How an answer's body is read, decided by its head.
#[derive(Debug)]
enum Reader {
    /// No head yet.
    Head,
    /// A JSON body, collected to its end.
    Json(Vec<u8>),
    /// An event stream.
    Events(Box<SseParser>),
    /// An answer without a body worth reading (`202`, a `GET` that found no stream).
    Ignore,
    /// An error answer: its status, content type and the start of its body.
    Error {
        status: u16,
        content_type: String,
        head: Vec<u8>,
    },
    /// An OAuth answer, collected whole (at most one byte over [`MAX_OAUTH_BODY_BYTES`]).
    Collect(OAuthResponse),
}

/// One exchange in flight.
#[derive(Debug)]
struct Flight {
    purpose: Purpose,
    reader: Reader,
    /// The requests whose answers this exchange may carry and that are not answered yet.
    awaiting: Vec<McpRequestId>,
    /// The last `id:` and `retry:` of its event stream.
    last_event_id: Option<String>,
    retry_ms: Option<u64>,
    /// Events delivered (a `GET` stream that gave some may be opened again).
    events: u32,
    /// The `authorization` header the request carried (a challenge of an older one is
    /// answered by sending it again with the new one, SPEC M11).
    sent_auth: Option<String>,
}

/// A stream to resume, waiting for its `retry`.
#[derive(Debug)]
struct PendingResume {
    at: MonoTime,
    last_event_id: String,
    awaiting: Vec<McpRequestId>,
    attempt: u32,
}

/// Where the transport's own session stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Frames go out as they come.
    Open,
    /// The session expired: the transport's `initialize` is in flight; other frames wait.
    Reinitializing,
    /// Closed (the server died or was stopped); a `DELETE` may be in flight.
    Closed,
}

/// One HTTP server's transport (see the module docs).
#[derive(Debug)]
pub(crate) struct HttpTransport {
    slot: ServerSlot,
    /// The name the client gave (logs).
    name: String,
    wire: Wire,
    url: String,
    /// The entry's headers, without `authorization` (that is [`Authorization::header`]).
    headers: Vec<(String, String)>,
    auth: Authorization,
    phase: Phase,
    /// The next exchange number of this server; never reused, so an answer of a dropped
    /// exchange names nothing.
    next_seq: u64,
    /// How many new sessions the transport initialized itself (its `initialize` ids).
    reinits: u64,
    flights: BTreeMap<u64, Flight>,
    /// `Mcp-Session-Id` as the server gave it.
    session_id: Option<String>,
    /// The protocol version `initialize` settled on (`MCP-Protocol-Version`).
    version: Option<String>,
    /// The `initialize` frame, for a new session after a `404`.
    initialize: Option<Frame>,
    /// A new session was already initialized after a `404` and nothing succeeded since.
    reinitialized: bool,
    /// Frames waiting for a new session, for the legacy endpoint or for the authorization.
    held: Vec<Frame>,
    /// The transport's own `initialize` (after a `404`), held for the authorization.
    held_reinit: Option<Frame>,
    /// The `GET` stream waits for the authorization.
    listen_after_auth: bool,
    /// `notifications/initialized` was sent (or is held) and not answered yet: every later
    /// frame of the session waits in `held` (MCP 2025-11-25 basic/lifecycle: no request
    /// before the server has `initialized`).
    initialized_pending: bool,
    /// What the authorization decided while a frame was being sent, for the next delivery.
    undelivered: Vec<Delivery>,
    /// The legacy wire's `endpoint`.
    endpoint: Option<String>,
    /// The `GET` stream: its exchange, and how often it was reopened without an event.
    listen: Option<u64>,
    /// Until when the session's frames wait in `held` for the first `GET` stream's head, so
    /// that the stream is open before any request a server may answer with its own requests
    /// on it (see [`LISTEN_SETTLE_MS`]); `None` once it answered, failed or the time passed.
    listen_settle: Option<MonoTime>,
    listen_reopens: u32,
    listen_at: Option<MonoTime>,
    resumes: Vec<PendingResume>,
    /// The deadline of notification, response and `DELETE` exchanges, in ms.
    exchange_timeout_ms: u64,
}

/// The `content-type` of a head, lower-cased, without parameters.
fn media_type(headers: &[(String, String)]) -> String {
    header(headers, "content-type")
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The text of an HTTP status for messages: `HTTP 503 (Service Unavailable)`.
fn status_text(status: u16) -> String {
    let reason = match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    };
    if reason.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status} ({reason})")
    }
}

impl HttpTransport {
    /// The transport of the server in `slot` at `url` with the entry's `headers` (an
    /// `authorization` among them becomes the server's [`Authorization`]); notification
    /// exchanges time out after `exchange_timeout_ms`.
    pub(crate) fn new(
        slot: ServerSlot,
        name: &str,
        wire: Wire,
        url: &str,
        headers: &[(String, String)],
        exchange_timeout_ms: u64,
        oauth: Option<ServerAuth>,
    ) -> HttpTransport {
        let configured = headers
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| v.clone());
        let headers = headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
            .cloned()
            .collect();
        HttpTransport {
            slot,
            name: name.to_string(),
            wire,
            url: url.to_string(),
            headers,
            auth: Authorization::new(configured, oauth),
            phase: Phase::Open,
            next_seq: 0,
            reinits: 0,
            flights: BTreeMap::new(),
            session_id: None,
            version: None,
            initialize: None,
            reinitialized: false,
            held: Vec::new(),
            held_reinit: None,
            listen_after_auth: false,
            initialized_pending: false,
            undelivered: Vec::new(),
            endpoint: None,
            listen: None,
            listen_settle: None,
            listen_reopens: 0,
            listen_at: None,
            resumes: Vec::new(),
            exchange_timeout_ms,
        }
    }

    /// The server's URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Whether an exchange is in flight (a `DELETE` at shutdown, SPEC M8, is waited for).
    pub(crate) fn busy(&self) -> bool {
        !self.flights.is_empty()
    }

    /// Whether exchange `seq` is one of this transport's in flight.
    pub(crate) fn owns(&self, seq: u64) -> bool {
        self.flights.contains_key(&seq)
    }

    /// Opens the transport for a new session (the first, or an M9 restart): no session id,
    /// nothing in flight. The legacy wire opens its event stream now.
    pub(crate) fn open(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        self.cancel_all(out, timers);
        self.phase = Phase::Open;
        self.session_id = None;
        self.version = None;
        self.initialize = None;
        self.reinitialized = false;
        self.held.clear();
        self.held_reinit = None;
        self.listen_after_auth = false;
        self.initialized_pending = false;
        self.listen_settle = None;
        self.endpoint = None;
        self.listen_reopens = 0;
        if self.wire == Wire::Legacy {
            self.start_listen(out);
        }
    }

    /// Sends one frame of the session (`version`: the protocol version `initialize` settled
    /// on, once known).
    pub(crate) fn send(
        &mut self,
        frame: Frame,
        version: Option<&str>,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        if self.phase == Phase::Closed {
            return;
        }
        if version.is_some() {
            self.version = version.map(str::to_string);
        }
        if let FrameKind::Initialize(_) = frame.kind {
            self.initialize = Some(frame.clone());
        }
        let handshake = matches!(
            frame.kind,
            FrameKind::Initialize(_) | FrameKind::Initialized
        );
        let held = match self.wire {
            Wire::Streamable => {
                self.phase == Phase::Reinitializing
                    && !matches!(frame.kind, FrameKind::Initialize(_))
            }
            Wire::Legacy => self.endpoint.is_none(),
        } || ((self.initialized_pending || self.listen_settle.is_some()) && !handshake);
        if matches!(frame.kind, FrameKind::Initialized) {
            self.initialized_pending = true;
        }
        if held {
            self.held.push(frame);
            return;
        }
        if !self.auth.before_request(out) {
            // The token file loads, a flow runs or an expired token is refreshed (SPEC M11).
            self.held.push(frame);
            let needs = self.auth.drain(out, timers);
            let mut got = Vec::new();
            self.carry_out(needs, out, timers, &mut got);
            self.undelivered.extend(got);
            return;
        }
        self.post(Purpose::Post { frame }, out, timers);
    }

    /// Once `notifications/initialized` is neither held nor waiting for its answer (answered,
    /// failed, timed out, refused), the Streamable `GET` stream is opened and the frames that
    /// waited go out in order once its head came (or it failed, or [`LISTEN_SETTLE_MS`]
    /// passed); the legacy stream is open from the start.
    fn after_initialized(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        if !self.initialized_pending {
            return;
        }
        let is_initialized = |f: &Frame| matches!(f.kind, FrameKind::Initialized);
        let waiting = self.held.iter().any(is_initialized)
            || self.flights.values().any(|f| {
                matches!(f.reader, Reader::Head)
                    && matches!(&f.purpose, Purpose::Post { frame } if is_initialized(frame))
            });
        if waiting {
            return;
        }
        self.initialized_pending = false;
        if self.phase != Phase::Open {
            return;
        }
        if self.wire == Wire::Streamable && self.listen.is_none() && !self.listen_after_auth {
            self.listen_reopens = 0;
            self.start_listen(out);
            self.listen_settle = Some(out.now().plus_ms(LISTEN_SETTLE_MS));
            self.arm_retry(timers);
        }
        self.release_held(out, timers);
    }

    /// The first `GET` stream answered, failed or was waited for long enough: the frames held
    /// for it go out in order.
    fn listen_settled(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        if self.listen_settle.take().is_none() {
            return;
        }
        self.arm_retry(timers);
        self.release_held(out, timers);
    }

    /// Sends the held frames again, in order; those still to wait are held again.
    fn release_held(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        if self.phase != Phase::Open {
            return;
        }
        for frame in std::mem::take(&mut self.held) {
            self.send(frame, None, out, timers);
        }
    }

    /// The request headers of every exchange: the entry's, the credential, and the session's.
    fn request_headers(&self, accept: &str) -> Vec<(String, String)> {
        let mut headers = vec![("accept".to_string(), accept.to_string())];
        headers.extend(self.headers.iter().cloned());
        if let Some(a) = self.auth.header() {
            headers.push(("authorization".into(), a.to_string()));
        }
        if self.wire == Wire::Streamable {
            if let Some(id) = &self.session_id {
                headers.push(("mcp-session-id".into(), id.clone()));
            }
            if let Some(v) = &self.version {
                headers.push(("mcp-protocol-version".into(), v.clone()));
            }
        }
        headers
    }

    fn next_exchange(&mut self) -> ExchangeId {
        self.next_seq += 1;
        ExchangeId {
            server: self.slot,
            seq: self.next_seq,
        }
    }

    /// `POST`s a frame (its own initialize: `Reinitialize`).
    fn post(&mut self, purpose: Purpose, out: &mut Outbox, timers: &mut TimerTable) {
        let (frame, awaiting) = match &purpose {
            Purpose::Post { frame } | Purpose::Reinitialize { frame, .. } => {
                let awaiting = match frame.kind {
                    // Legacy: every answer comes on the event stream, never in the POST's.
                    FrameKind::Initialize(_) | FrameKind::Request(_)
                        if self.wire == Wire::Legacy =>
                    {
                        Vec::new()
                    }
                    FrameKind::Initialize(id) | FrameKind::Request(id) => vec![id],
                    FrameKind::Initialized | FrameKind::Notification | FrameKind::Response => {
                        Vec::new()
                    }
                };
                (frame, awaiting)
            }
            Purpose::Listen | Purpose::Resume { .. } | Purpose::Delete | Purpose::Auth { .. } => {
                return;
            }
        };
        let url = match (self.wire, &self.endpoint) {
            (Wire::Legacy, Some(e)) => e.clone(),
            (Wire::Legacy, None) | (Wire::Streamable, _) => self.url.clone(),
        };
        let mut headers = self.request_headers("application/json, text/event-stream");
        headers.insert(0, ("content-type".into(), "application/json".into()));
        let mut body = Body::default();
        body.push(frame.text.trim_end().as_bytes().to_vec());
        let exchange = self.next_exchange();
        let timed = awaiting.is_empty();
        self.flights.insert(
            exchange.seq,
            Flight {
                purpose,
                reader: Reader::Head,
                awaiting,
                last_event_id: None,
                retry_ms: None,
                events: 0,
                sent_auth: self.auth.header(),
            },
        );
        if timed {
            // A request's deadline is the session's; any other exchange gets its own.
            timers.set(
                Timer::Server(self.slot, ServerTimer::Exchange(exchange.seq)),
                out.now().plus_ms(self.exchange_timeout_ms),
            );
        }
        out.push(Action::Http {
            exchange,
            request: Request {
                method: Method::Post,
                url,
                headers,
                body,
            },
        });
    }

    /// `POST`s the transport's own `initialize` for a new session.
    fn post_reinitialize(&mut self, frame: Frame, out: &mut Outbox, timers: &mut TimerTable) {
        let purpose = Purpose::Reinitialize {
            frame,
            answered: false,
        };
        self.post(purpose, out, timers);
    }

    /// Opens the `GET` stream (Streamable: server-initiated messages; legacy: every answer).
    fn start_listen(&mut self, out: &mut Outbox) {
        let exchange = self.next_exchange();
        self.flights.insert(
            exchange.seq,
            Flight {
                purpose: Purpose::Listen,
                reader: Reader::Head,
                awaiting: Vec::new(),
                last_event_id: None,
                retry_ms: None,
                events: 0,
                sent_auth: self.auth.header(),
            },
        );
        self.listen = Some(exchange.seq);
        out.push(Action::Http {
            exchange,
            request: Request {
                method: Method::Get,
                url: self.url.clone(),
                headers: self.request_headers("text/event-stream"),
                body: Body::default(),
            },
        });
    }

    /// A `GET` with `Last-Event-ID` for the requests `awaiting` (SPEC M10 resumption).
    fn start_resume(
        &mut self,
        last_event_id: &str,
        awaiting: Vec<McpRequestId>,
        attempt: u32,
        out: &mut Outbox,
    ) {
        let exchange = self.next_exchange();
        self.flights.insert(
            exchange.seq,
            Flight {
                purpose: Purpose::Resume { attempt },
                reader: Reader::Head,
                awaiting,
                last_event_id: Some(last_event_id.to_string()),
                retry_ms: None,
                events: 0,
                sent_auth: self.auth.header(),
            },
        );
        let mut headers = self.request_headers("text/event-stream");
        headers.push(("last-event-id".into(), last_event_id.to_string()));
        out.push(Action::Http {
            exchange,
            request: Request {
                method: Method::Get,
                url: self.url.clone(),
                headers,
                body: Body::default(),
            },
        });
    }

    /// Drops every exchange in flight and every waiting resumption.
    fn cancel_all(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        for seq in std::mem::take(&mut self.flights).into_keys() {
            self.drop_exchange(seq, out, timers);
        }
        self.listen = None;
        self.listen_at = None;
        self.resumes.clear();
        timers.clear(Timer::Server(self.slot, ServerTimer::HttpRetry));
    }

    /// Tells the runtime to drop exchange `seq` and clears its deadline.
    fn drop_exchange(&self, seq: u64, out: &mut Outbox, timers: &mut TimerTable) {
        timers.clear(Timer::Server(self.slot, ServerTimer::Exchange(seq)));
        out.push(Action::CancelHttp {
            exchange: ExchangeId {
                server: self.slot,
                seq,
            },
        });
    }

    /// The session ended (shutdown, a kill, a death): every exchange is dropped and, when the
    /// server gave a session id, a `DELETE` ends it (SPEC M10, M8).
    pub(crate) fn close(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        if self.phase == Phase::Closed {
            return;
        }
        self.cancel_all(out, timers);
        self.phase = Phase::Closed;
        self.held.clear();
        self.held_reinit = None;
        self.listen_after_auth = false;
        self.initialized_pending = false;
        self.listen_settle = None;
        if let Some(a) = self.auth.oauth() {
            a.close(out, timers);
        }
        let Some(session_id) = self.session_id.take() else {
            return;
        };
        if self.wire == Wire::Legacy {
            return;
        }
        let exchange = self.next_exchange();
        self.flights.insert(
            exchange.seq,
            Flight {
                purpose: Purpose::Delete,
                reader: Reader::Head,
                awaiting: Vec::new(),
                last_event_id: None,
                retry_ms: None,
                events: 0,
                sent_auth: self.auth.header(),
            },
        );
        timers.set(
            Timer::Server(self.slot, ServerTimer::Exchange(exchange.seq)),
            out.now().plus_ms(self.exchange_timeout_ms.min(2_000)),
        );
        let mut headers = self.request_headers("application/json, text/event-stream");
        headers.push(("mcp-session-id".into(), session_id));
        out.push(Action::Http {
            exchange,
            request: Request {
                method: Method::Delete,
                url: self.url.clone(),
                headers,
                body: Body::default(),
            },
        });
    }

    /// Request `id` is no longer awaited (answered elsewhere, timed out, cancelled): an
    /// exchange that carried only it is dropped.
    pub(crate) fn forget(&mut self, id: McpRequestId, out: &mut Outbox, timers: &mut TimerTable) {
        let mut done = Vec::new();
        for (seq, f) in &mut self.flights {
            if let Some(at) = f.awaiting.iter().position(|a| *a == id) {
                f.awaiting.remove(at);
                if f.awaiting.is_empty() && !matches!(f.purpose, Purpose::Listen) {
                    done.push(*seq);
                }
            }
        }
        for seq in done {
            self.flights.remove(&seq);
            self.drop_exchange(seq, out, timers);
        }
        for r in &mut self.resumes {
            r.awaiting.retain(|a| *a != id);
        }
        self.resumes.retain(|r| !r.awaiting.is_empty());
    }

    /// The deadline of a notification, response or `DELETE` exchange passed: it is dropped.
    pub(crate) fn exchange_timed_out(
        &mut self,
        seq: u64,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<Delivery> {
        let Some(f) = self.flights.remove(&seq) else {
            return Vec::new();
        };
        out.push(Action::CancelHttp {
            exchange: ExchangeId {
                server: self.slot,
                seq,
            },
        });
        match f.purpose {
            Purpose::Reinitialize { .. } => vec![Delivery::Dead(
                "failed to start a new session: its initialize was not answered".into(),
            )],
            Purpose::Auth { request } => {
                let mut got = Vec::new();
                self.auth_answer(
                    request,
                    Err("no answer in time".into()),
                    out,
                    timers,
                    &mut got,
                );
                got
            }
            Purpose::Post { .. } | Purpose::Listen | Purpose::Resume { .. } | Purpose::Delete => {
                out.log(
                    LogLevel::Debug,
                    format!("mcp '{}': an exchange got no answer; dropped", self.url),
                );
                self.after_initialized(out, timers);
                Vec::new()
            }
        }
    }

    /// The `retry` of a closed stream passed: resume what is due, reopen the `GET` stream.
    pub(crate) fn retry_due(&mut self, out: &mut Outbox, timers: &mut TimerTable) {
        if self.phase == Phase::Closed {
            return;
        }
        let now = out.now();
        let (due, later): (Vec<PendingResume>, Vec<PendingResume>) =
            std::mem::take(&mut self.resumes)
                .into_iter()
                .partition(|r| r.at <= now);
        self.resumes = later;
        for r in due {
            self.start_resume(&r.last_event_id, r.awaiting, r.attempt, out);
        }
        if self.listen_at.is_some_and(|t| t <= now) {
            self.listen_at = None;
            if self.listen.is_none() {
                self.start_listen(out);
            }
        }
        if self.listen_settle.is_some_and(|t| t <= now) {
            out.log(
                LogLevel::Debug,
                format!(
                    "mcp '{}': its event stream gave no answer in {LISTEN_SETTLE_MS} ms; requests go out without it",
                    self.name
                ),
            );
            self.listen_settled(out, timers);
        }
        self.arm_retry(timers);
    }

    /// Sets the retry timer to the earliest waiting resumption, reopening or end of the wait
    /// for the first `GET` stream.
    fn arm_retry(&self, timers: &mut TimerTable) {
        let next = self
            .resumes
            .iter()
            .map(|r| r.at)
            .chain(self.listen_at)
            .chain(self.listen_settle)
            .min();
        let key = Timer::Server(self.slot, ServerTimer::HttpRetry);
        match next {
            Some(at) => timers.set(key, at),
            None => {
                timers.clear(key);
            }
        }
    }

    /// What the runtime observed of exchange `seq`: the messages the server sent, failed
    /// requests, or the server's death. An event of an exchange no longer in flight is inert.
    pub(crate) fn on_event(
        &mut self,
        seq: u64,
        event: HttpEvent,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<Delivery> {
        let mut got = std::mem::take(&mut self.undelivered);
        let Some(mut f) = self.flights.remove(&seq) else {
            return got;
        };
        if self.listen == Some(seq) {
            self.listen = None;
        }
        // Any event of the `GET` stream (its head, or its failure) ends the wait for it.
        let settles = matches!(f.purpose, Purpose::Listen) && self.listen_settle.is_some();
        let keep = match event {
            HttpEvent::Head { status, headers } => {
                self.on_head(&mut f, status, &headers, out, timers, &mut got)
            }
            HttpEvent::Body(bytes) => self.on_body(&mut f, &bytes, out, timers, &mut got),
            // Done either way: the runtime lets go of it (and its deadline is cleared).
            HttpEvent::End => {
                self.drop_exchange(seq, out, timers);
                self.on_end(f, out, timers, &mut got);
                self.after_event(settles, out, timers);
                return got;
            }
            HttpEvent::Failed(reason) => {
                self.drop_exchange(seq, out, timers);
                self.on_failed(f, &reason, out, timers, &mut got);
                self.after_event(settles, out, timers);
                return got;
            }
        };
        if keep && self.phase != Phase::Closed {
            if matches!(f.purpose, Purpose::Listen) {
                self.listen = Some(seq);
            }
            self.flights.insert(seq, f);
        } else {
            self.drop_exchange(seq, out, timers);
        }
        self.after_event(settles, out, timers);
        got
    }

    /// After an exchange's event: the frames that waited for `initialized` or for the first
    /// `GET` stream (`settles`: this event was that stream's) may go out.
    fn after_event(&mut self, settles: bool, out: &mut Outbox, timers: &mut TimerTable) {
        if settles {
            self.listen_settled(out, timers);
        }
        self.after_initialized(out, timers);
    }

    /// An answer's head: how its body is read (or the request fails now). `false`: drop it.
    fn on_head(
        &mut self,
        f: &mut Flight,
        status: u16,
        headers: &[(String, String)],
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) -> bool {
        if let Purpose::Auth { .. } = f.purpose {
            f.reader = Reader::Collect(OAuthResponse {
                status,
                headers: headers.to_vec(),
                body: Vec::new(),
            });
            return true;
        }
        let media = media_type(headers);
        let ok = (200..300).contains(&status);
        if status != 401 && status != 403 {
            self.auth.on_accepted();
        }
        let is_initialize = match &f.purpose {
            Purpose::Post { frame } => matches!(frame.kind, FrameKind::Initialize(_)),
            Purpose::Reinitialize { .. } => true,
            Purpose::Listen | Purpose::Resume { .. } | Purpose::Delete | Purpose::Auth { .. } => {
                false
            }
        };
        if is_initialize
            && ok
            && self.wire == Wire::Streamable
            && let Some(id) = header(headers, "mcp-session-id")
        {
            self.session_id = Some(id.to_string());
        }
        let events = media == "text/event-stream";
        if (status == 401 || status == 403)
            && matches!(f.purpose, Purpose::Listen | Purpose::Resume { .. })
            && self.challenge(f, status, headers, out, timers, got)
        {
            return false;
        }
        match &f.purpose {
            Purpose::Auth { .. } => return true,
            Purpose::Delete => {
                f.reader = Reader::Ignore;
                return false;
            }
            Purpose::Listen => {
                if ok && events {
                    f.reader = Reader::Events(Box::default());
                    return true;
                }
                if self.wire == Wire::Legacy {
                    got.push(Delivery::Dead(format!(
                        "failed to start: its event stream answered {}",
                        status_text(status)
                    )));
                    return false;
                }
                // 405, 404 and 406 mean "no stream" (SPEC M10); anything else is said.
                let level = if matches!(status, 404..=406) {
                    LogLevel::Debug
                } else {
                    LogLevel::Warn
                };
                out.log(
                    level,
                    format!(
                        "mcp '{}': no stream of server messages ({}{})",
                        self.name,
                        status_text(status),
                        if ok {
                            format!(", {media}")
                        } else {
                            String::new()
                        }
                    ),
                );
                self.listen_reopens = MAX_LISTEN_REOPENS;
                return false;
            }
            Purpose::Resume { .. } => {
                if ok && events {
                    f.reader = Reader::Events(Box::default());
                    return true;
                }
                f.reader = Reader::Error {
                    status,
                    content_type: media,
                    head: Vec::new(),
                };
                return true;
            }
            Purpose::Post { .. } | Purpose::Reinitialize { .. } => {}
        }
        if ok {
            if events {
                f.reader = Reader::Events(Box::default());
                return true;
            }
            // A `202`/`204` has no body to read, whatever its content type says (FastMCP
            // answers a notification `202` with `application/json` and no body).
            if media == "application/json" && !matches!(status, 202 | 204) {
                f.reader = Reader::Json(Vec::new());
                return true;
            }
            if f.awaiting.is_empty() || status == 202 || status == 204 {
                f.reader = Reader::Ignore;
                if !f.awaiting.is_empty() {
                    for id in std::mem::take(&mut f.awaiting) {
                        got.push(Delivery::RequestFailed {
                            id,
                            reason: format!(
                                "accepted the request without answering it ({})",
                                status_text(status)
                            ),
                        });
                    }
                    return false;
                }
                return true;
            }
            let shown = if media.is_empty() {
                "no content type".to_string()
            } else {
                format!("content type {media}")
            };
            for id in std::mem::take(&mut f.awaiting) {
                got.push(Delivery::RequestFailed {
                    id,
                    reason: format!(
                        "answered {} with {shown}, not JSON or an event stream",
                        status_text(status)
                    ),
                });
            }
            return false;
        }
        // A 404 to a request that carried the session id: the session expired (SPEC M10).
        if status == 404
            && self.wire == Wire::Streamable
            && self.session_id.is_some()
            && !is_initialize
        {
            if let Purpose::Post { frame } = std::mem::replace(&mut f.purpose, Purpose::Delete) {
                self.session_expired(frame, out, timers, got);
            }
            return false;
        }
        if (status == 401 || status == 403) && self.challenge(f, status, headers, out, timers, got)
        {
            return false;
        }
        if (300..400).contains(&status) {
            // S2: where it pointed, with any credentials in that URL redacted.
            let to = header(headers, "location")
                .map_or(std::borrow::Cow::Borrowed("nowhere"), |l| {
                    crate::text::redact_url(l.trim())
                });
            let reason = format!(
                "redirected ({}) to {to}; redirects are not followed",
                status_text(status)
            );
            for id in std::mem::take(&mut f.awaiting) {
                got.push(Delivery::RequestFailed {
                    id,
                    reason: reason.clone(),
                });
            }
            self.fail_unawaited(f, &reason, out, got);
            return false;
        }
        f.reader = Reader::Error {
            status,
            content_type: media,
            head: Vec::new(),
        };
        true
    }

    /// A `401`/`403` answer goes to the [`Authorization`] (SPEC M11): the request is sent
    /// again, held for the flow, or failed. `false`: not an authorization matter (an
    /// ordinary error answer).
    fn challenge(
        &mut self,
        f: &mut Flight,
        status: u16,
        headers: &[(String, String)],
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) -> bool {
        let challenge = Challenge {
            status,
            www_authenticate: headers
                .iter()
                .filter(|(k, _)| k == "www-authenticate")
                .map(|(_, v)| v.clone())
                .collect(),
        };
        let verdict = self
            .auth
            .on_challenge(&challenge, f.sent_auth.as_deref(), out);
        let purpose = std::mem::replace(&mut f.purpose, Purpose::Delete);
        match verdict {
            AuthVerdict::NotOurs => {
                f.purpose = purpose;
                return false;
            }
            AuthVerdict::Retry => match purpose {
                Purpose::Post { .. } | Purpose::Reinitialize { .. } => {
                    self.post(purpose, out, timers);
                }
                Purpose::Resume { .. } | Purpose::Listen => self.start_listen(out),
                Purpose::Delete | Purpose::Auth { .. } => {}
            },
            AuthVerdict::Wait => match purpose {
                Purpose::Post { frame } => self.held.push(frame),
                Purpose::Reinitialize { frame, .. } => self.held_reinit = Some(frame),
                Purpose::Listen | Purpose::Resume { .. } => self.listen_after_auth = true,
                Purpose::Delete | Purpose::Auth { .. } => {}
            },
            AuthVerdict::Refused(reason) => {
                let handshake = match &purpose {
                    Purpose::Post { frame } => matches!(frame.kind, FrameKind::Initialize(_)),
                    Purpose::Reinitialize { .. } => true,
                    Purpose::Listen
                    | Purpose::Resume { .. }
                    | Purpose::Delete
                    | Purpose::Auth { .. } => false,
                };
                if self.auth.oauth().is_some() && handshake {
                    got.push(Delivery::Unauthorized(reason.clone()));
                }
                for id in std::mem::take(&mut f.awaiting) {
                    got.push(Delivery::RequestFailed {
                        id,
                        reason: reason.clone(),
                    });
                }
                match purpose {
                    Purpose::Reinitialize { .. } => got.push(Delivery::Dead(format!(
                        "could not start a new session: {reason}"
                    ))),
                    Purpose::Listen | Purpose::Resume { .. } => out.log(
                        LogLevel::Warn,
                        format!(
                            "mcp '{}': no stream of server messages: {reason}",
                            self.name
                        ),
                    ),
                    Purpose::Post { .. } | Purpose::Delete | Purpose::Auth { .. } => {}
                }
            }
        }
        f.awaiting.clear();
        let needs = self.auth.drain(out, timers);
        self.carry_out(needs, out, timers, got);
        true
    }

    /// Carries out what the authorization needs (SPEC M11): its HTTP requests go out as
    /// exchanges of this server, the URL the user must open is logged and delivered (the
    /// agent shows it through the ACP client), and the held frames go out or fail.
    fn carry_out(
        &mut self,
        needs: Vec<AuthNeed>,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        for need in needs {
            match need {
                AuthNeed::Http { request, http } => {
                    self.start_auth_request(request, http, out, timers);
                }
                AuthNeed::Browse { url } => {
                    out.log(
                        LogLevel::Warn,
                        format!(
                            "MCP server '{}' needs authorization: open {url} to log in",
                            self.name
                        ),
                    );
                    got.push(Delivery::Login(url));
                }
                AuthNeed::BrowseDone => got.push(Delivery::LoginDone),
                AuthNeed::Proceed => {
                    if self.phase == Phase::Closed {
                        continue;
                    }
                    if let Some(frame) = self.held_reinit.take() {
                        self.post_reinitialize(frame, out, timers);
                    }
                    for frame in std::mem::take(&mut self.held) {
                        self.send(frame, None, out, timers);
                    }
                    if std::mem::take(&mut self.listen_after_auth) && self.listen.is_none() {
                        self.start_listen(out);
                    }
                    got.append(&mut self.undelivered);
                }
                AuthNeed::Failed(reason) => {
                    let reason = format!("not authorized: {reason}");
                    let handshake = self.held_reinit.is_some()
                        || self
                            .held
                            .iter()
                            .any(|f| matches!(f.kind, FrameKind::Initialize(_)));
                    if handshake {
                        got.push(Delivery::Unauthorized(reason.clone()));
                    }
                    if self.held_reinit.take().is_some() {
                        got.push(Delivery::Dead(format!(
                            "could not start a new session: {reason}"
                        )));
                    }
                    for frame in std::mem::take(&mut self.held) {
                        if let FrameKind::Initialize(id) | FrameKind::Request(id) = frame.kind {
                            got.push(Delivery::RequestFailed {
                                id,
                                reason: reason.clone(),
                            });
                        }
                    }
                    self.listen_after_auth = false;
                    // `initialized` failed with the frames that waited for it.
                    self.initialized_pending = false;
                    out.log(
                        LogLevel::Warn,
                        format!("MCP server '{}' is {reason}", self.name),
                    );
                }
            }
        }
        self.extend_held_deadlines(timers);
    }

    /// A request held for the authorization keeps its deadline, or the authorization's plus
    /// one exchange timeout if that is later (a user logging in may take minutes).
    fn extend_held_deadlines(&mut self, timers: &mut TimerTable) {
        let Some(until) = self
            .auth
            .oauth()
            .and_then(|a| a.authorizer().poll_timeout())
        else {
            return;
        };
        let until = until.plus_ms(self.exchange_timeout_ms);
        for frame in &self.held {
            if let FrameKind::Initialize(id) | FrameKind::Request(id) = frame.kind {
                let key = Timer::Server(self.slot, ServerTimer::Request(id));
                if timers.get(key).is_some_and(|at| at < until) {
                    timers.set(key, until);
                }
            }
        }
    }

    /// Sends one request of the authorization as an exchange of this server, with its own
    /// deadline (the runtime follows no redirect).
    fn start_auth_request(
        &mut self,
        request: u64,
        http: OAuthRequest,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) {
        let exchange = self.next_exchange();
        self.flights.insert(
            exchange.seq,
            Flight {
                purpose: Purpose::Auth { request },
                reader: Reader::Head,
                awaiting: Vec::new(),
                last_event_id: None,
                retry_ms: None,
                events: 0,
                sent_auth: None,
            },
        );
        timers.set(
            Timer::Server(self.slot, ServerTimer::Exchange(exchange.seq)),
            out.now().plus_ms(self.exchange_timeout_ms),
        );
        let mut body = Body::default();
        if !http.body.is_empty() {
            body.push(http.body);
        }
        out.push(Action::Http {
            exchange,
            request: Request {
                method: match http.method {
                    OAuthMethod::Get => Method::Get,
                    OAuthMethod::Post => Method::Post,
                },
                url: http.url.as_sent().to_string(),
                headers: http.headers,
                body,
            },
        });
    }

    /// The answer to an authorization request (`Err`: none, with the reason).
    fn auth_answer(
        &mut self,
        request: u64,
        answer: Result<OAuthResponse, String>,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        let Some(a) = self.auth.oauth() else {
            return;
        };
        let needs = a.on_http(request, answer, out, timers);
        self.carry_out(needs, out, timers, got);
    }

    /// What the runtime reports for the authorization (listener, token file, browser).
    pub(crate) fn on_oauth(
        &mut self,
        input: OAuthInput,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<Delivery> {
        self.auth_step(out, timers, |a, out, timers| a.on_input(input, out, timers))
    }

    /// The user declined (or the ACP client cancelled) the login of the last
    /// [`Delivery::Login`] (SPEC M11): the authorization fails, and what waited for it with
    /// it (a held handshake: [`Delivery::Unauthorized`]).
    pub(crate) fn login_declined(
        &mut self,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<Delivery> {
        self.auth_step(out, timers, ServerAuth::declined)
    }

    /// The deadline of the authorization's step in progress passed.
    pub(crate) fn authorization_due(
        &mut self,
        out: &mut Outbox,
        timers: &mut TimerTable,
    ) -> Vec<Delivery> {
        self.auth_step(out, timers, ServerAuth::on_timeout)
    }

    /// One step of the OAuth authorization from outside the server's exchanges (`step`);
    /// what it needs is carried out. Nothing without an OAuth authorization.
    fn auth_step(
        &mut self,
        out: &mut Outbox,
        timers: &mut TimerTable,
        step: impl FnOnce(&mut ServerAuth, &mut Outbox, &mut TimerTable) -> Vec<AuthNeed>,
    ) -> Vec<Delivery> {
        let mut got = std::mem::take(&mut self.undelivered);
        if let Some(a) = self.auth.oauth() {
            let needs = step(a, out, timers);
            self.carry_out(needs, out, timers, &mut got);
        }
        got
    }

    /// A failed exchange that awaited no request (a notification, a response, our own
    /// initialize): logged, and for our own initialize the server is dead.
    fn fail_unawaited(&self, f: &Flight, reason: &str, out: &mut Outbox, got: &mut Vec<Delivery>) {
        match &f.purpose {
            Purpose::Reinitialize { .. } => got.push(Delivery::Dead(format!(
                "could not start a new session: {reason}"
            ))),
            Purpose::Post { frame } if f.awaiting.is_empty() => {
                let what = match frame.kind {
                    FrameKind::Response => "an answer to the server's request",
                    FrameKind::Initialized
                    | FrameKind::Notification
                    | FrameKind::Initialize(_)
                    | FrameKind::Request(_) => "a notification",
                };
                out.log(
                    LogLevel::Warn,
                    format!("mcp '{}': {what} was not accepted: {reason}", self.name),
                );
            }
            Purpose::Post { .. }
            | Purpose::Listen
            | Purpose::Resume { .. }
            | Purpose::Delete
            | Purpose::Auth { .. } => {}
        }
    }

    /// A `404` on a request with the session id: a new session is initialized (once), and the
    /// request waits for it; a second expiry in a row is the server's death.
    fn session_expired(
        &mut self,
        frame: Frame,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        if self.phase == Phase::Reinitializing {
            self.held.push(frame);
            return;
        }
        if self.reinitialized {
            got.push(Delivery::Dead(
                "lost its session again right after a new one was initialized (HTTP 404)".into(),
            ));
            return;
        }
        let Some(init) = self.initialize.clone() else {
            got.push(Delivery::Dead("lost its session (HTTP 404)".into()));
            return;
        };
        out.log(
            LogLevel::Info,
            format!(
                "mcp '{}': the server lost the session (HTTP 404); initializing a new one",
                self.name
            ),
        );
        self.held.push(frame);
        self.phase = Phase::Reinitializing;
        self.session_id = None;
        self.reinits += 1;
        let mut message: Value = serde_json::from_str(init.text.trim_end()).unwrap_or_default();
        if let Some(obj) = message.as_object_mut() {
            obj.insert(
                "id".into(),
                Value::String(format!("{REINIT_ID}{}", self.reinits)),
            );
        }
        let frame = Frame {
            text: format!("{message}\n"),
            kind: FrameKind::Notification,
        };
        if let Some(seq) = self.listen.take() {
            self.flights.remove(&seq);
            self.drop_exchange(seq, out, timers);
        }
        self.post_reinitialize(frame, out, timers);
        // Its answer is awaited like a request's: the exchange deadline covers it.
    }

    /// The transport's own `initialize` was answered: on success the session is open again,
    /// `notifications/initialized` goes out, then the requests that waited, in order.
    fn reinitialized(
        &mut self,
        outcome: Result<Value, jsonrpc::RpcError>,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        let result = match outcome {
            Ok(v) => v,
            Err(e) => {
                got.push(Delivery::Dead(format!(
                    "could not start a new session: initialize was rejected: {} {}",
                    e.code, e.message
                )));
                return;
            }
        };
        if let Some(v) = result.get("protocolVersion").and_then(Value::as_str) {
            self.version = Some(v.to_string());
        }
        self.phase = Phase::Open;
        self.reinitialized = true;
        let initialized = Frame {
            text: jsonrpc::encode_notification("notifications/initialized", &serde_json::json!({})),
            kind: FrameKind::Initialized,
        };
        self.send(initialized, None, out, timers);
        for frame in std::mem::take(&mut self.held) {
            self.send(frame, None, out, timers);
        }
    }

    /// Body bytes of an answer. `false`: drop the exchange.
    fn on_body(
        &mut self,
        f: &mut Flight,
        bytes: &[u8],
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) -> bool {
        match &mut f.reader {
            Reader::Head | Reader::Ignore => true,
            Reader::Collect(answer) => {
                let room = (MAX_OAUTH_BODY_BYTES + 1).saturating_sub(answer.body.len());
                answer
                    .body
                    .extend_from_slice(bytes.get(..room.min(bytes.len())).unwrap_or(&[]));
                if answer.body.len() > MAX_OAUTH_BODY_BYTES {
                    // Over the cap: the authorization fails it, no need to read on.
                    let Purpose::Auth { request } = f.purpose else {
                        return false;
                    };
                    let answer = std::mem::replace(&mut f.reader, Reader::Ignore);
                    if let Reader::Collect(answer) = answer {
                        self.auth_answer(request, Ok(answer), out, timers, got);
                    }
                    return false;
                }
                true
            }
            Reader::Json(buf) => {
                if buf.len() + bytes.len() > MAX_JSON_BODY_BYTES {
                    for id in std::mem::take(&mut f.awaiting) {
                        got.push(Delivery::RequestFailed {
                            id,
                            reason: format!(
                                "answered with a body over {} MiB",
                                MAX_JSON_BODY_BYTES >> 20
                            ),
                        });
                    }
                    return false;
                }
                buf.extend_from_slice(bytes);
                true
            }
            Reader::Error { head, .. } => {
                let room = ERROR_BODY_BYTES.saturating_sub(head.len());
                head.extend_from_slice(bytes.get(..room.min(bytes.len())).unwrap_or(&[]));
                true
            }
            Reader::Events(parser) => {
                let mut events = Vec::new();
                parser.feed(bytes, &mut events);
                if let Some(id) = parser.last_event_id() {
                    f.last_event_id = Some(id.to_string());
                }
                if let Some(ms) = parser.retry_ms() {
                    f.retry_ms = Some(ms);
                }
                let overflowed = parser.overflowed();
                for e in events {
                    self.on_sse_event(f, e, out, timers, got);
                }
                if overflowed {
                    for id in std::mem::take(&mut f.awaiting) {
                        got.push(Delivery::RequestFailed {
                            id,
                            reason: "sent an event over 16 MiB".into(),
                        });
                    }
                    return false;
                }
                // A request's stream is done once its responses came (an endless stream after
                // them is not read on).
                let done = f.awaiting.is_empty()
                    && matches!(
                        f.purpose,
                        Purpose::Post { .. }
                            | Purpose::Resume { .. }
                            | Purpose::Reinitialize { .. }
                    )
                    && f.events > 0
                    && !self.stream_may_carry_more(f);
                !done
            }
        }
    }

    /// Whether a request's stream whose requests are answered still matters: only while it
    /// owes the answer to the transport's own `initialize` (the server SHOULD close a stream
    /// after its responses, and anything else it sends comes on the `GET` stream too).
    fn stream_may_carry_more(&self, f: &Flight) -> bool {
        matches!(
            f.purpose,
            Purpose::Reinitialize {
                answered: false,
                ..
            }
        )
    }

    /// One event of a stream: a JSON-RPC message (or, legacy, the `endpoint`).
    fn on_sse_event(
        &mut self,
        f: &mut Flight,
        e: SseEvent,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        if self.wire == Wire::Legacy && e.event.as_deref() == Some("endpoint") {
            self.set_endpoint(e.data.trim(), out, timers, got);
            return;
        }
        if e.data.trim().is_empty() {
            return; // a priming event: only its id and retry matter
        }
        if e.event.as_deref().is_some_and(|t| t != "message") {
            out.log(
                LogLevel::Debug,
                format!(
                    "mcp '{}': ignoring an event of type {:?}",
                    self.name, e.event
                ),
            );
            return;
        }
        f.events += 1;
        self.deliver_json(f, e.data.as_bytes(), out, timers, got);
    }

    /// The legacy wire's `endpoint` event: frames go there from now on (same origin only: a
    /// credential never travels elsewhere).
    fn set_endpoint(
        &mut self,
        data: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        let base = crate::http::origin_of(&self.url).ok();
        let endpoint = if data.starts_with("http://") || data.starts_with("https://") {
            Some(data.to_string()).filter(|e| crate::http::origin_of(e).ok() == base)
        } else if let Some(origin) = &base {
            let path = if data.starts_with('/') {
                data.to_string()
            } else {
                // Relative to the stream URL's directory.
                let dir = self
                    .url
                    .split_once("://")
                    .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
                    .map_or("/", |p| p.rsplit_once('/').map_or("/", |(d, _)| d));
                format!("{}/{data}", dir.trim_end_matches('/'))
            };
            Some(format!("{origin}{path}"))
        } else {
            None
        };
        let Some(endpoint) = endpoint else {
            got.push(Delivery::Dead(format!(
                "failed to start: its endpoint {data:?} is not on the server's own origin"
            )));
            return;
        };
        self.endpoint = Some(endpoint);
        for frame in std::mem::take(&mut self.held) {
            self.send(frame, None, out, timers);
        }
    }

    /// A JSON body or event data: one message or a batch of them, each delivered; the answer
    /// to the transport's own `initialize` is its own.
    fn deliver_json(
        &mut self,
        f: &mut Flight,
        bytes: &[u8],
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        let items: Vec<Vec<u8>> = match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Array(batch)) => batch
                .iter()
                .filter_map(|v| serde_json::to_vec(v).ok())
                .collect(),
            Ok(_) | Err(_) => vec![bytes.to_vec()],
        };
        for item in items {
            match jsonrpc::parse_message(&item) {
                Ok(Message::Response { id, outcome })
                    if id.as_str().is_some_and(|s| s.starts_with(REINIT_ID)) =>
                {
                    if let Purpose::Reinitialize { answered, .. } = &mut f.purpose {
                        *answered = true;
                    }
                    self.reinitialized(outcome, out, timers, got);
                }
                Ok(message) => {
                    if let Message::Response { id, .. } = &message
                        && let Some(our) = jsonrpc::match_our_id(id)
                    {
                        f.awaiting.retain(|a| a.0 != our);
                        self.reinitialized = false;
                    }
                    got.push(Delivery::Message(message));
                }
                Err(_) => {
                    let shown =
                        String::from_utf8_lossy(item.get(..item.len().min(200)).unwrap_or(&[]))
                            .into_owned();
                    out.log(
                        LogLevel::Warn,
                        format!(
                            "mcp '{}': ignoring an answer that is not JSON-RPC: {shown:?}",
                            self.name
                        ),
                    );
                }
            }
        }
    }

    /// An answer ended: what it held is delivered; requests it left unanswered are resumed or
    /// failed.
    fn on_end(
        &mut self,
        mut f: Flight,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        match std::mem::replace(&mut f.reader, Reader::Ignore) {
            Reader::Collect(answer) => {
                if let Purpose::Auth { request } = f.purpose {
                    self.auth_answer(request, Ok(answer), out, timers, got);
                }
            }
            Reader::Json(buf) => {
                self.deliver_json(&mut f, &buf, out, timers, got);
                for id in std::mem::take(&mut f.awaiting) {
                    got.push(Delivery::RequestFailed {
                        id,
                        reason: "answered without a response to it".into(),
                    });
                }
            }
            Reader::Events(mut parser) => {
                let mut events = Vec::new();
                parser.finish(&mut events);
                for e in events {
                    self.on_sse_event(&mut f, e, out, timers, got);
                }
                self.stream_ended(f, "the event stream closed", out, timers, got);
            }
            Reader::Error {
                status,
                content_type,
                head,
                ..
            } => self.error_answer(f, status, &content_type, &head, out, timers, got),
            Reader::Head | Reader::Ignore => {
                if let Purpose::Listen = f.purpose {
                    self.stream_ended(f, "the event stream closed", out, timers, got);
                }
            }
        }
    }

    /// An HTTP error answer (status ≥ 400, not a challenge or an expiry) was read whole: a
    /// JSON-RPC error in it answers its request; otherwise the requests fail with the status.
    #[allow(clippy::too_many_arguments)]
    fn error_answer(
        &mut self,
        mut f: Flight,
        status: u16,
        content_type: &str,
        head: &[u8],
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        if let Purpose::Resume { attempt } = f.purpose {
            let reason = format!(
                "gave no response: resuming its event stream answered {}",
                status_text(status)
            );
            self.resume_failed(f, attempt, &reason, out, timers, got);
            return;
        }
        if content_type == "application/json" {
            self.deliver_json(&mut f, head, out, timers, got);
        }
        let snippet: String = String::from_utf8_lossy(head)
            .chars()
            .filter(|c| !c.is_control())
            .take(200)
            .collect();
        let snippet = snippet.trim();
        let reason = if snippet.is_empty() || content_type == "text/html" {
            format!("answered {}", status_text(status))
        } else {
            format!("answered {}: {snippet}", status_text(status))
        };
        for id in std::mem::take(&mut f.awaiting) {
            got.push(Delivery::RequestFailed {
                id,
                reason: reason.clone(),
            });
        }
        self.fail_unawaited(&f, &reason, out, got);
    }

    /// An event stream closed (`why`) with requests still unanswered: resumed after its
    /// `retry` with its last event id, or failed; the `GET` stream is opened again.
    fn stream_ended(
        &mut self,
        f: Flight,
        why: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        if self.phase == Phase::Closed {
            return;
        }
        let retry = f.retry_ms.unwrap_or(DEFAULT_RETRY_MS).min(MAX_RETRY_MS);
        match f.purpose {
            Purpose::Listen => {
                if self.wire == Wire::Legacy {
                    got.push(Delivery::Dead(format!("ended its event stream ({why})")));
                    return;
                }
                if f.events > 0 {
                    self.listen_reopens = 0;
                }
                self.listen_reopens += 1;
                if self.listen_reopens <= MAX_LISTEN_REOPENS && self.phase == Phase::Open {
                    self.listen_at = Some(out.now().plus_ms(retry));
                    self.arm_retry(timers);
                }
            }
            Purpose::Post { .. } | Purpose::Resume { .. } if !f.awaiting.is_empty() => {
                let attempt = match f.purpose {
                    Purpose::Resume { attempt } if f.events == 0 => attempt + 1,
                    Purpose::Resume { .. }
                    | Purpose::Post { .. }
                    | Purpose::Listen
                    | Purpose::Reinitialize { .. }
                    | Purpose::Delete
                    | Purpose::Auth { .. } => 1,
                };
                match f.last_event_id.clone() {
                    Some(last) if attempt <= MAX_RESUME_ATTEMPTS => {
                        self.resumes.push(PendingResume {
                            at: out.now().plus_ms(retry),
                            last_event_id: last,
                            awaiting: f.awaiting,
                            attempt,
                        });
                        self.arm_retry(timers);
                    }
                    Some(_) => {
                        let reason = format!(
                            "gave no response: {why} before it, and {MAX_RESUME_ATTEMPTS} attempts to resume it failed"
                        );
                        for id in f.awaiting {
                            got.push(Delivery::RequestFailed {
                                id,
                                reason: reason.clone(),
                            });
                        }
                    }
                    None => {
                        let reason = format!("gave no response: {why} before it");
                        for id in f.awaiting {
                            got.push(Delivery::RequestFailed {
                                id,
                                reason: reason.clone(),
                            });
                        }
                    }
                }
            }
            Purpose::Reinitialize {
                answered: false, ..
            } => got.push(Delivery::Dead(format!(
                "could not start a new session: {why} before the answer to initialize"
            ))),
            Purpose::Reinitialize { answered: true, .. }
            | Purpose::Post { .. }
            | Purpose::Resume { .. }
            | Purpose::Delete
            | Purpose::Auth { .. } => {}
        }
    }

    /// A resumption `GET` did not give a stream: another attempt after the wait, or the
    /// requests fail.
    fn resume_failed(
        &mut self,
        f: Flight,
        attempt: u32,
        reason: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        match f.last_event_id {
            Some(last) if attempt < MAX_RESUME_ATTEMPTS && !f.awaiting.is_empty() => {
                self.resumes.push(PendingResume {
                    at: out.now().plus_ms(DEFAULT_RETRY_MS),
                    last_event_id: last,
                    awaiting: f.awaiting,
                    attempt: attempt + 1,
                });
                self.arm_retry(timers);
            }
            Some(_) | None => {
                for id in f.awaiting {
                    got.push(Delivery::RequestFailed {
                        id,
                        reason: reason.to_string(),
                    });
                }
            }
        }
    }

    /// A connection or IO failure of an exchange (`reason`, one line).
    fn on_failed(
        &mut self,
        mut f: Flight,
        reason: &str,
        out: &mut Outbox,
        timers: &mut TimerTable,
        got: &mut Vec<Delivery>,
    ) {
        match (&f.purpose, &f.reader) {
            (Purpose::Delete, _) => {}
            (Purpose::Auth { request }, _) => {
                let request = *request;
                self.auth_answer(request, Err(reason.to_string()), out, timers, got);
            }
            (Purpose::Listen, Reader::Head) if self.wire == Wire::Streamable => {
                out.log(
                    LogLevel::Warn,
                    format!(
                        "mcp '{}': the stream of server messages failed: {reason}",
                        self.name
                    ),
                );
            }
            (Purpose::Listen, _) if self.wire == Wire::Streamable => {
                self.stream_ended(
                    f,
                    &format!("the event stream broke ({reason})"),
                    out,
                    timers,
                    got,
                );
            }
            (Purpose::Resume { attempt }, _) => {
                let attempt = *attempt;
                self.resume_failed(
                    f,
                    attempt,
                    &format!("gave no response: resuming its event stream failed: {reason}"),
                    out,
                    timers,
                    got,
                );
            }
            (
                Purpose::Post { .. } | Purpose::Reinitialize { .. } | Purpose::Listen,
                Reader::Head,
            ) => {
                got.push(Delivery::Dead(format!("is unreachable: {reason}")));
            }
            (
                Purpose::Post { .. } | Purpose::Reinitialize { .. } | Purpose::Listen,
                Reader::Events(_),
            ) => {
                let mut parser = match std::mem::replace(&mut f.reader, Reader::Ignore) {
                    Reader::Events(p) => p,
                    Reader::Head
                    | Reader::Json(_)
                    | Reader::Ignore
                    | Reader::Error { .. }
                    | Reader::Collect(_) => Box::default(),
                };
                let mut events = Vec::new();
                parser.finish(&mut events);
                for e in events {
                    self.on_sse_event(&mut f, e, out, timers, got);
                }
                self.stream_ended(
                    f,
                    &format!("the event stream broke ({reason})"),
                    out,
                    timers,
                    got,
                );
            }
            (Purpose::Post { .. } | Purpose::Reinitialize { .. } | Purpose::Listen, _) => {
                let why = format!(
                    "gave no complete answer: the connection broke before it ended ({reason})"
                );
                for id in std::mem::take(&mut f.awaiting) {
                    got.push(Delivery::RequestFailed {
                        id,
                        reason: why.clone(),
                    });
                }
                self.fail_unawaited(&f, &why, out, got);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;
    use serde_json::json;

    const SLOT: ServerSlot = ServerSlot(3);

    /// One transport alone with the outbox and timers a step lends it.
    struct Rig {
        t: HttpTransport,
        out: Outbox,
        timers: TimerTable,
        /// The authorization's runtime work asked for (listener, token file, browser).
        oauth: Vec<crate::io::OAuthAction>,
        /// The lines logged.
        logs: Vec<String>,
    }

    /// A request the transport asked the runtime to send.
    #[derive(Debug)]
    struct Sent {
        seq: u64,
        method: Method,
        url: String,
        headers: Vec<(String, String)>,
        body: Value,
    }

    impl Sent {
        fn header(&self, name: &str) -> Option<&str> {
            header(&self.headers, name)
        }
    }

    fn frame(kind: FrameKind, message: &Value) -> Frame {
        Frame {
            text: format!("{message}\n"),
            kind,
        }
    }

    fn request(id: u64, method: &str) -> Frame {
        frame(
            FrameKind::Request(McpRequestId(id)),
            &json!({"jsonrpc": "2.0", "id": id, "method": method}),
        )
    }

    fn response(id: u64) -> String {
        json!({"jsonrpc": "2.0", "id": id, "result": {"ok": id}}).to_string()
    }

    fn head(status: u16, headers: &[(&str, &str)]) -> HttpEvent {
        HttpEvent::Head {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    impl Rig {
        fn new(wire: Wire) -> Rig {
            let headers = vec![
                ("X-Team".to_string(), "blue".to_string()),
                ("Authorization".to_string(), "Bearer t".to_string()),
            ];
            let url = match wire {
                Wire::Streamable => "http://h:8/mcp",
                Wire::Legacy => "http://h:8/sse",
            };
            let mut rig = Rig {
                t: HttpTransport::new(SLOT, "remote", wire, url, &headers, 5_000, None),
                out: Outbox::new(LogLevel::Debug, MonoTime::ZERO),
                timers: TimerTable::default(),
                oauth: Vec::new(),
                logs: Vec::new(),
            };
            rig.t.open(&mut rig.out, &mut rig.timers);
            rig
        }

        /// A Streamable HTTP server at `http://127.0.0.1:8/mcp` without a configured header,
        /// authorized with OAuth from the clients file `clients` (no state directory).
        fn with_oauth(clients: &Value) -> Rig {
            let url = "http://127.0.0.1:8/mcp";
            let oauth = crate::oauth::settings::parse_clients_file(
                &clients.to_string(),
                &std::collections::BTreeMap::new(),
                &|p: &str| Err(format!("{p}: no files here")),
            )
            .unwrap();
            let setup = crate::authorization::AuthSetup {
                oauth,
                keeps_tokens: false,
                unix_ms_at_start: 1_700_000_000_000,
                request_timeout_ms: 5_000,
            };
            let auth = ServerAuth::new(
                SLOT,
                "remote",
                crate::url::HttpUrl::parse(url).unwrap(),
                &setup,
                crate::oauth::secrets::SecretRng::new([7; 32]),
            );
            let mut rig = Rig {
                t: HttpTransport::new(
                    SLOT,
                    "remote",
                    Wire::Streamable,
                    url,
                    &[],
                    5_000,
                    Some(auth),
                ),
                out: Outbox::new(LogLevel::Debug, MonoTime::ZERO),
                timers: TimerTable::default(),
                oauth: Vec::new(),
                logs: Vec::new(),
            };
            rig.t.open(&mut rig.out, &mut rig.timers);
            rig
        }

        /// The requests asked for since the last call, and the exchanges dropped.
        fn sent(&mut self) -> (Vec<Sent>, Vec<u64>) {
            let (mut sent, mut dropped) = (Vec::new(), Vec::new());
            while let Some(a) = self.out.pop() {
                match a {
                    Action::Http { exchange, request } => {
                        assert_eq!(exchange.server, SLOT);
                        let bytes = request.body.to_vec();
                        sent.push(Sent {
                            seq: exchange.seq,
                            method: request.method,
                            url: request.url,
                            headers: request.headers,
                            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                        });
                    }
                    Action::CancelHttp { exchange } => dropped.push(exchange.seq),
                    Action::OAuth(a) => self.oauth.push(a),
                    Action::Log(r) => self.logs.push(r.message),
                    other @ (Action::WriteAcp(_)
                    | Action::WriteMcp { .. }
                    | Action::SpawnMcp { .. }
                    | Action::CloseMcpStdin { .. }
                    | Action::SignalProcessGroup { .. }
                    | Action::CallLlm { .. }
                    | Action::CancelLlm { .. }
                    | Action::OpenTranscript { .. }
                    | Action::ReadTranscript { .. }
                    | Action::AppendTranscript { .. }
                    | Action::SyncTranscript { .. }
                    | Action::TruncateTranscript { .. }
                    | Action::CloseTranscript { .. }
                    | Action::ListTranscripts { .. }
                    | Action::ReadProject { .. }
                    | Action::Exit { .. }) => panic!("unexpected action {other:?}"),
                }
            }
            (sent, dropped)
        }

        fn send(&mut self, f: Frame, version: Option<&str>) {
            self.t.send(f, version, &mut self.out, &mut self.timers);
        }

        fn on(&mut self, seq: u64, event: HttpEvent) -> Vec<Delivery> {
            self.t.on_event(seq, event, &mut self.out, &mut self.timers)
        }

        /// Feeds a whole answer: head, one body chunk, end.
        fn answer(
            &mut self,
            seq: u64,
            status: u16,
            headers: &[(&str, &str)],
            body: &str,
        ) -> Vec<Delivery> {
            let mut got = self.on(seq, head(status, headers));
            if !body.is_empty() {
                got.extend(self.on(seq, HttpEvent::Body(body.as_bytes().to_vec())));
            }
            got.extend(self.on(seq, HttpEvent::End));
            got
        }

        /// `initialize` answered with session id `abc`, then `initialized` sent and the `GET`
        /// stream open (its head answered `200` with an event stream): returns its request.
        fn handshake(&mut self) -> Sent {
            let get = self.initialized();
            let got = self.on(get.seq, head(200, &[("content-type", "text/event-stream")]));
            assert!(got.is_empty(), "{got:?}");
            get
        }

        /// `initialize` answered with session id `abc`, then `initialized` sent and answered:
        /// returns the `GET` stream's request, not answered yet.
        fn initialized(&mut self) -> Sent {
            let init = frame(
                FrameKind::Initialize(McpRequestId(1)),
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
            );
            self.send(init, None);
            let (sent, _) = self.sent();
            let got = self.answer(
                sent[0].seq,
                200,
                &[
                    ("content-type", "application/json"),
                    ("mcp-session-id", "abc"),
                ],
                &response(1),
            );
            assert!(matches!(&got[..], [Delivery::Message(_)]), "{got:?}");
            self.send(
                frame(
                    FrameKind::Initialized,
                    &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                ),
                Some("2025-11-25"),
            );
            let (sent, _) = self.sent();
            assert_eq!(sent.len(), 1, "initialized alone: {sent:?}");
            let got = self.answer(sent[0].seq, 202, &[], "");
            assert!(got.is_empty(), "{got:?}");
            let (mut sent, _) = self.sent();
            assert_eq!(
                sent.len(),
                1,
                "the GET stream once initialized was taken: {sent:?}"
            );
            sent.remove(0)
        }
    }

    fn is_response_to(d: &Delivery, id: u64) -> bool {
        matches!(d, Delivery::Message(Message::Response { id: v, .. }) if *v == json!(id))
    }

    #[test]
    fn m10_initialize_has_no_session_id_later_requests_carry_it_and_the_version() {
        let mut rig = Rig::new(Wire::Streamable);
        let init = frame(
            FrameKind::Initialize(McpRequestId(1)),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
        );
        rig.send(init, None);
        let (sent, _) = rig.sent();
        let post = &sent[0];
        assert_eq!(post.method, Method::Post);
        assert_eq!(post.url, "http://h:8/mcp");
        assert_eq!(
            post.header("accept"),
            Some("application/json, text/event-stream")
        );
        assert_eq!(post.header("content-type"), Some("application/json"));
        assert_eq!(post.header("X-Team"), Some("blue"), "the entry's header");
        assert_eq!(
            post.header("authorization"),
            Some("Bearer t"),
            "the credential"
        );
        assert_eq!(post.header("mcp-session-id"), None);
        assert_eq!(post.body["method"], "initialize");

        let get = {
            let mut rig = Rig::new(Wire::Streamable);
            rig.handshake()
        };
        assert_eq!(get.method, Method::Get);
        assert_eq!(get.header("accept"), Some("text/event-stream"));
        assert_eq!(get.header("mcp-session-id"), Some("abc"));
        assert_eq!(get.header("mcp-protocol-version"), Some("2025-11-25"));

        let mut rig = Rig::new(Wire::Streamable);
        let get = rig.initialized();
        // 405 on the GET stream: there is none, and it is not asked for again.
        let got = rig.answer(get.seq, 405, &[], "");
        assert!(got.is_empty(), "{got:?}");
        assert!(
            !rig.timers
                .contains(Timer::Server(SLOT, ServerTimer::HttpRetry))
        );
        rig.send(request(2, "tools/list"), None);
        let (sent, _) = rig.sent();
        assert_eq!(sent[0].header("mcp-session-id"), Some("abc"));
        assert_eq!(sent[0].header("mcp-protocol-version"), Some("2025-11-25"));
    }

    /// The conformance suite's elicitation server (the TypeScript SDK) sends its
    /// `elicitation/create` on the `GET` stream, and drops it when that stream is not open
    /// yet: a call sent before the stream's head came lost its elicitation and hung.
    #[test]
    fn m10_requests_after_initialized_wait_for_the_event_streams_head() {
        let mut rig = Rig::new(Wire::Streamable);
        let get = rig.initialized();
        assert_eq!(get.method, Method::Get);
        rig.send(request(2, "tools/list"), None);
        rig.send(request(3, "tools/call"), None);
        assert!(rig.sent().0.is_empty(), "held until the stream answers");
        let got = rig.on(get.seq, head(200, &[("content-type", "text/event-stream")]));
        assert!(got.is_empty(), "{got:?}");
        let (sent, _) = rig.sent();
        let methods: Vec<&Value> = sent.iter().map(|s| &s.body["method"]).collect();
        assert_eq!(methods, ["tools/list", "tools/call"], "in order: {sent:?}");
        // Open since: a later frame goes out at once.
        rig.send(request(4, "ping"), None);
        assert_eq!(rig.sent().0.len(), 1);

        // A stream that fails before its head lets them go too.
        let mut rig = Rig::new(Wire::Streamable);
        let get = rig.initialized();
        rig.send(request(2, "tools/list"), None);
        assert!(rig.sent().0.is_empty());
        rig.on(get.seq, HttpEvent::Failed("connection reset".into()));
        let (sent, _) = rig.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].body["method"], "tools/list");
    }

    #[test]
    fn m10_a_get_stream_that_never_answers_holds_requests_for_the_settle_time_only() {
        let mut rig = Rig::new(Wire::Streamable);
        let get = rig.initialized();
        rig.send(request(2, "tools/list"), None);
        assert!(rig.sent().0.is_empty());
        let retry = Timer::Server(SLOT, ServerTimer::HttpRetry);
        let at = MonoTime::ZERO.plus_ms(LISTEN_SETTLE_MS);
        assert_eq!(rig.timers.get(retry), Some(at));
        rig.out
            .advance(MonoTime::ZERO.plus_ms(LISTEN_SETTLE_MS - 1));
        rig.t.retry_due(&mut rig.out, &mut rig.timers);
        assert!(rig.sent().0.is_empty(), "not before the settle time");
        rig.out.advance(at);
        rig.t.retry_due(&mut rig.out, &mut rig.timers);
        let (sent, dropped) = rig.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].body["method"], "tools/list");
        assert!(dropped.is_empty(), "the stream itself stays: {dropped:?}");
        assert!(!rig.timers.contains(retry), "nothing else to wait for");
        assert!(
            rig.logs
                .iter()
                .any(|l| l.contains("gave no answer in 2000 ms")),
            "{:?}",
            rig.logs
        );
        // Its late head changes nothing for the frames already sent.
        assert!(
            rig.on(get.seq, head(200, &[("content-type", "text/event-stream")]))
                .is_empty()
        );
        assert!(rig.sent().0.is_empty());
    }

    /// `initialize` answered; `initialized` sent, not answered yet. Returns its `POST`.
    fn initialized_in_flight(rig: &mut Rig) -> Sent {
        let init = frame(
            FrameKind::Initialize(McpRequestId(1)),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
        );
        rig.send(init, None);
        let (sent, _) = rig.sent();
        let json = [
            ("content-type", "application/json"),
            ("mcp-session-id", "abc"),
        ];
        rig.answer(sent[0].seq, 200, &json, &response(1));
        let initialized = frame(
            FrameKind::Initialized,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        rig.send(initialized, Some("2025-11-25"));
        let (mut sent, _) = rig.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        sent.remove(0)
    }

    fn methods(sent: &[Sent]) -> Vec<String> {
        sent.iter()
            .map(|s| {
                s.body["method"]
                    .as_str()
                    .map_or_else(|| format!("{:?}", s.method), str::to_string)
            })
            .collect()
    }

    /// `sent` is the `GET` stream alone: its head is answered `200` (an event stream), and
    /// what the transport sends then is returned.
    fn stream_opened(rig: &mut Rig, sent: &[Sent]) -> Vec<Sent> {
        assert_eq!(methods(sent), ["Get"], "the stream first, alone: {sent:?}");
        let got = rig.on(
            sent[0].seq,
            head(200, &[("content-type", "text/event-stream")]),
        );
        assert!(got.is_empty(), "{got:?}");
        rig.sent().0
    }

    #[test]
    fn m10_frames_after_initialized_wait_until_its_post_is_answered_then_go_in_order() {
        // Answered 202: the GET stream goes out, then, once it answered, the requests that
        // waited, in order.
        let mut rig = Rig::new(Wire::Streamable);
        let initialized = initialized_in_flight(&mut rig);
        rig.send(request(2, "tools/list"), None);
        rig.send(request(3, "prompts/list"), None);
        assert!(
            rig.sent().0.is_empty(),
            "nothing before initialized is taken"
        );
        let got = rig.on(initialized.seq, head(202, &[]));
        assert!(got.is_empty(), "{got:?}");
        let (sent, _) = rig.sent();
        let sent = stream_opened(&mut rig, &sent);
        assert_eq!(methods(&sent), ["tools/list", "prompts/list"]);
        assert!(
            sent.iter()
                .all(|s| s.header("mcp-session-id") == Some("abc"))
        );
        // Later frames go at once.
        rig.send(request(4, "tools/call"), None);
        assert_eq!(methods(&rig.sent().0), ["tools/call"]);

        // An error answer, a failed exchange or no answer in time: the session goes on
        // (initialized is a notification), and what waited goes out.
        for outcome in ["500", "failed", "timeout"] {
            let mut rig = Rig::new(Wire::Streamable);
            let initialized = initialized_in_flight(&mut rig);
            rig.send(request(2, "tools/list"), None);
            assert!(rig.sent().0.is_empty(), "{outcome}");
            match outcome {
                "500" => {
                    rig.answer(
                        initialized.seq,
                        500,
                        &[("content-type", "text/plain")],
                        "no",
                    );
                }
                "failed" => {
                    rig.on(initialized.seq, HttpEvent::Failed("reset".into()));
                }
                _ => {
                    rig.t
                        .exchange_timed_out(initialized.seq, &mut rig.out, &mut rig.timers);
                }
            }
            let (sent, _) = rig.sent();
            let sent = stream_opened(&mut rig, &sent);
            assert_eq!(methods(&sent), ["tools/list"], "{outcome}");
        }

        // The legacy wire: its POSTs too can reach the server in any order.
        let mut rig = Rig::new(Wire::Legacy);
        let stream = rig.sent().0.remove(0).seq;
        rig.on(stream, head(200, &[("content-type", "text/event-stream")]));
        rig.on(
            stream,
            HttpEvent::Body(b"event: endpoint\ndata: /messages?session=9\n\n".to_vec()),
        );
        let initialized = frame(
            FrameKind::Initialized,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        rig.send(initialized, None);
        rig.send(request(2, "tools/list"), None);
        let (sent, _) = rig.sent();
        assert_eq!(methods(&sent), ["notifications/initialized"]);
        rig.answer(sent[0].seq, 202, &[], "Accepted");
        assert_eq!(
            methods(&rig.sent().0),
            ["tools/list"],
            "and no GET of its own"
        );
    }

    #[test]
    fn m10_an_event_stream_carries_server_messages_before_the_response_and_ends_with_it() {
        let mut rig = Rig::new(Wire::Streamable);
        rig.handshake();
        rig.send(request(2, "tools/call"), None);
        let (sent, _) = rig.sent();
        let seq = sent[0].seq;
        assert!(
            rig.on(
                seq,
                head(200, &[("content-type", "text/event-stream; charset=utf-8")])
            )
            .is_empty()
        );
        let ping = json!({"jsonrpc": "2.0", "id": "s1", "method": "ping"});
        let body = format!(
            "id: 1\ndata: \n\nid: 2\nevent: message\ndata: {ping}\n\nid: 3\ndata: {}\n\n",
            response(2)
        );
        // Split anywhere: the parser keeps what is incomplete.
        let (a, b) = body.split_at(body.len() / 2);
        let mut got = rig.on(seq, HttpEvent::Body(a.as_bytes().to_vec()));
        got.extend(rig.on(seq, HttpEvent::Body(b.as_bytes().to_vec())));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            matches!(&got[0], Delivery::Message(Message::Request { method, .. }) if method == "ping")
        );
        assert!(is_response_to(&got[1], 2));
        let (_, dropped) = rig.sent();
        assert_eq!(
            dropped,
            [seq],
            "a request's stream is let go once its response came"
        );
        assert!(!rig.t.owns(seq));
    }

    /// After the handshake, request 2 (`tools/call`) gets a `404`: returns the transport's own
    /// `initialize` for the new session.
    fn session_expired(rig: &mut Rig) -> Sent {
        rig.handshake();
        rig.send(request(2, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(
            sent[0].seq,
            404,
            &[("content-type", "application/json")],
            "{}",
        );
        assert!(got.is_empty(), "the model never hears of it: {got:?}");
        let (mut sent, _) = rig.sent();
        let at = sent
            .iter()
            .position(|s| s.body["method"] == "initialize")
            .expect("a new initialize");
        sent.remove(at)
    }

    /// The new session's `initialize` (exchange `seq`) answered with session id `def`, as a
    /// body of `content_type`: the response after `prefix` (and, for an event, its end).
    fn new_session_answered(
        rig: &mut Rig,
        seq: u64,
        content_type: &str,
        prefix: &str,
    ) -> Vec<Delivery> {
        let answer = json!({"jsonrpc": "2.0", "id": "buzz-reinit-1", "result": {"protocolVersion": "2025-11-25"}});
        let end = if prefix.is_empty() { "" } else { "\n\n" };
        let headers = [("content-type", content_type), ("mcp-session-id", "def")];
        rig.answer(seq, 200, &headers, &format!("{prefix}{answer}{end}"))
    }

    #[test]
    fn m10_a_404_on_the_session_initializes_a_new_one_then_resends_and_a_second_is_dead() {
        let mut rig = Rig::new(Wire::Streamable);
        let reinit = session_expired(&mut rig);
        assert_eq!(reinit.header("mcp-session-id"), None);
        assert_eq!(
            reinit.body["id"], "buzz-reinit-1",
            "its own id, never a session's"
        );
        // Requests meanwhile wait for the new session.
        rig.send(request(3, "tools/list"), None);
        assert!(rig.sent().0.is_empty());
        let got = new_session_answered(&mut rig, reinit.seq, "application/json", "");
        assert!(got.is_empty(), "its answer is the transport's own: {got:?}");
        let (sent, _) = rig.sent();
        let methods: Vec<&str> = sent
            .iter()
            .filter_map(|s| s.body["method"].as_str())
            .collect();
        assert_eq!(methods, ["notifications/initialized"], "alone first");
        let got = rig.answer(sent[0].seq, 202, &[], "");
        assert!(got.is_empty(), "{got:?}");
        let (sent, _) = rig.sent();
        let sent = stream_opened(&mut rig, &sent);
        let methods: Vec<&str> = sent
            .iter()
            .filter_map(|s| s.body["method"].as_str())
            .collect();
        assert_eq!(
            methods,
            ["tools/call", "tools/list"],
            "the requests that waited, in order, once initialized was taken"
        );
        assert!(
            sent.iter()
                .all(|s| s.header("mcp-session-id") == Some("def"))
        );
        // Lost again at once: the server cannot keep a session.
        let call = sent
            .iter()
            .find(|s| s.body["method"] == "tools/call")
            .expect("resent");
        let got = rig.answer(call.seq, 404, &[], "");
        assert!(
            matches!(&got[..], [Delivery::Dead(why)] if why.contains("again")),
            "{got:?}"
        );
    }

    /// FastMCP's way: the new session's `initialize` is answered on an event stream that the
    /// server then closes; the session is open again (the stream's end is no failure once
    /// the answer came), and a `202` with `application/json` and no body is no answer to warn
    /// about.
    #[test]
    fn m10_a_new_session_answered_on_an_event_stream_that_then_closes_is_open() {
        let mut rig = Rig::new(Wire::Streamable);
        let reinit = session_expired(&mut rig);
        let got = new_session_answered(
            &mut rig,
            reinit.seq,
            "text/event-stream",
            "event: message\ndata: ",
        );
        assert!(got.is_empty(), "the stream's end after the answer: {got:?}");
        let (sent, _) = rig.sent();
        assert_eq!(methods(&sent), ["notifications/initialized"], "{sent:?}");
        let json = [("content-type", "application/json")];
        let got = rig.answer(sent[0].seq, 202, &json, "");
        assert!(got.is_empty(), "{got:?}");
        let (sent, _) = rig.sent();
        let sent = stream_opened(&mut rig, &sent);
        let call = sent
            .iter()
            .find(|s| s.body["method"] == "tools/call")
            .expect("the request again");
        assert_eq!(call.header("mcp-session-id"), Some("def"));
        let got = rig.answer(
            call.seq,
            200,
            &[("content-type", "text/event-stream")],
            &format!("event: message\ndata: {}\n\n", response(2)),
        );
        assert!(matches!(&got[..], [d] if is_response_to(d, 2)), "{got:?}");
        assert!(
            rig.logs.iter().all(|l| !l.contains("not JSON-RPC")),
            "{:?}",
            rig.logs
        );
    }

    #[test]
    fn m10_a_stream_closed_before_its_response_is_resumed_with_the_last_event_id_after_retry() {
        let mut rig = Rig::new(Wire::Streamable);
        rig.handshake();
        rig.send(request(2, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(
            sent[0].seq,
            200,
            &[("content-type", "text/event-stream")],
            "id: e1\nretry: 250\ndata: \n\n",
        );
        assert!(got.is_empty(), "{got:?}");
        let retry = Timer::Server(SLOT, ServerTimer::HttpRetry);
        assert_eq!(rig.timers.get(retry), Some(MonoTime::ZERO.plus_ms(250)));
        rig.out.advance(MonoTime::ZERO.plus_ms(250));
        rig.t.retry_due(&mut rig.out, &mut rig.timers);
        let (sent, _) = rig.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].method, Method::Get);
        assert_eq!(sent[0].header("last-event-id"), Some("e1"));
        assert_eq!(sent[0].header("mcp-session-id"), Some("abc"));
        let got = rig.answer(
            sent[0].seq,
            200,
            &[("content-type", "text/event-stream")],
            &format!("id: e2\ndata: {}\n\n", response(2)),
        );
        assert!(matches!(&got[..], [d] if is_response_to(d, 2)), "{got:?}");
        // Without an event id there is nothing to resume: the request fails.
        rig.send(request(4, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(
            sent[0].seq,
            200,
            &[("content-type", "text/event-stream")],
            ": hi\n\n",
        );
        assert!(
            matches!(&got[..], [Delivery::RequestFailed { id, reason }] if id.0 == 4 && reason == "gave no response: the event stream closed before it"),
            "{got:?}"
        );
    }

    #[test]
    fn m10_error_answers_fail_their_request_redirects_are_not_followed_unreachable_is_dead() {
        let mut rig = Rig::new(Wire::Streamable);
        rig.handshake();
        rig.send(request(2, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(
            sent[0].seq,
            500,
            &[("content-type", "text/html")],
            "<html>oops</html>",
        );
        assert!(
            matches!(&got[..], [Delivery::RequestFailed { id, reason }] if id.0 == 2 && reason == "answered HTTP 500 (Internal Server Error)"),
            "an HTML page is not quoted: {got:?}"
        );
        rig.send(request(3, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(
            sent[0].seq,
            302,
            &[("location", "https://elsewhere/login")],
            "",
        );
        assert!(
            matches!(&got[..], [Delivery::RequestFailed { reason, .. }] if reason.contains("https://elsewhere/login") && reason.contains("not followed")),
            "{got:?}"
        );
        rig.send(request(4, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(
            sent[0].seq,
            200,
            &[("content-type", "application/json")],
            &"x".repeat(10),
        );
        assert!(
            matches!(&got[..], [Delivery::RequestFailed { id, reason }] if id.0 == 4 && reason.contains("without a response")),
            "{got:?}"
        );
        rig.send(request(5, "tools/call"), None);
        let (sent, _) = rig.sent();
        let got = rig.on(sent[0].seq, HttpEvent::Failed("connection refused".into()));
        assert!(
            matches!(&got[..], [Delivery::Dead(why)] if why == "is unreachable: connection refused"),
            "{got:?}"
        );
    }

    #[test]
    fn m10_a_json_body_over_the_cap_fails_its_request() {
        let mut rig = Rig::new(Wire::Streamable);
        rig.handshake();
        rig.send(request(2, "tools/call"), None);
        let (sent, _) = rig.sent();
        let seq = sent[0].seq;
        assert!(
            rig.on(seq, head(200, &[("content-type", "application/json")]))
                .is_empty()
        );
        let piece = vec![b' '; 1 << 20];
        let mut got = Vec::new();
        for _ in 0..17 {
            got.extend(rig.on(seq, HttpEvent::Body(piece.clone())));
        }
        assert!(
            matches!(&got[..], [Delivery::RequestFailed { id, reason }] if id.0 == 2 && reason.contains("16 MiB")),
            "{got:?}"
        );
        assert!(!rig.t.owns(seq), "dropped");
    }

    #[test]
    fn m10_close_ends_the_session_with_a_delete_and_drops_what_is_in_flight() {
        let mut rig = Rig::new(Wire::Streamable);
        let get = rig.handshake();
        rig.send(request(2, "tools/call"), None);
        let (sent, _) = rig.sent();
        rig.t.close(&mut rig.out, &mut rig.timers);
        let (deletes, mut dropped) = rig.sent();
        dropped.sort_unstable();
        assert_eq!(dropped, [get.seq, sent[0].seq]);
        assert_eq!(deletes.len(), 1);
        assert_eq!(deletes[0].method, Method::Delete);
        assert_eq!(deletes[0].header("mcp-session-id"), Some("abc"));
        assert!(rig.t.busy(), "the DELETE is waited for (bounded)");
        assert!(
            rig.timers
                .contains(Timer::Server(SLOT, ServerTimer::Exchange(deletes[0].seq)))
        );
        assert!(rig.answer(deletes[0].seq, 200, &[], "").is_empty());
        assert!(!rig.t.busy());
        // Closed: nothing more goes out.
        rig.send(request(3, "ping"), None);
        assert!(rig.sent().0.is_empty());
    }

    #[test]
    fn m10_legacy_frames_wait_for_the_endpoint_on_the_same_origin_and_answers_come_on_the_stream() {
        let mut rig = Rig::new(Wire::Legacy);
        let (sent, _) = rig.sent();
        assert_eq!(sent.len(), 1);
        let stream = &sent[0];
        assert_eq!(stream.method, Method::Get);
        assert_eq!(stream.url, "http://h:8/sse");
        let seq = stream.seq;
        let init = frame(
            FrameKind::Initialize(McpRequestId(1)),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
        );
        rig.send(init, None);
        assert!(rig.sent().0.is_empty(), "held until the endpoint is known");
        assert!(
            rig.on(seq, head(200, &[("content-type", "text/event-stream")]))
                .is_empty()
        );
        let got = rig.on(
            seq,
            HttpEvent::Body(b"event: endpoint\ndata: /messages?session=9\n\n".to_vec()),
        );
        assert!(got.is_empty());
        let (sent, _) = rig.sent();
        assert_eq!(sent[0].url, "http://h:8/messages?session=9");
        assert_eq!(
            sent[0].header("mcp-session-id"),
            None,
            "no Streamable headers"
        );
        assert!(rig.answer(sent[0].seq, 202, &[], "Accepted").is_empty());
        let got = rig.on(
            seq,
            HttpEvent::Body(format!("event: message\ndata: {}\n\n", response(1)).into_bytes()),
        );
        assert!(matches!(&got[..], [d] if is_response_to(d, 1)), "{got:?}");

        let mut rig = Rig::new(Wire::Legacy);
        let (sent, _) = rig.sent();
        rig.on(
            sent[0].seq,
            head(200, &[("content-type", "text/event-stream")]),
        );
        let got = rig.on(
            sent[0].seq,
            HttpEvent::Body(b"event: endpoint\ndata: https://evil.example/steal\n\n".to_vec()),
        );
        assert!(
            matches!(&got[..], [Delivery::Dead(why)] if why.contains("not on the server's own origin")),
            "a credential never goes to another origin: {got:?}"
        );
    }

    /// The authorization server of the OAuth tests: protected resource metadata, its own
    /// metadata, and a token endpoint answering `token` (status, body).
    fn authorization_server(rig: &mut Rig, token: (u16, Value)) -> Vec<Delivery> {
        let mut got = Vec::new();
        for _ in 0..10 {
            let (sent, _) = rig.sent();
            let Some(req) = sent.into_iter().next() else {
                break;
            };
            let body = if req
                .url
                .ends_with("/.well-known/oauth-protected-resource/mcp")
            {
                json!({"resource": "http://127.0.0.1:8/mcp", "authorization_servers": ["http://127.0.0.1:9"]})
            } else if req.url.ends_with("/.well-known/oauth-authorization-server") {
                json!({
                    "issuer": "http://127.0.0.1:9",
                    "authorization_endpoint": "http://127.0.0.1:9/authorize",
                    "token_endpoint": "http://127.0.0.1:9/token",
                    "grant_types_supported": ["client_credentials"],
                    "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                })
            } else if req.url == "http://127.0.0.1:9/token" {
                assert!(
                    req.header("authorization")
                        .is_some_and(|a| a.starts_with("Basic "))
                );
                let text = token.1.to_string();
                got.extend(rig.answer(
                    req.seq,
                    token.0,
                    &[("content-type", "application/json")],
                    &text,
                ));
                continue;
            } else {
                // The MCP server's own request: hand it back to the caller.
                rig.t.flights.get(&req.seq).expect("in flight");
                got.push(Delivery::Message(Message::Notification {
                    method: format!(
                        "sent {} {}",
                        req.header("authorization").unwrap_or("-"),
                        req.body
                    ),
                    params: Value::Null,
                }));
                let _ = req;
                break;
            };
            got.extend(rig.answer(
                req.seq,
                200,
                &[("content-type", "application/json")],
                &body.to_string(),
            ));
        }
        got
    }

    fn client_credentials() -> Value {
        json!({"servers": {"http://127.0.0.1:8/mcp": {"client_id": "svc", "client_secret": "s3", "grant": "client_credentials"}}})
    }

    #[test]
    fn m11_a_401_runs_the_authorization_over_the_server_s_exchanges_and_resends_with_the_token() {
        let mut rig = Rig::with_oauth(&client_credentials());
        let init = frame(
            FrameKind::Initialize(McpRequestId(1)),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
        );
        rig.send(init, None);
        let (sent, _) = rig.sent();
        assert_eq!(sent[0].header("authorization"), None, "no token yet");
        let got = rig.answer(
            sent[0].seq,
            401,
            &[(
                "www-authenticate",
                r#"Bearer resource_metadata="http://127.0.0.1:8/.well-known/oauth-protected-resource/mcp""#,
            )],
            "",
        );
        assert!(got.is_empty(), "held, not failed: {got:?}");
        // The request waits for the authorization, which may take longer than its own deadline.
        let got = authorization_server(
            &mut rig,
            (
                200,
                json!({"access_token": "tok-1", "token_type": "Bearer", "expires_in": 3600}),
            ),
        );
        let [Delivery::Message(Message::Notification { method, .. })] = &got[..] else {
            panic!("the initialize went again: {got:?}");
        };
        assert!(method.starts_with("sent Bearer tok-1 "), "{method}");
        assert!(method.contains("\"initialize\""), "{method}");
        assert!(
            rig.oauth.is_empty(),
            "client credentials need no listener or file: {:?}",
            rig.oauth
        );
    }

    #[test]
    fn m11_a_refused_authorization_fails_the_held_handshake_as_unauthorized() {
        let mut rig = Rig::with_oauth(&client_credentials());
        challenged_initialize(&mut rig);
        let got = authorization_server(&mut rig, (401, json!({"error": "invalid_client"})));
        let [
            Delivery::Unauthorized(why),
            Delivery::RequestFailed { id, reason },
        ] = &got[..]
        else {
            panic!("{got:?}");
        };
        assert_eq!(*id, McpRequestId(1));
        assert!(
            why.starts_with("not authorized: ") && why.contains("invalid_client"),
            "{why}"
        );
        assert_eq!(why, reason);
        // A plain 403 later is an ordinary error, not an authorization matter.
        let mut rig = Rig::with_oauth(&client_credentials());
        rig.send(request(5, "tools/list"), None);
        let (sent, _) = rig.sent();
        let got = rig.answer(sent[0].seq, 403, &[("content-type", "text/plain")], "nope");
        assert!(
            matches!(&got[..], [Delivery::RequestFailed { reason, .. }] if reason == "answered HTTP 403 (Forbidden): nope"),
            "{got:?}"
        );
    }
    /// The loopback listener the authorization asked for.
    fn listener_asked(oauth: &[crate::io::OAuthAction]) -> crate::ids::ListenerId {
        oauth
            .iter()
            .find_map(|a| {
                if let crate::io::OAuthAction::Listen { listener, .. } = a {
                    Some(*listener)
                } else {
                    None
                }
            })
            .expect("the loopback listener is asked for")
    }

    /// `initialize` (id 1) goes out and is answered `401` with a bare `Bearer` challenge.
    fn challenged_initialize(rig: &mut Rig) {
        rig.send(
            frame(
                FrameKind::Initialize(McpRequestId(1)),
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
            ),
            None,
        );
        let (sent, _) = rig.sent();
        rig.answer(sent[0].seq, 401, &[("www-authenticate", "Bearer")], "");
    }

    /// A server behind a login (a pre-registered public client, authorization code): its
    /// `initialize` is challenged, the metadata read and the loopback listener opened; returns
    /// the deliveries of the listener's opening (the login).
    fn login_until_browse(rig: &mut Rig) -> Vec<Delivery> {
        challenged_initialize(rig);
        for _ in 0..6 {
            let (sent, _) = rig.sent();
            let Some(req) = sent.into_iter().next() else {
                break;
            };
            let body = if req.url.contains("/.well-known/oauth-protected-resource") {
                json!({"resource": "http://127.0.0.1:8/mcp", "authorization_servers": ["http://127.0.0.1:9"]})
            } else {
                json!({
                    "issuer": "http://127.0.0.1:9",
                    "authorization_endpoint": "http://127.0.0.1:9/authorize",
                    "token_endpoint": "http://127.0.0.1:9/token",
                    "code_challenge_methods_supported": ["S256"],
                })
            };
            let got = rig.answer(
                req.seq,
                200,
                &[("content-type", "application/json")],
                &body.to_string(),
            );
            assert!(got.is_empty(), "{got:?}");
        }
        let listen = listener_asked(&rig.oauth);
        rig.t.on_oauth(
            OAuthInput::Listening {
                server: SLOT,
                listener: listen,
                result: Ok(4567),
            },
            &mut rig.out,
            &mut rig.timers,
        )
    }

    #[test]
    fn m11_the_login_url_is_delivered_for_the_client_and_a_decline_leaves_the_server_unauthorized()
    {
        let clients = json!({"servers": {"remote": {"client_id": "app"}}});
        let mut rig = Rig::with_oauth(&clients);
        let got = login_until_browse(&mut rig);
        let [Delivery::Login(url)] = &got[..] else {
            panic!("the URL for the user: {got:?}");
        };
        assert!(
            url.starts_with("http://127.0.0.1:9/authorize?response_type=code&client_id=app")
                && url.contains("redirect_uri=http%3A%2F%2F127.0.0.1%3A4567%2Fcallback"),
            "{url}"
        );
        let _ = rig.sent();
        assert!(
            !rig.oauth
                .iter()
                .any(|a| matches!(a, crate::io::OAuthAction::OpenBrowser { .. })),
            "the agent decides about $BROWSER: {:?}",
            rig.oauth
        );
        let got = rig.t.login_declined(&mut rig.out, &mut rig.timers);
        let [
            Delivery::Unauthorized(why),
            Delivery::RequestFailed { id, .. },
        ] = &got[..]
        else {
            panic!("{got:?}");
        };
        assert_eq!(*id, McpRequestId(1));
        assert_eq!(why, "not authorized: the authorization was declined");
        assert!(
            rig.t
                .login_declined(&mut rig.out, &mut rig.timers)
                .is_empty(),
            "a second decline changes nothing"
        );
    }

    #[test]
    fn m11_a_redirect_on_the_loopback_listener_ends_the_login() {
        let clients = json!({"servers": {"remote": {"client_id": "app"}}});
        let mut rig = Rig::with_oauth(&clients);
        let got = login_until_browse(&mut rig);
        let [Delivery::Login(url)] = &got[..] else {
            panic!("{got:?}");
        };
        let state = url
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix("state="))
            .expect("a state")
            .to_owned();
        let _ = rig.sent();
        let listener = listener_asked(&rig.oauth);
        let got = rig.t.on_oauth(
            OAuthInput::Callback {
                server: SLOT,
                listener,
                connection: 1,
                head: format!("GET /callback?code=c0de&state={state} HTTP/1.1\r\n\r\n")
                    .into_bytes(),
            },
            &mut rig.out,
            &mut rig.timers,
        );
        assert_eq!(
            got,
            [Delivery::LoginDone],
            "the user is done; the token is asked for"
        );
        let (sent, _) = rig.sent();
        assert!(
            sent.iter().any(|r| r.url == "http://127.0.0.1:9/token"),
            "{sent:?}"
        );
    }
}
