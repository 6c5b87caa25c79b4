"""Where the relevance floor comes from: the built-in provider's score model, fitted on cached rankings.

    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs /tmp/black --no-changelog --keep /tmp/rq
    .venv/bin/python bench/floor_sweep.py --state /tmp/rq/state-embedded            # figures of the shipped model
    .venv/bin/python bench/floor_sweep.py --state /tmp/rq/state-embedded --fit      # refit, sweep, print
    .venv/bin/python bench/floor_sweep.py --state /tmp/rq/state-embedded --newest 0.3,0.5,0.8  # while filling

Each natural-language question of `recall_quality.py` (the answerable ones and the no-answer ones of
`bench/data/noanswer_questions.json` and `bench/data/noanswer_heldout.json`) is asked once, in-process on
the kept store, of the text ranking and the cosine ranking (`text_candidates`, `knn`) with the words'
evidence (`evidence`); then, in pure Python, what the built-in provider's recall does with them:
`ranking.fuse_hybrid`'s order filtered by `ranking.relevance_scores` at the floor. Figures: all-questions
MRR (the 266 of `recall_quality.py`'s "all" row) and the share of each no-answer set answered with
nothing. The sets no fit reads are left out (`UNREAD`: the other-words sets written after the fusion
was chosen and the latest blind no-answer set; with `--fit`, the blind no-answer sets 2 and 3 too).

`--fit` fits the item model `ranking.item_logit` uses — a logistic regression of coverage, cosine, its
margin over the median of the cosine ranking's best 20, the query's unknown-word share and the best
cosine, on the answers (positive) and the first eight items of the no-answer questions (negative), the
classes weighed equally — prints its weights in raw units (what ranking.py holds), then the floor and
ANSWER_WEIGHT swept with those weights, in-sample and with each of five folds (by a hash of the
question) judged by the model fitted on the other four.

`--by-set`: every no-answer set in (the blind ones too), each judged by the model fitted on the other
three and on the answerable questions of three of four folds (the fourth judged by it): leave one
writer's set out, the check the blind sets make. `--extra NAME,...` adds question-level candidate
measures to the item model for `--fit` / `--by-set` (`EXTRAS`: each a signal that was tried for the
blind sets and did not separate them; docs/benchmarks.md has the figures).

`--tail T,...`: a two-level floor with the shipped model — an answer served only when one of its items
clears the shipped floor (the gate), then every item scoring at least T — against the one floor per
item the provider applies: MRR (all questions, the blind answerable sets), items served per answerable
question, the no-answer shares, and where the floor's MRR goes (answerable questions the gate answers
with nothing, against items dropped below a stronger one). With `--by-set`, the tails also at its
model floor BY_SET_GATE. Measured once (docs/benchmarks.md, "Sixth pass"): the tail wins nothing, as
nearly all of the loss is answerable questions answered with nothing.

`--newest P,...`: the same questions as if only the newest share P of each repository's episodes had
their vector (the back-fill's order: newest doc ids first), against BM25 alone (no vector at all), per
question set: the offline check of "never below BM25 while the vectors fill in".
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
import statistics
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_quality import LIMIT, load_questions, machine  # noqa: E402

from memactors.builtin import RECALL_EMBED, ranking  # noqa: E402
from memactors.builtin.ranking import Evidence, Hit  # noqa: E402

#: The sets no fit reads, `--by-set` included: the other-words sets written after the fusion was chosen
#: and the fifth no-answer set (recall_quality.py's blind rows).
UNREAD = ("heldout2", "heldout3", "noanswer_heldout4")
LEFT_OUT = (*UNREAD, "noanswer_heldout2", "noanswer_heldout3")
NO_ANSWER = ("noanswer", "noanswer_heldout", "noanswer_heldout2", "noanswer_heldout3")
MEASURES = ("coverage", "cosine", "margin", "unknown", "best")
WEIGHTS = ("W_COVERAGE", "W_COSINE", "W_MARGIN", "W_UNKNOWN", "W_BEST")
FOLDS = 5
#: Cosine candidates kept per question for `--newest` (the newest share's best must be among them, and
#: every text candidate a recall embeds: more than the largest scope holds).
DEEP = 2500


async def collect(state: Path, deep: bool, left_out: Sequence[str] = LEFT_OUT,
                  residual: bool = False) -> list[dict[str, Any]]:
    """Each question with its text and cosine rankings and the words' evidence over their hits; with
    `residual`, also the cosine of the query less the words its best candidate holds to that candidate
    (`q["residual"]`, the `residual` extra measure)."""
    from memactors.builtin import doc_digest, index_sqlite
    from memactors.builtin.index_sqlite import SqliteIndex
    from memactors.embedding import BUILTIN_MODEL, LocalEmbedder
    from memactors.repo import scope_for
    from memactors.store.engines import open_store

    if deep:
        index_sqlite.CANDIDATES = DEEP  # type: ignore[attr-defined]
    store = await open_store(state / "memactors.db")
    index = SqliteIndex()
    # a store kept by an older build is upgraded as the provider does at start (int8 vectors stored once)
    await store.write(lambda db: index.check_vectors(db, BUILTIN_MODEL, doc_digest))
    embed = LocalEmbedder(query=True).embed
    out = []
    try:
        runs = await store.read(lambda db: dict(db.execute("SELECT episode_id, run_id FROM episodes").fetchall()))
        for q in load_questions()["questions"]:
            if q["kind"] not in ("same", "other", "none") or q.get("set") in left_out:
                continue
            scopes = [scope_for(q["repo"])]
            words = ranking.search_words(q["query"])
            vector = (await embed([q["query"]]))[0]

            def rows(db: Any, words: Sequence[str] = words, scopes: Sequence[str] = scopes,
                     vector: list[float] = vector) -> dict[str, Any]:
                text = index.text_candidates(db, words, scopes, LIMIT, ranking.FUSE_DEPTH) if words else []
                cosine = index.knn(db, vector, scopes)
                hits = [*text, *(cosine if deep else cosine[:ranking.FUSE_DEPTH])]
                evidence = index.evidence(db, words, scopes, [h.doc_id for h in hits], vectors=True)
                return {"text": text, "cosine": cosine, "evidence": evidence}

            found = await store.read(rows)
            found["runs"] = {h.episode_id: runs.get(h.episode_id, "?") for h in [*found["text"], *found["cosine"]]}
            q = {**q, **found}
            if residual:
                q["residual"] = await residual_cosine(q, embed, lambda db, v, s=scopes: index.knn(db, v, s), store)
            out.append(q)
    finally:
        store.close()
    return out


def best_ids(q: dict[str, Any]) -> tuple[list[str], dict[str, Hit]]:
    """The fused order's first LIMIT ids with no floor (the answer the measures look at), and every hit."""
    ev: Evidence = q["evidence"]
    text, cosine = q["text"], q["cosine"][:ranking.CANDIDATES]
    hits = {h.episode_id: h for h in cosine} | {h.episode_id: h for h in text}
    embedded = {h.episode_id for h in [*text, *cosine[:ranking.FUSE_DEPTH]] if h.doc_id in ev.vectored}
    fused = ranking.fuse_hybrid(text, cosine, embedded) if cosine else {}
    return ranking.rank(fused, {e: h.started_at for e, h in hits.items()}, LIMIT), hits


async def residual_cosine(q: dict[str, Any], embed: Any, knn: Callable[[Any, list[float]], list[Hit]],
                          store: Any) -> float:
    """The cosine, to the best candidate, of the query less the words that candidate holds: whether what
    the candidate does not say in the query's words is still near it in meaning (a paraphrase) or not (a
    detail the store never saw). The candidate's own place's worth when it is beyond the knn's reach."""
    order, hits = best_ids(q)
    if not order:
        return 0.0
    held = q["evidence"].present.get(hits[order[0]].doc_id, frozenset())
    rest = " ".join(w for w in re.findall(r"\w+|[^\w\s]+", q["query"]) if w.lower() not in held)
    vector = (await embed([rest]))[0]
    found: list[Hit] = await store.read(lambda db: knn(db, vector))
    similarity = {h.episode_id: h.score for h in found}
    return similarity.get(order[0], found[-1].score if found else 0.0)


def answer(q: dict[str, Any], floor: float, newest: float | None = None, tail: float | None = None) -> list[str]:
    """The run ids the built-in provider serves for `q` (no paths): its recall's fusion and scores.
    `newest`: as if only the newest share of the scope's episodes had a vector (0: BM25 alone), and the
    recall embedded its text candidates without one (`BuiltinProvider.embed_candidates`: the text
    ranking's best RECALL_EMBED) before the cosine ranking. `tail`: a two-level floor, the one the
    provider does not ship (`--tail`): nothing unless an item scores `floor`, then every item scoring
    at least `tail`."""
    ev: Evidence = q["evidence"]
    text: list[Hit] = q["text"]
    cosine: list[Hit] = q["cosine"]
    vectored: Collection[int] = ev.vectored
    if newest is not None:
        cut = ev.docs * (1 - newest)
        vectored = frozenset(d for d in ev.present if (d & 0xFFFFFFFF) > cut)
        if newest > 0:  # the recall gives its text candidates their vectors
            vectored |= {h.doc_id for h in text[:RECALL_EMBED]}
        cosine = [h for h in cosine if h.doc_id in vectored][:ranking.CANDIDATES]
        ev = Evidence(ev.docs, ev.df, ev.present, frozenset(vectored))
    hits = {h.episode_id: h for h in cosine} | {h.episode_id: h for h in text}
    candidates = [*text, *cosine[:ranking.FUSE_DEPTH]]
    embedded = {h.episode_id for h in candidates if h.doc_id in ev.vectored}
    fused = (ranking.fuse_hybrid(text, cosine, embedded) if cosine
             else ranking.rrf([[h.episode_id for h in text][:ranking.FUSE_DEPTH]] if text else []))
    score = ranking.relevance_scores(hits, ev, cosine, fused.keys(),
                                     filling=bool(cosine) and ranking.embedded_share(text, embedded) < 1)
    order = ranking.rank(fused, {e: h.started_at for e, h in hits.items()}, len(fused))
    if tail is None:
        return [q["runs"][e] for e in order if score[e] >= floor][:LIMIT]
    if not any(score[e] >= floor for e in order):
        return []
    return [q["runs"][e] for e in order if score[e] >= min(tail, floor)][:LIMIT]


def rr(q: dict[str, Any], served: Sequence[str]) -> float:
    return next((1 / i for i, run in enumerate(served, 1) if run in q["answers"]), 0.0)


def is_all(q: dict[str, Any]) -> bool:
    """Whether `q` counts in recall_quality.py's "all natural-language questions" row."""
    return q["kind"] in ("same", "other") and q.get("set") not in UNREAD


def figures(questions: Sequence[dict[str, Any]], floor: float) -> tuple[float, dict[str, float]]:
    """(all-questions MRR, share of each no-answer set answered with nothing) at `floor`."""
    mrr: list[float] = []
    nothing: dict[str, list[float]] = {}
    for q in questions:
        items = served(q, floor)
        if q["kind"] == "none":
            nothing.setdefault(q["set"], []).append(0.0 if items else 1.0)
        elif is_all(q):
            mrr.append(rr(q, items))
    return statistics.mean(mrr), {k: statistics.mean(v) for k, v in nothing.items()}


def line(mrr: float, nothing: dict[str, float]) -> str:
    return f"MRR {mrr:.3f}, nothing " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(nothing.items()))


def missing(q: dict[str, Any]) -> float:
    """The idf of the query's most informative word that the scope holds but none of the answer's best
    LIMIT do, over the idf of its most informative word (0: every word the scope knows is in the answer):
    a detail the repository has seen elsewhere, not with this topic."""
    order, hits = best_ids(q)
    ev: Evidence = q["evidence"]
    weight = {w: ranking.idf(ev.docs, n) for w, n in ev.df.items()}
    held = set().union(*(ev.present.get(hits[e].doc_id, frozenset()) for e in order))
    lacking = [v for w, v in weight.items() if w not in held and ev.df[w] > 0]
    return max(lacking, default=0.0) / max(weight.values(), default=1.0) if weight else 0.0


def agreement(q: dict[str, Any]) -> float:
    """The share of the cosine ranking's best FUSE_DEPTH that the text ranking's best FUSE_DEPTH hold."""
    depth = ranking.FUSE_DEPTH
    return len({h.episode_id for h in q["text"][:depth]} & {h.episode_id for h in q["cosine"][:depth]}) / depth


def gap(q: dict[str, Any]) -> float:
    """The cosine ranking's best similarity less its second's (a match standing out by itself)."""
    sims = [h.score for h in q["cosine"][:2]]
    return sims[0] - sims[1] if len(sims) == 2 else 0.0


#: Question-level candidate measures `--extra` adds to the item model (one value per question, the same
#: for each of its items).
EXTRAS: dict[str, Callable[[dict[str, Any]], float]] = {
    "missing": missing, "agreement": agreement, "gap": gap, "residual": lambda q: float(q["residual"])}


def measures(q: dict[str, Any], extras: Sequence[str] = ()) -> Iterator[tuple[str, list[float]]]:
    """Each of the fused order's first LIMIT items with a vector: (run id, the five measures and the
    `extras`)."""
    more = [EXTRAS[name](q) for name in extras]
    ev: Evidence = q["evidence"]
    text, cosine = q["text"], q["cosine"]
    hits = {h.episode_id: h for h in cosine} | {h.episode_id: h for h in text}
    embedded = {h.episode_id for h in [*text, *cosine[:ranking.FUSE_DEPTH]] if h.doc_id in ev.vectored}
    fused = ranking.fuse_hybrid(text, cosine, embedded) if cosine else {}
    covered = ranking.coverage(ev)
    unknown = ranking.unknown_share(ev)
    sims = [h.score for h in cosine]
    similarity = {h.episode_id: h.score for h in cosine}
    for e in ranking.rank(fused, {e: h.started_at for e, h in hits.items()}, LIMIT):
        if e in similarity or hits[e].doc_id in ev.vectored:
            c = similarity.get(e, sims[-1])
            median = statistics.median(ranking._others(sims[:ranking.FUSE_DEPTH], c))
            yield q["runs"][e], [covered.get(hits[e].doc_id, 0.0), c, c - median, unknown, sims[0], *more]


def fit(questions: Sequence[dict[str, Any]], l2: float = 0.01, steps: int = 3000) -> tuple[list[float], float]:
    """Logistic regression by gradient descent on standardised measures, the two classes weighed
    equally; weights returned in raw units."""
    import numpy as np

    rows = [(x, 0) if q["kind"] == "none" else (x, 1) for q in questions for run, x in q["measures"]
            if q["kind"] == "none" or (is_all(q) and run in q["answers"])]
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


@contextmanager
def model(weights: Sequence[float], bias: float, answer_weight: float) -> Iterator[None]:
    """ranking's constants set to a model for the block: the first five weights are ranking.py's; any
    further ones weigh the extra measures (`q["extras"]`), added to each item's logit in `served`."""
    global extra_weights
    saved = {n: getattr(ranking, n) for n in (*WEIGHTS, "RELEVANCE_BIAS", "ANSWER_WEIGHT")}
    for n, v in zip(WEIGHTS, weights[:len(WEIGHTS)], strict=True):
        setattr(ranking, n, v)
    ranking.RELEVANCE_BIAS, ranking.ANSWER_WEIGHT = bias, answer_weight
    extra_weights = list(weights[len(WEIGHTS):])
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(ranking, n, v)
        extra_weights = []


#: The extra measures' weights of the model in force (`model`).
extra_weights: list[float] = []


def served(q: dict[str, Any], floor: float, tail: float | None = None) -> list[str]:
    """`answer` under the model in force, its extra measures' terms added to every item's logit."""
    lift = sum(w * v for w, v in zip(extra_weights, q.get("extras", ()), strict=True)) if extra_weights else 0.0
    if not lift:
        return answer(q, floor, tail=tail)
    item_logit = ranking.item_logit
    ranking.item_logit = lambda *a: item_logit(*a) + lift  # type: ignore[assignment]
    try:
        return answer(q, floor, tail=tail)
    finally:
        ranking.item_logit = item_logit


def fold(q: dict[str, Any]) -> int:
    return hashlib.sha256(q["query"].encode()).digest()[0] % FOLDS


def prepare(questions: list[dict[str, Any]], extras: Sequence[str]) -> None:
    """Each question's items' measures (with the `extras`) and its extra measures' values."""
    for q in questions:
        q["measures"] = list(measures(q, extras))
        q["extras"] = [EXTRAS[name](q) for name in extras]


logit: Callable[[float], float] = lambda p: math.log(p / (1 - p))  # noqa: E731


def sweep(questions: list[dict[str, Any]], extras: Sequence[str] = ()) -> None:
    """The refit model at each floor and answer weight, in-sample and cross-validated by folds. The
    floor is reported as the shift to RELEVANCE_BIAS that puts it at RELEVANCE_FLOOR."""
    prepare(questions, extras)
    weights, bias = fit(questions)
    print("fitted:", ", ".join(f"{m} {w:.2f}" for m, w in zip([*MEASURES, *extras], weights, strict=True)),
          f"bias {bias:.2f}")
    folds = [fit([q for q in questions if fold(q) != k]) for k in range(FOLDS)]
    floor = ranking.RELEVANCE_FLOOR
    for answer_weight in (0.0, 0.5, 0.85, 1.0):
        for at in (0.4, 0.45, 0.5, 0.55, 0.56, 0.57, 0.58, 0.6):
            shift = logit(floor) - logit(at)  # the model's floor `at` moved to RELEVANCE_FLOOR
            with model(weights, bias + shift, answer_weight):
                mrr, nothing = figures(questions, floor)
            cv_mrr: list[float] = []
            cv_nothing: dict[str, list[float]] = {}
            for k in range(FOLDS):
                with model(folds[k][0], folds[k][1] + shift, answer_weight):
                    for q in questions:
                        if fold(q) != k:
                            continue
                        items = served(q, floor)
                        if q["kind"] == "none":
                            cv_nothing.setdefault(q["set"], []).append(0.0 if items else 1.0)
                        elif is_all(q):
                            cv_mrr.append(rr(q, items))
            print(f"answer weight {answer_weight:.2f}, floor {at:.2f} (bias {bias + shift:.2f}): {line(mrr, nothing)}"
                  f" | by folds: {line(statistics.mean(cv_mrr), {k: statistics.mean(v) for k, v in cv_nothing.items()})}")


def by_set(questions: list[dict[str, Any]], extras: Sequence[str] = (), tails: Sequence[float] = ()) -> None:
    """Leave one no-answer set out: each set is judged by the model fitted on the other three and on the
    answerable questions of three of len(NO_ANSWER) folds, whose fourth it judges too; swept over the
    model's floor at the shipped answer weight. A writer's questions are judged by a model that has read
    none of them: the check a blind set makes, which five folds over every set (`--fit`) do not. With
    `tails`, then at the model floor BY_SET_GATE each tail floor of a two-level floor (`answer`)."""
    prepare(questions, extras)
    parts = len(NO_ANSWER)
    part = {id(q): hashlib.sha256(q["query"].encode()).digest()[1] % parts for q in questions}
    judged = [[q for q in questions if (q.get("set") == name if q["kind"] == "none" else part[id(q)] == k)]
              for k, name in enumerate(NO_ANSWER)]
    models = [fit([q for q in questions if (q.get("set") != name if q["kind"] == "none" else part[id(q)] != k)])
              for k, name in enumerate(NO_ANSWER)]
    floor = ranking.RELEVANCE_FLOOR

    def judge(at: float, tail: float | None = None) -> str:
        shift = logit(floor) - logit(at)
        mrr: list[float] = []
        nothing: dict[str, list[float]] = {}
        for (weights, bias), group in zip(models, judged, strict=True):
            with model(weights, bias + shift, ranking.ANSWER_WEIGHT):
                for q in group:
                    items = served(q, floor, tail)
                    if q["kind"] == "none":
                        nothing.setdefault(q["set"], []).append(0.0 if items else 1.0)
                    elif is_all(q):
                        mrr.append(rr(q, items))
        return line(statistics.mean(mrr), {k: statistics.mean(v) for k, v in nothing.items()})

    print(f"left one no-answer set out (extras: {', '.join(extras) or 'none'}), answer weight {ranking.ANSWER_WEIGHT}:")
    for at in (0.35, 0.4, 0.42, 0.44, 0.46, 0.48, 0.5, 0.52, 0.55, 0.6):
        print(f"floor {at:.2f}: {judge(at)}")
    for tail in tails:  # on the served scale: the gate is `floor`, the model's BY_SET_GATE moved there
        print(f"floor {BY_SET_GATE:.2f}, tail {tail:.2f} (served scale, gate {floor}): {judge(BY_SET_GATE, tail)}")


#: The model floor `by_set` sweeps the tail floors at (its floor nearest the shipped no-answer shares).
BY_SET_GATE = 0.48


def two_level(questions: list[dict[str, Any]], tails: Sequence[float]) -> None:
    """The shipped model with a two-level floor: an answer is served only when one of its items scores
    RELEVANCE_FLOOR (the gate, as shipped), then every item scoring at least the tail. Per tail: the
    all-questions MRR, the blind answerable sets' MRR, items served per answerable question and the
    share of each no-answer set answered with nothing. Then where the floor's MRR goes: to answerable
    questions the gate answers with nothing, or to items dropped below a stronger one."""
    gate = ranking.RELEVANCE_FLOOR
    blind = [s for s in ("heldout2", "heldout3") if any(q.get("set") == s for q in questions)]

    def mean_rr(select: Callable[[dict[str, Any]], bool], gate: float, tail: float | None) -> float:
        return statistics.mean(rr(q, answer(q, gate, tail=tail)) for q in questions if select(q))

    print(f"two-level floor, gate {gate} (shipped model): tail | all MRR | " + " | ".join(f"{s} MRR" for s in blind)
          + " | items per answerable | nothing per no-answer set")
    for tail in (None, *tails):
        items = statistics.mean(len(answer(q, gate, tail=tail)) for q in questions if is_all(q))
        nothing: dict[str, list[float]] = {}
        for q in questions:
            if q["kind"] == "none":
                nothing.setdefault(q["set"], []).append(0.0 if answer(q, gate, tail=tail) else 1.0)
        print(f"{'none' if tail is None else f'{tail:.2f}'} | {mean_rr(is_all, gate, tail):.3f} | "
              + " | ".join(f"{mean_rr(lambda q, s=s: q.get('set') == s, gate, tail):.3f}" for s in blind)
              + f" | {items:.2f} | " + ", ".join(f"{k} {statistics.mean(v):.0%}" for k, v in sorted(nothing.items())))
    for name, select in [("all", is_all), *((s, lambda q, s=s: q.get("set") == s) for s in blind)]:
        group = [q for q in questions if select(q)]
        free = [rr(q, answer(q, 0.0)) for q in group]
        shut = [not answer(q, gate, tail=0.0) for q in group]
        by_gate = sum(f for f, s in zip(free, shut, strict=True) if s) / len(group)
        by_items = statistics.mean(free) - mean_rr(select, gate, None) - by_gate
        print(f"{name}: no floor MRR {statistics.mean(free):.3f}; the gate answers {sum(shut)} of {len(group)} with"
              f" nothing ({sum(f > 0 for f, s in zip(free, shut, strict=True) if s)} with the answer in the no-floor"
              f" top {LIMIT}): MRR lost to the gate {by_gate:.3f}, to items dropped below a stronger one {by_items:.3f}")


def filling(questions: list[dict[str, Any]], shares: Sequence[float]) -> None:
    """Per question set, MRR as if only the newest share of each scope had its vector, against BM25."""
    sets = sorted({(q["kind"], q.get("set", "first")) for q in questions if q["kind"] != "none"})

    def per_set(newest: float) -> dict[tuple[str, str], float]:
        return {s: statistics.mean(rr(q, answer(q, ranking.RELEVANCE_FLOOR, newest)) for q in questions
                                   if (q["kind"], q.get("set", "first")) == s) for s in sets}

    bm25 = per_set(0.0)
    print("MRR per question set, as if only the newest share of each repository had its vector"
          " (< below BM25 alone):")
    print(f"{'set':24} {'BM25':>7}" + "".join(f" {share:>7}" for share in shares))
    got = {share: per_set(share) for share in shares}
    for s in sets:
        print(f"{s[0] + ' ' + s[1]:24} {bm25[s]:>7.3f}"
              + "".join(f" {got[share][s]:>6.3f}{'<' if got[share][s] < bm25[s] - 1e-9 else ' '}" for share in shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", required=True, type=Path, help="a `recall_quality.py --keep` state directory")
    parser.add_argument("--fit", action="store_true", help="refit the model and sweep the floor")
    parser.add_argument("--newest", default="", help="comma-separated shares of each scope with a vector")
    parser.add_argument("--by-set", action="store_true",
                        help="every no-answer set in, each judged by the model fitted on the others")
    parser.add_argument("--tail", default="",
                        help="comma-separated tail floors of a two-level floor (the gate: the shipped floor)")
    parser.add_argument("--extra", default="", help=f"comma-separated extra measures: {', '.join(EXTRAS)}")
    args = parser.parse_args()
    shares = [float(s) for s in args.newest.split(",") if s]
    extras = [e for e in args.extra.split(",") if e]
    tails = [float(t) for t in args.tail.split(",") if t]
    if unknown := set(extras) - set(EXTRAS):
        parser.error(f"--extra: no measure named {', '.join(sorted(unknown))} (known: {', '.join(EXTRAS)})")
    # --tail judges the shipped model, which read no blind set: every set in, the blind ones in their own rows
    left_out = () if tails else UNREAD if args.by_set else LEFT_OUT
    questions = trio.run(lambda: collect(args.state, bool(shares), left_out, "residual" in extras))
    print(f"machine: {machine()}; {sum(is_all(q) for q in questions)} answerable, "
          f"{sum(q['kind'] == 'none' for q in questions)} no-answer questions")
    print(f"no floor: {line(*figures(questions, 0.0))}")
    print(f"shipped model, floor {ranking.RELEVANCE_FLOOR}: {line(*figures(questions, ranking.RELEVANCE_FLOOR))}")
    if shares:
        filling(questions, shares)
    if args.fit:
        sweep(questions, extras)
    if tails:
        two_level(questions, tails)
    if args.by_set:
        by_set([q for q in questions if q.get("set") not in UNREAD], extras, tails)


if __name__ == "__main__":
    main()
