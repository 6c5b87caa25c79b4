"""Provider health as operators see it (REQ-19, REQ-21): a provider that stops answering or never
starts leaves `ready`, exports provider_up 0, warns in doctor with the reason, fails after 5 minutes,
and `memory status` exits non-zero saying what is wrong."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing
from mcp.server import Server

from fix_daemon import daemon_in_process
from fix_providers import FaultFiles, fault_toml, poll, sample
from memactors.actors import provider_session as ps
from memactors.config import Config, ConfigHolder
from memactors.doctor import doctor_rows
from memactors.metrics import Metrics
from memactors.rpc.client import connect_rpc
from memactors.rpc.tokens import read_token
from memactors.service import open_memory_service
from memactors.store.engines import open_store
from memactors.testing.fault_provider import PROVIDER_NAME, PROVIDER_VERSION, FaultProvider
from support import write_config

SERVICE = "harness.v1.MemoryService"
MISSING = "/nonexistent/memory-provider"
UNREACHABLE = f'[memory]\nprovider = "fault"\n[mcp.fault]\ncommand = "{MISSING}"\n'


def _row(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["name"] == name), None)


@pytest.mark.req19
@pytest.mark.req21
@pytest.mark.slow
async def test_a_sigstopped_stdio_provider_is_down_with_provider_up_0_doctor_warn_and_status_exit_10(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real stdio provider stopped with SIGSTOP: every heartbeat check times out, so the session leaves
    `ready` (the heartbeat does not swallow its own timeout); SIGCONT brings it back."""
    monkeypatch.setattr(ps, "HEARTBEAT_SECONDS", 0.3)
    monkeypatch.setattr(ps, "HEARTBEAT_MISSES_TO_RECONNECT", 10**6)  # keep the stopped process, not a fresh one
    files = FaultFiles(tmp_path / "fault")
    state = tmp_path / "state"
    async with daemon_in_process(tmp_path, fault_toml(files, provider_timeout="0.5s")) as (path, listening):
        async with connect_rpc(listening.operator, read_token(state, "read")) as rpc, httpx2.AsyncClient() as http:
            async def state_is(wanted: str) -> bool:
                return (await rpc.call(f"{SERVICE}/Status", {}))["state"] == wanted

            await poll(lambda: state_is("ready"), what="ready")
            pid = files.read_pid()
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                await poll(lambda: state_is("down"), what="down after heartbeat timeouts")
                status = await rpc.call(f"{SERVICE}/Status", {})
                assert "memory_contract timed out" in status["last_error"]
                doctor = await rpc.call(f"{SERVICE}/Doctor", {})
                row = _row(doctor["rows"], "memory provider")
                assert row is not None and row["status"] == "warn" and "timed out" in row["message"]
                metrics = (await http.get(listening.metrics)).text
                assert 'harness_memory_provider_up{provider="fault"} 0.0' in metrics
                env = {**os.environ, "HARNESS_CONFIG": str(path), "HOME": str(tmp_path)}
                cli = await trio.run_process([sys.executable, "-m", "memactors.cli", "memory", "status"], env=env,
                                             capture_stdout=True, capture_stderr=True, check=False)
                assert cli.returncode == 10, cli.stderr
                assert b"is down" in cli.stderr and b"timed out" in cli.stderr
            finally:
                os.kill(pid, signal.SIGCONT)
            await poll(lambda: state_is("ready"), what="ready again after SIGCONT")
            metrics = (await http.get(listening.metrics)).text
            assert 'harness_memory_provider_up{provider="fault"} 1.0' in metrics


@pytest.mark.req19
async def test_a_hung_provider_fails_doctor_after_five_minutes(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """On MockClock: a provider (in-process, so virtual time is exact) whose memory_contract stops
    answering goes down at the next heartbeat; doctor warns, and fails once it has lasted 5 minutes."""
    provider = FaultProvider()
    server = Server(PROVIDER_NAME, version=PROVIDER_VERSION, on_list_tools=provider.list_tools,
                    on_call_tool=provider.call_tool)
    store = await open_store(tmp_path / "m.db")
    metrics = Metrics()
    session = ps.ProviderSession(provider="fault", store=store, metrics=metrics, provider_timeout=2.0,
                                 target=lambda: server, endpoint="in-process fault provider")

    def rows() -> list[Any]:
        st = session.status()
        status = {"provider": "fault", "transport": "stdio", "state": st.state, "contract": st.contract,
                  "breaker": st.breaker, "last_error": st.last_error,
                  "state_for_seconds": trio.current_time() - st.since, "pending": {}}
        return doctor_rows(Config(), status, oldest_pending_seconds={}, degraded_recalls_24h=0,
                           episodes_missing_vectors=0)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.run)
            while session.status().state != "ready":  # noqa: ASYNC110 -- virtual time, polls the actor
                await trio.sleep(0.1)
            provider.modes, provider.delay = frozenset({"slow"}), 10**7  # memory_contract never answers
            while session.status().state == "ready":  # noqa: ASYNC110 -- virtual time, polls the actor
                await trio.sleep(1)
            went_down = trio.current_time()
            assert "memory_contract timed out" in (session.status().last_error or "")
            assert sample(metrics, "harness_memory_provider_up", provider="fault") == 0
            [first] = [r for r in rows() if r.name == "memory provider"]
            assert first.status == "warn" and not any(r.status == "fail" for r in rows())
            await trio.sleep(ps.HEARTBEAT_SECONDS * 4)  # reconnects in between keep it down, since unchanged
            assert session.status().state == "down" and not any(r.status == "fail" for r in rows())
            await trio.sleep(went_down + 301 - trio.current_time())
            failed = [r for r in rows() if r.status == "fail"]
            assert [r.name for r in failed] == ["memory provider reachability"]
            assert "unreachable for 5 minutes" in failed[0].message and "timed out" in failed[0].message
            nursery.cancel_scope.cancel()
    finally:
        store.close()


@pytest.mark.req19
@pytest.mark.req21
async def test_a_provider_whose_command_does_not_exist_warns_naming_the_path_then_fails(
        make_holder: Callable[[str], ConfigHolder], autojump_clock: trio.testing.MockClock) -> None:
    metrics = Metrics()
    async with open_memory_service(make_holder(UNREACHABLE), metrics=metrics) as memory:
        while (await memory.status())["state"] != "down":  # noqa: ASYNC110 -- virtual time, polls the actor
            await trio.sleep(0.1)
        status = await memory.status()
        assert MISSING in status["last_error"] and "ExceptionGroup" not in status["last_error"]
        # An alert on provider_up == 0 can fire: the failed attempt counts as a failed check.
        assert sample(metrics, "harness_memory_provider_up", provider="fault") == 0
        doctor = await memory.doctor()
        row = _row(doctor["rows"], "memory provider")
        assert row is not None and row["status"] == "warn" and f"cannot start {MISSING}" in row["message"]
        await trio.sleep(301)
        doctor = await memory.doctor()
        fail = _row(doctor["rows"], "memory provider reachability")
        assert fail is not None and fail["status"] == "fail" and MISSING in fail["message"]
        assert not doctor["ok"]
        check = await memory.check_provider()
        assert f"cannot start {MISSING}" in check["checks"][0]["reason"]


@pytest.mark.req19
async def test_a_refused_http_upstream_names_its_url(
        make_holder: Callable[[str], ConfigHolder], autojump_clock: trio.testing.MockClock) -> None:
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    async with open_memory_service(make_holder(f'[memory]\nprovider = "up"\n[mcp.up]\nurl = "{url}"\n')) as memory:
        while (await memory.status())["state"] != "down":  # noqa: ASYNC110 -- virtual time, polls the actor
            await trio.sleep(0.1)
        error = (await memory.status())["last_error"]
        assert url in error and "ExceptionGroup" not in error


@pytest.mark.req6
@pytest.mark.slow
def test_a_stdio_providers_stderr_is_logged_redacted_and_tagged_never_inherited(tmp_path: Path) -> None:
    """A provider whose traceback prints a GitHub token: the daemon's own stderr (its log) shows the
    line redacted, as a structured line tagged with the provider, and never the token."""
    import json
    import subprocess
    import time

    secret = "ghp_" + "a1B2c3D4e5" * 3 + "abcdef"
    script = (f"import sys; sys.stderr.write('Traceback (most recent call last):\\n  auth={secret}\\n');"
              " sys.stderr.flush(); from memactors.testing.fault_provider import main; main([])")
    extra = (f'[memory]\nprovider = "noisy"\n[mcp.noisy]\ncommand = {json.dumps(sys.executable)}\n'
             f'args = {json.dumps(["-c", script])}\n')
    config = write_config(tmp_path, extra)
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    log = tmp_path / "daemon.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "memactors.cli", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 300  # a hang guard: a loaded machine takes a minute to start both
            while not ("provider stderr" in log.read_text() and "auth=" in log.read_text()):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    text = log.read_text()
    assert secret not in text
    lines = [line for line in text.splitlines() if "provider stderr" in line]
    assert any("auth=[REDACTED]" in line and "provider=noisy" in line for line in lines), lines
