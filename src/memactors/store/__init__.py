"""The daemon's store: one interface, two engines.

The package: this module is the interface (`Store`, `Db`, the write queue both engines share, the rows
and helpers every engine writes alike); ``engines`` opens one (`open_store`); ``sqlite`` and ``pg`` are
the engines, one module each; ``migrations/<engine>/NNNN_name.sql`` their schemas, as versioned files;
``builtin_docs`` the built-in provider's document columns both engines migrate; ``health`` the
write-health state; ``migrate`` `memactors store migrate`. What the store holds is one module per concept,
engine-neutral SQL over `Db` (full-text search through `db.dialect`): ``episodes`` (episode rows and
bodies), ``memory_index`` (provider ids per episode, under its scope), ``pending`` (the record/forget
queue and tombstones), ``run_history`` (the closed runs ingested, and what briefings read of them),
``agent_runs`` (the runs the daemon started), ``facts``, ``votes`` (exposure and votes),
``pull_requests``, ``presence``, ``run_tokens``, ``briefing_cache``. May import: the pure modules
(errors, urls, episode, wrapper, ...) only — never the provider, the actors or anything above.

SQLite (`store.sqlite`) is the embedded default: one file in the state directory, opened through
sqlean-py (the stdlib sqlite3 here cannot load extensions) and handed to sqlite-utils; WAL, foreign
keys on, schema by sqlite-utils `Migrations` (`store.sqlite.migrations`). `[store] url = "postgresql://…"` puts the same
store on PostgreSQL (`store.pg`), so daemons on several hosts share one memory (docs/fleet.md).

Actors and modules never see the engine: they hand functions `fn(db)` to `Store.write` /
`Store.read`, where `db` is a `Db` (execute / executemany / query, and `db.dialect` for what is
written differently per engine).

Concurrency follows datasette on both engines: exactly one write connection, used by one worker
thread at a time, and a bounded pool of read connections (`read()`), checked out for one call and
handed back. Nothing touches the database on the trio loop itself.

Group commit: `write()` calls that arrive while a transaction is running queue up, and the next
transaction runs all of them (at most GROUP_COMMIT_MAX), each inside its own SAVEPOINT. Each write
still commits whole or rolls back whole: a call that raises has its savepoint rolled back and gets its
exception, the others in the transaction commit; every caller returns only after the COMMIT. So
concurrent ingests cost one transaction (and one thread hop) between them instead of one each. Write
calls are never abandoned on cancellation: a caller cancelled while queued is taken out of the queue
(its write never runs); once its transaction has started it waits for the COMMIT, then is cancelled.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import socket
import stat
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import sqlite_utils
import trio

T = TypeVar("T")

#: The most write() calls one group-commit transaction runs.
GROUP_COMMIT_MAX = 64

WallClock = Callable[[], datetime]


WORD = re.compile(r"\w+", re.UNICODE)


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """The one text form of a time in the store: UTC, microseconds, 'Z'; sorts lexically."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: Longest caller-supplied string (tool name, caller, server) stored in the call log or written to a log.
MAX_FIELD_CHARS = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def bound_field(value: object, limit: int = MAX_FIELD_CHARS) -> str:
    """A caller-supplied string made safe to store or log: control characters replaced by '?', cut to
    ``limit`` characters with a marker saying how long it was."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = f"{text[:limit - 24]}…[{len(text)} chars]"
    return _CONTROL.sub("?", text)


def call_log_row(*, at: str, caller: str, server: str, tool: str, arguments: Any, outcome: str,
                 duration_ms: int) -> tuple[Any, ...]:
    """One call-log row (REQ-18), bounded. Arguments are only ever stored as their SHA-256, so
    the call log is never a second copy of episodes, queries or prompts."""
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode()).hexdigest()
    return (at, bound_field(caller), bound_field(server), bound_field(tool), digest, bound_field(outcome, 32),
            int(duration_ms))


_INSERT_CALL = ("INSERT INTO call_log (at, caller, server, tool, args_sha256, outcome, duration_ms)"
                " VALUES (?,?,?,?,?,?,?)")


def insert_call_log_rows(db: Db, rows: list[tuple[Any, ...]]) -> None:
    db.executemany(_INSERT_CALL, rows)


def scope_range(num: int) -> tuple[int, int]:
    """The first and last doc id of scope number `num`."""
    return num << 32, ((num + 1) << 32) - 1


def scope_doc_id(db: sqlite_utils.Database, scope: str) -> int:
    """The next built-in doc id in `scope`'s own range, numbering the scope on first use (write txn)."""
    row = db.execute("SELECT num, next_seq FROM builtin_scopes WHERE scope = ?", [scope]).fetchone()
    if row is None:
        num = int(db.execute("SELECT coalesce(max(num), 0) + 1 FROM builtin_scopes").fetchone()[0])
        db.execute("INSERT INTO builtin_scopes (scope, num, next_seq) VALUES (?, ?, 1)", [scope, num])
        row = (num, 1)
    num, seq = int(row[0]), int(row[1])
    db.execute("UPDATE builtin_scopes SET next_seq = ? WHERE scope = ?", [seq + 1, scope])
    return (num << 32) | seq


def scope_key(scope: str) -> str:
    """The one FTS5 token a scope is indexed under in `builtin_fts.scope_key` (digits only, so no
    tokenizer or stemmer changes it): the first 60 bits of the scope's SHA-256, in decimal."""
    return str(int(hashlib.sha256(scope.encode()).hexdigest()[:15], 16))


def log_call(db: Db, *, at: str, caller: str, server: str, tool: str,
             arguments: Any, outcome: str, duration_ms: int) -> None:
    """Write one bounded call-log row now (callers without a batching CallLog)."""
    db.execute(_INSERT_CALL, list(call_log_row(at=at, caller=caller, server=server, tool=tool,
                                               arguments=arguments, outcome=outcome, duration_ms=duration_ms)))


def prune_call_log(db: Db, cutoff: str, batch: int = 10_000) -> int:
    """Delete up to ``batch`` call-log rows older than ``cutoff`` (an `iso` time); returns how many."""
    cursor = db.execute("DELETE FROM call_log WHERE id IN (SELECT id FROM call_log WHERE at < ? LIMIT ?)",
                        [cutoff, batch])
    return cursor.rowcount


def private_dir(path: Path) -> None:
    """Create `path` (and parents) if missing and make it 0700, whatever the umask: the state directory
    holds every episode and the operator tokens."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


#: The file in the state directory holding this daemon's id.
DAEMON_ID_FILE = "daemon_id"
_HOST_CHARS = re.compile(r"[^A-Za-z0-9.-]+")


def ensure_daemon_id(state_dir: Path) -> str:
    """This daemon's stable id, from `daemon_id` in the state directory, made on first use:
    ``<host name>-<8 hex digits>``. Daemons sharing one store (PostgreSQL) tell their claims apart by
    it; `memory status` and `doctor` show it. Blocking file I/O: call it through a thread."""
    private_dir(state_dir)
    path = state_dir / DAEMON_ID_FILE
    try:
        found = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found
    host = _HOST_CHARS.sub("-", socket.gethostname()).strip("-")[:40] or "host"
    made = f"{host}-{secrets.token_hex(4)}"
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(made + "\n")
    os.replace(tmp, path)
    return made


def private_file(path: Path) -> None:
    """Create `path` if missing and make it 0600, whatever the umask.

    An existing file is never opened: closing any descriptor on a file drops every POSIX lock this
    process holds on it, so a store already open on the file in this process would lose its locks and
    another process's connection could delete the -wal and -shm under it."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path)) from None
        if not os.access(path, os.W_OK):
            return  # a file made read-only stays so: SQLite's first write names it ("readonly")
    os.chmod(path, 0o600)


# -- the store interface -------------------------------------------------------------------------------


class Cursor(Protocol):
    """What `Db.execute` returns on either engine: DB-API rows as tuples."""

    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """The connection a `Store.write` / `Store.read` function is handed, on either engine.

    SQL written here is the SQL both engines run: `?` placeholders (the PostgreSQL engine turns them
    into its own), `INSERT … ON CONFLICT DO NOTHING` (not `OR IGNORE`), `RETURNING id` (not
    `lastrowid`), `IS NOT DISTINCT FROM` (not `IS ?`), `count(*) FILTER (WHERE …)`. What cannot be
    written once (full-text search, locks, the built-in provider's index) is a method of `dialect`,
    implemented once per engine (`store.sqlite`, `store.pg`).
    """

    dialect: Any

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]: ...


A = TypeVar("A")


def insert_with_body(db: Db, body_table: str, body_column: str, body: str, row_sql: str,
                     row: Sequence[Any]) -> bool:
    """Store `body` (a row of `body_table`, its text in `body_column`) and the row that points at it:
    `row_sql`, an `INSERT … ON CONFLICT DO NOTHING RETURNING 1` whose last placeholder takes the body's
    id after the values of `row`. Whether the row was inserted; when another daemon sharing the store
    inserted it meanwhile, the body goes again (the first one stored is the row's)."""
    (body_id,) = db.execute(f"INSERT INTO {body_table} ({body_column}) VALUES (?) RETURNING id", [body]).fetchone()
    if db.execute(row_sql, [*row, body_id]).fetchone() is None:
        db.execute(f"DELETE FROM {body_table} WHERE id = ?", [body_id])
        return False
    return True


def each_in_savepoint(db: Db, items: Sequence[A], fn: Callable[[Db, A], T]) -> tuple[T | Exception, ...]:
    """`fn(db, item)` for each of `items` in the caller's transaction, each inside its own savepoint: one
    that raises rolls back alone and its exception is returned in its place, in order. An error the
    engine retries (`db.dialect.retryable`: a deadlock with another daemon) is raised instead, so the
    store runs the whole write again."""
    out: list[T | Exception] = []
    for item in items:
        db.execute("SAVEPOINT each_item")
        try:
            out.append(fn(db, item))
        except Exception as exc:  # ok: this item's writes roll back; the others stay
            db.execute("ROLLBACK TO SAVEPOINT each_item")
            if db.dialect.retryable(exc):
                raise
            out.append(exc)
        db.execute("RELEASE SAVEPOINT each_item")
    return tuple(out)


class _WriteJob:
    """One queued write() call: its function, then its result or exception."""

    __slots__ = ("done", "error", "fn", "result", "state")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.state = "queued"  # queued -> taken -> done
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = trio.Event()


def run_jobs(db: Any, batch: list[_WriteJob], *, begin: str) -> None:
    """Run a group-commit batch in one transaction on `db` (blocking: a worker thread calls it).

    One job alone runs without a savepoint; several each run inside their own. A job whose error
    `db.dialect.retryable` accepts (PostgreSQL's deadlock and serialization failures: another daemon wrote the same
    rows at the same moment) is run again, up to three times, before its error is kept. A failing COMMIT
    hands its error to every job of the batch: nothing of it is kept.
    """
    try:
        db.execute(begin)
        if len(batch) == 1:
            job = batch[0]
            for attempt in range(3):
                try:
                    job.result = job.fn(db)
                    job.error = None
                    break
                except BaseException as exc:  # ok: roll back, then retry or hand the error to its caller
                    job.error = exc
                    db.execute("ROLLBACK")
                    if attempt == 2 or not db.dialect.retryable(exc):
                        return
                    db.execute(begin)
        else:
            for job in batch:
                for attempt in range(3):
                    db.execute("SAVEPOINT w")
                    try:
                        job.result = job.fn(db)
                        job.error = None
                    except BaseException as exc:  # ok: this call's writes roll back; the others stay
                        job.error = exc
                        db.execute("ROLLBACK TO SAVEPOINT w")
                    db.execute("RELEASE SAVEPOINT w")
                    if job.error is None or attempt == 2 or not db.dialect.retryable(job.error):
                        break
        db.execute("COMMIT")
    except BaseException as exc:  # ok: BEGIN or COMMIT failed: nothing of the batch is kept
        with contextlib.suppress(Exception):
            db.execute("ROLLBACK")
        for job in batch:
            job.error = job.error or exc


class Store:
    """The daemon's store: one writer (group commit) and pooled readers, all in worker threads.

    Open with `await open_store(target)` (``store.engines``): a path opens (or creates) the SQLite file there, a
    ``postgresql://`` URL the PostgreSQL database (`store.pg`). The engines differ only in how they
    connect and in the SQL of `Db.dialect`; `write`, `read` and their semantics are this class's.
    """

    #: "sqlite" or "postgresql": for status, doctor and logs, never for choosing SQL (that is `dialect`).
    engine = ""

    def __init__(self, *, daemon_id: str = "local") -> None:
        #: This daemon's id (`daemon_id` in the state directory): who claimed a pending row.
        self.daemon_id = daemon_id
        self._write_lock = trio.Lock()
        self._write_queue: list[_WriteJob] = []
        #: Write transactions run so far (each holds one or more write() calls).
        self.transactions = 0
        #: Whether writes succeed (set by the engine): a write that fails for lack of space raises StoreFull
        #: (store.health); `snapshot()` is what Status, doctor and /readyz show.
        self.health: Any = None
        #: How many times the store came back after being unreachable (an engine that can be: PostgreSQL):
        #: the built-in provider's breaker half-opens on it, so recall is back with the store.
        self.recoveries = 0

    @property
    def where(self) -> str:
        """Where the store is, for status, doctor and logs (never with a password)."""
        raise NotImplementedError

    async def write(self, fn: Callable[[Db], T]) -> T:
        """Run `fn(db)` in a transaction on the write connection, off the trio loop; commits whole or
        not at all. Concurrent calls share one transaction (group commit, see the module docstring)."""
        job = _WriteJob(fn)
        self._write_queue.append(job)
        try:
            async with self._write_lock:
                if job.state == "queued":  # nobody took it while we waited: lead a transaction
                    batch = self._write_queue[:GROUP_COMMIT_MAX]
                    del self._write_queue[:GROUP_COMMIT_MAX]
                    for j in batch:
                        j.state = "taken"
                    try:
                        self.transactions += 1
                        await self._write_batch(batch)  # never abandoned
                    finally:
                        for j in batch:
                            j.state = "done"
                            j.done.set()
        except trio.Cancelled:
            if job.state == "queued":
                self._write_queue.remove(job)
            else:  # in a transaction already: it commits whole or not at all; wait for it
                with trio.CancelScope(shield=True):
                    await job.done.wait()
            raise
        if job.error is not None:
            raise self.health.failed(job.error)
        self.health.succeeded()
        result: T = job.result  # what `fn` returned
        return result

    async def _write_batch(self, batch: list[_WriteJob]) -> None:
        raise NotImplementedError

    async def read(self, fn: Callable[[Db], T]) -> T:
        """Run `fn(db)` on a pooled read connection, in one read transaction (a snapshot), off the trio loop."""
        raise NotImplementedError

    def damage(self, exc: BaseException) -> str | None:
        """One line naming the store when ``exc`` says its file is damaged (SQLite's malformed pages), else
        None: `status` and `doctor` report it instead of failing INTERNAL."""
        return None

    async def ping(self) -> str | None:
        """None when the store answers now, else why not (a PostgreSQL server down or unreachable).
        The SQLite file is always there while the daemon runs."""
        return None

    async def checkpoint(self) -> bool:
        """After deleting text (a forget): make sure no copy of it lingers in the engine's own files
        where it can (SQLite's WAL). False when that could not complete now."""
        return True

    @asynccontextmanager
    async def singleton(self, name: str) -> AsyncIterator[bool]:
        """Whether this daemon may do the fleet-wide singleton job `name` now (the hourly prune): yields
        True, and holds the job for this daemon until the block ends, or False when another daemon
        sharing the store is doing it. A store only one daemon opens always yields True."""
        yield True

    async def write_in_batches(self, fn: Callable[[Db], int], batch: int) -> int:
        """Run `fn(db)` — which handles at most `batch` rows and returns how many — each time in a
        transaction of its own, until it handles fewer than `batch` (so the writer is never held long);
        returns the total."""
        total = 0
        while True:
            n = await self.write(fn)
            total += n
            if n < batch:
                return total

    async def prune_call_log(self, cutoff: str) -> int:
        """Delete call-log rows older than ``cutoff`` (an `iso` time), 10,000 per transaction; returns
        how many."""
        return await self.write_in_batches(lambda db: prune_call_log(db, cutoff, 10_000), 10_000)

    def close(self) -> None:
        raise NotImplementedError


def is_store_url(target: str) -> bool:
    """Whether `target` names a PostgreSQL store (``postgresql://`` or ``postgres://``)."""
    return target.startswith(("postgresql://", "postgres://"))
