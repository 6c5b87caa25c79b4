"""Moving up: `memactors store migrate --to postgresql://…` as a user runs it — the CLI as a
subprocess copies a real SQLite store (written by the service) into a real PostgreSQL database; every
table, every id and time kept; the built-in provider's documents re-indexed (recall finds them on
PostgreSQL); a verification count at the end; running it twice changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from memactors.store import Store
from memactors.store.engines import open_store
from memactors.store.facts import search_facts
from memactors.testing.postgres import Cluster
from support import run_record, wait_ready, write_config
from support_readside import API, as_run

pytestmark = pytest.mark.fleet

#: A log line: loguru's default format (`2026-12-02 02:57:17.123 | INFO     | mod:fn:1 - ...`) or the
#: daemon's (`2026-12-02T02:57:17.123+0000 INFO    ...`).
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\.\d+\S* (\| )?(TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR)")

TABLES = ("runs", "run_records", "run_paths", "episodes", "episode_bodies", "memory_index", "pending", "facts",
          "exposures", "votes", "pull_requests", "presence", "briefings", "run_callers", "call_log", "builtin_docs")



@asynccontextmanager
async def _ready_service(config: Path, home: Path) -> AsyncIterator[MemoryService]:
    """The embedded service on `config` (HOME = `home`), ready."""
    async with open_memory_service(ConfigHolder(lambda: load_config(config, env={"HOME": str(home)}))) as memory:
        await wait_ready(memory)
        yield memory


def migrate(config: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "memactors.cli", "store", "migrate", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


async def _counts(store: Store) -> dict[str, int]:
    return await store.read(lambda db: {t: int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
                                        for t in TABLES})


async def _rows(store: Store) -> dict[str, Any]:
    def read(db: Any) -> dict[str, Any]:
        return {
            "episodes": sorted(tuple(r) for r in db.execute(
                "SELECT e.episode_id, e.run_id, e.scope, e.started_at, e.recorded_at, e.forgotten_at, b.body"
                " FROM episodes e LEFT JOIN episode_bodies b ON b.id = e.body_id")),
            "runs": sorted(tuple(r) for r in db.execute(
                "SELECT r.harness, r.run_id, r.ended_at, r.ingested_at, rr.record FROM runs r"
                " LEFT JOIN run_records rr ON rr.id = r.record_id")),
            "index": sorted(tuple(r) for r in db.execute(
                "SELECT provider, provider_id, episode_id, recorded_at, forgotten_at FROM memory_index")),
            "facts": sorted(tuple(r) for r in db.execute(
                "SELECT id, scope, text, confidence, status, created_at, updated_at FROM facts")),
            "votes": sorted(tuple(r) for r in db.execute("SELECT fact_id, run_id, stance, counted, at FROM votes")),
            "exposures": sorted(tuple(r) for r in db.execute("SELECT run_id, fact_id, surface, at FROM exposures")),
        }

    return await store.read(read)


async def test_store_migrate_copies_every_table_keeps_ids_and_is_safe_to_run_twice(
        tmp_path: Path, pg_url: str, pg_cluster: Cluster) -> None:
    config = write_config(tmp_path)
    async with _ready_service(config, tmp_path) as memory:
        ids = [(await memory.ingest_run(run_record(run_id=f"r{n}", result_text=f"ledger rounding change {n}")))[
            "episode_id"] for n in range(12)]
        fact = await memory.add_fact(scope=f"project:{API}", text="ledger rounds half-even", confidence=0.8)
        await memory.link_pull_request(repo=API, branch="main", url="https://forge.example/acme/api/pull/7")
        token, view = await as_run(memory, "api-fixer", "r0", API)
        await memory.agent_recall(view, query="ledger rounding")  # exposure rows, call log rows
        await memory.agent_briefing(view, delivery="tool")  # a cached briefing
        await memory.cast_vote(fact_id=fact["id"], run_id="r1", harness="api-fixer", stance="support")
        await memory.forget(ids[3])  # a tombstone
    source = await open_store(tmp_path / "state" / "memactors.db")  # the call log is flushed at stop
    try:
        before = await _rows(source)
        source_counts = await _counts(source)
    finally:
        source.close()
    assert source_counts["call_log"] > 0 and source_counts["exposures"] > 0 and source_counts["briefings"] == 1

    first = migrate(config, tmp_path, "--to", pg_url, "--json")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["ok"] and pg_cluster.password not in first.stdout + first.stderr
    assert {t["table"]: (t["source"], t["target"]) for t in report["tables"]}["episodes"] == (12, 12)
    second = migrate(config, tmp_path, "--to", pg_url)  # safe to run twice
    assert second.returncode == 0, second.stderr
    assert "verified: every source row is in the target" in second.stdout
    # the user and host say where the copy went; only the password is hidden
    shown = pg_url.replace(f":{pg_cluster.password}@", ":[REDACTED]@")
    assert shown.startswith("postgresql://memactors:[REDACTED]@127.0.0.1:")
    assert f"to {shown}" in second.stdout and report["target"] == shown
    assert pg_cluster.password not in second.stdout + second.stderr
    # Only the command's own lines on the terminal: no log line of what it ran in-process,
    # in loguru's default format or the daemon's; those are in the state directory's store-migrate.log.
    for out in (first.stdout, first.stderr, second.stdout, second.stderr):
        assert not [line for line in out.splitlines() if LOG_LINE.search(line)], out
    assert "store migrated" in (tmp_path / "state" / "store-migrate.log").read_text()

    target = await open_store(pg_url)
    try:
        assert await _counts(target) == {**source_counts, "pending": source_counts["pending"]}
        after = await _rows(target)
        assert after == before  # ids, times, texts, tombstones: the same rows
        docs = await target.read(lambda db: db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0])
        assert docs == 11  # the forgotten episode's document went with its forget
    finally:
        target.close()

    # The daemon on the migrated store: recall finds the episodes (re-indexed), facts are searchable.
    pg_config = write_config(tmp_path, store_url=pg_url)
    async with _ready_service(pg_config, tmp_path) as memory:
        found = await memory.recall(query="ledger rounding change", repo=API, limit=20)
        assert set(e["episode_id"] for e in found["episodes"]) == set(ids) - {ids[3]}
        hits = await memory.store.read(lambda db: search_facts(
            db, query="half-even", scopes=[f"project:{API}"], limit=5))
        assert [f.id for f in hits] == [fact["id"]]
        new = await memory.ingest_run(run_record(run_id="after-move", result_text="ledger after the move"))
        assert new["outcome"] == "recorded"  # ids from PostgreSQL's sequences: no clash with copied rows


async def test_store_migrate_refuses_while_the_daemon_runs_and_names_no_password(
        tmp_path: Path, pg_url: str, pg_cluster: Cluster) -> None:
    from memactors.daemon import lock_state_dir

    config = write_config(tmp_path)
    async with _ready_service(config, tmp_path):
        pass  # a store to migrate, made by a service that has stopped since
    lock = await trio.to_thread.run_sync(lock_state_dir, tmp_path / "state")
    try:
        refused = migrate(config, tmp_path, "--to", pg_url)
    finally:
        os.close(lock)
    assert refused.returncode != 0 and "in use by another memactors daemon" in refused.stderr
    bad = migrate(config, tmp_path, "--to", "mysql://u:hunter2@db/x")
    assert bad.returncode != 0 and "hunter2" not in bad.stderr and "--to" in bad.stderr
