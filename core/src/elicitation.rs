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

/// Where the ACP `elicitation/create` of a login belongs (ACP v1 elicitation scopes): the
/// session of the server, or, while that session is not answered yet, the `session/new` (or
/// load) request that opens it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LoginScope {
    /// An open session (its ACP id).
    Session(String),
    /// The request opening the session.
    Request(RpcId),
}

/// How the user is asked to open a server's authorization URL (SPEC M11).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LoginAsk {
    /// The client presents URL mode: the params of the ACP `elicitation/create`.
    Elicit(Value),
    /// It does not: a notice carrying the URL (and `$BROWSER`, when set).
    Notice(String),
}

/// How to ask the user to open `url` to authorize MCP server `name` (SPEC M11): a URL-mode
/// `elicitation/create` in `scope` with `elicitation_id` when the client presents URL mode,
/// else a notice with the URL.
pub(crate) fn login_ask(
    modes: ElicitationModes,
    name: &str,
    url: &str,
    scope: &LoginScope,
    elicitation_id: &str,
) -> LoginAsk {
    if !modes.url {
        return LoginAsk::Notice(format!(
            "MCP server '{name}' needs authorization: open {url} to log in."
        ));
    }
    let mut params = json!({
        "mode": "url",
        "message": format!("MCP server '{name}' needs authorization: log in to give the agent access."),
        "url": url,
        "elicitationId": elicitation_id,
    });
    match scope {
        LoginScope::Session(session) => params["sessionId"] = json!(session),
        LoginScope::Request(request) => params["requestId"] = request.to_value(),
    }
    LoginAsk::Elicit(params)
}

/// What the client's answer to a login's `elicitation/create` means for the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoginAnswer {
    /// `accept`: the user opens the URL; the redirect on the loopback listener ends it.
    Accepted(ServerSlot),
    /// `decline`, `cancel`, an unknown action or an error answer: the authorization of the
    /// server is declined.
    Declined(ServerSlot),
}

/// The logins shown through URL elicitation (SPEC M11): the ACP requests waiting for the
/// client's answer, and the elicitation id of each server's login until it is over (for
/// `elicitation/complete`).
#[derive(Debug, Default)]
pub(crate) struct Logins {
    asks: BTreeMap<PermissionRequestId, ServerSlot>,
    shown: BTreeMap<ServerSlot, String>,
    next: u64,
}

impl Logins {
    /// A new elicitation id for a login of `server` (unique in this process).
    pub(crate) fn next_id(&mut self, server: ServerSlot) -> String {
        self.next += 1;
        format!("buzz-login-{}-{}", server.0, self.next)
    }

    /// Request `id` shows the login `elicitation_id` of `server`.
    pub(crate) fn insert(
        &mut self,
        id: PermissionRequestId,
        server: ServerSlot,
        elicitation_id: String,
    ) {
        self.asks.insert(id, server);
        self.shown.insert(server, elicitation_id);
    }

    /// The client answered request `id` with `result` (`None`: an error answer); `None`
    /// when it is not a login's. A declined login is over (no `elicitation/complete`
    /// follows).
    pub(crate) fn answered(
        &mut self,
        id: PermissionRequestId,
        result: Option<&Value>,
    ) -> Option<LoginAnswer> {
        let server = self.asks.remove(&id)?;
        let accepted =
            result.is_some_and(|r| r.get("action").and_then(Value::as_str) == Some("accept"));
        if accepted {
            return Some(LoginAnswer::Accepted(server));
        }
        self.shown.remove(&server);
        Some(LoginAnswer::Declined(server))
    }

    /// The login of `server` is over: the params of the ACP `elicitation/complete` for the
    /// client that was shown it (`None`: it was not, or the user declined it).
    pub(crate) fn done(&mut self, server: ServerSlot) -> Option<Value> {
        let id = self.shown.remove(&server)?;
        Some(json!({"elicitationId": id}))
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
    #[test]
    fn m11_a_login_is_a_url_elicitation_where_the_client_presents_url_mode_else_a_notice() {
        let url = "https://as.example/authorize?client_id=a&state=s";
        let modes = ElicitationModes {
            form: true,
            url: true,
        };
        let opening = LoginScope::Request(RpcId::Num(7.into()));
        assert_eq!(
            login_ask(modes, "github", url, &opening, "buzz-login-1-1"),
            LoginAsk::Elicit(json!({
                "mode": "url",
                "message": "MCP server 'github' needs authorization: log in to give the agent access.",
                "url": url,
                "elicitationId": "buzz-login-1-1",
                "requestId": 7,
            })),
            "a session not answered yet: scoped to the request opening it"
        );
        let open = LoginScope::Session("sess_1".into());
        let LoginAsk::Elicit(params) = login_ask(modes, "github", url, &open, "e2") else {
            panic!("URL mode");
        };
        assert_eq!(params["sessionId"], "sess_1");
        assert!(params.get("requestId").is_none(), "{params}");
        let forms_only = ElicitationModes {
            form: true,
            url: false,
        };
        assert_eq!(
            login_ask(forms_only, "github", url, &open, "e3"),
            LoginAsk::Notice(format!(
                "MCP server 'github' needs authorization: open {url} to log in."
            ))
        );
    }

    #[test]
    fn m11_a_declined_login_is_over_and_an_accepted_one_is_completed_once() {
        let mut logins = Logins::default();
        let s = ServerSlot(3);
        let first = logins.next_id(s);
        let second = logins.next_id(s);
        assert_ne!(first, second, "ids are unique");
        logins.insert(PermissionRequestId(10), s, first);
        assert_eq!(
            logins.answered(PermissionRequestId(11), Some(&json!({"action": "accept"}))),
            None,
            "not a login's request"
        );
        assert_eq!(
            logins.answered(PermissionRequestId(10), Some(&json!({"action": "accept"}))),
            Some(LoginAnswer::Accepted(s))
        );
        assert_eq!(
            logins.done(s),
            Some(json!({"elicitationId": "buzz-login-3-1"}))
        );
        assert_eq!(logins.done(s), None, "once");
        for answer in [
            Some(json!({"action": "decline"})),
            Some(json!({"action": "cancel"})),
            Some(json!({"action": "_later"})),
            None,
        ] {
            logins.insert(PermissionRequestId(12), s, second.clone());
            assert_eq!(
                logins.answered(PermissionRequestId(12), answer.as_ref()),
                Some(LoginAnswer::Declined(s)),
                "{answer:?}"
            );
            assert_eq!(logins.done(s), None, "a declined login is not completed");
        }
    }
}
