//! `buzz-agent hooks check -- <command> [args…]` (SPEC P3, case C57): spawn one MCP server as
//! the agent would, list its hooks and other tools, call each known hook once under the
//! configured timeout and print, per hook: found, answered/empty/error/timeout, latency, and
//! whether the answer would object. Plain blocking std IO: this is a one-shot diagnostic, not
//! the agent. But what it reads and decides is the agent's own code: the server's stdout is
//! read with the core's line codec and message parser (`jsonrpc::parse_message`: lossy UTF-8,
//! surrogate repairs, a response is `result` or `error`), the handshake sends the agent's
//! `initialize` params and the server's own requests get the agent's answers (`mcp_client`:
//! `ping`, `roots/list` with the current directory, `-32601`), the `tools/list` pages are asked
//! for, cut and sorted by the agent's listing code (`mcp_client::ToolListing`, `ToolsSeen`: its
//! caps, the tools it drops and why, its hooks), each hook is called with the
//! params the agent sends (`hooks::first_call_params`) and its answer is classified by the
//! agent's `hooks::classify_reply`, so a PASS means what the agent will do.
//!
//! The report goes to stdout; the server's own stderr lines go to stderr prefixed `[server] `,
//! so that a server's log can never pass for the report. Exit 0 when the server follows the
//! contract; 1 when it does not (no hook point found, a hook that fails, times out, or answers
//! something that objects only because of its shape, a tool list the agent cuts, the server
//! exited); 2 on usage or configuration errors.

use buzz_agent_core::hooks::{self, HookOutcome};
use buzz_agent_core::io::StderrLines;
use buzz_agent_core::jsonrpc::{self, LineBuffer, LineEvent, Message, RpcError};
use buzz_agent_core::mcp_client::{self, ToolListing, ToolsSeen};
use buzz_agent_core::{HookPoint, Signal};
use buzz_agent_runtime::sys::signal_group;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Every hook point's tool name, in the order of a session's life (SPEC H1, H10, H11).
const KNOWN_HOOKS: [&str; 4] = [
    HookPoint::SessionStart.tool_name(),
    HookPoint::Stop.tool_name(),
    HookPoint::PostCompact.tool_name(),
    HookPoint::SessionEnd.tool_name(),
];
/// Server stderr lines kept for the report when the server exits.
const STDERR_TAIL_LINES: usize = 10;
/// Longest server stderr line forwarded, bytes (a longer one is cut and marked as the agent cuts it, the rest of it dropped).
const STDERR_LINE_BYTES: usize = 4096;
/// How often a wait for the server's answer checks whether the server is still running.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// The usage text of `hooks` (printed by `hooks`, `hooks --help` and on a usage error).
#[must_use]
pub fn usage(bin: &str) -> String {
    format!(
        "usage: {bin} hooks check -- <command> [args…]\n\n\
         Spawns <command> as an MCP server the way the agent does (stdio, in its own process\n\
         group, without the agent's API keys), lists its tools as the agent does, calls each\n\
         hook point it exposes (_SessionStart, _Stop, _PostCompact, _SessionEnd) once under\n\
         BUZZ_AGENT_HOOK_TIMEOUT_MS and reports per hook: found, answered / empty / error /\n\
         timeout, the latency, and what the answer would do (object, inject, or be logged).\n\
         The report goes to stdout; the server's own stderr lines go to stderr as `[server] …`.\n\n\
         example: {bin} hooks check -- python3 my_hook_server.py\n\n\
         exit status: 0 the server follows the hook contract; 1 it does not (no hook point found,\n\
         a hook fails, times out or answers what objects only by its shape, the agent cuts the\n\
         tool list, the server exited); 2 usage or configuration error."
    )
}

/// Peer text (the server's stderr, its tool names, its error messages) as the terminal may
/// show it: every control character written as a visible escape (SPEC S6).
fn esc(text: &str) -> std::borrow::Cow<'_, str> {
    buzz_agent_core::text::escape_controls(text, &[])
}

/// Run the check; returns the exit code.
pub fn run(bin: &str, args: &[String]) -> i32 {
    let command = match args {
        [dashes, command, ..] if dashes == "--" => command,
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{}", usage(bin));
            return 0;
        }
        _ => {
            eprintln!("{}", usage(bin));
            return 2;
        }
    };
    let rest = &args[2..];
    let (limits, child_env) = match settings() {
        Ok(t) => t,
        Err(errors) => {
            for e in &errors {
                eprintln!("{bin}: configuration error: {e}");
            }
            return 2;
        }
    };
    // The environment an agent's server gets (SPEC S1).
    let env = buzz_agent_core::config::child_environment(std::env::vars(), &child_env);
    let env_names: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
    let mut child = match Command::new(command)
        .args(rest)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            println!("FAIL  cannot start '{command}': {e}");
            return 1;
        }
    };
    let stderr = ServerStderr::start(child.stderr.take());
    let code = match (child.stdin.take(), child.stdout.take()) {
        (Some(stdin), Some(stdout)) => {
            // The roots a session in this directory tells its servers (SPEC M13).
            let cwd = std::env::current_dir()
                .map_or_else(|_| "/".to_string(), |d| d.to_string_lossy().into_owned());
            let mut conn = Conn {
                stdin,
                roots: mcp_client::roots_of(&cwd, &[]),
                rx: read_stdout(stdout),
                next_id: 1,
                child: &mut child,
                stderr: &stderr,
                env_names,
            };
            check(&mut conn, &limits)
        }
        _ => {
            println!("FAIL  the server's pipes could not be opened");
            1
        }
    };
    stop(&mut child);
    code
}

/// What the check takes from the agent's configuration.
struct Limits {
    /// `BUZZ_AGENT_HOOK_TIMEOUT_MS`.
    hook_ms: u64,
    /// `BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS`, in ms.
    init_ms: u64,
    /// `BUZZ_AGENT_STOP_MAX_REJECTIONS`: the `budgetRemaining` a hook is told.
    budget: u32,
    /// The cap on a hook answer's text (`BUZZ_AGENT_MAX_TOOL_RESULT_TEXT_BYTES`).
    text_cap: usize,
}

/// The [`Limits`] and `BUZZ_AGENT_CHILD_ENV`, validated by the same rules as the agent (the
/// provider variables are irrelevant here and filled in if absent).
fn settings() -> Result<(Limits, Vec<String>), buzz_agent_core::config::ConfigErrors> {
    let mut env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    env.entry("BUZZ_AGENT_PROVIDER".into())
        .or_insert_with(|| "openai".into());
    env.entry("OPENAI_COMPAT_MODEL".into())
        .or_insert_with(|| "hooks-check".into());
    env.entry("ANTHROPIC_API_KEY".into())
        .or_insert_with(|| "unused".into());
    env.entry("ANTHROPIC_MODEL".into())
        .or_insert_with(|| "unused".into());
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| e.to_string());
    let cfg = buzz_agent_core::Config::from_env_map(&env, &read)?;
    let limits = Limits {
        hook_ms: cfg.hook_timeout_ms,
        init_ms: cfg.mcp_init_timeout_ms,
        budget: cfg.stop_max_rejections,
        text_cap: cfg.max_tool_result_text_bytes,
    };
    Ok((limits, cfg.child_env))
}

/// The server's stderr: each line forwarded to our stderr as `[server] …` (cut to
/// [`STDERR_LINE_BYTES`]), the last [`STDERR_TAIL_LINES`] kept for the report.
struct ServerStderr {
    state: Arc<(Mutex<StderrState>, Condvar)>,
}

#[derive(Default)]
struct StderrState {
    tail: VecDeque<String>,
    closed: bool,
}

impl ServerStderr {
    fn start(pipe: Option<std::process::ChildStderr>) -> ServerStderr {
        let state = Arc::new((Mutex::new(StderrState::default()), Condvar::new()));
        let Some(pipe) = pipe else {
            state.0.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            return ServerStderr { state };
        };
        let shared = state.clone();
        std::thread::spawn(move || {
            let mut pipe = pipe;
            // Split as the agent splits a server's stderr: bounded (a line over the cap is cut
            // and marked, its rest read and dropped), decoded lossily.
            let mut split = StderrLines::new(STDERR_LINE_BYTES);
            let mut lines = Vec::new();
            let mut buf = vec![0u8; 8 * 1024];
            loop {
                let n = pipe.read(&mut buf).unwrap_or(0);
                match buf.get(..n) {
                    Some(chunk) if n > 0 => split.push(chunk, &mut lines),
                    _ => lines.extend(split.finish()),
                }
                for line in lines.drain(..) {
                    eprintln!("[server] {}", esc(&line));
                    let (lock, _) = &*shared;
                    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if st.tail.len() == STDERR_TAIL_LINES {
                        st.tail.pop_front();
                    }
                    st.tail.push_back(line);
                }
                if n == 0 {
                    break;
                }
            }
            let (lock, cv) = &*shared;
            lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            cv.notify_all();
        });
        ServerStderr { state }
    }

    /// The last lines, once the pipe closed (at most `wait` of waiting: a grandchild may hold
    /// it open).
    fn tail(&self, wait: Duration) -> Vec<String> {
        let (lock, cv) = &*self.state;
        let deadline = Instant::now() + wait;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !st.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = cv
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        st.tail.iter().cloned().collect()
    }
}

/// The server's stdout as JSON-RPC messages, read as the agent reads them (its line codec and
/// `jsonrpc::parse_message`), on a channel (closed at EOF). Lines that are no message are
/// skipped with a note on stderr, as the agent skips them.
fn read_stdout(mut stdout: std::process::ChildStdout) -> Receiver<Message> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = LineBuffer::new(16 * 1024 * 1024);
        let mut events = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            lines.push(&buf[..n], &mut events);
            for ev in events.drain(..) {
                match ev {
                    LineEvent::Line(l) => match jsonrpc::parse_message(&l) {
                        Ok(m) => {
                            if tx.send(m).is_err() {
                                return;
                            }
                        }
                        Err(e) => eprintln!(
                            "[server stdout, not JSON-RPC ({}), ignored] {}",
                            esc(&e.to_string()),
                            esc(&String::from_utf8_lossy(&l[..l.len().min(200)]))
                        ),
                    },
                    LineEvent::TooLong { .. } => {
                        eprintln!("[server stdout] a line over 16 MiB, ignored")
                    }
                }
            }
        }
    });
    rx
}

/// Why a request got no result.
#[derive(Debug)]
enum Failure {
    /// No answer within the time limit.
    Timeout,
    /// The server process exited (its status, worded).
    Exited(String),
    /// The server closed its stdout but is still running.
    Closed,
    /// A JSON-RPC error response.
    Rpc(RpcError),
    /// Writing the request failed.
    Write(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => f.write_str("timeout"),
            Failure::Exited(status) => write!(f, "the server exited ({status})"),
            Failure::Closed => f.write_str("the server closed its stdout"),
            Failure::Rpc(e) => write!(f, "JSON-RPC error {}: {:?}", e.code, e.message),
            Failure::Write(e) => write!(f, "cannot write to the server: {e}"),
        }
    }
}

struct Conn<'a> {
    stdin: ChildStdin,
    /// What `roots/list` is answered with.
    roots: Value,
    rx: Receiver<Message>,
    next_id: u64,
    child: &'a mut Child,
    stderr: &'a ServerStderr,
    /// The names of the variables the server got (SPEC S1), for the hint after a failed start.
    env_names: Vec<String>,
}

impl Conn<'_> {
    /// Send a request and wait for its result; a JSON-RPC error is a [`Failure::Rpc`].
    fn request(
        &mut self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        self.call(method, params, timeout)?.map_err(Failure::Rpc)
    }

    /// Send a request and wait for its response, `result` or JSON-RPC error, as the core's
    /// parser reads it (other messages are skipped; the server's requests answered as the
    /// agent answers them). A server that exits while
    /// we wait is reported as exited at once, whoever else holds its stdout open (a launcher's
    /// grandchild).
    fn call(
        &mut self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Result<Value, RpcError>, Failure> {
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self
            .stdin
            .write_all(jsonrpc::encode_request(id, method, params).as_bytes())
            .and_then(|()| self.stdin.flush())
        {
            return Err(self.exited().unwrap_or(Failure::Write(e.to_string())));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.exited().unwrap_or(Failure::Timeout));
            }
            let msg = match self.rx.recv_timeout(left.min(EXIT_POLL)) {
                Ok(msg) => msg,
                Err(mpsc::RecvTimeoutError::Timeout) => match self.exited() {
                    Some(exited) => return Err(exited),
                    None => continue,
                },
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Its stdout closed: usually it is exiting; give it a moment to be reaped.
                    let until = Instant::now() + Duration::from_millis(500);
                    while Instant::now() < until {
                        if let Some(exited) = self.exited() {
                            return Err(exited);
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    return Err(Failure::Closed);
                }
            };
            match msg {
                Message::Request {
                    id: asked, method, ..
                } => {
                    // The agent's answer; an elicitation (which a user answers) gets none.
                    if let Some(answer) =
                        mcp_client::answer_server_request(&asked, &method, &self.roots)
                    {
                        let _ = self.stdin.write_all(answer.as_bytes());
                        let _ = self.stdin.flush();
                    }
                }
                Message::Response {
                    id: answered,
                    outcome,
                } if jsonrpc::match_our_id(&answered) == Some(id) => {
                    return Ok(outcome);
                }
                Message::Notification { .. } | Message::Response { .. } => {}
            }
        }
    }

    /// `Some(Exited)` once the server process has exited.
    fn exited(&mut self) -> Option<Failure> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(Failure::Exited(buzz_agent_runtime::sys::exit_description(
                status,
            ))),
            _ => None,
        }
    }

    /// Prints the failure of `what`; after an exit, the server's last stderr lines too.
    fn report_failure(&self, what: &str, failure: &Failure, extra: &str) {
        println!("FAIL  {}", esc(&format!("{what}: {failure}{extra}")));
        if let Failure::Exited(_) = failure {
            let tail = self.stderr.tail(Duration::from_millis(500));
            if tail.is_empty() {
                println!("      (it wrote nothing to stderr)");
            } else {
                println!("      its last stderr lines:");
                for line in tail {
                    println!("      [server] {}", esc(&line));
                }
            }
        }
    }

    fn notify(&mut self, method: &str, params: &Value) {
        let _ = self
            .stdin
            .write_all(jsonrpc::encode_notification(method, params).as_bytes())
            .and_then(|()| self.stdin.flush());
    }
}

/// Names that look like a hook point but are not one (case C57): equal to a hook point's name
/// (`_Stop`, `_PostCompact`, `_SessionStart`, `_SessionEnd`) once case, `_` and `-` are ignored
/// (`_stop`, `Stop`, `_STOP`, `post_compact`, `session_start`), but not exactly it. Returns `(name, the hook point it resembles)`, in list order.
fn near_misses(names: &[String]) -> Vec<(&str, &'static str)> {
    let fold = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect()
    };
    names
        .iter()
        .filter(|n| !KNOWN_HOOKS.contains(&n.as_str()))
        .filter_map(|n| {
            KNOWN_HOOKS
                .iter()
                .find(|hook| fold(hook) == fold(n))
                .map(|hook| (n.as_str(), *hook))
        })
        .collect()
}

/// Why a non-empty hook answer objects only because of its shape (case C57: a FastMCP hook
/// that returns a dict, `False` or `None` instead of an empty string): the whole text is a
/// JSON object or array, a bare boolean, `null`/`None` or `0`. `None` for ordinary text.
fn shape_only(text: &str) -> Option<&'static str> {
    let t = text.trim();
    match t {
        "false" | "False" | "true" | "True" => return Some("a bare boolean"),
        "null" | "None" => return Some("a bare null/None"),
        "0" => return Some("a bare 0"),
        _ => {}
    }
    match serde_json::from_str::<Value>(t) {
        Ok(Value::Object(_)) => Some("a JSON object"),
        Ok(Value::Array(_)) => Some("a JSON array"),
        _ => None,
    }
}

/// At most `n` characters of `s`, with `…` when cut.
fn shown(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().nth(n).is_some() {
        out.push('…');
    }
    out
}

fn check(conn: &mut Conn<'_>, limits: &Limits) -> i32 {
    let init_ms = limits.init_ms;
    // The agent's own `initialize` (its version, its roots capability).
    let init = mcp_client::initialize_params(env!("CARGO_PKG_VERSION"), None);
    let init_timeout = Duration::from_millis(init_ms);
    let version = match conn.request("initialize", &init, init_timeout) {
        Ok(r) => r
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        Err(e) => {
            let extra = if matches!(e, Failure::Timeout) {
                format!(" after {init_ms} ms (BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS)")
            } else {
                String::new()
            };
            conn.report_failure("initialize", &e, &extra);
            println!(
                "      the server got only these variables of this environment, as under the agent: {}; \
                 BUZZ_AGENT_CHILD_ENV=NAME,PREFIX* passes more (an agent's client gives a server its own with its env entries)",
                if conn.env_names.is_empty() {
                    "none".to_string()
                } else {
                    conn.env_names.join(", ")
                }
            );
            return 1;
        }
    };
    if !mcp_client::ACCEPTED_MCP_VERSIONS.contains(&version.as_str()) {
        println!("FAIL  unsupported MCP protocol version '{version}'");
        return 1;
    }
    println!("ok    handshake (MCP {version})");
    conn.notify("notifications/initialized", &json!({}));
    // The pages the agent asks for, read and cut by the agent's rules; then what the agent
    // makes of them (the tools it offers, its hooks, what it drops and why).
    let mut listing = ToolListing::default();
    let mut cuts = Vec::new();
    let mut params = json!({});
    loop {
        match conn.request("tools/list", &params, init_timeout) {
            Ok(page) => match listing.page(&page, &mut cuts) {
                Some(cursor) => params = json!({"cursor": cursor}),
                None => break,
            },
            Err(e) => {
                conn.report_failure("tools/list", &e, "");
                return 1;
            }
        }
    }
    let seen = ToolsSeen::of(listing.take());
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            esc(&v.join(", ")).into_owned()
        }
    };
    let hooks = &seen.hooks;
    println!(
        "ok    {} model-visible tool(s): {}",
        seen.offered.len(),
        list(&seen.offered)
    );
    println!("      hook tool(s): {}", list(hooks));
    for (name, why) in &seen.dropped {
        let name = name.as_deref().map_or("a tool without a name".into(), esc);
        println!("note  {name}: dropped: {}", esc(why));
    }
    for cut in &cuts {
        println!("note  the agent stops reading the list here: {}", esc(cut));
    }
    // What the agent does not read may hold a hook point: no PASS for a list it cuts.
    let cut_line = "the agent reads only part of this server's tool list (see the note above); \
                    a hook point listed after that is never called";
    let names: Vec<String> = seen.offered.iter().chain(hooks).cloned().collect();
    let misses = near_misses(&names);
    for h in hooks {
        if !KNOWN_HOOKS.contains(&h.as_str()) && !misses.iter().any(|(n, _)| n == h) {
            println!(
                "note  {}: not a known hook point; hidden from the model and never called",
                esc(h)
            );
        }
    }
    for (name, hook) in &misses {
        let seen = if name.starts_with('_') {
            "hidden from the model"
        } else {
            "offered to the model as a tool"
        };
        println!(
            "note  {}: looks like the hook point {hook}, but names are exact (case too): never called as a hook; {seen}",
            esc(name)
        );
    }
    if !KNOWN_HOOKS.iter().any(|k| hooks.iter().any(|n| n == k)) {
        println!("FAIL: no hook point found ({})", KNOWN_HOOKS.join(", "));
        if !cuts.is_empty() {
            println!("      {cut_line}");
        }
        if misses.is_empty() && cuts.is_empty() {
            println!(
                "      a hook point is a tool named exactly {}; this server has none",
                KNOWN_HOOKS.join(", ")
            );
        } else if !misses.is_empty() {
            let shown: Vec<String> = misses
                .iter()
                .map(|(n, hook)| format!("{} (rename it {hook})", esc(n)))
                .collect();
            println!("      near misses: {}", shown.join(", "));
        }
        return 1;
    }
    let mut ok = true;
    for hook in KNOWN_HOOKS {
        if !hooks.iter().any(|n| n == hook) {
            println!("--    {hook}: not found");
            continue;
        }
        let Some(point) = HookPoint::from_tool_name(hook) else {
            continue;
        };
        // The request the agent sends, from the agent's own code.
        let params = hooks::first_call_params(point, "hooks-check", limits.budget);
        let started = Instant::now();
        let res = conn.call("tools/call", &params, Duration::from_millis(limits.hook_ms));
        let ms = started.elapsed().as_millis();
        let verb = point.effect();
        let verb = if verb == "log" { "be logged" } else { verb };
        match res {
            Ok(reply) => {
                let rpc_error = reply.as_ref().err().cloned();
                // The agent's verdict on this answer, by the agent's code.
                match hooks::classify_reply(reply, limits.text_cap) {
                    HookOutcome::Empty => {
                        println!("ok    {hook}: found, answered empty, {ms} ms — would not {verb}");
                    }
                    HookOutcome::Text(text) => match shape_only(&text) {
                        Some(shape) if verb != "be logged" => {
                            ok = false;
                            println!(
                                "FAIL  {hook}: found, answered {:?}, {ms} ms — {shape}: any non-empty text would {verb}, so this always does; \
                                 to not {verb}, return an empty string (or nothing)",
                                shown(&text, 200)
                            );
                        }
                        Some(_) | None => println!(
                            "ok    {hook}: found, answered, {ms} ms — would {verb}: {:?}",
                            shown(&text, 200)
                        ),
                    },
                    HookOutcome::Error(why) => {
                        ok = false;
                        let extra = format!(", {ms} ms — fails open: would not {verb}");
                        if let Some(e) = rpc_error {
                            let what = format!("{hook}: found, error");
                            conn.report_failure(&what, &Failure::Rpc(e), &extra);
                        } else {
                            let text = why.strip_prefix("isError: ").unwrap_or(&why);
                            let why = if text.trim().is_empty() {
                                "no error text".to_string()
                            } else {
                                format!("{:?}", shown(text, 500))
                            };
                            println!("FAIL  {hook}: found, error (isError result: {why}){extra}");
                        }
                    }
                    other @ (HookOutcome::Timeout | HookOutcome::Dead) => {
                        ok = false;
                        println!(
                            "FAIL  {hook}: found, {other:?}, {ms} ms — fails open: would not {verb}"
                        );
                    }
                }
            }
            Err(Failure::Timeout) => {
                ok = false;
                println!(
                    "FAIL  {hook}: found, timeout after {} ms (BUZZ_AGENT_HOOK_TIMEOUT_MS) — fails open; a 2nd consecutive timeout kills the server",
                    limits.hook_ms
                );
                let id = conn.next_id - 1;
                conn.notify(
                    "notifications/cancelled",
                    &json!({"requestId": id, "reason": "hook timeout"}),
                );
            }
            Err(e) => {
                ok = false;
                let extra = format!(", {ms} ms — fails open: would not {verb}");
                conn.report_failure(&format!("{hook}: found, error"), &e, &extra);
                if let Failure::Exited(_) = e {
                    return 1;
                }
            }
        }
    }
    if !cuts.is_empty() {
        ok = false;
        println!("FAIL  {cut_line}");
    }
    if ok {
        println!("PASS  the server follows the hook contract");
        0
    } else {
        println!("FAIL  the server does not follow the hook contract (see above)");
        1
    }
}

/// Close stdin, then TERM and KILL the group (SPEC M8, shortened for a one-shot check).
fn stop(child: &mut Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        signal_group(pid, Signal::Term);
        std::thread::sleep(Duration::from_millis(100));
        signal_group(pid, Signal::Kill);
    }
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c57_near_misses_ignore_case_underscores_and_dashes_but_not_exact_names() {
        let names: Vec<String> = [
            "_stop",
            "Stop",
            "stop",
            "_STOP",
            "PostCompact",
            "post_compact",
            "_Stop",
            "_Other",
            "stopper",
            "todo_add",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let got = near_misses(&names);
        assert_eq!(
            got,
            vec![
                ("_stop", "_Stop"),
                ("Stop", "_Stop"),
                ("stop", "_Stop"),
                ("_STOP", "_Stop"),
                ("PostCompact", "_PostCompact"),
                ("post_compact", "_PostCompact"),
            ]
        );
    }

    #[test]
    fn h10_h11_the_session_points_are_hook_points_and_have_near_misses_too() {
        assert_eq!(
            KNOWN_HOOKS,
            ["_SessionStart", "_Stop", "_PostCompact", "_SessionEnd"]
        );
        let names: Vec<String> = ["session_start", "_sessionEnd", "_SessionStart"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            near_misses(&names),
            vec![
                ("session_start", "_SessionStart"),
                ("_sessionEnd", "_SessionEnd")
            ]
        );
    }

    #[test]
    fn c57_answers_that_object_only_by_their_shape() {
        for t in [
            "false",
            "False",
            "true",
            " None ",
            "null",
            "0",
            "{}",
            "{\"ok\": true}",
            "[]",
            "[1, 2]",
        ] {
            assert!(shape_only(t).is_some(), "{t}");
        }
        for t in [
            "tests are red",
            "\"quoted\"",
            "0 tests passed",
            "42",
            "none of it",
        ] {
            assert_eq!(shape_only(t), None, "{t}");
        }
    }
}
