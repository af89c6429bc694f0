//! Command line and configuration loading (SPEC C1, P3).

use buzz_agent_core::config::{self, Config};
use std::collections::BTreeMap;

/// Handle `--help` / `--version` / unknown arguments. `Some(code)` = exit now.
pub fn handle_args(args: &[String]) -> Option<i32> {
    match args.first().map(String::as_str) {
        None => None,
        Some("--help" | "-h" | "help") => {
            println!(
                "buzz-agent {} — an ACP agent with MCP lifecycle hooks\n\n\
                 USAGE:\n  buzz-agent            run as an ACP agent on stdin/stdout\n  \
                 buzz-agent --help     this text\n  buzz-agent --version  the version\n\n\
                 CONFIGURATION (environment variables, read once at start):\n{}",
                env!("CARGO_PKG_VERSION"),
                config::help_text()
            );
            Some(0)
        }
        Some("--version" | "-V") => {
            println!("buzz-agent {}", env!("CARGO_PKG_VERSION"));
            Some(0)
        }
        Some(other) => {
            eprintln!("buzz-agent: unknown argument '{other}' (try --help)");
            Some(2)
        }
    }
}

/// Read the environment into a validated [`Config`]. On error prints one line naming the
/// variable and returns exit status 2 (SPEC C1).
pub fn load_config() -> Result<Config, i32> {
    let env: BTreeMap<String, String> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    let read = |path: &str| std::fs::read_to_string(path).map_err(|e| e.to_string());
    let mut cfg = match Config::from_env_map(&env, &read) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("buzz-agent: configuration error: {e}");
            return Err(2);
        }
    };
    if !buzz_agent_core::provider::is_supported(&cfg.provider) {
        eprintln!(
            "buzz-agent: configuration error: BUZZ_AGENT_PROVIDER / OPENAI_COMPAT_API: the {:?} route is not implemented in this build; use BUZZ_AGENT_PROVIDER=openai with OPENAI_COMPAT_API=chat",
            cfg.provider
        );
        return Err(2);
    }
    for name in config::unknown_agent_variables(&env) {
        eprintln!("buzz-agent WARN  unknown variable {name} ignored (typo?)");
    }
    // Jitter seed (DESIGN: randomness is an input): time and pid.
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    cfg.seed = t ^ (u64::from(std::process::id()) << 32);
    Ok(cfg)
}
