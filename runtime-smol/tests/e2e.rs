//! The end-to-end scenario suite against the `buzz-agent-smol` binary. Its `extras` subcommands
//! are off by default; their scenarios run with `--features extras`.
fn main() {
    buzz_agent_e2e::run_suite(
        env!("CARGO_BIN_EXE_buzz-agent-smol"),
        cfg!(feature = "extras"),
    );
}
