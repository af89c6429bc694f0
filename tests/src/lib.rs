//! End-to-end suite of buzz-agent (docs/architecture.md, "How it is tested", layer 5): real agent processes driven
//! over stdio, a fake LLM on a real TCP socket ([`fake_llm`]), a fake MCP server that is this
//! very test binary run with `BUZZ_E2E_ROLE=fake-mcp` ([`fake_mcp`]), and real third-party peers
//! ([`peers`]). Every scenario is named after the SPEC requirement or case it checks.
//!
//! Each runtime crate has a `harness = false` test whose `main` is
//! `buzz_agent_e2e::run_suite(env!("CARGO_BIN_EXE_<binary>"), <has extras>)`, so the same suite
//! runs unchanged against every binary. The scenarios of the `extras` subcommands (`demo`,
//! `exec`, `example-server`, `hooks check`) are reported ignored, with the reason, against a
//! binary built without them. Every frame an agent writes is validated against the official
//! ACP schema ([`acp_schema`]); the count is printed after the run. Set `BUZZ_E2E_VERBOSE=1` to see the ACP traffic and the agent's stderr.

pub mod acp_schema;
pub mod bench;
pub mod cli;
pub mod conformance;
pub mod conformance_auth;
pub mod dialects;
pub mod differential;
pub mod fake_llm;
pub mod fake_mcp;
pub mod fake_mcp_http;
pub mod fake_oauth;
#[cfg(test)]
mod fuzz_seeds;
pub mod harness;
pub mod peers;
pub mod procfs;
pub mod references;
mod scenarios;

pub use harness::Ctx;

/// A scenario: a plain function that panics when the agent misbehaves.
pub type Scenario = fn(&Ctx);

/// The suite's entry point. With `BUZZ_E2E_ROLE=fake-mcp` in the environment this process is a
/// fake MCP server (launched by the agent under test) and never returns; otherwise it runs every
/// scenario against `agent_bin` with libtest-style arguments and output (2 threads unless
/// `--test-threads` says otherwise) and exits with the result. `has_extras`: the binary was
/// built with the `extras` subcommands (pass `cfg!(feature = "extras")` from a crate whose
/// feature turns them on); without them their scenarios are reported ignored, with the reason.
pub fn run_suite(agent_bin: &str, has_extras: bool) {
    use libtest_mimic::{Completion, Trial};
    serve_role_if_asked();
    let mut args = libtest_mimic::Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(2);
    }
    let ctx = Ctx::new(agent_bin, has_extras);
    let trial = |(name, scenario): (&'static str, Scenario)| {
        let ctx = ctx.clone();
        Trial::test(name, move || {
            scenario(&ctx);
            Ok(())
        })
    };
    let mut trials: Vec<Trial> = scenarios::all().into_iter().map(trial).collect();
    if has_extras {
        trials.extend(scenarios::extras().into_iter().map(trial));
    } else {
        let bin = ctx
            .agent_bin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let why = format!(
            "{} is built without the `extras` feature (demo, exec, example-server, hooks check)",
            bin.unwrap_or_default()
        );
        trials.extend(scenarios::extras().into_iter().map(|(name, _)| {
            let why = why.clone();
            Trial::ignorable_test(name, move || Ok(Completion::ignored_with(why)))
        }));
    }
    trials.extend(scenarios::tool_trials(&ctx));
    trials.extend(dialect_trials(agent_bin, has_extras));
    trials.extend(peers::trials(&ctx));
    trials.extend(conformance::trials(&ctx.agent_bin));
    let conclusion = libtest_mimic::run(&args, trials);
    for figures in conformance::summary() {
        eprintln!("{figures}");
    }
    let schema = acp_schema::counts();
    if schema.validated > 0 {
        eprintln!(
            "{}: {} agent frames validated ({} responses against their envelope only), {} invalid",
            acp_schema::SCHEMA_SOURCE,
            schema.validated,
            schema.unmapped,
            schema.invalid
        );
    }
    conclusion.exit();
}

/// The dialect matrix: every scenario of [`scenarios::dialect_matrix`] under every
/// [`dialects::Dialect`] profile, named `dialects::<profile>::<scenario>`. A trial fails with
/// the broken rules when the agent sent a request the profile's server rejects, whatever the
/// scenario itself concluded.
fn dialect_trials(agent_bin: &str, has_extras: bool) -> Vec<libtest_mimic::Trial> {
    let mut trials = Vec::new();
    for dialect in dialects::Dialect::ALL {
        for (name, scenario) in scenarios::dialect_matrix() {
            let ctx = Ctx {
                dialect: Some(dialect),
                ..Ctx::new(agent_bin, has_extras)
            };
            let trial_name = format!("dialects::{}::{name}", dialect.name());
            trials.push(libtest_mimic::Trial::test(trial_name, move || {
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&ctx)));
                let broken = ctx.violations.lock().map(|v| v.clone()).unwrap_or_default();
                if !broken.is_empty() {
                    return Err(format!(
                        "the agent sent {} request(s) this server rejects:\n  {}",
                        broken.len(),
                        broken.join("\n  ")
                    )
                    .into());
                }
                match outcome {
                    Ok(()) => Ok(()),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }));
        }
    }
    trials
}

/// With `BUZZ_E2E_ROLE=fake-mcp` in the environment, becomes the fake MCP server and never
/// returns; with another non-empty role, exits 2. Every `harness = false` test binary that
/// passes [`harness::fake_mcp_entry`] servers to an agent calls this first.
pub fn serve_role_if_asked() {
    match std::env::var("BUZZ_E2E_ROLE").as_deref() {
        Ok("fake-mcp") => fake_mcp::main(),
        Ok("fake-mcp-http") => fake_mcp_http::main(),
        Ok("fake-browser") => fake_oauth::browse_main(),
        Ok("conformance-client") => conformance::client_main(),
        Ok(other) if !other.is_empty() => {
            eprintln!(
                "buzz-agent-e2e: unknown BUZZ_E2E_ROLE {other:?} (known: fake-mcp, fake-mcp-http, fake-browser, conformance-client)"
            );
            std::process::exit(2);
        }
        _ => {}
    }
}

/// The names of all scenarios (without the peers), for listing and tests.
pub fn scenario_names() -> Vec<&'static str> {
    scenarios::all()
        .into_iter()
        .chain(scenarios::extras())
        .map(|(n, _)| n)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn scenario_names_are_unique_and_cite_a_spec_id() {
        let names = super::scenario_names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate scenario names");
        for n in names {
            let bare = n.rsplit("::").next().unwrap();
            let first = bare.chars().next().unwrap();
            assert!(
                "tacmhglpkxs".contains(first),
                "{n} does not start with a SPEC id"
            );
            assert!(bare[1..].starts_with(|c: char| c.is_ascii_digit()), "{n}");
        }
    }
}
