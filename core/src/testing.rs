//! Internals the core's own tests check directly (feature `testing`, enabled by the core's
//! dev-dependency on itself; the runtimes never enable it). Not a stable API.
//!
//! - [`Config::for_tests`](crate::Config::for_tests) builds a valid configuration without an
//!   environment.
//! - The pure compaction functions (SPEC K1, H6), checked by `tests/compaction_props.rs`.
//! - The conversation types they work on.
//! - The response-size limits of an LLM attempt (SPEC A3, C52), checked by
//!   `tests/reliability.rs`.

pub use crate::compaction::{threshold, truncate, units};
pub use crate::hooks::{HookPoint, injection_pair};
pub use crate::llm::{Message, ToolCall};
pub use crate::llm_call::{ERROR_BODY_CAP, MAX_RESPONSE_BODY_BYTES};
