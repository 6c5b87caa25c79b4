"""Where one recall's time goes, with the embedded model on, at 10k episodes (issue 43).

    .venv/bin/python bench/recall_profile.py                       # 10k episodes, 100 queries
    .venv/bin/python bench/recall_profile.py --size 1000 --queries 50 --keep /tmp/corpora

The corpus is bench/user_paths.py's (as bench/recall_path.py builds it), every episode given a seeded
random unit vector under the embedded model's key (as bench/embed_gateway.py does), so no back-fill
runs while recalls are timed. For the same distinct queries (2-3 words of an episode of the asking
repository, limit 8), interleaved query by query in one process, it times the parts and the layers:

* parts: **fts5** (raw FTS5, the words AND-ed with the scope token), **knn** (the provider's own
  `vec0` query over the scope, the query's vector given), **embed** (the model run on the query, on
  this thread);
* layers, from the bottom: **provider** (`BuiltinProvider.recall`: its two store hops and the
  query's embedding), **session** (`provider_call`: the session actor, schema checks, in-process
  MCP), **agent** (the gateway's handler below HTTP: `caller_view` + `agent_recall`, i.e. the
  briefing actor, the REQ-9 re-check, facts, the exposure write), **agent_again** (the same question
  asked again at once: its vector comes from the query-vector cache), **operator** (`MemoryService.recall`);
* with `--daemon`: a real `memactors serve` on the same store, **gateway** (MCP `tools/call recall`
  over streamable HTTP with a run token) and **rpc** (operator-RPC `Recall` over the websocket).

Every query but agent_again's is new to the process (the query-vector cache does not answer). It then runs
`--profile` recalls of the agent layer under cProfile (the trio thread only) and prints the calls
per recall of what the path is made of: thread hops (`to_thread.run_sync`), actor asks, MCP
client/server calls, JSON-Schema validations, model runs. It prints the machine and its load first
and last; the ratios are of figures from this one run.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_gateway import add_vectors  # noqa: E402
from recall_path import corpus  # noqa: E402
from user_paths import REPOS, SERVICE, anchor_sql, daemon, gateway_client, machine, pct, repo, write_config  # noqa: E402

from memactors.actors.provider_session import provider_call  # noqa: E402
from memactors.builtin import (
    index_sqlite,  # noqa: E402
    query_words,  # noqa: E402
)
from memactors.config import ConfigHolder, load_config  # noqa: E402
from memactors.embedding import shared_model  # noqa: E402
from memactors.logs import configure_logging  # noqa: E402
from memactors.repo import scope_for  # noqa: E402
from memactors.rpc.transport import connect_rpc  # noqa: E402
from memactors.service import open_memory_service  # noqa: E402
from memactors.store.sqlite import _connect  # noqa: E402

LIMIT = 8
PARTS = ("fts5", "knn", "embed")
LAYERS = ("provider", "session", "agent", "agent_again", "operator")
#: What a recall is made of, as cProfile names the functions (file suffix, function name).
COUNTED = {
    "thread hops": ("_thread_cache.py", "start_thread_soon"),
    "mailbox sends": ("_channel.py", "send_nowait"),
    "pydantic validations": ("~", "<method 'validate_python' of 'pydantic_core._pydantic_core.SchemaValidator' objects>"),
    "jsonschema validations": ("contract.py", "_validate"),
    "log lines": ("logs.py", "render_extra"),
}


def with_vectors(state: Path) -> None:
    marker = state / "vectors.done"
    if not marker.exists():
        add_vectors(state)
        marker.write_text("ok")


def stats_ms(v: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(v) * 1000, "p99": pct(v, 99) * 1000}


async def measure(root: Path, state: Path, queries: list[tuple[int, str]], profiled: int) -> dict[str, Any]:
    config = write_config(root, state)
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(root)}))
    log = (root / "bench.log").open("a", encoding="utf-8")
    configure_logging("INFO", sink=log)
    times: dict[str, list[float]] = {k: [] for k in PARTS + LAYERS}
    model = shared_model()
    async with open_memory_service(holder) as svc:
        status = await svc.builtin.vector_status()
        if status["pending"]:
            raise SystemExit(f"vectors missing: {status}")
        tokens = {z: (await svc.mint_run_token(harness=f"h{z:02d}", run_id=f"live{z}"))["token"]
                  for z in range(REPOS)}
        raw = _connect(state / "memactors.db")
        nums = dict(raw.execute("SELECT scope, num FROM builtin_scopes").fetchall())
        for z, q in queries[:10]:  # warm-up: the model loads, the tables are in the page cache
            await svc.recall(query=f"warm {q}", repo=repo(z), limit=LIMIT)
        timed, rest = queries[10:], profiled
        for n, (z, q) in enumerate(timed):
            scope = scope_for(repo(z))
            vec = model.encode([q])[0]
            sql, params = anchor_sql("and+tok", query_words(q), scope, nums.get(scope, 0))
            t = time.perf_counter()
            raw.execute(sql, params).fetchall()
            times["fts5"].append(time.perf_counter() - t)
            t = time.perf_counter()
            index_sqlite.knn(raw, vec, [scope])
            times["knn"].append(time.perf_counter() - t)
            t = time.perf_counter()
            model.encode([f"{q} {n}"])
            times["embed"].append(time.perf_counter() - t)
            # each layer its own variant of the query, so that no layer reuses another's embedding
            t = time.perf_counter()
            await svc.builtin.recall({"query": f"{q} p{n}", "scope": [scope], "limit": LIMIT})
            times["provider"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await provider_call(svc.session.address, "memory_recall",
                                {"query": f"{q} s{n}", "scope": [scope], "limit": LIMIT})
            times["session"].append(time.perf_counter() - t)
            t = time.perf_counter()
            view = await svc.caller_view(tokens[z])
            await svc.agent_recall(view, query=f"{q} a{n}", limit=LIMIT, call_id="bench")
            times["agent"].append(time.perf_counter() - t)
            t = time.perf_counter()  # the same question again: its vector is cached
            view = await svc.caller_view(tokens[z])
            await svc.agent_recall(view, query=f"{q} a{n}", limit=LIMIT, call_id="bench")
            times["agent_again"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await svc.recall(query=f"{q} o{n}", repo=repo(z), limit=LIMIT)
            times["operator"].append(time.perf_counter() - t)
        prof = cProfile.Profile()
        for n, (z, q) in enumerate((queries * 2)[:rest]):
            prof.enable()
            view = await svc.caller_view(tokens[z])
            await svc.agent_recall(view, query=f"{q} profiled {n}", limit=LIMIT, call_id="bench")
            prof.disable()
        raw.conn.close()
    prof.dump_stats(root / "recall.prof")
    logger.remove()
    log.close()
    return {"times": {k: stats_ms(v) for k, v in times.items()}, "profile": prof}


def counts(prof: cProfile.Profile, recalls: int) -> dict[str, float]:
    st = pstats.Stats(prof)
    out = dict.fromkeys(COUNTED, 0.0)
    for (path, _line, func), (cc, _nc, _tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        for label, (suffix, name) in COUNTED.items():
            if func == name and path.endswith(suffix):  # a wrapper of the same name counts once: max
                out[label] = max(out[label], cc / recalls)
    return out


async def measure_daemon(root: Path, state: Path, queries: list[tuple[int, str]]) -> dict[str, dict[str, float]]:
    config = write_config(root, state)
    times: dict[str, list[float]] = {"gateway": [], "rpc": []}
    async with daemon(root, config, state) as d, AsyncExitStack() as stack:
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        tokens = {z: (await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}", "run_id": f"live{z}"}))
                  ["token"] for z in range(REPOS)}
        clients: dict[int, Any] = {}
        for n, (z, q) in enumerate(queries):
            if z not in clients:
                clients[z] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[z]))
                await clients[z].call_tool("recall", {"query": f"warm {q}", "limit": LIMIT})
            t = time.perf_counter()
            await clients[z].call_tool("recall", {"query": f"{q} g{n}", "limit": LIMIT})
            times["gateway"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await control.call(f"{SERVICE}/Recall", {"query": f"{q} r{n}", "repo": repo(z), "limit": LIMIT})
            times["rpc"].append(time.perf_counter() - t)
    return {k: stats_ms(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--profile", type=int, default=100, help="agent recalls run under cProfile")
    parser.add_argument("--daemon", action="store_true", help="also time gateway and RPC recall into `memactors serve`")
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpus in")
    args = parser.parse_args()
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        state, queries, _ = corpus(root, args.size)
        with_vectors(state)
        queries = queries[:args.queries + 10]
        res = trio.run(measure, root, state, queries, args.profile)
        t = res["times"]
        if args.daemon:
            t.update(trio.run(measure_daemon, root, state, queries[10:]))
        parts = sum(t[k]["p50"] for k in PARTS)
        print(f"{args.size} episodes, {len(queries) - 10} distinct queries, limit {LIMIT}, embedded model on")
        print(f"    parts: fts5 + knn + embed p50 = {parts:.2f} ms")
        for k in PARTS + LAYERS + (("gateway", "rpc") if args.daemon else ()):
            ratio = f"   {t[k]['p50'] / parts:5.2f}x parts" if k not in PARTS else ""
            print(f"    {k:<9} p50 {t[k]['p50']:>8.2f} ms   p99 {t[k]['p99']:>8.2f} ms{ratio}", flush=True)
        if args.profile:  # `--profile 0`: the timings alone (an empty profile has no stats to print)
            print(f"    per agent recall (cProfile of {args.profile}, trio thread):")
            for label, n in counts(res["profile"], args.profile).items():
                print(f"        {label:<24} {n:5.1f}")
            pstats.Stats(res["profile"]).sort_stats("tottime").print_stats(25)
    print(machine(), flush=True)


if __name__ == "__main__":
    main()
