//! What a user's project gives the agent besides the prompt (SPEC A10, A11, docs/context.md):
//! `AGENTS.md` project instructions in the system prompt, in their order and within their
//! byte budget, the client's and the operator's system prompts, the `BUZZ_AGENT_NO_HINTS` off
//! switch, and files that cannot be used (cut, binary, unreadable) warned about and told to
//! the user while the session starts anyway.

use super::setup::Setup;
use super::util::{Scratch, assert_end_turn, path_str, wait_stderr};
use crate::fake_llm::{FakeLlm, Reply};
use crate::harness::{AgentProc, Ctx};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A project in the scratch directory: a git root (`ws`, with `.git/`) holding `AGENTS.md`,
/// the subfolder `pkg` (the session's cwd) holding its own, a home directory outside it with
/// a user-wide `AGENTS.md`, and an `AGENTS.md` above the git root that must never be read.
struct Project {
    root: PathBuf,
    cwd: PathBuf,
    home: PathBuf,
}

impl Project {
    fn new(s: &Scratch) -> Project {
        let root = s.ws.clone();
        let cwd = root.join("pkg");
        let home = s.dir.path().join("home");
        std::fs::create_dir_all(root.join(".git")).expect("a git root");
        write(
            &root.join("AGENTS.md"),
            "ROOT-RULE: run the tests with scripts/test.\n",
        );
        write(
            &cwd.join("AGENTS.md"),
            "PKG-RULE: this package is no_std.\n",
        );
        write(
            &home.join(".config/buzz-agent/AGENTS.md"),
            "USER-RULE: answer in British English.\n",
        );
        write(
            &s.dir.path().join("AGENTS.md"),
            "ABOVE-THE-ROOT: never read.\n",
        );
        Project { root, cwd, home }
    }

    /// The agent's environment: this project's home.
    fn env(&self) -> Vec<(String, String)> {
        vec![("HOME".to_string(), path_str(&self.home))]
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `session/new` in `cwd` with `_meta`; the response.
fn new_session_with_meta(agent: &AgentProc, cwd: &Path, meta: Value) -> Value {
    agent.request(
        "session/new",
        json!({"cwd": cwd, "mcpServers": [], "_meta": meta}),
    )
}

/// The fake LLM (answering one text, `reply`) and an initialized agent in project `p`'s
/// environment.
fn start(ctx: &Ctx, s: &Scratch, p: &Project, reply: &str) -> (FakeLlm, AgentProc) {
    let (llm, agent) = Setup::new(ctx, s)
        .replies(vec![Reply::text(reply)])
        .env(&env_refs(&p.env()))
        .spawn();
    agent.initialize();
    (llm, agent)
}

/// A session opened by `session/new` in a cwd, with no MCP servers.
struct Opened {
    sid: String,
    /// The answer's `_meta.buzz.notices`.
    notices: Vec<String>,
    /// How long the answer took.
    took: Duration,
}

/// `session/new` in `cwd` with no MCP servers; panics on an error answer.
fn open_session(agent: &AgentProc, cwd: &Path) -> Opened {
    let started = std::time::Instant::now();
    let r = agent.request("session/new", json!({"cwd": cwd, "mcpServers": []}));
    let took = started.elapsed();
    let result = agent.result(&r);
    let sid = result["sessionId"]
        .as_str()
        .expect("a session id")
        .to_string();
    let notices =
        serde_json::from_value(result["_meta"]["buzz"]["notices"].clone()).unwrap_or_default();
    Opened { sid, notices, took }
}

/// The positions of `needles` in `text`, panicking (with the text) on a missing one.
fn positions(text: &str, needles: &[&str]) -> Vec<usize> {
    needles
        .iter()
        .map(|n| {
            text.find(n)
                .unwrap_or_else(|| panic!("{n:?} is not in the system prompt:\n{text}"))
        })
        .collect()
}

/// SPEC A10: the first request's system prompt is the operator's prompt, the client's
/// appended text, then the user-wide `AGENTS.md`, the git root's and the cwd's, in that order,
/// each delimited and named; nothing above the git root; the same bytes in every request of
/// the session. A client's string `systemPrompt` replaces the operator's prompt and keeps the
/// instructions.
pub fn a10_instructions_reach_the_first_request_user_file_then_root_down_to_the_cwd(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    let mut env = p.env();
    env.push((
        "BUZZ_AGENT_SYSTEM_PROMPT".into(),
        "OPERATOR-PROMPT: be brief.".into(),
    ));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("one"),
            Reply::text("two"),
            Reply::text("three"),
        ])
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let r = new_session_with_meta(
        &agent,
        &p.cwd,
        json!({"systemPrompt": {"append": "CLIENT-APPEND: the user is on a laptop."}}),
    );
    let sid = agent.result(&r)["sessionId"]
        .as_str()
        .expect("a session id")
        .to_string();
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    assert_end_turn(&agent, &agent.prompt(&sid, "again"));
    let reqs = llm.requests();
    let first = reqs[0].system_text().expect("a system prompt");
    let order = positions(
        &first,
        &[
            "OPERATOR-PROMPT",
            "CLIENT-APPEND",
            "USER-RULE",
            "ROOT-RULE",
            "PKG-RULE",
        ],
    );
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}\n{first}");
    assert!(!first.contains("ABOVE-THE-ROOT"), "{first}");
    for f in [
        p.home.join(".config/buzz-agent/AGENTS.md"),
        p.root.join("AGENTS.md"),
        p.cwd.join("AGENTS.md"),
    ] {
        assert!(
            first.contains(&format!("<instructions path=\"{}\">", f.display())),
            "each file is delimited and named: {first}"
        );
    }
    assert!(
        !reqs[0].user_text().contains("ROOT-RULE"),
        "instructions are the system prompt's, not the user's"
    );
    assert_eq!(
        reqs[1].system_text().as_deref(),
        Some(first.as_str()),
        "the same bytes in every request of the session"
    );
    // A string systemPrompt replaces the operator's prompt; the instructions stay.
    let r = new_session_with_meta(
        &agent,
        &p.cwd,
        json!({"systemPrompt": "CLIENT-ONLY: you are a reviewer."}),
    );
    let sid2 = agent.result(&r)["sessionId"]
        .as_str()
        .expect("a session id")
        .to_string();
    assert_end_turn(&agent, &agent.prompt(&sid2, "review"));
    let third = llm.requests()[2].system_text().expect("a system prompt");
    assert!(third.starts_with("CLIENT-ONLY"), "{third}");
    assert!(!third.contains("OPERATOR-PROMPT"), "{third}");
    positions(&third, &["USER-RULE", "ROOT-RULE", "PKG-RULE"]);
    agent.finish();
}

/// SPEC A10: with `BUZZ_AGENT_NO_HINTS=1` no file is read: the system prompt is the operator's
/// alone. Without it, an `AGENTS.md` over the budget (a sparse 100 MB file) is cut with a WARN
/// naming it, a binary one is skipped with a WARN naming it, both are listed in the
/// `session/new` answer's notices, and the session starts and answers.
pub fn a10_no_hints_reads_nothing_and_a_cut_or_binary_file_is_warned_and_noticed(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    let mut env = p.env();
    env.push(("BUZZ_AGENT_SYSTEM_PROMPT".into(), "OPERATOR-ONLY".into()));
    env.push(("BUZZ_AGENT_NO_HINTS".into(), "1".into()));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("plain")])
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let sid = agent.new_session(&p.cwd, json!([]));
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    assert_eq!(
        llm.requests()[0].system_text().as_deref(),
        Some("OPERATOR-ONLY"),
        "the off switch reads no AGENTS.md"
    );
    agent.finish();

    // The root's file: 100 MB (sparse), over a 1024-byte budget; the cwd's: binary.
    let big = p.root.join("AGENTS.md");
    std::fs::write(&big, "BIG-START ".repeat(300)).expect("write");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&big)
        .and_then(|f| f.set_len(100 * 1024 * 1024))
        .expect("a sparse 100 MB file");
    std::fs::write(p.cwd.join("AGENTS.md"), b"\x7fELF\x02\x01\x01\x00\x00").expect("write");
    let mut env = p.env();
    env.push(("BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES".into(), "1024".into()));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("still here")])
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let Opened { sid, notices, .. } = open_session(&agent, &p.cwd);
    let big_path = path_str(&big);
    let bin_path = path_str(&p.cwd.join("AGENTS.md"));
    assert!(
        notices
            .iter()
            .any(|n| n.contains(&big_path) && n.contains("cut")),
        "{notices:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| n.contains(&bin_path) && n.contains("not text")),
        "{notices:?}"
    );
    wait_stderr(
        &agent,
        &format!("instructions: {big_path} cut to "),
        Duration::from_secs(5),
    );
    wait_stderr(
        &agent,
        &format!("instructions: {bin_path} skipped: it is not text"),
        Duration::from_secs(5),
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    let system = llm.requests()[0].system_text().expect("a system prompt");
    positions(
        &system,
        &["USER-RULE", "BIG-START", "the rest of this file was cut"],
    );
    assert!(
        system.len() < 4096,
        "the budget holds: {} bytes",
        system.len()
    );
    agent.finish();
}

/// SPEC A10, bad input: an `AGENTS.md` that cannot be read — the git root's a directory, the
/// cwd's a FIFO with no writer (tests run as root, so a file without read permission would be
/// read anyway) — is skipped with a WARN naming it and a notice in the `session/new` answer;
/// the FIFO is never waited on (the answer comes at once), the user-wide file still reaches
/// the system prompt, and the session answers its prompt.
pub fn a10_an_agents_md_that_is_a_directory_or_a_fifo_is_skipped_with_a_warning(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    let dir = p.root.join("AGENTS.md");
    std::fs::remove_file(&dir).expect("remove the root's file");
    std::fs::create_dir(&dir).expect("a directory named AGENTS.md");
    let fifo = p.cwd.join("AGENTS.md");
    std::fs::remove_file(&fifo).expect("remove the cwd's file");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let (llm, agent) = start(ctx, &s, &p, "still here");
    let Opened { sid, notices, took } = open_session(&agent, &p.cwd);
    assert!(
        took < Duration::from_secs(10),
        "the FIFO is not waited on: session/new took {took:?}"
    );
    let notices = notices.join("\n");
    for path in [path_str(&dir), path_str(&fifo)] {
        assert!(
            notices.contains(&format!("The project instructions in {path} were not read")),
            "{path}: {notices}"
        );
        let warning = format!("instructions: {path} skipped: ");
        wait_stderr(&agent, &warning, Duration::from_secs(5));
    }
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    let system = llm.requests()[0].system_text().expect("a system prompt");
    assert!(system.contains("USER-RULE"), "{system}");
    assert!(
        !system.contains("ROOT-RULE") && !system.contains("PKG-RULE"),
        "{system}"
    );
    agent.finish();
}

/// A skill folder `dir/<folder>` with `SKILL.md` (`name`, `description`, a body holding
/// `BODY-<name>`) and the extra files `extra`.
fn skill(dir: &Path, folder: &str, name: &str, description: &str, extra: &[&str]) {
    let body = format!("# {name}\n\nBODY-{name}: follow these steps.\n");
    write(
        &dir.join(folder).join("SKILL.md"),
        &format!(
            "---\nname: {name}\ndescription: {description}\nmetadata:\n  author: e2e\n---\n{body}"
        ),
    );
    for f in extra {
        write(&dir.join(folder).join(f), "extra file\n");
    }
}

/// SPEC A10: the skills of the cwd's `.agents/skills` and the user's `~/.agents/skills` are
/// listed by name and description only; `load_skill` (offered first, shown to the client as a
/// `read` call titled `Load skill`, asked for like any tool) returns the body and names the
/// skill's other files. A broken, a duplicate, an oversized (a sparse 100 MB `SKILL.md`) skill
/// and a symbolic link loop are each skipped with a WARN and a notice; the session starts.
pub fn a10_skills_are_listed_without_bodies_and_load_skill_returns_the_body(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    let skills = p.cwd.join(".agents/skills");
    skill(
        &skills,
        "release-notes",
        "release-notes",
        "Writes release notes from the changelog.",
        &["scripts/draft.sh", "template.md"],
    );
    skill(
        &skills,
        "pdf-tools",
        "pdf-tools",
        "Extracts text from PDF files.\n  Use for PDFs.",
        &[],
    );
    skill(
        &p.home.join(".agents/skills"),
        "greeting",
        "greeting",
        "Greets people politely.",
        &[],
    );
    // Broken ones, each skipped.
    write(&skills.join("broken/SKILL.md"), "# no frontmatter at all\n");
    skill(&skills, "zz-copy", "pdf-tools", "A second pdf-tools.", &[]);
    let big = skills.join("huge/SKILL.md");
    write(&big, "---\nname: huge\ndescription: Huge.\n---\n");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&big)
        .and_then(|f| f.set_len(100 * 1024 * 1024))
        .expect("a sparse 100 MB SKILL.md");
    std::os::unix::fs::symlink(skills.join("loop"), skills.join("loop")).expect("a link loop");
    let mut env = p.env();
    env.push(("BUZZ_AGENT_PERMISSION".into(), "ask".into()));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "load_skill", json!({"name": "release-notes"}))]),
            Reply::text("notes drafted"),
        ])
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let Opened { sid, notices, .. } = open_session(&agent, &p.cwd);
    for (path, why) in [
        (skills.join("broken/SKILL.md"), "the frontmatter is broken"),
        (skills.join("zz-copy/SKILL.md"), "already taken"),
        (big.clone(), "over the 64 KiB limit"),
    ] {
        let path = path_str(&path);
        assert!(
            notices.iter().any(|n| n.contains(&path) && n.contains(why)),
            "{path}: {why}: {notices:?}"
        );
        wait_stderr(
            &agent,
            &format!("skills: {path} skipped: "),
            Duration::from_secs(5),
        );
    }
    let looped = path_str(&skills.join("loop"));
    assert!(
        notices
            .iter()
            .any(|n| n.contains(&looped) && n.contains("cannot be read")),
        "{notices:?}"
    );
    let resp = agent.prompt(&sid, "write the release notes");
    assert_end_turn(&agent, &resp);
    let reqs = llm.requests();
    let system = reqs[0].system_text().expect("a system prompt");
    positions(
        &system,
        &[
            "PKG-RULE",
            "# Skills",
            "- pdf-tools: Extracts text from PDF files. Use for PDFs.",
            "- release-notes: Writes release notes from the changelog.",
            "- greeting: Greets people politely.",
        ],
    );
    assert!(
        !system.contains("BODY-"),
        "bodies are never listed: {system}"
    );
    assert!(
        !system.contains("huge") && !system.contains("A second"),
        "{system}"
    );
    assert_eq!(
        reqs[0].tool_names().first().map(String::as_str),
        Some("load_skill")
    );
    let loaded = reqs[1]
        .tool_result_for("c1")
        .expect("the load_skill result");
    positions(
        &loaded,
        &["BODY-release-notes", "scripts/draft.sh", "template.md"],
    );
    assert!(!loaded.contains("BODY-pdf-tools"), "{loaded}");
    let asked = agent.permission_requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["params"]["toolCall"]["kind"], "read");
    // The agent's own tool names the agent as who asks (no server's title).
    assert_eq!(
        asked[0]["params"]["toolCall"]["title"],
        "buzz-agent: load_skill"
    );
    let ups = agent.session_updates(&sid);
    // The user sees the skipped skills too, not only stderr: notices before the first answer.
    let shown: Vec<&str> = ups
        .iter()
        .filter(|u| u["_meta"]["buzz"]["notice"] == "skill_skipped")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect();
    assert_eq!(shown.len(), notices.len(), "{shown:?} {notices:?}");
    for (text, sentence) in shown.iter().zip(&notices) {
        assert_eq!(text.trim_start(), format!("[buzz-agent] {sentence}"));
    }
    let announced = crate::harness::tool_call_announcements(&ups);
    assert_eq!(announced[0]["kind"], "read", "{announced:?}");
    assert_eq!(announced[0]["title"], "Load skill");
    crate::harness::assert_tool_updates_well_formed(&ups);
    agent.finish();
}

/// SPEC A10: 10,000 skill folders (64, then links to one of them) cost a bounded read: the session starts at once, 64 are
/// read and listed, and one WARN and notice say how many were left out. With
/// `BUZZ_AGENT_NO_HINTS=1` no skill is listed and `load_skill` is not offered.
pub fn a10_ten_thousand_skills_are_capped_and_no_hints_offers_none(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    let skills = p.cwd.join(".agents/skills");
    // 64 folders, then 9,936 links to one of them (each a skill folder to the reader; links
    // are the cheapest entries to make).
    for i in 0..64 {
        let name = format!("s{i:05}");
        write(
            &skills.join(&name).join("SKILL.md"),
            &format!("---\nname: {name}\ndescription: Skill {i}.\n---\nbody {i}\n"),
        );
    }
    for i in 64..10_000 {
        std::os::unix::fs::symlink("s00000", skills.join(format!("s{i:05}"))).expect("a link");
    }
    let (llm, agent) = start(ctx, &s, &p, "many");
    let Opened { sid, notices, took } = open_session(&agent, &p.cwd);
    assert!(took < Duration::from_secs(20), "session/new took {took:?}");
    let notices = notices.join("\n");
    assert!(
        notices.contains("9936 more skill folder(s) were not read"),
        "{notices}"
    );
    wait_stderr(
        &agent,
        "skills: 9936 more skill folder(s) were not read",
        Duration::from_secs(5),
    );
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    let system = llm.requests()[0].system_text().expect("a system prompt");
    assert!(
        system.contains("- s00063: Skill 63.") && !system.contains("s00064"),
        "{system}"
    );
    agent.finish();

    let mut env = p.env();
    env.push(("BUZZ_AGENT_NO_HINTS".into(), "true".into()));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("none")])
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let sid = agent.new_session(&p.cwd, json!([]));
    assert_end_turn(&agent, &agent.prompt(&sid, "hello"));
    let req = &llm.requests()[0];
    assert_eq!(
        req.system_text(),
        None,
        "no skills, no instructions: {:?}",
        req.system_text()
    );
    assert!(req.tool_names().is_empty(), "{:?}", req.tool_names());
    agent.finish();
}

/// SPEC A10: a session's instructions and skills are read when it starts and again on
/// `session/load`, never on every round. Session 1 starts with the cwd's `AGENTS.md` saying
/// `PKG-RULE` and one skill; while its first round runs (the model asks for `load_skill`), the
/// file is rewritten and a second skill is added in the git root's `.agents/skills` (the cwd is
/// a folder below the root), and the second round's system prompt is
/// still byte for byte the first's. The agent process ends; a new one loads the session, and
/// its next request carries the rewritten file and both skills, not the old text.
pub fn a10_instructions_and_skills_are_read_again_on_session_load_not_on_every_round(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    let skills = p.cwd.join(".agents/skills");
    skill(&skills, "deploy", "deploy", "Deploys to staging.", &[]);
    let state = path_str(&s.dir.path().join("state"));
    let mut env = p.env();
    env.push(("BUZZ_AGENT_STATE_DIR".into(), state.clone()));
    let agents_md = p.cwd.join("AGENTS.md");
    // The second skill goes to the git root's folder (the cwd is below it).
    let (changed, added) = (agents_md.clone(), p.root.join(".agents/skills"));
    let (llm, agent) = Setup::new(ctx, &s)
        .handler(move |i, _| match i {
            0 => {
                // Between the session's first and second round: a new text and a new skill.
                write(&changed, "PKG-RULE-V2: this package now uses std.\n");
                skill(&added, "changelog", "changelog", "Keeps CHANGELOG.md.", &[]);
                Reply::tool_calls(vec![("c1", "load_skill", json!({"name": "deploy"}))])
            }
            _ => Reply::text("done"),
        })
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let sid = agent.new_session(&p.cwd, json!([]));
    assert_end_turn(&agent, &agent.prompt(&sid, "deploy it"));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "two rounds");
    let first = reqs[0].system_text().expect("a system prompt");
    positions(
        &first,
        &[
            "PKG-RULE: this package is no_std.",
            "- deploy: Deploys to staging.",
        ],
    );
    assert!(
        reqs[1]
            .tool_result_for("c1")
            .is_some_and(|t| t.contains("BODY-deploy")),
        "the second round follows the load_skill call"
    );
    assert_eq!(
        reqs[1].system_text().as_deref(),
        Some(first.as_str()),
        "the files are not read again on a round"
    );
    assert!(
        !first.contains("PKG-RULE-V2") && !first.contains("- changelog:"),
        "{first}"
    );
    agent.finish();

    let mut env = p.env();
    env.push(("BUZZ_AGENT_STATE_DIR".into(), state));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![Reply::text("loaded")])
        .env(&env_refs(&env))
        .spawn();
    agent.initialize();
    let r = agent.request(
        "session/load",
        json!({"sessionId": sid, "cwd": p.cwd, "mcpServers": []}),
    );
    agent.result(&r);
    assert_end_turn(&agent, &agent.prompt(&sid, "and the changelog"));
    let req = llm.requests().remove(0);
    let loaded = req.system_text().expect("a system prompt");
    positions(
        &loaded,
        &[
            "USER-RULE",
            "ROOT-RULE",
            "PKG-RULE-V2: this package now uses std.",
            "# Skills",
            "- deploy: Deploys to staging.",
            "- changelog: Keeps CHANGELOG.md.",
        ],
    );
    assert!(
        !loaded.contains("PKG-RULE: this package is no_std."),
        "the old text is gone after the load: {loaded}"
    );
    assert!(
        req.user_text().contains("deploy it"),
        "the loaded session keeps its history"
    );
    agent.finish();
}

/// SPEC A10: a server may not shadow a built-in tool. Its tool named `load_skill` is offered
/// as `srv__load_skill`, after the one built-in `load_skill`; a call of `load_skill` is the
/// built-in's (the skill's body) and one of `srv__load_skill` the server's. No offered name
/// starts with `_`.
pub fn a10_a_servers_tool_named_load_skill_never_shadows_the_built_in(ctx: &Ctx) {
    let s = Scratch::new();
    let p = Project::new(&s);
    skill(
        &p.root.join(".agents/skills"),
        "deploy",
        "deploy",
        "Deploys to staging.",
        &[],
    );
    let both = Reply::tool_calls(vec![
        ("c1", "load_skill", json!({"name": "deploy"})),
        ("c2", "srv__load_skill", json!({"text": "the server's own"})),
    ]);
    let (llm, agent, sid) = Setup::new(ctx, &s)
        .replies(vec![both, Reply::text("both ran")])
        .env(&env_refs(&p.env()))
        .fake_mcp("srv", &[("FAKE_MCP_ECHO_NAMES", "load_skill")])
        .start();
    assert_end_turn(&agent, &agent.prompt(&sid, "deploy"));
    let reqs = llm.requests();
    let names = reqs[0].tool_names();
    assert_eq!(names.first().map(String::as_str), Some("load_skill"));
    assert_eq!(
        names.iter().filter(|n| n.as_str() == "load_skill").count(),
        1,
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "srv__load_skill") && !names.iter().any(|n| n.starts_with('_')),
        "{names:?}"
    );
    let built_in = reqs[1]
        .tool_result_for("c1")
        .expect("the load_skill result");
    assert!(built_in.contains("BODY-deploy"), "{built_in}");
    assert_eq!(
        reqs[1].tool_result_for("c2").as_deref(),
        Some("the server's own")
    );
    agent.finish();
}
