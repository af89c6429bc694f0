//! `buzz-agent hooks check -- <command> [args…]` (SPEC P3): spawn one MCP server as the agent
//! would, list its hooks and other tools, call each known hook once under the configured timeout
//! and print, per hook: found, answered/empty/error/timeout, latency, and whether the answer
//! would object. Exit 0 when the server follows the contract, 1 when it does not, 2 on usage or
//! configuration errors. Plain blocking std IO: this is a one-shot diagnostic, not the agent.

use crate::sys::signal_group;
use buzz_agent_core::Signal;
use buzz_agent_core::jsonrpc::{self, LineBuffer, LineEvent};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const KNOWN_HOOKS: [&str; 2] = ["_Stop", "_PostCompact"];

/// Run the check; returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let Some(sep) = args.iter().position(|a| a == "--") else {
        eprintln!("usage: buzz-agent hooks check -- <command> [args…]");
        return 2;
    };
    let Some((command, rest)) = args[sep + 1..].split_first() else {
        eprintln!("usage: buzz-agent hooks check -- <command> [args…]");
        return 2;
    };
    let (hook_ms, init_ms) = match timeouts() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("buzz-agent: configuration error: {e}");
            return 2;
        }
    };
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !buzz_agent_core::config::is_agent_secret_or_own_variable(k))
        .collect();
    let mut child = match Command::new(command)
        .args(rest)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            println!("FAIL  cannot start '{command}': {e}");
            return 1;
        }
    };
    let code = check(&mut child, hook_ms, init_ms);
    stop(&mut child);
    code
}

/// `BUZZ_AGENT_HOOK_TIMEOUT_MS` and `BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS`, validated by the same
/// rules as the agent (the provider variables are irrelevant here and filled in if absent).
fn timeouts() -> Result<(u64, u64), String> {
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
    let cfg = buzz_agent_core::Config::from_env_map(&env, &read).map_err(|e| e.to_string())?;
    Ok((cfg.hook_timeout_ms, cfg.mcp_init_timeout_ms))
}

struct Conn {
    stdin: ChildStdin,
    rx: Receiver<Value>,
    next_id: u64,
}

impl Conn {
    /// Send a request and wait for its response (other messages are skipped; pings answered).
    fn request(
        &mut self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.stdin
            .write_all(jsonrpc::encode_request(id, method, params).as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("write failed: {e}"))?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self.rx.recv_timeout(left).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => "timeout".to_string(),
                mpsc::RecvTimeoutError::Disconnected => "the server closed its stdout".to_string(),
            })?;
            if msg.get("method").and_then(Value::as_str) == Some("ping") {
                if let Some(pid) = msg.get("id") {
                    let pong = json!({"jsonrpc": "2.0", "id": pid, "result": {}});
                    let _ = self.stdin.write_all(format!("{pong}\n").as_bytes());
                }
                continue;
            }
            if msg.get("id").and_then(jsonrpc::match_our_id) != Some(id)
                || msg.get("method").is_some()
            {
                continue;
            }
            if let Some(err) = msg.get("error") {
                return Err(format!("error {}", err));
            }
            return Ok(msg.get("result").cloned().unwrap_or(Value::Null));
        }
    }
}

fn check(child: &mut Child, hook_ms: u64, init_ms: u64) -> i32 {
    let (Some(stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        println!("FAIL  the server's pipes could not be opened");
        return 1;
    };
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
                    LineEvent::Line(l) => match serde_json::from_slice::<Value>(&l) {
                        Ok(v) => {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                        Err(_) => eprintln!(
                            "WARN  ignoring a non-JSON stdout line: {}",
                            String::from_utf8_lossy(&l[..l.len().min(200)])
                        ),
                    },
                    LineEvent::TooLong { .. } => {
                        eprintln!("WARN  the server wrote a stdout line over 16 MiB")
                    }
                }
            }
        }
    });
    let mut conn = Conn {
        stdin,
        rx,
        next_id: 1,
    };
    let init = json!({"protocolVersion": buzz_agent_core::MCP_PROTOCOL_VERSION, "capabilities": {},
        "clientInfo": {"name": "buzz-agent", "version": env!("CARGO_PKG_VERSION")}});
    let init_timeout = Duration::from_millis(init_ms);
    let version = match conn.request("initialize", &init, init_timeout) {
        Ok(r) => r
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        Err(e) => {
            println!(
                "FAIL  initialize: {e} (after {init_ms} ms; BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS)"
            );
            return 1;
        }
    };
    if !buzz_agent_core::ACCEPTED_MCP_VERSIONS.contains(&version.as_str()) {
        println!("FAIL  unsupported MCP protocol version '{version}'");
        return 1;
    }
    println!("ok    handshake (MCP {version})");
    let _ = conn.stdin.write_all(
        jsonrpc::encode_notification("notifications/initialized", &json!({})).as_bytes(),
    );
    let mut tools: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let params = cursor
            .as_ref()
            .map_or_else(|| json!({}), |c| json!({"cursor": c}));
        match conn.request("tools/list", &params, init_timeout) {
            Ok(r) => {
                tools.extend(
                    r.get("tools")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
                cursor = r
                    .get("nextCursor")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .filter(|c| !c.is_empty());
                if cursor.is_none() {
                    break;
                }
            }
            Err(e) => {
                println!("FAIL  tools/list: {e}");
                return 1;
            }
        }
    }
    let names: Vec<String> = tools
        .iter()
        .filter_map(|t| t.get("name").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    let hooks: Vec<&String> = names.iter().filter(|n| n.starts_with('_')).collect();
    let visible: Vec<&String> = names.iter().filter(|n| !n.starts_with('_')).collect();
    let listed = if visible.is_empty() {
        "none".to_string()
    } else {
        visible
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("ok    {} model-visible tool(s): {listed}", visible.len());
    println!(
        "      hook tool(s): {}",
        if hooks.is_empty() {
            "none".to_string()
        } else {
            hooks
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let mut ok = true;
    for h in &hooks {
        if !KNOWN_HOOKS.contains(&h.as_str()) {
            println!("note  {h}: not a known hook point; hidden from the model and never called");
        }
    }
    for hook in KNOWN_HOOKS {
        if !hooks.iter().any(|h| *h == hook) {
            println!("--    {hook}: not found");
            continue;
        }
        let params = json!({"name": hook, "arguments": {},
            "_meta": {"buzz/hook": {"point": hook, "sessionId": "hooks-check", "attempt": 1, "budgetRemaining": 3}}});
        let started = Instant::now();
        let res = conn.request("tools/call", &params, Duration::from_millis(hook_ms));
        let ms = started.elapsed().as_millis();
        let verb = if hook == "_Stop" { "object" } else { "inject" };
        match res {
            Ok(r) if r.get("isError").and_then(Value::as_bool) == Some(true) => {
                ok = false;
                println!(
                    "FAIL  {hook}: found, error (isError result), {ms} ms — fails open: would not {verb}"
                );
            }
            Ok(r) => {
                let text: Vec<&str> = r
                    .get("content")
                    .and_then(Value::as_array)
                    .map(|c| {
                        c.iter()
                            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                            .filter_map(|b| b.get("text").and_then(Value::as_str))
                            .collect()
                    })
                    .unwrap_or_default();
                let text = text.join("\n");
                if text.trim().is_empty() {
                    println!("ok    {hook}: found, answered empty, {ms} ms — would not {verb}");
                } else {
                    let shown: String = text.chars().take(200).collect();
                    println!("ok    {hook}: found, answered, {ms} ms — would {verb}: {shown:?}");
                }
            }
            Err(e) if e == "timeout" => {
                ok = false;
                println!(
                    "FAIL  {hook}: found, timeout after {hook_ms} ms (BUZZ_AGENT_HOOK_TIMEOUT_MS) — fails open; a 2nd consecutive timeout kills the server"
                );
                let _ = conn.stdin.write_all(
                    jsonrpc::encode_notification(
                        "notifications/cancelled",
                        &json!({"requestId": conn.next_id - 1, "reason": "hook timeout"}),
                    )
                    .as_bytes(),
                );
            }
            Err(e) => {
                ok = false;
                println!(
                    "FAIL  {hook}: found, error ({e}), {ms} ms — fails open: would not {verb}"
                );
            }
        }
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
