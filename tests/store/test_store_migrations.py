"""The schema migrations are versioned files per engine (``store/migrations/<engine>/NNNN_name.sql``,
package data), applied once each, in order, on a new store of either engine."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from memactors.builtin import index_pg
from memactors.store import Store
from memactors.store.engines import open_store

#: SQLite's two migrations that move data: Python in store/sqlite.py, with the SQL they run around it.
#: The migrations that move data are Python, not files (the words-stay-words pair among them).
PYTHON_MIGRATIONS = {"0006_builtin_scope_in_fts", "0009_flat_text_and_builtin_fields", "0012_words_stay_words"}
PG_PYTHON_MIGRATIONS = {"0005_words_stay_words"}


def _files(engine: str) -> list[str]:
    folder = resources.files("memactors.store").joinpath("migrations", engine)
    return sorted(f.name.removesuffix(".sql") for f in folder.iterdir() if f.name.endswith(".sql"))


@pytest.mark.both_engines
async def test_every_migration_file_is_applied_once_in_order(store: Store, engine: str) -> None:
    if engine == "sqlite":
        expected = sorted({*_files("sqlite"), *PYTHON_MIGRATIONS})
        table = "_sqlite_migrations"
    else:
        expected = sorted({*_files("pg"), *PG_PYTHON_MIGRATIONS})
        table = "memactors_migrations"
    applied = await store.read(lambda db: [r[0] for r in db.execute(f"SELECT name FROM {table}").fetchall()])
    assert sorted(applied) == expected
    assert len(applied) == len(set(applied))
    assert expected[0].startswith("0001_") and len(expected) >= 4


def test_the_pg_builtin_tables_are_built_as_index_pg_queries_them() -> None:
    """0002_builtin's generated `tsv` column uses the word splitting and the scope token that
    builtin.index_pg's queries match (a frozen migration, so a change to either must be a new one)."""
    sql = resources.files("memactors.store").joinpath("migrations/pg/0002_builtin.sql").read_text("utf-8")
    assert index_pg.SCOPE_TOKEN_SQL in sql
    for column in ("'title'", "'files'", "'meta'"):
        assert index_pg._words_sql(column.strip("'")) in sql
    assert 'TEXT COLLATE "C"' in sql and "CREATE TABLE builtin_docs" in sql
    packs = resources.files("memactors.store").joinpath("migrations/pg/0010_vector_packs.sql").read_text("utf-8")
    assert index_pg.SCOPE_TOKEN_SQL in packs and index_pg._words_sql("meta") in packs  # `meta_tsv`, as `tsv`'s D part


@pytest.mark.both_engines
async def test_a_store_made_before_the_session_index_gets_it_and_the_import_lookup_reads_through_it(
        tmp_path: Path, store_url: str | None, engine: str) -> None:
    """An import asks whether an agent's session is recorded already under any harness (`sessions_recorded`:
    runs by adapter and run id). A store made before the index (its migration not yet applied) gets it when
    next opened, and that lookup's plan uses it instead of reading every run."""
    target = store_url or tmp_path / "m.db"
    name = "0006_runs_by_session" if engine == "postgresql" else "0013_runs_by_session"
    marks = "memactors_migrations" if engine == "postgresql" else "_sqlite_migrations"
    store = await open_store(target)

    def as_before(db: Any) -> None:
        db.execute("DROP INDEX runs_by_session")
        db.execute(f"DELETE FROM {marks} WHERE name = ?", [name])
    await store.write(as_before)
    store.close()
    reopened = await open_store(target)
    try:
        lookup = "SELECT harness, run_id, started_at FROM runs WHERE adapter = ? AND run_id IN (?, ?)"
        args = ["claude-code", "s1", "s2"]
        if engine == "postgresql":
            def plan(db: Any) -> str:
                db.execute("SET LOCAL enable_seqscan = off")  # an empty table: ask whether the index can serve
                return "\n".join(r[0] for r in db.execute(f"EXPLAIN {lookup}", args).fetchall())
        else:
            def plan(db: Any) -> str:
                return "\n".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {lookup}", args).fetchall())
        assert "runs_by_session" in await reopened.read(plan)
        applied = await reopened.read(lambda db: db.execute(f"SELECT name FROM {marks} WHERE name = ?",
                                                            [name]).fetchall())
        assert len(applied) == 1
    finally:
        reopened.close()
