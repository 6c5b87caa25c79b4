"""The daemon's store (ADR-0037 as memactors builds it): one interface, two engines.

SQLite (`_engine_sqlite`) is the embedded default: one file in the state directory, opened through
sqlean-py (the stdlib sqlite3 here cannot load extensions) and handed to sqlite-utils; WAL, foreign
keys on, schema by sqlite-utils `Migrations` (below). `[store] url = "postgresql://…"` puts the same
store on PostgreSQL (`_engine_pg`), so daemons on several hosts share one memory (docs/fleet.md).

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
import hashlib
import json
import os
import re
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import sqlite_utils
import trio
from sqlite_utils.migrations import Migrations

T = TypeVar("T")

#: The most write() calls one group-commit transaction runs.
GROUP_COMMIT_MAX = 64

WallClock = Callable[[], datetime]


_WORD = re.compile(r"\w+", re.UNICODE)


def fts_match(query: str) -> str | None:
    """A safe FTS5 MATCH expression for the store's FTS5 tables (episodes, facts).

    Every distinct word of the query, double-quoted and OR-ed: quoting keeps FTS5 operators (AND, NEAR,
    '*', '-', column filters) in user text inert. None when the query has no words.
    """
    words = _WORD.findall(query.lower())
    if not words:
        return None
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """The one text form of a time in the store: UTC, microseconds, 'Z'; sorts lexically."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


migrations = Migrations("memactors")


@migrations(name="0001_initial")
def _m0001(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        CREATE TABLE runs (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            adapter TEXT NOT NULL,
            started_at TEXT NOT NULL,
            ended_at TEXT NOT NULL,
            outcome TEXT NOT NULL,
            reason TEXT NOT NULL,
            duration_ms INTEGER NOT NULL,
            repo TEXT,
            branch TEXT,
            record TEXT NOT NULL,          -- redacted run record JSON, without the prompt
            ingested_at TEXT NOT NULL,
            PRIMARY KEY (harness, run_id)
        );
        CREATE INDEX runs_repo_branch ON runs (repo, branch, ended_at);
        CREATE TABLE run_paths (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            repo TEXT NOT NULL,
            path TEXT NOT NULL,
            PRIMARY KEY (harness, run_id, repo, path),
            FOREIGN KEY (harness, run_id) REFERENCES runs (harness, run_id) ON DELETE CASCADE
        );
        CREATE INDEX run_paths_by_path ON run_paths (repo, path);
        CREATE TABLE episodes (
            episode_id TEXT PRIMARY KEY,
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            repo TEXT NOT NULL,
            branch TEXT NOT NULL,
            scope TEXT NOT NULL,
            trust_class TEXT NOT NULL,
            outcome TEXT NOT NULL,
            started_at TEXT NOT NULL,
            recorded_at TEXT NOT NULL,     -- when memactors assembled and stored it (retention clock)
            body TEXT,                     -- REQ-5 object as JSON; NULL once forgotten
            text TEXT,                     -- plain-text rendering; NULL once forgotten
            forgotten_at TEXT
        );
        CREATE INDEX episodes_by_scope ON episodes (scope, started_at);
        CREATE INDEX episodes_by_harness ON episodes (harness, started_at);
        CREATE INDEX episodes_by_recorded ON episodes (recorded_at);
        CREATE TABLE memory_index (
            provider TEXT NOT NULL,
            provider_id TEXT NOT NULL,
            episode_id TEXT NOT NULL REFERENCES episodes (episode_id),
            scope TEXT NOT NULL,
            recorded_at TEXT NOT NULL,
            forgotten_at TEXT,
            PRIMARY KEY (provider, provider_id)
        );
        CREATE INDEX memory_index_by_episode ON memory_index (episode_id);
        CREATE TABLE pending (
            kind TEXT NOT NULL CHECK (kind IN ('record', 'forget')),
            provider TEXT NOT NULL,
            episode_id TEXT NOT NULL,
            provider_id TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            first_at TEXT NOT NULL,
            next_at TEXT NOT NULL,
            last_error TEXT,
            PRIMARY KEY (kind, provider, episode_id, provider_id)
        );
        CREATE TABLE builtin_docs (
            doc_id INTEGER PRIMARY KEY,
            episode_id TEXT NOT NULL UNIQUE,
            scope TEXT NOT NULL,
            text TEXT NOT NULL,
            summary TEXT NOT NULL DEFAULT '',
            files TEXT NOT NULL DEFAULT '[]',
            started_at TEXT NOT NULL,
            content_hash TEXT NOT NULL
        );
        CREATE INDEX builtin_docs_by_scope ON builtin_docs (scope);
        CREATE VIRTUAL TABLE builtin_fts USING fts5 (text, summary, tokenize = 'porter unicode61');
        CREATE TABLE call_log (
            id INTEGER PRIMARY KEY,
            at TEXT NOT NULL,
            caller TEXT NOT NULL,
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            args_sha256 TEXT NOT NULL,
            outcome TEXT NOT NULL,
            duration_ms INTEGER NOT NULL
        );
        """
    )


@migrations(name="0002_facts_graph")
def _m0002(db: sqlite_utils.Database) -> None:
    """Facts, exposure, votes, pull-request links, presence, the per-run briefing cache, run tokens."""
    db.executescript(
        """
        CREATE TABLE facts (
            id TEXT PRIMARY KEY,
            fts_rowid INTEGER NOT NULL UNIQUE,   -- facts_fts rowid; explicit so VACUUM cannot move it
            scope TEXT NOT NULL,
            text TEXT NOT NULL,
            confidence REAL NOT NULL CHECK (confidence >= 0.0 AND confidence <= 1.0),
            status TEXT NOT NULL CHECK (status IN ('live', 'suspect', 'retired')),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX facts_by_scope ON facts (scope, status, confidence);
        CREATE VIRTUAL TABLE facts_fts USING fts5 (text, tokenize = 'porter unicode61');
        CREATE TABLE exposures (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL,
            harness TEXT NOT NULL,
            fact_id TEXT NOT NULL,
            surface TEXT NOT NULL
                CHECK (surface IN ('recall', 'briefing_tool', 'briefing_resource', 'briefing_prompt')),
            call_id TEXT,
            at TEXT NOT NULL
        );
        CREATE INDEX exposures_by_run_fact ON exposures (run_id, fact_id);
        CREATE TABLE votes (
            id INTEGER PRIMARY KEY,
            fact_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            harness TEXT NOT NULL,
            stance TEXT NOT NULL CHECK (stance IN ('support', 'oppose')),
            counted INTEGER NOT NULL CHECK (counted IN (0, 1)),
            at TEXT NOT NULL
        );
        CREATE INDEX votes_by_fact ON votes (fact_id);
        CREATE TABLE pull_requests (
            repo TEXT NOT NULL,
            branch TEXT NOT NULL,
            url TEXT NOT NULL,
            linked_at TEXT NOT NULL,
            PRIMARY KEY (repo, branch, url)
        );
        CREATE TABLE presence (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            repo TEXT NOT NULL,
            branch TEXT,
            paths TEXT NOT NULL DEFAULT '[]',
            reported_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            PRIMARY KEY (harness, run_id, session_id)
        );
        CREATE INDEX presence_by_repo ON presence (repo, expires_at);
        CREATE TABLE briefings (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            document TEXT NOT NULL,
            doc_json TEXT NOT NULL,
            items TEXT NOT NULL DEFAULT '{}',
            computed_at TEXT NOT NULL,
            PRIMARY KEY (harness, run_id)
        );
        CREATE TABLE run_callers (
            token_sha256 TEXT PRIMARY KEY,
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            workdir TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX run_callers_by_run ON run_callers (harness, run_id);
        """
    )


@migrations(name="0003_providers")
def _m0003_providers(db: sqlite_utils.Database) -> None:
    """The built-in provider's embedding cache and settings (REQ-11), and an index for due retries.

    The vec0 table itself (`builtin_vec`) is created lazily by the built-in provider once the embedding
    dimension is known; `builtin_meta` remembers the model and dimension it was built for.
    """
    db.executescript(
        """
        CREATE TABLE builtin_embed_cache (
            content_hash TEXT NOT NULL,
            model TEXT NOT NULL,
            dim INTEGER NOT NULL,
            vector BLOB NOT NULL,          -- float32 little-endian, sqlite-vec's serialisation
            PRIMARY KEY (content_hash, model)
        );
        CREATE TABLE builtin_meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE INDEX pending_due ON pending (provider, state, next_at);
        """
    )


@migrations(name="0004_run_token_expiry")
def _m0004_run_token_expiry(db: sqlite_utils.Database) -> None:
    """Run tokens end with their run (plus a short grace): an expiry per token, NULL for no expiry."""
    db.execute("ALTER TABLE run_callers ADD COLUMN expires_at TEXT")


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
    """One call-log row (ADR-0035, REQ-18), bounded. Arguments are only ever stored as their SHA-256, so
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
    excerpt (~1 KB an episode, issue 11). Its readers render it from the body: the retry loop (the
    `text` of memory_record_episode), the operator's episode view, and REQ-9's text check
    (`index.text_belongs_body`). SQLite rewrites the table; with secure_delete on, the dropped copies
    are overwritten."""
    db.execute("ALTER TABLE episodes DROP COLUMN text")


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
    db.executescript(
        """
        CREATE TABLE episode_bodies (id INTEGER PRIMARY KEY, body TEXT NOT NULL);  -- REQ-5 object as JSON
        CREATE TABLE run_records (id INTEGER PRIMARY KEY, record TEXT NOT NULL);   -- redacted, no prompt
        ALTER TABLE episodes ADD COLUMN body_id INTEGER;  -- NULL once forgotten
        ALTER TABLE runs ADD COLUMN record_id INTEGER;    -- NULL once its episode is forgotten
        INSERT INTO episode_bodies (id, body) SELECT rowid, body FROM episodes WHERE body IS NOT NULL ORDER BY rowid;
        UPDATE episodes SET body_id = rowid WHERE body IS NOT NULL;
        INSERT INTO run_records (id, record) SELECT rowid, record FROM runs ORDER BY rowid;
        UPDATE runs SET record_id = rowid;
        ALTER TABLE episodes DROP COLUMN body;
        ALTER TABLE runs DROP COLUMN record;
        """
    )


def _flat_strings(value: Any, flatten: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return flatten(value)
    if isinstance(value, dict):
        return {k: _flat_strings(v, flatten) for k, v in value.items()}
    if isinstance(value, list):
        return [_flat_strings(v, flatten) for v in value]
    return value


#: builtin_fts's BM25 weights per column as configured by migration 0009 (ranking.BM25_WEIGHTS).
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
    """Issue 17: index the words, not their escapes; index what a run said, touched and failed apart
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
    from .builtin import BM25_WEIGHTS, doc_fields  # the provider's own field rules (no import cycle at load)
    from .episode import flatten

    for body_id, body in db.execute("SELECT id, body FROM episode_bodies").fetchall():
        data = json.loads(body)
        flat = _flat_strings(data, flatten)
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
    answer after a restart too (issue 18). One row per run: its state and the operator's view of it
    (JSON: pid, times, outcome, reason, episode, caps); the redacted tail of the agent's stderr and its
    parsed, redacted event log (JSON lines) are kept beside it, never in the episode (REQ-5).

    When the run's episode is forgotten (REQ-10 sets `runs.record_id` to NULL with the run record), the
    trigger removes the stderr tail and the log too: both may hold what the agent wrote. The row's ids,
    times and outcome stay, as the runs row does. Rows are pruned by age (`run_rows.prune`)."""
    db.executescript(
        """
        CREATE TABLE agent_runs (
            harness TEXT NOT NULL,
            run_id TEXT NOT NULL,
            state TEXT NOT NULL,           -- running | ended
            started_at TEXT NOT NULL,
            ended_at TEXT,
            view TEXT NOT NULL,            -- the operator's view as JSON (no prompt, no agent text)
            stderr_tail TEXT,              -- redacted, at most 4 KiB
            log TEXT,                      -- redacted parsed events, JSON lines, bounded
            PRIMARY KEY (harness, run_id)
        );
        CREATE INDEX agent_runs_by_start ON agent_runs (started_at);
        CREATE INDEX agent_runs_by_run ON agent_runs (run_id);
        CREATE TRIGGER agent_runs_forget AFTER UPDATE OF record_id ON runs
            WHEN new.record_id IS NULL AND old.record_id IS NOT NULL BEGIN
            UPDATE agent_runs SET stderr_tail = NULL, log = NULL
            WHERE harness = new.harness AND run_id = new.run_id;
        END;
        """
    )


@migrations(name="0011_pending_claims")
def _m0011_pending_claims(db: sqlite_utils.Database) -> None:
    """A pending row is claimed by the daemon trying it (`claimed_by`, its `daemon_id`) until
    `claimed_until`: daemons sharing one store (PostgreSQL, docs/fleet.md) never try the same row at
    once, and the ingest path holds its fresh records for its own first attempt without moving their
    `next_at`. On SQLite the one daemon claims its rows the same way."""
    db.executescript(
        """
        ALTER TABLE pending ADD COLUMN claimed_until TEXT;
        ALTER TABLE pending ADD COLUMN claimed_by TEXT;
        """
    )


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
    """Create `path` if missing and make it 0600, whatever the umask."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
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
    implemented once per engine (`_engine_sqlite`, `_engine_pg`).
    """

    dialect: Any

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]: ...


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

    Open with `await Store.open(target)`: a path opens (or creates) the SQLite file there, a
    ``postgresql://`` URL the PostgreSQL database (`_engine_pg`). The engines differ only in how they
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
        #: (store_health); `snapshot()` is what Status, doctor and /readyz show.
        self.health: Any = None

    @classmethod
    async def open(cls, target: Path | str, *, daemon_id: str = "local") -> Store:
        """Open the store at `target` (a SQLite path, or a ``postgresql://`` URL) and apply pending
        migrations."""
        if isinstance(target, str) and is_store_url(target):
            from ._engine_pg import PgStore

            return await PgStore.connect(target, daemon_id=daemon_id)
        from ._engine_sqlite import SqliteStore

        return await SqliteStore.connect(Path(target), daemon_id=daemon_id)

    @property
    def where(self) -> str:
        """Where the store is, for status, doctor and logs (never with a password)."""
        raise NotImplementedError

    async def write(self, fn: Callable[[Any], T]) -> T:
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
        return job.result  # type: ignore[no-any-return]

    async def _write_batch(self, batch: list[_WriteJob]) -> None:
        raise NotImplementedError

    async def read(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(db)` on a pooled read connection, in one read transaction (a snapshot), off the trio loop."""
        raise NotImplementedError

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

    async def write_in_batches(self, fn: Callable[[Any], int], batch: int) -> int:
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
