"""Which fusion of the text and cosine rankings answers best: a sweep over cached rankings.

    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs /tmp/black --no-changelog --keep /tmp/rq
    .venv/bin/python bench/fusion_sweep.py /tmp/httpx /tmp/attrs /tmp/black --state /tmp/rq/state-embedded

`recall_quality.py --keep` leaves a state directory whose store holds the three projects' episodes and
their vectors (the embedded model's). This script asks every natural-language question of
`recall_quality.py` once of each ranking, in-process on that store — the text ranking (BM25, with its
scores, as the built-in provider's `text_candidates` finds them) and the cosine ranking (the query's
vector from the embedded model, `knn`, with distances) — and then scores each fusion method on those
two lists, in pure Python: hundreds of variants in seconds, on the same questions and groups as the
gateway bench (MRR per group, the tune and check halves apart). Path questions are not swept: with
`paths` the path ranking is decisive and the fusion only breaks ties.

The gateway figures are `recall_quality.py`'s; this is where the method it runs was chosen.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_quality import (  # noqa: E402
    HOLDOUT,
    LIMIT,
    Repo,
    group,
    half,
    load_questions,
    machine,
    read_commits,
)

from memactors.builtin import ranking  # noqa: E402

Ranked = list[tuple[str, float]]  # (run id, score), best first


async def collect(repos: list[Repo], questions: list[dict[str, Any]], state: Path) -> list[dict[str, Any]]:
    """Each question with its text ranking and its cosine ranking: (run id, `Hit.score`), best first."""
    from memactors.builtin.index_sqlite import SqliteIndex
    from memactors.embedding import LocalEmbedder
    from memactors.repo import scope_for
    from memactors.store.engines import open_store

    store = await open_store(state / "memactors.db")
    index = SqliteIndex()
    embed = LocalEmbedder(query=True).embed
    out = []
    try:
        runs = await store.read(lambda db: dict(db.execute("SELECT episode_id, run_id FROM episodes").fetchall()))
        for q in questions:
            scopes = [scope_for(q["repo"])]
            words = ranking.search_words(q["query"])

            def text(db: Any, words: Sequence[str] = words, scopes: Sequence[str] = scopes) -> Ranked:
                hits = index.text_candidates(db, words, scopes, LIMIT, ranking.CANDIDATES) if words else []
                return [(runs.get(h.episode_id, "?"), h.score) for h in hits]  # the scores the fusion reads

            vector = (await embed([q["query"]]))[0]

            def cosine(db: Any, scopes: Sequence[str] = scopes, vector: list[float] = vector) -> Ranked:
                return [(runs.get(h.episode_id, "?"), h.score) for h in index.knn(db, vector, scopes)]

            out.append({**q, "text": await store.read(text), "cosine": await store.read(cosine)})
    finally:
        store.close()
    return out


# -- fusion methods: (text, cosine) -> run ids, best first ---------------------------------------------

def rrf(depth: int, k: int = 60, wt: float = 1.0, wc: float = 1.0) -> Callable[[Ranked, Ranked], list[str]]:
    def fuse(text: Ranked, cos: Ranked) -> list[str]:
        score: dict[str, float] = {}
        for w, ranked in ((wt, text), (wc, cos)):
            for r, (run, _) in enumerate(ranked[:depth], 1):
                score[run] = score.get(run, 0.0) + w / (k + r)
        return sorted(score, key=lambda run: -score[run])
    return fuse


def convex(depth: int, alpha: float) -> Callable[[Ranked, Ranked], list[str]]:
    """alpha × min-max normalised BM25 + (1 − alpha) × min-max normalised cosine, over the union."""
    def norm(ranked: Ranked) -> dict[str, float]:
        if not ranked:
            return {}
        vals = [s for _, s in ranked]
        lo, hi = min(vals), max(vals)
        return {run: (s - lo) / (hi - lo) if hi > lo else 1.0 for run, s in ranked}

    def fuse(text: Ranked, cos: Ranked) -> list[str]:
        t, c = norm(text[:depth]), norm(cos[:depth])
        keys = list(dict.fromkeys([*t, *c]))
        return sorted(keys, key=lambda run: -(alpha * t.get(run, 0.0) + (1 - alpha) * c.get(run, 0.0)))
    return fuse


def only(which: str) -> Callable[[Ranked, Ranked], list[str]]:
    return lambda text, cos: [run for run, _ in (text if which == "text" else cos)]


def text_first(n: int, inner: Callable[[Ranked, Ranked], list[str]]) -> Callable[[Ranked, Ranked], list[str]]:
    """The text ranking's first `n` kept in place, the rest by `inner`."""
    def fuse(text: Ranked, cos: Ranked) -> list[str]:
        head = [run for run, _ in text[:n]]
        return list(dict.fromkeys([*head, *inner(text, cos)]))
    return fuse


def gated(ratio: float, inner: Callable[[Ranked, Ranked], list[str]]) -> Callable[[Ranked, Ranked], list[str]]:
    """The text ranking's first hit kept first when it scores `ratio` times its second (or is alone)."""
    def fuse(text: Ranked, cos: Ranked) -> list[str]:
        confident = len(text) == 1 or (len(text) > 1 and text[1][1] > 0 and text[0][1] >= ratio * text[1][1])
        head = [text[0][0]] if confident else []
        return list(dict.fromkeys([*head, *inner(text, cos)]))
    return fuse


def shipped(text: Ranked, cos: Ranked) -> list[str]:
    """What recall runs: `ranking.fuse_hybrid` (the best of a gate and a score blend, chosen here)."""
    def hits(ranked: Ranked) -> list[ranking.Hit]:
        return [ranking.Hit(run, n, "", value) for n, (run, value) in enumerate(ranked)]

    fused = ranking.fuse_hybrid(hits(text), hits(cos))
    return sorted(fused, key=lambda run: -fused[run])


def score(questions: list[dict[str, Any]], fuse: Callable[[Ranked, Ranked], list[str]]) -> dict[str, float]:
    rr: dict[str, list[float]] = {}
    for q in questions:
        order = fuse(q["text"], q["cosine"])[:LIMIT]
        rank = next((i + 1 for i, run in enumerate(order) if run in q["answers"]), None)
        value = 1 / rank if rank else 0.0
        g = group(q)
        for key in (g, f"{g} · {half(q)}", "all"):
            rr.setdefault(key, []).append(value)
    return {k: statistics.fmean(v) for k, v in rr.items()}


METHODS: dict[str, Callable[[Ranked, Ranked], list[str]]] = {
    "bm25 only": only("text"), "cosine only": only("cosine"),
    **{f"rrf top{d}": rrf(d) for d in (10, 20, 50)},
    **{f"rrf top20 wt{wt}": rrf(20, wt=wt) for wt in (1.5, 2.0, 3.0)},
    **{f"convex top{d} a{a}": convex(d, a) for d in (20, 50) for a in (0.3, 0.4, 0.5, 0.6, 0.7)},
    **{f"text{n} + rrf top20": text_first(n, rrf(20)) for n in (1, 2)},
    **{f"text1 + convex top20 a{a}": text_first(1, convex(20, a)) for a in (0.3, 0.5)},
    **{f"gate{r} convex top{d} a{a}": gated(r, convex(d, a)) for r in (1.05, 1.2, 1.3, 1.5) for d in (20, 50)
       for a in (0.4, 0.5)},
    **{f"gate{r} rrf top20": gated(r, rrf(20)) for r in (1.2, 1.3)},
    "fuse_hybrid (main)": shipped,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="clones of the repositories, in the data file's order")
    parser.add_argument("--state", required=True, help="recall_quality.py --keep's state-embedded directory")
    parser.add_argument("--cache", help="keep the two rankings of every question in this JSON file (and reuse it)")
    args = parser.parse_args()
    data = load_questions(changelog=False)
    repos = [Repo(key, spec["branch"], path) for (key, spec), path in zip(data["repos"].items(), args.paths, strict=False)]
    given = {r.key for r in repos}
    # Not the second and third held-out sets: they check the method this sweep chose, so no sweep reads them.
    questions = [q for q in data["questions"] if q["repo"] in given and q["kind"] in ("same", "other")
                 and q.get("set") not in ("heldout2", "heldout3")]
    for r in repos:
        r.commits = read_commits(r.path)[:-HOLDOUT]
    cache = Path(args.cache) if args.cache else None
    if cache and cache.exists():
        cached = json.loads(cache.read_text(encoding="utf-8"))
    else:
        cached = trio.run(collect, repos, questions, Path(args.state))
        if cache:
            cache.write_text(json.dumps(cached), encoding="utf-8")
    print(f"machine: {machine()}; {len(cached)} questions")
    results = {name: score(cached, fuse) for name, fuse in METHODS.items()}
    keys = sorted({k for r in results.values() for k in r}, key=lambda k: (k != "all", k))
    print(f"{'method':28}" + "".join(f" {k[:22]:>22}" for k in keys))
    for name, r in results.items():
        print(f"{name:28}" + "".join(f" {r.get(k, float('nan')):>22.3f}" for k in keys))


if __name__ == "__main__":
    main()
