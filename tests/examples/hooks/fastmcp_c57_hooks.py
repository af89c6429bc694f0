"""Hook servers that `buzz-agent hooks check` must fail (case C57), on the standalone `fastmcp`
package (pinned in tests/requirements.txt), as real authors write them by mistake.

HOOK_MODE picks the mistake:
  misnamed -> the hook is registered as `_stop`: no hook point at all (the agent never calls it)
  raise    -> `_Stop` raises "database connection refused" (FastMCP answers an isError result)
  dict     -> `_Stop` returns a dict: FastMCP sends it as JSON text, which would always object
  false    -> `_Stop` returns False: the text "false", which would always object

It logs one line to stderr at start, as servers do, which the report must never show as its own.
"""

import os
import sys

from fastmcp import FastMCP

MODE = os.environ.get("HOOK_MODE", "misnamed")
mcp = FastMCP("c57")

print(f"c57 hook server starting in mode {MODE}", file=sys.stderr, flush=True)


@mcp.tool(name="todo_list")
def todo_list() -> str:
    """A model-visible tool beside the hook."""
    return "nothing to do"


if MODE == "misnamed":

    @mcp.tool(name="_stop")
    def stop_misnamed() -> str | None:
        """Meant to be the _Stop hook."""
        return None

elif MODE == "raise":

    @mcp.tool(name="_Stop")
    def stop_raise() -> str | None:
        """Fails the way a hook that needs a database does."""
        raise RuntimeError("database connection refused")

elif MODE == "dict":

    @mcp.tool(name="_Stop")
    def stop_dict() -> dict:
        """Answers a status object instead of an objection text."""
        return {"ok": True, "open_items": 0}

elif MODE == "false":

    @mcp.tool(name="_Stop")
    def stop_false() -> bool:
        """Answers False meaning "no objection"."""
        return False


if __name__ == "__main__":
    mcp.run()
