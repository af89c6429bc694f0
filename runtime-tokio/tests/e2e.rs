//! The end-to-end scenario suite against the `buzz-agent` (tokio) binary, which always has the
//! `extras` subcommands.
fn main() {
    buzz_agent_e2e::run_suite(env!("CARGO_BIN_EXE_buzz-agent"), true);
}
