"""How the daemon reaches a memory provider, and how `provider check` tests one (REQ-4).

The provider is the built-in server in-process or an ``[mcp.<name>]`` upstream over stdio or
streamable HTTP: :func:`provider_target` gives the provider session the way to (re)connect, and
:func:`provider_endpoint` what its errors name. :func:`check_target` runs the conformance suite over a
connection of its own, with the provider's stderr logged and its last lines shown under a failing
check. The service's handlers call these; none of them needs the service.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp
import trio
from loguru import logger
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from ..actors.provider_session import describe_failure
from ..builtin import BuiltinProvider
from ..config import Config, McpServerConfig
from ..conformance import CHECK_NAMES, CheckResult, ConformanceReport, explain_failure, run_conformance
from ..errors import MemactorsError
from ..provider_stderr import StderrTail, log_stderr
from ..store import Store
from ..urls import mask_url

#: How long `provider check` waits, after the check, for a provider's last stderr lines to arrive.
STDERR_DRAIN_SECONDS = 2.0


def provider_target(config: Config, store: Store, builtin: BuiltinProvider | None = None) -> Callable[[], Any]:
    """How to reach the configured provider: the built-in server in-process, or the [mcp.<name>] upstream."""
    upstream = config.provider_upstream
    if upstream is None:
        server = (builtin or BuiltinProvider(store)).server()
        return lambda: server
    return lambda: upstream_target(upstream)


def provider_endpoint(upstream: McpServerConfig | None) -> str:
    """What a connection error names: the stdio command's path, the HTTP upstream's URL (credentials
    masked: the name is shown by status, doctor and logs), or the built-in."""
    if upstream is None:
        return "built-in provider"
    return str(upstream.command) if upstream.command is not None else mask_url(str(upstream.url))


def upstream_target(upstream: McpServerConfig) -> Any:
    if upstream.command is not None:
        env = {**os.environ, **dict(upstream.env)}
        return mcp.StdioServerParameters(command=upstream.command, args=list(upstream.args), env=env)
    return _http_transport(str(upstream.url), dict(upstream.headers))


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with the configured headers (auth). The SDK leaves a client it was handed open,
    so this owns it: one httpx2 client per connection, closed with it. No client timeouts: every call
    runs under its caller's deadline."""
    async with httpx2.AsyncClient(headers=headers, timeout=None) as http, \
            streamable_http_client(url, http_client=http) as streams:
        yield streams



async def check_target(target: Any, *, provider: str, provider_timeout: float,
                       endpoint: str = "") -> ConformanceReport:
    """Connect a separate MCP client to `target` and run the conformance suite over it.

    A provider that cannot be reached (no such command, a refused connection, no initialize answer
    within the connect budget) fails check 1 with the reason; the others are skipped.
    """
    budget = max(provider_timeout * 5, 10.0)
    read_fd, write_fd = os.pipe()  # a checked stdio provider's stderr is logged redacted, never inherited
    errlog = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
    tail = StderrTail()  # and its last lines are shown under a failing check (why it failed)
    if isinstance(target, mcp.StdioServerParameters):
        target = stdio_client(target, errlog=errlog)

    async def attempt() -> ConformanceReport | str:
        try:
            with trio.CancelScope(deadline=trio.current_time() + budget) as scope:
                async with mcp.Client(target, raise_exceptions=False) as client:
                    scope.deadline = math.inf  # connected: the suite bounds each of its own calls
                    return await run_conformance(client, provider=provider, provider_timeout=provider_timeout)
        except (MemactorsError, OSError, RuntimeError, ExceptionGroup) as exc:
            return describe_failure(exc, endpoint or provider)
        return f"no answer to initialize within {budget:g} s"

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log_stderr, read_fd, logger.bind(actor="check_provider", provider=provider), tail)
            try:
                outcome = await attempt()
            except BaseException:  # ok: stop reading the provider's stderr (no drain), then re-raised as is
                nursery.cancel_scope.cancel()
                raise
            # The provider process is gone (its client closed); with our write end closed too the pipe
            # ends, and the last words it wrote (a traceback) are read before the report is made.
            errlog.close()
            nursery.cancel_scope.deadline = trio.current_time() + STDERR_DRAIN_SECONDS
    finally:
        errlog.close()
    if not isinstance(outcome, ConformanceReport):
        checks = [CheckResult(1, CHECK_NAMES[1], "fail", outcome)]
        checks += [CheckResult(n, CHECK_NAMES[n], "skip", "check 1 failed") for n in range(2, 8)]
        outcome = ConformanceReport(provider=provider, checks=tuple(checks))
    return explain_failure(outcome, tail.lines())
