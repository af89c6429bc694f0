#!/usr/bin/env python3
"""Seeds the fuzz corpora from every case of docs/cases.md and writes the hand-made
seeds of the `session` and `config_env` targets, and hand-made seeds with lone surrogate escapes
for every JSON-reading target (docs/fuzzing.md).

Usage: python3 fuzz/seeds/cases_to_corpus.py [FILE]
(default: docs/cases.md)

For each `### Cnn` section, every fenced block and every inline code span of its "Trigger"
text becomes bytes (`C> `/`S> `/`A< `/`M< ` prefixes dropped, `⏎` → newline) and is written,
with each target's header bytes, to the corpora whose input it can be: line_codec, acp_input,
mcp_output and the three SSE decoders. `cargo fuzz cmin` then keeps what adds coverage.
"""
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")

# Header bytes each target's Reader consumes before the data (see core/src/fuzzing).
HEADERS = {
    "line_codec": bytes([63, 0]),  # cap 64, no cuts
    "acp_input": bytes([255, 0]),  # cap 1084, no cuts
    "mcp_output": bytes([128, 0, 0]),  # half before the prompt, no stderr, no cuts
    "sse_chat": bytes([0]),
    "sse_anthropic": bytes([0]),
    "sse_responses": bytes([0]),
}


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def trigger_bytes(section):
    m = re.search(r"\*\*Trigger[^*]*\*\*(.*?)(?=\n\* \*\*(?!Trigger)|\Z)", section, re.S)
    text = m.group(1) if m else section
    pieces = [textwrap.dedent(b) for b in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)]
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    pieces += re.findall(r"`([^`\n]+)`", rest)
    out = []
    for p in pieces:
        lines = []
        for line in p.split("\n"):
            line = re.sub(r"^\s*(C>|S>|A<|M<|S<|A>|M>)\s?", "", line)
            lines.append(line.replace("⏎", "\n"))
        out.append("\n".join(lines))
    return "\n".join(out).encode("utf-8").replace(b"\\xE9", b"\xe9")


def cases(path):
    text = open(path, encoding="utf-8").read()
    parts = re.split(r"^### ", text, flags=re.M)[1:]
    n = 0
    for part in parts:
        m = re.match(r"(C\d+[a-z]?(?:[–-]C?\d+)?)", part)
        if not m:
            continue
        name = "case-" + m.group(1).replace("–", "-")
        data = trigger_bytes(part)
        if not data.strip():
            # No code in the trigger (C51, C52): its text, as a line, still seeds the codecs.
            data = (part.split("\n", 1)[0] + "\n").encode("utf-8")
        for target, header in HEADERS.items():
            write(target, name, header + data)
        n += 1
    return n


def surrogate_seeds():
    # Lone surrogate escapes as JavaScript and Python write them (SPEC L3b, case C64), and the
    # other faults the JSON decoder repairs (raw control characters, NaN), at every boundary.
    lines = [
        rb'{"jsonrpc":"2.0","id":1,"method":"m","params":["\ud83d"]}',
        rb'{"jsonrpc":"2.0","id":"\udc00x","result":1}',
        rb'{"jsonrpc":"2.0","method":"n","params":["\ud83d\ude00\udc00"]}',
        b'{"jsonrpc":"2.0","id":2,"result":[NaN,"a\tb",-Infinity]}',
        rb'{"jsonrpc":"2.0","id":3,"method":"m","params":{"\ud800k":"\\ud800"}}',
    ]
    write("line_codec", "lone-surrogates", HEADERS["line_codec"] + b"\n".join(lines) + b"\n")
    acp = [
        rb'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}',
        rb'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/tmp/ws","mcpServers":[]}}',
        rb'{"jsonrpc":"2.0","id":555,"method":"session/prompt","params":{"sessionId":"x","prompt":[{"type":"text","text":"cut here \ud83d"}]}}',
        rb'{"jsonrpc":"2.0","id":"\ud83d","method":"session/list","params":{}}',
        rb'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"\udc00"}}',
    ]
    write("acp_input", "lone-surrogates", HEADERS["acp_input"] + b"\n".join(acp) + b"\n")
    mcp = [
        rb'{"id":1,"jsonrpc":"2.0","result":{"capabilities":{"tools":{"listChanged":true}},"protocolVersion":"2025-11-25","serverInfo":{"name":"fake\ud83d","version":"1.0.0"}}}',
        rb'{"id":2,"jsonrpc":"2.0","result":{"tools":[{"name":"echo","description":"cut \udc00","inputSchema":{"type":"object"}}]}}',
        rb'{"id":3,"jsonrpc":"2.0","result":{"content":[{"type":"text","text":"pair \ud83d\ude00, cut \ud83d, orphan \udc00 END"}]}}',
    ]
    write("mcp_output", "lone-surrogates", HEADERS["mcp_output"] + b"\n".join(mcp) + b"\n")
    chat = (rb'data: {"choices":[{"index":0,"delta":{"content":"cut \ud83d"},"finish_reason":null}]}' + b"\n\n"
            + rb'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"fs__echo","arguments":"{\"text\":\"\\ud83d\"}"}}]},"finish_reason":null}]}' + b"\n\n"
            + rb'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}' + b"\n\ndata: [DONE]\n\n")
    write("sse_chat", "lone-surrogates", HEADERS["sse_chat"] + chat)
    anthropic = (b"event: message_start\n" + rb'data: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[]}}' + b"\n\n"
                 + b"event: content_block_start\n" + rb'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":"\udc00"}}' + b"\n\n"
                 + b"event: content_block_delta\n" + rb'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"cut \ud83d"}}' + b"\n\n"
                 + b"event: content_block_start\n" + rb'data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"fs__echo","input":{}}}' + b"\n\n"
                 + b"event: content_block_delta\n" + rb'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"text\":\"\\ud83d\"}"}}' + b"\n\n"
                 + b"event: message_delta\n" + rb'data: {"type":"message_delta","delta":{"stop_reason":"tool_use"}}' + b"\n\n"
                 + b"event: message_stop\n" + rb'data: {"type":"message_stop"}' + b"\n\n")
    write("sse_anthropic", "lone-surrogates", HEADERS["sse_anthropic"] + anthropic)
    responses = (b"event: response.output_text.delta\n" + rb'data: {"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"cut \ud83d"}' + b"\n\n"
                 + b"event: response.output_item.done\n" + rb'data: {"type":"response.output_item.done","output_index":1,"item":{"id":"fc_0","type":"function_call","arguments":"{\"text\":\"\\udc00\"}","call_id":"c1","name":"fs__echo"}}' + b"\n\n"
                 + b"event: response.completed\n" + rb'data: {"type":"response.completed","response":{"id":"r","status":"completed","output":[]}}' + b"\n\n")
    write("sse_responses", "lone-surrogates", HEADERS["sse_responses"] + responses)


def sse(events):
    # An SSE body: each (event, data) pair as `event:`/`data:` lines (no `event:` line when the
    # event is None), blank line after each.
    out = b""
    for event, data in events:
        if event is not None:
            out += b"event: " + event.encode() + b"\n"
        out += b"data: " + data + b"\n\n"
    return out


def stop_seeds():
    # Stops that are not the end (SPEC L13, case C69: Anthropic `pause_turn` after server-tool
    # blocks the agent keeps verbatim) and refusals (case C77: Anthropic `stop_reason: refusal`
    # with `stop_details`, Chat `content_filter` and a `refusal` delta, Responses a streamed
    # refusal and `incomplete` with `content_filter`).
    paused = sse([
        ("message_start", rb'{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"usage":{"input_tokens":50,"output_tokens":1}}}'),
        ("content_block_start", rb'{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{}}}'),
        ("content_block_delta", rb'{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"rust 2026"}}'),
        ("content_block_delta", rb'{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" edition\"}"}}'),
        ("content_block_stop", rb'{"type":"content_block_stop","index":0}'),
        ("content_block_start", rb'{"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[{"type":"web_search_result","url":"https://example.com/r","title":"Rust","encrypted_content":"EqgfCioIARgB","page_age":null}]}}'),
        ("content_block_stop", rb'{"type":"content_block_stop","index":1}'),
        ("content_block_start", rb'{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}'),
        ("content_block_delta", rb'{"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"The 2026 edition "}}'),
        ("content_block_delta", rb'{"type":"content_block_delta","index":2,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://example.com/r","title":"Rust","encrypted_index":"Eo8B","cited_text":"edition"}}}'),
        ("content_block_stop", rb'{"type":"content_block_stop","index":2}'),
        ("message_delta", rb'{"type":"message_delta","delta":{"stop_reason":"pause_turn","stop_sequence":null},"usage":{"output_tokens":40}}'),
        ("message_stop", rb'{"type":"message_stop"}'),
    ])
    write("sse_anthropic", "case-C69-pause-turn", HEADERS["sse_anthropic"] + paused)
    refused = sse([
        ("message_start", rb'{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":20,"output_tokens":0}}}'),
        ("message_delta", rb'{"type":"message_delta","delta":{"stop_reason":"refusal","stop_sequence":null,"stop_details":{"type":"refusal","category":"cyber","explanation":"This request asks for \ud83d malware."}},"usage":{"output_tokens":0}}'),
        ("message_stop", rb'{"type":"message_stop"}'),
    ])
    write("sse_anthropic", "case-C77-refusal", HEADERS["sse_anthropic"] + refused)
    # A refusal after some text, with a null explanation.
    refused_late = sse([
        ("message_start", rb'{"type":"message_start","message":{"id":"msg_3","type":"message","role":"assistant","content":[]}}'),
        ("content_block_start", rb'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
        ("content_block_delta", rb'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Sure, here is"}}'),
        ("content_block_stop", rb'{"type":"content_block_stop","index":0}'),
        ("message_delta", rb'{"type":"message_delta","delta":{"stop_reason":"refusal","stop_details":{"type":"refusal","category":null,"explanation":null}}}'),
        ("message_stop", rb'{"type":"message_stop"}'),
    ])
    write("sse_anthropic", "case-C77-refusal-after-text", HEADERS["sse_anthropic"] + refused_late)
    chat = sse([
        (None, rb'{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":"I cannot help with that."},"finish_reason":null}]}'),
        (None, rb'{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"refusal"}]}'),
        (None, rb'{"id":"c","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":6}}'),
        (None, b"[DONE]"),
    ])
    write("sse_chat", "case-C77-refusal", HEADERS["sse_chat"] + chat)
    chat_filter = sse([
        (None, rb'{"id":"c","choices":[{"index":0,"delta":{"content":"Part of an answer"},"finish_reason":null}]}'),
        (None, rb'{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}'),
        (None, b"[DONE]"),
    ])
    write("sse_chat", "case-C77-content-filter", HEADERS["sse_chat"] + chat_filter)
    responses = sse([
        ("response.created", rb'{"type":"response.created","response":{"id":"r","status":"in_progress","output":[]}}'),
        ("response.output_item.added", rb'{"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","content":[]}}'),
        ("response.refusal.delta", rb'{"type":"response.refusal.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"I cannot help with that."}'),
        ("response.refusal.done", rb'{"type":"response.refusal.done","item_id":"msg_1","output_index":0,"content_index":0,"refusal":"I cannot help with that."}'),
        ("response.completed", rb'{"type":"response.completed","response":{"id":"r","status":"completed","output":[{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"refusal","refusal":"I cannot help with that."}]}]}}'),
    ])
    write("sse_responses", "case-C77-refusal", HEADERS["sse_responses"] + responses)
    responses_filter = sse([
        ("response.output_text.delta", rb'{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Part of"}'),
        ("response.incomplete", rb'{"type":"response.incomplete","response":{"id":"r","status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[]}}'),
    ])
    write("sse_responses", "case-C77-content-filter", HEADERS["sse_responses"] + responses_filter)


def session_seeds():
    # cfg byte, context byte, server count byte, then (op, arg) pairs (core/src/fuzzing/session.rs).
    P, C, LT, LTOOL, LERR, LCUT, MCP, EXIT, MRAW, ARAW, PERM, NEWS, SETM, LRAW = (
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 13)
    T = 0
    scripts = {
        # a prompt, a text answer (chat, allow, budget 0)
        "text": [0, 10, 0, P, 0, LT, 0, T, 10],
        # a tool call answered, then text; then the _Stop hook objects once (budget 1)
        "tool-then-stop": [8, 10, 0, P, 3, ord("g"), ord("o"), ord("!"), LTOOL, 0, 0, MCP, 0, 3,
                           LT, 0, MCP, 0, 3, LT, 0, MCP, 0, 2, T, 50],
        # anthropic, ask mode: permission answered, then a cancel
        "anthropic-permission": [5, 10, 1, P, 0, LTOOL, 1, 0, PERM, 0, MCP, 0, 4, C, 0, T, 200],
        # responses route: errors, retry, cut body, raw body
        "responses-errors": [2, 10, 1, P, 0, LERR, 0x10, T, 100, LERR, 1, LCUT, 40, P, 0, LRAW, 8,
                             ord("d"), ord("a"), ord("t"), ord("a"), ord(":"), ord(" "), ord("x"), 10],
        # a server dies mid-call, a hook times out twice, garbage from everyone
        "deaths": [24, 1, 1, P, 0, LTOOL, 2, 0x80, 1, EXIT, 0, T, 255, T, 255, MRAW, 0, 5,
                   ord("{"), ord("x"), 10, 0, 0, ARAW, 3, ord("["), ord("]"), ord("{"), NEWS, 1,
                   SETM, 0, P, 1, LT, 1],
        # small context: compaction with _PostCompact on server b
        # L3b: tool-call arguments and a tool reply with lone surrogate escapes, on each route
        "lone-surrogates-chat": [0, 10, 0, P, 3, ord("g"), ord("o"), ord("!"), LTOOL, 0, 0x40,
                                 MCP, 0, 0x83, LT, 0, T, 10],
        "lone-surrogates-anthropic": [1, 10, 0, P, 0, LTOOL, 1, 0x40, 0x40, MCP, 0, 0x83, MCP, 0,
                                      0x80, LT, 0, T, 10],
        "lone-surrogates-responses": [2, 10, 0, P, 0, LTOOL, 0, 0x40, MCP, 0, 0x83, LT, 0, T, 10],
        "compaction": [8, 0, 1, P, 60] + [ord("w")] * 60 + [LT, 2, P, 60] + [ord("v")] * 60 +
                      [LT, 2, MCP, 1, 3, LT, 0, T, 40],
    }
    for name, ops in scripts.items():
        write("session", name, bytes(ops))


def variable_order():
    # The constants of config::VARIABLES in order: a selector byte is an index into it.
    text = open(os.path.join(ROOT, "core", "src", "config.rs"), encoding="utf-8").read()
    table = text.split("const VARIABLES: &[(&str, &str, &str)] = &[", 1)[1].split("\n];", 1)[0]
    return re.findall(r"^    \(([A-Z_]+),", table, re.M)


def config_seeds():
    # entries: selector (index into config::variable_names), length, value.
    def entry(sel, value):
        v = value.encode() if isinstance(value, str) else value
        return bytes([sel, len(v)]) + v
    order = variable_order()
    at = order.index
    seeds = {
        "openai-minimal": entry(at("PROVIDER"), "openai") + entry(at("OPENAI_MODEL"), "gpt-x"),
        "anthropic-full": entry(at("PROVIDER"), "anthropic") + entry(at("ANTHROPIC_API_KEY"), "sk-test")
        + entry(at("ANTHROPIC_MODEL"), "claude") + entry(at("MAX_ROUNDS"), "10")
        + entry(at("MAX_OUTPUT_TOKENS"), "1024") + entry(at("MAX_CONTEXT_TOKENS"), "2048")
        + entry(at("HOOK_SERVERS"), "*") + entry(at("HOOK_TIMEOUT_MS"), "300")
        + entry(at("PERMISSION"), "allow") + entry(at("LOG"), "debug") + entry(at("LOG_FORMAT"), "json"),
        "bad-values": entry(at("PROVIDER"), "openai") + entry(at("OPENAI_MODEL"), "m")
        + entry(at("MAX_OUTPUT_TOKENS"), "99999999999999999999") + entry(at("HOOK_TIMEOUT_MS"), "-1")
        + entry(at("REQUIRE_REPLY"), "maybe") + entry(at("OPENAI_BASE_URL"), "ftp://x"),
        "system-file": entry(at("PROVIDER"), "openai") + entry(at("OPENAI_MODEL"), "m")
        + entry(at("SYSTEM_PROMPT_FILE"), "/missing/prompt.txt"),
    }
    # SPEC L3b, case C64: lone surrogates as an environment carries them: JSON-style `\ud83d`
    # escapes taken literally, and the bytes a surrogate has in WTF-8 / CESU-8 (Python's
    # surrogateescape), which the target decodes lossily, in every free-text variable.
    lone = b"\xed\xa0\xbd"
    seeds["lone-surrogates"] = (
        entry(at("PROVIDER"), "anthropic") + entry(at("ANTHROPIC_API_KEY"), b"sk-" + lone)
        + entry(at("ANTHROPIC_MODEL"), "claude-\\ud83d") + entry(at("MODELS"), b"a," + lone + b",\\udc00")
        + entry(at("SYSTEM_PROMPT"), b"be brief \\ud83d\\ude00 \\udc00 " + lone)
        + entry(at("HOOK_SERVERS"), b"todo,\\ud800," + lone) + entry(at("REPLY_TOOLS"), "fs__\\udfff")
        + entry(at("PROMPT_CACHE_KEY"), b"k\\ud83d" + lone) + entry(at("CHILD_ENV"), b"X_*," + lone)
        + entry(at("PERMISSION"), b"ask" + lone) + entry(at("LOG"), "info"))
    seeds["lone-surrogates-openai"] = (
        entry(at("PROVIDER"), "openai") + entry(at("OPENAI_MODEL"), b"m" + lone)
        + entry(at("OPENAI_BASE_URL"), "http://127.0.0.1:1/v1/\\ud83d")
        + entry(at("SYSTEM_PROMPT_FILE"), b"/prompt-" + lone + b".txt")
        + entry(at("PRICES"), b"input=1,output=2,currency=\\ud83d"))
    for name, data in seeds.items():
        write("config_env", name, data)


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "cases.md")
    n = cases(path)
    surrogate_seeds()
    stop_seeds()
    session_seeds()
    config_seeds()
    print(f"{n} cases written")
