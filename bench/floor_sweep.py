"""Where the relevance floor comes from: the built-in provider's score model, fitted on cached rankings
(issue 38).

    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs /tmp/black --no-changelog --keep /tmp/rq
    .venv/bin/python bench/floor_sweep.py --state /tmp/rq/state-embedded            # figures of the shipped model
    .venv/bin/python bench/floor_sweep.py --state /tmp/rq/state-embedded --fit      # refit, print the weights

Each natural-language question of `recall_quality.py` (the answerable ones and the no-answer ones of
`bench/data/noanswer_questions.json`) is asked once, in-process on the kept store, of the text ranking
and the cosine ranking (`text_candidates`, `knn`) with the words' evidence (`evidence`); then, in pure
Python, the fused order (`ranking.fuse_hybrid`) is filtered by a score and scored: all-questions MRR
(the 266 of `recall_quality.py`'s "all" row) and the share of no-answer questions answered with
nothing. The held-out sets the bench reports in their own rows (`heldout2`, `noanswer_heldout`) are
left out: no fit reads them.

`--fit` fits a logistic model of the five measures `ranking.relevance` uses — coverage, cosine, its
margin over the median of the cosine ranking's best 20, the query's unknown-word share and the
best cosine — on the answers (positive) and the first eight items of the no-answer questions
(negative), classes weighed equally, and prints its weights in raw units (what ranking.py holds) and
its figures at each floor, in-sample and with each half (by a hash of the question) fitted on the
other. Without `--fit`: the shipped model's figures beside no floor.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_quality import LIMIT, load_questions, machine  # noqa: E402

from memactors.builtin import ranking  # noqa: E402

LEFT_OUT = ("heldout2", "noanswer_heldout")
MEASURES = ("coverage", "cosine", "margin", "unknown", "best")


async def collect(state: Path) -> list[dict[str, Any]]:
    """Each question with its fused order and, per item, the five measures."""
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
        for q in load_questions()["questions"]:
            if q["kind"] not in ("same", "other", "none") or q.get("set") in LEFT_OUT:
                continue
            scopes = [scope_for(q["repo"])]
            words = ranking.search_words(q["query"])
            vector = (await embed([q["query"]]))[0]

            def rows(db: Any, words: Sequence[str] = words, scopes: Sequence[str] = scopes,
                     vector: list[float] = vector) -> list[tuple[str, list[float]]]:
                text = index.text_candidates(db, words, scopes, LIMIT, ranking.FUSE_DEPTH) if words else []
                cosine = index.knn(db, vector, scopes)
                candidates = [*text, *cosine[:ranking.FUSE_DEPTH]]
                evidence = index.evidence(db, words, scopes, [h.doc_id for h in candidates], vectors=True)
                embedded = {h.episode_id for h in candidates if h.doc_id in evidence.vectored}
                hits = {h.episode_id: h for h in cosine} | {h.episode_id: h for h in text}
                fused = ranking.fuse_hybrid(text, cosine, embedded)
                order = ranking.rank(fused, {e: h.started_at for e, h in hits.items()}, len(fused))
                covered = ranking.coverage(evidence)
                sims = [h.score for h in cosine]
                similarity = {h.episode_id: h.score for h in cosine}
                unknown = ranking.unknown_share(evidence)
                best = sims[0] if sims else 0.0
                items = []
                for e in order:
                    c = similarity.get(e, sims[-1] if sims else 0.0)
                    # the margin as ranking.relevance measures it: over the median of the others
                    median = statistics.median(ranking._others(sims[:ranking.FUSE_DEPTH], c)) if sims else 0.0
                    items.append((runs.get(e, "?"), [covered.get(hits[e].doc_id, 0.0), c, c - median, unknown, best]))
                return items

            out.append({**q, "items": await store.read(rows)})
    finally:
        store.close()
    return out


def figures(questions: list[dict[str, Any]], keep: Callable[[list[float]], bool]) -> tuple[float, float]:
    """(all-questions MRR, share of no-answer questions answered with nothing) with the items `keep`s."""
    mrr: list[float] = []
    nothing: list[float] = []
    for q in questions:
        served = [run for run, x in q["items"] if keep(x)][:LIMIT]
        if q["kind"] == "none":
            nothing.append(0.0 if served else 1.0)
        else:
            mrr.append(next((1 / i for i, run in enumerate(served, 1) if run in q["answers"]), 0.0))
    return statistics.mean(mrr), statistics.mean(nothing)


def fit(rows: list[tuple[list[float], int]], l2: float = 0.01, steps: int = 3000) -> tuple[list[float], float]:
    """Logistic regression by gradient descent on standardised measures, the two classes weighed
    equally; weights returned in raw units."""
    import numpy as np

    x = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    mu, sd = x.mean(0), x.std(0) + 1e-9
    z = (x - mu) / sd
    weight = np.where(y == 1, 1.0, (y == 1).sum() / max(1, (y == 0).sum()))
    w, b = np.zeros(z.shape[1]), 0.0
    for _ in range(steps):
        g = (1 / (1 + np.exp(-(z @ w + b))) - y) * weight
        w -= 0.1 * (z.T @ g / len(y) + l2 * w)
        b -= 0.1 * float(g.mean())
    raw = w / sd
    return [float(v) for v in raw], float(b - (w * mu / sd).sum())


def training(questions: list[dict[str, Any]]) -> list[tuple[list[float], int]]:
    rows = []
    for q in questions:
        for run, x in q["items"][:LIMIT]:
            if q["kind"] == "none":
                rows.append((x, 0))
            elif run in q["answers"]:
                rows.append((x, 1))
    return rows


def score(weights: Sequence[float], bias: float) -> Callable[[list[float]], float]:
    return lambda x: 1 / (1 + math.exp(-(bias + sum(w * v for w, v in zip(weights, x, strict=True)))))


def half(q: dict[str, Any]) -> int:
    return hashlib.sha256(q["query"].encode()).digest()[0] % 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", required=True, type=Path, help="a `recall_quality.py --keep` state directory")
    parser.add_argument("--fit", action="store_true", help="refit the model and sweep the floor")
    args = parser.parse_args()
    questions = trio.run(collect, args.state)
    print(f"machine: {machine()}; {sum(q['kind'] != 'none' for q in questions)} answerable, "
          f"{sum(q['kind'] == 'none' for q in questions)} no-answer questions")
    mrr, nothing = figures(questions, lambda x: True)
    print(f"no floor: MRR {mrr:.3f}, answered with nothing {nothing:.0%}")
    shipped = [ranking.W_COVERAGE, ranking.W_COSINE, ranking.W_MARGIN, ranking.W_UNKNOWN, ranking.W_BEST]
    s = score(shipped, ranking.RELEVANCE_BIAS)
    mrr, nothing = figures(questions, lambda x: s(x) >= ranking.RELEVANCE_FLOOR)
    print(f"shipped model, floor {ranking.RELEVANCE_FLOOR}: MRR {mrr:.3f}, answered with nothing {nothing:.0%}")
    if not args.fit:
        return
    weights, bias = fit(training(questions))
    print("fitted:", ", ".join(f"{m} {w:.2f}" for m, w in zip(MEASURES, weights, strict=True)), f"bias {bias:.2f}")
    halves = [fit(training([q for q in questions if half(q) != h])) for h in (0, 1)]
    for floor in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6):
        s = score(weights, bias)
        mrr, nothing = figures(questions, lambda x, s=s, floor=floor: s(x) >= floor)
        cv_mrr, cv_nothing = 0.0, 0.0
        for h in (0, 1):
            part = [q for q in questions if half(q) == h]
            sh = score(*halves[h])
            m, n = figures(part, lambda x, sh=sh, floor=floor: sh(x) >= floor)
            cv_mrr += m * sum(q["kind"] != "none" for q in part)
            cv_nothing += n * sum(q["kind"] == "none" for q in part)
        cv_mrr /= sum(q["kind"] != "none" for q in questions)
        cv_nothing /= sum(q["kind"] == "none" for q in questions)
        print(f"floor {floor:.2f}: MRR {mrr:.3f}, nothing {nothing:.0%} | each half fitted on the other:"
              f" MRR {cv_mrr:.3f}, nothing {cv_nothing:.0%}")


if __name__ == "__main__":
    main()
