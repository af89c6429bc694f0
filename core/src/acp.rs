//! ACP (Agent Client Protocol) message decoding and encoding, agent side (SPEC A1–A8).
//!
//! Decoders return `Err(message)` naming the field for a `-32602` reply (SPEC T4).

use crate::config::{Effort, Prices};
use crate::llm::UsageTotals;
use serde_json::{Value, json};

/// ACP protocol version this agent speaks (SPEC A1).
pub(crate) const PROTOCOL_VERSION: u64 = 1;

/// `initialize` result (SPEC A1): `protocolVersion` = min(client's, 1).
///
/// # Errors
/// A missing or non-integer `protocolVersion` (→ `-32602`).
/// `persist`: sessions are saved (SPEC A9), so `loadSession` and the `session/list` and
/// `session/resume` capabilities are advertised. `sessionCapabilities.additionalDirectories`
/// is always advertised: the directories become MCP roots (SPEC M13).
pub(crate) fn initialize_result(
    params: &Value,
    version: &str,
    persist: bool,
) -> Result<Value, String> {
    let v = params
        .get("protocolVersion")
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            "initialize: params.protocolVersion must be a non-negative integer".to_string()
        })?;
    let mut result = json!({
        "protocolVersion": v.min(PROTOCOL_VERSION),
        "agentCapabilities": {
            "loadSession": persist,
            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
            "mcpCapabilities": {"http": true, "sse": true},
            "sessionCapabilities": {"close": {}, "additionalDirectories": {}}
        },
        "agentInfo": {"name": "buzz-agent", "version": version},
        "authMethods": []
    });
    if persist {
        result["agentCapabilities"]["sessionCapabilities"] =
            json!({"close": {}, "list": {}, "resume": {}, "additionalDirectories": {}});
    }
    Ok(result)
}

/// Whether `initialize` params advertise `clientCapabilities.session.notices` (an object): the
/// client presents ACP `notice` session updates.
#[must_use]
pub(crate) fn client_shows_notices(params: &Value) -> bool {
    params
        .pointer("/clientCapabilities/session/notices")
        .is_some_and(Value::is_object)
}

/// One MCP server entry of `session/new` (SPEC A2, M10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct McpServerEntry {
    pub name: String,
    /// How the server is reached.
    pub transport: EntryTransport,
}

/// How an `mcpServers` entry is reached (ACP `McpServerStdio`, `McpServerHttp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EntryTransport {
    /// A child process (SPEC M1).
    Stdio {
        command: String,
        args: Vec<String>,
        /// Client-given environment, in the order given (later entries win).
        env: Vec<(String, String)>,
    },
    /// Streamable HTTP (SPEC M10): every message a `POST` to `url`; with `legacy`, the
    /// HTTP+SSE transport of MCP 2024-11-05 (`"type": "sse"`): a `GET` event stream at `url`
    /// and an endpoint it names for the messages.
    Http {
        /// The absolute `http(s)` URL.
        url: String,
        /// Headers sent with every request, in the order given (e.g. an `Authorization`).
        headers: Vec<(String, String)>,
        /// The legacy HTTP+SSE transport.
        legacy: bool,
    },
}

impl McpServerEntry {
    /// A stdio entry (tests build servers this way).
    #[cfg(test)]
    pub(crate) fn stdio(name: &str, command: &str, env: &[(&str, &str)]) -> McpServerEntry {
        McpServerEntry {
            name: name.into(),
            transport: EntryTransport::Stdio {
                command: command.into(),
                args: vec![],
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        }
    }
}

/// An `mcpServers` entry of `session/new` that was skipped (SPEC A2, case C55).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SkippedServer {
    /// Its `name` (or `mcpServers[i]` when it has none).
    pub name: String,
    /// Why, for the WARN and the notice: "websocket servers are not supported (only stdio,
    /// http and sse)".
    pub reason: String,
}

/// Decoded `session/new` params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewSession {
    /// Absolute path (SPEC A2, case C07).
    pub cwd: String,
    /// The client's `additionalDirectories` (absolute paths, in the order given, without
    /// repeats or the `cwd` itself): further workspace roots, offered to MCP servers as roots
    /// with the `cwd` (SPEC M13).
    pub additional_directories: Vec<String>,
    pub servers: Vec<McpServerEntry>,
    /// Entries of a transport other than stdio, in the order given (SPEC A2, C55).
    pub skipped: Vec<SkippedServer>,
    /// The client's `_meta.systemPrompt` (SPEC A10).
    pub system_prompt: Option<crate::instructions::ClientPrompt>,
}

/// Decode `session/new` params (SPEC A2, cases C06, C07, C55); [`decode_session_setup`] with the
/// method `session/new`.
///
/// # Errors
/// As [`decode_session_setup`].
pub(crate) fn decode_new_session(params: &Value) -> Result<NewSession, (String, Value)> {
    decode_session_setup(params, "session/new")
}

/// Decode the `cwd` and `mcpServers` of `method`'s params (`session/new`, `session/load`,
/// `session/resume`; SPEC A2, A9, cases C06, C07). Lenient where the SPEC says so:
/// missing `mcpServers` = `[]`, missing `args`/`env` = empty, `env` as an array of
/// `{name,value}` or an object map, `"type":"stdio"` accepted; `"type":"http"` (or a `url`
/// without `type`) and `"type":"sse"` entries need an absolute `http(s)` `url` and take
/// `headers` like `env` (SPEC M10); an entry of another transport is skipped and listed in
/// [`NewSession::skipped`]; any non-empty name is accepted (mapped to a tool prefix by
/// [`crate::tools::server_prefix`]).
///
/// # Errors
/// `(message, data)` for a `-32602` reply: relative cwd, a missing or duplicate name (or two
/// names with the same tool prefix), missing command; `data` carries the offending path.
pub(crate) fn decode_session_setup(
    params: &Value,
    method: &str,
) -> Result<NewSession, (String, Value)> {
    let cwd = match params.get("cwd") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err((
                format!("{method}: cwd must be a string"),
                json!({"field": "cwd"}),
            ));
        }
        None => {
            return Err((
                format!("{method}: missing field cwd"),
                json!({"field": "cwd"}),
            ));
        }
    };
    if cwd.is_empty() || !cwd.starts_with('/') {
        return Err(("cwd must be an absolute path".into(), json!({"cwd": cwd})));
    }
    let additional_directories = additional_directories(params, method, &cwd)?;
    let list = match params.get("mcpServers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => {
            return Err((
                format!("{method}: mcpServers must be an array"),
                json!({"field": "mcpServers"}),
            ));
        }
    };
    let mut servers: Vec<McpServerEntry> = Vec::with_capacity(list.len());
    let mut skipped: Vec<SkippedServer> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let path = |f: &str| format!("mcpServers[{i}].{f}");
        let bad = |f: &str, what: &str| {
            Err((
                format!("{method}: {}: {what}", path(f)),
                json!({"path": path(f)}),
            ))
        };
        if !e.is_object() {
            return Err((
                format!("{method}: mcpServers[{i}] must be an object"),
                json!({"path": format!("mcpServers[{i}]")}),
            ));
        }
        let Some(name) = e
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            return bad("name", "missing, empty or not a string");
        };
        let kind = match e.get("type") {
            Some(Value::String(t)) => t.clone(),
            Some(other) => other.to_string(),
            None if e.get("url").is_some() => "http".to_string(),
            None => "stdio".to_string(),
        };
        if !["stdio", "http", "sse"].contains(&kind.as_str()) {
            skipped.push(SkippedServer {
                name: name.to_string(),
                reason: format!("{kind} servers are not supported (only stdio, http and sse)"),
            });
            continue;
        }
        if servers.iter().any(|s| s.name == name) {
            return bad("name", &format!("duplicate server name '{name}'"));
        }
        let prefix = crate::tools::server_prefix(name);
        if let Some(other) = servers
            .iter()
            .find(|s| crate::tools::server_prefix(&s.name) == prefix)
        {
            return bad(
                "name",
                &format!(
                    "server names '{}' and '{name}' give the same tool prefix '{prefix}'",
                    other.name
                ),
            );
        }
        if kind == "http" || kind == "sse" {
            let url = match e.get("url").and_then(Value::as_str) {
                Some(u) if crate::http::origin_of(u).is_ok() => u.to_string(),
                Some(_) => return bad("url", "must be an absolute http:// or https:// URL"),
                None => return bad("url", "missing"),
            };
            let headers = match name_value_pairs(e.get("headers"), "headers") {
                Ok(h) => h,
                Err((field, what)) => return bad(&field, &what),
            };
            for (j, (n, v)) in headers.iter().enumerate() {
                // The transport's own headers (SPEC M10) are not the entry's to set.
                let own = ["mcp-session-id", "mcp-protocol-version", "last-event-id"]
                    .iter()
                    .any(|h| n.eq_ignore_ascii_case(h));
                let checked = if own {
                    Err(format!("'{n}' is set by the agent"))
                } else {
                    crate::http::check_header(n, v)
                };
                if let Err(why) = checked {
                    return bad(&format!("headers[{j}]"), &why);
                }
            }
            servers.push(McpServerEntry {
                name: name.to_string(),
                transport: EntryTransport::Http {
                    url,
                    headers,
                    legacy: kind == "sse",
                },
            });
            continue;
        }
        let Some(command) = e
            .get("command")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
        else {
            return bad("command", "missing");
        };
        let args = match e.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => {
                let mut out = Vec::with_capacity(a.len());
                for (j, v) in a.iter().enumerate() {
                    match v.as_str() {
                        Some(s) => out.push(s.to_string()),
                        None => return bad(&format!("args[{j}]"), "must be a string"),
                    }
                }
                out
            }
            Some(_) => return bad("args", "must be an array of strings"),
        };
        let env = match name_value_pairs(e.get("env"), "env") {
            Ok(env) => env,
            Err((field, what)) => return bad(&field, &what),
        };
        servers.push(McpServerEntry {
            name: name.to_string(),
            transport: EntryTransport::Stdio {
                command: command.to_string(),
                args,
                env,
            },
        });
    }
    Ok(NewSession {
        cwd,
        additional_directories,
        servers,
        skipped,
        system_prompt: crate::instructions::client_prompt(params),
    })
}

/// The `additionalDirectories` of `method`'s params (ACP `NewSessionRequest` and the load and
/// resume requests; SPEC M13): absent or `null` is none; each must be an absolute path like
/// the `cwd`; repeats and the `cwd` itself are dropped.
///
/// # Errors
/// `(message, data)` for a `-32602` reply naming the offending item.
fn additional_directories(
    params: &Value,
    method: &str,
    cwd: &str,
) -> Result<Vec<String>, (String, Value)> {
    let list = match params.get("additionalDirectories") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err((
                format!("{method}: additionalDirectories must be an array of absolute paths"),
                json!({"field": "additionalDirectories"}),
            ));
        }
    };
    let mut dirs: Vec<String> = Vec::with_capacity(list.len());
    for (i, d) in list.iter().enumerate() {
        match d.as_str() {
            Some(p) if p.starts_with('/') => {
                if p != cwd && !dirs.iter().any(|x| x == p) {
                    dirs.push(p.to_string());
                }
            }
            _ => {
                return Err((
                    format!("{method}: additionalDirectories[{i}] must be an absolute path"),
                    json!({"path": format!("additionalDirectories[{i}]")}),
                ));
            }
        }
    }
    Ok(dirs)
}

/// An entry's `env` or `headers`: an array of `{name, value}` or an object map (SPEC A2,
/// lenient), in the order given; absent or `null` is empty.
///
/// # Errors
/// `(field, what)`: the offending field (`env[2]`, `headers.x`) and what is wrong with it.
fn name_value_pairs(
    v: Option<&Value>,
    field: &str,
) -> Result<Vec<(String, String)>, (String, String)> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for (j, v) in a.iter().enumerate() {
                let (Some(n), Some(val)) = (
                    v.get("name").and_then(Value::as_str),
                    v.get("value").and_then(Value::as_str),
                ) else {
                    return Err((
                        format!("{field}[{j}]"),
                        "must be {\"name\": string, \"value\": string}".into(),
                    ));
                };
                out.push((n.to_string(), val.to_string()));
            }
            Ok(out)
        }
        Some(Value::Object(m)) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, v) in m {
                match v.as_str() {
                    Some(s) => out.push((k.clone(), s.to_string())),
                    None => return Err((format!("{field}.{k}"), "must be a string".into())),
                }
            }
            Ok(out)
        }
        Some(_) => Err((
            field.to_string(),
            "must be an array of {name, value} or an object".into(),
        )),
    }
}

/// The `configId` of the model selector (SPEC A5, case C58).
pub(crate) const MODEL_CONFIG_ID: &str = "model";

/// The models a session may use (SPEC A5, case C58): `configured` (the `BUZZ_AGENT_MODEL` and
/// `BUZZ_AGENT_MODELS` ids) in their order, without duplicates, then `current` if it is not
/// one of them (a model set with `session/set_model`), so the picker's order never moves.
#[must_use]
pub(crate) fn available_models(current: &str, configured: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(configured.len() + 1);
    for m in configured.iter().map(String::as_str).chain([current]) {
        if !out.iter().any(|o| o == m) {
            out.push(m.to_string());
        }
    }
    out
}

/// Token counts for the client (SPEC A6, L11): `inputTokens` (all of the input, cache reads
/// and writes included), `outputTokens`, `totalTokens`, and `cachedReadTokens` /
/// `cachedWriteTokens` (parts of the input) when the provider reported them; with `prices`,
/// `cost` (ACP `Cost`: `amount`, `currency`). The names follow ACP's usage proposal, and the
/// object goes under `_meta.buzz` (the v1 schema has no token fields of its own).
#[must_use]
pub(crate) fn usage_json(u: &UsageTotals, prices: Option<&Prices>) -> Value {
    let mut v = json!({
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "totalTokens": u.input_tokens.saturating_add(u.output_tokens),
    });
    if let Some(read) = u.cache_read_tokens {
        v["cachedReadTokens"] = json!(read);
    }
    if let Some(write) = u.cache_write_tokens {
        v["cachedWriteTokens"] = json!(write);
    }
    if let Some(prices) = prices {
        v["cost"] = cost_json(u, prices);
    }
    v
}

/// ACP `Cost` of `u` at `prices`: `{amount, currency}`.
#[must_use]
pub(crate) fn cost_json(u: &UsageTotals, prices: &Prices) -> Value {
    json!({"amount": u.cost(prices), "currency": prices.currency})
}

/// The `configOptions` of a session (SPEC A5, case C58; SPEC L12; ACP schema v1:
/// `SessionConfigOption`): a `select` of category `model` (current value `current`, options
/// `available`), then a `select` of category `thought_level` for the reasoning effort (current
/// value [`effort_value`] of `effort`, options [`EFFORT_VALUES`]).
#[must_use]
pub(crate) fn config_options(current: &str, available: &[String], effort: Option<Effort>) -> Value {
    let options: Vec<Value> = available
        .iter()
        .map(|m| json!({"value": m, "name": m}))
        .collect();
    let levels: Vec<Value> = EFFORT_VALUES
        .iter()
        .map(|(value, name, description)| {
            json!({"value": value, "name": name, "description": description})
        })
        .collect();
    json!([{
        "id": MODEL_CONFIG_ID,
        "name": "Model",
        "description": "The LLM model of this session's requests",
        "category": "model",
        "type": "select",
        "currentValue": current,
        "options": options
    }, {
        "id": THOUGHT_LEVEL_CONFIG_ID,
        "name": "Thinking effort",
        "description": "How much the model may reason before it answers, from the next request on",
        "category": "thought_level",
        "type": "select",
        "currentValue": effort_value(effort),
        "options": levels
    }])
}

/// The `configId` of the reasoning-effort selector (SPEC L12).
pub(crate) const THOUGHT_LEVEL_CONFIG_ID: &str = "thought_level";

/// The values of the reasoning-effort selector (SPEC L12): `(value, name, description)`.
/// `default` sends no reasoning parameter (the provider's default); the others are the
/// [`Effort`]s in their configuration spelling.
pub(crate) const EFFORT_VALUES: [(&str, &str, &str); 5] = [
    (
        "default",
        "Provider default",
        "No reasoning parameter: whatever the model does by default",
    ),
    ("low", "Low", "Little reasoning, fastest answers"),
    ("medium", "Medium", "Some reasoning"),
    ("high", "High", "Thorough reasoning"),
    ("max", "Max", "The most reasoning the provider offers"),
];

/// The selector value of `effort` (SPEC L12): its spelling, or `default` for none.
#[must_use]
pub(crate) fn effort_value(effort: Option<Effort>) -> &'static str {
    effort.map_or("default", Effort::as_str)
}

/// The effort a selector value `value` stands for (SPEC L12): `Some(None)` for `default`,
/// `None` when `value` is not one of [`EFFORT_VALUES`] (exact spelling).
#[must_use]
pub(crate) fn parse_effort_value(value: &str) -> Option<Option<Effort>> {
    if value == "default" {
        return Some(None);
    }
    Effort::ALL
        .into_iter()
        .find(|e| e.as_str() == value)
        .map(Some)
}

/// The model fields of a `session/new` (or `session/load`) result (SPEC A5, case C58, SPEC
/// L12): the `configOptions` (model and reasoning-effort selectors, the session's effort
/// `effort`), and the `models` state (`currentModelId`, `availableModels`) of the unstable
/// `session/set_model` for the clients that use it.
#[must_use]
pub(crate) fn model_fields(
    current: &str,
    available: &[String],
    effort: Option<Effort>,
) -> serde_json::Map<String, Value> {
    let models: Vec<Value> = available
        .iter()
        .map(|m| json!({"modelId": m, "name": m}))
        .collect();
    let mut map = serde_json::Map::new();
    map.insert(
        "configOptions".into(),
        config_options(current, available, effort),
    );
    map.insert(
        "models".into(),
        json!({"currentModelId": current, "availableModels": models}),
    );
    map
}

/// Read a required non-empty string field `field` of `method`'s params.
///
/// # Errors
/// A `-32602` message naming the method and the field.
pub(crate) fn string_field<'a>(
    params: &'a Value,
    method: &str,
    field: &str,
) -> Result<&'a str, String> {
    match params.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(format!("{method}: {field} must be a string")),
        None => Err(format!("{method}: missing field {field}")),
    }
}

/// Render `session/prompt` content blocks to the user message text (SPEC A3).
///
/// # Errors
/// A `-32602` message for a missing/empty prompt, image/audio/blob blocks or unknown types.
pub(crate) fn render_prompt(params: &Value) -> Result<String, String> {
    let Some(blocks) = params.get("prompt").and_then(Value::as_array) else {
        return Err("session/prompt: prompt must be an array of content blocks".into());
    };
    let mut parts: Vec<String> = Vec::with_capacity(blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => match b.get("text").and_then(Value::as_str) {
                Some(t) => parts.push(t.to_string()),
                None => return Err(format!("session/prompt: prompt[{i}].text must be a string")),
            },
            "resource_link" => {
                let uri = b.get("uri").and_then(Value::as_str).unwrap_or("");
                parts.push(format!("[resource: {uri}]"));
            }
            "resource" => {
                let r = b.get("resource").unwrap_or(&Value::Null);
                let uri = r.get("uri").and_then(Value::as_str).unwrap_or("");
                match r.get("text").and_then(Value::as_str) {
                    Some(t) => parts.push(format!("[resource: {uri}]\n{t}")),
                    None => {
                        return Err(format!(
                            "session/prompt: prompt[{i}]: blob resources are not supported (promptCapabilities)"
                        ));
                    }
                }
            }
            "image" | "audio" => {
                return Err(format!(
                    "session/prompt: prompt[{i}]: {kind} content is not supported (promptCapabilities.{kind} is false)"
                ));
            }
            other => {
                return Err(format!(
                    "session/prompt: prompt[{i}]: unknown content block type '{other}'"
                ));
            }
        }
    }
    if parts.is_empty() {
        return Err("session/prompt: prompt is empty".into());
    }
    Ok(parts.join("\n"))
}

/// The `session/update` notification line for `update` (SPEC A6).
#[must_use]
pub(crate) fn update_line(session_id: &str, update: &Value) -> String {
    /// `params`, borrowed: the same bytes as `json!({"sessionId", "update"})` (sorted keys)
    /// without copying `update` into a new tree first.
    #[derive(serde::Serialize)]
    struct Params<'a> {
        #[serde(rename = "sessionId")]
        session_id: &'a str,
        update: &'a Value,
    }
    crate::jsonrpc::encode_notification_with("session/update", &Params { session_id, update })
}

/// `agent_message_chunk` / `agent_thought_chunk` update (SPEC A6).
#[must_use]
pub(crate) fn chunk_update(kind: &str, text: &str) -> Value {
    json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
}

/// Whom a permission request is about (SPEC S3): the MCP server by the name the client
/// registered it under (`mcpServers[].name`), the tool by the name that server gives it, and
/// the title the server chose, which is only a description (a server can title its tool
/// anything, another server's tool included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ToolIdentity<'a> {
    /// The client's name of the server.
    pub(crate) server: &'a str,
    /// The server's (bare) name of the tool.
    pub(crate) tool: &'a str,
    /// The server's own title of the tool (the MCP `title`), when it gave one.
    pub(crate) server_title: Option<&'a str>,
}

impl ToolIdentity<'_> {
    /// The title of the permission request: `<server>: <tool>`, then the server's own title as
    /// a quoted description when it says something else: `evil: write ("fs: read_text_file")`.
    /// Control characters are escaped (SPEC S6).
    pub(crate) fn title(&self) -> String {
        let identity = format!("{}: {}", self.server, self.tool);
        let title = match self.server_title.filter(|t| *t != identity) {
            Some(described) => format!("{identity} ({described:?})"),
            None => identity,
        };
        crate::text::escape_controls(&title, &[]).into_owned()
    }
}

/// `session/request_permission` params (SPEC A7, S3): the tool call's id, kind (from the
/// server's annotations: a hint) and arguments; its title names the server the client
/// registered and the tool ([`ToolIdentity::title`]), and `_meta.buzz` carries them as data
/// (`server`, `tool`, and `serverTitle` when the server gave one), so that a client's
/// auto-approval can rely on who is asking, never on what the server calls its tool.
#[must_use]
pub(crate) fn permission_params(
    session_id: &str,
    tool_call_id: &str,
    who: ToolIdentity<'_>,
    kind: &str,
    raw_input: &Value,
) -> Value {
    let mut meta = json!({"server": who.server, "tool": who.tool});
    if let Some(t) = who.server_title {
        meta["serverTitle"] = json!(t);
    }
    json!({
        "sessionId": session_id,
        "toolCall": {"toolCallId": tool_call_id, "title": who.title(), "kind": kind,
                     "rawInput": raw_input, "_meta": {"buzz": meta}},
        "options": [
            {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
            {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
            {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
            {"optionId": "reject_always", "name": "Always reject", "kind": "reject_always"}
        ]
    })
}

/// A decided permission answer (SPEC A7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermissionAnswer {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
    /// Cancelled, malformed, unknown option, error reply or timeout: deny.
    Denied,
}

/// Decode a `session/request_permission` response result (SPEC A7): only
/// `{"outcome":{"outcome":"selected","optionId":<one of ours>}}` allows.
#[must_use]
pub(crate) fn decode_permission(result: &Value) -> PermissionAnswer {
    let o = result.get("outcome");
    if o.and_then(|o| o.get("outcome")).and_then(Value::as_str) != Some("selected") {
        return PermissionAnswer::Denied;
    }
    match o.and_then(|o| o.get("optionId")).and_then(Value::as_str) {
        Some("allow_once") => PermissionAnswer::AllowOnce,
        Some("allow_always") => PermissionAnswer::AllowAlways,
        Some("reject_once") => PermissionAnswer::RejectOnce,
        Some("reject_always") => PermissionAnswer::RejectAlways,
        _ => PermissionAnswer::Denied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_line_is_the_notification_of_its_params_as_one_json_object() {
        let update = json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": "tc_1",
            "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "a \"q\"\n é"}}],
            "rawOutput": {"isError": false},
        });
        let line = update_line("sess_1", &update);
        assert_eq!(
            line,
            crate::jsonrpc::encode_notification(
                "session/update",
                &json!({"sessionId": "sess_1", "update": update}),
            )
        );
        assert!(line.ends_with("}}\n") && !line[..line.len() - 1].contains('\n'));
    }

    #[test]
    fn a1_version_is_min_of_client_and_ours() {
        let r = initialize_result(&json!({"protocolVersion": 7}), "0.1.0", false).unwrap();
        assert_eq!(r["agentCapabilities"]["loadSession"], false);
        assert_eq!(
            r["agentCapabilities"]["sessionCapabilities"],
            json!({"close": {}, "additionalDirectories": {}}),
            "H11: close needs no store; M13: additional directories become MCP roots"
        );
        let on = initialize_result(&json!({"protocolVersion": 1}), "0.1.0", true).unwrap();
        assert_eq!(on["agentCapabilities"]["loadSession"], true, "A9");
        assert_eq!(
            on["agentCapabilities"]["sessionCapabilities"],
            json!({"close": {}, "list": {}, "resume": {}, "additionalDirectories": {}})
        );
        assert_eq!(r["protocolVersion"], 1);
        assert_eq!(
            initialize_result(&json!({"protocolVersion": 0}), "x", false).unwrap()["protocolVersion"],
            0
        );
        assert!(initialize_result(&json!({"protocolVersion": "1"}), "x", false).is_err());
        assert!(initialize_result(&json!({}), "x", false).is_err());
        assert_eq!(
            r["agentCapabilities"]["mcpCapabilities"],
            json!({"http": true, "sse": true})
        );
    }

    #[test]
    fn a2_c06_server_entry_shapes() {
        let p = json!({"cwd": "/tmp/ws", "mcpServers": [
            {"name":"ok","command":"/bin/x","args":["--root","/tmp"],"env":[{"name":"LOG","value":"1"}]},
            {"name":"envobj","command":"/bin/x","args":[],"env":{"LOG":"1"}},
            {"name":"noargs","command":"/bin/x","type":"stdio"}
        ]});
        let n = decode_new_session(&p).unwrap();
        assert_eq!(n.servers.len(), 3);
        let EntryTransport::Stdio { env, .. } = &n.servers[1].transport else {
            panic!("stdio");
        };
        assert_eq!(env, &vec![("LOG".to_string(), "1".to_string())]);
        let EntryTransport::Stdio { args, .. } = &n.servers[2].transport else {
            panic!("stdio");
        };
        assert!(args.is_empty());
        let nocmd = json!({"cwd": "/tmp", "mcpServers": [{"name":"nocmd","args":[]}]});
        assert!(
            decode_new_session(&nocmd)
                .unwrap_err()
                .0
                .contains("mcpServers[0].command")
        );
        let http = json!({"cwd": "/tmp", "mcpServers": [
            {"type":"http","name":"r","url":"http://x/mcp","headers":[{"name":"Authorization","value":"Bearer t"}]},
            {"type":"sse","name":"s","url":"https://y/sse","headers":{"x-team":"a"}},
            {"name":"u","url":"http://127.0.0.1:9/"}
        ]});
        let n = decode_new_session(&http).unwrap();
        assert!(n.skipped.is_empty());
        assert_eq!(
            n.servers[0].transport,
            EntryTransport::Http {
                url: "http://x/mcp".into(),
                headers: vec![("Authorization".into(), "Bearer t".into())],
                legacy: false
            }
        );
        assert_eq!(
            n.servers[1].transport,
            EntryTransport::Http {
                url: "https://y/sse".into(),
                headers: vec![("x-team".into(), "a".into())],
                legacy: true
            }
        );
        assert!(matches!(
            n.servers[2].transport,
            EntryTransport::Http { legacy: false, .. }
        ));
        for (entry, field) in [
            (json!({"type":"http","name":"r"}), "mcpServers[0].url"),
            (
                json!({"type":"http","name":"r","url":"ftp://x"}),
                "mcpServers[0].url",
            ),
            (
                json!({"type":"http","name":"r","url":"/mcp"}),
                "mcpServers[0].url",
            ),
            (
                json!({"type":"http","name":"r","url":"http://x","headers":[{"name":"x-a","value":"1\r\nx-b: 2"}]}),
                "mcpServers[0].headers[0]",
            ),
            (
                json!({"type":"http","name":"r","url":"http://x","headers":[{"name":"Host","value":"y"}]}),
                "mcpServers[0].headers[0]",
            ),
            (
                json!({"type":"http","name":"r","url":"http://x","headers":{"Mcp-Session-Id":"s"}}),
                "mcpServers[0].headers[0]",
            ),
            (
                json!({"type":"http","name":"r","url":"http://x","headers":[{"name":"Transfer-Encoding","value":"chunked"}]}),
                "mcpServers[0].headers[0]",
            ),
            (
                json!({"type":"http","name":"r","url":"http://x","headers":"a"}),
                "mcpServers[0].headers",
            ),
        ] {
            let p = json!({"cwd": "/tmp", "mcpServers": [entry]});
            let (message, data) = decode_new_session(&p).unwrap_err();
            assert!(message.contains(field), "{message}");
            assert_eq!(data["path"], field);
        }
        let dup = json!({"cwd": "/tmp", "mcpServers": [{"name":"a","command":"x"},{"name":"a","command":"y"}]});
        assert!(
            decode_new_session(&dup)
                .unwrap_err()
                .0
                .contains("duplicate")
        );
        assert!(
            decode_new_session(&json!({"cwd": "/tmp"}))
                .unwrap()
                .servers
                .is_empty()
        );
    }

    #[test]
    fn c55_other_transports_are_skipped_and_odd_names_accepted() {
        let p = json!({"cwd": "/w", "mcpServers": [
            {"type":"websocket","name":"ws","url":"wss://z"},
            {"type":7,"name":"seven"},
            {"name":"My Files","command":"/bin/x"},
            {"name":"my.fs","command":"/bin/x"},
            {"name":"github/copilot","command":"/bin/x","type":"stdio"},
            {"name":"ünï","command":"/bin/x"}
        ]});
        let n = decode_new_session(&p).unwrap();
        let names: Vec<&str> = n.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["My Files", "my.fs", "github/copilot", "ünï"]);
        let skipped: Vec<(&str, &str)> = n
            .skipped
            .iter()
            .map(|s| (s.name.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            [
                (
                    "ws",
                    "websocket servers are not supported (only stdio, http and sse)"
                ),
                (
                    "seven",
                    "7 servers are not supported (only stdio, http and sse)"
                ),
            ]
        );
        let same = json!({"cwd": "/w", "mcpServers": [{"name":"a","command":"x"},{"name":"","command":"y"}]});
        assert!(
            decode_new_session(&same)
                .unwrap_err()
                .0
                .contains("mcpServers[1].name")
        );
    }

    #[test]
    fn c58_the_model_list_keeps_its_order_and_adds_a_model_set_by_id() {
        let configured = ["a".to_string(), "b".into(), "a".into()];
        assert_eq!(available_models("b", &configured), ["a", "b"]);
        assert_eq!(available_models("z", &configured), ["a", "b", "z"]);
        let fields = model_fields("b", &available_models("b", &configured), None);
        assert_eq!(fields["configOptions"][0]["currentValue"], "b");
        assert_eq!(fields["configOptions"][0]["category"], "model");
        assert_eq!(fields["models"]["currentModelId"], "b");
        assert_eq!(
            fields["models"]["availableModels"],
            json!([{"modelId": "a", "name": "a"}, {"modelId": "b", "name": "b"}])
        );
    }

    #[test]
    fn l12_the_effort_selector_follows_the_session_s_effort_and_reads_its_own_values() {
        let options = config_options("m", &["m".to_string()], Some(Effort::High));
        let level = &options[1];
        assert_eq!(level["id"], "thought_level");
        assert_eq!(level["category"], "thought_level");
        assert_eq!(level["type"], "select");
        assert_eq!(level["currentValue"], "high");
        let values = crate::json::strs_of(&level["options"], "value");
        assert_eq!(values, ["default", "low", "medium", "high", "max"]);
        assert_eq!(config_options("m", &[], None)[1]["currentValue"], "default");
        for value in values {
            let effort = parse_effort_value(value).expect(value);
            assert_eq!(effort_value(effort), value);
        }
        for bad in ["", "High", " low", "none", "xhigh"] {
            assert_eq!(parse_effort_value(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn c07_relative_cwds_are_rejected() {
        for cwd in [".", "~", "", "rel/dir"] {
            let e = decode_new_session(&json!({"cwd": cwd, "mcpServers": []})).unwrap_err();
            assert_eq!(e.0, "cwd must be an absolute path");
            assert_eq!(e.1, json!({"cwd": cwd}));
        }
    }

    #[test]
    fn m13_additional_directories_are_absolute_kept_in_order_without_repeats() {
        let ok = decode_new_session(&json!({"cwd": "/w",
            "additionalDirectories": ["/lib", "/w", "/docs", "/lib"]}))
        .unwrap();
        assert_eq!(ok.additional_directories, ["/lib", "/docs"]);
        for none in [
            json!({"cwd": "/w"}),
            json!({"cwd": "/w", "additionalDirectories": null}),
        ] {
            assert!(
                decode_new_session(&none)
                    .unwrap()
                    .additional_directories
                    .is_empty()
            );
        }
        for (bad, path) in [
            (
                json!(["/a", "rel"]),
                json!({"path": "additionalDirectories[1]"}),
            ),
            (json!([7]), json!({"path": "additionalDirectories[0]"})),
            (json!("/a"), json!({"field": "additionalDirectories"})),
        ] {
            let e = decode_session_setup(
                &json!({"cwd": "/w", "additionalDirectories": bad}),
                "session/load",
            )
            .unwrap_err();
            assert!(
                e.0.starts_with("session/load: additionalDirectories"),
                "{e:?}"
            );
            assert_eq!(e.1, path);
        }
    }

    #[test]
    fn a3_prompt_blocks_render_or_are_rejected() {
        let p = json!({"prompt": [{"type":"text","text":"hi"},{"type":"resource_link","uri":"file:///a","name":"a"},
            {"type":"resource","resource":{"uri":"file:///b","text":"B"}}]});
        assert_eq!(
            render_prompt(&p).unwrap(),
            "hi\n[resource: file:///a]\n[resource: file:///b]\nB"
        );
        assert!(
            render_prompt(&json!({"prompt":[{"type":"image","data":"","mimeType":"image/png"}]}))
                .is_err()
        );
        assert!(render_prompt(&json!({"prompt":[]})).is_err());
    }

    #[test]
    fn a7_only_selected_allow_options_allow() {
        let sel = |id: &str| json!({"outcome": {"outcome": "selected", "optionId": id}});
        assert_eq!(
            decode_permission(&sel("allow_once")),
            PermissionAnswer::AllowOnce
        );
        assert_eq!(
            decode_permission(&sel("allow_always")),
            PermissionAnswer::AllowAlways
        );
        assert_eq!(decode_permission(&sel("bogus")), PermissionAnswer::Denied);
        assert_eq!(
            decode_permission(&json!({"outcome": {"outcome": "cancelled"}})),
            PermissionAnswer::Denied
        );
        assert_eq!(decode_permission(&json!(null)), PermissionAnswer::Denied);
    }

    #[test]
    fn s3_the_identity_is_the_registered_server_and_tool_and_the_servers_title_a_description() {
        let who = |server_title| ToolIdentity {
            server: "evil",
            tool: "write_stuff",
            server_title,
        };
        assert_eq!(
            who(Some("fs: read_text_file")).title(),
            r#"evil: write_stuff ("fs: read_text_file")"#
        );
        assert_eq!(who(Some("evil: write_stuff")).title(), "evil: write_stuff");
        assert_eq!(who(None).title(), "evil: write_stuff");
        assert_eq!(
            who(Some("a\u{1b}[2Jb")).title(),
            r#"evil: write_stuff ("a\u{1b}[2Jb")"#,
            "the description is quoted, its controls escaped"
        );
        let p = permission_params("s", "tc_1", who(Some("Read")), "read", &json!({}));
        assert_eq!(
            p["toolCall"]["_meta"]["buzz"],
            json!({"server": "evil", "tool": "write_stuff", "serverTitle": "Read"})
        );
    }

    #[test]
    fn a7_the_permission_request_names_the_call_and_offers_the_four_options() {
        let who = ToolIdentity {
            server: "fs",
            tool: "read",
            server_title: None,
        };
        let p = permission_params("sess_1", "tc_2", who, "read", &json!({"path": "/a"}));
        assert_eq!(
            p,
            json!({
                "sessionId": "sess_1",
                "toolCall": {"toolCallId": "tc_2", "title": "fs: read", "kind": "read",
                             "rawInput": {"path": "/a"},
                             "_meta": {"buzz": {"server": "fs", "tool": "read"}}},
                "options": [
                    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                    {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
                    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
                    {"optionId": "reject_always", "name": "Always reject", "kind": "reject_always"}
                ]
            })
        );
    }

    #[test]
    fn a7_each_reject_option_is_decoded_as_itself() {
        let sel = |id: &str| json!({"outcome": {"outcome": "selected", "optionId": id}});
        assert_eq!(
            decode_permission(&sel("reject_once")),
            PermissionAnswer::RejectOnce
        );
        assert_eq!(
            decode_permission(&sel("reject_always")),
            PermissionAnswer::RejectAlways
        );
    }

    #[test]
    fn a6_a_chunk_update_is_one_text_content_block_of_its_kind() {
        assert_eq!(
            chunk_update("agent_thought_chunk", "hmm"),
            json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}})
        );
    }

    #[test]
    fn t4_a_required_string_field_is_read_or_named_in_the_error() {
        let params = json!({"sessionId": "sess_1", "modelId": 7});
        assert_eq!(
            string_field(&params, "session/set_model", "sessionId"),
            Ok("sess_1")
        );
        assert_eq!(
            string_field(&params, "session/set_model", "modelId"),
            Err("session/set_model: modelId must be a string".to_string())
        );
        assert_eq!(
            string_field(&params, "session/prompt", "prompt"),
            Err("session/prompt: missing field prompt".to_string())
        );
    }

    #[test]
    fn c55_notices_are_shown_only_to_a_client_that_advertises_them() {
        assert!(client_shows_notices(
            &json!({"clientCapabilities": {"session": {"notices": {}}}})
        ));
        for no in [
            json!({}),
            json!({"clientCapabilities": {"session": {}}}),
            json!({"clientCapabilities": {"session": {"notices": true}}}),
        ] {
            assert!(!client_shows_notices(&no), "{no}");
        }
    }
}
