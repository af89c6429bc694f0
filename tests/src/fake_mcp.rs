//! The fake MCP server (MCP 2025-11-25 over stdio, one JSON-RPC message per line). It runs as
//! the suite's own test binary with `BUZZ_E2E_ROLE=fake-mcp` (see [`crate::run_suite`]); its
//! behaviour is set by `FAKE_MCP_*` environment variables, documented on [`Config`].
//!
//! Every `tools/call` is handled on its own thread, so concurrent calls overlap; every stdout
//! write is one whole line, written and flushed under one mutex.

use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How `_Stop` answers (`FAKE_MCP_STOP_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// A text result (the objection text, or `""` once the objections are used up).
    Text,
    /// A JSON-RPC error.
    Error,
    /// An `isError: true` result carrying the text.
    IsError,
    /// Never answers.
    Hang,
    /// Odd-numbered calls (1st, 3rd, …) are held unanswered; when the next `_Stop` call arrives
    /// the held one is answered first (late, with the objection text), then the new one at once
    /// with `""` — a late reply written while the next call is pending (case C30 b/c).
    Late,
    /// Answers as a FastMCP `-> str | None` tool does: an objection as a text block mirrored in
    /// `structuredContent: {"result": text}`, no objection as `return None`:
    /// `{"content":[],"structuredContent":{"result":null}}` (case C40).
    FastMcp,
    /// Objects with a reply line whose text is the JSON string body [`SURROGATE_TEXT_RAW`]: a
    /// pair, a lone high and a lone low surrogate escape, as JavaScript and Python write them
    /// (case C64); a strict JSON parser rejects the line, the agent reads it (SPEC L3b).
    Surrogates,
}

/// The whole behaviour, read from the environment once at start.
///
/// | variable | effect |
/// |---|---|
/// | `FAKE_MCP_TOOLS` | comma list from the catalogue (default `echo`): `echo` (`text`), `add` (`a`+`b`), `slow` (sleeps `ms`), `hang`, `crash`, `big` (`bytes`, optional `fill` string), `fail` (isError `boom`), `reject` (-32602), `shell` (`command`), `noisy` (writes `bytes` bytes to stderr as lines, default 300000, see [`noisy_stderr`]), `flood` (writes `bytes` bytes to stderr with no newline, then a newline and [`FLOOD_DONE`]), `latin1` (a reply line whose text is [`LATIN1_TEXT_RAW`]: invalid UTF-8, case C36), `surrogates` (a reply line whose text is the JSON string body [`SURROGATE_TEXT_RAW`]: a surrogate pair, a lone high and a lone low surrogate escape, as JavaScript and Python write them; case C64), `read` (title `Read Note`, `readOnlyHint`; echoes `text`), `delete` (`destructiveHint`; answers `deleted <path>`), `media` (text, a PNG image, a user-only and an assistant-only text: [`MEDIA_*`](MEDIA_PNG)), `progress` (sends `steps` (default 3) `notifications/progress` for the call's `progressToken`, 100 ms apart, then answers `done`; case C59), `unlock` (changes the list from `unlock`, `old_tool` to `unlock`, `secret_number` (answers `42`), sends `notifications/tools/list_changed`, then its reply; the changed list is answered 300 ms late; case C65), and the schema tools of [`odd_schema`] (`search`, `create_attachment`, `choose`, `merged`, `typed`, `conditional`, `bare`, `scalar`; case C63) |
/// | `FAKE_MCP_TOOL_COUNT=N` | adds echo-like tools `t0..t{N-1}` |
/// | `FAKE_MCP_DESCRIPTION_BYTES=N` | the descriptions of the `FAKE_MCP_TOOL_COUNT` and `FAKE_MCP_ECHO_NAMES` tools are padded to N bytes (SPEC S5: a tool list over its byte cap) |
/// | `FAKE_MCP_ECHO_NAMES` | comma list of names: adds an echo-like tool (`text`) under each name, e.g. a built-in tool's name (SPEC A10: a server may not shadow `load_skill`) |
/// | `FAKE_MCP_READ_TITLE=text` | the MCP `title` of the `read` tool (default `Read Note`): a server may title its tool as another server's (SPEC S3) |
/// | `FAKE_MCP_PAGE_SIZE=N` | `tools/list` pages of N tools with `nextCursor` |
/// | `FAKE_MCP_PROTOCOL_VERSION` | version answered to `initialize` (default: the requested one) |
/// | `FAKE_MCP_DELAY_MS` | delay before every model-tool `tools/call` reply (not hooks) |
/// | `FAKE_MCP_CRASH_AFTER=N` | on receiving `tools/call` number N+1: stderr line, exit 3 |
/// | `FAKE_MCP_GARBAGE=1` | non-JSON banner lines on stdout before the handshake and after every reply |
/// | `FAKE_MCP_FAIL_START=1` | stderr `boom: start failure requested`, exit 3 at once |
/// | `FAKE_MCP_NO_INIT_REPLY=1` | never answers `initialize` |
/// | `FAKE_MCP_INIT_DELAY_MS` | delay before the `initialize` reply (a server's own start-up time) |
/// | `FAKE_MCP_EXIT_AFTER_INIT=1` | answers `initialize`, then stderr `fatal: db locked`, exit 3 |
/// | `FAKE_MCP_SERVER_REQUESTS=1` | server→client requests `ping`, `roots/list`, `sampling/createMessage`, `elicitation/create` (ids `<p>-1`, `<p>-2`, a number equal to one of the client's ids, `<p>-4`): after `notifications/initialized` (`p` = `init`, number = the `initialize` id) and at the start of every model-tool `tools/call` (`p` = `call-<id>`, number = that call's own id `<id>`, still pending); a call then waits up to 5 s for the four answers and replies `isError` `server requests unanswered: …` if one is missing. Answers are in the call log |
/// | `FAKE_MCP_STOP=1` | exposes `_Stop` and the hidden `_Other` |
/// | `FAKE_MCP_STOP_NAME` | the name the `_Stop` hook is exposed and answered under (default `_Stop`; `_stop` for a misnamed hook, case C57) |
/// | `FAKE_MCP_STOP_TEXT` | objection text (default `tests are still red`) |
/// | `FAKE_MCP_STOP_OBJECT_TIMES` | N: the first N `_Stop` calls object, later ones answer `""`; `always` (default) |
/// | `FAKE_MCP_STOP_DELAY_MS` | delay before each `_Stop` reply |
/// | `FAKE_MCP_STOP_MODE` | `text` (default), `error`, `iserror`, `hang`, `late` (see [`StopMode::Late`]), `fastmcp` (see [`StopMode::FastMcp`]), `surrogates` (see [`StopMode::Surrogates`]) |
/// | `FAKE_MCP_POSTCOMPACT_TEXT` | set (even empty): exposes `_PostCompact` answering it |
/// | `FAKE_MCP_POSTCOMPACT_DELAY_MS` | delay before each `_PostCompact` reply |
/// | `FAKE_MCP_SESSION_START_TEXT` | set (even empty): exposes `_SessionStart` answering it |
/// | `FAKE_MCP_SESSION_END_TEXT` | set (even empty): exposes `_SessionEnd` answering it |
/// | `FAKE_MCP_SESSION_HOOK_DELAY_MS` | delay before each `_SessionStart` / `_SessionEnd` reply; `hang` never answers |
/// | `FAKE_MCP_INTERCEPTORS` | a JSON array of SEP-2624 interceptors (see [`FakeInterceptor`]): the server answers `interceptors/list` and `interceptor/invoke` (SPEC X1); unset: `-32601` like any unknown method |
/// | `FAKE_MCP_CALL_LOG=path` | appends every received line, flushed |
/// | `FAKE_MCP_GRANDCHILD_PIDFILE=path` | spawns `sleep 1000`, writes `<own pid> <grandchild pid>` |
/// | `FAKE_MCP_GRANDCHILD_SETSID=1` | that grandchild calls `setsid` first: it leaves the server's process group and session |
/// | `FAKE_MCP_IGNORE_TERM=1` | ignores SIGTERM and does not exit on stdin EOF (only SIGKILL ends it) |
/// | `FAKE_MCP_ENV_DUMP=path` | writes its environment as a JSON object at start |
/// | `FAKE_MCP_PARENT_ENVIRON=path` | at start, with no capability in its effective set (dropped when it runs as root: it is then an unprivileged process of the agent's user), reads `/proc/<parent>/environ` and writes `{"ok":true,"environ":…}` or `{"ok":false,"error":…}` (SPEC S1: the agent is not dumpable) |
/// | `FAKE_MCP_CWD_FILE=path` | writes its working directory at start |
/// | `FAKE_MCP_STDERR_LINES=N` | writes `stderr line i` (i in 0..N) to stderr at start |
/// | `FAKE_MCP_HOSTILE_TEXT=text` | terminal injection (SPEC S6): writes `text` and a newline to stderr at start, sends it as an `error` `notifications/message` after `notifications/initialized`, titles and describes its tool `hostile` with it (a call answers it as text), and lists a second tool named `x` + `text` |
/// | `FAKE_MCP_LIST_CHANGED_AFTER_CALL=N` | after replying to model-tool call number N: adds the echo-like tool `late` and sends `notifications/tools/list_changed` |
/// | `FAKE_MCP_PROMPTS` | comma list of prompts from [`prompt_list`] (`review`, `greet`, `media`, `broken`, `hang` (never answered), `_hidden`): the server declares `capabilities.prompts` (`listChanged`) and answers `prompts/list` and `prompts/get` (an unknown name or a missing required argument is `-32602`, as the MCP SDKs answer); unset: no prompts capability, `prompts/*` are `-32601` |
/// | `FAKE_MCP_PROMPT_PAGE_SIZE=N` | `prompts/list` pages of N prompts with `nextCursor` |
/// | `FAKE_MCP_PING_FLOOD=N` | on its first `tools/call` (never answered) the server stops reading its stdin for good and sends `ping` requests whose string ids are N bytes long, until [`PING_FLOOD_BYTES`] are sent or stdout fails (SPEC S5: a server that never reads its answers) |
/// | `FAKE_MCP_PROMPTS_CHANGED_AFTER_CALL=N` | after replying to model-tool call number N: adds the prompt `later` and sends `notifications/prompts/list_changed` |
#[derive(Debug, Clone)]
pub struct Config {
    pub tools: Vec<String>,
    pub tool_count: usize,
    /// `FAKE_MCP_DESCRIPTION_BYTES`: the echo-like tools' descriptions padded to this length.
    pub description_bytes: usize,
    /// `FAKE_MCP_ECHO_NAMES`: echo-like tools under these names.
    pub echo_names: Vec<String>,
    pub page_size: Option<usize>,
    pub protocol_version: Option<String>,
    pub delay_ms: u64,
    pub crash_after: Option<u64>,
    pub garbage: bool,
    pub fail_start: bool,
    pub no_init_reply: bool,
    pub init_delay_ms: u64,
    pub exit_after_init: bool,
    pub server_requests: bool,
    pub stop: bool,
    pub stop_name: String,
    pub stop_text: String,
    /// `None` = always object.
    pub stop_object_times: Option<u64>,
    pub stop_delay_ms: u64,
    pub stop_mode: StopMode,
    pub postcompact_text: Option<String>,
    pub postcompact_delay_ms: u64,
    pub session_start_text: Option<String>,
    pub session_end_text: Option<String>,
    /// `None`: the session hooks never answer.
    pub session_hook_delay_ms: Option<u64>,
    pub interceptors: Vec<FakeInterceptor>,
    pub call_log: Option<PathBuf>,
    pub grandchild_pidfile: Option<PathBuf>,
    pub grandchild_setsid: bool,
    pub ignore_term: bool,
    pub env_dump: Option<PathBuf>,
    pub parent_environ: Option<PathBuf>,
    pub cwd_file: Option<PathBuf>,
    pub stderr_lines: u64,
    pub hostile_text: Option<String>,
    pub read_title: String,
    pub list_changed_after_call: Option<u64>,
    pub prompts: Vec<String>,
    pub prompt_page_size: Option<usize>,
    pub prompts_changed_after_call: Option<u64>,
    /// `FAKE_MCP_PING_FLOOD`: the length of each ping's id.
    pub ping_flood: Option<usize>,
}

/// How many bytes of pings `FAKE_MCP_PING_FLOOD` sends at most: far more than any cap of the
/// agent, so a missing cap shows in its memory.
pub const PING_FLOOD_BYTES: usize = 256 * 1024 * 1024;

/// Banner text the fake writes on stdout with `FAKE_MCP_GARBAGE=1` (never valid JSON).
pub const GARBAGE_BANNER: &str = "FAKE-MCP BANNER: server v1.2.3 starting (not json)";
/// Text of the line written after every reply with `FAKE_MCP_GARBAGE=1`.
pub const GARBAGE_AFTER_REPLY: &str = "FAKE-MCP LOG: replied";
/// Stderr line of the `crash` tool and `FAKE_MCP_CRASH_AFTER`.
pub const CRASH_STDERR: &str = "fatal: crash requested";
/// Stderr line of `FAKE_MCP_EXIT_AFTER_INIT`.
pub const EXIT_AFTER_INIT_STDERR: &str = "fatal: db locked";
/// Stderr line of `FAKE_MCP_FAIL_START`.
pub const FAIL_START_STDERR: &str = "boom: start failure requested";

impl Config {
    /// Reads the configuration through `get` (the environment in the real server).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let flag = |k: &str| get(k).is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        let path = |k: &str| get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        // A comma list of names, blanks dropped.
        let names = |v: String| -> Vec<String> {
            v.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        };
        let tools = names(get("FAKE_MCP_TOOLS").unwrap_or_else(|| "echo".into()));
        let stop_object_times = match get("FAKE_MCP_STOP_OBJECT_TIMES").as_deref().map(str::trim) {
            None | Some("always") | Some("") => None,
            Some(n) => n.parse().ok(),
        };
        let stop_mode = match get("FAKE_MCP_STOP_MODE").as_deref().map(str::trim) {
            Some("error") => StopMode::Error,
            Some("iserror") => StopMode::IsError,
            Some("hang") => StopMode::Hang,
            Some("late") => StopMode::Late,
            Some("fastmcp") => StopMode::FastMcp,
            Some("surrogates") => StopMode::Surrogates,
            _ => StopMode::Text,
        };
        Config {
            tools,
            tool_count: num("FAKE_MCP_TOOL_COUNT").unwrap_or(0) as usize,
            description_bytes: num("FAKE_MCP_DESCRIPTION_BYTES").unwrap_or(0) as usize,
            echo_names: names(get("FAKE_MCP_ECHO_NAMES").unwrap_or_default()),
            page_size: num("FAKE_MCP_PAGE_SIZE")
                .filter(|&n| n > 0)
                .map(|n| n as usize),
            protocol_version: get("FAKE_MCP_PROTOCOL_VERSION").filter(|v| !v.is_empty()),
            delay_ms: num("FAKE_MCP_DELAY_MS").unwrap_or(0),
            crash_after: num("FAKE_MCP_CRASH_AFTER"),
            garbage: flag("FAKE_MCP_GARBAGE"),
            fail_start: flag("FAKE_MCP_FAIL_START"),
            no_init_reply: flag("FAKE_MCP_NO_INIT_REPLY"),
            init_delay_ms: num("FAKE_MCP_INIT_DELAY_MS").unwrap_or(0),
            exit_after_init: flag("FAKE_MCP_EXIT_AFTER_INIT"),
            server_requests: flag("FAKE_MCP_SERVER_REQUESTS"),
            stop: flag("FAKE_MCP_STOP"),
            stop_name: get("FAKE_MCP_STOP_NAME")
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| "_Stop".into()),
            stop_text: get("FAKE_MCP_STOP_TEXT").unwrap_or_else(|| "tests are still red".into()),
            stop_object_times,
            stop_delay_ms: num("FAKE_MCP_STOP_DELAY_MS").unwrap_or(0),
            stop_mode,
            postcompact_text: get("FAKE_MCP_POSTCOMPACT_TEXT"),
            postcompact_delay_ms: num("FAKE_MCP_POSTCOMPACT_DELAY_MS").unwrap_or(0),
            session_start_text: get("FAKE_MCP_SESSION_START_TEXT"),
            session_end_text: get("FAKE_MCP_SESSION_END_TEXT"),
            session_hook_delay_ms: match get("FAKE_MCP_SESSION_HOOK_DELAY_MS").as_deref() {
                Some("hang") => None,
                _ => Some(num("FAKE_MCP_SESSION_HOOK_DELAY_MS").unwrap_or(0)),
            },
            interceptors: get("FAKE_MCP_INTERCEPTORS")
                .map(|j| FakeInterceptor::parse_list(&j))
                .unwrap_or_default(),
            call_log: path("FAKE_MCP_CALL_LOG"),
            grandchild_pidfile: path("FAKE_MCP_GRANDCHILD_PIDFILE"),
            grandchild_setsid: flag("FAKE_MCP_GRANDCHILD_SETSID"),
            ignore_term: flag("FAKE_MCP_IGNORE_TERM"),
            env_dump: path("FAKE_MCP_ENV_DUMP"),
            parent_environ: path("FAKE_MCP_PARENT_ENVIRON"),
            cwd_file: path("FAKE_MCP_CWD_FILE"),
            stderr_lines: num("FAKE_MCP_STDERR_LINES").unwrap_or(0),
            hostile_text: get("FAKE_MCP_HOSTILE_TEXT").filter(|t| !t.is_empty()),
            read_title: get("FAKE_MCP_READ_TITLE")
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "Read Note".into()),
            list_changed_after_call: num("FAKE_MCP_LIST_CHANGED_AFTER_CALL"),
            prompts: names(get("FAKE_MCP_PROMPTS").unwrap_or_default()),
            prompt_page_size: num("FAKE_MCP_PROMPT_PAGE_SIZE")
                .filter(|&n| n > 0)
                .map(|n| n as usize),
            prompts_changed_after_call: num("FAKE_MCP_PROMPTS_CHANGED_AFTER_CALL"),
            ping_flood: num("FAKE_MCP_PING_FLOOD").map(|n| n as usize),
        }
    }

    /// The prompts of `FAKE_MCP_PROMPTS` (MCP `Prompt`s), in order, and `later` once added.
    pub fn prompt_list(&self, later: bool) -> Vec<Value> {
        let mut names: Vec<&str> = self.prompts.iter().map(String::as_str).collect();
        if later {
            names.push("later");
        }
        names
            .into_iter()
            .filter_map(|name| {
                Some(match name {
                    "review" => json!({"name": "review", "title": "Code review",
                        "description": "Reviews a file with an optional focus",
                        "arguments": [
                            {"name": "file", "description": "The file to review", "required": true},
                            {"name": "focus", "description": "What to look at", "required": false}]}),
                    "greet" => json!({"name": "greet", "description": "Greets the team"}),
                    "media" => json!({"name": "media",
                        "description": "Text, an image, an embedded resource and an assistant line"}),
                    "broken" => json!({"name": "broken", "description": "Always fails"}),
                    "hang" => json!({"name": "hang", "description": "Never answers"}),
                    "_hidden" => json!({"name": "_hidden", "description": "A hook server's own prompt"}),
                    "later" => json!({"name": "later", "description": "Added after a tool call"}),
                    _ => return None,
                })
            })
            .collect()
    }

    /// The tool list, in `tools/list` order: catalogue tools, `t0..`, then hooks.
    pub fn tool_list(&self) -> Vec<Value> {
        let obj = |props: Value, required: &[&str]| json!({"type": "object", "properties": props, "required": required});
        let mut out = Vec::new();
        for name in &self.tools {
            let (description, schema) = match name.as_str() {
                "echo" => (
                    "Echoes `text` back",
                    obj(json!({"text": {"type": "string"}}), &["text"]),
                ),
                "add" => (
                    "Adds two numbers",
                    obj(
                        json!({"a": {"type": "number"}, "b": {"type": "number"}}),
                        &["a", "b"],
                    ),
                ),
                "slow" => (
                    "Sleeps `ms` milliseconds",
                    obj(json!({"ms": {"type": "integer"}}), &[]),
                ),
                "hang" => ("Never answers", obj(json!({}), &[])),
                "crash" => ("Exits the server mid-call", obj(json!({}), &[])),
                "big" => (
                    "Returns a text of `bytes` bytes: BEGIN-, the fill repeated, -END",
                    obj(
                        json!({"bytes": {"type": "integer"}, "fill": {"type": "string"}}),
                        &["bytes"],
                    ),
                ),
                "noisy" => (
                    "Writes `bytes` bytes of log lines to stderr, then answers",
                    obj(json!({"bytes": {"type": "integer"}}), &[]),
                ),
                "flood" => (
                    "Writes `bytes` bytes to stderr without a newline, then answers",
                    obj(json!({"bytes": {"type": "integer"}}), &[]),
                ),
                "fail" => ("Returns an isError result", obj(json!({}), &[])),
                "latin1" => (
                    "Returns legacy-encoded (not UTF-8) text",
                    obj(json!({}), &[]),
                ),
                "surrogates" => (
                    "Returns text cut inside surrogate pairs",
                    obj(json!({}), &[]),
                ),
                "unlock" => (
                    "Unlocks `secret_number` (and removes `old_tool`)",
                    obj(json!({}), &[]),
                ),
                "old_tool" => ("A tool that goes away on `unlock`", obj(json!({}), &[])),
                "secret_number" => (
                    "Tells the secret number; listed after `unlock`",
                    obj(json!({}), &[]),
                ),
                "reject" => ("Answers a JSON-RPC error", obj(json!({}), &[])),
                "read" => (
                    "Reads a note (echoes `text`)",
                    obj(json!({"text": {"type": "string"}}), &[]),
                ),
                "delete" => (
                    "Deletes `path`",
                    obj(json!({"path": {"type": "string"}}), &[]),
                ),
                "media" => (
                    "Returns text, an image and annotated texts",
                    obj(json!({}), &[]),
                ),
                "progress" => (
                    "Reports progress `steps` times, then answers",
                    obj(json!({"steps": {"type": "integer"}}), &[]),
                ),
                "shell" => (
                    "Pretends to run a shell command",
                    obj(json!({"command": {"type": "string"}}), &["command"]),
                ),
                other => match odd_schema(other) {
                    Some(odd) => odd,
                    None => (
                        "Unknown catalogue entry, echoes `text`",
                        obj(json!({}), &[]),
                    ),
                },
            };
            let mut tool = json!({"name": name, "description": description, "inputSchema": schema});
            // C53: the MCP tool title and annotations ACP clients decide permissions by.
            match name.as_str() {
                "read" => {
                    tool["title"] = json!(self.read_title);
                    tool["annotations"] = json!({"readOnlyHint": true});
                }
                "delete" => tool["annotations"] = json!({"destructiveHint": true}),
                _ => {}
            }
            out.push(tool);
        }
        let counted = (0..self.tool_count).map(|i| format!("t{i}"));
        let mut description = String::from("Echoes `text` back");
        if self.description_bytes > description.len() {
            description.push_str(&" ".repeat(self.description_bytes - description.len()));
        }
        for name in counted.chain(self.echo_names.iter().cloned()) {
            out.push(json!({
                "name": name,
                "description": description,
                "inputSchema": obj(json!({"text": {"type": "string"}}), &[]),
            }));
        }
        if let Some(text) = &self.hostile_text {
            out.push(
                json!({"name": "hostile", "title": text, "description": text,
                            "inputSchema": obj(json!({}), &[])}),
            );
            out.push(
                json!({"name": format!("x{text}"), "description": "a name with controls",
                            "inputSchema": obj(json!({}), &[])}),
            );
        }
        let hook = |name: &str| json!({"name": name, "description": "hook", "inputSchema": {"type": "object"}});
        if self.stop {
            out.push(hook(&self.stop_name));
            out.push(hook("_Other"));
        }
        if self.postcompact_text.is_some() {
            out.push(hook("_PostCompact"));
        }
        if self.session_start_text.is_some() {
            out.push(hook("_SessionStart"));
        }
        if self.session_end_text.is_some() {
            out.push(hook("_SessionEnd"));
        }
        out
    }
}

/// What a fake interceptor does when invoked (`behavior` in `FAKE_MCP_INTERCEPTORS`).
#[derive(Debug, Clone, PartialEq)]
pub enum InterceptBehavior {
    /// `allow`: valid (a validator) or unchanged (a mutator).
    Allow,
    /// `deny`: `valid: false`, severity `error`, with `message` (a validator).
    Deny(String),
    /// `vague`: `valid: false` with `message` and no overall severity (a validator).
    Vague(String),
    /// `rewrite`: a mutator answering `modified: true` with `payload` as given, whatever it
    /// is (a result that is not a result, for the malformed-rewrite tests).
    Rewrite(Value),
    /// `set`: a mutator setting `arguments.<key>` to the value, for each pair of `set`.
    Set(serde_json::Map<String, Value>),
    /// `error`: a JSON-RPC error -32603.
    Error,
    /// `crash`: the server process exits (status 3) when invoked.
    Crash,
    /// `hang`: never answers.
    Hang,
}

/// One interceptor of `FAKE_MCP_INTERCEPTORS`: `{"name", "type": "validation"|"mutation",
/// "phase"?: "request"|"response"|"both" (default request), "behavior": "allow"|"deny"|"vague"|
/// "set"|"rewrite"|"error"|"crash"|"hang", "message"? (deny, vague), "set"? (an object, for
/// set), "payload"? (for rewrite), "mode"?, "failOpen"?, "priorityHint"?, "descriptor"?}`.
/// `descriptor`, when given, is listed verbatim instead of the one built from the other fields
/// (for descriptors with typos). Written independently of the agent's own codec, in the shape
/// of the SEP-2624 conformance suite (`hooks: [{events, phase}]`).
#[derive(Debug, Clone, PartialEq)]
pub struct FakeInterceptor {
    pub name: String,
    pub kind: String,
    pub phases: Vec<String>,
    pub behavior: InterceptBehavior,
    /// The descriptor fields passed through as given: `mode`, `failOpen`, `priorityHint`.
    pub extra: serde_json::Map<String, Value>,
    /// A descriptor listed verbatim (`descriptor`).
    pub raw: Option<Value>,
}

impl FakeInterceptor {
    /// Reads the list (a bad entry panics: the configuration is the test's own).
    pub fn parse_list(json: &str) -> Vec<FakeInterceptor> {
        let v: Value = serde_json::from_str(json).expect("FAKE_MCP_INTERCEPTORS is JSON");
        v.as_array()
            .expect("FAKE_MCP_INTERCEPTORS is an array")
            .iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                let phases = match e["phase"].as_str().unwrap_or("request") {
                    "both" => vec!["request".to_string(), "response".to_string()],
                    p => vec![p.to_string()],
                };
                let behavior = match e["behavior"].as_str().unwrap_or("allow") {
                    "deny" => InterceptBehavior::Deny(s("message")),
                    "vague" => InterceptBehavior::Vague(s("message")),
                    "rewrite" => InterceptBehavior::Rewrite(e["payload"].clone()),
                    "set" => {
                        InterceptBehavior::Set(e["set"].as_object().cloned().unwrap_or_default())
                    }
                    "error" => InterceptBehavior::Error,
                    "crash" => InterceptBehavior::Crash,
                    "hang" => InterceptBehavior::Hang,
                    _ => InterceptBehavior::Allow,
                };
                let mut extra = serde_json::Map::new();
                for k in ["mode", "failOpen", "priorityHint"] {
                    if let Some(x) = e.get(k) {
                        extra.insert(k.to_string(), x.clone());
                    }
                }
                FakeInterceptor {
                    name: s("name"),
                    kind: e["type"].as_str().unwrap_or("validation").to_string(),
                    phases,
                    behavior,
                    extra,
                    raw: e.get("descriptor").cloned(),
                }
            })
            .collect()
    }

    /// The `interceptors/list` descriptor.
    pub fn descriptor(&self) -> Value {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let mut d = json!({
            "name": self.name,
            "type": self.kind,
            "hooks": self.phases.iter().map(|p| json!({"events": ["tools/call"], "phase": p})).collect::<Vec<_>>(),
        });
        for (k, v) in &self.extra {
            d[k] = v.clone();
        }
        d
    }
}

/// The text the `big` tool returns: `BEGIN-`, `fill` repeated, `-END`, exactly `bytes` bytes
/// long when the fill is ASCII (for a multi-byte fill, as close as whole characters allow, never
/// longer).
pub fn big_text(bytes: usize, fill: &str) -> String {
    let fill = if fill.is_empty() { "m" } else { fill };
    if bytes < 10 {
        return "x".repeat(bytes);
    }
    let mut s = String::from("BEGIN-");
    let body = bytes - 6 - 4;
    while s.len() + fill.len() <= 6 + body {
        s.push_str(fill);
    }
    while s.len() < 6 + body {
        s.push('m');
    }
    s.push_str("-END");
    s
}

/// Length of each stderr line the `noisy` tool writes, newline included.
pub const NOISY_LINE_BYTES: usize = 100;
/// The line the `flood` tool writes after its endless line (on a line of its own).
pub const FLOOD_DONE: &str = "flood done";

/// The `noisy` tool's output (case C51, a chatty server): about `bytes` bytes as lines of
/// [`NOISY_LINE_BYTES`] (`noisy line <n> ` padded with `.`), written to `w`. Returns the bytes
/// written (fewer when `w` fails).
pub fn noisy_stderr(w: &mut impl Write, bytes: usize) -> usize {
    let mut wrote = 0;
    let mut n = 0u64;
    while wrote < bytes {
        let mut line = format!("noisy line {n} ");
        line.extend(std::iter::repeat_n('.', NOISY_LINE_BYTES - 1 - line.len()));
        line.push('\n');
        if w.write_all(line.as_bytes()).is_err() {
            break;
        }
        wrote += line.len();
        n += 1;
    }
    let _ = w.flush();
    wrote
}

/// The `flood` tool's output (case C52, an endless stderr line): `bytes` bytes of `x` with no
/// newline, then `\n` and [`FLOOD_DONE`] on a line of its own, written to `w` in 64 KiB
/// writes. Returns the `x` bytes written (fewer when `w` fails).
pub fn flood_stderr(w: &mut impl Write, bytes: usize) -> usize {
    let chunk = [b'x'; 64 * 1024];
    let mut wrote = 0;
    while wrote < bytes {
        let n = chunk.len().min(bytes - wrote);
        if w.write_all(&chunk[..n]).is_err() {
            return wrote;
        }
        wrote += n;
    }
    let _ = writeln!(w, "\n{FLOOD_DONE}");
    let _ = w.flush();
    wrote
}

/// The catalogue tools whose `inputSchema` uses JSON Schema that providers take only in
/// part (SPEC M14, case C63), as real servers write them; each answers `<name> <arguments as
/// compact JSON>`:
/// * `search`: a plain schema (`query`);
/// * `create_attachment`: a pure root `anyOf` of `content` / `source_url` (Notion's
///   `notion-create-attachment`, case C63);
/// * `choose`: a root `oneOf` of two branches told apart by a `const` `action`, each closed
///   with `additionalProperties: false`;
/// * `merged`: a root `allOf` whose first branch is a `$ref` into `$defs`;
/// * `typed`: `$schema`, a `type` array, `const`, `exclusiveMinimum`, a map
///   (`additionalProperties` schema) and a nested `$ref`;
/// * `conditional`: a root `if`/`then`;
/// * `bare`: `{"type":"object"}` only (no `properties`);
/// * `scalar`: `{"type":"string"}`, a root that is not an object: no provider takes it, so
///   the agent drops the tool.
pub fn odd_schema(name: &str) -> Option<(&'static str, Value)> {
    let schema = match name {
        "search" => json!({"type": "object", "properties": {"query": {"type": "string"}},
            "required": ["query"]}),
        "create_attachment" => json!({"type": "object", "anyOf": [
            {"properties": {"content": {"type": "string"}}, "required": ["content"]},
            {"properties": {"source_url": {"type": "string"}}, "required": ["source_url"]}]}),
        "choose" => json!({"type": "object", "oneOf": [
            {"properties": {"action": {"type": "string", "const": "create"},
                            "name": {"type": "string"}},
             "required": ["action", "name"], "additionalProperties": false},
            {"properties": {"action": {"type": "string", "const": "delete"},
                            "id": {"type": "integer"}},
             "required": ["action", "id"], "additionalProperties": false}]}),
        "merged" => json!({"type": "object", "allOf": [{"$ref": "#/$defs/Base"},
            {"properties": {"force": {"type": "boolean"}}}],
            "$defs": {"Base": {"properties": {"path": {"type": "string"}}, "required": ["path"]}}}),
        "typed" => json!({"$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object", "properties": {
                "note": {"type": ["string", "null"]},
                "mode": {"const": "fast"},
                "ratio": {"type": "number", "exclusiveMinimum": 0},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "target": {"$ref": "#/$defs/Target"}},
            "required": ["mode"],
            "$defs": {"Target": {"type": "object", "properties": {"id": {"type": "string"}}}}}),
        "conditional" => json!({"type": "object", "properties": {
                "kind": {"type": "string"}, "size": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "big"}}}, "then": {"required": ["size"]}}),
        "bare" => json!({"type": "object"}),
        "scalar" => json!({"type": "string"}),
        _ => return None,
    };
    Some(("A tool with a schema providers take only in part", schema))
}

/// The text of the `latin1` tool, byte for byte (case C36): Latin-1 `é` and CP949 bytes.
pub const LATIN1_TEXT_RAW: &[u8] = b"int caf\xE9 = 1; // \xB0\xA1\xC7\xD1 END";
/// [`LATIN1_TEXT_RAW`] decoded lossily, as the agent must see it (SPEC L9).
pub const LATIN1_TEXT_LOSSY: &str = "int caf\u{FFFD} = 1; // \u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD} END";

/// The text of the `surrogates` tool as written inside its reply's JSON string (case C64): a
/// valid pair (😀), then a lone high and a lone low surrogate escape.
pub const SURROGATE_TEXT_RAW: &str = r"pair \ud83d\ude00, cut \ud83d, orphan \udc00 END";
/// [`SURROGATE_TEXT_RAW`] as the agent must decode it (SPEC L3b).
pub const SURROGATE_TEXT_LOSSY: &str = "pair \u{1F600}, cut \u{FFFD}, orphan \u{FFFD} END";

/// The `media` tool's content (case C59): the text both readers get, a 1×1 PNG (base64),
/// a text for the user only and one for the model only.
pub const MEDIA_TEXT: &str = "a picture:";
/// Base64 of a 1×1 transparent PNG.
pub const MEDIA_PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";
/// The `media` tool's text annotated `audience: ["user"]`.
pub const MEDIA_USER_ONLY: &str = "shown to the user only";
/// The `media` tool's text annotated `audience: ["assistant"]`.
pub const MEDIA_MODEL_ONLY: &str = "for the model only";

/// Output shared by all handler threads: one line per write, flushed.
#[derive(Clone)]
pub struct Out(Arc<Mutex<Box<dyn Write + Send>>>);

impl Out {
    pub fn new(w: Box<dyn Write + Send>) -> Out {
        Out(Arc::new(Mutex::new(w)))
    }

    /// Writes one JSON message as a line; returns false when the pipe is gone.
    fn send(&self, msg: &Value, garbage: bool) -> bool {
        let Ok(mut w) = self.0.lock() else {
            return false;
        };
        let mut line = msg.to_string();
        line.push('\n');
        if garbage {
            line.push_str(GARBAGE_AFTER_REPLY);
            line.push('\n');
        }
        w.write_all(line.as_bytes())
            .and_then(|()| w.flush())
            .is_ok()
    }

    fn raw(&self, text: &str) {
        self.raw_bytes(text.as_bytes());
    }

    fn raw_bytes(&self, bytes: &[u8]) {
        if let Ok(mut w) = self.0.lock() {
            let _ = w.write_all(bytes).and_then(|()| w.flush());
        }
    }
}

/// What the server does when it must die (the `crash` tool, `FAKE_MCP_CRASH_AFTER`). The real
/// server exits the process; in-memory tests may do something else.
pub type Exit = Arc<dyn Fn(i32) + Send + Sync>;

struct Server {
    cfg: Config,
    out: Out,
    log: Option<Mutex<std::fs::File>>,
    calls: AtomicU64,
    stop_calls: AtomicU64,
    exit: Exit,
    /// Model-tool calls replied to (for `FAKE_MCP_LIST_CHANGED_AFTER_CALL`).
    replied: AtomicU64,
    /// The tool `late` was added.
    late: std::sync::atomic::AtomicBool,
    /// The prompt `later` was added (`FAKE_MCP_PROMPTS_CHANGED_AFTER_CALL`).
    later_prompt: std::sync::atomic::AtomicBool,
    /// `unlock` was called: `secret_number` replaces `old_tool` (case C65).
    unlocked: std::sync::atomic::AtomicBool,
    /// The id of the `initialize` request (for `FAKE_MCP_SERVER_REQUESTS`).
    init_id: Mutex<Option<Value>>,
    /// Responses received to the server's own requests, in arrival order.
    answers: Mutex<Vec<Value>>,
    answered: Condvar,
    /// `StopMode::Late`: the id of the held `_Stop` call.
    held_stop: Mutex<Option<Value>>,
}

/// The four server→client requests of `FAKE_MCP_SERVER_REQUESTS` (case C13): `ping`,
/// `roots/list`, `sampling/createMessage` with the numeric id `collide` (one of the client's
/// own ids), `elicitation/create`.
pub fn server_requests(prefix: &str, collide: &Value) -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": format!("{prefix}-1"), "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": format!("{prefix}-2"), "method": "roots/list"}),
        json!({"jsonrpc": "2.0", "id": collide, "method": "sampling/createMessage",
               "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "summarise"}}],
                          "maxTokens": 50}}),
        json!({"jsonrpc": "2.0", "id": format!("{prefix}-4"), "method": "elicitation/create",
               "params": {"message": "pick", "requestedSchema": {"type": "object", "properties": {
                   "choice": {"type": "string", "enum": ["a", "b"], "default": "a"}}}}}),
    ]
}

fn ok(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn err(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn text_result(text: &str, is_error: bool) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

impl Server {
    fn reply(&self, msg: &Value) -> bool {
        self.out.send(msg, self.cfg.garbage)
    }

    /// `FAKE_MCP_PING_FLOOD`: runs on the reading thread, so nothing is read any more; pings
    /// with `len`-byte ids until [`PING_FLOOD_BYTES`] are sent or stdout fails, then idles
    /// until killed.
    fn flood_pings(&self, len: usize) -> ! {
        let mut sent = 0;
        let mut n = 0u64;
        while sent < PING_FLOOD_BYTES {
            let head = format!("flood-{n}-");
            let id = format!("{head}{}", "x".repeat(len.saturating_sub(head.len())));
            sent += id.len();
            if !self.out.send(
                &json!({"jsonrpc": "2.0", "id": id, "method": "ping"}),
                false,
            ) {
                break;
            }
            n += 1;
        }
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    fn die(&self) {
        eprintln!("{CRASH_STDERR}");
        let _ = std::io::stderr().flush();
        (self.exit)(3);
    }

    /// Sends the four server→client requests and waits (5 s) for an answer to each, matched by
    /// the exact id (type included); `Err` lists the ids left unanswered.
    fn ask_client(&self, prefix: &str, collide: &Value) -> Result<(), Vec<Value>> {
        let requests = server_requests(prefix, collide);
        for r in &requests {
            self.out.send(r, false);
        }
        let ids: Vec<Value> = requests.iter().map(|r| r["id"].clone()).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let missing: Vec<Value> = ids
                .iter()
                .filter(|id| !answers.iter().any(|a| &a["id"] == *id))
                .cloned()
                .collect();
            let now = std::time::Instant::now();
            if missing.is_empty() {
                return Ok(());
            }
            if now >= deadline {
                return Err(missing);
            }
            answers = self
                .answered
                .wait_timeout(answers, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    fn handle_line(self: &Arc<Self>, line: &str) {
        if let Some(Ok(mut f)) = self.log.as_ref().map(Mutex::lock) {
            let _ = writeln!(f, "{line}").and_then(|()| f.flush());
        }
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            eprintln!(
                "fake-mcp: ignoring non-JSON line: {}",
                line.chars().take(200).collect::<String>()
            );
            return;
        };
        let Some(method) = msg["method"].as_str() else {
            // A response: to one of our own requests (FAKE_MCP_SERVER_REQUESTS), or junk.
            if msg.get("id").is_some() {
                if let Ok(mut a) = self.answers.lock() {
                    a.push(msg.clone());
                }
                self.answered.notify_all();
            }
            return;
        };
        if let (true, Some(len)) = (method == "tools/call", self.cfg.ping_flood) {
            self.flood_pings(len);
        }
        if let (true, Some(text)) = (
            method == "notifications/initialized",
            &self.cfg.hostile_text,
        ) {
            self.out.send(
                &json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "error", "logger": "hostile", "data": text}}),
                false,
            );
        }
        if method == "notifications/initialized" && self.cfg.server_requests {
            let collide = self
                .init_id
                .lock()
                .ok()
                .and_then(|g| g.clone())
                .unwrap_or(json!(0));
            for r in server_requests("init", &collide) {
                self.out.send(&r, false);
            }
        }
        let id = match msg.get("id") {
            Some(id) => id.clone(),
            None => return, // notifications: initialized, cancelled, … only logged
        };
        match method {
            "initialize" => {
                if let Ok(mut g) = self.init_id.lock() {
                    *g = Some(id.clone());
                }
                if self.cfg.no_init_reply {
                    return;
                }
                std::thread::sleep(Duration::from_millis(self.cfg.init_delay_ms));
                let version = self
                    .cfg
                    .protocol_version
                    .clone()
                    .or_else(|| {
                        msg["params"]["protocolVersion"]
                            .as_str()
                            .map(str::to_string)
                    })
                    .unwrap_or_else(|| "2025-11-25".into());
                self.reply(&ok(
                    &id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": if self.cfg.prompts.is_empty() {
                            json!({"tools": {"listChanged": true}})
                        } else {
                            json!({"tools": {"listChanged": true}, "prompts": {"listChanged": true}})
                        },
                        "serverInfo": {"name": "fake-mcp", "version": "1.0.0"},
                    }),
                ));
                if self.cfg.exit_after_init {
                    eprintln!("{EXIT_AFTER_INIT_STDERR}");
                    let _ = std::io::stderr().flush();
                    (self.exit)(3);
                }
            }
            "ping" => {
                self.reply(&ok(&id, json!({})));
            }
            "tools/list" => {
                let mut all = self.cfg.tool_list();
                if self.cfg.tools.iter().any(|t| t == "unlock") {
                    // C65: `old_tool` before `unlock`, `secret_number` after it; the list that
                    // changed is answered 300 ms late, so a client that does not wait for it
                    // offers the old one.
                    let unlocked = self.unlocked.load(Ordering::SeqCst);
                    let gone = if unlocked {
                        "old_tool"
                    } else {
                        "secret_number"
                    };
                    all.retain(|t| t["name"] != gone);
                    if unlocked {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                }
                if self.late.load(Ordering::SeqCst) {
                    all.push(json!({"name": "late", "description": "Echoes `text` back (added later)",
                                    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}));
                }
                let start = msg["params"]["cursor"]
                    .as_str()
                    .and_then(|c| c.strip_prefix('c'))
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0)
                    .min(all.len());
                let result = match self.cfg.page_size {
                    Some(size) => {
                        let end = (start + size).min(all.len());
                        let mut r = json!({"tools": all[start..end]});
                        if end < all.len() {
                            r["nextCursor"] = json!(format!("c{end}"));
                        }
                        r
                    }
                    None => json!({"tools": all}),
                };
                self.reply(&ok(&id, result));
            }
            "prompts/list" if !self.cfg.prompts.is_empty() => {
                let all = self
                    .cfg
                    .prompt_list(self.later_prompt.load(Ordering::SeqCst));
                let start = msg["params"]["cursor"]
                    .as_str()
                    .and_then(|c| c.strip_prefix('p'))
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0)
                    .min(all.len());
                let end = self
                    .cfg
                    .prompt_page_size
                    .map_or(all.len(), |size| (start + size).min(all.len()));
                let mut r = json!({"prompts": all[start..end]});
                if end < all.len() {
                    r["nextCursor"] = json!(format!("p{end}"));
                }
                self.reply(&ok(&id, r));
            }
            "prompts/get" if !self.cfg.prompts.is_empty() => {
                if msg["params"]["name"] != "hang" {
                    self.reply(&self.get_prompt(&id, &msg["params"]));
                }
            }
            "interceptors/list" if !self.cfg.interceptors.is_empty() => {
                let list: Vec<Value> = self
                    .cfg
                    .interceptors
                    .iter()
                    .map(FakeInterceptor::descriptor)
                    .collect();
                self.reply(&ok(&id, json!({"interceptors": list})));
            }
            "interceptor/invoke" if !self.cfg.interceptors.is_empty() => {
                self.invoke(&id, &msg["params"]);
            }
            "tools/call" => {
                let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
                if self.cfg.crash_after.is_some_and(|limit| n > limit) {
                    self.die();
                    return;
                }
                let this = self.clone();
                let params = msg["params"].clone();
                std::thread::spawn(move || this.call(&id, &params));
            }
            _ => {
                self.reply(&err(&id, -32601, &format!("method not found: {method}")));
            }
        }
    }

    /// `prompts/get` (MCP 2025-11-25 server/prompts), as the SDKs answer it: `-32602` for a
    /// prompt that is not listed or a required argument that is missing; `broken` fails with
    /// `-32603`.
    fn get_prompt(&self, id: &Value, params: &Value) -> Value {
        let name = params["name"].as_str().unwrap_or_default();
        let listed = self
            .cfg
            .prompt_list(self.later_prompt.load(Ordering::SeqCst));
        let Some(prompt) = listed.iter().find(|p| p["name"] == name) else {
            return err(id, -32602, &format!("Prompt {name} not found"));
        };
        let args = &params["arguments"];
        for a in prompt["arguments"].as_array().into_iter().flatten() {
            let arg = a["name"].as_str().unwrap_or_default();
            if a["required"] == true && args[arg].as_str().is_none() {
                return err(
                    id,
                    -32602,
                    &format!("Invalid arguments for prompt {name}: {arg} is required"),
                );
            }
        }
        if args
            .as_object()
            .into_iter()
            .flatten()
            .any(|(_, v)| !v.is_string())
        {
            return err(id, -32602, "Invalid arguments: values must be strings");
        }
        let text = |role: &str, text: String| json!({"role": role, "content": {"type": "text", "text": text}});
        let messages = match name {
            "review" => {
                let file = args["file"].as_str().unwrap_or_default();
                let mut t = format!("Please review {file}.");
                if let Some(focus) = args["focus"].as_str() {
                    t.push_str(&format!(" Focus on: {focus}."));
                }
                vec![text("user", t)]
            }
            "greet" => vec![text("user", "Say hello to the team.".into())],
            "media" => vec![
                text("user", "Describe this picture.".into()),
                json!({"role": "user", "content": {"type": "image", "mimeType": "image/png", "data": MEDIA_PNG}}),
                json!({"role": "user", "content": {"type": "resource", "resource":
                    {"uri": "file:///notes/plan.md", "mimeType": "text/markdown", "text": "# Plan\nship it"}}}),
                text("assistant", "I will describe it.".into()),
            ],
            "later" => vec![text("user", "A prompt added later.".into())],
            _ => return err(id, -32603, "prompt store unavailable"),
        };
        ok(
            id,
            json!({"description": prompt["description"], "messages": messages}),
        )
    }

    /// `interceptor/invoke` (SPEC X1), answered as the interceptor's behaviour says.
    fn invoke(&self, id: &Value, params: &Value) {
        let name = params["name"].as_str().unwrap_or_default();
        let phase = params["phase"].as_str().unwrap_or_default();
        let Some(i) = self.cfg.interceptors.iter().find(|i| i.name == name) else {
            self.reply(&err(id, -32602, &format!("Interceptor '{name}' not found")));
            return;
        };
        let base = json!({"interceptor": name, "type": i.kind, "phase": phase});
        let with = |mut v: Value, extra: Value| {
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            v
        };
        let result = match &i.behavior {
            InterceptBehavior::Allow if i.kind == "mutation" => with(
                base,
                json!({"modified": false, "payload": params["payload"]}),
            ),
            InterceptBehavior::Allow => with(base, json!({"valid": true})),
            InterceptBehavior::Deny(message) => with(
                base,
                json!({"valid": false, "severity": "error",
                       "messages": [{"message": message, "severity": "error"}]}),
            ),
            InterceptBehavior::Vague(message) => with(
                base,
                json!({"valid": false, "messages": [{"message": message, "severity": "warn"}]}),
            ),
            InterceptBehavior::Rewrite(payload) => {
                with(base, json!({"modified": true, "payload": payload}))
            }
            InterceptBehavior::Set(pairs) => {
                let mut payload = params["payload"].clone();
                if let Some(args) = payload["arguments"].as_object_mut() {
                    for (k, v) in pairs {
                        args.insert(k.clone(), v.clone());
                    }
                }
                with(base, json!({"modified": true, "payload": payload}))
            }
            InterceptBehavior::Error => {
                self.reply(&err(id, -32603, &format!("interceptor '{name}' failed")));
                return;
            }
            InterceptBehavior::Crash => {
                self.die();
                return;
            }
            InterceptBehavior::Hang => return,
        };
        self.reply(&ok(id, result));
    }

    fn call(&self, id: &Value, params: &Value) {
        let name = params["name"].as_str().unwrap_or_default();
        let args = &params["arguments"];
        let sleep = |ms: u64| std::thread::sleep(Duration::from_millis(ms));
        let reply = match name {
            n if self.cfg.stop && n == self.cfg.stop_name => {
                let n = self.stop_calls.fetch_add(1, Ordering::SeqCst) + 1;
                sleep(self.cfg.stop_delay_ms);
                let objects = self.cfg.stop_object_times.is_none_or(|times| n <= times);
                let text = if objects {
                    self.cfg.stop_text.as_str()
                } else {
                    ""
                };
                match self.cfg.stop_mode {
                    StopMode::Text => ok(id, text_result(text, false)),
                    StopMode::IsError => ok(id, text_result(text, true)),
                    StopMode::Error => err(id, -32000, "stop hook failed on purpose"),
                    StopMode::Hang => return,
                    StopMode::Surrogates => {
                        let line = format!(
                            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{SURROGATE_TEXT_RAW}\"}}]}}}}\n"
                        );
                        self.out.raw_bytes(line.as_bytes());
                        self.replied.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    StopMode::FastMcp if objects => ok(
                        id,
                        json!({"content": [{"type": "text", "text": text}],
                               "structuredContent": {"result": text}, "isError": false}),
                    ),
                    StopMode::FastMcp => ok(
                        id,
                        json!({"content": [], "structuredContent": {"result": null},
                               "isError": false}),
                    ),
                    StopMode::Late => {
                        let mut held = self.held_stop.lock().unwrap_or_else(|e| e.into_inner());
                        if n % 2 == 1 {
                            *held = Some(id.clone());
                            return;
                        }
                        if let Some(late) = held.take() {
                            self.reply(&ok(&late, text_result(&self.cfg.stop_text, false)));
                        }
                        ok(id, text_result("", false))
                    }
                }
            }
            "_PostCompact" if self.cfg.postcompact_text.is_some() => {
                sleep(self.cfg.postcompact_delay_ms);
                ok(
                    id,
                    text_result(self.cfg.postcompact_text.as_deref().unwrap_or(""), false),
                )
            }
            "_Other" if self.cfg.stop => ok(id, text_result("_Other must never be called", true)),
            "_SessionStart" | "_SessionEnd" => {
                let text = if name == "_SessionStart" {
                    &self.cfg.session_start_text
                } else {
                    &self.cfg.session_end_text
                };
                let (Some(text), Some(delay)) = (text, self.cfg.session_hook_delay_ms) else {
                    if text.is_none() {
                        self.reply(&err(id, -32602, &format!("unknown tool: {name}")));
                    }
                    return;
                };
                sleep(delay);
                ok(id, text_result(text, false))
            }
            "hostile" if self.cfg.hostile_text.is_some() => ok(
                id,
                text_result(self.cfg.hostile_text.as_deref().unwrap_or_default(), false),
            ),
            _ => {
                let known = self.cfg.tools.iter().any(|t| t == name)
                    || self.cfg.echo_names.iter().any(|t| t == name)
                    || (name == "late" && self.late.load(Ordering::SeqCst))
                    || name
                        .strip_prefix('t')
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| n < self.cfg.tool_count);
                if !known {
                    self.reply(&err(id, -32602, &format!("unknown tool: {name}")));
                    return;
                }
                if self.cfg.server_requests
                    && let Err(missing) = self.ask_client(&format!("call-{id}"), id)
                {
                    self.reply(&ok(
                        id,
                        text_result(&format!("server requests unanswered: {missing:?}"), true),
                    ));
                    return;
                }
                sleep(self.cfg.delay_ms);
                let text_arg = |k: &str| match &args[k] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                match name {
                    "add" => {
                        let (a, b) = (&args["a"], &args["b"]);
                        let sum = match (a.as_i64(), b.as_i64()) {
                            (Some(a), Some(b)) => (a + b).to_string(),
                            _ => {
                                (a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0)).to_string()
                            }
                        };
                        ok(id, text_result(&sum, false))
                    }
                    "slow" => {
                        let ms = args["ms"].as_u64().unwrap_or(1000);
                        sleep(ms);
                        ok(id, text_result(&format!("slept {ms} ms"), false))
                    }
                    "hang" => return,
                    "crash" => {
                        self.die();
                        return;
                    }
                    "big" => {
                        let bytes = args["bytes"].as_u64().unwrap_or(100_000) as usize;
                        let fill = args["fill"].as_str().unwrap_or("m");
                        ok(id, text_result(&big_text(bytes, fill), false))
                    }
                    "noisy" => {
                        let bytes = args["bytes"].as_u64().unwrap_or(300_000) as usize;
                        let wrote = noisy_stderr(&mut std::io::stderr().lock(), bytes);
                        ok(
                            id,
                            text_result(&format!("wrote {wrote} bytes to stderr"), false),
                        )
                    }
                    "flood" => {
                        let bytes = args["bytes"].as_u64().unwrap_or(100_000_000) as usize;
                        let wrote = flood_stderr(&mut std::io::stderr().lock(), bytes);
                        ok(id, text_result(&format!("flooded {wrote} bytes"), false))
                    }
                    "fail" => ok(id, text_result("boom", true)),
                    "latin1" => {
                        // C36: perfect JSON-RPC except for the bytes of the text.
                        let mut line = format!(
                            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\""
                        )
                        .into_bytes();
                        line.extend_from_slice(LATIN1_TEXT_RAW);
                        line.extend_from_slice(b"\"}]}}\n");
                        self.out.raw_bytes(&line);
                        self.replied.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    "unlock" => {
                        // C65: the list changes, the notification goes out, then the reply.
                        self.unlocked.store(true, Ordering::SeqCst);
                        self.out.send(
                            &json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
                            false,
                        );
                        ok(id, text_result("unlocked", false))
                    }
                    "old_tool" | "secret_number" => {
                        let listed =
                            self.unlocked.load(Ordering::SeqCst) == (name == "secret_number");
                        if listed {
                            let text = if name == "old_tool" { "old" } else { "42" };
                            ok(id, text_result(text, false))
                        } else {
                            err(id, -32602, &format!("unknown tool: {name}"))
                        }
                    }
                    "surrogates" => {
                        // C64: perfect JSON-RPC except for the lone surrogate escapes.
                        let line = format!(
                            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{SURROGATE_TEXT_RAW}\"}}]}}}}\n"
                        );
                        self.out.raw_bytes(line.as_bytes());
                        self.replied.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    "reject" => err(id, -32602, "Invalid arguments"),
                    "delete" => ok(
                        id,
                        text_result(&format!("deleted {}", text_arg("path")), false),
                    ),
                    "media" => ok(
                        id,
                        json!({"content": [
                            {"type": "text", "text": MEDIA_TEXT},
                            {"type": "image", "mimeType": "image/png", "data": MEDIA_PNG},
                            {"type": "text", "text": MEDIA_USER_ONLY, "annotations": {"audience": ["user"]}},
                            {"type": "text", "text": MEDIA_MODEL_ONLY, "annotations": {"audience": ["assistant"]}}
                        ]}),
                    ),
                    "progress" => {
                        let steps = args["steps"].as_u64().unwrap_or(3);
                        let token = params["_meta"]["progressToken"].clone();
                        for i in 1..=steps {
                            if !token.is_null() {
                                self.out.send(
                                    &json!({"jsonrpc": "2.0", "method": "notifications/progress",
                                            "params": {"progressToken": token, "progress": i,
                                                       "total": steps, "message": format!("step {i}")}}),
                                    false,
                                );
                            }
                            sleep(100);
                        }
                        ok(id, text_result("done", false))
                    }
                    "shell" => ok(
                        id,
                        text_result(&format!("ran: {}", text_arg("command")), false),
                    ),
                    other if odd_schema(other).is_some() => {
                        ok(id, text_result(&format!("{other} {args}"), false))
                    }
                    _ => ok(id, text_result(&text_arg("text"), false)),
                }
            }
        };
        self.reply(&reply);
        if !name.starts_with('_') {
            let n = self.replied.fetch_add(1, Ordering::SeqCst) + 1;
            if self.cfg.list_changed_after_call == Some(n) {
                self.late.store(true, Ordering::SeqCst);
                self.out.send(
                    &json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
                    false,
                );
            }
            if self.cfg.prompts_changed_after_call == Some(n) {
                self.later_prompt.store(true, Ordering::SeqCst);
                self.out.send(
                    &json!({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"}),
                    false,
                );
            }
        }
    }
}

/// A running fake server: the protocol over any carrier (stdio lines, or HTTP bodies in
/// [`crate::fake_mcp_http`]). Everything it sends goes to the [`Out`] it was started with.
#[derive(Clone)]
pub struct Handle(Arc<Server>);

impl Handle {
    /// Handles one received JSON-RPC message (its text, one line); replies go to the `Out`,
    /// possibly from another thread later (`tools/call`).
    pub fn handle_line(&self, line: &str) {
        self.0.handle_line(line);
    }
}

/// Starts the server logic on `out` (the call log opened, the garbage banner written).
pub fn start(cfg: Config, out: Out, exit: Exit) -> Handle {
    let log = cfg.call_log.as_ref().and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
            .map(Mutex::new)
    });
    if cfg.garbage {
        out.raw(&format!(
            "{GARBAGE_BANNER}\n\n[db] connected to /var/lib/fake.db\n"
        ));
    }
    Handle(Arc::new(Server {
        cfg,
        out,
        log,
        calls: AtomicU64::new(0),
        stop_calls: AtomicU64::new(0),
        exit,
        replied: AtomicU64::new(0),
        late: std::sync::atomic::AtomicBool::new(false),
        later_prompt: std::sync::atomic::AtomicBool::new(false),
        unlocked: std::sync::atomic::AtomicBool::new(false),
        init_id: Mutex::new(None),
        answers: Mutex::new(Vec::new()),
        answered: Condvar::new(),
        held_stop: Mutex::new(None),
    }))
}

/// Runs the protocol on `input`/`out` until `input` ends. Start-up effects that touch the
/// process (pid files, signals, env dump) are in [`main`].
pub fn serve(cfg: Config, input: impl BufRead, out: Out, exit: Exit) {
    let server = start(cfg, out, exit);
    for line in input.split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches('\r').trim_start_matches('\u{feff}');
        if line.trim().is_empty() {
            continue;
        }
        server.handle_line(line);
    }
}

fn write_file(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("fake-mcp: cannot write {}: {e}", path.display());
    }
}

/// `FAKE_MCP_PARENT_ENVIRON`: what this process can read of its parent's (the agent's)
/// `/proc/<ppid>/environ` once its effective capability set is empty (an ordinary process of
/// the agent's user; as root, `CAP_SYS_PTRACE` and the DAC overrides would read anything), as
/// JSON `{"ok": true, "environ": <text>}` or `{"ok": false, "error": <why>}`.
fn parent_environ() -> Value {
    /// `_LINUX_CAPABILITY_VERSION_3` and the kernel's `struct __user_cap_header_struct` /
    /// `__user_cap_data_struct` (two of them for 64 capability bits).
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a valid header and two data structs, as the kernel expects
    // for version 3; they only read and write those.
    let dropped = unsafe {
        libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) == 0 && {
            data[0].effective = 0;
            data[1].effective = 0;
            libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) == 0
        }
    };
    if !dropped {
        return json!({"ok": false, "error": format!("cannot drop the capabilities: {}", std::io::Error::last_os_error())});
    }
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    match std::fs::read(format!("/proc/{ppid}/environ")) {
        Ok(bytes) => json!({"ok": true, "environ": String::from_utf8_lossy(&bytes)}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    }
}

/// The fake MCP server process: start-up effects, then [`serve`] on stdin/stdout, then exit.
pub fn main() -> ! {
    let cfg = Config::from_lookup(|k| std::env::var(k).ok());
    if cfg.fail_start {
        eprintln!("{FAIL_START_STDERR}");
        std::process::exit(3);
    }
    if cfg.ignore_term {
        // SAFETY: installing SIG_IGN for SIGTERM has no preconditions.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    if let Some(p) = &cfg.env_dump {
        let env: serde_json::Map<String, Value> = std::env::vars_os()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), json!(v.to_string_lossy())))
            .collect();
        write_file(p, &Value::Object(env).to_string());
    }
    if let Some(p) = &cfg.parent_environ {
        write_file(p, &parent_environ().to_string());
    }
    if let Some(p) = &cfg.cwd_file {
        let cwd = std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        write_file(p, &cwd);
    }
    for i in 0..cfg.stderr_lines {
        eprintln!("stderr line {i}");
    }
    if let Some(text) = &cfg.hostile_text {
        eprintln!("{text}");
    }
    if let Some(p) = &cfg.grandchild_pidfile {
        let mut sleep = std::process::Command::new("sleep");
        sleep
            .arg("1000")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        if cfg.grandchild_setsid {
            use std::os::unix::process::CommandExt;
            // SAFETY: setsid(2) is async-signal-safe; the child calls nothing else before exec.
            unsafe {
                sleep.pre_exec(|| {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        match sleep.spawn() {
            Ok(child) => write_file(p, &format!("{} {}\n", std::process::id(), child.id())),
            Err(e) => eprintln!("fake-mcp: cannot spawn grandchild: {e}"),
        }
    }
    let ignore_term = cfg.ignore_term;
    let out = Out::new(Box::new(std::io::stdout()));
    let exit: Exit = Arc::new(|code| std::process::exit(code));
    serve(cfg, std::io::stdin().lock(), out, exit);
    if ignore_term {
        // A stubborn server: stdin EOF does not end it either; only SIGKILL does.
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    std::process::exit(0)
}

/// Reads a `FAKE_MCP_CALL_LOG` file: every message the server received, in order (lines that
/// are not JSON are skipped).
pub fn read_call_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `tools/call` requests in a call log, in order.
pub fn logged_tool_calls(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|m| m["method"] == "tools/call")
        .cloned()
        .collect()
}

/// How many `tools/call` requests named `name` the log holds.
pub fn count_calls(log: &[Value], name: &str) -> usize {
    logged_tool_calls(log)
        .iter()
        .filter(|m| m["params"]["name"] == name)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;
    use std::os::unix::net::UnixStream;

    /// A fake server on an in-memory socket pair, driven by the test through `client`.
    struct Wire {
        client: BufReader<UnixStream>,
        writer: UnixStream,
    }

    impl Wire {
        fn start(vars: &[(&str, &str)]) -> Wire {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let cfg =
                Config::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
            let (ours, theirs) = UnixStream::pair().unwrap();
            let input = BufReader::new(theirs.try_clone().unwrap());
            let out = Out::new(Box::new(theirs));
            let exit: Exit = Arc::new(|code| panic!("fake server exit {code}"));
            std::thread::spawn(move || serve(cfg, input, out, exit));
            ours.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            Wire {
                client: BufReader::new(ours.try_clone().unwrap()),
                writer: ours,
            }
        }

        fn send(&mut self, msg: Value) {
            writeln!(self.writer, "{msg}").unwrap();
        }

        fn line(&mut self) -> String {
            let mut l = String::new();
            self.client.read_line(&mut l).unwrap();
            l.trim_end().to_string()
        }

        /// The next JSON message, skipping non-JSON lines.
        fn recv(&mut self) -> Value {
            loop {
                let l = self.line();
                if let Ok(v) = serde_json::from_str(&l) {
                    return v;
                }
            }
        }

        fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
            self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
            let r = self.recv();
            assert_eq!(r["id"], id, "{r}");
            r
        }

        fn call(&mut self, id: i64, name: &str, args: Value) -> Value {
            self.request(id, "tools/call", json!({"name": name, "arguments": args}))
        }

        /// Asserts that nothing arrives for 300 ms (`what` names what must not answer), then
        /// restores the 5 s read timeout.
        fn assert_silent(&mut self, what: &str) {
            let timeout = |w: &Wire, d| w.client.get_ref().set_read_timeout(Some(d)).unwrap();
            timeout(self, Duration::from_millis(300));
            let mut l = String::new();
            let silent = self.client.read_line(&mut l).is_err();
            timeout(self, Duration::from_secs(5));
            assert!(silent, "{what}: {l}");
        }

        fn handshake(&mut self) -> Value {
            let r = self.request(
                0,
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}),
            );
            self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
            r
        }
    }

    fn names(list: &Value) -> Vec<String> {
        list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn handshake_list_and_catalogue_tools_answer() {
        let mut w = Wire::start(&[("FAKE_MCP_TOOLS", "echo,add,fail,reject,shell,big")]);
        let init = w.handshake();
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
        assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true);
        let list = w.request(1, "tools/list", json!({}));
        assert_eq!(
            names(&list),
            ["echo", "add", "fail", "reject", "shell", "big"]
        );
        assert!(list["result"].get("nextCursor").is_none());
        let r = w.call(2, "echo", json!({"text": "hi"}));
        assert_eq!(r["result"], text_result("hi", false));
        let r = w.call(3, "add", json!({"a": 2, "b": 40}));
        assert_eq!(r["result"]["content"][0]["text"], "42");
        let r = w.call(4, "fail", json!({}));
        assert_eq!(r["result"], text_result("boom", true));
        let r = w.call(5, "reject", json!({}));
        assert_eq!(r["error"]["code"], -32602);
        assert_eq!(r["error"]["message"], "Invalid arguments");
        let r = w.call(6, "shell", json!({"command": "buzz messages send hi"}));
        assert_eq!(
            r["result"]["content"][0]["text"],
            "ran: buzz messages send hi"
        );
        let r = w.call(7, "big", json!({"bytes": 50}));
        let t = r["result"]["content"][0]["text"].as_str().unwrap();
        assert_eq!(t.len(), 50);
        assert!(t.starts_with("BEGIN-") && t.ends_with("-END"));
        let r = w.call(8, "nope", json!({}));
        assert_eq!(r["error"]["code"], -32602);
        let r = w.request(9, "resources/list", json!({}));
        assert_eq!(r["error"]["code"], -32601);
        let r = w.request(10, "ping", json!({}));
        assert_eq!(r["result"], json!({}));
    }

    #[test]
    fn pagination_follows_cursors_and_version_override_applies() {
        let mut w = Wire::start(&[
            ("FAKE_MCP_TOOL_COUNT", "5"),
            ("FAKE_MCP_PAGE_SIZE", "2"),
            ("FAKE_MCP_PROTOCOL_VERSION", "2024-11-05"),
        ]);
        assert_eq!(w.handshake()["result"]["protocolVersion"], "2024-11-05");
        let mut all = Vec::new();
        let mut cursor = Value::Null;
        for id in 1..10 {
            let params = if cursor.is_null() {
                json!({})
            } else {
                json!({"cursor": cursor})
            };
            let page = w.request(id, "tools/list", params);
            all.extend(names(&page));
            cursor = page["result"]["nextCursor"].clone();
            if cursor.is_null() {
                break;
            }
        }
        assert_eq!(all, ["echo", "t0", "t1", "t2", "t3", "t4"]);
        let r = w.call(20, "t3", json!({"text": "via t3"}));
        assert_eq!(r["result"]["content"][0]["text"], "via t3");
    }

    #[test]
    fn stop_hook_objects_n_times_then_answers_empty_and_hidden_tools_are_listed() {
        let mut w = Wire::start(&[
            ("FAKE_MCP_STOP", "1"),
            ("FAKE_MCP_STOP_OBJECT_TIMES", "2"),
            ("FAKE_MCP_STOP_TEXT", "fix it"),
            ("FAKE_MCP_POSTCOMPACT_TEXT", "todo: a, b"),
        ]);
        w.handshake();
        let list = w.request(1, "tools/list", json!({}));
        assert_eq!(names(&list), ["echo", "_Stop", "_Other", "_PostCompact"]);
        let texts: Vec<Value> = (2..5)
            .map(|id| w.call(id, "_Stop", json!({}))["result"]["content"][0]["text"].clone())
            .collect();
        assert_eq!(texts, [json!("fix it"), json!("fix it"), json!("")]);
        let r = w.call(5, "_PostCompact", json!({}));
        assert_eq!(r["result"], text_result("todo: a, b", false));
    }

    #[test]
    fn stop_modes_error_and_iserror() {
        let mut w = Wire::start(&[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_MODE", "error")]);
        w.handshake();
        assert_eq!(w.call(1, "_Stop", json!({}))["error"]["code"], -32000);
        let mut w = Wire::start(&[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_MODE", "iserror")]);
        w.handshake();
        let r = w.call(1, "_Stop", json!({}));
        assert_eq!(r["result"], text_result("tests are still red", true));
    }

    #[test]
    fn calls_run_concurrently_and_hang_never_answers() {
        let mut w = Wire::start(&[("FAKE_MCP_TOOLS", "slow,hang,echo")]);
        w.handshake();
        let started = std::time::Instant::now();
        for id in 1..=3 {
            w.send(json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                          "params":{"name":"slow","arguments":{"ms":300}}}));
        }
        w.send(json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"hang","arguments":{}}}));
        w.send(json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"fast"}}}));
        let first = w.recv();
        assert_eq!(first["id"], 5, "echo overtakes the slow calls");
        let mut ids: Vec<i64> = (0..3).map(|_| w.recv()["id"].as_i64().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, [1, 2, 3]);
        assert!(
            started.elapsed() < Duration::from_millis(800),
            "{:?}",
            started.elapsed()
        );
        w.assert_silent("hang must not answer");
    }

    #[test]
    fn garbage_mode_prints_banners_and_call_log_records_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls.log");
        let mut w = Wire::start(&[
            ("FAKE_MCP_GARBAGE", "1"),
            ("FAKE_MCP_CALL_LOG", log.to_str().unwrap()),
        ]);
        assert_eq!(w.line(), GARBAGE_BANNER);
        w.handshake();
        w.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}));
        // handshake's garbage line, then the reply, then garbage again
        let mut lines = Vec::new();
        while lines.len() < 3 {
            let l = w.line();
            if !l.is_empty() && !l.starts_with("[db]") {
                lines.push(l);
            }
        }
        assert_eq!(lines[0], GARBAGE_AFTER_REPLY);
        assert_eq!(serde_json::from_str::<Value>(&lines[1]).unwrap()["id"], 1);
        assert_eq!(lines[2], GARBAGE_AFTER_REPLY);
        w.send(
            json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}),
        );
        w.request(2, "ping", json!({}));
        let logged = read_call_log(&log);
        let methods: Vec<&str> = logged
            .iter()
            .map(|m| m["method"].as_str().unwrap())
            .collect();
        assert_eq!(
            methods,
            [
                "initialize",
                "notifications/initialized",
                "tools/call",
                "notifications/cancelled",
                "ping"
            ]
        );
        assert_eq!(count_calls(&logged, "echo"), 1);
    }

    #[test]
    fn list_changed_after_call_adds_late_and_notifies() {
        let mut w = Wire::start(&[("FAKE_MCP_LIST_CHANGED_AFTER_CALL", "1")]);
        w.handshake();
        assert_eq!(names(&w.request(1, "tools/list", json!({}))), ["echo"]);
        assert_eq!(
            w.call(2, "late", json!({"text": "x"}))["error"]["code"],
            -32602
        );
        w.call(3, "echo", json!({"text": "x"}));
        assert_eq!(w.recv()["method"], "notifications/tools/list_changed");
        assert_eq!(
            names(&w.request(4, "tools/list", json!({}))),
            ["echo", "late"]
        );
        let r = w.call(5, "late", json!({"text": "now"}));
        assert_eq!(r["result"]["content"][0]["text"], "now");
    }

    #[test]
    fn server_requests_after_initialized_and_during_each_call() {
        let mut w = Wire::start(&[("FAKE_MCP_SERVER_REQUESTS", "1")]);
        w.handshake();
        let ids = |w: &mut Wire| -> Vec<Value> { (0..4).map(|_| w.recv()["id"].clone()).collect() };
        assert_eq!(
            ids(&mut w),
            [json!("init-1"), json!("init-2"), json!(0), json!("init-4")]
        );
        w.send(json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}));
        let reqs: Vec<Value> = (0..4).map(|_| w.recv()).collect();
        let methods: Vec<&str> = reqs.iter().map(|r| r["method"].as_str().unwrap()).collect();
        assert_eq!(
            methods,
            [
                "ping",
                "roots/list",
                "sampling/createMessage",
                "elicitation/create"
            ]
        );
        let req_ids: Vec<Value> = reqs.iter().map(|r| r["id"].clone()).collect();
        // The third collides with the pending call's own id.
        assert_eq!(
            req_ids,
            [
                json!("call-5-1"),
                json!("call-5-2"),
                json!(5),
                json!("call-5-4")
            ]
        );
        // The numeric id answered as a string does not count: still waiting after three.
        for id in [json!("call-5-1"), json!("call-5-2"), json!("5")] {
            w.send(json!({"jsonrpc":"2.0","id":id,"error":{"code":-32601,"message":"no"}}));
        }
        w.assert_silent("replied too early");
        w.send(json!({"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"no"}}));
        w.send(json!({"jsonrpc":"2.0","id":"call-5-4","error":{"code":-32601,"message":"no"}}));
        let r = w.recv();
        assert_eq!(r["id"], 5);
        assert_eq!(r["result"], text_result("hi", false));
    }

    #[test]
    fn late_stop_mode_answers_the_held_call_just_before_the_next() {
        let mut w = Wire::start(&[("FAKE_MCP_STOP", "1"), ("FAKE_MCP_STOP_MODE", "late")]);
        w.handshake();
        w.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"_Stop","arguments":{}}}));
        w.assert_silent("held call answered");
        w.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"_Stop","arguments":{}}}));
        let late = w.recv();
        assert_eq!(late["id"], 1);
        assert_eq!(late["result"], text_result("tests are still red", false));
        let now = w.recv();
        assert_eq!(now["id"], 2);
        assert_eq!(now["result"], text_result("", false));
    }

    #[test]
    fn no_init_reply_leaves_initialize_unanswered() {
        let mut w = Wire::start(&[("FAKE_MCP_NO_INIT_REPLY", "1")]);
        w.send(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}));
        let r = w.request(1, "ping", json!({}));
        assert_eq!(r["result"], json!({}));
    }

    #[test]
    fn big_text_has_exact_length_and_markers() {
        for n in [10, 11, 1000, 10_000] {
            let t = big_text(n, "m");
            assert_eq!(t.len(), n);
            assert!(t.starts_with("BEGIN-") && t.ends_with("-END"));
        }
        let t = big_text(1003, "é");
        assert!(t.len() == 1003 && t.contains("éé"));
    }

    #[test]
    fn noisy_writes_whole_lines_of_fixed_length() {
        let mut out = Vec::new();
        let wrote = noisy_stderr(&mut out, 1_050);
        assert_eq!(wrote, out.len());
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        assert_eq!(lines.len(), 11, "rounded up to whole lines");
        assert!(
            lines
                .iter()
                .all(|l| l.len() == NOISY_LINE_BYTES && l.ends_with('\n'))
        );
        assert!(lines[10].starts_with("noisy line 10 ."));
    }

    #[test]
    fn flood_writes_one_endless_line_then_the_done_line() {
        let mut out = Vec::new();
        assert_eq!(flood_stderr(&mut out, 200_000), 200_000);
        assert_eq!(out.len(), 200_000 + 1 + FLOOD_DONE.len() + 1);
        assert!(out[..200_000].iter().all(|&b| b == b'x'));
        assert_eq!(&out[200_000..], format!("\n{FLOOD_DONE}\n").as_bytes());
    }
}
