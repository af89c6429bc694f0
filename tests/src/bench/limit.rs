//! The limit probe (issue 27): only the IO a tool round cannot do without, and nothing else.
//!
//! Where the [IO floor](super::floor) also does the JSON work of a round (it serialises the new
//! messages, parses every SSE event and MCP reply, builds the ACP updates), the probe does none:
//! every line it sends is built before the clock starts, and what it receives is only read.
//! Per round of a [`Workload::Rounds`] session it:
//!
//! 1. appends the round's new bytes (the model's tool call, as the agents send it back, and the
//!    MCP reply line as read) to the request body it keeps and, with one `write`, to a session
//!    file opened `O_APPEND` (one `fdatasync` at the end of the prompt, none per round);
//! 2. sends the HTTP request (head, body so far, the fixed tail with the tool definitions) with
//!    one `writev` to a loopback TCP peer, and reads the peer's answer (the round's Chat
//!    Completions SSE stream as the fake LLM sends it, written by the peer in one `write`);
//! 3. writes one `tools/call` line to the fake MCP server's stdin pipe and reads its reply line;
//! 4. writes one ACP `session/update` line (the completed tool call with its result) to a pipe
//!    that a reader thread drains.
//!
//! The final round (the text reply) is only step 2 and one ACP line. The fake MCP server is the
//! real one (a process, started and handshaken before the clock starts). The CPU is the probe
//! thread's (`CLOCK_THREAD_CPUTIME_ID`); the peer, the server and the reader are not counted,
//! as they are not for an agent. The syscalls are the probe's own calls, counted as it makes
//! them (each `write_all` or `read` loop iteration is one). Request sizes are the agents' to
//! within the JSON framing of the results (the body carries the MCP reply line where an agent
//! carries the result text): the `sent to the LLM` figure shows it.

use super::floor::{Mcp, start_servers, thread_cpu, tool_definitions};
use super::{Figures, Metric, PROMPT, Workload, ms};
use crate::fake_llm::Wire;
use serde_json::json;
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The `max_tokens` the agents send by default.
const MAX_TOKENS: u32 = 32768;

/// The end of a chunked HTTP body.
const LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";

/// Runs `workload` once as the probe. Workloads other than [`Workload::Rounds`] have no
/// figures (the probe is the limit of a tool round only).
pub fn run(workload: &Workload) -> Result<Figures, String> {
    match workload {
        Workload::Rounds { .. } => session(workload).map_err(|e| format!("limit: {e}")),
        _ => Ok(Figures::new()),
    }
}

type Res<T> = Result<T, String>;

fn io<T>(what: &str, r: std::io::Result<T>) -> Res<T> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// What the probe sends in one round, built before the clock starts.
struct Round {
    /// The assistant message with the round's tool call, as the next request carries it
    /// (with its leading comma); empty for the final text round.
    call_message: Vec<u8>,
    /// The `tools/call` line to the MCP server; empty for the final round.
    mcp_line: Vec<u8>,
    /// The ACP `session/update` line of the round.
    acp_line: Vec<u8>,
}

fn rounds(workload: &Workload, tool_rounds: usize) -> Vec<Round> {
    let line = |v: serde_json::Value| {
        let mut l = v.to_string().into_bytes();
        l.push(b'\n');
        l
    };
    (0..=tool_rounds)
        .map(|i| {
            if i == tool_rounds {
                return Round {
                    call_message: Vec::new(),
                    mcp_line: Vec::new(),
                    acp_line: line(json!({"jsonrpc": "2.0", "method": "session/update",
                        "params": {"sessionId": "sess_1", "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": "all rounds done"}}}})),
                };
            }
            let (id, name, args) = workload.round_call(i);
            let tool = name.split_once("__").map_or(name, |(_, t)| t);
            let call = json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": id, "type": "function",
                 "function": {"name": name, "arguments": args.to_string()}}]});
            Round {
                call_message: format!(",{call}").into_bytes(),
                mcp_line: line(
                    json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                                      "params": {"name": tool, "arguments": args}}),
                ),
                acp_line: line(json!({"jsonrpc": "2.0", "method": "session/update",
                    "params": {"sessionId": "sess_1", "update": {
                        "sessionUpdate": "tool_call_update", "toolCallId": format!("tc_{id}"),
                        "status": "completed", "rawOutput": {"isError": false}}}})),
            }
        })
        .collect()
}

/// The HTTP peer: answers request `i` with the chunked SSE stream of the workload's reply `i`,
/// in one `write`, and counts the body bytes it received (total and largest).
struct Peer {
    addr: std::net::SocketAddr,
    bytes: Arc<AtomicU64>,
    largest: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Peer {
    fn start(workload: &Workload) -> Res<Peer> {
        let listener = io("listen", TcpListener::bind("127.0.0.1:0"))?;
        let addr = io("local addr", listener.local_addr())?;
        let (bytes, largest) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (b, l, w) = (bytes.clone(), largest.clone(), workload.clone());
        let thread = std::thread::Builder::new()
            .name("limit-llm-peer".into())
            .spawn(move || {
                if let Ok((sock, _)) = listener.accept() {
                    let _ = sock.set_nodelay(true);
                    let _ = serve(sock, &w, &b, &l);
                }
            });
        Ok(Peer {
            addr,
            bytes,
            largest,
            thread: io("spawn peer", thread)?,
        })
    }
}

/// Serves requests on `sock` until EOF.
fn serve(mut sock: TcpStream, w: &Workload, bytes: &AtomicU64, largest: &AtomicU64) -> Res<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    for i in 0.. {
        // The head, then content-length bytes of body.
        let (head_end, len) = loop {
            if let Some(p) = buf.windows(4).position(|x| x == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .ok_or("no content-length")?;
                break (p + 4, len);
            }
            match io("peer read", sock.read(&mut chunk))? {
                0 => return Ok(()),
                n => buf.extend_from_slice(&chunk[..n]),
            }
        };
        while buf.len() < head_end + len {
            match io("peer read", sock.read(&mut chunk))? {
                0 => return Err("EOF in a request body".into()),
                n => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + len);
        bytes.fetch_add(len as u64, Ordering::Relaxed);
        largest.fetch_max(len as u64, Ordering::Relaxed);
        let sse: String = w.reply(i).sse_pieces_for(Wire::Chat).concat();
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\
             \r\n{:x}\r\n{sse}\r\n0\r\n\r\n",
            sse.len()
        );
        io("peer write", sock.write_all(answer.as_bytes()))?;
    }
    Ok(())
}

/// Syscall counting around the probe's own calls.
#[derive(Default)]
struct Calls(u64);

impl Calls {
    /// Writes all of `data` to `w`, one count per `write`.
    fn write_all(&mut self, w: &mut impl Write, data: &[u8], what: &str) -> Res<()> {
        let mut done = 0;
        while done < data.len() {
            self.0 += 1;
            match w.write(&data[done..]) {
                Ok(0) => return Err(format!("{what}: closed")),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
        Ok(())
    }

    /// Reads from `r` into `buf` (appending) until it ends with `end`, one count per `read`.
    fn read_until_end(
        &mut self,
        r: &mut impl Read,
        buf: &mut Vec<u8>,
        end: &[u8],
        what: &str,
    ) -> Res<()> {
        buf.clear();
        let mut at = 0;
        while !buf.ends_with(end) {
            if buf.capacity() - at < 1 << 16 {
                buf.reserve(1 << 16);
            }
            buf.resize(buf.capacity(), 0);
            self.0 += 1;
            let n = io(what, r.read(&mut buf[at..]))?;
            buf.truncate(at + n);
            if n == 0 {
                return Err(format!("{what}: EOF"));
            }
            at += n;
        }
        Ok(())
    }
}

/// A tool-rounds session as the probe: set-up (servers, peer, lines) untimed, then the rounds.
fn session(workload: &Workload) -> Res<Figures> {
    let Workload::Rounds { tool_rounds, .. } = *workload else {
        return Ok(Figures::new());
    };
    let mut servers = start_servers(&workload.servers())?;
    let tools = tool_definitions(&servers);
    let rounds = rounds(workload, tool_rounds);
    let peer = Peer::start(workload)?;
    let dir = io(
        "tempdir",
        tempfile::Builder::new().prefix("buzz-limit-").tempdir(),
    )?;
    let mut file = io(
        "session file",
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("session.jsonl")),
    )?;
    let (acp_r, mut acp) = io("pipe", std::io::pipe())?;
    let drain = std::thread::spawn(move || {
        let mut r = acp_r;
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let mut sock = io("connect", TcpStream::connect(peer.addr))?;
    io("nodelay", sock.set_nodelay(true))?;
    let first = json!({"role": "user", "content": PROMPT}).to_string();
    let mut body: Vec<u8> =
        format!("{{\"max_tokens\":{MAX_TOKENS},\"messages\":[{first}").into_bytes();
    let tail = format!(
        "],\"model\":\"test-model\",\"stream\":true,\"stream_options\":{{\"include_usage\":true}},\
         \"tools\":{tools}}}"
    );
    let mcp: &mut Mcp = servers.first_mut().ok_or("no MCP server")?;
    let mut answer = Vec::new();
    let mut reply = Vec::new();
    let mut calls = Calls::default();

    let cpu_before = thread_cpu();
    let started = Instant::now();
    for (i, round) in rounds.iter().enumerate() {
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: text/event-stream\r\nauthorization: Bearer {}\r\n\
             content-length: {}\r\n\r\n",
            Wire::Chat.path(),
            peer.addr,
            crate::harness::SECRET_KEY,
            body.len() + tail.len()
        );
        let parts = [
            IoSlice::new(head.as_bytes()),
            IoSlice::new(&body),
            IoSlice::new(tail.as_bytes()),
        ];
        writev_all(&mut sock, &parts, &mut calls)?;
        calls.read_until_end(&mut sock, &mut answer, LAST_CHUNK, "LLM answer")?;
        if i == tool_rounds {
            calls.write_all(&mut acp, &round.acp_line, "ACP write")?;
            break;
        }
        let stdin = mcp.stdin.as_mut().ok_or("MCP stdin closed")?;
        calls.write_all(stdin, &round.mcp_line, "MCP write")?;
        calls.read_until_end(mcp.stdout.get_mut(), &mut reply, b"\n", "MCP reply")?;
        calls.write_all(&mut acp, &round.acp_line, "ACP write")?;
        // The round's new bytes: the call and its result, in the body and in the file.
        let new_at = body.len();
        body.extend_from_slice(&round.call_message);
        body.push(b',');
        body.extend_from_slice(reply.strip_suffix(b"\n").unwrap_or(&reply));
        calls.write_all(&mut file, &body[new_at..], "session append")?;
    }
    calls.0 += 1;
    io("fdatasync", file.sync_data())?;
    let cpu = thread_cpu().saturating_sub(cpu_before);
    let wall = started.elapsed();

    drop(sock);
    drop(acp);
    let _ = peer.thread.join();
    let _ = drain.join();
    for m in servers {
        m.close();
    }
    let mut figures = Figures::new();
    figures.insert(Metric::PromptWall, ms(wall));
    figures.insert(Metric::Cpu, ms(cpu));
    figures.insert(Metric::Syscalls, calls.0 as f64 / (tool_rounds + 1) as f64);
    figures.insert(Metric::LlmConnections, 1.0);
    figures.insert(Metric::LlmBytes, peer.bytes.load(Ordering::Relaxed) as f64);
    figures.insert(
        Metric::LargestRequest,
        peer.largest.load(Ordering::Relaxed) as f64,
    );
    Ok(figures)
}

/// Writes every part with as few `writev` calls as the socket allows (one, unless it is full).
fn writev_all(sock: &mut TcpStream, parts: &[IoSlice], calls: &mut Calls) -> Res<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0;
    while done < total {
        // The parts from `done` on.
        let mut skip = done;
        let mut rest: Vec<IoSlice> = Vec::with_capacity(parts.len());
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            rest.push(IoSlice::new(&p[skip..]));
            skip = 0;
        }
        calls.0 += 1;
        match sock.write_vectored(&rest) {
            Ok(0) => return Err("LLM connection closed while sending".into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("send: {e}")),
        }
    }
    Ok(())
}
