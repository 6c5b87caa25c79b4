"""What the embedded embedding model costs: episodes embedded per CPU-second on one core, and
the time to embed one query, with the runtime the daemon uses (`memactors.embedding`: all-MiniLM-L6-v2
in onnxruntime, one thread).

    .venv/bin/python bench/embed_speed.py /work/.mirror/encode+httpx/repo     # real episode texts
    .venv/bin/python bench/embed_speed.py --episodes 200 --seconds 5          # shorter, synthetic texts

**Episodes.** With a repository (a clone or a bare git directory), the texts are what the built-in
provider embeds for an episode of each commit (`builtin.embedding_text`: the commit message's words), as `bench/recall_quality.py` records them; without one, synthetic sentences of
10–120 words. They go through `_Model.encode` in batches of `builtin.EMBED_BATCH` (16), as the
background embedder hands them over, each batch cut by `embedding.batches`; also, for comparison,
one text per run, and plain batches of 16 padded to their longest text. The measure is the CPU time
of the embedding thread (`time.thread_time`: what one core gives, whatever else the machine runs),
with the wall time beside it.

**Queries.** The questions of `bench/data/recall_questions.json`, each embedded alone as a recall does
(`LocalEmbedder(query=True)`: a worker thread), after the model is loaded: median and p90 wall time,
and the median CPU time of the embedding itself.

It prints the machine (CPU, cores, load average) and the runtime's versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from memactors import embedding
from memactors.builtin import EMBED_BATCH, embedding_text

QUESTIONS = Path(__file__).resolve().parent / "data" / "recall_questions.json"


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
        isa = "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else "no avx2"
    except (OSError, StopIteration):
        isa = "?"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{platform.platform()}; {cpu} ({isa}) x{os.cpu_count()}; python {sys.version.split()[0]};"
            f" load {load}")


def repo_texts(repo: Path, n: int) -> list[str]:
    out = subprocess.run(["git", "--git-dir" if (repo / "HEAD").is_file() and not (repo / ".git").exists()
                          else "-C", str(repo), "log", "--no-merges", "--name-only", "--format=%x00%B%x01"],
                         capture_output=True, text=True, check=True).stdout
    texts = []
    for chunk in out.split("\0")[1:]:
        message, _, _files = chunk.partition("\x01")
        texts.append(embedding_text("", message.strip(), []))
    random.Random(5).shuffle(texts)
    return texts[:n]


def synthetic_texts(n: int) -> list[str]:
    rng = random.Random(5)
    words = ("retry upload bucket throttle render invoice timezone typo guide parser header proxy timeout "
             "cache token merge branch deploy worker queue index vector commit rebase lint schema socket").split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(10, 120))) for _ in range(n)]


def time_episodes(model: Any, texts: list[str], how: str, min_seconds: float) -> dict[str, Any]:
    """Embed `texts` in batches of EMBED_BATCH, `how` cut, until `min_seconds` of CPU time have passed."""

    def run_batch(batch: list[str]) -> None:
        if how == "batches":
            model.encode(batch)
        elif how == "one":
            for text in batch:
                model.encode([text])
        else:  # padded: the batch whole, padded to its longest text
            model._run([model.tokenizer.encode(t).ids for t in batch])

    done, cpu0, wall0 = 0, time.thread_time(), time.perf_counter()
    while time.thread_time() - cpu0 < min_seconds:
        for start in range(0, len(texts), EMBED_BATCH):
            run_batch(texts[start:start + EMBED_BATCH])
        done += len(texts)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    return {"how": how, "episodes": done, "per_cpu_second": round(done / cpu, 1), "per_wall_second": round(done / wall, 1),
            "ms_cpu_per_episode": round(cpu / done * 1000, 2)}


async def time_queries(questions: list[str]) -> dict[str, Any]:
    embedder = embedding.LocalEmbedder(query=True)
    model = embedding.shared_model()
    walls, cpus = [], []
    for q in questions:
        started = time.perf_counter()
        await embedder.embed([q])
        walls.append(time.perf_counter() - started)
        cpu0 = time.thread_time()
        model.encode([q])
        cpus.append(time.thread_time() - cpu0)
    walls.sort()
    return {"queries": len(walls), "median_ms": round(statistics.median(walls) * 1000, 1),
            "p90_ms": round(walls[int(0.9 * (len(walls) - 1))] * 1000, 1),
            "median_cpu_ms": round(statistics.median(cpus) * 1000, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", type=Path, help="a clone or bare git dir whose commits give the texts")
    parser.add_argument("--episodes", type=int, default=320, help="texts per pass (default 320)")
    parser.add_argument("--seconds", type=float, default=10.0, help="CPU seconds per way of batching (default 10)")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--all", action="store_true", help="also time one text per run and padded batches")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    print("machine:", machine(), flush=True)
    texts = repo_texts(args.repo, args.episodes) if args.repo else synthetic_texts(args.episodes)
    started = time.perf_counter()
    model = embedding.shared_model()
    info = embedding.model_info()
    print(f"model: {info['name']} in {info['runtime']}, loaded in {time.perf_counter() - started:.2f} s wall,"
          f" weights {info['weights_mb']} MB, +{info['load_rss_mb']} MB resident at load", flush=True)
    pieces = [len(model.tokenizer.encode(t).ids) for t in texts]
    print(f"episodes: {len(texts)} texts ({'commits of ' + str(args.repo) if args.repo else 'synthetic'}),"
          f" word pieces median {statistics.median(pieces)}, mean {statistics.mean(pieces):.1f},"
          f" at the {embedding.MAX_TOKENS} cap {sum(p == embedding.MAX_TOKENS for p in pieces)}", flush=True)
    results: dict[str, Any] = {"machine": machine(), "runtime": info, "pieces_mean": round(statistics.mean(pieces), 1),
                               "episodes": []}
    for how in ("batches", "one", "padded") if args.all else ("batches",):
        r = time_episodes(model, texts, how, args.seconds)
        results["episodes"].append(r)
        print(f"  episodes, {how:<8} {r['per_cpu_second']:>6} per CPU-second ({r['ms_cpu_per_episode']} ms each),"
              f" {r['per_wall_second']} per wall second", flush=True)
    questions = [q["query"] for q in json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]][:args.queries]
    results["query"] = trio.run(time_queries, questions)
    q = results["query"]
    print(f"  query embedding: median {q['median_ms']} ms wall (p90 {q['p90_ms']} ms), median {q['median_cpu_ms']} ms"
          f" CPU, {q['queries']} questions", flush=True)
    print(f"  resident after the run: {embedding._rss_bytes() / 1e6:.0f} MB (the whole process)", flush=True)
    print("machine at the end:", machine(), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
