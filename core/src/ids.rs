//! Typed ids (DESIGN "Ids"): the core allocates them from counters, each has a short `Display`
//! for logs and transcripts, and none can be mistaken for another. Peer ids (JSON-RPC ids of the
//! client and of servers) are not here: they are echoed verbatim as `jsonrpc::RpcId`.

use std::fmt;

/// An ACP session (SPEC A2, A9). Two wire forms, never ambiguous:
///
/// - **random** (every session of a runtime): 127 random bits, shown as `sess_` and 32
///   lower-case hex digits whose first is 8–f (the top bit is always set), e.g.
///   `sess_9f86d081884c7d659a2feaa0c55ad015`. Unique across processes and hosts (SPEC A9): the
///   runtime hands the core 128 random bits at start ([`Config::session_id_seed`]) and the
///   core derives each id from them ([`SessionIds`]).
/// - **counted** (an agent built without a seed: the core's own tests): `sess_N`, N from 1.
///
/// Both forms are safe as file names: `[a-z0-9_]` only.
///
/// [`Config::session_id_seed`]: crate::Config::session_id_seed
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SessionId(pub(crate) u128);

/// The top bit of a random [`SessionId`]; counted ids stay below 2^64.
const RANDOM_ID_BIT: u128 = 1 << 127;

impl SessionId {
    /// The session a client names, if `text` is exactly how we write one (`sess_7`, or `sess_`
    /// and 32 lower-case hex digits starting with 8–f; not `sess_07`, `sess_+7`, `7`, upper
    /// case or `../x`). Other strings name no session, and never a path.
    pub(crate) fn parse(text: &str) -> Option<SessionId> {
        let digits = text.strip_prefix("sess_")?;
        if digits.len() == 32
            && digits
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            let n = u128::from_str_radix(digits, 16).ok()?;
            return (n & RANDOM_ID_BIT != 0).then_some(SessionId(n));
        }
        let n: u64 = digits.parse().ok()?;
        (n.to_string() == digits).then_some(SessionId(u128::from(n)))
    }

    /// The name of its transcript file in the state directory (SPEC A9): `<id>.jsonl`.
    pub(crate) fn file_name(self) -> String {
        format!("{self}.jsonl")
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 & RANDOM_ID_BIT != 0 {
            write!(f, "sess_{:032x}", self.0)
        } else {
            write!(f, "sess_{}", self.0)
        }
    }
}

/// Where new session ids come from: a counter, mixed with the runtime's 128 random bits when
/// there are some (SPEC A9). The same seed gives the same ids in the same order
/// (`BUZZ_AGENT_SEED`, DESIGN I12); different seeds give unrelated ids.
#[derive(Debug, Clone)]
pub(crate) struct SessionIds {
    seed: Option<u128>,
    next: u64,
}

impl SessionIds {
    /// Ids from `seed` (random form), or counted ids without one.
    pub(crate) fn new(seed: Option<u128>) -> SessionIds {
        SessionIds { seed, next: 1 }
    }

    /// The next id.
    pub(crate) fn next_id(&mut self) -> SessionId {
        let n = self.next;
        self.next += 1;
        match self.seed {
            None => SessionId(u128::from(n)),
            Some(seed) => SessionId(permute(seed ^ u128::from(n)) | RANDOM_ID_BIT),
        }
    }
}

/// A bijection of 128-bit values (a four-round Feistel network over the two halves with the
/// SplitMix64 finaliser as round function): distinct counters give distinct outputs, and the
/// outputs of unrelated seeds look unrelated.
fn permute(x: u128) -> u128 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let (mut hi, mut lo) = ((x >> 64) as u64, x as u64);
    for round in 0..4u64 {
        let next = hi ^ mix(lo.wrapping_add(round.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        hi = lo;
        lo = next;
    }
    (u128::from(hi) << 64) | u128::from(lo)
}

/// A session's transcript file as the runtime holds it open (SPEC A9), allocated from a
/// counter (from 1); the runtime keeps `TranscriptId → open file`. Shown as `file#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TranscriptId(pub u64);

impl fmt::Display for TranscriptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file#{}", self.0)
    }
}

/// A loopback listener for OAuth redirects (SPEC M11), numbered per MCP server from 1 (one per
/// authorization); the runtime keeps `(ServerSlot, ListenerId) → socket`. Shown as
/// `redirect#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListenerId(pub u64);

impl fmt::Display for ListenerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redirect#{}", self.0)
    }
}

/// An MCP server of a session: one per `mcpServers` entry of each `session/new`, unique in the
/// process and never reused (a restart keeps the slot and bumps [`ProcKey::generation`]).
/// Shown as `mcp#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerSlot(pub u64);

impl fmt::Display for ServerSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mcp#{}", self.0)
    }
}

/// A process the core asked for. `generation` grows at every (re)spawn of the same server, so
/// bytes or an exit from a killed process can never be mistaken for its restart (DESIGN ids).
/// Shown as `mcp#N.gG`. The core never sees a pid: the runtime keeps `ProcKey → child`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcKey {
    /// The server this process runs.
    pub server: ServerSlot,
    /// 0 for the first spawn, +1 per restart (SPEC M9).
    pub generation: u32,
}

impl fmt::Display for ProcKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mcp#{}.g{}", self.server.0, self.generation)
    }
}

/// One LLM HTTP call (one attempt), allocated from a counter (from 1). Shown as `llm#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LlmCallId(pub u64);

impl fmt::Display for LlmCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "llm#{}", self.0)
    }
}

/// A prompt turn (one `session/prompt`), numbered across the process from 1. Shown as `turn#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TurnNo(pub(crate) u64);

impl fmt::Display for TurnNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "turn#{}", self.0)
    }
}

/// A hook round (SPEC H3), numbered across the process from 1. Shown as `round#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct HookRoundId(pub(crate) u64);

impl fmt::Display for HookRoundId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "round#{}", self.0)
    }
}

/// The JSON-RPC id of a request we sent to one MCP server (per server, from 1; the wire id is
/// the bare number). Shown as `#N`, as in the transcripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct McpRequestId(pub(crate) u64);

impl fmt::Display for McpRequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The JSON-RPC id of a `session/request_permission` we sent to the client (SPEC A7), from 1
/// across the process; the wire id is the bare number. Shown as its number, as in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PermissionRequestId(pub(crate) u64);

impl fmt::Display for PermissionRequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The position of a tool call in the model response that asked for it (from 0; SPEC L2: the
/// results go back in this order). Shown as `call[N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ToolCallIndex(pub(crate) usize);

impl fmt::Display for ToolCallIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call[{}]", self.0)
    }
}

/// The process-wide counters of the ids above that are not owned by one sub-machine (server
/// slots are allocated by the server table, sessions by the agent). Every counter starts at 1.
#[derive(Debug, Clone)]
pub(crate) struct IdCounters {
    turn: u64,
    llm_call: u64,
    hook_round: u64,
    permission: u64,
}

impl Default for IdCounters {
    fn default() -> Self {
        IdCounters {
            turn: 1,
            llm_call: 1,
            hook_round: 1,
            permission: 1,
        }
    }
}

impl IdCounters {
    /// The next prompt turn's number.
    pub(crate) fn next_turn(&mut self) -> TurnNo {
        TurnNo(bump(&mut self.turn))
    }

    /// The next LLM call's id.
    pub(crate) fn next_llm_call(&mut self) -> LlmCallId {
        LlmCallId(bump(&mut self.llm_call))
    }

    /// The next hook round's id.
    pub(crate) fn next_hook_round(&mut self) -> HookRoundId {
        HookRoundId(bump(&mut self.hook_round))
    }

    /// The next permission request's id.
    pub(crate) fn next_permission(&mut self) -> PermissionRequestId {
        PermissionRequestId(bump(&mut self.permission))
    }
}

fn bump(counter: &mut u64) -> u64 {
    let n = *counter;
    *counter += 1;
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a9_random_ids_are_32_hex_digits_distinct_and_reproducible_from_their_seed() {
        let mut a = SessionIds::new(Some(42));
        let ids: Vec<SessionId> = (0..1000).map(|_| a.next_id()).collect();
        let set: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(set.len(), 1000, "distinct within a process");
        let mut b = SessionIds::new(Some(42));
        assert_eq!(b.next_id(), ids[0], "the same seed, the same ids");
        let mut c = SessionIds::new(Some(43));
        assert_ne!(c.next_id(), ids[0]);
        for id in &ids[..20] {
            let text = id.to_string();
            assert_eq!(text.len(), 5 + 32, "{text}");
            assert_eq!(SessionId::parse(&text), Some(*id), "{text} round-trips");
            assert_eq!(id.file_name(), format!("{text}.jsonl"));
        }
        let mut counted = SessionIds::new(None);
        assert_eq!(counted.next_id().to_string(), "sess_1");
    }

    #[test]
    fn a9_i12_the_ids_of_a_seed_are_the_same_in_every_build() {
        // Known answers: a change of the derivation changes the ids a fixed `BUZZ_AGENT_SEED`
        // reproduces (DESIGN I12), so it must be deliberate.
        let mut ids = SessionIds::new(Some(0x0123_4567_89ab_cdef_0011_2233_4455_6677));
        let first: Vec<String> = (0..2).map(|_| ids.next_id().to_string()).collect();
        assert_eq!(
            first,
            [
                "sess_b83fdf4999ec3f1033d39ab811ee3585",
                "sess_a56e7312de0537f43f1c106891f2f227"
            ]
        );
    }

    #[test]
    fn a9_ids_of_neighbouring_counters_and_seeds_look_unrelated() {
        // Avalanche: one input bit flips about half of the 127 random bits.
        let differing = |a: SessionId, b: SessionId| (a.0 ^ b.0).count_ones();
        let mut total = 0;
        for seed in 0..64u128 {
            let mut a = SessionIds::new(Some(seed));
            let mut b = SessionIds::new(Some(seed ^ 1));
            let (a1, a2, b1) = (a.next_id(), a.next_id(), b.next_id());
            for d in [differing(a1, a2), differing(a1, b1)] {
                assert!((24..=104).contains(&d), "seed {seed}: {d} bits differ");
                total += d;
            }
        }
        let mean = f64::from(total) / 128.0;
        assert!((56.0..=71.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn a9_no_path_names_a_session() {
        for other in [
            "../x",
            "sess_../x",
            "sess_/etc/passwd",
            "sess_1/..",
            "sess_0123456789abcdef0123456789abcdef",
            "sess_9F86D081884C7D659A2FEAA0C55AD015",
            "sess_9f86d081884c7d659a2feaa0c55ad01",
            "sess_9f86d081884c7d659a2feaa0c55ad015.jsonl",
        ] {
            assert_eq!(SessionId::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn a2_only_the_exact_wire_form_names_a_session() {
        assert_eq!(SessionId::parse("sess_7"), Some(SessionId(7)));
        assert_eq!(SessionId(7).to_string(), "sess_7");
        for other in [
            "sess_07", "sess_+7", "sess_", "7", "sess_7 ", "SESS_7", "sess_-1",
        ] {
            assert_eq!(SessionId::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn ids_display_short_forms_for_transcripts() {
        let proc = ProcKey {
            server: ServerSlot(3),
            generation: 2,
        };
        assert_eq!(proc.to_string(), "mcp#3.g2");
        assert_eq!(ServerSlot(3).to_string(), "mcp#3");
        assert_eq!(LlmCallId(4).to_string(), "llm#4");
        assert_eq!(TurnNo(5).to_string(), "turn#5");
        assert_eq!(HookRoundId(6).to_string(), "round#6");
        assert_eq!(McpRequestId(7).to_string(), "#7");
        assert_eq!(PermissionRequestId(8).to_string(), "8");
        assert_eq!(ToolCallIndex(0).to_string(), "call[0]");
        assert_eq!(TranscriptId(9).to_string(), "file#9");
    }

    #[test]
    fn counters_start_at_one_and_never_repeat() {
        let mut ids = IdCounters::default();
        assert_eq!(ids.next_turn(), TurnNo(1));
        assert_eq!(ids.next_turn(), TurnNo(2));
        assert_eq!(ids.next_llm_call(), LlmCallId(1));
        assert_eq!(ids.next_hook_round(), HookRoundId(1));
        assert_eq!(ids.next_permission(), PermissionRequestId(1));
        assert_eq!(ids.next_permission(), PermissionRequestId(2));
    }
}
