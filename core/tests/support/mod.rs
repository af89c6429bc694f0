//! The core's simulated world for its integration tests: the one world of the core,
//! `buzz_agent_core::fuzzing::world` (also driven by the `session` fuzz target), re-exported so
//! each test file says `mod support;` and uses its names. See that module's docs: the peers it
//! plays, the drain rule, the checks run after every step (T1, L3b, I1, I7–I11) and I12.
#![allow(unused_imports, reason = "each test file uses a subset")]

pub use buzz_agent_core::fuzzing::world::*;
