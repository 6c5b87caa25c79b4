"""A connection flood against the daemon as a process under `ulimit -n 1024`: it stays up and answers."""

from __future__ import annotations

import socket
import urllib.parse
from pathlib import Path

import httpx2
import pytest
import trio

from fix_daemon import Daemon, start_daemon
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError

SERVICE = "harness.v1.MemoryService"
FLOOD = 1100
HANDSHAKE = 2.0  # the daemon's request-head timeout for this test (5 s in the daemon): held past below


def _port(url: str) -> int:
    return urllib.parse.urlsplit(url).port or 80


def half_open(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that never finish a request: some only a SYN in the backlog, the rest with half
    a request head sent."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    for s in socks:
        try:
            s.send(b"GET /harness.v1 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n")
        except OSError:
            pass
    return socks


async def _canary(daemon: Daemon, stop: trio.Event, answers: list[str], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """An authenticated operator client, connected before the flood, calling Status throughout. If its
    connection is closed under the flood it connects again (counted as "reconnected"): what is asserted
    is that the daemon kept answering an operator all along."""
    started = False
    while not stop.is_set():
        try:
            async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
                if not started:
                    task_status.started()
                    started = True
                while not stop.is_set():
                    with trio.fail_after(10):
                        status = await rpc.call(f"{SERVICE}/Status", {})
                    answers.append(str(status.get("provider", status.get("state", "ok"))))
                    with trio.move_on_after(0.2):
                        await stop.wait()
        except RpcError as exc:
            if exc.code != "UNAVAILABLE" or not started:
                raise
            answers.append("reconnected")
            with trio.move_on_after(0.2):
                await stop.wait()


async def _healthz(daemon: Daemon) -> int:
    base = daemon.info["metrics"].removesuffix("/metrics")
    with trio.fail_after(15):
        async with httpx2.AsyncClient(timeout=10) as http:
            return (await http.get(base + "/healthz")).status_code


async def _gateway_answers(daemon: Daemon) -> int:
    with trio.fail_after(15):
        async with httpx2.AsyncClient(timeout=10) as http:
            response = await http.post(daemon.info["gateway"], json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "canary", "version": "1"}}},
                headers={"accept": "application/json, text/event-stream"})
            return response.status_code


async def _new_rpc_answers(daemon: Daemon) -> bool:
    with trio.fail_after(15):
        async with connect_rpc(daemon.info["operator"], daemon.token("read")) as rpc:
            return bool(await rpc.call(f"{SERVICE}/Status", {}))


@pytest.mark.slow
async def test_a_flood_of_half_open_connections_on_every_listener_leaves_the_daemon_answering(tmp_path: Path) -> None:
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(tmp_path, nofile=1024, handshake=HANDSHAKE))
    floods: list[socket.socket] = []
    try:
        stop = trio.Event()
        answers: list[str] = []
        async with trio.open_nursery() as nursery:
            with trio.fail_after(15):
                await nursery.start(_canary, daemon, stop, answers)
            # 1. The operator listener flooded: metrics and the gateway still answer new clients.
            floods += half_open(_port(daemon.info["operator"]), FLOOD)
            assert await _healthz(daemon) == 200
            assert await _gateway_answers(daemon) == 200
            # 2. The gateway flooded too: metrics still answers.
            floods += half_open(_port(daemon.info["gateway"]), FLOOD)
            assert await _healthz(daemon) == 200
            # 3. Metrics flooded as well; hold every flood past the handshake timeouts.
            floods += half_open(_port(daemon.info["metrics"]), FLOOD)
            await trio.sleep(HANDSHAKE + 3)  # noqa: ASYNC251 -- holding the flood open is the condition under test
            assert daemon.proc.poll() is None
            for s in floods:
                s.close()
            floods.clear()
            # Once the flood is gone, every listener takes new clients again.
            assert await _new_rpc_answers(daemon)
            assert await _healthz(daemon) == 200
            assert await _gateway_answers(daemon) == 200
            stop.set()
        # the canary kept getting answers all along (and was cut off at most a few times)
        assert len([a for a in answers if a != "reconnected"]) > 10 and "reconnected" not in answers, answers
    finally:
        for s in floods:
            s.close()
        code = await trio.to_thread.run_sync(daemon.stop)
    log = daemon.log_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log
    assert len(log.splitlines()) < 200, log[-3000:]
