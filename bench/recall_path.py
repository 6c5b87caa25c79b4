"""The read path below the gateway, layer by layer, on bench/user_paths.py's corpus.

    .venv/bin/python bench/recall_path.py                      # 1k and 10k episodes, 200 queries
    .venv/bin/python bench/recall_path.py --sizes 1000 --queries 100 --keep /tmp/corpora

For the same queries (2-3 words of an episode of the asking repository, limit 8), interleaved query by
query, in this process (no daemon, no HTTP), it times:

* **agent**: what the gateway's recall tool does below HTTP — `caller_view(token)` (its bearer
  gate: the token and the run's place in one read), then `agent_recall`
  (provider over in-process MCP, the REQ-9 re-check, facts, wrapper);
* **embedded**: `MemoryService.recall` (operator recall, the library path);
* **session**: `provider_call` to the provider session (schema checks, in-process MCP, the provider);
* **provider**: `BuiltinProvider.recall` alone (its SQL and item texts, no MCP);
* **gateway** (with `--gateway`): MCP `tools/call recall` over streamable HTTP into a real daemon
  (`memactors serve` on the same store), as bench/user_paths.py does, with the daemon's CPU per call;
* **anchor**: raw FTS5, words AND-ed with the scope token, `ORDER BY rank LIMIT 8` (the floor).

It prints the machine's load first, then medians and p99s and each path's ratio to the anchor, and
the process CPU time per call (all threads, mean): on a loaded machine the wall-clock figures are
mostly waiting for a core at each thread hop, while the CPU time is what the path itself costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).parent))
from user_paths import (  # noqa: E402 -- bench/ is not a package
    REPOS,
    SERVICE,
    _seed_live_runs,
    anchor_sql,
    build_corpus,
    daemon,
    gateway_client,
    make_queries,
    pct,
    repo,
    write_config,
)

from memactors.actors.provider_session import provider_call  # noqa: E402
from memactors.builtin import query_words  # noqa: E402
from memactors.config import ConfigHolder, load_config  # noqa: E402
from memactors.logs import configure_logging  # noqa: E402
from memactors.repo import scope_for  # noqa: E402
from memactors.rpc.client import connect_rpc  # noqa: E402
from memactors.service import open_memory_service  # noqa: E402
from memactors.store.sqlite import _connect  # noqa: E402

LIMIT = 8
PATHS = ("agent", "embedded", "session", "provider", "anchor")


def corpus(root: Path, size: int) -> tuple[Path, list[tuple[int, str]], int]:
    state = root / f"state-{size}"
    marker = state / "queries.txt"
    if not marker.exists():
        samples = build_corpus(state, size)
        _seed_live_runs(state)
        marker.write_text("\n".join(f"{z}\t{' '.join(s.split()[:200])}" for z, ss in samples.items() for s in ss))
    samples: dict[int, list[str]] = {z: [] for z in range(REPOS)}
    for line in marker.read_text().splitlines():
        z, text = line.split("\t", 1)
        samples[int(z)].append(text)
    return state, make_queries(samples, 10_000), size


async def measure(root: Path, state: Path, queries: list[tuple[int, str]]) -> dict[str, dict[str, float]]:
    config = write_config(root, state)
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(root)}))
    log = (root / "bench.log").open("a", encoding="utf-8")  # logged as the daemon logs: INFO, text, to a file
    configure_logging("INFO", sink=log)
    times: dict[str, list[float]] = {k: [] for k in PATHS}
    cpu: dict[str, list[float]] = {k: [] for k in PATHS}
    async with open_memory_service(holder) as svc:
        tokens = {z: (await svc.mint_run_token(harness=f"h{z:02d}", run_id=f"live{z}"))["token"]
                  for z in range(REPOS)}
        raw = _connect(state / "memactors.db")
        nums = dict(raw.execute("SELECT scope, num FROM builtin_scopes").fetchall())
        for z, q in queries[:10]:  # warm-up
            await svc.recall(query=q, repo=repo(z), limit=LIMIT)
        for z, q in queries:
            scope = scope_for(repo(z))
            t, c = time.perf_counter(), time.process_time()
            view = await svc.caller_view(tokens[z])  # what the gateway's bearer gate does
            await svc.agent_recall(view, query=q, limit=LIMIT, call_id="bench")
            times["agent"].append(time.perf_counter() - t)
            cpu["agent"].append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            await svc.recall(query=q, repo=repo(z), limit=LIMIT)
            times["embedded"].append(time.perf_counter() - t)
            cpu["embedded"].append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            await provider_call(svc.session.address, "memory_recall", {"query": q, "scope": [scope], "limit": LIMIT})
            times["session"].append(time.perf_counter() - t)
            cpu["session"].append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            await svc.builtin.recall({"query": q, "scope": [scope], "limit": LIMIT})
            times["provider"].append(time.perf_counter() - t)
            cpu["provider"].append(time.process_time() - c)
            sql, params = anchor_sql("and+tok", query_words(q), scope, nums.get(scope, 0))
            t, c = time.perf_counter(), time.process_time()
            raw.execute(sql, params).fetchall()
            times["anchor"].append(time.perf_counter() - t)
            cpu["anchor"].append(time.process_time() - c)
        raw.conn.close()
    logger.remove()
    log.close()
    out = {k: {"p50_ms": round(statistics.median(v) * 1000, 3), "p99_ms": round(pct(v, 99) * 1000, 3),
               "cpu_ms": round(statistics.mean(cpu[k]) * 1000, 3)} for k, v in times.items()}
    for k in PATHS:
        out[k]["x_anchor"] = round(out[k]["p50_ms"] / max(out["anchor"]["p50_ms"], 1e-6), 1)
    return out


def daemon_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_gateway(root: Path, state: Path, queries: list[tuple[int, str]]) -> dict[str, float]:
    """The gateway recall into a real daemon (`memactors serve`): wall clock per call as the client sees
    it, and the daemon's CPU per call (/proc, every thread, over the whole loop)."""
    config = write_config(root, state)
    async with daemon(root, config, state) as d, connect_rpc(d["operator"], d["control"]) as control:
        tokens = {z: (await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}", "run_id": f"live{z}"}))
                  ["token"] for z in range(REPOS)}
        clients: dict[int, Any] = {}
        async with AsyncExitStack() as stack:
            for z, q in queries[:10] + queries:  # open every client first (warm-up), then the timed loop
                if z not in clients:
                    clients[z] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[z]))
                await clients[z].call_tool("recall", {"query": q, "limit": LIMIT})
            times = []
            cpu0 = daemon_cpu_s(d["pid"])
            for z, q in queries:
                t = time.perf_counter()
                await clients[z].call_tool("recall", {"query": q, "limit": LIMIT})
                times.append(time.perf_counter() - t)
            cpu = daemon_cpu_s(d["pid"]) - cpu0
    return {"p50_ms": round(statistics.median(times) * 1000, 3), "p99_ms": round(pct(times, 99) * 1000, 3),
            "daemon_cpu_ms": round(cpu / len(queries) * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpora in")
    parser.add_argument("--gateway", action="store_true",
                        help="also time the gateway recall into a real daemon, with the daemon's CPU per call")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            state, queries, _ = corpus(root, size)
            res = trio.run(measure, root, state, queries[:args.queries])
            print(f"{size:>7} episodes", flush=True)
            for k in PATHS:
                r = res[k]
                print(f"    {k:<9} p50 {r['p50_ms']:>8.3f} ms   p99 {r['p99_ms']:>8.3f} ms   {r['x_anchor']:>5}x anchor"
                      f"   cpu {r['cpu_ms']:>7.3f} ms", flush=True)
            if args.gateway:
                g = trio.run(measure_gateway, root, state, queries[:args.queries])
                print(f"    {'gateway':<9} p50 {g['p50_ms']:>8.3f} ms   p99 {g['p99_ms']:>8.3f} ms"
                      f"   daemon cpu {g['daemon_cpu_ms']:>7.3f} ms per recall", flush=True)
    print(f"load average after: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
