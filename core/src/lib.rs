//! `buzz-agent-core`: the pure sans-IO state machine of buzz-agent.
//!
//! No clocks, environment, files, processes, threads or async in here (DESIGN.md). Time and
//! randomness come in as inputs; IO is requested as [`Action`]s and observed as [`Input`]s.
//!
//! # The drain rule
//! After any [`Agent::handle`] or [`Agent::handle_timeout`], call [`Agent::poll_action`] until it
//! returns `None`, then read [`Agent::poll_timeout`], then wait for the next input or that time.
#![forbid(unsafe_code)]

pub mod acp;
pub mod agent;
pub mod anthropic;
pub mod compaction;
pub mod config;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod hooks;
pub mod interceptor;
pub mod io;
pub mod jsonrpc;
pub mod llm;
pub mod mcp;
pub mod openai_chat;
pub mod openai_responses;
pub mod provider;
mod request;
pub mod shutdown;
pub mod sse;
mod sse_stream;
pub mod time;
pub mod tools;
pub mod turn;

pub use agent::{Agent, TimerKey};
pub use config::Config;
pub use io::{Action, Input, LlmCallId, LlmIo, LogRecord, ProcKey, Signal, SpawnSpec};
pub use time::MonoTime;
