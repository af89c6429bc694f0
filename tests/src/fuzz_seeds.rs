//! Seeds for the fuzz corpora (`../fuzz/corpus/`) from the e2e fakes' own traffic: the fake
//! LLM's SSE bodies on all three routes, the fake MCP server's stdout for a handshake and tool
//! calls, and the ACP lines the harness sends. Run by hand (docs/fuzzing.md):
//! `cargo test -p buzz-agent-e2e --lib fuzz_seeds -- --ignored`; then minimise with
//! `cargo fuzz cmin`.

use crate::fake_llm::{Reply, Wire};
use crate::fake_mcp::{self, Config, Out};
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

fn corpus(target: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("corpus dir");
    dir
}

fn write(target: &str, name: &str, header: &[u8], body: &[u8]) {
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(body);
    std::fs::write(corpus(target).join(format!("seed-{name}")), bytes).expect("write seed");
}

/// A writer the fake MCP server writes its stdout into.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the fake MCP server writes for `input` lines with the given `FAKE_MCP_*` settings.
fn mcp_traffic(vars: &[(&str, &str)], input: &[Value]) -> Vec<u8> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let cfg = Config::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
    let out = Captured::default();
    let mut stdin = Vec::new();
    for v in input {
        stdin.extend_from_slice(format!("{v}\n").as_bytes());
    }
    fake_mcp::serve(
        cfg,
        std::io::Cursor::new(stdin),
        Out::new(Box::new(out.clone())),
        Arc::new(|_| {}),
    );
    // Calls are answered on their own threads.
    std::thread::sleep(std::time::Duration::from_millis(300));
    out.0.lock().expect("lock").clone()
}

/// One fake MCP session: name, `FAKE_MCP_*` settings, lines sent.
type McpSession<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<Value>);

#[test]
#[ignore = "writes seed files into ../fuzz/corpus; run by hand"]
fn write_fuzz_seeds() {
    // The fake LLM's bodies, every route.
    let replies = [
        ("text", Reply::text("Hello, héllo 🐝!")),
        (
            "tools",
            Reply::tool_calls(vec![
                ("call_1", "fs__read_file", json!({"path": "a.txt"})),
                ("call_2", "fs__list_dir", json!({})),
            ]),
        ),
        (
            "thinking",
            Reply::text("answer").with_thinking("let me think"),
        ),
        ("usage", Reply::text("u").usage(Some((120, 40)))),
        ("length", Reply::text("cut").finish_reason("length")),
        ("no-done", Reply::text("no terminator").without_done()),
    ];
    for wire in Wire::ALL {
        let target = match wire {
            Wire::Chat => "sse_chat",
            Wire::Anthropic => "sse_anthropic",
            Wire::Responses => "sse_responses",
        };
        for (name, reply) in &replies {
            let body = reply.sse_pieces_for(wire).concat();
            write(target, &format!("fake-{name}"), &[0], body.as_bytes());
        }
    }
    // The fake MCP server's stdout: handshake, paged list, calls, hooks, garbage, C36 bytes.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "buzz-agent", "version": "0"}}});
    let inited = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let call = |id: u64, name: &str, args: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let sessions: [McpSession; 4] = [
        (
            "handshake",
            vec![("FAKE_MCP_TOOLS", "echo,add")],
            vec![init.clone(), inited.clone(), list.clone()],
        ),
        (
            "calls",
            vec![("FAKE_MCP_TOOLS", "echo,fail,reject,latin1")],
            vec![
                init.clone(),
                inited.clone(),
                list.clone(),
                call(3, "echo", json!({"text": "hi"})),
                call(4, "fail", json!({})),
                call(5, "reject", json!({})),
                call(6, "latin1", json!({})),
            ],
        ),
        (
            "hooks-garbage",
            vec![
                ("FAKE_MCP_STOP", "1"),
                ("FAKE_MCP_GARBAGE", "1"),
                ("FAKE_MCP_POSTCOMPACT_TEXT", "remember the plan"),
            ],
            vec![
                init.clone(),
                inited.clone(),
                list.clone(),
                call(3, "_Stop", json!({})),
                call(4, "_PostCompact", json!({})),
            ],
        ),
        (
            "paged",
            vec![("FAKE_MCP_TOOL_COUNT", "5"), ("FAKE_MCP_PAGE_SIZE", "2")],
            vec![init, inited, list],
        ),
    ];
    for (name, vars, input) in sessions {
        let out = mcp_traffic(&vars, &input);
        // Half before the prompt, no stderr share: the handshake lands before the prompt.
        write("mcp_output", &format!("fake-{name}"), &[255, 0, 0], &out);
        write("line_codec", &format!("mcp-{name}"), &[63, 0], &out);
    }
    write(
        "mcp_output",
        "fake-stderr",
        &[128, 64, 0],
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{}}}\nfatal: db locked\n",
    );
    // The ACP lines the harness sends.
    let acp = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/tmp/ws", "mcpServers": []}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "sess_1", "prompt": [{"type": "text", "text": "hi"}, {"type": "resource", "resource": {"uri": "file:///a", "text": "x"}}]}}),
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess_1"}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/set_model", "params": {"sessionId": "sess_1", "modelId": "m2"}}),
        json!({"jsonrpc": "2.0", "id": 4, "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}),
    ];
    let mut lines = Vec::new();
    for v in &acp {
        lines.extend_from_slice(format!("{v}\n").as_bytes());
    }
    write("acp_input", "harness", &[255, 0], &lines);
    write("line_codec", "acp-harness", &[63, 0], &lines);
}
