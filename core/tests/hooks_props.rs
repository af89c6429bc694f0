//! Property tests of the hook invariants (DESIGN "Testing pyramid" layer 2, I1–I12) over random
//! scripts run in the deterministic simulation world (`support`): no async, no processes.
//!
//! The main property replays every step of a run (one `handle*` + the actions it produced)
//! through a small reference model of SPEC §4/§6 (turn phases, `_Stop` rounds, budget, reply
//! guard, per-server consecutive hook timeouts, pending MCP requests) and checks that the agent
//! produced exactly the turn events the model expects (LLM calls, prompt responses and their
//! `_meta`), the hook calls, kills, cancellations and log lines, and the shape of every LLM
//! request. The model is driven by what the world observably did (which replies came when), so
//! it does not duplicate the core's code paths.
//!
//! `PROPTEST_CASES` (default 1000) sets the number of cases of every property.

#![allow(clippy::disallowed_methods, reason = "reads PROPTEST_CASES")]
#![allow(
    clippy::wildcard_enum_match_arm,
    reason = "the model has no rule for the other variants"
)]
#![allow(
    clippy::collapsible_if,
    clippy::too_many_arguments,
    clippy::type_complexity
)]

mod support;

use buzz_agent_core::config::{HookAllowlist, PermissionMode};
use buzz_agent_core::fuzzing::invariants::Invariants;
use buzz_agent_core::{Action, Input, LlmCallId, LlmEvent, MonoTime, ProcKey, Signal};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use support::{HookKind, HookReply, LlmReply, ServerSpec, Step, StepInput, World, test_config};

/// Number of cases per property: `PROPTEST_CASES`, else 1000 (so CI runs at least 1000).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1000)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        max_shrink_iters: 4096,
        ..ProptestConfig::with_cases(cases())
    }
}

/// The reply guard's server name and reminder cap (SPEC G1).
const GUARD: &str = "buzz-agent";
const MAX_REMINDERS: u32 = 2;
/// Backoff between LLM attempts is capped at 8 s (SPEC L5).
const MAX_BACKOFF_MS: u64 = 8000;
/// SIGTERM → SIGKILL escalation of a killed group (SPEC M8).
const KILL_GRACE_MS: u64 = 2000;
const LLM_ATTEMPTS: u32 = 3;

// ====================================================================== generated scripts

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timing {
    Now,
    /// Half the hook timeout: in time.
    Soon,
    /// 1.5 × the hook timeout: after the deadline (a late reply, I6).
    Late,
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HookGen {
    Objection,
    Empty,
    RpcError,
    IsError,
    /// The server exits instead of answering.
    Exit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HookStep {
    kind: HookGen,
    timing: Timing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// `s<i>__echo` with valid arguments.
    Echo(usize),
    /// `s<i>__echo` with arguments that are not a JSON object.
    EchoBadArgs(usize),
    /// `s<i>__shell`; `true`: its command posts (`buzz messages send`, G2).
    Shell(usize, bool),
    /// A model call to a hook name, e.g. `s1___Stop` (I10).
    Hook(usize, &'static str),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LlmGen {
    Text(u64),
    Tools(Vec<Target>, u64),
    /// `n` HTTP 500 answers in a row (3 fail the prompt, L5).
    Status500(usize, u64),
    /// Truncated (`length`): no gate, a nudge while recoveries remain (L1).
    Length(u64),
    /// `content_filter`: `refusal`, no hooks (L1, H5).
    Refusal(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Prompt,
    /// A prompt naming an unknown session (`-32002`).
    PromptUnknown,
    Cancel,
    /// `session/cancel` sent as a request (answered `null`, A4).
    CancelRequest,
    Advance(u64),
    Exit(usize),
}

#[derive(Clone, Debug)]
struct SrvGen {
    allowed: bool,
    stop: bool,
    post_compact: bool,
    other: bool,
    tool_delay: u64,
    hooks: Vec<HookStep>,
    /// The answer once `hooks` is used up.
    default: HookStep,
    /// `_SessionStart` exposed, with its (fixed) answer (SPEC H10).
    session_start: Option<HookStep>,
    /// `_SessionEnd` exposed, with its (fixed) answer (SPEC H11).
    session_end: Option<HookStep>,
}

#[derive(Clone, Debug)]
struct Case {
    budget: u32,
    /// `BUZZ_AGENT_MAX_ROUNDS` (0 = unlimited).
    max_rounds: u32,
    /// `BUZZ_AGENT_MAX_CONTEXT_TOKENS` (small values make K1 compact) and `MAX_HANDOFFS`.
    max_context: u64,
    max_handoffs: u32,
    timeout_ms: u64,
    require_reply: bool,
    /// `BUZZ_AGENT_REPLY_TOOLS=s1__echo` (G2).
    reply_tool: bool,
    ask: bool,
    perm_delay: u64,
    /// `MCP_HOOK_SERVERS=*` when every server is allowed (else the names).
    star: bool,
    servers: Vec<SrvGen>,
    llm: Vec<LlmGen>,
    acts: Vec<Act>,
}

fn name(i: usize) -> String {
    format!("s{}", i + 1)
}

fn objection_text(server: usize, k: usize) -> String {
    // Quotes, braces and a newline: the injection must carry it verbatim, JSON-encoded (H6).
    format!("{} objection {k}: \"fix\" the tests\n}}", name(server))
}

fn timing() -> impl Strategy<Value = Timing> {
    prop_oneof![4 => Just(Timing::Now), 2 => Just(Timing::Soon), 2 => Just(Timing::Late), 2 => Just(Timing::Never)]
}

fn hook_step() -> impl Strategy<Value = HookStep> {
    let kind = prop_oneof![
        5 => Just(HookGen::Objection),
        2 => Just(HookGen::Empty),
        1 => Just(HookGen::RpcError),
        1 => Just(HookGen::IsError),
        1 => Just(HookGen::Exit),
    ];
    (kind, timing()).prop_map(|(kind, timing)| HookStep { kind, timing })
}

fn server() -> impl Strategy<Value = SrvGen> {
    (
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.85),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0u64), Just(50), Just(400)],
        prop::collection::vec(hook_step(), 0..7),
        prop_oneof![
            3 => Just(HookStep { kind: HookGen::Empty, timing: Timing::Now }),
            1 => Just(HookStep { kind: HookGen::Objection, timing: Timing::Now }),
            1 => Just(HookStep { kind: HookGen::Empty, timing: Timing::Never }),
            1 => Just(HookStep { kind: HookGen::Empty, timing: Timing::Late }),
        ],
        prop::option::weighted(0.4, hook_step()),
        prop::option::weighted(0.4, hook_step()),
    )
        .prop_map(
            |(
                allowed,
                stop,
                post_compact,
                other,
                tool_delay,
                hooks,
                default,
                session_start,
                session_end,
            )| SrvGen {
                allowed,
                stop,
                post_compact,
                other,
                tool_delay,
                hooks,
                default,
                session_start,
                session_end,
            },
        )
}

fn target(n: usize) -> impl Strategy<Value = Target> {
    prop_oneof![
        5 => (0..n).prop_map(Target::Echo),
        1 => (0..n).prop_map(Target::EchoBadArgs),
        2 => (0..n, any::<bool>()).prop_map(|(i, p)| Target::Shell(i, p)),
        2 => (0..n, prop_oneof![Just("_Stop"), Just("_PostCompact"), Just("_Other")]).prop_map(|(i, h)| Target::Hook(i, h)),
        1 => Just(Target::Unknown),
    ]
}

fn llm_delay() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(0u64), 1 => Just(50), 1 => Just(400)]
}

fn llm_gen(n: usize) -> impl Strategy<Value = LlmGen> {
    prop_oneof![
        5 => llm_delay().prop_map(LlmGen::Text),
        3 => (prop::collection::vec(target(n), 1..4), llm_delay()).prop_map(|(t, d)| LlmGen::Tools(t, d)),
        1 => (1usize..4, llm_delay()).prop_map(|(n, d)| LlmGen::Status500(n, d)),
        1 => llm_delay().prop_map(LlmGen::Length),
        1 => llm_delay().prop_map(LlmGen::Refusal),
    ]
}

fn act(n: usize) -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => Just(Act::Prompt),
        1 => Just(Act::PromptUnknown),
        2 => Just(Act::Cancel),
        1 => Just(Act::CancelRequest),
        8 => prop_oneof![Just(0u64), Just(30), Just(120), Just(400), Just(1500), Just(5000)].prop_map(Act::Advance),
        2 => (0..n).prop_map(Act::Exit),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(server(), 1..4).prop_flat_map(|servers| {
        let n = servers.len();
        (
            (
                0u32..4,
                prop_oneof![3 => Just(0u32), 1 => 1u32..6],
                prop_oneof![3 => Just(200_000u64), 2 => 250u64..800, 1 => 800u64..3000],
                prop_oneof![3 => Just(10u32), 1 => Just(1)],
            ),
            prop_oneof![Just(100u64), Just(300)],
            any::<bool>(),
            prop::bool::weighted(0.3),
            any::<bool>(),
            prop_oneof![Just(0u64), Just(40)],
            any::<bool>(),
            Just(servers),
            prop::collection::vec(llm_gen(n), 0..9),
            prop::collection::vec(act(n), 1..12),
        )
            .prop_map(
                |(
                    (budget, max_rounds, max_context, max_handoffs),
                    timeout_ms,
                    require_reply,
                    reply_tool,
                    ask,
                    perm_delay,
                    star,
                    servers,
                    llm,
                    acts,
                )| Case {
                    budget,
                    max_rounds,
                    max_context,
                    max_handoffs,
                    timeout_ms,
                    require_reply,
                    reply_tool,
                    ask,
                    perm_delay,
                    star,
                    servers,
                    llm,
                    acts,
                },
            )
    })
}

fn build(case: &Case) -> World {
    build_with(case, test_config())
}

/// [`build`] on the configuration `cfg` (e.g. with a state directory, SPEC A9).
fn build_with(case: &Case, mut cfg: buzz_agent_core::Config) -> World {
    cfg.stop_max_rejections = case.budget;
    cfg.max_rounds = case.max_rounds;
    cfg.max_context_tokens = case.max_context;
    cfg.max_output_tokens = 100;
    cfg.max_handoffs = case.max_handoffs;
    cfg.hook_timeout_ms = case.timeout_ms;
    cfg.require_reply = case.require_reply;
    cfg.reply_tools = if case.reply_tool {
        vec!["s1__echo".to_string()]
    } else {
        Vec::new()
    };
    cfg.permission = if case.ask {
        PermissionMode::Ask
    } else {
        PermissionMode::Allow
    };
    let allowed: Vec<String> = (0..case.servers.len())
        .filter(|&i| case.servers[i].allowed)
        .map(name)
        .collect();
    cfg.hook_servers = if allowed.is_empty() {
        HookAllowlist::Off
    } else if case.star && allowed.len() == case.servers.len() {
        HookAllowlist::All
    } else {
        HookAllowlist::Names(allowed)
    };
    let t = case.timeout_ms;
    let specs = case
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut hooks = Vec::new();
            if s.stop {
                hooks.push("_Stop");
            }
            if s.post_compact {
                hooks.push("_PostCompact");
            }
            if s.other {
                hooks.push("_Other");
            }
            if s.session_start.is_some() {
                hooks.push("_SessionStart");
            }
            if s.session_end.is_some() {
                hooks.push("_SessionEnd");
            }
            let reply = |k: usize, h: &HookStep| {
                let delay = match h.timing {
                    Timing::Now | Timing::Never => 0,
                    Timing::Soon => t / 2,
                    Timing::Late => t + t / 2,
                };
                let kind = match (h.timing, h.kind) {
                    (Timing::Never, _) => HookKind::Never,
                    (_, HookGen::Objection) => HookKind::Text(objection_text(i, k)),
                    (_, HookGen::Empty) => HookKind::Empty,
                    (_, HookGen::RpcError) => HookKind::RpcError,
                    (_, HookGen::IsError) => HookKind::IsError,
                    (_, HookGen::Exit) => HookKind::Exit,
                };
                HookReply::after(kind, delay)
            };
            let script = s.hooks.iter().enumerate().map(|(k, h)| reply(k, h));
            let default = reply(s.hooks.len(), &s.default);
            let mut spec = ServerSpec::new(&name(i), &hooks)
                .script(script)
                .default_reply(default);
            // The session points answer from their own fixed reply (texts numbered 100, 200).
            for (hook, step, k) in [
                ("_SessionStart", s.session_start, 100),
                ("_SessionEnd", s.session_end, 200),
            ] {
                if let Some(h) = step {
                    spec = spec.hook_reply(hook, reply(k, &h));
                }
            }
            spec.tools.push("shell".to_string());
            spec.tool_delay_ms = s.tool_delay;
            spec
        })
        .collect();
    let mut w = World::new(cfg, specs);
    w.permission_delay_ms = Some(case.perm_delay);
    let llm: Vec<LlmReply> = case
        .llm
        .iter()
        .flat_map(|g| match g {
            LlmGen::Text(d) => vec![LlmReply::Text {
                text: "Done.".into(),
                delay_ms: *d,
            }],
            LlmGen::Status500(n, d) => vec![
                LlmReply::Status {
                    status: 500,
                    delay_ms: *d
                };
                *n
            ],
            LlmGen::Length(d) => vec![LlmReply::Finish {
                text: "Cut".into(),
                finish: "length".into(),
                delay_ms: *d,
            }],
            LlmGen::Refusal(d) => vec![LlmReply::Finish {
                text: "No".into(),
                finish: "content_filter".into(),
                delay_ms: *d,
            }],
            LlmGen::Tools(targets, d) => vec![LlmReply::Tools {
                calls: targets
                    .iter()
                    .map(|t| match t {
                        Target::Echo(i) => (
                            format!("{}__echo", name(*i)),
                            r#"{"text":"hi"}"#.to_string(),
                        ),
                        Target::EchoBadArgs(i) => {
                            (format!("{}__echo", name(*i)), "[1,2]".to_string())
                        }
                        Target::Hook(i, h) => (format!("{}__{h}", name(*i)), "{}".to_string()),
                        Target::Shell(i, true) => (
                            format!("{}__shell", name(*i)),
                            r#"{"command":"buzz messages send hi"}"#.to_string(),
                        ),
                        Target::Shell(i, false) => (
                            format!("{}__shell", name(*i)),
                            r#"{"command":"ls"}"#.to_string(),
                        ),
                        Target::Unknown => ("nosuch__tool".to_string(), "{}".to_string()),
                    })
                    .collect(),
                delay_ms: *d,
            }],
        })
        .collect();
    w.llm(llm);
    w
}

fn run(case: &Case) -> World {
    run_world(case, build(case), false)
}

/// Runs `case` in `w` (built from it); `settle`: every act waits until the agent is idle (a
/// prompt then runs to its end before the next act).
fn run_world(case: &Case, mut w: World, settle: bool) -> World {
    w.start();
    for a in &case.acts {
        if settle {
            w.run_idle();
        }
        match a {
            Act::Prompt => {
                w.prompt("do the task");
            }
            Act::PromptUnknown => {
                w.request(
                    "session/prompt",
                    json!({"sessionId": "sess_404", "prompt": [{"type": "text", "text": "x"}]}),
                );
            }
            Act::Cancel => w.cancel(),
            Act::CancelRequest => {
                let sid = w.session.clone().unwrap_or_default();
                w.request("session/cancel", json!({"sessionId": sid}));
            }
            Act::Advance(ms) => w.advance(*ms),
            Act::Exit(i) => w.exit_server(&name(*i), "exit status 3"),
        }
    }
    w.run_idle();
    w
}

// ====================================================================== the reference model

#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Objection(String),
    Empty,
    Error,
    Timeout,
    Dead,
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Objection(_) => "objection",
            Outcome::Empty => "empty",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Dead => "dead",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pend {
    Hook {
        deadline: MonoTime,
    },
    Tool,
    /// `tools/list`: its reply makes a (re)started server ready.
    List,
    Other,
}

#[derive(Debug)]
struct SrvM {
    name: String,
    allowed: bool,
    stop: bool,
    post_compact: bool,
    session_start: bool,
    session_end: bool,
    proc: Option<ProcKey>,
    ready: bool,
    dead: bool,
    /// Consecutive hook timeouts (H4, I5).
    timeouts: u32,
    /// Requests the agent sent and still waits for.
    pending: BTreeMap<u64, Pend>,
}

#[derive(Debug)]
struct CallM {
    srv: usize,
    req: Option<u64>,
    outcome: Option<Outcome>,
}

/// A hook round (H3): `_Stop` (H5) or `_PostCompact` (H7) of a turn, or the session's
/// `_SessionStart` (H10).
#[derive(Debug)]
struct RoundM {
    point: &'static str,
    start: MonoTime,
    deadline: MonoTime,
    calls: Vec<CallM>,
    reminder: bool,
    /// `_meta.buzz/hook` the calls must carry.
    meta: Value,
}

#[derive(Debug)]
enum PhaseM {
    /// An LLM call must come in this very step.
    Await,
    /// `summary`: a compaction summary call (K1), recognised by its system prompt.
    Llm {
        call: LlmCallId,
        attempt: u32,
        summary: bool,
    },
    Backoff {
        attempt: u32,
        since: MonoTime,
        summary: bool,
    },
    /// Announced tool calls without a terminal update, routed `echo`/`shell` calls not yet
    /// dispatched (server index, posting attempt per G2).
    Tools {
        pending: BTreeSet<String>,
        dispatch: Vec<(usize, &'static str, bool)>,
    },
    Gate(RoundM),
}

#[derive(Debug)]
struct TurnM {
    rpc: u64,
    objections: u32,
    reminders: u32,
    posted: bool,
    cancelled: bool,
    exhausted: bool,
    rounds: u32,
    recoveries: u32,
    handoffs: u32,
    phase: PhaseM,
    /// L13: what the history held when the turn started — `_Stop` and `_SessionStart`
    /// injection pairs, and the `_SessionStart` texts the turn took — which a refusal (the
    /// turn leaves the history) brings back; `None` once a compaction rewrote the history in
    /// this turn.
    at_start: Option<(Option<usize>, Option<usize>, Vec<(String, String)>)>,
}

/// What the next round's request must carry right after a hook round.
#[derive(Debug, Clone, PartialEq)]
enum Inject {
    None,
    /// `_Stop` texts (server, text) at the tail (H6, G1).
    Stop(Vec<(String, String)>),
    /// `_PostCompact` texts right after the summary (H7).
    PostCompact(Vec<(String, String)>),
    /// `_SessionStart` texts right after the session's first prompt (H10).
    SessionStart(Vec<(String, String)>),
}

/// The session's `_SessionStart` point (H10).
#[derive(Debug)]
enum OpeningM {
    /// The servers are not all ready yet.
    NotYet,
    /// The round runs; `session/new` is answered when it is decided.
    Running(RoundM),
    /// `session/new` was answered.
    Done,
}

/// A turn-level event the agent must produce, in order within a step.
#[derive(Debug, Clone, PartialEq)]
enum Te {
    /// `attempt` 1 = a new round (or a compaction summary in its place, K1).
    LlmCall {
        attempt: u32,
        summary: Option<bool>,
        inject: Inject,
    },
    Response {
        id: u64,
        stop: &'static str,
        meta: Value,
    },
    Error {
        id: u64,
        code: i64,
    },
}

struct Checker<'a> {
    case: &'a Case,
    srv: Vec<SrvM>,
    turn: Option<TurnM>,
    queued: Option<u64>,
    /// Our requests: id → method.
    requests: BTreeMap<u64, String>,
    responses: BTreeMap<u64, u32>,
    /// Prompt ids that became turns (queued included).
    turn_rpcs: BTreeSet<u64>,
    /// `_Stop` injection pairs the next round request must hold (I1, H6); `None` after a
    /// truncation dropped an unknown number of them (re-synchronised at the next request).
    stop_injections: Option<usize>,
    terminal_seen: BTreeSet<String>,
    session: String,
    /// When each process group got SIGTERM, and which got SIGKILL (M8).
    terms: BTreeMap<ProcKey, MonoTime>,
    kills: BTreeSet<ProcKey>,
    opening: OpeningM,
    /// The decided `_SessionStart` texts, until the first prompt takes them (H10).
    start_texts: Vec<(String, String)>,
    /// Prompts that became turns.
    prompts_started: u32,
    /// `_SessionStart` injection pairs every request must hold (H10: none before the first
    /// prompt's first request, then exactly those; `None` after a truncation).
    session_pairs: Option<usize>,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Parsed actions of one step.
#[derive(Default)]
struct Obs {
    mcp: Vec<(usize, Value)>,
    released: BTreeSet<LlmCallId>,
    signals: Vec<(usize, ProcKey, Signal)>,
    logs: Vec<String>,
    /// `tool_call` announcements: (toolCallId, title).
    announced: Vec<(String, String)>,
}

fn parse_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or(Value::Null)
}

fn hook_outcome_of(reply: &Value) -> Outcome {
    if reply.get("error").is_some() {
        return Outcome::Error;
    }
    let r = &reply["result"];
    if r["isError"].as_bool() == Some(true) {
        return Outcome::Error;
    }
    let text: Vec<&str> = r["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect();
    let text = text.join("\n");
    if text.trim().is_empty() {
        Outcome::Empty
    } else {
        Outcome::Objection(text)
    }
}

/// A compaction summary request (K1): its system prompt is the summariser's.
fn is_summary_request(body: &Value) -> bool {
    body["messages"][0]["role"] == "system"
        && body["messages"][0]["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("You compact the working context"))
}

impl<'a> Checker<'a> {
    fn new(case: &'a Case) -> Self {
        let srv = case
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| SrvM {
                name: name(i),
                allowed: s.allowed,
                stop: s.stop,
                post_compact: s.post_compact,
                session_start: s.session_start.is_some(),
                session_end: s.session_end.is_some(),
                proc: None,
                ready: false,
                dead: false,
                timeouts: 0,
                pending: BTreeMap::new(),
            })
            .collect();
        Checker {
            case,
            srv,
            turn: None,
            queued: None,
            requests: BTreeMap::new(),
            responses: BTreeMap::new(),
            turn_rpcs: BTreeSet::new(),
            stop_injections: Some(0),
            terminal_seen: BTreeSet::new(),
            session: String::new(),
            terms: BTreeMap::new(),
            kills: BTreeSet::new(),
            opening: OpeningM::NotYet,
            start_texts: Vec::new(),
            prompts_started: 0,
            session_pairs: Some(0),
        }
    }

    /// The undecided round a hook call of `point` belongs to: the opening's, or the turn's.
    fn round_mut(&mut self, point: &str) -> Option<&mut RoundM> {
        if point == "_SessionStart" {
            return match &mut self.opening {
                OpeningM::Running(r) => Some(r),
                OpeningM::NotYet | OpeningM::Done => None,
            };
        }
        match &mut self.turn {
            Some(TurnM {
                phase: PhaseM::Gate(r),
                ..
            }) => Some(r),
            _ => None,
        }
    }

    fn srv_of(&self, proc: ProcKey) -> Option<usize> {
        self.srv
            .iter()
            .position(|s| s.proc.is_some_and(|p| p.server == proc.server))
    }

    fn meta(&self, t: &TurnM) -> Value {
        json!({"buzz": {"rounds": t.rounds, "stopObjections": t.objections, "stopBudget": self.case.budget,
            "stopBudgetExhausted": t.exhausted}})
    }

    fn start_turn(&mut self, id: u64, exp: &mut Vec<Te>) {
        self.turn_rpcs.insert(id);
        self.prompts_started += 1;
        // H10: the session's first prompt carries the _SessionStart texts in its first request.
        // L13: a refused first prompt gives them back to the next one.
        let took = std::mem::take(&mut self.start_texts);
        let inject = if took.is_empty() {
            Inject::None
        } else {
            Inject::SessionStart(took.clone())
        };
        let at_start = Some((self.stop_injections, self.session_pairs, took));
        self.turn = Some(TurnM {
            rpc: id,
            objections: 0,
            reminders: 0,
            posted: false,
            cancelled: false,
            exhausted: false,
            rounds: 0,
            recoveries: 0,
            handoffs: 0,
            phase: PhaseM::Await,
            at_start,
        });
        exp.push(Te::LlmCall {
            attempt: 1,
            summary: None,
            inject,
        });
    }

    /// The next round of the running turn (L1): `max_turn_requests` at the cap, else an LLM
    /// call (which may be a compaction summary unless one just ran, K1).
    fn next_round(&mut self, inject: Inject, exp: &mut Vec<Te>) {
        let max = self.case.max_rounds;
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.cancelled {
            return self.end_turn("cancelled", exp);
        }
        if max > 0 && turn.rounds >= max {
            return self.end_turn("max_turn_requests", exp);
        }
        turn.phase = PhaseM::Await;
        let summary = matches!(inject, Inject::PostCompact(_)).then_some(false);
        exp.push(Te::LlmCall {
            attempt: 1,
            summary,
            inject,
        });
    }

    /// A compaction rewrote the history (K1): the injection counts are known again only as
    /// 0 after a summary (`summary`), else at the next request; and what the running turn
    /// started with is no longer what a refusal would bring back (L13).
    fn history_rewritten(&mut self, summary: bool) {
        let count = summary.then_some(0);
        self.stop_injections = count;
        self.session_pairs = count;
        if let Some(t) = self.turn.as_mut() {
            t.at_start = None;
        }
    }

    fn end_turn(&mut self, stop: &'static str, exp: &mut Vec<Te>) {
        if let Some(t) = self.turn.take() {
            let meta = self.meta(&t);
            exp.push(Te::Response {
                id: t.rpc,
                stop,
                meta,
            });
        }
        if let Some(q) = self.queued.take() {
            self.start_turn(q, exp);
        }
    }

    fn fail_turn(&mut self, exp: &mut Vec<Te>) {
        if let Some(t) = self.turn.take() {
            exp.push(Te::Error {
                id: t.rpc,
                code: -32000,
            });
        }
        if let Some(q) = self.queued.take() {
            self.start_turn(q, exp);
        }
    }

    fn set_outcome(&mut self, s: usize, req: u64, outcome: Outcome, exp_logs: &mut Vec<String>) {
        let name = self.srv[s].name.clone();
        let in_opening = matches!(&self.opening, OpeningM::Running(r)
            if r.calls.iter().any(|c| c.srv == s && c.req == Some(req)));
        let point = if in_opening { "_SessionStart" } else { "_Stop" };
        let Some(r) = self.round_mut(point) else {
            return;
        };
        if let Some(c) = r
            .calls
            .iter_mut()
            .find(|c| c.srv == s && c.req == Some(req) && c.outcome.is_none())
        {
            exp_logs.push(format!(
                "hook: point={} server={name} outcome={}",
                r.point,
                outcome.label()
            ));
            c.outcome = Some(outcome);
        }
    }

    /// The server is dead now (exit observed or killed): its pending hook calls are `dead`.
    fn mark_dead(&mut self, s: usize, exp_logs: &mut Vec<String>) {
        self.srv[s].dead = true;
        let pending = std::mem::take(&mut self.srv[s].pending);
        for (id, p) in pending {
            if matches!(p, Pend::Hook { .. }) {
                self.set_outcome(s, id, Outcome::Dead, exp_logs);
            }
        }
    }

    /// Start a hook round over the allowlisted servers exposing `point` (H2, H3).
    fn start_round(
        &mut self,
        point: &'static str,
        t: MonoTime,
        reminder: bool,
        meta: Value,
        exp_logs: &mut Vec<String>,
    ) {
        let mut calls = Vec::new();
        for (i, s) in self.srv.iter().enumerate() {
            let has = match point {
                "_Stop" => s.stop,
                "_PostCompact" => s.post_compact,
                "_SessionStart" => s.session_start,
                _ => s.session_end,
            };
            if !(s.allowed && has) {
                continue;
            }
            if s.ready && !s.dead {
                calls.push(CallM {
                    srv: i,
                    req: None,
                    outcome: None,
                });
            } else {
                exp_logs.push(format!(
                    "hook: point={point} server={} outcome=dead",
                    s.name
                ));
                calls.push(CallM {
                    srv: i,
                    req: None,
                    outcome: Some(Outcome::Dead),
                });
            }
        }
        let round = RoundM {
            point,
            start: t,
            deadline: t.plus_ms(self.case.timeout_ms),
            calls,
            reminder,
            meta,
        };
        if point == "_SessionStart" {
            self.opening = OpeningM::Running(round);
        } else if let Some(turn) = self.turn.as_mut() {
            turn.phase = PhaseM::Gate(round);
        }
    }

    /// H5: the gate after a text-only end-turn response. Returns whether a round started.
    fn gate(&mut self, t: MonoTime, exp: &mut Vec<Te>, exp_logs: &mut Vec<String>) -> bool {
        let budget = self.case.budget;
        let Some(turn) = self.turn.as_mut() else {
            return false;
        };
        if budget == 0 {
            self.end_turn("end_turn", exp);
            return false;
        }
        if turn.objections >= budget {
            turn.exhausted = true;
            self.end_turn("end_turn", exp);
            return false;
        }
        let reminder = self.case.require_reply && !turn.posted && turn.reminders < MAX_REMINDERS;
        let meta = json!({"point": "_Stop", "sessionId": self.session, "attempt": turn.objections + 1,
            "budgetRemaining": budget - turn.objections});
        self.start_round("_Stop", t, reminder, meta, exp_logs);
        true
    }

    /// Decide the round when every call has an outcome (H3, H5, H7, G1).
    fn maybe_conclude(&mut self, exp: &mut Vec<Te>) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let PhaseM::Gate(r) = &turn.phase else { return };
        if r.calls.iter().any(|c| c.outcome.is_none()) {
            return;
        }
        let mut texts: Vec<(String, String)> = r
            .calls
            .iter()
            .filter_map(|c| match &c.outcome {
                Some(Outcome::Objection(t)) => Some((name(c.srv), t.clone())),
                Some(_) | None => None,
            })
            .collect();
        if r.point == "_PostCompact" {
            // H7: injected after the summary; no budget; then the round goes on.
            return self.next_round(Inject::PostCompact(texts), exp);
        }
        let reminder = r.reminder;
        if reminder {
            texts.push((GUARD.to_string(), String::new())); // reminder text checked by server only
        }
        if turn.cancelled {
            return self.end_turn("cancelled", exp);
        }
        if texts.is_empty() {
            return self.end_turn("end_turn", exp);
        }
        turn.objections += 1;
        if reminder {
            turn.reminders += 1;
        }
        if let Some(n) = self.stop_injections.as_mut() {
            *n += texts.len();
        }
        self.next_round(Inject::Stop(texts), exp);
    }

    fn check(&mut self, w: &World) -> Result<(), String> {
        for (i, st) in w.steps.iter().enumerate() {
            self.step(w, st)
                .map_err(|e| format!("step {i} at {}: {e}", st.t))?;
        }
        // I7: every request got exactly one response; the turn and the queue are done.
        ensure!(
            self.turn.is_none(),
            "a turn is still running after the world went idle: {:?}",
            self.turn
        );
        ensure!(self.queued.is_none(), "a queued prompt never ran");
        for (id, m) in &self.requests {
            let n = self.responses.get(id).copied().unwrap_or(0);
            ensure!(n == 1, "I7: request {id} ({m}) got {n} responses");
        }
        Ok(())
    }

    fn on_cancel(&mut self, exp: &mut Vec<Te>, fx: &mut Effects) -> Result<(), String> {
        let Some(turn) = self.turn.as_mut().filter(|t| !t.cancelled) else {
            return Ok(());
        };
        turn.cancelled = true;
        match &turn.phase {
            PhaseM::Llm { call, .. } => {
                fx.release = Some(*call);
                self.end_turn("cancelled", exp);
            }
            PhaseM::Backoff { .. } => self.end_turn("cancelled", exp),
            PhaseM::Tools { pending, .. } => {
                fx.closing_tools = Some(pending.clone());
                // A4: in-flight MCP tool calls get notifications/cancelled.
                for (i, s) in self.srv.iter().enumerate() {
                    for (id, p) in &s.pending {
                        if *p == Pend::Tool {
                            fx.cancel_notif.push((i, *id));
                        }
                    }
                }
                self.end_turn("cancelled", exp);
            }
            PhaseM::Gate(_) => {} // hooks are not cancelled (A4)
            PhaseM::Await => return Err("model: cancel while awaiting an LLM call".into()),
        }
        Ok(())
    }

    /// The LLM call `call` delivered `event` while the turn waits for it.
    fn on_llm(
        &mut self,
        w: &World,
        t: MonoTime,
        call: LlmCallId,
        event: &LlmEvent,
        obs: &Obs,
        exp: &mut Vec<Te>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let (attempt, summary) = match &self.turn {
            Some(TurnM {
                phase:
                    PhaseM::Llm {
                        call: c,
                        attempt,
                        summary,
                    },
                ..
            }) if *c == call => (*attempt, *summary),
            _ => return Ok(()),
        };
        let reply = w
            .llm_replies
            .get(&call)
            .cloned()
            .ok_or("no scripted reply")?;
        let body = matches!(event, LlmEvent::Body(_));
        let end = matches!(event, LlmEvent::End);
        if let (LlmReply::Status { .. }, true) = (&reply, end) {
            if attempt < LLM_ATTEMPTS {
                if let Some(turn) = self.turn.as_mut() {
                    turn.phase = PhaseM::Backoff {
                        attempt: attempt + 1,
                        since: t,
                        summary,
                    };
                }
            } else if summary {
                // K1: a failed summary falls back to truncation, and the round goes on.
                self.history_rewritten(false);
                self.next_round(Inject::None, exp);
            } else {
                self.fail_turn(exp);
            }
            return Ok(());
        }
        if !body || matches!(reply, LlmReply::Status { .. }) {
            return Ok(()); // an error body is only read at its end
        }
        if summary {
            ensure!(
                obs.announced.is_empty(),
                "K1/A6: a summary call announced tool calls"
            );
            match &reply {
                LlmReply::Text { .. } | LlmReply::Finish { .. } => {
                    // K1/H7: new history = [summary, _PostCompact injections, live prompt].
                    let turn = self.turn.as_mut().ok_or("turn")?;
                    turn.handoffs += 1;
                    let meta = json!({"point": "_PostCompact", "sessionId": self.session, "attempt": turn.handoffs,
                        "budgetRemaining": 0});
                    self.history_rewritten(true);
                    self.start_round("_PostCompact", t, false, meta, &mut fx.logs);
                    fx.round_started = Some("_PostCompact");
                }
                LlmReply::Tools { .. }
                | LlmReply::Status { .. }
                | LlmReply::Raw { .. }
                | LlmReply::Stream { .. }
                | LlmReply::Never => {
                    // No summary text: truncation fallback (the model scripts no Raw or
                    // Stream replies).
                    self.history_rewritten(false);
                    self.next_round(Inject::None, exp);
                }
            }
            return Ok(());
        }
        match &reply {
            LlmReply::Text { .. } => {
                if self.gate(t, exp, &mut fx.logs) {
                    fx.round_started = Some("_Stop");
                }
            }
            LlmReply::Finish { finish, .. } if finish == "length" => {
                let turn = self.turn.as_mut().ok_or("turn")?;
                if turn.recoveries < 3 {
                    turn.recoveries += 1;
                    self.next_round(Inject::None, exp);
                } else {
                    self.end_turn("max_tokens", exp);
                }
            }
            LlmReply::Finish { .. } => {
                // L13, C77: the refused turn leaves the history; what it took comes back.
                let at_start = self.turn.as_mut().and_then(|t| t.at_start.take());
                match at_start {
                    Some((injections, pairs, took)) => {
                        self.stop_injections = injections;
                        self.session_pairs = pairs;
                        self.start_texts = took;
                    }
                    None => {
                        self.stop_injections = None;
                        self.session_pairs = None;
                    }
                }
                self.end_turn("refusal", exp);
            }
            LlmReply::Tools { calls, .. } => {
                let titles: Vec<&str> = obs.announced.iter().map(|a| a.1.as_str()).collect();
                // C53: an offered tool's title is `<server>: <tool>` (the world's tools have
                // no title); any other name is shown as the model wrote it.
                let names: Vec<String> = calls
                    .iter()
                    .map(|c| match c.0.split_once("__") {
                        Some((server, bare @ ("echo" | "shell")))
                            if self.srv.iter().any(|s| s.name == server) =>
                        {
                            format!("{server}: {bare}")
                        }
                        _ => c.0.clone(),
                    })
                    .collect();
                ensure!(
                    titles == names,
                    "A6/L2: tool calls announced {titles:?}, the model asked for {names:?}"
                );
                let pending: BTreeSet<String> = obs.announced.iter().map(|a| a.0.clone()).collect();
                ensure!(
                    pending.len() == names.len(),
                    "A6: toolCallIds are not unique"
                );
                let mut dispatch = Vec::new();
                for (n, args) in calls {
                    let Some((server, bare)) = n.split_once("__") else {
                        continue;
                    };
                    let Some(i) = self.srv.iter().position(|s| s.name == server) else {
                        continue;
                    };
                    let Ok(Value::Object(a)) = serde_json::from_str::<Value>(args) else {
                        continue;
                    };
                    let bare = match bare {
                        "echo" => "echo",
                        "shell" => "shell",
                        _ => continue,
                    };
                    // G2: `shell` with `messages send`/`reactions add`, or a BUZZ_AGENT_REPLY_TOOLS name.
                    let cmd = a.get("command").and_then(Value::as_str).unwrap_or("");
                    let posting = (bare == "shell"
                        && (cmd.contains("messages send") || cmd.contains("reactions add")))
                        || (self.case.reply_tool && n == "s1__echo");
                    dispatch.push((i, bare, posting));
                }
                if let Some(turn) = self.turn.as_mut() {
                    turn.phase = PhaseM::Tools { pending, dispatch };
                }
            }
            LlmReply::Status { .. }
            | LlmReply::Raw { .. }
            | LlmReply::Stream { .. }
            | LlmReply::Never => {}
        }
        Ok(())
    }

    #[allow(clippy::too_many_lines)]
    fn step(&mut self, w: &World, st: &Step) -> Result<(), String> {
        let t = st.t;
        let timeout = self.case.timeout_ms;
        // I3: a round started at s is decided by s + hook timeout.
        if let Some(TurnM {
            phase: PhaseM::Gate(r),
            ..
        }) = &self.turn
        {
            ensure!(
                t <= r.deadline,
                "I3: the {} round started at {} is still undecided at {t}",
                r.point,
                r.start
            );
        }
        if let OpeningM::Running(r) = &self.opening {
            ensure!(
                t <= r.deadline,
                "I3/H10: the _SessionStart round started at {} is still undecided at {t}",
                r.start
            );
        }
        // ---- parse the actions
        let mut obs = Obs::default();
        for a in &st.actions {
            match a {
                Action::SpawnMcp { proc, spec } => {
                    if let Some(s) = self.srv.iter_mut().find(|s| s.name == spec.name) {
                        s.proc = Some(*proc);
                        if proc.generation > 0 {
                            // M9 lazy restart: not ready until its tools are listed again.
                            ensure!(s.dead, "M9: {} respawned while alive", s.name);
                            s.dead = false;
                            s.ready = false;
                            s.pending.clear();
                        }
                    }
                }
                Action::WriteMcp { proc, line } => {
                    let s = self.srv_of(*proc).ok_or("write to an unknown proc")?;
                    obs.mcp.push((s, parse_line(line)));
                }
                Action::CancelLlm { call } => {
                    obs.released.insert(*call);
                }
                Action::SignalProcessGroup { proc, signal } => {
                    let s = self.srv_of(*proc).ok_or("signal to an unknown proc")?;
                    obs.signals.push((s, *proc, *signal));
                }
                Action::Log(r) => obs.logs.push(r.message.clone()),
                Action::WriteAcp(line) => {
                    let v = parse_line(line);
                    if v["method"] == "session/update"
                        && v["params"]["update"]["sessionUpdate"] == "tool_call"
                    {
                        let u = &v["params"]["update"];
                        obs.announced.push((
                            u["toolCallId"].as_str().unwrap_or("").into(),
                            u["title"].as_str().unwrap_or("").into(),
                        ));
                    }
                }
                Action::CallLlm { .. }
                | Action::CloseMcpStdin { .. }
                | Action::Http { .. }
                | Action::CancelHttp { .. }
                | Action::OpenTranscript { .. }
                | Action::ReadTranscript { .. }
                | Action::AppendTranscript { .. }
                | Action::SyncTranscript { .. }
                | Action::TruncateTranscript { .. }
                | Action::CloseTranscript { .. }
                | Action::ListTranscripts { .. }
                | Action::ReadProject { .. }
                | Action::OAuth(_)
                | Action::Exit { .. } => {}
            }
        }
        // K1 fallback: a truncation drops an unknown number of injections.
        if obs
            .logs
            .iter()
            .any(|l| l.contains("oldest history unit(s)") && !l.contains("dropped 0 "))
        {
            self.history_rewritten(false);
        }
        let had_turn = self.turn.is_some();
        let tools_reply = matches!(&st.input, StepInput::Input(Input::Llm { call, event: LlmEvent::Body(_) })
            if matches!(w.llm_replies.get(call), Some(LlmReply::Tools { .. })));
        if !tools_reply {
            ensure!(
                obs.announced.is_empty(),
                "A6/H8: tool_call announced outside a model tools response: {:?}",
                obs.announced
            );
        }
        let mut exp: Vec<Te> = Vec::new();
        let mut fx = Effects::default();

        // ---- apply the input to the model
        match &st.input {
            StepInput::Timeout => {
                for s in 0..self.srv.len() {
                    let due: Vec<u64> = self.srv[s]
                        .pending
                        .iter()
                        .filter(|(_, p)| matches!(p, Pend::Hook { deadline } if *deadline <= t))
                        .map(|(id, _)| *id)
                        .collect();
                    for id in due {
                        if self.srv[s].dead {
                            break;
                        }
                        self.srv[s].pending.remove(&id);
                        fx.cancel_notif.push((s, id));
                        self.srv[s].timeouts += 1;
                        let nm = self.srv[s].name.clone();
                        if self.srv[s].timeouts >= 2 {
                            fx.log_contains.push(format!(
                                "hook: killing server '{nm}' after 2 consecutive timeouts"
                            ));
                            fx.term.insert(s);
                            self.mark_dead(s, &mut fx.logs);
                        } else {
                            fx.log_contains
                                .push(format!("hook: server '{nm}' timed out (1/2)"));
                        }
                        self.set_outcome(s, id, Outcome::Timeout, &mut fx.logs);
                    }
                }
                let retry = st
                    .actions
                    .iter()
                    .any(|a| matches!(a, Action::CallLlm { .. }));
                if let Some(TurnM {
                    phase:
                        PhaseM::Backoff {
                            attempt,
                            since,
                            summary,
                        },
                    ..
                }) = &mut self.turn
                {
                    if retry {
                        ensure!(
                            t.ms_since(*since) <= MAX_BACKOFF_MS,
                            "L5: retry after {} ms",
                            t.ms_since(*since)
                        );
                        exp.push(Te::LlmCall {
                            attempt: *attempt,
                            summary: Some(*summary),
                            inject: Inject::None,
                        });
                        if let Some(turn) = self.turn.as_mut() {
                            turn.phase = PhaseM::Await;
                        }
                    }
                }
            }
            StepInput::Input(Input::AcpBytes(bytes)) => {
                let v = parse_line(String::from_utf8_lossy(bytes).trim());
                let method = v["method"].as_str().map(str::to_string);
                if let (Some(id), Some(m)) = (v["id"].as_u64(), method.as_deref()) {
                    ensure!(
                        self.requests.insert(id, m.to_string()).is_none(),
                        "test bug: reused id {id}"
                    );
                }
                match (v["id"].as_u64(), method.as_deref()) {
                    (_, Some("session/cancel")) => self.on_cancel(&mut exp, &mut fx)?,
                    (Some(id), Some("session/prompt")) => {
                        if v["params"]["sessionId"] != json!(self.session) {
                            exp.push(Te::Error { id, code: -32002 });
                        } else {
                            match &self.turn {
                                None => self.start_turn(id, &mut exp),
                                Some(turn) if turn.cancelled && self.queued.is_none() => {
                                    self.queued = Some(id);
                                    self.turn_rpcs.insert(id);
                                }
                                Some(_) => exp.push(Te::Error { id, code: -32602 }),
                            }
                        }
                    }
                    _ => {} // initialize, session/new, a reply to a permission request
                }
            }
            StepInput::Input(Input::Llm { call, event }) => {
                self.on_llm(w, t, *call, event, &obs, &mut exp, &mut fx)?
            }
            StepInput::Input(Input::McpBytes { proc, bytes }) => {
                let s = self.srv_of(*proc).ok_or("bytes from an unknown proc")?;
                let v = parse_line(String::from_utf8_lossy(bytes).trim());
                if let (Some(id), None) = (v["id"].as_u64(), v.get("method")) {
                    if let Some(p) = self.srv[s].pending.remove(&id) {
                        // H4/I5: any reply to a pending request resets the count; late ones don't (I6).
                        self.srv[s].timeouts = 0;
                        match p {
                            Pend::Hook { .. } => {
                                self.set_outcome(s, id, hook_outcome_of(&v), &mut fx.logs)
                            }
                            Pend::List if v.get("result").is_some() => self.srv[s].ready = true,
                            Pend::List | Pend::Tool | Pend::Other => {}
                        }
                    }
                }
            }
            StepInput::Input(Input::McpExited { proc, .. }) => {
                let s = self.srv_of(*proc).ok_or("exit of an unknown proc")?;
                if self.srv[s].proc == Some(*proc) && !self.srv[s].dead {
                    fx.term.insert(s); // the group is swept after its leader died (M8)
                    self.mark_dead(s, &mut fx.logs);
                }
            }
            StepInput::Input(_) => {}
        }

        // H10: when every server is ready the _SessionStart round starts.
        if matches!(self.opening, OpeningM::NotYet) && self.srv.iter().all(|s| s.ready) {
            let meta = json!({"point": "_SessionStart", "sessionId": "sess_1", "attempt": 1,
                "budgetRemaining": self.case.budget, "source": "new"});
            self.start_round("_SessionStart", t, false, meta, &mut fx.logs);
            fx.round_started = Some("_SessionStart");
        }

        // ---- MCP lines the agent wrote
        let mut last_hook_srv: Option<usize> = None;
        let mut cancels_seen: Vec<(usize, u64)> = Vec::new();
        for (s, v) in &obs.mcp {
            let s = *s;
            let method = v["method"].as_str().unwrap_or("");
            if let Some(id) = v["id"].as_u64() {
                if method.is_empty() {
                    continue; // our answer to a server request
                }
                let p = &v["params"];
                let tool = p["name"].as_str().unwrap_or("");
                let kind = if method == "tools/call" && tool.starts_with('_') {
                    ensure!(
                        fx.round_started == Some(tool),
                        "H1/I10: hook {tool} called on {} outside a {tool} round start",
                        name(s)
                    );
                    ensure!(
                        last_hook_srv.is_none_or(|l| l < s),
                        "H3: hook calls not in registration order"
                    );
                    last_hook_srv = Some(s);
                    let r = self
                        .round_mut(tool)
                        .ok_or_else(|| format!("hook call {tool} outside a round"))?;
                    ensure!(
                        p["arguments"] == json!({}),
                        "H3: hook arguments {}",
                        p["arguments"]
                    );
                    ensure!(
                        p["_meta"]["buzz/hook"] == r.meta,
                        "H3: hook _meta {} != {}",
                        p["_meta"],
                        r.meta
                    );
                    let c = r
                        .calls
                        .iter_mut()
                        .find(|c| c.srv == s && c.req.is_none() && c.outcome.is_none());
                    let c = c.ok_or_else(|| {
                        format!(
                            "H2/H3: {tool} called on {} which is not a live target",
                            name(s)
                        )
                    })?;
                    c.req = Some(id);
                    Pend::Hook {
                        deadline: t.plus_ms(timeout),
                    }
                } else if method == "tools/call" {
                    let turn = self.turn.as_mut().ok_or("tool call without a turn")?;
                    let PhaseM::Tools { dispatch, .. } = &mut turn.phase else {
                        return Err("tools/call outside the tools phase".into());
                    };
                    let k = dispatch.iter().position(|d| d.0 == s && d.1 == tool);
                    let k = k.ok_or_else(|| {
                        format!(
                            "I10/L2: tools/call {tool} on {} that the model did not ask for",
                            name(s)
                        )
                    })?;
                    if dispatch.remove(k).2 {
                        turn.posted = true; // G2: a dispatched posting attempt
                    }
                    Pend::Tool
                } else if method == "tools/list" {
                    Pend::List
                } else {
                    Pend::Other
                };
                ensure!(
                    !self.srv[s].dead,
                    "a request was written to dead server {}",
                    name(s)
                );
                self.srv[s].pending.insert(id, kind);
            } else if method == "notifications/cancelled" {
                let rid = v["params"]["requestId"]
                    .as_u64()
                    .ok_or("cancel without requestId")?;
                cancels_seen.push((s, rid));
                if let Some(p) = self.srv[s].pending.remove(&rid) {
                    ensure!(
                        !matches!(p, Pend::Hook { .. }),
                        "A4/H4: hook call {rid} on {} cancelled before its deadline",
                        name(s)
                    );
                }
            }
        }
        if let Some(point) = fx.round_started {
            if let Some(r) = self.round_mut(point) {
                for c in &r.calls {
                    ensure!(
                        c.req.is_some() || c.outcome.is_some(),
                        "H3: live allowlisted server {} was not called",
                        name(c.srv)
                    );
                }
            }
        }
        for c in &fx.cancel_notif {
            ensure!(
                cancels_seen.contains(c),
                "H4/A4: abandoned call {} on {} got no notifications/cancelled",
                c.1,
                name(c.0)
            );
        }

        // ---- ACP lines, in order: I7 counts, I8 liveness, tool-call terminal updates
        let mut live = had_turn || self.turn.is_some();
        let mut obs_te: Vec<(Te, Option<(LlmCallId, Value)>, Option<Value>)> = Vec::new();
        for a in &st.actions {
            match a {
                Action::CallLlm { call, request } => {
                    live = true;
                    let body: Value =
                        serde_json::from_slice(&request.body.to_vec()).unwrap_or(Value::Null);
                    let summary = is_summary_request(&body);
                    let te = Te::LlmCall {
                        attempt: 0,
                        summary: Some(summary),
                        inject: Inject::None,
                    };
                    obs_te.push((te, Some((*call, body)), None));
                }
                Action::WriteAcp(line) => {
                    let v = parse_line(line);
                    if let Some(m) = v["method"].as_str() {
                        ensure!(
                            v["params"]["sessionId"] == json!(self.session),
                            "update for another session: {line}"
                        );
                        if m == "session/update" {
                            ensure!(live, "I8: session/update outside a running prompt: {line}");
                            let u = &v["params"]["update"];
                            let terminal = u["sessionUpdate"] == "tool_call_update"
                                && (u["status"] == "completed" || u["status"] == "failed");
                            if terminal {
                                let id = u["toolCallId"].as_str().unwrap_or("").to_string();
                                ensure!(
                                    self.terminal_seen.insert(id.clone()),
                                    "A6: second terminal update for {id}"
                                );
                                let in_tools = match &mut self.turn {
                                    Some(TurnM {
                                        phase: PhaseM::Tools { pending, .. },
                                        ..
                                    }) => pending.remove(&id),
                                    _ => false,
                                };
                                let in_closing =
                                    fx.closing_tools.as_mut().is_some_and(|c| c.remove(&id));
                                ensure!(
                                    in_tools || in_closing,
                                    "A6: terminal update for {id} outside its tools phase"
                                );
                            }
                        } else if m == "session/request_permission" {
                            ensure!(live, "I8: permission request outside a running prompt");
                            let title = v["params"]["toolCall"]["title"].as_str().unwrap_or("");
                            let bare = title.split_once(": ").map_or("", |x| x.1);
                            ensure!(
                                bare == "echo" || bare == "shell",
                                "H8/A7: permission asked for {title}"
                            );
                        } else {
                            return Err(format!("unexpected agent message {m}"));
                        }
                        continue;
                    }
                    let Some(id) = v["id"].as_u64() else {
                        return Err(format!("I7: response with a foreign id: {line}"));
                    };
                    ensure!(
                        self.requests.contains_key(&id),
                        "I7: response to unknown request {id}"
                    );
                    *self.responses.entry(id).or_default() += 1;
                    match self.requests.get(&id).map(String::as_str) {
                        Some("session/new") => {
                            // H10: answered once the _SessionStart round is decided.
                            let OpeningM::Running(r) =
                                std::mem::replace(&mut self.opening, OpeningM::Done)
                            else {
                                return Err(
                                    "H10: session/new answered without a _SessionStart point"
                                        .into(),
                                );
                            };
                            ensure!(
                                r.calls.iter().all(|c| c.outcome.is_some()),
                                "H10: session/new answered before the _SessionStart round was decided"
                            );
                            self.start_texts = r
                                .calls
                                .iter()
                                .filter_map(|c| match &c.outcome {
                                    Some(Outcome::Objection(t)) => Some((name(c.srv), t.clone())),
                                    Some(_) | None => None,
                                })
                                .collect();
                            if let Some(sid) = v["result"]["sessionId"].as_str() {
                                self.session = sid.to_string();
                                for s in &mut self.srv {
                                    s.ready = true;
                                }
                            }
                        }
                        Some("session/cancel") => ensure!(
                            v["result"] == Value::Null && v.get("error").is_none(),
                            "A4: cancel answered {v}"
                        ),
                        Some("session/prompt") => {
                            if self.turn_rpcs.contains(&id) {
                                live = false;
                            }
                            let te = match v["error"]["code"].as_i64() {
                                Some(code) => Te::Error { id, code },
                                None => Te::Response {
                                    id,
                                    stop: "",
                                    meta: Value::Null,
                                },
                            };
                            obs_te.push((te, None, Some(v.clone())));
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        if let Some(c) = &fx.closing_tools {
            ensure!(
                c.is_empty(),
                "A4: announced tool calls {c:?} never reached a terminal status before the response"
            );
        }
        // Tools done → next round.
        if let Some(TurnM {
            phase: PhaseM::Tools { pending, .. },
            ..
        }) = &self.turn
        {
            if pending.is_empty() {
                self.next_round(Inject::None, &mut exp);
            }
        }
        self.maybe_conclude(&mut exp);

        // ---- compare the turn events
        let kinds = |v: &[Te]| -> Vec<String> {
            v.iter()
                .map(|e| match e {
                    Te::LlmCall { .. } => "llm-call".to_string(),
                    Te::Response { id, .. } => format!("response#{id}"),
                    Te::Error { id, code } => format!("error#{id}({code})"),
                })
                .collect()
        };
        let got: Vec<Te> = obs_te.iter().map(|x| x.0.clone()).collect();
        ensure!(
            kinds(&got) == kinds(&exp),
            "turn events: the agent did {:?}, the model expects {:?}",
            kinds(&got),
            kinds(&exp)
        );
        for (e, (g, llm, resp)) in exp.iter().zip(&obs_te) {
            match e {
                Te::LlmCall {
                    attempt,
                    summary,
                    inject,
                } => {
                    let (call, body) = llm.as_ref().ok_or("llm")?;
                    let Te::LlmCall {
                        summary: Some(is_summary),
                        ..
                    } = g
                    else {
                        return Err("obs".into());
                    };
                    if let Some(want) = summary {
                        ensure!(
                            want == is_summary,
                            "K1: summary call {is_summary}, expected {want}"
                        );
                    }
                    self.check_llm_body(body, *is_summary, inject)?;
                    let turn = self.turn.as_mut().ok_or("LLM call without a turn")?;
                    if *attempt == 1 && !is_summary {
                        turn.rounds += 1;
                    }
                    turn.phase = PhaseM::Llm {
                        call: *call,
                        attempt: *attempt,
                        summary: *is_summary,
                    };
                }
                Te::Response { stop, meta, .. } => {
                    let v = resp.as_ref().ok_or("resp")?;
                    ensure!(
                        v["result"]["stopReason"] == *stop,
                        "stopReason {} != {stop}",
                        v["result"]["stopReason"]
                    );
                    ensure!(
                        v["result"]["_meta"] == *meta,
                        "A8: _meta {} != model {meta}",
                        v["result"]["_meta"]
                    );
                    let k = v["result"]["_meta"]["buzz"]["stopObjections"]
                        .as_u64()
                        .unwrap_or(u64::MAX);
                    ensure!(
                        k <= u64::from(self.case.budget),
                        "I1: {k} objections over budget {}",
                        self.case.budget
                    );
                }
                Te::Error { code, .. } => {
                    let v = resp.as_ref().ok_or("resp")?;
                    ensure!(
                        v["error"]["code"] == *code,
                        "error code {} != {code}",
                        v["error"]["code"]
                    );
                    if *code == -32000 {
                        let m = v["error"]["message"].as_str().unwrap_or("");
                        ensure!(m.starts_with("llm:"), "A3: LLM failure message {m:?}");
                    }
                }
            }
        }
        if let Some(call) = fx.release {
            ensure!(
                obs.released.contains(&call),
                "A4: cancelled LLM call {call} not dropped"
            );
        }
        if let Some(TurnM {
            phase: PhaseM::Await,
            ..
        }) = &self.turn
        {
            return Err("model: awaiting an LLM call at the end of a step".into());
        }

        // ---- kills (I5)
        let mut terms = BTreeSet::new();
        for (s, proc, sig) in &obs.signals {
            match sig {
                Signal::Term => {
                    ensure!(
                        fx.term.contains(s) && self.srv[*s].proc == Some(*proc),
                        "I5: {proc} ({}) was signalled TERM without a 2nd consecutive hook timeout or an exit",
                        name(*s)
                    );
                    terms.insert(*s);
                    self.terms.entry(*proc).or_insert(t);
                }
                Signal::Kill => {
                    let ok = self
                        .terms
                        .get(proc)
                        .is_some_and(|t0| t0.plus_ms(KILL_GRACE_MS) <= t)
                        && self.kills.insert(*proc);
                    ensure!(
                        ok,
                        "I5: KILL of {proc} without a TERM {KILL_GRACE_MS} ms earlier"
                    );
                }
            }
        }
        ensure!(
            terms == fx.term,
            "I5/H4: expected TERM for {:?}, got {terms:?}",
            fx.term
        );

        // ---- H9: one log line per hook call with its outcome
        let mut got_logs: Vec<String> = obs
            .logs
            .iter()
            .filter(|l| l.starts_with("hook: point="))
            .map(|l| {
                l.split(" latency_ms=")
                    .next()
                    .unwrap_or("")
                    .split(" (")
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        got_logs.sort();
        fx.logs.sort();
        ensure!(
            got_logs == fx.logs,
            "H9: hook log lines {got_logs:?}, expected {:?}",
            fx.logs
        );
        for c in &fx.log_contains {
            ensure!(
                obs.logs.iter().any(|l| l.contains(c.as_str())),
                "H4: missing log {c:?}"
            );
        }
        Ok(())
    }

    /// I9, I10 and the injections (I1, H6, H7) of one LLM request body.
    fn check_llm_body(
        &mut self,
        body: &Value,
        summary: bool,
        inject: &Inject,
    ) -> Result<(), String> {
        for tool in body["tools"].as_array().into_iter().flatten() {
            let n = tool["function"]["name"].as_str().unwrap_or("");
            let bare = n.split_once("__").map_or(n, |(_, b)| b);
            ensure!(
                !bare.starts_with('_'),
                "I10: hook tool {n} offered to the model"
            );
        }
        if summary {
            ensure!(
                body.get("tools").is_none(),
                "K1: the summary call offers tools"
            );
        }
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        // C61 / L10: strict chat templates' alternation — never two user or two assistant
        // messages in a row, never a user message right after a tool result.
        for (k, w) in msgs.windows(2).enumerate() {
            let (a, b) = (&w[0]["role"], &w[1]["role"]);
            ensure!(
                !(a == b && (a == "user" || a == "assistant")),
                "C61: two {a} messages in a row at {k}: {} / {}",
                w[0],
                w[1]
            );
            ensure!(
                !(a == "tool" && b == "user"),
                "L10: a user message right after a tool result at {k}"
            );
        }
        // I9 (every assistant tool call has exactly one tool message, right after it, in
        // order) is checked on every request as the world drains it (`Invariants`).
        let mut stop_pairs = 0;
        let mut session_pairs = 0;
        for c in msgs
            .iter()
            .filter_map(|m| m["tool_calls"].as_array())
            .flatten()
        {
            let id = c["id"].as_str().unwrap_or("");
            if id.starts_with("buzz_hook__Stop_") {
                stop_pairs += 1;
            }
            if id.starts_with("buzz_hook__SessionStart_") {
                session_pairs += 1;
            }
            ensure!(
                !id.starts_with("buzz_hook__SessionEnd_"),
                "H11: a _SessionEnd answer was injected"
            );
            if id.starts_with("buzz_hook_") {
                ensure!(
                    c["function"]["arguments"] == "{}",
                    "H6: injection arguments {c}"
                );
            }
        }
        if summary {
            return Ok(()); // the history it summarises is not sent as messages
        }
        if let Some(n) = self.stop_injections {
            ensure!(
                stop_pairs == n,
                "I1/H6: {stop_pairs} _Stop injections in the request, the model has {n}"
            );
        }
        self.stop_injections = Some(stop_pairs);
        // H10: the _SessionStart pairs appear in the first prompt's first request and in no
        // other prompt's request (they stay as history).
        let want = match inject {
            Inject::SessionStart(texts) => Some(texts.len()),
            Inject::None | Inject::Stop(_) | Inject::PostCompact(_) => self.session_pairs,
        };
        if let Some(n) = want {
            ensure!(
                session_pairs == n,
                "H10: {session_pairs} _SessionStart injections in the request, the model has {n}"
            );
        }
        self.session_pairs = Some(session_pairs);
        let pair =
            |a: &Value, r: &Value, point: &str, server: &str, text: &str| -> Result<(), String> {
                ensure!(
                    a["tool_calls"].as_array().is_some_and(|c| c.len() == 1),
                    "H6: injection is not one call: {a}"
                );
                let call = &a["tool_calls"][0];
                let id = call["id"].as_str().unwrap_or("");
                ensure!(
                    id.starts_with(&format!("buzz_hook_{point}_{server}_")),
                    "H6: injection id {id} for {server}"
                );
                ensure!(
                    call["function"]["name"] == format!("{server}__{point}"),
                    "H6: injection name {}",
                    call["function"]["name"]
                );
                let inner: Value = serde_json::from_str(r["content"].as_str().unwrap_or(""))
                    .unwrap_or(Value::Null);
                ensure!(
                    inner["hook"] == point && inner["server"] == server,
                    "H6: injected {inner}"
                );
                if server == GUARD {
                    ensure!(
                        inner["text"]
                            .as_str()
                            .is_some_and(|t| t.contains("buzz messages send")),
                        "G1: reminder text {}",
                        inner["text"]
                    );
                } else {
                    ensure!(
                        inner["text"] == text,
                        "I3/H6: injected text {} != {text:?} (order or content)",
                        inner["text"]
                    );
                }
                Ok(())
            };
        match inject {
            Inject::None => {}
            Inject::SessionStart(texts) => {
                // H10/L10: [prompt, injections…, a closing assistant line, the follow-up user
                // line] — right after the first prompt, in its first request.
                let k = texts.len();
                ensure!(
                    msgs.len() == 2 * k + 3,
                    "H10: {} messages in the first request, expected {}",
                    msgs.len(),
                    2 * k + 3
                );
                ensure!(
                    msgs[0]["role"] == "user" && msgs[0]["content"] == "do the task",
                    "H10: the prompt is not first: {}",
                    msgs[0]
                );
                for (j, (server, text)) in texts.iter().enumerate() {
                    pair(
                        &msgs[1 + 2 * j],
                        &msgs[2 + 2 * j],
                        "_SessionStart",
                        server,
                        text,
                    )?;
                }
                ensure!(
                    msgs[2 * k + 2]["role"] == "user",
                    "H10/L10: the injections are not closed by a user line: {}",
                    msgs[2 * k + 2]
                );
            }
            Inject::Stop(texts) => {
                let k = texts.len();
                ensure!(
                    msgs.len() >= 2 * k,
                    "H6: request too short for {k} injections"
                );
                let tail = &msgs[msgs.len() - 2 * k..];
                for (j, (server, text)) in texts.iter().enumerate() {
                    pair(&tail[2 * j], &tail[2 * j + 1], "_Stop", server, text)?;
                }
            }
            Inject::PostCompact(texts) => {
                // H7: [summary, injections…, live prompt] — the very next request carries them.
                // On the Chat wire (L10, C61) the summary and the prompt share one user message
                // when nothing was injected, and a short assistant message closes the injected
                // tool calls before the prompt.
                let k = texts.len();
                let expected = if k == 0 { 1 } else { 2 * k + 3 };
                ensure!(
                    msgs.len() == expected,
                    "H7: {} messages after compaction, expected {expected}",
                    msgs.len()
                );
                ensure!(
                    msgs[0]["content"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("[Context summary")),
                    "K1: {}",
                    msgs[0]
                );
                for (j, (server, text)) in texts.iter().enumerate() {
                    pair(
                        &msgs[1 + 2 * j],
                        &msgs[2 + 2 * j],
                        "_PostCompact",
                        server,
                        text,
                    )?;
                }
                let last = &msgs[expected - 1];
                ensure!(
                    last["role"] == "user"
                        && last["content"]
                            .as_str()
                            .is_some_and(|c| c.ends_with("do the task")),
                    "K1: the live prompt is not last: {last}"
                );
                if k > 0 {
                    ensure!(
                        msgs[2 * k + 1]["role"] == "assistant"
                            && msgs[2 * k + 1].get("tool_calls").is_none(),
                        "L10: no assistant message between the injections and the prompt: {}",
                        msgs[2 * k + 1]
                    );
                }
            }
        }
        Ok(())
    }
}

/// What one step's input obliges the agent to do besides turn events.
#[derive(Default)]
struct Effects {
    /// Expected `hook: point=… server=… outcome=…` lines (H9).
    logs: Vec<String>,
    log_contains: Vec<String>,
    /// Servers whose group must get SIGTERM now (I5).
    term: BTreeSet<usize>,
    /// (server, request id) that must get `notifications/cancelled`.
    cancel_notif: Vec<(usize, u64)>,
    release: Option<LlmCallId>,
    closing_tools: Option<BTreeSet<String>>,
    round_started: Option<&'static str>,
}

fn check_world(case: &Case, w: &World) -> Result<(), String> {
    let mut c = Checker::new(case);
    c.check(w)
        .map_err(|e| format!("{e}\n--- transcript ---\n{}", w.transcript_text()))
}

// ====================================================================== properties

proptest! {
    #![proptest_config(config())]

    /// I1–I11 on random scripts: LLM responses with and without tool calls, hook replies
    /// (objection, empty, error, isError, late, never, exit), server exits, new prompts, cancels
    /// and time advances, checked step by step against the reference model.
    #[test]
    fn i1_to_i11_random_scripts_follow_the_reference_model(case in case()) {
        let w = run(&case);
        if let Err(e) = check_world(&case, &w) {
            prop_assert!(false, "{}", e);
        }
    }

    /// I12: the same timed script gives byte-identical actions and transcripts.
    #[test]
    fn i12_the_same_script_twice_gives_byte_identical_transcripts(case in case()) {
        let a = run(&case);
        let b = run(&case);
        Invariants::same_runs((&a.steps, a.now), (&b.steps, b.now));
        prop_assert_eq!(a.transcript_text(), b.transcript_text());
    }

    /// I1/H5 (and I2 across prompts): budget N and hooks that always object ⇒ exactly N
    /// objecting rounds, then `end_turn`, with N+1 end-turn LLM calls per prompt.
    #[test]
    fn i1_h5_budget_n_with_always_objecting_hooks_gives_exactly_n_rounds_then_end_turn(
        budget in 0u32..6, servers in 1usize..4, require_reply in any::<bool>(), prompts in 1usize..4,
    ) {
        let mut cfg = test_config();
        cfg.stop_max_rejections = budget;
        cfg.require_reply = require_reply;
        let specs = (0..servers)
            .map(|i| ServerSpec::new(&name(i), &["_Stop"]).default_reply(HookReply::objection(&format!("no #{i}"))))
            .collect();
        let mut w = World::new(cfg, specs);
        w.start();
        for p in 0..prompts {
            let before = w.llm_requests.len();
            let calls_before: u32 = (0..servers).map(|i| w.hook_calls(&name(i))).sum();
            let id = w.prompt("task");
            w.run_idle();
            let r = w.response(id).cloned().unwrap_or(Value::Null);
            prop_assert_eq!(&r["result"]["stopReason"], "end_turn");
            let meta = &r["result"]["_meta"]["buzz"];
            prop_assert_eq!(meta["stopObjections"].as_u64(), Some(u64::from(budget)), "prompt {}", p);
            prop_assert_eq!(meta["stopBudgetExhausted"].as_bool(), Some(budget > 0));
            prop_assert_eq!(w.llm_requests.len() - before, budget as usize + 1, "H5: N+1 end-turn LLM calls");
            let calls: u32 = (0..servers).map(|i| w.hook_calls(&name(i))).sum::<u32>() - calls_before;
            prop_assert_eq!(calls, budget * servers as u32, "one call per server per objecting round");
            // Each objecting round injected one text per server (+ the reminder while it lasts).
            let last = &w.llm_requests[w.llm_requests.len() - 1].2;
            let n = count_injections(last);
            let reminders = if require_reply { budget.min(MAX_REMINDERS) } else { 0 };
            let per_prompt = budget as usize * servers + reminders as usize;
            prop_assert_eq!(n, per_prompt * (p + 1), "injections accumulate in history");
        }
    }

    /// I2: the objection count resets at each `session/prompt`, never on a retry (L5) or a
    /// server death within the prompt.
    #[test]
    fn i2_objection_count_resets_only_at_a_new_prompt(
        budget in 1u32..4,
        failures in prop::collection::vec(prop::bool::weighted(0.3), 0..12),
        second_dies in any::<bool>(),
        prompts in 1usize..4,
    ) {
        let mut cfg = test_config();
        cfg.stop_max_rejections = budget;
        let a = ServerSpec::new("a", &["_Stop"]).default_reply(HookReply::objection("a objects"));
        let b = ServerSpec::new("b", &["_Stop"])
            .script(if second_dies { vec![HookReply::now(HookKind::Exit)] } else { vec![] })
            .default_reply(HookReply::objection("b objects"));
        let mut w = World::new(cfg, vec![a, b]);
        w.llm(failures.iter().map(|&f| if f { LlmReply::Status { status: 500, delay_ms: 0 } } else { LlmReply::text("Done.") }));
        w.start();
        for _ in 0..prompts {
            let id = w.prompt("task");
            w.run_idle();
            let r = w.response(id).cloned().unwrap_or(Value::Null);
            if r.get("error").is_some() {
                // Three failures in a row fail the prompt (L5); the next prompt starts afresh.
                prop_assert_eq!(&r["error"]["code"], -32000);
                continue;
            }
            prop_assert_eq!(r["result"]["_meta"]["buzz"]["stopObjections"].as_u64(), Some(u64::from(budget)));
            prop_assert_eq!(r["result"]["_meta"]["buzz"]["rounds"].as_u64(), Some(u64::from(budget) + 1));
        }
    }

    /// I5/H4: a server is killed only on its 2nd consecutive hook timeout; any in-time reply
    /// resets the count, a late reply does not (I6).
    #[test]
    fn i5_a_server_is_killed_only_on_its_second_consecutive_hook_timeout(
        seq in prop::collection::vec(prop_oneof![Just(Timing::Now), Just(Timing::Soon), Just(Timing::Late), Just(Timing::Never)], 1..10),
    ) {
        let mut cfg = test_config();
        cfg.hook_timeout_ms = 200;
        let replies = seq.iter().map(|t| match t {
            Timing::Now => HookReply::now(HookKind::Empty),
            Timing::Soon => HookReply::after(HookKind::Empty, 100),
            Timing::Late => HookReply::after(HookKind::Empty, 300),
            Timing::Never => HookReply::now(HookKind::Never),
        });
        let mut w = World::new(cfg, vec![ServerSpec::new("h", &["_Stop"]).script(replies)]);
        w.start();
        // Reference: count timeouts (never/late), reset on in-time replies, kill at 2.
        let mut count = 0;
        let mut kill_at = None;
        for (k, t) in seq.iter().enumerate() {
            match t {
                Timing::Late | Timing::Never => count += 1,
                Timing::Now | Timing::Soon => count = 0,
            }
            if count == 2 {
                kill_at = Some(k);
                break;
            }
        }
        for (k, _) in seq.iter().enumerate() {
            let signals_before = w.signals.len();
            let id = w.prompt("task");
            w.run_idle();
            prop_assert_eq!(&w.response(id).cloned().unwrap_or(Value::Null)["result"]["stopReason"], "end_turn");
            let killed_now = w.signals[signals_before..].iter().any(|s| s.2 == Signal::Term);
            prop_assert_eq!(killed_now, kill_at == Some(k), "prompt {}: kill expected {:?}", k, kill_at);
            if killed_now {
                break;
            }
        }
        let expected_calls = kill_at.map_or(seq.len(), |k| k + 1) as u32;
        prop_assert_eq!(w.hook_calls("h"), expected_calls, "a killed server is never called again");
    }
}

proptest! {
    #![proptest_config(config())]

    /// I7 + P1 + H11: stdin EOF, a signal, a dead client, or a `session/close` then EOF, at any
    /// point of a random script, answers every pending request exactly once, runs the
    /// session's `_SessionEnd` exactly once (every allowlisted server exposing it is called
    /// once, or logged dead; the reason is the exit path's; the prompt count is the number of
    /// prompts that ran; nothing is injected), stops every server and exits 0 within 5 s;
    /// nothing is written after the exit.
    #[test]
    fn i7_h11_any_exit_path_at_any_point_answers_every_request_once_ends_the_session_once_and_exits(
        case in case(),
        cut in any::<prop::sample::Index>(),
        path in 0u8..4,
    ) {
        let mut w = build(&case);
        let sid = w.start();
        let n = cut.index(case.acts.len() + 1);
        for a in &case.acts[..n] {
            match a {
                Act::Prompt => {
                    w.prompt("do the task");
                }
                Act::PromptUnknown | Act::CancelRequest => {}
                Act::Cancel => w.cancel(),
                Act::Advance(ms) => w.advance(*ms),
                Act::Exit(i) => w.exit_server(&name(*i), "exit status 3"),
            }
        }
        let ends_before = session_end_calls(&w);
        prop_assert_eq!(ends_before.len(), 0, "H11: _SessionEnd before the session ended");
        let eof_at = w.now;
        let reason = match path {
            0 => { w.eof(); "eof" }
            1 => { w.signal(); "signal" }
            2 => { w.client_gone(); "client_gone" }
            _ => {
                w.request("session/close", json!({"sessionId": sid}));
                w.eof();
                "close"
            }
        };
        w.run_idle();
        prop_assert_eq!(w.exited, Some(0), "P1: exit 0");
        let exit_t = w.steps.iter().find(|s| s.actions.iter().any(|a| matches!(a, Action::Exit { .. }))).map(|s| s.t);
        prop_assert!(exit_t.is_some_and(|t| t.ms_since(eof_at) <= 5000), "P1: exit within 5 s (at {:?})", exit_t);
        let after_exit = w.steps.iter().skip_while(|s| !s.actions.iter().any(|a| matches!(a, Action::Exit { .. }))).skip(1).count();
        prop_assert_eq!(after_exit, 0, "no step after the exit");
        // I7: every request we sent got exactly one response.
        w.checks.all_answered();
        // H11: exactly once per target, with the reason and the prompt count.
        let ran = w.logs.iter().filter(|l| l.message.contains(": turn ended: ") || l.message.contains(": turn failed: ")).count();
        let ends = session_end_calls(&w);
        for (i, srv) in case.servers.iter().enumerate() {
            let target = srv.session_end.is_some() && srv.allowed;
            let calls = ends.iter().filter(|(s, _)| *s == name(i)).count();
            let dead = w.logs.iter().any(|l| l.message.starts_with(&format!("hook: point=_SessionEnd server={} outcome=dead", name(i))));
            prop_assert!(calls <= 1, "H11: {} got {} _SessionEnd calls", name(i), calls);
            if target {
                prop_assert!(calls == 1 || dead, "H11: target {} neither called nor logged dead", name(i));
            } else {
                prop_assert_eq!(calls, 0, "H2/H11: {} is not a _SessionEnd target", name(i));
            }
        }
        for (_, meta) in &ends {
            prop_assert_eq!(&meta["reason"], reason);
            prop_assert_eq!(meta["promptCount"].as_u64(), Some(ran as u64), "H11: promptCount");
            prop_assert_eq!(&meta["sessionId"], &json!(sid));
        }
        let endings = w.logs.iter().filter(|l| l.message.starts_with(&format!("session {sid}: ending ("))).count();
        prop_assert_eq!(endings, 1, "H11: the session ends exactly once");
        // M8: every started process group was signalled.
        for name in w.mcp_lines.keys() {
            prop_assert!(!w.server_alive(name), "M8: {} survived the shutdown", name);
        }
    }
}

/// Every `_SessionEnd` call the servers received: (server, its `_meta.buzz/hook`).
fn session_end_calls(w: &World) -> Vec<(String, Value)> {
    w.mcp_lines
        .iter()
        .flat_map(|(server, lines)| {
            lines
                .iter()
                .filter(|(_, v)| {
                    v["method"] == "tools/call" && v["params"]["name"] == "_SessionEnd"
                })
                .map(|(_, v)| (server.clone(), v["params"]["_meta"]["buzz/hook"].clone()))
        })
        .collect()
}

fn count_injections(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["role"] == "tool"
                && m["tool_call_id"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("buzz_hook__Stop_"))
        })
        .count()
}

// ====================================================================== focused examples

/// I10/M4: model calls to hook names get `unknown tool` and never reach the server; hooks are
/// never in the tool list.
#[test]
fn i10_model_calls_to_hook_names_never_reach_mcp_and_hooks_are_never_offered() {
    let mut w = World::new(
        test_config(),
        vec![ServerSpec::new("srv", &["_Stop", "_PostCompact", "_Other"])],
    );
    w.llm([
        LlmReply::Tools {
            calls: vec![
                ("srv___Stop".into(), "{}".into()),
                ("srv___Other".into(), "{}".into()),
                ("srv___PostCompact".into(), "{}".into()),
                ("srv__echo".into(), r#"{"text":"x"}"#.into()),
            ],
            delay_ms: 0,
        },
        LlmReply::text("ok"),
    ]);
    w.start();
    w.prompt("go");
    w.run_idle();
    for (_, _, body) in &w.llm_requests {
        let tools: Vec<&str> = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert_eq!(tools, ["srv__echo"]);
    }
    let calls: Vec<String> = w.mcp_lines["srv"]
        .iter()
        .filter(|(_, v)| v["method"] == "tools/call")
        .map(|(_, v)| v["params"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        calls,
        ["echo", "_Stop"],
        "only the echo call and the gate's own _Stop reach the server"
    );
    let second = &w.llm_requests[1].2["messages"];
    let unknown = second
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["role"] == "tool"
                && m["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("unknown tool"))
        })
        .count();
    assert_eq!(unknown, 3);
}

/// I7 for a cancel that lands while the first LLM call streams, followed at once by a new
/// prompt (cancel-then-prompt, SPEC A3/A4): two responses, `cancelled` then `end_turn`.
#[test]
fn i7_cancel_then_prompt_gets_one_response_each() {
    let mut w = World::new(test_config(), vec![ServerSpec::new("s1", &["_Stop"])]);
    w.llm([LlmReply::Text {
        text: "slow".into(),
        delay_ms: 500,
    }]);
    w.start();
    let p1 = w.prompt("one");
    w.advance(100);
    w.cancel();
    let p2 = w.prompt("two");
    w.run_idle();
    assert_eq!(w.responses(p1).len(), 1);
    assert_eq!(w.responses(p2).len(), 1);
    assert_eq!(
        w.response(p1).map(|r| r["result"]["stopReason"].clone()),
        Some(json!("cancelled"))
    );
    assert_eq!(
        w.response(p2).map(|r| r["result"]["stopReason"].clone()),
        Some(json!("end_turn"))
    );
}

/// CORE BUG found by `i1_to_i11_random_scripts_follow_the_reference_model` (minimal script).
/// H5/H6: an honoured `_Stop` objection costs a budget unit and its text must reach the very
/// next LLM request. When the K1 gate then has to fall back to truncation (handoff cap spent,
/// or a failed summary), `compaction::truncate` drops the oldest units after the live prompt —
/// including the injection pairs of the round just decided — and keeps only the last unit (here
/// the reply-guard reminder). The model never sees the objection it was charged for.
/// Suggested fix (compaction.rs `truncate`): never drop the trailing run of `buzz_hook_*`
/// injection units, as the last unit is already protected.
#[test]
fn h6_truncation_fallback_keeps_the_objections_of_the_round_just_decided() {
    let mut cfg = test_config();
    cfg.stop_max_rejections = 1;
    cfg.require_reply = true;
    cfg.max_context_tokens = 250;
    cfg.max_output_tokens = 100;
    cfg.max_handoffs = 0; // go straight to the truncation fallback
    let s1 = ServerSpec::new("s1", &["_Stop"]).script([HookReply::objection("tests fail")]);
    let mut w = World::new(cfg, vec![s1]);
    w.start();
    let p = w.prompt("do the task");
    w.run_idle();
    assert_eq!(
        w.response(p)
            .map(|r| r["result"]["_meta"]["buzz"]["stopObjections"].clone()),
        Some(json!(1))
    );
    let second = &w.llm_requests[1].2;
    let injected: Vec<String> = second["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect();
    assert!(
        injected.iter().any(|c| c.contains("tests fail")),
        "the objection charged to the budget is missing from the next request: {injected:?}\n{}",
        w.transcript_text()
    );
}

// ====================================================================== SPEC A9: sessions that survive

/// A configuration with a state directory (SPEC A9).
fn store_config() -> buzz_agent_core::Config {
    let mut cfg = test_config();
    cfg.state_dir = buzz_agent_core::config::StateDir::Dir("/state".into());
    cfg
}

/// I9 on a history in its record form: every tool call of an assistant message is answered by
/// exactly one result before the next user or assistant message, and no result is unasked.
fn check_paired(messages: &Value) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    for m in messages.as_array().into_iter().flatten() {
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["callId"].as_str().unwrap_or("").to_string();
                let at = open.iter().position(|o| *o == id);
                let Some(at) = at else {
                    return Err(format!("I9: result {id} without its call: {messages}"));
                };
                open.remove(at);
            }
            _ => {
                if !open.is_empty() {
                    return Err(format!("I9: calls {open:?} without results: {messages}"));
                }
                for c in m["toolCalls"].as_array().into_iter().flatten() {
                    open.push(c["id"].as_str().unwrap_or("").to_string());
                }
            }
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!("I9: calls {open:?} without results at the end"))
    }
}

/// A request's messages split after the first `at`: those, then what follows (a
/// `_SessionStart` injection after a load, SPEC H10, and its closing lines).
fn split_at_len(messages: Value, at: usize) -> (Value, Vec<Value>) {
    let list = messages.as_array().cloned().unwrap_or_default();
    let at = at.min(list.len());
    (Value::Array(list[..at].to_vec()), list[at..].to_vec())
}

/// The updates of a session as a client keeps them: text chunks of one kind merged, a tool
/// call's progress left out (its announcement and final status kept), usage left out, and the
/// user's own prompts left out (the live client sent them; the replay shows them).
fn canonical_updates(updates: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for u in updates {
        let kind = u["sessionUpdate"].as_str().unwrap_or("");
        match kind {
            "usage_update" | "user_message_chunk" => {}
            "tool_call_update" if !matches!(u["status"].as_str(), Some("completed" | "failed")) => {
            }
            "agent_message_chunk" | "agent_thought_chunk" => {
                let text = u["content"]["text"].as_str().unwrap_or("");
                if let Some(last) = out.last_mut()
                    && last["sessionUpdate"] == kind
                {
                    let joined =
                        format!("{}{text}", last["content"]["text"].as_str().unwrap_or(""));
                    last["content"]["text"] = json!(joined);
                } else {
                    // The replay gives the text as the client saw it; a notice's marks
                    // (`_meta.buzz.notice`, the user-only audience) are not recorded.
                    let mut u = u.clone();
                    if let Some(o) = u.as_object_mut() {
                        o.remove("_meta");
                    }
                    if let Some(c) = u["content"].as_object_mut() {
                        c.remove("annotations");
                    }
                    out.push(u);
                }
            }
            _ => out.push(u.clone()),
        }
    }
    out
}

/// Loads `sid` from `disk` into a fresh world of `case` (a new agent process); returns the
/// world, the load's id and the index of its first ACP line.
fn load_into_new_world(
    case: &Case,
    disk: support::FakeDisk,
    sid: &str,
    replay: bool,
) -> (World, u64, usize) {
    let mut w = build_with(case, store_config()).with_disk(disk);
    w.initialize();
    let from = w.acp_out.len();
    let id = w.load_session(sid, replay);
    (w, id, from)
}

proptest! {
    #![proptest_config(config())]

    /// A9: a random session (tool calls, hooks and their objections, compaction, permission
    /// answers, cancels, server deaths) recorded, then loaded by a new agent, has the same
    /// history, usage mark, call counter and remembered answers; the replay shows what the
    /// client saw; and the next prompt's first request carries the same messages.
    #[test]
    fn a9_a_random_session_recorded_then_loaded_has_the_same_history_and_replay(
        case in case(), chunk in prop_oneof![Just(1usize), 1usize..64, 64usize..70_000],
    ) {
        let mut w = run_world(&case, build_with(&case, store_config()), false);
        let sid = w.session.clone().unwrap_or_default();
        let before = w.agent.session_state_for_tests(&sid);
        prop_assert!(before.is_some());
        let original = w.updates_since(0, &sid);
        let file = format!("{sid}.jsonl");
        if !w.disk.files.contains_key(&file) {
            // No prompt was ever sent: nothing is saved, and a load says the session is unknown.
            let (w2, id, _) = load_into_new_world(&case, w.disk.clone(), &sid, true);
            prop_assert_eq!(&w2.response(id).cloned().unwrap_or_default()["error"]["code"], -32002);
            return Ok(());
        }
        let mut disk = w.disk.clone();
        disk.chunk = chunk;
        let (mut w2, id, from) = load_into_new_world(&case, disk, &sid, true);
        let r = w2.response(id).cloned().unwrap_or_default();
        prop_assert_eq!(&r["result"]["configOptions"][0]["id"], "model", "{}\n{}", r, w2.transcript_text());
        let after = w2.agent.session_state_for_tests(&sid);
        prop_assert_eq!(&after, &before, "{}", w.disk.text(&file));
        if let Some(after) = &after {
            if let Err(e) = check_paired(&after["messages"]) {
                prop_assert!(false, "{}", e);
            }
        }
        let replayed = w2.updates_since(from, &sid);
        prop_assert_eq!(canonical_updates(&replayed), canonical_updates(&original));
        // The next prompt continues the same history (I2: with a fresh budget): its first
        // request carries the same messages.
        let mut first = Vec::new();
        for world in [&mut w, &mut w2] {
            world.llm_script.clear();
            world.llm_default = LlmReply::text("Next.");
            let n = world.llm_requests.len();
            world.prompt("next");
            world.run_idle();
            first.push(world.llm_requests.get(n).map(|(_, _, b)| b["messages"].clone()));
        }
        prop_assert!(first[0].is_some());
        // H10: the loaded session ran its `_SessionStart` round (source `load`); what it
        // injects comes right after the new prompt, and nothing else differs.
        // (The injection can make a compaction due first: a summary request is compared with
        // nothing.)
        let loaded = first[1].clone().unwrap_or_default();
        if loaded[0]["role"] == "system" {
            return Ok(());
        }
        let original = first[0].clone().unwrap_or_default();
        let (kept, injected) = split_at_len(loaded, original.as_array().map_or(0, Vec::len));
        prop_assert_eq!(original, kept);
        prop_assert!(
            injected.iter().all(|m| m.to_string().contains("_SessionStart")
                || m["content"] == "(tool results received)"
                || m["content"].as_str().is_some_and(|c| c.contains("session-start hooks"))),
            "{:?}", injected
        );
    }

    /// A9 durability: with every prompt run to its end, an OS crash (or a power loss) right
    /// after any prompt was answered — the file cut to what was synced when the answer was
    /// written, plus any torn piece of what came next — loses nothing: the load gives exactly
    /// the history the agent had then, every tool call paired (I9). And the disk was synced
    /// once per answered prompt, never per round.
    #[test]
    fn a9_an_os_crash_after_any_answered_prompt_loses_nothing_and_a_torn_tail_is_ignored(
        case in case(), pick in any::<prop::sample::Index>(), torn in 0usize..200,
        sync_ms in 0u64..3,
    ) {
        let mut w = build_with(&case, store_config());
        w.disk.sync_ms = sync_ms;
        w.start();
        let sid = w.session.clone().unwrap_or_default();
        let file = format!("{sid}.jsonl");
        let mut checkpoints: Vec<(usize, Value)> = Vec::new();
        let mut answered = 0;
        for a in &case.acts {
            if *a == Act::Prompt {
                let id = json!(w.prompt("do the task"));
                w.run_idle();
                let Some((_, synced)) = w.answered_synced.iter().find(|(i, _)| *i == id) else {
                    continue;
                };
                answered += 1;
                // Nothing synced when the answer went out: a cut at 0, which the load fails.
                let len = synced.get(&file).copied().unwrap_or(0);
                if let Some(state) = w.agent.session_state_for_tests(&sid) {
                    checkpoints.push((len, state));
                }
            }
        }
        prop_assert_eq!(w.disk.syncs, answered, "one sync per answered prompt");
        prop_assume!(!checkpoints.is_empty());
        let (len, want) = pick.get(&checkpoints).clone();
        let mut disk = w.disk.after_os_crash();
        if let (Some((data, _)), Some((all, _))) = (disk.files.get_mut(&file), w.disk.files.get(&file)) {
            // What the OS had written of the page cache when it died: a piece of a line.
            let rest = &all[len..];
            let next_line_end = rest.iter().position(|&b| b == b'\n').map_or(0, |p| p);
            data.clear();
            data.extend_from_slice(&all[..len + torn.min(next_line_end)]);
        }
        let torn_bytes = disk.files.get(&file).map_or(0, |(d, _)| d.len()) - len;
        let (w2, id, _) = load_into_new_world(&case, disk, &sid, true);
        let r = w2.response(id).cloned().unwrap_or_default();
        prop_assert_eq!(&r["result"]["configOptions"][0]["id"], "model", "{}", r);
        let got = w2.agent.session_state_for_tests(&sid);
        prop_assert_eq!(got.as_ref(), Some(&want));
        if let Some(got) = &got {
            if let Err(e) = check_paired(&got["messages"]) {
                prop_assert!(false, "{}", e);
            }
        }
        let warned = w2.logs.iter().any(|l| l.message.contains("torn line"));
        prop_assert_eq!(warned, torn_bytes > 0, "a torn tail is reported, and only then");
        prop_assert_eq!(
            w2.disk.files.get(&file).map(|(d, _)| d.len()),
            Some(len),
            "the torn tail is cut off before anything is appended"
        );
    }

    /// A9 crash safety: a kill -9 of the agent between any two steps (the file as the
    /// appends left it: a step's records are written before its ACP lines reach the client)
    /// loses nothing the client saw finish: every tool call the client saw completed or
    /// failed is replayed so after a load, and every answered prompt has its `turn_end`. Only
    /// the round in flight is lost (its running calls replay as failed).
    #[test]
    fn a9_a_kill_between_any_two_steps_keeps_every_result_and_answer_the_client_saw(
        case in case(), at in any::<prop::sample::Index>(),
    ) {
        let w = run_world(&case, build_with(&case, store_config()), false);
        let sid = w.session.clone().unwrap_or_default();
        let file = format!("{sid}.jsonl");
        // The steps after the file was created (before, a kill loses no record: none exists).
        let kills: Vec<(usize, usize)> = w
            .disk_after_steps
            .iter()
            .filter_map(|(seen, lens)| Some((*seen, *lens.get(&file).filter(|&&l| l > 0)?)))
            .collect();
        if kills.is_empty() {
            return Ok(());
        }
        let (seen, len) = *at.get(&kills);
        let mut disk = w.disk.clone();
        if let Some((data, _)) = disk.files.get_mut(&file) {
            data.truncate(len);
        }
        let finals = |updates: &[Value]| -> BTreeMap<String, String> {
            updates
                .iter()
                .filter(|u| u["sessionUpdate"] == "tool_call_update")
                .filter_map(|u| {
                    let status = u["status"].as_str()?;
                    matches!(status, "completed" | "failed")
                        .then(|| (u["toolCallId"].as_str().unwrap_or("").to_owned(), status.to_owned()))
                })
                .collect()
        };
        let client_saw: Vec<Value> = w.acp_out[..seen]
            .iter()
            .map(|(_, v)| v)
            .filter(|v| v["method"] == "session/update" && v["params"]["sessionId"] == sid.as_str())
            .map(|v| v["params"]["update"].clone())
            .collect();
        let answers = w.acp_out[..seen]
            .iter()
            .filter(|(_, v)| v.get("method").is_none() && v["result"]["stopReason"].is_string())
            .count();
        let (w2, id, from) = load_into_new_world(&case, disk.clone(), &sid, true);
        let r = w2.response(id).cloned().unwrap_or_default();
        prop_assert_eq!(&r["result"]["configOptions"][0]["id"], "model", "{}", r);
        let replayed = finals(&w2.updates_since(from, &sid));
        for (call, status) in finals(&client_saw) {
            prop_assert_eq!(
                replayed.get(&call), Some(&status),
                "{} was seen {} before the kill: {}", call, status, disk.text(&file)
            );
        }
        let turn_ends = disk.text(&file).lines().filter(|l| l.contains(r#""type":"turn_end""#)).count();
        prop_assert!(turn_ends >= answers, "{} answers seen, {} turn_end records", answers, turn_ends);
    }

    /// A9 crash safety: a file cut at any byte (a kill -9 at any moment, mid-round included)
    /// loads, never fails, and gives a history every provider accepts: every tool call paired
    /// (I9), calls left running closed with an error result.
    #[test]
    fn a9_a_transcript_cut_at_any_byte_loads_a_valid_history(
        case in case(), at in any::<prop::sample::Index>(),
    ) {
        let w = run_world(&case, build_with(&case, store_config()), false);
        let sid = w.session.clone().unwrap_or_default();
        let file = format!("{sid}.jsonl");
        let mut disk = w.disk.clone();
        let Some((data, _)) = disk.files.get_mut(&file) else {
            return Ok(());
        };
        let cut = at.index(data.len() + 1);
        data.truncate(cut);
        let (w2, id, _) = load_into_new_world(&case, disk, &sid, true);
        let r = w2.response(id).cloned().unwrap_or_default();
        prop_assert_eq!(&r["result"]["configOptions"][0]["id"], "model", "{}\n{}", r, w2.transcript_text());
        let got = w2.agent.session_state_for_tests(&sid).unwrap_or_default();
        if let Err(e) = check_paired(&got["messages"]) {
            prop_assert!(false, "{}\n{}", e, w.disk.text(&file));
        }
    }
}
