//! MCP tools as the model sees them: qualified names (SPEC M3), schema normalisation (M3, case
//! C19), and tool-result conversion with middle elision (L3).

use serde_json::{Map, Value, json};

/// Separator between server and tool in a qualified name (SPEC M3).
pub(crate) const QUALIFIER: &str = "__";

/// Whether `name` is a valid MCP server name: `[A-Za-z0-9_-]+` without `__` (SPEC M3).
#[must_use]
pub(crate) fn is_valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.contains(QUALIFIER)
}

/// The tool-name prefix of the server the client named `name` (SPEC A2, M3, case C55): the
/// name itself when it is a valid server name, else a safe and stable stand-in: every run of
/// bytes outside `[A-Za-z0-9-]` (and of `_`) becomes one `_`, leading and trailing `_` are
/// dropped, the rest cut to 32 bytes (`mcp` when nothing is left), then `_` and 8 hex digits of
/// a stable hash of the original name. `fs` → `fs`; `My Files` → `My_Files_` + hash;
/// `ünï` → `mcp_` + hash. The result never contains `__`, so `<prefix>__<tool>` stays readable.
///
/// A valid name that ends in `_` gets the stand-in too (`g_` → `g_` + hash): with it as the
/// prefix, its tool `Stop` would be `g___Stop`, the name under which the hook `_Stop` of a
/// server `g` is injected (SPEC H6). Since no prefix contains `__` or ends in `_`, the first
/// `__` of `<prefix>__<name>` ends the prefix, so a qualified name identifies one server and
/// one name, and a tool (whose name does not start with `_`) never shares one with a hook.
#[must_use]
pub(crate) fn server_prefix(name: &str) -> String {
    if is_valid_server_name(name) && !name.ends_with('_') {
        return name.to_string();
    }
    let mut base = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            base.push(c);
        } else if !base.ends_with('_') {
            base.push('_');
        }
    }
    let mut base = base.trim_matches('_').to_string();
    base.truncate(32);
    let base = base.trim_end_matches('_');
    let base = if base.is_empty() { "mcp" } else { base };
    format!("{base}_{:08x}", fnv1a(name.as_bytes()) & 0xffff_ffff)
}

/// The ACP `kind` of a model tool call (SPEC A6, case C53), from the MCP tool's `annotations`
/// and its name. Only hints set to `true` count (MCP's defaults, `destructiveHint: true` and
/// `openWorldHint: true` when unset, would make every unannotated tool an edit):
/// - `readOnlyHint` with `openWorldHint` → `fetch` (it reads from outside the machine);
/// - `readOnlyHint` → `search` when the name says so (`search`, `find`, `grep`), else `read`;
/// - `destructiveHint` → `delete` when the name says so (`delete`, `remove`, `rm`, `unlink`,
///   `drop`, `destroy`, `erase`, `purge`, `trash`), `move` when it says `move` or `rename`,
///   else `edit`;
/// - `openWorldHint` → `fetch`;
/// - anything else → `other`.
///
/// `read_text_file` `{readOnlyHint: true}` → `read`; `write_file` `{destructiveHint: true}` →
/// `edit`; `delete_file` `{destructiveHint: true}` → `delete`.
#[must_use]
pub(crate) fn tool_kind(bare: &str, annotations: Option<&Value>) -> &'static str {
    let hint = |k: &str| {
        annotations
            .and_then(|a| a.get(k))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let words: Vec<String> = bare
        .split(|c: char| !c.is_ascii_alphanumeric())
        .flat_map(split_camel)
        .collect();
    let named = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    let (read_only, destructive, open_world) = (
        hint("readOnlyHint"),
        hint("destructiveHint"),
        hint("openWorldHint"),
    );
    if read_only && open_world {
        "fetch"
    } else if read_only {
        if named(&["search", "find", "grep"]) {
            "search"
        } else {
            "read"
        }
    } else if destructive {
        if named(&[
            "delete", "remove", "rm", "unlink", "drop", "destroy", "erase", "purge", "trash",
        ]) {
            "delete"
        } else if named(&["move", "rename", "mv"]) {
            "move"
        } else {
            "edit"
        }
    } else if open_world {
        "fetch"
    } else {
        "other"
    }
}

/// `searchFiles` → `search`, `files`; lowercase words of one camelCase piece.
fn split_camel(piece: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    for c in piece.chars() {
        if c.is_ascii_uppercase() && !cur.is_empty() {
            words.push(std::mem::take(&mut cur));
        }
        cur.push(c.to_ascii_lowercase());
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// The ACP `title` of a model tool call (SPEC A6, case C53): the MCP tool's `title`, else its
/// `annotations.title`, else `<server>: <tool>` with the server's name as the client gave it.
#[must_use]
pub(crate) fn tool_title(server: &str, bare: &str, tool: &Value) -> String {
    let given = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    };
    given(tool.get("title"))
        .or_else(|| given(tool.get("annotations").and_then(|a| a.get("title"))))
        .unwrap_or_else(|| format!("{server}: {bare}"))
}

/// Whether `name` is a hook name: a bare tool name starting with `_` (SPEC M4, H1).
#[must_use]
pub(crate) fn is_hook_name(bare: &str) -> bool {
    bare.starts_with('_')
}

/// Whether `name` is provider-safe: `^[A-Za-z0-9_-]{1,64}$` (SPEC M3).
#[must_use]
pub(crate) fn is_provider_safe(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// 64-bit FNV-1a: a stable hash for name suffixes (same input → same name on every run).
#[must_use]
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The provider-visible name of `server__tool` (SPEC M3): the qualified name itself when it is
/// provider-safe, else invalid bytes replaced by `_` and, when too long, shortened to 55 bytes
/// plus `_` and 8 hex digits of a stable hash of the original qualified name.
/// (`fs`, `read_file`) → `fs__read_file`; (`fs`, `read.file`) → `fs__read_file_` + hash.
#[must_use]
pub(crate) fn exposed_name(server: &str, tool: &str) -> String {
    let qualified = format!("{server}{QUALIFIER}{tool}");
    if is_provider_safe(&qualified) {
        return qualified;
    }
    let mut s: String = qualified
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let hash = fnv1a(qualified.as_bytes());
    if s.len() > 64 || s.is_empty() || s != qualified {
        s.truncate(55);
        s.push_str(&format!("_{:08x}", hash & 0xffff_ffff));
    }
    s
}

/// Normalise an MCP `inputSchema` for providers (SPEC M3, case C19): missing, non-object or
/// type-less schemas become `{"type":"object","properties":{}}` keeping other keys; an object
/// schema whose root `type` is not `"object"` is unusable.
///
/// # Errors
/// A description of why the schema is unusable (the tool is dropped with a warning).
pub(crate) fn normalize_schema(schema: Option<&Value>) -> Result<Value, String> {
    let mut map = match schema {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(format!(
                "inputSchema is not an object: {}",
                crate::jsonrpc::json_type(other)
            ));
        }
    };
    match map.get("type") {
        None => {
            map.insert("type".into(), Value::String("object".into()));
        }
        Some(Value::String(t)) if t == "object" => {}
        Some(t) => return Err(format!("inputSchema root type is {t}, not \"object\"")),
    }
    if !map.get("properties").is_some_and(Value::is_object) {
        map.insert("properties".into(), Value::Object(Map::new()));
    }
    Ok(Value::Object(map))
}

/// A converted tool result (SPEC L3, A6): the text the model sees, whether it is an error, and
/// what the client is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOutput {
    pub text: String,
    pub is_error: bool,
    /// The ACP `ToolCallContent` items of the terminal `tool_call_update` (case C59); `None`:
    /// one text item with [`ToolOutput::text`] (agent-side outcomes: denied, timeout, …).
    pub display: Option<Vec<Value>>,
}

impl ToolOutput {
    /// An agent-side outcome: the model and the client see the same `text`.
    pub(crate) fn plain(text: String, is_error: bool) -> ToolOutput {
        ToolOutput {
            text,
            is_error,
            display: None,
        }
    }

    /// The `content` of the terminal `tool_call_update` (SPEC A6).
    pub(crate) fn client_content(&self) -> Vec<Value> {
        match &self.display {
            Some(items) => items.clone(),
            None => vec![text_content(&self.text)],
        }
    }
}

/// An ACP `ToolCallContent` item holding text.
pub(crate) fn text_content(text: &str) -> Value {
    json!({"type": "content", "content": {"type": "text", "text": text}})
}

/// Image and audio data passed to the client at most (base64 bytes); a bigger block is shown
/// as its marker text.
pub(crate) const MAX_CLIENT_MEDIA_BYTES: usize = 4 * 1024 * 1024;

/// Who an MCP content block is for, from its `annotations.audience` (case C59): `(model,
/// client)`. No audience, or one naming both, is for both; `["user"]` only for the client,
/// `["assistant"]` only for the model.
fn audience(block: &Value) -> (bool, bool) {
    match block
        .get("annotations")
        .and_then(|a| a.get("audience"))
        .and_then(Value::as_array)
    {
        None => (true, true),
        Some(list) => {
            let has = |r: &str| list.iter().any(|v| v.as_str() == Some(r));
            (has("assistant"), has("user"))
        }
    }
}

/// Convert an MCP `tools/call` result (SPEC L3, A6, cases C54, C59). The model's text: text
/// blocks joined with `\n`; `structuredContent` as JSON text when there is no text; images,
/// audio and blobs replaced by a short marker; `resource_link` → `[resource: uri]`; text over
/// `cap` bytes middle-elided. The client's content: the same blocks as ACP content (images and
/// audio as themselves up to [`MAX_CLIENT_MEDIA_BYTES`], text elided the same way). A block
/// whose `audience` is `["user"]` reaches only the client, `["assistant"]` only the model.
#[must_use]
pub(crate) fn convert_result(result: &Value, cap: usize) -> ToolOutput {
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut parts: Vec<String> = Vec::new();
    let mut shown: Vec<Value> = Vec::new();
    let mut saw_text = false;
    if let Some(blocks) = result.get("content").and_then(Value::as_array) {
        for b in blocks {
            let (to_model, to_client) = audience(b);
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
            let (part, item) = match kind {
                "text" => {
                    let t = b.get("text").and_then(Value::as_str).unwrap_or("");
                    if to_model {
                        saw_text = true;
                    }
                    (
                        t.to_string(),
                        text_content(&elide_middle(t.to_string(), cap)),
                    )
                }
                "image" | "audio" => {
                    let mime = b
                        .get("mimeType")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown");
                    let data = b.get("data").and_then(Value::as_str).unwrap_or("");
                    let n = base64_decoded_len(data);
                    let marker = format!("[{kind} elided: {mime}, {n} bytes]");
                    let item = if data.len() <= MAX_CLIENT_MEDIA_BYTES {
                        json!({"type": "content", "content": {"type": kind, "data": data, "mimeType": mime}})
                    } else {
                        text_content(&marker)
                    };
                    (marker, item)
                }
                "resource_link" => {
                    let uri = b.get("uri").and_then(Value::as_str).unwrap_or("");
                    let name = b.get("name").and_then(Value::as_str).unwrap_or(uri);
                    (
                        format!("[resource: {uri}]"),
                        json!({"type": "content", "content": {"type": "resource_link", "uri": uri, "name": name}}),
                    )
                }
                "resource" => {
                    let r = b.get("resource").unwrap_or(&Value::Null);
                    let uri = r.get("uri").and_then(Value::as_str).unwrap_or("");
                    if let Some(t) = r.get("text").and_then(Value::as_str) {
                        if to_model {
                            saw_text = true;
                        }
                        let text = format!("[resource: {uri}]\n{t}");
                        let item = text_content(&elide_middle(text.clone(), cap));
                        (text, item)
                    } else {
                        let mime = r
                            .get("mimeType")
                            .and_then(Value::as_str)
                            .unwrap_or("unknown");
                        let n =
                            base64_decoded_len(r.get("blob").and_then(Value::as_str).unwrap_or(""));
                        let marker = format!("[resource elided: {uri}, {mime}, {n} bytes]");
                        let item = text_content(&marker);
                        (marker, item)
                    }
                }
                other => {
                    let marker = format!(
                        "[{} content elided]",
                        if other.is_empty() { "unknown" } else { other }
                    );
                    let item = text_content(&marker);
                    (marker, item)
                }
            };
            if to_model {
                parts.push(part);
            }
            if to_client {
                shown.push(item);
            }
        }
    }
    if !saw_text && let Some(sc) = result.get("structuredContent").filter(|v| !v.is_null()) {
        let sc = sc.to_string();
        if shown.is_empty() {
            shown.push(text_content(&elide_middle(sc.clone(), cap)));
        }
        parts.insert(0, sc);
    }
    let text = elide_middle(parts.join("\n"), cap);
    ToolOutput {
        text,
        is_error,
        display: Some(shown),
    }
}

/// A hook's answer (SPEC H3, case C40): the text of the result's `content` blocks of type
/// `text`, joined with `\n`, middle-elided over `cap` bytes (as tool text, L3), and whether the
/// result was `isError`. `structuredContent` and every other block type are ignored: FastMCP's
/// `return None` (`{"content":[],"structuredContent":{"result":null}}`) is an empty answer, not
/// the objection `{"result":null}`.
#[must_use]
pub(crate) fn hook_answer(result: &Value, cap: usize) -> ToolOutput {
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let text = result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    ToolOutput::plain(elide_middle(text, cap), is_error)
}

/// Approximate decoded size of base64 text, in bytes.
fn base64_decoded_len(s: &str) -> usize {
    let t = s.trim_end_matches('=');
    t.len() * 3 / 4
}

/// Middle-elide `text` to at most about `cap` bytes (SPEC L3): keep the head and the tail, put
/// one marker line with the elided byte count between them, never split a UTF-8 character.
#[must_use]
pub(crate) fn elide_middle(text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let marker_budget = 64;
    let keep = cap.saturating_sub(marker_budget);
    let mut head_end = keep / 2;
    while head_end > 0 && !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - (keep - keep / 2);
    while tail_start < text.len() && !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let elided = tail_start - head_end;
    let mut out = String::with_capacity(cap + 8);
    out.push_str(&text[..head_end]);
    out.push_str(&format!("\n[… {elided} bytes elided …]\n"));
    out.push_str(&text[tail_start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m3_exposed_names_are_provider_safe_and_stable() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        let odd = exposed_name("fs", "read.file");
        assert!(is_provider_safe(&odd) && odd.starts_with("fs__read_file_"));
        assert_eq!(
            odd,
            exposed_name("fs", "read.file"),
            "stable: mapped back exactly"
        );
    }
    use serde_json::json;

    #[test]
    fn m3_safe_names_are_kept_and_unsafe_ones_sanitized_stably() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        let a = exposed_name("fs", "read.file");
        assert!(is_provider_safe(&a), "{a}");
        assert_eq!(a, exposed_name("fs", "read.file"));
        assert_ne!(a, exposed_name("fs", "read/file"));
        let long = "x".repeat(100);
        let b = exposed_name("srv", &long);
        assert!(is_provider_safe(&b) && b.len() <= 64, "{b}");
    }

    #[test]
    fn m3_server_names_are_validated() {
        assert!(is_valid_server_name("test-guard_1"));
        assert!(!is_valid_server_name("a__b"));
        assert!(!is_valid_server_name(""));
        assert!(!is_valid_server_name("a b"));
    }

    #[test]
    fn c55_odd_server_names_get_a_safe_stable_prefix() {
        assert_eq!(server_prefix("fs"), "fs");
        assert_eq!(server_prefix("test-guard_1"), "test-guard_1");
        let long = format!("{} x", "y".repeat(80));
        let cases = [
            "My Files",
            "my.fs",
            "github/copilot",
            "ünï",
            "a__b",
            "  ",
            long.as_str(),
        ]
        .map(str::to_string);
        let mut seen = std::collections::BTreeSet::new();
        for name in &cases {
            let p = server_prefix(name);
            assert!(is_valid_server_name(&p), "{name:?} → {p:?}");
            assert_eq!(p, server_prefix(name), "stable");
            assert!(p.len() <= 41, "{p}");
            assert!(seen.insert(p.clone()), "distinct: {p}");
            assert!(is_provider_safe(&exposed_name(&p, "read_file")));
        }
        assert!(server_prefix("My Files").starts_with("My_Files_"));
        assert!(server_prefix("my.fs").starts_with("my_fs_"));
        assert!(server_prefix("github/copilot").starts_with("github_copilot_"));
        assert!(server_prefix("ünï").starts_with("n_"));
        assert!(server_prefix("ü ï").starts_with("mcp_"));
    }

    #[test]
    fn names_that_collide_a_tool_never_takes_the_qualified_name_of_another_servers_tool_or_hook() {
        // `g_` + `Stop` and `g` + `_Stop` (the H6 injection name) were both `g___Stop`.
        let g_ = server_prefix("g_");
        assert!(g_.starts_with("g_") && g_.len() == 10, "{g_}");
        assert_ne!(exposed_name(&g_, "Stop"), exposed_name("g", "_Stop"));
        assert_eq!(exposed_name("g", "_Stop"), "g___Stop");
        // Every (server, name) pair of a set of tricky ones gives its own qualified name.
        let servers = [
            "g", "g_", "g__", "_g", "a", "a_b", "a__b", "a-", "a_", "x y", "x_y",
        ];
        let names = ["Stop", "_Stop", "b", "b__c", "_b", "c_", "b___Stop"];
        let mut seen = std::collections::BTreeMap::new();
        for server in servers {
            let prefix = server_prefix(server);
            assert!(
                !prefix.ends_with('_') && !prefix.contains(QUALIFIER),
                "{prefix}"
            );
            for name in names {
                let qualified = format!("{prefix}{QUALIFIER}{name}");
                if let Some(other) = seen.insert(qualified.clone(), (server, name)) {
                    panic!("{qualified}: {other:?} and {:?}", (server, name));
                }
            }
        }
    }

    #[test]
    fn c53_kind_comes_from_annotations_and_the_name() {
        let k = |name: &str, v: Value| tool_kind(name, Some(&v));
        assert_eq!(k("read_text_file", json!({"readOnlyHint": true})), "read");
        assert_eq!(k("search_files", json!({"readOnlyHint": true})), "search");
        assert_eq!(k("findFiles", json!({"readOnlyHint": true})), "search");
        assert_eq!(
            k(
                "web_get",
                json!({"readOnlyHint": true, "openWorldHint": true})
            ),
            "fetch"
        );
        assert_eq!(k("write_file", json!({"destructiveHint": true})), "edit");
        assert_eq!(k("delete_file", json!({"destructiveHint": true})), "delete");
        assert_eq!(k("rm", json!({"destructiveHint": true})), "delete");
        assert_eq!(k("removeItem", json!({"destructiveHint": true})), "delete");
        assert_eq!(k("post", json!({"openWorldHint": true})), "fetch");
        assert_eq!(k("move_file", json!({"destructiveHint": true})), "move");
        assert_eq!(
            k(
                "create_directory",
                json!({"readOnlyHint": false, "destructiveHint": false})
            ),
            "other"
        );
        assert_eq!(tool_kind("read_file", None), "other", "no hint, no guess");
        assert_eq!(k("x", json!({"readOnlyHint": "yes"})), "other");
    }

    #[test]
    fn c53_title_is_the_tools_title_else_server_and_tool() {
        let t = json!({"name": "read_text_file", "title": "Read Text File", "annotations": {"title": "Other"}});
        assert_eq!(tool_title("fs", "read_text_file", &t), "Read Text File");
        let t = json!({"name": "x", "annotations": {"title": "Annotated"}});
        assert_eq!(tool_title("fs", "x", &t), "Annotated");
        assert_eq!(
            tool_title("My Files", "x", &json!({"title": " "})),
            "My Files: x"
        );
    }

    #[test]
    fn c59_images_reach_the_client_and_audience_picks_the_reader() {
        let r = json!({"content": [
            {"type": "text", "text": "for both"},
            {"type": "image", "mimeType": "image/png", "data": "AAAA"},
            {"type": "text", "text": "user only", "annotations": {"audience": ["user"]}},
            {"type": "text", "text": "model only", "annotations": {"audience": ["assistant"]}},
            {"type": "text", "text": "both again", "annotations": {"audience": ["user", "assistant"]}}
        ]});
        let out = convert_result(&r, 1 << 20);
        assert_eq!(
            out.text,
            "for both\n[image elided: image/png, 3 bytes]\nmodel only\nboth again"
        );
        let shown = out.client_content();
        assert_eq!(
            shown,
            vec![
                text_content("for both"),
                json!({"type": "content", "content": {"type": "image", "data": "AAAA", "mimeType": "image/png"}}),
                text_content("user only"),
                text_content("both again"),
            ]
        );
        let big = "A".repeat(MAX_CLIENT_MEDIA_BYTES + 4);
        let out = convert_result(
            &json!({"content": [{"type": "image", "mimeType": "image/png", "data": big}]}),
            1024,
        );
        assert_eq!(
            out.client_content()[0]["content"]["type"],
            "text",
            "too big: its marker"
        );
    }

    #[test]
    fn c19_schemas_are_normalized_or_rejected() {
        let obj = json!({"type":"object","properties":{}});
        assert_eq!(normalize_schema(None).unwrap(), obj);
        assert_eq!(normalize_schema(Some(&json!({}))).unwrap(), obj);
        let b = normalize_schema(Some(&json!({"$schema":"x"}))).unwrap();
        assert_eq!(b["type"], "object");
        assert_eq!(b["$schema"], "x");
        assert!(normalize_schema(Some(&json!({"type":"string"}))).is_err());
        assert!(normalize_schema(Some(&json!([1]))).is_err());
        let f = json!({"type":"object","properties":{"mode":{"const":"x"}},"required":["mode"]});
        assert_eq!(normalize_schema(Some(&f)).unwrap(), f);
    }

    #[test]
    fn l3_results_are_converted() {
        let r = json!({"content":[{"type":"text","text":"a"},{"type":"image","mimeType":"image/png","data":"AAAA"},
            {"type":"resource_link","uri":"file:///x"},{"type":"text","text":"b"}],"isError":true});
        let out = convert_result(&r, 1 << 20);
        assert_eq!(
            out.text,
            "a\n[image elided: image/png, 3 bytes]\n[resource: file:///x]\nb"
        );
        assert!(out.is_error);
        let s = convert_result(&json!({"content":[],"structuredContent":{"k":1}}), 1024);
        assert_eq!(s.text, "{\"k\":1}");
    }

    #[test]
    fn c40_hook_answer_is_content_text_only() {
        // FastMCP `return None`: empty, never the structuredContent fallback.
        let none = json!({"content":[],"structuredContent":{"result":null},"isError":false});
        assert_eq!(
            hook_answer(&none, 1024),
            ToolOutput::plain(String::new(), false)
        );
        // FastMCP `return "fix it"` also mirrors the text in structuredContent: counted once.
        let s = json!({"content":[{"type":"text","text":"fix it"}],"structuredContent":{"result":"fix it"}});
        assert_eq!(hook_answer(&s, 1024).text, "fix it");
        // Only text blocks, joined with a newline; images, links and resources are ignored.
        let mixed = json!({"content":[{"type":"text","text":"a"},{"type":"image","mimeType":"image/png","data":"AAAA"},
            {"type":"resource_link","uri":"file:///x"},{"type":"text","text":"b"}]});
        assert_eq!(hook_answer(&mixed, 1024).text, "a\nb");
        let only_structured = json!({"content":[],"structuredContent":{"objection":"tests fail"}});
        assert_eq!(hook_answer(&only_structured, 1024).text, "");
        let err = json!({"content":[{"type":"text","text":"boom"}],"isError":true});
        assert!(hook_answer(&err, 1024).is_error);
        assert_eq!(hook_answer(&json!({}), 1024).text, "");
    }

    #[test]
    fn l3_long_text_is_middle_elided_utf8_safe() {
        let text = "é".repeat(5000);
        let out = elide_middle(text.clone(), 1024);
        assert!(out.len() <= 1024 + 8, "{}", out.len());
        assert!(out.starts_with("é") && out.ends_with("é"));
        assert!(out.contains("bytes elided"));
        assert_eq!(elide_middle("short".into(), 1024), "short");
    }

    #[test]
    fn m3_the_name_hash_is_64_bit_fnv_1a() {
        // The published FNV-1a test vectors: the suffix of a sanitized name is the same in
        // every build and every run.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn l3_elision_keeps_equal_head_and_tail_and_names_the_bytes_cut_out() {
        // cap 74: 64 bytes for the marker, 10 kept, 5 at each end.
        let text = "0123456789".repeat(10);
        assert_eq!(
            elide_middle(text, 74),
            "01234\n[… 90 bytes elided …]\n56789"
        );
        let text = "0123456789".repeat(10);
        assert_eq!(
            elide_middle(text, 75),
            "01234\n[… 89 bytes elided …]\n456789",
            "an odd number kept: the tail takes the extra byte"
        );
        assert_eq!(
            elide_middle("x".repeat(74), 74),
            "x".repeat(74),
            "at the cap"
        );
    }

    #[test]
    fn l3_elision_moves_each_cut_outwards_to_a_character_boundary() {
        // 40 three-byte characters; the cuts at 5 and 115 fall inside characters: the head
        // ends at 3 (one whole `€`), the tail starts at 117 (one whole `€`).
        let text = "€".repeat(40);
        assert_eq!(elide_middle(text, 74), "€\n[… 114 bytes elided …]\n€");
    }

    #[test]
    fn c59_media_up_to_4_mib_of_base64_reaches_the_client_and_bigger_is_its_marker() {
        let media = |len: usize| {
            let data = "A".repeat(len);
            let out = convert_result(
                &json!({"content": [{"type": "audio", "mimeType": "audio/wav", "data": data}]}),
                1024,
            );
            out.client_content()[0]["content"]["type"].clone()
        };
        assert_eq!(media(4 * 1024 * 1024), "audio", "exactly 4 MiB: itself");
        assert_eq!(
            media(4 * 1024 * 1024 + 1),
            "text",
            "one byte more: the marker"
        );
    }

    #[test]
    fn m3_a_sanitized_name_keeps_its_hyphens_and_underscores() {
        let name = exposed_name("my-fs", "read_file.v2");
        assert!(name.starts_with("my-fs__read_file_v2_"), "{name}");
        assert_eq!(name.len(), "my-fs__read_file_v2_".len() + 8);
    }

    #[test]
    fn m4_a_hook_is_a_tool_whose_bare_name_starts_with_an_underscore() {
        assert!(is_hook_name("_Stop"));
        assert!(is_hook_name("_PostCompact"));
        assert!(!is_hook_name("Stop"));
        assert!(!is_hook_name("read_file"));
    }
}
