//! Prompt caching (SPEC L11) over real pipes: Anthropic `cache_control` breakpoints (at most 4,
//! rolling, the prefix byte-stable across a hook injection and a reload), OpenAI's
//! `prompt_cache_key` (one per session, only where the endpoint takes it), and nothing of
//! either with `BUZZ_AGENT_PROMPT_CACHING=0`.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, hook_server, path_str, wait_stderr};
use crate::fake_llm::{RecordedRequest, Reply, Wire};
use crate::harness::{Ctx, fake_mcp_entry};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn tools() -> Value {
    fake_mcp_entry("fs", &[("FAKE_MCP_TOOLS", "echo")])
}

fn echo(id: &str, text: &str) -> Reply {
    Reply::tool_calls(vec![(id, "fs__echo", json!({ "text": text }))])
}

/// The breakpoints of one request, checked against SPEC L11's placement: the first ends the
/// system prompt, the last ends the conversation, at most 4 in all.
fn checked_breakpoints(req: &RecordedRequest, what: &str) -> Vec<String> {
    let marks = req.cache_breakpoints();
    assert!(
        (2..=4).contains(&marks.len()),
        "{what}: {marks:?} in {}",
        req.body
    );
    assert_eq!(
        marks[0], "system 0",
        "{what}: the system prompt's end first"
    );
    let messages = req.messages();
    let last = messages.len() - 1;
    let blocks = messages[last]["content"].as_array().map_or(1, Vec::len);
    assert_eq!(
        marks.last().map(String::as_str),
        Some(format!("message {last} block {}", blocks - 1).as_str()),
        "{what}: the conversation's end last"
    );
    marks
}

/// L11 on the Anthropic route: three tool rounds, a `_Stop` objection (its synthetic call joins
/// the model's answer), an exit, a `session/load` in a new agent process and one more prompt.
/// Every request marks at most 4 breakpoints: the system prompt's end, the previous request's
/// end (within one process) and the conversation's end; every request sends the previous one's
/// messages again unchanged but for the breakpoints, the objection and the reload included.
pub fn l11_anthropic_breakpoints_roll_and_the_prefix_holds_across_an_objection_and_a_reload(
    ctx: &Ctx,
) {
    let (s, [log]) = Scratch::with_files(["hooks.log"]);
    let state = path_str(&s.dir.path().join("state"));
    let env = [
        ("BUZZ_AGENT_STATE_DIR", state.as_str()),
        ("BUZZ_AGENT_SYSTEM_PROMPT", "You are terse."),
        ("MCP_HOOK_SERVERS", "gate"),
    ];
    // The hook objects once in the first process; after the load it lets the turn end.
    let servers = |objections: &str| {
        json!([
            tools(),
            hook_server("gate", &log, &[("FAKE_MCP_STOP_OBJECT_TIMES", objections)])
        ])
    };
    let llm = ctx.fake_llm(vec![
        echo("call_1", "one"),
        echo("call_2", "two"),
        Reply::text("All done."),
        Reply::text("Fixed now."),
        Reply::text("Second prompt answered."),
    ]);
    // Each process: the same fake LLM, route and environment, initialized.
    let start = |llm| {
        let (llm, agent) = Setup::new(ctx, &s)
            .llm(llm)
            .wire(Wire::Anthropic)
            .env(&env)
            .spawn();
        agent.initialize();
        (llm, agent)
    };
    let (llm, agent) = start(llm);
    let sid = agent.new_session(&s.ws, servers("1"));
    let r = agent.prompt(&sid, "Echo twice, then finish.");
    assert_end_turn(&agent, &r);
    agent.finish();
    let (llm, agent) = start(llm);
    let loaded = agent.request(
        "session/load",
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": servers("0")}),
    );
    assert!(loaded.get("result").is_some(), "{loaded}");
    let r = agent.prompt(&sid, "And once more.");
    assert_end_turn(&agent, &r);
    agent.finish();

    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        5,
        "three rounds, the objection's round, the prompt after the load"
    );
    for (i, req) in reqs.iter().enumerate() {
        let marks = checked_breakpoints(req, &format!("request {i}"));
        // The previous request's end, read back: within one process, after the first request.
        let previous_end = match i {
            1..=3 => Some(reqs[i - 1].messages().len() - 1),
            0 | 4 => None,
            _ => unreachable!(),
        };
        match previous_end {
            Some(m) => {
                let prefix = format!("message {m} block ");
                assert_eq!(marks.len(), 3, "request {i}: {marks:?}");
                assert!(marks[1].starts_with(&prefix), "request {i}: {marks:?}");
            }
            None => assert_eq!(marks.len(), 2, "request {i}: {marks:?}"),
        }
        if i > 0 {
            let before = reqs[i - 1].messages_without_breakpoints();
            let now = req.messages_without_breakpoints();
            assert!(
                now.len() > before.len() && now[..before.len()] == before[..],
                "request {i} does not start with request {}'s messages:\n{}\n{}",
                i - 1,
                Value::Array(before.clone()),
                Value::Array(now.clone())
            );
        }
    }
    // The objection is in the history the cache keeps reading: the joined call and its result.
    assert!(
        reqs[3]
            .assistant_tool_calls()
            .iter()
            .any(|(_, name, _)| name.ends_with("___Stop")),
        "{}",
        reqs[3].body
    );
}

/// L11 off (`BUZZ_AGENT_PROMPT_CACHING=0`), on every route: no breakpoint, the system prompt as
/// a string, no `prompt_cache_key` even where the endpoint is told to take one.
pub fn l11_caching_off_sends_no_breakpoint_and_no_cache_key(ctx: &Ctx) {
    for wire in Wire::ALL {
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .replies(vec![echo("call_1", "x"), Reply::text("done")])
            .wire(wire)
            .env(&[
                ("BUZZ_AGENT_PROMPT_CACHING", "0"),
                ("OPENAI_COMPAT_PROMPT_CACHE_KEY", "1"),
                ("BUZZ_AGENT_SYSTEM_PROMPT", "You are terse."),
            ])
            .servers([tools()])
            .start();
        let r = agent.prompt(&sid, "Echo once.");
        assert_end_turn(&agent, &r);
        agent.finish();
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2, "{wire:?}");
        for req in &reqs {
            let body = req.body.to_string();
            assert!(!body.contains("cache_control"), "{wire:?}: {body}");
            assert!(
                req.body.get("prompt_cache_key").is_none(),
                "{wire:?}: {body}"
            );
            if wire == Wire::Anthropic {
                assert_eq!(req.body["system"], "You are terse.", "{wire:?}");
            }
        }
    }
}

/// L11 on the OpenAI routes: `prompt_cache_key` is the session's id on every request of that
/// session when the endpoint takes it (`OPENAI_COMPAT_PROMPT_CACHE_KEY=1`; by default only
/// OpenAI's own API does), and absent by default at another address. A server that answers
/// the key with "Unrecognized request argument" gets the same attempt again without it, and
/// no later request, with one WARN.
pub fn l11_the_openai_routes_send_one_key_per_session_only_where_the_endpoint_takes_it(ctx: &Ctx) {
    for wire in [Wire::Chat, Wire::Responses] {
        // By default, at a server that is not OpenAI's API: no key.
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .replies(vec![Reply::text("hi")])
            .wire(wire)
            .start();
        assert_end_turn(&agent, &agent.prompt(&sid, "Hello."));
        agent.finish();
        assert!(
            llm.requests()[0].body.get("prompt_cache_key").is_none(),
            "{wire:?}: {}",
            llm.requests()[0].body
        );

        // Told the endpoint takes it: one key per session, on every request of it.
        let s = Scratch::new();
        let (llm, agent) = Setup::new(ctx, &s)
            .replies(vec![
                echo("call_1", "a"),
                Reply::text("first"),
                Reply::text("second"),
            ])
            .wire(wire)
            .env(&[("OPENAI_COMPAT_PROMPT_CACHE_KEY", "1")])
            .spawn();
        agent.initialize();
        let one = agent.new_session(&s.ws, json!([tools()]));
        let two = agent.new_session(&s.ws, json!([]));
        assert_end_turn(&agent, &agent.prompt(&one, "Echo a."));
        assert_end_turn(&agent, &agent.prompt(&two, "Hello."));
        agent.finish();
        let keys: Vec<Value> = llm
            .requests()
            .iter()
            .map(|r| r.body["prompt_cache_key"].clone())
            .collect();
        assert_eq!(keys, [json!(one), json!(one), json!(two)], "{wire:?}");

        // A server that does not take it.
        let s = Scratch::new();
        let (llm, agent, sid) = Setup::new(ctx, &s)
            .handler(|_, req| {
                if req.body.get("prompt_cache_key").is_some() {
                    Reply::status(
                        400,
                        vec![("content-type", "application/json")],
                        r#"{"error":{"message":"Unrecognized request argument supplied: prompt_cache_key","type":"invalid_request_error","param":null,"code":null}}"#,
                    )
                } else {
                    Reply::text("fine without it")
                }
            })
            .wire(wire)
            .env(&[("OPENAI_COMPAT_PROMPT_CACHE_KEY", "on")])
            .start();
        assert_end_turn(&agent, &agent.prompt(&sid, "One."));
        wait_stderr(&agent, "does not take prompt_cache_key", WAIT);
        assert_end_turn(&agent, &agent.prompt(&sid, "Two."));
        let stderr = agent.stderr_text();
        agent.finish();
        let with_key: Vec<bool> = llm
            .all_requests()
            .iter()
            .map(|r| r.body.get("prompt_cache_key").is_some())
            .collect();
        assert_eq!(with_key, [true, false, false], "{wire:?}");
        assert_eq!(
            stderr.matches("does not take prompt_cache_key").count(),
            1,
            "{wire:?}: {stderr}"
        );
    }
}

/// A6/L11 on every route: each `usage_update` carries the call's input, output, cache-read and
/// cache-write tokens as the provider reported them (under `_meta.buzz`; cache writes only where
/// the route reports them) and, with `BUZZ_AGENT_PRICES`, the session's cumulative `cost`; the
/// prompt response's `_meta.usage` has the turn's totals and cost. Every frame is checked
/// against the ACP schema by the harness.
pub fn a6_l11_usage_with_cache_tokens_and_cost_reaches_the_client_on_every_route(ctx: &Ctx) {
    for wire in Wire::ALL {
        let s = Scratch::new();
        let (_llm, agent, sid) = Setup::new(ctx, &s)
            .replies(vec![
                echo("call_1", "x")
                    .usage(Some((1000, 10)))
                    .cache_usage(800, 150),
                Reply::text("done")
                    .usage(Some((1100, 5)))
                    .cache_usage(1000, 0),
            ])
            .wire(wire)
            .env(&[(
                "BUZZ_AGENT_PRICES",
                "input=3,output=15,cache_read=0.3,cache_write=3.75",
            )])
            .servers([tools()])
            .start();
        let r = agent.prompt(&sid, "Echo once.");
        assert_end_turn(&agent, &r);
        let usage: Vec<Value> = agent
            .session_updates(&sid)
            .into_iter()
            .filter(|u| u["sessionUpdate"] == "usage_update")
            .collect();
        let totals = agent.result(&r)["_meta"]["usage"].clone();
        agent.finish();
        // Anthropic always reports its cache writes; Chat only through OpenRouter's field,
        // which the fake sends when there are any; the Responses API has no such count.
        let writes = |n: u64| match wire {
            Wire::Anthropic => Some(n),
            Wire::Chat => (n > 0).then_some(n),
            Wire::Responses => None,
        };
        let expect = |input: u64, output: u64, read: u64, write: u64| {
            let mut v = json!({"inputTokens": input, "outputTokens": output,
                               "totalTokens": input + output, "cachedReadTokens": read});
            if let Some(w) = writes(write) {
                v["cachedWriteTokens"] = json!(w);
            }
            v
        };
        assert_eq!(usage.len(), 2, "{wire:?}: {usage:?}");
        assert_eq!(usage[0]["used"], 1010, "{wire:?}");
        assert_eq!(
            usage[0]["_meta"]["buzz"],
            expect(1000, 10, 800, 150),
            "{wire:?}"
        );
        assert_eq!(
            usage[1]["_meta"]["buzz"],
            expect(1100, 5, 1000, 0),
            "{wire:?}"
        );
        // Per million tokens: input $3, output $15, cache read $0.30, cache write $3.75.
        let write_1 = writes(150).unwrap_or(0);
        let first = ((1000 - 800 - write_1) as f64 * 3.0
            + 800.0 * 0.3
            + write_1 as f64 * 3.75
            + 10.0 * 15.0)
            / 1e6;
        let second = first + (100.0 * 3.0 + 1000.0 * 0.3 + 5.0 * 15.0) / 1e6;
        for (u, want) in [(&usage[0], first), (&usage[1], second)] {
            let amount = u["cost"]["amount"].as_f64().unwrap_or(f64::NAN);
            assert!(
                (amount - want).abs() < 1e-12,
                "{wire:?}: {amount} != {want}"
            );
            assert_eq!(u["cost"]["currency"], "USD", "{wire:?}");
        }
        let mut want_totals = expect(2100, 15, 1800, 150);
        want_totals["cost"] = json!({"amount": second, "currency": "USD"});
        let got = totals["cost"]["amount"].as_f64().unwrap_or(f64::NAN);
        assert!((got - second).abs() < 1e-12, "{wire:?}: {totals}");
        want_totals["cost"]["amount"] = totals["cost"]["amount"].clone();
        assert_eq!(totals, want_totals, "{wire:?}: the turn's totals");
    }
}
