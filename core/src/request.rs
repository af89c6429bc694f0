//! The parts the provider request builders share (SPEC L6–L8): a streaming JSON `POST` whose
//! body is serialized in one pass straight into its buffer, and the wire forms of an error
//! result and of blank tool-call arguments used by both OpenAI routes.

use serde::{Serialize, Serializer};

use crate::llm::{HttpRequest, LlmRequest};

/// A streaming JSON `POST` to `url`.
///
/// Headers: `content-type: application/json`, `accept: text/event-stream`, then `auth` (name,
/// value) when present; the caller may push more. The body is `payload` as compact JSON
/// ([`serialize_body`]).
pub(crate) fn streaming_json_post(
    url: String,
    auth: Option<(&str, String)>,
    payload: &impl Serialize,
    capacity: usize,
) -> HttpRequest {
    let mut headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("accept".to_owned(), "text/event-stream".to_owned()),
    ];
    if let Some((name, value)) = auth {
        headers.push((name.to_owned(), value));
    }
    HttpRequest {
        url,
        headers,
        body: serialize_body(payload, capacity),
    }
}

/// `authorization: Bearer <api_key>`, only when the key is non-empty (local servers need none).
#[must_use]
pub(crate) fn bearer(api_key: &str) -> Option<(&'static str, String)> {
    (!api_key.is_empty()).then(|| ("authorization", format!("Bearer {api_key}")))
}

/// A body buffer size that usually avoids regrowing (a regrow copies the whole body and briefly
/// holds it twice): the history's size plus `per_message` bytes of JSON framing per message and
/// an eighth for string escaping, the tool definitions (names, descriptions and 512 bytes per
/// schema), the system prompt, and 256 bytes.
#[must_use]
pub(crate) fn body_capacity(req: &LlmRequest<'_>, per_message: usize) -> usize {
    let history: usize = req
        .messages
        .iter()
        .map(|m| m.content_bytes() + per_message)
        .sum();
    let tools: usize = req
        .tools
        .iter()
        .map(|t| 2 * t.name.len() + t.description.len() + 512)
        .sum();
    history + history / 8 + tools + req.system.map_or(0, str::len) + 256
}

/// `payload` as compact JSON in a buffer of `capacity` bytes; empty if serialization failed.
#[must_use]
pub(crate) fn serialize_body(payload: &impl Serialize, capacity: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(capacity);
    if serde_json::to_writer(&mut body, payload).is_err() {
        // Unreachable: writing to a Vec cannot fail and every value is a string-keyed tree.
        // An empty body would be rejected by the server (400), never sent half-written.
        body.clear();
    }
    body
}

/// A tool result's text sent as an error: `Error: <text>`, written without building the string
/// first.
pub(crate) struct ErrorText<'a>(pub &'a str);

impl Serialize for ErrorText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("Error: {}", self.0))
    }
}

/// A tool call's arguments as sent back: the model's own text, `{}` when that was blank (C26).
#[must_use]
pub(crate) fn arguments_or_empty_object(arguments: &str) -> &str {
    if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    }
}
