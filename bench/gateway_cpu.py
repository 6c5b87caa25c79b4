"""The daemon's CPU per gateway `recall` call, and where it goes.

    .venv/bin/python bench/gateway_cpu.py --keep /tmp/corpora                       # this tree, 200 calls
    .venv/bin/python bench/gateway_cpu.py --keep /tmp/corpora --before /tmp/main/src --rounds 3
    .venv/bin/python bench/gateway_cpu.py --keep /tmp/corpora --profile 200         # cProfile of the daemon

On bench/recall_profile.py's corpus (built there with the same `--keep` and `--size`), a `memactors serve`
with `[memory] relevance_floor = 0` (every recall serves its eight items), one run token, and a real MCP
client (`mcp.Client` over streamable HTTP, the SDK's httpx transport). For each of `--calls` distinct
queries it makes the gateway's `tools/call recall` and then the operator-RPC `Recall` of the same words
(another stop word appended, so the query-vector cache answers neither), and reads the daemon's CPU
time (/proc: user + system, all its threads) around each: the **daemon CPU per call** is a mean over
the calls. The RPC recall does the same recall work without HTTP or MCP, so gateway − RPC is what the
gateway's HTTP and MCP layers cost the daemon beyond the RPC's websocket; then as many `tools/list` calls
(no store read, no actor: the HTTP and MCP layers alone, the least noisy figure on a loaded machine).
It also prints the daemon's CPU per query by thread (the trio thread, trio's worker threads for store
reads and the query's embedding, the others: /proc/PID/task), the wall-clock p50 of both recalls and their ratio to the recall targets' anchor, the parts (raw
FTS5 + the provider's KNN + the model on the query, `recall_profile.Parts`), timed in this process
before each query's recalls while the daemon is idle.

`--before SRC` starts the daemon alternately on another tree's `src` (first on PYTHONPATH) and on this
one, `--rounds` times each, so both are measured in one run under the same load. `--profile N` runs
the daemon under cProfile for N gateway calls alone and prints its functions by own and cumulative time
per call (the trio thread; the store and model threads are not profiled).
"""

from __future__ import annotations

import argparse
import os
import pstats
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_gateway import add_vectors  # noqa: E402
from recall_path import corpus  # noqa: E402
from recall_profile import Parts  # noqa: E402
from user_paths import SERVICE, cpu_s, daemon, gateway_client, machine, repo, write_config  # noqa: E402

from memactors.rpc.client import connect_rpc  # noqa: E402

LIMIT = 8


async def measure(root: Path, state: Path, queries: list[tuple[int, str]], *, src: Path | None = None,
                  profile: Path | None = None, rpc: bool = True, lists: int = 0) -> dict[str, float]:
    """Daemon (and client) CPU ms per gateway call and per RPC call, means over the queries."""
    config = write_config(root, state, "[memory]\nrelevance_floor = 0.0\n")
    gateway = daemon_rpc = client = 0.0
    served = 0
    parts = Parts(state)
    wall: dict[str, list[float]] = {"gateway": [], "rpc": [], "parts": []}
    async with daemon(root, config, state, src=src, profile=profile) as d, AsyncExitStack() as stack:
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        z = queries[0][0]
        token = (await control.call(f"{SERVICE}/MintRunToken", {"harness": f"h{z:02d}", "run_id": f"live{z}"}))["token"]
        mcp = await stack.enter_async_context(gateway_client(d["gateway"], token))
        await mcp.call_tool("recall", {"query": "warm up", "limit": LIMIT})
        await control.call(f"{SERVICE}/Recall", {"query": "warm up", "repo": repo(z), "limit": LIMIT})
        threads_before = thread_cpu(d["pid"])
        for _, q in queries:
            if rpc:  # the parts, timed here between the daemon's recalls (the daemon idle meanwhile)
                wall["parts"].append(parts.fts5(z, q) + parts.knn(z, q) + parts.embed(q))
            c, own, t = cpu_s(d["pid"]), time.process_time(), time.perf_counter()
            res = await mcp.call_tool("recall", {"query": f"{q} from", "limit": LIMIT})
            wall["gateway"].append(time.perf_counter() - t)
            gateway += cpu_s(d["pid"]) - c
            client += time.process_time() - own
            served += "episode ·" in "".join(getattr(c, "text", "") for c in res.content)
            if rpc:
                c, t = cpu_s(d["pid"]), time.perf_counter()
                await control.call(f"{SERVICE}/Recall", {"query": f"{q} into", "repo": repo(z), "limit": LIMIT})
                wall["rpc"].append(time.perf_counter() - t)
                daemon_rpc += cpu_s(d["pid"]) - c
        # The HTTP and MCP layers alone: `tools/list` (no store read, no actor) through the same stack.
        by_thread = {name: (spent - threads_before.get(name, 0.0)) * 1000 / len(queries)
                     for name, spent in thread_cpu(d["pid"]).items()}
        listing = 0.0
        for _ in range(lists or len(queries)) if rpc else ():
            c = cpu_s(d["pid"])
            await mcp.list_tools()
            listing += cpu_s(d["pid"]) - c
    parts.close()
    n = len(queries)
    p50 = {f"{k}_p50": statistics.median(v) * 1000 if v else 0.0 for k, v in wall.items()}
    return {"gateway": gateway * 1000 / n, "rpc": daemon_rpc * 1000 / n, "client": client * 1000 / n,
            "served": served / n, "list": listing * 1000 / (lists or n), **p50,
            **{f"thread {name}": ms for name, ms in by_thread.items()}}


def thread_cpu(pid: int) -> dict[str, float]:
    """The daemon's CPU seconds so far by kind of thread (/proc/PID/task): `trio` (the main thread, the
    event loop), `workers` (trio's worker threads: store reads, the query's embedding), `other` (the
    model's intra-op pool, the background embedder, ...)."""
    out = {"trio": 0.0, "workers": 0.0, "other": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = "trio" if task.name == str(pid) else "workers" if name.startswith("Trio thread") else "other"
        out[kind] += (int(fields[11]) + int(fields[12])) / tick
    return out


def show(label: str, r: dict[str, float]) -> str:
    return (f"  {label:<8} daemon CPU per call: gateway {r['gateway']:6.2f} ms, RPC {r['rpc']:6.2f} ms,"
            f" gateway - RPC {r['gateway'] - r['rpc']:6.2f} ms; client {r['client']:5.2f} ms;"
            f" {r['served']:.0%} answers with episodes; tools/list {r['list']:5.2f} ms"
            + (f"\n           wall p50: gateway {r['gateway_p50']:6.2f} ms, RPC {r['rpc_p50']:6.2f} ms; parts (fts5 + knn +"
               f" embed, timed between them) {r['parts_p50']:5.2f} ms: gateway {r['gateway_p50'] / r['parts_p50']:4.2f}x,"
               f" RPC {r['rpc_p50'] / r['parts_p50']:4.2f}x parts" if r.get("parts_p50") else "")
            + ("\n           daemon CPU per query (its gateway and RPC recall together) by thread: "
               + ", ".join(f"{k[7:]} {v:.2f} ms" for k, v in r.items() if k.startswith("thread ")) if r.get("parts_p50") else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before", type=Path, help="another tree's src, measured alternately with this one")
    parser.add_argument("--lists", type=int, default=0, help="tools/list calls per daemon (default: --calls)")
    parser.add_argument("--profile", type=int, default=0, help="gateway calls made to a daemon under cProfile")
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpus in")
    args = parser.parse_args()
    logger.remove()
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        state, queries, _ = corpus(root, args.size)
        if not (state / "vectors.done").exists():
            add_vectors(state)
            (state / "vectors.done").write_text("ok")
        z = queries[0][0]
        mine = [(z, q) for zz, q in queries if zz == z][:args.calls] or queries[:args.calls]
        print(f"{args.size} episodes, {len(mine)} distinct recalls of repository r{z:02d} per daemon, limit {LIMIT},"
              " relevance_floor 0, embedded model on", flush=True)
        trees = [("before", args.before), ("this", None)] if args.before else [("this", None)]
        for _ in range(args.rounds):
            for label, src in trees:
                print(show(label, trio.run(partial_measure, root, state, mine, src, args.lists)) + f"  [{machine()}]", flush=True)
        if args.profile:
            out = (args.keep or Path(tmp)) / "daemon.prof"
            calls = mine[:args.profile]
            r = trio.run(lambda: measure(root, state, calls, profile=out, rpc=False))
            print(show("profiled", r), flush=True)
            stats = pstats.Stats(str(out))
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
    print(machine(), flush=True)
    print(f"(bench run by pid {os.getpid()})")


async def partial_measure(root: Path, state: Path, queries: list[tuple[int, str]], src: Path | None,
                          lists: int) -> dict[str, float]:
    return await measure(root, state, queries, src=src, lists=lists)


if __name__ == "__main__":
    main()
