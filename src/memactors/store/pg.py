"""The PostgreSQL engine of the store: one memory for daemons on many hosts (docs/fleet.md).

`[store] url = "postgresql://…"` (or ``MEMACTORS_STORE_URL``) puts the whole store here: the same tables
as the SQLite file, the same `Store.write` / `Store.read` semantics (one writer with group commit, a
bounded pool of readers, all in worker threads), and the same SQL wherever the two engines agree (see
`store.Db`). What is PostgreSQL's own lives in this module: the schema and its versioned migrations,
the connection pools, row locks for claims, advisory locks for fleet-wide singletons, and full-text
search over facts (`tsvector`, the ``english`` configuration).

Connections: psycopg 3 with psycopg_pool (docs/dependencies.md says why not a trio-native driver), one
pool of one connection for the writer and one of up to READ_CONNECTIONS for readers, in autocommit mode
with explicit BEGIN / COMMIT (as the SQLite engine does). Every wait for a connection has a deadline
(`connect_timeout`); reads are abandoned at their caller's deadline (a worker thread finishes them);
writes never are (they commit whole or fail whole, and the caller is told which).

Failure is contained like a provider's: a refused, dropped or timed-out connection becomes
`StoreUnavailable` (UNAVAILABLE over RPC) naming the store as ``user@host:port/db`` — never the password
— and the pools reconnect by themselves when the server is back.

A caller never pays for the pools' dead connections. A pooled connection is looked at as it
is checked out (`_usable`: has the server said anything on it while it sat idle — a FATAL on restart or
`pg_terminate_backend`, a FIN, a reset — or is it on a server that cannot take writes?) and replaced
when it is dead; and a statement that fails because the connection is gone is run again on a fresh
one, but only when nothing can have been committed (reads always; writes only when the COMMIT was
never sent, `_rerun_batch` says why). Every connection asks for ``target_session_attrs=read-write``
unless the URL names one: with a libpq multi-host URL (``postgresql://h1:5432,h2:5432/db``) the pools
find the primary after a failover, never read from or write to a standby, and a writer on a server made
read-only (a demoted primary) notices on its next write and reconnects.

Concurrency between daemons: everything two daemons could both do is done once. A due pending row is
claimed under ``FOR UPDATE SKIP LOCKED`` (`dialect.skip_locked`); migrations run under a transaction-level
advisory lock; the hourly prune under a session-level one (`PgStore.singleton`). Writes that lose a
deadlock or serialization race against another daemon are run again (`dialect.retryable`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from functools import lru_cache
from importlib import resources
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import trio
from loguru import logger
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import ConfigError, StoreUnavailable
from ..urls import MASK, mask_url
from . import Db, Store, _WriteJob, iso, run_jobs, utc_now
from .builtin_docs import words_stay_words

T = TypeVar("T")

#: Read connections open at most at once (the readers' pool size).
READ_CONNECTIONS = 4
#: Seconds to wait for a connection (a pool's, or a new one) before the store is called unavailable.
CONNECT_TIMEOUT = 2.0
#: Seconds to wait for a pooled connection while the server is known to be down.
FAIL_FAST = 0.25
#: How many times a read, or a write batch that never reached its COMMIT, is tried when the server
#: closed its connection under it (a restart, `pg_terminate_backend`, a reset, a failover).
ATTEMPTS = 3
#: The ``target_session_attrs`` every connection asks for unless the URL names one (config refuses the
#: values that would allow a standby): a multi-host URL finds the primary, never a standby.
SESSION_ATTRS = "read-write"

_log = logger.bind(component="store", engine="postgresql")
# psycopg_pool logs every failed reconnection attempt at WARNING; the store logs one line per outage.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


# -- the URL ---------------------------------------------------------------------------------------------


def describe_url(url: str) -> str:
    """``user@host:port/dbname`` for a store URL: what logs, errors, doctor and status show (never the
    password). Raises ConfigError for a URL psycopg cannot read."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"[store] url = {mask_url(url)!r}: {_scrub(str(exc), url)}", key="[store] url") from None
    user = str(parts.get("user") or "")
    db = str(parts.get("dbname") or user or "")
    return f"{user + '@' if user else ''}{_servers(parts)}/{db}"


def _servers(parts: dict[str, Any]) -> str:
    """``host:port`` of each server of a (libpq multi-host) URL, comma-separated: ``h1:5432,h2:5432``."""
    hosts = str(parts.get("host") or "localhost").split(",")
    ports = str(parts.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return ",".join(f"{h or 'localhost'}:{p or '5432'}" for h, p in zip(hosts, ports, strict=False))


def _password(url: str) -> str | None:
    with contextlib.suppress(psycopg.ProgrammingError):
        value = conninfo_to_dict(url).get("password")
        return str(value) if value else None
    return None


def _scrub(message: str, url: str) -> str:
    """A driver message with the URL's password (if it ever appears) and the URL itself masked."""
    secret = _password(url)
    if secret:
        message = message.replace(secret, MASK)
    return message.replace(url, mask_url(url))


# -- the schema ------------------------------------------------------------------------------------------

def _m0005_words_stay_words(conn: psycopg.Connection[Any]) -> None:
    """Escape remnants leave the stored text: SQLite's `0012_words_stay_words`, the same function
    (`builtin_docs.words_stay_words`)."""
    words_stay_words(conn, "%s")


#: The schema, in order: each SQL migration is a versioned file of this package,
#: ``store/migrations/pg/NNNN_name.sql``, run as one simple-protocol query (text columns are
#: ``COLLATE "C"``: ids, ISO times, keyset paging and tie-breaks sort byte-wise, as SQLite's do, whatever
#: the database's locale). 0002 is the built-in provider's tables (``builtin.index_pg`` queries them).
#: The few that move data are functions of the connection, run inside the migration's transaction.
MIGRATIONS: list[tuple[str, str | Callable[[psycopg.Connection[Any]], None]]] = sorted([
    *((f.name.removesuffix(".sql"), f.read_text(encoding="utf-8"))
      for f in resources.files("memactors.store").joinpath("migrations/pg").iterdir() if f.name.endswith(".sql")),
    # Escape remnants leave the stored text; the built-in provider's documents are re-indexed.
    ("0005_words_stay_words", _m0005_words_stay_words),
], key=lambda m: m[0])


def _lock_key(name: str) -> str:
    """SQL for the advisory-lock key of singleton `name`: per schema, so two stores in one database
    (two schemas) never wait on each other."""
    return f"hashtextextended(current_schema() || ':memactors:{name}', 0)"


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the pending migrations in one transaction under an advisory lock (daemons starting
    together wait for the first; the others find nothing to do). Returns the names applied."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute(f"SELECT pg_advisory_xact_lock({_lock_key('migrate')})")
        conn.execute("CREATE TABLE IF NOT EXISTS memactors_migrations"
                     ' (name TEXT COLLATE "C" PRIMARY KEY, applied_at TEXT NOT NULL)')
        done = {row[0] for row in conn.execute("SELECT name FROM memactors_migrations")}
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            if callable(sql):
                sql(conn)
            else:
                conn.execute(sql.encode())  # several statements: simple query protocol, no parameters
            conn.execute("INSERT INTO memactors_migrations (name, applied_at) VALUES (%s, %s)",
                         [name, iso(utc_now())])
            applied.append(name)
    return applied


# -- the dialect -----------------------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def or_query(text: str) -> str | None:
    """A `to_tsquery` expression matching any distinct word of `text` (as `store.sqlite.fts_match` does for
    FTS5); None when it has no words. Words are runs of letters and digits, split as the indexed text is
    (the `tsv` columns make every other character a space first), so no tsquery operator in user text
    survives."""
    words = list(dict.fromkeys(_WORD.findall(text.lower())))
    if not words:
        return None
    return " | ".join(words)


class PgDialect:
    """The SQL that is PostgreSQL's own, for code that runs on both engines (see `store.Db`)."""

    name = "postgresql"

    def retryable(self, exc: BaseException) -> bool:
        """A write that lost a deadlock or serialization race against another daemon: run it again."""
        return isinstance(exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure)

    def skip_locked(self, table: str) -> str:
        """Row locks for a claim: rows another daemon is claiming right now are skipped, not waited for."""
        return f" FOR UPDATE OF {table} SKIP LOCKED"

    def contains(self, column: str) -> str:
        """A condition: `column` contains the next parameter as a substring (case-sensitive)."""
        return f"strpos({column}, ?) > 0"

    def upsert_fact(self, db: Any, *, fact_id: str, scope: str, text: str, confidence: float, status: str,
                    at: str) -> str:
        """Insert or update a fact (its `tsv` column follows by itself); returns its created_at."""
        (created_at,) = db.execute(
            "INSERT INTO facts (id, scope, text, confidence, status, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET scope = excluded.scope,"
            " text = excluded.text, confidence = excluded.confidence, status = excluded.status,"
            " updated_at = excluded.updated_at RETURNING created_at",
            [fact_id, scope, text, confidence, status, at, at]).fetchone()
        return str(created_at)

    def search_facts(self, db: Any, *, columns: str, query: str, scopes: Sequence[str], limit: int) -> list[Any] | None:
        """Live and suspect facts in `scopes` matching any word of `query`, best `ts_rank_cd` first, then
        confidence, then id; None when the query has no words."""
        expression = or_query(query)
        if expression is None:
            return None
        marks = ", ".join("?" for _ in scopes)
        rows: list[Any] = db.execute(
            f"SELECT {columns} FROM facts f, to_tsquery('english', ?) q"
            f" WHERE f.tsv @@ q AND f.status IN ('live', 'suspect') AND f.scope IN ({marks})"
            " ORDER BY ts_rank_cd(f.tsv, q, 1) DESC, f.confidence DESC, f.id LIMIT ?",
            [expression, *scopes, limit],
        ).fetchall()
        return rows


DIALECT = PgDialect()


@lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (and a literal `%` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgDb:
    """A psycopg connection as `store.Db`: `?` placeholders, rows as tuples (or dicts from `query`)."""

    dialect = DIALECT

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        #: Whether a COMMIT was sent on this connection (`_rerun_batch`: after it, never run again).
        self.commit_sent = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        cur = self.conn.cursor()
        if sql == "COMMIT":
            self.commit_sent = True
        if params:
            cur.execute(_pg_sql(sql), params)
        else:
            cur.execute(sql)
        return cur

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self.conn.cursor().executemany(_pg_sql(sql), rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]:
        cur = self.conn.cursor(row_factory=dict_row)
        if params:
            cur.execute(_pg_sql(sql), params)
        else:
            cur.execute(sql)
        yield from cur


#: A write refused because the session's server is read-only: a hot standby, or a primary demoted (or
#: made read-only, ``default_transaction_read_only``) while this daemon was connected to it.
_READ_ONLY = psycopg.errors.ReadOnlySqlTransaction


def _unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the server cannot be reached or the connection was lost (not a bug in SQL), or
    that the server cannot take writes now (a standby, a demoted primary: another server is the one)."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | PoolTimeout | _READ_ONLY)


def _gone(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn` is lost: the server closed it, or the network did."""
    return bool(conn.closed or conn.broken)


def _read_only_server(conn: psycopg.Connection[Any], *, writes: bool) -> bool:
    """Whether `conn`'s server says (in the parameters PostgreSQL 14+ reports to every session) that it
    is a hot standby — never used, for reads or writes — or, for the writer, that its transactions are
    read-only by default (a demoted or fenced primary)."""
    info = conn.info
    if info.parameter_status("in_hot_standby") == "on":
        return True
    return writes and info.parameter_status("default_transaction_read_only") == "on"


def _usable(conn: psycopg.Connection[Any], *, writes: bool) -> bool:
    """Whether a connection checked out of a pool is worth using, without a round trip when nothing
    happened to it: an idle connection the server has said nothing on is alive. When something did
    arrive — the FATAL of a restart or of `pg_terminate_backend`, the end of the stream, a reset, or a
    parameter change (a reload that made the server read-only) — one empty query reads it and tells."""
    if _gone(conn):
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        arrived = bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return False
    if arrived:
        try:
            conn.execute("")
        except psycopg.Error:
            return False
    return not _read_only_server(conn, writes=writes)


def _rerun_batch(db: PgDb, batch: list[_WriteJob]) -> bool:
    """Whether a write batch that failed may be run again on another connection: only when nothing of it
    can have been committed.

    * Any job refused as a read-only transaction: the batch's transaction was read-only from its BEGIN
      (``transaction_read_only`` is fixed when a transaction starts, and a read-write transaction never
      gets this error), so it wrote nothing, whatever else it did — even if its COMMIT then ran.
    * The connection is gone and its COMMIT was never sent: PostgreSQL rolls back a transaction whose
      session ends before COMMIT, so none of it is in the database.
    * The connection went while the COMMIT was on the wire (`PgDb.commit_sent`): the server may have
      committed and its answer been lost. Never run again — a second run could commit twice what the
      caller will be told once; the callers are told UNAVAILABLE, and what they send again is a
      duplicate of what may be there (episode ids are content-derived).

    Jobs are functions of the database (`run_jobs` runs them again already after a deadlock), so a
    rerun does what the first run would have."""
    errors = [job.error for job in batch if job.error is not None]
    if any(isinstance(e, _READ_ONLY) for e in errors):
        return True
    return _gone(db.conn) and not db.commit_sent and any(_unavailable(e) for e in errors)


class PgHealth:
    """`store.health.WriteHealth`'s interface for a PostgreSQL store: its disk is the server's, so what
    the surfaces report is whether the server answered the last call (`PgStore.last_error`); a full disk
    on the server is one of the errors it answers with."""

    def __init__(self, store: PgStore) -> None:
        self._store = store

    def failed(self, exc: BaseException) -> BaseException:
        return exc

    def succeeded(self) -> None:
        return None

    def snapshot(self) -> dict[str, Any]:
        error = self._store.last_error
        return {"path": self._store.where, "writable": error is None, "free_bytes": None, "error": error,
                "for_seconds": None, "primary": self._store.primary}


class PgStore(Store):
    """The store in a PostgreSQL database. Open with `await open_store("postgresql://…")`."""

    engine = "postgresql"

    def __init__(self, url: str, *, daemon_id: str = "local", connect_timeout: float = CONNECT_TIMEOUT) -> None:
        super().__init__(daemon_id=daemon_id)
        self._url = url
        self._where = describe_url(url)
        self.connect_timeout = connect_timeout
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, int(connect_timeout + 0.999)),
                  "application_name": f"memactors {daemon_id}"[:63],
                  # a peer that vanishes (host down, network cut) is noticed in ~15 s, not the kernel's hours
                  "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                  "tcp_user_timeout": 15000}
        if "target_session_attrs" not in conninfo_to_dict(url):
            kwargs["target_session_attrs"] = SESSION_ATTRS  # the primary, whichever host it is now
        #: What every connection is opened with: the pools' and the two one-off connections below.
        self._connect_kwargs = kwargs
        common: dict[str, Any] = {"kwargs": kwargs, "open": False, "timeout": connect_timeout, "reconnect_timeout": 2.0,
                  "max_idle": 300.0}
        self._writer = ConnectionPool(url, min_size=1, max_size=1, name="memactors-writer", **common)
        self._readers = ConnectionPool(url, min_size=1, max_size=READ_CONNECTIONS, name="memactors-readers",
                                       **common)
        self._read_limiter = trio.CapacityLimiter(READ_CONNECTIONS)
        #: The last failure to reach the server (a message without the password), None while it answers.
        self.last_error: str | None = None
        #: ``host:port`` of the server (the primary) the last call that succeeded ran on (doctor shows it).
        self.primary: str | None = None
        self._closed = False
        self.health = PgHealth(self)

    @classmethod
    async def connect(cls, url: str, *, daemon_id: str = "local") -> PgStore:
        """Connect, apply pending migrations (under an advisory lock), and open the pools. A server
        that cannot be reached at start is an error naming the store (the daemon does not start)."""
        store = cls(url, daemon_id=daemon_id)

        def setup() -> list[str]:
            with psycopg.connect(url, **store._connect_kwargs) as conn:
                applied = migrate(conn)
            store._writer.open(wait=False)
            store._readers.open(wait=False)
            return applied

        try:
            applied = await trio.to_thread.run_sync(setup)
        except Exception as exc:
            store.close()
            if _unavailable(exc):
                raise store._error(exc, "cannot connect") from None
            raise
        log = _log.bind(store=store.where, daemon=daemon_id)
        if applied:
            log.bind(migrations=len(applied), last=applied[-1]).info("store migrated")
        log.info("store open")
        return store

    @property
    def where(self) -> str:
        return f"postgresql {self._where}"

    def _error(self, exc: BaseException, doing: str) -> StoreUnavailable:
        reason = _scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, self._url)
        return StoreUnavailable(f"store {self._where} {doing}: {reason}", store=self._where)

    def _failed(self, exc: BaseException, doing: str) -> StoreUnavailable:
        error = self._error(exc, doing)
        if self.last_error is None:
            _log.bind(store=self._where, error=type(exc).__name__).warning(f"store unavailable: {error.message}")
        self.last_error = error.message
        return error

    def _wait(self) -> float:
        """How long to wait for a pooled connection: the connect timeout, or — while the server is known
        to be down — a fraction of a second, so every caller learns it at once instead of each waiting
        out the timeout (the pools keep reconnecting in the background)."""
        return FAIL_FAST if self.last_error is not None else self.connect_timeout

    def _checkout(self, pool: ConnectionPool[Any], *, writes: bool) -> psycopg.Connection[Any]:
        """A connection of `pool` that `_usable` accepts, within one wait (`_wait`): the dead ones it
        meets are closed and handed back (the pool replaces them), so the caller gets a live one or,
        when the server is not there, the pool's timeout."""
        deadline = time.monotonic() + self._wait()
        while True:
            conn: psycopg.Connection[Any] = pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))
            if _usable(conn, writes=writes):
                return conn
            with contextlib.suppress(Exception):
                conn.close()
            pool.putconn(conn)  # closed: the pool discards it and opens another in the background
            if time.monotonic() >= deadline:
                raise PoolTimeout(f"no usable connection in {self._wait():.2f} s")

    def _answered(self, conn: psycopg.Connection[Any]) -> None:
        """Note the server `conn` ran a call on: the primary, as doctor names it."""
        with contextlib.suppress(Exception):
            self.primary = f"{conn.info.host}:{conn.info.port}"

    def _ok(self) -> None:
        if self.last_error is not None:
            self.last_error = None
            self.recoveries += 1
            _log.bind(store=self._where).info("store reachable again")

    # -- writes --------------------------------------------------------------------------------------
    async def _write_batch(self, batch: list[_WriteJob]) -> None:
        def run() -> None:
            for attempt in range(1, ATTEMPTS + 1):
                conn = self._checkout(self._writer, writes=True)
                db = PgDb(conn)
                try:
                    run_jobs(db, batch, begin="BEGIN")
                    again = attempt < ATTEMPTS and _rerun_batch(db, batch)
                    if again or any(isinstance(j.error, _READ_ONLY) for j in batch):
                        # Lost, or on a server that cannot take writes: the pool opens another
                        # connection (target_session_attrs finds the primary now).
                        conn.close()
                    elif not _gone(conn):
                        self._answered(conn)
                finally:
                    self._writer.putconn(conn)
                if not again:
                    return
                _log.bind(store=self._where, attempt=attempt).info(
                    "store connection lost before the commit; writing again on a new connection")
                for job in batch:
                    job.error, job.result = None, None

        try:
            await trio.to_thread.run_sync(run)
        except Exception as exc:
            if not _unavailable(exc):
                raise
            error = self._failed(exc, "cannot be written")
            for job in batch:
                job.error = job.error or error
            return
        failed = next((job.error for job in batch if job.error is not None and _unavailable(job.error)), None)
        if failed is None:
            self._ok()
            return
        error = self._failed(failed, "cannot be written")
        for job in batch:
            if job.error is not None and _unavailable(job.error):
                job.error = error

    # -- reads ---------------------------------------------------------------------------------------
    async def read(self, fn: Callable[[Db], T]) -> T:
        """`fn(db)` in a read-only REPEATABLE READ transaction on a pooled connection. Cancelled at the
        caller's deadline (the worker thread finishes on its own): a read never holds a recall past
        its provider_timeout, whatever the server does."""
        try:
            result = await trio.to_thread.run_sync(self._read_sync, fn, limiter=self._read_limiter,
                                                   abandon_on_cancel=True)
        except Exception as exc:
            if _unavailable(exc):
                raise self._failed(exc, "cannot be read") from None
            raise
        self._ok()
        return result

    def _read_sync(self, fn: Callable[[Any], T]) -> T:
        for attempt in range(1, ATTEMPTS + 1):
            if self._closed:
                raise RuntimeError("store is closed")
            conn = self._checkout(self._readers, writes=False)
            try:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                try:
                    result = fn(PgDb(conn))
                finally:
                    if not conn.closed:
                        conn.execute("COMMIT")
                self._answered(conn)
                return result
            except (psycopg.OperationalError, psycopg.InterfaceError):
                # A read-only transaction changes nothing: when its connection went under it (a restart,
                # pg_terminate_backend, a reset), it is read again on another; any other error is its own.
                if attempt == ATTEMPTS or not _gone(conn):
                    raise
            finally:
                self._readers.putconn(conn)
        raise AssertionError("unreachable")  # the last attempt returned or raised

    async def ping(self) -> str | None:
        """None when the server answers a query within the connect timeout, else why not."""
        # Bounded by the pool's connect timeout and the connection's TCP timeouts (real time, in the
        # worker thread), not by a trio deadline: a test's autojump clock must not fail a live server.
        try:
            await self.read(lambda db: db.execute("SELECT 1").fetchone())
        except StoreUnavailable as exc:
            return exc.message
        return None

    # -- fleet-wide singletons -----------------------------------------------------------------------
    @asynccontextmanager
    async def singleton(self, name: str) -> AsyncIterator[bool]:
        """A session-level advisory lock on a connection of its own, held for the block: one daemon of
        the fleet runs the job, the others skip it (they do not wait)."""
        url, kwargs = self._url, self._connect_kwargs

        def take() -> tuple[psycopg.Connection[Any], bool]:
            conn = psycopg.connect(url, **kwargs)
            row = conn.execute(f"SELECT pg_try_advisory_lock({_lock_key(name)})").fetchone()
            got = row is not None and bool(row[0])
            return conn, got

        try:
            conn, got = await trio.to_thread.run_sync(take)
        except Exception as exc:
            if _unavailable(exc):
                raise self._failed(exc, "cannot be locked") from None
            raise
        try:
            yield got
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(self.connect_timeout + 5):
                # Closing the session releases the lock too; unlocking first says so explicitly.
                def release() -> None:
                    with contextlib.suppress(Exception):
                        if got:
                            conn.execute(f"SELECT pg_advisory_unlock({_lock_key(name)})")
                    conn.close()

                await trio.to_thread.run_sync(release)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pool in (self._readers, self._writer):
            with contextlib.suppress(Exception):
                pool.close(timeout=5.0)
