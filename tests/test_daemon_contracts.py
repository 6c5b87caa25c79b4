"""Contracts the daemon keeps as a whole (issue 10): facts status, exported series, state directory."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import trio

from memactors.config import load_config
from memactors.daemon import run_daemon
from memactors.rpc import RpcError, connect_rpc, read_token
from support import example, write_config

SERVICE = "harness.v1.MemoryService"


async def _daemon(nursery: trio.Nursery, path: Path):  # type: ignore[no-untyped-def]
    return await nursery.start(lambda task_status: run_daemon(lambda: load_config(path), task_status=task_status))


@pytest.mark.req14
async def test_add_fact_honours_status_and_rejects_an_unknown_one_by_name(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    async with trio.open_nursery() as nursery:
        listening = await _daemon(nursery, path)
        control = read_token(tmp_path / "state", "control")
        async with connect_rpc(listening.operator, control) as rpc:
            base = {"scope": "project:forge.example/acme/api", "confidence": 0.9}
            retired = await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "ledger uses floats", "status": "retired"})
            suspect = await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "ledger flake is DNS", "status": "suspect"})
            live = await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "ledger uses decimals"})
            assert (retired["status"], suspect["status"], live["status"]) == ("retired", "suspect", "live")
            with pytest.raises(RpcError) as bad:
                await rpc.call(f"{SERVICE}/AddFact", {**base, "text": "x", "status": "promoted"})
            assert bad.value.code == "INVALID_ARGUMENT" and "status" in str(bad.value)
            hit = await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "repo": "forge.example/acme/api"})
            served = {f["text"]: f for f in hit["facts"]}
            assert "ledger uses floats" not in served  # a retired fact is never served as live
            assert "ledger uses decimals" in served
        nursery.cancel_scope.cancel()


@pytest.mark.req21
async def test_metrics_export_no_created_series(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    async with trio.open_nursery() as nursery:
        listening = await _daemon(nursery, path)
        control = read_token(tmp_path / "state", "control")
        async with connect_rpc(listening.operator, control) as rpc:
            await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})
            await rpc.call(f"{SERVICE}/Recall", {"query": "ledger", "repo": "forge.example/acme/api"})
        async with httpx2.AsyncClient() as http:
            text = (await http.get(listening.metrics)).text
        assert "harness_memory_episodes_recorded_total{" in text  # counters were touched
        assert "harness_memory_provider_duration_seconds_count{" in text
        assert "_created" not in text
        nursery.cancel_scope.cancel()
