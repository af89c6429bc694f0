//! Runs the end-to-end suite against any agent binary, e.g. a release build or a snapshot:
//! `BUZZ_AGENT_BIN=target/release/buzz-agent cargo run -p buzz-agent-e2e --example suite -- [filter]`.
//! Takes the same arguments as a libtest binary (`--list`, `--test-threads`, names to filter).
fn main() {
    // The fake MCP role must be checked before anything else reads the environment.
    let bin = std::env::var("BUZZ_AGENT_BIN").unwrap_or_default();
    if bin.is_empty() && std::env::var("BUZZ_E2E_ROLE").is_err() {
        eprintln!("set BUZZ_AGENT_BIN to the agent binary to test");
        std::process::exit(2);
    }
    buzz_agent_e2e::run_suite(&bin);
}
