"""Serving a loopback fake: hypercorn's trio worker on 127.0.0.1, quiet, for the length of a block."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve


@asynccontextmanager
async def serve_on_loopback(app: Any, port: int = 0) -> AsyncIterator[str]:
    """Serve the ASGI `app` on 127.0.0.1:`port` (0 picks a free one); yields its base URL
    (``http://127.0.0.1:<port>``) and cancels the server, with any slow answer in flight, on exit."""
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, config, task_status=task_status, mode="asgi")

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(run)
        try:
            yield binds[0]
        finally:
            nursery.cancel_scope.cancel()


async def send_json(send: Callable[[dict[str, Any]], Awaitable[None]], status: int, payload: object) -> None:
    """Answer an ASGI request with ``payload`` as JSON: what every loopback fake answers outside a stream."""
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
