//! Property tests of the compaction fallback (SPEC K1, L4; DESIGN I9): whatever the history and
//! the budget, truncation keeps every tool call paired with its result, never drops the live
//! prompt, never splits a unit, and keeps the injections of the hook round just decided.

use buzz_agent_core::testing::{Message, ToolCall};
use buzz_agent_core::testing::{threshold, truncate, units};
use proptest::prelude::*;

#[allow(
    clippy::disallowed_methods,
    reason = "a test reads its case count; the core itself never reads env"
)]
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// One history unit to generate: a user message, or an assistant turn with `n` tool calls
/// (each followed by its result), or a hook injection pair.
#[derive(Debug, Clone)]
enum Unit {
    User(usize),
    Calls(Vec<(usize, usize)>),
    Injection(usize),
}

fn unit() -> impl Strategy<Value = Unit> {
    prop_oneof![
        (0usize..400).prop_map(Unit::User),
        prop::collection::vec((0usize..100, 0usize..2000), 0..4).prop_map(Unit::Calls),
        (0usize..300).prop_map(Unit::Injection),
    ]
}

fn build(units_: &[Unit], live_at: usize) -> (Vec<Message>, usize) {
    let mut h = Vec::new();
    let mut live = 0;
    let mut n = 0;
    for (i, u) in units_.iter().enumerate() {
        if i == live_at {
            live = h.len();
            h.push(Message::User {
                text: "LIVE PROMPT".into(),
            });
        }
        match u {
            Unit::User(len) => h.push(Message::User {
                text: "u".repeat(*len),
            }),
            Unit::Calls(calls) => {
                let tool_calls: Vec<ToolCall> = calls
                    .iter()
                    .map(|(a, _)| {
                        n += 1;
                        ToolCall {
                            id: format!("call_{n}"),
                            name: "s__t".into(),
                            arguments: "a".repeat(*a),
                        }
                    })
                    .collect();
                let results: Vec<Message> = tool_calls
                    .iter()
                    .zip(calls)
                    .map(|(c, (_, r))| Message::ToolResult {
                        call_id: c.id.clone(),
                        name: c.name.clone(),
                        text: "r".repeat(*r),
                        is_error: false,
                    })
                    .collect();
                h.push(Message::Assistant {
                    text: "thinking aloud".into(),
                    thinking: String::new(),
                    reasoning: Vec::new(),
                    tool_calls,
                });
                h.extend(results);
            }
            Unit::Injection(len) => {
                n += 1;
                let pair = buzz_agent_core::testing::injection_pair(
                    buzz_agent_core::testing::HookPoint::Stop,
                    "guard",
                    &"x".repeat(*len),
                    n as u64,
                );
                h.extend(pair);
            }
        }
    }
    if live_at >= units_.len() {
        live = h.len();
        h.push(Message::User {
            text: "LIVE PROMPT".into(),
        });
    }
    (h, live)
}

/// Every assistant tool call is immediately followed by exactly its results, in order (I9).
fn assert_paired(h: &[Message]) -> Result<(), TestCaseError> {
    for (i, m) in h.iter().enumerate() {
        if let Message::Assistant { tool_calls, .. } = m {
            for (k, c) in tool_calls.iter().enumerate() {
                match h.get(i + 1 + k) {
                    Some(Message::ToolResult { call_id, .. }) => prop_assert_eq!(call_id, &c.id),
                    other => prop_assert!(
                        false,
                        "call {} at {} has no result (found {:?})",
                        c.id,
                        i,
                        other
                    ),
                }
            }
        }
        if let Message::ToolResult { call_id, .. } = m {
            let owner = h[..i]
                .iter()
                .rev()
                .find(|m| matches!(m, Message::Assistant { .. }));
            let ok = matches!(owner, Some(Message::Assistant { tool_calls, .. }) if tool_calls.iter().any(|c| &c.id == call_id));
            prop_assert!(ok, "result {} at {} has no call before it", call_id, i);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn i9_k1_truncation_keeps_pairs_live_prompt_and_last_round(
        us in prop::collection::vec(unit(), 0..30),
        live_frac in 0usize..=100,
        budget in 0u64..20_000,
    ) {
        let live_at = us.len() * live_frac / 100;
        let (h, live) = build(&us, live_at);
        let before = h.clone();
        let (out, new_live, dropped) = truncate(h, live, budget);
        assert_paired(&out)?;
        prop_assert_eq!(&out[new_live], &Message::User { text: "LIVE PROMPT".into() });
        // Whole units only: the output is the input with some units removed, order kept.
        let kept_units: Vec<Vec<Message>> = units(&out).iter().map(|(a, b)| out[*a..*b].to_vec()).collect();
        let all_units: Vec<Vec<Message>> = units(&before).iter().map(|(a, b)| before[*a..*b].to_vec()).collect();
        let mut it = all_units.iter();
        for k in &kept_units {
            prop_assert!(it.any(|u| u == k), "a kept unit is not a whole unit of the input, in order");
        }
        prop_assert_eq!(all_units.len() - kept_units.len(), dropped);
        // The last unit always survives.
        if let (Some(a), Some(b)) = (all_units.last(), kept_units.last()) {
            prop_assert_eq!(a, b);
        }
        // Either it fits now, or only protected units are left: the live prompt, the last unit
        // and the trailing hook injections.
        let size: u64 = out.iter().map(|m| m.content_bytes() as u64).sum();
        let trailing = us.iter().rev().take_while(|u| matches!(u, Unit::Injection(_))).count();
        let protected = 1 + 1 + trailing;
        prop_assert!(size <= budget || kept_units.len() <= protected,
            "size {} over budget {} with {} units kept (protected {})", size, budget, kept_units.len(), protected);
        // And nothing was dropped needlessly: with the whole history within budget, nothing goes.
        let total: u64 = before.iter().map(|m| m.content_bytes() as u64).sum();
        if total <= budget {
            prop_assert_eq!(dropped, 0);
        }
    }

    #[test]
    fn h6_k1_truncation_keeps_the_trailing_hook_injections(
        us in prop::collection::vec(unit(), 0..20),
        injections in 1usize..4,
        budget in 0u64..2_000,
    ) {
        let mut us = us;
        for _ in 0..injections {
            us.push(Unit::Injection(50));
        }
        let (h, live) = build(&us, 0);
        let (out, _, _) = truncate(h, live, budget);
        let tail_injections = units(&out)
            .iter()
            .rev()
            .take_while(|(a, _)| matches!(&out[*a], Message::Assistant { tool_calls, .. } if tool_calls.len() == 1 && tool_calls[0].id.starts_with("buzz_hook_")))
            .count();
        let expected = us.iter().rev().take_while(|u| matches!(u, Unit::Injection(_))).count();
        prop_assert_eq!(tail_injections, expected);
    }
}

#[test]
fn k1_threshold_never_exceeds_the_window() {
    for w in [1u64, 2, 9, 10, 11, 1000, 200_000, u64::MAX / 2] {
        assert!(threshold(w) <= w);
        assert!(threshold(w) >= w / 10 * 9);
    }
}
