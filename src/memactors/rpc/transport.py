"""Operator RPC: MemoryService (ADR-0034) as JSON frames over a websocket.

This module is the transport only; the handlers live with the service. The contract, defined
here in place of the missing ADR (docs/operations.md, "RPC"):

* Endpoint ``ws://<operator listen>/harness.v1``. Any other path is refused with HTTP 404.
* ``Authorization: Bearer <token>`` in the handshake selects the tier, ``read`` or ``control``
  (control may call everything). No or an unknown token: the handshake is refused with HTTP 401 and
  no method runs. Tokens live in ``operator-read.token`` / ``operator-control.token`` (mode 0600) in
  the state directory.
* Text frames: request ``{"id": str|int, "method": "harness.v1.MemoryService/Status", "params": {}}``,
  reply ``{"id", "result"}`` or ``{"id", "error": {"code", "message"}}`` with gRPC code names
  (``OK`` is never sent). A malformed frame gets ``INVALID_ARGUMENT`` with ``id: null`` when the id
  cannot be read or used (a string id longer than 128 characters or holding a control character or a
  lone surrogate, an integer id beyond 64 bits); an unknown method gets ``UNIMPLEMENTED``; a read-tier
  call of a control method gets ``PERMISSION_DENIED`` before its handler runs; a parameter the method
  does not take gets ``INVALID_ARGUMENT`` naming it, also before the handler. Whatever a frame holds,
  it gets an answer and the connection stays open.
* Requests on one connection are served concurrently (at most ``MAX_IN_FLIGHT`` at once; the reader
  stops reading while the limit is reached), so replies may arrive out of order and are matched by id.

A handler's ``MemactorsError`` crosses the wire as its ``.code`` and ``str(exc)``; any other exception
becomes ``INTERNAL`` with a generic message, and only its type is logged, because its arguments may
carry episode text or queries.
"""

from __future__ import annotations

import hmac
import itertools
import json
import os
import re
import secrets
import stat
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, NoReturn, cast

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    WebSocketRequest,
    WebSocketServer,
    wrap_client_stream,
)

from ..errors import ConfigError, InvalidArgument, MemactorsError, single_leaf
from ..logs import get_logger
from ..net.listen import HANDSHAKE_TIMEOUT, SHED_AFTER, RateLimitedLog, open_capped_listener

__all__ = [
    "CODES",
    "ENDPOINT_PATH",
    "MAX_IN_FLIGHT",
    "MAX_MESSAGE_SIZE",
    "Method",
    "RpcClient",
    "RpcError",
    "Tier",
    "Tokens",
    "connect_rpc",
    "encode_frame",
    "ensure_tokens",
    "read_token",
    "serve_rpc",
]

Tier = Literal["read", "control"]
TIERS: tuple[Tier, ...] = ("read", "control")

#: The websocket path MemoryService is served on.
ENDPOINT_PATH = "/harness.v1"
#: Largest frame either side accepts; a bigger one closes the connection (code 1009).
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: Requests one connection may have in flight before the server stops reading from it.
MAX_IN_FLIGHT = 16

#: gRPC code names that may appear in an error reply. ``OK`` is never sent.
CODES = frozenset(
    {
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)

_log = get_logger(component="rpc")


class RpcError(MemactorsError):
    """Raised by ``RpcClient`` when the daemon answers with an error or cannot be reached.

    ``code`` is the gRPC code name the daemon returned (or ``UNAVAILABLE`` / ``UNAUTHENTICATED``
    for a connection that could not be made), so a CLI can map it to an exit status.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------------- tokens


@attrs.frozen(repr=False)
class Tokens:
    """The two operator bearer tokens; ``repr`` hides them so a log line cannot leak one."""

    read: str
    control: str

    def __repr__(self) -> str:
        return "Tokens(read=<hidden>, control=<hidden>)"

    def tier_for(self, presented: bytes | str | None) -> Tier | None:
        """Return the tier a presented token grants, or None for no or an unknown token.

        Both tokens are always compared, in constant time, so timing tells nothing about which
        one (if any) nearly matched.
        """
        if presented is None:
            return None
        given = presented.encode("utf-8", "surrogateescape") if isinstance(presented, str) else presented
        if not given:
            return None
        is_read = hmac.compare_digest(given, self.read.encode())
        is_control = hmac.compare_digest(given, self.control.encode())
        if is_control:
            return "control"
        if is_read:
            return "read"
        return None


def _token_path(state_dir: Path, tier: Tier) -> Path:
    if tier not in TIERS:
        raise ValueError(f"unknown operator tier {tier!r}")
    return Path(state_dir) / f"operator-{tier}.token"


def _read_token_file(path: Path) -> str:
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise ConfigError("operator token file is empty", file=str(path))
    return token


def ensure_tokens(state_dir: Path) -> Tokens:
    """Create the operator token files if missing and return both tokens.

    An existing file is never rewritten (a running CLI or TUI keeps working), only its mode is
    tightened to 0600. New tokens are ``secrets.token_urlsafe(32)``, created with O_EXCL so two
    daemons starting at once cannot overwrite each other. Blocking file I/O: from async code call it
    through ``trio.to_thread.run_sync``.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, str] = {}
    for tier in TIERS:
        path = _token_path(state_dir, tier)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if stat.S_IMODE(path.stat().st_mode) != 0o600:
                os.chmod(path, 0o600)
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
            # umask cannot widen 0o600, but make the mode explicit anyway.
            os.chmod(path, 0o600)
        found[tier] = _read_token_file(path)
    if found["read"] == found["control"]:
        raise ConfigError("operator read and control tokens are identical", state_dir=str(state_dir))
    return Tokens(read=found["read"], control=found["control"])


def read_token(state_dir: Path, tier: Tier) -> str:
    """Return the token of ``tier`` from the state directory (for the CLI and TUI).

    Raises ``ConfigError`` naming the file when it is missing or empty.
    """
    path = _token_path(Path(state_dir), tier)
    try:
        return _read_token_file(path)
    except FileNotFoundError:
        raise ConfigError(
            "no operator token file; has the daemon started with this state directory?", file=str(path)
        ) from None


# --------------------------------------------------------------------------------------------- server


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
    """A request id as a log field: integers as they are, a client's string redacted and cut (issue 9)."""
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
        to make room (a CLI's one call was cut mid-frame by a read flood: issue 45)."""
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
    """The operator listener's connections by tier (issue 34): no client can lock the control tier out.

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
    peer: str = "unknown", lines: RateLimitedLog | None = None, stats: _ConnectionStats | None = None,
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
                  lines: RateLimitedLog | None, stats: _ConnectionStats | None) -> dict[str, Any]:
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
                            peer: str = "unknown", lines: RateLimitedLog | None = None,
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
    peer_lines = RateLimitedLog(interval=10.0)

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
                # counted (issue 45: 9,387 lines in 45 s).
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


# --------------------------------------------------------------------------------------------- client


def encode_frame(doc: Any) -> str:
    """A request as the client sends it: compact JSON, non-ASCII text as itself (a frame's size is then
    its UTF-8 size, which is what `runs ingest` budgets batches by), NaN and Infinity refused.

    A string holding a lone surrogate cannot travel as UTF-8: such a frame falls back to ``\\u``
    escapes, so the daemon receives it and refuses the field by name instead of the client crashing.
    """
    frame = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        frame.encode("utf-8")
    except UnicodeEncodeError:
        frame = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return frame


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
    # and then closes, or never answers, ends the attempt instead of hanging it (issue 34).
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
                    # client does, not after CONNECT_TIMEOUT (issue 45: `runs ingest` took 30 s).
                    race.start_soon(_cancel_when_set, watched.peer_closed, race.cancel_scope)
                    ws = await wrap_client_stream(
                        nursery,
                        watched,  # type: ignore[arg-type]  # any trio Stream works; its annotation names two
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
