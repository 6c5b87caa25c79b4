"""The SQLite engine of the store: the embedded default (one file in the state directory).

Connections come from sqlean-py (SQLite 3.50 with FTS5 and extension loading; the stdlib sqlite3 here
cannot load sqlite-vec) wrapped in sqlite-utils. The schema is the sqlite-utils `Migrations` below
(`migrations`, applied at open), as `store.pg.MIGRATIONS` is PostgreSQL's. Only this module and the
built-in provider's SQLite half know they run on SQLite.

Readers: a bounded pool, at most as many as the read limiter admits at once, opened lazily, checked out
for one call and handed back, closed by `close()`. Connections are never tied to worker threads,
because trio retires idle worker threads and a per-thread connection would outlive its thread (an fd
leak).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import sqlean
import sqlite_utils
import sqlite_vec
import trio
from sqlite_utils.migrations import Migrations

from ..episode import flatten
from ..errors import StoreDamaged
from . import WORD, Store, _WriteJob, private_dir, private_file, run_jobs, scope_doc_id, scope_key
from .builtin_docs import BM25_WEIGHTS, doc_fields, flat_strings, words_stay_words
from .health import WriteHealth, disk_full_at_start

T = TypeVar("T")

#: The page size of a new store (an existing one keeps the page size it was created with).
PAGE_SIZE = 8192
#: Read connections open at most at once (the read limiter's size).
READ_CONNECTIONS = 4


def fts_match(query: str) -> str | None:
    """A safe FTS5 MATCH expression for the store's FTS5 tables (episodes, facts).

    Every distinct word of the query, double-quoted and OR-ed: quoting keeps FTS5 operators (AND, NEAR,
    '*', '-', column filters) in user text inert. None when the query has no words.
    """
    words = WORD.findall(query.lower())
    if not words:
        return None
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


#: The schema, applied at open. Each migration's SQL is a versioned file of this package
#: (``store/migrations/sqlite/NNNN_name.sql``); the three that move data (0006, 0009, 0012) are Python below,
#: with the SQL they run around it.
migrations = Migrations("memactors")


def _sql(name: str) -> str:
    """The SQL of migration `name`, from its file (package data)."""
    return resources.files("memactors.store").joinpath(f"migrations/sqlite/{name}.sql").read_text(encoding="utf-8")


@migrations(name="0001_initial")
def _m0001(db: sqlite_utils.Database) -> None:
    db.executescript(_sql("0001_initial"))


@migrations(name="0002_facts_graph")
def _m0002(db: sqlite_utils.Database) -> None:
    """Facts, exposure, votes, pull-request links, presence, the per-run briefing cache, run tokens."""
    db.executescript(_sql("0002_facts_graph"))


@migrations(name="0003_providers")
def _m0003_providers(db: sqlite_utils.Database) -> None:
    """The built-in provider's embedding cache and settings (REQ-11), and an index for due retries.

    The vec0 table itself (`builtin_vec`) is created lazily by the built-in provider once the embedding
    dimension is known; `builtin_meta` remembers the model and dimension it was built for.
    """
    db.executescript(_sql("0003_providers"))


@migrations(name="0004_run_token_expiry")
def _m0004_run_token_expiry(db: sqlite_utils.Database) -> None:
    """Run tokens end with their run (plus a short grace): an expiry per token, NULL for no expiry."""
    db.execute(_sql("0004_run_token_expiry"))


@migrations(name="0006_builtin_scope_in_fts")
def _m0006_builtin_scope_in_fts(db: sqlite_utils.Database) -> None:
    """The built-in provider's FTS5 index becomes external-content over `builtin_docs` (the text is
    stored once, in builtin_docs) with a `scope_key` column, so a recall restricts its match to the
    caller's scopes inside FTS5 and its cost follows the caller's repository, not the store.

    Triggers keep the index in step with builtin_docs on insert, update and delete. `rank` is BM25 with
    weight 0 on the scope column, so scores are the text/summary BM25 they were before. Existing
    databases are upgraded in place: the old (contentful) table is dropped and the index rebuilt.
    """
    db.execute("ALTER TABLE builtin_docs ADD COLUMN scope_key TEXT NOT NULL DEFAULT ''")
    db.execute("CREATE TABLE builtin_scopes (scope TEXT PRIMARY KEY, num INTEGER NOT NULL UNIQUE,"
               " next_seq INTEGER NOT NULL)")
    # Every scope's documents get doc ids in their own range (scope number << 32 | sequence), so a
    # recall's FTS5 match is bounded by rowid to the caller's repository. Existing ids are renumbered
    # (and their vectors moved with them).
    vec = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'builtin_vec'").fetchone() is not None
    vectors = {}
    if vec:
        vectors = {int(d): (s, bytes(e)) for d, s, e in db.execute("SELECT doc_id, scope, embedding FROM builtin_vec")}
        db.execute("DELETE FROM builtin_vec")
    db.execute("DROP TABLE IF EXISTS builtin_fts")  # rebuilt below, external content
    for doc_id, scope in db.execute("SELECT doc_id, scope FROM builtin_docs ORDER BY doc_id").fetchall():
        new_id = scope_doc_id(db, scope)
        db.execute("UPDATE builtin_docs SET doc_id = ?, scope_key = ? WHERE doc_id = ?",
                   [new_id, scope_key(scope), doc_id])
        if doc_id in vectors:
            vscope, blob = vectors[doc_id]
            db.execute("INSERT INTO builtin_vec (doc_id, scope, embedding) VALUES (?, ?, ?)", [new_id, vscope, blob])
    db.executescript(
        """
        CREATE VIRTUAL TABLE builtin_fts USING fts5 (
            scope_key, text, summary,
            content = 'builtin_docs', content_rowid = 'doc_id', tokenize = 'porter unicode61');
        CREATE TRIGGER builtin_docs_fts_insert AFTER INSERT ON builtin_docs BEGIN
            INSERT INTO builtin_fts (rowid, scope_key, text, summary)
            VALUES (new.doc_id, new.scope_key, new.text, new.summary);
        END;
        CREATE TRIGGER builtin_docs_fts_delete AFTER DELETE ON builtin_docs BEGIN
            INSERT INTO builtin_fts (builtin_fts, rowid, scope_key, text, summary)
            VALUES ('delete', old.doc_id, old.scope_key, old.text, old.summary);
        END;
        CREATE TRIGGER builtin_docs_fts_update AFTER UPDATE OF scope_key, text, summary ON builtin_docs BEGIN
            INSERT INTO builtin_fts (builtin_fts, rowid, scope_key, text, summary)
            VALUES ('delete', old.doc_id, old.scope_key, old.text, old.summary);
            INSERT INTO builtin_fts (rowid, scope_key, text, summary)
            VALUES (new.doc_id, new.scope_key, new.text, new.summary);
        END;
        INSERT INTO builtin_fts (builtin_fts) VALUES ('rebuild');
        INSERT INTO builtin_fts (builtin_fts, rank) VALUES ('rank', 'bm25(0.0, 1.0, 1.0)');
        """
    )


@migrations(name="0007_episode_text_from_body")
def _m0007_episode_text_from_body(db: sqlite_utils.Database) -> None:
    """`episodes.text` goes: the REQ-5 text rendering is a pure function of the stored body
    (`episode.render_text`), so keeping it beside the body was a second copy of every episode's result
    excerpt (~1 KB an episode). Its readers render it from the body: the retry loop (the
    `text` of memory_record_episode), the operator's episode view, and REQ-9's text check
    (`index.text_belongs_body`). SQLite rewrites the table; with secure_delete on, the dropped copies
    are overwritten."""
    db.execute(_sql("0007_episode_text_from_body"))


@migrations(name="0008_texts_in_their_own_tables")
def _m0008_texts_in_their_own_tables(db: sqlite_utils.Database) -> None:
    """An episode's body and a run's record move to tables of their own (`episode_bodies`,
    `run_records`, each keyed by an id that grows with every insert), referenced by
    `episodes.body_id` and `runs.record_id`.

    Why: forgetting an episode (REQ-10) removes its text but keeps its tombstone (the episode, run and
    index rows). With the text inside those rows, the forget shrank each row in place and left most
    of its page empty, a hole later episodes never filled (they are appended at the end of the table):
    under retention the store grew by ~4 KB per episode recorded, forgotten or not
    (bench/steady_state.py). Now a forget deletes the text's own row; as retention forgets the oldest
    first, whole pages of `episode_bodies` and `run_records` empty out and go back to the free list,
    and the next episodes are written into them: the file stops growing, without VACUUM.

    A run record is deleted whole when its episode is forgotten (the runs row keeps its ids, times,
    outcome, repository and paths for the graph: what the graph knows, not what the agent wrote).
    Existing stores are moved in place.
    """
    db.executescript(_sql("0008_texts_in_their_own_tables"))




#: builtin_fts's BM25 weights per column as configured by migration 0009 (builtin_docs.BM25_WEIGHTS).
_BUILTIN_FTS_SQL = """
    CREATE VIRTUAL TABLE builtin_fts USING fts5 (
        scope_key, title, excerpt, files, failures, meta,
        content = 'builtin_docs', content_rowid = 'doc_id', tokenize = 'porter unicode61');
    CREATE TRIGGER builtin_docs_fts_insert AFTER INSERT ON builtin_docs BEGIN
        INSERT INTO builtin_fts (rowid, scope_key, title, excerpt, files, failures, meta)
        VALUES (new.doc_id, new.scope_key, new.title, new.excerpt, new.files, new.failures, new.meta);
    END;
    CREATE TRIGGER builtin_docs_fts_delete AFTER DELETE ON builtin_docs BEGIN
        INSERT INTO builtin_fts (builtin_fts, rowid, scope_key, title, excerpt, files, failures, meta)
        VALUES ('delete', old.doc_id, old.scope_key, old.title, old.excerpt, old.files, old.failures, old.meta);
    END;
    CREATE TRIGGER builtin_docs_fts_update
    AFTER UPDATE OF scope_key, title, excerpt, files, failures, meta ON builtin_docs BEGIN
        INSERT INTO builtin_fts (builtin_fts, rowid, scope_key, title, excerpt, files, failures, meta)
        VALUES ('delete', old.doc_id, old.scope_key, old.title, old.excerpt, old.files, old.failures, old.meta);
        INSERT INTO builtin_fts (rowid, scope_key, title, excerpt, files, failures, meta)
        VALUES (new.doc_id, new.scope_key, new.title, new.excerpt, new.files, new.failures, new.meta);
    END;
    INSERT INTO builtin_fts (builtin_fts) VALUES ('rebuild');
"""


@migrations(name="0009_flat_text_and_builtin_fields")
def _m0009_flat_text_and_builtin_fields(db: sqlite_utils.Database) -> None:
    """Index the words, not their escapes; index what a run said, touched and failed apart
    from its metadata.

    1. Every string of every stored episode body is flattened (`episode.flatten`: a run of line
       breaks and tabs is one space, REQ-6 as docs/contracts.md now says), so its rendering holds the
       words themselves, never `\\n` before a word.
    2. The built-in provider's document becomes fields instead of one rendering: `title` (the summary,
       else the start of the excerpt), `excerpt`, `files` (the JSON list it already kept), `failures`
       (JSON `[[error_class, count], ...]`), `meta` (harness, adapter, model, repository, branch,
       outcome, reason, run id, pull request) and plain `harness`, `branch`, `outcome` columns;
       `text` goes. Each is read from the stored rendering (its escapes read as spaces).
       `builtin_fts` is rebuilt over those columns (`scope_key, title, excerpt, files, failures,
       meta`), so a query can tell a match in what the run did from a match in the metadata every
       episode of the scope shares (REQ-14's briefing query), and weigh each column.
    Doc ids (and so vectors) and content hashes (and so the embedding cache) are unchanged.
    """
    for body_id, body in db.execute("SELECT id, body FROM episode_bodies").fetchall():
        data = json.loads(body)
        flat = flat_strings(data, flatten)
        if flat != data:
            db.execute("UPDATE episode_bodies SET body = ? WHERE id = ?",
                       [json.dumps(flat, ensure_ascii=False, separators=(",", ":")), body_id])
    db.executescript(
        """
        DROP TRIGGER IF EXISTS builtin_docs_fts_insert;
        DROP TRIGGER IF EXISTS builtin_docs_fts_delete;
        DROP TRIGGER IF EXISTS builtin_docs_fts_update;
        DROP TABLE IF EXISTS builtin_fts;
        ALTER TABLE builtin_docs ADD COLUMN title TEXT NOT NULL DEFAULT '';
        ALTER TABLE builtin_docs ADD COLUMN excerpt TEXT NOT NULL DEFAULT '';
        ALTER TABLE builtin_docs ADD COLUMN failures TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE builtin_docs ADD COLUMN meta TEXT NOT NULL DEFAULT '';
        ALTER TABLE builtin_docs ADD COLUMN harness TEXT NOT NULL DEFAULT '';
        ALTER TABLE builtin_docs ADD COLUMN branch TEXT NOT NULL DEFAULT '';
        ALTER TABLE builtin_docs ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
        """
    )
    rows = db.execute("SELECT doc_id, text, summary, files FROM builtin_docs").fetchall()
    for doc_id, text, summary, files in rows:
        f = doc_fields(text, {"summary": summary or None, "files_touched": json.loads(files)}, escaped=True)
        db.execute(
            "UPDATE builtin_docs SET title = ?, excerpt = ?, summary = ?, failures = ?, meta = ?, harness = ?,"
            " branch = ?, outcome = ? WHERE doc_id = ?",
            [f.title, f.excerpt, f.summary, json.dumps([list(x) for x in f.failures], ensure_ascii=False), f.meta,
             f.harness, f.branch, f.outcome, doc_id])
    db.execute("ALTER TABLE builtin_docs DROP COLUMN text")
    db.execute("CREATE INDEX builtin_docs_by_scope_time ON builtin_docs (scope, started_at)")
    db.executescript(_BUILTIN_FTS_SQL)
    weights = ", ".join(repr(float(w)) for w in BM25_WEIGHTS)
    db.execute("INSERT INTO builtin_fts (builtin_fts, rank) VALUES ('rank', ?)", [f"bm25({weights})"])


@migrations(name="0010_agent_runs")
def _m0010_agent_runs(db: sqlite_utils.Database) -> None:
    """The runs the daemon starts (`memactors run`), from spawn to end, so `memactors runs list/show`
    answer after a restart too. One row per run: its state and the operator's view of it
    (JSON: pid, times, outcome, reason, episode, caps); the redacted tail of the agent's stderr and its
    parsed, redacted event log (JSON lines) are kept beside it, never in the episode (REQ-5).

    When the run's episode is forgotten (REQ-10 sets `runs.record_id` to NULL with the run record), the
    trigger removes the stderr tail and the log too: both may hold what the agent wrote. The row's ids,
    times and outcome stay, as the runs row does. Rows are pruned by age (`agent_runs.prune`)."""
    db.executescript(_sql("0010_agent_runs"))


@migrations(name="0011_pending_claims")
def _m0011_pending_claims(db: sqlite_utils.Database) -> None:
    """A pending row is claimed by the daemon trying it (`claimed_by`, its `daemon_id`) until
    `claimed_until`: daemons sharing one store (PostgreSQL, docs/fleet.md) never try the same row at
    once, and the ingest path holds its fresh records for its own first attempt without moving their
    `next_at`. On SQLite the one daemon claims its rows the same way."""
    db.executescript(_sql("0011_pending_claims"))


@migrations(name="0012_words_stay_words")
def _m0012_words_stay_words(db: sqlite_utils.Database) -> None:
    """Escape remnants leave the stored text and the built-in provider's documents are
    re-indexed (`words_stay_words`)."""
    words_stay_words(db)


@migrations(name="0013_runs_by_session")
def _m0013_runs_by_session(db: sqlite_utils.Database) -> None:
    """An index on runs by (adapter, run id): an import's "is this session recorded already, under any
    harness" (`run_history.sessions_recorded`) reads those rows, not every run."""
    db.executescript(_sql("0013_runs_by_session"))


@migrations(name="0014_embed_cache_by_doc")
def _m0014_embed_cache_by_doc(db: sqlite_utils.Database) -> None:
    """An embedding-cache row may point at its document's vector in `builtin_vec` instead of
    holding a copy (the vector stored once); the vectors move at start (`index_sqlite.cache_once`)."""
    db.executescript(_sql("0014_embed_cache_by_doc"))


@migrations(name="0015_vector_cells")
def _m0015_vector_cells(db: sqlite_utils.Database) -> None:
    """A large scope's vectors are divided into cells (`builtin.vector_cells`): the centroids
    and each scope's last division; `builtin_vec` takes the cell as a metadata column at start
    (`index_sqlite.compact_vec_table`)."""
    db.executescript(_sql("0015_vector_cells"))


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


#: Seconds a quick_check's answer is reused by `status` and `doctor` before the file is checked again.
INTEGRITY_MAX_AGE = 10.0


def quick_check(path: Path) -> str | None:
    """``PRAGMA quick_check`` of the file at ``path`` on a connection of its own: None when it passes, else
    the first problems SQLite reports, in one line naming the file."""
    try:
        conn = sqlean.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        try:
            rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)").fetchall()]
        finally:
            conn.close()
    except sqlean.DatabaseError as exc:
        rows = [str(exc) or type(exc).__name__]
    if rows == ["ok"]:
        return None
    said = "; ".join(" ".join(r.split()) for r in rows)[:300]
    return f"store {path} is damaged (quick_check: {said}); {RECOVER}"


#: What an operator does about a damaged store file: the commands that check and restore it
#: (docs/operations.md, "A store that cannot be used at start").
RECOVER = ("check it with `memactors store check`; restore a backup with `memactors store restore BACKUP` "
           "(the daemon stopped), or move the file aside to start with an empty store")


def empty_store(path: Path) -> StoreDamaged | None:
    """A refusal for a store file of zero bytes with no write-ahead log beside it, else None.

    A new store is never zero bytes once opened (its header is written at once), so an empty file where
    the store should be is a truncation or a failed copy: starting on it would begin an empty memory
    without a word. The daemon refuses instead and says how to start afresh deliberately."""
    try:
        size = path.stat().st_size
    except OSError:
        return None  # missing: a new store is created
    wal = path.with_name(path.name + "-wal")
    if size != 0 or (wal.exists() and wal.stat().st_size > 0):
        return None
    return StoreDamaged(f"store {path} is empty (0 bytes): refusing to start on it, which would begin an "
                        "empty memory; restore a backup with `memactors store restore BACKUP`, or delete the "
                        "file to start a new, empty store on purpose")


def store_damaged(path: Path, exc: BaseException) -> StoreDamaged:
    """The one-line refusal of a store file SQLite cannot use, with SQLite's own words for why."""
    said = str(exc) or type(exc).__name__
    if "readonly" in said or "read-only" in said or "unable to open" in said:
        return StoreDamaged(f"store {path} cannot be written: {said}")
    return StoreDamaged(f"store {path} is damaged or not a memactors database: {said}; {RECOVER}")


#: Bytes the WAL is truncated back to after a checkpoint (`PRAGMA journal_size_limit`).
WAL_SIZE_LIMIT = 4 * 1024 * 1024


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
    # A WAL is reused from its start after a checkpoint but never shrinks on its own: one bulk ingest
    # (a transaction of thousands of episodes) left it at its high-water mark (tens of MB) for the
    # life of the daemon. With a limit SQLite truncates it back when it next resets it.
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA synchronous = NORMAL")
    return SqliteDb(conn)


class SqliteStore(Store):
    """The store on one SQLite file. Open with `await open_store(path)`."""

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
        self._integrity_lock = trio.Lock()
        self._integrity_at: float | None = None
        self._integrity: str | None = None

    @classmethod
    async def connect(cls, path: Path, *, daemon_id: str = "local") -> SqliteStore:
        """Create the state directory and database if missing and apply pending migrations."""

        def setup() -> SqliteDb:
            # A file that is not a database, has a damaged page, or cannot be written: one line naming the
            # file and the cause (the CLI exits 5 on it), not a traceback.
            try:
                # Only a directory made here is made private: a --db in an existing shared directory
                # (/tmp, a project folder) must never have its mode changed (the state directory
                # itself is made private by the daemon).
                if not path.parent.exists():
                    private_dir(path.parent)
                empty = empty_store(path)
                if empty is not None:
                    raise empty
                existed = path.exists()
                private_file(path)  # SQLite creates -wal and -shm with the database file's mode
                db = _connect(path)
                # A damaged page is found here, naming the file and what to do, rather than by the first
                # actor that reads it (a traceback, a crash loop, INTERNAL from Status). quick_check reads
                # every page once: about a second for a 150 MiB store (docs/operations.md).
                damaged = quick_check(path) if existed else None
                if damaged is not None:
                    db.close()
                    raise StoreDamaged(f"cannot start: {damaged}")
                migrations.apply(db)
                _fts_secure_delete(db)
                return db
            except (sqlean.DatabaseError, OSError) as exc:
                # A full disk is "disk full" (the store is intact), never "damaged, restore a backup".
                full = disk_full_at_start(path, exc)
                if full is not None:
                    raise full from None
                if isinstance(exc, OSError):
                    raise StoreDamaged(f"store {path} cannot be opened: {exc.strerror or exc}") from None
                raise store_damaged(path, exc) from None

        return cls(path, await trio.to_thread.run_sync(setup), daemon_id=daemon_id)

    @property
    def where(self) -> str:
        return f"sqlite {self.path}"

    async def ping(self) -> str | None:
        """None while the file reads whole, else what is damaged in it (`status` and `doctor` ask)."""
        return await self.integrity()

    def damage(self, exc: BaseException) -> str | None:
        """One line naming the file when ``exc`` is SQLite saying a page cannot be read, else None."""
        if isinstance(exc, sqlean.DatabaseError) and not isinstance(exc, sqlean.OperationalError):
            return f"store {self.path} is damaged ({exc}); {RECOVER}"
        if isinstance(exc, sqlean.OperationalError) and "malformed" in str(exc):
            return f"store {self.path} is damaged ({exc}); {RECOVER}"
        return None

    async def integrity(self) -> str | None:
        """SQLite's ``PRAGMA quick_check`` of the file, at most once per ``INTEGRITY_MAX_AGE`` seconds
        (callers in between get the last answer): None when it reads whole, else a one-line account of
        what is damaged, naming the file (garbage pages written under a running daemon once left status
        and doctor green while every recall degraded).

        The check runs on a fresh read-only connection (a pooled one may hold the damaged pages' old
        images in its cache) in a worker thread, one at a time."""
        async with self._integrity_lock:
            now = trio.current_time()
            if self._integrity_at is not None and now - self._integrity_at < INTEGRITY_MAX_AGE:
                return self._integrity
            self._integrity = await trio.to_thread.run_sync(quick_check, self.path)
            self._integrity_at = trio.current_time()
            return self._integrity

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
