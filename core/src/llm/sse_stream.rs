//! The provider-independent half of a streamed-response decoder (SPEC L9): body bytes →
//! [`SseEvent`]s → a provider's event logic, with sticky errors, the end of the stream, EOF and
//! the hand-out of the response written once.
//!
//! Each provider decoder (`openai_chat::ChatDecoder`, `anthropic::AnthropicDecoder`,
//! `openai_responses::ResponsesDecoder`) keeps its event logic in its own module, holds an
//! [`SseState`] and implements [`EventHandler`]; the blanket impl below makes it a
//! [`StreamDecoder`]. The helpers after it ([`StreamedText`], [`CallSlot`], [`CallIds`],
//! [`parse_event_json`], [`JsonStr`], [`present`]) are the pieces of event logic the providers share.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Deref;

use serde_json::Value;

use crate::json::parse_lossy;
use crate::llm::{
    LlmResponse, ReasoningBlock, StopKind, StreamDecoder, StreamDelta, StreamError, ToolCall, Usage,
};
use crate::sse::{SseEvent, SseParser};

/// The SSE side of one decoder: the parser, a reused events buffer, the sticky error and
/// whether the response was already handed out.
#[derive(Default)]
pub(crate) struct SseState {
    parser: SseParser,
    /// Scratch buffer for parsed events (reused across feeds).
    events: Vec<SseEvent>,
    /// Sticky failure: every later `feed` / `finish` returns it.
    error: Option<StreamError>,
    /// [`StreamDecoder::finish`] already handed out the response.
    taken: bool,
}

impl SseState {
    /// The state at the start of a stream.
    #[must_use]
    pub(crate) fn new() -> Self {
        Self::default()
    }
}

/// A provider's event logic; every implementor is a [`StreamDecoder`] (blanket impl).
///
/// The trait is sealed: it is public only so that the blanket impl may name it, and its module
/// is private to the crate.
pub(crate) trait EventHandler {
    /// The decoder's SSE state.
    fn sse_state(&mut self) -> &mut SseState;

    /// One SSE event, in stream order; deltas go to `out`. `at_eof`: the event was flushed at
    /// EOF without its blank line (it may be cut). Not called once [`Self::is_done`] is true.
    ///
    /// # Errors
    /// A provider error in the stream; it becomes the decoder's sticky error.
    fn handle_event(
        &mut self,
        event: &SseEvent,
        out: &mut Vec<StreamDelta>,
        at_eof: bool,
    ) -> Result<(), StreamError>;

    /// The stream's own terminator was seen: later events and bytes are ignored
    /// ([`StreamDecoder::is_complete`]).
    fn is_done(&self) -> bool;

    /// The response is known to be whole even without the terminator
    /// ([`StreamDecoder::has_final_answer`]); defaults to [`Self::is_done`].
    fn answer_is_final(&self) -> bool {
        self.is_done()
    }

    /// At EOF, before the response is taken: whether the stream holds a whole response. An
    /// error here leaves the response in place (a second `finish` says the same); defaults to
    /// `Ok` (the route decides in [`Self::take_response`]).
    ///
    /// # Errors
    /// [`StreamError::Truncated`] when the stream ended too early.
    fn check_complete(&self) -> Result<(), StreamError> {
        Ok(())
    }

    /// Hand out the response (called at most once, after [`Self::check_complete`]); a second
    /// `finish` then says "response already taken".
    ///
    /// # Errors
    /// [`StreamError::Truncated`] when the response is incomplete.
    fn take_response(&mut self) -> Result<LlmResponse, StreamError>;
}

impl<H: EventHandler + Send> StreamDecoder for H {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<StreamDelta>) -> Result<(), StreamError> {
        if let Some(err) = &self.sse_state().error {
            return Err(err.clone());
        }
        if self.is_done() || self.sse_state().taken {
            return Ok(());
        }
        let state = self.sse_state();
        state.parser.feed(bytes, &mut state.events);
        handle_events(self, out, false)?;
        check_overflow(self.sse_state())
    }

    fn is_complete(&self) -> bool {
        self.is_done()
    }

    fn has_final_answer(&self) -> bool {
        self.answer_is_final()
    }

    fn finish(&mut self, out: &mut Vec<StreamDelta>) -> Result<LlmResponse, StreamError> {
        if let Some(err) = &self.sse_state().error {
            return Err(err.clone());
        }
        if self.sse_state().taken {
            return Err(StreamError::Truncated("response already taken".to_owned()));
        }
        if !self.is_done() {
            let state = self.sse_state();
            state.parser.finish(&mut state.events);
            handle_events(self, out, true)?;
            check_overflow(self.sse_state())?;
        }
        self.check_complete()?;
        self.sse_state().taken = true;
        self.take_response()
    }
}

/// A stream whose line or event outgrew the parser's cap fails for good (sticky): the
/// response cannot be whole, and another attempt would most likely get the same.
fn check_overflow(state: &mut SseState) -> Result<(), StreamError> {
    if state.error.is_none() && state.parser.overflowed() {
        state.error = Some(StreamError::Provider {
            message: format!(
                "the response stream has a line or event over {} MiB; abandoned",
                crate::sse::MAX_SSE_LINE_BYTES / (1024 * 1024)
            ),
            retryable: false,
        });
    }
    match &state.error {
        Some(err) => Err(err.clone()),
        None => Ok(()),
    }
}

/// Handle the parsed events in order until the stream is done; the first error is stored
/// (sticky) and returned.
fn handle_events<H: EventHandler>(
    handler: &mut H,
    out: &mut Vec<StreamDelta>,
    at_eof: bool,
) -> Result<(), StreamError> {
    let mut events = std::mem::take(&mut handler.sse_state().events);
    let mut result = Ok(());
    for event in events.drain(..) {
        if handler.is_done() {
            break;
        }
        if let Err(err) = handler.handle_event(&event, out, at_eof) {
            handler.sse_state().error = Some(err.clone());
            result = Err(err);
            break;
        }
    }
    events.clear();
    handler.sse_state().events = events;
    result
}

/// The JSON payload of an event's (trimmed, non-empty) `data`, parsed with
/// [`parse_lossy`]. `Ok(None)` when it is not JSON but was flushed at EOF (`at_eof`: a cut
/// event, judged by `finish`, not a provider error).
///
/// # Errors
/// Data that is not JSON: a retryable [`StreamError::Provider`] with the data itself as the
/// message for an `error` event (`error_event`), else `malformed stream {what}: <error>`.
pub(crate) fn parse_event_json(
    data: &str,
    error_event: bool,
    at_eof: bool,
    what: &str,
) -> Result<Option<Value>, StreamError> {
    match parse_lossy(data) {
        Ok(value) => Ok(Some(value)),
        Err(_) if at_eof => Ok(None),
        Err(_) if error_event => Err(StreamError::Provider {
            message: data.to_owned(),
            retryable: true,
        }),
        Err(err) => Err(StreamError::Provider {
            message: format!("malformed stream {what}: {err}"),
            retryable: true,
        }),
    }
}

/// A JSON string of an event payload read through a typed view: borrowed from the payload when
/// it has no escapes, decoded into its own `String` when it has (an escaped string cannot be
/// borrowed). Only a JSON string deserializes into it; any other value is a type error, which
/// sends the payload down its decoder's general (`Value`) path. A lone surrogate escape is an
/// error too (serde_json's strict parse), so such text is decoded by [`parse_lossy`] on that
/// path and becomes U+FFFD as everywhere else (SPEC L3b).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct JsonStr<'a>(pub Cow<'a, str>);

impl<'a> JsonStr<'a> {
    /// The string of a `Value`, when it is one (for a decoder's general path).
    pub(crate) fn of(value: Option<&'a Value>) -> Option<Self> {
        value
            .and_then(Value::as_str)
            .map(|s| JsonStr(Cow::Borrowed(s)))
    }
}

impl Deref for JsonStr<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for JsonStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for JsonStr<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Takes the borrowed string when the parser can lend it.
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

/// An event's payload read through a route's typed view `V` (serde derive, strings borrowed):
/// `None` for an `error` event (`error_event`) and for a payload that is not a strict JSON
/// object of the view's shape, which then goes the route's general path.
pub(crate) fn read_view<'a, V: serde::Deserialize<'a>>(
    data: &'a str,
    error_event: bool,
) -> Option<V> {
    if error_event || !data.starts_with('{') {
        return None;
    }
    serde_json::from_str(data).ok()
}

/// The non-empty string of an optional view field.
pub(crate) fn non_empty<'s>(text: &'s Option<JsonStr<'_>>) -> Option<&'s str> {
    text.as_deref().filter(|s| !s.is_empty())
}

/// `deserialize_with` of an optional view field kept as JSON whose `null` is not its absence
/// (with `#[serde(default)]`): absent is `None`, present is `Some`, `null` included, as
/// `Value::get` sees it on the general path.
pub(crate) fn present<'de, 'a, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Cow<'a, Value>>, D::Error> {
    serde::Deserialize::deserialize(deserializer).map(|value| Some(Cow::Owned(value)))
}

/// The string of an event's `key`, or `""`: how every route's general path reads a text field.
pub(crate) fn str_or_empty<'s>(text: &'s Option<JsonStr<'_>>) -> &'s str {
    text.as_deref().unwrap_or("")
}

/// The visible text and the reasoning text of a response, accumulated as they stream.
#[derive(Default)]
pub(crate) struct StreamedText {
    /// All visible text so far.
    pub text: String,
    /// All reasoning text so far.
    pub thinking: String,
}

impl StreamedText {
    /// Append visible text and stream it as [`StreamDelta::Text`] (nothing when empty).
    pub(crate) fn push_text(&mut self, text: &str, out: &mut Vec<StreamDelta>) {
        if !text.is_empty() {
            self.text.push_str(text);
            out.push(StreamDelta::Text(text.to_owned()));
        }
    }

    /// Append reasoning text and stream it as [`StreamDelta::Thought`] (nothing when empty).
    pub(crate) fn push_thought(&mut self, thought: &str, out: &mut Vec<StreamDelta>) {
        if !thought.is_empty() {
            self.thinking.push_str(thought);
            out.push(StreamDelta::Thought(thought.to_owned()));
        }
    }

    /// The response, taking the text and thinking accumulated so far.
    pub(crate) fn take_response(
        &mut self,
        reasoning: Vec<ReasoningBlock>,
        tool_calls: Vec<ToolCall>,
        stop: StopKind,
        usage: Option<Usage>,
    ) -> LlmResponse {
        LlmResponse {
            text: std::mem::take(&mut self.text),
            thinking: std::mem::take(&mut self.thinking),
            reasoning,
            tool_calls,
            stop,
            usage,
            stop_details: None,
        }
    }
}

/// One tool call being assembled from deltas.
#[derive(Default)]
pub(crate) struct CallSlot {
    /// The provider's call id (empty until one arrives).
    pub id: String,
    /// The tool name (empty until one arrives).
    pub name: String,
    /// The argument text as streamed.
    pub arguments: String,
}

/// The assembled calls `(provider index, slot)` in the given order: nameless slots dropped,
/// ids made present and unique ([`CallIds`]).
pub(crate) fn take_calls(
    slots: impl IntoIterator<Item = (u64, CallSlot)>,
    id_prefix: &str,
) -> Vec<ToolCall> {
    let mut ids = CallIds::new(id_prefix);
    let mut calls = Vec::new();
    for (index, slot) in slots {
        if slot.name.is_empty() {
            continue;
        }
        calls.push(ToolCall {
            id: ids.unique(slot.id, index),
            name: slot.name,
            arguments: slot.arguments,
        });
    }
    calls
}

/// Makes the tool-call ids of one response present and unique (SPEC C21).
pub(crate) struct CallIds<'a> {
    /// Prefix of synthesised ids: `{id_prefix}_{index}`.
    id_prefix: &'a str,
    /// Ids handed out so far.
    used: BTreeSet<String>,
}

impl<'a> CallIds<'a> {
    /// No id handed out yet.
    #[must_use]
    pub(crate) fn new(id_prefix: &'a str) -> Self {
        CallIds {
            id_prefix,
            used: BTreeSet::new(),
        }
    }

    /// `id`, or `{id_prefix}_{index}` (then `_` appended until unused) when it is empty or was
    /// already handed out.
    pub(crate) fn unique(&mut self, mut id: String, index: u64) -> String {
        if id.is_empty() || self.used.contains(&id) {
            id = format!("{}_{index}", self.id_prefix);
            while self.used.contains(&id) {
                id.push('_');
            }
        }
        self.used.insert(id.clone());
        id
    }
}

#[cfg(test)]
mod tests {
    //! The blanket [`StreamDecoder`] impl over a minimal event logic: each event's data is
    //! visible text, except `end`, the stream's terminator.

    use super::*;

    #[derive(Default)]
    struct Lines {
        sse: SseState,
        text: StreamedText,
        done: bool,
    }

    impl EventHandler for Lines {
        fn sse_state(&mut self) -> &mut SseState {
            &mut self.sse
        }

        fn handle_event(
            &mut self,
            event: &SseEvent,
            out: &mut Vec<StreamDelta>,
            _at_eof: bool,
        ) -> Result<(), StreamError> {
            match event.data.as_str() {
                "end" => self.done = true,
                data => self.text.push_text(data, out),
            }
            Ok(())
        }

        fn is_done(&self) -> bool {
            self.done
        }

        fn take_response(&mut self) -> Result<LlmResponse, StreamError> {
            Ok(self
                .text
                .take_response(vec![], vec![], StopKind::EndTurn, None))
        }
    }

    #[test]
    fn l9_the_answer_is_final_at_the_terminator_and_later_bytes_are_ignored() {
        let mut decoder = Lines::default();
        let mut out = Vec::new();
        decoder.feed(b"data: Hello\n\n", &mut out).unwrap();
        assert!(!decoder.is_complete());
        assert!(
            !decoder.has_final_answer(),
            "no terminator yet: the answer may go on"
        );
        decoder.feed(b"data: end\n\n", &mut out).unwrap();
        assert!(decoder.is_complete() && decoder.has_final_answer());
        decoder.feed(b"data: more\n\n", &mut out).unwrap();
        assert_eq!(out, vec![StreamDelta::Text("Hello".into())]);
        assert_eq!(decoder.finish(&mut out).unwrap().text, "Hello");
    }

    #[test]
    fn l6_bytes_after_the_response_was_taken_are_ignored() {
        let mut decoder = Lines::default();
        let mut out = Vec::new();
        decoder.feed(b"data: Hi\n\n", &mut out).unwrap();
        assert_eq!(decoder.finish(&mut out).unwrap().text, "Hi");
        decoder.feed(b"data: late\n\n", &mut out).unwrap();
        assert_eq!(out, vec![StreamDelta::Text("Hi".into())]);
        assert!(matches!(
            decoder.finish(&mut out),
            Err(StreamError::Truncated(_))
        ));
    }

    #[test]
    fn l9_data_that_is_not_json_is_a_malformed_stream_unless_it_is_an_error_event() {
        let Err(StreamError::Provider { message, retryable }) =
            parse_event_json("oops", false, false, "chunk")
        else {
            panic!("not JSON is an error");
        };
        assert!(retryable);
        assert!(message.starts_with("malformed stream chunk: "), "{message}");
        assert_eq!(
            parse_event_json("overloaded", true, false, "chunk"),
            Err(StreamError::Provider {
                message: "overloaded".into(),
                retryable: true
            }),
            "an error event's data is the message"
        );
        assert_eq!(parse_event_json("{\"a\"", false, true, "chunk"), Ok(None));
        assert_eq!(
            parse_event_json("{\"a\": 1}", false, false, "chunk"),
            Ok(Some(serde_json::json!({"a": 1})))
        );
    }
}
