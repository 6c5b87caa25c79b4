"""`memactors store export` / `store import`: memory as versioned JSON lines (issue 27).

The file is one JSON object a line. The first is the header::

    {"type": "header", "format": "memactors-export", "version": 1, "engine": "sqlite", "exported_at": …, "filter": {…}}

then one line per row, ``{"type": T, "row": {column: value, …}}``, with T one of ``run`` (its stored
record's text in ``text``), ``run_path``, ``episode`` (its REQ-5 body's text in ``text``; null for a
forgotten one: a *tombstone*), ``index`` (an index row: provider, provider id, episode, scope, times)
and ``fact``; and last ``{"type": "end", "counts": {…}}``, so a file cut short is told from a whole one.
Rows are the store's own columns and values (every time is the store's one `iso` text), never a
per-engine form, so a SQLite export imports into PostgreSQL and back.

Import writes a store the daemon is not running on (the CLI takes the state directory's lock for a
SQLite one). What the target already holds wins: a run, episode or fact it has is skipped, so importing
twice adds nothing. Forgotten stays forgotten, both ways: a tombstone in the file is imported as one
(the run row with it, so the run is never ingested again), and an episode the target holds live is
forgotten through the retention actor's own `tombstone` (handed in: the store knows nothing of actors),
which queues its forgets at the provider; an episode the target has forgotten is never revived.

Live episodes are recorded to the target's provider by the daemon itself: each is queued as a pending
record (the path every acknowledged episode takes, from its stored copy), so the built-in provider's
documents (full text, vectors) are rebuilt by its own code when the daemon next runs. Index rows of
another provider (an external one, which still holds its documents) are imported as they are.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import attrs

from . import Db, Store, iso

__all__ = ["FORMAT", "VERSION", "ExportFilter", "ImportResult", "PortableError", "export_lines", "import_lines"]

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

#: Forget one episode in a write transaction (`actors.retention.tombstone`): (db, episode id, now) → bool.
Forget = Callable[[Db, str, str], bool]


class PortableError(ValueError):
    """Raised when an export file cannot be imported: no header, another format or version, a bad line."""


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
        rows = await store.read(lambda db, sql=sql, args=args: [tuple(r) for r in db.execute(sql, args)])
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
    recording to the target's provider)."""

    added: dict[str, int] = attrs.field(factory=dict)
    present: dict[str, int] = attrs.field(factory=dict)
    forgotten: int = 0
    queued: int = 0
    header: dict[str, Any] = attrs.field(factory=dict)

    def count(self, which: dict[str, int], kind: str, n: int = 1) -> None:
        which[kind] = which.get(kind, 0) + n


def read_header(line: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PortableError(f"line 1 is not a {FORMAT} header")
    if header.get("version") != VERSION:
        raise PortableError(f"export version {header.get('version')!r}: this memactors reads version {VERSION}")
    return header


def _parse(n: int, line: str) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except ValueError:
        raise PortableError(f"line {n} is not JSON") from None
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise PortableError(f"line {n} is not an export line")
    if item["type"] != "end" and not isinstance(item.get("row"), dict):
        raise PortableError(f"line {n} has no row")
    return item


def _values(n: int, row: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    missing = [c for c in names if c not in row]
    if missing:
        raise PortableError(f"line {n}: the row lacks {', '.join(missing)}")
    return [row[c] for c in names]


def _write_batch(db: Db, items: list[tuple[int, dict[str, Any]]], *, provider: str, now: str, forget: Forget,
                 result: ImportResult) -> None:
    for n, item in items:
        kind, row = item["type"], item["row"]
        match kind:
            case "run":
                values = _values(n, row, _RUN)
                if db.execute("SELECT 1 FROM runs WHERE harness = ? AND run_id = ?", values[:2]).fetchone():
                    result.count(result.present, kind)
                    continue
                text = item.get("text")
                record_id = None if text is None else db.execute(
                    "INSERT INTO run_records (record) VALUES (?) RETURNING id", [text]).fetchone()[0]
                db.execute(f"INSERT INTO runs ({', '.join(_RUN)}, record_id) VALUES ({', '.join('?' * len(_RUN))}, ?)",
                           [*values, record_id])
                result.count(result.added, kind)
            case "run_path":
                done = db.execute(f"INSERT INTO run_paths ({', '.join(_RUN_PATH)}) VALUES (?,?,?,?)"
                                  " ON CONFLICT DO NOTHING RETURNING 1", _values(n, row, _RUN_PATH)).fetchone()
                result.count(result.added if done else result.present, kind)
            case "episode":
                _episode(db, n, item, provider=provider, now=now, forget=forget, result=result)
            case "index":
                values = _values(n, row, _INDEX)
                if values[0] == provider == "builtin":
                    continue  # the built-in provider's documents are rebuilt by recording (the episode's queue)
                done = db.execute(f"INSERT INTO memory_index ({', '.join(_INDEX)}) VALUES (?,?,?,?,?,?)"
                                  " ON CONFLICT DO NOTHING RETURNING 1", values).fetchone()
                if done and values[0] == provider:
                    # the provider holds this episode already: no record of it is needed
                    db.execute("DELETE FROM pending WHERE kind = 'record' AND provider = ? AND episode_id = ?",
                               [provider, values[2]])
                result.count(result.added if done else result.present, kind)
            case "fact":
                values = dict(zip(_FACT, _values(n, row, _FACT), strict=True))
                if db.execute("SELECT 1 FROM facts WHERE id = ?", [values["id"]]).fetchone():
                    result.count(result.present, kind)
                    continue
                db.dialect.upsert_fact(db, fact_id=values["id"], scope=values["scope"], text=values["text"],
                                       confidence=float(values["confidence"]), status=values["status"],
                                       at=values["created_at"])
                db.execute("UPDATE facts SET updated_at = ? WHERE id = ?", [values["updated_at"], values["id"]])
                result.count(result.added, kind)
            case other:
                raise PortableError(f"line {n}: unknown type {other!r}")


def _episode(db: Db, n: int, item: dict[str, Any], *, provider: str, now: str, forget: Forget,
             result: ImportResult) -> None:
    values = dict(zip(_EPISODE, _values(n, item["row"], _EPISODE), strict=True))
    gone = values["forgotten_at"] is not None
    kind = "tombstone" if gone else "episode"
    held = db.execute("SELECT forgotten_at FROM episodes WHERE episode_id = ?", [values["episode_id"]]).fetchone()
    if held is not None:
        if gone and held[0] is None:
            forget(db, values["episode_id"], now)  # forgotten there: forgotten here too, at the provider as well
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
        db.execute("INSERT INTO pending (kind, provider, episode_id, provider_id, first_at, next_at)"
                   " VALUES ('record', ?, ?, '', ?, ?) ON CONFLICT DO NOTHING",
                   [provider, values["episode_id"], now, now])
        result.queued += 1


async def import_lines(store: Store, lines: Iterable[str], *, provider: str, forget: Forget,
                       progress: Callable[[int], None] = lambda n: None,
                       now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> ImportResult:
    """Import an export (its lines, header first) into `store` for `provider` (the target daemon's
    configured provider); raises PortableError naming the first line it cannot read. Batches of BATCH
    lines, one transaction each; a file without its end line is refused once read to its end (what
    came before stays: importing the whole file again is safe)."""
    result = ImportResult()
    stamp = iso(now())
    it = iter(lines)
    first = next(it, None)
    if first is None:
        raise PortableError("the file is empty")
    result.header = read_header(first)
    batch: list[tuple[int, dict[str, Any]]] = []
    ended = False
    done = 0
    for n, line in enumerate(it, start=2):
        if not line.strip():
            continue
        if ended:
            raise PortableError(f"line {n} follows the end line")
        item = _parse(n, line)
        if item["type"] == "end":
            ended = True
            continue
        batch.append((n, item))
        if len(batch) >= BATCH:
            await store.write(lambda db, b=batch: _write_batch(db, b, provider=provider, now=stamp, forget=forget,
                                                               result=result))
            done += len(batch)
            progress(done)
            batch = []
    if batch:
        await store.write(lambda db, b=batch: _write_batch(db, b, provider=provider, now=stamp, forget=forget,
                                                           result=result))
        done += len(batch)
        progress(done)
    if not ended:
        raise PortableError("the file ends before its end line: it was cut short (what it held is imported; "
                            "import the whole file again)")
    return result
