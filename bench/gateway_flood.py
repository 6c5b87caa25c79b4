"""The gateway under attack by clients without a token: memory after an initialize flood, and a
token holder's recall latency during a slow-body flood, against the daemon as a process.

    .venv/bin/python bench/gateway_flood.py                        # this checkout
    .venv/bin/python bench/gateway_flood.py --src /tmp/old/src     # another source tree (e.g. main before)
    .venv/bin/python bench/gateway_flood.py --initializes 3000 --attackers 300 --recalls 40

1. **Initialize flood**: the daemon's RSS (VmRSS, and its peak VmHWM) before and after N unauthenticated
   ``initialize`` requests (32 keep-alive connections, raw HTTP/1.1), then whether a token holder can
   still open a handshake-era session (the SDK refused it 503 "Too many open sessions" past 10,000).
2. **Slow-body flood**: A attackers (more than the gateway's connection cap, 256 by default) each send a
   request head and then its body one byte every 4 s, reconnecting when dropped. Meanwhile a token
   holder recalls (``tools/call recall``, single-exchange POST with its bearer token) R times, 0.25 s
   apart, (a) on a connection opened before the flood and kept alive, (b) on a fresh connection each
   time, as a newly started agent does. Printed: p50 / p99 / max of each, and how many failed (no
   answer within 30 s; after three such failures and no answer the series stops: locked out). The
   anchor is the same recall with no flood.
3. **Event-stream flood**: A clients without a token each open ``GET /mcp`` asking for an
   event stream and keep it open (reconnecting when answered or dropped), while the token holder
   recalls as in 2.
4. **Operator websocket flood**: W read-token websockets held open and idle, while a
   control-tier client (connected before the flood) and a read-tier client opening a fresh connection
   each time (as the CLI does) call ``Status`` R times. Printed: p50 / p99 / max and refusals.

``--nofile N`` starts each daemon under ``ulimit -n N`` (e.g. 256 and 1024).

The machine (CPU count, load average) is printed first: other work on it shows in every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "examples" / "run-42-api-fixer.json"
API = "forge.example/acme/api"
SERVICE = "harness.v1.MemoryService"
LEGACY = "2025-06-18"
MODERN = "2026-07-28"
INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}}).encode()
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}
RECALL = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
    "name": "recall", "arguments": {"query": "flaky ledger"}, "_meta": META}}).encode()


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


class Daemon:
    def __init__(self, workdir: Path, src: Path | None, nofile: int | None = None) -> None:
        state = workdir / "state"
        state.mkdir(parents=True)
        self.state = state
        self.config = workdir / "harness.toml"
        self.config.write_text(f'[store]\npath = "{state}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                               '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                               '[memory.episodes]\nsummary = false\n', encoding="utf-8")
        env = {**os.environ, "HARNESS_CONFIG": str(self.config), "HOME": str(workdir)}
        if src is not None:
            env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
        self.log = (workdir / "daemon.log").open("wb")
        def limit() -> None:
            if nofile is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=limit)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.info = json.loads((state / "daemon.json").read_text(encoding="utf-8"))
                if self.info.get("pid") == self.proc.pid:
                    break
            except (FileNotFoundError, ValueError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.05)
        self.port = urllib.parse.urlsplit(self.info["gateway"]).port

    def token(self, tier: str) -> str:
        return (self.state / f"operator-{tier}.token").read_text(encoding="utf-8").strip()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Http:
    """A raw keep-alive HTTP/1.1 connection; answers read by Content-Length."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream, self.port, self.buffer = stream, port, b""

    @classmethod
    async def open(cls, port: int) -> Http:
        return cls(await trio.open_tcp_stream("127.0.0.1", port), port)

    def head(self, body: bytes, headers: dict[str, str]) -> bytes:
        lines = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Content-Type: application/json",
                 "Accept: application/json, text/event-stream", f"Content-Length: {len(body)}"]
        return ("\r\n".join(lines + [f"{k}: {v}" for k, v in headers.items()]) + "\r\n\r\n").encode()

    async def request(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        await self.stream.send_all(self.head(body, headers or {}) + body)
        while b"\r\n\r\n" not in self.buffer:
            await self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(fields.get("content-length", "0"))
        while len(self.buffer) < length:
            await self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), fields, body

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise EOFError("closed by the server")
        self.buffer += chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


async def prepare(daemon: Daemon) -> str:
    """An episode in API and a live run there; returns the run's token."""
    sys.path.insert(0, str(ROOT / "src"))
    from memactors.rpc.client import connect_rpc

    async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
        await rpc.call(f"{SERVICE}/IngestRun", {"record": json.loads(RECORD.read_text(encoding="utf-8"))})
        await rpc.call(f"{SERVICE}/ReportPresence", {"harness": "api-fixer", "run_id": "bench",
                                                     "session_id": "s-bench", "repo": API, "branch": "main"})
        minted = await rpc.call(f"{SERVICE}/MintRunToken", {"harness": "api-fixer", "run_id": "bench"})
    return str(minted["token"])


def recall_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Mcp-Protocol-Version": MODERN, "Mcp-Method": "tools/call",
            "Mcp-Name": "recall"}


async def initialize_flood(daemon: Daemon, token: str, count: int) -> None:
    http = await Http.open(daemon.port)
    status, _, _ = await http.request(RECALL, recall_headers(token))
    assert status == 200
    await http.aclose()
    before, hwm_before = status_kb(daemon.proc.pid, "VmRSS"), status_kb(daemon.proc.pid, "VmHWM")
    statuses: dict[int, int] = {}
    sessions = 0

    async def client(n: int) -> None:
        nonlocal sessions
        conn = await Http.open(daemon.port)
        try:
            for _ in range(n):
                status, fields, _ = await conn.request(INIT)
                statuses[status] = statuses.get(status, 0) + 1
                sessions += "mcp-session-id" in fields
        finally:
            await conn.aclose()

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for k in range(32):
            nursery.start_soon(client, count // 32 + (1 if k < count % 32 else 0))
    took = time.monotonic() - started
    after, hwm_after = status_kb(daemon.proc.pid, "VmRSS"), status_kb(daemon.proc.pid, "VmHWM")
    http = await Http.open(daemon.port)
    holder, _, _ = await http.request(INIT, {"Authorization": f"Bearer {token}"})
    await http.aclose()
    print(f"initialize flood: {count} unauthenticated initialize in {took:.1f} s "
          f"({count / took:.0f}/s), answers {dict(sorted(statuses.items()))}, sessions kept {sessions}")
    print(f"  daemon RSS {before / 1024:.1f} MB -> {after / 1024:.1f} MB (+{(after - before) / 1024:.1f} MB), "
          f"peak {hwm_before / 1024:.1f} -> {hwm_after / 1024:.1f} MB")
    print(f"  then a token holder's initialize: HTTP {holder}")


async def attacker(port: int, stop: trio.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            conn = await Http.open(port)
        except OSError:
            await trio.sleep(0.1)
            continue
        counts["connections"] += 1
        try:
            await conn.stream.send_all(conn.head(INIT, {}))
            for byte in range(len(INIT)):
                if stop.is_set():
                    return
                await conn.stream.send_all(INIT[byte : byte + 1])
                with trio.move_on_after(4.0):
                    chunk = await conn.stream.receive_some(4096)
                    counts["dropped"] += 1 if not chunk or chunk.startswith(b"HTTP/1.1 408") else 0
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            counts["dropped"] += 1
        finally:
            await conn.aclose()


def summary(label: str, times: list[float], failed: int) -> str:
    if not times:
        return f"  {label:<34} no answer ({failed} failed)"
    times = sorted(times)
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return (f"  {label:<34} p50 {statistics.median(times) * 1000:8.1f} ms  p99 {p99 * 1000:8.1f} ms  "
            f"max {times[-1] * 1000:8.1f} ms  ({len(times)} answered, {failed} failed)")


async def recalls(port: int, token: str, count: int, *, fresh: bool, keep: Http | None = None
                  ) -> tuple[list[float], int]:
    times, failed = [], 0
    for _ in range(count):
        started = time.monotonic()
        try:
            with trio.fail_after(30):
                if keep is None or fresh:  # kept-alive: reconnect (and keep that) when the server closed it
                    conn = await Http.open(port)
                    keep = None if fresh else conn
                else:
                    conn = keep
                status, _, body = await conn.request(RECALL, recall_headers(token))
                if fresh:
                    await conn.aclose()
            if status == 200 and b'"isError":false' in body.replace(b" ", b""):
                times.append(time.monotonic() - started)
            else:
                failed += 1
        except (trio.TooSlowError, OSError, EOFError, trio.BrokenResourceError):
            failed += 1
            keep = None
            if failed >= 3 and not times:
                break  # locked out: three recalls in a row got no answer within 30 s
        await trio.sleep(0.25)
    return times, failed


async def slow_body_flood(daemon: Daemon, token: str, attackers: int, count: int) -> None:
    kept = await Http.open(daemon.port)
    base_kept = await recalls(daemon.port, token, count, fresh=False, keep=kept)
    base_fresh = await recalls(daemon.port, token, count, fresh=True)
    stop = trio.Event()
    counts = {"connections": 0, "dropped": 0}
    async with trio.open_nursery() as nursery:
        for _ in range(attackers):
            nursery.start_soon(attacker, daemon.port, stop, counts)
        await trio.sleep(2.0)  # the attackers take every slot first
        during_kept = await recalls(daemon.port, token, count, fresh=False, keep=kept)
        during_fresh = await recalls(daemon.port, token, count, fresh=True)
        stop.set()
    await kept.aclose()
    print(f"slow-body flood: {attackers} attackers (a byte every 4 s), {counts['connections']} connections "
          f"opened, {counts['dropped']} dropped by the gateway")
    print(summary("recall, no flood, kept-alive", *base_kept))
    print(summary("recall, no flood, fresh conn", *base_fresh))
    print(summary("recall, flood, kept-alive", *during_kept))
    print(summary("recall, flood, fresh connection", *during_fresh))


async def stream_attacker(port: int, stop: trio.Event, counts: dict[str, int]) -> None:
    """A client without a token asking for an event stream, holding it open for as long as it is let."""
    head = (f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n").encode()
    while not stop.is_set():
        try:
            conn = await Http.open(port)
        except OSError:
            await trio.sleep(0.1)
            continue
        counts["connections"] += 1
        try:
            await conn.stream.send_all(head)
            while not stop.is_set():
                with trio.move_on_after(1.0):
                    chunk = await conn.stream.receive_some(4096)
                    if not chunk:
                        break
                    if chunk.startswith(b"HTTP/1.1 "):
                        status = chunk[9:12].decode("ascii", "replace")
                        counts[status] = counts.get(status, 0) + 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            counts["dropped"] += 1
        finally:
            await conn.aclose()


async def stream_flood(daemon: Daemon, token: str, attackers: int, count: int) -> None:
    kept = await Http.open(daemon.port)
    stop = trio.Event()
    counts = {"connections": 0, "dropped": 0}
    async with trio.open_nursery() as nursery:
        for _ in range(attackers):
            nursery.start_soon(stream_attacker, daemon.port, stop, counts)
        await trio.sleep(2.0)
        during_kept = await recalls(daemon.port, token, count, fresh=False, keep=kept)
        during_fresh = await recalls(daemon.port, token, count, fresh=True)
        stop.set()
    await kept.aclose()
    answered = {k: v for k, v in counts.items() if k.isdigit()}
    print(f"event-stream flood: {attackers} tokenless GET /mcp streams, {counts['connections']} connections "
          f"opened, answers {answered}, {counts['dropped']} dropped")
    print(summary("recall, flood, kept-alive", *during_kept))
    print(summary("recall, flood, fresh connection", *during_fresh))


async def statuses(url: str, token: str, count: int, rpc: object | None = None) -> tuple[list[float], int]:
    """Status ``count`` times, 0.25 s apart: on ``rpc`` (kept), or on a fresh connection each time."""
    from memactors.rpc.client import connect_rpc
    from memactors.rpc.frames import RpcError

    times, failed = [], 0
    for _ in range(count):
        started = time.monotonic()
        try:
            with trio.fail_after(30):
                if rpc is not None:
                    await rpc.call(f"{SERVICE}/Status", {})  # type: ignore[attr-defined]
                else:
                    async with connect_rpc(url, token) as fresh:
                        await fresh.call(f"{SERVICE}/Status", {})
            times.append(time.monotonic() - started)
        except (trio.TooSlowError, RpcError):
            failed += 1
        await trio.sleep(0.25)
    return times, failed


async def websocket_flood(daemon: Daemon, sockets: int, count: int) -> None:
    from memactors.rpc.client import connect_rpc
    from memactors.rpc.frames import RpcError

    url, read, control = daemon.info["operator"], daemon.token("read"), daemon.token("control")
    opened, refused = 0, 0
    stop = trio.Event()

    async def hold(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal opened, refused
        try:
            async with connect_rpc(url, read):
                opened += 1
                task_status.started()
                await stop.wait()
        except RpcError:
            refused += 1
            task_status.started()

    async with connect_rpc(url, control) as kept:
        base_control = await statuses(url, control, count, kept)
        base_read = await statuses(url, read, count)
        async with trio.open_nursery() as nursery:
            for _ in range(sockets):
                await nursery.start(hold)
            during_control = await statuses(url, control, count, kept)
            during_read = await statuses(url, read, count)
            stop.set()
    print(f"operator websocket flood: {sockets} read-token websockets held idle ({opened} opened, "
          f"{refused} refused)")
    print(summary("Status, no flood, control, kept", *base_control))
    print(summary("Status, no flood, read, fresh", *base_read))
    print(summary("Status, flood, control, kept", *during_control))
    print(summary("Status, flood, read, fresh (CLI)", *during_read))


async def main(args: argparse.Namespace) -> None:
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}; daemon code: {args.src or ROOT / 'src'}; "
          f"ulimit -n {args.nofile or 'unchanged'}")
    sys.path.insert(0, str(ROOT / "src"))
    with tempfile.TemporaryDirectory(prefix="gateway-flood-") as tmp:
        phases = {"initialize": lambda d, t: initialize_flood(d, t, args.initializes),
                  "slow-body": lambda d, t: slow_body_flood(d, t, args.attackers, args.recalls),
                  "event-stream": lambda d, t: stream_flood(d, t, args.attackers, args.recalls),
                  "websocket": lambda d, t: websocket_flood(d, args.websockets, args.recalls)}
        for name in args.phases.split(","):
            daemon = Daemon(Path(tmp) / name, args.src, args.nofile)
            try:
                token = await prepare(daemon)
                await phases[name](daemon, token)
            finally:
                daemon.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", type=Path, help="run the daemon from this source tree (PYTHONPATH)")
    parser.add_argument("--initializes", type=int, default=10_000)
    parser.add_argument("--attackers", type=int, default=300)
    parser.add_argument("--websockets", type=int, default=400)
    parser.add_argument("--recalls", type=int, default=40)
    parser.add_argument("--nofile", type=int, help="the daemon's ulimit -n (e.g. 256, 1024)")
    parser.add_argument("--phases", default="initialize,slow-body,event-stream,websocket",
                        help="comma-separated: initialize, slow-body, event-stream, websocket")
    trio.run(main, parser.parse_args())
