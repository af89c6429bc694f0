"""A `_Stop` and `_PostCompact` hook server on the official Python MCP SDK 1.x, FastMCP API
(`mcp.server.fastmcp.FastMCP`, pinned in tests/requirements-mcp1.txt).

HOOK_MODE picks what both hooks return (see docs/MCP_DRIVEN_HOOKS.md, "What to return"):
  string  -> `_Stop` objects with "STOP from fastmcp-v1" on its first call, then returns None;
             `_PostCompact` returns "POSTCOMPACT from fastmcp-v1"
  empty   -> ""      none -> None      raise -> raises (an isError result)
"""

import os

from mcp.server.fastmcp import FastMCP

MODE = os.environ.get("HOOK_MODE", "none")
NAME = "fastmcp-v1"
mcp = FastMCP("hooks")
calls = {"_Stop": 0}


def answer(point: str, text: str) -> str | None:
    if MODE == "raise":
        raise RuntimeError(f"{point} hook failed on purpose")
    if MODE == "empty":
        return ""
    if MODE == "string":
        return text
    return None


@mcp.tool(name="_Stop")
def stop() -> str | None:
    """Objects while the work is not done."""
    calls["_Stop"] += 1
    if MODE == "string" and calls["_Stop"] > 1:
        return None
    return answer("_Stop", f"STOP from {NAME}")


@mcp.tool(name="_PostCompact")
def post_compact() -> str | None:
    """Restates what must survive a compaction."""
    return answer("_PostCompact", f"POSTCOMPACT from {NAME}")


if __name__ == "__main__":
    mcp.run()
