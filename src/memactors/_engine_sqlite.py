"""The SQLite engine of the store: the embedded default (one file in the state directory).

Connections come from sqlean-py (SQLite 3.50 with FTS5 and extension loading; the stdlib sqlite3 here
cannot load sqlite-vec) wrapped in sqlite-utils. The schema is the sqlite-utils `Migrations` in
`store.py`. Only this module and the built-in provider's SQLite half know they run on SQLite.

Readers: a bounded pool, at most as many as the read limiter admits at once, opened lazily, checked out
for one call and handed back, closed by `close()`. Connections are never tied to worker threads,
because trio retires idle worker threads and a per-thread connection would outlive its thread (an fd
leak).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlean
import sqlite_utils
import sqlite_vec
import trio

from .store import Store, _WriteJob, fts_match, migrations, private_dir, private_file, run_jobs
from .store_health import WriteHealth

T = TypeVar("T")

#: The page size of a new store (an existing one keeps the page size it was created with).
PAGE_SIZE = 8192
#: Read connections open at most at once (the read limiter's size).
READ_CONNECTIONS = 4


class SqliteDialect:
    """The SQL that is SQLite's own, for code that runs on both engines (see `store.Db`)."""

    name = "sqlite"

    def retryable(self, exc: BaseException) -> bool:
        """Whether a write that raised `exc` may simply be run again: never on SQLite (one writer)."""
        return False

    def skip_locked(self, table: str) -> str:
        """Row locks for a claim: none needed, the single writer serialises every claim."""
        return ""

    def contains(self, column: str) -> str:
        """A condition: `column` contains the next parameter as a substring (case-sensitive)."""
        return f"instr({column}, ?) > 0"

    # -- facts (FTS5 `facts_fts`, rowid = facts.fts_rowid) ------------------------------------------
    def upsert_fact(self, db: Db, *, fact_id: str, scope: str, text: str, confidence: float, status: str,
                    at: str) -> str:
        """Insert or update a fact and its full-text row; returns its created_at."""
        existing = db.execute("SELECT fts_rowid, created_at FROM facts WHERE id = ?", [fact_id]).fetchone()
        if existing is None:
            (rowid,) = db.execute("SELECT COALESCE(MAX(fts_rowid), 0) + 1 FROM facts").fetchone()
            created_at = at
            db.execute(
                "INSERT INTO facts (id, fts_rowid, scope, text, confidence, status, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [fact_id, rowid, scope, text, confidence, status, at, at],
            )
        else:
            rowid, created_at = existing
            db.execute(
                "UPDATE facts SET scope = ?, text = ?, confidence = ?, status = ?, updated_at = ? WHERE id = ?",
                [scope, text, confidence, status, at, fact_id],
            )
            db.execute("DELETE FROM facts_fts WHERE rowid = ?", [rowid])
        db.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", [rowid, text])
        return str(created_at)

    def search_facts(self, db: Db, *, columns: str, query: str, scopes: Sequence[str], limit: int) -> list[Any] | None:
        """Live and suspect facts in `scopes` matching any word of `query`, best BM25 first, then
        confidence, then id; None when the query has no words."""
        match = fts_match(query)
        if match is None:
            return None
        marks = ", ".join("?" for _ in scopes)
        return db.execute(
            f"SELECT {columns} FROM facts_fts JOIN facts f ON f.fts_rowid = facts_fts.rowid"
            f" WHERE facts_fts MATCH ? AND f.status IN ('live', 'suspect') AND f.scope IN ({marks})"
            " ORDER BY bm25(facts_fts), f.confidence DESC, f.id LIMIT ?",
            [match, *scopes, limit],
        ).fetchall()


DIALECT = SqliteDialect()


class SqliteDb(sqlite_utils.Database):
    """sqlite-utils' Database, plus what `store.Db` asks of either engine."""

    dialect = DIALECT

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)


# `store.Db` is a Protocol; the name is imported for annotations here.
Db = SqliteDb


def _fts_secure_delete(db: sqlite_utils.Database) -> None:
    """FTS5's secure-delete: a deleted document's terms leave the full-text index at once instead of
    waiting for a segment merge (the built-in provider's index holds episode text)."""
    for table in ("builtin_fts",):
        if db[table].exists():
            db.execute(f"INSERT INTO {table}({table}, rank) VALUES ('secure-delete', 1)")


def _connect(path: Path) -> SqliteDb:
    conn = sqlean.connect(str(path), check_same_thread=False, isolation_level=None)
    # sqlite-vec on every connection: the built-in provider's vec0 table lives in this file (REQ-11).
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    # Deleted rows (a forgotten episode, its run record's text) are overwritten with zeros rather than
    # left readable in free pages and freed cells (REQ-10: forget removes every copy).
    conn.execute("PRAGMA secure_delete = ON")
    # A new store gets 8 KiB pages (before WAL: the page size is fixed once the file is written; an
    # existing store keeps its own). An episode row (REQ-5 body + text, ~2-2.5 KB) leaves about half of
    # a 4 KiB page unused; at 8 KiB the store is ~15 % smaller for the same rows (docs/benchmarks.md).
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA synchronous = NORMAL")
    return SqliteDb(conn)


class SqliteStore(Store):
    """The store on one SQLite file. Open with `await Store.open(path)`."""

    engine = "sqlite"

    def __init__(self, path: Path, writer: SqliteDb, *, daemon_id: str = "local") -> None:
        super().__init__(daemon_id=daemon_id)
        self.path = path
        self._writer = writer
        self._read_limiter = trio.CapacityLimiter(READ_CONNECTIONS)
        self._idle_readers: list[SqliteDb] = []
        self._readers: list[SqliteDb] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self.health = WriteHealth(path)

    @classmethod
    async def connect(cls, path: Path, *, daemon_id: str = "local") -> SqliteStore:
        """Create the state directory and database if missing and apply pending migrations."""

        def setup() -> SqliteDb:
            private_dir(path.parent)
            private_file(path)  # SQLite creates -wal and -shm with the database file's mode
            db = _connect(path)
            migrations.apply(db)
            _fts_secure_delete(db)
            return db

        return cls(path, await trio.to_thread.run_sync(setup), daemon_id=daemon_id)

    @property
    def where(self) -> str:
        return f"sqlite {self.path}"

    async def _write_batch(self, batch: list[_WriteJob]) -> None:
        await trio.to_thread.run_sync(lambda: run_jobs(self._writer, batch, begin="BEGIN IMMEDIATE"))

    async def checkpoint(self) -> bool:
        """Copy the WAL into the database and truncate it to zero bytes, so page images holding deleted
        rows do not linger in `-wal` (after a forget). False when a reader kept it from completing."""

        def run() -> bool:
            busy = self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            return not busy

        async with self._write_lock:
            return await trio.to_thread.run_sync(run)

    async def read(self, fn: Callable[[Any], T]) -> T:
        return await trio.to_thread.run_sync(self._read_sync, fn, limiter=self._read_limiter)

    @property
    def read_connections(self) -> int:
        """How many read connections are open (at most READ_CONNECTIONS)."""
        with self._readers_lock:
            return len(self._readers)

    def _checkout(self) -> SqliteDb:
        with self._readers_lock:
            if self._closed:
                raise RuntimeError("store is closed")
            if self._idle_readers:
                return self._idle_readers.pop()
        # The read limiter admits at most READ_CONNECTIONS callers, so the pool never grows past it.
        db = _connect(self.path)
        with self._readers_lock:
            self._readers.append(db)
        return db

    def _checkin(self, db: SqliteDb) -> None:
        with self._readers_lock:
            if self._closed:
                db.conn.close()
            else:
                self._idle_readers.append(db)

    def _read_sync(self, fn: Callable[[Any], T]) -> T:
        db = self._checkout()
        try:
            db.execute("BEGIN")
            try:
                return fn(db)
            finally:
                db.execute("COMMIT")
        finally:
            if db.conn.in_transaction:
                # BEGIN or COMMIT failed: a connection stuck in a transaction is closed, not reused.
                with self._readers_lock:
                    if db in self._readers:
                        self._readers.remove(db)
                db.conn.close()
            else:
                self._checkin(db)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._readers_lock:
            for db in self._idle_readers:
                db.conn.close()
            self._idle_readers.clear()
            self._readers.clear()
        self._writer.conn.close()
