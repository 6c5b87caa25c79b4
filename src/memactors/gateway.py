"""The agent gateway: an MCP server over streamable HTTP on `[gateway] listen` (REQ-12, REQ-15, REQ-2).

It serves, in the reserved namespace, the read-tier tools ``recall`` ({query, paths?, limit?}) and
``briefing`` ({refresh?}) and the resource ``harness://memory/briefing`` (text/plain). The caller is
the run whose token it presents (``Authorization: Bearer <run token>``, SPEC-0005); without a known
token it is unattributed: recall then serves no episodes, and a briefing is refused ``not_attributed``.

Nothing else is reachable through it. The memory provider's tools never appear in ``tools/list``, and
``call_tool`` naming any other tool (``zep__memory_forget``, ``memory_forget``, ...) is refused
``not_permitted`` without anything being sent upstream, and written to the call log with outcome
``denied`` (REQ-2). Agents therefore have no tool that records, edits or forgets an episode.

The server is the mcp SDK's low-level ``Server`` and its streamable-HTTP ASGI app, run by hypercorn's
trio worker in the daemon's nursery.
"""

from __future__ import annotations

from typing import Any

import mcp.types as t
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from loguru import logger
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from . import contract
from .actors.briefing import View
from .errors import InvalidArgument, NotAttributed
from .store import iso, log_call

__all__ = ["BRIEFING_URI", "GATEWAY_TOOLS", "Gateway", "serve_gateway"]

BRIEFING_URI = "harness://memory/briefing"
GATEWAY_TOOLS = ("recall", "briefing")

_RECALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": contract.MAX_QUERY_CHARS},
        "paths": {"type": "array", "items": {"type": "string"}, "maxItems": contract.MAX_PATHS},
        "limit": {"type": "integer", "minimum": 1, "maximum": contract.MAX_LIMIT, "default": 8},
    },
    "required": ["query"],
    "additionalProperties": False,
}
_BRIEFING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"refresh": {"type": "boolean", "default": False}},
    "additionalProperties": False,
}


def _error(code: str, message: str) -> t.CallToolResult:
    return t.CallToolResult(content=[t.TextContent(type="text", text=f"{code}: {message}")],
                            structured_content={"error": code, "message": message}, is_error=True)


def _bearer(ctx: Any) -> str | None:
    request = getattr(ctx, "request", None)
    if request is None:
        return None
    header = request.headers.get("authorization") or ""
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class Gateway:
    """The gateway's MCP handlers over a MemoryService (only its public handlers are used)."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self._log = logger.bind(component="gateway")

    def server(self) -> Server[Any]:
        return Server(
            "harness-memory",
            version="1",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
        )

    async def _view(self, ctx: Any) -> View:
        return await self._service.caller_view(_bearer(ctx))

    async def _list_tools(self, ctx: Any, params: Any) -> t.ListToolsResult:
        return t.ListToolsResult(tools=[
            t.Tool(name="recall", input_schema=_RECALL_SCHEMA,
                   description="Recall facts, past episodes and runs that edited given paths in your repository."),
            t.Tool(name="briefing", input_schema=_BRIEFING_SCHEMA,
                   description="Your run's briefing: collisions, recent runs, facts and episodes."),
        ])

    async def _list_resources(self, ctx: Any, params: Any) -> t.ListResourcesResult:
        return t.ListResourcesResult(resources=[
            t.Resource(uri=BRIEFING_URI, name="briefing", mime_type="text/plain",
                       description="Your run's briefing, the same document the briefing tool returns."),
        ])

    async def _call_tool(self, ctx: Any, params: t.CallToolRequestParams) -> t.CallToolResult:
        view = await self._view(ctx)
        name, arguments = params.name, dict(params.arguments or {})
        call_id = None if ctx.request_id is None else str(ctx.request_id)
        if name not in GATEWAY_TOOLS:
            await self._deny(view, name, arguments)
            return _error("not_permitted", f"tool {name} is not available to harnesses")
        try:
            if name == "recall":
                query = arguments.get("query")
                paths = arguments.get("paths") or []
                limit = arguments.get("limit", 8)
                if not isinstance(query, str) or not isinstance(paths, list):
                    raise InvalidArgument("recall takes {query: string, paths?: [string], limit?: int}")
                answer = await self._service.agent_recall(view, query=query, paths=tuple(paths), limit=limit,
                                                          call_id=call_id)
                return t.CallToolResult(content=[t.TextContent(type="text", text=answer.text)],
                                        structured_content=answer.json)
            refresh = arguments.get("refresh", False)
            if not isinstance(refresh, bool):
                raise InvalidArgument("refresh must be a boolean", field="refresh")
            briefing = await self._service.agent_briefing(view, delivery="tool", refresh=refresh, call_id=call_id)
            return t.CallToolResult(content=[t.TextContent(type="text", text=briefing.text)],
                                    structured_content=briefing.json)
        except NotAttributed as exc:
            self._log.bind(tool=name, code=exc.code).info("gateway call not attributed")
            return _error("not_attributed", str(exc))
        except InvalidArgument as exc:
            return _error("invalid_argument", str(exc))

    async def _read_resource(self, ctx: Any, params: t.ReadResourceRequestParams) -> t.ReadResourceResult:
        if str(params.uri) != BRIEFING_URI:
            raise MCPError(t.INVALID_PARAMS, f"unknown resource {params.uri}")
        view = await self._view(ctx)
        call_id = None if ctx.request_id is None else str(ctx.request_id)
        try:
            briefing = await self._service.agent_briefing(view, delivery="resource", call_id=call_id)
        except NotAttributed as exc:
            self._log.bind(resource="briefing", code=exc.code).info("gateway read not attributed")
            raise MCPError(t.INVALID_REQUEST, f"not_attributed: {exc}") from None
        return t.ReadResourceResult(contents=[
            t.TextResourceContents(uri=BRIEFING_URI, text=briefing.text, mime_type="text/plain")])

    async def _deny(self, view: View, name: str, arguments: dict[str, Any]) -> None:
        """REQ-2: a refused call is logged as the caller's row with outcome denied; nothing goes upstream."""
        caller = f"{view.harness}/{view.run_id}" if view.exposed_run else "unattributed"
        provider = self._service.provider
        server = name.split("__", 1)[0] if "__" in name else (provider if name in contract.TOOLS else "gateway")
        at = iso(self._service.wall_clock())
        await self._service.store.write(lambda db: log_call(
            db, at=at, caller=caller, server=server, tool=name, arguments=arguments, outcome="denied",
            duration_ms=0))
        self._log.bind(caller=caller, server=server, outcome="denied").warning("gateway call refused")


async def serve_gateway(
    service: Any, host: str, port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the gateway on ``host:port`` (0 picks a free port) until cancelled; reports its URL."""
    server = Gateway(service).server()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_mcp_http, server.streamable_http_app(host=host), host, port)
        logger.bind(url=url).info("gateway listening")
        task_status.started(url)


async def serve_mcp_http(
    app: Any, host: str, port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve an MCP streamable-HTTP ASGI app with hypercorn's trio worker; reports ``http://host:port/mcp``."""
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, config, task_status=task_status, mode="asgi")  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(run)
        task_status.started(binds[0] + "/mcp")
