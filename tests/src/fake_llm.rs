//! A fake OpenAI-compatible LLM: a real TCP listener on 127.0.0.1 speaking HTTP/1.1, one thread
//! per connection, one request per connection (`connection: close`). Streaming replies use
//! `transfer-encoding: chunked`; each piece is written and flushed on its own so the agent sees the
//! splits the script asks for (SPEC L7, L9; DESIGN layer 5).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One HTTP request the agent made.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON; a body that is not JSON is kept as a JSON string.
    pub body: Value,
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The first header of that (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `body.messages` (Chat Completions), empty when absent.
    pub fn messages(&self) -> Vec<Value> {
        self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The function names of `body.tools`.
    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every assistant tool call in the history, in order: `(id, name, arguments string)`.
    pub fn assistant_tool_calls(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for m in self.messages() {
            if m["role"] != "assistant" {
                continue;
            }
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                out.push((
                    c["id"].as_str().unwrap_or_default().to_string(),
                    c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    c["function"]["arguments"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
        }
        out
    }

    /// Every `role:"tool"` message in order: `(tool_call_id, content as text)`.
    pub fn tool_results(&self) -> Vec<(String, String)> {
        self.messages()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (
                    m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                    content_text(&m["content"]),
                )
            })
            .collect()
    }

    /// The text of the tool result answering the assistant tool call of that id.
    pub fn tool_result_for(&self, call_id: &str) -> Option<String> {
        self.tool_results()
            .into_iter()
            .find(|(id, _)| id == call_id)
            .map(|(_, t)| t)
    }

    /// SPEC L4 on the wire: every assistant tool call is followed, before the next assistant
    /// message, by exactly one `role:"tool"` message with its id, and every tool message answers
    /// a call of the assistant message before it. Panics with the history when not.
    pub fn assert_tool_calls_paired(&self) {
        let msgs = self.messages();
        let mut open: Vec<String> = Vec::new();
        let fail = |why: String| -> ! {
            panic!(
                "L4 violated: {why}\nhistory: {}",
                serde_json::to_string_pretty(&msgs).unwrap_or_default()
            )
        };
        for (i, m) in msgs.iter().enumerate() {
            match m["role"].as_str() {
                Some("tool") => {
                    let id = m["tool_call_id"].as_str().unwrap_or_default();
                    match open.iter().position(|o| o == id) {
                        Some(p) => {
                            open.remove(p);
                        }
                        None => fail(format!(
                            "message {i}: tool result {id:?} answers no open tool call"
                        )),
                    }
                }
                role => {
                    if !open.is_empty() {
                        fail(format!(
                            "message {i} ({role:?}) comes while tool calls {open:?} have no result"
                        ));
                    }
                    if role == Some("assistant") {
                        for c in m["tool_calls"].as_array().into_iter().flatten() {
                            let id = c["id"].as_str().unwrap_or_default().to_string();
                            if id.is_empty() || open.contains(&id) {
                                fail(format!(
                                    "message {i}: empty or repeated tool call id {id:?}"
                                ));
                            }
                            open.push(id);
                        }
                    }
                }
            }
        }
        if !open.is_empty() {
            fail(format!(
                "tool calls {open:?} have no result at the end of the history"
            ));
        }
    }
}

/// The text of a Chat Completions `content`: a string, or the `text` of its parts joined.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

#[derive(Debug, Clone)]
enum Body {
    /// A Chat Completions stream built from its parts at serve time.
    Chat {
        text: Option<String>,
        calls: Vec<(String, String, String)>,
        finish: String,
        usage: Option<(u64, u64)>,
        done: bool,
    },
    /// SSE text sent verbatim (one chunk, unless split).
    RawSse(String),
    /// A plain response with `content-length`.
    Status {
        code: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
}

/// What the fake LLM answers to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    body: Body,
    split_every: Option<usize>,
    stall_after_ms: Option<u64>,
    delay_ms: u64,
}

impl Reply {
    fn new(body: Body) -> Self {
        Reply {
            body,
            split_every: None,
            stall_after_ms: None,
            delay_ms: 0,
        }
    }

    /// Streamed assistant text (several `content` deltas), finish `stop`, a usage-only chunk
    /// (`choices: []`), `data: [DONE]`.
    pub fn text(s: impl Into<String>) -> Self {
        Reply::new(Body::Chat {
            text: Some(s.into()),
            calls: Vec::new(),
            finish: "stop".into(),
            usage: Some((100, 10)),
            done: true,
        })
    }

    /// Tool calls `(id, name, arguments)`, finish `tool_calls`. Each call's arguments are
    /// streamed across at least two deltas; id, type and name only on the first.
    pub fn tool_calls(calls: Vec<(&str, &str, Value)>) -> Self {
        Reply::tool_calls_raw(
            calls
                .into_iter()
                .map(|(i, n, a)| (i, n, a.to_string()))
                .collect(),
        )
    }

    /// Like [`Reply::tool_calls`] with the arguments string sent as given (invalid JSON, `""`).
    pub fn tool_calls_raw(calls: Vec<(&str, &str, String)>) -> Self {
        Reply::new(Body::Chat {
            text: None,
            calls: calls
                .into_iter()
                .map(|(i, n, a)| (i.to_string(), n.to_string(), a))
                .collect(),
            finish: "tool_calls".into(),
            usage: Some((100, 10)),
            done: true,
        })
    }

    /// SSE body sent verbatim.
    pub fn raw_sse(body: impl Into<String>) -> Self {
        Reply::new(Body::RawSse(body.into()))
    }

    /// A non-streaming response: status, extra headers, body (sent with `content-length`).
    pub fn status(code: u16, headers: Vec<(&str, &str)>, body: impl Into<String>) -> Self {
        Reply::new(Body::Status {
            code,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.into(),
        })
    }

    /// Streamed text before the tool calls (chat replies only).
    pub fn with_text(mut self, s: impl Into<String>) -> Self {
        if let Body::Chat { text, .. } = &mut self.body {
            *text = Some(s.into());
        }
        self
    }

    /// The `finish_reason` of the final choice chunk (chat replies only), e.g. `length`.
    pub fn finish_reason(mut self, reason: &str) -> Self {
        if let Body::Chat { finish, .. } = &mut self.body {
            *finish = reason.to_string();
        }
        self
    }

    /// Usage `(prompt_tokens, completion_tokens)` of the usage-only chunk; `None` omits it.
    pub fn usage(mut self, u: Option<(u64, u64)>) -> Self {
        if let Body::Chat { usage, .. } = &mut self.body {
            *usage = u;
        }
        self
    }

    /// Leaves out the `data: [DONE]` line (chat replies only).
    pub fn without_done(mut self) -> Self {
        if let Body::Chat { done, .. } = &mut self.body {
            *done = false;
        }
        self
    }

    /// Writes the body in pieces of `n` bytes (ignoring event boundaries, so lines and UTF-8
    /// characters are cut), each flushed, with a ~1 ms pause between them.
    pub fn split_every(mut self, n: usize) -> Self {
        self.split_every = Some(n.max(1));
        self
    }

    /// After the body pieces, keeps the socket open and silent for `ms`, then closes it
    /// **without** the terminating zero-length chunk, so the HTTP body never ends cleanly.
    /// `stall_after_ms(0)` cuts the stream right after the pieces.
    pub fn stall_after_ms(mut self, ms: u64) -> Self {
        self.stall_after_ms = Some(ms);
        self
    }

    /// Waits `ms` before sending the response head.
    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.delay_ms = ms;
        self
    }

    /// The SSE body as the pieces written one by one (before `split_every`).
    pub fn sse_pieces(&self) -> Vec<String> {
        match &self.body {
            Body::Chat {
                text,
                calls,
                finish,
                usage,
                done,
            } => chat_events(text.as_deref(), calls, finish, *usage, *done),
            Body::RawSse(s) => vec![s.clone()],
            Body::Status { .. } => Vec::new(),
        }
    }
}

fn chunk(delta: Value, finish: Value) -> String {
    let obj = json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {obj}\n\n")
}

/// Splits `s` into about `parts` pieces on character boundaries (each non-empty).
fn split_chars(s: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(parts.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn chat_events(
    text: Option<&str>,
    calls: &[(String, String, String)],
    finish: &str,
    usage: Option<(u64, u64)>,
    done: bool,
) -> Vec<String> {
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(text) = text {
        for piece in split_chars(text, 3) {
            out.push(chunk(json!({"content": piece}), Value::Null));
        }
    }
    for (index, (id, name, args)) in calls.iter().enumerate() {
        let mut pieces = split_chars(args, 3);
        while pieces.len() < 2 {
            pieces.push(String::new());
        }
        for (k, piece) in pieces.into_iter().enumerate() {
            let call = if k == 0 {
                json!({"index": index, "id": id, "type": "function",
                       "function": {"name": name, "arguments": piece}})
            } else {
                json!({"index": index, "function": {"arguments": piece}})
            };
            out.push(chunk(json!({"tool_calls": [call]}), Value::Null));
        }
    }
    out.push(chunk(json!({}), json!(finish)));
    if let Some((prompt, completion)) = usage {
        let obj = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "test-model",
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        });
        out.push(format!("data: {obj}\n\n"));
    }
    if done {
        out.push("data: [DONE]\n\n".to_string());
    }
    out
}

type Handler = dyn Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static;

struct Shared {
    requests: Mutex<Vec<RecordedRequest>>,
    handler: Box<Handler>,
    stop: AtomicBool,
}

/// The fake LLM server. Dropping it stops the accept loop.
pub struct FakeLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// Body of the 500 answered when a script runs out.
pub const EXHAUSTED_BODY: &str = r#"{"error":{"message":"fake llm: script exhausted"}}"#;

impl FakeLlm {
    /// The n-th request gets the n-th reply; past the end, HTTP 500 with [`EXHAUSTED_BODY`].
    pub fn scripted(replies: Vec<Reply>) -> Self {
        FakeLlm::with_handler(move |i, _| {
            replies.get(i).cloned().unwrap_or_else(|| {
                Reply::status(
                    500,
                    vec![("content-type", "application/json")],
                    EXHAUSTED_BODY,
                )
            })
        })
    }

    /// Every request is answered by `handler(request index, request)`.
    pub fn with_handler(
        handler: impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake llm: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake llm: local addr");
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            handler: Box::new(handler),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("fake-llm-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("fake-llm-conn".into())
                        .spawn(move || {
                            let _ = serve_connection(conn, &s);
                        });
                }
            })
            .expect("fake llm: spawn accept thread");
        FakeLlm {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// `http://127.0.0.1:PORT/v1`, the value for `OPENAI_COMPAT_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT`, e.g. for `ANTHROPIC_BASE_URL`.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Waits until at least `n` requests arrived; returns them.
    pub fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<RecordedRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.requests();
            if r.len() >= n || Instant::now() >= deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn read_request(conn: &TcpStream) -> std::io::Result<Option<RecordedRequest>> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            if size == 0 {
                let mut trailer = String::new();
                reader.read_line(&mut trailer)?;
                break;
            }
            let mut buf = vec![0; size + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(size);
            body.extend_from_slice(&buf);
        }
    } else if let Some(len) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body)?;
    }
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    Ok(Some(RecordedRequest {
        method,
        path,
        headers,
        body,
        received_at: Instant::now(),
    }))
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// Sleeps up to `ms`, returning early when the server is being dropped.
fn sleep_unless_stopped(ms: u64, shared: &Shared) {
    let deadline = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < deadline && !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5).min(deadline - Instant::now()));
    }
}

fn serve_connection(mut conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let Some(req) = read_request(&conn)? else {
        return Ok(());
    };
    if shared.stop.load(Ordering::SeqCst) {
        return Ok(());
    }
    let index = {
        let mut all = shared
            .requests
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        all.push(req.clone());
        all.len() - 1
    };
    let reply = (shared.handler)(index, &req);
    sleep_unless_stopped(reply.delay_ms, shared);
    match &reply.body {
        Body::Status {
            code,
            headers,
            body,
        } => {
            let mut head = format!("HTTP/1.1 {code} {}\r\n", reason_phrase(*code));
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            {
                head.push_str("content-type: application/json\r\n");
            }
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str(&format!(
                "content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            ));
            conn.write_all(head.as_bytes())?;
            conn.write_all(body.as_bytes())?;
            conn.flush()?;
        }
        Body::Chat { .. } | Body::RawSse(_) => {
            conn.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                  transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
            )?;
            conn.flush()?;
            let pieces: Vec<Vec<u8>> = match reply.split_every {
                Some(n) => {
                    let all: Vec<u8> = reply.sse_pieces().concat().into_bytes();
                    all.chunks(n).map(<[u8]>::to_vec).collect()
                }
                None => reply
                    .sse_pieces()
                    .into_iter()
                    .map(String::into_bytes)
                    .collect(),
            };
            for piece in pieces {
                if piece.is_empty() {
                    continue;
                }
                conn.write_all(format!("{:x}\r\n", piece.len()).as_bytes())?;
                conn.write_all(&piece)?;
                conn.write_all(b"\r\n")?;
                conn.flush()?;
                if reply.split_every.is_some() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if let Some(ms) = reply.stall_after_ms {
                sleep_unless_stopped(ms, shared);
                // Close without the terminating chunk: the body is cut.
                let _ = conn.shutdown(Shutdown::Both);
                return Ok(());
            }
            conn.write_all(b"0\r\n\r\n")?;
            conn.flush()?;
        }
    }
    let _ = conn.shutdown(Shutdown::Write);
    // Drain whatever the client still sends so the close is orderly.
    conn.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut sink = [0u8; 1024];
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one raw HTTP request; returns (head, de-chunked body, chunk sizes).
    fn raw_post(llm: &FakeLlm, body: &str) -> (String, String, Vec<usize>) {
        let addr = llm.addr;
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer k\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8(raw[..split].to_vec()).unwrap();
        let mut rest = &raw[split + 4..];
        if !head.contains("transfer-encoding: chunked") {
            return (head, String::from_utf8(rest.to_vec()).unwrap(), Vec::new());
        }
        let mut body = Vec::new();
        let mut sizes = Vec::new();
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
            let after = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            sizes.push(size);
            body.extend_from_slice(&after[..size]);
            assert_eq!(&after[size..size + 2], b"\r\n");
            rest = &after[size + 2..];
        }
        (head, String::from_utf8(body).unwrap(), sizes)
    }

    fn data_lines(body: &str) -> Vec<String> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap().to_string())
            .collect()
    }

    #[test]
    fn text_reply_streams_deltas_stop_usage_and_done_as_separate_chunks() {
        let llm = FakeLlm::scripted(vec![Reply::text("Hello, world! How are you?")]);
        let (head, body, sizes) = raw_post(&llm, r#"{"model":"m","stream":true}"#);
        assert!(head.starts_with("HTTP/1.1 200 OK"));
        assert!(head.contains("content-type: text/event-stream"));
        assert!(head.contains("connection: close"));
        let lines = data_lines(&body);
        assert_eq!(sizes.len(), lines.len(), "one HTTP chunk per SSE event");
        assert_eq!(lines.last().unwrap(), "[DONE]");
        let events: Vec<Value> = lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello, world! How are you?");
        let deltas = events
            .iter()
            .filter(|e| {
                e["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
            .count();
        assert!(deltas >= 2, "text must come in several deltas");
        assert_eq!(
            events[events.len() - 2]["choices"][0]["finish_reason"],
            "stop"
        );
        assert_eq!(events[events.len() - 1]["choices"], json!([]));
        assert_eq!(events[events.len() - 1]["usage"]["total_tokens"], 110);
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].method, "POST");
        assert_eq!(reqs[0].path, "/v1/chat/completions");
        assert_eq!(reqs[0].header("Authorization"), Some("Bearer k"));
        assert_eq!(reqs[0].body["model"], "m");
    }

    #[test]
    fn tool_call_arguments_span_two_deltas_with_the_id_only_on_the_first() {
        let llm = FakeLlm::scripted(vec![
            Reply::tool_calls(vec![
                ("call_1", "fs__echo", json!({"text": "hi"})),
                ("call_2", "fs__add", json!({})),
            ])
            .with_text("Let me see."),
        ]);
        let (_, body, _) = raw_post(&llm, "{}");
        let lines = data_lines(&body);
        let events: Vec<Value> = lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut args = [String::new(), String::new()];
        let mut deltas = [0, 0];
        let mut ids = [Vec::new(), Vec::new()];
        for e in &events {
            for c in e["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let i = c["index"].as_u64().unwrap() as usize;
                deltas[i] += 1;
                args[i].push_str(c["function"]["arguments"].as_str().unwrap());
                if let Some(id) = c["id"].as_str() {
                    ids[i].push(id.to_string());
                }
            }
        }
        assert_eq!(
            serde_json::from_str::<Value>(&args[0]).unwrap(),
            json!({"text": "hi"})
        );
        assert_eq!(args[1], "{}");
        assert!(deltas[0] >= 2 && deltas[1] >= 2);
        assert_eq!(
            ids,
            [vec!["call_1".to_string()], vec!["call_2".to_string()]]
        );
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Let me see.");
        let finish: Vec<&Value> = events
            .iter()
            .map(|e| &e["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, vec![&json!("tool_calls")]);
    }

    #[test]
    fn split_every_cuts_the_body_into_small_chunks_and_exhausted_script_is_500() {
        let llm = FakeLlm::scripted(vec![Reply::text("naïve café 😀").split_every(7)]);
        let (_, body, sizes) = raw_post(&llm, "{}");
        assert!(sizes.iter().all(|&s| s <= 7) && sizes.len() > 10);
        assert!(body.ends_with("data: [DONE]\n\n"));
        assert!(body.contains("😀") || body.contains("\\ud83d"));
        let (head, body, _) = raw_post(&llm, "{}");
        assert!(head.starts_with("HTTP/1.1 500"), "{head}");
        assert_eq!(body, EXHAUSTED_BODY);
        assert_eq!(llm.requests().len(), 2);
    }

    #[test]
    fn status_reply_has_headers_and_content_length_and_stall_cuts_the_body() {
        let llm = FakeLlm::with_handler(|i, _| match i {
            0 => Reply::status(
                429,
                vec![("retry-after", "7")],
                r#"{"error":{"message":"slow down"}}"#,
            ),
            _ => Reply::raw_sse("data: {\"choices\":[]}\n\n").stall_after_ms(50),
        });
        let (head, body, _) = raw_post(&llm, "{}");
        assert!(head.starts_with("HTTP/1.1 429 Too Many Requests"));
        assert!(head.contains("retry-after: 7"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let started = Instant::now();
        let mut s = TcpStream::connect(llm.addr).unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let raw = String::from_utf8(raw).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(raw.contains("data: {\"choices\":[]}"));
        assert!(
            !raw.ends_with("0\r\n\r\n"),
            "a stalled body must not be terminated: {raw:?}"
        );
    }

    #[test]
    fn paired_history_passes_and_unanswered_call_fails() {
        let req = |messages: Value| RecordedRequest {
            method: "POST".into(),
            path: "/".into(),
            headers: vec![],
            body: json!({ "messages": messages }),
            received_at: Instant::now(),
        };
        let ok = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":"","tool_calls":[
                {"id":"a","type":"function","function":{"name":"x","arguments":"{}"}},
                {"id":"b","type":"function","function":{"name":"y","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"tool","tool_call_id":"b","content":"2"},
        ]));
        ok.assert_tool_calls_paired();
        assert_eq!(ok.tool_result_for("b").as_deref(), Some("2"));
        let bad = req(json!([
            {"role":"assistant","content":"","tool_calls":[
                {"id":"a","type":"function","function":{"name":"x","arguments":"{}"}}]},
            {"role":"user","content":"go on"},
        ]));
        assert!(std::panic::catch_unwind(|| bad.assert_tool_calls_paired()).is_err());
    }
}
