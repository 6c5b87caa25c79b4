"""Gateway recall with the embedded model against BM25 only, at 10k episodes (the target: p50
with embeddings ≤ 1.5 × the BM25-only p50, the query's embedding included).

    .venv/bin/python bench/embed_gateway.py                       # 10k episodes, 100 queries a mode
    .venv/bin/python bench/embed_gateway.py --size 1000 --queries 50

The corpus is `bench/user_paths.py`'s (Zipf prose over 50 repositories, bulk-loaded with the provider's
own `write_doc`), and every episode is given a vector under the embedded model's key (seeded random
unit vectors: embedding 10k synthetic episodes would take minutes of CPU and change nothing in what a
recall costs, since `vec0` reads every vector of the scope whatever they hold), so no back-fill runs
while recalls are timed (the bench checks `pending` is 0). Then a real `memactors serve` on that state
directory answers the same queries through the gateway (MCP `tools/call recall`, `mcp.Client` over
streamable HTTP with a run token, limit 8), three times in turn: BM25 only (`[memory] embeddings =
false`), the default configuration (the embedded all-MiniLM-L6-v2: each query embedded on the
daemon's query thread, fused with BM25), BM25 only again (the machine's load moves; the ratio is
against the mean of both BM25 runs). 10 warm-up calls per daemon (the model loads in the first).
It prints the machine and its load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from user_paths import (  # noqa: E402
    LIMIT,
    REPOS,
    SERVICE,
    _seed_live_runs,
    build_corpus,
    daemon,
    gateway_client,
    machine,
    make_queries,
    write_config,
)

from memactors.builtin import embedding_text, text_digest, vector_model, write_vector  # noqa: E402
from memactors.embedding import BUILTIN_MODEL, DIM  # noqa: E402
from memactors.rpc.client import connect_rpc  # noqa: E402
from memactors.store.sqlite import _connect  # noqa: E402


def add_vectors(state: Path) -> int:
    rng = random.Random(13)
    db = _connect(state / "memactors.db")
    try:
        rows = db.execute("SELECT doc_id, scope, summary, excerpt, failures FROM builtin_docs").fetchall()
        db.execute("BEGIN")
        for doc_id, scope, summary, excerpt, failures in rows:
            v = [rng.gauss(0.0, 1.0) for _ in range(DIM)]
            norm = sum(x * x for x in v) ** 0.5
            # keyed by its embedding text's digest, as the back-fill keys the cache
            digest = text_digest(embedding_text(summary or "", excerpt or "", json.loads(failures or "[]")))
            write_vector(db, doc_id=int(doc_id), scope=str(scope), model=vector_model(BUILTIN_MODEL),
                         digest=digest, vector=[x / norm for x in v])
        db.execute("COMMIT")
    finally:
        db.conn.close()
    return len(rows)


async def timed(root: Path, state: Path, mode: str, queries: list[tuple[int, str]]) -> dict[str, Any]:
    config = write_config(root, state, "[memory]\nembeddings = false\n" if mode.startswith("bm25") else "")
    async with daemon(root, config, state) as d, AsyncExitStack() as stack:
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        status = (await control.call(f"{SERVICE}/Status", {}))["embeddings"]
        if mode == "embedded" and (not status or status.get("pending")):
            raise SystemExit(f"embedded mode without every vector: {status}")
        tokens = {z: (await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}", "run_id": f"live{z}"}))
                  ["token"] for z in range(REPOS)}
        clients: dict[int, Any] = {}

        async def client_for(z: int) -> Any:
            if z not in clients:
                clients[z] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[z]))
            return clients[z]

        for z, q in queries[:10]:
            await (await client_for(z)).call_tool("recall", {"query": q, "limit": LIMIT})
        times, found = [], 0
        for z, q in queries:
            client = await client_for(z)
            t = time.perf_counter()
            res = await client.call_tool("recall", {"query": q, "limit": LIMIT})
            times.append(time.perf_counter() - t)
            found += "episode ·" in "".join(getattr(c, "text", "") for c in res.content)
        status = (await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}
    times.sort()
    return {"mode": mode, "p50_ms": round(statistics.median(times) * 1000, 2),
            "p90_ms": round(times[int(0.9 * (len(times) - 1))] * 1000, 2), "queries": len(times),
            "with_episodes": found, "runtime": (status.get("runtime") or {}).get("runtime"),
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}


async def main_async(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="embed-gateway-"))
    state = root / "state"
    samples = await trio.to_thread.run_sync(build_corpus, state, args.size)
    vectors = await trio.to_thread.run_sync(add_vectors, state)
    await trio.to_thread.run_sync(_seed_live_runs, state)
    print(f"{args.size} episodes, {vectors} vectors of {BUILTIN_MODEL}'s key; {args.queries} queries a mode", flush=True)
    queries = make_queries(samples, args.queries)
    runs = []
    for mode in ("bm25", "embedded", "bm25_again"):
        r = await timed(root, state, mode, queries)
        runs.append(r)
        print(f"  {mode:<10} gateway recall p50 {r['p50_ms']:>7} ms  p90 {r['p90_ms']:>7} ms"
              f"  ({r['with_episodes']}/{r['queries']} with episodes; load {r['load']}"
              f"{'; ' + r['runtime'] if r['runtime'] else ''})", flush=True)
    bm25 = statistics.mean([runs[0]["p50_ms"], runs[2]["p50_ms"]])
    print(f"  embedded p50 / BM25-only p50 = {runs[1]['p50_ms'] / bm25:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    print("machine:", machine(), flush=True)
    trio.run(main_async, args)
    print("machine at the end:", machine(), flush=True)


if __name__ == "__main__":
    main()
