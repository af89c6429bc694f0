//! `buzz-agent demo` (SPEC P3): a complete offline session with nothing installed — a scripted
//! OpenAI-compatible LLM on 127.0.0.1, the bundled `todo` hook server (E2), and this very binary
//! as the ACP agent child — printed as a readable transcript in which `_Stop` objects once and
//! the agent carries on to `end_turn`.
//!
//! `buzz-agent demo --interceptors` (SPEC X1, experimental): the same set-up plus the bundled
//! example interceptor server as `policy` (`BUZZ_AGENT_INTERCEPTOR_SERVERS=policy`, its default
//! policy: no `rm -rf`); the model's first tool call carries `rm -rf`, the interceptor denies it
//! before it runs, the model sees the denial as the tool error and records a safe step instead.

use crate::acp_client::AcpChild;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const ITEM: &str = "write the release notes";

/// `println!` that ignores a closed stdout (`buzz-agent demo | head` must not panic).
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Run the demo; returns the exit code.
pub fn run() -> i32 {
    match demo() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("demo failed: {e}");
            1
        }
    }
}

/// `demo --llm [ADDR]`: the demo's scripted LLM alone, an OpenAI-compatible Chat Completions
/// server on `ADDR` (default `127.0.0.1:8765`; port 0 picks a free one), for trying the agent by
/// hand without a provider (README, "By hand, in JSON", and the fixture project). Every request
/// is answered with one streamed text naming the last user message and what the system prompt
/// holds ([`echo_reply`]); the only tool it calls is `load_skill`, for a skill the prompt names. The first line on stdout
/// is the base URL to set as `OPENAI_COMPAT_BASE_URL`. Serves until killed; returns the exit
/// code when it cannot listen.
pub fn run_llm(addr: Option<&str>) -> i32 {
    let addr = addr.unwrap_or(SCRIPTED_LLM_ADDR);
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("demo --llm: cannot listen on {addr}: {e}");
            return 1;
        }
    };
    let url = match listener.local_addr() {
        Ok(a) => format!("http://{a}/v1"),
        Err(e) => {
            eprintln!("demo --llm: {e}");
            return 1;
        }
    };
    out!("{url}");
    eprintln!(
        "demo --llm: a scripted OpenAI-compatible LLM (it answers every request with one sentence, and calls no tool but load_skill); use it with\n  BUZZ_AGENT_PROVIDER=openai OPENAI_COMPAT_BASE_URL={url} OPENAI_COMPAT_MODEL=scripted"
    );
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = serve_echo(stream);
        });
    }
    0
}

/// Where `demo --llm` listens unless told otherwise.
const SCRIPTED_LLM_ADDR: &str = "127.0.0.1:8765";

/// One `demo --llm` exchange: reads a request, answers it with [`echo_reply`] as Chat
/// Completions SSE.
fn serve_echo(mut stream: TcpStream) -> std::io::Result<()> {
    let body = read_request(&mut stream)?;
    let req = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    write_sse(&mut stream, echo_reply(&req))
}

/// The scripted answer to a Chat Completions request (docs/context.md shows it on the fixture
/// project `tests/fixtures/project`):
/// - after a `load_skill` result: one sentence quoting the first line of the skill's body;
/// - when the last message is the user's and names a skill that `load_skill` offers: a
///   `load_skill` call;
/// - else one sentence quoting the last user message (cut to 200 characters), naming the
///   `AGENTS.md` files of the system prompt (quoting the first line of the most specific one)
///   and the skills offered.
fn echo_reply(req: &Value) -> Vec<Value> {
    let messages = req["messages"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if let Some(loaded) = messages
        .last()
        .filter(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .and_then(|c| c.strip_prefix("<skill name=\""))
    {
        let (name, rest) = loaded.split_once('"').unwrap_or((loaded, ""));
        let body = rest.split_once('\n').map_or("", |(_, body)| body);
        return text(&format!(
            "This is the scripted demo LLM: I loaded the skill {name}, which begins \"{}\"; a real model would now follow it.",
            first_line(body)
        ));
    }
    let said = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .unwrap_or_default();
    let skills = offered_skills(req);
    let asked = messages.last().is_some_and(|m| m["role"] == "user");
    if let Some(skill) = skills.iter().find(|s| asked && said.contains(s.as_str())) {
        return tool_call(
            &format!("The skill {skill} fits this task; loading it."),
            "load_skill",
            json!({"name": skill}),
        );
    }
    let mut said: String = said.trim().chars().take(200).collect();
    if said.is_empty() {
        said = "(nothing)".into();
    }
    let mut reply =
        format!("Hello! This is the scripted demo LLM, not a real model: you said \"{said}\".");
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .map(|m| text_of(&m["content"]))
        .unwrap_or_default();
    let files: Vec<&str> = system
        .split("<instructions path=\"")
        .skip(1)
        .filter_map(|f| f.split_once("\">\n"))
        .map(|(path, _)| path)
        .collect();
    if let Some(last) = system
        .rsplit("<instructions path=\"")
        .next()
        .filter(|_| !files.is_empty())
    {
        let text = last.split_once("\">\n").map_or("", |(_, t)| t);
        reply.push_str(&format!(
            " My system prompt holds {} AGENTS.md file(s) ({}); the last begins \"{}\".",
            files.len(),
            files.join(", "),
            first_line(text)
        ));
    }
    if !skills.is_empty() {
        reply.push_str(&format!(
            " Skills offered: {} (name one in your prompt and I load it).",
            skills.join(", ")
        ));
    }
    text(&reply)
}

/// A message's text: its string content, or its text parts joined by spaces.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        parts => parts
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|b| b["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default(),
    }
}

/// The first line of `text` that is neither blank nor a Markdown heading, cut to 120
/// characters.
fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or("")
        .chars()
        .take(120)
        .collect()
}

/// The skill names the request's `load_skill` tool offers (its `name` argument's `enum`).
fn offered_skills(req: &Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == "load_skill")
        .and_then(|t| t["function"]["parameters"]["properties"]["name"]["enum"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// Run the interceptor demo; returns the exit code.
pub fn run_interceptors() -> i32 {
    match interceptor_demo() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("demo failed: {e}");
            1
        }
    }
}

/// What the model saw of hooks and denials, as the scripted LLM reports it: `(n, line)` for
/// the n-th request (0-based), printed right before the reply to that request. The reply is
/// found by counting the model's rounds on the client side: each round's text starts a
/// paragraph (SPEC A6), and every scripted reply has text. Counting, not arrival order: the
/// LLM may see request n before this thread has printed the reply to request n−1.
struct SeenLog {
    rx: mpsc::Receiver<(usize, String)>,
    pending: Vec<(usize, String)>,
    /// Model rounds whose text has started so far.
    rounds: usize,
}

impl SeenLog {
    /// Called for every update before it is printed: a model chunk that opens a round prints
    /// what the model saw in the request that round answers.
    fn before(&mut self, v: &Value) {
        let u = &v["params"]["update"];
        if u["sessionUpdate"] != "agent_message_chunk" || u["_meta"]["buzz"]["notice"].is_string() {
            return;
        }
        let text = u["content"]["text"].as_str().unwrap_or("");
        if self.rounds > 0 && !text.starts_with("\n\n") {
            return;
        }
        self.rounds += 1;
        self.pending.extend(self.rx.try_iter());
        let rounds = self.rounds;
        self.pending.retain(|(n, line)| {
            if *n < rounds {
                out!("{line}");
                false
            } else {
                true
            }
        });
    }
}

/// The scripted LLM on 127.0.0.1: the n-th request gets `script(n)` as Chat Completions SSE.
/// Returns its port and what the model saw of hooks and denials (the newest tool result, when
/// it is one), for the main thread to print right before the reply it caused.
fn start_llm(script: fn(usize) -> Vec<Value>) -> Result<(u16, SeenLog), String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let calls = Arc::new(AtomicUsize::new(0));
    let (seen_tx, seen_rx) = mpsc::channel::<(usize, String)>();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let _ = serve_llm(stream, n, script, &seen_tx);
        }
    });
    Ok((
        port,
        SeenLog {
            rx: seen_rx,
            pending: Vec::new(),
            rounds: 0,
        },
    ))
}

fn this_binary() -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    Ok(exe.to_string_lossy().into_owned())
}

/// Starts the agent `exe` as a demo runs it and opens one session in the temporary directory
/// with `servers` (an ACP `mcpServers` array): the scripted LLM on `port` (OpenAI Chat), every
/// tool call allowed, no hook or interceptor server but those `env` names, and no saved session
/// (a scripted offline session is nothing worth keeping in the user's saved sessions). The
/// agent's log is not part of the transcript. Returns the agent, the `initialize` answer and
/// the session id.
fn open_session(
    exe: &str,
    port: u16,
    env: &[(&str, &str)],
    servers: Value,
) -> Result<(AcpChild, Value, String), String> {
    let mut cmd = Command::new(exe);
    cmd.env("BUZZ_AGENT_PROVIDER", "openai")
        .env(
            "OPENAI_COMPAT_BASE_URL",
            format!("http://127.0.0.1:{port}/v1"),
        )
        .env("OPENAI_COMPAT_MODEL", "demo-model")
        .env("BUZZ_AGENT_PERMISSION", "allow")
        .env("BUZZ_AGENT_LOG", "info")
        .env("BUZZ_AGENT_STATE_DIR", "off")
        .env_remove("MCP_HOOK_SERVERS")
        .env_remove("BUZZ_AGENT_INTERCEPTOR_SERVERS")
        .env_remove(crate::examples::INTERCEPTORS_VAR)
        .envs(env.iter().copied())
        .stderr(Stdio::null());
    let mut agent = AcpChild::spawn(cmd)?;
    let mut quiet = |_: &Value| None;
    let init = agent
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
            &mut quiet,
        )
        .map_err(|e| e.to_string())?;
    let cwd = std::env::temp_dir().to_string_lossy().into_owned();
    let new = agent
        .request(
            "session/new",
            json!({"cwd": cwd, "mcpServers": servers}),
            &mut quiet,
        )
        .map_err(|e| e.to_string())?;
    let sid = new["result"]["sessionId"]
        .as_str()
        .ok_or_else(|| format!("session/new failed: {new}"))?
        .to_string();
    Ok((agent, init, sid))
}

fn demo() -> Result<(), String> {
    let exe = this_binary()?;
    let (port, mut seen) = start_llm(hook_script)?;
    out!(
        "== buzz-agent demo: a scripted LLM on 127.0.0.1:{port}, the bundled `todo` hook server, MCP_HOOK_SERVERS=todo\n"
    );
    let (mut agent, init, sid) = open_session(
        &exe,
        port,
        &[("MCP_HOOK_SERVERS", "todo")],
        json!([{"name": "todo", "command": exe, "args": ["example-server", "todo"], "env": []}]),
    )?;
    out!(
        "client → initialize          agent: {} {}",
        init["result"]["agentInfo"]["name"],
        init["result"]["agentInfo"]["version"]
    );
    out!(
        "client → session/new         session {sid} with MCP server `todo` (tools todo_add/todo_done/todo_list, hooks _Stop/_PostCompact/_SessionStart/_SessionEnd)"
    );
    let prompt = "Track and finish the release notes.";
    out!("client → session/prompt      {prompt:?}\n");
    let mut show = |v: &Value| {
        seen.before(v);
        print_update(v);
        None
    };
    let resp = agent
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}),
            &mut show,
        )
        .map_err(|e| e.to_string())?;
    let r = &resp["result"];
    out!(
        "\nagent → stopReason: {}   (_meta.buzz: rounds {}, _Stop objections {}, budget {})",
        r["stopReason"],
        r["_meta"]["buzz"]["rounds"],
        r["_meta"]["buzz"]["stopObjections"],
        r["_meta"]["buzz"]["stopBudget"]
    );
    // EOF: the agent shuts its MCP server down and exits (SPEC P1).
    let _ = agent.finish(Duration::from_secs(10));
    if r["stopReason"] != "end_turn" || r["_meta"]["buzz"]["stopObjections"] != 1 {
        return Err(format!("unexpected result: {resp}"));
    }
    out!(
        "\nThe model tried to stop with an open todo item; the `todo` server's _Stop hook objected once,\nthe model finished the item, and the turn ended normally."
    );
    Ok(())
}

fn print_update(v: &Value) {
    let u = &v["params"]["update"];
    match u["sessionUpdate"].as_str() {
        Some("agent_message_chunk") => {
            // Paragraph breaks between rounds are this transcript's own lines; the agent's
            // notices (`_meta.buzz.notice`) are not the model's words.
            let text = u["content"]["text"].as_str().unwrap_or("").trim_start();
            if u["_meta"]["buzz"]["notice"].is_string() {
                out!("   notice: {}", text.trim_start_matches("[buzz-agent] "));
            } else {
                out!("   model: {text}");
            }
        }
        Some("tool_call") => out!(
            "   tool call {} {}",
            u["title"].as_str().unwrap_or(""),
            u["rawInput"]
        ),
        Some("tool_call_update") if u["status"] == "completed" || u["status"] == "failed" => {
            let text = u["content"][0]["content"]["text"].as_str().unwrap_or("");
            out!("     → {}: {text}", u["status"].as_str().unwrap_or(""));
        }
        _ => {}
    }
}

fn interceptor_demo() -> Result<(), String> {
    let exe = this_binary()?;
    let (port, mut seen) = start_llm(interceptor_script)?;
    out!(
        "== buzz-agent demo --interceptors: a scripted LLM on 127.0.0.1:{port}, the bundled `todo` server,\n   the bundled example interceptor server as `policy` (BUZZ_AGENT_INTERCEPTOR_SERVERS=policy;\n   its policy/no-rm-rf validator denies tool calls whose arguments contain `rm -rf`)\n"
    );
    let (mut agent, _, sid) = open_session(
        &exe,
        port,
        &[("BUZZ_AGENT_INTERCEPTOR_SERVERS", "policy")],
        json!([
            {"name": "todo", "command": exe, "args": ["example-server", "todo"], "env": []},
            {"name": "policy", "command": exe, "args": ["example-server", "interceptors"], "env": []}
        ]),
    )?;
    out!(
        "client → session/new         session {sid}: `todo` (tools) and `policy` (interceptors, asked with interceptors/list)"
    );
    let prompt = "Clean up the old build notes in ~/build-notes.";
    out!("client → session/prompt      {prompt:?}\n");
    let mut statuses = Vec::new();
    let mut show = |v: &Value| {
        seen.before(v);
        let u = &v["params"]["update"];
        if u["sessionUpdate"] == "tool_call_update"
            && (u["status"] == "completed" || u["status"] == "failed")
        {
            let text = u["content"][0]["content"]["text"].as_str().unwrap_or("");
            statuses.push((
                u["status"].as_str().unwrap_or("").to_string(),
                text.to_string(),
            ));
        }
        print_update(v);
        None
    };
    let resp = agent
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}),
            &mut show,
        )
        .map_err(|e| e.to_string())?;
    let r = &resp["result"];
    out!("\nagent → stopReason: {}", r["stopReason"]);
    let _ = agent.finish(Duration::from_secs(10));
    let denied = statuses.first().is_some_and(|(status, text)| {
        status == "failed" && text.starts_with("blocked by interceptor 'policy/no-rm-rf'")
    });
    let allowed = statuses
        .get(1)
        .is_some_and(|(status, _)| status == "completed");
    if r["stopReason"] != "end_turn" || !denied || !allowed {
        return Err(format!(
            "unexpected result: {resp} (tool calls: {statuses:?})"
        ));
    }
    out!(
        "\nThe model's first tool call carried `rm -rf`; the `policy` interceptor denied it before it ran\n(the todo server never saw it), the model read the denial as the tool error and recorded a safe step."
    );
    Ok(())
}

/// The script of `demo`: a todo item added, a premature stop, the item done, the end.
fn hook_script(n: usize) -> Vec<Value> {
    match n {
        0 => tool_call(
            "I'll track this on the todo list first.",
            "todo__todo_add",
            json!({"item": ITEM}),
        ),
        1 => text("All set — I'm done here."),
        2 => tool_call(
            "Right, the item is still open. Writing the notes and closing it.",
            "todo__todo_done",
            json!({"item": ITEM}),
        ),
        _ => text("The release notes are written and the todo item is done."),
    }
}

/// The script of `demo --interceptors`: a dangerous call, then a safe one, then the end.
fn interceptor_script(n: usize) -> Vec<Value> {
    match n {
        0 => tool_call(
            "I'll record the cleanup command on the todo list.",
            "todo__todo_add",
            json!({"item": "run rm -rf ~/build-notes"}),
        ),
        1 => tool_call(
            "That command is blocked by policy; I'll record a safe step instead.",
            "todo__todo_add",
            json!({"item": "archive ~/build-notes to ~/archive/build-notes"}),
        ),
        _ => text("Recorded a safe cleanup step; the destructive command was refused by policy."),
    }
}

/// One scripted LLM response per request, streamed as OpenAI Chat Completions SSE.
fn serve_llm(
    mut stream: TcpStream,
    n: usize,
    script: fn(usize) -> Vec<Value>,
    seen: &mpsc::Sender<(usize, String)>,
) -> std::io::Result<()> {
    let body = read_request(&mut stream)?;
    // The newest hook injection or interceptor denial, if this request is the one that
    // follows it (SPEC H6, X1).
    if let Ok(req) = serde_json::from_slice::<Value>(&body) {
        let msgs = req["messages"].as_array().cloned().unwrap_or_default();
        if let Some(last) = msgs.last().filter(|m| m["role"] == "tool") {
            let content = last["content"].as_str().unwrap_or("");
            if let Ok(inj) = serde_json::from_str::<Value>(content)
                .map_err(drop)
                .and_then(|v| if v["hook"] == "_Stop" { Ok(v) } else { Err(()) })
            {
                let _ = seen.send((
                    n,
                    format!(
                        "   [_Stop hook of `{}` objected; the model now sees: {}]",
                        inj["server"].as_str().unwrap_or(""),
                        inj["text"].as_str().unwrap_or("").replace('\n', " ")
                    ),
                ));
            } else if content.contains("blocked by interceptor") {
                let _ = seen.send((
                    n,
                    format!(
                        "   [the model now sees the tool error: {}]",
                        content.replace('\n', " ")
                    ),
                ));
            }
        }
    }
    write_sse(&mut stream, script(n))
}

/// Reads one HTTP request (head, then a `content-length` body) and returns its body; an empty
/// body when the peer closed before sending a whole head.
fn read_request(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Ok(Vec::new());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(body)
}

/// Writes `chunks` as one Chat Completions event stream, `[DONE]` last, and closes.
fn write_sse(stream: &mut TcpStream, chunks: Vec<Value>) -> std::io::Result<()> {
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
    );
    for c in chunks {
        out.push_str(&format!("data: {c}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    stream.write_all(out.as_bytes())
}

fn text(t: &str) -> Vec<Value> {
    vec![
        json!({"choices":[{"index":0,"delta":{"content": t},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":12}}),
    ]
}

fn tool_call(t: &str, name: &str, args: Value) -> Vec<Value> {
    let args = args.to_string();
    vec![
        json!({"choices":[{"index":0,"delta":{"content": t},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_demo","type":"function","function":{"name": name,"arguments": args}}]},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20}}),
    ]
}
