"""Where one recall's time goes, with the embedded model on, at 10k episodes.

    .venv/bin/python bench/recall_profile.py                       # 10k episodes, 100 queries
    .venv/bin/python bench/recall_profile.py --size 1000 --queries 50 --keep /tmp/corpora
    .venv/bin/python bench/recall_profile.py --daemon --profile 0 --keep /tmp/corpora   # the targets' table

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
  over streamable HTTP with a run token) and **rpc** (operator-RPC `Recall` over the websocket), each with
  the daemon's CPU per call (from /proc: a mean) and the client's (this process).

`--cpu` times CPU instead of the wall clock, in process only: the store reads and the query's embedding
run inline on the trio thread, so the process's CPU time around a call is the whole work of that call
and a loaded machine moves it little (the wall clock of a hop is mostly waiting for a core there).
Inline, a new query's text ranking cannot wait for its vector in its read (nothing else runs on the
trio thread meanwhile), so the KNN and the fusion take a second read, as they did before the daemon's
one-read hybrid recall: the CPU is the same work, without that read's thread hop.

**The answers are not empty.** The vectors being random, the relevance floor (`[memory] relevance_floor`,
0.4 by default) would leave nearly every answer empty, and an empty answer costs less than one a user gets
(no item texts, no REQ-9 re-check of items, a short document): the corpus is served with `--floor`, 0 by
default, so each recall serves its eight items. Each layer asks its own variant of a query, the same
words with a different stop word appended ("the", "and", ...): the words searched are those of the raw
FTS5 query (stop words are not searched) while the text embedded differs, so no layer meets another's
query vector in the cache.

**BM25 only** (targets: BM25-only recall ≤ 2 × raw FTS5; gateway recall with embeddings ≤
1.5 × BM25-only): the same queries through the same layers of a service started with `[memory]
embeddings = false` on the same store (**provider_bm25**, **agent_bm25**, **operator_bm25**; with
`--daemon` a second `memactors serve`, **gateway_bm25** and **rpc_bm25**), raw FTS5 timed beside them.

With `--daemon` the parts are timed again inside each daemon phase, query by query between the
daemon's recalls (the daemon idle meanwhile), and the daemon's ratios are to those: a loaded machine's
load moves between phases.

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
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_gateway import add_vectors  # noqa: E402
from recall_path import corpus  # noqa: E402
from user_paths import (  # noqa: E402
    REPOS,
    SERVICE,
    anchor_sql,
    cpu_s,
    daemon,
    gateway_client,
    machine,
    pct,
    repo,
    write_config,
)

from memactors.actors.provider_session import provider_call  # noqa: E402
from memactors.builtin import (
    index_sqlite,  # noqa: E402
    query_words,  # noqa: E402
)
from memactors.config import ConfigHolder, load_config  # noqa: E402
from memactors.embedding import shared_model  # noqa: E402
from memactors.logs import configure_logging  # noqa: E402
from memactors.repo import scope_for  # noqa: E402
from memactors.rpc.client import connect_rpc  # noqa: E402
from memactors.service import open_memory_service  # noqa: E402
from memactors.store.sqlite import _connect  # noqa: E402

LIMIT = 8
PARTS = ("fts5", "knn", "embed")
LAYERS = ("provider", "session", "agent", "agent_again", "operator")
BM25_LAYERS = ("provider_bm25", "agent_bm25", "operator_bm25")
#: Each layer's variant of a query: a stop word appended (not searched; it changes the text embedded).
VARIANT = {"parts": "about", "provider": "the", "session": "and", "agent": "for", "operator": "with",
           "gateway": "from", "rpc": "into", "profiled": "over"}
#: What a recall is made of, as cProfile names the functions (file suffix, function name).
COUNTED = {
    "thread hops": ("_thread_cache.py", "start_thread_soon"),
    "mailbox sends": ("_channel.py", "send_nowait"),
    "pydantic validations": ("~", "<method 'validate_python' of 'pydantic_core._pydantic_core.SchemaValidator' objects>"),
    "contract schema checks": ("contract.py", "_schema_error"),
    "log lines": ("logs.py", "render_extra"),
}


def with_vectors(state: Path) -> None:
    marker = state / "vectors.done"
    if not marker.exists():
        add_vectors(state)
        marker.write_text("ok")


@contextmanager
def embedded_corpus(keep: Path | None, size: int) -> Iterator[tuple[Path, Path, list[tuple[int, str]]]]:
    """The bench corpus of `size` episodes, every one with its vector: (root, state directory, queries).
    Built in `keep` (and reused by the next run) or in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        state, queries, _ = corpus(root, size)
        with_vectors(state)
        yield root, state, queries


def stats_ms(v: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(v) * 1000, "p99": pct(v, 99) * 1000}


def settings(floor: float, embeddings: bool = True) -> str:
    """The `[memory]` table of the bench's configuration."""
    return f"[memory]\nrelevance_floor = {floor}\n" + ("" if embeddings else "embeddings = false\n")


def ask(q: str, layer: str) -> str:
    return f"{q} {VARIANT[layer]}"


class Parts:
    """The raw parts of a recall, timed in this process: FTS5, the provider's KNN, the model on the query."""

    def __init__(self, state: Path, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.model = shared_model()
        self.raw = _connect(state / "memactors.db")
        self.nums = dict(self.raw.execute("SELECT scope, num FROM builtin_scopes").fetchall())

    def fts5(self, z: int, q: str) -> float:
        scope = scope_for(repo(z))
        sql, params = anchor_sql("and+tok", query_words(q), scope, self.nums.get(scope, 0))
        t = self.clock()
        self.raw.execute(sql, params).fetchall()
        return self.clock() - t

    def knn(self, z: int, q: str) -> float:
        vec = self.model.encode([q])[0]
        t = self.clock()
        index_sqlite.knn(self.raw, vec, [scope_for(repo(z))])
        return self.clock() - t

    def embed(self, q: str) -> float:
        t = self.clock()
        self.model.encode([ask(q, "parts")])
        return self.clock() - t

    def time_all(self, times: dict[str, list[float]], z: int, q: str) -> None:
        times["fts5"].append(self.fts5(z, q))
        times["knn"].append(self.knn(z, q))
        times["embed"].append(self.embed(q))

    def close(self) -> None:
        self.raw.conn.close()


def run_inline(svc: Any, model: Any) -> None:
    """`--cpu`: every store read and the query's embedding on the calling (trio) thread, so the process's
    CPU time around a call is that call's whole work, whatever else the machine runs."""
    store = svc.store

    async def read(fn: Callable[[Any], Any]) -> Any:
        return store._read_sync(fn)

    async def embed(texts: list[str]) -> list[list[float]]:
        return model.encode(texts)

    store.read = read
    if svc.builtin.hybrid:
        svc.builtin.query_embedder = embed


async def measure(root: Path, state: Path, queries: list[tuple[int, str]], profiled: int,
                  floor: float, inline: bool = False) -> dict[str, Any]:
    times: dict[str, list[float]] = {k: [] for k in PARTS + LAYERS + BM25_LAYERS + ("fts5_bm25",)}
    clock = time.process_time if inline else time.perf_counter
    parts = Parts(state, clock)
    log = (root / "bench.log").open("a", encoding="utf-8")
    configure_logging("INFO", sink=log)
    prof = cProfile.Profile()
    for embeddings in (True, False):
        config = write_config(root, state, settings(floor, embeddings))
        holder = ConfigHolder(lambda config=config: load_config(config, env={"HOME": str(root)}))
        async with open_memory_service(holder) as svc:
            if inline:
                run_inline(svc, parts.model)
            if embeddings:
                status = await svc.builtin.vector_status()
                if status["pending"]:
                    raise SystemExit(f"vectors missing: {status}")
            tokens = {z: (await svc.mint_run_token(harness=f"h{z:02d}", run_id=f"live{z}"))["token"]
                      for z in range(REPOS)}
            for z, q in queries[:10]:  # warm-up: the model loads, the tables are in the page cache
                await svc.recall(query=f"warm {q}", repo=repo(z), limit=LIMIT)
            for z, q in queries[10:]:
                scope = scope_for(repo(z))
                if embeddings:
                    parts.time_all(times, z, q)
                else:
                    times["fts5_bm25"].append(parts.fts5(z, q))
                suffix = "" if embeddings else "_bm25"
                t = clock()
                await svc.builtin.recall({"query": ask(q, "provider"), "scope": [scope], "limit": 2 * LIMIT})
                times["provider" + suffix].append(clock() - t)
                if embeddings:
                    t = clock()
                    await provider_call(svc.session.address, "memory_recall",
                                        {"query": ask(q, "session"), "scope": [scope], "limit": 2 * LIMIT})
                    times["session"].append(clock() - t)
                t = clock()
                view = await svc.caller_view(tokens[z])
                await svc.agent_recall(view, query=ask(q, "agent"), limit=LIMIT, call_id="bench")
                times["agent" + suffix].append(clock() - t)
                if embeddings:
                    t = clock()  # the same question again: its vector is cached
                    view = await svc.caller_view(tokens[z])
                    await svc.agent_recall(view, query=ask(q, "agent"), limit=LIMIT, call_id="bench")
                    times["agent_again"].append(clock() - t)
                t = clock()
                await svc.recall(query=ask(q, "operator"), repo=repo(z), limit=LIMIT)
                times["operator" + suffix].append(clock() - t)
            if embeddings:
                for z, q in queries[10:10 + profiled]:
                    prof.enable()
                    view = await svc.caller_view(tokens[z])
                    await svc.agent_recall(view, query=ask(q, "profiled"), limit=LIMIT, call_id="bench")
                    prof.disable()
    parts.close()
    if profiled:
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


async def measure_daemon(root: Path, state: Path, queries: list[tuple[int, str]], floor: float,
                         embeddings: bool) -> dict[str, dict[str, float]]:
    """Gateway and RPC recall into a `memactors serve` on the store, the parts timed between them."""
    config = write_config(root, state, settings(floor, embeddings))
    suffix = "" if embeddings else "_bm25"
    names = (("d_fts5", "d_knn", "d_embed") if embeddings else ("d_fts5_bm25",)) + (f"gateway{suffix}", f"rpc{suffix}")
    times: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, tuple[float, ...]] = {f"gateway{suffix}": (), f"rpc{suffix}": ()}
    parts = Parts(state)
    async with daemon(root, config, state) as d, AsyncExitStack() as stack:
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        tokens = {z: (await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}", "run_id": f"live{z}"}))
                  ["token"] for z in range(REPOS)}
        clients: dict[int, Any] = {}
        served = 0
        for z, q in queries:
            if z not in clients:
                clients[z] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[z]))
                await clients[z].call_tool("recall", {"query": f"warm {q}", "limit": LIMIT})
            if embeddings:
                times["d_fts5"].append(parts.fts5(z, q))
                times["d_knn"].append(parts.knn(z, q))
                times["d_embed"].append(parts.embed(q))
            else:
                times["d_fts5_bm25"].append(parts.fts5(z, q))
            c, own, t = cpu_s(d["pid"]), time.process_time(), time.perf_counter()
            res = await clients[z].call_tool("recall", {"query": ask(q, "gateway"), "limit": LIMIT})
            times[f"gateway{suffix}"].append(time.perf_counter() - t)
            cpu[f"gateway{suffix}"] += (cpu_s(d["pid"]) - c, time.process_time() - own)
            served += "episode ·" in "".join(getattr(c, "text", "") for c in res.content)
            c, own, t = cpu_s(d["pid"]), time.process_time(), time.perf_counter()
            await control.call(f"{SERVICE}/Recall", {"query": ask(q, "rpc"), "repo": repo(z), "limit": LIMIT})
            times[f"rpc{suffix}"].append(time.perf_counter() - t)
            cpu[f"rpc{suffix}"] += (cpu_s(d["pid"]) - c, time.process_time() - own)
    parts.close()
    out = {k: stats_ms(v) for k, v in times.items()}
    out[f"served{suffix}"] = {"p50": served, "p99": len(queries)}
    for k, v in cpu.items():  # /proc counts in clock ticks: a mean over every call, not a p50
        out[f"cpu_{k}"] = {"daemon": sum(v[0::2]) * 1000 / len(queries), "client": sum(v[1::2]) * 1000 / len(queries)}
    return out


def row(t: dict[str, dict[str, float]], k: str, anchor: float | None = None, label: str = "parts") -> str:
    ratio = f"   {t[k]['p50'] / anchor:5.2f}x {label}" if anchor else ""
    return f"    {k:<14} p50 {t[k]['p50']:>8.2f} ms   p99 {t[k]['p99']:>8.2f} ms{ratio}"


def cpu_note(t: dict[str, Any], k: str) -> str:
    c = t[f"cpu_{k}"]
    return f"   CPU/call: daemon {c['daemon']:.1f} ms, client {c['client']:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--profile", type=int, default=100, help="agent recalls run under cProfile (at most --queries)")
    parser.add_argument("--daemon", action="store_true", help="also time gateway and RPC recall into `memactors serve`")
    parser.add_argument("--floor", type=float, default=0.0,
                        help="[memory] relevance_floor (0: every match served, so answers are not empty)")
    parser.add_argument("--cpu", action="store_true",
                        help="in process only: each call's CPU time, its store reads and query embedding run inline")
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpus in")
    args = parser.parse_args()
    print(machine(), flush=True)
    with embedded_corpus(args.keep, args.size) as (root, state, queries):
        queries = queries[:args.queries + 10]
        res = trio.run(measure, root, state, queries, args.profile, args.floor, args.cpu)
        t = res["times"]
        if args.daemon and not args.cpu:
            t.update(trio.run(measure_daemon, root, state, queries[10:], args.floor, True))
            t.update(trio.run(measure_daemon, root, state, queries[10:], args.floor, False))
        parts = sum(t[k]["p50"] for k in PARTS)
        print(f"{args.size} episodes, {len(queries) - 10} distinct queries, limit {LIMIT}, relevance_floor {args.floor}"
              + (": CPU time per call, reads and embedding inline (--cpu)" if args.cpu else ": wall clock"))
        print(f"  in process, embedded model on:  parts fts5 + knn + embed p50 = {parts:.2f} ms")
        for k in PARTS:
            print(row(t, k))
        for k in LAYERS:
            print(row(t, k, parts))
        bm25 = t["fts5_bm25"]["p50"]
        print(f"  in process, BM25 only ([memory] embeddings = false):  fts5 p50 = {bm25:.2f} ms")
        for k in BM25_LAYERS:
            print(row(t, k, bm25, "fts5"))
        if args.daemon and not args.cpu:
            dparts = sum(t["d_" + k]["p50"] for k in PARTS)
            print(f"  `memactors serve`, embedded model on:  parts (timed between its recalls) p50 = {dparts:.2f} ms"
                  f"  (fts5 {t['d_fts5']['p50']:.2f} + knn {t['d_knn']['p50']:.2f} + embed {t['d_embed']['p50']:.2f});"
                  f" {t['served']['p50']:.0f}/{t['served']['p99']:.0f} gateway answers with episodes")
            print(row(t, "gateway", dparts) + cpu_note(t, "gateway"))
            print(row(t, "rpc", dparts) + cpu_note(t, "rpc"))
            dbm25 = t["d_fts5_bm25"]["p50"]
            print(f"  `memactors serve`, BM25 only:  fts5 (timed between its recalls) p50 = {dbm25:.2f} ms;"
                  f" {t['served_bm25']['p50']:.0f}/{t['served_bm25']['p99']:.0f} gateway answers with episodes")
            print(row(t, "gateway_bm25", dbm25, "fts5") + cpu_note(t, "gateway_bm25"))
            print(row(t, "rpc_bm25", dbm25, "fts5") + cpu_note(t, "rpc_bm25"))
            print("  targets (p50 ratios): gateway and RPC <= 1.5x parts, BM25-only <= 2x fts5;"
                  " gateway with embeddings <= 1.5x gateway BM25-only")
            print(f"    gateway {t['gateway']['p50'] / dparts:.2f}x parts, RPC {t['rpc']['p50'] / dparts:.2f}x parts;"
                  f" gateway BM25-only {t['gateway_bm25']['p50'] / dbm25:.2f}x fts5,"
                  f" RPC BM25-only {t['rpc_bm25']['p50'] / dbm25:.2f}x fts5;"
                  f" gateway embedded / BM25-only {t['gateway']['p50'] / t['gateway_bm25']['p50']:.2f}", flush=True)
        if args.profile:  # `--profile 0`: the timings alone (an empty profile has no stats to print)
            print(f"    per agent recall (cProfile of {args.profile}, trio thread):")
            for label, n in counts(res["profile"], args.profile).items():
                print(f"        {label:<24} {n:5.1f}")
            pstats.Stats(res["profile"]).sort_stats("tottime").print_stats(25)
    print(machine(), flush=True)


if __name__ == "__main__":
    main()
