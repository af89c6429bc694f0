//! Differential test (issue #6): the same scripted session against `buzz-agent-smol` and its
//! sibling `buzz-agent` (tokio) gives the same ACP transcript and the same LLM requests. See
//! `buzz_agent_e2e::differential`.
fn main() {
    buzz_agent_e2e::differential::main(env!("CARGO_BIN_EXE_buzz-agent-smol"), "buzz-agent");
}
