"""Helpers for the hardening tests: the daemon as a process with a token holder's episode to recall, its
gateway spoken to over raw HTTP/1.1 (as a hostile or handshake-era client would) and through an MCP
client, and the run records that carry the secret corpus into every field."""

from __future__ import annotations

import json
import sys
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from fix_daemon import Daemon, start_daemon
from memactors.rpc.client import connect_rpc
from support import example, run_record
from support_readside import gateway_client
from support_secrets import Sample

SERVICE = "harness.v1.MemoryService"


API = "forge.example/acme/api"


LEGACY = "2025-06-18"


INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}}).encode()


class Http:
    """One raw HTTP/1.1 connection, kept alive across requests (what an attacker's script or a pooled
    client does); answers are read by Content-Length, as the gateway sends them."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream = stream
        self.port = port
        self.buffer = b""

    @classmethod
    async def open(cls, port: int) -> Http:
        return cls(await trio.open_tcp_stream("127.0.0.1", port), port)

    def head(self, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        lines = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Content-Type: application/json",
                 "Accept: application/json, text/event-stream", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def request(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        await self.stream.send_all(self.head(body, headers) + body)
        return await self.response()

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise EOFError("server closed the connection")
        self.buffer += chunk

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            await self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            await self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    async def aclose(self) -> None:
        await self.stream.aclose()


def rpc_message(id_: int | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id_ is not None:
        message["id"] = id_
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


async def token_holder(daemon: Daemon, run_id: str) -> str:
    """An ingested episode in API and a live run there; returns the run's token."""
    async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
        await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})
        await rpc.call(f"{SERVICE}/ReportPresence", {"harness": "api-fixer", "run_id": run_id,
                                                     "session_id": f"s-{run_id}", "repo": API, "branch": "main"})
        minted = await rpc.call(f"{SERVICE}/MintRunToken", {"harness": "api-fixer", "run_id": run_id})
    return str(minted["token"])


@asynccontextmanager
async def gateway_daemon(tmp_path: Path, run_id: str, **options: Any) -> AsyncIterator[tuple[Daemon, str, int, str]]:
    """The daemon as a process (``start_daemon(tmp_path, **options)``), its gateway's URL and port, and the
    token of run `run_id` (``token_holder``: an episode to recall); the daemon is stopped on exit."""
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(tmp_path, **options))
    try:
        url = daemon.info["gateway"]
        token = await token_holder(daemon, run_id)
        yield daemon, url, urllib.parse.urlsplit(url).port or 80, token
    finally:
        await trio.to_thread.run_sync(daemon.stop)


async def legacy_recall(port: int, token: str) -> str:
    """A handshake-era session (what Claude Code speaks) opened with the token, then one recall in it."""
    http = await Http.open(port)
    try:
        auth = {"Authorization": f"Bearer {token}"}
        status, headers, body = await http.request(INIT, auth)
        assert status == 200, body
        session = {**auth, "Mcp-Session-Id": headers["mcp-session-id"], "Mcp-Protocol-Version": LEGACY}
        status, _, _ = await http.request(rpc_message(None, "notifications/initialized"), session)
        assert status == 202
        status, _, body = await http.request(rpc_message(2, "tools/call", {
            "name": "recall", "arguments": {"query": "flaky ledger"}}), session)
        assert status == 200, body
        result = json.loads(body)["result"]
        assert result["isError"] is False
        return str(result["content"][0]["text"])
    finally:
        await http.aclose()


async def client_recall(url: str, token: str) -> str:
    async with gateway_client(url, token) as client:
        result = await client.call_tool("recall", {"query": "flaky ledger"})
    assert result.is_error is False
    return "".join(getattr(c, "text", "") for c in result.content)


def assert_clean_log(daemon: Daemon) -> str:
    log = daemon.log_text()
    assert "Traceback" not in log, log[-4000:]
    assert " ERROR " not in log, log[-4000:]
    assert "Too many open sessions" not in log
    return log


def secret_record(i: int, sample: Sample) -> dict[str, object]:
    text, line = sample.text, sample.one_line
    # One-line fields hold 256 characters: the sample, else the secret alone, else (a key block) nothing
    # of it. A secret is never cut here: a cut one is shorter than its format, which is another test.
    secret = " ".join(sample.secret.split())
    short = line if len(line) <= 240 else secret if len(secret) <= 240 else f"long-{i}"
    at = "2026-11-28T09:01:00Z"
    return run_record(
        harness=f"h{i} {short}", run_id=f"r{i} {short}", trace_id=text, result_text=f"Done. {text} end",
        model={"served": short}, trigger={"source": "api", "name": text},
        sessions=[{"session_id": f"s{i} {short}", "cwd": f"/srv/api/{line}"[:4000], "repo": API,
                   "git_branch": short}],
        events=[{"kind": "edit", "session_id": f"s{i} {short}", "at": at, "path": f"src/{line}"[:4000]},
                {"kind": "verify", "session_id": f"s{i} {short}", "at": at, "ok": False, "error_class": text},
                {"kind": "message", "session_id": f"s{i} {short}", "at": at, "text": text},
                {"kind": "tool_call", "session_id": f"s{i} {short}", "at": at, "payload": {"args": text}}],
    )


#: A stdio provider that writes a file to its stderr at start (tests/data/stderr_provider.py).
STDERR_PROVIDER = Path(__file__).resolve().parent / "data" / "stderr_provider.py"


def start_leaky_daemon(tmp_path: Path, samples: Sequence[Sample]) -> Daemon:
    """The daemon as a process, its provider ("leaky", `STDERR_PROVIDER`) writing every sample to its
    stderr after a ``SAMPLE <id>`` line. Every stderr line is logged (50 lines per 10 s otherwise): a
    suppressed line would prove nothing."""
    payload = tmp_path / "stderr.txt"
    payload.write_text("".join(f"SAMPLE {s.id}\n{s.text}\n" for s in samples), encoding="utf-8")
    args = [str(STDERR_PROVIDER), str(payload), "--state", str(tmp_path / "provider.json")]
    extra = (f'[memory]\nprovider = "leaky"\n[memory.episodes]\nsummary = false\n'
             f"[mcp.leaky]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps(args)}\n")
    return start_daemon(tmp_path, extra_config=extra,
                        constants={"memactors.provider_stderr.STDERR_LINES_PER_WINDOW": 1_000_000})


def stored_files(state: Path) -> list[Path]:
    """Every file of a state directory but the operator tokens (the test's own secrets, not a leak)."""
    return sorted(p for p in state.rglob("*") if p.is_file() and not p.name.endswith(".token"))
