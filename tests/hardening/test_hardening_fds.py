"""Read connections do not leak: the daemon's open fds stay flat however its worker threads come and go."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from fix_daemon import daemon_process
from memactors.rpc.client import connect_rpc
from memactors.store.engines import open_store
from memactors.store.sqlite import READ_CONNECTIONS
from support import example

SERVICE = "harness.v1.MemoryService"


async def test_reads_share_a_bounded_pool_of_connections(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "memory.db")
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(store.read, lambda db: db.execute("SELECT count(*) FROM episodes").fetchone())
        assert 1 <= store.read_connections <= READ_CONNECTIONS
    finally:
        store.close()
    assert store.read_connections == 0


@pytest.mark.slow
async def test_open_fds_stay_flat_over_bursts_of_concurrent_recalls_with_idle_gaps(tmp_path: Path) -> None:
    """25 bursts of 16 concurrent recalls through the real daemon, each followed by an idle gap longer
    than the daemon's worker-thread idle timeout (shortened from trio's 10 s to 0.05 s in the child, so
    every gap retires the threads that served the burst). Before the pool, every retired thread left a
    SQLite connection (two fds: the file and its WAL) behind, +4..8 fds a burst; now the only growth
    after the first burst is the pool filling up to its bound, whatever the number of bursts. 25 bursts
    (not 100: a quarter of the CPU and wall) still make a leak of +4 a burst ~12 times the bound."""
    with daemon_process(tmp_path, thread_idle=0.05) as daemon:
        async with connect_rpc(daemon.info["operator"], daemon.token("control")) as rpc:
            await rpc.call(f"{SERVICE}/IngestRun", {"record": example("run-42-api-fixer.json")})

            async def burst() -> None:
                async with trio.open_nursery() as nursery:
                    for _ in range(16):
                        nursery.start_soon(rpc.call, f"{SERVICE}/Recall",
                                           {"query": "flaky ledger", "repo": "forge.example/acme/api"})

            counts = []
            for _ in range(25):
                await burst()
                await trio.sleep(0.2)  # noqa: ASYNC251 -- an idle gap is the condition under test
                counts.append(daemon.fds())
        assert daemon.proc.poll() is None
    assert max(counts) - counts[0] <= 2 * READ_CONNECTIONS, counts  # the pool's bound, not the burst count
