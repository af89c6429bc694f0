//! Tool input schemas in the form each provider accepts (SPEC M14; cases C19, C63).
//!
//! MCP servers write JSON Schema freely; each provider accepts its own subset of it, and one
//! tool it rejects fails the whole request (every prompt of the session). The MCP
//! `inputSchema` (after [`crate::tools::normalize_schema`]) stays the source of truth; this
//! module derives, per [`SchemaDialect`], a schema that provider accepts, keeping as much of
//! the meaning as it can:
//!
//! - a root `anyOf`/`oneOf` is folded into one object schema: the branches' properties merged
//!   (a property the branches spell differently becomes an `anyOf` of the spellings, or one
//!   `enum` of their `const`s), required only what every branch requires, and the rule that
//!   was lost ("exactly one of these sets of arguments: …") written into the tool's
//!   description;
//! - a root `allOf` is merged into the root (properties and `required` united);
//! - local `$ref`s (`#/$defs/…`, `#/definitions/…`, `#`) are inlined where the provider cannot
//!   follow them or where a folded branch needs them;
//! - for Gemini, every keyword outside its OpenAPI subset is rewritten (`const` → `enum`, a
//!   `type` array → one type with `nullable`, `oneOf` → `anyOf`, `exclusiveMinimum` →
//!   `minimum`) or removed, with what it said put into that schema's `description`.
//!
//! Every rewrite is reported as the keywords it touched ([`Offered::keywords`]) so the caller
//! logs one WARN per tool naming server, tool and keyword. A tool is never dropped here: a
//! schema that cannot be carried is sent as a permissive object with its rules described.
//!
//! Rules, as the providers document them (the fake LLM's dialect profiles enforce the same):
//! - Anthropic Messages: `input_schema` must be `type: "object"` and "does not support
//!   oneOf, allOf, or anyOf at the top level" (its 400 names the tool); nested JSON Schema
//!   (2020-12) is accepted.
//! - OpenAI Chat Completions and Responses without strict mode: "schema must have type
//!   'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level"
//!   (`invalid_function_parameters`); nested JSON Schema is accepted.
//! - Gemini (its OpenAI-compatible endpoint, and gateways in front of Gemini): the `Schema`
//!   object, "a select subset of an OpenAPI 3.0 schema object": `type` (one name),
//!   `format`, `title`, `description`, `nullable`, `enum` (strings), `properties`,
//!   `required`, `items`, `anyOf`, `minItems`/`maxItems`, `minLength`/`maxLength`,
//!   `minProperties`/`maxProperties`, `minimum`/`maximum`, `pattern`, `example`, `default`,
//!   `propertyOrdering`; any other key is `Unknown name "…" … Cannot find field`, and an
//!   object whose `properties` is empty is rejected ("should be non-empty for OBJECT type").

use serde_json::{Map, Value, json};

use crate::config::ProviderKind;
use crate::llm::ToolDef;

/// Which provider's schema rules a request follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SchemaDialect {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Chat Completions or Responses (function tools without strict mode).
    OpenAi,
    /// Gemini's OpenAPI subset.
    Gemini,
}

impl SchemaDialect {
    /// The dialect of a route: Anthropic for the Anthropic route; Gemini on an OpenAI route
    /// whose base URL is Google's (`generativelanguage.googleapis.com`,
    /// `aiplatform.googleapis.com`) or whose model names Gemini (`gemini-2.5-flash`,
    /// `google/gemini-2.5-pro` behind a gateway); else OpenAI.
    #[must_use]
    pub(crate) fn of(provider: &ProviderKind, base_url: &str, model: &str) -> SchemaDialect {
        match provider {
            ProviderKind::Anthropic => SchemaDialect::Anthropic,
            ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses => {
                let url = base_url.to_ascii_lowercase();
                let google = url.contains("generativelanguage.googleapis.com")
                    || url.contains("aiplatform.googleapis.com");
                if google || model.to_ascii_lowercase().contains("gemini") {
                    SchemaDialect::Gemini
                } else {
                    SchemaDialect::OpenAi
                }
            }
        }
    }

    /// The provider as a log line names it.
    #[must_use]
    pub(crate) fn provider_name(self) -> &'static str {
        match self {
            SchemaDialect::Anthropic => "the Anthropic API",
            SchemaDialect::OpenAi => "the OpenAI API",
            SchemaDialect::Gemini => "Gemini",
        }
    }
}

/// A tool's schema as offered to one provider.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Offered {
    /// The schema to send; `None`: send the tool without parameters (Gemini rejects an object
    /// schema whose `properties` is empty; OpenAI's Chat API reads a missing `parameters` as
    /// "no arguments").
    pub(crate) schema: Option<Value>,
    /// Text for the tool's description: the rules of the root the schema could not carry
    /// (`None` when nothing was lost).
    pub(crate) note: Option<String>,
    /// The keywords rewritten or removed, sorted and without duplicates (empty: the source
    /// went out as it is).
    pub(crate) keywords: Vec<String>,
}

impl Offered {
    /// The tool as sent: `input_schema` this schema (`Value::Null` for "send no
    /// parameters"), the lost rules appended to `description` after a blank line.
    #[must_use]
    pub(crate) fn tool_def(&self, name: &str, description: &str) -> ToolDef {
        let description = match (&self.note, description.is_empty()) {
            (None, _) => description.to_owned(),
            (Some(note), true) => note.clone(),
            (Some(note), false) => format!("{description}\n\n{note}"),
        };
        ToolDef {
            name: name.to_owned(),
            description,
            input_schema: self.schema.clone().unwrap_or(Value::Null),
        }
    }

    /// The one WARN line of a rewritten schema, naming the server (as the client named it),
    /// the tool (as the server named it) and the keywords; `None` when the schema went out as
    /// the server wrote it.
    #[must_use]
    pub(crate) fn warning(
        &self,
        server: &str,
        tool: &str,
        dialect: SchemaDialect,
    ) -> Option<String> {
        if self.keywords.is_empty() {
            return None;
        }
        let lost = if self.note.is_some() {
            "; the rules it could not carry are in the tool's description"
        } else {
            ""
        };
        Some(format!(
            "mcp '{server}': tool '{tool}': input schema rewritten for {} ({}){lost}",
            dialect.provider_name(),
            self.keywords.join(", ")
        ))
    }
}

/// Most schema nodes one conversion may produce by inlining `$ref`s: past it a reference is
/// left as a permissive schema with a note (a schema whose definitions refer to each other
/// twice per level would otherwise grow exponentially).
const MAX_INLINED_NODES: usize = 2000;

/// Deepest chain of `$ref`s followed (a recursive definition ends there with a note).
const MAX_REF_DEPTH: usize = 8;

/// Longest note added to one description, in bytes (cut on a character boundary).
const MAX_NOTE_BYTES: usize = 1024;

/// Derives the schema `dialect` accepts from `source`, an object schema (the output of
/// [`crate::tools::normalize_schema`]). Linear in the source, plus what inlining adds (at most
/// [`MAX_INLINED_NODES`] nodes).
#[must_use]
pub(crate) fn offer(source: &Value, dialect: SchemaDialect) -> Offered {
    let mut cx = Convert {
        root: source,
        dialect,
        keywords: Vec::new(),
        inlined: 0,
        active: Vec::new(),
    };
    let Value::Object(map) = source else {
        // normalize_schema only lets objects through; anything else is carried as a note.
        cx.keywords.push("type".into());
        return cx.finish(
            Some(json!({"type": "object", "properties": {}})),
            Some(format!("Arguments schema: {}", compact(source))),
        );
    };
    let mut root = map.clone();
    let mut notes = Vec::new();
    cx.fold_root(&mut root, &mut notes, 0);
    if cx.dialect == SchemaDialect::OpenAi {
        for key in ["enum", "not"] {
            if let Some(v) = root.remove(key) {
                cx.keywords.push(key.into());
                notes.push(format!("{key}: {}", compact(&v)));
            }
        }
    }
    if root.get("type").and_then(Value::as_str) != Some("object") {
        cx.keywords.push("type".into());
        root.insert("type".into(), Value::String("object".into()));
    }
    if !root.get("properties").is_some_and(Value::is_object) {
        root.insert("properties".into(), Value::Object(Map::new()));
    }
    let schema = match cx.dialect {
        SchemaDialect::Anthropic | SchemaDialect::OpenAi => Some(Value::Object(root)),
        SchemaDialect::Gemini => {
            let mut lost = Vec::new();
            let mut node = cx.gemini(Value::Object(root), &mut lost, 0);
            notes.append(&mut lost);
            let empty = node
                .get("properties")
                .and_then(Value::as_object)
                .is_none_or(Map::is_empty);
            if empty {
                None
            } else {
                // The root's own rules go into the tool's description, not the schema's.
                if let Some(obj) = node.as_object_mut() {
                    obj.remove("nullable");
                }
                Some(node)
            }
        }
    };
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    cx.finish(schema, note)
}

/// The state of one conversion.
struct Convert<'a> {
    /// The source root, for resolving local `$ref`s.
    root: &'a Value,
    dialect: SchemaDialect,
    keywords: Vec<String>,
    /// Schema nodes produced by inlining so far.
    inlined: usize,
    /// The references being expanded around the node converted now (a recursive definition
    /// is expanded twice, then described).
    active: Vec<String>,
}

impl Convert<'_> {
    fn finish(mut self, schema: Option<Value>, note: Option<String>) -> Offered {
        self.keywords.sort();
        self.keywords.dedup();
        Offered {
            schema,
            note: note.map(|n| format!("Argument rules: {}.", cut(&n))),
            keywords: self.keywords,
        }
    }

    /// The schema a local `$ref` points at (`#`, `#/$defs/X`, `#/definitions/X`, any JSON
    /// pointer into the root); `None` for a remote or dangling reference.
    fn resolve(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(pointer)
    }

    /// `node` with its `$ref` replaced by the schema it points at (the node's other keys kept,
    /// as 2020-12 reads a `$ref` beside other keywords), repeatedly, up to
    /// [`MAX_REF_DEPTH`] references and the [`MAX_INLINED_NODES`] budget. A reference that
    /// cannot be followed becomes a note in `lost`.
    fn inline_ref(
        &mut self,
        mut node: Map<String, Value>,
        lost: &mut Vec<String>,
    ) -> (Map<String, Value>, Vec<String>) {
        let mut expanded = Vec::new();
        while let Some(Value::String(reference)) = node.get("$ref").cloned() {
            node.remove("$ref");
            self.keywords.push("$ref".into());
            let target = self.resolve(&reference).cloned();
            let size = target.as_ref().map_or(0, count_nodes);
            let recursion = self.active.iter().filter(|r| **r == reference).count();
            match target {
                Some(Value::Object(t))
                    if expanded.len() < MAX_REF_DEPTH
                        && recursion < 2
                        && self.inlined + size <= MAX_INLINED_NODES =>
                {
                    self.inlined += size;
                    expanded.push(reference);
                    for (k, v) in t {
                        match (k.as_str(), node.get_mut(&k), v) {
                            ("$defs" | "definitions", _, _) => {}
                            // Both name properties (the root's `properties: {}` beside a
                            // root `$ref`, say): the node's own win, the target's are added.
                            ("properties", Some(Value::Object(mine)), Value::Object(theirs)) => {
                                for (name, schema) in theirs {
                                    mine.entry(name).or_insert(schema);
                                }
                            }
                            ("required", Some(Value::Array(mine)), Value::Array(theirs)) => {
                                for r in theirs {
                                    if !mine.contains(&r) {
                                        mine.push(r);
                                    }
                                }
                            }
                            (_, Some(_), _) => {}
                            (_, None, v) => {
                                node.insert(k, v);
                            }
                        }
                    }
                }
                Some(_) | None => {
                    lost.push(format!("a value described by {reference}"));
                    break;
                }
            }
        }
        (node, expanded)
    }

    /// Folds the root combinators (`allOf`, `anyOf`, `oneOf`) of `root` into `root` itself
    /// (every dialect: none takes them at the top level). Branches given as `$ref`s are
    /// inlined first; a branch with combinators of its own is folded the same way (up to
    /// [`MAX_REF_DEPTH`] levels).
    fn fold_root(&mut self, root: &mut Map<String, Value>, notes: &mut Vec<String>, depth: usize) {
        if let Some(Value::String(_)) = root.get("$ref") {
            // A root that is only a reference to its definition: the definition is the root.
            let (inlined, _) = self.inline_ref(std::mem::take(root), notes);
            *root = inlined;
        }
        if let Some(all) = root.remove("allOf") {
            self.keywords.push("allOf".into());
            for branch in as_branches(all) {
                let mut b = self.branch(branch, notes, depth);
                merge_all_of(root, &mut b);
            }
        }
        for (key, exactly) in [("oneOf", true), ("anyOf", false)] {
            let Some(any) = root.remove(key) else {
                continue;
            };
            self.keywords.push(key.into());
            let mut sets = Vec::new();
            let mut objects = Vec::new();
            for branch in as_branches(any) {
                let b = self.branch(branch, notes, depth);
                if is_object_branch(&b) {
                    sets.push(describe_branch(&b));
                    objects.push(b);
                } else {
                    notes.push(format!(
                        "the arguments can also be {}",
                        compact(&Value::Object(b))
                    ));
                }
            }
            if objects.is_empty() {
                continue;
            }
            merge_any_of(root, &objects);
            let sets: Vec<String> = sets
                .iter()
                .enumerate()
                .map(|(i, s)| format!("({}) {s}", i + 1))
                .collect();
            let which = if exactly {
                "exactly one"
            } else {
                "at least one"
            };
            notes.push(format!(
                "give {which} of these sets of arguments: {}",
                sets.join(", ")
            ));
        }
    }

    /// One root-combinator branch, ready to merge: an object (a non-object becomes
    /// `{"const": …}`-free `{}`), its `$ref` inlined and its own combinators folded.
    fn branch(
        &mut self,
        branch: Value,
        notes: &mut Vec<String>,
        depth: usize,
    ) -> Map<String, Value> {
        let mut b = match branch {
            Value::Object(m) => m,
            Value::Bool(true) => Map::new(),
            other @ (Value::Null
            | Value::Bool(false)
            | Value::Number(_)
            | Value::String(_)
            | Value::Array(_)) => {
                notes.push(format!("a branch {} was left out", compact(&other)));
                return Map::new();
            }
        };
        b = self.inline_ref(b, notes).0;
        if depth < MAX_REF_DEPTH {
            self.fold_root(&mut b, notes, depth + 1);
        }
        b
    }

    /// Rewrites one schema node (and everything under it) into Gemini's subset. What the
    /// node said that the subset cannot hold is appended to `lost` (for the node's parent to
    /// place: the root's go into the tool's description, every other node's into its own
    /// `description`).
    fn gemini(&mut self, node: Value, lost: &mut Vec<String>, depth: usize) -> Value {
        let mut map = match node {
            Value::Object(m) => m,
            Value::Bool(true) => return Value::Object(Map::new()),
            Value::Bool(false) => {
                self.keywords.push("false".into());
                lost.push("no value is allowed".into());
                return Value::Object(Map::new());
            }
            other @ (Value::Null | Value::Number(_) | Value::String(_) | Value::Array(_)) => {
                self.keywords.push("schema".into());
                lost.push(format!("schema {}", compact(&other)));
                return Value::Object(Map::new());
            }
        };
        let (inlined, expanded) = self.inline_ref(map, lost);
        map = inlined;
        let depth_before = self.active.len();
        self.active.extend(expanded);
        let out = self.gemini_map(map, lost, depth);
        self.active.truncate(depth_before);
        out
    }

    /// [`Convert::gemini`] of an object node whose own `$ref` is inlined.
    fn gemini_map(
        &mut self,
        mut map: Map<String, Value>,
        lost: &mut Vec<String>,
        depth: usize,
    ) -> Value {
        if let Some(all) = map.remove("allOf") {
            self.keywords.push("allOf".into());
            for branch in as_branches(all) {
                if let Value::Object(b) = branch {
                    let (mut b, _) = self.inline_ref(b, lost);
                    merge_all_of(&mut map, &mut b);
                }
            }
        }
        if let Some(one) = map.remove("oneOf") {
            self.keywords.push("oneOf".into());
            lost.push("exactly one of the alternatives".into());
            let mut branches = as_branches(one);
            if let Some(Value::Array(any)) = map.remove("anyOf") {
                branches.extend(any);
            }
            map.insert("anyOf".into(), Value::Array(branches));
        }
        self.gemini_type(&mut map, lost);
        if let Some(c) = map.remove("const") {
            self.keywords.push("const".into());
            match &c {
                Value::String(_) => {
                    map.insert("enum".into(), Value::Array(vec![c]));
                }
                other @ (Value::Null
                | Value::Bool(_)
                | Value::Number(_)
                | Value::Array(_)
                | Value::Object(_)) => {
                    if !map.contains_key("type")
                        && let Some(t) = json_type_name(other)
                    {
                        map.insert("type".into(), Value::String(t.into()));
                    }
                    lost.push(format!("must be {}", compact(other)));
                }
            }
        }
        if let Some(Value::Array(values)) = map.get("enum")
            && !values.iter().all(Value::is_string)
        {
            let values = Value::Array(values.clone());
            map.remove("enum");
            self.keywords.push("enum".into());
            lost.push(format!("one of {}", compact(&values)));
        }
        for (key, bound, word) in [
            ("exclusiveMinimum", "minimum", "greater than"),
            ("exclusiveMaximum", "maximum", "less than"),
        ] {
            if let Some(v) = map.remove(key) {
                self.keywords.push(key.into());
                if v.is_number() && !map.contains_key(bound) {
                    map.insert(bound.into(), v.clone());
                }
                if v.is_number() {
                    lost.push(format!("{word} {}", compact(&v)));
                }
            }
        }
        let mut own = Vec::new();
        let mut out = Map::new();
        for (key, value) in map {
            match key.as_str() {
                "type" | "format" | "title" | "nullable" | "enum" | "required" | "minItems"
                | "maxItems" | "minLength" | "maxLength" | "minProperties" | "maxProperties"
                | "minimum" | "maximum" | "pattern" | "example" | "default"
                | "propertyOrdering" | "description" => {
                    out.insert(key, value);
                }
                "properties" => {
                    let mut props = Map::new();
                    if let Value::Object(p) = value {
                        for (name, schema) in p {
                            let v = self.gemini_child(schema, depth);
                            props.insert(name, v);
                        }
                    }
                    out.insert(key, Value::Object(props));
                }
                "items" => {
                    let items = match value {
                        Value::Array(mut tuple) => {
                            self.keywords.push("items".into());
                            own.push(format!(
                                "the items in order: {}",
                                compact(&Value::Array(tuple.clone()))
                            ));
                            if tuple.is_empty() {
                                Value::Object(Map::new())
                            } else {
                                tuple.swap_remove(0)
                            }
                        }
                        other @ (Value::Null
                        | Value::Bool(_)
                        | Value::Number(_)
                        | Value::String(_)
                        | Value::Object(_)) => other,
                    };
                    let v = self.gemini_child(items, depth);
                    out.insert(key, v);
                }
                "anyOf" => {
                    let branches: Vec<Value> = as_branches(value)
                        .into_iter()
                        .map(|b| self.gemini_child(b, depth))
                        .collect();
                    out.insert(key, Value::Array(branches));
                }
                // Annotations and bookkeeping: nothing a model needs.
                "$schema" | "$id" | "$anchor" | "$comment" | "$defs" | "definitions"
                | "$dynamicAnchor" | "$vocabulary" | "readOnly" | "writeOnly" | "deprecated"
                | "examples" | "contentEncoding" | "contentMediaType" => {
                    self.keywords.push(key);
                }
                "additionalProperties" | "unevaluatedProperties" => {
                    self.keywords.push(key);
                    match value {
                        Value::Bool(false) => own.push("no other keys".into()),
                        Value::Bool(true) => {}
                        schema @ (Value::Null
                        | Value::Number(_)
                        | Value::String(_)
                        | Value::Array(_)
                        | Value::Object(_)) => {
                            own.push(format!("other keys: {}", compact(&schema)));
                        }
                    }
                }
                _ => {
                    own.push(format!("{key}: {}", compact(&value)));
                    self.keywords.push(key);
                }
            }
        }
        if out
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            out.remove("properties");
        }
        if let Some(Value::Array(required)) = out.get("required") {
            let known: Vec<Value> = required
                .iter()
                .filter(|r| {
                    r.as_str().is_some_and(|r| {
                        out.get("properties")
                            .and_then(Value::as_object)
                            .is_some_and(|p| p.contains_key(r))
                    })
                })
                .cloned()
                .collect();
            if known.len() != required.len() {
                self.keywords.push("required".into());
            }
            if known.is_empty() {
                out.remove("required");
            } else {
                out.insert("required".into(), Value::Array(known));
            }
        }
        lost.append(&mut own);
        Value::Object(out)
    }

    /// A node below the root: converted, and what it lost written into its own description.
    fn gemini_child(&mut self, node: Value, depth: usize) -> Value {
        let mut lost = Vec::new();
        let mut v = if depth < 64 {
            self.gemini(node, &mut lost, depth + 1)
        } else {
            self.keywords.push("depth".into());
            lost.push("nested deeper than 64 levels".into());
            Value::Object(Map::new())
        };
        if !lost.is_empty()
            && let Some(obj) = v.as_object_mut()
        {
            let add = format!("({})", cut(&lost.join("; ")));
            let text = match obj.get("description").and_then(Value::as_str) {
                Some(d) if !d.is_empty() => format!("{d} {add}"),
                Some(_) | None => add,
            };
            obj.insert("description".into(), Value::String(text));
        }
        v
    }

    /// Gemini takes one type name: `["string","null"]` becomes `string` with `nullable`,
    /// several non-null types an `anyOf` of them.
    fn gemini_type(&mut self, map: &mut Map<String, Value>, lost: &mut Vec<String>) {
        let Some(t) = map.get("type").cloned() else {
            if map.contains_key("properties") {
                map.insert("type".into(), Value::String("object".into()));
            } else if map.contains_key("items") {
                map.insert("type".into(), Value::String("array".into()));
            }
            return;
        };
        match t {
            Value::String(name) if name == "null" => {
                self.keywords.push("type".into());
                map.remove("type");
                map.insert("nullable".into(), Value::Bool(true));
                lost.push("must be null".into());
            }
            Value::String(_) => {}
            Value::Array(names) => {
                self.keywords.push("type".into());
                let mut kinds: Vec<Value> = Vec::new();
                for n in names {
                    if n.as_str() == Some("null") {
                        map.insert("nullable".into(), Value::Bool(true));
                    } else if n.is_string() && !kinds.contains(&n) {
                        kinds.push(n);
                    }
                }
                map.remove("type");
                match kinds.len() {
                    0 => {}
                    1 => {
                        map.insert("type".into(), kinds.swap_remove(0));
                    }
                    _ if map.contains_key("anyOf") => {
                        lost.push(format!("type {}", compact(&Value::Array(kinds.clone()))));
                        map.insert("type".into(), kinds.swap_remove(0));
                    }
                    _ => {
                        let branches: Vec<Value> =
                            kinds.into_iter().map(|k| json!({"type": k})).collect();
                        map.insert("anyOf".into(), Value::Array(branches));
                    }
                }
            }
            other @ (Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_)) => {
                self.keywords.push("type".into());
                map.remove("type");
                lost.push(format!("type {}", compact(&other)));
            }
        }
    }
}

/// The branches of a combinator value (an array; anything else is one branch).
fn as_branches(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        other @ (Value::Null
        | Value::Bool(_)
        | Value::Number(_)
        | Value::String(_)
        | Value::Object(_)) => vec![other],
    }
}

/// Whether a root-combinator branch describes an object: `type` absent or `object`.
fn is_object_branch(b: &Map<String, Value>) -> bool {
    match b.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    }
}

/// One branch as its argument set for the description: its required properties, its
/// `const` discriminators (`mode="x"`), else its property names.
fn describe_branch(b: &Map<String, Value>) -> String {
    let props = b.get("properties").and_then(Value::as_object);
    let consts: Vec<String> = props
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.get("const").map(|c| format!("{k}={}", compact(c))))
        .collect();
    let required: Vec<String> = b
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|r| !consts.iter().any(|c| c.starts_with(&format!("{r}="))))
        .map(str::to_owned)
        .collect();
    let mut parts = consts;
    parts.extend(required);
    if parts.is_empty() {
        parts = props
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect();
    }
    if parts.is_empty() {
        "no arguments".into()
    } else {
        parts.join(" + ")
    }
}

/// `allOf` semantics into `root`: every property, required name and other keyword of
/// `branch` added (a property both define is required to match both: an `allOf` of the two,
/// unless they are the same). `additionalProperties` is not carried (in an `allOf` it would
/// forbid the other branches' properties).
fn merge_all_of(root: &mut Map<String, Value>, branch: &mut Map<String, Value>) {
    if let Some(Value::Object(props)) = branch.remove("properties") {
        add_properties(root, props);
    }
    if let Some(Value::Array(required)) = branch.remove("required") {
        union_required(root, required);
    }
    branch.remove("additionalProperties");
    for (k, v) in std::mem::take(branch) {
        // A combinator left in a branch (folding stopped at its depth) is not carried up.
        if !matches!(k.as_str(), "allOf" | "anyOf" | "oneOf" | "$ref") {
            root.entry(k).or_insert(v);
        }
    }
}

/// `anyOf`/`oneOf` folded into `root`: the union of the branches' properties (one property
/// spelled differently by different branches: one `enum` when every spelling is a `const` or
/// an `enum`, else an `anyOf` of the spellings), required what every branch requires.
fn merge_any_of(root: &mut Map<String, Value>, branches: &[Map<String, Value>]) {
    let mut merged: Vec<(String, Vec<Value>)> = Vec::new();
    for b in branches {
        for (name, schema) in b
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            match merged.iter_mut().find(|(n, _)| n == name) {
                Some((_, spellings)) => {
                    if !spellings.contains(schema) {
                        spellings.push(schema.clone());
                    }
                }
                None => merged.push((name.clone(), vec![schema.clone()])),
            }
        }
    }
    add_properties(
        root,
        merged
            .into_iter()
            .map(|(name, spellings)| (name, merge_spellings(spellings))),
    );
    let mut common: Option<Vec<Value>> = None;
    for b in branches {
        let req: Vec<Value> = b
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        common = Some(match common {
            None => req,
            Some(c) => c.into_iter().filter(|r| req.contains(r)).collect(),
        });
    }
    union_required(root, common.unwrap_or_default());
    if branches
        .iter()
        .all(|b| b.get("additionalProperties") == Some(&Value::Bool(false)))
    {
        root.entry("additionalProperties")
            .or_insert(Value::Bool(false));
    }
}

/// Adds `props` to `root.properties`: a property the root already defines differently must
/// match both (an `allOf` of the two).
fn add_properties(root: &mut Map<String, Value>, props: impl IntoIterator<Item = (String, Value)>) {
    let target = root
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(target) = target else {
        return;
    };
    for (name, schema) in props {
        match target.get(&name) {
            Some(existing) if *existing != schema => {
                let both = json!({"allOf": [existing.clone(), schema]});
                target.insert(name, both);
            }
            Some(_) => {}
            None => {
                target.insert(name, schema);
            }
        }
    }
}

/// One schema for the spellings of a property across `anyOf` branches.
fn merge_spellings(mut spellings: Vec<Value>) -> Value {
    if spellings.len() == 1 {
        return spellings.swap_remove(0);
    }
    let mut values: Vec<Value> = Vec::new();
    let mut types: Vec<Value> = Vec::new();
    let all_enums = spellings.iter().all(|s| {
        let Some(obj) = s.as_object() else {
            return false;
        };
        let extra = obj
            .keys()
            .any(|k| !matches!(k.as_str(), "const" | "enum" | "type" | "description"));
        if extra {
            return false;
        }
        if let Some(t) = obj.get("type")
            && !types.contains(t)
        {
            types.push(t.clone());
        }
        match (obj.get("const"), obj.get("enum")) {
            (Some(c), None) => {
                if !values.contains(c) {
                    values.push(c.clone());
                }
                true
            }
            (None, Some(Value::Array(e))) => {
                for v in e {
                    if !values.contains(v) {
                        values.push(v.clone());
                    }
                }
                true
            }
            _ => false,
        }
    });
    if all_enums && types.len() <= 1 {
        let mut out = Map::new();
        if let Some(t) = types.pop() {
            out.insert("type".into(), t);
        }
        out.insert("enum".into(), Value::Array(values));
        return Value::Object(out);
    }
    json!({"anyOf": spellings})
}

/// Adds the names in `more` to `root.required`, keeping the order and no duplicates.
fn union_required(root: &mut Map<String, Value>, more: Vec<Value>) {
    if more.is_empty() {
        return;
    }
    let entry = root
        .entry("required")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = entry {
        for r in more {
            if !list.contains(&r) {
                list.push(r);
            }
        }
    } else {
        *entry = Value::Array(more);
    }
}

/// The JSON type name of a value, for a `const` Gemini cannot carry.
fn json_type_name(v: &Value) -> Option<&'static str> {
    match v {
        Value::Bool(_) => Some("boolean"),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some("integer"),
        Value::Number(_) => Some("number"),
        Value::Array(_) => Some("array"),
        Value::Object(_) => Some("object"),
        Value::String(_) => Some("string"),
        Value::Null => None,
    }
}

/// Schema nodes in `v` (objects and arrays), for the inlining budget.
fn count_nodes(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(count_nodes).sum::<usize>(),
        Value::Array(a) => 1 + a.iter().map(count_nodes).sum::<usize>(),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => 0,
    }
}

/// Compact JSON text of `v`, cut to [`MAX_NOTE_BYTES`].
fn compact(v: &Value) -> String {
    cut(&v.to_string())
}

/// `s` cut to [`MAX_NOTE_BYTES`] on a character boundary, with `…` when cut.
fn cut(s: &str) -> String {
    if s.len() <= MAX_NOTE_BYTES {
        return s.to_owned();
    }
    format!("{}…", crate::text::utf8_prefix(s, MAX_NOTE_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [SchemaDialect; 3] = [
        SchemaDialect::Anthropic,
        SchemaDialect::OpenAi,
        SchemaDialect::Gemini,
    ];

    /// The attachment tool of case C63 (Notion's `notion-create-attachment`, reduced).
    fn attachment() -> Value {
        json!({"type": "object", "properties": {}, "anyOf": [
            {"properties": {"content": {"type": "string"}}, "required": ["content"]},
            {"properties": {"source_url": {"type": "string"}}, "required": ["source_url"]}
        ]})
    }

    #[test]
    fn c63_a_root_any_of_folds_into_one_object_and_the_rule_goes_into_the_description() {
        for dialect in ALL {
            let o = offer(&attachment(), dialect);
            let schema = o.schema.unwrap_or_else(|| panic!("{dialect:?}: no schema"));
            assert_eq!(
                schema,
                json!({"type": "object", "properties": {
                    "content": {"type": "string"}, "source_url": {"type": "string"}}}),
                "{dialect:?}"
            );
            assert_eq!(o.keywords, vec!["anyOf".to_string()], "{dialect:?}");
            assert_eq!(
                o.note.as_deref(),
                Some(
                    "Argument rules: give at least one of these sets of arguments: (1) content, (2) source_url."
                )
            );
        }
    }

    #[test]
    fn m14_a_root_one_of_with_const_discriminators_becomes_one_enum() {
        let source = json!({"type": "object", "oneOf": [
            {"properties": {"action": {"type": "string", "const": "create"}, "name": {"type": "string"}},
             "required": ["action", "name"], "additionalProperties": false},
            {"properties": {"action": {"type": "string", "const": "delete"}, "id": {"type": "integer"}},
             "required": ["action", "id"], "additionalProperties": false}
        ], "properties": {}});
        let o = offer(&source, SchemaDialect::Anthropic);
        assert_eq!(
            o.schema,
            Some(json!({"type": "object", "properties": {
                "action": {"type": "string", "enum": ["create", "delete"]},
                "name": {"type": "string"}, "id": {"type": "integer"}},
                "required": ["action"], "additionalProperties": false}))
        );
        assert_eq!(
            o.note.as_deref(),
            Some(
                "Argument rules: give exactly one of these sets of arguments: (1) action=\"create\" + name, (2) action=\"delete\" + id."
            )
        );
    }

    #[test]
    fn m14_a_root_all_of_is_merged_and_branches_given_as_refs_are_inlined() {
        let source = json!({"type": "object", "properties": {"a": {"type": "string"}},
            "required": ["a"],
            "allOf": [{"$ref": "#/$defs/B"}, {"properties": {"c": {"type": "integer"}}, "required": ["c"]}],
            "$defs": {"B": {"properties": {"b": {"$ref": "#/$defs/Leaf"}}, "required": ["b"]},
                      "Leaf": {"type": "boolean"}}});
        let o = offer(&source, SchemaDialect::OpenAi);
        let schema = o.schema.unwrap();
        assert_eq!(schema["required"], json!(["a", "b", "c"]));
        assert_eq!(
            schema["properties"]["b"],
            json!({"$ref": "#/$defs/Leaf"}),
            "nested refs stay for a provider that follows them"
        );
        assert!(schema.get("allOf").is_none() && schema.get("$defs").is_some());
        assert_eq!(o.keywords, vec!["$ref".to_string(), "allOf".to_string()]);
        assert_eq!(o.note, None, "an allOf merge loses nothing");
        // Gemini follows no reference: every one is inlined.
        let g = offer(&source, SchemaDialect::Gemini).schema.unwrap();
        assert_eq!(g["properties"]["b"], json!({"type": "boolean"}));
        assert!(g.get("$defs").is_none());
    }

    #[test]
    fn m14_a_root_that_is_only_a_ref_is_its_definition() {
        let source = json!({"type": "object", "properties": {}, "$ref": "#/definitions/In",
            "definitions": {"In": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}});
        for dialect in ALL {
            let s = offer(&source, dialect).schema.unwrap();
            assert_eq!(
                s["properties"]["q"],
                json!({"type": "string"}),
                "{dialect:?}"
            );
            assert_eq!(s["required"], json!(["q"]), "{dialect:?}");
            assert!(s.get("$ref").is_none(), "{dialect:?}");
        }
    }

    #[test]
    fn m14_openai_also_takes_no_root_enum_or_not_and_anthropic_keeps_them() {
        let source = json!({"type": "object", "properties": {"x": {"type": "string"}},
            "not": {"required": ["y"]}});
        let o = offer(&source, SchemaDialect::OpenAi);
        assert!(o.schema.as_ref().unwrap().get("not").is_none());
        assert_eq!(o.keywords, vec!["not".to_string()]);
        assert_eq!(
            o.note.as_deref(),
            Some(r#"Argument rules: not: {"required":["y"]}."#)
        );
        let a = offer(&source, SchemaDialect::Anthropic);
        assert_eq!(a.schema, Some(source.clone()));
        assert!(a.keywords.is_empty() && a.note.is_none());
    }

    #[test]
    fn m14_a_plain_schema_goes_out_unchanged_to_every_provider() {
        let plain = json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "where", "minLength": 1},
            "mode": {"type": "string", "enum": ["r", "w"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
            "required": ["path"]});
        for dialect in ALL {
            let o = offer(&plain, dialect);
            assert_eq!(o.schema.as_ref(), Some(&plain), "{dialect:?}");
            assert!(o.keywords.is_empty() && o.note.is_none(), "{dialect:?}");
        }
    }

    #[test]
    fn m14_gemini_rewrites_const_type_arrays_bounds_and_extra_keys_into_its_subset() {
        let source = json!({"$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object", "additionalProperties": false, "properties": {
            "mode": {"const": "x"},
            "level": {"const": 3},
            "note": {"type": ["string", "null"]},
            "either": {"type": ["string", "integer"]},
            "ratio": {"type": "number", "exclusiveMinimum": 0},
            "opts": {"type": "object", "additionalProperties": {"type": "string"}, "properties": {}},
            "pick": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "sizes": {"type": "integer", "enum": [1, 2]}},
            "required": ["mode", "ghost"]});
        let o = offer(&source, SchemaDialect::Gemini);
        let s = o.schema.unwrap();
        let p = &s["properties"];
        assert_eq!(p["mode"], json!({"enum": ["x"]}));
        assert_eq!(
            p["level"],
            json!({"type": "integer", "description": "(must be 3)"})
        );
        assert_eq!(p["note"], json!({"type": "string", "nullable": true}));
        assert_eq!(
            p["either"],
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
        );
        assert_eq!(
            p["ratio"],
            json!({"type": "number", "minimum": 0, "description": "(greater than 0)"})
        );
        assert_eq!(
            p["opts"],
            json!({"type": "object", "description": "(other keys: {\"type\":\"string\"})"})
        );
        assert_eq!(
            p["pick"],
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}],
                   "description": "(exactly one of the alternatives)"})
        );
        assert_eq!(
            p["sizes"],
            json!({"type": "integer", "description": "(one of [1,2])"})
        );
        assert_eq!(
            s["required"],
            json!(["mode"]),
            "a required name without a property goes"
        );
        assert!(s.get("$schema").is_none() && s.get("additionalProperties").is_none());
        assert_eq!(o.note.as_deref(), Some("Argument rules: no other keys."));
        for k in [
            "$schema",
            "additionalProperties",
            "const",
            "type",
            "exclusiveMinimum",
            "oneOf",
            "enum",
            "required",
        ] {
            assert!(
                o.keywords.iter().any(|w| w == k),
                "{k} not in {:?}",
                o.keywords
            );
        }
    }

    #[test]
    fn m14_gemini_takes_a_tool_without_arguments_as_no_parameters() {
        for source in [
            json!({"type": "object", "properties": {}}),
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ] {
            let o = offer(&source, SchemaDialect::Gemini);
            assert_eq!(o.schema, None, "{source}");
        }
        let o = offer(
            &json!({"type": "object", "properties": {}}),
            SchemaDialect::OpenAi,
        );
        assert_eq!(o.schema, Some(json!({"type": "object", "properties": {}})));
    }

    #[test]
    fn m14_a_root_if_then_is_kept_where_accepted_and_described_for_gemini() {
        let source = json!({"type": "object", "properties": {"kind": {"type": "string"}, "size": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "big"}}}, "then": {"required": ["size"]}});
        assert_eq!(
            offer(&source, SchemaDialect::Anthropic).schema,
            Some(source.clone())
        );
        let o = offer(&source, SchemaDialect::Gemini);
        assert!(o.schema.as_ref().unwrap().get("if").is_none());
        let note = o.note.unwrap();
        assert!(
            note.contains(r#"if: {"properties":{"kind":{"const":"big"}}}"#)
                && note.contains(r#"then: {"required":["size"]}"#),
            "{note}"
        );
    }

    #[test]
    fn m14_a_recursive_definition_is_expanded_twice_then_described() {
        let source = json!({"type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {"type": "object", "properties": {
                "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}});
        let s = offer(&source, SchemaDialect::Gemini).schema.unwrap();
        let level2 = &s["properties"]["root"]["properties"]["children"]["items"];
        assert_eq!(level2["properties"]["name"], json!({"type": "string"}));
        let level3 = &level2["properties"]["children"]["items"];
        assert_eq!(
            level3["description"],
            json!("(a value described by #/$defs/Node)"),
            "{s}"
        );
    }

    #[test]
    fn m14_inlining_stops_at_its_budget_on_a_schema_that_doubles_per_level() {
        let mut defs = Map::new();
        for i in 0..30 {
            let next = format!("#/$defs/D{}", i + 1);
            defs.insert(
                format!("D{i}"),
                json!({"type": "object", "properties": {
                "a": {"$ref": next}, "b": {"$ref": next}}}),
            );
        }
        defs.insert("D30".into(), json!({"type": "string"}));
        let source =
            json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs});
        let s = offer(&source, SchemaDialect::Gemini).schema.unwrap();
        assert!(
            count_nodes(&s) < 3 * MAX_INLINED_NODES,
            "{}",
            count_nodes(&s)
        );
    }

    /// Keys Gemini's Schema object takes.
    const GEMINI_KEYS: [&str; 22] = [
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "properties",
        "required",
        "items",
        "anyOf",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "minimum",
        "maximum",
        "pattern",
        "example",
        "default",
        "propertyOrdering",
    ];

    /// Every node of a Gemini schema uses only its keys, one type name, string enums and
    /// non-empty `properties`.
    fn gemini_ok(v: &Value) -> Result<(), String> {
        let Some(m) = v.as_object() else {
            return Err(format!("not an object: {v}"));
        };
        for (k, val) in m {
            if !GEMINI_KEYS.contains(&k.as_str()) {
                return Err(format!("key {k}"));
            }
            match k.as_str() {
                "type" if !val.is_string() => return Err(format!("type {val}")),
                "enum"
                    if !val
                        .as_array()
                        .is_some_and(|a| a.iter().all(Value::is_string)) =>
                {
                    return Err(format!("enum {val}"));
                }
                "properties" => {
                    let p = val.as_object().ok_or("properties")?;
                    if p.is_empty() {
                        return Err("empty properties".into());
                    }
                    for c in p.values() {
                        gemini_ok(c)?;
                    }
                }
                "items" => gemini_ok(val)?,
                "anyOf" => {
                    for c in val.as_array().ok_or("anyOf")? {
                        gemini_ok(c)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// JSON-Schema-like trees built from the keywords MCP servers use.
    fn schema_tree() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!({"type": "string"})),
            Just(json!({"type": ["string", "null"]})),
            Just(json!({"const": "k"})),
            Just(json!({"const": 1})),
            Just(json!({"enum": [1, "a"]})),
            Just(json!({"$ref": "#/$defs/S"})),
            Just(json!({"$ref": "#"})),
            Just(json!({"$ref": "https://example.com/x.json"})),
            Just(json!({"type": "integer", "exclusiveMaximum": 5})),
            Just(json!(true)),
            Just(json!({})),
        ];
        leaf.prop_recursive(4, 40, 4, |inner| {
            prop_oneof![
                prop::collection::btree_map("[a-c]", inner.clone(), 0..3).prop_map(|p| {
                    json!({"type": "object", "properties": p, "additionalProperties": false})
                }),
                inner
                    .clone()
                    .prop_map(|i| json!({"type": "array", "items": i})),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|b| json!({"anyOf": b})),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|b| json!({"oneOf": b})),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|b| json!({"allOf": b})),
                (inner.clone(), inner).prop_map(|(a, b)| json!({"if": a, "then": b, "not": {}})),
            ]
        })
    }

    proptest! {
        /// Whatever the MCP server wrote, every dialect's schema keeps its provider's rules:
        /// an object root without root combinators (and, for OpenAI, no root `enum`/`not`);
        /// for Gemini, only its subset at every node.
        #[test]
        fn m14_every_dialect_s_schema_is_one_its_provider_accepts(
            root in schema_tree(),
            props in prop::collection::btree_map("[a-d]", schema_tree(), 0..3),
        ) {
            let mut source = root.as_object().cloned().unwrap_or_default();
            source.insert("type".into(), json!("object"));
            source.insert("properties".into(), Value::Object(props.into_iter().collect()));
            source.insert("$defs".into(), json!({"S": {"type": "string", "minLength": 1}}));
            let source = Value::Object(source);
            for dialect in ALL {
                let o = offer(&source, dialect);
                let Some(s) = o.schema else {
                    prop_assert_eq!(dialect, SchemaDialect::Gemini);
                    continue;
                };
                prop_assert_eq!(s.get("type"), Some(&json!("object")), "{:?} {}", dialect, s);
                for k in ["anyOf", "oneOf", "allOf"] {
                    prop_assert!(s.get(k).is_none(), "{:?}: root {} in {}", dialect, k, s);
                }
                match dialect {
                    SchemaDialect::OpenAi => {
                        prop_assert!(s.get("enum").is_none() && s.get("not").is_none());
                    }
                    SchemaDialect::Gemini => {
                        if let Err(e) = gemini_ok(&s) {
                            prop_assert!(false, "gemini: {} in {}", e, s);
                        }
                    }
                    SchemaDialect::Anthropic => {}
                }
                prop_assert!(o.keywords.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }

    #[test]
    fn c63_the_tool_as_sent_carries_the_rules_and_one_warn_names_server_tool_and_keyword() {
        let o = offer(&attachment(), SchemaDialect::Anthropic);
        let def = o.tool_def("n__create_attachment", "Attach a file");
        assert_eq!(
            def.description,
            "Attach a file\n\nArgument rules: give at least one of these sets of arguments: (1) content, (2) source_url."
        );
        assert!(def.input_schema.get("anyOf").is_none());
        assert_eq!(
            o.warning("n", "create_attachment", SchemaDialect::Anthropic)
                .as_deref(),
            Some(
                "mcp 'n': tool 'create_attachment': input schema rewritten for the Anthropic API (anyOf); the rules it could not carry are in the tool's description"
            )
        );
        let plain = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let p = offer(&plain, SchemaDialect::Anthropic);
        assert_eq!(p.warning("n", "search", SchemaDialect::Anthropic), None);
        assert_eq!(p.tool_def("n__search", "").description, "");
        // Gemini: a tool without arguments is sent without parameters.
        let bare = offer(
            &json!({"type": "object", "properties": {}}),
            SchemaDialect::Gemini,
        );
        assert_eq!(bare.tool_def("n__ping", "Ping").input_schema, Value::Null);
    }

    #[test]
    fn m14_the_dialect_follows_the_route_the_base_url_and_the_model() {
        let d = SchemaDialect::of;
        assert_eq!(
            d(
                &ProviderKind::Anthropic,
                "https://api.anthropic.com",
                "claude-sonnet-4-5"
            ),
            SchemaDialect::Anthropic
        );
        assert_eq!(
            d(
                &ProviderKind::OpenAiChat,
                "https://api.openai.com/v1",
                "gpt-5.4"
            ),
            SchemaDialect::OpenAi
        );
        assert_eq!(
            d(
                &ProviderKind::OpenAiResponses,
                "https://api.openai.com/v1",
                "o4-mini"
            ),
            SchemaDialect::OpenAi
        );
        assert_eq!(
            d(
                &ProviderKind::OpenAiChat,
                "https://generativelanguage.googleapis.com/v1beta/openai",
                "x"
            ),
            SchemaDialect::Gemini
        );
        assert_eq!(
            d(
                &ProviderKind::OpenAiChat,
                "https://openrouter.ai/api/v1",
                "google/Gemini-2.5-Pro"
            ),
            SchemaDialect::Gemini
        );
    }
}
