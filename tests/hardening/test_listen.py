"""Hardened listeners: the connection cap, head and body timeouts, and rate-limited lines."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import trio

from memactors.logs import LogThrottle
from memactors.net.asgi import serve_lifespan
from memactors.net.listen import (
    BODY_TIMEOUT,
    FD_RESERVE,
    HANDSHAKE_TIMEOUT,
    KEEP_ALIVE_TIMEOUT,
    MAX_BODY_BYTES,
    SHED_AFTER,
    serve_asgi,
    trust_connection,
)
from support import within

CALLS: list[int] = []
#: A request to /hold/N is answered only once HOLD[N] is set: a connection whose request is being answered.
HOLD: dict[str, trio.Event] = {}


async def _echo_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A tiny ASGI app that reads the whole request body, then answers with its size."""
    if scope["type"] == "lifespan":
        await serve_lifespan(receive, send)
        return
    CALLS.append(1)
    if scope["path"].startswith("/hold/"):
        await HOLD[scope["path"]].wait()
    if scope["path"] == "/trusted":  # as the gateway does for a request with a live run token
        trust_connection(scope)
    if scope["path"].startswith("/stream/"):  # a streamed answer (no length): its head and first event now
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
        await HOLD[scope["path"]].wait()
        await send({"type": "http.response.body", "body": b"data: last\n\n"})
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


async def _trickled(stream: trio.SocketStream, data: bytes, gap: float) -> bytes:
    """Send `data` one byte every `gap` seconds until the server closes the connection; what it sent."""
    async with trio.open_nursery() as inner:
        async def drip() -> None:
            for byte in data:
                await stream.send_all(bytes([byte]))
                await trio.sleep(gap)
        inner.start_soon(drip)
        answer = await _closed_by_server(stream)
        inner.cancel_scope.cancel()
    return answer


async def test_a_listener_holds_at_most_its_cap_and_takes_the_next_client_when_one_leaves(
        nursery: trio.Nursery) -> None:
    """Two requests being answered (never closed to make room) hold both slots: a third client waits in
    the backlog until one of them has its answer and leaves."""
    _, port = await nursery.start(lambda task_status: serve_asgi(
        _echo_body, "127.0.0.1", 0, name="test", cap=2, task_status=task_status))
    busy = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
    for n, stream in enumerate(busy):
        HOLD[f"/hold/{n}"] = trio.Event()
        await stream.send_all(b"GET /hold/%d HTTP/1.1\r\nHost: x\r\n\r\n" % n)
    answered: list[bytes] = []

    async def third() -> None:
        answered.append(await _get(port))

    nursery.start_soon(third)
    with trio.move_on_after(3 * SHED_AFTER):  # both slots are taken: the third client waits in the backlog
        while not answered:  # noqa: ASYNC110 -- asserting that nothing happens for a while
            await trio.sleep(0.05)
    assert answered == []
    HOLD["/hold/0"].set()
    assert (await _answer(busy[0])).startswith(b"HTTP/1.1 200")
    await busy[0].aclose()
    with trio.fail_after(30):
        while not answered:  # noqa: ASYNC110 -- waiting for the freed slot to be used
            await trio.sleep(0.05)
    assert answered[0].startswith(b"HTTP/1.1 200")
    HOLD["/hold/1"].set()
    await busy[1].aclose()


@pytest.mark.parametrize("hog", ["slow body", "silent", "idle keep-alive"])
async def test_when_full_the_listener_closes_the_oldest_slow_or_idle_connection_for_a_waiting_client(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock, hog: str) -> None:
    """Clients that trickle, say nothing or sit idle on kept-alive connections could hold every slot
    again as soon as a deadline drops them; with a client waiting, the listener makes room itself."""
    port = await _serve(nursery, cap=2)
    hogs = []
    for _ in range(2):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if hog == "slow body":
            await stream.send_all(POST % 1000 + b"x")
        elif hog == "idle keep-alive":
            await stream.send_all(POST % 2 + b"ok")
            assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
        hogs.append(stream)
        await trio.sleep(0.1)  # noqa: ASYNC251 -- the first is the older
    answer, waited = await within(trio_clock, SHED_AFTER + 1, lambda: _get(port))
    assert answer.startswith(b"HTTP/1.1 200")
    assert waited < SHED_AFTER + 1  # not a deadline: 5 s head, 10 s body, 75 s keep-alive
    first = await _closed_by_server(hogs[0])
    assert b"200" not in first  # the oldest was closed (a slow body gets no answer)
    for stream in hogs:
        await stream.aclose()


@pytest.mark.parametrize("older", ["trusted idle", "idle"])
async def test_making_room_spares_trusted_connections_and_idle_ones_while_one_trickles(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock, older: str) -> None:
    """The older connection is idle (trusted: it carried a run token; or not), the younger one trickles
    its body: the trickling one is closed for the waiting client either way."""
    port = await _serve(nursery, cap=2)
    kept = await trio.open_tcp_stream("127.0.0.1", port)
    path = b"/trusted" if older == "trusted idle" else b"/"
    await kept.send_all(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok" % path)
    assert (await _answer(kept)).startswith(b"HTTP/1.1 200")
    await trio.sleep(0.2)  # noqa: ASYNC251 -- the idle one is the older
    slow = await trio.open_tcp_stream("127.0.0.1", port)
    await slow.send_all(POST % 1000 + b"x")
    answer, _ = await within(trio_clock, SHED_AFTER + 1, lambda: _get(port))
    assert answer.startswith(b"HTTP/1.1 200")
    assert await _closed_by_server(slow) == b""
    await kept.send_all(POST % 2 + b"ok")  # the kept-alive connection still serves
    assert (await _answer(kept)).startswith(b"HTTP/1.1 200")
    await kept.aclose()
    await slow.aclose()


async def test_an_idle_connection_is_not_closed_for_room_while_a_trickling_one_is_younger_than_the_shedding_age(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock) -> None:
    """The idle connection has been idle past SHED_AFTER, the trickling one has just begun: the waiting
    client waits for the trickling one to come of age and takes its place; the idle one still serves."""
    port = await _serve(nursery, cap=2)
    kept = await trio.open_tcp_stream("127.0.0.1", port)
    await kept.send_all(POST % 2 + b"ok")
    assert (await _answer(kept)).startswith(b"HTTP/1.1 200")
    await trio.testing.wait_all_tasks_blocked()  # the server has seen its answer out: it is idle
    trio_clock.jump(2 * SHED_AFTER)
    slow = await trio.open_tcp_stream("127.0.0.1", port)
    await slow.send_all(POST % 1000 + b"x")
    await trio.testing.wait_all_tasks_blocked()  # the server has read its head: it is in a body
    answer, waited = await within(trio_clock, SHED_AFTER + 1, lambda: _get(port))
    assert answer.startswith(b"HTTP/1.1 200")
    assert waited >= SHED_AFTER
    assert await _closed_by_server(slow) == b""
    await kept.send_all(POST % 2 + b"ok")
    assert (await _answer(kept)).startswith(b"HTTP/1.1 200")
    await kept.aclose()
    await slow.aclose()


async def test_a_trusted_idle_connection_is_never_closed_to_make_room(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock) -> None:
    port = await _serve(nursery, cap=2)
    trusted = await trio.open_tcp_stream("127.0.0.1", port)
    await trusted.send_all(b"POST /trusted HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
    assert (await _answer(trusted)).startswith(b"HTTP/1.1 200")
    await trio.sleep(0.2)  # noqa: ASYNC251 -- the trusted one is the older
    untrusted = await trio.open_tcp_stream("127.0.0.1", port)
    await untrusted.send_all(POST % 2 + b"ok")
    assert (await _answer(untrusted)).startswith(b"HTTP/1.1 200")
    answer, _ = await within(trio_clock, SHED_AFTER + 1, lambda: _get(port))
    assert answer.startswith(b"HTTP/1.1 200")
    assert await _closed_by_server(untrusted) == b""
    await trusted.send_all(POST % 2 + b"ok")
    assert (await _answer(trusted)).startswith(b"HTTP/1.1 200")
    await trusted.aclose()
    await untrusted.aclose()


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


# -- total deadlines a trickle cannot reset, a keep-alive longer than clients' --

POST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"


async def _answer(stream: trio.SocketStream) -> bytes:
    """Read one whole answer (head and Content-Length body) without waiting for the connection to close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += await stream.receive_some(4096)
    return head + b"\r\n\r\n" + body


async def _serve(nursery: trio.Nursery, cap: int = 8) -> int:
    _, port = await nursery.start(lambda task_status: serve_asgi(
        _echo_body, "127.0.0.1", 0, name="test", cap=cap, task_status=task_status))
    return int(port)


async def test_a_body_trickled_one_byte_every_four_seconds_gets_408_at_the_total_deadline(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock) -> None:
    """Each byte used to reset a per-read timeout, so the trickle was never dropped."""
    port = await _serve(nursery)
    CALLS.clear()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(POST % 1000)

        answer, waited = await within(trio_clock, BODY_TIMEOUT, lambda: _trickled(stream, b"x" * 1000, 4))
    assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower()
    assert BODY_TIMEOUT <= waited < BODY_TIMEOUT + 4
    assert CALLS == []  # the app never saw the half body


async def test_a_kept_alive_connection_outlives_client_pools_and_its_next_head_still_has_a_deadline(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock) -> None:
    port = await _serve(nursery)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(POST % 2 + b"ok")
        assert (await _answer(stream)).startswith(b"HTTP/1.1 200")

        async def after(seconds: float) -> bytes:
            await trio.sleep(seconds)
            await stream.send_all(POST % 2 + b"ok")
            return await _answer(stream)

        # 60 s idle (clients' pools expire after 5 s to 60 s), then the same connection serves again.
        assert (await within(trio_clock, KEEP_ALIVE_TIMEOUT, lambda: after(60)))[0].startswith(b"HTTP/1.1 200")
        # The next head, trickled a byte a second after a long idle gap, is dropped 5 s after its first byte.

        async def trickled_head() -> bytes:
            await trio.sleep(30)
            return await _trickled(stream, b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 200, 1)

        answer, waited = await within(trio_clock, KEEP_ALIVE_TIMEOUT, trickled_head)
        assert b"200" not in answer
        assert 30 + HANDSHAKE_TIMEOUT <= waited < 30 + HANDSHAKE_TIMEOUT + 1.5
    async with await trio.open_tcp_stream("127.0.0.1", port) as idle:
        await idle.send_all(POST % 2 + b"ok")
        assert (await _answer(idle)).startswith(b"HTTP/1.1 200")
        # An idle connection is closed at the keep-alive timeout, not before.
        answer, waited = await within(trio_clock, KEEP_ALIVE_TIMEOUT, lambda: _closed_by_server(idle))
        assert answer == b"" and KEEP_ALIVE_TIMEOUT - 0.5 <= waited < KEEP_ALIVE_TIMEOUT + 0.5


async def test_a_client_leaving_a_kept_alive_connection_frees_its_slot_at_once(
        nursery: trio.Nursery, trio_clock: trio.testing.MockClock) -> None:
    """hypercorn's keep-alive timer outlived the peer: with a 75 s keep-alive, a slot stayed taken 75 s."""
    port = await _serve(nursery, cap=1)
    first = await trio.open_tcp_stream("127.0.0.1", port)
    await first.send_all(POST % 2 + b"ok")
    assert (await _answer(first)).startswith(b"HTTP/1.1 200")
    await first.aclose()
    answer, _ = await within(trio_clock, 1.0, lambda: _get(port))
    assert answer.startswith(b"HTTP/1.1 200")


async def test_an_oversized_body_gets_413_declared_or_sent_and_a_vanished_client_reaches_no_app(
        nursery: trio.Nursery) -> None:
    port = await _serve(nursery)
    CALLS.clear()
    async with await trio.open_tcp_stream("127.0.0.1", port) as declared:
        await declared.send_all(POST % (MAX_BODY_BYTES + 1))
        assert (await _closed_by_server(declared)).startswith(b"HTTP/1.1 413")
    async with await trio.open_tcp_stream("127.0.0.1", port) as chunked:
        await chunked.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"z" * 65536)
        try:
            for _ in range(MAX_BODY_BYTES // 65536 + 8):
                await chunked.send_all(chunk)
        except trio.BrokenResourceError:
            pass  # the server answered and closed while we were still sending
        try:
            answer = await _closed_by_server(chunked)
        except trio.BrokenResourceError:
            answer = b"reset"  # closing with our unread bytes in its buffer, the kernel may send RST first
        assert answer.startswith(b"HTTP/1.1 413") or answer == b"reset"
    async with await trio.open_tcp_stream("127.0.0.1", port) as vanishing:
        await vanishing.send_all(POST % 100 + b"half")
    assert (await _get(port)).startswith(b"HTTP/1.1 200")
    assert CALLS == [1]  # only the last, whole request reached the app


@pytest.mark.parametrize("nofile, cap", [(1024, 256), (300, 57), (100, 8)])
def test_the_cap_leaves_descriptors_in_reserve_for_the_store(nofile: int, cap: int) -> None:
    """Each of three listeners gets a third of what is left after FD_RESERVE, at most 256, at least 8."""
    script = (f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}));"
              "from memactors.net.listen import connection_cap; print(connection_cap())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout) == cap
    if nofile >= 3 * 8 + FD_RESERVE:
        assert 3 * cap + FD_RESERVE <= nofile


async def test_a_rate_limited_line_is_written_once_per_interval_with_the_suppressed_count(
        autojump_clock: trio.abc.Clock) -> None:
    lines = LogThrottle(interval=10.0)
    written = [lines.allow("peer-a") for _ in range(10_000)]
    assert written[0] == 0 and written[1:] == [None] * 9_999
    assert lines.allow("peer-b") == 0  # another peer has its own budget
    await trio.sleep(10)
    assert lines.allow("peer-a") == 9_999  # the next line says how many were folded into it


async def test_a_streamed_answer_reaches_the_client_before_it_ends_and_a_sized_one_arrives_whole(
        nursery: trio.Nursery) -> None:
    """The listener writes a sized answer's head with its body in one send; a streamed answer (no length:
    an event stream) must still reach the client event by event, head first, while the app holds it open."""
    port = await _serve(nursery)
    HOLD["/stream/1"] = trio.Event()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /stream/1 HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"data: first" not in data:
            chunk = await stream.receive_some(4096)
            assert chunk, data
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in data.lower()
        assert b"data: last" not in data
        HOLD["/stream/1"].set()
        while not data.endswith(b"0\r\n\r\n"):
            data += await stream.receive_some(4096)
        assert b"data: last" in data
        # The same connection then serves a sized answer, whole: head, length and body.
        await stream.send_all(POST % 2 + b"ok")
        answer = await _answer(stream)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n2")
