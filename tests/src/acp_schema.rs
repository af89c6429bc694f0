//! The ACP schema check of the suite (issue 12): every frame the agent writes on stdout is
//! validated against the official ACP JSON schema, protocol version 1, vendored from the
//! official TypeScript SDK (`tests/schema/acp/`, see its README for the version and license).
//!
//! Each frame is checked twice: against its envelope (`AgentRequest`, `AgentNotification` or
//! `AgentResponse`: `jsonrpc`, `id`, an error object's shape) and against the definition of its
//! method, found by the schema's own `x-method` / `x-side` annotations: a request's `params`
//! (an agent→client request, `x-side: client`, `…Request`), a notification's `params`
//! (`…Notification`), a response's `result` (`x-side: agent`, `…Response`, for the method of the
//! request it answers, which the caller passes). The envelopes alone would accept nearly
//! anything: their `params`/`result` unions include the extension types, which are open.
//!
//! A response whose request method the schema does not know (a test's deliberately unknown
//! method, answered with an error) is checked against its envelope only and counted as
//! [`Counts::unmapped`].

use jsonschema::Validator;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The schema file, compiled in: a fresh clone always has it.
const SCHEMA: &str = include_str!("../schema/acp/v1/schema.json");
/// Where [`SCHEMA`] comes from, for messages.
pub const SCHEMA_SOURCE: &str = "ACP schema v1 of @agentclientprotocol/sdk 2.4.0";

/// Most schema errors quoted per frame.
const MAX_ERRORS_SHOWN: usize = 3;
/// Longest frame quoted in a violation, bytes.
const MAX_FRAME_SHOWN: usize = 600;

struct Schema {
    request: Validator,
    notification: Validator,
    response: Validator,
    /// `params` of agent→client requests, by method: (definition name, validator).
    requests: HashMap<String, (String, Validator)>,
    /// `params` of agent→client notifications, by method.
    notifications: HashMap<String, (String, Validator)>,
    /// `result` of client→agent requests, by method.
    results: HashMap<String, (String, Validator)>,
}

/// A validator for `#/$defs/<name>` of the whole schema.
fn validator(root: &Value, name: &str) -> Validator {
    let mut schema = root.clone();
    let obj = schema.as_object_mut().expect("the ACP schema is an object");
    obj.remove("anyOf");
    obj.insert("$ref".into(), json!(format!("#/$defs/{name}")));
    jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("{SCHEMA_SOURCE}: cannot compile #/$defs/{name}: {e}"))
}

fn schema() -> &'static Schema {
    static SCHEMA_ONCE: OnceLock<Schema> = OnceLock::new();
    SCHEMA_ONCE.get_or_init(|| {
        let root: Value = serde_json::from_str(SCHEMA).expect("the vendored ACP schema is JSON");
        let defs = root["$defs"].as_object().expect("the ACP schema has $defs");
        let mut requests = HashMap::new();
        let mut notifications = HashMap::new();
        let mut results = HashMap::new();
        for (name, def) in defs {
            let (Some(method), Some(side)) = (def["x-method"].as_str(), def["x-side"].as_str())
            else {
                continue;
            };
            let table = match side {
                "client" if name.ends_with("Request") => &mut requests,
                "client" if name.ends_with("Notification") => &mut notifications,
                "agent" if name.ends_with("Response") => &mut results,
                _ => continue,
            };
            table.insert(method.to_string(), (name.clone(), validator(&root, name)));
        }
        Schema {
            request: validator(&root, "AgentRequest"),
            notification: validator(&root, "AgentNotification"),
            response: validator(&root, "AgentResponse"),
            requests,
            notifications,
            results,
        }
    })
}

static VALIDATED: AtomicU64 = AtomicU64::new(0);
static INVALID: AtomicU64 = AtomicU64::new(0);
static UNMAPPED: AtomicU64 = AtomicU64::new(0);

/// How many frames this process validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Frames checked (envelope and, where known, method).
    pub validated: u64,
    /// Frames with at least one schema violation.
    pub invalid: u64,
    /// Responses checked against their envelope only (the request's method is not in the
    /// schema, or unknown: an `id: null` answer, an answer to a line the client never sent).
    pub unmapped: u64,
}

/// The counts so far, over every agent of this process.
pub fn counts() -> Counts {
    Counts {
        validated: VALIDATED.load(Ordering::Relaxed),
        invalid: INVALID.load(Ordering::Relaxed),
        unmapped: UNMAPPED.load(Ordering::Relaxed),
    }
}

fn errors(v: &Validator, instance: &Value, what: &str) -> Vec<String> {
    v.iter_errors(instance)
        .take(MAX_ERRORS_SHOWN)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "/".to_string() } else { at };
            format!("{what} at {at}: {e}")
        })
        .collect()
}

/// Validates one frame the agent wrote (already known to be a JSON-RPC 2.0 object).
/// `request_method`: for a response, the method of the client request it answers, when known.
/// Returns the violations, each one line naming the definition and the place; empty when the
/// frame is valid.
pub fn check_agent_frame(frame: &Value, request_method: Option<&str>) -> Vec<String> {
    let s = schema();
    let method = frame.get("method").and_then(Value::as_str);
    let has_id = frame.get("id").is_some();
    let params = frame.get("params").unwrap_or(&Value::Null);
    let mut out = Vec::new();
    match (method, has_id) {
        (Some(m), true) => {
            out.extend(errors(&s.request, frame, "AgentRequest"));
            match s.requests.get(m) {
                Some((name, v)) => out.extend(errors(v, params, name)),
                None if m.starts_with('_') => {}
                None => out.push(format!(
                    "agent→client request method {m:?} is not in the ACP schema"
                )),
            }
        }
        (Some(m), false) => {
            out.extend(errors(&s.notification, frame, "AgentNotification"));
            match s.notifications.get(m) {
                Some((name, v)) => out.extend(errors(v, params, name)),
                None if m.starts_with('_') => {}
                None => out.push(format!(
                    "agent→client notification method {m:?} is not in the ACP schema"
                )),
            }
        }
        (None, _) => {
            out.extend(errors(&s.response, frame, "AgentResponse"));
            match (
                frame.get("result"),
                request_method.and_then(|m| s.results.get(m)),
            ) {
                (Some(result), Some((name, v))) => out.extend(errors(v, result, name)),
                (Some(_), None) => {
                    UNMAPPED.fetch_add(1, Ordering::Relaxed);
                }
                (None, _) => {}
            }
        }
    }
    VALIDATED.fetch_add(1, Ordering::Relaxed);
    if !out.is_empty() {
        INVALID.fetch_add(1, Ordering::Relaxed);
        let text = frame.to_string();
        let cut = text
            .char_indices()
            .nth(MAX_FRAME_SHOWN)
            .map_or(text.len(), |(i, _)| i);
        out.push(format!("in frame: {}", &text[..cut]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_maps_the_methods_the_agent_uses() {
        let s = schema();
        for m in [
            "initialize",
            "session/new",
            "session/prompt",
            "session/load",
        ] {
            assert!(s.results.contains_key(m), "{m}");
        }
        assert!(s.requests.contains_key("session/request_permission"));
        assert!(s.notifications.contains_key("session/update"));
    }

    #[test]
    fn valid_frames_pass_and_broken_ones_are_named() {
        let ok = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}});
        assert_eq!(check_agent_frame(&ok, None), Vec::<String>::new());
        let bad = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
            "update": {"sessionUpdate": "tool_call", "toolCallId": "c", "title": "t", "status": "weird"}}});
        let v = check_agent_frame(&bad, None);
        assert!(
            v.iter()
                .any(|l| l.starts_with("SessionNotification at /update")),
            "{v:#?}"
        );
        let prompt = json!({"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}});
        assert!(check_agent_frame(&prompt, Some("session/prompt")).is_empty());
        let wrong = json!({"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "done"}});
        assert!(!check_agent_frame(&wrong, Some("session/prompt")).is_empty());
        let error = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "Parse error"}});
        assert!(check_agent_frame(&error, None).is_empty());
        let no_message = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32700}});
        assert!(!check_agent_frame(&no_message, None).is_empty());
        let unknown = json!({"jsonrpc": "2.0", "id": 9, "method": "fs/delete", "params": {}});
        assert!(
            check_agent_frame(&unknown, None)
                .iter()
                .any(|l| l.contains("not in the ACP schema"))
        );
    }
}
