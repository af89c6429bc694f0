//! `buzz-agent-runtime`: the driver half of buzz-agent that does not depend on an async runtime,
//! shared by the tokio binary (`buzz-agent`) and the smol binary (`buzz-agent-smol`).
//!
//! A binary implements [`Runtime`] (spawn a task, sleep until an instant, spawn a child with
//! piped stdio, async stdin/stdout, the shutdown signals) and calls [`start`] then [`drive`];
//! everything else is here, written once:
//!
//! | module | what |
//! |---|---|
//! | [`runtime`] | the [`Runtime`] trait and the pipe traits a binary implements |
//! | [`driver`] | the loop: drain actions, handle inputs and timeouts (the core's drain rule) |
//! | `children` | MCP child processes: spawn, pipes (stderr as capped lines, C52), exit, `killpg`; every descendant stopped at exit (S7) |
//! | `tree` | the agent's process tree from `/proc`: descendants, process groups, zombies (S7) |
//! | [`log`] | stderr logging that never blocks the loop (SPEC P2, case C51) |
//! | [`http`] | HTTP exchanges (LLM calls, MCP over HTTP) as tasks over the runtime's sockets, TLS by rustls |
//! | [`stdio`] | the ACP client's stdin (a reader thread) and stdout (non-blocking writes) |
//! | [`cli`] | `--help`, `--version`, configuration from the environment |
//! | [`store`] | session transcripts on disk (SPEC A9): open, lock, append, read, list |
//! | [`project`] | a session's `AGENTS.md` files and skill folders, read bounded (SPEC A10) |
//! | [`oauth`] | MCP authorization's IO (SPEC M11): the loopback redirect listener, the token files, `$BROWSER` |
//! | [`sys`] | `killpg`, `kill`, reaping orphans, exit-status wording, glibc's arena setting, not dumpable, child subreaper |
//! | `util` | `race` of two futures |
//!
//! What both drivers need that is not IO lives in `buzz-agent-core`, not here. The one-shot
//! tools (`demo`, `exec`, `example-server`, `hooks check`) are the `buzz-agent-extras` crate;
//! a binary names them in its [`Program`].
#![deny(missing_docs)]

mod children;
pub mod cli;
pub mod driver;
pub mod http;
pub mod log;
pub mod oauth;
pub mod project;
pub mod runtime;
pub mod stdio;
pub mod store;
pub mod sys;
mod tree;
mod util;

pub use driver::drive;
pub use runtime::{InputSender, ReadPipe, Runtime, Socket, SpawnedChild, WritePipe};

use buzz_agent_core::Config;

/// The binary being run: its name (in help, version and error texts), its version (also sent to
/// the client in `initialize`) and its extra subcommands.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The binary's name, e.g. `buzz-agent`.
    pub name: &'static str,
    /// The binary's version, e.g. `0.1.0`.
    pub version: &'static str,
    /// `Some(buzz_agent_extras::EXTRAS)` for `demo`, `exec`, `example-server` and `hooks
    /// check` (the `buzz-agent-extras` crate, an optional dependency of each binary); `None`
    /// leaves them out of the binary.
    pub extras: Option<Extras>,
}

/// Subcommands a binary can add to its command line (the one-shot tools of the
/// `buzz-agent-extras` crate). This crate only calls them; it does not contain them, so a
/// binary built without that crate does not link them.
#[derive(Debug, Clone, Copy)]
pub struct Extras {
    /// Runs the subcommand `args[0]` with the rest of `args`: `Some(exit status)`, or `None`
    /// when `args[0]` is not one of these subcommands.
    pub run: fn(&Program, &[String]) -> Option<i32>,
    /// The usage lines for `--help`, given the binary's name.
    pub usage: fn(&str) -> String,
}

/// Everything before the loop: handles the command line (help, version, the `extras`
/// subcommands), prints [`cli::tty_hint`] when stdin is a terminal (a person, not an ACP
/// client, started it), reads and validates the configuration, sets up the allocator and
/// makes the process non-dumpable ([`sys::not_dumpable`], SPEC S1) and a child subreaper
/// ([`sys::child_subreaper`], SPEC S7).
///
/// # Errors
/// The status to exit with at once: after `--help`, `--version` or a subcommand, or 2 after a
/// usage or configuration error (already printed).
pub fn start(program: &Program) -> Result<Config, i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let cli::Command::Exit(code) = cli::handle_args(program, &args) {
        return Err(code);
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!("{}", cli::tty_hint(program));
    }
    let config = cli::load_config(program)?;
    sys::one_malloc_arena();
    let warn = |message: String| {
        let record = buzz_agent_core::LogRecord {
            level: buzz_agent_core::config::LogLevel::Warn,
            at: buzz_agent_core::MonoTime::ZERO,
            message,
        };
        eprint!("{}", record.render(config.log_format));
    };
    if let Err(e) = sys::not_dumpable() {
        warn(format!(
            "cannot make the process non-dumpable ({e}); its environment stays readable through /proc"
        ));
    }
    if let Err(e) = sys::child_subreaper() {
        warn(format!(
            "cannot become a child subreaper ({e}); a process that leaves its server's process group may outlive the agent"
        ));
    }
    Ok(config)
}
