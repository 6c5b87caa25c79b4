"""The store's group commit: concurrent writes share a transaction, each still whole or not at all."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlite_utils
import trio

from memactors.store import Store
from memactors.store.engines import open_store


@pytest.fixture
async def store(tmp_path: Path, store_url: str | None) -> AsyncIterator[Store]:
    s = await open_store(store_url or tmp_path / "m.db")
    await s.write(lambda db: db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"))
    try:
        yield s
    finally:
        s.close()


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110 -- waits on the store's queue state, no timing
            await trio.lowlevel.checkpoint()


@pytest.mark.both_engines
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


@pytest.mark.both_engines
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


async def test_an_existing_store_moves_its_texts_and_drops_the_episode_text_copy(tmp_path: Path) -> None:
    """Migrations 0007 and 0008 on a store written before them (episodes with `body` and `text`, runs
    with `record`): `episodes.text` goes, the body and the run record move to their own tables, and
    the text the retry loop sends is rendered from the body byte for byte as the old column held it."""
    import sqlean

    from memactors._wire import episode_json, parse_run_record
    from memactors.episode import SessionRepo, assemble, render_text, stored_record
    from memactors.store.episodes import stored_copy
    from memactors.store.run_history import record_json
    from support import example

    rec = stored_record(parse_run_record(example("run-42-api-fixer.json")))
    ep = assemble(rec, {s.session_id: SessionRepo(key="forge.example/acme/api", cwd=s.cwd) for s in rec.sessions},
                  excerpt_chars=600)
    path = tmp_path / "old.db"
    (await open_store(path)).close()
    db = sqlean.connect(str(path), isolation_level=None)
    db.executescript(  # back to the layout before 0007 (so before the later migrations too)
        """
        DROP TRIGGER agent_runs_forget; DROP TABLE agent_runs;
        DELETE FROM _sqlite_migrations WHERE name = '0010_agent_runs';
        ALTER TABLE episodes DROP COLUMN body_id; ALTER TABLE runs DROP COLUMN record_id;
        DROP TABLE episode_bodies; DROP TABLE run_records;
        ALTER TABLE episodes ADD COLUMN body TEXT; ALTER TABLE episodes ADD COLUMN text TEXT;
        ALTER TABLE runs ADD COLUMN record TEXT NOT NULL DEFAULT '';
        DELETE FROM _sqlite_migrations WHERE name IN ('0007_episode_text_from_body', '0008_texts_in_their_own_tables');
        """)
    record = record_json({"harness": rec.harness, "run_id": rec.run_id, "result_text": rec.result_text})
    db.execute("INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
               " repo, branch, record, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
               [rec.harness, rec.run_id, rec.adapter, rec.started_at, rec.ended_at, rec.outcome, rec.reason,
                rec.duration_ms, ep.repo, ep.branch, record, rec.ended_at])
    db.execute("INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
               " started_at, recorded_at, body, text) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
               [ep.episode_id, ep.harness, ep.run_id, ep.repo, ep.branch, ep.scope, ep.trust_class, ep.outcome,
                ep.started_at, ep.started_at, episode_json(ep), render_text(ep)])
    db.close()
    s = await open_store(path)
    try:
        columns = await s.read(lambda db: {t: [c.name for c in db[t].columns] for t in ("episodes", "runs")})
        body = await s.read(lambda db: db.execute(
            "SELECT b.body FROM episodes e JOIN episode_bodies b ON b.id = e.body_id").fetchone()[0])
        moved = await s.read(lambda db: db.execute(
            "SELECT rr.record FROM runs r JOIN run_records rr ON rr.id = r.record_id").fetchone()[0])
    finally:
        s.close()
    assert not {"text", "body"} & set(columns["episodes"]) and "record" not in columns["runs"]
    assert body == episode_json(ep) and moved == record
    assert stored_copy(body)[1] == render_text(ep)


async def test_a_bulk_write_leaves_no_wal_at_its_high_water_mark(tmp_path: Path) -> None:
    """One big transaction (a bulk ingest) grows the WAL past WAL_SIZE_LIMIT; once checkpointed and
    reused by the next writes it is truncated back, not kept at tens of MB for the daemon's life."""
    from memactors.store.sqlite import WAL_SIZE_LIMIT

    path = tmp_path / "memactors.db"
    store = await open_store(path)
    wal = path.with_name(path.name + "-wal")
    try:
        text = "x" * 20_000

        def bulk(db: sqlite_utils.Database) -> None:
            for i in range(3 * WAL_SIZE_LIMIT // len(text)):
                db.execute("INSERT INTO builtin_meta (key, value) VALUES (?, ?)", [f"bulk{i}", text])

        await store.write(bulk)
        assert wal.stat().st_size > 2 * WAL_SIZE_LIMIT
        for _ in range(3):
            await store.write(lambda db: db.execute(
                "INSERT OR REPLACE INTO builtin_meta (key, value) VALUES ('small', 'write')"))
        assert wal.stat().st_size <= WAL_SIZE_LIMIT
    finally:
        store.close()


async def test_opening_a_store_twice_in_one_process_keeps_the_first_ones_wal_when_another_process_closes_the_file(
        tmp_path: Path) -> None:
    """Opening a store never opens and closes the database file itself: closing any descriptor on a file
    drops every POSIX lock this process holds on it, so another process's connection, seeing no reader
    at its close, would delete the -wal and -shm under the open store, and its later writes, acknowledged,
    would go to a deleted file (an embedder or a bench opening one file twice in one process)."""
    import sys

    path = tmp_path / "memactors.db"
    (await open_store(path)).close()
    path.chmod(0o644)
    first = await open_store(path)
    second = await open_store(path)
    assert path.stat().st_mode & 0o777 == 0o600  # an existing file is still made private, not reopened
    other_process = ("import sqlean, sys; c = sqlean.connect(sys.argv[1]);"
                     " print(c.execute('SELECT count(*) FROM t').fetchone()[0]); c.close()")
    try:
        await first.write(lambda db: db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)"))
        await first.write(lambda db: db.execute("INSERT INTO t (k) VALUES (1)"))
        run = await trio.run_process([sys.executable, "-c", other_process, str(path)], capture_stdout=True)
        assert run.stdout.strip() == b"1"
        assert path.with_name(path.name + "-wal").exists()  # the other process saw the open store's locks
        await first.write(lambda db: db.execute("INSERT INTO t (k) VALUES (2)"))
        run = await trio.run_process([sys.executable, "-c", other_process, str(path)], capture_stdout=True)
        assert run.stdout.strip() == b"2"
    finally:
        second.close()
        first.close()
