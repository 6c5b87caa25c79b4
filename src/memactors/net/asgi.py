"""The few ASGI chores every small app of the daemon (and its loopback test fakes) repeats.

hypercorn speaks ASGI to the metrics listener, the gateway and the fake model APIs in
``memactors.testing``; each answers the lifespan protocol the same way and reads a JSON request body the
same way. :class:`RequestBodyGuard` stands in front of every app the daemon serves (``net.listen``): the
body's deadline and size cap, and quiet client disconnects, in one place.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

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


App = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


class RequestBodyGuard:
    """ASGI middleware: an HTTP request reaches the app only with its whole body, read in time.

    * **Deadline**: the body must be complete ``deadline`` seconds after its head (a total, so a client
      trickling one byte every few seconds cannot hold a connection); past it the client gets 408.
    * **Size**: a body (declared or sent) over ``max_bytes`` gets 413 without being kept.
    * **Disconnects**: a client that goes away before its body ends is let go quietly: the app never
      sees a half body (the mcp SDK logged a 9-line ``ClientDisconnect`` traceback for each).

    Either refusal closes the connection (its body was not read to the end, so hypercorn cannot reuse
    it), and is reported through ``on_drop(client, reason)`` so the listener can count it. While a
    refusal is sent, what the client still sends is read and discarded: an unread body would fill
    hypercorn's queue to the app and block the connection's tasks.
    """

    def __init__(self, app: App, *, deadline: float, max_bytes: int,
                 on_drop: Callable[[Any, str], None] | None = None) -> None:
        self.app = app
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.on_drop = on_drop

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, 413, "body_too_large")
            return
        body = bytearray()
        with trio.move_on_after(self.deadline) as waited:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client went away: nobody to answer, nothing to log
                body += message.get("body", b"")
                if len(body) > self.max_bytes:
                    await self._refuse(scope, receive, send, 413, "body_too_large")
                    return
                if not message.get("more_body", False):
                    break
        if waited.cancelled_caught:
            await self._refuse(scope, receive, send, 408, "body_deadline")
            return
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: MutableMapping[str, Any], receive: Receive, send: Send, status: int,
                      reason: str) -> None:
        if self.on_drop is not None:
            self.on_drop(scope.get("client"), reason)
        text = {408: b"request body not received in time\n", 413: b"request body too large\n"}[status]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_discard, receive)
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(text)).encode()),
                (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": text})
            nursery.cancel_scope.cancel()


async def _discard(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _content_length(scope: MutableMapping[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
