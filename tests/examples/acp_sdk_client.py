"""Drives buzz-agent with the official Python ACP SDK (PyPI `agent-client-protocol`, pinned in
tests/requirements.txt), through the SDK's own `spawn_agent_process()` helper: initialize,
session/new with the MCP servers given as JSON, one prompt; every `session/request_permission`
is answered "allow once". Prints one JSON object: the prompt response, the session updates and
the permission requests, as the SDK parsed them.

usage: acp_sdk_client.py AGENT_BINARY CWD MCP_SERVERS_JSON PROMPT
(the agent's configuration comes from this process's environment)
"""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    EnvVariable,
    Implementation,
    McpServerStdio,
    RequestPermissionResponse,
)


class Client:
    """The client side: records what the agent sends."""

    def __init__(self):
        self.updates = []
        self.permissions = []

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.permissions.append(tool_call.model_dump(by_alias=True, exclude_none=True))
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(option_id=allow.option_id, outcome="selected")
        )

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update.model_dump(by_alias=True, exclude_none=True))


async def main():
    agent, cwd, servers, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    client = Client()
    mcp_servers = [
        McpServerStdio(
            name=s["name"],
            command=s["command"],
            args=s.get("args", []),
            env=[EnvVariable(name=e["name"], value=e["value"]) for e in s.get("env", [])],
        )
        for s in servers
    ]
    async with spawn_agent_process(client, agent, env=dict(os.environ), cwd=cwd) as (conn, _proc):
        init = await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(),
            client_info=Implementation(name="acp-python-sdk-e2e", version="0"),
        )
        session = await conn.new_session(cwd=cwd, mcp_servers=mcp_servers)
        response = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block(prompt)]), 120
        )
        print(
            json.dumps(
                {
                    "initialize": init.model_dump(by_alias=True, exclude_none=True),
                    "response": response.model_dump(by_alias=True, exclude_none=True),
                    "updates": client.updates,
                    "permissions": client.permissions,
                }
            )
        )


asyncio.run(main())
