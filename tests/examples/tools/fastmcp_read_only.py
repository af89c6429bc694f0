"""Two model-visible tools on the `fastmcp` package (pinned in tests/requirements.txt), the
README's "Your first tool" example: `count_words` carries the MCP annotation `readOnlyHint`, so
the agent announces its calls as kind `read` and the default modes of `buzz-agent exec` and
acpx allow them; `count_words_plain` is the same tool without it (kind `other`), which those
modes deny (peers::c53_acpx_default_mode_denies_an_unannotated_fastmcp_tool_and_allows_a_read_only_one).
"""

from fastmcp import FastMCP

mcp = FastMCP("words")


@mcp.tool(annotations={"readOnlyHint": True})
def count_words(text: str) -> int:
    """Counts the words of a text."""
    return len(text.split())


@mcp.tool
def count_words_plain(text: str) -> int:
    """Counts the words of a text (no annotations)."""
    return len(text.split())


if __name__ == "__main__":
    mcp.run()
