//! The lines of a session transcript file (SPEC A9; the format is documented in
//! `docs/sessions.md`): one JSON object per line, each with the format version `v` and its
//! `type`. Encoding and decoding only; what to record and when is the store's business
//! (`store.rs`).
//!
//! Versioning: every record carries `"v": 1`. A reader accepts records of its version and
//! older ones; a record of a newer version is an error (the file was written by a newer
//! agent), and a record of a known version with a `type` it does not know is skipped, so that
//! a later agent can add record types without a new version.

use crate::config::Effort;
use crate::llm::{ChatReasoningField, Message, ReasoningBlock, ToolCall};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value, json};

/// The record version this agent writes and the newest it reads.
pub(crate) const VERSION: u64 = 1;

/// One line of a transcript file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record {
    /// The first line: whose session, where, and its title (the first prompt's first line).
    Session {
        /// `sess_…`.
        session_id: String,
        /// The session's working directory (absolute).
        cwd: String,
        /// The title shown by `session/list`.
        title: String,
    },
    /// A history item appended (SPEC L4): what the model will see.
    Message(Message),
    /// The history was cut to its first `keep` items (a compaction, a hook call joining the
    /// model's answer); the items after it follow as `message` records.
    Rewind {
        /// Items kept.
        keep: usize,
    },
    /// The provider's last reported input tokens and the history length then (SPEC K1).
    Usage {
        /// Input tokens.
        input_tokens: u64,
        /// History length when reported.
        mark: usize,
    },
    /// A `session/update` the client saw, for the replay of `session/load` (text chunks of
    /// one kind merged).
    Update(Value),
    /// A model tool call announced to the client (`tool_call`, SPEC A6): its position in the
    /// model's response, its ids, and the update as sent.
    ToolCall {
        /// Position in the response (from 0).
        index: usize,
        /// The ACP `toolCallId` (`tc_N`).
        tool_call_id: String,
        /// The provider's call id.
        call_id: String,
        /// The provider-visible tool name.
        name: String,
        /// The `tool_call` update.
        update: Value,
    },
    /// A tool call's result, recorded as soon as it is known (SPEC L3): it joins the history
    /// after its call's assistant message, in call order, when the next history record (or
    /// the end of the file) comes; the replay shows its final `tool_call_update`.
    ToolResult {
        /// Position in the response (from 0).
        index: usize,
        /// The ACP `toolCallId`, when the client saw the call (hook calls have none).
        tool_call_id: Option<String>,
        /// The provider's call id.
        call_id: String,
        /// The provider-visible tool name.
        name: String,
        /// The result as the model sees it.
        text: String,
        /// Whether the model sees it as an error.
        is_error: bool,
        /// Whether the client saw the call fail (`failed`, else `completed`).
        failed: bool,
    },
    /// `session/set_model` (`None`: back to the configured model).
    Model(Option<String>),
    /// The reasoning effort set with `session/set_config_option` (SPEC L12; `None`: the
    /// provider's default, no reasoning parameter).
    ThoughtLevel(Option<Effort>),
    /// A remembered `*_always` permission answer for a qualified tool name (SPEC A7).
    Permission {
        /// `server__tool`.
        tool: String,
        /// Allowed (true) or rejected (false).
        allow: bool,
    },
    /// A prompt turn ended: its stop reason and `_meta` (SPEC A8), or its error. Informational
    /// (the `_Stop` budget is per prompt, SPEC I2, so nothing of it is restored).
    TurnEnd {
        /// The stop reason, or `None` when the prompt failed.
        stop_reason: Option<String>,
        /// The prompt response's `_meta`, or the error message.
        detail: Value,
    },
    /// A record of the current version with a type this agent does not know: skipped.
    Unknown(String),
}

impl Record {
    /// The record as one line, with its `\n`.
    #[cfg(test)]
    pub(crate) fn to_line(&self) -> String {
        let mut out = Vec::new();
        self.write_line(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Appends the record to `out` as one line, with its `\n`: `{"v":1,"type":"<kind>"`
    /// first (for people reading the file), then its fields sorted by name, written straight
    /// into `out` (no `Value` built, no copy of the texts).
    pub(crate) fn write_line(&self, out: &mut Vec<u8>) {
        match self {
            Record::Session {
                session_id,
                cwd,
                title,
            } => Line::start(out, "session")
                .field("cwd", cwd)
                .field("sessionId", session_id)
                .field("title", title)
                .end(),
            Record::Message(m) => write_message(out, m),
            Record::Rewind { keep } => Line::start(out, "rewind").field("keep", keep).end(),
            Record::Usage { input_tokens, mark } => Line::start(out, "usage")
                .field("inputTokens", input_tokens)
                .field("mark", mark)
                .end(),
            Record::Update(u) => Line::start(out, "update").field("update", u).end(),
            Record::ToolCall {
                index,
                tool_call_id,
                call_id,
                name,
                update,
            } => write_tool_call(out, *index, tool_call_id, call_id, name, update),
            Record::ToolResult {
                index,
                tool_call_id,
                call_id,
                name,
                text,
                is_error,
                failed,
            } => write_tool_result(
                out,
                *index,
                tool_call_id.as_deref(),
                call_id,
                name,
                text,
                *is_error,
                *failed,
            ),
            Record::Model(model) => Line::start(out, "model").field("modelId", model).end(),
            Record::ThoughtLevel(effort) => Line::start(out, "thought_level")
                .field("effort", &effort.map(Effort::as_str))
                .end(),
            Record::Permission { tool, allow } => Line::start(out, "permission")
                .field("allow", allow)
                .field("tool", tool)
                .end(),
            Record::TurnEnd {
                stop_reason,
                detail,
            } => match stop_reason {
                Some(r) => Line::start(out, "turn_end")
                    .field("meta", detail)
                    .field("stopReason", r)
                    .end(),
                None => Line::start(out, "turn_end").field("error", detail).end(),
            },
            Record::Unknown(kind) => Line::start(out, kind).end(),
        }
    }

    /// Decodes one line (without its newline).
    ///
    /// # Errors
    /// A one-line reason: not JSON, not an object, no or a newer version, a known type with
    /// a missing or mistyped field.
    pub(crate) fn parse(line: &[u8]) -> Result<Record, String> {
        let v: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(o) = v else {
            return Err("not a JSON object".into());
        };
        let version = o
            .get("v")
            .and_then(Value::as_u64)
            .ok_or("no record version \"v\"")?;
        if version > VERSION {
            return Err(format!(
                "record version {version} was written by a newer buzz-agent (this one reads up to {VERSION})"
            ));
        }
        let kind = o.get("type").and_then(Value::as_str).ok_or("no \"type\"")?;
        let f = Fields { o: &o, kind };
        Ok(match kind {
            "session" => Record::Session {
                session_id: f.string("sessionId")?,
                cwd: f.string("cwd")?,
                title: f.opt_string("title")?.unwrap_or_default(),
            },
            "message" => Record::Message(message_from_json(f.value("message")?)?),
            "rewind" => Record::Rewind {
                keep: f.usize("keep")?,
            },
            "usage" => Record::Usage {
                input_tokens: f.u64("inputTokens")?,
                mark: f.usize("mark")?,
            },
            "update" => Record::Update(f.value("update")?.clone()),
            "tool_call" => Record::ToolCall {
                index: f.usize("index")?,
                tool_call_id: f.string("toolCallId")?,
                call_id: f.string("callId")?,
                name: f.string("name")?,
                update: f.value("update")?.clone(),
            },
            "tool_result" => Record::ToolResult {
                index: f.usize("index")?,
                tool_call_id: f.opt_string("toolCallId")?,
                call_id: f.string("callId")?,
                name: f.string("name")?,
                text: f.string("text")?,
                is_error: f.bool("isError")?,
                failed: f.string("status")? == "failed",
            },
            "model" => Record::Model(f.opt_string("modelId")?),
            "thought_level" => Record::ThoughtLevel(match f.opt_string("effort")? {
                None => None,
                Some(e) => Some(Effort::parse(&e).ok_or_else(|| {
                    format!(
                        "thought_level: effort must be low, medium, high, max or null, not {e:?}"
                    )
                })?),
            }),
            "permission" => Record::Permission {
                tool: f.string("tool")?,
                allow: f.bool("allow")?,
            },
            "turn_end" => match f.opt_string("stopReason")? {
                Some(r) => Record::TurnEnd {
                    stop_reason: Some(r),
                    detail: o.get("meta").cloned().unwrap_or(Value::Null),
                },
                None => Record::TurnEnd {
                    stop_reason: None,
                    detail: o.get("error").cloned().unwrap_or(Value::Null),
                },
            },
            other => Record::Unknown(other.to_owned()),
        })
    }
}

/// Appends the `message` record of `m` to `out` as one line, with its `\n`.
pub(crate) fn write_message(out: &mut Vec<u8>, m: &Message) {
    Line::start(out, "message")
        .field("message", &MessageJson(m))
        .end();
}

/// Appends a `tool_call` record to `out` (the fields of [`Record::ToolCall`], borrowed).
pub(crate) fn write_tool_call(
    out: &mut Vec<u8>,
    index: usize,
    tool_call_id: &str,
    call_id: &str,
    name: &str,
    update: &Value,
) {
    Line::start(out, "tool_call")
        .field("callId", call_id)
        .field("index", &index)
        .field("name", name)
        .field("toolCallId", tool_call_id)
        .field("update", update)
        .end();
}

/// Appends a `tool_result` record to `out` (the fields of [`Record::ToolResult`], borrowed).
#[allow(clippy::too_many_arguments)] // the record's fields, one for one
pub(crate) fn write_tool_result(
    out: &mut Vec<u8>,
    index: usize,
    tool_call_id: Option<&str>,
    call_id: &str,
    name: &str,
    text: &str,
    is_error: bool,
    failed: bool,
) {
    let mut line = Line::start(out, "tool_result");
    line = line
        .field("callId", call_id)
        .field("index", &index)
        .field("isError", &is_error)
        .field("name", name)
        .field("status", if failed { "failed" } else { "completed" })
        .field("text", text);
    if let Some(id) = tool_call_id {
        line = line.field("toolCallId", id);
    }
    line.end();
}

/// A record line being written into a buffer: `{"v":1,"type":"<kind>"`, then `,"name":value`
/// per field, then `}` and `\n`. Fields come sorted by name: the order a `serde_json` object
/// (a sorted map) writes, which the format has always had.
struct Line<'a> {
    out: &'a mut Vec<u8>,
    /// The last field's name (to check the order in debug builds).
    last: &'static str,
}

impl<'a> Line<'a> {
    fn start(out: &'a mut Vec<u8>, kind: &str) -> Line<'a> {
        out.extend_from_slice(b"{\"v\":");
        out.extend_from_slice(VERSION.to_string().as_bytes());
        out.extend_from_slice(b",\"type\":");
        put(out, kind);
        Line { out, last: "" }
    }

    fn field<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Line<'a> {
        debug_assert!(self.last < name, "record fields out of order: {name}");
        self.out.extend_from_slice(b",\"");
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
        put(self.out, value);
        Line {
            out: self.out,
            last: name,
        }
    }

    fn end(self) {
        self.out.extend_from_slice(b"}\n");
    }
}

/// Writes `value` as compact JSON at the end of `out`.
fn put<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing to a `Vec` cannot fail, and neither can these values (strings, numbers,
    // `Value`s, whose object keys are strings).
    let _ = serde_json::to_writer(out, value);
}

/// A history item as a `message` record's JSON, written without building a `Value`:
/// `{"role":"user","text"}`, `{"reasoning":[…],"role":"assistant","text","thinking",
/// "toolCalls":[{"arguments","id","name"}]}` (empty fields left out) or
/// `{"callId","isError","name","role":"tool","text"}`; keys sorted, as `message_to_json`
/// (the `Value` form the tests and the testing feature use) gives them.
struct MessageJson<'a>(&'a Message);

impl Serialize for MessageJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Keys sorted by name, as in a `serde_json` object.
        match self.0 {
            Message::User { text } => {
                let mut o = s.serialize_map(Some(2))?;
                o.serialize_entry("role", "user")?;
                o.serialize_entry("text", text)?;
                o.end()
            }
            Message::Assistant {
                text,
                thinking,
                reasoning,
                tool_calls,
            } => {
                let mut o = s.serialize_map(None)?;
                if !reasoning.is_empty() {
                    let blocks: Vec<Value> = reasoning.iter().map(reasoning_to_json).collect();
                    o.serialize_entry("reasoning", &blocks)?;
                }
                o.serialize_entry("role", "assistant")?;
                o.serialize_entry("text", text)?;
                if !thinking.is_empty() {
                    o.serialize_entry("thinking", thinking)?;
                }
                if !tool_calls.is_empty() {
                    let calls: Vec<CallJson<'_>> = tool_calls.iter().map(CallJson).collect();
                    o.serialize_entry("toolCalls", &calls)?;
                }
                o.end()
            }
            Message::ToolResult {
                call_id,
                name,
                text,
                is_error,
            } => {
                let mut o = s.serialize_map(Some(5))?;
                o.serialize_entry("callId", call_id)?;
                o.serialize_entry("isError", is_error)?;
                o.serialize_entry("name", name)?;
                o.serialize_entry("role", "tool")?;
                o.serialize_entry("text", text)?;
                o.end()
            }
        }
    }
}

/// A model tool call as `{"arguments","id","name"}`.
struct CallJson<'a>(&'a ToolCall);

impl Serialize for CallJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut o = s.serialize_map(Some(3))?;
        o.serialize_entry("arguments", &self.0.arguments)?;
        o.serialize_entry("id", &self.0.id)?;
        o.serialize_entry("name", &self.0.name)?;
        o.end()
    }
}

/// Typed access to a record's fields, with errors naming the record type and the field.
struct Fields<'a> {
    o: &'a Map<String, Value>,
    kind: &'a str,
}

impl<'a> Fields<'a> {
    fn value(&self, name: &str) -> Result<&'a Value, String> {
        self.o
            .get(name)
            .ok_or_else(|| format!("{} record without \"{name}\"", self.kind))
    }

    fn string(&self, name: &str) -> Result<String, String> {
        self.value(name)?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{} record: \"{name}\" is not a string", self.kind))
    }

    fn opt_string(&self, name: &str) -> Result<Option<String>, String> {
        match self.o.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{} record: \"{name}\" is not a string", self.kind)),
        }
    }

    fn u64(&self, name: &str) -> Result<u64, String> {
        self.value(name)?
            .as_u64()
            .ok_or_else(|| format!("{} record: \"{name}\" is not a count", self.kind))
    }

    fn usize(&self, name: &str) -> Result<usize, String> {
        usize::try_from(self.u64(name)?)
            .map_err(|_| format!("{} record: \"{name}\" is too large", self.kind))
    }

    fn bool(&self, name: &str) -> Result<bool, String> {
        self.value(name)?
            .as_bool()
            .ok_or_else(|| format!("{} record: \"{name}\" is not a boolean", self.kind))
    }
}

/// A history item as JSON: `{"role":"user","text"}`, `{"role":"assistant","text",
/// "thinking","reasoning":[…],"toolCalls":[{"id","name","arguments"}]}` (empty fields left
/// out) or `{"role":"tool","callId","name","text","isError"}`.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn message_to_json(m: &Message) -> Value {
    match m {
        Message::User { text } => json!({"role": "user", "text": text}),
        Message::Assistant {
            text,
            thinking,
            reasoning,
            tool_calls,
        } => {
            let mut o = Map::new();
            o.insert("role".into(), json!("assistant"));
            o.insert("text".into(), json!(text));
            if !thinking.is_empty() {
                o.insert("thinking".into(), json!(thinking));
            }
            if !reasoning.is_empty() {
                o.insert(
                    "reasoning".into(),
                    Value::Array(reasoning.iter().map(reasoning_to_json).collect()),
                );
            }
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                    .collect();
                o.insert("toolCalls".into(), Value::Array(calls));
            }
            Value::Object(o)
        }
        Message::ToolResult {
            call_id,
            name,
            text,
            is_error,
        } => {
            json!({"role": "tool", "callId": call_id, "name": name, "text": text, "isError": is_error})
        }
    }
}

/// The inverse of [`message_to_json`].
///
/// # Errors
/// A one-line reason naming the field.
pub(crate) fn message_from_json(v: &Value) -> Result<Message, String> {
    let Value::Object(o) = v else {
        return Err("message is not an object".into());
    };
    let f = Fields { o, kind: "message" };
    let text = || -> Result<String, String> { Ok(f.opt_string("text")?.unwrap_or_default()) };
    match f.string("role")?.as_str() {
        "user" => Ok(Message::User { text: text()? }),
        "assistant" => {
            let reasoning = match o.get("reasoning") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(reasoning_from_json)
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err("message: \"reasoning\" is not an array".into()),
            };
            let tool_calls = match o.get("toolCalls") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|c| {
                        let Value::Object(c) = c else {
                            return Err("message: a tool call is not an object".to_owned());
                        };
                        let f = Fields {
                            o: c,
                            kind: "tool call",
                        };
                        Ok(ToolCall {
                            id: f.string("id")?,
                            name: f.string("name")?,
                            arguments: f.string("arguments")?,
                        })
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err("message: \"toolCalls\" is not an array".into()),
            };
            Ok(Message::Assistant {
                text: text()?,
                thinking: f.opt_string("thinking")?.unwrap_or_default(),
                reasoning,
                tool_calls,
            })
        }
        "tool" => Ok(Message::ToolResult {
            call_id: f.string("callId")?,
            name: f.string("name")?,
            text: text()?,
            is_error: f.bool("isError")?,
        }),
        other => Err(format!("message: unknown role {other:?}")),
    }
}

/// Provider reasoning state as JSON (SPEC L10): `{"type":"thinking","text","signature"}`,
/// `{"type":"redacted","data"}`, `{"type":"responses_item","item"}`,
/// `{"type":"chat_field","field"}`, `{"type":"chat_details","details"}` or
/// `{"type":"anthropic_content","content"}`, kept verbatim.
fn reasoning_to_json(r: &ReasoningBlock) -> Value {
    match r {
        ReasoningBlock::Thinking { text, signature } => {
            json!({"type": "thinking", "text": text, "signature": signature})
        }
        ReasoningBlock::Redacted { data } => json!({"type": "redacted", "data": data}),
        ReasoningBlock::ResponsesItem(item) => json!({"type": "responses_item", "item": item}),
        ReasoningBlock::ChatField(field) => json!({"type": "chat_field", "field": field.name()}),
        ReasoningBlock::ChatDetails(details) => {
            json!({"type": "chat_details", "details": details})
        }
        ReasoningBlock::AnthropicContent(content) => {
            json!({"type": "anthropic_content", "content": content})
        }
    }
}

fn reasoning_from_json(v: &Value) -> Result<ReasoningBlock, String> {
    let Value::Object(o) = v else {
        return Err("a reasoning block is not an object".into());
    };
    let f = Fields {
        o,
        kind: "reasoning",
    };
    match f.string("type")?.as_str() {
        "thinking" => Ok(ReasoningBlock::Thinking {
            text: f.string("text")?,
            signature: f.string("signature")?,
        }),
        "redacted" => Ok(ReasoningBlock::Redacted {
            data: f.string("data")?,
        }),
        "responses_item" => Ok(ReasoningBlock::ResponsesItem(f.value("item")?.clone())),
        "chat_field" => match f.string("field")?.as_str() {
            "reasoning_content" => Ok(ReasoningBlock::ChatField(
                ChatReasoningField::ReasoningContent,
            )),
            "reasoning" => Ok(ReasoningBlock::ChatField(ChatReasoningField::Reasoning)),
            other => Err(format!("reasoning: unknown chat field {other:?}")),
        },
        "chat_details" => Ok(ReasoningBlock::ChatDetails(f.value("details")?.clone())),
        "anthropic_content" => Ok(ReasoningBlock::AnthropicContent(
            f.value("content")?.clone(),
        )),
        other => Err(format!("reasoning: unknown type {other:?}")),
    }
}

/// `ms` since the Unix epoch as an ISO 8601 / RFC 3339 UTC timestamp with milliseconds
/// (`2026-05-01T12:00:00.123Z`), for `updatedAt` (SPEC A9).
pub(crate) fn iso8601_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_message() -> Vec<Message> {
        vec![
            Message::User {
                text: "line one\nline \"two\" ✓".into(),
            },
            Message::Assistant {
                text: "answer".into(),
                thinking: "hmm".into(),
                reasoning: vec![
                    ReasoningBlock::Thinking {
                        text: "hmm".into(),
                        signature: "sig==".into(),
                    },
                    ReasoningBlock::Redacted { data: "enc".into() },
                    ReasoningBlock::ResponsesItem(
                        json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "x"}),
                    ),
                    ReasoningBlock::ChatField(ChatReasoningField::ReasoningContent),
                    ReasoningBlock::ChatField(ChatReasoningField::Reasoning),
                    ReasoningBlock::ChatDetails(json!([{"type": "reasoning.text", "text": "t"}])),
                    ReasoningBlock::AnthropicContent(json!([
                        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
                        {"type": "text", "text": "answer"}
                    ])),
                ],
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "fs__read".into(),
                    arguments: "{\"path\": oops".into(),
                }],
            },
            Message::Assistant {
                text: String::new(),
                thinking: String::new(),
                reasoning: Vec::new(),
                tool_calls: Vec::new(),
            },
            Message::ToolResult {
                call_id: "call_1".into(),
                name: "fs__read".into(),
                text: String::new(),
                is_error: true,
            },
        ]
    }

    #[test]
    fn a9_l10_every_history_item_and_reasoning_block_round_trips_on_one_line() {
        for m in every_message() {
            let line = Record::Message(m.clone()).to_line();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            assert!(line.starts_with("{\"v\":1,\"type\":\"message\","), "{line}");
            assert_eq!(
                Record::parse(line.trim_end().as_bytes()),
                Ok(Record::Message(m))
            );
        }
    }

    fn every_record() -> Vec<Record> {
        vec![
            Record::Session {
                session_id: "sess_1".into(),
                cwd: "/w".into(),
                title: "t".into(),
            },
            Record::Rewind { keep: 3 },
            Record::Usage {
                input_tokens: 9,
                mark: 2,
            },
            Record::Update(json!({"sessionUpdate": "agent_message_chunk"})),
            Record::ToolCall {
                index: 1,
                tool_call_id: "tc_2".into(),
                call_id: "c".into(),
                name: "n".into(),
                update: json!({"sessionUpdate": "tool_call"}),
            },
            Record::ToolResult {
                index: 0,
                tool_call_id: None,
                call_id: "c".into(),
                name: "n".into(),
                text: "t".into(),
                is_error: false,
                failed: true,
            },
            Record::Model(Some("m".into())),
            Record::Model(None),
            Record::ThoughtLevel(Some(Effort::Max)),
            Record::ThoughtLevel(None),
            Record::Permission {
                tool: "fs__read".into(),
                allow: false,
            },
            Record::TurnEnd {
                stop_reason: Some("end_turn".into()),
                detail: json!({"buzz": {"rounds": 1}}),
            },
            Record::TurnEnd {
                stop_reason: None,
                detail: json!("llm: HTTP 500"),
            },
        ]
    }

    #[test]
    fn a9_every_record_type_round_trips() {
        for r in every_record() {
            let line = r.to_line();
            assert_eq!(Record::parse(line.trim_end().as_bytes()), Ok(r), "{line}");
        }
    }

    #[test]
    fn a9_a_newer_version_is_refused_and_an_unknown_type_of_this_version_is_skipped() {
        let err = Record::parse(br#"{"v":2,"type":"message"}"#).unwrap_err();
        assert!(err.contains("newer buzz-agent"), "{err}");
        assert_eq!(
            Record::parse(br#"{"v":1,"type":"bookmark","at":3}"#),
            Ok(Record::Unknown("bookmark".into()))
        );
        for (bad, why) in [
            (&b"{\"type\":\"rewind\",\"keep\":1}"[..], "version"),
            (b"[1]", "object"),
            (b"{\"v\":1,\"type\":\"rewind\"}", "keep"),
            (
                b"{\"v\":1,\"type\":\"message\",\"message\":{\"role\":\"robot\"}}",
                "robot",
            ),
            (b"{\"v\":1,\"type\":\"rewi", "JSON"),
        ] {
            let err = Record::parse(bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn a9_timestamps_are_iso_8601_utc() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_utc(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso8601_utc(1_777_636_800_000), "2026-05-01T12:00:00.000Z");
    }

    // ---- the reference encoding
    /// The line as the first encoding wrote it (a `Value` object, then its text): the
    /// reference the direct writer must match byte for byte.
    fn via_value(r: &Record) -> String {
        let mut o = Map::new();
        let kind = match r {
            Record::Session {
                session_id,
                cwd,
                title,
            } => {
                o.insert("sessionId".into(), json!(session_id));
                o.insert("cwd".into(), json!(cwd));
                o.insert("title".into(), json!(title));
                "session"
            }
            Record::Message(m) => {
                o.insert("message".into(), message_to_json(m));
                "message"
            }
            Record::Rewind { keep } => {
                o.insert("keep".into(), json!(keep));
                "rewind"
            }
            Record::Usage { input_tokens, mark } => {
                o.insert("inputTokens".into(), json!(input_tokens));
                o.insert("mark".into(), json!(mark));
                "usage"
            }
            Record::Update(u) => {
                o.insert("update".into(), u.clone());
                "update"
            }
            Record::ToolCall {
                index,
                tool_call_id,
                call_id,
                name,
                update,
            } => {
                o.insert("index".into(), json!(index));
                o.insert("toolCallId".into(), json!(tool_call_id));
                o.insert("callId".into(), json!(call_id));
                o.insert("name".into(), json!(name));
                o.insert("update".into(), update.clone());
                "tool_call"
            }
            Record::ToolResult {
                index,
                tool_call_id,
                call_id,
                name,
                text,
                is_error,
                failed,
            } => {
                o.insert("index".into(), json!(index));
                if let Some(id) = tool_call_id {
                    o.insert("toolCallId".into(), json!(id));
                }
                o.insert("callId".into(), json!(call_id));
                o.insert("name".into(), json!(name));
                o.insert("text".into(), json!(text));
                o.insert("isError".into(), json!(is_error));
                o.insert(
                    "status".into(),
                    json!(if *failed { "failed" } else { "completed" }),
                );
                "tool_result"
            }
            Record::Model(model) => {
                o.insert("modelId".into(), json!(model));
                "model"
            }
            Record::ThoughtLevel(effort) => {
                o.insert("effort".into(), json!(effort.map(Effort::as_str)));
                "thought_level"
            }
            Record::Permission { tool, allow } => {
                o.insert("tool".into(), json!(tool));
                o.insert("allow".into(), json!(allow));
                "permission"
            }
            Record::TurnEnd {
                stop_reason,
                detail,
            } => {
                match stop_reason {
                    Some(r) => {
                        o.insert("stopReason".into(), json!(r));
                        o.insert("meta".into(), detail.clone());
                    }
                    None => {
                        o.insert("error".into(), detail.clone());
                    }
                }
                "turn_end"
            }
            Record::Unknown(kind) => kind.as_str(),
        };
        line_of(kind, &Value::Object(o))
    }

    /// The reference's line framing (as it was).
    fn line_of(kind: &str, fields: &Value) -> String {
        let rest = fields.to_string();
        let kind = Value::String(kind.to_owned());
        match rest.strip_prefix('{') {
            Some(tail) if tail != "}" => format!("{{\"v\":{VERSION},\"type\":{kind},{tail}\n"),
            Some(_) | None => format!("{{\"v\":{VERSION},\"type\":{kind}}}\n"),
        }
    }

    #[test]
    fn a9_records_are_written_byte_for_byte_as_the_value_encoding_wrote_them() {
        let mut records = every_record();
        records.extend(every_message().into_iter().map(Record::Message));
        records.push(Record::Message(Message::User {
            text: "tab\t nul\u{0} \u{1f} \\ / \u{2028} é 🐝".into(),
        }));
        records.push(Record::ToolResult {
            index: 7,
            tool_call_id: Some("tc_9".into()),
            call_id: "call \"q\"".into(),
            name: "fs__big".into(),
            text: "x".repeat(4096),
            is_error: true,
            failed: false,
        });
        records.push(Record::Unknown("later_type".into()));
        records.push(Record::Update(
            json!({"z": 1.5, "a": [null, true, -3, "s"], "m": {"k": {}}}),
        ));
        for r in records {
            let mut direct = Vec::new();
            r.write_line(&mut direct);
            assert_eq!(
                String::from_utf8(direct).as_deref(),
                Ok(via_value(&r).as_str())
            );
        }
    }

    #[test]
    fn a9_timestamps_are_right_at_the_edges_of_days_months_years_and_leap_centuries() {
        for (ms, want) in [
            (2_678_399_999, "1970-01-31T23:59:59.999Z"),
            (68_173_323_004, "1972-02-29T01:02:03.004Z"),
            (946_684_799_999, "1999-12-31T23:59:59.999Z"),
            (951_868_800_000, "2000-03-01T00:00:00.000Z"),
            (1_709_232_330_500, "2024-02-29T18:45:30.500Z"),
            (4_107_538_800_000, "2100-02-28T23:00:00.000Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (13_574_608_496_789, "2400-02-29T12:34:56.789Z"),
            (1_798_675_200_001, "2026-12-31T00:00:00.001Z"),
        ] {
            assert_eq!(iso8601_utc(ms), want, "{ms} ms");
        }
    }
}
