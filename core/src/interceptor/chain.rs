//! The SEP-2624 chain executor as a pure sub-machine (SPEC X1; SEP-2624 §4.3).
//!
//! A [`Chain`] runs ONE lifecycle event (e.g. `tools/call`) on ONE phase over the interceptors
//! that hook it, and resolves to a [`Verdict`]: allow with the final payload, or deny with the
//! reasons. It owns its state and its deadlines, asks for IO through [`ChainOutput`]s and
//! learns what happened through [`Chain::handle_reply`] and [`Chain::handle_timeout`]. It never
//! reads a clock: `now` is an argument. The drain rule is the agent's: after `start` or any
//! `handle_*`, call [`Chain::poll_output`] until `None`, then read [`Chain::poll_timeout`].
//!
//! Order (trust-boundary aware, SEP-2624 §4.3.1):
//! - request phase: mutators one at a time, by `priorityHint` for that phase (lower first), ties
//!   by name (byte order), remaining ties in member order; then every validator at once, over
//!   the mutated payload;
//! - response phase: every validator at once over the raw payload, then the mutators.
//!
//! Decisions:
//! - a validator in `enforce` mode that answers `valid: false` with severity `error` denies;
//!   the chain still waits for the other validators (bounded by their deadlines) so that the
//!   verdict lists every denial, in member order, whatever order the replies arrived in;
//! - a mutator in `enforce` mode that answers `modified: true` replaces the payload the next
//!   interceptor sees and the verdict carries;
//! - `audit` mode never blocks and never applies: a would-be denial or change is logged at
//!   `info` and nothing else happens;
//! - a failure (JSON-RPC error, malformed result, lost server, timeout) of an `enforce`
//!   interceptor denies when `failOpen` is false (the default) and is logged and skipped when
//!   it is true; an `audit` interceptor's failure is only logged (`error` level when fail-closed,
//!   `warn` when fail-open, per SEP-2624 §4.1.1). A failed mutator in a denying chain stops the
//!   chain: no later interceptor is invoked.
//! - each invocation has its own deadline, `timeout_ms` after it was started (the agent passes
//!   `BUZZ_AGENT_HOOK_TIMEOUT_MS`); a timed-out invocation is reported as
//!   [`ChainOutput::Abandon`] so the parent can send `notifications/cancelled` and count the
//!   timeout against the server (H4's kill rule lives with the server table, not here). A reply
//!   that arrives after its deadline, or after the verdict, is inert.

use super::wire::{
    Interceptor, InterceptorType, InvokeParams, InvokeResult, Mode, Phase, ValidationMessage,
    WireError,
};
use crate::config::LogLevel;
use crate::io::LogRecord;
use crate::jsonrpc::RpcError;
use crate::time::MonoTime;
use serde_json::Value;
use std::collections::VecDeque;
use std::fmt;

/// An interceptor as offered by one interceptor server (the `name` from `session/new`).
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The interceptor server's name.
    pub server: String,
    /// Its descriptor from `interceptors/list`.
    pub interceptor: Interceptor,
}

/// What to run a chain on.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainRequest {
    /// The lifecycle event, e.g. `tools/call`.
    pub event: String,
    /// The phase.
    pub phase: Phase,
    /// The payload (for `tools/call`: `{name, arguments}` on the request phase, the
    /// `CallToolResult` on the response phase).
    pub payload: Value,
    /// Deadline of each invocation after it starts, in milliseconds; also sent to the server
    /// as the `timeoutMs` hint.
    pub timeout_ms: u64,
    /// Optional `context` object sent with every invocation (e.g. `{"sessionId": …}`).
    pub context: Option<Value>,
}

/// One invocation of a chain: an index into the chain's selected members. `Display`: `icpt#3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InvocationId(pub u32);

impl fmt::Display for InvocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "icpt#{}", self.0)
    }
}

/// An `interceptor/invoke` request the parent must send to `server`.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// Which invocation this is; give it back to [`Chain::handle_reply`].
    pub id: InvocationId,
    /// The interceptor server to send it to.
    pub server: String,
    /// The interceptor's name.
    pub interceptor: String,
    /// The `interceptor/invoke` params object.
    pub params: Value,
    /// When the chain gives up on it.
    pub deadline: MonoTime,
}

/// What came back for an invocation.
#[derive(Debug, Clone, PartialEq)]
pub enum InvokeReply {
    /// A JSON-RPC `result` (read with [`InvokeResult::from_value`]; malformed = failure).
    Result(Value),
    /// A JSON-RPC `error` (a crashing handler, an unknown name, …).
    Error(RpcError),
    /// No reply will come: the server is dead, not ready, or its stdin is closed. The text
    /// says why, for logs and the denial.
    Lost(String),
}

/// Why an invocation failed. A failure denies unless the interceptor is `failOpen` or `audit`.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The server answered with a JSON-RPC error.
    Error(RpcError),
    /// The result could not be read, or has the other interceptor type.
    Malformed(WireError),
    /// No reply will come (see [`InvokeReply::Lost`]).
    Lost(String),
    /// No reply within the deadline.
    TimedOut {
        /// The deadline that passed, in milliseconds.
        after_ms: u64,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(e) => write!(f, "error: {e}"),
            Failure::Malformed(w) => write!(f, "malformed result: {w}"),
            Failure::Lost(why) => write!(f, "{why}"),
            Failure::TimedOut { after_ms } => write!(f, "timed out after {after_ms} ms"),
        }
    }
}

/// Why an interceptor denied.
#[derive(Debug, Clone, PartialEq)]
pub enum DenialCause {
    /// It answered `valid: false` with severity `error`; its messages.
    Invalid(Vec<ValidationMessage>),
    /// It failed and is fail-closed.
    Failed(Failure),
}

/// One denial of a [`Verdict::Deny`].
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    /// The interceptor server.
    pub server: String,
    /// The interceptor's name.
    pub interceptor: String,
    /// Why.
    pub cause: DenialCause,
}

impl Denial {
    /// The text the model and the client see, e.g.
    /// `blocked by interceptor 'conf/deny-all': denied by policy` or
    /// `blocked: interceptor 'guard' failed (timed out after 2500 ms) and fails closed`.
    /// Messages of one validator are joined with `; `.
    #[must_use]
    pub fn text(&self) -> String {
        match &self.cause {
            DenialCause::Invalid(messages) => {
                let texts: Vec<&str> = messages
                    .iter()
                    .map(|m| m.message.trim())
                    .filter(|m| !m.is_empty())
                    .collect();
                if texts.is_empty() {
                    format!(
                        "blocked by interceptor '{}' (no reason given)",
                        self.interceptor
                    )
                } else {
                    format!(
                        "blocked by interceptor '{}': {}",
                        self.interceptor,
                        texts.join("; ")
                    )
                }
            }
            DenialCause::Failed(failure) => format!(
                "blocked: interceptor '{}' failed ({failure}) and fails closed",
                self.interceptor
            ),
        }
    }
}

/// How a chain resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The operation proceeds with `payload` (the input payload when nothing was applied).
    Allow {
        /// The payload after the applied (`enforce`) mutations.
        payload: Value,
        /// Whether an applied mutation changed it.
        modified: bool,
    },
    /// The operation is blocked.
    Deny {
        /// Every denial, in member order (at least one).
        denials: Vec<Denial>,
    },
}

impl Verdict {
    /// Whether the operation proceeds.
    #[must_use]
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow { .. })
    }

    /// The denial texts joined with newlines (see [`Denial::text`]); `None` for an allow.
    #[must_use]
    pub fn denial_text(&self) -> Option<String> {
        match self {
            Verdict::Allow { .. } => None,
            Verdict::Deny { denials } => Some(
                denials
                    .iter()
                    .map(Denial::text)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        }
    }
}

/// A timed-out invocation the chain gave up on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abandoned {
    /// Which invocation.
    pub id: InvocationId,
    /// The server it was sent to (count a timeout against it, H4).
    pub server: String,
    /// The interceptor's name.
    pub interceptor: String,
}

/// What the chain wants done, drained with [`Chain::poll_output`].
#[derive(Debug, Clone, PartialEq)]
pub enum ChainOutput {
    /// Send `interceptor/invoke` to a server and report the reply with
    /// [`Chain::handle_reply`].
    Invoke(Invocation),
    /// The invocation's deadline passed: send `notifications/cancelled` for it and count a
    /// hook timeout against the server (H4). Its reply, if one comes, is inert.
    Abandon(Abandoned),
    /// A log line (audit records, failures, non-blocking findings, the verdict summary).
    Log(LogRecord),
    /// The verdict; always the last output of a chain, emitted exactly once.
    Decided(Verdict),
}

/// Whether any member hooks `event` on `phase`, so the parent can skip building a chain.
#[must_use]
pub fn hooks_event(members: &[Member], event: &str, phase: Phase) -> bool {
    members
        .iter()
        .any(|m| m.interceptor.hooks_event(event, phase))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Mutate,
    Validate,
}

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Waiting,
    InFlight {
        deadline: MonoTime,
    },
    /// A mutator's outcome, already applied (its payload is not kept twice).
    Applied,
    /// A validator's outcome, evaluated once every validator is done.
    Done(Result<InvokeResult, Failure>),
}

/// One chain execution (see the module docs). Sizes: one entry per selected member.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    event: String,
    phase: Phase,
    timeout_ms: u64,
    context: Option<Value>,
    started: MonoTime,
    /// The selected members, in the order given (registration order).
    members: Vec<Member>,
    /// Parallel to `members`.
    calls: Vec<Call>,
    /// Indices into `members`, in execution order.
    mutators: Vec<usize>,
    /// Indices into `members`, in member order.
    validators: Vec<usize>,
    steps: [Step; 2],
    step: usize,
    next_mutator: usize,
    validators_launched: bool,
    payload: Value,
    modified: bool,
    denials: Vec<Denial>,
    decided: bool,
    out: VecDeque<ChainOutput>,
}

impl Chain {
    /// Starts a chain over the `members` that hook `request.event` on `request.phase` (others
    /// are ignored). The first invocations (or, with no selected member, the allow verdict)
    /// are ready in [`Chain::poll_output`].
    #[must_use]
    pub fn start(members: &[Member], request: ChainRequest, now: MonoTime) -> Chain {
        let ChainRequest {
            event,
            phase,
            payload,
            timeout_ms,
            context,
        } = request;
        let selected: Vec<Member> = members
            .iter()
            .filter(|m| m.interceptor.hooks_event(&event, phase))
            .cloned()
            .collect();
        let of_kind = |kind: InterceptorType| -> Vec<usize> {
            selected
                .iter()
                .enumerate()
                .filter(|(_, m)| m.interceptor.kind == kind)
                .map(|(i, _)| i)
                .collect()
        };
        let mut mutators = of_kind(InterceptorType::Mutation);
        // Stable: equal (priority, name) keep member order.
        mutators.sort_by(|&a, &b| {
            let key = |i: usize| {
                selected
                    .get(i)
                    .map(|m| (m.interceptor.priority(phase), m.interceptor.name.as_str()))
            };
            key(a).cmp(&key(b))
        });
        let validators = of_kind(InterceptorType::Validation);
        let steps = match phase {
            Phase::Request => [Step::Mutate, Step::Validate],
            Phase::Response => [Step::Validate, Step::Mutate],
        };
        let mut chain = Chain {
            event,
            phase,
            timeout_ms,
            context,
            started: now,
            calls: vec![Call::Waiting; selected.len()],
            members: selected,
            mutators,
            validators,
            steps,
            step: 0,
            next_mutator: 0,
            validators_launched: false,
            payload,
            modified: false,
            denials: Vec::new(),
            decided: false,
            out: VecDeque::new(),
        };
        chain.advance(now);
        chain
    }

    /// The next thing to do, `None` when there is nothing until the next input or deadline.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<ChainOutput> {
        self.out.pop_front()
    }

    /// The earliest deadline of an invocation in flight; `None` when nothing is in flight
    /// (and always `None` after the verdict).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<MonoTime> {
        if self.decided {
            return None;
        }
        self.calls
            .iter()
            .filter_map(|c| match c {
                Call::InFlight { deadline } => Some(*deadline),
                Call::Waiting | Call::Applied | Call::Done(_) => None,
            })
            .min()
    }

    /// Whether the verdict has been emitted.
    #[must_use]
    pub fn is_decided(&self) -> bool {
        self.decided
    }

    /// The invocations in flight (sent, not answered, not timed out), in member order; e.g. to
    /// send `notifications/cancelled` for them when the parent drops the chain.
    #[must_use]
    pub fn in_flight(&self) -> Vec<InvocationId> {
        self.calls
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Call::InFlight { .. }))
            .filter_map(|(i, _)| u32::try_from(i).ok().map(InvocationId))
            .collect()
    }

    /// Reports what came back for invocation `id`. Returns `false`, changing nothing, when the
    /// reply is inert: unknown id, not in flight (already answered or timed out), or the chain
    /// is decided.
    pub fn handle_reply(&mut self, id: InvocationId, reply: InvokeReply, now: MonoTime) -> bool {
        let idx = id.0 as usize;
        if self.decided || !matches!(self.calls.get(idx), Some(Call::InFlight { .. })) {
            return false;
        }
        let outcome = match reply {
            InvokeReply::Result(v) => self.read_result(idx, &v),
            InvokeReply::Error(e) => Err(Failure::Error(e)),
            InvokeReply::Lost(why) => Err(Failure::Lost(why)),
        };
        self.settle(idx, outcome, now);
        self.advance(now);
        true
    }

    /// Fires the deadlines due at or before `now`: each such invocation is abandoned
    /// ([`ChainOutput::Abandon`]) and counts as a timeout failure.
    pub fn handle_timeout(&mut self, now: MonoTime) {
        if self.decided {
            return;
        }
        let due: Vec<usize> = self
            .calls
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Call::InFlight { deadline } if *deadline <= now))
            .map(|(i, _)| i)
            .collect();
        if due.is_empty() {
            return;
        }
        for idx in due {
            if let (Some(m), Ok(n)) = (self.members.get(idx), u32::try_from(idx)) {
                self.out.push_back(ChainOutput::Abandon(Abandoned {
                    id: InvocationId(n),
                    server: m.server.clone(),
                    interceptor: m.interceptor.name.clone(),
                }));
            }
            let after_ms = self.timeout_ms;
            self.settle(idx, Err(Failure::TimedOut { after_ms }), now);
        }
        self.advance(now);
    }

    /// The parent's own deadline for invocation `id` passed (a parent that keeps each
    /// invocation's deadline in its own timer table, as the agent does, reports them one by
    /// one): it counts as a timeout failure, as in [`Chain::handle_timeout`], but no
    /// [`ChainOutput::Abandon`] is emitted (the parent already abandoned the request). Returns
    /// `false`, changing nothing, when `id` is not in flight or the chain is decided.
    pub fn time_out(&mut self, id: InvocationId, now: MonoTime) -> bool {
        let idx = id.0 as usize;
        if self.decided || !matches!(self.calls.get(idx), Some(Call::InFlight { .. })) {
            return false;
        }
        let after_ms = self.timeout_ms;
        self.settle(idx, Err(Failure::TimedOut { after_ms }), now);
        self.advance(now);
        true
    }

    fn read_result(&self, idx: usize, v: &Value) -> Result<InvokeResult, Failure> {
        let result = InvokeResult::from_value(v, self.phase).map_err(Failure::Malformed)?;
        let expected = self.members.get(idx).map(|m| m.interceptor.kind);
        if Some(result.kind()) != expected {
            let want = expected.map_or("?", InterceptorType::as_str);
            return Err(Failure::Malformed(WireError(format!(
                "a {want} interceptor answered with a {} result",
                result.kind().as_str()
            ))));
        }
        Ok(result)
    }

    /// Runs the steps as far as the replies allow.
    fn advance(&mut self, now: MonoTime) {
        while !self.decided {
            match self.steps.get(self.step).copied() {
                None => {
                    self.decide(now);
                    return;
                }
                Some(Step::Mutate) => {
                    if !self.denials.is_empty() {
                        self.decide(now);
                        return;
                    }
                    let Some(&idx) = self.mutators.get(self.next_mutator) else {
                        self.step += 1;
                        continue;
                    };
                    match self.calls.get(idx) {
                        Some(Call::Waiting) => {
                            self.launch(idx, now);
                            return;
                        }
                        Some(Call::InFlight { .. }) => return,
                        Some(Call::Applied | Call::Done(_)) | None => self.next_mutator += 1,
                    }
                }
                Some(Step::Validate) => {
                    if !self.validators_launched {
                        self.validators_launched = true;
                        for idx in self.validators.clone() {
                            self.launch(idx, now);
                        }
                    }
                    let pending = self
                        .validators
                        .iter()
                        .any(|&i| !matches!(self.calls.get(i), Some(Call::Done(_)) | None));
                    if pending {
                        return;
                    }
                    self.evaluate_validators(now);
                    if !self.denials.is_empty() {
                        self.decide(now);
                        return;
                    }
                    self.step += 1;
                }
            }
        }
    }

    fn launch(&mut self, idx: usize, now: MonoTime) {
        let (Some(member), Some(call), Ok(n)) = (
            self.members.get(idx),
            self.calls.get_mut(idx),
            u32::try_from(idx),
        ) else {
            return;
        };
        let deadline = now.plus_ms(self.timeout_ms);
        *call = Call::InFlight { deadline };
        let params = InvokeParams {
            name: member.interceptor.name.clone(),
            event: self.event.clone(),
            phase: self.phase,
            payload: self.payload.clone(),
            config: None,
            timeout_ms: Some(self.timeout_ms),
            context: self.context.clone(),
        };
        self.out.push_back(ChainOutput::Invoke(Invocation {
            id: InvocationId(n),
            server: member.server.clone(),
            interceptor: member.interceptor.name.clone(),
            params: params.to_value(),
            deadline,
        }));
    }

    /// Records an outcome. A mutator's outcome takes effect here (mutators run one at a time);
    /// validators are evaluated together, in member order, once all are done.
    fn settle(&mut self, idx: usize, outcome: Result<InvokeResult, Failure>, now: MonoTime) {
        let Some(member) = self.members.get(idx).cloned() else {
            return;
        };
        let settled = match member.interceptor.kind {
            InterceptorType::Mutation => {
                self.apply_mutation(&member, outcome, now);
                Call::Applied
            }
            InterceptorType::Validation => Call::Done(outcome),
        };
        if let Some(call) = self.calls.get_mut(idx) {
            *call = settled;
        }
    }

    fn apply_mutation(
        &mut self,
        member: &Member,
        outcome: Result<InvokeResult, Failure>,
        now: MonoTime,
    ) {
        let audit = member.interceptor.mode == Mode::Audit;
        match outcome {
            Ok(InvokeResult::Mutation(r)) if r.modified => {
                if audit {
                    let size = r.payload.to_string().len();
                    self.log(now, LogLevel::Info, member, &format!(
                        "audit: would modify the payload ({size} bytes after the change; not applied)"
                    ));
                } else {
                    self.payload = r.payload;
                    self.modified = true;
                    self.log(now, LogLevel::Debug, member, "modified the payload");
                }
            }
            Ok(InvokeResult::Mutation(_)) => {
                self.log(now, LogLevel::Debug, member, "left the payload unchanged");
            }
            Ok(InvokeResult::Validation(_)) => {}
            Err(failure) => self.fail(member, failure, now),
        }
    }

    fn evaluate_validators(&mut self, now: MonoTime) {
        for idx in self.validators.clone() {
            let (Some(member), Some(Call::Done(outcome))) =
                (self.members.get(idx).cloned(), self.calls.get(idx).cloned())
            else {
                continue;
            };
            let audit = member.interceptor.mode == Mode::Audit;
            match outcome {
                Ok(InvokeResult::Validation(r)) => {
                    let texts = join_messages(&r.messages);
                    if r.blocks() && audit {
                        self.log(
                            now,
                            LogLevel::Info,
                            &member,
                            &format!("audit: would deny: {texts}"),
                        );
                    } else if r.blocks() {
                        self.log(now, LogLevel::Info, &member, &format!("denied: {texts}"));
                        self.denials.push(Denial {
                            server: member.server.clone(),
                            interceptor: member.interceptor.name.clone(),
                            cause: DenialCause::Invalid(r.messages),
                        });
                    } else if !r.valid {
                        let sev = r.severity.map_or("unknown", |s| s.as_str());
                        self.log(
                            now,
                            LogLevel::Warn,
                            &member,
                            &format!("reported invalid ({sev}; does not block): {texts}"),
                        );
                    } else if !r.messages.is_empty() {
                        self.log(now, LogLevel::Debug, &member, &format!("valid: {texts}"));
                    }
                }
                Ok(InvokeResult::Mutation(_)) => {}
                Err(failure) => self.fail(&member, failure, now),
            }
        }
    }

    /// A failed invocation: deny (enforce, fail-closed) or log and go on.
    fn fail(&mut self, member: &Member, failure: Failure, now: MonoTime) {
        let i = &member.interceptor;
        match (i.mode, i.fail_open) {
            (Mode::Enforce, false) => {
                self.log(
                    now,
                    LogLevel::Warn,
                    member,
                    &format!("failed ({failure}); fail-closed, denying"),
                );
                self.denials.push(Denial {
                    server: member.server.clone(),
                    interceptor: i.name.clone(),
                    cause: DenialCause::Failed(failure),
                });
            }
            (Mode::Enforce, true) => self.log(
                now,
                LogLevel::Warn,
                member,
                &format!("failed ({failure}); fail-open, continuing"),
            ),
            (Mode::Audit, fail_open) => {
                let level = if fail_open {
                    LogLevel::Warn
                } else {
                    LogLevel::Error
                };
                self.log(
                    now,
                    level,
                    member,
                    &format!("audit: failed ({failure}); audit never blocks"),
                );
            }
        }
    }

    fn decide(&mut self, now: MonoTime) {
        self.decided = true;
        let ms = now.ms_since(self.started);
        let n = self.members.len();
        let verdict = if self.denials.is_empty() {
            let changed = if self.modified {
                ", payload modified"
            } else {
                ""
            };
            self.summary(
                now,
                LogLevel::Debug,
                &format!("allow ({n} interceptors{changed}, {ms} ms)"),
            );
            Verdict::Allow {
                payload: std::mem::take(&mut self.payload),
                modified: self.modified,
            }
        } else {
            let names: Vec<String> = self
                .denials
                .iter()
                .map(|d| format!("'{}'", d.interceptor))
                .collect();
            self.summary(
                now,
                LogLevel::Info,
                &format!("deny by {} ({n} interceptors, {ms} ms)", names.join(", ")),
            );
            Verdict::Deny {
                denials: std::mem::take(&mut self.denials),
            }
        };
        self.out.push_back(ChainOutput::Decided(verdict));
    }

    fn log(&mut self, now: MonoTime, level: LogLevel, member: &Member, what: &str) {
        let message = format!(
            "interceptor {} {}: '{}' (server '{}') {what}",
            self.event,
            self.phase.as_str(),
            member.interceptor.name,
            member.server
        );
        self.out.push_back(ChainOutput::Log(LogRecord {
            level,
            at: now,
            message,
        }));
    }

    fn summary(&mut self, now: MonoTime, level: LogLevel, what: &str) {
        let message = format!("interceptor {} {}: {what}", self.event, self.phase.as_str());
        self.out.push_back(ChainOutput::Log(LogRecord {
            level,
            at: now,
            message,
        }));
    }
}

fn join_messages(messages: &[ValidationMessage]) -> String {
    let texts: Vec<&str> = messages.iter().map(|m| m.message.as_str()).collect();
    if texts.is_empty() {
        "(no message)".to_owned()
    } else {
        texts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptor::wire::{Hook, PriorityHint, Severity, TOOLS_CALL};
    use proptest::prelude::*;
    use serde_json::json;

    const T0: MonoTime = MonoTime::ZERO;
    const TIMEOUT: u64 = 2500;

    fn member(server: &str, name: &str, kind: InterceptorType, events: &[&str]) -> Member {
        let events: Vec<String> = events.iter().map(|e| (*e).to_owned()).collect();
        let hooks = [Phase::Request, Phase::Response]
            .into_iter()
            .map(|phase| Hook {
                events: events.clone(),
                phase,
            })
            .collect();
        Member {
            server: server.to_owned(),
            interceptor: Interceptor::new(name, kind, hooks),
        }
    }

    fn validator(name: &str) -> Member {
        member("policy", name, InterceptorType::Validation, &[TOOLS_CALL])
    }

    fn mutator(name: &str) -> Member {
        member("policy", name, InterceptorType::Mutation, &[TOOLS_CALL])
    }

    fn audit(mut m: Member) -> Member {
        m.interceptor.mode = Mode::Audit;
        m
    }

    fn fail_open(mut m: Member) -> Member {
        m.interceptor.fail_open = true;
        m
    }

    fn priority(mut m: Member, hint: PriorityHint) -> Member {
        m.interceptor.priority_hint = Some(hint);
        m
    }

    fn call_payload() -> Value {
        json!({"name": "shell", "arguments": {"command": "ls"}})
    }

    fn start(members: &[Member], phase: Phase, payload: Value) -> Chain {
        Chain::start(
            members,
            ChainRequest {
                event: TOOLS_CALL.to_owned(),
                phase,
                payload,
                timeout_ms: TIMEOUT,
                context: None,
            },
            T0,
        )
    }

    /// Everything the chain wants done, split by kind.
    #[derive(Debug, Default)]
    struct Drained {
        invokes: Vec<Invocation>,
        abandons: Vec<Abandoned>,
        logs: Vec<LogRecord>,
        verdict: Option<Verdict>,
    }

    fn drain(chain: &mut Chain) -> Drained {
        let mut d = Drained::default();
        while let Some(o) = chain.poll_output() {
            match o {
                ChainOutput::Invoke(i) => d.invokes.push(i),
                ChainOutput::Abandon(a) => d.abandons.push(a),
                ChainOutput::Log(l) => d.logs.push(l),
                ChainOutput::Decided(v) => {
                    assert!(d.verdict.is_none(), "two verdicts");
                    d.verdict = Some(v);
                }
            }
        }
        d
    }

    fn valid(name: &str) -> InvokeReply {
        InvokeReply::Result(
            json!({"interceptor": name, "type": "validation", "phase": "request", "valid": true}),
        )
    }

    fn invalid(name: &str, severity: &str, message: &str) -> InvokeReply {
        InvokeReply::Result(
            json!({"interceptor": name, "type": "validation", "phase": "request",
            "valid": false, "severity": severity,
            "messages": [{"message": message, "severity": severity}]}),
        )
    }

    fn mutated(name: &str, payload: Value) -> InvokeReply {
        InvokeReply::Result(
            json!({"interceptor": name, "type": "mutation", "phase": "request",
            "modified": true, "payload": payload}),
        )
    }

    fn unmodified(name: &str, payload: Value) -> InvokeReply {
        InvokeReply::Result(
            json!({"interceptor": name, "type": "mutation", "phase": "request",
            "modified": false, "payload": payload}),
        )
    }

    /// Runs a chain to its verdict, answering each invocation with `answer(name, params)`;
    /// returns the order interceptors were invoked in (batches of concurrent invocations) and
    /// everything drained.
    fn run(
        chain: &mut Chain,
        mut answer: impl FnMut(&str, &Value) -> InvokeReply,
    ) -> (Vec<Vec<String>>, Drained) {
        let mut batches = Vec::new();
        let mut all = Drained::default();
        let mut d = drain(chain);
        loop {
            all.logs.append(&mut d.logs);
            all.abandons.append(&mut d.abandons);
            if let Some(v) = d.verdict.take() {
                all.verdict = Some(v);
                return (batches, all);
            }
            assert!(!d.invokes.is_empty(), "chain stalled without a verdict");
            batches.push(d.invokes.iter().map(|i| i.interceptor.clone()).collect());
            let invokes = std::mem::take(&mut d.invokes);
            all.invokes.extend(invokes.iter().cloned());
            let mut next = Drained::default();
            for inv in invokes {
                assert!(chain.handle_reply(inv.id, answer(&inv.interceptor, &inv.params), T0));
                let mut more = drain(chain);
                next.invokes.append(&mut more.invokes);
                next.logs.append(&mut more.logs);
                next.abandons.append(&mut more.abandons);
                if more.verdict.is_some() {
                    next.verdict = more.verdict;
                }
            }
            d = next;
        }
    }

    fn names(batches: &[Vec<String>]) -> Vec<Vec<&str>> {
        batches
            .iter()
            .map(|b| b.iter().map(String::as_str).collect())
            .collect()
    }

    fn logs_containing<'a>(d: &'a Drained, needle: &str) -> Vec<&'a LogRecord> {
        d.logs
            .iter()
            .filter(|l| l.message.contains(needle))
            .collect()
    }

    #[test]
    fn x1_time_out_reports_one_invocation_without_an_abandon() {
        let members = [validator("a"), fail_open(validator("b"))];
        let mut chain = start(&members, Phase::Request, call_payload());
        let outs: Vec<ChainOutput> = std::iter::from_fn(|| chain.poll_output()).collect();
        assert_eq!(outs.len(), 2, "both validators at once");
        assert!(chain.time_out(InvocationId(1), T0.plus_ms(10)));
        assert!(!chain.time_out(InvocationId(1), T0.plus_ms(10)), "once");
        assert!(chain.handle_reply(
            InvocationId(0),
            InvokeReply::Result(serde_json::json!({"interceptor": "a", "type": "validation",
                "phase": "request", "valid": true})),
            T0.plus_ms(20)
        ));
        let outs: Vec<ChainOutput> = std::iter::from_fn(|| chain.poll_output()).collect();
        assert!(
            !outs.iter().any(|o| matches!(o, ChainOutput::Abandon(_))),
            "the parent abandoned it: {outs:?}"
        );
        assert!(
            matches!(
                outs.last(),
                Some(ChainOutput::Decided(Verdict::Allow { .. }))
            ),
            "b fails open: {outs:?}"
        );
    }

    #[test]
    fn x1_no_interceptor_hooking_the_event_allows_at_once_with_the_payload_unchanged() {
        let members = [member(
            "p",
            "prompts-only",
            InterceptorType::Validation,
            &["prompts/get"],
        )];
        let mut chain = start(&members, Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert!(d.invokes.is_empty());
        assert_eq!(
            d.verdict,
            Some(Verdict::Allow {
                payload: call_payload(),
                modified: false
            })
        );
        assert!(chain.is_decided());
        assert_eq!(chain.poll_timeout(), None);
        assert!(!hooks_event(&members, TOOLS_CALL, Phase::Request));
    }

    #[test]
    fn x1_request_phase_runs_mutators_one_at_a_time_by_priority_then_name_then_validators_together()
    {
        let members = [
            validator("v-first"),
            mutator("m-b"),
            priority(mutator("m-late"), PriorityHint::Both(10)),
            mutator("m-a"),
            priority(mutator("m-early"), PriorityHint::Both(-5)),
            validator("v-second"),
        ];
        let mut chain = start(&members, Phase::Request, call_payload());
        let (batches, d) = run(&mut chain, |name, params| {
            if name.starts_with("m-") {
                unmodified(name, params["payload"].clone())
            } else {
                valid(name)
            }
        });
        assert_eq!(
            names(&batches),
            vec![
                vec!["m-early"],
                vec!["m-a"],
                vec!["m-b"],
                vec!["m-late"],
                vec!["v-first", "v-second"]
            ]
        );
        assert!(d.verdict.is_some_and(|v| v.is_allow()));
    }

    #[test]
    fn x1_equal_priority_and_name_on_two_servers_keep_registration_order() {
        let mut first = mutator("same");
        first.server = "one".into();
        let mut second = mutator("same");
        second.server = "two".into();
        let mut chain = start(&[first, second], Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert_eq!(d.invokes.len(), 1);
        assert_eq!(d.invokes[0].server, "one");
        assert!(chain.handle_reply(d.invokes[0].id, unmodified("same", call_payload()), T0));
        let d = drain(&mut chain);
        assert_eq!(d.invokes[0].server, "two");
    }

    #[test]
    fn x1_a_per_phase_priority_hint_orders_each_phase_on_its_own() {
        let split = |name: &str| {
            priority(
                mutator(name),
                PriorityHint::PerPhase {
                    request: Some(-1),
                    response: Some(10),
                },
            )
        };
        let members = [mutator("plain"), split("split")];
        for (phase, want) in [
            (Phase::Request, vec![vec!["split"], vec!["plain"]]),
            (Phase::Response, vec![vec!["plain"], vec!["split"]]),
        ] {
            let mut chain = start(&members, phase, call_payload());
            let (batches, _) = run(&mut chain, |n, p| unmodified(n, p["payload"].clone()));
            assert_eq!(names(&batches), want, "{phase:?}");
        }
        // Only `request` given: the response phase uses 0, so the name decides ("a" < "plain").
        let only_request = priority(
            mutator("a"),
            PriorityHint::PerPhase {
                request: Some(5),
                response: None,
            },
        );
        let members = [mutator("plain"), only_request];
        let mut chain = start(&members, Phase::Response, call_payload());
        let (batches, _) = run(&mut chain, |n, p| unmodified(n, p["payload"].clone()));
        assert_eq!(names(&batches), vec![vec!["a"], vec!["plain"]]);
    }

    #[test]
    fn x1_each_mutator_sees_the_previous_change_and_validators_see_the_final_payload() {
        let members = [
            mutator("1-add-flag"),
            mutator("2-rename"),
            validator("check"),
        ];
        let mut seen_by_validator = Value::Null;
        let mut chain = start(&members, Phase::Request, call_payload());
        let (_, d) = run(&mut chain, |name, params| {
            let mut p = params["payload"].clone();
            match name {
                "1-add-flag" => {
                    p["arguments"]["flag"] = json!(true);
                    mutated(name, p)
                }
                "2-rename" => {
                    assert_eq!(p["arguments"]["flag"], json!(true), "saw the first change");
                    p["arguments"]["command"] = json!("ls -la");
                    mutated(name, p)
                }
                _ => {
                    seen_by_validator = p;
                    valid(name)
                }
            }
        });
        let want = json!({"name": "shell", "arguments": {"command": "ls -la", "flag": true}});
        assert_eq!(seen_by_validator, want);
        assert_eq!(
            d.verdict,
            Some(Verdict::Allow {
                payload: want,
                modified: true
            })
        );
    }

    #[test]
    fn x1_response_phase_validates_the_raw_result_before_mutators_run() {
        let members = [mutator("redact"), validator("check")];
        let raw = json!({"content": [{"type": "text", "text": "secret"}]});
        let mut chain = start(&members, Phase::Response, raw.clone());
        let mut validator_saw = Value::Null;
        let (batches, d) = run(&mut chain, |name, params| {
            if name == "check" {
                validator_saw = params["payload"].clone();
                valid(name)
            } else {
                mutated(
                    name,
                    json!({"content": [{"type": "text", "text": "[redacted]"}]}),
                )
            }
        });
        assert_eq!(names(&batches), vec![vec!["check"], vec!["redact"]]);
        assert_eq!(validator_saw, raw);
        assert_eq!(
            d.verdict,
            Some(Verdict::Allow {
                payload: json!({"content": [{"type": "text", "text": "[redacted]"}]}),
                modified: true
            })
        );
    }

    #[test]
    fn x1_a_response_phase_denial_skips_the_mutators() {
        let members = [mutator("redact"), validator("check")];
        let mut chain = start(&members, Phase::Response, json!({"content": []}));
        let (batches, d) = run(&mut chain, |name, _| {
            invalid(name, "error", "leaks a secret")
        });
        assert_eq!(names(&batches), vec![vec!["check"]]);
        assert!(!d.verdict.is_some_and(|v| v.is_allow()));
    }

    #[test]
    fn x1_wildcard_and_namespace_hooks_select_members_and_exact_names_do_not_overmatch() {
        let request_only = Member {
            server: "s".into(),
            interceptor: Interceptor::new(
                "request-only",
                InterceptorType::Validation,
                vec![Hook {
                    events: vec![TOOLS_CALL.into()],
                    phase: Phase::Request,
                }],
            ),
        };
        let members = [
            member("s", "star", InterceptorType::Validation, &["*"]),
            member("s", "tools-ns", InterceptorType::Validation, &["tools/*"]),
            member(
                "s",
                "star-request",
                InterceptorType::Validation,
                &["*/request"],
            ),
            member(
                "s",
                "star-response",
                InterceptorType::Validation,
                &["*/response"],
            ),
            member(
                "s",
                "prompts",
                InterceptorType::Validation,
                &["prompts/get"],
            ),
            member(
                "s",
                "tools-list",
                InterceptorType::Validation,
                &["tools/list"],
            ),
            member("s", "toolsx", InterceptorType::Validation, &["toolsx/*"]),
            request_only,
        ];
        let selected = |phase| {
            let mut chain = start(&members, phase, call_payload());
            let (batches, _) = run(&mut chain, |n, _| valid(n));
            batches.concat()
        };
        assert_eq!(
            selected(Phase::Request),
            vec!["star", "tools-ns", "star-request", "request-only"]
        );
        assert_eq!(
            selected(Phase::Response),
            vec!["star", "tools-ns", "star-response"]
        );
    }

    #[test]
    fn x1_an_enforce_validator_error_denies_with_its_messages() {
        let members = [validator("allow"), validator("deny")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let (_, d) = run(&mut chain, |name, _| {
            if name == "deny" {
                invalid(name, "error", "rm is not allowed")
            } else {
                valid(name)
            }
        });
        let verdict = d.verdict.clone().unwrap();
        let Verdict::Deny { denials } = &verdict else {
            panic!("{verdict:?}")
        };
        assert_eq!(denials.len(), 1);
        assert_eq!(denials[0].interceptor, "deny");
        assert_eq!(denials[0].server, "policy");
        assert_eq!(
            verdict.denial_text().as_deref(),
            Some("blocked by interceptor 'deny': rm is not allowed")
        );
        assert_eq!(logs_containing(&d, "deny by 'deny'").len(), 1);
    }

    #[test]
    fn x1_invalid_with_severity_warn_or_info_does_not_block_but_is_logged() {
        for severity in ["warn", "info"] {
            let mut chain = start(&[validator("soft")], Phase::Request, call_payload());
            let (_, d) = run(&mut chain, |name, _| {
                InvokeReply::Result(
                    json!({"interceptor": name, "type": "validation", "valid": false,
                    "severity": severity,
                    "messages": [{"message": "looks odd", "severity": "warn"}]}),
                )
            });
            assert!(d.verdict.as_ref().unwrap().is_allow(), "{severity:?}");
            let warn = logs_containing(&d, "does not block");
            assert_eq!(warn.len(), 1, "{severity:?}");
            assert_eq!(warn[0].level, LogLevel::Warn);
            assert!(warn[0].message.contains("looks odd"));
        }
    }

    #[test]
    fn s4_invalid_without_a_severity_blocks_and_an_audit_validator_logs_it() {
        for mode in [Mode::Enforce, Mode::Audit] {
            let mut member = validator("vague");
            member.interceptor.mode = mode;
            let mut chain = start(&[member], Phase::Request, call_payload());
            let (_, d) = run(&mut chain, |name, _| {
                InvokeReply::Result(
                    json!({"interceptor": name, "type": "validation", "valid": false,
                    "messages": [{"message": "not sure about this", "severity": "warn"}]}),
                )
            });
            let verdict = d.verdict.clone().unwrap();
            if mode == Mode::Enforce {
                assert_eq!(
                    verdict.denial_text().as_deref(),
                    Some("blocked by interceptor 'vague': not sure about this"),
                    "no severity fails closed"
                );
            } else {
                assert!(verdict.is_allow(), "audit never blocks");
                assert_eq!(logs_containing(&d, "audit: would deny").len(), 1);
            }
        }
    }

    #[test]
    fn x1_denials_are_in_member_order_whatever_order_the_replies_arrive_in() {
        let members = [validator("a"), validator("b"), validator("c")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert_eq!(d.invokes.len(), 3, "validators run concurrently");
        for inv in d.invokes.iter().rev() {
            let reply = match inv.interceptor.as_str() {
                "b" => valid("b"),
                other => invalid(other, "error", &format!("{other} says no")),
            };
            assert!(chain.handle_reply(inv.id, reply, T0));
        }
        let verdict = drain(&mut chain).verdict.unwrap();
        assert_eq!(
            verdict.denial_text().as_deref(),
            Some("blocked by interceptor 'a': a says no\nblocked by interceptor 'c': c says no")
        );
    }

    #[test]
    fn x1_the_chain_waits_for_every_validator_before_deciding() {
        let members = [validator("fast-deny"), validator("slow")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert!(chain.handle_reply(d.invokes[0].id, invalid("fast-deny", "error", "no"), T0));
        assert!(drain(&mut chain).verdict.is_none());
        assert!(!chain.is_decided());
        assert!(chain.handle_reply(d.invokes[1].id, valid("slow"), T0));
        assert!(!drain(&mut chain).verdict.unwrap().is_allow());
    }

    #[test]
    fn x1_an_audit_validator_never_blocks_and_logs_the_denial_it_would_have_made() {
        let mut chain = start(
            &[audit(validator("auditor"))],
            Phase::Request,
            call_payload(),
        );
        let (_, d) = run(&mut chain, |name, _| {
            invalid(name, "error", "denied by policy")
        });
        assert_eq!(
            d.verdict,
            Some(Verdict::Allow {
                payload: call_payload(),
                modified: false
            })
        );
        let records = logs_containing(&d, "audit: would deny: denied by policy");
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].level, LogLevel::Info);
        assert!(records[0].message.contains("'auditor' (server 'policy')"));
    }

    #[test]
    fn x1_an_audit_mutator_is_shadowed_its_change_is_logged_not_applied() {
        let members = [audit(mutator("shadow")), validator("sees")];
        let mut validator_saw = Value::Null;
        let mut chain = start(&members, Phase::Request, call_payload());
        let (_, d) = run(&mut chain, |name, params| {
            if name == "shadow" {
                mutated(
                    name,
                    json!({"name": "shell", "arguments": {"command": "echo hi"}}),
                )
            } else {
                validator_saw = params["payload"].clone();
                valid(name)
            }
        });
        assert_eq!(
            validator_saw,
            call_payload(),
            "the shadow change is not applied"
        );
        assert_eq!(
            d.verdict,
            Some(Verdict::Allow {
                payload: call_payload(),
                modified: false
            })
        );
        assert_eq!(
            logs_containing(&d, "audit: would modify the payload").len(),
            1
        );
    }

    #[test]
    fn x1_a_failing_validator_denies_when_fail_closed_and_is_skipped_when_fail_open() {
        let crash = || InvokeReply::Error(RpcError::new(RpcError::INTERNAL_ERROR, "boom"));
        let lost = || InvokeReply::Lost("the server is dead".into());
        for reply in [crash, lost] {
            let mut chain = start(&[validator("guard")], Phase::Request, call_payload());
            let (_, d) = run(&mut chain, |_, _| reply());
            let verdict = d.verdict.unwrap();
            let text = verdict.denial_text().unwrap();
            assert!(
                text.starts_with("blocked: interceptor 'guard' failed ("),
                "{text}"
            );
            assert!(text.ends_with(") and fails closed"), "{text}");

            let mut chain = start(
                &[fail_open(validator("guard"))],
                Phase::Request,
                call_payload(),
            );
            let (_, d) = run(&mut chain, |_, _| reply());
            assert!(d.verdict.as_ref().unwrap().is_allow());
            assert_eq!(logs_containing(&d, "fail-open, continuing").len(), 1);
        }
    }

    #[test]
    fn x1_a_failing_fail_closed_mutator_stops_the_chain_before_any_later_invocation() {
        let members = [
            mutator("a-breaks"),
            mutator("b-never"),
            validator("never-either"),
        ];
        let mut chain = start(&members, Phase::Request, call_payload());
        let (batches, d) = run(&mut chain, |_, _| {
            InvokeReply::Error(RpcError::new(RpcError::INTERNAL_ERROR, "crashed"))
        });
        assert_eq!(names(&batches), vec![vec!["a-breaks"]]);
        let Some(Verdict::Deny { denials }) = d.verdict else {
            panic!()
        };
        assert!(
            matches!(&denials[0].cause, DenialCause::Failed(Failure::Error(e)) if e.message == "crashed")
        );
    }

    #[test]
    fn x1_a_failing_fail_open_mutator_is_skipped_and_the_payload_kept() {
        let members = [fail_open(mutator("a-breaks")), mutator("b-runs")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let (batches, d) = run(&mut chain, |name, params| {
            if name == "a-breaks" {
                InvokeReply::Lost("server exited".into())
            } else {
                assert_eq!(params["payload"], call_payload());
                unmodified(name, params["payload"].clone())
            }
        });
        assert_eq!(names(&batches), vec![vec!["a-breaks"], vec!["b-runs"]]);
        assert!(d.verdict.as_ref().unwrap().is_allow());
    }

    #[test]
    fn x1_an_audit_failure_never_blocks_and_is_an_error_log_when_fail_closed() {
        for (open, level) in [(false, LogLevel::Error), (true, LogLevel::Warn)] {
            let mut m = audit(validator("auditor"));
            m.interceptor.fail_open = open;
            let mut chain = start(&[m], Phase::Request, call_payload());
            let (_, d) = run(&mut chain, |_, _| InvokeReply::Lost("gone".into()));
            assert!(d.verdict.as_ref().unwrap().is_allow());
            let records = logs_containing(&d, "audit: failed (gone)");
            assert_eq!(records.len(), 1);
            assert_eq!(records[0].level, level);
        }
    }

    #[test]
    fn x1_a_timed_out_invocation_is_abandoned_and_denies_when_fail_closed() {
        let mut chain = start(&[validator("slow")], Phase::Request, call_payload());
        let d = drain(&mut chain);
        let inv = &d.invokes[0];
        assert_eq!(inv.deadline, T0.plus_ms(TIMEOUT));
        assert_eq!(chain.poll_timeout(), Some(T0.plus_ms(TIMEOUT)));
        assert_eq!(chain.in_flight(), vec![inv.id]);

        chain.handle_timeout(T0.plus_ms(TIMEOUT - 1));
        let early = drain(&mut chain);
        assert!(early.abandons.is_empty() && early.verdict.is_none());

        chain.handle_timeout(T0.plus_ms(TIMEOUT));
        let d2 = drain(&mut chain);
        assert_eq!(
            d2.abandons,
            vec![Abandoned {
                id: inv.id,
                server: "policy".into(),
                interceptor: "slow".into()
            }]
        );
        let verdict = d2.verdict.unwrap();
        assert_eq!(
            verdict.denial_text().as_deref(),
            Some("blocked: interceptor 'slow' failed (timed out after 2500 ms) and fails closed")
        );
        assert_eq!(chain.poll_timeout(), None);
        assert!(chain.in_flight().is_empty());
        // The late reply is inert.
        assert!(!chain.handle_reply(inv.id, valid("slow"), T0.plus_ms(TIMEOUT + 1)));
        assert!(drain(&mut chain).verdict.is_none());
    }

    #[test]
    fn x1_a_timed_out_fail_open_interceptor_lets_the_call_through() {
        let members = [fail_open(mutator("slow-mutator")), validator("quick")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert_eq!(d.invokes.len(), 1);
        chain.handle_timeout(T0.plus_ms(TIMEOUT));
        let d2 = drain(&mut chain);
        assert_eq!(d2.abandons.len(), 1);
        // The validator starts after the timeout, with its own deadline from then.
        assert_eq!(d2.invokes.len(), 1);
        assert_eq!(d2.invokes[0].deadline, T0.plus_ms(2 * TIMEOUT));
        assert!(chain.handle_reply(d2.invokes[0].id, valid("quick"), T0.plus_ms(TIMEOUT)));
        assert!(drain(&mut chain).verdict.unwrap().is_allow());
    }

    #[test]
    fn x1_only_the_due_validators_time_out_and_the_others_still_count() {
        let members = [validator("answers"), validator("hangs")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert!(chain.handle_reply(d.invokes[0].id, invalid("answers", "error", "no"), T0));
        chain.handle_timeout(T0.plus_ms(TIMEOUT));
        let Some(Verdict::Deny { denials }) = drain(&mut chain).verdict else {
            panic!()
        };
        let who: Vec<&str> = denials.iter().map(|d| d.interceptor.as_str()).collect();
        assert_eq!(who, vec!["answers", "hangs"]);
    }

    #[test]
    fn x1_malformed_invoke_results_are_failures_of_the_interceptor() {
        let cases: Vec<(Member, Value, &str)> = vec![
            (
                validator("v"),
                json!("ok"),
                "must be an object, got a string",
            ),
            (
                validator("v"),
                json!({"valid": true}),
                "needs a string \"type\"",
            ),
            (
                validator("v"),
                json!({"type": "verdict", "valid": true}),
                "\"type\" must be",
            ),
            (
                validator("v"),
                json!({"type": "mutation", "modified": false}),
                "a validation interceptor answered with a mutation result",
            ),
            (
                validator("v"),
                json!({"type": "validation", "valid": "yes"}),
                "\"valid\" must be a boolean, got a string",
            ),
            (
                validator("v"),
                json!({"type": "validation", "valid": false, "severity": "fatal"}),
                "\"severity\" must be",
            ),
            (
                validator("v"),
                json!({"type": "validation", "valid": true, "phase": "during"}),
                "\"phase\" must be",
            ),
            (
                mutator("m"),
                json!({"type": "mutation", "modified": true}),
                "\"modified\": true but no \"payload\"",
            ),
            (
                mutator("m"),
                json!({"type": "mutation", "payload": {}}),
                "needs a boolean \"modified\"",
            ),
        ];
        for (m, result, want) in cases {
            let mut chain = start(std::slice::from_ref(&m), Phase::Request, call_payload());
            let (_, d) = run(&mut chain, |_, _| InvokeReply::Result(result.clone()));
            let Some(Verdict::Deny { denials }) = d.verdict else {
                panic!("{result} should deny")
            };
            let DenialCause::Failed(Failure::Malformed(e)) = &denials[0].cause else {
                panic!("{result}: {:?}", denials[0].cause)
            };
            assert!(e.0.contains(want), "{result}: {e}");

            let mut chain = start(&[fail_open(m)], Phase::Request, call_payload());
            let (_, d) = run(&mut chain, |_, _| InvokeReply::Result(result.clone()));
            assert!(d.verdict.as_ref().unwrap().is_allow(), "{result} fail-open");
        }
    }

    #[test]
    fn x1_replies_for_unknown_ids_or_after_the_verdict_are_inert() {
        let mut chain = start(&[validator("v")], Phase::Request, call_payload());
        let d = drain(&mut chain);
        assert!(!chain.handle_reply(InvocationId(7), valid("v"), T0));
        assert!(chain.handle_reply(d.invokes[0].id, valid("v"), T0));
        assert!(drain(&mut chain).verdict.is_some());
        assert!(!chain.handle_reply(d.invokes[0].id, invalid("v", "error", "x"), T0));
        chain.handle_timeout(T0.plus_ms(10 * TIMEOUT));
        assert!(chain.poll_output().is_none());
    }

    #[test]
    fn x1_invoke_params_carry_name_event_phase_payload_timeout_and_context() {
        let mut chain = Chain::start(
            &[validator("v")],
            ChainRequest {
                event: TOOLS_CALL.into(),
                phase: Phase::Request,
                payload: call_payload(),
                timeout_ms: 900,
                context: Some(json!({"sessionId": "s1"})),
            },
            MonoTime::ZERO.plus_ms(100),
        );
        let d = drain(&mut chain);
        assert_eq!(
            d.invokes[0].params,
            json!({"name": "v", "event": "tools/call", "phase": "request",
                   "payload": call_payload(), "timeoutMs": 900, "context": {"sessionId": "s1"}})
        );
        assert_eq!(d.invokes[0].deadline, MonoTime::ZERO.plus_ms(1000));
        assert_eq!(d.invokes[0].id.to_string(), "icpt#0");
    }

    #[test]
    fn x1_denial_text_joins_a_validators_messages_and_handles_none() {
        let d = Denial {
            server: "s".into(),
            interceptor: "v".into(),
            cause: DenialCause::Invalid(vec![
                ValidationMessage::new("first", Severity::Error),
                ValidationMessage::new("  ", Severity::Error),
                ValidationMessage::new("second", Severity::Warn),
            ]),
        };
        assert_eq!(d.text(), "blocked by interceptor 'v': first; second");
        let none = Denial {
            cause: DenialCause::Invalid(Vec::new()),
            ..d
        };
        assert_eq!(none.text(), "blocked by interceptor 'v' (no reason given)");
        assert_eq!(
            Verdict::Allow {
                payload: Value::Null,
                modified: false
            }
            .denial_text(),
            None
        );
    }

    proptest! {
        /// I12 for chains: the verdict and the log lines do not depend on the order in which
        /// concurrent validator replies arrive.
        #[test]
        fn x1_validator_reply_order_does_not_change_the_outcome(
            answers in proptest::collection::vec(0u8..4, 1..6),
            order_seed in any::<u64>(),
        ) {
            let members: Vec<Member> = (0..answers.len())
                .map(|i| validator(&format!("v{i}")))
                .collect();
            let reply = |i: usize| match answers[i] {
                0 => valid(&format!("v{i}")),
                1 => invalid(&format!("v{i}"), "error", &format!("no {i}")),
                2 => invalid(&format!("v{i}"), "warn", "hm"),
                _ => InvokeReply::Lost("gone".into()),
            };
            let outcome = |order: Vec<usize>| {
                let mut chain = start(&members, Phase::Request, call_payload());
                let d = drain(&mut chain);
                for i in order {
                    assert!(chain.handle_reply(d.invokes[i].id, reply(i), T0));
                }
                let d = drain(&mut chain);
                (d.verdict, d.logs)
            };
            let forward: Vec<usize> = (0..answers.len()).collect();
            let mut shuffled = forward.clone();
            let mut s = order_seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            let (v1, l1) = outcome(forward);
            let (v2, l2) = outcome(shuffled);
            prop_assert_eq!(&v1, &v2);
            prop_assert_eq!(l1, l2);
            let denies = answers.iter().any(|a| *a == 1 || *a == 3);
            prop_assert_eq!(v1.is_some_and(|v| !v.is_allow()), denies);
        }
    }

    #[test]
    fn x1_hooks_event_finds_a_member_hooking_the_event_on_that_phase() {
        let request_only = Member {
            server: "s".into(),
            interceptor: Interceptor::new(
                "request-only",
                InterceptorType::Validation,
                vec![Hook {
                    events: vec![TOOLS_CALL.into()],
                    phase: Phase::Request,
                }],
            ),
        };
        let members = [request_only];
        assert!(hooks_event(&members, TOOLS_CALL, Phase::Request));
        assert!(!hooks_event(&members, TOOLS_CALL, Phase::Response));
    }

    #[test]
    fn x1_an_unmodified_mutation_result_changes_nothing_whatever_payload_it_carries() {
        let mut chain = start(&[mutator("m")], Phase::Request, call_payload());
        let (_, d) = run(&mut chain, |name, _| {
            unmodified(
                name,
                json!({"name": "shell", "arguments": {"command": "rm"}}),
            )
        });
        assert_eq!(
            d.verdict,
            Some(Verdict::Allow {
                payload: call_payload(),
                modified: false
            })
        );
        assert_eq!(logs_containing(&d, "left the payload unchanged").len(), 1);
    }

    #[test]
    fn x1_a_passing_validator_s_messages_are_logged_at_debug_and_a_bare_pass_is_not() {
        let members = [validator("chatty"), validator("quiet")];
        let mut chain = start(&members, Phase::Request, call_payload());
        let (_, d) = run(&mut chain, |name, _| {
            if name == "chatty" {
                InvokeReply::Result(json!({"type": "validation", "valid": true,
                    "messages": [{"message": "looks fine", "severity": "info"}]}))
            } else {
                valid(name)
            }
        });
        assert!(d.verdict.as_ref().unwrap().is_allow());
        let chatty = logs_containing(&d, "'chatty'");
        assert_eq!(chatty.len(), 1);
        assert_eq!(chatty[0].level, LogLevel::Debug);
        assert!(
            chatty[0].message.ends_with("valid: looks fine"),
            "{chatty:?}"
        );
        assert!(logs_containing(&d, "'quiet'").is_empty(), "{:?}", d.logs);
    }
}
