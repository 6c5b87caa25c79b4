"""The built-in provider's storage on PostgreSQL (REQ-11 on `[store] url = "postgresql://…"`).

`builtin.BuiltinProvider` keeps the contract, the ranking rules and the item text (its fields, its
gist); this module keeps what is PostgreSQL's own, as `builtin.index_sqlite` keeps what is SQLite's (FTS5,
sqlite-vec):

* `builtin_docs`: one row per episode with the fields the SQLite engine indexes (`builtin.doc_fields`:
  title, excerpt, summary, files, failures, meta, and plain harness, branch, outcome), its files also as
  a `text[]` for the path boost, and a generated `tsv` column under a GIN index. `tsv` holds each field
  under a weight class — title A, files B, excerpt and failures C, meta D — so `ts_rank_cd` weighs them
  as FTS5's BM25 weighs its columns (`builtin.BM25_WEIGHTS` 3 : 1.5 : 1 : 0.25, as the array
  RANK_WEIGHTS). Every run of characters that are not letters or digits becomes one space first, so
  words split where the SQLite engine's unicode61 tokenizer splits them (PostgreSQL's parser would keep
  `forge.example/acme/api` a host and a path), stemmed by the english configuration as FTS5's porter
  stems them.
* BM25's place is taken by PostgreSQL's own ranking, `ts_rank_cd` (cover density: how often and how
  close together the query's words occur, divided by 1 + log(document length), flag 1 — like BM25 it
  rewards repeated matches and damps long documents): AND of the query's words first, every word OR-ed
  only when that finds fewer than `limit` episodes, best CANDIDATES by rank, then recency, then id. The
  caller's scopes are inside the query (`scope = ANY(…)`), as on SQLite.
* A query of metadata words only (REQ-14's briefing query) is told apart with the weight classes
  (`word:D` against `word:ABC`) and answered by `ranking.briefing_rank`, as on SQLite.
* Vectors (hybrid ranking) with pgvector when the extension is installed: `builtin_vec` (one
  `halfvec(dim)` per episode, half float32's bytes, and its cell under a (scope, cell) b-tree), created
  once the embedding dimension is known, rebuilt empty when the model or dimension changes. A large
  scope is divided into cells (`builtin.vector_cells`, as on SQLite) and its knn reads the cells nearest
  the query; a small one is one cell, searched exactly. Each cell's vectors are also packed in one row
  (`builtin_vec_packs`, float16 as the rows hold them): a knn reads the packs and the vectors written
  since their cell was packed, in binary, and scores them in numpy (a row costs this server ~4 µs to
  read, whatever scores it). pgvector's own store-wide indexes (HNSW,
  IVFFlat) lose most of their recall when filtered to one scope among many (docs/benchmarks.md). Without the extension the
  provider ranks by text (and the path boost) alone: `warn_without_vectors` logs that once at start.

These functions are `PgIndex`, the built-in provider's `builtin.DocIndex` on PostgreSQL: the provider's
flow (record, embed, recall with REQ-11's fusion — `ranking.rrf`, k = 60, the path boost, `ranking.rank`'s
tie-breaks — and forget) is `builtin.BuiltinProvider`'s, the same on both engines.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from typing import Any

import sqlite_vec
from loguru import logger

from ..store import Db, Store
from ..store.builtin_docs import DocFields
from ..store.pg import PgDb
from . import vector_cells
from .index import DocDigest, as_floats
from .ranking import (
    BRIEFING_CANDIDATES,
    HARNESS_RUNS,
    Evidence,
    Hit,
    _desc,
    briefing_harness,
    briefing_rank,
    closest_first,
)
from .vector_cells import Division, due, nearest, unit_rows

CANDIDATES = 200
#: `ts_rank_cd`'s weights of the classes {D, C, B, A}: meta, excerpt and failures, files, title —
#: `store.builtin_docs.BM25_WEIGHTS` (0.25, 1, 1.5, 3) scaled to at most 1.
RANK_WEIGHTS = "{0.083333, 0.333333, 0.5, 1.0}"

_log = logger.bind(component="builtin_provider", engine="postgresql")


def _words_sql(column: str) -> str:
    """`column` with every run of non-alphanumeric characters made one space (unicode61's splits)."""
    return f"regexp_replace({column}, '[^[:alnum:]]+', ' ', 'g')"


#: The scope's token in `tsv` (as the SQLite engine's `scope_key` column in FTS5): `sk` and the first
#: 15 hex digits of the scope's SHA-256, one word the english parser keeps whole. A search ANDs it with
#: the query's words inside the GIN index, so the index walk follows the caller's repository, not the
#: store; ranking uses the words alone (`text_candidates`).
SCOPE_TOKEN_SQL = "'sk' || substr(encode(sha256(scope::bytea), 'hex'), 1, 15)"


def scope_token(scope: str) -> str:
    return "sk" + hashlib.sha256(scope.encode()).hexdigest()[:15]


def scopes_query(scopes: Sequence[str]) -> str:
    """The `to_tsquery('simple', …)` expression matching any of `scopes`' tokens."""
    return " | ".join(scope_token(s) for s in dict.fromkeys(scopes))


# The tables are the store's migration 0002_builtin (``store/migrations/pg/0002_builtin.sql``): its
# generated `tsv` column is built with `_words_sql` and `SCOPE_TOKEN_SQL` above, which the queries below
# must match (tests/test_store_migrations.py checks that the file still does).

_ALNUM = re.compile(r"[^\W_]+")


def words_of(words: Sequence[str]) -> list[str]:
    """The query's words as the index has them: runs of letters and digits (`_` and every other
    character separate words, as in the SQLite engine's unicode61 tokenizer), distinct, in order."""
    return list(dict.fromkeys(piece for word in words for piece in _ALNUM.findall(word)))


def tsquery(words: Sequence[str], op: str, classes: str = "") -> str:
    """A `to_tsquery` expression of the query's words joined by `op` (`&` or `|`), each restricted to
    the weight `classes` when given (`D`: the metadata). Only letters and digits reach it (`words_of`),
    so no operator in user text survives."""
    suffix = f":{classes}" if classes else ""
    return f" {op} ".join(f"{w}{suffix}" for w in words_of(words))


def write_doc(db: Db, *, episode_id: str, scope: str, fields: DocFields, started_at: str,
              digest: str) -> tuple[int, bool]:
    """Insert or replace one episode's document; returns (doc_id,
    changed). Recording the same episode twice (two daemons, a retried record) changes nothing."""
    row = db.execute("SELECT doc_id, content_hash, scope FROM builtin_docs WHERE episode_id = ?",
                     [episode_id]).fetchone()
    if row is not None and row[1] == digest and row[2] == scope:
        return int(row[0]), False
    if row is not None:
        delete_doc(db, int(row[0]))
    inserted = db.execute(
        "INSERT INTO builtin_docs (episode_id, scope, title, excerpt, summary, files, paths, failures, meta,"
        " harness, branch, outcome, started_at, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
        " ON CONFLICT (episode_id) DO NOTHING RETURNING doc_id",
        [episode_id, scope, fields.title, fields.excerpt, fields.summary,
         json.dumps(list(fields.files), ensure_ascii=False), list(dict.fromkeys(fields.files)),
         json.dumps([list(f) for f in fields.failures], ensure_ascii=False), fields.meta, fields.harness,
         fields.branch, fields.outcome, started_at, digest]).fetchone()
    if inserted is None:  # another daemon recorded it between our look and our insert
        (doc_id,) = db.execute("SELECT doc_id FROM builtin_docs WHERE episode_id = ?", [episode_id]).fetchone()
        return int(doc_id), False
    return int(inserted[0]), True


def delete_doc(db: Db, doc_id: int) -> None:
    _keep_in_cache(db, doc_id)
    db.execute("DELETE FROM builtin_docs WHERE doc_id = ?", [doc_id])  # its vector goes by cascade


def _keep_in_cache(db: Db, doc_id: int | None = None) -> None:
    """Before a vector leaves `builtin_vec` (its document deleted, or every vector retired): a cache row
    pointing at it gets its own copy (float32, as the SQLite engine's older rows), so the same text
    later gets its vector back without the model."""
    if not _vec_exists(db):
        return
    where, params = ("", []) if doc_id is None else (" WHERE c.doc_id = ?", [doc_id])
    rows = db.execute("SELECT c.content_hash, c.model, v.embedding::vector::real[] FROM builtin_embed_cache c"
                      f" JOIN builtin_vec v ON v.doc_id = c.doc_id{where}", params).fetchall()
    for digest, model, vector in rows:
        db.execute("UPDATE builtin_embed_cache SET vector = ?, doc_id = NULL WHERE content_hash = ? AND model = ?",
                   [sqlite_vec.serialize_float32([float(x) for x in vector]), digest, model])
    db.execute("DELETE FROM builtin_embed_cache WHERE doc_id IS NOT NULL"
               + ("" if doc_id is None else " AND doc_id = ?"), params)


def text_candidates(db: Db, words: Sequence[str], scopes: Sequence[str], limit: int,
                    candidates: int = CANDIDATES) -> list[Hit]:
    """The best matches in `scopes`, best first: AND of the words, then OR when AND finds fewer than
    `limit`. At most `candidates`."""
    pieces = words_of(words)
    if not pieces:
        return []
    plans = [tsquery(pieces, "&"), tsquery(pieces, "|")] if len(pieces) > 1 else [tsquery(pieces, "|")]
    rows: list[Any] = []
    for n, expression in enumerate(plans):
        # OR-ed words: an episode matching more of them ranks first (BM25's idf and term saturation give
        # the SQLite engine that order; cover density alone would put two repeated words above three).
        # The score (`Hit.score`, for hybrid fusion) follows the order: the words matched, then the
        # cover density rank squashed into [0, 1).
        matched = " + ".join(["(d.tsv @@ to_tsquery('english', ?))::int"] * len(pieces)) if n else "0"
        rows = db.execute(
            f"SELECT episode_id, doc_id, started_at, matched + cd / (1 + cd) FROM ("
            f" SELECT d.episode_id, d.doc_id, d.started_at, {matched} AS matched,"
            f" ts_rank_cd('{RANK_WEIGHTS}', d.tsv, q, 1) AS cd FROM builtin_docs d, to_tsquery('english', ?) q,"
            " to_tsquery('simple', ?) s WHERE d.tsv @@ (q && s) AND d.scope = ANY(?)) m"
            f" ORDER BY matched DESC, cd DESC, started_at DESC, episode_id LIMIT {int(candidates)}",
            [*(pieces if n else []), expression, scopes_query(scopes), list(scopes)]).fetchall()
        if len(rows) >= limit:
            break
    return [Hit(r[0], int(r[1]), r[2], float(r[3])) for r in rows]


def metadata_only(db: Db, words: Sequence[str], scopes: Sequence[str], absent: Any = None) -> bool:
    """`ranking.metadata_only` on PostgreSQL: each word is in some episode's metadata (weight class D)
    or in none of the scope's episodes at all, and one at least in the metadata. Every probe (two per
    word, each one GIN lookup) goes in one statement: one round trip, however many words, so nothing is
    remembered (`absent` is not used)."""
    pieces = words_of(words)
    if not pieces:
        return False
    # In the metadata: `meta_tsv` (the D class's words alone, under their own GIN index: a `word:D` probe
    # of `tsv` would re-check every document holding the word anywhere, as GIN keeps no weights).
    probe = ("EXISTS (SELECT 1 FROM builtin_docs d WHERE d.{column} @@ (to_tsquery('english', ?)"
             " && to_tsquery('simple', ?)) AND d.scope = ANY(?))")
    params: list[Any] = []
    within = scopes_query(scopes)
    for w in pieces:
        params += [tsquery([w], "|"), within, list(scopes), tsquery([w], "|", "ABC"), within, list(scopes)]
    found = db.execute("SELECT " + ", ".join([probe.format(column="meta_tsv"), probe.format(column="tsv")]
                                             * len(pieces)), params).fetchone()
    in_meta = False
    for n in range(len(pieces)):
        if found[2 * n]:
            in_meta = True
        elif found[2 * n + 1]:
            return False
    return in_meta


def briefing_order(db: Db, words: Sequence[str], scopes: Sequence[str]) -> list[Hit]:
    """`ranking.briefing_order` on PostgreSQL: `ranking.briefing_rank` over the scopes' newest episodes
    with something to show and the newest of the query's harness (`ranking.briefing_harness`)."""
    columns = "doc_id, episode_id, started_at, branch, outcome, files, harness"
    rows = db.execute(
        f"SELECT {columns} FROM builtin_docs WHERE scope = ANY(?) AND (excerpt <> '' OR files <> '[]')"
        f" ORDER BY started_at DESC, episode_id LIMIT {BRIEFING_CANDIDATES}", [list(scopes)]).fetchall()
    # The harnesses of the newest runs first; only when none fits, every harness of the scopes.
    harnesses = briefing_harness(words, [r[6] for r in rows]) or briefing_harness(words, [
        r[0] for r in db.execute("SELECT DISTINCT harness FROM builtin_docs WHERE scope = ANY(?)",
                                 [list(scopes)]).fetchall()])
    if harnesses and sum(r[6] in harnesses for r in rows) < HARNESS_RUNS:  # else its newest are all here
        rows += db.execute(
            f"SELECT {columns} FROM builtin_docs WHERE scope = ANY(?) AND harness = ANY(?)"
            f" AND (excerpt <> '' OR files <> '[]') ORDER BY started_at DESC, episode_id"
            f" LIMIT {BRIEFING_CANDIDATES}", [list(scopes), sorted(harnesses)]).fetchall()
    return briefing_rank(rows, words, harnesses)


def path_candidates(db: Db, paths: Sequence[str], scopes: Sequence[str], among: Sequence[int] = ()) -> list[Hit]:
    """`ranking.path_candidates` on PostgreSQL: the episodes of `scopes` that touched one of `paths`
    exactly, newest first — the newest CANDIDATES, and any of the documents `among` (the text ranking's
    candidates) that touched one, however old."""
    rows = db.execute(
        "SELECT d.episode_id, d.doc_id, d.started_at FROM builtin_docs d"
        " WHERE d.scope = ANY(?) AND d.paths && ?::text[]"
        f" ORDER BY d.started_at DESC, d.episode_id LIMIT {CANDIDATES}",
        [list(scopes), list(paths)]).fetchall()
    if len(rows) >= CANDIDATES and among:  # not every episode that touched a path is in `rows`
        have = {int(r[1]) for r in rows}
        wanted = [i for i in dict.fromkeys(among) if i not in have]
        if wanted:
            rows += db.execute(
                "SELECT d.episode_id, d.doc_id, d.started_at FROM builtin_docs d"
                " WHERE d.doc_id = ANY(?) AND d.scope = ANY(?) AND d.paths && ?::text[]",
                [wanted, list(scopes), list(paths)]).fetchall()
    hits = {r[0]: Hit(r[0], int(r[1]), r[2]) for r in rows}
    return sorted(hits.values(), key=lambda h: (_desc(h.started_at), h.episode_id))


# -- vectors (pgvector) ------------------------------------------------------------------------------


#: Whether pgvector could not be used in a store (server, database, schema), and since when
#: (time.monotonic()): a store without it is asked again after RECHECK_VECTORS seconds, not at every
#: embedding (each ask may try CREATE EXTENSION).
_NO_VECTORS: dict[str, float] = {}
RECHECK_VECTORS = 300.0


def has_pgvector(db: Db) -> bool:
    """Whether the `vector` extension is installed in this database, or can be (then it is created)."""
    # the server too: two stores in one process (tests, `store migrate`) may have databases of one name
    assert isinstance(db, PgDb), type(db)  # this index runs on the PostgreSQL engine's connections only
    info = db.conn.info
    (schema,) = db.execute("SELECT current_schema()").fetchone()
    where = f"{info.host}:{info.port}/{info.dbname}/{schema}"
    since = _NO_VECTORS.get(where)
    if since is not None and time.monotonic() - since < RECHECK_VECTORS:
        return False
    found = _has_pgvector(db)
    if found:
        _NO_VECTORS.pop(where, None)
    else:
        _NO_VECTORS[where] = time.monotonic()
    return found


def _has_pgvector(db: Db) -> bool:
    if db.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return True
    if not db.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
        return False
    db.execute("SAVEPOINT vector_ext")
    try:
        db.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except Exception:  # ok: not allowed to (no privilege): ranked by text alone, said once at start
        db.execute("ROLLBACK TO SAVEPOINT vector_ext")
        db.execute("RELEASE SAVEPOINT vector_ext")
        return False
    db.execute("RELEASE SAVEPOINT vector_ext")
    return True


def _vec_exists(db: Db) -> bool:
    return bool(db.execute("SELECT to_regclass('builtin_vec') IS NOT NULL").fetchone()[0])


#: How `builtin_vec` holds a vector: pgvector's half-precision `halfvec` (2 bytes a dimension, half of
#: `vector`'s; cosine over it keeps recall: docs/benchmarks.md), each in its scope's cell.
VEC_FORM = "halfvec"
VEC_LAYOUT = "cells"


def _set_meta(db: Db, pairs: Sequence[tuple[str, str]]) -> None:
    db.executemany("INSERT INTO builtin_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE"
                   " SET value = excluded.value", list(pairs))


def _create_vec_table(db: Db, dim: int) -> None:
    db.execute(f"CREATE TABLE builtin_vec (doc_id BIGINT PRIMARY KEY REFERENCES builtin_docs (doc_id)"
               f" ON DELETE CASCADE, scope TEXT COLLATE \"C\" NOT NULL, cell INTEGER NOT NULL DEFAULT 0,"
               f" embedding halfvec({int(dim)}) NOT NULL)")
    db.execute("CREATE INDEX builtin_vec_by_cell ON builtin_vec (scope, cell)")
    db.execute("SELECT builtin_vec_counted()")  # each scope's count kept by triggers (migration 0009)
    db.execute("SELECT builtin_vec_packed()")  # the `packed` column, its index and trigger (migration 0010)
    db.execute("DELETE FROM builtin_vec_cells")
    db.execute("DELETE FROM builtin_vec_divisions")
    _set_meta(db, [("vec_form", VEC_FORM), ("vec_layout", VEC_LAYOUT)])


def _drop_vec_table(db: Db) -> None:
    db.execute("DROP TABLE builtin_vec")  # its count triggers with it
    db.execute("DELETE FROM builtin_vec_counts")
    db.execute("DELETE FROM builtin_vec_packs")
    db.execute("DELETE FROM builtin_vec_cells")
    db.execute("DELETE FROM builtin_vec_divisions")


def ensure_vec_table(db: Db, model: str, dim: int) -> None:
    """Create `builtin_vec` for (model, dim), or rebuild it empty when either changed."""
    meta = dict(db.execute("SELECT key, value FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')").fetchall())
    exists = _vec_exists(db)
    if exists and meta.get("vec_model") == model and meta.get("vec_dim") == str(dim):
        return
    if exists:
        _keep_in_cache(db)
        _drop_vec_table(db)
    _create_vec_table(db, dim)
    _set_meta(db, [("vec_model", model), ("vec_dim", str(dim))])


def compact_vec_table(db: Db) -> bool:
    """Bring a `builtin_vec` made before `VEC_FORM` and `VEC_LAYOUT` (float32 `vector` under a store-wide
    HNSW index) to them, its vectors kept (as halfvec; every scope one cell until the back-fill divides
    it), in the caller's write transaction; whether it did. Run once at start (`check_vectors`)."""
    if not _vec_exists(db):
        return False
    meta = dict(db.execute("SELECT key, value FROM builtin_meta WHERE key IN ('vec_dim', 'vec_form', 'vec_layout')")
                .fetchall())
    if meta.get("vec_dim") is None or (meta.get("vec_form") == VEC_FORM and meta.get("vec_layout") == VEC_LAYOUT):
        return False
    dim = int(meta["vec_dim"])
    for kind in ("hnsw", "ivfflat"):
        db.execute(f"DROP INDEX IF EXISTS builtin_vec_{kind}")
    db.execute("DROP INDEX IF EXISTS builtin_vec_by_scope")
    db.execute(f"ALTER TABLE builtin_vec ALTER COLUMN embedding TYPE halfvec({dim}) USING embedding::halfvec({dim})")
    db.execute("ALTER TABLE builtin_vec ADD COLUMN IF NOT EXISTS cell INTEGER NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX IF NOT EXISTS builtin_vec_by_cell ON builtin_vec (scope, cell)")
    db.execute("DELETE FROM builtin_vec_cells")
    db.execute("DELETE FROM builtin_vec_divisions")
    _set_meta(db, [("vec_form", VEC_FORM), ("vec_layout", VEC_LAYOUT)])
    return True


#: pgvector's own approximate indexes, as bench/scale.py builds them to compare with the cells (build
#: time, knn p50, recall@8 against exact; docs/benchmarks.md, "A million episodes"). The provider uses
#: neither: `VEC_INDEX` is its per-scope cells.
VEC_INDEX = "cells"


def index_sql(kind: str, rows: int) -> list[str]:
    """The statements that build `builtin_vec`'s approximate cosine index of `kind` (`hnsw`: pgvector's
    defaults m = 16, ef_construction = 64; `ivfflat`: rows / 1000 lists, at least 10, built over the rows
    there are)."""
    if kind == "hnsw":
        return ["CREATE INDEX builtin_vec_hnsw ON builtin_vec USING hnsw (embedding halfvec_cosine_ops)"]
    lists = max(10, rows // 1000)
    return [f"CREATE INDEX builtin_vec_ivfflat ON builtin_vec USING ivfflat (embedding halfvec_cosine_ops)"
            f" WITH (lists = {lists})"]


def knn_settings(kind: str) -> list[str]:
    """The `SET LOCAL`s a knn runs under with an index of `kind`. The scan is filtered by scope: it looks
    further than the defaults and keeps scanning until CANDIDATES rows of the caller's scopes are found
    (pgvector >= 0.8's iterative scans; on an older one these are placeholders PostgreSQL ignores)."""
    if kind == "hnsw":
        return [f"SET LOCAL hnsw.ef_search = {CANDIDATES}", "SET LOCAL hnsw.iterative_scan = 'relaxed_order'"]
    return ["SET LOCAL ivfflat.probes = 10", "SET LOCAL ivfflat.iterative_scan = 'relaxed_order'"]


def _literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def write_vector(db: Db, *, doc_id: int, scope: str, model: str, digest: str, vector: Sequence[float],
                 blob: bytes) -> None:
    """Store one episode's embedding in `builtin_vec` and point the cache's row for its text at it (the
    vector stored once); without pgvector, the cache row holds the vector (`blob`)."""
    upsert = ("INSERT INTO builtin_embed_cache (content_hash, model, dim, vector, doc_id) VALUES (?,?,?,?,?)"
              " ON CONFLICT (content_hash, model) DO UPDATE SET dim = excluded.dim, vector = excluded.vector,"
              " doc_id = excluded.doc_id")
    if not has_pgvector(db):
        db.execute(upsert, [digest, model, len(vector), blob, None])
        return
    ensure_vec_table(db, model, len(vector))
    db.execute(upsert, [digest, model, len(vector), b"", doc_id])
    literal = _literal(vector)
    # a packed vector replaced leaves its pack (the delete trigger) and comes back a row of its own
    db.execute("DELETE FROM builtin_vec WHERE doc_id = ? AND packed", [doc_id])
    db.execute("INSERT INTO builtin_vec (doc_id, scope, cell, embedding) VALUES (?, ?,"
               " coalesce((SELECT cell FROM builtin_vec_cells WHERE scope = ?"
               "  ORDER BY centroid::vector <=> ?::vector LIMIT 1), 0), ?::halfvec)"
               " ON CONFLICT (doc_id) DO UPDATE SET scope = excluded.scope, cell = excluded.cell,"
               " embedding = excluded.embedding",
               [doc_id, scope, scope, literal, literal])


def has_vector(db: Db, doc_id: int) -> bool:
    return _vec_exists(db) and db.execute("SELECT 1 FROM builtin_vec WHERE doc_id = ?", [doc_id]).fetchone() is not None


def probe_cells(db: Db, literal: str, scopes: Sequence[str], probes: int | None = None) -> list[tuple[str, int]]:
    """The (scope, cell)s a knn reads: in each divided scope the `probes` (by default
    `vector_cells.probes` of its cells) whose centroids are nearest the query (`literal`), and cell 0 of
    each scope not divided."""
    wanted = list(dict.fromkeys(scopes))
    cells = dict(db.execute("SELECT scope, cells FROM builtin_vec_divisions WHERE scope = ANY(?)", [wanted]).fetchall())
    limits = [(int(probes) if probes is not None else vector_cells.probes(int(cells[s]))) if s in cells else 0
              for s in wanted]
    rows = db.execute(
        "SELECT s.scope, c.cell FROM unnest(?::text[], ?::int[]) s (scope, probes) LEFT JOIN LATERAL (SELECT cell"
        " FROM builtin_vec_cells WHERE scope = s.scope ORDER BY centroid::vector <=> ?::vector LIMIT s.probes) c ON true",
        [wanted, limits, literal]).fetchall()
    return [(str(r[0]), 0 if r[1] is None else int(r[1])) for r in rows]


def knn_rows(db: Db, vector: Sequence[float], scopes: Sequence[str], k: int, probes: int | None = None) -> list[Any]:
    """The best `k` (episode_id, doc_id, started_at, distance) of `scopes`, closest first (ties newest
    first, then by episode id: `ranking.closest_first`): the exact cosine, in numpy, of the
    vectors of the cells `probe_cells` picks — their packs (`builtin_vec_packs`, one row a cell) and the
    vectors written since their cell was packed (a row each, `packed` false), all read in binary in
    pgvector's float16, so a vector scores the same whether it is packed or not."""
    import numpy as np

    cells = probe_cells(db, _literal(vector), scopes, probes)
    ids, x = cell_vectors(db, [c[0] for c in cells], [c[1] for c in cells])
    if not len(ids) or x.shape[1] != len(vector):
        return []
    half = _half_table()  # float16 to float32 by look-up (the values astype gives)
    best, distance = nearest(x, vector, k, lambda rows: np.take(half, rows.view(np.uint16)))
    closest = {int(ids[i]): float(distance[i]) for i in best}
    found = db.execute("SELECT episode_id, doc_id, started_at FROM builtin_docs WHERE doc_id = ANY(?::bigint[])",
                       [list(closest)]).fetchall()
    return [(r[1], r[2], r[3], r[0]) for r in closest_first([(closest[int(d)], e, int(d), s) for e, d, s in found])]


_HALF: list[Any] = []


def _half_table() -> Any:
    """The float32 value of each big-endian float16 code as read by this machine (65,536 entries, made
    once): a look-up costs ~2/3 of numpy's own conversion of non-native float16 (bench/scale.py's knn)."""
    import numpy as np

    if not _HALF:
        _HALF.append(np.arange(65536, dtype=np.uint16).view(">f2").astype(np.float32))
    return _HALF[0]


def cell_vectors(db: Db, scopes: Sequence[str], cells: Sequence[int]) -> tuple[Any, Any]:
    """The doc ids (int64) and float16 vectors (rows, big-endian as pgvector sends them) of the
    (scope, cell) pairs: each cell's pack and its rows not packed, read in binary (two statements: no
    text literal parsed, ~100 rows for a 170k-vector scope's probed cells instead of ~26k)."""
    import numpy as np

    assert isinstance(db, PgDb), type(db)  # this index runs on the PostgreSQL engine's connections only
    cur = db.conn.cursor(binary=True)
    pairs = "unnest(%s::text[], %s::int[]) c (scope, cell)"
    packs = cur.execute(f"SELECT p.doc_ids, p.vectors FROM {pairs} JOIN builtin_vec_packs p"
                        " ON p.scope = c.scope AND p.cell = c.cell", [list(scopes), list(cells)]).fetchall()
    loose = cur.execute(f"SELECT v.doc_id, halfvec_send(v.embedding) FROM {pairs} JOIN builtin_vec v"
                        " ON v.scope = c.scope AND v.cell = c.cell AND NOT v.packed", [list(scopes), list(cells)]).fetchall()
    ids = [np.asarray(r[0], dtype=np.int64) for r in packs] + [np.asarray([r[0] for r in loose], dtype=np.int64)]
    blob = b"".join([*(bytes(r[1]) for r in packs), *(bytes(r[1])[4:] for r in loose)])  # halfvec_send: 4-byte header
    doc_ids = np.concatenate(ids)
    if not len(doc_ids):
        return doc_ids, np.zeros((0, 0), dtype=">f2")
    return doc_ids, np.frombuffer(blob, dtype=">f2").reshape(len(doc_ids), -1)


def knn(db: Db, vector: Sequence[float], scopes: Sequence[str]) -> list[Hit]:
    """Best CANDIDATES episodes by cosine distance in `scopes` (`knn_rows`: exact in a small scope, the
    nearest cells of a divided one), closest first."""
    if not _vec_exists(db):
        return []
    dim = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()
    if dim is None or int(dim[0]) != len(vector):
        return []
    return [Hit(r[0], int(r[1]), r[2], 1.0 - float(r[3])) for r in knn_rows(db, vector, scopes, CANDIDATES)]


# -- cells (`builtin.vector_cells`) ------------------------------------------------------------------


def scopes_to_divide(db: Db) -> list[str]:
    """`CellIndex.scopes_to_divide` on PostgreSQL: the scopes whose vectors reach their next division, by
    `builtin_vec_counts` (one row a scope, kept by triggers on builtin_vec: read after every back-fill
    pass, so never a count of the store)."""
    if not _vec_exists(db):
        return []
    return [str(scope) for scope, n, divided_at in db.execute(
        "SELECT c.scope, c.vectors, d.vectors FROM builtin_vec_counts c"
        " LEFT JOIN builtin_vec_divisions d ON d.scope = c.scope").fetchall()
            if due(int(n), None if divided_at is None else int(divided_at))]


def scope_vectors(db: Db, scope: str) -> tuple[list[int], Any]:
    """`CellIndex.scope_vectors` on PostgreSQL: the scope's doc ids and their unit float32 rows."""
    import numpy as np

    assert isinstance(db, PgDb), type(db)
    # binary: no text parsed a vector; by doc id: k-means samples by position, so the same vectors make
    # the same cells whatever order updates (a division, a packing) left the heap in
    rows = db.conn.cursor(binary=True).execute(
        "SELECT doc_id, halfvec_send(embedding) FROM builtin_vec WHERE scope = %s ORDER BY doc_id", [scope]).fetchall()
    if not rows:
        return [], np.zeros((0, 0), dtype=np.float32)
    x = np.frombuffer(b"".join(bytes(r[1])[4:] for r in rows), dtype=">f2").reshape(len(rows), -1)
    return [int(r[0]) for r in rows], unit_rows(x.astype(np.float32))


def write_division(db: Db, division: Division) -> None:
    """`CellIndex.write_division` on PostgreSQL: the scope's centroids replaced and its vectors moved
    to their new cells; a vector written since the division was fitted joins its nearest new centroid."""
    scope = division.scope
    db.execute("DELETE FROM builtin_vec_cells WHERE scope = ?", [scope])
    db.executemany("INSERT INTO builtin_vec_cells (scope, cell, centroid) VALUES (?, ?, ?)",
                   [(scope, n, [float(x) for x in c]) for n, c in enumerate(division.centroids)])
    db.execute("INSERT INTO builtin_vec_divisions (scope, vectors, cells) VALUES (?, ?, ?) ON CONFLICT (scope)"
               " DO UPDATE SET vectors = excluded.vectors, cells = excluded.cells",
               [scope, division.vectors, len(division.centroids)])
    ids = list(division.cells)
    db.execute("UPDATE builtin_vec v SET cell = n.cell FROM unnest(?::bigint[], ?::int[]) n (doc_id, cell)"
               " WHERE v.doc_id = n.doc_id AND v.cell <> n.cell", [ids, [division.cells[i] for i in ids]])
    db.execute("UPDATE builtin_vec v SET cell = (SELECT cell FROM builtin_vec_cells c WHERE c.scope = v.scope"
               " ORDER BY c.centroid::vector <=> v.embedding::vector LIMIT 1)"
               " WHERE v.scope = ? AND NOT (v.doc_id = ANY(?::bigint[]))", [scope, ids])
    pack(db, scope)  # every cell of the scope packed again, in the same transaction


#: A cell is packed again (`cells_to_pack`) once the vectors written since its last packing — each read
#: as a row of its own by a knn, ~4 µs a row — reach PACK_LOOSE, or 1/PACK_SHARE of its pack when that is
#: more (so re-packing a large cell costs at most PACK_SHARE times the bytes of the vectors it adds).
PACK_LOOSE = 32
PACK_SHARE = 16


def pack(db: Db, scope: str, cells: Sequence[int] | None = None) -> int:
    """(Re)make `scope`'s packs (of `cells`, or all of them) from its rows, in the server: each cell's
    doc ids and their halfvec values as the rows hold them (`halfvec_send` without its 4-byte header;
    the two aggregates read the same rows in the same order); returns the vectors newly packed."""
    among, params = ("", [scope]) if cells is None else (" AND cell = ANY(?::int[])", [scope, list(cells)])
    db.execute(f"DELETE FROM builtin_vec_packs WHERE scope = ?{among}", params)
    # One statement, one snapshot: only the rows the packs hold are marked, never one another daemon's
    # back-fill committed in between (it stays a row of its own until the next packing).
    return int(db.execute(
        "WITH made AS (INSERT INTO builtin_vec_packs (scope, cell, doc_ids, vectors) SELECT scope, cell, array_agg(doc_id),"
        f" string_agg(substring(halfvec_send(embedding) FROM 5), ''::bytea) FROM builtin_vec WHERE scope = ?{among}"
        " GROUP BY scope, cell RETURNING doc_ids)"
        " UPDATE builtin_vec SET packed = true WHERE doc_id IN (SELECT unnest(doc_ids) FROM made) AND NOT packed",
        params).rowcount)


def cells_to_pack(db: Db) -> list[tuple[str, list[int]]]:
    """For `pack_scopes`: each scope's cells whose vectors written since their packing (read by
    the partial index of the rows not packed) reach the next packing (PACK_LOOSE, PACK_SHARE)."""
    if not _vec_exists(db):
        return []
    loose = db.execute("SELECT scope, cell, count(*) FROM builtin_vec WHERE NOT packed GROUP BY scope, cell").fetchall()
    if not loose:
        return []
    dim = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()
    width = 2 * int(dim[0]) if dim is not None else 1
    packed = {(str(r[0]), int(r[1])): int(r[2]) // width for r in db.execute(
        "SELECT p.scope, p.cell, octet_length(p.vectors) FROM unnest(?::text[], ?::int[]) c (scope, cell)"
        " JOIN builtin_vec_packs p ON p.scope = c.scope AND p.cell = c.cell",
        [[r[0] for r in loose], [int(r[1]) for r in loose]]).fetchall()}
    due: dict[str, list[int]] = {}
    for scope, cell, n in loose:
        if int(n) >= max(PACK_LOOSE, packed.get((str(scope), int(cell)), 0) // PACK_SHARE):
            due.setdefault(str(scope), []).append(int(cell))
    return sorted(due.items())


async def pack_scopes(store: Store) -> int:
    """`CellIndex.pack_scopes` on PostgreSQL, after a back-fill pass (`vector_cells.divide_scopes`): the
    cells due (`cells_to_pack`) packed again, one scope a write transaction; returns the vectors packed."""
    packed = 0
    for scope, cells in await store.read(cells_to_pack):

        def write(db: Db, scope: str = scope, cells: list[int] = cells) -> int:
            return pack(db, scope, cells)

        packed += await store.write(write)
    return packed


def evidence(db: Db, words: Sequence[str], scopes: Sequence[str], doc_ids: Sequence[int],
             vectors: bool = False) -> Evidence:
    """`DocIndex.evidence` on PostgreSQL: each word's documents in the scopes (the tsvector matches the
    word's pieces, stemmed as the text ranking stems them; a word that is all stop words is not
    searchable and left out), the candidates' words among them and, with `vectors`, which candidates
    have a vector."""
    wanted = list(dict.fromkeys(int(d) for d in doc_ids))
    docs = int(db.execute("SELECT count(*) FROM builtin_docs WHERE scope = ANY(?)", [list(scopes)]).fetchone()[0])
    df: dict[str, int] = {}
    present: dict[int, set[str]] = {d: set() for d in wanted}
    searched = [w for w in dict.fromkeys(words) if words_of([w])]
    # One statement for every word (one round trip): its documents counted through the GIN index (the
    # word ANDed with the scopes' tokens, as `text_candidates` searches), not by testing every document
    # of the scopes; the candidates' matches by their ids.
    rows = db.execute(
        "SELECT w.n, numnode(to_tsquery('english', w.e)), CASE WHEN numnode(to_tsquery('english', w.e)) > 0 THEN"
        " (SELECT count(*) FROM builtin_docs d WHERE d.tsv @@ (to_tsquery('english', w.e) && to_tsquery('simple', ?))"
        " AND d.scope = ANY(?)) END, (SELECT array_agg(d.doc_id) FROM builtin_docs d WHERE d.doc_id = ANY(?)"
        " AND d.scope = ANY(?) AND d.tsv @@ to_tsquery('english', w.e))"
        " FROM unnest(?::text[]) WITH ORDINALITY w (e, n) ORDER BY w.n",
        [scopes_query(scopes), list(scopes), wanted, list(scopes), [tsquery(words_of([w]), "&") for w in searched]],
    ).fetchall() if searched else []
    for n, nodes, count, matched in rows:
        if not nodes:
            continue  # only stop words: the text ranking cannot search it either
        w = searched[int(n) - 1]
        df[w] = int(count or 0)
        for d in matched or []:
            present[int(d)].add(w)
    vectored: set[int] = set()
    if vectors and wanted and _vec_exists(db):
        vectored = {int(r[0]) for r in db.execute("SELECT doc_id FROM builtin_vec WHERE doc_id = ANY(?)",
                                                  [wanted]).fetchall()}
    return Evidence(docs, df, {d: frozenset(ws) for d, ws in present.items()}, frozenset(vectored))


def missing_vectors(db: Db) -> int:
    total = int(db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0])
    if not _vec_exists(db):
        return total
    return total - int(db.execute("SELECT count(*) FROM builtin_vec").fetchone()[0])


def pending_docs(db: Db, limit: int, before: int | None = None,
                 among: Sequence[int] | None = None) -> list[tuple[int, str, str, str, str, str]]:
    """Up to `limit` documents without a vector, newest doc ids first (as `_builtin_sqlite.pending_docs`)."""
    conds = ["NOT EXISTS (SELECT 1 FROM builtin_vec v WHERE v.doc_id = d.doc_id)"] if _vec_exists(db) else []
    if before is not None:  # the next page of one pass: never scans the ones already embedded again
        conds.append(f"d.doc_id < {int(before)}")
    if among is not None:  # a recall's own candidates (`BuiltinProvider.embed_candidates`)
        conds.append(f"d.doc_id IN ({','.join(str(int(d)) for d in among) or 'NULL'})")
    cond = " WHERE " + " AND ".join(conds) if conds else ""
    return [(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in db.execute(
        f"SELECT d.doc_id, d.scope, d.summary, d.excerpt, d.files, d.failures FROM builtin_docs d{cond}"
        f" ORDER BY d.doc_id DESC LIMIT {int(limit)}").fetchall()]


def doc_exists(db: Db, doc_id: int) -> bool:
    return db.execute("SELECT 1 FROM builtin_docs WHERE doc_id = ?", [doc_id]).fetchone() is not None


def retire_vectors(db: Db, model: str, *, everything: bool = False) -> bool:
    """Drop `builtin_vec` when its vectors are of another model (or embedding-text version), or all of
    them with `everything` (as `_builtin_sqlite.retire_vectors`); the cache stays."""
    if not _vec_exists(db):
        return False
    row = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_model'").fetchone()
    if not everything and row is not None and row[0] == model:
        return False
    _keep_in_cache(db)
    _drop_vec_table(db)
    db.execute("DELETE FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')")
    return True


def vector_count(db: Db) -> tuple[int, int]:
    """(documents, documents with a vector)."""
    total = int(db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0])
    return total, total - missing_vectors(db)


def warn_without_vectors(db: Db, model: str, doc_digest: DocDigest) -> bool:
    """At start, with an embedding model configured: whether pgvector is there. When it is not, one WARN
    says recall ranks by text and the path boost alone (REQ-11's fusion without the cosine ranking)."""
    if has_pgvector(db):
        compact_vec_table(db)
        cache_once(db, doc_digest)
        return True
    _log.bind(embedding_model=model).warning(
        "pgvector is not installed in the store's database: the built-in provider ranks by text alone"
        " (install the `vector` extension for hybrid ranking)")
    return False


def vector_from_cache(db: Db, *, doc_id: int, scope: str, model: str, digest: str) -> bool:
    """Give the document its vector from the embedding cache (when pgvector is there): the row's own
    copy, or the vector of the document it points at; False when the cache has none for this content
    and model (a row copied from a SQLite store, where it pointed at a document there, is none)."""
    row = db.execute("SELECT vector, dim, doc_id FROM builtin_embed_cache WHERE content_hash = ? AND model = ?",
                     [digest, model]).fetchone()
    if row is None:
        return False
    if row[2] is not None:
        found = db.execute("SELECT embedding::vector::real[] FROM builtin_vec WHERE doc_id = ?", [row[2]]).fetchone() \
            if _vec_exists(db) else None
        if found is None:
            return False
        vector = [float(x) for x in found[0]]
    elif row[0]:
        vector = as_floats(bytes(row[0]), int(row[1]))
    else:
        return False
    if not has_vector(db, doc_id):
        write_vector(db, doc_id=doc_id, scope=scope, model=model, digest=digest, vector=vector,
                     blob=sqlite_vec.serialize_float32(vector))
    return True


def cache_once(db: Db, doc_digest: DocDigest) -> int:
    """Store each vector once (at start, as `index_sqlite.cache_once`): cache rows that copy a live
    document's vector point at it instead; returns the rows pointed."""
    if db.execute("SELECT 1 FROM builtin_meta WHERE key = 'cache_form'").fetchone() is not None:
        return 0
    pointed = 0
    model = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_model'").fetchone()
    if _vec_exists(db) and model is not None:
        for doc_id, summary, excerpt, failures in db.execute(
                "SELECT d.doc_id, d.summary, d.excerpt, d.failures FROM builtin_docs d"
                " JOIN builtin_vec v ON v.doc_id = d.doc_id").fetchall():
            digest = doc_digest(summary or "", excerpt or "", failures or "[]")
            pointed += db.execute("UPDATE builtin_embed_cache SET vector = ?, doc_id = ? WHERE content_hash = ?"
                                  " AND model = ? AND doc_id IS NULL", [b"", int(doc_id), digest, model[0]]).rowcount
    db.execute("INSERT INTO builtin_meta (key, value) VALUES ('cache_form', 'by_doc') ON CONFLICT (key) DO NOTHING")
    return pointed


def forget(db: Db, episode_id: str) -> bool:
    row = db.execute("SELECT doc_id FROM builtin_docs WHERE episode_id = ?", [episode_id]).fetchone()
    if row is None:
        return False
    delete_doc(db, int(row[0]))
    return True


async def copy_vectors(source: Store, target: Store) -> None:
    """`memactors store migrate`'s last step (``store.migrate.copy_store``): the built-in provider's
    vectors from sqlite-vec (a SQLite `source`) into pgvector (`target`), by episode (doc ids differ),
    when pgvector is installed."""

    def read(db: Db) -> tuple[str | None, int, list[tuple[str, str, bytes]]]:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'builtin_vec'").fetchone():
            return None, 0, []
        meta = dict(db.execute("SELECT key, value FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')").fetchall())
        rows = db.execute("SELECT d.episode_id, d.scope, v.embedding FROM builtin_vec v"
                          " JOIN builtin_docs d ON d.doc_id = v.doc_id").fetchall()
        return meta.get("vec_model"), int(meta.get("vec_dim") or 0), [(r[0], r[1], bytes(r[2])) for r in rows]

    model, dim, vectors = await source.read(read)
    if not model or not vectors:
        return

    def write(db: Db) -> int:
        if not has_pgvector(db):
            return 0
        n = 0
        for episode_id, scope, blob in vectors:
            row = db.execute("SELECT doc_id, content_hash FROM builtin_docs WHERE episode_id = ?",
                             [episode_id]).fetchone()
            if row is None or has_vector(db, int(row[0])):
                continue
            vector = as_floats(blob, dim)  # SQLite's int8 (or an older store's float32)
            write_vector(db, doc_id=int(row[0]), scope=scope, model=model, digest=row[1],
                         vector=vector, blob=sqlite_vec.serialize_float32(vector))
            n += 1
        return n

    await target.write(write)


class PgIndex:
    """`builtin.DocIndex` on PostgreSQL: this module's functions."""

    write_doc = staticmethod(write_doc)
    forget = staticmethod(forget)
    text_candidates = staticmethod(text_candidates)
    metadata_only = staticmethod(metadata_only)
    briefing_order = staticmethod(briefing_order)
    path_candidates = staticmethod(path_candidates)
    knn = staticmethod(knn)
    evidence = staticmethod(evidence)
    vector_from_cache = staticmethod(vector_from_cache)
    missing_vectors = staticmethod(missing_vectors)
    check_vectors = staticmethod(warn_without_vectors)
    pending_docs = staticmethod(pending_docs)
    doc_exists = staticmethod(doc_exists)
    retire_vectors = staticmethod(retire_vectors)
    vector_count = staticmethod(vector_count)
    scopes_to_divide = staticmethod(scopes_to_divide)
    scope_vectors = staticmethod(scope_vectors)
    write_division = staticmethod(write_division)
    pack_scopes = staticmethod(pack_scopes)

    @staticmethod
    def write_vector(db: Db, *, doc_id: int, scope: str, model: str, digest: str, vector: Sequence[float]) -> None:
        """`write_vector`, the cache's bytes as the SQLite engine stores them (float32, sqlite-vec's form)."""
        write_vector(db, doc_id=doc_id, scope=scope, model=model, digest=digest, vector=vector,
                     blob=sqlite_vec.serialize_float32(list(vector)))


PG_INDEX = PgIndex()
