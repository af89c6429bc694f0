//! SEP-2624 conformance replay (SPEC X1; issue 16): the MCP Interceptors working group's 14
//! `protocol/` fixtures (`tests/fixtures/sep-2624/`, replay rules in its README and in the
//! suite's `conformance/ADAPTER.md`).
//!
//! The adapter contract, mapped onto buzz-agent's pure pieces:
//! - `createSession(interceptors)` = [`ExampleServer::from_config`] on the fixture's
//!   `interceptors` array (the example server's own configuration format);
//! - `list` / `invoke` = a JSON-RPC request line through [`ExampleServer::handle_line`], the
//!   response line decoded with the core's JSON-RPC codec;
//! - `apply` (the suite's chain step) = discovery with `interceptors/list` for the event, the
//!   descriptors decoded with [`ListResult::from_value`], then the core's [`Chain`] executor,
//!   every `interceptor/invoke` it asks for answered by the example server over JSON-RPC lines.
//!
//! Comparison: volatile keys scrubbed recursively, JCS-canonical string compared with the
//! fixture's precomputed `canonical` / `finalPayloadCanonical`; `errorCode` expectations need
//! that JSON-RPC error. A fixture passes iff every step passes; the test fails unless all 14
//! pass (no skips).
#![allow(
    clippy::disallowed_methods,
    reason = "the test reads its fixture files; the core itself does no file IO"
)]

use buzz_agent_core::MonoTime;
use buzz_agent_core::interceptor::chain::{Chain, ChainOutput, ChainRequest, InvokeReply, Member};
use buzz_agent_core::interceptor::example_server::ExampleServer;
use buzz_agent_core::interceptor::wire::{INVOKE_METHOD, LIST_METHOD, ListResult, Phase};
use buzz_agent_core::jsonrpc::{self, Message, RpcError};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The fixtures the working group publishes under `conformance/fixtures/protocol/`.
const EXPECTED_FIXTURES: usize = 14;
/// The server name the replay gives the example server's interceptors.
const SERVER: &str = "example";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sep-2624/protocol")
}

/// RFC 8785 (JCS) canonical JSON for the values the fixtures hold: object keys sorted by their
/// UTF-16 code units, no whitespace, serde_json's minimal string escapes, integral numbers
/// written without a fraction.
fn canonical(v: &Value) -> String {
    match v {
        Value::Null | Value::Bool(_) | Value::String(_) => v.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
            (None, None, _) => n.to_string(),
        },
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", inner.join(","))
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&o[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
    }
}

/// `v` without the keys named in `volatile`, at every depth.
fn scrub(v: &Value, volatile: &[String]) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(|i| scrub(i, volatile)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| !volatile.contains(k))
                .map(|(k, v)| (k.clone(), scrub(v, volatile)))
                .collect(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => v.clone(),
    }
}

/// One request through the example server as JSON-RPC lines: `Ok(result)` or `Err(error)`.
fn call(server: &ExampleServer, id: u64, method: &str, params: &Value) -> Result<Value, RpcError> {
    let line = jsonrpc::encode_request(id, method, params);
    let Some(reply) = server.handle_line(line.as_bytes()) else {
        return Err(RpcError::new(0, format!("no response to {method}")));
    };
    match jsonrpc::parse_message(reply.as_bytes()) {
        Ok(Message::Response { id: got, outcome }) if got == json!(id) => outcome,
        other => Err(RpcError::new(0, format!("not our response: {other:?}"))),
    }
}

fn compare(actual: &Value, expect: &Value, key: &str, volatile: &[String]) -> Result<(), String> {
    let Some(want) = expect.get(key).and_then(Value::as_str) else {
        return Err(format!("fixture has no {key:?}"));
    };
    let got = canonical(&scrub(actual, volatile));
    if got == want {
        Ok(())
    } else {
        Err(format!("expected {want}\n         actual   {got}"))
    }
}

fn list_step(server: &ExampleServer, step: &Value, volatile: &[String]) -> Result<(), String> {
    let params = match step.get("event") {
        Some(Value::String(e)) => json!({ "event": e }),
        Some(_) | None => json!({}),
    };
    let result = call(server, 1, LIST_METHOD, &params).map_err(|e| format!("error {e}"))?;
    compare(&result, &step["expect"], "canonical", volatile)
}

fn invoke_step(server: &ExampleServer, step: &Value, volatile: &[String]) -> Result<(), String> {
    let outcome = call(server, 2, INVOKE_METHOD, &step["params"]);
    let expect = &step["expect"];
    match (expect.get("errorCode").and_then(Value::as_i64), outcome) {
        (Some(code), Err(e)) if e.code == code => Ok(()),
        (Some(code), Err(e)) => Err(format!("expected error {code}, got error {e}")),
        (Some(code), Ok(r)) => Err(format!("expected error {code}, got result {r}")),
        (None, Err(e)) => Err(format!("expected a result, got error {e}")),
        (None, Ok(result)) => compare(&result, expect, "canonical", volatile),
    }
}

/// One chain execution over the session's interceptors, with the example server answering.
fn apply_step(server: &ExampleServer, step: &Value, volatile: &[String]) -> Result<(), String> {
    let event = step["event"]
        .as_str()
        .ok_or("apply step without an event")?;
    let phase = step["phase"]
        .as_str()
        .and_then(Phase::parse)
        .ok_or("apply step without a phase")?;
    let listed = call(server, 1, LIST_METHOD, &json!({ "event": event }))
        .map_err(|e| format!("interceptors/list failed: {e}"))?;
    let list = ListResult::from_value(&listed).map_err(|e| e.to_string())?;
    if !list.rejected.is_empty() {
        return Err(format!("descriptors rejected: {:?}", list.rejected));
    }
    let members: Vec<Member> = list
        .interceptors
        .into_iter()
        .map(|interceptor| Member {
            server: SERVER.to_owned(),
            interceptor,
        })
        .collect();
    let context = step.get("context").filter(|c| c.is_object()).cloned();
    let request = ChainRequest {
        event: event.to_owned(),
        phase,
        payload: step["payload"].clone(),
        timeout_ms: 2500,
        context,
    };
    let now = MonoTime::ZERO;
    let mut chain = Chain::start(&members, request, now);
    let mut next_id = 100;
    let verdict = loop {
        let Some(output) = chain.poll_output() else {
            return Err("the chain stalled without a verdict".into());
        };
        match output {
            ChainOutput::Invoke(inv) => {
                next_id += 1;
                let reply = match call(server, next_id, INVOKE_METHOD, &inv.params) {
                    Ok(result) => InvokeReply::Result(result),
                    Err(e) => InvokeReply::Error(e),
                };
                if !chain.handle_reply(inv.id, reply, now) {
                    return Err(format!("the chain refused the reply to {}", inv.id));
                }
            }
            ChainOutput::Abandon(a) => return Err(format!("unexpected timeout of {}", a.id)),
            ChainOutput::Log(_) => {}
            ChainOutput::Decided(v) => break v,
        }
    };
    let expect = &step["expect"];
    let decision = if verdict.is_allow() { "allow" } else { "deny" };
    let want = expect["decision"].as_str().unwrap_or("?");
    if decision != want {
        return Err(format!(
            "expected decision {want}, got {decision} ({:?})",
            verdict.denial_text()
        ));
    }
    let final_payload = match &verdict {
        buzz_agent_core::interceptor::Verdict::Allow { payload, .. } => payload.clone(),
        buzz_agent_core::interceptor::Verdict::Deny { .. } => Value::Null,
    };
    if expect.get("finalPayload").is_some() {
        compare(&final_payload, expect, "finalPayloadCanonical", volatile)?;
    }
    let text = canonical(&scrub(&final_payload, volatile));
    for s in expect["forbids"].as_array().into_iter().flatten() {
        if s.as_str().is_some_and(|s| text.contains(s)) {
            return Err(format!("forbidden content present: {s}"));
        }
    }
    for s in expect["requires"].as_array().into_iter().flatten() {
        if !s.as_str().is_some_and(|s| text.contains(s)) {
            return Err(format!("required content absent: {s}"));
        }
    }
    Ok(())
}

/// Replays one fixture; `Err` lists the failing steps.
fn run_fixture(fixture: &Value) -> Result<(), String> {
    let server = ExampleServer::from_config(&fixture["interceptors"])
        .map_err(|e| format!("createSession: {e}"))?;
    let volatile: Vec<String> = fixture["volatile"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let steps = fixture["steps"].as_array().ok_or("no steps")?;
    if steps.is_empty() {
        return Err("no steps".into());
    }
    let mut failures = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let op = step["op"].as_str().unwrap_or("?");
        let outcome = match op {
            "list" => list_step(&server, step, &volatile),
            "invoke" => invoke_step(&server, step, &volatile),
            // `apply` in the published fixtures, `chain` in the suite's TypeScript types.
            "apply" | "chain" => apply_step(&server, step, &volatile),
            other => Err(format!("unknown op {other:?}")),
        };
        if let Err(e) = outcome {
            failures.push(format!("step {i} ({op}): {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n       "))
    }
}

#[test]
fn x1_sep2624_protocol_fixtures_pass_14_of_14() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .expect("fixture folder")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert_eq!(paths.len(), EXPECTED_FIXTURES, "fixture count");
    let mut passed = 0;
    let mut report = Vec::new();
    let mut kinds = (0, 0);
    for path in &paths {
        let text = std::fs::read_to_string(path).expect("fixture text");
        let fixture: Value = serde_json::from_str(&text).expect("fixture JSON");
        let id = fixture["id"].as_str().unwrap_or("?").to_owned();
        let requirement = fixture["requirement"].as_str().unwrap_or("?").to_owned();
        let slug = id.trim_start_matches("protocol/");
        if slug.starts_with("chain-") {
            kinds.0 += 1;
        } else if slug.starts_with("list-") || slug.starts_with("invoke-") {
            kinds.1 += 1;
        }
        match run_fixture(&fixture) {
            Ok(()) => {
                passed += 1;
                report.push(format!("  PASS  {id} [{requirement}]"));
            }
            Err(e) => report.push(format!("  FAIL  {id} [{requirement}]\n       {e}")),
        }
    }
    eprintln!(
        "SEP-2624 conformance (core chain executor + example interceptor server):\n{}\n  {passed}/{} fixtures passed",
        report.join("\n"),
        paths.len()
    );
    assert_eq!(kinds, (7, 7), "7 chain-* and 7 list-*/invoke-* fixtures");
    assert_eq!(passed, paths.len(), "{}", report.join("\n"));
}

#[test]
fn x1_the_replay_can_fail_a_wrong_expectation() {
    // The runner's own check: a fixture whose expectation is wrong must fail, so a pass means
    // something.
    let path = fixture_dir().join("chain-validation-blocks.json");
    let mut fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    assert_eq!(run_fixture(&fixture), Ok(()));
    fixture["steps"][0]["expect"]["decision"] = json!("allow");
    let e = run_fixture(&fixture).unwrap_err();
    assert!(e.contains("expected decision allow, got deny"), "{e}");
    assert!(
        e.contains("blocked by interceptor 'conf/deny-all': denied by policy"),
        "{e}"
    );

    let path = fixture_dir().join("invoke-mutation-modified.json");
    let mut fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    fixture["steps"][0]["expect"]["canonical"] = json!("{}");
    assert!(run_fixture(&fixture).unwrap_err().contains("expected {}"));
}

#[test]
fn x1_canonical_json_sorts_keys_and_drops_whitespace() {
    let v = json!({"b": [1, 2.0, {"z": null, "a": "x\"y"}], "a": true});
    assert_eq!(
        canonical(&v),
        r#"{"a":true,"b":[1,2,{"a":"x\"y","z":null}]}"#
    );
    let scrubbed = scrub(
        &json!({"durationMs": 3, "in": [{"info": {}, "k": 1}]}),
        &["durationMs".into(), "info".into()],
    );
    assert_eq!(scrubbed, json!({"in": [{"k": 1}]}));
}
