//! A real remote MCP server (SPEC M10): `tests/examples/http/fastmcp_team_server.py`, on the
//! standalone `fastmcp` package's Streamable HTTP transport (`http`), run by the test as its own
//! process on a free loopback port, and given to the agent as an `http` entry.

use super::{example, venv};
use crate::fake_llm::Reply;
use crate::fake_mcp_http::wait_port_file;
use crate::harness::{AgentProc, Ctx};
use crate::scenarios::setup::Setup;
use crate::scenarios::util::{Scratch, agent_requests_of, assert_end_turn};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// FastMCP 4 imports in ~2 s idle and up to ~30 s on a loaded 2-core machine: every wait on
/// the server's start is this long.
const START: Duration = Duration::from_secs(90);

/// The agent's settings for a Python server: its handshake and hook calls may be slow under load.
const SLOW_PEER: [(&str, &str); 3] = [
    ("BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS", "60"),
    ("BUZZ_AGENT_TOOL_TIMEOUT_SECS", "60"),
    ("BUZZ_AGENT_HOOK_TIMEOUT_MS", "20000"),
];

/// The FastMCP server process; killed (and reaped) on drop.
struct TeamServer {
    child: Option<Child>,
    dir: PathBuf,
    /// 0 until the first start; a restart takes the same port.
    port: u16,
    starts: u32,
}

impl TeamServer {
    fn start(dir: &Path) -> TeamServer {
        let mut server = TeamServer {
            child: None,
            dir: dir.to_path_buf(),
            port: 0,
            starts: 0,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let port_file = self.dir.join(format!("team-port-{}", self.starts));
        let stderr = std::fs::File::create(self.dir.join(format!("team-{}.err", self.starts)))
            .expect("the server's stderr file");
        let child = Command::new(venv().join("bin").join("python"))
            .arg(example("http/fastmcp_team_server.py"))
            .env("PORT", self.port.to_string())
            .env("PORT_FILE", &port_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn the FastMCP server");
        self.child = Some(child);
        self.port = wait_port_file(&port_file, START, || {
            format!(
                "the FastMCP server did not listen within {START:?}: {}",
                self.stderr()
            )
        });
    }

    /// What the server processes wrote to stderr, for failure messages.
    fn stderr(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                let text = std::fs::read_to_string(self.dir.join(format!("team-{n}.err")))
                    .unwrap_or_default();
                format!("\n--- FastMCP server, start {n}:\n{text}")
            })
            .collect()
    }

    /// An ACP `mcpServers` entry for it.
    fn entry(&self, name: &str) -> Value {
        json!({"type": "http", "name": name, "url": format!("http://127.0.0.1:{}/mcp", self.port),
               "headers": []})
    }

    /// A session of `agent` with it as its one server, named `name`; returns the session id.
    fn new_session(&self, agent: &AgentProc, s: &Scratch, name: &str) -> String {
        let r = agent.request_timeout(
            "session/new",
            json!({"cwd": s.ws, "mcpServers": [self.entry(name)]}),
            START,
        );
        let sid = agent.result(&r)["sessionId"].as_str();
        sid.unwrap_or_else(|| panic!("session/new: {r}{}", self.stderr()))
            .to_string()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it and starts a new process on the same port: the sessions it gave out are gone.
    fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for TeamServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The agent's context and the server's stderr, for failure messages.
fn context(agent: &AgentProc, server: &TeamServer) -> String {
    format!("{}{}", agent.context(), server.stderr())
}

/// M10, M12 with a real FastMCP server over Streamable HTTP: the model's tool call is served;
/// a tool that asks the user (`ctx.elicit`) reaches the ACP client, which advertises
/// elicitation, and the client's answer reaches the tool; after the server is restarted (its
/// session id is unknown to the new process, `404`) the agent initializes a new session and
/// the next call is served, the model never hearing of it.
pub(super) fn m10_m12_fastmcp_http_server_serves_tools_an_elicitation_and_survives_a_restart(
    ctx: &Ctx,
    _: &Path,
) {
    let s = Scratch::new();
    let mut server = TeamServer::start(s.dir.path());
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::tool_calls(vec![("c1", "team__echo", json!({"text": "over http"}))]),
            Reply::text("echoed"),
            Reply::tool_calls(vec![(
                "c2",
                "team__deploy",
                json!({"target": "production"}),
            )]),
            Reply::text("deployed"),
            Reply::tool_calls(vec![(
                "c3",
                "team__echo",
                json!({"text": "after the restart"}),
            )]),
            Reply::text("echoed again"),
        ])
        .env(&SLOW_PEER)
        .spawn();
    agent.set_elicitation_answer(|_| {
        Some(json!({"action": "accept", "content": {"approve": true, "note": "ship it"}}))
    });
    let init = agent.request(
        "initialize",
        json!({"protocolVersion": 1,
               "clientCapabilities": {"elicitation": {"form": {}}},
               "clientInfo": {"name": "buzz-agent-e2e", "version": "0"}}),
    );
    assert_eq!(
        agent.result(&init)["agentCapabilities"]["mcpCapabilities"]["http"],
        true,
        "{init}"
    );
    let sid = server.new_session(&agent, &s, "team");

    let r = agent.prompt_timeout(&sid, "echo over http", START);
    assert_end_turn(&agent, &r);
    let reqs = llm.requests();
    let mut offered = reqs[0].tool_names();
    offered.sort();
    assert_eq!(
        offered,
        ["team__deploy", "team__echo"],
        "the hook is never offered (M4)"
    );
    assert_eq!(
        reqs[1].tool_results(),
        [("c1".to_string(), "over http".to_string())],
        "{}",
        context(&agent, &server)
    );

    let r = agent.prompt_timeout(&sid, "deploy", START);
    assert_end_turn(&agent, &r);
    let asked = agent_requests_of(&agent, "elicitation/create");
    assert_eq!(asked.len(), 1, "{asked:#?}");
    let params = &asked[0]["params"];
    assert_eq!(params["mode"], "form", "{params}");
    assert_eq!(params["sessionId"], sid.as_str(), "{params}");
    assert_eq!(
        params["message"], "MCP server 'team' asks: Deploy to production?",
        "{params}"
    );
    assert_eq!(
        params["requestedSchema"]["properties"]["approve"]["type"], "boolean",
        "{params}"
    );
    assert_eq!(
        llm.requests()[3].tool_results().last().cloned(),
        Some((
            "c2".to_string(),
            "deploy to production: approve=True note=ship it".to_string()
        )),
        "the client's answer reached the tool{}",
        context(&agent, &server)
    );

    server.restart();
    let r = agent.prompt_timeout(&sid, "echo again", START);
    assert_end_turn(&agent, &r);
    assert_eq!(
        llm.requests()[5].tool_results().last().cloned(),
        Some(("c3".to_string(), "after the restart".to_string())),
        "the call after the restart was served{}",
        context(&agent, &server)
    );
    assert!(
        agent
            .stderr_text()
            .contains("mcp 'team': the server lost the session (HTTP 404); initializing a new one"),
        "the new session came from a 404{}",
        context(&agent, &server)
    );
    agent.finish();
}

/// M10, H5, H6 with a real FastMCP server over Streamable HTTP as a team's central policy
/// server: allowlisted by `MCP_HOOK_SERVERS`, its `_Stop` objects once with the policy; the
/// objection reaches the model as on stdio, and the second `_Stop` lets the turn end.
pub(super) fn m10_h5_fastmcp_http_policy_server_objects_once_then_allows(ctx: &Ctx, _: &Path) {
    let s = Scratch::new();
    let server = TeamServer::start(s.dir.path());
    let mut env = SLOW_PEER.to_vec();
    env.push(("MCP_HOOK_SERVERS", "policy"));
    let (llm, agent) = Setup::new(ctx, &s)
        .replies(vec![
            Reply::text("All done."),
            Reply::text("Changelog entry added."),
        ])
        .env(&env)
        .spawn();
    agent.initialize();
    let sid = server.new_session(&agent, &s, "policy");
    let r = agent.prompt_timeout(&sid, "finish the release", START);
    assert_end_turn(&agent, &r);
    assert_eq!(
        agent.result(&r)["_meta"]["buzz"]["stopObjections"],
        1,
        "{r}{}",
        server.stderr()
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "one objection = one more LLM call");
    let objection = reqs[1]
        .assistant_tool_calls()
        .into_iter()
        .find(|(_, name, _)| name == "policy___Stop")
        .and_then(|(id, _, _)| reqs[1].tool_result_for(&id))
        .unwrap_or_default();
    assert_eq!(
        serde_json::from_str::<Value>(&objection).unwrap_or(Value::Null),
        json!({"hook": "_Stop", "server": "policy",
               "text": "Team policy: add a CHANGELOG.md entry before you finish."}),
        "{objection}"
    );
    for outcome in ["objection", "empty"] {
        super::wait_stderr(
            &agent,
            &format!("point=_Stop server=policy outcome={outcome}"),
            Duration::from_secs(15),
        );
    }
    agent.finish();
}
