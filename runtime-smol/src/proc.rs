//! MCP child processes (SPEC M1, M7, M8, C34): spawned in their own process group with all
//! three streams piped, stdout streamed as bytes, stderr as lines, exit reported after reaping.
//! The runtime alone keeps `ProcKey → child`; the core never sees a pid.
//!
//! `smol::process` (async-process) has no `process_group`, so the command is built as a
//! `std::process::Command` (which has it) and converted; async-process keeps the
//! conversion's settings and adds its own stdio wrapping and reaping.

use buzz_agent_core::{Input, ProcKey, Signal, SpawnSpec};
use smol::channel::Sender;
use smol::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use smol::process::Stdio;
use smol::{LocalExecutor, Timer};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::time::Duration;

/// Bytes per read of a child's stdout (one buffer per child for its whole life; a full pipe
/// takes a few reads).
const STDOUT_BUF: usize = 16 * 1024;
use buzz_agent_core::io::MAX_STDERR_LINE_BYTES as MAX_STDERR_LINE;
/// How long to wait for stderr to drain after the child exited, so the exit report carries
/// the last stderr lines (a grandchild holding stderr open must not delay it longer).
const STDERR_DRAIN: Duration = Duration::from_millis(300);

/// One live child as the driver sees it.
struct Child {
    /// `Some(line)` writes, `None` closes stdin.
    stdin: Option<Sender<Option<String>>>,
    /// Process group id (= the leader's pid, `process_group(0)`).
    pgid: i32,
}

/// The live children, by process key.
#[derive(Default)]
pub struct Children {
    map: BTreeMap<ProcKey, Child>,
}

impl Children {
    /// Spawn per `SpawnMcp` and report `McpSpawned`/`McpSpawnFailed`, then the IO, with one
    /// task per pipe and one that waits for the exit, all on `ex`.
    pub fn spawn(
        &mut self,
        ex: &LocalExecutor<'_>,
        proc: ProcKey,
        spec: SpawnSpec,
        tx: &Sender<Input>,
    ) {
        let mut std_cmd = std::process::Command::new(&spec.command);
        std_cmd
            .args(&spec.args)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&spec.cwd)
            .process_group(0);
        let mut cmd = smol::process::Command::from(std_cmd);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.try_send(Input::McpSpawnFailed {
                    proc,
                    error: e.to_string(),
                });
                return;
            }
        };
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        let _ = tx.try_send(Input::McpSpawned { proc });
        let (in_tx, in_rx) = smol::channel::unbounded::<Option<String>>();
        if let Some(mut stdin) = child.stdin.take() {
            let tx = tx.clone();
            ex.spawn(async move {
                while let Ok(msg) = in_rx.recv().await {
                    match msg {
                        Some(line) => {
                            if stdin.write_all(line.as_bytes()).await.is_err()
                                || stdin.flush().await.is_err()
                            {
                                let _ = tx.try_send(Input::McpWriteFailed { proc });
                                return;
                            }
                        }
                        None => return, // dropping stdin closes it
                    }
                }
            })
            .detach();
        }
        if let Some(mut stdout) = child.stdout.take() {
            let tx = tx.clone();
            ex.spawn(async move {
                let mut buf = vec![0u8; STDOUT_BUF];
                loop {
                    match stdout.read(&mut buf).await {
                        Ok(0) | Err(_) => {
                            let _ = tx.try_send(Input::McpStdoutClosed { proc });
                            return;
                        }
                        Ok(n) => {
                            if tx
                                .try_send(Input::McpBytes {
                                    proc,
                                    bytes: buf[..n].to_vec(),
                                })
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                }
            })
            .detach();
        }
        // Closed (every sender dropped) when the stderr task ends: the "drained" signal.
        let (err_done_tx, err_done_rx) = smol::channel::bounded::<()>(1);
        if let Some(stderr) = child.stderr.take() {
            let tx = tx.clone();
            ex.spawn(async move {
                let _done = err_done_tx;
                let mut reader = BufReader::new(stderr);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match (&mut reader)
                        .take(MAX_STDERR_LINE as u64)
                        .read_until(b'\n', &mut line)
                        .await
                    {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if line.last() != Some(&b'\n') && line.len() >= MAX_STDERR_LINE {
                                // Skip the rest of an over-long line.
                                let mut sink = Vec::new();
                                let _ = reader.read_until(b'\n', &mut sink).await;
                            }
                            let text = String::from_utf8_lossy(&line)
                                .trim_end_matches(['\n', '\r'])
                                .to_string();
                            let _ = tx.try_send(Input::McpStderrLine { proc, line: text });
                        }
                    }
                }
            })
            .detach();
        } else {
            drop(err_done_tx);
        }
        {
            let tx = tx.clone();
            ex.spawn(async move {
                let status = match child.status().await {
                    Ok(s) => describe(s),
                    Err(e) => format!("wait failed: {e}"),
                };
                smol::future::or(
                    async {
                        let _ = err_done_rx.recv().await;
                    },
                    async {
                        Timer::after(STDERR_DRAIN).await;
                    },
                )
                .await;
                let _ = tx.try_send(Input::McpExited { proc, status });
            })
            .detach();
        }
        self.map.insert(
            proc,
            Child {
                stdin: Some(in_tx),
                pgid,
            },
        );
    }

    /// Queue one line for the child's stdin writer task.
    pub fn write(&mut self, proc: ProcKey, line: String) {
        if let Some(Child {
            stdin: Some(tx), ..
        }) = self.map.get(&proc)
        {
            let _ = tx.try_send(Some(line));
        }
    }

    /// Close the child's stdin once the lines queued before are written.
    pub fn close_stdin(&mut self, proc: ProcKey) {
        if let Some(tx) = self.map.get_mut(&proc).and_then(|c| c.stdin.take()) {
            let _ = tx.try_send(None);
        }
    }

    /// `killpg` the child's group, even after the leader exited (grandchildren, SPEC M8).
    pub fn signal(&mut self, proc: ProcKey, signal: Signal) {
        let Some(c) = self.map.get(&proc) else { return };
        if c.pgid <= 1 {
            return;
        }
        let sig = match signal {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
        };
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        // ESRCH (the group is gone) is the expected result after a clean exit.
        let _ = unsafe { libc::kill(-c.pgid, sig) };
        if signal == Signal::Kill {
            // After SIGKILL the group is gone for good; forget it so a reused pgid is never hit.
            self.map.remove(&proc);
        }
    }
}

/// The exit status as the core words it.
fn describe(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    buzz_agent_core::io::exit_description(s.code(), s.signal())
}
