"""A minimal memactors memory provider: the four contract tools over MCP stdio, episodes kept in a dict.

    [mcp.mini]
    command = ".venv/bin/python"       # an interpreter with the MCP SDK (this project's venv)
    args = ["examples/minimal_provider.py"]

    memactors memory provider check --provider mini    # all seven checks pass

It depends only on the MCP Python SDK (2.x) and trio; docs/write-a-provider.md explains each tool.
"""

import json
from typing import Any

import mcp.types as t
import trio
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

episodes: dict[str, dict[str, str]] = {}  # id -> {"scope", "text"}; a real provider persists this
OPEN = {"type": "object"}  # input schemas: accept what memactors sends (it validates before sending)
TOOLS = ["memory_contract", "memory_record_episode", "memory_recall", "memory_forget"]


def handle(name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name == "memory_contract":
        return {"contract": 1, "provider": {"name": "minimal", "version": "0.1"}}
    if name == "memory_record_episode":
        episodes[args["episode_id"]] = {"scope": args["scope"], "text": args["text"]}
        return {"ids": [args["episode_id"]]}
    if name == "memory_recall":
        words = args["query"].lower().split()
        hits = [(sum(w in ep["text"].lower() for w in words), eid) for eid, ep in episodes.items()
                if ep["scope"] in args["scope"]]  # filter by scope: memactors re-checks anyway
        best = sorted((h for h in hits if h[0]), reverse=True)[: args["limit"]]
        return {"items": [{"id": eid, "text": episodes[eid]["text"][:2000], "score": float(score)}
                          for score, eid in best]}
    return {"forgotten": episodes.pop(args["id"], None) is not None}  # memory_forget


async def list_tools(ctx: ServerRequestContext, params: t.PaginatedRequestParams | None) -> t.ListToolsResult:
    return t.ListToolsResult(tools=[t.Tool(name=n, input_schema=OPEN) for n in TOOLS])


async def call_tool(ctx: ServerRequestContext, params: t.CallToolRequestParams) -> t.CallToolResult:
    if params.name not in TOOLS:
        return t.CallToolResult(content=[t.TextContent(type="text", text="unknown tool")], is_error=True)
    result = handle(params.name, dict(params.arguments or {}))
    return t.CallToolResult(content=[t.TextContent(type="text", text=json.dumps(result))],
                            structured_content=result)


async def main() -> None:
    server = Server("minimal", version="0.1", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    trio.run(main)
