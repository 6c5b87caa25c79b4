"""The provider session through the real subprocess path: the fault provider as `[mcp.fault]` (REQ-3, REQ-13)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from fix_providers import FaultFiles, fault_toml, poll, sample
from memactors.actors.provider_session import ProviderSession, provider_call
from memactors.breaker import Breaker
from memactors.config import ConfigHolder
from memactors.conformance import synthetic_episode, synthetic_scope
from memactors.errors import ProviderIncompatible, ProviderUnavailable
from memactors.metrics import Metrics
from memactors.service import MemoryService, open_memory_service
from memactors.store.engines import open_store
from memactors.testing import fault_provider_params
from support import run_record, wait_ready, within

pytestmark = pytest.mark.slow

REPO = "forge.example/acme/api"


def _run(n: int, **overrides: Any) -> dict[str, Any]:
    return run_record(run_id=str(n), trace_id=f"t-{n}", result_text=f"fixed ledger rounding number {n}",
                      started_at=f"2026-11-28T09:{n:02d}:00Z", ended_at=f"2026-11-28T09:{n:02d}:30Z", **overrides)


async def _indexed(memory: MemoryService) -> int:
    return (await memory.status())["counts"]["indexed_ids"]


async def test_a_hung_call_never_blocks_another_caller(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path, trio_clock: trio.testing.MockClock) -> None:
    """Shown on trio time: frozen while the recall hangs at the provider, an ingest is recorded all the
    same; then the recall is answered (degraded) within provider_timeout."""
    files = FaultFiles(tmp_path / "fault")
    async with open_memory_service(make_holder(fault_toml(files, "hang_recall", provider_timeout="1s"))) as memory:
        await wait_ready(memory)
        trio_clock.rate = 0.0  # no deadline passes until `within` moves the clock
        answered = trio.Event()
        results: dict[str, Any] = {}

        async def recall() -> None:
            results["recall"] = await memory.recall(query="ledger", repo=REPO)
            answered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(recall)
            await poll(lambda: "memory_recall" in files.tools(), what="the recall hanging at the provider")
            assert (await memory.ingest_run(_run(1)))["outcome"] == "recorded"
            assert not answered.is_set()
            await within(trio_clock, 1.0, answered.wait)  # recall waits provider_timeout, not longer
    assert results["recall"]["degraded"] == "provider_unavailable"


@pytest.mark.req3
async def test_req3_an_unsupported_contract_version_is_not_used(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    async with open_memory_service(make_holder(fault_toml(files, "contract_v2"))) as memory:
        await wait_ready(memory, "incompatible")
        status = await memory.status()
        assert status["state"] == "incompatible" and status["contract"] == 2  # the version it announced
        assert "contract 2" in status["last_error"]
        result = await memory.ingest_run(_run(1))
        assert result["outcome"] == "queued"
        recall = await memory.recall(query="ledger", repo=REPO)
        assert recall["degraded"] == "provider_unavailable" and recall["episodes"] == []
        assert (await memory.status())["pending"]["records"] == 1
    assert "memory_record_episode" not in files.tools()
    assert "memory_recall" not in files.tools()
    assert files.tools().count("memory_contract") >= 1


@pytest.mark.req3
async def test_req3_a_missing_tool_marks_the_provider_incompatible_until_a_later_check_succeeds(
        tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    files.root.mkdir()
    files.set_modes("omit_forget")
    store = await open_store(tmp_path / "m.db")
    metrics = Metrics()
    session = ProviderSession(
        provider="fault", store=store, metrics=metrics, provider_timeout=1.0, heartbeat=0.1,
        target=lambda: fault_provider_params(calls_file=files.calls, control_file=files.control))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.run)
            await poll(lambda: session.status().state == "incompatible", what="incompatible")
            assert "memory_forget" in (session.status().last_error or "")
            with pytest.raises(ProviderIncompatible), trio.fail_after(60):
                await provider_call(session.address, "memory_record_episode", _record_args())
            assert "memory_record_episode" not in files.tools()
            files.set_modes()  # the provider is fixed: the next heartbeat's check passes
            await poll(lambda: session.status().state == "ready", what="ready again")
            with trio.fail_after(60):
                assert (await provider_call(session.address, "memory_record_episode", _record_args()))["ids"]
            nursery.cancel_scope.cancel()
    finally:
        store.close()


NONCE = "00112233aabbccdd"
SCOPE = synthetic_scope(NONCE)


def _record_args() -> dict[str, Any]:
    """A valid memory_record_episode request (the conformance suite's synthetic episode)."""
    episode, text = synthetic_episode(NONCE)
    return {"episode_id": episode["episode_id"], "scope": SCOPE, "trust_class": "standard", "text": text,
            "episode": episode}


async def _kill_and_await_a_new_process(session: ProviderSession, files: FaultFiles, *, what: str,
                                        seconds: float = 20.0) -> list[str]:
    """SIGKILL the provider process and wait until another one is up and the session ready; returns
    the session states seen while waiting."""
    first = files.read_pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    states: list[str] = []

    def watch() -> bool:
        states.append(session.status().state)
        return files.read_pid() not in (None, first) and session.status().state == "ready"

    await poll(watch, seconds=seconds, what=what)
    return states


async def test_a_killed_subprocess_is_noticed_and_reconnected(tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    files.root.mkdir()
    store = await open_store(tmp_path / "m.db")
    session = ProviderSession(
        provider="fault", store=store, metrics=Metrics(), provider_timeout=1.0, heartbeat=0.2,
        target=lambda: fault_provider_params(state_file=files.state, pid_file=files.pid))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.run)
            await poll(lambda: session.status().state == "ready", what="ready")
            with trio.fail_after(60):
                await provider_call(session.address, "memory_record_episode", _record_args())
            states = await _kill_and_await_a_new_process(session, files, what="a new process, ready")
            assert "down" in states, "the death was noticed without any call (heartbeat)"
            with trio.fail_after(60):
                out = await provider_call(session.address, "memory_recall",
                                          {"query": NONCE, "scope": [SCOPE], "limit": 5})
            assert [i["id"] for i in out["items"]] == [_record_args()["episode_id"]]  # the new process loaded its state file
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def test_killing_the_upstream_while_runs_keep_ending_loses_no_episode(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    n = 8
    async with open_memory_service(make_holder(fault_toml(files))) as memory:
        await wait_ready(memory)
        restarts_before = len(memory.supervisor._restarts)
        killed = set()
        for i in range(1, n + 1):
            if i in (2, 5):  # kill the provider twice, mid-stream; runs keep ending while it is down
                await poll(lambda: files.read_pid() not in (None, *killed), what="a live provider process")
                pid = files.read_pid()
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            result = await memory.ingest_run(_run(i))
            assert result["outcome"] in ("recorded", "queued")
        assert len(killed) >= 2

        async def all_indexed() -> bool:
            return await _indexed(memory) == n

        # Up to one breaker opening (30 s) plus a retry: records wait out a dead provider, none is lost.
        await poll(all_indexed, seconds=90, what="every episode recorded")
        status = await memory.status()
        assert status["pending"] == {"records": 0, "forgets": 0, "record_failed": 0, "forget_failed": 0,
                                     "record_quarantined": 0}
        assert len(memory.supervisor._restarts) == restarts_before, "no actor crashed"
        assert set(memory.supervisor.running()) >= {"provider_session", "index", "retention", "assembler"}
    assert len(files.stored()) == n


async def test_the_breakers_half_open_probe_runs_under_provider_timeout(
        tmp_path: Path, trio_clock: trio.testing.MockClock) -> None:
    files = FaultFiles(tmp_path / "fault")
    files.root.mkdir()
    store = await open_store(tmp_path / "m.db")
    breaker = Breaker(base_open=0.2)
    session = ProviderSession(
        provider="fault", store=store, metrics=Metrics(), provider_timeout=0.5, breaker=breaker,
        target=lambda: fault_provider_params("hang_recall"))
    args = {"query": "ledger", "scope": [f"project:{REPO}"], "limit": 5}
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.run)
            await poll(lambda: session.status().state == "ready", what="ready")
            for _ in range(5):
                with trio.move_on_after(0.1):
                    await provider_call(session.address, "memory_recall", args)
            # The session reports each timeout after writing its call-log row, just after the caller gave up.
            await poll(lambda: breaker.state == "open", what="breaker open")
            with pytest.raises(ProviderUnavailable, match="breaker is open"):
                await provider_call(session.address, "memory_recall", args)
            await trio.sleep(0.25)
            # The call has no deadline of its own: the probe's, named with the tool.
            with pytest.raises(ProviderUnavailable, match=r"memory_recall did not answer within 0\.5s"):
                await within(trio_clock, 0.5, lambda: provider_call(session.address, "memory_recall", args))
            assert breaker.state == "open" and breaker.open_for == pytest.approx(0.4)
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def test_provider_up_appears_only_after_the_first_contract_check_and_calls_are_measured_and_logged(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    metrics = Metrics()
    holder = make_holder(fault_toml(files, "slow", provider_timeout="5s").replace(
        '"--mode", "slow"', '"--mode", "slow", "--delay", "0.5"'))
    async with open_memory_service(holder, metrics=metrics) as memory:
        assert sample(metrics, "harness_memory_provider_up", provider="fault") is None
        await wait_ready(memory)
        assert sample(metrics, "harness_memory_provider_up", provider="fault") == 1
        result = await memory.ingest_run(_run(1))
        assert result["outcome"] == "recorded"
        await memory.recall(query="ledger", repo=REPO)
        await memory.forget(result["episode_id"])
        for op in ("contract", "record", "recall", "forget"):
            count = sample(metrics, "harness_memory_provider_duration_seconds_count", provider="fault", op=op)
            assert count is not None and count >= 1, op
        await memory.call_log.flush()  # written in batches, off the request path
        rows = await memory.store.read(lambda db: db.execute(
            "SELECT caller, server, tool, args_sha256, outcome FROM call_log ORDER BY id").fetchall())
    received = {c["tool"]: c["arguments"] for c in files.read_calls()}
    logged = {tool: digest for caller, server, tool, digest, outcome in rows if outcome == "ok"}
    assert {r[0] for r in rows} == {"daemon"} and {r[1] for r in rows} == {"fault"}
    for tool in ("memory_record_episode", "memory_recall", "memory_forget"):
        canonical = json.dumps(received[tool], sort_keys=True, default=str).encode()
        assert logged[tool] == hashlib.sha256(canonical).hexdigest(), tool
    dump = json.dumps(rows)
    assert "ledger" not in dump, "no episode text or query in the call log"


async def test_a_backlog_drains_through_serve_builtin_stdio_with_records_in_flight_together(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    """The drain path: records queued while the upstream could not be started are recorded by
    `memactors provider serve-builtin --stdio` once it can, several in flight at once over the one pipe
    (the provider reads many JSON-RPC lines per pipe read), every one indexed, none left pending."""
    import sys

    from memactors.actors import retention as retention_module

    upstream = tmp_path / "upstream.db"
    n = 3 * retention_module.CONCURRENT_ATTEMPTS + 5
    async with open_memory_service(make_holder(
            '[memory]\nprovider = "bi"\n[mcp.bi]\ncommand = "/nonexistent/provider"\n')) as memory:
        for i in range(n):
            record = run_record(run_id=f"d{i}", trace_id=f"td-{i}", result_text=f"fixed ledger rounding number {i}")
            assert (await memory.ingest_run(record))["outcome"] == "queued"
    working = (f'[memory]\nprovider = "bi"\n[mcp.bi]\ncommand = "{sys.executable}"\n'
               f'args = ["-m", "memactors.cli", "provider", "serve-builtin", "--stdio", "--db", "{upstream}"]\n'
               # the connection budget (5 × provider_timeout) must cover the start on a loaded machine
               '[memory.episodes]\nprovider_timeout = "10s"\n')
    async with open_memory_service(make_holder(working)) as memory:
        await wait_ready(memory)

        async def drained() -> bool:
            return (await memory.status())["pending"]["records"] == 0

        await poll(drained, seconds=120, what="the backlog recorded through serve-builtin --stdio")
        assert await _indexed(memory) == n
        assert (await memory.status())["pending"]["record_failed"] == 0
    store = await open_store(upstream)
    try:
        assert await store.read(lambda db: db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]) == n
    finally:
        store.close()


@asynccontextmanager
async def _serving(tmp_path: Path, **session: Any) -> AsyncIterator[tuple[ProviderSession, FaultFiles]]:
    """A running session to the stdio fault provider (heartbeat 0.2 s unless given); stopped on exit."""
    files = FaultFiles(tmp_path / "fault")
    files.root.mkdir()
    store = await open_store(tmp_path / "m.db")
    running = ProviderSession(
        provider="fault", store=store, metrics=Metrics(), provider_timeout=1.0,
        target=lambda: fault_provider_params(state_file=files.state, pid_file=files.pid),
        **({"heartbeat": 0.2} | session))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(running.run)
            yield running, files
            nursery.cancel_scope.cancel()
    finally:
        store.close()


@pytest.fixture
def direct_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider run as its own interpreter, not forked from the suite's fork server: these tests
    compare the spare's pid with the pid the serving provider writes, which must be the same process."""
    monkeypatch.delenv("MEMACTORS_FAULT_ZYGOTE", raising=False)


def _spare_pid(session: ProviderSession) -> int | None:
    spare = session._standby
    return spare[0].pid if spare is not None else None


async def test_a_killed_stdio_provider_is_replaced_by_the_spare_started_in_advance(
        tmp_path: Path, direct_provider: None) -> None:
    """A replacement once took 6-8 s: the new process spent them importing its code. Once a connection is ready the
    session starts a spare process; after a kill -9 the next connection uses that very process (its pid
    is the one that answers), and a new spare is started for the next time."""
    async with _serving(tmp_path) as (session, files):
        await poll(lambda: session.status().state == "ready" and _spare_pid(session) is not None,
                   seconds=60, what="ready, with a spare process")
        first, spare = files.read_pid(), _spare_pid(session)
        assert first is not None and spare is not None and spare != first
        os.kill(first, signal.SIGKILL)
        await poll(lambda: files.read_pid() == spare and session.status().state == "ready",
                   seconds=60, what="the spare process serving")
        with trio.fail_after(60):
            await provider_call(session.address, "memory_record_episode", _record_args())
        assert list(files.stored()) == [_record_args()["episode_id"]]
        await poll(lambda: _spare_pid(session) not in (None, spare), seconds=60, what="a new spare")


async def test_a_spare_that_exits_before_use_is_not_kept_and_the_session_still_reconnects(
        tmp_path: Path, direct_provider: None) -> None:
    """A provider that cannot run twice (a lock taken at start, say) loses its spare: the session notices
    at the next connection, starts a fresh process as before and keeps no spare from then on."""
    async with _serving(tmp_path) as (session, files):
        await poll(lambda: session.status().state == "ready" and _spare_pid(session) is not None,
                   seconds=60, what="ready, with a spare process")
        first, spare = files.read_pid(), _spare_pid(session)
        assert first is not None and spare is not None
        os.kill(spare, signal.SIGKILL)
        os.kill(first, signal.SIGKILL)
        await poll(lambda: files.read_pid() not in (None, first, spare) and session.status().state == "ready",
                   seconds=60, what="a fresh process serving")
        assert session._standby is None and not session._standby_ok
        with trio.fail_after(60):
            await provider_call(session.address, "memory_record_episode", _record_args())


@pytest.mark.parametrize("spare", [True, False], ids=["spare_process-true", "spare_process-false"])
async def test_spare_process_false_keeps_no_spare(tmp_path: Path, spare: bool) -> None:
    """`[mcp.<name>] spare_process = false`: for a provider that must not run twice or loads its state
    only at start, no process is started in advance (the same call starts one when it is true)."""
    async with _serving(tmp_path, heartbeat=3600.0, spare_process=lambda: spare) as (session, _):
        await poll(lambda: session.status().state == "ready", seconds=60, what="ready")
        if spare:
            await poll(lambda: session._standby is not None, seconds=60, what="a spare process")
        else:
            await session._prepare_standby()  # what the connection loop runs once the session is ready
        assert (session._standby is not None) == spare


async def test_the_spare_process_is_stopped_with_the_session(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (session, _):
        await poll(lambda: _spare_pid(session) is not None, seconds=60, what="a spare process")
        assert session._standby is not None
        spare = session._standby[0]
    assert spare.returncode is not None, "the spare was stopped and reaped"
    assert session._standby is None


async def test_a_stdio_provider_that_dies_while_idle_is_replaced_without_waiting_for_a_heartbeat(
        tmp_path: Path) -> None:
    """The closed pipe is the news: with no call in flight and the heartbeat an hour away, a killed
    provider is still noticed and replaced (the session goes down, then ready on a new process)."""
    async with _serving(tmp_path, heartbeat=3600.0) as (session, files):
        await poll(lambda: session.status().state == "ready", seconds=60, what="ready")
        states = await _kill_and_await_a_new_process(
            session, files, seconds=60, what="a new process, ready, with no call and no heartbeat")
        assert "down" in states
