//! Property tests of the incremental request body (issue #15): a request built through a
//! history's cache of serialized messages ([`History`], [`BodyCache`]) is byte for byte the
//! request built from scratch, on every route, whatever the history and whatever sequence of
//! appends, rewrites (compaction, truncation, injections, joins) and route or option changes
//! came before. The provider dialects merge consecutive messages of a role, add the bridge
//! message after tool results and put reasoning first (docs/dialects.md), so the cache may
//! keep an element only once nothing appended can change it: these tests are what says it
//! does.

use crate::config::{Config, ProviderKind};
use crate::history::History;
use crate::llm::builders::{self, ChatOptions, ResponsesOptions};
use crate::llm::{
    BodyCache, ChatReasoningField, HttpRequest, LlmRequest, Message, PromptCache, ReasoningBlock,
    ToolCall, ToolDef,
};
use proptest::prelude::*;
use serde_json::json;

/// Cases per property: fixed, so the core's code reads no environment (the properties under
/// `core/tests/` take `PROPTEST_CASES`).
const CASES: u32 = 500;

/// Texts that exercise the dialect rules: empty, blank, needing JSON escapes, non-ASCII.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("  \n".to_string()),
        Just("plain".to_string()),
        Just("quote \" backslash \\ tab \t nl \n ctrl \u{1}".to_string()),
        Just("é 日本 🦀".to_string()),
        "[a-z \"\\n]{0,24}",
    ]
}

fn reasoning_block() -> impl Strategy<Value = ReasoningBlock> {
    prop_oneof![
        (
            text(),
            prop_oneof![Just(String::new()), Just("sig".to_string())]
        )
            .prop_map(|(text, signature)| ReasoningBlock::Thinking { text, signature }),
        Just(ReasoningBlock::Redacted {
            data: "opaque==".into()
        }),
        Just(ReasoningBlock::ResponsesItem(json!({
            "type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc"
        }))),
        Just(ReasoningBlock::ChatField(
            ChatReasoningField::ReasoningContent
        )),
        Just(ReasoningBlock::ChatField(ChatReasoningField::Reasoning)),
        Just(ReasoningBlock::ChatDetails(json!([
            {"type": "reasoning.text", "text": "t", "index": 0}
        ]))),
    ]
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    (
        0u32..4,
        prop_oneof![
            Just(String::new()),
            Just("  ".to_string()),
            Just(r#"{"path":"a \"b\""}"#.to_string()),
            Just("[1,2]".to_string()),
            Just("{not json".to_string()),
        ],
    )
        .prop_map(|(n, arguments)| ToolCall {
            id: format!("call_{n}"),
            name: format!("fs__tool{n}"),
            arguments,
        })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        3 => text().prop_map(|text| Message::User { text }),
        4 => (
            text(),
            prop_oneof![Just(String::new()), text()],
            prop::collection::vec(reasoning_block(), 0..3),
            prop::collection::vec(tool_call(), 0..3),
        )
            .prop_map(|(text, thinking, reasoning, tool_calls)| Message::Assistant {
                text,
                thinking,
                reasoning,
                tool_calls,
            }),
        4 => (0u32..4, text(), any::<bool>()).prop_map(|(n, text, is_error)| {
            Message::ToolResult {
                call_id: format!("call_{n}"),
                name: format!("fs__tool{n}"),
                text,
                is_error,
            }
        }),
    ]
}

/// A change to the history between requests.
#[derive(Debug, Clone)]
enum Op {
    /// Append messages (`History::push`: the cache stays).
    Append(Vec<Message>),
    /// Build a request on a route and compare it with the one built from scratch.
    Build(Route),
    /// Replace the whole history (compaction: summary, injections, live prompt).
    Replace(Vec<Message>),
    /// Drop the oldest messages (truncation).
    DropFront(usize),
    /// Insert messages at index 1 (`_PostCompact` injections).
    InsertAt1(Vec<Message>),
    /// Change the last message in place (a hook call joining the model's answer).
    EditLast(ToolCall),
    /// Remove the last message.
    Pop,
}

/// A route with the options that change the body.
#[derive(Debug, Clone, Copy)]
enum Route {
    Chat {
        reasoning_content: bool,
        max_completion_tokens: bool,
        system: bool,
    },
    Anthropic {
        system: bool,
        /// Prompt caching (SPEC L11): breakpoints at the end of the previous cached request
        /// (`History::cache_mark`) and of the conversation.
        caching: bool,
    },
    Responses {
        include_encrypted_reasoning: bool,
        system: bool,
    },
}

fn route() -> impl Strategy<Value = Route> {
    prop_oneof![
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(r, m, system)| Route::Chat {
            reasoning_content: r,
            max_completion_tokens: m,
            system,
        }),
        (any::<bool>(), any::<bool>())
            .prop_map(|(system, caching)| Route::Anthropic { system, caching }),
        (any::<bool>(), any::<bool>()).prop_map(|(i, system)| Route::Responses {
            include_encrypted_reasoning: i,
            system,
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec(message(), 1..4).prop_map(Op::Append),
        6 => route().prop_map(Op::Build),
        1 => prop::collection::vec(message(), 0..4).prop_map(Op::Replace),
        1 => (1usize..4).prop_map(Op::DropFront),
        1 => prop::collection::vec(message(), 1..3).prop_map(Op::InsertAt1),
        1 => tool_call().prop_map(Op::EditLast),
        1 => Just(Op::Pop),
    ]
}

fn tools() -> Vec<ToolDef> {
    vec![ToolDef {
        name: "fs__read".into(),
        description: "Read \"a\" file".into(),
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    }]
}

fn anthropic_config() -> Config {
    let mut cfg = Config::for_tests(ProviderKind::Anthropic, "http://h");
    cfg.anthropic_version = "2023-06-01".into();
    cfg
}

/// The request on `route` for `messages`, through `cache` when given.
fn build(
    route: Route,
    messages: &[Message],
    cache: Option<&mut BodyCache>,
    cfg: &Config,
    previous_len: Option<usize>,
) -> HttpRequest {
    let tools = tools();
    let system = match route {
        Route::Chat { system, .. }
        | Route::Anthropic { system, .. }
        | Route::Responses { system, .. } => system.then_some("Be \"brief\".\n"),
    };
    let req = LlmRequest {
        system,
        tools: &tools,
        cache: match route {
            Route::Anthropic { caching: true, .. } => Some(PromptCache {
                key: "sess_1",
                previous_len,
            }),
            Route::Anthropic { caching: false, .. }
            | Route::Chat { .. }
            | Route::Responses { .. } => None,
        },
        ..LlmRequest::for_tests("m", messages)
    };
    match route {
        Route::Chat {
            reasoning_content,
            max_completion_tokens,
            ..
        } => builders::chat(
            "http://h/v1",
            "k",
            &req,
            &ChatOptions {
                max_completion_tokens,
                reasoning_content,
                ..ChatOptions::default()
            },
            cache,
        ),
        Route::Anthropic { .. } => builders::anthropic(cfg, &req, cache),
        Route::Responses {
            include_encrypted_reasoning,
            ..
        } => builders::responses(
            "http://h/v1",
            "k",
            &req,
            &ResponsesOptions {
                include_encrypted_reasoning,
                ..ResponsesOptions::default()
            },
            cache,
        ),
    }
}

/// Runs `ops` on one history; at every `Build`, the cached request must equal the fresh one.
fn check(initial: Vec<Message>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let cfg = anthropic_config();
    let mut history = History::from(initial);
    for op in ops {
        match op {
            Op::Append(messages) => {
                for m in messages {
                    history.push(m);
                }
            }
            Op::Build(route) => {
                let mark = history.cache_mark();
                let fresh = build(route, &history, None, &cfg, mark);
                let (messages, cache) = history.with_cache();
                let cached = build(route, messages, Some(cache), &cfg, mark);
                if matches!(route, Route::Anthropic { caching: true, .. }) {
                    let len = history.len();
                    history.set_cache_mark(len);
                }
                prop_assert_eq!(&cached.url, &fresh.url);
                prop_assert_eq!(&cached.headers, &fresh.headers);
                let (c, f) = (cached.body.to_vec(), fresh.body.to_vec());
                prop_assert!(
                    c == f,
                    "{route:?}, {} messages:\ncached {}\nfresh  {}",
                    history.len(),
                    String::from_utf8_lossy(&c),
                    String::from_utf8_lossy(&f)
                );
                prop_assert!(serde_json::from_slice::<serde_json::Value>(&f).is_ok());
            }
            Op::Replace(messages) => history = History::from(messages),
            Op::DropFront(n) => {
                let messages = history.rewrite(0);
                let n = n.min(messages.len());
                messages.drain(..n);
            }
            Op::InsertAt1(messages) => {
                let at = 1.min(history.len());
                history.rewrite(at).splice(at..at, messages);
            }
            Op::EditLast(call) => {
                let last = history.len().saturating_sub(1);
                if let Some(Message::Assistant { tool_calls, .. }) =
                    history.rewrite(last).last_mut()
                {
                    tool_calls.push(call);
                }
            }
            Op::Pop => {
                let last = history.len().saturating_sub(1);
                history.rewrite(last).pop();
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Random histories, random sequences of appends, rewrites and builds on any route.
    #[test]
    fn cached_body_equals_fresh_body_after_any_appends_and_rewrites(
        initial in prop::collection::vec(message(), 0..6),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        check(initial, ops)?;
    }

    /// One route for the whole session, a request after every append: the shape of a tool
    /// loop, where the cache is extended round by round.
    #[test]
    fn cached_body_equals_fresh_body_round_by_round_on_one_route(
        route in route(),
        rounds in prop::collection::vec(prop::collection::vec(message(), 1..4), 1..30),
    ) {
        let mut ops = Vec::new();
        for messages in rounds {
            ops.push(Op::Append(messages));
            ops.push(Op::Build(route));
        }
        check(Vec::new(), ops)?;
    }
}

/// The cache keeps the unchanging prefix: after a tool round, the next request's history part
/// is one shared piece holding all but what was appended since (issue #15: a round costs what
/// is new in it).
#[test]
fn a_tool_round_serializes_only_what_it_appended() {
    let cfg = anthropic_config();
    let mut history = History::default();
    history.push(Message::User {
        text: "list the files".into(),
    });
    let route = Route::Chat {
        reasoning_content: false,
        max_completion_tokens: false,
        system: true,
    };
    let mut cached_sizes = Vec::new();
    for round in 0..5 {
        history.push(Message::Assistant {
            text: String::new(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: vec![ToolCall {
                id: format!("call_{round}"),
                name: "fs__read".into(),
                arguments: "{}".into(),
            }],
        });
        history.push(Message::ToolResult {
            call_id: format!("call_{round}"),
            name: "fs__read".into(),
            text: "x".repeat(1000),
            is_error: false,
        });
        let fresh = build(route, &history, None, &cfg, None);
        let (messages, cache) = history.with_cache();
        let cached = build(route, messages, Some(cache), &cfg, None);
        assert_eq!(cached.body, fresh.body);
        let (_, cache) = history.with_cache();
        cached_sizes.push(cache.cached_bytes());
        // The body: head, the shared history, and a short rest (tools and the tail).
        let pieces: Vec<&[u8]> = cached.body.pieces().collect();
        assert_eq!(pieces.len(), 3, "{:?}", cached.body);
        assert!(pieces[2].len() < 300, "{} bytes rebuilt", pieces[2].len());
    }
    // Every round's tool result joined the cache: it grew by about one round each time.
    for pair in cached_sizes.windows(2) {
        let grown = pair[1] - pair[0];
        assert!((1000..1300).contains(&grown), "{cached_sizes:?}");
    }
    // A rewrite drops it.
    history.rewrite(0).remove(0);
    assert_eq!(history.with_cache().1.cached_bytes(), 0);
}
