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
//! [`trials`] is one trial per scenario of each [`Suite`]: the pinned release ([`PINNED`],
//! `conformance::<scenario>`) and the 2025-11-25 client scenarios of its prerelease
//! ([`PRERELEASE`], `conformance_prerelease::<scenario>`, installed under the npm alias
//! `conformance-prerelease`), run by the suite of each binary. A scenario in a suite's
//! `known_failing` must still fail (reported ignored, with its reason); one that starts passing
//! fails its trial until it is taken off the list, so the list stays true. The figures
//! (`MCP conformance <version>: N/M client scenarios passed`, one line per suite) are printed
//! after the run.

use crate::conformance_auth;
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply, Wire};
use crate::harness::{AgentProc, DEFAULT_TIMEOUT, StderrMode, current_exe, env_for_origin};
use crate::peers::{in_ci, node_modules};
use libtest_mimic::{Completion, Failed, Trial};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The `mcpServers` name the driver gives the scenario's server.
pub const SERVER_NAME: &str = "conf";

/// One version of the official suite: where it is installed, which client scenarios run, and
/// which of them are known to fail.
#[derive(Debug)]
pub struct Suite {
    /// The version `tests/package.json` pins (checked by a unit test below).
    pub version: &'static str,
    /// The package's directory under `tests/node_modules` (its name in `tests/package.json`).
    pub package: &'static str,
    /// The trials' name prefix (`<prefix>::<scenario>`).
    pub prefix: &'static str,
    /// `--spec-version` for every run (`None`: the suite's default).
    pub spec_version: Option<&'static str>,
    /// The client scenarios run (`conformance list --client`, with `spec_version` when set), in
    /// the suite's order, in parts ([`Suite::scenarios`] joins them).
    pub parts: &'static [&'static [&'static str]],
    /// The scenarios known to fail on both binaries, each with the reason. Their trials check
    /// that they still fail; a scenario that passes must be taken off this list.
    pub known_failing: &'static [(&'static str, &'static str)],
    /// Scenarios passed in this process (for the figures printed after the run).
    passed: AtomicUsize,
    /// Scenarios run in this process.
    ran: AtomicUsize,
}

/// Why `auth/2025-03-26-oauth-metadata-backcompat` fails, by choice (docs/conformance.md).
const STRICT_ISSUER: &str = "the fixture's authorization server metadata, fetched from the \
     server's origin, names the issuer <origin>/oauth; RFC 8414 section 3.3 requires them to be \
     identical and the agent keeps that check (docs/conformance.md)";

/// The client scenarios the release and the prerelease's 2025-11-25 set share, in the
/// suites' order (the release lists them first).
const SHARED: &[&str] = &[
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
];

/// The pinned release: every client scenario of `conformance list` ("Client scenarios").
pub static PINNED: Suite = Suite {
    version: "0.1.16",
    package: "@modelcontextprotocol/conformance",
    prefix: "conformance",
    spec_version: None,
    parts: &[
        SHARED,
        &[
            "auth/2025-03-26-oauth-metadata-backcompat",
            "auth/2025-03-26-oauth-endpoint-fallback",
            "auth/resource-mismatch",
            "auth/offline-access-scope",
            "auth/offline-access-not-supported",
            "auth/client-credentials-jwt",
            "auth/client-credentials-basic",
            "auth/cross-app-access-complete-flow",
        ],
    ],
    known_failing: &[("auth/2025-03-26-oauth-metadata-backcompat", STRICT_ISSUER)],
    passed: AtomicUsize::new(0),
    ran: AtomicUsize::new(0),
};

/// The prerelease, installed under the npm alias `conformance-prerelease`: its client
/// scenarios for MCP 2025-11-25 (`conformance list --client --spec-version 2025-11-25`).
pub static PRERELEASE: Suite = Suite {
    version: "0.2.0-alpha.12",
    package: "conformance-prerelease",
    prefix: "conformance_prerelease",
    spec_version: Some("2025-11-25"),
    parts: &[SHARED, &["json-schema-2020-12-preservation"]],
    known_failing: &[],
    passed: AtomicUsize::new(0),
    ran: AtomicUsize::new(0),
};

/// Every suite run, the pinned release first.
pub static SUITES: [&Suite; 2] = [&PINNED, &PRERELEASE];

/// `tests/node_modules/.bin/node`: the Node (>= 22) of the npm package `node`, which the
/// suite needs (the system's may be older).
pub fn node_bin() -> PathBuf {
    node_modules().join(".bin/node")
}

impl Suite {
    /// The suite's command line entry point in `tests/node_modules`.
    pub fn js(&self) -> PathBuf {
        node_modules().join(self.package).join("dist/index.js")
    }

    /// The client scenarios run, in order.
    pub fn scenarios(&self) -> impl Iterator<Item = &'static str> {
        self.parts.iter().flat_map(|part| part.iter().copied())
    }
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

/// Runs `scenario` of `suite` against `agent_bin` (`conformance client --scenario …
/// [--spec-version …] --command …`) and reads its verdict.
///
/// # Panics
/// When Node cannot be started or its output is not the suite's.
pub fn run_scenario(suite: &Suite, agent_bin: &Path, scenario: &str) -> Outcome {
    let dir = tempfile::Builder::new()
        .prefix("buzz-conformance-")
        .tempdir()
        .expect("a temporary directory");
    let spec_version = suite.spec_version.map(|v| ["--spec-version", v]);
    let out = Command::new(node_bin())
        .arg(suite.js())
        .args(["client", "--scenario", scenario, "--timeout", "60000"])
        .args(spec_version.iter().flatten())
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

/// One trial per scenario of every suite of [`SUITES`] against `agent_bin`, named
/// `<prefix>::<scenario>`. Without a suite installed: failed under `CI`, else ignored with how
/// to install it.
pub fn trials(agent_bin: &Path) -> Vec<Trial> {
    SUITES
        .iter()
        .flat_map(|&suite| {
            suite
                .scenarios()
                .map(move |scenario| trial(suite, agent_bin.to_path_buf(), scenario))
        })
        .collect()
}

/// The trial of `scenario` of `suite` against `agent_bin`.
fn trial(suite: &'static Suite, agent_bin: PathBuf, scenario: &'static str) -> Trial {
    let known = suite
        .known_failing
        .iter()
        .find(|(name, _)| *name == scenario)
        .map(|(_, why)| *why);
    Trial::ignorable_test(format!("{}::{scenario}", suite.prefix), move || {
        if !suite.js().is_file() || !node_bin().is_file() {
            let why = format!(
                "{} missing: run `npm ci` in {}",
                suite.js().display(),
                env!("CARGO_MANIFEST_DIR")
            );
            return if in_ci() {
                Err(Failed::from(format!("CI is set and {why}")))
            } else {
                Ok(Completion::ignored_with(why))
            };
        }
        let outcome = run_scenario(suite, &agent_bin, scenario);
        suite.ran.fetch_add(1, Ordering::Relaxed);
        if outcome.passed {
            suite.passed.fetch_add(1, Ordering::Relaxed);
        }
        match (outcome.passed, known) {
            (true, None) => Ok(Completion::Completed),
            (false, Some(why)) => Ok(Completion::ignored_with(format!(
                "known failure, ran and still fails: {why}"
            ))),
            (true, Some(_)) => Err(Failed::from(format!(
                "{scenario} passes now: take it off the known failures of conformance {}",
                suite.version
            ))),
            (false, None) => Err(Failed::from(format!(
                "{scenario} failed:\n  {}\n--- suite output:\n{}",
                outcome.failures.join("\n  "),
                outcome.log
            ))),
        }
    })
}

/// The figures lines of the run, one per suite that ran a scenario.
pub fn summary() -> Vec<String> {
    SUITES
        .iter()
        .filter_map(|suite| {
            let ran = suite.ran.load(Ordering::Relaxed);
            (ran > 0).then(|| {
                format!(
                    "MCP conformance {}: {}/{ran} client scenarios passed ({} of the suite{})",
                    suite.version,
                    suite.passed.load(Ordering::Relaxed),
                    suite.scenarios().count(),
                    suite
                        .spec_version
                        .map(|v| format!(" for {v}"))
                        .unwrap_or_default()
                )
            })
        })
        .collect()
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

/// The arguments the scripted model gives tool `n` of `tools` (the server's tools as offered
/// to it, `(name, input schema)`): [`arguments`] of its schema, except that an object property
/// named `schema` gets the input schema offered for the first other tool, verbatim (as a model
/// asked to pass a tool's schema back does; what the agent dropped from it, the model never
/// saw).
fn call_arguments(n: usize, tools: &[(String, Option<Value>)]) -> Value {
    let Some(schema) = &tools[n].1 else {
        return json!({});
    };
    let mut args = arguments(schema);
    let other = tools
        .iter()
        .enumerate()
        .find_map(|(m, (_, s))| s.as_ref().filter(|_| m != n));
    if let (Some(other), true) = (other, schema["properties"]["schema"]["type"] == "object") {
        args["schema"] = other.clone();
    }
    args
}

/// The scripted model: on the first request it calls every tool of [`SERVER_NAME`] it was
/// offered (arguments by [`call_arguments`]), on every later one it ends its turn with a text.
fn script(i: usize, req: &RecordedRequest) -> Reply {
    let prefix = format!("{SERVER_NAME}__");
    let tools: Vec<(String, Option<Value>)> = req
        .tool_schemas()
        .into_iter()
        .filter(|(name, ..)| name.starts_with(&prefix))
        .map(|(name, _, schema)| (name, schema))
        .collect();
    if i > 0 || tools.is_empty() {
        return Reply::text("done");
    }
    let calls: Vec<(String, &str, Value)> = tools
        .iter()
        .enumerate()
        .map(|(n, (name, _))| (format!("call{n}"), name.as_str(), call_arguments(n, &tools)))
        .collect();
    Reply::tool_calls(
        calls
            .iter()
            .map(|(id, name, args)| (id.as_str(), *name, args.clone()))
            .collect(),
    )
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
    fn the_pinned_suites_are_the_ones_the_scenarios_are_listed_for() {
        let pkg: Value = serde_json::from_str(include_str!("../package.json")).unwrap();
        let lock: Value = serde_json::from_str(include_str!("../package-lock.json")).unwrap();
        for suite in SUITES {
            let pinned = pkg["dependencies"][suite.package].as_str().unwrap();
            assert!(
                pinned == suite.version
                    || pinned == format!("npm:@modelcontextprotocol/conformance@{}", suite.version),
                "{}: package.json pins {pinned}, not {}",
                suite.package,
                suite.version
            );
            let locked = &lock["packages"][format!("node_modules/{}", suite.package)];
            assert_eq!(locked["version"], suite.version, "{}", suite.package);
            for (name, _) in suite.known_failing {
                assert!(
                    suite.scenarios().any(|s| s == *name),
                    "{name} is no scenario of conformance {}",
                    suite.version
                );
            }
        }
        assert_eq!(PINNED.scenarios().count(), 26);
        assert_eq!(PRERELEASE.scenarios().count(), 19);
        let node = pkg["dependencies"]["node"].as_str().unwrap();
        let major: u32 = node.split('.').next().unwrap().parse().unwrap();
        assert!(major >= 22, "the suite needs Node >= 22, pinned {node}");
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
    fn m10_a_schema_argument_of_the_scripted_model_is_another_tools_schema_verbatim() {
        let rich = json!({"$schema": "https://json-schema.org/draft/2020-12/schema",
                          "type": "object", "$defs": {"a": {"type": "string"}},
                          "additionalProperties": false});
        let echo = json!({"type": "object", "properties": {"schema": {"type": "object"}}});
        let tools = [
            ("conf__rich".to_string(), Some(rich.clone())),
            ("conf__echo".to_string(), Some(echo.clone())),
        ];
        assert_eq!(call_arguments(1, &tools), json!({"schema": rich}));
        assert_eq!(call_arguments(0, &tools), json!({}));
        // Alone, a `schema` property is an object made from its own schema.
        assert_eq!(call_arguments(0, &tools[1..]), json!({"schema": {}}));
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
