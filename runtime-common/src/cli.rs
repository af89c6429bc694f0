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
const EXTRA_SUBCOMMANDS: [&str; 4] = ["hooks", "demo", "exec", "example-server"];

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

/// The line printed to stderr when the agent starts with a terminal on stdin: a person typed
/// the command, and the agent would otherwise wait for JSON-RPC in silence (issue 12). It names
/// the subcommands that let a person try it, only those this binary has.
#[must_use]
pub fn tty_hint(program: &Program) -> String {
    let bin = program.name;
    let try_it = if program.extras.is_some() {
        format!(
            "run it from an ACP client (Zed, acpx), or try `{bin} demo` (an offline session) or \
             `{bin} exec \"a prompt\"` (one prompt from this terminal)"
        )
    } else {
        "run it from an ACP client (Zed, acpx); the README's \"Talk to it\" shows how".to_string()
    };
    format!(
        "{bin}: this is an ACP agent: it reads JSON-RPC messages from an ACP client on stdin, not \
         typed text; {try_it}. `{bin} --help` lists the settings."
    )
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

/// Reads the environment into a validated [`Config`]. On error prints one line per bad
/// variable (all of them, SPEC C1) and returns exit status 2; then logs the start-up warnings
/// ([`config::startup_warnings`]: unknown `BUZZ_AGENT_*` variables, the default OpenAI URL
/// without a key) at WARN.
///
/// # Errors
/// The exit status (2) after the configuration errors were printed.
pub fn load_config(program: &Program) -> Result<Config, i32> {
    let bin = program.name;
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let read = |path: &str| std::fs::read_to_string(path).map_err(|e| e.to_string());
    let mut cfg = match Config::from_env_map(&env, &read) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                eprintln!("{bin}: configuration error: {e}");
            }
            return Err(2);
        }
    };
    for message in config::startup_warnings(&env, &cfg) {
        let record = buzz_agent_core::LogRecord {
            level: config::LogLevel::Warn,
            at: buzz_agent_core::MonoTime::ZERO,
            message,
        };
        eprint!("{}", record.render(cfg.log_format));
    }
    // DESIGN: randomness is an input. Without BUZZ_AGENT_SEED, the retry jitter, the
    // session ids (SPEC A9: unique across processes and hosts) and the OAuth secrets (PKCE
    // verifiers, state; SPEC M11) come from the OS.
    if cfg.fixed_seed.is_none() {
        let bytes = random_bytes();
        let (jitter, rest) = bytes.split_at(8);
        let (ids, oauth) = rest.split_at(16);
        let mut seed = [0u8; 8];
        seed.copy_from_slice(jitter);
        let mut id_seed = [0u8; 16];
        id_seed.copy_from_slice(ids);
        cfg.seed = u64::from_le_bytes(seed);
        cfg.session_id_seed = Some(u128::from_le_bytes(id_seed));
        cfg.oauth_seed.copy_from_slice(oauth);
    }
    Ok(cfg)
}

/// 56 random bytes from the OS (`/dev/urandom`); if it cannot be read, from the standard
/// library's randomly keyed hasher (also seeded by the OS) over the time and the pid.
fn random_bytes() -> [u8; 56] {
    let mut bytes = [0u8; 56];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(t);
            h.write_u32(std::process::id());
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's configuration table, its rows by variable.
    fn readme_rows() -> Vec<String> {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
            .expect("README.md beside the workspace");
        readme
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(str::to_string)
            .collect()
    }

    /// C1, issue 12: the README names every variable, and gives each number the range the
    /// parser enforces and `--help` prints (both from `config::numeric_range_text`).
    #[test]
    fn c1_readme_help_and_errors_agree_on_every_bound() {
        let rows = readme_rows();
        let program = Program {
            name: "buzz-agent",
            version: "0",
            extras: None,
        };
        let help = help_text(&program);
        for name in config::variable_names() {
            let row = rows
                .iter()
                .find(|r| r.contains(&format!("`{name}`")))
                .unwrap_or_else(|| panic!("README.md has no row for {name}"));
            if let Some(range) = config::numeric_range_text(name) {
                assert!(
                    row.contains(&format!("({range})")),
                    "README row of {name} lacks ({range}): {row}"
                );
                assert!(help.contains(&format!("({range})")), "{name}");
            }
        }
    }

    #[test]
    fn the_tty_hint_names_only_the_subcommands_the_binary_has() {
        let minimal = Program {
            name: "buzz-agent-smol",
            version: "0",
            extras: None,
        };
        let hint = tty_hint(&minimal);
        assert!(
            hint.contains("ACP agent") && hint.contains("ACP client"),
            "{hint}"
        );
        assert!(!hint.contains("demo") && !hint.contains("exec"), "{hint}");
        let full = Program {
            extras: Some(crate::extras::EXTRAS),
            ..minimal
        };
        let hint = tty_hint(&full);
        assert!(
            hint.contains("`buzz-agent-smol demo`") && hint.contains("`buzz-agent-smol exec"),
            "{hint}"
        );
    }
}
