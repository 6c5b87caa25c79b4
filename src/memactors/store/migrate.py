"""`memactors store migrate --to postgresql://…`: copy a SQLite store into a PostgreSQL one.

Every table is copied; every id a user, a harness or a provider sees is kept (episode ids, run ids,
fact ids, provider ids, run-token hashes) and every time (they are the same `iso` text on both
engines). The integer row ids that only tie the store's own tables together (`run_records.id`,
`episode_bodies.id`, the call log's, exposures' and votes' ids) are given by PostgreSQL, and the rows
that point to them follow; so several hosts' SQLite stores can be moved into one PostgreSQL store, one
after the other, and meet there (docs/fleet.md).

The built-in provider's documents are re-indexed: each `builtin_docs` row is inserted with its fields
and PostgreSQL computes its `tsvector`; vectors go into pgvector when it is installed (else the
embedding cache is copied and doctor counts the episodes without a vector).

Safe to run twice (or after an interruption): rows keyed by their own ids are skipped when the target
has them (`ON CONFLICT DO NOTHING`, a run or an episode already there keeps its record and body), and the
append-only tables (call log, exposures, votes) resume after the last row this source copied
(`memactors_imports`). The end is a verification: for every table, how many of the source's rows the
target holds.

The daemon must not run on the source meanwhile: the state directory's lock is taken for the copy.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from . import Db, Store

#: Rows read and written per transaction.
BATCH = 500

Progress = Callable[[str, int, int], None]
#: The built-in provider's vector copy (``builtin.index_pg.copy_vectors``), handed in by the caller.
CopyVectors = Callable[[Store, Store], Awaitable[None]]


@attrs.frozen
class Table:
    """How one table is copied: its columns, the key that says a row is already there, and the kind."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...] = ()
    #: "plain" (insert, skip when the key exists), "append" (integer id, resumed by `memactors_imports`),
    #: or a custom copier's name.
    kind: str = "plain"
    #: (text table, its column, the pointer column): the row's text read with it (runs' record,
    #: episodes' body), so a batch carries its texts and memory stays bounded.
    text: tuple[str, str, str] | None = None


TABLES: tuple[Table, ...] = (
    Table("runs", ("harness", "run_id", "adapter", "started_at", "ended_at", "outcome", "reason", "duration_ms",
                   "repo", "branch", "ingested_at", "record_id"), ("harness", "run_id"), "texts",
          ("run_records", "record", "record_id")),
    Table("run_paths", ("harness", "run_id", "repo", "path"), ("harness", "run_id", "repo", "path")),
    Table("episodes", ("episode_id", "harness", "run_id", "repo", "branch", "scope", "trust_class", "outcome",
                       "started_at", "recorded_at", "forgotten_at", "body_id"), ("episode_id",), "texts",
          ("episode_bodies", "body", "body_id")),
    Table("memory_index", ("provider", "provider_id", "episode_id", "scope", "recorded_at", "forgotten_at"),
          ("provider", "provider_id")),
    Table("pending", ("kind", "provider", "episode_id", "provider_id", "state", "attempts", "first_at", "next_at",
                      "last_error"), ("kind", "provider", "episode_id", "provider_id")),
    Table("facts", ("id", "scope", "text", "confidence", "status", "created_at", "updated_at"), ("id",)),
    Table("pull_requests", ("repo", "branch", "url", "linked_at"), ("repo", "branch", "url")),
    Table("presence", ("harness", "run_id", "session_id", "repo", "branch", "paths", "reported_at", "expires_at"),
          ("harness", "run_id", "session_id")),
    Table("briefings", ("harness", "run_id", "document", "doc_json", "items", "computed_at"), ("harness", "run_id")),
    Table("run_callers", ("token_sha256", "harness", "run_id", "workdir", "created_at", "expires_at"),
          ("token_sha256",)),
    Table("agent_runs", ("harness", "run_id", "state", "started_at", "ended_at", "view", "stderr_tail", "log"),
          ("harness", "run_id")),
    Table("call_log", ("id", "at", "caller", "server", "tool", "args_sha256", "outcome", "duration_ms"), ("id",),
          "append"),
    Table("exposures", ("id", "run_id", "harness", "fact_id", "surface", "call_id", "at"), ("id",), "append"),
    Table("votes", ("id", "fact_id", "run_id", "harness", "stance", "counted", "at"), ("id",), "append"),
    Table("builtin_docs", ("episode_id", "scope", "title", "excerpt", "summary", "files", "failures", "meta",
                           "harness", "branch", "outcome", "started_at", "content_hash"), ("episode_id",),
          "builtin_docs"),
    Table("builtin_embed_cache", ("content_hash", "model", "dim", "vector"), ("content_hash", "model")),
)


@attrs.frozen
class Verified:
    table: str
    source: int
    target: int

    @property
    def ok(self) -> bool:
        return self.target >= self.source


def _exists(db: Db, table: str) -> bool:
    return bool(db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [table]).fetchone())


async def source_counts(source: Store) -> dict[str, int]:
    def read(db: Db) -> dict[str, int]:
        return {t.name: int(db.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0])
                for t in TABLES if _exists(db, t.name)}

    return await source.read(read)


def _marks(n: int) -> str:
    return ",".join("?" * n)


async def _batches(source: Store, table: Table, after: Any = None) -> Any:
    """The source table's rows in key order, BATCH at a time (keyset paging: no OFFSET); with the row's
    text last when the table has one (`Table.text`)."""
    cols = ", ".join(f"{table.name}.{c}" for c in table.columns)
    key = ", ".join(f"{table.name}.{k}" for k in table.key)
    joined = ""
    if table.text is not None:
        texts, column, pointer = table.text
        cols += f", {texts}.{column}"
        joined = f" LEFT JOIN {texts} ON {texts}.id = {table.name}.{pointer}"
    last: tuple[Any, ...] | None = (after,) if after is not None else None
    while True:
        where = f" WHERE ({key}) > ({_marks(len(table.key))})" if last is not None else ""

        def read(db: Db, where: str = where, last: Any = last) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in db.execute(
                f"SELECT {cols} FROM {table.name}{joined}{where} ORDER BY {key} LIMIT {BATCH}", list(last or ()))]

        rows = await source.read(read)
        if not rows:
            return
        yield rows
        if len(rows) < BATCH:
            return
        positions = [table.columns.index(k) for k in table.key]
        last = tuple(rows[-1][i] for i in positions)


def _insert(table: str, columns: Sequence[str], conflict: Sequence[str]) -> str:
    return (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({_marks(len(columns))})"
            f" ON CONFLICT ({', '.join(conflict)}) DO NOTHING")


async def copy_store(source: Store, target: Store, *, source_id: str, copy_vectors: CopyVectors,
                     progress: Progress = lambda t, d, n: None) -> list[Verified]:
    """Copy every table of `source` (SQLite) into `target` (PostgreSQL), then the built-in provider's
    vectors (`copy_vectors`: the provider's own, ``builtin.index_pg.copy_vectors``, the store knowing
    nothing of sqlite-vec or pgvector); returns the verification."""
    counts = await source_counts(source)
    total = sum(counts.values())
    done = 0
    for table in TABLES:
        if table.name not in counts:
            continue
        copied = 0
        after = None
        if table.kind == "append":
            def imported(db: Db, t: str = table.name) -> Any:
                return db.execute("SELECT last_id FROM memactors_imports WHERE source = ? AND table_name = ?",
                                  [source_id, t]).fetchone()

            after = await target.read(imported)
            after = after[0] if after else None
        async for rows in _batches(source, table, after):
            def copy_batch(db: Db, t: Table = table, rows: Any = rows) -> Any:
                return _write(db, t, rows, source_id)

            await target.write(copy_batch)
            copied += len(rows)
            done += len(rows)
            progress(table.name, done, total)
        if table.kind == "append" and not copied:
            progress(table.name, done, total)
    await copy_vectors(source, target)
    return await verify(source, target, counts, source_id)


def _write(db: Db, table: Table, rows: list[tuple[Any, ...]], source_id: str) -> None:
    match table.kind:
        case "plain":
            db.executemany(_insert(table.name, table.columns, table.key), rows)
        case "append":
            cols = table.columns[1:]  # a new id from the target; the source's id is the resume point
            db.executemany(f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES ({_marks(len(cols))})",
                           [r[1:] for r in rows])
            db.execute("INSERT INTO memactors_imports (source, table_name, last_id) VALUES (?, ?, ?)"
                       " ON CONFLICT (source, table_name) DO UPDATE SET last_id = excluded.last_id",
                       [source_id, table.name, rows[-1][0]])
        case "texts":
            _copy_with_text(db, rows, table)
        case "builtin_docs":
            for r in rows:
                row = dict(zip(table.columns, r, strict=True))
                files = json.loads(row["files"] or "[]")
                db.execute(
                    "INSERT INTO builtin_docs (episode_id, scope, title, excerpt, summary, files, paths, failures,"
                    " meta, harness, branch, outcome, started_at, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (episode_id) DO NOTHING",
                    [row["episode_id"], row["scope"], row["title"], row["excerpt"], row["summary"], row["files"],
                     list(dict.fromkeys(str(f) for f in files)), row["failures"], row["meta"], row["harness"],
                     row["branch"], row["outcome"], row["started_at"], row["content_hash"]])
        case other:
            raise ValueError(f"no copier for {other}")


def _copy_with_text(db: Db, rows: list[tuple[Any, ...]], table: Table) -> None:
    """Runs (with their record) or episodes (with their body): a row the target has already is skipped
    with its text; a new one gets its text inserted first, under the id the target gives it."""
    assert table.text is not None
    texts, column, pointer = table.text
    for r in rows:
        row = dict(zip(table.columns, r[:-1], strict=True))
        text = r[-1]
        present = db.execute(f"SELECT 1 FROM {table.name} WHERE {' AND '.join(f'{k} = ?' for k in table.key)}",
                             [row[k] for k in table.key]).fetchone()
        if present is not None:
            continue
        row[pointer] = None if text is None else db.execute(
            f"INSERT INTO {texts} ({column}) VALUES (?) RETURNING id", [text]).fetchone()[0]
        db.execute(_insert(table.name, table.columns, table.key), [row[c] for c in table.columns])


async def verify(source: Store, target: Store, counts: dict[str, int], source_id: str) -> list[Verified]:
    """How many of the source's rows the target holds, per table: rows keyed by their own ids are looked
    up by key; the append-only tables by what this source copied (`memactors_imports`)."""
    out: list[Verified] = []
    for table in TABLES:
        if table.name not in counts:
            continue
        if table.kind == "append":
            def imported(db: Db, t: str = table.name) -> Any:
                return db.execute("SELECT last_id FROM memactors_imports WHERE source = ? AND table_name = ?",
                                  [source_id, t]).fetchone()

            copied = await target.read(imported)
            last = copied[0] if copied else None
            held = counts[table.name] if last is not None else 0
            if last is not None:
                def upto_last(db: Db, t: str = table.name, last: Any = last) -> Any:
                    return db.execute(f"SELECT count(*) FROM {t} WHERE id <= ?", [last]).fetchone()[0]

                upto = await source.read(upto_last)
                held = int(upto)
            out.append(Verified(table.name, counts[table.name], held))
            continue
        held = 0
        async for rows in _batches(source, Table(table.name, table.key, table.key)):
            keys = [tuple(r) for r in rows]
            cond = " OR ".join(f"({' AND '.join(f'{k} = ?' for k in table.key)})" for _ in keys)
            flat = [v for key in keys for v in key]
            def present(db: Db, cond: str = cond, flat: list[Any] = flat, t: str = table.name) -> Any:
                return db.execute(f"SELECT count(*) FROM {t} WHERE {cond}", flat).fetchone()[0]

            held += int(await target.read(present))
        out.append(Verified(table.name, counts[table.name], held))
    return out


async def migrate(source: Store, target: Store, *, source_id: str, copy_vectors: CopyVectors,
                  progress: Progress = lambda t, d, n: None) -> list[Verified]:
    """Copy `source` (a SQLite store) into `target` (a PostgreSQL one); returns the verification."""
    if target.engine != "postgresql":
        raise ValueError("store migrate copies into a PostgreSQL store")
    return await copy_store(source, target, source_id=source_id, copy_vectors=copy_vectors, progress=progress)


__all__ = ["TABLES", "Verified", "migrate"]
