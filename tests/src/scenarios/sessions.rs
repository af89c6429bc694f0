//! Sessions that survive (SPEC A9, issue 14): JSONL transcripts in the state directory,
//! `session/load`, `session/resume`, `session/list`, crash safety, bad ids, locking.

use super::setup::Setup;
use super::util::{Scratch, path_str, wait_stderr};
use crate::fake_llm::{FakeLlm, RecordedRequest, Reply};
use crate::harness::{AgentProc, Ctx, fake_mcp_entry, kill_tree};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

const WAIT: Duration = Duration::from_secs(30);

/// The state directory of a scenario (inside its scratch dir; created by the agent).
fn state_dir(s: &Scratch) -> PathBuf {
    s.dir.path().join("state").join("sessions")
}

fn transcript(s: &Scratch, sid: &str) -> PathBuf {
    state_dir(s).join(format!("{sid}.jsonl"))
}

fn tools() -> Value {
    fake_mcp_entry("tools", &[("FAKE_MCP_TOOLS", "echo,slow")])
}

/// `session/load` (or `session/resume`) of `sid` in the workspace with the `tools` server.
fn load(agent: &AgentProc, s: &Scratch, method: &str, sid: &str) -> Value {
    agent.request(
        method,
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": [tools()]}),
    )
}

/// Starts `method` (`session/load` or `session/resume`) of `sid` with the `tools` server and
/// waits for its answer, which carries the model selector; returns the request id (the replay
/// comes before its answer).
fn load_started(agent: &AgentProc, s: &Scratch, method: &str, sid: &str) -> Value {
    let id = agent.start_request(
        method,
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": [tools()]}),
    );
    let r = agent.wait_response(&id, WAIT);
    assert_eq!(
        agent.result(&r)["configOptions"][0]["id"],
        "model",
        "the model selector: {r}"
    );
    id
}

/// An agent on `llm` keeping its sessions in the scenario's state directory, initialized.
fn agent_on(ctx: &Ctx, s: &Scratch, llm: FakeLlm, extra: &[(&str, &str)]) -> (FakeLlm, AgentProc) {
    let dir = path_str(&state_dir(s));
    let mut env = vec![("BUZZ_AGENT_STATE_DIR", dir.as_str())];
    env.extend_from_slice(extra);
    let (llm, agent) = Setup::new(ctx, s).llm(llm).env(&env).spawn();
    let init = agent.initialize();
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    (llm, agent)
}

/// The updates of a session as a client keeps them: text chunks of one kind merged, a tool
/// call's progress left out (its announcement and final status kept), usage left out, and the
/// user's prompts left out (the live client sent them; the replay shows them).
fn canonical(updates: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for u in updates {
        let kind = u["sessionUpdate"].as_str().unwrap_or("");
        match kind {
            "usage_update" | "user_message_chunk" => {}
            "tool_call_update" if !matches!(u["status"].as_str(), Some("completed" | "failed")) => {
            }
            "agent_message_chunk" | "agent_thought_chunk" => {
                let text = u["content"]["text"].as_str().unwrap_or("");
                match out.last_mut() {
                    Some(last) if last["sessionUpdate"] == kind => {
                        let joined =
                            format!("{}{text}", last["content"]["text"].as_str().unwrap_or(""));
                        last["content"]["text"] = json!(joined);
                    }
                    _ => out.push(u.clone()),
                }
            }
            _ => out.push(u.clone()),
        }
    }
    out
}

/// The updates of `sid` written before the response to the request `id` (I8 for a load: the
/// replay precedes the answer).
fn updates_before_response(agent: &AgentProc, sid: &str, id: &Value) -> Vec<Value> {
    let t = agent.transcript();
    let end = t
        .iter()
        .position(|m| m.get("method").is_none() && m["id"] == *id)
        .expect("the response");
    t[..end]
        .iter()
        .filter(|m| m["method"] == "session/update" && m["params"]["sessionId"] == sid)
        .map(|m| m["params"]["update"].clone())
        .collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Every line of the transcript parses as a record (`{"v":1,"type":…}`); returns them.
fn records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(text.ends_with('\n'), "the file ends with a whole line");
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("line {} is not JSON ({e}): {l}", i + 1));
            assert_eq!(v["v"], 1, "line {}: {l}", i + 1);
            assert!(v["type"].is_string(), "line {}: {l}", i + 1);
            v
        })
        .collect()
}

fn last_request(llm: &FakeLlm) -> RecordedRequest {
    llm.requests().last().cloned().expect("an LLM request")
}

/// A9 (1): prompt (with a tool call), exit, start a new agent process, `session/load`, prompt
/// again: the load replays what the client saw before it answers, and the next LLM request
/// carries the whole earlier history. The transcript is 0600 in a 0700 directory, its id
/// random.
pub fn a9_prompt_exit_load_prompt_again_continues_the_history(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = ctx.fake_llm(vec![
        Reply::tool_calls(vec![("call_e1", "tools__echo", json!({"text": "alpha"}))])
            .with_text("Let me echo."),
        Reply::text("Echoed alpha."),
        Reply::text("Second answer."),
    ]);
    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let sid = agent.new_session(&s.ws, json!([tools()]));
    let hex = sid.strip_prefix("sess_").unwrap_or("");
    assert!(
        hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "a random session id: {sid}"
    );
    let r = agent.prompt(&sid, "First task: echo alpha.\nDetails follow.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let original = agent.session_updates(&sid);
    agent.finish();

    let file = transcript(&s, &sid);
    assert_eq!(mode(&file), 0o600, "the transcript is private");
    assert_eq!(mode(&state_dir(&s)), 0o700, "so is its directory");
    let recs = records(&file);
    assert_eq!(recs[0]["type"], "session", "{recs:?}");
    assert_eq!(recs[0]["sessionId"], sid);
    assert_eq!(recs[0]["cwd"], path_str(&s.ws));
    assert_eq!(
        recs[0]["title"], "First task: echo alpha.",
        "the first line"
    );

    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let id = load_started(&agent, &s, "session/load", &sid);
    let replayed = updates_before_response(&agent, &sid, &id);
    assert_eq!(
        replayed.first().map(|u| u["sessionUpdate"].clone()),
        Some(json!("user_message_chunk")),
        "{replayed:?}"
    );
    assert_eq!(
        replayed[0]["content"]["text"],
        "First task: echo alpha.\nDetails follow."
    );
    assert_eq!(canonical(&replayed), canonical(&original), "the replay");

    let r = agent.prompt(&sid, "Second task.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let req = last_request(&llm);
    req.assert_tool_calls_paired();
    let users = req.user_text();
    assert!(
        users.contains("First task: echo alpha.") && users.contains("Second task."),
        "{users}"
    );
    let results = req.tool_results();
    assert!(
        results
            .iter()
            .any(|(id, text)| id == "call_e1" && text.contains("alpha")),
        "the earlier tool result is in the history: {results:?}"
    );
    assert!(
        req.body.to_string().contains("Echoed alpha."),
        "the earlier answer is in the history"
    );
    agent.finish();
    assert!(
        records(&file)
            .iter()
            .any(|r| r["type"] == "message" && r["message"]["text"] == "Second answer."),
        "the second prompt was recorded in the same file"
    );
}

/// A9 (2): `kill -9` in the middle of a round (one tool call finished, one still running),
/// then a load in a new process: the history is valid for the provider (every tool call
/// paired, the interrupted one with an error result), and nothing completed is lost (the
/// earlier prompt, the finished call's result).
pub fn a9_kill_9_mid_round_then_load_pairs_every_tool_call(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = ctx.fake_llm(vec![
        Reply::text("Answer one."),
        Reply::tool_calls(vec![
            (
                "call_fast",
                "tools__echo",
                json!({"text": "done-before-the-kill"}),
            ),
            ("call_slow", "tools__slow", json!({"ms": 60000})),
        ]),
        Reply::text("Answer after the load."),
    ]);
    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let sid = agent.new_session(&s.ws, json!([tools()]));
    let r = agent.prompt(&sid, "Prompt one.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    agent.start_prompt(&sid, "Prompt two: echo and sleep.");
    agent.wait_until("echo completed, slow running", WAIT, |t| {
        let ups: Vec<&Value> = t.iter().map(|m| &m["params"]["update"]).collect();
        ups.iter().any(|u| u["status"] == "completed")
            && ups.iter().any(|u| u["status"] == "in_progress")
    });
    // The finished call's result is on disk (the store appends it right after the update).
    let file = transcript(&s, &sid);
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&file)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"type\":\"tool_result\"") && l.contains("done-before-the-kill"))
    {
        assert!(
            Instant::now() < deadline,
            "the echo result was never recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_tree(agent.pid());
    assert!(agent.wait_exit(Duration::from_secs(5)).is_some(), "killed");
    drop(agent);

    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let id = load_started(&agent, &s, "session/load", &sid);
    let replayed = updates_before_response(&agent, &sid, &id);
    let finals: Vec<(String, String)> = replayed
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call_update")
        .map(|u| {
            (
                u["toolCallId"].as_str().unwrap_or("").to_string(),
                u["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        finals.iter().map(|(_, st)| st.as_str()).collect::<Vec<_>>(),
        ["completed", "failed"],
        "every replayed call ends, the interrupted one failed: {replayed:?}"
    );
    wait_stderr(&agent, "still running when the agent stopped", WAIT);

    let r = agent.prompt(&sid, "Prompt three.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let req = last_request(&llm);
    req.assert_tool_calls_paired();
    let users = req.user_text();
    assert!(
        users.contains("Prompt one.") && users.contains("Prompt two"),
        "{users}"
    );
    assert!(
        req.body.to_string().contains("Answer one."),
        "prompt one's answer kept"
    );
    let results = req.tool_results();
    let of = |id: &str| {
        results
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("no result for {id}: {results:?}"))
    };
    assert!(
        of("call_fast").contains("done-before-the-kill"),
        "{results:?}"
    );
    assert!(of("call_slow").contains("interrupted"), "{results:?}");
    agent.finish();
    for (i, r) in records(&transcript(&s, &sid)).iter().enumerate() {
        assert!(r["type"].is_string(), "line {}", i + 1);
    }
}

/// Processes that load the machine while a scenario runs: one spinning on a CPU, one writing
/// and `fdatasync`ing a file in a loop (the disk's queue is never empty). Each is the leader of
/// its own process group; dropping the `Load` kills and reaps them.
struct Load(Vec<std::process::Child>);

impl Load {
    fn start(s: &Scratch) -> Load {
        use std::os::unix::process::CommandExt;
        let sync_file = s.file("disk-load.bin");
        let scripts = [
            "while :; do :; done".to_string(),
            format!(
                "while :; do dd if=/dev/zero of='{sync_file}' bs=256k count=4 conv=fdatasync status=none; done"
            ),
        ];
        Load(
            scripts
                .iter()
                .map(|script| {
                    std::process::Command::new("sh")
                        .args(["-c", script])
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .process_group(0)
                        .spawn()
                        .expect("spawn a load process")
                })
                .collect(),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.0 {
            kill_tree(child.id() as i32);
            let _ = child.wait();
        }
    }
}

/// A prompt's replies: `rounds` responses with one `tools__echo` call each (their text names
/// `tag` and the round), then the text `answer`.
fn echo_rounds(tag: &str, rounds: usize, answer: &str) -> Vec<Reply> {
    let mut replies: Vec<Reply> = (0..rounds)
        .map(|r| {
            let id = format!("call_{}_{r}", tag.replace(' ', "_"));
            Reply::tool_calls(vec![(
                id.as_str(),
                "tools__echo",
                json!({"text": format!("{tag} round {r}")}),
            )])
        })
        .collect();
    replies.push(Reply::text(answer));
    replies
}

/// A9 (durability): the `session/prompt` answer is sent only once the turn's records are
/// written and synced, so a `kill -9` the moment the client reads the answer never loses the
/// answered turn: its final answer, its `turn_end` and every tool round before them are in the
/// file. Repeated, with another process spinning on a CPU and one syncing to the same disk
/// all the while; then the last session is resumed by a new agent, whose next request carries
/// the answer the client saw.
pub fn a9_kill_9_the_moment_the_answer_is_read_never_loses_the_answered_turn(ctx: &Ctx) {
    const TRIES: usize = 8;
    const ROUNDS: usize = 3;
    let s = Scratch::new();
    let _load = Load::start(&s);
    let mut last = None;
    for n in 0..TRIES {
        let answer = format!("Final answer of try {n}.");
        let replies = echo_rounds(&format!("try {n}"), ROUNDS, &answer);
        let (llm, agent) = agent_on(ctx, &s, ctx.fake_llm(replies), &[]);
        let sid = agent.new_session(&s.ws, json!([tools()]));
        let id = agent.next_id();
        agent.kill_when_answered(&id);
        agent.send(&json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": format!("Task {n}.")}]}}));
        let r = agent.wait_response(&id, WAIT);
        assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
        assert!(
            agent.wait_exit(Duration::from_secs(10)).is_some(),
            "killed when the answer was read"
        );
        kill_tree(agent.pid());
        drop(agent);
        drop(llm);
        let recs = records_allowing_a_torn_tail(&transcript(&s, &sid));
        let results = recs
            .iter()
            .filter(|r| r["type"] == "tool_result" && r["status"] == "completed")
            .count();
        let answered = recs
            .iter()
            .any(|r| r["type"] == "message" && r["message"]["text"] == answer.as_str());
        let ended = recs
            .last()
            .is_some_and(|r| r["type"] == "turn_end" && r["stopReason"] == "end_turn");
        assert!(
            results == ROUNDS && answered && ended,
            "try {n}: the answered turn is in the file ({results} of {ROUNDS} results, answer \
             {answered}, turn_end last {ended}): {recs:#?}"
        );
        last = Some((sid, answer));
    }
    let (sid, answer) = last.expect("a try");
    let (llm, agent) = agent_on(ctx, &s, ctx.fake_llm(vec![Reply::text("Resumed.")]), &[]);
    load_started(&agent, &s, "session/resume", &sid);
    let r = agent.prompt(&sid, "And now?");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let req = last_request(&llm);
    req.assert_tool_calls_paired();
    assert!(
        req.body.to_string().contains(&answer),
        "the answer the client saw is in the history: {}",
        req.body
    );
    agent.finish();
}

/// The scenarios that need `strace` (on `PATH`, allowed to trace its children): reported
/// ignored, with the reason, where it is missing.
pub fn strace_trials(ctx: &Ctx) -> Vec<libtest_mimic::Trial> {
    let ctx = ctx.clone();
    vec![libtest_mimic::Trial::ignorable_test(
        "sessions::a9_an_answered_prompt_survives_an_os_crash_the_sync_precedes_the_answer",
        move || {
            let works = std::process::Command::new("strace")
                .args(["-f", "-qq", "-e", "trace=none", "true"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !works {
                return Ok(libtest_mimic::Completion::ignored_with(
                    "strace is not installed or cannot trace here",
                ));
            }
            a9_an_answered_prompt_survives_an_os_crash_the_sync_precedes_the_answer(&ctx);
            Ok(libtest_mimic::Completion::Completed)
        },
    )]
}

/// One system call of a `strace -f -yy` log, as far as this check needs it.
#[derive(Debug)]
struct Call {
    name: String,
    /// The first argument's path (`-yy`: `5</path/file>`), or the pipe/socket description.
    fd_path: String,
    /// The line as strace wrote it (the data of writes in it, `-s` long).
    line: String,
    /// The return value, once known (an `<unfinished ...>` call gets it on its `resumed` line).
    ret: Option<i64>,
    /// The log lines at which it started and returned (`usize::MAX`: never returned).
    start: usize,
    end: usize,
}

/// The calls of a `strace -f -yy` log, in the order they started.
fn strace_calls(log: &str) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    let mut open: std::collections::HashMap<(String, String), usize> = Default::default();
    let ret_of = |rest: &str| {
        rest.rsplit_once(" = ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|r| r.parse::<i64>().ok())
    };
    for (pos, line) in log.lines().enumerate() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let name = resumed.split_whitespace().next().unwrap_or("").to_string();
            if let Some(i) = open.remove(&(pid.to_string(), name)) {
                calls[i].ret = ret_of(rest);
                calls[i].line.push_str(rest);
                calls[i].end = pos;
            }
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else {
            continue;
        };
        let fd_path = args
            .split_once('<')
            .and_then(|(_, p)| p.split_once('>'))
            .map(|(p, _)| p.to_string())
            .unwrap_or_default();
        let unfinished = rest.ends_with("<unfinished ...>");
        if unfinished {
            open.insert((pid.to_string(), name.to_string()), calls.len());
        }
        calls.push(Call {
            name: name.to_string(),
            fd_path,
            line: rest.to_string(),
            ret: if unfinished { None } else { ret_of(rest) },
            start: pos,
            end: if unfinished { usize::MAX } else { pos },
        });
    }
    calls
}

/// A9 (power loss): an answered prompt survives an OS crash. The agent runs under `strace`
/// for a prompt of three tool rounds; in its system calls, the answer is written to stdout
/// only after an `fdatasync` of the transcript has returned that covers every byte written
/// to it before, the `turn_end` record included — and it is the prompt's only `fdatasync`
/// (none per round; the new file's directory is `fsync`ed with it). Then the crash is
/// simulated from the trace: a copy of the transcript cut to the bytes that were on the disk
/// when the answer was written is resumed by a new agent, whose next request carries the
/// answer the client saw.
pub fn a9_an_answered_prompt_survives_an_os_crash_the_sync_precedes_the_answer(ctx: &Ctx) {
    use std::os::unix::fs::PermissionsExt;
    let (s, [log]) = Scratch::with_files(["strace.log"]);
    let wrapper = s.dir.path().join("agent-under-strace");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec strace -f -qq -yy -s 65536 -o '{log}' \
             -e trace=write,writev,pwrite64,pwritev,pwritev2,fdatasync,fsync,syncfs,sync_file_range \
             -- '{}' \"$@\"\n",
            ctx.agent_bin.display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let answer = "The answer after three rounds.";
    let replies = echo_rounds("once", 3, answer);
    let strace_ctx = Ctx {
        agent_bin: wrapper.clone(),
        ..ctx.clone()
    };
    let (llm, agent) = agent_on(&strace_ctx, &s, ctx.fake_llm(replies), &[]);
    let sid = agent.new_session(&s.ws, json!([tools()]));
    let r = agent.prompt(&sid, "Three rounds, then answer.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    agent.finish();
    drop(llm);

    let file = transcript(&s, &sid);
    let path = path_str(&file);
    let text = std::fs::read_to_string(&log).expect("the strace log");
    let calls = strace_calls(&text);
    let is_write = |c: &Call| {
        matches!(
            c.name.as_str(),
            "write" | "writev" | "pwrite64" | "pwritev" | "pwritev2"
        )
    };
    let answer_call = calls
        .iter()
        .find(|c| {
            is_write(c)
                && c.line.starts_with(&format!("{}(1<", c.name))
                && c.line.contains(r#"\"stopReason\":\"end_turn\""#)
        })
        .unwrap_or_else(|| panic!("no write of the answer to stdout in the trace:\n{text}"));
    let syncs: Vec<&Call> = calls
        .iter()
        .filter(|c| c.name == "fdatasync" && c.fd_path == path && c.start < answer_call.start)
        .collect();
    assert_eq!(
        syncs.len(),
        1,
        "one fdatasync of the transcript before the answer, none per round: {syncs:#?}\n{text}"
    );
    let sync = syncs[0];
    assert!(
        sync.end < answer_call.start,
        "the sync returned before the answer was written"
    );
    assert_eq!(sync.ret, Some(0), "{}", sync.line);
    let dir = path_str(&state_dir(&s));
    assert!(
        calls
            .iter()
            .any(|c| c.name == "fsync" && c.fd_path == dir && c.end < sync.end),
        "the new file's directory is synced with its first sync:\n{text}"
    );
    // What was on the disk when the answer went out: every byte written to the file before
    // the sync started.
    let written: Vec<&Call> = calls
        .iter()
        .filter(|c| is_write(c) && c.fd_path == path && c.end < sync.start)
        .collect();
    assert!(
        written
            .iter()
            .any(|c| c.line.contains(r#"\"type\":\"turn_end\""#)),
        "turn_end was written before the sync:\n{text}"
    );
    let durable: i64 = written.iter().filter_map(|c| c.ret).sum();

    // The OS crash: the page cache is gone, the disk holds what was synced.
    let crash = Scratch::new();
    std::fs::create_dir_all(state_dir(&crash)).expect("mkdir");
    let bytes = std::fs::read(&file).expect("the transcript");
    let durable = usize::try_from(durable).expect("a length");
    assert!(durable <= bytes.len());
    std::fs::write(transcript(&crash, &sid), &bytes[..durable]).expect("write the copy");
    let (llm, agent) = agent_on(ctx, &crash, ctx.fake_llm(vec![Reply::text("Go on.")]), &[]);
    load_started(&agent, &crash, "session/resume", &sid);
    let r = agent.prompt(&sid, "And after the crash?");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    let req = last_request(&llm);
    req.assert_tool_calls_paired();
    assert!(
        req.body.to_string().contains(answer),
        "the answered turn survived: {}",
        req.body
    );
    assert_eq!(
        req.tool_results().len(),
        3,
        "and its three rounds: {:?}",
        req.tool_results()
    );
    agent.finish();
}

/// The records of a transcript that a crash may have left with a torn last line (which a load
/// ignores): every whole line parses as a record.
fn records_allowing_a_torn_tail(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let whole = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    whole
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Writes a transcript file by hand (the documented format): a header and one prompt.
fn write_session(dir: &Path, sid: &str, cwd: &str, title: &str, modified: SystemTime) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let header = json!({"v": 1, "type": "session", "sessionId": sid, "cwd": cwd, "title": title});
    let prompt = json!({"v": 1, "type": "message", "message": {"role": "user", "text": title}});
    let path = dir.join(format!("{sid}.jsonl"));
    std::fs::write(&path, format!("{header}\n{prompt}\n")).expect("write");
    let f = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_modified(modified).expect("mtime");
}

/// A session id of the random form for number `n`.
fn id_of(n: u32) -> String {
    format!("sess_{:032x}", (1u128 << 127) | u128::from(n))
}

/// A9 (3): `session/list` pages newest first (50 a page, an opaque cursor), filters by `cwd`,
/// skips files that are not transcripts, and gives `{sessionId, cwd, title, updatedAt}`.
pub fn a9_session_list_pages_newest_first_with_a_cwd_filter(ctx: &Ctx) {
    let s = Scratch::new();
    let dir = state_dir(&s);
    let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_777_636_800);
    for n in 0..120u32 {
        let cwd = if n % 2 == 0 { "/work/a" } else { "/work/b" };
        let when = base + Duration::from_secs(u64::from(n) * 60);
        write_session(&dir, &id_of(n), cwd, &format!("task {n}"), when);
    }
    std::fs::write(dir.join("notes.txt"), "not a transcript\n").expect("write");
    std::fs::write(dir.join(format!("{}.jsonl", id_of(500))), "garbage\n").expect("write");
    let (_llm, agent) = agent_on(ctx, &s, ctx.fake_llm(vec![]), &[]);

    let mut seen: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let r = agent.request("session/list", params);
        let page = agent.result(&r).clone();
        pages += 1;
        let items = page["sessions"].as_array().cloned().unwrap_or_default();
        assert!(items.len() <= 50, "{page}");
        seen.extend(items);
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 10, "paging ends");
    }
    assert_eq!(pages, 3, "120 sessions in pages of 50");
    assert_eq!(seen.len(), 120, "each once");
    let ids: Vec<&str> = seen
        .iter()
        .filter_map(|v| v["sessionId"].as_str())
        .collect();
    let want: Vec<String> = (0..120u32).rev().map(id_of).collect();
    assert_eq!(ids, want, "newest first");
    assert_eq!(
        seen[0],
        json!({"sessionId": id_of(119), "cwd": "/work/b", "title": "task 119",
               "updatedAt": "2026-05-01T13:59:00.000Z"})
    );
    wait_stderr(&agent, "skipped", WAIT);

    // The cwd filter, paged too.
    let r = agent.request("session/list", json!({"cwd": "/work/a/"}));
    let first = agent.result(&r).clone();
    let mut a: Vec<Value> = first["sessions"].as_array().cloned().unwrap_or_default();
    let next = first["nextCursor"]
        .as_str()
        .expect("a second page")
        .to_string();
    let r = agent.request("session/list", json!({"cwd": "/work/a", "cursor": next}));
    let second = agent.result(&r).clone();
    assert!(second.get("nextCursor").is_none(), "{second}");
    a.extend(second["sessions"].as_array().cloned().unwrap_or_default());
    assert_eq!(a.len(), 60);
    assert!(a.iter().all(|v| v["cwd"] == "/work/a"));

    // Bad parameters.
    for params in [
        json!({"cursor": "nonsense"}),
        json!({"cwd": "relative/dir"}),
    ] {
        let r = agent.request("session/list", params.clone());
        assert_eq!(agent.error(&r).0, -32602, "{params}: {r}");
    }
    agent.finish();
}

/// A9 (4): an id with path characters, or any string that is not a session id of this agent,
/// is `-32002` and nothing is read or written (the state directory is not even created); a
/// well-formed id with no transcript (a missing directory) is `-32002` naming where it looked.
pub fn a9_path_traversal_and_unknown_ids_are_refused_and_nothing_is_touched(ctx: &Ctx) {
    let s = Scratch::new();
    let outside = s.dir.path().join("state").join("secret.jsonl");
    std::fs::create_dir_all(outside.parent().expect("parent")).expect("mkdir");
    let planted =
        json!({"v": 1, "type": "session", "sessionId": "../secret", "cwd": "/", "title": "x"});
    std::fs::write(&outside, format!("{planted}\n")).expect("write");
    let before = std::fs::read(&outside).expect("read");
    let (_llm, agent) = agent_on(ctx, &s, ctx.fake_llm(vec![]), &[]);
    for named in [
        "../secret",
        "../../state/secret",
        "sess_../secret",
        "/etc/passwd",
        "sess_1/../../secret",
        "",
        "SESS_9F86D081884C7D659A2FEAA0C55AD015",
    ] {
        for method in ["session/load", "session/resume"] {
            let r = load(&agent, &s, method, named);
            let (code, msg) = agent.error(&r);
            assert_eq!(code, -32002, "{method} {named:?}: {r}");
            assert!(msg.contains("not a session id"), "{msg}");
        }
    }
    let r = load(&agent, &s, "session/load", &id_of(7));
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32002, "{r}");
    assert!(
        msg.contains(&path_str(&state_dir(&s))),
        "names where it looked: {msg}"
    );
    assert!(!state_dir(&s).exists(), "nothing was created");
    assert_eq!(
        std::fs::read(&outside).expect("read"),
        before,
        "nor changed"
    );
    agent.finish();
}

/// A9: a torn last line (a crash in the middle of an append) is ignored with a WARN, and cut
/// off before the next append, so the file stays valid JSONL.
pub fn a9_a_torn_last_line_is_ignored_with_a_warning_and_cut_off(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = ctx.fake_llm(vec![Reply::text("One."), Reply::text("Two.")]);
    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let sid = agent.new_session(&s.ws, json!([tools()]));
    let r = agent.prompt(&sid, "First.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    agent.finish();
    let file = transcript(&s, &sid);
    let whole = std::fs::read(&file).expect("read");
    let mut torn = whole.clone();
    torn.extend_from_slice(br#"{"v":1,"type":"message","message":{"role":"assis"#);
    std::fs::write(&file, &torn).expect("write");

    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let r = load(&agent, &s, "session/load", &sid);
    assert_eq!(
        agent.result(&r)["configOptions"][0]["id"],
        "model",
        "the model selector: {r}"
    );
    wait_stderr(&agent, "torn line", WAIT);
    assert!(
        agent.stderr_text().contains(" WARN "),
        "{}",
        agent.stderr_text()
    );
    let r = agent.prompt(&sid, "Second.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    last_request(&llm).assert_tool_calls_paired();
    agent.finish();
    let after = std::fs::read(&file).expect("read");
    assert!(after.starts_with(&whole), "what was whole is kept");
    assert!(
        !String::from_utf8_lossy(&after).contains("\"assis{"),
        "the torn piece is gone"
    );
    records(&file);
}

/// A9: two agents on one session: while the first holds its transcript (flock), a second
/// agent's load is refused with a clear `-32000`; once the first is gone, the load works.
pub fn a9_a_second_agent_loading_an_open_session_is_refused(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = ctx.fake_llm(vec![Reply::text("One."), Reply::text("Two.")]);
    let (llm, first) = agent_on(ctx, &s, llm, &[]);
    let sid = first.new_session(&s.ws, json!([]));
    let r = first.prompt(&sid, "First.");
    assert_eq!(first.result(&r)["stopReason"], "end_turn", "{r}");

    let (llm, second) = agent_on(ctx, &s, llm, &[]);
    let r = second.request(
        "session/load",
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": []}),
    );
    let (code, msg) = second.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(msg.contains("open in another buzz-agent process"), "{msg}");
    // The same agent refuses a session it already has open, too.
    let r = first.request(
        "session/load",
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": []}),
    );
    assert!(first.error(&r).1.contains("already open"), "{r}");
    first.finish();
    let r = second.request(
        "session/load",
        json!({"sessionId": sid, "cwd": s.ws, "mcpServers": []}),
    );
    assert_eq!(
        second.result(&r)["configOptions"][0]["id"],
        "model",
        "the model selector: {r}"
    );
    let r = second.prompt(&sid, "Second.");
    assert_eq!(second.result(&r)["stopReason"], "end_turn", "{r}");
    assert!(last_request(&llm).user_text().contains("First."));
    second.finish();
}

/// A9: a transcript that cannot be parsed is `-32000` naming the file and the line, and it is
/// never written to.
pub fn a9_an_unparseable_transcript_is_32000_naming_file_and_line_and_left_alone(ctx: &Ctx) {
    let s = Scratch::new();
    let sid = id_of(3);
    let dir = state_dir(&s);
    write_session(&dir, &sid, &path_str(&s.ws), "x", SystemTime::now());
    let file = transcript(&s, &sid);
    let mut bytes = std::fs::read(&file).expect("read");
    bytes.extend_from_slice(
        b"this line is not a record\n{\"v\":1,\"type\":\"rewind\",\"keep\":0}\n",
    );
    std::fs::write(&file, &bytes).expect("write");
    let (_llm, agent) = agent_on(ctx, &s, ctx.fake_llm(vec![]), &[]);
    for method in ["session/load", "session/resume"] {
        let r = agent.request(
            method,
            json!({"sessionId": sid, "cwd": s.ws, "mcpServers": []}),
        );
        let (code, msg) = agent.error(&r);
        assert_eq!(code, -32000, "{r}");
        assert!(
            msg.contains(&path_str(&file)) && msg.contains("line 3"),
            "{msg}"
        );
    }
    // A record of a newer format is refused the same way.
    let newer = id_of(4);
    write_session(&dir, &newer, "/w", "x", SystemTime::now());
    let path = dir.join(format!("{newer}.jsonl"));
    let mut b = std::fs::read(&path).expect("read");
    b.extend_from_slice(b"{\"v\":2,\"type\":\"message\"}\n");
    std::fs::write(&path, &b).expect("write");
    let r = agent.request(
        "session/load",
        json!({"sessionId": newer, "cwd": s.ws, "mcpServers": []}),
    );
    let (code, msg) = agent.error(&r);
    assert_eq!(code, -32000, "{r}");
    assert!(msg.contains("line 3") && msg.contains("newer"), "{msg}");
    agent.finish();
    assert_eq!(
        std::fs::read(&file).expect("read"),
        bytes,
        "never overwritten"
    );
    assert_eq!(std::fs::read(&path).expect("read"), b, "never overwritten");
}

/// A9: `session/resume` restores the history without replaying it.
pub fn a9_session_resume_continues_without_replay(ctx: &Ctx) {
    let s = Scratch::new();
    let llm = ctx.fake_llm(vec![Reply::text("One."), Reply::text("Two.")]);
    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    let sid = agent.new_session(&s.ws, json!([tools()]));
    let r = agent.prompt(&sid, "Remember the word zebra.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    agent.finish();
    let (llm, agent) = agent_on(ctx, &s, llm, &[]);
    load_started(&agent, &s, "session/resume", &sid);
    assert!(agent.session_updates(&sid).is_empty(), "no replay");
    let r = agent.prompt(&sid, "Which word?");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    assert!(last_request(&llm).user_text().contains("zebra"));
    agent.finish();
}

/// A9: `BUZZ_AGENT_STATE_DIR=off` advertises `loadSession: false` and no session
/// capabilities, refuses the methods, and writes nothing; unset, sessions go to
/// `$XDG_STATE_HOME/buzz-agent/sessions`.
pub fn a9_state_dir_off_saves_nothing_and_the_default_follows_xdg(ctx: &Ctx) {
    let s = Scratch::new();
    let home = path_str(&s.dir.path().join("home"));
    let xdg = path_str(&s.dir.path().join("xdg"));
    let (_llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("Off.")])
        .env(&[
            ("BUZZ_AGENT_STATE_DIR", "off"),
            ("HOME", &home),
            ("XDG_STATE_HOME", &xdg),
        ])
        .spawn();
    let init = agent.initialize();
    assert_eq!(init["agentCapabilities"]["loadSession"], false, "{init}");
    assert_eq!(
        init["agentCapabilities"]["sessionCapabilities"],
        json!({"close": {}, "additionalDirectories": {}}),
        "only session/close, which needs no store, and the M13 roots: {init}"
    );
    let sid = agent.new_session(&s.ws, json!([]));
    let r = agent.prompt(&sid, "Hello.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    for (method, params) in [
        (
            "session/load",
            json!({"sessionId": sid, "cwd": s.ws, "mcpServers": []}),
        ),
        (
            "session/resume",
            json!({"sessionId": sid, "cwd": s.ws, "mcpServers": []}),
        ),
        ("session/list", json!({})),
    ] {
        let r = agent.request(method, params);
        assert_eq!(agent.error(&r).0, -32601, "{method}: {r}");
    }
    agent.finish();
    assert!(
        !Path::new(&home).exists() && !Path::new(&xdg).exists(),
        "nothing written"
    );

    // Unset (blank counts as unset): under XDG_STATE_HOME.
    let (_llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("On.")])
        .env(&[
            ("BUZZ_AGENT_STATE_DIR", " "),
            ("HOME", &home),
            ("XDG_STATE_HOME", &xdg),
        ])
        .spawn();
    agent.initialize();
    let sid = agent.new_session(&s.ws, json!([]));
    let r = agent.prompt(&sid, "Hello.");
    assert_eq!(agent.result(&r)["stopReason"], "end_turn", "{r}");
    agent.finish();
    let file = Path::new(&xdg)
        .join("buzz-agent/sessions")
        .join(format!("{sid}.jsonl"));
    assert!(file.is_file(), "{}", file.display());
}
