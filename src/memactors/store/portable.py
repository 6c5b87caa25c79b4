"""`memactors store export` / `store import`: memory as versioned JSON lines.

The file is one JSON object a line. The first is the header::

    {"type": "header", "format": "memactors-export", "version": 1, "engine": "sqlite", "exported_at": …, "filter": {…}}

then one line per row, ``{"type": T, "row": {column: value, …}}``, with T one of ``run`` (its stored
record's text in ``text``), ``run_path``, ``episode`` (its REQ-5 body's text in ``text``; null for a
forgotten one: a *tombstone*), ``index`` (an index row: provider, provider id, episode, scope, times)
and ``fact``; and last ``{"type": "end", "counts": {…}}``, so a file cut short is told from a whole one.
Rows are the store's own columns and values (every time is the store's one `iso` text), never a
per-engine form, so a SQLite export imports into PostgreSQL and back.

Every row is checked before it is written (`check`, handed in: `service.import_rows.check_row`) as
strictly as the store will read it, its strings redacted and its scope derived from its repository; a
row that fails is refused by its line number and reason (`ImportResult.refused`) and the rest go in.

Import writes a store the daemon is not running on (the CLI takes the state directory's lock for a
SQLite one). What the target already holds wins: a run, episode or fact it has is skipped, so importing
twice adds nothing. Forgotten stays forgotten, both ways: a tombstone in the file is imported as one
(the run row with it, so the run is never ingested again), and an episode the target holds live is
forgotten through `store.pending.tombstone`, the one the retention actor uses, which queues its
forgets at the provider; an episode the target has forgotten is never revived.

Live episodes are recorded to the target's provider by the daemon itself: each is queued as a pending
record (the path every acknowledged episode takes, from its stored copy), so the built-in provider's
documents (full text, vectors) are rebuilt by its own code when the daemon next runs. Index rows of
another provider (an external one, which still holds its documents) are imported as they are.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import attrs

from . import Db, Store, iso
from .pending import queue, tombstone

__all__ = ["FORMAT", "VERSION", "ExportFilter", "ImportResult", "Oversized", "PortableError", "RowRefused", "export_lines",
           "import_lines", "read_lines"]

FORMAT = "memactors-export"
#: The file's schema version. A change to what a line holds is a new version; import refuses others.
VERSION = 1
#: Rows read per query (keyset paging, no OFFSET).
BATCH = 500

_RUN = ("harness", "run_id", "adapter", "started_at", "ended_at", "outcome", "reason", "duration_ms", "repo",
        "branch", "ingested_at")
_RUN_PATH = ("harness", "run_id", "repo", "path")
_EPISODE = ("episode_id", "harness", "run_id", "repo", "branch", "scope", "trust_class", "outcome", "started_at",
            "recorded_at", "forgotten_at")
_INDEX = ("provider", "provider_id", "episode_id", "scope", "recorded_at", "forgotten_at")
_FACT = ("id", "scope", "text", "confidence", "status", "created_at", "updated_at")



class PortableError(ValueError):
    """Raised when an export file cannot be imported: no header, another format or version, cut short."""


class RowRefused(PortableError):
    """Raised when one line of an export cannot be imported (the reason; the import goes on without it)."""


#: A row's check (`service.import_rows.check_row`, handed in): the line's item as it may be stored, or
#: RowRefused.
Check = Callable[[dict[str, Any]], dict[str, Any]]


@attrs.frozen
class Oversized:
    """A line longer than the reader's limit, in place of its text (never read whole into memory)."""

    size: int


@attrs.frozen
class ExportFilter:
    """Which rows go out: one repository's (key), and only what started (facts: changed) since a time."""

    repo: str | None = None
    since: str | None = None

    def where(self, repo_col: str | None, time_col: str | None) -> tuple[str, list[Any]]:
        parts, params = [], []
        if self.repo is not None and repo_col:
            parts.append(f"{repo_col} = ?")
            params.append(self.repo)
        if self.since is not None and time_col:
            parts.append(f"{time_col} >= ?")
            params.append(self.since)
        return " AND ".join(parts), params


async def _pages(store: Store, sql_from: str, columns: tuple[str, ...], key: tuple[str, ...], where: str,
                 params: list[Any]) -> AsyncIterator[list[tuple[Any, ...]]]:
    """SELECT `columns` FROM `sql_from` WHERE `where`, in key order, BATCH rows at a time."""
    last: list[Any] | None = None
    keys = ", ".join(key)
    positions = [columns.index(k) for k in key]
    cols = ", ".join(columns)
    while True:
        conds = [c for c in (where, f"({keys}) > ({', '.join('?' * len(key))})" if last else "") if c]
        sql = (f"SELECT {cols} FROM {sql_from}" + (f" WHERE {' AND '.join(conds)}" if conds else "")
               + f" ORDER BY {keys} LIMIT {BATCH}")
        args = params + (last or [])

        def page(db: Db, sql: str = sql, args: list[Any] = args) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in db.execute(sql, args)]

        rows = await store.read(page)
        if not rows:
            return
        yield rows
        if len(rows) < BATCH:
            return
        last = [rows[-1][i] for i in positions]


def _line(kind: str, names: tuple[str, ...], row: tuple[Any, ...], text: Any = ...) -> str:
    out: dict[str, Any] = {"type": kind, "row": dict(zip(names, row[:len(names)], strict=True))}
    if text is not ...:
        out["text"] = text
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


async def export_lines(store: Store, filt: ExportFilter = ExportFilter(), *,
                       now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> AsyncIterator[str]:
    """The export of `store` under `filt`, line by line (header first, end line last; no newlines)."""
    yield json.dumps({"type": "header", "format": FORMAT, "version": VERSION, "engine": store.engine, "exported_at": iso(now()),
                      "filter": {"repo": filt.repo, "since": filt.since}}, separators=(",", ":"))
    counts = {"run": 0, "run_path": 0, "episode": 0, "tombstone": 0, "index": 0, "fact": 0}
    where, params = filt.where("runs.repo", "runs.started_at")
    cols = tuple(f"runs.{c}" for c in _RUN) + ("run_records.record",)
    async for rows in _pages(store, "runs LEFT JOIN run_records ON run_records.id = runs.record_id",
                             cols, ("runs.harness", "runs.run_id"), where, params):
        for r in rows:
            counts["run"] += 1
            yield _line("run", _RUN, r, r[-1])
    where, params = filt.where("run_paths.repo", None)
    if filt.since is not None:
        where = " AND ".join(w for w in (where, "EXISTS (SELECT 1 FROM runs WHERE runs.harness = run_paths.harness"
                                                 " AND runs.run_id = run_paths.run_id AND runs.started_at >= ?)") if w)
        params = [*params, filt.since]
    async for rows in _pages(store, "run_paths", _RUN_PATH, _RUN_PATH, where, params):
        for r in rows:
            counts["run_path"] += 1
            yield _line("run_path", _RUN_PATH, r)
    where, params = filt.where("episodes.repo", "episodes.started_at")
    cols = tuple(f"episodes.{c}" for c in _EPISODE) + ("episode_bodies.body",)
    async for rows in _pages(store, "episodes LEFT JOIN episode_bodies ON episode_bodies.id = episodes.body_id",
                             cols, ("episodes.episode_id",), where, params):
        for r in rows:
            counts["tombstone" if r[_EPISODE.index("forgotten_at")] is not None else "episode"] += 1
            yield _line("episode", _EPISODE, r, r[-1])
    where, params = filt.where("e.repo", "e.started_at")
    cols = tuple(f"m.{c}" for c in _INDEX)
    async for rows in _pages(store, "memory_index m JOIN episodes e ON e.episode_id = m.episode_id", cols,
                             ("m.provider", "m.provider_id"), where, params):
        for r in rows:
            counts["index"] += 1
            yield _line("index", _INDEX, r)
    where, params = filt.where(None, "updated_at")
    if filt.repo is not None:
        where = " AND ".join(w for w in (where, "scope = ?") if w)
        params = [*params, f"project:{filt.repo}"]
    async for rows in _pages(store, "facts", _FACT, ("id",), where, params):
        for r in rows:
            counts["fact"] += 1
            yield _line("fact", _FACT, r)
    yield json.dumps({"type": "end", "counts": counts}, separators=(",", ":"))


@attrs.define
class ImportResult:
    """What an import did, per kind: `added` (new to the target), `present` (the target had it: skipped),
    `forgotten` (live in the target, forgotten in the file: forgotten now), `queued` (episodes queued for
    recording to the target's provider), `refused` (lines not imported: line number, type, reason)."""

    added: dict[str, int] = attrs.field(factory=dict)
    present: dict[str, int] = attrs.field(factory=dict)
    forgotten: int = 0
    queued: int = 0
    header: dict[str, Any] = attrs.field(factory=dict)
    refused: list[dict[str, Any]] = attrs.field(factory=list)
    #: the file ended without its end line: it was cut short (what it held is imported)
    cut_short: bool = False

    def count(self, which: dict[str, int], kind: str, n: int = 1) -> None:
        which[kind] = which.get(kind, 0) + n

    def refuse(self, n: int, kind: str | None, reason: str) -> None:
        self.refused.append({"line": n, "type": kind, "reason": reason})


def read_lines(stream: Any, limit: int) -> Iterator[str | Oversized]:
    """The lines of a text stream, each without reading more than `limit` characters of it into memory:
    a longer line comes as `Oversized` (its size in characters) and is skipped to its end."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith("\n"):
            yield line
            continue
        size = len(line)
        while line and not line.endswith("\n"):
            line = stream.readline(1 << 20)
            size += len(line)
        yield Oversized(size)


def read_header(line: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PortableError(f"line 1 is not a {FORMAT} header")
    if header.get("version") != VERSION:
        version = header.get("version")
        shown = version if isinstance(version, int) and abs(version) < 10**9 else repr(str(version)[:32])
        raise PortableError(f"export version {shown}: this memactors reads version {VERSION}")
    return header


def _parse(line: str) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except RecursionError:
        raise RowRefused("the line is nested too deeply") from None
    except ValueError:
        raise RowRefused("the line is not JSON") from None
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise RowRefused("the line is not an export line (an object with a type)")
    if item["type"] != "end" and not isinstance(item.get("row"), dict):
        raise RowRefused("the line has no row")
    return item


def _values(row: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    missing = [c for c in names if c not in row]
    if missing:
        raise RowRefused(f"the row lacks {', '.join(missing)}")
    return [row[c] for c in names]


#: The engines' errors for one row the store refuses (a constraint, a value out of a column's range):
#: sqlite3's and psycopg's classes of those names (and their subclasses).
_ROW_ERRORS = frozenset({"IntegrityError", "DataError"})


def _write_batch(db: Db, items: list[tuple[int, dict[str, Any]]], *, provider: str, now: str,
                 result: ImportResult) -> None:
    for n, item in items:
        # One savepoint a row: a row the store itself refuses (a constraint no check foresaw) costs that
        # row alone, never its batch's transaction.
        db.execute("SAVEPOINT import_row")
        try:
            _write_one(db, item, provider=provider, now=now, result=result)
        except RowRefused as exc:
            db.execute("ROLLBACK TO SAVEPOINT import_row")
            result.refuse(n, item["type"], str(exc))
        except Exception as exc:
            if not any(c.__name__ in _ROW_ERRORS for c in type(exc).__mro__):
                raise
            db.execute("ROLLBACK TO SAVEPOINT import_row")
            result.refuse(n, item["type"], f"the store refused the row ({type(exc).__name__})")
        db.execute("RELEASE SAVEPOINT import_row")


def _write_one(db: Db, item: dict[str, Any], *, provider: str, now: str, result: ImportResult) -> None:
    kind, row = item["type"], item["row"]
    match kind:
        case "run":
            values = _values(row, _RUN)
            if db.execute("SELECT 1 FROM runs WHERE harness = ? AND run_id = ?", values[:2]).fetchone():
                result.count(result.present, kind)
                return
            text = item.get("text")
            record_id = None if text is None else db.execute(
                "INSERT INTO run_records (record) VALUES (?) RETURNING id", [text]).fetchone()[0]
            db.execute(f"INSERT INTO runs ({', '.join(_RUN)}, record_id) VALUES ({', '.join('?' * len(_RUN))}, ?)",
                       [*values, record_id])
            result.count(result.added, kind)
        case "run_path":
            done = db.execute(f"INSERT INTO run_paths ({', '.join(_RUN_PATH)}) VALUES (?,?,?,?)"
                              " ON CONFLICT DO NOTHING RETURNING 1", _values(row, _RUN_PATH)).fetchone()
            result.count(result.added if done else result.present, kind)
        case "episode":
            _episode(db, item, provider=provider, now=now, result=result)
        case "index":
            values = _values(row, _INDEX)
            if values[0] == provider == "builtin":
                return  # the built-in provider's documents are rebuilt by recording (the episode's queue)
            held = db.execute("SELECT scope FROM episodes WHERE episode_id = ?", [values[2]]).fetchone()
            if held is None:
                raise RowRefused(f"no episode {values[2]} in the store or before this line")
            values[3] = held[0]  # the episode's scope, never the file's
            done = db.execute(f"INSERT INTO memory_index ({', '.join(_INDEX)}) VALUES (?,?,?,?,?,?)"
                              " ON CONFLICT DO NOTHING RETURNING 1", values).fetchone()
            if done and values[0] == provider:
                # the provider holds this episode already: no record of it is needed
                db.execute("DELETE FROM pending WHERE kind = 'record' AND provider = ? AND episode_id = ?",
                           [provider, values[2]])
            result.count(result.added if done else result.present, kind)
        case "fact":
            fact = dict(zip(_FACT, _values(row, _FACT), strict=True))
            if db.execute("SELECT 1 FROM facts WHERE id = ?", [fact["id"]]).fetchone():
                result.count(result.present, kind)
                return
            db.dialect.upsert_fact(db, fact_id=fact["id"], scope=fact["scope"], text=fact["text"],
                                   confidence=float(fact["confidence"]), status=fact["status"],
                                   at=fact["created_at"])
            db.execute("UPDATE facts SET updated_at = ? WHERE id = ?", [fact["updated_at"], fact["id"]])
            result.count(result.added, kind)
        case other:
            raise RowRefused(f"unknown type {str(other)[:32]!r}")


def _episode(db: Db, item: dict[str, Any], *, provider: str, now: str, result: ImportResult) -> None:
    values = dict(zip(_EPISODE, _values(item["row"], _EPISODE), strict=True))
    gone = values["forgotten_at"] is not None
    kind = "tombstone" if gone else "episode"
    held = db.execute("SELECT forgotten_at FROM episodes WHERE episode_id = ?", [values["episode_id"]]).fetchone()
    if held is not None:
        if gone and held[0] is None:
            tombstone(db, values["episode_id"], now)  # forgotten there: forgotten here too, at the provider as well
            result.forgotten += 1
        else:
            result.count(result.present, kind)
        return
    text = None if gone else item.get("text")
    body_id = None if text is None else db.execute(
        "INSERT INTO episode_bodies (body) VALUES (?) RETURNING id", [text]).fetchone()[0]
    db.execute(f"INSERT INTO episodes ({', '.join(_EPISODE)}, body_id) VALUES ({', '.join('?' * len(_EPISODE))}, ?)",
               [*values.values(), body_id])
    result.count(result.added, kind)
    if not gone and body_id is not None:
        queue(db, "record", provider, values["episode_id"], now=now)
        result.queued += 1


async def import_lines(store: Store, lines: Iterable[str | Oversized], *, provider: str, check: Check, limit: int,
                       progress: Callable[[int], None] = lambda n: None,
                       now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> ImportResult:
    """Import an export (its lines, header first; `read_lines` gives them) into `store` for `provider`
    (the target daemon's configured provider). Each line is parsed and `check`ed; one that fails is
    refused (`ImportResult.refused`: its number, type and reason) and the import goes on. Raises
    PortableError for a file it cannot read at all (no header, another version); a file without its
    end line is imported as far as it goes and marked `cut_short`. Batches of BATCH lines, one transaction each (what came before
    a failure stays: importing the whole file again is safe)."""
    result = ImportResult()
    stamp = iso(now())
    it = iter(lines)
    first = next(it, None)
    if first is None:
        raise PortableError("the file is empty")
    if isinstance(first, Oversized):
        raise PortableError(f"line 1 is {first.size} characters: not a {FORMAT} header")
    result.header = read_header(first)
    batch: list[tuple[int, dict[str, Any]]] = []
    ended = False
    done = 0

    async def flush(batch: list[tuple[int, dict[str, Any]]]) -> None:
        nonlocal done
        await store.write(lambda db: _write_batch(db, batch, provider=provider, now=stamp, result=result))
        done += len(batch)
        progress(done)

    for n, line in enumerate(it, start=2):
        if isinstance(line, Oversized):
            result.refuse(n, None, f"the line is {line.size} characters; the limit is {limit}")
            continue
        if not line.strip():
            continue
        if ended:
            raise PortableError(f"line {n} follows the end line")
        kind = None
        try:
            item = _parse(line)
            kind = item["type"]
            if kind == "end":
                ended = True
                continue
            item = check(item)
        except RowRefused as exc:
            result.refuse(n, kind if kind is None else str(kind)[:32], str(exc))
            continue
        batch.append((n, item))
        if len(batch) >= BATCH:
            await flush(batch)
            batch = []
    if batch:
        await flush(batch)
    result.cut_short = not ended
    return result
