"""Hardened listeners: a connection cap per listener, file descriptors in reserve, hypercorn on top.

Every listener of the daemon (operator websocket, gateway, metrics) accepts through a
:class:`CappedListener`: at most ``cap`` connections are open at once; past the cap the listener stops
accepting and further clients wait in the kernel's backlog, costing the daemon no descriptor. Caps are
computed from the soft ``RLIMIT_NOFILE`` so that ``FD_RESERVE`` descriptors always stay free for the
store, provider subprocesses and logs: a flood of connections can fill a listener, never the process.

An ``accept()`` that fails for lack of descriptors or memory (``EMFILE``, ``ENFILE``, ``ENOBUFS``,
``ENOMEM``) is retried after a short pause with one rate-limited log line, instead of trio's
``serve_listeners`` logging a traceback every 0.1 s.

:func:`serve_asgi` runs an ASGI app on hypercorn's trio worker over such a listener with three clocks,
none of which a slow client can reset by trickling bytes:

* **request head**: a total deadline (``HANDSHAKE_TIMEOUT``, 5 s) from the connection's accept for its
  first request, and from the first byte of every later one. hypercorn has only an idle timer (which
  also bounds the keep-alive gap, so it cannot be both short and long) and a per-read timeout (reset by
  every byte); the deadline is enforced where hypercorn reads the socket (:class:`_DeadlineTCPServer`).
* **request body**: a total deadline (``BODY_TIMEOUT``, 10 s) from the end of the head, and a size cap,
  enforced where the body is read (:class:`memactors.net.asgi.RequestBodyGuard`, in front of every app):
  past either the client gets 408 or 413 and the connection is closed. A client that vanishes mid-body
  ends the request quietly (no application sees a half body, nothing logs a traceback).
* **keep-alive**: an idle connection between two requests is kept ``KEEP_ALIVE_TIMEOUT`` (75 s), longer
  than common clients keep theirs (httpx 5 s, node 5 s, Go 90 s idle but it closes first on a server's
  close), so a client reusing its connection never races the server's close.

Deadlines bound how long one connection holds a slot, not how many slots a peer takes: clients that
trickle (or sit idle on kept-alive connections) can fill every slot again as soon as they are dropped.
So under **pressure** — every slot taken and a client waiting in the kernel's backlog — the listener
makes room itself (:class:`ConnectionTable`): it closes the connection that has been longest in a
request head or body (at least ``SHED_AFTER``, 1 s; a real client sends its whole small request at
once), or, when none is, the one idle longest (as nginx reuses idle keep-alive connections when it runs
out), one per waiting client. A connection whose request is being answered, or that an app trusted
(:func:`trust_connection`: the gateway trusts one that carried a live run token), is never closed (the
gateway bounds how many requests without a token it answers at once, and for how long). A newly started
agent then waits about a second for a slot, not a deadline.
"""

from __future__ import annotations

import errno
import math
import resource
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ..logs import LogThrottle, get_logger

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.trio.tcp_server import TCPServer

__all__ = ["BODY_TIMEOUT", "FD_RESERVE", "HANDSHAKE_TIMEOUT", "KEEP_ALIVE_TIMEOUT", "SHED_AFTER", "CappedListener",
           "ConnectionTable", "connection_cap", "serve_asgi", "trust_connection"]

#: Descriptors no listener may take: SQLite (writer, read pool, WAL), provider pipes, logs, spares.
FD_RESERVE = 128
#: The most connections one listener holds at once when the fd limit allows more.
MAX_CONNECTIONS = 256
#: Seconds a client has, in total, to send one HTTP request head (from its connection's accept for the
#: first request, from the head's first byte for a later one) or to finish a websocket handshake.
HANDSHAKE_TIMEOUT = 5.0
#: Seconds a client has, in total, to send one request body once its head is complete.
BODY_TIMEOUT = 10.0
#: Seconds an idle connection is kept between two requests: longer than clients keep theirs (>= 65 s).
KEEP_ALIVE_TIMEOUT = 75.0
#: The largest request body any listener accepts (the mcp SDK's own default limit).
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Under pressure (every slot taken, a client waiting in the backlog), a connection that has been this
#: long in its request head or body, or idle between requests, may be closed to make room.
SHED_AFTER = 1.0
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


class _CountedStream(trio.abc.HalfCloseableStream):
    """A TCP stream that gives its listener slot back when closed (exactly once)."""

    def __init__(self, stream: trio.SocketStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release
        #: Set once the stream is closed and its slot given back.
        self.gone = trio.Event()
        self.accepted_at = trio.current_time()
        try:
            host, port, *_ = stream.socket.getpeername()
            self._peer = f"{host}:{port}"
            self.address: tuple[str, int] | None = (str(host), int(port))
        except OSError:
            self._peer = "unknown"
            self.address = None

    def abort(self) -> None:
        """Shut the connection down under whoever reads it (they see the end of the stream and close it)."""
        try:
            self._stream.socket.shutdown(2)  # SHUT_RDWR
        except OSError:
            pass

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
            self.gone.set()

    def __repr__(self) -> str:
        return self._peer


class CappedListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """A socket listener that holds at most ``cap`` open connections and survives running out of fds."""

    def __init__(self, inner: trio.SocketListener, cap: int, name: str) -> None:
        self._inner = inner
        self.cap = cap
        self.name = name
        self._slots = trio.Semaphore(cap)
        self._limited = LogThrottle(interval=10.0)
        #: The connections the listener may close to make room under pressure (None: it never does).
        self.table: Any = None
        #: Told of every accepted connection (the operator listener tracks them by tier).
        self.on_accept: Callable[[_CountedStream], None] | None = None

    @property
    def socket(self) -> Any:
        return self._inner.socket

    @property
    def open_connections(self) -> int:
        return self.cap - self._slots.value

    async def accept(self) -> trio.abc.HalfCloseableStream:
        await self._take_slot()
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
                counted = _CountedStream(stream, self._slots.release)
                if self.on_accept is not None:
                    self.on_accept(counted)
                return counted
        except BaseException:  # ok: the slot goes back, the error goes on
            self._slots.release()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def _take_slot(self) -> None:
        if self.table is None or self._slots.value > 0:
            await self._slots.acquire()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._make_room, self.table)
            await self._slots.acquire()
            nursery.cancel_scope.cancel()

    async def _make_room(self, table: Any) -> None:
        """While every slot is taken: each time a client waits in the backlog (the listening socket is
        readable), close the connection the table picks, and wait for it to be gone."""
        while True:
            await trio.lowlevel.wait_readable(self._inner.socket)
            victim = table.victim(trio.current_time())
            if victim is None:  # nothing has been slow or idle for SHED_AFTER yet
                await trio.sleep(SHED_AFTER / 4)
                continue
            phase = victim.shed()
            suppressed = self._limited.allow("shed")
            if suppressed is not None:
                _log.bind(listener=self.name, phase=phase, open_connections=self.open_connections,
                          suppressed=suppressed).info("listener full: closed a connection to make room")
            with trio.move_on_after(1.0):
                await victim.gone.wait()


class ConnectionTable:
    """The connections of one listener, and which to close to make room under pressure.

    Each member answers ``shed_state()``: ``(SLOW, since)`` while in a request head or body since
    ``since``, ``(IDLE, since)`` while idle between requests, None when it must be left alone (it is
    trusted). Connections in a head or body are closed first, the oldest first, once ``SHED_AFTER``
    has passed; idle ones only when none is in a head or body (a token holder's kept-alive connection is
    not closed to make room while trickling clients can be).
    A connection that carried a request with a live run token is trusted (:meth:`trust`): never closed
    to make room, so clients without a token cannot push it out.
    """

    SLOW, IDLE = 0, 1

    def __init__(self) -> None:
        self._members: dict[Any, Any] = {}  # member -> its peer (host, port)
        self._by_peer: dict[Any, Any] = {}

    def add(self, member: Any, peer: Any) -> None:
        self._members[member] = peer
        self._by_peer[peer] = member

    def discard(self, member: Any) -> None:
        peer = self._members.pop(member, None)
        if self._by_peer.get(peer) is member:
            del self._by_peer[peer]

    def trust(self, peer: Any) -> None:
        """Never close the connection from ``peer`` (an ASGI scope's ``client``) to make room."""
        member = self._by_peer.get(tuple(peer) if peer is not None else None)
        if member is not None:
            member.trusted = True

    def victim(self, now: float) -> Any | None:
        states = [(state, m) for m in self._members if (state := m.shed_state()) is not None]
        for phase in (self.SLOW, self.IDLE):
            members = [(since, id(m), m) for (p, since), m in states if p == phase]
            if members:
                # The oldest of the first phase that has any; none yet while it is younger than SHED_AFTER:
                # an idle connection is not closed because a slow one has not been slow for long enough.
                since, _, oldest = min(members)
                return oldest if now - since >= SHED_AFTER else None
        return None


#: Where :func:`serve_asgi` leaves the listener's ConnectionTable in each HTTP request's ASGI scope
#: (``scope["state"]``), for :func:`trust_connection`.
TABLE_STATE_KEY = "memactors_connections"


def trust_connection(scope: Any) -> None:
    """Mark the connection an ASGI request came on as trusted (an app calls it once the request proved
    itself, e.g. with a live run token): it is never closed to make room (see ConnectionTable)."""
    table = (scope.get("state") or {}).get(TABLE_STATE_KEY)
    if table is not None:
        table.trust(scope.get("client"))


async def open_capped_listener(host: str, port: int, *, name: str, cap: int | None = None,
                               backlog: int = 128) -> CappedListener:
    """Bind ``host:port`` (0 picks a free port) and wrap the one listener in a CappedListener."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
    if len(listeners) != 1:
        for extra in listeners[1:]:
            await extra.aclose()
    return CappedListener(listeners[0], cap if cap is not None else connection_cap(), name)


def hypercorn_config() -> HypercornConfig:
    """hypercorn settings for the daemon's HTTP listeners: quiet, a long keep-alive, bounded heads.

    ``read_timeout`` is off: a per-read timeout is reset by every byte (useless against a trickle) and
    would also cut the keep-alive gap short. The head and body deadlines above replace it.

    hypercorn is imported here, not at the top: the CLI imports this module (through the RPC client)
    and must not pay for the HTTP server it never runs."""
    import time
    from wsgiref.handlers import format_date_time

    from hypercorn.config import Config as HypercornConfig

    class _Config(HypercornConfig):
        """hypercorn's settings, with the ``date`` header formatted once a second, not per response (its
        value has a resolution of one second: the same bytes, first among the server's headers)."""

        _date: tuple[int, bytes] = (-1, b"")

        def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
            now = int(time.time())  # ok: the Date header is wall-clock time, not a deadline
            if self._date[0] != now:
                self._date = (now, format_date_time(now).encode("ascii"))
            return [(b"date", self._date[1]), *super().response_headers(protocol)]

    config = _Config()
    config.include_date_header = False  # written by _Config.response_headers
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
    config.read_timeout = None
    config.h11_max_incomplete_size = 16 * 1024
    config.graceful_timeout = 1.0
    return config


def _deadline_tcp_server() -> Callable[..., TCPServer]:
    """hypercorn's trio ``TCPServer`` with a total deadline on every request head (built on first use,
    for the same reason as :func:`hypercorn_config`)."""
    import h11
    from hypercorn.events import Closed, RawData, Updated
    from hypercorn.protocol.h11 import H11Protocol
    from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
    from hypercorn.utils import parse_socket_addr

    class _DeadlineTCPServer(TCPServer):
        """Reads the socket under the deadline of the phase the connection is in.

        hypercorn reports a request head's completion as ``Updated(idle=False)`` and the end of a
        response (the connection idle again) as ``Updated(idle=True)``; between the two the request's
        body is the application's to bound. While idle, the first byte received starts the next head's
        clock; with none, the keep-alive deadline (``KEEP_ALIVE_TIMEOUT`` from the end of the last
        response) runs on the same read. A connection that has served no request yet has its head clock
        running from the accept. HTTP/2 and websocket connections (no h11 request cycle to follow) keep a
        per-read timeout of ``BODY_TIMEOUT`` and hypercorn's idle task for their keep-alive.

        Per request it does less than hypercorn's own server (to cut the gateway's HTTP cost per call):
        the keep-alive of an HTTP/1.1 connection is the read's deadline, not a task started after every
        response and cancelled at the next request; the empty write h11 makes for the end of a sized
        body is not sent (a lock, a shielded scope and a checkpoint for no byte); and the head of a sized
        response goes out with its first body bytes in one send, not two (one segment over loopback, one
        wake-up of the client instead of two). A streamed response (chunked, SSE) has its head sent at once.
        """

        def __init__(self, *args: Any, table: ConnectionTable | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            now = trio.current_time()
            self._head_started: float | None = now  # the first head's clock runs from the accept
            self._request_started = now
            self._idle_since: float | None = None
            self._in_request = False
            self._table = table
            self._reading: trio.CancelScope | None = None
            self._shed = False
            #: Never closed to make room (a request on it carried a live run token).
            self.trusted = False
            #: A sized response's head, written with the response's next bytes (see the class's doc).
            self._held = b""
            #: h11's state for this side at the last write: a head is the write that enters SEND_BODY.
            self._sent_state: Any = None
            #: hypercorn's idle task, started at the accept, is stopped at the first request (h11 only).
            self._idle_task_running = True
            #: Set when the connection is closed and its slot given back.
            self.gone = trio.Event()

        async def run(self) -> None:
            if self._table is not None:
                try:
                    sock = self.stream.socket
                    peer = parse_socket_addr(sock.family, sock.getpeername())
                except OSError:
                    peer = None
                self._table.add(self, peer)
            try:
                await super().run()
            finally:
                if self._table is not None:
                    self._table.discard(self)
                self.gone.set()

        async def protocol_send(self, event: Any) -> None:
            if isinstance(event, Updated):
                self._in_request = not event.idle
                self._head_started = None
                now = trio.current_time()
                self._request_started = now
                self._idle_since = now if event.idle else None
                if self._h11() is not None:  # keep-alive by the read deadline (see _read_deadline)
                    self._sent_state = None
                    if self._reading is not None:  # the read under way began with the request's deadline
                        self._reading.deadline = self._read_deadline()
                    if self._idle_task_running:
                        self._idle_task_running = False
                        await self.idle_task.stop()
                    return
                self._idle_task_running = event.idle
            elif isinstance(event, RawData):
                event = self._coalesced(event)
                if event is None:
                    return
            elif isinstance(event, Closed) and self._held:
                held, self._held = self._held, b""
                await super().protocol_send(RawData(data=held))
            await super().protocol_send(event)

        def _coalesced(self, event: Any) -> Any:
            """The write to make for ``event`` (None: nothing now): a sized response's head is held for
            its first body bytes (or the empty end of its body), everything else goes as it comes."""
            data = self._held + event.data
            self._held = b""
            connection = self._h11()
            if connection is not None:
                state, before = connection.our_state, self._sent_state
                self._sent_state = state
                if state is h11.SEND_BODY and before is not h11.SEND_BODY and b"\r\ncontent-length:" in event.data.lower():
                    self._held = data
                    return None
            return RawData(data=data) if data else None

        def _h11(self) -> Any:
            """The connection's h11 state machine, or None (HTTP/2, a websocket, not started yet)."""
            protocol = getattr(getattr(self, "protocol", None), "protocol", None)
            connection = getattr(protocol, "connection", None)
            if not isinstance(protocol, H11Protocol) or not isinstance(connection, h11.Connection):
                return None
            return connection

        def _read_deadline(self) -> float:
            connection = self._h11()
            if connection is None:
                return trio.current_time() + BODY_TIMEOUT
            if self._in_request or connection.their_state is not h11.IDLE:
                return math.inf  # a body (bounded by RequestBodyGuard) or the app's answer
            if self._head_started is None:  # keep-alive, from the end of the last response
                return math.inf if self._idle_since is None else self._idle_since + KEEP_ALIVE_TIMEOUT
            return self._head_started + HANDSHAKE_TIMEOUT

        def shed_state(self) -> tuple[int, float] | None:
            connection = self._h11()
            if self._shed or self.trusted or connection is None:
                return None
            if self._in_request:
                if connection.their_state is h11.SEND_BODY:
                    return ConnectionTable.SLOW, self._request_started
                return None  # its request is being answered
            if self._head_started is not None:
                return ConnectionTable.SLOW, self._head_started
            if self._idle_since is not None:
                return ConnectionTable.IDLE, self._idle_since
            return None

        def shed(self) -> str:
            """Close this connection to make room (see ConnectionTable); returns the phase it was in."""
            phase = "idle" if self._idle_since is not None and not self._in_request else (
                "body" if self._in_request else "head")
            self._shed = True
            if self._reading is not None:
                self._reading.cancel()
            return phase

        async def _read_data(self) -> None:
            while True:
                try:
                    with trio.move_on_at(self._read_deadline()) as waited:
                        self._reading = waited
                        if self._shed:
                            waited.cancel()
                        data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
                finally:
                    self._reading = None
                if self._shed:
                    break
                if waited.cancelled_caught:
                    if self._head_started is not None:  # else the keep-alive ended: a quiet close
                        _dropped(self.stream, "head")
                    break
                if data and not self._in_request and self._head_started is None:
                    self._head_started = trio.current_time()
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
            await self.protocol.handle(Closed())
            # hypercorn leaves its keep-alive timer running after the peer left, and the connection's
            # task group waits for it: with a long keep-alive, a closed connection would hold its
            # socket and listener slot for up to KEEP_ALIVE_TIMEOUT more.
            await self.idle_task.stop()

    return _DeadlineTCPServer


_slow = LogThrottle(interval=10.0)


def _dropped(stream: Any, phase: str) -> None:
    """One line per 10 s for clients dropped past a deadline (a peer can cause them at will)."""
    suppressed = _slow.allow(phase)
    if suppressed is not None:
        _log.bind(phase=phase, peer=str(stream), suppressed=suppressed).info(
            "dropped a client past its request deadline")


async def serve_asgi(
    app: Any, host: str, port: int, *, name: str, cap: int | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an ASGI app with hypercorn's trio worker on a capped listener until cancelled.

    This is hypercorn's ``worker_serve`` with our listener in place of the plain socket listener it
    builds (hypercorn has no connection cap of its own), our TCP server (head deadlines) in place of
    its own, and the app behind :class:`RequestBodyGuard` (body deadline and size cap, quiet
    disconnects). Reports ``(host, actual_port)``.
    """
    from hypercorn.trio.lifespan import Lifespan
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import wrap_app

    from .asgi import RequestBodyGuard

    config = hypercorn_config()
    table = ConnectionTable()
    guarded = RequestBodyGuard(app, deadline=BODY_TIMEOUT, max_bytes=MAX_BODY_BYTES, on_drop=_dropped_body)

    async def with_table(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope["state"] = {**(scope.get("state") or {}), TABLE_STATE_KEY: table}
        await guarded(scope, receive, send)

    wrapped = wrap_app(with_table, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    listener = await open_capped_listener(host, port, name=name, cap=cap, backlog=config.backlog)
    listener.table = table
    actual_port = listener.socket.getsockname()[1]
    server = _deadline_tcp_server()
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        handler = partial(server, wrapped, config, context, ConnectionState(lifespan_state.copy()),
                          table=listener.table)
        async with trio.open_nursery() as server_nursery:
            await server_nursery.start(trio.serve_listeners, handler, [listener])
            _log.bind(listener=name, host=host, port=actual_port, cap=listener.cap).info("listening")
            task_status.started((host, actual_port))
    raise AssertionError("serve_listeners returned")  # pragma: no cover


def _dropped_body(client: Any, why: str) -> None:
    _dropped(f"{client[0]}:{client[1]}" if client else "unknown", why)
