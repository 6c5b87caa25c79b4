"""Recall at 100k and 1M episodes with embeddings on, on SQLite and on PostgreSQL: a million
episodes.

    .venv/bin/python bench/scale.py                                # 100k on both engines, 200 queries
    .venv/bin/python bench/scale.py --sizes 100000 1000000 --engines sqlite --keep /tmp/scale
    .venv/bin/python bench/scale.py --sizes 1000000 --engines sqlite --bulk --keep /work/scale --build-only
    .venv/bin/python bench/scale.py --sizes 1000000 --engines sqlite --keep /work/scale   # the kept store again

With `--keep` the corpus (vectors, repositories, queries) is saved beside the stores, so a kept store is
measured again without making the corpus again (1M episodes: ~2 minutes) or building it (~20 minutes).

**The corpus is synthetic, and so are most of its vectors.** Episodes come from a template vocabulary
of coding-agent work (verbs, components, failures, files: "fix flaky timeout in the session cache
after the retry change ..."), spread over `--repos` repositories (200) with a Zipf-skewed share each,
as a fleet's are (the biggest repository holds ~17 % of the episodes). They are written with the
store's own write functions (`bench/store_engines.py`'s `_write_batch`: the daemon's rows and the
built-in provider's `write_doc`), in batches of 1,000, not through `runs ingest` (the record pipeline
would take hours at 1M). Embedding 1M texts with the real model would take days of CPU on 2 cores: the
first `--real` (2,000) episodes are embedded with the embedded model (all-MiniLM-L6-v2 int8), and every
other episode's vector is derived from them — one real vector plus a fraction of another, plus
Gaussian noise, normalised — and stored with the provider's own `write_vector` under the embedded
model's key, so the service runs no back-fill. The queries (2-3 words of an episode of the asking
repository) are embedded by the real model when recalled.

For the same queries, in this one process and run, it times:

* **recall**: `MemoryService.recall` (the operator's recall, the service path the RPC `Recall` and
  `memactors memory recall` take below the wire: the briefing actor, the provider session, in-process
  MCP, the built-in provider's hybrid ranking with the query embedded by the real model), limit 8;
* **text**: the raw text query alone (SQLite: FTS5, the words AND-ed with the scope's token,
  `ORDER BY rank LIMIT 8`; PostgreSQL: the `tsvector` AND query with the scope, `ts_rank_cd`, LIMIT 8);
* **knn**: the raw vector query alone, best 8 of the asking repository, as the provider asks it
  (`index_sqlite.vec_candidates` / `index_pg.knn_rows`: the nearest cells of a divided scope,
  `builtin.vector_cells`, or the whole scope below CELLS_FROM vectors);
* **exact**: the same query over every cell of the scope (the exact scan in the stored form: int8
  scored in numpy on SQLite, halfvec in pgvector), the anchor the cells are measured against;
* **embed**: the model run on the query;
* **recall@8**: the knn's 8 (and the exact scan's) against the exact 8 of numpy's cosine over the
  scope's float32 vectors as derived, averaged over the queries.

The service is opened on the built (or kept) store: its start brings a store made before to this
version's form (`check_vectors`) and its back-fill's first pass divides the large scopes; both are
timed before the queries. `--pg-index hnsw ivfflat` also builds pgvector's own store-wide indexes after
the measurement and times their knn (HNSW m = 16, ef_construction = 64, ef_search 200; IVFFlat with
rows/1000 lists, probes 10; both with iterative scans), for comparison. It prints the machine and its
load first and last.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_engines  # noqa: E402
from store_engines import _write_batch, config_for, pct  # noqa: E402
from user_paths import machine  # noqa: E402

from memactors import builtin  # noqa: E402
from memactors.builtin import index_pg, index_sqlite, vector_model  # noqa: E402
from memactors.builtin.index import quantize  # noqa: E402
from memactors.config import ConfigHolder, load_config  # noqa: E402
from memactors.embedding import BUILTIN_MODEL, shared_model  # noqa: E402
from memactors.logs import configure_logging  # noqa: E402
from memactors.repo import scope_for  # noqa: E402
from memactors.service import open_memory_service  # noqa: E402
from memactors.store.engines import open_store  # noqa: E402
from memactors.testing.postgres import Cluster  # noqa: E402

LIMIT = 8
BATCH = 1000
MODEL = vector_model(BUILTIN_MODEL)

VERBS = ("fix", "add", "refactor", "remove", "rename", "bump", "document", "test", "migrate", "speed up",
         "debug", "revert", "split", "cache", "retry", "validate", "log", "parse", "stream", "index")
THINGS = ("session", "cache", "parser", "scheduler", "token", "gateway", "router", "config", "schema",
          "migration", "retry loop", "worker pool", "rate limiter", "websocket", "auth middleware", "query planner",
          "serializer", "cli flag", "log rotation", "backup job", "importer", "exporter", "signal handler",
          "connection pool", "file watcher", "lockfile", "build script", "dockerfile", "release notes", "changelog",
          "metrics endpoint", "health check", "feature flag", "payment webhook", "search index", "email template",
          "upload handler", "thumbnail service", "timezone handling", "unicode normalisation")
PROBLEMS = ("flaky timeout", "race condition", "memory leak", "off-by-one", "null pointer", "deadlock",
            "slow query", "wrong encoding", "missing import", "type error", "stale cache", "broken link",
            "double free", "permission denied", "infinite loop", "unclosed file", "bad default", "silent failure",
            "unhandled exception", "version conflict", "lint warning", "failing test", "dependency pin")
TAILS = ("after the retry change", "under load", "on windows", "when the config is empty", "in ci only",
         "behind the proxy", "with python 3.12", "after the upgrade", "for large inputs", "on first start",
         "since the last release", "when two workers race", "for non-ascii names", "in the nightly job")
OUTCOMES = ("tests pass", "tests still failing", "reverted", "needs review", "merged", "left a todo")


def zipf_weights(n: int, s: float = 1.0) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def episode(rng: np.random.Generator, i: int, z: int) -> dict[str, Any]:
    """One templated episode of repository z."""
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    # each repository leans on its own components, as real ones do
    things = [THINGS[(z * 7 + k) % len(THINGS)] for k in range(8)] + list(THINGS)
    sentences = []
    for _ in range(int(rng.integers(2, 6))):
        thing = things[min(int(rng.pareto(1.0)), len(things) - 1)]
        sentences.append(f"{pick(VERBS)} {pick(PROBLEMS)} in the {thing} {pick(TAILS)}, {pick(OUTCOMES)}.")
    stem = things[int(rng.integers(8))].replace(" ", "_")
    files = [f"src/{stem}/{pick(THINGS).replace(' ', '_')}.py" for _ in range(int(rng.integers(1, 4)))]
    return {"z": z, "harness": f"h{z:03d}", "run_id": f"r{i}",
            "started": f"2026-{1 + i % 11:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i // 60) % 60:02d}Z",
            "body": " ".join(sentences), "files": files,
            "outcome": ("succeeded", "succeeded", "failed")[int(rng.integers(3))]}


def corpus(n: int, repos: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    zs = rng.choice(repos, size=n, p=zipf_weights(repos))
    return [episode(rng, i, int(z)) for i, z in enumerate(zs)]


#: `--text commits`: the three repositories whose commit histories give the words and paths (mirrors on this machine).
COMMIT_SOURCES = ("encode+httpx", "python-attrs+attrs", "psf+black")
_COMMIT_WORD = re.compile(r"[a-z0-9][a-z0-9_'-]*[a-z0-9]|[a-z0-9]")


def commit_vocabulary(mirrors: Path) -> tuple[list[str], np.ndarray, np.ndarray, list[tuple[list[str], np.ndarray]]]:
    """What `--text commits` draws from: every word of the commit messages (subject and body) of
    COMMIT_SOURCES, with how often it occurs; the messages' lengths in words; and each source's
    touched paths with how often each was touched. Read with `git log` from `mirrors`/<source>/repo."""
    import subprocess
    from collections import Counter

    words: Counter[str] = Counter()
    lengths: list[int] = []
    paths = []
    for source in COMMIT_SOURCES:
        git = ["git", "--git-dir", str(mirrors / source / "repo"), "log"]
        log = subprocess.run([*git, "--format=%x00%s%n%b"], capture_output=True, text=True, check=True).stdout
        for message in log.split("\0")[1:]:
            found = _COMMIT_WORD.findall(message.lower())
            if found:
                words.update(found)
                lengths.append(len(found))
        touched = Counter(line for line in subprocess.run([*git, "--format=", "--name-only"], capture_output=True,
                                                         text=True, check=True).stdout.splitlines() if line)
        names = sorted(touched)
        paths.append((names, np.array([touched[x] for x in names], dtype=np.float64) / sum(touched.values())))
    vocab = sorted(words)
    freq = np.array([words[w] for w in vocab], dtype=np.float64)
    return vocab, freq / freq.sum(), np.array(lengths), paths


def commits_corpus(n: int, repos: int, mirrors: Path, seed: int = 7) -> list[dict[str, Any]]:
    """`--text commits`: episodes whose excerpt is words drawn independently with their frequencies in
    real commit messages (`commit_vocabulary`: ~11k distinct words, "the", "fix", "to" most often, most
    words rare), as many as a real message has (a message's length drawn from theirs, at least 8), and
    1-3 paths drawn by how often each was touched in one of the sources (repository z reads source
    z mod 3). Repositories, runs, times and outcomes as `corpus`'s."""
    vocab, p, lengths, paths = commit_vocabulary(mirrors)
    rng = np.random.default_rng(seed)
    zs = rng.choice(repos, size=n, p=zipf_weights(repos))
    sizes = np.maximum(lengths[rng.integers(len(lengths), size=n)], 8)
    drawn = rng.choice(len(vocab), size=int(sizes.sum()), p=p)
    out = []
    at = 0
    for i, z in enumerate(zs):
        z = int(z)
        body = " ".join(vocab[w] for w in drawn[at:at + sizes[i]])
        at += sizes[i]
        names, weights = paths[z % len(paths)]
        files = [names[f] for f in rng.choice(len(names), size=int(rng.integers(1, 4)), p=weights)]
        out.append({"z": z, "harness": f"h{z:03d}", "run_id": f"r{i}",
                    "started": f"2026-{1 + i % 11:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i // 60) % 60:02d}Z",
                    "body": body, "files": files, "outcome": ("succeeded", "succeeded", "failed")[int(rng.integers(3))]})
    return out


def derive_vectors(real: np.ndarray, n: int, seed: int = 5) -> np.ndarray:
    """n unit vectors: the real ones first, then each one real vector + u·another (u in [0, 0.6)) +
    N(0, 0.03) per dimension, normalised (cosine ≈ 0.85-0.95 to its first parent)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, real.shape[1]), dtype=np.float32)
    k = min(len(real), n)
    out[:k] = real[:k]
    for start in range(k, n, 100_000):
        m = min(n, start + 100_000) - start
        a = real[rng.integers(len(real), size=m)]
        b = real[rng.integers(len(real), size=m)]
        v = a + rng.uniform(0, 0.6, size=(m, 1)).astype(np.float32) * b
        v += rng.normal(0, 0.03, size=v.shape).astype(np.float32)
        out[start:start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def make_queries(items: list[dict[str, Any]], count: int, seed: int = 11) -> list[tuple[int, str]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[int, str]] = []
    seen: set[str] = set()
    while len(out) < count:
        it = items[int(rng.integers(len(items)))]
        words = it["body"].replace(",", "").replace(".", "").split()
        start = int(rng.integers(max(len(words) - 3, 1)))
        q = " ".join(words[start:start + int(rng.integers(2, 4))])
        if q not in seen:  # distinct: the query-vector cache never answers
            seen.add(q)
            out.append((it["z"], q))
    return out


# -- building ----------------------------------------------------------------------------------------

async def build(target: Path | str, items: list[dict[str, Any]], vectors: np.ndarray) -> tuple[np.ndarray, float]:
    """Write the episodes and their vectors in batches; returns each item's doc id and the seconds taken."""
    store = await open_store(target)
    doc_ids = np.zeros(len(items), dtype=np.int64)
    t = time.perf_counter()
    try:
        for start in range(0, len(items), BATCH):
            chunk = items[start:start + BATCH]

            def write(db: Any, chunk: list[dict[str, Any]] = chunk, start: int = start) -> None:
                _write_batch(db, chunk, store.engine)
                for k, it in enumerate(chunk):
                    eid = builtin_episode_id(it)
                    doc_id, scope, summary, excerpt, failures = db.execute(
                        "SELECT doc_id, scope, summary, excerpt, failures FROM builtin_docs WHERE episode_id = ?",
                        [eid]).fetchone()
                    # the cache's key, as the back-fill makes it
                    digest = builtin.text_digest(builtin.embedding_text(summary or "", excerpt or "",
                                                                        json.loads(failures or "[]")))
                    doc_ids[start + k] = int(doc_id)
                    vec = vectors[start + k].tolist()
                    if store.engine == "postgresql":
                        index_pg.PG_INDEX.write_vector(db, doc_id=int(doc_id), scope=scope, model=MODEL,
                                                       digest=digest, vector=vec)
                    else:
                        index_sqlite.write_vector(db, doc_id=int(doc_id), scope=scope, model=MODEL, digest=digest,
                                                  vector=vec)
                    if start == 0 and k == 0 and store.engine == "postgresql":
                        # bulk load without the ANN index; it is built (and timed) after the load
                        db.execute("DROP INDEX IF EXISTS builtin_vec_hnsw")
                        db.execute("DROP INDEX IF EXISTS builtin_vec_ivfflat")

            await store.write(write)
            if (start // BATCH) % 50 == 49:
                print(f"    ... {start + len(chunk)} episodes, {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        store.close()
    return doc_ids, time.perf_counter() - t


async def bulk_build(path: Path, items: list[dict[str, Any]], vectors: np.ndarray) -> tuple[np.ndarray, float]:
    """`--bulk` (SQLite): the rows `build` writes — the daemon's (runs, run_records, episodes,
    episode_bodies, memory_index), the provider's documents (`index_sqlite.insert_doc`, FTS5 by its
    triggers) and vectors (int8 by `index.quantize`'s formula, vectorised) with their cache rows —
    written in transactions of 20,000 episodes, without the per-row look-ups of the product's write path
    (1M episodes through it would take hours here). Every scope is one cell; the service's back-fill
    divides the large ones at its start (timed by `measure`)."""
    from memactors.store.run_history import record_json
    from memactors.store.sqlite import _connect

    (await open_store(path)).close()  # the schema, by the store's migrations
    t = time.perf_counter()
    db = _connect(path)
    dim = vectors.shape[1]
    index_sqlite.ensure_vec_table(db, MODEL, dim)
    nums: dict[str, int] = {}
    seqs: dict[str, int] = {}
    doc_ids = np.zeros(len(items), dtype=np.int64)
    now = "2026-11-30T00:00:00.000000Z"
    step = 20_000
    for start in range(0, len(items), step):
        chunk = items[start:start + step]
        block = vectors[start:start + step]
        peak = np.abs(block).max(axis=1, keepdims=True)
        peak[peak == 0] = 1.0
        q8 = np.round(block * 127.0 / peak).astype(np.int8)
        db.execute("BEGIN")
        runs, records, bodies, episodes, index_rows, vec_rows, cache_rows = [], [], [], [], [], [], []
        for k, it in enumerate(chunk):
            i = start + k
            z, harness, run_id, started = it["z"], it["harness"], it["run_id"], it["started"]
            eid = builtin_episode_id(it)
            scope = scope_for(store_engines.repo(z))
            if scope not in nums:
                nums[scope] = len(nums) + 1
                seqs[scope] = 1
                db.execute("INSERT INTO builtin_scopes (scope, num, next_seq) VALUES (?, ?, 1)", [scope, nums[scope]])
            doc_id = (nums[scope] << 32) | seqs[scope]
            seqs[scope] += 1
            doc_ids[i] = doc_id
            episode = {"episode_id": eid, "harness": harness, "adapter": "claude-code", "run_id": run_id,
                       "trace_id": f"t{run_id}", "model": "bench-model", "repo": store_engines.repo(z),
                       "branch": "main", "outcome": it["outcome"], "reason": "completed", "started_at": started,
                       "duration_ms": 60000, "cost_usd": None, "cost_source": "unknown", "files_touched": it["files"],
                       "pull_request": None, "verify_failures": [], "result_excerpt": it["body"], "summary": None,
                       "trust_class": "standard", "scope": scope}
            text = "".join(f"{k2}: {', '.join(v) if isinstance(v, list) else (v or '')}\n" for k2, v in episode.items())
            records.append((i + 1, record_json({"harness": harness, "run_id": run_id})))
            runs.append((harness, run_id, "claude-code", started, started, it["outcome"], "completed", 60000,
                         store_engines.repo(z), "main", i + 1, now))
            bodies.append((i + 1, json.dumps(episode, ensure_ascii=False)))
            episodes.append((eid, harness, run_id, store_engines.repo(z), "main", scope, "standard", it["outcome"],
                             started, now, i + 1))
            index_rows.append((eid, eid, scope, now))
            fields = builtin.record_fields(text, "", it["files"], episode)
            index_sqlite.insert_doc(db, doc_id=doc_id, episode_id=eid, scope=scope, fields=fields, started_at=started,
                                    digest=builtin.content_hash(text, ""))
            digest = builtin.text_digest(builtin.embedding_text(fields.summary or "", fields.excerpt or "",
                                                                [list(f) for f in fields.failures]))
            vec_rows.append((doc_id, scope, q8[k].tobytes()))
            cache_rows.append((digest, MODEL, dim, doc_id))
        conn = db.conn
        conn.executemany("INSERT INTO run_records (id, record) VALUES (?, ?)", records)
        conn.executemany("INSERT INTO runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
                         " repo, branch, record_id, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", runs)
        conn.executemany("INSERT INTO episode_bodies (id, body) VALUES (?, ?)", bodies)
        conn.executemany("INSERT INTO episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
                         " started_at, recorded_at, body_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)", episodes)
        conn.executemany("INSERT INTO memory_index (provider, provider_id, episode_id, scope, recorded_at)"
                         " VALUES ('builtin', ?, ?, ?, ?)", index_rows)
        conn.executemany("INSERT INTO builtin_vec (doc_id, scope, cell, embedding) VALUES (?, ?, 0, ?)",
                         vec_rows)
        conn.executemany("INSERT OR REPLACE INTO builtin_embed_cache (content_hash, model, dim, vector, doc_id)"
                         " VALUES (?, ?, ?, X'', ?)", cache_rows)
        for scope, seq in seqs.items():
            db.execute("UPDATE builtin_scopes SET next_seq = ? WHERE scope = ?", [seq, scope])
        db.execute("COMMIT")
        if (start // step) % 5 == 4:
            print(f"    ... {start + len(chunk)} episodes, {time.perf_counter() - t:.0f} s", flush=True)
    # the cache rows are written by doc id, as `index_sqlite.cache_once` leaves them: its mark, so the
    # service's first start does not walk 1M documents to make them again
    db.execute("INSERT OR REPLACE INTO builtin_meta (key, value) VALUES ('cache_form', 'by_doc')")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.conn.close()
    return doc_ids, time.perf_counter() - t


def _pg_episode(it: dict[str, Any], eid: str, scope: str) -> dict[str, Any]:
    """The REQ-5 episode object `pg_bulk_build` stores for a corpus item (as `store_engines._write_batch`)."""
    return {"episode_id": eid, "harness": it["harness"], "adapter": "claude-code", "run_id": it["run_id"],
            "trace_id": f"t{it['run_id']}", "model": "bench-model", "repo": store_engines.repo(it["z"]),
            "branch": "main", "outcome": it["outcome"], "reason": "completed", "started_at": it["started"],
            "duration_ms": 60000, "cost_usd": None, "cost_source": "unknown", "files_touched": it["files"],
            "pull_request": None, "verify_failures": [], "result_excerpt": it["body"], "summary": None,
            "trust_class": "standard", "scope": scope}


def halfvec_binary(block: np.ndarray) -> list[bytes]:
    """Each row of `block` in pgvector's binary `halfvec` form (int16 dimension, int16 zero, then the
    values as big-endian float16), for a binary COPY: no text literal parsed a vector."""
    n, dim = block.shape
    out = np.zeros((n, dim + 2), dtype=">f2")
    raw = out.view(">i2")
    raw[:, 0] = dim
    out[:, 2:] = block.astype(np.float16)
    return [row.tobytes() for row in out]


async def pg_bulk_build(url: str, items: list[dict[str, Any]], vectors: np.ndarray) -> tuple[np.ndarray, float]:
    """`--bulk` on PostgreSQL: the rows `build` writes — the daemon's (runs, run_records, episodes,
    episode_bodies, memory_index), the provider's documents (`builtin_docs`, its `tsv` generated by the
    server from the same fields `write_doc` stores) and vectors (`builtin_vec` halfvec, made by the
    provider's own `ensure_vec_table`, with the embedding cache's rows pointing at them) — by COPY, in
    transactions of 20,000 episodes, the vectors in binary. The GIN index of `tsv` and the (scope, cell)
    b-tree are dropped for the load and built after it (as the migrations define them). Every scope is
    one cell; the service's back-fill divides the large ones at its start (timed by `measure`)."""
    import psycopg

    from memactors.store.pg import PgDb
    from memactors.store.run_history import record_json

    (await open_store(url)).close()  # the schema, by the store's migrations
    t = time.perf_counter()
    doc_ids = np.arange(1, len(items) + 1, dtype=np.int64)
    now = "2026-11-30T00:00:00.000000Z"
    step = 20_000
    with psycopg.connect(url) as conn:
        db = PgDb(conn)
        index_pg.ensure_vec_table(db, MODEL, vectors.shape[1])
        conn.execute("DROP INDEX builtin_docs_tsv")
        conn.execute("DROP INDEX builtin_vec_by_cell")
        conn.execute("INSERT INTO builtin_meta (key, value) VALUES ('cache_form', 'by_doc') ON CONFLICT (key) DO NOTHING")
        conn.commit()
        seen: set[str] = set()  # the embedding texts cached: the first document of a text holds the pointer
        for start in range(0, len(items), step):
            chunk = items[start:start + step]
            blobs = halfvec_binary(vectors[start:start + step])
            cur = conn.cursor()
            with cur.copy("COPY run_records (id, record) FROM STDIN") as records:  # one COPY at a time
                for k, it in enumerate(chunk):
                    records.write_row((start + k + 1, record_json({"harness": it["harness"], "run_id": it["run_id"]})))
            with cur.copy("COPY runs (harness, run_id, adapter, started_at, ended_at, outcome, reason, duration_ms,"
                          " repo, branch, record_id, ingested_at) FROM STDIN") as runs:
                for k, it in enumerate(chunk):
                    i = start + k + 1
                    runs.write_row((it["harness"], it["run_id"], "claude-code", it["started"], it["started"], it["outcome"],
                                    "completed", 60000, store_engines.repo(it["z"]), "main", i, now))
            docs, caches = [], []
            with cur.copy("COPY episode_bodies (id, body) FROM STDIN") as bodies:
                for k, it in enumerate(chunk):
                    i = start + k + 1
                    eid = builtin_episode_id(it)
                    scope = scope_for(store_engines.repo(it["z"]))
                    episode = _pg_episode(it, eid, scope)
                    text = "".join(f"{k2}: {', '.join(v) if isinstance(v, list) else (v or '')}\n"
                                   for k2, v in episode.items())
                    bodies.write_row((i, json.dumps(episode, ensure_ascii=False)))
                    f = builtin.record_fields(text, "", it["files"], episode)
                    docs.append((i, eid, scope, f.title, f.excerpt, f.summary, json.dumps(list(f.files), ensure_ascii=False),
                                 list(dict.fromkeys(f.files)), json.dumps([list(x) for x in f.failures], ensure_ascii=False),
                                 f.meta, f.harness, f.branch, f.outcome, it["started"], builtin.content_hash(text, "")))
                    caches.append((builtin.text_digest(builtin.embedding_text(f.summary or "", f.excerpt or "",
                                                                              [list(x) for x in f.failures])), i))
            with cur.copy("COPY episodes (episode_id, harness, run_id, repo, branch, scope, trust_class, outcome,"
                          " started_at, recorded_at, body_id) FROM STDIN") as episodes:
                for d, it in zip(docs, chunk, strict=True):
                    episodes.write_row((d[1], it["harness"], it["run_id"], store_engines.repo(it["z"]), "main", d[2],
                                        "standard", it["outcome"], it["started"], now, d[0]))
            with cur.copy("COPY memory_index (provider, provider_id, episode_id, scope, recorded_at) FROM STDIN") as index:
                for d in docs:
                    index.write_row(("builtin", d[1], d[1], d[2], now))
            with cur.copy("COPY builtin_docs (doc_id, episode_id, scope, title, excerpt, summary, files, paths, failures,"
                          " meta, harness, branch, outcome, started_at, content_hash) FROM STDIN") as copy:
                for d in docs:
                    copy.write_row(d)
            with cur.copy("COPY builtin_vec (doc_id, scope, cell, embedding) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int8", "text", "int4", "bytea"])  # bytea: the halfvec's own binary form, as is
                for d, blob in zip(docs, blobs, strict=True):
                    copy.write_row((d[0], d[2], 0, blob))
            with cur.copy("COPY builtin_embed_cache (content_hash, model, dim, vector, doc_id) FROM STDIN") as copy:
                for digest, doc_id in caches:
                    if digest not in seen:
                        seen.add(digest)
                        copy.write_row((digest, MODEL, vectors.shape[1], b"", doc_id))
            conn.commit()
            if (start // step) % 5 == 4:
                print(f"    ... {start + len(chunk)} episodes, {time.perf_counter() - t:.0f} s", flush=True)
        for table, column in (("builtin_docs", "doc_id"), ("run_records", "id"), ("episode_bodies", "id")):
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), %s)", [len(items)])
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("CREATE INDEX builtin_docs_tsv ON builtin_docs USING gin (tsv)")
        conn.execute("CREATE INDEX builtin_vec_by_cell ON builtin_vec (scope, cell)")
        conn.commit()
    return doc_ids, time.perf_counter() - t


def text_tag(args: argparse.Namespace) -> str:
    """The kept corpus's and store's name part for the text mode (none for the template text)."""
    return "" if args.text == "template" else f"{args.text}-"


TEXT_SAYS = {"template": "synthetic text: a template vocabulary of ~200 words, every query word common",
             "commits": "text of words drawn with their frequencies in the commit messages of "
                        + ", ".join(COMMIT_SOURCES) + " (~11k distinct words), real paths"}


def builtin_episode_id(it: dict[str, Any]) -> str:
    from memactors.episode import episode_id_for
    return episode_id_for(it["harness"], it["run_id"], it["started"])


# -- measuring ---------------------------------------------------------------------------------------

def exact_top(vectors: np.ndarray, rows: np.ndarray, doc_ids: np.ndarray, q: np.ndarray) -> list[int]:
    sims = vectors[rows] @ q
    top = np.argsort(-sims)[:LIMIT]
    return [int(doc_ids[rows[i]]) for i in top]


def stats(v: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(v) * 1000, 2), "p99_ms": round(pct(v, 99) * 1000, 2)}


class SqliteRaw:
    def __init__(self, path: Path) -> None:
        from memactors.store.sqlite import _connect
        self.db = _connect(path)
        self.nums = dict(self.db.execute("SELECT scope, num FROM builtin_scopes").fetchall())

    def text(self, q: str, scope: str) -> list[Any]:
        from user_paths import anchor_sql
        sql, params = anchor_sql("and+tok", builtin.query_words(q), scope, self.nums.get(scope, 0))
        return list(self.db.execute(sql, params).fetchall())

    def text_in_range(self, q: str, scope: str) -> list[Any]:
        """The fastest raw form: the words AND-ed (no scope token, no column filter) within the scope's
        doc-id range, `ORDER BY rank LIMIT 8`."""
        from memactors.store import scope_range
        low, high = scope_range(self.nums.get(scope, 0))
        return list(self.db.execute(
            "SELECT rowid FROM builtin_fts WHERE builtin_fts MATCH ? AND rowid BETWEEN ? AND ? ORDER BY rank LIMIT 8",
            [" AND ".join(f'"{w}"' for w in builtin.query_words(q)), low, high]).fetchall())

    def knn(self, vec: np.ndarray, scope: str, probes: int | None = None) -> list[int]:
        return [d for _, d in index_sqlite.vec_candidates(self.db, vec.tolist(), scope, LIMIT, probes)]

    def divided(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT scope FROM builtin_vec_divisions").fetchall()}

    def close(self) -> None:
        self.db.conn.close()


class PgRaw:
    def __init__(self, url: str) -> None:
        import psycopg

        from memactors.store.pg import PgDb
        self.conn = psycopg.connect(url, autocommit=True)
        self.db = PgDb(self.conn)
        self.index = index_pg.VEC_INDEX

    def text(self, q: str, scope: str) -> list[Any]:
        expression = index_pg.tsquery(builtin.search_words(q), "&")
        return list(self.conn.execute(
            "SELECT d.episode_id FROM builtin_docs d, to_tsquery('english', %s) q WHERE d.scope = ANY(%s)"
            f" AND d.tsv @@ q ORDER BY ts_rank_cd('{index_pg.RANK_WEIGHTS}', d.tsv, q, 1) DESC, d.started_at DESC,"
            f" d.episode_id LIMIT {LIMIT}", [expression, [scope]]).fetchall())

    def knn(self, vec: np.ndarray, scope: str, probes: int | None = None) -> list[int]:
        if self.index == index_pg.VEC_INDEX:
            return [int(r[1]) for r in index_pg.knn_rows(self.db, vec.tolist(), [scope], LIMIT, probes)]
        with self.conn.transaction():
            for setting in index_pg.knn_settings(self.index):
                self.conn.execute(setting)
            return [int(r[0]) for r in self.conn.execute(
                f"SELECT doc_id FROM builtin_vec WHERE scope = ANY(%s) ORDER BY embedding <=> %s::halfvec LIMIT {LIMIT}",
                [[scope], index_pg._literal(vec.tolist())]).fetchall()]

    def divided(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT scope FROM builtin_vec_divisions").fetchall()}

    def close(self) -> None:
        self.conn.close()


@asynccontextmanager
async def logged_service(root: Path, holder: ConfigHolder) -> AsyncIterator[tuple[Any, float]]:
    """The in-process service on `holder`'s store, its log in root/bench.log; yields it and the
    seconds its start took (a store made before is converted at start)."""
    log = (root / "bench.log").open("a", encoding="utf-8")
    configure_logging("INFO", sink=log)
    try:
        t = time.perf_counter()
        async with open_memory_service(holder) as svc:
            yield svc, time.perf_counter() - t
    finally:
        logger.remove()
        log.close()


async def measure(root: Path, state: Path, url: str | None, raw: Any, queries: list[tuple[int, str]],
                  vectors: np.ndarray, doc_ids: np.ndarray, zs: np.ndarray, service: bool = True) -> dict[str, Any]:
    holder = ConfigHolder(lambda: load_config(config_for(root, state, url), env={"HOME": str(root)}))
    times: dict[str, list[float]] = {k: [] for k in ("recall", "text", "knn", "exact", "embed")}
    recall_at: list[float] = []
    exact_at: list[float] = []
    # this process's CPU: a quiet machine's wall (the recall's: every thread of the in-process service)
    cpu: dict[str, list[float]] = {"recall": [], "knn": [], "exact": []}
    exact = service  # the exact scan once, beside the provider's own knn
    model = shared_model()
    rows_of = {z: np.flatnonzero(zs == z) for z in set(z for z, _ in queries)}
    async with logged_service(root, holder) as (svc, opened):
        t = time.perf_counter()
        await svc.builtin.wait_embedded()  # the first back-fill pass: the large scopes divided
        print(f"    service start {opened:.0f} s (a store made before is converted), first back-fill pass"
              f" (cells) {time.perf_counter() - t:.0f} s", flush=True)
        status = await svc.builtin.vector_status()
        if status["pending"]:
            raise SystemExit(f"vectors missing: {status}")
        divided = raw.divided()
        big: dict[str, list[float]] = {"knn": [], "exact": [], "knn cpu": [], "exact cpu": [], "recall@8": [],
                                       "exact recall@8": [], "recall": []}
        for z, q in queries[:5]:  # warm-up: the model loads
            await svc.recall(query=f"warm {q}", repo=store_engines.repo(z), limit=LIMIT)
        for z, q in queries[5:]:
            scope = scope_for(store_engines.repo(z))
            if service:
                t, c = time.perf_counter(), time.process_time()
                await svc.recall(query=q, repo=store_engines.repo(z), limit=LIMIT)
                times["recall"].append(time.perf_counter() - t)
                cpu["recall"].append(time.process_time() - c)
            t = time.perf_counter()
            raw.text(q, scope)
            times["text"].append(time.perf_counter() - t)
            t = time.perf_counter()
            vec = np.asarray(model.encode([q])[0], dtype=np.float32)
            times["embed"].append(time.perf_counter() - t)
            t, c = time.perf_counter(), time.process_time()
            got = raw.knn(vec, scope)
            times["knn"].append(time.perf_counter() - t)
            cpu["knn"].append(time.process_time() - c)
            want = exact_top(vectors, rows_of[z], doc_ids, vec)
            recall_at.append(len(set(got) & set(want)) / max(len(want), 1))
            if exact:
                t, c = time.perf_counter(), time.process_time()
                every = raw.knn(vec, scope, 1 << 30)
                times["exact"].append(time.perf_counter() - t)
                cpu["exact"].append(time.process_time() - c)
                exact_at.append(len(set(every) & set(want)) / max(len(want), 1))
                if scope in divided:  # the queries the cells answer, apart
                    for key, value in (("knn", times["knn"][-1]), ("exact", times["exact"][-1]),
                                       ("knn cpu", cpu["knn"][-1]), ("exact cpu", cpu["exact"][-1]),
                                       ("recall@8", recall_at[-1]), ("exact recall@8", exact_at[-1]),
                                       ("recall", times["recall"][-1] if service else 0.0)):
                        big[key].append(value)
    out: dict[str, Any] = {k: stats(v) for k, v in times.items() if v}
    out["recall@8"] = round(statistics.mean(recall_at), 4)
    out["cpu"] = {k: round(statistics.median(v) * 1000, 2) for k, v in cpu.items() if v}
    if big["knn"]:
        out["divided"] = {"queries": len(big["knn"]), "scopes": len(divided),
                          **{k: round(statistics.median(v) * (1 if "recall@8" in k else 1000), 4 if "recall@8" in k else 2)
                             for k, v in big.items() if "recall@8" not in k},
                          **{k: round(statistics.mean(v), 4) for k, v in big.items() if "recall@8" in k}}
    if exact_at:
        out["exact recall@8"] = round(statistics.mean(exact_at), 4)
    if service:
        parts = out["text"]["p50_ms"] + out["knn"]["p50_ms"] + out["embed"]["p50_ms"]
        out["x_parts"] = round(out["recall"]["p50_ms"] / parts, 2)
    return out


def pg_steps(raw: PgRaw, queries: list[tuple[int, str]]) -> None:
    """PostgreSQL: the provider's own reads of one hybrid recall, each timed alone on the same queries
    (`index_pg`: the metadata-only probe, the text ranking, the cosine ranking, the evidence the score is
    made of), so a recall's cost above its parts can be placed."""
    from memactors.builtin.ranking import FUSE_DEPTH

    model = shared_model()
    times: dict[str, list[float]] = {k: [] for k in ("metadata_only", "text_candidates", "knn", "evidence",
                                                     "knn rows in SQL", "exact rows in SQL")}
    probed = "unnest(%s::text[], %s::int[]) c (scope, cell) JOIN builtin_vec v ON v.scope = c.scope AND v.cell = c.cell"
    for z, q in queries[5:]:
        scopes = [scope_for(store_engines.repo(z))]
        words = builtin.search_words(q)
        vec = [float(x) for x in model.encode([q])[0]]
        t = time.perf_counter()
        index_pg.metadata_only(raw.db, words, scopes)
        times["metadata_only"].append(time.perf_counter() - t)
        t = time.perf_counter()
        text = index_pg.text_candidates(raw.db, words, scopes, LIMIT, FUSE_DEPTH)
        times["text_candidates"].append(time.perf_counter() - t)
        t = time.perf_counter()
        cosine = index_pg.knn(raw.db, vec, scopes)
        times["knn"].append(time.perf_counter() - t)
        t = time.perf_counter()
        index_pg.evidence(raw.db, words, scopes, [h.doc_id for h in [*text, *cosine[:FUSE_DEPTH]]], vectors=True)
        times["evidence"].append(time.perf_counter() - t)
        # the anchors: the same cells' vectors a row each, the distance in SQL (the form before the packs),
        # and pgvector's exact scan of the scope's rows
        literal = index_pg._literal(vec)
        t = time.perf_counter()
        cells = index_pg.probe_cells(raw.db, literal, scopes)
        raw.conn.execute(f"SELECT v.doc_id FROM {probed} ORDER BY v.embedding::vector <=> %s::vector LIMIT {LIMIT}",
                         [[c[0] for c in cells], [c[1] for c in cells], literal]).fetchall()
        times["knn rows in SQL"].append(time.perf_counter() - t)
        t = time.perf_counter()
        raw.conn.execute(f"SELECT doc_id FROM builtin_vec WHERE scope = %s ORDER BY embedding::vector <=> %s::vector"
                         f" LIMIT {LIMIT}", [scopes[0], literal]).fetchall()
        times["exact rows in SQL"].append(time.perf_counter() - t)
    print("    the provider's reads alone (index_pg, p50 / p99 ms): "
          + ", ".join(f"{k} {stats(v)['p50_ms']} / {stats(v)['p99_ms']}" for k, v in times.items()), flush=True)


async def measure_bm25_only(root: Path, state: Path, raw: Any, queries: list[tuple[int, str]]) -> dict[str, Any]:
    """SQLite: the same queries through a service started with `[memory] embeddings = false` (BM25
    only), each beside the raw FTS5 anchor (`raw.text`: the scope's token AND the words over the whole
    table) and its fastest raw form (`raw.text_in_range`) in this run; the target is recall ≤ 2 × the
    anchor. Also times this (second, warm) start of the service on the store."""
    config = config_for(root, state, None, "[memory]\nembeddings = false\n")
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(root)}))
    times: dict[str, list[float]] = {"recall": [], "text": [], "text in range": []}
    cpu: dict[str, list[float]] = {k: [] for k in times}  # this process's (the service is in it)
    async with logged_service(root, holder) as (svc, opened):
        for z, q in queries[:5]:
            await svc.recall(query=f"warm {q}", repo=store_engines.repo(z), limit=LIMIT)
        for z, q in queries[5:]:
            t, c = time.perf_counter(), time.process_time()
            await svc.recall(query=q, repo=store_engines.repo(z), limit=LIMIT)
            times["recall"].append(time.perf_counter() - t)
            cpu["recall"].append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            raw.text(q, scope_for(store_engines.repo(z)))
            times["text"].append(time.perf_counter() - t)
            cpu["text"].append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            raw.text_in_range(q, scope_for(store_engines.repo(z)))
            times["text in range"].append(time.perf_counter() - t)
            cpu["text in range"].append(time.process_time() - c)
    out: dict[str, Any] = {k: stats(v) for k, v in times.items()}
    out["x_text"] = round(out["recall"]["p50_ms"] / out["text"]["p50_ms"], 2)
    out["x_range"] = round(out["recall"]["p50_ms"] / out["text in range"]["p50_ms"], 2)
    out["start_s"] = round(opened, 1)
    out["cpu"] = {k: round(statistics.median(v) * 1000, 2) for k, v in cpu.items()}
    return out


def show(label: str, r: dict[str, Any]) -> None:
    parts = "   ".join(f"{k} p50 {r[k]['p50_ms']} / p99 {r[k]['p99_ms']} ms"
                       for k in ("recall", "text", "knn", "exact", "embed") if k in r)
    extra = f"   {r['x_parts']}x parts" if "x_parts" in r else ""
    exact = f" (exact scan {r['exact recall@8']})" if "exact recall@8" in r else ""
    print(f"    {label:<22} {parts}   knn recall@8 {r['recall@8']}{exact}{extra}", flush=True)
    if r.get("cpu"):
        print("    CPU p50 (this process): " + ", ".join(f"{k} {v} ms" for k, v in r["cpu"].items()), flush=True)
    if r.get("divided"):
        print("    queries in the divided scopes (p50 ms; recall@8 means): "
              + ", ".join(f"{k} {v}" for k, v in r["divided"].items()), flush=True)


async def run_engine(engine: str, size: int, args: argparse.Namespace, root: Path, cluster: Cluster | None,
                     items: list[dict[str, Any]], vectors: np.ndarray, queries: list[tuple[int, str]]) -> None:
    zs = np.fromiter((it["z"] for it in items), dtype=np.int32, count=len(items))
    state = root / f"{engine}-{text_tag(args)}{size}"
    state.mkdir(parents=True, exist_ok=True)
    url = cluster.create_database(f"scale_{size}") if cluster is not None else None
    if cluster is not None:
        cluster.admin("CREATE EXTENSION vector", dbname=f"scale_{size}")
    target: Path | str = url or state / "memactors.db"
    saved = state / "doc_ids.npy"
    if cluster is None and saved.exists():  # a kept SQLite store: measured again as it is (upgraded at start)
        doc_ids = np.load(saved)
        print(f"  {engine} {size} episodes: the kept store in {state}", flush=True)
    else:
        if args.bulk and cluster is None:
            doc_ids, built = await bulk_build(state / "memactors.db", items, vectors)
        elif args.bulk and url is not None:
            doc_ids, built = await pg_bulk_build(url, items, vectors)
        else:
            doc_ids, built = await build(target, items, vectors)
        print(f"  {engine} {size} episodes: built in {built:.0f} s ({size / built:.0f} episodes/s with vectors"
              f"{', bulk rows' if args.bulk else ''})", flush=True)
        if cluster is None:
            np.save(saved, doc_ids)
        if args.build_only:
            return
    if cluster is None:
        size_b = (state / "memactors.db").stat().st_size
        print(f"    store file {size_b / size:.0f} B/episode", flush=True)
        raw = SqliteRaw(state / "memactors.db")
        try:
            t = time.perf_counter()
            res = await measure(root, state, None, raw, queries, vectors, doc_ids, zs)
            print(f"    (the service's start and the measurement took {time.perf_counter() - t:.0f} s)", flush=True)
            show(f"sqlite ({index_sqlite.VEC_FORM})", res)
            raw.close()  # the store closed, as between two starts (a second start beside it failed at 1M)
            raw = SqliteRaw(state / "memactors.db")
            bm25 = await measure_bm25_only(root, state, raw, queries)
            print(f"    sqlite, BM25 only: recall p50 {bm25['recall']['p50_ms']} / p99 {bm25['recall']['p99_ms']} ms"
                  f"   text p50 {bm25['text']['p50_ms']} / p99 {bm25['text']['p99_ms']} ms   {bm25['x_text']}x text"
                  f"   text in range p50 {bm25['text in range']['p50_ms']} ms   {bm25['x_range']}x that"
                  f"   (its service's start, warm: {bm25['start_s']} s)", flush=True)
            print("    CPU p50 (this process), BM25 only: " + ", ".join(f"{k} {v} ms" for k, v in bm25["cpu"].items()),
                  flush=True)
        finally:
            raw.close()
        return
    assert url is not None
    dbname = f"scale_{size}"
    await trio.to_thread.run_sync(cluster.admin, "VACUUM ANALYZE", dbname)
    raw = PgRaw(cluster.url(dbname))
    raw.conn.execute("SET maintenance_work_mem = '1GB'")
    try:
        res = await measure(root, state, url, raw, queries, vectors, doc_ids, zs)  # the provider's cells
        show(f"postgresql ({index_pg.VEC_FORM}, {index_pg.VEC_INDEX})", res)
        pg_steps(raw, queries)
        for kind in args.pg_index:
            for other in ("hnsw", "ivfflat"):
                raw.conn.execute(f"DROP INDEX IF EXISTS builtin_vec_{other}")
            t = time.perf_counter()
            for statement in index_pg.index_sql(kind, size):
                raw.conn.execute(statement)
            print(f"    {kind} index built in {time.perf_counter() - t:.0f} s", flush=True)
            raw.index = kind
            bytes_ = raw.conn.execute(f"SELECT pg_relation_size('builtin_vec_{kind}')").fetchone()[0]
            print(f"    {kind} index {bytes_ / size:.0f} B/episode", flush=True)
            # pgvector's own index: its knn alone (the provider searches the cells)
            res = await measure(root, state, url, raw, queries, vectors, doc_ids, zs, service=False)
            show(f"postgresql ({kind})", res)
    finally:
        raw.close()


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="memactors-scale-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        model = shared_model()
        print(f"the episodes' text: {TEXT_SAYS[args.text]}", flush=True)
        for size in args.sizes:
            t = time.perf_counter()
            # what a kept store is measured with
            kept = root / f"corpus-{text_tag(args)}{size}-{args.repos}-{args.real}.npz"
            stores = [root / f"{engine}-{text_tag(args)}{size}" / "doc_ids.npy" for engine in args.engines]
            if kept.exists() and all(s.exists() for s in stores) and not args.build_only:
                with np.load(kept) as saved:
                    vectors, zs = saved["vectors"], saved["zs"]
                items = [{"z": int(z)} for z in zs]  # enough for a kept store: its repository
                queries = [(int(z), str(q)) for z, q in json.loads(kept.with_suffix(".json").read_text())]
                print(f"{size} episodes: the kept corpus {kept.name} (the biggest repository {np.bincount(zs).max()})",
                      flush=True)
            else:
                items = (commits_corpus(size, args.repos, args.mirrors) if args.text == "commits"
                         else corpus(size, args.repos))
                k = min(args.real, size)
                texts = [builtin.embedding_text("", it["body"], []) for it in items[:k]]
                real = np.asarray(model.encode(texts), dtype=np.float32)
                vectors = derive_vectors(real, size)
                zs = np.fromiter((it["z"] for it in items), dtype=np.int32, count=len(items))
                print(f"{size} episodes over {args.repos} repositories (the biggest {np.bincount(zs).max()}); {k} real"
                      f" embeddings, {size - k} derived; made in {time.perf_counter() - t:.0f} s", flush=True)
                queries = make_queries(items, args.queries + 5)
                if args.keep:
                    np.savez(kept, vectors=vectors, zs=zs)
                    kept.with_suffix(".json").write_text(json.dumps(queries))
            for engine in args.engines:
                if engine == "postgresql":
                    with Cluster(pgvector=True, extra=("shared_buffers = 1GB", "synchronous_commit = off",
                                                       "max_parallel_maintenance_workers = 1")) as cluster:
                        await run_engine(engine, size, args, root, cluster, items, vectors, queries)
                else:
                    await run_engine(engine, size, args, root, None, items, vectors, queries)
            print(machine(), flush=True)


def partition(n: int, queries: int, real_n: int) -> None:
    """`--partition N`: the vector search alone over one repository of N episodes (1M episodes put ~170k
    in the biggest of 200 Zipf-skewed repositories), in three forms side by side: vec0 float32 (exact),
    vec0 int8 (the provider's form), and a binary (1 bit a dimension) vec0 pre-filter of the best 10 x 8
    re-ranked by int8 cosine. The query vectors are the model's on real query texts; recall@8 against
    numpy's exact cosine over the float32 vectors."""
    from memactors.store.sqlite import _connect

    model = shared_model()
    items = corpus(max(real_n, 2000), 1)
    real = np.asarray(model.encode([it["body"] for it in items[:real_n]]), dtype=np.float32)
    vectors = derive_vectors(real, n)
    qs = [q for _, q in make_queries(items, queries)]
    qvecs = np.asarray(model.encode(qs), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="memactors-partition-") as tmp:
        db = _connect(Path(tmp) / "p.db")
        dim = vectors.shape[1]
        forms = {"float32": ("float", "?", lambda v: v.astype(np.float32).tobytes()),
                 "int8": ("int8", "vec_int8(?)", lambda v: quantize(v.tolist())),
                 "binary": ("bit", "vec_bit(?)", lambda v: np.packbits(v > 0, bitorder="little").tobytes())}
        t0 = time.perf_counter()
        for form, (kind, wrap, enc) in forms.items():
            metric = "" if kind == "bit" else " distance_metric=cosine"
            db.execute(f"CREATE VIRTUAL TABLE v_{form} USING vec0(doc_id INTEGER PRIMARY KEY, scope TEXT PARTITION KEY,"
                       f" embedding {kind}[{dim}]{metric}, chunk_size=128)")  # vec0 as the provider had it
            db.execute("BEGIN")
            for i, v in enumerate(vectors):
                db.execute(f"INSERT INTO v_{form} (doc_id, scope, embedding) VALUES (?, 's', {wrap})", [i + 1, enc(v)])
            db.execute("COMMIT")
        print(f"one partition of {n} vectors ({real_n} real, the rest derived), three forms built in"
              f" {time.perf_counter() - t0:.0f} s", flush=True)
        times: dict[str, list[float]] = {"float32": [], "int8": [], "binary+rerank": []}
        cpu: dict[str, list[float]] = {k: [] for k in times}  # this process's CPU: what the wall is on a quiet machine
        hits: dict[str, list[float]] = {k: [] for k in times}
        for q in qvecs:
            want = set((np.argsort(-(vectors @ q))[:LIMIT] + 1).tolist())
            for form in ("float32", "int8"):
                kind, wrap, enc = forms[form]
                t, c = time.perf_counter(), time.process_time()
                got = [r[0] for r in db.execute(f"SELECT doc_id FROM v_{form} WHERE embedding MATCH {wrap} AND k = {LIMIT}"
                                                " AND scope = 's'", [enc(q)]).fetchall()]
                times[form].append(time.perf_counter() - t)
                cpu[form].append(time.process_time() - c)
                hits[form].append(len(want & set(got)) / LIMIT)
            t, c = time.perf_counter(), time.process_time()
            kind, wrap, enc = forms["binary"]
            pre = [r[0] for r in db.execute(f"SELECT doc_id FROM v_binary WHERE embedding MATCH {wrap} AND k = {10 * LIMIT}"
                                            " AND scope = 's'", [enc(q)]).fetchall()]
            marks = ",".join("?" * len(pre))
            got = [r[0] for r in db.execute(
                f"SELECT doc_id FROM v_int8 WHERE doc_id IN ({marks}) ORDER BY vec_distance_cosine(embedding, vec_int8(?))"
                f" LIMIT {LIMIT}", [*pre, forms["int8"][2](q)]).fetchall()]
            times["binary+rerank"].append(time.perf_counter() - t)
            cpu["binary+rerank"].append(time.process_time() - c)
            hits["binary+rerank"].append(len(want & set(got)) / LIMIT)
        # the provider's own table and cells (`builtin.vector_cells`): divided by its write_division,
        # searched by its vec_candidates (the nearest `vector_cells.probes`), and every cell read (exact)
        from importlib import resources

        from memactors.builtin import vector_cells
        db.conn.executescript(resources.files("memactors.store").joinpath("migrations/sqlite/0015_vector_cells.sql")
                              .read_text())
        db.execute("CREATE TABLE builtin_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("CREATE TABLE builtin_embed_cache (content_hash TEXT, model TEXT, dim INTEGER, vector BLOB,"
                   " doc_id INTEGER)")
        index_sqlite.ensure_vec_table(db, "m", dim)
        db.execute("BEGIN")
        db.conn.executemany("INSERT INTO builtin_vec (doc_id, scope, cell, embedding) SELECT doc_id, 's', 0, embedding"
                            " FROM v_int8 WHERE doc_id = ?", [(i + 1,) for i in range(n)])
        db.execute("COMMIT")
        t0 = time.perf_counter()
        ids, x = index_sqlite.scope_vectors(db, "s")
        division = vector_cells.divide("s", ids, x)
        db.execute("BEGIN")
        index_sqlite.write_division(db, division)
        db.execute("COMMIT")
        print(f"    cells: {len(division.centroids)} fitted and written in {time.perf_counter() - t0:.0f} s", flush=True)
        for label, probes in ((f"cells {vector_cells.probes(len(division.centroids))}", None), ("cells, all", 1 << 30)):
            times[label], cpu[label], hits[label] = [], [], []
            for q in qvecs:
                want = set((np.argsort(-(vectors @ q))[:LIMIT] + 1).tolist())
                t, c = time.perf_counter(), time.process_time()
                got = [d for _, d in index_sqlite.vec_candidates(db, q.tolist(), "s", LIMIT, probes)]
                times[label].append(time.perf_counter() - t)
                cpu[label].append(time.process_time() - c)
                hits[label].append(len(want & set(got)) / LIMIT)
        for form, v in times.items():
            r = stats(v)
            print(f"    {form:<14} knn p50 {r['p50_ms']} / p99 {r['p99_ms']} ms, CPU p50"
                  f" {statistics.median(cpu[form]) * 1000:.2f} ms   recall@8 {statistics.mean(hits[form]):.4f}", flush=True)
        db.conn.close()


def pg_partition(n: int, queries: int, real_n: int, kinds: list[str]) -> None:
    """`--partition N --engines postgresql`: pgvector over one repository of N vectors (halfvec, as the
    provider stores them): the provider's cells (`builtin.vector_cells`: divided and written by its own
    `index_pg.write_division`, searched by its `knn_rows`, beside the exact scan of every cell), then
    pgvector's store-wide HNSW and IVFFlat built and timed (`index_pg.index_sql`) with their knn (the
    settings bench/scale.py measured before, and a wider search). recall@8 against numpy's exact cosine
    over the float32 vectors. The vectors go in by COPY (not the provider's per-row write)."""
    from importlib import resources

    import psycopg

    from memactors.builtin import vector_cells
    from memactors.store.pg import PgDb

    model = shared_model()
    items = corpus(max(real_n, 2000), 1)
    real = np.asarray(model.encode([it["body"] for it in items[:real_n]]), dtype=np.float32)
    vectors = derive_vectors(real, n)
    qs = [q for _, q in make_queries(items, queries)]
    qvecs = np.asarray(model.encode(qs), dtype=np.float32)
    cells_sql = resources.files("memactors.store").joinpath("migrations/pg/0008_vector_cells.sql").read_text()
    with Cluster(pgvector=True, extra=("shared_buffers = 1GB", "max_parallel_maintenance_workers = 1")) as cluster:
        cluster.create_database("part")
        cluster.admin("CREATE EXTENSION vector", dbname="part")
        with psycopg.connect(cluster.url("part"), autocommit=True) as conn:
            db = PgDb(conn)
            conn.execute(cells_sql)
            conn.execute("CREATE TABLE builtin_docs (doc_id BIGINT PRIMARY KEY, episode_id TEXT, started_at TEXT)")
            conn.execute(f"CREATE TABLE builtin_vec (doc_id BIGINT PRIMARY KEY, scope TEXT COLLATE \"C\" NOT NULL,"
                         f" cell INTEGER NOT NULL DEFAULT 0, embedding halfvec({vectors.shape[1]}) NOT NULL)")
            conn.execute("CREATE INDEX builtin_vec_by_cell ON builtin_vec (scope, cell)")
            t = time.perf_counter()
            with conn.cursor().copy("COPY builtin_docs (doc_id, episode_id, started_at) FROM STDIN") as copy:
                for i in range(n):
                    copy.write_row((i + 1, f"ep_{i + 1}", "2026-11-28T09:00:00Z"))
            with conn.cursor().copy("COPY builtin_vec (doc_id, scope, embedding) FROM STDIN") as copy:
                for i, v in enumerate(vectors):
                    copy.write_row((i + 1, "s", "[" + ",".join(f"{x:.6f}" for x in v) + "]"))
            conn.execute("VACUUM ANALYZE builtin_vec")
            conn.execute("SET maintenance_work_mem = '1GB'")
            size = conn.execute("SELECT pg_total_relation_size('builtin_vec')").fetchone()[0]
            print(f"one partition of {n} vectors ({real_n} real, the rest derived) copied in"
                  f" {time.perf_counter() - t:.0f} s; builtin_vec (halfvec, with its b-tree) {size / n:.0f} B/vector",
                  flush=True)
            wants = [set((np.argsort(-(vectors @ q))[:LIMIT] + 1).tolist()) for q in qvecs]

            def run(label: str, knn: Any) -> None:
                times, cpu, hits = [], [], []
                for q, want in zip(qvecs, wants, strict=True):
                    t, c = time.perf_counter(), time.process_time()
                    got = knn(q)
                    times.append(time.perf_counter() - t)
                    cpu.append(time.process_time() - c)
                    hits.append(len(want & set(got)) / LIMIT)
                r = stats(times)
                print(f"    {label}: knn p50 {r['p50_ms']} / p99 {r['p99_ms']} ms (this process's CPU p50"
                      f" {statistics.median(cpu) * 1000:.2f} ms)   recall@8 {statistics.mean(hits):.4f}", flush=True)

            t = time.perf_counter()
            ids, x = index_pg.scope_vectors(db, "s")
            division = vector_cells.divide("s", ids, x)
            with conn.transaction():
                index_pg.write_division(db, division)
            conn.execute("ANALYZE builtin_vec")
            print(f"    cells: {len(division.centroids)} fitted and written in {time.perf_counter() - t:.0f} s", flush=True)
            run(f"cells, {vector_cells.probes(len(division.centroids))} probed (the provider's)",
                lambda q: [int(r[1]) for r in index_pg.knn_rows(db, q.tolist(), ["s"], LIMIT)])
            run("cells, every one read (exact scan)",
                lambda q: [int(r[1]) for r in index_pg.knn_rows(db, q.tolist(), ["s"], LIMIT, 1 << 30)])
            for kind in kinds:
                conn.execute("DROP INDEX IF EXISTS builtin_vec_hnsw")
                conn.execute("DROP INDEX IF EXISTS builtin_vec_ivfflat")
                t = time.perf_counter()
                for statement in index_pg.index_sql(kind, n):
                    conn.execute(statement)
                built = time.perf_counter() - t
                isize = conn.execute(f"SELECT pg_relation_size('builtin_vec_{kind}')").fetchone()[0]
                for extra in ("", "SET LOCAL hnsw.ef_search = 800" if kind == "hnsw" else "SET LOCAL ivfflat.probes = 40"):

                    def knn(q: np.ndarray, kind: str = kind, extra: str = extra) -> list[int]:
                        with conn.transaction():
                            for setting in [*index_pg.knn_settings(kind), *([extra] if extra else [])]:
                                conn.execute(setting)
                            return [int(r[0]) for r in conn.execute(
                                "SELECT doc_id FROM builtin_vec WHERE scope = ANY(%s) ORDER BY embedding <=> %s::halfvec"
                                f" LIMIT {LIMIT}", [["s"], index_pg._literal(q.tolist())]).fetchall()]

                    run(f"{kind} (built in {built:.0f} s, {isize / n:.0f} B/vector), {extra or 'settings as before'}", knn)
            conn.execute("DROP INDEX IF EXISTS builtin_vec_hnsw")
            conn.execute("DROP INDEX IF EXISTS builtin_vec_ivfflat")


def pg_probe_forms(n: int, cells: int, probes: int, queries: int) -> None:
    """`--pg-probe-forms N`: timing only (N random unit vectors in one scope, `cells` cells of which a knn
    reads `probes`, as the provider's cells read 104 of 664 at 170k): what a PostgreSQL knn over the
    probed cells costs in several forms — the provider's (scope, cell) b-tree and heap with the distance
    in SQL; a covering b-tree (index-only scan); the vectors sent to this process and scored in numpy;
    and **packed cells** (one row a cell: its doc ids and int8 vectors, read in binary and scored in
    numpy), the form the measurement points to. Random vectors: recall is not measured here."""
    import psycopg

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cell = rng.integers(0, cells, size=n)
    q8 = np.round(x * 127 / np.abs(x).max(axis=1, keepdims=True)).astype(np.int8)
    scope = "forge.example/acme/big"
    with Cluster(pgvector=True, extra=("shared_buffers = 1GB",)) as cluster:
        cluster.create_database("forms")
        cluster.admin("CREATE EXTENSION vector", dbname="forms")
        with psycopg.connect(cluster.url("forms"), autocommit=True) as conn:
            conn.execute('CREATE TABLE v (doc_id BIGINT PRIMARY KEY, scope TEXT COLLATE "C" NOT NULL, cell INT NOT NULL,'
                         " embedding halfvec(384) NOT NULL)")
            conn.execute('CREATE TABLE packs (scope TEXT COLLATE "C" NOT NULL, cell INT NOT NULL, doc_ids BIGINT[] NOT NULL,'
                         " vectors BYTEA NOT NULL, PRIMARY KEY (scope, cell))")
            conn.execute("ALTER TABLE packs ALTER COLUMN vectors SET STORAGE EXTERNAL")  # not compressed
            t = time.perf_counter()
            with conn.cursor().copy("COPY v (doc_id, scope, cell, embedding) FROM STDIN") as copy:
                for i in rng.permutation(n):  # in time order: a cell's rows spread over the heap
                    copy.write_row((int(i), scope, int(cell[i]), "[" + ",".join(f"{v:.5f}" for v in x[i]) + "]"))
            with conn.cursor().copy("COPY packs (scope, cell, doc_ids, vectors) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["text", "int4", "int8[]", "bytea"])
                for c in range(cells):
                    rows = np.flatnonzero(cell == c)
                    copy.write_row((scope, c, rows.tolist(), q8[rows].tobytes()))
            conn.execute("CREATE INDEX v_by_cell ON v (scope, cell)")
            conn.execute("VACUUM ANALYZE v")
            conn.execute("VACUUM ANALYZE packs")
            per = {t: conn.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0] / n for t in ("v", "packs")}
            print(f"{n} random vectors in {cells} cells copied in {time.perf_counter() - t:.0f} s; per vector: table and"
                  f" b-tree {per['v']:.0f} B, packs {per['packs']:.0f} B", flush=True)
            qs = rng.standard_normal((queries, 384)).astype(np.float32)
            picks = [rng.choice(cells, probes, replace=False).tolist() for _ in range(queries)]

            def in_sql(q: np.ndarray, p: list[int]) -> list[int]:
                return [int(r[0]) for r in conn.execute(
                    "SELECT v.doc_id, v.embedding::vector <=> %s::vector AS d FROM unnest(%s::text[], %s::int[]) c (scope, cell)"
                    " JOIN v ON v.scope = c.scope AND v.cell = c.cell ORDER BY d LIMIT 200",
                    [index_pg._literal(q.tolist()), [scope] * len(p), p]).fetchall()]

            def top(ids: np.ndarray, m: np.ndarray, q: np.ndarray) -> list[int]:
                sim = np.empty(len(ids), dtype=np.float32)
                for i in range(0, len(ids), 2048):
                    r = m[i:i + 2048].astype(np.float32)
                    sim[i:i + 2048] = np.einsum("ij,j->i", r, q) / np.sqrt(np.einsum("ij,ij->i", r, r))
                return [int(ids[i]) for i in np.argsort(-sim)[:200]]

            def sent(q: np.ndarray, p: list[int]) -> list[int]:
                blob, ids = conn.cursor(binary=True).execute(
                    "SELECT string_agg(halfvec_send(embedding), ''::bytea), array_agg(doc_id) FROM v"
                    " WHERE scope = %s AND cell = ANY(%s)", [scope, p]).fetchone()
                m = np.frombuffer(blob, dtype=">f2").reshape(len(ids), -1)[:, 2:]  # a 4-byte header a vector
                return top(np.asarray(ids), m, q)

            def packed(q: np.ndarray, p: list[int]) -> list[int]:
                rows = conn.cursor(binary=True).execute("SELECT doc_ids, vectors FROM packs WHERE scope = %s AND cell = ANY(%s)",
                                                        [scope, p]).fetchall()
                ids = np.concatenate([np.asarray(r[0], dtype=np.int64) for r in rows])
                return top(ids, np.frombuffer(b"".join(r[1] for r in rows), dtype=np.int8).reshape(len(ids), -1), q)

            def run(label: str, knn: Any) -> None:
                wall, cpu = [], []
                for q, p in zip(qs, picks, strict=True):
                    t, c = time.perf_counter(), time.process_time()
                    knn(q, p)
                    wall.append(time.perf_counter() - t)
                    cpu.append(time.process_time() - c)
                print(f"    {label}: wall p50 {statistics.median(wall) * 1000:.1f} ms (this process's CPU p50"
                      f" {statistics.median(cpu) * 1000:.1f} ms)", flush=True)

            same = set(in_sql(qs[0], picks[0])[:8]) == set(packed(qs[0], picks[0])[:8])
            print(f"    the best 8 of the packed cells (int8) are the SQL's (halfvec): {same}", flush=True)
            run("(scope, cell) b-tree and heap, distance in SQL (the provider's)", in_sql)
            run("the same vectors sent here (halfvec_send) and scored in numpy", sent)
            run("packed cells, read in binary and scored in numpy", packed)
            conn.execute("CREATE INDEX v_cover ON v (scope, cell) INCLUDE (doc_id, embedding)")
            conn.execute("VACUUM ANALYZE v")
            run("a covering (scope, cell) INCLUDE (doc_id, embedding) b-tree, distance in SQL", in_sql)


def cells_model(n: int, queries: int, real_n: int, cell_rows: int, reads: list[int]) -> None:
    """`--cells-model N`: recall@8 of the cells against how many are read, in numpy (no store): the
    product's own `vector_cells.divide` over one scope of N int8 vectors (as the stores hold them), the
    nearest `reads` cells of each query scanned exactly; against numpy's exact float32 cosine."""
    from memactors.builtin import vector_cells

    model = shared_model()
    items = corpus(max(real_n, 2000), 1)
    real = np.asarray(model.encode([it["body"] for it in items[:real_n]]), dtype=np.float32)
    vectors = derive_vectors(real, n)
    qvecs = np.asarray(model.encode([q for _, q in make_queries(items, queries)]), dtype=np.float32)
    peak = np.abs(vectors).max(axis=1, keepdims=True)
    stored = vector_cells.unit_rows(np.round(vectors * 127 / peak).astype(np.int8).astype(np.float32))
    wants = [set(np.argsort(-(vectors @ q))[:LIMIT].tolist()) for q in qvecs]
    exact = statistics.mean(len(set(np.argsort(-(stored @ q))[:LIMIT].tolist()) & w) / LIMIT
                            for q, w in zip(qvecs, wants, strict=True))
    vector_cells.CELL_ROWS = cell_rows
    t = time.perf_counter()
    division = vector_cells.divide("s", list(range(n)), stored)
    centroids = division.centroids
    assigned = np.array([division.cells[i] for i in range(n)])
    print(f"one scope of {n} vectors ({real_n} real): {len(centroids)} cells of ~{cell_rows} fitted in"
          f" {time.perf_counter() - t:.0f} s; the exact int8 scan's recall@8 {exact:.3f}", flush=True)
    for read in reads:
        hits, scanned = [], []
        for q, want in zip(qvecs, wants, strict=True):
            rows = np.flatnonzero(np.isin(assigned, np.argsort(-(centroids @ q))[:read]))
            scanned.append(len(rows))
            hits.append(len(set(rows[np.argsort(-(stored[rows] @ q))[:LIMIT]].tolist()) & want) / LIMIT)
        print(f"    {read} cells read: {statistics.median(scanned) / n:.1%} of the vectors, recall@8"
              f" {statistics.mean(hits):.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--engines", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--pg-index", nargs="*", default=["hnsw", "ivfflat"], choices=["hnsw", "ivfflat"],
                        help="pgvector's own indexes to build and compare (none: the provider's cells alone)")
    parser.add_argument("--repos", type=int, default=200)
    parser.add_argument("--real", type=int, default=2000, help="episodes embedded with the real model")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--text", choices=["template", "commits"], default="template",
                        help="the episodes' text: a template vocabulary of a few hundred words, or words drawn with"
                             " their frequencies in real commit messages (see commits_corpus)")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"),
                        help="--text commits: where encode+httpx, python-attrs+attrs and psf+black are mirrored")
    parser.add_argument("--keep", type=Path, help="directory to build the stores in (kept)")
    parser.add_argument("--bulk", action="store_true",
                        help="SQLite: write the rows in bulk (`bulk_build`), not through the per-row write path")
    parser.add_argument("--build-only", action="store_true", help="build the stores (with --keep) and stop")
    parser.add_argument("--partition", type=int, metavar="N",
                        help="only the vector search over one repository of N episodes, in three forms")
    parser.add_argument("--cells-model", type=int, metavar="N",
                        help="only the cells' recall against the cells read, in numpy, over one scope of N vectors")
    parser.add_argument("--pg-probe-forms", type=int, metavar="N",
                        help="only PostgreSQL's knn over 104 of 664 cells in several forms, N random vectors")
    parser.add_argument("--cell-rows", type=int, default=256)
    parser.add_argument("--reads", type=int, nargs="+", default=[16, 24, 32, 48, 64, 96])
    args = parser.parse_args()
    print(machine(), flush=True)
    if args.pg_probe_forms:
        pg_probe_forms(args.pg_probe_forms, 664, 104, min(args.queries, 40))
        print(machine(), flush=True)
        return
    if args.cells_model:
        cells_model(args.cells_model, args.queries, args.real, args.cell_rows, args.reads)
        return
    if args.partition:
        if "postgresql" in args.engines:
            pg_partition(args.partition, args.queries, args.real, args.pg_index)
        if "sqlite" in args.engines:
            partition(args.partition, args.queries, args.real)
        print(machine(), flush=True)
        return
    print("synthetic corpus (see the docstring): vectors --real embedded by the model, the rest derived from them",
          flush=True)
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
