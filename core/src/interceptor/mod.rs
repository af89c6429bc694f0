//! SEP-2624 interceptors (SPEC X1, experimental, opt-in with `BUZZ_AGENT_INTERCEPTOR_SERVERS`):
//! policy gates that validate or rewrite a model tool call before it runs and its result before
//! anyone sees it. Unlike hooks they fail **closed** by default.
//!
//! Three pure pieces, none of which knows the agent:
//! - [`wire`]: the wire types and codec of `interceptors/list` and `interceptor/invoke`, in the
//!   working group's conformance-suite shape (`hooks: [{events, phase}]`);
//! - [`chain`]: the chain executor, a sans-IO sub-machine ([`chain::Chain`]) that orders the
//!   invocations, takes their replies and deadlines as inputs and resolves to a
//!   [`chain::Verdict`];
//! - [`example_server`]: the request handling of the bundled example interceptor server (the
//!   conformance suite's behaviour vocabulary), request in, response out.
//!
//! The agent runs them on its tool-call path through `intercept.rs` (a chain per phase of each
//! model tool call, its invocations sent through the server table) and lists them when a session
//! opens (`lifecycle.rs`); see `docs/interceptors.md`.
#![deny(missing_docs)]

pub mod chain;
pub mod example_server;
mod set;
pub mod wire;

pub use chain::{
    Chain, ChainOutput, ChainRequest, Denial, DenialCause, Failure, Invocation, InvocationId,
    InvokeReply, Member, Verdict,
};
pub(crate) use set::Interceptors;
pub use wire::{Interceptor, InterceptorType, InvokeResult, Mode, Phase, Severity};
