//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! `tests/package.json`) against the agent, as SPEC M10–M13 and docs/conformance.md describe.
//!
//! Each client scenario of the suite starts its own MCP server (and, for the `auth/…`
//! scenarios, an authorization server) on `localhost`, runs the client command with the
//! server's URL as its last argument, then grades what the server saw. The client command
//! is this test binary in the role `conformance-client` ([`client_main`]): an ACP driver that
//! starts the agent under test against a scripted LLM, opens a session with the scenario's URL
//! as an `http` entry of `mcpServers`, and sends one prompt. The scripted LLM calls every tool
//! the server lists (arguments made from each tool's input schema), then ends its turn; the
//! driver exits 0 when the prompt ended with `end_turn` and the agent shut down cleanly.
//!
//! [`trials`] is one trial per scenario (`conformance::<scenario>`), run by the suite of each
//! binary. A scenario in [`KNOWN_FAILING`] must still fail (reported ignored, with its reason);
//! one that starts passing fails its trial until it is taken off the list, so the list stays
//! true. The figures (`conformance <version>: N/M client scenarios passed`) are printed after
//! the run.

use crate::conformance_auth;
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, Wire};
use crate::harness::{AgentProc, DEFAULT_TIMEOUT, StderrMode, current_exe, env_for_origin};
use crate::peers::{in_ci, node_modules};
use libtest_mimic::{Completion, Failed, Trial};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The suite version `tests/package.json` pins (checked by a unit test below).
pub const SUITE_VERSION: &str = "0.1.16";

/// The `mcpServers` name the driver gives the scenario's server.
pub const SERVER_NAME: &str = "conf";

/// Every client scenario of the pinned suite (`conformance list`, "Client scenarios"), in the
/// suite's order.
pub const SCENARIOS: [&str; 26] = [
    "initialize",
    "tools_call",
    "elicitation-sep1034-client-defaults",
    "sse-retry",
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/client-credentials-jwt",
    "auth/client-credentials-basic",
    "auth/cross-app-access-complete-flow",
];

/// The scenarios known to fail on both binaries, each with the reason. Their trials check
/// that they still fail; a scenario that passes must be taken off this list.
pub const KNOWN_FAILING: &[(&str, &str)] = &[(
    "auth/2025-03-26-oauth-metadata-backcompat",
    "the fixture's authorization server metadata, fetched from the server's origin, names \
         the issuer <origin>/oauth; RFC 8414 section 3.3 requires them to be identical and the \
         agent keeps that check (docs/conformance.md)",
)];

/// Scenarios passed in this process (for the figures printed after the run).
static PASSED: AtomicUsize = AtomicUsize::new(0);
/// Scenarios run in this process.
static RAN: AtomicUsize = AtomicUsize::new(0);

/// `tests/node_modules/.bin/node`: the Node (>= 22) of the npm package `node`, which the
/// suite needs (the system's may be older).
pub fn node_bin() -> PathBuf {
    node_modules().join(".bin/node")
}

/// The suite's command line entry point in `tests/node_modules`.
pub fn suite_js() -> PathBuf {
    node_modules().join("@modelcontextprotocol/conformance/dist/index.js")
}

/// `'text'` for `sh`, whatever `text` holds.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The client command the suite runs (it appends the server URL): this test binary as
/// [`client_main`], driving `agent_bin`.
pub fn client_command(agent_bin: &Path) -> String {
    format!(
        "env BUZZ_E2E_ROLE=conformance-client BUZZ_CONFORMANCE_AGENT={} {}",
        sh_quote(&agent_bin.display().to_string()),
        sh_quote(&current_exe())
    )
}

/// What one run of a scenario gave.
#[derive(Debug)]
pub struct Outcome {
    /// The suite's verdict (exit status 0: every check passed, no warning, the client exited 0).
    pub passed: bool,
    /// The checks that failed or warned, one line each (`id: description (error)`).
    pub failures: Vec<String>,
    /// The suite's stderr (its summary, and the client's output when it failed).
    pub log: String,
}

/// Runs `scenario` of the suite against `agent_bin` (`conformance client --scenario …
/// --command …`) and reads its verdict.
///
/// # Panics
/// When Node cannot be started or its output is not the suite's.
pub fn run_scenario(agent_bin: &Path, scenario: &str) -> Outcome {
    let dir = tempfile::Builder::new()
        .prefix("buzz-conformance-")
        .tempdir()
        .expect("a temporary directory");
    let out = Command::new(node_bin())
        .arg(suite_js())
        .args(["client", "--scenario", scenario, "--timeout", "60000"])
        .arg("--command")
        .arg(client_command(agent_bin))
        .arg("--verbose")
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", node_bin().display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    // `--verbose`: the checks as one JSON array on stdout.
    let checks: Vec<Value> = stdout
        .find('[')
        .and_then(|i| serde_json::from_str(&stdout[i..]).ok())
        .unwrap_or_else(|| panic!("no checks from the suite:\n{stdout}\n{log}"));
    let failures = checks
        .iter()
        .filter(|c| c["status"] == "FAILURE" || c["status"] == "WARNING")
        .map(|c| {
            let error = c["errorMessage"].as_str().unwrap_or_default();
            format!(
                "{} {}: {} {error}",
                c["status"].as_str().unwrap_or_default(),
                c["id"].as_str().unwrap_or_default(),
                c["description"].as_str().unwrap_or_default()
            )
        })
        .collect();
    Outcome {
        passed: out.status.success(),
        failures,
        log,
    }
}

/// One trial per scenario of [`SCENARIOS`] against `agent_bin`, named
/// `conformance::<scenario>`. Without the suite installed: failed under `CI`, else ignored
/// with how to install it.
pub fn trials(agent_bin: &Path) -> Vec<Trial> {
    SCENARIOS
        .iter()
        .map(|&scenario| {
            let agent_bin = agent_bin.to_path_buf();
            let known = KNOWN_FAILING
                .iter()
                .find(|(name, _)| *name == scenario)
                .map(|(_, why)| *why);
            Trial::ignorable_test(format!("conformance::{scenario}"), move || {
                if !suite_js().is_file() || !node_bin().is_file() {
                    let why = format!(
                        "{} missing: run `npm ci` in {}",
                        suite_js().display(),
                        env!("CARGO_MANIFEST_DIR")
                    );
                    return if in_ci() {
                        Err(Failed::from(format!("CI is set and {why}")))
                    } else {
                        Ok(Completion::ignored_with(why))
                    };
                }
                let outcome = run_scenario(&agent_bin, scenario);
                RAN.fetch_add(1, Ordering::Relaxed);
                if outcome.passed {
                    PASSED.fetch_add(1, Ordering::Relaxed);
                }
                match (outcome.passed, known) {
                    (true, None) => Ok(Completion::Completed),
                    (false, Some(why)) => Ok(Completion::ignored_with(format!(
                        "known failure, ran and still fails: {why}"
                    ))),
                    (true, Some(_)) => Err(Failed::from(format!(
                        "{scenario} passes now: take it off conformance::KNOWN_FAILING"
                    ))),
                    (false, None) => Err(Failed::from(format!(
                        "{scenario} failed:\n  {}\n--- suite output:\n{}",
                        outcome.failures.join("\n  "),
                        outcome.log
                    ))),
                }
            })
        })
        .collect()
}

/// The figures line for the run (`None` when no scenario ran).
pub fn summary() -> Option<String> {
    let ran = RAN.load(Ordering::Relaxed);
    (ran > 0).then(|| {
        format!(
            "MCP conformance {SUITE_VERSION}: {}/{ran} client scenarios passed ({} of the suite)",
            PASSED.load(Ordering::Relaxed),
            SCENARIOS.len()
        )
    })
}

/// A value for a tool argument of JSON Schema `schema`: the first `enum` member, else by
/// `type` (numbers 2, strings `"conformance"`, `true`, empty arrays and objects filled the
/// same way).
fn sample(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("number" | "integer") => json!(2),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => arguments(schema),
        _ => json!("conformance"),
    }
}

/// Arguments for a tool with input schema `schema`: a [`sample`] for every property.
fn arguments(schema: &Value) -> Value {
    let props = schema["properties"].as_object();
    let args = props
        .into_iter()
        .flatten()
        .map(|(k, s)| (k.clone(), sample(s)))
        .collect();
    Value::Object(args)
}

/// The scripted model: on the first request it calls every tool of [`SERVER_NAME`] it was
/// offered, on every later one it ends its turn with a text.
fn script(i: usize, req: &RecordedRequest) -> Reply {
    let prefix = format!("{SERVER_NAME}__");
    let calls: Vec<(String, String, Value)> = req
        .tool_schemas()
        .into_iter()
        .filter(|(name, ..)| name.starts_with(&prefix))
        .enumerate()
        .map(|(n, (name, _, schema))| {
            let args = schema.as_ref().map_or_else(|| json!({}), arguments);
            (format!("call{n}"), name, args)
        })
        .collect();
    if i == 0 && !calls.is_empty() {
        Reply::tool_calls(
            calls
                .iter()
                .map(|(id, name, args)| (id.as_str(), name.as_str(), args.clone()))
                .collect(),
        )
    } else {
        Reply::text("done")
    }
}

/// The driver's ACP `initialize` params: protocol version 1, no file system or terminal, and
/// elicitation in form mode (`clientCapabilities.elicitation.form`).
fn initialize_params() -> Value {
    json!({"protocolVersion": 1,
           "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false},
                                  "terminal": false,
                                  "elicitation": {"form": {}}},
           "clientInfo": {"name": "buzz-conformance-client", "version": "0"}})
}

/// The `conformance-client` role: the client command of the suite. Its last argument is the
/// scenario server's URL; `BUZZ_CONFORMANCE_AGENT` names the agent binary;
/// `MCP_CONFORMANCE_SCENARIO` and `MCP_CONFORMANCE_CONTEXT` are the suite's. Exits 0 when the
/// prompt ended with `end_turn` and the agent shut down cleanly, else 1 (a panic, 101).
pub fn client_main() -> ! {
    let url = std::env::args().next_back().unwrap_or_default();
    let agent_bin = std::env::var("BUZZ_CONFORMANCE_AGENT").unwrap_or_else(|_| {
        eprintln!("conformance-client: BUZZ_CONFORMANCE_AGENT is not set");
        std::process::exit(2)
    });
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let context: Option<Value> = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|c| serde_json::from_str(&c).ok());
    let dir = tempfile::Builder::new()
        .prefix("buzz-conformance-client-")
        .tempdir()
        .expect("a temporary directory");
    let llm = FakeLlm::with_handler(script);
    let mut env = env_for_origin(Wire::Chat, &llm.origin());
    env.push((
        "BROWSER".into(),
        conformance_auth::browser_command(&current_exe()),
    ));
    if let Some(file) = conformance_auth::clients_file(&scenario, context.as_ref(), SERVER_NAME) {
        let path = dir.path().join("oauth-clients.json");
        std::fs::write(&path, file.to_string()).expect("write the clients file");
        env.push((
            "BUZZ_AGENT_OAUTH_CLIENTS_FILE".into(),
            path.display().to_string(),
        ));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let agent = AgentProc::spawn_with(&agent_bin, &env, dir.path(), StderrMode::Read);
    // A client that presents forms: the server's `elicitation/create` comes to it, and it
    // accepts with every field left out (the agent fills the schema's defaults, SPEC M12).
    agent.set_elicitation_answer(|_| Some(json!({"action": "accept", "content": {}})));
    let init = agent.request("initialize", initialize_params());
    agent.result(&init);
    let entry = json!({"type": "http", "name": SERVER_NAME, "url": url, "headers": []});
    let sid = agent.new_session(dir.path(), json!([entry]));
    let r = agent.prompt_timeout(&sid, "Use the tools of the conf server.", DEFAULT_TIMEOUT);
    let stop = agent.result(&r)["stopReason"].clone();
    agent.finish_keep();
    eprint!("{}", agent.stderr_text());
    if stop != "end_turn" {
        eprintln!("conformance-client: the prompt ended with {r}");
        drop(agent);
        std::process::exit(1);
    }
    // `exit` runs no destructors: the agent handle and the fake LLM go first.
    drop(agent);
    drop(llm);
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_suite_is_the_one_the_scenarios_are_listed_for() {
        let pkg: Value = serde_json::from_str(include_str!("../package.json")).unwrap();
        assert_eq!(
            pkg["dependencies"]["@modelcontextprotocol/conformance"],
            SUITE_VERSION
        );
        let node = pkg["dependencies"]["node"].as_str().unwrap();
        let major: u32 = node.split('.').next().unwrap().parse().unwrap();
        assert!(major >= 22, "the suite needs Node >= 22, pinned {node}");
        for (name, _) in KNOWN_FAILING {
            assert!(
                SCENARIOS.contains(name),
                "{name} is no scenario of the suite"
            );
        }
    }

    #[test]
    fn m10_the_scripted_model_calls_every_tool_of_the_server_with_schema_arguments() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer"}, "s": {"type": "string"},
            "e": {"enum": ["x", "y"]}, "f": {"type": "boolean"},
            "o": {"type": "object", "properties": {"n": {"type": "number"}}}}});
        assert_eq!(
            arguments(&schema),
            json!({"a": 2, "b": 2, "s": "conformance", "e": "x", "f": true, "o": {"n": 2}})
        );
        assert_eq!(arguments(&json!({"type": "object"})), json!({}));
    }

    #[test]
    fn the_client_command_quotes_its_paths_for_the_shell() {
        let cmd = client_command(Path::new("/a b/it's"));
        assert!(
            cmd.contains(r"BUZZ_CONFORMANCE_AGENT='/a b/it'\''s'"),
            "{cmd}"
        );
        assert!(cmd.starts_with("env BUZZ_E2E_ROLE=conformance-client "));
    }
}
