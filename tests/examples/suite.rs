//! Runs the end-to-end suite against any agent binary, e.g. a release build or a snapshot:
//! `BUZZ_AGENT_BIN=target/release/buzz-agent cargo run -p buzz-agent-e2e --example suite -- [filter]`.
//! Takes the same arguments as a libtest binary (`--list`, `--test-threads`, names to filter).
//! Whether the binary has the `extras` subcommands is read from its `--help`.
fn main() {
    // The fake MCP role must be checked before anything else reads the environment.
    buzz_agent_e2e::serve_role_if_asked();
    let bin = std::env::var("BUZZ_AGENT_BIN").unwrap_or_default();
    if bin.is_empty() {
        eprintln!("set BUZZ_AGENT_BIN to the agent binary to test");
        std::process::exit(2);
    }
    let help = std::process::Command::new(&bin)
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    buzz_agent_e2e::run_suite(&bin, help.contains(" hooks check "));
}
