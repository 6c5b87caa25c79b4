"""The call log: bounded fields, batched writes off the request path, flushed on stop, pruned by retention."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from fix_providers import poll
from memactors.actors.call_log import CallLog
from memactors.config import ConfigHolder
from memactors.logs import configure_logging
from memactors.service import DB_NAME, open_memory_service
from memactors.store import MAX_FIELD_CHARS, bound_field, iso
from memactors.store.engines import open_store
from support import serving, wait_ready


def _db_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.iterdir() if p.name.startswith(DB_NAME))


async def _checkpointed(service: Any) -> None:
    """The WAL copied into the database and truncated, so the bytes on disk are the stored rows, not
    how many write transactions the batching happened to make (each appends whole 8 KiB pages)."""
    # A read by one of the service's own loops can keep a checkpoint from completing: try again.
    await poll(service.store.checkpoint, what="a complete WAL checkpoint")


def test_a_caller_supplied_string_is_bounded_and_loses_its_control_characters() -> None:
    assert bound_field("memory_forget") == "memory_forget"
    huge = bound_field("x" * (1 << 20))
    assert len(huge) <= MAX_FIELD_CHARS and huge.endswith("[1048576 chars]")
    assert bound_field("evil\n2026 INFO fake line\x1b[31m") == "evil?2026 INFO fake line?[31m"


@pytest.mark.req2
@pytest.mark.slow
async def test_fifty_refused_calls_with_one_mib_tool_names_add_little_to_the_db_and_no_long_log_line(
        tmp_path: Path, make_holder: Callable[[str], ConfigHolder]) -> None:
    sink = io.StringIO()
    configure_logging(sink=sink)
    try:
        async with serving(make_holder("")) as (service, url):
            await service.call_log.flush()
            await _checkpointed(service)
            before = _db_bytes(tmp_path / "state")
            # Raw JSON-RPC on a 2025-06-18 session, as an attacker's script would send it: the SDK client
            # mirrors the tool name into an Mcp-Name header, which hypercorn refuses past 16 KiB anyway.
            async with httpx2.AsyncClient(timeout=60) as http:
                headers = {"accept": "application/json, text/event-stream"}
                init = await http.post(url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "attacker", "version": "1"}}})
                assert init.status_code == 200, init.text
                assert "mcp-session-id" not in init.headers  # no token: served without a session
                headers["mcp-protocol-version"] = "2025-06-18"
                await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
                started = trio.current_time()
                for i in range(50):
                    reply = await http.post(url, headers=headers, json={
                        "jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                        "params": {"name": f"zep__{i}" + "A" * (1 << 20), "arguments": {"id": "ep_x"}}})
                    assert reply.status_code == 200 and "not_permitted" in reply.text
                    assert len(reply.content) < 4096  # the refusal does not echo the name either
                span = trio.current_time() - started
            await service.call_log.flush()
            rows = await service.store.read(lambda db: db.execute(
                "SELECT caller, server, tool, outcome FROM call_log WHERE outcome = 'denied'").fetchall())
            await _checkpointed(service)
            grown = _db_bytes(tmp_path / "state") - before
    finally:
        configure_logging()
    assert len(rows) == 50
    assert all(len(tool) <= MAX_FIELD_CHARS and caller == "unattributed" for caller, _, tool, _ in rows)
    assert {server for _, server, _, _ in rows} == {"zep"}
    assert grown < 256 * 1024, grown  # was 53 MB: the raw names were stored
    lines = sink.getvalue().splitlines()
    assert max(len(line) for line in lines) < 1000
    # rate-limited per caller: a line per 10 s window at most (the gateway's LogThrottle), however long the
    # 50 calls took (a loaded machine took over 20 s) — not one per call
    refused = [line for line in lines if "gateway call refused" in line]
    assert len(refused) <= 2 + int(span // 10), (len(refused), span)


async def test_rows_are_written_in_batches_and_a_clean_stop_writes_what_is_queued(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "m.db")
    try:
        calls = CallLog(store, batch=100, interval=0.1)
        async with trio.open_nursery() as nursery:
            await nursery.start(calls.run)
            for i in range(250):
                calls.record(at=iso(datetime.now(UTC)), caller="daemon", server="builtin", tool=f"t{i}",
                             arguments={"i": i}, outcome="ok", duration_ms=1)
            await calls.flush()
            assert calls.written == 250
            for _ in range(7):  # queued, not yet written when the stop comes
                calls.record(at=iso(datetime.now(UTC)), caller="daemon", server="builtin", tool="late",
                             arguments={}, outcome="ok", duration_ms=1)
            nursery.cancel_scope.cancel()
        count = await store.read(lambda db: db.execute("SELECT count(*) FROM call_log").fetchone()[0])
        assert count == 257
        assert calls.dropped == 0
    finally:
        store.close()


async def test_a_full_queue_drops_and_counts_rows_instead_of_waiting(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "m.db")
    try:
        calls = CallLog(store, capacity=10)
        for _ in range(15):  # no writer running: the queue fills, record() never blocks
            calls.record(at="2026-01-01T00:00:00.000000Z", caller="c", server="s", tool="t", arguments={},
                         outcome="ok", duration_ms=0)
        assert calls.dropped == 5
    finally:
        store.close()


@pytest.mark.req13
async def test_retention_prunes_the_call_log_with_the_episodes(
        make_holder: Callable[[str], ConfigHolder]) -> None:
    async with open_memory_service(make_holder('[memory.episodes]\nretention = "1d"\n')) as service:
        await wait_ready(service)
        now = service.wall_clock()
        for age in (timedelta(days=3), timedelta(hours=2)):
            service.call_log.record(at=iso(now - age), caller="daemon", server="builtin", tool="memory_recall",
                                    arguments={}, outcome="ok", duration_ms=1)
        await service.call_log.flush()
        await service.retention.prune()
        ats = await service.store.read(lambda db: [r[0] for r in db.execute(
            "SELECT at FROM call_log WHERE tool = 'memory_recall' AND caller = 'daemon'"
            " AND at < ?", [iso(now - timedelta(hours=1))]).fetchall()])
    assert ats == [iso(now - timedelta(hours=2))]

