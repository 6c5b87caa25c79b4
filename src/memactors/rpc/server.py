"""The operator RPC server: the websocket handshake (path, bearer token, origin), frames parsed and
bounded, each method dispatched by the method table under its tier, replies encoded, and the operator
listener's connections capped with a reserve for the control tier."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, cast

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    WebSocketServer,
)

from ..errors import MemactorsError, single_leaf
from ..logs import LogThrottle, get_logger
from ..net.listen import HANDSHAKE_TIMEOUT, SHED_AFTER, open_capped_listener
from .frames import CODES, ENDPOINT_PATH, MAX_IN_FLIGHT, MAX_MESSAGE_SIZE, TIERS, Tier
from .tokens import Tokens

_log = get_logger(component="rpc")


@attrs.frozen
class Method:
    """One MemoryService method: its full name, the tier it needs, and its handler.

    ``handler`` receives the request's params (a dict, empty when absent) and returns a JSON-able
    value; it raises ``MemactorsError`` subclasses to send a specific code. ``params`` names every
    parameter it takes (SPEC-0030 Error Handling Standards: an unknown one is refused by name).
    """

    name: str
    tier: Tier = attrs.field(validator=attrs.validators.in_(TIERS))
    handler: Callable[[dict[str, Any]], Awaitable[Any]]
    #: Every parameter the method takes; any other is refused with INVALID_ARGUMENT naming it, before the
    #: handler runs. None: not checked (a method that declares nothing).
    params: frozenset[str] | None = None


def _bearer(request: WebSocketRequest) -> bytes | None:
    for name, value in request.headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def _origin(request: WebSocketRequest) -> str | None:
    """The handshake's Origin header, lower-cased; None when absent (non-browser clients send none)."""
    for name, value in request.headers:
        if name.lower() == b"origin":
            return value.decode("latin-1").strip().lower()
    return None


def _own_origins(host: str, port: int) -> frozenset[str]:
    """The origins a page served by this daemon itself would send: its own scheme, host and port."""
    hosts = {host.lower()}
    if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::"):
        hosts |= {"127.0.0.1", "localhost", "[::1]"}
    return frozenset(f"{scheme}://{h}:{port}" for h in hosts for scheme in ("http", "ws"))


def _error(req_id: str | int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": req_id, "error": {"code": code, "message": message}}


@attrs.frozen
class _Request:
    id: str | int
    method: str
    params: dict[str, Any]


#: Deepest JSON nesting a request may have (a run record needs about 6); deeper frames are refused with
#: INVALID_ARGUMENT before any handler, schema check or json.dumps could recurse on them.
MAX_DEPTH = 64


def _loggable_id(req_id: Any) -> Any:
    """A request id as a log field: integers as they are, a client's string redacted and cut."""
    if isinstance(req_id, str):
        from ..redact import redact  # the rule set compiles on first use; most ids are integers

        return redact(req_id[:128])[:64]
    return req_id


def _depth_exceeds(doc: Any, limit: int) -> bool:
    """Whether `doc` nests dicts/lists more than `limit` levels (iterative: no recursion of our own)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return False


#: A string request id may be at most this long; it is echoed in the reply and (redacted) in logs.
MAX_ID_CHARS = 128
#: An integer request id must fit in 64 bits (what every JSON client can represent exactly).
_INT_ID_BOUND = 2**63
#: Characters a string id may not hold: C0/C1 controls, DEL, and lone surrogates (which JSON's ``\\ud800``
#: escape can spell but UTF-8, the log sinks and the redactor cannot carry).
_BAD_ID_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _id_problem(req_id: Any) -> str | None:
    """Why a frame's id cannot be used to answer it (then the reply says so with ``id: null``)."""
    if isinstance(req_id, bool) or not isinstance(req_id, str | int):
        return "id must be a string or an integer"
    if isinstance(req_id, int):
        return None if -_INT_ID_BOUND <= req_id < _INT_ID_BOUND else "an integer id must fit in 64 bits"
    if len(req_id) > MAX_ID_CHARS:
        return f"a string id must be at most {MAX_ID_CHARS} characters"
    if _BAD_ID_CHARS.search(req_id):
        return "a string id must be text without control characters or lone surrogates"
    return None


def _parse(frame: str | bytes) -> _Request | dict[str, Any]:
    """Parse a frame into a request, or return the INVALID_ARGUMENT reply it deserves."""
    if isinstance(frame, bytes):
        return _error(None, "INVALID_ARGUMENT", "binary frames are not accepted; send JSON text")
    try:
        doc = json.loads(frame)
    except RecursionError:  # nested deeper than the parser's stack: an answer, not a dropped connection
        return _error(None, "INVALID_ARGUMENT", f"frame nests deeper than {MAX_DEPTH} levels")
    except ValueError:
        return _error(None, "INVALID_ARGUMENT", "frame is not valid JSON")
    if not isinstance(doc, dict):
        return _error(None, "INVALID_ARGUMENT", "frame must be a JSON object")
    req_id = doc.get("id")
    if (problem := _id_problem(req_id)) is not None:
        return _error(None, "INVALID_ARGUMENT", problem)
    if _depth_exceeds(doc, MAX_DEPTH):
        return _error(req_id, "INVALID_ARGUMENT", f"frame nests deeper than {MAX_DEPTH} levels")
    method = doc.get("method")
    if not isinstance(method, str) or not method:
        return _error(req_id, "INVALID_ARGUMENT", "method must be a non-empty string")
    params = doc.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return _error(req_id, "INVALID_ARGUMENT", "params must be a JSON object")
    return _Request(id=cast("str | int", req_id), method=method, params=params)  # _id_problem checked it


async def _dispatch(request: _Request, table: dict[str, Method], tier: Tier) -> dict[str, Any]:
    """Run one request and build its reply; the tier is checked before the handler runs."""
    method = table.get(request.method)
    if method is None:
        return _error(request.id, "UNIMPLEMENTED", "unknown method")  # the client's text is not echoed
    if method.tier == "control" and tier != "control":
        return _error(request.id, "PERMISSION_DENIED", f"{method.name} needs the control tier")
    if method.params is not None and (unknown := sorted(set(request.params) - method.params)):
        return _error(request.id, "INVALID_ARGUMENT", _unknown_params(method, unknown))
    try:
        result = await method.handler(request.params)
    except Exception as raw:
        exc = single_leaf(raw)
        if isinstance(exc, MemactorsError):
            code = exc.code if exc.code in CODES else "INTERNAL"
            return _error(request.id, code, str(exc))
        _log.bind(method=method.name, request_id=_loggable_id(request.id), error_type=type(exc).__name__).error(
            "rpc handler failed"
        )
        return _error(request.id, "INTERNAL", "internal error; see the daemon log")
    return {"id": request.id, "result": result}


def _unknown_params(method: Method, unknown: list[str]) -> str:
    """The refusal of parameters a method does not take: each named (cut, escaped: a client's text),
    then what it does take, so a typo (``limt``) or a wrong method is plain at once."""
    short = method.name.rsplit("/", 1)[-1]
    names = ", ".join(f"params.{_shown_name(n)}" for n in unknown[:5]) + (" …" if len(unknown) > 5 else "")
    takes = ", ".join(sorted(method.params or ())) or "no parameters"
    return f"{short} takes no parameter {names}; it takes: {takes}"


def _shown_name(name: str) -> str:
    """A client's parameter name as an error may show it: at most 64 characters, anything unprintable
    escaped (``repr`` escapes controls and lone surrogates), never the raw text."""
    shown = repr(name[:64])[1:-1]
    return shown + ("…" if len(name) > 64 else "")


def _encode(reply: dict[str, Any]) -> str:
    try:
        return json.dumps(reply, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        _log.bind(request_id=reply.get("id"), error_type=type(exc).__name__).error(
            "rpc result is not JSON-able"
        )
        return json.dumps(_error(reply.get("id"), "INTERNAL", "internal error; see the daemon log"))


def _peer_host(peer: str) -> str:
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


#: Error codes that answer a caller's mistake (or a missing thing), not a daemon fault: logged at INFO
#: with their code in the connection's summary line, never as warnings.
CLIENT_CODES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED",
                          "FAILED_PRECONDITION", "OUT_OF_RANGE", "ALREADY_EXISTS", "UNIMPLEMENTED"})


def peer_text(remote: object) -> str:
    """A peer as ``host:port`` (``[v6]:port``), not a library repr."""
    address, port = getattr(remote, "address", None), getattr(remote, "port", None)
    if address is None or port is None:
        return str(remote)
    host = str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@attrs.define
class _ConnectionStats:
    calls: int = 0
    errors: dict[str, int] = attrs.Factory(dict)
    #: Frames being answered now, and since when none has been (trio time).
    busy: int = 0
    idle_since: float = attrs.Factory(trio.current_time)
    #: When the handshake was accepted (trio time): a connection gets FIRST_CALL_GRACE to make its first call.
    opened: float = attrs.Factory(trio.current_time)

    def fresh(self, now: float) -> bool:
        """A new connection that has not had its first call answered yet, within its grace: never closed
        to make room (a CLI's one call was cut mid-frame by a read flood)."""
        return self.calls == 0 and now - self.opened < FIRST_CALL_GRACE

    def evictable(self, now: float) -> bool:
        """Idle (no call in flight) and not fresh: may be closed to make room for another read client."""
        return self.busy == 0 and not self.fresh(now)


#: Seconds a new read connection has to make its first call before it counts as idle (the handshake's own
#: bound): a client is never cut between its handshake and its first answer.
FIRST_CALL_GRACE = HANDSHAKE_TIMEOUT


def control_reserve(cap: int) -> int:
    """Connections of an operator listener with ``cap`` slots that read-tier clients can never hold."""
    return max(2, cap // 8)


@attrs.define(eq=False)
class _Member:
    stream: Any
    tier: Tier | None = None
    stats: _ConnectionStats | None = None
    evicted: bool = False

    @property
    def gone(self) -> trio.Event:
        gone: trio.Event = self.stream.gone
        return gone

    def shed_state(self) -> tuple[int, float] | None:
        if self.evicted:
            return None
        if self.tier is None:  # still in its handshake (or being refused): bounded, never trusted
            return _SLOW, float(self.stream.accepted_at)
        if self.tier == "read" and self.stats is not None and self.stats.evictable(trio.current_time()):
            return _IDLE, self.stats.idle_since
        return None  # a control connection, or a read one with a call in flight

    def shed(self) -> str:
        phase = "handshake" if self.tier is None else "idle"
        self.evicted = True
        self.stream.abort()
        return phase


_SLOW, _IDLE = 0, 1


class OperatorConnections:
    """The operator listener's connections by tier: no client can lock the control tier out.

    * Established read-tier connections never number more than ``cap - control_reserve(cap)``: a new
      one past that closes the read connection idle longest, or is refused 503 when every read
      connection has a call in flight or is new (``FIRST_CALL_GRACE``: a client's first call is never
      cut between its handshake and its answer). So at least the reserve is left for control.
    * Under pressure (every slot taken, a client waiting in the kernel's backlog) the listener closes a
      connection still in its handshake for ``SHED_AFTER`` (a client without a valid token never gets
      further), else the idle read connection idle longest; never a control connection, never a call
      being answered.
    """

    def __init__(self, cap: int) -> None:
        self.read_cap = cap - control_reserve(cap)
        self._members: dict[tuple[str, int] | None, _Member] = {}

    def accepted(self, stream: Any) -> None:
        self._prune()
        self._members[stream.address] = _Member(stream)

    def _prune(self) -> None:
        for key in [k for k, m in self._members.items() if m.gone.is_set()]:
            del self._members[key]

    def claim(self, remote: object, tier: Tier, stats: _ConnectionStats) -> bool:
        """A handshake from ``remote`` presented a ``tier`` token: whether it may be accepted."""
        self._prune()
        member = self._members.get(_address(remote))
        if tier == "read":
            reads = [m for m in self._members.values() if m.tier == "read" and not m.evicted]
            if len(reads) >= self.read_cap:
                # The read connection idle longest makes room; only when every one has a call in
                # flight is the newcomer refused (503). A client reconnecting in a loop then pushes out
                # its own kind, idle longest first, never a call being answered nor a control client.
                now = trio.current_time()
                idle = [(m.stats.idle_since, id(m), m) for m in reads
                        if m.stats is not None and m.stats.evictable(now)]
                if not idle:
                    return False
                min(idle)[2].shed()
        if member is not None:
            member.tier, member.stats = tier, stats
        return True

    def victim(self, now: float) -> _Member | None:
        states = [(state, m) for m in self._members.values() if not m.gone.is_set()
                  and (state := m.shed_state()) is not None]
        for phase in (_SLOW, _IDLE):
            eligible = [(since, id(m), m) for (p, since), m in states if p == phase and now - since >= SHED_AFTER]
            if eligible:
                return min(eligible)[2]
        return None


def _address(remote: object) -> tuple[str, int] | None:
    """The (host, port) key of a handshake's ``request.remote``. trio-websocket builds an Endpoint only
    for a bare ``trio.SocketStream``; for the listener's counted stream it gives the stream's repr,
    ``host:port``. Without this every established connection stayed "in its handshake" for the table:
    the read-tier cap never counted, and under pressure a control connection could be shed."""
    if isinstance(remote, str):
        host, _, digits = remote.rpartition(":")
        return (host, int(digits)) if host and digits.isdigit() else None
    address, port = getattr(remote, "address", None), getattr(remote, "port", None)
    return None if address is None or port is None else (str(address), int(port))


async def _serve_one(
    ws: WebSocketConnection, frame: str | bytes, table: dict[str, Method], tier: Tier, slots: trio.Semaphore,
    peer: str = "unknown", lines: LogThrottle | None = None, stats: _ConnectionStats | None = None,
) -> None:
    if stats is not None:
        stats.busy += 1
    try:
        try:
            reply = await _answer(frame, table, tier, peer, lines, stats)
        except Exception as raw:  # ok: a frame the checks did not foresee still gets an answer
            # The connection stays open and the client is told; only the error's type is logged.
            _log.bind(peer=peer, tier=tier, error_type=type(single_leaf(raw)).__name__).error("rpc frame failed")
            reply = _error(None, "INTERNAL", "internal error; see the daemon log")
        try:
            await ws.send_message(_encode(reply))
        except ConnectionClosed:
            pass  # the client went away; nobody is left to tell
    finally:
        slots.release()
        if stats is not None:
            stats.busy -= 1
            stats.idle_since = trio.current_time()


async def _answer(frame: str | bytes, table: dict[str, Method], tier: Tier, peer: str,
                  lines: LogThrottle | None, stats: _ConnectionStats | None) -> dict[str, Any]:
    """The reply to one frame: an error for a malformed one, else the method's answer."""
    parsed = _parse(frame)
    if isinstance(parsed, _Request):
        started = trio.current_time()
        reply = await _dispatch(parsed, table, tier)
        if stats is not None:
            stats.calls += 1
            if "error" in reply:
                code = reply["error"]["code"]
                stats.errors[code] = stats.errors.get(code, 0) + 1
        _log.bind(
            # A client-chosen unknown name is not logged: it could be any text.
            method=parsed.method if parsed.method in table else "<unknown>",
            request_id=_loggable_id(parsed.id),
            tier=tier,
            outcome=reply["error"]["code"] if "error" in reply else "ok",
            duration_ms=round((trio.current_time() - started) * 1000, 1),
        ).debug("rpc call")
    else:
        reply = parsed
        suppressed = lines.allow(f"frame {_peer_host(peer)}") if lines is not None else 0
        if suppressed is not None:
            _log.bind(peer=peer, tier=tier, frame_bytes=len(frame), suppressed=suppressed).info(
                "rpc malformed frame")
    return reply


async def _serve_connection(ws: WebSocketConnection, table: dict[str, Method], tier: Tier,
                            peer: str = "unknown", lines: LogThrottle | None = None,
                            stats: _ConnectionStats | None = None) -> None:
    slots = trio.Semaphore(MAX_IN_FLIGHT)
    async with trio.open_nursery() as nursery:
        while True:
            try:
                frame = await ws.get_message()
            except ConnectionClosed:
                break
            await slots.acquire()  # backpressure: stop reading while the connection is saturated
            nursery.start_soon(_serve_one, ws, frame, table, tier, slots, peer, lines, stats)
        # The client is gone, so no reply can be delivered; stop work done on its behalf.
        nursery.cancel_scope.cancel()


async def serve_rpc(
    methods: Sequence[Method],
    host: str,
    port: int,
    tokens: Tokens,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve MemoryService on ``ws://host:port/harness.v1`` until cancelled.

    Reports ``(host, actual_port)`` through ``task_status`` once listening (port 0 picks a free
    one). Raises ``ValueError`` at once for duplicate method names.
    """
    table: dict[str, Method] = {}
    for m in methods:
        if m.name in table:
            raise ValueError(f"duplicate RPC method {m.name!r}")
        table[m.name] = m

    listener = await open_capped_listener(host, port, name="operator")
    connections = OperatorConnections(listener.cap)
    listener.table = connections
    listener.on_accept = connections.accepted
    actual_port = listener.socket.getsockname()[1]
    own_origins = _own_origins(host, actual_port)
    # Lines a peer can cause at will (malformed frames, refused handshakes): one per peer per 10 s.
    peer_lines = LogThrottle(interval=10.0)

    async def on_request(request: WebSocketRequest) -> None:
        peer = peer_text(request.remote)
        try:
            if request.path.split("?", 1)[0] != ENDPOINT_PATH:
                await request.reject(404, body=b"not found: MemoryService is served on /harness.v1\n")
                return
            origin = _origin(request)
            if origin is not None and origin not in own_origins:
                # A browser page on another origin (OWASP ASVS: check Origin on websocket handshakes).
                suppressed = peer_lines.allow(f"origin {_peer_host(peer)}")
                if suppressed is not None:
                    _log.bind(peer=peer, suppressed=suppressed).warning("rpc handshake refused: foreign origin")
                await request.reject(403, body=b"forbidden: cross-origin requests are not accepted\n")
                return
            tier = tokens.tier_for(_bearer(request))
            if tier is None:
                suppressed = peer_lines.allow(f"token {_peer_host(peer)}")
                if suppressed is not None:
                    _log.bind(peer=peer, suppressed=suppressed).warning("rpc handshake refused: no or unknown token")
                await request.reject(401, body=b"unauthenticated: present Authorization: Bearer <token>\n")
                return
            stats = _ConnectionStats()
            if not connections.claim(request.remote, tier, stats):
                suppressed = peer_lines.allow("read tier full")
                if suppressed is not None:
                    _log.bind(peer=peer, read_cap=connections.read_cap, suppressed=suppressed).warning(
                        "rpc handshake refused: every read-tier connection is busy")
                await request.reject(503, body=b"busy: every read-tier connection has a call in flight; retry\n")
                return
            ws = await request.accept()
            _log.bind(peer=peer, tier=tier).debug("rpc connection opened")
            opened = trio.current_time()
            try:
                await _serve_connection(ws, table, tier, peer, peer_lines, stats)
            finally:
                # One INFO line per connection (a CLI call is one connection): its calls and the code of
                # every error answered, so an expected client error shows once, with its code.
                # A connection that made no call (an idle flood) is one line per peer per 10 s, the rest
                # counted (a flood once logged 9,387 lines in 45 s).
                suppressed = peer_lines.allow(f"closed idle {_peer_host(peer)}") if stats.calls == 0 else 0
                if suppressed is not None:
                    line = _log.bind(peer=peer, tier=tier, calls=stats.calls,
                                     duration_ms=round((trio.current_time() - opened) * 1000, 1))
                    if suppressed:
                        line = line.bind(suppressed=suppressed)
                    if stats.errors:
                        line = line.bind(errors=",".join(f"{c}:{n}" for c, n in sorted(stats.errors.items())))
                    line.info("rpc connection closed")
        except ConnectionClosed:
            pass
        except Exception as raw:
            # A bug in one connection must not take the whole listener down.
            _log.bind(peer=peer, error_type=type(single_leaf(raw)).__name__).error("rpc connection failed")

    # trio-websocket 0.12 annotates `listeners` as SocketListener | SSLListener, but hands them to
    # trio.serve_listeners, which takes any trio Listener (its `listeners` property falls back to repr for
    # other kinds): the annotation is narrower than the code, and our CappedListener is a trio Listener,
    # so the ignore stays.
    server = WebSocketServer(
        on_request, [listener],  # type: ignore[list-item]
        max_message_size=MAX_MESSAGE_SIZE, message_queue_size=MAX_IN_FLIGHT,
        # A handshake not finished within seconds is dropped, so half-open clients cannot hold slots.
        connect_timeout=HANDSHAKE_TIMEOUT, disconnect_timeout=HANDSHAKE_TIMEOUT)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        _log.bind(host=host, port=actual_port, methods=len(table), cap=listener.cap).info("rpc listening")
        task_status.started((host, actual_port))
    raise AssertionError("WebSocketServer.run returned")  # pragma: no cover
