"""The built-in provider's storage on SQLite (REQ-11 on the embedded store), as `builtin.index_pg` keeps
PostgreSQL's: `SqliteIndex`, the provider's `builtin.DocIndex` on this engine.

* `builtin_docs` (one row per episode, its doc id in the scope's own range: `store.scope_doc_id`) with
  `builtin_fts` (FTS5, `porter unicode61`, external content, kept in step by triggers: the text is
  stored once) — queried by `builtin/ranking.py`'s FTS5 statements (BM25 candidates, the metadata-only test,
  the briefing order, the path candidates);
* `builtin_vec`, a plain table of one int8 embedding per episode, clustered by (scope, cell, doc_id)
  so a scope's cells are each one contiguous range (`VEC_LAYOUT`), created once the embedding dimension
  is known and rebuilt empty when the model or dimension changes; embeddings cached by content in
  `builtin_embed_cache`. A large scope is divided into cells (`builtin.vector_cells`: centroids in
  `builtin_vec_cells`, the last division in `builtin_vec_divisions`) and its knn reads the cells nearest
  the query; a small one is one cell (0), searched exactly. The knn reads the cells' vectors in one
  aggregate and scores them with numpy (`vec_candidates`).

The flow over them (record, embed, recall with REQ-11's fusion, forget) is `builtin.BuiltinProvider`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlite_utils
import sqlite_vec

from ..store import scope_doc_id, scope_key
from ..store.builtin_docs import FTS_COLUMNS
from . import vector_cells
from .index import as_floats as as_floats
from .index import quantize, stored_form
from .ranking import (
    CANDIDATES,
    Evidence,
    Hit,
    bm25_candidates,
    briefing_order,
    closest_first,
    metadata_only,
    path_candidates,
    scope_ranges,
)
from .vector_cells import Division, due, nearest, unit_rows

if TYPE_CHECKING:
    from ..store.builtin_docs import DocFields
    from .index import DocDigest, DocIndex


def put_doc(db: sqlite_utils.Database, *, episode_id: str, scope: str, fields: DocFields, started_at: str,
            digest: str) -> tuple[int, bool]:
    """`DocIndex.write_doc` on SQLite: insert or replace one episode's document; returns (doc_id, changed)."""
    row = db.execute("SELECT doc_id, content_hash, scope FROM builtin_docs WHERE episode_id = ?",
                     [episode_id]).fetchone()
    if row is not None and row[1] == digest and row[2] == scope:
        return int(row[0]), False  # recording the same episode twice changes nothing
    if row is not None:
        delete_doc(db, int(row[0]))
    doc_id = scope_doc_id(db, scope)  # in the scope's own rowid range
    insert_doc(db, doc_id=doc_id, episode_id=episode_id, scope=scope, fields=fields, started_at=started_at,
               digest=digest)
    return doc_id, True


def insert_doc(db: sqlite_utils.Database, *, doc_id: int, episode_id: str, scope: str, fields: DocFields,
               started_at: str, digest: str) -> None:
    """One builtin_docs row; builtin_fts follows by trigger (external content: the text is stored once)."""
    db.execute(
        "INSERT INTO builtin_docs (doc_id, episode_id, scope, scope_key, title, excerpt, summary, files, failures,"
        " meta, harness, branch, outcome, started_at, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [doc_id, episode_id, scope, scope_key(scope), fields.title, fields.excerpt, fields.summary,
         json.dumps(list(fields.files), ensure_ascii=False), json.dumps([list(f) for f in fields.failures],
                                                                        ensure_ascii=False),
         fields.meta, fields.harness, fields.branch, fields.outcome, started_at, digest],
    )


def delete_doc(db: sqlite_utils.Database, doc_id: int) -> None:
    db.execute("DELETE FROM builtin_docs WHERE doc_id = ?", [doc_id])  # builtin_fts follows by trigger
    if vec_exists(db):
        _keep_in_cache(db, doc_id)
        db.execute("DELETE FROM builtin_vec WHERE doc_id = ?", [doc_id])


def vec_exists(db: sqlite_utils.Database) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'builtin_vec'").fetchone() is not None



#: How `builtin_vec` holds a vector: int8, each vector scaled by its own largest component (cosine
#: does not see the scale), a quarter of float32's bytes and of the KNN's reading. On bench/scale.py's
#: 100k store its best 8 are float32's best 8 within recall@8 0.9x (docs/benchmarks.md, "A million
#: episodes"); bench/recall_quality.py's MRR is unchanged.
VEC_FORM = "int8"
#: `builtin_vec`'s layout: a plain table clustered by (scope, cell, doc_id), WITHOUT ROWID, with a unique
#: index on doc_id for the per-document look-ups (the cache, the back-fill, forget). A knn reads its
#: cells as one range each and scores them in numpy. Before it (layout "cell-meta", and before that no
#: layout) the vectors were in a sqlite-vec `vec0` table; vec0 costs ~0.8 µs per int8 vector and reads
#: every chunk of a scope even when a metadata filter keeps only the probed cells (bench/scale.py
#: --partition 170000: the 104 probed cells of 664 took 54 ms of CPU in vec0; docs/benchmarks.md).
VEC_LAYOUT = "cells-table"


def _create_vec_table(db: sqlite_utils.Database, *, keep_cells: bool = False) -> None:
    db.execute("CREATE TABLE builtin_vec (scope TEXT NOT NULL, cell INTEGER NOT NULL, doc_id INTEGER NOT NULL,"
               " embedding BLOB NOT NULL, PRIMARY KEY (scope, cell, doc_id)) WITHOUT ROWID")
    db.execute("CREATE UNIQUE INDEX builtin_vec_by_doc ON builtin_vec (doc_id)")
    if not keep_cells:
        db.execute("DELETE FROM builtin_vec_cells")
        db.execute("DELETE FROM builtin_vec_divisions")
    db.execute("DELETE FROM builtin_meta WHERE key = 'vec_chunk'")  # vec0's, gone with it
    db.execute("INSERT OR REPLACE INTO builtin_meta (key, value) VALUES ('vec_form', ?), ('vec_layout', ?)",
               [VEC_FORM, VEC_LAYOUT])


def _drop_vec_table(db: sqlite_utils.Database, *, keep_cells: bool = False) -> None:
    db.execute("DROP TABLE builtin_vec")
    if not keep_cells:
        db.execute("DELETE FROM builtin_vec_cells")
        db.execute("DELETE FROM builtin_vec_divisions")


def _cell_of(db: sqlite_utils.Database, scope: str, vector: Sequence[float]) -> int:
    """The cell a new vector of `scope` joins: the nearest centroid's, or 0 in a scope not divided."""
    row = db.execute("SELECT cell FROM builtin_vec_cells WHERE scope = ?"
                     " ORDER BY vec_distance_cosine(centroid, ?) LIMIT 1",
                     [scope, sqlite_vec.serialize_float32(list(vector))]).fetchone()
    return 0 if row is None else int(row[0])


def _insert_vec(db: sqlite_utils.Database, doc_id: int, scope: str, blob: bytes,
                vector: Sequence[float] | None = None) -> None:
    """Insert one int8 vector into its scope's cell (found by `vector`, or by the int8 `blob` itself)."""
    cell = _cell_of(db, scope, vector if vector is not None else as_floats(blob, len(blob)))
    db.execute("INSERT INTO builtin_vec (doc_id, scope, cell, embedding) VALUES (?, ?, ?, ?)",
               [doc_id, scope, cell, blob])


def ensure_vec_table(db: sqlite_utils.Database, model: str, dim: int) -> None:
    """Create `builtin_vec` for (model, dim), or rebuild it empty when either changed."""
    meta = dict(db.execute("SELECT key, value FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')").fetchall())
    exists = vec_exists(db)
    if exists and meta.get("vec_model") == model and meta.get("vec_dim") == str(dim):
        return
    if exists:
        _keep_in_cache(db)
        _drop_vec_table(db)
    _create_vec_table(db)
    db.execute("INSERT OR REPLACE INTO builtin_meta (key, value) VALUES ('vec_model', ?), ('vec_dim', ?)",
               [model, str(dim)])


def compact_vec_table(db: sqlite_utils.Database) -> bool:
    """Rebuild a `builtin_vec` made before `VEC_LAYOUT` (a sqlite-vec `vec0` table: float32 before
    `VEC_FORM`, or int8 without cells, or int8 with the cell as a metadata column) into the plain table,
    with its vectors kept (converted to VEC_FORM; a store that had cells keeps them and its divisions,
    any other has every scope one cell until the back-fill divides it), in the caller's write
    transaction; whether it did. Run once at start (`check_vectors`)."""
    if not vec_exists(db):
        return False
    meta = dict(db.execute("SELECT key, value FROM builtin_meta"
                           " WHERE key IN ('vec_dim', 'vec_form', 'vec_layout')").fetchall())
    if (meta.get("vec_form", "float32") == VEC_FORM and meta.get("vec_layout") == VEC_LAYOUT) \
            or meta.get("vec_dim") is None:
        return False
    dim = int(meta["vec_dim"])
    keep_cells = meta.get("vec_layout") == "cell-meta"
    cell = "cell" if keep_cells else "0"
    rows = [(int(d), str(s), int(c), stored_form(bytes(e), dim))
            for d, s, c, e in db.execute(f"SELECT doc_id, scope, {cell}, embedding FROM builtin_vec")]
    _drop_vec_table(db, keep_cells=keep_cells)
    _create_vec_table(db, keep_cells=keep_cells)
    rows.sort(key=lambda r: (r[1], r[2], r[0]))  # in the table's order: every insert appends
    db.conn.executemany("INSERT INTO builtin_vec (doc_id, scope, cell, embedding) VALUES (?, ?, ?, ?)", rows)
    return True


def cache_once(db: sqlite_utils.Database, doc_digest: DocDigest) -> int:
    """Store each vector once (run once at start, `check_vectors`): a store made before the cache
    pointed at `builtin_vec` holds every live document's vector twice, in `builtin_vec` and in its
    `builtin_embed_cache` row. Each such row is pointed at its document (its embedding text's digest
    under the vectors' model) and loses its copy; rows of documents no longer there keep theirs, in
    VEC_FORM. Returns the rows pointed."""
    if db.execute("SELECT value FROM builtin_meta WHERE key = 'cache_form'").fetchone() is not None:
        return 0
    pointed = 0
    meta = dict(db.execute("SELECT key, value FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')").fetchall())
    if vec_exists(db) and meta.get("vec_model"):
        model = meta["vec_model"]
        for doc_id, summary, excerpt, failures in db.execute(
                "SELECT d.doc_id, d.summary, d.excerpt, d.failures FROM builtin_docs d"
                " JOIN builtin_vec v ON v.doc_id = d.doc_id").fetchall():
            digest = doc_digest(summary or "", excerpt or "", failures or "[]")
            pointed += db.execute("UPDATE builtin_embed_cache SET vector = X'', doc_id = ? WHERE content_hash = ?"
                                  " AND model = ? AND doc_id IS NULL", [int(doc_id), digest, model]).rowcount
    for rowid, dim, blob in db.execute("SELECT rowid, dim, vector FROM builtin_embed_cache"
                                       " WHERE length(vector) = 4 * dim").fetchall():
        db.execute("UPDATE builtin_embed_cache SET vector = ? WHERE rowid = ?", [stored_form(bytes(blob), int(dim)), rowid])
    db.execute("INSERT OR REPLACE INTO builtin_meta (key, value) VALUES ('cache_form', 'by_doc')")
    return pointed


def _keep_in_cache(db: sqlite_utils.Database, doc_id: int | None = None) -> None:
    """Before a vector leaves `builtin_vec` (its document deleted, or every vector retired): a cache row
    pointing at it gets its own copy, so the same text later gets its vector back without the model."""
    if doc_id is None:
        rows = db.execute("SELECT c.rowid, v.embedding FROM builtin_embed_cache c JOIN builtin_vec v"
                          " ON v.doc_id = c.doc_id").fetchall()
    else:  # the vec0 row by its key, not a join vec0 might answer by a scan
        pointing = db.execute("SELECT rowid FROM builtin_embed_cache WHERE doc_id = ?", [doc_id]).fetchall()
        found = db.execute("SELECT embedding FROM builtin_vec WHERE doc_id = ?", [doc_id]).fetchone() \
            if pointing else None
        rows = [(r[0], found[0]) for r in pointing] if found is not None else []
    for rowid, blob in rows:
        db.execute("UPDATE builtin_embed_cache SET vector = ?, doc_id = NULL WHERE rowid = ?", [bytes(blob), rowid])
    db.execute("DELETE FROM builtin_embed_cache WHERE doc_id IS NOT NULL"
               + ("" if doc_id is None else f" AND doc_id = {int(doc_id)}"))


def write_vector(db: sqlite_utils.Database, *, doc_id: int, scope: str, model: str, digest: str,
                 vector: Sequence[float]) -> None:
    """Store one episode's embedding in `builtin_vec`, and point the cache's row for its text at it
    (the vector is stored once)."""
    ensure_vec_table(db, model, len(vector))
    db.execute("INSERT OR REPLACE INTO builtin_embed_cache (content_hash, model, dim, vector, doc_id)"
               " VALUES (?, ?, ?, X'', ?)", [digest, model, len(vector), doc_id])
    db.execute("DELETE FROM builtin_vec WHERE doc_id = ?", [doc_id])
    _insert_vec(db, doc_id, scope, quantize(vector), vector)


def _cache_row(db: sqlite_utils.Database, digest: str, model: str) -> tuple[bytes, int] | None:
    """The cached vector of (text digest, model) and its dimension: the row's own copy, or the vector
    of the document it points at."""
    row = db.execute("SELECT vector, dim, doc_id FROM builtin_embed_cache WHERE content_hash = ? AND model = ?",
                     [digest, model]).fetchone()
    if row is None:
        return None
    if row[2] is None:
        return bytes(row[0]), int(row[1])
    found = db.execute("SELECT embedding FROM builtin_vec WHERE doc_id = ?", [int(row[2])]).fetchone() \
        if vec_exists(db) else None
    return None if found is None else (bytes(found[0]), int(row[1]))


def cached_vector(db: sqlite_utils.Database, digest: str, model: str) -> bytes | None:
    """The cached vector's bytes in VEC_FORM, or None."""
    found = _cache_row(db, digest, model)
    return None if found is None else stored_form(*found)


def missing_vectors(db: sqlite_utils.Database) -> int:
    total = db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]
    if not vec_exists(db):
        return int(total)
    have = db.execute("SELECT count(*) FROM builtin_vec").fetchone()[0]
    return int(total) - int(have)


def pending_docs(db: sqlite_utils.Database, limit: int, before: int | None = None,
                 among: Sequence[int] | None = None) -> list[tuple[int, str, str, str, str, str]]:
    """Up to `limit` documents without a vector, newest doc ids first: (doc_id, scope, summary, excerpt,
    files JSON, failures JSON), what `builtin.embedding_text` is made of."""
    conds = ["NOT EXISTS (SELECT 1 FROM builtin_vec v WHERE v.doc_id = d.doc_id)"] if vec_exists(db) else []
    if before is not None:  # the next page of one pass: never scans the ones already embedded again
        conds.append(f"d.doc_id < {int(before)}")
    if among is not None:  # a recall's own candidates (`BuiltinProvider.embed_candidates`)
        conds.append(f"d.doc_id IN ({','.join(str(int(d)) for d in among) or 'NULL'})")
    cond = " WHERE " + " AND ".join(conds) if conds else ""
    return [tuple(r) for r in db.execute(
        f"SELECT d.doc_id, d.scope, d.summary, d.excerpt, d.files, d.failures FROM builtin_docs d{cond}"
        f" ORDER BY d.doc_id DESC LIMIT {int(limit)}").fetchall()]


def doc_exists(db: sqlite_utils.Database, doc_id: int) -> bool:
    return db.execute("SELECT 1 FROM builtin_docs WHERE doc_id = ?", [doc_id]).fetchone() is not None


def retire_vectors(db: sqlite_utils.Database, model: str, *, everything: bool = False) -> bool:
    """Drop `builtin_vec` when its vectors are of another model (or embedding-text version), or all of
    them with `everything`, so every document is pending again; whether it was dropped. The cache stays:
    a document whose text is unchanged gets its vector back from it without the model."""
    if not vec_exists(db):
        return False
    row = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_model'").fetchone()
    if not everything and row is not None and row[0] == model:
        return False
    _keep_in_cache(db)
    _drop_vec_table(db)
    db.execute("DELETE FROM builtin_meta WHERE key IN ('vec_model', 'vec_dim')")
    return True


def vector_count(db: sqlite_utils.Database) -> tuple[int, int]:
    """(documents, documents with a vector)."""
    total = int(db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0])
    return total, total - missing_vectors(db)


def probe_cells(db: sqlite_utils.Database, vector: Sequence[float], scope: str, probes: int | None = None) -> list[int]:
    """The cells of `scope` a knn reads: the `probes` (by default `vector_cells.probes` of the scope's
    cells) whose centroids are nearest `vector`, or the one cell (0) of a scope not divided."""
    if probes is None:
        row = db.execute("SELECT cells FROM builtin_vec_divisions WHERE scope = ?", [scope]).fetchone()
        if row is None:
            return [0]
        probes = vector_cells.probes(int(row[0]))
    return [int(r[0]) for r in db.execute(
        "SELECT cell FROM builtin_vec_cells WHERE scope = ? ORDER BY vec_distance_cosine(centroid, ?)"
        f" LIMIT {int(probes)}", [scope, sqlite_vec.serialize_float32(list(vector))]).fetchall()] or [0]


def cell_vectors(db: sqlite_utils.Database, scope: str, cells: Sequence[int] | None = None) -> tuple[Any, Any]:
    """The doc ids (int64) and int8 vectors (rows) of `scope`'s `cells` (None: all of them), read in one
    aggregate: SQLite concatenates the blobs itself, so no Python object is made per vector (a row at a
    time cost ~1 µs a vector, as much as scoring it)."""
    import numpy as np

    among = f" AND cell IN ({','.join('?' * len(cells))})" if cells is not None else ""
    blob, ids = db.execute(f"SELECT CAST(group_concat(embedding, '') AS BLOB), group_concat(printf('%016x', doc_id), '')"
                           f" FROM builtin_vec WHERE scope = ?{among}", [scope, *(cells or [])]).fetchone()
    if not ids:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.int8)
    doc_ids = np.frombuffer(bytes.fromhex(str(ids)), dtype=">i8").astype(np.int64)  # doc ids are positive
    return doc_ids, np.frombuffer(bytes(blob), dtype=np.int8).reshape(len(doc_ids), -1)


def vec_candidates(db: sqlite_utils.Database, vector: Sequence[float], scope: str, k: int,
                   probes: int | None = None) -> list[tuple[float, int]]:
    """The best `k` (cosine distance, doc_id) of `scope`, closest first: the exact cosine, in numpy, of
    the vectors of the cells `probe_cells` picks (every vector of a scope not divided)."""
    cells = probe_cells(db, vector, scope, probes)
    doc_ids, x = cell_vectors(db, scope, None if cells == [0] else cells)
    if not len(doc_ids) or x.shape[1] != len(vector):
        return []
    best, distance = nearest(x, vector, k)
    return sorted((float(distance[i]), int(doc_ids[i])) for i in best)[:k]


def knn(db: sqlite_utils.Database, vector: Sequence[float], scopes: Sequence[str]) -> list[Hit]:
    """Best CANDIDATES episodes by cosine distance in the given scopes (`vec_candidates`: exact in a
    small scope, the nearest cells of a divided one), closest first."""
    if not vec_exists(db):
        return []
    dim = db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()
    if dim is None or int(dim[0]) != len(vector):
        return []
    distance: dict[int, float] = {}
    for scope in dict.fromkeys(scopes):
        distance.update((d, dist) for dist, d in vec_candidates(db, vector, scope, CANDIDATES))
    best = sorted(distance, key=lambda d: distance[d])[:CANDIDATES]
    found: list[tuple[float, str, int, str]] = []
    for chunk in _chunks(best, _IN_LIST):
        found += [(distance[int(r[1])], r[0], int(r[1]), r[2]) for r in db.execute(
            f"SELECT episode_id, doc_id, started_at FROM builtin_docs WHERE doc_id IN ({','.join('?' * len(chunk))})",
            chunk).fetchall()]
    return [Hit(r[1], r[2], r[3], 1.0 - r[0]) for r in closest_first(found)]


# -- cells (`builtin.vector_cells`) ------------------------------------------------------------------


def scopes_to_divide(db: sqlite_utils.Database) -> list[str]:
    """`CellIndex.scopes_to_divide` on SQLite: the scopes whose documents ever numbered (`builtin_scopes`,
    one row a scope: read after every back-fill pass, so never a count of the store) reach the next
    division, confirmed by their documents and then their vectors."""
    if not vec_exists(db):
        return []
    divided = dict(db.execute("SELECT scope, vectors FROM builtin_vec_divisions").fetchall())
    out = []
    for scope, numbered in db.execute("SELECT scope, next_seq - 1 FROM builtin_scopes").fetchall():
        if not due(int(numbered), divided.get(scope)):
            continue
        (docs,) = db.execute("SELECT count(*) FROM builtin_docs WHERE scope = ?", [scope]).fetchone()
        if due(int(docs), divided.get(scope)):
            (vectors,) = db.execute("SELECT count(*) FROM builtin_vec WHERE scope = ?", [scope]).fetchone()
            if due(int(vectors), divided.get(scope)):
                out.append(str(scope))
    return out


def scope_vectors(db: sqlite_utils.Database, scope: str) -> tuple[list[int], Any]:
    """`CellIndex.scope_vectors` on SQLite: the scope's doc ids and unit float32 rows of its int8 vectors."""
    import numpy as np

    doc_ids, x = cell_vectors(db, scope)
    if not len(doc_ids):
        return [], np.zeros((0, 0), dtype=np.float32)
    return [int(d) for d in doc_ids], unit_rows(x.astype(np.float32))


def write_division(db: sqlite_utils.Database, division: Division) -> None:
    """`CellIndex.write_division` on SQLite: the scope's centroids replaced, and each of its vectors in
    its new cell; a vector written since the division was fitted joins its nearest new centroid."""
    import numpy as np

    scope = division.scope
    db.execute("DELETE FROM builtin_vec_cells WHERE scope = ?", [scope])
    for n, c in enumerate(division.centroids):
        db.execute("INSERT INTO builtin_vec_cells (scope, cell, centroid) VALUES (?, ?, ?)",
                   [scope, n, c.astype(np.float32).tobytes()])
    db.execute("INSERT OR REPLACE INTO builtin_vec_divisions (scope, vectors, cells) VALUES (?, ?, ?)",
               [scope, division.vectors, len(division.centroids)])
    rows = db.execute("SELECT doc_id, cell, embedding FROM builtin_vec WHERE scope = ?", [scope]).fetchall()
    moves = []
    for doc_id, cell, blob in rows:
        new = division.cells.get(int(doc_id))
        if new is None:  # written after the division was fitted
            x = unit_rows(np.frombuffer(bytes(blob), dtype=np.int8).astype(np.float32)[None, :])
            new = int(np.argmax(division.centroids @ x[0]))
        if new != int(cell):
            moves.append((new, int(doc_id)))
    db.conn.executemany("UPDATE builtin_vec SET cell = ? WHERE doc_id = ?", moves)


def evidence(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str], doc_ids: Sequence[int],
             vectors: bool = False) -> Evidence:
    """`DocIndex.evidence` on SQLite: each word's documents in the scopes (an FTS5 match of the word in
    every column but the scope's token, within each scope's doc-id range), the candidates' words among
    them and, with `vectors`, which candidates have a vector.

    One statement per word and scope counts the matches and names the candidates among them inside
    SQLite (a scope's matches are not walked row by row in Python), and one statement finds the
    candidates' vectors (not one lookup each)."""
    ranges = scope_ranges(db, scopes)
    wanted = list(dict.fromkeys(int(d) for d in doc_ids))
    docs = 0
    for scope, low, high in ranges:
        docs += int(db.execute("SELECT count(*) FROM builtin_docs WHERE doc_id BETWEEN ? AND ? AND scope = ?",
                               [low, high, scope]).fetchone()[0])
    columns = "{" + " ".join(FTS_COLUMNS[1:]) + "}"
    df: dict[str, int] = {}
    present: dict[int, set[str]] = {d: set() for d in wanted}
    chunks = _chunks(wanted, _IN_LIST) or [[]]
    for w in dict.fromkeys(words):
        term = w.replace('"', "")
        if not term:
            continue
        found = 0
        for _scope, low, high in ranges:
            for n, chunk in enumerate(chunks):  # one chunk unless a recall names more than _IN_LIST candidates
                among = f"rowid IN ({','.join('?' * len(chunk))})" if chunk else "0"
                count, held = db.execute(
                    f"SELECT count(*), group_concat(CASE WHEN {among} THEN rowid END) FROM builtin_fts"
                    " WHERE builtin_fts MATCH ? AND rowid BETWEEN ? AND ?",
                    [*chunk, f'{columns} : "{term}"', low, high]).fetchone()
                if n == 0:
                    found += int(count)
                for rowid in str(held).split(",") if held else ():
                    present[int(rowid)].add(w)
        df[w] = found
    vectored: set[int] = set()
    if vectors and wanted and vec_exists(db):
        for part in chunks:
            vectored.update(int(r[0]) for r in db.execute(
                f"SELECT doc_id FROM builtin_vec WHERE doc_id IN ({','.join('?' * len(part))})", part).fetchall())
    return Evidence(docs, df, {d: frozenset(ws) for d, ws in present.items()}, frozenset(vectored))


#: Most ids bound into one `IN (...)` list (SQLite's default limit on a statement's parameters is 32,766).
_IN_LIST = 500


def _chunks(ids: Sequence[int], size: int) -> list[Sequence[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def vector_from_cache(db: sqlite_utils.Database, *, doc_id: int, scope: str, model: str, digest: str) -> bool:
    """`DocIndex.vector_from_cache` on SQLite: the document gets the cached vector, and the cache row,
    when it held its own copy, points at the document instead (stored once)."""
    found = _cache_row(db, digest, model)
    if found is None:
        return False
    blob, dim = found
    exists = vec_exists(db) and db.execute("SELECT 1 FROM builtin_vec WHERE doc_id = ?", [doc_id]).fetchone() is not None
    if not exists:
        ensure_vec_table(db, model, dim)
        _insert_vec(db, doc_id, scope, stored_form(blob, dim))
        db.execute("UPDATE builtin_embed_cache SET vector = X'', doc_id = ? WHERE content_hash = ? AND model = ?"
                   " AND doc_id IS NULL", [doc_id, digest, model])
    return True


def forget(db: sqlite_utils.Database, episode_id: str) -> bool:
    row = db.execute("SELECT doc_id FROM builtin_docs WHERE episode_id = ?", [episode_id]).fetchone()
    if row is None:
        return False
    delete_doc(db, int(row[0]))
    return True


class SqliteIndex:
    """`DocIndex` on SQLite: FTS5 (`builtin_fts`, BM25 with BM25_WEIGHTS, the scope's token and doc-id
    range) and `builtin_vec` (int8 vectors by scope and cell, scored in numpy; sqlite-vec, which ships
    with the engine, for the centroids' distances)."""

    write_doc = staticmethod(put_doc)
    forget = staticmethod(forget)
    text_candidates = staticmethod(bm25_candidates)
    metadata_only = staticmethod(metadata_only)
    briefing_order = staticmethod(briefing_order)
    path_candidates = staticmethod(path_candidates)
    knn = staticmethod(knn)
    evidence = staticmethod(evidence)
    vector_from_cache = staticmethod(vector_from_cache)
    write_vector = staticmethod(write_vector)
    missing_vectors = staticmethod(missing_vectors)
    pending_docs = staticmethod(pending_docs)
    doc_exists = staticmethod(doc_exists)
    retire_vectors = staticmethod(retire_vectors)
    vector_count = staticmethod(vector_count)
    scopes_to_divide = staticmethod(scopes_to_divide)
    scope_vectors = staticmethod(scope_vectors)
    write_division = staticmethod(write_division)

    @staticmethod
    async def pack_scopes(store: Any) -> int:
        """`CellIndex.pack_scopes`: nothing to do, `builtin_vec` is clustered by (scope, cell, doc_id)."""
        return 0

    @staticmethod
    def check_vectors(db: sqlite_utils.Database, model: str, doc_digest: DocDigest) -> bool:
        compact_vec_table(db)
        cache_once(db, doc_digest)
        return True


SQLITE_INDEX: DocIndex = SqliteIndex()
