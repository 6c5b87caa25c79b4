"""A stdio provider crash is one breaker failure, and a respawned provider is back in service at once."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from fix_providers import FaultFiles, fault_toml, poll
from memactors.actors.provider_session import ProviderSession, provider_call
from memactors.breaker import Breaker
from memactors.config import ConfigHolder
from memactors.metrics import Metrics
from memactors.service import open_memory_service
from memactors.store.engines import open_store
from memactors.testing import fault_provider_params
from support import run_record, wait_ready

REPO = "forge.example/acme/api"


def _run(n: int) -> dict:
    return run_record(run_id=str(n), trace_id=f"t-{n}", result_text=f"fixed ledger rounding number {n}",
                      started_at=f"2026-11-28T09:{n:02d}:00Z", ended_at=f"2026-11-28T09:{n:02d}:30Z")


@pytest.mark.slow
async def test_a_provider_killed_with_calls_in_flight_counts_one_failure_and_serves_right_after_respawn(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    files = FaultFiles(tmp_path / "fault")
    holder = make_holder(fault_toml(files, provider_timeout="30s"))
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        assert (await memory.ingest_run(_run(1)))["outcome"] == "recorded"
        breaker = memory.session.breaker
        files.set_modes("hang_recall")
        results: list[dict] = []

        async def recall() -> None:
            results.append(await memory.recall(query="ledger", repo=REPO))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(recall)
            await poll(lambda: files.tools().count("memory_recall") >= 8, what="8 recalls in flight")
            files.set_modes()  # the next process behaves
            first = files.read_pid()
            assert first is not None
            os.kill(first, signal.SIGKILL)
        assert len(results) == 8 and all(r["degraded"] for r in results)
        assert breaker.consecutive_failures == 1  # was 8: one failure per call in flight
        assert breaker.state == "closed"

        await poll(lambda: files.read_pid() not in (None, first) and memory.session.status().state == "ready",
                   what="a respawned provider, ready")
        # Back in service at once: no breaker open time to wait out.
        assert (await memory.ingest_run(_run(2)))["outcome"] == "recorded"
        hit = await memory.recall(query="ledger", repo=REPO)
        assert not hit.get("degraded")
        assert len(hit["episodes"]) == 2


@pytest.mark.slow
async def test_a_respawned_provider_that_passes_its_contract_check_closes_an_open_breaker(tmp_path: Path) -> None:
    """Threshold 1 and a 300 s open time: one crash opens the breaker; the new process's first call is
    the probe as soon as its contract check passed, and closes it."""
    files = FaultFiles(tmp_path / "fault")
    files.root.mkdir()
    store = await open_store(tmp_path / "m.db")
    breaker = Breaker(threshold=1, base_open=300.0)
    session = ProviderSession(
        provider="fault", store=store, metrics=Metrics(), provider_timeout=5.0, breaker=breaker,
        target=lambda: fault_provider_params("hang_recall", pid_file=files.pid, control_file=files.control,
                                             calls_file=files.calls))
    args = {"query": "ledger", "scope": [f"project:{REPO}"], "limit": 5}
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.run)
            await poll(lambda: session.status().state == "ready", what="ready")
            first = files.read_pid()

            async def doomed() -> None:
                with pytest.raises(Exception, match="closed"):
                    await provider_call(session.address, "memory_recall", args)

            async with trio.open_nursery() as calls:
                calls.start_soon(doomed)
                await poll(lambda: "memory_recall" in files.tools(), what="the recall in flight")
                files.set_modes()
                assert first is not None
                os.kill(first, signal.SIGKILL)
            assert breaker.state == "open"
            await poll(lambda: files.read_pid() not in (None, first) and session.status().state == "ready",
                       what="a respawned provider, ready")
            with trio.fail_after(10):
                out = await provider_call(session.address, "memory_recall", args)
            assert out["items"] == []
            assert breaker.state == "closed"
            nursery.cancel_scope.cancel()
    finally:
        store.close()
