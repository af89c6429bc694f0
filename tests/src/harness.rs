//! Driving the agent binary over stdio as an ACP client would, and the checks every scenario
//! shares: stdout carries JSON-RPC frames only (SPEC T2), each request is answered once (I7),
//! logs carry no secret (P2), no process outlives the agent (M8).

use crate::dialects::{Dialect, Violations};
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, Wire};
use crate::procfs;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The API key the agent is given; it must never show up in its logs (SPEC P2).
pub const SECRET_KEY: &str = "sk-test-secret";
/// Extra environment for [`AgentProc::spawn_with`] that the harness takes for itself: run the
/// agent as this user and group id (the variable does not reach the agent).
pub const AGENT_UID_VAR: &str = "BUZZ_E2E_AGENT_UID";
/// Default time to wait for a response.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What every scenario gets.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The agent binary under test.
    pub agent_bin: PathBuf,
    /// The dialect profile the fake LLMs of [`Ctx::fake_llm`] speak (a `dialects::…` trial),
    /// or `None` for the textbook protocol.
    pub dialect: Option<Dialect>,
    /// The rules the agent broke under [`Ctx::dialect`] (checked by the trial after the
    /// scenario).
    pub violations: Violations,
    /// The binary has the `demo`, `exec`, `example-server` and `hooks check` subcommands (the
    /// `extras` feature of `buzz-agent-runtime`; the minimal binary leaves it off).
    pub has_extras: bool,
}

impl Ctx {
    /// The context of the plain (textbook) suite; `has_extras` as [`Ctx::has_extras`].
    pub fn new(agent_bin: impl Into<PathBuf>, has_extras: bool) -> Ctx {
        Ctx {
            agent_bin: agent_bin.into(),
            has_extras,
            dialect: None,
            violations: Violations::default(),
        }
    }

    /// The provider route of this run: the dialect's, else Chat Completions.
    pub fn wire(&self) -> Wire {
        self.dialect.map_or(Wire::Chat, Dialect::wire)
    }

    /// The model the agent is configured with in this run.
    pub fn model(&self) -> &'static str {
        self.dialect.map_or("test-model", Dialect::model)
    }

    /// A fake LLM answering the n-th request with the n-th reply (past the end, HTTP 500 with
    /// [`crate::fake_llm::EXHAUSTED_BODY`]), speaking [`Ctx::dialect`].
    pub fn fake_llm(&self, replies: Vec<Reply>) -> FakeLlm {
        self.fake_llm_with(move |i, _| {
            replies.get(i).cloned().unwrap_or_else(|| {
                Reply::status(
                    500,
                    vec![("content-type", "application/json")],
                    crate::fake_llm::EXHAUSTED_BODY,
                )
            })
        })
    }

    /// A fake LLM answering by `handler`, speaking [`Ctx::dialect`].
    pub fn fake_llm_with(
        &self,
        handler: impl Fn(usize, &RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> FakeLlm {
        match self.dialect {
            Some(d) => FakeLlm::dialect(d, self.violations.clone(), handler),
            None => FakeLlm::with_handler(handler),
        }
    }

    /// Spawns the agent with [`agent_env`] for `llm` plus `extra` (which wins), its process
    /// working directory `cwd`. A fake LLM speaking a dialect profile is reached on the
    /// profile's route with its model ([`dialect_env`]).
    pub fn agent(&self, llm: &FakeLlm, extra: &[(&str, &str)], cwd: &Path) -> AgentProc {
        self.agent_with(Wire::Chat, llm, extra, cwd, StderrMode::Read)
    }

    /// [`Ctx::agent`] with the agent's stderr going where `stderr` says.
    pub fn agent_with_stderr(
        &self,
        llm: &FakeLlm,
        extra: &[(&str, &str)],
        cwd: &Path,
        stderr: StderrMode,
    ) -> AgentProc {
        self.agent_with(Wire::Chat, llm, extra, cwd, stderr)
    }

    /// Like [`Ctx::agent`] on the provider route `wire` ([`agent_env_for`]).
    pub fn agent_on(
        &self,
        wire: Wire,
        llm: &FakeLlm,
        extra: &[(&str, &str)],
        cwd: &Path,
    ) -> AgentProc {
        self.agent_with(wire, llm, extra, cwd, StderrMode::Read)
    }

    /// The general form of [`Ctx::agent`]: on the provider route `wire` ([`agent_env_for`];
    /// a fake LLM speaking a dialect profile is reached on the profile's route with its model,
    /// [`dialect_env`]), with stderr going where `stderr` says.
    pub fn agent_with(
        &self,
        wire: Wire,
        llm: &FakeLlm,
        extra: &[(&str, &str)],
        cwd: &Path,
        stderr: StderrMode,
    ) -> AgentProc {
        let env = match llm.dialect_profile() {
            Some(d) => dialect_env(d, &llm.origin()),
            None => agent_env_for(wire, llm),
        };
        self.spawn_with_env(env, extra, cwd, stderr)
    }

    /// Spawns the agent against an LLM server at `origin` (`http://127.0.0.1:PORT`, no path) on
    /// the route `wire`, with [`env_for_origin`] plus `extra` (which wins).
    pub fn agent_at(
        &self,
        wire: Wire,
        origin: &str,
        extra: &[(&str, &str)],
        cwd: &Path,
    ) -> AgentProc {
        self.spawn_with_env(env_for_origin(wire, origin), extra, cwd, StderrMode::Read)
    }

    /// Spawns the agent with `env` plus `extra` (which wins).
    fn spawn_with_env(
        &self,
        mut env: Vec<(String, String)>,
        extra: &[(&str, &str)],
        cwd: &Path,
        stderr: StderrMode,
    ) -> AgentProc {
        for (k, v) in extra {
            env.retain(|(name, _)| name != k);
            env.push((k.to_string(), v.to_string()));
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        AgentProc::spawn_with(&self.agent_bin, &env, cwd, stderr)
    }
}

/// The agent's environment for a session against `llm` on the route `wire`: [`agent_env`] for
/// Chat Completions; plus `OPENAI_COMPAT_API=responses` for Responses; for Anthropic
/// `BUZZ_AGENT_PROVIDER=anthropic` with `ANTHROPIC_BASE_URL` = the server's origin (the agent
/// appends `/v1/messages`), `ANTHROPIC_API_KEY` = the secret key, `ANTHROPIC_MODEL`.
pub fn agent_env_for(wire: Wire, llm: &FakeLlm) -> Vec<(String, String)> {
    env_for_origin(wire, &llm.origin())
}

/// [`agent_env_for`] with the server given by its origin (`http://127.0.0.1:PORT`).
pub fn env_for_origin(wire: Wire, origin: &str) -> Vec<(String, String)> {
    let common = [
        ("BUZZ_AGENT_PERMISSION", "allow".to_string()),
        ("BUZZ_AGENT_LOG", "debug".to_string()),
    ];
    let provider = ("BUZZ_AGENT_PROVIDER", wire.route().env_value().to_string());
    let route: Vec<(&str, String)> = match wire {
        Wire::Chat | Wire::Responses => {
            let mut v = vec![
                provider,
                ("OPENAI_COMPAT_BASE_URL", format!("{origin}/v1")),
                ("OPENAI_COMPAT_MODEL", "test-model".to_string()),
                ("OPENAI_COMPAT_API_KEY", SECRET_KEY.to_string()),
            ];
            if wire == Wire::Responses {
                v.extend(
                    wire.route()
                        .api_value()
                        .map(|api| ("OPENAI_COMPAT_API", api.to_string())),
                );
            }
            v
        }
        Wire::Anthropic => vec![
            provider,
            ("ANTHROPIC_BASE_URL", origin.to_string()),
            ("ANTHROPIC_MODEL", "test-model".to_string()),
            ("ANTHROPIC_API_KEY", SECRET_KEY.to_string()),
        ],
    };
    route
        .into_iter()
        .chain(common)
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// The agent's environment against a server at `origin` speaking `dialect`: its route
/// ([`env_for_origin`]), its model and its reasoning effort ([`Dialect::effort`]).
pub fn dialect_env(dialect: Dialect, origin: &str) -> Vec<(String, String)> {
    let mut env = env_for_origin(dialect.wire(), origin);
    let var = match dialect.wire() {
        Wire::Anthropic => "ANTHROPIC_MODEL",
        Wire::Chat | Wire::Responses => "OPENAI_COMPAT_MODEL",
    };
    env.retain(|(k, _)| k != var);
    env.push((var.to_string(), dialect.model().to_string()));
    if matches!(
        dialect,
        Dialect::OpenAiReasoning | Dialect::OpenAiResponsesReasoning
    ) {
        // These profiles stand in for OpenAI's own API, which takes `prompt_cache_key`; the
        // agent sends it there by itself, and to a server at another address when told to.
        env.push((
            "OPENAI_COMPAT_PROMPT_CACHE_KEY".to_string(),
            "1".to_string(),
        ));
    }
    if let Some(effort) = dialect.effort() {
        env.push(("BUZZ_AGENT_THINKING_EFFORT".to_string(), effort));
    }
    if dialect == Dialect::InBandErrors {
        // Every request's first attempt fails in-band: one more attempt than the default.
        env.push(("BUZZ_AGENT_LLM_MAX_ATTEMPTS".to_string(), "4".to_string()));
    }
    env
}

/// The agent's environment for a session against `llm`: OpenAI-compatible provider (Chat
/// Completions), the secret key, permission `allow`, debug logs.
pub fn agent_env(llm: &FakeLlm) -> Vec<(String, String)> {
    env_for_origin(Wire::Chat, &llm.origin())
}

/// The path of the running test binary, which is also the fake MCP server.
pub fn current_exe() -> String {
    std::env::current_exe()
        .expect("current_exe")
        .to_str()
        .expect("current_exe is not UTF-8")
        .to_string()
}

/// An ACP `mcpServers` entry that runs the fake MCP server with `env`.
pub fn fake_mcp_entry(name: &str, env: &[(&str, &str)]) -> Value {
    let mut pairs = vec![json!({"name": "BUZZ_E2E_ROLE", "value": "fake-mcp"})];
    pairs.extend(env.iter().map(|(k, v)| json!({"name": k, "value": v})));
    json!({"name": name, "command": current_exe(), "args": [], "env": pairs})
}

/// Where the agent's stderr goes ([`AgentProc::spawn_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StderrMode {
    /// A pipe the harness reads line by line as it arrives (the default).
    Read,
    /// A pipe nobody reads (case C51: the Python ACP SDK's `spawn_agent_process()`), until
    /// [`AgentProc::start_reading_stderr`] starts reading it.
    Unread,
    /// A file (truncated at spawn); [`AgentProc::stderr_text`] reads it back.
    File(PathBuf),
}

/// A custom permission answer: request params in, `result` out (`None` = no reply).
pub type PermissionFn = Arc<dyn Fn(&Value) -> Option<Value> + Send + Sync>;

/// How the client answers `session/request_permission`.
#[derive(Clone)]
pub enum PermissionPolicy {
    /// Select the `allow_once` option (the default).
    AllowOnce,
    /// Select the `allow_always` option.
    AllowAlways,
    /// Select the `reject_once` option.
    Reject,
    /// Never answer.
    NoReply,
    /// The closure gets the request params and returns the `result` to send, or `None` for no
    /// reply.
    Custom(PermissionFn),
}

/// The agent `bin` as the suite starts it: in `cwd`, with only the test's `PATH` and `HOME`
/// (add the scenario's environment with `envs`), stdin and stdout piped, in a process group of
/// its own.
pub fn agent_command(bin: &Path, cwd: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env(
            "HOME",
            std::env::var("HOME").unwrap_or_else(|_| "/tmp".into()),
        )
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .process_group(0);
    cmd
}

/// The `session/request_permission` result selecting the option of `kind` (`allow_once`,
/// `reject_once`, …) among the request's `params.options` (its `optionId`; `kind` itself when
/// no option is of that kind).
pub fn select_kind(params: &Value, kind: &str) -> Value {
    let option = params["options"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == kind)
        .and_then(|o| o["optionId"].as_str())
        .unwrap_or(kind)
        .to_string();
    json!({"outcome": {"outcome": "selected", "optionId": option}})
}

impl PermissionPolicy {
    fn answer(&self, params: &Value) -> Option<Value> {
        match self {
            PermissionPolicy::AllowOnce => Some(select_kind(params, "allow_once")),
            PermissionPolicy::AllowAlways => Some(select_kind(params, "allow_always")),
            PermissionPolicy::Reject => Some(select_kind(params, "reject_once")),
            PermissionPolicy::NoReply => None,
            PermissionPolicy::Custom(f) => f(params),
        }
    }
}

struct State {
    /// Every well-formed message from the agent, in arrival order.
    transcript: Vec<Value>,
    /// Every stdout line exactly as written (without the newline; lossy UTF-8), in order,
    /// including the ones that are violations.
    stdout_lines: Vec<String>,
    /// When each of `stdout_lines` was read (just after the read returned, before parsing).
    stdout_times: Vec<Instant>,
    /// Responses by id (JSON text of the id).
    responses: HashMap<String, Value>,
    /// How many requests with that id we sent / how many responses came.
    sent_ids: HashMap<String, usize>,
    /// The method of the last request sent with that id (to check its response against the
    /// ACP schema).
    sent_methods: HashMap<String, String>,
    /// Frames that break the official ACP schema ([`crate::acp_schema`]), one line each.
    schema_violations: Vec<String>,
    /// Bytes sent after the last newline (a line written in pieces).
    sent_partial: Vec<u8>,
    answered_ids: HashMap<String, usize>,
    violations: Vec<String>,
    stdout_closed: bool,
    /// [`AgentProc::pause_stdout`]: the reader reads nothing until resumed (the agent's stdout
    /// pipe fills, as with a client that stopped reading).
    stdout_paused: bool,
    stderr: String,
    /// When the last stderr line arrived (stderr and stdout are separate pipes: a log line
    /// written just before a response may be read after it).
    stderr_at: Instant,
    /// [`StderrMode::Unread`]: the pipe, until [`AgentProc::start_reading_stderr`] takes it.
    unread_stderr: Option<std::process::ChildStderr>,
    /// [`StderrMode::File`]: the file stderr goes to.
    stderr_file: Option<PathBuf>,
    policy: PermissionPolicy,
    /// [`AgentProc::set_elicitation_answer`]: how `elicitation/create` is answered (`None`:
    /// `-32601`, a client without elicitation).
    elicitation: Option<PermissionFn>,
    /// [`AgentProc::kill_when_answered`]: the id (JSON text) whose response makes the reader
    /// SIGKILL the agent the moment it reads it.
    kill_on_response: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    verbose: bool,
    pid: i32,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type Stdin = Arc<Mutex<Option<ChildStdin>>>;

fn write_line(stdin: &Stdin, bytes: &[u8]) -> std::io::Result<()> {
    let mut guard = stdin.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        Some(s) => s.write_all(bytes).and_then(|()| s.flush()),
        None => Err(std::io::Error::other("agent stdin already closed")),
    }
}

/// A running agent process driven as an ACP client. Dropping it kills the agent and every
/// process it started.
pub struct AgentProc {
    /// The temporary state directory, when the caller gave none (removed on drop).
    _state: Option<tempfile::TempDir>,
    child: Mutex<Child>,
    stdin: Stdin,
    shared: Arc<Shared>,
    next_id: AtomicI64,
    pid: i32,
    started: Instant,
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

/// A line the harness sent, as far as it needs it (its `id` and `method`): strict JSON, or a
/// line with surrogate escapes (case C64: clients write lone ones) read with every surrogate
/// escape as U+FFFD. Independent of the agent's own decoder on purpose.
fn sent_message(line: &str) -> Option<Value> {
    if let Ok(msg) = serde_json::from_str::<Value>(line) {
        return Some(msg);
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("\\u") {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let surrogate = tail
            .get(2..6)
            .and_then(|h| u16::from_str_radix(h, 16).ok())
            .is_some_and(|u| (0xD800..=0xDFFF).contains(&u));
        if surrogate {
            out.push_str("\\ufffd");
            rest = &tail[6..];
        } else {
            out.push_str(&tail[..2]);
            rest = &tail[2..];
        }
    }
    out.push_str(rest);
    serde_json::from_str(&out).ok()
}

impl AgentProc {
    /// Spawns `bin` with an empty environment except `PATH`, `HOME` and `env`, all three stdio
    /// streams piped, in its own process group. Unless `env` names `BUZZ_AGENT_STATE_DIR`, the
    /// agent keeps its sessions (SPEC A9) in a fresh temporary directory, removed with the
    /// `AgentProc` (never in the user's own state directory).
    pub fn spawn(bin: impl AsRef<Path>, env: &[(&str, &str)], cwd: &Path) -> AgentProc {
        AgentProc::spawn_with(bin, env, cwd, StderrMode::Read)
    }

    /// [`AgentProc::spawn`] with stderr going where `stderr` says.
    pub fn spawn_with(
        bin: impl AsRef<Path>,
        env: &[(&str, &str)],
        cwd: &Path,
        stderr: StderrMode,
    ) -> AgentProc {
        let bin = bin.as_ref();
        let stderr_stdio = match &stderr {
            StderrMode::Read | StderrMode::Unread => Stdio::piped(),
            StderrMode::File(path) => Stdio::from(
                std::fs::File::create(path)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display())),
            ),
        };
        let state = (!env.iter().any(|(k, _)| *k == "BUZZ_AGENT_STATE_DIR")).then(|| {
            tempfile::Builder::new()
                .prefix("buzz-e2e-state-")
                .tempdir()
                .expect("a temporary state directory")
        });
        // `BUZZ_E2E_AGENT_UID=N` (for the harness, not passed on): the agent runs as user and
        // group N (a scenario running as root that needs an unprivileged agent).
        let run_as: Option<u32> = env
            .iter()
            .find(|(k, _)| *k == AGENT_UID_VAR)
            .and_then(|(_, v)| v.parse().ok());
        let env: Vec<(&str, &str)> = env
            .iter()
            .filter(|(k, _)| *k != AGENT_UID_VAR)
            .copied()
            .collect();
        let mut cmd = agent_command(bin, cwd);
        if let Some(id) = run_as {
            cmd.uid(id).gid(id);
        }
        cmd.envs(env.iter().map(|(k, v)| (*k, *v)))
            .stderr(stderr_stdio);
        if let Some(dir) = &state {
            cmd.env("BUZZ_AGENT_STATE_DIR", dir.path().join("sessions"));
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn agent {}: {e}", bin.display()));
        let pid = child.id() as i32;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take();
        let stdin: Stdin = Arc::new(Mutex::new(child.stdin.take()));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                transcript: Vec::new(),
                stdout_lines: Vec::new(),
                stdout_times: Vec::new(),
                responses: HashMap::new(),
                sent_ids: HashMap::new(),
                sent_methods: HashMap::new(),
                schema_violations: Vec::new(),
                sent_partial: Vec::new(),
                answered_ids: HashMap::new(),
                violations: Vec::new(),
                stdout_closed: false,
                stdout_paused: false,
                stderr: String::new(),
                stderr_at: Instant::now(),
                unread_stderr: None,
                stderr_file: match &stderr {
                    StderrMode::File(path) => Some(path.clone()),
                    StderrMode::Read | StderrMode::Unread => None,
                },
                policy: PermissionPolicy::AllowOnce,
                elicitation: None,
                kill_on_response: None,
            }),
            cv: Condvar::new(),
            verbose: std::env::var("BUZZ_E2E_VERBOSE").is_ok_and(|v| v == "1"),
            pid,
        });
        {
            let shared = shared.clone();
            let stdin = stdin.clone();
            std::thread::Builder::new()
                .name(format!("agent-{pid}-stdout"))
                .spawn(move || read_stdout(stdout, &shared, &stdin))
                .expect("spawn stdout reader");
        }
        match (stderr, stderr_pipe) {
            (StderrMode::Read, Some(pipe)) => spawn_stderr_reader(pipe, &shared),
            (StderrMode::Unread, pipe) => shared.lock().unread_stderr = pipe,
            _ => {}
        }
        AgentProc {
            _state: state,
            child: Mutex::new(child),
            stdin,
            shared,
            next_id: AtomicI64::new(100),
            pid,
            started: Instant::now(),
        }
    }

    /// Arms the stdout reader to SIGKILL the agent the moment it reads the response to `id`
    /// (before it parses anything else): a client that saw its answer, and a crash right
    /// after. Its MCP children are left to [`kill_tree`] or the drop.
    pub fn kill_when_answered(&self, id: &Value) {
        self.shared.lock().kill_on_response = Some(id_key(id));
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Stops reading the agent's stdout, as a client that stopped reading: once the pipe (and
    /// the reader's 8 KiB buffer) is full, the agent's writes to stdout cannot complete.
    /// Permission requests are not answered meanwhile.
    pub fn pause_stdout(&self) {
        self.shared.lock().stdout_paused = true;
    }

    /// Reads the agent's stdout again after [`AgentProc::pause_stdout`].
    pub fn resume_stdout(&self) {
        self.shared.lock().stdout_paused = false;
        self.shared.cv.notify_all();
    }

    /// The names (`comm`) of the agent's threads, from `/proc/<pid>/task`.
    pub fn thread_names(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return Vec::new();
        };
        dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
            .map(|name| name.trim_end().to_string())
            .collect()
    }

    /// How many TCP connections the agent holds open: its fds that are sockets
    /// (`/proc/<pid>/fd` links to `socket:[inode]`) listed in `/proc/<pid>/net/tcp{,6}` (the
    /// runtime's own socket pairs, e.g. tokio's signal pipe, are not TCP).
    pub fn open_sockets(&self) -> usize {
        let mut tcp = std::collections::BTreeSet::new();
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid))
                .unwrap_or_default();
            for line in text.lines().skip(1) {
                if let Some(inode) = line.split_whitespace().nth(9) {
                    tcp.insert(inode.to_string());
                }
            }
        }
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) else {
            return 0;
        };
        dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|target| {
                let t = target.to_string_lossy().into_owned();
                Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .filter(|inode| tcp.contains(inode))
            .count()
    }

    fn note_sent(&self, bytes: &[u8]) {
        let mut st = self.shared.lock();
        // Lines may be written in pieces: complete lines are read once their newline is sent.
        st.sent_partial.extend_from_slice(bytes);
        let end = st.sent_partial.iter().rposition(|&b| b == b'\n');
        let complete: Vec<u8> =
            end.map_or_else(Vec::new, |end| st.sent_partial.drain(..=end).collect());
        for line in complete.split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(line);
            let line = line.trim_start_matches('\u{feff}').trim_end_matches('\r');
            let Some(msg) = sent_message(line) else {
                continue;
            };
            if let (Some(method), Some(id)) = (msg.get("method"), msg.get("id")) {
                *st.sent_ids.entry(id_key(id)).or_default() += 1;
                if let Some(method) = method.as_str() {
                    st.sent_methods.insert(id_key(id), method.to_string());
                }
            }
        }
        if self.shared.verbose {
            eprintln!(
                "[agent:{}] >> {}",
                self.pid,
                String::from_utf8_lossy(bytes).trim_end()
            );
        }
    }

    /// Writes raw bytes to the agent's stdin (no newline added).
    pub fn send_raw(&self, bytes: &[u8]) {
        self.note_sent(bytes);
        write_line(&self.stdin, bytes)
            .unwrap_or_else(|e| panic!("writing to the agent failed: {e}{}", self.context()));
    }

    /// Writes one message as a compact line.
    pub fn send(&self, msg: &Value) {
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// A fresh request id (numbers from 100 up, so hand-written ids below 100 never collide).
    pub fn next_id(&self) -> Value {
        json!(self.next_id.fetch_add(1, Ordering::SeqCst))
    }

    /// Sends a request and returns its id without waiting.
    pub fn start_request(&self, method: &str, params: Value) -> Value {
        let id = self.next_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Waits for the response (the whole object) to request `id`; panics with the stderr tail
    /// after `timeout`.
    pub fn wait_response(&self, id: &Value, timeout: Duration) -> Value {
        let key = id_key(id);
        self.wait_state(timeout, true, |st| st.responses.get(&key).cloned())
            .unwrap_or_else(|why| {
                panic!(
                    "no response to request id {key} ({why} after {timeout:?}){}",
                    self.context()
                )
            })
    }

    /// Waits until `found` gets something from the recorded state (checked again at every
    /// message from the agent), or until `timeout` passes or — with `stop_at_eof` — the agent
    /// closes stdout; the `Err` says which of the two.
    fn wait_state<T>(
        &self,
        timeout: Duration,
        stop_at_eof: bool,
        found: impl Fn(&State) -> Option<T>,
    ) -> Result<T, &'static str> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if let Some(t) = found(&st) {
                return Ok(t);
            }
            if stop_at_eof && st.stdout_closed {
                return Err("the agent closed stdout");
            }
            let now = Instant::now();
            if now >= deadline {
                return Err("timed out");
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The response to `id` if it has arrived.
    pub fn response(&self, id: &Value) -> Option<Value> {
        self.shared.lock().responses.get(&id_key(id)).cloned()
    }

    /// Sends a request and waits (30 s) for its response.
    pub fn request(&self, method: &str, params: Value) -> Value {
        self.request_timeout(method, params, DEFAULT_TIMEOUT)
    }

    /// Sends a request and waits `timeout` for its response.
    pub fn request_timeout(&self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.start_request(method, params);
        self.wait_response(&id, timeout)
    }

    /// Every well-formed message the agent wrote, in order.
    pub fn transcript(&self) -> Vec<Value> {
        self.shared.lock().transcript.clone()
    }

    /// Every line the agent wrote on stdout, byte for byte (lossy UTF-8, newline stripped), in
    /// order — well-formed or not.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.shared.lock().stdout_lines.clone()
    }

    /// [`AgentProc::stdout_lines`] with the instant each line was read from the pipe (for
    /// latency measurements: the reader takes it before parsing the line).
    pub fn stdout_lines_timed(&self) -> Vec<(Instant, String)> {
        let st = self.shared.lock();
        st.stdout_times
            .iter()
            .copied()
            .zip(st.stdout_lines.iter().cloned())
            .collect()
    }

    /// Everything received that is not a response (notifications and agent requests), in order.
    pub fn notifications(&self) -> Vec<Value> {
        self.transcript()
            .into_iter()
            .filter(|m| m.get("method").is_some())
            .collect()
    }

    /// The `update` objects of the `session/update` notifications of one session, in order.
    pub fn session_updates(&self, session_id: &str) -> Vec<Value> {
        self.transcript()
            .into_iter()
            .filter(|m| m["method"] == "session/update" && m["params"]["sessionId"] == session_id)
            .map(|m| m["params"]["update"].clone())
            .collect()
    }

    /// Responses whose id is `null` (answers to lines that could not be parsed), in order.
    pub fn null_id_responses(&self) -> Vec<Value> {
        self.transcript()
            .into_iter()
            .filter(|m| m.get("method").is_none() && m.get("id") == Some(&Value::Null))
            .collect()
    }

    /// Requests the agent sent to us (`session/request_permission`, …), in order.
    pub fn agent_requests(&self) -> Vec<Value> {
        self.transcript()
            .into_iter()
            .filter(|m| m.get("method").is_some() && m.get("id").is_some())
            .collect()
    }

    /// The `session/request_permission` requests received.
    pub fn permission_requests(&self) -> Vec<Value> {
        self.agent_requests()
            .into_iter()
            .filter(|m| m["method"] == "session/request_permission")
            .collect()
    }

    /// Answers `elicitation/create` (SPEC M12) from now on with `answer(params)` as the
    /// `result` (`None`: no reply). Advertise the capability in `initialize` yourself.
    pub fn set_elicitation_answer(
        &self,
        answer: impl Fn(&Value) -> Option<Value> + Send + Sync + 'static,
    ) {
        self.shared.lock().elicitation = Some(Arc::new(answer));
    }

    /// Changes how permission requests are answered from now on.
    pub fn set_permission_policy(&self, policy: PermissionPolicy) {
        self.shared.lock().policy = policy;
    }

    /// Waits until `pred(transcript)` holds; panics with `what` and the stderr tail on timeout.
    pub fn wait_until(&self, what: &str, timeout: Duration, pred: impl Fn(&[Value]) -> bool) {
        let reached = self.wait_state(timeout, false, |st| pred(&st.transcript).then_some(()));
        if reached.is_err() {
            panic!(
                "timed out after {timeout:?} waiting for {what}{}",
                self.context()
            );
        }
    }

    /// `initialize` with protocol version 1; returns the result.
    pub fn initialize(&self) -> Value {
        let r = self.request(
            "initialize",
            json!({"protocolVersion": 1,
                   "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false},
                                          "terminal": false},
                   "clientInfo": {"name": "buzz-agent-e2e", "version": "0"}}),
        );
        self.result(&r).clone()
    }

    /// `session/new`; returns the session id (panics on an error response).
    pub fn new_session(&self, cwd: &Path, mcp_servers: Value) -> String {
        let r = self.request(
            "session/new",
            json!({"cwd": cwd, "mcpServers": mcp_servers}),
        );
        let sid = self.result(&r)["sessionId"].as_str().map(str::to_string);
        sid.unwrap_or_else(|| panic!("session/new result has no sessionId: {r}{}", self.context()))
    }

    /// `session/prompt` with one text block; returns the whole response (waits 30 s).
    pub fn prompt(&self, session_id: &str, text: &str) -> Value {
        self.prompt_timeout(session_id, text, DEFAULT_TIMEOUT)
    }

    /// [`AgentProc::prompt`] waiting `timeout` for the response.
    pub fn prompt_timeout(&self, session_id: &str, text: &str, timeout: Duration) -> Value {
        let id = self.start_prompt(session_id, text);
        self.wait_response(&id, timeout)
    }

    /// Sends the `session/cancel` notification for `session_id`.
    pub fn cancel(&self, session_id: &str) {
        self.send(&json!({"jsonrpc": "2.0", "method": "session/cancel",
                          "params": {"sessionId": session_id}}));
    }

    /// Starts a `session/prompt` without waiting; returns its id.
    pub fn start_prompt(&self, session_id: &str, text: &str) -> Value {
        self.start_request(
            "session/prompt",
            json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}),
        )
    }

    /// The `result` of a response; panics with the error and the stderr tail otherwise.
    pub fn result<'a>(&self, response: &'a Value) -> &'a Value {
        match response.get("result") {
            Some(r) if response.get("error").is_none() => r,
            _ => panic!("expected a result, got {response}{}", self.context()),
        }
    }

    /// `(code, message)` of an error response; panics when it is not one.
    pub fn error(&self, response: &Value) -> (i64, String) {
        match (response["error"]["code"].as_i64(), response.get("result")) {
            (Some(code), None) => (
                code,
                response["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            _ => panic!(
                "expected an error response, got {response}{}",
                self.context()
            ),
        }
    }

    /// Closes the agent's stdin (EOF).
    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take();
        if self.shared.verbose {
            eprintln!("[agent:{}] >> <EOF>", self.pid);
        }
    }

    /// Waits up to `timeout` for the agent to exit.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_wait()
                .ok()
                .flatten();
            if status.is_some() || Instant::now() >= deadline {
                return status;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`StderrMode::Unread`]: starts reading the pipe nobody read so far (everything the agent
    /// managed to write, then what follows). Does nothing in the other modes or when called
    /// twice.
    pub fn start_reading_stderr(&self) {
        let pipe = self.shared.lock().unread_stderr.take();
        if let Some(pipe) = pipe {
            spawn_stderr_reader(pipe, &self.shared);
        }
    }

    /// Everything the agent wrote to stderr so far, once stderr has been quiet for 100 ms (at
    /// most 2 s of waiting), so lines logged just before the last stdout frame are included.
    /// [`StderrMode::File`]: the file's content; [`StderrMode::Unread`]: what was read since
    /// [`AgentProc::start_reading_stderr`].
    pub fn stderr_text(&self) -> String {
        if let Some(path) = self.shared.lock().stderr_file.clone() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let st = self.shared.lock();
            if st.stderr_at.elapsed() >= Duration::from_millis(100) || Instant::now() >= deadline {
                return st.stderr.clone();
            }
            drop(st);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `n` lines of stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        let all = self.stderr_text();
        let lines: Vec<&str> = all.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Stdout problems seen so far (non-JSON lines, non JSON-RPC messages, duplicate answers).
    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// The frames so far that break the official ACP schema ([`crate::acp_schema`]), each
    /// violation one line, followed by a line quoting the frame.
    pub fn schema_violations(&self) -> Vec<String> {
        self.shared.lock().schema_violations.clone()
    }

    /// Every frame so far is valid under the official ACP schema (issue 12).
    pub fn assert_acp_schema(&self) {
        let v = self.schema_violations();
        assert!(
            v.is_empty(),
            "frames that break the {} ({} lines):\n{}{}",
            crate::acp_schema::SCHEMA_SOURCE,
            v.len(),
            v.join("\n"),
            self.context()
        );
    }

    /// SPEC T2 / I7 so far.
    pub fn assert_no_violations(&self) {
        let v = self.violations();
        assert!(
            v.is_empty(),
            "agent stdout violations: {v:#?}{}",
            self.context()
        );
    }

    /// SPEC P2: the API key never reaches the logs.
    pub fn assert_no_secret_in_logs(&self) {
        let err = self.stderr_text();
        assert!(
            !err.contains(SECRET_KEY),
            "the API key appears in the agent's stderr (P2):\n{}",
            err.lines()
                .filter(|l| l.contains(SECRET_KEY))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// The common end of a scenario: EOF on stdin, exit 0 within 8 s, no process left behind,
    /// no stdout violation, every frame valid under the ACP schema, no secret in the logs.
    pub fn finish(self) {
        self.finish_keep();
    }

    /// [`AgentProc::finish`] without consuming the process handle, so its transcript can be
    /// read afterwards (stdout is closed by then: the transcript is complete).
    pub fn finish_keep(&self) {
        let before: Vec<i32> = procfs::descendants(self.pid);
        self.close_stdin();
        let status = self.wait_exit(Duration::from_secs(8));
        match status {
            Some(s) if s.success() => {}
            Some(s) => panic!("agent exited with {s} after stdin EOF{}", self.context()),
            None => panic!(
                "agent still running 8 s after stdin EOF (P1){}",
                self.context()
            ),
        }
        let left = procfs::wait_all_dead(&before, Duration::from_secs(2));
        assert!(
            left.is_empty(),
            "processes outlived the agent (M8): {:?}{}",
            procfs::describe_all(&left),
            self.context()
        );
        self.wait_stdout_closed(Duration::from_secs(2));
        self.assert_no_violations();
        self.assert_acp_schema();
        self.assert_no_secret_in_logs();
    }

    fn wait_stdout_closed(&self, timeout: Duration) {
        let _ = self.wait_state(timeout, false, |st| st.stdout_closed.then_some(()));
    }

    /// Failure context: pid, age and the stderr tail.
    pub fn context(&self) -> String {
        format!(
            "\n--- agent pid {} ({:.1?} old), last stderr lines:\n{}\n---",
            self.pid,
            self.started.elapsed(),
            self.stderr_tail(40)
        )
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if child.try_wait().ok().flatten().is_none() || !procfs::descendants(self.pid).is_empty() {
            kill_tree(self.pid);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// SIGKILLs `pid`, its descendants and their process groups (never the caller's own group).
pub fn kill_tree(pid: i32) {
    // SAFETY: getpgrp and kill/killpg have no memory-safety preconditions.
    let own_group = unsafe { libc::getpgrp() };
    let mut pids = procfs::descendants(pid);
    pids.push(pid);
    let mut groups: Vec<i32> = pids
        .iter()
        .filter_map(|&p| procfs::stat(p))
        .map(|s| s.pgid)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    for g in groups {
        if g > 1 && g != own_group {
            // SAFETY: see above.
            unsafe { libc::killpg(g, libc::SIGKILL) };
        }
    }
    for p in pids {
        // SAFETY: see above.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
}

fn violation(shared: &Shared, st: &mut State, what: String) {
    if shared.verbose {
        eprintln!("[agent:{}] VIOLATION {what}", shared.pid);
    }
    st.violations.push(what);
}

fn read_stdout(stdout: impl Read, shared: &Shared, stdin: &Stdin) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        {
            let mut st = shared.lock();
            while st.stdout_paused {
                st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let read_at = Instant::now();
        let mut st = shared.lock();
        let raw = buf.strip_suffix(b"\n").unwrap_or(&buf);
        st.stdout_lines
            .push(String::from_utf8_lossy(raw).into_owned());
        st.stdout_times.push(read_at);
        if buf.last() != Some(&b'\n') {
            let text = String::from_utf8_lossy(&buf).into_owned();
            violation(shared, &mut st, format!("partial line at EOF: {text:?}"));
            break;
        }
        let line = match std::str::from_utf8(&buf[..buf.len() - 1]) {
            Ok(l) => l.to_string(),
            Err(_) => {
                let text = String::from_utf8_lossy(&buf).into_owned();
                violation(shared, &mut st, format!("non-UTF-8 stdout line: {text:?}"));
                continue;
            }
        };
        if shared.verbose {
            eprintln!("[agent:{}] << {line}", shared.pid);
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                violation(
                    shared,
                    &mut st,
                    format!("non-JSON stdout line ({e}): {line:?}"),
                );
                continue;
            }
        };
        if msg["jsonrpc"] != "2.0" || !msg.is_object() {
            violation(
                shared,
                &mut st,
                format!("stdout message is not a JSON-RPC 2.0 object: {line}"),
            );
            continue;
        }
        let has_method = msg.get("method").is_some();
        let id = msg.get("id").cloned();
        if !has_method
            && let Some(id) = &id
            && st.kill_on_response.as_deref() == Some(id_key(id).as_str())
        {
            // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
            unsafe { libc::kill(shared.pid, libc::SIGKILL) };
            st.kill_on_response = None;
        }
        let answered_method = match (&id, has_method) {
            (Some(id), false) => st.sent_methods.get(&id_key(id)).cloned(),
            _ => None,
        };
        let schema = crate::acp_schema::check_agent_frame(&msg, answered_method.as_deref());
        if !schema.is_empty() {
            if shared.verbose {
                eprintln!("[agent:{}] ACP SCHEMA {}", shared.pid, schema.join(" | "));
            }
            st.schema_violations.extend(schema);
        }
        match (has_method, id) {
            (false, Some(id)) => {
                if msg.get("result").is_none() == msg.get("error").is_none() {
                    violation(
                        shared,
                        &mut st,
                        format!("response without exactly one of result/error: {line}"),
                    );
                }
                if !id.is_null() {
                    let key = id_key(&id);
                    let answered = {
                        let n = st.answered_ids.entry(key.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    let sent = st.sent_ids.get(&key).copied().unwrap_or(0);
                    if answered > sent {
                        violation(
                            shared,
                            &mut st,
                            format!(
                                "response to id {key} that was sent {sent} time(s) but answered {answered} time(s): {line}"
                            ),
                        );
                    }
                    st.responses.entry(key).or_insert_with(|| msg.clone());
                }
            }
            (true, Some(id)) => {
                let params = msg["params"].clone();
                let reply = if msg["method"] == "session/request_permission" {
                    st.policy
                        .answer(&params)
                        .map(|result| json!({"jsonrpc": "2.0", "id": id, "result": result}))
                } else if let Some(answer) = st
                    .elicitation
                    .as_ref()
                    .filter(|_| msg["method"] == "elicitation/create")
                {
                    answer(&params)
                        .map(|result| json!({"jsonrpc": "2.0", "id": id, "result": result}))
                } else {
                    Some(json!({"jsonrpc": "2.0", "id": id,
                                "error": {"code": -32601, "message": "method not found (test client)"}}))
                };
                if let Some(reply) = reply {
                    let line = format!("{reply}\n");
                    if shared.verbose {
                        eprintln!("[agent:{}] >> {}", shared.pid, line.trim_end());
                    }
                    let _ = write_line(stdin, line.as_bytes());
                }
            }
            (true, None) => {}
            (false, None) => {
                violation(
                    shared,
                    &mut st,
                    format!("message is neither request, response nor notification: {line}"),
                );
                continue;
            }
        }
        st.transcript.push(msg);
        shared.cv.notify_all();
    }
    let mut st = shared.lock();
    st.stdout_closed = true;
    shared.cv.notify_all();
}

fn spawn_stderr_reader(pipe: std::process::ChildStderr, shared: &Arc<Shared>) {
    let shared = shared.clone();
    std::thread::Builder::new()
        .name(format!("agent-{}-stderr", shared.pid))
        .spawn(move || read_stderr(pipe, &shared))
        .expect("spawn stderr reader");
}

fn read_stderr(stderr: impl Read, shared: &Shared) {
    let reader = BufReader::new(stderr);
    for line in reader.split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line).into_owned();
        if shared.verbose {
            eprintln!("[agent:{} stderr] {line}", shared.pid);
        }
        let mut st = shared.lock();
        st.stderr.push_str(&line);
        st.stderr.push('\n');
        st.stderr_at = Instant::now();
    }
}

// ---- reading session updates -------------------------------------------------------------------

/// The text of all `agent_message_chunk` updates, concatenated in order.
pub fn agent_text(updates: &[Value]) -> String {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

/// The `tool_call` updates (announcements), in order.
pub fn tool_call_announcements(updates: &[Value]) -> Vec<Value> {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call")
        .cloned()
        .collect()
}

/// The last update (announcement or update) of one tool call.
pub fn last_tool_update(updates: &[Value], tool_call_id: &Value) -> Option<Value> {
    updates
        .iter()
        .rev()
        .find(|u| {
            (u["sessionUpdate"] == "tool_call" || u["sessionUpdate"] == "tool_call_update")
                && &u["toolCallId"] == tool_call_id
        })
        .cloned()
}

/// The text of a terminal tool update's `content` (`[{type:"content", content:{type:"text"}}]`).
pub fn tool_update_text(update: &Value) -> String {
    update["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["content"]["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

/// SPEC A6 / C04 / C53 shape of the tool updates of a turn: announced `pending` with an ACP kind and a title
/// before any update of that id; ids unique; every call ends in exactly one terminal status
/// (`completed` or `failed`), which is its last update. Returns the terminal updates, in the
/// order of the announcements.
pub fn assert_tool_updates_well_formed(updates: &[Value]) -> Vec<Value> {
    let mut announced: Vec<Value> = Vec::new();
    let mut terminal: HashMap<String, Value> = HashMap::new();
    for u in updates {
        match u["sessionUpdate"].as_str() {
            Some("tool_call") => {
                let id = u["toolCallId"].clone();
                assert!(
                    id.is_string() && !announced.contains(&id),
                    "bad or repeated toolCallId: {u}"
                );
                assert_eq!(u["status"], "pending", "announcement must be pending: {u}");
                // C53: a kind of the ACP schema (from the MCP annotations) and a title.
                assert!(
                    matches!(
                        u["kind"].as_str(),
                        Some(
                            "read"
                                | "edit"
                                | "delete"
                                | "move"
                                | "search"
                                | "execute"
                                | "think"
                                | "fetch"
                                | "switch_mode"
                                | "other"
                        )
                    ),
                    "kind must be an ACP tool kind: {u}"
                );
                assert!(
                    u["title"].as_str().is_some_and(|t| !t.is_empty()),
                    "a tool call has a title: {u}"
                );
                announced.push(id);
            }
            Some("tool_call_update") => {
                let id = &u["toolCallId"];
                assert!(
                    announced.contains(id),
                    "tool_call_update for an unannounced id: {u}"
                );
                assert!(
                    !terminal.contains_key(&id.to_string()),
                    "update after a terminal status: {u}"
                );
                match u["status"].as_str() {
                    Some("completed" | "failed") => {
                        terminal.insert(id.to_string(), u.clone());
                    }
                    Some("in_progress") | None => {}
                    Some(other) => panic!("unexpected tool status {other:?}: {u}"),
                }
            }
            _ => {}
        }
    }
    announced
        .iter()
        .map(|id| {
            terminal.get(&id.to_string()).cloned().unwrap_or_else(|| {
                panic!("tool call {id} never reached a terminal status; updates: {updates:#?}")
            })
        })
        .collect()
}

/// SPEC I8: every `session/update` of `session_id` that arrived before the response to
/// `prompt_id` — i.e. none arrives after it (the session-wide `available_commands_update` of
/// SPEC A11 aside). Checks the transcript up to now.
pub fn assert_updates_precede_response(agent: &AgentProc, session_id: &str, prompt_id: &Value) {
    let t = agent.transcript();
    let pos = t
        .iter()
        .position(|m| m.get("method").is_none() && &m["id"] == prompt_id)
        .unwrap_or_else(|| panic!("no response to prompt {prompt_id}"));
    let late: Vec<&Value> = t[pos..]
        .iter()
        .filter(|m| m["method"] == "session/update" && m["params"]["sessionId"] == session_id)
        // The session's commands (SPEC A11) change when a server's prompts do, not with a turn.
        .filter(|m| m["params"]["update"]["sessionUpdate"] != "available_commands_update")
        .collect();
    assert!(
        late.is_empty(),
        "session/update after the prompt response (I8): {late:#?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in "agent": a shell script.
    fn script(dir: &Path, body: &str) -> PathBuf {
        let p = dir.join("agent.sh");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn stdout_violations_are_recorded_and_responses_matched() {
        let dir = tempfile::tempdir().unwrap();
        let bin = script(
            dir.path(),
            r#"read line
echo 'not json'
echo '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}'
echo '{"jsonrpc":"2.0","id":100,"result":{"ok":true}}'
echo '{"jsonrpc":"2.0","id":100,"result":{"again":true}}'
echo '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'
echo '[1]'
printf '{"jsonrpc":"2.0","method":"x"}'"#,
        );
        let agent = AgentProc::spawn(&bin, &[], dir.path());
        let r = agent.request("initialize", json!({}));
        assert_eq!(r["result"]["ok"], true);
        assert!(agent.wait_exit(Duration::from_secs(5)).is_some());
        agent.wait_stdout_closed(Duration::from_secs(2));
        let v = agent.violations();
        assert_eq!(v.len(), 4, "{v:#?}");
        assert!(
            v[0].contains("non-JSON") && v[1].contains("answered 2 time(s)"),
            "{v:#?}"
        );
        assert!(
            v[2].contains("not a JSON-RPC 2.0 object") && v[3].contains("partial line"),
            "{v:#?}"
        );
        assert_eq!(agent_text(&agent.session_updates("s")), "hi");
        assert_eq!(agent.null_id_responses().len(), 1);
    }

    #[test]
    fn permission_requests_are_answered_by_policy() {
        let dir = tempfile::tempdir().unwrap();
        let bin = script(
            dir.path(),
            r#"echo '{"jsonrpc":"2.0","id":"p1","method":"session/request_permission","params":{"options":[{"optionId":"yes","kind":"allow_once"},{"optionId":"no","kind":"reject_once"}]}}'
read reply
echo "$reply" >&2
echo '{"jsonrpc":"2.0","id":"f1","method":"fs/read_text_file","params":{}}'
read reply
echo "$reply" >&2"#,
        );
        let agent = AgentProc::spawn(&bin, &[], dir.path());
        agent.set_permission_policy(PermissionPolicy::AllowOnce);
        assert!(
            agent
                .wait_exit(Duration::from_secs(5))
                .is_some_and(|s| s.success())
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while agent.stderr_text().lines().count() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        agent.wait_stdout_closed(Duration::from_secs(2));
        let err = agent.stderr_text();
        let replies: Vec<Value> = err
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(replies[0]["id"], "p1");
        assert_eq!(
            replies[0]["result"]["outcome"],
            json!({"outcome": "selected", "optionId": "yes"})
        );
        assert_eq!(replies[1]["error"]["code"], -32601);
        assert_eq!(agent.permission_requests().len(), 1);
        assert_eq!(agent.agent_requests().len(), 2);
        assert!(agent.violations().is_empty());
    }

    #[test]
    fn drop_kills_the_agent_and_descendants_in_other_groups() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let bin = script(
            dir.path(),
            &format!(
                "setsid sleep 1000 & echo $! > {}\nexec sleep 1000",
                pidfile.display()
            ),
        );
        let agent = AgentProc::spawn(&bin, &[], dir.path());
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&pidfile).map_or(true, |s| s.trim().is_empty()) {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        let grand: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let pid = agent.pid();
        assert!(procfs::is_alive(grand) && procfs::is_alive(pid));
        drop(agent);
        assert!(procfs::wait_all_dead(&[pid, grand], Duration::from_secs(5)).is_empty());
    }
}
