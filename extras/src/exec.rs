//! `buzz-agent exec [--cwd DIR] [--mcp-config FILE]… [--approve reads|all|none] [--] <prompt>`
//! (issue 12): runs one prompt from a terminal. It starts this very binary as the ACP agent
//! child (with the environment it was given, so the same LLM settings), opens one session in
//! `DIR` with the MCP servers of `FILE`, sends the prompt, and prints the turn as it streams:
//! the model's text on stdout; tool calls, permission answers and the stop reason on stderr,
//! each as one `[tool] …` / `[permission] …` / `[stop] …` line. Permission requests are
//! answered by `--approve`. The choices are written in `docs/exec.md`.
//!
//! Exit status: 0 when the turn ends `end_turn`; 1 when it fails (the prompt's JSON-RPC error,
//! such as an `llm:` error; `session/new` refused, e.g. an MCP server that did not start; the
//! agent exited or broke the protocol); 2 on a usage error, an unreadable or invalid
//! `--mcp-config`, or the agent's own configuration error (printed by the agent); 3 when the
//! turn ends with another stop reason (`max_tokens`, `max_turn_requests`, `refusal`,
//! `cancelled`).

use crate::acp_client::{AcpChild, ClientError};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Exit status: the turn ended `end_turn`.
const EXIT_OK: i32 = 0;
/// Exit status: the prompt, the session or the agent failed.
const EXIT_FAILED: i32 = 1;
/// Exit status: usage, `--mcp-config` or configuration error.
const EXIT_USAGE: i32 = 2;
/// Exit status: the turn ended with a stop reason other than `end_turn`.
const EXIT_STOPPED: i32 = 3;
/// How long the agent may take to exit after stdin EOF (it stops its MCP servers, SPEC P1).
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// Longest tool input or output shown on a `[tool]` line, characters.
const SHOWN_CHARS: usize = 160;

/// The usage text of `exec`.
#[must_use]
pub fn usage(bin: &str) -> String {
    format!(
        "usage: {bin} exec [--cwd DIR] [--mcp-config FILE]… [--approve reads|all|none] [--] <prompt>\n\n\
         Runs one prompt: starts {bin} as an ACP agent child (same environment, so the same LLM\n\
         settings), opens a session in DIR (default: the current directory) with the MCP servers\n\
         of FILE, sends the prompt (`-` reads it from stdin) and prints the turn: the model's text\n\
         on stdout; tool calls, permission answers and the stop reason on stderr.\n\n\
         --mcp-config FILE  {{\"mcpServers\": {{\"<name>\": {{\"command\": …, \"args\": […], \"env\": {{…}}}}}}}}\n\
                            (the format of Claude Code, Cursor and acpx; ${{VAR}} and ${{VAR:-default}}\n\
                            are expanded; {{\"url\": …, \"headers\": {{…}}}} is a remote server,\n\
                            \"type\": \"http\" or \"sse\"); repeatable\n\
         --approve reads    allow tool calls of kind `read`, deny the rest (the default)\n\
         --approve all      allow every tool call\n\
         --approve none     deny every tool call\n\n\
         exit status: 0 end_turn; 1 the prompt or the session failed (an LLM error, an MCP server\n\
         that did not start, the agent exited); 2 usage, --mcp-config or configuration error;\n\
         3 the turn ended otherwise (max_tokens, max_turn_requests, refusal, cancelled)."
    )
}

/// How `--approve` answers `session/request_permission`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approve {
    /// Allow tool calls whose `kind` is `read`, deny the rest (the default).
    Reads,
    /// Allow every tool call.
    All,
    /// Deny every tool call.
    None,
}

impl Approve {
    fn name(self) -> &'static str {
        match self {
            Approve::Reads => "reads",
            Approve::All => "all",
            Approve::None => "none",
        }
    }

    /// Whether a tool call of `kind` is allowed; `registered`: the request names (in its
    /// `_meta`) a server this command started. `reads` allows only a `read` of such a server
    /// (SPEC S3: the kind comes from the server's own annotations, so only the identity the
    /// agent vouches for makes it one of ours).
    fn allows(self, kind: &str, registered: bool) -> bool {
        match self {
            Approve::Reads => kind == "read" && registered,
            Approve::All => true,
            Approve::None => false,
        }
    }
}

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    cwd: Option<PathBuf>,
    mcp_configs: Vec<PathBuf>,
    approve: Approve,
    /// The prompt words joined by spaces; `-` = read stdin.
    prompt: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Help,
    Run(Options),
}

fn parse_args(args: &[String]) -> Result<Parsed, String> {
    let mut opts = Options {
        cwd: None,
        mcp_configs: Vec::new(),
        approve: Approve::Reads,
        prompt: String::new(),
    };
    let mut words: Vec<&str> = Vec::new();
    let mut it = args.iter().map(String::as_str);
    while let Some(arg) = it.next() {
        if arg == "--" {
            words.extend(it.by_ref());
            break;
        }
        if arg == "--help" || arg == "-h" {
            return Ok(Parsed::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (arg, None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline {
                Some(v) => Ok(v.to_string()),
                None => it
                    .next()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match flag {
            "--cwd" => opts.cwd = Some(PathBuf::from(value("--cwd")?)),
            "--mcp-config" => opts.mcp_configs.push(PathBuf::from(value("--mcp-config")?)),
            "--approve" => {
                opts.approve = match value("--approve")?.as_str() {
                    "reads" => Approve::Reads,
                    "all" => Approve::All,
                    "none" => Approve::None,
                    other => {
                        return Err(format!("--approve {other:?}: expected reads, all or none"));
                    }
                }
            }
            f if f.starts_with("--") => return Err(format!("unknown option {f}")),
            word => words.push(word),
        }
    }
    opts.prompt = words.join(" ");
    if opts.prompt.trim().is_empty() {
        return Err("no prompt given".into());
    }
    Ok(Parsed::Run(opts))
}

/// Expands `${VAR}` and `${VAR:-default}` in `s` as Claude Code does in `.mcp.json`; a `$` not
/// followed by `{` is kept.
///
/// # Errors
/// A `${VAR}` whose variable is unset (and has no default), or an unclosed `${`.
fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (lookup(name).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(format!(
                    "${{{name}}} is used but {name} is not set (use ${{{name}:-default}} for a default)"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A JSON scalar as a string (configs write `"PORT": 8080`); `None` for objects and arrays.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// An `env` or `headers` field (`field`) as ACP `[{name, value}]` pairs, each value expanded
/// by `expand` (`${VAR}`): missing or `null` is empty; an object map (`{"PORT": 8080}`: scalars become
/// strings) or an array of `{name, value}` is accepted.
///
/// # Errors
/// The field of another type, a value that is an object or array, or an unset `${VAR}`.
fn name_values(
    value: Option<&Value>,
    field: &str,
    expand: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Vec<Value>, String> {
    let mut pairs = Vec::new();
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let v =
                    scalar_text(v).ok_or_else(|| format!("{field} {k:?} is an object or array"))?;
                pairs.push(json!({"name": k, "value": expand(&v)?}));
            }
        }
        Some(Value::Array(list)) => {
            for p in list {
                let (Some(k), Some(v)) = (
                    p.get("name").and_then(Value::as_str),
                    p.get("value").and_then(scalar_text),
                ) else {
                    return Err(format!("\"{field}\" array entries must be {{name, value}}"));
                };
                pairs.push(json!({"name": k, "value": expand(&v)?}));
            }
        }
        Some(_) => return Err(format!("\"{field}\" must be an object")),
    }
    Ok(pairs)
}

/// The ACP `mcpServers` entries (`{name, command, args, env:[{name,value}]}`, and
/// `{type: "http" | "sse", name, url, headers:[{name,value}]}` for remote servers, SPEC M10) of
/// one config file's text in the de facto format of Claude Code, Cursor and acpx: an object
/// `{"mcpServers": {"<name>": {"command", "args", "env"}}}` (`"servers"`, VS Code's key, is
/// accepted too), or acpx's `{"mcpServers": [{"name", "command", "args", "env"}]}`. Lenient
/// like those tools: `args` and `env` may be missing; `env` may also be an array of
/// `{name, value}`; numbers and booleans in `args`/`env` become strings; `command` may be an
/// array (its first word is the command, the rest leads the args); `"type": "stdio"` is
/// accepted; `"disabled": true` skips the entry; a remote server is `"type": "http"` (also
/// spelled `streamable-http`), `"sse"` (the legacy HTTP+SSE transport), or a `url` without
/// `command` and `type` (`http`), with `headers` read like `env`; `${VAR}` and
/// `${VAR:-default}` are expanded in `command`, `args`, `env`, `url` and `headers`; other
/// fields are ignored. Returns the entries and the warnings (one line each): a server of
/// another transport (`"type": "ws"`) is skipped with a warning.
///
/// # Errors
/// One line: not JSON, no server object, an entry without a usable `command` (or `url`: absolute
/// `http://` or `https://`), a bad `args`, `env` or `headers`, an unset `${VAR}`.
fn servers_from_config(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<Value>, Vec<String>), String> {
    let root: Value = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .map_err(|e| format!("not JSON: {e}"))?;
    let servers = root
        .get("mcpServers")
        .or_else(|| root.get("servers"))
        .ok_or("no \"mcpServers\" object")?;
    let named: Vec<(String, &Value)> = match servers {
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
        // acpx's form: ACP entries that carry their own name.
        Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(i, v)| match v.get("name").and_then(Value::as_str) {
                Some(n) if !n.is_empty() => Ok((n.to_string(), v)),
                _ => Err(format!("\"mcpServers\"[{i}] has no \"name\"")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("\"mcpServers\" is not an object".into()),
    };
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for (name, entry) in &named {
        let at = |what: &str| format!("server {name:?}: {what}");
        let entry = entry.as_object().ok_or_else(|| at("not an object"))?;
        if entry.get("disabled").and_then(Value::as_bool) == Some(true) {
            warnings.push(at("\"disabled\": true, skipped"));
            continue;
        }
        let remote = entry.contains_key("url") && !entry.contains_key("command");
        let kind = match entry.get("type").and_then(Value::as_str) {
            Some(t) => t.to_ascii_lowercase(),
            None if remote => "http".into(),
            None => "stdio".into(),
        };
        let expand_plain = |s: &str| expand(s, lookup);
        let expand_at = |s: &str| expand_plain(s).map_err(|e| at(&e));
        let acp_type = match kind.as_str() {
            "http" | "streamable-http" | "streamablehttp" => Some("http"),
            "sse" => Some("sse"),
            _ => None,
        };
        if let Some(acp_type) = acp_type {
            let url = match entry.get("url") {
                Some(Value::String(u)) => expand_at(u)?,
                Some(_) => return Err(at("\"url\" must be a string")),
                None => return Err(at("no \"url\"")),
            };
            let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https")) {
                return Err(at("\"url\" must be an absolute http:// or https:// URL"));
            }
            let headers =
                name_values(entry.get("headers"), "headers", &expand_plain).map_err(|e| at(&e))?;
            out.push(json!({"type": acp_type, "name": name, "url": url, "headers": headers}));
            continue;
        }
        if kind != "stdio" || remote {
            let transport = if kind == "stdio" { "url" } else { &kind };
            warnings.push(at(&format!(
                "skipped: transport {transport:?} is not supported (buzz-agent runs stdio, http and sse MCP servers)"
            )));
            continue;
        }
        let mut words: Vec<String> = match entry.get("command") {
            Some(Value::String(c)) if !c.trim().is_empty() => vec![expand_at(c)?],
            Some(Value::Array(parts)) if !parts.is_empty() => parts
                .iter()
                .map(|p| {
                    scalar_text(p)
                        .ok_or_else(|| at("\"command\" array holds a non-string"))
                        .and_then(|s| expand_at(&s))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(at("\"command\" must be a non-empty string")),
            None => return Err(at("no \"command\"")),
        };
        let command = words.remove(0);
        match entry.get("args") {
            None | Some(Value::Null) => {}
            Some(Value::Array(args)) => {
                for a in args {
                    let a =
                        scalar_text(a).ok_or_else(|| at("\"args\" holds an object or array"))?;
                    words.push(expand_at(&a)?);
                }
            }
            Some(_) => return Err(at("\"args\" must be an array of strings")),
        }
        let env = name_values(entry.get("env"), "env", &expand_plain).map_err(|e| at(&e))?;
        out.push(json!({"name": name, "command": command, "args": words, "env": env}));
    }
    Ok((out, warnings))
}

/// Writes the turn as it streams: the model's text on stdout, everything else as whole lines on
/// stderr. When stdout is mid-line, a newline goes there first, so that on a terminal (both
/// streams on one screen) a progress line never lands inside a sentence.
struct Printer {
    mid_line: bool,
    /// `end_line` wrote a newline the model's text did not.
    ended_line: bool,
    titles: HashMap<String, String>,
    approve: Approve,
    /// The names of the MCP servers this command registered (`--mcp-config`).
    servers: Vec<String>,
}

impl Printer {
    fn text(&mut self, t: &str) {
        // A line this printer ended for a report already gave one of the paragraph break's
        // newlines.
        let t = if std::mem::take(&mut self.ended_line) {
            t.strip_prefix('\n').unwrap_or(t)
        } else {
            t
        };
        if t.is_empty() {
            return;
        }
        // The model's text keeps its line breaks and tabs; no other control character (an
        // ANSI or OSC sequence, a carriage return) reaches the terminal raw (SPEC S6).
        let t = buzz_agent_core::text::escape_controls(t, &['\n', '\t']);
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(t.as_bytes()).and_then(|()| out.flush());
        self.mid_line = !t.ends_with('\n');
    }

    fn end_line(&mut self) {
        if self.mid_line {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(b"\n").and_then(|()| out.flush());
            self.mid_line = false;
            self.ended_line = true;
        }
    }

    /// One report line on stderr. Tool titles, inputs, results and notices are peers' text:
    /// every control character in it is written as a visible escape, so the line stays one
    /// line and the terminal obeys none of it (SPEC S6).
    fn info(&mut self, line: &str) {
        self.end_line();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{}", buzz_agent_core::text::escape_controls(line, &[]));
    }

    fn title(&self, u: &Value) -> String {
        let id = u["toolCallId"].as_str().unwrap_or_default();
        u["title"]
            .as_str()
            .map(str::to_string)
            .or_else(|| self.titles.get(id).cloned())
            .unwrap_or_else(|| id.to_string())
    }

    /// One message from the agent while the prompt runs; the answer to a request.
    fn on_message(&mut self, msg: &Value) -> Option<Value> {
        match msg["method"].as_str() {
            Some("session/update") => {
                self.on_update(&msg["params"]["update"]);
                None
            }
            Some("session/request_permission") => Some(self.on_permission(&msg["params"])),
            _ => None,
        }
    }

    fn on_update(&mut self, u: &Value) {
        match u["sessionUpdate"].as_str() {
            Some("agent_message_chunk") => {
                let Some(t) = u["content"]["text"].as_str() else {
                    return;
                };
                // The agent's own notices (`_meta.buzz.notice`, docs/MCP_DRIVEN_HOOKS.md) go to
                // stderr like the other reports: `[hook] …` when a hook made the turn go on,
                // `[notice] …` otherwise; the model's answer stays alone on stdout.
                match u["_meta"]["buzz"]["notice"].as_str() {
                    Some(kind) => self.notice(kind, t),
                    None => self.text(t),
                }
            }
            // The same notice for a client that advertised `session.notices`.
            Some("notice") => {
                let kind = u["_meta"]["buzz"]["notice"].as_str().unwrap_or("");
                self.notice(kind, u["title"].as_str().unwrap_or(""));
            }
            Some("tool_call") => {
                let id = u["toolCallId"].as_str().unwrap_or_default().to_string();
                let title = u["title"].as_str().unwrap_or(&id).to_string();
                self.titles.insert(id, title.clone());
                let kind = u["kind"].as_str().unwrap_or("other");
                let input = shown(&u["rawInput"].to_string(), SHOWN_CHARS);
                self.info(&format!("[tool] {title} ({kind}) {input}"));
            }
            Some("tool_call_update") => {
                let status = u["status"].as_str().unwrap_or_default();
                if status == "completed" || status == "failed" {
                    let title = self.title(u);
                    let text = content_text(&u["content"]);
                    let detail = if text.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", shown(&text, SHOWN_CHARS))
                    };
                    self.info(&format!("[tool] {title} {status}{detail}"));
                }
            }
            _ => {}
        }
    }

    /// The agent's notice of `kind`: `[hook] …` when a hook made the turn go on, else
    /// `[notice] …`.
    fn notice(&mut self, kind: &str, text: &str) {
        let label = if kind == "hook_objection" {
            "hook"
        } else {
            "notice"
        };
        let text = text.trim().trim_start_matches("[buzz-agent] ");
        self.info(&format!("[{label}] {text}"));
    }

    fn on_permission(&mut self, params: &Value) -> Value {
        let call = &params["toolCall"];
        let title = self.title(call);
        let kind = call["kind"].as_str().unwrap_or("other");
        let server = call["_meta"]["buzz"]["server"].as_str();
        // The agent's own built-in tools (`load_skill`) name the agent itself, which this
        // command started too.
        let registered =
            server.is_some_and(|s| s == AGENT_ITSELF || self.servers.iter().any(|n| n == s));
        let allow = self.approve.allows(kind, registered);
        let wanted = if allow { "allow_once" } else { "reject_once" };
        let option = params["options"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["kind"] == wanted)
            .and_then(|o| o["optionId"].as_str());
        let verdict = if allow { "allowed" } else { "denied" };
        let why = match (self.approve, allow) {
            (Approve::Reads, false) if kind == "read" => match server {
                Some(s) => format!(
                    " (--approve reads allows reads of the servers it started only; {s:?} is not one of them)"
                ),
                None => " (--approve reads allows reads of the servers it started only; the request names no server)".to_string(),
            },
            (Approve::Reads, false) => format!(
                " (--approve reads allows kind read only; this is kind {kind}; --approve all allows it)"
            ),
            _ => format!(" (--approve {})", self.approve.name()),
        };
        self.info(&format!("[permission] {title} ({kind}): {verdict}{why}"));
        match option {
            Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
            // No option of that kind: denying is the safe answer either way.
            None => json!({"outcome": {"outcome": "cancelled"}}),
        }
    }
}

/// The server a permission request names for the agent's own built-in tools (SPEC A10, S3).
const AGENT_ITSELF: &str = "buzz-agent";

/// The text of a tool call's `content` (`[{type:"content", content:{type:"text", text}}]`),
/// first line only.
fn content_text(content: &Value) -> String {
    let all: Vec<&str> = content
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["content"]["text"].as_str())
        .collect();
    all.join(" ").lines().next().unwrap_or_default().to_string()
}

/// At most `n` characters of `s`, with `…` when cut.
fn shown(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().nth(n).is_some() {
        out.push('…');
    }
    out
}

/// Reads every `--mcp-config` file into ACP `mcpServers` entries; a name given twice is an
/// error.
fn load_servers(files: &[PathBuf]) -> Result<Vec<Value>, String> {
    let lookup = |name: &str| std::env::var(name).ok();
    let mut all: Vec<Value> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("--mcp-config {}: {e}", file.display()))?;
        let (servers, warnings) = servers_from_config(&text, &lookup)
            .map_err(|e| format!("--mcp-config {}: {e}", file.display()))?;
        for w in warnings {
            eprintln!("warning: --mcp-config {}: {w}", file.display());
        }
        for s in servers {
            if all.iter().any(|o| o["name"] == s["name"]) {
                return Err(format!(
                    "--mcp-config {}: server {} is also in an earlier file",
                    file.display(),
                    s["name"]
                ));
            }
            all.push(s);
        }
    }
    Ok(all)
}

/// Run `exec`; returns the exit status.
pub fn run(bin: &str, args: &[String]) -> i32 {
    let fail = |msg: &str, code: i32| {
        eprintln!("{bin} exec: {msg}");
        code
    };
    let opts = match parse_args(args) {
        Ok(Parsed::Help) => {
            println!("{}", usage(bin));
            return EXIT_OK;
        }
        Ok(Parsed::Run(o)) => o,
        Err(e) => {
            eprintln!("{bin} exec: {e}\n\n{}", usage(bin));
            return EXIT_USAGE;
        }
    };
    let prompt = if opts.prompt == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut s) {
            return fail(
                &format!("cannot read the prompt from stdin: {e}"),
                EXIT_USAGE,
            );
        }
        s
    } else {
        opts.prompt.clone()
    };
    let cwd = match session_cwd(opts.cwd.as_deref()) {
        Ok(d) => d,
        Err(e) => return fail(&e, EXIT_USAGE),
    };
    let servers = match load_servers(&opts.mcp_configs) {
        Ok(s) => s,
        Err(e) => return fail(&e, EXIT_USAGE),
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(&format!("cannot find this binary: {e}"), EXIT_FAILED),
    };
    let mut cmd = Command::new(exe);
    cmd.current_dir(&cwd)
        // `--approve` decides; the agent must ask.
        .env("BUZZ_AGENT_PERMISSION", "ask")
        .stderr(Stdio::inherit());
    if std::env::var_os("BUZZ_AGENT_LOG").is_none() {
        // Warnings and errors only: the turn itself is printed by this command.
        cmd.env("BUZZ_AGENT_LOG", "warn");
    }
    let mut agent = match AcpChild::spawn(cmd) {
        Ok(a) => a,
        Err(e) => return fail(&e, EXIT_FAILED),
    };
    let mut printer = Printer {
        mid_line: false,
        ended_line: false,
        titles: HashMap::new(),
        approve: opts.approve,
        servers: servers
            .iter()
            .filter_map(|s| s["name"].as_str().map(str::to_string))
            .collect(),
    };
    let code = session(&mut agent, &mut printer, &cwd, servers, &prompt, bin);
    printer.end_line();
    match code {
        Ok(code) => {
            let _ = agent.finish(EXIT_WAIT);
            code
        }
        Err(ClientError::Closed) => {
            // The agent stopped on its own: at start-up, its configuration (already printed).
            match agent.wait(Duration::from_secs(2)).and_then(|s| s.code()) {
                Some(2) => fail(
                    "the agent did not start: configuration error (see above)",
                    EXIT_USAGE,
                ),
                other => {
                    let status =
                        other.map_or_else(|| "killed".to_string(), |c| format!("exit status {c}"));
                    fail(&format!("the agent exited ({status})"), EXIT_FAILED)
                }
            }
        }
        Err(e) => {
            let _ = agent.finish(EXIT_WAIT);
            fail(&e.to_string(), EXIT_FAILED)
        }
    }
}

/// `initialize`, `session/new`, `session/prompt`; the exit status.
/// The session's working directory: `--cwd DIR` made absolute (symbolic links resolved), else
/// the current directory. The error names the path and why it cannot be used (`--cwd
/// ~/src/ap: No such file or directory (os error 2)`, `--cwd notes.txt: not a directory`).
fn session_cwd(dir: Option<&Path>) -> Result<PathBuf, String> {
    let Some(dir) = dir else {
        return std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory: {e}"));
    };
    let shown = dir.display();
    let abs = dir
        .canonicalize()
        .map_err(|e| format!("--cwd {shown}: {e}"))?;
    if !abs.is_dir() {
        return Err(format!("--cwd {shown}: not a directory"));
    }
    Ok(abs)
}

fn session(
    agent: &mut AcpChild,
    printer: &mut Printer,
    cwd: &Path,
    servers: Vec<Value>,
    prompt: &str,
    bin: &str,
) -> Result<i32, ClientError> {
    let error_of = |r: &Value| -> Option<String> {
        r.get("error").map(|e| {
            format!(
                "{} (JSON-RPC error {})",
                e["message"].as_str().unwrap_or("(no message)"),
                e["code"]
            )
        })
    };
    let mut ignore = |_: &Value| None;
    let init = agent.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {},
               "clientInfo": {"name": format!("{bin} exec"), "version": env!("CARGO_PKG_VERSION")}}),
        &mut ignore,
    )?;
    if let Some(e) = error_of(&init) {
        eprintln!("{bin} exec: initialize failed: {e}");
        return Ok(EXIT_FAILED);
    }
    let new = agent.request(
        "session/new",
        json!({"cwd": cwd, "mcpServers": servers}),
        &mut ignore,
    )?;
    let Some(sid) = new["result"]["sessionId"].as_str().map(str::to_string) else {
        let e = error_of(&new).unwrap_or_else(|| new.to_string());
        eprintln!("{bin} exec: the session did not start: {e}");
        return Ok(EXIT_FAILED);
    };
    let resp = agent.request(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}),
        &mut |m| printer.on_message(m),
    )?;
    if let Some(e) = error_of(&resp) {
        printer.info(&format!("{bin} exec: the prompt failed: {e}"));
        return Ok(EXIT_FAILED);
    }
    let r = &resp["result"];
    let reason = r["stopReason"].as_str().unwrap_or("(none)");
    let buzz = &r["_meta"]["buzz"];
    let mut line = format!("[stop] {reason}");
    if let Some(rounds) = buzz["rounds"].as_u64() {
        line.push_str(&format!(" (LLM rounds {rounds}"));
        if let Some(k) = buzz["stopObjections"].as_u64() {
            line.push_str(&format!(", _Stop objections {k}"));
            if buzz["stopBudgetExhausted"] == true {
                line.push_str(" — budget exhausted");
            }
        }
        line.push(')');
    }
    printer.info(&line);
    Ok(if reason == "end_turn" {
        EXIT_OK
    } else {
        EXIT_STOPPED
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn p3_a_cwd_that_cannot_be_used_is_named_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("buzz-exec-cwd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("notes.txt");
        std::fs::write(&file, "x").unwrap();
        let missing = dir.join("no-such-dir");
        let e = session_cwd(Some(&missing)).unwrap_err();
        assert!(
            e.starts_with(&format!("--cwd {}: ", missing.display())) && e.contains("No such file"),
            "{e}"
        );
        assert_eq!(
            session_cwd(Some(&file)).unwrap_err(),
            format!("--cwd {}: not a directory", file.display())
        );
        assert_eq!(
            session_cwd(Some(&dir)).unwrap(),
            dir.canonicalize().unwrap()
        );
        assert_eq!(session_cwd(None).unwrap(), std::env::current_dir().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parses_flags_in_both_spellings_and_joins_the_prompt_words() {
        let Ok(Parsed::Run(o)) = parse_args(&args(&[
            "--cwd",
            "/tmp",
            "--approve=all",
            "--mcp-config",
            "a.json",
            "fix",
            "the",
            "tests",
        ])) else {
            unreachable!("parse failed")
        };
        assert_eq!(o.cwd, Some(PathBuf::from("/tmp")));
        assert_eq!(o.approve, Approve::All);
        assert_eq!(o.mcp_configs, vec![PathBuf::from("a.json")]);
        assert_eq!(o.prompt, "fix the tests");
        let Ok(Parsed::Run(o)) = parse_args(&args(&["--", "--cwd is a word"])) else {
            unreachable!("parse failed")
        };
        assert_eq!(
            (o.prompt.as_str(), o.approve),
            ("--cwd is a word", Approve::Reads)
        );
        assert_eq!(parse_args(&args(&["-h"])), Ok(Parsed::Help));
        for bad in [
            &["--approve", "maybe", "p"][..],
            &["--cwd"],
            &[],
            &["--verbose", "p"],
            &["  "],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn s3_approve_reads_allows_only_kind_read_of_a_server_it_started() {
        assert!(Approve::Reads.allows("read", true));
        assert!(
            !Approve::Reads.allows("read", false),
            "S3: an unknown server"
        );
        for kind in ["edit", "delete", "execute", "fetch", "other", ""] {
            for registered in [true, false] {
                assert!(!Approve::Reads.allows(kind, registered), "{kind}");
                assert!(Approve::All.allows(kind, registered));
                assert!(!Approve::None.allows(kind, registered));
            }
        }
    }

    #[test]
    fn expands_vars_with_defaults_and_rejects_unset_ones() {
        let env = |n: &str| (n == "HOME").then(|| "/home/u".to_string());
        assert_eq!(expand("${HOME}/x $PATH", &env).unwrap(), "/home/u/x $PATH");
        assert_eq!(expand("${PORT:-8080}", &env).unwrap(), "8080");
        assert!(
            expand("${TOKEN}", &env)
                .unwrap_err()
                .contains("TOKEN is not set")
        );
        assert!(expand("${HOME", &env).is_err());
    }

    #[test]
    fn reads_the_claude_code_cursor_format_leniently() {
        let text = r#"{"mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "${ROOT:-/tmp}"]},
            "db": {"type": "stdio", "command": ["uvx", "db-mcp"], "env": {"PORT": 5432, "DEBUG": true}},
            "bare": {"command": "srv"},
            "pairs": {"command": "srv", "env": [{"name": "A", "value": "1"}]},
            "remote": {"type": "http", "url": "https://example.com/mcp",
                       "headers": {"Authorization": "Bearer ${TOKEN:-t0}", "X-N": 7}},
            "bare_url": {"url": "https://example.com/mcp2"},
            "old": {"type": "SSE", "url": "http://127.0.0.1:9/sse",
                    "headers": [{"name": "K", "value": "v"}]},
            "ws": {"type": "ws", "url": "wss://example.com/ws"},
            "off": {"command": "x", "disabled": true}
        }}"#;
        let (servers, warnings) = servers_from_config(text, &no_env).unwrap();
        let by = |n: &str| servers.iter().find(|s| s["name"] == n).cloned();
        assert_eq!(
            by("fs").unwrap(),
            json!({"name": "fs", "command": "npx",
                   "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": []})
        );
        assert_eq!(
            by("db").unwrap(),
            json!({"name": "db", "command": "uvx", "args": ["db-mcp"],
                   "env": [{"name": "DEBUG", "value": "true"}, {"name": "PORT", "value": "5432"}]})
        );
        assert_eq!(by("bare").unwrap()["args"], json!([]));
        assert_eq!(
            by("pairs").unwrap()["env"],
            json!([{"name": "A", "value": "1"}])
        );
        assert_eq!(
            by("remote").unwrap(),
            json!({"type": "http", "name": "remote", "url": "https://example.com/mcp",
                   "headers": [{"name": "Authorization", "value": "Bearer t0"},
                               {"name": "X-N", "value": "7"}]})
        );
        assert_eq!(
            by("bare_url").unwrap(),
            json!({"type": "http", "name": "bare_url", "url": "https://example.com/mcp2",
                   "headers": []})
        );
        assert_eq!(
            by("old").unwrap(),
            json!({"type": "sse", "name": "old", "url": "http://127.0.0.1:9/sse",
                   "headers": [{"name": "K", "value": "v"}]})
        );
        assert_eq!(servers.len(), 7);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("\"ws\"") && w.contains("not supported"))
        );
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("\"off\"") && w.contains("disabled"))
        );
        let (vscode, _) =
            servers_from_config(r#"{"servers": {"a": {"command": "x"}}}"#, &no_env).unwrap();
        assert_eq!(vscode.len(), 1);
        let acpx = r#"{"mcpServers": [{"name": "fs", "command": "srv", "args": ["a"],
                       "env": [{"name": "K", "value": "v"}]},
                      {"name": "r", "type": "http", "url": "http://h/mcp", "headers": []}]}"#;
        let (list, warnings) = servers_from_config(acpx, &no_env).unwrap();
        assert_eq!(
            list,
            vec![
                json!({"name": "fs", "command": "srv", "args": ["a"], "env": [{"name": "K", "value": "v"}]}),
                json!({"type": "http", "name": "r", "url": "http://h/mcp", "headers": []}),
            ]
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(
            servers_from_config(r#"{"mcpServers": [{"command": "x"}]}"#, &no_env)
                .unwrap_err()
                .contains("no \"name\"")
        );
    }

    #[test]
    fn config_errors_name_the_server_and_what_is_wrong() {
        for (text, needle) in [
            ("not json", "not JSON"),
            ("{}", "no \"mcpServers\""),
            (r#"{"mcpServers": "x"}"#, "not an object"),
            (
                r#"{"mcpServers": {"a": {}}}"#,
                "server \"a\": no \"command\"",
            ),
            (
                r#"{"mcpServers": {"a": {"command": ""}}}"#,
                "non-empty string",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "args": "y"}}}"#,
                "\"args\"",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "env": "y"}}}"#,
                "\"env\"",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "${NOPE}"}}}"#,
                "NOPE is not set",
            ),
            (
                r#"{"mcpServers": {"a": {"type": "http"}}}"#,
                "server \"a\": no \"url\"",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "example.com/mcp"}}}"#,
                "absolute http:// or https://",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "https://h/${NOPE}"}}}"#,
                "NOPE is not set",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "https://h/", "headers": "x"}}}"#,
                "server \"a\": \"headers\" must be an object",
            ),
        ] {
            let e = servers_from_config(text, &no_env).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
