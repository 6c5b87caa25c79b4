"""Recall latency of the built-in provider (SPEC-0030 REQ-11) at 10k and 100k episodes, BM25 and hybrid.

    .venv/bin/python bench/recall_latency.py                 # 10k and 100k, 200 queries each mode
    .venv/bin/python bench/recall_latency.py --sizes 10000 --queries 100 --json

For each size it builds a fresh store in a temporary directory with synthetic episodes (bulk-inserted
straight into the built-in provider's tables with the provider's own helpers — not through the daemon's
record pipeline, which would take hours at 100k), then measures `memory_recall` through the same
in-process MCP client the daemon uses:

* **bm25** — a provider without an embedding model: FTS5 BM25 plus the path boost.
* **hybrid** — a provider with an embedding model: the query is embedded by
  `memactors.testing.fake_model_api` (bag-of-words vectors, a real HTTP server on 127.0.0.1), and BM25,
  cosine over the sqlite-vec table and the path boost are fused by RRF. The episodes' vectors are
  computed locally with the same deterministic function, so the build does not go through HTTP.

* **embedded** (`--embedded`, instead of hybrid) — the default configuration's hybrid ranking: each
  query embedded by the embedded all-MiniLM-L6-v2 (`memactors.embedding.LocalEmbedder`, onnxruntime on
  one thread, as the daemon runs it), fused with BM25 and the path ranking. The episodes' vectors are
  seeded random unit vectors (embedding 10k synthetic episodes would take minutes and change nothing
  in what a recall costs: a brute-force `vec0` search reads every vector of the scope whatever they
  hold); the model is loaded during the warm-up calls.

A quarter of the queries carry one requested path. Latency is wall time per call (median, p99, max),
after 10 warm-up calls. It prints the machine it ran on; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mcp
import sqlean
import sqlite_utils
import sqlite_vec
import trio

from memactors.builtin import BuiltinProvider, embed_input, vector_model, write_doc, write_vector
from memactors.modelapi import ModelApiClient, ModelApiSettings
from memactors.store.engines import open_store
from memactors.store.sqlite import migrations
from memactors.testing.fake_model_api import FakeBehaviour, embedding_for, run_fake_model_api

MODEL = "bench-bag-of-words"
REPOS = 25
VOCABULARY = 3000
BATCH = 5000


def vocabulary(rng: random.Random) -> list[str]:
    syllables = ["ba", "ko", "ri", "len", "dar", "mo", "te", "sul", "gri", "pha", "ne", "vo", "xi", "qua", "ty"]
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def zipf_pick(rng: random.Random, words: list[str]) -> str:
    """Word frequencies roughly like prose: a few common words, a long tail."""
    return words[min(int(rng.paretovariate(1.1)) - 1, len(words) - 1)]


def word_and_file_pools() -> tuple[list[str], list[str]]:
    """The shared vocabulary (in frequency order) and repository files, the same for episodes and queries."""
    rng = random.Random(7)
    words = vocabulary(rng)
    rng.shuffle(words)
    files = [f"src/{rng.choice(words)}/{rng.choice(words)}.py" for _ in range(400)]
    return words, files


def synthetic_episodes(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words, files = word_and_file_pools()
    episodes = []
    for i in range(n):
        text = " ".join(zipf_pick(rng, words) for _ in range(rng.randint(40, 90)))
        episodes.append({
            "episode_id": f"ep_{i:020x}",
            "scope": f"project:forge.example/acme/repo{i % REPOS}",
            "text": f"outcome succeeded. {text}",
            "summary": " ".join(zipf_pick(rng, words) for _ in range(12)),
            "files": rng.sample(files, rng.randint(1, 4)),
            "started_at": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
        })
    return episodes


def queries(n: int, seed: int = 11) -> list[dict[str, Any]]:
    """Queries of 2 to 5 words drawn like the episodes' words but skipping the 20 commonest (stop words)."""
    rng = random.Random(seed)
    words, files = word_and_file_pools()
    out = []
    for i in range(n):
        picked = [words[min(20 + int(rng.paretovariate(0.8)), len(words) - 1)] for _ in range(rng.randint(2, 5))]
        q: dict[str, Any] = {
            "query": " ".join(picked),
            "scope": [f"project:forge.example/acme/repo{rng.randrange(REPOS)}"],
            "limit": 8,
        }
        if i % 4 == 0:
            q["paths"] = [rng.choice(files)]
        out.append(q)
    return out


def random_unit(rng: random.Random, dim: int) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def build(path: Path, episodes: list[dict[str, Any]], dim: int, model: str = MODEL) -> float:
    """Bulk-load the episodes (and their vectors) with the provider's own helpers; returns seconds.
    Vectors of the bench's bag of words for `MODEL`, seeded random unit vectors for another model."""
    started = time.perf_counter()
    rng = random.Random(13)
    conn = sqlean.connect(str(path), isolation_level=None)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    db = sqlite_utils.Database(conn)
    migrations.apply(db)
    for start in range(0, len(episodes), BATCH):
        db.execute("BEGIN")
        for ep in episodes[start:start + BATCH]:
            doc_id, digest, _ = write_doc(db, episode_id=ep["episode_id"], scope=ep["scope"], text=ep["text"],
                                          summary=ep["summary"], files=ep["files"], started_at=ep["started_at"])
            vector = (embedding_for(embed_input(ep["text"], ep["summary"]), dim, "bag_of_words") if model == MODEL
                      else random_unit(rng, dim))
            write_vector(db, doc_id=doc_id, scope=ep["scope"], model=model, digest=digest, vector=vector)
        db.execute("COMMIT")
    db.execute("PRAGMA optimize")
    conn.close()
    return time.perf_counter() - started


async def measure(provider: BuiltinProvider, qs: list[dict[str, Any]]) -> dict[str, Any]:
    latencies: list[float] = []
    degraded = 0
    hits = 0
    async with mcp.Client(provider.server(), raise_exceptions=True) as client:
        for q in qs[:10]:
            await client.call_tool("memory_recall", q)
        for q in qs:
            started = time.perf_counter()
            result = await client.call_tool("memory_recall", q)
            latencies.append(time.perf_counter() - started)
            payload = result.structured_content or {}
            degraded += "degraded" in payload
            hits += bool(payload.get("items"))
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * len(latencies))) - 1)]
    return {"queries": len(latencies), "median_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(p99 * 1000, 2), "max_ms": round(latencies[-1] * 1000, 2),
            "with_results": hits, "degraded": degraded}


def machine() -> dict[str, Any]:
    conn = sqlean.connect(":memory:")
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    sqlite_version, vec_version = conn.execute("SELECT sqlite_version(), vec_version()").fetchone()
    conn.close()
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0], "sqlite": sqlite_version, "sqlite_vec": vec_version}


async def run_embedded(sizes: list[int], n_queries: int, keep: Path | None) -> dict[str, Any]:
    """BM25 only against the default configuration's hybrid ranking with the embedded model."""
    from memactors.embedding import BUILTIN_MODEL, DIM, LocalEmbedder, model_info

    results: dict[str, Any] = {"machine": machine(), "dim": DIM, "runs": []}
    qs = queries(n_queries)
    for size in sizes:
        with tempfile.TemporaryDirectory(dir=keep) as tmp:
            path = Path(tmp) / "bench.db"
            episodes = synthetic_episodes(size)
            build_s = await trio.to_thread.run_sync(build, path, episodes, DIM, vector_model(BUILTIN_MODEL))
            del episodes
            store = await open_store(path)
            try:
                bm25 = await measure(BuiltinProvider(store), qs)
                embedded = await measure(BuiltinProvider(
                    store, embedder=LocalEmbedder().embed, query_embedder=LocalEmbedder(query=True).embed,
                    embedding_model=BUILTIN_MODEL, query_embed_deadline=10.0), qs)
                bm25_again = await measure(BuiltinProvider(store), qs)  # the load may have moved meanwhile
            finally:
                store.close()
            run_ = {"episodes": size, "build_s": round(build_s, 1), "db_mb": round(path.stat().st_size / 2**20, 1),
                    "bm25": bm25, "embedded": embedded, "bm25_again": bm25_again, "runtime": model_info(),
                    "ratio_p50": round(embedded["median_ms"] / statistics.mean(
                        [bm25["median_ms"], bm25_again["median_ms"]]), 2)}
            results["runs"].append(run_)
            print_run(run_)
    return results


async def run(sizes: list[int], n_queries: int, dim: int, keep: Path | None) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "dim": dim, "runs": []}
    qs = queries(n_queries)
    behaviour = FakeBehaviour(embed_mode="bag_of_words", embed_dim=dim)
    async with run_fake_model_api(behaviour=behaviour) as fake:
        settings = ModelApiSettings(base_url=fake.base_url, api_key=None, utility_model=None, embedding_model=MODEL,
                                    requests_per_minute=10**9, daily_requests=10**9)
        async with ModelApiClient(settings) as client:
            for size in sizes:
                with tempfile.TemporaryDirectory(dir=keep) as tmp:
                    path = Path(tmp) / "bench.db"
                    episodes = synthetic_episodes(size)
                    build_s = await trio.to_thread.run_sync(build, path, episodes, dim)
                    del episodes
                    store = await open_store(path)
                    try:
                        bm25 = await measure(BuiltinProvider(store), qs)
                        hybrid = await measure(BuiltinProvider(store, embedder=client.embed, embedding_model=MODEL,
                                                               query_embed_deadline=1.0), qs)
                    finally:
                        store.close()
                    run_ = {"episodes": size, "build_s": round(build_s, 1),
                            "db_mb": round(path.stat().st_size / 2**20, 1), "bm25": bm25, "hybrid": hybrid}
                    results["runs"].append(run_)
                    print_run(run_)
    return results


def print_run(r: dict[str, Any]) -> None:
    print(f"{r['episodes']:>7} episodes  built in {r['build_s']} s, {r['db_mb']} MB", flush=True)
    for mode in ("bm25", "hybrid", "embedded", "bm25_again"):
        if mode not in r:
            continue
        m = r[mode]
        print(f"    {mode:<6}  median {m['median_ms']:>7} ms   p99 {m['p99_ms']:>7} ms   max {m['max_ms']:>7} ms"
              f"   ({m['queries']} queries, {m['with_results']} with results, {m['degraded']} degraded)", flush=True)
    if "ratio_p50" in r:
        print(f"    embedded p50 / BM25-only p50 = {r['ratio_p50']}  (runtime: {r['runtime'].get('runtime')})", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--dim", type=int, default=384, help="embedding dimension (default 384)")
    parser.add_argument("--tmp", type=Path, help="directory for the temporary stores (default: system temp)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--embedded", action="store_true",
                        help="BM25 only against the embedded model's hybrid ranking (the default configuration)")
    args = parser.parse_args(argv)
    info = machine()
    print(f"machine: {info['platform']}; {info['cpu']} x{info['cpu_count']}; python {info['python']};"
          f" sqlite {info['sqlite']}; sqlite-vec {info['sqlite_vec']}; dim {args.dim};"
          f" load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    results = (trio.run(run_embedded, args.sizes, args.queries, args.tmp) if args.embedded
               else trio.run(run, args.sizes, args.queries, args.dim, args.tmp))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
