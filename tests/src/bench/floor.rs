//! The IO floor: the harness plays the agent's part itself, with no agent between. It sends the
//! same LLM requests (the same Chat Completions bodies, byte for byte in shape: the whole
//! history every round, over one kept-alive connection), reads the same SSE streams, makes the
//! same MCP round trips (`tools/call` on the fake MCP server processes, `_Stop` hooks called
//! concurrently) and writes the same ACP `session/update` lines to a pipe that a reader thread
//! reads and parses, as the ACP client does with an agent's stdout.
//!
//! It does the least each round must do: the history is kept serialised and only the new
//! messages are serialised; each SSE event and each MCP reply is parsed once. Its CPU is the
//! CPU of the one thread that does all this (`CLOCK_THREAD_CPUTIME_ID`, ns resolution); the fake
//! LLM, the fake MCP servers and the ACP reader are not counted, as they are not for an agent.

use super::{Figures, Metric, PROMPT, Server, Workload, ms};
use crate::fake_llm::{FakeLlm, Wire};
use crate::harness::SECRET_KEY;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `max_tokens` the agents send by default.
const MAX_TOKENS: u32 = 32768;

/// Runs `workload` once as the floor.
pub fn run(workload: &Workload) -> Result<Figures, String> {
    let cpu_before = thread_cpu();
    let split_before = thread_cpu_split();
    let mut figures = match workload {
        Workload::Startup { .. } => startup(workload),
        _ => session(workload),
    }
    .map_err(|e| format!("floor: {e}"))?;
    // The start-up workload counts its CPU before the reference measurement it ends with.
    figures
        .entry(Metric::Cpu)
        .or_insert_with(|| ms(thread_cpu().saturating_sub(cpu_before)));
    if !matches!(workload, Workload::Startup { .. }) {
        let (user, system) = thread_cpu_split();
        figures.insert(Metric::UserTime, ms(user.saturating_sub(split_before.0)));
        figures.insert(
            Metric::SystemTime,
            ms(system.saturating_sub(split_before.1)),
        );
    }
    Ok(figures)
}

/// The CPU time of the calling thread.
pub(super) fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The user and system CPU time of the calling thread (`getrusage(RUSAGE_THREAD)`; the kernel
/// splits the total by tick sampling).
fn thread_cpu_split() -> (Duration, Duration) {
    // SAFETY: an all-zero rusage is a valid value; getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is valid and writable for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (d(usage.ru_utime), d(usage.ru_stime))
}

type Res<T> = Result<T, String>;

fn io<T>(what: &str, r: std::io::Result<T>) -> Res<T> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// `initialize` timing, then `session/new`-equivalent start-up of the workload's servers (the
/// CPU figure ends here, as an agent's is read after `session/new`), then the slowest of them
/// alone.
fn startup(workload: &Workload) -> Res<Figures> {
    let cpu_before = thread_cpu();
    let mut figures = Figures::new();
    let plain = Server {
        name: "plain".into(),
        env: vec![("FAKE_MCP_TOOLS".into(), "echo".into())],
    };
    let started = Instant::now();
    let mut one = Mcp::spawn(&plain)?;
    one.send_initialize()?;
    one.recv_reply()?;
    figures.insert(Metric::Initialize, ms(started.elapsed()));
    one.close();

    let servers = workload.servers();
    let started = Instant::now();
    let all = start_servers(&servers)?;
    figures.insert(Metric::SessionNew, ms(started.elapsed()));
    figures.insert(Metric::Cpu, ms(thread_cpu().saturating_sub(cpu_before)));
    for m in all {
        m.close();
    }

    if let Some(slowest) = servers.last() {
        let started = Instant::now();
        let alone = start_servers(std::slice::from_ref(slowest))?;
        figures.insert(Metric::SlowestServer, ms(started.elapsed()));
        for m in alone {
            m.close();
        }
    }
    Ok(figures)
}

/// Spawns `servers` and runs their handshakes concurrently: every `initialize` is written before
/// any reply is read, then every `tools/list`.
pub(super) fn start_servers(servers: &[Server]) -> Res<Vec<Mcp>> {
    let mut all: Vec<Mcp> = servers.iter().map(Mcp::spawn).collect::<Res<_>>()?;
    for m in &mut all {
        m.send_initialize()?;
    }
    for m in &mut all {
        m.recv_reply()?;
        m.notify("notifications/initialized", json!({}))?;
        m.send_request("tools/list", json!({}))?;
    }
    for m in &mut all {
        let list = m.recv_reply()?;
        m.tools = list["tools"].as_array().cloned().unwrap_or_default();
    }
    Ok(all)
}

/// A prompt-driven workload: the MCP servers start, then one prompt's rounds run.
fn session(workload: &Workload) -> Res<Figures> {
    let llm = workload.fake_llm();
    let mut servers = start_servers(&workload.servers())?;
    let mut acp = Acp::start()?;
    let mut http = Http::new(&llm);
    let mut history = History::new(PROMPT);
    let tools = tool_definitions(&servers);

    let started = Instant::now();
    let mut gates = 0;
    loop {
        let body = history.request_body(&tools);
        let mut turn = Turn::default();
        http.post(Wire::Chat.path(), body, |data| turn.event(data, &mut acp))?;
        if let Some(e) = turn.failed {
            return Err(e);
        }
        if turn.calls.is_empty() {
            if let Workload::HookGate { .. } = workload {
                gates += 1;
                let objections = stop_gate(&mut servers, gates)?;
                if !objections.is_empty() {
                    history.push_text_reply(&turn.text);
                    for (server, text) in objections {
                        history.push_hook(&server, &text, gates);
                    }
                    continue;
                }
            }
            break;
        }
        history.push_calls(&turn.text, &turn.calls);
        for (n, call) in turn.calls.iter().enumerate() {
            let text = tool_call(&mut servers, call, &mut acp, n)?;
            history.push_result(&call.id, &text);
        }
    }
    let mut figures = Figures::new();
    figures.insert(Metric::PromptWall, ms(started.elapsed()));
    for m in servers {
        m.close();
    }
    let lines = acp.finish()?;
    if llm.request_count() != workload.llm_requests() {
        return Err(format!(
            "{} LLM requests, expected {}",
            llm.request_count(),
            workload.llm_requests()
        ));
    }
    super::add_llm_figures(&mut figures, &llm);
    if let Workload::Stream { .. } = workload {
        let latencies =
            super::stream_latencies(&workload.reply(0), Wire::Chat, &llm.piece_writes(), &lines)?;
        super::add_latencies(&mut figures, &latencies);
    }
    Ok(figures)
}

/// The Chat Completions `tools` array of the servers' model tools (hooks, `_`-named, excluded),
/// as compact JSON: `{"function":{"description","name":"<server>__<tool>","parameters"},
/// "type":"function"}`.
pub(super) fn tool_definitions(servers: &[Mcp]) -> String {
    let tools: Vec<Value> = servers
        .iter()
        .flat_map(|m| {
            m.tools
                .iter()
                .filter(|t| !t["name"].as_str().unwrap_or("_").starts_with('_'))
                .map(move |t| {
                    json!({"type": "function", "function": {
                        "name": format!("{}__{}", m.name, t["name"].as_str().unwrap_or_default()),
                        "description": t["description"],
                        "parameters": t["inputSchema"],
                    }})
                })
        })
        .collect();
    Value::Array(tools).to_string()
}

/// Runs one model tool call on its server, with the ACP updates an agent sends around it;
/// returns the result text.
fn tool_call(servers: &mut [Mcp], call: &Call, acp: &mut Acp, n: usize) -> Res<String> {
    let (server, tool) = call
        .name
        .split_once("__")
        .ok_or_else(|| format!("tool name {:?} has no server prefix", call.name))?;
    let args: Value =
        serde_json::from_str(&call.arguments).map_err(|e| format!("tool arguments: {e}"))?;
    let id = format!("tc_{}_{n}", call.id);
    acp.update(
        json!({"sessionUpdate": "tool_call", "toolCallId": id, "title": call.name,
                      "kind": "other", "status": "pending", "rawInput": args}),
    )?;
    acp.update(
        json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
                      "status": "in_progress"}),
    )?;
    let m = servers
        .iter_mut()
        .find(|m| m.name == server)
        .ok_or_else(|| format!("no server {server:?}"))?;
    m.send_request("tools/call", json!({"name": tool, "arguments": args}))?;
    let result = m.recv_reply()?;
    let text = content_text(&result);
    acp.update(
        json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
                      "status": "completed", "rawOutput": {"isError": false},
                      "content": [{"type": "content", "content": {"type": "text", "text": text}}]}),
    )?;
    Ok(text)
}

/// Calls `_Stop` on every server that has it, concurrently (all requests written before any
/// reply is read); returns the non-empty answers `(server, text)` in server order.
fn stop_gate(servers: &mut [Mcp], attempt: usize) -> Res<Vec<(String, String)>> {
    let mut asked = Vec::new();
    for (k, m) in servers.iter_mut().enumerate() {
        if m.tools.iter().any(|t| t["name"] == "_Stop") {
            m.send_request(
                "tools/call",
                json!({"name": "_Stop", "arguments": {}, "_meta": {"buzz/hook": {
                    "point": "_Stop", "sessionId": "sess_1", "attempt": attempt,
                    "budgetRemaining": 3}}}),
            )?;
            asked.push(k);
        }
    }
    let mut out = Vec::new();
    for k in asked {
        let text = content_text(&servers[k].recv_reply()?);
        if !text.trim().is_empty() {
            out.push((servers[k].name.clone(), text));
        }
    }
    Ok(out)
}

/// The concatenated text blocks of an MCP `tools/call` result.
fn content_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// The session history as serialised Chat Completions messages (comma-separated, without the
/// brackets): appending serialises only the new messages.
struct History {
    messages: Vec<u8>,
    body: Vec<u8>,
}

impl History {
    fn new(prompt: &str) -> History {
        let mut h = History {
            messages: Vec::new(),
            body: Vec::new(),
        };
        h.push(&json!({"role": "user", "content": prompt}));
        h
    }

    fn push(&mut self, message: &Value) {
        if !self.messages.is_empty() {
            self.messages.push(b',');
        }
        // Writing JSON into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.messages, message);
    }

    fn push_calls(&mut self, text: &str, calls: &[Call]) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        self.push(&json!({"role": "assistant", "content": text, "tool_calls": calls}));
    }

    fn push_result(&mut self, id: &str, text: &str) {
        self.push(&json!({"role": "tool", "tool_call_id": id, "content": text}));
    }

    fn push_text_reply(&mut self, text: &str) {
        self.push(&json!({"role": "assistant", "content": text}));
    }

    /// A hook objection as the agent injects it: a tool call and its result.
    fn push_hook(&mut self, server: &str, text: &str, n: usize) {
        let id = format!("buzz_hook__Stop_{server}_{n}");
        let call = Call {
            id: id.clone(),
            name: format!("{server}___Stop"),
            arguments: "{}".into(),
        };
        self.push_calls("", std::slice::from_ref(&call));
        let result = json!({"hook": "_Stop", "server": server, "text": text}).to_string();
        self.push_result(&id, &result);
    }

    /// The request body: the agents' fields (sorted, as they send them) around the history.
    fn request_body(&mut self, tools: &str) -> &[u8] {
        self.body.clear();
        self.body
            .extend_from_slice(format!("{{\"max_tokens\":{MAX_TOKENS},\"messages\":[").as_bytes());
        self.body.extend_from_slice(&self.messages);
        self.body.extend_from_slice(
            b"],\"model\":\"test-model\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"tools\":",
        );
        self.body.extend_from_slice(tools.as_bytes());
        self.body.push(b'}');
        &self.body
    }
}

/// A tool call of a response.
#[derive(Debug, Clone, Default)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// One streamed Chat Completions response, as it is decoded.
#[derive(Default)]
struct Turn {
    text: String,
    calls: Vec<Call>,
    failed: Option<String>,
}

impl Turn {
    /// One SSE `data:` payload: text deltas go out as `agent_message_chunk` at once, tool call
    /// deltas are merged by index, usage becomes a `usage_update`.
    fn event(&mut self, data: &[u8], acp: &mut Acp) {
        if data == b"[DONE]" || self.failed.is_some() {
            return;
        }
        let v: Value = match serde_json::from_slice(data) {
            Ok(v) => v,
            Err(e) => {
                self.failed = Some(format!("SSE data: {e}"));
                return;
            }
        };
        let delta = &v["choices"][0]["delta"];
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text.push_str(t);
            let sent = acp.update(json!({"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": t}}));
            if let Err(e) = sent {
                self.failed = Some(e);
            }
        }
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(0) as usize;
            if self.calls.len() <= i {
                self.calls.resize(i + 1, Call::default());
            }
            let call = &mut self.calls[i];
            if let Some(id) = c["id"].as_str() {
                call.id = id.to_string();
            }
            if let Some(name) = c["function"]["name"].as_str() {
                call.name = name.to_string();
            }
            if let Some(a) = c["function"]["arguments"].as_str() {
                call.arguments.push_str(a);
            }
        }
        if let Some(u) = v["usage"].as_object() {
            let used = u.get("total_tokens").and_then(Value::as_u64).unwrap_or(0);
            let sent =
                acp.update(json!({"sessionUpdate": "usage_update", "used": used, "size": 200_000}));
            if let Err(e) = sent {
                self.failed = Some(e);
            }
        }
    }
}

/// An HTTP/1.1 client keeping one connection alive, as an agent with a connection pool would.
struct Http {
    addr: SocketAddr,
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
}

impl Http {
    fn new(llm: &FakeLlm) -> Http {
        let addr = llm
            .origin()
            .trim_start_matches("http://")
            .parse()
            .expect("fake llm origin is an address");
        Http { addr, conn: None }
    }

    /// POSTs `body` to `path` and calls `on_data` with each SSE `data:` payload as it arrives.
    fn post(&mut self, path: &str, body: &[u8], mut on_data: impl FnMut(&[u8])) -> Res<()> {
        if self.conn.is_none() {
            let s = io("connect", TcpStream::connect(self.addr))?;
            io("nodelay", s.set_nodelay(true))?;
            let r = BufReader::new(io("clone socket", s.try_clone())?);
            self.conn = Some((s, r));
        }
        let Some((sock, reader)) = self.conn.as_mut() else {
            return Err("no connection".into());
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: text/event-stream\r\nauthorization: Bearer {SECRET_KEY}\r\n\
             content-length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        write_all_vectored(sock, head.as_bytes(), body)?;

        let mut line = String::new();
        io("status line", reader.read_line(&mut line))?;
        if !line.starts_with("HTTP/1.1 200") {
            return Err(format!("LLM answered {:?}", line.trim_end()));
        }
        let (mut chunked, mut close) = (false, false);
        loop {
            line.clear();
            io("header", reader.read_line(&mut line))?;
            let h = line.trim_end().to_ascii_lowercase();
            if h.is_empty() {
                break;
            }
            chunked |= h.starts_with("transfer-encoding:") && h.contains("chunked");
            close |= h.starts_with("connection:") && h.contains("close");
        }
        if !chunked {
            return Err("the SSE response is not chunked".into());
        }
        let mut sse = Vec::new();
        let mut chunk = Vec::new();
        loop {
            line.clear();
            io("chunk size", reader.read_line(&mut line))?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|e| format!("chunk size {line:?}: {e}"))?;
            chunk.resize(size + 2, 0);
            io("chunk", reader.read_exact(&mut chunk))?;
            if size == 0 {
                break;
            }
            sse.extend_from_slice(&chunk[..size]);
            // Every complete line: a `data:` line is one event's payload here.
            let mut start = 0;
            while let Some(nl) = sse[start..].iter().position(|&b| b == b'\n') {
                let l = &sse[start..start + nl];
                if let Some(data) = l.strip_prefix(b"data: ") {
                    on_data(data);
                }
                start += nl + 1;
            }
            sse.drain(..start);
        }
        if close {
            self.conn = None;
        }
        Ok(())
    }
}

/// Writes `head` then `body` with as few `writev` calls as the socket allows.
fn write_all_vectored(sock: &mut TcpStream, head: &[u8], body: &[u8]) -> Res<()> {
    let mut done = 0;
    let total = head.len() + body.len();
    while done < total {
        let n = if done < head.len() {
            sock.write_vectored(&[IoSlice::new(&head[done..]), IoSlice::new(body)])
        } else {
            sock.write(&body[done - head.len()..])
        };
        match n {
            Ok(0) => return Err("LLM connection closed while sending".into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("send: {e}")),
        }
    }
    Ok(())
}

/// The ACP side: `session/update` lines written to a pipe whose reader thread stamps and parses
/// each line as the ACP client does.
struct Acp {
    out: std::io::PipeWriter,
    line: Vec<u8>,
    reader: JoinHandle<Vec<(Instant, String)>>,
}

impl Acp {
    fn start() -> Res<Acp> {
        let (r, w) = io("pipe", std::io::pipe())?;
        let reader = std::thread::Builder::new()
            .name("floor-acp-reader".into())
            .spawn(move || {
                let mut r = BufReader::new(r);
                let mut lines = Vec::new();
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match r.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let at = Instant::now();
                    let text = String::from_utf8_lossy(&buf).trim_end().to_string();
                    // Parsed as the ACP client parses an agent's lines.
                    let _ = std::hint::black_box(serde_json::from_str::<Value>(&text));
                    lines.push((at, text));
                }
                lines
            });
        Ok(Acp {
            out: w,
            line: Vec::new(),
            reader: io("spawn ACP reader", reader)?,
        })
    }

    fn update(&mut self, update: Value) -> Res<()> {
        self.line.clear();
        let msg = json!({"jsonrpc": "2.0", "method": "session/update",
                         "params": {"sessionId": "sess_1", "update": update}});
        let _ = serde_json::to_writer(&mut self.line, &msg);
        self.line.push(b'\n');
        io("ACP write", self.out.write_all(&self.line))
    }

    /// Closes the pipe; returns every line with the instant it was read.
    fn finish(self) -> Res<Vec<(Instant, String)>> {
        drop(self.out);
        self.reader
            .join()
            .map_err(|_| "the ACP reader panicked".to_string())
    }
}

/// A fake MCP server process and its JSON-RPC line channel.
pub(super) struct Mcp {
    name: String,
    child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) stdout: BufReader<ChildStdout>,
    next_id: u64,
    pending: Vec<u64>,
    tools: Vec<Value>,
    line: String,
}

impl Mcp {
    /// Spawns the fake as an agent does: this binary with `BUZZ_E2E_ROLE=fake-mcp` and the
    /// server's environment, stdio piped, stderr discarded.
    fn spawn(server: &Server) -> Res<Mcp> {
        let mut cmd = Command::new(crate::harness::current_exe());
        cmd.env("BUZZ_E2E_ROLE", "fake-mcp")
            .envs(server.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = io("spawn fake MCP server", cmd.spawn())?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Mcp {
            name: server.name.clone(),
            child,
            stdin,
            stdout,
            next_id: 0,
            pending: Vec::new(),
            tools: Vec::new(),
            line: String::new(),
        })
    }

    fn write(&mut self, msg: &Value) -> Res<()> {
        let mut line = msg.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().ok_or("MCP stdin closed")?;
        io("MCP write", stdin.write_all(line.as_bytes()))
    }

    fn send_request(&mut self, method: &str, params: Value) -> Res<()> {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push(id);
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }

    fn send_initialize(&mut self) -> Res<()> {
        self.send_request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "buzz-bench-floor", "version": "0"}}),
        )
    }

    fn notify(&mut self, method: &str, params: Value) -> Res<()> {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// Reads lines until the reply to the oldest pending request; returns its `result`.
    fn recv_reply(&mut self) -> Res<Value> {
        if self.pending.is_empty() {
            return Err("no MCP request pending".into());
        }
        let want = self.pending.remove(0);
        loop {
            self.line.clear();
            if io("MCP read", self.stdout.read_line(&mut self.line))? == 0 {
                return Err(format!("MCP server {} closed stdout", self.name));
            }
            let Ok(msg) = serde_json::from_str::<Value>(&self.line) else {
                continue;
            };
            if msg.get("method").is_none() && msg["id"] == want {
                return match msg.get("result") {
                    Some(r) => Ok(r.clone()),
                    None => Err(format!("MCP error: {msg}")),
                };
            }
        }
    }

    /// Closes stdin (the fake exits on EOF) and reaps the process.
    pub(super) fn close(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
