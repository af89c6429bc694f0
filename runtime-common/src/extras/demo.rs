//! `buzz-agent demo` (SPEC P3): a complete offline session with nothing installed — a scripted
//! OpenAI-compatible LLM on 127.0.0.1, the bundled `todo` hook server (E2), and this very binary
//! as the ACP agent child — printed as a readable transcript in which `_Stop` objects once and
//! the agent carries on to `end_turn`.

use super::acp_client::AcpChild;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const ITEM: &str = "write the release notes";

/// `println!` that ignores a closed stdout (`buzz-agent demo | head` must not panic).
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Run the demo; returns the exit code.
pub fn run() -> i32 {
    match demo() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("demo failed: {e}");
            1
        }
    }
}

fn demo() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let exe = exe.to_string_lossy().into_owned();
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let calls = Arc::new(AtomicUsize::new(0));
    // What the scripted LLM saw of the hooks (the model-visible injections), printed by the main
    // thread right before the reply they caused, so the transcript order is causal.
    let (seen_tx, seen_rx) = mpsc::channel::<String>();
    {
        let calls = calls.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let _ = serve_llm(stream, n, &seen_tx);
            }
        });
    }
    out!(
        "== buzz-agent demo: a scripted LLM on 127.0.0.1:{port}, the bundled `todo` hook server, MCP_HOOK_SERVERS=todo\n"
    );
    let mut cmd = Command::new(&exe);
    cmd.env("BUZZ_AGENT_PROVIDER", "openai")
        .env(
            "OPENAI_COMPAT_BASE_URL",
            format!("http://127.0.0.1:{port}/v1"),
        )
        .env("OPENAI_COMPAT_MODEL", "demo-model")
        .env("MCP_HOOK_SERVERS", "todo")
        .env("BUZZ_AGENT_PERMISSION", "allow")
        .env("BUZZ_AGENT_LOG", "info")
        // The agent's log is not part of the transcript.
        .stderr(Stdio::null());
    let mut agent = AcpChild::spawn(cmd)?;
    let mut quiet = |_: &Value| None;
    let init = agent
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
            &mut quiet,
        )
        .map_err(|e| e.to_string())?;
    out!(
        "client → initialize          agent: {} {}",
        init["result"]["agentInfo"]["name"],
        init["result"]["agentInfo"]["version"]
    );
    let cwd = std::env::temp_dir().to_string_lossy().into_owned();
    let new = agent
        .request(
            "session/new",
            json!({"cwd": cwd, "mcpServers":[{"name":"todo","command": exe,"args":["example-server","todo"],"env":[]}]}),
            &mut quiet,
        )
        .map_err(|e| e.to_string())?;
    let sid = new["result"]["sessionId"]
        .as_str()
        .ok_or_else(|| format!("session/new failed: {new}"))?
        .to_string();
    out!(
        "client → session/new         session {sid} with MCP server `todo` (tools todo_add/todo_done/todo_list, hooks _Stop/_PostCompact)"
    );
    let prompt = "Track and finish the release notes.";
    out!("client → session/prompt      {prompt:?}\n");
    let mut show = |v: &Value| {
        if v["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            while let Ok(seen) = seen_rx.try_recv() {
                out!("{seen}");
            }
        }
        print_update(v);
        None
    };
    let resp = agent
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}),
            &mut show,
        )
        .map_err(|e| e.to_string())?;
    let r = &resp["result"];
    out!(
        "\nagent → stopReason: {}   (_meta.buzz: rounds {}, _Stop objections {}, budget {})",
        r["stopReason"],
        r["_meta"]["buzz"]["rounds"],
        r["_meta"]["buzz"]["stopObjections"],
        r["_meta"]["buzz"]["stopBudget"]
    );
    // EOF: the agent shuts its MCP server down and exits (SPEC P1).
    let _ = agent.finish(Duration::from_secs(10));
    if r["stopReason"] != "end_turn" || r["_meta"]["buzz"]["stopObjections"] != 1 {
        return Err(format!("unexpected result: {resp}"));
    }
    out!(
        "\nThe model tried to stop with an open todo item; the `todo` server's _Stop hook objected once,\nthe model finished the item, and the turn ended normally."
    );
    Ok(())
}

fn print_update(v: &Value) {
    let u = &v["params"]["update"];
    match u["sessionUpdate"].as_str() {
        Some("agent_message_chunk") => {
            out!("   model: {}", u["content"]["text"].as_str().unwrap_or(""))
        }
        Some("tool_call") => out!(
            "   tool call {} {}",
            u["title"].as_str().unwrap_or(""),
            u["rawInput"]
        ),
        Some("tool_call_update") if u["status"] == "completed" || u["status"] == "failed" => {
            let text = u["content"][0]["content"]["text"].as_str().unwrap_or("");
            out!("     → {}: {text}", u["status"].as_str().unwrap_or(""));
        }
        _ => {}
    }
}

/// One scripted LLM response per request, streamed as OpenAI Chat Completions SSE.
fn serve_llm(mut stream: TcpStream, n: usize, seen: &mpsc::Sender<String>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    // The newest hook injection, if this request is the one that follows it (SPEC H6).
    if let Ok(req) = serde_json::from_slice::<Value>(&body) {
        let msgs = req["messages"].as_array().cloned().unwrap_or_default();
        if let Some(last) = msgs.last().filter(|m| m["role"] == "tool") {
            let content = last["content"].as_str().unwrap_or("");
            if let Ok(inj) = serde_json::from_str::<Value>(content)
                .map_err(drop)
                .and_then(|v| if v["hook"] == "_Stop" { Ok(v) } else { Err(()) })
            {
                let _ = seen.send(format!(
                    "   [_Stop hook of `{}` objected; the model now sees: {}]",
                    inj["server"].as_str().unwrap_or(""),
                    inj["text"].as_str().unwrap_or("").replace('\n', " ")
                ));
            }
        }
    }
    let chunks: Vec<Value> = match n {
        0 => tool_call("I'll track this on the todo list first.", "todo__todo_add"),
        1 => text("All set — I'm done here."),
        2 => tool_call(
            "Right, the item is still open. Writing the notes and closing it.",
            "todo__todo_done",
        ),
        _ => text("The release notes are written and the todo item is done."),
    };
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
    );
    for c in chunks {
        out.push_str(&format!("data: {c}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    stream.write_all(out.as_bytes())
}

fn text(t: &str) -> Vec<Value> {
    vec![
        json!({"choices":[{"index":0,"delta":{"content": t},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":12}}),
    ]
}

fn tool_call(t: &str, name: &str) -> Vec<Value> {
    let args = json!({"item": ITEM}).to_string();
    vec![
        json!({"choices":[{"index":0,"delta":{"content": t},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_demo","type":"function","function":{"name": name,"arguments": args}}]},"finish_reason":null}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20}}),
    ]
}
