//! The end-to-end scenario suite against the `buzz-agent` (tokio) binary, which has the
//! `extras` subcommands by default (its `extras` feature).
fn main() {
    buzz_agent_e2e::run_suite(env!("CARGO_BIN_EXE_buzz-agent"), cfg!(feature = "extras"));
}
