"""Saved sessions (SPEC A9) driven by the official Python ACP SDK (PyPI `agent-client-protocol`,
pinned in tests/requirements.txt), through the SDK's own `spawn_agent_process()` helper.

usage: acp_sdk_session.py AGENT_BINARY CWD new PROMPT
       acp_sdk_session.py AGENT_BINARY CWD load SESSION_ID PROMPT

`new`: initialize, session/new, one prompt. `load` (in a later process, so a new agent): initialize,
session/list, session/load of SESSION_ID (the replayed updates are collected), one prompt. Prints
one JSON object: what the SDK parsed (initialize result, session id, list result, the updates
received before the load's response, the prompt response, every update).
(the agent's configuration comes from this process's environment). The agent's stderr is this
process's stderr (`transport_kwargs={"stderr": None}`: by default the SDK pipes it and never
reads it, which hides the agent's log; README, "The Python ACP SDK hides the agent's log").
"""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import ClientCapabilities, Implementation


class Client:
    """The client side: records what the agent sends."""

    def __init__(self):
        self.updates = []

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        raise RuntimeError("no permission request expected")

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(
            {"sessionId": session_id, "update": update.model_dump(by_alias=True, exclude_none=True)}
        )


def dump(model):
    return model.model_dump(by_alias=True, exclude_none=True) if model is not None else None


async def main():
    agent, cwd, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    client = Client()
    report = {}
    async with spawn_agent_process(
        client, agent, env=dict(os.environ), cwd=cwd, transport_kwargs={"stderr": None}
    ) as (conn, _proc):
        init = await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(),
            client_info=Implementation(name="acp-python-sdk-e2e", version="0"),
        )
        report["initialize"] = dump(init)
        if mode == "new":
            prompt = sys.argv[4]
            session = await conn.new_session(cwd=cwd, mcp_servers=[])
            session_id = session.session_id
        else:
            session_id, prompt = sys.argv[4], sys.argv[5]
            report["list"] = dump(await conn.list_sessions(cwd=cwd))
            loaded = await asyncio.wait_for(
                conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[]), 60
            )
            report["load"] = dump(loaded)
            report["replayed"] = list(client.updates)
        report["sessionId"] = session_id
        response = await asyncio.wait_for(
            conn.prompt(session_id=session_id, prompt=[text_block(prompt)]), 120
        )
        report["response"] = dump(response)
        report["updates"] = client.updates
    print(json.dumps(report))


asyncio.run(main())
