//! The logic of the bundled example interceptor server (SPEC X1, issue 16), as a pure function
//! of one JSON-RPC message: request in, response line out. It is what the SEP-2624
//! conformance replay (`core/tests/sep2624.rs`) runs the `list-*` / `invoke-*` / `chain-*`
//! fixtures against in process, and what a stdio binary (`buzz-agent example-server
//! interceptors`, not built yet) only has to feed with lines.
//!
//! It speaks enough MCP to be spawned as an ordinary server (`initialize`, `ping`, an empty
//! `tools/list`) plus the two SEP-2624 methods, and implements the conformance suite's
//! behaviour vocabulary (`conformance/ADAPTER.md` of the working group's repository):
//!
//! | behavior | type | answer |
//! |---|---|---|
//! | `allow-all` | validation | always valid |
//! | `deny-all` | validation | invalid, severity `error`, message `denied by policy` |
//! | `require-note` | validation | valid iff `arguments.note` is a non-empty string, else `note is required` |
//! | `require-uppercase-note` | validation | valid iff `arguments.note` is a string equal to its upper case, else `note must be uppercase` |
//! | `uppercase-note` | mutation | upper-cases a string `arguments.note` (`modified: true`), else `modified: false` |
//! | `crash` | either (default validation) | JSON-RPC error -32603 |
//! | `deny-matching` | validation | invalid (severity `error`) when the payload, as compact JSON, contains the entry's `pattern`, with the message `the call matches the blocked pattern "<pattern>"` (a buzz-agent extension for the demo and policies; not in the conformance vocabulary) |
//!
//! The configuration is a JSON array of the suite's fixture interceptors:
//! `[{"name", "behavior", "type"?, "events"? (default ["tools/call"]), "phases"?
//! ("request"|"response"|"both", default "both"), "mode"?, "failOpen"?, "priorityHint"?,
//! "description"?, "pattern"? (for `deny-matching`)}]` (see [`ExampleServer::from_config`]).

use super::wire::{
    CAPABILITY_KEY, Hook, INVOKE_METHOD, Interceptor, InterceptorType, InvokeParams, InvokeResult,
    LIST_METHOD, ListResult, Mode, MutationResult, Phase, PriorityHint, Severity,
    ValidationMessage, ValidationResult, event_matches,
};
use crate::jsonrpc::{self, Message, RpcError, RpcId};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The `serverInfo.name` the example server reports.
pub const SERVER_NAME: &str = "buzz-agent-example-interceptors";

/// A behaviour of the conformance vocabulary (see the module docs for what each answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// `allow-all`
    AllowAll,
    /// `deny-all`
    DenyAll,
    /// `require-note`
    RequireNote,
    /// `require-uppercase-note`
    RequireUppercaseNote,
    /// `uppercase-note`
    UppercaseNote,
    /// `crash`
    Crash,
    /// `deny-matching` (a buzz-agent extension: denies payloads containing a pattern)
    DenyMatching,
}

impl Behavior {
    /// Every behaviour, in the vocabulary's order.
    pub const ALL: [Behavior; 7] = [
        Behavior::AllowAll,
        Behavior::DenyAll,
        Behavior::RequireNote,
        Behavior::RequireUppercaseNote,
        Behavior::UppercaseNote,
        Behavior::Crash,
        Behavior::DenyMatching,
    ];

    /// The vocabulary name, e.g. `deny-all`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::AllowAll => "allow-all",
            Behavior::DenyAll => "deny-all",
            Behavior::RequireNote => "require-note",
            Behavior::RequireUppercaseNote => "require-uppercase-note",
            Behavior::UppercaseNote => "uppercase-note",
            Behavior::Crash => "crash",
            Behavior::DenyMatching => "deny-matching",
        }
    }

    /// Reads a vocabulary name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Behavior> {
        Behavior::ALL.into_iter().find(|b| b.as_str() == s)
    }

    /// The interceptor type it implies; `None` for `crash`, which can stand for either.
    #[must_use]
    pub fn implied_type(self) -> Option<InterceptorType> {
        match self {
            Behavior::AllowAll
            | Behavior::DenyAll
            | Behavior::RequireNote
            | Behavior::RequireUppercaseNote
            | Behavior::DenyMatching => Some(InterceptorType::Validation),
            Behavior::UppercaseNote => Some(InterceptorType::Mutation),
            Behavior::Crash => None,
        }
    }
}

/// One interceptor the example server offers: its descriptor and what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleInterceptor {
    /// What `interceptors/list` reports.
    pub descriptor: Interceptor,
    /// What `interceptor/invoke` does.
    pub behavior: Behavior,
    /// The text `deny-matching` looks for (`None` for the other behaviours).
    pub pattern: Option<String>,
}

/// A configuration the example server refuses. `Display` is one line, e.g.
/// `interceptor 2: unknown behavior "secretless-redactor" (known: allow-all, …)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExampleConfigError(pub String);

/// The example interceptor server: a fixed list of interceptors, no state between requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleServer {
    interceptors: Vec<ExampleInterceptor>,
}

impl ExampleServer {
    /// A server offering `interceptors`, in this order. Errors on a duplicate name (names are
    /// what `interceptor/invoke` addresses) or a behaviour whose type contradicts the
    /// descriptor's.
    pub fn new(interceptors: Vec<ExampleInterceptor>) -> Result<ExampleServer, ExampleConfigError> {
        let mut seen = BTreeSet::new();
        for i in &interceptors {
            let name = &i.descriptor.name;
            if !seen.insert(name.as_str()) {
                return Err(ExampleConfigError(format!(
                    "duplicate interceptor name {name:?}"
                )));
            }
            if let Some(t) = i
                .behavior
                .implied_type()
                .filter(|t| *t != i.descriptor.kind)
            {
                return Err(ExampleConfigError(format!(
                    "interceptor {name:?}: behavior {} is a {} interceptor, not {}",
                    i.behavior.as_str(),
                    t.as_str(),
                    i.descriptor.kind.as_str()
                )));
            }
        }
        Ok(ExampleServer { interceptors })
    }

    /// A server from the JSON configuration of the module docs (the shape of a conformance
    /// fixture's `interceptors` array). Errors name the entry (1-based) and what is wrong:
    /// not an array, an entry without a string `name` or a known `behavior`, a bad `type`,
    /// `phases`, `events`, or `priorityHint`, and everything [`ExampleServer::new`] refuses.
    pub fn from_config(config: &Value) -> Result<ExampleServer, ExampleConfigError> {
        let Some(entries) = config.as_array() else {
            return Err(ExampleConfigError(
                "the configuration must be a JSON array of interceptors".into(),
            ));
        };
        let mut interceptors = Vec::new();
        for (n, entry) in entries.iter().enumerate() {
            let at = |what: String| ExampleConfigError(format!("interceptor {}: {what}", n + 1));
            interceptors.push(parse_entry(entry).map_err(at)?);
        }
        ExampleServer::new(interceptors)
    }

    /// The interceptors, in the order offered.
    #[must_use]
    pub fn interceptors(&self) -> &[ExampleInterceptor] {
        &self.interceptors
    }

    /// The `interceptors/list` answer: every interceptor in order, or with `event` those with
    /// a hook naming it (wildcards included; see [`event_matches`]), and with `phase` those with
    /// a hook on that phase. Never paginated.
    #[must_use]
    pub fn list(&self, event: Option<&str>, phase: Option<Phase>) -> ListResult {
        let keep = |i: &Interceptor| {
            i.hooks.iter().any(|h| {
                phase.is_none_or(|p| p == h.phase)
                    && event.is_none_or(|e| h.events.iter().any(|pat| event_matches(pat, e, phase)))
            })
        };
        ListResult {
            interceptors: self
                .interceptors
                .iter()
                .map(|i| &i.descriptor)
                .filter(|d| keep(d))
                .cloned()
                .collect(),
            rejected: Vec::new(),
            next_cursor: None,
        }
    }

    /// The `interceptor/invoke` answer: the wire result, or the JSON-RPC error: -32602 for
    /// params that do not decode or an unknown name (`Interceptor 'x' not found`), -32603 for
    /// `crash`.
    pub fn invoke(&self, params: &Value) -> Result<Value, RpcError> {
        let params = InvokeParams::from_value(params)
            .map_err(|e| RpcError::new(RpcError::INVALID_PARAMS, e.to_string()))?;
        let Some(entry) = self
            .interceptors
            .iter()
            .find(|i| i.descriptor.name == params.name)
        else {
            return Err(RpcError::new(
                RpcError::INVALID_PARAMS,
                format!("Interceptor '{}' not found", params.name),
            ));
        };
        run(entry, &params).map(|r| r.to_value())
    }

    /// Answers one decoded message: a response line (ending in `\n`) for a request, `None`
    /// for a notification or a response. Methods: `initialize`, `ping`, `tools/list` (empty),
    /// `interceptors/list`, `interceptor/invoke`; any other request gets -32601.
    #[must_use]
    pub fn handle_message(&self, message: &Message) -> Option<String> {
        let Message::Request { id, method, params } = message else {
            return None;
        };
        let answer = match method.as_str() {
            "initialize" => Ok(self.initialize_result(params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": []})),
            LIST_METHOD => self.list_answer(params),
            INVOKE_METHOD => self.invoke(params),
            other => Err(RpcError::new(
                RpcError::METHOD_NOT_FOUND,
                format!("Method not found: {other}"),
            )),
        };
        Some(respond(id, answer))
    }

    /// Answers one line as read from stdin (see [`ExampleServer::handle_message`]); a line
    /// that is not JSON-RPC gets -32700 or -32600 (T4).
    #[must_use]
    pub fn handle_line(&self, line: &[u8]) -> Option<String> {
        match jsonrpc::parse_message(line) {
            Ok(message) => self.handle_message(&message),
            Err(e) => Some(jsonrpc::encode_error(e.id(), &e.to_rpc_error())),
        }
    }

    fn initialize_result(&self, params: &Value) -> Value {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = asked
            .filter(|v| crate::mcp::ACCEPTED_MCP_VERSIONS.contains(v))
            .unwrap_or(crate::mcp::MCP_PROTOCOL_VERSION);
        let events: BTreeSet<&str> = self
            .interceptors
            .iter()
            .flat_map(|i| i.descriptor.hooks.iter())
            .flat_map(|h| h.events.iter().map(String::as_str))
            .collect();
        json!({
            "protocolVersion": version,
            "capabilities": {
                "tools": {},
                "extensions": { CAPABILITY_KEY: { "supportedEvents": events } },
            },
            "serverInfo": { "name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION") },
        })
    }

    fn list_answer(&self, params: &Value) -> Result<Value, RpcError> {
        let bad = |what: &str| RpcError::new(RpcError::INVALID_PARAMS, what.to_owned());
        let event = match params.get("event") {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) => Some(e.as_str()),
            Some(_) => return Err(bad("interceptors/list \"event\" must be a string")),
        };
        let phase = match params.get("phase") {
            None | Some(Value::Null) => None,
            Some(p) => Some(p.as_str().and_then(Phase::parse).ok_or_else(|| {
                bad("interceptors/list \"phase\" must be \"request\" or \"response\"")
            })?),
        };
        Ok(self.list(event, phase).to_value())
    }
}

fn respond(id: &RpcId, answer: Result<Value, RpcError>) -> String {
    match answer {
        Ok(result) => jsonrpc::encode_result(id, &result),
        Err(e) => jsonrpc::encode_error(Some(id), &e),
    }
}

/// `payload.arguments.note` when it is a string.
fn note(payload: &Value) -> Option<&str> {
    payload.get("arguments")?.get("note")?.as_str()
}

fn validation(name: &str, phase: Phase, refusal: Option<&str>) -> InvokeResult {
    InvokeResult::Validation(ValidationResult {
        interceptor: name.to_owned(),
        phase,
        valid: refusal.is_none(),
        severity: refusal.map(|_| Severity::Error),
        messages: refusal
            .map(|m| vec![ValidationMessage::new(m, Severity::Error)])
            .unwrap_or_default(),
        suggestions: Vec::new(),
        info: None,
    })
}

/// One invocation of one behaviour.
fn run(entry: &ExampleInterceptor, params: &InvokeParams) -> Result<InvokeResult, RpcError> {
    let name = entry.descriptor.name.as_str();
    let phase = params.phase;
    let payload = &params.payload;
    Ok(match entry.behavior {
        Behavior::AllowAll => validation(name, phase, None),
        Behavior::DenyAll => validation(name, phase, Some("denied by policy")),
        Behavior::RequireNote => {
            let ok = note(payload).is_some_and(|n| !n.is_empty());
            validation(name, phase, (!ok).then_some("note is required"))
        }
        Behavior::RequireUppercaseNote => {
            let ok = note(payload).is_some_and(|n| n == n.to_uppercase());
            validation(name, phase, (!ok).then_some("note must be uppercase"))
        }
        Behavior::UppercaseNote => {
            let mut changed = payload.clone();
            let upper = note(payload).map(str::to_uppercase);
            let slot = changed.get_mut("arguments").and_then(|a| a.get_mut("note"));
            let modified = match (slot, upper) {
                (Some(slot), Some(upper)) => {
                    *slot = Value::String(upper);
                    true
                }
                (Some(_) | None, _) => false,
            };
            InvokeResult::Mutation(MutationResult {
                interceptor: name.to_owned(),
                phase,
                modified,
                payload: if modified { changed } else { payload.clone() },
                info: None,
            })
        }
        Behavior::Crash => {
            return Err(RpcError::new(
                RpcError::INTERNAL_ERROR,
                format!("interceptor '{name}' crashed"),
            ));
        }
        Behavior::DenyMatching => {
            let pattern = entry.pattern.as_deref().unwrap_or_default();
            let hit = !pattern.is_empty() && payload.to_string().contains(pattern);
            let message = format!("the call matches the blocked pattern {pattern:?}");
            validation(name, phase, hit.then_some(message.as_str()))
        }
    })
}

/// One configuration entry (see [`ExampleServer::from_config`]).
fn parse_entry(v: &Value) -> Result<ExampleInterceptor, String> {
    let Value::Object(o) = v else {
        return Err("must be an object".into());
    };
    let name = match o.get("name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(_) | None => return Err("needs a non-empty string \"name\"".into()),
    };
    let known: Vec<&str> = Behavior::ALL.iter().map(|b| b.as_str()).collect();
    let behavior = match o.get("behavior").and_then(Value::as_str) {
        Some(b) => Behavior::parse(b)
            .ok_or_else(|| format!("unknown behavior {b:?} (known: {})", known.join(", ")))?,
        None => {
            return Err(format!(
                "needs a string \"behavior\" ({})",
                known.join(", ")
            ));
        }
    };
    let kind = match o.get("type") {
        None | Some(Value::Null) => behavior
            .implied_type()
            .unwrap_or(InterceptorType::Validation),
        Some(t) => t
            .as_str()
            .and_then(InterceptorType::parse)
            .ok_or("\"type\" must be \"validation\" or \"mutation\"")?,
    };
    let events: Vec<String> = match o.get("events") {
        None | Some(Value::Null) => vec![super::wire::TOOLS_CALL.to_owned()],
        Some(Value::Array(es)) if !es.is_empty() && es.iter().all(Value::is_string) => es
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(_) => return Err("\"events\" must be a non-empty array of strings".into()),
    };
    let phases: &[Phase] = match o.get("phases").and_then(Value::as_str) {
        None | Some("both") => &[Phase::Request, Phase::Response],
        Some("request") => &[Phase::Request],
        Some("response") => &[Phase::Response],
        Some(other) => {
            return Err(format!(
                "\"phases\" must be \"request\", \"response\" or \"both\", got {other:?}"
            ));
        }
    };
    let hooks = phases
        .iter()
        .map(|&phase| Hook {
            events: events.clone(),
            phase,
        })
        .collect();
    let mut descriptor = Interceptor::new(name, kind, hooks);
    descriptor.mode = o
        .get("mode")
        .and_then(Value::as_str)
        .map_or(Mode::Enforce, Mode::parse_lenient);
    descriptor.fail_open = o.get("failOpen") == Some(&Value::Bool(true));
    descriptor.description = o
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(p) = o.get("priorityHint").filter(|p| !p.is_null()) {
        descriptor.priority_hint = Some(PriorityHint::from_value(p).map_err(|e| e.to_string())?);
    }
    let pattern = match (behavior, o.get("pattern")) {
        (Behavior::DenyMatching, Some(Value::String(p))) if !p.is_empty() => Some(p.clone()),
        (Behavior::DenyMatching, _) => {
            return Err("behavior deny-matching needs a non-empty string \"pattern\"".into());
        }
        (_, _) => None,
    };
    Ok(ExampleInterceptor {
        descriptor,
        behavior,
        pattern,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(config: Value) -> ExampleServer {
        ExampleServer::from_config(&config).unwrap()
    }

    fn ask(s: &ExampleServer, line: &str) -> Value {
        let out = s.handle_line(line.as_bytes()).unwrap();
        assert!(
            out.ends_with('\n') && !out.trim_end().contains('\n'),
            "{out}"
        );
        serde_json::from_str(&out).unwrap()
    }

    #[test]
    fn x1_it_answers_the_mcp_handshake_and_advertises_the_interceptors_extension() {
        let s = server(json!([
            {"name": "a", "behavior": "allow-all", "events": ["tools/call", "*"]},
            {"name": "b", "behavior": "uppercase-note"}
        ]));
        let init = ask(
            &s,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#,
        );
        assert_eq!(init["id"], 1);
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(init["result"]["serverInfo"]["name"], SERVER_NAME);
        assert_eq!(
            init["result"]["capabilities"]["extensions"][CAPABILITY_KEY]["supportedEvents"],
            json!(["*", "tools/call"])
        );
        let odd = ask(
            &s,
            r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}"#,
        );
        assert_eq!(
            odd["result"]["protocolVersion"],
            crate::mcp::MCP_PROTOCOL_VERSION
        );
        assert_eq!(
            ask(&s, r#"{"jsonrpc":"2.0","id":"t","method":"tools/list"}"#)["result"],
            json!({"tools": []})
        );
        assert_eq!(
            ask(&s, r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)["result"],
            json!({})
        );
        assert_eq!(
            s.handle_line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
        assert_eq!(
            s.handle_line(br#"{"jsonrpc":"2.0","id":9,"result":{}}"#),
            None
        );
        let unknown = ask(
            &s,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}"#,
        );
        assert_eq!(unknown["error"]["code"], RpcError::METHOD_NOT_FOUND);
        assert_eq!(ask(&s, "not json")["error"]["code"], RpcError::PARSE_ERROR);
    }

    #[test]
    fn x1_list_filters_by_event_and_phase() {
        let s = server(json!([
            {"name": "req", "behavior": "allow-all", "phases": "request"},
            {"name": "any", "behavior": "deny-all", "events": ["*"]},
            {"name": "prompts", "behavior": "allow-all", "events": ["prompts/*"], "phases": "response"}
        ]));
        let names =
            |r: ListResult| -> Vec<String> { r.interceptors.into_iter().map(|i| i.name).collect() };
        assert_eq!(names(s.list(None, None)), ["req", "any", "prompts"]);
        assert_eq!(names(s.list(Some("tools/call"), None)), ["req", "any"]);
        assert_eq!(names(s.list(Some("prompts/get"), None)), ["any", "prompts"]);
        assert_eq!(
            names(s.list(Some("tools/call"), Some(Phase::Response))),
            ["any"]
        );
        assert_eq!(names(s.list(None, Some(Phase::Request))), ["req", "any"]);
        let bad = ask(
            &s,
            r#"{"jsonrpc":"2.0","id":1,"method":"interceptors/list","params":{"phase":"both"}}"#,
        );
        assert_eq!(bad["error"]["code"], RpcError::INVALID_PARAMS);
    }

    #[test]
    fn x1_behaviours_answer_as_the_conformance_vocabulary_says() {
        let s = server(json!([
            {"name": "note", "behavior": "require-note"},
            {"name": "upper", "behavior": "require-uppercase-note"},
            {"name": "shout", "behavior": "uppercase-note"},
            {"name": "boom", "behavior": "crash", "type": "mutation"}
        ]));
        let invoke = |name: &str, args: Value| {
            s.invoke(
                &json!({"name": name, "event": "tools/call", "phase": "response",
                "payload": {"name": "echo", "arguments": args}}),
            )
        };
        let denied = |r: Result<Value, RpcError>| r.unwrap()["messages"][0]["message"].clone();
        assert_eq!(invoke("note", json!({"note": "x"})).unwrap()["valid"], true);
        assert_eq!(
            denied(invoke("note", json!({"note": ""}))),
            "note is required"
        );
        assert_eq!(
            denied(invoke("note", json!({"note": 5}))),
            "note is required"
        );
        assert_eq!(
            invoke("upper", json!({"note": "ÉTÉ 1"})).unwrap()["valid"],
            true
        );
        assert_eq!(
            denied(invoke("upper", json!({"note": "été"}))),
            "note must be uppercase"
        );
        assert_eq!(denied(invoke("upper", json!({}))), "note must be uppercase");
        let shouted = invoke("shout", json!({"note": "été", "keep": 1})).unwrap();
        assert_eq!(shouted["modified"], true);
        assert_eq!(shouted["phase"], "response");
        assert_eq!(
            shouted["payload"]["arguments"],
            json!({"note": "ÉTÉ", "keep": 1})
        );
        let same = invoke("shout", json!({"note": ["not", "a", "string"]})).unwrap();
        assert_eq!(same["modified"], false);
        assert_eq!(
            same["payload"]["arguments"]["note"],
            json!(["not", "a", "string"])
        );
        let crash = invoke("boom", json!({})).unwrap_err();
        assert_eq!(crash.code, RpcError::INTERNAL_ERROR);
        let missing = s
            .invoke(&json!({"name": "nope", "event": "e", "phase": "request"}))
            .unwrap_err();
        assert_eq!(
            (missing.code, missing.message.as_str()),
            (RpcError::INVALID_PARAMS, "Interceptor 'nope' not found")
        );
        let bad = s
            .invoke(&json!({"name": "note", "phase": "request"}))
            .unwrap_err();
        assert_eq!(bad.code, RpcError::INVALID_PARAMS);
    }

    #[test]
    fn x1_a_bad_configuration_is_one_clear_error() {
        for (config, want) in [
            (json!({}), "must be a JSON array"),
            (
                json!([{"behavior": "allow-all"}]),
                "interceptor 1: needs a non-empty string \"name\"",
            ),
            (
                json!([{"name": "a", "behavior": "secretless-redactor"}]),
                "unknown behavior \"secretless-redactor\" (known: allow-all,",
            ),
            (json!([{"name": "a"}]), "needs a string \"behavior\""),
            (
                json!([{"name": "a", "behavior": "deny-all", "type": "mutation"}]),
                "behavior deny-all is a validation interceptor, not mutation",
            ),
            (
                json!([{"name": "a", "behavior": "crash", "type": "checker"}]),
                "\"type\" must be",
            ),
            (
                json!([{"name": "a", "behavior": "crash", "events": []}]),
                "\"events\" must be a non-empty array",
            ),
            (
                json!([{"name": "a", "behavior": "crash", "phases": "always"}]),
                "\"phases\" must be",
            ),
            (
                json!([{"name": "a", "behavior": "crash", "priorityHint": "first"}]),
                "\"priorityHint\" must be",
            ),
            (
                json!([{"name": "a", "behavior": "crash"}, {"name": "a", "behavior": "allow-all"}]),
                "duplicate interceptor name \"a\"",
            ),
            (
                json!([{"name": "a", "behavior": "deny-matching"}]),
                "behavior deny-matching needs a non-empty string \"pattern\"",
            ),
        ] {
            let e = ExampleServer::from_config(&config).unwrap_err();
            assert!(e.to_string().contains(want), "{config}: {e}");
        }
        let s = server(
            json!([{"name": "a", "behavior": "uppercase-note", "mode": "audit",
            "failOpen": true, "priorityHint": -3, "description": "shouts"}]),
        );
        let d = &s.interceptors()[0].descriptor;
        assert_eq!(
            (d.mode, d.fail_open, d.priority(Phase::Request)),
            (Mode::Audit, true, -3)
        );
        assert_eq!(d.kind, InterceptorType::Mutation);
        assert_eq!(d.description.as_deref(), Some("shouts"));
    }

    #[test]
    fn x1_deny_matching_denies_payloads_that_contain_its_pattern() {
        let s =
            server(json!([{"name": "no-rm", "behavior": "deny-matching", "pattern": "rm -rf"}]));
        let invoke = |args: Value| {
            s.invoke(
                &json!({"name": "no-rm", "event": "tools/call", "phase": "request",
                "payload": {"name": "shell", "arguments": args}}),
            )
            .unwrap()
        };
        let denied = invoke(json!({"command": "rm -rf /tmp/x"}));
        assert_eq!(denied["valid"], false);
        assert_eq!(
            denied["messages"][0]["message"],
            "the call matches the blocked pattern \"rm -rf\""
        );
        assert_eq!(invoke(json!({"command": "ls"}))["valid"], true);
    }

    #[test]
    fn x1_interceptors_list_over_json_rpc_answers_the_filtered_descriptors() {
        let s = server(json!([
            {"name": "req", "behavior": "allow-all", "phases": "request"},
            {"name": "prompts", "behavior": "deny-all", "events": ["prompts/get"]}
        ]));
        let all = ask(
            &s,
            r#"{"jsonrpc":"2.0","id":1,"method":"interceptors/list","params":{}}"#,
        );
        assert_eq!(all["result"], s.list(None, None).to_value());
        let filtered = ask(
            &s,
            r#"{"jsonrpc":"2.0","id":2,"method":"interceptors/list","params":{"event":"tools/call","phase":"request"}}"#,
        );
        assert_eq!(
            filtered["result"],
            json!({"interceptors": [{"name": "req", "type": "validation",
                "hooks": [{"events": ["tools/call"], "phase": "request"}]}]})
        );
    }

    #[test]
    fn x1_an_empty_name_or_an_empty_deny_pattern_is_refused() {
        for (config, want) in [
            (
                json!([{"name": "", "behavior": "allow-all"}]),
                "interceptor 1: needs a non-empty string \"name\"",
            ),
            (
                json!([{"name": "a", "behavior": "deny-matching", "pattern": ""}]),
                "behavior deny-matching needs a non-empty string \"pattern\"",
            ),
        ] {
            let e = ExampleServer::from_config(&config).unwrap_err();
            assert!(e.to_string().contains(want), "{config}: {e}");
        }
    }
}
