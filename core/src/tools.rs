//! MCP tools as the model sees them: qualified names (SPEC M3), schema normalisation (M3, case
//! C19), and tool-result conversion with middle elision (L3).

use serde_json::{Map, Value};

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

/// A converted tool result: the text the model sees and whether it is an error (SPEC L3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOutput {
    pub text: String,
    pub is_error: bool,
}

/// Convert an MCP `tools/call` result to model text (SPEC L3): text blocks joined with `\n`;
/// `structuredContent` as JSON text when there is no text; images/audio/blobs replaced by a
/// short marker; `resource_link` → `[resource: uri]`; text over `cap` bytes middle-elided.
#[must_use]
pub(crate) fn convert_result(result: &Value, cap: usize) -> ToolOutput {
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut parts: Vec<String> = Vec::new();
    let mut saw_text = false;
    if let Some(blocks) = result.get("content").and_then(Value::as_array) {
        for b in blocks {
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "text" => {
                    saw_text = true;
                    parts.push(
                        b.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    );
                }
                "image" | "audio" => {
                    let mime = b
                        .get("mimeType")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown");
                    let n = base64_decoded_len(b.get("data").and_then(Value::as_str).unwrap_or(""));
                    parts.push(format!("[{kind} elided: {mime}, {n} bytes]"));
                }
                "resource_link" => {
                    let uri = b.get("uri").and_then(Value::as_str).unwrap_or("");
                    parts.push(format!("[resource: {uri}]"));
                }
                "resource" => {
                    let r = b.get("resource").unwrap_or(&Value::Null);
                    let uri = r.get("uri").and_then(Value::as_str).unwrap_or("");
                    if let Some(t) = r.get("text").and_then(Value::as_str) {
                        saw_text = true;
                        parts.push(format!("[resource: {uri}]\n{t}"));
                    } else {
                        let mime = r
                            .get("mimeType")
                            .and_then(Value::as_str)
                            .unwrap_or("unknown");
                        let n =
                            base64_decoded_len(r.get("blob").and_then(Value::as_str).unwrap_or(""));
                        parts.push(format!("[resource elided: {uri}, {mime}, {n} bytes]"));
                    }
                }
                other => parts.push(format!(
                    "[{} content elided]",
                    if other.is_empty() { "unknown" } else { other }
                )),
            }
        }
    }
    if !saw_text && let Some(sc) = result.get("structuredContent").filter(|v| !v.is_null()) {
        parts.insert(0, sc.to_string());
    }
    let text = parts.join("\n");
    ToolOutput {
        text: elide_middle(text, cap),
        is_error,
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
    ToolOutput {
        text: elide_middle(text, cap),
        is_error,
    }
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
            ToolOutput {
                text: String::new(),
                is_error: false
            }
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
}
