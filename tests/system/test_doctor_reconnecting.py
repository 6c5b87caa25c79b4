"""While PostgreSQL reconnects, doctor names the real cause (`reconnecting to …`), never a
disk-full message it did not observe. A real PostgreSQL (memactors.testing.postgres) stopped and started
under a running daemon, doctor as a subprocess; and the row itself for the errors a reconnect leaves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from fix_daemon import Daemon, start_daemon
from memactors.doctor import store_rows
from memactors.testing.postgres import Cluster
from support import write_config

DISK_WORDS = ("RESOURCE_EXHAUSTED", "disk", "space", "free")


async def doctor(daemon: Daemon) -> str:
    done = await trio.run_process([sys.executable, "-m", "memactors.cli", "doctor"], env=daemon.env,
                                  capture_stdout=True, capture_stderr=True, check=False)
    return next(line for line in done.stdout.decode().splitlines() if "memory store" in line)


@pytest.mark.slow
@pytest.mark.fleet
async def test_doctor_says_reconnecting_while_postgresql_is_down_and_passes_when_it_is_back(tmp_path: Path) -> None:
    with Cluster() as cluster:
        url = cluster.create_database("memory")
        server = f"memactors@127.0.0.1:{cluster.port}/memory"
        daemon = await trio.to_thread.run_sync(lambda: start_daemon(
            tmp_path, config=write_config(tmp_path, store_url=url)))
        try:
            assert (await doctor(daemon)).startswith("PASS")
            await trio.to_thread.run_sync(cluster.stop)
            for _ in range(3):
                row = await doctor(daemon)
                assert row.startswith("FAIL") and f"reconnecting to {server}" in row, row
                assert not [w for w in DISK_WORDS if w in row], row
                assert cluster.password not in row
            await trio.to_thread.run_sync(cluster.start)
            seen = []
            with trio.fail_after(60):
                while not (row := await doctor(daemon)).startswith("PASS"):  # the pools reconnect by themselves
                    seen.append(row)
            for row in seen:  # on the way back too: never a full disk
                assert f"reconnecting to {server}" in row and not [w for w in DISK_WORDS if w in row], row
        finally:
            await trio.to_thread.run_sync(daemon.stop)


PG = {"engine": "postgresql", "where": "postgresql memactors@db.internal:5432/memory", "daemon_id": "vm-1",
      "reachable": True, "writable": False, "free_bytes": None}


def test_a_refused_write_on_postgresql_is_a_reconnect_unless_the_server_said_its_disk_is_full() -> None:
    """The write pool's connection died with the server (reads already reconnected): the row says so."""
    [lost] = store_rows({**PG, "error": "store memactors@db.internal:5432/memory cannot be written: "
                                        "terminating connection due to administrator command"})
    assert lost.status == "fail" and "reconnecting to memactors@db.internal:5432/memory" in lost.message
    assert not [w for w in DISK_WORDS if w in lost.message]
    [unknown] = store_rows({**PG, "error": None})
    assert "reconnecting to" in unknown.message and "disk" not in unknown.message
    [full] = store_rows({**PG, "error": "cannot be written: could not extend file: No space left on device"})
    assert "RESOURCE_EXHAUSTED" in full.message and "reconnecting" not in full.message
    [sqlite] = store_rows({"engine": "sqlite", "path": "/s/memactors.db", "reachable": True, "writable": False,
                           "free_bytes": 1024, "error": "database or disk is full"})
    assert "RESOURCE_EXHAUSTED" in sqlite.message and "1.0 KiB free" in sqlite.message
