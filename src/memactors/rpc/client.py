"""The trio client of the operator RPC: `connect_rpc` opens one websocket, and `RpcClient.call` may be
used from many tasks at once (a reader task matches replies to calls by id)."""

from __future__ import annotations

import itertools
import json
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from ..errors import InvalidArgument, MemactorsError, single_leaf
from ..logs import get_logger
from .frames import MAX_MESSAGE_SIZE, RpcError, encode_frame

_log = get_logger(component="rpc")


class RpcClient:
    """A MemoryService client over one websocket; safe to ``call`` from many tasks at once.

    Build it with ``connect_rpc``. A reader task dispatches replies by id to one-shot channels,
    so a slow call never holds up a fast one.
    """

    def __init__(self, ws: WebSocketConnection, url: str) -> None:
        self._ws = ws
        self._url = url
        self._ids = itertools.count(1)
        self._pending: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._closed_reason: str | None = None

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call ``method`` (full name, e.g. ``harness.v1.MemoryService/Status``) and return its result.

        Raises ``RpcError`` with the daemon's code on an error reply, and ``RpcError("UNAVAILABLE")``
        when the connection is lost before the reply arrives. The caller's cancel scope is the
        deadline; a reply that arrives after cancellation is dropped.
        """
        if self._closed_reason is not None:
            raise RpcError("UNAVAILABLE", self._closed_reason)
        req_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._pending[req_id] = send
        try:
            try:
                frame = encode_frame({"id": req_id, "method": method, "params": params or {}})
            except (TypeError, ValueError, RecursionError) as exc:  # NaN, Infinity, too deep: never sent
                raise RpcError("INVALID_ARGUMENT", f"params cannot be sent as JSON ({type(exc).__name__})") from None
            try:
                await self._ws.send_message(frame)
            except ConnectionClosed:
                raise RpcError("UNAVAILABLE", f"connection to {self._url} closed") from None
            try:
                reply = await receive.receive()
            except trio.EndOfChannel:
                raise RpcError("UNAVAILABLE", self._closed_reason or "connection closed") from None
        finally:
            self._pending.pop(req_id, None)
            send.close()
            receive.close()
        error = reply.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise RpcError("INTERNAL", "malformed error reply from the daemon")
            raise RpcError(str(error.get("code", "UNKNOWN")), str(error.get("message", "")))
        return reply.get("result")

    async def _read_replies(self) -> None:
        try:
            while True:
                try:
                    frame = await self._ws.get_message()
                except ConnectionClosed as exc:
                    if getattr(exc.reason, "code", None) == 1009:  # MESSAGE_TOO_BIG: our frame, not the daemon
                        self._closed_reason = (f"the daemon at {self._url} refused a request larger than its "
                                               f"{MAX_MESSAGE_SIZE} byte frame limit and closed the connection")
                    else:
                        self._closed_reason = f"connection to {self._url} closed ({exc.reason})"
                    return
                try:
                    reply = json.loads(frame)
                except ValueError:
                    continue
                if not isinstance(reply, dict):
                    continue
                req_id = reply.get("id")
                if req_id is None and "error" in reply:
                    # The daemon could not read one of our frames; we cannot tell which call it
                    # belongs to, so it is only worth a log line.
                    _log.bind(code=reply["error"].get("code")).warning("rpc reply without id")
                    continue
                waiter = self._pending.pop(req_id, None) if isinstance(req_id, int) else None
                if waiter is None:
                    continue  # a call that was cancelled meanwhile
                try:
                    waiter.send_nowait(reply)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                    pass
        finally:
            if self._closed_reason is None:
                self._closed_reason = f"connection to {self._url} closed"
            for waiter in self._pending.values():
                waiter.close()
            self._pending.clear()


def _refused(url: str, exc: Exception) -> RpcError:
    """Translate a failed websocket open into the RpcError a CLI can explain."""
    if isinstance(exc, ConnectionRejected):
        status = exc.status_code
        if status in (401, 403):
            return RpcError("UNAUTHENTICATED", f"daemon at {url} refused the operator token (HTTP {status})")
        if status == 404:
            return RpcError("NOT_FOUND", f"no MemoryService at {url} (HTTP 404)")
        return RpcError("UNAVAILABLE", f"daemon at {url} refused the connection (HTTP {status})")
    if isinstance(exc, OSError | HandshakeError):
        return RpcError("UNAVAILABLE", f"daemon not reachable at {url} ({type(exc).__name__})")
    return RpcError("UNAVAILABLE", f"no memactors daemon answered the websocket handshake at {url} "
                                   f"({type(exc).__name__})")


#: Seconds a client has, in total, to connect and finish the websocket handshake (then: UNAVAILABLE).
CONNECT_TIMEOUT = 30.0


class _WatchedStream(trio.abc.Stream):
    """The client's TCP stream, noting when the peer closes it (end of stream, or reset)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.peer_closed = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.peer_closed.set()
            raise
        if not data:
            self.peer_closed.set()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _no_answer(url: str) -> RpcError:
    return RpcError("UNAVAILABLE", f"no memactors daemon answered the websocket handshake at {url} "
                                   f"within {CONNECT_TIMEOUT:g} s")


def _split_url(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise InvalidArgument("operator RPC url must look like ws://host:port/harness.v1", url=url)
    resource = parts.path or "/"
    if parts.query:
        resource += "?" + parts.query
    return parts.hostname, parts.port or 80, resource


@asynccontextmanager
async def connect_rpc(url: str, token: str) -> AsyncIterator[RpcClient]:
    """Open a MemoryService client on ``url`` (``ws://host:port/harness.v1``) with a bearer token.

    Raises ``RpcError("UNAUTHENTICATED")`` when the daemon refuses the token, ``RpcError("NOT_FOUND")``
    for a wrong path, and ``RpcError("UNAVAILABLE", "daemon not reachable at ...")`` when nothing
    answers. Exceptions from the body come out unwrapped, not inside an exception group.
    """
    host, port, resource = _split_url(url)
    token = token.strip()
    if any(not (33 <= ord(c) <= 126) for c in token):
        raise RpcError("UNAUTHENTICATED", "operator token contains characters an HTTP header cannot carry")
    # No token, no header: the daemon then refuses the handshake, which is the answer the caller needs.
    headers = [(b"authorization", b"Bearer " + token.encode("ascii"))] if token else []
    # One total deadline for the TCP connect and the websocket handshake together: a peer that accepts
    # and then closes, or never answers, ends the attempt instead of hanging it.
    deadline = trio.current_time() + CONNECT_TIMEOUT
    with trio.move_on_at(deadline) as connecting:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise _refused(url, exc) from None
    if connecting.cancelled_caught:
        raise _no_answer(url)
    # We own the TCP stream (rather than letting trio-websocket open it) because trio-websocket
    # leaves the socket open when the server rejects the handshake.
    entered = False
    watched = _WatchedStream(stream)
    try:
        async with trio.open_nursery() as nursery:
            host_header = host if port == 80 else f"{host}:{port}"
            ws: WebSocketConnection | None = None
            with trio.move_on_at(deadline) as handshake:
                async with trio.open_nursery() as race:
                    # trio-websocket waits for a handshake answer even after the peer has closed the
                    # connection: a peer that hangs up ends the attempt at once, as the other commands'
                    # client does, not after CONNECT_TIMEOUT (`runs ingest` once took 30 s).
                    race.start_soon(_cancel_when_set, watched.peer_closed, race.cancel_scope)
                    ws = await wrap_client_stream(
                        nursery,
                        # trio-websocket 0.12 annotates this parameter SocketStream | SSLStream, but uses only
                        # the trio Stream methods (its endpoint helper falls back to repr for any other stream):
                        # the annotation is narrower than the code, so the ignore stays.
                        watched,  # type: ignore[arg-type]
                        host_header,
                        resource,
                        extra_headers=headers,
                        max_message_size=MAX_MESSAGE_SIZE,
                    )
                    race.cancel_scope.cancel()
            if handshake.cancelled_caught:
                raise _no_answer(url)
            if ws is None:
                raise RpcError("UNAVAILABLE", f"daemon at {url} broke off the websocket handshake (the "
                                              "connection was closed)")
            entered = True
            client = RpcClient(ws, url)
            nursery.start_soon(client._read_replies)
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + 2
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # ok: unwrapped at the API edge, never swallowed
        leaf = single_leaf(group)
        if leaf is group:
            raise
        if not entered and isinstance(leaf, Exception) and not isinstance(leaf, MemactorsError):
            # Refused, reset, or something at that port that is not the daemon (a handshake wsproto or h11
            # cannot parse): the daemon is unavailable, which the caller explains in one line.
            raise _refused(url, leaf) from None
        raise leaf from None
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
