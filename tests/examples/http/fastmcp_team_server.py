"""A remote MCP server on the standalone `fastmcp` package (pinned in tests/requirements.txt),
served over FastMCP's Streamable HTTP transport (`http`) as its own process: what a team runs
once for everyone's agents.

  echo(text)     -> the text back
  deploy(target) -> asks the user to approve through MCP elicitation (`ctx.elicit`), then
                    says what the user answered
  _Stop          -> the team's policy as a `_Stop` hook (docs/MCP_DRIVEN_HOOKS.md): objects
                    once per MCP session with POLICY_TEXT, then lets the turn end

Environment: PORT (default 0: any free port; a restarted server is given the old one), PORT_FILE
(the port is written there once the socket listens), POLICY_TEXT.
"""

import os
import socket
from dataclasses import dataclass

from fastmcp import Context, FastMCP

POLICY = os.environ.get(
    "POLICY_TEXT", "Team policy: add a CHANGELOG.md entry before you finish."
)
mcp = FastMCP("team")
objected: set[str] = set()


@mcp.tool
def echo(text: str) -> str:
    """Returns the text it was given."""
    return text


@dataclass
class Approval:
    approve: bool
    note: str = "none"


@mcp.tool
async def deploy(target: str, ctx: Context) -> str:
    """Deploys to a target once the user approved it."""
    answer = await ctx.elicit(f"Deploy to {target}?", response_type=Approval)
    if answer.action != "accept":
        return f"deploy to {target}: {answer.action}"
    return f"deploy to {target}: approve={answer.data.approve} note={answer.data.note}"


@mcp.tool(name="_Stop")
def stop(ctx: Context) -> str | None:
    """Objects once per session; None lets the turn end."""
    if ctx.session_id in objected:
        return None
    objected.add(ctx.session_id)
    return POLICY


def listen() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ.get("PORT", "0"))))
    sock.listen(64)
    if "PORT_FILE" in os.environ:
        tmp = os.environ["PORT_FILE"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(sock.getsockname()[1]))
        os.rename(tmp, os.environ["PORT_FILE"])
    return sock


if __name__ == "__main__":
    mcp.run(transport="http", show_banner=False, sockets=[listen()], log_level="warning")
