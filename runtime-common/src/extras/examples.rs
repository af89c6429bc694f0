//! Bundled example MCP hook servers (SPEC E1, E2), run as `buzz-agent example-server <name>`.
//! Plain blocking std IO over stdin/stdout — these are tiny servers, not part of the agent loop.
//! The JSON-RPC codec is the core's.
//!
//! - `testguard` (E1): `_Stop` runs `TESTGUARD_CMD` with `sh -c` in the current directory (the
//!   session cwd), bounded by `TESTGUARD_TIMEOUT_MS` (default 2000); a failing command objects
//!   with its exit status and last output lines, a passing one answers empty. A command that
//!   times out is killed and answers empty (fail-open, noted on stderr). The command runs in the
//!   server's process group, so whatever it started is stopped with the server (SPEC M8).
//! - `todo` (E2): model-visible `todo_add {item}`, `todo_done {item}`, `todo_list`; `_Stop`
//!   objects while items are open (lists them); `_PostCompact` returns the current list;
//!   `_SessionStart` re-injects the items still open (SPEC H10) and `_SessionEnd` says how many
//!   are left (logged by the agent, H11). With `TODO_FILE=<path>` the list is kept in that
//!   file (JSON `{"open": [...], "done": [...]}`, written after every change), so a new session
//!   starts with the items an earlier one left open.
//! - `interceptors` (SPEC X1): the SEP-2624 example interceptor server (the core's
//!   `interceptor::example_server`) over stdio, configured by `EXAMPLE_INTERCEPTORS` (a JSON
//!   array of interceptors; default: one request-phase validator, `policy/no-rm-rf`, that
//!   denies calls whose arguments contain `rm -rf`). The client gives it to the server with
//!   the server's `env` entry (SPEC M1; the agent's own environment reaches a server only
//!   through the allowlist, S1).

use buzz_agent_core::interceptor::example_server::ExampleServer;
use buzz_agent_core::jsonrpc::{self, LineBuffer, LineEvent, RpcError};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Lines of failing output a testguard objection carries.
const TESTGUARD_TAIL_LINES: usize = 30;

/// The configuration of the `interceptors` example server.
pub const INTERCEPTORS_VAR: &str = "EXAMPLE_INTERCEPTORS";
/// Its configuration when [`INTERCEPTORS_VAR`] is unset.
pub const DEFAULT_INTERCEPTORS: &str = r#"[{"name":"policy/no-rm-rf","behavior":"deny-matching","pattern":"rm -rf","phases":"request","description":"denies tool calls whose arguments contain rm -rf"}]"#;

/// Run the named example server on stdin/stdout. Returns the process exit code.
pub fn run(name: &str) -> i32 {
    let mut server: Box<dyn Example> = match name {
        "testguard" => Box::new(TestGuard::from_env()),
        "todo" => Box::new(Todo::from_env()),
        "interceptors" => return run_interceptors(),
        other => {
            eprintln!(
                "buzz-agent: unknown example server '{other}' (available: testguard, todo, interceptors)"
            );
            return 2;
        }
    };
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut lines = LineBuffer::new(16 * 1024 * 1024);
    let mut events = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) | Err(_) => return 0,
            Ok(n) => n,
        };
        lines.push(&buf[..n], &mut events);
        for ev in events.drain(..) {
            let LineEvent::Line(line) = ev else { continue };
            let Ok(jsonrpc::Message::Request { id, method, params }) =
                jsonrpc::parse_message(&line)
            else {
                continue;
            };
            let out = match handle(server.as_mut(), &method, &params) {
                Ok(result) => jsonrpc::encode_result(&id, &result),
                Err(err) => jsonrpc::encode_error(Some(&id), &err),
            };
            if stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return 0;
            }
        }
    }
}

/// The example interceptor server (SPEC X1): every line goes to the core's example server
/// logic, every answer back. Exit 2 on a bad `EXAMPLE_INTERCEPTORS`.
fn run_interceptors() -> i32 {
    let config = std::env::var(INTERCEPTORS_VAR).unwrap_or_else(|_| DEFAULT_INTERCEPTORS.into());
    let server = serde_json::from_str::<Value>(&config)
        .map_err(|e| format!("not JSON: {e}"))
        .and_then(|v| ExampleServer::from_config(&v).map_err(|e| e.to_string()));
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            eprintln!("interceptors: bad {INTERCEPTORS_VAR}: {e}");
            return 2;
        }
    };
    let names: Vec<&str> = server
        .interceptors()
        .iter()
        .map(|i| i.descriptor.name.as_str())
        .collect();
    eprintln!("interceptors: serving {}", names.join(", "));
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut lines = LineBuffer::new(16 * 1024 * 1024);
    let mut events = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) | Err(_) => return 0,
            Ok(n) => n,
        };
        lines.push(&buf[..n], &mut events);
        for ev in events.drain(..) {
            let LineEvent::Line(line) = ev else { continue };
            let Some(out) = server.handle_line(&line) else {
                continue;
            };
            if stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return 0;
            }
        }
    }
}

/// One example server: its tool list and its tool calls.
trait Example {
    fn name(&self) -> &'static str;
    fn tools(&self) -> Value;
    fn call(&mut self, tool: &str, args: &Value) -> Result<String, RpcError>;
}

fn handle(server: &mut dyn Example, method: &str, params: &Value) -> Result<Value, RpcError> {
    match method {
        "initialize" => {
            let requested = params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("2025-11-25");
            Ok(json!({
                "protocolVersion": requested,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": server.name(), "version": env!("CARGO_PKG_VERSION")}
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": server.tools()})),
        "tools/call" => {
            let tool = params.get("name").and_then(Value::as_str).unwrap_or("");
            let args = params
                .get("arguments")
                .cloned()
                .unwrap_or_else(|| json!({}));
            let text = server.call(tool, &args)?;
            Ok(json!({"content": [{"type": "text", "text": text}]}))
        }
        other => Err(RpcError::new(
            RpcError::METHOD_NOT_FOUND,
            format!("Method not found: {other}"),
        )),
    }
}

fn unknown_tool(tool: &str) -> RpcError {
    RpcError::new(RpcError::INVALID_PARAMS, format!("unknown tool: {tool}"))
}

/// E1.
struct TestGuard {
    cmd: Option<String>,
    timeout: Duration,
}

impl TestGuard {
    fn from_env() -> TestGuard {
        let cmd = std::env::var("TESTGUARD_CMD")
            .ok()
            .filter(|c| !c.trim().is_empty());
        if cmd.is_none() {
            eprintln!("testguard: TESTGUARD_CMD is not set; _Stop will never object");
        }
        let ms = std::env::var("TESTGUARD_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(2000);
        TestGuard {
            cmd,
            timeout: Duration::from_millis(ms.max(1)),
        }
    }

    fn run_tests(&self) -> String {
        let Some(cmd) = &self.cmd else {
            return String::new();
        };
        // The test command stays in the server's own process group, so the agent's process-group
        // kill (hook timeouts, shutdown; SPEC H4, M8) reaches it and everything it started.
        let mut child = match std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("testguard: cannot run TESTGUARD_CMD: {e}");
                return String::new();
            }
        };
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(o) = out.as_mut() {
                let _ = o.read_to_string(&mut text);
            }
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_string(&mut text);
            }
            text
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) | Err(_) => {
                    // Only the shell: processes it started live on in this server's group until
                    // the agent stops the server (documented in the module docs).
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let Some(status) = status else {
            eprintln!(
                "testguard: TESTGUARD_CMD did not finish within {:?}; not objecting",
                self.timeout
            );
            return String::new();
        };
        let output = reader.join().unwrap_or_default();
        if status.success() {
            return String::new();
        }
        let lines: Vec<&str> = output.lines().collect();
        let tail = lines[lines.len().saturating_sub(TESTGUARD_TAIL_LINES)..].join("\n");
        let code = status
            .code()
            .map_or_else(|| "a signal".to_string(), |c| format!("exit status {c}"));
        format!(
            "The test command `{cmd}` fails ({code}). Fix it before finishing. Last output:\n{tail}"
        )
    }
}

impl Example for TestGuard {
    fn name(&self) -> &'static str {
        "testguard"
    }
    fn tools(&self) -> Value {
        json!([{"name": "_Stop", "description": "objects while TESTGUARD_CMD fails", "inputSchema": {"type": "object"}}])
    }
    fn call(&mut self, tool: &str, _args: &Value) -> Result<String, RpcError> {
        match tool {
            "_Stop" => Ok(self.run_tests()),
            other => Err(unknown_tool(other)),
        }
    }
}

/// E2.
#[derive(Default)]
struct Todo {
    open: Vec<String>,
    done: Vec<String>,
    /// `TODO_FILE`: where the list is kept between sessions.
    file: Option<std::path::PathBuf>,
}

impl Todo {
    /// The list of `TODO_FILE` when it is set (a missing file is an empty list; one that
    /// cannot be read is reported on stderr and left alone until the next change).
    fn from_env() -> Todo {
        let file = std::env::var_os("TODO_FILE")
            .filter(|f| !f.is_empty())
            .map(std::path::PathBuf::from);
        Todo::load(file)
    }

    /// The list kept in `file`, if any.
    fn load(file: Option<std::path::PathBuf>) -> Todo {
        let mut todo = Todo {
            file,
            ..Todo::default()
        };
        if let Some(path) = &todo.file {
            match std::fs::read_to_string(path) {
                Ok(text) => match serde_json::from_str::<Value>(&text) {
                    Ok(v) => {
                        let items = |k: &str| -> Vec<String> {
                            v[k].as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        };
                        todo.open = items("open");
                        todo.done = items("done");
                    }
                    Err(e) => {
                        eprintln!("todo: {} is not JSON ({e}); starting empty", path.display())
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => eprintln!("todo: cannot read {}: {e}; starting empty", path.display()),
            }
        }
        todo
    }

    /// Writes the list to `TODO_FILE`, if set.
    fn save(&self) {
        let Some(path) = &self.file else { return };
        let text = json!({"open": self.open, "done": self.done}).to_string();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("todo: cannot write {}: {e}", path.display());
        }
    }

    fn list(&self) -> String {
        if self.open.is_empty() && self.done.is_empty() {
            return String::new();
        }
        let mut s = String::from("Todo list:\n");
        for i in &self.open {
            s.push_str(&format!("- [ ] {i}\n"));
        }
        for i in &self.done {
            s.push_str(&format!("- [x] {i}\n"));
        }
        s
    }
}

impl Example for Todo {
    fn name(&self) -> &'static str {
        "todo"
    }
    fn tools(&self) -> Value {
        let item = json!({"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]});
        json!([
            {"name": "todo_add", "description": "Add an open item to the todo list", "inputSchema": item},
            {"name": "todo_done", "description": "Mark an open item done (exact text)", "inputSchema": item},
            {"name": "todo_list", "description": "Show the todo list", "inputSchema": {"type": "object", "properties": {}}, "annotations": {"readOnlyHint": true}},
            {"name": "_Stop", "description": "objects while items are open", "inputSchema": {"type": "object"}},
            {"name": "_PostCompact", "description": "re-injects the todo list", "inputSchema": {"type": "object"}},
            {"name": "_SessionStart", "description": "re-injects the items still open", "inputSchema": {"type": "object"}},
            {"name": "_SessionEnd", "description": "says how many items are still open", "inputSchema": {"type": "object"}}
        ])
    }
    fn call(&mut self, tool: &str, args: &Value) -> Result<String, RpcError> {
        let item = || {
            args.get("item")
                .and_then(Value::as_str)
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    RpcError::new(
                        RpcError::INVALID_PARAMS,
                        "argument 'item' (string) is required",
                    )
                })
        };
        match tool {
            "todo_add" => {
                let it = item()?;
                self.open.push(it.clone());
                self.save();
                Ok(format!("added: {it}"))
            }
            "todo_done" => {
                let it = item()?;
                match self.open.iter().position(|o| *o == it) {
                    Some(i) => {
                        let done = self.open.remove(i);
                        self.done.push(done);
                        self.save();
                        Ok(format!("done: {it}"))
                    }
                    None => Err(RpcError::new(
                        RpcError::INVALID_PARAMS,
                        format!("no open item '{it}'"),
                    )),
                }
            }
            "todo_list" => Ok(match self.list() {
                l if l.is_empty() => "the todo list is empty".into(),
                l => l,
            }),
            "_Stop" if self.open.is_empty() => Ok(String::new()),
            "_Stop" => {
                let items: Vec<String> = self.open.iter().map(|i| format!("- {i}")).collect();
                Ok(format!(
                    "These todo items are still open; finish them (and mark them done) before ending:\n{}",
                    items.join("\n")
                ))
            }
            "_PostCompact" => Ok(self.list()),
            "_SessionStart" if self.open.is_empty() => Ok(String::new()),
            "_SessionStart" => {
                let items: Vec<String> = self.open.iter().map(|i| format!("- {i}")).collect();
                Ok(format!(
                    "Todo items still open from earlier work (the todo_* tools manage them):\n{}",
                    items.join("\n")
                ))
            }
            "_SessionEnd" => Ok(match self.open.len() {
                0 => String::new(),
                n => format!("{n} todo item(s) still open"),
            }),
            other => Err(unknown_tool(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c53_todo_list_is_read_only_so_exec_and_acpx_defaults_allow_it() {
        let tools = Todo::default().tools();
        let read_only: Vec<&str> = tools
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["annotations"]["readOnlyHint"] == true)
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(read_only, ["todo_list"]);
    }

    #[test]
    fn e2_todo_objects_while_items_are_open_and_reinjects_after_compaction() {
        let mut t = Todo::default();
        assert_eq!(t.call("_Stop", &json!({})).unwrap(), "");
        t.call("todo_add", &json!({"item": "write tests"})).unwrap();
        assert!(
            t.call("_Stop", &json!({}))
                .unwrap()
                .contains("- write tests")
        );
        assert!(
            t.call("_PostCompact", &json!({}))
                .unwrap()
                .contains("[ ] write tests")
        );
        t.call("todo_done", &json!({"item": "write tests"}))
            .unwrap();
        assert_eq!(t.call("_Stop", &json!({})).unwrap(), "");
        assert!(t.call("todo_done", &json!({"item": "nope"})).is_err());
        assert!(t.call("todo_add", &json!({})).is_err());
    }

    #[test]
    fn e2_h10_todo_reinjects_open_items_at_session_start_from_its_file() {
        let dir = std::env::temp_dir().join(format!("buzz-todo-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("todo.json");
        let _ = std::fs::remove_file(&path);
        let mut first = Todo {
            file: Some(path.clone()),
            ..Todo::default()
        };
        assert_eq!(first.call("_SessionStart", &json!({})).unwrap(), "");
        first
            .call("todo_add", &json!({"item": "write docs"}))
            .unwrap();
        first.call("todo_add", &json!({"item": "ship"})).unwrap();
        first.call("todo_done", &json!({"item": "ship"})).unwrap();
        assert_eq!(
            first.call("_SessionEnd", &json!({})).unwrap(),
            "1 todo item(s) still open"
        );
        // A new process (a new session) reads the file.
        let text = std::fs::read_to_string(&path).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v, json!({"open": ["write docs"], "done": ["ship"]}));
        let mut second = Todo::load(Some(path.clone()));
        let start = second.call("_SessionStart", &json!({})).unwrap();
        assert!(start.ends_with("\n- write docs"), "{start}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn e1_testguard_objects_on_failure_with_the_tail_and_passes_silently() {
        let fail = TestGuard {
            cmd: Some("echo one; echo two >&2; exit 3".into()),
            timeout: Duration::from_secs(5),
        };
        let text = fail.run_tests();
        assert!(
            text.contains("exit status 3") && text.contains("one") && text.contains("two"),
            "{text}"
        );
        let pass = TestGuard {
            cmd: Some("true".into()),
            timeout: Duration::from_secs(5),
        };
        assert_eq!(pass.run_tests(), "");
        let slow = TestGuard {
            cmd: Some("sleep 5".into()),
            timeout: Duration::from_millis(100),
        };
        assert_eq!(slow.run_tests(), "");
    }
}
