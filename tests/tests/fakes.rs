//! Self-test of the fake MCP server as a real process: this binary re-runs itself with
//! `BUZZ_E2E_ROLE=fake-mcp`, exactly as the agent under test launches it, and checks the
//! process-level behaviour (exit codes, stderr, signals, grandchild, env dump) that in-memory
//! unit tests cannot reach.

use buzz_agent_e2e::{fake_mcp, procfs};
use libtest_mimic::{Arguments, Trial};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

struct Fake {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Fake {
    fn start(env: &[(&str, &str)]) -> Fake {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("BUZZ_E2E_ROLE", "fake-mcp")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Fake {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, msg: Value) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{msg}").unwrap();
        s.flush().unwrap();
    }

    fn line(&mut self) -> Option<String> {
        let mut l = String::new();
        match self.stdout.read_line(&mut l) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(l.trim_end().to_string()),
        }
    }

    fn recv(&mut self) -> Value {
        loop {
            let l = self.line().expect("fake closed stdout");
            if let Ok(v) = serde_json::from_str(&l) {
                return v;
            }
        }
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.recv()
    }

    fn handshake(&mut self) {
        let r = self.request(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}}),
        );
        assert_eq!(r["result"]["protocolVersion"], "2025-11-25", "{r}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    }

    fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: killpg has no memory-safety preconditions.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn exits_zero_on_stdin_eof() {
    let mut f = Fake::start(&[]);
    f.handshake();
    let r = f.request(
        1,
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "hi"}}),
    );
    assert_eq!(r["result"]["content"][0]["text"], "hi");
    f.stdin.take();
    assert_eq!(f.wait(Duration::from_secs(5)), Some(0));
}

fn init_delay_holds_the_initialize_reply() {
    let mut f = Fake::start(&[("FAKE_MCP_INIT_DELAY_MS", "150")]);
    let started = Instant::now();
    f.handshake();
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

fn crash_tool_writes_stderr_and_exits_3() {
    let mut f = Fake::start(&[("FAKE_MCP_TOOLS", "echo,crash")]);
    f.handshake();
    f.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "crash", "arguments": {}}}));
    assert_eq!(f.line(), None, "no reply before the exit");
    assert_eq!(f.wait(Duration::from_secs(5)), Some(3));
    assert!(f.stderr().contains(fake_mcp::CRASH_STDERR));
}

fn crash_after_n_calls() {
    let mut f = Fake::start(&[("FAKE_MCP_CRASH_AFTER", "2")]);
    f.handshake();
    for id in 1..=2 {
        let r = f.request(
            id,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}}),
        );
        assert_eq!(r["id"], id);
    }
    f.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}));
    assert_eq!(f.line(), None);
    assert_eq!(f.wait(Duration::from_secs(5)), Some(3));
    assert!(f.stderr().contains(fake_mcp::CRASH_STDERR));
}

fn fail_start_exits_3_with_stderr() {
    let mut f = Fake::start(&[("FAKE_MCP_FAIL_START", "1"), ("FAKE_MCP_STDERR_LINES", "2")]);
    assert_eq!(f.wait(Duration::from_secs(5)), Some(3));
    assert_eq!(f.stderr().trim(), fake_mcp::FAIL_START_STDERR);
}

fn garbage_banner_precedes_the_handshake() {
    let mut f = Fake::start(&[("FAKE_MCP_GARBAGE", "1")]);
    assert_eq!(f.line().as_deref(), Some(fake_mcp::GARBAGE_BANNER));
    f.handshake();
    assert_eq!(f.line().as_deref(), Some(fake_mcp::GARBAGE_AFTER_REPLY));
}

fn env_dump_cwd_and_stderr_lines() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("env.json");
    let cwd = dir.path().join("cwd.txt");
    let mut f = Fake::start(&[
        ("FAKE_MCP_ENV_DUMP", dump.to_str().unwrap()),
        ("FAKE_MCP_CWD_FILE", cwd.to_str().unwrap()),
        ("FAKE_MCP_STDERR_LINES", "3"),
        ("SOME_VAR", "some value"),
    ]);
    f.handshake();
    f.stdin.take();
    assert_eq!(f.wait(Duration::from_secs(5)), Some(0));
    assert_eq!(f.stderr(), "stderr line 0\nstderr line 1\nstderr line 2\n");
    let env: Value = serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    assert_eq!(env["SOME_VAR"], "some value");
    assert_eq!(env["BUZZ_E2E_ROLE"], "fake-mcp");
    let here = std::env::current_dir().unwrap();
    assert_eq!(
        std::fs::read_to_string(&cwd).unwrap(),
        here.display().to_string()
    );
}

fn ignore_term_survives_term_and_eof_until_group_kill() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let mut f = Fake::start(&[
        ("FAKE_MCP_IGNORE_TERM", "1"),
        ("FAKE_MCP_GRANDCHILD_PIDFILE", pidfile.to_str().unwrap()),
    ]);
    f.handshake();
    let text = std::fs::read_to_string(&pidfile).unwrap();
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let (server, grand) = (pids[0], pids[1]);
    assert_eq!(server, f.child.id() as i32);
    assert_eq!(
        procfs::stat(grand).unwrap().pgid,
        server,
        "grandchild shares the group"
    );
    // SAFETY: killpg has no memory-safety preconditions.
    unsafe { libc::killpg(server, libc::SIGTERM) };
    f.stdin.take();
    std::thread::sleep(Duration::from_millis(300));
    assert!(procfs::is_alive(server), "SIGTERM and EOF must not end it");
    assert!(
        procfs::is_alive(grand),
        "the grandchild ignores SIGTERM too"
    );
    // SAFETY: as above.
    unsafe { libc::killpg(server, libc::SIGKILL) };
    assert_eq!(
        f.wait(Duration::from_secs(5)),
        None,
        "killed by a signal: no exit code"
    );
    assert!(procfs::wait_all_dead(&[server, grand], Duration::from_secs(5)).is_empty());
}

fn concurrent_slow_calls_overlap() {
    let mut f = Fake::start(&[("FAKE_MCP_TOOLS", "slow"), ("FAKE_MCP_DELAY_MS", "100")]);
    f.handshake();
    let started = Instant::now();
    for id in 1..=4 {
        f.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                      "params": {"name": "slow", "arguments": {"ms": 400}}}));
    }
    let mut ids: Vec<i64> = (0..4).map(|_| f.recv()["id"].as_i64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, [1, 2, 3, 4]);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(1500),
        "{took:?}"
    );
}

fn stop_hook_delay_and_hang_modes() {
    let mut f = Fake::start(&[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_DELAY_MS", "200")]);
    f.handshake();
    let started = Instant::now();
    let r = f.request(1, "tools/call", json!({"name": "_Stop", "arguments": {}}));
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(r["result"]["content"][0]["text"], "tests are still red");
    let mut f = Fake::start(&[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_MODE", "hang")]);
    f.handshake();
    f.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "_Stop", "arguments": {}}}));
    let r = f.request(2, "ping", json!({}));
    assert_eq!(r["id"], 2, "the hung _Stop is never answered: {r}");
}

fn main() {
    if std::env::var("BUZZ_E2E_ROLE").as_deref() == Ok("fake-mcp") {
        fake_mcp::main();
    }
    let args = Arguments::from_args();
    let tests: [(&str, fn()); 10] = [
        ("exits_zero_on_stdin_eof", exits_zero_on_stdin_eof),
        (
            "crash_tool_writes_stderr_and_exits_3",
            crash_tool_writes_stderr_and_exits_3,
        ),
        ("crash_after_n_calls", crash_after_n_calls),
        (
            "fail_start_exits_3_with_stderr",
            fail_start_exits_3_with_stderr,
        ),
        (
            "garbage_banner_precedes_the_handshake",
            garbage_banner_precedes_the_handshake,
        ),
        (
            "env_dump_cwd_and_stderr_lines",
            env_dump_cwd_and_stderr_lines,
        ),
        (
            "ignore_term_survives_term_and_eof_until_group_kill",
            ignore_term_survives_term_and_eof_until_group_kill,
        ),
        (
            "concurrent_slow_calls_overlap",
            concurrent_slow_calls_overlap,
        ),
        (
            "stop_hook_delay_and_hang_modes",
            stop_hook_delay_and_hang_modes,
        ),
        (
            "init_delay_holds_the_initialize_reply",
            init_delay_holds_the_initialize_reply,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            Trial::test(name, move || {
                f();
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
