//! Differential testing (issue #6): the same scripted session, run against two agent binaries,
//! must produce the same ACP transcript (every stdout line, byte for byte, in order) and the same
//! sequence of LLM requests (method, path, JSON body). Both binaries share one pure core, so any
//! difference is a runtime bug (event ordering, lost or duplicated events, I/O framing).
//!
//! The session is deterministic by construction: the LLM is scripted by request index, every
//! client message is sent only after the agent's reaction to the previous one was seen,
//! permission requests are answered by hand one at a time (the next answer only after the
//! previous call finished), and the only concurrent tool calls are one that finishes and one
//! that never does before it is cancelled. No timeout, retry or backoff is on the path.
//!
//! Normalisation: none. Session ids are random (SPEC A9), so both runs fix them with the same
//! `BUZZ_AGENT_SEED` (documented for reproducible runs; each run keeps its sessions in a
//! fresh state directory of its own); tool call ids (`tc_N`), agent request ids and hook
//! injection ids are counters; both runs use the same workspace directory and the same fake
//! MCP command (this test binary), so no path differs; the fake LLM's port never reaches the
//! transcript or a request body. Stderr (log timings) is not compared.

use crate::fake_llm::{FakeLlm, Reply};
use crate::harness::{AgentProc, Ctx, PermissionPolicy, fake_mcp_entry};
use crate::scenarios::util::Scratch;
use libtest_mimic::{Completion, Failed, Trial};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What one run of [`record_scripted_session`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recording {
    /// Every line the agent wrote on stdout, in order, after [`normalise`].
    pub stdout: Vec<String>,
    /// Every LLM request as `METHOD PATH BODY-JSON`, in arrival order, after [`normalise`].
    pub llm_requests: Vec<String>,
}

/// Objection text of the hook server's one `_Stop` objection.
pub const STOP_TEXT: &str = "2 tests still red: \"parse\" fails";
/// What `_PostCompact` answers.
pub const POSTCOMPACT_TEXT: &str = "re-read NOTES.md after compaction";
/// The summary the compaction call gets.
const SUMMARY_TEXT: &str = "SUMMARY: echoed alpha and beta; next, finish.";
/// How long any single wait may take (a hang guard only; no step races against it).
const WAIT: Duration = Duration::from_secs(30);

/// The LLM script, answered by request index (one LLM call at a time, so the order is fixed).
fn script() -> Vec<Reply> {
    vec![
        // Prompt 1, round 1: four calls in one response — a good one, an unknown tool, invalid
        // argument JSON, and a second good one — after some text.
        Reply::tool_calls_raw(vec![
            ("call_echo_1", "tools__echo", r#"{"text":"alpha"}"#.into()),
            ("call_unknown", "nosuch__tool", "{}".into()),
            ("call_bad_args", "tools__echo", r#"{"text": oops"#.into()),
            ("call_slow_1", "tools__slow", r#"{"ms":5}"#.into()),
        ])
        .with_text("Let me use the tools."),
        // Round 2: one call; the reported usage puts the context over 90 % of 6000 tokens, so
        // the next round compacts first (K1) and `_PostCompact` runs (H7).
        Reply::tool_calls(vec![(
            "call_echo_2",
            "tools__echo",
            json!({"text": "beta"}),
        )])
        .usage(Some((5500, 10))),
        // The summary call.
        Reply::text(SUMMARY_TEXT).usage(Some((900, 30))),
        // The live round after compaction: an answer, which `_Stop` objects to once (H5)…
        Reply::text("All done."),
        // … then the answer after the objection: `_Stop` clears, end_turn.
        Reply::text("Fixed the red tests; all done."),
        // Prompt 2: two parallel calls; the slow one is cancelled mid-call (A4).
        Reply::tool_calls(vec![
            ("call_echo_3", "tools__echo", json!({"text": "gamma"})),
            ("call_slow_2", "tools__slow", json!({"ms": 60000})),
        ]),
        // Prompt 3 (permission ask): two parallel calls, allowed once then rejected once.
        Reply::tool_calls(vec![
            ("call_guard_1", "guard__echo", json!({"text": "allowed"})),
            ("call_guard_2", "guard__echo", json!({"text": "rejected"})),
        ]),
        Reply::text("Third prompt done."),
    ]
}

/// Runs the scripted session against `agent_bin` with its session cwd (and process cwd) `ws`,
/// plus `extra_env` for the agent; returns the normalised recording. Panics when the agent
/// misbehaves on the way (no response, bad exit, leaked process, stdout violation).
pub fn record_scripted_session(
    agent_bin: &Path,
    ws: &Path,
    extra_env: &[(&str, &str)],
) -> Recording {
    let replies = script();
    let expected_requests = replies.len();
    let llm = FakeLlm::scripted(replies);
    // The scripted session runs no subcommand.
    let ctx = Ctx::new(agent_bin, false);
    let mut env = vec![
        ("MCP_HOOK_SERVERS", "guard"),
        ("BUZZ_AGENT_PERMISSION", "ask"),
        ("BUZZ_AGENT_MAX_CONTEXT_TOKENS", "6000"),
        ("BUZZ_AGENT_MAX_OUTPUT_TOKENS", "1000"),
        // The same session ids on both binaries (SPEC A9: random otherwise).
        ("BUZZ_AGENT_SEED", "6"),
    ];
    env.extend_from_slice(extra_env);
    let agent = ctx.agent(&llm, &env, ws);
    // Every permission request is answered by hand below, one at a time.
    agent.set_permission_policy(PermissionPolicy::NoReply);

    agent.initialize();
    let tools = fake_mcp_entry("tools", &[("FAKE_MCP_TOOLS", "echo,slow")]);
    let guard = fake_mcp_entry(
        "guard",
        &[
            ("FAKE_MCP_TOOLS", "echo"),
            ("FAKE_MCP_STOP", "1"),
            ("FAKE_MCP_STOP_OBJECT_TIMES", "1"),
            ("FAKE_MCP_STOP_TEXT", STOP_TEXT),
            ("FAKE_MCP_POSTCOMPACT_TEXT", POSTCOMPACT_TEXT),
        ],
    );
    let sid = agent.new_session(ws, json!([tools, guard]));

    // Prompt 1: parallel calls, unknown tool, invalid arguments, two asks answered
    // allow_always one after the other, compaction + `_PostCompact`, a `_Stop` objection.
    let p1 = agent.start_prompt(&sid, "Prompt 1: echo alpha and beta, then finish.");
    let asks = wait_permission_requests(&agent, 2);
    answer_and_wait(&agent, &asks[0], "allow_always", "completed");
    answer(&agent, &asks[1], "allow_always");
    let r1 = agent.wait_response(&p1, WAIT);
    assert_eq!(agent.result(&r1)["stopReason"], "end_turn", "{r1}");

    // Prompt 2: both calls remembered (no ask); cancel once echo finished and slow runs.
    let mark = agent.transcript().len();
    let p2 = agent.start_prompt(&sid, "Prompt 2: echo gamma and sleep a minute.");
    agent.wait_until("prompt 2: echo completed and slow in progress", WAIT, |t| {
        let ups: Vec<&Value> = t[mark.min(t.len())..]
            .iter()
            .map(|m| &m["params"]["update"])
            .collect();
        let status = |status: &str| {
            ups.iter()
                .filter(|u| u["status"] == status)
                .map(|u| u["toolCallId"].clone())
                .collect::<Vec<_>>()
        };
        status("completed").len() == 1 && status("in_progress").len() == 2
    });
    agent.send(&json!({"jsonrpc": "2.0", "method": "session/cancel",
                       "params": {"sessionId": sid}}));
    let r2 = agent.wait_response(&p2, WAIT);
    assert_eq!(agent.result(&r2)["stopReason"], "cancelled", "{r2}");

    // Prompt 3: guard__echo is not remembered: both calls ask; allow_once the first, and
    // only after it completed, reject_once the second.
    let p3 = agent.start_prompt(&sid, "Prompt 3: echo twice, with permission.");
    let asks = wait_permission_requests(&agent, 4);
    answer_and_wait(&agent, &asks[2], "allow_once", "completed");
    answer(&agent, &asks[3], "reject_once");
    let r3 = agent.wait_response(&p3, WAIT);
    assert_eq!(agent.result(&r3)["stopReason"], "end_turn", "{r3}");

    // Garbage from the client: each answered with a null-id error before the next is sent.
    for (i, garbage) in [
        &b"this line is not JSON\n"[..],
        b"{\"jsonrpc\": \"2.0\", \"id\": 7,\n",
        b"42\n",
    ]
    .into_iter()
    .enumerate()
    {
        agent.send_raw(garbage);
        agent.wait_until("a null-id error for a garbage line", WAIT, |t| {
            t.iter()
                .filter(|m| m.get("method").is_none() && m.get("id") == Some(&Value::Null))
                .count()
                > i
        });
    }
    // An unknown notification (never answered), then an unknown method (answered -32601).
    agent.send(&json!({"jsonrpc": "2.0", "method": "no/such_notification", "params": {}}));
    let r = agent.request("no/such_method", json!({"x": 1}));
    assert_eq!(agent.error(&r).0, -32601, "{r}");

    // EOF: clean exit, nothing left behind, no stdout violation.
    agent.finish_keep();
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        expected_requests,
        "the script was not followed exactly: {:#?}",
        requests
            .iter()
            .map(|r| r.body.to_string())
            .collect::<Vec<_>>()
    );
    let recording = Recording {
        stdout: agent.stdout_lines(),
        llm_requests: requests
            .iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.body))
            .collect(),
    };
    normalise(recording)
}

/// Replaces what is legitimately run-specific. Nothing is, today (see the module docs); this is
/// the one place to add a placeholder should that change.
pub fn normalise(recording: Recording) -> Recording {
    recording
}

/// The `session/request_permission` requests received so far, once there are at least `n`.
fn wait_permission_requests(agent: &AgentProc, n: usize) -> Vec<Value> {
    agent.wait_until(&format!("{n} permission request(s)"), WAIT, |t| {
        t.iter()
            .filter(|m| m["method"] == "session/request_permission")
            .count()
            >= n
    });
    agent.permission_requests()
}

/// Answers permission request `req` with the option of kind `kind`.
fn answer(agent: &AgentProc, req: &Value, kind: &str) {
    let option = req["params"]["options"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == kind)
        .and_then(|o| o["optionId"].as_str())
        .unwrap_or_else(|| panic!("no {kind} option in {req}"))
        .to_string();
    agent.send(&json!({"jsonrpc": "2.0", "id": req["id"],
                       "result": {"outcome": {"outcome": "selected", "optionId": option}}}));
}

/// [`answer`], then waits for the call's `tool_call_update` with `status`.
fn answer_and_wait(agent: &AgentProc, req: &Value, kind: &str, status: &str) {
    answer(agent, req, kind);
    let id = req["params"]["toolCall"]["toolCallId"].clone();
    agent.wait_until(&format!("tool call {id} {status}"), WAIT, |t| {
        t.iter().any(|m| {
            let u = &m["params"]["update"];
            u["sessionUpdate"] == "tool_call_update"
                && u["toolCallId"] == id
                && u["status"] == status
        })
    });
}

/// Panics unless `rec` shows the session really ran: enough lines, every stop reason, the
/// objection injected into the LLM history, compaction, permission requests, garbage answered.
pub fn assert_non_trivial(rec: &Recording) {
    let out = rec.stdout.join("\n");
    let llm = rec.llm_requests.join("\n");
    assert!(
        rec.stdout.len() >= 40,
        "only {} stdout lines:\n{out}",
        rec.stdout.len()
    );
    assert_eq!(rec.llm_requests.len(), script().len(), "{llm}");
    let needles: [(&str, &str, &str); 12] = [
        ("stdout", &out, r#""stopReason":"end_turn""#),
        ("stdout", &out, r#""stopReason":"cancelled""#),
        ("stdout", &out, r#""method":"session/request_permission""#),
        ("stdout", &out, "unknown tool: nosuch__tool"),
        ("stdout", &out, "invalid arguments for tools__echo"),
        ("stdout", &out, "tool call not authorized"),
        ("stdout", &out, r#""status":"in_progress""#),
        ("stdout", &out, r#""code":-32601"#),
        ("stdout", &out, r#""id":null"#),
        ("llm", &llm, "guard___Stop"),
        ("llm", &llm, "___PostCompact"),
        ("llm", &llm, "[Context summary"),
    ];
    for (which, hay, needle) in needles {
        assert!(hay.contains(needle), "{which} lacks {needle:?}:\n{hay}");
    }
    // Both hook texts reach the model (inside JSON inside the JSON body, hence no quotes).
    for text in ["2 tests still red", POSTCOMPACT_TEXT] {
        assert!(llm.contains(text), "llm lacks {text:?}:\n{llm}");
    }
}

/// `None` when equal, else a readable report: the first differing index and both lines (or
/// which side ended first).
pub fn first_difference(
    what: &str,
    a_name: &str,
    a: &[String],
    b_name: &str,
    b: &[String],
) -> Option<String> {
    let i = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))?;
    let show = |v: &[String]| {
        v.get(i)
            .map_or("<no line: ended>".to_string(), |l| l.clone())
    };
    let column = match (a.get(i), b.get(i)) {
        (Some(x), Some(y)) => {
            let at = x.bytes().zip(y.bytes()).take_while(|(p, q)| p == q).count();
            format!(", first differing byte {at}")
        }
        _ => String::new(),
    };
    let context = |v: &[String]| {
        v[i.saturating_sub(2)..i.min(v.len())]
            .iter()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    Some(format!(
        "{what} differ at index {i}{column} ({a_name}: {} lines, {b_name}: {} lines)\n  preceding (same on both):\n{}\n  {a_name}: {}\n  {b_name}: {}",
        a.len(),
        b.len(),
        context(a),
        show(a),
        show(b),
    ))
}

/// Runs the session on `a` and on `b` (in the same workspace directory, one after the other)
/// and panics with [`first_difference`] reports unless both recordings are equal and
/// non-trivial. `b_env` is extra agent environment for `b` only (empty in the real test).
pub fn assert_same_behaviour(a: &Path, b: &Path, b_env: &[(&str, &str)]) {
    let scratch = Scratch::new();
    let ra = record_scripted_session(a, &scratch.ws, &[]);
    assert_non_trivial(&ra);
    let rb = record_scripted_session(b, &scratch.ws, b_env);
    let (an, bn) = (name(a), name(b));
    dump(&an, &ra);
    dump(&bn, &rb);
    let diffs: Vec<String> = [
        first_difference(
            "ACP transcripts (stdout lines)",
            &an,
            &ra.stdout,
            &bn,
            &rb.stdout,
        ),
        first_difference("LLM requests", &an, &ra.llm_requests, &bn, &rb.llm_requests),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(diffs.is_empty(), "{}", diffs.join("\n\n"));
    assert_non_trivial(&rb);
}

/// With `BUZZ_E2E_DIFF_DUMP=<dir>`, writes `<dir>/<name>.stdout` and `<dir>/<name>.llm` (one
/// line each) for inspection with `diff`.
fn dump(name: &str, rec: &Recording) {
    let Some(dir) = std::env::var_os("BUZZ_E2E_DIFF_DUMP") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    for (ext, lines) in [("stdout", &rec.stdout), ("llm", &rec.llm_requests)] {
        let path = dir.join(format!("{name}.{ext}"));
        std::fs::write(&path, lines.join("\n") + "\n")
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}

fn name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `None` when the sibling binary `other` exists; else the trial's outcome: ignored with the
/// reason, or failed when `ci` (a CI run must not silently skip the comparison).
pub fn missing_sibling(
    other: &Path,
    sibling: &str,
    ci: bool,
) -> Option<Result<Completion, Failed>> {
    if other.is_file() {
        return None;
    }
    let why = format!(
        "{} missing: build it first (`cargo build -p {sibling}`, or `cargo test --workspace`)",
        other.display()
    );
    Some(if ci {
        Err(Failed::from(format!("CI is set and {why}")))
    } else {
        Ok(Completion::ignored_with(why))
    })
}

/// The entry point of a runtime crate's `harness = false` differential test: serves the fake
/// MCP role when asked (this binary is the fake MCP server), then runs one trial comparing
/// `agent_bin` with its sibling binary `sibling` in the same directory (cargo puts every
/// workspace binary in one target directory). A missing sibling makes the trial ignored with
/// the reason, or failed when `CI` is set ([`crate::peers::in_ci`]).
pub fn main(agent_bin: &str, sibling: &str) {
    crate::serve_role_if_asked();
    let args = libtest_mimic::Arguments::from_args();
    let agent_bin = PathBuf::from(agent_bin);
    let other = agent_bin.with_file_name(sibling);
    let trial_name = format!("differential::{sibling}_vs_{}", name(&agent_bin));
    let sibling = sibling.to_string();
    let trial = Trial::ignorable_test(trial_name, move || {
        if let Some(outcome) = missing_sibling(&other, &sibling, crate::peers::in_ci()) {
            return outcome;
        }
        assert_same_behaviour(&other, &agent_bin, &[]);
        Ok(Completion::Completed)
    });
    libtest_mimic::run(&args, vec![trial]).exit();
}

#[cfg(test)]
mod tests {
    use super::{first_difference, missing_sibling};
    use libtest_mimic::Completion;
    use std::path::Path;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn first_difference_names_index_and_both_lines() {
        assert_eq!(
            first_difference("x", "a", &v(&["1", "2"]), "b", &v(&["1", "2"])),
            None
        );
        let d =
            first_difference("x", "a", &v(&["1", "2", "3"]), "b", &v(&["1", "2", "4"])).unwrap();
        assert!(
            d.contains("index 2, first differing byte 0")
                && d.contains("a: 3")
                && d.contains("b: 4"),
            "{d}"
        );
        let d = first_difference("x", "a", &v(&["1"]), "b", &v(&["1", "2"])).unwrap();
        assert!(
            d.contains("index 1") && d.contains("a: <no line: ended>") && d.contains("b: 2"),
            "{d}"
        );
    }

    #[test]
    fn missing_sibling_is_ignored_locally_and_fails_in_ci() {
        let this = std::env::current_exe().unwrap();
        assert!(missing_sibling(&this, "x", true).is_none());
        let gone = Path::new("/nonexistent/buzz-agent");
        match missing_sibling(gone, "buzz-agent", false) {
            Some(Ok(Completion::Ignored { reason: Some(r) })) => {
                assert!(r.contains("/nonexistent/buzz-agent missing"), "{r}")
            }
            _ => panic!("expected ignored with a reason"),
        }
        match missing_sibling(gone, "buzz-agent", true) {
            Some(Err(f)) => assert!(
                f.message().is_some_and(|m| m.starts_with("CI is set")),
                "{f:?}"
            ),
            _ => panic!("expected a failure in CI"),
        }
    }
}
