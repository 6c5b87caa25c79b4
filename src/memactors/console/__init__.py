"""The web console: a local, server-rendered browser surface over the operator RPC's methods.

Served by the daemon on its own loopback listener (``[console] listen``, only when ``[console] enabled``)
with hypercorn's trio worker, like ``/metrics`` and the gateway (``net.listen.serve_asgi``). Pages are
Jinja templates shipped in this package (``templates/``) with one stylesheet and one small script for
live logs (``static/``): no build step, nothing fetched at run time, everything but live logs works
with JavaScript off. What it checks and how it reaches memory: ``console.app``; sessions: ``console.sessions``;
the health page's charts: ``console.charts``. docs/operations.md, "Web console".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import trio

from ..logs import get_logger
from ..net.listen import connection_cap, serve_asgi
from .app import ConsoleApp

__all__ = ["ConsoleApp", "serve_console"]

_log = get_logger(component="console")
#: Connections the console holds at once: one operator's browser opens a handful.
MAX_CONNECTIONS = 32


async def serve_console(
    methods: Iterable[Any], tokens: Any, registry: Any, host: str, port: int, *,
    harnesses: Callable[[], list[str]], token_dir: str = "",
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the console over the operator ``methods`` (``rpc.methods.operator_methods``) and ``tokens``
    on ``host:port`` until cancelled; reports ``(host, actual_port)``. Samples ``registry`` (the daemon's
    metrics) for the health page's charts meanwhile."""
    app = ConsoleApp(methods, tokens, registry=registry, harnesses=harnesses, token_dir=token_dir)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_asgi, app, host, port, name="console",
                                          cap=connection_cap(per_listener=MAX_CONNECTIONS)))
        nursery.start_soon(app.sampler.run)
        _log.bind(host=bound[0], port=bound[1]).info("console listening")
        task_status.started(bound)
