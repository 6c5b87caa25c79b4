"""The gateway's tool definitions as a host reads them: `tools/list` over real streamable HTTP carries each
memory tool's MCP annotations, so a host can tell before a call that it only reads."""

from __future__ import annotations

import httpx2

from memactors.service import MemoryService
from support_readside import API, as_run, gateway_client

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def test_recall_and_briefing_declare_read_only_closed_world_annotations_with_a_title(
        served: tuple[MemoryService, str]) -> None:
    service, url = served
    token, _ = await as_run(service, "api-fixer", "r-tools", API)
    async with gateway_client(url, token) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert sorted(tools) == ["briefing", "recall"]
    for tool in tools.values():
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is True and tool.annotations.open_world_hint is False
        assert tool.annotations.destructive_hint is False and tool.annotations.idempotent_hint is True
        assert tool.annotations.title and tool.title == tool.annotations.title
    # the wire form a host without this SDK reads: camelCase hints in the JSON body of tools/list
    async with httpx2.AsyncClient(timeout=None, headers={**HEADERS, "authorization": f"Bearer {token}"}) as http:
        opened = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}})
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        listed = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session)
    wire = {tool["name"]: tool["annotations"] for tool in listed.json()["result"]["tools"]}
    assert wire["recall"] == {"title": "Recall memory", "readOnlyHint": True, "destructiveHint": False,
                              "idempotentHint": True, "openWorldHint": False}
    assert wire["briefing"]["readOnlyHint"] is True and wire["briefing"]["openWorldHint"] is False
