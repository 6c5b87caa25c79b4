"""The few ASGI chores every small app of the daemon (and its loopback test fakes) repeats.

hypercorn speaks ASGI to the metrics listener and to the fake model APIs in ``memactors.testing``; each
answers the lifespan protocol the same way and reads a JSON request body the same way.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer hypercorn's lifespan messages (nothing to start or stop) until shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_json_body(receive: Receive) -> tuple[bool, Any]:
    """Read a whole request body: ``(False, None)`` when the client went away first, else ``(True,
    value)`` with the parsed JSON, or None for an empty or unparseable body."""
    raw = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False, None
        raw += message.get("body", b"")
        if not message.get("more_body", False):
            break
    try:
        return True, json.loads(raw) if raw else None
    except ValueError:
        return True, None


async def http_request(scope: MutableMapping[str, Any], receive: Receive,
                       send: Send) -> tuple[Any, dict[str, str]] | None:
    """The JSON body and headers of an HTTP request; None when there is nothing to answer (the lifespan
    protocol, served here; another scope type; a client that went away before its body ended)."""
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send)
        return None
    if scope["type"] != "http":
        return None
    connected, body = await read_json_body(receive)
    return (body, header_map(scope)) if connected else None


def header_map(scope: MutableMapping[str, Any]) -> dict[str, str]:
    """The request's headers, names lower-cased (the last of repeated ones wins)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
