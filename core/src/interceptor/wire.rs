//! SEP-2624 wire types and codec: `interceptors/list` and `interceptor/invoke`, in the shape of
//! the working group's conformance suite (`modelcontextprotocol/experimental-ext-interceptors`,
//! `conformance/fixtures/protocol/`, see `core/tests/fixtures/sep-2624/README.md`).
//!
//! Shapes (JSON, `?` = optional, omitted from what we write when it has its default):
//!
//! ```text
//! interceptors/list   params  {event?, phase?, cursor?}
//!                     result  {interceptors: [Interceptor], nextCursor?}
//! Interceptor         {name, type: "validation"|"mutation", hooks: [{events: [string],
//!                      phase: "request"|"response"}], mode?: "enforce"|"audit",
//!                      failOpen?: bool, priorityHint?: int | {request?: int, response?: int},
//!                      version?, description?, compat?, configSchema?}
//! interceptor/invoke  params  {name, event, phase, payload, config?, timeoutMs?, context?}
//!                     result  ValidationResult | MutationResult
//! ValidationResult    {interceptor, type: "validation", phase, valid: bool,
//!                      severity?: "info"|"warn"|"error", messages?: [{path?, message,
//!                      severity}], suggestions?, durationMs?, info?}
//! MutationResult      {interceptor, type: "mutation", phase, modified: bool, payload,
//!                      durationMs?, info?}
//! ```
//!
//! Reading is lenient where the meaning stays clear and strict where a mistake would change a
//! policy decision:
//! - descriptors: `hooks` entries with phase `both` expand to one request and one response
//!   hook; the older single `hook: {events, phase}` object of the SEP text is accepted when
//!   `hooks` is absent; mode `active` (the suite schema's newer name) reads as `enforce`, and an
//!   unknown mode reads as `enforce` (the blocking one); `failOpen` is true only for `true`.
//! - results: `type` must be `validation` or `mutation`; `valid` and `modified` must be booleans;
//!   `severity`, when present, must be `info`, `warn` or `error`; `payload` is required when
//!   `modified` is true. Anything else is a [`WireError`], which the chain treats as a failure
//!   of the interceptor (fail-closed unless `failOpen`).

use serde_json::{Map, Value, json};

/// `interceptors/list`: discovery (SEP-2624 §4.2.1).
pub const LIST_METHOD: &str = "interceptors/list";
/// `interceptor/invoke`: one interceptor on one payload (SEP-2624 §4.2.2).
pub const INVOKE_METHOD: &str = "interceptor/invoke";
/// The capability key an interceptor server advertises under `capabilities.extensions`
/// (SEP-2133 extension format, as the working group's SDKs do).
pub const CAPABILITY_KEY: &str = "io.modelcontextprotocol/interceptors";
/// The lifecycle event of an MCP tool call, the only one buzz-agent intercepts (SPEC X1).
pub const TOOLS_CALL: &str = "tools/call";

/// A malformed descriptor, list result, invoke request or invoke result. `Display` is one line
/// naming what is wrong, e.g. `result "valid" must be a boolean, got a string`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

fn wire_err(s: impl Into<String>) -> WireError {
    WireError(s.into())
}

/// The phase of a lifecycle event: when an operation is initiated or completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// `request`: before the operation runs (for `tools/call`: before the tool runs).
    Request,
    /// `response`: after it completed, before anyone sees the result.
    Response,
}

impl Phase {
    /// The wire string, `request` or `response`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Request => "request",
            Phase::Response => "response",
        }
    }

    /// Reads `request` or `response` (exact, lower case).
    #[must_use]
    pub fn parse(s: &str) -> Option<Phase> {
        match s {
            "request" => Some(Phase::Request),
            "response" => Some(Phase::Response),
            _ => None,
        }
    }
}

/// An interceptor's type (wire field `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum InterceptorType {
    /// `validation`: a validator; inspects the payload and answers valid or not, never changes it.
    Validation,
    /// `mutation`: a mutator; answers `modified` and the (possibly changed) payload.
    Mutation,
}

impl InterceptorType {
    /// The wire string, `validation` or `mutation`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            InterceptorType::Validation => "validation",
            InterceptorType::Mutation => "mutation",
        }
    }

    /// Reads `validation` or `mutation`.
    #[must_use]
    pub fn parse(s: &str) -> Option<InterceptorType> {
        match s {
            "validation" => Some(InterceptorType::Validation),
            "mutation" => Some(InterceptorType::Mutation),
            _ => None,
        }
    }
}

/// Execution mode (wire field `mode`, default `enforce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// `enforce` (also read: `active`): a validator's `error` blocks, a mutator's change applies.
    #[default]
    Enforce,
    /// `audit`: never blocks and never applies; what it would have done is logged.
    Audit,
}

impl Mode {
    /// The wire string, `enforce` or `audit`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }

    /// Reads a mode leniently: `audit` is audit; `enforce`, `active` and anything else is
    /// enforce (the blocking mode: an unknown mode must not silently disable a policy gate).
    #[must_use]
    pub fn parse_lenient(s: &str) -> Mode {
        if s == "audit" {
            Mode::Audit
        } else {
            Mode::Enforce
        }
    }
}

/// A validation severity. Only `error` blocks (SEP-2624 §4.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// `info`
    Info,
    /// `warn`
    Warn,
    /// `error`: the only severity that blocks, and only in `enforce` mode.
    Error,
}

impl Severity {
    /// The wire string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }

    /// Reads `info`, `warn` or `error`.
    #[must_use]
    pub fn parse(s: &str) -> Option<Severity> {
        match s {
            "info" => Some(Severity::Info),
            "warn" => Some(Severity::Warn),
            "error" => Some(Severity::Error),
            _ => None,
        }
    }
}

/// Which lifecycle events, on which phase, trigger an interceptor (one entry of `hooks`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// Event names or patterns; see [`event_matches`].
    pub events: Vec<String>,
    /// The phase this hook fires on.
    pub phase: Phase,
}

/// The mutation ordering hint (wire field `priorityHint`, default 0; lower runs first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityHint {
    /// A single number: the same priority on both phases.
    Both(i32),
    /// `{request?, response?}`: per phase, 0 where absent.
    PerPhase {
        /// Priority on the request phase.
        request: Option<i32>,
        /// Priority on the response phase.
        response: Option<i32>,
    },
}

impl PriorityHint {
    /// The priority on `phase` (SEP-2624 §4.1.1: a number applies to both phases; an object
    /// selects per phase; 0 where absent).
    #[must_use]
    pub fn for_phase(self, phase: Phase) -> i32 {
        match (self, phase) {
            (PriorityHint::Both(p), Phase::Request | Phase::Response) => p,
            (PriorityHint::PerPhase { request, .. }, Phase::Request) => request.unwrap_or(0),
            (PriorityHint::PerPhase { response, .. }, Phase::Response) => response.unwrap_or(0),
        }
    }

    fn to_value(self) -> Value {
        match self {
            PriorityHint::Both(p) => json!(p),
            PriorityHint::PerPhase { request, response } => {
                let mut o = Map::new();
                if let Some(r) = request {
                    o.insert("request".into(), json!(r));
                }
                if let Some(r) = response {
                    o.insert("response".into(), json!(r));
                }
                Value::Object(o)
            }
        }
    }

    /// Reads an integer or a `{request?, response?}` object of integers (`null` members are
    /// absent); integers are clamped to the 32-bit range. Errors on anything else.
    pub fn from_value(v: &Value) -> Result<PriorityHint, WireError> {
        match v {
            Value::Object(o) => Ok(PriorityHint::PerPhase {
                request: o
                    .get("request")
                    .filter(|r| !r.is_null())
                    .map(priority_number)
                    .transpose()?,
                response: o
                    .get("response")
                    .filter(|r| !r.is_null())
                    .map(priority_number)
                    .transpose()?,
            }),
            Value::Null
            | Value::Bool(_)
            | Value::Number(_)
            | Value::String(_)
            | Value::Array(_) => priority_number(v).map(PriorityHint::Both),
        }
    }
}

/// An integer priority, clamped to the 32-bit range the SEP gives (an integral float such as
/// `5.0` counts as an integer).
fn priority_number(v: &Value) -> Result<i32, WireError> {
    let wide: Option<i64> = match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            if n.as_u64().is_some() {
                Some(i64::MAX)
            } else {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.is_finite())
                    .map(|f| f.clamp(-1e18, 1e18) as i64)
            }
        }),
        Value::Null | Value::Bool(_) | Value::String(_) | Value::Array(_) | Value::Object(_) => {
            None
        }
    };
    let Some(wide) = wide else {
        return Err(wire_err(format!(
            "\"priorityHint\" must be an integer or {{request, response}} of integers, got {}",
            crate::jsonrpc::json_type(v)
        )));
    };
    let clamped = wide.clamp(i64::from(i32::MIN), i64::from(i32::MAX));
    Ok(i32::try_from(clamped).unwrap_or(0))
}

/// Whether the hook event `pattern` matches `event` on `phase` (SEP-2624 §4.1.2).
///
/// - `*` matches every event;
/// - `*/request` and `*/response` match every event on that phase only (with `phase` `None`,
///   as when listing by event alone, they match every event);
/// - a namespace wildcard `ns/*` matches every event that starts with `ns/` (`tools/*` matches
///   `tools/call` and `tools/list`, not `tools` or `toolsx/call`);
/// - anything else matches exactly (case-sensitive).
///
/// ```
/// use buzz_agent_core::interceptor::wire::{event_matches, Phase};
/// assert!(event_matches("*", "prompts/get", None));
/// assert!(event_matches("tools/*", "tools/call", Some(Phase::Request)));
/// assert!(!event_matches("tools/*", "prompts/get", None));
/// assert!(event_matches("*/request", "tools/call", Some(Phase::Request)));
/// assert!(!event_matches("*/request", "tools/call", Some(Phase::Response)));
/// assert!(!event_matches("tools/call", "tools/list", None));
/// ```
#[must_use]
pub fn event_matches(pattern: &str, event: &str, phase: Option<Phase>) -> bool {
    match pattern {
        "*" => true,
        "*/request" => phase.is_none_or(|p| p == Phase::Request),
        "*/response" => phase.is_none_or(|p| p == Phase::Response),
        _ => match pattern.strip_suffix('*') {
            Some(prefix) if prefix.ends_with('/') => event.starts_with(prefix),
            Some(_) | None => pattern == event,
        },
    }
}

/// An interceptor descriptor, one entry of the `interceptors/list` result (SEP-2624 §4.1.1, in
/// the suite's `hooks: [{events, phase}]` shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Interceptor {
    /// Unique name on its server, e.g. `conf/deny-all`.
    pub name: String,
    /// Validator or mutator (wire `type`).
    pub kind: InterceptorType,
    /// When it fires; a `both` phase on the wire is two entries here.
    pub hooks: Vec<Hook>,
    /// `enforce` (default) or `audit`.
    pub mode: Mode,
    /// What a crash or timeout means: `false` (default) blocks, `true` lets the operation
    /// through.
    pub fail_open: bool,
    /// Mutation ordering hint (ignored for validators); `None` = 0.
    pub priority_hint: Option<PriorityHint>,
    /// Optional semantic version.
    pub version: Option<String>,
    /// Optional human-readable description.
    pub description: Option<String>,
    /// Optional `compat` object, kept as given.
    pub compat: Option<Value>,
    /// Optional `configSchema`, kept as given.
    pub config_schema: Option<Value>,
}

impl Interceptor {
    /// A descriptor with the defaults: `enforce`, fail-closed, no priority hint, no optional
    /// fields.
    #[must_use]
    pub fn new(name: impl Into<String>, kind: InterceptorType, hooks: Vec<Hook>) -> Interceptor {
        Interceptor {
            name: name.into(),
            kind,
            hooks,
            mode: Mode::Enforce,
            fail_open: false,
            priority_hint: None,
            version: None,
            description: None,
            compat: None,
            config_schema: None,
        }
    }

    /// Whether one of its hooks fires for `event` on `phase` (see [`event_matches`]).
    #[must_use]
    pub fn hooks_event(&self, event: &str, phase: Phase) -> bool {
        self.hooks.iter().any(|h| {
            h.phase == phase
                && h.events
                    .iter()
                    .any(|p| event_matches(p, event, Some(phase)))
        })
    }

    /// Whether one of its hooks names `event` on any phase (the `interceptors/list` filter).
    #[must_use]
    pub fn hooks_event_any_phase(&self, event: &str) -> bool {
        self.hooks
            .iter()
            .any(|h| h.events.iter().any(|p| event_matches(p, event, None)))
    }

    /// Its mutation priority on `phase` (0 without a hint).
    #[must_use]
    pub fn priority(&self, phase: Phase) -> i32 {
        self.priority_hint.map_or(0, |h| h.for_phase(phase))
    }

    /// The wire object; defaults (`enforce`, `failOpen: false`) and absent optional fields are
    /// omitted, as the suite's `list-*` fixtures expect.
    #[must_use]
    pub fn to_value(&self) -> Value {
        let mut o = Map::new();
        o.insert("name".into(), json!(self.name));
        o.insert("type".into(), json!(self.kind.as_str()));
        let hooks: Vec<Value> = self
            .hooks
            .iter()
            .map(|h| json!({"events": h.events, "phase": h.phase.as_str()}))
            .collect();
        o.insert("hooks".into(), Value::Array(hooks));
        if self.mode == Mode::Audit {
            o.insert("mode".into(), json!("audit"));
        }
        if self.fail_open {
            o.insert("failOpen".into(), json!(true));
        }
        if let Some(p) = self.priority_hint {
            o.insert("priorityHint".into(), p.to_value());
        }
        for (key, val) in [
            ("version", &self.version),
            ("description", &self.description),
        ] {
            if let Some(s) = val {
                o.insert(key.into(), json!(s));
            }
        }
        for (key, val) in [
            ("compat", &self.compat),
            ("configSchema", &self.config_schema),
        ] {
            if let Some(v) = val {
                o.insert(key.into(), v.clone());
            }
        }
        Value::Object(o)
    }

    /// Reads one descriptor (leniency as in the module docs). Errors: not an object, no string
    /// `name`, a `type` other than `validation`/`mutation`, no usable hook, a hook phase other
    /// than `request`/`response`/`both`, a non-integer `priorityHint`.
    pub fn from_value(v: &Value) -> Result<Interceptor, WireError> {
        let Value::Object(o) = v else {
            return Err(wire_err(format!(
                "an interceptor must be an object, got {}",
                crate::jsonrpc::json_type(v)
            )));
        };
        let name = match o.get("name") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) | None => {
                return Err(wire_err("an interceptor needs a non-empty string \"name\""));
            }
        };
        let kind = o
            .get("type")
            .and_then(Value::as_str)
            .and_then(InterceptorType::parse)
            .ok_or_else(|| {
                wire_err(format!(
                    "interceptor {name:?}: \"type\" must be \"validation\" or \"mutation\""
                ))
            })?;
        let raw_hooks: Vec<&Value> = match (o.get("hooks"), o.get("hook")) {
            (Some(Value::Array(hs)), _) => hs.iter().collect(),
            (None, Some(h)) => vec![h],
            (Some(_), _) | (None, None) => {
                return Err(wire_err(format!(
                    "interceptor {name:?}: \"hooks\" must be an array of {{events, phase}}"
                )));
            }
        };
        let mut hooks = Vec::new();
        for h in raw_hooks {
            hooks
                .extend(parse_hook(h).map_err(|e| wire_err(format!("interceptor {name:?}: {e}")))?);
        }
        if hooks.is_empty() {
            return Err(wire_err(format!("interceptor {name:?} has no hooks")));
        }
        let priority_hint = match o.get("priorityHint") {
            None | Some(Value::Null) => None,
            Some(p) => Some(
                PriorityHint::from_value(p)
                    .map_err(|e| wire_err(format!("interceptor {name:?}: {e}")))?,
            ),
        };
        let string = |key: &str| o.get(key).and_then(Value::as_str).map(str::to_owned);
        let object = |key: &str| o.get(key).filter(|v| v.is_object()).cloned();
        Ok(Interceptor {
            kind,
            hooks,
            mode: o
                .get("mode")
                .and_then(Value::as_str)
                .map_or(Mode::Enforce, Mode::parse_lenient),
            fail_open: o.get("failOpen") == Some(&Value::Bool(true)),
            priority_hint,
            version: string("version"),
            description: string("description"),
            compat: object("compat"),
            config_schema: object("configSchema"),
            name,
        })
    }
}

/// One `{events, phase}` entry; phase `both` gives two hooks.
fn parse_hook(v: &Value) -> Result<Vec<Hook>, WireError> {
    let Value::Object(o) = v else {
        return Err(wire_err("a hook must be an object {events, phase}"));
    };
    // Every event must be a string and there must be one: a hook whose events cannot be read
    // would otherwise hook nothing, a gate silently gone (SPEC S4).
    let events: Vec<String> = match o.get("events") {
        Some(Value::Array(es)) if !es.is_empty() => es
            .iter()
            .map(|e| e.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| wire_err("a hook's \"events\" must all be strings"))?,
        Some(_) | None => {
            return Err(wire_err(
                "a hook needs a non-empty array of strings \"events\"",
            ));
        }
    };
    let phase = o.get("phase").and_then(Value::as_str);
    let phases: &[Phase] = match phase {
        Some("request") => &[Phase::Request],
        Some("response") => &[Phase::Response],
        Some("both") => &[Phase::Request, Phase::Response],
        Some(_) | None => {
            return Err(wire_err(
                "a hook \"phase\" must be \"request\", \"response\" or \"both\"",
            ));
        }
    };
    Ok(phases
        .iter()
        .map(|&phase| Hook {
            events: events.clone(),
            phase,
        })
        .collect())
}

/// The `interceptors/list` request params: `{}` for everything, `{"event": e}` to filter.
#[must_use]
pub fn list_params(event: Option<&str>) -> Value {
    match event {
        Some(e) => json!({ "event": e }),
        None => json!({}),
    }
}

/// A decoded `interceptors/list` result.
#[derive(Debug, Clone, PartialEq)]
pub struct ListResult {
    /// The well-formed descriptors, in the server's order.
    pub interceptors: Vec<Interceptor>,
    /// One error per descriptor that could not be read (it is left out of `interceptors`).
    pub rejected: Vec<WireError>,
    /// `nextCursor`, when the server paginates.
    pub next_cursor: Option<String>,
}

impl ListResult {
    /// Reads a `interceptors/list` result. Errors only when the result is not an object with
    /// an `interceptors` array; a bad entry goes to `rejected` and the others are kept.
    pub fn from_value(v: &Value) -> Result<ListResult, WireError> {
        let Some(list) = v.get("interceptors").and_then(Value::as_array) else {
            return Err(wire_err(
                "an interceptors/list result must be an object with an \"interceptors\" array",
            ));
        };
        let mut interceptors = Vec::new();
        let mut rejected = Vec::new();
        for entry in list {
            match Interceptor::from_value(entry) {
                Ok(i) => interceptors.push(i),
                Err(e) => rejected.push(e),
            }
        }
        Ok(ListResult {
            interceptors,
            rejected,
            next_cursor: v
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// The wire object `{interceptors: [...], nextCursor?}` (rejected entries are not written).
    #[must_use]
    pub fn to_value(&self) -> Value {
        let mut o = Map::new();
        o.insert(
            "interceptors".into(),
            Value::Array(
                self.interceptors
                    .iter()
                    .map(Interceptor::to_value)
                    .collect(),
            ),
        );
        if let Some(c) = &self.next_cursor {
            o.insert("nextCursor".into(), json!(c));
        }
        Value::Object(o)
    }
}

/// The `interceptor/invoke` request params.
#[derive(Debug, Clone, PartialEq)]
pub struct InvokeParams {
    /// The interceptor's name.
    pub name: String,
    /// The lifecycle event, e.g. `tools/call`.
    pub event: String,
    /// The phase.
    pub phase: Phase,
    /// The payload to inspect or transform (for `tools/call`: the request's `{name, arguments}`
    /// on the request phase, the `CallToolResult` on the response phase).
    pub payload: Value,
    /// Optional per-interceptor configuration.
    pub config: Option<Value>,
    /// Optional deadline hint for the server, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Optional context object (`sessionId`, `traceId`, `principal`, …), kept as given.
    pub context: Option<Value>,
}

impl InvokeParams {
    /// The wire object; `None` fields are omitted.
    #[must_use]
    pub fn to_value(&self) -> Value {
        let mut o = Map::new();
        o.insert("name".into(), json!(self.name));
        o.insert("event".into(), json!(self.event));
        o.insert("phase".into(), json!(self.phase.as_str()));
        o.insert("payload".into(), self.payload.clone());
        if let Some(c) = &self.config {
            o.insert("config".into(), c.clone());
        }
        if let Some(t) = self.timeout_ms {
            o.insert("timeoutMs".into(), json!(t));
        }
        if let Some(c) = &self.context {
            o.insert("context".into(), c.clone());
        }
        Value::Object(o)
    }

    /// Reads the params. Errors (the server answers them with -32602): not an object, `name`
    /// or `event` not a string, `phase` not `request`/`response`. A missing `payload` is `null`.
    pub fn from_value(v: &Value) -> Result<InvokeParams, WireError> {
        let Value::Object(o) = v else {
            return Err(wire_err("interceptor/invoke params must be an object"));
        };
        let string = |key: &str| {
            o.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| wire_err(format!("interceptor/invoke params need a string {key:?}")))
        };
        let phase = o
            .get("phase")
            .and_then(Value::as_str)
            .and_then(Phase::parse)
            .ok_or_else(|| {
                wire_err("interceptor/invoke \"phase\" must be \"request\" or \"response\"")
            })?;
        Ok(InvokeParams {
            name: string("name")?,
            event: string("event")?,
            phase,
            payload: o.get("payload").cloned().unwrap_or(Value::Null),
            config: o.get("config").filter(|c| !c.is_null()).cloned(),
            timeout_ms: o.get("timeoutMs").and_then(Value::as_u64),
            context: o.get("context").filter(|c| !c.is_null()).cloned(),
        })
    }
}

/// One message of a validation result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationMessage {
    /// Optional JSON path of the offending field.
    pub path: Option<String>,
    /// The human-readable explanation (what the model and client see on a denial).
    pub message: String,
    /// The message's severity.
    pub severity: Severity,
}

impl ValidationMessage {
    /// A message without a path.
    #[must_use]
    pub fn new(message: impl Into<String>, severity: Severity) -> ValidationMessage {
        ValidationMessage {
            path: None,
            message: message.into(),
            severity,
        }
    }

    fn to_value(&self) -> Value {
        let mut o = Map::new();
        if let Some(p) = &self.path {
            o.insert("path".into(), json!(p));
        }
        o.insert("message".into(), json!(self.message));
        o.insert("severity".into(), json!(self.severity.as_str()));
        Value::Object(o)
    }

    /// Lenient: a non-string message is written as JSON text, an unknown or missing severity
    /// takes `fallback` (these fields are for display; the decision reads the result's own
    /// `severity`).
    fn from_value(v: &Value, fallback: Severity) -> ValidationMessage {
        let message = match v.get("message").or(Some(v)) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        ValidationMessage {
            path: v.get("path").and_then(Value::as_str).map(str::to_owned),
            message,
            severity: v
                .get("severity")
                .and_then(Value::as_str)
                .and_then(Severity::parse)
                .unwrap_or(fallback),
        }
    }
}

/// A validator's answer (`ValidationResult`, SEP-2624 §4.1.3).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationResult {
    /// The interceptor's name (empty when the server left it out).
    pub interceptor: String,
    /// The phase it ran on.
    pub phase: Phase,
    /// The overall outcome.
    pub valid: bool,
    /// The overall severity; only `error` (with `valid: false`) blocks.
    pub severity: Option<Severity>,
    /// Messages, in the server's order.
    pub messages: Vec<ValidationMessage>,
    /// `suggestions`, kept as given (not applied).
    pub suggestions: Vec<Value>,
    /// `info`, kept as given.
    pub info: Option<Value>,
}

impl ValidationResult {
    /// Whether this result blocks in `enforce` mode: `valid: false` with severity `error`, or
    /// with no severity at all (SEP-2624 §4.3.1: "Only validations with severity error MUST
    /// block"; a verdict of invalid that does not say how bad fails closed, SPEC X1, S4).
    /// `valid: false` with `warn` or `info` does not block.
    #[must_use]
    pub fn blocks(&self) -> bool {
        !self.valid && self.severity.is_none_or(|s| s == Severity::Error)
    }
}

/// A mutator's answer (`MutationResult`, SEP-2624 §4.1.4).
#[derive(Debug, Clone, PartialEq)]
pub struct MutationResult {
    /// The interceptor's name (empty when the server left it out).
    pub interceptor: String,
    /// The phase it ran on.
    pub phase: Phase,
    /// Whether `payload` differs from what it was given.
    pub modified: bool,
    /// The transformed payload (or the original when not modified).
    pub payload: Value,
    /// `info`, kept as given.
    pub info: Option<Value>,
}

/// An `interceptor/invoke` result.
#[derive(Debug, Clone, PartialEq)]
pub enum InvokeResult {
    /// From a validator.
    Validation(ValidationResult),
    /// From a mutator.
    Mutation(MutationResult),
}

impl InvokeResult {
    /// The result's type.
    #[must_use]
    pub fn kind(&self) -> InterceptorType {
        match self {
            InvokeResult::Validation(_) => InterceptorType::Validation,
            InvokeResult::Mutation(_) => InterceptorType::Mutation,
        }
    }

    /// The wire object. Absent options and empty lists are omitted (a passing validator is
    /// `{interceptor, type, phase, valid: true}`, as the suite's `invoke-validation-pass`
    /// fixture expects).
    #[must_use]
    pub fn to_value(&self) -> Value {
        let mut o = Map::new();
        match self {
            InvokeResult::Validation(r) => {
                o.insert("interceptor".into(), json!(r.interceptor));
                o.insert("type".into(), json!("validation"));
                o.insert("phase".into(), json!(r.phase.as_str()));
                o.insert("valid".into(), json!(r.valid));
                if let Some(s) = r.severity {
                    o.insert("severity".into(), json!(s.as_str()));
                }
                if !r.messages.is_empty() {
                    let ms = r.messages.iter().map(ValidationMessage::to_value).collect();
                    o.insert("messages".into(), Value::Array(ms));
                }
                if !r.suggestions.is_empty() {
                    o.insert("suggestions".into(), Value::Array(r.suggestions.clone()));
                }
                if let Some(i) = &r.info {
                    o.insert("info".into(), i.clone());
                }
            }
            InvokeResult::Mutation(r) => {
                o.insert("interceptor".into(), json!(r.interceptor));
                o.insert("type".into(), json!("mutation"));
                o.insert("phase".into(), json!(r.phase.as_str()));
                o.insert("modified".into(), json!(r.modified));
                o.insert("payload".into(), r.payload.clone());
                if let Some(i) = &r.info {
                    o.insert("info".into(), i.clone());
                }
            }
        }
        Value::Object(o)
    }

    /// Reads a result (strictness as in the module docs). `phase` is the phase the caller
    /// asked for, used when the result leaves it out; a present but unknown phase is an error.
    /// When `modified` is false a missing `payload` is `null` (the caller keeps its own).
    pub fn from_value(v: &Value, phase: Phase) -> Result<InvokeResult, WireError> {
        let Value::Object(o) = v else {
            return Err(wire_err(format!(
                "an interceptor/invoke result must be an object, got {}",
                crate::jsonrpc::json_type(v)
            )));
        };
        let kind = match o.get("type").and_then(Value::as_str) {
            Some(t) => InterceptorType::parse(t).ok_or_else(|| {
                wire_err(format!(
                    "result \"type\" must be \"validation\" or \"mutation\", got {t:?}"
                ))
            })?,
            None => return Err(wire_err("result needs a string \"type\"")),
        };
        let phase = match o.get("phase") {
            None | Some(Value::Null) => phase,
            Some(p) => p
                .as_str()
                .and_then(Phase::parse)
                .ok_or_else(|| wire_err("result \"phase\" must be \"request\" or \"response\""))?,
        };
        let interceptor = o
            .get("interceptor")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let boolean = |key: &str| match o.get(key) {
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(wire_err(format!(
                "result {key:?} must be a boolean, got {}",
                crate::jsonrpc::json_type(other)
            ))),
            None => Err(wire_err(format!("result needs a boolean {key:?}"))),
        };
        let info = o.get("info").filter(|i| !i.is_null()).cloned();
        match kind {
            InterceptorType::Validation => {
                let valid = boolean("valid")?;
                let severity = match o.get("severity") {
                    None | Some(Value::Null) => None,
                    Some(s) => Some(s.as_str().and_then(Severity::parse).ok_or_else(|| {
                        wire_err(format!(
                            "result \"severity\" must be \"info\", \"warn\" or \"error\", got {s}"
                        ))
                    })?),
                };
                let fallback = severity.unwrap_or(Severity::Info);
                let messages = match o.get("messages") {
                    Some(Value::Array(ms)) => ms
                        .iter()
                        .map(|m| ValidationMessage::from_value(m, fallback))
                        .collect(),
                    Some(_) | None => Vec::new(),
                };
                let suggestions = o
                    .get("suggestions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                Ok(InvokeResult::Validation(ValidationResult {
                    interceptor,
                    phase,
                    valid,
                    severity,
                    messages,
                    suggestions,
                    info,
                }))
            }
            InterceptorType::Mutation => {
                let modified = boolean("modified")?;
                let payload = match o.get("payload") {
                    Some(p) => p.clone(),
                    None if modified => {
                        return Err(wire_err("result has \"modified\": true but no \"payload\""));
                    }
                    None => Value::Null,
                };
                Ok(InvokeResult::Mutation(MutationResult {
                    interceptor,
                    phase,
                    modified,
                    payload,
                    info,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x1_a_descriptor_round_trips_and_omits_its_defaults() {
        let wire = json!({"name": "conf/allow-all", "type": "validation",
            "hooks": [{"events": ["tools/call"], "phase": "request"},
                      {"events": ["tools/call"], "phase": "response"}]});
        let i = Interceptor::from_value(&wire).unwrap();
        assert_eq!(i.mode, Mode::Enforce);
        assert!(!i.fail_open);
        assert_eq!(i.priority(Phase::Request), 0);
        assert_eq!(i.to_value(), wire);

        let full = json!({"name": "redact", "type": "mutation", "mode": "audit",
            "failOpen": true, "priorityHint": {"request": -1000, "response": 1000},
            "version": "1.2.0", "description": "d", "compat": {"minProtocol": "2024-11-05"},
            "configSchema": {"type": "object"},
            "hooks": [{"events": ["*"], "phase": "request"}]});
        let i = Interceptor::from_value(&full).unwrap();
        assert_eq!((i.mode, i.fail_open), (Mode::Audit, true));
        assert_eq!(
            (i.priority(Phase::Request), i.priority(Phase::Response)),
            (-1000, 1000)
        );
        assert_eq!(i.to_value(), full);
    }

    #[test]
    fn x1_descriptors_are_read_leniently_where_the_meaning_is_clear() {
        // `both` expands; the older singular `hook` is accepted; `active` and unknown modes
        // enforce; failOpen is true only for `true`.
        let i = Interceptor::from_value(&json!({"name": "x", "type": "validation",
            "hook": {"events": ["tools/call"], "phase": "both"},
            "mode": "active", "failOpen": "yes"}))
        .unwrap();
        assert_eq!(i.hooks.len(), 2);
        assert!(
            i.hooks_event(TOOLS_CALL, Phase::Request) && i.hooks_event(TOOLS_CALL, Phase::Response)
        );
        assert_eq!(i.mode, Mode::Enforce);
        assert!(!i.fail_open);
        assert_eq!(Mode::parse_lenient("shadow"), Mode::Enforce);
        assert_eq!(Mode::parse_lenient("audit"), Mode::Audit);
    }

    #[test]
    fn x1_bad_descriptors_are_errors_that_name_the_interceptor() {
        for (v, want) in [
            (json!([]), "must be an object, got an array"),
            (
                json!({"type": "validation", "hooks": []}),
                "non-empty string \"name\"",
            ),
            (
                json!({"name": "x", "type": "filter", "hooks": []}),
                "interceptor \"x\": \"type\" must be",
            ),
            (
                json!({"name": "x", "type": "mutation"}),
                "\"hooks\" must be an array",
            ),
            (
                json!({"name": "x", "type": "mutation", "hooks": []}),
                "interceptor \"x\" has no hooks",
            ),
            (
                json!({"name": "x", "type": "mutation", "hooks": [{"events": ["*"], "phase": "later"}]}),
                "\"phase\" must be",
            ),
            (
                json!({"name": "x", "type": "validation", "hooks": [{"events": [], "phase": "request"}]}),
                "non-empty array of strings \"events\"",
            ),
            (
                json!({"name": "x", "type": "validation", "hooks": [{"events": ["tools/call", 7], "phase": "request"}]}),
                "\"events\" must all be strings",
            ),
            (
                json!({"name": "x", "type": "mutation", "hooks": [{"events": ["*"], "phase": "request"}], "priorityHint": 1.5}),
                "\"priorityHint\" must be an integer",
            ),
        ] {
            let e = Interceptor::from_value(&v).unwrap_err();
            assert!(e.to_string().contains(want), "{v}: {e}");
        }
    }

    #[test]
    fn x1_priority_hints_clamp_to_32_bits_and_default_to_zero() {
        let read = |p: Value| PriorityHint::from_value(&p).unwrap();
        assert_eq!(read(json!(7)), PriorityHint::Both(7));
        assert_eq!(read(json!(3.0)), PriorityHint::Both(3));
        assert_eq!(read(json!(1_u64 << 40)), PriorityHint::Both(i32::MAX));
        assert_eq!(read(json!(-(1_i64 << 40))), PriorityHint::Both(i32::MIN));
        assert_eq!(read(json!(u64::MAX)), PriorityHint::Both(i32::MAX));
        let per = read(json!({"response": 4, "request": null}));
        assert_eq!(
            (
                per.for_phase(Phase::Request),
                per.for_phase(Phase::Response)
            ),
            (0, 4)
        );
        assert!(PriorityHint::from_value(&json!("high")).is_err());
        assert!(PriorityHint::from_value(&json!({"request": "x"})).is_err());
    }

    #[test]
    fn x1_event_patterns_match_exactly_or_by_wildcard() {
        let req = Some(Phase::Request);
        assert!(event_matches("tools/call", "tools/call", req));
        assert!(!event_matches("tools/call", "tools/CALL", req));
        assert!(event_matches("*", "anything/at-all", Some(Phase::Response)));
        assert!(event_matches("tools/*", "tools/list", req));
        assert!(!event_matches("tools/*", "tools", req));
        assert!(!event_matches("tools/*", "toolsx/call", req));
        assert!(
            !event_matches("tool*", "tools/call", req),
            "only ns/* is a namespace wildcard"
        );
        assert!(event_matches("*/response", "tools/call", None));
        assert!(!event_matches("*/response", "tools/call", req));
        let i = Interceptor::from_value(&json!({"name": "x", "type": "validation",
            "hooks": [{"events": ["*/response"], "phase": "response"}]}))
        .unwrap();
        assert!(i.hooks_event_any_phase("prompts/get"));
        assert!(!i.hooks_event("tools/call", Phase::Request));
    }

    #[test]
    fn x1_a_list_result_keeps_good_entries_and_reports_bad_ones() {
        let v = json!({"interceptors": [
            {"name": "ok", "type": "validation", "hooks": [{"events": ["tools/call"], "phase": "request"}]},
            {"name": "bad", "type": "nope", "hooks": []}
        ], "nextCursor": "p2"});
        let r = ListResult::from_value(&v).unwrap();
        assert_eq!(r.interceptors.len(), 1);
        assert_eq!(r.interceptors[0].name, "ok");
        assert_eq!(r.rejected.len(), 1);
        assert!(r.rejected[0].0.contains("\"bad\""));
        assert_eq!(r.next_cursor.as_deref(), Some("p2"));
        assert!(ListResult::from_value(&json!({"tools": []})).is_err());
        assert_eq!(
            list_params(Some("tools/call")),
            json!({"event": "tools/call"})
        );
        assert_eq!(list_params(None), json!({}));
    }

    #[test]
    fn x1_invoke_params_round_trip_and_bad_params_are_errors() {
        let p = InvokeParams {
            name: "n".into(),
            event: TOOLS_CALL.into(),
            phase: Phase::Response,
            payload: json!({"content": []}),
            config: None,
            timeout_ms: Some(5),
            context: None,
        };
        assert_eq!(InvokeParams::from_value(&p.to_value()).unwrap(), p);
        for bad in [
            json!(null),
            json!({"event": "e", "phase": "request"}),
            json!({"name": "n", "phase": "request"}),
            json!({"name": "n", "event": "e", "phase": "both"}),
        ] {
            assert!(InvokeParams::from_value(&bad).is_err(), "{bad}");
        }
        let no_payload =
            InvokeParams::from_value(&json!({"name": "n", "event": "e", "phase": "request"}));
        assert_eq!(no_payload.unwrap().payload, Value::Null);
    }

    #[test]
    fn x1_results_encode_in_the_suites_shape_and_decode_back() {
        let pass = InvokeResult::Validation(ValidationResult {
            interceptor: "conf/allow-all".into(),
            phase: Phase::Request,
            valid: true,
            severity: None,
            messages: Vec::new(),
            suggestions: Vec::new(),
            info: None,
        });
        assert_eq!(
            pass.to_value(),
            json!({"interceptor": "conf/allow-all", "type": "validation", "phase": "request", "valid": true})
        );
        assert_eq!(
            InvokeResult::from_value(&pass.to_value(), Phase::Request).unwrap(),
            pass
        );
        let deny = json!({"interceptor": "d", "type": "validation", "phase": "request",
            "valid": false, "severity": "error",
            "messages": [{"path": "arguments.note", "message": "no", "severity": "error"}]});
        let r = InvokeResult::from_value(&deny, Phase::Request).unwrap();
        let InvokeResult::Validation(v) = &r else {
            panic!()
        };
        assert!(v.blocks());
        assert_eq!(r.to_value(), deny);
        // Missing phase: the caller's; unmodified mutation without payload: null.
        let m = InvokeResult::from_value(
            &json!({"type": "mutation", "modified": false}),
            Phase::Response,
        )
        .unwrap();
        let InvokeResult::Mutation(m) = m else {
            panic!()
        };
        assert_eq!((m.phase, m.payload), (Phase::Response, Value::Null));
    }

    #[test]
    fn x1_s4_only_invalid_with_severity_error_or_none_blocks() {
        let block = |valid: bool, severity: Option<Severity>| {
            ValidationResult {
                interceptor: String::new(),
                phase: Phase::Request,
                valid,
                severity,
                messages: Vec::new(),
                suggestions: Vec::new(),
                info: None,
            }
            .blocks()
        };
        assert!(block(false, Some(Severity::Error)));
        assert!(!block(false, Some(Severity::Warn)));
        assert!(!block(false, Some(Severity::Info)));
        assert!(block(false, None), "S4: no severity fails closed");
        assert!(!block(true, Some(Severity::Error)));
        assert!(!block(true, None));
    }

    #[test]
    fn x1_each_mode_writes_a_string_that_reads_back_as_that_mode() {
        for mode in [Mode::Enforce, Mode::Audit] {
            assert_eq!(Mode::parse_lenient(mode.as_str()), mode, "{mode:?}");
        }
        assert_eq!(
            (Mode::Enforce.as_str(), Mode::Audit.as_str()),
            ("enforce", "audit")
        );
    }

    #[test]
    fn x1_an_empty_name_is_no_name() {
        let e = Interceptor::from_value(&json!({"name": "", "type": "validation",
            "hooks": [{"events": ["tools/call"], "phase": "request"}]}))
        .unwrap_err();
        assert!(e.0.contains("non-empty string \"name\""), "{e}");
    }

    #[test]
    fn x1_an_interceptor_hooking_other_events_does_not_hook_tools_call_on_any_phase() {
        let i = Interceptor::from_value(&json!({"name": "p", "type": "validation",
            "hooks": [{"events": ["prompts/get", "tools/*x"], "phase": "both"}]}))
        .unwrap();
        assert!(i.hooks_event_any_phase("prompts/get"));
        assert!(!i.hooks_event_any_phase(TOOLS_CALL));
    }

    #[test]
    fn x1_invoke_config_context_and_result_info_are_kept_and_null_is_absent() {
        let given = InvokeParams::from_value(&json!({"name": "n", "event": "e",
            "phase": "request", "config": {"level": 2}, "context": {"sessionId": "s1"}}))
        .unwrap();
        assert_eq!(given.config, Some(json!({"level": 2})));
        assert_eq!(given.context, Some(json!({"sessionId": "s1"})));
        let null = InvokeParams::from_value(&json!({"name": "n", "event": "e",
            "phase": "request", "config": null, "context": null}))
        .unwrap();
        assert_eq!((null.config, null.context), (None, None));

        let info = |v: Value| match InvokeResult::from_value(
            &json!({"type": "validation", "valid": true, "info": v}),
            Phase::Request,
        )
        .unwrap()
        {
            InvokeResult::Validation(r) => r.info,
            InvokeResult::Mutation(_) => panic!("a validation result"),
        };
        assert_eq!(info(json!({"ms": 3})), Some(json!({"ms": 3})));
        assert_eq!(info(Value::Null), None);
    }

    #[test]
    fn x1_a_list_result_writes_its_descriptors_and_cursor_and_reads_back() {
        let v = json!({"interceptors": [
            {"name": "ok", "type": "validation", "hooks": [{"events": ["tools/call"], "phase": "request"}]}
        ], "nextCursor": "p2"});
        let r = ListResult::from_value(&v).unwrap();
        assert_eq!(r.to_value(), v);
        let last_page = ListResult {
            next_cursor: None,
            ..r
        };
        assert_eq!(
            last_page.to_value(),
            json!({"interceptors": v["interceptors"]})
        );
    }
}
