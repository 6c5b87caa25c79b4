"""The store's group commit: concurrent writes share a transaction, each still whole or not at all."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlite_utils
import trio

from memactors.store import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "m.db")
    await s.write(lambda db: db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"))
    try:
        yield s
    finally:
        s.close()


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 -- waits on the store's queue state, no timing
            await trio.lowlevel.checkpoint()


async def test_concurrent_writes_share_one_transaction_and_a_failing_one_rolls_back_alone(store: Store) -> None:
    gate = threading.Event()
    results: dict[int, object] = {}

    def first(db: sqlite_utils.Database) -> int:
        gate.wait(10)
        db.execute("INSERT INTO t VALUES (0, 'first')")
        return 0

    def insert(k: int):  # type: ignore[no-untyped-def]
        def fn(db: sqlite_utils.Database) -> int:
            db.execute("INSERT INTO t VALUES (?, ?)", [k, f"v{k}"])
            if k == 7:
                raise ValueError("write 7 fails after its insert")
            return k
        return fn

    async def run(k: int) -> None:
        try:
            results[k] = await store.write(insert(k) if k else first)
        except ValueError as exc:
            results[k] = exc

    before = store.transactions
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, 0)
        await _until(lambda: store.transactions == before + 1)
        for k in range(1, 31):
            nursery.start_soon(run, k)
        await _until(lambda: len(store._write_queue) == 30)
        gate.set()
    assert store.transactions == before + 2  # the first alone, then the 30 queued in one transaction
    assert isinstance(results.pop(7), ValueError)
    assert results == {k: k for k in range(31) if k != 7}
    keys = await store.read(lambda db: [r[0] for r in db.execute("SELECT k FROM t ORDER BY k")])
    assert keys == [k for k in range(31) if k != 7]


async def test_a_write_cancelled_while_queued_never_runs(store: Store) -> None:
    gate = threading.Event()

    def slow(db: sqlite_utils.Database) -> None:
        gate.wait(10)
        db.execute("INSERT INTO t VALUES (1, 'slow')")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.write, slow)
        await _until(lambda: store.transactions >= 2)
        with trio.CancelScope() as scope:
            async def queued() -> None:
                await store.write(lambda db: db.execute("INSERT INTO t VALUES (2, 'cancelled')"))
            inner = trio.CancelScope()

            async def run_queued() -> None:
                with inner:
                    await queued()
            nursery.start_soon(run_queued)
            await _until(lambda: len(store._write_queue) == 1)
            inner.cancel()
            await _until(lambda: len(store._write_queue) == 0)
            gate.set()
        assert not scope.cancelled_caught
    keys = await store.read(lambda db: [r[0] for r in db.execute("SELECT k FROM t")])
    assert keys == [1]


async def test_issue11_an_existing_store_drops_the_episode_text_copy_and_keeps_the_body(tmp_path: Path) -> None:
    """Migration 0007 on a store written before it: `episodes.text` goes, the body stays, and the text
    the retry loop sends is rendered from the body byte for byte as the old column held it."""
    import sqlean

    from memactors._wire import episode_json, parse_run_record
    from memactors.actors.index import stored_copy
    from memactors.episode import SessionRepo, assemble, render_text, stored_record
    from support import example

    rec = stored_record(parse_run_record(example("run-42-api-fixer.json")))
    ep = assemble(rec, {s.session_id: SessionRepo(key="forge.example/acme/api", cwd=s.cwd) for s in rec.sessions},
                  excerpt_chars=600)
    path = tmp_path / "old.db"
    (await Store.open(path)).close()
    db = sqlean.connect(str(path), isolation_level=None)
    db.executescript("ALTER TABLE episodes ADD COLUMN text TEXT;"
                     " DELETE FROM _sqlite_migrations WHERE name = '0007_episode_text_from_body';")
    db.execute("INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
               " started_at, recorded_at, body, text) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
               [ep.episode_id, ep.harness, ep.run_id, ep.repo, ep.branch, ep.scope, ep.trust_class, ep.outcome,
                ep.started_at, ep.started_at, episode_json(ep), render_text(ep)])
    db.close()
    s = await Store.open(path)
    try:
        columns = await s.read(lambda db: [c.name for c in db["episodes"].columns])
        body = await s.read(lambda db: db.execute("SELECT body FROM episodes").fetchone()[0])
    finally:
        s.close()
    assert "text" not in columns and "body" in columns
    assert stored_copy(body)[1] == render_text(ep)
