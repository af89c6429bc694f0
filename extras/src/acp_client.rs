//! A minimal blocking ACP client that drives an agent child process over its stdio, one JSON-RPC
//! message per line: the client of `demo` and `exec`. Requests get ids from 1; while a request
//! waits for its response, every other message the agent writes (notifications, and requests
//! such as `session/request_permission`) is handed to a callback, which answers the requests.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why a request got no response.
#[derive(Debug)]
pub enum ClientError {
    /// The agent closed its stdout (it exited, or is exiting).
    Closed,
    /// Writing to the agent or reading from it failed.
    Io(String),
    /// The agent wrote a line that is not JSON.
    NotJson(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Closed => f.write_str("the agent closed its stdout"),
            ClientError::Io(e) => write!(f, "talking to the agent failed: {e}"),
            ClientError::NotJson(line) => write!(f, "the agent wrote a non-JSON line: {line}"),
        }
    }
}

/// The agent child process and its stdio.
pub struct AcpChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl AcpChild {
    /// Spawns `cmd` with stdin and stdout piped (its stderr as `cmd` says).
    ///
    /// # Errors
    /// The spawn error, worded.
    pub fn spawn(mut cmd: Command) -> Result<AcpChild, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the agent: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("the agent's stdout is missing")?;
        Ok(AcpChild {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            next_id: 1,
        })
    }

    /// Sends a request and reads until its response, which it returns whole (`result` or
    /// `error`). Every other message goes to `on_message`: for a request from the agent, its
    /// `Some(result)` is sent back as the answer, `None` as a `-32601` error; for a
    /// notification the return value is ignored.
    ///
    /// # Errors
    /// The agent closed its stdout, wrote a line that is not JSON, or a pipe failed.
    pub fn request(
        &mut self,
        method: &str,
        params: Value,
        on_message: &mut dyn FnMut(&Value) -> Option<Value>,
    ) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let line = match self.lines.next() {
                None => return Err(ClientError::Closed),
                Some(Err(e)) => return Err(ClientError::Io(e.to_string())),
                Some(Ok(line)) => line,
            };
            if line.trim().is_empty() {
                continue;
            }
            let msg: Value = serde_json::from_str(&line)
                .map_err(|_| ClientError::NotJson(line.chars().take(200).collect()))?;
            let is_ours = msg.get("method").is_none() && msg.get("id") == Some(&json!(id));
            if is_ours {
                return Ok(msg);
            }
            let answer = on_message(&msg);
            if let (Some(_), Some(their_id)) = (msg.get("method"), msg.get("id")) {
                let reply = match answer {
                    Some(result) => json!({"jsonrpc": "2.0", "id": their_id, "result": result}),
                    None => json!({"jsonrpc": "2.0", "id": their_id,
                        "error": {"code": -32601, "message": "method not supported by this client"}}),
                };
                self.send(&reply)?;
            }
        }
    }

    fn send(&mut self, msg: &Value) -> Result<(), ClientError> {
        let stdin = self.stdin.as_mut().ok_or(ClientError::Closed)?;
        stdin
            .write_all(format!("{msg}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| {
                // The agent is gone (it exited at start-up, e.g. on a configuration error):
                // the same as a closed stdout, whichever the client notices first.
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    ClientError::Closed
                } else {
                    ClientError::Io(e.to_string())
                }
            })
    }

    /// Closes the agent's stdin (EOF: it shuts its MCP servers down and exits, SPEC P1) and
    /// waits for it to exit, at most `limit`; then kills it. Returns its exit status.
    pub fn finish(mut self, limit: Duration) -> Option<ExitStatus> {
        drop(self.stdin.take());
        self.wait(limit)
    }

    /// Waits up to `limit` for the agent to exit (stdin left as it is), then kills it.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
            }
        }
    }
}
