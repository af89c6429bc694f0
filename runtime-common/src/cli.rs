//! Command line and configuration loading (SPEC C1, P3). Plain `std` and the core: no runtime.

use crate::Program;
use buzz_agent_core::config::{self, Config};
use std::collections::BTreeMap;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run as an ACP agent on stdin/stdout (no argument).
    Agent,
    /// Exit at once with this status (help, version, a usage error, or a subcommand that ran).
    Exit(i32),
}

/// The subcommands of the `extras` module that a minimal binary may be asked for.
const EXTRA_SUBCOMMANDS: [&str; 3] = ["hooks", "demo", "example-server"];

/// Handles `--help`, `--version`, the binary's extra subcommands (`demo`, `example-server`,
/// `hooks check`, when it has them) and unknown arguments.
#[must_use]
pub fn handle_args(program: &Program, args: &[String]) -> Command {
    let bin = program.name;
    let Some(first) = args.first().map(String::as_str) else {
        return Command::Agent;
    };
    match first {
        "--help" | "-h" | "help" => {
            println!("{}", help_text(program));
            return Command::Exit(0);
        }
        "--version" | "-V" => {
            println!("{bin} {}", program.version);
            return Command::Exit(0);
        }
        _ => {}
    }
    if let Some(code) = program
        .extras
        .and_then(|extras| (extras.run)(program, args))
    {
        return Command::Exit(code);
    }
    if EXTRA_SUBCOMMANDS.contains(&first) {
        eprintln!(
            "{bin}: '{first}' is not part of this minimal build (the production binary \
             `buzz-agent` has it, or build {bin} with the `extras` feature)"
        );
    } else {
        eprintln!("{bin}: unknown argument '{first}' (try --help)");
    }
    Command::Exit(2)
}

/// The `--help` text: usage (with the binary's extra subcommands), exit statuses and every
/// configuration variable with its default.
#[must_use]
pub fn help_text(program: &Program) -> String {
    let bin = program.name;
    let extras = program
        .extras
        .map(|extras| (extras.usage)(bin))
        .unwrap_or_default();
    format!(
        "{bin} {} — an ACP agent with MCP lifecycle hooks\n\n\
         USAGE:\n  {bin:<w$}  run as an ACP agent on stdin/stdout\n{extras}  \
         {bin} --help     this text\n  {bin} --version  the version\n\n\
         EXIT STATUS: 0 after a clean shutdown (stdin EOF, SIGTERM, SIGINT, SIGHUP), 2 on a\n\
         configuration or usage error, 1 when the runtime cannot start.\n\n{}",
        program.version,
        config::help_text(),
        w = bin.len() + 10,
    )
}

/// Reads the environment into a validated [`Config`]. On error prints one line naming the
/// variable and returns exit status 2 (SPEC C1).
///
/// # Errors
/// The exit status (2) after a configuration error was printed.
pub fn load_config(program: &Program) -> Result<Config, i32> {
    let bin = program.name;
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let read = |path: &str| std::fs::read_to_string(path).map_err(|e| e.to_string());
    let mut cfg = match Config::from_env_map(&env, &read) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{bin}: configuration error: {e}");
            return Err(2);
        }
    };
    for name in config::unknown_agent_variables(&env) {
        let record = buzz_agent_core::LogRecord {
            level: config::LogLevel::Warn,
            at: buzz_agent_core::MonoTime::ZERO,
            message: format!("unknown variable {name} ignored (typo?)"),
        };
        eprint!("{}", record.render(cfg.log_format));
    }
    // Jitter seed (DESIGN: randomness is an input): time and pid.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    cfg.seed = t ^ (u64::from(std::process::id()) << 32);
    Ok(cfg)
}
