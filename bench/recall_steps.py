"""What each step of one recall costs in CPU, without a profiler's inflation.

    .venv/bin/python bench/recall_steps.py --keep DIR                # recall_profile's 10k corpus in DIR
    .venv/bin/python bench/recall_steps.py --keep DIR --queries 100 --size 1000

cProfile inflates a recall ~2.5× and unevenly (a Python-heavy step more than an SQLite-heavy one), so
its shares mislead about where to cut. This bench runs recall_profile's corpus (built there with the
same `--keep` and `--size`; `relevance_floor = 0`, so every answer serves its eight items) with the
store reads and the query's embedding inline on the trio thread (`recall_profile --cpu`), wraps the
recall's steps (the ranking's probes and reads, the fusion, the item texts, REQ-9's re-check, the facts,
the document) in a CPU-time counter, and prints each step's CPU per recall (p50 over the queries) for
the provider (`BuiltinProvider.recall`) and the agent layer (`caller_view` + `agent_recall`), with the
embedded model on and with `[memory] embeddings = false`.

Then, around a provider that answers a stored 16-item answer at once (the same items every time), it
times what the layers above the provider cost by themselves: **transport** (`provider_call`: the
provider session actor, the contract checks, REQ-11's in-process MCP client and server) and **above
provider** (everything the agent layer adds: the token's read, the briefing actor, the transport,
REQ-9's re-check of 16 items, the facts, the near-duplicate collapse, the document, the log line).
It prints the machine and its load first and last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_profile import LIMIT, Parts, ask, embedded_corpus, run_inline, settings  # noqa: E402
from user_paths import REPOS, machine, repo, write_config  # noqa: E402

import memactors.actors.briefing as briefing_module  # noqa: E402
import memactors.builtin as builtin_module  # noqa: E402
from memactors.actors.provider_session import provider_call  # noqa: E402
from memactors.builtin import index_of  # noqa: E402
from memactors.config import ConfigHolder, load_config  # noqa: E402
from memactors.logs import configure_logging  # noqa: E402
from memactors.repo import scope_for  # noqa: E402
from memactors.service import open_memory_service  # noqa: E402

#: The steps counted: (owner, attribute). A `DocIndex`'s are static methods of its class.
INDEX_STEPS = ("metadata_only", "text_candidates", "knn", "evidence")
PROVIDER_STEPS = ("fuse_hybrid", "relevance_scores", "item_texts")
BRIEFING_STEPS = ("filter_items", "search_facts", "collapse_episodes", "fit_recall", "render_text", "render_json")


class Steps:
    """CPU seconds spent in each wrapped step since the last `reset`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def reset(self) -> None:
        self.spent = {}

    def counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.process_time() - t
        return timed

    def wrap(self, index: Any) -> None:
        cls = type(index)
        for name in INDEX_STEPS:
            setattr(cls, name, staticmethod(self.counted(name, cls.__dict__[name].__func__)))
        for name in PROVIDER_STEPS:
            setattr(builtin_module, name, self.counted(name, getattr(builtin_module, name)))
        for name in BRIEFING_STEPS:
            setattr(briefing_module, name, self.counted(name, getattr(briefing_module, name)))


async def measure(root: Path, state: Path, queries: list[tuple[int, str]], embeddings: bool,
                  steps: Steps) -> dict[str, dict[str, list[float]]]:
    parts = Parts(state, time.process_time)
    config = write_config(root, state, settings(0.0, embeddings))
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(root)}))
    out: dict[str, dict[str, list[float]]] = {"provider": {}, "agent": {}, "parts": {}}
    async with open_memory_service(holder) as svc:
        run_inline(svc, parts.model)
        tokens = {z: (await svc.mint_run_token(harness=f"h{z:02d}", run_id=f"live{z}"))["token"] for z in range(REPOS)}
        for z, q in queries[:10]:  # warm-up
            await svc.recall(query=f"warm {q}", repo=repo(z), limit=LIMIT)
        for z, q in queries[10:]:
            scope = scope_for(repo(z))
            if embeddings:
                for name, t in (("fts5", parts.fts5(z, q)), ("knn", parts.knn(z, q)), ("embed", parts.embed(q))):
                    out["parts"].setdefault(name, []).append(t)
            else:
                out["parts"].setdefault("fts5", []).append(parts.fts5(z, q))
            for layer in ("provider", "agent"):
                steps.reset()
                t = time.process_time()
                if layer == "provider":
                    await svc.builtin.recall({"query": ask(q, "provider"), "scope": [scope], "limit": 2 * LIMIT})
                else:
                    view = await svc.caller_view(tokens[z])
                    await svc.agent_recall(view, query=ask(q, "agent"), limit=LIMIT, call_id="bench")
                total = time.process_time() - t
                for name in (*INDEX_STEPS, *PROVIDER_STEPS, *BRIEFING_STEPS):
                    out[layer].setdefault(name, []).append(steps.spent.get(name, 0.0))
                out[layer].setdefault("TOTAL", []).append(total)
    parts.close()
    return out


async def above_provider(root: Path, state: Path, calls: int) -> dict[str, list[float]]:
    """The layers above the provider alone: the provider answers a stored 16-item answer at once."""
    parts = Parts(state, time.process_time)
    config = write_config(root, state, settings(0.0, True))
    holder = ConfigHolder(lambda: load_config(config, env={"HOME": str(root)}))
    out: dict[str, list[float]] = {"transport": [], "above provider": []}
    async with open_memory_service(holder) as svc:
        run_inline(svc, parts.model)
        scope = scope_for(repo(0))
        stored = await svc.builtin.recall({"query": "fix the failing test", "scope": [scope], "limit": 2 * LIMIT})

        async def answer(args: dict[str, Any]) -> dict[str, Any]:
            return {"items": [dict(item) for item in stored["items"]]}

        svc.builtin.recall = answer  # type: ignore[method-assign]
        token = (await svc.mint_run_token(harness="h00", run_id="live0"))["token"]
        args = {"query": "fix the failing test", "scope": [scope], "limit": 2 * LIMIT}
        for i in range(calls + 20):
            t = time.process_time()
            await provider_call(svc.session.address, "memory_recall", args)
            spent = time.process_time() - t
            t = time.process_time()
            view = await svc.caller_view(token)
            await svc.agent_recall(view, query="fix the failing test", limit=LIMIT, call_id="bench")
            if i >= 20:  # the first ones warm the caches
                out["transport"].append(spent)
                out["above provider"].append(time.process_time() - t)
    parts.close()
    return out


def p50(v: list[float]) -> float:
    return statistics.median(v) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--calls", type=int, default=300, help="calls around the stored answer")
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpus in")
    args = parser.parse_args()
    print(machine(), flush=True)
    with embedded_corpus(args.keep, args.size) as (root, state, queries):
        queries = queries[:args.queries + 10]
        log = (root / "bench.log").open("a", encoding="utf-8")
        configure_logging("INFO", sink=log)
        steps = Steps()
        steps.wrap(index_of("sqlite"))  # once: both services' providers use the engine's one index
        print(f"{args.size} episodes, {len(queries) - 10} distinct queries, limit {LIMIT} (the provider asked for"
              f" {2 * LIMIT}), relevance_floor 0; CPU ms per recall, p50, reads and the query's embedding inline")
        for embeddings in (True, False):
            res = trio.run(measure, root, state, queries, embeddings, steps)
            label = "embedded model on" if embeddings else "BM25 only ([memory] embeddings = false)"
            print(f"  {label}: parts " + ", ".join(f"{k} {p50(v):.2f}" for k, v in res["parts"].items()))
            print(f"    {'step':<20} {'provider':>9} {'agent':>9}")
            for name in ("TOTAL", *INDEX_STEPS, *PROVIDER_STEPS, *BRIEFING_STEPS):
                cells = [f"{p50(res[layer][name]):9.3f}" if any(res[layer][name]) else f"{'-':>9}"
                         for layer in ("provider", "agent")]
                print(f"    {name:<20} {' '.join(cells)}")
        res2 = trio.run(above_provider, root, state, args.calls)
        print(f"  around a provider answering a stored {2 * LIMIT}-item answer at once ({args.calls} calls):")
        for name, v in res2.items():
            print(f"    {name:<20} p50 {p50(v):6.3f} ms  mean {statistics.mean(v) * 1000:6.3f} ms")
        logger.remove()
        log.close()
    print(machine(), flush=True)


if __name__ == "__main__":
    main()
