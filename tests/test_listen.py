"""Hardened listeners: the connection cap, head and body timeouts, and rate-limited lines."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import trio

from memactors._asgi import serve_lifespan
from memactors._listen import BODY_TIMEOUT, FD_RESERVE, HANDSHAKE_TIMEOUT, RateLimitedLog, serve_asgi
from support import within


async def _echo_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A tiny ASGI app that reads the whole request body, then answers with its size."""
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send)
        return
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return  # hypercorn gave up on the client (e.g. its body stalled)
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _get(port: int) -> bytes:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(4096):
            data += chunk
        return data


async def _closed_by_server(stream: trio.SocketStream) -> bytes:
    """Read until the server closes the connection; return what it sent."""
    data = b""
    while chunk := await stream.receive_some(4096):
        data += chunk
    return data


async def test_a_listener_holds_at_most_its_cap_and_takes_the_next_client_when_one_leaves(
        nursery: trio.Nursery) -> None:
    _, port = await nursery.start(lambda task_status: serve_asgi(
        _echo_body, "127.0.0.1", 0, name="test", cap=2, task_status=task_status))
    idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
    answered: list[bytes] = []

    async def third() -> None:
        answered.append(await _get(port))

    nursery.start_soon(third)
    with trio.move_on_after(1.0):  # both slots are taken: the third client waits in the backlog
        while not answered:  # noqa: ASYNC110 -- asserting that nothing happens for a while
            await trio.sleep(0.05)
    assert answered == []
    await idle[0].aclose()
    with trio.fail_after(30):
        while not answered:  # noqa: ASYNC110 -- waiting for the freed slot to be used
            await trio.sleep(0.05)
    assert answered[0].startswith(b"HTTP/1.1 200")
    await idle[1].aclose()


async def test_a_silent_connection_and_a_stalled_body_are_dropped(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock) -> None:
    """A client that never sends its request head is closed within the head timeout (5 s); one whose
    body stalls within the body timeout (10 s): on trio time (`within`), so no real seconds pass."""
    _, port = await nursery.start(lambda task_status: serve_asgi(
        _echo_body, "127.0.0.1", 0, name="test", cap=8, task_status=task_status))
    async with await trio.open_tcp_stream("127.0.0.1", port) as silent, \
            await trio.open_tcp_stream("127.0.0.1", port) as stalled:
        await stalled.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        assert (await within(trio_clock, HANDSHAKE_TIMEOUT, lambda: _closed_by_server(silent)))[0] == b""
        assert b"200" not in (await within(trio_clock, BODY_TIMEOUT, lambda: _closed_by_server(stalled)))[0]
    assert (await _get(port)).startswith(b"HTTP/1.1 200")  # the listener itself is fine


@pytest.mark.parametrize("nofile, cap", [(1024, 256), (300, 57), (100, 8)])
def test_the_cap_leaves_descriptors_in_reserve_for_the_store(nofile: int, cap: int) -> None:
    """Each of three listeners gets a third of what is left after FD_RESERVE, at most 256, at least 8."""
    script = (f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}));"
              "from memactors._listen import connection_cap; print(connection_cap())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout) == cap
    if nofile >= 3 * 8 + FD_RESERVE:
        assert 3 * cap + FD_RESERVE <= nofile


async def test_a_rate_limited_line_is_written_once_per_interval_with_the_suppressed_count(
        autojump_clock: trio.abc.Clock) -> None:
    lines = RateLimitedLog(interval=10.0)
    written = [lines.allow("peer-a") for _ in range(10_000)]
    assert written[0] == 0 and written[1:] == [None] * 9_999
    assert lines.allow("peer-b") == 0  # another peer has its own budget
    await trio.sleep(10)
    assert lines.allow("peer-a") == 9_999  # the next line says how many were folded into it
