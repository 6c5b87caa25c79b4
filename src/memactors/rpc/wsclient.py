"""A blocking, one-call MemoryService client on the standard library, for the CLI's read commands.

The operator RPC is JSON over a websocket (rpc/__init__.py has the contract). The trio client (rpc/client.py) is the one
the daemon's tests, the TUI and `runs ingest` use; importing it costs trio, trio-websocket, wsproto,
h11 and loguru — about a quarter of a second before a command can print anything, more than the
whole budget of `memactors memory status` (≤ 400 ms cold). A single request/reply needs
none of that: this module speaks RFC 6455 directly — the upgrade handshake with the bearer token,
one masked text frame out, frames in until the reply — and maps failures to the same gRPC codes
`rpc.connect_rpc` raises, so the CLI's exit codes do not depend on which client ran.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
import urllib.parse
from typing import Any

#: Largest reply accepted (the daemon's MAX_MESSAGE_SIZE).
MAX_MESSAGE = 4 * 1024 * 1024
#: Seconds the connect and the websocket handshake may take, together (as rpc.CONNECT_TIMEOUT).
CONNECT_TIMEOUT = 30.0


class WsRpcError(Exception):
    """An error reply or a failed connection, with its gRPC code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class _Busy(WsRpcError):
    """The daemon answered the handshake 503: every read-tier connection is in use; a retry may get in."""


#: Seconds between two handshakes refused 503 (doubling), within the connect deadline.
BUSY_RETRY = (0.05, 1.0)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 16))
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _send_frame(sock: socket.socket, opcode: int, payload: bytes) -> None:
    header = bytearray([0x80 | opcode])
    n = len(payload)
    if n < 126:
        header.append(0x80 | n)
    elif n < 1 << 16:
        header += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        header += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    sock.sendall(bytes(header) + mask + _mask(payload, mask))


def _mask(payload: bytes, mask: bytes) -> bytes:
    """XOR the payload with the 4-byte mask (as one big integer: fast for large payloads too)."""
    if not payload:
        return payload
    repeated = (mask * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


def _read_message(sock: socket.socket) -> str:
    """The next text message (continuation frames joined); answers pings; raises on close."""
    parts: list[bytes] = []
    size = 0
    while True:
        b0, b1 = _recv_exactly(sock, 2)
        fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", _recv_exactly(sock, 2))[0]
        elif n == 127:
            n = struct.unpack("!Q", _recv_exactly(sock, 8))[0]
        mask = _recv_exactly(sock, 4) if b1 & 0x80 else b""
        size += n
        if size > MAX_MESSAGE:
            raise ConnectionError("reply larger than the RPC's frame limit")
        payload = _recv_exactly(sock, n)
        if mask:
            payload = _mask(payload, mask)
        if opcode == 0x8:
            raise ConnectionError("daemon closed the connection")
        if opcode == 0x9:
            _send_frame(sock, 0xA, payload)
            continue
        if opcode == 0xA:
            continue
        parts.append(payload)
        if fin:
            return b"".join(parts).decode("utf-8")


def call_once(url: str, token: str, method: str, params: dict[str, Any], *, timeout: float = 60.0) -> Any:
    """Call `method` once on the daemon at `url` (``ws://host:port/harness.v1``) with `token`.

    Returns the result; raises WsRpcError with the daemon's code, or ``UNAVAILABLE`` /
    ``UNAUTHENTICATED`` / ``NOT_FOUND`` for a connection that could not be made (as rpc.connect_rpc).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise WsRpcError("INVALID_ARGUMENT", f"operator RPC url must look like ws://host:port/harness.v1 ({url})")
    host, port, path = parts.hostname, parts.port or 80, parts.path or "/"
    token = token.strip()
    if any(not (33 <= ord(c) <= 126) for c in token):
        raise WsRpcError("UNAUTHENTICATED", "operator token contains characters an HTTP header cannot carry")
    # One total deadline for the connect and the handshake together: a peer that accepts and
    # never answers, or answers a byte at a time, ends the attempt in CONNECT_TIMEOUT.
    deadline = time.monotonic() + min(timeout, CONNECT_TIMEOUT)
    pause = BUSY_RETRY[0]
    while True:
        try:
            return _call(url, host, port, path, token, method, params, deadline=deadline, timeout=timeout)
        except _Busy:
            # A read flood fills the read tier: the daemon refused the handshake before anything was sent,
            # so trying again is safe; within the connect deadline, then the 503 is the answer.
            if time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)  # ok: the CLI's one-call client is synchronous, no trio loop to block
            pause = min(pause * 2, BUSY_RETRY[1])


def _call(url: str, host: str, port: int, path: str, token: str, method: str, params: dict[str, Any], *,
          deadline: float, timeout: float) -> Any:
    try:
        sock = socket.create_connection((host, port), timeout=max(min(timeout, deadline - time.monotonic()), 0.001))
    except TimeoutError:
        raise WsRpcError("UNAVAILABLE", f"daemon not reachable at {url} (no answer within "
                                        f"{CONNECT_TIMEOUT:g} s)") from None
    except OSError as exc:
        raise WsRpcError("UNAVAILABLE", f"daemon not reachable at {url} ({type(exc).__name__})") from None
    with sock:
        try:
            return _exchange(sock, url, host, port, path, token, method, params, deadline=deadline,
                             timeout=timeout)
        except TimeoutError:
            raise WsRpcError("UNAVAILABLE", f"daemon at {url} did not answer in time") from None
        except (OSError, ConnectionError, ValueError) as exc:
            raise WsRpcError("UNAVAILABLE", f"daemon at {url} broke off the call ({exc})") from None


def handshake(sock: socket.socket, url: str, host: str, port: int, path: str, token: str, *,
              deadline: float) -> None:
    """The RFC 6455 upgrade with the bearer token on a connected socket, by ``deadline`` (monotonic);
    raises WsRpcError (refused, not found, no answer in time) or ConnectionError."""
    key = base64.b64encode(os.urandom(16)).decode()
    host_header = host if port == 80 else f"{host}:{port}"
    request = (f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n")
    if token:
        request += f"Authorization: Bearer {token}\r\n"
    sock.sendall((request + "\r\n").encode("ascii"))
    head = b""
    while b"\r\n\r\n" not in head:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WsRpcError("UNAVAILABLE", f"no memactors daemon answered the websocket handshake at {url} "
                                            f"within {CONNECT_TIMEOUT:g} s")
        sock.settimeout(left)
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("no handshake answer")
        head += chunk
        if len(head) > 65536:
            raise ConnectionError("handshake answer too long")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    status = int(status_line.split()[1]) if len(status_line.split()) > 1 else 0
    if status in (401, 403):
        raise WsRpcError("UNAUTHENTICATED", f"daemon at {url} refused the operator token (HTTP {status})")
    if status == 404:
        raise WsRpcError("NOT_FOUND", f"no MemoryService at {url} (HTTP 404)")
    if status == 503:
        raise _Busy("UNAVAILABLE", f"daemon at {url} refused the connection (HTTP 503): every read-tier "
                                   "connection is in use")
    if status != 101:
        raise WsRpcError("UNAVAILABLE", f"daemon at {url} refused the connection (HTTP {status})")


def _exchange(sock: socket.socket, url: str, host: str, port: int, path: str, token: str, method: str,
              params: dict[str, Any], *, deadline: float, timeout: float) -> Any:
    handshake(sock, url, host, port, path, token, deadline=deadline)
    sock.settimeout(timeout)  # the handshake is done: the call itself has the caller's timeout per read
    # Anything after the headers is already the start of the first frame; we send first, so there is none.
    _send_frame(sock, 0x1, json.dumps({"id": 1, "method": method, "params": params}).encode())
    reply = json.loads(_read_message(sock))
    try:
        _send_frame(sock, 0x8, struct.pack("!H", 1000))
    except OSError:
        pass
    if "error" in reply:
        error = reply["error"] or {}
        raise WsRpcError(str(error.get("code", "INTERNAL")), str(error.get("message", "")))
    return reply.get("result")
