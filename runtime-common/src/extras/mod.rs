//! The production binary's extra subcommands (SPEC P3, E1, E2, issue 12): `demo` (an offline
//! session; `demo --interceptors` shows an interceptor denying a dangerous call; `demo --llm`
//! serves only its scripted LLM, for trying the agent by hand), `exec` (one
//! prompt from a terminal), `example-server testguard|todo|interceptors` (the bundled example
//! hook servers and the SEP-2624 example interceptor server) and `hooks check` (a hook
//! server's contract check). `demo` and `exec`
//! drive this binary as an ACP agent child through one client (`acp_client`). Plain blocking `std` IO: these are one-shot tools, not the agent.
//!
//! A binary opts in by putting [`EXTRAS`] in its [`Program`]. Nothing else in this crate
//! refers to this module, so a binary that leaves them out (the minimal `buzz-agent-smol`) does
//! not link them: the code is gone from it, not just unreachable. (A cargo feature of this
//! crate would not do: cargo unifies a library's features across the binaries built together,
//! so `cargo build --workspace` would give the minimal binary the production binary's set.)

use crate::Program;

mod acp_client;
mod demo;
mod examples;
mod exec;
mod hooks_check;

/// Subcommands a binary can add to its command line.
#[derive(Debug, Clone, Copy)]
pub struct Extras {
    /// Runs the subcommand `args[0]` with the rest of `args`: `Some(exit status)`, or `None`
    /// when `args[0]` is not one of these subcommands.
    pub run: fn(&Program, &[String]) -> Option<i32>,
    /// The usage lines for `--help`, given the binary's name.
    pub usage: fn(&str) -> String,
}

/// `demo`, `exec`, `example-server` and `hooks check`.
pub const EXTRAS: Extras = Extras { run, usage };

fn run(program: &Program, args: &[String]) -> Option<i32> {
    let bin = program.name;
    let arg1 = args.get(1).map(String::as_str);
    Some(match (args.first().map(String::as_str)?, arg1) {
        ("demo", None) => demo::run(),
        ("demo", Some("--interceptors")) if args.len() == 2 => demo::run_interceptors(),
        ("demo", Some("--llm")) if args.len() <= 3 => {
            demo::run_llm(args.get(2).map(String::as_str))
        }
        ("demo", Some(_)) => {
            eprintln!("usage: {bin} demo [--interceptors | --llm [ADDR]]");
            2
        }
        ("exec", _) => exec::run(bin, &args[1..]),
        ("hooks", Some("check")) => hooks_check::run(bin, &args[2..]),
        ("hooks", Some("--help" | "-h" | "help")) => {
            println!("{}", hooks_check::usage(bin));
            0
        }
        ("hooks", _) => {
            eprintln!("{}", hooks_check::usage(bin));
            2
        }
        ("example-server", Some(name)) => examples::run(name),
        ("example-server", None) => {
            eprintln!("usage: {bin} example-server testguard|todo|interceptors");
            2
        }
        _ => return None,
    })
}

fn usage(bin: &str) -> String {
    format!(
        "  {bin} hooks check -- <command> [args…]\n      spawn one MCP server, call its hooks once, report whether it follows the contract\n  \
         {bin} exec [--cwd DIR] [--mcp-config FILE] [--approve reads|all|none] \"prompt\"\n      run one prompt with the LLM this environment names; `{bin} exec --help` for more\n  \
         {bin} demo [--interceptors | --llm [ADDR]]\n      an offline session: scripted LLM, the bundled todo hook server, _Stop objecting once;\n      with --interceptors, an interceptor server denying a dangerous tool call (experimental);\n      with --llm, only the scripted LLM, served on ADDR (127.0.0.1:8765) for trying the agent by hand\n  \
         {bin} example-server testguard|todo|interceptors\n      run a bundled example server on stdio (TESTGUARD_CMD, TESTGUARD_TIMEOUT_MS; TODO_FILE;\n      EXAMPLE_INTERCEPTORS, a JSON array of interceptors)\n"
    )
}
