//! Command line and configuration loading (SPEC C1, P3).
//!
//! Runtime-agnostic: both drivers include this very file (`runtime-smol` through
//! `#[path = "../../runtime-tokio/src/cli.rs"]`), so it uses only `std` and the core. The
//! binary's name in the help and version text is the one being compiled.

use buzz_agent_core::config::{self, Config};
use std::collections::BTreeMap;

/// The name of the binary this file is compiled into (`buzz-agent`, `buzz-agent-smol`).
const BIN: &str = env!("CARGO_BIN_NAME");

/// Handle `--help` / `--version` / unknown arguments. `Some(code)` = exit now.
pub fn handle_args(args: &[String]) -> Option<i32> {
    match args.first().map(String::as_str) {
        None => None,
        Some("--help" | "-h" | "help") => {
            println!(
                "{BIN} {} — an ACP agent with MCP lifecycle hooks\n\n\
                 USAGE:\n  {BIN:<w$}  run as an ACP agent on stdin/stdout\n  \
                 {BIN} hooks check -- <command> [args…]\n      spawn one MCP server, call its hooks once, report whether it follows the contract\n  \
                 {BIN} demo\n      an offline session: scripted LLM, the bundled todo hook server, _Stop objecting once\n  \
                 {BIN} example-server testguard|todo\n      run a bundled example hook server on stdio (TESTGUARD_CMD, TESTGUARD_TIMEOUT_MS)\n  \
                 {BIN} --help     this text\n  {BIN} --version  the version\n\n\
                 EXIT STATUS: 0 after a clean shutdown (stdin EOF, SIGTERM, SIGINT, SIGHUP), 2 on a\n\
                 configuration or usage error, 1 when the runtime cannot start.\n\n{}",
                env!("CARGO_PKG_VERSION"),
                config::help_text(),
                w = BIN.len() + 10,
            );
            Some(0)
        }
        Some("hooks") if args.get(1).map(String::as_str) == Some("check") => {
            Some(crate::hooks_check::run(&args[2..]))
        }
        Some("demo") => Some(crate::demo::run()),
        Some("example-server") => match args.get(1) {
            Some(name) => Some(crate::examples::run(name)),
            None => {
                eprintln!("usage: {BIN} example-server testguard|todo");
                Some(2)
            }
        },
        Some("--version" | "-V") => {
            println!("{BIN} {}", env!("CARGO_PKG_VERSION"));
            Some(0)
        }
        Some(other) => {
            eprintln!("{BIN}: unknown argument '{other}' (try --help)");
            Some(2)
        }
    }
}

/// Read the environment into a validated [`Config`]. On error prints one line naming the
/// variable and returns exit status 2 (SPEC C1).
pub fn load_config() -> Result<Config, i32> {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let read = |path: &str| std::fs::read_to_string(path).map_err(|e| e.to_string());
    let mut cfg = match Config::from_env_map(&env, &read) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{BIN}: configuration error: {e}");
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
