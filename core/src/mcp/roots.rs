//! MCP roots (MCP 2025-11-25 client/roots; SPEC M13): the directories a session works in,
//! offered to its MCP servers. A server asks with `roots/list`; the answer is the session's
//! `cwd` first, then the ACP client's `additionalDirectories` in the order given, each as a
//! `file://` URI with its last path component as the `name`. The roots do not change during a
//! session (ACP has no request that changes them), so `roots.listChanged` is declared `false`
//! and `notifications/roots/list_changed` is never sent.

use serde_json::{Value, json};

/// The MCP `Root`s of a session working in `cwd` (absolute) with the client's
/// `additional` directories (absolute, without repeats, see
/// [`crate::acp::NewSession::additional_directories`]): a JSON array of
/// `{"uri": "file:///…", "name": "<last component>"}` (`/` itself is named `/`).
#[must_use]
pub fn roots_of(cwd: &str, additional: &[String]) -> Value {
    let root = |path: &str| {
        let trimmed = path.trim_end_matches('/');
        let name = trimmed
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("/");
        let path = if trimmed.is_empty() { "/" } else { trimmed };
        json!({"uri": crate::url::file_uri(path), "name": name})
    };
    Value::Array(
        std::iter::once(cwd)
            .chain(additional.iter().map(String::as_str))
            .map(root)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m13_the_cwd_comes_first_then_the_additional_directories_each_named_by_its_last_part() {
        assert_eq!(
            roots_of("/home/me/proj/", &["/srv/lib".into(), "/".into()]),
            json!([
                {"uri": "file:///home/me/proj", "name": "proj"},
                {"uri": "file:///srv/lib", "name": "lib"},
                {"uri": "file:///", "name": "/"}
            ])
        );
    }
}
