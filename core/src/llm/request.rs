//! The parts the provider request builders share (SPEC L6–L8): a streaming JSON `POST`, the
//! compact-JSON writers its body is assembled with, the cache of a session's serialized
//! history ([`BodyCache`], issue #15), and the wire forms of an error result and of blank
//! tool-call arguments used by both OpenAI routes.

use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::llm::{Body, HttpRequest, LlmRequest, Message};

/// A streaming JSON `POST` to `url` with `body`.
///
/// Headers: `content-type: application/json`, `accept: text/event-stream`, then `auth` (name,
/// value) when present; the caller may push more.
pub(crate) fn streaming_json_post(
    url: String,
    auth: Option<(&str, String)>,
    body: Body,
) -> HttpRequest {
    let mut headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("accept".to_owned(), "text/event-stream".to_owned()),
    ];
    if let Some((name, value)) = auth {
        headers.push((name.to_owned(), value));
    }
    HttpRequest { url, headers, body }
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

/// Appends `value` as compact JSON.
pub(crate) fn write_json(out: &mut Vec<u8>, value: &(impl Serialize + ?Sized)) {
    // Writing to a Vec cannot fail, and every value serialized here is a string-keyed tree.
    let _ = serde_json::to_writer(out, value);
}

/// Appends `,"key":value` (or `"key":value` right after `{`). `key` needs no escaping.
pub(crate) fn write_field(out: &mut Vec<u8>, key: &str, value: &(impl Serialize + ?Sized)) {
    if out.last().is_some_and(|&b| b != b'{') {
        out.push(b',');
    }
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    write_json(out, value);
}

/// Appends `item` as the next element of a comma-separated run that `out` holds alone.
pub(crate) fn push_item(out: &mut Vec<u8>, item: &(impl Serialize + ?Sized)) {
    if !out.is_empty() {
        out.push(b',');
    }
    write_json(out, item);
}

/// What the message planner of a route knows about the wire element before a point of the
/// history: enough to plan the rest from there exactly as a plan from the start would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Last {
    /// No element yet.
    #[default]
    Nothing,
    /// A user message or turn (text).
    User,
    /// An assistant message or turn.
    Assistant,
    /// Tool results: a Chat `tool` message, an Anthropic user turn ending with a `tool_result`.
    Tool,
    /// The Chat bridge message between tool results and a user message.
    Bridge,
}

/// One element of a route's message array (a Chat message, an Anthropic turn, the items of
/// one Responses message), as planned from the history.
pub(crate) struct Planned<E> {
    /// The element; [`WireElement::write`] serializes it.
    pub(crate) element: E,
    /// Index of the history message that started it (later ones may have merged into it).
    pub(crate) source: usize,
    /// What a planner resuming after it must know ([`Last`]).
    pub(crate) kind: Last,
    /// Nothing appended to the history can change it, even while it is the last element (a
    /// Chat tool message, the items of a Responses message). Any other element can change
    /// only while it is the last one: later messages merge into it.
    pub(crate) closed: bool,
}

/// A wire element's serialization.
pub(crate) trait WireElement {
    /// Appends the element's JSON items to `out`, each preceded by `,` unless `out` is empty
    /// (an element may be zero, one or several items of the array).
    fn write(&self, out: &mut Vec<u8>);
}

/// Which serialization the bytes of a [`BodyCache`] are: the route, and the options that
/// change how history messages are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheKey {
    /// Chat Completions; `reasoning_content` as the Chat options (`ChatOptions`, openai_chat.rs).
    Chat { reasoning_content: bool },
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    Responses,
}

/// The serialized form of the unchanging prefix of a session's history, kept between its
/// LLM requests (issue #15): a round's request costs what is new in it, not the whole
/// history again.
///
/// It holds the wire elements of `history[..resume]`, comma-separated, for one [`CacheKey`].
/// An element is kept once no message appended later can change it: the provider dialects
/// merge consecutive messages of a role into one element, so the last element stays open,
/// and so does anything planned from the same message (the Chat bridge before a user
/// message). The session's history (`History`, its owner) drops the cache on every change but
/// an append, so compaction, truncation, hook injections and joins rebuild it from the start.
#[derive(Default)]
pub(crate) struct BodyCache {
    key: Option<CacheKey>,
    /// The elements of `history[..resume]`, comma-separated. Shared with the request bodies
    /// built from it; extended in place once they are gone (else copied first).
    bytes: Arc<Vec<u8>>,
    /// The first history index not in `bytes`: planning resumes there.
    resume: usize,
    /// The last element in `bytes`.
    last: Last,
}

impl BodyCache {
    /// Bytes held.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn cached_bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// The history part of a message array: the cached run of closed elements (shared) and the
/// rest, built now. Each is comma-separated on its own; either may be empty.
pub(crate) struct HistoryJson {
    /// Elements kept from earlier requests and the ones that closed now.
    pub(crate) cached: Option<Arc<Vec<u8>>>,
    /// The elements that may still change, built for this request only.
    pub(crate) fresh: Vec<u8>,
}

/// The history as message-array elements, through `cache` when given: elements before the
/// cache's resume point are reused, the ones planned from there that can no longer change are
/// added to it, and the rest is serialized into [`HistoryJson::fresh`]. Without a cache,
/// everything is fresh (in a buffer of `fresh_capacity` bytes). `plan(history, start, last)`
/// must plan `history[start..]` given the element before `start`, exactly as a plan from the
/// start plans those messages (the property tests `*_cached_body_equals_fresh_body` check it).
///
/// `keep_fresh`: a history index whose element (the last one starting at or before it) and
/// everything after it stay out of the cache this time, so that the plan may write it in a
/// form of this request only (Anthropic's breakpoint at the end of the previous request,
/// SPEC L11); a cache that already holds it starts afresh.
pub(crate) fn history_json<'a, E: WireElement>(
    history: &'a [Message],
    cache: Option<(&mut BodyCache, CacheKey)>,
    fresh_capacity: usize,
    keep_fresh: Option<usize>,
    plan: impl Fn(&'a [Message], usize, Last) -> Vec<Planned<E>>,
) -> HistoryJson {
    let Some((cache, key)) = cache else {
        let mut fresh = Vec::with_capacity(fresh_capacity);
        for p in plan(history, 0, Last::Nothing) {
            p.element.write(&mut fresh);
        }
        return HistoryJson {
            cached: None,
            fresh,
        };
    };
    if cache.key != Some(key)
        || cache.resume > history.len()
        || keep_fresh.is_some_and(|k| k < cache.resume)
    {
        *cache = BodyCache {
            key: Some(key),
            ..BodyCache::default()
        };
    }
    let planned = plan(history, cache.resume, cache.last);
    let last_open = planned.last().filter(|p| !p.closed).map(|p| p.source);
    let kept = keep_fresh.and_then(|k| planned.iter().rev().find(|p| p.source <= k));
    let open_from = [last_open, kept.map(|p| p.source)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(history.len());
    let mut fresh = Vec::new();
    for p in &planned {
        if p.source < open_from {
            // Extends in place unless a request body still shares the bytes (then copies).
            p.element.write(Arc::make_mut(&mut cache.bytes));
            cache.last = p.kind;
        } else {
            p.element.write(&mut fresh);
        }
    }
    cache.resume = open_from.max(cache.resume);
    HistoryJson {
        cached: (!cache.bytes.is_empty()).then(|| cache.bytes.clone()),
        fresh,
    }
}

/// A request body: `head` + the array elements of `history` + `tail`. `head` ends inside
/// the array, after `[` or after elements it wrote itself (`leading`: the Chat system
/// message); `tail` starts with `]`.
#[must_use]
pub(crate) fn assemble(
    mut head: Vec<u8>,
    leading: bool,
    history: HistoryJson,
    tail: &[u8],
) -> Body {
    let mut body = Body::default();
    match history.cached {
        Some(cached) if !cached.is_empty() => {
            if leading {
                head.push(b',');
            }
            body.push(head);
            body.push_shared(cached);
            let mut rest = Vec::with_capacity(1 + history.fresh.len() + tail.len());
            if !history.fresh.is_empty() {
                rest.push(b',');
                rest.extend_from_slice(&history.fresh);
            }
            rest.extend_from_slice(tail);
            body.push(rest);
        }
        Some(_) | None => {
            if leading && !history.fresh.is_empty() {
                head.push(b',');
            }
            body.push(head);
            let mut rest = history.fresh;
            rest.extend_from_slice(tail);
            body.push(rest);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    use crate::llm::ToolDef;

    fn user(t: &str) -> Message {
        Message::User { text: t.into() }
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap_or("<not UTF-8>")
    }

    /// A wire element that is one JSON string: the history message's text.
    struct Item(String);

    impl WireElement for Item {
        fn write(&self, out: &mut Vec<u8>) {
            push_item(out, &self.0);
        }
    }

    /// One element per message from `start`, named `tag` and its index; every element closed but
    /// the ones `open` names (the last element, when open, stays fresh).
    fn plan_open<'s>(
        tag: &'static str,
        open: &'static [usize],
        starts: &'s RefCell<Vec<usize>>,
    ) -> impl Fn(&[Message], usize, Last) -> Vec<Planned<Item>> + 's {
        move |history, start, _last| {
            starts.borrow_mut().push(start);
            (start..history.len())
                .map(|i| Planned {
                    element: Item(format!("{tag}{i}")),
                    source: i,
                    kind: Last::User,
                    closed: !open.contains(&i),
                })
                .collect()
        }
    }

    fn cached_text(h: &HistoryJson) -> Option<String> {
        h.cached.as_ref().map(|c| text(c).to_owned())
    }

    #[test]
    fn l6_l7_l8_a_streaming_post_carries_json_and_event_stream_headers_then_the_auth() {
        let r = streaming_json_post("http://h/x".into(), bearer("k"), Body::from(b"{}".to_vec()));
        assert_eq!(r.url, "http://h/x");
        assert_eq!(
            r.headers,
            crate::llm::decoder_tests::streaming_headers(&[("authorization", "Bearer k")])
        );
        assert_eq!(r.body.to_vec(), b"{}");
        // A local server without a key: no Authorization header at all.
        assert_eq!(bearer(""), None);
        assert_eq!(
            streaming_json_post("u".into(), bearer(""), Body::default())
                .headers
                .len(),
            2
        );
    }

    #[test]
    fn l7_body_writers_separate_fields_and_items_with_commas() {
        let mut obj = b"{".to_vec();
        write_field(&mut obj, "a", &1);
        write_field(&mut obj, "b", "x\"y");
        obj.push(b'}');
        assert_eq!(text(&obj), r#"{"a":1,"b":"x\"y"}"#);
        let mut run = Vec::new();
        push_item(&mut run, "one");
        push_item(&mut run, &2);
        assert_eq!(text(&run), r#""one",2"#);
        let mut plain = Vec::new();
        write_json(&mut plain, &["é", "\n"]);
        assert_eq!(text(&plain), "[\"é\",\"\\n\"]");
    }

    #[test]
    fn c26_an_error_result_is_prefixed_and_blank_arguments_are_an_empty_object() {
        let mut out = Vec::new();
        write_json(&mut out, &ErrorText("no \"such\" file"));
        assert_eq!(text(&out), r#""Error: no \"such\" file""#);
        for blank in ["", "  ", "\n\t"] {
            assert_eq!(arguments_or_empty_object(blank), "{}", "{blank:?}");
        }
        assert_eq!(arguments_or_empty_object(r#"{"q":1}"#), r#"{"q":1}"#);
    }

    #[test]
    fn issue15_the_body_capacity_is_the_history_framing_escapes_tools_system_and_slack() {
        let messages = [user("hello"), user("abc")];
        let tools = [ToolDef {
            name: "abc".into(),
            description: "xy".into(),
            input_schema: serde_json::json!({"type": "object"}),
        }];
        let req = LlmRequest {
            effort: None,
            model: "m",
            system: Some("sys!"),
            messages: &messages,
            tools: &tools,
            max_output_tokens: 8,
            cache: None,
        };
        // History (5 + 64) + (3 + 64) = 136, an eighth of it 17, the tool 2·3 + 2 + 512 = 520,
        // the system prompt 4, and 256.
        assert_eq!(body_capacity(&req, 64), 136 + 17 + 520 + 4 + 256);
        let bare = LlmRequest {
            effort: None,
            system: None,
            messages: &[],
            tools: &[],
            ..req
        };
        assert_eq!(body_capacity(&bare, 64), 256);
    }

    #[test]
    fn issue15_without_a_cache_every_element_is_fresh() {
        let history = [user("a"), user("b")];
        let starts = RefCell::new(Vec::new());
        let h = history_json(&history, None, 16, None, plan_open("m", &[1], &starts));
        assert_eq!(cached_text(&h), None);
        assert_eq!(text(&h.fresh), r#""m0","m1""#);
        assert_eq!(*starts.borrow(), [0]);
    }

    #[test]
    fn issue15_closed_elements_are_cached_and_the_open_last_one_stays_fresh() {
        let chat = CacheKey::Chat {
            reasoning_content: false,
        };
        let mut cache = BodyCache::default();
        let starts = RefCell::new(Vec::new());
        // m1 is open but not last: later messages cannot change it, so it is kept. The open
        // last one (m2) is built for this request only.
        let history = [user("a"), user("b"), user("c")];
        let h = history_json(
            &history,
            Some((&mut cache, chat)),
            0,
            None,
            plan_open("m", &[1, 2], &starts),
        );
        assert_eq!(cached_text(&h).as_deref(), Some(r#""m0","m1""#));
        assert_eq!(text(&h.fresh), r#""m2""#);
        assert_eq!((cache.resume, cache.last), (2, Last::User));
        // The next request plans from the resume point only and reuses the cached bytes.
        let history = [user("a"), user("b"), user("c"), user("d")];
        let h = history_json(
            &history,
            Some((&mut cache, chat)),
            0,
            None,
            plan_open("m", &[3], &starts),
        );
        assert_eq!(*starts.borrow(), [0, 2]);
        assert_eq!(cached_text(&h).as_deref(), Some(r#""m0","m1","m2""#));
        assert_eq!(text(&h.fresh), r#""m3""#);
        // Everything closed: all of it is cached, and the same history again plans nothing
        // new from where it stopped (the resume point equals its length).
        let h = history_json(
            &history,
            Some((&mut cache, chat)),
            0,
            None,
            plan_open("m", &[], &starts),
        );
        assert_eq!(cached_text(&h).as_deref(), Some(r#""m0","m1","m2","m3""#));
        assert!(h.fresh.is_empty());
        assert_eq!(cache.resume, 4);
        let _ = history_json(
            &history,
            Some((&mut cache, chat)),
            0,
            None,
            plan_open("m", &[], &starts),
        );
        assert_eq!(*starts.borrow(), [0, 2, 3, 4]);
    }

    #[test]
    fn issue15_another_serialization_or_a_shorter_history_starts_the_cache_afresh() {
        let chat = CacheKey::Chat {
            reasoning_content: false,
        };
        let mut cache = BodyCache::default();
        let starts = RefCell::new(Vec::new());
        let history = [user("a"), user("b"), user("c")];
        let _ = history_json(
            &history,
            Some((&mut cache, chat)),
            0,
            None,
            plan_open("m", &[2], &starts),
        );
        assert_eq!(cache.cached_bytes(), r#""m0","m1""#.len());
        // Another route: nothing of the Chat bytes is reused.
        let h = history_json(
            &history,
            Some((&mut cache, CacheKey::Anthropic)),
            0,
            None,
            plan_open("a", &[2], &starts),
        );
        assert_eq!(cached_text(&h).as_deref(), Some(r#""a0","a1""#));
        assert_eq!(text(&h.fresh), r#""a2""#);
        // A shorter history than the cache covers (history replaced): planned from the start.
        let short = [user("z")];
        let h = history_json(
            &short,
            Some((&mut cache, CacheKey::Anthropic)),
            0,
            None,
            plan_open("s", &[], &starts),
        );
        assert_eq!(*starts.borrow(), [0, 0, 0]);
        assert_eq!(cached_text(&h).as_deref(), Some(r#""s0""#));
    }

    /// A body's bytes as text.
    fn body_text(b: &Body) -> String {
        text(&b.to_vec()).to_owned()
    }

    fn history(cached: Option<&str>, fresh: &str) -> HistoryJson {
        HistoryJson {
            cached: cached.map(|c| Arc::new(c.as_bytes().to_vec())),
            fresh: fresh.as_bytes().to_vec(),
        }
    }

    #[test]
    fn issue15_a_body_is_head_cached_and_fresh_elements_and_tail_with_one_comma_between() {
        let cases = [
            // (leading, cached, fresh, body)
            (false, None, "", "[]"),
            (false, None, "F", "[F]"),
            (true, None, "", "[S]"),
            (true, None, "F", "[S,F]"),
            (false, Some(""), "F", "[F]"),
            (true, Some(""), "F", "[S,F]"),
            (true, Some(""), "", "[S]"),
            (false, Some("C"), "", "[C]"),
            (false, Some("C"), "F", "[C,F]"),
            (true, Some("C"), "", "[S,C]"),
            (true, Some("C"), "F", "[S,C,F]"),
        ];
        for (leading, cached, fresh, want) in cases {
            let head = if leading {
                b"[S".to_vec()
            } else {
                b"[".to_vec()
            };
            let body = assemble(head, leading, history(cached, fresh), b"]");
            assert_eq!(body_text(&body), want, "{leading} {cached:?} {fresh:?}");
        }
        // The cached bytes are shared with the body, not copied.
        let cached = Arc::new(b"C".to_vec());
        let h = HistoryJson {
            cached: Some(cached.clone()),
            fresh: Vec::new(),
        };
        let body = assemble(b"[".to_vec(), false, h, b"]");
        assert_eq!(Arc::strong_count(&cached), 2);
        assert_eq!(body.pieces().count(), 3);
    }
}
