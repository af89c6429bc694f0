//! Elicitation (SPEC M12; MCP 2025-11-25 client/elicitation; ACP v1 elicitation): an MCP
//! server asks the user for input with `elicitation/create`; the agent forwards it to the ACP
//! client as its own `elicitation/create` when the client presents that mode, and sends the
//! client's answer back to the server. The model never sees either.
//!
//! ```text
//!  MCP server ── elicitation/create {mode?, message, requestedSchema | url, elicitationId} ──▶ agent
//!     client presents the mode ──▶ ACP elicitation/create {sessionId, mode, message, …} ──▶ client
//!                                  ◀── {action: accept {content} | decline | cancel} ──
//!     accept: omitted fields get their schema `default`s
//!  MCP server ◀── {action, content?} ──────────────────────────────────────────────────────── agent
//!     client without the mode ──▶ {action: "decline"} at once
//! ```
//!
//! This file is the pure part: which modes the client presents, the MCP capability declared
//! from them, the server's request checked and turned into the ACP request, the client's
//! answer turned into the server's (defaults filled), and the table of ACP requests in flight.
//! The agent's router sends these requests on; the MCP session answers the server.

use crate::ids::{PermissionRequestId, ServerSlot, SessionId};
use crate::jsonrpc::RpcId;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The most ACP elicitation requests waiting for the client at once (all sessions); a server
/// asking beyond it is answered `decline` (docs/limits.md).
pub(crate) const MAX_PENDING: usize = 32;

/// The property types a form may ask for (MCP 2025-11-25 `PrimitiveSchemaDefinition`: flat,
/// no nested objects; `array` is the multi-select enum).
const FORM_TYPES: [&str; 5] = ["string", "number", "integer", "boolean", "array"];

/// The elicitation modes the ACP client presents: `clientCapabilities.elicitation.form` and
/// `.url`, each present only as an object (ACP v1: `{}` or `null` at the top, or a `null`
/// mode, advertise nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ElicitationModes {
    /// Form mode (a schema the client renders as a form).
    pub(crate) form: bool,
    /// URL mode (a URL the user opens out of band; also the M11 login).
    pub(crate) url: bool,
}

impl ElicitationModes {
    /// The modes of the ACP `initialize` params `params`.
    pub(crate) fn of_client(params: &Value) -> ElicitationModes {
        let mode = |m: &str| {
            params
                .pointer(&format!("/clientCapabilities/elicitation/{m}"))
                .is_some_and(Value::is_object)
        };
        ElicitationModes {
            form: mode("form"),
            url: mode("url"),
        }
    }

    /// The MCP `capabilities.elicitation` the agent declares to its servers: the modes it can
    /// forward (`{"form": {}}`, `{"url": {}}` or both), `None` when the client presents none.
    pub(crate) fn mcp_capability(self) -> Option<Value> {
        let mut modes = Map::new();
        if self.form {
            modes.insert("form".into(), json!({}));
        }
        if self.url {
            modes.insert("url".into(), json!({}));
        }
        (!modes.is_empty()).then_some(Value::Object(modes))
    }
}

/// A server's `elicitation/create`, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ask {
    /// Form mode (`mode` `"form"` or omitted, MCP 2025-06-18 servers): `message` and the flat
    /// object schema of the fields.
    Form { message: String, schema: Value },
    /// URL mode: the user opens `url`; `elicitation_id` names the interaction.
    Url {
        message: String,
        url: String,
        elicitation_id: String,
    },
}

impl Ask {
    /// The mode's name as on the wire.
    pub(crate) fn mode(&self) -> &'static str {
        match self {
            Ask::Form { .. } => "form",
            Ask::Url { .. } => "url",
        }
    }

    /// The request's `message` (what the server asks for).
    pub(crate) fn message(&self) -> &str {
        match self {
            Ask::Form { message, .. } | Ask::Url { message, .. } => message,
        }
    }

    /// Whether the client presents this request's mode.
    pub(crate) fn presentable(&self, modes: ElicitationModes) -> bool {
        match self {
            Ask::Form { .. } => modes.form,
            Ask::Url { .. } => modes.url,
        }
    }

    /// The params of the ACP `elicitation/create` for session `session` (the ACP session id):
    /// `{sessionId, mode, message, requestedSchema}` or `{sessionId, mode: "url", message,
    /// url, elicitationId}`.
    pub(crate) fn acp_params(&self, session: &str) -> Value {
        match self {
            Ask::Form { message, schema } => json!({
                "sessionId": session,
                "mode": "form",
                "message": message,
                "requestedSchema": schema,
            }),
            Ask::Url {
                message,
                url,
                elicitation_id,
            } => json!({
                "sessionId": session,
                "mode": "url",
                "message": message,
                "url": url,
                "elicitationId": elicitation_id,
            }),
        }
    }
}

/// Decodes the params of a server's `elicitation/create` (MCP 2025-11-25).
///
/// # Errors
/// The reason, for a `-32602` answer to the server: no `message`, an unknown `mode`, a form
/// schema that is not a flat object of primitive fields, a URL request without `url` or
/// `elicitationId`.
pub(crate) fn decode(params: &Value) -> Result<Ask, String> {
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .ok_or("elicitation/create needs a string message")?
        .to_string();
    match params.get("mode").and_then(Value::as_str).unwrap_or("form") {
        "form" => {
            let schema = params
                .get("requestedSchema")
                .filter(|s| s.is_object())
                .ok_or("a form elicitation needs a requestedSchema object")?;
            if schema.get("type").is_some_and(|t| t != "object") {
                return Err("requestedSchema must be of type object".into());
            }
            let props = match schema.get("properties") {
                None | Some(Value::Null) => None,
                Some(Value::Object(p)) => Some(p),
                Some(_) => return Err("requestedSchema.properties must be an object".into()),
            };
            for (name, prop) in props.into_iter().flatten() {
                let ty = prop.get("type").and_then(Value::as_str).unwrap_or("");
                if !FORM_TYPES.contains(&ty) {
                    return Err(format!(
                        "requestedSchema.properties.{name} must be a string, number, integer, boolean or array field"
                    ));
                }
            }
            Ok(Ask::Form {
                message,
                schema: schema.clone(),
            })
        }
        "url" => {
            let field = |f: &str| {
                params
                    .get(f)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .ok_or(format!("a URL elicitation needs a string {f}"))
            };
            Ok(Ask::Url {
                message,
                url: field("url")?,
                elicitation_id: field("elicitationId")?,
            })
        }
        other => Err(format!("unknown elicitation mode '{other}'")),
    }
}

/// The answer `{"action": "decline"}` (a client without the mode, SPEC M12).
pub(crate) fn declined() -> Value {
    json!({"action": "decline"})
}

/// The server's answer from the ACP client's `result` to a request of `ask`: `accept` with its
/// `content` (for a form, each field the user left out that has a schema `default` gets it;
/// for a URL, no content), `decline`, or `cancel` (also for an action the agent does not know,
/// which it must not take for a known one).
pub(crate) fn answer(result: &Value, ask: &Ask) -> Value {
    match result.get("action").and_then(Value::as_str) {
        Some("accept") => match ask {
            Ask::Form { schema, .. } => {
                let mut content = result
                    .get("content")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                fill_defaults(&mut content, schema);
                json!({"action": "accept", "content": content})
            }
            Ask::Url { .. } => json!({"action": "accept"}),
        },
        Some("decline") => declined(),
        _ => json!({"action": "cancel"}),
    }
}

/// Gives each property of `schema` that `content` lacks (or has as `null`) its `default`, if
/// the schema has one (MCP 2025-11-25, SEP-1034: defaults for primitive fields).
pub(crate) fn fill_defaults(content: &mut Map<String, Value>, schema: &Value) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, prop) in props {
        let Some(default) = prop.get("default").filter(|d| !d.is_null()) else {
            continue;
        };
        if content.get(name).is_none_or(Value::is_null) {
            content.insert(name.clone(), default.clone());
        }
    }
}

/// An ACP `elicitation/create` waiting for the client: whose request it answers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pending {
    /// The ACP session it was shown in.
    pub(crate) session: SessionId,
    /// The server that asked, and the generation of its MCP session (an answer for a
    /// restarted server is dropped).
    pub(crate) server: ServerSlot,
    pub(crate) generation: u64,
    /// The server's request id, echoed in the answer.
    pub(crate) request: RpcId,
    /// The request, to read the answer against.
    pub(crate) ask: Ask,
}

/// The ACP elicitation requests in flight, by their JSON-RPC id (one counter with the
/// permission requests: [`crate::ids::IdCounters::next_permission`]).
#[derive(Debug, Default)]
pub(crate) struct Elicitations {
    pending: BTreeMap<PermissionRequestId, Pending>,
}

impl Elicitations {
    /// Whether another request may wait ([`MAX_PENDING`]).
    pub(crate) fn has_room(&self) -> bool {
        self.pending.len() < MAX_PENDING
    }

    /// Records request `id`.
    pub(crate) fn insert(&mut self, id: PermissionRequestId, pending: Pending) {
        self.pending.insert(id, pending);
    }

    /// Removes request `id` (answered); `None` when it is not ours or no longer waits.
    pub(crate) fn take(&mut self, id: PermissionRequestId) -> Option<Pending> {
        self.pending.remove(&id)
    }

    /// Forgets the requests of `session` (it closed): a later answer is dropped.
    pub(crate) fn forget_session(&mut self, session: SessionId) {
        self.pending.retain(|_, p| p.session != session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m12_modes_are_objects_only_and_the_capability_declares_what_can_be_forwarded() {
        let modes = |caps: Value| ElicitationModes::of_client(&json!({"clientCapabilities": caps}));
        assert_eq!(modes(json!({})), ElicitationModes::default());
        assert_eq!(
            modes(json!({"elicitation": {}})),
            ElicitationModes::default()
        );
        assert_eq!(
            modes(json!({"elicitation": {"form": null, "url": true}})),
            ElicitationModes::default(),
            "ACP: null or non-object modes advertise nothing"
        );
        let form = modes(json!({"elicitation": {"form": {}}}));
        assert_eq!(
            form,
            ElicitationModes {
                form: true,
                url: false
            }
        );
        assert_eq!(form.mcp_capability(), Some(json!({"form": {}})));
        let both = modes(json!({"elicitation": {"form": {}, "url": {}}}));
        assert_eq!(both.mcp_capability(), Some(json!({"form": {}, "url": {}})));
        assert_eq!(ElicitationModes::default().mcp_capability(), None);
    }

    #[test]
    fn m12_a_form_request_needs_a_flat_object_schema_and_a_url_request_its_id() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"}, "n": {"type": "integer", "default": 3}}});
        let ask = decode(&json!({"message": "who?", "requestedSchema": schema})).unwrap();
        assert_eq!(
            ask.mode(),
            "form",
            "an omitted mode is form (MCP 2025-06-18)"
        );
        assert_eq!(
            ask.acp_params("s1"),
            json!({"sessionId": "s1", "mode": "form", "message": "who?", "requestedSchema": schema})
        );
        let url = decode(&json!({"mode": "url", "message": "log in",
            "url": "https://x/login", "elicitationId": "e1"}))
        .unwrap();
        assert_eq!(
            url.acp_params("s1"),
            json!({"sessionId": "s1", "mode": "url", "message": "log in",
                   "url": "https://x/login", "elicitationId": "e1"})
        );
        for (bad, why) in [
            (json!({"requestedSchema": {}}), "message"),
            (json!({"message": "m"}), "requestedSchema"),
            (
                json!({"message": "m", "requestedSchema": {"type": "array"}}),
                "type object",
            ),
            (
                json!({"message": "m", "requestedSchema": {"properties": {
                    "deep": {"type": "object", "properties": {}}}}}),
                "properties.deep",
            ),
            (
                json!({"mode": "url", "message": "m", "url": "https://x"}),
                "elicitationId",
            ),
            (
                json!({"mode": "voice", "message": "m"}),
                "unknown elicitation mode 'voice'",
            ),
        ] {
            let e = decode(&bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn m12_an_accepted_form_gets_the_defaults_of_the_fields_left_out() {
        let ask = decode(
            &json!({"message": "m", "requestedSchema": {"type": "object",
            "properties": {
                "name": {"type": "string", "default": "anon"},
                "age": {"type": "integer", "default": 30},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]},
                         "default": ["a"]},
                "ok": {"type": "boolean"},
                "color": {"type": "string", "enum": ["red", "blue"], "default": "blue"}
            }}}),
        )
        .unwrap();
        let got = answer(
            &json!({"action": "accept", "content": {"name": "Ann", "color": null}}),
            &ask,
        );
        assert_eq!(
            got,
            json!({"action": "accept", "content": {
                "name": "Ann", "age": 30, "tags": ["a"], "color": "blue"}}),
            "a given value stays; omitted and null fields with a default get it; none: left out"
        );
        assert_eq!(
            answer(&json!({"action": "accept"}), &ask)["content"]["age"],
            30,
            "no content at all"
        );
        assert_eq!(answer(&json!({"action": "decline"}), &ask), declined());
        assert_eq!(
            answer(&json!({"action": "cancel"}), &ask),
            json!({"action": "cancel"})
        );
        assert_eq!(
            answer(&json!({"action": "_custom"}), &ask),
            json!({"action": "cancel"}),
            "an unknown action is never taken for a known one"
        );
        let url = decode(&json!({"mode": "url", "message": "m", "url": "https://x",
            "elicitationId": "e"}))
        .unwrap();
        assert_eq!(
            answer(&json!({"action": "accept", "content": {"x": 1}}), &url),
            json!({"action": "accept"})
        );
    }

    #[test]
    fn m12_the_table_is_bounded_and_a_closed_session_forgets_its_requests() {
        let mut t = Elicitations::default();
        let ask = decode(&json!({"message": "m", "requestedSchema": {}})).unwrap();
        let pending = |session| Pending {
            session: SessionId(session),
            server: ServerSlot(1),
            generation: 0,
            request: serde_json::from_value(json!(1)).unwrap(),
            ask: ask.clone(),
        };
        for i in 0..MAX_PENDING as u64 {
            assert!(t.has_room());
            t.insert(PermissionRequestId(i), pending(u128::from(i % 2)));
        }
        assert!(!t.has_room());
        t.forget_session(SessionId(0));
        assert!(t.take(PermissionRequestId(0)).is_none());
        assert_eq!(t.take(PermissionRequestId(1)), Some(pending(1)));
        assert!(t.take(PermissionRequestId(1)).is_none(), "I6: once");
    }
}
