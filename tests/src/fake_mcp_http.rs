//! The fake MCP server over Streamable HTTP (MCP 2025-11-25 basic/transports), and over the
//! legacy HTTP+SSE transport (2024-11-05): the protocol logic of [`crate::fake_mcp`] (the same
//! `FAKE_MCP_*` variables) behind a small HTTP/1.1 server of its own on `127.0.0.1`. It runs as
//! the suite's own test binary with `BUZZ_E2E_ROLE=fake-mcp-http`, started by the test (not by
//! the agent) through [`HttpFake`].
//!
//! It rejects what the official SDKs' servers reject: a `POST` without `application/json` and
//! `text/event-stream` in `Accept` (406), a body that is not `application/json` (415), a request
//! after `initialize` without `Mcp-Session-Id` (400) or with an unknown one (404, as after a
//! restart: the sessions live in the process), one without `MCP-Protocol-Version` (400; the
//! spec says the client MUST send it), and a request other than `ping` in a session whose
//! `notifications/initialized` it has not received yet (400, as the official Python SDK's
//! server session refuses one "before initialization was complete": separate `POST`s may
//! reach a server in any order, so a client must not send a request before `initialized`
//! was accepted).
//!
//! | variable | effect |
//! |---|---|
//! | `FAKE_MCP_HTTP_PORT` | port to listen on (default 0: any; a restarted fake takes the old one) |
//! | `FAKE_MCP_HTTP_PORT_FILE` | the port is written there once listening |
//! | `FAKE_MCP_HTTP_MODE` | `sse` (default): a request's answer is an event stream (a priming event with an id, then the server's messages, then the response); `json`: one JSON body, server requests and notifications go on the `GET` stream; `legacy`: HTTP+SSE, a `GET /sse` stream whose `endpoint` event names `/messages?session=<id>` |
//! | `FAKE_MCP_HTTP_GET=0` | the `GET` stream is refused with `405` |
//! | `FAKE_MCP_HTTP_GET_DELAY_MS` | the `GET` stream's head waits this long (a slow proxy or a loaded server); messages meanwhile have no stream |
//! | `FAKE_MCP_HTTP_DROP_UNROUTED=1` | a server message with no stream to take it is dropped, as the TypeScript SDK's transport does without an event store (default: kept for the next `GET` stream) |
//! | `FAKE_MCP_HTTP_TOKEN` | every request must carry `Authorization: Bearer <token>`, else `401` with a `WWW-Authenticate: Bearer` challenge |
//! | `FAKE_MCP_HTTP_TOKENS_FILE` | OAuth (SPEC M11, with [`crate::fake_oauth`]): a request must carry `Authorization: Bearer <token>` for a token listed in this file (`<token> <scope>...` per line, read per request), else `401` with `WWW-Authenticate: Bearer resource_metadata="<FAKE_MCP_HTTP_RESOURCE_METADATA>"` |
//! | `FAKE_MCP_HTTP_TOOL_SCOPES` | `tool=scope,...`: a `tools/call` of that tool with a token lacking the scope gets `403` with `error="insufficient_scope", scope="<scope>"` |
//! | `FAKE_MCP_HTTP_FAULT` | `method=fault,...`: a request of that JSON-RPC method is answered with the fault instead (see [`Fault`]): `html` (a `502` HTML error page, as a proxy in front of a dead server), `mid500` (an event stream cut after its priming event by a proxy's `500` page; a resumption `GET` gets the `500` too), `endless` (the response, then the stream never ends), `big` (a 10 MiB JSON body), `redirect` (a `307` back to the same URL, a redirect loop) |
//! | `FAKE_MCP_HTTP_LOG` | one JSON line per HTTP request: `method`, `path`, `session`, `version`, `accept`, `auth` (whether it carried one), `last_event_id`, `status`, `body`, `headers` (all but `authorization`) |
//!
//! Messages the server sends that are not a response (server requests, notifications) go on
//! the stream of the newest request still waiting for its response (`sse` mode), else on the
//! `GET` stream, else they wait for the `GET` stream to open.

use crate::fake_mcp::{self, Config, Out};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A proxy's or a broken server's answer to one request (`FAKE_MCP_HTTP_FAULT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `502 Bad Gateway` with `content-type: text/html` and an HTML page.
    Html,
    /// `200` with an event stream: the priming event (with an id), half an event, then a
    /// proxy's `500` page written into the stream and the connection closed.
    Mid500,
    /// The response on an event stream that is never ended (keep-alive comments every second).
    Endless,
    /// A JSON response with a 10 MiB text result.
    Big,
    /// `307 Temporary Redirect` to the URL it was sent to.
    Redirect,
}

/// The HTML page of [`Fault::Html`] and [`Fault::Mid500`].
const ERROR_PAGE: &str = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><h1>502 Bad Gateway</h1><hr><center>nginx</center></body></html>\n";

/// How answers are carried (`FAKE_MCP_HTTP_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Streamable HTTP, every request answered with an event stream.
    Sse,
    /// Streamable HTTP, every request answered with a JSON body.
    Json,
    /// HTTP+SSE (2024-11-05).
    Legacy,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where the server's messages go.
struct Router {
    mode: Mode,
    /// Requests waiting for their response: the JSON text of the id, and the stream it goes to.
    pending: Mutex<Vec<(String, Sender<String>)>>,
    /// The `GET` stream (legacy: the stream of every message).
    get: Mutex<Option<Sender<String>>>,
    /// Messages with nowhere to go yet.
    queue: Mutex<Vec<String>>,
    /// `FAKE_MCP_HTTP_DROP_UNROUTED=1`: such messages are dropped instead.
    drop_unrouted: bool,
    /// Bytes written by the server not yet ending in a newline.
    partial: Mutex<Vec<u8>>,
}

impl Router {
    fn dispatch(&self, line: &str) {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            return; // the FAKE_MCP_GARBAGE banners: stdout noise, no HTTP message
        };
        if msg.get("method").is_none()
            && let Some(id) = msg.get("id")
        {
            let key = id.to_string();
            let pending = lock(&self.pending);
            if let Some((_, tx)) = pending.iter().find(|(k, _)| *k == key) {
                let _ = tx.send(line.to_string());
                return;
            }
        }
        if self.mode == Mode::Sse {
            let pending = lock(&self.pending);
            if let Some((_, tx)) = pending.last()
                && tx.send(line.to_string()).is_ok()
            {
                return;
            }
        }
        let mut get = lock(&self.get);
        if let Some(tx) = get.as_ref() {
            if tx.send(line.to_string()).is_ok() {
                return;
            }
            *get = None;
        }
        if !self.drop_unrouted {
            lock(&self.queue).push(line.to_string());
        }
    }
}

/// The fake's `Out`: lines written are routed to HTTP streams.
struct RouterWriter(Arc<Router>);

impl Write for RouterWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let lines: Vec<String> = {
            let mut partial = lock(&self.0.partial);
            partial.extend_from_slice(buf);
            let mut lines = Vec::new();
            while let Some(at) = partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = partial.drain(..=at).collect();
                lines.push(String::from_utf8_lossy(&line).trim_end().to_string());
            }
            lines
        };
        for line in lines.iter().filter(|l| !l.is_empty()) {
            self.0.dispatch(line);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One request as read off the socket.
struct HttpRequest {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request (`None` at EOF or on garbage: the connection ends). Bodies with
/// `Content-Length` or `Transfer-Encoding: chunked`.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<HttpRequest> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut req = HttpRequest {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            req.body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = req.header("content-length") {
        let n: usize = n.parse().ok()?;
        req.body = vec![0; n];
        r.read_exact(&mut req.body).ok()?;
    }
    Some(req)
}

/// The server: the fake's logic, the router, the sessions it gave out.
struct HttpServer {
    mode: Mode,
    get_allowed: bool,
    /// `FAKE_MCP_HTTP_GET_DELAY_MS`: how long the `GET` stream's head waits.
    get_delay: Duration,
    token: Option<String>,
    /// OAuth: the file of accepted tokens, the metadata URL of the challenge, and the scope
    /// each named tool needs.
    tokens_file: Option<PathBuf>,
    resource_metadata: Option<String>,
    tool_scopes: Vec<(String, String)>,
    log: Option<PathBuf>,
    /// `FAKE_MCP_HTTP_FAULT`: the fault of each JSON-RPC method named.
    faults: Vec<(String, Fault)>,
    router: Arc<Router>,
    handle: fake_mcp::Handle,
    sessions: Mutex<BTreeSet<String>>,
    /// The sessions whose `notifications/initialized` arrived.
    initialized: Mutex<BTreeSet<String>>,
    next: AtomicU64,
    event_ids: AtomicU64,
}

/// Writes a whole response with a body.
fn respond(w: &mut TcpStream, status: u16, headers: &[(&str, String)], body: &[u8]) -> bool {
    let reason = match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        307 => "Temporary Redirect",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        415 => "Unsupported Media Type",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        _ => "Status",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut all = head.into_bytes();
    all.extend_from_slice(body);
    w.write_all(&all).and_then(|()| w.flush()).is_ok()
}

fn rpc_error(message: &str) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message}})
        .to_string()
        .into_bytes()
}

/// One chunk of a chunked body.
fn chunk(w: &mut TcpStream, text: &str) -> bool {
    let frame = format!("{:x}\r\n{text}\r\n", text.len());
    w.write_all(frame.as_bytes())
        .and_then(|()| w.flush())
        .is_ok()
}

impl HttpServer {
    fn log(&self, req: &HttpRequest, status: u16) {
        let Some(path) = &self.log else { return };
        let entry = json!({
            "method": req.method,
            "path": req.path,
            "session": req.header("mcp-session-id"),
            "version": req.header("mcp-protocol-version"),
            "accept": req.header("accept"),
            "auth": req.header("authorization").is_some(),
            "last_event_id": req.header("last-event-id"),
            "status": status,
            "body": String::from_utf8_lossy(&req.body),
            "headers": req.headers.iter().filter(|(k, _)| k != "authorization")
                .map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
        });
        // One write per line (concurrent connections log concurrently; O_APPEND keeps each
        // write whole).
        let line = format!("{entry}\n");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// Answers one refused request; `false`: the connection is gone.
    fn refuse(&self, w: &mut TcpStream, req: &HttpRequest, status: u16, why: &str) -> bool {
        self.log(req, status);
        let mut headers = vec![("content-type", "application/json".to_string())];
        if status == 401 {
            headers.push(("www-authenticate", r#"Bearer realm="fake-mcp""#.to_string()));
        }
        respond(w, status, &headers, &rpc_error(why))
    }

    /// OAuth (SPEC M11): `None` when the request may go on; else the challenge answered.
    fn oauth_refusal(&self, req: &HttpRequest) -> Option<(u16, String)> {
        let file = self.tokens_file.as_ref()?;
        let metadata = self
            .resource_metadata
            .as_ref()
            .map_or(String::new(), |m| format!(r#" resource_metadata="{m}""#));
        let listed = std::fs::read_to_string(file).unwrap_or_default();
        let presented = req
            .header("authorization")
            .and_then(|a| a.strip_prefix("Bearer "));
        let scopes: Option<Vec<String>> = presented.and_then(|t| {
            listed.lines().find_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some(t)).then(|| words.map(str::to_owned).collect())
            })
        });
        let Some(scopes) = scopes else {
            let error = if presented.is_some() {
                r#" error="invalid_token","#
            } else {
                ""
            };
            return Some((401, format!("Bearer{error}{metadata}")));
        };
        let msg: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        if msg["method"] == "tools/call" {
            let tool = msg["params"]["name"].as_str().unwrap_or("");
            if let Some((_, needed)) = self.tool_scopes.iter().find(|(t, _)| t == tool)
                && !scopes.contains(needed)
            {
                return Some((
                    403,
                    format!(r#"Bearer error="insufficient_scope", scope="{needed}",{metadata}"#),
                ));
            }
        }
        None
    }

    /// The checks every request after `initialize` passes; `Err((status, why))`.
    fn check_session(&self, req: &HttpRequest) -> Result<String, (u16, &'static str)> {
        let Some(id) = req.header("mcp-session-id") else {
            return Err((400, "Bad Request: Mcp-Session-Id header is required"));
        };
        if !lock(&self.sessions).contains(id) {
            return Err((404, "Session not found"));
        }
        if req.header("mcp-protocol-version").is_none() {
            return Err((400, "Bad Request: MCP-Protocol-Version header is required"));
        }
        Ok(id.to_string())
    }

    fn serve_connection(self: &Arc<Self>, stream: TcpStream) {
        let Ok(read_half) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(read_half);
        let mut w = stream;
        while let Some(req) = read_request(&mut reader) {
            // As the SDKs' servers: no metadata of its own (an authorization server's fake
            // serves it, SPEC M11), a plain 404.
            if req.path.starts_with("/.well-known/") {
                if !self.refuse(&mut w, &req, 404, "Not Found") {
                    return;
                }
                continue;
            }
            if let Some((status, challenge)) = self.oauth_refusal(&req) {
                self.log(&req, status);
                let headers = [
                    ("content-type", "application/json".to_string()),
                    ("www-authenticate", challenge),
                ];
                if !respond(&mut w, status, &headers, &rpc_error("Unauthorized")) {
                    return;
                }
                continue;
            }
            if let Some(token) = &self.token
                && req.header("authorization") != Some(&format!("Bearer {token}"))
            {
                if !self.refuse(&mut w, &req, 401, "Unauthorized") {
                    return;
                }
                continue;
            }
            let keep = match (req.method.as_str(), self.mode) {
                ("POST", Mode::Legacy) => self.legacy_post(&mut w, &req),
                ("GET", Mode::Legacy) => self.legacy_stream(&mut w, &req),
                ("POST", _) => self.post(&mut w, &req),
                ("GET", _) => self.get(&mut w, &req),
                ("DELETE", _) => match self.check_session(&req) {
                    Ok(id) => {
                        lock(&self.sessions).remove(&id);
                        self.log(&req, 200);
                        respond(&mut w, 200, &[], b"")
                    }
                    Err((status, why)) => self.refuse(&mut w, &req, status, why),
                },
                _ => self.refuse(&mut w, &req, 405, "Method Not Allowed"),
            };
            if !keep {
                return;
            }
        }
    }

    fn post(&self, w: &mut TcpStream, req: &HttpRequest) -> bool {
        let accept = req.header("accept").unwrap_or("");
        if !(accept.contains("application/json") && accept.contains("text/event-stream")) {
            return self.refuse(
                w,
                req,
                406,
                "Not Acceptable: Client must accept both application/json and text/event-stream",
            );
        }
        if !req
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
        {
            return self.refuse(
                w,
                req,
                415,
                "Unsupported Media Type: Content-Type must be application/json",
            );
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&req.body) else {
            return self.refuse(w, req, 400, "Parse error");
        };
        let is_init = msg["method"] == "initialize";
        let session = if is_init {
            let id = format!(
                "fake-{}-{}",
                std::process::id(),
                self.next.fetch_add(1, Ordering::SeqCst)
            );
            lock(&self.sessions).insert(id.clone());
            id
        } else {
            match self.check_session(req) {
                Ok(id) => id,
                Err((status, why)) => return self.refuse(w, req, status, why),
            }
        };
        let text = msg.to_string();
        if msg["method"] == "notifications/initialized" {
            lock(&self.initialized).insert(session.clone());
        }
        let request = msg.get("id").is_some() && msg.get("method").is_some();
        if request
            && !is_init
            && msg["method"] != "ping"
            && !lock(&self.initialized).contains(&session)
        {
            return self.refuse(
                w,
                req,
                400,
                "Bad Request: Received request before initialization was complete",
            );
        }
        let Some(id) = msg.get("id").filter(|_| msg.get("method").is_some()) else {
            // A notification or a response: accepted, handled.
            self.log(req, 202);
            self.handle.handle_line(&text);
            return respond(w, 202, &[], b"");
        };
        let fault = self.fault_of(&msg);
        if let Some(fault) = fault.filter(|f| *f != Fault::Endless) {
            return self.fault(w, req, fault, id, &session);
        }
        self.log(req, 200);
        let (tx, rx) = mpsc::channel();
        let key = id.to_string();
        lock(&self.router.pending).push((key.clone(), tx));
        self.handle.handle_line(&text);
        let endless = fault == Some(Fault::Endless);
        let keep = self.answer(w, &rx, &key, &session, endless);
        lock(&self.router.pending).retain(|(k, _)| *k != key);
        keep
    }

    /// The fault `FAKE_MCP_HTTP_FAULT` names for the method of request `msg`.
    fn fault_of(&self, msg: &Value) -> Option<Fault> {
        let method = msg["method"].as_str()?;
        self.faults
            .iter()
            .find(|(m, _)| m == method)
            .map(|(_, f)| *f)
    }

    /// Answers request `id` with `fault` (not [`Fault::Endless`], which [`Self::answer`]
    /// plays). `false`: the connection is to be closed.
    fn fault(
        &self,
        w: &mut TcpStream,
        req: &HttpRequest,
        fault: Fault,
        id: &Value,
        session: &str,
    ) -> bool {
        let html = ("content-type", "text/html; charset=utf-8".to_string());
        match fault {
            Fault::Html => {
                self.log(req, 502);
                respond(w, 502, &[html], ERROR_PAGE.as_bytes())
            }
            Fault::Redirect => {
                self.log(req, 307);
                respond(w, 307, &[("location", req.path.clone())], b"")
            }
            Fault::Big => {
                self.log(req, 200);
                let text = "x".repeat(10 << 20);
                let body = json!({"jsonrpc": "2.0", "id": id,
                                  "result": {"content": [{"type": "text", "text": text}]}});
                let headers = [
                    ("content-type", "application/json".to_string()),
                    ("mcp-session-id", session.to_string()),
                ];
                respond(w, 200, &headers, body.to_string().as_bytes())
            }
            Fault::Mid500 | Fault::Endless => {
                self.log(req, 200);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nmcp-session-id: {session}\r\n\r\n"
                );
                let prime = self.event_ids.fetch_add(1, Ordering::SeqCst);
                let cut = format!(
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/html\r\n\r\n{ERROR_PAGE}"
                );
                let _ = w.write_all(head.as_bytes()).is_ok()
                    && chunk(w, &format!("id: {prime}\ndata: \n\n"))
                    && chunk(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",")
                    && w.write_all(cut.as_bytes()).and_then(|()| w.flush()).is_ok();
                false
            }
        }
    }

    /// Waits for the response to request `key` and writes it (`sse`: with the messages before
    /// it; `endless`: the stream is never ended after it). `false`: the client went away.
    fn answer(
        &self,
        w: &mut TcpStream,
        rx: &Receiver<String>,
        key: &str,
        session: &str,
        endless: bool,
    ) -> bool {
        let is_response = |line: &str| {
            serde_json::from_str::<Value>(line)
                .is_ok_and(|m| m.get("method").is_none() && m["id"].to_string().as_str() == key)
        };
        if self.mode == Mode::Json {
            loop {
                match rx.recv_timeout(Duration::from_secs(60)) {
                    Ok(line) if is_response(&line) => {
                        return respond(
                            w,
                            200,
                            &[
                                ("content-type", "application/json".into()),
                                ("mcp-session-id", session.into()),
                            ],
                            line.as_bytes(),
                        );
                    }
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nmcp-session-id: {session}\r\n\r\n"
        );
        if w.write_all(head.as_bytes()).is_err() {
            return false;
        }
        // The priming event (2025-11-25): an id and empty data.
        let prime = self.event_ids.fetch_add(1, Ordering::SeqCst);
        if !chunk(w, &format!("id: {prime}\ndata: \n\n")) {
            return false;
        }
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(line) => {
                    let n = self.event_ids.fetch_add(1, Ordering::SeqCst);
                    if !chunk(w, &format!("id: {n}\nevent: message\ndata: {line}\n\n")) {
                        return false;
                    }
                    if is_response(&line) && !endless {
                        return chunk(w, "");
                    }
                }
                // A comment: a client that went away is noticed by the write.
                Err(RecvTimeoutError::Timeout) => {
                    if !chunk(w, ": keep-alive\n\n") {
                        return false;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Streams `rx` as an event stream until the client goes away (`first`: an event before).
    fn stream(&self, w: &mut TcpStream, rx: &Receiver<String>, first: Option<String>) {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        if let Some(first) = first
            && !chunk(w, &first)
        {
            return;
        }
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(line) => {
                    let n = self.event_ids.fetch_add(1, Ordering::SeqCst);
                    if !chunk(w, &format!("id: {n}\nevent: message\ndata: {line}\n\n")) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if !chunk(w, ": keep-alive\n\n") {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Opens the router's `GET` stream: queued messages first.
    fn open_get(&self) -> Receiver<String> {
        let (tx, rx) = mpsc::channel();
        for line in lock(&self.router.queue).drain(..) {
            let _ = tx.send(line);
        }
        *lock(&self.router.get) = Some(tx);
        rx
    }

    fn get(&self, w: &mut TcpStream, req: &HttpRequest) -> bool {
        if req.header("last-event-id").is_some()
            && self.faults.iter().any(|(_, f)| *f == Fault::Mid500)
        {
            self.log(req, 500);
            let html = ("content-type", "text/html".to_string());
            return respond(w, 500, &[html], ERROR_PAGE.as_bytes());
        }
        if !self.get_allowed {
            return self.refuse(w, req, 405, "Method Not Allowed");
        }
        if !req
            .header("accept")
            .unwrap_or("")
            .contains("text/event-stream")
        {
            return self.refuse(
                w,
                req,
                406,
                "Not Acceptable: Client must accept text/event-stream",
            );
        }
        if let Err((status, why)) = self.check_session(req) {
            return self.refuse(w, req, status, why);
        }
        std::thread::sleep(self.get_delay);
        self.log(req, 200);
        let rx = self.open_get();
        self.stream(w, &rx, None);
        false
    }

    fn legacy_stream(&self, w: &mut TcpStream, req: &HttpRequest) -> bool {
        let id = format!(
            "legacy-{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::SeqCst)
        );
        lock(&self.sessions).insert(id.clone());
        self.log(req, 200);
        let rx = self.open_get();
        let endpoint = format!("event: endpoint\ndata: /messages?session={id}\n\n");
        self.stream(w, &rx, Some(endpoint));
        false
    }

    fn legacy_post(&self, w: &mut TcpStream, req: &HttpRequest) -> bool {
        let session = req
            .path
            .split_once("session=")
            .map(|(_, s)| s.to_string())
            .unwrap_or_default();
        if !lock(&self.sessions).contains(&session) {
            return self.refuse(w, req, 404, "Session not found");
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&req.body) else {
            return self.refuse(w, req, 400, "Parse error");
        };
        self.log(req, 202);
        let keep = respond(w, 202, &[], b"Accepted");
        self.handle.handle_line(&msg.to_string());
        keep
    }
}

/// The role's entry point: listens, writes the port file, serves until killed.
pub fn main() -> ! {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let cfg = Config::from_lookup(|k| std::env::var(k).ok());
    let mode = match get("FAKE_MCP_HTTP_MODE").as_deref() {
        Some("json") => Mode::Json,
        Some("legacy") => Mode::Legacy,
        _ => Mode::Sse,
    };
    let port: u16 = get("FAKE_MCP_HTTP_PORT")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake-mcp-http: cannot listen on port {port}: {e}");
            std::process::exit(3);
        }
    };
    let router = Arc::new(Router {
        mode,
        pending: Mutex::new(Vec::new()),
        get: Mutex::new(None),
        queue: Mutex::new(Vec::new()),
        drop_unrouted: get("FAKE_MCP_HTTP_DROP_UNROUTED").as_deref() == Some("1"),
        partial: Mutex::new(Vec::new()),
    });
    let out = Out::new(Box::new(RouterWriter(router.clone())));
    let exit: fake_mcp::Exit = Arc::new(|code| std::process::exit(code));
    let server = Arc::new(HttpServer {
        mode,
        get_allowed: get("FAKE_MCP_HTTP_GET").as_deref() != Some("0"),
        get_delay: Duration::from_millis(
            get("FAKE_MCP_HTTP_GET_DELAY_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        ),
        token: get("FAKE_MCP_HTTP_TOKEN"),
        tokens_file: get("FAKE_MCP_HTTP_TOKENS_FILE").map(PathBuf::from),
        resource_metadata: get("FAKE_MCP_HTTP_RESOURCE_METADATA"),
        tool_scopes: get("FAKE_MCP_HTTP_TOOL_SCOPES")
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| p.split_once('='))
            .map(|(t, s)| (t.trim().to_owned(), s.trim().to_owned()))
            .collect(),
        log: get("FAKE_MCP_HTTP_LOG").map(PathBuf::from),
        faults: get("FAKE_MCP_HTTP_FAULT")
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| p.split_once('='))
            .filter_map(|(m, f)| {
                let fault = match f.trim() {
                    "html" => Fault::Html,
                    "mid500" => Fault::Mid500,
                    "endless" => Fault::Endless,
                    "big" => Fault::Big,
                    "redirect" => Fault::Redirect,
                    _ => return None,
                };
                Some((m.trim().to_owned(), fault))
            })
            .collect(),
        router,
        handle: fake_mcp::start(cfg, out, exit),
        sessions: Mutex::new(BTreeSet::new()),
        initialized: Mutex::new(BTreeSet::new()),
        next: AtomicU64::new(1),
        event_ids: AtomicU64::new(1),
    });
    let bound = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    if let Some(p) = get("FAKE_MCP_HTTP_PORT_FILE") {
        // Written whole, then renamed: a reader never sees half a port.
        let tmp = format!("{p}.tmp");
        if std::fs::write(&tmp, bound.to_string())
            .and_then(|()| std::fs::rename(&tmp, &p))
            .is_err()
        {
            eprintln!("fake-mcp-http: cannot write {p}");
            std::process::exit(3);
        }
    }
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let server = server.clone();
        std::thread::spawn(move || server.serve_connection(stream));
    }
    std::process::exit(0)
}

/// The port a server process started by a test writes to `port_file` once it listens;
/// panics with `why()` when none came within `timeout`.
pub fn wait_port_file(port_file: &Path, timeout: Duration, why: impl Fn() -> String) -> u16 {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(p) = std::fs::read_to_string(port_file)
            && let Ok(p) = p.trim().parse()
        {
            return p;
        }
        assert!(Instant::now() < deadline, "{}", why());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fake HTTP MCP server process started by a test; killed (and reaped) on drop.
pub struct HttpFake {
    child: Option<Child>,
    env: Vec<(String, String)>,
    dir: PathBuf,
    port: u16,
}

impl HttpFake {
    /// Starts one with `env` (`FAKE_MCP_*`, `FAKE_MCP_HTTP_*`), its files in `dir`.
    pub fn start(dir: &Path, env: &[(&str, &str)]) -> HttpFake {
        let mut fake = HttpFake {
            child: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir: dir.to_path_buf(),
            port: 0,
        };
        fake.spawn();
        fake
    }

    fn spawn(&mut self) {
        let port_file = self.dir.join(format!("fake-http-port-{}", self.port));
        let _ = std::fs::remove_file(&port_file);
        let child = Command::new(crate::harness::current_exe())
            .env("BUZZ_E2E_ROLE", "fake-mcp-http")
            .env("FAKE_MCP_HTTP_PORT", self.port.to_string())
            .env("FAKE_MCP_HTTP_PORT_FILE", &port_file)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the fake HTTP MCP server");
        self.child = Some(child);
        self.port = wait_port_file(&port_file, Duration::from_secs(10), || {
            "the fake HTTP MCP server did not start listening".into()
        });
    }

    /// `http://127.0.0.1:<port>/mcp` (legacy: `/sse`).
    pub fn url(&self) -> String {
        let legacy = self
            .env
            .iter()
            .any(|(k, v)| k == "FAKE_MCP_HTTP_MODE" && v == "legacy");
        let path = if legacy { "sse" } else { "mcp" };
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// An ACP `mcpServers` entry for it (`"type": "http"`, or `"sse"` for the legacy mode).
    pub fn entry(&self, name: &str, headers: &[(&str, &str)]) -> Value {
        let legacy = self.url().ends_with("/sse");
        let headers: Vec<Value> = headers
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        json!({"type": if legacy { "sse" } else { "http" }, "name": name, "url": self.url(), "headers": headers})
    }

    /// Kills it (its sessions die with it).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it and starts a new process on the same port: every session it gave out is
    /// unknown to the new one (a server restart).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for HttpFake {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a `FAKE_MCP_HTTP_LOG` file: one object per HTTP request, in order.
pub fn read_http_log(path: &str) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The JSON-RPC `method` of a logged `POST` (`None` for responses and other requests).
pub fn posted_method(entry: &Value) -> Option<String> {
    let body: Value = serde_json::from_str(entry["body"].as_str()?).ok()?;
    body["method"].as_str().map(str::to_string)
}

/// The sessions and methods of the logged `POST`s, for messages: `(method or "", session)`.
pub fn posts(log: &[Value]) -> Vec<(String, Option<String>)> {
    log.iter()
        .filter(|e| e["method"] == "POST")
        .map(|e| {
            (
                posted_method(e).unwrap_or_default(),
                e["session"].as_str().map(str::to_string),
            )
        })
        .collect()
}
