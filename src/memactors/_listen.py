"""Hardened listeners: a connection cap per listener, file descriptors in reserve, hypercorn on top.

Every listener of the daemon (operator websocket, gateway, metrics) accepts through a
:class:`CappedListener`: at most ``cap`` connections are open at once; past the cap the listener stops
accepting and further clients wait in the kernel's backlog, costing the daemon no descriptor. Caps are
computed from the soft ``RLIMIT_NOFILE`` so that ``FD_RESERVE`` descriptors always stay free for the
store, provider subprocesses and logs: a flood of connections can fill a listener, never the process.

An ``accept()`` that fails for lack of descriptors or memory (``EMFILE``, ``ENFILE``, ``ENOBUFS``,
``ENOMEM``) is retried after a short pause with one rate-limited log line, instead of trio's
``serve_listeners`` logging a traceback every 0.1 s.

:func:`serve_asgi` runs an ASGI app on hypercorn's trio worker over such a listener, with short
timeouts: a connection that sends no complete request head within ``keep_alive_timeout`` is closed, and
a request body that stalls for ``read_timeout`` is dropped.
"""

from __future__ import annotations

import errno
import resource
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from .logs import LogThrottle, get_logger

__all__ = ["FD_RESERVE", "CappedListener", "RateLimitedLog", "connection_cap", "serve_asgi"]

#: Descriptors no listener may take: SQLite (writer, read pool, WAL), provider pipes, logs, spares.
FD_RESERVE = 128
#: The most connections one listener holds at once when the fd limit allows more.
MAX_CONNECTIONS = 256
#: Seconds a client has to finish its HTTP request head (hypercorn's idle timer) or websocket handshake.
HANDSHAKE_TIMEOUT = 5.0
#: Seconds a request body may stall between two reads.
BODY_TIMEOUT = 10.0
#: How many listeners share the descriptors above the reserve.
LISTENERS = 3

_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

_log = get_logger(component="listen")


def connection_cap(listeners: int = LISTENERS, per_listener: int = MAX_CONNECTIONS) -> int:
    """Connections one listener may hold: its share of the soft fd limit above FD_RESERVE, at most
    ``per_listener``, at least 8."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return per_listener
    return max(8, min(per_listener, (soft - FD_RESERVE) // listeners))


#: One line per key per interval with the count folded in: the shared throttle, under the name the
#: listeners have always used.
RateLimitedLog = LogThrottle


class _CountedStream(trio.abc.HalfCloseableStream):
    """A TCP stream that gives its listener slot back when closed (exactly once)."""

    def __init__(self, stream: trio.SocketStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release
        try:
            host, port, *_ = stream.socket.getpeername()
            self._peer = f"{host}:{port}"
        except OSError:
            self._peer = "unknown"

    @property
    def socket(self) -> Any:
        return self._stream.socket

    def setsockopt(self, *args: Any) -> None:
        self._stream.setsockopt(*args)

    def getsockopt(self, *args: Any) -> Any:
        return self._stream.getsockopt(*args)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()

    def __repr__(self) -> str:
        return self._peer


class CappedListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """A socket listener that holds at most ``cap`` open connections and survives running out of fds."""

    def __init__(self, inner: trio.SocketListener, cap: int, name: str) -> None:
        self._inner = inner
        self.cap = cap
        self.name = name
        self._slots = trio.Semaphore(cap)
        self._limited = RateLimitedLog(interval=10.0)

    @property
    def socket(self) -> Any:
        return self._inner.socket

    @property
    def open_connections(self) -> int:
        return self.cap - self._slots.value

    async def accept(self) -> trio.abc.HalfCloseableStream:
        await self._slots.acquire()
        try:
            pause = 0.05
            while True:
                try:
                    stream = await self._inner.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    suppressed = self._limited.allow("accept")
                    if suppressed is not None:
                        _log.bind(listener=self.name, errno=errno.errorcode.get(exc.errno or 0, "?"),
                                  open_connections=self.open_connections, suppressed=suppressed).warning(
                            "listener out of descriptors; pausing accept")
                    await trio.sleep(pause)
                    pause = min(pause * 2, 1.0)
                    continue
                return _CountedStream(stream, self._slots.release)
        except BaseException:  # ok: the slot goes back, the error goes on
            self._slots.release()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


async def open_capped_listener(host: str, port: int, *, name: str, cap: int | None = None,
                               backlog: int = 128) -> CappedListener:
    """Bind ``host:port`` (0 picks a free port) and wrap the one listener in a CappedListener."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
    if len(listeners) != 1:
        for extra in listeners[1:]:
            await extra.aclose()
    return CappedListener(listeners[0], cap if cap is not None else connection_cap(), name)


def hypercorn_config() -> Any:
    """hypercorn settings for the daemon's HTTP listeners: quiet, short timeouts, bounded heads.

    hypercorn is imported here, not at the top: the CLI imports this module (through the RPC client)
    and must not pay for the HTTP server it never runs."""
    from hypercorn.config import Config as HypercornConfig

    config = HypercornConfig()
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = HANDSHAKE_TIMEOUT
    config.read_timeout = int(BODY_TIMEOUT)
    config.h11_max_incomplete_size = 16 * 1024
    config.graceful_timeout = 1.0
    return config


async def serve_asgi(
    app: Any, host: str, port: int, *, name: str, cap: int | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an ASGI app with hypercorn's trio worker on a capped listener until cancelled.

    This is hypercorn's ``worker_serve`` with our listener in place of the plain socket listener it
    builds (hypercorn has no connection cap of its own). Reports ``(host, actual_port)``.
    """
    from hypercorn.trio.lifespan import Lifespan
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import wrap_app

    config = hypercorn_config()
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    listener = await open_capped_listener(host, port, name=name, cap=cap, backlog=config.backlog)
    actual_port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        handler = partial(TCPServer, wrapped, config, context, ConnectionState(lifespan_state.copy()))
        async with trio.open_nursery() as server_nursery:
            await server_nursery.start(trio.serve_listeners, handler, [listener])
            _log.bind(listener=name, host=host, port=actual_port, cap=listener.cap).info("listening")
            task_status.started((host, actual_port))
    raise AssertionError("serve_listeners returned")  # pragma: no cover

