//! Reasoning effort (SPEC L12) over real pipes: `BUZZ_AGENT_THINKING_EFFORT` in each route's
//! own field, the `thought_level` session config option next to the model selector,
//! `session/set_config_option` changing it from the next request on, and a loaded session
//! keeping it.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, path_str, strs_of};
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, Style, Wire};
use crate::harness::fake_mcp_entry;
use crate::harness::{AgentProc, Ctx};
use serde_json::{Value, json};

/// The effort a request carries in its route's field, as the configuration spells it
/// (`None`: no reasoning parameter). Anthropic's token budget is read back as the effort it
/// stands for at the default `max_tokens` (32,768: ⅛, ¼, ½, ¾).
fn sent_effort(req: &RecordedRequest) -> Option<String> {
    let body = &req.body;
    match req.wire() {
        Wire::Anthropic => {
            let thinking = body.get("thinking")?;
            assert_eq!(thinking["type"], "enabled", "{body}");
            let budget = thinking["budget_tokens"].as_u64().unwrap_or(0);
            let max = body["max_tokens"].as_u64().unwrap_or(0);
            assert!(budget >= 1024 && budget < max, "{body}");
            let effort = match budget * 8 / max {
                1 => "low",
                2 => "medium",
                4 => "high",
                6 => "max",
                _ => panic!("budget {budget} of {max}: {body}"),
            };
            Some(effort.to_string())
        }
        Wire::Chat => body
            .get("reasoning_effort")
            .map(|e| e.as_str().unwrap_or("?").to_string()),
        Wire::Responses => body
            .get("reasoning")
            .map(|r| r["effort"].as_str().unwrap_or("?").to_string()),
    }
}

/// `session/set_config_option` of the `thought_level` option to `value`; returns the answer's
/// `configOptions`.
fn set_level(agent: &AgentProc, sid: &str, value: &str) -> Value {
    let set = agent.request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "thought_level", "value": value}),
    );
    agent.result(&set)["configOptions"].clone()
}

/// L12 on every route: `session/new` advertises a `thought_level` selector (category
/// `thought_level`) after the model selector, its current value the configured effort;
/// `BUZZ_AGENT_THINKING_EFFORT=medium` reaches every request of a tool round in the route's
/// field (Anthropic `thinking` with a budget, Chat `reasoning_effort`, Responses
/// `reasoning.effort`), and the round's reasoning goes back with it; `session/set_config_option`
/// sets `max` from the next request on (OpenAI's routes send `high`), `default` sends no
/// parameter, an unknown value is `-32602`; after an exit, `session/load` in a new process
/// advertises and sends the effort the session chose.
pub fn l12_effort_reaches_every_route_and_set_config_option_changes_it_from_the_next_request(
    ctx: &Ctx,
) {
    for wire in Wire::ALL {
        let s = Scratch::new();
        let state = path_str(&s.dir.path().join("state"));
        let env = [
            ("BUZZ_AGENT_STATE_DIR", state.as_str()),
            ("BUZZ_AGENT_THINKING_EFFORT", "medium"),
        ];
        let tools = || json!([fake_mcp_entry("fs", &[("FAKE_MCP_TOOLS", "echo")])]);
        let replies = [
            Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "a"}))])
                .with_thinking("Echo first."),
            Reply::text("one").with_thinking("Now answer."),
            Reply::text("two"),
            Reply::text("three"),
            Reply::text("four"),
        ];
        // As OpenAI does: a Responses reasoning item carries its encrypted content when the
        // request asks for it, the only form a stateless request can send back.
        let llm = ctx.fake_llm_with(move |i, req| {
            let reply = replies
                .get(i)
                .cloned()
                .unwrap_or_else(|| Reply::text("extra"));
            let asked = req.body["include"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "reasoning.encrypted_content"));
            match reply.thinking().map(str::to_string) {
                Some(text) if asked => reply.with_style(Style {
                    encrypted_reasoning: Some(crate::dialects::encrypted(&text)),
                    ..Style::default()
                }),
                _ => reply,
            }
        });
        let (llm, agent) = Setup::new(ctx, &s).llm(llm).wire(wire).env(&env).spawn();
        agent.initialize();
        let opened = agent.request(
            "session/new",
            json!({"cwd": s.ws.to_str(), "mcpServers": tools()}),
        );
        let result = agent.result(&opened).clone();
        let sid = result["sessionId"].as_str().expect("sessionId").to_string();
        let options = &result["configOptions"];
        assert_eq!(options[0]["id"], "model", "{wire:?}: {options}");
        assert_eq!(options[1]["id"], "thought_level", "{wire:?}: {options}");
        assert_eq!(options[1]["category"], "thought_level");
        assert_eq!(options[1]["type"], "select");
        assert_eq!(options[1]["currentValue"], "medium");
        let values = strs_of(&options[1]["options"], "value");
        assert_eq!(values, ["default", "low", "medium", "high", "max"]);

        assert_end_turn(&agent, &agent.prompt(&sid, "Echo a."));
        let set = set_level(&agent, &sid, "max");
        assert_eq!(set[1]["currentValue"], "max", "{wire:?}: {set}");
        assert_eq!(
            set[0]["currentValue"],
            ctx.model(),
            "the model is unchanged"
        );
        assert_end_turn(&agent, &agent.prompt(&sid, "Think hard."));
        let bad = agent.request(
            "session/set_config_option",
            json!({"sessionId": sid, "configId": "thought_level", "value": "extreme"}),
        );
        assert_eq!(agent.error(&bad).0, -32602, "{wire:?}: {bad}");
        agent.finish();

        // A new process loads the session: the chosen effort is advertised and sent.
        let (llm, agent) = Setup::new(ctx, &s).llm(llm).wire(wire).env(&env).spawn();
        agent.initialize();
        let loaded = agent.request(
            "session/load",
            json!({"sessionId": sid, "cwd": s.ws, "mcpServers": tools()}),
        );
        assert_eq!(
            agent.result(&loaded)["configOptions"][1]["currentValue"],
            "max",
            "{wire:?}: {loaded}"
        );
        assert_end_turn(&agent, &agent.prompt(&sid, "Still thinking hard."));
        let set = set_level(&agent, &sid, "default");
        assert_eq!(set[1]["currentValue"], "default", "{wire:?}: {set}");
        assert_end_turn(&agent, &agent.prompt(&sid, "Plainly now."));
        agent.finish();

        let reqs = llm.requests();
        let top = if wire == Wire::Anthropic {
            "max"
        } else {
            "high"
        };
        let efforts: Vec<Option<String>> = reqs.iter().map(sent_effort).collect();
        let want = |e: &str| Some(e.to_string());
        assert_eq!(
            efforts,
            [want("medium"), want("medium"), want(top), want(top), None],
            "{wire:?}"
        );
        // The tool round's reasoning goes back in the round after it, in the route's form.
        let second = &reqs[1].body;
        let replayed = match wire {
            Wire::Anthropic => reqs[1].messages()[1]["content"][0]["type"] == "thinking",
            Wire::Chat => reqs[1].messages()[1]["reasoning_content"] == "Echo first.",
            Wire::Responses => second["input"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|i| i["type"] == "reasoning"),
        };
        assert!(replayed, "{wire:?}: {second}");
    }
}

/// L12: a model (here behind a gateway) that refuses the form of Anthropic `thinking` the agent
/// chose for it gets the other form, once. `claude-sonnet-4-6` takes adaptive thinking, so the
/// first request carries `{"type":"adaptive"}`; the server answers 400 "adaptive thinking is
/// not supported on this model", and the same round goes again with a token budget, one WARN,
/// and every later request (the tool round, the next prompt) keeps the budget. A server that
/// then refuses the budget too is not answered by switching back: the prompt fails after two
/// requests, never a loop.
pub fn l12_a_refused_form_of_anthropic_thinking_is_switched_once_to_the_other(ctx: &Ctx) {
    const WARN: &str = "rejected this form of extended thinking";
    let refuse = |message: &str| {
        let body = json!({"type": "error",
            "error": {"type": "invalid_request_error", "message": message}});
        Reply::status(400, vec![], body.to_string()).uncounted()
    };
    let env = [
        ("ANTHROPIC_MODEL", "claude-sonnet-4-6"),
        ("BUZZ_AGENT_THINKING_EFFORT", "high"),
    ];
    // An agent on the Anthropic route at effort `high`, with one session open.
    let start = |s: &Scratch, llm: FakeLlm| {
        let tools = json!([fake_mcp_entry("fs", &[("FAKE_MCP_TOOLS", "echo")])]);
        let (llm, agent) = Setup::new(ctx, s)
            .llm(llm)
            .wire(Wire::Anthropic)
            .env(&env)
            .spawn();
        agent.initialize();
        let sid = agent.new_session(&s.ws, tools);
        (llm, agent, sid)
    };
    let kind = |r: &RecordedRequest| r.body["thinking"]["type"].as_str().map(str::to_string);

    // Adaptive refused: switched once to a budget, which is kept.
    let s = Scratch::new();
    // Signed thinking, as Anthropic streams it, so the tool round may think too.
    let signed = |reply: Reply, text: &str| {
        reply.with_thinking(text).with_style(Style {
            signature: Some(crate::dialects::signature(text)),
            ..Style::default()
        })
    };
    let replies = [
        signed(
            Reply::tool_calls(vec![("call_1", "fs__echo", json!({"text": "a"}))]),
            "Echo first.",
        ),
        signed(Reply::text("one"), "Now answer."),
        signed(Reply::text("two"), "Answer again."),
    ];
    let llm = ctx.fake_llm_with(move |i, req| {
        if req.body["thinking"]["type"] == "adaptive" {
            return refuse("adaptive thinking is not supported on this model");
        }
        replies
            .get(i)
            .cloned()
            .unwrap_or_else(|| Reply::text("extra"))
    });
    let (llm, agent, sid) = start(&s, llm);
    assert_end_turn(&agent, &agent.prompt(&sid, "Echo a."));
    assert_end_turn(&agent, &agent.prompt(&sid, "Again."));
    assert_eq!(super::util::count_lines(&agent, WARN), 1);
    agent.finish();
    let all = llm.all_requests();
    let kinds: Vec<Option<String>> = all.iter().map(kind).collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert_eq!(kinds[0].as_deref(), Some("adaptive"), "{kinds:?}");
    assert!(
        kinds[1..].iter().all(|k| k.as_deref() == Some("enabled")),
        "{kinds:?}"
    );
    for r in &all[1..] {
        let budget = r.body["thinking"]["budget_tokens"].as_u64().unwrap_or(0);
        let max = r.body["max_tokens"].as_u64().unwrap_or(0);
        assert!(budget >= 1024 && budget < max, "{}", r.body);
        assert!(r.body.get("output_config").is_none(), "{}", r.body);
    }

    // Both forms refused: one switch, then the prompt fails; no switch back.
    let s = Scratch::new();
    let llm = ctx.fake_llm_with(move |_, req| {
        if req.body["thinking"]["type"] == "adaptive" {
            refuse("adaptive thinking is not supported on this model")
        } else {
            refuse("\"thinking.type.enabled\" is not supported for this model. Use \"thinking.type.adaptive\" and \"output_config.effort\" to control thinking behavior.")
        }
    });
    let (llm, agent, sid) = start(&s, llm);
    let answer = agent.prompt(&sid, "Echo a.");
    assert!(
        answer.get("error").is_some() || answer["result"]["stopReason"] != "end_turn",
        "{answer}"
    );
    assert_eq!(super::util::count_lines(&agent, WARN), 1);
    agent.finish();
    let kinds: Vec<Option<String>> = llm.all_requests().iter().map(kind).collect();
    assert_eq!(
        kinds,
        [Some("adaptive".to_string()), Some("enabled".to_string())],
        "{kinds:?}"
    );
}
